//! Opening connections to origin servers: DNS (hickory, cached), TCP with a
//! connect timeout, and TLS (rustls) for `https` origins. Used by the pooled
//! HTTP client and by CONNECT tunnels. A connector made with
//! [`Connector::via_parent`] dials a parent proxy instead: `http` origins
//! get a plain connection to the parent marked as proxied (so the client
//! sends the request line in absolute form), `https` origins a `CONNECT`
//! tunnel through the parent with TLS to the origin inside it.

use crate::stats::Histogram;
use hickory_resolver::TokioResolver;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use rustls::pki_types::ServerName;
use std::collections::HashMap;
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
    /// The parent proxy was reached but did not open the `CONNECT` tunnel
    /// (it answered with an error status, or not in HTTP). Not the parent's
    /// fault as a server: it is not marked down for this.
    Parent,
    /// The address is one of Portico's own listeners (`listen::is_own_address`):
    /// not connected to, as the request would come back to Portico from
    /// Portico's own address, a forwarding loop and a way around
    /// `access.admin_allow`. Answered 508 (Loop Detected, RFC 5842 7.2).
    Loop,
    /// The address is one clients may not have Portico connect to
    /// (`proxy.deny_destinations`, [`Destinations`]): not connected to,
    /// answered 403 as the access rules' denials are.
    Denied,
}

/// A failed connection attempt, with what was tried.
#[derive(Debug)]
pub struct ConnectError {
    /// What went wrong.
    pub kind: ConnectErrorKind,
    /// `host:port` that was tried.
    pub target: String,
    /// The cause in plain words ("connection refused", "the name does not
    /// exist"): shown on error pages and in the error log. The library's
    /// own error text goes to the error log at debug level only.
    pub detail: String,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kind == ConnectErrorKind::Loop {
            return write!(f, "forwarding loop detected: {} {}", self.target, self.detail);
        }
        if self.kind == ConnectErrorKind::Denied {
            return write!(f, "the destination {} {}", self.target, self.detail);
        }
        if self.kind == ConnectErrorKind::Dns {
            // Only names are resolved: the host is what precedes the last
            // colon (no IPv6 literal gets here).
            let host = self.target.rsplit_once(':').map_or(self.target.as_str(), |(h, _)| h);
            return write!(f, "cannot resolve {host}: {}", self.detail);
        }
        let what = match self.kind {
            ConnectErrorKind::Loop | ConnectErrorKind::Dns | ConnectErrorKind::Denied => "",
            ConnectErrorKind::Refused => "cannot connect to",
            ConnectErrorKind::Timeout => "timed out connecting to",
            ConnectErrorKind::Tls => "TLS handshake failed with",
            ConnectErrorKind::Parent => "the parent proxy did not open a tunnel to",
        };
        write!(f, "{what} {}: {}", self.target, self.detail)
    }
}

impl std::error::Error for ConnectError {}

/// The connection under an origin's TLS or a parent's requests: plain TCP,
/// or TLS to a parent proxy reached over TLS (`https://` in a parent
/// group's `servers`, Squid's `cache_peer ... tls`).
pub enum Wire {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS to a parent proxy.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Wire {
    /// The TCP connection underneath (addresses).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Wire::Tcp(s) => s,
            Wire::Tls(s) => s.get_ref().0,
        }
    }

    /// The connection for a tunnel's relay: TLS records go through the
    /// same record layer as a TLS client's (`http1::tls`), any bytes rustls
    /// has already decrypted included.
    pub fn into_relay(self) -> crate::http1::ClientStream {
        match self {
            Wire::Tcp(s) => crate::http1::ClientStream::Plain(s),
            Wire::Tls(s) => {
                let (tcp, conn) = s.into_inner();
                crate::http1::ClientStream::Tls(Box::new(crate::http1::tls::TlsConn::from_client(tcp, conn)))
            }
        }
    }
}

