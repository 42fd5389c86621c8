//! The statistics snapshot: plain data, read by every view (perfdump,
//! stats-xml, Prometheus, /nsc, JSON, the advisor). Sections fed by
//! subsystems that may be absent (connection queue, keep-alive manager,
//! blocking pool) are `Option`s: a view shows what exists.
//!
//! Every figure is declared here once, with the [`section!`](crate::section)
//! macro (`stats::declare`): the struct, its JSON, its sum across worker
//! processes and its Prometheus and stats-xml names all come from that
//! declaration.

use super::hist::HistSnapshot;
use serde::{Deserialize, Serialize};

// Every figure below is declared once: see `stats::declare` for the
// grammar, and for how to add one. Sections then figures in the order the
// views show them.

crate::section! {
    /// Everything the views show, at one moment.
    pub struct Snapshot at "" {
        /// Whether per-stage timing and histograms are collected (`monitor.enabled`).
        stats_enabled: bool => Gauge, Any, None, "1 while per-stage timing and histograms are collected (monitor.enabled).",
            prom "portico_stats_enabled", xml "stats" "flagEnabled";
        /// Process and runtime.
        server: ServerInfo => Section, Add, None, "Process and runtime.";
        /// Requests served (monitoring endpoints not included).
        requests: RequestStats => Section, Add, None, "Requests served.";
        /// Requests in service (the Sun proxy's sessions / threads).
        sessions: SessionInfo => Section, Add, None, "Requests in service.";
        /// One per `[[listener]]`.
        listeners: Vec<ListenerInfo> => Section, Add, None, "One per [[listener]].";
        /// The connection queue (admission), when the server has one.
        connection_queue: Option<ConnectionQueueInfo> => Section, Add, None, "The connection queue.";
        /// Persistent connections.
        keepalive: KeepAliveInfo => Section, Add, None, "Persistent connections.";
        /// The blocking pool (the Sun proxy's NativePool), when it reports.
        native_pool: Option<PoolInfo> => Section, Add, None, "The blocking pool.";
        /// The HTTP cache; None when `cache.enabled = false`.
        cache: Option<CacheInfo> => Section, Add, None, "The HTTP cache.";
        /// Name resolution for origins.
        dns: DnsInfo => Section, Add, None, "Name resolution for origins.";
        /// Requests to origins.
        upstream: UpstreamInfo => Section, Add, None, "Requests to origins.";
        /// Performance buckets (empty while `monitor.enabled = false`).
        buckets: BucketReport => Section, Add, None, "Performance buckets.";
        /// The access log writer.
        access_log: AccessLogInfo => Section, Add, None, "The access log writer.";
        /// Authentication and the user cache; None when `[auth]` is off.
        #[serde(default)]
        auth: Option<AuthInfo> => Section, Add, None, "Authentication and the user cache.";
        /// TLS handshakes on the listeners with certificates.
        #[serde(default)]
        tls: TlsInfo => Section, Add, None, "TLS handshakes on client-facing listeners.";
        /// HTTP/2 client connections (ALPN `h2`, h2c).
        #[serde(default)]
        http2: Http2Info => Section, Add, None, "HTTP/2 client connections.";
        /// CONNECT tunnels (over HTTP/1 and HTTP/2).
        #[serde(default)]
        tunnels: TunnelInfo => Section, Add, None, "CONNECT tunnels.";
        /// The SOCKS server; None when no listener has `mode = "socks"`.
        #[serde(default)]
        socks: Option<SocksInfo> => Section, Add, None, "The SOCKS server.";
        /// The proxy array (`[array]` with members); None without one.
        #[serde(default)]
        array: Option<ArrayInfo> => Section, Add, None, "The proxy array.";
        /// In a figure summed over worker processes (`server.processes > 1`):
        /// one entry per worker, counted or not; empty for one process's own
        /// figures. Not part of the serialized snapshot (the JSON document
        /// carries it at its top level). Kept as the caller sets it.
        #[serde(skip)]
        processes: Vec<ProcessInfo> => Info, First, None, "One entry per worker process.";
    }
}

/// One worker process in a summed snapshot: per-worker facts, never summed
/// (the summing caller fills the list).
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

/// A per-worker list is not a figure: no view renders it generically.
impl super::declare::AsValue for Vec<ProcessInfo> {
    fn value(&self) -> super::declare::Value<'_> {
        super::declare::Value::Absent
    }
}

crate::section! {
    /// Process and runtime facts.
    pub struct ServerInfo at "server" {
        /// Portico's version.
        version: String => Info, First, None, "Portico's version.";
        /// Process id.
        pid: u32 => Info, First, None, "Process id.", xml "process" "pid";
        /// Worker process index in multi-process mode (None: single process).
        process_index: Option<usize> => Info, First, None, "Worker process index.", xml "process" "workerIndex";
        /// Seconds since start.
        uptime_secs: f64 => Gauge, Max, Seconds, "Seconds since the (oldest) process started.",
            prom "portico_uptime_seconds", xml "process" "secondsRunning";
        /// Unix time of the snapshot, seconds.
        time_unix: f64 => Info, First, Seconds, "Unix time of the snapshot.";
        /// Async runtime worker threads.
        workers: usize => Gauge, Add, None, "Async runtime worker threads.",
            prom "portico_workers", xml "thread" "countWorkers";
        /// OS threads of the process.
        threads: u64 => Gauge, Add, None, "OS threads of the process.",
            prom "portico_threads", xml "process" "countThreads";
        /// Resident memory, bytes.
        rss_bytes: u64 => Gauge, Add, Bytes, "Resident memory size in bytes.",
            prom "process_resident_memory_bytes", xml "process" "sizeResident";
        /// Peak resident memory, bytes (summed: see `sum.rs`).
        peak_rss_bytes: u64 => Gauge, Add, Bytes, "Peak resident memory size in bytes.",
            prom "portico_peak_resident_memory_bytes", xml "process" "sizePeakResident";
        /// CPU time in user mode, seconds.
        cpu_user_secs: f64 => Counter, Add, Seconds, "CPU time spent in user mode.",
            prom "portico_cpu_user_seconds_total", xml "process" "secondsUser";
        /// CPU time in kernel mode, seconds.
        cpu_system_secs: f64 => Counter, Add, Seconds, "CPU time spent in kernel mode.",
            prom "portico_cpu_system_seconds_total", xml "process" "secondsSystem";
        /// Open file descriptors.
        open_fds: u64 => Gauge, Add, None, "Number of open file descriptors.",
            prom "process_open_fds", xml "process" "countOpenFiles";
        /// CPUs available.
        cpus: usize => Gauge, Max, None, "CPUs available.",
            prom "portico_cpus", xml "process" "countCpus";
    }
}

crate::section! {
    /// Request counters.
    pub struct RequestStats at "requests" {
        /// Requests answered (monitoring endpoints excluded).
        total: u64 => Counter, Add, None, "Requests answered (monitoring endpoints excluded).",
            prom "portico_requests_answered_total", xml "request-bucket" "countRequests";
        /// By method (GET, HEAD, POST, PUT, DELETE, CONNECT, PURGE, other).
        by_method: Vec<(String, u64)> => Counter, Add, None, "Requests answered, by method.",
            prom "portico_requests_total" { "method" = "" };
        /// By status class (1xx .. 5xx).
        by_status: Vec<(String, u64)> => Counter, Add, None, "Responses, by status class.",
            prom "portico_responses_total" { "code" = "" };
        /// By what the cache did (HIT, MISS, STALE, REVALIDATED, COLLAPSED, NONE); needs `monitor.enabled`.
        by_cache: Vec<(String, u64)> => Counter, Add, None, "Requests by what the cache did (COLLAPSED: answered from another request's fetch after waiting for it; NONE: not cacheable or bypassed).",
            prom "portico_cache_requests_total" { "cache" = "" };
        /// Request body bytes received.
        bytes_in: u64 => Counter, Add, Bytes, "Request body bytes received.",
            prom "portico_received_body_bytes_total", xml "request-bucket" "countBytesReceived";
        /// Response body bytes sent.
        bytes_out: u64 => Counter, Add, Bytes, "Response body bytes sent.",
            prom "portico_sent_body_bytes_total", xml "request-bucket" "countBytesTransmitted";
        /// Requests answered by the monitoring endpoints.
        admin_requests: u64 => Counter, Add, None, "Requests answered by the monitoring endpoints.",
            prom "portico_admin_requests_total", xml "request-bucket" "countAdminRequests";
        /// Requests refused by the ACL (`[[acl]]` deny entries and `access.acl_default`).
        #[serde(default)]
        acl_denied: u64 => Counter, Add, None, "Requests refused by the access control list ([[acl]] deny entries and access.acl_default).",
            prom "portico_acl_denied_total", xml "request-bucket" "countAclDenied";
        /// Time from request head to logged, per request (needs `monitor.enabled`).
        response_time: HistSnapshot => Histogram, Add, Micros, "Time from request head to access log line.",
            prom "portico_response_seconds", xml "request-bucket" "meanResponseMicros";
    }
}

