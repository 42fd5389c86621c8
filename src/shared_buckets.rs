//! The buckets of the limits that are for all clients together
//! (`limits.total_bandwidth`, a route's `total_request_rate`) and of those
//! per client (`limits.client_request_rate`, a route's `request_rate`,
//! `limits.client_bandwidth`), shared by the worker processes (`server.processes = N >
//! 1`), so that N workers keep to the rate the configuration names, not N
//! times it (as nginx keeps a `limit_req` zone in shared memory).
//!
//! A bucket is one atomic number: its "theoretical arrival time" (the
//! generic cell rate algorithm of ATM networks, ITU-T I.371: a token bucket
//! in another form), the instant in nanoseconds of [`now_ns`]'s clock at
//! which the bucket would be back to empty. `now - tat` is what it holds, in time:
//! times the rate, its tokens, at most `burst`; a `tat` after `now` is a
//! debt. Taking is one compare-and-swap, which another process may do at
//! the same time on the same bucket, and `CLOCK_MONOTONIC` is one clock for
//! every process of the machine. A bucket at 0 is full ([`now_ns`] starts
//! far enough from 0 for any burst).
//!
//! The supervisor makes a memory file (`memfd_create`) of [`SLOTS`] buckets
//! (and as many tags: which rule list put a route's bucket in force, see
//! [`Bucket::put_in_force`]) and hands it to each worker it starts
//! (inherited, its number in [`ENV_FD`]); the worker maps it shared. A
//! single process, or a worker that cannot map it (it then says so), keeps
//! buckets of its own.
//!
//! The clients' buckets are a table of `limits.client_table` slots in the same
//! memory, each a tag and a bucket: a client's bucket for a limit is in one
//! of the [`WINDOW`] slots from where a SipHash of both, keyed by a secret
//! drawn once (also in the memory), points, and is tagged with that hash
//! (39 bits of it, and a bit always set) and the second it was last looked
//! up in (24 bits, the rest of the word, [`STAMP`]). Finding it reads the tags; a new client
//! takes an empty slot, else the least recently used, one still in debt
//! last (its client starts afresh), by compare-and-swap on its tag. (The theoretical arrival times
//! of buckets of different limits do not tell which was used last: a long
//! burst's bucket in use can have an older one than a short burst's left
//! idle for seconds.) No lock: a process taking from a bucket just given to another
//! client charges that client one request (or one piece of a response,
//! `client_bandwidth`), and two processes giving one
//! client a slot at once both use the first in its window from then on.
//! A word marks the layout: a worker of another build (the binary
//! upgraded under a running supervisor) keeps buckets of its own.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the inherited memory file to a worker.
pub const ENV_FD: &str = "PORTICO_BUCKETS_FD";

/// How many buckets there are: `total_bandwidth`'s, then the routes'.
pub const SLOTS: usize = 1024;

/// How many clients' buckets there are room for, for the limits kept per
/// client (`limits.client_request_rate`, a route's `request_rate`,
/// `limits.client_bandwidth`), unless [`set_client_table`] says otherwise
/// (`limits.client_table`): 16 bytes each with their tags, touched a page
/// at a time as clients come.
static CLIENTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1 << 18);

/// Sets the number of clients' buckets a table of this process's own has
/// room for (`limits.client_table`), before the first request: the
/// supervisor's memory file is made with as many
/// ([`create`]), and a worker's table is the one it maps.
pub fn set_client_table(n: usize) {
    CLIENTS.store(n.max(WINDOW), Ordering::Relaxed);
}

/// The slots a client's bucket may be in: this many, from the one its
/// hash names.
const WINDOW: usize = 8;

/// The words of the memory: the buckets, then a tag for each; a word
/// naming this layout (a worker of another build does not misread it);
/// then the clients' memory: the secret the clients' slots are hashed
/// with, and the clients' slots, each a tag and its bucket side by side
/// (one cache line holds both).
const LAYOUT: usize = 2 * SLOTS;
const SECRET: usize = LAYOUT + 1;

/// The words of a memory with room for `clients` clients' buckets.
const fn words_for(clients: usize) -> usize {
    SECRET + 1 + 2 * clients
}

/// How many clients' slots the clients' memory `words` has.
fn clients_in(words: &[AtomicU64]) -> usize {
    (words.len().saturating_sub(1) / 2).max(1)
}

/// What the [`LAYOUT`] word holds: "portico" and a version, changed with
/// the layout or the clients' hash.
const LAYOUT_MARK: u64 = u64::from_be_bytes(*b"portic\x00\x04");

/// The bits of a client slot's tag word that hold the second it was last
/// looked up in (of [`now_ns`]'s clock, modulo 2^24: 194 days); the others
/// are the tag proper, [`TAG_SET`] always among them (an empty slot's
/// word is 0).
const STAMP: u64 = (1 << 24) - 1;
/// A bit of every tag.
const TAG_SET: u64 = 1 << 24;

/// The stamp of `now` (nanoseconds, [`now_ns`]).
fn stamp(now: u64) -> u64 {
    (now / 1_000_000_000) & STAMP
}

/// Seconds from the stamp `then` to `now`'s (modulo 2^24); 0 for a stamp
/// ahead of `now` (another process stamped the slot in the next second
/// after this one read its clock), which would otherwise look 194 days
/// old.
fn age(then: u64, now: u64) -> u64 {
    let d = stamp(now).wrapping_sub(then) & STAMP;
    if d >= 1 << 23 { 0 } else { d }
}

