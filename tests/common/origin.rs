//! Scripted HTTP/1.1 origin server built on hyper, plain or TLS.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, Version};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tempfile::TempDir;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

/// A request as the origin received it (body fully read).
#[derive(Clone, Debug)]
pub struct Request {
    /// Request method.
    pub method: Method,
    /// Request target as sent (usually origin-form, e.g. `/a?b`).
    pub uri: Uri,
    /// HTTP version of the request line.
    pub version: Version,
    /// All request headers.
    pub headers: HeaderMap,
    /// The complete request body.
    pub body: Bytes,
}

impl Request {
    /// First value of header `name` as a string, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// How a [`Response`] body is produced.
#[derive(Clone, Debug)]
pub enum Body {
    /// The whole body at once; sent with `Content-Length`.
    Full(Bytes),
    /// Sent with `Transfer-Encoding: chunked`, one chunk per element (empty
    /// elements are skipped by hyper), then the trailers.
    Chunked {
        /// The chunks, in order.
        chunks: Vec<Bytes>,
        /// Trailer fields sent after the last chunk.
        trailers: Vec<(String, String)>,
    },
    /// `len` bytes of [`pattern_matches`]'s pattern, produced lazily in
    /// 64 KiB pieces (never held in memory); with `Content-Length` unless
    /// `chunked`.
    Generated {
        /// The pattern offset of the first byte (0 for a whole body).
        from: u64,
        /// Total body length in bytes.
        len: u64,
        /// Use chunked encoding instead of `Content-Length`.
        chunked: bool,
    },
}

/// A scripted response. Build with [`Response::new`] / [`Response::ok`] and
/// the chained setters.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers in order; repeated names are sent as repeated fields.
    pub headers: Vec<(String, String)>,
    /// Body source.
    pub body: Body,
    /// Sleep before sending the response head (slow origin).
    pub delay: Duration,
    /// Sleep after each body chunk (slow, trickling origin).
    pub chunk_delay: Duration,
}

impl Response {
    /// A response with `status` and an empty body.
    pub fn new(status: u16) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Full(Bytes::new()),
            delay: Duration::ZERO,
            chunk_delay: Duration::ZERO,
        }
    }

    /// `200` with the given full body.
    pub fn ok(body: impl Into<Bytes>) -> Self {
        Self::new(200).body(body)
    }

    /// Appends a header (call repeatedly for repeated fields).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Full body sent with `Content-Length`.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = Body::Full(body.into());
        self
    }

    /// Chunked body with optional trailers. A `Trailer` header naming the
    /// trailer fields is added unless one is already set (hyper requires it).
    /// Note: hyper only emits trailers when the request carried `TE: trailers`;
    /// use [`super::RawOrigin`] with [`super::chunked_body`]
    /// to send trailers unconditionally.
    pub fn chunked<C: Into<Bytes>>(mut self, chunks: impl IntoIterator<Item = C>, trailers: &[(&str, &str)]) -> Self {
        let trailers: Vec<(String, String)> = trailers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let has_trailer_header = self.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("trailer"));
        if !trailers.is_empty() && !has_trailer_header {
            let names: Vec<&str> = trailers.iter().map(|(k, _)| k.as_str()).collect();
            self = self.header("trailer", &names.join(", "));
        }
        self.body = Body::Chunked {
            chunks: chunks.into_iter().map(Into::into).collect(),
            trailers,
        };
        self
    }

    /// `len` lazily generated pattern bytes with `Content-Length`.
    pub fn generated(mut self, len: u64) -> Self {
        self.body = Body::Generated {
            from: 0,
            len,
            chunked: false,
        };
        self
    }

    /// Bytes `from..from + len` of the generated pattern with
    /// `Content-Length`: a range of a generated body (`pattern_matches(from, ..)`).
    pub fn generated_range(mut self, from: u64, len: u64) -> Self {
        self.body = Body::Generated {
            from,
            len,
            chunked: false,
        };
        self
    }

    /// `len` lazily generated pattern bytes, chunked.
    pub fn generated_chunked(mut self, len: u64) -> Self {
        self.body = Body::Generated {
            from: 0,
            len,
            chunked: true,
        };
        self
    }

    /// Wait this long before sending the response head.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Wait this long after each body chunk.
    pub fn chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay = delay;
        self
    }

    fn into_hyper(self) -> hyper::Response<OriginBody> {
        let mut resp = hyper::Response::new(OriginBody::new(self.body, self.chunk_delay));
        *resp.status_mut() = http::StatusCode::from_u16(self.status)
            .unwrap_or_else(|e| panic!("origin: invalid status {}: {e}", self.status));
        for (k, v) in &self.headers {
            resp.headers_mut().append(header_name(k), header_value(v));
        }
        resp
    }
}

