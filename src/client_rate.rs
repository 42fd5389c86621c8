//! `limits.client_request_rate` and `client_request_burst`: how many
//! requests a second one client may make, as nginx's `limit_req` (with
//! `burst` and `nodelay`) and HAProxy's `http_req_rate` deny do. The
//! connection cap (`client_limit`) bounds how many connections a client
//! holds; this bounds what it asks over them, keep-alive requests and
//! HTTP/2 streams included.
//!
//! A token bucket per client (the client as `client_limit` keys it: an IPv4
//! address, an IPv6 /64), holding up to `burst` tokens and refilled at
//! `rate` a second; each request takes one, and a request that finds none
//! is answered 429 with `Retry-After` before it is admitted, routed or
//! looked up. The buckets are kept by the worker processes together
//! (`server.processes = N > 1`), as nginx keeps a `limit_req` zone in
//! shared memory: `shared_buckets::client_at`, a table of room for
//! `limits.client_table` clients whose slots a new client takes from
//! the least recently used buckets when its place in the table is full.
//! The bucket arithmetic is `shared_buckets`', pure, the clock a
//! parameter.
//!
//! A route's `request_rate` (`[[rule]]`, nginx's `limit_req` in a
//! `location`) is the same kind of limit for the requests that route
//! matches: a [`RouteRate`] with buckets of its own, taken from once the
//! request is routed, and looked at (nothing taken) before a request
//! waits in the connection queue. Its `total_request_rate` (nginx's
//! `limit_req` keyed by `$server_name`) is one bucket for all clients
//! together, to spare a backend that can take only so much: a request
//! past it gets 503, not 429, since its client may have asked only once.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// `rate` (requests a second) as f64 bits; 0: no limit.
static RATE: AtomicU64 = AtomicU64::new(0);
/// `burst` (the bucket's size) as f64 bits.
static BURST: AtomicU64 = AtomicU64::new(0);
/// Requests refused for their client's rate, since start.
static REFUSED: AtomicU64 = AtomicU64::new(0);
/// When the last refusal was logged, in seconds since the Unix epoch.
static LOGGED: AtomicU64 = AtomicU64::new(0);

/// Requests refused for their route's `request_rate`, since start.
static ROUTE_REFUSED: AtomicU64 = AtomicU64::new(0);
/// When the last of those was logged.
static ROUTE_LOGGED: AtomicU64 = AtomicU64::new(0);
/// Requests refused for their route's `total_request_rate`, since start.
static ROUTE_TOTAL_REFUSED: AtomicU64 = AtomicU64::new(0);
/// When the last of those was logged.
static ROUTE_TOTAL_LOGGED: AtomicU64 = AtomicU64::new(0);

/// Buckets of requests, one a client: the global limit's, and each
/// route's, kept by the worker processes together (`shared_buckets::client_at`).
struct RateTable(crate::shared_buckets::ClientLimit);

/// The global limit's buckets.
const GLOBAL: RateTable = RateTable((0, 0));

impl RateTable {
    /// Takes a request from the bucket of the client at `ip` (made full
    /// if it has none), found at `known` if that is its place: Ok, or
    /// Err(seconds until it has one, at least 1).
    fn take(
        &self,
        ip: IpAddr,
        rate: f64,
        burst: f64,
        known: &mut crate::shared_buckets::KnownPlace,
    ) -> Result<(), u64> {
        let now = crate::shared_buckets::now_ns();
        crate::shared_buckets::client_at(known.of(self.0, crate::client_limit::key(ip)), now)
            .take_one(now, rate, burst, true)
            .map_err(ns_in_seconds)
    }

    /// Whether the bucket of the client at `ip` has a request now, taking
    /// none: Ok, or Err(seconds until it has one, at least 1).
    fn peek(&self, ip: IpAddr, rate: f64, burst: f64) -> Result<(), u64> {
        let Some(bucket) = crate::shared_buckets::client_if_any(self.0, crate::client_limit::key(ip)) else {
            return Ok(());
        };
        bucket
            .take_one(crate::shared_buckets::now_ns(), rate, burst, false)
            .map_err(ns_in_seconds)
    }
}

