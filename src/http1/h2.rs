//! HTTP/2 client connections (RFC 9113) on the `h2` crate: ALPN `h2` on a
//! TLS listener, or cleartext by prior knowledge (`h2c = true`, the
//! connection preface `PRI * HTTP/2.0`). The crate does the framing, HPACK,
//! flow control and the protocol's own defences; this module turns each
//! stream into an [`Exchange`] (the request as a [`RequestHead`], its body
//! a [`BodyReader`], its response a [`ResponseWriter`]) and hands it to the
//! same [`Handler`] as an HTTP/1 request, so access control, rules, the
//! cache and forwarding (over HTTP/1.1) are one code path. It also keeps
//! what the crate leaves to its user: the idle and ping timeouts, draining,
//! and the counters.

use super::body::BodyReader;
use super::conn::{ConnSettings, Exchange, Handler, Outcome, RejectInfo};
use super::head::{BodyFraming, HeadError, RequestHead, framing_lookalike, valid_host};
use super::io::ClientStream;
use super::response::ResponseWriter;
use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use h2::server::SendResponse;
use h2::{Reason, SendStream};
use http::header::{CONNECTION, CONTENT_LENGTH, COOKIE, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The client connection preface (RFC 9113 3.4) that opens h2c by prior knowledge.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A listener's HTTP/2 settings (`[http2]`, the listener's `http2`/`h2c`).
#[derive(Debug, Clone)]
pub struct H2Settings {
    /// Cleartext HTTP/2 by prior knowledge on this (plain) listener.
    pub h2c: bool,
    /// `http` requests become absolute-form targets (`http://authority/path`),
    /// as an HTTP/1 client of a forward proxy sends them.
    pub absolute_targets: bool,
    /// Where a connection was redirected from is read (a transparent
    /// listener's: `conn::original_destination`).
    pub redirected: bool,
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE, also bounding CONTINUATION frames.
    pub max_header_list_size: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub initial_stream_window: u32,
    /// The connection's window.
    pub initial_connection_window: u32,
    /// GOAWAY after this long without an open stream.
    pub idle_timeout: Duration,
    /// A PING this often; zero = never.
    pub ping_interval: Duration,
    /// The PING's acknowledgement within this, or the connection is closed.
    pub ping_timeout: Duration,
    /// Streams reset by the client before being accepted, at once (rapid reset).
    pub max_pending_reset_streams: usize,
    /// Streams reset by Portico for the client's errors.
    pub max_error_resets: usize,
}

impl H2Settings {
    /// The settings of one listener; None when it speaks no HTTP/2.
    pub fn for_listener(c: &crate::config::Config, l: &crate::config::ListenerConfig) -> Option<H2Settings> {
        let h2c = l.h2c && l.certificate.is_empty();
        if !(h2c || l.offers_h2()) || l.mode == crate::config::Mode::Socks {
            return None;
        }
        let h = &c.http2;
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        Some(H2Settings {
            h2c,
            absolute_targets: l.mode == crate::config::Mode::Forward,
            redirected: l.mode == crate::config::Mode::Transparent,
            max_concurrent_streams: h.max_concurrent_streams,
            max_header_list_size: clamp(h.max_header_list_size.bytes()),
            // RFC 9113 6.9.2: at most 2^31-1.
            initial_stream_window: clamp(h.initial_stream_window.bytes()).min(i32::MAX as u32),
            initial_connection_window: clamp(h.initial_connection_window.bytes()).min(i32::MAX as u32),
            idle_timeout: h.idle_timeout.get(),
            ping_interval: h.ping_interval.get(),
            ping_timeout: h.ping_timeout.get(),
            max_pending_reset_streams: h.max_pending_reset_streams,
            max_error_resets: h.max_error_resets,
        })
    }
}

/// Whether a new plain connection opens with the HTTP/2 preface: waits
/// (peeking, nothing consumed) until the first bytes tell, at most
/// `timeout`. False for anything else, including a client that stays
/// silent or closes: the HTTP/1 path then deals with it as always.
pub async fn sniff_preface(stream: &ClientStream, timeout: Duration) -> bool {
    let ClientStream::Plain(tcp) = stream else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; PREFACE.len()];
    loop {
        if tokio::time::timeout_at(deadline, tcp.readable()).await.is_err() {
            return false;
        }
        let n = match tcp.peek(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        if buf[..n] != PREFACE[..n] {
            return false;
        }
        if n == PREFACE.len() {
            return true;
        }
        // A prefix of the preface: the rest is on its way. Peeking does
        // not consume, so readiness stays set: wait a little, not spin.
        if tokio::time::timeout_at(deadline, tokio::time::sleep(Duration::from_millis(5)))
            .await
            .is_err()
        {
            return false;
        }
    }
}

/// `AsyncRead`/`AsyncWrite` for the `h2` crate over a client connection,
/// plain or TLS (whose record layer is `http1::tls`). What a pass of the
/// connection writes is held (in [`PlainOut`], or encrypted in rustls's
/// buffer) and sent by [`serve`] once the pass is over (see `poll_flush`).
enum Io {
    Plain(tokio::net::tcp::OwnedReadHalf, Arc<PlainOut>),
    Tls(Arc<super::tls::TlsConn>),
}

/// A plain connection's writing side and the bytes of the pass under way.
struct PlainOut(std::sync::Mutex<(tokio::net::tcp::OwnedWriteHalf, BytesMut)>);

