//! The garbage collector: evicts objects until the bytes used are at or
//! below a target (the low watermark).
//!
//! Order of eviction (lowest first), over a snapshot of the index:
//!
//! 1. **dead**: objects whose expiry hint has passed (`0 < expires <
//!    now`) or whose stored key does not hash to their id (never found by
//!    a lookup), oldest last access first;
//! 2. **live**: the rest, lowest score first, the score given by
//!    `cache.replacement` (`Index::rank`: a Greedy-Dual priority, or for
//!    `lru` the last access plus an hour per doubling of the hits). Ties:
//!    least recently used first, then larger objects first. Each live
//!    eviction raises the Greedy-Dual clock to the evicted score
//!    (`Index::evicted_at`).
//!
//! A pass copies the index shard by shard (each shard's lock held only
//! while it is copied), sorts the lowest-ranked candidates (enough to
//! free twice what must go; the rest only if those were not enough),
//! then evicts them one at a time under that object's stripe lock; an
//! object committed again or
//! accessed since the snapshot is skipped. It runs on its own thread (auto
//! mode) or the caller's (`portico cache gc`), never on an async worker.

use super::{GcSignal, Inner, now_secs};
use crate::cache::key::ObjectId;
use crate::cache::object::StoredMeta;
use std::fs;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What one GC pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Bytes used before the pass.
    pub before: u64,
    /// Bytes used after it.
    pub after: u64,
    /// Objects evicted.
    pub evicted: u64,
    /// Of which expired (or unreachable).
    pub expired: u64,
    /// Bytes evicted.
    pub bytes: u64,
    /// How long it took.
    pub elapsed: Duration,
}

/// One evicted object.
#[derive(Debug, Clone)]
pub struct Evicted {
    /// Its id.
    pub id: ObjectId,
    /// Bytes freed.
    pub size: u64,
    /// It was expired (or unreachable) rather than least valuable.
    pub expired: bool,
    /// Its key URL, when asked for and readable.
    pub key: Option<String>,
}

struct Candidate {
    class: u8,
    score: u64,
    size: u64,
    id: ObjectId,
    generation: u32,
    last_access: u32,
}

/// How many of the lowest-ranked candidates to sort first for a pass that
/// must free `need` bytes: enough, at their average size, for twice that,
/// plus 64.
fn lowest_needed(cands: &[Candidate], need: u64) -> usize {
    let total: u64 = cands.iter().map(|c| c.size).sum();
    let average = (total / (cands.len() as u64).max(1)).max(1);
    let want = (need.saturating_mul(2) / average).saturating_add(64);
    usize::try_from(want).unwrap_or(usize::MAX).min(cands.len())
}

fn read_key(path: &std::path::Path) -> Option<String> {
    let f = super::open_read(path).ok()?;
    let env = super::format::read_envelope(&f).ok()?;
    StoredMeta::decode(&env.meta).ok().map(|m| m.key)
}

impl Inner {
    pub(super) fn gc_pass(&self, target: u64, read_keys: bool, on_evict: &mut dyn FnMut(&Evicted)) -> GcReport {
        let _one_at_a_time = self.gc_running.lock().unwrap_or_else(|e| e.into_inner());
        let started = Instant::now();
        let mut report = GcReport {
            before: self.stats.bytes.load(Ordering::Relaxed),
            ..GcReport::default()
        };
        self.stats.gc_runs.fetch_add(1, Ordering::Relaxed);
        if report.before > target {
            let now = now_secs();
            let mut cands = Vec::new();
            self.index.for_each(|id, e| {
                let (class, score) = self.index.rank(id, e, now);
                cands.push(Candidate {
                    class,
                    score,
                    size: e.size,
                    id,
                    generation: e.generation,
                    last_access: e.last_access,
                });
            });
            // Equal priorities: least recently used first, then larger first.
            let order = |c: &Candidate| (c.class, c.score, c.last_access, std::cmp::Reverse(c.size));
            // A pass usually evicts a few percent of a full index: only the
            // lowest-ranked, enough to cover twice what must go, are sorted
            // (`select_nth` puts them first); the rest only if those were
            // not enough (objects used since the snapshot are skipped).
            let split = lowest_needed(&cands, report.before - target);
            if split < cands.len() {
                cands.select_nth_unstable_by_key(split, order);
            }
            cands[..split].sort_unstable_by_key(order);
            if !self.evict_in_order(&cands[..split], target, read_keys, &mut report, on_evict) && split < cands.len() {
                cands[split..].sort_unstable_by_key(order);
                self.evict_in_order(&cands[split..], target, read_keys, &mut report, on_evict);
            }
        }
        report.after = self.stats.bytes.load(Ordering::Relaxed);
        report.elapsed = started.elapsed();
        report
    }

