//! The cache stage of the pipeline: look a GET/HEAD up, serve it fresh,
//! revalidate it, serve it stale when allowed, or fetch it once for all
//! concurrent requests (collapsing) and store it while it streams to the
//! client. Unsafe methods pass through and invalidate what they change.

use super::Shared;
use super::admission::{Permit, admit_deferred};
use super::forward::{Dest, Failure, LocationRewrite, fetch, forward};
use super::headers::strip_hop_by_hop;
use super::reply::{self, BusyPage};
use crate::cache::flight::{Ending, Follower, Leader, Next, OnDisk, Role, SharedHead};
use crate::cache::object::{KeptLines, StoredMeta};
use crate::cache::partial::{self, NewPart};
use crate::cache::policy::{self, Decision, HeadUpdate, NotStorable, Policy, Precondition, Revalidation};
use crate::cache::range::{self, RangePlan};
use crate::cache::status::{Fwd, Member};
use crate::cache::{Cache, CacheKey, ObjectId, StoreSink, Stored};
use crate::http1::{BodyFraming, BodyLen, Exchange, Outcome, RequestHead};
use http::header::{
    AGE, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE,
    IF_UNMODIFIED_SINCE, RANGE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::SystemTime;

mod ahead;
mod slice;

/// What the cache did for a request (the `X-Cache` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Served from the cache without contacting the origin.
    Hit,
    /// Fetched from the origin.
    Miss,
    /// Served stale (stale-while-revalidate, stale-if-error, max-stale).
    Stale,
    /// Validated with the origin (304) and served from the cache.
    Revalidated,
    /// Answered from another request's fetch after waiting for it: `HIT`
    /// to the client (no origin request was made for it), `COLLAPSED` in
    /// the statistics and the access log (it had a miss's wait).
    Collapsed,
    /// Served stale because its revalidation failed (`STALE`, as
    /// [`CacheStatus::Stale`]; `Cache-Status` says it went forward), with
    /// the origin's status code when it answered (a 5xx).
    StaleOnError(Option<StatusCode>),
}

/// The `Cache-Status` field (RFC 9211).
const CACHE_STATUS: http::HeaderName = http::HeaderName::from_static("cache-status");

/// Marks a response with what the cache did: the `cache.status_header`
/// (`X-Cache`) and, when `cache.cache_status` names this cache, its member
/// of `Cache-Status`, after those of the caches nearer the origin (RFC
/// 9211 §2: each cache appends its own). `member` brings what only the
/// caller knows (`fwd-status`, `ttl`, `stored`, and in `fwd` why a
/// forwarded request went, when not what `status` implies); `hit`,
/// `collapsed` and whether there is a `fwd` at all follow from `status`.
fn mark(cache: &Cache, headers: &mut HeaderMap, status: CacheStatus, member: Member) {
    let [status_header, cache_status] = marks(cache, status, member);
    if let Some((name, value)) = status_header {
        headers.insert(name, value);
    }
    if let Some((name, value)) = cache_status {
        headers.append(name, value);
    }
}

/// What [`mark`] sets: the status header (replacing any stored one) and
/// this cache's `Cache-Status` member (after any stored ones), each when
/// configured.
fn marks(cache: &Cache, status: CacheStatus, mut member: Member) -> [Option<(HeaderName, HeaderValue)>; 2] {
    let status_header = cache.status_header.as_ref().map(|name| (name.clone(), status.value()));
    let Some(id) = &cache.cache_status else {
        return [status_header, None];
    };
    let (hit, fwd, collapsed) = match status {
        CacheStatus::Hit | CacheStatus::Stale => (true, None, false),
        CacheStatus::Miss => (false, Some(Fwd::Miss), false),
        CacheStatus::Collapsed => (false, Some(Fwd::Miss), true),
        CacheStatus::Revalidated | CacheStatus::StaleOnError(_) => (false, Some(Fwd::Stale), false),
    };
    member.hit = hit;
    member.collapsed = collapsed;
    member.fwd = fwd.map(|implied| member.fwd.unwrap_or(implied));
    [status_header, Some((CACHE_STATUS, member.value(id)))]
}

/// Whole seconds a stored response stays fresh from `now` (0 or less:
/// stale), for `Cache-Status`; None (and no work on the hit path) when the
/// cache sends none.
fn ttl(cache: &Cache, policy: &Policy, meta: &StoredMeta, now: SystemTime) -> Option<i64> {
    cache.cache_status.as_ref()?;
    let secs = |d: std::time::Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    Some(secs(policy.freshness_lifetime(meta)).saturating_sub(secs(policy::current_age(meta, now))))
}

impl CacheStatus {
    fn outcome(self) -> crate::stats::CacheOutcome {
        match self {
            CacheStatus::Hit => crate::stats::CacheOutcome::Hit,
            CacheStatus::Miss => crate::stats::CacheOutcome::Miss,
            CacheStatus::Stale | CacheStatus::StaleOnError(_) => crate::stats::CacheOutcome::Stale,
            CacheStatus::Revalidated => crate::stats::CacheOutcome::Revalidated,
            CacheStatus::Collapsed => crate::stats::CacheOutcome::Collapsed,
        }
    }

    fn value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            CacheStatus::Hit | CacheStatus::Collapsed => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Stale | CacheStatus::StaleOnError(_) => "STALE",
            CacheStatus::Revalidated => "REVALIDATED",
        })
    }
}

/// The cache key of a request going to `dest`: the public URL, and the
/// upstream group it is fetched from when that is not the URL's origin.
pub(super) fn key_for(cache: &Cache, sh: &Shared, dest: &Dest) -> CacheKey {
    let (scheme, authority, pq) = dest.public_url();
    match dest.fetched_from(sh) {
        // A reverse listener's `Host`: `example:80` is not `example` on a
        // TLS listener, and an origin that gets `Host: example:80` may put
        // it in its answer (a Location, links): one key each.
        Some(group) => cache.key_as_given(scheme, authority, pq).in_upstream(group),
        None => cache.key(scheme, authority, pq),
    }
}

/// Serves a request that may involve the cache. `busy` is the page sent
/// when the disk tier cannot take the lookup now (blocking pool queue full).
pub async fn serve<'s>(
    ex: &mut Exchange<'_>,
    sh: &'s Arc<Shared>,
    dest: Dest,
    busy: &BusyPage,
    permit: &mut Option<Permit<'s>>,
) -> Result<(), Failure> {
    let Some(cache) = sh
        .cache
        .as_ref()
        .filter(|c| c.is_running() && c.enabled_for(dest.cache_rule))
    else {
        if permit.is_none()
            && let Some(outcome) = Box::pin(admit_deferred(ex, &sh.admission, busy, permit)).await
        {
            return answered(ex, outcome);
        }
        return Box::pin(forward(ex, sh, &dest)).await;
    };
    let policy = if dest.reverse {
        cache.reverse_policy_for(dest.cache_rule)
    } else {
        cache.policy_for(dest.cache_rule)
    };
    let key = key_for(cache, sh, &dest);
    let now = SystemTime::now();
    // Unsafe methods and requests with a body pass the cache by; so does a
    // request the policy bypasses it for. Either goes upstream: a request
    // without a permit takes one first.
    let pass_through =
        (ex.head.method != Method::GET && ex.head.method != Method::HEAD) || ex.head.body != BodyFraming::Empty;
    let bypass = !pass_through && policy.bypasses_cache(&ex.head.headers);
    if (pass_through || bypass)
        && permit.is_none()
        && let Some(outcome) = Box::pin(admit_deferred(ex, &sh.admission, busy, permit)).await
    {
        return answered(ex, outcome);
    }
    let mut tx = Transaction {
        ex,
        sh,
        cache,
        policy,
        dest: &dest,
        key,
        now,
        fwd: None,
    };
    if pass_through {
        return tx.pass_through().await;
    }
    if bypass {
        // Boxed: its fetch is 5 KB of state that every hit's future would
        // otherwise carry (and copy into its box).
        return Box::pin(tx.bypass()).await;
    }
    cache.stats.lookup();
    // A request under an `[[acl]]` destination exception may be answered
    // with what others fetched (it may reach more than they may), but what
    // it fetches may come from an address they may not reach: it is its
    // own, neither stored nor shared with collapsed requests, and a stale
    // object is not revalidated for it (a 304 would update what others get).
    let private = dest.reach != 0;
    let from_cache = |d: &Option<Decision>| match d {
        Some(Decision::Fresh | Decision::GatewayTimeout) => true,
        Some(Decision::Stale | Decision::StaleWhileRevalidate) => !private,
        _ => false,
    };
    // At most twice: a request without a permit that must go upstream (a
    // miss, a revalidation) takes one first, and may wait in the queue for
    // seconds; meanwhile what it looked up may have been stored (by the
    // very fetch it would have joined) or replaced, so it looks again.
    let (found, decision) = loop {
        let lookup_stage = crate::stats::stage(crate::stats::Stage::CacheLookup);
        let found = cache
            .lookup_for(&tx.key, &tx.ex.head.headers, tx.ex.out.takes_files())
            .await;
        drop(lookup_stage);
        let Ok(found) = found.map(|f| f.filter(|s| tx.may_serve(&s.meta))) else {
            let ex = tx.ex;
            tracing::debug!(client = %ex.peer.ip(), "{} {}: blocking pool queue full, busy 503", ex.head.method, ex.head.target);
            // A GET or HEAD without a body: the connection can stay open.
            ex.cache_result = Some(super::ACCESS_NONE);
            let _ = reply::busy(&mut ex.out, busy, None).await;
            return Ok(());
        };
        let decision = found
            .as_ref()
            .map(|stored| policy.evaluate(&tx.ex.head.headers, &stored.meta, tx.now));
        if permit.is_some() || from_cache(&decision) {
            break (found, decision);
        }
        // Boxed, as every rarely taken branch here: the hit path's future
        // would otherwise carry the queue's state.
        if let Some(outcome) = Box::pin(admit_deferred(tx.ex, &sh.admission, busy, permit)).await {
            return answered(tx.ex, outcome);
        }
        tx.now = SystemTime::now();
    };
    if permit.is_none() {
        sh.admission.unqueued_hit();
    }
    if private && !from_cache(&decision) {
        // RFC 9211 2.2: why it went to the origin.
        let fwd = match &decision {
            None => Fwd::Miss,
            Some(Decision::Revalidate { reason, .. }) if reason.by_request() => Fwd::Request,
            Some(_) => Fwd::Stale,
        };
        return Box::pin(tx.private_fetch(fwd)).await;
    }
    let (Some(stored), Some(decision)) = (found, decision) else {
        if let Some(size) = policy.slice_size() {
            return Box::pin(tx.sliced(size)).await;
        }
        if let Some(done) = tx.partial_hit().await {
            return done;
        }
        return tx.miss().await;
    };
    let stored = shareable(policy, stored);
    // One await sends every answer from the cache, so the hit path's future
    // holds one `send_stored` (see `Transaction`).
    let status = match decision {
        Decision::Fresh => tx.fresh(),
        Decision::Stale => tx.stale(),
        Decision::StaleWhileRevalidate => tx.stale_while_revalidate(&stored),
        Decision::GatewayTimeout => return Err(tx.gateway_timeout()),
        Decision::Revalidate {
            reason,
            stale_if_error_until,
        } => {
            // The request's `no-cache`, `max-age` or `min-fresh`, not the
            // stored response, sent it (RFC 9211 2.2's `request`).
            tx.fwd = Some(if reason.by_request() { Fwd::Request } else { Fwd::Stale });
            return Box::pin(tx.revalidate_collapsed(stored, stale_if_error_until)).await;
        }
    };
    tx.send_stored(stored, status).await
}

