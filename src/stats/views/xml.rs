//! `/stats-xml`: the snapshot as XML with the Sun Java System Web Proxy Server 4's element names
//! (connection-queue, thread-pool, profile, process, connection-queue-bucket,
//! thread-pool-bucket, host-dns-bucket, client-dns-bucket, keepalive-bucket,
//! cache-bucket, cpu-info, thread, request-bucket, profile-bucket).
//! `?name=0` leaves element `name` (and what it holds) out. With several
//! worker processes there is one `<process>` per worker (as the Sun proxy's
//! multi-process server writes it), each with that worker's own figures,
//! and the server-level figures (listen sockets) are their sum.
//!
//! Each declared figure with an stats-xml name (`stats::declare`) is an
//! attribute of the element its declaration names; this file lays out the
//! elements and adds the attributes derived from several figures.

use crate::stats::declare::{Section, Unit, Value};
use crate::stats::snapshot::{DiskInfo, RequestStats, Snapshot};
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

/// The attributes of `element` declared by the figures of `section` and of
/// the sections it holds (not of its list entries: each is an element of
/// its own). Ticks are microseconds, like the counters kept in them; a
/// figure the process cannot count is left out.
fn declared(section: &dyn Section, element: &str) -> Vec<(&'static str, String)> {
    let mut attrs = Vec::new();
    collect(section, element, &mut attrs);
    attrs
}

fn collect(section: &dyn Section, element: &str, attrs: &mut Vec<(&'static str, String)>) {
    section.visit(&mut |f, v| {
        if let Value::Nested(Some(inner)) = v {
            return collect(inner, element, attrs);
        }
        let Some((el, name)) = f.xml else { return };
        if el != element {
            return;
        }
        let text = match v {
            Value::Int(n) if f.unit == Unit::Nanos => (n / 1000).to_string(),
            Value::Int(n) => n.to_string(),
            Value::Real(x) => format!("{x:.2}"),
            Value::Flag(b) => u8::from(b).to_string(),
            Value::Text(t) => t.to_string(),
            Value::Hist(h) => format!("{:.0}", h.mean_us()),
            Value::Absent | Value::Labelled(_) | Value::Nested(_) | Value::List(_) => return,
        };
        attrs.push((name, text));
    });
}

/// `extra` (an id, say) followed by the declared attributes of `element` in `section`.
fn with(mut extra: Vec<(&'static str, String)>, section: &dyn Section, element: &str) -> Vec<(&'static str, String)> {
    extra.extend(declared(section, element));
    extra
}

/// The declared attributes of `element` in `section` with `extra` (a
/// figure derived from them) right after the attribute named `after`.
fn after(
    section: &dyn Section,
    element: &str,
    after: &str,
    extra: Vec<(&'static str, String)>,
) -> Vec<(&'static str, String)> {
    let mut attrs = declared(section, element);
    let at = attrs
        .iter()
        .position(|(k, _)| *k == after)
        .map_or(attrs.len(), |i| i + 1);
    attrs.splice(at..at, extra);
    attrs
}

/// The declared attributes of `element` in `section` followed by `extra`
/// (figures derived from them).
fn then(section: &dyn Section, element: &str, extra: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    let mut attrs = declared(section, element);
    attrs.extend(extra);
    attrs
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
        &with(vec![a("versionMajor", 1), a("versionMinor", 2)], s, "stats"),
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
        let attrs = then(
            p,
            "process",
            vec![
                a("mode", "active"),
                a("timeStarted", (srv.time_unix - srv.uptime_secs) as u64),
            ],
        );
        o.node("process", &attrs, |o| process_body(o, p));
    }
    for l in &s.listeners {
        o.leaf("listen-socket", &declared(l, "listen-socket"));
    }
}

fn process_body(o: &mut Out<'_>, s: &Snapshot) {
    if s.connection_queue.is_some() {
        o.leaf(
            "connection-queue-bucket",
            &with(vec![a("connectionQueueId", "cq1")], s, "connection-queue-bucket"),
        );
    }
    if s.native_pool.is_some() {
        o.leaf(
            "thread-pool-bucket",
            &with(vec![a("threadPoolId", "thread-pool-0")], s, "thread-pool-bucket"),
        );
    }
    let d = &s.dns;
    let mut dns = after(
        s,
        "host-dns-bucket",
        "countCacheHits",
        vec![a("countCacheMisses", d.lookups - d.hits.min(d.lookups))],
    );
    dns.push(a("flagAsyncEnabled", 1));
    o.leaf("host-dns-bucket", &dns);
    if s.auth.is_some() {
        o.leaf("acl-user-cache-bucket", &declared(s, "acl-user-cache-bucket"));
    }
    if s.http2.connections > 0 {
        o.leaf("http2-bucket", &declared(&s.http2, "http2-bucket"));
    }
    if s.tunnels.established > 0 {
        o.leaf("tunnel-bucket", &declared(&s.tunnels, "tunnel-bucket"));
    }
    if s.socks.is_some() {
        o.leaf("socks-bucket", &declared(s, "socks-bucket"));
    }
    if let Some(ar) = &s.array {
        o.leaf("array-bucket", &declared(s, "array-bucket"));
        for m in &ar.members {
            o.leaf("array-member", &declared(m, "array-member"));
        }
    }
    let al = &s.access_log;
    o.leaf(
        "client-dns-bucket",
        &after(
            s,
            "client-dns-bucket",
            "countCacheHits",
            vec![a(
                "countCacheMisses",
                al.client_dns_lookups - al.client_dns_hits.min(al.client_dns_lookups),
            )],
        ),
    );
    o.leaf("keepalive-bucket", &declared(s, "keepalive-bucket"));
    o.leaf("ssl-bucket", &declared(s, "ssl-bucket"));
    match &s.cache {
        None => o.leaf("cache-bucket", &[a("flagEnabled", 0)]),
        Some(c) => {
            let mut attrs = declared(s, "cache-bucket");
            if c.disk.is_none() {
                // The Sun proxy shows an empty disk cache rather than none.
                attrs.extend(declared(&DiskInfo::default(), "cache-bucket"));
            }
            attrs.push(a("percentHitRatio", format!("{:.2}", c.hit_ratio())));
            o.leaf("cache-bucket", &attrs);
        }
    }
    o.leaf("upstream-bucket", &declared(s, "upstream-bucket"));
    for server in &s.upstream.servers {
        o.leaf("upstream-server", &declared(server, "upstream-server"));
    }
    o.leaf("access-log-bucket", &declared(s, "access-log-bucket"));
    let r = &s.requests;
    o.node("thread", &with(vec![a("mode", "async")], s, "thread"), |o| {
        let count = |l: &[(String, u64)], n: &str| RequestStats::count(l, n);
        o.leaf(
            "request-bucket",
            &then(
                r,
                "request-bucket",
                vec![
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
                    a("microsResponseP50", r.response_time.quantile_us(0.5)),
                    a("microsResponseP99", r.response_time.quantile_us(0.99)),
                ],
            ),
        );
        for (i, b) in s.buckets.buckets.iter().enumerate() {
            let profile = format!("profile-{i}");
            o.leaf(
                "profile-bucket",
                &with(vec![a("profile", &profile)], b, "profile-bucket"),
            );
            for st in &b.stages {
                o.leaf(
                    "profile-stage-bucket",
                    &with(vec![a("profile", &profile)], st, "profile-stage-bucket"),
                );
            }
        }
    });
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
