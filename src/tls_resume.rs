//! TLS session resumption on client-facing listeners (`[tls]`): stateless
//! session tickets (RFC 5077 for TLS 1.2, RFC 8446 4.6.1 PSK tickets for
//! TLS 1.3) sealed with keys that every worker process of one server
//! shares, and a server-side session cache (TLS 1.2 session IDs; TLS 1.3
//! tickets that name a cached session when tickets are off).
//!
//! **Shared, rotating ticket keys.** The keys come from a hash chain: a
//! 32-byte state `s(p)` for each rotation period `p` (the Unix time divided
//! by `session_ticket_rotation`), `s(p+1) = HKDF-Expand(s(p), "chain")`,
//! and the key of period `p` is `HKDF-Expand(s(p), "key")` (RFC 5869, ring).
//! Whoever holds `s(p)` can derive every later key but no earlier one. The
//! supervisor of `processes = N` draws the first state at random, keeps
//! its copy ratcheted to the oldest period still needed, and hands it to
//! each worker it starts in a sealed memory file that worker alone
//! inherits (`handover`: [`Seed::sealed`], [`Seed::from_supervisor`]); a
//! worker starting as root reads nothing another user could have written.
//! Each worker then advances on its own as the
//! clock passes period boundaries. Every worker thus seals and opens with
//! the same keys without ever talking to another, and a restarted worker
//! gets the keys of the running ones. A process keeps the keys of the
//! periods that can still have sealed a ticket younger than
//! `session_timeout` (plus the current one) and drops older ones, so a
//! captured ticket key cannot open tickets older than that: forward
//! secrecy with a horizon of `session_timeout + session_ticket_rotation`.
//! Keys are never logged nor written anywhere but that one private file.
//!
//! A ticket is `period (8 bytes) | nonce (12) | AES-256-GCM(issued time
//! (8) | rustls's session)`, its additional data the listener's identity
//! ([`listener_id`]: its address and certificates) and the period: a
//! ticket opens only on the listener that issued it, with the certificates
//! it had then (a renewed certificate ends the sessions made under the old
//! one, as nginx's session ID context does), and only while younger than
//! `session_timeout`. Anything else (forged,
//! truncated, too old, from another server) opens to nothing, and rustls
//! then does a full handshake: a bad ticket never fails a handshake.
//!
//! The session cache is per process (a worker's sessions are in its own
//! memory): behind one address served by N workers, a session ID resumes
//! only when the kernel gives the client's next connection to the same
//! worker; tickets resume on any.

use crate::config::TlsConfig;
use ring::aead;
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::{NoServerSessionStorage, ProducesTickets, ServerConfig, StoresServerSessions};
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock, RwLock};

/// The longest `session_timeout`: RFC 8446 4.6.1 caps a TLS 1.3 ticket's
/// lifetime at 7 days.
pub const MAX_TIMEOUT_SECS: u64 = 604_800;

/// The most ticket keys a process keeps (`session_timeout` divided by
/// `session_ticket_rotation`): a week of one-minute rotations.
pub const MAX_KEYS: u64 = 10_080;

/// The environment variable naming, to a worker, the inherited memory file
/// its ticket key seed is in.
pub const ENV_SEED: &str = "PORTICO_TICKET_SEED";

/// TLS 1.3 tickets sent after each full handshake (rustls's default): a
/// client may open two connections that both resume. After a resumed
/// handshake one ([`one_ticket_if_resumed`]).
const TLS13_TICKETS: usize = 2;

thread_local! {
    /// Tickets (or cached sessions) the handshake step running on this
    /// thread may still issue; None: as many as rustls asks for.
    static TICKETS_LEFT: std::cell::Cell<Option<u8>> = const { std::cell::Cell::new(None) };
}