/// A request `admit_deferred` answered (busy 503) or gave up (its client
/// went away): nothing more is sent; the connection closes if it must.
fn answered(ex: &mut Exchange<'_>, outcome: Outcome) -> Result<(), Failure> {
    if matches!(outcome, Outcome::Close) {
        ex.out.close_after();
    }
    Ok(())
}

/// One request's cache transaction: what every step of the cache stage
/// works with, gathered once when the request reaches it, with one method
/// per [`Decision`] of the policy (and one for a miss). It borrows the
/// request and the settings; only the key is its own. The methods for the
/// decisions answered from the cache (fresh, stale, stale-while-revalidate)
/// return how the stored response is sent and `serve` sends it with one
/// await: a request's future is copied into its box once per request, and
/// one `send_stored` future in it, not one per decision, keeps the hit path's
/// small.
///
/// Serving the stored response when the origin fails (`stale-if-error`,
/// `cache.max_stale_on_error`: [`Transaction::stale_on_error`]) is one more
/// such way; partial content ([`Transaction::partial_hit`], the parts kept
/// by `store_and_send`) another.
struct Transaction<'t, 'e> {
    /// The request, and where its response goes.
    ex: &'t mut Exchange<'e>,
    /// The worker's shared state (upstreams, cache, settings).
    sh: &'t Arc<Shared>,
    /// The cache (`sh.cache`, running and enabled for this route).
    cache: &'t Cache,
    /// The route's cache settings (`[cache]`, or its rule's `cache = {...}`).
    policy: &'t Policy,
    /// Where the request is fetched from.
    dest: &'t Dest,
    /// The request's cache key.
    key: CacheKey,
    /// When the request reached the cache: the stored response's freshness
    /// is judged at this time.
    now: SystemTime,
    /// Why this request went to the origin when it was not a plain miss
    /// (`Cache-Status`'s `fwd`): `stale` for a stored response validated,
    /// `request` when the request's directives sent it.
    fwd: Option<Fwd>,
}

/// When a request was sent upstream and when its response head arrived
/// (RFC 9111 4.2.3): a stored response's age counts from them. With them,
/// the address it came from (`OriginBody::origin_addr`), kept as they are.
#[derive(Debug, Clone, Copy)]
struct Times {
    request: SystemTime,
    response: SystemTime,
    origin: Option<std::net::IpAddr>,
}

/// A response from the origin, as `forward::fetch` returned it, with its times.
struct Fetched {
    response: http::Response<crate::upstream::OriginBody>,
    rewrite: Option<LocationRewrite>,
    times: Times,
}

/// An origin response's head as this client gets it (hop-by-hop fields
/// removed, `Via` added, `Location` rewritten), its announced length and times.
struct ClientHead {
    status: StatusCode,
    headers: HeaderMap,
    length: Option<u64>,
    times: Times,
}

impl Fetched {
    /// The head the client gets, and the body; `relay_challenge`: a
    /// parent's 407 keeps its `Proxy-Authenticate` (the client's own
    /// credentials are passed to that parent: `parent_credentials = "pass"`).
    fn into_head(self, sh: &Shared, relay_challenge: bool) -> (ClientHead, crate::upstream::OriginBody) {
        let (parts, body) = self.response.into_parts();
        let head = ClientHead {
            status: parts.status,
            headers: super::forward::response_headers_for(
                parts.headers,
                parts.status,
                parts.version,
                sh,
                self.rewrite.as_ref(),
                relay_challenge,
            ),
            length: body.size_hint().exact(),
            times: self.times,
        };
        (head, body)
    }
}

/// Fetches `head` from the origin (with `conditional` fields when
/// revalidating), noting when it was sent and answered; the string is the
/// hierarchy field of the access log.
async fn fetch_timed(
    sh: &Shared,
    head: &RequestHead,
    client: std::net::IpAddr,
    dest: &Dest,
    conditional: Option<&HeaderMap>,
    out: Option<&mut crate::http1::ResponseWriter<'_>>,
) -> Result<(Fetched, String), Failure> {
    let request = SystemTime::now();
    let (response, rewrite, hierarchy) = fetch(sh, head, client, dest, conditional, out).await?;
    let times = Times {
        request,
        response: SystemTime::now(),
        origin: response.body().origin_addr(),
    };
    Ok((
        Fetched {
            response,
            rewrite,
            times,
        },
        hierarchy,
    ))
}

/// The store path, the one for a miss and for a revalidation (in the
/// foreground or the background) answered with a new response: checks that
/// `policy` stores the response to `req`, builds the stored metadata from
/// the fields every client may get (without those `Policy::take_unshared`
/// keeps for this client alone) and opens the sink. Also returns the head
/// collapsed requests are sent.
async fn open_store<'c>(
    cache: &'c Cache,
    policy: &Policy,
    key: &CacheKey,
    req: &RequestHead,
    head: &ClientHead,
) -> Result<(StoreSink<'c>, SharedHead), NotStorable> {
    policy.storable(&req.method, key, &req.headers, head.status, &head.headers)?;
    let mut shared = head.headers.clone();
    policy.take_unshared(&mut shared);
    let vary = policy::vary_fields(&shared).unwrap_or_default();
    let variant = policy::variant_of(&vary, &req.headers);
    let meta = StoredMeta {
        key: key.text().to_string(),
        variant: variant.clone(),
        status: head.status,
        headers: crate::cache::object::exact_headers(&shared),
        request_time: head.times.request,
        response_time: head.times.response,
        origin: head.times.origin,
        derived: Default::default(),
    };
    let sink = cache.sink(key, meta, &vary, head.length).await;
    let shared = SharedHead {
        status: head.status,
        headers: shared,
        length: head.length,
        vary,
        variant,
        request_time: head.times.request,
        response_time: head.times.response,
        origin: head.times.origin,
    };
    Ok((sink, shared))
}

/// The update path, the one for a 304 in the foreground and the background:
/// merges the 304's fields into `stored` (RFC 9111 4.3.4) and replaces the
/// metadata of object `id` in both tiers. The 304's fields `policy` keeps
/// from other clients (its cookies) are not merged: they are returned, for
/// the client that asked, if any.
async fn update_from_304(
    cache: &Cache,
    policy: &Policy,
    id: ObjectId,
    stored: &StoredMeta,
    mut fresh: HeaderMap,
    times: Times,
) -> (Arc<StoredMeta>, HeaderMap) {
    let mut meta = StoredMeta::clone(stored);
    strip_hop_by_hop(&mut fresh);
    let own = policy.take_unshared(&mut fresh);
    policy::update_from_304(&mut meta, &fresh, times.request, times.response);
    let meta = Arc::new(meta);
    cache.update_meta(id, meta.clone()).await;
    (meta, own)
}

