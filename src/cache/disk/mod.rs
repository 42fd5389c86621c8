//! The disk tier: a crash-safe object store with no knowledge of HTTP
//! semantics (the policy decides what to store, serve and revalidate).
//!
//! - **Files** (`format`): one file per object under `<dir>/<L1>/<L2>/`,
//!   header + metadata + body + trailer with an xxh3 checksum. A new object
//!   is written to `<dir>/tmp/` and renamed into place, so a half-written
//!   object is never visible under its final name; a kill -9 mid-write
//!   leaves only a tmp file, which the next start deletes.
//! - **Index** (`index`): id -> size, last access, hits, expiry hint, in
//!   sharded mutexes. Rebuilt at start by a background thread (`scan`)
//!   while the store is already usable: before the scan finishes, `open`
//!   looks for the file by path; after it, an id missing from the index is a
//!   miss without a system call.
//! - **GC** (`gc`): keeps the bytes used between the watermarks, on its own
//!   thread, evicting expired objects first, then the least valuable.
//!
//! All file I/O is blocking; the async methods run it on the blocking pool
//! (`crate::blocking`, the Sun Java System Web Proxy Server 4's NativePool), never on the
//! async workers.
//! Methods named `*_blocking` do it on the calling thread (CLI, tests).
//!
//! Concurrency: every change of an object's file and index entry (commit,
//! remove, eviction, the scan indexing a file) holds that id's stripe of
//! 1024 mutexes, so a change and the index agree. Readers take no lock: they
//! open the path and keep reading the file they opened, whatever is renamed
//! over it or removed. Other processes (`portico cache gc|purge` while a
//! server runs) may remove files under the server: that is just a miss, and
//! the stale index entry is dropped when found.

pub mod format;
mod gc;
pub mod index;
mod scan;

pub use format::{Corrupt, Envelope, Layout, Trailer};
pub use gc::{Evicted, GcReport};
pub use scan::{ObjectFile, for_each_object_file};

use crate::blocking::{BlockingPool, PoolError};
use crate::cache::key::{CacheKey, ObjectId};
use crate::cache::object::StoredMeta;
use crate::config::{CacheConfig, Fsync, GcMode};
use bytes::Bytes;
use format::{Checksum, HEADER_LEN, ReadError, TRAILER_LEN};
use index::{Entry, Index};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Body bytes per chunk returned by `BodyReader::chunk`.
pub const READ_CHUNK: usize = 64 << 10;
/// A writer hands its buffer to the blocking pool once it holds this much.
const WRITE_FLUSH: usize = 256 << 10;
const PATH_LOCKS: usize = 1024;

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

/// The byte budget and its watermarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// `cache.disk`.
    pub disk: u64,
    /// GC stops at or below this many bytes.
    pub low: u64,
    /// GC starts above this many bytes.
    pub high: u64,
}

impl Budget {
    /// From the budget and `[low, high]` percentages.
    pub fn new(disk: u64, watermarks: [u8; 2]) -> Budget {
        let pct = |p: u8| (disk as u128 * u128::from(p.min(100)) / 100) as u64;
        Budget {
            disk,
            low: pct(watermarks[0]),
            high: pct(watermarks[1]),
        }
    }
}

/// What the index knows about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Bytes on disk.
    pub size: u64,
    /// Last access, unix seconds (after a restart: the file's atime or mtime).
    pub last_access: u64,
    /// Accesses since indexed.
    pub hits: u32,
    /// Expiry hint, unix seconds, 0 = unknown.
    pub expires: u64,
    /// The stored key hashes to the id.
    pub key_ok: bool,
}

impl From<Entry> for IndexEntry {
    fn from(e: Entry) -> Self {
        IndexEntry {
            size: e.size,
            last_access: u64::from(e.last_access),
            hits: e.hits,
            expires: u64::from(e.expires),
            key_ok: e.key_ok,
        }
    }
}

/// Current time, unix seconds.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn secs32(s: u64) -> u32 {
    u32::try_from(s).unwrap_or(u32::MAX)
}

/// Whether the metadata's key (and variant) hash to `id`: an object whose
/// key does not can never be looked up.
pub fn key_matches(id: ObjectId, meta: &StoredMeta) -> bool {
    CacheKey::from_text(&meta.key).is_some_and(|k| k.variant_id(&meta.variant) == id)
}

/// Store instances alive in this process: a tmp file named with our pid
/// but an instance that is gone was left by a writer that never finished.
static LIVE_INSTANCES: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

fn instance_live(instance: u64) -> bool {
    LIVE_INSTANCES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&instance)
}

/// Wakes the GC thread.
#[derive(Default)]
struct GcSignal {
    state: Mutex<(bool, bool)>, // (work pending, stop)
    cond: std::sync::Condvar,
}

impl GcSignal {
    fn kick(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0 = true;
        self.cond.notify_one();
    }
    fn stop(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.cond.notify_one();
    }
}

struct Inner {
    layout: Layout,
    budget: Budget,
    fsync: bool,
    max_object: u64,
    index: Index,
    stats: Arc<DiskStats>,
    locks: Box<[Mutex<()>]>,
    instance: u64,
    tmp_counter: AtomicU64,
    gc_signal: Arc<GcSignal>,
    gc_running: Mutex<()>,
    scan_notify: tokio::sync::Notify,
    pool: BlockingPool,
    /// Other server processes write to the same directory (multi-process
    /// mode): an id missing from our index may still be on disk.
    shared_dir: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.gc_signal.stop();
        LIVE_INSTANCES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|i| *i != self.instance);
    }
}

