//! The cache stage of the pipeline: look a GET/HEAD up, serve it fresh,
//! revalidate it, serve it stale when allowed, or fetch it once for all
//! concurrent requests (collapsing) and store it while it streams to the
//! client. Unsafe methods pass through and invalidate what they change.

use super::Shared;
use super::forward::{Dest, Failure, LocationRewrite, fetch, forward, response_headers};
use super::headers::strip_hop_by_hop;
use super::reply::{self, BusyPage};
use crate::acl::ReplyFilter;
use crate::cache::flight::{Ending, Next, Role, SharedHead};
use crate::cache::object::StoredMeta;
use crate::cache::policy::{self, Decision, Policy, Precondition, Revalidation};
use crate::cache::range::{self, RangePlan};
use crate::cache::{Cache, CacheKey, StoreSink, Stored};
use crate::http1::{BodyFraming, BodyLen, Exchange, RequestHead};
use http::header::{
    AGE, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE,
    IF_UNMODIFIED_SINCE, RANGE,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::SystemTime;

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
}

impl CacheStatus {
    fn outcome(self) -> crate::stats::CacheOutcome {
        match self {
            CacheStatus::Hit => crate::stats::CacheOutcome::Hit,
            CacheStatus::Miss => crate::stats::CacheOutcome::Miss,
            CacheStatus::Stale => crate::stats::CacheOutcome::Stale,
            CacheStatus::Revalidated => crate::stats::CacheOutcome::Revalidated,
        }
    }

    fn value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Stale => "STALE",
            CacheStatus::Revalidated => "REVALIDATED",
        })
    }
}

/// The cache key of a request going to `dest`: the public URL, and the
/// upstream group it is fetched from when that is not the URL's origin.
pub(super) fn key_for(cache: &Cache, sh: &Shared, dest: &Dest) -> CacheKey {
    let (scheme, authority, pq) = dest.public_url();
    let key = cache.key(scheme, authority, pq);
    match dest.fetched_from(sh) {
        Some(group) => key.in_upstream(group),
        None => key,
    }
}

/// Serves a request that may involve the cache. `busy` is the page sent
/// when the disk tier cannot take the lookup now (blocking pool queue full).
pub async fn serve(ex: &mut Exchange<'_>, sh: &Arc<Shared>, dest: Dest, busy: &BusyPage) -> Result<(), Failure> {
    let Some(cache) = sh
        .cache
        .as_ref()
        .filter(|c| c.is_running() && c.enabled_for(dest.cache_rule))
    else {
        return Box::pin(forward(ex, sh, &dest)).await;
    };
    let policy = cache.policy_for(dest.cache_rule);
    let key = key_for(cache, sh, &dest);
    let method = ex.head.method.clone();
    if (method != Method::GET && method != Method::HEAD) || ex.head.body != BodyFraming::Empty {
        let result = Box::pin(forward(ex, sh, &dest)).await;
        if let Some(status) = ex.out.status() {
            for k in policy.invalidations(&method, &key, status, ex.out.sent_headers()) {
                cache.invalidate(&k).await;
            }
        }
        return result;
    }
    cache.stats.lookup();
    let now = SystemTime::now();
    let lookup_stage = crate::stats::stage(crate::stats::Stage::CacheLookup);
    let found = cache.lookup(&key, &ex.head.headers).await;
    drop(lookup_stage);
    let Ok(found) = found else {
        tracing::debug!(client = %ex.peer.ip(), "{} {}: blocking pool queue full, busy 503", ex.head.method, ex.head.target);
        // A GET or HEAD without a body: the connection can stay open.
        ex.cache_result = Some(super::ACCESS_NONE);
        let _ = reply::busy(&mut ex.out, busy, None).await;
        return Ok(());
    };
    if let Some(stored) = found {
        let stored = shareable(policy, stored);
        match policy.evaluate(&ex.head.headers, &stored.meta, now) {
            Decision::Fresh => {
                cache.stats.hit();
                return send_stored(ex, sh, &dest.reply, cache, stored, CacheStatus::Hit).await;
            }
            Decision::Stale => {
                cache.stats.stale();
                return send_stored(ex, sh, &dest.reply, cache, stored, CacheStatus::Stale).await;
            }
            Decision::StaleWhileRevalidate => {
                cache.stats.stale();
                spawn_revalidation(sh, &ex.head, ex.peer.ip(), &dest, &key, &stored);
                return send_stored(ex, sh, &dest.reply, cache, stored, CacheStatus::Stale).await;
            }
            Decision::GatewayTimeout => {
                return Err((
                    StatusCode::GATEWAY_TIMEOUT,
                    "only-if-cached: the stored response is stale".into(),
                ));
            }
            Decision::Revalidate {
                stale_if_error_until, ..
            } => return Box::pin(revalidate(ex, sh, cache, &dest, &key, stored, stale_if_error_until)).await,
        }
    }
    cache.stats.miss();
    if policy::only_if_cached(&ex.head.headers) {
        return Err((StatusCode::GATEWAY_TIMEOUT, "only-if-cached: not in the cache".into()));
    }
    Box::pin(fetch_and_store(ex, sh, cache, &dest, &key)).await
}

