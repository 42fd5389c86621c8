//! The cap on connections in use per origin (`origin.max_connections`):
//! what HAProxy's server `maxconn` and its queue, nginx's `max_conns`,
//! Squid's `cache_peer ... max-conn` and Traffic Server's
//! `per_server.connection.max` do. Under overload an origin is kept near
//! the concurrency it can take instead of being handed every request at
//! once: a request that finds all of its origin's places taken waits, first
//! come first served, for at most `origin.queue_timeout`, then gets a 503.
//!
//! A place is taken before a pooled connection is taken or a new one
//! opened, and given back when the exchange is over: the response read to
//! its end (its connection pooled or closed), the body dropped unread, the
//! exchange failed, or the connection upgraded (a WebSocket holds its
//! connection for as long as it lives, and must not starve the requests
//! queued behind it). An idle pooled connection holds no place.
//!
//! Places are counted per scheme and authority, as the pool keeps its
//! connections, and per cap: a request of an `[[upstream]]` group with its
//! own `max_connections` (`ServerCap`) counts among that group's places at
//! the server, apart from other requests'. An origin's entry exists only
//! while someone holds or waits for one of its places, so a forward proxy
//! that meets millions of hosts keeps no entry for each. The count is the
//! process's: each worker process (`server.processes`) has its own.
//!
//! A wait ends with its request's future: a cancelled one (a connection
//! dropped at shutdown, say) leaves nothing behind. A request whose client
//! hangs up while it waits is not cancelled, though: it keeps its turn and
//! is sent (HAProxy's `option abortonclose` drops such requests; not done).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// The places of every origin, for one configuration.
pub struct OriginCaps {
    /// Places per origin; 0: no cap (nothing is counted).
    max: usize,
    /// Longest wait for a place.
    queue_timeout: Duration,
    /// Servers with a place held or waited for, by `host:port` (looked up
    /// without an allocation): usually one slot each, more when groups
    /// with caps of their own or both schemes reach the same one.
    origins: Mutex<HashMap<Arc<str>, Vec<Arc<Slot>>>>,
    /// Requests waiting for a place now, in every origin.
    waiting: AtomicU64,
}

/// One server's places under one cap: the server as the pool knows it
/// (its `host:port`, whether it is reached over TLS), the cap, and the
/// group whose own cap that is (`[[upstream]] max_connections`: counted
/// apart from every other request's; None: `origin.max_connections`).
struct Slot {
    authority: Arc<str>,
    https: bool,
    max: usize,
    group: Option<usize>,
    places: Semaphore,
    /// Requests waiting for one of them now.
    waiting: AtomicU64,
}

/// A server under a cap, as [`OriginCaps::servers`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLoad {
    /// `host:port`, `https://` before it over TLS.
    pub server: String,
    /// The group whose own cap this is (index among the `[[upstream]]`
    /// groups); None: `origin.max_connections`.
    pub group: Option<usize>,
    /// Places in use.
    pub in_use: u64,
    /// The cap.
    pub limit: u64,
    /// Requests waiting for a place.
    pub waiting: u64,
}

/// A place taken ([`OriginCaps::take_now`], [`OriginCaps::wait`]), or one
/// waited for: dropping it gives the place back (if held) and forgets the
/// origin once nobody holds or waits for its places.
pub struct Place {
    caps: Arc<OriginCaps>,
    slot: Arc<Slot>,
    held: bool,
}

/// A request waited `origin.queue_timeout` without getting a place.
#[derive(Debug)]
pub struct QueueTimeout {
    /// The server waited for (`host:port`).
    pub server: Arc<str>,
    /// The wait.
    pub waited: Duration,
    /// The cap it waited on.
    pub max: usize,
}

impl OriginCaps {
    /// `max` places per origin (0: no cap), waited for at most `queue_timeout`.
    pub fn new(max: usize, queue_timeout: Duration) -> Arc<OriginCaps> {
        Arc::new(OriginCaps {
            max,
            queue_timeout,
            origins: Mutex::new(HashMap::new()),
            waiting: AtomicU64::new(0),
        })
    }

