//! The statistics snapshot: plain data, read by every view (perfdump,
//! stats-xml, Prometheus, /nsc, JSON, the advisor). Sections fed by
//! subsystems that may be absent (connection queue, keep-alive manager,
//! blocking pool) are `Option`s: a view shows what exists.

use super::hist::HistSnapshot;
use serde::{Deserialize, Serialize};

/// Everything the views show, at one moment.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Whether per-stage timing and histograms are collected (`monitor.enabled`).
    pub stats_enabled: bool,
    /// Process and runtime.
    pub server: ServerInfo,
    /// Requests served (monitoring endpoints not included).
    pub requests: RequestStats,
    /// Requests in service (the Sun Java System Web Proxy Server 4's sessions / threads).
    pub sessions: SessionInfo,
    /// One per `[[listener]]`.
    pub listeners: Vec<ListenerInfo>,
    /// The connection queue (admission), when the server has one.
    pub connection_queue: Option<ConnectionQueueInfo>,
    /// Persistent connections.
    pub keepalive: KeepAliveInfo,
    /// The blocking pool (the Sun proxy's NativePool), when it reports.
    pub native_pool: Option<PoolInfo>,
    /// The HTTP cache; None when `cache.enabled = false`.
    pub cache: Option<CacheInfo>,
    /// Name resolution for origins.
    pub dns: DnsInfo,
    /// Requests to origins.
    pub upstream: UpstreamInfo,
    /// Performance buckets (empty while `monitor.enabled = false`).
    pub buckets: BucketReport,
    /// The access log writer.
    pub access_log: AccessLogInfo,
    /// Authentication and the user cache; None when `[auth]` is off.
    #[serde(default)]
    pub auth: Option<AuthInfo>,
    /// In a figure summed over worker processes (`server.processes > 1`):
    /// one entry per worker, counted or not; empty for one process's own
    /// figures. Not part of the serialized snapshot (the JSON document
    /// carries it at its top level).
    #[serde(skip)]
    pub processes: Vec<ProcessInfo>,
}

/// One worker process in a summed snapshot.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Worker index (0..N-1).
    pub index: usize,
    /// Process id (0 when unknown: no figures from it).
    pub pid: u32,
    /// Its figures are in the sum.
    pub counted: bool,
    /// `this process` (the one answering), `live`, or why it is left out
    /// (`no figures yet`, `figures 12 s old`, `pid 123 not running`, an unreadable file).
    pub status: String,
    /// Age of its figures, seconds (0 for the answering process).
    pub age_secs: f64,
    /// Its requests (`requests.total`).
    pub requests: u64,
    /// Its requests in service now.
    pub active: u64,
    /// Its resident memory, bytes.
    pub rss_bytes: u64,
    /// Its CPU time (user + system), seconds.
    pub cpu_secs: f64,
    /// Seconds since it started.
    pub uptime_secs: f64,
}

/// Process and runtime facts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerInfo {
    /// Portico's version.
    pub version: String,
    /// Process id.
    pub pid: u32,
    /// Worker process index in multi-process mode (None: single process).
    pub process_index: Option<usize>,
    /// Seconds since start.
    pub uptime_secs: f64,
    /// Unix time of the snapshot, seconds.
    pub time_unix: f64,
    /// Async runtime worker threads.
    pub workers: usize,
    /// OS threads of the process.
    pub threads: u64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
    /// CPU time in user mode, seconds.
    pub cpu_user_secs: f64,
    /// CPU time in kernel mode, seconds.
    pub cpu_system_secs: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// CPUs available.
    pub cpus: usize,
}

/// Request counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RequestStats {
    /// Requests answered (monitoring endpoints excluded).
    pub total: u64,
    /// By method (GET, HEAD, POST, PUT, DELETE, CONNECT, PURGE, other).
    pub by_method: Vec<(String, u64)>,
    /// By status class (1xx .. 5xx).
    pub by_status: Vec<(String, u64)>,
    /// By what the cache did (HIT, MISS, STALE, REVALIDATED, NONE); needs `monitor.enabled`.
    pub by_cache: Vec<(String, u64)>,
    /// Request body bytes received.
    pub bytes_in: u64,
    /// Response body bytes sent.
    pub bytes_out: u64,
    /// Requests answered by the monitoring endpoints.
    pub admin_requests: u64,
    /// Requests refused by the ACL (`[[acl]]` deny entries and `access.acl_default`).
    #[serde(default)]
    pub acl_denied: u64,
    /// Time from request head to logged, per request (needs `monitor.enabled`).
    pub response_time: HistSnapshot,
}