impl Transaction<'_, '_> {
    /// Whether a stored response may answer this request, as far as where
    /// it came from goes. A destination the client chose (forward and
    /// transparent proxying) is answered from the cache only with what came
    /// from an address the request may reach now: `proxy.deny_destinations`
    /// (less the request's `[[acl]]` exception) may have changed since the
    /// response was stored, by a reload or a restart, and what its fetch
    /// would now be refused must not outlive the rule in the cache. A
    /// response from no known address (through a parent proxy, or stored by
    /// an earlier version) is not served so either. Such a stored response
    /// is treated as absent, so the request is fetched anew, not
    /// revalidated: a 304 from another address cannot vouch for bytes that
    /// came from a refused one. A route to a parent or a group is the
    /// configuration's choice, not the client's: no address is checked.
    ///
    /// The same holds for the response of a fetch another request leads
    /// (a follower's [`SharedHead`]): a follower that may not be sent it
    /// fetches for itself.
    fn may_serve(&self, meta: &StoredMeta) -> bool {
        self.may_serve_from(meta.origin)
    }

    /// [`Transaction::may_serve`] for a response from `origin`.
    fn may_serve_from(&self, origin: Option<std::net::IpAddr>) -> bool {
        !matches!(self.dest.to, super::forward::To::Origin(_))
            || self.sh.direct_for(self.dest.reach).may_have_fetched_from(origin)
    }

    /// A request other than a GET or HEAD without a body goes to the origin;
    /// what a successful unsafe request changes is removed from the cache.
    async fn pass_through(&mut self) -> Result<(), Failure> {
        let result = Box::pin(forward(self.ex, self.sh, self.dest)).await;
        if let Some(status) = self.ex.out.status() {
            for k in self
                .policy
                .invalidations(&self.ex.head.method, &self.key, status, self.ex.out.sent_headers())
            {
                self.cache.invalidate(&k).await;
            }
        }
        result
    }

    /// A GET for one range that no complete response answers, inside a
    /// part kept fresh from a 206 (RFC 9111 3.3, the cache-tests suite's
    /// `partial-store-partial-reuse-partial*`): answered from the part as a
    /// 206 hit. None: not answerable so (no part holds the range, a
    /// multi-range or conditional request, `If-Range` not matching).
    async fn partial_hit(&mut self) -> Option<Result<(), Failure>> {
        let h = &self.ex.head.headers;
        if self.ex.head.method != Method::GET
            || !h.contains_key(RANGE)
            || [IF_MATCH, IF_NONE_MATCH, IF_MODIFIED_SINCE, IF_UNMODIFIED_SINCE]
                .iter()
                .any(|n| h.contains_key(n))
        {
            return None;
        }
        let parts = self.cache.partials.get(self.key.id())?;
        if parts.meta.key != self.key.text()
            || !self.may_serve(&parts.meta)
            || self.policy.evaluate(h, &parts.meta, self.now) != Decision::Fresh
        {
            return None;
        }
        let RangePlan::Single(r) = range::plan(&Method::GET, h, StatusCode::OK, &parts.meta.headers, parts.complete)
        else {
            return None;
        };
        let body = parts.get(&r)?;
        if let Some(why) = super::reply_acl::denied(&self.dest.reply, StatusCode::PARTIAL_CONTENT, &parts.meta.headers)
        {
            super::reply_acl::refuse(&mut self.ex.out, self.sh, &self.ex.head, &why).await;
            return Some(Ok(()));
        }
        self.cache.stats.hit();
        note_cache(self.ex, crate::stats::CacheOutcome::Hit);
        let mut headers = parts.meta.headers.clone();
        self.policy.take_unshared(&mut headers);
        self.policy.strip_targeted(&mut headers);
        headers.insert(AGE, policy::age_header(&parts.meta, SystemTime::now()));
        headers.insert(CONTENT_RANGE, header_value(&range::content_range(&r, parts.complete)));
        let member = Member {
            ttl: ttl(self.cache, self.policy, &parts.meta, SystemTime::now()),
            ..Member::default()
        };
        mark(self.cache, &mut headers, CacheStatus::Hit, member);
        let _send = crate::stats::stage(crate::stats::Stage::Send);
        let ex = &mut *self.ex;
        ex.out
            .send_head(StatusCode::PARTIAL_CONTENT, headers, BodyLen::Known(body.len() as u64));
        if ex.out.send_data(&body).await.is_err() {
            ex.out.close_after();
        }
        finish(ex).await;
        self.cache.stats.served(body.len() as u64);
        Some(Ok(()))
    }

    /// A 206 from the origin to keep as a part (RFC 9111 3.3): storable
    /// but for its status, one `Content-Range` of a known complete length
    /// (an unknown one, `*`, says where the part sits in nothing: not
    /// kept), its body exactly that range, no `Vary`. The part without its
    /// body, and the body's length.
    fn part_to_keep(&self, head: &ClientHead) -> Option<(NewPart, u64)> {
        if head.status != StatusCode::PARTIAL_CONTENT || self.ex.head.method != Method::GET || self.dest.reach != 0 {
            return None;
        }
        self.policy
            .storable(
                &Method::GET,
                &self.key,
                &self.ex.head.headers,
                StatusCode::OK,
                &head.headers,
            )
            .ok()?;
        if head.headers.contains_key(http::header::VARY) {
            return None;
        }
        let cr = partial::parse_content_range(head.headers.get(CONTENT_RANGE)?.as_bytes())?;
        let complete = cr.complete?;
        let len = cr.range.end - cr.range.start;
        if head.length != Some(len) {
            return None;
        }
        let mut headers = partial::whole_headers(head.headers.clone());
        self.policy.take_unshared(&mut headers);
        let meta = StoredMeta {
            key: self.key.text().to_string(),
            variant: Vec::new(),
            status: StatusCode::OK,
            headers,
            request_time: head.times.request,
            response_time: head.times.response,
            origin: head.times.origin,
            derived: Default::default(),
        };
        let part = NewPart {
            meta,
            start: cr.range.start,
            complete,
            body: bytes::Bytes::new(),
        };
        Some((part, len))
    }

    /// [`Decision::Fresh`]: served from the cache, as a hit.
    fn fresh(&self) -> CacheStatus {
        self.cache.stats.hit();
        CacheStatus::Hit
    }

    /// [`Decision::Stale`]: served stale, as the client allows (`max-stale`).
    /// Also a revalidation that failed within `stale-if-error`.
    fn stale(&self) -> CacheStatus {
        self.cache.stats.stale();
        CacheStatus::Stale
    }

    /// The origin failed a revalidation within `stale-if-error` or
    /// `cache.max_stale_on_error`: the stored response is served stale
    /// (`X-Cache: STALE`, a stale hit in the statistics), logged as Squid
    /// logs it (`TCP_REFRESH_FAIL_OLD`).
    /// `answered`: the origin's status code, when it answered (a 5xx).
    async fn stale_on_error(&mut self, stored: Stored, answered: Option<StatusCode>) -> Result<(), Failure> {
        self.stale();
        let result = self.send_stored(stored, CacheStatus::StaleOnError(answered)).await;
        // After `send_stored`, which notes STALE: the access log's own name.
        if self.ex.cache_result == Some(crate::stats::CacheOutcome::Stale.name()) {
            self.ex.cache_result = Some(super::ACCESS_STALE_ON_ERROR);
        }
        result
    }

    /// [`Decision::StaleWhileRevalidate`]: served stale while one background
    /// revalidation refreshes it for the next requests.
    fn stale_while_revalidate(&self, stored: &Stored) -> CacheStatus {
        self.cache.stats.stale();
        self.spawn_revalidation(stored);
        CacheStatus::Stale
    }

    /// [`Decision::GatewayTimeout`]: `only-if-cached` and the stored
    /// response is stale.
    fn gateway_timeout(&self) -> Failure {
        (
            StatusCode::GATEWAY_TIMEOUT,
            "only-if-cached: the stored response is stale".into(),
        )
    }

    /// Nothing stored for the request: 504 for `only-if-cached`, else fetch
    /// (collapsed with concurrent misses) and store.
    async fn miss(&mut self) -> Result<(), Failure> {
        self.cache.stats.miss();
        if policy::only_if_cached(&self.ex.head.headers) {
            return Err((StatusCode::GATEWAY_TIMEOUT, "only-if-cached: not in the cache".into()));
        }
        // Not boxed apart: the request's future, which holds this one, is
        // boxed anyway (`http1::conn`), and a box of its own (7.5 KB) was
        // one more malloc and free through glibc's bins on every miss. A
        // hit's future is written in place with only its arguments, so the
        // larger size costs it no copy; an HTTP/2 stream's box is the
        // larger size (+1.9% instructions per h2 hit under callgrind).
        self.fetch_and_store().await
    }

    /// A request with `Cache-Control: no-store` ([`Policy::bypasses_cache`]):
    /// answered by the origin, neither from what is stored nor by joining
    /// another request's fetch, and not stored ([`Policy::storable`] says no).
    async fn bypass(&mut self) -> Result<(), Failure> {
        self.cache.stats.miss();
        self.fwd = Some(Fwd::Request);
        let fetched = self.fetch(None).await?;
        self.store_and_send(fetched, None).await;
        Ok(())
    }

    /// A request under an `[[acl]]` destination exception that nothing fresh
    /// answers (`fwd` says why): sent to the origin as the client sent it
    /// (its own `Range` and validators too), as [`Transaction::bypass`]
    /// does, and not stored ([`Transaction::store_and_send`]).
    async fn private_fetch(&mut self, fwd: Fwd) -> Result<(), Failure> {
        self.cache.stats.miss();
        if policy::only_if_cached(&self.ex.head.headers) {
            return Err((StatusCode::GATEWAY_TIMEOUT, "only-if-cached: not in the cache".into()));
        }
        self.fwd = Some(fwd);
        let fetched = self.fetch(None).await?;
        self.store_and_send(fetched, None).await;
        Ok(())
    }