/// Runs `step` (rustls processing a server handshake's records) so that
/// it issues at most one ticket when the handshake `resumed`: OpenSSL (so
/// nginx) sends two TLS 1.3 tickets after a full handshake and one after a
/// resumption, since a client that resumes spends one ticket per
/// connection and has been given the rest before. rustls sends the same
/// number after both; each costs a key derivation, two random draws, an
/// encryption and a NewSessionTicket message on the wire.
pub fn one_ticket_if_resumed<R>(resumed: bool, step: impl FnOnce() -> R) -> R {
    /// Lifts the cap when the step ends, a panic included.
    struct Lift;
    impl Drop for Lift {
        fn drop(&mut self) {
            TICKETS_LEFT.with(|t| t.set(None));
        }
    }
    if !resumed {
        return step();
    }
    TICKETS_LEFT.with(|t| t.set(Some(1)));
    let _lift = Lift;
    step()
}

/// Whether the handshake step running on this thread may issue one more
/// ticket; counts it if so.
fn may_issue_ticket() -> bool {
    TICKETS_LEFT.with(|t| match t.get() {
        None => true,
        Some(0) => false,
        Some(n) => {
            t.set(Some(n - 1));
            true
        }
    })
}

/// Bytes of a ticket before its ciphertext: the period and the nonce.
const HEADER: usize = 8 + aead::NONCE_LEN;

/// The current time in seconds since the epoch.
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An HKDF output length (ring wants a type for it).
struct Len32;

impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

/// `HKDF-Expand(state, info)`, 32 bytes.
fn expand(state: &[u8; 32], info: &[u8]) -> [u8; 32] {
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, state);
    let mut out = [0u8; 32];
    // Expanding 32 bytes from SHA-256 cannot fail (the limit is 255 * 32).
    if let Ok(okm) = prk.expand(&[info], Len32) {
        let _ = okm.fill(&mut out);
    }
    out
}

/// The chain's next state.
fn next_state(state: &[u8; 32]) -> [u8; 32] {
    expand(state, b"portico ticket key chain")
}

/// The ticket key of a state's period.
fn key_of(state: &[u8; 32]) -> [u8; 32] {
    expand(state, b"portico ticket key")
}

/// A point of the key chain: the state of one period, and the rotation
/// interval that numbers the periods. What the supervisor hands a worker.
#[derive(Clone, PartialEq, Eq)]
pub struct Seed {
    /// `session_ticket_rotation`, seconds.
    interval: u64,
    /// The period `state` belongs to.
    period: u64,
    state: [u8; 32],
}

