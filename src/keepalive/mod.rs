//! The keep-alive subsystem: which idle persistent connections are kept,
//! and its counters (the Sun Java System Web Proxy Server 4's KeepAliveInfo).
//!
//! An idle connection's own task first waits for the next request itself,
//! holding no buffer (`http1::conn`; the Sun proxy's low-latency mode). Past
//! `keepalive.park_after` it hands the bare socket to the keep-alive
//! [`poller`] and ends (the Sun proxy's high-concurrency mode, without a mode
//! switch: each connection moves on its own).
//!
//! At most `keepalive.max_connections` connections may sit idle. When one
//! more becomes idle, the oldest idle one is closed (a **flush**): the one
//! parked the longest, or, with none parked, the oldest of those still
//! waiting in their tasks. Those are an ordered map from a sequence number
//! (the order they became idle) to the socket's file descriptor, so a flush
//! there is `pop_first` plus `shutdown(2)` on that socket, which wakes its
//! task to see end-of-stream and close.

pub mod poller;

use poller::Poller;
use serde::Serialize;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Idle persistent connections and the keep-alive counters.
#[derive(Debug)]
pub struct KeepAlive {
    max: usize,
    timeout: Duration,
    /// Idle connections, oldest first: sequence number -> socket.
    idle: Mutex<BTreeMap<u64, RawFd>>,
    next_seq: AtomicU64,
    count: AtomicUsize,
    hits: AtomicU64,
    flushes: AtomicU64,
    refusals: AtomicU64,
    timeouts: AtomicU64,
    header_timeouts: AtomicU64,
    send_timeouts: AtomicU64,
    poller: OnceLock<Arc<Poller>>,
}

/// A connection's place in the idle set; leaving it (drop) removes the
/// entry. It must be dropped before the socket is closed, so that a flush
/// never shuts down a descriptor number the kernel has already reused.
#[derive(Debug)]
pub struct Idle<'a> {
    keepalive: &'a KeepAlive,
    seq: u64,
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        let ka = self.keepalive;
        let mut idle = ka.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.remove(&self.seq).is_some() {
            ka.count.store(idle.len(), Relaxed);
        }
    }
}

impl KeepAlive {
    /// At most `max` idle connections (at least 1), each kept `timeout`;
    /// a zero `timeout` turns keep-alive off. When draining starts (SIGTERM)
    /// every connection idle in its task is closed at once
    /// ([`KeepAlive::close_idle`]); those parked by the poller are closed by it.
    pub fn new(max: usize, timeout: Duration) -> Arc<KeepAlive> {
        let ka = Arc::new(KeepAlive::unwatched(max, timeout));
        let weak = Arc::downgrade(&ka);
        crate::drain::on_start(Box::new(move || {
            if let Some(ka) = weak.upgrade() {
                ka.close_idle();
            }
        }));
        ka
    }

    /// Shuts down every connection idle in its task; each task sees
    /// end-of-stream and closes (its guard then leaves the set). A
    /// connection that enters the set afterwards sees
    /// [`crate::drain::is_draining`] instead: the drain sets that flag
    /// before it calls this, which takes the set's lock after any entry made
    /// before it.
    fn close_idle(&self) {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        for &fd in idle.values() {
            // SAFETY: as for a flush in `enter`: `fd` belongs to a
            // connection whose `Idle` guard has not been dropped (dropping
            // it removes the entry, under this lock), and the guard is
            // dropped before its socket is closed, so `fd` is still that
            // open socket. shutdown(2) only ends the TCP connection.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
    }

    /// The set itself, with no drain hook ([`KeepAlive::new`] adds it).
    fn unwatched(max: usize, timeout: Duration) -> KeepAlive {
        KeepAlive {
            max: max.max(1),
            timeout,
            idle: Mutex::new(BTreeMap::new()),
            next_seq: AtomicU64::new(0),
            count: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            header_timeouts: AtomicU64::new(0),
            send_timeouts: AtomicU64::new(0),
            poller: OnceLock::new(),
        }
    }

    /// Starts the keep-alive poller (once; later calls do nothing): from
    /// then on connections idle longer than `park_after` are handed to it.
    /// Without it every idle connection waits in its own task.
    pub fn start_poller(self: &Arc<Self>, park_after: Duration) -> std::io::Result<()> {
        if self.poller.get().is_some() {
            return Ok(());
        }
        let poller = Poller::start(self, park_after)?;
        let _ = self.poller.set(poller);
        Ok(())
    }

    /// The keep-alive poller, once started.
    pub fn poller(&self) -> Option<&Arc<Poller>> {
        self.poller.get().filter(|p| p.is_running())
    }

    /// Whether connections are kept between requests at all.
    pub fn enabled(&self) -> bool {
        !self.timeout.is_zero()
    }

    /// How long an idle connection is kept.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Enters `socket` into the idle set, closing the oldest idle
    /// connections if the set is full. The caller must keep the socket open
    /// until the returned guard is dropped.
    pub fn enter<S: AsRawFd>(&self, socket: &S) -> Idle<'_> {
        let seq = self.next_seq.fetch_add(1, Relaxed);
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let parked = || self.poller.get().map_or(0, |p| p.kept());
        while idle.len() + parked() >= self.max {
            // Parked connections have been idle longer than any in the map.
            if self.poller.get().is_some_and(|p| p.close_oldest()) {
                self.flushes.fetch_add(1, Relaxed);
                continue;
            }
            let Some((_, fd)) = idle.pop_first() else { break };
            // SAFETY: `fd` belongs to a connection whose `Idle` guard has not
            // been dropped (it would have removed the entry, under this same
            // lock), and the guard is dropped before its socket is closed:
            // so `fd` is still that open socket. shutdown(2) only ends the
            // TCP connection; the owning task sees end-of-stream and closes.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
            self.flushes.fetch_add(1, Relaxed);
        }
        idle.insert(seq, socket.as_raw_fd());
        self.count.store(idle.len(), Relaxed);
        Idle { keepalive: self, seq }
    }

