//! The configuration: one TOML file, every key with a default, so that
//! `portico run` with no file at all is a safe loopback-only forward proxy.
//!
//! `load` reads and checks a file (errors name the file, line and key);
//! `source` says which text `portico run` reads (a worker process reads
//! what its supervisor validated);
//! the types here are the effective configuration the server runs on.

pub(crate) mod load;
pub mod memory;
pub mod source;
pub mod units;

/// Checks an `[auth.ldap] url` (the LDAP back-end reads its scheme too).
pub use load::ldap_url;
pub use load::{ConfigError, acl_lines, load_file, parse_str, rule_lines, tracing_level};
pub use units::{Dur, Size};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Process-wide settings.
    pub server: ServerConfig,
    /// Listening sockets; one forward-proxy listener on 127.0.0.1:8080 when none is given.
    pub listener: Vec<ListenerConfig>,
    /// Who may use the proxy.
    pub access: AccessConfig,
    /// Persistent client connections.
    pub keepalive: KeepAliveConfig,
    /// HTTP/2 client connections: limits and defences.
    pub http2: Http2Config,
    /// Request size limits and the header read timeout.
    pub limits: LimitsConfig,
    /// Forward-proxy behaviour: Via, X-Forwarded-For, CONNECT.
    pub proxy: ProxyConfig,
    /// How Portico talks to origin servers: timeouts, pooling, TLS trust.
    pub origin: OriginConfig,
    /// Named groups of origin servers for reverse proxying.
    pub upstream: Vec<UpstreamConfig>,
    /// Routing rules, checked in order; the first match wins.
    pub rule: Vec<RuleConfig>,
    /// Access control entries, checked in order; the first match decides.
    pub acl: Vec<AclConfig>,
    /// Named filter list files (`[[acl_list]]`) that `[[acl]]` entries use with `list`.
    pub acl_list: Vec<AclListConfig>,
    /// The HTTP cache.
    pub cache: CacheConfig,
    /// Access and error logs.
    pub log: LogConfig,
    /// Statistics and the monitoring endpoints.
    pub monitor: MonitorConfig,
    /// Basic authentication of clients against an htpasswd file, and the user cache.
    pub auth: AuthConfig,
    /// TLS session resumption on the listeners with certificates: the
    /// session cache and the session tickets.
    pub tls: TlsConfig,
    /// The pages Portico answers its own errors with.
    pub error_pages: ErrorPagesConfig,
    /// A proxy array (CARP members) and the generated PAC file; absent = neither.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            listener: vec![ListenerConfig::default()],
            access: AccessConfig::default(),
            keepalive: KeepAliveConfig::default(),
            http2: Http2Config::default(),
            limits: LimitsConfig::default(),
            proxy: ProxyConfig::default(),
            origin: OriginConfig::default(),
            upstream: Vec::new(),
            rule: Vec::new(),
            acl: Vec::new(),
            acl_list: Vec::new(),
            cache: CacheConfig::default(),
            log: LogConfig::default(),
            monitor: MonitorConfig::default(),
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            error_pages: ErrorPagesConfig::default(),
            array: None,
        }
    }
}

/// `[server]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Async worker threads; 0 = one per core.
    pub workers: usize,
    /// Requests in service at once; 0 = sized from the open-files limit.
    pub max_requests: usize,
    /// Requests that may wait for `max_requests` (the connection queue);
    /// 0 = sized from the open-files limit.
    pub queue_size: usize,
    /// `Retry-After` of a busy (503) response.
    pub busy_retry_after: Dur,
    /// Threads of the blocking pool (disk I/O).
    pub blocking_threads: usize,
    /// Jobs that may wait for a blocking-pool thread; 0 = as `max_requests`.
    pub blocking_queue: usize,
    /// Worker processes; 1 = one process, no supervisor; N > 1 = a supervisor
    /// and N workers sharing the listeners with SO_REUSEPORT.
    pub processes: usize,
    /// On SIGTERM, how long in-flight requests may take to finish before the process exits anyway.
    pub shutdown_timeout: Dur,
    /// File to write the server's pid to once it listens (removed at exit); empty = none.
    pub pid_file: PathBuf,
    /// Started as root: the user to switch to once the listeners are bound; empty = stay.
    pub user: String,
    /// The group to switch to with `user`; empty = the user's primary group.
    pub group: String,
    /// Not a setting: filled by `sizing::resolve` when `max_requests` was
    /// derived, so admission may go past it while descriptors are free.
    #[serde(skip)]
    pub descriptors: Option<crate::sizing::Descriptors>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 0,
            max_requests: 0,
            queue_size: 0,
            busy_retry_after: Dur::secs(5),
            blocking_threads: 64,
            blocking_queue: 0,
            processes: 1,
            shutdown_timeout: Dur::secs(30),
            pid_file: PathBuf::new(),
            user: String::new(),
            group: String::new(),
            descriptors: None,
        }
    }
}

/// What a listener does with the requests it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Clients use Portico as their proxy: absolute-form targets and CONNECT.
    Forward,
    /// Portico stands in front of origin servers, routed by `[[rule]]`.
    Reverse,
    /// Traffic redirected to Portico without the client knowing: the target is the `Host`.
    Transparent,
    /// A SOCKS version 5 server (RFC 1928): CONNECT by address or name,
    /// RFC 1929 user/password when `[auth]` is on (`proxy/socks.rs`).
    Socks,
}

/// `[[listener]]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerConfig {
    /// Address and port to bind.
    pub address: SocketAddr,
    /// forward | reverse | transparent | socks.
    pub mode: Mode,
    /// Listen backlog passed to listen(2) (the kernel caps it at net.core.somaxconn).
    pub listen_queue: u32,
    /// Set TCP_NODELAY on accepted connections.
    pub nodelay: bool,
    /// TCP_DEFER_ACCEPT: the kernel hands a connection over only once its
    /// client has sent something, waiting at most about this long (whole
    /// seconds; 0 = off). Every protocol Portico serves has the client
    /// speak first, so no connection is refused by it.
    pub defer_accept: Dur,
    /// SO_RCVBUF of the listener's connections (set on the listening
    /// socket before listen(2), which they inherit); 0 = the kernel's
    /// autotuning.
    pub receive_buffer: Size,
    /// SO_SNDBUF of the listener's connections, likewise; 0 = autotuning.
    pub send_buffer: Size,
    /// Body of this listener's busy (503) responses; empty = the built-in page.
    pub busy_body: String,
    /// File whose content is the body of busy responses (read at start-up); empty = none.
    pub busy_file: PathBuf,
    /// `[[listener.certificate]]`: TLS on this listener, one certificate
    /// chain per table, chosen by SNI (the first is the default); none =
    /// plain TCP.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub certificate: Vec<CertificateConfig>,
    /// Oldest TLS version accepted: "1.2" (1.2 and 1.3) or "1.3".
    pub tls_min_version: TlsVersion,
    /// HTTP/2 by ALPN (`h2`) on a TLS listener (ignored on a plain one).
    pub http2: bool,
    /// Cleartext HTTP/2 by prior knowledge (RFC 9113 3.3) on a plain listener.
    pub h2c: bool,
}

impl ListenerConfig {
    /// Whether this listener offers `h2` by ALPN: `http2`, by default on
    /// for a TLS listener (one with certificates).
    pub fn offers_h2(&self) -> bool {
        !self.certificate.is_empty() && self.http2 && self.mode != Mode::Socks
    }
}