/// Client slot `i`'s tag (0: empty), in the clients' memory `words`.
fn client_tag(words: &[AtomicU64], i: usize) -> &AtomicU64 {
    &words[1 + 2 * i]
}

/// Client slot `i`'s bucket.
fn client_bucket(words: &[AtomicU64], i: usize) -> &AtomicU64 {
    &words[2 + 2 * i]
}

/// Buckets of clients given to other clients while in use (looked up
/// within the last second or two), since start: the table is too small.
static EVICTED: AtomicU64 = AtomicU64::new(0);

/// Buckets given to other clients while in use, since start.
pub fn evicted() -> u64 {
    EVICTED.load(Ordering::Relaxed)
}

/// When a client's bucket was last given to another while in use (looked
/// up within the last second or two; the table full where they hash):
/// logged at most once a second.
static EVICTED_LOGGED: AtomicU64 = AtomicU64::new(0);

/// The bucket of `limits.total_bandwidth`.
pub const TOTAL_BANDWIDTH: usize = 0;

/// The first route's `total_request_rate` bucket: the K-th rule that sets
/// one (in the rule list's order) has bucket `ROUTES + K`, so every worker
/// reading the same configuration finds it in the same place.
pub const ROUTES: usize = 1;

/// Why this worker could not map the buckets it was handed, if so.
static NOT_MAPPED: OnceLock<String> = OnceLock::new();

/// The memory shared with the other workers, if this is a worker that
/// could map it.
fn shared() -> Option<&'static [AtomicU64]> {
    static SHARED: OnceLock<Option<&'static [AtomicU64]>> = OnceLock::new();
    *SHARED.get_or_init(|| match inherited() {
        Some(Ok(shared)) => Some(shared),
        Some(Err(e)) => {
            // Said by `report`: the first use may come before the error
            // log is open (the config check compiles the rules).
            let _ = NOT_MAPPED.set(e);
            None
        }
        None => None,
    })
}

/// The buckets of the limits for all clients and their tags: shared with
/// the other workers, or this process's own.
fn slots() -> &'static [AtomicU64] {
    static OWN: [AtomicU64; SECRET] = [const { AtomicU64::new(0) }; SECRET];
    shared().unwrap_or(&OWN)
}

/// The clients' memory (the secret, then the slots): shared with the
/// other workers, or this process's own, made at its first use (a
/// request, after [`set_client_table`]).
fn clients() -> &'static [AtomicU64] {
    static OWN: OnceLock<&'static [AtomicU64]> = OnceLock::new();
    match shared() {
        Some(words) => &words[SECRET..],
        None => OWN.get_or_init(|| crate::handover::zeroed_words(1 + 2 * CLIENTS.load(Ordering::Relaxed))),
    }
}

/// Maps the buckets now if nothing has yet, and says in the error log if
/// this worker could not: called once the log is open.
pub fn report() {
    shared();
    if let Some(e) = NOT_MAPPED.get() {
        tracing::warn!(
            "cannot map the limits' buckets shared with the other workers ({e}): this worker keeps \
             limits.total_bandwidth, limits.client_bandwidth, limits.client_request_rate and the routes' total_request_rate and \
             request_rate on its own"
        );
    }
}

/// The memory file a supervisor handed this worker, mapped: None when
/// this is no worker or none was handed.
fn inherited() -> Option<Result<&'static [AtomicU64], String>> {
    std::env::var_os(crate::notify::WORKER_KEY)?;
    let mapped = crate::handover::map_inherited(ENV_FD, words_for(WINDOW))?;
    Some(mapped.and_then(laid_out))
}

/// Maps the memory file `fd` as the buckets.
#[cfg(test)]
fn map(fd: std::os::fd::RawFd) -> Result<&'static [AtomicU64], String> {
    crate::handover::map_whole(fd, words_for(WINDOW)).and_then(laid_out)
}

/// `words` if they are laid out as this build lays them out (else this
/// worker keeps buckets of its own).
fn laid_out(words: &'static [AtomicU64]) -> Result<&'static [AtomicU64], String> {
    crate::handover::check_mark(words, LAYOUT, LAYOUT_MARK).map(|()| words)
}

/// Makes the memory file the supervisor hands its workers: [`SLOTS`]
/// buckets, all full (zero), and their tags, the layout's mark, room for
/// the secret and `clients` clients' slots; close-on-exec (each worker is
/// made to inherit it as it starts, `handover`), never executable, and
/// sealed at its size (a holder that shrank it would
/// crash every worker with SIGBUS). Its number goes in [`ENV_FD`]; it
/// stays open in the supervisor, so a worker restarted later gets the
/// same one.
pub fn create(clients: usize) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::FileExt;
    let len = words_for(clients.max(WINDOW)) * std::mem::size_of::<AtomicU64>();
    let file = crate::handover::shared_memory(c"portico-buckets", len)?;
    file.write_all_at(
        &LAYOUT_MARK.to_ne_bytes(),
        (LAYOUT * std::mem::size_of::<AtomicU64>()) as u64,
    )?;
    Ok(file.into())
}

/// Nanoseconds of `CLOCK_MONOTONIC` (one clock for every process), plus
/// 2^60 (36 years): a bucket at 0 is then full whatever its burst, also
/// just after the machine booted.
pub fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the `timespec` it is given, which lives
    // for the call; CLOCK_MONOTONIC is always there on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
        .saturating_add(1 << 60)
}