    /// Evicts `cands` in order until the bytes used are at or below
    /// `target`: true once they are.
    fn evict_in_order(
        &self,
        cands: &[Candidate],
        target: u64,
        read_keys: bool,
        report: &mut GcReport,
        on_evict: &mut dyn FnMut(&Evicted),
    ) -> bool {
        for c in cands {
            if self.stats.bytes.load(Ordering::Relaxed) <= target {
                return true;
            }
            if let Some(ev) = self.evict(c, read_keys) {
                if c.class == 1 {
                    self.index.evicted_at(c.score);
                }
                report.evicted += 1;
                report.bytes += ev.size;
                if ev.expired {
                    report.expired += 1;
                }
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_evicted.fetch_add(ev.size, Ordering::Relaxed);
                on_evict(&ev);
            }
        }
        self.stats.bytes.load(Ordering::Relaxed) <= target
    }

    fn evict(&self, c: &Candidate, read_keys: bool) -> Option<Evicted> {
        let path = self.layout.path_of(c.id);
        let _guard = self.lock(c.id);
        match self.index.get(c.id) {
            Some(e) if e.generation == c.generation && e.last_access == c.last_access => {}
            _ => return None, // replaced, removed or used since the snapshot
        }
        let key = if read_keys { read_key(&path) } else { None };
        self.forget_held(c.id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {} // removed by another process
            Err(e) => {
                tracing::warn!(
                    "disk cache gc: cannot remove {}: {cause}",
                    path.display(),
                    cause = crate::util::io_cause(&e)
                );
                return None;
            }
        }
        let e = self.index.remove(c.id)?;
        Some(Evicted {
            id: c.id,
            size: e.size,
            expired: c.class == 0,
            key,
        })
    }
}