impl AsyncRead for Wire {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Wire {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_flush(cx),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Wire::Tcp(s) => s.is_write_vectored(),
            Wire::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// An origin connection: plain TCP or TLS over TCP.
pub enum Conn {
    /// `http://`
    Plain(TcpStream),
    /// `https://` (also through a parent's `CONNECT` tunnel, which may
    /// itself be TLS to the parent)
    Tls(Box<TlsStream<Wire>>),
    /// A connection to a parent proxy, for `http://` origins.
    Proxied(Wire),
}

impl Conn {
    /// The TCP connection underneath (readiness, addresses).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Proxied(w) => w.tcp(),
            Conn::Tls(t) => t.get_ref().0.tcp(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Proxied(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Proxied(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Proxied(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Proxied(s) => Pin::new(s).poll_shutdown(cx),
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
            Conn::Proxied(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Proxied(s) => s.is_write_vectored(),
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
    /// Interim (1xx) responses relayed to clients.
    pub interim_relayed: AtomicU64,
    /// Connections upgraded (a 101 relayed, then bytes both ways).
    pub upgrades: AtomicU64,
    /// Requests that waited for a place at their server (`origin.max_connections`).
    pub queued: AtomicU64,
    /// Requests that waited `origin.queue_timeout` for a place and got 503.
    pub queue_timeouts: AtomicU64,
    /// Requests dropped from the line unsent: their client went away.
    pub queue_abandoned: AtomicU64,
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
    /// Connections refused for their destination's address ([`Destinations`]).
    pub destinations_denied: AtomicU64,
}

impl UpstreamStats {
    /// Counts a connect failure by kind.
    pub fn connect_failed(&self, kind: ConnectErrorKind) {
        let c = match kind {
            ConnectErrorKind::Dns => &self.dns_errors,
            ConnectErrorKind::Refused | ConnectErrorKind::Parent | ConnectErrorKind::Loop => &self.connect_errors,
            // Not the origin's failure: counted apart, where it is
            // refused (`Connector::tcp`), for tunnels too.
            ConnectErrorKind::Denied => return,
            ConnectErrorKind::Timeout => &self.connect_timeouts,
            ConnectErrorKind::Tls => &self.tls_errors,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Resolved origin names, kept for their DNS lifetime. Consulted only when
/// a new connection is opened (pooled connections skip it), so a mutex is
/// no cost on the request path; it exists to be counted (entries, hit
/// ratio: the Sun Java System Web Proxy Server 4's HostDNSCacheInfo), which hickory's own
/// cache is not.
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
    /// The parent proxy every connection goes through, if any.
    parent: Option<Arc<super::ServerAddr>>,
    /// `Proxy-Authorization` for that parent's `CONNECT` (its group's
    /// `credentials_file`).
    parent_auth: Option<http::HeaderValue>,
    /// Counters, shared with the pooled client.
    pub stats: Arc<UpstreamStats>,
    /// The DNS cache.
    pub dns: Arc<DnsCache>,
    /// `[origin] hosts`: names answered without a query (lower case, no
    /// trailing dot).
    hosts: Arc<HashMap<String, Vec<IpAddr>>>,
    /// The local address connections are made from, when set (a proxy
    /// array member's own address, by which the other members know it).
    source: Option<IpAddr>,
    /// The addresses this connector refuses, when the destinations it
    /// connects to are chosen by clients ([`Connector::guarded`]).
    guard: Option<Arc<Destinations>>,
}

/// `[proxy] deny_destinations` less `allow_destinations`: the addresses a
/// destination chosen by a client (a forward or transparent request's
/// origin, a `CONNECT` or SOCKS target) may not resolve to, as Squid's
/// `http_access deny to_localhost` and `to_linklocal` are. Checked on the
/// addresses actually dialled, after resolution, so no spelling of an
/// address and no name resolving to it (`localhost`, a name an attacker's
/// DNS points at `169.254.169.254`) gets round it, and a name whose
/// answer changes between a check and the connect cannot either.
#[derive(Debug, Clone)]
pub struct Destinations {
    deny: Vec<ipnet::IpNet>,
    /// `allow_destinations`, and for the requests an `[[acl]]` entry with
    /// `allow_destinations` allows, that entry's networks too.
    allow: Vec<ipnet::IpNet>,
}

impl Destinations {
    /// The destinations `[proxy]` refuses; None when it refuses none.
    pub fn new(cfg: &crate::config::ProxyConfig) -> Option<Destinations> {
        (!cfg.deny_destinations.is_empty()).then(|| Destinations {
            deny: cfg.deny_destinations.clone(),
            allow: cfg.allow_destinations.clone(),
        })
    }

    /// These destinations, less `nets` (an `[[acl]]` entry's
    /// `allow_destinations`: the exception its requests get).
    pub fn except(&self, nets: &[ipnet::IpNet]) -> Destinations {
        let mut d = self.clone();
        d.allow.extend_from_slice(nets);
        d
    }

    /// True if `ip` may not be connected to. An address is judged as what
    /// a connection to it reaches too: an IPv4-mapped IPv6 address
    /// (`::ffff:169.254.169.254`) as its IPv4 address, and the unspecified
    /// address (`0.0.0.0`, `::`), which Linux connects to this host, as
    /// loopback, so that denying `127.0.0.0/8` is not undone by `0.0.0.0`.
    pub fn refuses(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let refused =
            |ip: IpAddr| self.deny.iter().any(|n| n.contains(&ip)) && !self.allow.iter().any(|n| n.contains(&ip));
        refused(ip)
            || match ip {
                IpAddr::V4(v4) if v4.is_unspecified() => refused(IpAddr::from(std::net::Ipv4Addr::LOCALHOST)),
                IpAddr::V6(v6) if v6.is_unspecified() => refused(IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
                _ => false,
            }
    }

    /// What `portico check` and start-up warn about destinations: the
    /// loopback warning ([`Destinations::loopback_warning`]), and each
    /// `[[acl]]` `allow_destinations` network that lifts nothing because
    /// `proxy.deny_destinations` refuses no address in it (a typo, or a
    /// deny list changed without the exceptions).
    pub fn warnings(config: &crate::config::Config) -> Vec<String> {
        let mut out: Vec<String> = Self::loopback_warning(config).into_iter().collect();
        let deny = &config.proxy.deny_destinations;
        let overlaps = |a: &ipnet::IpNet, b: &ipnet::IpNet| a.contains(&b.network()) || b.contains(&a.network());
        for (i, e) in config.acl.iter().enumerate() {
            for net in &e.allow_destinations {
                if !deny.iter().any(|d| overlaps(d, net)) {
                    out.push(format!(
                        "acl[{i}].allow_destinations: {net} lifts nothing, as proxy.deny_destinations refuses no address in it"
                    ));
                }
            }
        }
        out
    }

    /// The warning `portico check` and start-up give when clients from
    /// other machines may choose destinations (`access.allow` admits a
    /// network beyond loopback, and a listener is not a reverse one) and
    /// loopback (`127.0.0.0/8` and `::1`) is not wholly refused: they can reach this host's services
    /// that trust loopback, which is why Squid 6 denies `to_localhost` by
    /// default. Not an error: some proxies exist to reach them.
    pub fn loopback_warning(config: &crate::config::Config) -> Option<String> {
        // A network wholly inside loopback: 127.0.0.0/8 or narrower, ::1.
        let loopback = |n: &ipnet::IpNet| match n.network() {
            IpAddr::V4(v4) => v4.is_loopback() && n.prefix_len() >= 8,
            IpAddr::V6(v6) => v6.is_loopback() && n.prefix_len() == 128,
        };
        let outside = config.access.allow.iter().find(|n| !loopback(n))?;
        let chosen = config.listener.iter().any(|l| l.mode != crate::config::Mode::Reverse);
        // Every loopback address, not only 127.0.0.1: `127.0.0.1/32` alone
        // leaves 127.0.0.2, and `127.0.0.0/8` alone leaves ::1.
        let refused = Destinations::new(&config.proxy).is_some_and(|d| {
            [
                IpAddr::from(std::net::Ipv4Addr::LOCALHOST),
                IpAddr::from([127, 255, 255, 254]),
                IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            ]
            .into_iter()
            .all(|ip| d.refuses(ip))
        });
        (chosen && !refused).then(|| {
            format!(
                "access.allow admits clients beyond this host ({outside}) and proxy.deny_destinations does not refuse \
                 loopback: they can reach this host's own services on 127.0.0.1 through the proxy; add \"127.0.0.0/8\" \
                 and \"::1\" to proxy.deny_destinations unless that is meant (Squid 6 denies to_localhost by default)"
            )
        })
    }
}

/// How long an answer from `[origin] hosts` or for `localhost` is kept in
/// the DNS cache. It cannot change while this connector lives (a reload
/// that changes `[origin]` builds a new one), so any long time will do;
/// a day is what hickory gives its own `localhost` answers.
const STATIC_TTL: Duration = Duration::from_secs(86_400);

/// The resolver: the system's (`/etc/resolv.conf`, with `/etc/hosts`) when
/// `nameservers` is empty, else one asking only those servers, over UDP
/// with TCP when an answer is truncated (the system's search domains are
/// not used then: names are looked up as written).
fn build_resolver(nameservers: &[SocketAddr]) -> Option<TokioResolver> {
    use hickory_resolver::config::{NameServerConfig, ResolverConfig};
    if !nameservers.is_empty() {
        let servers = nameservers
            .iter()
            .map(|addr| {
                let mut server = NameServerConfig::udp_and_tcp(addr.ip());
                for c in &mut server.connections {
                    c.port = addr.port();
                }
                server
            })
            .collect();
        let config = ResolverConfig::from_name_servers(servers);
        return match TokioResolver::builder_with_config(config, TokioRuntimeProvider::default()).build() {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("cannot set up origin.nameservers ({e}); only IP addresses will resolve");
                None
            }
        };
    }
    match TokioResolver::builder_tokio() {
        Ok(b) => b.build().ok(),
        Err(e) => {
            tracing::warn!("no system DNS configuration ({e}); only IP addresses and /etc/hosts names will resolve");
            None
        }
    }
    .or_else(|| {
        TokioResolver::builder_with_config(Default::default(), TokioRuntimeProvider::default())
            .build()
            .ok()
    })
}

/// The addresses of `localhost` and its subdomains: loopback, answered
/// without a query as RFC 6761 §6.3 asks of resolvers. IPv4 first: a
/// service on "localhost" listens on 127.0.0.1 more often than on ::1.
fn localhost(name: &str) -> Option<Vec<IpAddr>> {
    (name == "localhost" || name.ends_with(".localhost")).then(|| {
        vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ]
    })
}

impl Connector {
    /// A connector resolving through `[origin] nameservers` (the system's
    /// resolver when empty) and `[origin] hosts`, with the given TLS trust
    /// and `[origin]` connect timeout and DNS cache size.
    pub fn new(tls: Arc<rustls::ClientConfig>, cfg: &crate::config::OriginConfig) -> Self {
        let resolver = build_resolver(&cfg.nameservers).map(Arc::new);
        Connector {
            resolver,
            tls: TlsConnector::from(tls),
            connect_timeout: cfg.connect_timeout.get(),
            parent: None,
            parent_auth: None,
            stats: Arc::default(),
            dns: Arc::new(DnsCache {
                max: cfg.dns_cache_entries,
                map: Mutex::new(HashMap::new()),
            }),
            hosts: Arc::new(cfg.hosts.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            source: None,
            guard: None,
        }
    }

    /// The same connector (resolver, TLS trust, counters), but dialling the
    /// parent proxy `parent` for every connection.
    pub fn via_parent(&self, parent: super::ServerAddr, credentials: Option<http::HeaderValue>) -> Connector {
        Connector {
            parent: Some(Arc::new(parent)),
            parent_auth: credentials,
            // The parent is the configuration's choice, not a client's.
            guard: None,
            ..self.clone()
        }
    }

    /// Whether the responses of this connector's connections should carry
    /// the address they came from (`OriginBody::origin_addr`): only when it
    /// refuses some addresses, as only then is the address ever checked
    /// ([`Connector::may_have_fetched_from`]; asking the kernel costs a
    /// system call per exchange), and only when it dials origins itself
    /// (through a parent proxy the address reached is the parent's).
    pub fn records_origin(&self) -> bool {
        self.guard.is_some() && self.parent.is_none()
    }

    /// Whether this connector may have given a response that came from
    /// `origin` (`OriginBody::origin_addr`) as far as its guard goes:
    /// always without one; with one, only from a known address it does
    /// not refuse.
    pub fn may_have_fetched_from(&self, origin: Option<IpAddr>) -> bool {
        match &self.guard {
            None => true,
            Some(guard) => origin.is_some_and(|ip| !guard.refuses(ip)),
        }
    }

    /// The same connector, refusing the addresses `guard` refuses: for the
    /// destinations clients choose. None leaves it as it is.
    pub fn guarded(&self, guard: Option<Arc<Destinations>>) -> Connector {
        Connector { guard, ..self.clone() }
    }

    /// The same connector, making its connections from the local address
    /// `source` (for an address of the same family; others as usual).
    pub fn with_source(&self, source: Option<IpAddr>) -> Connector {
        Connector { source, ..self.clone() }
    }

    /// Resolves `host` (a name, an IPv4 address or a bracketed IPv6 address).
    pub(crate) async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ConnectError> {
        // The same reading as the access rules' (`util::canonical_host`):
        // what is dialled as an address is what they judged as one.
        if let Some(ip) = crate::util::host_ip(host) {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
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
        // `[origin] hosts`, then localhost: no query, but cached and
        // counted like any answer (a lookup, then hits).
        let key = bare.trim_end_matches('.').to_ascii_lowercase();
        if let Some(ips) = self.hosts.get(&key).cloned().or_else(|| localhost(&key)) {
            self.dns.put(bare, ips.clone(), std::time::Instant::now() + STATIC_TTL);
            return Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect());
        }
        let resolver = self
            .resolver
            .as_ref()
            .ok_or_else(|| failed(err("no DNS resolver is configured".into())))?;
        let lookup = resolver.lookup_ip(bare).await.map_err(|e| {
            // The resolver's own text (a Debug dump of the query) is for
            // the debug log; users and the warning get plain words.
            tracing::debug!("DNS lookup of {bare} failed: {e}");
            failed(err(dns_cause(&e)))
        })?;
        let ips: Vec<IpAddr> = lookup.iter().collect();
        if ips.is_empty() {
            return Err(failed(err(NO_RECORDS.into())));
        }
        self.dns.put(bare, ips.clone(), lookup.valid_until());
        Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, port)).collect())
    }

    /// Connects to `addr`, from `self.source` when it is set and of the
    /// same address family. Out of descriptors while cache files are held
    /// open, it closes some of those and tries once more.
    async fn connect_from(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        match self.connect_once(addr).await {
            Err(e) if crate::sizing::relieve(&e) => self.connect_once(addr).await,
            done => done,
        }
    }

    async fn connect_once(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let Some(source) = self.source.filter(|s| s.is_ipv4() == addr.is_ipv4()) else {
            return TcpStream::connect(addr).await;
        };
        let socket = match source {
            IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(addr).await
    }

    /// Opens a TCP connection to `host:port`, trying each resolved address in
    /// turn, all within the connect timeout.
    pub async fn tcp(&self, host: &str, port: u16) -> Result<TcpStream, ConnectError> {
        self.tcp_to(host, port, None).await
    }

    /// [`Connector::tcp`], to `pinned` instead of the addresses `host`
    /// resolves to when it is set (checked as they would be).
    async fn tcp_to(&self, host: &str, port: u16, pinned: Option<SocketAddr>) -> Result<TcpStream, ConnectError> {
        let target = format!("{host}:{port}");
        let attempt = async {
            let addrs = match pinned {
                Some(addr) => vec![addr],
                None => self.resolve(host, port).await?,
            };
            // After resolution, so that no spelling of our own address
            // (`127.1`, `[::ffff:127.0.0.1]`, `localhost`, a name that
            // resolves to this host) gets through; refused whole, not
            // skipped, as such a name can only be a mistake or an attack.
            if let Some(own) = addrs.iter().find(|a| crate::listen::is_own_address(**a)) {
                let detail = if own.to_string() == target {
                    "is this proxy's own listening address".to_string()
                } else {
                    format!("is this proxy's own listening address ({own})")
                };
                return Err(ConnectError {
                    kind: ConnectErrorKind::Loop,
                    target: target.clone(),
                    detail,
                });
            }
            // Refused whole when any address is refused, as Squid's `dst`
            // matches a name by any of its addresses: a name with one
            // public and one internal address is not tried in turn.
            if let Some(guard) = &self.guard
                && let Some(bad) = addrs.iter().find(|a| guard.refuses(a.ip()))
            {
                let detail = if bad.to_string() == target {
                    "is not allowed (proxy.deny_destinations)".to_string()
                } else {
                    format!(
                        "resolves to {}, which is not allowed (proxy.deny_destinations)",
                        bad.ip()
                    )
                };
                self.stats.destinations_denied.fetch_add(1, Ordering::Relaxed);
                return Err(ConnectError {
                    kind: ConnectErrorKind::Denied,
                    target: target.clone(),
                    detail,
                });
            }
            let mut last = String::new();
            for addr in addrs {
                match self.connect_from(addr).await {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(s);
                    }
                    Err(e) => {
                        tracing::debug!("connect to {addr} ({target}) failed: {e}");
                        // The address only when it is not what was asked
                        // for (a name, or several addresses).
                        last = if addr.to_string() == target {
                            crate::util::io_cause(&e)
                        } else {
                            format!("{} (at {addr})", crate::util::io_cause(&e))
                        };
                    }
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
    /// `pinned` (when set) is dialled rather than the addresses the URI's
    /// host resolves to (`super::Pinned`); through a parent, the parent
    /// resolves the name.
    pub async fn open_to(&self, uri: &http::Uri, pinned: Option<SocketAddr>) -> Result<Conn, ConnectError> {
        let started = std::time::Instant::now();
        let result = self.open_uncounted(uri, pinned).await;
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

    async fn open_uncounted(&self, uri: &http::Uri, pinned: Option<SocketAddr>) -> Result<Conn, ConnectError> {
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let host = uri.host().unwrap_or("");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = match &self.parent {
            None => Wire::Tcp(self.tcp_to(host, port, pinned).await?),
            Some(parent) if !https => return self.dial_parent(parent).await.map(Conn::Proxied),
            Some(parent) => {
                let (tcp, early) = self.tunnel_via(parent, host, port, self.parent_auth.as_ref()).await?;
                if !early.is_empty() {
                    return Err(ConnectError {
                        kind: ConnectErrorKind::Parent,
                        target: format!("{host}:{port}"),
                        detail: format!("parent {} sent data before the TLS handshake", parent.authority),
                    });
                }
                tcp
            }
        };
        if !https {
            return match tcp {
                Wire::Tcp(tcp) => Ok(Conn::Plain(tcp)),
                // Only a parent's connection is TLS, and `http` to a parent
                // returned above.
                wire => Ok(Conn::Proxied(wire)),
            };
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let tls_err = |detail: String| ConnectError {
            kind: ConnectErrorKind::Tls,
            target: format!("{host}:{port}"),
            detail,
        };
        let name = ServerName::try_from(bare.to_string())
            .map_err(|_| tls_err(format!("{bare} is not a valid name for a TLS server")))?;
        let handshake = self.tls.connect(name, tcp);
        match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(Ok(s)) => Ok(Conn::Tls(Box::new(s))),
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake with {host}:{port} failed: {e}");
                Err(tls_err(tls_cause(&e, bare)))
            }
            Err(_) => Err(ConnectError {
                kind: ConnectErrorKind::Timeout,
                target: format!("{host}:{port}"),
                detail: "TLS handshake took too long".into(),
            }),
        }
    }
}

impl Connector {
    /// Opens a connection to the parent proxy `parent`: TCP, then TLS for
    /// an `https://` parent, its certificate checked against the origins'
    /// trust (`[origin] system_roots` and `ca_file`) for the parent's host
    /// name, within the connect timeout. A failed check is a `Tls` error,
    /// the parent named, and marks the parent down as a refused connect.
    async fn dial_parent(&self, parent: &super::ServerAddr) -> Result<Wire, ConnectError> {
        let host = parent.authority.host();
        let tls = parent.scheme == http::uri::Scheme::HTTPS;
        let port = parent.authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let tcp = self.tcp(host, port).await?;
        if !tls {
            return Ok(Wire::Tcp(tcp));
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let tls_err = |detail: String| ConnectError {
            kind: ConnectErrorKind::Tls,
            target: format!("{host}:{port}"),
            detail: format!("parent proxy: {detail}"),
        };
        let name = ServerName::try_from(bare.to_string())
            .map_err(|_| tls_err(format!("{bare} is not a valid name for a TLS server")))?;
        match tokio::time::timeout(self.connect_timeout, self.tls.connect(name, tcp)).await {
            Ok(Ok(s)) => Ok(Wire::Tls(Box::new(s))),
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake with parent {host}:{port} failed: {e}");
                Err(tls_err(tls_cause(&e, bare).replace("the origin", "the parent")))
            }
            Err(_) => Err(ConnectError {
                kind: ConnectErrorKind::Timeout,
                target: format!("{host}:{port}"),
                detail: "TLS handshake with the parent proxy took too long".into(),
            }),
        }
    }

    /// Opens a tunnel to `host:port` through the parent proxy `parent`:
    /// connects to it, sends `CONNECT host:port`, and on a 2xx answer
    /// returns the connection, with any bytes that came after the answer's
    /// head (the far end speaking first). All within the connect timeout.
    /// `auth` is sent as `Proxy-Authorization` (the parent's credentials).
    pub async fn tunnel_via(
        &self,
        parent: &super::ServerAddr,
        host: &str,
        port: u16,
        auth: Option<&http::HeaderValue>,
    ) -> Result<(Wire, bytes::Bytes), ConnectError> {
        let mut tcp = self.dial_parent(parent).await?;
        let target = format!("{host}:{port}");
        let failed = |kind, detail: String| ConnectError {
            kind,
            target: target.clone(),
            detail: format!("parent {}: {detail}", parent.authority),
        };
        let handshake = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n").into_bytes();
            if let Some(auth) = auth {
                request.extend_from_slice(b"Proxy-Authorization: ");
                request.extend_from_slice(auth.as_bytes());
                request.extend_from_slice(b"\r\n");
            }
            request.extend_from_slice(b"\r\n");
            // Flushed: over TLS the request is only sent when flushed.
            let sent = match tcp.write_all(&request).await {
                Ok(()) => tcp.flush().await,
                Err(e) => Err(e),
            };
            sent.map_err(|e| {
                let cause = crate::util::io_cause(&e);
                failed(ConnectErrorKind::Refused, format!("sending CONNECT: {cause}"))
            })?;
            let mut buf = bytes::BytesMut::with_capacity(1024);
            let end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                if buf.len() > 16 << 10 {
                    return Err(failed(ConnectErrorKind::Parent, "answer head too long".into()));
                }
                match tcp.read_buf(&mut buf).await {
                    Ok(0) => {
                        return Err(failed(
                            ConnectErrorKind::Refused,
                            "closed the connection before answering CONNECT".into(),
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let cause = crate::util::io_cause(&e);
                        return Err(failed(
                            ConnectErrorKind::Refused,
                            format!("reading its answer: {cause}"),
                        ));
                    }
                }
            };
            let head = buf.split_to(end);
            let line = head[..].split(|&b| b == b'\r').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line).into_owned();
            let status = connect_status(&line).ok_or_else(|| {
                tracing::debug!("parent {} answered CONNECT with {line:?}", parent.authority);
                failed(ConnectErrorKind::Parent, "its answer to CONNECT is not HTTP".into())
            })?;
            if !(200..300).contains(&status) {
                tracing::debug!("parent {} answered CONNECT with {line:?}", parent.authority);
                return Err(failed(
                    ConnectErrorKind::Parent,
                    format!("answered with status {status}"),
                ));
            }
            Ok(buf.freeze())
        };
        match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(Ok(early)) => Ok((tcp, early)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(failed(
                ConnectErrorKind::Timeout,
                format!(
                    "no answer to CONNECT within {}",
                    humantime::format_duration(self.connect_timeout)
                ),
            )),
        }
    }
}

/// A name the resolver knows but that has no A or AAAA record.
const NO_RECORDS: &str = "no address found (the name has no address records)";

/// Why a DNS lookup failed, in plain words (hickory's own text names
/// internal structures: `no records found for Query { name: Name(...) }`).
fn dns_cause(e: &hickory_resolver::net::NetError) -> String {
    use hickory_resolver::net::{DnsError, NetError};
    use hickory_resolver::proto::op::ResponseCode;
    if e.is_nx_domain() {
        return "no address found (the name does not exist)".into();
    }
    if e.is_no_records_found() {
        return NO_RECORDS.into();
    }
    match e {
        NetError::Dns(DnsError::ResponseCode(ResponseCode::ServFail)) => {
            "the DNS server failed to answer (SERVFAIL)".into()
        }
        NetError::Dns(DnsError::ResponseCode(ResponseCode::Refused)) => "the DNS server refused the query".into(),
        NetError::Dns(DnsError::ResponseCode(code)) => format!("the DNS server answered with an error ({code})"),
        NetError::Timeout => "the DNS server did not answer in time".into(),
        NetError::NoConnections => "no DNS server could be reached".into(),
        NetError::Io(io) => format!("the DNS server could not be reached: {}", crate::util::io_cause(io)),
        _ => "the DNS lookup failed".into(),
    }
}

/// Why a TLS handshake with `host` failed, in plain words.
fn tls_cause(e: &io::Error, host: &str) -> String {
    use rustls::{CertificateError as C, Error as E};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<E>()) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof => "the origin closed the connection during the handshake".into(),
            _ => crate::util::io_cause(e),
        };
    };
    match tls {
        E::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "the origin's certificate is not signed by a trusted authority".into(),
            C::Expired | C::ExpiredContext { .. } => "the origin's certificate has expired".into(),
            C::NotValidYet | C::NotValidYetContext { .. } => "the origin's certificate is not valid yet".into(),
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                format!("the origin's certificate is not valid for {host}")
            }
            C::Revoked => "the origin's certificate has been revoked".into(),
            _ => "the origin's certificate was rejected".into(),
        },
        E::NoCertificatesPresented => "the origin presented no certificate".into(),
        E::AlertReceived(_) => "the origin refused the handshake".into(),
        E::PeerIncompatible(_) => "the origin supports no TLS version or cipher Portico accepts".into(),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => {
            "the origin did not answer in TLS".into()
        }
        _ => "the handshake failed".into(),
    }
}

/// The status code of an answer's status line (`HTTP/1.1 200 OK`).
fn connect_status(line: &str) -> Option<u16> {
    let mut words = line.split(' ');
    let version = words.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = words.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
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

#[cfg(test)]
mod tests {
    /// `[proxy]` with these destination lists.
    fn destinations(deny: &[&str], allow: &[&str]) -> Option<super::Destinations> {
        let nets = |l: &[&str]| l.iter().map(|n| n.parse().expect("network")).collect();
        super::Destinations::new(&crate::config::ProxyConfig {
            deny_destinations: nets(deny),
            allow_destinations: nets(allow),
            ..Default::default()
        })
    }

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn the_defaults_refuse_link_local_and_this_network_but_not_loopback_or_the_internet() {
        let d = super::Destinations::new(&Default::default()).expect("defaults refuse some");
        for refused in [
            "169.254.169.254",
            "fe80::1",
            "0.0.0.0",
            "::",
            "0.1.2.3",
            "::ffff:169.254.169.254",
        ] {
            assert!(d.refuses(ip(refused)), "{refused}");
        }
        for allowed in ["127.0.0.1", "::1", "10.0.0.1", "192.0.2.7", "2001:db8::1"] {
            assert!(!d.refuses(ip(allowed)), "{allowed}");
        }
    }

    #[test]
    fn denying_loopback_also_denies_the_unspecified_and_mapped_addresses_that_reach_it() {
        let d = destinations(&["127.0.0.0/8", "::1/128"], &[]).expect("some refused");
        for refused in ["127.0.0.1", "127.9.9.9", "0.0.0.0", "::", "::1", "::ffff:127.0.0.1"] {
            assert!(d.refuses(ip(refused)), "{refused}");
        }
        assert!(!d.refuses(ip("0.1.2.3")), "0.0.0.0/8 beyond 0.0.0.0 is not loopback");
    }

    #[test]
    fn an_allowed_network_is_an_exception_to_the_denied_ones() {
        let d = destinations(&["10.0.0.0/8"], &["10.1.0.0/16"]).expect("some refused");
        assert!(d.refuses(ip("10.2.0.1")));
        assert!(!d.refuses(ip("10.1.2.3")));
        assert!(!d.refuses(ip("192.0.2.7")), "allow_destinations never adds refusals");
    }

    #[test]
    fn an_empty_deny_list_refuses_nothing() {
        assert!(destinations(&[], &["10.0.0.0/8"]).is_none());
    }

    use super::{ConnectError, ConnectErrorKind, connect_status, dns_cause, localhost};
    use hickory_resolver::net::{DnsError, NetError, NoRecords};
    use hickory_resolver::proto::op::{Query, ResponseCode};
    use hickory_resolver::proto::rr::{Name, RecordType};
    use std::net::IpAddr;

    fn no_records(code: ResponseCode) -> NetError {
        let name = Name::from_ascii("does-not-exist.invalid.").expect("name");
        NoRecords::new(Query::query(name, RecordType::A), code).into()
    }

    #[test]
    fn dns_failures_in_plain_words() {
        let cases = [
            (
                no_records(ResponseCode::NXDomain),
                "no address found (the name does not exist)",
            ),
            (
                no_records(ResponseCode::NoError),
                "no address found (the name has no address records)",
            ),
            (
                NetError::Dns(DnsError::ResponseCode(ResponseCode::ServFail)),
                "the DNS server failed to answer (SERVFAIL)",
            ),
            (NetError::Timeout, "the DNS server did not answer in time"),
        ];
        for (e, want) in cases {
            let cause = dns_cause(&e);
            assert_eq!(cause, want, "{e}");
            let page = ConnectError {
                kind: ConnectErrorKind::Dns,
                target: "does-not-exist.invalid:80".into(),
                detail: cause,
            }
            .to_string();
            assert_eq!(page, format!("cannot resolve does-not-exist.invalid: {want}"));
            for internal in ["Query {", "Name(", "NoRecords", "DNS error"] {
                assert!(!page.contains(internal), "{page}");
            }
        }
    }

    #[test]
    fn localhost_names_are_loopback_and_nothing_else_is() {
        let loopback = Some(vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ]);
        assert_eq!(localhost("localhost"), loopback);
        assert_eq!(localhost("app.localhost"), loopback);
        assert_eq!(localhost("localhostx"), None);
        assert_eq!(localhost("notlocalhost"), None);
        assert_eq!(localhost("localhost.example"), None);
    }

    #[test]
    fn connect_answer_status_lines() {
        assert_eq!(connect_status("HTTP/1.1 200 Connection established"), Some(200));
        assert_eq!(connect_status("HTTP/1.0 200"), Some(200));
        assert_eq!(connect_status("HTTP/1.1 407 Proxy Authentication Required"), Some(407));
        assert_eq!(connect_status("SSH-2.0-OpenSSH"), None);
        assert_eq!(connect_status("HTTP/1.1 20 short"), None);
        assert_eq!(connect_status("HTTP/2 200"), None);
    }
}
