//! The views over a [`Snapshot`](super::Snapshot): each a pure function
//! from the snapshot (and advice) to text.

pub mod nsc;
pub mod perfdump;
pub mod prom;
pub mod xml;

use super::advisor::Advice;
use super::snapshot::Snapshot;
use serde::Serialize;

/// The dashboard page (self-contained: inline CSS and JS, canvas plots).
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// Derived numbers the dashboard plots, computed once here so every client agrees.
#[derive(Serialize)]
struct Derived {
    requests: u64,
    hit_ratio: f64,
    byte_hit_ratio: f64,
    p50_ms: f64,
    p99_ms: f64,
    queue_length: Option<u64>,
    active: u64,
    idle_connections: Option<u64>,
    cache_memory_bytes: u64,
    cache_disk_bytes: u64,
    upstream_errors: u64,
}

#[derive(Serialize)]
struct Doc<'a> {
    derived: Derived,
    advice: &'a [Advice],
    snapshot: &'a Snapshot,
    processes: &'a [super::snapshot::ProcessInfo],
}

/// The JSON document the dashboard polls: derived figures, advice, the
/// whole snapshot (every declared figure once, under its field path), and
/// `processes`: with several worker processes, one entry per worker (the
/// snapshot being their sum), else empty.
pub fn json(s: &Snapshot, advice: &[Advice]) -> String {
    let c = s.cache.as_ref();
    let derived = Derived {
        requests: s.requests.total,
        hit_ratio: c.map_or(0.0, |c| c.hit_ratio()),
        byte_hit_ratio: c.map_or(0.0, |c| c.byte_hit_ratio()),
        p50_ms: s.requests.response_time.quantile_us(0.5) as f64 / 1000.0,
        p99_ms: s.requests.response_time.quantile_us(0.99) as f64 / 1000.0,
        queue_length: s.connection_queue.as_ref().map(|q| q.current),
        active: s.sessions.active,
        idle_connections: s.keepalive.count,
        cache_memory_bytes: c.map_or(0, |c| c.memory_bytes),
        cache_disk_bytes: c.and_then(|c| c.disk.as_ref()).map_or(0, |d| d.bytes),
        upstream_errors: s.upstream.errors(),
    };
    serde_json::to_string(&Doc {
        derived,
        advice,
        snapshot: s,
        processes: &s.processes,
    })
    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The dashboard with the JSON endpoint's path filled in.
pub fn dashboard(json_path: &str) -> String {
    DASHBOARD_HTML.replace("__JSON_PATH__", &crate::util::html_escape(json_path))
}