    /// The request to the origin, noting where it went for the access log.
    async fn fetch(&mut self, conditional: Option<&HeaderMap>) -> Result<Fetched, Failure> {
        let (fetched, hierarchy) = fetch_timed(
            self.sh,
            &self.ex.head,
            self.ex.peer.ip(),
            self.dest,
            conditional,
            Some(&mut self.ex.out),
        )
        .await?;
        self.ex.hierarchy = Some(hierarchy);
        Ok(fetched)
    }

    /// [`Decision::Revalidate`], collapsed: concurrent requests revalidating
    /// the same stored object send one conditional request (as Squid's
    /// `collapsed_forwarding` and Varnish's waiting list do). The first leads
    /// ([`Transaction::revalidate`]); the others wait, at most
    /// `cache.revalidation_wait`, for its outcome:
    ///
    /// - a 304 updated the stored object: they are served it (`REVALIDATED`);
    /// - a new response is being stored: they get it as it arrives, if their
    ///   request selects the same `Vary` variant;
    /// - a new response that is not stored, or a 304 that selected nothing:
    ///   nothing is shared and each revalidates for itself, so every client
    ///   gets the origin's answer to its own request, never another's body;
    /// - the origin failed: each applies its own stale-on-error window
    ///   (RFC 9111 4.2.4), else asks the origin itself.
    ///
    /// A follower never uses what it waited for unless the object was
    /// validated or stored after its request arrived (`response_time` at or
    /// after `self.now`), or is fresh.
    async fn revalidate_collapsed(
        &mut self,
        stored: Stored,
        stale_if_error_until: Option<SystemTime>,
    ) -> Result<(), Failure> {
        let stale_ok = |now: SystemTime| stale_if_error_until.is_some_and(|until| now <= until);
        let mut stored = stored;
        // A rejoin after a leader gone before any answer (its client went
        // away) makes one new leader; bounded like `fetch_and_store`'s.
        for _ in 0..4 {
            let mut follower = match self.cache.flights.join(stored.id, self.key.text()) {
                Role::Leader(l) => return self.revalidate(stored, stale_if_error_until, Some(l)).await,
                Role::Follower(f) => f,
            };
            let wait = tokio::time::timeout(self.cache.revalidation_wait, follower.head());
            let Some(waited) = unless_client_left(&mut self.ex.out, self.sh, wait).await else {
                return Err(left_while_waiting());
            };
            let Ok(head) = waited else {
                tracing::debug!(key = self.key.text(), "collapsed revalidation: wait over, revalidating");
                break;
            };
            match head {
                Some(head) => {
                    if !self.may_serve_from(head.origin) {
                        // From where this request may not go: fetched anew.
                        drop(follower);
                        return Box::pin(self.fetch_and_store()).await;
                    }
                    if policy::variant_of(&head.vary, &self.ex.head.headers) == head.variant {
                        self.cache.stats.collapsed();
                        return self.send_followed(&head, follower).await;
                    }
                    break; // another variant now: ours is revalidated (or fetched) alone
                }
                None if follower.abandoned() => continue,
                None if follower.origin_failed() => {
                    if stale_ok(SystemTime::now()) {
                        self.cache.stats.collapsed();
                        return self.stale_on_error(stored, None).await;
                    }
                    break;
                }
                None => {
                    drop(follower);
                    // What is stored now: updated by a 304, or replaced.
                    let Ok(found) = self.cache.lookup(&self.key, &self.ex.head.headers).await else {
                        break;
                    };
                    let found = found.filter(|f| self.may_serve(&f.meta));
                    let Some(found) = found.map(|f| shareable(self.policy, f)) else {
                        // Replaced by nothing storable, or by what this
                        // request may not be sent: a miss for it.
                        return Box::pin(self.fetch_and_store()).await;
                    };
                    let decision = self
                        .policy
                        .evaluate(&self.ex.head.headers, &found.meta, SystemTime::now());
                    if decision == Decision::Fresh || found.meta.response_time >= self.now {
                        self.cache.stats.collapsed();
                        return self.send_stored(found, CacheStatus::Revalidated).await;
                    }
                    // Revalidated with its own validators, not the ones
                    // looked up before (its body may have been replaced).
                    stored = found;
                    break;
                }
            }
        }
        self.revalidate(stored, stale_if_error_until, None).await
    }

    /// Validates the stored response with the origin, then serves the
    /// stored (updated) response, the new one, or the stale one when the
    /// origin fails within `stale_if_error_until`. `leader`: the requests
    /// collapsed onto this revalidation, told its outcome as soon as it is
    /// known (before this client is sent anything).
    async fn revalidate(
        &mut self,
        stored: Stored,
        stale_if_error_until: Option<SystemTime>,
        leader: Option<Leader>,
    ) -> Result<(), Failure> {
        self.cache.stats.revalidation();
        let conditional = policy::conditional_headers(&stored.meta);
        let stale_ok = |now: SystemTime| stale_if_error_until.is_some_and(|until| now <= until);
        let end = |leader: Option<Leader>, ending: Ending| {
            if let Some(l) = leader {
                l.finish(ending);
            }
        };
        let fetched = match self.fetch(Some(&conditional)).await {
            Ok(fetched) => fetched,
            // No answer (refused, reset, closed, timed out: RFC 9111 4.2.4's
            // disconnected cache): the stored response instead of the 502/504.
            Err(failure) if policy::is_origin_error(failure.0) && stale_ok(SystemTime::now()) => {
                end(leader, Ending::OriginFailed);
                tracing::debug!(key = self.key.text(), "origin failed ({}): served stale", failure.1);
                return self.stale_on_error(stored, None).await;
            }
            Err(failure) if policy::is_origin_error(failure.0) => {
                end(leader, Ending::OriginFailed);
                return Err(failure);
            }
            Err(failure) => return Err(failure),
        };
        match policy::revalidation(&stored.meta, fetched.response.status(), fetched.response.headers()) {
            Revalidation::NotModified => {
                let fresh = fetched.response.into_parts().0.headers;
                let (meta, own) =
                    update_from_304(self.cache, self.policy, stored.id, &stored.meta, fresh, fetched.times).await;
                // Updated: the followers look it up.
                end(leader, Ending::Complete);
                let mut stored = Stored { meta, ..stored };
                // The 304's cookies are this client's: not merged into what
                // later clients get, but sent to this one.
                if !own.is_empty() {
                    let mut meta = StoredMeta::clone(&stored.meta);
                    for (name, value) in &own {
                        meta.headers.append(name, value.clone());
                    }
                    stored.meta = Arc::new(meta);
                }
                self.send_stored(stored, CacheStatus::Revalidated).await
            }
            Revalidation::ServerError if stale_ok(fetched.times.response) => {
                let answered = fetched.response.status();
                // The error's body is not wanted: dropped now, not held
                // while the stored response is sent.
                drop(fetched);
                end(leader, Ending::OriginFailed);
                self.stale_on_error(stored, Some(answered)).await
            }
            // RFC 9111 4.3.4: a 304 that selects no stored response updates
            // none. Fetching again without validators would make a second
            // request, and an origin that answers it with a 304 again would
            // have that 304 relayed to a client that sent no conditional.
            Revalidation::Mismatch => {
                drop(fetched);
                end(leader, Ending::NotShared);
                self.send_stored(stored, CacheStatus::Revalidated).await
            }
            Revalidation::Replace if self.ex.head.method == Method::HEAD => {
                self.update_from_head(&stored, &fetched).await;
                // A HEAD response has no body to share: followers look up
                // what the update left.
                end(leader, Ending::NotShared);
                self.store_and_send(fetched, None).await;
                Ok(())
            }
            Revalidation::ServerError | Revalidation::Replace => {
                // Shared with the followers when stored, else `NotShared`.
                self.store_and_send(fetched, leader).await;
                Ok(())
            }
        }
    }

    /// A HEAD forwarded to revalidate the stored GET response was answered:
    /// a 200 updates the stored response or invalidates it (RFC 9111 4.3.5,
    /// [`policy::head_update`]). The answer itself goes to the client.
    async fn update_from_head(&self, stored: &Stored, fetched: &Fetched) {
        let (status, headers) = (fetched.response.status(), fetched.response.headers());
        match policy::head_update(&stored.meta, stored.len, status, headers) {
            HeadUpdate::Update => {
                // As for a 304, the HEAD's cookies are not merged (`take_unshared`);
                // this client gets them with the HEAD response itself.
                update_from_304(
                    self.cache,
                    self.policy,
                    stored.id,
                    &stored.meta,
                    headers.clone(),
                    fetched.times,
                )
                .await;
            }
            HeadUpdate::Invalidate => {
                self.cache.invalidate(&self.key).await;
            }
            HeadUpdate::Leave => {}
        }
    }