/// `[[listener.certificate]]`: one certificate chain and its private key,
/// both PEM files (nginx's `ssl_certificate` and `ssl_certificate_key`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// The certificate, then its intermediate CA certificates (PEM).
    pub cert: PathBuf,
    /// The private key (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key: PathBuf,
}

/// `tls_min_version` of a `[[listener]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    #[serde(rename = "1.2")]
    V1_2,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    V1_3,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            address: SocketAddr::from(([127, 0, 0, 1], 8080)),
            mode: Mode::Forward,
            listen_queue: 4096,
            nodelay: true,
            defer_accept: Dur::secs(1),
            receive_buffer: Size(0),
            send_buffer: Size(0),
            busy_body: String::new(),
            busy_file: PathBuf::new(),
            certificate: Vec::new(),
            tls_min_version: TlsVersion::V1_2,
            http2: true,
            h2c: false,
        }
    }
}

/// `[error_pages]`: an administrator's pages for the errors Portico
/// answers itself (`proxy::error_pages`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErrorPagesConfig {
    /// Directory of `NNN.html` pages (400 to 599) and `default.html`;
    /// empty = the built-in page for every status.
    pub directory: PathBuf,
}

/// `[tls]`: session resumption on every TLS listener (RFC 5077 tickets and
/// session IDs for TLS 1.2, RFC 8446 PSK tickets for TLS 1.3). Defaults
/// from the Sun Java System Web Server 7 tuning guide's SSL session cache:
/// enabled, 10,000 entries, sessions kept 86,400 s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Sessions kept in each process's server-side session cache; 0 = no cache.
    pub session_cache_entries: usize,
    /// How long a session may be resumed after its full handshake, by the
    /// cache or by a ticket (at most 7 days, TLS 1.3's limit).
    pub session_timeout: Dur,
    /// Stateless session tickets, encrypted with keys every worker
    /// process of the server shares, so a session resumes on any worker.
    pub session_tickets: bool,
    /// How often a new ticket key is taken; older keys are kept until no
    /// ticket they sealed can be younger than `session_timeout`.
    pub session_ticket_rotation: Dur,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            session_cache_entries: 10_000,
            session_timeout: Dur::secs(86_400),
            session_tickets: true,
            session_ticket_rotation: Dur::secs(3_600),
        }
    }
}

/// `[access]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessConfig {
    /// Client networks allowed to use the proxy (CIDR or single addresses).
    #[serde(deserialize_with = "networks")]
    pub allow: Vec<IpNet>,
    /// Client networks allowed to use administrative functions.
    #[serde(deserialize_with = "networks")]
    pub admin_allow: Vec<IpNet>,
    /// What happens to a request no `[[acl]]` entry matches: allow | deny.
    pub acl_default: AclAction,
    /// IANA time zone (`Europe/Paris`) in which `[[acl]]` `time` and `days` are read.
    pub time_zone: String,
}

/// `action` of an `[[acl]]` entry, and `[access] acl_default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AclAction {
    /// Let the request through (to the routing rules).
    #[default]
    Allow,
    /// Refuse it with the entry's status and reason.
    Deny,
}

/// `[[acl]]`: one access control entry. Entries are tried in file order
/// and the first whose matchers all hold decides (Squid's `http_access`,
/// the Sun proxy's ACL files). Every matcher is optional. See
/// docs/CONFIG.md and `crate::acl`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclConfig {
    /// allow | deny.
    pub action: AclAction,
    /// Status of a deny (400..=599, default 403).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Text shown on the deny page (default "Cache access denied").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Client networks (CIDR or addresses), any of which matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "client_networks")]
    pub client: Vec<IpNet>,
    /// Authenticated user names, any of which matches (needs an authenticated user).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub user: Vec<String>,
    /// Groups, membership of any of which matches (needs an authenticated user).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub group: Vec<String>,
    /// `true`: any authenticated user; `false`: only requests without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authenticated: Option<bool>,
    /// Request methods, any of which matches (CONNECT included).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub method: Vec<String>,
    /// URL schemes (`http`, `https`); never matches a CONNECT.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub scheme: Vec<String>,
    /// Hosts: exact, `*.domain` or `*`, any of which matches (a CONNECT's target host too).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub host: Vec<String>,
    /// Regular expression the host must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_regex: Option<String>,
    /// Ports (URL port or CONNECT target port), any of which matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub port: Vec<u16>,
    /// Path prefixes, any of which matches; never matches a CONNECT.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub path: Vec<String>,
    /// Regular expression matched against the path and query; never matches a CONNECT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Request header conditions (as in `[[rule]]`), all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub header: Vec<HeaderMatchConfig>,
    /// Listener modes, any of which matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub mode: Vec<Mode>,
    /// Time of day `"HH:MM-HH:MM"` in `[access] time_zone` (may wrap midnight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// Days of the week (`"mon"` .. `"sun"`), any of which matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub days: Vec<String>,
    /// Names of `[[acl_list]]` filter lists: holds when any pattern of any of them matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub list: Vec<String>,
    /// Response media types (`video/*`, `application/x-msdownload`, `none`):
    /// makes the entry a response entry, checked on the response head
    /// (Squid's `http_reply_access` with `rep_mime_type`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub content_type: Vec<String>,
    /// For an `allow` entry: networks the requests it allows may connect
    /// to although `[proxy] deny_destinations` refuses them (a per-client
    /// exception, as Squid's `dst` ACLs in `http_access` order give one).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "client_networks")]
    pub allow_destinations: Vec<IpNet>,
}

/// What the lines of an `[[acl_list]]` file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AclListKind {
    /// Host names, as Squid's `dstdomain` files: `example.com` is that host
    /// only, `.example.com` that host and every subdomain.
    #[default]
    Domains,
    /// Absolute `http://` / `https://` URL prefixes (never match a CONNECT).
    Urls,
    /// Regular expressions matched against the whole URL (Squid's `url_regex`).
    Regex,
    /// Media types of responses (`video/*`), for response entries (Squid's
    /// `rep_mime_type`, the Sun proxy's MIME-type filters).
    Mime,
}

/// `[[acl_list]]`: a named file of patterns, one a line, read at start-up and
/// on every reload (Squid's `dstdomain` / `url_regex` files, the Sun proxy's
/// URL filters). See docs/CONFIG.md and `crate::acl`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclListConfig {
    /// The name `[[acl]]` entries give in `list`.
    pub name: String,
    /// The file of patterns.
    pub file: PathBuf,
    /// domains | urls | regex.
    #[serde(default)]
    pub kind: AclListKind,
}

/// A list of networks written as CIDR (`10.0.0.0/8`) or single addresses
/// (`::1`, `192.0.2.7`, taken as /32 or /128).
fn networks<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let items = Vec::<String>::deserialize(d)?;
    items
        .iter()
        .map(|text| {
            let t = text.trim();
            t.parse::<IpNet>()
                .or_else(|_| t.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    serde::de::Error::custom(format!(
                        "invalid network {text:?}: write an address (\"192.0.2.7\", \"::1\") or CIDR (\"10.0.0.0/8\")"
                    ))
                })
        })
        .collect()
}

fn loopback_nets() -> Vec<IpNet> {
    let v4 = ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(127, 0, 0, 0), 8).map(IpNet::V4);
    let v6 = ipnet::Ipv6Net::new(std::net::Ipv6Addr::LOCALHOST, 128).map(IpNet::V6);
    [v4, v6].into_iter().flatten().collect()
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            allow: loopback_nets(),
            admin_allow: loopback_nets(),
            // Allow: a config without [[acl]] entries behaves as before
            // they existed (the allow-list and rules alone decide).
            acl_default: AclAction::Allow,
            time_zone: "UTC".to_string(),
        }
    }
}

