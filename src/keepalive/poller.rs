//! The keep-alive poller: one thread and one epoll set holding every
//! connection that has sat idle longer than `keepalive.park_after` (the
//! Sun Java System Web Proxy Server 4's keep-alive subsystem in "high
//! concurrency mode").
//!
//! A connection's own task waits for its next request only briefly (the
//! Sun proxy's "low latency mode"): a client that is actively using the
//! connection sends within microseconds, and handing the socket over and
//! back would cost more than the wait. Past `park_after` the task hands the
//! bare socket here and ends, so an idle connection no longer costs a task,
//! its future, a timer entry and the runtime's registration: only a slot
//! in a table (48 bytes), an entry in the timeout order (8 bytes for a
//! kept-alive connection, 16 for a new one) and, once resumed, 4 bytes in
//! the free list: the user-space memory; the kernel's socket and epoll
//! entry are not in the process's RSS. When the client sends, the slot is emptied
//! and the connection gets a new task ([`Resume`]), whose wait adapts to the
//! client's rhythm (`next_wait`). Slots time out here too:
//! a kept-alive one after `keepalive.timeout`, a new one that never sent its
//! first request after `limits.header_timeout`.
//!
//! The tasks freed by parking leave their memory with the allocator, which
//! keeps it; after a burst of parking, once parking has gone quiet, the
//! poller asks glibc to give free pages back (`malloc_trim`), so the memory
//! an idle connection holds is what the process's footprint shows.

use super::KeepAlive;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The waker's token; slot tokens are `slot | generation << 32`.
const WAKE: Token = Token(usize::MAX);
/// Parks since the last trim that make a trim worth it (about 1.4 KiB freed each).
const TRIM_AFTER: u64 = 256;
/// How long parking must have been quiet before trimming.
const TRIM_QUIET_MS: u64 = 50;
/// At most this many connections' room is reserved at start (4.75 MiB of
/// address space for the table, its orders and its free list).
const RESERVE_MAX: usize = 1 << 16;
/// A connection's wait before parking grows to at most this many times
/// `park_after` (see [`Poller::next_wait`]).
const MAX_WAIT_FACTOR: u32 = 32;

/// An idle connection handed to the poller or back from it.
pub struct Parked {
    /// The socket, non-blocking, registered with no runtime.
    pub stream: std::net::TcpStream,
    /// Requests served on it so far (0: it has not sent its first one).
    pub served: u32,
    /// How long its task waited before parking it; on resuming, how long
    /// its next task is to wait.
    pub waited: Duration,
    /// Keeps the connection counted as open (for a drain).
    pub open: crate::drain::ConnGuard,
}

/// Gives a connection whose client has sent something (`ready`) a task
/// again; implemented by the accept loop's per-listener state. Called by
/// the poller's dispatch task (see [`dispatch`]), one connection after
/// another, so it only spawns.
pub trait Resume: Send + Sync {
    /// Serves `conn` from here on; `ready` is false when the wake-up may
    /// have been spurious (the task then waits for bytes itself).
    fn resume(self: Arc<Self>, conn: Parked, ready: bool, runtime: &tokio::runtime::Handle);
}

/// A woken connection, whether its client sent bytes, and who resumes it.
type Woken = (Parked, bool, Arc<dyn Resume>);

/// A parked connection, packed: every parked connection costs one of these
/// (the client's address is not kept: the socket's peer address is asked
/// of the kernel on resuming).
struct Entry {
    stream: std::net::TcpStream,
    served: u32,
    /// [`Parked::waited`] in milliseconds (saturating).
    waited_ms: u32,
    /// Milliseconds from parking to `deadline`: when it was parked, without
    /// a second 8-byte time. Saturating: a timeout over 49 days makes the
    /// connection look parked for longer than it was, which only resets its
    /// next wait to `park_after` (`next_wait`).
    patience_ms: u32,
    /// Milliseconds since the poller's epoch when it is closed unasked.
    deadline: u64,
    resume: Arc<dyn Resume>,
    /// Counted as open; its client's place is the slot's `client`.
    open: crate::drain::ConnCount,
}

/// An entry taken out of the table, with its client's place.
type Held = (Entry, Option<crate::client_limit::ClientSlot>);

impl Entry {
    fn parked_at(&self) -> u64 {
        self.deadline.saturating_sub(u64::from(self.patience_ms))
    }
}

