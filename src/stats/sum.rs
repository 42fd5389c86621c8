//! Summing the snapshots of several worker processes (`server.processes > 1`)
//! into the one the statistics views show by default.
//!
//! Each worker counts only its own traffic and has its own queue, pools,
//! memory tier and limits; the disk tier's directory is shared. So:
//!
//! - **Summed**: every counter (requests, bytes, statuses, methods, cache
//!   outcomes, upstream and DNS counters, keep-alive and queue counters,
//!   bucket and stage times, access-log lines), every histogram (bucket by
//!   bucket, so percentiles are those of all requests), every "now" gauge
//!   (requests in service, queue length, idle connections, threads, RSS,
//!   CPU time, open files, memory-tier entries and bytes), and every limit
//!   each process applies on its own (`max_requests`, queue size, keep-alive
//!   connections, blocking threads and queue, memory-tier budget, the disk
//!   budget, which `reload::per_process` splits among the workers, DNS cache
//!   sizes, the access-log queue). Queue-length averages are summed too (the
//!   average of a sum is the sum of the averages).
//! - **Peaks are summed**: a peak is compared with its limit, and the
//!   limits are summed; the sum of the per-process peaks is at least the
//!   server's true peak and never above the summed limit, where the largest
//!   one would hide a process that reached its own limit. Peak RSS likewise.
//! - **Largest**: uptime (the oldest worker), CPUs, and the disk tier's
//!   objects and bytes (one shared directory: each worker's index is a view
//!   of it, not a share).
//! - **Kept from the first snapshot** (the answering process's: settings
//!   that are the same in every worker): version, pid, worker index, time,
//!   listener names and addresses, timeouts, `max_requests` per connection,
//!   cache TTLs and largest memory object, bucket and stage names.
//! - **Flags**: the cache is `running` only if it runs in every worker
//!   (`/nsc?stop` reaches only the worker that answers it); the disk index
//!   is ready when every worker's is.
//!
//! Which processes were summed, and which were left out and why, is the
//! caller's `Snapshot::processes` list.

use super::hist::HistSnapshot;
use super::snapshot::*;

fn add_labelled(a: &mut Vec<(String, u64)>, b: &[(String, u64)]) {
    for (name, v) in b {
        match a.iter_mut().find(|(n, _)| n == name) {
            Some((_, c)) => *c += v,
            None => a.push((name.clone(), *v)),
        }
    }
}

fn add_opt(a: &mut Option<u64>, b: Option<u64>) {
    *a = match (*a, b) {
        (Some(x), Some(y)) => Some(x + y),
        (x, y) => x.or(y),
    };
}

/// The first of `parts` with each of the others added to it by `add`; None
/// if there are none.
fn sum_with<T: Clone>(parts: &[T], add: impl Fn(&mut T, &T)) -> Option<T> {
    let (first, rest) = parts.split_first()?;
    let mut a = first.clone();
    for b in rest {
        add(&mut a, b);
    }
    Some(a)
}

fn add_hist(a: &mut HistSnapshot, b: &HistSnapshot) {
    a.merge(b);
}

impl Snapshot {
    /// The sum of several processes' snapshots (see the module doc for which
    /// fields are summed, maxed or kept); the first is the base, so pass the
    /// answering process's own first. An empty slice gives the default.
    pub fn sum(parts: &[Snapshot]) -> Snapshot {
        let Some((first, rest)) = parts.split_first() else {
            return Snapshot::default();
        };
        let mut s = first.clone();
        for o in rest {
            s.add(o);
        }
        s
    }

