//! One client connection: wait (holding no buffer) for a request, read its
//! head, hand the exchange to the handler, then keep the connection for the
//! next request or close it. A connection idle past `keepalive.park_after`
//! is returned to the caller instead, for the keep-alive poller.

use super::body::BodyReader;
use super::head::{HeadError, HeadLimits, RequestHead, take_request};
use super::io::{ClientStream, read_buf};
use super::response::ResponseWriter;
use crate::keepalive::KeepAlive;
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Connection-level settings, fixed per listener.
#[derive(Debug, Clone)]
pub struct ConnSettings {
    /// Head size limits.
    pub limits: HeadLimits,
    /// Time allowed to receive a whole head once its first byte is in.
    pub header_timeout: Duration,
    /// The keep-alive subsystem: idle connections, their timeout, counters.
    pub keepalive: Arc<KeepAlive>,
    /// Requests per connection; 0 = unlimited.
    pub max_requests: u32,
    /// Largest request body; 0 = unlimited.
    pub max_body: u64,
    /// Longest silence while a request body is arriving.
    pub body_idle_timeout: Duration,
    /// Longest time the client may accept no response bytes.
    pub send_timeout: Duration,
    /// HTTP/2 on this listener (ALPN `h2`, or h2c); None: HTTP/1 only.
    pub h2: Option<super::h2::H2Settings>,
}

/// Everything the handler gets for one request.
pub struct Exchange<'a> {
    /// The parsed request head.
    pub head: RequestHead,
    /// The request body, read on demand.
    pub body: BodyReader<'a>,
    /// Where the response goes.
    pub out: ResponseWriter<'a>,
    /// The client connection itself, for CONNECT tunnels; None for an
    /// HTTP/2 stream (the connection carries other streams: its tunnel
    /// and its client's departure go through the stream, `out`/`body`).
    pub stream: Option<&'a ClientStream>,
    /// The client's address.
    pub peer: SocketAddr,
    /// The local address the client connected to.
    pub local: LocalAddr<'a>,
    /// What the cache did for the request (HIT, MISS, ...), noted by the
    /// handler for its access-log line; this layer never reads it.
    pub cache_result: Option<&'static str>,
    /// Where the response came from, as the Squid log's hierarchy field
    /// (`HIER_DIRECT/host`, `FIRST_PARENT/host`, ...), noted by the handler
    /// when it contacted an upstream; this layer never reads it.
    pub hierarchy: Option<String>,
    /// The authenticated user (`[auth]`), noted by the handler for the
    /// access log and the access-control step; this layer never reads it.
    pub user: Option<std::sync::Arc<crate::auth::User>>,
    /// What the connection keeps for the handler from one request to the
    /// next (an HTTP/2 stream: from nothing); this layer reads only the
    /// place of the client's bandwidth bucket in it.
    pub memory: &'a mut ConnMemory,
}

/// What the handler (and, for its response writer, this layer) keeps on
/// a connection between its requests.
#[derive(Default)]
pub struct ConnMemory {
    /// The last credentials accepted on the connection (`[auth]`).
    pub auth: Option<crate::auth::Memo>,
    /// Where the client's `limits.client_request_rate` bucket is in the
    /// table the worker processes share.
    pub request_rate: crate::shared_buckets::KnownPlace,
    /// Where its `limits.client_bandwidth` bucket is: this layer keeps it
    /// from one response's writes to the next's.
    bandwidth: crate::shared_buckets::KnownPlace,
}

/// What the handler did with the connection.
pub enum Outcome {
    /// A response was sent; the connection may be reused if it allows.
    Done,
    /// The connection was taken over (tunnel) or must be closed.
    Close,
}