/// Validates a stored response with the origin, then serves the stored
/// (updated) response, the new one, or the stale one when the origin fails.
async fn revalidate(
    ex: &mut Exchange<'_>,
    sh: &Arc<Shared>,
    cache: &Cache,
    dest: &Dest,
    key: &CacheKey,
    stored: Stored,
    stale_if_error_until: Option<SystemTime>,
) -> Result<(), Failure> {
    cache.stats.revalidation();
    let conditional = policy::conditional_headers(&stored.meta);
    let request_time = SystemTime::now();
    let stale_ok = |now: SystemTime| stale_if_error_until.is_some_and(|until| now <= until);
    let (response, rewrite) = match fetch(sh, &ex.head, ex.peer.ip(), dest, Some(&conditional)).await {
        Ok((response, rewrite, hierarchy)) => {
            ex.hierarchy = Some(hierarchy);
            (response, rewrite)
        }
        Err(failure) => {
            if stale_ok(SystemTime::now()) {
                cache.stats.stale();
                return send_stored(ex, sh, &dest.reply, cache, stored, CacheStatus::Stale).await;
            }
            return Err(failure);
        }
    };
    let response_time = SystemTime::now();
    let (parts, body) = response.into_parts();
    match policy::revalidation(&stored.meta, parts.status, &parts.headers) {
        Revalidation::NotModified => {
            let mut meta = StoredMeta::clone(&stored.meta);
            let mut fresh = parts.headers;
            strip_hop_by_hop(&mut fresh);
            // The 304's cookies are this client's: not merged into what
            // later clients get, but sent to this one.
            let own = cache.policy_for(dest.cache_rule).take_unshared(&mut fresh);
            policy::update_from_304(&mut meta, &fresh, request_time, response_time);
            let mut stored = cache.update(stored, meta).await;
            if !own.is_empty() {
                let mut meta = StoredMeta::clone(&stored.meta);
                for (name, value) in &own {
                    meta.headers.append(name, value.clone());
                }
                stored.meta = Arc::new(meta);
            }
            send_stored(ex, sh, &dest.reply, cache, stored, CacheStatus::Revalidated).await
        }
        Revalidation::ServerError if stale_ok(response_time) => {
            cache.stats.stale();
            send_stored(ex, sh, &dest.reply, cache, stored, CacheStatus::Stale).await
        }
        Revalidation::Mismatch => fetch_and_store(ex, sh, cache, dest, key).await,
        Revalidation::ServerError | Revalidation::Replace => {
            let response = http::Response::from_parts(parts, body);
            let policy = cache.policy_for(dest.cache_rule);
            store_and_send(
                ex,
                sh,
                dest,
                cache,
                policy,
                key,
                response,
                rewrite,
                request_time,
                response_time,
                None,
            )
            .await;
            Ok(())
        }
    }
}

