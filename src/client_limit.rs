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
//! The count lives in a table of 16 shards keyed by the client, entries
//! freed when their last connection closes; a connection holds a 4-byte
//! index to its client's count ([`ClientSlot`]). With the cap at 0 (the
//! default) nothing is counted or looked up.

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

pub(crate) const SHARDS: usize = 16;

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

/// Which of the 16 shards `key`'s count (and its byte bucket,
/// `client_bandwidth`, in a `client_table`) lives in.
pub(crate) fn shard_of(key: u128) -> usize {
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
/// the shard (low 4 bits) and the client's index in it, plus one.
#[derive(Debug)]
pub(crate) struct ClientSlot(std::num::NonZeroU32);

impl Drop for ClientSlot {
    fn drop(&mut self) {
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
    // A place names its shard and index in 32 bits. A shard holds only the
    // clients with a connection open, as many as descriptors at most, far
    // below the 2^28 that fit; past that a connection would go uncounted.
    let Some(place) = i
        .checked_mul(SHARDS as u32)
        .and_then(|v| v.checked_add(shard as u32 + 1))
        .and_then(std::num::NonZeroU32::new)
    else {
        return Ok(None);
    };
    let n = &mut s.counts[i as usize].1;
    if *n >= limit {
        let open = *n;
        drop(s);
        REFUSED.fetch_add(1, Ordering::Relaxed);
        if log_due(&LOGGED) {
            tracing::warn!(
                client = %ip,
                "connection closed: the client has {open} open, limits.max_connections_per_client = {limit} \
                 (logged at most once a second; counted as the perfdump's Closed Over Client Limit)"
            );
        }
        return Err(open);
    }
    *n += 1;
    Ok(Some(ClientSlot(place)))
}

/// True at most once a second for each `last` (the second of the last
/// true, since the Unix epoch): refusals that an abusive client can make by
/// the thousand are logged that often, and counted in full elsewhere.
pub(crate) fn log_due(last: &AtomicU64) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    last.swap(now, Ordering::Relaxed) != now
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

    /// The table is the process's: this one test sets the cap and uses
    /// addresses no other test does.
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
        assert!(
            !lock(shard_of(key(a))).index.contains_key(&key(a)),
            "entry freed at zero"
        );
        // A freed entry is reused by the next client of its shard.
        let third = admit(a).unwrap();
        assert!(third.is_some());
        drop(third);
        // An exempt address (an array member) is not counted.
        let member = ip("198.51.100.9");
        let members: Vec<_> = (0..5).map(|_| admit(member).unwrap()).collect();
        assert!(members.iter().all(Option::is_none));
        set_limit(0, Vec::new());
        assert!(admit(a).unwrap().is_none(), "no cap: nothing counted");
    }
}
