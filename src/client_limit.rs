//! `limits.max_connections_per_client`: the most connections one client
//! may hold open at once, over every listener of the process, as Squid's
//! `client_ip_max_connections` and nginx's `limit_conn` by address. Without
//! it one client (a runaway script, a crawler, an attacker with one
//! address) can take every connection and service place Portico has.
//!
//! Checked at accept, before anything is read: a connection past the cap is
//! closed at once (there is no request yet to answer, and on a TLS or SOCKS
//! listener nothing could be said in the clear), counted, and logged at
//! most once a second. An IPv4 client is its address (an IPv4-mapped IPv6
//! address counts as its IPv4 address); an IPv6 client is its /64, within
//! which a host may change addresses at will, so that it cannot step past
//! the cap that way (the hosts of one IPv6 LAN then count as one client,
//! as hosts behind one IPv4 NAT address do). The other members of this
//! node's proxy array are exempt.
//!
//! The count is kept by the worker processes together (`shared_conns`), so
//! that with `server.processes = N` the cap holds over all of them; a
//! connection holds a 4-byte index to its client's count ([`ClientSlot`]).
//! A client for which that table has no room is counted by its process
//! alone, in a table of 16 shards keyed by the client, entries freed when
//! their last connection closes. With the cap at 0 (the default) nothing
//! is counted or looked up.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The cap in force; 0: none.
static LIMIT: AtomicU32 = AtomicU32::new(0);
/// Connections closed at accept for being past the cap.
static REFUSED: AtomicU64 = AtomicU64::new(0);
/// When the last refusal was logged, in seconds since the Unix epoch.
static LOGGED: AtomicU64 = AtomicU64::new(0);
/// When a client was last counted by this process alone (no room in the
/// shared table).
static NO_ROOM_LOGGED: AtomicU64 = AtomicU64::new(0);
/// Connections counted by this process alone, since start.
static COUNTED_APART: AtomicU64 = AtomicU64::new(0);

/// Connections counted by this process alone for want of room in the
/// shared table, since start.
pub fn counted_apart() -> u64 {
    COUNTED_APART.load(Ordering::Relaxed)
}

/// A [`ClientSlot`] in the shared table has this bit set, and the slot's
/// number below it; one in the process's own table has it clear.
const SHARED: u32 = 1 << 31;

const SHARDS: usize = 16;

/// One shard of the count: each client's open connections, in a slab so
/// that a connection's place is a 4-byte index ([`ClientSlot`]). A parked
/// keep-alive connection carries it in the poller's table, whose 48-byte
/// slot it fits beside the slot's generation.
#[derive(Default)]
struct Shard {
    /// Client key -> its index in `counts`.
    index: HashMap<u128, u32>,
    /// (client key, open connections); count 0: free.
    counts: Vec<(u128, u32)>,
    free: Vec<u32>,
}

fn table() -> &'static [Mutex<Shard>; SHARDS] {
    static TABLE: std::sync::OnceLock<[Mutex<Shard>; SHARDS]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|_| Mutex::new(Shard::default())))
}

fn lock(shard: usize) -> std::sync::MutexGuard<'static, Shard> {
    table()[shard].lock().unwrap_or_else(|p| p.into_inner())
}

/// The client a connection from `ip` counts under: an IPv4 address (the
/// low 32 bits), or an IPv6 /64 (the high 64 bits, tagged by bit 32, which
/// no IPv4 key has).
pub(crate) fn key(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => (u128::from(v6) & !((1u128 << 64) - 1)) | (1 << 32),
    }
}

/// Which of the 16 shards of the process's own table `key`'s count lives in.
fn shard_of(key: u128) -> usize {
    (xxhash_rust::xxh3::xxh3_64(&key.to_le_bytes()) as usize) % SHARDS
}

/// Addresses the cap does not apply to: the other members of this node's
/// proxy array, whose forwarded requests all come from one address each.
static EXEMPT: std::sync::OnceLock<arc_swap::ArcSwap<Vec<IpAddr>>> = std::sync::OnceLock::new();

