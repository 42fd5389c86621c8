//! The in-memory index of the disk tier: object id -> size on disk, last
//! access, access count, expiry hint, key check, kept in 64 independently
//! locked shards (plain `std::sync::Mutex<HashMap>`: each critical section
//! is a hash lookup, so a sharded mutex is as fast as `dashmap` without the
//! extra dependency). Ids are already xxh3 hashes, so the maps hash them by
//! taking their low 64 bits; the shard is chosen by the top bits.
//!
//! The totals (objects, bytes) are kept in `DiskStats` and changed under
//! the shard lock together with the entry, so they always match the maps.

use super::DiskStats;
use super::popularity::Popularity;
use crate::cache::key::ObjectId;
use crate::config::Replacement;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const SHARDS: usize = 64;

type Map = crate::util::PreHashedMap<u128, Entry>;

/// One object in the index (40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The replacement clock when it was stored or last hit (set by the
    /// index on `insert` and `touch`: whatever the caller gives is replaced).
    pub clock: u64,
    /// File size on disk (header, meta, body, trailer).
    pub size: u64,
    /// Last access, unix seconds.
    pub last_access: u32,
    /// Expiry hint, unix seconds (0 = unknown), saturated to u32.
    pub expires: u32,
    /// Accesses since it was indexed (saturating).
    pub hits: u32,
    /// Which version of the object this is (changes on every commit).
    pub generation: u32,
    /// The metadata's key hashes to the object's id; when false no lookup
    /// can ever find the object, so the GC evicts it first.
    pub key_ok: bool,
    /// Its body's checksum matched when read in this process: a reopened
    /// file of this generation is not checksummed again.
    pub verified: bool,
}

/// The sharded map.
pub struct Index {
    shards: Box<[Mutex<Map>]>,
    generation: AtomicU32,
    stats: Arc<DiskStats>,
    /// The file system's allocation unit: an object is charged its size
    /// rounded up to it, because that is what it occupies (a 300-byte
    /// object takes a whole 4 KiB block, and a million of them 4 GB, not
    /// 300 MB).
    block: u64,
    /// `cache.replacement`.
    replacement: Replacement,
    /// The Greedy-Dual clock (fixed point, [`UNIT`] = 1): the highest
    /// priority evicted so far, which every priority set later starts from.
    clock: AtomicU64,
    /// Lookups counted per object, stored or not (`Replacement::Frequency`
    /// only).
    popularity: Option<Popularity>,
}

/// The fixed-point unit of priorities: `1.0`.
const UNIT: u64 = 1 << 20;

/// `Replacement::Balanced`'s per-object term, 0.15 in [`UNIT`]s: how much a
/// hit is worth whatever the object's size. Chosen by simulation of
/// `bench/run hitratio`'s stream (a Zipf stream with a heavy tail): from
/// 0.10 to 0.20 the hit ratio went from 37.1% to 36.0% and the byte hit
/// ratio from 35.8% to 37.6% (GDSF alone: 39.6% / 18.1%; the LRU policy:
/// 32.0% / 38.9%).
const BALANCED_PER_OBJECT: u64 = UNIT * 15 / 100;

/// `Replacement::Frequency`'s per-object term, 0.5 in [`UNIT`]s. Chosen by
/// simulation of `bench/run hitratio`'s streams (bench/hitratio_sim.py):
/// a larger term keeps more large objects, so more bytes and fewer requests
/// are answered (1,000,000 requests: 0.3 gave 46.2% / 40.3%, 0.5 44.2% /
/// 41.2%, 1.0 42.9% / 41.9%, with exact counts).
const FREQUENCY_PER_OBJECT: u64 = UNIT / 2;

impl Index {
    /// An empty index whose totals live in `stats`, charging each object
    /// its size rounded up to `block` bytes (1 = exact sizes), ranking
    /// objects for eviction by `replacement` (`Frequency` counts lookups in
    /// a sketch sized for a `budget` of bytes).
    pub fn new(stats: Arc<DiskStats>, block: u64, replacement: Replacement, budget: u64) -> Index {
        Index {
            popularity: (replacement == Replacement::Frequency).then(|| Popularity::for_budget(budget)),
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
            generation: AtomicU32::new(1),
            stats,
            block: block.max(1),
            replacement,
            clock: AtomicU64::new(0),
        }
    }

    /// The sketch of how often objects are asked for
    /// (`Replacement::Frequency` only).
    pub fn popularity(&self) -> Option<&Popularity> {
        self.popularity.as_ref()
    }