impl RequestStats {
    /// The count for `name` in one of the labelled lists.
    pub fn count(list: &[(String, u64)], name: &str) -> u64 {
        list.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
    }
}

/// Requests in service.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionInfo {
    /// In service now.
    pub active: u64,
    /// Most in service at once.
    pub peak: u64,
    /// Admission limit (`server.max_requests`), when admission exists.
    pub limit: Option<u64>,
    /// Requests that had to wait for admission, when admission exists.
    pub waited: Option<u64>,
}

/// One listening socket.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ListenerInfo {
    /// `ls1`, `ls2`, ... in config order.
    pub name: String,
    /// `http://ip:port`.
    pub address: String,
    /// forward | reverse | transparent.
    pub mode: String,
    /// Tasks accepting on it (one accept loop per listener).
    pub acceptor_threads: u64,
    /// listen(2) backlog in effect: `listen_queue` truncated to the
    /// kernel's `net.core.somaxconn`.
    pub listen_queue: u64,
    /// `listen_queue` as configured (above `listen_queue` when the kernel
    /// caps it).
    #[serde(default)]
    pub listen_queue_configured: u64,
    /// Requests received on it.
    pub requests: u64,
}

/// The connection queue (the Sun proxy's ConnectionQueue).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConnectionQueueInfo {
    /// Connections waiting now.
    pub current: u64,
    /// Most waiting at once.
    pub peak: u64,
    /// Most allowed to wait.
    pub limit: u64,
    /// Connections ever queued.
    pub total_queued: u64,
    /// Connections refused because the queue was full (503).
    pub overflows: u64,
    /// Queued requests whose client went away before admission.
    pub abandoned: u64,
    /// Total time spent queued, microseconds.
    pub queue_time_us: u64,
    /// Average queue length over 1, 5 and 15 minutes.
    pub avg_1: f64,
    /// See `avg_1`.
    pub avg_5: f64,
    /// See `avg_1`.
    pub avg_15: f64,
}

impl ConnectionQueueInfo {
    /// Average queueing delay in milliseconds.
    pub fn avg_delay_ms(&self) -> f64 {
        if self.total_queued == 0 {
            0.0
        } else {
            self.queue_time_us as f64 / self.total_queued as f64 / 1000.0
        }
    }
}

/// Persistent connections (the Sun proxy's KeepAliveInfo). Fields the server
/// cannot count yet are None.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KeepAliveInfo {
    /// Idle persistent connections now.
    pub count: Option<u64>,
    /// Most idle persistent connections allowed.
    pub max: Option<u64>,
    /// Requests received on a connection kept alive.
    pub hits: u64,
    /// Idle connections closed to make room (oldest first).
    pub flushes: Option<u64>,
    /// Connections not kept alive because the limit was reached.
    pub refusals: Option<u64>,
    /// Idle connections closed by the timeout.
    pub timeouts: Option<u64>,
    /// Connections closed because a request head did not arrive in time (slowloris).
    pub header_timeouts: Option<u64>,
    /// Connections closed because the client accepted no response bytes
    /// for `limits.send_timeout` (a client that does not read).
    #[serde(default)]
    pub send_timeouts: Option<u64>,
    /// Of `count`, those held by the keep-alive poller now (idle past
    /// `keepalive.park_after`); None without a poller.
    #[serde(default)]
    pub parked: Option<u64>,
    /// New connections (no request yet) held by the keep-alive poller now.
    #[serde(default)]
    pub parked_new: Option<u64>,
    /// Connections handed to the keep-alive poller since start.
    #[serde(default)]
    pub parks: Option<u64>,
    /// The idle timeout, seconds.
    pub timeout_secs: f64,
    /// Requests per connection (0 = unlimited).
    pub max_requests: u64,
}

