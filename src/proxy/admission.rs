//! The admission step: at most `server.max_requests` requests in service at once
//! (the Sun Java System Web Proxy Server 4's RqThrottle, its "maximum
//! threads"), and the connection queue
//! in front of it.
//!
//! A request holds a permit from the moment its head has been read until
//! its response is done (a CONNECT tunnel gives it back once established:
//! the tunnel is a byte pump, not a request). A request that finds every
//! permit taken waits in the **connection queue**, bounded by
//! `server.queue_size`, and is served in arrival order; when the queue is
//! full it is refused at once (the caller answers 503 with `Retry-After`),
//! so overload shows as quick, clean refusals rather than timeouts.
//!
//! A GET or HEAD that finds every permit taken is not queued at once: it
//! goes on to the cache without a permit, and takes one (waiting in the
//! queue, or refused) only where it must go to an origin
//! ([`admit_deferred`]). A cache hit then never waits behind requests that
//! wait on slow origins: under a Web Polygraph workload (2.5 s origin
//! think time, 2,400 requests/s) misses held every permit, and hits
//! waited in the queue behind them (median 235-295 ms; 5.6-22 ms since)
//! or were refused with the busy 503. The limit keeps its job, bounding
//! what goes upstream (descriptors, origin connections); a hit uses
//! neither.
//!
//! When `server.max_requests` was derived from the open-files limit
//! (`sizing`), it is where admission starts counting descriptors, not a
//! wall: a request that finds every permit taken is still admitted, as
//! one **beyond the limit**, while the descriptors in use leave room for
//! it ([`Descriptors`](crate::sizing::Descriptors): the client connections
//! open, one for each request in service (its origin connection), the
//! cache files being written, the idle pooled origin connections, one for
//! each tunnel or upgraded connection pumping, and the held-file budget as
//! if full), with a headroom kept free for new connections and cache files
//! read without being held. The split behind the derived limit reserves
//! three descriptors for every request in service, which few use.
//! Requests beyond the limit never overtake the queue: one is admitted at
//! once only while nobody waits; otherwise the room is given to the head
//! of the queue (a permit lent to it, taken back at a later release when
//! no room is left for a waiting request), and the newcomer queues behind.
//! A limit the config sets stays a wall.
//!
//! The hot path (a permit is free) is one atomic operation on the
//! semaphore and one on the count in service; the counters are relaxed
//! atomics. Only queueing, which
//! happens when the server is already saturated, takes a small lock, to
//! keep the 1/5/15-minute queue-length averages.

use super::reply::{self, BusyPage};
use super::{ListenerHandler, Shared};
use crate::http1::{Exchange, Outcome};
use serde::Serialize;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;
use tokio::sync::{Semaphore, SemaphorePermit};

/// Time constants of the queue-length averages: 1, 5 and 15 minutes.
const AVG_PERIODS: [f64; 3] = [60.0, 300.0, 900.0];

/// The request cannot be admitted now: the connection queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

/// The gate in front of request processing, with its counters.
#[derive(Debug)]
pub struct Admission {
    permits: Semaphore,
    max_requests: usize,
    /// Set when `max_requests` was derived: admit past it while these allow.
    descriptors: Option<crate::sizing::Descriptors>,
    /// Requests in service now (permits held, lent ones and those beyond
    /// the limit included).
    in_service: AtomicUsize,
    /// Permits added to the semaphore for the queue's head, not yet taken back.
    lent: AtomicUsize,
    /// Tunnels and upgraded connections pumping (each holds an origin descriptor).
    pumping: AtomicUsize,
    /// Requests ever admitted beyond `max_requests` (at once or lent a permit).
    admitted_beyond: AtomicU64,
    queue_limit: usize,
    queued: AtomicUsize,
    peak: AtomicUsize,
    total_queued: AtomicU64,
    overflows: AtomicU64,
    abandoned: AtomicU64,
    queue_time_us: AtomicU64,
    admitted: AtomicU64,
    in_service_peak: AtomicUsize,
    unqueued_hits: AtomicU64,
    load: Mutex<QueueLoad>,
}