/// Bytes held for a pass before they are sent without waiting for its
/// end, as rustls's buffer limit does over TLS.
const PASS_LIMIT: usize = 64 << 10;

impl PlainOut {
    fn lock(&self) -> std::sync::MutexGuard<'_, (tokio::net::tcp::OwnedWriteHalf, BytesMut)> {
        // Nothing panics while holding it; if something did, the bytes
        // are still the connection's to send.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends everything held; Pending (with the task registered for the
    /// socket's room) while the socket takes no more.
    fn poll_send(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut guard = self.lock();
        let (tcp, out) = &mut *guard;
        send_held(tcp, out, cx)
    }
}

/// Writes `out` to `tcp` until it is empty (Ready) or the socket is full
/// (Pending, the task registered for its room).
fn send_held(
    tcp: &mut tokio::net::tcp::OwnedWriteHalf,
    out: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while !out.is_empty() {
        match Pin::new(&mut *tcp).poll_write(cx, out) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(n)) => bytes::Buf::advance(out, n),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
    }
    // All sent: an idle connection keeps no buffer (the next pass takes
    // one, `poll_write_vectored`).
    *out = BytesMut::new();
    Poll::Ready(Ok(()))
}

impl Io {
    fn new(stream: ClientStream) -> Io {
        match stream {
            ClientStream::Plain(tcp) => {
                let (read, write) = tcp.into_split();
                Io::Plain(
                    read,
                    Arc::new(PlainOut(std::sync::Mutex::new((write, BytesMut::new())))),
                )
            }
            ClientStream::Tls(t) => Io::Tls(Arc::from(t)),
        }
    }

    /// The sending side, for [`serve`] to send what each pass wrote.
    fn sender(&self) -> Sender {
        match self {
            Io::Plain(_, out) => Sender::Plain(out.clone()),
            Io::Tls(t) => Sender::Tls(t.clone()),
        }
    }
}

/// What [`send_pass`] sends from.
enum Sender {
    Plain(Arc<PlainOut>),
    Tls(Arc<super::tls::TlsConn>),
}

impl AsyncRead for Io {
    /// Into `buf`'s unfilled part as it is: the h2 crate's reader hands
    /// over uninitialised spare capacity (up to 8 KiB), which reading
    /// through a slice would zero at every read.
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(read, _) => Pin::new(read).poll_read(cx, buf),
            Io::Tls(t) => t.poll_read_buf(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(data)])
    }

    /// Vectored, so that the h2 crate hands a DATA frame's head and its
    /// payload (and whatever else its pass wrote) in one call. Nothing is
    /// sent here unless the pass has more than [`PASS_LIMIT`] in hand:
    /// plain bytes are copied to [`PlainOut`], TLS ones encrypted into
    /// rustls's buffer (`TlsConn::poll_write_vectored_deferred`).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &*self {
            Io::Plain(_, out) => {
                let mut guard = out.lock();
                let (tcp, held) = &mut *guard;
                if held.len() >= PASS_LIMIT && send_held(tcp, held, cx)?.is_pending() {
                    return Poll::Pending;
                }
                let total: usize = bufs.iter().map(|b| b.len()).sum();
                if held.is_empty() {
                    // One allocation for the pass: what it holds stays
                    // under PASS_LIMIT plus one write.
                    held.reserve(PASS_LIMIT + total);
                }
                for b in bufs {
                    held.extend_from_slice(b);
                }
                Poll::Ready(Ok(total))
            }
            Io::Tls(t) => t.poll_write_vectored_deferred(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Nothing is sent here: [`serve`] sends what the connection's pass
    /// wrote once the pass is over (`send_pass`). The h2 crate flushes
    /// after every DATA frame whose payload it did not copy (every body
    /// of 256 bytes or more), so sending here cost a system call per
    /// response, 1.34 per response in the `h2-hits` benchmark over TLS;
    /// sent after the pass, one carries every response the pass wrote.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &*self {
            Io::Plain(_, out) => {
                let mut guard = out.lock();
                let (tcp, held) = &mut *guard;
                std::task::ready!(send_held(tcp, held, cx))?;
                // As before the split: a peer already gone is no error here.
                let _ = Pin::new(tcp).poll_shutdown(cx);
                Poll::Ready(Ok(()))
            }
            Io::Tls(t) => {
                t.send_close_notify();
                let r = t.poll_flush_all(cx);
                if r.is_ready() {
                    let _ = socket2::SockRef::from(t.tcp()).shutdown(std::net::Shutdown::Write);
                }
                r
            }
        }
    }
}

/// Sends what the connection's pass left (held plain bytes, or rustls's
/// records). Pending only when the socket is full, with the task
/// registered to be woken when it has room: the bytes then go out at the
/// next pass's end, or here again.
fn send_pass(sender: &Sender, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    match sender {
        Sender::Plain(out) => out.poll_send(cx),
        Sender::Tls(t) => t.poll_flush_all(cx),
    }
}

/// The response side of one stream, behind a [`ResponseWriter`].
pub struct H2Out {
    respond: SendResponse<Bytes>,
    head: Option<http::Response<()>>,
    send: Option<SendStream<Bytes>>,
    /// The stream has been reset already (a send timeout sends CANCEL):
    /// `abort` neither resets nor counts it again.
    reset: bool,
    /// The last DATA frame carried END_STREAM (the body's announced
    /// length reached): `finish` has nothing left to send.
    ended: bool,
}

