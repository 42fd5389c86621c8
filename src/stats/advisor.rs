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
/// TLS handshakes needed before the resumed share means anything.
pub const MIN_HANDSHAKES: u64 = 20;
/// Below this share of resumed TLS handshakes (percent) the advisor looks for a cause.
pub const LOW_RESUMED_RATIO: f64 = 50.0;

/// Every rule that applies to `s`.
pub fn advise(s: &Snapshot) -> Vec<Advice> {
    let mut out = Vec::new();
    let mut say = |rule: &'static str, text: String| out.push(Advice { rule, text });

    // Every rule speaks only when the figures show its cause, and names
    // the figure (as the perfdump labels it) that shows it.
    if let Some(q) = &s.connection_queue
        && q.limit > 0
        && q.peak * 10 >= q.limit * 9
    {
        say(
            "queue-near-limit",
            format!(
                "The connection queue peaked at {}/{} ({:.1}% of its limit){}. Raise server.queue_size so bursts are queued instead of refused with 503 (ConnectionQueue: Current/Peak/Limit Queue Length{}).",
                q.peak,
                q.limit,
                percent(q.peak, q.limit),
                if q.overflows > 0 {
                    format!(" and {} connections were refused", q.overflows)
                } else {
                    String::new()
                },
                if q.overflows > 0 {
                    ", Connections Overflowed"
                } else {
                    ""
                }
            ),
        );
    }
    if let Some(q) = &s.connection_queue
        && q.client_limited > 0
    {
        say(
            "client-connection-cap",
            format!(
                "{} connections were closed at accept because their client already had limits.max_connections_per_client open (ConnectionQueue: Closed Over Client Limit); the error log names the clients. If they were legitimate (many users behind one NAT address, a load balancer in front of a reverse listener), raise the cap.",
                q.client_limited
            ),
        );
    }
    if let Some(q) = &s.connection_queue
        && (q.client_table_evictions > 0 || q.connections_counted_apart > 0)
    {
        say(
            "client-table",
            format!(
                "The per-client tables are too small for the clients using them at once (limits.client_table): {} buckets in use were given to new clients, whose earlier clients started afresh (ConnectionQueue: Client Table Evictions), and {} connections were counted by their worker process alone, so that their client may exceed limits.max_connections_per_client (Connections Counted Apart). Raise limits.client_table (a restart): 24 bytes a client, and 4 more for each worker process.",
                q.client_table_evictions, q.connections_counted_apart
            ),
        );
    }
    if let Some(q) = &s.connection_queue
        && q.client_rate_limited > 0
    {
        say(
            "client-request-rate",
            format!(
                "{} requests were answered 429 because their client was over limits.client_request_rate (ConnectionQueue: Refused Over Client Rate); the error log names the clients. If they were legitimate (a page that loads many resources at once, many users behind one address), raise limits.client_request_burst or the rate.",
                q.client_rate_limited
            ),
        );
    }
    if let Some(q) = &s.connection_queue
        && q.route_rate_limited > 0
    {
        say(
            "route-request-rate",
            format!(
                "{} requests were answered 429 because their client was over a route's request_rate ([[rule]] request_rate; ConnectionQueue: Refused Over Route Rate); the error log names the clients and the rule. If they were legitimate, raise the rule's request_burst or its rate.",
                q.route_rate_limited
            ),
        );
    }
    if let Some(q) = &s.connection_queue
        && q.route_total_rate_limited > 0
    {
        say(
            "route-total-request-rate",
            format!(
                "{} requests were answered 503 because their route's total_request_rate for all clients was spent ([[rule]] total_request_rate; ConnectionQueue: Refused Over Route Total Rate); the error log names the rule. If the servers behind the route can take more, raise its total_request_burst or its rate; if one client takes most of it, give the route a request_rate per client too.",
                q.route_total_rate_limited
            ),
        );
    }
    // Paced downloads hold their service places for as long as they last:
    // when requests queued for a place too, the limit is costing others.
    if let Some(q) = &s.connection_queue
        && q.client_bandwidth_waits > 0
        && q.total_queued > 0
    {
        say(
            "client-bandwidth",
            format!(
                "Writes to clients waited {:.0} s in all for limits.client_bandwidth (ConnectionQueue: Waits Over Client Bandwidth) while {} requests queued for a service place (Total Connections Queued): a paced download holds its place (server.max_requests) for as long as it lasts. Raise server.max_requests, set limits.max_connections_per_client so one client cannot hold many places, or raise the bandwidth.",
                q.client_bandwidth_wait_us as f64 / 1e6,
                q.total_queued
            ),
        );
    }
    // The same for the cap on all clients together.
    if let Some(q) = &s.connection_queue
        && q.total_bandwidth_waits > 0
        && q.total_queued > 0
    {
        say(
            "total-bandwidth",
            format!(
                "Writes to clients waited {:.0} s in all for limits.total_bandwidth (ConnectionQueue: Waits Over Total Bandwidth) while {} requests queued for a service place (Total Connections Queued): under the cap every download lasts longer and holds its place (server.max_requests) for as long. Raise server.max_requests, or the total bandwidth if the link allows it.",
                q.total_bandwidth_wait_us as f64 / 1e6,
                q.total_queued
            ),
        );
    }
    // And for the routes' own rates.
    if let Some(q) = &s.connection_queue
        && q.route_bandwidth_waits > 0
        && q.total_queued > 0
    {
        say(
            "route-bandwidth",
            format!(
                "Writes to clients waited {:.0} s in all for their routes' bandwidth ([[rule]] bandwidth; ConnectionQueue: Waits Over Route Bandwidth) while {} requests queued for a service place (Total Connections Queued): a paced download holds its place (server.max_requests) for as long as it lasts. Raise server.max_requests, set limits.max_connections_per_client so one client cannot hold many places, or raise the routes' bandwidth (bandwidth_after lets small responses through at full speed).",
                q.route_bandwidth_wait_us as f64 / 1e6,
                q.total_queued
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
                "Keep-alive flushes ({flushes}) exceed keep-alive hits ({}) (KeepAliveFlushes, KeepAliveHits): idle connections are closed to make room faster than they are reused (the 1:1 rule). Raise keepalive.max_connections.",
                ka.hits
            ),
        );
    }
    // No rule reads KeepAliveRefusals: a refusal is a response sent with
    // `Connection: close` (the client asked, keepalive.max_requests was
    // reached, an error closed it), never a full idle set, which flushes
    // the oldest connection instead (keepalive-flushes). No figure ties
    // refusals to a setting an admin could change.
    if let (Some(limit), Some(waited)) = (s.sessions.limit, s.sessions.waited)
        && waited > 0
    {
        // Past a derived limit, what made requests wait was the descriptors
        // left, so the open-files limit is the setting to raise.
        let beyond = s.connection_queue.as_ref().map_or(0, |q| q.admitted_beyond_limit);
        let advice = if beyond > 0 {
            format!(
                "; {beyond} were admitted beyond it while file descriptors were free (Admitted Beyond The Limit), so the open-files limit is what held the rest: if they were not answered promptly, raise it (LimitNOFILE in the service unit, or ulimit -n)"
            )
        } else {
            String::from(". If the server answered them promptly this is fine; otherwise raise server.max_requests")
        };
        say(
            "max-requests-reached",
            format!(
                "{waited} requests waited because {} were already in service (SessionCreationInfo Sessions Waited; server.max_requests = {limit}, Peak/Limit Sessions {}/{limit}){advice}.",
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
                "Work waited for a {} thread (queue peak {}/{}, threads peak {}/{}) (Native pools: Work Queue Length/Peak/Limit, Idle/Peak/Limit). If the CPU is not saturated, raise server.blocking_threads.",
                p.name, p.queue_peak, p.queue_limit, p.peak, p.limit
            ),
        );
    }
    // A low hit ratio alone is no fault: a cold cache, or URLs each asked
    // for once, miss whatever the settings. The rule speaks when a figure
    // shows a cause: a full memory tier, or misses that were not stored
    // (the origins' responses were not cacheable).
    if let Some(c) = &s.cache
        && c.lookups >= MIN_LOOKUPS
        && c.hit_ratio() < LOW_HIT_RATIO
    {
        let memory_full = c.memory_limit > 0 && c.memory_bytes * 10 >= c.memory_limit * 9;
        let unstored = c.misses > 0 && c.stored * 2 < c.misses;
        let mut causes = Vec::new();
        if memory_full {
            causes.push(format!(
                "The memory tier is full (Memory Tier {}/{} bytes): raise cache.memory.",
                c.memory_bytes, c.memory_limit
            ));
        }
        if unstored {
            causes.push(format!(
                "Only {} of {} misses were stored (Objects {} stored): the origins' responses were not cacheable. Check that they send Cache-Control max-age or Expires (cache.refresh adds heuristic lifetimes), and consider cache.cache_query or per-route cache overrides for dynamic URLs.",
                c.stored, c.misses, c.stored
            ));
        }
        if !causes.is_empty() {
            say(
                "low-cache-hit-ratio",
                format!(
                    "Cache hit ratio is {}/{} ({:.2}%) (CacheInfo Cache Hit Ratio). {}",
                    c.hits,
                    c.lookups,
                    c.hit_ratio(),
                    causes.join(" ")
                ),
            );
        }
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
                "The user cache evicted {} users for {} verifications (ACLUserCacheInfo Evictions; CacheEntries {}/{}, HitRatio {:.2}%): it is too small for the users of this proxy, and evicted users pay a password verification again. Raise auth.max_users to at least the number of users active within auth.max_age.",
                a.evictions,
                a.misses,
                a.users,
                a.max_users,
                a.hit_ratio()
            ),
        );
    }
    // Only a full DNS cache is a setting's fault: with room left, misses
    // are first lookups or records whose TTL ran out, which no setting
    // here changes.
    if s.dns.enabled
        && s.dns.lookups >= MIN_LOOKUPS
        && s.dns.hit_ratio() < LOW_DNS_RATIO
        && s.dns.max_entries > 0
        && s.dns.entries >= s.dns.max_entries
    {
        say(
            "low-dns-hit-ratio",
            format!(
                "DNS cache hit ratio is {}/{} ({:.2}%) with {}/{} entries. The cache is full (DNSCacheInfo HitRatio, CacheEntries): raise origin.dns_cache_entries to about the number of origins in use.",
                s.dns.hits,
                s.dns.lookups,
                s.dns.hit_ratio(),
                s.dns.entries,
                s.dns.max_entries,
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
                "The disk cache reached its high watermark ({} of {} bytes; Disk Tier {}/{} bytes now): GC has run {} times and evicted {} objects. Raise cache.disk (or lower cache.max_object_size) if evicted objects are wanted again.",
                d.high_watermark, d.limit, d.bytes, d.limit, d.gc_runs, d.evictions
            ),
        );
    }
    // Lines are formatted on the request's task and written by a thread of
    // their own: the request-side cost is formatting, never the disk. Only
    // dropped lines (the writer's queue was full) show that the writer,
    // hence the disk, could not keep up.
    if s.access_log.dropped > 0 {
        say(
            "access-log-slow",
            format!(
                "The access log cannot keep up: {} lines dropped out of {} (Access Log dropped) because the writer's queue of log.access_queue = {} lines was full. Put the log on a faster disk, raise log.access_queue for bursts, or use a shorter format.",
                s.access_log.dropped,
                s.access_log.lines + s.access_log.dropped,
                s.access_log.queue_limit
            ),
        );
    }
    // Origin failures, each kind with its own cause and remedy (a refused
    // connection is an origin that is down, not a timeout to raise).
    let up = &s.upstream;
    let mut upstream = |rule: &'static str, n: u64, figure: &str, what: &str, remedy: &str| {
        if up.requests >= MIN_LOOKUPS && n * 20 > up.requests {
            say(
                rule,
                format!(
                    "{n} of {} requests to origins ({:.1}%) failed: {what} (UpstreamInfo Errors: {n} {figure}). {remedy}",
                    up.requests,
                    percent(n, up.requests),
                ),
            );
        }
    };
    upstream(
        "upstream-refused",
        up.connect_errors,
        "refused",
        "the connection was refused or could not be made",
        "The origin is down or not listening on that address and port: check that it runs and that [[upstream]] servers (or the URLs) name the right port.",
    );
    upstream(
        "upstream-connect-timeouts",
        up.connect_timeouts,
        "connect timeouts",
        "no connection within origin.connect_timeout",
        "The origin is unreachable (a firewall dropping packets, a host that is down) or too loaded to accept: check the route to it; raise origin.connect_timeout only if its Connect Time p99 shows connects are slow but succeed.",
    );
    upstream(
        "upstream-dns-errors",
        up.dns_errors,
        "DNS",
        "the origin's name did not resolve",
        "Check the names and the resolvers (origin.nameservers, DNSCacheInfo Failures).",
    );
    upstream(
        "upstream-tls-errors",
        up.tls_errors,
        "TLS",
        "the TLS handshake failed",
        "Check the origins' certificates and origin.ca_file.",
    );
    upstream(
        "upstream-response-timeouts",
        up.response_timeouts,
        "response timeouts",
        "no response head within origin.first_byte_timeout",
        "The origins are slow to answer: raise origin.first_byte_timeout if their First Byte Time p99 shows they need longer, or look at the origins.",
    );
    upstream(
        "upstream-other-errors",
        up.other_errors,
        "other",
        "the connection was reset or closed mid-response",
        "Check the origins' error logs.",
    );
    // Refusals by the cap on connections per server: never sent, so not
    // among the requests above; whether to raise the cap depends on what
    // the origins can take, which only the operator knows.
    let asked = up.requests + up.queue_timeouts;
    if asked >= MIN_LOOKUPS && up.queue_timeouts * 20 > asked {
        say(
            "upstream-queue-timeouts",
            format!(
                "{} of {asked} requests for origins ({:.1}%) got 503 after waiting origin.queue_timeout for a connection (UpstreamInfo Queued For a Connection: {} timed out): their servers had all their places in use (origin.max_connections, or a group's own max_connections). If the origins can take more requests at once, raise the cap; if they cannot, these 503s are the cap protecting them (add servers, or let requests wait longer with origin.queue_timeout).",
                up.queue_timeouts,
                percent(up.queue_timeouts, asked),
                up.queue_timeouts,
            ),
        );
    }
    // The Sun Web Server 7 guide tunes its SSL session cache because a
    // full handshake costs several times a resumed one. A low resumed
    // share alone is no fault (each client's first handshake is full, and
    // some clients never offer a session): the rule speaks only when
    // clients offered sessions that were not resumed (cache misses,
    // refused tickets), and says which setting lost them.
    let tls = &s.tls;
    let lost = tls.session_cache_misses + tls.tickets_refused;
    if tls.full + tls.resumed >= MIN_HANDSHAKES
        && tls.resumed_ratio() < LOW_RESUMED_RATIO
        && lost * 10 >= tls.full + tls.resumed
    {
        let workers = s.processes.len().max(1);
        let cause = if !tls.tickets_enabled && workers > 1 {
            format!(
                "With {workers} worker processes each keeps its own session cache, and a client's next connection usually reaches another: turn on tls.session_tickets, which every worker opens."
            )
        } else if tls.session_cache_limit > 0 && tls.session_cache_entries >= tls.session_cache_limit {
            "The session cache is full: raise tls.session_cache_entries to about the number of clients seen within tls.session_timeout.".to_string()
        } else if tls.tickets_refused > tls.session_cache_misses {
            "Most lost sessions were refused tickets: older than tls.session_timeout (raise it), or sealed before a restart (ticket keys are not kept across restarts).".to_string()
        } else {
            "Sessions expired before their clients came back: raise tls.session_timeout.".to_string()
        };
        say(
            "low-tls-resumption",
            format!(
                "Only {} of {} TLS handshakes ({:.1}%) resumed a session, and {lost} sessions clients offered were not resumed (SSLInfo: Session Cache Lookups {} misses, Session Tickets {} refused; Session Cache Entries {}/{}). {cause}",
                tls.resumed,
                tls.full + tls.resumed,
                tls.resumed_ratio(),
                tls.session_cache_misses,
                tls.tickets_refused,
                tls.session_cache_entries,
                tls.session_cache_limit,
            ),
        );
    }
    for l in &s.listeners {
        if l.listen_queue_configured > l.listen_queue {
            say(
                "listen-queue-capped",
                format!(
                    "ListenSocket {} ({}): Listen Queue is {}, not listen_queue = {}: the kernel caps every backlog at net.core.somaxconn. Raise it (sysctl -w net.core.somaxconn={}) or lower listen_queue to match.",
                    l.name, l.address, l.listen_queue, l.listen_queue_configured, l.listen_queue_configured
                ),
            );
        }
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
    fn queue_near_limit_fires_at_90_percent_of_the_limit_and_names_the_figure() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            peak: 95,
            limit: 100,
            overflows: 3,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(rules(&s), ["queue-near-limit"]);
        assert!(
            a[0].text.contains("95/100")
                && a[0].text.contains("3 connections were refused")
                && a[0].text.contains("Connections Overflowed"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn queue_near_limit_is_silent_below_90_percent() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            peak: 89,
            limit: 100,
            ..Default::default()
        });
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn keepalive_flushes_fire_above_hits() {
        let mut s = Snapshot::default();
        s.keepalive.hits = 10;
        s.keepalive.flushes = Some(11);
        assert_eq!(rules(&s), ["keepalive-flushes"]);
        assert!(
            advise(&s)[0]
                .text
                .contains("Keep-alive flushes (11) exceed keep-alive hits (10) (KeepAliveFlushes")
        );
    }

    #[test]
    fn keepalive_flushes_are_silent_up_to_hits() {
        let mut s = Snapshot::default();
        s.keepalive.hits = 10;
        s.keepalive.flushes = Some(10);
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn keepalive_refusals_never_advise_raising_max_connections() {
        // Refusals are responses sent with `Connection: close`; a full idle
        // set flushes instead of refusing, so no count of them shows the
        // limit is too low.
        let mut s = Snapshot::default();
        s.keepalive.refusals = Some(4000);
        s.keepalive.max = Some(200);
        s.keepalive.count = Some(200);
        s.keepalive.flushes = Some(0);
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn max_requests_reached_fires_when_requests_waited() {
        let mut s = Snapshot::default();
        s.sessions = SessionInfo {
            active: 1,
            peak: 64,
            limit: Some(64),
            waited: Some(7),
        };
        assert_eq!(rules(&s), ["max-requests-reached"]);
        assert!(advise(&s)[0].text.contains("Sessions Waited"));
    }

    #[test]
    fn max_requests_reached_names_the_open_files_limit_past_a_derived_limit() {
        let mut s = Snapshot::default();
        s.sessions = SessionInfo {
            active: 1,
            peak: 90,
            limit: Some(64),
            waited: Some(7),
        };
        s.connection_queue = Some(ConnectionQueueInfo {
            admitted_beyond_limit: 26,
            ..ConnectionQueueInfo::default()
        });
        let text = &advise(&s)[0].text;
        assert!(text.contains("26 were admitted beyond it"), "{text}");
        assert!(text.contains("LimitNOFILE"), "{text}");
        assert!(!text.contains("raise server.max_requests"), "{text}");
    }

    #[test]
    fn max_requests_reached_is_silent_when_none_waited() {
        let mut s = Snapshot::default();
        s.sessions = SessionInfo {
            active: 1,
            peak: 64,
            limit: Some(64),
            waited: Some(0),
        };
        assert!(rules(&s).is_empty());
    }

    fn pool(queue_peak: u64) -> PoolInfo {
        PoolInfo {
            name: "NativePool".into(),
            queue_peak,
            queue_limit: 100,
            peak: 8,
            limit: 8,
            ..Default::default()
        }
    }

    #[test]
    fn blocking_pool_queueing_fires_when_work_waited() {
        let mut s = Snapshot::default();
        s.native_pool = Some(pool(5));
        assert_eq!(rules(&s), ["blocking-pool-queueing"]);
        assert!(advise(&s)[0].text.contains("server.blocking_threads"));
    }

    #[test]
    fn blocking_pool_queueing_is_silent_when_nothing_waited() {
        let mut s = Snapshot::default();
        s.native_pool = Some(pool(0));
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn low_cache_hit_ratio_needs_traffic() {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            lookups: 19,
            hits: 1,
            misses: 18,
            ..Default::default()
        });
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn low_cache_hit_ratio_with_a_full_memory_tier_advises_more_memory() {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            lookups: 30,
            hits: 6,
            misses: 24,
            stored: 24,
            memory_bytes: 95,
            memory_limit: 100,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(a[0].rule, "low-cache-hit-ratio");
        assert!(
            a[0].text.contains("Cache hit ratio is 6/30 (20.00%")
                && a[0].text.contains("raise cache.memory")
                && a[0].text.contains("Memory Tier 95/100"),
            "{}",
            a[0].text
        );
        assert!(!a[0].text.contains("Cache-Control"), "{}", a[0].text);
        s.cache.as_mut().unwrap().hits = 20;
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn low_cache_hit_ratio_with_unstored_misses_points_at_the_origins() {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            lookups: 30,
            hits: 2,
            misses: 28,
            stored: 3,
            memory_limit: 100,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(rules(&s), ["low-cache-hit-ratio"]);
        assert!(
            a[0].text.contains("Only 3 of 28 misses were stored") && a[0].text.contains("Cache-Control"),
            "{}",
            a[0].text
        );
        assert!(!a[0].text.contains("cache.memory"), "{}", a[0].text);
    }

    #[test]
    fn low_cache_hit_ratio_of_a_cold_cache_is_no_fault() {
        // Every miss stored, memory to spare: URLs asked for once so far.
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            lookups: 30,
            hits: 2,
            misses: 28,
            stored: 28,
            memory_bytes: 10,
            memory_limit: 100,
            ..Default::default()
        });
        assert!(rules(&s).is_empty());
    }

    fn auth(evictions: u64) -> AuthInfo {
        AuthInfo {
            users: 100,
            max_users: 100,
            hits: 50,
            misses: 100,
            evictions,
            ..Default::default()
        }
    }

    #[test]
    fn auth_user_cache_too_small_fires_when_evictions_are_a_tenth_of_verifications() {
        let mut s = Snapshot::default();
        s.auth = Some(auth(40));
        let a = advise(&s);
        assert_eq!(a[0].rule, "auth-user-cache-too-small");
        assert!(
            a[0].text.contains("auth.max_users") && a[0].text.contains("CacheEntries 100/100"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn auth_user_cache_is_silent_when_it_copes() {
        let mut s = Snapshot::default();
        // 5 evictions for 100 verifications: the cache copes.
        s.auth = Some(auth(5));
        assert!(rules(&s).is_empty());
    }

    fn dns(entries: u64) -> DnsInfo {
        DnsInfo {
            enabled: true,
            entries,
            max_entries: 64,
            lookups: 100,
            hits: 10,
            failures: 0,
        }
    }

    #[test]
    fn low_dns_hit_ratio_fires_when_the_cache_is_full() {
        let mut s = Snapshot::default();
        s.dns = dns(64);
        let a = advise(&s);
        assert_eq!(a[0].rule, "low-dns-hit-ratio");
        assert!(
            a[0].text
                .contains("10/100 (10.00%) with 64/64 entries. The cache is full"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn low_dns_hit_ratio_with_room_left_is_no_setting_s_fault() {
        let mut s = Snapshot::default();
        s.dns = dns(30);
        assert!(rules(&s).is_empty());
    }

    fn disk(bytes: u64, evictions: u64) -> Snapshot {
        let mut s = Snapshot::default();
        s.cache = Some(CacheInfo {
            disk: Some(DiskInfo {
                bytes,
                limit: 1000,
                high_watermark: 950,
                evictions,
                ..Default::default()
            }),
            ..Default::default()
        });
        s
    }

    #[test]
    fn disk_near_watermark_fires_at_the_watermark_or_after_evictions() {
        assert_eq!(rules(&disk(950, 0)), ["disk-near-watermark"]);
        assert_eq!(rules(&disk(500, 3)), ["disk-near-watermark"]);
    }

    #[test]
    fn disk_near_watermark_is_silent_below_it_without_evictions() {
        assert!(rules(&disk(500, 0)).is_empty());
    }

    #[test]
    fn access_log_slow_fires_on_dropped_lines_and_names_them() {
        let mut s = Snapshot::default();
        s.access_log.lines = 88;
        s.access_log.dropped = 12;
        s.access_log.queue_limit = 16;
        let a = advise(&s);
        assert_eq!(rules(&s), ["access-log-slow"]);
        assert!(
            a[0].text.contains("12 lines dropped out of 100") && a[0].text.contains("log.access_queue = 16"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn access_log_slow_is_silent_without_dropped_lines_whatever_the_log_stage_share() {
        // The case: a fast server where formatting the line is a
        // fifth of a 0.2 ms request, and no line was dropped.
        let mut s = Snapshot::default();
        s.access_log.lines = 100;
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
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn refused_origin_connections_say_the_origin_is_down_not_to_raise_a_timeout() {
        let mut s = Snapshot::default();
        s.upstream.requests = 100;
        s.upstream.connect_errors = 6;
        let a = advise(&s);
        assert_eq!(rules(&s), ["upstream-refused"]);
        assert!(
            a[0].text.contains("down") && a[0].text.contains("UpstreamInfo Errors: 6 refused"),
            "{}",
            a[0].text
        );
        assert!(!a[0].text.contains("timeout"), "{}", a[0].text);
        s.upstream.connect_errors = 5;
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn each_kind_of_origin_failure_has_its_own_rule() {
        // How to make a failure of one kind, its rule, and the setting or
        // cause its advice names.
        type Kind = (fn(&mut UpstreamInfo), &'static str, &'static str);
        let kinds: [Kind; 5] = [
            (
                |u| u.connect_timeouts = 6,
                "upstream-connect-timeouts",
                "origin.connect_timeout",
            ),
            (|u| u.dns_errors = 6, "upstream-dns-errors", "origin.nameservers"),
            (|u| u.tls_errors = 6, "upstream-tls-errors", "origin.ca_file"),
            (
                |u| u.response_timeouts = 6,
                "upstream-response-timeouts",
                "origin.first_byte_timeout",
            ),
            (|u| u.other_errors = 6, "upstream-other-errors", "reset"),
        ];
        for (set, rule, names) in kinds {
            let mut s = Snapshot::default();
            s.upstream.requests = 100;
            set(&mut s.upstream);
            let a = advise(&s);
            assert_eq!(rules(&s), [rule]);
            assert!(a[0].text.contains(names), "{}", a[0].text);
        }
    }

    #[test]
    fn requests_refused_by_the_connection_cap_name_both_settings() {
        let mut s = Snapshot::default();
        s.upstream.requests = 90;
        s.upstream.queue_timeouts = 10;
        let a = advise(&s);
        assert_eq!(rules(&s), ["upstream-queue-timeouts"]);
        assert!(a[0].text.contains("10 of 100"), "{}", a[0].text);
        assert!(a[0].text.contains("origin.max_connections") && a[0].text.contains("origin.queue_timeout"));
        // At 5% or less, or with little traffic: silent.
        s.upstream.queue_timeouts = 5;
        s.upstream.requests = 95;
        assert!(rules(&s).is_empty());
        s.upstream.requests = 2;
        s.upstream.queue_timeouts = 8;
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn origin_failures_are_silent_at_5_percent_or_without_traffic() {
        let mut s = Snapshot::default();
        s.upstream.requests = 100;
        s.upstream.connect_timeouts = 5;
        s.upstream.dns_errors = 5;
        s.upstream.response_timeouts = 5;
        assert!(rules(&s).is_empty());
        s.upstream.requests = 10;
        s.upstream.connect_errors = 10;
        assert!(rules(&s).is_empty());
    }

    fn tls(full: u64, resumed: u64, misses: u64, refused: u64) -> TlsInfo {
        TlsInfo {
            handshakes: full + resumed,
            full,
            resumed,
            session_cache_misses: misses,
            session_cache_entries: 50,
            session_cache_limit: 10_000,
            tickets_refused: refused,
            tickets_enabled: true,
            ..Default::default()
        }
    }

    #[test]
    fn low_tls_resumption_fires_when_offered_sessions_were_lost() {
        let mut s = Snapshot::default();
        // 30 full, 10 resumed (25%), 20 tickets refused.
        s.tls = tls(30, 10, 0, 20);
        let a = advise(&s);
        assert_eq!(rules(&s), ["low-tls-resumption"]);
        assert!(
            a[0].text.contains("Only 10 of 40 TLS handshakes (25.0%)") && a[0].text.contains("tls.session_timeout"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn low_tls_resumption_names_the_full_cache_or_the_missing_tickets() {
        let mut s = Snapshot::default();
        s.tls = tls(30, 10, 20, 0);
        s.tls.session_cache_entries = 10_000;
        assert!(advise(&s)[0].text.contains("raise tls.session_cache_entries"));
        let mut s = Snapshot::default();
        s.tls = tls(30, 10, 20, 0);
        s.tls.tickets_enabled = false;
        s.processes = vec![ProcessInfo::default(), ProcessInfo::default()];
        let text = &advise(&s)[0].text;
        assert!(
            text.contains("2 worker processes") && text.contains("turn on tls.session_tickets"),
            "{text}"
        );
    }

    #[test]
    fn low_tls_resumption_is_silent_when_clients_offered_no_session_or_traffic_is_light() {
        let mut s = Snapshot::default();
        // Every client new: all full, none offered a session.
        s.tls = tls(100, 0, 0, 0);
        assert!(rules(&s).is_empty());
        // Half resumed: fine.
        s.tls = tls(20, 20, 5, 5);
        assert!(rules(&s).is_empty());
        // Too few handshakes to say anything.
        s.tls = tls(15, 0, 15, 0);
        assert!(rules(&s).is_empty());
    }

    fn listener(configured: u64, effective: u64) -> ListenerInfo {
        ListenerInfo {
            name: "ls1".into(),
            address: "http://127.0.0.1:8080".into(),
            listen_queue: effective,
            listen_queue_configured: configured,
            ..Default::default()
        }
    }

    #[test]
    fn client_connection_cap_speaks_once_a_connection_was_closed_for_it() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo::default());
        assert!(rules(&s).is_empty());
        s.connection_queue = Some(ConnectionQueueInfo {
            client_limited: 7,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(rules(&s), ["client-connection-cap"]);
        assert!(
            a[0].text.starts_with("7 connections were closed") && a[0].text.contains("Closed Over Client Limit"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn client_table_speaks_once_the_table_was_too_small() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            connections_counted_apart: 3,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(rules(&s), ["client-table"]);
        assert!(a[0].text.contains("Raise limits.client_table"), "{}", a[0].text);
        s.connection_queue = Some(ConnectionQueueInfo::default());
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn client_request_rate_speaks_once_a_request_was_refused_for_it() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            client_rate_limited: 12,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(rules(&s), ["client-request-rate"]);
        assert!(a[0].text.contains("Refused Over Client Rate"), "{}", a[0].text);
    }

    #[test]
    fn route_request_rate_speaks_when_a_route_refused_requests() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            route_rate_limited: 7,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(rules(&s), ["route-request-rate"]);
        assert!(a[0].text.starts_with("7 requests") && a[0].text.contains("Refused Over Route Rate"));
        s.connection_queue = Some(ConnectionQueueInfo::default());
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn route_total_request_rate_speaks_when_a_routes_total_refused_requests() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            route_total_rate_limited: 4,
            ..Default::default()
        });
        let a = advise(&s);
        assert_eq!(rules(&s), ["route-total-request-rate"]);
        assert!(a[0].text.starts_with("4 requests") && a[0].text.contains("Refused Over Route Total Rate"));
        s.connection_queue = Some(ConnectionQueueInfo::default());
        assert!(rules(&s).is_empty());
    }

    #[test]
    fn route_bandwidth_speaks_only_when_paced_downloads_and_queued_requests_meet() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            route_bandwidth_waits: 9,
            route_bandwidth_wait_us: 2_400_000,
            ..Default::default()
        });
        assert!(!rules(&s).contains(&"route-bandwidth"), "the rate doing its job alone");
        s.connection_queue = Some(ConnectionQueueInfo {
            route_bandwidth_waits: 9,
            route_bandwidth_wait_us: 2_400_000,
            total_queued: 5,
            ..Default::default()
        });
        let a = advise(&s);
        let said = a.iter().find(|a| a.rule == "route-bandwidth").expect("route-bandwidth");
        assert!(
            said.text.starts_with("Writes to clients waited 2 s") && said.text.contains("while 5 requests queued"),
            "{}",
            said.text
        );
        assert!(!rules(&s).contains(&"client-bandwidth"));
        assert!(!rules(&s).contains(&"total-bandwidth"));
    }

    #[test]
    fn total_bandwidth_speaks_only_when_capped_downloads_and_queued_requests_meet() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            total_bandwidth_waits: 40,
            total_bandwidth_wait_us: 7_500_000,
            ..Default::default()
        });
        assert!(!rules(&s).contains(&"total-bandwidth"), "the cap doing its job alone");
        s.connection_queue = Some(ConnectionQueueInfo {
            total_bandwidth_waits: 40,
            total_bandwidth_wait_us: 7_500_000,
            total_queued: 3,
            ..Default::default()
        });
        let a = advise(&s);
        let said = a.iter().find(|a| a.rule == "total-bandwidth").expect("total-bandwidth");
        assert!(
            said.text.starts_with("Writes to clients waited 8 s") && said.text.contains("while 3 requests queued"),
            "{}",
            said.text
        );
        assert!(!rules(&s).contains(&"client-bandwidth"));
    }

    #[test]
    fn client_bandwidth_speaks_only_when_paced_downloads_and_queued_requests_meet() {
        let mut s = Snapshot::default();
        s.connection_queue = Some(ConnectionQueueInfo {
            client_bandwidth_waits: 40,
            client_bandwidth_wait_us: 12_500_000,
            ..Default::default()
        });
        assert!(
            !rules(&s).contains(&"client-bandwidth"),
            "the limit doing its job alone"
        );
        s.connection_queue = Some(ConnectionQueueInfo {
            client_bandwidth_waits: 40,
            client_bandwidth_wait_us: 12_500_000,
            total_queued: 9,
            ..Default::default()
        });
        let a = advise(&s);
        let said = a
            .iter()
            .find(|a| a.rule == "client-bandwidth")
            .expect("client-bandwidth");
        assert!(
            said.text.starts_with("Writes to clients waited 12 s") && said.text.contains("while 9 requests queued"),
            "{}",
            said.text
        );
    }

    #[test]
    fn listen_queue_capped_fires_when_the_kernel_truncated_the_backlog() {
        let mut s = Snapshot::default();
        s.listeners.push(listener(8192, 4096));
        let a = advise(&s);
        assert_eq!(rules(&s), ["listen-queue-capped"]);
        assert!(
            a[0].text.contains("Listen Queue is 4096, not listen_queue = 8192")
                && a[0].text.contains("net.core.somaxconn"),
            "{}",
            a[0].text
        );
    }

    #[test]
    fn listen_queue_capped_is_silent_when_the_backlog_is_as_configured() {
        let mut s = Snapshot::default();
        s.listeners.push(listener(1024, 1024));
        // A snapshot from before the configured value was reported.
        s.listeners.push(listener(0, 8192));
        assert!(rules(&s).is_empty());
    }
}
