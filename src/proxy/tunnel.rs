//! CONNECT tunnels: a TCP connection to an allowed port (directly, or
//! through a parent proxy's own CONNECT when a rule names a parent group),
//! then bytes copied both ways until both sides have closed, or neither has
//! sent anything for `proxy.tunnel_idle_timeout`, or one side has accepted
//! nothing for that long.

use super::Shared;
use super::reply::error_page;
use crate::http1::{ClientStream, Exchange, Outcome, Tally, read_at_most, write_all};
use crate::proxy::admission::Permit;
use crate::upstream::ConnectErrorKind;
use bytes::BytesMut;
use http::StatusCode;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// This process's CONNECT tunnels (shown by `stats::TunnelInfo`).
pub struct Counters {
    /// Tunnels established (the client told so).
    pub established: AtomicU64,
    /// Tunnels open now.
    pub open: AtomicU64,
    /// Bytes relayed from clients, counted as they are relayed.
    pub bytes_up: AtomicU64,
    /// Bytes relayed to clients, likewise.
    pub bytes_down: AtomicU64,
}

static COUNTERS: Counters = Counters {
    established: AtomicU64::new(0),
    open: AtomicU64::new(0),
    bytes_up: AtomicU64::new(0),
    bytes_down: AtomicU64::new(0),
};

/// This process's tunnel counters.
pub fn counters() -> &'static Counters {
    &COUNTERS
}

/// A tunnel established, counted open while it lives.
struct Counted;

impl Counted {
    fn new() -> Counted {
        COUNTERS.established.fetch_add(1, Ordering::Relaxed);
        COUNTERS.open.fetch_add(1, Ordering::Relaxed);
        Counted
    }

