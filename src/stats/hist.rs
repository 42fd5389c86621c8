//! A latency histogram of fixed log-linear buckets held in atomics.
//!
//! Why not hdrhistogram: recording into it needs `&mut`, so a shared one
//! needs a lock or per-thread copies merged under a lock; here recording is
//! one relaxed `fetch_add` from `&self` on any thread, and a snapshot reads
//! the buckets at any time with no merge step. Values are microseconds;
//! each power of two is split into 8 linear sub-buckets, so a percentile is
//! within 12.5% of the true value, from 1 µs to about 2^32 µs (71 minutes).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two (as a shift).
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// Powers of two covered above the linear first range.
const POWERS: usize = 32;
/// Number of buckets.
pub const BUCKETS: usize = SUB * (POWERS + 1);

/// The histogram.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

/// The bucket a value (µs) falls in.
fn index(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let power = 63 - v.leading_zeros(); // >= SUB_BITS
    let sub = (v >> (power - SUB_BITS)) as usize & (SUB - 1);
    let i = (power - SUB_BITS + 1) as usize * SUB + sub;
    i.min(BUCKETS - 1)
}

/// The smallest value (µs) of bucket `i`.
fn lower(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let power = (i / SUB) as u32 + SUB_BITS - 1;
    let sub = (i % SUB) as u64;
    (1u64 << power) + (sub << (power - SUB_BITS))
}

impl Histogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.record_us(us);
    }

    /// Records one value in microseconds.
    pub fn record_us(&self, us: u64) {
        self.buckets[index(us)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// A copy of the counts.
    pub fn snapshot(&self) -> HistSnapshot {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        HistSnapshot {
            // The count is the sum of the buckets read, so the two agree
            // even while other threads record.
            count: counts.iter().sum(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
            counts,
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HistSnapshot {
    /// Values recorded.
    pub count: u64,
    /// Their sum in microseconds.
    pub sum_us: u64,
    /// Per-bucket counts (see [`BUCKETS`]); empty for an empty histogram built by hand.
    /// Serialized sparsely as `[[bucket index, count], ...]` (non-zero buckets only):
    /// worker processes exchange their histograms this way, and the JSON
    /// document stays short.
    #[serde(serialize_with = "sparse_out", deserialize_with = "sparse_in", default)]
    pub counts: Vec<u64>,
}

fn sparse_out<S: Serializer>(counts: &[u64], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(counts.iter().enumerate().filter(|(_, c)| **c > 0))
}

fn sparse_in<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    let pairs: Vec<(usize, u64)> = Vec::deserialize(d)?;
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let mut counts = vec![0; BUCKETS];
    for (i, c) in pairs {
        // A bucket index from another version's layout lands in the last bucket.
        counts[i.min(BUCKETS - 1)] += c;
    }
    Ok(counts)
}

impl HistSnapshot {
    /// A snapshot holding the given values (µs); for tests and synthetic snapshots.
    pub fn from_values(values: &[u64]) -> HistSnapshot {
        let h = Histogram::default();
        for v in values {
            h.record_us(*v);
        }
        h.snapshot()
    }

    /// The value (µs) at quantile `q` (0..=1): the upper edge of the bucket
    /// holding it, so the answer is never below the true value. 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return if i + 1 < BUCKETS { lower(i + 1) - 1 } else { lower(i) };
            }
        }
        lower(BUCKETS - 1)
    }

    /// Adds `other`'s values to these (bucket by bucket): the histogram of
    /// both sets of values, as if one histogram had recorded them all.
    pub fn merge(&mut self, other: &HistSnapshot) {
        self.count += other.count;
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    /// Mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_us as f64 / self.count as f64
        }
    }

    /// Cumulative counts of values below each `2^k` µs for k in `0..=max_power`
    /// (Prometheus `le` buckets; powers of two are bucket edges, so exact).
    pub fn cumulative_pow2(&self, max_power: u32) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut acc = 0;
        let mut i = 0;
        for k in 0..=max_power {
            let edge = 1u64 << k;
            while i < self.counts.len() && lower(i) < edge {
                acc += self.counts[i];
                i += 1;
            }
            out.push((edge, acc));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_ordered() {
        for i in 0..BUCKETS - 1 {
            assert!(lower(i) < lower(i + 1), "bucket {i}");
            assert_eq!(index(lower(i)), i, "bucket {i} lower {}", lower(i));
            assert_eq!(index(lower(i + 1) - 1), i, "bucket {i} upper");
        }
    }

    #[test]
    fn quantiles_within_an_eighth() {
        let values: Vec<u64> = (1..=1000).map(|v| v * 37).collect();
        let h = HistSnapshot::from_values(&values);
        assert_eq!(h.count, 1000);
        for (q, truth) in [(0.5, 500 * 37), (0.99, 990 * 37), (1.0, 1000 * 37)] {
            let got = h.quantile_us(q);
            assert!(
                got >= truth && (got as f64) <= truth as f64 * 1.125 + 1.0,
                "q{q}: {got} vs {truth}"
            );
        }
        assert_eq!(HistSnapshot::default().quantile_us(0.5), 0);
    }

    #[test]
    fn merged_histograms_equal_one_fed_all_values_and_survive_json() {
        let (a, b) = ([3, 70, 900, 12_000], [1, 70, 5_000_000]);
        let mut m = HistSnapshot::from_values(&a);
        m.merge(&HistSnapshot::from_values(&b));
        let all: Vec<u64> = a.iter().chain(&b).copied().collect();
        let one = HistSnapshot::from_values(&all);
        assert_eq!((m.count, m.sum_us, &m.counts), (one.count, one.sum_us, &one.counts));
        let mut empty = HistSnapshot::default();
        empty.merge(&one);
        assert_eq!(empty.counts, one.counts);
        let text = serde_json::to_string(&one).unwrap();
        assert!(text.len() < 120, "sparse: {text}");
        let back: HistSnapshot = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (back.count, back.sum_us, back.counts),
            (one.count, one.sum_us, one.counts)
        );
    }

    #[test]
    fn cumulative_counts_at_powers_of_two() {
        let h = HistSnapshot::from_values(&[0, 1, 3, 4, 100, 5000]);
        let c = h.cumulative_pow2(13);
        // values < 1: {0}; < 2: {0,1}; < 4: {0,1,3}; < 8: +4; < 128: +100; < 8192: +5000
        assert_eq!(c[0], (1, 1));
        assert_eq!(c[1], (2, 2));
        assert_eq!(c[2], (4, 3));
        assert_eq!(c[3], (8, 4));
        assert_eq!(c[7], (128, 5));
        assert_eq!(c[13], (8192, 6));
    }
}
