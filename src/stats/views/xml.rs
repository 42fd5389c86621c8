//! `/stats-xml`: the snapshot as XML with the Sun Java System Web Proxy Server 4's element names
//! (connection-queue, thread-pool, profile, process, connection-queue-bucket,
//! thread-pool-bucket, host-dns-bucket, client-dns-bucket, keepalive-bucket,
//! cache-bucket, cpu-info, thread, request-bucket, profile-bucket).
//! `?name=0` leaves element `name` (and what it holds) out. With several
//! worker processes there is one `<process>` per worker (as the Sun proxy's
//! multi-process server writes it), each with that worker's own figures,
//! and the server-level figures (listen sockets) are their sum.

use crate::stats::snapshot::{RequestStats, Snapshot};
use std::collections::HashSet;
use std::fmt::Write;

/// Element names switched off by the query (`thread=0&process=0`).
pub fn filter(query: &str) -> HashSet<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(_, v)| *v == "0")
        .map(|(k, _)| k.to_string())
        .collect()
}

struct Out<'a> {
    text: String,
    off: &'a HashSet<String>,
    depth: usize,
}

fn escape(v: &str) -> String {
    v.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Out<'_> {
    fn open(&mut self, name: &str, attrs: &[(&str, String)], leaf: bool) {
        let _ = write!(self.text, "{:1$}<{name}", "", self.depth * 2);
        for (k, v) in attrs {
            let _ = write!(self.text, " {k}=\"{}\"", escape(v));
        }
        self.text.push_str(if leaf { "/>\n" } else { ">\n" });
    }

    fn leaf(&mut self, name: &str, attrs: &[(&str, String)]) {
        if !self.off.contains(name) {
            self.open(name, attrs, true);
        }
    }

    fn node(&mut self, name: &str, attrs: &[(&str, String)], inner: impl FnOnce(&mut Self)) {
        if self.off.contains(name) {
            return;
        }
        self.open(name, attrs, false);
        self.depth += 1;
        inner(self);
        self.depth -= 1;
        let _ = writeln!(self.text, "{:1$}</{name}>", "", self.depth * 2);
    }
}

fn a(k: &'static str, v: impl ToString) -> (&'static str, String) {
    (k, v.to_string())
}

/// Ticks are microseconds (`ticksPerSecond`).
const TICKS: u64 = 1_000_000;

/// The document: `s` for the server-level elements; one `<process>` per
/// snapshot in `processes`, or one from `s` itself when that is empty.
pub fn render(s: &Snapshot, processes: &[Snapshot], off: &HashSet<String>) -> String {
    let mut o = Out {
        text: String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n"),
        off,
        depth: 0,
    };
    let srv = &s.server;
    let started = srv.time_unix - srv.uptime_secs;
    o.node(
        "stats",
        &[
            a("versionMajor", 1),
            a("versionMinor", 2),
            a("flagEnabled", u8::from(s.stats_enabled)),
        ],
        |o| {
            o.node(
                "server",
                &[
                    a("id", "portico"),
                    a("versionServer", format!("Portico/{}", srv.version)),
                    a("timeStarted", started as u64),
                    a("secondsRunning", srv.uptime_secs as u64),
                    a("ticksPerSecond", TICKS),
                    a("maxProcs", s.processes.len().max(1)),
                    a("maxThreads", srv.workers),
                    a("flagProfilingEnabled", u8::from(s.stats_enabled)),
                ],
                |o| server_body(o, s, processes),
            );
        },
    );
    o.text
}

fn server_body(o: &mut Out<'_>, s: &Snapshot, processes: &[Snapshot]) {
    if s.connection_queue.is_some() {
        o.leaf("connection-queue", &[a("id", "cq1")]);
    }
    if let Some(p) = &s.native_pool {
        o.leaf("thread-pool", &[a("id", "thread-pool-0"), a("name", &p.name)]);
    }
    for (i, b) in s.buckets.buckets.iter().enumerate() {
        o.leaf(
            "profile",
            &[
                a("id", format!("profile-{i}")),
                a("name", &b.name),
                a("description", &b.description),
            ],
        );
    }
    for (i, cpu) in cpu_times().iter().enumerate() {
        o.leaf(
            "cpu-info",
            &[
                a("cpu", i),
                a("percentIdle", format!("{:.2}", cpu.0)),
                a("percentUser", format!("{:.2}", cpu.1)),
                a("percentKernel", format!("{:.2}", cpu.2)),
            ],
        );
    }
    for p in if processes.is_empty() {
        std::slice::from_ref(s)
    } else {
        processes
    } {
        let srv = &p.server;
        let mut attrs = vec![
            a("pid", srv.pid),
            a("mode", "active"),
            a("timeStarted", (srv.time_unix - srv.uptime_secs) as u64),
            a("sizeResident", srv.rss_bytes),
            a("sizePeakResident", srv.peak_rss_bytes),
            a("countThreads", srv.threads),
            a("countOpenFiles", srv.open_fds),
            a("secondsUser", format!("{:.2}", srv.cpu_user_secs)),
            a("secondsSystem", format!("{:.2}", srv.cpu_system_secs)),
        ];
        if let Some(i) = srv.process_index {
            attrs.push(a("workerIndex", i));
        }
        o.node("process", &attrs, |o| process_body(o, p));
    }
    for l in &s.listeners {
        o.leaf(
            "listen-socket",
            &[
                a("id", &l.name),
                a("address", &l.address),
                a("mode", &l.mode),
                a("countAcceptors", l.acceptor_threads),
                a("listenQueue", l.listen_queue),
                a("countRequests", l.requests),
            ],
        );
    }
}