/// An `h2` error as an I/O error for the writer's callers; a reset by the
/// client is counted.
fn h2_io(e: h2::Error) -> io::Error {
    if e.is_reset() && e.is_remote() {
        counters().client_reset.fetch_add(1, Relaxed);
    }
    io::Error::new(io::ErrorKind::BrokenPipe, e)
}

impl H2Out {
    fn new(respond: SendResponse<Bytes>) -> Self {
        H2Out {
            respond,
            head: None,
            send: None,
            reset: false,
            ended: false,
        }
    }

    /// Keeps the response head until the first body bytes or the end, so
    /// a bodiless response is one HEADERS frame with END_STREAM.
    pub(super) fn queue_head(&mut self, status: StatusCode, headers: HeaderMap) {
        let mut r = http::Response::new(());
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        self.head = Some(r);
    }

    /// A 1xx response (RFC 9113 8.1: HEADERS before the final ones).
    pub(super) fn interim(&mut self, status: StatusCode, headers: &HeaderMap) -> io::Result<()> {
        let mut headers = headers.clone();
        strip_connection_fields(&mut headers);
        headers.remove(CONTENT_LENGTH);
        let mut r = http::Response::new(());
        *r.status_mut() = status;
        *r.headers_mut() = headers;
        self.respond.send_informational(r).map_err(h2_io)
    }

    fn start(&mut self, end: bool) -> io::Result<()> {
        if let Some(head) = self.head.take() {
            let send = self.respond.send_response(head, end).map_err(h2_io)?;
            self.send = Some(send);
        }
        Ok(())
    }

    /// Sends body bytes as DATA frames, within the client's flow-control
    /// windows: waits for window (at most `timeout`, as for an HTTP/1
    /// client that takes no bytes) rather than buffer past it. `last`:
    /// these bytes complete the body, and their last frame ends the stream
    /// (no empty DATA frame of its own at `finish`).
    pub(super) async fn send_data(&mut self, data: Bytes, last: bool, timeout: Duration) -> io::Result<()> {
        self.start(false)?;
        let Some(send) = self.send.as_mut() else {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "no response stream"));
        };
        let sent = send_all(send, data, last, timeout).await;
        if sent.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::TimedOut) {
            self.reset = true;
        }
        self.ended = last && sent.is_ok();
        sent
    }

    /// Ends the stream (with trailers when there are some).
    pub(super) fn finish(&mut self, trailers: Option<&HeaderMap>) -> io::Result<()> {
        if self.ended {
            // A body of announced length has no trailers from an HTTP/1
            // origin (only a chunked one carries them).
            return Ok(());
        }
        let trailers = trailers.filter(|t| !t.is_empty());
        if self.head.is_some() {
            self.start(trailers.is_none())?;
            if trailers.is_none() {
                return Ok(());
            }
        }
        let Some(send) = self.send.as_mut() else {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "no response stream"));
        };
        match trailers {
            Some(t) => {
                let mut t = t.clone();
                strip_connection_fields(&mut t);
                send.send_trailers(t).map_err(h2_io)
            }
            None => send.send_data(Bytes::new(), true).map_err(h2_io),
        }
    }

    /// CONNECT (RFC 9113 8.5): sends the `200` head with no END_STREAM and
    /// hands over the stream's sending half, whose DATA frames are then the
    /// tunnel's bytes to the client.
    pub(crate) fn open_tunnel(&mut self) -> io::Result<SendStream<Bytes>> {
        let mut r = http::Response::new(());
        *r.status_mut() = StatusCode::OK;
        r.headers_mut().insert(http::header::DATE, crate::util::http_date_now());
        self.head = None;
        self.respond.send_response(r, false).map_err(h2_io)
    }

    /// Completes when the client resets the stream (it has gone away).
    pub(crate) async fn reset(&mut self) {
        let _ = match self.send.as_mut() {
            Some(s) => std::future::poll_fn(|cx| s.poll_reset(cx)).await,
            None => std::future::poll_fn(|cx| self.respond.poll_reset(cx)).await,
        };
    }

    /// Resets the stream: the response could not be completed.
    fn abort(&mut self) {
        // A stream whose last DATA frame ended it is complete already.
        if self.ended || std::mem::replace(&mut self.reset, true) {
            return;
        }
        counters().resets_sent.fetch_add(1, Relaxed);
        match self.send.as_mut() {
            Some(s) => s.send_reset(Reason::INTERNAL_ERROR),
            None => self.respond.send_reset(Reason::INTERNAL_ERROR),
        }
    }
}

/// Sends `rest` as DATA frames within the client's flow-control windows:
/// waits for window (at most `timeout`, as for an HTTP/1 client that takes
/// no bytes) rather than buffer past it. `end`: the last frame ends the
/// stream.
pub(crate) async fn send_all(
    send: &mut SendStream<Bytes>,
    mut rest: Bytes,
    end: bool,
    timeout: Duration,
) -> io::Result<()> {
    while !rest.is_empty() {
        send.reserve_capacity(rest.len());
        let mut cap = send.capacity();
        if cap == 0 {
            let wait = std::future::poll_fn(|cx| send.poll_capacity(cx));
            let got = if timeout.is_zero() {
                Ok(wait.await)
            } else {
                tokio::time::timeout(timeout, wait).await
            };
            match got {
                Err(_) => {
                    send.send_reset(Reason::CANCEL);
                    counters().resets_sent.fetch_add(1, Relaxed);
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the client opened no flow-control window for {}",
                            humantime::format_duration(timeout)
                        ),
                    ));
                }
                Ok(None) => return Err(io::Error::new(io::ErrorKind::BrokenPipe, "stream closed")),
                Ok(Some(Err(e))) => return Err(h2_io(e)),
                Ok(Some(Ok(n))) => cap = n,
            }
        }
        if cap == 0 {
            continue;
        }
        let chunk = rest.split_to(cap.min(rest.len()));
        send.send_data(chunk, end && rest.is_empty()).map_err(h2_io)?;
    }
    Ok(())
}

