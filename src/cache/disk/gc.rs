//! The garbage collector: evicts objects until the bytes used are at or
//! below a target (the low watermark).
//!
//! Order of eviction (lowest first), over a snapshot of the index:
//!
//! 1. **dead**: objects whose expiry hint has passed (`0 < expires <
//!    now`) or whose stored key does not hash to their id (never found by
//!    a lookup), oldest last access first;
//! 2. **live**: the rest, lowest score first, where
//!    `score = last_access + 3600 * min(floor(log2(1 + hits)), 24)` seconds:
//!    least recently used first, and every doubling of an object's hit
//!    count is worth one hour of recency (at most a day), so a popular
//!    object outlives a one-hit wonder fetched a little later. Ties: larger
//!    objects first.
//!
//! A pass copies the index shard by shard (each shard's lock held only
//! while it is copied), sorts the candidates, then evicts them one at a
//! time under that object's stripe lock; an object committed again or
//! accessed since the snapshot is skipped. It runs on its own thread (auto
//! mode) or the caller's (`portico cache gc`), never on an async worker.

use super::{GcSignal, Inner, now_secs};
use crate::cache::key::ObjectId;
use crate::cache::object::StoredMeta;
use std::fs::{self, File};
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

/// The eviction order key of an entry: (class, score); lower goes first.
pub(super) fn rank(e: &super::index::Entry, now: u64) -> (u8, u64) {
    let dead = !e.key_ok || (e.expires != 0 && u64::from(e.expires) < now);
    if dead {
        return (0, u64::from(e.last_access));
    }
    let doublings = u64::from(31 - e.hits.saturating_add(1).leading_zeros()).min(24);
    (1, u64::from(e.last_access) + 3600 * doublings)
}

struct Candidate {
    class: u8,
    score: u64,
    size: u64,
    id: ObjectId,
    generation: u32,
    last_access: u32,
}

fn read_key(path: &std::path::Path) -> Option<String> {
    let f = File::open(path).ok()?;
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
                let (class, score) = rank(e, now);
                cands.push(Candidate {
                    class,
                    score,
                    size: e.size,
                    id,
                    generation: e.generation,
                    last_access: e.last_access,
                });
            });
            cands.sort_unstable_by(|a, b| {
                (a.class, a.score, std::cmp::Reverse(a.size)).cmp(&(b.class, b.score, std::cmp::Reverse(b.size)))
            });
            for c in cands {
                if self.stats.bytes.load(Ordering::Relaxed) <= target {
                    break;
                }
                if let Some(ev) = self.evict(&c, read_keys) {
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
        }
        report.after = self.stats.bytes.load(Ordering::Relaxed);
        report.elapsed = started.elapsed();
        report
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
    use super::super::index::Entry;
    use super::*;

    fn e(last_access: u32, hits: u32, expires: u32) -> Entry {
        Entry {
            size: 1,
            last_access,
            expires,
            hits,
            generation: 0,
            key_ok: true,
            verified: false,
        }
    }

    #[test]
    fn ranking() {
        let now = 1_000_000;
        // Expired before live, whatever their recency.
        assert!(rank(&e(999_999, 100, 10), now) < rank(&e(1, 0, 0), now));
        // Unreachable counts as dead.
        let mut bad = e(999_999, 0, 0);
        bad.key_ok = false;
        assert_eq!(rank(&bad, now).0, 0);
        // LRU among equals; future expiry is live.
        assert!(rank(&e(100, 0, 2_000_000), now) < rank(&e(200, 0, 0), now));
        // One hour per doubling of hits: 3 hits (2 doublings) beats 2 hours later with none.
        assert_eq!(rank(&e(0, 3, 0), now), (1, 7200));
        assert!(rank(&e(0, 3, 0), now) > rank(&e(7000, 0, 0), now));
        assert_eq!(rank(&e(0, u32::MAX, 0), now), (1, 24 * 3600));
    }
}
