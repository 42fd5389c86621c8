//! Protocol upgrades (RFC 9110 7.8), WebSocket first of all: a request
//! offering, in its `Upgrade` field, a protocol `proxy.upgrade_protocols`
//! allows goes to the origin with that offer (the allowed protocols only)
//! and `Connection: upgrade`, past the cache; a `101 Switching Protocols`
//! answer naming an offered protocol is relayed with its fields, then the
//! connection is a byte pump both ways, like a CONNECT tunnel
//! (`tunnel.rs`), closed after `proxy.tunnel_idle_timeout` without a byte.
//! Like Squid's `http_upgrade_request_protocols`: an offer of a protocol
//! not allowed is removed (the `Upgrade` field is hop-by-hop), and the
//! origin answers the plain request.

use super::Shared;
use super::forward::{Dest, Failure, response_headers};
use crate::http1::head::list_tokens;
use crate::http1::{ClientStream, Exchange, RequestHead, read_buf, write_all};
use crate::proxy::admission::Permit;
use bytes::BytesMut;
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, StatusCode, Version};
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The `Upgrade` field to send to the origin for `head`: the protocols it
/// offers that `allowed` names, in the client's order. None when the
/// request is no upgrade request (RFC 9110 7.8: the field counts only in
/// HTTP/1.1, "A server MUST ignore an Upgrade header field that is
/// received in an HTTP/1.0 request", and with the `upgrade` connection
/// option its sender must send) or offers nothing allowed.
pub fn offered(head: &RequestHead, allowed: &[String]) -> Option<HeaderValue> {
    if head.version != Version::HTTP_11 || allowed.is_empty() {
        return None;
    }
    if !list_tokens(&head.headers, &CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    let kept: Vec<&str> = list_tokens(&head.headers, &UPGRADE)
        .filter(|p| allowed.iter().any(|a| allows(a, p)))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(", ")).ok()
}

/// Whether the allowed entry `allowed` (`websocket`, or a name with a
/// version, `h2c/1`) admits the protocol `protocol` (`name[/version]`):
/// names compare without regard to case (RFC 9110 7.8: "Protocol names
/// are case-insensitive"); an entry without a version admits every
/// version of its protocol.
fn allows(allowed: &str, protocol: &str) -> bool {
    if allowed.contains('/') {
        return allowed.eq_ignore_ascii_case(protocol);
    }
    let name = protocol.split_once('/').map_or(protocol, |(n, _)| n);
    allowed.eq_ignore_ascii_case(name)
}

/// Whether `protocol` (one the origin switched to) is one of `offer`'s.
fn was_offered(offer: &HeaderValue, protocol: &str) -> bool {
    offer
        .to_str()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .any(|o| o.eq_ignore_ascii_case(protocol) || allows(o, protocol))
}