fn io_other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Inner {
    fn lock(&self, id: ObjectId) -> MutexGuard<'_, ()> {
        let i = (id.0 >> 64) as usize % PATH_LOCKS;
        self.locks[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn scan_done(&self) -> bool {
        self.stats.scan_done.load(Ordering::Acquire)
    }

    fn over_high(&self) -> bool {
        self.stats.bytes.load(Ordering::Relaxed) > self.budget.high
    }

    /// Renames a finished tmp file into place and indexes it.
    fn publish(&self, id: ObjectId, tmp: &Path, entry: Entry) -> io::Result<()> {
        let path = self.layout.path_of(id);
        let guard = self.lock(id);
        if let Err(e) = fs::rename(tmp, &path) {
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
            let dir = self.layout.dir_of(id);
            fs::create_dir_all(&dir)?;
            if self.fsync {
                sync_dir(self.layout.root())?;
                if let Some(p) = dir.parent() {
                    sync_dir(p)?;
                }
            }
            fs::rename(tmp, &path)?;
        }
        self.index.insert(id, entry);
        drop(guard);
        if self.fsync {
            sync_dir(&self.layout.dir_of(id))?;
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_written.fetch_add(entry.size, Ordering::Relaxed);
        if self.over_high() {
            self.gc_signal.kick();
        }
        Ok(())
    }

    /// Removes the file at `id`'s path if it is still the file `(dev, ino)`
    /// found corrupt (a newer object renamed over it is left alone).
    fn remove_corrupt(&self, id: ObjectId, dev: u64, ino: u64, why: &str) {
        let path = self.layout.path_of(id);
        let _guard = self.lock(id);
        if let Ok(m) = fs::symlink_metadata(&path)
            && m.dev() == dev
            && m.ino() == ino
        {
            tracing::warn!("disk cache: removing corrupt object {}: {why}", path.display());
            if fs::remove_file(&path).is_ok() {
                self.stats.corrupt_removed.fetch_add(1, Ordering::Relaxed);
            }
            self.index.remove(id);
        }
    }

    fn remove_blocking(&self, id: ObjectId) -> bool {
        let path = self.layout.path_of(id);
        let _guard = self.lock(id);
        let existed = match fs::remove_file(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => {
                tracing::warn!(
                    "disk cache: cannot remove {}: {cause}",
                    path.display(),
                    cause = crate::util::io_cause(&e)
                );
                false
            }
        };
        self.index.remove(id).is_some() || existed
    }

    fn contains_blocking(&self, id: ObjectId) -> bool {
        self.index.get(id).is_some()
            || (self.may_exist_unindexed() && fs::symlink_metadata(self.layout.path_of(id)).is_ok())
    }

    fn miss(&self) -> Option<DiskObject> {
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Whether a lookup of an id not in the index must still look at the
    /// file (during the start-up scan, or when other processes write here).
    fn may_exist_unindexed(&self) -> bool {
        !self.scan_done() || self.shared_dir.load(Ordering::Relaxed)
    }

    fn open_blocking(self: &Arc<Self>, id: ObjectId) -> Option<DiskObject> {
        let entry = self.index.get(id);
        if entry.is_none() && !self.may_exist_unindexed() {
            return self.miss();
        }
        let path = self.layout.path_of(id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    // Removed by another process: forget it.
                    if let Some(en) = entry {
                        self.index.remove_generation(id, en.generation);
                    }
                } else {
                    tracing::warn!(
                        "disk cache: cannot open {}: {cause}",
                        path.display(),
                        cause = crate::util::io_cause(&e)
                    );
                }
                return self.miss();
            }
        };
        let corrupt = |why: &str| {
            if let Ok(m) = file.metadata() {
                self.remove_corrupt(id, m.dev(), m.ino(), why);
            }
            self.miss()
        };
        let env = match format::read_envelope(&file) {
            Ok(env) => env,
            Err(ReadError::Corrupt(c)) => return corrupt(c.0),
            Err(ReadError::Io(e)) => {
                tracing::warn!(
                    "disk cache: cannot read {}: {cause}",
                    path.display(),
                    cause = crate::util::io_cause(&e)
                );
                return self.miss();
            }
        };
        let meta = match StoredMeta::decode(&env.meta) {
            Ok(m) if !m.key.is_empty() => m,
            Ok(_) => return corrupt("empty key"),
            Err(e) => return corrupt(e.0),
        };
        if entry.is_none() && self.scan_done() {
            // Written by another process since our scan: count it from now
            // on, so our GC keeps what we serve within our budget.
            self.index.insert_if_absent(
                id,
                Entry {
                    size: env.file_len,
                    last_access: secs32(now_secs()),
                    expires: secs32(env.trailer.expires),
                    hits: 0,
                    generation: self.index.next_generation(),
                    key_ok: key_matches(id, &meta),
                },
            );
        }
        self.index.touch(id, secs32(now_secs()));
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        Some(DiskObject {
            id,
            meta,
            body_len: env.trailer.body_len,
            expires: env.trailer.expires,
            file_len: env.file_len,
            body: BodyReader {
                state: Some(Box::new(ReadState {
                    off: env.body_offset(),
                    left: env.trailer.body_len,
                    sum: Some(Checksum::new(&env.meta)),
                    trailer: env.trailer,
                    file,
                    id,
                    dev: env.dev,
                    ino: env.ino,
                    store: Arc::downgrade(self),
                })),
                remaining: env.trailer.body_len,
                failed: None,
                pool: self.pool.clone(),
            },
        })
    }

    fn tmp_path(&self, id: ObjectId) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.layout
            .tmp_dir()
            .join(format!("{}.{}.{}.{n}", id.hex(), std::process::id(), self.instance))
    }

    /// Creates a tmp file holding the header and `meta`.
    fn new_write_state(self: &Arc<Self>, id: ObjectId, meta: &StoredMeta) -> io::Result<WriteState> {
        let tmp = self.tmp_path(id);
        let create = || OpenOptions::new().write(true).create_new(true).open(&tmp);
        let file = match create() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(self.layout.tmp_dir())?;
                create()?
            }
            r => r?,
        };
        let meta_bytes = meta.encode();
        let meta_len = u32::try_from(meta_bytes.len())
            .ok()
            .filter(|n| *n <= format::MAX_META_LEN)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "metadata too large"))?;
        let mut st = WriteState {
            file,
            tmp,
            sum: Some(Checksum::new(&meta_bytes)),
            meta_len: u64::from(meta_len),
            body_len: 0,
            key_ok: key_matches(id, meta),
            store: Arc::downgrade(self),
            stats: self.stats.clone(),
            fsync: self.fsync,
            done: false,
        };
        let mut head = Vec::with_capacity(HEADER_LEN as usize + meta_bytes.len());
        head.extend_from_slice(&format::encode_header(meta_len));
        head.extend_from_slice(&meta_bytes);
        st.file.write_all(&head)?;
        Ok(st)
    }

    fn update_meta_blocking(self: &Arc<Self>, id: ObjectId, meta: &StoredMeta, expires: u64) -> io::Result<bool> {
        let path = self.layout.path_of(id);
        let old = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let env = match format::read_envelope(&old) {
            Ok(env) => env,
            Err(ReadError::Corrupt(c)) => {
                let m = old.metadata()?;
                self.remove_corrupt(id, m.dev(), m.ino(), c.0);
                return Ok(false);
            }
            Err(ReadError::Io(e)) => return Err(e),
        };
        let mut st = self.new_write_state(id, meta)?;
        let mut old_sum = Checksum::new(&env.meta);
        let mut buf = vec![0u8; 256 << 10];
        let mut off = env.body_offset();
        let mut left = env.trailer.body_len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            if let Err(e) = old.read_exact_at(&mut buf[..n], off) {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    self.remove_corrupt(id, env.dev, env.ino, "truncated");
                }
                return Err(e);
            }
            old_sum.update(&buf[..n]);
            st.write_body(&buf[..n])?;
            off += n as u64;
            left -= n as u64;
        }
        if old_sum.finish(env.trailer.body_len, env.trailer.expires) != env.trailer.checksum {
            self.stats.checksum_failures.fetch_add(1, Ordering::Relaxed);
            self.remove_corrupt(id, env.dev, env.ino, "checksum mismatch");
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "stored body failed its checksum",
            ));
        }
        let size = st.finish(expires)?;
        let old_entry = self.index.get(id);
        let entry = Entry {
            size,
            last_access: secs32(now_secs()),
            expires: secs32(expires),
            hits: old_entry.map_or(0, |e| e.hits),
            generation: self.index.next_generation(),
            key_ok: st.key_ok,
        };
        // Publish only over the very file we copied from: if a new object
        // was committed meanwhile, it wins and this update is dropped.
        let guard = self.lock(id);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.dev() == env.dev && m.ino() == env.ino => {}
            _ => return Ok(false),
        }
        fs::rename(&st.tmp, &path)?;
        st.done = true;
        self.index.insert(id, entry);
        drop(guard);
        if self.fsync {
            sync_dir(&self.layout.dir_of(id))?;
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_written.fetch_add(size, Ordering::Relaxed);
        Ok(true)
    }
}