/// A wait in nanoseconds as `Retry-After` gives it: whole seconds, at
/// least 1.
fn ns_in_seconds(wait_ns: u64) -> u64 {
    wait_ns.div_ceil(1_000_000_000).max(1)
}

/// A route's `request_rate` and `request_burst` (`[[rule]]`, nginx's
/// `limit_req` in a `location`): buckets of its own, one a client; or its
/// `total_request_rate` and `total_request_burst`: one bucket for all
/// clients. The buckets are in `shared_buckets`, named by the rule list's
/// hash (a reload that changes no rule keeps them, one that changes any
/// starts them full).
pub struct RouteRate {
    /// The rule that set it, for the log.
    rule: usize,
    rate: f64,
    burst: f64,
    buckets: Buckets,
}

/// A route's buckets: one a client, or one for all.
enum Buckets {
    PerClient(RateTable),
    /// One for all clients, shared by the worker processes
    /// (`shared_buckets`); `one` lets this process's requests count
    /// against it and their clients' buckets one at a time.
    Total {
        bucket: crate::shared_buckets::Bucket,
        /// The rule list it was compiled for (`Bucket::put_in_force`).
        tag: u64,
        one: std::sync::Mutex<()>,
        /// Put in force ([`RouteRate::activate`]).
        activated: std::sync::atomic::AtomicBool,
    },
}

/// Why a route's rates refused a request, with the seconds until it
/// would have been let through (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteRefusal {
    /// Its client's bucket (`request_rate`) is empty: 429.
    Client(u64),
    /// The bucket of all clients (`total_request_rate`) is empty: 503.
    Total(u64),
}

/// Counts a request from `ip` against its route's `request_rate`
/// (`client`) and `total_request_rate` (`total`). The client's bucket
/// decides first: a request it refuses (429) takes nothing from the total;
/// one the total refuses (503) takes nothing from its client's bucket.
pub(crate) fn check_route(
    client: Option<&RouteRate>,
    total: Option<&RouteRate>,
    ip: IpAddr,
) -> Result<(), RouteRefusal> {
    route_counts(client, total, ip, true)
}

/// [`check_route`] that takes nothing, for a request about to wait for a
/// service place.
pub(crate) fn check_route_ahead(
    client: Option<&RouteRate>,
    total: Option<&RouteRate>,
    ip: IpAddr,
) -> Result<(), RouteRefusal> {
    route_counts(client, total, ip, false)
}

/// [`check_route`] (`take`) or [`check_route_ahead`].
fn route_counts(
    client: Option<&RouteRate>,
    total: Option<&RouteRate>,
    ip: IpAddr,
    take: bool,
) -> Result<(), RouteRefusal> {
    match total {
        Some(t) => t.count_total(ip, take, client),
        None => client_count(client, ip, take),
    }
}

/// A request from `ip` counted against its client's bucket on the route
/// (`request_rate`), if the route has one.
fn client_count(client: Option<&RouteRate>, ip: IpAddr, take: bool) -> Result<(), RouteRefusal> {
    client
        .map_or(Ok(()), |c| c.count(ip, take))
        .map_err(RouteRefusal::Client)
}

impl std::fmt::Debug for RouteRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteRate")
            .field("rule", &self.rule)
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("total", &self.is_total())
            .finish()
    }
}

impl RouteRate {
    /// `rate` requests a second (at least 1), a bucket of `burst` (0: the
    /// rate), for rule `rule` of the rule list hashed as `list`: one a
    /// client, kept by the worker processes together
    /// (`shared_buckets::client_at`), and kept by a reload as long as the
    /// rule list is the same.
    pub fn new(rule: usize, list: u64, rate: u32, burst: u32) -> RouteRate {
        // Never (0, 0), the global limit's.
        RouteRate::with(rule, rate, burst, |_| {
            Buckets::PerClient(RateTable((list, rule as u64 + 1)))
        })
    }

