//! The disk tier's write path: a new object goes to a tmp file (header,
//! metadata, body, trailer with the checksum) and is published by rename
//! under the id's lock; a metadata update copies the body into a new file
//! the same way.

use super::format::{self, Checksum, HEADER_LEN, ReadError, TRAILER_LEN, Trailer};
use super::index::Entry;
use super::stats::DiskStats;
use super::{DiskStore, FileJobs, Inner, blocking, io_other, key_matches, now_secs, secs32, sync_dir};
use crate::cache::key::ObjectId;
use crate::cache::object::StoredMeta;
use bytes::Bytes;
use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// A writer hands its buffer to the blocking pool once it holds this much.
pub const WRITE_FLUSH: usize = 256 << 10;

impl Inner {
    /// Renames a finished tmp file into place and indexes it.
    fn publish(&self, id: ObjectId, tmp: &Path, entry: Entry) -> io::Result<()> {
        let path = self.layout.path_of(id);
        let guard = self.lock(id);
        self.forget_held(id);
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

    fn tmp_path(&self, id: ObjectId) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.layout
            .tmp_dir()
            .join(format!("{}.{}.{}.{n}", id.hex(), std::process::id(), self.instance))
    }

    /// Creates a tmp file holding the header and `meta`.
    fn new_write_state(self: &Arc<Self>, id: ObjectId, meta: &StoredMeta) -> io::Result<WriteState> {
        let tmp = self.tmp_path(id);
        // Readable too: a collapsed request that joined too late for the
        // flight's spool reads the body here as it is written (`WriteTap`).
        let create = || self.open_file(|| OpenOptions::new().read(true).write(true).create_new(true).open(&tmp));
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
            file: Arc::new(file),
            _counted: crate::util::Counted::new(&WRITING),
            tmp,
            head: Vec::new(),
            sum: Some(Checksum::new(&meta_bytes)),
            meta_len: u64::from(meta_len),
            body_len: 0,
            key_ok: key_matches(id, meta),
            store: Arc::downgrade(self),
            stats: self.stats.clone(),
            fsync: self.fsync,
            done: false,
        };
        st.head.reserve_exact(HEADER_LEN as usize + meta_bytes.len());
        st.head.extend_from_slice(&format::encode_header(meta_len));
        st.head.extend_from_slice(&meta_bytes);
        Ok(st)
    }

    fn update_meta_blocking(self: &Arc<Self>, id: ObjectId, meta: &StoredMeta, expires: u64) -> io::Result<bool> {
        let path = self.layout.path_of(id);
        let old = match super::open_read(&path) {
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
        let size = st.finish(&[], expires)?;
        let old_entry = self.index.get(id);
        let entry = Entry {
            clock: 0,
            size,
            last_access: secs32(now_secs()),
            expires: secs32(expires),
            hits: old_entry.map_or(0, |e| e.hits),
            generation: self.index.next_generation(),
            key_ok: st.key_ok,
            verified: false,
        };
        // Publish only over the very file we copied from: if a new object
        // was committed meanwhile, it wins and this update is dropped.
        let guard = self.lock(id);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.dev() == env.dev && m.ino() == env.ino => {}
            _ => return Ok(false),
        }
        self.forget_held(id);
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

impl DiskStore {
    /// Starts writing an object; nothing is visible until `commit`, which
    /// replaces any object with the same id atomically. The tmp file is
    /// created by the first batch the writer hands to the blocking pool:
    /// an object smaller than a batch (most) is created, written and
    /// published by one job at its commit, so a miss wakes a pool thread
    /// once, and the client's first bytes wait for none.
    pub fn writer(&self, id: ObjectId, meta: &StoredMeta) -> DiskWriter {
        self.wrap_writer(id, Stage::Pending(Box::new(meta.clone())))
    }

    /// `writer` on the calling thread.
    pub fn writer_blocking(&self, id: ObjectId, meta: &StoredMeta) -> io::Result<DiskWriter> {
        let st = self.inner.new_write_state(id, meta)?;
        Ok(self.wrap_writer(id, Stage::Open(Box::new(st))))
    }

    fn wrap_writer(&self, id: ObjectId, stage: Stage) -> DiskWriter {
        DiskWriter {
            id,
            stage,
            buf: Vec::new(),
            body_len: 0,
            max: self.inner.max_object,
            writing: self.inner.writing.clone(),
            writing_max: self.inner.budget.disk,
            store: Arc::downgrade(&self.inner),
            jobs: self.inner.jobs.clone(),
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
        // On the pool whatever `cache.file_io` says: it copies (and checks)
        // the whole body, which may be gigabytes.
        blocking(&self.inner.jobs.pool, move || {
            inner.update_meta_blocking(id, &meta, expires)
        })
        .await?
    }

    /// `update_meta` on the calling thread.
    pub fn update_meta_blocking(&self, id: ObjectId, meta: &StoredMeta, expires: u64) -> io::Result<bool> {
        self.inner.update_meta_blocking(id, meta, expires)
    }
}

/// An object file being written, for a reader that follows its writer: a
/// request collapsed onto the fetch that joined too late for the flight's
/// spool, or fell behind it (`cache::flight`). The body bytes the writer
/// has written out ([`DiskWriter::written`]) are read from the file as
/// they are; the file stays readable while the tap is held, even once it
/// is renamed into place or removed (an aborted write).
#[derive(Clone)]
pub struct WriteTap {
    file: Arc<File>,
    body_offset: u64,
    jobs: FileJobs,
}

impl std::fmt::Debug for WriteTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTap")
            .field("body_offset", &self.body_offset)
            .finish()
    }
}