/// `[keepalive]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeepAliveConfig {
    /// How long an idle persistent connection is kept open.
    pub timeout: Dur,
    /// Requests served on one connection before it is closed; 0 = unlimited.
    pub max_requests: u32,
    /// Idle persistent connections kept at most (the oldest is closed
    /// beyond it); 0 = sized from the open-files limit.
    pub max_connections: usize,
    /// How long an idle connection's own task waits for the next request
    /// before handing the connection to the keep-alive poller.
    pub park_after: Dur,
}

impl Default for KeepAliveConfig {
    fn default() -> Self {
        KeepAliveConfig {
            timeout: Dur::secs(15),
            max_requests: 100,
            max_connections: 0,
            park_after: Dur(std::time::Duration::from_millis(100)),
        }
    }
}

/// `[http2]`: HTTP/2 client connections (listeners with `http2` or `h2c`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http2Config {
    /// Streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// Largest header list of a request, decoded (SETTINGS_MAX_HEADER_LIST_SIZE);
    /// also the bound on a header block spread over CONTINUATION frames.
    pub max_header_list_size: Size,
    /// Flow-control window of each stream (SETTINGS_INITIAL_WINDOW_SIZE).
    pub initial_stream_window: Size,
    /// Flow-control window of the whole connection.
    pub initial_connection_window: Size,
    /// How long a connection with no open stream is kept before GOAWAY.
    pub idle_timeout: Dur,
    /// How often a PING is sent to check the client is there; 0 = never.
    pub ping_interval: Dur,
    /// How long the PING's acknowledgement may take before the connection is closed.
    pub ping_timeout: Dur,
    /// Streams the client may reset before they are served, at once, before
    /// the connection is closed with GOAWAY (CVE-2023-44487, rapid reset).
    pub max_pending_reset_streams: usize,
    /// Streams Portico may reset because of the client's protocol errors
    /// before the connection is closed with GOAWAY.
    pub max_error_resets: usize,
}

impl Default for Http2Config {
    fn default() -> Self {
        Http2Config {
            max_concurrent_streams: 100,
            max_header_list_size: Size(64 << 10),
            initial_stream_window: Size(256 << 10),
            initial_connection_window: Size(1 << 20),
            idle_timeout: Dur::secs(180),
            ping_interval: Dur::secs(60),
            ping_timeout: Dur::secs(20),
            max_pending_reset_streams: 20,
            max_error_resets: 1024,
        }
    }
}

/// `[limits]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Longest request line accepted (414 beyond it).
    pub max_request_line: Size,
    /// Largest request head (request line and headers) accepted (431 beyond it).
    pub max_header_size: Size,
    /// Most header fields accepted in one request (431 beyond it).
    pub max_headers: usize,
    /// Time allowed to receive a complete request head once its first byte arrived.
    pub header_timeout: Dur,
    /// Largest request body accepted; 0 = unlimited (413 beyond it).
    pub max_body_size: Size,
    /// Longest time a client may accept no response bytes before its
    /// connection is closed (nginx's `send_timeout`).
    pub send_timeout: Dur,
    /// Most connections one client (an IPv4 address, an IPv6 /64) may hold
    /// open at once; 0 = no cap (Squid's `client_ip_max_connections`).
    pub max_connections_per_client: u32,
    /// Requests a second one client may make; 0 = no limit (nginx's
    /// `limit_req rate`).
    pub client_request_rate: u32,
    /// Requests one client may make at once: its bucket's size; 0 = the
    /// rate itself (nginx's `limit_req burst=N nodelay` is N + 1 here).
    pub client_request_burst: u32,
    /// Bytes a second one client may be sent; 0 = no limit (Squid's
    /// delay pools, nginx's `limit_rate`).
    pub client_bandwidth: Size,
    /// Bytes a client may be sent at once after a quiet spell: its
    /// bucket's size; 0 = one second's worth.
    pub client_bandwidth_burst: Size,
    /// Bytes a second all clients together may be sent; 0 = no limit
    /// (Squid's class 1 delay pool).
    pub total_bandwidth: Size,
    /// Bytes all clients may be sent at once after a quiet spell: the
    /// shared bucket's size; 0 = one second's worth.
    pub total_bandwidth_burst: Size,
    /// Clients the per-client tables have room for (their buckets, their
    /// connection counts), as nginx sizes a `limit_req` zone.
    pub client_table: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_line: Size(8 << 10),
            max_header_size: Size(64 << 10),
            max_headers: 100,
            header_timeout: Dur::secs(10),
            max_body_size: Size(0),
            send_timeout: Dur::secs(60),
            max_connections_per_client: 0,
            client_request_rate: 0,
            client_request_burst: 0,
            client_bandwidth: Size(0),
            client_bandwidth_burst: Size(0),
            total_bandwidth: Size(0),
            total_bandwidth_burst: Size(0),
            client_table: 1 << 18,
        }
    }
}

/// What to do with `X-Forwarded-For` on requests sent upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForwardedFor {
    /// Append the client address to any value the client sent.
    Append,
    /// Replace any value with the client address alone.
    Replace,
    /// Remove the header (hide clients from origins).
    Remove,
    /// Forward whatever the client sent, unchanged.
    Pass,
}

/// A port or an inclusive range of ports: `80` or `"1025-65535"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange(pub u16, pub u16);

impl PortRange {
    /// Whether `port` is in the range.
    pub fn contains(self, port: u16) -> bool {
        (self.0..=self.1).contains(&port)
    }
}

