//! Held-open object files: nginx's `open_file_cache` for the disk tier.
//!
//! A hit on a disk object normally costs `open`, `fstat`, a read of the
//! envelope, decoding the metadata, the body read and `close`, all on the
//! blocking pool. An object whose file was opened once stays open here (at
//! most `cache.open_files` of them, the least used dropped first), with its
//! metadata decoded and its place in the file known, so the next hit costs
//! a map lookup and the body's bytes: read with `preadv2(RWF_NOWAIT)` on the
//! async worker when they are in the page cache (the pool only when that
//! would block), or sent with `sendfile` to a plain-TCP client.
//!
//! What is checked when:
//! - the envelope (magics, size equation, metadata) on every open, as before;
//! - the body checksum when written, and on the first complete read of
//!   each object version in each process (so after every restart); the
//!   index entry remembers it (`Entry::verified`, reset by every commit), so
//!   neither hits on a held file nor a reopen of a file closed to make room
//!   checksum it again (except with a directory shared by worker processes,
//!   where another process may have replaced the file unseen by our index:
//!   there every reopen checksums). A file changed in place after that (never done by
//!   Portico: objects are replaced by rename) is only caught after a
//!   restart;
//! - ranges are read at their offset and never checksummed (they do not
//!   read the whole body), as before.
//!
//! Validity: every change of an object in this process (commit, metadata
//! update, removal, purge, GC eviction, a corrupt file removed) drops the
//! held file under the id's lock. Changes by other processes (the workers of
//! `server.processes` sharing the directory, `portico cache gc` beside a
//! server) are not seen that way, so a held file is used for at most
//! `HELD_VALID` before the path is checked again (nginx's
//! `open_file_cache_valid`): still the same file, it is kept, else reopened.

use super::format::Trailer;
use super::{Inner, READ_CHUNK, now_secs};
use crate::cache::key::ObjectId;
use crate::cache::object::StoredMeta;
use bytes::{Bytes, BytesMut};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// Whether `dir` is on a file system held in memory (tmpfs, ramfs): its
/// reads never wait for a disk, though it refuses `RWF_NOWAIT`.
pub(super) fn on_memory_fs(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the zeroed struct we pass and reads the
    // NUL-terminated path, which outlives the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs by target
    let t = st.f_type as i64;
    t == TMPFS_MAGIC || t == RAMFS_MAGIC
}

/// How long a held file is used before its path is checked again (seconds).
pub const HELD_VALID_SECS: u64 = 30;

/// An object file opened and checked: its metadata decoded and where its
/// body is. Shared by every request reading it; the file is closed when the
/// last of them and the held-file cache let go of it.
pub struct OpenObject {
    pub(super) file: File,
    pub(super) id: ObjectId,
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// The index generation this file was (0: not indexed when opened).
    pub(super) generation: u32,
    /// Its metadata.
    pub meta: Arc<StoredMeta>,
    pub(super) body_off: u64,
    /// Body length in bytes.
    pub body_len: u64,
    /// Expiry hint given at commit (unix seconds, 0 = unknown).
    pub expires: u64,
    /// File size on disk.
    pub file_len: u64,
    pub(super) trailer: Trailer,
    /// The body's checksum matched since this process opened the file.
    pub(super) verified: AtomicBool,
    /// When the path last named this file (unix seconds).
    pub(super) checked: AtomicU64,
    /// The store's count of prefix purges when this was opened, or when a
    /// prefix purge last kept it held (it was not under that prefix).
    pub(super) purges: AtomicU64,
    pub(super) store: Weak<Inner>,
}

impl std::fmt::Debug for OpenObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenObject")
            .field("id", &self.id)
            .field("body_len", &self.body_len)
            .finish()
    }
}