    /// Where its bytes are added as they are relayed.
    fn tally(&self) -> Tally<'static> {
        Tally {
            up: &COUNTERS.bytes_up,
            down: &COUNTERS.bytes_down,
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        COUNTERS.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a CONNECT goes, as the ACL and the routing rules decided.
pub struct To<'a> {
    /// The target host, as the request named it.
    pub host: &'a str,
    /// The target port.
    pub port: u16,
    /// The parent group (index) to tunnel through, if a rule chose one.
    pub parent: Option<usize>,
    /// The `Proxy-Authorization` the parent's CONNECT carries.
    pub parent_auth: Option<http::HeaderValue>,
    /// The destination exception the `[[acl]]` entry grants (`Acl::reach`).
    pub reach: usize,
}

/// Serves a CONNECT request. Its admission `permit` is given back once the
/// tunnel is established: a tunnel is a byte pump that may last hours, and
/// must not hold a place among the requests in service.
pub async fn run(ex: &mut Exchange<'_>, sh: &Shared, to: To<'_>, permit: &mut Option<Permit<'_>>) -> Outcome {
    let To {
        host,
        port,
        parent,
        parent_auth,
        reach,
    } = to;
    if !sh.config.proxy.connect_ports.contains(&port) {
        tracing::warn!(client = %ex.peer.ip(), "CONNECT to {host}:{port} refused: port not in proxy.connect_ports");
        ex.cache_result = Some(super::ACCESS_DENIED);
        ex.out.close_after();
        let _ = error_page(
            &mut ex.out,
            &sh.error_pages,
            StatusCode::FORBIDDEN,
            "CONNECT to this port is not allowed",
        )
        .await;
        return Outcome::Close;
    }
    let opened = match parent {
        None => {
            ex.hierarchy = Some(format!("HIER_DIRECT/{host}"));
            sh.direct_for(reach)
                .connector()
                .tcp(host, port)
                .await
                .map(|s| (crate::upstream::Wire::Tcp(s), bytes::Bytes::new()))
        }
        Some(g) => through_parent(&mut ex.hierarchy, sh, g, host, port, parent_auth.as_ref()).await,
    };
    let (upstream, parent_early) = match opened {
        Ok(s) => s,
        Err(e) => {
            let status = match e.kind {
                ConnectErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
                ConnectErrorKind::Loop => StatusCode::LOOP_DETECTED,
                ConnectErrorKind::Denied => StatusCode::FORBIDDEN,
                _ => StatusCode::BAD_GATEWAY,
            };
            tracing::warn!(client = %ex.peer.ip(), "CONNECT {host}:{port}: {e}");
            ex.out.close_after();
            let _ = error_page(&mut ex.out, &sh.error_pages, status, &e.to_string()).await;
            return Outcome::Close;
        }
    };
    let idle = sh.config.proxy.tunnel_idle_timeout.get();
    let Some(client) = ex.stream else {
        // CONNECT over HTTP/2 (RFC 9113 8.5): the tunnel is the stream,
        // its DATA frames the bytes each way.
        let Some(recv) = ex.body.take_h2() else {
            return Outcome::Close;
        };
        let Ok(send) = ex.out.open_h2_tunnel() else {
            return Outcome::Close;
        };
        let _pump = permit.take().map(Permit::into_pump);
        let counted = Counted::new();
        let upstream = upstream.into_relay();
        let meter = ex.out.bandwidth();
        let (up, down) =
            crate::http1::h2::tunnel(recv, send, parent_early, &upstream, idle, meter, counted.tally()).await;
        drop(counted);
        ex.out.add_body_bytes(down);
        tracing::debug!("tunnel {host}:{port} (HTTP/2) closed: {up} bytes up, {down} bytes down");
        return Outcome::Close;
    };
    if ex
        .out
        .send_raw_head(StatusCode::OK, b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return Outcome::Close;
    }
    let _pump = permit.take().map(Permit::into_pump);
    let counted = Counted::new();
    // Bytes the far end sent right after the parent's answer (a protocol
    // where the server speaks first) were read with that answer.
    if !parent_early.is_empty() && write_all(client, &parent_early, ex.out.send_timeout()).await.is_err() {
        return Outcome::Close;
    }
    ex.out.add_body_bytes(parent_early.len() as u64);
    counted.tally().add_down(parent_early.len() as u64);
    // Bytes the client sent right after the CONNECT head (e.g. a TLS
    // ClientHello) are already in our buffer.
    let early = ex.body.take_buffered();
    let upstream = upstream.into_relay();
    if !early.is_empty() && write_all(&upstream, &early, idle).await.is_err() {
        return Outcome::Close;
    }
    counted.tally().add_up(early.len() as u64);
    let (up, down) = relay(client, &upstream, idle, ex.out.bandwidth(), counted.tally()).await;
    drop(counted);
    ex.out.add_body_bytes(down);
    tracing::debug!(
        "tunnel {host}:{port} closed: {} bytes up, {down} bytes down",
        up + early.len() as u64
    );
    Outcome::Close
}

/// Copies bytes both ways between the client and the upstream connection
/// until both directions have ended, or neither has carried a byte for
/// `idle`; returns the bytes copied (client to upstream, upstream to
/// client), added to `tally` as they are copied. CONNECT tunnels and SOCKS
/// sessions (`proxy/socks.rs`) share it.
/// What goes to the client waits for its share of `limits.client_bandwidth`
/// and `limits.total_bandwidth`, and for the route's `bandwidth` (`meter`,
/// when a limit is set).
pub(super) async fn relay(
    client: &ClientStream,
    upstream: &ClientStream,
    idle: Duration,
    meter: crate::client_bandwidth::Pacer,
    tally: Tally<'_>,
) -> (u64, u64) {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    tokio::join!(
        pipe(
            client,
            upstream,
            &last,
            start,
            idle,
            crate::client_bandwidth::Pacer::unpaced(),
            tally.up
        ),
        pipe(upstream, client, &last, start, idle, meter, tally.down)
    )
}

/// Opens the tunnel through a parent of group `g`, with the group's passive
/// health check and one retry on another parent when a connect fails;
/// `hierarchy` is set to the parent tried (the access log's hierarchy field).
pub(super) async fn through_parent(
    hierarchy: &mut Option<String>,
    sh: &Shared,
    g: usize,
    host: &str,
    port: u16,
    auth: Option<&http::HeaderValue>,
) -> Result<(crate::upstream::Wire, bytes::Bytes), crate::upstream::ConnectError> {
    let group = &sh.groups[g];
    let mut failed = None;
    loop {
        let idx = group.pick(failed);
        *hierarchy = Some(super::forward::parent_hierarchy(sh, g, idx));
        match sh
            .upstream
            .connector()
            .tunnel_via(group.server(idx), host, port, auth)
            .await
        {
            Ok(t) => return Ok(t),
            // The parent answered (with an error): it is up.
            Err(e) if e.kind == ConnectErrorKind::Parent => return Err(e),
            Err(e) => {
                tracing::warn!(upstream = %group.name, server = %group.server(idx).authority, "marking server down: {e}");
                group.mark_down(idx);
                if failed.is_some() || !group.retry || group.len() < 2 {
                    return Err(e);
                }
                failed = Some(idx);
            }
        }
    }
}

/// Copies `from` to `to` until end of stream (then half-closes `to`), an
/// error, or an idle period on both directions; returns the bytes copied,
/// added to `count` as each write is done. Each write waits for `meter`
/// first (not at all when unpaced).
async fn pipe(
    from: &ClientStream,
    to: &ClientStream,
    last: &AtomicU64,
    start: Instant,
    idle: Duration,
    mut meter: crate::client_bandwidth::Pacer,
    count: &AtomicU64,
) -> u64 {
    let mut buf = BytesMut::with_capacity(16 << 10);
    let mut total = 0u64;
    loop {
        let most = meter.read_size(16 << 10);
        let read = tokio::time::timeout(idle, read_at_most(from, &mut buf, most)).await;
        let n = match read {
            Err(_) => {
                // Quiet this way; is the other way active?
                let since = start.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                if since < idle.as_millis() as u64 {
                    continue;
                }
                let _ = socket2::SockRef::from(to.tcp()).shutdown(Shutdown::Both);
                let _ = socket2::SockRef::from(from.tcp()).shutdown(Shutdown::Both);
                return total;
            }
            Ok(Ok(0)) => {
                // A TLS client is told the end first, as a TLS server would.
                if let ClientStream::Tls(t) = to {
                    t.send_close_notify();
                }
                let _ = socket2::SockRef::from(to.tcp()).shutdown(Shutdown::Write);
                return total;
            }
            Ok(Err(_)) => {
                let _ = socket2::SockRef::from(to.tcp()).shutdown(Shutdown::Both);
                return total;
            }
            Ok(Ok(n)) => n,
        };
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        if meter.pace(n).await {
            // The wait is not silence: the other way's idle check must
            // not close a tunnel whose bytes are waiting their turn.
            last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
        // A side that takes no bytes for the idle time is as dead as a
        // silent one: without this bound a client that sends but never
        // reads would hold the tunnel (and two descriptors) for ever.
        if write_all(to, &buf[..n], idle).await.is_err() {
            let _ = socket2::SockRef::from(from.tcp()).shutdown(Shutdown::Read);
            return total;
        }
        total += n as u64;
        count.fetch_add(n as u64, Ordering::Relaxed);
        buf.clear();
    }
}