/// Serves requests; implemented by the proxy.
pub trait Handler: Send + Sync + 'static {
    /// Serves one request.
    fn handle(&self, ex: &mut Exchange<'_>) -> impl std::future::Future<Output = Outcome> + Send;
    /// Called for a request head that could not be parsed: answer it.
    fn reject(&self, ex: RejectInfo<'_>) -> impl std::future::Future<Output = ()> + Send;
    /// Whether each request runs inside a statistics timer scope
    /// ([`crate::stats::scope`]); asked once per request.
    fn timed(&self) -> bool {
        false
    }
    /// True when the listener speaks another protocol than HTTP on its
    /// connections (a SOCKS listener): the accept loop then hands each
    /// connection whole to [`Handler::serve_connection`] instead of reading
    /// HTTP requests from it.
    fn takes_connections(&self) -> bool {
        false
    }
    /// Serves a whole connection when [`Handler::takes_connections`] says so.
    fn serve_connection(&self, stream: ClientStream, peer: SocketAddr) -> impl std::future::Future<Output = ()> + Send {
        let _ = (stream, peer);
        async {}
    }
}

impl Exchange<'_> {
    /// Completes when the client has gone away: closed its connection
    /// (HTTP/1), or reset the request's stream (HTTP/2).
    pub async fn client_gone(&mut self) {
        self.out.client_gone(None::<std::future::Ready<()>>).await
    }
}

/// The local address a client connected to, read from the socket
/// (`getsockname`) only when first asked: only monitoring and PAC requests
/// in absolute form or on transparent listeners need it, so most
/// connections never make that system call. Likewise where the client was
/// connecting before the kernel's NAT redirected it here, if it was.
pub struct LocalAddr<'a> {
    socket: Option<&'a tokio::net::TcpStream>,
    addr: std::sync::OnceLock<SocketAddr>,
    redirected: std::sync::OnceLock<Option<SocketAddr>>,
}

impl<'a> LocalAddr<'a> {
    /// The address of `socket`, read when first asked.
    pub fn of(socket: &'a tokio::net::TcpStream) -> LocalAddr<'a> {
        LocalAddr {
            socket: Some(socket),
            addr: std::sync::OnceLock::new(),
            redirected: std::sync::OnceLock::new(),
        }
    }

    /// An address known already, of a connection not redirected.
    pub fn known(addr: SocketAddr) -> LocalAddr<'static> {
        LocalAddr::known_redirected(addr, None)
    }

    /// An address known already, and where the connection was redirected
    /// from ([`original_destination`]).
    pub fn known_redirected(addr: SocketAddr, redirected: Option<SocketAddr>) -> LocalAddr<'static> {
        LocalAddr {
            socket: None,
            addr: std::sync::OnceLock::from(addr),
            redirected: std::sync::OnceLock::from(redirected),
        }
    }

    /// Where the client was connecting when the kernel's NAT redirected
    /// its connection here ([`original_destination`]); None if it was not.
    pub fn redirected_from(&self) -> Option<SocketAddr> {
        *self
            .redirected
            .get_or_init(|| self.socket.and_then(original_destination))
    }

    /// The address (`0.0.0.0:0` when the socket cannot say: it names no
    /// listener, so nothing is taken for Portico's own).
    pub fn get(&self) -> SocketAddr {
        *self.addr.get_or_init(|| {
            self.socket
                .and_then(|s| s.local_addr().ok())
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)))
        })
    }
}

/// Where the client of `socket` was connecting before the kernel's NAT
/// (an iptables or nftables `REDIRECT` or `DNAT` rule) redirected it here
/// (`SO_ORIGINAL_DST`, `IP6T_SO_ORIGINAL_DST`); None when it was not
/// redirected (the address is the socket's own, or the kernel keeps no
/// record of the connection).
pub fn original_destination(socket: &tokio::net::TcpStream) -> Option<SocketAddr> {
    let local = socket.local_addr().ok()?;
    let original = match local.ip().to_canonical() {
        std::net::IpAddr::V4(_) => SocketAddr::V4(rustix::net::sockopt::ip_original_dst(socket).ok()?),
        std::net::IpAddr::V6(_) => SocketAddr::V6(rustix::net::sockopt::ipv6_original_dst(socket).ok()?),
    };
    let same = original.ip().to_canonical() == local.ip().to_canonical() && original.port() == local.port();
    (!same).then_some(original)
}

/// A request that was rejected before it could be parsed.
pub struct RejectInfo<'a> {
    /// Why.
    pub error: HeadError,
    /// Where to write the error response.
    pub out: ResponseWriter<'a>,
    /// The client's address.
    pub peer: SocketAddr,
    /// The first line of what the client sent, for the log (lossy, truncated).
    pub first_line: String,
}

/// Where a connection's task starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Start {
    /// Requests served on the connection before (by earlier tasks).
    pub served: u32,
    /// The client has sent bytes already: read the request at once.
    pub ready: bool,
    /// How long to wait for a request before parking, when the poller has
    /// chosen one for this connection (None: `keepalive.park_after`).
    pub park_after: Option<Duration>,
}