fn header_name(name: &str) -> HeaderName {
    HeaderName::from_bytes(name.as_bytes()).unwrap_or_else(|e| panic!("origin: invalid header name {name:?}: {e}"))
}

fn header_value(value: &str) -> HeaderValue {
    HeaderValue::from_str(value).unwrap_or_else(|e| panic!("origin: invalid header value {value:?}: {e}"))
}

const GEN_CHUNK: usize = 64 * 1024;
const GEN_PERIOD: u64 = 251;

/// One chunk's worth of the pattern plus one period, so any offset can be
/// served as a zero-copy slice.
fn pattern_buf() -> &'static Bytes {
    static BUF: OnceLock<Bytes> = OnceLock::new();
    BUF.get_or_init(|| {
        (0..GEN_CHUNK as u64 + GEN_PERIOD)
            .map(|i| (i % GEN_PERIOD) as u8)
            .collect::<Vec<u8>>()
            .into()
    })
}

/// True if `bytes` equals the generated-body pattern starting at `offset`
/// (byte `i` of a generated body is `i % 251`).
pub fn pattern_matches(offset: u64, bytes: &[u8]) -> bool {
    let buf = pattern_buf();
    let mut pos = offset;
    bytes.chunks(GEN_CHUNK).all(|piece| {
        let start = (pos % GEN_PERIOD) as usize;
        pos += piece.len() as u64;
        piece == &buf[start..start + piece.len()]
    })
}

enum BodyState {
    Full(Option<Bytes>),
    Chunked(VecDeque<Bytes>, Option<HeaderMap>),
    Generated { remaining: u64, offset: u64 },
}

/// The hyper body behind [`Body`].
struct OriginBody {
    state: BodyState,
    exact_len: Option<u64>,
    chunk_delay: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl OriginBody {
    fn new(body: Body, chunk_delay: Duration) -> Self {
        let (state, exact_len) = match body {
            Body::Full(b) => {
                let len = b.len() as u64;
                (BodyState::Full(Some(b).filter(|b| !b.is_empty())), Some(len))
            }
            Body::Chunked { chunks, trailers } => {
                let map = (!trailers.is_empty()).then(|| {
                    trailers
                        .iter()
                        .map(|(k, v)| (header_name(k), header_value(v)))
                        .collect()
                });
                (BodyState::Chunked(chunks.into(), map), None)
            }
            Body::Generated { from, len, chunked } => (
                BodyState::Generated {
                    remaining: len,
                    offset: from,
                },
                (!chunked).then_some(len),
            ),
        };
        OriginBody {
            state,
            exact_len,
            chunk_delay,
            sleep: None,
        }
    }
}

impl http_body::Body for OriginBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(sleep) = &mut this.sleep {
            ready!(sleep.as_mut().poll(cx));
            this.sleep = None;
        }
        let frame = match &mut this.state {
            BodyState::Full(b) => b.take().map(Frame::data),
            BodyState::Chunked(chunks, trailers) => match chunks.pop_front() {
                Some(c) => Some(Frame::data(c)),
                None => trailers.take().map(Frame::trailers),
            },
            BodyState::Generated { remaining, offset } => (*remaining > 0).then(|| {
                let n = (*remaining).min(GEN_CHUNK as u64) as usize;
                let start = (*offset % GEN_PERIOD) as usize;
                *remaining -= n as u64;
                *offset += n as u64;
                Frame::data(pattern_buf().slice(start..start + n))
            }),
        };
        if frame.as_ref().is_some_and(Frame::is_data) && !this.chunk_delay.is_zero() {
            this.sleep = Some(Box::pin(tokio::time::sleep(this.chunk_delay)));
        }
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            BodyState::Full(b) => b.is_none(),
            BodyState::Generated { remaining, .. } => *remaining == 0 && self.exact_len.is_some(),
            BodyState::Chunked(..) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact_len {
            Some(len) => SizeHint::with_exact(len),
            None => SizeHint::default(),
        }
    }
}

type Handler = Arc<dyn Fn(Request) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

struct Shared {
    handler: Handler,
    requests: Mutex<Vec<Request>>,
    connections: AtomicUsize,
}

/// A running scripted origin; stops (and drops its connections) on Drop.
pub struct Origin {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    ca: Option<(TempDir, PathBuf)>,
}

