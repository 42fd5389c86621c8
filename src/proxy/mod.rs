//! The request pipeline, one module per step: `admission` (a service slot,
//! or the connection queue), `access` (allow-list, credentials, and later
//! the `[[acl]]` decision), `classify` (what the request asks for),
//! `intercepted` (on a transparent listener, that it names where its
//! client was connecting), `route` (the `[[rule]]`s' verdict), `cache`
//! (lookup, serve, store), then upstream through `forward` (HTTP) or `tunnel` (CONNECT, and the SOCKS
//! sessions of `socks`, which take whole connections); `reply` makes
//! the answers Portico writes itself, and `handle` logs each request.
//! `monitor` and `purge` answer admin clients. One [`ListenerHandler`] per
//! listener; [`Shared`] holds what requests share.

pub(crate) mod access;
pub(crate) mod admission;
mod cache;
pub(crate) mod classify;
mod error_pages;
mod forward;
mod headers;
mod intercepted;
mod interim;
pub(crate) mod monitor;
mod pac;
mod purge;
mod route;

pub use error_pages::ErrorPages;
pub use purge::purge_running;
pub(crate) mod reply;
mod reply_acl;
mod socks;
pub(crate) mod tunnel;
mod upgrade;

use crate::blocking::BlockingPool;
use crate::config::{Config, ListenerConfig, Mode};
use crate::http1::{Exchange, Handler, Outcome, RejectInfo};
use crate::keepalive::KeepAlive;
use crate::log::{AccessLog, AccessRecord};
use crate::rules::Rules;
use crate::upstream::{Group, Upstream};
use access::AllowList;
use admission::{Admission, Permit};
use classify::{Target, classify};
use http::{Method, StatusCode};
use route::with_path;
use std::sync::Arc;

/// The access log's cache result of a refusal (`[access] allow`, an
/// `[[acl]]` or routing-rule deny, an authentication challenge): Squid's
/// `TCP_DENIED`.
pub(crate) const ACCESS_DENIED: &str = "DENIED";
/// The access log's cache result of an answer made before any lookup
/// (busy 503, malformed request, forwarding loop, ...): Squid's `NONE`.
pub(crate) const ACCESS_NONE: &str = "NONE";
/// The access log's cache result of a routing rule's redirect: Squid's
/// `TCP_REDIRECT`.
pub(crate) const ACCESS_REDIRECT: &str = "REDIRECT";
/// The access log's cache result of a stored response served stale because
/// the origin failed its revalidation (`stale-if-error`,
/// `cache.max_stale_on_error`): Squid's `TCP_REFRESH_FAIL_OLD`. Counted
/// as `STALE` in the statistics and `X-Cache`.
pub(crate) const ACCESS_STALE_ON_ERROR: &str = "STALE_ON_ERROR";

/// Everything built from the config that requests share.
pub(crate) struct Shared {
    /// The configuration in force.
    pub config: Config,
    allow: AllowList,
    admin: AllowList,
    /// The compiled `[[rule]]`s.
    pub rules: Rules,
    /// The compiled `[[acl]]` entries.
    pub acl: crate::acl::Acl,
    groups: Vec<Arc<Group>>,
    /// The client for the servers the configuration names (`[[upstream]]`
    /// groups of origin servers).
    upstream: Arc<Upstream>,
    /// The client for the destinations clients name (forward and
    /// transparent requests' origins, `CONNECT` and SOCKS targets), which
    /// refuses `proxy.deny_destinations` (`Upstream::guarded`).
    direct: Arc<Upstream>,
    /// For each `[[acl]]` `allow_destinations` set (`Acl::reach_sets`), a
    /// client like `direct` that may also connect to those networks; its
    /// pool is its own, so a connection opened under the exception is
    /// never lent to a request without it.
    reach: Vec<Arc<Upstream>>,
    /// `[array]` routing between members, when the array lists members;
    /// its members' parent groups end `groups`.
    pub array: Option<Arc<crate::array::route::Router>>,
    /// For each group, one client per server when the group's servers are
    /// parent proxies (`parent = true`); empty for origin groups.
    parents: Vec<Vec<Upstream>>,
    /// The access log writer.
    pub access_log: Arc<AccessLog>,
    /// The HTTP cache, unless `cache.enabled = false`.
    pub cache: Option<crate::cache::Cache>,
    /// Request statistics and performance buckets.
    pub stats: Arc<crate::stats::Stats>,
    /// Admission (`server.max_requests`) and the connection queue.
    pub admission: Arc<Admission>,
    /// The keep-alive subsystem (shared with the connections' `ConnSettings`).
    pub keepalive: Arc<KeepAlive>,
    /// The blocking pool the disk cache runs its file I/O on.
    pub blocking: BlockingPool,
    /// Basic authentication and the user cache, when `[auth]` names an htpasswd file.
    pub auth: Option<Arc<crate::auth::Authenticator>>,
    /// The pages Portico's own errors are answered with (`[error_pages]`).
    pub error_pages: ErrorPages,
}