async fn blocking<T: Send + 'static>(pool: &BlockingPool, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    pool.run(f).await.map_err(io_other)
}

/// The disk tier. Cheap to clone (a shared handle); the background scan
/// and GC threads stop when the last handle is dropped.
#[derive(Clone)]
pub struct DiskStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStore")
            .field("dir", &self.inner.layout.root())
            .finish()
    }
}

impl DiskStore {
    fn create(cfg: &CacheConfig, pool: BlockingPool) -> io::Result<DiskStore> {
        if cfg.disk.bytes() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cache.disk is 0: the disk tier is disabled",
            ));
        }
        let layout = Layout::new(&cfg.dir, cfg.levels);
        fs::create_dir_all(layout.tmp_dir()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot create cache directory {}: {e}", cfg.dir.display()),
            )
        })?;
        let stats = Arc::new(DiskStats::default());
        let instance = NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed);
        LIVE_INSTANCES.lock().unwrap_or_else(|e| e.into_inner()).push(instance);
        let inner = Inner {
            layout,
            budget: Budget::new(cfg.disk.bytes(), cfg.watermarks),
            fsync: cfg.fsync == Fsync::Always,
            max_object: cfg.max_object_size.bytes(),
            index: Index::new(stats.clone()),
            stats,
            locks: (0..PATH_LOCKS).map(|_| Mutex::new(())).collect(),
            instance,
            tmp_counter: AtomicU64::new(0),
            gc_signal: Arc::new(GcSignal::default()),
            gc_running: Mutex::new(()),
            scan_notify: tokio::sync::Notify::new(),
            pool,
            shared_dir: AtomicBool::new(false),
        };
        Ok(DiskStore { inner: Arc::new(inner) })
    }

    /// Opens (creating if needed) the store at `cfg.dir` for a server:
    /// returns at once, usable immediately; a background thread rebuilds
    /// the index (deleting stale tmp files and invalid objects), and with
    /// `gc = "auto"` another keeps usage between the watermarks. Fails if
    /// `cfg.disk` is 0 or the directory cannot be created.
    pub fn start(cfg: &CacheConfig) -> io::Result<DiskStore> {
        Self::start_with_pool(cfg, BlockingPool::shared_default())
    }

    /// `start`, running the file I/O of the async methods on `pool`.
    pub fn start_with_pool(cfg: &CacheConfig, pool: BlockingPool) -> io::Result<DiskStore> {
        let store = Self::create(cfg, pool)?;
        let weak = Arc::downgrade(&store.inner);
        std::thread::Builder::new()
            .name("portico-disk-scan".into())
            .spawn(move || scan::run(weak, true, &mut |_| {}))?;
        if cfg.gc == GcMode::Auto {
            gc::spawn(Arc::downgrade(&store.inner), store.inner.gc_signal.clone())?;
        }
        Ok(store)
    }

    /// Tells the store that other server processes use the same directory
    /// (`server.processes > 1`): a lookup then checks the file even when
    /// the id is not in this process's index (objects they stored after our
    /// start-up scan), and indexes what it finds. Costs a failed `open` on
    /// the blocking pool per disk miss.
    pub fn set_shared_dir(&self, shared: bool) {
        self.inner.shared_dir.store(shared, Ordering::Relaxed);
    }

    /// Opens the store for offline work (`portico cache ...`): scans on the
    /// calling thread before returning, reporting progress after each leaf
    /// directory; starts no GC thread, and leaves objects stored under other
    /// levels where they are (not indexed; see `DiskStats::scan_misplaced`).
    pub fn start_offline(cfg: &CacheConfig, on_progress: &mut dyn FnMut(&ScanProgress)) -> io::Result<DiskStore> {
        let store = Self::create(cfg, BlockingPool::shared_default())?;
        scan::run(Arc::downgrade(&store.inner), false, on_progress);
        Ok(store)
    }

    /// The directory layout.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The final path of an object.
    pub fn path_of(&self, id: ObjectId) -> PathBuf {
        self.inner.layout.path_of(id)
    }

    /// The budget and watermarks in bytes.
    pub fn budget(&self) -> Budget {
        self.inner.budget
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<DiskStats> {
        &self.inner.stats
    }

    /// Bytes used by indexed objects.
    pub fn used(&self) -> u64 {
        self.inner.stats.bytes.load(Ordering::Relaxed)
    }

    /// The start-up scan's progress.
    pub fn scan_progress(&self) -> ScanProgress {
        self.inner.stats.scan_progress()
    }

    /// Waits until the index is complete.
    pub async fn wait_scan(&self) {
        loop {
            let notified = self.inner.scan_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.scan_done() {
                return;
            }
            notified.await;
        }
    }

    /// Waits (blocking) until the index is complete; false on timeout.
    pub fn wait_scan_blocking(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while !self.inner.scan_done() {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Opens an object for reading: metadata, body length and a streaming
    /// body reader. None if absent or invalid (an invalid file is removed).
    /// Counts as an access (`touch`).
    pub async fn open(&self, id: ObjectId) -> Option<DiskObject> {
        let inner = self.inner.clone();
        if inner.index.get(id).is_none() && !inner.may_exist_unindexed() {
            return inner.miss();
        }
        blocking(&self.inner.pool, move || inner.open_blocking(id))
            .await
            .ok()
            .flatten()
    }

    /// `open` as the start of a request's use of the disk: refused with
    /// `PoolError::Busy` when the blocking pool's work queue is full (the
    /// request then gets a busy response instead of waiting).
    pub async fn try_open(&self, id: ObjectId) -> Result<Option<DiskObject>, PoolError> {
        let inner = self.inner.clone();
        if inner.index.get(id).is_none() && !inner.may_exist_unindexed() {
            return Ok(inner.miss());
        }
        match self.inner.pool.try_run(move || inner.open_blocking(id)).await {
            Ok(found) => Ok(found),
            Err(PoolError::Busy) => Err(PoolError::Busy),
            Err(PoolError::Failed) => Ok(None),
        }
    }

    /// `open` on the calling thread.
    pub fn open_blocking(&self, id: ObjectId) -> Option<DiskObject> {
        self.inner.open_blocking(id)
    }

    /// Starts writing an object to a tmp file; nothing is visible until
    /// `commit`, which replaces any object with the same id atomically.
    pub async fn writer(&self, id: ObjectId, meta: &StoredMeta) -> io::Result<DiskWriter> {
        let inner = self.inner.clone();
        let meta = meta.clone();
        let st = blocking(&self.inner.pool, move || inner.new_write_state(id, &meta)).await??;
        Ok(self.wrap_writer(id, st))
    }

    /// `writer` on the calling thread.
    pub fn writer_blocking(&self, id: ObjectId, meta: &StoredMeta) -> io::Result<DiskWriter> {
        let st = self.inner.new_write_state(id, meta)?;
        Ok(self.wrap_writer(id, st))
    }

    fn wrap_writer(&self, id: ObjectId, st: WriteState) -> DiskWriter {
        DiskWriter {
            id,
            state: Some(Box::new(st)),
            buf: Vec::new(),
            body_len: 0,
            max: self.inner.max_object,
            pool: self.inner.pool.clone(),
        }
    }

    /// Replaces a stored object's metadata (after revalidation) and expiry
    /// hint: writes a new file with the new meta and the old body (verified
    /// as it is copied) and renames it over the old one, so readers of the
    /// old file keep reading consistent bytes. Ok(false) if the object is
    /// absent, invalid, or was replaced meanwhile (the newer one wins);
    /// an error if its body fails the checksum (it is then removed).
    pub async fn update_meta(&self, id: ObjectId, meta: &StoredMeta, expires: u64) -> io::Result<bool> {
        let inner = self.inner.clone();
        let meta = meta.clone();
        blocking(&self.inner.pool, move || inner.update_meta_blocking(id, &meta, expires)).await?
    }

    /// `update_meta` on the calling thread.
    pub fn update_meta_blocking(&self, id: ObjectId, meta: &StoredMeta, expires: u64) -> io::Result<bool> {
        self.inner.update_meta_blocking(id, meta, expires)
    }

    /// Removes an object; true if there was one.
    pub async fn remove(&self, id: ObjectId) -> bool {
        let inner = self.inner.clone();
        blocking(&self.inner.pool, move || inner.remove_blocking(id))
            .await
            .unwrap_or(false)
    }

    /// `remove` on the calling thread.
    pub fn remove_blocking(&self, id: ObjectId) -> bool {
        self.inner.remove_blocking(id)
    }

    /// Whether an object is stored (the index; before the scan is done, the
    /// file system too).
    pub async fn contains(&self, id: ObjectId) -> bool {
        if self.inner.index.get(id).is_some() {
            return true;
        }
        if self.inner.scan_done() {
            return false;
        }
        let inner = self.inner.clone();
        blocking(&self.inner.pool, move || inner.contains_blocking(id))
            .await
            .unwrap_or(false)
    }

    /// `contains` on the calling thread.
    pub fn contains_blocking(&self, id: ObjectId) -> bool {
        self.inner.contains_blocking(id)
    }

    /// Records an access (a hit served from another tier, say): no I/O.
    pub fn touch(&self, id: ObjectId) -> bool {
        self.inner.index.touch(id, secs32(now_secs()))
    }

    /// The index entry of an object.
    pub fn entry(&self, id: ObjectId) -> Option<IndexEntry> {
        self.inner.index.get(id).map(IndexEntry::from)
    }

    /// Runs one GC pass down to the low watermark (on the blocking pool).
    pub async fn gc(&self) -> GcReport {
        let inner = self.inner.clone();
        let low = inner.budget.low;
        blocking(&self.inner.pool, move || inner.gc_pass(low, false, &mut |_| {}))
            .await
            .unwrap_or_default()
    }

    /// One GC pass on the calling thread: evicts until at most `target`
    /// bytes are used, calling `on_evict` for each object removed (with its
    /// key read from the file first when `read_keys`).
    pub fn gc_blocking(&self, target: u64, read_keys: bool, on_evict: &mut dyn FnMut(&Evicted)) -> GcReport {
        self.inner.gc_pass(target, read_keys, on_evict)
    }
}

/// An object opened for reading.
#[derive(Debug)]
pub struct DiskObject {
    /// Its id.
    pub id: ObjectId,
    /// Its metadata.
    pub meta: StoredMeta,
    /// Body length in bytes.
    pub body_len: u64,
    /// Expiry hint given at commit (unix seconds, 0 = unknown).
    pub expires: u64,
    /// File size on disk.
    pub file_len: u64,
    /// The body, streamed.
    pub body: BodyReader,
}

struct ReadState {
    file: File,
    off: u64,
    left: u64,
    sum: Option<Checksum>,
    trailer: Trailer,
    id: ObjectId,
    dev: u64,
    ino: u64,
    store: Weak<Inner>,
}

impl ReadState {
    fn fail(&mut self, why: &'static str, checksum: bool) -> io::Error {
        self.sum = None;
        if let Some(inner) = self.store.upgrade() {
            if checksum {
                inner.stats.checksum_failures.fetch_add(1, Ordering::Relaxed);
            }
            inner.remove_corrupt(self.id, self.dev, self.ino, why);
        }
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cached object {} is corrupt: {why}", self.id),
        )
    }

    fn next(&mut self) -> io::Result<Option<Bytes>> {
        if self.sum.is_none() {
            return Ok(None);
        }
        let n = self.left.min(READ_CHUNK as u64) as usize;
        let mut buf = vec![0u8; n];
        if n > 0 {
            if let Err(e) = self.file.read_exact_at(&mut buf, self.off) {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    return Err(self.fail("truncated while reading", false));
                }
                return Err(e);
            }
            if let Some(s) = self.sum.as_mut() {
                s.update(&buf);
            }
            self.off += n as u64;
            self.left -= n as u64;
        }
        if self.left == 0
            && let Some(sum) = self.sum.take()
            && sum.finish(self.trailer.body_len, self.trailer.expires) != self.trailer.checksum
        {
            return Err(self.fail("checksum mismatch", true));
        }
        if let Some(inner) = self.store.upgrade() {
            inner.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok((n > 0).then(|| Bytes::from(buf)))
    }
}

/// Streams an object's body in chunks of at most `READ_CHUNK` bytes,
/// verifying the checksum as the last chunk is read: on a mismatch that
/// read returns an `InvalidData` error instead of the last chunk (so the
/// caller can cut the client's connection) and the file is removed.
pub struct BodyReader {
    state: Option<Box<ReadState>>,
    remaining: u64,
    failed: Option<io::ErrorKind>,
    pool: BlockingPool,
}

impl std::fmt::Debug for BodyReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyReader")
            .field("remaining", &self.remaining)
            .finish()
    }
}