/// Never the state itself, in a log or a panic message.
impl std::fmt::Debug for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seed")
            .field("interval", &self.interval)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl Seed {
    /// A new random chain whose first state belongs to the oldest period
    /// a process keeps at `now` (so every key the processes need derives
    /// from it).
    pub fn generate(t: &TlsConfig, now: u64) -> Result<Seed, String> {
        let mut state = [0u8; 32];
        SystemRandom::new()
            .fill(&mut state)
            .map_err(|_| "cannot draw a random ticket key seed".to_string())?;
        let interval = interval_of(t);
        Ok(Seed {
            interval,
            period: oldest_needed(now / interval, window(t, interval)),
            state,
        })
    }

    /// Moves the seed forward to `period` (never back): the states before
    /// it are gone from this copy.
    pub fn advance_to(&mut self, period: u64) {
        while self.period < period {
            self.state = next_state(&self.state);
            self.period += 1;
        }
    }

    /// Moves the seed forward to the oldest period a process still needs
    /// at `now`, as the supervisor does between worker starts.
    pub fn ratchet(&mut self, t: &TlsConfig, now: u64) {
        let oldest = oldest_needed(now / self.interval, window(t, self.interval));
        self.advance_to(oldest);
    }

    fn encode(&self) -> [u8; 48] {
        let mut out = [0u8; 48];
        out[..8].copy_from_slice(&self.interval.to_be_bytes());
        out[8..16].copy_from_slice(&self.period.to_be_bytes());
        out[16..].copy_from_slice(&self.state);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Seed> {
        let interval = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
        let period = u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
        let state: [u8; 32] = bytes.get(16..48)?.try_into().ok()?;
        (bytes.len() == 48 && interval > 0).then_some(Seed {
            interval,
            period,
            state,
        })
    }

    /// The seed in a sealed memory file for a worker to inherit
    /// (`handover`): no file anyone else could write or read.
    pub fn sealed(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        crate::handover::sealed(c"portico-ticket-seed", &self.encode())
    }

    /// In a worker: the seed the supervisor handed it (the memory file
    /// named by [`ENV_SEED`], closed once read). None outside a worker or
    /// when the supervisor could not hand one; an error when what is named
    /// is not a sealed memory file holding a seed.
    pub fn from_supervisor() -> Result<Option<Seed>, String> {
        let Some(bytes) = crate::handover::take_sealed(ENV_SEED) else {
            return Ok(None);
        };
        let bytes = bytes.map_err(|e| format!("ticket key seed: {e}"))?;
        Seed::decode(&bytes)
            .map(Some)
            .ok_or_else(|| format!("ticket key seed from {ENV_SEED}: not a seed"))
    }
}

/// `session_ticket_rotation` in whole seconds (at least 1).
fn interval_of(t: &TlsConfig) -> u64 {
    t.session_ticket_rotation.get().as_secs().max(1)
}

/// Periods before the current one whose keys are kept: enough that a
/// ticket younger than `session_timeout` still opens.
fn window(t: &TlsConfig, interval: u64) -> u64 {
    t.session_timeout.get().as_secs().div_ceil(interval).min(MAX_KEYS)
}

fn oldest_needed(current: u64, window: u64) -> u64 {
    current.saturating_sub(window)
}

/// The ticket keys a process holds: the chain's newest state, and the keys
/// of the periods from `window` before it up to it. Pure: the clock is a
/// parameter of every method.
struct KeyRing {
    interval: u64,
    window: u64,
    /// The chain's state for the newest period (`keys.back()`).
    newest: Seed,
    /// (period, key), oldest first.
    keys: VecDeque<(u64, [u8; 32])>,
}

impl KeyRing {
    fn new(seed: Seed, window: u64, now: u64) -> KeyRing {
        let mut ring = KeyRing {
            interval: seed.interval,
            window,
            keys: VecDeque::from([(seed.period, key_of(&seed.state))]),
            newest: seed,
        };
        ring.advance(now);
        ring
    }

    /// Takes the keys of the periods up to `now`'s, dropping those that
    /// can no longer open a ticket younger than the timeout.
    fn advance(&mut self, now: u64) {
        let current = now / self.interval;
        while self.newest.period < current {
            self.newest.advance_to(self.newest.period + 1);
            // Keys too old to be kept are never stored (a long jump of the clock).
            if self.newest.period + self.window >= current {
                self.keys.push_back((self.newest.period, key_of(&self.newest.state)));
            }
        }
        while self.keys.len() > 1
            && self
                .keys
                .front()
                .is_some_and(|(p, _)| p + self.window < self.newest.period)
        {
            self.keys.pop_front();
        }
    }

    fn key(&self, period: u64) -> Option<&[u8; 32]> {
        let first = self.keys.front()?.0;
        let i = usize::try_from(period.checked_sub(first)?).ok()?;
        self.keys.get(i).filter(|(p, _)| *p == period).map(|(_, k)| k)
    }
}

/// The additional data of a ticket: the listener and the period.
fn aad(context: &[u8], period: u64) -> Vec<u8> {
    let mut a = Vec::with_capacity(context.len() + 8);
    a.extend_from_slice(context);
    a.extend_from_slice(&period.to_be_bytes());
    a
}

fn sealing_key(key: &[u8; 32]) -> Option<aead::LessSafeKey> {
    aead::UnboundKey::new(&aead::AES_256_GCM, key)
        .ok()
        .map(aead::LessSafeKey::new)
}

/// Seals `plain` for the listener `context` with the key of the newest
/// period, stamped with `now`.
fn seal(ring: &KeyRing, context: &[u8], plain: &[u8], now: u64) -> Option<Vec<u8>> {
    let (period, key) = ring.keys.back()?;
    let key = sealing_key(key)?;
    let mut nonce = [0u8; aead::NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).ok()?;
    let mut out = Vec::with_capacity(HEADER + 8 + plain.len() + aead::AES_256_GCM.tag_len());
    out.extend_from_slice(&period.to_be_bytes());
    out.extend_from_slice(&nonce);
    let mut body = Vec::with_capacity(8 + plain.len() + aead::AES_256_GCM.tag_len());
    body.extend_from_slice(&now.to_be_bytes());
    body.extend_from_slice(plain);
    key.seal_in_place_append_tag(
        aead::Nonce::assume_unique_for_key(nonce),
        aead::Aad::from(aad(context, *period)),
        &mut body,
    )
    .ok()?;
    out.extend_from_slice(&body);
    Some(out)
}

/// Opens a ticket (attacker-controlled bytes) for the listener `context`:
/// None unless its period's key is still held, it authenticates, and it
/// was issued less than `timeout` seconds before `now`.
fn open(ring: &KeyRing, context: &[u8], ticket: &[u8], timeout: u64, now: u64) -> Option<Vec<u8>> {
    let period = u64::from_be_bytes(ticket.get(..8)?.try_into().ok()?);
    let nonce: [u8; aead::NONCE_LEN] = ticket.get(8..HEADER)?.try_into().ok()?;
    let key = sealing_key(ring.key(period)?)?;
    let mut body = ticket.get(HEADER..)?.to_vec();
    let plain = key
        .open_in_place(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad(context, period)),
            &mut body,
        )
        .ok()?;
    let issued = u64::from_be_bytes(plain.get(..8)?.try_into().ok()?);
    // A clock set back makes a ticket look issued in the future: its age
    // is then taken as 0, and the key window still bounds it.
    if now.saturating_sub(issued) >= timeout {
        return None;
    }
    Some(plain[8..].to_vec())
}

