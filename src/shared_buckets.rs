//! The buckets of the limits that are for all clients together
//! (`limits.total_bandwidth`, a route's `total_request_rate`), shared by the
//! worker processes (`server.processes = N > 1`), so that N workers keep to
//! the rate the configuration names, not N times it (as nginx keeps a
//! `limit_req` zone in shared memory).
//!
//! A bucket is one atomic number: its "theoretical arrival time" (the
//! generic cell rate algorithm of ATM networks, RFC 2697's token bucket in
//! another form), the instant in nanoseconds of `CLOCK_MONOTONIC` at which
//! the bucket would be back to empty. `now - tat` is what it holds, in time:
//! times the rate, its tokens, at most `burst`; a `tat` after `now` is a
//! debt. Taking is one compare-and-swap, which another process may do at
//! the same time on the same bucket, and `CLOCK_MONOTONIC` is one clock for
//! every process of the machine. A bucket at 0 is full.
//!
//! The supervisor makes a memory file (`memfd_create`) of [`SLOTS`] buckets
//! and hands it to each worker it starts (inherited, its number in
//! [`ENV_FD`]); the worker maps it shared. A single process, or a worker
//! that cannot map it (it then says so), keeps buckets of its own.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the inherited memory file to a worker.
pub const ENV_FD: &str = "PORTICO_BUCKETS_FD";

/// How many buckets there are: `total_bandwidth`'s, then the routes'.
pub const SLOTS: usize = 1024;

/// The bucket of `limits.total_bandwidth`.
pub const TOTAL_BANDWIDTH: usize = 0;

/// The first route's `total_request_rate` bucket: the K-th rule that sets
/// one (in the rule list's order) has bucket `ROUTES + K`, so every worker
/// reading the same configuration finds it in the same place.
pub const ROUTES: usize = 1;

/// The buckets: shared with the other workers, or this process's own.
fn slots() -> &'static [AtomicU64] {
    static SLOTS_IN_USE: OnceLock<&'static [AtomicU64]> = OnceLock::new();
    SLOTS_IN_USE.get_or_init(|| match inherited() {
        Some(Ok(shared)) => shared,
        Some(Err(e)) => {
            tracing::warn!(
                "cannot map the limits' buckets shared with the other workers ({e}): this worker keeps \
                 limits.total_bandwidth and the routes' total_request_rate on its own"
            );
            own()
        }
        None => own(),
    })
}

/// Buckets of this process's own.
fn own() -> &'static [AtomicU64] {
    static OWN: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
    &OWN
}

/// The memory file a supervisor handed this worker, mapped: None when
/// this is no worker or none was handed.
fn inherited() -> Option<Result<&'static [AtomicU64], String>> {
    std::env::var_os("PORTICO_WORKER")?;
    let fd = std::env::var(ENV_FD).ok()?;
    let fd: std::os::fd::RawFd = match fd.parse() {
        Ok(fd) if fd > 2 => fd,
        _ => return Some(Err(format!("{ENV_FD} is not a file descriptor: {fd:?}"))),
    };
    Some(map(fd))
}

/// Maps the memory file `fd` (inherited, left open: it is the
/// supervisor's gift and mapped once) as the buckets.
fn map(fd: std::os::fd::RawFd) -> Result<&'static [AtomicU64], String> {
    let len = SLOTS * std::mem::size_of::<AtomicU64>();
    // SAFETY: fstat writes into the `stat` it is given, which lives for
    // the call; `fd` is only read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above: a valid pointer to a `stat`, any descriptor number.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!("fd {fd}: {}", std::io::Error::last_os_error()));
    }
    if usize::try_from(st.st_size).unwrap_or(0) < len {
        return Err(format!("fd {fd} holds {} bytes, not {len}", st.st_size));
    }
    // SAFETY: a new shared mapping of `len` bytes of `fd` at an address the
    // kernel picks; nothing else in this process is mapped there.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(format!("mmap of fd {fd}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the mapping is `len` bytes, page-aligned (so aligned for
    // AtomicU64, which has u64's size and layout), readable and writable,
    // and never unmapped: it lives as long as the process ('static). Every
    // access, in this process and the others mapping the file, goes
    // through these atomics.
    Ok(unsafe { std::slice::from_raw_parts(at.cast::<AtomicU64>(), SLOTS) })
}