impl Shared {
    /// Builds the shared state from a config whose machine-sized limits
    /// are already resolved (`sizing::resolve`); fails on a resource that
    /// cannot be opened.
    pub fn new(config: Config) -> Result<Shared, String> {
        Self::build(config, None)
    }

    /// The state for a reloaded `config`, sharing what did not change with
    /// `self`: the cache's stored objects always (its policy and the routes'
    /// overrides are rebuilt), the origin client and its pooled connections
    /// when `[origin]` is unchanged, the access log when its file and format are.
    pub fn renew(&self, config: Config) -> Result<Shared, String> {
        Self::build(config, Some(self))
    }

    /// The destination exception `decision` grants a request from `client`
    /// (`Acl::reach`), none for another member of this node's array: its
    /// requests (forwarded with the marker, relayed through a rule's parent
    /// group, a `CONNECT`) are decided with that member as the client, and
    /// an exception is for a member's own clients, decided there. The
    /// member list is looked at only for a decision that grants one.
    pub(crate) fn reach_of(&self, decision: &crate::acl::Decision, client: std::net::IpAddr) -> usize {
        match self.acl.reach(decision) {
            0 => 0,
            _ if self.array.as_ref().is_some_and(|a| a.is_member(client)) => 0,
            k => k,
        }
    }

    /// The client for the destinations a client chooses, under the
    /// exception `reach` (`Acl::reach` of the request's decision; 0 for
    /// none).
    pub(crate) fn direct_for(&self, reach: usize) -> &Upstream {
        reach
            .checked_sub(1)
            .and_then(|k| self.reach.get(k))
            .unwrap_or(&self.direct)
    }