/// The bucket of `limits.total_bandwidth`.
pub fn total_bandwidth() -> Bucket {
    Bucket(Slot::Shared(
        &slots()[TOTAL_BANDWIDTH],
        &slots()[SLOTS + TOTAL_BANDWIDTH],
    ))
}

/// The `total_request_rate` bucket of the `k`-th rule that sets one
/// (counting from 0): shared by the workers for the first
/// `SLOTS - ROUTES`, this process's own past them. Left as it is: see
/// [`Bucket::fill`].
pub fn route(k: usize) -> Bucket {
    let i = ROUTES + k;
    if i < SLOTS {
        Bucket(Slot::Shared(&slots()[i], &slots()[SLOTS + i]))
    } else {
        Bucket::own()
    }
}

/// Which limit kept per client a bucket is for: `(0, 0)` for
/// `limits.client_request_rate`; `(0, R)` for `limits.client_bandwidth` at
/// R bytes a second (at least 1024), so that a reload changing the rate
/// starts its buckets afresh; a route's `request_rate` names its rule
/// list (a hash of it) and its rule, so that a reload changing the rules
/// starts their buckets afresh and one keeping them keeps them.
pub type ClientLimit = (u64, u64);

/// The secret the clients' slots are hashed with, drawn by the first
/// process to need it and the same in every worker (it is in the shared
/// memory): a client cannot choose addresses that land where another's
/// bucket is.
fn secret(words: &[AtomicU64]) -> u64 {
    secret_in(&words[0])
}

/// The secret `word` holds, drawn now (never 0) if it holds none yet: by
/// whichever process of those sharing it comes first.
pub(crate) fn secret_in(word: &AtomicU64) -> u64 {
    let seen = word.load(Ordering::Acquire);
    if seen != 0 {
        return seen;
    }
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    let drawn = match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        // No randomness from the system: the clock, at worst guessable.
        Err(_) => now_ns() ^ u64::from(std::process::id()).rotate_left(32),
    } | 1;
    match word.compare_exchange(0, drawn, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => drawn,
        Err(seen) => seen,
    }
}

/// Where a client's bucket for a limit is looked for in `words`.
fn client_place(words: &[AtomicU64], limit: ClientLimit, client: u128) -> Place {
    use std::hash::Hasher;
    // SipHash-2-4 keyed by the secret: std's `SipHasher`, deprecated in
    // favour of `DefaultHasher`, whose algorithm may change between Rust
    // releases; this one is fixed, so processes of two builds sharing the
    // memory place a client alike.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(secret(words), LAYOUT_MARK);
    h.write_u64(limit.0);
    h.write_u64(limit.1);
    h.write_u128(client);
    let hash = h.finish();
    Place {
        start: (hash >> 32) as usize % clients_in(words),
        tag: (hash & !STAMP) | TAG_SET,
    }
}

/// Whether the tag word `word` (stamp and all) holds `tag`.
fn holds(word: u64, tag: u64) -> bool {
    word & !STAMP == tag
}

/// The slots of the window starting at `start` in a table of `n`, in order.
fn window(start: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..WINDOW).map(move |i| (start + i) % n)
}

/// The bucket of `client` (`client_limit::key`) for `limit`, if it has
/// one: a client without one has a full bucket.
pub fn client_if_any(limit: ClientLimit, client: u128) -> Option<Bucket> {
    client_if_any_in(clients(), limit, client)
}

/// [`client_if_any`] in `words`.
fn client_if_any_in(words: &'static [AtomicU64], limit: ClientLimit, client: u128) -> Option<Bucket> {
    let Place { start, tag } = client_place(words, limit, client);
    window(start, clients_in(words))
        .find(|&i| holds(client_tag(words, i).load(Ordering::Acquire), tag))
        .map(|i| Bucket(Slot::Shared(client_bucket(words, i), client_tag(words, i))))
}

/// Where the bucket of a client for a limit is looked for: the first slot
/// of its window (a SipHash of both, keyed by the secret) and its tag
/// (never 0, an empty slot's). Found once and kept ([`KnownPlace`]) by a
/// connection for its requests and by a meter for its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    start: usize,
    tag: u64,
}

/// The [`Place`] of `client`'s bucket for `limit`.
pub fn place(limit: ClientLimit, client: u128) -> Place {
    client_place(clients(), limit, client)
}

/// The [`Place`] a connection found last for one limit of its client,
/// kept between its requests: a keep-alive client's requests then hash
/// once (a SipHash of a limit and a client is about 400 instructions; a
/// memory-tier hit about 24,000). Kept with the limit and the client it
/// is for, so that a reload that changes the limit (its name carries the
/// bandwidth's rate) finds it stale and looks again.
#[derive(Debug, Default, Clone, Copy)]
pub struct KnownPlace(Option<(ClientLimit, u128, Place)>);

impl KnownPlace {
    /// The place of `client`'s bucket for `limit`: the one kept, if it is
    /// theirs; else found ([`place`]) and kept.
    pub fn of(&mut self, limit: ClientLimit, client: u128) -> Place {
        match self.0 {
            Some((l, c, p)) if l == limit && c == client => p,
            _ => {
                let p = place(limit, client);
                self.0 = Some((limit, client, p));
                p
            }
        }
    }
}

