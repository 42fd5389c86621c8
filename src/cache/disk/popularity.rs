//! How often each object has been asked for lately, stored or not: the
//! frequency estimate behind `cache.replacement = "frequency"` (TinyLFU's
//! sketch, as in Caffeine and Ristretto).
//!
//! A count-min sketch: four rows of 8-bit counters; a lookup of an id adds
//! one to its counter in each row (only to the smallest of the four, the
//! "conservative update", which keeps collisions from inflating counts) and
//! the estimate is the smallest of the four. An id's four counters lie in
//! one 64-byte block, as in Caffeine's sketch: the sketch (1 MiB for a
//! 1 GiB disk tier) is far larger than the CPU's caches and every lookup,
//! a memory-tier hit's included, counts its id, so four rows apart cost
//! four cache and TLB misses where one block costs one. Every `window` lookups all
//! counters are halved, so the estimate follows what is popular now and an
//! object popular last week ages out. The halving is spread over the
//! lookups that follow, 4,096 counters each: one pass over all of them took
//! 4.5 ms for 1 MiB and 14 ms for 16 MiB (release build), a stall no
//! request should wait for.
//!
//! Why a sketch rather than the index's own hit counts: the index forgets an
//! object when it is evicted, so an object evicted and asked for again
//! starts from nothing and is evicted again before its next request; the
//! sketch remembers misses too, in a fixed few bytes per expected object.
//!
//! Lock-free and racy on purpose: two lookups of one id at once may add
//! one between them, and a halving may lose increments made while it runs.
//! An estimate is off by one at worst, which ranking tolerates.
//!
//! Kept between runs in a file of the cache directory
//! ([`Popularity::to_file_bytes`], [`Popularity::restore`]): the objects on
//! disk survive a restart, and so must what ranks them, or every object
//! would start from nothing and the first evictions after a restart would
//! be made blind. A file that does not fit (damaged, or made for another
//! disk budget) is refused whole and the sketch starts empty.

use crate::cache::key::ObjectId;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

/// Rows of counters (hash functions).
const ROWS: usize = 4;
/// The budget bytes counted as one expected object (the mean object of the
/// `bench/run hitratio` stream is 13 KiB).
const BYTES_PER_OBJECT: u64 = 16 << 10;
/// Counters per row, at least and at most (4 x 4 MiB of counters at most).
const MIN_WIDTH: usize = 1 << 12;
const MAX_WIDTH: usize = 1 << 22;
/// Lookups between halvings, per expected object (Caffeine's sample size).
const WINDOW_PER_OBJECT: u64 = 10;
/// Counters halved by each lookup while a halving is under way.
const HALVE_CHUNK: usize = 4096;

/// Counters in one block, one cache line.
const BLOCK: usize = 64;
/// A block's share of each row: the sketch has as many counters as four
/// rows of its width would.
const PER_ROW: usize = BLOCK / ROWS;

/// What a sketch's file starts with.
const FILE_MAGIC: &[u8; 8] = b"PORTPOP2";
/// The magic of the layout before blocks (each row apart): its counters
/// belong to other ids in this one.
const OLD_MAGIC: &[u8; 8] = b"PORTPOP1";
/// Magic, rows (u32), width, window, lookups seen (u64 each).
const FILE_HEAD: usize = 8 + 4 + 8 + 8 + 8;
/// The xxh3-64 of everything before it, at the end of the file.
const FILE_SUM: usize = 8;

/// The largest file a sketch makes (the widest rows): a longer one is
/// refused unread, whatever it holds.
pub const MAX_FILE_LEN: u64 = (FILE_HEAD + ROWS * MAX_WIDTH + FILE_SUM) as u64;

