//! The tuning advisor: the tuning rules of the Sun Java System Web Proxy Server 4
//! Performance Tuning, Sizing, and Scaling Guide (chapter 2) evaluated on a snapshot, as
//! plain advice with the
//! numbers behind it. Each rule needs enough traffic to say anything; below
//! that it stays silent rather than guess.

use super::snapshot::{Snapshot, percent};
use serde::Serialize;

/// One piece of advice.
#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    /// Stable rule id (`queue-near-limit`, `low-cache-hit-ratio`, ...).
    pub rule: &'static str,
    /// What was seen and what to change.
    pub text: String,
}

/// Lookups needed before hit ratios mean anything.
pub const MIN_LOOKUPS: u64 = 20;
/// Below this cache hit ratio (percent) the advisor speaks.
pub const LOW_HIT_RATIO: f64 = 40.0;
/// Below this DNS cache hit ratio (percent) the advisor speaks.
pub const LOW_DNS_RATIO: f64 = 50.0;

/// Every rule that applies to `s`.
pub fn advise(s: &Snapshot) -> Vec<Advice> {
    let mut out = Vec::new();
    let mut say = |rule: &'static str, text: String| out.push(Advice { rule, text });

    if let Some(q) = &s.connection_queue
        && q.limit > 0
        && q.peak * 10 >= q.limit * 9
    {
        say(
            "queue-near-limit",
            format!(
                "The connection queue peaked at {}/{} ({:.1}% of its limit){}. Raise server.queue_size so bursts are queued instead of refused with 503.",
                q.peak,
                q.limit,
                percent(q.peak, q.limit),
                if q.overflows > 0 {
                    format!(" and {} connections were refused", q.overflows)
                } else {
                    String::new()
                }
            ),
        );
    }
    let ka = &s.keepalive;
    if let Some(flushes) = ka.flushes
        && flushes > ka.hits
        && flushes > 0
    {
        say(
            "keepalive-flushes",
            format!(
                "Keep-alive flushes ({flushes}) exceed keep-alive hits ({}): idle connections are closed to make room faster than they are reused (the 1:1 rule). Raise keepalive.max_connections.",
                ka.hits
            ),
        );
    }
    // Refusals also count clients that asked to close; only when the idle
    // set is at its limit (or flushing) is the limit the cause.
    let set_full = matches!((ka.count, ka.max), (Some(c), Some(m)) if m > 0 && c >= m);
    if let Some(refusals) = ka.refusals
        && refusals > 0
        && (ka.flushes.unwrap_or(0) > 0 || set_full)
    {
        say(
            "keepalive-refusals",
            format!(
                "{refusals} connections were not kept alive while the keep-alive set was full ({}/{} idle, {} flushed). Raise keepalive.max_connections.",
                ka.count.unwrap_or(0),
                ka.max.unwrap_or(0),
                ka.flushes.unwrap_or(0)
            ),
        );
    }
    if let (Some(limit), Some(waited)) = (s.sessions.limit, s.sessions.waited)
        && waited > 0
    {
        say(
            "max-requests-reached",
            format!(
                "{waited} requests waited because {} were already in service (server.max_requests = {limit}, peak {}). If the server answered them promptly this is fine; otherwise raise server.max_requests.",
                limit, s.sessions.peak
            ),
        );
    }
    if let Some(p) = &s.native_pool
        && p.queue_peak > 0
    {
        say(
            "blocking-pool-queueing",
            format!(
                "Work waited for a {} thread (queue peak {}/{}, threads peak {}/{}). If the CPU is not saturated, raise the pool's thread limit.",
                p.name, p.queue_peak, p.queue_limit, p.peak, p.limit
            ),
        );
    }
    if let Some(c) = &s.cache
        && c.lookups >= MIN_LOOKUPS
        && c.hit_ratio() < LOW_HIT_RATIO
    {
        let memory_full = c.memory_limit > 0 && c.memory_bytes * 10 >= c.memory_limit * 9;
        say(
            "low-cache-hit-ratio",
            format!(
                "Cache hit ratio is {}/{} ({:.2}%). {}Check that origins send Cache-Control max-age or Expires (cache.refresh adds heuristic lifetimes), and consider cache.cache_query or per-route cache overrides for dynamic URLs.",
                c.hits,
                c.lookups,
                c.hit_ratio(),
                if memory_full {
                    format!(
                        "The memory tier is full ({} of {} bytes): raise cache.memory. ",
                        c.memory_bytes, c.memory_limit
                    )
                } else {
                    String::new()
                }
            ),
        );
    }
    // The Sun guide's ACL user cache tuning: a cache too small for the
    // users in play evicts users who come back at once, and each return
    // costs a password verification (milliseconds of CPU for bcrypt).
    if let Some(a) = &s.auth
        && a.misses >= MIN_LOOKUPS
        && a.evictions * 10 >= a.misses
    {
        say(
            "auth-user-cache-too-small",
            format!(
                "The user cache evicted {} users for {} verifications ({}/{} users cached, hit ratio {:.2}%): it is too small for the users of this proxy, and evicted users pay a password verification again. Raise auth.max_users to at least the number of users active within auth.max_age.",
                a.evictions,
                a.misses,
                a.users,
                a.max_users,
                a.hit_ratio()
            ),
        );
    }
    if s.dns.enabled && s.dns.lookups >= MIN_LOOKUPS && s.dns.hit_ratio() < LOW_DNS_RATIO {
        say(
            "low-dns-hit-ratio",
            format!(
                "DNS cache hit ratio is {}/{} ({:.2}%) with {}/{} entries. {}",
                s.dns.hits,
                s.dns.lookups,
                s.dns.hit_ratio(),
                s.dns.entries,
                s.dns.max_entries,
                if s.dns.entries >= s.dns.max_entries {
                    "The cache is full: raise origin.dns_cache_entries to about the number of origins in use."
                } else {
                    "Origins' DNS records have short lifetimes; a local caching resolver may help."
                }
            ),
        );
    }
    if let Some(d) = s.cache.as_ref().and_then(|c| c.disk.as_ref())
        && d.high_watermark > 0
        && (d.evictions > 0 || d.bytes * 100 >= d.high_watermark * 98)
    {
        // Evictions mean usage reached the high watermark (GC then brings
        // it down to the low one, so the current size alone can miss it).
        say(
            "disk-near-watermark",
            format!(
                "The disk cache reached its high watermark ({} of {} bytes): it holds {} bytes now, GC has run {} times and evicted {} objects. Raise cache.disk (or lower cache.max_object_size) if evicted objects are wanted again.",
                d.high_watermark, d.limit, d.bytes, d.gc_runs, d.evictions
            ),
        );
    }
    let log_stage: u64 = s
        .buckets
        .buckets
        .iter()
        .flat_map(|b| b.stages.iter().filter(|st| st.name == "log"))
        .map(|st| st.function_ns)
        .sum();
    let log_share = percent(log_stage, s.buckets.processing_ns);
    if s.access_log.dropped > 0 || (s.buckets.total_requests >= MIN_LOOKUPS && log_share > 10.0) {
        say(
            "access-log-slow",
            format!(
                "The access log {}: {} lines dropped, {:.1}% of request time spent logging. Put the log on a faster disk, use a shorter format, or set log.access = \"\" to disable it.",
                if s.access_log.dropped > 0 {
                    "cannot keep up"
                } else {
                    "is slowing requests"
                },
                s.access_log.dropped,
                log_share
            ),
        );
    }
    let up = &s.upstream;
    if up.requests >= MIN_LOOKUPS && up.errors() * 20 > up.requests {
        say(
            "upstream-errors",
            format!(
                "{} of {} requests to origins failed ({:.1}%: {} DNS, {} refused, {} connect timeouts, {} TLS, {} response timeouts, {} other). Check the origins and origin.connect_timeout / first_byte_timeout.",
                up.errors(),
                up.requests,
                percent(up.errors(), up.requests),
                up.dns_errors,
                up.connect_errors,
                up.connect_timeouts,
                up.tls_errors,
                up.response_timeouts,
                up.other_errors
            ),
        );
    }
    out
}