    /// A miss: join the fetch already under way for this key, or lead one.
    /// When the fetch under way turns out to be another `Vary` variant, the
    /// request joins (or leads) the fetch of its own variant instead, so
    /// concurrent misses for one variant still make one origin request.
    async fn fetch_and_store(&mut self) -> Result<(), Failure> {
        let mut flight = self.key.id();
        let mut leader = None;
        // The primary key's flight, then at most that of our variant, and a
        // rejoin after a leader that failed before its response head (so one
        // waiter retries and the others follow it, not all at once).
        for _ in 0..4 {
            let mut follower = match self.cache.flights.join(flight, self.key.text()) {
                Role::Leader(l) => {
                    leader = Some(l);
                    break;
                }
                Role::Follower(f) => f,
            };
            // Watching the client meanwhile: a follower whose client left
            // must not keep the fetch going for no one (`Leader::followed`,
            // `cache.quick_abort`).
            let Some(head) = unless_client_left(&mut self.ex.out, self.sh, follower.head()).await else {
                return Err(left_while_waiting());
            };
            match head {
                Some(head) if !self.may_serve_from(head.origin) => {
                    break; // from where this request may not go: fetch for ourselves
                }
                Some(head) => {
                    let variant = policy::variant_of(&head.vary, &self.ex.head.headers);
                    if variant == head.variant {
                        self.cache.stats.collapsed();
                        return self.send_followed(&head, follower).await;
                    }
                    let own = self.key.variant_id(&variant);
                    if own == flight {
                        break; // not shareable after all: fetch for ourselves
                    }
                    flight = own;
                }
                None if follower.abandoned() => continue,
                None => {
                    // The fetch ended without sharing its body with us (we
                    // joined late with no file to read, or it was not
                    // storable): it may be stored now.
                    drop(follower);
                    if let Ok(Some(stored)) = self.cache.lookup(&self.key, &self.ex.head.headers).await
                        && self.may_serve(&stored.meta)
                        && let stored = shareable(self.policy, stored)
                        && self
                            .policy
                            .evaluate(&self.ex.head.headers, &stored.meta, SystemTime::now())
                            == Decision::Fresh
                    {
                        self.cache.stats.collapsed();
                        return self.send_stored(stored, CacheStatus::Collapsed).await;
                    }
                    break; // fetch for ourselves
                }
            }
        }
        let fetched = self.fetch(None).await?;
        self.store_and_send(fetched, leader).await;
        Ok(())
    }

    /// Sends the origin's response to the client, storing it (and sharing it
    /// with collapsed followers) when the policy allows.
    async fn store_and_send(&mut self, fetched: Fetched, mut leader: Option<Leader>) {
        // Before anything is stored or shared: a denied type is never stored,
        // and collapsed followers (other clients, other filters) fetch for
        // themselves.
        let response = &fetched.response;
        if let Some(why) = super::reply_acl::denied(&self.dest.reply, response.status(), response.headers()) {
            if let Some(l) = leader {
                l.finish(Ending::NotShared);
            }
            drop(fetched);
            super::reply_acl::refuse(&mut self.ex.out, self.sh, &self.ex.head, &why).await;
            return;
        }
        // Preparing the store (opening the disk writer) is part of sending a miss.
        note_cache(self.ex, crate::stats::CacheOutcome::Miss);
        let _send = crate::stats::stage(crate::stats::Stage::Send);
        let (head, body) = fetched.into_head(self.sh, self.dest.relay_challenge);
        let storable = match head.length {
            _ if self.dest.reach != 0 => Err(NotStorable("fetched under an [[acl]] allow_destinations exception")),
            Some(n) if n > self.cache.max_object_size() => Err(NotStorable("larger than cache.max_object_size")),
            _ => open_store(self.cache, self.policy, &self.key, &self.ex.head, &head).await,
        };
        let part = self
            .part_to_keep(&head)
            .map(|(p, len)| (p, len, bytes::BytesMut::new()));
        let key = self.key.text();
        let mut sink: Option<StoreSink<'_>> = None;
        match storable {
            Ok((s, shared)) => {
                sink = Some(s);
                if let Some(l) = &leader {
                    l.head(shared);
                }
            }
            Err(why) => {
                tracing::debug!(key, "not stored: {why}");
                // Followers fetch for themselves.
                if let Some(l) = leader.take() {
                    l.finish(Ending::NotShared);
                }
            }
        }
        let ClientHead {
            status,
            mut headers,
            length,
            ..
        } = head;
        self.policy.strip_targeted(&mut headers);
        let member = Member {
            fwd: self.fwd,
            fwd_status: Some(status),
            stored: sink.is_some(),
            ..Member::default()
        };
        mark(self.cache, &mut headers, CacheStatus::Miss, member);
        let len = match length {
            Some(n) => BodyLen::Known(n),
            None => BodyLen::Unknown,
        };
        let ex = &mut *self.ex;
        ex.out.send_head(status, headers, len);
        let fill = Fill {
            cache: self.cache,
            key: &self.key,
            config: &self.sh.config.cache,
            idle: self.sh.upstream.idle_timeout,
            length,
            sink,
            leader,
            part,
        };
        let gap = self.sh.config.cache.read_ahead_gap.bytes();
        if fill.sink.is_some() && gap > 0 {
            // Stored: the fill runs ahead of this client (`ahead`), so the
            // cache and the collapsed requests get the object at the
            // origin's pace, not this client's.
            let (queue, pieces) = ahead::queue(
                &self.cache.read_ahead.permits,
                gap,
                self.sh.config.origin.abort_on_close,
            );
            // The writer first: a piece queued goes out before the fill
            // reads on, when the client can take it at once.
            tokio::join!(
                biased;
                queue.deliver(pieces, &mut ex.out),
                fill.run(body, ToClient::Ahead(&queue))
            );
        } else {
            fill.run(body, ToClient::InStep(&mut ex.out)).await;
        }
    }

    /// A collapsed follower: the leader's response, as it arrives.
    async fn send_followed(&mut self, head: &SharedHead, mut follower: Follower) -> Result<(), Failure> {
        // The leader's filter let it through; this request's may not.
        if let Some(why) = super::reply_acl::denied(&self.dest.reply, head.status, &head.headers) {
            super::reply_acl::refuse(&mut self.ex.out, self.sh, &self.ex.head, &why).await;
            return Ok(());
        }
        // The age of the response being fetched, as for a stored one: at least
        // the origin's Age plus the time it took (RFC 9111 4.2.3), never 0 then.
        let meta = StoredMeta {
            key: String::new(),
            variant: Vec::new(),
            status: head.status,
            headers: head.headers.clone(),
            request_time: head.request_time,
            response_time: head.response_time,
            origin: None,
            derived: Default::default(),
        };
        let now = SystemTime::now();
        let age = policy::age_header(&meta, now);
        let member = Member {
            fwd: self.fwd,
            fwd_status: Some(meta.status),
            ttl: ttl(self.cache, self.policy, &meta, now),
            ..Member::default()
        };
        let mut headers = meta.headers;
        // The leader's route may replay cookies (`set_cookie = "store"`); ours may not.
        self.policy.take_unshared(&mut headers);
        self.policy.strip_targeted(&mut headers);
        headers.insert(AGE, age);
        mark(self.cache, &mut headers, CacheStatus::Collapsed, member);
        let ex = &mut *self.ex;
        note_cache(ex, CacheStatus::Collapsed.outcome());
        let _send = crate::stats::stage(crate::stats::Stage::Send);
        let len = match head.length {
            Some(n) => BodyLen::Known(n),
            None => BodyLen::Unknown,
        };
        ex.out.send_head(head.status, headers, len);
        let mut sent = 0u64;
        loop {
            // Watched as it waits, as in `fetch_and_store`: gone, it no
            // longer holds the fetch (an origin gone quiet sends nothing
            // that would fail at the client).
            let Some(next) = unless_client_left(&mut ex.out, self.sh, follower.next()).await else {
                ex.out.close_after();
                return Ok(());
            };
            match next {
                Next::Data(d) => {
                    if ex.out.send_data(&d).await.is_err() {
                        ex.out.close_after();
                        return Ok(());
                    }
                    sent += d.len() as u64;
                }
                Next::End => break,
                Next::Failed => {
                    ex.out.close_after();
                    return Ok(());
                }
                // This client reads slower than the origin sends (or joined
                // late): it reads what the fetch has written to disk,
                // chasing the writer, and the rest from the stored object
                // once the fetch has stored it.
                Next::Behind => {
                    // Past a read error: only the fetch's end is waited for.
                    let mut from = sent;
                    let ending = loop {
                        let Some(step) = unless_client_left(&mut ex.out, self.sh, follower.on_disk(from)).await else {
                            ex.out.close_after();
                            return Ok(());
                        };
                        let (tap, written) = match step {
                            OnDisk::Ended(ending) => break ending,
                            OnDisk::Written(tap, written) => (tap, written),
                        };
                        let n = usize::try_from((written - sent).min(DISK_TAIL_PIECE)).unwrap_or(0);
                        let data = match tap.read(sent, n).await {
                            Ok(data) => data,
                            Err(e) => {
                                // A disk error: said, at most once a second.
                                static LOGGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                                if crate::util::log_due(&LOGGED) {
                                    tracing::warn!(
                                        key = self.key.text(),
                                        sent,
                                        "cannot read the file a fetch is writing, for a client behind it: {}; it gets \
                                         the rest once the fetch has stored it (logged at most once a second)",
                                        crate::util::io_cause(&e)
                                    );
                                }
                                from = u64::MAX;
                                continue;
                            }
                        };
                        if ex.out.send_bytes(data).await.is_err() {
                            ex.out.close_after();
                            return Ok(());
                        }
                        sent += n as u64;
                        from = sent;
                    };
                    let stored = match ending {
                        Ending::Complete => self.cache.lookup(&self.key, &ex.head.headers).await.ok().flatten(),
                        _ => None,
                    };
                    // The very response this client has the start of.
                    let Some(stored) = stored.filter(|s| {
                        crate::cache::object::same_millis(s.meta.response_time, head.response_time)
                            && s.meta.status == head.status
                            && head.length.is_none_or(|n| n == s.len)
                            && s.len >= sent
                    }) else {
                        tracing::debug!(
                            key = self.key.text(),
                            sent,
                            "collapsed client left behind; object not stored"
                        );
                        ex.out.close_after();
                        return Ok(());
                    };
                    if !send_range(ex, &stored, sent..stored.len).await {
                        return Ok(());
                    }
                    break;
                }
            }
        }
        if ex.out.finish(None).await.is_err() {
            ex.out.close_after();
        }
        Ok(())
    }

