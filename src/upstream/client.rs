//! The pooled HTTP/1.1 client every request to an origin or a parent proxy
//! goes through: Portico's own, on the same head writer style and chunked
//! coding as the client side (`http1`), where hyper's client used to be.
//!
//! An exchange runs entirely on the task of the request that makes it: the
//! request head and body are written, the response head read, and the
//! response body decoded as the caller polls it, with no connection task,
//! channel or waker between them (hyper's client spent about a third of a
//! miss's instructions there). The request body keeps going out while the
//! response comes in (an origin may answer early, or echo as it reads).
//!
//! The connection goes back to the pool when the response body has been
//! read to its end, the request is completely sent, the origin allowed it
//! (`keep_alive`) and nothing follows the response; otherwise it is closed.
//! Pooled connections are kept per scheme and authority,
//! `origin.pool_max_idle` at most per origin, for `origin.pool_idle_timeout`,
//! and are checked for a close by the origin before reuse. A request without
//! a body and with an idempotent method that fails on a reused connection
//! before any byte of an answer came back is sent once more on a new
//! connection: the origin closed that connection while it was idle (RFC 9112
//! 9.3.1: "A user agent MUST NOT automatically retry a request with a
//! non-idempotent method").

use super::UpstreamError;
use super::body::{ClientBodyError, ProxyBody};
use super::caps::Place;
use super::connect::{Conn, Connector};
use super::response::{Framing, ResponseHead, parse_response};
use crate::http1::chunked::{ChunkedDecoder, Decoded, last_chunk};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::Authority;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Called with each interim (1xx) response that comes before the final one
/// (`proxy/interim.rs` relays them to the client).
pub type OnInterim<'a> = &'a mut (dyn FnMut(StatusCode, HeaderMap) + Send);

/// Bytes read at once for a response head (a whole small response
/// usually comes with it).
const HEAD_READ: usize = 16 << 10;

/// Most bytes read at once for a response body.
const BODY_READ: usize = 64 << 10;

/// Request body bytes gathered from the client into one write at most.
const GATHER: usize = 64 << 10;

/// Largest trailer section accepted after a chunked response body.
const MAX_TRAILERS: usize = 16 << 10;

/// The client: a connector and its pool of idle connections.
pub struct Client {
    connector: Connector,
    pool: Arc<Pool>,
}

impl Client {
    /// A client opening its connections with `connector`, keeping at most
    /// `max_idle` idle ones per origin for `idle_timeout`.
    pub fn new(connector: Connector, idle_timeout: Duration, max_idle: usize) -> Client {
        Client {
            connector,
            pool: Arc::new(Pool {
                idle: Mutex::new([HashMap::new(), HashMap::new()]),
                max_idle,
                idle_timeout,
                reaping: AtomicBool::new(false),
            }),
        }
    }