/// A thread pool (the Sun proxy's NativePool).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolInfo {
    /// Pool name.
    pub name: String,
    /// Idle threads.
    pub idle: u64,
    /// Threads alive now.
    pub threads: u64,
    /// Most threads at once.
    pub peak: u64,
    /// Most threads allowed.
    pub limit: u64,
    /// Work waiting for a thread now.
    pub queue: u64,
    /// Most work waiting at once.
    pub queue_peak: u64,
    /// Most work allowed to wait.
    pub queue_limit: u64,
    /// Jobs accepted since start.
    pub jobs: u64,
    /// Jobs refused because the queue was full (busy 503).
    pub refused: u64,
}

/// The HTTP cache.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CacheInfo {
    /// Serving and storing (false after `/nsc?stop`).
    pub running: bool,
    /// Lookups of cacheable requests.
    pub lookups: u64,
    /// Served fresh from the cache.
    pub hits: u64,
    /// Not in the cache.
    pub misses: u64,
    /// Served stale.
    pub stale: u64,
    /// Conditional requests to origins.
    pub revalidations: u64,
    /// Requests that shared another request's fetch.
    pub collapsed: u64,
    /// Objects stored.
    pub stored: u64,
    /// Objects removed by invalidation or purge.
    pub invalidated: u64,
    /// Body bytes served from the cache.
    pub bytes_served: u64,
    /// Body bytes fetched from origins after misses.
    pub bytes_fetched: u64,
    /// Objects in the memory tier.
    pub memory_entries: u64,
    /// Bytes in the memory tier.
    pub memory_bytes: u64,
    /// Memory tier budget, bytes.
    pub memory_limit: u64,
    /// Largest object admitted to memory.
    pub max_memory_object: u64,
    /// The disk tier, if enabled.
    pub disk: Option<DiskInfo>,
    /// `cache.max_ttl` in seconds (0 = no limit).
    pub max_age_secs: u64,
    /// `cache.min_ttl` in seconds.
    pub min_age_secs: u64,
}

impl CacheInfo {
    /// hits / lookups, percent.
    pub fn hit_ratio(&self) -> f64 {
        percent(self.hits, self.lookups)
    }

    /// Bytes served from the cache / (those + bytes fetched after misses), percent.
    pub fn byte_hit_ratio(&self) -> f64 {
        percent(self.bytes_served, self.bytes_served + self.bytes_fetched)
    }
}

/// The disk tier.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DiskInfo {
    /// Directory.
    pub dir: String,
    /// Objects stored.
    pub objects: u64,
    /// Bytes stored.
    pub bytes: u64,
    /// Budget, bytes.
    pub limit: u64,
    /// GC starts above this many bytes.
    pub high_watermark: u64,
    /// GC stops at this many bytes.
    pub low_watermark: u64,
    /// Objects read.
    pub reads: u64,
    /// Lookups that found no file.
    pub misses: u64,
    /// Objects written.
    pub writes: u64,
    /// Writes abandoned.
    pub write_aborts: u64,
    /// Objects evicted by GC.
    pub evictions: u64,
    /// GC runs.
    pub gc_runs: u64,
    /// Checksum failures.
    pub checksum_failures: u64,
    /// Corrupt files removed.
    pub corrupt_removed: u64,
    /// Index rebuild finished.
    pub index_ready: bool,
}

/// Name resolution (the Sun proxy's HostDNSCacheInfo).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DnsInfo {
    /// The cache is on.
    pub enabled: bool,
    /// Names cached now.
    pub entries: u64,
    /// Most names cached.
    pub max_entries: u64,
    /// Names looked up (IP literals excluded).
    pub lookups: u64,
    /// Answered from the cache.
    pub hits: u64,
    /// Lookups that failed.
    pub failures: u64,
}

impl DnsInfo {
    /// hits / lookups, percent.
    pub fn hit_ratio(&self) -> f64 {
        percent(self.hits, self.lookups)
    }
}