/// A request in service; dropping it lets the next one in.
#[derive(Debug)]
pub struct Permit<'a> {
    admission: &'a Admission,
    /// None for a request beyond the limit.
    permit: Option<SemaphorePermit<'a>>,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let a = self.admission;
        a.in_service.fetch_sub(1, Relaxed);
        let waiting = a.queued.load(Relaxed) > 0;
        match self.permit.take() {
            Some(p) if a.lent.load(Relaxed) > 0 => {
                if waiting && a.room_for_one() {
                    // Passed on: the next waiting request is in service
                    // beyond the limit too.
                    a.admitted_beyond.fetch_add(1, Relaxed);
                    drop(p);
                } else if take_one(&a.lent) {
                    // Taken back: the semaphore returns to its size.
                    p.forget();
                } else {
                    drop(p);
                }
            }
            Some(p) => drop(p),
            // Beyond the limit: its descriptors are free, and the head of
            // the queue takes them.
            None if waiting => a.lend(),
            None => {}
        }
    }
}

impl<'a> Permit<'a> {
    /// The request became a tunnel or an upgraded connection: it leaves
    /// service, but its origin descriptor stays counted until the returned
    /// guard drops (the pump ends).
    pub fn into_pump(self) -> crate::util::Counted<'a> {
        crate::util::Counted::new(&self.admission.pumping)
    }
}

/// Decrements `n` if it is above zero; whether it did.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1)).is_ok()
}

/// Exponentially damped averages of the queue length, in continuous time:
/// between two changes the length `n` is constant, so each average moves
/// towards it as `avg = n + (avg - n) * exp(-dt / T)`. The same time
/// constants as Unix load averages, but exact (updated at every change
/// rather than sampled every 5 s), and no timer task is needed.
#[derive(Debug)]
struct QueueLoad {
    at: Instant,
    length: f64,
    avg: [f64; 3],
}

impl QueueLoad {
    fn advance(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        for (avg, period) in self.avg.iter_mut().zip(AVG_PERIODS) {
            *avg = self.length + (*avg - self.length) * (-dt / period).exp();
        }
        self.at = now;
    }
}

/// Leaves the queue when dropped (admitted, or the request went away).
struct Waiting<'a> {
    admission: &'a Admission,
    since: Instant,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let a = self.admission;
        let now = Instant::now();
        let waited = now.saturating_duration_since(self.since);
        a.queue_time_us
            .fetch_add(u64::try_from(waited.as_micros()).unwrap_or(u64::MAX), Relaxed);
        a.queued.fetch_sub(1, Relaxed);
        a.change_length(now, -1.0);
    }
}

impl Admission {
    /// `max_requests` in service at once, `queue_limit` waiting (both at
    /// least 1); past `max_requests` while `descriptors` (when given, for a
    /// derived limit) leave room.
    pub fn new(max_requests: usize, queue_limit: usize, descriptors: Option<crate::sizing::Descriptors>) -> Admission {
        let max_requests = max_requests.clamp(1, Semaphore::MAX_PERMITS);
        Admission {
            permits: Semaphore::new(max_requests),
            max_requests,
            descriptors,
            in_service: AtomicUsize::new(0),
            lent: AtomicUsize::new(0),
            pumping: AtomicUsize::new(0),
            admitted_beyond: AtomicU64::new(0),
            queue_limit: queue_limit.max(1),
            queued: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            total_queued: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            queue_time_us: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            in_service_peak: AtomicUsize::new(0),
            unqueued_hits: AtomicU64::new(0),
            load: Mutex::new(QueueLoad {
                at: Instant::now(),
                length: 0.0,
                avg: [0.0; 3],
            }),
        }
    }

