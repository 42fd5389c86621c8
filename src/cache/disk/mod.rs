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
//! - **Read path** (`read`): `open` checks the envelope and metadata and
//!   streams the body (`BodyReader`); **write path** (`write`): a
//!   `DiskWriter` fills a tmp file that `commit` publishes;
//!   **statistics** (`stats`): the counters and the scan's progress.
//!   This module holds the store itself: start, locks, remove, index, GC.
//!
//! All file I/O is blocking; the async methods run it on the blocking pool
//! (`crate::blocking`, the Sun Java System Web Proxy Server 4's NativePool), never on the
//! async workers, with one exception: a held-open file (`held`) is read
//! on the worker with `preadv2(RWF_NOWAIT)`, which never waits for the disk
//! (it fails instead, and the read goes to the pool), or sent with
//! `sendfile` once its checksum has matched (its pages were just read).
//! Methods named `*_blocking` do it on the calling thread (CLI, tests).
//!
//! Concurrency: every change of an object's file and index entry (commit,
//! remove, eviction, the scan indexing a file) holds that id's stripe of
//! 1024 mutexes, so a change and the index agree. Readers take no lock: they
//! open the path and keep reading the file they opened, whatever is renamed
//! over it or removed. Other processes (`portico cache gc|purge` while a
//! server runs) may remove files under the server: that is just a miss, and
//! the stale index entry is dropped when found.

pub(crate) mod format;
mod gc;
mod held;
pub(crate) mod index;
mod popularity;
mod read;
mod scan;
mod stats;
mod write;

pub use format::{Corrupt, Envelope, Layout, Trailer};
pub use gc::{Evicted, GcReport};
pub use held::{HELD_VALID_SECS, OpenObject};
pub use read::{BodyReader, DiskObject};
pub use scan::{ObjectFile, for_each_object_file};
pub use stats::{DiskStats, DiskStatsSnapshot, ScanProgress};
pub use write::{DiskWriter, WRITE_FLUSH, WriteTap, files_being_written};

use crate::blocking::{BlockingPool, PoolError};
use crate::cache::key::{CacheKey, ObjectId};
use crate::cache::object::StoredMeta;
use crate::config::{CacheConfig, FileIo, Fsync, GcMode};
use index::{Entry, Index};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Body bytes per chunk returned by `BodyReader::chunk`.
pub const READ_CHUNK: usize = 64 << 10;
/// Files held open when `cache.open_files` was left at 0 and not sized
/// from the open-files limit (library use; a server sizes it).
const DEFAULT_OPEN_FILES: usize = 1024;
const PATH_LOCKS: usize = 1024;

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
    /// Body bytes accepted by writers not yet committed or aborted: their
    /// tmp files, which the GC does not see. Held to `budget.disk`
    /// (`DiskWriter`), so objects being written never take more than
    /// `cache.disk` on top of the stored ones.
    writing: Arc<AtomicU64>,
    index: Index,
    stats: Arc<DiskStats>,
    locks: Box<[Mutex<()>]>,
    instance: u64,
    tmp_counter: AtomicU64,
    gc_signal: Arc<GcSignal>,
    gc_running: Mutex<()>,
    scan_notify: tokio::sync::Notify,
    /// Where file work runs (`cache.file_io`), and the pool the GC's
    /// passes run on whatever that says.
    jobs: FileJobs,
    /// Other server processes write to the same directory (multi-process
    /// mode): an id missing from our index may still be on disk.
    shared_dir: AtomicBool,
    /// Files kept open between hits (`cache.open_files`); None: none.
    held: Option<Arc<held::HeldFiles>>,
    /// Prefix purges this store has been told of
    /// ([`DiskStore::forget_held_under`]): a file opened before the latest
    /// (its `OpenObject::purges` older) may be under that prefix and is
    /// neither held nor taken into the memory tier.
    prefix_purges: AtomicU64,
    /// The directory is on tmpfs or ramfs: reads never wait for a disk.
    memory_fs: bool,
    /// Where the popularity sketch is kept between runs, once a server
    /// asked for it ([`DiskStore::keep_popularity`]).
    popularity_file: std::sync::OnceLock<PathBuf>,
    /// The sketch's lookups when it was last saved or restored.
    popularity_saved: AtomicU64,
    /// Held while the sketch is saved: the GC thread's periodic save and
    /// the one at shutdown share one tmp file name.
    popularity_saving: Mutex<()>,
}