/// The process's ticket keys, shared by the listeners.
struct Tickets {
    ring: RwLock<KeyRing>,
    timeout: u64,
}

impl Tickets {
    /// The ring advanced to `now` (a write lock only when a period began).
    fn with_ring<T>(&self, now: u64, f: impl FnOnce(&KeyRing) -> T) -> T {
        {
            let ring = self.ring.read().unwrap_or_else(|e| e.into_inner());
            if now / ring.interval <= ring.newest.period {
                return f(&ring);
            }
        }
        let mut ring = self.ring.write().unwrap_or_else(|e| e.into_inner());
        ring.advance(now);
        f(&ring)
    }
}

/// One listener's ticketer: the process's keys, the listener's identity
/// bound into every ticket.
#[derive(Clone)]
struct ListenerTickets {
    shared: Arc<Tickets>,
    context: Vec<u8>,
}

impl std::fmt::Debug for ListenerTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTickets").finish_non_exhaustive()
    }
}

impl ProducesTickets for ListenerTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        u32::try_from(self.shared.timeout.min(MAX_TIMEOUT_SECS)).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        if !may_issue_ticket() {
            return None;
        }
        let now = now_unix();
        let t = self.shared.with_ring(now, |r| seal(r, &self.context, plain, now));
        if t.is_some() {
            COUNTERS.tickets_issued.fetch_add(1, Relaxed);
        }
        t
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let now = now_unix();
        let plain = self
            .shared
            .with_ring(now, |r| open(r, &self.context, cipher, self.shared.timeout, now));
        if plain.is_none() {
            COUNTERS.tickets_refused.fetch_add(1, Relaxed);
        }
        plain
    }
}