/// A miss: join the fetch already under way for this key, or lead one.
/// When the fetch under way turns out to be another `Vary` variant, the
/// request joins (or leads) the fetch of its own variant instead, so
/// concurrent misses for one variant still make one origin request.
async fn fetch_and_store(
    ex: &mut Exchange<'_>,
    sh: &Arc<Shared>,
    cache: &Cache,
    dest: &Dest,
    key: &CacheKey,
) -> Result<(), Failure> {
    let mut flight = key.id();
    let mut leader = None;
    // The primary key's flight, then at most that of our variant, and a
    // rejoin after a leader that failed before its response head (so one
    // waiter retries and the others follow it, not all at once).
    for _ in 0..4 {
        let mut follower = match cache.flights.join(flight) {
            Role::Leader(l) => {
                leader = Some(l);
                break;
            }
            Role::Follower(f) => f,
        };
        match follower.head().await {
            Some(head) => {
                let variant = policy::variant_of(&head.vary, &ex.head.headers);
                if variant == head.variant {
                    cache.stats.collapsed();
                    let policy = cache.policy_for(dest.cache_rule);
                    return send_followed(ex, sh, &dest.reply, cache, policy, &head, follower).await;
                }
                let own = key.variant_id(&variant);
                if own == flight {
                    break; // not shareable after all: fetch for ourselves
                }
                flight = own;
            }
            None if follower.abandoned() => continue,
            None => {
                // The fetch ended without sharing its body with us (we
                // joined late, or it was not storable): it may be stored now.
                drop(follower);
                let policy = cache.policy_for(dest.cache_rule);
                if let Ok(Some(stored)) = cache.lookup(key, &ex.head.headers).await
                    && let stored = shareable(policy, stored)
                    && policy.evaluate(&ex.head.headers, &stored.meta, SystemTime::now()) == Decision::Fresh
                {
                    cache.stats.collapsed();
                    return send_stored(ex, sh, &dest.reply, cache, stored, CacheStatus::Hit).await;
                }
                break; // fetch for ourselves
            }
        }
    }
    let request_time = SystemTime::now();
    let (response, rewrite, hierarchy) = fetch(sh, &ex.head, ex.peer.ip(), dest, None).await?;
    ex.hierarchy = Some(hierarchy);
    let response_time = SystemTime::now();
    store_and_send(
        ex,
        sh,
        dest,
        cache,
        cache.policy_for(dest.cache_rule),
        key,
        response,
        rewrite,
        request_time,
        response_time,
        leader,
    )
    .await;
    Ok(())
}