/// CONNECT over HTTP/2: copies the stream's DATA frames to `upstream` and
/// `upstream`'s bytes back as DATA frames, until both ways have ended
/// (END_STREAM one way half-closes the other, as a FIN does in an HTTP/1
/// tunnel) or neither has carried a byte for `idle`. `early`: bytes the
/// far end already sent (read with a parent's answer). Returns the bytes
/// copied (client to upstream, upstream to client), added to `tally` as
/// they are copied.
pub(crate) async fn tunnel(
    mut recv: h2::RecvStream,
    mut send: SendStream<Bytes>,
    early: Bytes,
    upstream: &ClientStream,
    idle: Duration,
    mut meter: crate::client_bandwidth::Pacer,
    tally: super::Tally<'_>,
) -> (u64, u64) {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let seen = |last: &AtomicU64| {
        last.store(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX), Relaxed);
    };
    let quiet = |last: &AtomicU64| {
        let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(last.load(Relaxed)) >= u64::try_from(idle.as_millis()).unwrap_or(u64::MAX)
    };
    let up = async {
        let mut total = 0u64;
        loop {
            let next = match tokio::time::timeout(idle, recv.data()).await {
                Err(_) if !quiet(&last) => continue,
                Err(_) => None,
                Ok(n) => n,
            };
            match next {
                Some(Ok(data)) => {
                    let _ = recv.flow_control().release_capacity(data.len());
                    seen(&last);
                    if super::io::write_all(upstream, &data, idle).await.is_err() {
                        break;
                    }
                    total += data.len() as u64;
                    tally.add_up(data.len() as u64);
                }
                Some(Err(_)) => {
                    let _ = socket2::SockRef::from(upstream.tcp()).shutdown(std::net::Shutdown::Both);
                    return total;
                }
                None => break,
            }
        }
        if let ClientStream::Tls(t) = upstream {
            t.send_close_notify();
        }
        let _ = socket2::SockRef::from(upstream.tcp()).shutdown(std::net::Shutdown::Write);
        total
    };
    let down = async {
        let mut total = early.len() as u64;
        if !early.is_empty() && send_all(&mut send, early, false, idle).await.is_err() {
            return 0;
        }
        tally.add_down(total);
        let mut buf = BytesMut::with_capacity(16 << 10);
        loop {
            let most = meter.read_size(16 << 10);
            let read = tokio::time::timeout(idle, super::io::read_at_most(upstream, &mut buf, most)).await;
            match read {
                Err(_) if !quiet(&last) => continue,
                Err(_) => {
                    send.send_reset(Reason::CANCEL);
                    let _ = socket2::SockRef::from(upstream.tcp()).shutdown(std::net::Shutdown::Both);
                    return total;
                }
                Ok(Ok(0)) => {
                    let _ = send.send_data(Bytes::new(), true);
                    return total;
                }
                Ok(Err(_)) => {
                    send.send_reset(Reason::CONNECT_ERROR);
                    return total;
                }
                Ok(Ok(n)) => {
                    seen(&last);
                    if meter.pace(n).await {
                        // The wait is not silence (see `proxy/tunnel.rs`'s `pipe`).
                        seen(&last);
                    }
                    let data = buf.split_to(n).freeze();
                    if send_all(&mut send, data, false, idle).await.is_err() {
                        let _ = socket2::SockRef::from(upstream.tcp()).shutdown(std::net::Shutdown::Read);
                        return total;
                    }
                    total += n as u64;
                    tally.add_down(n as u64);
                }
            }
        }
    };
    tokio::join!(up, down)
}

/// Removes the fields HTTP/2 forbids (RFC 9113 8.2.2): `Connection` and
/// what it names, `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`,
/// `Upgrade`, and `TE` other than `trailers`.
pub fn strip_connection_fields(headers: &mut HeaderMap) {
    // Usually none is present (a proxied response lost its hop-by-hop
    // fields, a stored one never had them): one pass over the names there
    // are, as `proxy::headers::strip_hop_by_hop` does, rather than a lookup
    // for each forbidden name.
    let mut doomed: Vec<HeaderName> = super::head::list_tokens(headers, &CONNECTION)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    doomed.extend(
        headers
            .iter()
            .filter(|(name, value)| match name.as_str() {
                "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" => true,
                "te" => value.as_bytes() != b"trailers",
                _ => false,
            })
            .map(|(name, _)| name.clone()),
    );
    for name in doomed {
        headers.remove(&name);
    }
}