impl WriteTap {
    /// Body bytes `from..from + len`, read where file work runs
    /// (`cache.file_io`); the caller asks only for bytes written.
    pub async fn read(&self, from: u64, len: usize) -> io::Result<Bytes> {
        let (file, at) = (self.file.clone(), self.body_offset + from);
        self.jobs
            .run(move || {
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, at)?;
                Ok(Bytes::from(buf))
            })
            .await?
    }
}

/// Cache files open for writing in the process: each is a descriptor,
/// which admission counts (`proxy::admission`).
static WRITING: AtomicUsize = AtomicUsize::new(0);

/// Cache files open for writing now (objects being stored), in every
/// disk tier of the process.
pub fn files_being_written() -> usize {
    WRITING.load(Ordering::Relaxed)
}

struct WriteState {
    /// Shared with the [`WriteTap`]s readers hold (`pread` does not move
    /// the offset the writes use).
    file: Arc<File>,
    /// In [`WRITING`] from its creation until the writer is dropped
    /// (committed or aborted), which closes the file.
    _counted: crate::util::Counted<'static>,
    tmp: PathBuf,
    /// The file's header and metadata until they are written with the
    /// first body bytes (or the trailer): a small object's file gets one
    /// write, not three.
    head: Vec<u8>,
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
        if data.is_empty() {
            return Ok(());
        }
        self.sum_body(data);
        let head = std::mem::take(&mut self.head);
        write_all_vectored(&self.file, &mut [IoSlice::new(&head), IoSlice::new(data)])
    }

    fn sum_body(&mut self, data: &[u8]) {
        if let Some(s) = self.sum.as_mut() {
            s.update(data);
        }
        self.body_len += data.len() as u64;
    }

    /// Writes the header and metadata if no body bytes took them yet, the
    /// last body bytes, `rest` (in that order), and the trailer (and
    /// fsyncs); returns the file size.
    fn finish(&mut self, rest: &[&[u8]], expires: u64) -> io::Result<u64> {
        let mut sum = self.sum.take().ok_or_else(|| io_other("writer already finished"))?;
        for part in rest {
            sum.update(part);
            self.body_len += part.len() as u64;
        }
        let trailer = Trailer {
            body_len: self.body_len,
            expires,
            checksum: sum.finish(self.body_len, expires),
        }
        .encode();
        let head = std::mem::take(&mut self.head);
        let mut parts = Vec::with_capacity(rest.len() + 2);
        parts.push(IoSlice::new(&head));
        parts.extend(rest.iter().map(|p| IoSlice::new(p)));
        parts.push(IoSlice::new(&trailer));
        write_all_vectored(&self.file, &mut parts)?;
        if self.fsync {
            self.file.sync_all()?;
        }
        Ok(HEADER_LEN + self.meta_len + self.body_len + TRAILER_LEN)
    }

    fn commit(mut self, id: ObjectId, rest: &[&[u8]], expires: u64) -> io::Result<()> {
        let size = self.finish(rest, expires)?;
        let inner = self.store.upgrade().ok_or_else(|| io_other("disk cache closed"))?;
        let entry = Entry {
            clock: 0,
            size,
            last_access: secs32(now_secs()),
            expires: secs32(expires),
            hits: 0,
            generation: inner.index.next_generation(),
            key_ok: self.key_ok,
            verified: false,
        };
        inner.publish(id, &self.tmp, entry)?;
        self.done = true;
        Ok(())
    }
}

