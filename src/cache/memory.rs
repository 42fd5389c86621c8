//! The memory tier: hot objects held whole in memory, admitted and evicted
//! by quick_cache's size-aware S3-FIFO-style policy (a one-hit wonder does
//! not push out objects that are used again), so a hit costs a hash lookup
//! and an `Arc` clone, never a disk read.

use super::key::ObjectId;
use super::object::StoredMeta;
use bytes::Bytes;
use quick_cache::Weighter;
use quick_cache::sync::Cache;
use std::sync::Arc;

/// A whole object in memory.
#[derive(Debug)]
pub struct MemObject {
    /// Its metadata, shared with every answer served from it (a hit copies
    /// no headers).
    pub meta: Arc<StoredMeta>,
    /// Its body.
    pub body: Bytes,
}

/// What the allocator adds to each allocation (glibc malloc's chunk header
/// and rounding to 16 bytes), counted once per allocation an object makes.
const PER_ALLOCATION: usize = 24;

/// Bytes a `HeaderMap` spends per entry it has room for, besides the name
/// and value bytes: the bucket (name, value, hash and the links to extra
/// values) and its share of the index table (a `Pos` per slot, at most
/// three quarters of the slots used).
const PER_HEADER_SLOT: usize =
    size_of::<http::HeaderName>() + size_of::<http::HeaderValue>() + 3 * size_of::<usize>() + 8;

/// Bytes quick_cache spends per entry besides the value itself: the key,
/// the `Arc` pointer, its hash, frequency and queue links.
const PER_CACHE_ENTRY: usize = 64;

impl MemObject {
    /// The memory the object holds, as the allocator sees it: the body, the
    /// key and variant strings, the header fields (name and value bytes and
    /// every slot the header map has room for), the structures themselves
    /// and the allocator's overhead per allocation. The memory tier's
    /// budget bounds this sum, so it must not flatter: an estimate that left
    /// out the header map (about 1 KiB for a typical response) let a 128 MiB
    /// tier of 1 KB objects hold twice its budget. The field lines kept
    /// for its hits' heads (`object::KeptLines`, no more bytes than the
    /// fields) are counted from the start, before the first hit writes them.
    pub fn weight(&self) -> u64 {
        let meta = &self.meta;
        let field_bytes: usize = meta.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
        let variant: usize = meta
            .variant
            .iter()
            .map(|(n, v)| n.capacity() + v.as_ref().map_or(0, String::capacity) + 2 * PER_ALLOCATION)
            .sum();
        let allocations = 7 + meta.headers.len();
        (self.body.len()
            + meta.key.capacity()
            + variant
            + 2 * field_bytes
            + meta.headers.capacity() * PER_HEADER_SLOT
            + size_of::<MemObject>()
            + size_of::<StoredMeta>()
            + PER_CACHE_ENTRY
            + allocations * PER_ALLOCATION) as u64
    }
}

#[derive(Clone)]
struct ByWeight;

impl Weighter<ObjectId, Arc<MemObject>> for ByWeight {
    fn weight(&self, _key: &ObjectId, val: &Arc<MemObject>) -> u64 {
        val.weight().max(1)
    }
}

/// The memory tier.
pub struct MemoryTier {
    cache: Cache<ObjectId, Arc<MemObject>, ByWeight>,
    max_object: u64,
    budget: u64,
    /// How far it has applied what the other worker processes removed
    /// from the cache (`told`).
    pub(crate) told: super::told::Reader,
}

impl MemoryTier {
    /// A tier holding at most `budget` bytes, admitting objects up to `max_object` bytes.
    pub fn new(budget: u64, max_object: u64) -> MemoryTier {
        // quick_cache wants an item-count estimate; assume ~16 KiB objects.
        let estimate = usize::try_from((budget / (16 << 10)).clamp(64, 4 << 20)).unwrap_or(1 << 20);
        MemoryTier {
            cache: Cache::with_weighter(estimate, budget.max(1), ByWeight),
            max_object,
            budget,
            told: super::told::Reader::default(),
        }
    }

    /// The object, if held.
    pub fn get(&self, id: ObjectId) -> Option<Arc<MemObject>> {
        self.cache.get(&id)
    }

    /// True if an object of `len` body bytes may be admitted.
    pub fn admits(&self, len: u64) -> bool {
        len <= self.max_object
    }

    /// True if an object of `len` body bytes would be admitted while the
    /// tier is still filling: after it fills to 7/8 of its budget, it has
    /// only the slack eviction leaves (quick_cache evicts per shard, so a
    /// full tier's total stays a little under the budget), and an object
    /// put there would push out others.
    pub fn has_room(&self, len: u64) -> bool {
        self.admits(len) && self.bytes() + len <= self.budget / 8 * 7
    }

    /// Stores (or replaces) an object. A too large one is not kept, and
    /// the older version it replaces goes: it must not be found instead.
    pub fn insert(&self, id: ObjectId, obj: Arc<MemObject>) {
        if self.admits(obj.body.len() as u64) {
            self.cache.insert(id, obj);
        } else {
            self.cache.remove(&id);
        }
    }