    /// A request arrived on a connection that had served one before.
    pub fn hit(&self) {
        self.hits.fetch_add(1, Relaxed);
    }

    /// A completed response's connection is closed instead of kept.
    pub fn refusal(&self) {
        self.refusals.fetch_add(1, Relaxed);
    }

    /// An idle connection was closed after `keepalive.timeout`.
    pub fn timed_out(&self) {
        self.timeouts.fetch_add(1, Relaxed);
    }

    /// A connection was closed because no complete request head arrived
    /// within `limits.header_timeout`.
    pub fn header_timed_out(&self) {
        self.header_timeouts.fetch_add(1, Relaxed);
    }

    /// A connection was closed because its client accepted no response
    /// bytes for `limits.send_timeout`.
    pub fn send_timed_out(&self) {
        self.send_timeouts.fetch_add(1, Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> KeepAliveInfo {
        let p = self.poller.get();
        let parked = p.map_or(0, |p| p.kept());
        KeepAliveInfo {
            count: self.count.load(Relaxed) + parked,
            parked,
            parked_new: p.map_or(0, |p| p.fresh()),
            parks: p.map_or(0, |p| p.parks()),
            max: self.max,
            hits: self.hits.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            refusals: self.refusals.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            timeout_secs: self.timeout.as_secs_f64(),
            header_timeouts: self.header_timeouts.load(Relaxed),
            send_timeouts: self.send_timeouts.load(Relaxed),
        }
    }
}

/// The keep-alive counters (the Sun proxy's KeepAliveInfo section of perfdump).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct KeepAliveInfo {
    /// Idle persistent connections now ("KeepAliveCount", first number).
    pub count: usize,
    /// `keepalive.max_connections` ("KeepAliveCount", second number).
    pub max: usize,
    /// Of `count`, those held by the keep-alive poller (idle longer than
    /// `keepalive.park_after`).
    #[serde(default)]
    pub parked: usize,
    /// New connections that have not sent a request yet, held by the poller.
    #[serde(default)]
    pub parked_new: usize,
    /// Connections handed to the poller since start.
    #[serde(default)]
    pub parks: u64,
    /// Requests that arrived on a connection kept alive, i.e. not the first on it
    /// ("KeepAliveHits").
    pub hits: u64,
    /// Idle connections closed to make room for a newer one ("KeepAliveFlushes").
    pub flushes: u64,
    /// Connections closed after a complete response instead of kept: the
    /// client did not ask for keep-alive (HTTP/1.0 without it,
    /// `Connection: close`), `keepalive.max_requests` was reached,
    /// keep-alive is off, or the response needed a close (an HTTP/1.0
    /// body of unknown length, an error that ends the connection)
    /// ("KeepAliveRefusals").
    pub refusals: u64,
    /// Idle connections closed after `keepalive.timeout` ("KeepAliveTimeouts").
    pub timeouts: u64,
    /// `keepalive.timeout` in seconds ("KeepAliveTimeout").
    pub timeout_secs: f64,
    /// Connections closed because a request head was not complete within
    /// `limits.header_timeout` (slow or silent clients, slowloris).
    pub header_timeouts: u64,
    /// Connections closed because the client accepted no response bytes
    /// for `limits.send_timeout` (a client that does not read).
    #[serde(default)]
    pub send_timeouts: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_full_set_closes_the_oldest() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).unwrap());
            servers.push(listener.accept().unwrap().0);
        }
        let ka = KeepAlive::new(2, Duration::from_secs(15));
        let first = ka.enter(&servers[0]);
        let _second = ka.enter(&servers[1]);
        assert_eq!(ka.snapshot().count, 2);
        let _third = ka.enter(&servers[2]);
        let s = ka.snapshot();
        assert_eq!((s.count, s.max, s.flushes), (2, 2, 1));
        // The oldest connection's client sees end-of-stream.
        let mut buf = [0u8; 1];
        assert_eq!(clients[0].read(&mut buf).unwrap(), 0);
        drop(first); // already flushed: nothing left to remove
        assert_eq!(ka.snapshot().count, 2);
    }
}
