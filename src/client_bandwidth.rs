//! `limits.client_bandwidth` and `client_bandwidth_burst`: how many bytes a
//! second one client may be sent, as Squid's delay pools (class 2, a bucket
//! per client address) and nginx's `limit_rate` do. The connection cap
//! (`client_limit`) and the request rate (`client_rate`) bound how much a
//! client asks; this bounds how much of the link one client's downloads may
//! take, whatever it asks for and however many connections it opens.
//!
//! A token bucket per client (the client as `client_limit` keys it: an IPv4
//! address, an IPv6 /64) shared by all of its connections, and by the
//! worker processes (`shared_buckets`' table of clients), holding up to
//! `burst` bytes and refilled at the rate. Every byte sent to the client
//! takes one: response bodies on HTTP/1 and HTTP/2 (from the origin, the
//! cache's memory or its disk through `sendfile`), and what a `CONNECT`
//! tunnel, a SOCKS session or an upgraded (WebSocket) connection carries
//! towards the client. A write takes its bytes first and then waits out
//! the debt, if any ([`take`]), so several connections of one client share
//! the rate; writes are cut into pieces of at most an eighth of a second's
//! worth ([`Meter::piece`]) so that one large body does not go out in
//! bursts. Every body counts, Portico's own pages too; response heads and
//! bytes the client sends do not. Array members are exempt, as from the
//! other per-client limits.
//!
//! `limits.total_bandwidth` (and `total_bandwidth_burst`) bounds what all
//! clients together are sent, as Squid's class 1 delay pool does: one
//! more bucket (not in the table, and shared by the worker processes:
//! `shared_buckets`), which every paced write takes from as well as from
//! its client's; the write waits for the longer of
//! the two debts. Writes queue on it in the order they take from it, so
//! its pieces shrink with the writes waiting on it ([`Meter::piece`]): a
//! client gets a piece every so often rather than a large one after a
//! long silence.
//!
//! A route's `bandwidth` (`[[rule]]`, nginx's `limit_rate` in a
//! `location`) is a bucket of the response's own, kept in its [`Pacer`]:
//! a write waits for the longest of the three debts.
//!
//! The clients' buckets are in `shared_buckets`' table of clients, beside
//! the request rates', named by the client and the rate, so that the worker
//! processes (`server.processes`) keep a client to the rate together, and a
//! reload that changes the rate starts every client's bucket afresh (full),
//! as one changing a route's `request_rate` does. The writers of a
//! client's responses pace through a [`Pacer`], which finds the bucket at
//! each write (a SipHash and a look at a few slots: a bucket given to
//! another client while a response is under way is not written to after
//! it) and follows a reload at once (a limit set by a reload applies to
//! what is being sent, and a lifted one stops pacing it). A bucket stays
//! after its last response is done: a client fetching one object after
//! another owes what it was sent before, and does not start each response
//! with a full burst. A route's bucket arithmetic ([`take`]) is pure, the
//! clock a parameter.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes a second; 0: no limit.
static RATE: AtomicU64 = AtomicU64::new(0);
/// The bucket's size in bytes.
static BURST: AtomicU64 = AtomicU64::new(0);
/// All clients' bytes a second (`limits.total_bandwidth`); 0: no limit.
static TOTAL_RATE: AtomicU64 = AtomicU64::new(0);
/// The shared bucket's size in bytes.
static TOTAL_BURST: AtomicU64 = AtomicU64::new(0);
/// Writes waiting on the total now.
static TOTAL_PACING: AtomicU64 = AtomicU64::new(0);
/// Bumped by every [`set`] and [`set_total`]: a [`Pacer`] looks again
/// whether its client is paced when it has changed.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Writes that waited for one of the limits (the one they owed longest
/// to), and how long in all, since start.
#[derive(Debug)]
pub struct Waits {
    count: AtomicU64,
    us: AtomicU64,
}