/// The process's session cache: bounded (quick_cache's S3-FIFO eviction),
/// each entry kept until `session_timeout` after it was stored.
struct SessionCache {
    map: quick_cache::sync::Cache<Vec<u8>, (Vec<u8>, u64)>,
    timeout: u64,
    limit: u64,
}

impl SessionCache {
    fn found(&self, entry: Option<(Vec<u8>, u64)>, key: &[u8], now: u64) -> Option<Vec<u8>> {
        match entry {
            Some((value, expires)) if now < expires => {
                COUNTERS.cache_hits.fetch_add(1, Relaxed);
                Some(value)
            }
            Some(_) => {
                self.map.remove(key);
                COUNTERS.cache_misses.fetch_add(1, Relaxed);
                None
            }
            None => {
                COUNTERS.cache_misses.fetch_add(1, Relaxed);
                None
            }
        }
    }
}

/// One listener's view of the session cache: its keys prefixed with the
/// listener's identity, so a session resumes only where it was made.
#[derive(Clone)]
struct ListenerCache {
    shared: Arc<SessionCache>,
    context: Vec<u8>,
}

impl std::fmt::Debug for ListenerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerCache").finish_non_exhaustive()
    }
}

impl ListenerCache {
    fn key(&self, id: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.context.len() + 1 + id.len());
        k.extend_from_slice(&self.context);
        k.push(0);
        k.extend_from_slice(id);
        k
    }
}

impl StoresServerSessions for ListenerCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        // Also TLS 1.3's tickets when there are no ticket keys: each names
        // a session stored here.
        if !may_issue_ticket() {
            return false;
        }
        let expires = now_unix().saturating_add(self.shared.timeout);
        self.shared.map.insert(self.key(&key), (value, expires));
        true
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let k = self.key(key);
        self.shared.found(self.shared.map.get(&k), &k, now_unix())
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        let k = self.key(key);
        let entry = self.shared.map.remove(&k).map(|(_, v)| v);
        self.shared.found(entry, &k, now_unix())
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// This process's resumption state: installed once at start, used by every
/// listener's configuration (and kept across reloads, which rebuild them).
struct Resumption {
    tickets: Option<Arc<Tickets>>,
    cache: Option<Arc<SessionCache>>,
}

static STATE: OnceLock<Resumption> = OnceLock::new();

/// Sets up this process's session cache and ticket keys from `[tls]`,
/// with the supervisor's `seed` in a worker (None: a chain of its own).
pub fn install(t: &TlsConfig, seed: Option<Seed>) -> Result<(), String> {
    let now = now_unix();
    let tickets = if t.session_tickets {
        let seed = match seed {
            Some(s) => s,
            None => Seed::generate(t, now)?,
        };
        let window = window(t, seed.interval);
        Some(Arc::new(Tickets {
            ring: RwLock::new(KeyRing::new(seed, window, now)),
            timeout: t.session_timeout.get().as_secs(),
        }))
    } else {
        None
    };
    let cache = (t.session_cache_entries > 0).then(|| {
        Arc::new(SessionCache {
            map: quick_cache::sync::Cache::new(t.session_cache_entries),
            timeout: t.session_timeout.get().as_secs(),
            limit: t.session_cache_entries as u64,
        })
    });
    let _ = STATE.set(Resumption { tickets, cache });
    Ok(())
}

/// What a listener's sessions are bound to: its address and the DER of
/// every certificate it serves (SHA-256). The same in every worker
/// process (they read the same files); a new certificate makes a new
/// identity, so a session made under the old one is not resumed with the
/// new one (the client would keep trusting the certificate it saw then).
pub fn listener_id<'a>(address: &std::net::SocketAddr, certs: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    let address = address.to_string();
    h.update(&(address.len() as u64).to_be_bytes());
    h.update(address.as_bytes());
    for der in certs {
        h.update(&(der.len() as u64).to_be_bytes());
        h.update(der);
    }
    h.finish().as_ref().to_vec()
}