impl Serialize for PortRange {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 == self.1 {
            s.serialize_u16(self.0)
        } else {
            s.collect_str(&format_args!("{}-{}", self.0, self.1))
        }
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = PortRange;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a port (80) or a range of ports (\"1025-65535\")")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<PortRange, E> {
                u16::try_from(v)
                    .ok()
                    .filter(|&p| p > 0)
                    .map(|p| PortRange(p, p))
                    .ok_or_else(|| E::custom(format!("{v} is not a port (1 to 65535)")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PortRange, E> {
                let port = |s: &str| s.trim().parse::<u16>().ok().filter(|&p| p > 0);
                let (lo, hi) = match v.split_once('-') {
                    Some((a, b)) => (port(a), port(b)),
                    None => (port(v), port(v)),
                };
                match (lo, hi) {
                    (Some(lo), Some(hi)) if lo <= hi => Ok(PortRange(lo, hi)),
                    _ => Err(E::custom(format!(
                        "{v:?} is not a port or a range of ports such as \"1025-65535\""
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `[proxy]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// The pseudonym in the `Via` header Portico adds (`Via: 1.1 <via>`).
    pub via: String,
    /// X-Forwarded-For handling: append | replace | remove | pass.
    pub x_forwarded_for: ForwardedFor,
    /// Ports CONNECT may open tunnels to; others get 403.
    pub connect_ports: Vec<u16>,
    /// Ports a forward or transparent request's URL may name (Squid's
    /// `Safe_ports`); others get 403.
    pub http_ports: Vec<PortRange>,
    /// A CONNECT tunnel with no bytes either way for this long is closed
    /// (an upgraded connection too).
    pub tunnel_idle_timeout: Dur,
    /// Protocols a client may upgrade to through Portico (RFC 9110 7.8;
    /// Squid's `http_upgrade_request_protocols`): `name` (any version) or
    /// `name/version`. Other offers are removed from the request.
    pub upgrade_protocols: Vec<String>,
    /// Whether TRACE is served (answered here at `Max-Forwards: 0`, else
    /// forwarded); off, it gets 405. Off by default: TRACE echoes the
    /// request's fields back, credentials and cookies included when an
    /// origin answers it (cross-site tracing), and nginx refuses it too.
    pub allow_trace: bool,
    /// Addresses a client-chosen destination (a forward or transparent
    /// request's origin, a `CONNECT` or SOCKS target) may not resolve to
    /// (Squid's `to_localhost` and `to_linklocal`): refused with 403.
    #[serde(deserialize_with = "networks")]
    pub deny_destinations: Vec<IpNet>,
    /// Exceptions to `deny_destinations`.
    #[serde(deserialize_with = "networks")]
    pub allow_destinations: Vec<IpNet>,
}

/// The default `[proxy] deny_destinations`: the addresses a connection
/// reaches this host by without naming loopback ("this network",
/// `0.0.0.0/8`, and `::`, which Linux connects to the host itself) and the
/// link-local networks, where cloud providers serve instance credentials
/// (`169.254.169.254`). Loopback is not in it: the embedded `access.allow`
/// admits only this host's own users, who reach its loopback services
/// without a proxy. `portico check` warns when `access.allow` admits other
/// machines and loopback is not refused.
fn default_deny_destinations() -> Vec<IpNet> {
    ["0.0.0.0/8", "169.254.0.0/16", "::/128", "fe80::/10"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            via: "portico".to_string(),
            x_forwarded_for: ForwardedFor::Append,
            connect_ports: vec![443],
            http_ports: [80, 280, 443, 591, 777]
                .into_iter()
                .map(|p| PortRange(p, p))
                .chain([PortRange(1025, 65535)])
                .collect(),
            tunnel_idle_timeout: Dur::secs(300),
            upgrade_protocols: vec!["websocket".to_string()],
            allow_trace: false,
            deny_destinations: default_deny_destinations(),
            allow_destinations: Vec::new(),
        }
    }
}

/// `[origin]`: settings for connections to origin servers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    /// Time allowed to resolve and connect (and finish TLS) to an origin (504 beyond it).
    pub connect_timeout: Dur,
    /// Time allowed from the end of the request (head, or body when it has
    /// one) until the response head arrives (504 beyond it).
    pub first_byte_timeout: Dur,
    /// Longest silence allowed while a response body is arriving.
    pub idle_timeout: Dur,
    /// How long an idle pooled connection to an origin is kept.
    pub pool_idle_timeout: Dur,
    /// Idle pooled connections kept per origin.
    pub pool_max_idle: usize,
    /// Connections in use at once per server connected to (an origin, a
    /// parent, an array member); 0 = no cap.
    pub max_connections: usize,
    /// Longest wait for one of those when all are in use (503 beyond it).
    pub queue_timeout: Dur,
    /// Drop a request from that wait when its client goes away (HAProxy's
    /// `option abortonclose`); false: send it in its turn anyway.
    pub abort_on_close: bool,
    /// Trust the system's root certificates for https origins.
    pub system_roots: bool,
    /// Extra PEM certificates trusted for https origins.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Origin names whose addresses are cached (for their DNS lifetime); 0 = no cache.
    pub dns_cache_entries: usize,
    /// Name servers (`"ip:port"`) asked for origin addresses instead of the
    /// system's (`/etc/resolv.conf`); empty = the system's.
    pub nameservers: Vec<SocketAddr>,
    /// Fixed addresses for origin names, answered without any DNS query
    /// (`"name" = "192.0.2.7"` or a list of addresses).
    #[serde(
        default,
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        deserialize_with = "host_table"
    )]
    pub hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            connect_timeout: Dur::secs(10),
            first_byte_timeout: Dur::secs(60),
            idle_timeout: Dur::secs(60),
            pool_idle_timeout: Dur::secs(90),
            pool_max_idle: 64,
            max_connections: 0,
            queue_timeout: Dur::secs(10),
            abort_on_close: true,
            system_roots: true,
            ca_file: None,
            dns_cache_entries: 1024,
            nameservers: Vec::new(),
            hosts: std::collections::BTreeMap::new(),
        }
    }
}

/// `hosts = { "name" = "ip", "other" = ["ip", "ip"] }` in `[origin]`: names
/// are kept in lower case without a trailing dot (DNS names are
/// case-insensitive, and `name.` is the same name as `name`).
fn host_table<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, Vec<std::net::IpAddr>>, D::Error> {
    use serde::de::Error;
    /// One address or a list of them.
    #[derive(Deserialize)]
    struct Addrs(#[serde(deserialize_with = "one_or_many")] Vec<String>);
    let raw = std::collections::BTreeMap::<String, Addrs>::deserialize(d)?;
    let mut table = std::collections::BTreeMap::new();
    for (name, Addrs(list)) in raw {
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        if key.is_empty() || key.parse::<std::net::IpAddr>().is_ok() || key.contains(|c: char| c.is_whitespace()) {
            return Err(D::Error::custom(format!(
                "invalid host name {name:?} in origin.hosts: write a name (\"origin.example\")"
            )));
        }
        if list.is_empty() {
            return Err(D::Error::custom(format!("origin.hosts: no address for {name:?}")));
        }
        let ips = list
            .iter()
            .map(|t| {
                t.trim().parse::<std::net::IpAddr>().map_err(|_| {
                    D::Error::custom(format!(
                        "invalid address {t:?} for {name:?} in origin.hosts: write an IP address (\"192.0.2.7\", \"::1\")"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        table.insert(key, ips);
    }
    Ok(table)
}

/// How the `Host` header is set on requests to an upstream group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostHeader {
    /// Keep the client's `Host` (name-based virtual hosts on the origin).
    Preserve,
    /// Set `Host` to the chosen server's address.
    Rewrite,
}

/// `[[upstream]]`: a named group of origin servers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// The name rules refer to.
    pub name: String,
    /// Servers as `host:port`, `http://host:port` or `https://host:port`.
    pub servers: Vec<String>,
    /// preserve | rewrite.
    #[serde(default = "default_host_header")]
    pub host_header: HostHeader,
    /// How long a server that failed to connect is skipped.
    #[serde(default = "default_down_time")]
    pub down_time: Dur,
    /// Retry idempotent requests without a body once on another server when a connect fails.
    #[serde(default = "default_true")]
    pub retry: bool,
    /// The servers are parent proxies, not origins: requests go to them in
    /// absolute form (`GET http://origin/path`), CONNECT tunnels through them.
    #[serde(default, skip_serializing_if = "is_false")]
    pub parent: bool,
    /// For a parent group: a file of `user:password` sent to its servers as
    /// `Proxy-Authorization` (Squid's `cache_peer ... login=user:password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<std::path::PathBuf>,
    /// Connections in use at once to each of the group's servers, counted
    /// for this group's requests; unset: `origin.max_connections`; 0: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
}

fn default_host_header() -> HostHeader {
    HostHeader::Preserve
}
fn default_down_time() -> Dur {
    Dur::secs(10)
}
fn default_true() -> bool {
    true
}

/// `[[rule]]`: a routing rule. Rules are tried in file order and the first
/// that matches wins (`continue = true` lets a rule add its actions and go
/// on). Every matcher is optional; those given must all match. See
/// docs/CONFIG.md and `crate::rules`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Host to match: exact (`www.example.com`), wildcard (`*.example.com`) or `*`; absent = any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Path prefix to match; absent = any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Regular expression matched against the path and query (`/a/b?x=1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Request methods, any of which matches (`"GET"` or `["GET", "HEAD"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub method: Vec<String>,
    /// URL schemes, any of which matches (`"http"`, `"https"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub scheme: Vec<String>,
    /// URL ports (explicit, or 80/443 by scheme), any of which matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub port: Vec<u16>,
    /// Client networks (CIDR or addresses), any of which matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "client_networks")]
    pub client: Vec<IpNet>,
    /// Listener modes, any of which matches (`"reverse"`, `["forward", "transparent"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub mode: Vec<Mode>,
    /// Request header conditions, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub header: Vec<HeaderMatchConfig>,
    /// After this rule's actions, go on with the next rules.
    #[serde(default, rename = "continue", skip_serializing_if = "is_false")]
    pub continue_: bool,
    /// The `[[upstream]]` group that serves matching requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Rewrite of the path and query sent upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<RewriteConfig>,
    /// Request header fields set or removed before the request goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderEditConfig>,
    /// Response header fields set or removed before the response goes to the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderEditConfig>,
    /// Cache settings for this route, overriding `[cache]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheOverrides>,
    /// Performance bucket the request is timed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// Body of the 503 busy response for requests on this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_body: Option<String>,
    /// Answer with this error status instead of serving the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<u16>,
    /// Answer with a redirect instead of serving the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<RedirectConfig>,
    /// `pass`: the client's `Proxy-Authorization` goes on to the rule's
    /// parent group (Squid's `login=PASS`); `strip` (the default) removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_credentials: Option<ParentCredentials>,
    /// Bytes a second each response to a matching request may be sent
    /// (nginx's `limit_rate` in a `location`); `0`: no such limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Size>,
    /// Bytes of each response sent before `bandwidth` applies (nginx's
    /// `limit_rate_after`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_after: Option<Size>,
    /// Requests a second one client may make to the route (nginx's
    /// `limit_req` in a `location`); `0`: no such limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<u32>,
    /// The size of each client's bucket on the route (`0`: the rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_burst: Option<u32>,
    /// Requests a second all clients together may make to the route
    /// (nginx's `limit_req` keyed by `$server_name`); `0`: no such limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_request_rate: Option<u32>,
    /// The size of the route's one bucket for all clients (`0`: the rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_request_burst: Option<u32>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `[[rule]] parent_credentials`: what becomes of the client's
/// `Proxy-Authorization` on the way to a parent proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParentCredentials {
    /// Sent on to the parent (never to an origin).
    Pass,
    /// Removed, like every hop-by-hop field (the default).
    Strip,
}

/// `header = { name = "X", value = "v" }` in a `[[rule]]`: presence when
/// neither `value` nor `regex` is given.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatchConfig {
    /// Header field name (case-insensitive).
    pub name: String,
    /// Exact value one of the fields must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Regular expression one of the field values must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// `rewrite = { regex = "...", to = "..." }` in a `[[rule]]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewriteConfig {
    /// The part of the path and query to replace; absent = the rule's `regex`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Replacement; `$1`, `${name}` insert captures.
    pub to: String,
}

/// `request_headers` / `response_headers = { set = {...}, remove = [...] }`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEditConfig {
    /// Fields to set (replacing any of the same name).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub set: std::collections::BTreeMap<String, String>,
    /// Fields to remove (applied before `set`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// `redirect = { to = "...", status = 302 }` in a `[[rule]]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectConfig {
    /// The `Location`; `$1`, `${name}` insert captures of the rule's `regex`.
    pub to: String,
    /// 301, 302, 303, 307 or 308.
    #[serde(default = "default_redirect_status")]
    pub status: u16,
}

fn default_redirect_status() -> u16 {
    302
}

/// A value or a list of values (`method = "GET"` or `method = ["GET", "HEAD"]`).
fn one_or_many<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::{self, IntoDeserializer, MapAccess, SeqAccess, Visitor};
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a value or a list of values")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(v) = seq.next_element()? {
                out.push(v);
            }
            Ok(out)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|v| vec![v])
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<T>, E> {
            T::deserialize(v.into_deserializer()).map(|v| vec![v])
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Vec<T>, E> {
            T::deserialize(v.into_deserializer()).map(|v| vec![v])
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Vec<T>, E> {
            T::deserialize(v.into_deserializer()).map(|v| vec![v])
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Vec<T>, E> {
            T::deserialize(v.into_deserializer()).map(|v| vec![v])
        }
    }
    d.deserialize_any(V(std::marker::PhantomData))
}

/// One network: CIDR, or a single address taken as /32 or /128.
fn parse_network(text: &str) -> Result<IpNet, String> {
    let t = text.trim();
    t.parse::<IpNet>()
        .or_else(|_| t.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!("invalid network {text:?}: write an address (\"192.0.2.7\", \"::1\") or CIDR (\"10.0.0.0/8\")")
        })
}

/// `client = "10.0.0.0/8"` or a list, as `[access] allow`.
fn client_networks<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let items: Vec<String> = one_or_many(d)?;
    items
        .iter()
        .map(|t| parse_network(t).map_err(serde::de::Error::custom))
        .collect()
}

/// Per-route cache settings (`cache = { ... }` in a `[[rule]]`); each key
/// left out keeps the `[cache]` value.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheOverrides {
    /// `false`: requests on this route bypass the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// As `cache.ignore_reload`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_reload: Option<bool>,
    /// As `cache.ignore_no_store`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_no_store: Option<bool>,
    /// As `cache.cache_query`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_query: Option<bool>,
    /// As `cache.min_ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ttl: Option<Dur>,
    /// As `cache.max_ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ttl: Option<Dur>,
    /// As `cache.set_cookie`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_cookie: Option<SetCookie>,
    /// As `cache.max_stale_on_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stale_on_error: Option<Dur>,
    /// As `cache.targeted_fields`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targeted_fields: Option<Vec<String>>,
    /// As `cache.strip_targeted_fields`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_targeted_fields: Option<bool>,
    /// As `cache.slice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice: Option<Size>,
}

impl CacheOverrides {
    /// `base` with these overrides applied.
    pub fn apply(&self, base: &CacheConfig) -> CacheConfig {
        let mut c = base.clone();
        if let Some(v) = self.enabled {
            c.enabled = v;
        }
        if let Some(v) = self.ignore_reload {
            c.ignore_reload = v;
        }
        if let Some(v) = self.ignore_no_store {
            c.ignore_no_store = v;
        }
        if let Some(v) = self.cache_query {
            c.cache_query = v;
        }
        if let Some(v) = self.min_ttl {
            c.min_ttl = v;
        }
        if let Some(v) = self.max_ttl {
            c.max_ttl = v;
        }
        if let Some(v) = self.set_cookie {
            c.set_cookie = v;
        }
        if let Some(v) = self.max_stale_on_error {
            c.max_stale_on_error = v;
        }
        if let Some(v) = &self.targeted_fields {
            c.targeted_fields = v.clone();
        }
        if let Some(v) = self.strip_targeted_fields {
            c.strip_targeted_fields = v;
        }
        if let Some(v) = self.slice {
            c.slice = v;
        }
        c
    }
}

/// What the cache does with a response that carries `Set-Cookie` (a
/// cookie meant for the client the response was fetched for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SetCookie {
    /// Do not store it (nginx's and Varnish's default): every client
    /// fetches its own response, with its own cookie.
    NoStore,
    /// Store it without its `Set-Cookie`: the client that caused the fetch
    /// gets the cookie, later clients get the response without it.
    Strip,
    /// Store it with its `Set-Cookie`, which every later client then gets
    /// (RFC 9111 allows it).
    Store,
}