impl RequestStats {
    /// The count for `name` in one of the labelled lists.
    pub fn count(list: &[(String, u64)], name: &str) -> u64 {
        list.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
    }
}

crate::section! {
    /// Requests in service.
    pub struct SessionInfo at "sessions" {
        /// In service now.
        active: u64 => Gauge, Add, None, "Requests in service.",
            prom "portico_sessions_active", xml "thread" "countActiveSessions";
        /// Most in service at once (summed: see `sum.rs`).
        peak: u64 => Gauge, Add, None, "Most requests in service at once.",
            prom "portico_sessions_peak", xml "thread" "peakActiveSessions";
        /// Admission limit (`server.max_requests`), when admission exists.
        limit: Option<u64> => Gauge, Add, None, "Admission limit (server.max_requests).",
            prom "portico_sessions_limit", xml "thread" "maxActiveSessions";
        /// Requests that had to wait for admission, when admission exists.
        waited: Option<u64> => Counter, Add, None, "Requests that waited for admission.",
            prom "portico_sessions_waited_total", xml "thread" "countSessionsWaited";
    }
}

crate::section! {
    /// One listening socket. Its name and address label its figures.
    pub struct ListenerInfo at "listeners" {
        /// `ls1`, `ls2`, ... in config order.
        name: String => Info, First, None, "Listener name.", prom "listener", xml "listen-socket" "id";
        /// `http://ip:port`.
        address: String => Info, First, None, "Listener address.", prom "address", xml "listen-socket" "address";
        /// forward | reverse | transparent.
        mode: String => Info, First, None, "Listener mode.", xml "listen-socket" "mode";
        /// Tasks accepting on it (one accept loop per listener).
        acceptor_threads: u64 => Gauge, First, None, "Tasks accepting connections, by listener.",
            prom "portico_listener_acceptors", xml "listen-socket" "countAcceptors";
        /// listen(2) backlog in effect: `listen_queue` truncated to the
        /// kernel's `net.core.somaxconn`.
        listen_queue: u64 => Gauge, First, None, "listen(2) backlog in effect (after the kernel's somaxconn cap), by listener.",
            prom "portico_listener_listen_queue", xml "listen-socket" "listenQueue";
        /// `listen_queue` as configured (above `listen_queue` when the kernel
        /// caps it).
        #[serde(default)]
        listen_queue_configured: u64 => Gauge, First, None, "listen(2) backlog configured (listen_queue), by listener.",
            prom "portico_listener_listen_queue_configured", xml "listen-socket" "listenQueueConfigured";
        /// Requests received on it.
        requests: u64 => Counter, Add, None, "Requests received, by listener.",
            prom "portico_listener_requests_total", xml "listen-socket" "countRequests";
    }
}

impl super::declare::Keyed for ListenerInfo {
    fn key(&self) -> &str {
        &self.name
    }
}

crate::section! {
    /// The connection queue (the Sun proxy's ConnectionQueue).
    pub struct ConnectionQueueInfo at "connection_queue" {
        /// Connections waiting now.
        current: u64 => Gauge, Add, None, "Connections queued now.",
            prom "portico_connection_queue_length", xml "connection-queue-bucket" "countQueued";
        /// Most waiting at once (summed: see `sum.rs`).
        peak: u64 => Gauge, Add, None, "Most connections queued at once.",
            prom "portico_connection_queue_peak", xml "connection-queue-bucket" "peakQueued";
        /// Most allowed to wait.
        limit: u64 => Gauge, Add, None, "Connection queue size.",
            prom "portico_connection_queue_limit", xml "connection-queue-bucket" "maxQueued";
        /// Connections ever queued.
        total_queued: u64 => Counter, Add, None, "Connections ever queued.",
            prom "portico_connection_queue_queued_total", xml "connection-queue-bucket" "countTotalQueued";
        /// Connections refused because the queue was full (503).
        overflows: u64 => Counter, Add, None, "Connections refused with 503 because the queue was full.",
            prom "portico_connection_queue_overflows_total", xml "connection-queue-bucket" "countOverflows";
        /// Queued requests whose client went away before admission.
        abandoned: u64 => Counter, Add, None, "Queued requests whose client went away before admission.",
            prom "portico_connection_queue_abandoned_total", xml "connection-queue-bucket" "countAbandoned";
        /// Total time spent queued, microseconds.
        queue_time_us: u64 => Counter, Add, Micros, "Time connections spent queued.",
            prom "portico_connection_queue_wait_seconds_total", xml "connection-queue-bucket" "ticksTotalQueued";
        /// Average queue length over 1, 5 and 15 minutes (summed: the
        /// average of a sum is the sum of the averages).
        avg_1: f64 => Gauge, Add, None, QUEUE_AVERAGE,
            prom "portico_connection_queue_length_average" { "minutes" = "1" },
            xml "connection-queue-bucket" "countQueued1MinuteAverage";
        /// See `avg_1`.
        avg_5: f64 => Gauge, Add, None, QUEUE_AVERAGE,
            prom "portico_connection_queue_length_average" { "minutes" = "5" },
            xml "connection-queue-bucket" "countQueued5MinuteAverage";
        /// See `avg_1`.
        avg_15: f64 => Gauge, Add, None, QUEUE_AVERAGE,
            prom "portico_connection_queue_length_average" { "minutes" = "15" },
            xml "connection-queue-bucket" "countQueued15MinuteAverage";
        /// Requests admitted since start (with or without queueing).
        #[serde(default)]
        total_admitted: u64 => Counter, Add, None, "Requests admitted since start (with or without queueing).",
            prom "portico_connection_queue_admitted_total", xml "connection-queue-bucket" "countTotalAdmitted";
        /// Requests that found every slot taken and were answered from the
        /// cache without one, never queued (a GET or HEAD waits for a slot
        /// only where it must go upstream).
        #[serde(default)]
        unqueued_hits: u64 => Counter, Add, None, "Requests answered from the cache while every slot was taken, without queueing.",
            prom "portico_connection_queue_unqueued_hits_total", xml "connection-queue-bucket" "countUnqueuedHits";
        /// Requests admitted past a derived `server.max_requests` because
        /// descriptors were free (at once, or by a permit lent to the
        /// queue's head).
        #[serde(default)]
        admitted_beyond_limit: u64 => Counter, Add, None, "Requests admitted past a derived server.max_requests because file descriptors were free.",
            prom "portico_connection_queue_admitted_beyond_limit_total", xml "connection-queue-bucket" "countAdmittedBeyondLimit";
        /// Connections closed at accept because their client held
        /// `limits.max_connections_per_client` open already.
        #[serde(default)]
        client_limited: u64 => Counter, Add, None, "Connections closed at accept because their client had limits.max_connections_per_client open.",
            prom "portico_connection_queue_client_limited_total", xml "connection-queue-bucket" "countClientLimited";
        /// Requests answered 429 because their client was over
        /// `limits.client_request_rate`.
        #[serde(default)]
        client_rate_limited: u64 => Counter, Add, None, "Requests answered 429 because their client was over limits.client_request_rate.",
            prom "portico_connection_queue_client_rate_limited_total", xml "connection-queue-bucket" "countClientRateLimited";
        /// Requests answered 429 for their route's `request_rate`.
        #[serde(default)]
        route_rate_limited: u64 => Counter, Add, None, "Requests answered 429 because their client was over their route's request_rate ([[rule]] request_rate).",
            prom "portico_connection_queue_route_rate_limited_total", xml "connection-queue-bucket" "countRouteRateLimited";
        /// Requests answered 503 for their route's `total_request_rate`.
        #[serde(default)]
        route_total_rate_limited: u64 => Counter, Add, None, "Requests answered 503 because their route's total_request_rate for all clients was spent ([[rule]] total_request_rate).",
            prom "portico_connection_queue_route_total_rate_limited_total", xml "connection-queue-bucket" "countRouteTotalRateLimited";
        /// Per-client buckets (request rates, bandwidth) given to a new
        /// client while in use: `limits.client_table` is too small.
        #[serde(default)]
        client_table_evictions: u64 => Counter, Add, None, "Per-client buckets (request rates, bandwidth) given to a new client while still in use, for want of room in limits.client_table.",
            prom "portico_connection_queue_client_table_evictions_total", xml "connection-queue-bucket" "countClientTableEvictions";
        /// Connections counted by their worker process alone for want of
        /// room in the shared table of connection counts.
        #[serde(default)]
        connections_counted_apart: u64 => Counter, Add, None, "Connections counted against limits.max_connections_per_client by their worker process alone, for want of room in limits.client_table.",
            prom "portico_connection_queue_connections_counted_apart_total", xml "connection-queue-bucket" "countConnectionsCountedApart";
        /// Writes to clients that waited for `limits.client_bandwidth`.
        #[serde(default)]
        client_bandwidth_waits: u64 => Counter, Add, None, "Writes to clients that waited because their client was over limits.client_bandwidth.",
            prom "portico_connection_queue_client_bandwidth_waits_total", xml "connection-queue-bucket" "countClientBandwidthWaits";
        /// Microseconds those writes waited in all.
        #[serde(default)]
        client_bandwidth_wait_us: u64 => Counter, Add, Micros, "Time writes to clients waited for limits.client_bandwidth, in all.",
            prom "portico_connection_queue_client_bandwidth_wait_seconds_total", xml "connection-queue-bucket" "ticksClientBandwidthWait";
        /// Writes to clients that waited longer for `limits.total_bandwidth`
        /// than for their client's share.
        #[serde(default)]
        total_bandwidth_waits: u64 => Counter, Add, None, "Writes to clients that waited because all clients together were over limits.total_bandwidth.",
            prom "portico_connection_queue_total_bandwidth_waits_total", xml "connection-queue-bucket" "countTotalBandwidthWaits";
        /// Microseconds those writes waited in all.
        #[serde(default)]
        total_bandwidth_wait_us: u64 => Counter, Add, Micros, "Time writes to clients waited for limits.total_bandwidth, in all.",
            prom "portico_connection_queue_total_bandwidth_wait_seconds_total", xml "connection-queue-bucket" "ticksTotalBandwidthWait";
        /// Writes to clients that waited longer for their route's
        /// `bandwidth` than for the client's and the total's.
        #[serde(default)]
        route_bandwidth_waits: u64 => Counter, Add, None, "Writes to clients that waited because their response was over its route's bandwidth ([[rule]] bandwidth).",
            prom "portico_connection_queue_route_bandwidth_waits_total", xml "connection-queue-bucket" "countRouteBandwidthWaits";
        /// Microseconds those writes waited in all.
        #[serde(default)]
        route_bandwidth_wait_us: u64 => Counter, Add, Micros, "Time writes to clients waited for their route's bandwidth, in all.",
            prom "portico_connection_queue_route_bandwidth_wait_seconds_total", xml "connection-queue-bucket" "ticksRouteBandwidthWait";
    }
}