fn exempt() -> &'static arc_swap::ArcSwap<Vec<IpAddr>> {
    EXEMPT.get_or_init(|| arc_swap::ArcSwap::from_pointee(Vec::new()))
}

/// Sets the cap and the addresses it does not apply to (start-up and every
/// reload). Connections open while the cap was 0 are not counted against
/// a cap set later.
pub(crate) fn set_limit(limit: u32, exempt_ips: Vec<IpAddr>) {
    exempt().store(std::sync::Arc::new(exempt_ips));
    LIMIT.store(limit, Ordering::Relaxed);
}

/// Whether `ip` is exempt from the per-client limits (another member of
/// this node's proxy array).
pub(crate) fn is_exempt(ip: IpAddr) -> bool {
    exempt().load().contains(&ip.to_canonical())
}

/// Connections closed at accept for being past the cap, since start.
pub fn refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// One open connection's place in its client's count, given back on drop:
/// [`SHARED`] and the slot in the shared table, or the shard (low 4 bits)
/// and the client's index in the process's own table, plus one.
#[derive(Debug)]
pub(crate) struct ClientSlot(std::num::NonZeroU32);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        if self.0.get() & SHARED != 0 {
            crate::shared_conns::release(self.0.get() & !SHARED);
            return;
        }
        let v = self.0.get() - 1;
        let (shard, i) = ((v as usize) % SHARDS, v / SHARDS as u32);
        let mut s = lock(shard);
        let Some((key, n)) = s.counts.get_mut(i as usize) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            let key = *key;
            s.index.remove(&key);
            s.free.push(i);
        }
    }
}

/// Takes a place for a new connection from `ip`: Ok(None) when no cap is
/// set, Ok(slot) under it, Err(open) when the client holds `open`
/// connections already, the cap or more (counted and logged).
pub(crate) fn admit(ip: IpAddr) -> Result<Option<ClientSlot>, u32> {
    let limit = LIMIT.load(Ordering::Relaxed);
    if limit == 0 || is_exempt(ip) {
        return Ok(None);
    }
    let key = key(ip);
    match crate::shared_conns::admit(key, limit) {
        crate::shared_conns::Admit::In(slot) => {
            return Ok(std::num::NonZeroU32::new(slot | SHARED).map(ClientSlot));
        }
        crate::shared_conns::Admit::Over(open) => return Err(refuse(ip, open, limit)),
        crate::shared_conns::Admit::NoRoom => {
            COUNTED_APART.fetch_add(1, Ordering::Relaxed);
            if crate::util::log_due(&NO_ROOM_LOGGED) {
                tracing::warn!(
                    client = %ip,
                    "the table of connection counts shared by the worker processes (limits.client_table = {}) \
                     is full where this client hashes: its connections are counted by this process alone \
                     (logged at most once a second, counted as the perfdump's Connections Counted Apart)",
                    crate::shared_conns::size()
                );
            }
        }
    }
    admit_here(ip, key, limit)
}

/// [`admit`] in the process's own table.
fn admit_here(ip: IpAddr, key: u128, limit: u32) -> Result<Option<ClientSlot>, u32> {
    let shard = shard_of(key);
    let mut s = lock(shard);
    let i = match s.index.get(&key) {
        Some(&i) => i,
        None => {
            let i = match s.free.pop() {
                Some(i) => {
                    s.counts[i as usize] = (key, 0);
                    i
                }
                None => {
                    s.counts.push((key, 0));
                    u32::try_from(s.counts.len() - 1).unwrap_or(u32::MAX)
                }
            };
            s.index.insert(key, i);
            i
        }
    };
    // A place names its shard and index in 31 bits. A shard holds only the
    // clients with a connection open, as many as descriptors at most, far
    // below the 2^27 that fit; past that a connection would go uncounted.
    let Some(place) = i
        .checked_mul(SHARDS as u32)
        .and_then(|v| v.checked_add(shard as u32 + 1))
        .filter(|v| v & SHARED == 0)
        .and_then(std::num::NonZeroU32::new)
    else {
        return Ok(None);
    };
    let n = &mut s.counts[i as usize].1;
    if *n >= limit {
        let open = *n;
        drop(s);
        return Err(refuse(ip, open, limit));
    }
    *n += 1;
    Ok(Some(ClientSlot(place)))
}

