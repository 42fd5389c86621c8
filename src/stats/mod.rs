//! Statistics: the one model every stage writes to and every view reads.
//!
//! Writing never takes a lock: counters are relaxed atomics, latencies go
//! into fixed atomic histograms (`hist`), and a request's stage timings are
//! gathered in a small struct local to the request's task (no sharing at
//! all) and added to its performance bucket once, when the request ends.
//! `Snapshot` (`snapshot.rs`) is the plain-data copy all views read:
//! perfdump, stats-xml, Prometheus, /nsc, JSON and the tuning advisor.
//! Each figure in it is declared once (`declare.rs` says how; the
//! declarations are in `snapshot.rs`), and its sum across processes, JSON,
//! Prometheus and stats-xml forms derive from that.
//! With several worker processes the views show the sum over them
//! (`sum.rs`), gathered from files the workers write (`workers.rs`).

pub mod advisor;
pub mod declare;
pub mod hist;
pub mod process;
pub mod snapshot;
pub mod sum;
pub mod views;
pub mod workers;

pub use hist::{HistSnapshot, Histogram};
pub use snapshot::*;

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The clock the per-stage timing reads, about a dozen times per request:
/// the CPU's time-stamp counter scaled to nanoseconds (quanta), ~13 ns a
/// read here against ~33 ns for `Instant::now()` (clock_gettime), which is
/// most of what statistics cost on a cache hit. quanta falls back to the
/// OS clock where the TSC is not invariant.
type StageInstant = quanta::Instant;

/// A pipeline stage timed into performance buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Client allow-list (and loop, Max-Forwards checks).
    Access = 0,
    /// Classify and route.
    Route,
    /// Cache lookup (memory, then disk).
    CacheLookup,
    /// Opening a connection to an origin (DNS, TCP, TLS).
    UpstreamConnect,
    /// Waiting for the origin's response head (connect excluded).
    UpstreamResponse,
    /// Writing the response to the client (for a miss, while the body arrives).
    Send,
    /// Formatting and queueing the access log line.
    Log,
}

/// Number of stages.
pub const STAGES: usize = 7;

impl Stage {
    /// Every stage in pipeline order.
    pub const ALL: [Stage; STAGES] = [
        Stage::Access,
        Stage::Route,
        Stage::CacheLookup,
        Stage::UpstreamConnect,
        Stage::UpstreamResponse,
        Stage::Send,
        Stage::Log,
    ];

    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Access => "access-check",
            Stage::Route => "route",
            Stage::CacheLookup => "cache-lookup",
            Stage::UpstreamConnect => "upstream-connect",
            Stage::UpstreamResponse => "upstream-response",
            Stage::Send => "send-to-client",
            Stage::Log => "log",
        }
    }
}

/// What the cache did for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Fresh from the cache.
    Hit = 0,
    /// Fetched from the origin.
    Miss,
    /// Served stale.
    Stale,
    /// Validated with the origin and served from the cache.
    Revalidated,
    /// Answered from another request's fetch of the same object, after
    /// waiting for it (collapsed forwarding): no origin request of its own,
    /// but the wait of a miss. Kept apart from `Hit` so that what waits on
    /// the origin is seen (Squid logs these as `TCP_CF_HIT`).
    Collapsed,
}

const CACHE_NAMES: [&str; 6] = ["HIT", "MISS", "STALE", "REVALIDATED", "COLLAPSED", "NONE"];
const METHODS: [&str; 8] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "PURGE", "other"];
const STATUS: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

fn method_index(m: &http::Method) -> usize {
    match m.as_str() {
        "GET" => 0,
        "HEAD" => 1,
        "POST" => 2,
        "PUT" => 3,
        "DELETE" => 4,
        "CONNECT" => 5,
        "PURGE" => 6,
        _ => 7,
    }
}

fn counters<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

fn load<const N: usize>(names: &[&str; N], c: &[AtomicU64; N]) -> Vec<(String, u64)> {
    names
        .iter()
        .zip(c)
        .map(|(n, c)| (n.to_string(), c.load(Ordering::Relaxed)))
        .collect()
}

/// One performance bucket's counters.
struct Bucket {
    name: String,
    description: String,
    requests: AtomicU64,
    invocations: [AtomicU64; STAGES],
    latency_ns: [AtomicU64; STAGES],
    function_ns: [AtomicU64; STAGES],
}

impl Bucket {
    fn new(name: &str, description: &str) -> Bucket {
        Bucket {
            name: name.to_string(),
            description: description.to_string(),
            requests: AtomicU64::new(0),
            invocations: counters(),
            latency_ns: counters(),
            function_ns: counters(),
        }
    }
}