/// A connection that stayed idle past `keepalive.park_after`, handed back
/// to the caller (for the keep-alive poller) with its task about to end.
#[derive(Debug)]
pub struct GoneIdle {
    /// The socket, taken off the runtime.
    pub stream: std::net::TcpStream,
    /// Requests served on it so far.
    pub served: u32,
    /// When it is to be closed if the client stays silent.
    pub deadline: std::time::Instant,
    /// How long it waited in its task before this.
    pub waited: Duration,
}

/// The first read of a request head takes a buffer of this size, as nginx's
/// `client_header_buffer_size` does (1k): most heads fit, a request holds 1
/// KiB rather than 4 while its header values (slices of this buffer) live,
/// and a buffer this small comes from glibc's per-thread cache (chunks up
/// to 1,032 bytes) instead of its bins.
const FIRST_READ: usize = 1 << 10;

/// Heads larger than the first read grow the buffer by up to this much per
/// read.
const HEAD_CHUNK: usize = 4 << 10;

/// Serves one client connection until it closes (None) or stays idle long
/// enough to be handed to the keep-alive poller (the connection is returned).
pub async fn serve<H: Handler>(
    stream: ClientStream,
    peer: SocketAddr,
    start: Start,
    settings: &ConnSettings,
    handler: &H,
) -> Option<GoneIdle> {
    let ka = &*settings.keepalive;
    // A TLS connection stays in its task while idle: the poller holds
    // bare descriptors, and a TLS connection is also rustls's state
    // (keys, sequence numbers, buffered records); see docs/ARCHITECTURE.md.
    let park_after = if stream.is_tls() {
        None
    } else {
        ka.poller().map(|p| start.park_after.unwrap_or(p.park_after()))
    };
    let mut carry: Option<BytesMut> = None;
    let mut memory = ConnMemory::default();
    // The last request asked to close and left nothing unread (serve_one).
    let mut clean_end = false;
    let mut served = start.served;
    let mut ready = start.ready;
    loop {
        if carry.is_none() && !std::mem::take(&mut ready) {
            // Idle: hold no buffer until the client sends something, and
            // past `park_after` not even a task. A drain (SIGTERM) closes
            // idle connections at once.
            let full = if served == 0 {
                settings.header_timeout
            } else {
                ka.timeout()
            };
            let wait = park_after.filter(|p| *p < full).unwrap_or(full);
            let bytes = if served == 0 {
                let drained = crate::drain::started(usize::from(peer.port()));
                tokio::select! {
                    biased;
                    r = tokio::time::timeout(wait, bytes_waiting(&stream)) => r,
                    () = drained => Ok(None),
                }
            } else {
                // Between requests the connection is in the keep-alive set,
                // which may close it (flush) to make room for a newer one,
                // and closes it when draining starts: no wait on the drain
                // of its own (a registration with a `Notify`, about 330
                // instructions per request). The guard leaves the set before
                // the socket is closed.
                let _idle = ka.enter(stream.tcp());
                if crate::drain::is_draining() {
                    Ok(None)
                } else {
                    tokio::time::timeout(wait, bytes_waiting(&stream)).await
                }
            };
            match bytes {
                Ok(Some(first)) => carry = (!first.is_empty()).then_some(first),
                Ok(None) => break,
                Err(_) if wait < full => {
                    let ClientStream::Plain(stream) = stream else {
                        // Never: `park_after` is None for TLS.
                        return None;
                    };
                    let stream = stream.into_std().ok()?;
                    // Read the clock only here, not on every idle wait:
                    // `wait` has just passed, so `full - wait` is left.
                    return Some(GoneIdle {
                        stream,
                        served,
                        deadline: std::time::Instant::now() + (full - wait),
                        waited: wait,
                    });
                }
                Err(_) if served == 0 => {
                    ka.header_timed_out();
                    break;
                }
                Err(_) => {
                    ka.timed_out();
                    break;
                }
            }
        }
        let buf = carry.take().unwrap_or_default();
        clean_end = false;
        // Boxed so an idle connection's task holds only this small loop,
        // and written in place: a request's future is about 11 KiB (a
        // miss's fetch is not boxed apart: see `Transaction::miss`). A new
        // box per request, not one kept for the connection's next request
        // (4d1f77b): that saved a malloc and free (about 4% of a keep-alive
        // hit's instructions under callgrind) but left every connection
        // holding 11 KiB that had left the CPU's caches by its next
        // request, and hits lost 4-10% of their throughput with 64
        // connections and 14% with 1,000 (bench/README.md); a box freed at
        // the end of a request is what the next one's malloc takes back
        // while it is still cached.
        let one = crate::util::box_in_place(|| {
            serve_one(
                &stream,
                buf,
                &mut clean_end,
                &mut memory,
                peer,
                served,
                settings,
                handler,
            )
        });
        // The statistics timer wraps the box, so only a pointer moves (not
        // the request's whole future, as wrapping it inside the handler would).
        let next = if handler.timed() {
            crate::stats::scope(one).await
        } else {
            one.await
        };
        match next {
            Some(rest) => {
                served += 1;
                if settings.max_requests > 0 && served >= settings.max_requests {
                    break;
                }
                carry = (!rest.is_empty()).then_some(rest);
            }
            None => break,
        }
    }
    if clean_end && nothing_unread(&stream) {
        // The client said it would send nothing more, and has not: a
        // plain close (FIN after the response) cannot reset anything, so
        // no lingering (a shutdown, a timer and a read or two saved per
        // `Connection: close` request, as nginx's `lingering_close on`
        // saves them). Over TLS the close_notify goes first (it usually
        // left with the response already).
        if let ClientStream::Tls(t) = &stream {
            t.send_close_notify();
        }
        return None;
    }
    // Boxed: its read buffer must not enlarge every idle connection's task.
    Box::pin(lingering_close(&stream)).await;
    None
}

