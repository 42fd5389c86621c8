//! The monitoring endpoints Portico answers itself (`[monitor]` paths):
//! perfdump, stats-xml, Prometheus, /nsc, the dashboard and its JSON. On any
//! listener, for origin-form targets (or absolute-form ones naming the
//! listener's own address), GET or HEAD, and only for `access.admin_allow`
//! clients. Each is a view over one [`Snapshot`] built here.

use super::Shared;
use crate::config::{Mode, MonitorConfig};
use crate::http1::{Exchange, LocalAddr, Outcome, RequestHead};
use crate::stats::{self, Snapshot, advisor, views, workers};
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;

/// Which view a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// perfdump text.
    Perf,
    /// XML.
    StatsXml,
    /// Prometheus.
    Metrics,
    /// Cache status and control.
    Nsc,
    /// HTML dashboard.
    Dashboard,
    /// JSON.
    Json,
}

/// Whether a browser says the request was made by another site's page:
/// Fetch Metadata's `Sec-Fetch-Site` other than `same-origin` or `none`
/// (typed, bookmarked), or, from a browser without it, an `Origin` whose
/// host is not the request's. `/nsc?stop` is a GET, as the Sun proxy's
/// was, and admin addresses are loopback by default: without this, an
/// `<img src="http://127.0.0.1:8080/nsc?stop">` on any page an
/// administrator opened stopped the cache (cross-site request forgery).
/// Tools (curl, scripts, cron) send neither field.
fn from_another_site(head: &RequestHead) -> bool {
    if let Some(site) = head.headers.get("sec-fetch-site") {
        return !matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = head.headers.get(http::header::ORIGIN) else {
        return false;
    };
    let host = head.headers.get(http::header::HOST).map(HeaderValue::as_bytes);
    let origin = origin.to_str().ok().and_then(|o| o.parse::<http::Uri>().ok());
    match (origin.as_ref().and_then(http::Uri::authority), host) {
        (Some(o), Some(h)) => !o.as_str().as_bytes().eq_ignore_ascii_case(h),
        _ => true,
    }
}

/// Whether the request's `Host` may name this server's pages. A page on a
/// name its owner points at 127.0.0.1 after loading it (DNS rebinding)
/// reads whatever that address answers as its own origin, with its own
/// name in `Host`. So a browser's request (it sends Fetch Metadata,
/// `Sec-Fetch-Site`; every current browser does) must name an IP address,
/// `localhost`, the machine's host name, or one of `monitor.hosts`. Tools
/// (curl, scripts, monitoring agents) send no such field and may use any
/// name, as before.
fn host_may_name_us(head: &RequestHead, allowed: &[String]) -> bool {
    // An absolute target's authority replaced `Host` and `endpoint` found
    // it names the listener (an address or localhost).
    if !head.target.starts_with('/') || !head.headers.contains_key("sec-fetch-site") {
        return true;
    }
    let Some(host) = head.headers.get(http::header::HOST) else {
        return true;
    };
    let Some(authority) = host.to_str().ok().and_then(|h| h.parse::<http::uri::Authority>().ok()) else {
        return false;
    };
    let name = authority.host().trim_start_matches('[').trim_end_matches(']');
    let name = name.strip_suffix('.').unwrap_or(name);
    name.parse::<IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed
            .iter()
            .any(|a| a.trim_end_matches('.').eq_ignore_ascii_case(name))
        || machine_name().is_some_and(|m| m.eq_ignore_ascii_case(name))
}

/// This machine's host name (gethostname), read once.
fn machine_name() -> Option<&'static str> {
    static NAME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` is valid for `buf.len()` bytes; gethostname writes
        // at most that many.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        (rc == 0 && end > 0).then(|| String::from_utf8_lossy(&buf[..end]).into_owned())
    })
    .as_deref()
}

/// The port a URL that names none is for: 443 for `https` (and an
/// origin-form request on a TLS transparent listener, which `classify`
/// makes `https`), else 80.
pub(super) fn default_port(https: bool) -> u16 {
    if https { 443 } else { 80 }
}

/// True if `authority` (`host[:port]`, default port `default_port`) names
/// the listener at `local`.
pub(super) fn names_us(authority: &http::uri::Authority, default_port: u16, local: SocketAddr) -> bool {
    let port = authority.port_u16().unwrap_or(default_port);
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let ours = match host.parse::<IpAddr>() {
        Ok(ip) => ip == local.ip(),
        Err(_) => host.eq_ignore_ascii_case("localhost") && local.ip().is_loopback(),
    };
    ours && port == local.port()
}

/// The endpoint and query string a request names, if it names one. On a
/// transparent listener (over TLS when `tls`) an origin-form request
/// belongs to the site in its `Host`, so it is ours only when that `Host`
/// names the listener itself (port 443 when it names none over TLS, as
/// the request's URL would be `https`).
pub fn endpoint(
    cfg: &MonitorConfig,
    head: &RequestHead,
    local: &LocalAddr<'_>,
    mode: Mode,
    tls: bool,
) -> Option<(Endpoint, String)> {
    if head.method != Method::GET && head.method != Method::HEAD {
        return None;
    }
    let target = head.target.as_str();
    let path_and_query = if target.starts_with('/') {
        if mode == Mode::Transparent {
            let host = head.headers.get(http::header::HOST)?.to_str().ok()?;
            if !names_us(&host.parse().ok()?, default_port(tls), local.get()) {
                return None;
            }
        }
        target
    } else {
        let uri: http::Uri = target.parse().ok()?;
        let default_port = default_port(uri.scheme() == Some(&http::uri::Scheme::HTTPS));
        if !names_us(uri.authority()?, default_port, local.get()) {
            return None;
        }
        let start = target.find("://").map(|i| i + 3)?;
        target[start..].find('/').map_or("/", |i| &target[start + i..])
    };
    let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
    let which = [
        (&cfg.perf, Endpoint::Perf),
        (&cfg.stats_xml, Endpoint::StatsXml),
        (&cfg.metrics, Endpoint::Metrics),
        (&cfg.nsc, Endpoint::Nsc),
        (&cfg.dashboard, Endpoint::Dashboard),
        (&cfg.json, Endpoint::Json),
    ]
    .into_iter()
    .find(|(p, _)| !p.is_empty() && p.as_str() == path)?
    .1;
    Some((which, query.to_string()))
}

fn param<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|kv| match kv.split_once('=') {
        Some((k, v)) if k == name => Some(v),
        None if kv == name => Some(""),
        _ => None,
    })
}

/// A monitoring request refused: 403 with `why`, counted as denied.
async fn forbidden(ex: &mut Exchange<'_>, sh: &Shared, why: &str) -> Outcome {
    ex.cache_result = Some(super::ACCESS_DENIED);
    match super::reply::error_page(&mut ex.out, &sh.error_pages, StatusCode::FORBIDDEN, why).await {
        Ok(()) | Err(_) => Outcome::Close,
    }
}

/// Answers a monitoring request.
pub async fn serve(ep: Endpoint, query: &str, ex: &mut Exchange<'_>, sh: &Shared) -> Outcome {
    // Closed after the answer: a monitoring request never holds a
    // keep-alive slot, and is left out of the keep-alive counters.
    ex.out.close_after();
    if !sh.admin.allows(ex.peer.ip()) {
        tracing::warn!(client = %ex.peer.ip(), "monitoring request refused: {}", ex.head.target);
        return forbidden(ex, sh, "monitoring is allowed only from access.admin_allow addresses").await;
    }
    if !host_may_name_us(&ex.head, &sh.config.monitor.hosts) {
        tracing::warn!(client = %ex.peer.ip(), "monitoring request for another host name refused: {:?}", ex.head.headers.get(http::header::HOST));
        return forbidden(
            ex,
            sh,
            "the monitoring pages answer to an address, localhost, this machine's name or monitor.hosts",
        )
        .await;
    }
    let mut message = None;
    if ep == Endpoint::Nsc
        && let Some(cache) = &sh.cache
    {
        let action = if param(query, "stop").is_some() {
            Some(workers::NscAction::Stop)
        } else if param(query, "start").is_some() {
            Some(workers::NscAction::Start)
        } else if param(query, "restart").is_some() {
            Some(workers::NscAction::Restart)
        } else {
            None
        };
        if action.is_some() && from_another_site(&ex.head) {
            tracing::warn!(client = %ex.peer.ip(), "/nsc: an action asked by another site's page refused");
            return forbidden(
                ex,
                sh,
                "the cache is not stopped, started or restarted from another site's page",
            )
            .await;
        }
        if let Some(action) = action {
            let mut m = apply_nsc(cache, action);
            if publish_nsc(action).await {
                m.push_str(" The other workers follow within a second.");
            }
            tracing::info!(client = %ex.peer.ip(), "/nsc: {m}");
            message = Some(m);
        }
    }
    let figures = match figures(sh, query).await {
        Ok(f) => f,
        Err(why) => {
            return match super::reply::error_page(&mut ex.out, &sh.error_pages, StatusCode::NOT_FOUND, &why).await {
                Ok(()) | Err(_) => Outcome::Close,
            };
        }
    };
    let snap = &figures.snapshot;
    let (body, kind) = match ep {
        Endpoint::Perf => (
            views::perfdump::render(snap, &advisor::advise(snap)),
            "text/plain; charset=utf-8",
        ),
        Endpoint::StatsXml => (
            views::xml::render(snap, &figures.parts, &views::xml::filter(query)),
            "text/xml; charset=utf-8",
        ),
        Endpoint::Metrics => (views::prom::render(snap), "text/plain; version=0.0.4; charset=utf-8"),
        Endpoint::Json => (views::json(snap, &advisor::advise(snap)), "application/json"),
        Endpoint::Dashboard => (views::dashboard(&sh.config.monitor.json), "text/html; charset=utf-8"),
        Endpoint::Nsc => {
            let list = param(query, "list").is_some().then(|| nsc_list(sh));
            (
                views::nsc::render(snap, &sh.config.cache, list.as_deref(), message.as_deref()),
                "text/plain; charset=utf-8",
            )
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(n) = param(query, "refresh").and_then(|v| v.parse::<u32>().ok()) {
        headers.insert("refresh", HeaderValue::from(n));
    }
    let _ = ex.out.send_full(StatusCode::OK, headers, Bytes::from(body)).await;
    Outcome::Close
}

/// The figures a monitoring request asked for. One process: its own. A
/// worker of several: the sum over all workers (`stats::workers`), or with
/// `?worker=I` worker I's alone (an error, answered 404, when I is out of
/// range or has no current figures).
async fn figures(sh: &Shared, query: &str) -> Result<workers::Gathered, String> {
    let own = report(sh);
    let alone = |r: workers::Report| workers::Gathered {
        parts: Vec::new(),
        snapshot: r.snapshot,
    };
    let Some(dir) = workers::dir() else {
        return Ok(alone(own));
    };
    let n = sh.config.server.processes;
    let Some(w) = param(query, "worker") else {
        return tokio::task::spawn_blocking(move || workers::gather(own, n, &dir))
            .await
            .map_err(|e| {
                tracing::debug!("gathering the workers' figures: {e}");
                "gathering the workers' figures failed (the task stopped)".to_string()
            });
    };
    let i = w
        .parse::<usize>()
        .ok()
        .filter(|i| *i < n)
        .ok_or_else(|| format!("?worker= takes a worker index, 0 to {}", n.saturating_sub(1)))?;
    if Some(i) == own.snapshot.server.process_index {
        return Ok(alone(own));
    }
    let now = own.snapshot.server.time_unix;
    tokio::task::spawn_blocking(move || workers::read(&dir, i, now))
        .await
        .map_err(|e| {
            tracing::debug!("reading worker {i}'s figures: {e}");
            format!("reading worker {i}'s figures failed (the task stopped)")
        })?
        .map(alone)
        .map_err(|why| format!("worker {i}: {why}"))
}

/// This process's figures.
pub fn report(sh: &Shared) -> workers::Report {
    workers::Report { snapshot: snapshot(sh) }
}

/// The newest `/nsc` command this worker has taken (its `seq`).
static NSC_TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Takes an `/nsc` action on this process's cache; says what was done.
fn apply_nsc(cache: &crate::cache::Cache, action: workers::NscAction) -> String {
    match action {
        workers::NscAction::Stop => {
            cache.set_running(false);
            "The cache was stopped: requests go to origins until ?start.".to_string()
        }
        workers::NscAction::Start => {
            cache.set_running(true);
            "The cache was started.".to_string()
        }
        workers::NscAction::Restart => {
            let n = cache.memory().clear();
            cache.set_running(true);
            format!("The cache was restarted: {n} objects dropped from memory (the disk tier is kept).")
        }
    }
}

/// In a worker of several: hands `action`, just taken here, to the other
/// workers. False in a single process, or if it could not be written
/// (logged).
async fn publish_nsc(action: workers::NscAction) -> bool {
    let (Some(dir), Some(index)) = (workers::dir(), crate::worker::index()) else {
        return false;
    };
    let seq = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    NSC_TAKEN.fetch_max(seq, Relaxed);
    let command = workers::NscCommand { seq, action };
    let written = tokio::task::spawn_blocking(move || workers::publish_nsc(&dir, index, &command)).await;
    match written {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!("/nsc: cannot hand the action to the other workers: {e}");
            false
        }
        Err(_) => false,
    }
}

/// In a worker of several (`stats::workers::dir` set): writes this
/// process's figures for the other workers every [`workers::WRITE_EVERY`],
/// and takes the `/nsc` actions another worker took since the last time,
/// on a blocking thread (reading /proc, serialising and writing stay off
/// the runtime's threads). Runs until the runtime stops.
pub fn spawn_figures_writer(shared: std::sync::Arc<arc_swap::ArcSwap<Shared>>) {
    let (Some(dir), Some(index)) = (workers::dir(), crate::worker::index()) else {
        return;
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(workers::WRITE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned = false;
        loop {
            tick.tick().await;
            let sh = shared.load_full();
            let to = dir.clone();
            let taken = NSC_TAKEN.load(Relaxed);
            let written = tokio::task::spawn_blocking(move || {
                let written = workers::write(&to, index, &report(&sh));
                (written, workers::newest_nsc(&to, taken))
            })
            .await;
            if let Ok((_, Some(command))) = &written
                && NSC_TAKEN.fetch_max(command.seq, Relaxed) < command.seq
                && let Some(cache) = &shared.load().cache
            {
                let m = apply_nsc(cache, command.action);
                tracing::info!("/nsc (from another worker): {m}");
            }
            match written.map(|(w, _)| w) {
                Ok(Ok(())) => warned = false,
                Ok(Err(e)) if !warned => {
                    warned = true;
                    tracing::warn!(
                        "cannot write statistics for the other workers to {}: {e}",
                        dir.display()
                    );
                }
                _ => {}
            }
        }
    });
}

/// Objects listed by `/nsc?list` (at most this many).
const LIST_LIMIT: usize = 10_000;

fn nsc_list(sh: &Shared) -> Vec<views::nsc::NscEntry> {
    let Some(cache) = &sh.cache else { return Vec::new() };
    let mut list: Vec<_> = cache
        .memory()
        .list(LIST_LIMIT)
        .into_iter()
        .map(|(id, key, size, marker)| {
            let mut flags = String::from("C");
            if cache.disk().is_some_and(|d| d.entry(id).is_some()) {
                flags.push('F');
            }
            if marker {
                flags.push('V');
            }
            views::nsc::NscEntry {
                key,
                flags,
                size,
                id: id.to_string(),
            }
        })
        .collect();
    list.sort_by(|a, b| a.key.cmp(&b.key));
    list
}

/// Everything the views show, read now.
pub fn snapshot(sh: &Shared) -> Snapshot {
    let cfg = &sh.config;
    let (requests, mut sessions, buckets, per_listener) = sh.stats.snapshot_requests();
    let proc_facts = stats::process::read();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server = stats::ServerInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        process_index: crate::worker::index(),
        uptime_secs: sh.stats.started().elapsed().as_secs_f64(),
        time_unix: now,
        workers: if cfg.server.workers == 0 {
            cpus
        } else {
            cfg.server.workers
        },
        threads: proc_facts.threads,
        rss_bytes: proc_facts.rss,
        peak_rss_bytes: proc_facts.peak_rss,
        cpu_user_secs: proc_facts.user,
        cpu_system_secs: proc_facts.system,
        open_fds: proc_facts.fds,
        cpus,
    };
    let listeners = cfg
        .listener
        .iter()
        .enumerate()
        .map(|(i, l)| stats::ListenerInfo {
            name: format!("ls{}", i + 1),
            address: format!("http://{}", l.address),
            mode: format!("{:?}", l.mode).to_lowercase(),
            acceptor_threads: 1,
            listen_queue: u64::from(crate::listen::effective_backlog(l.listen_queue)),
            listen_queue_configured: u64::from(l.listen_queue),
            requests: per_listener.get(i).copied().unwrap_or(0),
        })
        .collect();
    let q = sh.admission.snapshot();
    sessions.active = q.in_service as u64;
    sessions.peak = q.in_service_peak as u64;
    sessions.limit = Some(q.max_requests as u64);
    sessions.waited = Some(q.total_queued);
    use crate::client_bandwidth::{CLIENT_WAITS, ROUTE_WAITS, TOTAL_WAITS};
    let (client_waits, client_wait_us) = CLIENT_WAITS.read();
    let (total_waits, total_wait_us) = TOTAL_WAITS.read();
    let (route_waits, route_wait_us) = ROUTE_WAITS.read();
    let connection_queue = stats::ConnectionQueueInfo {
        current: q.current as u64,
        peak: q.peak as u64,
        limit: q.limit as u64,
        total_queued: q.total_queued,
        overflows: q.overflows,
        abandoned: q.abandoned,
        queue_time_us: q.queue_time_us,
        avg_1: q.avg_1min,
        avg_5: q.avg_5min,
        avg_15: q.avg_15min,
        total_admitted: q.total_admitted,
        unqueued_hits: q.unqueued_hits,
        admitted_beyond_limit: q.admitted_beyond_limit,
        client_limited: crate::client_limit::refused(),
        client_rate_limited: crate::client_rate::refused(),
        route_rate_limited: crate::client_rate::route_refused(),
        route_total_rate_limited: crate::client_rate::route_total_refused(),
        client_table_evictions: crate::shared_buckets::evicted(),
        connections_counted_apart: crate::client_limit::counted_apart(),
        client_bandwidth_waits: client_waits,
        client_bandwidth_wait_us: client_wait_us,
        total_bandwidth_waits: total_waits,
        total_bandwidth_wait_us: total_wait_us,
        route_bandwidth_waits: route_waits,
        route_bandwidth_wait_us: route_wait_us,
    };
    let k = sh.keepalive.snapshot();
    let keepalive = stats::KeepAliveInfo {
        count: Some(k.count as u64),
        max: Some(k.max as u64),
        hits: k.hits,
        flushes: Some(k.flushes),
        refusals: Some(k.refusals),
        timeouts: Some(k.timeouts),
        header_timeouts: Some(k.header_timeouts),
        send_timeouts: Some(k.send_timeouts),
        parked: sh.keepalive.poller().map(|_| k.parked as u64),
        parked_new: sh.keepalive.poller().map(|_| k.parked_new as u64),
        parks: sh.keepalive.poller().map(|_| k.parks),
        timeout_secs: k.timeout_secs,
        max_requests: u64::from(cfg.keepalive.max_requests),
    };
    let b = sh.blocking.snapshot();
    let native_pool = stats::PoolInfo {
        name: "NativePool".to_string(),
        idle: b.idle_threads as u64,
        threads: b.threads as u64,
        peak: b.peak_threads as u64,
        limit: b.max_threads as u64,
        queue: b.queue_length as u64,
        queue_peak: b.queue_peak as u64,
        queue_limit: b.queue_limit as u64,
        jobs: b.jobs,
        refused: b.refused,
    };
    let cache = sh.cache.as_ref().map(|c| {
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
        let st = &c.stats;
        stats::CacheInfo {
            running: c.is_running(),
            lookups: l(&st.lookups),
            hits: l(&st.hits),
            misses: l(&st.misses),
            stale: l(&st.stale_served),
            revalidations: l(&st.revalidations),
            collapsed: l(&st.collapsed),
            stored: l(&st.stored),
            invalidated: l(&st.invalidated),
            variants_dropped: l(&st.variants_dropped),
            fetches_abandoned: l(&st.fetches_abandoned),
            bytes_served: l(&st.bytes_served),
            bytes_fetched: l(&st.bytes_fetched),
            memory_entries: c.memory().len() as u64,
            memory_bytes: c.memory().bytes(),
            memory_limit: cfg.cache.memory.bytes(),
            max_memory_object: cfg.cache.max_memory_object.bytes(),
            max_age_secs: cfg.cache.max_ttl.get().as_secs(),
            min_age_secs: cfg.cache.min_ttl.get().as_secs(),
            disk: c.disk().map(|d| {
                let ds = d.stats().snapshot();
                let budget = d.budget();
                stats::DiskInfo {
                    dir: cfg.cache.dir.display().to_string(),
                    file_io: if d.file_io_inline() { "inline" } else { "pool" }.to_string(),
                    objects: ds.objects,
                    bytes: ds.bytes,
                    limit: budget.disk,
                    high_watermark: budget.high,
                    low_watermark: budget.low,
                    reads: ds.reads,
                    misses: ds.misses,
                    open_files: d.held_files() as u64,
                    open_files_limit: d.held_limit() as u64,
                    open_file_hits: ds.open_file_hits,
                    open_file_misses: ds.open_file_misses,
                    reads_nowait: ds.reads_nowait,
                    reads_blocked: ds.reads_blocked,
                    opens_nowait: ds.opens_nowait,
                    inline_jobs: ds.inline_jobs,
                    background_checks: ds.background_checks,
                    bytes_read: ds.bytes_read,
                    writes: ds.writes,
                    write_aborts: ds.write_aborts,
                    evictions: ds.evictions,
                    gc_runs: ds.gc_runs,
                    checksum_failures: ds.checksum_failures,
                    corrupt_removed: ds.corrupt_removed,
                    index_ready: ds.scan.done,
                }
            }),
        }
    });
    let (up, dns_cache) = sh.upstream.stats();
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
    let dns = stats::DnsInfo {
        enabled: dns_cache.max() > 0,
        entries: dns_cache.len() as u64,
        max_entries: dns_cache.max() as u64,
        lookups: l(&up.dns_lookups),
        hits: l(&up.dns_hits),
        failures: l(&up.dns_failures),
    };
    let upstream = stats::UpstreamInfo {
        requests: l(&up.requests),
        responses: l(&up.responses),
        connects: l(&up.connects),
        dns_errors: l(&up.dns_errors),
        connect_errors: l(&up.connect_errors),
        connect_timeouts: l(&up.connect_timeouts),
        tls_errors: l(&up.tls_errors),
        response_timeouts: l(&up.response_timeouts),
        other_errors: l(&up.other_errors),
        interim_relayed: l(&up.interim_relayed),
        destinations_denied: l(&up.destinations_denied),
        upgrades: l(&up.upgrades),
        queued: l(&up.queued),
        queue_timeouts: l(&up.queue_timeouts),
        queue_abandoned: l(&up.queue_abandoned),
        waiting: sh.upstream.waiting(),
        servers: sh
            .upstream
            .busy_servers(20)
            .into_iter()
            .map(|s| stats::ServerQueueInfo {
                // A group's own cap: its name after the server.
                server: match s.group.and_then(|g| sh.groups.get(g)) {
                    Some(g) => format!("{} ({})", s.server, g.name),
                    None => s.server,
                },
                in_use: s.in_use,
                limit: s.limit,
                waiting: s.waiting,
            })
            .collect(),
        connect_time: up.connect_time.snapshot(),
        first_byte_time: up.first_byte_time.snapshot(),
    };
    Snapshot {
        stats_enabled: sh.stats.enabled,
        server,
        requests,
        sessions,
        listeners,
        connection_queue: Some(connection_queue),
        keepalive,
        native_pool: Some(native_pool),
        cache,
        dns,
        upstream,
        buckets,
        access_log: sh.access_log.info(),
        auth: sh.auth.as_ref().map(|a| {
            let st = &a.stats;
            stats::AuthInfo {
                users: a.cached_users() as u64,
                max_users: a.config().max_users as u64,
                hits: l(&st.hits),
                misses: l(&st.misses),
                evictions: l(&st.evictions),
                failures: l(&st.failures),
                failed_cache_hits: l(&st.failed_hits),
                unavailable: l(&st.unavailable),
                reloads: l(&st.reloads),
                failing: a.failing().is_some(),
                verify_time: st.verify_time.snapshot(),
            }
        }),
        tls: stats::TlsInfo::current(),
        http2: stats::Http2Info::current(),
        tunnels: stats::TunnelInfo::current(),
        socks: cfg
            .listener
            .iter()
            .any(|l| l.mode == Mode::Socks)
            .then(|| sh.stats.socks.snapshot()),
        array: sh.array.as_ref().map(|a| stats::ArrayInfo {
            received: l(&a.received),
            owned: l(&a.owned),
            not_owned: l(&a.not_owned),
            members: a
                .members
                .iter()
                .enumerate()
                .map(|(i, m)| stats::ArrayMemberInfo {
                    name: m.name.clone(),
                    address: m.group.server(0).authority.to_string(),
                    up: a.is_up(i),
                    forwarded: l(&m.forwarded),
                })
                .collect(),
        }),
        processes: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: Method, target: &str) -> RequestHead {
        RequestHead {
            method,
            target: target.to_string(),
            version: http::Version::HTTP_11,
            headers: HeaderMap::new(),
            body: crate::http1::BodyFraming::Empty,
            keep_alive: true,
            expect_continue: false,
        }
    }

    #[test]
    fn finds_endpoints_in_origin_and_own_absolute_form() {
        let cfg = MonitorConfig::default();
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let ep = |m: Method, t: &str| endpoint(&cfg, &head(m, t), &LocalAddr::known(local), Mode::Forward, false);
        assert_eq!(
            ep(Method::GET, "/.perf?refresh=5"),
            Some((Endpoint::Perf, "refresh=5".into()))
        );
        assert_eq!(ep(Method::HEAD, "/metrics").map(|x| x.0), Some(Endpoint::Metrics));
        assert_eq!(
            ep(Method::GET, "http://127.0.0.1:8080/stats-xml?thread=0").map(|x| x.0),
            Some(Endpoint::StatsXml)
        );
        assert_eq!(
            ep(Method::GET, "http://localhost:8080/nsc").map(|x| x.0),
            Some(Endpoint::Nsc)
        );
        // Another host's /metrics is proxied, not answered here.
        assert_eq!(ep(Method::GET, "http://127.0.0.1:9000/metrics"), None);
        assert_eq!(ep(Method::GET, "http://example.com/.perf"), None);
        assert_eq!(ep(Method::POST, "/.perf"), None);
        assert_eq!(ep(Method::GET, "/.perfx"), None);
        let off = MonitorConfig {
            perf: String::new(),
            ..MonitorConfig::default()
        };
        assert_eq!(
            endpoint(
                &off,
                &head(Method::GET, "/.perf"),
                &LocalAddr::known(local),
                Mode::Forward,
                false
            ),
            None
        );
        // Transparent: only with a Host naming the listener.
        let mut h = head(Method::GET, "/.perf");
        assert_eq!(
            endpoint(&cfg, &h, &LocalAddr::known(local), Mode::Transparent, false),
            None
        );
        h.headers
            .insert(http::header::HOST, HeaderValue::from_static("example.com"));
        assert_eq!(
            endpoint(&cfg, &h, &LocalAddr::known(local), Mode::Transparent, false),
            None
        );
        h.headers
            .insert(http::header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert_eq!(
            endpoint(&cfg, &h, &LocalAddr::known(local), Mode::Transparent, false).map(|x| x.0),
            Some(Endpoint::Perf)
        );
        // A TLS transparent listener on port 443: a Host without a port
        // names it (the URL is `https`), one with port 80 does not.
        let tls_local: SocketAddr = "127.0.0.1:443".parse().unwrap();
        h.headers
            .insert(http::header::HOST, HeaderValue::from_static("127.0.0.1"));
        let on_tls = |h: &RequestHead, tls| endpoint(&cfg, h, &LocalAddr::known(tls_local), Mode::Transparent, tls);
        assert_eq!(on_tls(&h, true).map(|x| x.0), Some(Endpoint::Perf));
        assert_eq!(on_tls(&h, false), None);
        h.headers
            .insert(http::header::HOST, HeaderValue::from_static("127.0.0.1:80"));
        assert_eq!(on_tls(&h, true), None);
    }

    #[test]
    fn query_parameters() {
        assert_eq!(param("list&refresh=3", "refresh"), Some("3"));
        assert_eq!(param("list&refresh=3", "list"), Some(""));
        assert_eq!(param("listing", "list"), None);
    }
}