/// Sets a listener's session storage, ticketer and TLS 1.3 tickets from
/// this process's state ([`install`]), its sessions bound to `context`
/// ([`listener_id`]); rustls's defaults stay where nothing was installed
/// (`portico check`).
pub fn apply(config: &mut ServerConfig, context: Vec<u8>) {
    let Some(state) = STATE.get() else {
        return;
    };
    config.session_storage = match &state.cache {
        Some(c) => Arc::new(ListenerCache {
            shared: c.clone(),
            context: context.clone(),
        }),
        None => Arc::new(NoServerSessionStorage {}),
    };
    if let Some(t) = &state.tickets {
        config.ticketer = Arc::new(ListenerTickets {
            shared: t.clone(),
            context,
        });
    }
    // Without tickets, TLS 1.3 tickets name cached sessions; without
    // either, a ticket could never be used: send none.
    config.send_tls13_tickets = if state.tickets.is_some() || state.cache.is_some() {
        TLS13_TICKETS
    } else {
        0
    };
}

/// The resumption counters of this process.
struct Counters {
    full: AtomicU64,
    resumed: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    tickets_issued: AtomicU64,
    tickets_refused: AtomicU64,
}

static COUNTERS: Counters = Counters {
    full: AtomicU64::new(0),
    resumed: AtomicU64::new(0),
    cache_hits: AtomicU64::new(0),
    cache_misses: AtomicU64::new(0),
    tickets_issued: AtomicU64::new(0),
    tickets_refused: AtomicU64::new(0),
};

/// Counts a completed handshake: full, or resumed (a ticket or a cached session).
pub fn count_handshake(resumed: bool) {
    if resumed {
        COUNTERS.resumed.fetch_add(1, Relaxed);
    } else {
        COUNTERS.full.fetch_add(1, Relaxed);
    }
}

/// This process's resumption figures, as the statistics show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Full handshakes completed.
    pub full: u64,
    /// Resumed handshakes completed.
    pub resumed: u64,
    /// Session cache lookups that found a live session.
    pub cache_hits: u64,
    /// Session cache lookups that found none (unknown, evicted, expired).
    pub cache_misses: u64,
    /// Sessions in the cache now.
    pub cache_entries: u64,
    /// `session_cache_entries` (0: no cache).
    pub cache_limit: u64,
    /// Tickets sealed.
    pub tickets_issued: u64,
    /// Tickets that did not open (forged, too old, another server's).
    pub tickets_refused: u64,
    /// Whether tickets are on.
    pub tickets: bool,
}