/// An HTTP/2 request as the head an HTTP/1 request would have had
/// (RFC 9113 8.3.1: `:authority` is the `Host`; cookies split over
/// several fields are joined again, 8.2.3). `end` says the stream
/// carries no body. A CONNECT's target is its authority; other requests
/// are origin-form with `Host`, or absolute-form for `http` on a forward listener.
/// The fields are taken from `parts`, not copied (its method and target
/// stay, for the log line of a request refused here).
pub fn request_head(parts: &mut http::request::Parts, end: bool, absolute: bool) -> Result<RequestHead, HeadError> {
    let bad = |reason| HeadError {
        status: StatusCode::BAD_REQUEST,
        reason,
    };
    let mut headers = std::mem::take(&mut parts.headers);
    let parts = &*parts;
    let authority = parts.uri.authority().map(|a| a.as_str());
    if headers.contains_key(CONNECTION) || headers.contains_key(TRANSFER_ENCODING) || headers.contains_key(UPGRADE) {
        return Err(bad("connection-specific field in an HTTP/2 request"));
    }
    // As over HTTP/1 (`head::framing_lookalike`): forwarded in an HTTP/1.1
    // request, `transfer_encoding: chunked` frames the body for an origin
    // that reads `_` as `-`, and what follows its last chunk becomes the
    // next request on the pooled connection: another client's.
    if headers.keys().any(|name| framing_lookalike(name.as_str())) {
        return Err(bad("header field name resembling Content-Length or Transfer-Encoding"));
    }
    if let Some(a) = &authority {
        // The `http` crate accepts `user@host` as an authority; an
        // HTTP/1 request with such a `Host` gets 400, and so does this.
        if !valid_host(a.as_bytes()) {
            return Err(bad("invalid :authority"));
        }
        let v = HeaderValue::from_str(a).map_err(|_| bad("invalid :authority"))?;
        headers.insert(HOST, v);
    } else {
        // Without `:authority` the client's own `Host` names the server
        // (RFC 9113 8.3.1): exactly one, checked as an HTTP/1 one is.
        let mut hosts = headers.get_all(HOST).iter();
        match (hosts.next(), hosts.next()) {
            (None, _) => return Err(bad("no :authority and no Host")),
            (Some(h), None) if valid_host(h.as_bytes()) => {}
            (Some(_), None) => return Err(bad("invalid Host header")),
            (Some(_), Some(_)) => return Err(bad("more than one Host header")),
        }
    }
    let cookies = headers.get_all(COOKIE);
    if cookies.iter().nth(1).is_some() {
        let joined = cookies
            .iter()
            .map(|v| v.as_bytes())
            .collect::<Vec<_>>()
            .join(&b"; "[..]);
        let v = HeaderValue::from_bytes(&joined).map_err(|_| bad("invalid cookie"))?;
        headers.insert(COOKIE, v);
    }
    let target = if parts.method == Method::CONNECT {
        authority.map(str::to_string).ok_or(bad("CONNECT without :authority"))?
    } else {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        // An `http` URL asked of a forward proxy is another server's; an
        // `https` one is the proxy's own (its monitoring pages over an
        // HTTPS proxy port), as `GET /x` is from an HTTP/1 client: a
        // client reaches https origins through CONNECT.
        match (absolute, parts.uri.scheme_str(), &authority) {
            (true, Some("http"), Some(a)) => format!("http://{a}{path}"),
            _ => path.to_string(),
        }
    };
    let body = if parts.method == Method::CONNECT {
        BodyFraming::Empty
    } else {
        match headers.get(CONTENT_LENGTH) {
            Some(v) => match v.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
                Some(0) => BodyFraming::Empty,
                Some(n) => BodyFraming::Length(n),
                None => return Err(bad("invalid Content-Length")),
            },
            None if end => BodyFraming::Empty,
            // No length: the origin gets it chunked, as from an HTTP/1.1
            // client that streams its body.
            None => BodyFraming::Chunked,
        }
    };
    let expect_continue = headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    Ok(RequestHead {
        method: parts.method.clone(),
        target,
        version: http::Version::HTTP_2,
        headers,
        body,
        keep_alive: true,
        expect_continue,
    })
}

/// Bytes of response data buffered per stream in user space (two DATA
/// frames of the default 16 KiB size): enough to keep the socket fed
/// while the next piece of the body is read, small enough that a client
/// that stops reading pins little (see `serve`).
const SEND_BUFFER: usize = 32 << 10;

/// Why Portico sent a GOAWAY, as the statistics count it.
#[derive(Debug, Clone, Copy)]
enum GoAway {
    Idle,
    PingTimeout,
    Drain,
    EnhanceYourCalm,
    Protocol,
    Other,
}