    /// Sends `req` (absolute URI) and returns the response head as soon as
    /// it has arrived; its body is read as it is polled. `on_interim` gets
    /// the 1xx responses that come first.
    /// `place` (a place at the origin, caps.rs) is given back when the
    /// exchange is over, with the connection.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
        mut on_interim: Option<OnInterim<'_>>,
        place: Option<Place>,
    ) -> Result<Response<OriginBody>, UpstreamError> {
        let (parts, body) = req.into_parts();
        let https = parts.uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let Some(authority) = parts.uri.authority().cloned() else {
            return Err(UpstreamError::Failed("the request URI names no server".into()));
        };
        let retryable = body.is_end_stream() && is_idempotent(&parts.method);
        let pinned = parts.extensions.get::<super::Pinned>().map(|p| p.0);
        let mut body = Some(body);
        let mut retried = false;
        loop {
            // A retry goes on a new connection: the pooled ones may all
            // have been closed at once (the origin restarted).
            let pooled = if retried {
                None
            } else {
                self.pool.take(https, authority.as_str(), pinned)
            };
            let (conn, origin, reused) = match pooled {
                Some((conn, origin)) => (conn, origin, true),
                None => {
                    let conn = self
                        .connector
                        .open_to(&parts.uri, pinned)
                        .await
                        .map_err(UpstreamError::Connect)?;
                    // Asked once per connection, kept with it in the pool
                    // (a pinned request's takes only one to its address).
                    let origin = if pinned.is_some() || self.connector.records_origin() {
                        conn.tcp().peer_addr().ok().map(|a| a.ip())
                    } else {
                        None
                    };
                    (conn, origin, false)
                }
            };
            let absolute = matches!(conn, Conn::Proxied(_));
            let head = request_head(&parts, absolute);
            let body = body.take().unwrap_or_else(ProxyBody::empty);
            let mut ex = Exchange::new(conn, head, body, parts.method.clone());
            match std::future::poll_fn(|cx| ex.poll_head(cx, &mut on_interim)).await {
                Ok(head) => {
                    let release = Release {
                        pool: self.pool.clone(),
                        https,
                        authority,
                        origin,
                        _place: place,
                    };
                    return Ok(response(head, ex, release));
                }
                Err(e) if reused && retryable && !ex.received => {
                    tracing::debug!("a pooled connection to {authority} failed before answering ({e}); sending again");
                    retried = true;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// RFC 9110 9.2.2.
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The request line and fields: the target in origin form (`/path?q`, or
/// `*`), or in absolute form for a parent proxy (RFC 9112 3.2.2).
fn request_head(parts: &http::request::Parts, absolute: bool) -> Bytes {
    let size = 64
        + parts.uri.path_and_query().map_or(1, |p| p.as_str().len())
        + parts
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 4)
            .sum::<usize>();
    let mut b = BytesMut::with_capacity(size);
    b.put_slice(parts.method.as_str().as_bytes());
    b.put_u8(b' ');
    if absolute {
        b.put_slice(parts.uri.scheme_str().unwrap_or("http").as_bytes());
        b.put_slice(b"://");
        b.put_slice(parts.uri.authority().map_or("", |a| a.as_str()).as_bytes());
    }
    // An absolute URI has no asterisk form: a parent gets `/`.
    match parts.uri.path_and_query().map(|p| p.as_str()) {
        Some("*") if absolute => b.put_u8(b'/'),
        Some(p) if !p.is_empty() => b.put_slice(p.as_bytes()),
        _ => b.put_u8(b'/'),
    }
    b.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        b.put_slice(name.as_str().as_bytes());
        b.put_slice(b": ");
        b.put_slice(value.as_bytes());
        b.put_slice(b"\r\n");
    }
    b.put_slice(b"\r\n");
    b.freeze()
}

/// Reads what is available into `buf`, making room for `want` bytes when
/// it has little left; 0 at end of stream.
fn poll_fill(conn: &mut Conn, buf: &mut BytesMut, want: usize, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < want.min(4096) {
        buf.reserve(want);
    }
    match conn {
        // Plain TCP straight from the socket: one `recvfrom`, no ReadBuf,
        // and none more once a short read emptied it.
        Conn::Plain(tcp) => loop {
            match crate::http1::try_read_drained(tcp, buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(tcp.poll_read_ready(cx))?,
                Err(e) => return Poll::Ready(Err(e)),
            }
        },
        other => {
            let read = tokio::io::AsyncReadExt::read_buf(other, buf);
            std::pin::pin!(read).poll(cx)
        }
    }
}

/// The request going out: its head, then its body as the client sends it
/// (chunked when its length is unknown), gathered into vectored writes.
struct Sending {
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// None once its end has been queued.
    body: Option<ProxyBody>,
    chunked: bool,
    /// The last chunk (with trailers) is queued.
    last_chunk: bool,
    /// A body frame or the body's end has come: the head may go out. It
    /// waits for them so that a body that fails at once (a malformed first
    /// chunk) sends the origin nothing at all, not a request cut short.
    started: bool,
    /// Bytes were written that a TLS stream may still hold.
    flush_owed: bool,
    /// The connection failed while writing: nothing more is sent.
    failed: Option<io::Error>,
}

impl Sending {
    fn new(head: Bytes, body: ProxyBody, chunked: bool) -> Sending {
        let pending_len = head.len();
        let mut s = Sending {
            pending: VecDeque::from([head]),
            pending_len,
            body: Some(body),
            chunked,
            last_chunk: false,
            started: false,
            flush_owed: false,
            failed: None,
        };
        if s.body.as_ref().is_some_and(|b| b.is_end_stream()) {
            s.end_body();
        }
        s
    }

    /// True when the whole request has gone out.
    fn is_done(&self) -> bool {
        self.body.is_none() && self.pending.is_empty() && !self.flush_owed && self.failed.is_none()
    }

    fn push(&mut self, bytes: Bytes) {
        self.pending_len += bytes.len();
        self.pending.push_back(bytes);
    }

    fn end_body(&mut self) {
        self.started = true;
        self.body = None;
        if self.chunked && !self.last_chunk {
            self.last_chunk = true;
            self.push(Bytes::from_static(b"0\r\n\r\n"));
        }
    }

    fn queue(&mut self, frame: Frame<Bytes>) {
        self.started = true;
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) if self.chunked => {
                // A zero-size chunk would end the body: skipped above.
                self.push(Bytes::from(format!("{:X}\r\n", data.len())));
                self.push(data);
                self.push(Bytes::from_static(b"\r\n"));
            }
            Ok(data) => self.push(data),
            Err(frame) => {
                // Trailers go out only in the chunked coding.
                if let Ok(trailers) = frame.into_trailers()
                    && self.chunked
                    && !self.last_chunk
                {
                    self.last_chunk = true;
                    self.push(Bytes::from(last_chunk(Some(&trailers))));
                }
            }
        }
    }

    fn fail(&mut self, e: io::Error) {
        self.failed = Some(e);
        self.pending.clear();
        self.pending_len = 0;
        self.body = None;
        self.flush_owed = false;
    }

    /// Sends what it can without waiting. An error is the client's body
    /// failing; a connection failure is kept in `failed` (the origin may
    /// still have answered).
    fn poll(&mut self, conn: &mut Conn, cx: &mut Context<'_>) -> Result<(), ClientBodyError> {
        if self.failed.is_some() {
            return Ok(());
        }
        loop {
            while self.pending_len < GATHER
                && let Some(body) = self.body.as_mut()
            {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        self.queue(frame);
                        // With a Content-Length, the body ends with its last byte.
                        if self
                            .body
                            .as_ref()
                            .is_some_and(|b| !self.chunked && b.size_hint().exact() == Some(0))
                        {
                            self.end_body();
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        self.body = None;
                        return Err(e);
                    }
                    Poll::Ready(None) => self.end_body(),
                    Poll::Pending => break,
                }
            }
            if !self.started {
                return Ok(());
            }
            if self.pending.is_empty() {
                if self.flush_owed {
                    match Pin::new(&mut *conn).poll_flush(cx) {
                        Poll::Ready(Ok(())) => self.flush_owed = false,
                        Poll::Ready(Err(e)) => self.fail(e),
                        Poll::Pending => {}
                    }
                }
                return Ok(());
            }
            let mut slices = [IoSlice::new(&[]); 16];
            let mut count = 0;
            for (slot, bytes) in slices.iter_mut().zip(self.pending.iter()) {
                *slot = IoSlice::new(bytes);
                count += 1;
            }
            match Pin::new(&mut *conn).poll_write_vectored(cx, &slices[..count]) {
                Poll::Ready(Ok(0)) => {
                    self.fail(io::ErrorKind::WriteZero.into());
                    return Ok(());
                }
                Poll::Ready(Ok(mut n)) => {
                    self.flush_owed = true;
                    self.pending_len -= n;
                    while n > 0 {
                        let Some(front) = self.pending.front_mut() else { break };
                        if front.len() <= n {
                            n -= front.len();
                            self.pending.pop_front();
                        } else {
                            front.advance(n);
                            n = 0;
                        }
                    }
                }
                Poll::Ready(Err(e)) => {
                    self.fail(e);
                    return Ok(());
                }
                Poll::Pending => return Ok(()),
            }
        }
    }
}