/// Sends the origin's response to the client, storing it (and sharing it
/// with collapsed followers) when the policy allows.
#[allow(clippy::too_many_arguments)]
async fn store_and_send(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    dest: &Dest,
    cache: &Cache,
    policy: &Policy,
    key: &CacheKey,
    response: http::Response<hyper::body::Incoming>,
    rewrite: Option<LocationRewrite>,
    request_time: SystemTime,
    response_time: SystemTime,
    leader: Option<crate::cache::flight::Leader>,
) {
    // Before anything is stored or shared: a denied type is never stored,
    // and collapsed followers (other clients, other filters) fetch for
    // themselves.
    if let Some(why) = super::reply_acl::denied(&dest.reply, response.status(), response.headers()) {
        if let Some(l) = leader {
            l.finish(Ending::NotShared);
        }
        drop(response);
        super::reply_acl::refuse(&mut ex.out, sh, &ex.head, &why).await;
        return;
    }
    // Preparing the store (opening the disk writer) is part of sending a miss.
    note_cache(ex, crate::stats::CacheOutcome::Miss);
    let _send = crate::stats::stage(crate::stats::Stage::Send);
    let (parts, mut body) = response.into_parts();
    let mut headers = super::forward::response_headers_for(
        parts.headers,
        parts.status,
        parts.version,
        sh,
        rewrite.as_ref(),
        dest.relay_challenge,
    );
    let length = body.size_hint().exact();
    let storable = policy
        .storable(&ex.head.method, key, &ex.head.headers, parts.status, &headers)
        .and_then(|()| match length {
            Some(n) if n > cache.max_object_size() => Err(policy::NotStorable("larger than cache.max_object_size")),
            _ => Ok(()),
        });
    let mut sink: Option<StoreSink<'_>> = None;
    let mut leader = leader;
    match storable {
        Ok(()) => {
            let vary = policy::vary_fields(&headers).unwrap_or_default();
            let variant = policy::variant_of(&vary, &ex.head.headers);
            // This client gets the whole response; what is stored and
            // shared with collapsed requests (other clients) goes without
            // the fields meant for this one (`cache.set_cookie`).
            let mut shared = headers.clone();
            policy.take_unshared(&mut shared);
            let meta = StoredMeta {
                key: key.text().to_string(),
                variant: variant.clone(),
                status: parts.status,
                headers: shared.clone(),
                request_time,
                response_time,
            };
            sink = Some(cache.sink(key, meta, &vary, length).await);
            if let Some(l) = &leader {
                l.head(SharedHead {
                    status: parts.status,
                    headers: shared,
                    length,
                    vary,
                    variant,
                    request_time,
                    response_time,
                });
            }
        }
        Err(why) => {
            tracing::debug!(key = key.text(), "not stored: {why}");
            // Followers fetch for themselves.
            if let Some(l) = leader.take() {
                l.finish(Ending::NotShared);
            }
        }
    }
    if let Some(name) = &cache.status_header {
        headers.insert(name.clone(), CacheStatus::Miss.value());
    }
    let len = match length {
        Some(n) => BodyLen::Known(n),
        None => BodyLen::Unknown,
    };
    ex.out.send_head(parts.status, headers, len);
    let idle = sh.upstream.idle_timeout;
    let mut client_ok = true;
    let mut trailers = None;
    let ending = loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break Ending::Complete,
            Ok(Some(Err(e))) => {
                tracing::debug!(key = key.text(), "origin response body failed: {e}");
                tracing::warn!(key = key.text(), "{}", crate::upstream::origin_cause(&e, true));
                break Ending::Failed;
            }
            Err(_) => {
                tracing::warn!(key = key.text(), "origin response body stalled");
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
        cache.stats.fetched(data.len() as u64);
        if let Some(s) = sink.as_mut()
            && !s.data(&data).await
        {
            sink = None;
        }
        if let Some(l) = &leader {
            l.data(data.clone());
        }
        if client_ok && ex.out.send_data(&data).await.is_err() {
            client_ok = false;
            ex.out.close_after();
        }
        // Without a store or followers to finish for, a gone client ends it.
        if !client_ok && sink.is_none() && leader.is_none() {
            break Ending::Failed;
        }
    };
    match ending {
        Ending::Complete => {
            if let Some(s) = sink {
                s.commit().await;
                cache.stats.stored();
            }
            if let Some(l) = leader {
                l.finish(Ending::Complete);
            }
            if client_ok && ex.out.finish(trailers.as_ref()).await.is_err() {
                ex.out.close_after();
            }
        }
        _ => {
            drop(sink);
            if let Some(l) = leader {
                l.finish(Ending::Failed);
            }
            ex.out.close_after();
        }
    }
}

/// A collapsed follower: the leader's response, as it arrives.
#[allow(clippy::too_many_arguments)]
async fn send_followed(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    reply: &ReplyFilter,
    cache: &Cache,
    policy: &Policy,
    head: &SharedHead,
    mut follower: crate::cache::flight::Follower,
) -> Result<(), Failure> {
    // The leader's filter let it through; this request's may not.
    if let Some(why) = super::reply_acl::denied(reply, head.status, &head.headers) {
        super::reply_acl::refuse(&mut ex.out, sh, &ex.head, &why).await;
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
    };
    let age = policy::age_header(&meta, SystemTime::now());
    let mut headers = meta.headers;
    // The leader's route may replay cookies (`set_cookie = "store"`); ours may not.
    policy.take_unshared(&mut headers);
    headers.insert(AGE, age);
    if let Some(name) = &cache.status_header {
        headers.insert(name.clone(), CacheStatus::Hit.value());
    }
    note_cache(ex, crate::stats::CacheOutcome::Hit);
    let _send = crate::stats::stage(crate::stats::Stage::Send);
    let len = match head.length {
        Some(n) => BodyLen::Known(n),
        None => BodyLen::Unknown,
    };
    ex.out.send_head(head.status, headers, len);
    loop {
        match follower.next().await {
            Next::Data(d) => {
                if ex.out.send_data(&d).await.is_err() {
                    ex.out.close_after();
                    return Ok(());
                }
            }
            Next::End => break,
            Next::Failed => {
                ex.out.close_after();
                return Ok(());
            }
        }
    }
    if ex.out.finish(None).await.is_err() {
        ex.out.close_after();
    }
    Ok(())
}