/// True when the connection has no input waiting in the kernel (or only
/// the client's FIN), and over TLS none decrypted and unread either:
/// closing it then sends no reset. A TLS client's close_notify that comes
/// after the close meets a reset, as it does at nginx, which does not wait
/// for it either: a client sends it once it has read what it wanted (one
/// that closes its side early has sent it before the response, and it is
/// waiting here: the connection then lingers).
///
/// The socket is peeked only while it is marked readable. The read that
/// took the request cleared that mark if it emptied the socket
/// (`io::try_read_drained`), and input that came after it sets the mark
/// again as soon as the reactor has seen its event, which it has for input
/// that came while the response waited to be written. So a `Connection:
/// close` request answered at once saves the peek, as nginx decides from
/// its `read->ready` without a system call; input that comes during the
/// last microseconds before the close, which neither sees, can only come
/// from a client that sent more after asking to close.
fn nothing_unread(stream: &ClientStream) -> bool {
    let tcp = match stream {
        ClientStream::Plain(tcp) => tcp,
        ClientStream::Tls(t) if t.nothing_buffered() => t.tcp(),
        ClientStream::Tls(_) => return false,
    };
    let mut one = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    match tcp.try_io(tokio::io::Interest::READABLE, || {
        socket2::SockRef::from(tcp).peek(&mut one)
    }) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    }
}