/// One request and its response on one connection.
struct Exchange {
    conn: Conn,
    /// Bytes read and not yet used.
    buf: BytesMut,
    method: Method,
    sending: Sending,
    /// Some byte of an answer came back.
    received: bool,
}

impl Exchange {
    fn new(conn: Conn, head: Bytes, body: ProxyBody, method: Method) -> Exchange {
        let chunked = body.size_hint().exact().is_none();
        Exchange {
            conn,
            buf: BytesMut::new(),
            method,
            sending: Sending::new(head, body, chunked),
            received: false,
        }
    }

    /// Sends the request and reads up to the final response head, handing
    /// interim ones to `on_interim`.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        on_interim: &mut Option<OnInterim<'_>>,
    ) -> Poll<Result<ResponseHead, UpstreamError>> {
        loop {
            self.sending
                .poll(&mut self.conn, cx)
                .map_err(UpstreamError::ClientBody)?;
            if !self.buf.is_empty() {
                match parse_response(&mut self.buf, &self.method) {
                    Ok(Some(head))
                        if head.status.is_informational() && head.status != StatusCode::SWITCHING_PROTOCOLS =>
                    {
                        if let Some(f) = on_interim.as_mut() {
                            f(head.status, head.headers);
                        }
                        continue;
                    }
                    Ok(Some(head)) => return Poll::Ready(Ok(head)),
                    Ok(None) => {}
                    Err(why) => {
                        return Poll::Ready(Err(UpstreamError::Failed(format!(
                            "the origin's response is not valid HTTP/1.1: {why}"
                        ))));
                    }
                }
            }
            match ready!(poll_fill(&mut self.conn, &mut self.buf, HEAD_READ, cx)) {
                Ok(0) if self.buf.is_empty() => {
                    return Poll::Ready(Err(match &self.sending.failed {
                        Some(e) if !self.received => {
                            UpstreamError::Failed(format!("the origin connection failed: {}", crate::util::io_cause(e)))
                        }
                        _ => UpstreamError::Failed("the origin closed the connection before answering".into()),
                    }));
                }
                Ok(0) => {
                    return Poll::Ready(Err(UpstreamError::Failed(
                        "the origin closed the connection in the middle of its response head".into(),
                    )));
                }
                Ok(_) => self.received = true,
                Err(e) => {
                    return Poll::Ready(Err(UpstreamError::Failed(format!(
                        "the origin connection failed: {}",
                        crate::util::io_cause(&e)
                    ))));
                }
            }
        }
    }
}