impl Waits {
    const fn new() -> Waits {
        Waits {
            count: AtomicU64::new(0),
            us: AtomicU64::new(0),
        }
    }

    fn add(&self, us: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.us.fetch_add(us, Ordering::Relaxed);
    }

    /// The writes that waited, and the microseconds they waited in all.
    pub fn read(&self) -> (u64, u64) {
        (self.count.load(Ordering::Relaxed), self.us.load(Ordering::Relaxed))
    }
}

/// Writes that waited longest for their client's share
/// (`limits.client_bandwidth`).
pub static CLIENT_WAITS: Waits = Waits::new();
/// Writes that waited longer for `limits.total_bandwidth` than for their
/// client's share.
pub static TOTAL_WAITS: Waits = Waits::new();
/// Writes that waited longer for their route's `bandwidth` than for the
/// client's and the total's.
pub static ROUTE_WAITS: Waits = Waits::new();

/// The smallest piece a paced write is cut into.
const MIN_PIECE: usize = 1 << 10;
/// The largest piece.
const MAX_PIECE: usize = 64 << 10;

/// A route's bucket, kept by its response.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    /// Bytes that may be sent now; below 0, the debt writes are waiting out.
    tokens: f64,
    /// When `tokens` was counted, in microseconds of [`now_us`].
    at_us: u64,
}

/// `b` refilled to `now_us` at `rate` bytes a second, at most `burst`.
fn refill(b: &mut Bucket, now_us: u64, rate: f64, burst: f64) {
    let elapsed = now_us.saturating_sub(b.at_us) as f64 / 1e6;
    b.tokens = (b.tokens + elapsed * rate).min(burst);
    b.at_us = b.at_us.max(now_us);
}

/// Takes `n` bytes from `b` at `now_us`, into debt if need be: the
/// microseconds the write must wait before it sends them (0: at once).
fn take(b: &mut Bucket, n: u64, now_us: u64, rate: f64, burst: f64) -> u64 {
    refill(b, now_us, rate, burst);
    b.tokens -= n as f64;
    if b.tokens >= 0.0 {
        0
    } else {
        (-b.tokens / rate * 1e6).ceil() as u64
    }
}

/// How a client's writes are paced: by its own bucket (in the table
/// shared by the worker processes) and the total's, or by the total's
/// alone.
#[derive(Debug, Clone, Copy)]
pub struct Meter {
    /// The client's bucket; None: only the total is kept to (no
    /// per-client rate was set when this meter was handed out).
    client: Option<ClientBucket>,
}

/// A meter's client bucket: named by the client and the rate it was
/// handed out under (both kept, so that a write never takes from the
/// bucket of one rate at another), and where it is in the table once a
/// write has looked ([`bucket`]: a response with no body never hashes),
/// or the connection's earlier response had.
#[derive(Debug, Clone, Copy)]
struct ClientBucket {
    /// `client_limit::key`.
    key: u128,
    /// Bytes a second.
    rate: u64,
    place: crate::shared_buckets::KnownPlace,
}

/// Sets the rate (bytes a second, 0: no limit) and the burst (0: one
/// second's worth), at start-up and on every reload; writes under way
/// follow at their next. The clients' buckets are named by the rate
/// ([`bucket`]): a new rate starts them all full, a debt run up at the
/// old one forgiven.
pub(crate) fn set(rate: u64, burst: u64) {
    let burst = if burst == 0 { rate } else { burst };
    BURST.store(burst, Ordering::Relaxed);
    RATE.store(rate, Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::Release);
}

/// Which limit the bucket of a client under `rate` bytes a second is for,
/// in the table of clients: a name no other limit uses (see
/// `shared_buckets::ClientLimit`). A meter keeps its place for its writes,
/// and the connection for its next response; a reload that changes the
/// rate makes new meters ([`GENERATION`]), whose limit is another.
fn bucket(rate: u64) -> crate::shared_buckets::ClientLimit {
    (0, rate)
}

