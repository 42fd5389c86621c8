//! Sizing from the machine, as the Sun Java System Web Proxy Server 4
//! does: raise the open-files limit, then derive the connection limits left at 0 in the
//! config from it.
//!
//! Every connection costs a file descriptor, and a request in service can
//! cost three (client, origin, disk cache file), so the open-files limit is
//! what really bounds how many connections a proxy can hold. The formulas
//! (docs/CONFIG.md, "Sizing") split it so that the three limits together
//! fit in it: with `usable = nofile - 64` (64 kept for logs, the listeners,
//! the cache's own files), `max_requests = usable / 6` (3 descriptors
//! each: half of `usable`), `queue_size = usable / 8` (1 each: an eighth),
//! `keepalive.max_connections = usable * 3 / 8` (1 each: the rest).
//!
//! That split reserves for the worst case, where every request in service
//! holds three descriptors at once. Most hold fewer (a hit from a held
//! file none beyond its client's, a miss waiting on its origin one, and a
//! cache file only while its body is stored), so a derived `max_requests`
//! is where admission starts counting, not a wall: past it, a request is
//! still admitted while the descriptors in use ([`Descriptors`], counted
//! by `proxy::admission`) leave room for it.
//! Under a Web Polygraph workload at 3,200 requests/s (2.5 s origin think
//! time) the split's 3,322 places refused 12% of the requests with the busy
//! 503; counting descriptors instead, 5,244 were in service at the peak
//! and none was refused.

use crate::config::Config;

/// Descriptors kept out of the split for logs, listeners and cache files.
const RESERVED: u64 = 64;
/// No derived limit goes below this, however low the open-files limit.
const FLOOR: u64 = 16;

/// The open-files limit before and after start-up raised it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// Soft limit the process was started with.
    pub before: u64,
    /// Soft limit now (the hard limit, when raising it worked).
    pub now: u64,
}

/// The open-files limits (soft, hard), or None if they cannot be read.
// rlim_t is u64 on the 64-bit targets we build for, u32 on some others.
#[allow(clippy::useless_conversion)]
fn nofile() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and has no other
    // preconditions.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    Some((u64::from(lim.rlim_cur), u64::from(lim.rlim_max)))
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (capped at 1 << 20,
/// which is Linux's usual `nr_open`, so an "unlimited" hard limit does not
/// make setrlimit fail). Returns the limits; on failure the soft limit is
/// kept and reported unchanged.
pub fn raise_open_files() -> OpenFiles {
    let Some((before, hard)) = nofile() else {
        return OpenFiles {
            before: 1024,
            now: 1024,
        };
    };
    let target = hard.min(1 << 20);
    if target > before
        && let (Ok(cur), Ok(max)) = (libc::rlim_t::try_from(target), libc::rlim_t::try_from(hard))
    {
        let raised = libc::rlimit {
            rlim_cur: cur,
            rlim_max: max,
        };
        // SAFETY: setrlimit reads the struct we pass; raising the soft
        // limit up to the hard limit needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return OpenFiles { before, now: target };
        }
    }
    OpenFiles { before, now: before }
}

/// The most descriptors [`grow_descriptor_table`] makes room for: 512 KiB
/// of kernel memory for the table's pointers. Past it a table still grows
/// while serving, once per doubling.
const GROWN_TABLE_MAX: libc::c_int = 1 << 16;

/// Grows this process's descriptor table at start-up to hold `limit`
/// descriptors (at most 65,536), so that serving never has to.
///
/// Linux grows the table of a multi-threaded process only after an RCU
/// grace period (`expand_fdtable` calls `synchronize_rcu`): the thread whose
/// `accept` or `open` needed the room sleeps through it, and so does any
/// other that opens or accepts meanwhile, with every connection of those
/// threads. The table doubles each time, so a proxy getting busy paid it
/// five times on its way to 6,400 descriptors: 7-16 ms each on the 2-core
/// VM of bench/README.md ("The first second: the descriptor table grown
/// while serving"), stalls of the only worker thread that made the 99th
/// percentile of 1,000 busy connections' first second. nginx does not pay
/// it (its worker processes are single-threaded). The table is kernel
/// memory (8 bytes a descriptor), not counted in the resident size.
pub fn grow_descriptor_table(limit: u64) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let want = libc::c_int::try_from(limit).map_or(GROWN_TABLE_MAX, |l| l.min(GROWN_TABLE_MAX));
    // Any descriptor to duplicate: a socket needs no file system.
    let probe = std::os::unix::net::UnixDatagram::unbound()?;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) duplicates a descriptor we own onto
    // the lowest free number at or above `want - 1`, which is below the
    // open-files limit; it touches no memory of ours.
    let dup = unsafe { libc::fcntl(probe.as_raw_fd(), libc::F_DUPFD_CLOEXEC, (want - 1).max(0)) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `dup` was just returned by fcntl, so it is open and nothing
    // else owns it; dropping the OwnedFd closes it (the table stays grown).
    drop(unsafe { OwnedFd::from_raw_fd(dup) });
    Ok(())
}