    /// Admits a request: at once if a permit is free (or, for a derived
    /// limit, nobody waits and descriptors are free), else after waiting in
    /// the connection queue (first come, first served); `QueueFull` at once
    /// if the queue has no room.
    pub async fn admit(&self) -> Result<Permit<'_>, QueueFull> {
        if let Some(p) = self.try_admit() {
            return Ok(p);
        }
        let length = self.queued.fetch_add(1, Relaxed) + 1;
        if length > self.queue_limit {
            self.queued.fetch_sub(1, Relaxed);
            self.overflows.fetch_add(1, Relaxed);
            return Err(QueueFull);
        }
        self.peak.fetch_max(length, Relaxed);
        self.total_queued.fetch_add(1, Relaxed);
        let since = Instant::now();
        self.change_length(since, 1.0);
        let waiting = Waiting { admission: self, since };
        // Descriptors are free though others wait: the head of the queue
        // (maybe this request) gets a permit now.
        if self.room_for_one() {
            self.lend();
        }
        // The semaphore is never closed, so acquire cannot fail; if it ever
        // did, refusing the request is the safe answer.
        let permit = self.permits.acquire().await.map_err(|_| QueueFull)?;
        drop(waiting);
        Ok(self.admitted(Some(permit)))
    }

    /// Admits a request if a permit is free now (or, for a derived limit,
    /// nobody waits and descriptors are free), without queueing.
    pub fn try_admit(&self) -> Option<Permit<'_>> {
        if let Ok(p) = self.permits.try_acquire() {
            return Some(self.admitted(Some(p)));
        }
        if self.queued.load(Relaxed) == 0 && self.room_for_one() {
            self.admitted_beyond.fetch_add(1, Relaxed);
            return Some(self.admitted(None));
        }
        None
    }

    /// Whether one more request in service fits in the descriptors
    /// (always false for a configured limit).
    fn room_for_one(&self) -> bool {
        let Some(d) = &self.descriptors else {
            return false;
        };
        let in_use = d
            .fixed_now()
            .saturating_add(crate::drain::open_connections())
            .saturating_add(self.in_service.load(Relaxed))
            .saturating_add(crate::cache::disk::files_being_written())
            .saturating_add(self.pumping.load(Relaxed))
            .saturating_add(crate::upstream::idle_connections());
        // This request's origin connection and the cache file it may write.
        in_use.saturating_add(2).saturating_add(d.headroom) <= d.limit
    }

    /// Adds a permit for the head of the queue, taken back when a permit is
    /// next released.
    fn lend(&self) {
        self.lent.fetch_add(1, Relaxed);
        self.admitted_beyond.fetch_add(1, Relaxed);
        self.permits.add_permits(1);
    }

    /// A request that found every permit taken was answered from the cache
    /// without one.
    pub fn unqueued_hit(&self) {
        self.unqueued_hits.fetch_add(1, Relaxed);
    }

    /// A queued request was given up because its client went away (the
    /// caller dropped the `admit` future for that reason).
    pub fn abandoned(&self) {
        self.abandoned.fetch_add(1, Relaxed);
    }

    fn admitted<'a>(&'a self, permit: Option<SemaphorePermit<'a>>) -> Permit<'a> {
        self.admitted.fetch_add(1, Relaxed);
        let in_service = self.in_service.fetch_add(1, Relaxed) + 1;
        // Read first: a write to this shared line only when the peak moves.
        if in_service > self.in_service_peak.load(Relaxed) {
            self.in_service_peak.fetch_max(in_service, Relaxed);
        }
        Permit {
            admission: self,
            permit,
        }
    }

    fn change_length(&self, now: Instant, delta: f64) {
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        load.advance(now);
        load.length = (load.length + delta).max(0.0);
    }

    /// The counters now.
    pub fn snapshot(&self) -> ConnectionQueue {
        let avg = {
            let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
            load.advance(Instant::now());
            load.avg
        };
        let total_queued = self.total_queued.load(Relaxed);
        let queue_time_us = self.queue_time_us.load(Relaxed);
        ConnectionQueue {
            current: self.queued.load(Relaxed),
            peak: self.peak.load(Relaxed),
            limit: self.queue_limit,
            total_queued,
            overflows: self.overflows.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            queue_time_us,
            avg_queueing_delay_ms: if total_queued == 0 {
                0.0
            } else {
                queue_time_us as f64 / total_queued as f64 / 1000.0
            },
            avg_1min: avg[0],
            avg_5min: avg[1],
            avg_15min: avg[2],
            in_service: self.in_service.load(Relaxed),
            in_service_peak: self.in_service_peak.load(Relaxed),
            max_requests: self.max_requests,
            total_admitted: self.admitted.load(Relaxed),
            admitted_beyond_limit: self.admitted_beyond.load(Relaxed),
            unqueued_hits: self.unqueued_hits.load(Relaxed),
        }
    }
}