/// Waits until the client has sent something (Some) or closed (None),
/// holding no buffer while it waits. On plain TCP the bytes are read at
/// once into a buffer taken only when the socket is readable (and dropped
/// again when the readiness was spurious, as tokio says it can be): one
/// `recv` per request, where a peek to confirm the readiness and then the
/// read cost two. Over TLS the records are read by `read_head` (Some of an
/// empty buffer), after a peek.
async fn bytes_waiting(stream: &ClientStream) -> Option<BytesMut> {
    let stream = match stream {
        ClientStream::Plain(s) => loop {
            s.readable().await.ok()?;
            let mut buf = BytesMut::with_capacity(FIRST_READ);
            match super::io::try_read_drained(s, &mut buf) {
                Ok(0) => return None,
                Ok(_) => return Some(buf),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return None,
            }
        },
        // Decrypted bytes already read off the socket (with the end of
        // the handshake, or after the previous request) count too; when
        // there are none, what rustls queued (the session tickets after a
        // handshake) is sent before the wait.
        ClientStream::Tls(t) => match t.plaintext_or_flushed().await {
            Ok(true) => return Some(BytesMut::new()),
            Ok(false) => t.tcp(),
            Err(_) => return None,
        },
    };
    let mut one = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    loop {
        stream.readable().await.ok()?;
        let peeked = stream.try_io(tokio::io::Interest::READABLE, || {
            socket2::SockRef::from(stream).peek(&mut one)
        });
        match peeked {
            Ok(0) => return None,
            Ok(_) => return Some(BytesMut::new()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return None,
        }
    }
}

/// Completes when the client has closed the connection (or it failed),
/// never while the client is still there. Costs nothing until the socket
/// becomes readable. Bytes waiting unread (a pipelined request, the rest
/// of a body) keep it readable, so from then on the kernel is asked
/// whether a hang-up came in behind them ([`hung_up`]).
pub async fn client_closed(stream: &ClientStream) {
    let tcp = match stream {
        ClientStream::Plain(s) => s,
        // Over TLS, bytes waiting may be a close_notify (a client that
        // leaves says so before its TCP close): the records are read to
        // tell, which the plain peek cannot.
        ClientStream::Tls(t) => loop {
            if t.tcp().readable().await.is_err() {
                return;
            }
            match t.closed_now() {
                Ok(true) => return,
                Ok(false) => return hung_up(stream).await,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return,
            }
        },
    };
    let mut one = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    loop {
        if tcp.readable().await.is_err() {
            return;
        }
        let peeked = tcp.try_io(tokio::io::Interest::READABLE, || {
            socket2::SockRef::from(tcp).peek(&mut one)
        });
        match peeked {
            Ok(0) => return,
            Ok(_) => return hung_up(stream).await,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
    }
}

/// How often [`hung_up`] asks the kernel.
const HANG_UP_CHECK: Duration = Duration::from_millis(250);

/// Completes once the client has hung up (its FIN or a reset has come
/// in), also behind bytes no one has read yet: a request body of which
/// the reader took only what it reads ahead of the origin (a few frames)
/// while the request waits for an origin place, or a pipelined request
/// while the one before it waits. Those bytes keep the socket readable, so
/// readiness cannot announce the FIN behind them and a read would take
/// them from their reader; `poll` with POLLRDHUP tells without reading, as
/// nginx's broken-connection check uses EPOLLRDHUP. Asked every
/// [`HANG_UP_CHECK`]: a request waiting in line learns of its client's
/// departure within that, and costs one system call per check.
pub(crate) async fn hung_up(stream: &ClientStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.tcp().as_raw_fd();
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: `p` is a live pollfd for the call's length and the count
        // passed is 1; `fd` is the connection's socket, open for as long
        // as `stream` is borrowed. A zero timeout: the call never blocks.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        // POLLHUP and POLLERR are reported whatever `events` asks. A
        // failed call (EINTR) is asked again at the next check.
        if n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return;
        }
        tokio::time::sleep(HANG_UP_CHECK).await;
    }
}