/// The request-level statistics shared by all listeners.
pub struct Stats {
    /// Per-stage timing and histograms on (`monitor.enabled`).
    pub enabled: bool,
    started: Instant,
    requests: AtomicU64,
    by_method: [AtomicU64; 8],
    by_status: [AtomicU64; 5],
    by_cache: [AtomicU64; CACHE_NAMES.len()],
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    admin_requests: AtomicU64,
    acl_denied: AtomicU64,
    active: AtomicU64,
    peak_active: AtomicU64,
    per_listener: Vec<AtomicU64>,
    response_time: Histogram,
    processing_ns: AtomicU64,
    timed_requests: AtomicU64,
    buckets: Vec<Bucket>,
    /// The SOCKS server's counters (`proxy/socks.rs`).
    pub socks: SocksCounters,
}

/// The SOCKS server's counters, as [`SocksInfo`](crate::stats::SocksInfo) reports them.
#[derive(Default)]
pub struct SocksCounters {
    /// Connections that sent a greeting.
    pub sessions: AtomicU64,
    /// Sessions whose target connection was opened.
    pub established: AtomicU64,
    /// RFC 1929 logins refused.
    pub auth_failures: AtomicU64,
    /// Requests refused by the access rules.
    pub denied: AtomicU64,
    /// Targets that could not be reached.
    pub connect_failures: AtomicU64,
    /// Commands and address types not supported.
    pub unsupported: AtomicU64,
    /// Protocol errors and timeouts during negotiation.
    pub malformed: AtomicU64,
    /// Bytes relayed from clients to targets.
    pub bytes_up: AtomicU64,
    /// Bytes relayed from targets to clients.
    pub bytes_down: AtomicU64,
}

impl SocksCounters {
    /// The counters now.
    pub fn snapshot(&self) -> crate::stats::SocksInfo {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        crate::stats::SocksInfo {
            sessions: l(&self.sessions),
            established: l(&self.established),
            auth_failures: l(&self.auth_failures),
            denied: l(&self.denied),
            connect_failures: l(&self.connect_failures),
            unsupported: l(&self.unsupported),
            malformed: l(&self.malformed),
            bytes_up: l(&self.bytes_up),
            bytes_down: l(&self.bytes_down),
        }
    }
}

impl Stats {
    /// Statistics for `listeners` listeners and the named buckets (the
    /// `default-bucket` is always first).
    pub fn new(enabled: bool, listeners: usize, bucket_names: &[String]) -> Stats {
        let mut buckets = vec![Bucket::new("default-bucket", "Default bucket")];
        for n in bucket_names {
            if n != "default-bucket" && !buckets.iter().any(|b| &b.name == n) {
                buckets.push(Bucket::new(n, &format!("requests routed to bucket {n}")));
            }
        }
        if enabled {
            // Calibrates the stage clock now rather than in the first request.
            let _ = StageInstant::now();
        }
        Stats {
            enabled,
            started: Instant::now(),
            requests: AtomicU64::new(0),
            by_method: counters(),
            by_status: counters(),
            by_cache: counters(),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            admin_requests: AtomicU64::new(0),
            acl_denied: AtomicU64::new(0),
            active: AtomicU64::new(0),
            peak_active: AtomicU64::new(0),
            per_listener: (0..listeners).map(|_| AtomicU64::new(0)).collect(),
            response_time: Histogram::default(),
            processing_ns: AtomicU64::new(0),
            timed_requests: AtomicU64::new(0),
            buckets,
            socks: SocksCounters::default(),
        }
    }

    /// The index of bucket `name` (0, the default bucket, if unknown).
    pub fn bucket_index(&self, name: &str) -> usize {
        self.buckets.iter().position(|b| b.name == name).unwrap_or(0)
    }

    /// When the statistics started (server start).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// A request started on listener `listener`.
    pub fn begin(&self, listener: usize) {
        if let Some(c) = self.per_listener.get(listener) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let now = self.active.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_active.fetch_max(now, Ordering::Relaxed);
    }