/// Why a sketch's file was not restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreError {
    /// Not a whole file of the format (short, another magic, a length
    /// that does not match its header, a checksum that does not match).
    Damaged(&'static str),
    /// A file of the layout before blocks (`PORTPOP1`), written by an
    /// earlier Portico: its counters would count for other ids.
    EarlierLayout,
    /// A whole file for a sketch of another shape: the disk budget
    /// changed since it was written.
    OtherShape {
        /// Counters per row in the file.
        file: u64,
        /// Counters per row in this sketch.
        now: u64,
    },
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Damaged(why) => write!(f, "damaged ({why})"),
            RestoreError::EarlierLayout => f.write_str("written by an earlier Portico (layout PORTPOP1)"),
            RestoreError::OtherShape { file, now } => {
                write!(f, "made for another disk budget ({file} counters per row, {now} now)")
            }
        }
    }
}

/// One cache line of counters.
#[repr(C, align(64))]
struct Block([AtomicU8; BLOCK]);

/// The sketch.
pub struct Popularity {
    blocks: Box<[Block]>,
    /// Blocks minus one (their number is a power of two).
    mask: usize,
    /// Lookups between halvings.
    window: u64,
    /// Lookups recorded.
    seen: AtomicU64,
    /// The next counter a halving under way will halve (the number of
    /// counters or more when none is under way).
    halve_next: AtomicUsize,
}

impl Popularity {
    /// A sketch for a disk tier of `budget` bytes: four counters per row for
    /// each object the budget is expected to hold (one per 16 KiB), so that
    /// few objects share all four; halved every ten lookups per expected
    /// object. 1 MiB of counters for a 1 GiB budget.
    pub fn for_budget(budget: u64) -> Popularity {
        let expected = (budget / BYTES_PER_OBJECT).max(1024);
        let width = usize::try_from(expected.saturating_mul(4))
            .unwrap_or(MAX_WIDTH)
            .clamp(MIN_WIDTH, MAX_WIDTH);
        Popularity::new(width, expected * WINDOW_PER_OBJECT)
    }

    /// A sketch of `width` counters per row (rounded up to a power of two,
    /// at least one block's worth), halved every `window` lookups.
    pub fn new(width: usize, window: u64) -> Popularity {
        let blocks = (width.next_power_of_two() / PER_ROW).max(1);
        Popularity {
            blocks: (0..blocks)
                .map(|_| Block(std::array::from_fn(|_| AtomicU8::new(0))))
                .collect(),
            mask: blocks - 1,
            window: window.max(1),
            seen: AtomicU64::new(0),
            halve_next: AtomicUsize::new(blocks * BLOCK),
        }
    }

    /// Counters per row.
    fn width(&self) -> usize {
        (self.mask + 1) * PER_ROW
    }

    /// Every counter, block by block.
    fn counters(&self) -> impl Iterator<Item = &AtomicU8> {
        self.blocks.iter().flat_map(|b| b.0.iter())
    }

    /// The counter at `index` of the whole sketch (block by block).
    fn counter(&self, index: usize) -> &AtomicU8 {
        &self.blocks[index / BLOCK].0[index % BLOCK]
    }

    /// The counter of `id` in each row, all in one block. Ids are already
    /// uniformly distributed 128-bit hashes: the low 64 bits choose the
    /// block, six bits of the high 64 each counter among the block's 64.
    /// Any of the 64, not one of a row's own 16: two ids of one block then
    /// share all four counters far more rarely, and the hit ratio
    /// simulation (bench/hitratio_sim.py) gives the separate rows' byte hit
    /// ratio (41.2%), where 16 per row gave 41.0%.
    fn slots(&self, id: ObjectId) -> [usize; ROWS] {
        let block = (id.0 as u64 as usize & self.mask) * BLOCK;
        let high = (id.0 >> 64) as u64;
        std::array::from_fn(|row| block + ((high >> (6 * row)) as usize & (BLOCK - 1)))
    }