/// How often the GC thread saves the popularity sketch (when lookups were
/// counted since the last save), besides the save at shutdown: what a
/// crash can lose.
const POPULARITY_SAVE_EVERY: Duration = Duration::from_secs(300);

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

/// Opens a file of the cache directory for reading only if it is a regular
/// file: a FIFO or device put there (by whoever can write to the
/// directory) is refused instead of blocking the open or the reads
/// (`O_NONBLOCK` has no effect on a regular file's reads). For the offline
/// tools and the files read whole at start-up.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    Ok(file)
}

/// Opens a cache file to read it, with `O_NOATIME`: Portico keeps its own
/// access times in the index, and without the flag every read (a held
/// file's `sendfile` on each hit included) has the kernel check the file's
/// access time, and write the inode where the mount updates it (`relatime`:
/// on the first read after each write, and daily; a start-up scan of a
/// million files is a million inode writes). Only the file's owner may ask
/// for it: a file of another user (EPERM) is opened without it.
fn open_read(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(path)
    {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => File::open(path),
        opened => opened,
    }
}

/// `open_read` for a worker thread (`cache.file_io` inline): opened
/// `O_NONBLOCK`, so that what is not a regular file (a FIFO put in the
/// directory) cannot hold the thread and its connections (the envelope
/// check then refuses it), and the flag cleared again, so the file is read
/// and sent as `open_read`'s are.
fn open_read_nonblocking(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags: libc::c_int| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags | libc::O_NONBLOCK)
            .open(path)
            .and_then(|f| clear_nonblock(&f, flags).map(|()| f))
    };
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        opened => opened,
    }
}

/// Sets the status flags of a file opened with `O_NONBLOCK` (to open
/// without waiting) to `flags`, those it was opened with less that one, so
/// that it is read and sent as `open_read`'s files are: `sendfile` from a
/// descriptor marked non-blocking would not wait for a full socket the way
/// it does now. One `fcntl`: the flags are known, not read back.
fn clear_nonblock(file: &File, flags: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor `file` owns; no pointer is passed.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `open_read` that never waits for the disk: `openat2` with
/// `RESOLVE_CACHED` resolves the path from the kernel's dentry cache alone
/// and fails with `EAGAIN` where it would have to read a directory from the
/// device (Linux 5.12 and later). None: it would have waited, or it failed
/// in a way the blocking open reports and handles (a missing file, no
/// descriptor left, a file of another user, an older kernel): open on the
/// blocking pool instead.
fn open_read_cached(path: &Path) -> Option<File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    /// `struct open_how` of linux/openat2.h.
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // O_NONBLOCK: opening what is not a regular file (a FIFO put in the
    // directory) must not wait either; the envelope check refuses it.
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOATIME | libc::O_NONBLOCK) as u64,
        mode: 0,
        resolve: libc::RESOLVE_CACHED,
    };
    // SAFETY: openat2 reads the NUL-terminated path and `how`, whose size is
    // passed with it; both outlive the call. It writes nothing of ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    clear_nonblock(&file, libc::O_NOATIME).ok()?;
    Some(file)
}