/// How the disk tier's garbage collector runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GcMode {
    /// A background task keeps disk use between the watermarks.
    Auto,
    /// No background task: run `portico cache gc` (e.g. from cron).
    Scheduled,
}

/// Which live objects the disk tier's garbage collector evicts first
/// (`cache.replacement`), as Squid's `cache_replacement_policy`: each object
/// has a priority, and the lowest goes first. `Frequency` (the default)
/// ranks by lookups counted in a sketch that halves itself; the three heap
/// policies set a priority when an object is stored and at every hit and
/// age it with a clock (Greedy-Dual: the clock rises to each evicted
/// priority), so an object once popular does not stay for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Replacement {
    /// GDSF with a per-byte term: priority = clock + (1 + hits) x (1 /
    /// blocks + 0.15). Small popular objects are kept first, as GDSF
    /// does, but a large one requested often still outlives a small
    /// one-hit wonder: most of GDSF's hit ratio and most of LFU-DA's byte
    /// hit ratio.
    Balanced,
    /// Greedy-Dual Size Frequency (Squid's `heap GDSF`): priority = clock +
    /// (1 + hits) / blocks. The best hit ratio (requests answered), at the
    /// cost of large objects and so of the byte hit ratio.
    Gdsf,
    /// LFU with dynamic aging (Squid's `heap LFUDA`): priority = clock +
    /// 1 + hits, whatever the size. The best byte hit ratio (bytes answered).
    Lfuda,
    /// Least recently used, every doubling of an object's hits worth one
    /// hour of recency (at most a day): Portico's policy before 2026-11.
    Lru,
    /// How often an object was asked for lately, stored or not (TinyLFU's
    /// count-min sketch of every lookup, halved every ten lookups per
    /// object the budget holds): priority = lookups x (1 / blocks + 0.5).
    /// No clock: the halving ages. An object evicted and asked for again
    /// keeps its history, which the heap policies' hit counts lose.
    Frequency,
}