/// A read that never waits for the disk: `pread_nowait`, or on a file
/// system held in memory (`memory_fs`: tmpfs refuses `RWF_NOWAIT` with
/// `EOPNOTSUPP` but never waits for a disk) a plain read, which is what
/// the non-blocking one would be. `Ok(None)`: read on the blocking pool.
pub(super) fn read_nowait(file: &File, buf: &mut [u8], off: u64, memory_fs: bool) -> io::Result<Option<usize>> {
    if !memory_fs {
        return pread_nowait(file, buf, off);
    }
    match file.read_at(buf, off) {
        Ok(got) => Ok(Some(got)),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

/// A non-blocking read: `preadv2` with `RWF_NOWAIT` reads what the page
/// cache holds and fails with `EAGAIN` rather than wait for the disk.
/// `Ok(None)`: it would block (or the file system cannot say), read on the
/// blocking pool instead.
fn pread_nowait(file: &File, buf: &mut [u8], off: u64) -> io::Result<Option<usize>> {
    let Ok(off) = libc::off_t::try_from(off) else {
        return Ok(None);
    };
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `iov` points at `buf`, which is valid for writes of its whole
    // length and outlives the call; the descriptor is owned by `file`.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, off, libc::RWF_NOWAIT) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => Ok(None),
        Some(libc::EINTR) => Ok(None),
        _ => Err(e),
    }
}

impl OpenObject {
    /// Whether the body's checksum matched since this process opened the
    /// file (its hits then skip the checksum and may use `sendfile`).
    pub fn verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    /// The file, for `sendfile`.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where body byte `n` is in the file.
    pub fn file_offset(&self, n: u64) -> u64 {
        self.body_off + n
    }

    /// The file held less than its envelope promised (truncated under us):
    /// it is removed, never served again.
    pub fn truncated(&self) -> io::Error {
        if let Some(inner) = self.store.upgrade() {
            inner.remove_corrupt(self.id, self.dev, self.ino, "truncated while reading");
        }
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cached object {} is corrupt: truncated while reading", self.id),
        )
    }

    /// Counts body bytes sent from the file (by `sendfile`).
    pub fn count_sent(&self, n: u64) {
        if let Some(inner) = self.store.upgrade() {
            inner.stats.bytes_read.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Reads the body bytes from body offset `from` up to `to`, at most
    /// `READ_CHUNK` of them (fewer at the end of the body): from the page
    /// cache on the calling thread when it holds them, else on the
    /// blocking pool. Not checksummed.
    pub async fn read_at(self: &Arc<Self>, from: u64, to: u64) -> io::Result<Bytes> {
        let n = to.min(self.body_len).saturating_sub(from).min(READ_CHUNK as u64) as usize;
        if n == 0 {
            return Ok(Bytes::new());
        }
        let mut buf = BytesMut::zeroed(n);
        let inner = self.store.upgrade();
        let memory_fs = inner.as_ref().is_some_and(|i| i.memory_fs);
        if let Some(got) = read_nowait(&self.file, &mut buf, self.file_offset(from), memory_fs)?
            && got == n
        {
            if let Some(i) = &inner {
                i.stats.reads_nowait.fetch_add(1, Ordering::Relaxed);
                i.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
            }
            return Ok(buf.freeze());
        }
        let Some(inner) = inner else {
            return Err(io::Error::other("the disk cache was shut down"));
        };
        inner.stats.reads_blocked.fetch_add(1, Ordering::Relaxed);
        let obj = self.clone();
        let r = inner
            .jobs
            .run(move || {
                let r = obj.file.read_exact_at(&mut buf, obj.file_offset(from));
                (buf, r)
            })
            .await?;
        match r {
            (buf, Ok(())) => {
                inner.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                Ok(buf.freeze())
            }
            (_, Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err(self.truncated()),
            (_, Err(e)) => Err(e),
        }
    }

    /// Reads the whole body (for the memory tier), as [`OpenObject::read_at`].
    pub async fn read_all(self: &Arc<Self>) -> io::Result<Bytes> {
        if self.body_len <= READ_CHUNK as u64 {
            return self.read_at(0, self.body_len).await;
        }
        let mut out = BytesMut::with_capacity(usize::try_from(self.body_len).unwrap_or(0));
        while (out.len() as u64) < self.body_len {
            let c = self.read_at(out.len() as u64, self.body_len).await?;
            if c.is_empty() {
                return Err(self.truncated());
            }
            out.extend_from_slice(&c);
        }
        Ok(out.freeze())
    }
}

/// The held files of a store, bounded (quick_cache's S3-FIFO: a file used
/// once does not push out files used again).
pub(super) struct HeldFiles {
    files: quick_cache::sync::Cache<ObjectId, Arc<OpenObject>>,
    /// `cache.open_files`, lowered each time the process ran out of
    /// descriptors (`shrink`), raised again a step at a time once it has
    /// not for a while (`regrow`).
    capacity: AtomicUsize,
    /// `cache.open_files`: the most `regrow` gives back.
    configured: usize,
    /// When the process last ran out (unix seconds; 0: never), or the
    /// capacity last grew back.
    pub(super) shrunk_at: AtomicU64,
    /// Objects being opened and checksummed in the background
    /// (`DiskStore::check_in_background`), at most `MAX_CHECKING`.
    checking: std::sync::Mutex<std::collections::HashSet<ObjectId>>,
}

/// At most this many background checks at a time: they take blocking-pool
/// threads, which requests need more.
const MAX_CHECKING: usize = 4;

/// Seconds without running out of descriptors before the held set grows
/// back a step (`HeldFiles::regrow`).
pub(super) const REGROW_AFTER_SECS: u64 = 60;

impl crate::sizing::Relief for HeldFiles {
    fn relieve(&self) -> Option<usize> {
        self.shrink()
    }
}

impl HeldFiles {
    /// At most `capacity` files; None when 0. Registered with
    /// [`crate::sizing::relieve`], so that an accept or an origin connect
    /// that finds no descriptor closes some of them too.
    pub(super) fn new(capacity: usize) -> Option<Arc<HeldFiles>> {
        if capacity == 0 {
            return None;
        }
        let held = Arc::new(HeldFiles {
            files: quick_cache::sync::Cache::new(capacity),
            capacity: AtomicUsize::new(capacity),
            configured: capacity,
            shrunk_at: AtomicU64::new(0),
            checking: std::sync::Mutex::default(),
        });
        let relief: Arc<dyn crate::sizing::Relief> = held.clone();
        crate::sizing::register_relief(Arc::downgrade(&relief));
        Some(held)
    }

    pub(super) fn get(&self, id: ObjectId) -> Option<Arc<OpenObject>> {
        self.files.get(&id)
    }

    pub(super) fn insert(&self, obj: Arc<OpenObject>) {
        self.files.insert(obj.id, obj);
    }

    pub(super) fn remove(&self, id: ObjectId) {
        self.files.remove(&id);
    }

    pub(super) fn len(&self) -> usize {
        self.files.len()
    }

    /// Closes every held file.
    pub(super) fn clear(&self) {
        self.files.clear();
    }

    /// Closes the files of the objects whose URL starts with `prefix`, and
    /// marks the others current as of prefix purge `purges`.
    pub(super) fn forget_under(&self, prefix: &str, purges: u64) {
        self.files.retain(|_, f| {
            let under = crate::cache::key::url_of(&f.meta.key).starts_with(prefix);
            if !under {
                f.purges.store(purges, Ordering::Release);
            }
            !under
        });
    }

    /// Whether a file can be held without closing another. Background
    /// checks go only into room: one that pushed out another held file
    /// would trade one file for another (and cost a whole read each time)
    /// when more objects are hit than files can be held.
    fn has_room(&self) -> bool {
        self.files.len() < self.capacity.load(Ordering::Relaxed)
    }

    /// The most files held now.
    pub(super) fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Closes a quarter of the held files and holds at most that many
    /// fewer until `regrow`; returns the new capacity, None when none were
    /// held (closing nothing frees nothing). Callers that ran out at the
    /// same moment shrink once between them, not a quarter each: the ones
    /// that lose the race just try again in the room the winner made.
    pub(super) fn shrink(&self) -> Option<usize> {
        let held = self.files.len();
        if held == 0 {
            return None;
        }
        let capacity = self.capacity.load(Ordering::Relaxed);
        let smaller = held.min(capacity) * 3 / 4;
        if self
            .capacity
            .compare_exchange(capacity, smaller, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.files.set_capacity(smaller as u64);
            crate::sizing::gave_up(capacity - smaller);
            self.shrunk_at.store(now_secs(), Ordering::Relaxed);
        }
        Some(self.capacity())
    }

    /// Once `REGROW_AFTER_SECS` have passed since descriptors last ran out
    /// (or since the last step), holds a quarter of `cache.open_files` more
    /// again, up to it; returns the new capacity when it grew. A burst of
    /// connections that once took every descriptor does not cost the hits
    /// after it their held files for good; if descriptors are still short,
    /// the next failure shrinks the set again.
    fn regrow(&self, now: u64) -> Option<usize> {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if capacity >= self.configured || now.saturating_sub(self.shrunk_at.load(Ordering::Relaxed)) < REGROW_AFTER_SECS
        {
            return None;
        }
        let larger = capacity
            .saturating_add((self.configured / 4).max(1))
            .min(self.configured);
        self.capacity
            .compare_exchange(capacity, larger, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        self.shrunk_at.store(now, Ordering::Relaxed);
        self.files.set_capacity(larger as u64);
        crate::sizing::took_back(larger - capacity);
        tracing::info!("disk cache: holding up to {larger} cache files open again");
        Some(larger)
    }

    /// Claims a background check of `id`; false when one is running or
    /// `MAX_CHECKING` are.
    fn start_check(&self, id: ObjectId) -> bool {
        let Ok(mut c) = self.checking.lock() else {
            return false;
        };
        c.len() < MAX_CHECKING && c.insert(id)
    }

    fn end_check(&self, id: ObjectId) {
        if let Ok(mut c) = self.checking.lock() {
            c.remove(&id);
        }
    }
}

impl super::DiskStore {
    /// Opens `id`'s file and reads its body through the checksum in the
    /// background, so that it ends up held and checked: for an object the
    /// memory tier serves, whose body is then sent from this file with
    /// `sendfile` (`StoredBody::Mirrored`). The caller has found no checked
    /// held file for it ([`DiskStore::held_quiet`]). Nothing when files are
    /// not held, when the held files leave no room, when it is not stored,
    /// or when enough checks run. Asked on memory hits: the cheap refusals
    /// come first, and no lock is taken while the held files are full.
    pub fn check_in_background(&self, id: ObjectId) {
        let Some(held) = &self.inner.held else { return };
        if !held.has_room() || self.inner.index.get(id).is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !held.start_check(id) {
            return;
        }
        let store = self.clone();
        rt.spawn(async move {
            // A held file past `HELD_VALID_SECS` is only checked again
            // with `stat` (in `open`); any other is read to the end: the
            // last chunk comes only when the checksum matched.
            if let Some(mut found) = store.open_for_check(id).await
                && !found.file.verified()
            {
                while let Ok(Some(_)) = found.body.chunk().await {}
                if found.file.verified() {
                    store.inner.stats.background_checks.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let Some(h) = &store.inner.held {
                h.end_check(id);
            }
        });
    }
}

impl Inner {
    /// Drops the held file of `id` (its object changed or went away).
    /// Called with the id's lock held, so no open can hold the old file
    /// again (`hold` checks the index generation under the same lock).
    pub(super) fn forget_held(&self, id: ObjectId) {
        if let Some(h) = &self.held {
            h.remove(id);
        }
    }

    /// Keeps `obj` open for later hits if it is still the indexed version.
    pub(super) fn hold(&self, obj: &Arc<OpenObject>) {
        let Some(h) = &self.held else { return };
        if obj.generation == 0 {
            return;
        }
        let _guard = self.lock(obj.id);
        if self.index.get(obj.id).is_some_and(|e| e.generation == obj.generation)
            && obj.purges.load(Ordering::Acquire) == self.prefix_purges.load(Ordering::Acquire)
        {
            if !h.has_room() {
                h.regrow(now_secs());
            }
            h.insert(obj.clone());
        }
    }

    /// A held file that may be used without any system call: checksummed
    /// already, and its path checked within `HELD_VALID_SECS`.
    pub(super) fn held_fresh(&self, id: ObjectId) -> Option<Arc<OpenObject>> {
        let obj = self.held.as_ref()?.get(id)?;
        if !obj.verified()
            || now_secs().saturating_sub(obj.checked.load(Ordering::Relaxed)) >= HELD_VALID_SECS
            || !self.held_since_last_purge(&obj)
        {
            return None;
        }
        Some(obj)
    }

    /// Whether `obj`, held, was kept by the latest prefix purge (or held
    /// after it). One held as a purge went through the held files (its
    /// `hold` checked before the purge counted, its insert came after the
    /// purge passed) may be under the prefix: dropped, so that it is
    /// opened again.
    fn held_since_last_purge(&self, obj: &Arc<OpenObject>) -> bool {
        if obj.purges.load(Ordering::Acquire) == self.prefix_purges.load(Ordering::Acquire) {
            return true;
        }
        let _guard = self.lock(obj.id);
        if let Some(h) = &self.held
            && h.get(obj.id).is_some_and(|o| Arc::ptr_eq(&o, obj))
        {
            h.remove(obj.id);
        }
        false
    }

    /// A checksummed held file past `HELD_VALID_SECS`: kept when the path
    /// still names it (checked with `stat`, no read), else dropped. A held
    /// file not checksummed yet is not used: the caller opens the file
    /// again and reads it checksummed. Blocking.
    pub(super) fn held_recheck(&self, id: ObjectId) -> Option<Arc<OpenObject>> {
        use std::os::unix::fs::MetadataExt;
        let obj = self.held.as_ref()?.get(id)?;
        if !obj.verified() || !self.held_since_last_purge(&obj) {
            return None;
        }
        match std::fs::symlink_metadata(self.layout.path_of(id)) {
            Ok(m) if m.dev() == obj.dev && m.ino() == obj.ino && m.len() == obj.file_len => {
                obj.checked.store(now_secs(), Ordering::Relaxed);
                Some(obj)
            }
            _ => {
                let _guard = self.lock(id);
                if let Some(h) = &self.held
                    && h.get(id).is_some_and(|o| Arc::ptr_eq(&o, &obj))
                {
                    h.remove(id);
                }
                None
            }
        }
    }

    /// Held files now.
    pub(super) fn held_count(&self) -> usize {
        self.held.as_deref().map_or(0, HeldFiles::len)
    }

    /// Opens (or creates) a file with `open`; if that fails because the
    /// process is out of descriptors (EMFILE, or ENFILE for the whole
    /// system) while files are held, has a quarter of them closed
    /// ([`crate::sizing::relieve`], as an accept or an origin connect
    /// does) and tries once more: the files requests need (and the
    /// connections they come on) come before hits kept cheap.
    pub(super) fn open_file<T>(&self, open: impl Fn() -> io::Result<T>) -> io::Result<T> {
        match open() {
            Err(e) if crate::sizing::relieve(&e) => open(),
            done => done,
        }
    }

    /// The most files held open now: `cache.open_files`, or fewer once
    /// descriptors ran out.
    pub(super) fn held_capacity(&self) -> usize {
        self.held.as_deref().map_or(0, HeldFiles::capacity)
    }
}