/// Sets the total rate (bytes a second for all clients, 0: no limit) and
/// its burst (0: one second's worth), at start-up and on every reload.
/// When the rate falls (or a limit appears), a debt run up at the higher
/// rate is cut to a second of the new one;
/// when it rises, the debt (kept as time) is paid at the new rate.
pub(crate) fn set_total(rate: u64, burst: u64) {
    let burst = if burst == 0 { rate } else { burst };
    TOTAL_BURST.store(burst, Ordering::Relaxed);
    let old = TOTAL_RATE.swap(rate, Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::Release);
    let now = crate::shared_buckets::now_ns();
    if rate > 0 && (old == 0 || rate < old) {
        crate::shared_buckets::total_bandwidth().cap_debt(now, rate as f64, rate as f64);
    } else if old > 0 && rate > old {
        // The debt is kept as time: paid back at the raised rate, it is shorter.
        crate::shared_buckets::total_bandwidth().rescale_debt(now, old as f64, rate as f64);
    }
}

/// How the writes to a client at `ip` are paced: None when no rate is set
/// (these two loads are all an unlimited response costs) or the client is
/// exempt (another array member). `known`: where the connection's earlier
/// response found the client's bucket.
pub(crate) fn meter(ip: IpAddr, known: crate::shared_buckets::KnownPlace) -> Option<Meter> {
    let rate = RATE.load(Ordering::Relaxed);
    if (rate == 0 && TOTAL_RATE.load(Ordering::Relaxed) == 0) || crate::client_limit::is_exempt(ip) {
        return None;
    }
    Some(Meter {
        client: (rate != 0).then(|| ClientBucket {
            key: crate::client_limit::key(ip),
            rate,
            place: known,
        }),
    })
}

/// Microseconds since the first use, the clock of a route's buckets.
fn now_us() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    u64::try_from(EPOCH.get_or_init(std::time::Instant::now).elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// The bucket's size in bytes (at least 1).
fn burst() -> f64 {
    (BURST.load(Ordering::Relaxed) as f64).max(1.0)
}

/// The shared bucket's size in bytes (at least 1).
fn total_burst() -> f64 {
    (TOTAL_BURST.load(Ordering::Relaxed) as f64).max(1.0)
}

/// How a writer is paced for as long as it sends: a response (HTTP/1, an
/// HTTP/2 stream), a tunnel, a SOCKS session, an upgraded connection. Its
/// client's [`Meter`] is looked up again after a reload has changed the
/// limits, so that a new limit applies from the next write
/// on to what is under way, and a lifted one stops pacing it (a write
/// already waiting out a debt finishes its wait). Between reloads a write
/// pays an atomic load or two for this.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// The client; None: never paced ([`Pacer::unpaced`]).
    ip: Option<IpAddr>,
    meter: Option<Meter>,
    /// The [`GENERATION`] `meter` was looked up in.
    seen: u64,
    /// The response's own limit (`[[rule]] bandwidth`), kept to on top of
    /// the client's and the total's; a reload does not change it.
    route: Option<RouteLimit>,
}

/// A route's `bandwidth` for one response (nginx's `limit_rate` and
/// `limit_rate_after` in a `location`): a bucket of its own, not shared.
#[derive(Debug, Clone)]
struct RouteLimit {
    /// Bytes a second.
    rate: f64,
    bucket: Bucket,
    /// Bytes still to be sent before the rate applies
    /// (`bandwidth_after`).
    free: u64,
}

impl RouteLimit {
    /// Takes `n` bytes at `now`: the microseconds the write must wait.
    /// The rate starts when the free bytes run out, with a piece in hand:
    /// what they took to send does not count as time the response fell
    /// behind.
    fn take(&mut self, n: u64, now: u64) -> u64 {
        if self.free > 0 {
            let free = n.min(self.free);
            self.free -= free;
            if self.free > 0 {
                return 0;
            }
            self.bucket = Bucket {
                tokens: self.rate_piece() as f64,
                at_us: now,
            };
            return take(&mut self.bucket, n - free, now, self.rate, self.rate);
        }
        take(&mut self.bucket, n, now, self.rate, self.rate)
    }