/// The connection queue and admission counters (the Sun proxy's ConnectionQueue
/// section of perfdump, plus the requests in service).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ConnectionQueue {
    /// Requests waiting in the queue now ("Current Queue Length").
    pub current: usize,
    /// Most requests ever waiting at once ("Peak Queue Length").
    pub peak: usize,
    /// Queue capacity, `server.queue_size` ("Limit"); beyond it requests get 503.
    pub limit: usize,
    /// Requests that ever waited in the queue ("Total Connections Queued").
    pub total_queued: u64,
    /// Requests refused with 503 because the queue was full ("Number of Connections Overflowed").
    pub overflows: u64,
    /// Queued requests given up because their client closed the connection
    /// while waiting (never sent to an origin).
    pub abandoned: u64,
    /// Total time requests spent queued, in microseconds ("Ticks Spent").
    pub queue_time_us: u64,
    /// `queue_time_us / total_queued` in milliseconds ("Average Queueing Delay").
    pub avg_queueing_delay_ms: f64,
    /// Queue length averaged over about the last minute (exponentially damped).
    pub avg_1min: f64,
    /// Queue length averaged over about the last 5 minutes.
    pub avg_5min: f64,
    /// Queue length averaged over about the last 15 minutes.
    pub avg_15min: f64,
    /// Requests in service now (holding a permit).
    pub in_service: usize,
    /// Most requests ever in service at once.
    pub in_service_peak: usize,
    /// `server.max_requests`: the most requests in service at once.
    pub max_requests: usize,
    /// Requests admitted since start (with or without queueing).
    pub total_admitted: u64,
    /// Requests admitted past a derived `max_requests` because descriptors
    /// were free (at once, or by a permit lent to the queue's head).
    pub admitted_beyond_limit: u64,
    /// Requests that found every permit taken and were answered from the
    /// cache without one (never queued).
    pub unqueued_hits: u64,
}

impl ListenerHandler {
    /// Admission, then the pipeline. Time spent waiting in the connection
    /// queue is the access stage's latency in the performance buckets (a
    /// stage's latency is the gap before it starts); for a GET or HEAD
    /// admitted after its cache lookup, the latency of the stage after it.
    pub(super) async fn admit_and_serve(&self, ex: &mut Exchange<'_>, sh: &Arc<Shared>) -> Outcome {
        // A client over `limits.client_request_rate` is answered before it
        // takes a place or waits for one. One `access.allow` refuses is left
        // to that refusal (a 403, in `serve`), and holds no bucket.
        if crate::client_rate::enabled()
            && sh.allow.allows(ex.peer.ip())
            && let Err(wait) = crate::client_rate::check(ex.peer.ip(), &mut ex.memory.request_rate)
        {
            return too_many_requests(ex, &sh.error_pages, wait, CLIENT_RATE_REFUSED).await;
        }
        // Admission: the request is in service from here until its
        // response is done, or waits in the connection queue, or (queue
        // full) gets a busy 503 at once. A GET or HEAD that finds every
        // permit taken goes on to the cache without one and takes it (or
        // waits for it) only if it must go upstream (`admit_deferred`).
        let mut permit = match sh.admission.try_admit() {
            Some(p) => Some(p),
            None if may_defer(ex, sh) => None,
            None => {
                let route_busy = match self.route_before_queue(ex, sh) {
                    Ok(page) => page,
                    Err(refusal) => return refuse_for_route_rate(ex, &sh.error_pages, refusal).await,
                };
                match queue(ex, &sh.admission, &self.busy, route_busy.as_ref()).await {
                    Ok(p) => Some(p),
                    Err(outcome) => return outcome,
                }
            }
        };
        let outcome = self.serve(ex, sh, &mut permit).await;
        drop(permit);
        outcome
    }
}