impl Inner {
    fn save_popularity(&self) -> io::Result<bool> {
        let (Some(path), Some(p)) = (self.popularity_file.get(), self.index.popularity()) else {
            return Ok(false);
        };
        let _saving = self.popularity_saving.lock().unwrap_or_else(|e| e.into_inner());
        let seen = p.seen();
        if seen == self.popularity_saved.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let tmp = self.layout.tmp_dir().join(format!("popularity.{}", std::process::id()));
        let written = (|| {
            let mut f = File::create(&tmp)?;
            io::Write::write_all(&mut f, &p.to_file_bytes())?;
            if self.fsync {
                f.sync_all()?;
            }
            fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io::Error::new(
                e.kind(),
                format!("cannot write {}: {}", path.display(), crate::util::io_cause(&e)),
            ));
        }
        self.popularity_saved.store(seen, Ordering::Relaxed);
        Ok(true)
    }

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
        // Whichever file is there now, the held one is not to be trusted.
        if let Some(h) = &self.held
            && h.get(id).is_some_and(|o| o.dev == dev && o.ino == ino)
        {
            h.remove(id);
        }
    }

    fn remove_blocking(&self, id: ObjectId) -> bool {
        let path = self.layout.path_of(id);
        let _guard = self.lock(id);
        self.forget_held(id);
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
}

async fn blocking<T: Send + 'static>(pool: &BlockingPool, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    pool.run(f).await.map_err(io_other)
}

/// Where the disk tier's file work runs (`cache.file_io`): on the blocking
/// pool, or on the calling worker thread. On tmpfs an open, a write or a
/// rename is memory work that never waits for a device, and doing it here
/// costs less than handing it to a pool thread and waking the worker again
/// (bench/README.md: disk-tier hits that open their file, +36%); on a device
/// it may wait, and every connection of the worker would wait with it.
#[derive(Clone, Debug)]
pub(crate) struct FileJobs {
    pool: BlockingPool,
    /// Run on the calling thread, each job counted here; None: on the pool.
    inline: Option<Arc<DiskStats>>,
}

impl FileJobs {
    /// Runs `f` where file work runs.
    async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        match &self.inline {
            Some(stats) => {
                stats.inline_jobs.fetch_add(1, Ordering::Relaxed);
                Ok(f())
            }
            None => blocking(&self.pool, f).await,
        }
    }

    /// `run` for work that starts a request's use of the disk: on the pool,
    /// refused with `PoolError::Busy` when its queue is full; inline, never
    /// refused.
    async fn try_run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T, PoolError> {
        match &self.inline {
            Some(stats) => {
                stats.inline_jobs.fetch_add(1, Ordering::Relaxed);
                Ok(f())
            }
            None => self.pool.try_run(f).await,
        }
    }
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