#[derive(Default)]
struct Slot {
    generation: u32,
    /// The entry's place under `limits.max_connections_per_client`, beside
    /// `generation`, where the slot has room for its 4 bytes.
    client: Option<crate::client_limit::ClientSlot>,
    entry: Option<Entry>,
}

#[derive(Default)]
struct Table {
    /// The table and the orders below are reserved at start for as many
    /// connections as there can be descriptors, up to [`RESERVE_MAX`]
    /// ([`Table::reserved`]): one
    /// mapping each, of which only the pages in use are resident. So they
    /// never double (a vector grown to 10,000 slots holds 16,384), and they
    /// never sit among the short-lived allocations of the tasks parked
    /// meanwhile, where each would keep pages of freed memory resident
    /// around it.
    slots: Vec<Slot>,
    /// Empty slots, reused last-freed first.
    free: Vec<u32>,
    /// How many connections the structures were reserved for.
    capacity: usize,
    /// Kept-alive slots, in the order they were parked: they share one
    /// timeout, so this is also deadline order, and its front is the
    /// connection idle the longest (the one a flush closes). Entries whose
    /// slot moved on are skipped when met.
    kept: VecDeque<(u32, u32)>,
    /// New connections by deadline (their timeout is per listener).
    fresh: BinaryHeap<Reverse<(u64, u32, u32)>>,
    kept_live: usize,
    fresh_live: usize,
    /// When the poller thread will next wake by itself (ms; MAX: never).
    wake_at: u64,
    parks_since_trim: u64,
    last_park: u64,
}

impl Table {
    /// An empty table with room for `capacity` connections reserved.
    fn reserved(capacity: usize) -> Table {
        Table {
            slots: Vec::with_capacity(capacity),
            free: Vec::with_capacity(capacity),
            kept: VecDeque::with_capacity(capacity),
            fresh: BinaryHeap::with_capacity(capacity),
            capacity,
            wake_at: u64::MAX,
            ..Table::default()
        }
    }

    fn slot(&self, index: u32) -> Option<&Slot> {
        self.slots.get(index as usize)
    }

    fn slot_mut(&mut self, index: u32) -> Option<&mut Slot> {
        self.slots.get_mut(index as usize)
    }

    fn insert(&mut self, (entry, client): Held, fresh: bool) -> (u32, u32) {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot::default());
                // More than 4 billion parked sockets cannot exist (each is a descriptor).
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let deadline = entry.deadline;
        let slot = &mut self.slots[index as usize];
        slot.entry = Some(entry);
        slot.client = client;
        let generation = slot.generation;
        if fresh {
            self.fresh.push(Reverse((deadline, index, generation)));
            self.fresh_live += 1;
        } else {
            self.kept.push_back((index, generation));
            self.kept_live += 1;
        }
        (index, generation)
    }

    /// Empties the slot if it still holds that generation's entry.
    fn take(&mut self, index: u32, generation: u32) -> Option<Held> {
        let slot = self.slot_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let entry = slot.entry.take()?;
        let client = slot.client.take();
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        if entry.served == 0 {
            self.fresh_live -= 1;
        } else {
            self.kept_live -= 1;
        }
        Some((entry, client))
    }

    fn is_live(&self, index: u32, generation: u32) -> bool {
        self.slot(index)
            .is_some_and(|s| s.generation == generation && s.entry.is_some())
    }

    /// The kept-alive connection idle the longest, taken out.
    fn take_oldest_kept(&mut self) -> Option<Held> {
        while let Some((i, g)) = self.kept.pop_front() {
            if let Some(e) = self.take(i, g) {
                return Some(e);
            }
        }
        None
    }

    /// Entries past their deadline, taken out, with whether each was new.
    fn take_expired(&mut self, now: u64, out: &mut Vec<Held>) {
        while let Some(&(i, g)) = self.kept.front() {
            let deadline = match self.slot(i) {
                Some(s) if s.generation == g => s.entry.as_ref().map(|e| e.deadline),
                _ => None,
            };
            match deadline {
                Some(d) if d > now => break,
                Some(_) => out.extend(self.take(i, g)),
                None => {}
            }
            self.kept.pop_front();
        }
        while let Some(&Reverse((d, i, g))) = self.fresh.peek() {
            if d > now && self.is_live(i, g) {
                break;
            }
            self.fresh.pop();
            if d <= now {
                out.extend(self.take(i, g));
            }
        }
        // Slots that were resumed or flushed leave stale order entries
        // behind; drop them once they outnumber the live ones. An order
        // left empty gets a new reservation, which gives back the pages the
        // old one had touched (160 KB after a burst of 10,000 new
        // connections that all sent their first request).
        if self.kept.len() > 2 * self.kept_live + 1024 {
            let mut kept = std::mem::take(&mut self.kept);
            kept.retain(|&(i, g)| self.is_live(i, g));
            if kept.is_empty() {
                kept = VecDeque::with_capacity(self.capacity);
            }
            self.kept = kept;
        }
        if self.fresh.len() > 2 * self.fresh_live + 1024 {
            let mut fresh = std::mem::take(&mut self.fresh);
            fresh.retain(|Reverse((_, i, g))| self.is_live(*i, *g));
            if fresh.is_empty() {
                fresh = BinaryHeap::with_capacity(self.capacity);
            }
            self.fresh = fresh;
        }
    }

    /// The earliest time the poller thread has work to do by itself.
    fn next_wake(&self) -> u64 {
        let kept = self
            .kept
            .iter()
            .find_map(|&(i, g)| {
                let s = self.slot(i)?;
                if s.generation != g {
                    return None;
                }
                s.entry.as_ref().map(|e| e.deadline)
            })
            .unwrap_or(u64::MAX);
        let fresh = self.fresh.peek().map_or(u64::MAX, |Reverse((d, _, _))| *d);
        let trim = if self.parks_since_trim >= TRIM_AFTER {
            self.last_park + TRIM_QUIET_MS
        } else {
            u64::MAX
        };
        kept.min(fresh).min(trim)
    }
}

