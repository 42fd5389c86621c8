//! Header rewriting between client and origin (RFC 9110 7.6): hop-by-hop
//! fields removed, `Via` added, `X-Forwarded-For`, `Max-Forwards`.

use crate::config::ForwardedFor;
use crate::http1::head::{HOP_BY_HOP, list_tokens};
use http::header::{CONNECTION, FORWARDED, HeaderName, MAX_FORWARDS, VIA};
use http::{HeaderMap, HeaderValue, Version};
use std::net::IpAddr;

/// Removes the hop-by-hop fields, including every field named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // `close` and `keep-alive`, the usual tokens, name no field to look up
    // beyond the fixed list (and parsing one allocates).
    let mut doomed: Vec<HeaderName> = list_tokens(headers, &CONNECTION)
        .filter(|t| !t.eq_ignore_ascii_case("close") && !HOP_BY_HOP.iter().any(|h| t.eq_ignore_ascii_case(h)))
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    // One pass over the names present (a handful, usually none of them
    // hop-by-hop) instead of parsing and looking up each of the eight names:
    // that was ~6,600 instructions of every proxied request.
    doomed.extend(headers.keys().filter(|k| HOP_BY_HOP.contains(&k.as_str())).cloned());
    for name in doomed {
        headers.remove(&name);
    }
}

/// Removes fields named like a framing field but with `_` (see
/// `head::framing_lookalike`): Portico frames the message by its own
/// fields, and a next hop that reads `Transfer_Encoding` as
/// `Transfer-Encoding` would frame it differently.
pub fn remove_framing_lookalikes(headers: &mut HeaderMap) {
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| crate::http1::head::framing_lookalike(k.as_str()))
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(&name);
    }
}

/// Appends our `Via` entry (`1.1 portico`, or `1.0 portico` for a message
/// received as HTTP/1.0).
pub fn add_via(headers: &mut HeaderMap, received: Version, pseudonym: &str) {
    // RFC 9110 7.6.3: the protocol version the message was received with.
    let proto = match received {
        Version::HTTP_10 => "1.0 ",
        Version::HTTP_2 => "2 ",
        _ => "1.1 ",
    };
    // Every earlier line is kept (RFC 9110 7.6.3: each recipient appends
    // its entry to the list), joined into one with ours at the end.
    let earlier = || {
        headers
            .get_all(VIA)
            .iter()
            .map(HeaderValue::as_bytes)
            .filter(|e| !e.is_empty())
    };
    if let Some(v) = joined(earlier, &[proto.as_bytes(), pseudonym.as_bytes()]) {
        headers.insert(VIA, v);
    }
}

/// One field value: the `earlier` list values, each followed by ", ", then
/// `ours` (its pieces concatenated). Built by appending (`format!` costs
/// several hundred instructions a call, and this runs for `Via` and
/// `X-Forwarded-For` on every proxied request) into one buffer of the exact
/// size, sized by a first pass over `earlier`: the buffer becomes the
/// value's own without a copy, since `Bytes` takes a `Vec` with spare
/// capacity only with a second allocation. None if the result is not a
/// valid field value (earlier values are, and so are our pieces).
fn joined<'a, I>(earlier: impl Fn() -> I, ours: &[&[u8]]) -> Option<HeaderValue>
where
    I: Iterator<Item = &'a [u8]>,
{
    let room = earlier().map(|e| e.len() + 2).sum::<usize>() + ours.iter().map(|o| o.len()).sum::<usize>();
    let mut value = Vec::with_capacity(room);
    for e in earlier() {
        value.extend_from_slice(e);
        value.extend_from_slice(b", ");
    }
    for o in ours {
        value.extend_from_slice(o);
    }
    HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).ok()
}

/// True if the request already passed through a proxy calling itself
/// `pseudonym` (a forwarding loop).
pub fn via_contains(headers: &HeaderMap, pseudonym: &str) -> bool {
    list_tokens(headers, &VIA).any(|entry| entry.split_whitespace().nth(1).is_some_and(|p| p == pseudonym))
}

/// How many `Via` entries name a proxy calling itself `pseudonym`.
pub fn via_count(headers: &HeaderMap, pseudonym: &str) -> usize {
    list_tokens(headers, &VIA)
        .filter(|entry| entry.split_whitespace().nth(1).is_some_and(|p| p == pseudonym))
        .count()
}