/// `stored` without the fields `policy` keeps from other clients than the
/// one a response was fetched for: a response stored while the settings
/// replayed them (`set_cookie = "store"` before a reload, or on another
/// rule's route to the same object) must not replay them now.
fn shareable(policy: &Policy, stored: Stored) -> Stored {
    if !policy.has_unshared(&stored.meta.headers) {
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

/// Answers from a stored response (timed as the send stage, its body
/// bytes counted as served from the cache).
async fn send_stored(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    reply: &ReplyFilter,
    cache: &Cache,
    stored: Stored,
    status: CacheStatus,
) -> Result<(), Failure> {
    // Checked on every use, not only when stored: an object stored before
    // a reload added a response entry, or for a client the entry does not
    // apply to, is refused to those it does apply to.
    if let Some(why) = super::reply_acl::denied(reply, stored.meta.status, &stored.meta.headers) {
        super::reply_acl::refuse(&mut ex.out, sh, &ex.head, &why).await;
        return Ok(());
    }
    note_cache(ex, status.outcome());
    let _send = crate::stats::stage(crate::stats::Stage::Send);
    let before = ex.out.body_bytes();
    let result = send_stored_now(ex, cache, stored, status).await;
    cache.stats.served(ex.out.body_bytes() - before);
    result
}

/// Answers from a stored response: preconditions (304/412), ranges
/// (206/416), HEAD, with `Age` and the cache status header.
async fn send_stored_now(
    ex: &mut Exchange<'_>,
    cache: &Cache,
    stored: Stored,
    status: CacheStatus,
) -> Result<(), Failure> {
    let now = SystemTime::now();
    let mut headers = stored.meta.headers.clone();
    headers.insert(AGE, policy::age_header(&stored.meta, now));
    let x_cache = |h: &mut HeaderMap| {
        if let Some(name) = &cache.status_header {
            h.insert(name.clone(), status.value());
        }
    };
    match policy::check_preconditions(&ex.head.method, &ex.head.headers, &stored.meta) {
        Precondition::NotModified => {
            let mut h = policy::not_modified_headers(&headers);
            h.insert(AGE, policy::age_header(&stored.meta, now));
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
    x_cache(&mut headers);
    let len = stored.len;
    match range::plan(
        &ex.head.method,
        &ex.head.headers,
        stored.meta.status,
        &stored.meta.headers,
        len,
    ) {
        RangePlan::Full => {
            if ex.head.method == Method::HEAD {
                headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
            }
            ex.out.send_head(stored.meta.status, headers, BodyLen::Known(len));
            send_range(ex, &stored, 0..len).await;
        }
        RangePlan::Single(r) => {
            headers.insert(CONTENT_RANGE, header_value(&range::content_range(&r, len)));
            if ex.head.method == Method::HEAD {
                headers.insert(CONTENT_LENGTH, HeaderValue::from(r.end - r.start));
            }
            ex.out
                .send_head(StatusCode::PARTIAL_CONTENT, headers, BodyLen::Known(r.end - r.start));
            send_range(ex, &stored, r).await;
        }
        RangePlan::Multi(ranges) => {
            let part_type = headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let boundary = range::boundary(stored.id.0 as u64 ^ len);
            let mp = range::multipart(&ranges, len, part_type.as_deref(), &boundary);
            headers.insert(CONTENT_TYPE, header_value(&mp.content_type));
            if ex.head.method == Method::HEAD {
                headers.insert(CONTENT_LENGTH, HeaderValue::from(mp.content_length));
            }
            ex.out
                .send_head(StatusCode::PARTIAL_CONTENT, headers, BodyLen::Known(mp.content_length));
            if ex.head.method != Method::HEAD {
                for (prefix, r) in &mp.parts {
                    if ex.out.send_data(prefix).await.is_err() {
                        ex.out.close_after();
                        return Ok(());
                    }
                    if !send_range(ex, &stored, r.clone()).await {
                        // Never the next part after a missing one.
                        return Ok(());
                    }
                }
                if ex.out.send_data(&mp.trailer).await.is_err() {
                    ex.out.close_after();
                    return Ok(());
                }
            }
        }
        RangePlan::Unsatisfiable => {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_RANGE, header_value(&range::unsatisfied_range(len)));
            x_cache(&mut h);
            ex.out
                .send_head(StatusCode::RANGE_NOT_SATISFIABLE, h, BodyLen::Known(0));
        }
    }
    finish(ex).await;
    Ok(())
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
    let mut chunks = stored.body.read(r);
    loop {
        match chunks.next().await {
            Some(Ok(data)) => {
                if ex.out.send_data(&data).await.is_err() {
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

/// stale-while-revalidate: one background revalidation; its result
/// replaces or refreshes the stored response for the next requests.
fn spawn_revalidation(
    sh: &Arc<Shared>,
    head: &RequestHead,
    client: std::net::IpAddr,
    dest: &Dest,
    key: &CacheKey,
    stored: &Stored,
) {
    let Some(cache) = sh.cache.as_ref() else { return };
    // One background refresh per object at a time.
    let Role::Leader(leader) = cache.flights.join(key.id()) else {
        return;
    };
    // The refresh is for the stored GET response: a plain GET, whatever
    // this client asked for (HEAD, a range, preconditions of its own),
    // else a HEAD or 206 answer would replace (remove) the stored response.
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
    let (sh, dest, key, meta, id) = (
        sh.clone(),
        dest.clone(),
        key.clone(),
        StoredMeta::clone(&stored.meta),
        stored.id,
    );
    tokio::spawn(async move {
        let _leader = leader;
        let Some(cache) = sh.cache.as_ref() else { return };
        cache.stats.revalidation();
        let conditional = policy::conditional_headers(&meta);
        let request_time = SystemTime::now();
        let Ok((response, rewrite, _)) = fetch(&sh, &head, client, &dest, Some(&conditional)).await else {
            return;
        };
        let response_time = SystemTime::now();
        let (parts, mut body) = response.into_parts();
        match policy::revalidation(&meta, parts.status, &parts.headers) {
            Revalidation::NotModified => {
                let mut meta = meta;
                let mut fresh = parts.headers;
                strip_hop_by_hop(&mut fresh);
                // No client asked: the 304's cookies are nobody's.
                cache.policy_for(dest.cache_rule).take_unshared(&mut fresh);
                policy::update_from_304(&mut meta, &fresh, request_time, response_time);
                cache.update_meta(id, Arc::new(meta)).await;
            }
            Revalidation::Replace => {
                let mut headers = response_headers(parts.headers, parts.version, &sh, rewrite.as_ref());
                let policy = cache.policy_for(dest.cache_rule);
                // A new version of a type the request's response entries
                // deny is not stored (and the old one goes: it is replaced).
                if policy
                    .storable(&head.method, &key, &head.headers, parts.status, &headers)
                    .is_err()
                    || super::reply_acl::denied(&dest.reply, parts.status, &headers).is_some()
                {
                    cache.invalidate(&key).await;
                    return;
                }
                policy.take_unshared(&mut headers);
                let vary = policy::vary_fields(&headers).unwrap_or_default();
                let meta = StoredMeta {
                    key: key.text().to_string(),
                    variant: policy::variant_of(&vary, &head.headers),
                    status: parts.status,
                    headers,
                    request_time,
                    response_time,
                };
                let mut sink = cache.sink(&key, meta, &vary, body.size_hint().exact()).await;
                while let Some(Ok(frame)) = body.frame().await {
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
    });
}