/// The bucket of the client and limit at `place`, shared by the worker
/// processes: the one it has (its slot stamped with `now`'s second), or a
/// full one in a slot of its window: an empty one, else the least
/// recently used (as nginx drops the least recently used state of a full
/// `limit_req` zone; one still in debt last, since giving it away forgives
/// the debt; of those looked up in the same second, the one with the
/// earliest theoretical arrival time), whose client starts afresh;
/// logged, at most once a second, when that bucket had been looked up
/// within the last second or two. Two processes giving the same client a
/// slot at once both end on the first in its window: the other is given
/// up.
pub fn client_at(place: Place, now: u64) -> Bucket {
    client_placed(clients(), place, now)
}

/// [`client_at`] in `words`, for `client` and `limit`.
#[cfg(test)]
fn client_in(words: &'static [AtomicU64], limit: ClientLimit, client: u128, now: u64) -> Bucket {
    client_placed(words, client_place(words, limit, client), now)
}

/// [`client_at`] in `words`.
fn client_placed(words: &'static [AtomicU64], place: Place, now: u64) -> Bucket {
    let Place { start, tag } = place;
    let n = clients_in(words);
    let bucket = |i: usize| Bucket(Slot::Shared(client_bucket(words, i), client_tag(words, i)));
    for _ in 0..WINDOW {
        // Its slot, or the one to take (the first in the window of those
        // alike). Empty slots are all alike, their buckets not looked at,
        // so two processes choosing at once choose the same one and one
        // of them loses it.
        // The tags first, up to its own: a client that has a slot (nearly
        // always) costs no look at the buckets, nor at the tags past its.
        let found = window(start, n)
            .map(|i| (i, client_tag(words, i).load(Ordering::Acquire)))
            .find(|&(_, seen)| holds(seen, tag));
        if let Some((i, seen)) = found {
            // Once a second at most. Lost to another process's stamp, it
            // is theirs that counts; to another client's taking the slot,
            // look again.
            if seen & STAMP != stamp(now)
                && let Err(now_there) =
                    client_tag(words, i).compare_exchange(seen, tag | stamp(now), Ordering::AcqRel, Ordering::Acquire)
                && !holds(now_there, tag)
            {
                continue;
            }
            return bucket(i);
        }
        // Empty first, then one not in debt (given away, a debt would be
        // forgiven), then the longest unused, then the earliest
        // theoretical arrival time.
        let mut take: Option<(usize, u64, u64)> = None;
        let rank = |seen: u64, held: u64| (seen != 0, held > now, std::cmp::Reverse(age(seen & STAMP, now)), held);
        for i in window(start, n) {
            let seen = client_tag(words, i).load(Ordering::Acquire);
            let held = if seen == 0 {
                0
            } else {
                client_bucket(words, i).load(Ordering::Acquire)
            };
            if take.is_none_or(|(_, best_seen, best_held)| rank(seen, held) < rank(best_seen, best_held)) {
                take = Some((i, seen, held));
            }
        }
        let Some((free, old, held)) = take else {
            break;
        };
        // Taken only as it was seen: if another process changed it since,
        // look again. (Sequentially consistent, as the look below: two
        // processes taking slots for one client at once each see the
        // other's, whatever the processor.)
        if client_tag(words, free)
            .compare_exchange(old, tag | stamp(now), Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            continue;
        }
        if old != 0 {
            // Full for its new client: reset from what was seen when it was
            // chosen, so that a take made since, by a request that found
            // the new tag, stays.
            let _ = client_bucket(words, free).compare_exchange(held, 0, Ordering::AcqRel, Ordering::Acquire);
            if age(old & STAMP, now) <= 1 {
                EVICTED.fetch_add(1, Ordering::Relaxed);
                if crate::util::log_due(&EVICTED_LOGGED) {
                    tracing::warn!(
                        "the table of per-client buckets (request rates, bandwidth; limits.client_table = {n}) is \
                         full where a new client hashes: a bucket in use was given to it (its client starts \
                         afresh; logged at most once a second, counted as the perfdump's Client Table Evictions)"
                    );
                }
            }
        }
        // Another process may have given this client a slot meanwhile:
        // the first in the window is the one; ours goes back, empty.
        match window(start, n).find(|&i| holds(client_tag(words, i).load(Ordering::SeqCst), tag)) {
            Some(first) if first != free => {
                // Ours unless another process took it since (whatever
                // stamp it has now).
                let given_back = client_tag(words, free)
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| holds(w, tag).then_some(0));
                if given_back.is_ok() {
                    client_bucket(words, free).store(0, Ordering::Release);
                }
                return bucket(first);
            }
            _ => return bucket(free),
        }
    }
    // Every try lost to other processes: a bucket of its own this once.
    Bucket::own()
}

/// One bucket: its theoretical arrival time (see the module's text).
#[derive(Debug, Clone)]
pub struct Bucket(Slot);

impl Bucket {
    /// A bucket of its own, full, shared with nothing.
    pub fn own() -> Bucket {
        Bucket(Slot::Own(std::sync::Arc::new(AtomicU64::new(0))))
    }
}

#[derive(Debug, Clone)]
enum Slot {
    /// In the buckets (shared with the other workers when they are), and
    /// its tag.
    Shared(&'static AtomicU64, &'static AtomicU64),
    /// Of its own (a route past the shared ones).
    Own(std::sync::Arc<AtomicU64>),
}

impl Slot {
    fn get(&self) -> &AtomicU64 {
        match self {
            Slot::Shared(a, _) => a,
            Slot::Own(a) => a,
        }
    }
}

/// Nanoseconds `n` units take at `rate` units a second (rounded up).
fn span_ns(n: f64, rate: f64) -> u64 {
    (n / rate * 1e9).ceil() as u64
}