/// The open-files soft limit now (1,024 if it cannot be read), at most
/// 1 << 20: how many descriptors, so connections, this process can hold.
pub fn open_files_limit() -> usize {
    let soft = nofile().map_or(1024, |(soft, _)| soft.min(1 << 20));
    usize::try_from(soft).unwrap_or(1 << 20)
}

/// Something that holds descriptors it can do without: the disk tiers'
/// cache files held open between hits (`cache.open_files`).
pub trait Relief: Send + Sync {
    /// Closes some of what it holds and holds that much less from now on
    /// (until it has not run out for a while); returns how many it may
    /// hold now, None when it held nothing.
    fn relieve(&self) -> Option<usize>;
}

/// Every [`Relief`] of the process, for [`relieve`].
static RELIEF: std::sync::Mutex<Vec<std::sync::Weak<dyn Relief>>> = std::sync::Mutex::new(Vec::new());

/// Held descriptors given up by [`Relief`]s and not taken back: admission
/// counts the configured `cache.open_files` less these.
static GIVEN_UP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Adds `r` to what [`relieve`] asks (until it is dropped).
pub fn register_relief(r: std::sync::Weak<dyn Relief>) {
    let mut all = RELIEF.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(r);
}

/// Called where something the process cannot do without (an accepted
/// client connection, an origin connection, a cache file a request needs)
/// failed with `cause`: when that says the process (EMFILE) or the system
/// (ENFILE) is out of descriptors, asks every [`Relief`] to give some
/// back, logs a warning for each that did, and returns whether any did
/// (try again then). Held cache files only make hits cheaper; connections
/// come first.
pub fn relieve(cause: &std::io::Error) -> bool {
    if !matches!(cause.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
        return false;
    }
    let all: Vec<_> = RELIEF
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .collect();
    let mut any = false;
    for r in all {
        if let Some(capacity) = r.relieve() {
            tracing::warn!(
                "out of file descriptors ({cause}): holding at most {capacity} cache files open for now; \
                 raise the open-files limit (LimitNOFILE) or lower cache.open_files",
                cause = crate::util::io_cause(cause)
            );
            any = true;
        }
    }
    any
}

/// Records that `n` held descriptors were given up.
pub fn gave_up(n: usize) {
    GIVEN_UP.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
}

/// Records that `n` held descriptors given up are held again.
pub fn took_back(n: usize) {
    let _ = GIVEN_UP.fetch_update(
        std::sync::atomic::Ordering::Relaxed,
        std::sync::atomic::Ordering::Relaxed,
        |g| Some(g.saturating_sub(n)),
    );
}

/// What admission needs to admit past a derived `server.max_requests`
/// while descriptors are free (the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct Descriptors {
    /// The open-files limit.
    pub limit: usize,
    /// Counted as always taken: the reserve for logs, listeners and the
    /// cache's own files, plus every disk-tier file that may be held open
    /// (`cache.open_files`, as if all were; less what was given up when
    /// descriptors ran out, `given_up`).
    pub fixed: usize,
    /// Kept free for new connections and short-lived files (a sixteenth
    /// of the usable descriptors, at least 16), so that accepting a client
    /// or opening a cache file never fails for want of one.
    pub headroom: usize,
    /// Held descriptors given up since (taken off `fixed`): the process's
    /// count ([`gave_up`]), or a test's own.
    pub given_up: &'static std::sync::atomic::AtomicUsize,
}

impl PartialEq for Descriptors {
    fn eq(&self, other: &Self) -> bool {
        (self.limit, self.fixed, self.headroom) == (other.limit, other.fixed, other.headroom)
            && std::ptr::eq(self.given_up, other.given_up)
    }
}

impl Eq for Descriptors {}