/// Where a finished connection goes back to, and the place at its origin
/// it held (given back when this is dropped: after the connection is
/// pooled or closed, or when it is upgraded).
struct Release {
    pool: Arc<Pool>,
    https: bool,
    authority: Authority,
    /// The connection's origin address, pooled with it.
    origin: Option<IpAddr>,
    _place: Option<Place>,
}

/// The response for `head`, its body read from `ex`.
fn response(head: ResponseHead, ex: Exchange, release: Release) -> Response<OriginBody> {
    let origin = release.origin;
    let ResponseHead {
        status,
        version,
        headers,
        framing,
        keep_alive,
    } = head;
    let reading = |ex, decoder, keep_alive, release| {
        Box::new(Reading {
            ex,
            decoder,
            keep_alive,
            release,
        })
    };
    let state = if status == StatusCode::SWITCHING_PROTOCOLS {
        BodyState::Upgrade(reading(ex, Decoder::Length(0), false, release))
    } else {
        match framing {
            Framing::Empty | Framing::Length(0) => {
                // A HEAD answered with a length or chunked framing names a
                // body it must not send (RFC 9110 9.3.2). An origin that
                // sends it all the same, a little later than `still_open`
                // can see, had it read as the answer to the next request
                // on this connection: another client's. Not pooled, at the
                // cost of a connection per HEAD, which proxies see rarely.
                let keep = keep_alive && !(ex.method == Method::HEAD && announces_body(&headers));
                finish(ex, keep, release);
                BodyState::Done
            }
            // The whole body came with the head (most small responses):
            // the connection is free at once, whether or not the caller
            // reads the body.
            Framing::Length(n) if ex.buf.len() as u64 >= n => {
                let mut ex = ex;
                let data = ex.buf.split_to(n as usize).freeze();
                finish(ex, keep_alive, release);
                BodyState::Full(data)
            }
            Framing::Length(n) => BodyState::Reading(reading(ex, Decoder::Length(n), keep_alive, release)),
            Framing::Chunked => BodyState::Reading(reading(
                ex,
                Decoder::Chunked(ChunkedDecoder::new(MAX_TRAILERS)),
                keep_alive,
                release,
            )),
            Framing::UntilClose => BodyState::Reading(reading(ex, Decoder::UntilClose, keep_alive, release)),
        }
    };
    let mut response = Response::new(OriginBody {
        state,
        peeked: None,
        origin,
    });
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = headers;
    response
}

/// Whether a response's fields announce a body: a `Content-Length` other
/// than 0, or a `Transfer-Encoding`.
fn announces_body(headers: &http::HeaderMap) -> bool {
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes().trim_ascii() != b"0")
}

/// Puts the connection of a completed exchange back in the pool when it
/// can carry another request: kept alive, the request all sent, nothing
/// after the response. Otherwise it is closed here. Bytes after a response
/// are no answer to anything: kept, they would be read as the answer to
/// the next request, which may be another client's (response splitting).
fn finish(mut ex: Exchange, keep_alive: bool, release: Release) {
    if keep_alive && ex.sending.is_done() && ex.buf.is_empty() && nothing_decrypted(&mut ex.conn) {
        release
            .pool
            .put(release.https, release.authority.as_str(), ex.conn, release.origin);
    }
}

