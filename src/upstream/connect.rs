//! Opening connections to origin servers: DNS (hickory, cached), TCP with a
//! connect timeout, and TLS (rustls) for `https` origins. Used by the pooled
//! HTTP client and by CONNECT tunnels.

use crate::stats::Histogram;
use hickory_resolver::TokioResolver;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Why a connection to an origin could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectErrorKind {
    /// The name did not resolve.
    Dns,
    /// The connection was refused or failed.
    Refused,
    /// Resolving and connecting took longer than `origin.connect_timeout`.
    Timeout,
    /// The TLS handshake failed (bad certificate, protocol mismatch).
    Tls,
}

/// A failed connection attempt, with what was tried.
#[derive(Debug)]
pub struct ConnectError {
    /// What went wrong.
    pub kind: ConnectErrorKind,
    /// `host:port` that was tried.
    pub target: String,
    /// Details from the resolver, socket or TLS library.
    pub detail: String,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            ConnectErrorKind::Dns => "cannot resolve",
            ConnectErrorKind::Refused => "cannot connect to",
            ConnectErrorKind::Timeout => "timed out connecting to",
            ConnectErrorKind::Tls => "TLS handshake failed with",
        };
        write!(f, "{what} {}: {}", self.target, self.detail)
    }
}

impl std::error::Error for ConnectError {}