    /// stale-while-revalidate: one background revalidation; its result
    /// replaces or refreshes the stored response for the next requests.
    fn spawn_revalidation(&self, stored: &Stored) {
        // One background refresh per object at a time.
        let Role::Leader(leader) = self.cache.flights.join(self.key.id(), self.key.text()) else {
            return;
        };
        let head = plain_get(&self.ex.head);
        let background = Background {
            sh: self.sh.clone(),
            head,
            client: self.ex.peer.ip(),
            dest: self.dest.clone(),
            key: self.key.clone(),
            id: stored.id,
            meta: stored.meta.clone(),
        };
        tokio::spawn(background.revalidate(leader));
    }
}

/// Completes when the client has gone away while its request waits for
/// another's fetch (`ResponseWriter::client_gone`), unless
/// `origin.abort_on_close` is off: then never, as for a request waiting
/// for an origin connection (a client that half-closes its connection
/// after the request still reads the answer).
async fn client_left(out: &mut crate::http1::ResponseWriter<'_>, sh: &Shared) {
    if sh.config.origin.abort_on_close {
        out.client_gone(None::<std::future::Ready<()>>).await
    } else {
        std::future::pending().await
    }
}

/// `wait`, unless the client leaves first ([`client_left`]): then `None`.
/// A request collapsed onto another's fetch waits this way at every step,
/// so that one whose client is gone stops following (and no longer keeps
/// the fetch going, `cache.quick_abort`) without waiting for the origin's
/// next bytes. As the fill's writer does, the client is looked at only
/// once the wait has lasted [`ahead::WATCH_AFTER`]: a follower keeping up
/// with a busy fetch costs no look at its socket (a `poll` behind a
/// pipelined request, a record read over TLS) for every piece.
async fn unless_client_left<T>(
    out: &mut crate::http1::ResponseWriter<'_>,
    sh: &Shared,
    wait: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(wait);
    if let Ok(v) = tokio::time::timeout(ahead::WATCH_AFTER, &mut wait).await {
        return Some(v);
    }
    tokio::select! {
        biased;
        v = &mut wait => Some(v),
        () = client_left(out, sh) => None,
    }
}

/// The failure of a request whose client left while it waited for
/// another's fetch (nginx's 499; the access log says 0: nothing was sent).
fn left_while_waiting() -> Failure {
    (
        super::forward::client_gone(),
        "the client went away while its request waited for another's fetch".into(),
    )
}

/// Where a miss's fill sends the body to the request's own client.
enum ToClient<'a, 'w> {
    /// Each piece written before the next is read: the fetch goes at the
    /// client's pace. For a response that is not stored (nothing else waits
    /// on it, a 206 part kept in memory aside), and for one stored under
    /// `cache.read_ahead_gap = 0` (requests collapsed onto it follow at its
    /// client's pace).
    InStep(&'a mut crate::http1::ResponseWriter<'w>),
    /// Queued for the writer running beside the fill ([`ahead`]).
    Ahead(&'a ahead::Queue),
}

/// A miss's fill: the origin's body into the store, the collapsed
/// requests' spool, a kept 206 part, and to the client.
struct Fill<'c> {
    cache: &'c Cache,
    key: &'c CacheKey,
    /// `cache.quick_abort`, for a fetch its clients all left.
    config: &'c crate::config::CacheConfig,
    /// `upstream.idle_timeout`: an origin silent this long failed.
    idle: std::time::Duration,
    /// The announced body length.
    length: Option<u64>,
    sink: Option<StoreSink<'c>>,
    leader: Option<Leader>,
    part: Option<(NewPart, u64, bytes::BytesMut)>,
}

impl Fill<'_> {
    /// Reads `body` to its end (or until nobody wants it), then commits
    /// what it fed and ends the client's response (in step), or has its
    /// writer end it after what is queued (ahead).
    async fn run(mut self, mut body: crate::upstream::OriginBody, mut to: ToClient<'_, '_>) {
        let key = self.key.text();
        let mut client_ok = true;
        let mut received = 0u64;
        let mut trailers = None;
        let ending = 'fill: loop {
            let read = tokio::time::timeout(self.idle, body.frame());
            tokio::pin!(read);
            // The client, and then the last follower the fetch went on
            // for, may be seen gone while the origin is quiet: whether the
            // fetch goes on without them is decided then, not at the
            // origin's next piece.
            let read = loop {
                // In step, the client is seen gone only by a write.
                let (watch_client, watch_followers) = match &to {
                    _ if !client_ok => (false, self.leader.as_ref().is_some_and(Leader::followed)),
                    ToClient::Ahead(_) => (true, false),
                    ToClient::InStep(_) => (false, false),
                };
                if !watch_client && !watch_followers {
                    break read.await;
                }
                let client_left = async {
                    match &to {
                        ToClient::Ahead(queue) if watch_client => queue.left().await,
                        _ => std::future::pending().await,
                    }
                };
                let unfollowed = async {
                    match &self.leader {
                        Some(leader) if watch_followers => leader.unfollowed().await,
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    read = &mut read => break read,
                    () = client_left => client_ok = false,
                    () = unfollowed => {}
                }
                if self.give_up(received) {
                    break 'fill Ending::Failed;
                }
            };
            let frame = match read {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => break Ending::Complete,
                Ok(Some(Err(e))) => {
                    tracing::warn!(key, "{e}");
                    break Ending::Failed;
                }
                Err(_) => {
                    tracing::warn!(key, "origin response body stalled");
                    break Ending::Failed;
                }
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    trailers = frame.into_trailers().ok();
                    continue;
                }
            };
            // What the origin has sent already goes to the client in one write.
            let gathered = super::forward::gather(&mut body, data);
            for data in gathered.parts() {
                received += data.len() as u64;
                self.feed(data).await;
            }
            match &mut to {
                ToClient::InStep(out) => {
                    if client_ok && out.send_data_parts(gathered.parts()).await.is_err() {
                        client_ok = false;
                        out.close_after();
                    }
                }
                ToClient::Ahead(queue) => {
                    for data in gathered.parts() {
                        queue.push(data.clone()).await;
                    }
                    client_ok = queue.client_ok();
                }
            }
            if !client_ok && self.give_up(received) {
                break Ending::Failed;
            }
        };
        let complete = ending == Ending::Complete;
        if complete {
            if let Some(s) = self.sink.take() {
                s.commit().await;
                self.cache.stats.stored();
            }
            if let Some((p, len, buf)) = self.part.take()
                && buf.len() as u64 == len
            {
                keep_part(self.cache, self.key, p, buf.freeze()).await;
            }
        }
        drop(self.sink.take());
        if let Some(l) = self.leader.take() {
            l.finish(ending);
        }
        match to {
            ToClient::InStep(out) => {
                if !complete || (client_ok && out.finish(trailers.as_ref()).await.is_err()) {
                    out.close_after();
                }
            }
            ToClient::Ahead(queue) => queue.end(complete, trailers),
        }
    }

    /// With the client gone and no follower left, the fetch goes on only
    /// to be stored, and only if it is nearly done (`cache.quick_abort`):
    /// true when it stops. Stopping closes the flight to new followers in
    /// the same step as the check, so none joins a fetch about to stop.
    fn give_up(&self, received: u64) -> bool {
        let stop = !self.leader.as_ref().is_some_and(Leader::followed)
            && (self.sink.is_none() || !finish_abandoned(self.config, received, self.length))
            && self.leader.as_ref().is_none_or(Leader::close_if_unfollowed);
        if stop && self.sink.is_some() {
            tracing::debug!(
                key = self.key.text(),
                received,
                "fetch stopped: every client left (cache.quick_abort)"
            );
            self.cache
                .stats
                .fetches_abandoned
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        stop
    }

    /// Body bytes for everything but the client.
    async fn feed(&mut self, data: &bytes::Bytes) {
        self.cache.stats.fetched(data.len() as u64);
        if let Some((_, len, buf)) = self.part.as_mut() {
            buf.extend_from_slice(data);
            if buf.len() as u64 > *len {
                self.part = None;
            }
        }
        if let Some(s) = self.sink.as_mut()
            && !s.data(data).await
        {
            self.sink = None;
        }
        if let Some(l) = &mut self.leader {
            publish(l, self.sink.as_ref(), data);
        }
    }
}