impl BodyReader {
    /// Body bytes not yet returned.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    fn settle(&mut self, st: Box<ReadState>, r: io::Result<Option<Bytes>>) -> io::Result<Option<Bytes>> {
        self.remaining = st.left;
        self.state = Some(st);
        if let Err(e) = &r {
            self.failed = Some(e.kind());
        }
        r
    }

    fn take(&mut self) -> io::Result<Box<ReadState>> {
        if let Some(kind) = self.failed {
            return Err(io::Error::new(kind, "cached object read failed"));
        }
        self.state
            .take()
            .ok_or_else(|| io::Error::other("cached object read was cancelled midway"))
    }

    /// The next chunk; Ok(None) at the end (after the checksum matched).
    pub async fn chunk(&mut self) -> io::Result<Option<Bytes>> {
        let mut st = self.take()?;
        let (st, r) = blocking(&self.pool, move || {
            let r = st.next();
            (st, r)
        })
        .await?;
        self.settle(st, r)
    }

    /// `chunk` on the calling thread.
    pub fn chunk_blocking(&mut self) -> io::Result<Option<Bytes>> {
        let mut st = self.take()?;
        let r = st.next();
        self.settle(st, r)
    }
}

struct WriteState {
    file: File,
    tmp: PathBuf,
    sum: Option<Checksum>,
    meta_len: u64,
    body_len: u64,
    key_ok: bool,
    store: Weak<Inner>,
    stats: Arc<DiskStats>,
    fsync: bool,
    done: bool,
}