/// Over TLS, bytes after the response may already be decrypted inside
/// rustls, where `still_open`'s look at the socket does not see them: one
/// read that must find nothing. Plain TCP has nothing of the kind.
fn nothing_decrypted(conn: &mut Conn) -> bool {
    if matches!(conn, Conn::Plain(_) | Conn::Proxied(super::Wire::Tcp(_))) {
        return true;
    }
    let mut raw = [0u8; 1];
    let mut probe = ReadBuf::new(&mut raw);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    Pin::new(conn).poll_read(&mut cx, &mut probe).is_pending()
}

/// A response body from an origin, read from its connection as it is polled.
pub struct OriginBody {
    state: BodyState,
    /// What [`OriginBody::ready_data`] found next when it was not data (the
    /// end, trailers, an error): the next `poll_frame` returns it.
    peeked: Option<Option<Result<Frame<Bytes>, OriginBodyError>>>,
    /// See [`OriginBody::origin_addr`].
    origin: Option<IpAddr>,
}

enum BodyState {
    /// Nothing (more) to read.
    Done,
    /// The whole body, read with the head.
    Full(Bytes),
    /// Being read.
    Reading(Box<Reading>),
    /// A `101`: the connection is the caller's to take ([`OriginBody::upgrade`]).
    Upgrade(Box<Reading>),
}

struct Reading {
    ex: Exchange,
    decoder: Decoder,
    keep_alive: bool,
    release: Release,
}

enum Decoder {
    /// Bytes still to come.
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
}

/// Why a response body could not be read to its end.
#[derive(Debug, Clone)]
pub struct OriginBodyError(String);

impl std::fmt::Display for OriginBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OriginBodyError {}

impl OriginBody {
    /// The address of the server that sent the response when Portico
    /// connected to it itself for a destination a client chose, under a
    /// `proxy.deny_destinations` that refuses something
    /// (`Connector::records_origin`): None otherwise, and through a parent
    /// proxy (or another array member), whose address says nothing of
    /// where the response was made. The cache keeps it with what it stores, so that a stored
    /// response from an address `proxy.deny_destinations` refuses now is
    /// not served (`proxy/cache.rs`).
    pub fn origin_addr(&self) -> Option<IpAddr> {
        self.origin
    }

    /// The next body bytes if the origin has sent them already: from what
    /// was read with earlier frames, or from one read that does not wait.
    /// None when none are there yet, and when what comes next is not data
    /// (the next `poll_frame` returns it). A caller that sends what it has
    /// gathered this way in one write sends a response that came in two
    /// reads (its head's and the rest) as one: one system call and one
    /// segment to the client, not two (HAProxy gets the same from
    /// `MSG_MORE`, which would hold the first part back when the rest is
    /// slow to come; this never waits).
    pub fn ready_data(&mut self) -> Option<Bytes> {
        if self.peeked.is_some() {
            return None;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut *self).poll_frame(&mut cx) {
            Poll::Pending => None,
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Some(data),
                Err(frame) => {
                    self.peeked = Some(Some(Ok(frame)));
                    None
                }
            },
            Poll::Ready(other) => {
                self.peeked = Some(other);
                None
            }
        }
    }

    /// After a `101 Switching Protocols`: the connection, for the caller's
    /// byte pump, with what the origin already sent after the head.
    pub fn upgrade(self) -> Option<Upgraded> {
        match self.state {
            BodyState::Upgrade(r) => {
                let Reading { ex, .. } = *r;
                Some(Upgraded {
                    conn: ex.conn,
                    early: ex.buf.freeze(),
                })
            }
            _ => None,
        }
    }
}

impl Reading {
    fn error(&self, text: &str) -> OriginBodyError {
        OriginBodyError(text.to_string())
    }
}