/// Most body bytes a follower reading the fetch's file reads at once: the
/// disk writer's batch, what one of its writes adds to the file.
const DISK_TAIL_PIECE: u64 = crate::cache::disk::WRITE_FLUSH as u64;

/// Publishes body bytes to the fetch's followers: what the store has
/// written to disk first (a follower left behind, or joining late, reads
/// it there), then the bytes, which the spool keeps whole while the store
/// keeps the body in memory anyway.
fn publish(leader: &mut Leader, sink: Option<&StoreSink<'_>>, data: &bytes::Bytes) {
    match sink {
        Some(s) if s.writes_to_disk() => leader.on_disk(s.disk_written(), || s.disk_tap()),
        _ => leader.off_disk(),
    }
    if sink.is_some_and(StoreSink::keeps_in_memory) {
        leader.data_kept(data.clone());
    } else {
        leader.data(data.clone());
    }
}

/// Squid's quick-abort rule (`quick_abort_min`, `_max`, `_pct`): whether a
/// fetch being stored whose every client has left is finished for the cache,
/// `received` body bytes in, of `length` (the `Content-Length`, if any).
/// Finishing an abandoned 4 GB download costs the origin link and the disk
/// what no one asked for, and lets one client that hangs up at once make
/// Portico fetch any number of large objects in full; stopping one that is
/// nearly done wastes what was fetched. With an unknown length what is left
/// cannot be judged, so it is stopped, as Squid does.
fn finish_abandoned(cfg: &crate::config::CacheConfig, received: u64, length: Option<u64>) -> bool {
    if !cfg.quick_abort {
        return true;
    }
    let Some(length) = length else {
        return false;
    };
    let left = length.saturating_sub(received);
    if left <= cfg.quick_abort_min.0 {
        return true;
    }
    if left > cfg.quick_abort_max.0 {
        return false;
    }
    u128::from(received) * 100 >= u128::from(length) * u128::from(cfg.quick_abort_pct)
}

/// `head` as a plain GET, for a response the cache stores whole (a
/// background refresh, a slice): whatever the client asked for (HEAD, a
/// range, preconditions of its own), else a HEAD, 206 or 304 answer would
/// replace (remove) the stored response or answer the client's own question.
fn plain_get(head: &RequestHead) -> RequestHead {
    let mut head = head.clone();
    head.method = Method::GET;
    for name in [
        RANGE,
        IF_RANGE,
        IF_MATCH,
        IF_NONE_MATCH,
        IF_MODIFIED_SINCE,
        IF_UNMODIFIED_SINCE,
    ] {
        head.headers.remove(name);
    }
    head
}

/// A background revalidation (stale-while-revalidate): the transaction's
/// parts it needs, owned, as no client waits for it.
struct Background {
    sh: Arc<Shared>,
    /// The request as a plain GET (see `Transaction::spawn_revalidation`).
    head: RequestHead,
    client: std::net::IpAddr,
    dest: Dest,
    key: CacheKey,
    /// The stored response being revalidated.
    id: ObjectId,
    meta: Arc<StoredMeta>,
}

impl Background {
    /// Revalidates; `leader` holds the object's flight slot until the end.
    async fn revalidate(self, leader: Leader) {
        let _leader = leader;
        let Some(cache) = self.sh.cache.as_ref() else { return };
        cache.stats.revalidation();
        let policy = if self.dest.reverse {
            cache.reverse_policy_for(self.dest.cache_rule)
        } else {
            cache.policy_for(self.dest.cache_rule)
        };
        let conditional = policy::conditional_headers(&self.meta);
        let Ok((fetched, _)) =
            fetch_timed(&self.sh, &self.head, self.client, &self.dest, Some(&conditional), None).await
        else {
            return;
        };
        match policy::revalidation(&self.meta, fetched.response.status(), fetched.response.headers()) {
            Revalidation::NotModified => {
                // No client asked: the 304's cookies are nobody's.
                let fresh = fetched.response.into_parts().0.headers;
                update_from_304(cache, policy, self.id, &self.meta, fresh, fetched.times).await;
            }
            Revalidation::Replace => {
                let (head, mut body) = fetched.into_head(&self.sh, false);
                // A new version of a type the request's response entries
                // deny is not stored (and the old one goes: it is replaced).
                if super::reply_acl::denied(&self.dest.reply, head.status, &head.headers).is_some() {
                    cache.invalidate(&self.key).await;
                    return;
                }
                let Ok((mut sink, _)) = open_store(cache, policy, &self.key, &self.head, &head).await else {
                    cache.invalidate(&self.key).await;
                    return;
                };
                // `origin.idle_timeout` bounds the body's silences here as for
                // a client's response: a stalled refresh would otherwise hold
                // the object's refresh slot (its flight) for ever.
                let idle = self.sh.upstream.idle_timeout;
                loop {
                    let frame = match tokio::time::timeout(idle, body.frame()).await {
                        Ok(Some(Ok(frame))) => frame,
                        Ok(_) => break,
                        Err(_) => {
                            tracing::warn!(
                                key = self.key.text(),
                                "origin response body stalled (background revalidation)"
                            );
                            return;
                        }
                    };
                    if let Ok(data) = frame.into_data()
                        && !sink.data(&data).await
                    {
                        return;
                    }
                }
                if body.is_end_stream() {
                    sink.commit().await;
                    cache.stats.stored();
                }
            }
            Revalidation::Mismatch | Revalidation::ServerError => {}
        }
    }
}

/// Keeps a complete 206 body as a part; when the parts then make the
/// complete response (one strong validator, RFC 9111 3.4; the
/// cache-tests suite's `partial-store-partial-complete`), stores that
/// as a 200 in the tiers.
async fn keep_part(cache: &Cache, key: &CacheKey, mut part: NewPart, body: bytes::Bytes) {
    part.body = body;
    if let partial::Added::Complete(meta, whole) = cache.partials.add(key.id(), part) {
        let len = whole.len() as u64;
        if len > cache.max_object_size() {
            return;
        }
        let mut sink = cache.sink(key, *meta, &[], Some(len)).await;
        if sink.data(&whole).await {
            sink.commit().await;
            cache.stats.stored();
        }
    }
}

/// `stored` without the fields `policy` keeps from other clients than the
/// one a response was fetched for: a response stored while the settings
/// replayed them (`set_cookie = "store"` before a reload, or on another
/// rule's route to the same object) must not replay them now.
fn shareable(policy: &Policy, stored: Stored) -> Stored {
    if !policy.stored_has_unshared(&stored.meta) {
        return stored;
    }
    let mut meta = StoredMeta::clone(&stored.meta);
    policy.take_unshared(&mut meta.headers);
    Stored {
        meta: Arc::new(meta),
        ..stored
    }
}

/// Notes what the cache did, for the statistics and the access log (which
/// must have it even with statistics off).
fn note_cache(ex: &mut Exchange<'_>, outcome: crate::stats::CacheOutcome) {
    ex.cache_result = Some(outcome.name());
    crate::stats::note_cache(outcome);
}

impl Transaction<'_, '_> {
    /// Answers from a stored response (timed as the send stage, its body
    /// bytes counted as served from the cache).
    async fn send_stored(&mut self, stored: Stored, status: CacheStatus) -> Result<(), Failure> {
        // Checked on every use, not only when stored: an object stored before
        // a reload added a response entry, or for a client the entry does not
        // apply to, is refused to those it does apply to.
        if let Some(why) = super::reply_acl::denied(&self.dest.reply, stored.meta.status, &stored.meta.headers) {
            super::reply_acl::refuse(&mut self.ex.out, self.sh, &self.ex.head, &why).await;
            return Ok(());
        }
        note_cache(self.ex, status.outcome());
        let _send = crate::stats::stage(crate::stats::Stage::Send);
        let before = self.ex.out.body_bytes();
        let result = self.send_stored_now(stored, status).await;
        self.cache.stats.served(self.ex.out.body_bytes() - before);
        result
    }