impl Bucket {
    /// Takes `n` units at `now` (nanoseconds), into debt if need be, from a
    /// bucket of `burst` units refilled at `rate` a second: the
    /// nanoseconds the taker must wait before it uses them (0: at once).
    pub fn take_owing(&self, n: f64, now: u64, rate: f64, burst: f64) -> u64 {
        take_owing(self.0.get(), n, now, rate, burst)
    }

    /// Takes one unit at `now` if the bucket has one (`take`), or looks
    /// whether it has, taking nothing: Ok, or Err(nanoseconds until it has
    /// one).
    pub fn take_one(&self, now: u64, rate: f64, burst: f64, take: bool) -> Result<(), u64> {
        take_one(self.0.get(), now, rate, burst, take)
    }

    /// Gives back a unit [`Bucket::take_one`] took (another limit refused
    /// the request after all).
    pub fn give_back_one(&self, rate: f64) {
        let t = span_ns(1.0, rate);
        let _ = self
            .0
            .get()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| Some(tat.saturating_sub(t)));
    }

    /// Fills the bucket (a new limit starts full).
    pub fn fill(&self) {
        self.0.get().store(0, Ordering::Release);
    }

    /// Puts the bucket in force for the rule list `tag` names (a hash of
    /// it, not 0). At a reload (`fill`): filled unless it is in force for
    /// that list already. Each worker process puts its rules in force on
    /// its own: only the first fills the bucket they share, so the others
    /// do not forgive what was taken meanwhile; and a reload back to the
    /// rules in force (after one that failed) fills nothing. At start (not
    /// `fill`): left as the workers hold it, and tagged only if no list
    /// claimed it yet, so that a worker restarted on a file edited since
    /// does not keep the next reload from filling it.
    pub fn put_in_force(&self, tag: u64, fill: bool) {
        let first = match &self.0 {
            Slot::Shared(_, t) if fill => t.swap(tag, Ordering::AcqRel) != tag,
            Slot::Shared(_, t) => {
                let _ = t.compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire);
                false
            }
            Slot::Own(_) => true,
        };
        if first && fill {
            self.fill();
        }
    }

    /// Pays a debt run up at `old` units a second at `new` instead (a
    /// reload that raised the rate): what it owes in units is the same.
    /// Each worker process reloads on its own, so with N of them the debt
    /// shrinks N times over: forgiven sooner, never made longer.
    pub fn rescale_debt(&self, now: u64, old: f64, new: f64) {
        let _ = self.0.get().fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
            Some(if tat > now {
                now + ((tat - now) as f64 * old / new) as u64
            } else {
                tat
            })
        });
    }

    /// Cuts a debt to what `most` units take at `rate` (a reload that
    /// lowered the rate: a debt run up at the old one is not paid back at
    /// the new one for minutes).
    pub fn cap_debt(&self, now: u64, most: f64, rate: f64) {
        let cap = now.saturating_add(span_ns(most, rate));
        let _ = self
            .0
            .get()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| Some(tat.min(cap)));
    }
}

/// The time `tat` stands for at `now`, a full bucket's at most: a bucket
/// that was full for longer holds no more than `full` nanoseconds' worth.
fn refilled(tat: u64, now: u64, full: u64) -> u64 {
    tat.max(now.saturating_sub(full))
}

/// See [`Bucket::take_owing`].
fn take_owing(a: &AtomicU64, n: f64, now: u64, rate: f64, burst: f64) -> u64 {
    // The burst's span and a take's are each rounded up to the nanosecond:
    // takes that add up to the burst may owe a nanosecond or so, which
    // `client_bandwidth` drops (it waits in whole microseconds).
    let full = span_ns(burst, rate);
    let mut tat = a.load(Ordering::Acquire);
    loop {
        let new = refilled(tat, now, full).saturating_add(span_ns(n, rate));
        match a.compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return new.saturating_sub(now),
            Err(seen) => tat = seen,
        }
    }
}