fn process_body(o: &mut Out<'_>, s: &Snapshot) {
    if let Some(q) = &s.connection_queue {
        o.leaf(
            "connection-queue-bucket",
            &[
                a("connectionQueueId", "cq1"),
                a("countQueued", q.current),
                a("peakQueued", q.peak),
                a("maxQueued", q.limit),
                a("countOverflows", q.overflows),
                a("countAbandoned", q.abandoned),
                a("countTotalQueued", q.total_queued),
                a("ticksTotalQueued", q.queue_time_us),
                a("countQueued1MinuteAverage", format!("{:.2}", q.avg_1)),
                a("countQueued5MinuteAverage", format!("{:.2}", q.avg_5)),
                a("countQueued15MinuteAverage", format!("{:.2}", q.avg_15)),
            ],
        );
    }
    if let Some(p) = &s.native_pool {
        o.leaf(
            "thread-pool-bucket",
            &[
                a("threadPoolId", "thread-pool-0"),
                a("countIdleThreads", p.idle),
                a("countThreads", p.threads),
                a("peakThreads", p.peak),
                a("countJobs", p.jobs),
                a("countRefused", p.refused),
                a("maxThreads", p.limit),
                a("countQueued", p.queue),
                a("peakQueued", p.queue_peak),
                a("maxQueued", p.queue_limit),
            ],
        );
    }
    let d = &s.dns;
    o.leaf(
        "host-dns-bucket",
        &[
            a("flagCacheEnabled", u8::from(d.enabled)),
            a("countCacheEntries", d.entries),
            a("maxCacheEntries", d.max_entries),
            a("countCacheHits", d.hits),
            a("countCacheMisses", d.lookups - d.hits.min(d.lookups)),
            a("countLookupFailures", d.failures),
            a("flagAsyncEnabled", 1),
        ],
    );
    if let Some(u) = &s.auth {
        o.leaf(
            "acl-user-cache-bucket",
            &[
                a("countCacheEntries", u.users),
                a("maxCacheEntries", u.max_users),
                a("countCacheHits", u.hits),
                a("countCacheMisses", u.misses),
                a("countEvictions", u.evictions),
                a("countFailures", u.failures),
                a("countFailedCacheHits", u.failed_cache_hits),
                a("countUnavailable", u.unavailable),
                a("flagBackendFailing", u8::from(u.failing)),
                a("meanVerifyMicros", format!("{:.0}", u.verify_time.mean_us())),
            ],
        );
    }
    let al = &s.access_log;
    o.leaf(
        "client-dns-bucket",
        &[
            a("flagCacheEnabled", u8::from(al.resolve_clients)),
            a("countCacheEntries", al.client_dns_entries),
            a("maxCacheEntries", al.client_dns_max_entries),
            a("countCacheHits", al.client_dns_hits),
            a(
                "countCacheMisses",
                al.client_dns_lookups - al.client_dns_hits.min(al.client_dns_lookups),
            ),
        ],
    );
    let ka = &s.keepalive;
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    o.leaf(
        "keepalive-bucket",
        &[
            a("countConnections", opt(ka.count)),
            a("maxConnections", opt(ka.max)),
            a("countHits", ka.hits),
            a("countFlushes", opt(ka.flushes)),
            a("countRefusals", opt(ka.refusals)),
            a("countTimeouts", opt(ka.timeouts)),
            a("countHeaderTimeouts", opt(ka.header_timeouts)),
            a("countSendTimeouts", opt(ka.send_timeouts)),
            a("countPolled", opt(ka.parked)),
            a("countPolledNew", opt(ka.parked_new)),
            a("countHandoffs", opt(ka.parks)),
            a("secondsTimeout", ka.timeout_secs),
        ],
    );
    match &s.cache {
        None => o.leaf("cache-bucket", &[a("flagEnabled", 0)]),
        Some(c) => o.leaf(
            "cache-bucket",
            &[
                a("flagEnabled", u8::from(c.running)),
                a("secondsMaxAge", c.max_age_secs),
                a("countEntries", c.memory_entries),
                a("countDiskEntries", c.disk.as_ref().map_or(0, |d| d.objects)),
                a("sizeHeapCache", c.memory_bytes),
                a("maxHeapCacheSize", c.memory_limit),
                a("sizeDiskCache", c.disk.as_ref().map_or(0, |d| d.bytes)),
                a("maxDiskCacheSize", c.disk.as_ref().map_or(0, |d| d.limit)),
                a("countLookups", c.lookups),
                a("countHits", c.hits),
                a("countMisses", c.misses),
                a("countStale", c.stale),
                a("countRevalidations", c.revalidations),
                a("countCollapsed", c.collapsed),
                a("countContentHits", c.bytes_served),
                a("countContentMisses", c.bytes_fetched),
                a("percentHitRatio", format!("{:.2}", c.hit_ratio())),
            ],
        ),
    }
    let r = &s.requests;
    o.node(
        "thread",
        &[
            a("mode", "async"),
            a("countWorkers", s.server.workers),
            a("countActiveSessions", s.sessions.active),
            a("peakActiveSessions", s.sessions.peak),
        ],
        |o| {
            let count = |l: &[(String, u64)], n: &str| RequestStats::count(l, n);
            o.leaf(
                "request-bucket",
                &[
                    a("countRequests", r.total),
                    a("countBytesReceived", r.bytes_in),
                    a("countBytesTransmitted", r.bytes_out),
                    a("count1xx", count(&r.by_status, "1xx")),
                    a("count2xx", count(&r.by_status, "2xx")),
                    a("count3xx", count(&r.by_status, "3xx")),
                    a("count4xx", count(&r.by_status, "4xx")),
                    a("count5xx", count(&r.by_status, "5xx")),
                    a("countGet", count(&r.by_method, "GET")),
                    a("countHead", count(&r.by_method, "HEAD")),
                    a("countPost", count(&r.by_method, "POST")),
                    a("countCacheHit", count(&r.by_cache, "HIT")),
                    a("countCacheMiss", count(&r.by_cache, "MISS")),
                    a("countAclDenied", r.acl_denied),
                    a("microsResponseP50", r.response_time.quantile_us(0.5)),
                    a("microsResponseP99", r.response_time.quantile_us(0.99)),
                ],
            );
            for (i, b) in s.buckets.buckets.iter().enumerate() {
                o.leaf(
                    "profile-bucket",
                    &[
                        a("profile", format!("profile-{i}")),
                        a("countCalls", b.invocations),
                        a("countRequests", b.requests),
                        a("ticksDispatch", b.latency_ns / 1000),
                        a("ticksFunction", b.function_ns / 1000),
                    ],
                );
            }
        },
    );
}