impl Body for OriginBody {
    type Data = Bytes;
    type Error = OriginBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, OriginBodyError>>> {
        let this = &mut *self;
        if let Some(next) = this.peeked.take() {
            return Poll::Ready(next);
        }
        let r = match &mut this.state {
            BodyState::Done | BodyState::Upgrade(_) => return Poll::Ready(None),
            BodyState::Full(_) => {
                let BodyState::Full(data) = std::mem::replace(&mut this.state, BodyState::Done) else {
                    return Poll::Ready(None);
                };
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            BodyState::Reading(r) => r,
        };
        let outcome = loop {
            // Full duplex: the request body keeps going out.
            if let Err(e) = r.ex.sending.poll(&mut r.ex.conn, cx) {
                break Err(OriginBodyError(format!("the request body failed: {e}")));
            }
            let want = match &mut r.decoder {
                Decoder::Length(0) => break Ok(None),
                Decoder::Length(left) => {
                    if !r.ex.buf.is_empty() {
                        let take = (*left).min(r.ex.buf.len() as u64);
                        *left -= take;
                        break Ok(Some(Frame::data(r.ex.buf.split_to(take as usize).freeze())));
                    }
                    (*left).clamp(4096, BODY_READ as u64) as usize
                }
                Decoder::Chunked(d) => match d.decode(&mut r.ex.buf, BODY_READ) {
                    Ok(Decoded::Data(data)) => break Ok(Some(Frame::data(data))),
                    Ok(Decoded::Trailers(t)) => break Ok(Some(Frame::trailers(t))),
                    Ok(Decoded::Done) => break Ok(None),
                    Ok(Decoded::NeedMore) => BODY_READ,
                    Err(e) => break Err(OriginBodyError(format!("the origin's chunked body is malformed: {e}"))),
                },
                Decoder::UntilClose => {
                    if !r.ex.buf.is_empty() {
                        break Ok(Some(Frame::data(r.ex.buf.split().freeze())));
                    }
                    BODY_READ
                }
            };
            match ready!(poll_fill(&mut r.ex.conn, &mut r.ex.buf, want, cx)) {
                Ok(0) if matches!(r.decoder, Decoder::UntilClose) => {
                    r.keep_alive = false;
                    break Ok(None);
                }
                Ok(0) => break Err(r.error("the origin closed the connection before the end of the body")),
                Ok(_) => {}
                Err(e) => {
                    break Err(OriginBodyError(format!(
                        "the origin connection failed: {}",
                        crate::util::io_cause(&e)
                    )));
                }
            }
        };
        match outcome {
            Ok(Some(frame)) => {
                // The last bytes of a sized body: the connection is free now,
                // not at the next poll (which may never come).
                if matches!(r.decoder, Decoder::Length(0)) {
                    this.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Ok(None) => {
                this.end();
                Poll::Ready(None)
            }
            Err(e) => {
                this.state = BodyState::Done;
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if let Some(next) = &self.peeked {
            return next.is_none();
        }
        match &self.state {
            BodyState::Done | BodyState::Upgrade(_) => true,
            BodyState::Full(_) => false,
            BodyState::Reading(r) => matches!(r.decoder, Decoder::Length(0)),
        }
    }

    fn size_hint(&self) -> SizeHint {
        // What is peeked is never data: no body bytes are left before it.
        if self.peeked.is_some() {
            return SizeHint::with_exact(0);
        }
        match &self.state {
            BodyState::Done | BodyState::Upgrade(_) => SizeHint::with_exact(0),
            BodyState::Full(data) => SizeHint::with_exact(data.len() as u64),
            BodyState::Reading(r) => match r.decoder {
                Decoder::Length(n) => SizeHint::with_exact(n),
                _ => SizeHint::default(),
            },
        }
    }
}

impl OriginBody {
    /// The body has been read to its end: the connection goes back to the
    /// pool if it can.
    fn end(&mut self) {
        if let BodyState::Reading(r) = std::mem::replace(&mut self.state, BodyState::Done) {
            let Reading {
                ex,
                keep_alive,
                release,
                ..
            } = *r;
            finish(ex, keep_alive, release);
        }
    }
}

/// An origin connection after a `101 Switching Protocols`: the bytes the
/// origin sent after its head first, then the connection itself.
pub struct Upgraded {
    conn: Conn,
    early: Bytes,
}

impl AsyncRead for Upgraded {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.early.is_empty() {
            let n = this.early.len().min(buf.remaining());
            buf.put_slice(&this.early[..n]);
            this.early.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.conn).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_shutdown(cx)
    }
}

/// Idle connections by origin: one map for `http`, one for `https`, each
/// by authority, newest last (the most recently used connection is reused
/// first, so the oldest ones age out).
struct Pool {
    idle: Mutex<[HashMap<Box<str>, Vec<Idle>>; 2]>,
    max_idle: usize,
    idle_timeout: Duration,
    /// The task that closes connections idle too long has been started.
    reaping: AtomicBool,
}

struct Idle {
    conn: Conn,
    /// Its origin address (`OriginBody::origin_addr`), if recorded.
    origin: Option<IpAddr>,
    since: Instant,
    /// In [`IDLE_OPEN`] until taken out of the pool or closed.
    _counted: crate::util::Counted<'static>,
}

/// Idle upstream connections held by every pool of the process: each is
/// a descriptor, which admission counts (`proxy::admission`).
static IDLE_OPEN: AtomicUsize = AtomicUsize::new(0);

/// Idle upstream connections held now, in every pool of the process.
pub fn idle_connections() -> usize {
    IDLE_OPEN.load(Ordering::Relaxed)
}

impl Pool {
    /// An idle connection to the origin, if one is left that the origin
    /// has not closed meanwhile. The check (maybe a system call) and the
    /// closing of dead connections happen outside the lock.
    /// With it, the origin address it was put back with. For a `pinned`
    /// request, only a connection to that address (one the pool knows the
    /// address of).
    fn take(&self, https: bool, authority: &str, pinned: Option<SocketAddr>) -> Option<(Conn, Option<IpAddr>)> {
        loop {
            let idle = {
                let mut maps = self.idle.lock().ok()?;
                let list = maps[usize::from(https)].get_mut(authority)?;
                match pinned {
                    None => list.pop()?,
                    Some(addr) => {
                        let i = list.iter().rposition(|i| i.origin == Some(addr.ip()))?;
                        list.remove(i)
                    }
                }
            };
            if idle.since.elapsed() < self.idle_timeout && still_open(&idle.conn) {
                return Some((idle.conn, idle.origin));
            }
        }
    }

    fn put(self: &Arc<Self>, https: bool, authority: &str, conn: Conn, origin: Option<IpAddr>) {
        if self.max_idle == 0 {
            return;
        }
        let dropped = {
            let Ok(mut maps) = self.idle.lock() else { return };
            let map = &mut maps[usize::from(https)];
            let list = match map.get_mut(authority) {
                Some(list) => list,
                None => map.entry(authority.into()).or_default(),
            };
            let dropped = (list.len() >= self.max_idle).then(|| list.remove(0));
            list.push(Idle {
                conn,
                origin,
                since: Instant::now(),
                _counted: crate::util::Counted::new(&IDLE_OPEN),
            });
            dropped
        };
        drop(dropped);
        if !self.reaping.swap(true, Ordering::Relaxed) {
            self.start_reaper();
        }
    }

    /// Closes the connections idle longer than `idle_timeout`, every half
    /// of it, for as long as the pool exists (a reload replaces it).
    fn start_reaper(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool: Weak<Pool> = Arc::downgrade(self);
        let every = (self.idle_timeout / 2).max(Duration::from_millis(100));
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = pool.upgrade() else { return };
                pool.reap();
            }
        });
    }

    fn reap(&self) {
        let mut closed = Vec::new();
        if let Ok(mut maps) = self.idle.lock() {
            for map in maps.iter_mut() {
                map.retain(|_, list| {
                    let (keep, old): (Vec<Idle>, Vec<Idle>) =
                        list.drain(..).partition(|i| i.since.elapsed() < self.idle_timeout);
                    *list = keep;
                    closed.extend(old);
                    !list.is_empty()
                });
            }
        }
        drop(closed);
    }

    /// Idle connections held now (for tests).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map_or(0, |maps| maps.iter().flat_map(|m| m.values()).map(Vec::len).sum())
    }
}

