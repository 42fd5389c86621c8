//! The per-process table of `client_bandwidth`'s byte buckets (the request
//! rates per client are in `shared_buckets`, kept by the worker processes
//! together):
//! entries keyed as `client_limit` keys clients (an IPv4 address, an IPv6
//! /64) in its 16 shards, each swept of the entries its owner no longer
//! needs whenever it has doubled since its last sweep. A shard then holds
//! at most about twice the clients whose entries still matter.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A shard is swept when it reaches this many entries, or twice what its
/// last sweep left.
pub(crate) const SWEEP_AT: usize = 1024;

/// Per-client entries of type `V`, in shards.
pub(crate) struct ClientTable<V> {
    shards: [Mutex<Shard<V>>; crate::client_limit::SHARDS],
}

/// One shard: the entries of the clients whose key lands in it.
pub(crate) struct Shard<V> {
    /// Client key (`client_limit::key`) -> its entry.
    pub entries: HashMap<u128, V>,
    /// The size at which the next sweep runs.
    sweep_at: usize,
}

impl<V> ClientTable<V> {
    /// An empty table.
    pub fn new() -> Self {
        ClientTable {
            shards: std::array::from_fn(|_| {
                Mutex::new(Shard {
                    entries: HashMap::new(),
                    sweep_at: 0,
                })
            }),
        }
    }

    /// The shard `key` lives in, locked. A lock poisoned by a panic is
    /// taken as it is: the entries are plain numbers, never half-written.
    pub fn shard(&self, key: u128) -> MutexGuard<'_, Shard<V>> {
        self.shards[crate::client_limit::shard_of(key)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl<V> ClientTable<V> {
    /// Calls `f` on every entry, one shard locked at a time (a reload's
    /// change to what the entries hold).
    pub fn for_each(&self, mut f: impl FnMut(&mut V)) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.entries.values_mut().for_each(&mut f);
        }
    }
}

impl<V> Shard<V> {
    /// Before a new client's entry goes in: once the shard holds
    /// [`SWEEP_AT`] entries, or twice what its last sweep left, keeps only
    /// those `keep` says still matter, and gives back the memory a spike
    /// of clients took.
    pub fn sweep_if_grown(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        if self.entries.len() < self.sweep_at.max(SWEEP_AT) {
            return;
        }
        self.entries.retain(|_, v| keep(v));
        let left = self.entries.len();
        self.sweep_at = left * 2;
        if self.entries.capacity() > 4 * left.max(SWEEP_AT) {
            self.entries.shrink_to(left * 2);
        }
    }
}