/// When the disk tier calls fsync on a new object before publishing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fsync {
    /// Never: fastest; a crash may lose recent objects (never corrupt them:
    /// every object is checksummed and published by rename).
    Never,
    /// Before the rename that publishes each object.
    Always,
}

/// Where the disk tier's file work (opens, body reads and writes, commits)
/// runs (`cache.file_io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileIo {
    /// `inline` when the cache directory is on a file system held in
    /// memory (tmpfs, ramfs), `pool` otherwise.
    Auto,
    /// On the blocking pool's threads: a file operation that waits for
    /// the device never holds up the connections of a worker thread.
    Pool,
    /// On the worker thread that needs it, as nginx does its cache file
    /// I/O: no hand-off to another thread and back, but a slow device
    /// stalls every connection of that thread.
    Inline,
}

/// A Squid-style refresh pattern: heuristic freshness for responses that
/// carry `Last-Modified` but no explicit lifetime.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshPattern {
    /// Regular expression matched against the cache key URL.
    pub pattern: String,
    /// Lifetime never below this.
    pub min: Dur,
    /// Lifetime = this percentage of the time since `Last-Modified`.
    pub percent: u32,
    /// Lifetime never above this.
    pub max: Dur,
}

/// `[cache]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Cache responses at all.
    pub enabled: bool,
    /// Memory tier budget of each process (default: 1/16 of the machine's
    /// RAM, at most 4GiB, divided among `server.processes`).
    pub memory: Size,
    /// `memory` was not written in the file: it is the machine-derived
    /// default (see `memory::note`). Not a key.
    #[serde(skip)]
    pub memory_derived: bool,
    /// Largest object admitted to the memory tier.
    pub max_memory_object: Size,
    /// Disk tier directory (relative to the working directory).
    pub dir: PathBuf,
    /// Disk tier budget; 0 disables the disk tier.
    pub disk: Size,
    /// Disk tier files kept open between hits (nginx's `open_file_cache
    /// max=`); 0 = derived from the open-files limit (`sizing::resolve`).
    pub open_files: usize,
    /// Largest object stored at all.
    pub max_object_size: Size,
    /// Directory levels under `dir`: first-level and second-level directory counts.
    pub levels: [u16; 2],
    /// auto | scheduled.
    pub gc: GcMode,
    /// Low and high watermarks, percent of `disk`: GC starts above high and stops at low.
    pub watermarks: [u8; 2],
    /// Which live objects the disk tier's GC evicts first: frequency | balanced | gdsf | lfuda | lru.
    pub replacement: Replacement,
    /// never | always.
    pub fsync: Fsync,
    /// Where the disk tier's file work runs: auto | pool | inline.
    pub file_io: FileIo,
    /// Heuristic freshness rules, first match wins; a URL no pattern
    /// matches gets the default heuristic below.
    pub refresh: Vec<RefreshPattern>,
    /// Default heuristic freshness (RFC 9111 4.2.2): this percentage of the
    /// time since `Last-Modified`; 0 = none.
    pub heuristic_percent: u32,
    /// Cap of the default heuristic freshness.
    pub heuristic_max: Dur,
    /// Name of the response header saying HIT, MISS, STALE or REVALIDATED; empty = none.
    pub status_header: String,
    /// This cache's identifier in an RFC 9211 `Cache-Status` member added
    /// to the responses it handles (a structured-field token, such as the
    /// host name); empty = no `Cache-Status`.
    pub cache_status: String,
    /// Override (breaks RFC 9111): ignore client `Cache-Control: no-cache` / `Pragma: no-cache`.
    pub ignore_reload: bool,
    /// Override (breaks RFC 9111): store responses marked `no-store` or `private`.
    pub ignore_no_store: bool,
    /// Cache responses to URLs with a query string.
    pub cache_query: bool,
    /// Leave the query string out of the cache key.
    pub ignore_query_in_key: bool,
    /// Override (breaks RFC 9111): freshness lifetime at least this.
    pub min_ttl: Dur,
    /// Override (breaks RFC 9111): freshness lifetime at most this; 0 = no limit.
    pub max_ttl: Dur,
    /// Responses with `Set-Cookie`: no-store | strip | store.
    pub set_cookie: SetCookie,
    /// How long past its expiry a stored response may be served when the
    /// origin cannot be reached or answers 500, 502, 503 or 504 (RFC 9111
    /// 4.2.4, as Squid's `max_stale`); 0 = only where `stale-if-error` says.
    pub max_stale_on_error: Dur,
    /// How long a request for a stale object waits for another request's
    /// revalidation of the same object (collapsed: one conditional request
    /// to the origin) before it revalidates for itself.
    pub revalidation_wait: Dur,
    /// Targeted cache-control fields (RFC 9213) obeyed on reverse
    /// listeners before `Cache-Control`, the first present and valid one
    /// winning; empty = none.
    pub targeted_fields: Vec<String>,
    /// Reverse listeners remove the `targeted_fields` from the responses
    /// they send from or through the cache.
    pub strip_targeted_fields: bool,
    /// Fetch and store objects in slices of this size (nginx's `slice`):
    /// a Range request costs the origin only the slices it touches; 0 = off.
    pub slice: Size,
    /// Whether a fetch every client has left is stopped unless it is
    /// nearly done (Squid's `quick_abort_*`); false finishes every fetch
    /// that is being stored (Squid's `quick_abort_min -1`).
    pub quick_abort: bool,
    /// A left fetch with at most this much to go is finished (Squid's
    /// `quick_abort_min`).
    pub quick_abort_min: Size,
    /// A left fetch with more than this to go is stopped (Squid's
    /// `quick_abort_max`).
    pub quick_abort_max: Size,
    /// Between the two, a left fetch at least this percent done is
    /// finished (Squid's `quick_abort_pct`).
    pub quick_abort_pct: u8,
    /// Most body bytes a stored miss reads from the origin ahead of its
    /// client (Squid's `read_ahead_gap`); 0: in step with it.
    pub read_ahead_gap: Size,
    /// Most body bytes all the misses of a worker process hold ahead of
    /// their clients.
    pub read_ahead_memory: Size,
    /// Which objects the memory tier takes (Squid's `memory_cache_mode`).
    pub memory_cache_mode: MemoryCacheMode,
}