/// See [`Bucket::take_one`].
fn take_one(a: &AtomicU64, now: u64, rate: f64, burst: f64, take: bool) -> Result<(), u64> {
    // The burst in the same rounded units as a take adds: a full bucket
    // lets exactly `burst` through.
    let unit = span_ns(1.0, rate);
    let full = (burst * unit as f64) as u64;
    let mut tat = a.load(Ordering::Acquire);
    loop {
        let new = refilled(tat, now, full).saturating_add(unit);
        if new > now {
            return Err(new - now);
        }
        if !take {
            return Ok(());
        }
        match a.compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(seen) => tat = seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_full_bucket_lets_its_burst_through_then_one_a_rate_period() {
        let a = AtomicU64::new(0);
        let now = 100 * S;
        for _ in 0..3 {
            assert_eq!(take_one(&a, now, 2.0, 3.0, true), Ok(()));
        }
        // Empty: the next one in half a second at 2 a second.
        assert_eq!(take_one(&a, now, 2.0, 3.0, true), Err(S / 2));
        assert_eq!(take_one(&a, now + S / 4, 2.0, 3.0, true), Err(S / 4));
        // A look takes nothing.
        assert_eq!(take_one(&a, now + S / 2, 2.0, 3.0, false), Ok(()));
        assert_eq!(take_one(&a, now + S / 2, 2.0, 3.0, true), Ok(()));
        assert_eq!(take_one(&a, now + S / 2, 2.0, 3.0, true), Err(S / 2));
        // A long quiet fills it to its burst, no more.
        for _ in 0..3 {
            assert_eq!(take_one(&a, now + 60 * S, 2.0, 3.0, true), Ok(()));
        }
        assert!(take_one(&a, now + 60 * S, 2.0, 3.0, true).is_err());
    }

    /// A rate whose period is no whole number of nanoseconds (a third of
    /// a second) still lets the whole burst through.
    #[test]
    fn a_full_bucket_lets_its_whole_burst_through_at_any_rate() {
        for rate in [3.0_f64, 7.0, 30.0, 300.0, 999_999.0] {
            let a = AtomicU64::new(0);
            let now = now_ns();
            let burst = rate.min(1000.0);
            for i in 0..burst as usize {
                assert_eq!(take_one(&a, now, rate, burst, true), Ok(()), "rate {rate}, request {i}");
            }
            assert!(
                take_one(&a, now, rate, burst, true).is_err(),
                "rate {rate}: past the burst"
            );
        }
    }

    #[test]
    fn a_unit_given_back_can_be_taken_again() {
        let b = Bucket::own();
        let now = 100 * S;
        assert_eq!(b.take_one(now, 1.0, 1.0, true), Ok(()));
        assert!(b.take_one(now, 1.0, 1.0, false).is_err());
        b.give_back_one(1.0);
        assert_eq!(b.take_one(now, 1.0, 1.0, true), Ok(()), "the unit given back");
    }

    #[test]
    fn bytes_taken_past_the_burst_are_a_debt_waited_out() {
        let a = AtomicU64::new(0);
        let now = 100 * S;
        // 1,000 bytes a second, a burst of 500: 500 go at once...
        assert_eq!(take_owing(&a, 500.0, now, 1000.0, 500.0), 0);
        // ...the next 250 wait a quarter of a second, and 250 more half.
        assert_eq!(take_owing(&a, 250.0, now, 1000.0, 500.0), S / 4);
        assert_eq!(take_owing(&a, 250.0, now, 1000.0, 500.0), S / 2);
        // Paid back over time: at `now + 0.5 s` the bucket is empty again,
        // and half a second later full.
        assert_eq!(take_owing(&a, 100.0, now + S / 2, 1000.0, 500.0), S / 10);
        assert_eq!(take_owing(&a, 500.0, now + 2 * S, 1000.0, 500.0), 0);
    }

    #[test]
    fn a_debt_is_cut_to_what_a_lowered_rate_pays_in_a_second() {
        let b = Bucket::own();
        let now = 100 * S;
        assert_eq!(b.take_owing(10_000.0, now, 1000.0, 1000.0), 9 * S);
        b.cap_debt(now, 100.0, 100.0);
        assert_eq!(b.take_owing(0.0, now, 100.0, 100.0), S);
        b.fill();
        assert_eq!(b.take_owing(100.0, now, 100.0, 100.0), 0, "full again");
    }

    #[test]
    fn a_debt_run_up_at_a_lower_rate_is_paid_at_a_raised_one() {
        let b = Bucket::own();
        let now = 100 * S;
        // 2,000 bytes past a 1,000-byte burst at 1,000 a second: 2 s owed...
        assert_eq!(b.take_owing(3000.0, now, 1000.0, 1000.0), 2 * S);
        // ...and 0.2 s at 10,000 a second.
        b.rescale_debt(now, 1000.0, 10_000.0);
        assert_eq!(b.take_owing(0.0, now, 10_000.0, 10_000.0), S / 5);
    }

    #[test]
    fn a_bucket_at_zero_is_full_whatever_its_burst() {
        let a = AtomicU64::new(0);
        let now = now_ns();
        for _ in 0..100_000 {
            assert_eq!(take_one(&a, now, 1.0, 100_000.0, true), Ok(()));
        }
    }

    /// Two workers putting the same new rule list in force: the first
    /// fills the bucket they share, the second leaves what was taken since.
    #[test]
    fn a_shared_bucket_is_filled_once_for_a_rule_list() {
        let bucket: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        let tag: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(7)));
        let b = Bucket(Slot::Shared(bucket, tag));
        let now = now_ns();
        assert_eq!(b.take_one(now, 1.0, 1.0, true), Ok(()));
        b.put_in_force(7, true);
        assert!(
            b.take_one(now, 1.0, 1.0, true).is_err(),
            "the list in force: not filled"
        );
        b.put_in_force(8, true);
        assert_eq!(b.take_one(now, 1.0, 1.0, true), Ok(()), "a new list: filled");
        b.put_in_force(8, true);
        assert!(
            b.take_one(now, 1.0, 1.0, true).is_err(),
            "the second worker: not filled again"
        );
        b.put_in_force(9, false);
        assert!(b.take_one(now, 1.0, 1.0, true).is_err(), "at start: not filled");
        b.put_in_force(9, true);
        assert_eq!(b.take_one(now, 1.0, 1.0, true), Ok(()), "nor claimed: the reload fills");
    }

    #[test]
    fn a_clock_that_reads_less_than_the_bucket_adds_nothing() {
        let a = AtomicU64::new(0);
        let now = 100 * S;
        assert_eq!(take_one(&a, now, 1.0, 1.0, true), Ok(()));
        assert!(take_one(&a, now - S / 2, 1.0, 1.0, true).is_err());
    }

    #[test]
    fn a_memory_file_of_another_layout_is_not_mapped() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let fd = create(1 << 10).expect("memfd");
        let file = std::fs::File::from(fd);
        file.write_all_at(&1u64.to_ne_bytes(), (LAYOUT * 8) as u64)
            .expect("write");
        let err = map(file.as_raw_fd()).expect_err("another layout");
        assert!(err.contains("another build"), "{err}");
    }

    #[test]
    fn two_mappings_of_the_memory_file_are_one_set_of_buckets() {
        let fd = create(1 << 10).expect("memfd");
        use std::os::fd::AsRawFd;
        let (x, y) = (
            map(fd.as_raw_fd()).expect("map"),
            map(fd.as_raw_fd()).expect("map again"),
        );
        assert_eq!((x.len(), y.len()), (words_for(1 << 10), words_for(1 << 10)));
        assert_ne!(x.as_ptr(), y.as_ptr(), "two mappings");
        let now = 100 * S;
        assert_eq!(take_one(&x[ROUTES], now, 1.0, 1.0, true), Ok(()));
        assert!(
            take_one(&y[ROUTES], now, 1.0, 1.0, true).is_err(),
            "the unit taken through one mapping is gone from the other"
        );
        assert_eq!(take_one(&y[ROUTES + 1], now, 1.0, 1.0, true), Ok(()));
    }

    /// Clients' memory of its own for a test of the clients' table.
    fn fresh_words() -> &'static [AtomicU64] {
        Box::leak(
            (0..1 + 2 * (1 << 18))
                .map(|_| AtomicU64::new(0))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        )
    }

    #[test]
    fn a_clients_bucket_is_found_again_and_is_its_own_for_each_limit() {
        let words = fresh_words();
        let now = now_ns();
        let (limit, other) = ((7, 1), (7, 2));
        assert!(client_if_any_in(words, limit, 1).is_none(), "no bucket: a full one");
        let b = client_in(words, limit, 1, now);
        for _ in 0..2 {
            assert_eq!(b.take_one(now, 1.0, 2.0, true), Ok(()));
        }
        let again = client_if_any_in(words, limit, 1).expect("found again");
        assert!(again.take_one(now, 1.0, 2.0, false).is_err(), "the same, spent bucket");
        assert!(
            client_if_any_in(words, other, 1).is_none(),
            "another limit's is another"
        );
        assert!(
            client_if_any_in(words, limit, 2).is_none(),
            "another client's is another"
        );
        assert_eq!(client_in(words, other, 1, now).take_one(now, 1.0, 2.0, true), Ok(()));
    }

    /// `WINDOW + 1` clients whose windows under `limit` are the same.
    fn crowd(words: &[AtomicU64], limit: ClientLimit) -> Vec<u128> {
        let mut by_start: std::collections::HashMap<usize, Vec<u128>> = std::collections::HashMap::new();
        (1u128..)
            .find_map(|c| {
                let same = by_start.entry(client_place(words, limit, c).start).or_default();
                same.push(c);
                (same.len() == WINDOW + 1).then(|| same.clone())
            })
            .expect("a crowd")
    }

    /// Its place full of buckets all spent (each of its 8 clients took its
    /// one request, a millisecond apart), a new client gets the slot of the
    /// one drawn on longest ago, and that slot's bucket full.
    #[test]
    fn a_client_whose_places_are_all_taken_gets_the_least_recently_used_slot_full() {
        let words = fresh_words();
        let limit = (9, 9);
        let crowd = crowd(words, limit);
        // In one second: the stamps are alike, the theoretical arrival
        // times tell.
        let start = now_ns() / 1_000_000_000 * 1_000_000_000;
        const MS: u64 = 1_000_000;
        for (n, &c) in crowd[..WINDOW].iter().enumerate() {
            let at = start + n as u64 * MS;
            assert_eq!(client_in(words, limit, c, at).take_one(at, 1.0, 1.0, true), Ok(()));
        }
        let at = start + WINDOW as u64 * MS;
        let before = evicted();
        let newcomer = client_in(words, limit, crowd[WINDOW], at);
        assert_eq!(newcomer.take_one(at, 1.0, 1.0, true), Ok(()), "full for its new client");
        // Drawn on 8 ms earlier: a bucket in use, counted.
        assert!(evicted() > before, "the eviction was not counted");
        assert!(
            client_if_any_in(words, limit, crowd[0]).is_none(),
            "the oldest was given away"
        );
        for &c in &crowd[1..] {
            assert!(
                client_if_any_in(words, limit, c).is_some(),
                "client {c} kept its bucket"
            );
        }
    }

    /// Of buckets of limits with different bursts, the one looked up
    /// longest ago goes first, not the one with the earliest theoretical
    /// arrival time: a long burst's bucket in use has an earlier one than
    /// a short burst's bucket idle for seconds.
    #[test]
    fn a_bucket_in_use_is_kept_over_those_idle_for_longer_whatever_its_burst() {
        let words = fresh_words();
        let (long, short) = ((3, 3), (4, 4));
        // WINDOW + 1 (limit, client) pairs whose windows are the same, the
        // first of the long-burst limit.
        let mut by_start: std::collections::HashMap<usize, Vec<(ClientLimit, u128)>> = std::collections::HashMap::new();
        let crowd = (1u128..)
            .flat_map(|c| [(long, c), (short, c)])
            .find_map(|(limit, c)| {
                let same = by_start.entry(client_place(words, limit, c).start).or_default();
                if same.is_empty() && limit != long {
                    return None;
                }
                same.push((limit, c));
                (same.len() == WINDOW + 1).then(|| same.clone())
            })
            .expect("a crowd");
        const S: u64 = 1_000_000_000;
        let start = now_ns() / S * S;
        for &(limit, c) in &crowd[1..WINDOW] {
            let b = client_in(words, limit, c, start);
            assert_eq!(b.take_one(start, 1.0, 1.0, true), Ok(()));
        }
        // Five seconds on, the long burst's client draws one of its 100.
        let later = start + 5 * S;
        let (limit, c) = crowd[0];
        assert_eq!(
            client_in(words, limit, c, later).take_one(later, 1.0, 100.0, true),
            Ok(())
        );
        let (limit, c) = crowd[WINDOW];
        assert_eq!(
            client_in(words, limit, c, later).take_one(later, 1.0, 1.0, true),
            Ok(())
        );
        let (limit, c) = crowd[0];
        assert!(
            client_if_any_in(words, limit, c).is_some(),
            "the bucket in use was given away"
        );
        let kept = crowd[1..WINDOW]
            .iter()
            .filter(|&&(limit, c)| client_if_any_in(words, limit, c).is_some())
            .count();
        assert_eq!(kept, WINDOW - 2, "one idle bucket was given away");
    }

    #[test]
    fn a_slots_age_is_counted_in_whole_seconds_across_the_stamps_wrap_and_never_ahead() {
        const S: u64 = 1_000_000_000;
        let now = (1 << 60) + 100 * S;
        assert_eq!(age(stamp(now), now), 0);
        assert_eq!(age(stamp(now - 5 * S), now), 5);
        // Stamped by another process in the next second: in use now.
        assert_eq!(age(stamp(now + S), now), 0);
        // Across the 24-bit wrap.
        let wrapped = (1 << 60) + (1 << 24) * S + 3 * S;
        assert_eq!(age(stamp(wrapped - 7 * S), wrapped), 7);
    }

    /// Of two buckets to give away, one in debt is kept (its client would
    /// be forgiven the debt) over one idle for longer that lacks nothing.
    #[test]
    fn a_bucket_in_debt_is_given_away_last() {
        let words = fresh_words();
        let limit = (6, 6);
        let crowd = crowd(words, limit);
        const S: u64 = 1_000_000_000;
        let start = now_ns() / S * S;
        // The first ran up a debt of 100 s at 1 a second, then went quiet;
        // the others were used a second later.
        let b = client_in(words, limit, crowd[0], start);
        assert!(b.take_owing(101.0, start, 1.0, 1.0) > 0);
        for &c in &crowd[1..WINDOW] {
            let at = start + S;
            assert_eq!(client_in(words, limit, c, at).take_one(at, 1.0, 1.0, true), Ok(()));
        }
        let later = start + 10 * S;
        assert_eq!(
            client_in(words, limit, crowd[WINDOW], later).take_one(later, 1.0, 1.0, true),
            Ok(())
        );
        assert!(
            client_if_any_in(words, limit, crowd[0]).is_some(),
            "the debt was forgiven"
        );
    }

    /// Two threads (as two processes would) giving one new client a
    /// bucket at once end up taking from one bucket, in one slot.
    #[test]
    fn a_client_given_a_bucket_twice_at_once_has_one() {
        let words = fresh_words();
        let limit = (5, 5);
        // The two a nanosecond apart across a second's end: one's lookup
        // stamps the slot the other has just taken.
        const S: u64 = 1_000_000_000;
        let start = now_ns() / S * S;
        let gate = std::sync::Barrier::new(2);
        // Counted, not asserted, in the threads: a panic in one would
        // leave the other at the barrier for ever.
        let refused = AtomicU64::new(0);
        std::thread::scope(|s| {
            for now in [start - 1, start] {
                let (gate, refused) = (&gate, &refused);
                s.spawn(move || {
                    for c in 0..20_000u128 {
                        gate.wait();
                        if client_in(words, limit, c, now).take_one(now, 1.0, 3.0, true).is_err() {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(refused.load(Ordering::Relaxed), 0, "takes refused");
        for c in 0..20_000u128 {
            let Place { start: first, tag } = client_place(words, limit, c);
            let slots = window(first, clients_in(words))
                .filter(|&i| holds(client_tag(words, i).load(Ordering::Acquire), tag))
                .count();
            assert_eq!(slots, 1, "client {c}");
            // Two of its three taken: one left.
            let b = client_if_any_in(words, limit, c).expect("its bucket");
            assert_eq!(b.take_one(start, 1.0, 3.0, true), Ok(()), "client {c}");
            assert!(
                b.take_one(start, 1.0, 3.0, false).is_err(),
                "client {c}: both took from it"
            );
        }
    }

    #[test]
    fn a_known_place_is_looked_for_again_for_another_limit_or_client() {
        let mut known = KnownPlace::default();
        let (a, b) = ((0, 1024), (0, 2048));
        assert_eq!(known.of(a, 7), place(a, 7));
        assert_eq!(known.of(a, 7), place(a, 7), "kept");
        // A reload's new bandwidth rate names another limit.
        assert_eq!(known.of(b, 7), place(b, 7));
        assert_eq!(known.of(b, 8), place(b, 8));
        assert_ne!(place(a, 7), place(b, 7));
    }

    #[test]
    fn two_memories_hash_clients_with_secrets_of_their_own() {
        let (a, b) = (fresh_words(), fresh_words());
        let places = |w| (0..64u128).map(|c| client_place(w, (1, 1), c)).collect::<Vec<_>>();
        assert_eq!(places(a), places(a), "one memory, one secret");
        assert_ne!(places(a), places(b));
    }
}