    /// Counts a lookup of `id` (stored or not) when the policy ranks by
    /// how often objects are asked for.
    pub fn asked(&self, id: ObjectId) {
        if let Some(p) = &self.popularity {
            p.record(id);
        }
    }

    /// The eviction order key of object `id`'s entry at unix time `now`:
    /// (class, score), lower first. Class 0 is dead (expired, or
    /// unreachable: its key does not hash to its id), oldest access first;
    /// class 1 the live ones by `cache.replacement` (see [`Replacement`]).
    pub fn rank(&self, id: ObjectId, e: &Entry, now: u64) -> (u8, u64) {
        let dead = !e.key_ok || (e.expires != 0 && u64::from(e.expires) < now);
        if dead {
            return (0, u64::from(e.last_access));
        }
        let uses = u64::from(e.hits) + 1;
        let blocks = self.charged(e.size).div_ceil(self.block).max(1);
        let score = match self.replacement {
            Replacement::Lru => {
                let doublings = u64::from(31 - e.hits.saturating_add(1).leading_zeros()).min(24);
                return (1, u64::from(e.last_access) + 3600 * doublings);
            }
            Replacement::Gdsf => uses * (UNIT / blocks),
            Replacement::Lfuda => uses * UNIT,
            Replacement::Balanced => uses * (UNIT / blocks + BALANCED_PER_OBJECT),
            Replacement::Frequency => {
                // No clock: the sketch's halving is the aging.
                let asked = self.popularity.as_ref().map_or(0, |p| p.estimate(id));
                return (1, u64::from(asked.max(1)) * (UNIT / blocks + FREQUENCY_PER_OBJECT));
            }
        };
        (1, e.clock.saturating_add(score))
    }

    /// An object of live rank `score` was evicted: the clock rises to it
    /// (Greedy-Dual aging), so objects stored or hit from now on start
    /// above everything that stayed unused since.
    pub fn evicted_at(&self, score: u64) {
        if !matches!(self.replacement, Replacement::Lru | Replacement::Frequency) {
            self.clock.fetch_max(score, Ordering::Relaxed);
        }
    }

    /// What an object of `size` bytes occupies: whole blocks.
    pub fn charged(&self, size: u64) -> u64 {
        size.div_ceil(self.block).saturating_mul(self.block)
    }

    fn shard(&self, id: ObjectId) -> MutexGuard<'_, Map> {
        let i = (id.0 >> 122) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh generation number for a new entry.
    pub fn next_generation(&self) -> u32 {
        self.generation.fetch_add(1, Ordering::Relaxed)
    }

    fn added(&self, e: &Entry) {
        self.stats.objects.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(self.charged(e.size), Ordering::Relaxed);
    }

    fn removed(&self, e: &Entry) {
        self.stats.objects.fetch_sub(1, Ordering::Relaxed);
        self.stats.bytes.fetch_sub(self.charged(e.size), Ordering::Relaxed);
    }

    /// Inserts or replaces; returns the replaced entry.
    pub fn insert(&self, id: ObjectId, mut e: Entry) -> Option<Entry> {
        e.clock = self.clock.load(Ordering::Relaxed);
        let mut s = self.shard(id);
        let old = s.insert(id.0, e);
        if let Some(o) = &old {
            self.removed(o);
        }
        self.added(&e);
        old
    }

    /// Inserts unless the id is already indexed (the scan uses this, so an
    /// object committed while the scan runs is not counted twice).
    pub fn insert_if_absent(&self, id: ObjectId, mut e: Entry) -> bool {
        e.clock = self.clock.load(Ordering::Relaxed);
        let mut s = self.shard(id);
        if s.contains_key(&id.0) {
            return false;
        }
        s.insert(id.0, e);
        self.added(&e);
        true
    }

    /// Removes an entry.
    pub fn remove(&self, id: ObjectId) -> Option<Entry> {
        let old = self.shard(id).remove(&id.0);
        if let Some(o) = &old {
            self.removed(o);
        }
        old
    }

    /// Removes the entry only if it is still the given generation.
    pub fn remove_generation(&self, id: ObjectId, generation: u32) -> Option<Entry> {
        let mut s = self.shard(id);
        if s.get(&id.0).is_some_and(|e| e.generation == generation) {
            let old = s.remove(&id.0);
            if let Some(o) = &old {
                self.removed(o);
            }
            return old;
        }
        None
    }