/// The help of the queue-length averages (one metric family).
const QUEUE_AVERAGE: &str = "Connection queue length averaged over the last minutes (exponentially damped).";

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

crate::section! {
    /// Persistent connections (the Sun proxy's KeepAliveInfo). Fields the
    /// server cannot count yet are None.
    pub struct KeepAliveInfo at "keepalive" {
        /// Idle persistent connections now.
        count: Option<u64> => Gauge, Add, None, "Idle persistent connections.",
            prom "portico_keepalive_connections", xml "keepalive-bucket" "countConnections";
        /// Most idle persistent connections allowed.
        max: Option<u64> => Gauge, Add, None, "Most idle persistent connections.",
            prom "portico_keepalive_max_connections", xml "keepalive-bucket" "maxConnections";
        /// Requests received on a connection kept alive.
        hits: u64 => Counter, Add, None, "Requests received on a kept-alive connection.",
            prom "portico_keepalive_hits_total", xml "keepalive-bucket" "countHits";
        /// Idle connections closed to make room (oldest first).
        flushes: Option<u64> => Counter, Add, None, "Idle connections closed to make room.",
            prom "portico_keepalive_flushes_total", xml "keepalive-bucket" "countFlushes";
        /// Connections not kept alive because the limit was reached.
        refusals: Option<u64> => Counter, Add, None, "Connections not kept alive (limit reached).",
            prom "portico_keepalive_refusals_total", xml "keepalive-bucket" "countRefusals";
        /// Idle connections closed by the timeout.
        timeouts: Option<u64> => Counter, Add, None, "Idle connections closed by the timeout.",
            prom "portico_keepalive_timeouts_total", xml "keepalive-bucket" "countTimeouts";
        /// Connections closed because a request head did not arrive in time (slowloris).
        header_timeouts: Option<u64> => Counter, Add, None, "Connections closed because a request head did not arrive within limits.header_timeout.",
            prom "portico_header_timeouts_total", xml "keepalive-bucket" "countHeaderTimeouts";
        /// Connections closed because the client accepted no response bytes
        /// for `limits.send_timeout` (a client that does not read).
        #[serde(default)]
        send_timeouts: Option<u64> => Counter, Add, None, "Connections closed because the client accepted no response bytes for limits.send_timeout.",
            prom "portico_send_timeouts_total", xml "keepalive-bucket" "countSendTimeouts";
        /// Of `count`, those held by the keep-alive poller now (idle past
        /// `keepalive.park_after`); None without a poller.
        #[serde(default)]
        parked: Option<u64> => Gauge, Add, None, "Idle persistent connections held by the keep-alive poller.",
            prom "portico_keepalive_polled_connections", xml "keepalive-bucket" "countPolled";
        /// New connections (no request yet) held by the keep-alive poller now.
        #[serde(default)]
        parked_new: Option<u64> => Gauge, Add, None, "New connections (no request yet) held by the keep-alive poller.",
            prom "portico_keepalive_polled_new_connections", xml "keepalive-bucket" "countPolledNew";
        /// Connections handed to the keep-alive poller since start.
        #[serde(default)]
        parks: Option<u64> => Counter, Add, None, "Connections handed to the keep-alive poller.",
            prom "portico_keepalive_handoffs_total", xml "keepalive-bucket" "countHandoffs";
        /// The idle timeout, seconds.
        timeout_secs: f64 => Gauge, First, Seconds, "The keep-alive idle timeout (keepalive.timeout).",
            prom "portico_keepalive_timeout_seconds", xml "keepalive-bucket" "secondsTimeout";
        /// Requests per connection (0 = unlimited).
        max_requests: u64 => Gauge, First, None, "Requests per connection, 0 for no limit (keepalive.max_requests).",
            prom "portico_keepalive_max_requests", xml "keepalive-bucket" "maxRequests";
    }
}

crate::section! {
    /// A thread pool (the Sun proxy's NativePool).
    pub struct PoolInfo at "native_pool" {
        /// Pool name.
        name: String => Info, First, None, "Pool name.";
        /// Idle threads.
        idle: u64 => Gauge, Add, None, "Idle blocking-pool threads.",
            prom "portico_blocking_pool_idle_threads", xml "thread-pool-bucket" "countIdleThreads";
        /// Threads alive now.
        threads: u64 => Gauge, Add, None, "Blocking-pool threads alive.",
            prom "portico_blocking_pool_threads", xml "thread-pool-bucket" "countThreads";
        /// Most threads at once (summed: see `sum.rs`).
        peak: u64 => Gauge, Add, None, "Most blocking-pool threads.",
            prom "portico_blocking_pool_peak_threads", xml "thread-pool-bucket" "peakThreads";
        /// Most threads allowed.
        limit: u64 => Gauge, Add, None, "Blocking-pool thread limit.",
            prom "portico_blocking_pool_max_threads", xml "thread-pool-bucket" "maxThreads";
        /// Work waiting for a thread now.
        queue: u64 => Gauge, Add, None, "Work waiting for a thread.",
            prom "portico_blocking_pool_queue_length", xml "thread-pool-bucket" "countQueued";
        /// Most work waiting at once.
        queue_peak: u64 => Gauge, Add, None, "Most work waiting at once.",
            prom "portico_blocking_pool_queue_peak", xml "thread-pool-bucket" "peakQueued";
        /// Most work allowed to wait.
        queue_limit: u64 => Gauge, Add, None, "Most work allowed to wait.",
            prom "portico_blocking_pool_queue_limit", xml "thread-pool-bucket" "maxQueued";
        /// Jobs accepted since start.
        jobs: u64 => Counter, Add, None, "Blocking-pool jobs accepted.",
            prom "portico_blocking_pool_jobs_total", xml "thread-pool-bucket" "countJobs";
        /// Jobs refused because the queue was full (busy 503).
        refused: u64 => Counter, Add, None, "Blocking-pool jobs refused because the queue was full (busy 503).",
            prom "portico_blocking_pool_refused_total", xml "thread-pool-bucket" "countRefused";
    }
}