/// Closes our side, then reads and discards whatever the client still
/// sends for a short while before the socket is dropped. Closing a socket
/// with unread input makes the kernel send a reset, which can destroy the
/// response (an error page for a request whose body we did not read) before
/// the client has read it.
pub(crate) async fn lingering_close(stream: &ClientStream) {
    if let ClientStream::Tls(t) = stream {
        t.send_close_notify();
    }
    let stream = stream.tcp();
    if socket2::SockRef::from(stream)
        .shutdown(std::net::Shutdown::Write)
        .is_err()
    {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut discard = [0u8; 4096];
    let mut total = 0usize;
    while total < (256 << 10) {
        match tokio::time::timeout_at(deadline, stream.readable()).await {
            Ok(Ok(())) => match stream.try_read(&mut discard) {
                Ok(0) => return,
                Ok(n) => total += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            },
            _ => return,
        }
    }
}

/// Serves one request; returns the unread bytes (pipelined requests) when
/// the connection can be reused.
#[allow(clippy::too_many_arguments)]
async fn serve_one<H: Handler>(
    stream: &ClientStream,
    mut buf: BytesMut,
    clean_end: &mut bool,
    memory: &mut ConnMemory,
    peer: SocketAddr,
    served: u32,
    settings: &ConnSettings,
    handler: &H,
) -> Option<BytesMut> {
    let deadline = Instant::now() + settings.header_timeout;
    let head = match read_head(stream, &mut buf, &settings.limits, deadline).await {
        Ok(Some(head)) => head,
        Ok(None) => return None,
        Err(error) => {
            if error.status == http::StatusCode::REQUEST_TIMEOUT {
                settings.keepalive.header_timed_out();
            }
            let first_line = String::from_utf8_lossy(buf[..].split(|&b| b == b'\n').next().unwrap_or(&[]))
                .chars()
                .take(200)
                .collect::<String>()
                .trim_end()
                .to_string();
            let mut out = ResponseWriter::new(stream, http::Version::HTTP_11, &http::Method::GET, false, settings);
            out.close_after();
            handler
                .reject(RejectInfo {
                    error,
                    out,
                    peer,
                    first_line,
                })
                .await;
            return None;
        }
    };
    if served > 0 {
        settings.keepalive.hit();
    }
    let client_closes = !head.keep_alive;
    let last_allowed = settings.max_requests > 0 && served + 1 >= settings.max_requests;
    let keep_alive = head.keep_alive && !last_allowed && settings.keepalive.enabled();
    let mut out = ResponseWriter::new(stream, head.version, &head.method, keep_alive, settings);
    out.limit_bandwidth(peer.ip(), memory.bandwidth);
    if head.expect_continue && head.body != super::head::BodyFraming::Empty {
        out.expect_continue();
    }
    let framing = head.body;
    let body = BodyReader::new(
        stream,
        &mut buf,
        framing,
        settings.max_body,
        settings.limits.max_head,
        settings.body_idle_timeout,
    );
    let mut ex = Exchange {
        head,
        body,
        out,
        stream: Some(stream),
        peer,
        local: LocalAddr::of(stream.tcp()),
        cache_result: None,
        hierarchy: None,
        user: None,
        memory,
    };
    let outcome = handler.handle(&mut ex).await;
    ex.memory.bandwidth = ex.out.known_place();
    let complete = matches!(outcome, Outcome::Done) && ex.out.is_finished();
    if complete && !ex.out.keep_alive() {
        settings.keepalive.refusal();
    }
    if !(complete && ex.out.keep_alive()) {
        // Closing: cleanly, without lingering, when the client asked for
        // it and nothing of its request is left unread.
        let body_done = ex.body.is_done();
        drop(ex);
        *clean_end = complete && client_closes && body_done && buf.is_empty();
        return None;
    }
    // A body the handler did not read must be consumed before the next request.
    if !ex.body.is_done() && !ex.body.drain(64 << 10).await {
        return None;
    }
    drop(ex);
    Some(buf)
}

/// Reads a request head and takes it off `buf`. Errors reading a head:
/// answer with the status, or just close.
async fn read_head(
    stream: &ClientStream,
    buf: &mut BytesMut,
    limits: &HeadLimits,
    deadline: Instant,
) -> Result<Option<RequestHead>, HeadError> {
    let mut scanned = 0;
    loop {
        // Parse only when a new line arrived or a limit may be crossed, so a
        // client trickling bytes cannot make us rescan the head per byte.
        let new_line = buf[scanned..].contains(&b'\n');
        if (new_line || buf.len() > limits.max_request_line || buf.len() > limits.max_head)
            && let Some(parsed) = take_request(buf, limits)?
        {
            return Ok(Some(parsed));
        }
        // `take_request` skips leading empty lines without counting them,
        // so a head that is still incomplete past the limit can only be a run
        // of blank lines: refuse it rather than buffer (and rescan) it forever.
        if buf.len() > limits.max_head {
            return Err(HeadError {
                status: http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                reason: "request head too large",
            });
        }
        scanned = buf.len();
        // A buffer not taken yet (TLS, or after a pipelined request) starts
        // at FIRST_READ too; larger heads grow it.
        let chunk = if buf.capacity() == 0 { FIRST_READ } else { HEAD_CHUNK };
        let want = (limits.max_head + 1).saturating_sub(buf.len()).clamp(1, chunk);
        match tokio::time::timeout_at(deadline, read_buf(stream, buf, want)).await {
            Err(_) if buf.is_empty() => return Ok(None),
            Err(_) => {
                return Err(HeadError {
                    status: http::StatusCode::REQUEST_TIMEOUT,
                    reason: "timed out reading the request head",
                });
            }
            Ok(Err(_)) => return Ok(None),
            Ok(Ok(0)) => {
                if buf.iter().all(|b| *b == b'\r' || *b == b'\n') {
                    return Ok(None);
                }
                return Err(HeadError {
                    status: http::StatusCode::BAD_REQUEST,
                    reason: "connection closed mid-head",
                });
            }
            Ok(Ok(_)) => {}
        }
    }
}