    /// Adds another process's figures to these.
    fn add(&mut self, o: &Snapshot) {
        self.stats_enabled |= o.stats_enabled;

        let (a, b) = (&mut self.server, &o.server);
        a.uptime_secs = a.uptime_secs.max(b.uptime_secs);
        a.workers += b.workers;
        a.threads += b.threads;
        a.rss_bytes += b.rss_bytes;
        a.peak_rss_bytes += b.peak_rss_bytes;
        a.cpu_user_secs += b.cpu_user_secs;
        a.cpu_system_secs += b.cpu_system_secs;
        a.open_fds += b.open_fds;
        a.cpus = a.cpus.max(b.cpus);

        let (a, b) = (&mut self.requests, &o.requests);
        a.total += b.total;
        add_labelled(&mut a.by_method, &b.by_method);
        add_labelled(&mut a.by_status, &b.by_status);
        add_labelled(&mut a.by_cache, &b.by_cache);
        a.bytes_in += b.bytes_in;
        a.bytes_out += b.bytes_out;
        a.admin_requests += b.admin_requests;
        a.acl_denied += b.acl_denied;
        add_hist(&mut a.response_time, &b.response_time);

        let (a, b) = (&mut self.sessions, &o.sessions);
        a.active += b.active;
        a.peak += b.peak;
        add_opt(&mut a.limit, b.limit);
        add_opt(&mut a.waited, b.waited);

        for (i, l) in o.listeners.iter().enumerate() {
            match self.listeners.get_mut(i) {
                Some(a) => a.requests += l.requests,
                None => self.listeners.push(l.clone()),
            }
        }

        self.connection_queue = match (self.connection_queue.take(), &o.connection_queue) {
            (Some(mut a), Some(b)) => {
                a.current += b.current;
                a.peak += b.peak;
                a.limit += b.limit;
                a.total_queued += b.total_queued;
                a.overflows += b.overflows;
                a.abandoned += b.abandoned;
                a.queue_time_us += b.queue_time_us;
                a.avg_1 += b.avg_1;
                a.avg_5 += b.avg_5;
                a.avg_15 += b.avg_15;
                Some(a)
            }
            (a, b) => a.or_else(|| b.clone()),
        };

        let (a, b) = (&mut self.keepalive, &o.keepalive);
        add_opt(&mut a.count, b.count);
        add_opt(&mut a.max, b.max);
        a.hits += b.hits;
        add_opt(&mut a.flushes, b.flushes);
        add_opt(&mut a.refusals, b.refusals);
        add_opt(&mut a.timeouts, b.timeouts);
        add_opt(&mut a.header_timeouts, b.header_timeouts);
        add_opt(&mut a.send_timeouts, b.send_timeouts);
        add_opt(&mut a.parked, b.parked);
        add_opt(&mut a.parked_new, b.parked_new);
        add_opt(&mut a.parks, b.parks);

        self.native_pool = match (self.native_pool.take(), &o.native_pool) {
            (Some(mut a), Some(b)) => {
                a.idle += b.idle;
                a.threads += b.threads;
                a.peak += b.peak;
                a.limit += b.limit;
                a.queue += b.queue;
                a.queue_peak += b.queue_peak;
                a.queue_limit += b.queue_limit;
                a.jobs += b.jobs;
                a.refused += b.refused;
                Some(a)
            }
            (a, b) => a.or_else(|| b.clone()),
        };

        self.cache = match (self.cache.take(), &o.cache) {
            (Some(mut a), Some(b)) => {
                a.running &= b.running;
                a.lookups += b.lookups;
                a.hits += b.hits;
                a.misses += b.misses;
                a.stale += b.stale;
                a.revalidations += b.revalidations;
                a.collapsed += b.collapsed;
                a.stored += b.stored;
                a.invalidated += b.invalidated;
                a.bytes_served += b.bytes_served;
                a.bytes_fetched += b.bytes_fetched;
                a.memory_entries += b.memory_entries;
                a.memory_bytes += b.memory_bytes;
                a.memory_limit += b.memory_limit;
                a.disk = match (a.disk.take(), &b.disk) {
                    (Some(mut d), Some(e)) => {
                        d.objects = d.objects.max(e.objects);
                        d.bytes = d.bytes.max(e.bytes);
                        d.limit += e.limit;
                        d.high_watermark += e.high_watermark;
                        d.low_watermark += e.low_watermark;
                        d.reads += e.reads;
                        d.misses += e.misses;
                        d.writes += e.writes;
                        d.write_aborts += e.write_aborts;
                        d.evictions += e.evictions;
                        d.gc_runs += e.gc_runs;
                        d.checksum_failures += e.checksum_failures;
                        d.corrupt_removed += e.corrupt_removed;
                        d.index_ready &= e.index_ready;
                        Some(d)
                    }
                    (d, e) => d.or_else(|| e.clone()),
                };
                Some(a)
            }
            (a, b) => a.or_else(|| b.clone()),
        };

        self.auth = match (self.auth.take(), &o.auth) {
            (Some(mut a), Some(b)) => {
                a.users += b.users;
                a.max_users += b.max_users;
                a.hits += b.hits;
                a.misses += b.misses;
                a.evictions += b.evictions;
                a.failures += b.failures;
                a.failed_cache_hits += b.failed_cache_hits;
                a.unavailable += b.unavailable;
                a.reloads += b.reloads;
                a.failing |= b.failing;
                a.verify_time.merge(&b.verify_time);
                Some(a)
            }
            (a, b) => a.or_else(|| b.clone()),
        };

        let (a, b) = (&mut self.dns, &o.dns);
        a.enabled |= b.enabled;
        a.entries += b.entries;
        a.max_entries += b.max_entries;
        a.lookups += b.lookups;
        a.hits += b.hits;
        a.failures += b.failures;

        let (a, b) = (&mut self.upstream, &o.upstream);
        a.requests += b.requests;
        a.responses += b.responses;
        a.connects += b.connects;
        a.dns_errors += b.dns_errors;
        a.connect_errors += b.connect_errors;
        a.connect_timeouts += b.connect_timeouts;
        a.tls_errors += b.tls_errors;
        a.response_timeouts += b.response_timeouts;
        a.other_errors += b.other_errors;
        add_hist(&mut a.connect_time, &b.connect_time);
        add_hist(&mut a.first_byte_time, &b.first_byte_time);

        let (a, b) = (&mut self.buckets, &o.buckets);
        a.total_requests += b.total_requests;
        a.processing_ns += b.processing_ns;
        for bucket in &b.buckets {
            match a.buckets.iter_mut().find(|x| x.name == bucket.name) {
                Some(x) => {
                    x.requests += bucket.requests;
                    x.invocations += bucket.invocations;
                    x.latency_ns += bucket.latency_ns;
                    x.function_ns += bucket.function_ns;
                    for st in &bucket.stages {
                        match x.stages.iter_mut().find(|y| y.name == st.name) {
                            Some(y) => {
                                y.invocations += st.invocations;
                                y.latency_ns += st.latency_ns;
                                y.function_ns += st.function_ns;
                            }
                            None => x.stages.push(st.clone()),
                        }
                    }
                }
                None => a.buckets.push(bucket.clone()),
            }
        }

        let (a, b) = (&mut self.access_log, &o.access_log);
        a.enabled |= b.enabled;
        a.lines += b.lines;
        a.dropped += b.dropped;
        a.queued += b.queued;
        a.queue_limit += b.queue_limit;
        a.client_dns_entries += b.client_dns_entries;
        a.client_dns_max_entries += b.client_dns_max_entries;
        a.client_dns_lookups += b.client_dns_lookups;
        a.client_dns_hits += b.client_dns_hits;
    }
}