/// The page of a request over its client's `limits.client_request_rate`.
const CLIENT_RATE_REFUSED: &str = "Too many requests from this client (limits.client_request_rate)";

/// The page of a request over its route's `request_rate`.
const ROUTE_RATE_REFUSED: &str =
    "Too many requests from this client for this part of the site (a [[rule]] request_rate)";

/// The page of a request over its route's `total_request_rate`.
const ROUTE_TOTAL_RATE_REFUSED: &str =
    "This part of the site is taking too many requests from all its clients (a [[rule]] total_request_rate)";

/// The 429 of a routed request over its route's `request_rate`, or the
/// 503 of one over its `total_request_rate` (both taken from, counted),
/// or None when the route has neither or its buckets had a request.
pub(super) async fn over_route_rate(
    ex: &mut Exchange<'_>,
    pages: &super::ErrorPages,
    route: &crate::rules::Route,
) -> Option<Outcome> {
    let refusal = route.check_rates(ex.peer.ip()).err()?;
    Some(refuse_for_route_rate(ex, pages, refusal).await)
}

/// The answer to a request its route's rates refused: 429 for its
/// client's bucket; 503 for the bucket of all clients, which the client
/// may not have overdrawn (RFC 9110 15.6.4: a temporary overload).
async fn refuse_for_route_rate(
    ex: &mut Exchange<'_>,
    pages: &super::ErrorPages,
    refusal: crate::client_rate::RouteRefusal,
) -> Outcome {
    use crate::client_rate::RouteRefusal;
    let (status, wait, reason) = match refusal {
        RouteRefusal::Client(wait) => (http::StatusCode::TOO_MANY_REQUESTS, wait, ROUTE_RATE_REFUSED),
        RouteRefusal::Total(wait) => (http::StatusCode::SERVICE_UNAVAILABLE, wait, ROUTE_TOTAL_RATE_REFUSED),
    };
    refuse_with_retry(ex, pages, status, wait, reason).await
}

/// The answer to a request over its client's rate (or its route's):
/// 429 (RFC 6585 4) with `Retry-After` in seconds and `reason` on the
/// page, logged as denied. A request with a body is closed after it (its
/// body is unread), as a busy 503 is.
async fn too_many_requests(ex: &mut Exchange<'_>, pages: &super::ErrorPages, wait_secs: u64, reason: &str) -> Outcome {
    refuse_with_retry(ex, pages, http::StatusCode::TOO_MANY_REQUESTS, wait_secs, reason).await
}

/// A refusal with `status`, `Retry-After` in seconds and `reason` on the
/// page, logged as denied; closed after it when the request has a body.
async fn refuse_with_retry(
    ex: &mut Exchange<'_>,
    pages: &super::ErrorPages,
    status: http::StatusCode,
    wait_secs: u64,
    reason: &str,
) -> Outcome {
    ex.cache_result = Some(super::ACCESS_DENIED);
    let has_body = ex.head.body != crate::http1::BodyFraming::Empty;
    if has_body {
        ex.out.close_after();
    }
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(wait_secs));
    let sent = reply::error_page_with(&mut ex.out, pages, status, reason, headers).await;
    if has_body || sent.is_err() {
        Outcome::Close
    } else {
        Outcome::Done
    }
}

/// Whether a request that finds every permit taken may go on to the cache
/// without one: a GET or HEAD without a body, with a cache to answer it.
/// Anything else (a body to stream upstream, a CONNECT) has nothing a
/// cache could answer and waits in the queue at once.
fn may_defer(ex: &Exchange<'_>, sh: &Shared) -> bool {
    (ex.head.method == http::Method::GET || ex.head.method == http::Method::HEAD)
        && ex.head.body == crate::http1::BodyFraming::Empty
        && sh.cache.is_some()
}