/// The poller's shared half: parking and flushing from any thread.
pub struct Poller {
    table: Mutex<Table>,
    registry: Registry,
    waker: Waker,
    epoch: Instant,
    park_after: Duration,
    /// Connections woken, on their way to [`dispatch`] (a channel).
    handoff: tokio::sync::mpsc::UnboundedSender<Woken>,
    parks: AtomicU64,
    /// Kept-alive connections parked now (read without the lock).
    kept: AtomicUsize,
    /// New connections parked now.
    fresh: AtomicUsize,
    /// The poller thread has stopped: nothing may be parked any more.
    stopped: AtomicBool,
}

impl Poller {
    /// Starts the poller thread for `keepalive`, parking connections idle
    /// longer than `park_after`. Must be called inside the runtime that is
    /// to serve the resumed connections.
    pub(super) fn start(keepalive: &Arc<KeepAlive>, park_after: Duration) -> std::io::Result<Arc<Poller>> {
        let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        let (handoff, woken) = tokio::sync::mpsc::unbounded_channel();
        let poller = Arc::new(Poller {
            // Every parked connection holds a descriptor: the open-files
            // limit bounds them. Reserved, not touched (resident only as
            // used), but capped: address space reserved is still committed
            // memory under strict overcommit (`vm.overcommit_memory = 2`).
            // Past the cap the vectors grow as vectors do.
            table: Mutex::new(Table::reserved(crate::sizing::open_files_limit().min(RESERVE_MAX))),
            registry,
            waker,
            epoch: Instant::now(),
            park_after,
            handoff,
            parks: AtomicU64::new(0),
            kept: AtomicUsize::new(0),
            fresh: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        });
        let spawner = runtime.clone();
        runtime.spawn(dispatch(woken, spawner));
        let thread = Arc::clone(&poller);
        let ka = Arc::clone(keepalive);
        std::thread::Builder::new()
            .name("portico-keepalive".into())
            .spawn(move || thread.run(poll, &ka))?;
        let wake = Arc::clone(&poller);
        crate::drain::on_start(Box::new(move || {
            let _ = wake.waker.wake();
        }));
        Ok(poller)
    }

    /// How long a connection's task waits for bytes before parking it.
    pub fn park_after(&self) -> Duration {
        self.park_after
    }

    /// Whether connections can be parked (false once the thread stopped).
    pub fn is_running(&self) -> bool {
        !self.stopped.load(Relaxed)
    }

    /// Closes every parked connection.
    fn close_all(&self) {
        let mut t = self.lock();
        let all: Vec<Held> = t
            .slots
            .iter_mut()
            .filter_map(|s| s.entry.take().map(|e| (e, s.client.take())))
            .collect();
        *t = Table {
            wake_at: u64::MAX,
            ..Table::default()
        };
        self.publish(&t);
        drop(t);
        drop(all);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, t: &Table) {
        self.kept.store(t.kept_live, Relaxed);
        self.fresh.store(t.fresh_live, Relaxed);
    }