    /// Counts one lookup of `id`.
    pub fn record(&self, id: ObjectId) {
        let slots = self.slots(id);
        let values = slots.map(|s| self.counter(s).load(Ordering::Relaxed));
        let least = values.iter().copied().min().unwrap_or(0);
        if least < u8::MAX {
            for (slot, value) in slots.iter().zip(values) {
                if value == least {
                    self.counter(*slot).store(least + 1, Ordering::Relaxed);
                }
            }
        }
        if (self.seen.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(self.window) {
            self.halve_next.store(0, Ordering::Relaxed);
        }
        self.halve_some();
    }

    /// How many lookups of `id` were counted lately (at most 255).
    pub fn estimate(&self, id: ObjectId) -> u32 {
        let least = self
            .slots(id)
            .iter()
            .map(|s| self.counter(*s).load(Ordering::Relaxed))
            .min()
            .unwrap_or(0);
        u32::from(least)
    }

    /// Halves the next [`HALVE_CHUNK`] counters of a halving under way (a
    /// lookup a window ago then counts half as much as one now); nothing
    /// but a load when none is.
    fn halve_some(&self) {
        let len = self.blocks.len() * BLOCK;
        if self.halve_next.load(Ordering::Relaxed) >= len {
            return;
        }
        // Whole blocks: HALVE_CHUNK is a multiple of BLOCK.
        let start = self.halve_next.fetch_add(HALVE_CHUNK, Ordering::Relaxed);
        let blocks = self
            .blocks
            .iter()
            .take(len.min(start + HALVE_CHUNK) / BLOCK)
            .skip(start / BLOCK);
        for c in blocks.flat_map(|b| b.0.iter()) {
            let v = c.load(Ordering::Relaxed);
            if v != 0 {
                c.store(v >> 1, Ordering::Relaxed);
            }
        }
    }

    /// Lookups recorded since the sketch was made (or restored: the
    /// count its file held, plus those since).
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }

    /// The sketch as its file holds it: [`FILE_MAGIC`], the rows, the
    /// width and window, the lookups seen (little-endian), the counters
    /// block by block, then the xxh3-64 of all of that.
    pub fn to_file_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FILE_HEAD + self.blocks.len() * BLOCK + FILE_SUM);
        out.extend_from_slice(FILE_MAGIC);
        out.extend_from_slice(&(ROWS as u32).to_le_bytes());
        out.extend_from_slice(&(self.width() as u64).to_le_bytes());
        out.extend_from_slice(&self.window.to_le_bytes());
        out.extend_from_slice(&self.seen().to_le_bytes());
        out.extend(self.counters().map(|c| c.load(Ordering::Relaxed)));
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Takes the counters and the count of lookups from `file` (what
    /// [`Popularity::to_file_bytes`] wrote), if it is whole and of this
    /// sketch's shape; otherwise changes nothing and says why. Returns the
    /// lookups the file had counted.
    pub fn restore(&self, file: &[u8]) -> Result<u64, RestoreError> {
        let damaged = |why| Err(RestoreError::Damaged(why));
        if file.len() < FILE_HEAD + FILE_SUM {
            return damaged("shorter than its header");
        }
        if &file[..8] == OLD_MAGIC {
            return Err(RestoreError::EarlierLayout);
        }
        if &file[..8] != FILE_MAGIC {
            return damaged("not a popularity file");
        }
        let (body, sum) = file.split_at(file.len() - FILE_SUM);
        if xxhash_rust::xxh3::xxh3_64(body).to_le_bytes() != sum {
            return damaged("checksum mismatch");
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let rows = u32::from_le_bytes([body[8], body[9], body[10], body[11]]);
        let (width, window, seen) = (u64_at(12), u64_at(20), u64_at(28));
        let now = self.width() as u64;
        if rows as usize != ROWS || width != now || window != self.window {
            return Err(RestoreError::OtherShape { file: width, now });
        }
        let counters = &body[FILE_HEAD..];
        if counters.len() != self.blocks.len() * BLOCK {
            return damaged("length does not match its header");
        }
        for (c, v) in self.counters().zip(counters) {
            c.store(*v, Ordering::Relaxed);
        }
        self.seen.store(seen, Ordering::Relaxed);
        Ok(seen)
    }

    /// Bytes the counters take.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.blocks.len() * BLOCK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> ObjectId {
        // Spread like real ids (xxh3-128 of the key).
        ObjectId(xxhash_rust::xxh3::xxh3_128(&n.to_le_bytes()))
    }

    #[test]
    fn counts_lookups_per_object() {
        let p = Popularity::new(1 << 12, 1 << 30);
        for _ in 0..5 {
            p.record(id(1));
        }
        p.record(id(2));
        assert_eq!(p.estimate(id(1)), 5);
        assert_eq!(p.estimate(id(2)), 1);
        assert_eq!(p.estimate(id(3)), 0);
    }

    #[test]
    fn counts_saturate_instead_of_wrapping() {
        let p = Popularity::new(1 << 12, 1 << 30);
        for _ in 0..300 {
            p.record(id(1));
        }
        assert_eq!(p.estimate(id(1)), 255);
    }

    #[test]
    fn every_window_of_lookups_halves_the_counts_over_the_lookups_that_follow() {
        // 4 rows of 4,096 counters: a halving takes four lookups, 4,096
        // counters (a quarter of the blocks) each.
        let p = Popularity::new(1 << 12, 100);
        // An object in the first quarter and one in the second.
        let first = (1000..).find(|&n| p.slots(id(n))[0] < HALVE_CHUNK).expect("some id");
        let second = (1000..)
            .find(|&n| (HALVE_CHUNK..2 * HALVE_CHUNK).contains(&p.slots(id(n))[0]))
            .expect("some id");
        for _ in 0..40 {
            p.record(id(first));
            p.record(id(second));
        }
        for n in 0..19 {
            p.record(id(100 + n));
        }
        assert_eq!((p.estimate(id(first)), p.estimate(id(second))), (40, 40));
        p.record(id(2)); // the 100th lookup: the first quarter is halved
        assert_eq!((p.estimate(id(first)), p.estimate(id(second))), (20, 40));
        for n in 0..3 {
            p.record(id(200 + n));
        }
        assert_eq!((p.estimate(id(first)), p.estimate(id(second))), (20, 20));
        assert_eq!(p.estimate(id(2)), 0, "1 halved is 0");
        // Done: the next lookups halve nothing until the next window.
        p.record(id(first));
        assert_eq!(p.estimate(id(first)), 21);
    }

    #[test]
    fn an_objects_four_counters_share_one_cache_line() {
        assert_eq!(std::mem::align_of::<Block>(), 64);
        assert_eq!(std::mem::size_of::<Block>(), 64);
        let p = Popularity::for_budget(1 << 30);
        for n in 0..1000 {
            let slots = p.slots(id(n));
            assert!(slots.iter().all(|s| s / BLOCK == slots[0] / BLOCK), "{slots:?}");
        }
        // The blocks are used evenly: 1,000 ids over 16,384 blocks land in
        // nearly 1,000 different ones.
        let blocks: std::collections::HashSet<usize> = (0..1000).map(|n| p.slots(id(n))[0] / BLOCK).collect();
        assert!(blocks.len() > 950, "{}", blocks.len());
    }

    #[test]
    fn collisions_rarely_inflate_a_count_with_four_counters_per_object() {
        // 4,096 objects asked for once each in a sketch sized for them:
        // nearly all still read 1, none more than 2.
        let p = Popularity::new(4 * 4096, 1 << 30);
        for n in 0..4096 {
            p.record(id(n));
        }
        let over: Vec<u32> = (0..4096).map(|n| p.estimate(id(n))).filter(|&e| e != 1).collect();
        assert!(over.len() < 41, "{} of 4,096 estimates are not 1", over.len());
        assert!(over.iter().all(|&e| e == 2), "{over:?}");
        // An object never asked for reads 0 nearly always.
        let ghosts = (10_000..14_096).filter(|&n| p.estimate(id(n)) > 0).count();
        assert!(ghosts < 41, "{ghosts} of 4,096 unseen objects read above 0");
    }

    #[test]
    fn a_sketch_written_to_its_file_and_restored_estimates_as_before() {
        let p = Popularity::new(1 << 12, 1000);
        for _ in 0..7 {
            p.record(id(1));
        }
        p.record(id(2));
        let file = p.to_file_bytes();
        assert_eq!(file.len(), FILE_HEAD + 4 * (1 << 12) + FILE_SUM);
        let q = Popularity::new(1 << 12, 1000);
        assert_eq!(q.restore(&file), Ok(8));
        assert_eq!((q.estimate(id(1)), q.estimate(id(2)), q.estimate(id(3))), (7, 1, 0));
        assert_eq!(q.seen(), 8);
        // The halving window goes on from the lookups the file counted.
        assert_eq!(q.to_file_bytes(), file);
    }

    #[test]
    fn a_damaged_file_is_refused_whole_and_changes_nothing() {
        let p = Popularity::new(1 << 12, 1000);
        for _ in 0..9 {
            p.record(id(1));
        }
        let file = p.to_file_bytes();
        let fresh = || {
            let q = Popularity::new(1 << 12, 1000);
            q.record(id(5));
            q
        };
        let mut flipped = file.clone();
        flipped[FILE_HEAD + 100] ^= 1;
        let mut magic = file.clone();
        magic[0] = b'X';
        let mut long = file[..file.len() - FILE_SUM].to_vec();
        long.push(0);
        let sum = xxhash_rust::xxh3::xxh3_64(&long);
        long.extend_from_slice(&sum.to_le_bytes());
        let cases: [(&[u8], &str); 6] = [
            (&[], "shorter than its header"),
            (&file[..FILE_HEAD], "shorter than its header"),
            (&file[..file.len() - 1], "checksum mismatch"),
            (&flipped, "checksum mismatch"),
            (&magic, "not a popularity file"),
            (&long, "length does not match its header"),
        ];
        for (bytes, why) in cases {
            let q = fresh();
            assert_eq!(q.restore(bytes), Err(RestoreError::Damaged(why)));
            assert_eq!((q.estimate(id(1)), q.estimate(id(5)), q.seen()), (0, 1, 1), "{why}");
        }
        // The layout before blocks, whole and checksummed: refused as such.
        let mut old = file[..file.len() - FILE_SUM].to_vec();
        old[..8].copy_from_slice(OLD_MAGIC);
        let sum = xxhash_rust::xxh3::xxh3_64(&old);
        old.extend_from_slice(&sum.to_le_bytes());
        let q = fresh();
        assert_eq!(q.restore(&old), Err(RestoreError::EarlierLayout));
        assert_eq!((q.estimate(id(1)), q.estimate(id(5)), q.seen()), (0, 1, 1));
        // Random bytes of the right length are no better.
        let noise: Vec<u8> = (0..file.len()).map(|i| (i * 131 % 251) as u8).collect();
        assert_eq!(
            fresh().restore(&noise),
            Err(RestoreError::Damaged("not a popularity file"))
        );
    }

    #[test]
    fn a_file_for_another_budget_is_refused() {
        let small = Popularity::for_budget(64 << 20);
        small.record(id(1));
        let big = Popularity::for_budget(1 << 30);
        let err = big.restore(&small.to_file_bytes()).expect_err("another shape");
        assert_eq!(
            err,
            RestoreError::OtherShape {
                file: 16_384,
                now: 262_144
            }
        );
        assert_eq!(big.estimate(id(1)), 0);
        assert_eq!(
            err.to_string(),
            "made for another disk budget (16384 counters per row, 262144 now)"
        );
    }

    #[test]
    fn sized_from_the_budget() {
        let p = Popularity::for_budget(1 << 30);
        assert_eq!(p.bytes(), 4 * (1 << 18), "1 MiB of counters for 1 GiB");
        assert_eq!(p.window, 10 * 65_536);
        assert_eq!(Popularity::for_budget(0).bytes(), 4 * MIN_WIDTH);
        assert_eq!(Popularity::for_budget(1 << 50).bytes(), 4 * MAX_WIDTH);
    }
}