/// Waits in the connection queue for a permit. A full queue: the busy 503
/// (`route_busy`, else `listener_busy`) is sent and the outcome returned;
/// a client that goes away while queued leaves the queue (serving it would
/// only waste a place): `Outcome::Close`.
async fn queue<'s>(
    ex: &mut Exchange<'_>,
    admission: &'s Admission,
    listener_busy: &BusyPage,
    route_busy: Option<&BusyPage>,
) -> Result<Permit<'s>, Outcome> {
    let admitted = tokio::select! {
        biased;
        admitted = admission.admit() => admitted,
        () = ex.client_gone() => {
            admission.abandoned();
            return Err(Outcome::Close);
        }
    };
    match admitted {
        Ok(p) => Ok(p),
        Err(QueueFull) => {
            tracing::debug!(client = %ex.peer.ip(), "{} {}: connection queue full, busy 503", ex.head.method, ex.head.target);
            // A request with a body is closed after its 503: the body is
            // unread (the lingering close drains it, so the client sees
            // the 503, not a reset). One without keeps its connection:
            // under overload a reconnect per refusal costs the server
            // more than the 503 itself, and takes goodput with it.
            let has_body = ex.head.body != crate::http1::BodyFraming::Empty;
            if has_body {
                ex.out.close_after();
            }
            ex.cache_result = Some(super::ACCESS_NONE);
            let sent = reply::busy(&mut ex.out, listener_busy, route_busy).await;
            Err(if has_body || sent.is_err() {
                Outcome::Close
            } else {
                Outcome::Done
            })
        }
    }
}