impl Descriptors {
    /// `fixed` less the held descriptors given up since.
    pub fn fixed_now(&self) -> usize {
        self.fixed
            .saturating_sub(self.given_up.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// The values derived from an open-files limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Derived {
    /// Default `server.max_requests`.
    pub max_requests: usize,
    /// Default `server.queue_size`.
    pub queue_size: usize,
    /// Default `keepalive.max_connections`.
    pub keepalive_connections: usize,
}

/// The formulas of the module documentation.
pub(crate) fn derive(nofile: u64) -> Derived {
    let usable = nofile.saturating_sub(RESERVED);
    let pick = |n: u64| usize::try_from(n.max(FLOOR)).unwrap_or(usize::MAX);
    Derived {
        max_requests: pick(usable / 6),
        queue_size: pick(usable / 8),
        keepalive_connections: pick(usable * 3 / 8),
    }
}

/// Default `cache.open_files`: the disk tier's held-open files take a
/// quarter of the usable descriptors (they come out of the share kept for
/// the disk file of each request in service, which a hit from a held file
/// does not open), at most 10,000, at least 16.
pub(crate) fn open_files(nofile: u64) -> usize {
    let n = (nofile.saturating_sub(RESERVED) / 4).clamp(FLOOR, 10_000);
    usize::try_from(n).unwrap_or(10_000)
}

/// A warning when `cache.open_files` is more than half of the descriptors
/// an open-files limit of `nofile` leaves usable: held files would crowd
/// out connections and the files requests open, until the disk tier
/// closes some when descriptors run out.
pub fn open_files_warning(config: &Config, nofile: u64) -> Option<String> {
    let usable = nofile.saturating_sub(RESERVED);
    let held = config.cache.open_files as u64;
    (config.cache.enabled && config.cache.disk.bytes() > 0 && held > usable / 2).then(|| {
        format!(
            "cache.open_files = {held} is more than half of the {usable} descriptors the open-files limit \
             ({nofile}) leaves usable: held cache files will be closed when descriptors run out; lower it \
             or raise the limit (LimitNOFILE)"
        )
    })
}

/// The descriptor budget for an open-files limit `nofile` with up to
/// `held` disk-tier files held open.
pub(crate) fn descriptors(nofile: u64, held: usize) -> Descriptors {
    let as_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    Descriptors {
        limit: as_usize(nofile),
        fixed: as_usize(RESERVED).saturating_add(held),
        headroom: as_usize((nofile.saturating_sub(RESERVED) / 16).max(FLOOR)),
        given_up: &GIVEN_UP,
    }
}

/// Replaces the config's sized-from-the-machine zeros (`server.max_requests`,
/// `server.queue_size`, `keepalive.max_connections`, `server.blocking_queue`)
/// with their values for `nofile`; returns a description of what was chosen.
pub fn resolve(config: &mut Config, nofile: u64) -> String {
    let d = derive(nofile);
    let mut parts = Vec::new();
    let mut fill = |value: &mut usize, derived: usize, name: &str| {
        let how = if *value == 0 {
            *value = derived;
            "derived"
        } else {
            "configured"
        };
        parts.push(format!("{name} = {value} ({how})"));
    };
    let derived_requests = config.server.max_requests == 0;
    fill(&mut config.server.max_requests, d.max_requests, "server.max_requests");
    fill(&mut config.server.queue_size, d.queue_size, "server.queue_size");
    fill(
        &mut config.keepalive.max_connections,
        d.keepalive_connections,
        "keepalive.max_connections",
    );
    let max_requests = config.server.max_requests;
    fill(&mut config.server.blocking_queue, max_requests, "server.blocking_queue");
    if config.cache.disk.bytes() > 0 {
        fill(&mut config.cache.open_files, open_files(nofile), "cache.open_files");
    }
    let held = if config.cache.enabled && config.cache.disk.bytes() > 0 {
        config.cache.open_files
    } else {
        0
    };
    config.server.descriptors = derived_requests.then(|| descriptors(nofile, held));
    format!("open files {nofile}: {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_files_over_half_the_usable_descriptors_are_warned_about() {
        let mut c = Config::default();
        c.cache.disk = crate::config::Size(1 << 30);
        c.cache.open_files = 10_000;
        assert_eq!(open_files_warning(&c, 20_064), None, "exactly half");
        c.cache.open_files = 10_001;
        let w = open_files_warning(&c, 20_064).expect("a warning");
        assert!(
            w.starts_with("cache.open_files = 10001 is more than half of the 20000 descriptors"),
            "{w}"
        );
        c.cache.disk = crate::config::Size(0);
        assert_eq!(open_files_warning(&c, 20_064), None, "no disk tier, no held files");
    }

    #[test]
    fn formulas_split_the_limit() {
        let d = derive(20_000);
        assert_eq!(d.max_requests, 19_936 / 6);
        assert_eq!(d.queue_size, 19_936 / 8);
        assert_eq!(d.keepalive_connections, 19_936 * 3 / 8);
        // Together they fit in the limit: 3 per request, 1 per other connection.
        assert!(3 * d.max_requests + d.queue_size + d.keepalive_connections <= 20_000);
    }

    #[test]
    fn held_open_cache_files_take_a_quarter_of_the_usable_limit() {
        assert_eq!(open_files(20_064), 5_000);
        assert_eq!(open_files(1 << 20), 10_000);
        assert_eq!(open_files(100), 16);
        let mut c = Config::default();
        resolve(&mut c, 20_064);
        assert_eq!(c.cache.open_files, 5_000);
        c.cache.disk = crate::config::Size(0);
        c.cache.open_files = 0;
        resolve(&mut c, 20_064);
        assert_eq!(c.cache.open_files, 0, "no disk tier, nothing derived");
    }

    #[test]
    fn floors_apply_to_tiny_limits() {
        let d = derive(10);
        assert_eq!((d.max_requests, d.queue_size, d.keepalive_connections), (16, 16, 16));
    }

    #[test]
    fn only_zeros_are_replaced() {
        let mut c = Config::default();
        c.server.queue_size = 7;
        let said = resolve(&mut c, 1064);
        assert_eq!(c.server.max_requests, 166);
        assert_eq!(c.server.queue_size, 7);
        assert_eq!(c.keepalive.max_connections, 375);
        assert_eq!(c.server.blocking_queue, 166);
        assert!(said.contains("server.queue_size = 7 (configured)"), "{said}");
        assert!(said.contains("server.max_requests = 166 (derived)"), "{said}");
    }

    #[test]
    fn raising_never_lowers() {
        let r = raise_open_files();
        assert!(r.now >= r.before);
    }
}
