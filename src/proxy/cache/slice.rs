//! Objects cached in fixed-size slices (`cache.slice`), as nginx's slice
//! module caches them: each slice is fetched from the origin with a `Range`
//! of its own, stored as an object of its own (both tiers, evicted on its
//! own), answered from by every request that touches it, and revalidated
//! on its own (its `Range` and validators) once stale. A Range request for
//! the middle of a multi-gigabyte file costs the origin the one slice
//! holding it, and a video player's seek is a hit once that slice is
//! stored; a request for the whole object is sent slice after slice.
//!
//! The slices of one object must be one representation: each slice used
//! after the first must have the first's complete length, `ETag` and
//! `Last-Modified`. When one does not (the object changed at the origin
//! between two slices), the response already begun cannot be completed
//! honestly: the connection is closed before its announced length, and every
//! slice of the object is invalidated so the next request starts afresh
//! (nginx's module ends the response the same way).
//!
//! An origin that does not answer a slice's `Range` with that range (a
//! 200: it does not do ranges; an error) is answered as without slicing:
//! its response is relayed, and a complete 200 stored whole, which later
//! requests find before they look for slices.

use super::{
    CacheStatus, Fetched, Transaction, fetch_timed, finish, header_value, left_while_waiting, mark, note_cache,
    plain_get, send_head_for_range, send_range, ttl, unless_client_left, update_from_304,
};
use crate::cache::Stored;
use crate::cache::flight::{Ending, Follower, Leader, Next, OnDisk, Role, SharedHead};
use crate::cache::object::StoredMeta;
use crate::cache::partial::{self, parse_content_range};
use crate::cache::policy::{self, Decision, Precondition, Revalidation};
use crate::cache::range;
use crate::cache::{StoreSink, slice_variant};
use crate::http1::BodyLen;
use crate::proxy::forward::Failure;
use bytes::Bytes;
use http::header::{AGE, CONTENT_RANGE, ETAG, LAST_MODIFIED, RANGE, VARY};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

/// Where one slice's bytes come from.
enum Source<'c> {
    /// Stored and fresh: a hit.
    Stored(Stored),
    /// Fetched by this request: stored as it arrives and shared with the
    /// requests collapsed onto it.
    Fetch(Box<Fetch<'c>>),
    /// Being fetched by another request, followed as it arrives.
    Follow(Follower),
}

/// A slice this request is fetching.
struct Fetch<'c> {
    /// `cache.slice`, for the slice marker.
    size: u64,
    body: crate::upstream::OriginBody,
    sink: Option<StoreSink<'c>>,
    leader: Option<Leader>,
}

/// See [`Slice::identity`].
type Identity = (u64, Option<Vec<u8>>, Option<Vec<u8>>);

/// One slice of the object.
struct Slice<'c> {
    /// Its bytes in the object (end exclusive).
    range: Range<u64>,
    /// The object's complete length.
    complete: u64,
    /// Its response as stored: status 206, with its `Content-Range`.
    meta: Arc<StoredMeta>,
    /// Answered from the cache (`Hit`), after a 304 (`Revalidated`), or
    /// by the origin (`Miss`).
    how: CacheStatus,
    source: Source<'c>,
}

/// What asking for a slice gave.
enum Got<'c> {
    /// The slice.
    Slice(Slice<'c>),
    /// The origin answered the slice's request with something else.
    Other(Fetched),
}

impl Slice<'_> {
    /// The complete response's metadata as the first slice says it: status
    /// 200, the slice's own `Content-Range` and `Content-Length` removed.
    fn whole_meta(&self) -> StoredMeta {
        StoredMeta {
            key: self.meta.key.clone(),
            variant: Vec::new(),
            status: StatusCode::OK,
            headers: partial::whole_headers(self.meta.headers.clone()),
            request_time: self.meta.request_time,
            response_time: self.meta.response_time,
            origin: self.meta.origin,
            derived: Default::default(),
        }
    }

    /// What every slice of one representation shares (see the module's
    /// documentation): the complete length, `ETag` and `Last-Modified`.
    fn identity(&self) -> Identity {
        let field = |name| self.meta.headers.get(name).map(|v: &HeaderValue| v.as_bytes().to_vec());
        (self.complete, field(ETAG), field(LAST_MODIFIED))
    }
}