/// For a request that went on without a permit (every one was taken when
/// it arrived; see the module doc): takes one now, before the request goes
/// upstream, waiting in the connection queue. None: admitted (or already
/// was). Some(outcome): the request was answered with the busy 503 (`busy`)
/// or its client went away, and must go no further. Its callers test
/// `permit.is_none()` first and box the call: the hot path (a permit held)
/// then allocates nothing and its future does not carry the queue's state.
pub(super) async fn admit_deferred<'s>(
    ex: &mut Exchange<'_>,
    admission: &'s Admission,
    busy: &BusyPage,
    permit: &mut Option<Permit<'s>>,
) -> Option<Outcome> {
    if permit.is_some() {
        return None;
    }
    match queue(ex, admission, busy, None).await {
        Ok(p) => {
            *permit = Some(p);
            None
        }
        Err(outcome) => Some(outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn queues_then_overflows_then_admits_in_order() {
        let a = Admission::new(1, 1, None);
        let first = a.admit().await.expect("a free permit");
        let a2 = &a;
        let mut second = Box::pin(a2.admit());
        // Polling once puts the second request in the queue.
        assert!(futures_poll_once(second.as_mut()).await.is_none());
        assert_eq!(a.snapshot().current, 1);
        assert_eq!(a.admit().await.err(), Some(QueueFull));
        drop(first);
        let _p = second.await.expect("admitted after the first finished");
        let s = a.snapshot();
        assert_eq!((s.current, s.peak, s.limit), (0, 1, 1));
        assert_eq!((s.total_queued, s.overflows, s.total_admitted), (1, 1, 2));
        assert_eq!((s.in_service, s.in_service_peak, s.max_requests), (1, 1, 1));
        assert!(s.avg_1min >= 0.0 && s.avg_1min <= 1.0);
    }

    /// A budget with room for `requests` in service (one descriptor each,
    /// and two for the last) beyond what the process already holds.
    fn room_for(requests: usize) -> crate::sizing::Descriptors {
        let held = crate::drain::open_connections()
            + crate::upstream::idle_connections()
            + crate::cache::disk::files_being_written();
        crate::sizing::Descriptors {
            limit: 100 + held + requests + 1,
            fixed: 100,
            headroom: 0,
            given_up: Box::leak(Box::default()),
        }
    }

    #[tokio::test]
    async fn held_files_given_up_leave_room_for_more_requests() {
        let d = room_for(1);
        let a = Admission::new(1, 1, Some(d));
        let _p1 = a.try_admit().expect("a permit");
        assert!(a.try_admit().is_none(), "no room beyond the limit");
        // Descriptors ran out and the held cache files were cut by two:
        // fixed counted them as held, so that room is free now.
        d.given_up.fetch_add(2, Relaxed);
        let _p2 = a.try_admit().expect("room the held files gave up");
        let _p3 = a.try_admit().expect("and for another");
        assert!(a.try_admit().is_none(), "and no more");
    }

    #[tokio::test]
    async fn a_derived_limit_admits_beyond_itself_while_descriptors_are_free() {
        let a = Admission::new(1, 1, Some(room_for(3)));
        let p1 = a.try_admit().expect("a permit");
        let p2 = a.try_admit().expect("beyond the limit: room for 3");
        let p3 = a.admit().await.expect("beyond the limit: room for 3");
        assert!(a.try_admit().is_none(), "no room for a fourth");
        let s = a.snapshot();
        assert_eq!((s.in_service, s.in_service_peak, s.admitted_beyond_limit), (3, 3, 2));
        drop((p1, p2, p3));
        assert_eq!(a.snapshot().in_service, 0);
        let _p = a.try_admit().expect("room again");
    }

    #[tokio::test]
    async fn a_configured_limit_stays_a_wall() {
        let a = Admission::new(1, 1, None);
        let _p = a.try_admit().expect("a permit");
        assert!(a.try_admit().is_none());
    }

    #[tokio::test]
    async fn requests_beyond_the_limit_do_not_overtake_the_queue() {
        let a = Admission::new(1, 4, Some(room_for(2)));
        let p1 = a.try_admit().expect("a permit");
        let p2 = a.try_admit().expect("beyond the limit");
        let a2 = &a;
        let mut queued = Box::pin(a2.admit());
        assert!(
            futures_poll_once(queued.as_mut()).await.is_none(),
            "no room for a third"
        );
        // The request beyond the limit ends: its room goes to the queue's
        // head, not to a newcomer.
        drop(p2);
        assert!(a.try_admit().is_none(), "a newcomer waits behind the queue");
        let p3 = queued.await.expect("the queue's head got the room");
        assert_eq!(a.snapshot().in_service, 2);
        // The lent permit is taken back when a permit is released: the
        // semaphore keeps its size.
        drop(p3);
        drop(p1);
        assert_eq!(a.permits.available_permits(), 1);
        assert_eq!(a.lent.load(Relaxed), 0);
    }

    #[tokio::test]
    async fn a_released_permit_goes_to_the_queue_while_descriptors_leave_room() {
        let a = Admission::new(1, 4, Some(room_for(2)));
        let p1 = a.try_admit().expect("a permit");
        let p2 = a.try_admit().expect("beyond the limit");
        let a2 = &a;
        let mut q3 = Box::pin(a2.admit());
        assert!(futures_poll_once(q3.as_mut()).await.is_none());
        drop(p2);
        let p3 = q3.await.expect("lent the room of the request beyond the limit");
        let mut q4 = Box::pin(a2.admit());
        assert!(futures_poll_once(q4.as_mut()).await.is_none(), "no room for a third");
        // p1's permit is not taken back while a request waits and there is
        // room for it: the waiting request gets it.
        drop(p1);
        let p4 = q4.await.expect("passed on");
        assert_eq!(a.snapshot().in_service, 2);
        assert_eq!(a.snapshot().admitted_beyond_limit, 3);
        drop((p3, p4));
        assert_eq!(a.permits.available_permits(), 1, "the semaphore is back to its size");
        assert_eq!(a.lent.load(Relaxed), 0);
    }

    async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await
    }

    #[test]
    fn averages_move_towards_the_length() {
        let start = Instant::now();
        let mut l = QueueLoad {
            at: start,
            length: 2.0,
            avg: [0.0; 3],
        };
        l.advance(start + Duration::from_secs(60));
        // After one time constant: 2 * (1 - 1/e).
        assert!((l.avg[0] - 2.0 * (1.0 - (-1.0f64).exp())).abs() < 1e-9);
        assert!(l.avg[0] > l.avg[1] && l.avg[1] > l.avg[2] && l.avg[2] > 0.0);
    }
}
