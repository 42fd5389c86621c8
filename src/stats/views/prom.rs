//! `/metrics`: Prometheus text exposition (format 0.0.4), written by hand
//! from the snapshot: every counter, gauge and latency histogram, names
//! `portico_*` plus the standard `process_*` ones (with several worker
//! processes, summed over them: `portico_processes` says how many). Hand-rolled rather than
//! prometheus-client because the values already live in our own atomics and
//! histograms; a registry would only copy them.

use crate::stats::hist::HistSnapshot;
use crate::stats::snapshot::Snapshot;
use std::fmt::Write;

struct Out(String);

fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
        self.head(name, kind, help);
        let _ = writeln!(self.0, "{name} {v}");
    }

    fn labelled(&mut self, name: &str, kind: &str, help: &str, label: &str, values: &[(String, u64)]) {
        self.head(name, kind, help);
        for (l, v) in values {
            let _ = writeln!(self.0, "{name}{{{label}=\"{}\"}} {v}", label_value(l));
        }
    }

    /// Buckets at powers of two microseconds, 1 µs .. 2^25 µs (about 33 s).
    fn histogram(&mut self, name: &str, help: &str, h: &HistSnapshot) {
        self.head(name, "histogram", help);
        for (edge_us, count) in h.cumulative_pow2(25) {
            let _ = writeln!(self.0, "{name}_bucket{{le=\"{}\"}} {count}", edge_us as f64 / 1e6);
        }
        let _ = writeln!(self.0, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(self.0, "{name}_sum {}", h.sum_us as f64 / 1e6);
        let _ = writeln!(self.0, "{name}_count {}", h.count);
    }
}