/// The connection layer's own counters (the JSON document's `connection`)
/// summed over processes by the same rules as [`Snapshot::sum`]; the
/// average delay is recomputed from the summed totals.
pub fn sum_connection_queue(
    parts: &[crate::proxy::admission::ConnectionQueue],
) -> Option<crate::proxy::admission::ConnectionQueue> {
    let mut a = sum_with(parts, |a, b| {
        a.current += b.current;
        a.peak += b.peak;
        a.limit += b.limit;
        a.total_queued += b.total_queued;
        a.overflows += b.overflows;
        a.abandoned += b.abandoned;
        a.queue_time_us += b.queue_time_us;
        a.avg_1min += b.avg_1min;
        a.avg_5min += b.avg_5min;
        a.avg_15min += b.avg_15min;
        a.in_service += b.in_service;
        a.in_service_peak += b.in_service_peak;
        a.max_requests += b.max_requests;
        a.total_admitted += b.total_admitted;
    })?;
    a.avg_queueing_delay_ms = if a.total_queued == 0 {
        0.0
    } else {
        a.queue_time_us as f64 / a.total_queued as f64 / 1000.0
    };
    Some(a)
}

/// See [`sum_connection_queue`].
pub fn sum_keepalive(parts: &[crate::keepalive::KeepAliveInfo]) -> Option<crate::keepalive::KeepAliveInfo> {
    sum_with(parts, |a, b| {
        a.count += b.count;
        a.max += b.max;
        a.hits += b.hits;
        a.flushes += b.flushes;
        a.refusals += b.refusals;
        a.timeouts += b.timeouts;
        a.header_timeouts += b.header_timeouts;
        a.send_timeouts += b.send_timeouts;
        a.parked += b.parked;
        a.parked_new += b.parked_new;
        a.parks += b.parks;
    })
}

/// See [`sum_connection_queue`].
pub fn sum_native_pool(parts: &[crate::blocking::NativePool]) -> Option<crate::blocking::NativePool> {
    sum_with(parts, |a, b| {
        a.idle_threads += b.idle_threads;
        a.threads += b.threads;
        a.peak_threads += b.peak_threads;
        a.max_threads += b.max_threads;
        a.queue_length += b.queue_length;
        a.queue_peak += b.queue_peak;
        a.queue_limit += b.queue_limit;
        a.jobs += b.jobs;
        a.refused += b.refused;
    })
}

#[cfg(test)]
// Synthetic snapshots read best set field by field.
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;

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

    #[test]
    fn sums_the_connection_layer() {
        let q = crate::proxy::admission::ConnectionQueue {
            current: 1,
            peak: 2,
            limit: 10,
            total_queued: 4,
            overflows: 0,
            abandoned: 0,
            queue_time_us: 4000,
            avg_queueing_delay_ms: 1.0,
            avg_1min: 0.5,
            avg_5min: 0.0,
            avg_15min: 0.0,
            in_service: 1,
            in_service_peak: 3,
            max_requests: 50,
            total_admitted: 9,
        };
        let mut r = q.clone();
        r.total_queued = 0;
        r.queue_time_us = 0;
        let s = sum_connection_queue(&[q, r]).unwrap();
        assert_eq!((s.limit, s.total_admitted, s.max_requests), (20, 18, 100));
        assert_eq!(s.avg_queueing_delay_ms, 1.0);
        assert!(sum_keepalive(&[]).is_none());
    }
}