/// The cache directory's block size (`st_blksize`, 4 KiB on ext4, XFS and
/// tmpfs): what the budget charges an object for each started block. Kept
/// between 512 bytes and 1 MiB whatever the file system says; 4 KiB if it
/// cannot be read.
fn allocation_unit(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(dir)
        .map(|m| m.blksize())
        .unwrap_or(4096)
        .clamp(512, 1 << 20)
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
        // Files in `tmp/` are written, renamed and removed by name: through
        // a link there, the stale-file cleaning (run as root by `portico
        // cache gc` from cron) would remove files wherever it points.
        if fs::symlink_metadata(layout.tmp_dir()).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symbolic link: the cache's tmp directory must be a directory of its own",
                    layout.tmp_dir().display()
                ),
            ));
        }
        let stats = Arc::new(DiskStats::default());
        let memory_fs = held::on_memory_fs(&cfg.dir);
        let inline = match cfg.file_io {
            FileIo::Auto => memory_fs,
            FileIo::Pool => false,
            FileIo::Inline => true,
        };
        let jobs = FileJobs {
            pool,
            inline: inline.then(|| stats.clone()),
        };
        let instance = NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed);
        LIVE_INSTANCES.lock().unwrap_or_else(|e| e.into_inner()).push(instance);
        let inner = Inner {
            layout,
            budget: Budget::new(cfg.disk.bytes(), cfg.watermarks),
            fsync: cfg.fsync == Fsync::Always,
            max_object: cfg.max_object_size.bytes(),
            writing: Arc::new(AtomicU64::new(0)),
            index: Index::new(
                stats.clone(),
                allocation_unit(&cfg.dir),
                cfg.replacement,
                cfg.disk.bytes(),
            ),
            stats,
            locks: (0..PATH_LOCKS).map(|_| Mutex::new(())).collect(),
            instance,
            tmp_counter: AtomicU64::new(0),
            gc_signal: Arc::new(GcSignal::default()),
            gc_running: Mutex::new(()),
            scan_notify: tokio::sync::Notify::new(),
            jobs,
            shared_dir: AtomicBool::new(false),
            memory_fs,
            held: held::HeldFiles::new(if cfg.open_files == 0 {
                DEFAULT_OPEN_FILES
            } else {
                cfg.open_files
            }),
            prefix_purges: AtomicU64::new(0),
            popularity_file: std::sync::OnceLock::new(),
            popularity_saved: AtomicU64::new(0),
            popularity_saving: Mutex::new(()),
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
        if store.file_io_inline() {
            let why = match cfg.file_io {
                FileIo::Auto => "auto: the directory is on tmpfs or ramfs",
                _ => "inline",
            };
            tracing::info!("disk cache: file work runs on the worker threads (cache.file_io = {why})");
        }
        let weak = Arc::downgrade(&store.inner);
        std::thread::Builder::new()
            .name("portico-disk-scan".into())
            .spawn(move || scan::run(weak, true, &mut |_| {}))?;
        if cfg.gc == GcMode::Auto {
            gc::spawn(Arc::downgrade(&store.inner), store.inner.gc_signal.clone())?;
        }
        Ok(store)
    }

    /// Whether file work runs on the calling worker thread (`cache.file_io`
    /// resolved) rather than the blocking pool.
    pub fn file_io_inline(&self) -> bool {
        self.inner.jobs.inline.is_some()
    }

    /// Tells the store that other server processes use the same directory
    /// (`server.processes > 1`): a lookup then checks the file even when
    /// the id is not in this process's index (objects they stored after our
    /// start-up scan), and indexes what it finds. Costs a failed `open` on
    /// the blocking pool per disk miss.
    pub fn set_shared_dir(&self, shared: bool) {
        self.inner.shared_dir.store(shared, Ordering::Relaxed);
    }

    /// Keeps the popularity sketch (`cache.replacement = "frequency"`) in
    /// the directory between runs: in `popularity`, or `popularity.I` for
    /// worker I of a multi-process server (each counts its own share of
    /// the lookups). Restores it now if that file is there and fits; from
    /// now on the GC thread saves it every five minutes when lookups were
    /// counted, and [`DiskStore::save_popularity`] at shutdown. A file that
    /// does not fit is named in a warning and the sketch starts empty (the
    /// next save replaces it); a server only, never `portico cache`.
    pub fn keep_popularity(&self, worker: Option<usize>) {
        let Some(p) = self.inner.index.popularity() else {
            return;
        };
        let name = match worker {
            Some(i) => format!("popularity.{i}"),
            None => "popularity".to_string(),
        };
        let path = self.inner.layout.root().join(name);
        // Never more than the largest sketch's file into memory, whatever
        // was put there under that name.
        let read = open_regular(&path).and_then(|f| {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut io::Read::take(f, popularity::MAX_FILE_LEN + 1), &mut bytes)?;
            Ok(bytes)
        });
        match read {
            Ok(bytes) if bytes.len() as u64 > popularity::MAX_FILE_LEN => tracing::warn!(
                "disk cache: {} not restored: damaged (larger than any popularity file); the popularity sketch starts empty",
                path.display()
            ),
            Ok(bytes) => match p.restore(&bytes) {
                Ok(seen) => {
                    self.inner.popularity_saved.store(seen, Ordering::Relaxed);
                    tracing::info!(
                        "disk cache: popularity of {seen} lookups restored from {}",
                        path.display()
                    );
                }
                Err(e @ (popularity::RestoreError::OtherShape { .. } | popularity::RestoreError::EarlierLayout)) => {
                    tracing::info!("disk cache: {} not restored: {e}; counting anew", path.display());
                }
                Err(e) => tracing::warn!(
                    "disk cache: {} not restored: {e}; the popularity sketch starts empty",
                    path.display()
                ),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                "disk cache: cannot read {}: {}; the popularity sketch starts empty",
                path.display(),
                crate::util::io_cause(&e)
            ),
        }
        let _ = self.inner.popularity_file.set(path);
    }

    /// Writes the popularity sketch to its file now (tmp file, then
    /// rename: a reader never sees half of one), if it is kept
    /// ([`DiskStore::keep_popularity`]) and lookups were counted since it
    /// was last saved or restored. Ok(false): nothing to write.
    pub fn save_popularity(&self) -> io::Result<bool> {
        self.inner.save_popularity()
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

    /// Bytes used by indexed objects: each charged its whole blocks.
    pub fn used(&self) -> u64 {
        self.inner.stats.bytes.load(Ordering::Relaxed)
    }

    /// What the budget charges a file of `size` bytes: its size rounded
    /// up to the cache directory's block size.
    pub fn charged(&self, size: u64) -> u64 {
        self.inner.index.charged(size)
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

    /// Removes an object; true if there was one.
    pub async fn remove(&self, id: ObjectId) -> bool {
        let inner = self.inner.clone();
        self.inner
            .jobs
            .run(move || inner.remove_blocking(id))
            .await
            .unwrap_or(false)
    }

    /// `remove` on the calling thread.
    pub fn remove_blocking(&self, id: ObjectId) -> bool {
        self.inner.remove_blocking(id)
    }

    /// Forgets `id`, which another worker process removed
    /// (`cache::told`): its held file is closed (one is used for up to
    /// `HELD_VALID_SECS` without a look at its path) and its index entry
    /// dropped, so that a read of the old file still under way here is
    /// neither held nor copied into the memory tier (both check the
    /// entry's generation). The path is left alone: it may already name a
    /// newer version, which the next open finds.
    pub fn forget_removed(&self, id: ObjectId) {
        let _guard = self.inner.lock(id);
        self.inner.forget_held(id);
        self.inner.index.remove(id);
    }

    /// Closes the held files of the objects whose URL starts with `prefix`
    /// (a prefix purge: their paths may have been removed, and a held file
    /// is used without a look at its path). A file opened before this and
    /// not held then (a read under way) is never held nor promoted to the
    /// memory tier afterwards ([`DiskStore::is_current`]): it may be under
    /// the prefix. The held files kept are not, and stay current.
    pub fn forget_held_under(&self, prefix: &str) {
        let now = self.inner.prefix_purges.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(h) = &self.inner.held {
            h.forget_under(prefix, now);
        }
    }

    /// Closes every held file: this process lost track of what the others
    /// removed (`cache::told`).
    pub fn forget_held_files(&self) {
        if let Some(h) = &self.inner.held {
            h.clear();
        }
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
        self.inner
            .jobs
            .run(move || inner.contains_blocking(id))
            .await
            .unwrap_or(false)
    }

    /// `contains` on the calling thread.
    pub fn contains_blocking(&self, id: ObjectId) -> bool {
        self.inner.contains_blocking(id)
    }

    /// A held-open file of `id` whose checksum has matched and whose path
    /// was checked recently: a hit served from it needs no system call but
    /// the body's. Counts as an access (`touch`). None: use `open`.
    pub fn held(&self, id: ObjectId) -> Option<Arc<OpenObject>> {
        let obj = self.inner.held_fresh(id)?;
        let s = &self.inner.stats;
        s.open_file_hits.fetch_add(1, Ordering::Relaxed);
        s.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.index.touch(id, secs32(now_secs()));
        Some(obj)
    }

    /// The held, checksummed file of `id`, as [`DiskStore::held`] but
    /// neither counted as a read nor recorded as an access: for a hit the
    /// memory tier serves, which may send the body from this file
    /// (the bytes are counted when sent, `OpenObject::count_sent`).
    pub fn held_quiet(&self, id: ObjectId) -> Option<Arc<OpenObject>> {
        self.inner.held_fresh(id)
    }

    /// Files held open now (at most `cache.open_files`).
    pub fn held_files(&self) -> usize {
        self.inner.held_count()
    }

    /// The most files held open: `cache.open_files`, or fewer while the
    /// process runs out of descriptors (each time, a quarter of the held
    /// files are closed; the limit grows back a minute later).
    pub fn held_limit(&self) -> usize {
        self.inner.held_capacity()
    }

    /// Counts a lookup of `id`, found in some tier or not, for
    /// `cache.replacement = "frequency"` (nothing otherwise): no I/O, no lock.
    pub fn asked(&self, id: ObjectId) {
        self.inner.index.asked(id);
    }

    /// Records an access (a hit served from another tier, say): no I/O.
    pub fn touch(&self, id: ObjectId) -> bool {
        self.inner.index.touch(id, secs32(now_secs()))
    }

    /// Whether `obj` is still the indexed version of its object: a store
    /// (or eviction) since it was opened changed the index. An object not
    /// indexed when it was opened (the start-up scan still running) counts
    /// as current.
    pub fn is_current(&self, obj: &OpenObject) -> bool {
        if obj.purges.load(Ordering::Acquire) != self.inner.prefix_purges.load(Ordering::Acquire) {
            return false;
        }
        obj.generation == 0
            || self
                .inner
                .index
                .get(obj.id)
                .is_some_and(|e| e.generation == obj.generation)
    }

    /// The index entry of an object.
    pub fn entry(&self, id: ObjectId) -> Option<IndexEntry> {
        self.inner.index.get(id).map(IndexEntry::from)
    }

    /// Runs one GC pass down to the low watermark (on the blocking pool).
    pub async fn gc(&self) -> GcReport {
        let inner = self.inner.clone();
        let low = inner.budget.low;
        blocking(&self.inner.jobs.pool, move || inner.gc_pass(low, false, &mut |_| {}))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Size;
    use bytes::Bytes;
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
            origin: None,
            derived: Default::default(),
        }
    }

    fn tmp_files(dir: &Path) -> usize {
        fs::read_dir(dir.join("tmp")).map_or(0, |d| d.count())
    }

    #[test]
    fn an_open_file_is_current_until_its_object_is_stored_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let url = "http://example.com/versions";
        let id = CacheKey::from_url(url, false).unwrap().id();
        let put = |body: &[u8]| {
            let mut w = store.writer_blocking(id, &meta(url)).unwrap();
            w.write_blocking(body).unwrap();
            w.commit_blocking(0).unwrap();
        };
        put(b"one");
        let old = store.open_blocking(id).expect("stored").file;
        assert!(store.is_current(&old));
        put(b"two");
        assert!(!store.is_current(&old), "a newer version was stored");
        assert!(store.is_current(&store.open_blocking(id).expect("stored").file));
    }

    #[test]
    fn a_file_opened_before_a_prefix_purge_is_neither_promoted_nor_held_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let put = |url: &str| {
            let id = CacheKey::from_url(url, false).unwrap().id();
            let mut w = store.writer_blocking(id, &meta(url)).unwrap();
            w.write_blocking(b"body").unwrap();
            w.commit_blocking(0).unwrap();
            id
        };
        let under = put("http://example.com/docs/a");
        let other = put("http://example.com/other");
        let read_before = store.open_blocking(under).expect("stored").file;
        let held = store.open_blocking(other).expect("stored").file;
        let held_by_store = store.inner.held.as_ref().is_some_and(|h| h.get(other).is_some());
        assert!(held_by_store, "a file opened is held");
        store.forget_held_under("http://example.com/docs/");
        // A read under way as the purge came may be under the prefix.
        assert!(!store.is_current(&read_before));
        let h = store.inner.held.as_ref().expect("held files");
        assert!(h.get(under).is_none(), "the held file under the prefix is closed");
        // A held file the purge kept was not under it.
        assert!(store.is_current(&held));
        // Opened after the purge: current again.
        assert!(store.is_current(&store.open_blocking(under).expect("stored").file));
    }

    #[tokio::test]
    async fn a_tap_reads_the_body_as_it_is_written_and_after_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let url = "http://example.com/tapped";
        let id = CacheKey::from_url(url, false).unwrap().id();
        let mut w = store.writer_blocking(id, &meta(url)).unwrap();
        let tap = w.tap().expect("the file exists");
        assert_eq!(w.written(), 0);
        w.write_blocking(b"hello ").unwrap();
        assert_eq!(w.written(), 6);
        assert_eq!(tap.read(0, 6).await.unwrap(), Bytes::from_static(b"hello "));
        w.write_blocking(b"world").unwrap();
        assert_eq!(tap.read(6, 5).await.unwrap(), Bytes::from_static(b"world"));
        w.commit_blocking(0).unwrap();
        // Renamed into place: the same file, still readable through the tap.
        assert_eq!(tap.read(0, 11).await.unwrap(), Bytes::from_static(b"hello world"));
        assert!(tap.read(0, 12 + 32 + 1_000).await.is_err(), "past the file's end");
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
        assert_eq!(store.used(), store.charged(size));
        let mut o = store.open_blocking(id).unwrap();
        assert_eq!(*o.meta, meta(url));
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
        let total = store.charged(fs::metadata(store.path_of(id)).unwrap().len())
            + store.charged(fs::metadata(store.path_of(id2)).unwrap().len());
        assert_eq!((store.stats().snapshot().objects, store.used()), (2, total));
        assert!(store.remove_blocking(id));
        assert!(!store.remove_blocking(id));
        assert_eq!(
            (store.stats().snapshot().objects, store.used()),
            (1, store.charged(fs::metadata(store.path_of(id2)).unwrap().len()))
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

    fn read_whole(store: &DiskStore, id: ObjectId) -> Vec<u8> {
        let mut o = store.open_blocking(id).expect("stored");
        let mut out = Vec::new();
        while let Some(c) = o.body.chunk_blocking().unwrap() {
            out.extend_from_slice(&c);
        }
        out
    }

    /// Makes `id`'s held file in `store` look last checked long ago.
    fn age_held(store: &DiskStore, id: ObjectId) {
        let held = store.inner.held.as_ref().unwrap().get(id).unwrap();
        held.checked.store(0, Ordering::Relaxed);
    }

    #[test]
    fn held_files_cut_back_for_want_of_descriptors_grow_back_a_minute_later() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::start_offline(
            &CacheConfig {
                open_files: 8,
                ..cfg(dir.path())
            },
            &mut |_| {},
        )
        .unwrap();
        let ids: Vec<ObjectId> = (1..=12).map(ObjectId).collect();
        for &id in &ids {
            let mut w = store.writer_blocking(id, &meta("http://h/")).unwrap();
            w.write_blocking(b"body").unwrap();
            w.commit_blocking(0).unwrap();
            read_whole(&store, id);
        }
        assert_eq!((store.held_files(), store.held_limit()), (8, 8));
        let held = store.inner.held.as_ref().unwrap();
        assert_eq!(held.shrink(), Some(6), "a quarter closed");
        assert_eq!(store.held_limit(), 6);
        // Within the minute, a full set takes no more.
        for &id in &ids {
            read_whole(&store, id);
        }
        assert_eq!(store.held_limit(), 6);
        // A minute on, the next file to hold finds room made: a quarter of
        // open_files (2) at a time, up to it.
        let minute_ago = now_secs() - held::REGROW_AFTER_SECS;
        held.shrunk_at.store(minute_ago, Ordering::Relaxed);
        for &id in &ids {
            read_whole(&store, id);
        }
        assert_eq!(store.held_limit(), 8);
        assert_eq!(held.shrink(), Some(6));
        held.shrunk_at.store(minute_ago, Ordering::Relaxed);
        for &id in &ids {
            read_whole(&store, id);
        }
        assert_eq!(store.held_limit(), 8, "never past open_files");
    }

    #[test]
    fn a_held_file_replaced_by_another_process_is_noticed_after_its_validity() {
        let dir = tempfile::tempdir().unwrap();
        let a = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let b = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        b.set_shared_dir(true);
        let id = ObjectId(9);
        let put = |body: &[u8]| {
            let mut w = a.writer_blocking(id, &meta("http://h/")).unwrap();
            w.write_blocking(body).unwrap();
            w.commit_blocking(0).unwrap();
        };
        put(b"version one");
        // The first open indexes it (stored by another process after b's
        // scan); the second, of an indexed generation, holds it.
        assert_eq!(read_whole(&b, id), b"version one");
        assert!(b.held(id).is_none());
        assert_eq!(read_whole(&b, id), b"version one");
        assert!(b.held(id).is_some());
        // Past the validity, the path still names the held file: kept,
        // without opening it again.
        age_held(&b, id);
        assert!(b.held(id).is_none(), "not used unchecked");
        let misses = b.stats().snapshot().open_file_misses;
        assert_eq!(read_whole(&b, id), b"version one");
        assert_eq!(b.stats().snapshot().open_file_misses, misses);
        assert!(b.held(id).is_some());
        // Another process renames a new version over it: b keeps serving
        // what it holds until the validity ends, then the new version,
        // checksummed (b's index cannot tell it is new: this one is
        // damaged, and b notices).
        put(b"version two!");
        let path = a.path_of(id);
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() - 32 - 3;
        bytes[at] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(b.held(id).unwrap().body_len, 11);
        age_held(&b, id);
        let mut o = b.open_blocking(id).expect("the new file opens");
        assert_eq!(o.body_len, 12);
        assert!(o.body.chunk_blocking().is_err(), "a damaged new version is caught");
        assert_eq!(b.stats().snapshot().open_file_misses, misses + 1);
        assert_eq!(b.stats().snapshot().checksum_failures, 1);
        assert!(b.held(id).is_none());
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
    fn objects_being_written_are_held_to_cache_disk_and_give_it_back_when_done() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg(dir.path());
        c.disk = Size(100);
        let store = DiskStore::start_offline(&c, &mut |_| {}).unwrap();
        let mut a = store.writer_blocking(ObjectId(1), &meta("http://h/a")).unwrap();
        let mut b = store.writer_blocking(ObjectId(2), &meta("http://h/b")).unwrap();
        a.write_blocking(&[0; 60]).unwrap();
        let refused = b.write_blocking(&[0; 60]).expect_err("past cache.disk in tmp files");
        assert!(refused.to_string().contains("more than cache.disk"), "{refused}");
        assert!(b.write_blocking(b"x").is_err(), "a refused writer stays aborted");
        assert_eq!(store.stats().snapshot().write_aborts, 1);
        drop(b);
        // a's 60 bytes are still being written: 40 are left.
        let mut c2 = store.writer_blocking(ObjectId(3), &meta("http://h/c")).unwrap();
        c2.write_blocking(&[0; 40]).unwrap();
        drop(c2);
        // A writer with no tmp file yet, refused, counts its abort too.
        let aborts = store.stats().snapshot().write_aborts;
        let mut pending = store.writer(ObjectId(5), &meta("http://h/e"));
        assert!(pending.write_blocking(&[0; 41]).is_err());
        assert_eq!(store.stats().snapshot().write_aborts, aborts + 1);
        drop(pending);
        a.commit_blocking(0).unwrap();
        // Committed and dropped: the whole budget is free again.
        let mut d = store.writer_blocking(ObjectId(4), &meta("http://h/d")).unwrap();
        d.write_blocking(&[0; 100]).unwrap();
        assert_eq!(store.inner.writing.load(Ordering::Relaxed), 100);
        drop(d);
        assert_eq!(store.inner.writing.load(Ordering::Relaxed), 0);
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
        // A dead process's (pid beyond pid_max): removed. A name Portico
        // never writes: not Portico's to remove.
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
        assert_eq!(left.len(), 3, "{left:?}");
        assert!(left.contains(&"junk".to_string()), "{left:?}");
        assert_eq!(other.stats().snapshot().tmp_removed, 1);
        // Once the first store is gone, its forgotten writer's file goes too.
        drop(store);
        drop(other);
        let third = DiskStore::start_offline(&cfg(dir.path()), &mut |_| {}).unwrap();
        let left: Vec<_> = fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "{left:?}");
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
            total += store.charged(fs::metadata(store.path_of(id)).unwrap().len());
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