    /// Answers from a stored response: preconditions (304/412), ranges
    /// (206/416), HEAD, with `Age` and the cache status header.
    async fn send_stored_now(&mut self, stored: Stored, status: CacheStatus) -> Result<(), Failure> {
        let (ex, cache, cache_policy) = (&mut *self.ex, self.cache, self.policy);
        let now = SystemTime::now();
        let age = policy::age_secs(&stored.meta, now);
        let owned = || {
            let mut headers = stored.meta.headers.clone();
            cache_policy.strip_targeted(&mut headers);
            headers.insert(AGE, HeaderValue::from(age));
            headers
        };
        let member = Member {
            fwd: self.fwd,
            fwd_status: match status {
                CacheStatus::Revalidated => Some(StatusCode::NOT_MODIFIED),
                CacheStatus::Miss | CacheStatus::Collapsed => Some(stored.meta.status),
                CacheStatus::StaleOnError(answered) => answered,
                CacheStatus::Hit | CacheStatus::Stale => None,
            },
            stored: status == CacheStatus::Miss,
            ttl: ttl(cache, self.policy, &stored.meta, now),
            ..Member::default()
        };
        let x_cache = |h: &mut HeaderMap| mark(cache, h, status, member);
        match policy::check_preconditions(&ex.head.method, &ex.head.headers, &stored.meta) {
            Precondition::NotModified => {
                let mut h = policy::not_modified_headers(&owned());
                h.insert(AGE, HeaderValue::from(age));
                x_cache(&mut h);
                ex.out.send_head(StatusCode::NOT_MODIFIED, h, BodyLen::Known(0));
                finish(ex).await;
                return Ok(());
            }
            Precondition::Failed => {
                return Err((
                    StatusCode::PRECONDITION_FAILED,
                    "a precondition of the request failed".into(),
                ));
            }
            Precondition::Proceed => {}
        }
        let len = stored.len;
        let code = stored.meta.status;
        let plan = range::plan(&ex.head.method, &ex.head.headers, code, &stored.meta.headers, len);
        let body = if matches!(plan, RangePlan::Full) && ex.out.takes_stored_head(code) {
            // The whole stored response, as it is stored: its fields are
            // the lines kept with it, with no copy of the map to edit.
            let [status_header, cache_status] = marks(cache, status, member);
            let extra = [status_header, cache_status];
            let tag = cache.lines_tag(cache_policy);
            let write = || {
                let status_name = cache.status_header.as_ref();
                let (lines, has_date, has_location) = crate::http1::stored_field_lines(&stored.meta.headers, |n| {
                    Some(n) == status_name || cache_policy.strips(n)
                });
                KeptLines {
                    tag,
                    lines,
                    has_date,
                    has_location,
                }
            };
            // Kept on the first hit; a hit under other settings (a reload, a
            // route's own policy) writes its own.
            let kept = stored.meta.derived.lines_or_init(write);
            let own;
            let lines = if kept.tag == tag {
                kept
            } else {
                own = write();
                &own
            };
            let fields = crate::http1::StoredLines {
                lines: &lines.lines,
                has_date: lines.has_date,
                locations: lines.has_location.then_some(&stored.meta.headers),
            };
            ex.out.send_stored_head(code, fields, age, extra.iter().flatten(), len);
            BodyPlan::One(0..len)
        } else {
            let mut headers = owned();
            x_cache(&mut headers);
            let seed = stored.id.0 as u64 ^ len;
            send_head_for_range(ex, plan, code, headers, len, cache, seed)
        };
        for (prefix, r) in body.parts() {
            if !prefix.is_empty() && ex.out.send_data(prefix).await.is_err() {
                ex.out.close_after();
                return Ok(());
            }
            if !send_range(ex, &stored, r).await {
                // Never the next part after a missing one.
                return Ok(());
            }
        }
        if ex.out.send_data(body.trailer()).await.is_err() {
            ex.out.close_after();
            return Ok(());
        }
        finish(ex).await;
        Ok(())
    }
}

/// What the body of an answer from the cache carries after its head
/// ([`send_head_for_range`]): the stored bytes of each part, after its
/// multipart delimiter, then the closing delimiter.
enum BodyPlan {
    /// No body (HEAD, 416).
    Nothing,
    /// These stored bytes (the whole response, or one range).
    One(std::ops::Range<u64>),
    /// `multipart/byteranges`.
    Multi(range::Multipart),
}

impl BodyPlan {
    /// Each part: the delimiter to write first (empty but for multipart), then
    /// the range of stored bytes.
    fn parts(&self) -> impl Iterator<Item = (&[u8], std::ops::Range<u64>)> {
        let (one, multi) = match self {
            BodyPlan::Nothing => (None, &[][..]),
            BodyPlan::One(r) => (Some((&[][..], r.clone())), &[][..]),
            BodyPlan::Multi(m) => (None, &m.parts[..]),
        };
        one.into_iter().chain(multi.iter().map(|(p, r)| (&p[..], r.clone())))
    }

    /// What follows the last part (multipart's closing delimiter).
    fn trailer(&self) -> &[u8] {
        match self {
            BodyPlan::Multi(m) => &m.trailer,
            _ => &[],
        }
    }
}

/// Sends the head of the answer to the request from a stored response of
/// `status`, `headers` (`Age` and the cache status header set) and `len`
/// body bytes, as its `Range` asks (RFC 9110 14.2; `plan`, worked out from
/// the request and `headers` by `range::plan`): the whole response,
/// one range or several (206), or 416 (with only `Content-Range`, the
/// `status_header` and `Cache-Status`). A HEAD gets the `Content-Length`
/// the GET would; `seed` makes the multipart boundary. Returns what the body must carry.
fn send_head_for_range(
    ex: &mut Exchange<'_>,
    plan: RangePlan,
    status: StatusCode,
    mut headers: HeaderMap,
    len: u64,
    cache: &Cache,
    seed: u64,
) -> BodyPlan {
    let head_only = ex.head.method == Method::HEAD;
    let (status, length, body) = match plan {
        RangePlan::Full => (status, len, BodyPlan::One(0..len)),
        RangePlan::Single(r) => {
            headers.insert(CONTENT_RANGE, header_value(&range::content_range(&r, len)));
            (StatusCode::PARTIAL_CONTENT, r.end - r.start, BodyPlan::One(r))
        }
        RangePlan::Multi(ranges) => {
            let part_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
            let mp = range::multipart(&ranges, len, part_type, &range::boundary(seed));
            headers.insert(CONTENT_TYPE, header_value(&mp.content_type));
            (StatusCode::PARTIAL_CONTENT, mp.content_length, BodyPlan::Multi(mp))
        }
        RangePlan::Unsatisfiable => {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_RANGE, header_value(&range::unsatisfied_range(len)));
            if let Some(name) = &cache.status_header
                && let Some(v) = headers.get(name)
            {
                h.insert(name.clone(), v.clone());
            }
            for v in headers.get_all(CACHE_STATUS) {
                h.append(CACHE_STATUS, v.clone());
            }
            ex.out
                .send_head(StatusCode::RANGE_NOT_SATISFIABLE, h, BodyLen::Known(0));
            return BodyPlan::Nothing;
        }
    };
    if head_only {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    }
    ex.out.send_head(status, headers, BodyLen::Known(length));
    if head_only { BodyPlan::Nothing } else { body }
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""))
}

async fn finish(ex: &mut Exchange<'_>) {
    if !ex.out.is_finished() && ex.out.finish(None).await.is_err() {
        ex.out.close_after();
    }
}

/// Writes `r` of the stored body (nothing for HEAD); false when the client
/// or the stored body failed (the connection is then closed after this).
async fn send_range(ex: &mut Exchange<'_>, stored: &Stored, r: std::ops::Range<u64>) -> bool {
    if ex.head.method == Method::HEAD || r.is_empty() {
        return true;
    }
    // A held, checksummed disk file to a plain-TCP client: `sendfile`.
    if let Some(file) = stored.body.sendable() {
        let len = r.end - r.start;
        match ex.out.send_file(file.file(), file.file_offset(r.start), len).await {
            Ok(true) => {
                file.count_sent(len);
                return true;
            }
            Ok(false) => {} // TLS: copied below
            Err(e) => {
                // A client that went away is not worth a word; a file
                // shorter than its envelope said is (and is removed).
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    let e = file.truncated();
                    tracing::warn!(key = stored.meta.key, "stored body unreadable: {e}");
                }
                ex.out.close_after();
                return false;
            }
        }
    }
    let mut chunks = stored.body.read(r);
    loop {
        match chunks.next().await {
            Some(Ok(data)) => {
                if ex.out.send_bytes(data).await.is_err() {
                    ex.out.close_after();
                    return false;
                }
            }
            Some(Err(e)) => {
                tracing::warn!(
                    key = stored.meta.key,
                    "stored body unreadable: {}",
                    crate::util::io_cause(&e)
                );
                ex.out.close_after();
                return false;
            }
            None => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::finish_abandoned;
    use crate::config::{CacheConfig, Size};

    fn cfg(min: u64, max: u64, pct: u8) -> CacheConfig {
        CacheConfig {
            quick_abort_min: Size(min),
            quick_abort_max: Size(max),
            quick_abort_pct: pct,
            ..Default::default()
        }
    }

    #[test]
    fn with_squids_defaults_a_left_fetch_is_finished_only_when_at_most_16_kib_remain() {
        let c = CacheConfig::default();
        assert!(finish_abandoned(&c, 1_000_000 - 16 * 1024, Some(1_000_000)));
        assert!(!finish_abandoned(&c, 1_000_000 - 16 * 1024 - 1, Some(1_000_000)));
        assert!(!finish_abandoned(&c, 0, Some(1 << 30)));
        assert!(finish_abandoned(&c, 0, Some(10_000)), "a small object is finished");
    }

    #[test]
    fn between_min_and_max_a_fetch_past_the_percentage_is_finished() {
        let c = cfg(1000, 1_000_000, 90);
        assert!(finish_abandoned(&c, 900_000, Some(1_000_000)));
        assert!(!finish_abandoned(&c, 899_999, Some(1_000_000)));
        assert!(!finish_abandoned(&c, 0, Some(2_000_000)), "more than max left");
    }

    #[test]
    fn an_unknown_length_is_stopped_and_quick_abort_off_finishes_everything() {
        assert!(!finish_abandoned(&CacheConfig::default(), 1 << 20, None));
        let off = CacheConfig {
            quick_abort: false,
            ..Default::default()
        };
        assert!(finish_abandoned(&off, 0, None));
        assert!(finish_abandoned(&off, 0, Some(u64::MAX)));
    }

    #[test]
    fn more_received_than_announced_is_nothing_left() {
        assert!(finish_abandoned(&CacheConfig::default(), 20, Some(10)));
    }
}