crate::section! {
    /// The HTTP cache.
    pub struct CacheInfo at "cache" {
        /// Serving and storing (false after `/nsc?stop`; in a sum, false
        /// if stopped in any worker: `/nsc?stop` reaches only the worker
        /// that answers it until the others follow).
        running: bool => Gauge, All, None, "1 while the cache serves and stores.",
            prom "portico_cache_running", xml "cache-bucket" "flagEnabled";
        /// Lookups of cacheable requests.
        lookups: u64 => Counter, Add, None, "Cache lookups.",
            prom "portico_cache_lookups_total", xml "cache-bucket" "countLookups";
        /// Served fresh from the cache.
        hits: u64 => Counter, Add, None, "Served fresh from the cache.",
            prom "portico_cache_hits_total", xml "cache-bucket" "countHits";
        /// Not in the cache.
        misses: u64 => Counter, Add, None, "Not found in the cache.",
            prom "portico_cache_misses_total", xml "cache-bucket" "countMisses";
        /// Served stale.
        stale: u64 => Counter, Add, None, "Served stale.",
            prom "portico_cache_stale_total", xml "cache-bucket" "countStale";
        /// Conditional requests to origins.
        revalidations: u64 => Counter, Add, None, "Conditional requests to origins.",
            prom "portico_cache_revalidations_total", xml "cache-bucket" "countRevalidations";
        /// Requests that shared another request's fetch.
        collapsed: u64 => Counter, Add, None, "Requests that shared another's fetch.",
            prom "portico_cache_collapsed_total", xml "cache-bucket" "countCollapsed";
        /// Objects stored.
        stored: u64 => Counter, Add, None, "Objects stored.",
            prom "portico_cache_stored_total", xml "cache-bucket" "countStored";
        /// Objects removed by invalidation or purge.
        invalidated: u64 => Counter, Add, None, "Objects invalidated or purged.",
            prom "portico_cache_invalidated_total", xml "cache-bucket" "countInvalidated";
        /// Stored variants removed because their URL had more than
        /// 100 (the oldest gives way).
        variants_dropped: u64 => Counter, Add, None, "Variants removed past the per-URL limit.",
            prom "portico_cache_variants_dropped_total", xml "cache-bucket" "countVariantsDropped";
        /// Fetches being stored that were stopped because every client
        /// left with more still to come than `cache.quick_abort_*` finish.
        #[serde(default)]
        fetches_abandoned: u64 => Counter, Add, None, "Fetches stopped, unstored, because every client left with too much still to come (cache.quick_abort).",
            prom "portico_cache_fetches_abandoned_total", xml "cache-bucket" "countFetchesAbandoned";
        /// Body bytes served from the cache.
        bytes_served: u64 => Counter, Add, Bytes, "Body bytes served from the cache.",
            prom "portico_cache_served_bytes_total", xml "cache-bucket" "countContentHits";
        /// Body bytes fetched from origins after misses.
        bytes_fetched: u64 => Counter, Add, Bytes, "Body bytes fetched from origins after misses.",
            prom "portico_cache_fetched_bytes_total", xml "cache-bucket" "countContentMisses";
        /// Objects in the memory tier.
        memory_entries: u64 => Gauge, Add, None, "Objects in the memory tier.",
            prom "portico_cache_memory_objects", xml "cache-bucket" "countEntries";
        /// Bytes in the memory tier.
        memory_bytes: u64 => Gauge, Add, Bytes, "Bytes in the memory tier.",
            prom "portico_cache_memory_bytes", xml "cache-bucket" "sizeHeapCache";
        /// Memory tier budget, bytes.
        memory_limit: u64 => Gauge, Add, Bytes, "Memory tier budget.",
            prom "portico_cache_memory_limit_bytes", xml "cache-bucket" "maxHeapCacheSize";
        /// Largest object admitted to memory.
        max_memory_object: u64 => Gauge, First, Bytes, "Largest object admitted to the memory tier (cache.max_memory_object).",
            prom "portico_cache_max_memory_object_bytes", xml "cache-bucket" "maxHeapObjectSize";
        /// The disk tier, if enabled.
        disk: Option<DiskInfo> => Section, Add, None, "The disk tier.";
        /// `cache.max_ttl` in seconds (0 = no limit).
        max_age_secs: u64 => Gauge, First, Seconds, "Longest freshness lifetime, 0 for none (cache.max_ttl).",
            prom "portico_cache_max_ttl_seconds", xml "cache-bucket" "secondsMaxAge";
        /// `cache.min_ttl` in seconds.
        min_age_secs: u64 => Gauge, First, Seconds, "Shortest freshness lifetime (cache.min_ttl).",
            prom "portico_cache_min_ttl_seconds", xml "cache-bucket" "secondsMinAge";
    }
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

crate::section! {
    /// The disk tier. Its directory is shared by the worker processes:
    /// objects and bytes are the largest worker's (each worker's index is a
    /// view of the one directory), budgets are summed (`reload::per_process`
    /// splits the budget among the workers).
    pub struct DiskInfo at "cache.disk" {
        /// Directory.
        dir: String => Info, First, None, "Disk tier directory.";
        /// Where file work runs: `inline` or `pool` (`cache.file_io`, with
        /// `auto` resolved).
        file_io: String => Info, First, None, "Where disk tier file work runs: inline (on the worker threads) or pool (the blocking pool); cache.file_io with auto resolved.";
        /// Objects stored.
        objects: u64 => Gauge, Max, None, "Objects in the disk tier.",
            prom "portico_cache_disk_objects", xml "cache-bucket" "countDiskEntries";
        /// Bytes stored.
        bytes: u64 => Gauge, Max, Bytes, "Bytes in the disk tier.",
            prom "portico_cache_disk_bytes", xml "cache-bucket" "sizeDiskCache";
        /// Budget, bytes.
        limit: u64 => Gauge, Add, Bytes, "Disk tier budget.",
            prom "portico_cache_disk_limit_bytes", xml "cache-bucket" "maxDiskCacheSize";
        /// GC starts above this many bytes.
        high_watermark: u64 => Gauge, Add, Bytes, "GC starts above this.",
            prom "portico_cache_disk_high_watermark_bytes", xml "cache-bucket" "sizeDiskHighWatermark";
        /// GC stops at this many bytes.
        low_watermark: u64 => Gauge, Add, Bytes, "GC stops at this.",
            prom "portico_cache_disk_low_watermark_bytes", xml "cache-bucket" "sizeDiskLowWatermark";
        /// Objects read.
        reads: u64 => Counter, Add, None, "Objects read from disk.",
            prom "portico_cache_disk_reads_total", xml "cache-bucket" "countDiskReads";
        /// Lookups that found no file.
        misses: u64 => Counter, Add, None, "Disk lookups that found no file.",
            prom "portico_cache_disk_misses_total", xml "cache-bucket" "countDiskMisses";
        /// Files held open between hits now (nginx's `open_file_cache`).
        open_files: u64 => Gauge, Add, None, "Disk tier files held open between hits.",
            prom "portico_cache_disk_open_files", xml "cache-bucket" "countDiskOpenFiles";
        /// Most files held open (`cache.open_files`).
        open_files_limit: u64 => Gauge, Add, None, "Most disk tier files held open (cache.open_files, lowered when the process runs out of descriptors, back up a step a minute after).",
            prom "portico_cache_disk_open_files_limit", xml "cache-bucket" "maxDiskOpenFiles";
        /// Disk hits served from a held-open file.
        open_file_hits: u64 => Counter, Add, None, "Disk hits served from a held-open file.",
            prom "portico_cache_disk_open_file_hits_total", xml "cache-bucket" "countDiskOpenFileHits";
        /// Disk lookups that had to open the file.
        open_file_misses: u64 => Counter, Add, None, "Disk lookups that had to open the file.",
            prom "portico_cache_disk_open_file_misses_total", xml "cache-bucket" "countDiskOpenFileMisses";
        /// Reads of held files done at once from the page cache.
        reads_nowait: u64 => Counter, Add, None, "Disk reads served from the page cache without the blocking pool.",
            prom "portico_cache_disk_reads_nowait_total", xml "cache-bucket" "countDiskReadsNowait";
        /// Reads of held files that went to the blocking pool.
        reads_blocked: u64 => Counter, Add, None, "Disk reads that would have waited for the device, run on the blocking pool (inline with cache.file_io = inline).",
            prom "portico_cache_disk_reads_blocked_total", xml "cache-bucket" "countDiskReadsBlocked";
        /// Opens done on the worker with nothing to wait for.
        opens_nowait: u64 => Counter, Add, None, "Disk tier files opened on the worker thread because nothing had to be read from the device (openat2 RESOLVE_CACHED and preadv2 RWF_NOWAIT), where file work otherwise goes to the blocking pool.",
            prom "portico_cache_disk_opens_nowait_total", xml "cache-bucket" "countDiskOpensNowait";
        /// File jobs run on the worker threads (`cache.file_io`).
        inline_jobs: u64 => Counter, Add, None, "Disk tier file jobs (opens, body reads and writes, commits) run on the worker thread that needed them instead of the blocking pool (cache.file_io).",
            prom "portico_cache_disk_inline_jobs_total", xml "cache-bucket" "countDiskInlineJobs";
        /// Files of memory-tier objects checked in the background, so that
        /// hits send the body from the file with sendfile.
        background_checks: u64 => Counter, Add, None, "Disk files of memory-tier objects checksummed in the background, so that their hits are sent from the file with sendfile.",
            prom "portico_cache_disk_background_checks_total", xml "cache-bucket" "countDiskBackgroundChecks";
        /// Body bytes read from or sent out of disk tier files.
        bytes_read: u64 => Counter, Add, Bytes, "Body bytes read (or sent with sendfile) from disk tier files.",
            prom "portico_cache_disk_read_bytes_total", xml "cache-bucket" "sizeDiskRead";
        /// Objects written.
        writes: u64 => Counter, Add, None, "Objects written to disk.",
            prom "portico_cache_disk_writes_total", xml "cache-bucket" "countDiskWrites";
        /// Writes abandoned.
        write_aborts: u64 => Counter, Add, None, "Disk writes abandoned.",
            prom "portico_cache_disk_write_aborts_total", xml "cache-bucket" "countDiskWriteAborts";
        /// Objects evicted by GC.
        evictions: u64 => Counter, Add, None, "Objects evicted by GC.",
            prom "portico_cache_disk_evictions_total", xml "cache-bucket" "countDiskEvictions";
        /// GC runs.
        gc_runs: u64 => Counter, Add, None, "GC runs.",
            prom "portico_cache_disk_gc_runs_total", xml "cache-bucket" "countDiskGcRuns";
        /// Checksum failures.
        checksum_failures: u64 => Counter, Add, None, "Objects that failed their checksum.",
            prom "portico_cache_disk_checksum_failures_total", xml "cache-bucket" "countDiskChecksumFailures";
        /// Corrupt files removed.
        corrupt_removed: u64 => Counter, Add, None, "Corrupt disk files removed.",
            prom "portico_cache_disk_corrupt_removed_total", xml "cache-bucket" "countDiskCorruptRemoved";
        /// Index rebuild finished (in a sum: in every worker).
        index_ready: bool => Gauge, All, None, "1 once the disk index is rebuilt.",
            prom "portico_cache_disk_index_ready", xml "cache-bucket" "flagDiskIndexReady";
    }
}

crate::section! {
    /// Name resolution (the Sun proxy's HostDNSCacheInfo).
    pub struct DnsInfo at "dns" {
        /// The cache is on.
        enabled: bool => Gauge, Any, None, "1 while the origin DNS cache is on.",
            prom "portico_dns_cache_enabled", xml "host-dns-bucket" "flagCacheEnabled";
        /// Names cached now.
        entries: u64 => Gauge, Add, None, "Names cached.",
            prom "portico_dns_cache_entries", xml "host-dns-bucket" "countCacheEntries";
        /// Most names cached.
        max_entries: u64 => Gauge, Add, None, "Most names cached.",
            prom "portico_dns_cache_max_entries", xml "host-dns-bucket" "maxCacheEntries";
        /// Names looked up (IP literals excluded).
        lookups: u64 => Counter, Add, None, "Origin names looked up.",
            prom "portico_dns_lookups_total", xml "host-dns-bucket" "countLookups";
        /// Answered from the cache.
        hits: u64 => Counter, Add, None, "Answered from the DNS cache.",
            prom "portico_dns_cache_hits_total", xml "host-dns-bucket" "countCacheHits";
        /// Lookups that failed.
        failures: u64 => Counter, Add, None, "Lookups that failed.",
            prom "portico_dns_failures_total", xml "host-dns-bucket" "countLookupFailures";
    }
}

impl DnsInfo {
    /// hits / lookups, percent.
    pub fn hit_ratio(&self) -> f64 {
        percent(self.hits, self.lookups)
    }
}

crate::section! {
    /// Authentication (`[auth]`) and the user cache (the Sun proxy's ACL
    /// user cache).
    pub struct AuthInfo at "auth" {
        /// Users in the cache now.
        users: u64 => Gauge, Add, None, "Users in the authentication user cache.",
            prom "portico_auth_cache_users", xml "acl-user-cache-bucket" "countCacheEntries";
        /// Most users the cache holds (`auth.max_users`).
        max_users: u64 => Gauge, Add, None, "Most users the user cache holds (auth.max_users).",
            prom "portico_auth_cache_max_users", xml "acl-user-cache-bucket" "maxCacheEntries";
        /// Credentials found in the cache, still valid.
        hits: u64 => Counter, Add, None, "Credentials found in the user cache.",
            prom "portico_auth_cache_hits_total", xml "acl-user-cache-bucket" "countCacheHits";
        /// Credentials verified against the user file or the LDAP directory.
        misses: u64 => Counter, Add, None, "Credentials verified against the user file or the LDAP directory.",
            prom "portico_auth_cache_misses_total", xml "acl-user-cache-bucket" "countCacheMisses";
        /// Users dropped from the full cache to make room.
        evictions: u64 => Counter, Add, None, "Users dropped from the full user cache.",
            prom "portico_auth_cache_evictions_total", xml "acl-user-cache-bucket" "countEvictions";
        /// Verifications that failed (wrong password, unknown user).
        failures: u64 => Counter, Add, None, "Verifications that failed (wrong password, unknown user).",
            prom "portico_auth_failures_total", xml "acl-user-cache-bucket" "countFailures";
        /// Failed logins answered from the failed-login cache (`auth.failed_ttl`).
        failed_cache_hits: u64 => Counter, Add, None, "Failed logins answered from the failed-login cache.",
            prom "portico_auth_failed_cache_hits_total", xml "acl-user-cache-bucket" "countFailedCacheHits";
        /// Requests answered 503 because the user file or the directory could not be used.
        unavailable: u64 => Counter, Add, None, "Requests answered 503: the user file or the directory could not be used.",
            prom "portico_auth_unavailable_total", xml "acl-user-cache-bucket" "countUnavailable";
        /// Loads of the user file (start, change, SIGHUP).
        reloads: u64 => Counter, Add, None, "Loads of the user file.",
            prom "portico_auth_reloads_total", xml "acl-user-cache-bucket" "countReloads";
        /// The back-end is failing now (the user file missing or unreadable, or the directory failing).
        failing: bool => Gauge, Any, None, "1 while the user file is missing or unreadable, or the directory is failing.",
            prom "portico_auth_backend_failing", xml "acl-user-cache-bucket" "flagBackendFailing";
        /// Time to verify one password against the file.
        verify_time: HistSnapshot => Histogram, Add, Micros, "Time to verify one password against the user file or the directory.",
            prom "portico_auth_verify_seconds", xml "acl-user-cache-bucket" "meanVerifyMicros";
    }
}

impl AuthInfo {
    /// hits / (hits + misses), percent.
    pub fn hit_ratio(&self) -> f64 {
        percent(self.hits, self.hits + self.misses)
    }
}

/// The help of the failed TLS handshakes (one metric family, by reason).
const TLS_FAILURES: &str = "TLS handshakes with clients that failed, by reason.";
/// The help of the completed TLS handshakes by kind (one metric family).
const TLS_KINDS: &str = "TLS handshakes with clients completed, full or resumed.";

crate::section! {
    /// TLS handshakes with clients (`[[listener.certificate]]`), the Sun
    /// Web Server's SSL figures.
    pub struct TlsInfo at "tls" {
        /// Handshakes completed.
        handshakes: u64 => Counter, Add, None, "TLS handshakes with clients completed.",
            prom "portico_tls_handshakes_total", xml "ssl-bucket" "countHandshakes";
        /// Failed: not TLS (plain HTTP to a TLS port), or no version or
        /// cipher suite in common.
        failed_protocol: u64 => Counter, Add, None, TLS_FAILURES,
            prom "portico_tls_handshake_failures_total" { "reason" = "protocol" }, xml "ssl-bucket" "countProtocolFailures";
        /// Failed: the client refused the certificate.
        failed_certificate: u64 => Counter, Add, None, TLS_FAILURES,
            prom "portico_tls_handshake_failures_total" { "reason" = "certificate" }, xml "ssl-bucket" "countCertificateFailures";
        /// Failed: not complete within `limits.header_timeout`.
        failed_timeout: u64 => Counter, Add, None, TLS_FAILURES,
            prom "portico_tls_handshake_failures_total" { "reason" = "timeout" }, xml "ssl-bucket" "countTimeoutFailures";
        /// Failed otherwise (the client closed the connection mid-handshake).
        failed_other: u64 => Counter, Add, None, TLS_FAILURES,
            prom "portico_tls_handshake_failures_total" { "reason" = "other" }, xml "ssl-bucket" "countOtherFailures";
        /// Completed handshakes that were full (certificate, key exchange).
        #[serde(default)]
        full: u64 => Counter, Add, None, TLS_KINDS,
            prom "portico_tls_handshakes_by_kind_total" { "kind" = "full" }, xml "ssl-bucket" "countFullHandshakes";
        /// Completed handshakes that resumed a session (a ticket or a cached session).
        #[serde(default)]
        resumed: u64 => Counter, Add, None, TLS_KINDS,
            prom "portico_tls_handshakes_by_kind_total" { "kind" = "resumed" }, xml "ssl-bucket" "countResumedHandshakes";
        /// Session cache lookups that found a live session.
        #[serde(default)]
        session_cache_hits: u64 => Counter, Add, None, "TLS session cache lookups that found a live session.",
            prom "portico_tls_session_cache_hits_total", xml "ssl-bucket" "countSessionCacheHits";
        /// Session cache lookups that found none (unknown, evicted, expired).
        #[serde(default)]
        session_cache_misses: u64 => Counter, Add, None, "TLS session cache lookups that found no live session.",
            prom "portico_tls_session_cache_misses_total", xml "ssl-bucket" "countSessionCacheMisses";
        /// Sessions in the session cache now.
        #[serde(default)]
        session_cache_entries: u64 => Gauge, Add, None, "TLS sessions in the session cache.",
            prom "portico_tls_session_cache_entries", xml "ssl-bucket" "countSessionCacheEntries";
        /// `tls.session_cache_entries` (each process has its own cache).
        #[serde(default)]
        session_cache_limit: u64 => Gauge, Add, None, "TLS sessions the session cache holds at most.",
            prom "portico_tls_session_cache_limit", xml "ssl-bucket" "maxSessionCacheEntries";
        /// Session tickets sealed.
        #[serde(default)]
        tickets_issued: u64 => Counter, Add, None, "TLS session tickets issued.",
            prom "portico_tls_tickets_issued_total", xml "ssl-bucket" "countTicketsIssued";
        /// Tickets that did not open: forged, older than `tls.session_timeout`, another server's.
        #[serde(default)]
        tickets_refused: u64 => Counter, Add, None, "TLS session tickets refused (forged, expired, or sealed by another server): a full handshake instead.",
            prom "portico_tls_tickets_refused_total", xml "ssl-bucket" "countTicketsRefused";
        /// `tls.session_tickets`.
        #[serde(default)]
        tickets_enabled: bool => Gauge, All, None, "1 while TLS session tickets are issued (tls.session_tickets).",
            prom "portico_tls_tickets_enabled", xml "ssl-bucket" "flagTickets";
    }
}

impl TlsInfo {
    /// This process's handshake counters.
    pub fn current() -> TlsInfo {
        let (done, [protocol, certificate, timeout, other]) = crate::tls::counters().read();
        let r = crate::tls_resume::figures();
        TlsInfo {
            handshakes: done,
            failed_protocol: protocol,
            failed_certificate: certificate,
            failed_timeout: timeout,
            failed_other: other,
            full: r.full,
            resumed: r.resumed,
            session_cache_hits: r.cache_hits,
            session_cache_misses: r.cache_misses,
            session_cache_entries: r.cache_entries,
            session_cache_limit: r.cache_limit,
            tickets_issued: r.tickets_issued,
            tickets_refused: r.tickets_refused,
            tickets_enabled: r.tickets,
        }
    }

    /// resumed / (full + resumed), percent.
    pub fn resumed_ratio(&self) -> f64 {
        percent(self.resumed, self.full + self.resumed)
    }

    /// All failed handshakes.
    pub fn failures(&self) -> u64 {
        self.failed_protocol + self.failed_certificate + self.failed_timeout + self.failed_other
    }
}

/// The help of the GOAWAY frames sent (one metric family, by reason).
const H2_GOAWAY: &str = "HTTP/2 connections Portico ended with GOAWAY, by reason.";

crate::section! {
    /// HTTP/2 client connections (`[http2]`): what came, and what Portico
    /// refused or cut (the rapid-reset and flood defences among them).
    pub struct Http2Info at "http2" {
        /// Connections that spoke HTTP/2.
        connections: u64 => Counter, Add, None, "HTTP/2 client connections.",
            prom "portico_http2_connections_total", xml "http2-bucket" "countConnections";
        /// Streams (requests) accepted.
        streams: u64 => Counter, Add, None, "HTTP/2 streams (requests) accepted.",
            prom "portico_http2_streams_total", xml "http2-bucket" "countStreams";
        /// Streams the client reset before their response was complete.
        client_resets: u64 => Counter, Add, None, "HTTP/2 streams the client reset before their response was complete.",
            prom "portico_http2_client_resets_total", xml "http2-bucket" "countClientResets";
        /// Streams Portico reset (a response cut short, a client that opened no window).
        resets_sent: u64 => Counter, Add, None, "HTTP/2 streams Portico reset.",
            prom "portico_http2_resets_sent_total", xml "http2-bucket" "countResetsSent";
        /// GOAWAY: no open stream for `http2.idle_timeout`.
        goaway_idle: u64 => Counter, Add, None, H2_GOAWAY,
            prom "portico_http2_goaway_sent_total" { "reason" = "idle" }, xml "http2-bucket" "countGoawayIdle";
        /// GOAWAY: a PING not acknowledged within `http2.ping_timeout`.
        goaway_ping_timeout: u64 => Counter, Add, None, H2_GOAWAY,
            prom "portico_http2_goaway_sent_total" { "reason" = "ping_timeout" }, xml "http2-bucket" "countGoawayPingTimeout";
        /// GOAWAY: draining (SIGTERM).
        goaway_drain: u64 => Counter, Add, None, H2_GOAWAY,
            prom "portico_http2_goaway_sent_total" { "reason" = "drain" }, xml "http2-bucket" "countGoawayDrain";
        /// GOAWAY ENHANCE_YOUR_CALM: rapid reset (CVE-2023-44487), too many
        /// streams reset for the client's errors.
        goaway_enhance_your_calm: u64 => Counter, Add, None, H2_GOAWAY,
            prom "portico_http2_goaway_sent_total" { "reason" = "enhance_your_calm" }, xml "http2-bucket" "countGoawayEnhanceYourCalm";
        /// GOAWAY for a protocol error: a malformed frame, a CONTINUATION
        /// flood past `http2.max_header_list_size`, HPACK, flow control.
        goaway_protocol: u64 => Counter, Add, None, H2_GOAWAY,
            prom "portico_http2_goaway_sent_total" { "reason" = "protocol_error" }, xml "http2-bucket" "countGoawayProtocolError";
        /// GOAWAY for another reason.
        goaway_other: u64 => Counter, Add, None, H2_GOAWAY,
            prom "portico_http2_goaway_sent_total" { "reason" = "other" }, xml "http2-bucket" "countGoawayOther";
    }
}

impl Http2Info {
    /// This process's HTTP/2 counters.
    pub fn current() -> Http2Info {
        use std::sync::atomic::Ordering::Relaxed;
        let c = crate::http1::h2::counters();
        Http2Info {
            connections: c.connections.load(Relaxed),
            streams: c.streams.load(Relaxed),
            client_resets: c.client_reset.load(Relaxed),
            resets_sent: c.resets_sent.load(Relaxed),
            goaway_idle: c.goaway_idle.load(Relaxed),
            goaway_ping_timeout: c.goaway_ping_timeout.load(Relaxed),
            goaway_drain: c.goaway_drain.load(Relaxed),
            goaway_enhance_your_calm: c.goaway_enhance_your_calm.load(Relaxed),
            goaway_protocol: c.goaway_protocol.load(Relaxed),
            goaway_other: c.goaway_other.load(Relaxed),
        }
    }

    /// All GOAWAY frames sent.
    pub fn goaways(&self) -> u64 {
        self.goaway_idle
            + self.goaway_ping_timeout
            + self.goaway_drain
            + self.goaway_enhance_your_calm
            + self.goaway_protocol
            + self.goaway_other
    }
}

crate::section! {
    /// CONNECT tunnels, over HTTP/1 and HTTP/2 (RFC 9113 8.5): the
    /// requests themselves are counted in `requests`, the bytes tunnels
    /// relay as they relay them. SOCKS sessions are counted apart (`socks`).
    pub struct TunnelInfo at "tunnels" {
        /// Tunnels established (the client told `200`).
        established: u64 => Counter, Add, None, "CONNECT tunnels established.",
            prom "portico_tunnels_established_total", xml "tunnel-bucket" "countEstablished";
        /// Tunnels open now.
        open: u64 => Gauge, Add, None, "CONNECT tunnels open now.",
            prom "portico_tunnels_open", xml "tunnel-bucket" "countOpen";
        /// Bytes relayed from clients, as they are relayed.
        bytes_up: u64 => Counter, Add, Bytes, "Bytes relayed from clients through CONNECT tunnels.",
            prom "portico_tunnels_sent_bytes_total", xml "tunnel-bucket" "countBytesSent";
        /// Bytes relayed to clients, as they are relayed.
        bytes_down: u64 => Counter, Add, Bytes, "Bytes relayed to clients through CONNECT tunnels.",
            prom "portico_tunnels_received_bytes_total", xml "tunnel-bucket" "countBytesReceived";
    }
}

impl TunnelInfo {
    /// This process's tunnel counters.
    pub fn current() -> TunnelInfo {
        use std::sync::atomic::Ordering::Relaxed;
        let c = crate::proxy::tunnel::counters();
        TunnelInfo {
            established: c.established.load(Relaxed),
            open: c.open.load(Relaxed),
            bytes_up: c.bytes_up.load(Relaxed),
            bytes_down: c.bytes_down.load(Relaxed),
        }
    }
}

crate::section! {
    /// The SOCKS 5 server (`mode = "socks"` listeners, RFC 1928). Its
    /// sessions are also counted as CONNECT requests in `requests`.
    pub struct SocksInfo at "socks" {
        /// Connections that sent a greeting.
        sessions: u64 => Counter, Add, None, "SOCKS sessions (connections that sent a greeting).",
            prom "portico_socks_sessions_total", xml "socks-bucket" "countSessions";
        /// Sessions whose target connection was opened.
        established: u64 => Counter, Add, None, "SOCKS sessions whose target connection was opened.",
            prom "portico_socks_established_total", xml "socks-bucket" "countEstablished";
        /// RFC 1929 logins refused (wrong password, unknown user, malformed credentials).
        auth_failures: u64 => Counter, Add, None, "SOCKS logins refused (wrong password, unknown user, malformed credentials).",
            prom "portico_socks_auth_failures_total", xml "socks-bucket" "countAuthFailures";
        /// Requests refused by the access rules (reply 0x02).
        denied: u64 => Counter, Add, None, "SOCKS requests refused by access.allow, [[acl]] or [[rule]] (reply 0x02).",
            prom "portico_socks_denied_total", xml "socks-bucket" "countDenied";
        /// Targets that could not be reached (replies 0x01, 0x04, 0x05, 0x06).
        connect_failures: u64 => Counter, Add, None, "SOCKS targets that could not be reached.",
            prom "portico_socks_connect_failures_total", xml "socks-bucket" "countConnectFailures";
        /// BIND, UDP ASSOCIATE, unknown commands and address types (replies 0x07, 0x08).
        unsupported: u64 => Counter, Add, None, "SOCKS requests for a command or address type not supported (BIND, UDP ASSOCIATE).",
            prom "portico_socks_unsupported_total", xml "socks-bucket" "countUnsupported";
        /// Sessions closed on a protocol error or a timeout before their request was complete.
        malformed: u64 => Counter, Add, None, "SOCKS sessions closed on a protocol error or a timeout during negotiation.",
            prom "portico_socks_malformed_total", xml "socks-bucket" "countMalformed";
        /// Bytes relayed from clients to targets.
        bytes_up: u64 => Counter, Add, Bytes, "Bytes relayed from SOCKS clients to their targets.",
            prom "portico_socks_sent_bytes_total", xml "socks-bucket" "countBytesSent";
        /// Bytes relayed from targets to clients.
        bytes_down: u64 => Counter, Add, Bytes, "Bytes relayed from SOCKS targets to their clients.",
            prom "portico_socks_received_bytes_total", xml "socks-bucket" "countBytesReceived";
    }
}

/// The help of the upstream failures (one metric family, by kind).
const UPSTREAM_ERRORS: &str = "Failures before a response head, by kind.";

crate::section! {
    /// Requests to origins.
    pub struct UpstreamInfo at "upstream" {
        /// Requests sent.
        requests: u64 => Counter, Add, None, "Requests sent to origins.",
            prom "portico_upstream_requests_total", xml "upstream-bucket" "countRequests";
        /// Response heads received.
        responses: u64 => Counter, Add, None, "Response heads received from origins.",
            prom "portico_upstream_responses_total", xml "upstream-bucket" "countResponses";
        /// New connections opened (pooled reuse not counted).
        connects: u64 => Counter, Add, None, "Connections opened to origins.",
            prom "portico_upstream_connects_total", xml "upstream-bucket" "countConnects";
        /// Connects that failed: DNS.
        dns_errors: u64 => Counter, Add, None, UPSTREAM_ERRORS,
            prom "portico_upstream_errors_total" { "kind" = "dns" }, xml "upstream-bucket" "countDnsErrors";
        /// Connects that failed: refused or unreachable.
        connect_errors: u64 => Counter, Add, None, UPSTREAM_ERRORS,
            prom "portico_upstream_errors_total" { "kind" = "refused" }, xml "upstream-bucket" "countConnectErrors";
        /// Connects that timed out.
        connect_timeouts: u64 => Counter, Add, None, UPSTREAM_ERRORS,
            prom "portico_upstream_errors_total" { "kind" = "connect_timeout" }, xml "upstream-bucket" "countConnectTimeouts";
        /// TLS handshakes that failed.
        tls_errors: u64 => Counter, Add, None, UPSTREAM_ERRORS,
            prom "portico_upstream_errors_total" { "kind" = "tls" }, xml "upstream-bucket" "countTlsErrors";
        /// Response heads that did not arrive in time.
        response_timeouts: u64 => Counter, Add, None, UPSTREAM_ERRORS,
            prom "portico_upstream_errors_total" { "kind" = "response_timeout" }, xml "upstream-bucket" "countResponseTimeouts";
        /// Other failures before a response head.
        other_errors: u64 => Counter, Add, None, UPSTREAM_ERRORS,
            prom "portico_upstream_errors_total" { "kind" = "other" }, xml "upstream-bucket" "countOtherErrors";
        /// Time to open a connection.
        connect_time: HistSnapshot => Histogram, Add, Micros, "Time to open a connection to an origin.",
            prom "portico_upstream_connect_seconds", xml "upstream-bucket" "meanConnectMicros";
        /// Time from sending the request to the response head (including the
        /// connect when a new connection was opened; connect_time has that part).
        first_byte_time: HistSnapshot => Histogram, Add, Micros, "Time from sending a request to the response head (a new connection's connect included).",
            prom "portico_upstream_first_byte_seconds", xml "upstream-bucket" "meanFirstByteMicros";
        /// Interim (1xx) responses from origins relayed to clients (102,
        /// 103 Early Hints, an unsolicited 100; none to HTTP/1.0 clients).
        #[serde(default)]
        interim_relayed: u64 => Counter, Add, None, "Interim (1xx) responses from origins relayed to clients.",
            prom "portico_upstream_interim_responses_total", xml "upstream-bucket" "countInterimResponses";
        /// Connections upgraded (RFC 9110 7.8): a `101 Switching
        /// Protocols` relayed, then bytes both ways (WebSocket).
        #[serde(default)]
        upgrades: u64 => Counter, Add, None, "Connections upgraded to another protocol (101 Switching Protocols relayed, e.g. WebSocket).",
            prom "portico_upstream_upgrades_total", xml "upstream-bucket" "countUpgrades";
        /// Requests that found every place at their server taken
        /// (`origin.max_connections`) and waited in its queue.
        #[serde(default)]
        queued: u64 => Counter, Add, None, "Requests that waited for a connection place at their server (origin.max_connections).",
            prom "portico_upstream_queued_total", xml "upstream-bucket" "countQueued";
        /// Of those, the ones that waited `origin.queue_timeout` in vain (503).
        #[serde(default)]
        queue_timeouts: u64 => Counter, Add, None, "Requests answered 503 after waiting origin.queue_timeout for a connection place.",
            prom "portico_upstream_queue_timeouts_total", xml "upstream-bucket" "countQueueTimeouts";
        /// Of those, the ones dropped from the line unsent because their
        /// client went away while they waited.
        #[serde(default)]
        queue_abandoned: u64 => Counter, Add, None, "Requests dropped unsent from a connection place queue because their client went away.",
            prom "portico_upstream_queue_abandoned_total", xml "upstream-bucket" "countQueueAbandoned";
        /// Connections refused before any was opened because the
        /// destination a client chose resolved to an address
        /// `proxy.deny_destinations` refuses (forward, transparent,
        /// `CONNECT`, SOCKS). Not a failure of the origin's.
        #[serde(default)]
        destinations_denied: u64 => Counter, Add, None, "Connections refused because a client-chosen destination resolved to an address proxy.deny_destinations refuses.",
            prom "portico_upstream_destinations_denied_total", xml "upstream-bucket" "countDestinationsDenied";
        /// Requests waiting for a place now.
        #[serde(default)]
        waiting: u64 => Gauge, Add, None, "Requests waiting now for a connection place at their server.",
            prom "portico_upstream_waiting_requests", xml "upstream-bucket" "countWaiting";
        /// The servers with a place in use or a request waiting under a
        /// cap now, busiest first (at most 20).
        #[serde(default)]
        servers: Vec<ServerQueueInfo> => Section, Add, None, "One per server with connections in use under a cap (origin.max_connections).";
    }
}

crate::section! {
    /// One server under a connection cap. Its name labels its figures.
    pub struct ServerQueueInfo at "upstream.servers" {
        /// `host:port` (`https://` before it over TLS; the group's name in
        /// parentheses after it for a group's own cap).
        server: String => Info, First, None, "Server connected to under a cap.", prom "server", xml "upstream-server" "server";
        /// Places in use.
        in_use: u64 => Gauge, Add, None, "Connections in use at a server under a cap.",
            prom "portico_upstream_server_connections_in_use", xml "upstream-server" "countInUse";
        /// The cap (each worker process has its own: summed).
        limit: u64 => Gauge, Add, None, "Connections allowed in use at a server (origin.max_connections, or its group's).",
            prom "portico_upstream_server_connections_limit", xml "upstream-server" "maxInUse";
        /// Requests waiting for one of its places.
        waiting: u64 => Gauge, Add, None, "Requests waiting for a connection place at a server.",
            prom "portico_upstream_server_waiting_requests", xml "upstream-server" "countWaiting";
    }
}

impl super::declare::Keyed for ServerQueueInfo {
    fn key(&self) -> &str {
        &self.server
    }
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

crate::section! {
    /// The access log.
    pub struct AccessLogInfo at "access_log" {
        /// Writing at all.
        enabled: bool => Gauge, Any, None, "1 while the access log is written.",
            prom "portico_access_log_enabled", xml "access-log-bucket" "flagEnabled";
        /// Format name.
        format: String => Info, First, None, "Access log format.", xml "access-log-bucket" "format";
        /// Lines written.
        lines: u64 => Counter, Add, None, "Access log lines written.",
            prom "portico_access_log_lines_total", xml "access-log-bucket" "countLines";
        /// Lines dropped because the writer could not keep up.
        dropped: u64 => Counter, Add, None, "Access log lines dropped (writer behind).",
            prom "portico_access_log_dropped_total", xml "access-log-bucket" "countDropped";
        /// Lines waiting for the writer now.
        queued: u64 => Gauge, Add, None, "Access log lines waiting for the writer.",
            prom "portico_access_log_queued_lines", xml "access-log-bucket" "countQueued";
        /// Queue capacity.
        queue_limit: u64 => Gauge, Add, None, "Access log lines allowed to wait for the writer.",
            prom "portico_access_log_queue_limit_lines", xml "access-log-bucket" "maxQueued";
        /// Client addresses are logged as names (`log.resolve_clients`).
        resolve_clients: bool => Gauge, Any, None, "1 while client addresses are logged as names (log.resolve_clients).",
            prom "portico_client_dns_enabled", xml "client-dns-bucket" "flagCacheEnabled";
        /// Client names cached.
        client_dns_entries: u64 => Gauge, Add, None, "Client names cached.",
            prom "portico_client_dns_cache_entries", xml "client-dns-bucket" "countCacheEntries";
        /// Most client names cached.
        client_dns_max_entries: u64 => Gauge, Add, None, "Most client names cached.",
            prom "portico_client_dns_cache_max_entries", xml "client-dns-bucket" "maxCacheEntries";
        /// Client addresses looked up.
        client_dns_lookups: u64 => Counter, Add, None, "Client addresses looked up.",
            prom "portico_client_dns_lookups_total", xml "client-dns-bucket" "countLookups";
        /// Answered from the client-name cache.
        client_dns_hits: u64 => Counter, Add, None, "Client addresses answered from the client-name cache.",
            prom "portico_client_dns_cache_hits_total", xml "client-dns-bucket" "countCacheHits";
    }
}

crate::section! {
    /// The performance buckets report.
    pub struct BucketReport at "buckets" {
        /// Requests timed.
        total_requests: u64 => Counter, Add, None, "Requests timed into performance buckets.",
            prom "portico_timed_requests_total", xml "thread" "countTimedRequests";
        /// Their total processing time, nanoseconds.
        processing_ns: u64 => Counter, Add, Nanos, "Processing time of the timed requests.",
            prom "portico_request_processing_seconds_total", xml "thread" "ticksProcessing";
        /// `default-bucket` first, then named buckets in config order.
        buckets: Vec<BucketInfo> => Section, Add, None, "One per performance bucket.";
    }
}

crate::section! {
    /// One bucket. Its name labels its figures.
    pub struct BucketInfo at "buckets.buckets" {
        /// Name.
        name: String => Info, First, None, "Bucket name.", prom "bucket";
        /// Description.
        description: String => Info, First, None, "Bucket description.";
        /// Requests that used it.
        requests: u64 => Counter, Add, None, "Requests timed into each performance bucket.",
            prom "portico_bucket_requests_total", xml "profile-bucket" "countRequests";
        /// Stage invocations.
        invocations: u64 => Counter, Add, None, "Stage invocations, per bucket.",
            prom "portico_bucket_invocations_total", xml "profile-bucket" "countCalls";
        /// Time before stages started (dispatch), nanoseconds.
        latency_ns: u64 => Counter, Add, Nanos, "Time before stages started (dispatch), per bucket.",
            prom "portico_bucket_latency_seconds_total", xml "profile-bucket" "ticksDispatch";
        /// Time inside stages, nanoseconds.
        function_ns: u64 => Counter, Add, Nanos, "Time inside stages, per bucket.",
            prom "portico_bucket_function_seconds_total", xml "profile-bucket" "ticksFunction";
        /// Per stage.
        stages: Vec<StageInfo> => Section, Add, None, "One per pipeline stage.";
    }
}

impl super::declare::Keyed for BucketInfo {
    fn key(&self) -> &str {
        &self.name
    }
}

crate::section! {
    /// One stage within a bucket. Its name labels its figures.
    pub struct StageInfo at "buckets.buckets.stages" {
        /// Stage name.
        name: String => Info, First, None, "Stage name.", prom "stage", xml "profile-stage-bucket" "stage";
        /// Times invoked.
        invocations: u64 => Counter, Add, None, "Stage invocations per bucket.",
            prom "portico_stage_invocations_total", xml "profile-stage-bucket" "countCalls";
        /// Dispatch time, nanoseconds.
        latency_ns: u64 => Counter, Add, Nanos, "Time before each stage started (dispatch), per bucket.",
            prom "portico_stage_latency_seconds_total", xml "profile-stage-bucket" "ticksDispatch";
        /// Time inside, nanoseconds.
        function_ns: u64 => Counter, Add, Nanos, "Time inside each stage, per bucket.",
            prom "portico_stage_function_seconds_total", xml "profile-stage-bucket" "ticksFunction";
    }
}

impl super::declare::Keyed for StageInfo {
    fn key(&self) -> &str {
        &self.name
    }
}

/// `part / whole` in percent; 0 when `whole` is 0.
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

crate::section! {
    /// The proxy array as this node sees it (`[array]` with members).
    pub struct ArrayInfo at "array" {
        /// Requests received from other members (marked `Portico-Array`,
        /// from a member's address): this node is their owner.
        received: u64 => Counter, Add, None, "Requests received from other array members.",
            prom "portico_array_received_total", xml "array-bucket" "countReceived";
        /// Requests for URLs this node owns (CARP, all members up), served
        /// here: from clients or received from members.
        owned: u64 => Counter, Add, None, "Requests for URLs this array member owns, served here.",
            prom "portico_array_owned_total", xml "array-bucket" "countOwned";
        /// Requests for URLs another member owns, served here (its owner
        /// down, or members not forwarding): copies the owner may hold too.
        not_owned: u64 => Counter, Add, None,
            "Requests for URLs another array member owns, served here (owner down or no forwarding): duplicates.",
            prom "portico_array_not_owned_total", xml "array-bucket" "countNotOwned";
        /// One per member, this node included, in config order.
        members: Vec<ArrayMemberInfo> => Section, Add, None, "One per array member.";
    }
}

crate::section! {
    /// One array member. Its name labels its figures.
    pub struct ArrayMemberInfo at "array.members" {
        /// The member's CARP name (`name`, else `address`).
        name: String => Info, First, None, "Array member name.", prom "member", xml "array-member" "name";
        /// Its `host:port`.
        address: String => Info, First, None, "Array member address.", xml "array-member" "address";
        /// Up (this node always is), or marked down by a failed connect or probe.
        up: bool => Gauge, All, None, "1 while the array member is up (this node always is).",
            prom "portico_array_member_up", xml "array-member" "flagUp";
        /// Requests this node forwarded to it.
        forwarded: u64 => Counter, Add, None, "Requests forwarded to the array member that owns their URL.",
            prom "portico_array_forwarded_total", xml "array-member" "countForwarded";
    }
}

impl super::declare::Keyed for ArrayMemberInfo {
    fn key(&self) -> &str {
        &self.name
    }
}