#[cfg(test)]
// Synthetic snapshots read best set field by field.
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::stats::snapshot::*;

    fn rules(s: &Snapshot) -> Vec<&'static str> {
        advise(s).into_iter().map(|a| a.rule).collect()
    }

    #[test]
    fn quiet_on_an_idle_server() {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo::default());
        s.dns.enabled = true;
        assert!(advise(&s).is_empty());
    }

    #[test]
    fn queue_near_limit() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            peak: 95,
            limit: 100,
            overflows: 3,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(a[0].rule, "queue-near-limit");
        assert!(
            a[0].text.contains("95/100") && a[0].text.contains("3 connections were refused"),
            "{}",
            a[0].text
        );
        s.connection_queue.as_mut().unwrap().peak = 50;
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn keepalive_flushes_above_hits() {
        let mut s = Snapshot::default();
        s.keepalive.hits = 10;
        s.keepalive.flushes = Some(11);
        assert_eq!(rules(&s), ["keepalive-flushes"]);
        s.keepalive.flushes = Some(10);
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn keepalive_refusals() {
        let mut s = Snapshot::default();
        s.keepalive.refusals = Some(4);
        s.keepalive.max = Some(200);
        s.keepalive.count = Some(12);
        // Clients that closed themselves are no reason to raise the limit.
        assert!(rules(&s).is_empty());
        s.keepalive.count = Some(200);
        let a = advise(&s);
        assert_eq!(a[0].rule, "keepalive-refusals");
        assert!(
            a[0].text.contains("4 connections") && a[0].text.contains("200/200"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn requests_waiting_for_max_requests() {
        let mut s = Snapshot::default();
        s.sessions = SessionInfo {
            active: 1,
            peak: 64,
            limit: Some(64),
            waited: Some(7),
        };
        assert_eq!(rules(&s), ["max-requests-reached"]);
        s.sessions.waited = Some(0);
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn blocking_pool_queueing() {
        let mut s = Snapshot::default();
        s.native_pool = Some(PoolInfo {
            name: "NativePool".into(),
            queue_peak: 5,
            queue_limit: 100,
            peak: 8,
            limit: 8,
            ..Default::default()
        });
        assert_eq!(rules(&s), ["blocking-pool-queueing"]);
    }

    #[test]
    fn low_cache_hit_ratio_needs_traffic() {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            lookups: 19,
            hits: 1,
            ..Default::default()
        });
        assert!(rules(&s).is_empty());
        s.cache = Some(CacheInfo {
            lookups: 30,
            hits: 6,
            memory_bytes: 95,
            memory_limit: 100,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(a[0].rule, "low-cache-hit-ratio");
        assert!(
            a[0].text.contains("6/30 (20.00%)") && a[0].text.contains("raise cache.memory"),
            "{}",
            a[0].text
        );
        s.cache.as_mut().unwrap().hits = 20;
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn auth_user_cache_too_small() {
        let mut s = Snapshot::default();
        s.auth = Some(AuthInfo {
            users: 100,
            max_users: 100,
            hits: 50,
            misses: 100,
            evictions: 5,
            ..Default::default()
        });
        // 5 evictions for 100 verifications: the cache copes.
        assert!(rules(&s).is_empty());
        s.auth.as_mut().unwrap().evictions = 40;
        let a = advise(&s);
        assert_eq!(a[0].rule, "auth-user-cache-too-small");
        assert!(
            a[0].text.contains("auth.max_users") && a[0].text.contains("100/100"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn low_dns_hit_ratio() {
        let mut s = Snapshot::default();
        s.dns = DnsInfo {
            enabled: true,
            entries: 64,
            max_entries: 64,
            lookups: 100,
            hits: 10,
            failures: 0,
        };
        let a = advise(&s);
        assert_eq!(a[0].rule, "low-dns-hit-ratio");
        assert!(a[0].text.contains("10/100") && a[0].text.contains("full"));
    }

    #[test]
    fn disk_near_watermark() {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            disk: Some(DiskInfo {
                bytes: 950,
                limit: 1000,
                high_watermark: 950,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(rules(&s), ["disk-near-watermark"]);
        s.cache.as_mut().unwrap().disk.as_mut().unwrap().bytes = 500;
        assert!(rules(&s).is_empty());
        s.cache.as_mut().unwrap().disk.as_mut().unwrap().evictions = 3;
        assert_eq!(rules(&s), ["disk-near-watermark"]);
    }

    #[test]
    fn access_log_slowing_requests() {
        let mut s = Snapshot::default();
        s.access_log.dropped = 12;
        assert_eq!(rules(&s), ["access-log-slow"]);
        s.access_log.dropped = 0;
        s.buckets = BucketReport {
            total_requests: 100,
            processing_ns: 1000,
            buckets: vec![BucketInfo {
                stages: vec![StageInfo {
                    name: "log".into(),
                    function_ns: 200,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let a = advise(&s);
        assert_eq!(a[0].rule, "access-log-slow");
        assert!(a[0].text.contains("20.0%"), "{}", a[0].text);
    }

    #[test]
    fn upstream_errors() {
        let mut s = Snapshot::default();
        s.upstream.requests = 100;
        s.upstream.connect_errors = 6;
        assert_eq!(rules(&s), ["upstream-errors"]);
        s.upstream.connect_errors = 5;
        assert!(rules(&s).is_empty());
    }
}