/// Counts and logs (at most once a second) a connection from `ip` refused
/// with `open` open under `limit`: `open`.
fn refuse(ip: IpAddr, open: u32, limit: u32) -> u32 {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    if crate::util::log_due(&LOGGED) {
        tracing::warn!(
            client = %ip,
            "connection closed: the client has {open} open, limits.max_connections_per_client = {limit} \
             (logged at most once a second; counted as the perfdump's Closed Over Client Limit)"
        );
    }
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_place_is_4_bytes_as_the_keep_alive_table_needs() {
        assert_eq!(std::mem::size_of::<Option<ClientSlot>>(), 4);
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_a_mapped_address_is_its_ipv4_address() {
        assert_eq!(key(ip("2001:db8:1:2::1")), key(ip("2001:db8:1:2:ffff::9")));
        assert_ne!(key(ip("2001:db8:1:2::1")), key(ip("2001:db8:1:3::1")));
        assert_eq!(key(ip("::ffff:192.0.2.7")), key(ip("192.0.2.7")));
        assert_ne!(key(ip("192.0.2.7")), key(ip("192.0.2.8")));
        // No IPv6 /64 collides with an IPv4 address or another /64.
        assert_ne!(key(ip("::")), key(ip("0.0.0.0")));
        assert_ne!(key(ip("::1")), key(ip("0.0.0.1")));
        assert_ne!(key(ip("8000::1")), key(ip("::1")));
    }

    /// The process's own table, for clients the shared one has no room for.
    #[test]
    fn the_processs_own_table_holds_the_cap_and_frees_an_entry_at_zero() {
        let a = ip("198.51.100.21");
        let k = key(a);
        let first = admit_here(a, k, 2).unwrap();
        let second = admit_here(a, k, 2).unwrap();
        assert!(first.is_some() && second.is_some());
        assert_eq!(admit_here(a, k, 2).unwrap_err(), 2);
        assert!(
            admit_here(ip("198.51.100.22"), key(ip("198.51.100.22")), 2)
                .unwrap()
                .is_some()
        );
        drop(first);
        let again = admit_here(a, k, 2).unwrap();
        assert!(again.is_some());
        drop((second, again));
        assert!(!lock(shard_of(k)).index.contains_key(&k), "entry freed at zero");
        // A freed entry is reused by the next client of its shard.
        assert!(admit_here(a, k, 2).unwrap().is_some());
    }

    /// The cap is the process's: this one test sets it and uses addresses
    /// no other test does.
    #[test]
    fn the_cap_holds_per_client_and_a_closed_connection_gives_its_place_back() {
        set_limit(2, vec![ip("198.51.100.9")]);
        let a = ip("198.51.100.1");
        let first = admit(a).unwrap();
        let second = admit(a).unwrap();
        assert!(first.is_some() && second.is_some());
        let before = refused();
        assert_eq!(admit(a).unwrap_err(), 2);
        assert!(refused() > before);
        // Another client is not affected.
        let other = admit(ip("198.51.100.2")).unwrap();
        assert!(other.is_some());
        drop(first);
        let again = admit(a).unwrap();
        assert!(again.is_some());
        drop((second, again, other));
        assert_eq!(crate::shared_conns::open(key(a)), 0, "places not given back");
        let third = admit(a).unwrap();
        assert!(third.is_some());
        assert_eq!(crate::shared_conns::open(key(a)), 1);
        drop(third);
        // An exempt address (an array member) is not counted.
        let member = ip("198.51.100.9");
        let members: Vec<_> = (0..5).map(|_| admit(member).unwrap()).collect();
        assert!(members.iter().all(Option::is_none));
        set_limit(0, Vec::new());
        assert!(admit(a).unwrap().is_none(), "no cap: nothing counted");
    }
}
