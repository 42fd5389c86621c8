//! `/.perf`: the perfdump plain-text report, in the Sun Java System Web Proxy Server 4's layout and
//! section names (ConnectionQueue, ListenSocket, KeepAliveInfo,
//! SessionCreationInfo, CacheInfo, Native pools, DNSCacheInfo), then
//! Portico's own sections, the tuning advice, and the performance buckets last.

use crate::stats::advisor::Advice;
use crate::stats::snapshot::{Snapshot, percent};
use std::fmt::Write;

const RULE: &str = "-----------------------------------------";

/// Why there is no ACL cache (the Sun proxy's `ACLCacheMax`, URL to the
/// entries that apply): the compiled `[[acl]]` index already finds a
/// request's few candidate entries with one hash lookup per label of its
/// host, so its cost does not grow with the number of entries, and a
/// cache lookup (hash the URL, probe, bound the size) would cost as much
/// as the decision it saves. Figures: benches/acl.rs.
const ACL_CACHE: &str = "none: not needed; the compiled host index decides in ~70-100 ns with 10 or 10,000 entries alike (benches/acl.rs), no more than a URL cache lookup would cost";

fn na<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| v.to_string())
}

/// `a/b ( 66.67%)` as the Sun proxy writes ratios.
pub fn ratio(a: u64, b: u64) -> String {
    format!("{a}/{b} ({:6.2}%)", percent(a, b))
}

fn secs(us: u64) -> String {
    format!("{:.4}", us as f64 / 1e6)
}

