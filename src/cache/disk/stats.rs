//! The disk tier's statistics: its counters (atomics, read any time
//! without a lock), a copy of them, and the start-up scan's progress.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Counters of the disk tier, all atomics (read them any time, lock-free).
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Objects in the index.
    pub objects: AtomicU64,
    /// Bytes on disk of the indexed objects (whole files).
    pub bytes: AtomicU64,
    /// Objects committed (new and updated).
    pub writes: AtomicU64,
    /// Bytes committed (whole files).
    pub bytes_written: AtomicU64,
    /// Writers dropped or aborted without commit (tmp file removed).
    pub write_aborts: AtomicU64,
    /// Successful `open`s.
    pub reads: AtomicU64,
    /// `open`s that found nothing (or something invalid).
    pub misses: AtomicU64,
    /// Body bytes read.
    pub bytes_read: AtomicU64,
    /// Lookups answered from a held-open file (`cache.open_files`).
    pub open_file_hits: AtomicU64,
    /// Lookups that had to open the file.
    pub open_file_misses: AtomicU64,
    /// Body reads done on the async worker because the page cache held
    /// the bytes (`preadv2(RWF_NOWAIT)`): held files' reads, and where file
    /// work goes to the blocking pool, the checksummed reads of files just
    /// opened.
    pub reads_nowait: AtomicU64,
    /// Body reads from held files that would have waited for the disk,
    /// handed to the blocking pool (run inline with `cache.file_io =
    /// "inline"`).
    pub reads_blocked: AtomicU64,
    /// Opens of files not held done on the worker thread where file work
    /// goes to the blocking pool: every part of the path and the file's
    /// envelope were in the kernel's caches (`openat2` with
    /// `RESOLVE_CACHED`, `preadv2` with `RWF_NOWAIT`).
    pub opens_nowait: AtomicU64,
    /// File jobs (opens, body reads and writes, commits) run on the worker
    /// thread that needed them rather than the blocking pool
    /// (`cache.file_io`).
    pub inline_jobs: AtomicU64,
    /// Files checked in the background for memory-tier objects, so their
    /// hits are sent from the file (`DiskStore::check_in_background`).
    pub background_checks: AtomicU64,
    /// Bodies whose checksum did not match when read to the end.
    pub checksum_failures: AtomicU64,
    /// Invalid or corrupt files removed (on open, read, scan).
    pub corrupt_removed: AtomicU64,
    /// Objects evicted by the GC.
    pub evictions: AtomicU64,
    /// Bytes evicted by the GC.
    pub bytes_evicted: AtomicU64,
    /// GC passes run.
    pub gc_runs: AtomicU64,
    /// Files examined by the start-up scan.
    pub scan_scanned: AtomicU64,
    /// Leaf directories scanned, and how many there are.
    pub scan_dirs_done: AtomicU64,
    /// Leaf directories to scan (known once the scan has listed them).
    pub scan_dirs_total: AtomicU64,
    /// The scan has finished: the index is complete.
    pub scan_done: AtomicBool,
    /// How long the scan took, microseconds (set when done).
    pub scan_micros: AtomicU64,
    /// Stale temporary files deleted.
    pub tmp_removed: AtomicU64,
    /// Objects found in directories of other levels and not indexed
    /// (offline tools only; a server's scan moves them).
    pub scan_misplaced: AtomicU64,
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStatsSnapshot {
    /// See `DiskStats`.
    pub objects: u64,
    /// See `DiskStats`.
    pub bytes: u64,
    /// See `DiskStats`.
    pub writes: u64,
    /// See `DiskStats`.
    pub bytes_written: u64,
    /// See `DiskStats`.
    pub write_aborts: u64,
    /// See `DiskStats`.
    pub reads: u64,
    /// See `DiskStats`.
    pub misses: u64,
    /// See `DiskStats`.
    pub bytes_read: u64,
    /// See `DiskStats`.
    pub open_file_hits: u64,
    /// See `DiskStats`.
    pub open_file_misses: u64,
    /// See `DiskStats`.
    pub reads_nowait: u64,
    /// See `DiskStats`.
    pub reads_blocked: u64,
    /// See [`DiskStats::opens_nowait`].
    pub opens_nowait: u64,
    /// See [`DiskStats::inline_jobs`].
    pub inline_jobs: u64,
    /// See [`DiskStats::background_checks`].
    pub background_checks: u64,
    /// See `DiskStats`.
    pub checksum_failures: u64,
    /// See `DiskStats`.
    pub corrupt_removed: u64,
    /// See `DiskStats`.
    pub evictions: u64,
    /// See `DiskStats`.
    pub bytes_evicted: u64,
    /// See `DiskStats`.
    pub gc_runs: u64,
    /// See `DiskStats`.
    pub tmp_removed: u64,
    /// See `ScanProgress`.
    pub scan: ScanProgress,
}

impl DiskStats {
    /// Reads every counter.
    pub fn snapshot(&self) -> DiskStatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskStatsSnapshot {
            objects: l(&self.objects),
            bytes: l(&self.bytes),
            writes: l(&self.writes),
            bytes_written: l(&self.bytes_written),
            write_aborts: l(&self.write_aborts),
            reads: l(&self.reads),
            misses: l(&self.misses),
            bytes_read: l(&self.bytes_read),
            open_file_hits: l(&self.open_file_hits),
            open_file_misses: l(&self.open_file_misses),
            reads_nowait: l(&self.reads_nowait),
            reads_blocked: l(&self.reads_blocked),
            opens_nowait: l(&self.opens_nowait),
            inline_jobs: l(&self.inline_jobs),
            background_checks: l(&self.background_checks),
            checksum_failures: l(&self.checksum_failures),
            corrupt_removed: l(&self.corrupt_removed),
            evictions: l(&self.evictions),
            bytes_evicted: l(&self.bytes_evicted),
            gc_runs: l(&self.gc_runs),
            tmp_removed: l(&self.tmp_removed),
            scan: self.scan_progress(),
        }
    }

    /// The start-up scan's progress.
    pub fn scan_progress(&self) -> ScanProgress {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ScanProgress {
            scanned: l(&self.scan_scanned),
            dirs_done: l(&self.scan_dirs_done),
            dirs_total: l(&self.scan_dirs_total),
            done: self.scan_done.load(Ordering::Acquire),
            elapsed: Duration::from_micros(l(&self.scan_micros)),
        }
    }
}

/// How far the start-up scan (the index rebuild) has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanProgress {
    /// Object files examined.
    pub scanned: u64,
    /// Leaf directories done.
    pub dirs_done: u64,
    /// Leaf directories in all.
    pub dirs_total: u64,
    /// The index is complete.
    pub done: bool,
    /// How long the scan took (0 until done).
    pub elapsed: Duration,
}