/// `cache.memory_cache_mode`: which objects the memory tier takes, as
/// Squid's `memory_cache_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryCacheMode {
    /// Objects fetched from the origin as they are stored, and disk hits
    /// while the tier has room (the default).
    #[default]
    Always,
    /// Disk hits only: an object is stored on disk alone, and taken into
    /// memory when it is asked for again.
    Disk,
    /// Objects fetched from the origin only: disk hits are served from
    /// disk.
    Network,
}

/// `cache.read_ahead_gap`'s default: 1 MiB, most web objects.
pub const DEFAULT_READ_AHEAD_GAP: Size = Size(1 << 20);

/// 1/16 of physical memory, between 16MiB and 4GiB.
fn default_memory_budget() -> Size {
    // SAFETY: sysconf only reads system configuration; it has no
    // preconditions and returns -1 on error, which is handled.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let ram = if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        1 << 30
    };
    Size((ram / 16).clamp(16 << 20, 4 << 30) & !((1 << 20) - 1))
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            memory: default_memory_budget(),
            memory_derived: true,
            max_memory_object: Size(1 << 20),
            dir: PathBuf::from("portico-cache"),
            disk: Size(1 << 30),
            open_files: 0,
            max_object_size: Size(1 << 30),
            levels: [16, 256],
            gc: GcMode::Auto,
            watermarks: [97, 99],
            replacement: Replacement::Frequency,
            fsync: Fsync::Never,
            file_io: FileIo::Auto,
            refresh: Vec::new(),
            heuristic_percent: 10,
            heuristic_max: Dur::secs(86_400),
            status_header: "X-Cache".to_string(),
            cache_status: String::new(),
            ignore_reload: false,
            ignore_no_store: false,
            cache_query: true,
            ignore_query_in_key: false,
            min_ttl: Dur::secs(0),
            max_ttl: Dur::secs(0),
            set_cookie: SetCookie::NoStore,
            max_stale_on_error: Dur::secs(7 * 24 * 3600),
            revalidation_wait: Dur::secs(10),
            targeted_fields: vec!["CDN-Cache-Control".to_string()],
            strip_targeted_fields: false,
            slice: Size(0),
            quick_abort: true,
            quick_abort_min: Size(16 << 10),
            quick_abort_max: Size(16 << 10),
            quick_abort_pct: 95,
            read_ahead_gap: DEFAULT_READ_AHEAD_GAP,
            memory_cache_mode: MemoryCacheMode::Always,
            read_ahead_memory: Size(64 << 20),
        }
    }
}

/// Access log line formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// NCSA Combined Log Format (Common plus Referer and User-Agent).
    Combined,
    /// NCSA Common Log Format.
    Common,
    /// Squid's native format (time, elapsed, client, cache result/status, bytes, method, URL, ...).
    Squid,
    /// The `log.custom_format` string.
    Custom,
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Access log file; empty string disables it.
    pub access: PathBuf,
    /// combined | common | squid | custom.
    pub format: LogFormat,
    /// The line format when `format = "custom"` (`%h %t "%r" %s %b %D`...).
    pub custom_format: String,
    /// Log client host names (reverse DNS, cached) instead of addresses.
    pub resolve_clients: bool,
    /// Lines the access-log writer may have queued before new ones are
    /// dropped (and counted).
    pub access_queue: usize,
    /// Error log level: error | warn | info | debug | trace.
    pub level: String,
    /// Error log file; empty = standard error.
    pub error: PathBuf,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            access: PathBuf::from("access.log"),
            format: LogFormat::Combined,
            custom_format: "%h %l %u %t \"%r\" %>s %b %D %C".to_string(),
            resolve_clients: false,
            access_queue: crate::log::DEFAULT_QUEUE,
            level: "info".to_string(),
            error: PathBuf::new(),
        }
    }
}

/// `[monitor]`: statistics and the endpoints Portico answers itself
/// (admin clients only). An empty path disables that endpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// Per-stage timing (performance buckets) and latency histograms.
    pub enabled: bool,
    /// perfdump (plain text).
    pub perf: String,
    /// XML statistics.
    pub stats_xml: String,
    /// Prometheus exposition.
    pub metrics: String,
    /// Cache status and control.
    pub nsc: String,
    /// Live dashboard (HTML).
    pub dashboard: String,
    /// JSON statistics (the dashboard polls it).
    pub json: String,
    /// Host names the pages answer to besides addresses, `localhost` and
    /// the machine's own name (the defence against DNS rebinding).
    pub hosts: Vec<String>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            enabled: true,
            perf: "/.perf".to_string(),
            stats_xml: "/stats-xml".to_string(),
            metrics: "/metrics".to_string(),
            nsc: "/nsc".to_string(),
            dashboard: "/.dashboard".to_string(),
            json: "/.stats.json".to_string(),
            hosts: Vec::new(),
        }
    }
}

/// `[auth]`: RFC 7617 Basic authentication against an Apache htpasswd
/// file, and the user cache (the Sun proxy's ACL user cache). Off while
/// `htpasswd` is empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The realm named in the challenge (`Basic realm="..."`).
    pub realm: String,
    /// Apache htpasswd file of users; empty = authentication off.
    pub htpasswd: PathBuf,
    /// Apache AuthGroupFile (`group: user1 user2`); empty = no groups.
    pub groups: PathBuf,
    /// Every request on a proxy or reverse listener must carry valid credentials.
    pub required: bool,
    /// Users the cache holds (Sun: 200).
    pub max_users: usize,
    /// Groups kept per cached user (Sun: 4).
    pub max_groups_per_user: usize,
    /// How long a verified user is trusted from the cache (Sun: 120 s).
    pub max_age: Dur,
    /// How long a failed login is remembered, answered without verifying again.
    pub failed_ttl: Dur,
    /// `[auth.ldap]`: an LDAP directory instead of the htpasswd file.
    pub ldap: LdapConfig,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            realm: "Portico".to_string(),
            htpasswd: PathBuf::new(),
            groups: PathBuf::new(),
            required: false,
            max_users: 10_000,
            max_groups_per_user: 32,
            max_age: Dur::secs(300),
            failed_ttl: Dur::secs(10),
            ldap: LdapConfig::default(),
        }
    }
}

impl AuthConfig {
    /// True when `[auth]` names an htpasswd file or an LDAP directory.
    pub fn enabled(&self) -> bool {
        !self.htpasswd.as_os_str().is_empty() || self.ldap.enabled()
    }
}