    /// Requests waiting for a place now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Relaxed)
    }

    /// The servers with a place in use or a request waiting now, the most
    /// waiting first (then the most in use), at most `n` of them: the map
    /// holds exactly those.
    pub fn servers(&self, n: usize) -> Vec<ServerLoad> {
        let mut out: Vec<ServerLoad> = {
            let origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
            origins
                .values()
                .flatten()
                .map(|slot| ServerLoad {
                    server: if slot.https {
                        format!("https://{}", slot.authority)
                    } else {
                        slot.authority.to_string()
                    },
                    group: slot.group,
                    in_use: slot.max.saturating_sub(slot.places.available_permits()) as u64,
                    limit: slot.max as u64,
                    waiting: slot.waiting.load(Relaxed),
                })
                .collect()
        };
        out.sort_by(|a, b| (b.waiting, b.in_use, &a.server).cmp(&(a.waiting, a.in_use, &b.server)));
        out.truncate(n);
        out
    }

    /// A place at the server `https`, `authority` if one is free now:
    /// `Ok(Some)`, held; `Ok(None)` when there is no cap; `Err` with the
    /// place to wait for ([`OriginCaps::wait`]) when all are taken. Apart
    /// from the wait, so that the request's future, which every request
    /// carries, holds no timer for a wait few requests make.
    ///
    /// `cap`, when given, replaces `origin.max_connections` for this
    /// request (its group's; 0: no cap), and its places are the group's.
    pub fn take_now(
        self: &Arc<Self>,
        https: bool,
        authority: &str,
        cap: Option<super::ServerCap>,
    ) -> Result<Option<Place>, Place> {
        let max = cap.map_or(self.max, |c| c.limit);
        if max == 0 {
            return Ok(None);
        }
        let group = cap.map(|c| c.group);
        let slot = {
            let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
            // One `host:port` for the map and its slots, made only for a
            // server not in the map yet.
            let name: Arc<str> = match origins.get_key_value(authority) {
                Some((name, _)) => name.clone(),
                None => authority.into(),
            };
            let slots = origins.entry(name.clone()).or_default();
            match slots
                .iter()
                .find(|s| s.https == https && s.max == max && s.group == group)
            {
                Some(slot) => slot.clone(),
                None => {
                    let slot = Arc::new(Slot {
                        authority: name,
                        https,
                        max,
                        group,
                        places: Semaphore::new(max),
                        waiting: AtomicU64::new(0),
                    });
                    slots.push(slot.clone());
                    slot
                }
            }
        };
        // From here, dropping `place` (a cancelled wait included) forgets
        // the server if nobody else needs it.
        let mut place = Place {
            caps: self.clone(),
            slot,
            held: false,
        };
        place.held = match place.slot.places.try_acquire() {
            Ok(permit) => {
                permit.forget();
                true
            }
            Err(_) => false,
        };
        if place.held { Ok(Some(place)) } else { Err(place) }
    }

    /// Waits in line for `place` (from [`OriginCaps::take_now`]), at most
    /// `origin.queue_timeout`.
    pub async fn wait(&self, mut place: Place) -> Result<Place, QueueTimeout> {
        let slot = place.slot.clone();
        let _waiting = [WaitingCount::new(&self.waiting), WaitingCount::new(&slot.waiting)];
        place.held = match tokio::time::timeout(self.queue_timeout, place.slot.places.acquire()).await {
            Ok(Ok(permit)) => {
                permit.forget();
                true
            }
            // Closed (never done) or timed out.
            Ok(Err(_)) | Err(_) => false,
        };
        if place.held {
            Ok(place)
        } else {
            Err(QueueTimeout {
                server: place.slot.authority.clone(),
                waited: self.queue_timeout,
                max: place.slot.max,
            })
        }
    }
}

/// Keeps a count of waiting requests right however a wait ends.
struct WaitingCount<'a>(&'a AtomicU64);

impl<'a> WaitingCount<'a> {
    fn new(count: &'a AtomicU64) -> WaitingCount<'a> {
        count.fetch_add(1, Relaxed);
        WaitingCount(count)
    }
}

impl Drop for WaitingCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.held {
            self.slot.places.add_permits(1);
        }
        let mut origins = self.caps.origins.lock().unwrap_or_else(|e| e.into_inner());
        // Every holder and waiter has a reference, each taken under this
        // lock: with only the map's and this one left, nobody holds or
        // waits for a place here, and nobody can start to meanwhile.
        if Arc::strong_count(&self.slot) == 2
            && let Some(slots) = origins.get_mut(&*self.slot.authority)
        {
            slots.retain(|s| !Arc::ptr_eq(s, &self.slot));
            if slots.is_empty() {
                origins.remove(&*self.slot.authority);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::ServerCap;

    fn entries(caps: &OriginCaps) -> usize {
        caps.origins.lock().map_or(0, |m| m.values().map(Vec::len).sum())
    }

    /// A place, waited for if need be; `waited` is set if it was.
    async fn take(
        caps: &Arc<OriginCaps>,
        https: bool,
        authority: &str,
        waited: &std::sync::atomic::AtomicBool,
    ) -> Result<Option<Place>, QueueTimeout> {
        match caps.take_now(https, authority, None) {
            Ok(place) => Ok(place),
            Err(place) => {
                waited.store(true, Relaxed);
                caps.wait(place).await.map(Some)
            }
        }
    }

    #[tokio::test]
    async fn without_a_cap_nothing_is_counted() {
        let caps = OriginCaps::new(0, Duration::from_secs(1));
        let mut places = Vec::new();
        for _ in 0..100 {
            places.push(caps.take_now(false, "o.test", None).ok().expect("no wait"));
        }
        assert!(places.iter().all(Option::is_none));
        assert_eq!(entries(&caps), 0);
    }

    #[tokio::test]
    async fn places_are_per_scheme_and_authority_and_the_next_waits_for_a_place_given_back() {
        let caps = OriginCaps::new(2, Duration::from_secs(5));
        let free = |https, authority| {
            caps.take_now(https, authority, None)
                .ok()
                .flatten()
                .expect("a free place")
        };
        let a = free(false, "o.test");
        let _b = free(false, "o.test");
        // Another origin, or the same over https, has places of its own.
        let _c = free(true, "o.test");
        let _d = free(false, "p.test");
        let waited = std::sync::atomic::AtomicBool::new(false);
        let third = take(&caps, false, "o.test", &waited);
        tokio::pin!(third);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut third)
                .await
                .is_err(),
            "the third waits"
        );
        assert!(waited.load(Relaxed));
        assert_eq!(caps.waiting(), 1);
        drop(a);
        let third = tokio::time::timeout(Duration::from_secs(1), third)
            .await
            .expect("a place given back goes to the one waiting");
        assert!(matches!(third, Ok(Some(_))));
        assert_eq!(caps.waiting(), 0);
    }