/// The whole report.
pub fn render(s: &Snapshot, advice: &[Advice]) -> String {
    let mut o = String::new();
    let srv = &s.server;
    if s.processes.is_empty() {
        let _ = writeln!(
            o,
            "Portico {} perfdump (pid {}{}), up {:.0} seconds\n",
            srv.version,
            srv.pid,
            srv.process_index.map(|i| format!(", worker {i}")).unwrap_or_default(),
            srv.uptime_secs
        );
    } else {
        let counted = s.processes.iter().filter(|p| p.counted).count();
        let _ = writeln!(
            o,
            "Portico {} perfdump, summed over {counted} of {} processes (answered by pid {}{}), up {:.0} seconds\n",
            srv.version,
            s.processes.len(),
            srv.pid,
            srv.process_index.map(|i| format!(", worker {i}")).unwrap_or_default(),
            srv.uptime_secs
        );
        processes(&mut o, s);
    }

    let _ = writeln!(o, "ConnectionQueue:\n{RULE}");
    match &s.connection_queue {
        Some(q) => {
            let _ = writeln!(
                o,
                "{:<40} {}/{}/{}",
                "Current/Peak/Limit Queue Length", q.current, q.peak, q.limit
            );
            let _ = writeln!(o, "{:<40} {}", "Total Connections Queued", q.total_queued);
            let _ = writeln!(o, "{:<40} {}", "Connections Overflowed", q.overflows);
            let _ = writeln!(o, "{:<40} {}", "Connections Abandoned", q.abandoned);
            let _ = writeln!(o, "{:<40} {}", "Hits Answered Without Queueing", q.unqueued_hits);
            let _ = writeln!(o, "{:<40} {}", "Admitted Beyond The Limit", q.admitted_beyond_limit);
            let _ = writeln!(o, "{:<40} {}", "Closed Over Client Limit", q.client_limited);
            let _ = writeln!(o, "{:<40} {}", "Refused Over Client Rate", q.client_rate_limited);
            let _ = writeln!(o, "{:<40} {}", "Refused Over Route Rate", q.route_rate_limited);
            let _ = writeln!(
                o,
                "{:<40} {}",
                "Refused Over Route Total Rate", q.route_total_rate_limited
            );
            let _ = writeln!(o, "{:<40} {}", "Client Table Evictions", q.client_table_evictions);
            let _ = writeln!(o, "{:<40} {}", "Connections Counted Apart", q.connections_counted_apart);
            for (label, waits, us) in [
                (
                    "Waits Over Client Bandwidth",
                    q.client_bandwidth_waits,
                    q.client_bandwidth_wait_us,
                ),
                (
                    "Waits Over Total Bandwidth",
                    q.total_bandwidth_waits,
                    q.total_bandwidth_wait_us,
                ),
                (
                    "Waits Over Route Bandwidth",
                    q.route_bandwidth_waits,
                    q.route_bandwidth_wait_us,
                ),
            ] {
                let _ = writeln!(o, "{label:<40} {waits} ({} ms)", us / 1000);
            }
            let _ = writeln!(
                o,
                "{:<40} {:.2}, {:.2}, {:.2}",
                "Average Queue Length (1, 5, 15 minutes)", q.avg_1, q.avg_5, q.avg_15
            );
            let _ = writeln!(
                o,
                "{:<40} {:.2} milliseconds",
                "Average Queueing Delay",
                q.avg_delay_ms()
            );
        }
        None => {
            let _ = writeln!(o, "(no connection queue: every accepted connection is served at once)");
        }
    }
    o.push('\n');

    for l in &s.listeners {
        let _ = writeln!(o, "ListenSocket {}:\n{RULE}", l.name);
        let _ = writeln!(o, "{:<24} {}", "Address", l.address);
        let _ = writeln!(o, "{:<24} {}", "Acceptor Threads", l.acceptor_threads);
        let _ = writeln!(o, "{:<24} {}", "Default Virtual Server", l.mode);
        if l.listen_queue_configured > l.listen_queue {
            let _ = writeln!(
                o,
                "{:<24} {} (listen_queue = {} capped by net.core.somaxconn)",
                "Listen Queue", l.listen_queue, l.listen_queue_configured
            );
        } else {
            let _ = writeln!(o, "{:<24} {}", "Listen Queue", l.listen_queue);
        }
        let _ = writeln!(o, "{:<24} {}", "Requests", l.requests);
        o.push('\n');
    }

    let ka = &s.keepalive;
    let _ = writeln!(o, "KeepAliveInfo:\n{RULE}");
    let count = match (ka.count, ka.max) {
        (Some(c), Some(m)) => format!("{c}/{m}"),
        (Some(c), None) => c.to_string(),
        _ => "n/a".to_string(),
    };
    let _ = writeln!(o, "{:<20} {count}", "KeepAliveCount");
    let _ = writeln!(o, "{:<20} {}", "KeepAliveHits", ka.hits);
    let _ = writeln!(o, "{:<20} {}", "KeepAliveFlushes", na(ka.flushes));
    let _ = writeln!(o, "{:<20} {}", "KeepAliveRefusals", na(ka.refusals));
    let _ = writeln!(o, "{:<20} {}", "KeepAliveTimeouts", na(ka.timeouts));
    if let Some(h) = ka.header_timeouts {
        let _ = writeln!(o, "{:<20} {h}", "HeaderTimeouts");
    }
    if let Some(s) = ka.send_timeouts {
        let _ = writeln!(o, "{:<20} {s}", "SendTimeouts");
    }
    // The poller's share (the Sun proxy's keep-alive subsystem in high-concurrency mode).
    if let (Some(p), Some(n), Some(t)) = (ka.parked, ka.parked_new, ka.parks) {
        let _ = writeln!(o, "{:<20} {p} kept-alive, {n} new", "KeepAlivePolled");
        let _ = writeln!(o, "{:<20} {t}", "KeepAliveHandoffs");
    }
    let _ = writeln!(o, "{:<20} {} seconds", "KeepAliveTimeout", ka.timeout_secs);
    let _ = writeln!(o, "{:<20} {}", "MaxKeepAliveRequests", ka.max_requests);
    o.push('\n');

    // Only once a TLS listener has seen a client: a server without one
    // keeps the report it always had.
    let tls = &s.tls;
    if tls.handshakes + tls.failures() > 0 {
        let _ = writeln!(o, "SSLInfo:\n{RULE}");
        let _ = writeln!(o, "{:<28} {}", "Handshakes", tls.handshakes);
        let _ = writeln!(
            o,
            "{:<28} {} (protocol {}, certificate {}, timeout {}, other {})",
            "Handshake Failures",
            tls.failures(),
            tls.failed_protocol,
            tls.failed_certificate,
            tls.failed_timeout,
            tls.failed_other
        );
        let _ = writeln!(
            o,
            "{:<28} {} full, {} resumed ({:.2}% resumed)",
            "Handshake Kinds",
            tls.full,
            tls.resumed,
            tls.resumed_ratio()
        );
        let _ = writeln!(
            o,
            "{:<28} {}/{}",
            "Session Cache Entries", tls.session_cache_entries, tls.session_cache_limit
        );
        let _ = writeln!(
            o,
            "{:<28} {} hits, {} misses",
            "Session Cache Lookups", tls.session_cache_hits, tls.session_cache_misses
        );
        let _ = writeln!(
            o,
            "{:<28} {} issued, {} refused{}",
            "Session Tickets",
            tls.tickets_issued,
            tls.tickets_refused,
            if tls.tickets_enabled { "" } else { " (off)" }
        );
        o.push('\n');
    }

    // Only once a client has spoken HTTP/2.
    let h2 = &s.http2;
    if h2.connections > 0 {
        let _ = writeln!(o, "Http2Info:\n{RULE}");
        let _ = writeln!(o, "{:<28} {}", "Connections", h2.connections);
        let _ = writeln!(o, "{:<28} {}", "Streams", h2.streams);
        let _ = writeln!(o, "{:<28} {}", "Client Resets", h2.client_resets);
        let _ = writeln!(o, "{:<28} {}", "Resets Sent", h2.resets_sent);
        let _ = writeln!(
            o,
            "{:<28} {} (idle {}, ping timeout {}, drain {}, enhance your calm {}, protocol error {}, other {})",
            "GOAWAY Sent",
            h2.goaways(),
            h2.goaway_idle,
            h2.goaway_ping_timeout,
            h2.goaway_drain,
            h2.goaway_enhance_your_calm,
            h2.goaway_protocol,
            h2.goaway_other
        );
        o.push('\n');
    }

    let ss = &s.sessions;
    let _ = writeln!(o, "SessionCreationInfo:\n{RULE}");
    let _ = writeln!(o, "{:<28} {}", "Active Sessions", ss.active);
    let _ = writeln!(o, "{:<28} {}/{}", "Peak/Limit Sessions", ss.peak, na(ss.limit));
    let _ = writeln!(o, "{:<28} {}", "Sessions Waited", na(ss.waited));
    let _ = writeln!(o, "{:<28} {}", "Worker Threads", srv.workers);
    let _ = writeln!(o, "{:<28} {}", "Process Threads", srv.threads);
    let _ = writeln!(
        o,
        "{:<28} {} bytes (peak {})",
        "Resident Memory", srv.rss_bytes, srv.peak_rss_bytes
    );
    let _ = writeln!(
        o,
        "{:<28} {:.2} user, {:.2} system seconds",
        "CPU Time", srv.cpu_user_secs, srv.cpu_system_secs
    );
    let _ = writeln!(o, "{:<28} {}", "Open Files", srv.open_fds);
    o.push('\n');

    let _ = writeln!(o, "CacheInfo:\n{RULE}");
    match &s.cache {
        None => {
            let _ = writeln!(o, "{:<28} no", "Cache Enabled");
        }
        Some(c) => {
            let _ = writeln!(
                o,
                "{:<28} {}",
                "Cache Enabled",
                if c.running { "yes" } else { "stopped" }
            );
            let _ = writeln!(
                o,
                "{:<28} {}",
                "Cache Entries",
                format_args!(
                    "{} memory, {} disk",
                    c.memory_entries,
                    c.disk.as_ref().map_or("-".to_string(), |d| d.objects.to_string())
                )
            );
            let _ = writeln!(o, "{:<28} {}", "Cache Hit Ratio", ratio(c.hits, c.lookups));
            let _ = writeln!(
                o,
                "{:<28} {}",
                "Byte Hit Ratio",
                ratio(c.bytes_served, s.requests.bytes_out)
            );
            let _ = writeln!(
                o,
                "{:<28} {} misses, {} stale, {} revalidated, {} collapsed",
                "Other Lookups", c.misses, c.stale, c.revalidations, c.collapsed
            );
            let _ = writeln!(
                o,
                "{:<28} {} stored, {} invalidated, {} variants dropped, {} fetches abandoned",
                "Objects", c.stored, c.invalidated, c.variants_dropped, c.fetches_abandoned
            );
            let _ = writeln!(
                o,
                "{:<28} {}",
                "Maximum Age",
                if c.max_age_secs == 0 {
                    "origin's (no cap)".to_string()
                } else {
                    c.max_age_secs.to_string()
                }
            );
            // The process's resident memory beside the tier's budget: the
            // tier counts what its objects hold, allocator overhead included,
            // so the difference is what connections and buffers cost.
            let _ = writeln!(
                o,
                "{:<28} {}/{} bytes in {} objects (process resident {} bytes)",
                "Memory Tier", c.memory_bytes, c.memory_limit, c.memory_entries, srv.rss_bytes
            );
            if let Some(d) = &c.disk {
                let _ = writeln!(
                    o,
                    "{:<28} {}/{} bytes (high watermark {})",
                    "Disk Tier", d.bytes, d.limit, d.high_watermark
                );
                let _ = writeln!(
                    o,
                    "{:<28} {} reads, {} writes, {} evictions, {} GC runs",
                    "Disk Activity", d.reads, d.writes, d.evictions, d.gc_runs
                );
            }
        }
    }
    o.push('\n');

    let _ = writeln!(o, "Native pools:\n{RULE}");
    match &s.native_pool {
        Some(p) => {
            let _ = writeln!(o, "{}:", p.name);
            let _ = writeln!(o, "{:<30} {}/{}/{}", "Idle/Peak/Limit", p.idle, p.peak, p.limit);
            let _ = writeln!(
                o,
                "{:<30} {}/{}/{}",
                "Work Queue Length/Peak/Limit", p.queue, p.queue_peak, p.queue_limit
            );
            let _ = writeln!(o, "{:<30} {} ({} refused: busy 503)", "Jobs", p.jobs, p.refused);
        }
        None => {
            let _ = writeln!(o, "(not reported)");
        }
    }
    o.push('\n');

    let d = &s.dns;
    let _ = writeln!(o, "DNSCacheInfo:\n{RULE}");
    let _ = writeln!(o, "{:<16} {}", "enabled", if d.enabled { "yes" } else { "no" });
    if d.enabled {
        let _ = writeln!(o, "{:<16} {}/{}", "CacheEntries", d.entries, d.max_entries);
        let _ = writeln!(o, "{:<16} {}", "HitRatio", ratio(d.hits, d.lookups));
        let _ = writeln!(o, "{:<16} {}", "Failures", d.failures);
    }
    o.push('\n');

    if let Some(a) = &s.auth {
        // The Sun proxy's ACL user cache section.
        let _ = writeln!(o, "ACLUserCacheInfo:\n{RULE}");
        let _ = writeln!(o, "{:<16} {}/{}", "CacheEntries", a.users, a.max_users);
        let _ = writeln!(o, "{:<16} {}", "HitRatio", ratio(a.hits, a.hits + a.misses));
        let _ = writeln!(o, "{:<16} {}", "Evictions", a.evictions);
        let _ = writeln!(o, "{:<16} {}", "Failures", a.failures);
        let _ = writeln!(o, "{:<16} {}", "FailedCacheHits", a.failed_cache_hits);
        let _ = writeln!(o, "{:<16} {}", "Unavailable", a.unavailable);
        let _ = writeln!(o, "{:<16} {}", "Reloads", a.reloads);
        let _ = writeln!(o, "{:<16} {}", "BackendFailing", if a.failing { "yes" } else { "no" });
        let _ = writeln!(
            o,
            "{:<16} {} (p99 {})",
            "VerifyTime",
            ms(a.verify_time.mean_us()),
            ms(a.verify_time.quantile_us(0.99) as f64)
        );
        o.push('\n');
    }

    // Once a tunnel was established.
    let t = &s.tunnels;
    if t.established > 0 {
        let _ = writeln!(o, "TunnelInfo:\n{RULE}");
        let _ = writeln!(o, "{:<16} {}", "Established", t.established);
        let _ = writeln!(o, "{:<16} {}", "Open", t.open);
        let _ = writeln!(o, "{:<16} {}/{}", "Bytes up/down", t.bytes_up, t.bytes_down);
        o.push('\n');
    }

    if let Some(x) = &s.socks {
        // Not in the Sun proxy's perfdump: its SOCKS server reported nothing here.
        let _ = writeln!(o, "SocksInfo:\n{RULE}");
        let _ = writeln!(o, "{:<16} {}", "Sessions", x.sessions);
        let _ = writeln!(o, "{:<16} {}", "Established", x.established);
        let _ = writeln!(o, "{:<16} {}", "AuthFailures", x.auth_failures);
        let _ = writeln!(o, "{:<16} {}", "Denied", x.denied);
        let _ = writeln!(o, "{:<16} {}", "ConnectFailures", x.connect_failures);
        let _ = writeln!(o, "{:<16} {}", "Unsupported", x.unsupported);
        let _ = writeln!(o, "{:<16} {}", "Malformed", x.malformed);
        let _ = writeln!(o, "{:<16} {}/{}", "Bytes up/down", x.bytes_up, x.bytes_down);
    }
    if let Some(ar) = &s.array {
        // A proxy array's members, as the Sun proxy's perfdump lists its
        // array: state and the requests routed to each.
        let _ = writeln!(o, "ArrayInfo:\n{RULE}");
        let _ = writeln!(o, "{:<16} {}", "Received", ar.received);
        let _ = writeln!(o, "{:<16} {}", "Owned", ar.owned);
        let _ = writeln!(o, "{:<16} {}", "NotOwned", ar.not_owned);
        // The share of what this node served that another member owns:
        // with every member's figures summed, the array's duplicate rate.
        let served = ar.owned + ar.not_owned;
        let _ = writeln!(
            o,
            "{:<16} {:.4}",
            "DuplicateRate",
            if served == 0 {
                0.0
            } else {
                ar.not_owned as f64 / served as f64
            }
        );
        for m in &ar.members {
            let _ = writeln!(
                o,
                "{:<16} {} {} forwarded {}",
                m.name,
                m.address,
                if m.up { "up" } else { "down" },
                m.forwarded
            );
        }
        o.push('\n');
    }

    let al = &s.access_log;
    let _ = writeln!(o, "ClientDNSCacheInfo:\n{RULE}");
    let _ = writeln!(o, "{:<16} {}", "enabled", if al.resolve_clients { "yes" } else { "no" });
    if al.resolve_clients {
        let _ = writeln!(
            o,
            "{:<16} {}/{}",
            "CacheEntries", al.client_dns_entries, al.client_dns_max_entries
        );
        let _ = writeln!(
            o,
            "{:<16} {}",
            "HitRatio",
            ratio(al.client_dns_hits, al.client_dns_lookups)
        );
    }
    o.push('\n');

    let u = &s.upstream;
    let _ = writeln!(o, "UpstreamInfo:\n{RULE}");
    let _ = writeln!(o, "{:<28} {}", "Requests", u.requests);
    let _ = writeln!(o, "{:<28} {}", "Connections Opened", u.connects);
    let _ = writeln!(o, "{:<28} {}", "Interim Responses Relayed", u.interim_relayed);
    let _ = writeln!(o, "{:<28} {}", "Connections Upgraded", u.upgrades);
    let _ = writeln!(
        o,
        "{:<28} {} waiting now, {} waited, {} timed out (503), {} left by their client",
        "Queued For a Connection", u.waiting, u.queued, u.queue_timeouts, u.queue_abandoned
    );
    for s in &u.servers {
        let _ = writeln!(
            o,
            "  {:<26} {}/{} in use, {} waiting",
            s.server, s.in_use, s.limit, s.waiting
        );
    }
    let _ = writeln!(
        o,
        "{:<28} {} ({} DNS, {} refused, {} connect timeouts, {} TLS, {} response timeouts, {} other)",
        "Errors",
        u.errors(),
        u.dns_errors,
        u.connect_errors,
        u.connect_timeouts,
        u.tls_errors,
        u.response_timeouts,
        u.other_errors
    );
    let _ = writeln!(o, "{:<28} {}", "Destinations Denied", u.destinations_denied);
    let _ = writeln!(
        o,
        "{:<28} {} ms mean, {} ms p99",
        "Connect Time",
        ms(u.connect_time.mean_us()),
        ms(u.connect_time.quantile_us(0.99) as f64)
    );
    let _ = writeln!(
        o,
        "{:<28} {} ms mean, {} ms p99",
        "First Byte Time",
        ms(u.first_byte_time.mean_us()),
        ms(u.first_byte_time.quantile_us(0.99) as f64)
    );
    o.push('\n');

    let r = &s.requests;
    let _ = writeln!(o, "RequestInfo:\n{RULE}");
    let _ = writeln!(o, "{:<28} {}", "Requests", r.total);
    let list = |l: &[(String, u64)]| {
        l.iter()
            .filter(|(_, c)| *c > 0)
            .map(|(n, c)| format!("{n} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(o, "{:<28} {}", "By Method", list(&r.by_method));
    let _ = writeln!(o, "{:<28} {}", "By Status", list(&r.by_status));
    let _ = writeln!(o, "{:<28} {}", "By Cache Status", list(&r.by_cache));
    let _ = writeln!(o, "{:<28} {} in, {} out", "Body Bytes", r.bytes_in, r.bytes_out);
    let _ = writeln!(
        o,
        "{:<28} {} ms p50, {} ms p99",
        "Response Time",
        ms(r.response_time.quantile_us(0.5) as f64),
        ms(r.response_time.quantile_us(0.99) as f64)
    );
    let _ = writeln!(
        o,
        "{:<28} {} ({} lines, {} dropped)",
        "Access Log",
        if al.enabled { al.format.as_str() } else { "off" },
        al.lines,
        al.dropped
    );
    let _ = writeln!(o, "{:<28} {}", "ACL Denied", r.acl_denied);
    let _ = writeln!(o, "{:<28} {}", "ACL Cache", ACL_CACHE);
    o.push('\n');

    let _ = writeln!(o, "TuningAdvice:\n{RULE}");
    if advice.is_empty() {
        let _ = writeln!(o, "No advice: nothing in these statistics calls for a change.");
    }
    for a in advice {
        let _ = writeln!(o, "[{}] {}", a.rule, a.text);
    }
    o.push('\n');

    buckets(&mut o, s);
    o
}

/// One line per worker process: what was summed, and what was left out and why.
fn processes(o: &mut String, s: &Snapshot) {
    let _ = writeln!(o, "Processes:\n{RULE}");
    let _ = writeln!(
        o,
        "{:<8}{:>9}{:>12}{:>8}{:>14}{:>10}{:>10}{:>8}  status",
        "worker", "pid", "requests", "active", "rss bytes", "cpu s", "up s", "age s"
    );
    for p in &s.processes {
        if p.counted {
            let _ = writeln!(
                o,
                "{:<8}{:>9}{:>12}{:>8}{:>14}{:>10.2}{:>10.0}{:>8.1}  {}",
                p.index, p.pid, p.requests, p.active, p.rss_bytes, p.cpu_secs, p.uptime_secs, p.age_secs, p.status
            );
        } else {
            let _ = writeln!(
                o,
                "{:<8}{:>9}{:>12}{:>8}{:>14}{:>10}{:>10}{:>8}  not counted: {}",
                p.index, "-", "-", "-", "-", "-", "-", "-", p.status
            );
        }
    }
    let _ = writeln!(
        o,
        "(figures below are summed over the counted processes; ?worker=I shows one)"
    );
    o.push('\n');
}

fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

/// The performance buckets report, as the Sun proxy prints it.
fn buckets(o: &mut String, s: &Snapshot) {
    let b = &s.buckets;
    let _ = writeln!(
        o,
        "Performance Counters:\n------------------------------------------------"
    );
    if !s.stats_enabled {
        let _ = writeln!(o, "(disabled: monitor.enabled = false)");
        return;
    }
    let n = b.total_requests;
    let avg = |ns: u64| if n == 0 { 0.0 } else { ns as f64 / 1e9 / n as f64 };
    let total_secs = |ns: u64| ns as f64 / 1e9;
    let _ = writeln!(o, "{:<28}{:>12}{:>16}{:>12}\n", "", "Average", "Total", "Percent");
    let _ = writeln!(o, "{:<28}{:>28}", "Total number of requests:", n);
    let _ = writeln!(
        o,
        "{:<28}{:>12.4}{:>16.4}\n",
        "Request processing time:",
        avg(b.processing_ns),
        total_secs(b.processing_ns)
    );
    let all_invocations: u64 = b.buckets.iter().map(|x| x.invocations).sum();
    for k in &b.buckets {
        let _ = writeln!(o, "{} ({})", k.name, k.description);
        let _ = writeln!(
            o,
            "{:<28}{:>28}    ({:6.2}%)",
            "Number of Requests:",
            k.requests,
            percent(k.requests, n)
        );
        let _ = writeln!(
            o,
            "{:<28}{:>28}    ({:6.2}%)",
            "Number of Invocations:",
            k.invocations,
            percent(k.invocations, all_invocations)
        );
        let total = k.latency_ns + k.function_ns;
        for (label, ns) in [
            ("Latency:", k.latency_ns),
            ("Function Processing Time:", k.function_ns),
            ("Total Response Time:", total),
        ] {
            let _ = writeln!(
                o,
                "{:<28}{:>12.4}{:>16.4}    ({:6.2}%)",
                label,
                avg(ns),
                total_secs(ns),
                percent(ns, b.processing_ns)
            );
        }
        let _ = writeln!(
            o,
            "  {:<22}{:>14}{:>14}{:>14}",
            "stage", "invocations", "latency s", "function s"
        );
        for st in &k.stages {
            let _ = writeln!(
                o,
                "  {:<22}{:>14}{:>14}{:>14}",
                st.name,
                st.invocations,
                secs(st.latency_ns / 1000),
                secs(st.function_ns / 1000)
            );
        }
        o.push('\n');
    }
}

#[cfg(test)]
// Synthetic snapshots read best set field by field.
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::stats::snapshot::*;

    #[test]
    fn sections_in_the_sun_proxys_order_with_ratios() {
        let mut s = Snapshot {
            stats_enabled: true,
            ..Default::default()
        };
        s.cache = Some(CacheInfo {
            running: true,
            lookups: 15,
            hits: 10,
            misses: 5,
            ..Default::default()
        });
        s.listeners.push(ListenerInfo {
            name: "ls1".into(),
            address: "http://127.0.0.1:8080".into(),
            ..Default::default()
        });
        s.buckets = BucketReport {
            total_requests: 4,
            processing_ns: 4_000_000_000,
            buckets: vec![BucketInfo {
                name: "default-bucket".into(),
                description: "Default bucket".into(),
                requests: 4,
                invocations: 8,
                latency_ns: 1_000_000_000,
                function_ns: 3_000_000_000,
                stages: vec![],
            }],
        };
        let text = render(&s, &[]);
        let order = [
            "ConnectionQueue:",
            "ListenSocket ls1:",
            "KeepAliveInfo:",
            "SessionCreationInfo:",
            "CacheInfo:",
            "Native pools:",
            "DNSCacheInfo:",
            "Performance Counters:",
        ];
        let mut at = 0;
        for name in order {
            let found = text[at..]
                .find(name)
                .unwrap_or_else(|| panic!("{name} missing or out of order\n{text}"));
            at += found;
        }
        assert!(text.contains("Cache Hit Ratio              10/15 ( 66.67%)"), "{text}");
        assert!(text.contains("default-bucket (Default bucket)"));
        assert!(
            text.contains("Latency:                          0.2500          1.0000    ( 25.00%)"),
            "{text}"
        );
        assert!(text.contains("Number of Requests:                                    4    (100.00%)"));
        assert!(!text.contains("Processes:") && !text.contains("summed"));
    }

    #[test]
    fn a_summed_report_lists_every_process() {
        let mut s = Snapshot::default();
        s.server.pid = 11;
        s.server.process_index = Some(1);
        s.processes = vec![
            ProcessInfo {
                index: 0,
                pid: 10,
                counted: true,
                status: "live".into(),
                age_secs: 0.4,
                requests: 7,
                ..Default::default()
            },
            ProcessInfo {
                index: 1,
                pid: 11,
                counted: true,
                status: "this process".into(),
                requests: 5,
                ..Default::default()
            },
            ProcessInfo {
                index: 2,
                status: "figures 9 s old".into(),
                ..Default::default()
            },
        ];
        let text = render(&s, &[]);
        assert!(
            text.starts_with(&format!(
                "Portico {} perfdump, summed over 2 of 3 processes (answered by pid 11, worker 1)",
                s.server.version
            )),
            "{text}"
        );
        let at = text.find("Processes:").expect("section");
        assert!(text[at..].find("ConnectionQueue:").is_some(), "before the others");
        let line = |w: &str| text.lines().find(|l| l.starts_with(w)).unwrap_or_default().to_string();
        assert!(line("0 ").contains(" 10 ") && line("0 ").contains(" 7 ") && line("0 ").ends_with("live"));
        assert!(line("1 ").ends_with("this process"));
        assert!(line("2 ").ends_with("not counted: figures 9 s old"), "{text}");
    }
}