/// Serves one HTTP/2 connection until it ends. Its streams are futures
/// polled inside this task beside the connection, not tasks of their own:
/// a client's burst of 100 streams spawned as tasks overflowed the worker's
/// 256-task local queue into tokio's global queue, which a busy worker
/// serves rarely (a p99 of 220-300 ms in `bench/run h2-hits` against 55-63
/// ms in the connection's task, for the same requests per core). A stream
/// waiting on an origin still holds back no other: each is polled when
/// woken. Streams left when the connection ends finish on a task of their
/// own, as before.
pub async fn serve<H: Handler>(
    stream: ClientStream,
    peer: SocketAddr,
    settings: Arc<ConnSettings>,
    h2s: &H2Settings,
    handler: Arc<H>,
) {
    let Ok(local) = stream.tcp().local_addr() else {
        return;
    };
    // Where a transparent listener's client was connecting (one system
    // call a connection).
    let local = (
        local,
        h2s.redirected
            .then(|| super::conn::original_destination(stream.tcp()))
            .flatten(),
    );
    let c = counters();
    c.connections.fetch_add(1, Relaxed);
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(h2s.max_concurrent_streams)
        .max_header_list_size(h2s.max_header_list_size)
        .initial_window_size(h2s.initial_stream_window)
        .initial_connection_window_size(h2s.initial_connection_window)
        .max_pending_accept_reset_streams(h2s.max_pending_reset_streams)
        .max_local_error_reset_streams(Some(h2s.max_error_resets))
        // Response bytes the h2 crate holds for each stream, not yet
        // written to the socket: a client that opens huge windows and then
        // reads nothing makes every open stream fill it. At 256 KiB, 100
        // streams of a large cache hit held 34 MB per connection; at
        // SEND_BUFFER a connection holds at most max_concurrent_streams
        // times it, about what the kernel keeps for an HTTP/1 socket.
        .max_send_buffer_size(SEND_BUFFER);
    let io = Io::new(stream);
    let sender = io.sender();
    let handshake = builder.handshake::<_, Bytes>(io);
    tokio::pin!(handshake);
    // The server's SETTINGS go out while it waits for the client's preface.
    let handshake = std::future::poll_fn(|cx| {
        let r = handshake.as_mut().poll(cx);
        let _ = send_pass(&sender, cx);
        r
    });
    let mut conn = match tokio::time::timeout(settings.header_timeout, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(client = %peer.ip(), "HTTP/2 handshake failed: {e}");
            return;
        }
        Err(_) => {
            settings.keepalive.header_timed_out();
            return;
        }
    };
    let mut ping = conn.ping_pong();
    let active = Arc::new(AtomicUsize::new(0));
    let epoch = Instant::now();
    // Milliseconds since `epoch` when the last stream ended.
    let last_end = Arc::new(AtomicU64::new(0));
    let mut idle_at = Instant::now() + h2s.idle_timeout;
    let ping_every = h2s.ping_interval;
    let mut next_ping = (!ping_every.is_zero()).then(|| Instant::now() + ping_every);
    let mut pong_due: Option<Instant> = None;
    let mut going_away: Option<GoAway> = None;
    // Once Portico has sent its GOAWAY: when to stop waiting for the
    // client's part of the graceful close (the h2 crate waits, with no
    // limit of its own, for the acknowledgement of the PING it sends with
    // the GOAWAY). A client that never sends it held its connection for
    // ever, past every other timeout here.
    let mut close_by: Option<Instant> = None;
    let grace = h2s.ping_timeout.max(Duration::from_secs(1));
    let drained = crate::drain::started(usize::from(peer.port()));
    tokio::pin!(drained);
    let far = Duration::from_secs(86400 * 365);
    // One future type (this function's async block): FuturesUnordered keeps
    // each in its own task node, with no box of ours around it.
    let mut streams = FuturesUnordered::new();
    loop {
        let ping_at = pong_due.or(next_ping).unwrap_or_else(|| Instant::now() + far);
        tokio::select! {
            accepted = std::future::poll_fn(|cx| {
                // The streams first, so that what they answer goes out in
                // this pass: one system call for every response that was ready.
                while let Poll::Ready(Some(())) = streams.poll_next_unpin(cx) {}
                let r = conn.poll_accept(cx);
                if matches!(r, Poll::Ready(Some(Ok(_)))) {
                    // Another request may follow at once: the pass is not
                    // over, and the loop comes straight back here.
                    return r;
                }
                match send_pass(&sender, cx) {
                    Poll::Ready(Err(e)) => {
                        tracing::debug!(client = %peer.ip(), "HTTP/2 connection lost: {e}");
                        Poll::Ready(None)
                    }
                    _ => r,
                }
            }) => match accepted {
                Some(Ok((req, respond))) => {
                    c.streams.fetch_add(1, Relaxed);
                    active.fetch_add(1, Relaxed);
                    let guard = StreamGuard { active: active.clone(), last_end: last_end.clone(), epoch };
                    let (settings, handler, absolute) = (settings.clone(), handler.clone(), h2s.absolute_targets);
                    streams.push(async move {
                        let _guard = guard;
                        serve_stream(req, respond, peer, local, &settings, &*handler, absolute).await;
                    });
                }
                Some(Err(e)) => {
                    // A GOAWAY of our own making (idle, ping, drain) is counted already.
                    if e.is_go_away() && !e.is_remote() && going_away.is_none() {
                        let why = match e.reason() {
                            Some(Reason::ENHANCE_YOUR_CALM) => GoAway::EnhanceYourCalm,
                            Some(Reason::NO_ERROR) | None => GoAway::Other,
                            Some(_) => GoAway::Protocol,
                        };
                        count_goaway(why);
                    }
                    tracing::debug!(client = %peer.ip(), "HTTP/2 connection ended: {e}");
                    break;
                }
                None => break,
            },
            () = tokio::time::sleep_until(idle_at), if going_away.is_none() => {
                let now = Instant::now();
                let ended = epoch + Duration::from_millis(last_end.load(Relaxed));
                if active.load(Relaxed) == 0 && now >= ended + h2s.idle_timeout {
                    going_away = Some(GoAway::Idle);
                    count_goaway(GoAway::Idle);
                    settings.keepalive.timed_out();
                    conn.graceful_shutdown();
                    close_by = Some(now + grace);
                } else {
                    idle_at = (ended + h2s.idle_timeout).max(now + Duration::from_millis(10));
                    if active.load(Relaxed) > 0 {
                        idle_at = now + h2s.idle_timeout;
                    }
                }
            }
            () = &mut drained, if going_away.is_none() => {
                going_away = Some(GoAway::Drain);
                count_goaway(GoAway::Drain);
                conn.graceful_shutdown();
                close_by = Some(Instant::now() + grace);
            }
            () = tokio::time::sleep_until(close_by.unwrap_or_else(|| Instant::now() + far)), if close_by.is_some() => {
                // Streams still running (a drain) may finish; then the
                // client has had `grace` more to end its part.
                if active.load(Relaxed) == 0 {
                    tracing::debug!(client = %peer.ip(), "HTTP/2 GOAWAY not answered: closing");
                    break;
                }
                close_by = Some(Instant::now() + grace);
            }
            () = tokio::time::sleep_until(ping_at), if ping.is_some() && going_away.is_none() => {
                if pong_due.is_some() {
                    count_goaway(GoAway::PingTimeout);
                    tracing::debug!(client = %peer.ip(), "HTTP/2 PING not acknowledged: closing");
                    conn.abrupt_shutdown(Reason::NO_ERROR);
                    going_away = Some(GoAway::PingTimeout);
                    close_by = Some(Instant::now() + grace);
                } else if let Some(p) = ping.as_mut() {
                    if p.send_ping(h2::Ping::opaque()).is_ok() {
                        pong_due = Some(Instant::now() + h2s.ping_timeout);
                    }
                    next_ping = None;
                }
            }
            pong = std::future::poll_fn(|cx| match ping.as_mut() {
                Some(p) => p.poll_pong(cx),
                None => Poll::Pending,
            }), if pong_due.is_some() => {
                pong_due = None;
                if pong.is_ok() {
                    next_ping = Some(Instant::now() + ping_every);
                }
            }
        }
    }
    // Streams still running when the connection stops accepting (the
    // client's GOAWAY, or ours) finish on a task of their own, while this
    // one drives the connection a little longer for what they send.
    if !streams.is_empty() {
        tokio::spawn(async move { while streams.next().await.is_some() {} });
    }
    // Closing: wait for the GOAWAY and the last frames to go out.
    let closed = std::future::poll_fn(|cx| {
        let r = conn.poll_closed(cx);
        let _ = send_pass(&sender, cx);
        r
    });
    let _ = tokio::time::timeout(Duration::from_secs(1), closed).await;
}