    /// The largest piece to write at once: while bytes are free, as many
    /// of them as a piece may carry (64 KiB at most); then an eighth of a
    /// second's worth, as [`Meter::piece`].
    fn piece(&self) -> usize {
        let free = usize::try_from(self.free).unwrap_or(usize::MAX);
        self.rate_piece().max(free.min(MAX_PIECE))
    }

    /// An eighth of a second's worth of the rate, 1 to 64 KiB.
    fn rate_piece(&self) -> usize {
        ((self.rate / 8.0) as usize).clamp(MIN_PIECE, MAX_PIECE)
    }
}

impl Pacer {
    /// The pacer of the writes to the client at `ip`; `known`: where the
    /// connection's earlier response found its bucket ([`Pacer::known`]).
    pub(crate) fn new(ip: IpAddr, known: crate::shared_buckets::KnownPlace) -> Pacer {
        let seen = GENERATION.load(Ordering::Acquire);
        Pacer {
            ip: Some(ip),
            meter: meter(ip, known),
            seen,
            route: None,
        }
    }

    /// Where the client's bucket was found, for the connection's next
    /// response (a reload's new rate makes it stale, which that response
    /// sees).
    pub(crate) fn known(&self) -> crate::shared_buckets::KnownPlace {
        self.meter.and_then(|m| m.client).map(|c| c.place).unwrap_or_default()
    }

    /// Keeps what goes through this pacer to `rate` bytes a second as
    /// well, but for its first `after` bytes (a route's `bandwidth` and
    /// `bandwidth_after`); `rate` 0: no such limit (a later rule lifted
    /// it). The rate starts with a piece in hand, so the first write after
    /// the free bytes goes at once.
    pub(crate) fn limit_route(&mut self, rate: u64, after: u64) {
        self.route = (rate > 0).then(|| {
            let mut limit = RouteLimit {
                rate: rate as f64,
                bucket: Bucket {
                    tokens: 0.0,
                    at_us: now_us(),
                },
                free: after,
            };
            limit.bucket.tokens = limit.rate_piece() as f64;
            limit
        });
    }

    /// A pacer that never waits: for what goes to no client (a tunnel's
    /// way up), and a writer no client was named for.
    pub(crate) fn unpaced() -> Pacer {
        Pacer {
            ip: None,
            meter: None,
            seen: 0,
            route: None,
        }
    }

    /// The meter in force for the client now (None: unpaced).
    fn meter(&mut self) -> Option<&Meter> {
        let ip = self.ip?;
        let now = GENERATION.load(Ordering::Acquire);
        if now != self.seen {
            self.seen = now;
            self.meter = meter(ip, self.known());
        }
        self.meter.as_ref()
    }