/// The bytes a slice's response holds and the complete length, from its
/// `Content-Range`, when that is exactly the slice that starts at `start`:
/// `size` bytes, cut at a known complete length. A stored slice of another
/// size (`cache.slice` changed since) is none.
fn span(headers: &HeaderMap, start: u64, size: u64) -> Option<(Range<u64>, u64)> {
    let cr = parse_content_range(headers.get(CONTENT_RANGE)?.as_bytes())?;
    let complete = cr.complete?;
    (cr.range == (start..start.saturating_add(size).min(complete))).then_some((cr.range, complete))
}

/// [`span`] of an origin's answer to a slice's request: a 206 for that
/// slice whose body is announced at its length.
fn answers(fetched: &Fetched, start: u64, size: u64) -> Option<(Range<u64>, u64)> {
    let response = &fetched.response;
    if response.status() != StatusCode::PARTIAL_CONTENT {
        return None;
    }
    let (range, complete) = span(response.headers(), start, size)?;
    (response.body().size_hint().exact() == Some(range.end - range.start)).then_some((range, complete))
}

impl<'c> Transaction<'c, '_> {
    /// A GET or HEAD for an object nothing complete is stored for, on a
    /// route with `cache.slice`: answered slice by slice (see the module's
    /// documentation).
    pub(super) async fn sliced(&mut self, size: u64) -> Result<(), Failure> {
        // The slice holding the first byte asked for; the object's first
        // (which also says its length) when that is not known yet.
        let first_byte = self
            .ex
            .head
            .headers
            .get(RANGE)
            .and_then(|v| range::first_byte(v.as_bytes()));
        let start = first_byte.unwrap_or(0) / size * size;
        let first = match self.slice(start, size).await? {
            Got::Slice(s) => s,
            Got::Other(fetched) => return self.not_sliced(fetched, start).await,
        };
        let status = first.how;
        let hit = status != CacheStatus::Miss;
        // A revalidation is counted as one when it is sent (`fetch_slice`),
        // as for a whole response.
        match status {
            CacheStatus::Miss => self.cache.stats.miss(),
            CacheStatus::Hit => self.cache.stats.hit(),
            CacheStatus::Revalidated | CacheStatus::Stale | CacheStatus::StaleOnError(_) | CacheStatus::Collapsed => {}
        }
        let whole = first.whole_meta();
        if let Some(why) = super::super::reply_acl::denied(&self.dest.reply, whole.status, &whole.headers) {
            self.drain(first).await;
            super::super::reply_acl::refuse(&mut self.ex.out, self.sh, &self.ex.head, &why).await;
            return Ok(());
        }
        note_cache(self.ex, status.outcome());
        let _send = crate::stats::stage(crate::stats::Stage::Send);
        let now = SystemTime::now();
        let mut headers = whole.headers.clone();
        if !matches!(first.source, Source::Fetch(_)) {
            self.policy.take_unshared(&mut headers);
        }
        self.policy.strip_targeted(&mut headers);
        headers.insert(AGE, policy::age_header(&whole, now));
        let member = crate::cache::status::Member {
            fwd: self.fwd,
            fwd_status: (status == CacheStatus::Miss).then_some(whole.status),
            stored: status == CacheStatus::Miss,
            ttl: ttl(self.cache, self.policy, &whole, now),
            ..crate::cache::status::Member::default()
        };
        mark(self.cache, &mut headers, status, member);
        let method = self.ex.head.method.clone();
        match policy::check_preconditions(&method, &self.ex.head.headers, &whole) {
            Precondition::NotModified => {
                self.drain(first).await;
                let h = policy::not_modified_headers(&headers);
                self.ex.out.send_head(StatusCode::NOT_MODIFIED, h, BodyLen::Known(0));
                finish(self.ex).await;
                return Ok(());
            }
            Precondition::Failed => {
                self.drain(first).await;
                return Err((
                    StatusCode::PRECONDITION_FAILED,
                    "a precondition of the request failed".into(),
                ));
            }
            Precondition::Proceed => {}
        }
        let complete = first.complete;
        let seed = self.key.id().0 as u64 ^ complete;
        let plan = range::plan(
            &self.ex.head.method,
            &self.ex.head.headers,
            StatusCode::OK,
            &headers,
            complete,
        );
        let body = send_head_for_range(self.ex, plan, StatusCode::OK, headers, complete, self.cache, seed);
        // Every slice sent must be of the representation whose head was sent.
        let identity = first.identity();
        let mut pending = Some(first);
        let before = self.ex.out.body_bytes();
        let mut intact = true;
        for (prefix, r) in body.parts() {
            // Never the next part after one cut short.
            intact = (prefix.is_empty() || self.ex.out.send_data(prefix).await.is_ok())
                && self.send_slices(r, size, &mut pending, &identity).await;
            if !intact {
                break;
            }
        }
        if intact {
            intact = self.ex.out.send_data(body.trailer()).await.is_ok();
        }
        // The first slice, when no part wanted its bytes: stored all the same.
        if let Some(first) = pending {
            self.drain(first).await;
        }
        if hit {
            self.cache.stats.served(self.ex.out.body_bytes() - before);
        }
        if intact {
            finish(self.ex).await;
        } else {
            // Short of its announced length: the client must see it end.
            self.ex.out.close_after();
        }
        Ok(())
    }

    /// The origin answered the first slice's request with something other
    /// than that slice: a 200 (it does not do ranges) or an error is relayed
    /// as it is (and stored when the policy allows, whole); a 416 for the
    /// first slice of all says the object is empty (no range of it exists):
    /// the client's own request is fetched instead. A 206 of another range
    /// is not what anyone asked for.
    async fn not_sliced(&mut self, fetched: Fetched, start: u64) -> Result<(), Failure> {
        let status = fetched.response.status();
        if status == StatusCode::PARTIAL_CONTENT {
            drop(fetched);
            return Err((
                StatusCode::BAD_GATEWAY,
                "the origin answered a slice's Range with another range".into(),
            ));
        }
        self.cache.stats.miss();
        if status == StatusCode::RANGE_NOT_SATISFIABLE && start == 0 {
            drop(fetched);
            let fetched = self.fetch(None).await?;
            self.store_and_send(fetched, None).await;
            return Ok(());
        }
        self.store_and_send(fetched, None).await;
        Ok(())
    }

    /// Sends the bytes `r` of the object, slice after slice; `pending` is
    /// the first slice (used when `r` needs it, and taken then), `first` the
    /// identity of the first slice, whose head was sent: every slice sent
    /// must match it. False when the response cannot go on (client gone, a
    /// slice failed or was of another representation).
    async fn send_slices(
        &mut self,
        r: Range<u64>,
        size: u64,
        pending: &mut Option<Slice<'c>>,
        first: &Identity,
    ) -> bool {
        let mut at = r.start;
        while at < r.end {
            let start = at / size * size;
            let slice = match pending.take_if(|s| s.range.start == start) {
                Some(s) => s,
                None => {
                    // The first slice is not this one: read it (and store it)
                    // now, rather than leave its origin connection waiting
                    // while others are fetched; if a later part wants it, it
                    // is stored by then.
                    if let Some(first) = pending.take() {
                        self.drain(first).await;
                    }
                    match self.slice(start, size).await {
                        Ok(Got::Slice(s)) => s,
                        // Nobody to cut short: the client left while it waited.
                        Err((status, _)) if crate::proxy::forward::is_client_gone(status) => return false,
                        Ok(Got::Other(_)) | Err(_) => {
                            tracing::warn!(key = self.key.text(), start, "slice unavailable: response cut short");
                            return false;
                        }
                    }
                }
            };
            if slice.identity() != *first {
                tracing::warn!(
                    key = self.key.text(),
                    start,
                    "slices of different representations (the object changed at the origin): \
                     response cut short, object invalidated"
                );
                self.drain(slice).await;
                self.cache.invalidate(&self.key).await;
                return false;
            }
            let end = r.end.min(slice.range.end);
            if end <= at {
                return false; // cannot be: the complete length matched
            }
            let local = (at - start)..(end - start);
            if !self.pump(slice, Some(local)).await {
                return false;
            }
            at = end;
        }
        true
    }

    /// Reads a slice whole (storing it) without sending any of it.
    async fn drain(&mut self, slice: Slice<'c>) {
        if matches!(slice.source, Source::Fetch(_)) {
            self.pump(slice, None).await;
        }
    }

    /// Sends the bytes `local` (offsets in the slice) of `slice` to the
    /// client; a slice being fetched is read whole and stored whatever the
    /// client takes. False when the client or the slice failed.
    async fn pump(&mut self, slice: Slice<'c>, local: Option<Range<u64>>) -> bool {
        let len = slice.range.end - slice.range.start;
        let key = self.key.text();
        match slice.source {
            Source::Stored(stored) => match local {
                Some(l) => send_range(self.ex, &stored, l).await,
                None => true,
            },
            Source::Follow(mut follower) => {
                let mut pos = 0u64;
                loop {
                    // The client is watched while it waits, as for a whole
                    // object (`unless_client_left`).
                    let Some(next) = unless_client_left(&mut self.ex.out, self.sh, follower.next()).await else {
                        return false;
                    };
                    match next {
                        Next::Data(d) => {
                            let n = d.len() as u64;
                            if let Some(l) = &local
                                && !send_within(self.ex, &d, pos, l).await
                            {
                                return false;
                            }
                            pos += n;
                        }
                        Next::End => return pos == len,
                        Next::Failed => return false,
                        // What the fetch that left this client behind has
                        // written to disk, then the rest from the stored
                        // slice once it is stored.
                        Next::Behind => {
                            // Only what the client's range wants is read:
                            // from its start, and past its end nothing.
                            if let Some(l) = &local {
                                pos = pos.max(l.start.min(len));
                            }
                            let wanted = |pos: u64| local.as_ref().is_some_and(|l| pos < l.end);
                            let mut from = if wanted(pos) { pos } else { u64::MAX };
                            let ending = loop {
                                let step = unless_client_left(&mut self.ex.out, self.sh, follower.on_disk(from)).await;
                                let (tap, written) = match step {
                                    None => return false,
                                    Some(OnDisk::Ended(ending)) => break ending,
                                    Some(OnDisk::Written(tap, written)) => (tap, written),
                                };
                                let n = usize::try_from((written - pos).min(super::DISK_TAIL_PIECE)).unwrap_or(0);
                                let Ok(d) = tap.read(pos, n).await else {
                                    from = u64::MAX; // only the end, now
                                    continue;
                                };
                                if let Some(l) = &local
                                    && !send_within(self.ex, &d, pos, l).await
                                {
                                    return false;
                                }
                                pos += n as u64;
                                from = if wanted(pos) { pos } else { u64::MAX };
                            };
                            if ending != Ending::Complete {
                                return false;
                            }
                            drop(follower);
                            let Ok(Some(stored)) = self.cache.lookup_slice(&self.key, slice.range.start).await else {
                                return false;
                            };
                            if stored.len != len
                                || !crate::cache::object::same_millis(
                                    stored.meta.response_time,
                                    slice.meta.response_time,
                                )
                            {
                                return false;
                            }
                            return match &local {
                                Some(l) => send_range(self.ex, &stored, l.start.max(pos)..l.end.max(pos)).await,
                                None => true,
                            };
                        }
                    }
                }
            }
            Source::Fetch(fetch) => {
                let Fetch {
                    size,
                    mut body,
                    mut sink,
                    mut leader,
                } = *fetch;
                let idle = self.sh.upstream.idle_timeout;
                let mut client_ok = local.is_some();
                let mut pos = 0u64;
                let complete = loop {
                    let frame = match tokio::time::timeout(idle, body.frame()).await {
                        Ok(Some(Ok(frame))) => frame,
                        Ok(None) => break pos == len,
                        Ok(Some(Err(e))) => {
                            tracing::warn!(key, "{e}");
                            break false;
                        }
                        Err(_) => {
                            tracing::warn!(key, "origin response body stalled (slice)");
                            break false;
                        }
                    };
                    let Ok(data) = frame.into_data() else { continue };
                    self.cache.stats.fetched(data.len() as u64);
                    if let Some(s) = sink.as_mut()
                        && !s.data(&data).await
                    {
                        sink = None;
                    }
                    if let Some(l) = &mut leader {
                        super::publish(l, sink.as_ref(), &data);
                    }
                    if client_ok
                        && let Some(l) = &local
                        && !send_within(self.ex, &data, pos, l).await
                    {
                        client_ok = false;
                    }
                    pos += data.len() as u64;
                    if !client_ok && sink.is_none() && leader.is_none() {
                        break false;
                    }
                };
                if complete {
                    if let Some(s) = sink {
                        self.cache.mark_sliced(&self.key, size, slice.complete).await;
                        s.commit().await;
                        self.cache.stats.stored();
                    }
                    if let Some(l) = leader {
                        l.finish(Ending::Complete);
                    }
                } else if let Some(l) = leader {
                    l.finish(Ending::Failed);
                }
                complete && (client_ok || local.is_none())
            }
        }
    }

    /// The slice that starts at byte `start`: stored and fresh, being
    /// fetched by another request (followed), or fetched now (with the
    /// validators of a stale stored one: a 304 makes it fresh again).
    async fn slice(&mut self, start: u64, size: u64) -> Result<Got<'c>, Failure> {
        let variant = slice_variant(start);
        let id = self.key.variant_id(&variant);
        // A rejoin after a fetch that shared nothing with us; bounded as
        // `fetch_and_store`'s.
        for _ in 0..4 {
            let stale = match self.stored_slice(start, size).await? {
                Some((slice, true)) => return Ok(Got::Slice(slice)),
                Some((slice, false)) => Some(slice),
                None => None,
            };
            let mut follower = match self.cache.flights.join(id, self.key.text()) {
                Role::Leader(l) => return self.fetch_slice(start, size, Some(l), stale).await,
                Role::Follower(f) => f,
            };
            let Some(head) = unless_client_left(&mut self.ex.out, self.sh, follower.head())
                .await
                .ok_or_else(left_while_waiting)?
            else {
                continue;
            };
            if !self.may_serve_from(head.origin) {
                // From where this request may not go: fetched anew.
                drop(follower);
                return self.fetch_slice(start, size, None, None).await;
            }
            if let Some(slice) = followed(&head, self.key.text(), start, size, follower) {
                self.cache.stats.collapsed();
                return Ok(Got::Slice(slice));
            }
        }
        self.fetch_slice(start, size, None, None).await
    }

    /// The stored slice starting at `start`, and whether it is fresh for
    /// this request (else it must be revalidated).
    async fn stored_slice(&mut self, start: u64, size: u64) -> Result<Option<(Slice<'c>, bool)>, Failure> {
        let found = self
            .cache
            .lookup_slice(&self.key, start)
            .await
            .map_err(|_| (StatusCode::SERVICE_UNAVAILABLE, "the disk cache is busy".to_string()))?;
        // One from an address this request may not reach is no slice of it.
        let Some(stored) = found.filter(|s| self.may_serve(&s.meta)) else {
            return Ok(None);
        };
        let Some((range, complete)) =
            span(&stored.meta.headers, start, size).filter(|(r, _)| r.end - r.start == stored.len)
        else {
            return Ok(None);
        };
        let fresh = self.policy.evaluate(&self.ex.head.headers, &stored.meta, self.now) == Decision::Fresh;
        let slice = Slice {
            range,
            complete,
            meta: stored.meta.clone(),
            how: CacheStatus::Hit,
            source: Source::Stored(stored),
        };
        Ok(Some((slice, fresh)))
    }

    /// Asks the origin for the slice starting at `start` (a GET with only
    /// that `Range`, whatever this client asked for, and the validators of
    /// `stale`, the stored slice, if any) and opens its store. A 304 for
    /// `stale` updates its stored fields (RFC 9111 4.3.4) and answers from it.
    async fn fetch_slice(
        &mut self,
        start: u64,
        size: u64,
        leader: Option<Leader>,
        stale: Option<Slice<'c>>,
    ) -> Result<Got<'c>, Failure> {
        if policy::only_if_cached(&self.ex.head.headers) {
            return Err((StatusCode::GATEWAY_TIMEOUT, "only-if-cached: not in the cache".into()));
        }
        let mut head = plain_get(&self.ex.head);
        let last = start.saturating_add(size) - 1;
        head.headers
            .insert(RANGE, header_value(&format!("bytes={start}-{last}")));
        let conditional = stale.as_ref().map(|s| policy::conditional_headers(&s.meta));
        if stale.is_some() {
            self.cache.stats.revalidation();
        }
        let (fetched, hierarchy) =
            fetch_timed(self.sh, &head, self.ex.peer.ip(), self.dest, conditional.as_ref(), None).await?;
        self.ex.hierarchy = Some(hierarchy);
        if let Some(slice) = stale
            && fetched.response.status() == StatusCode::NOT_MODIFIED
        {
            return Ok(self.not_modified(slice, fetched, leader).await);
        }
        let Some((range, complete)) = answers(&fetched, start, size) else {
            if let Some(l) = leader {
                l.finish(Ending::NotShared);
            }
            return Ok(Got::Other(fetched));
        };
        let len = range.end - range.start;
        let (head_out, body) = fetched.into_head(self.sh, false);
        let own = head_out.headers;
        // Storable as the complete response would be (RFC 9111 3.3: a cache
        // may store a 206 as it would a 200), and never one that varies: its
        // slices would mix the variants. Judged on the fields as the origin
        // sent them: `take_unshared` removes `Set-Cookie`, which
        // `cache.set_cookie = "no-store"` must see.
        let storable = !own.contains_key(VARY)
            && len <= self.cache.max_object_size()
            && self
                .policy
                .storable(&Method::GET, &self.key, &self.ex.head.headers, StatusCode::OK, &own)
                .is_ok();
        let mut shared = own.clone();
        self.policy.take_unshared(&mut shared);
        let meta = StoredMeta {
            key: self.key.text().to_string(),
            variant: slice_variant(start),
            status: StatusCode::PARTIAL_CONTENT,
            headers: shared,
            request_time: head_out.times.request,
            response_time: head_out.times.response,
            origin: head_out.times.origin,
            derived: Default::default(),
        };
        let (sink, leader) = if storable {
            let sink = self.cache.sink(&self.key, meta.clone(), &[], Some(len)).await;
            if let Some(l) = &leader {
                l.head(SharedHead {
                    status: meta.status,
                    headers: meta.headers.clone(),
                    length: Some(len),
                    vary: Vec::new(),
                    variant: Vec::new(),
                    request_time: meta.request_time,
                    response_time: meta.response_time,
                    origin: meta.origin,
                });
            }
            (Some(sink), leader)
        } else {
            if let Some(l) = leader {
                l.finish(Ending::NotShared);
            }
            (None, None)
        };
        // The client that fetched it gets the fields meant for it alone
        // (its `Set-Cookie`), as a whole response's fetcher does; the
        // store and the requests collapsed on it got `meta` without them.
        let meta = StoredMeta { headers: own, ..meta };
        Ok(Got::Slice(Slice {
            range,
            complete,
            meta: Arc::new(meta),
            how: CacheStatus::Miss,
            source: Source::Fetch(Box::new(Fetch {
                size,
                body,
                sink,
                leader,
            })),
        }))
    }
}