/// Counts a stream's end and notes when the last one ended.
struct StreamGuard {
    active: Arc<AtomicUsize>,
    last_end: Arc<AtomicU64>,
    epoch: Instant,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_end.store(ms, Relaxed);
        self.active.fetch_sub(1, Relaxed);
    }
}

/// One stream: its request through the handler, as an HTTP/1 request's.
async fn serve_stream<H: Handler>(
    req: http::Request<h2::RecvStream>,
    respond: SendResponse<Bytes>,
    peer: SocketAddr,
    // The local address, and where the connection was redirected from.
    local: (SocketAddr, Option<SocketAddr>),
    settings: &ConnSettings,
    handler: &H,
    absolute: bool,
) {
    // What lives across the handler's await makes this future's size, and
    // FuturesUnordered copies a stream's future three times as it takes it
    // in: the request's parts end in this block, and the refusal (rare) is
    // boxed. A stream's future as pushed: 3,792 bytes before, 1,848 after.
    let (head, recv) = {
        let (mut parts, recv) = req.into_parts();
        let head = request_head(&mut parts, recv.is_end_stream(), absolute).map_err(|error| {
            let first_line: String = format!("{} {} HTTP/2.0", parts.method, parts.uri)
                .chars()
                .take(200)
                .collect();
            (error, parts.method, first_line)
        });
        (head, recv)
    };
    let head = match head {
        Ok(h) => h,
        Err((error, method, first_line)) => {
            let out = ResponseWriter::h2(H2Out::new(respond), &method, settings);
            Box::pin(handler.reject(RejectInfo {
                error,
                out,
                peer,
                first_line,
            }))
            .await;
            return;
        }
    };
    let method = head.method.clone();
    let mut out = ResponseWriter::h2(H2Out::new(respond), &method, settings);
    out.limit_bandwidth(peer.ip(), Default::default());
    let mut buf = BytesMut::new();
    let body = BodyReader::h2(recv, &mut buf, settings.max_body, settings.body_idle_timeout);
    // A stream's requests share no memory: streams run at once, and a
    // connection's memo would need a lock for what one lookup costs.
    let mut memory = super::conn::ConnMemory::default();
    let mut ex = Exchange {
        head,
        body,
        out,
        stream: None,
        peer,
        local: super::conn::LocalAddr::known_redirected(local.0, local.1),
        cache_result: None,
        hierarchy: None,
        user: None,
        memory: &mut memory,
    };
    let one = crate::util::box_in_place(|| handler.handle(&mut ex));
    let outcome = if handler.timed() {
        crate::stats::scope(one).await
    } else {
        one.await
    };
    // A response cut short (an origin that failed midway, a handler that
    // gave up) must not look complete: RST_STREAM says so.
    let tunnel =
        matches!(outcome, Outcome::Close) && ex.out.status() == Some(StatusCode::OK) && method == Method::CONNECT;
    if !ex.out.is_finished()
        && !tunnel
        && let Some(o) = ex.out.h2_out()
    {
        o.abort();
    }
}