/// Writes all of `bufs` to `file`, in as few calls as it takes (one, for
/// a regular file, unless the disk is full).
fn write_all_vectored(mut file: &File, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    // Drops leading empty slices: nothing to write makes no call (and no
    // `WriteZero` from a zero-length write).
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match file.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Drop for WriteState {
    fn drop(&mut self) {
        if !self.done {
            self.stats.write_aborts.fetch_add(1, Ordering::Relaxed);
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Where a [`DiskWriter`] is.
enum Stage {
    /// Nothing on disk yet: the metadata the tmp file will start with.
    Pending(Box<StoredMeta>),
    /// Its tmp file is open.
    Open(Box<WriteState>),
    /// Failed or refused: nothing more is written (the tmp file, if any,
    /// is gone).
    Aborted,
}

impl Stage {
    /// The open state; a pending writer's file is created first, on the
    /// thread that asks (a blocking-pool job's, or the caller's for the
    /// `_blocking` methods).
    fn open(self, store: &Weak<Inner>, id: ObjectId) -> io::Result<Box<WriteState>> {
        match self {
            Stage::Open(st) => Ok(st),
            Stage::Pending(meta) => {
                let store = store.upgrade().ok_or_else(|| io_other("disk cache closed"))?;
                store.new_write_state(id, &meta).map(Box::new)
            }
            Stage::Aborted => Err(io_other("disk cache writer aborted")),
        }
    }
}

/// Writes one object. Nothing is visible under the object's name until
/// `commit`; dropping the writer (or `abort`) deletes the tmp file. A
/// `write` error (including a body over `cache.max_object_size`) aborts it.
pub struct DiskWriter {
    id: ObjectId,
    stage: Stage,
    buf: Vec<u8>,
    body_len: u64,
    max: u64,
    /// The store's bytes being written (`Inner::writing`), `body_len` of
    /// them this writer's until it is dropped; at most `writing_max`.
    writing: Arc<AtomicU64>,
    writing_max: u64,
    /// The store, for a pending writer's file: weak, as a `WriteState`'s,
    /// so that a writer never keeps a closed store alive.
    store: Weak<Inner>,
    jobs: FileJobs,
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

    /// Body bytes in the file so far (written out, not buffered): 0
    /// before the file exists.
    pub fn written(&self) -> u64 {
        match &self.stage {
            Stage::Open(_) => self.body_len - self.buf.len() as u64,
            Stage::Pending(_) | Stage::Aborted => 0,
        }
    }

    /// The file being written, for readers that follow the writer; None
    /// before it exists or once the writer gave up.
    pub fn tap(&self) -> Option<WriteTap> {
        match &self.stage {
            Stage::Open(st) => Some(WriteTap {
                file: st.file.clone(),
                body_offset: HEADER_LEN + st.meta_len,
                jobs: self.jobs.clone(),
            }),
            Stage::Pending(_) | Stage::Aborted => None,
        }
    }

    /// The tmp file being written, once it exists.
    pub fn tmp_path(&self) -> Option<&Path> {
        match &self.stage {
            Stage::Open(st) => Some(st.tmp.as_path()),
            Stage::Pending(_) | Stage::Aborted => None,
        }
    }

    fn accept(&mut self, n: usize) -> io::Result<()> {
        if matches!(self.stage, Stage::Aborted) {
            return Err(io_other("disk cache writer aborted"));
        }
        if self.body_len + n as u64 > self.max {
            self.stage = Stage::Aborted;
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "object larger than cache.max_object_size",
            ));
        }
        // Many large objects fetched at once (by clients that read them
        // slowly) would otherwise fill the file system with tmp files
        // beyond `cache.disk`, where the GC cannot see them: the writer
        // that would pass the budget gives up, and its response goes on
        // unstored.
        let n = n as u64;
        if self.writing.fetch_add(n, Ordering::Relaxed) + n > self.writing_max {
            self.writing.fetch_sub(n, Ordering::Relaxed);
            // An open tmp file counts its own abort as it is dropped.
            if matches!(self.stage, Stage::Pending(_))
                && let Some(store) = self.store.upgrade()
            {
                store.stats.write_aborts.fetch_add(1, Ordering::Relaxed);
            }
            self.stage = Stage::Aborted;
            return Err(io::Error::other(
                "objects being written would take more than cache.disk",
            ));
        }
        self.body_len += n;
        Ok(())
    }

    async fn write_out(&mut self, data: Option<Bytes>) -> io::Result<()> {
        let stage = std::mem::replace(&mut self.stage, Stage::Aborted);
        let mut buf = std::mem::take(&mut self.buf);
        let (store, id) = (self.store.clone(), self.id);
        let (st, buf) = self
            .jobs
            .run(move || {
                let written = stage.open(&store, id).and_then(|mut st| {
                    match &data {
                        Some(d) => st.write_body(&buf).and_then(|()| st.write_body(d)),
                        None => st.write_body(&buf),
                    }
                    .map(|()| st)
                });
                buf.clear();
                (written, buf)
            })
            .await?;
        // On an error the state was dropped on the pool thread, which
        // removed its tmp file; the writer stays aborted.
        self.stage = Stage::Open(st?);
        self.buf = buf;
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
        let stage = std::mem::replace(&mut self.stage, Stage::Aborted);
        let mut st = stage.open(&self.store, self.id)?;
        let r = st.write_body(&self.buf).and_then(|()| st.write_body(data));
        self.buf.clear();
        if r.is_ok() {
            self.stage = Stage::Open(st);
        }
        r
    }

    /// Finishes the object: trailer with `expires` (unix seconds, 0 =
    /// unknown; the GC evicts expired objects first), fsync if configured,
    /// rename into place (replacing any older version), index update. A
    /// writer still pending creates its file in the same blocking-pool job.
    pub async fn commit(self, expires: u64) -> io::Result<()> {
        self.commit_with(Vec::new(), expires).await
    }

    /// [`DiskWriter::commit`] with the last body bytes, `rest` (in order),
    /// taken by reference (the memory tier's copy of a body kept whole for
    /// it, or the chunks as they came) rather than copied into the
    /// writer's buffer: they go out in the same write.
    pub async fn commit_with(mut self, rest: Vec<Bytes>, expires: u64) -> io::Result<()> {
        // Also refuses an aborted writer.
        self.accept(rest.iter().map(Bytes::len).sum())?;
        let stage = std::mem::replace(&mut self.stage, Stage::Aborted);
        let buf = std::mem::take(&mut self.buf);
        let (store, id) = (self.store.clone(), self.id);
        self.jobs
            .run(move || {
                let parts: Vec<&[u8]> = std::iter::once(&buf[..]).chain(rest.iter().map(|b| &b[..])).collect();
                stage.open(&store, id)?.commit(id, &parts, expires)
            })
            .await?
    }

    /// `commit` on the calling thread.
    pub fn commit_blocking(mut self, expires: u64) -> io::Result<()> {
        let stage = std::mem::replace(&mut self.stage, Stage::Aborted);
        let st = stage.open(&self.store, self.id)?;
        let buf = std::mem::take(&mut self.buf);
        st.commit(self.id, &[&buf], expires)
    }

    /// Drops the object being written (the tmp file is deleted).
    pub fn abort(mut self) {
        self.stage = Stage::Aborted;
    }
}

impl Drop for DiskWriter {
    fn drop(&mut self) {
        // Committed (renamed into place, where the GC counts it) or
        // deleted: either way no longer a tmp file of ours.
        self.writing.fetch_sub(self.body_len, Ordering::Relaxed);
    }
}