impl Origin {
    /// Starts a plain-HTTP origin answering every request with `handler`.
    ///
    /// ```ignore
    /// let origin = Origin::start(|req| async move { Response::ok(format!("{}", req.uri)) }).await;
    /// ```
    pub async fn start<F, Fut>(handler: F) -> Origin
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        Self::start_inner(handler, None, "127.0.0.1").await
    }

    /// Like [`Origin::start`], listening on another loopback address
    /// (`127.0.0.3`), for tests that tell origins apart by address.
    pub async fn start_at<F, Fut>(ip: &str, handler: F) -> Origin
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        Self::start_inner(handler, None, ip).await
    }

    /// Like [`Origin::start`], listening at `addr` (a loopback address and
    /// a port: another origin's port on another loopback address, so that
    /// one name can move between the two).
    pub async fn start_on<F, Fut>(addr: std::net::SocketAddr, handler: F) -> Origin
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        Self::start_bound(handler, None, addr).await
    }

    /// Like [`Origin::start`] but over TLS, with a fresh self-signed
    /// certificate for `localhost` and `127.0.0.1` (see [`Origin::ca_pem_path`]).
    pub async fn start_tls<F, Fut>(handler: F) -> Origin
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        Self::start_tls_on(loopback, &["localhost", "127.0.0.1"], handler).await
    }

    /// [`Origin::start_tls`] listening at `addr`, its certificate for `names`.
    pub async fn start_tls_on<F, Fut>(addr: std::net::SocketAddr, names: &[&str], handler: F) -> Origin
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let ck = rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("rcgen: generate self-signed certificate");
        let dir = TempDir::new().expect("create temp dir for origin certificate");
        let pem_path = dir.path().join("origin-ca.pem");
        std::fs::write(&pem_path, ck.cert.pem()).expect("write origin certificate PEM");
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("rustls: protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key.into())
            .expect("rustls: server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut origin = Self::start_bound(handler, Some(TlsAcceptor::from(Arc::new(config))), addr).await;
        origin.ca = Some((dir, pem_path));
        origin
    }

    async fn start_inner<F, Fut>(handler: F, tls: Option<TlsAcceptor>, ip: &str) -> Origin
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let ip: std::net::IpAddr = ip.parse().unwrap_or_else(|e| panic!("origin: address {ip}: {e}"));
        Self::start_bound(handler, tls, std::net::SocketAddr::new(ip, 0)).await
    }

    async fn start_bound<F, Fut>(handler: F, tls: Option<TlsAcceptor>, at: std::net::SocketAddr) -> Origin
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let listener = TcpListener::bind(at)
            .await
            .unwrap_or_else(|e| panic!("origin: bind {at}: {e}"));
        let addr = listener.local_addr().expect("origin: local_addr");
        let shared = Arc::new(Shared {
            handler: Arc::new(move |req| Box::pin(handler(req))),
            requests: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
        });
        let is_tls = tls.is_some();
        let task = tokio::spawn(accept_loop(listener, tls, shared.clone()));
        Origin {
            addr,
            tls: is_tls,
            shared,
            task,
            ca: None,
        }
    }

    /// The listening address (127.0.0.1:port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port` or `https://127.0.0.1:port`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().expect("origin lock").clone()
    }

    /// Number of requests received so far.
    pub fn count(&self) -> usize {
        self.shared.requests.lock().expect("origin lock").len()
    }

    /// Number of TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` until at least `n` requests arrived; returns
    /// whether they did (for work the proxy does in the background).
    pub async fn wait_count(&self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.count() < n {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Path of the PEM file holding the TLS origin's certificate, to be
    /// trusted as a CA. Panics for a plain-HTTP origin.
    pub fn ca_pem_path(&self) -> &Path {
        &self
            .ca
            .as_ref()
            .expect("ca_pem_path() called on a plain-HTTP origin (use Origin::start_tls)")
            .1
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, tls: Option<TlsAcceptor>, shared: Arc<Shared>) {
    // Connections live in the set so aborting this task closes them too.
    let mut conns = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while conns.try_join_next().is_some() {}
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let shared = shared.clone();
        let tls = tls.clone();
        conns.spawn(async move {
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve(stream, shared).await;
                    }
                }
                None => serve(stream, shared).await,
            }
        });
    }
}

async fn serve<S>(stream: S, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let shared = shared.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes();
            let req = Request {
                method: parts.method,
                uri: parts.uri,
                version: parts.version,
                headers: parts.headers,
                body,
            };
            shared.requests.lock().expect("origin lock").push(req.clone());
            let resp = (shared.handler)(req).await;
            if !resp.delay.is_zero() {
                tokio::time::sleep(resp.delay).await;
            }
            Ok::<_, hyper::Error>(resp.into_hyper())
        }
    });
    // Errors (client went away, bad request) just end the connection.
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}
