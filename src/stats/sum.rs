//! Summing the snapshots of several worker processes (`server.processes > 1`)
//! into the one the statistics views show by default.
//!
//! Each worker counts only its own traffic and has its own queue, pools,
//! memory tier and limits; the disk tier's directory is shared. How each
//! figure combines is declared with it in `snapshot.rs` (its
//! [`Rule`](super::declare::Rule)); in short:
//!
//! - **Summed** (`Add`): every counter, every histogram (bucket by bucket,
//!   so percentiles are those of all requests), every "now" gauge, and
//!   every limit each process applies on its own (`max_requests`, queue
//!   size, keep-alive connections, blocking threads and queue, memory-tier
//!   budget, the disk budget, which `reload::per_process` splits among the
//!   workers, DNS cache sizes, the access-log queue). Queue-length averages
//!   are summed too (the average of a sum is the sum of the averages).
//!   Labelled counts, listeners, buckets and stages are summed entry by
//!   entry (by label or name). A section or figure only some processes
//!   have is taken from those that have it.
//! - **Peaks are summed**: a peak is compared with its limit, and the
//!   limits are summed; the sum of the per-process peaks is at least the
//!   server's true peak and never above the summed limit, where the largest
//!   one would hide a process that reached its own limit. Peak RSS likewise.
//! - **Largest** (`Max`): uptime (the oldest worker), CPUs, and the disk
//!   tier's objects and bytes (one shared directory: each worker's index is
//!   a view of it, not a share).
//! - **Kept from the first snapshot** (`First`: the answering process's):
//!   settings that are the same in every worker and per-worker facts:
//!   version, pid, worker index, time, listener names and addresses,
//!   timeouts, `max_requests` per connection, cache TTLs and largest memory
//!   object, bucket and stage names.
//! - **Flags**: the cache is `running` only if it runs in every worker
//!   (`All`: `/nsc?stop` reaches only the worker that answers it); the disk
//!   index is ready when every worker's is; a feature is enabled if it is
//!   in any worker (`Any`).
//!
//! Which processes were summed, and which were left out and why, is the
//! caller's `Snapshot::processes` list.

use super::declare::Section;
use super::snapshot::*;

impl Snapshot {
    /// The sum of several processes' snapshots (each figure by its declared
    /// rule: see the module doc); the first is the base, so pass the
    /// answering process's own first. An empty slice gives the default.
    pub fn sum(parts: &[Snapshot]) -> Snapshot {
        let Some((first, rest)) = parts.split_first() else {
            return Snapshot::default();
        };
        let mut s = first.clone();
        for o in rest {
            s.combine(o);
        }
        s
    }
}

#[cfg(test)]
// Synthetic snapshots read best set field by field.
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::stats::hist::HistSnapshot;

    fn worker(pid: u32, requests: u64, times: &[u64], peak: u64, disk_objects: u64) -> Snapshot {
        let mut s = Snapshot::default();
        s.server.pid = pid;
        s.server.uptime_secs = f64::from(pid);
        s.server.rss_bytes = 1000;
        s.requests.total = requests;
        s.requests.by_status = vec![("2xx".into(), requests), ("5xx".into(), 1)];
        s.requests.response_time = HistSnapshot::from_values(times);
        s.sessions = SessionInfo {
            active: 1,
            peak,
            limit: Some(100),
            waited: Some(2),
        };
        s.listeners = vec![ListenerInfo {
            name: "ls1".into(),
            requests,
            ..Default::default()
        }];
        s.keepalive.count = Some(3);
        s.keepalive.timeout_secs = 15.0;
        s.cache = Some(CacheInfo {
            running: true,
            lookups: requests,
            hits: requests / 2,
            memory_limit: 1 << 20,
            disk: Some(DiskInfo {
                objects: disk_objects,
                limit: 500,
                index_ready: true,
                ..Default::default()
            }),
            ..Default::default()
        });
        s.buckets.buckets = vec![BucketInfo {
            name: "default-bucket".into(),
            requests,
            stages: vec![StageInfo {
                name: "route".into(),
                invocations: requests,
                function_ns: 10 * requests,
                ..Default::default()
            }],
            ..Default::default()
        }];
        s
    }

    #[test]
    fn sums_counters_histograms_gauges_and_limits() {
        let a = worker(10, 30, &[100, 200, 300], 4, 7);
        let mut b = worker(20, 12, &[5_000], 6, 9);
        if let Some(c) = b.cache.as_mut() {
            c.running = false;
        }
        let s = Snapshot::sum(&[a.clone(), b.clone()]);
        assert_eq!(s.requests.total, 42);
        assert_eq!(RequestStats::count(&s.requests.by_status, "2xx"), 42);
        assert_eq!(RequestStats::count(&s.requests.by_status, "5xx"), 2);
        assert_eq!(s.requests.response_time.count, 4);
        assert_eq!(
            s.requests.response_time.quantile_us(1.0),
            b.requests.response_time.quantile_us(1.0)
        );
        assert_eq!(s.listeners[0].requests, 42);
        assert_eq!(s.listeners.len(), 1);
        assert_eq!(
            (s.sessions.active, s.sessions.peak, s.sessions.limit),
            (2, 10, Some(200))
        );
        assert_eq!(s.sessions.waited, Some(4));
        assert_eq!(s.keepalive.count, Some(6));
        assert_eq!(s.keepalive.timeout_secs, 15.0, "a setting is kept, not summed");
        assert_eq!(s.server.pid, 10, "the first snapshot's pid");
        assert_eq!(s.server.uptime_secs, 20.0, "the oldest worker's uptime");
        assert_eq!(s.server.rss_bytes, 2000);
        let c = s.cache.as_ref().unwrap();
        assert_eq!((c.lookups, c.hits, c.memory_limit), (42, 21, 2 << 20));
        assert!(!c.running, "stopped in one worker");
        let d = c.disk.as_ref().unwrap();
        assert_eq!(
            (d.objects, d.limit),
            (9, 1000),
            "one shared directory; budgets split per worker"
        );
        let bucket = &s.buckets.buckets[0];
        assert_eq!((bucket.requests, bucket.stages[0].function_ns), (42, 420));
        // One process: its own figures.
        assert_eq!(Snapshot::sum(std::slice::from_ref(&a)).requests.total, 30);
        assert_eq!(Snapshot::sum(&[]).requests.total, 0);
    }

    #[test]
    fn a_snapshot_survives_json_with_its_histograms() {
        let a = worker(10, 30, &[100, 200, 300], 4, 7);
        let text = serde_json::to_string(&a).unwrap();
        let back: Snapshot = serde_json::from_str(&text).unwrap();
        let s = Snapshot::sum(&[back, a]);
        assert_eq!(s.requests.response_time.count, 6);
        assert_eq!(s.requests.response_time.quantile_us(0.5), 207);
    }
}