impl WriteState {
    fn write_body(&mut self, data: &[u8]) -> io::Result<()> {
        self.file.write_all(data)?;
        if let Some(s) = self.sum.as_mut() {
            s.update(data);
        }
        self.body_len += data.len() as u64;
        Ok(())
    }

    /// Writes the trailer (and fsyncs); returns the file size.
    fn finish(&mut self, expires: u64) -> io::Result<u64> {
        let sum = self.sum.take().ok_or_else(|| io_other("writer already finished"))?;
        let trailer = Trailer {
            body_len: self.body_len,
            expires,
            checksum: sum.finish(self.body_len, expires),
        };
        self.file.write_all(&trailer.encode())?;
        if self.fsync {
            self.file.sync_all()?;
        }
        Ok(HEADER_LEN + self.meta_len + self.body_len + TRAILER_LEN)
    }

    fn commit(mut self, id: ObjectId, rest: &[u8], expires: u64) -> io::Result<()> {
        self.write_body(rest)?;
        let size = self.finish(expires)?;
        let inner = self.store.upgrade().ok_or_else(|| io_other("disk cache closed"))?;
        let entry = Entry {
            size,
            last_access: secs32(now_secs()),
            expires: secs32(expires),
            hits: 0,
            generation: inner.index.next_generation(),
            key_ok: self.key_ok,
        };
        inner.publish(id, &self.tmp, entry)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for WriteState {
    fn drop(&mut self) {
        if !self.done {
            self.stats.write_aborts.fetch_add(1, Ordering::Relaxed);
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes one object. Nothing is visible under the object's name until
/// `commit`; dropping the writer (or `abort`) deletes the tmp file. A
/// `write` error (including a body over `cache.max_object_size`) aborts it.
pub struct DiskWriter {
    id: ObjectId,
    state: Option<Box<WriteState>>,
    buf: Vec<u8>,
    body_len: u64,
    max: u64,
    pool: BlockingPool,
}

impl std::fmt::Debug for DiskWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskWriter")
            .field("id", &self.id)
            .field("body_len", &self.body_len)
            .finish()
    }
}

impl DiskWriter {
    /// Body bytes accepted so far.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// The tmp file being written.
    pub fn tmp_path(&self) -> Option<&Path> {
        self.state.as_ref().map(|s| s.tmp.as_path())
    }

    fn accept(&mut self, n: usize) -> io::Result<()> {
        if self.state.is_none() {
            return Err(io_other("disk cache writer aborted"));
        }
        if self.body_len + n as u64 > self.max {
            self.state = None;
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "object larger than cache.max_object_size",
            ));
        }
        self.body_len += n as u64;
        Ok(())
    }

    async fn write_out(&mut self, data: Option<Bytes>) -> io::Result<()> {
        let mut st = self.state.take().ok_or_else(|| io_other("disk cache writer aborted"))?;
        let mut buf = std::mem::take(&mut self.buf);
        let (st, buf, r) = blocking(&self.pool, move || {
            let r = match &data {
                Some(d) => st.write_body(&buf).and_then(|()| st.write_body(d)),
                None => st.write_body(&buf),
            };
            buf.clear();
            (st, buf, r)
        })
        .await?;
        r?;
        self.buf = buf;
        self.state = Some(st);
        Ok(())
    }

    /// Appends body bytes (buffered; written by the blocking pool in
    /// 256 KiB batches).
    pub async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.accept(data.len())?;
        self.buf.extend_from_slice(data);
        if self.buf.len() >= WRITE_FLUSH {
            self.write_out(None).await?;
        }
        Ok(())
    }