/// `X-Forwarded-For`, made once (at compile time).
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Applies the `X-Forwarded-For` policy for a request from `client`.
pub fn forwarded_for(headers: &mut HeaderMap, client: IpAddr, policy: ForwardedFor) {
    let ip = match client {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(client),
        v4 => v4,
    };
    let append = match policy {
        ForwardedFor::Pass => return,
        ForwardedFor::Remove => {
            headers.remove(&X_FORWARDED_FOR);
            return;
        }
        ForwardedFor::Replace => false,
        ForwardedFor::Append => true,
    };
    // An IPv4 address is written from its digits, with no `String` of its own.
    let mut digits = [0u8; 15];
    let v6_text;
    let ip: &[u8] = match ip {
        IpAddr::V4(v4) => {
            let len = crate::util::ipv4_digits(v4, &mut digits);
            &digits[..len]
        }
        IpAddr::V6(_) => {
            v6_text = ip.to_string();
            v6_text.as_bytes()
        }
    };
    let value = if append {
        joined(
            || headers.get_all(&X_FORWARDED_FOR).iter().map(HeaderValue::as_bytes),
            &[ip],
        )
    } else {
        joined(std::iter::empty, &[ip])
    };
    if let Some(v) = value {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

/// `Forwarded` (RFC 7239), when the client sent one, under the same
/// policy as `X-Forwarded-For`: `append` adds an element for `client`,
/// `replace` leaves that element alone, `remove` drops the field, `pass`
/// keeps it as sent. Origins that read `Forwarded` (Spring's and Quarkus'
/// forwarded-header support, for one) would otherwise take a client's
/// `for=` (or `host=`, `proto=`) for the proxy's word where the policy
/// says only the proxy's stands. A request without one gets none: nothing
/// the client claimed needs correcting, and every request would carry
/// a second field saying what `X-Forwarded-For` says.
pub fn forwarded(headers: &mut HeaderMap, client: IpAddr, policy: ForwardedFor) {
    if policy == ForwardedFor::Pass || !headers.contains_key(FORWARDED) {
        return;
    }
    if policy == ForwardedFor::Remove {
        headers.remove(FORWARDED);
        return;
    }
    // RFC 7239 6: an IPv6 address in brackets, quoted.
    let element = match client.to_canonical() {
        IpAddr::V4(v4) => format!("for={v4}"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
    };
    // Appended to only when every quoted string the client opened is
    // closed and no backslash leaves that to a parser's reading of
    // escapes: after `for=6.6.6.6;x="`, a lenient parser would read our
    // element as part of the client's, and its `for=` as the last hop's.
    let sent = || {
        headers
            .get_all(FORWARDED)
            .iter()
            .map(HeaderValue::as_bytes)
            .filter(|v| !v.iter().all(u8::is_ascii_whitespace))
    };
    let value = if policy == ForwardedFor::Append && sent().all(plainly_quoted) {
        joined(sent, &[element.as_bytes()])
    } else {
        joined(std::iter::empty, &[element.as_bytes()])
    };
    match value {
        Some(v) => {
            headers.insert(FORWARDED, v);
        }
        None => {
            headers.remove(FORWARDED);
        }
    }
}

/// Whether `value` reads the same to every parser of quoted strings: no
/// backslash (which RFC 9110 5.6.4 reads as an escape inside one, and
/// parsers differ on elsewhere) and every `"` it opens closed.
fn plainly_quoted(value: &[u8]) -> bool {
    !value.contains(&b'\\') && value.iter().filter(|&&b| b == b'"').count() % 2 == 0
}

/// The `Max-Forwards` value, if present and valid.
pub fn max_forwards(headers: &HeaderMap) -> Option<u64> {
    headers.get(MAX_FORWARDS)?.to_str().ok()?.trim().parse().ok()
}

/// Decrements `Max-Forwards` (the caller checked it is above zero).
pub fn decrement_max_forwards(headers: &mut HeaderMap) {
    if let Some(n) = max_forwards(headers) {
        headers.insert(MAX_FORWARDS, HeaderValue::from(n.saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn hop_by_hop_including_connection_named() {
        let mut h = map(&[
            ("connection", "x-secret, close"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("x-keep", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h.get("x-keep").unwrap(), "yes");
    }

    #[test]
    fn trailer_announcement_is_end_to_end() {
        let mut h = map(&[("transfer-encoding", "chunked"), ("trailer", "x-checksum")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h.get("trailer").unwrap(), "x-checksum");
    }

    #[test]
    fn via_is_appended() {
        let mut h = map(&[("via", "1.0 fred")]);
        add_via(&mut h, Version::HTTP_11, "portico");
        assert_eq!(h.get("via").unwrap(), "1.0 fred, 1.1 portico");
        assert!(via_contains(&h, "portico"));
        assert!(!via_contains(&h, "port"));
    }

    #[test]
    fn each_recipient_appends_its_via_entry_to_every_earlier_one() {
        // RFC 9110 7.6.3: two proxies before us sent a line each.
        let mut h = map(&[("via", "1.0 fred"), ("via", "1.1 wilma")]);
        add_via(&mut h, Version::HTTP_10, "portico");
        let lines: Vec<_> = h.get_all("via").iter().collect();
        assert_eq!(lines, ["1.0 fred, 1.1 wilma, 1.0 portico"]);
        assert_eq!(via_count(&h, "portico"), 1);
    }

    #[test]
    fn x_forwarded_for_policies() {
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let mut h = map(&[("x-forwarded-for", "10.0.0.1")]);
        forwarded_for(&mut h, ip, ForwardedFor::Append);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 127.0.0.2");
        forwarded_for(&mut h, ip, ForwardedFor::Replace);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "127.0.0.2");
        forwarded_for(&mut h, ip, ForwardedFor::Remove);
        assert!(h.get("x-forwarded-for").is_none());
        // No earlier value: the client alone; Pass leaves the fields be.
        forwarded_for(&mut h, ip, ForwardedFor::Append);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "127.0.0.2");
        forwarded_for(&mut h, "10.9.9.9".parse().unwrap(), ForwardedFor::Pass);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "127.0.0.2");
    }

    #[test]
    fn x_forwarded_for_joins_every_earlier_line_into_one() {
        let mut h = map(&[
            ("x-forwarded-for", "10.0.0.1, 10.0.0.2"),
            ("x-forwarded-for", "10.0.0.3"),
        ]);
        // An IPv4 client seen through an IPv6 socket is written as IPv4.
        forwarded_for(&mut h, "::ffff:192.0.2.7".parse().unwrap(), ForwardedFor::Append);
        let all: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(all, ["10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.7"]);
        forwarded_for(&mut h, "2001:db8::1".parse().unwrap(), ForwardedFor::Append);
        assert_eq!(
            h.get("x-forwarded-for").unwrap(),
            "10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.7, 2001:db8::1"
        );
    }

    #[test]
    fn a_forwarded_field_the_client_sent_follows_the_x_forwarded_for_policy() {
        let sent = [("forwarded", "for=10.1.1.1;proto=https"), ("forwarded", "for=10.1.1.2")];
        let seen = |policy, client: &str| {
            let mut h = map(&sent);
            forwarded(&mut h, client.parse().unwrap(), policy);
            h.get_all("forwarded")
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            seen(ForwardedFor::Append, "127.0.0.2"),
            ["for=10.1.1.1;proto=https, for=10.1.1.2, for=127.0.0.2"]
        );
        assert_eq!(seen(ForwardedFor::Replace, "127.0.0.2"), ["for=127.0.0.2"]);
        assert!(seen(ForwardedFor::Remove, "127.0.0.2").is_empty());
        assert_eq!(
            seen(ForwardedFor::Pass, "127.0.0.2"),
            ["for=10.1.1.1;proto=https", "for=10.1.1.2"]
        );
        // RFC 7239 6: IPv6 quoted, in brackets; an IPv4-mapped one as IPv4.
        assert_eq!(seen(ForwardedFor::Replace, "2001:db8::1"), ["for=\"[2001:db8::1]\""]);
        assert_eq!(seen(ForwardedFor::Replace, "::ffff:192.0.2.7"), ["for=192.0.2.7"]);
    }

    #[test]
    fn a_forwarded_field_left_in_a_quoted_string_is_not_appended_to() {
        // Open, or closed only for a parser that reads `\` as RFC 9110
        // does (one that ignores escapes, or honours them outside quoted
        // strings, reads these otherwise): dropped.
        for sent in [
            "for=6.6.6.6;x=\"",
            "for=6.6.6.6;x=\"a\\\"",
            "for=\"[2001:db8::1",
            "for=10.1.1.1;x=\"a\\\"b, c\"",
            "for=6.6.6.6;x=a\\",
            "for=6.6.6.6;x=a\\\"b\"",
        ] {
            let mut h = map(&[("forwarded", sent)]);
            forwarded(&mut h, "127.0.0.2".parse().unwrap(), ForwardedFor::Append);
            assert_eq!(h.get("forwarded").unwrap(), "for=127.0.0.2", "{sent}");
        }
        // Closed, no escapes: appended to; an empty field left out.
        let sent = "for=10.1.1.1;x=\"a, b\"";
        let mut h = map(&[("forwarded", sent), ("forwarded", "")]);
        forwarded(&mut h, "127.0.0.2".parse().unwrap(), ForwardedFor::Append);
        assert_eq!(h.get("forwarded").unwrap(), &format!("{sent}, for=127.0.0.2")[..]);
    }

    #[test]
    fn a_request_without_a_forwarded_field_gets_none() {
        for policy in [
            ForwardedFor::Append,
            ForwardedFor::Replace,
            ForwardedFor::Remove,
            ForwardedFor::Pass,
        ] {
            let mut h = map(&[("x-forwarded-for", "10.0.0.1")]);
            forwarded(&mut h, "127.0.0.2".parse().unwrap(), policy);
            assert!(h.get("forwarded").is_none(), "{policy:?}");
        }
    }

    #[test]
    fn max_forwards_decrements() {
        let mut h = map(&[("max-forwards", "3")]);
        decrement_max_forwards(&mut h);
        assert_eq!(max_forwards(&h), Some(2));
    }
}