/// Makes the memory file the supervisor hands its workers: [`SLOTS`]
/// buckets, all full (zero), and inheritable (no close-on-exec). Its
/// number goes in [`ENV_FD`]; it stays open in the supervisor, so a
/// worker restarted later gets the same one.
pub fn create() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: the name is a NUL-terminated C string; no flags, so the
    // descriptor is inherited across exec, as meant.
    let fd = unsafe { libc::memfd_create(c"portico-buckets".as_ptr(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened by memfd_create and is owned by nothing else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let file = std::fs::File::from(owned);
    file.set_len((SLOTS * std::mem::size_of::<AtomicU64>()) as u64)?;
    Ok(file.into())
}

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every process.
pub fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the `timespec` it is given, which lives
    // for the call; CLOCK_MONOTONIC is always there on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    u64::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// The bucket of `limits.total_bandwidth`.
pub fn total_bandwidth() -> Bucket {
    Bucket(Slot::Shared(&slots()[TOTAL_BANDWIDTH]))
}

/// The `total_request_rate` bucket of the `k`-th rule that sets one
/// (counting from 0): shared by the workers for the first
/// `SLOTS - ROUTES`, this process's own past them. Filled: a new
/// limit starts full.
pub fn route(k: usize) -> Bucket {
    let b = match slots().get(ROUTES + k) {
        Some(a) => Bucket(Slot::Shared(a)),
        None => Bucket(Slot::Own(std::sync::Arc::new(AtomicU64::new(0)))),
    };
    b.fill();
    b
}

/// One bucket: its theoretical arrival time (see the module's text).
#[derive(Debug, Clone)]
pub struct Bucket(Slot);

#[derive(Debug, Clone)]
enum Slot {
    /// In the buckets (shared with the other workers when they are).
    Shared(&'static AtomicU64),
    /// Of its own (a route past the shared ones).
    Own(std::sync::Arc<AtomicU64>),
}

impl Slot {
    fn get(&self) -> &AtomicU64 {
        match self {
            Slot::Shared(a) => a,
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
/// that was full for longer holds no more than `burst`.
fn refilled(tat: u64, now: u64, rate: f64, burst: f64) -> u64 {
    tat.max(now.saturating_sub(span_ns(burst, rate)))
}

/// See [`Bucket::take_owing`].
fn take_owing(a: &AtomicU64, n: f64, now: u64, rate: f64, burst: f64) -> u64 {
    let mut tat = a.load(Ordering::Acquire);
    loop {
        let new = refilled(tat, now, rate, burst).saturating_add(span_ns(n, rate));
        match a.compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return new.saturating_sub(now),
            Err(seen) => tat = seen,
        }
    }
}

/// See [`Bucket::take_one`].
fn take_one(a: &AtomicU64, now: u64, rate: f64, burst: f64, take: bool) -> Result<(), u64> {
    let mut tat = a.load(Ordering::Acquire);
    loop {
        let new = refilled(tat, now, rate, burst).saturating_add(span_ns(1.0, rate));
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

    #[test]
    fn a_unit_given_back_can_be_taken_again() {
        let b = Bucket(Slot::Own(std::sync::Arc::new(AtomicU64::new(0))));
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
        let b = Bucket(Slot::Own(std::sync::Arc::new(AtomicU64::new(0))));
        let now = 100 * S;
        assert_eq!(b.take_owing(10_000.0, now, 1000.0, 1000.0), 9 * S);
        b.cap_debt(now, 100.0, 100.0);
        assert_eq!(b.take_owing(0.0, now, 100.0, 100.0), S);
        b.fill();
        assert_eq!(b.take_owing(100.0, now, 100.0, 100.0), 0, "full again");
    }

    #[test]
    fn a_clock_that_reads_less_than_the_bucket_adds_nothing() {
        let a = AtomicU64::new(0);
        let now = 100 * S;
        assert_eq!(take_one(&a, now, 1.0, 1.0, true), Ok(()));
        assert!(take_one(&a, now - S / 2, 1.0, 1.0, true).is_err());
    }

    #[test]
    fn two_mappings_of_the_memory_file_are_one_set_of_buckets() {
        let fd = create().expect("memfd");
        use std::os::fd::AsRawFd;
        let (x, y) = (
            map(fd.as_raw_fd()).expect("map"),
            map(fd.as_raw_fd()).expect("map again"),
        );
        assert_ne!(x.as_ptr(), y.as_ptr(), "two mappings");
        let now = 100 * S;
        assert_eq!(take_one(&x[ROUTES], now, 1.0, 1.0, true), Ok(()));
        assert!(
            take_one(&y[ROUTES], now, 1.0, 1.0, true).is_err(),
            "the unit taken through one mapping is gone from the other"
        );
        assert_eq!(take_one(&y[ROUTES + 1], now, 1.0, 1.0, true), Ok(()));
    }
}