/// Reads this process's figures.
pub fn figures() -> Figures {
    let state = STATE.get();
    let cache = state.and_then(|s| s.cache.as_ref());
    Figures {
        full: COUNTERS.full.load(Relaxed),
        resumed: COUNTERS.resumed.load(Relaxed),
        cache_hits: COUNTERS.cache_hits.load(Relaxed),
        cache_misses: COUNTERS.cache_misses.load(Relaxed),
        cache_entries: cache.map_or(0, |c| c.map.len() as u64),
        cache_limit: cache.map_or(0, |c| c.limit),
        tickets_issued: COUNTERS.tickets_issued.load(Relaxed),
        tickets_refused: COUNTERS.tickets_refused.load(Relaxed),
        tickets: state.is_some_and(|s| s.tickets.is_some()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;

    fn tls(timeout: u64, rotation: u64) -> TlsConfig {
        TlsConfig {
            session_timeout: Dur::secs(timeout),
            session_ticket_rotation: Dur::secs(rotation),
            ..TlsConfig::default()
        }
    }

    fn seed_at(t: &TlsConfig, now: u64) -> Seed {
        Seed::generate(t, now).expect("seed")
    }

    #[test]
    fn two_processes_with_the_same_seed_open_each_other_s_tickets() {
        let t = tls(3600, 600);
        let now = 1_000_000;
        let seed = seed_at(&t, now);
        let a = KeyRing::new(seed.clone(), window(&t, 600), now);
        // The second starts later from the supervisor's ratcheted copy.
        let mut later = seed.clone();
        later.ratchet(&t, now + 1_800);
        let b = KeyRing::new(later, window(&t, 600), now + 1_800);
        let ticket = seal(&a, b"l", b"session", now).expect("sealed");
        assert_eq!(
            open(&b, b"l", &ticket, 3600, now + 1_800).as_deref(),
            Some(&b"session"[..])
        );
        let back = seal(&b, b"l", b"other", now + 1_800).expect("sealed");
        let mut a = a;
        a.advance(now + 1_800);
        assert_eq!(open(&a, b"l", &back, 3600, now + 1_800).as_deref(), Some(&b"other"[..]));
    }

    #[test]
    fn a_ticket_opens_until_the_session_timeout_and_never_after() {
        let t = tls(3600, 600);
        let now = 1_000_000;
        let mut ring = KeyRing::new(seed_at(&t, now), window(&t, 600), now);
        let ticket = seal(&ring, b"l", b"s", now).expect("sealed");
        ring.advance(now + 3_599);
        assert!(open(&ring, b"l", &ticket, 3600, now + 3_599).is_some());
        assert!(open(&ring, b"l", &ticket, 3600, now + 3_600).is_none());
        // And once the rotation has dropped its key, not even the timeout is consulted.
        ring.advance(now + 3 * 3_600);
        assert!(ring.key(now / 600).is_none());
        assert!(open(&ring, b"l", &ticket, u64::MAX, now + 3 * 3_600).is_none());
    }

    #[test]
    fn keys_older_than_the_window_are_dropped() {
        let t = tls(3600, 600);
        let now = 6_000_000;
        let mut ring = KeyRing::new(seed_at(&t, now), window(&t, 600), now);
        ring.advance(now + 86_400);
        // The current period and the 6 before it.
        assert_eq!(ring.keys.len(), 7);
        let periods: Vec<u64> = ring.keys.iter().map(|(p, _)| *p).collect();
        let current = (now + 86_400) / 600;
        assert_eq!(periods, (current - 6..=current).collect::<Vec<_>>());
    }

    #[test]
    fn a_forged_truncated_or_foreign_ticket_opens_to_nothing() {
        let t = tls(3600, 600);
        let now = 1_000_000;
        let ring = KeyRing::new(seed_at(&t, now), window(&t, 600), now);
        let other = KeyRing::new(seed_at(&t, now), window(&t, 600), now);
        let ticket = seal(&ring, b"l", b"session", now).expect("sealed");
        // Another server's keys, another listener, a flipped bit, cut short.
        assert!(open(&other, b"l", &ticket, 3600, now).is_none());
        assert!(open(&ring, b"m", &ticket, 3600, now).is_none());
        for i in 0..ticket.len() {
            let mut bad = ticket.clone();
            bad[i] ^= 1;
            assert!(open(&ring, b"l", &bad, 3600, now).is_none(), "bit flipped at {i}");
        }
        for n in 0..ticket.len() {
            assert!(open(&ring, b"l", &ticket[..n], 3600, now).is_none(), "cut to {n}");
        }
        assert!(open(&ring, b"l", &[0xff; 200], 3600, now).is_none());
    }

    #[test]
    fn a_seed_survives_its_memory_file_and_never_shows_its_state() {
        let t = tls(3600, 600);
        let seed = seed_at(&t, 1_000_000);
        assert_eq!(Seed::decode(&seed.encode()), Some(seed.clone()));
        assert!(Seed::decode(&seed.encode()[..47]).is_none());
        let file = std::fs::File::from(seed.sealed().expect("sealed"));
        let bytes = crate::handover::read_whole(&file).expect("read");
        assert_eq!(Seed::decode(&bytes), Some(seed.clone()));
        let debug = format!("{seed:?}");
        let hex: String = seed.state.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!debug.contains(&hex) && !debug.contains(&format!("{:?}", seed.state)));
    }
}