/// The exposition text.
pub fn render(s: &Snapshot) -> String {
    let mut o = Out(String::new());
    let srv = &s.server;
    o.one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        format!("{:.3}", srv.time_unix - srv.uptime_secs),
    );
    o.one(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        format!("{:.2}", srv.cpu_user_secs + srv.cpu_system_secs),
    );
    o.one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        srv.rss_bytes,
    );
    o.one(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        srv.open_fds,
    );
    o.one("portico_threads", "gauge", "OS threads of the process.", srv.threads);
    o.one("portico_workers", "gauge", "Async runtime worker threads.", srv.workers);
    o.one(
        "portico_processes",
        "gauge",
        "Worker processes whose figures are summed here (1: a single process, or ?worker=I).",
        s.processes.iter().filter(|p| p.counted).count().max(1),
    );

    let r = &s.requests;
    o.labelled(
        "portico_requests_total",
        "counter",
        "Requests answered, by method.",
        "method",
        &r.by_method,
    );
    o.labelled(
        "portico_responses_total",
        "counter",
        "Responses, by status class.",
        "code",
        &r.by_status,
    );
    o.labelled(
        "portico_cache_requests_total",
        "counter",
        "Requests by what the cache did (NONE: not cacheable or bypassed).",
        "cache",
        &r.by_cache,
    );
    o.one(
        "portico_received_body_bytes_total",
        "counter",
        "Request body bytes received.",
        r.bytes_in,
    );
    o.one(
        "portico_sent_body_bytes_total",
        "counter",
        "Response body bytes sent.",
        r.bytes_out,
    );
    o.one(
        "portico_admin_requests_total",
        "counter",
        "Requests answered by the monitoring endpoints.",
        r.admin_requests,
    );
    o.one(
        "portico_acl_denied_total",
        "counter",
        "Requests refused by the access control list ([[acl]] deny entries and access.acl_default).",
        r.acl_denied,
    );
    o.histogram(
        "portico_response_seconds",
        "Time from request head to access log line.",
        &r.response_time,
    );
    o.one(
        "portico_sessions_active",
        "gauge",
        "Requests in service.",
        s.sessions.active,
    );
    o.one(
        "portico_sessions_peak",
        "gauge",
        "Most requests in service at once.",
        s.sessions.peak,
    );
    if let Some(limit) = s.sessions.limit {
        o.one(
            "portico_sessions_limit",
            "gauge",
            "Admission limit (server.max_requests).",
            limit,
        );
    }
    if let Some(w) = s.sessions.waited {
        o.one(
            "portico_sessions_waited_total",
            "counter",
            "Requests that waited for admission.",
            w,
        );
    }
    o.head(
        "portico_listener_requests_total",
        "counter",
        "Requests received, by listener.",
    );
    for l in &s.listeners {
        let _ = writeln!(
            o.0,
            "portico_listener_requests_total{{listener=\"{}\",address=\"{}\"}} {}",
            label_value(&l.name),
            label_value(&l.address),
            l.requests
        );
    }

    if let Some(q) = &s.connection_queue {
        o.one(
            "portico_connection_queue_length",
            "gauge",
            "Connections queued now.",
            q.current,
        );
        o.one(
            "portico_connection_queue_peak",
            "gauge",
            "Most connections queued at once.",
            q.peak,
        );
        o.one(
            "portico_connection_queue_limit",
            "gauge",
            "Connection queue size.",
            q.limit,
        );
        o.one(
            "portico_connection_queue_queued_total",
            "counter",
            "Connections ever queued.",
            q.total_queued,
        );
        o.one(
            "portico_connection_queue_overflows_total",
            "counter",
            "Connections refused with 503 because the queue was full.",
            q.overflows,
        );
        o.one(
            "portico_connection_queue_abandoned_total",
            "counter",
            "Queued requests whose client went away before admission.",
            q.abandoned,
        );
        o.one(
            "portico_connection_queue_wait_seconds_total",
            "counter",
            "Time connections spent queued.",
            q.queue_time_us as f64 / 1e6,
        );
    }
    let ka = &s.keepalive;
    o.one(
        "portico_keepalive_hits_total",
        "counter",
        "Requests received on a kept-alive connection.",
        ka.hits,
    );
    for (name, help, v, kind) in [
        (
            "portico_keepalive_connections",
            "Idle persistent connections.",
            ka.count,
            "gauge",
        ),
        (
            "portico_keepalive_max_connections",
            "Most idle persistent connections.",
            ka.max,
            "gauge",
        ),
        (
            "portico_keepalive_flushes_total",
            "Idle connections closed to make room.",
            ka.flushes,
            "counter",
        ),
        (
            "portico_keepalive_refusals_total",
            "Connections not kept alive (limit reached).",
            ka.refusals,
            "counter",
        ),
        (
            "portico_keepalive_timeouts_total",
            "Idle connections closed by the timeout.",
            ka.timeouts,
            "counter",
        ),
        (
            "portico_send_timeouts_total",
            "Connections closed because the client accepted no response bytes for limits.send_timeout.",
            ka.send_timeouts,
            "counter",
        ),
        (
            "portico_keepalive_polled_connections",
            "Idle persistent connections held by the keep-alive poller.",
            ka.parked,
            "gauge",
        ),
        (
            "portico_keepalive_polled_new_connections",
            "New connections (no request yet) held by the keep-alive poller.",
            ka.parked_new,
            "gauge",
        ),
        (
            "portico_keepalive_handoffs_total",
            "Connections handed to the keep-alive poller.",
            ka.parks,
            "counter",
        ),
    ] {
        if let Some(v) = v {
            o.one(name, kind, help, v);
        }
    }
    if let Some(p) = &s.native_pool {
        o.one(
            "portico_blocking_pool_idle_threads",
            "gauge",
            "Idle blocking-pool threads.",
            p.idle,
        );
        o.one(
            "portico_blocking_pool_peak_threads",
            "gauge",
            "Most blocking-pool threads.",
            p.peak,
        );
        o.one(
            "portico_blocking_pool_max_threads",
            "gauge",
            "Blocking-pool thread limit.",
            p.limit,
        );
        o.one(
            "portico_blocking_pool_queue_length",
            "gauge",
            "Work waiting for a thread.",
            p.queue,
        );
        o.one(
            "portico_blocking_pool_queue_peak",
            "gauge",
            "Most work waiting at once.",
            p.queue_peak,
        );
    }

    if let Some(c) = &s.cache {
        o.one(
            "portico_cache_running",
            "gauge",
            "1 while the cache serves and stores.",
            u8::from(c.running),
        );
        for (name, help, v) in [
            ("portico_cache_lookups_total", "Cache lookups.", c.lookups),
            ("portico_cache_hits_total", "Served fresh from the cache.", c.hits),
            ("portico_cache_misses_total", "Not found in the cache.", c.misses),
            ("portico_cache_stale_total", "Served stale.", c.stale),
            (
                "portico_cache_revalidations_total",
                "Conditional requests to origins.",
                c.revalidations,
            ),
            (
                "portico_cache_collapsed_total",
                "Requests that shared another's fetch.",
                c.collapsed,
            ),
            ("portico_cache_stored_total", "Objects stored.", c.stored),
            (
                "portico_cache_invalidated_total",
                "Objects invalidated or purged.",
                c.invalidated,
            ),
            (
                "portico_cache_served_bytes_total",
                "Body bytes served from the cache.",
                c.bytes_served,
            ),
        ] {
            o.one(name, "counter", help, v);
        }
        o.one(
            "portico_cache_hit_ratio",
            "gauge",
            "Hits / lookups since start (0..1).",
            format!("{:.4}", c.hit_ratio() / 100.0),
        );
        o.one(
            "portico_cache_memory_objects",
            "gauge",
            "Objects in the memory tier.",
            c.memory_entries,
        );
        o.one(
            "portico_cache_memory_bytes",
            "gauge",
            "Bytes in the memory tier.",
            c.memory_bytes,
        );
        o.one(
            "portico_cache_memory_limit_bytes",
            "gauge",
            "Memory tier budget.",
            c.memory_limit,
        );
        if let Some(d) = &c.disk {
            o.one(
                "portico_cache_disk_objects",
                "gauge",
                "Objects in the disk tier.",
                d.objects,
            );
            o.one("portico_cache_disk_bytes", "gauge", "Bytes in the disk tier.", d.bytes);
            o.one("portico_cache_disk_limit_bytes", "gauge", "Disk tier budget.", d.limit);
            o.one(
                "portico_cache_disk_high_watermark_bytes",
                "gauge",
                "GC starts above this.",
                d.high_watermark,
            );
            for (name, help, v) in [
                ("portico_cache_disk_reads_total", "Objects read from disk.", d.reads),
                ("portico_cache_disk_writes_total", "Objects written to disk.", d.writes),
                (
                    "portico_cache_disk_evictions_total",
                    "Objects evicted by GC.",
                    d.evictions,
                ),
                ("portico_cache_disk_gc_runs_total", "GC runs.", d.gc_runs),
                (
                    "portico_cache_disk_checksum_failures_total",
                    "Objects that failed their checksum.",
                    d.checksum_failures,
                ),
            ] {
                o.one(name, "counter", help, v);
            }
        }
    }

    let d = &s.dns;
    o.one(
        "portico_dns_lookups_total",
        "counter",
        "Origin names looked up.",
        d.lookups,
    );
    o.one(
        "portico_dns_cache_hits_total",
        "counter",
        "Answered from the DNS cache.",
        d.hits,
    );
    o.one(
        "portico_dns_failures_total",
        "counter",
        "Lookups that failed.",
        d.failures,
    );
    o.one("portico_dns_cache_entries", "gauge", "Names cached.", d.entries);
    o.one(
        "portico_dns_cache_max_entries",
        "gauge",
        "Most names cached.",
        d.max_entries,
    );

    let u = &s.upstream;
    o.one(
        "portico_upstream_requests_total",
        "counter",
        "Requests sent to origins.",
        u.requests,
    );
    o.one(
        "portico_upstream_connects_total",
        "counter",
        "Connections opened to origins.",
        u.connects,
    );
    o.labelled(
        "portico_upstream_errors_total",
        "counter",
        "Failures before a response head, by kind.",
        "kind",
        &[
            ("dns".to_string(), u.dns_errors),
            ("refused".to_string(), u.connect_errors),
            ("connect_timeout".to_string(), u.connect_timeouts),
            ("tls".to_string(), u.tls_errors),
            ("response_timeout".to_string(), u.response_timeouts),
            ("other".to_string(), u.other_errors),
        ],
    );
    o.histogram(
        "portico_upstream_connect_seconds",
        "Time to open a connection to an origin.",
        &u.connect_time,
    );
    o.histogram(
        "portico_upstream_first_byte_seconds",
        "Time from sending a request to the response head (a new connection's connect included).",
        &u.first_byte_time,
    );

    if let Some(a) = &s.auth {
        o.one(
            "portico_auth_cache_users",
            "gauge",
            "Users in the authentication user cache.",
            a.users,
        );
        o.one(
            "portico_auth_cache_max_users",
            "gauge",
            "Most users the user cache holds (auth.max_users).",
            a.max_users,
        );
        for (name, help, v) in [
            (
                "portico_auth_cache_hits_total",
                "Credentials found in the user cache.",
                a.hits,
            ),
            (
                "portico_auth_cache_misses_total",
                "Credentials verified against the user file or the LDAP directory.",
                a.misses,
            ),
            (
                "portico_auth_cache_evictions_total",
                "Users dropped from the full user cache.",
                a.evictions,
            ),
            (
                "portico_auth_failures_total",
                "Verifications that failed (wrong password, unknown user).",
                a.failures,
            ),
            (
                "portico_auth_failed_cache_hits_total",
                "Failed logins answered from the failed-login cache.",
                a.failed_cache_hits,
            ),
            (
                "portico_auth_unavailable_total",
                "Requests answered 503: the user file or the directory could not be used.",
                a.unavailable,
            ),
            ("portico_auth_reloads_total", "Loads of the user file.", a.reloads),
        ] {
            o.one(name, "counter", help, v);
        }
        o.one(
            "portico_auth_backend_failing",
            "gauge",
            "1 while the user file is missing or unreadable, or the directory is failing.",
            u8::from(a.failing),
        );
        o.histogram(
            "portico_auth_verify_seconds",
            "Time to verify one password against the user file or the directory.",
            &a.verify_time,
        );
    }

    o.head(
        "portico_bucket_requests_total",
        "counter",
        "Requests timed into each performance bucket.",
    );
    for b in &s.buckets.buckets {
        let _ = writeln!(
            o.0,
            "portico_bucket_requests_total{{bucket=\"{}\"}} {}",
            label_value(&b.name),
            b.requests
        );
    }
    for (name, help, pick) in [
        (
            "portico_stage_invocations_total",
            "Stage invocations per bucket.",
            (|st: &crate::stats::StageInfo| st.invocations as f64) as fn(&crate::stats::StageInfo) -> f64,
        ),
        (
            "portico_stage_latency_seconds_total",
            "Time before each stage started (dispatch), per bucket.",
            |st| st.latency_ns as f64 / 1e9,
        ),
        (
            "portico_stage_function_seconds_total",
            "Time inside each stage, per bucket.",
            |st| st.function_ns as f64 / 1e9,
        ),
    ] {
        o.head(name, "counter", help);
        for b in &s.buckets.buckets {
            for st in &b.stages {
                let _ = writeln!(
                    o.0,
                    "{name}{{bucket=\"{}\",stage=\"{}\"}} {}",
                    label_value(&b.name),
                    st.name,
                    pick(st)
                );
            }
        }
    }
    let al = &s.access_log;
    o.one(
        "portico_access_log_lines_total",
        "counter",
        "Access log lines written.",
        al.lines,
    );
    o.one(
        "portico_access_log_dropped_total",
        "counter",
        "Access log lines dropped (writer behind).",
        al.dropped,
    );
    o.0
}

#[cfg(test)]
// Synthetic snapshots read best set field by field.
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::stats::snapshot::CacheInfo;

    #[test]
    fn histograms_are_cumulative_and_counters_end_in_total() {
        let mut s = Snapshot::default();
        s.requests.response_time = HistSnapshot::from_values(&[3, 1500, 2_000_000]);
        s.cache = Some(CacheInfo {
            lookups: 15,
            hits: 10,
            ..Default::default()
        });
        let t = render(&s);
        assert!(
            t.contains("portico_response_seconds_bucket{le=\"0.000004\"} 1\n"),
            "{t}"
        );
        assert!(t.contains("portico_response_seconds_bucket{le=\"0.002048\"} 2\n"));
        assert!(t.contains("portico_response_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(t.contains("portico_response_seconds_count 3\n"));
        assert!(t.contains("portico_cache_hit_ratio 0.6667\n"));
        for line in t.lines().filter(|l| l.starts_with("# TYPE") && l.ends_with(" counter")) {
            assert!(line.contains("_total "), "{line}");
        }
    }
}
