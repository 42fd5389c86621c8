//! Graceful shutdown (SIGTERM): the process-wide "draining" state and the
//! count of client connections still open.
//!
//! Once draining starts, listeners stop accepting (`server.rs`), idle
//! connections close at once (a new one waits on [`started`] for its first
//! request in `http1::serve`; the keep-alive set shuts down those idle
//! between requests from an [`on_start`] hook), a response whose head is
//! not yet written says `Connection: close` (`ResponseWriter::send_head`
//! checks [`is_draining`]),
//! and a connection ends after its current response. The server exits when
//! [`open_connections`] reaches zero or `server.shutdown_timeout` passes.
//!
//! Process-wide on purpose: one process runs one server, and a global lets
//! the HTTP layer see the state without threading a handle through it.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Shards of the "draining started" notification: every new connection
/// registers with one while it waits for its first request, and a single
/// `Notify` would make all worker threads take the same lock on every one.
const SHARDS: usize = 32;

struct State {
    draining: AtomicBool,
    open: AtomicUsize,
    /// Woken when draining starts.
    started: [Notify; SHARDS],
    /// Woken when the last connection closes during a drain.
    idle: Notify,
}

static STATE: LazyLock<State> = LazyLock::new(|| State {
    draining: AtomicBool::new(false),
    open: AtomicUsize::new(0),
    started: std::array::from_fn(|_| Notify::new()),
    idle: Notify::new(),
});

/// Called when draining starts, for waiters outside the runtime.
type Hook = Box<dyn Fn() + Send + Sync>;

static HOOKS: std::sync::Mutex<Vec<Hook>> = std::sync::Mutex::new(Vec::new());

/// Runs `hook` when draining starts (the keep-alive poller's thread is
/// woken this way to close the connections it holds).
pub fn on_start(hook: Hook) {
    HOOKS.lock().unwrap_or_else(|e| e.into_inner()).push(hook);
}

/// Starts draining: every waiter on [`started`] wakes.
pub fn start() {
    STATE.draining.store(true, Ordering::SeqCst);
    for n in &STATE.started {
        n.notify_waiters();
    }
    for hook in HOOKS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        hook();
    }
    if STATE.open.load(Ordering::SeqCst) == 0 {
        STATE.idle.notify_waiters();
    }
}

/// True once draining has started.
pub fn is_draining() -> bool {
    STATE.draining.load(Ordering::Relaxed)
}

/// Resolves once draining has started (at once if it already has).
/// `spread` picks the shard to wait on (any number that differs between
/// connections, e.g. the client's port).
pub async fn started(spread: usize) {
    let notified = STATE.started[spread % SHARDS].notified();
    tokio::pin!(notified);
    // Registered before the flag is checked, so a start in between is not missed.
    notified.as_mut().enable();
    if STATE.draining.load(Ordering::SeqCst) {
        return;
    }
    notified.await;
}

/// Client connections open now.
pub fn open_connections() -> usize {
    STATE.open.load(Ordering::SeqCst)
}

/// Resolves when no client connection is open (checked after draining started).
pub async fn all_closed() {
    loop {
        let notified = STATE.idle.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if STATE.open.load(Ordering::SeqCst) == 0 {
            return;
        }
        notified.await;
    }
}

/// Counts one open client connection until dropped, and holds its place
/// in its client's count (`limits.max_connections_per_client`), if any.
pub struct ConnGuard {
    count: ConnCount,
    client: Option<crate::client_limit::ClientSlot>,
}

/// The drain's share of a [`ConnGuard`]: the connection counted as open.
/// Apart from the client's place only while the keep-alive poller holds
/// the connection, which keeps the two in separate fields of its table to
/// keep a parked connection at 48 bytes.
pub struct ConnCount(());

/// Registers an open client connection, holding `client` (its place under
/// the per-client cap) for as long.
pub fn track(client: Option<crate::client_limit::ClientSlot>) -> ConnGuard {
    STATE.open.fetch_add(1, Ordering::SeqCst);
    ConnGuard {
        count: ConnCount(()),
        client,
    }
}

impl ConnGuard {
    /// The guard's two shares, each released when dropped.
    pub(crate) fn split(self) -> (ConnCount, Option<crate::client_limit::ClientSlot>) {
        (self.count, self.client)
    }

    /// The guard again from its shares.
    pub(crate) fn join(count: ConnCount, client: Option<crate::client_limit::ClientSlot>) -> ConnGuard {
        ConnGuard { count, client }
    }
}

impl Drop for ConnCount {
    fn drop(&mut self) {
        if STATE.open.fetch_sub(1, Ordering::SeqCst) == 1 && STATE.draining.load(Ordering::SeqCst) {
            STATE.idle.notify_waiters();
        }
    }
}