impl<'c> Transaction<'c, '_> {
    /// A 304 to a stale slice's revalidation: its fields updated in both
    /// tiers when the 304 selects it (RFC 9111 4.3.4), and the stored slice
    /// answered from; requests waiting on the flight look it up.
    async fn not_modified(&mut self, mut slice: Slice<'c>, fetched: Fetched, leader: Option<Leader>) -> Got<'c> {
        // A 304 that selects nothing updates nothing: the stored slice is
        // served as it is, as a revalidation of a whole response does.
        if let Source::Stored(stored) = &mut slice.source
            && policy::revalidation(&stored.meta, fetched.response.status(), fetched.response.headers())
                == Revalidation::NotModified
        {
            let fresh = fetched.response.into_parts().0.headers;
            let (meta, _own) =
                update_from_304(self.cache, self.policy, stored.id, &stored.meta, fresh, fetched.times).await;
            stored.meta = meta.clone();
            slice.meta = meta;
        }
        if let Some(l) = leader {
            l.finish(Ending::NotShared);
        }
        slice.how = CacheStatus::Revalidated;
        Got::Slice(slice)
    }
}

/// The slice another request is fetching, from the head it shared: None
/// when that head is not the slice's (cannot be, but a follower never
/// sends what it cannot place).
fn followed<'c>(head: &SharedHead, key: &str, start: u64, size: u64, follower: Follower) -> Option<Slice<'c>> {
    let (range, complete) = span(&head.headers, start, size)?;
    let meta = StoredMeta {
        key: key.to_string(),
        variant: slice_variant(start),
        status: head.status,
        headers: head.headers.clone(),
        request_time: head.request_time,
        response_time: head.response_time,
        origin: None,
        derived: Default::default(),
    };
    Some(Slice {
        range,
        complete,
        meta: Arc::new(meta),
        how: CacheStatus::Miss,
        source: Source::Follow(follower),
    })
}

/// Sends the part of `data` (at offset `pos` of its slice) that falls in
/// `want` (offsets in the slice). False when the client is gone.
async fn send_within(ex: &mut crate::http1::Exchange<'_>, data: &Bytes, pos: u64, want: &Range<u64>) -> bool {
    let end = pos + data.len() as u64;
    let (from, to) = (want.start.max(pos), want.end.min(end));
    if from >= to {
        return true;
    }
    let piece = data.slice((from - pos) as usize..(to - pos) as usize);
    ex.out.send_bytes(piece).await.is_ok()
}