/// The HTTP/2 counters of this process (shown by `stats::Http2Info`).
pub struct Counters {
    /// Connections that spoke HTTP/2 (preface received).
    pub connections: AtomicU64,
    /// Streams (requests) accepted.
    pub streams: AtomicU64,
    /// Streams the client reset before their response was complete.
    pub client_reset: AtomicU64,
    /// Streams Portico reset (a response cut short, a client that took nothing).
    pub resets_sent: AtomicU64,
    /// GOAWAY sent: no stream for `http2.idle_timeout`.
    pub goaway_idle: AtomicU64,
    /// GOAWAY sent: a PING not acknowledged within `http2.ping_timeout`.
    pub goaway_ping_timeout: AtomicU64,
    /// GOAWAY sent: the server is draining (SIGTERM).
    pub goaway_drain: AtomicU64,
    /// GOAWAY sent: ENHANCE_YOUR_CALM (rapid reset, too many error resets).
    pub goaway_enhance_your_calm: AtomicU64,
    /// GOAWAY sent: a protocol error (a bad frame, a CONTINUATION flood, HPACK).
    pub goaway_protocol: AtomicU64,
    /// GOAWAY sent for another reason.
    pub goaway_other: AtomicU64,
}

static COUNTERS: Counters = Counters {
    connections: AtomicU64::new(0),
    streams: AtomicU64::new(0),
    client_reset: AtomicU64::new(0),
    resets_sent: AtomicU64::new(0),
    goaway_idle: AtomicU64::new(0),
    goaway_ping_timeout: AtomicU64::new(0),
    goaway_drain: AtomicU64::new(0),
    goaway_enhance_your_calm: AtomicU64::new(0),
    goaway_protocol: AtomicU64::new(0),
    goaway_other: AtomicU64::new(0),
};

/// This process's HTTP/2 counters.
pub fn counters() -> &'static Counters {
    &COUNTERS
}

fn count_goaway(why: GoAway) {
    let c = counters();
    let n = match why {
        GoAway::Idle => &c.goaway_idle,
        GoAway::PingTimeout => &c.goaway_ping_timeout,
        GoAway::Drain => &c.goaway_drain,
        GoAway::EnhanceYourCalm => &c.goaway_enhance_your_calm,
        GoAway::Protocol => &c.goaway_protocol,
        GoAway::Other => &c.goaway_other,
    };
    n.fetch_add(1, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).expect("test request").into_parts().0
    }

    #[test]
    fn the_authority_pseudo_header_is_the_host_of_an_origin_form_request() {
        let h = request_head(
            &mut parts("GET", "https://www.example/a?b", &[("host", "other")]),
            true,
            false,
        )
        .expect("valid");
        assert_eq!(h.target, "/a?b");
        assert_eq!(h.headers.get(HOST).expect("host"), "www.example");
        assert_eq!(h.body, BodyFraming::Empty);
    }

    #[test]
    fn a_forward_listener_gets_the_absolute_url_from_scheme_and_authority() {
        let h = request_head(&mut parts("GET", "http://www.example:8080/x", &[]), true, true).expect("valid");
        assert_eq!(h.target, "http://www.example:8080/x");
    }

    #[test]
    fn an_https_request_to_a_forward_listener_is_for_the_proxy_itself() {
        let h = request_head(&mut parts("GET", "https://proxy.example/.perf", &[]), true, true).expect("valid");
        assert_eq!(h.target, "/.perf");
    }

    #[test]
    fn a_connect_request_targets_its_authority() {
        let h = request_head(&mut parts("CONNECT", "www.example:443", &[]), false, true).expect("valid");
        assert_eq!(h.target, "www.example:443");
        assert_eq!(h.body, BodyFraming::Empty);
    }

    #[test]
    fn cookie_fields_split_by_the_client_are_joined_with_semicolons() {
        let h = request_head(
            &mut parts("GET", "https://a/", &[("cookie", "a=1"), ("cookie", "b=2")]),
            true,
            false,
        )
        .expect("valid");
        assert_eq!(h.headers.get(COOKIE).expect("cookie"), "a=1; b=2");
    }

    #[test]
    fn a_body_without_a_length_is_streamed_chunked_upstream() {
        let h = request_head(&mut parts("POST", "https://a/", &[]), false, false).expect("valid");
        assert_eq!(h.body, BodyFraming::Chunked);
        let h = request_head(
            &mut parts("POST", "https://a/", &[("content-length", "5")]),
            false,
            false,
        )
        .expect("valid");
        assert_eq!(h.body, BodyFraming::Length(5));
        assert!(
            request_head(
                &mut parts("POST", "https://a/", &[("content-length", "x")]),
                false,
                false
            )
            .is_err()
        );
    }

    #[test]
    fn connection_specific_fields_are_removed_from_responses() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("close, x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert("x-end", HeaderValue::from_static("2"));
        strip_connection_fields(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end"));
    }

    #[test]
    fn te_is_kept_only_as_trailers_and_the_other_http1_fields_go() {
        let mut h = HeaderMap::new();
        h.insert(http::header::TE, HeaderValue::from_static("trailers"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        strip_connection_fields(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h.get(http::header::TE).unwrap(), "trailers");

        let mut h = HeaderMap::new();
        h.append(http::header::TE, HeaderValue::from_static("trailers"));
        h.append(http::header::TE, HeaderValue::from_static("gzip"));
        strip_connection_fields(&mut h);
        assert!(h.is_empty(), "{h:?}");
    }
}