    /// Notes that the checksum of `id`'s file of `generation` matched.
    pub fn mark_verified(&self, id: ObjectId, generation: u32) {
        if let Some(e) = self.shard(id).get_mut(&id.0)
            && e.generation == generation
        {
            e.verified = true;
        }
    }

    /// The entry for an id.
    pub fn get(&self, id: ObjectId) -> Option<Entry> {
        self.shard(id).get(&id.0).copied()
    }

    /// Records an access; false if the id is not indexed.
    pub fn touch(&self, id: ObjectId, now: u32) -> bool {
        let clock = self.clock.load(Ordering::Relaxed);
        match self.shard(id).get_mut(&id.0) {
            Some(e) => {
                e.clock = clock;
                e.last_access = e.last_access.max(now);
                e.hits = e.hits.saturating_add(1);
                true
            }
            None => false,
        }
    }

    /// Calls `f` with every entry, one shard locked at a time (each lock
    /// is held only while that shard is copied by `f`).
    pub fn for_each(&self, mut f: impl FnMut(ObjectId, &Entry)) {
        for shard in self.shards.iter() {
            let s = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (id, e) in s.iter() {
                f(ObjectId(*id), e);
            }
        }
    }

    /// Number of entries (counted from the maps, for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(size: u64) -> Entry {
        Entry {
            clock: 0,
            size,
            last_access: 10,
            expires: 0,
            hits: 0,
            generation: 1,
            key_ok: true,
            verified: false,
        }
    }

    #[test]
    fn accounting() {
        let stats = Arc::new(DiskStats::default());
        let idx = Index::new(stats.clone(), 1, Replacement::Balanced, 1 << 30);
        let total = |s: &DiskStats| (s.objects.load(Ordering::Relaxed), s.bytes.load(Ordering::Relaxed));
        assert!(idx.insert(ObjectId(1), entry(100)).is_none());
        assert!(idx.insert(ObjectId(2 << 126), entry(50)).is_none());
        assert_eq!(total(&stats), (2, 150));
        // Replacing adjusts by the difference.
        assert_eq!(idx.insert(ObjectId(1), entry(70)).map(|e| e.size), Some(100));
        assert_eq!(total(&stats), (2, 120));
        // The scan does not count an object twice.
        assert!(!idx.insert_if_absent(ObjectId(1), entry(999)));
        assert!(idx.insert_if_absent(ObjectId(3), entry(5)));
        assert_eq!(total(&stats), (3, 125));
        assert!(idx.touch(ObjectId(3), 20));
        assert_eq!(idx.get(ObjectId(3)).map(|e| (e.hits, e.last_access)), Some((1, 20)));
        assert!(!idx.touch(ObjectId(4), 20));
        assert!(idx.remove_generation(ObjectId(3), 7).is_none());
        assert!(idx.remove_generation(ObjectId(3), 1).is_some());
        assert_eq!(idx.remove(ObjectId(1)).map(|e| e.size), Some(70));
        assert!(idx.remove(ObjectId(1)).is_none());
        assert_eq!(total(&stats), (1, 50));
        assert_eq!(idx.len(), 1);
        let mut seen = vec![];
        idx.for_each(|id, e| seen.push((id, e.size)));
        assert_eq!(seen, vec![(ObjectId(2 << 126), 50)]);
    }

    #[test]
    fn an_object_is_charged_the_whole_blocks_it_occupies() {
        let stats = Arc::new(DiskStats::default());
        let idx = Index::new(stats.clone(), 4096, Replacement::Balanced, 1 << 30);
        let bytes = |s: &DiskStats| s.bytes.load(Ordering::Relaxed);
        assert!(idx.insert(ObjectId(1), entry(300)).is_none());
        assert_eq!(bytes(&stats), 4096);
        assert!(idx.insert(ObjectId(2), entry(4096)).is_none());
        assert_eq!(bytes(&stats), 8192);
        assert!(idx.insert(ObjectId(3), entry(4097)).is_none());
        assert_eq!(bytes(&stats), 16384);
        // Replacing and removing give back what was charged.
        assert_eq!(idx.insert(ObjectId(3), entry(10)).map(|e| e.size), Some(4097));
        assert_eq!(bytes(&stats), 12288);
        assert!(idx.remove(ObjectId(1)).is_some());
        assert!(idx.remove(ObjectId(2)).is_some());
        assert!(idx.remove(ObjectId(3)).is_some());
        assert_eq!(bytes(&stats), 0);
        assert_eq!(idx.charged(0), 0);
    }
}