/// Per-CPU (idle, user, kernel) percent since boot, from /proc/stat.
fn cpu_times() -> Vec<(f64, f64, f64)> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            let get = |i: usize| v.get(i).copied().unwrap_or(0);
            let total: u64 = v.iter().sum::<u64>().max(1);
            let pct = |x: u64| x as f64 * 100.0 / total as f64;
            (
                pct(get(3) + get(4)),
                pct(get(0) + get(1)),
                pct(get(2) + get(5) + get(6)),
            )
        })
        .collect()
}

#[cfg(test)]
// Synthetic snapshots read best set field by field.
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::stats::snapshot::CacheInfo;

    #[test]
    fn filters_drop_elements_and_their_children() {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            running: true,
            lookups: 15,
            hits: 10,
            ..Default::default()
        });
        let all = render(&s, &[], &HashSet::new());
        assert!(all.contains("<thread ") && all.contains("<request-bucket ") && all.contains("<process "));
        assert!(
            all.contains("countHits=\"10\"") && all.contains("percentHitRatio=\"66.67\""),
            "{all}"
        );
        let some = render(&s, &[], &filter("thread=0&cpu-info=0&x=1"));
        assert!(!some.contains("<thread ") && !some.contains("<request-bucket ") && !some.contains("<cpu-info"));
        assert!(some.contains("<cache-bucket "));
        let none = render(&s, &[], &filter("process=0"));
        assert!(!none.contains("<cache-bucket ") && !none.contains("<thread "));
        assert!(none.contains("</server>") && none.contains("</stats>"));
    }

    #[test]
    fn one_process_element_per_worker() {
        let part = |i: usize, pid: u32, n: u64| {
            let mut p = Snapshot::default();
            p.server.pid = pid;
            p.server.process_index = Some(i);
            p.requests.total = n;
            p
        };
        let parts = [part(0, 10, 3), part(1, 11, 4)];
        let mut sum = crate::stats::Snapshot::sum(&parts);
        sum.processes = vec![Default::default(), Default::default()];
        let text = render(&sum, &parts, &HashSet::new());
        assert!(text.contains("maxProcs=\"2\""), "{text}");
        assert_eq!(text.matches("<process ").count(), 2, "{text}");
        let at = |pat: &str| text.find(pat).unwrap_or_else(|| panic!("{pat}\n{text}"));
        assert!(at("pid=\"10\"") < at("countRequests=\"3\""));
        assert!(at("countRequests=\"3\"") < at("pid=\"11\""));
        assert!(at("pid=\"11\"") < at("countRequests=\"4\""));
        assert!(text.contains("workerIndex=\"1\""));
    }
}