    #[tokio::test]
    async fn a_groups_own_cap_counts_apart_and_zero_means_none() {
        let caps = OriginCaps::new(1, Duration::from_millis(20));
        let group = |group, limit| Some(ServerCap { limit, group });
        let _default = caps.take_now(false, "o.test", None).ok().flatten().expect("free");
        // The default's one place is taken; group 0's cap of 2 has its own.
        let _g1 = caps
            .take_now(false, "o.test", group(0, 2))
            .ok()
            .flatten()
            .expect("free");
        let _g2 = caps
            .take_now(false, "o.test", group(0, 2))
            .ok()
            .flatten()
            .expect("free");
        let third = caps.take_now(false, "o.test", group(0, 2)).err().expect("taken");
        let e = caps.wait(third).await.err().expect("timed out");
        assert_eq!(e.max, 2, "the cap it waited on is the group's");
        // Group 1 has the default's number, and still places of its own.
        assert!(
            matches!(caps.take_now(false, "o.test", group(1, 1)), Ok(Some(_))),
            "apart from the default's"
        );
        assert!(
            matches!(caps.take_now(false, "o.test", group(2, 0)), Ok(None)),
            "0: no cap"
        );
        assert!(
            caps.take_now(false, "o.test", None).is_err(),
            "the default's still taken"
        );
    }

    #[tokio::test]
    async fn servers_lists_the_busy_ones_most_waiting_first() {
        let caps = OriginCaps::new(1, Duration::from_secs(5));
        let _a = caps.take_now(false, "a.test", None).ok().flatten().expect("free");
        let _b = caps
            .take_now(true, "b.test", Some(ServerCap { limit: 3, group: 1 }))
            .ok()
            .flatten()
            .expect("free");
        let waits: Vec<_> = (0..2)
            .map(|_| caps.take_now(false, "a.test", None).err().expect("taken"))
            .map(|p| {
                let caps = caps.clone();
                tokio::spawn(async move { caps.wait(p).await.map(|_| ()) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            caps.servers(10),
            [
                ServerLoad {
                    server: "a.test".into(),
                    group: None,
                    in_use: 1,
                    limit: 1,
                    waiting: 2
                },
                ServerLoad {
                    server: "https://b.test".into(),
                    group: Some(1),
                    in_use: 1,
                    limit: 3,
                    waiting: 0
                },
            ]
        );
        assert_eq!(caps.servers(1).len(), 1);
        for w in waits {
            w.abort();
        }
    }

    #[tokio::test]
    async fn a_wait_ends_at_the_queue_timeout() {
        let caps = OriginCaps::new(1, Duration::from_millis(100));
        let no = std::sync::atomic::AtomicBool::new(false);
        let _held = take(&caps, false, "o.test", &no).await.expect("held");
        let started = std::time::Instant::now();
        let e = take(&caps, false, "o.test", &no).await.err().expect("timed out");
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!((e.max, e.waited), (1, Duration::from_millis(100)));
        assert_eq!(caps.waiting(), 0);
    }

    #[tokio::test]
    async fn an_origin_is_forgotten_once_nobody_holds_or_waits_for_its_places() {
        let caps = OriginCaps::new(1, Duration::from_secs(5));
        let no = std::sync::atomic::AtomicBool::new(false);
        let held = take(&caps, false, "o.test", &no).await.expect("held");
        // A wait cancelled (its request's future dropped) leaves nothing behind...
        let wait = take(&caps, false, "o.test", &no);
        assert!(tokio::time::timeout(Duration::from_millis(20), wait).await.is_err());
        assert_eq!(entries(&caps), 1, "still held");
        assert_eq!(caps.waiting(), 0);
        // ...and the last place given back forgets the origin.
        drop(held);
        assert_eq!(entries(&caps), 0);
        // Nothing was lost: the one place is free again.
        assert!(
            matches!(caps.take_now(false, "o.test", None), Ok(Some(_))),
            "free again"
        );
    }
}