/// Authentication (`[auth]`) and the user cache (the Sun proxy's ACL
/// user cache).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuthInfo {
    /// Users in the cache now.
    pub users: u64,
    /// Most users the cache holds (`auth.max_users`).
    pub max_users: u64,
    /// Credentials found in the cache, still valid.
    pub hits: u64,
    /// Credentials verified against the user file.
    pub misses: u64,
    /// Users dropped from the full cache to make room.
    pub evictions: u64,
    /// Verifications that failed (wrong password, unknown user).
    pub failures: u64,
    /// Failed logins answered from the failed-login cache (`auth.failed_ttl`).
    pub failed_cache_hits: u64,
    /// Requests answered 503 because the user file could not be used.
    pub unavailable: u64,
    /// Loads of the user file (start, change, SIGHUP).
    pub reloads: u64,
    /// The back-end is failing now (the user file missing or unreadable).
    pub failing: bool,
    /// Time to verify one password against the file.
    pub verify_time: HistSnapshot,
}

impl AuthInfo {
    /// hits / (hits + misses), percent.
    pub fn hit_ratio(&self) -> f64 {
        percent(self.hits, self.hits + self.misses)
    }
}

/// Requests to origins.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UpstreamInfo {
    /// Requests sent.
    pub requests: u64,
    /// Response heads received.
    pub responses: u64,
    /// New connections opened (pooled reuse not counted).
    pub connects: u64,
    /// Connects that failed: DNS.
    pub dns_errors: u64,
    /// Connects that failed: refused or unreachable.
    pub connect_errors: u64,
    /// Connects that timed out.
    pub connect_timeouts: u64,
    /// TLS handshakes that failed.
    pub tls_errors: u64,
    /// Response heads that did not arrive in time.
    pub response_timeouts: u64,
    /// Other failures before a response head.
    pub other_errors: u64,
    /// Time to open a connection.
    pub connect_time: HistSnapshot,
    /// Time from sending the request to the response head (including the
    /// connect when a new connection was opened; connect_time has that part).
    pub first_byte_time: HistSnapshot,
}

impl UpstreamInfo {
    /// All failures.
    pub fn errors(&self) -> u64 {
        self.dns_errors
            + self.connect_errors
            + self.connect_timeouts
            + self.tls_errors
            + self.response_timeouts
            + self.other_errors
    }
}

/// The access log.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AccessLogInfo {
    /// Writing at all.
    pub enabled: bool,
    /// Format name.
    pub format: String,
    /// Lines written.
    pub lines: u64,
    /// Lines dropped because the writer could not keep up.
    pub dropped: u64,
    /// Lines waiting for the writer now.
    pub queued: u64,
    /// Queue capacity.
    pub queue_limit: u64,
    /// Client addresses are logged as names (`log.resolve_clients`).
    pub resolve_clients: bool,
    /// Client names cached.
    pub client_dns_entries: u64,
    /// Most client names cached.
    pub client_dns_max_entries: u64,
    /// Client addresses looked up.
    pub client_dns_lookups: u64,
    /// Answered from the client-name cache.
    pub client_dns_hits: u64,
}

/// The performance buckets report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BucketReport {
    /// Requests timed.
    pub total_requests: u64,
    /// Their total processing time, nanoseconds.
    pub processing_ns: u64,
    /// `default-bucket` first, then named buckets in config order.
    pub buckets: Vec<BucketInfo>,
}

/// One bucket.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BucketInfo {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Requests that used it.
    pub requests: u64,
    /// Stage invocations.
    pub invocations: u64,
    /// Time before stages started (dispatch), nanoseconds.
    pub latency_ns: u64,
    /// Time inside stages, nanoseconds.
    pub function_ns: u64,
    /// Per stage.
    pub stages: Vec<StageInfo>,
}

/// One stage within a bucket.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StageInfo {
    /// Stage name.
    pub name: String,
    /// Times invoked.
    pub invocations: u64,
    /// Dispatch time, nanoseconds.
    pub latency_ns: u64,
    /// Time inside, nanoseconds.
    pub function_ns: u64,
}

/// `part / whole` in percent; 0 when `whole` is 0.
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}