/// An origin connection: plain TCP or TLS over TCP.
pub enum Conn {
    /// `http://`
    Plain(TcpStream),
    /// `https://`
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Counters of the upstream side (relaxed atomics; histograms lock-free).
#[derive(Default)]
pub struct UpstreamStats {
    /// Requests sent.
    pub requests: AtomicU64,
    /// Response heads received.
    pub responses: AtomicU64,
    /// Connections opened.
    pub connects: AtomicU64,
    /// Connect failures: DNS.
    pub dns_errors: AtomicU64,
    /// Connect failures: refused or unreachable.
    pub connect_errors: AtomicU64,
    /// Connect failures: timeout.
    pub connect_timeouts: AtomicU64,
    /// Connect failures: TLS.
    pub tls_errors: AtomicU64,
    /// No response head in time.
    pub response_timeouts: AtomicU64,
    /// Other failures before a response head.
    pub other_errors: AtomicU64,
    /// Time to open a connection.
    pub connect_time: Histogram,
    /// Time to the response head (a new connection's connect included).
    pub first_byte_time: Histogram,
    /// Names looked up (IP literals excluded).
    pub dns_lookups: AtomicU64,
    /// Answered from the DNS cache.
    pub dns_hits: AtomicU64,
    /// Lookups that failed.
    pub dns_failures: AtomicU64,
}

impl UpstreamStats {
    /// Counts a connect failure by kind.
    pub fn connect_failed(&self, kind: ConnectErrorKind) {
        let c = match kind {
            ConnectErrorKind::Dns => &self.dns_errors,
            ConnectErrorKind::Refused => &self.connect_errors,
            ConnectErrorKind::Timeout => &self.connect_timeouts,
            ConnectErrorKind::Tls => &self.tls_errors,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Resolved origin names, kept for their DNS lifetime. Consulted only when
/// a new connection is opened (pooled connections skip it), so a mutex is
/// no cost on the request path; it exists to be counted (entries, hit
/// ratio: the seed's HostDNSCacheInfo), which hickory's own cache is not.
pub struct DnsCache {
    max: usize,
    map: Mutex<HashMap<String, (Vec<IpAddr>, std::time::Instant)>>,
}

impl DnsCache {
    fn get(&self, name: &str) -> Option<Vec<IpAddr>> {
        let map = self.map.lock().ok()?;
        let (ips, until) = map.get(name)?;
        (std::time::Instant::now() < *until).then(|| ips.clone())
    }

    fn put(&self, name: &str, ips: Vec<IpAddr>, until: std::time::Instant) {
        if self.max == 0 {
            return;
        }
        let Ok(mut map) = self.map.lock() else { return };
        if map.len() >= self.max && !map.contains_key(name) {
            // Full: drop expired names, else the one expiring soonest.
            let now = std::time::Instant::now();
            map.retain(|_, (_, u)| *u > now);
            if map.len() >= self.max
                && let Some(k) = map.iter().min_by_key(|(_, (_, u))| *u).map(|(k, _)| k.clone())
            {
                map.remove(&k);
            }
        }
        map.insert(name.to_string(), (ips, until));
    }

    /// Names cached now (expired ones included until replaced).
    pub fn len(&self) -> usize {
        self.map.lock().map_or(0, |m| m.len())
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most names kept.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// Resolves and connects; cheap to clone (shared resolver and TLS config).
#[derive(Clone)]
pub struct Connector {
    resolver: Option<Arc<TokioResolver>>,
    tls: TlsConnector,
    connect_timeout: Duration,
    /// Counters, shared with the pooled client.
    pub stats: Arc<UpstreamStats>,
    /// The DNS cache.
    pub dns: Arc<DnsCache>,
}

impl Connector {
    /// A connector with the system resolver (if one is configured) and the given TLS trust.
    pub fn new(tls: Arc<rustls::ClientConfig>, connect_timeout: Duration, dns_cache_entries: usize) -> Self {
        let resolver = match TokioResolver::builder_tokio() {
            Ok(b) => b.build().ok(),
            Err(e) => {
                tracing::warn!(
                    "no system DNS configuration ({e}); only IP addresses and /etc/hosts names will resolve"
                );
                None
            }
        }
        .or_else(|| {
            TokioResolver::builder_with_config(Default::default(), TokioRuntimeProvider::default())
                .build()
                .ok()
        })
        .map(Arc::new);
        Connector {
            resolver,
            tls: TlsConnector::from(tls),
            connect_timeout,
            stats: Arc::default(),
            dns: Arc::new(DnsCache {
                max: dns_cache_entries,
                map: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Resolves `host` (a name, an IPv4 address or a bracketed IPv6 address).
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ConnectError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let err = |detail: String| ConnectError {
            kind: ConnectErrorKind::Dns,
            target: format!("{host}:{port}"),
            detail,
        };
        self.stats.dns_lookups.fetch_add(1, Ordering::Relaxed);
        if let Some(ips) = self.dns.get(bare) {
            self.stats.dns_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect());
        }
        let failed = |e: ConnectError| {
            self.stats.dns_failures.fetch_add(1, Ordering::Relaxed);
            e
        };
        let resolver = self
            .resolver
            .as_ref()
            .ok_or_else(|| failed(err("no resolver configured".into())))?;
        let lookup = resolver.lookup_ip(bare).await.map_err(|e| failed(err(e.to_string())))?;
        let ips: Vec<IpAddr> = lookup.iter().collect();
        if ips.is_empty() {
            return Err(failed(err("no addresses".into())));
        }
        self.dns.put(bare, ips.clone(), lookup.valid_until());
        Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect())
    }

    /// Opens a TCP connection to `host:port`, trying each resolved address in
    /// turn, all within the connect timeout.
    pub async fn tcp(&self, host: &str, port: u16) -> Result<TcpStream, ConnectError> {
        let target = format!("{host}:{port}");
        let attempt = async {
            let addrs = self.resolve(host, port).await?;
            let mut last = String::new();
            for addr in addrs {
                match TcpStream::connect(addr).await {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(s);
                    }
                    Err(e) => last = format!("{addr}: {e}"),
                }
            }
            Err(ConnectError {
                kind: ConnectErrorKind::Refused,
                target: target.clone(),
                detail: last,
            })
        };
        match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError {
                kind: ConnectErrorKind::Timeout,
                target,
                detail: format!(
                    "no connection within {}",
                    humantime::format_duration(self.connect_timeout)
                ),
            }),
        }
    }

    /// Opens a connection for `uri` (scheme http or https), counted and
    /// timed (into the request's upstream-connect stage when it runs on the
    /// request's task).
    pub async fn open(&self, uri: &http::Uri) -> Result<Conn, ConnectError> {
        let started = std::time::Instant::now();
        let result = self.open_uncounted(uri).await;
        let spent = started.elapsed();
        match &result {
            Ok(_) => {
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                self.stats.connect_time.record(spent);
            }
            Err(e) => self.stats.connect_failed(e.kind),
        }
        crate::stats::nested(crate::stats::Stage::UpstreamConnect, spent);
        result
    }

    async fn open_uncounted(&self, uri: &http::Uri) -> Result<Conn, ConnectError> {
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let host = uri.host().unwrap_or("");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = self.tcp(host, port).await?;
        if !https {
            return Ok(Conn::Plain(tcp));
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let tls_err = |detail: String| ConnectError {
            kind: ConnectErrorKind::Tls,
            target: format!("{host}:{port}"),
            detail,
        };
        let name = ServerName::try_from(bare.to_string()).map_err(|e| tls_err(e.to_string()))?;
        let handshake = self.tls.connect(name, tcp);
        match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(Ok(s)) => Ok(Conn::Tls(Box::new(s))),
            Ok(Err(e)) => Err(tls_err(e.to_string())),
            Err(_) => Err(ConnectError {
                kind: ConnectErrorKind::Timeout,
                target: format!("{host}:{port}"),
                detail: "TLS handshake took too long".into(),
            }),
        }
    }
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Conn>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.open(&uri).await.map(TokioIo::new) })
    }
}

/// The TLS client configuration for origins: system roots (if enabled) plus
/// the certificates in `ca_file`.
pub fn tls_config(system_roots: bool, ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if system_roots {
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            let _ = roots.add(cert);
        }
    }
    if let Some(path) = ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("cannot read origin.ca_file {}: {e}", path.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("bad certificate in origin.ca_file {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("origin.ca_file {} holds no certificate", path.display()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("bad certificate in origin.ca_file {}: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