/// Whether an idle connection is still open: the origin neither closed it
/// nor sent anything (which would be no answer to anything). Free when the
/// socket has had no event since it was last read; otherwise one
/// non-blocking read tells.
fn still_open(conn: &Conn) -> bool {
    let tcp = conn.tcp();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match tcp.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => {
            let mut probe = [0u8; 1];
            matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parts(method: Method, uri: &str, fields: &[(&'static str, &'static str)]) -> http::request::Parts {
        let mut req = Request::builder().method(method).uri(uri);
        for (n, v) in fields {
            req = req.header(*n, HeaderValue::from_static(v));
        }
        req.body(()).expect("request").into_parts().0
    }

    #[test]
    fn the_request_line_is_in_origin_form_for_an_origin() {
        let p = parts(
            Method::GET,
            "http://o.test:8080/a/b?q=1",
            &[("host", "o.test:8080"), ("x-a", "1")],
        );
        assert_eq!(
            &request_head(&p, false)[..],
            b"GET /a/b?q=1 HTTP/1.1\r\nhost: o.test:8080\r\nx-a: 1\r\n\r\n"
        );
    }

    #[test]
    fn the_request_line_is_in_absolute_form_for_a_parent_proxy() {
        let p = parts(Method::GET, "http://o.test/a?q", &[("host", "o.test")]);
        assert_eq!(
            &request_head(&p, true)[..],
            b"GET http://o.test/a?q HTTP/1.1\r\nhost: o.test\r\n\r\n"
        );
    }

    #[test]
    fn options_asterisk_is_sent_as_an_asterisk_to_an_origin() {
        // As proxy::forward's asterisk_form builds it.
        let mut uri = http::Uri::from_static("http://o.test/").into_parts();
        uri.path_and_query = Some(http::uri::PathAndQuery::from_static("*"));
        let mut p = parts(Method::OPTIONS, "http://o.test/", &[]);
        p.uri = http::Uri::from_parts(uri).expect("uri");
        assert!(request_head(&p, false).starts_with(b"OPTIONS * HTTP/1.1\r\n"));
        // A parent proxy gets the absolute form, which has no asterisk.
        assert!(request_head(&p, true).starts_with(b"OPTIONS http://o.test/ HTTP/1.1\r\n"));
    }

    #[test]
    fn idempotent_methods_are_the_ones_rfc_9110_names() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(is_idempotent(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!is_idempotent(&m), "{m}");
        }
    }

    #[test]
    fn a_chunked_request_body_is_framed_and_ends_with_the_last_chunk() {
        let (body, _tx) = ProxyBody::channel(None);
        let mut s = Sending::new(Bytes::from_static(b"H"), body, true);
        s.queue(Frame::data(Bytes::from_static(b"hello")));
        s.queue(Frame::data(Bytes::new()));
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("1"));
        s.queue(Frame::trailers(trailers));
        s.end_body();
        let all: Vec<u8> = s.pending.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(&all[..], b"H5\r\nhello\r\n0\r\nx-sum: 1\r\n\r\n");
        assert_eq!(s.pending_len, all.len());
    }

    /// An empty pool keeping `max_idle` connections per origin for `idle_timeout`.
    fn test_pool(max_idle: usize, idle_timeout: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            idle: Mutex::new([HashMap::new(), HashMap::new()]),
            max_idle,
            idle_timeout,
            reaping: AtomicBool::new(false),
        })
    }

    #[tokio::test]
    async fn a_pinned_request_takes_only_a_connection_to_its_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let pool = test_pool(4, Duration::from_secs(60));
        let mut kept = Vec::new();
        for origin in [Some(addr.ip()), None, Some("192.0.2.9".parse().expect("ip"))] {
            let conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
            kept.push(listener.accept().await.expect("accept"));
            pool.put(false, "o.test", Conn::Plain(conn), origin);
        }
        let elsewhere: SocketAddr = "192.0.2.7:80".parse().expect("addr");
        assert!(pool.take(false, "o.test", Some(elsewhere)).is_none());
        let (_, origin) = pool.take(false, "o.test", Some(addr)).expect("the one to its address");
        assert_eq!(origin, Some(addr.ip()));
        assert!(
            pool.take(false, "o.test", Some(addr)).is_none(),
            "the other two go elsewhere, or nobody knows where"
        );
        // An unpinned request takes any: the newest first.
        assert_eq!(
            pool.take(false, "o.test", None).expect("one").1,
            Some("192.0.2.9".parse().expect("ip"))
        );
    }

    #[tokio::test]
    async fn a_pooled_connection_the_origin_closed_is_not_handed_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let pool = test_pool(4, Duration::from_secs(60));
        let open = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (kept, _) = listener.accept().await.expect("accept");
        let closing = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (gone, _) = listener.accept().await.expect("accept");
        pool.put(false, "o.test", Conn::Plain(open), None);
        pool.put(false, "o.test", Conn::Plain(closing), None);
        drop(gone);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The newest (closed by its peer) is skipped, the other handed out.
        assert!(pool.take(false, "o.test", None).is_some());
        assert_eq!(pool.idle_count(), 0);
        assert!(pool.take(false, "o.test", None).is_none());
        assert!(pool.take(true, "o.test", None).is_none(), "https and http are apart");
        drop(kept);
    }

    #[tokio::test]
    async fn the_pool_keeps_at_most_max_idle_per_origin_and_drops_them_after_the_idle_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let pool = test_pool(2, Duration::from_millis(300));
        let mut peers = Vec::new();
        for _ in 0..3 {
            let c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            peers.push(listener.accept().await.expect("accept").0);
            pool.put(false, "o.test", Conn::Plain(c), None);
        }
        assert_eq!(pool.idle_count(), 2);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(pool.idle_count(), 0, "the reaper closed them");
        // Their peers see the close.
        let mut buf = [0u8; 1];
        for p in &peers[1..] {
            p.readable().await.expect("readable");
            assert_eq!(p.try_read(&mut buf).expect("eof"), 0);
        }
    }
}