/// Starts the automatic GC thread: it sleeps until a commit takes usage
/// over the high watermark (or 10 s pass), then evicts down to the low
/// one. It ends when the store is dropped.
pub(super) fn spawn(store: Weak<Inner>, signal: Arc<GcSignal>) -> io::Result<()> {
    std::thread::Builder::new()
        .name("portico-disk-gc".into())
        .spawn(move || {
            let mut last_save = Instant::now();
            loop {
                {
                    let mut st = signal.state.lock().unwrap_or_else(|e| e.into_inner());
                    if !st.0 && !st.1 {
                        st = signal
                            .cond
                            .wait_timeout(st, Duration::from_secs(10))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    if st.1 {
                        return;
                    }
                    st.0 = false;
                }
                let Some(inner) = store.upgrade() else { return };
                if last_save.elapsed() >= super::POPULARITY_SAVE_EVERY {
                    last_save = Instant::now();
                    if let Err(e) = inner.save_popularity() {
                        tracing::warn!("disk cache: {e}");
                    }
                }
                if inner.over_high() {
                    let r = inner.gc_pass(inner.budget.low, false, &mut |_| {});
                    tracing::debug!(
                        "disk cache gc: evicted {} objects ({} bytes, {} expired) in {:?}, {} -> {} bytes",
                        r.evicted,
                        r.bytes,
                        r.expired,
                        r.elapsed,
                        r.before,
                        r.after
                    );
                }
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::DiskStats;
    use super::super::index::{Entry, Index};
    use crate::cache::key::ObjectId;
    use crate::config::Replacement;
    use std::sync::Arc;

    const BLOCK: u64 = 4096;

    fn e(last_access: u32, hits: u32, expires: u32) -> Entry {
        Entry {
            clock: 0,
            size: BLOCK,
            last_access,
            expires,
            hits,
            generation: 0,
            key_ok: true,
            verified: false,
        }
    }

    fn sized(blocks: u64, hits: u32) -> Entry {
        Entry {
            size: blocks * BLOCK,
            ..e(0, hits, 0)
        }
    }

    fn index(replacement: Replacement) -> Index {
        Index::new(Arc::new(DiskStats::default()), BLOCK, replacement, 1 << 30)
    }

    #[test]
    fn dead_objects_go_first_whatever_the_policy() {
        let now = 1_000_000;
        for r in [
            Replacement::Lru,
            Replacement::Gdsf,
            Replacement::Lfuda,
            Replacement::Balanced,
            Replacement::Frequency,
        ] {
            let idx = index(r);
            // Expired before live, whatever their recency and hits.
            assert!(
                idx.rank(ObjectId(0), &e(999_999, 100, 10), now) < idx.rank(ObjectId(0), &e(1, 0, 0), now),
                "{r:?}"
            );
            // Unreachable counts as dead; a future expiry is live.
            let mut bad = e(999_999, 0, 0);
            bad.key_ok = false;
            assert_eq!(idx.rank(ObjectId(0), &bad, now).0, 0, "{r:?}");
            assert_eq!(idx.rank(ObjectId(0), &e(100, 0, 2_000_000), now).0, 1, "{r:?}");
        }
    }

    #[test]
    fn lru_ranks_by_recency_with_an_hour_per_doubling_of_hits() {
        let (idx, now) = (index(Replacement::Lru), 1_000_000);
        assert!(idx.rank(ObjectId(0), &e(100, 0, 2_000_000), now) < idx.rank(ObjectId(0), &e(200, 0, 0), now));
        // 3 hits (2 doublings) beats 2 hours later with none.
        assert_eq!(idx.rank(ObjectId(0), &e(0, 3, 0), now), (1, 7200));
        assert!(idx.rank(ObjectId(0), &e(0, 3, 0), now) > idx.rank(ObjectId(0), &e(7000, 0, 0), now));
        assert_eq!(idx.rank(ObjectId(0), &e(0, u32::MAX, 0), now), (1, 24 * 3600));
    }

    #[test]
    fn gdsf_evicts_large_objects_before_small_ones_lfuda_by_hits_alone() {
        let now = 1_000_000;
        let (small_unused, large_popular) = (sized(1, 0), sized(100, 10));
        let gdsf = index(Replacement::Gdsf);
        assert!(gdsf.rank(ObjectId(0), &large_popular, now) < gdsf.rank(ObjectId(0), &small_unused, now));
        let lfuda = index(Replacement::Lfuda);
        assert!(lfuda.rank(ObjectId(0), &small_unused, now) < lfuda.rank(ObjectId(0), &large_popular, now));
        assert_eq!(
            lfuda.rank(ObjectId(0), &sized(1, 3), now),
            lfuda.rank(ObjectId(0), &sized(1000, 3), now)
        );
    }

    #[test]
    fn balanced_keeps_a_popular_large_object_over_an_unused_small_one() {
        let (idx, now) = (index(Replacement::Balanced), 1_000_000);
        // 11 x (1/100 + 0.15) = 1.76 > 1 x (1 + 0.15) = 1.15 > 1 x (1/100 + 0.15)
        assert!(idx.rank(ObjectId(0), &sized(1, 0), now) < idx.rank(ObjectId(0), &sized(100, 10), now));
        assert!(idx.rank(ObjectId(0), &sized(100, 0), now) < idx.rank(ObjectId(0), &sized(1, 0), now));
        // Among equals in size, the more hits the later.
        assert!(idx.rank(ObjectId(0), &sized(4, 1), now) < idx.rank(ObjectId(0), &sized(4, 2), now));
    }

    #[test]
    fn frequency_ranks_by_lookups_counted_before_the_object_was_stored() {
        let (idx, now) = (index(Replacement::Frequency), 1_000_000);
        let (popular, once) = (ObjectId(7 << 64 | 7), ObjectId(9 << 64 | 9));
        // Asked for five times while it was not stored (misses count), then
        // stored with no hits of its own: it outranks an object asked once.
        for _ in 0..5 {
            idx.asked(popular);
        }
        idx.asked(once);
        assert!(idx.rank(once, &sized(1, 0), now) < idx.rank(popular, &sized(1, 0), now));
        // Hits counted by the index do not matter, lookups do.
        assert!(idx.rank(once, &sized(1, 100), now) < idx.rank(popular, &sized(1, 0), now));
        // Size weighs as in balanced, with 0.5 per object: 5 x (1/100 +
        // 0.5) = 2.55 > 1 x (1 + 0.5) = 1.5.
        assert!(idx.rank(once, &sized(1, 0), now) < idx.rank(popular, &sized(100, 0), now));
        assert!(idx.rank(once, &sized(100, 0), now) < idx.rank(once, &sized(1, 0), now));
        // No clock: an eviction does not raise it, and a rank ignores it.
        idx.evicted_at(u64::MAX / 2);
        idx.insert(once, sized(1, 0));
        assert_eq!(idx.get(once).map(|e| e.clock), Some(0));
        let late = Entry {
            clock: u64::MAX / 2,
            ..sized(1, 0)
        };
        assert!(idx.rank(once, &late, now).1 < u64::MAX / 4);
    }

    #[test]
    fn only_frequency_counts_lookups() {
        let (idx, now) = (index(Replacement::Balanced), 1_000_000);
        let id = ObjectId(3 << 64 | 3);
        let before = idx.rank(id, &sized(1, 0), now);
        for _ in 0..5 {
            idx.asked(id);
        }
        assert_eq!(idx.rank(id, &sized(1, 0), now), before);
    }

    #[test]
    fn the_clock_ages_objects_hit_long_ago_below_those_stored_since() {
        let (idx, now) = (index(Replacement::Balanced), 1_000_000);
        idx.insert(ObjectId(1), sized(1, 50));
        let old = idx.get(ObjectId(1)).expect("indexed");
        // Evicting what ranked above the old favourite moves the clock past it.
        let (_, score) = idx.rank(ObjectId(0), &old, now);
        idx.evicted_at(score + 1);
        idx.insert(ObjectId(2), sized(1, 0));
        let new = idx.get(ObjectId(2)).expect("indexed");
        assert!(idx.rank(ObjectId(0), &old, now) < idx.rank(ObjectId(0), &new, now));
        // A hit brings the old one up to the clock again.
        idx.touch(ObjectId(1), 0);
        let hit = idx.get(ObjectId(1)).expect("indexed");
        assert!(idx.rank(ObjectId(0), &hit, now) > idx.rank(ObjectId(0), &new, now));
        // The LRU policy has no clock.
        let lru = index(Replacement::Lru);
        lru.evicted_at(u64::MAX);
        lru.insert(ObjectId(3), sized(1, 0));
        assert_eq!(lru.get(ObjectId(3)).map(|e| e.clock), Some(0));
    }
}