    fn build(config: Config, old: Option<&Shared>) -> Result<Shared, String> {
        let mut groups = config
            .upstream
            .iter()
            .map(|c| Group::new(c).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        // The array members' groups follow the configured ones, so the
        // indices rules use are unchanged.
        let array = crate::array::route::Router::new(&config, groups.len())?.map(Arc::new);
        if let Some(r) = &array {
            groups.extend(r.members.iter().map(|m| m.group.clone()));
        }
        // Groups are built in config order, which is how rules name them.
        let rules = Rules::compile(&config).map_err(|e| e.to_string())?;
        let acl = crate::acl::Acl::compile(&config).map_err(|e| e.to_string())?;
        let error_pages =
            ErrorPages::load(&config.error_pages.directory).map_err(|e| format!("error_pages.directory: {e}"))?;
        // Admission, the keep-alive set and the blocking pool belong to the
        // process: a reload keeps them (and their counters); their limits
        // need a restart (`reload::keep_restart_only`).
        let blocking = match old {
            Some(o) => o.blocking.clone(),
            None => BlockingPool::new(config.server.blocking_threads, config.server.blocking_queue),
        };
        let admission = match old {
            Some(o) => o.admission.clone(),
            None => Arc::new(Admission::new(
                config.server.max_requests,
                config.server.queue_size,
                config.server.descriptors,
            )),
        };
        let keepalive = match old {
            Some(o) => o.keepalive.clone(),
            None => {
                let ka = KeepAlive::new(config.keepalive.max_connections, config.keepalive.timeout.get());
                if let Err(e) = ka.start_poller(config.keepalive.park_after.get()) {
                    tracing::warn!(
                        "keep-alive poller not started ({cause}): idle connections wait in their own tasks",
                        cause = crate::util::io_cause(&e)
                    );
                }
                ka
            }
        };
        let upstream = match old {
            Some(o) if crate::util::same_value(&o.config.origin, &config.origin) => o.upstream.clone(),
            _ => Arc::new(Upstream::new(&config.origin)?),
        };
        let direct = match old {
            Some(o)
                if Arc::ptr_eq(&o.upstream, &upstream)
                    && o.config.proxy.deny_destinations == config.proxy.deny_destinations
                    && o.config.proxy.allow_destinations == config.proxy.allow_destinations =>
            {
                o.direct.clone()
            }
            _ => Arc::new(upstream.guarded(crate::upstream::Destinations::new(&config.proxy).map(Arc::new))),
        };
        let reach = match crate::upstream::Destinations::new(&config.proxy) {
            Some(refused) => acl
                .reach_sets()
                .iter()
                .map(|nets| Arc::new(upstream.guarded(Some(Arc::new(refused.except(nets))))))
                .collect(),
            None => Vec::new(),
        };
        // Rebuilt with the groups (a reload starts their pools afresh, as
        // it does the groups' health).
        let parents = groups
            .iter()
            .enumerate()
            .map(|(i, g)| match g.parent {
                true if array.as_ref().is_some_and(|r| i >= r.group_base) => {
                    let source = array.as_ref().and_then(|r| r.self_ip());
                    vec![upstream.via_member(g.server(0), source)]
                }
                true => (0..g.len())
                    .map(|i| upstream.via_parent(g.server(i), g.credentials.clone()))
                    .collect(),
                false => Vec::new(),
            })
            .collect();
        let access_log = match old {
            Some(o)
                if o.config.log.access == config.log.access
                    && o.config.log.format == config.log.format
                    && o.config.log.custom_format == config.log.custom_format
                    && o.config.log.resolve_clients == config.log.resolve_clients
                    && o.config.log.access_queue == config.log.access_queue =>
            {
                o.access_log.clone()
            }
            _ => Arc::new(AccessLog::open(
                &config.log.access,
                config.log.format,
                &config.log.custom_format,
                config.log.resolve_clients,
                config.log.access_queue,
            )?),
        };
        // The statistics outlive a reload unless what they are laid out by
        // changed (listeners, buckets, monitor.enabled): then they restart.
        let bucket_names: Vec<String> = config.rule.iter().filter_map(|r| r.bucket.clone()).collect();
        let layout = |c: &Config| {
            (
                c.monitor.enabled,
                c.listener.iter().map(|l| l.address).collect::<Vec<_>>(),
                c.rule.iter().filter_map(|r| r.bucket.clone()).collect::<Vec<_>>(),
            )
        };
        let stats = match old {
            Some(o) if layout(&o.config) == layout(&config) => o.stats.clone(),
            _ => Arc::new(crate::stats::Stats::new(
                config.monitor.enabled,
                config.listener.len(),
                &bucket_names,
            )),
        };

        let overrides: Vec<_> = config.rule.iter().map(|r| r.cache.clone()).collect();
        // The stored objects outlive a reload (`cache.enabled` only changes on a restart).
        let cache = match old.map(|o| o.cache.as_ref()) {
            Some(Some(c)) => Some(c.reconfigure(&config.cache, &overrides)?),
            Some(None) => None,
            None if config.cache.enabled => {
                Some(crate::cache::Cache::new(&config.cache, &overrides, blocking.clone())?)
            }
            None => None,
        };
        // The user cache outlives a reload when `[auth]` is unchanged; the
        // files are read again either way (SIGHUP is how an admin says
        // "the users changed"), and a reload is refused if they cannot be.
        let auth = match old.and_then(|o| o.auth.as_ref()) {
            Some(a) if config.auth.enabled() && *a.config() == config.auth => {
                a.check_files(true);
                if let Some(why) = a.reload_error() {
                    return Err(format!("auth: {why}"));
                }
                Some(a.clone())
            }
            _ if config.auth.enabled() => Some(Arc::new(crate::auth::Authenticator::new(&config.auth)?)),
            _ => None,
        };
        if let Some(r) = &array {
            crate::array::route::Router::start_probe(r);
        }
        Ok(Shared {
            array,
            auth,
            error_pages,
            stats,
            admission,
            keepalive,
            allow: AllowList::new(&config.access.allow),
            admin: AllowList::new(&config.access.admin_allow),
            rules,
            acl,
            groups,
            upstream,
            direct,
            reach,
            parents,
            access_log,
            cache,
            blocking,
            config,
        })
    }
}

/// The `Proxy-Authorization` for a request sent to parent group `group`:
/// the group's fixed credentials (`credentials_file`), else the client's own
/// when the route passes them (`parent_credentials = "pass"`), else none
/// (the client's field is hop-by-hop and removed, as by default).
fn parent_credentials(
    sh: &Shared,
    group: usize,
    route: &crate::rules::Route,
    client: &Option<http::HeaderValue>,
) -> Option<http::HeaderValue> {
    let g = sh.groups.get(group).filter(|g| g.parent)?;
    match &g.credentials {
        Some(fixed) => Some(fixed.clone()),
        None if route.pass_credentials => client.clone(),
        None => None,
    }
}

/// Serves the requests of one listener.
pub(crate) struct ListenerHandler {
    /// forward | reverse | transparent.
    pub mode: Mode,
    /// Whether the listener speaks TLS (has certificates).
    pub tls: bool,
    /// Position of the listener in the config (for per-listener counters).
    pub index: usize,
    /// State shared by all listeners; a reload swaps in a new one. Each
    /// request takes the one current when it starts and keeps it to the end.
    pub shared: Arc<arc_swap::ArcSwap<Shared>>,
    /// This listener's busy (503) response.
    pub busy: reply::BusyPage,
}

impl ListenerHandler {
    /// The handler of listener `cfg`, the `index`th of the config; fails
    /// if its `busy_file` cannot be read.
    pub fn new(
        index: usize,
        cfg: &ListenerConfig,
        server: &crate::config::ServerConfig,
        shared: Arc<arc_swap::ArcSwap<Shared>>,
    ) -> Result<ListenerHandler, String> {
        Ok(ListenerHandler {
            mode: cfg.mode,
            tls: !cfg.certificate.is_empty(),
            index,
            busy: reply::BusyPage::for_listener(cfg, server)?,
            shared,
        })
    }
}

impl Handler for ListenerHandler {
    async fn handle(&self, ex: &mut Exchange<'_>) -> Outcome {
        let started = std::time::Instant::now();
        let sh = self.shared.load_full();
        // A request that already passed through Portico (our Via entry) is
        // never a monitoring request, whoever sent it: Portico may have sent
        // it to itself on a client's behalf, from an admin address the
        // client does not have. `serve` answers it 508 (forwarding loop)
        // before anything else, PURGE included.
        let looped = headers::via_contains(&ex.head.headers, &sh.config.proxy.via);
        if !looped
            && let Some((ep, query)) = monitor::endpoint(&sh.config.monitor, &ex.head, &ex.local, self.mode, self.tls)
        {
            // Before admission, so the statistics can be read when the
            // server is saturated; kept out of the request counters (and
            // closed after, out of the keep-alive ones), so reading them
            // does not change them.
            sh.stats.admin_request();
            let outcome = Box::pin(monitor::serve(ep, &query, ex, &sh)).await;
            self.log(ex, &sh, started);
            return outcome;
        }
        if !looped && pac::wanted(&sh, ex, self.mode, self.tls) {
            // As a monitoring page: before admission, out of the request counters.
            sh.stats.admin_request();
            let outcome = Box::pin(pac::serve(ex, &sh, self.mode)).await;
            self.log(ex, &sh, started);
            return outcome;
        }
        sh.stats.begin(self.index);
        // A CONNECT tunnel lasts as long as the client likes: timing it
        // would swamp the response-time histogram and the buckets. The
        // timer's scope is the connection's (`timed` below), around the
        // boxed request future.
        let timing = sh.stats.enabled && ex.head.method != Method::CONNECT && crate::stats::restart_timer();
        let outcome = self.admit_and_serve(ex, &sh).await;
        {
            let _log = crate::stats::stage(crate::stats::Stage::Log);
            self.log(ex, &sh, started);
        }
        if timing {
            crate::stats::record_current(&sh.stats);
        }
        sh.stats.end(
            &ex.head.method,
            ex.out.status().map_or(0, |s| s.as_u16()),
            ex.body.received(),
            ex.out.body_bytes(),
        );
        outcome
    }