    /// Appends body bytes without copying large chunks.
    pub async fn write_bytes(&mut self, data: Bytes) -> io::Result<()> {
        if data.len() < WRITE_FLUSH {
            return self.write(&data).await;
        }
        self.accept(data.len())?;
        self.write_out(Some(data)).await
    }

    /// `write` on the calling thread.
    pub fn write_blocking(&mut self, data: &[u8]) -> io::Result<()> {
        self.accept(data.len())?;
        let st = self
            .state
            .as_mut()
            .ok_or_else(|| io_other("disk cache writer aborted"))?;
        let r = st.write_body(&self.buf).and_then(|()| st.write_body(data));
        self.buf.clear();
        if r.is_err() {
            self.state = None;
        }
        r
    }

    /// Finishes the object: trailer with `expires` (unix seconds, 0 =
    /// unknown; the GC evicts expired objects first), fsync if configured,
    /// rename into place (replacing any older version), index update.
    pub async fn commit(mut self, expires: u64) -> io::Result<()> {
        let st = self.state.take().ok_or_else(|| io_other("disk cache writer aborted"))?;
        let buf = std::mem::take(&mut self.buf);
        let id = self.id;
        blocking(&self.pool, move || st.commit(id, &buf, expires)).await?
    }

    /// `commit` on the calling thread.
    pub fn commit_blocking(mut self, expires: u64) -> io::Result<()> {
        let st = self.state.take().ok_or_else(|| io_other("disk cache writer aborted"))?;
        let buf = std::mem::take(&mut self.buf);
        st.commit(self.id, &buf, expires)
    }