    /// Stores `obj` unless the tier holds a version of `id` already: a
    /// store's, inserted while `obj` was read from disk, is newer and wins.
    /// True if stored.
    pub fn insert_if_absent(&self, id: ObjectId, obj: Arc<MemObject>) -> bool {
        if !self.admits(obj.body.len() as u64) {
            return false;
        }
        // A zero timeout: another insert under way for `id` wins too.
        match self.cache.get_value_or_guard(&id, Some(std::time::Duration::ZERO)) {
            quick_cache::sync::GuardResult::Guard(g) => g.insert(obj).is_ok(),
            quick_cache::sync::GuardResult::Value(_) | quick_cache::sync::GuardResult::Timeout => false,
        }
    }

    /// Drops `obj` if the tier still holds that very object for `id` (a
    /// copy found stale just after it went in; a newer one stays).
    pub fn remove_if_same(&self, id: ObjectId, obj: &Arc<MemObject>) {
        self.cache.remove_if(&id, |held| Arc::ptr_eq(held, obj));
    }

    /// Drops an object.
    pub fn remove(&self, id: ObjectId) {
        self.cache.remove(&id);
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Bytes held (by the weight estimate).
    pub fn bytes(&self) -> u64 {
        self.cache.weight()
    }

    /// Drops every object; returns how many were held.
    pub fn clear(&self) -> usize {
        let n = self.cache.len();
        self.cache.clear();
        n
    }

    /// Up to `limit` objects held: id, key URL, body size, whether it is a
    /// Vary or slice marker (for the /nsc listing).
    pub fn list(&self, limit: usize) -> Vec<(ObjectId, String, u64, bool)> {
        self.cache
            .iter()
            .take(limit)
            .map(|(id, obj)| {
                let marker = obj.meta.headers.contains_key(super::object::MARKER)
                    || obj.meta.headers.contains_key(super::object::SLICED);
                (id, obj.meta.key.clone(), obj.body.len() as u64, marker)
            })
            .collect()
    }

    /// Drops every object whose key URL starts with `prefix` (whatever
    /// upstream group the key names); returns how many.
    pub fn purge_prefix(&self, prefix: &str) -> usize {
        let n = std::cell::Cell::new(0);
        self.cache.retain(|_, v| {
            let keep = !crate::cache::key::url_of(&v.meta.key).starts_with(prefix);
            n.set(n.get() + usize::from(!keep));
            keep
        });
        n.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, StatusCode};
    use std::time::SystemTime;

    fn obj(key: &str, len: usize) -> Arc<MemObject> {
        Arc::new(MemObject {
            meta: Arc::new(StoredMeta {
                key: key.into(),
                variant: vec![],
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                request_time: SystemTime::now(),
                response_time: SystemTime::now(),
                origin: None,
                derived: Default::default(),
            }),
            body: Bytes::from(vec![b'x'; len]),
        })
    }

    #[test]
    fn a_copy_from_disk_never_replaces_a_version_stored_meanwhile() {
        let tier = MemoryTier::new(1 << 20, 64 << 10);
        let (id, newer) = (ObjectId(7), obj("http://h/new", 10));
        assert!(tier.insert_if_absent(id, obj("http://h/first", 10)), "absent: stored");
        tier.insert(id, newer.clone());
        assert!(!tier.insert_if_absent(id, obj("http://h/old copy", 10)));
        assert!(Arc::ptr_eq(&tier.get(id).expect("held"), &newer));
        assert!(
            !tier.insert_if_absent(ObjectId(8), obj("http://h/big", 65 << 10)),
            "too large"
        );
        // A too large new version removes the old one.
        tier.insert(id, obj("http://h/new and large", 65 << 10));
        assert!(tier.get(id).is_none());
    }

    #[test]
    fn budget_is_respected_and_large_objects_refused() {
        let tier = MemoryTier::new(1 << 20, 64 << 10);
        for i in 0..100u128 {
            tier.insert(ObjectId(i), obj("http://h/x", 32 << 10));
        }
        assert!(tier.bytes() <= 1 << 20, "{}", tier.bytes());
        assert!(tier.len() < 100);
        tier.insert(ObjectId(999), obj("http://h/big", 128 << 10));
        assert!(tier.get(ObjectId(999)).is_none());
    }

    #[test]
    fn purge_by_prefix() {
        let tier = MemoryTier::new(1 << 20, 64 << 10);
        tier.insert(ObjectId(1), obj("http://a/1", 10));
        tier.insert(ObjectId(2), obj("http://a/2", 10));
        tier.insert(ObjectId(3), obj("http://b/1", 10));
        tier.insert(ObjectId(4), obj("http://a/3 upstream=g", 10));
        tier.insert(ObjectId(5), obj("http://b/a/ upstream=http://a/", 10));
        assert_eq!(tier.purge_prefix("http://a/"), 3);
        assert!(tier.get(ObjectId(3)).is_some());
        assert!(tier.get(ObjectId(5)).is_some());
    }
}