/// `[auth.ldap]`: users and groups from an LDAP directory (RFC 4511), the
/// way the Sun proxy and Squid's `basic_ldap_auth` use one: the user's DN
/// is found by a search (or built from a template), the password is
/// checked by binding as that DN, groups are read by a search or from the
/// user's `memberOf`. Off while `url` is empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LdapConfig {
    /// `ldap://host[:port]` or `ldaps://host[:port]`; empty = off.
    pub url: String,
    /// Upgrade an `ldap://` connection with StartTLS before any bind.
    pub starttls: bool,
    /// PEM file of the CAs that sign the directory's certificate; empty =
    /// the system's roots.
    pub ca_file: PathBuf,
    /// The service account that searches; empty = anonymous searches.
    pub bind_dn: String,
    /// The service account's password (prefer `bind_password_file`).
    pub bind_password: String,
    /// File holding the service account's password (one line).
    pub bind_password_file: PathBuf,
    /// Where users are searched (subtree).
    pub base_dn: String,
    /// Search filter finding a user; `{user}` is the escaped user name.
    pub user_filter: String,
    /// The user's DN built from the name (`{user}`, escaped) instead of a search.
    pub dn_template: String,
    /// Attribute of the user's entry holding the name the access log and
    /// `[[acl]] user` entries see (the directory's spelling).
    pub user_attribute: String,
    /// Where groups are searched (subtree); empty = no group search.
    pub group_base: String,
    /// Filter finding a user's groups: `{dn}` the user's DN, `{user}` the
    /// name; empty = [`LdapConfig::DEFAULT_GROUP_FILTER`].
    pub group_filter: String,
    /// Attribute of a group entry that names it (what `[[acl]] group` matches).
    pub group_name_attribute: String,
    /// Read the groups from the user entry's `memberOf` attribute.
    pub member_of: bool,
    /// Limit on opening a connection (TCP, TLS, StartTLS).
    pub connect_timeout: Dur,
    /// Limit on each directory operation (bind, search).
    pub timeout: Dur,
    /// Most connections open to the directory at once.
    pub pool_size: usize,
}

impl Default for LdapConfig {
    fn default() -> Self {
        LdapConfig {
            url: String::new(),
            starttls: false,
            ca_file: PathBuf::new(),
            bind_dn: String::new(),
            bind_password: String::new(),
            bind_password_file: PathBuf::new(),
            base_dn: String::new(),
            user_filter: "(uid={user})".to_string(),
            dn_template: String::new(),
            user_attribute: "uid".to_string(),
            group_base: String::new(),
            group_filter: String::new(),
            group_name_attribute: "cn".to_string(),
            member_of: false,
            connect_timeout: Dur::secs(5),
            timeout: Dur::secs(5),
            pool_size: 4,
        }
    }
}

impl LdapConfig {
    /// The group filter when `group_filter` is empty: the three usual
    /// memberships, `groupOfNames`, `groupOfUniqueNames` and RFC 2307
    /// `posixGroup`.
    pub const DEFAULT_GROUP_FILTER: &str = "(|(member={dn})(uniqueMember={dn})(memberUid={user}))";

    /// The group filter in force.
    pub fn group_filter(&self) -> &str {
        if self.group_filter.is_empty() {
            Self::DEFAULT_GROUP_FILTER
        } else {
            &self.group_filter
        }
    }

    /// True when `[auth.ldap]` names a directory.
    pub fn enabled(&self) -> bool {
        !self.url.is_empty()
    }
}

impl Config {
    /// The files this configuration names that a reload reads again, each
    /// with what names it: read as `server.user` once a worker has
    /// switched to it (see `privdrop::unreadable_warnings`).
    pub fn files_read_on_reload(&self) -> Vec<(String, &std::path::Path)> {
        let mut files: Vec<(String, &std::path::Path)> = Vec::new();
        for l in &self.listener {
            files.push((format!("listener {} busy_file", l.address), &l.busy_file));
            for c in &l.certificate {
                files.push((format!("listener {} certificate cert", l.address), &c.cert));
                files.push((format!("listener {} certificate key", l.address), &c.key));
            }
        }
        for list in &self.acl_list {
            files.push((format!("acl_list {:?} file", list.name), &list.file));
        }
        if let Some(ca) = &self.origin.ca_file {
            files.push(("origin.ca_file".to_string(), ca));
        }
        files.push(("error_pages.directory".to_string(), &self.error_pages.directory));
        for u in &self.upstream {
            if let Some(f) = &u.credentials_file {
                files.push((format!("upstream {:?} credentials_file", u.name), f));
            }
        }
        files.push(("auth.htpasswd".to_string(), &self.auth.htpasswd));
        files.push(("auth.groups".to_string(), &self.auth.groups));
        files.push(("auth.ldap.ca_file".to_string(), &self.auth.ldap.ca_file));
        files.push((
            "auth.ldap.bind_password_file".to_string(),
            &self.auth.ldap.bind_password_file,
        ));
        files.retain(|(_, f)| !f.as_os_str().is_empty());
        files
    }

    /// The effective configuration as TOML, with every default filled in.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print config: {e}\n"))
    }
}

/// `[array]`: the members of a proxy array, among which CARP (the Cache
/// Array Routing Protocol, draft-vinod-carp-v1-03) divides the URLs, this
/// node's place in it, and the proxy auto-configuration (PAC) file served
/// at `pac_path`. Without `members`, the PAC file names this proxy alone.
/// See docs/CONFIG.md and `crate::array`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArrayConfig {
    /// The array's members, every node's own entry included; empty = no array.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<MemberConfig>>,
    /// This node's member: its `name`, or its `address`.
    #[serde(rename = "self")]
    pub self_: String,
    /// Path the PAC file is served at; "" = not served.
    pub pac_path: String,
    /// Hosts the PAC file sends DIRECT: networks (`10.0.0.0/8`), host names
    /// (`intranet.example`), domains (`.example.com`), shell patterns
    /// (`*.corp`) and `<local>` (host names without a dot).
    pub pac_direct: Vec<String>,
    /// End the PAC file's proxy list with DIRECT (used when every proxy is down).
    pub pac_fallback_direct: bool,
    /// Forward a GET or HEAD whose URL another member owns to that member
    /// (one hop, marked with `Portico-Array`); false = serve it here.
    pub forward: bool,
    /// How long a member whose connect failed (or whose probe failed) is
    /// left out of the CARP ranking, unless a probe finds it up sooner.
    pub down_time: Dur,
    /// How often each other member's address is probed (a TCP connect);
    /// also the probe's connect timeout. 0 = no probes.
    pub probe_interval: Dur,
}

impl Default for ArrayConfig {
    fn default() -> Self {
        ArrayConfig {
            members: None,
            self_: String::new(),
            pac_path: "/proxy.pac".to_string(),
            pac_direct: Vec::new(),
            pac_fallback_direct: false,
            forward: true,
            down_time: Dur::secs(30),
            probe_interval: Dur::secs(2),
        }
    }
}

/// One member of `[array] members`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    /// `host:port` clients and the other members reach its forward listener at.
    pub address: String,
    /// Its share of the URLs relative to the others' (CARP's load factor); positive.
    #[serde(default = "default_load_factor", deserialize_with = "load_factor")]
    pub load_factor: f64,
    /// The name CARP hashes; default: `address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl MemberConfig {
    /// The name CARP hashes for this member: `name`, else `address`.
    pub fn carp_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.address)
    }
}

fn default_load_factor() -> f64 {
    1.0
}

/// A load factor written as an integer (`2`) or a float (`1.5`).
fn load_factor<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Int(i64),
        Float(f64),
    }
    match Number::deserialize(d) {
        Ok(Number::Int(i)) => Ok(i as f64),
        Ok(Number::Float(f)) => Ok(f),
        Err(_) => Err(serde::de::Error::custom(
            "a load factor is a positive number (1, 2, 0.5)",
        )),
    }
}