    /// Kept-alive connections parked now.
    pub fn kept(&self) -> usize {
        self.kept.load(Relaxed)
    }

    /// New connections (no request yet) parked now.
    pub fn fresh(&self) -> usize {
        self.fresh.load(Relaxed)
    }

    /// Connections handed to the poller since start.
    pub fn parks(&self) -> u64 {
        self.parks.load(Relaxed)
    }

    /// Holds `conn` until its client sends (then `resume` gets it), its
    /// `deadline` passes, or a flush or drain closes it. A socket that
    /// cannot be watched is closed.
    pub fn park(&self, conn: Parked, deadline: Instant, resume: Arc<dyn Resume>) {
        if crate::drain::is_draining() || !self.is_running() {
            return; // closed: a drain closes idle connections at once
        }
        let fd = conn.stream.as_raw_fd();
        let fresh = conn.served == 0;
        let deadline = u64::try_from(deadline.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX);
        let now = self.now();
        let (index, generation, wake) = {
            let mut t = self.lock();
            let (open, client) = conn.open.split();
            let entry = Entry {
                stream: conn.stream,
                served: conn.served,
                waited_ms: millis(conn.waited),
                patience_ms: u32::try_from(deadline.saturating_sub(now)).unwrap_or(u32::MAX),
                deadline,
                resume,
                open,
            };
            let (i, g) = t.insert((entry, client), fresh);
            t.parks_since_trim += 1;
            t.last_park = now;
            let wake = deadline < t.wake_at || t.parks_since_trim == TRIM_AFTER;
            if wake {
                t.wake_at = t.wake_at.min(deadline);
            }
            self.publish(&t);
            (i, g, wake)
        };
        self.parks.fetch_add(1, Relaxed);
        // Registered after the slot is filled, so an event that comes at
        // once finds it; epoll reports bytes that are already waiting.
        let token = Token(index as usize | (generation as usize) << 32);
        if self
            .registry
            .register(&mut SourceFd(&fd), token, Interest::READABLE)
            .is_err()
        {
            let mut t = self.lock();
            let gone = t.take(index, generation);
            self.publish(&t);
            drop(t);
            drop(gone);
            return;
        }
        // A drain that began since the check above has already swept the
        // table: wake the thread to sweep this one too.
        if wake || crate::drain::is_draining() {
            let _ = self.waker.wake();
        }
    }

    /// Closes the kept-alive connection parked the longest, if any (a flush).
    pub fn close_oldest(&self) -> bool {
        let mut t = self.lock();
        let oldest = t.take_oldest_kept();
        self.publish(&t);
        drop(t);
        oldest.is_some()
    }

    fn run(&self, mut poll: Poll, ka: &KeepAlive) {
        let mut events = Events::with_capacity(1024);
        let mut woken: Vec<Held> = Vec::new();
        let mut expired: Vec<Held> = Vec::new();
        loop {
            let timeout = {
                let mut t = self.lock();
                let at = t.next_wake();
                t.wake_at = at;
                (at != u64::MAX).then(|| Duration::from_millis(at.saturating_sub(self.now())))
            };
            if let Err(e) = poll.poll(&mut events, timeout)
                && e.kind() != std::io::ErrorKind::Interrupted
            {
                // Connections it held cannot be woken: close them, and
                // let idle connections wait in their own tasks from now on.
                tracing::error!(
                    "keep-alive poller stopped: {cause}; idle connections now wait in their own tasks",
                    cause = crate::util::io_cause(&e)
                );
                self.stopped.store(true, Relaxed);
                self.close_all();
                return;
            }
            {
                let mut t = self.lock();
                for ev in events.iter() {
                    if ev.token() == WAKE {
                        continue;
                    }
                    let index = (ev.token().0 & 0xffff_ffff) as u32;
                    let generation = (ev.token().0 >> 32) as u32;
                    woken.extend(t.take(index, generation));
                }
                self.publish(&t);
            }
            let now = self.now();
            for held in woken.drain(..) {
                self.wake(held, now);
            }
            if crate::drain::is_draining() {
                self.close_all();
                continue;
            }
            let now = self.now();
            let trim = {
                let mut t = self.lock();
                t.take_expired(now, &mut expired);
                self.publish(&t);
                let quiet = t.parks_since_trim >= TRIM_AFTER && now >= t.last_park + TRIM_QUIET_MS;
                if quiet {
                    t.parks_since_trim = 0;
                }
                quiet
            };
            for (entry, _client) in expired.drain(..) {
                if entry.served == 0 {
                    ka.header_timed_out();
                } else {
                    ka.timed_out();
                }
            }
            if trim {
                trim_heap();
            }
        }
    }