    /// The largest piece a write should send at once (None: unpaced): the
    /// smaller of the client's ([`Meter::piece`]) and the route's.
    pub fn piece(&mut self) -> Option<usize> {
        let route = self.route.as_ref().map(RouteLimit::piece);
        let shared = self.meter().map(|m| m.piece());
        match (shared, route) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// How much a relay loop reads at once, `most` at most: a piece of
    /// the bandwidth when it is paced.
    pub fn read_size(&mut self, most: usize) -> usize {
        self.piece().map_or(most, |p| p.min(most))
    }

    /// Waits until `n` bytes may be sent (at once when unpaced): for the
    /// longest of the client's, the total's and the route's debts, each
    /// counted where it is longest. True when a limit was in force (the
    /// caller may have waited).
    pub async fn pace(&mut self, n: usize) -> bool {
        if self.meter().is_none() && self.route.is_none() {
            return false;
        }
        if n == 0 {
            return true;
        }
        let shared = self.meter.as_mut().map_or(Debt::NONE, |m| m.take(n));
        let route_us = self.route.as_mut().map_or(0, |r| r.take(n as u64, now_us()));
        let wait_us = shared.wait_us.max(route_us);
        if wait_us == 0 {
            return true;
        }
        let waits = if shared.wait_us >= route_us {
            shared.waits
        } else {
            &ROUTE_WAITS
        };
        waits.add(wait_us);
        let _pacing = shared.on_total.then(Pacing::new);
        tokio::time::sleep(std::time::Duration::from_micros(wait_us)).await;
        true
    }
}

/// What a write owes the client's and the total's buckets.
struct Debt {
    /// Microseconds to wait before sending: the longer of the two debts.
    wait_us: u64,
    /// Where a wait counts: the total's when its debt was the longer,
    /// else the client's.
    waits: &'static Waits,
    /// The write took from the total and owes it.
    on_total: bool,
}

impl Debt {
    const NONE: Debt = Debt {
        wait_us: 0,
        waits: &CLIENT_WAITS,
        on_total: false,
    };
}

impl Meter {
    /// The largest piece a paced write should send at once: an eighth of a
    /// second's worth of the lower rate it keeps to, between 1 and 64 KiB
    /// (64 KiB once a reload lifted the limits). The total's share is
    /// divided among the writes waiting on it.
    pub fn piece(&self) -> usize {
        let own = self.client.map_or(0, |c| c.rate);
        let total = TOTAL_RATE.load(Ordering::Relaxed) / (1 + TOTAL_PACING.load(Ordering::Relaxed));
        let rate = [own, total].into_iter().filter(|r| *r > 0).min();
        match rate.map(|r| usize::try_from(r).unwrap_or(usize::MAX)) {
            None => MAX_PIECE,
            Some(rate) => (rate / 8).clamp(MIN_PIECE, MAX_PIECE),
        }
    }