/// Serves an upgrade request offering `offer` (see [`offered`]): the
/// request goes upstream; a 101 is relayed and the connection becomes a
/// byte pump, any other answer is streamed back as usual. The admission
/// `permit` is given back once the protocols have switched: the pump may
/// last hours and must not hold a place among the requests in service.
pub async fn serve(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    dest: &Dest,
    offer: HeaderValue,
    permit: &mut Option<Permit<'_>>,
) -> Result<(), Failure> {
    let Some(response) = super::forward::send_upstream(ex, sh, dest, Some(&offer)).await? else {
        return Ok(());
    };
    // RFC 9110 15.2.2: the server switches to a protocol the client
    // offered, and names it; any other 101 cannot be relayed.
    let switched_to: Vec<String> = list_tokens(response.headers(), &UPGRADE).map(str::to_string).collect();
    if switched_to.is_empty() || !switched_to.iter().all(|p| was_offered(&offer, p)) {
        return Err((
            StatusCode::BAD_GATEWAY,
            format!(
                "the origin switched to a protocol the client did not offer (Upgrade: {:?}, offered {:?})",
                switched_to.join(", "),
                offer
            ),
        ));
    }
    let (parts, body) = response.into_parts();
    let Some(mut origin) = body.upgrade() else {
        return Err((
            StatusCode::BAD_GATEWAY,
            "the origin connection could not be taken over after its 101".into(),
        ));
    };
    let upgrade_field = parts.headers.get_all(UPGRADE).iter().cloned().collect::<Vec<_>>();
    let mut headers = response_headers(parts.headers, parts.version, sh, None);
    for v in upgrade_field {
        headers.append(UPGRADE, v);
    }
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\n");
    for (name, value) in &headers {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    if ex
        .out
        .send_raw_head(StatusCode::SWITCHING_PROTOCOLS, &head)
        .await
        .is_err()
    {
        return Ok(());
    }
    sh.upstream.stats().0.upgrades.fetch_add(1, Ordering::Relaxed);
    let _pump = permit.take().map(Permit::into_pump);
    let idle = sh.config.proxy.tunnel_idle_timeout.get();
    // Bytes the client sent right after its request head (a first
    // WebSocket frame) are already in our buffer.
    let early = ex.body.take_buffered();
    if !early.is_empty() {
        match tokio::time::timeout(idle, origin.write_all(&early)).await {
            Ok(Ok(())) => {}
            _ => return Ok(()),
        }
    }
    // Never None: an upgrade is HTTP/1.1 only (checked in `wanted`).
    let Some(client) = ex.stream else {
        return Ok(());
    };
    let (from_origin, to_origin) = tokio::io::split(origin);
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let meter = ex.out.bandwidth();
    let (up, down) = tokio::join!(
        client_to_origin(client, to_origin, &last, start, idle),
        origin_to_client(from_origin, client, &last, start, idle, meter)
    );
    ex.out.add_body_bytes(down);
    tracing::debug!(
        "upgraded connection closed: {} bytes up, {down} bytes down",
        up + early.len() as u64
    );
    Ok(())
}

/// True when no byte has moved either way for `idle` (the tunnel rule).
fn idle_both_ways(last: &AtomicU64, start: Instant, idle: Duration) -> bool {
    let since = (start.elapsed().as_millis() as u64).saturating_sub(last.load(Ordering::Relaxed));
    since >= idle.as_millis() as u64
}

/// Copies the client's bytes to the origin until the client's end of
/// stream (then ends the origin's write side), an error, or idleness both
/// ways; returns the bytes copied.
async fn client_to_origin<W: AsyncWrite + Unpin>(
    from: &ClientStream,
    mut to: W,
    last: &AtomicU64,
    start: Instant,
    idle: Duration,
) -> u64 {
    let mut buf = BytesMut::with_capacity(16 << 10);
    let mut total = 0u64;
    loop {
        let n = match tokio::time::timeout(idle, read_buf(from, &mut buf, 16 << 10)).await {
            Err(_) if !idle_both_ways(last, start, idle) => continue,
            Err(_) | Ok(Err(_)) => {
                // Wakes the other direction's write to the client, and
                // its read, on the client side at least.
                let _ = socket2::SockRef::from(from.tcp()).shutdown(Shutdown::Both);
                let _ = to.shutdown().await;
                return total;
            }
            Ok(Ok(0)) => {
                let _ = tokio::time::timeout(idle, to.shutdown()).await;
                return total;
            }
            Ok(Ok(n)) => n,
        };
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        // An origin that takes no bytes for the idle time is as dead as a
        // silent one.
        match tokio::time::timeout(idle, to.write_all(&buf[..n])).await {
            Ok(Ok(())) => {}
            _ => {
                let _ = socket2::SockRef::from(from.tcp()).shutdown(Shutdown::Both);
                return total;
            }
        }
        total += n as u64;
        buf.clear();
    }
}

/// Copies the origin's bytes to the client until the origin's end of
/// stream (then half-closes the client connection), an error, or idleness
/// both ways; returns the bytes copied. Each write waits for `meter`, the
/// client's share of `limits.client_bandwidth` and `total_bandwidth` and
/// the route's `bandwidth`, if a limit is set.
async fn origin_to_client<R: AsyncRead + Unpin>(
    mut from: R,
    to: &ClientStream,
    last: &AtomicU64,
    start: Instant,
    idle: Duration,
    mut meter: crate::client_bandwidth::Pacer,
) -> u64 {
    let mut buf = vec![0u8; 16 << 10];
    let mut total = 0u64;
    loop {
        let most = meter.read_size(buf.len());
        let n = match tokio::time::timeout(idle, from.read(&mut buf[..most])).await {
            Err(_) if !idle_both_ways(last, start, idle) => continue,
            Err(_) | Ok(Err(_)) => {
                let _ = socket2::SockRef::from(to.tcp()).shutdown(Shutdown::Both);
                return total;
            }
            Ok(Ok(0)) => {
                let _ = socket2::SockRef::from(to.tcp()).shutdown(Shutdown::Write);
                return total;
            }
            Ok(Ok(n)) => n,
        };
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        if meter.pace(n).await {
            // The wait is not silence (see `proxy/tunnel.rs`'s `pipe`).
            last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
        // A client that takes no bytes for the idle time does not hold the
        // connection for ever (`write_all`'s own timeout).
        if write_all(to, &buf[..n], idle).await.is_err() {
            let _ = socket2::SockRef::from(to.tcp()).shutdown(Shutdown::Both);
            return total;
        }
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(version: Version, fields: &[(&str, &str)]) -> RequestHead {
        let mut text = format!(
            "GET /chat {}\r\nHost: h\r\n",
            if version == Version::HTTP_10 {
                "HTTP/1.0"
            } else {
                "HTTP/1.1"
            }
        );
        for (n, v) in fields {
            text += &format!("{n}: {v}\r\n");
        }
        text += "\r\n";
        let limits = crate::http1::head::HeadLimits::default();
        match crate::http1::head::parse_request(text.as_bytes(), &limits) {
            Ok(Some((h, _))) => h,
            other => panic!("{text:?} did not parse: {other:?}"),
        }
    }

    fn allowed(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_upgrade_of_an_allowed_protocol_is_offered_to_the_origin() {
        let h = head(
            Version::HTTP_11,
            &[("Connection", "keep-alive, Upgrade"), ("Upgrade", "websocket")],
        );
        assert_eq!(offered(&h, &allowed(&["websocket"])).unwrap(), "websocket");
    }

    #[test]
    fn protocol_names_are_case_insensitive() {
        let h = head(Version::HTTP_11, &[("Connection", "upgrade"), ("Upgrade", "WebSocket")]);
        assert_eq!(offered(&h, &allowed(&["websocket"])).unwrap(), "WebSocket");
    }

    #[test]
    fn only_the_allowed_protocols_of_an_offer_are_passed_on() {
        let h = head(
            Version::HTTP_11,
            &[("Connection", "upgrade"), ("Upgrade", "h2c, websocket/13, IRC/6.9")],
        );
        assert_eq!(offered(&h, &allowed(&["websocket"])).unwrap(), "websocket/13");
        assert_eq!(
            offered(&h, &allowed(&["irc/6.9", "websocket"])).unwrap(),
            "websocket/13, IRC/6.9"
        );
        assert_eq!(offered(&h, &allowed(&["irc/7"])), None);
    }

    #[test]
    fn a_protocol_not_allowed_is_no_upgrade() {
        let h = head(Version::HTTP_11, &[("Connection", "upgrade"), ("Upgrade", "h2c")]);
        assert_eq!(offered(&h, &allowed(&["websocket"])), None);
        let ws = head(Version::HTTP_11, &[("Connection", "upgrade"), ("Upgrade", "websocket")]);
        assert_eq!(offered(&ws, &[]), None, "an empty list allows nothing");
    }

    #[test]
    fn a_server_must_ignore_an_upgrade_header_field_received_in_an_http10_request() {
        let h = head(Version::HTTP_10, &[("Connection", "upgrade"), ("Upgrade", "websocket")]);
        assert_eq!(offered(&h, &allowed(&["websocket"])), None);
    }

    #[test]
    fn an_upgrade_without_the_upgrade_connection_option_is_ignored() {
        let h = head(Version::HTTP_11, &[("Upgrade", "websocket")]);
        assert_eq!(offered(&h, &allowed(&["websocket"])), None);
    }

    #[test]
    fn the_origin_must_switch_to_a_protocol_the_client_offered() {
        let offer = HeaderValue::from_static("websocket/13, irc");
        assert!(was_offered(&offer, "websocket/13"));
        assert!(was_offered(&offer, "WebSocket/13"));
        assert!(was_offered(&offer, "irc/6.9"));
        assert!(!was_offered(&offer, "websocket/14"));
        assert!(!was_offered(&offer, "h2c"));
    }
}