    /// `rate` requests a second for all clients together, a bucket of
    /// `burst` (0: the rate), for rule `rule`, kept in `bucket` (shared by
    /// the worker processes: `shared_buckets::route`), which
    /// [`RouteRate::activate`] fills when the rule is put in force.
    pub fn total(rule: usize, bucket: crate::shared_buckets::Bucket, tag: u64, rate: u32, burst: u32) -> RouteRate {
        RouteRate::with(rule, rate, burst, |_| Buckets::Total {
            bucket,
            tag,
            one: std::sync::Mutex::new(()),
            activated: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Puts a `total_request_rate` in force, the first time only: its
    /// bucket is filled if `fill` (a rule list compiled anew at a reload)
    /// and no other worker process has filled it for this rule list
    /// already ([`crate::shared_buckets::Bucket::put_in_force`]), else
    /// left as the worker processes hold it (at start).
    pub(crate) fn activate(&self, fill: bool) {
        if let Buckets::Total {
            bucket, tag, activated, ..
        } = &self.buckets
            && !activated.swap(true, Ordering::AcqRel)
        {
            bucket.put_in_force(*tag, fill);
        }
    }

    fn with(rule: usize, rate: u32, burst: u32, buckets: impl FnOnce(f64) -> Buckets) -> RouteRate {
        let burst = f64::from(if burst == 0 { rate.max(1) } else { burst });
        RouteRate {
            rule,
            rate: f64::from(rate.max(1)),
            burst,
            buckets: buckets(burst),
        }
    }

    /// Whether its bucket is one for all clients (`total_request_rate`).
    pub fn is_total(&self) -> bool {
        matches!(self.buckets, Buckets::Total { .. })
    }

    /// Requests a second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The bucket's size.
    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// Counts a request to the route from `ip` (`take_one`), or looks
    /// whether it would be let through, taking nothing (for a request about
    /// to wait for a service place: refused before it waits, counted when
    /// it is served). Ok when the client is exempt (another array member:
    /// the member in front counted it) or the bucket (the client's, or the
    /// one for all clients) has a request; else Err(seconds to wait, at
    /// least 1), counted and logged.
    fn count(&self, ip: IpAddr, take_one: bool) -> Result<(), u64> {
        if crate::client_limit::is_exempt(ip) {
            return Ok(());
        }
        let r = match &self.buckets {
            Buckets::PerClient(t) if take_one => t.take(ip, self.rate, self.burst, &mut Default::default()),
            Buckets::PerClient(t) => t.peek(ip, self.rate, self.burst),
            Buckets::Total { bucket, .. } => bucket
                .take_one(crate::shared_buckets::now_ns(), self.rate, self.burst, take_one)
                .map_err(ns_in_seconds),
        };
        self.refused_if(ip, r)
    }

    /// Counts a request from `ip` against this bucket for all clients
    /// (`take`, or a look that takes nothing) and, through `client`,
    /// against its client's bucket. Its client's bucket decides first (a
    /// 429 takes nothing from the total), by a look; then the total is
    /// taken from, then the client's bucket. This process's requests for
    /// the route do all that one at a time, so none ever finds either
    /// bucket short of a request another holds only until it is refused.
    /// (Only a request on another route sharing the client's bucket, under
    /// `continue = true`, or one of the same client served by another
    /// worker process, can empty it between the look and the take: the
    /// total then gets its request back.)
    fn count_total(&self, ip: IpAddr, take: bool, client: Option<&RouteRate>) -> Result<(), RouteRefusal> {
        let Buckets::Total { bucket, one, .. } = &self.buckets else {
            // Not a total: counted as any bucket, after the client's.
            client_count(client, ip, take)?;
            return self.count(ip, take).map_err(RouteRefusal::Total);
        };
        if crate::client_limit::is_exempt(ip) {
            return client_count(client, ip, take);
        }
        // Without a client's bucket there is nothing to count with the
        // total in one step.
        let _one = client.map(|_| one.lock().unwrap_or_else(|e| e.into_inner()));
        client_count(client, ip, false)?;
        let now = crate::shared_buckets::now_ns();
        if let Err(wait_ns) = bucket.take_one(now, self.rate, self.burst, take) {
            return self
                .refused_if(ip, Err(ns_in_seconds(wait_ns)))
                .map_err(RouteRefusal::Total);
        }
        if take && let Err(refused) = client_count(client, ip, true) {
            bucket.give_back_one(self.rate);
            return Err(refused);
        }
        Ok(())
    }

    /// A refusal, counted and logged; Ok passes through.
    fn refused_if(&self, ip: IpAddr, r: Result<(), u64>) -> Result<(), u64> {
        let Err(wait) = r else {
            return Ok(());
        };
        if self.is_total() {
            ROUTE_TOTAL_REFUSED.fetch_add(1, Ordering::Relaxed);
            if crate::util::log_due(&ROUTE_TOTAL_LOGGED) {
                tracing::warn!(
                    client = %ip,
                    "request refused with 503: rule[{}].total_request_rate = {} a second for all clients \
                     together is spent (burst {}; logged at most once a second; counted as the perfdump's \
                     Refused Over Route Total Rate)",
                    self.rule,
                    self.rate,
                    self.burst
                );
            }
            return Err(wait);
        }
        ROUTE_REFUSED.fetch_add(1, Ordering::Relaxed);
        if crate::util::log_due(&ROUTE_LOGGED) {
            tracing::warn!(
                client = %ip,
                "request refused with 429: the client is over rule[{}].request_rate = {} a second \
                 (burst {}; logged at most once a second; counted as the perfdump's Refused Over Route Rate)",
                self.rule,
                self.rate,
                self.burst
            );
        }
        Err(wait)
    }
}

/// Requests refused for their route's `request_rate`, since start.
pub fn route_refused() -> u64 {
    ROUTE_REFUSED.load(Ordering::Relaxed)
}

/// Requests refused for their route's `total_request_rate`, since start.
pub fn route_total_refused() -> u64 {
    ROUTE_TOTAL_REFUSED.load(Ordering::Relaxed)
}

/// Sets the rate (requests a second, 0: no limit) and the burst (0: as
/// many as the rate, at least 1), at start-up and on every reload.
pub(crate) fn set(rate: u32, burst: u32) {
    let burst = if burst == 0 { rate.max(1) } else { burst };
    BURST.store(f64::from(burst).to_bits(), Ordering::Relaxed);
    RATE.store(f64::from(rate).to_bits(), Ordering::Relaxed);
}

/// Whether a rate is set: without one a request costs this one load.
pub(crate) fn enabled() -> bool {
    RATE.load(Ordering::Relaxed) != 0
}

/// Requests refused for their client's rate, since start.
pub fn refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Counts a request from `ip`: Ok when no rate is set, the client is
/// exempt (another array member) or its bucket has a token; else
/// Err(seconds to wait, at least 1), counted and logged. `known`: where
/// the connection found its client's bucket for an earlier request.
pub(crate) fn check(ip: IpAddr, known: &mut crate::shared_buckets::KnownPlace) -> Result<(), u64> {
    let rate = f64::from_bits(RATE.load(Ordering::Relaxed));
    if rate <= 0.0 || crate::client_limit::is_exempt(ip) {
        return Ok(());
    }
    let burst = f64::from_bits(BURST.load(Ordering::Relaxed));
    let Err(wait) = GLOBAL.take(ip, rate, burst, known) else {
        return Ok(());
    };
    REFUSED.fetch_add(1, Ordering::Relaxed);
    if crate::util::log_due(&LOGGED) {
        tracing::warn!(
            client = %ip,
            "request refused with 429: the client is over limits.client_request_rate = {rate} a second \
             (burst {burst}; logged at most once a second; counted as the perfdump's Refused Over Client Rate)"
        );
    }
    Err(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_keeps_its_own_buckets_and_a_client_its_own_in_each() {
        let login = RouteRate::new(0, 101, 1, 2);
        let api = RouteRate::new(1, 101, 1, 0);
        let (a, b) = ("203.0.113.1".parse().unwrap(), "203.0.113.2".parse().unwrap());
        assert_eq!((login.count(a, true), login.count(a, true)), (Ok(()), Ok(())));
        assert_eq!(login.count(a, true), Err(1), "a's burst of 2 is spent");
        assert_eq!(login.count(b, true), Ok(()), "b has a bucket of its own");
        assert_eq!(api.count(a, true), Ok(()), "and so has the other route");
        assert_eq!(api.count(a, true), Err(1), "burst 0: the rate, 1");
        // A look ahead takes nothing.
        let c = "203.0.113.3".parse().unwrap();
        assert_eq!(login.count(c, false), Ok(()), "no bucket yet: a full one");
        assert_eq!((login.count(c, true), login.count(c, false)), (Ok(()), Ok(())));
        assert_eq!((login.count(c, true), login.count(c, false)), (Ok(()), Err(1)));
    }

    #[test]
    fn a_routes_total_is_one_bucket_for_all_and_takes_nothing_from_a_client_it_refuses() {
        let per_client = RouteRate::new(0, 102, 1, 2);
        let total = RouteRate::total(0, crate::shared_buckets::Bucket::own(), 1, 1, 2);
        let (a, b, c) = (
            "203.0.113.11".parse().unwrap(),
            "203.0.113.12".parse().unwrap(),
            "203.0.113.13".parse().unwrap(),
        );
        let both = |ip| check_route(Some(&per_client), Some(&total), ip);
        assert_eq!((both(a), both(b)), (Ok(()), Ok(())), "the total's burst of 2");
        // A third client has requests of its own but none are left for all.
        assert_eq!(
            check_route_ahead(Some(&per_client), Some(&total), c),
            Err(RouteRefusal::Total(1))
        );
        assert_eq!(both(c), Err(RouteRefusal::Total(1)));
        // Refused by the total, c was not served: its own bucket is full.
        assert_eq!(check_route(Some(&per_client), None, c), Ok(()));
        assert_eq!(check_route(Some(&per_client), None, c), Ok(()));
        assert_eq!(both(c), Err(RouteRefusal::Client(1)), "its own burst is spent now");
        assert!(total.is_total() && !per_client.is_total());
    }

    /// Two requests of one client at once (HTTP/2 streams) on a route
    /// whose total is spent: the client has a request in its bucket, so
    /// both are refused by the total (503), never by its rate (429), which
    /// a request holding the client's token until the total refused it
    /// would make the other see.
    #[test]
    fn a_request_the_total_refuses_never_makes_its_clients_other_one_look_over_its_rate() {
        let per_client = RouteRate::new(0, 103, 1, 1);
        let total = RouteRate::total(0, crate::shared_buckets::Bucket::own(), 1, 1, 1);
        let (other, a): (IpAddr, IpAddr) = ("203.0.113.21".parse().unwrap(), "203.0.113.22".parse().unwrap());
        assert_eq!(check_route(Some(&per_client), Some(&total), other), Ok(()));
        let (over_rate, served) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        match check_route(Some(&per_client), Some(&total), a) {
                            Ok(()) => served.fetch_add(1, Ordering::Relaxed),
                            Err(RouteRefusal::Client(_)) => over_rate.fetch_add(1, Ordering::Relaxed),
                            Err(RouteRefusal::Total(_)) => 0,
                        };
                    }
                });
            }
        });
        // The total gets a request a second: a run slow enough to see one
        // may have served `a` once, and then its 429s are its own.
        if served.load(Ordering::Relaxed) == 0 {
            assert_eq!(over_rate.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn burst_zero_means_the_rate_and_at_least_one() {
        set(5, 0);
        assert_eq!(f64::from_bits(BURST.load(Ordering::Relaxed)), 5.0);
        set(0, 0);
        assert_eq!(f64::from_bits(BURST.load(Ordering::Relaxed)), 1.0);
        assert!(
            check("203.0.113.9".parse().unwrap(), &mut Default::default()).is_ok(),
            "no rate: no limit"
        );
    }
}