    /// Takes `n` bytes now from the client's bucket and from the total's:
    /// what the write owes (nothing once a reload set the total's rate to 0;
    /// a reload that changes the client's makes a new meter, [`GENERATION`]).
    fn take(&mut self, n: usize) -> Debt {
        let rate = self.client.map_or(0, |c| c.rate);
        let total_rate = TOTAL_RATE.load(Ordering::Relaxed) as f64;
        if rate == 0 && total_rate <= 0.0 {
            return Debt::NONE;
        }
        // Both shared with the other worker processes, on their clock.
        // Whole microseconds down: a take's span is rounded up to the
        // nanosecond, which must not make a write in the burst wait.
        let now = crate::shared_buckets::now_ns();
        let own_us = match self.client.as_mut() {
            Some(c) => {
                let place = c.place.of(bucket(c.rate), c.key);
                crate::shared_buckets::client_at(place, now).take_owing(n as f64, now, c.rate as f64, burst()) / 1000
            }
            None => 0,
        };
        let total_us = if total_rate > 0.0 {
            crate::shared_buckets::total_bandwidth().take_owing(n as f64, now, total_rate, total_burst()) / 1000
        } else {
            0
        };
        Debt {
            wait_us: own_us.max(total_us),
            waits: if total_us > own_us { &TOTAL_WAITS } else { &CLIENT_WAITS },
            on_total: total_us > 0,
        }
    }
}

/// A write waiting on the total, counted while it lives (a cancelled write too).
struct Pacing;

impl Pacing {
    fn new() -> Pacing {
        TOTAL_PACING.fetch_add(1, Ordering::Relaxed);
        Pacing
    }
}

impl Drop for Pacing {
    fn drop(&mut self) {
        TOTAL_PACING.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: f64 = 1000.0;
    const BURST: f64 = 500.0;

    fn full() -> Bucket {
        Bucket {
            tokens: BURST,
            at_us: 0,
        }
    }

    #[test]
    fn a_routes_first_bytes_after_go_at_once_then_the_rate_holds() {
        let mut r = RouteLimit {
            rate: 64_000.0,
            bucket: Bucket { tokens: 0.0, at_us: 0 },
            free: 150_000,
        };
        assert_eq!(r.take(100_000, 0), 0);
        // However long the free bytes took, the rate starts when they run
        // out, with a piece (8,000) in hand: of 80,000, 50,000 are free,
        // 8,000 in hand, 22,000 wait.
        assert_eq!(r.take(80_000, 10_000_000), 343_750);
        assert_eq!(r.free, 0);
        // A response that fell behind catches up by a second's worth, no more.
        assert_eq!(r.take(0, 100_000_000), 0);
        assert_eq!(r.bucket.tokens, 64_000.0);
    }

    #[test]
    fn a_routes_free_bytes_go_in_pieces_as_large_as_they_allow() {
        let mut r = RouteLimit {
            rate: 8192.0,
            bucket: Bucket { tokens: 0.0, at_us: 0 },
            free: 1 << 20,
        };
        assert_eq!(r.piece(), MAX_PIECE);
        r.free = 3000;
        assert_eq!(r.piece(), 3000);
        r.free = 0;
        assert_eq!(r.piece(), 1024);
    }

    #[test]
    fn a_routes_pieces_are_an_eighth_of_a_second_between_1_and_64_kib() {
        let piece = |rate: f64| {
            RouteLimit {
                rate,
                bucket: Bucket { tokens: 0.0, at_us: 0 },
                free: 0,
            }
            .piece()
        };
        assert_eq!(piece(64.0 * 1024.0), 8 << 10);
        assert_eq!(piece(2048.0), MIN_PIECE);
        assert_eq!(piece(100e6), MAX_PIECE);
    }

    #[test]
    fn a_full_bucket_sends_its_burst_at_once() {
        let mut b = full();
        assert_eq!(take(&mut b, 300, 0, RATE, BURST), 0);
        assert_eq!(take(&mut b, 200, 0, RATE, BURST), 0);
        assert_eq!(b.tokens, 0.0);
    }

    #[test]
    fn bytes_past_the_bucket_wait_as_long_as_the_rate_takes_to_bring_them() {
        let mut b = full();
        // 500 in hand, 800 asked: 300 owed at 1000 a second.
        assert_eq!(take(&mut b, 800, 0, RATE, BURST), 300_000);
        // A second writer of the same client queues behind the debt.
        assert_eq!(take(&mut b, 100, 0, RATE, BURST), 400_000);
        // 400 ms later the debt is paid, and nothing more is in hand.
        assert_eq!(take(&mut b, 0, 400_000, RATE, BURST), 0);
        assert!(b.tokens.abs() < 1e-6);
    }

    #[test]
    fn over_time_the_bytes_sent_keep_to_the_rate() {
        // A writer that sends 64-byte pieces as fast as it may for 10 s.
        let mut b = full();
        let (mut now, mut sent) = (0u64, 0u64);
        while now < 10_000_000 {
            now += take(&mut b, 64, now, RATE, BURST);
            sent += 64;
        }
        // The burst, and the rate for 10 s, to within a piece.
        let expected = BURST + RATE * 10.0;
        assert!(
            (sent as f64 - expected).abs() <= 64.0,
            "{sent} sent, {expected} expected"
        );
    }

    #[test]
    fn an_idle_client_gets_back_no_more_than_the_burst() {
        let mut b = full();
        take(&mut b, 500, 0, RATE, BURST);
        refill(&mut b, 3_600_000_000, RATE, BURST);
        assert_eq!(b.tokens, BURST);
    }

    #[test]
    fn a_clock_that_seems_to_go_back_takes_nothing_back() {
        let mut b = Bucket {
            tokens: 0.0,
            at_us: 1_000_000,
        };
        assert_eq!(take(&mut b, 100, 500_000, RATE, BURST), 100_000);
        assert_eq!(b.at_us, 1_000_000);
    }
}