    /// Drops the object being written (the tmp file is deleted).
    pub fn abort(mut self) {
        self.state = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Size;
    use http::{HeaderMap, StatusCode};

    fn cfg(dir: &Path) -> CacheConfig {
        CacheConfig {
            dir: dir.to_path_buf(),
            disk: Size(1 << 30),
            gc: GcMode::Scheduled,
            ..CacheConfig::default()
        }
    }

    fn meta(url: &str) -> StoredMeta {
        StoredMeta {
            key: url.to_string(),
            variant: vec![],
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            request_time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            response_time: UNIX_EPOCH + Duration::from_secs(1_700_000_001),
        }
    }

    fn tmp_files(dir: &Path) -> usize {
        fs::read_dir(dir.join("tmp")).map_or(0, |d| d.count())
    }

    #[test]
    fn blocking_round_trip_and_index_accounting() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let url = "http://example.com/a";
        let id = CacheKey::from_url(url, false).unwrap().id();
        let mut w = store.writer_blocking(id, &meta(url)).unwrap();
        w.write_blocking(b"hello ").unwrap();
        w.write_blocking(b"world").unwrap();
        assert_eq!(tmp_files(dir.path()), 1);
        assert!(!store.path_of(id).exists(), "not visible before commit");
        w.commit_blocking(123).unwrap();
        assert_eq!(tmp_files(dir.path()), 0);
        let size = fs::metadata(store.path_of(id)).unwrap().len();
        let e = store.entry(id).unwrap();
        assert_eq!((e.size, e.expires, e.key_ok), (size, 123, true));
        assert_eq!(store.stats().snapshot().objects, 1);
        assert_eq!(store.used(), size);
        let mut o = store.open_blocking(id).unwrap();
        assert_eq!(o.meta, meta(url));
        assert_eq!((o.body_len, o.expires), (11, 123));
        assert_eq!(
            o.body.chunk_blocking().unwrap().unwrap(),
            Bytes::from_static(b"hello world")
        );
        assert!(o.body.chunk_blocking().unwrap().is_none());
        assert_eq!(store.entry(id).unwrap().hits, 1);
        // A second object and a replacement.
        let id2 = ObjectId(42);
        let mut w = store.writer_blocking(id2, &meta(url)).unwrap();
        w.write_blocking(&[1; 1000]).unwrap();
        w.commit_blocking(0).unwrap();
        assert!(!store.entry(id2).unwrap().key_ok, "key does not hash to 42");
        let mut w = store.writer_blocking(id, &meta(url)).unwrap();
        w.write_blocking(b"x").unwrap();
        w.commit_blocking(0).unwrap();
        let total = fs::metadata(store.path_of(id)).unwrap().len() + fs::metadata(store.path_of(id2)).unwrap().len();
        assert_eq!((store.stats().snapshot().objects, store.used()), (2, total));
        assert!(store.remove_blocking(id));
        assert!(!store.remove_blocking(id));
        assert_eq!(
            (store.stats().snapshot().objects, store.used()),
            (1, fs::metadata(store.path_of(id2)).unwrap().len())
        );
        assert!(store.open_blocking(id).is_none());
    }

    #[test]
    fn a_shared_dir_finds_objects_another_process_stored_after_its_scan() {
        let dir = tempfile::tempdir().unwrap();
        let a = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let b = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let id = ObjectId(7);
        let mut w = a.writer_blocking(id, &meta("http://h/")).unwrap();
        w.write_blocking(b"body").unwrap();
        w.commit_blocking(0).unwrap();
        // Not in b's index, and b's scan is over: b does not look.
        assert!(b.open_blocking(id).is_none());
        b.set_shared_dir(true);
        let found = b.open_blocking(id).expect("found on disk");
        assert_eq!(found.body_len, 4);
        assert_eq!(found.meta.key, "http://h/");
        // Now counted in b's index (its GC budget).
        assert_eq!(b.stats().snapshot().objects, 1);
        // Removed by a: b forgets it.
        fs::remove_file(a.path_of(id)).unwrap();
        assert!(b.open_blocking(id).is_none());
        assert_eq!(b.stats().snapshot().objects, 0);
    }