    /// The client of a parked connection sent something, closed, or failed.
    fn wake(&self, (entry, client): Held, now: u64) {
        let mut one = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        let ready = match socket2::SockRef::from(&entry.stream).peek(&mut one) {
            Ok(0) => return, // the client closed: so do we
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(_) => return,
        };
        let fd = entry.stream.as_raw_fd();
        if self.registry.deregister(&mut SourceFd(&fd)).is_err() {
            return;
        }
        let parked = Duration::from_millis(now.saturating_sub(entry.parked_at()));
        let waited = Duration::from_millis(u64::from(entry.waited_ms));
        let conn = Parked {
            stream: entry.stream,
            served: entry.served,
            waited: next_wait(self.park_after, waited, parked),
            open: crate::drain::ConnGuard::join(entry.open, client),
        };
        // Fails only once the runtime, and its dispatch task, are gone:
        // the connection is then closed.
        let _ = self.handoff.send((conn, ready, entry.resume));
    }
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("park_after", &self.park_after)
            .field("kept", &self.kept())
            .field("fresh", &self.fresh())
            .field("parks", &self.parks())
            .finish_non_exhaustive()
    }
}

/// Gives woken connections their tasks. A task of the runtime rather than
/// the poller thread spawns them, so that their memory comes from the
/// runtime's threads' allocator arenas: spawned on the poller thread, every
/// burst of resumed connections would grow an arena of that thread's own,
/// which glibc keeps partly resident (its top pad and the pages around what
/// stays allocated in it) long after the burst.
async fn dispatch(mut woken: tokio::sync::mpsc::UnboundedReceiver<Woken>, runtime: tokio::runtime::Handle) {
    while let Some((conn, ready, resume)) = woken.recv().await {
        resume.resume(conn, ready, &runtime);
    }
}

/// How long a resumed connection's task is to wait before parking it
/// again, given that its last task waited `waited` and the client then spoke
/// `parked` after the parking. A client that spoke sooner than the task had
/// waited (a request every 150 ms against a 100 ms wait) would be parked and
/// resumed for every request, each costing `epoll_ctl` calls, a wake-up and
/// a spawn: such a connection's wait doubles (up to `MAX_WAIT_FACTOR` times
/// `base`, the configured `park_after`). One that stayed parked longer is
/// idle between requests: back to `base`. The Sun proxy's server switched between
/// its low-latency and high-concurrency modes on load; this decides per
/// connection.
fn next_wait(base: Duration, waited: Duration, parked: Duration) -> Duration {
    if parked < waited {
        let most = base.checked_mul(MAX_WAIT_FACTOR).unwrap_or(Duration::MAX);
        waited.saturating_mul(2).clamp(base, most)
    } else {
        base
    }
}

/// `d` in whole milliseconds, saturating at `u32::MAX` (49 days).
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// Gives the allocator's free pages back to the system.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only walks glibc's own
    // arenas, under their locks; it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_connection_costs_48_bytes_of_table() {
        // The figure the module documentation and docs/CONFIG.md quote.
        assert_eq!(std::mem::size_of::<Slot>(), 48);
    }

    #[test]
    fn a_connection_resumed_soon_waits_longer_next_time() {
        let ms = Duration::from_millis;
        // Spoke 50 ms after a 100 ms wait: a 150 ms rhythm; wait 200 ms next.
        assert_eq!(next_wait(ms(100), ms(100), ms(50)), ms(200));
        assert_eq!(next_wait(ms(100), ms(200), ms(10)), ms(400));
        // Capped at 32 times park_after.
        assert_eq!(next_wait(ms(100), ms(3200), ms(10)), ms(3200));
        // Parked longer than it waited: idle between requests, back to the base.
        assert_eq!(next_wait(ms(100), ms(800), ms(5000)), ms(100));
        // park_after 0 (park at once) stays 0; a huge one does not overflow.
        assert_eq!(next_wait(ms(0), ms(0), ms(0)), ms(0));
        assert_eq!(next_wait(Duration::MAX, Duration::MAX, ms(1)), Duration::MAX);
    }
}