    /// A request ended (after `begin`).
    pub fn end(&self, method: &http::Method, status: u16, bytes_in: u64, bytes_out: u64) {
        self.active.fetch_sub(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.by_method[method_index(method)].fetch_add(1, Ordering::Relaxed);
        if (100..600).contains(&status) {
            self.by_status[usize::from(status / 100 - 1)].fetch_add(1, Ordering::Relaxed);
        }
        self.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
    }

    /// A request head that could not be parsed, answered with `status`.
    pub fn rejected(&self, status: u16) {
        self.begin(usize::MAX);
        self.end(&http::Method::from_bytes(b"INVALID").unwrap_or_default(), status, 0, 0);
    }

    /// A request answered by a monitoring endpoint (kept out of the request counters).
    pub fn admin_request(&self) {
        self.admin_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A request refused by an `[[acl]]` entry or `access.acl_default`.
    pub fn acl_denied(&self) {
        self.acl_denied.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a finished request's timings to its bucket and the histograms.
    fn record(&self, t: &RequestTimer) {
        let total = StageInstant::now().saturating_duration_since(t.start);
        self.response_time.record(total);
        self.processing_ns
            .fetch_add(u64::try_from(total.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.timed_requests.fetch_add(1, Ordering::Relaxed);
        let idx = match t.cache {
            Some(c) => c as usize,
            None => CACHE_NAMES.len() - 1,
        };
        self.by_cache[idx].fetch_add(1, Ordering::Relaxed);
        let b = &self.buckets[t.bucket.min(self.buckets.len() - 1)];
        b.requests.fetch_add(1, Ordering::Relaxed);
        for s in 0..STAGES {
            if t.invocations[s] > 0 {
                b.invocations[s].fetch_add(u64::from(t.invocations[s]), Ordering::Relaxed);
                b.latency_ns[s].fetch_add(t.latency_ns[s], Ordering::Relaxed);
                b.function_ns[s].fetch_add(t.function_ns[s], Ordering::Relaxed);
            }
        }
    }

    /// Request counters, sessions (requests in the handler; the admission
    /// layer's figures replace them), buckets and per-listener requests.
    pub fn snapshot_requests(&self) -> (RequestStats, SessionInfo, BucketReport, Vec<u64>) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let requests = RequestStats {
            total: l(&self.requests),
            by_method: load(&METHODS, &self.by_method),
            by_status: load(&STATUS, &self.by_status),
            by_cache: load(&CACHE_NAMES, &self.by_cache),
            bytes_in: l(&self.bytes_in),
            bytes_out: l(&self.bytes_out),
            admin_requests: l(&self.admin_requests),
            acl_denied: l(&self.acl_denied),
            response_time: self.response_time.snapshot(),
        };
        let sessions = SessionInfo {
            active: l(&self.active),
            peak: l(&self.peak_active),
            limit: None,
            waited: None,
        };
        let buckets = BucketReport {
            total_requests: l(&self.timed_requests),
            processing_ns: l(&self.processing_ns),
            buckets: self
                .buckets
                .iter()
                .map(|b| {
                    let stages: Vec<StageInfo> = Stage::ALL
                        .iter()
                        .map(|s| StageInfo {
                            name: s.name().to_string(),
                            invocations: l(&b.invocations[*s as usize]),
                            latency_ns: l(&b.latency_ns[*s as usize]),
                            function_ns: l(&b.function_ns[*s as usize]),
                        })
                        .collect();
                    BucketInfo {
                        name: b.name.clone(),
                        description: b.description.clone(),
                        requests: l(&b.requests),
                        invocations: stages.iter().map(|s| s.invocations).sum(),
                        latency_ns: stages.iter().map(|s| s.latency_ns).sum(),
                        function_ns: stages.iter().map(|s| s.function_ns).sum(),
                        stages,
                    }
                })
                .collect(),
        };
        let per_listener = self.per_listener.iter().map(l).collect();
        (requests, sessions, buckets, per_listener)
    }
}

/// One request's stage timings, gathered on its own task.
pub struct RequestTimer {
    start: StageInstant,
    /// End of the previous stage (start of the request at first).
    last: StageInstant,
    /// Time recorded by stages nested in the running one (upstream connect
    /// inside upstream response), subtracted from it.
    nested_ns: u64,
    invocations: [u32; STAGES],
    latency_ns: [u64; STAGES],
    function_ns: [u64; STAGES],
    bucket: usize,
    cache: Option<CacheOutcome>,
}

impl RequestTimer {
    fn new() -> RequestTimer {
        let now = StageInstant::now();
        RequestTimer {
            start: now,
            last: now,
            nested_ns: 0,
            invocations: [0; STAGES],
            latency_ns: [0; STAGES],
            function_ns: [0; STAGES],
            bucket: 0,
            cache: None,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

tokio::task_local! {
    // Boxed: the task-local is swapped in and out of its slot on every poll
    // of the request's future, and a pointer is cheaper to swap than the
    // ~200-byte timer.
    static TIMER: Box<RefCell<RequestTimer>>;
}

/// Runs one request's future (already boxed: only a pointer moves into the
/// scope) with a fresh timer that [`stage`], [`restart_timer`] and
/// [`record_current`] reach. The connection skips this when statistics are off.
pub fn scope<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    TIMER.scope(Box::new(RefCell::new(RequestTimer::new())), fut)
}

/// Starts the current request's timer afresh (when the handler begins, so
/// reading the request head is not counted); false outside a [`scope`].
pub fn restart_timer() -> bool {
    TIMER
        .try_with(|t| {
            let mut t = t.borrow_mut();
            let now = StageInstant::now();
            t.start = now;
            t.last = now;
        })
        .is_ok()
}

/// Adds the current request's timings to `stats` (when its response is
/// done); nothing outside a [`scope`].
pub fn record_current(stats: &Stats) {
    let _ = TIMER.try_with(|t| stats.record(&t.borrow()));
}

/// Times a stage until the guard is dropped; does nothing outside a timed request.
#[must_use = "the stage ends when the guard is dropped"]
pub struct StageGuard {
    stage: Stage,
    started: Option<(StageInstant, u64)>,
}

/// Starts timing `stage` for the current request.
pub fn stage(stage: Stage) -> StageGuard {
    let started = TIMER
        .try_with(|t| {
            let mut t = t.borrow_mut();
            let now = StageInstant::now();
            let gap = nanos(now.saturating_duration_since(t.last));
            t.latency_ns[stage as usize] += gap;
            t.invocations[stage as usize] += 1;
            (now, t.nested_ns)
        })
        .ok();
    StageGuard { stage, started }
}

impl Drop for StageGuard {
    fn drop(&mut self) {
        let Some((t0, nested0)) = self.started else { return };
        let _ = TIMER.try_with(|t| {
            let mut t = t.borrow_mut();
            let now = StageInstant::now();
            let inner = t.nested_ns - nested0;
            let spent = nanos(now.saturating_duration_since(t0)).saturating_sub(inner);
            t.function_ns[self.stage as usize] += spent;
            t.last = now;
        });
    }
}

/// Adds the time of a stage that ran inside another (the upstream connect
/// inside the wait for the response): counted for `stage`, taken out of the
/// enclosing one.
pub fn nested(stage: Stage, d: Duration) {
    let _ = TIMER.try_with(|t| {
        let mut t = t.borrow_mut();
        t.invocations[stage as usize] += 1;
        t.function_ns[stage as usize] += nanos(d);
        t.nested_ns += nanos(d);
    });
}

/// Puts the current request in bucket `index` (from [`Stats::bucket_index`]).
pub fn set_bucket(index: usize) {
    let _ = TIMER.try_with(|t| t.borrow_mut().bucket = index);
}

/// Notes what the cache did for the current request.
pub fn note_cache(outcome: CacheOutcome) {
    let _ = TIMER.try_with(|t| t.borrow_mut().cache = Some(outcome));
}

impl CacheOutcome {
    /// HIT, MISS, STALE, REVALIDATED or COLLAPSED.
    pub fn name(self) -> &'static str {
        CACHE_NAMES[self as usize]
    }
}

/// Fetches `path` from a running server at `addr` (`portico stats`):
/// the body of a 200 answer, else an error naming what happened.
pub fn fetch(addr: &str, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let target = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(3))
        .map_err(|e| format!("no server answering on {addr}: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("{addr}: reading the answer: {e}"))?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    match status {
        "200" => Ok(body.to_string()),
        "403" => Err(format!(
            "{addr} refused {path}: this host is not in the server's access.admin_allow"
        )),
        other => Err(format!("{addr} answered {other} to {path} (is monitor.perf set?)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stages_land_in_the_chosen_bucket() {
        let stats = Stats::new(true, 1, &["api".to_string()]);
        stats.begin(0);
        scope(async {
            assert!(restart_timer());
            {
                let _g = stage(Stage::Access);
            }
            {
                let _g = stage(Stage::UpstreamResponse);
                nested(Stage::UpstreamConnect, Duration::from_millis(1));
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            set_bucket(stats.bucket_index("api"));
            note_cache(CacheOutcome::Miss);
            record_current(&stats);
        })
        .await;
        stats.end(&http::Method::GET, 200, 0, 10);
        let (req, sessions, report, per_listener) = stats.snapshot_requests();
        assert_eq!(req.total, 1);
        assert_eq!(RequestStats::count(&req.by_cache, "MISS"), 1);
        assert_eq!(RequestStats::count(&req.by_status, "2xx"), 1);
        assert_eq!(sessions.active, 0);
        assert_eq!(per_listener, vec![1]);
        assert_eq!(report.total_requests, 1);
        assert_eq!(report.buckets[0].requests, 0);
        let api = &report.buckets[1];
        assert_eq!((api.name.as_str(), api.requests, api.invocations), ("api", 1, 3));
        let connect = &api.stages[Stage::UpstreamConnect as usize];
        assert_eq!(connect.function_ns, 1_000_000);
        let response = &api.stages[Stage::UpstreamResponse as usize];
        // The nested connect time is not counted twice.
        assert!(response.function_ns >= 2_000_000, "{}", response.function_ns);
        assert!(api.latency_ns + api.function_ns <= report.processing_ns);
    }

    #[test]
    fn stages_outside_a_timed_request_do_nothing() {
        assert!(!restart_timer());
        let _g = stage(Stage::Send);
        nested(Stage::UpstreamConnect, Duration::from_secs(1));
        set_bucket(3);
    }
}