    #[test]
    fn abort_and_drop_remove_the_tmp_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let w = store.writer_blocking(ObjectId(1), &meta("http://h/")).unwrap();
        assert_eq!(tmp_files(dir.path()), 1);
        w.abort();
        let mut w = store.writer_blocking(ObjectId(1), &meta("http://h/")).unwrap();
        w.write_blocking(b"abc").unwrap();
        drop(w);
        assert_eq!(tmp_files(dir.path()), 0);
        assert_eq!(store.stats().snapshot().write_aborts, 2);
        assert!(!store.path_of(ObjectId(1)).exists());
    }

    #[test]
    fn max_object_size_aborts() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path());
        c.max_object_size = Size(10);
        let store = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let mut w = store.writer_blocking(ObjectId(1), &meta("http://h/")).unwrap();
        w.write_blocking(&[0; 10]).unwrap();
        assert!(w.write_blocking(&[0]).is_err());
        assert!(w.commit_blocking(0).is_err());
        assert_eq!(tmp_files(dir.path()), 0);
    }

    #[test]
    fn stale_tmp_files_are_cleaned_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let tmp = dir.path().join("tmp");
        let w = store.writer_blocking(ObjectId(7), &meta("http://h/")).unwrap();
        // Ours, live instance: kept by another store's scan.
        std::mem::forget(w);
        // A dead process's (pid beyond pid_max), garbage names.
        fs::write(tmp.join(format!("{}.999999999.1.0", ObjectId(8).hex())), b"PORTICO2").unwrap();
        fs::write(tmp.join("junk"), b"x").unwrap();
        // A live other process (pid 1) with a fresh file: kept.
        fs::write(tmp.join(format!("{}.1.1.0", ObjectId(9).hex())), b"PORTICO2").unwrap();
        let other = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let mut left: Vec<String> = fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left.len(), 2, "{left:?}");
        assert_eq!(other.stats().snapshot().tmp_removed, 2);
        // Once the first store is gone, its forgotten writer's file goes too.
        drop(store);
        drop(other);
        let third = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let left: Vec<_> = fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(third.stats().snapshot().tmp_removed, 1);
    }

    #[test]
    fn scan_rebuilds_index_and_removes_invalid_files() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let store = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let mut total = 0;
        for i in 0..20u128 {
            let url = format!("http://h/{i}");
            let id = CacheKey::from_url(&url, false).unwrap().id();
            let mut w = store.writer_blocking(id, &meta(&url)).unwrap();
            w.write_blocking(&vec![i as u8; i as usize * 100]).unwrap();
            w.commit_blocking(5).unwrap();
            total += fs::metadata(store.path_of(id)).unwrap().len();
        }
        drop(store);
        // An invalid file under a valid name, and a foreign file (kept).
        let bad = Layout::new(dir.path(), c.levels).path_of(ObjectId(5));
        fs::create_dir_all(bad.parent().unwrap()).unwrap();
        fs::write(&bad, b"not an object at all, really not").unwrap();
        fs::write(bad.parent().unwrap().join("README"), b"x").unwrap();
        let store = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let s = store.stats().snapshot();
        assert_eq!((s.objects, s.bytes), (20, total));
        assert!(s.scan.done);
        assert_eq!(s.scan.scanned, 21);
        assert_eq!(s.corrupt_removed, 1);
        assert!(!bad.exists());
        assert!(bad.parent().unwrap().join("README").exists());
        let e = store
            .entry(CacheKey::from_url("http://h/3", false).unwrap().id())
            .unwrap();
        assert_eq!((e.expires, e.hits, e.key_ok), (5, 0, true));
    }

    #[test]
    fn objects_of_the_older_format_are_removed_not_served() {
        // A version 1 file is byte for byte a valid object but for its
        // magic; its key may be one a reverse client chose.
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let store = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let url = "http://localhost:19001/planted";
        let id = CacheKey::from_url(url, false).unwrap().id();
        let mut w = store.writer_blocking(id, &meta(url)).unwrap();
        w.write_blocking(b"reverse origin's page").unwrap();
        w.commit_blocking(0).unwrap();
        let path = store.path_of(id);
        drop(store);
        let mut bytes = fs::read(&path).unwrap();
        bytes[..8].copy_from_slice(b"PORTICO1");
        fs::write(&path, bytes).unwrap();
        let store = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let s = store.stats().snapshot();
        assert_eq!((s.objects, s.corrupt_removed), (0, 1));
        assert!(!path.exists());
    }

    #[test]
    fn scan_moves_objects_when_levels_change() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path());
        c.levels = [4, 4];
        let store = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let ids: Vec<ObjectId> = (0..30)
            .map(|i| CacheKey::from_url(&format!("http://h/{i}"), false).unwrap().id())
            .collect();
        for (i, id) in ids.iter().enumerate() {
            let mut w = store.writer_blocking(*id, &meta(&format!("http://h/{i}"))).unwrap();
            w.write_blocking(b"body").unwrap();
            w.commit_blocking(0).unwrap();
        }
        drop(store);
        c.levels = [16, 256];
        // An offline tool leaves them alone...
        let offline = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let s = offline.stats().snapshot();
        assert_eq!(s.objects + offline.stats().scan_misplaced.load(Ordering::Relaxed), 30);
        assert!(s.objects < 10, "most ids move with the new levels");
        drop(offline);
        // ... a server moves them.
        let store = DiskStore::start(&c).unwrap();
        assert!(store.wait_scan_blocking(Duration::from_secs(10)));
        assert_eq!(store.stats().snapshot().objects, 30);
        for id in &ids {
            assert!(store.path_of(*id).exists());
            assert!(store.open_blocking(*id).is_some());
        }
    }
}