    fn timed(&self) -> bool {
        self.shared.load().stats.enabled
    }

    fn takes_connections(&self) -> bool {
        self.mode == Mode::Socks
    }

    async fn serve_connection(&self, stream: crate::http1::ClientStream, peer: std::net::SocketAddr) {
        self.serve_socks(stream, peer).await;
    }

    async fn reject(&self, mut rej: RejectInfo<'_>) {
        tracing::warn!(client = %rej.peer.ip(), status = rej.error.status.as_u16(), "rejected request: {} ({:?})", rej.error.reason, rej.first_line);
        let sh = self.shared.load();
        let _ = reply::error_page(&mut rej.out, &sh.error_pages, rej.error.status, rej.error.reason).await;
        let line = if rej.first_line.is_empty() {
            "-".to_string()
        } else {
            rej.first_line.clone()
        };
        sh.stats.rejected(rej.error.status.as_u16());
        sh.access_log.record(&AccessRecord {
            client: rej.peer.ip(),
            user: None,
            request_line: &line,
            status: rej.error.status.as_u16(),
            bytes: rej.out.body_bytes(),
            referer: None,
            user_agent: None,
            elapsed: std::time::Duration::ZERO,
            // Refused before anything was looked up: Squid's NONE/400.
            cache: Some(ACCESS_NONE),
            hierarchy: None,
            headers: None,
            tls: self.tls,
        });
    }
}

impl ListenerHandler {
    async fn serve<'s>(
        &self,
        ex: &mut Exchange<'_>,
        shared: &'s Arc<Shared>,
        permit: &mut Option<Permit<'s>>,
    ) -> Outcome {
        let sh = &**shared;
        let access = crate::stats::stage(crate::stats::Stage::Access);
        if !sh.allow.allows(ex.peer.ip()) {
            return self
                .refuse(ex, ACCESS_DENIED, StatusCode::FORBIDDEN, "Cache access denied")
                .await;
        }
        // The array's one-hop marker: honoured from another member's
        // address (this node then serves the request itself), removed and
        // ignored from anyone else. It skips nothing else: ACLs,
        // authentication and limits apply as to any request.
        let from_member = ex.head.headers.remove(crate::array::route::MARKER).is_some()
            && sh.array.as_ref().is_some_and(|a| a.is_member(ex.peer.ip()));
        if from_member && let Some(a) = &sh.array {
            a.received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // A member forwarding to us added its own Via entry, which has our
        // pseudonym when the members share one (the default): one is allowed.
        if headers::via_count(&ex.head.headers, &sh.config.proxy.via) > usize::from(from_member) {
            return self
                .refuse(
                    ex,
                    ACCESS_NONE,
                    StatusCode::LOOP_DETECTED,
                    "forwarding loop detected (our Via entry is already in the request)",
                )
                .await;
        }
        // The client's proxy credentials, kept (before `[auth]` takes them)
        // only when a rule may pass them to a parent (`parent_credentials`).
        // An array member passes them to the owner it forwards to (which
        // authenticates the client against the same users).
        let client_credentials = match sh.rules.passes_credentials() || sh.array.is_some() {
            true => ex.head.headers.get(http::header::PROXY_AUTHORIZATION).cloned(),
            false => None,
        };
        if let Some(auth) = &sh.auth
            && let Some(outcome) = self.authenticate(ex, sh, auth).await
        {
            return outcome;
        }
        if ex.head.method == Method::TRACE && !sh.config.proxy.allow_trace {
            // Neither answered nor forwarded: an echo of the request hands
            // its credentials to whatever script sent it (cross-site tracing).
            tracing::info!(client = %ex.peer.ip(), "TRACE {}: refused (proxy.allow_trace = false)", ex.head.target);
            ex.cache_result = Some(ACCESS_NONE);
            return reply::trace_refused(ex, &sh.error_pages).await;
        }
        if (ex.head.method == Method::TRACE || ex.head.method == Method::OPTIONS)
            && headers::max_forwards(&ex.head.headers) == Some(0)
        {
            return reply::max_forwards_zero(ex, sh.config.proxy.allow_trace).await;
        }
        let max_body = sh.config.limits.max_body_size.bytes();
        if let crate::http1::BodyFraming::Length(n) = ex.head.body
            && max_body > 0
            && n > max_body
        {
            return self
                .refuse(
                    ex,
                    ACCESS_NONE,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body exceeds limits.max_body_size",
                )
                .await;
        }
        drop(access);
        // The user `[auth]` verified, for the `[[acl]]` step (held apart
        // from `ex`, which the answer needs mutably).
        let user = ex.user.clone();
        let route_stage = crate::stats::stage(crate::stats::Stage::Route);
        let target = match classify(&ex.head, self.mode, self.tls) {
            Ok(Target::Tunnel { host, port }) => {
                let acl_host = crate::rules::tunnel_host(&host);
                let decision = sh.acl.decide_now(&crate::acl::Request::tunnel(
                    &acl_host,
                    port,
                    ex.peer.ip(),
                    &ex.head.headers,
                    self.mode,
                    user.as_deref().map(crate::auth::User::identity),
                ));
                let reach = sh.reach_of(&decision, ex.peer.ip());
                if let Some(outcome) = self.enforce(ex, sh, decision, true).await {
                    return outcome;
                }
                let mut route = self.tunnel_route(ex, sh, &host, port);
                drop(route_stage);
                ex.out.edit_headers(std::mem::take(&mut route.response_headers));
                if let Some(b) = route.bandwidth {
                    ex.out.limit_route_bandwidth(b.rate, b.after);
                }
                if let Some(status) = route.deny {
                    return self.refuse(ex, ACCESS_DENIED, status, "denied by a routing rule").await;
                }
                if route.redirect.is_some() {
                    return self
                        .refuse(
                            ex,
                            ACCESS_DENIED,
                            StatusCode::FORBIDDEN,
                            crate::rules::REDIRECT_REFUSED_FOR_CONNECT,
                        )
                        .await;
                }
                if let Some(outcome) = admission::over_route_rate(ex, &sh.error_pages, &route).await {
                    return outcome;
                }
                let parent = route.upstream.filter(|&g| sh.groups.get(g).is_some_and(|g| g.parent));
                let parent_auth = parent.and_then(|g| parent_credentials(sh, g, &route, &client_credentials));
                let to = tunnel::To {
                    host: &host,
                    port,
                    parent,
                    parent_auth,
                    reach,
                };
                return Box::pin(tunnel::run(ex, sh, to, permit)).await;
            }
            Ok(Target::Http(t)) => t,
            Err((status, reason)) => {
                drop(route_stage);
                return self.refuse(ex, ACCESS_NONE, status, reason).await;
            }
        };
        // A URL naming another port than HTTP's is refused before anything
        // is sent (Squid's `http_access deny !Safe_ports`): forwarded, a
        // request body reached whatever listens there (a POST carrying an
        // SMTP conversation to port 25), as CONNECT, held to
        // `connect_ports`, cannot. A reverse listener's requests go to its
        // configured servers, not to the port the client names.
        if target.origin.is_some() && !sh.config.proxy.http_ports.iter().any(|r| r.contains(target.port)) {
            drop(route_stage);
            tracing::warn!(client = %ex.peer.ip(), "request to port {} refused: not in proxy.http_ports", target.port);
            return self
                .refuse(
                    ex,
                    ACCESS_DENIED,
                    StatusCode::FORBIDDEN,
                    "requests to this port are not allowed",
                )
                .await;
        }
        // A request on a connection the kernel redirected here must name
        // where its client was connecting, and is fetched from there
        // (`intercepted`).
        let mut pinned = None;
        if self.mode == Mode::Transparent
            && let Some(original) = ex.local.redirected_from()
        {
            let resolve = |host: String, port: u16| async move { sh.direct.resolve(&host, port).await };
            if let Some(why) = intercepted::mismatch(&target.host, target.port, original, resolve).await {
                drop(route_stage);
                return self.refuse(ex, ACCESS_DENIED, StatusCode::CONFLICT, &why).await;
            }
            pinned = Some(std::net::SocketAddr::new(original.ip(), target.port));
        }
        let acl_request = crate::acl::Request {
            client: ex.peer.ip(),
            method: &ex.head.method,
            scheme: target.scheme,
            host: &target.host,
            port: target.port,
            path_and_query: &target.path_and_query,
            headers: &ex.head.headers,
            mode: self.mode,
            user: user.as_deref().map(crate::auth::User::identity),
        };
        let decision = sh.acl.decide_now(&acl_request);
        let reach = sh.reach_of(&decision, ex.peer.ip());
        // The response entries that apply to this request, checked on its
        // response head (`reply_acl.rs`); none configured costs nothing.
        let reply = match decision {
            crate::acl::Decision::Allow { .. } if sh.acl.has_reply_entries() => sh.acl.reply_filter(&acl_request),
            _ => crate::acl::ReplyFilter::default(),
        };
        if let Some(outcome) = self.enforce(ex, sh, decision, false).await {
            return outcome;
        }
        let mut route = self.route(ex, sh, &target);
        if let Some(b) = &route.bucket {
            crate::stats::set_bucket(sh.stats.bucket_index(b));
        }
        drop(route_stage);
        ex.out.edit_headers(std::mem::take(&mut route.response_headers));
        // Another array member's request: the member in front keeps the
        // route's rate to its own client (its client's address, which the
        // rules here cannot see, may lift it there).
        if let Some(b) = route.bandwidth
            && !from_member
        {
            ex.out.limit_route_bandwidth(b.rate, b.after);
        }
        if let Some(status) = route.deny {
            return self.refuse(ex, ACCESS_DENIED, status, "denied by a routing rule").await;
        }
        if let Some(redirect) = &route.redirect {
            ex.cache_result = Some(ACCESS_REDIRECT);
            return reply::redirect(ex, &sh.error_pages, redirect).await;
        }
        // Past the answers a rule gives itself (as nginx's `return` comes
        // before `limit_req`). The member in front counted a forwarded
        // request (the check exempts the members' addresses).
        if let Some(outcome) = admission::over_route_rate(ex, &sh.error_pages, &route).await {
            return outcome;
        }
        for e in &route.request_headers {
            e.apply(&mut ex.head.headers);
        }
        const BAD_REWRITE: &str = "a routing rule rewrote the URL into an invalid one";
        let path_and_query = match route.path_and_query.take() {
            Some(pq) if pq.parse::<http::uri::PathAndQuery>().is_err() => {
                return self.fail(ex, StatusCode::INTERNAL_SERVER_ERROR, BAD_REWRITE).await;
            }
            Some(pq) => Some(pq),
            None => None,
        };
        let to = match (route.upstream, target.origin) {
            (Some(group), origin) if sh.groups[group].parent => {
                // The parent is sent the origin's absolute URL: the
                // request's own (forward, transparent), or on a reverse
                // listener the one made of Host and the target.
                let origin = match origin {
                    Some(uri) => Some(uri),
                    None if !target.authority.is_empty() => {
                        format!("{}://{}{}", target.scheme, target.authority, target.path_and_query)
                            .parse()
                            .ok()
                    }
                    None => None,
                };
                match origin {
                    None => Err((
                        StatusCode::BAD_REQUEST,
                        "no Host header to name the origin to the parent proxy",
                    )),
                    Some(origin) => with_path(origin, path_and_query)
                        .map(|origin| forward::To::Parent { group, origin })
                        .ok_or((StatusCode::INTERNAL_SERVER_ERROR, BAD_REWRITE)),
                }
            }
            (Some(group), _) => Ok(forward::To::Group {
                group,
                path_and_query: path_and_query.unwrap_or(target.path_and_query),
                public_host: target.authority,
            }),
            (None, Some(uri)) => with_path(uri, path_and_query)
                .map(forward::To::Origin)
                .ok_or((StatusCode::INTERNAL_SERVER_ERROR, BAD_REWRITE)),
            (None, None) => Err((StatusCode::NOT_FOUND, "no route matches this host and path")),
        };
        let mut to = match to {
            Ok(to) => to,
            Err((status, reason)) => return self.fail(ex, status, reason).await,
        };
        // Array routing: a GET or HEAD for an http URL another member owns
        // goes to that member, unless it came from a member already (one
        // hop). What is served here is counted as owned or not: a request
        // served for another member (down, or members do not forward)
        // leaves a copy the owner may hold too, the array's duplicates.
        let mut to_member = false;
        // A request under a destination exception is served here: another
        // member would judge it by its own rules, and see this one as the client.
        if let (Some(a), forward::To::Origin(uri)) = (&sh.array, &to)
            && reach == 0
            && self.mode == Mode::Forward
            && (ex.head.method == Method::GET || ex.head.method == Method::HEAD)
            && uri.scheme() == Some(&http::uri::Scheme::HTTP)
            && upgrade::offered(&ex.head, &sh.config.proxy.upgrade_protocols).is_none()
        {
            let (m, owner) = a.serving_and_owner(&uri.to_string());
            if a.forward && !from_member && m != a.self_index {
                a.count_forwarded(m);
                to_member = true;
                to = forward::To::Parent {
                    group: a.group_base + m,
                    origin: uri.clone(),
                };
            } else if owner == a.self_index {
                a.owned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                a.not_owned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let (parent_auth, relay_challenge) = match &to {
            // The owner judges the client's own credentials, and its
            // challenge goes back to the client.
            forward::To::Parent { .. } if to_member => (client_credentials.clone(), true),
            forward::To::Parent { group, .. } => (
                parent_credentials(sh, *group, &route, &client_credentials),
                route.pass_credentials && sh.groups.get(*group).is_some_and(|g| g.credentials.is_none()),
            ),
            _ => (None, false),
        };
        let dest = forward::Dest {
            to,
            cache_rule: route.cache_rule,
            reply,
            parent_auth,
            relay_challenge,
            reverse: self.mode == Mode::Reverse,
            reach,
            pinned,
        };
        let route_busy = route.busy_body.take().map(|body| self.busy.with_body(body));
        let busy = route_busy.as_ref().unwrap_or(&self.busy);
        // A request without a permit (every one was taken when it came) may
        // go on only to the cache's lookup: past the cache, it takes one.
        let offer = upgrade::offered(&ex.head, &sh.config.proxy.upgrade_protocols);
        let past_cache = to_member || purge::is_purge(&ex.head.method) || offer.is_some();
        if past_cache
            && permit.is_none()
            && let Some(outcome) = Box::pin(admission::admit_deferred(ex, &sh.admission, busy, permit)).await
        {
            return outcome;
        }
        let result = if to_member {
            // The owner caches it; a copy here would be a duplicate.
            ex.cache_result = Some("MISS");
            Box::pin(forward::forward(ex, sh, &dest)).await
        } else if purge::is_purge(&ex.head.method) {
            Box::pin(purge::purge(ex, sh, &dest, !from_member)).await
        } else if let Some(offer) = offer {
            // Past the cache: an upgraded exchange is not a response to store.
            Box::pin(upgrade::serve(ex, sh, &dest, offer, permit)).await
        } else {
            cache::serve(ex, shared, dest, busy, permit).await
        };
        match result {
            Ok(()) => Outcome::Done,
            Err((status, reason)) => self.fail(ex, status, &reason).await,
        }
    }

    /// `fail` for an answer made before any cache lookup or origin contact;
    /// `kind` is what the access log records as its cache result
    /// (`ACCESS_DENIED` or `ACCESS_NONE`).
    async fn refuse(&self, ex: &mut Exchange<'_>, kind: &'static str, status: StatusCode, reason: &str) -> Outcome {
        ex.cache_result = Some(kind);
        self.fail(ex, status, reason).await
    }

    /// Answers with an error page (unless a response is already under way)
    /// and writes the reason to the error log.
    async fn fail(&self, ex: &mut Exchange<'_>, status: StatusCode, reason: &str) -> Outcome {
        if forward::is_client_gone(status) {
            // No one is left to answer, and nothing went wrong upstream.
            tracing::debug!(client = %ex.peer.ip(), "{} {}: {reason}", ex.head.method, ex.head.target);
            return Outcome::Close;
        }
        tracing::warn!(client = %ex.peer.ip(), status = status.as_u16(), "{} {}: {reason}", ex.head.method, ex.head.target);
        if ex.out.head_sent() {
            return Outcome::Close;
        }
        if status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE {
            ex.out.close_after();
        }
        // The pages in force now: a reload since the request began gives
        // the newer ones, as it would to the next request.
        let pages = &self.shared.load().error_pages;
        match reply::error_page(&mut ex.out, pages, status, reason).await {
            Ok(()) => Outcome::Done,
            Err(_) => Outcome::Close,
        }
    }

    fn log(&self, ex: &Exchange<'_>, sh: &Shared, started: std::time::Instant) {
        // No access log: no request line to join, no clock to read.
        if !sh.access_log.enabled() {
            return;
        }
        let h = &ex.head;
        let version = match h.version {
            http::Version::HTTP_10 => "HTTP/1.0",
            // As nginx and Squid log it.
            http::Version::HTTP_2 => "HTTP/2.0",
            _ => "HTTP/1.1",
        };
        // Joined, not `format!`: this runs for every request.
        let request_line = [h.method.as_str(), " ", h.target.as_str(), " ", version].concat();
        let header = |name: http::header::HeaderName| h.headers.get(name).and_then(|v| v.to_str().ok());
        sh.access_log.record(&AccessRecord {
            client: ex.peer.ip(),
            user: ex.user.as_deref().map(|u| u.name.as_str()),
            request_line: &request_line,
            status: ex.out.status().map_or(0, |s| s.as_u16()),
            bytes: ex.out.body_bytes(),
            referer: header(http::header::REFERER),
            user_agent: header(http::header::USER_AGENT),
            elapsed: started.elapsed(),
            cache: ex.cache_result,
            hierarchy: ex.hierarchy.as_deref(),
            headers: Some(&h.headers),
            tls: self.tls,
        });
    }
}
