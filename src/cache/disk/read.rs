//! The disk tier's read path: opening an object (its envelope and metadata
//! checked, an invalid file removed) and streaming its body in chunks on
//! the blocking pool, the checksum verified on the last one.

use super::format::{self, Checksum, ReadError};
use super::held::{OpenObject, read_nowait};
use super::index::Entry;
use super::{
    DiskStore, FileJobs, Inner, READ_CHUNK, key_matches, now_secs, open_read, open_read_cached, open_read_nonblocking,
    secs32,
};
use crate::blocking::PoolError;
use crate::cache::key::ObjectId;
use crate::cache::object::StoredMeta;
use bytes::Bytes;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What an open read of the store before it opened the file.
struct Before {
    /// The object's index entry (None: not indexed).
    entry: Option<Entry>,
    /// The store's count of prefix purges.
    purges: u64,
}

impl Inner {
    pub(super) fn miss(&self) -> Option<DiskObject> {
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Whether a lookup of an id not in the index must still look at the
    /// file (during the start-up scan, or when other processes write here).
    pub(super) fn may_exist_unindexed(&self) -> bool {
        !self.scan_done() || self.shared_dir.load(Ordering::Relaxed)
    }

    pub(super) fn open_blocking(self: &Arc<Self>, id: ObjectId) -> Option<DiskObject> {
        self.open_for(id, true)
    }

    /// Opens `id` for a request (`request`: counted as a read and a held
    /// file hit or miss, recorded as an access) or for a background check
    /// of a memory-tier object's file (`DiskStore::check_in_background`,
    /// which has its own counter: none of those).
    pub(super) fn open_for(self: &Arc<Self>, id: ObjectId, request: bool) -> Option<DiskObject> {
        let purges = self.prefix_purges.load(Ordering::Acquire);
        let entry = self.index.get(id);
        if entry.is_none() && !self.may_exist_unindexed() {
            return self.miss();
        }
        // A held file past its validity: still the file the path names?
        if entry.is_some()
            && let Some(obj) = self.held_recheck(id)
        {
            if request {
                self.stats.open_file_hits.fetch_add(1, Ordering::Relaxed);
                self.index.touch(id, secs32(now_secs()));
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
            }
            return Some(DiskObject::from_open(obj, self.jobs.clone()));
        }
        let path = self.layout.path_of(id);
        if self.held.is_some() && request {
            self.stats.open_file_misses.fetch_add(1, Ordering::Relaxed);
        }
        let open = if self.jobs.inline.is_some() {
            open_read_nonblocking
        } else {
            open_read
        };
        let file = match self.open_file(|| open(&path)) {
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
        Some(self.opened(id, Before { entry, purges }, file, env, meta, request))
    }

    /// What a request's open settles before any file job: Some(None) for
    /// an id neither indexed nor possibly on disk (a miss), Some(found)
    /// where file work goes to the pool and the open had nothing to wait for
    /// ([`Inner::open_nowait`]); None: open with a file job.
    fn open_here(self: &Arc<Self>, id: ObjectId) -> Option<Option<DiskObject>> {
        let entry = self.index.get(id);
        if entry.is_none() && !self.may_exist_unindexed() {
            return Some(self.miss());
        }
        // Where file work goes to the pool, an open with nothing to wait
        // for (the common case for an object read lately) is done here.
        if self.jobs.inline.is_none() {
            return self.open_nowait(id, entry?).map(Some);
        }
        None
    }

    /// [`Inner::open_for`] a request on the calling thread, without waiting
    /// for the disk: the path resolved from the kernel's dentry cache, the
    /// envelope read from its page cache (`open_read_cached`,
    /// `preadv2(RWF_NOWAIT)`). None when that would have waited, or when it
    /// meets what the blocking open handles and reports (a held file due
    /// for its check, a file missing, unreadable or corrupt): the caller
    /// then opens on the blocking pool, which starts from nothing this
    /// attempt changed.
    fn open_nowait(self: &Arc<Self>, id: ObjectId, entry: Entry) -> Option<DiskObject> {
        if self.held.as_ref().is_some_and(|h| h.get(id).is_some()) {
            return None;
        }
        let purges = self.prefix_purges.load(Ordering::Acquire);
        let file = open_read_cached(&self.layout.path_of(id))?;
        let read = |f: &File, buf: &mut [u8], off: u64| self.read_exact_nowait(f, buf, off);
        let env = format::read_envelope_with(&file, &read).ok()?;
        let meta = StoredMeta::decode(&env.meta).ok().filter(|m| !m.key.is_empty())?;
        if self.held.is_some() {
            self.stats.open_file_misses.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.opens_nowait.fetch_add(1, Ordering::Relaxed);
        let before = Before {
            entry: Some(entry),
            purges,
        };
        Some(self.opened(id, before, file, env, meta, true))
    }

    /// Reads `buf.len()` bytes at `off` if the page cache holds them all
    /// (on tmpfs, which has nothing to wait for, a plain read); else a
    /// `WouldBlock` error.
    fn read_exact_nowait(&self, file: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
        match read_nowait(file, buf, off, self.memory_fs)? {
            Some(n) if n == buf.len() => Ok(()),
            _ => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// The rest of an open, once the file's envelope has been read and its
    /// metadata decoded: the index and statistics told, the file held.
    /// `before`: what the store said before the file was opened.
    fn opened(
        self: &Arc<Self>,
        id: ObjectId,
        before: Before,
        file: File,
        env: format::Envelope,
        meta: StoredMeta,
        request: bool,
    ) -> DiskObject {
        let Before { entry, purges } = before;
        if entry.is_none() && self.scan_done() {
            // Written by another process since our scan: count it from now
            // on, so our GC keeps what we serve within our budget.
            self.index.insert_if_absent(
                id,
                Entry {
                    clock: 0,
                    size: env.file_len,
                    last_access: secs32(now_secs()),
                    expires: secs32(env.trailer.expires),
                    hits: 0,
                    generation: self.index.next_generation(),
                    key_ok: key_matches(id, &meta),
                    verified: false,
                },
            );
        }
        if request {
            self.index.touch(id, secs32(now_secs()));
            self.stats.reads.fetch_add(1, Ordering::Relaxed);
        }
        // Checked already in this process (the file was closed to make room
        // since): not again, as for a held file. Only if the file opened is
        // that generation: under the id's lock, a replacement (rename and
        // index update together) is either wholly before or after.
        // Not when other processes write here: they replace files without
        // changing our index's generation.
        let verified = !self.shared_dir.load(Ordering::Relaxed)
            && entry.is_some_and(|before| {
                let _guard = self.lock(id);
                self.index
                    .get(id)
                    .is_some_and(|now| now.generation == before.generation && now.verified)
            });
        let obj = Arc::new(OpenObject {
            file,
            id,
            dev: env.dev,
            ino: env.ino,
            // Held only while it is the indexed version (`hold`); the
            // generation read before the open may already be older than the
            // file opened, which then is simply not held.
            generation: entry.map_or(0, |e| e.generation),
            meta: Arc::new(meta),
            body_off: env.body_offset(),
            body_len: env.trailer.body_len,
            expires: env.trailer.expires,
            file_len: env.file_len,
            trailer: env.trailer,
            verified: AtomicBool::new(verified),
            checked: AtomicU64::new(now_secs()),
            purges: AtomicU64::new(purges),
            store: Arc::downgrade(self),
        });
        self.hold(&obj);
        let checksum = !obj.verified();
        let mut found = DiskObject::from_open(obj, self.jobs.clone());
        if checksum && let Some(st) = found.body.state.as_mut() {
            st.sum = Some(Checksum::new(&env.meta));
        }
        found
    }
}

impl DiskStore {
    /// Opens an object for reading: metadata, body length and a streaming
    /// body reader. None if absent or invalid (an invalid file is removed).
    /// Counts as an access (`touch`).
    pub async fn open(&self, id: ObjectId) -> Option<DiskObject> {
        let inner = self.inner.clone();
        if let Some(found) = inner.open_here(id) {
            return found;
        }
        self.inner
            .jobs
            .run(move || inner.open_blocking(id))
            .await
            .ok()
            .flatten()
    }

    /// `open` for a background check (`check_in_background`): neither a
    /// read nor an access in the statistics.
    pub(super) async fn open_for_check(&self, id: ObjectId) -> Option<DiskObject> {
        let inner = self.inner.clone();
        self.inner
            .jobs
            .run(move || inner.open_for(id, false))
            .await
            .ok()
            .flatten()
    }

    /// `open` as the start of a request's use of the disk: refused with
    /// `PoolError::Busy` when the blocking pool's work queue is full (the
    /// request then gets a busy response instead of waiting).
    pub async fn try_open(&self, id: ObjectId) -> Result<Option<DiskObject>, PoolError> {
        let inner = self.inner.clone();
        if let Some(found) = inner.open_here(id) {
            return Ok(found);
        }
        match self.inner.jobs.try_run(move || inner.open_blocking(id)).await {
            Ok(found) => Ok(found),
            Err(PoolError::Busy) => Err(PoolError::Busy),
            Err(PoolError::Failed) => Ok(None),
        }
    }

    /// `open` on the calling thread.
    pub fn open_blocking(&self, id: ObjectId) -> Option<DiskObject> {
        self.inner.open_blocking(id)
    }
}

/// An object opened for reading.
#[derive(Debug)]
pub struct DiskObject {
    /// Its id.
    pub id: ObjectId,
    /// Its metadata, shared with the open file's (never copied per hit).
    pub meta: Arc<StoredMeta>,
    /// Body length in bytes.
    pub body_len: u64,
    /// Expiry hint given at commit (unix seconds, 0 = unknown).
    pub expires: u64,
    /// File size on disk.
    pub file_len: u64,
    /// The body, streamed.
    pub body: BodyReader,
    /// The open file: positional reads (ranges), `sendfile`, and whether
    /// its checksum has matched in this process.
    pub file: Arc<OpenObject>,
}

impl DiskObject {
    /// A reader over an open file; it checksums the body only when given
    /// the metadata bytes to start from (`sum`), i.e. on a fresh open.
    fn from_open(obj: Arc<OpenObject>, jobs: FileJobs) -> DiskObject {
        DiskObject {
            id: obj.id,
            meta: obj.meta.clone(),
            body_len: obj.body_len,
            expires: obj.expires,
            file_len: obj.file_len,
            body: BodyReader {
                state: Some(Box::new(ReadState {
                    off: obj.body_off,
                    left: obj.body_len,
                    sum: None,
                    obj: obj.clone(),
                })),
                remaining: obj.body_len,
                failed: None,
                jobs,
            },
            file: obj,
        }
    }
}

struct ReadState {
    obj: Arc<OpenObject>,
    off: u64,
    left: u64,
    /// The running checksum; None when the file is not checksummed on this
    /// read (it matched before) or once it has been checked.
    sum: Option<Checksum>,
}

impl ReadState {
    fn fail(&mut self, why: &'static str, checksum: bool) -> io::Error {
        self.sum = None;
        self.left = 0;
        let o = &self.obj;
        if let Some(inner) = o.store.upgrade() {
            if checksum {
                inner.stats.checksum_failures.fetch_add(1, Ordering::Relaxed);
            }
            inner.remove_corrupt(o.id, o.dev, o.ino, why);
        }
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cached object {} is corrupt: {why}", o.id),
        )
    }

    fn next(&mut self) -> io::Result<Option<Bytes>> {
        self.next_with(&format::read_exact_at)
    }

    /// `next` on the calling thread if the page cache holds the chunk
    /// (`preadv2(RWF_NOWAIT)`; on tmpfs a plain read), the checksum
    /// included; a `WouldBlock` error, with nothing changed, if it does not.
    fn next_nowait(&mut self) -> io::Result<Option<Bytes>> {
        let Some(inner) = self.obj.store.upgrade() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let r = self.next_with(&|f: &File, buf: &mut [u8], off: u64| inner.read_exact_nowait(f, buf, off));
        if r.is_ok() {
            inner.stats.reads_nowait.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// `next`, the chunk read by `read_exact_at`: an error from it other
    /// than a short file leaves the state as it was.
    fn next_with(&mut self, read_exact_at: format::ReadExactAt<'_>) -> io::Result<Option<Bytes>> {
        let n = self.left.min(READ_CHUNK as u64) as usize;
        if n == 0 && self.sum.is_none() {
            return Ok(None);
        }
        let mut buf = vec![0u8; n];
        if n > 0 {
            if let Err(e) = read_exact_at(&self.obj.file, &mut buf, self.off) {
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
        {
            let t = self.obj.trailer;
            if sum.finish(t.body_len, t.expires) != t.checksum {
                return Err(self.fail("checksum mismatch", true));
            }
            self.obj.verified.store(true, Ordering::Release);
            if let Some(inner) = self.obj.store.upgrade() {
                inner.index.mark_verified(self.obj.id, self.obj.generation);
            }
        }
        if let Some(inner) = self.obj.store.upgrade() {
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
    jobs: FileJobs,
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
    /// Where file work goes to the blocking pool, a chunk the page cache
    /// holds is read (and checksummed) here all the same.
    pub async fn chunk(&mut self) -> io::Result<Option<Bytes>> {
        let mut st = self.take()?;
        if self.jobs.inline.is_none() {
            match st.next_nowait() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return self.settle(st, r),
            }
        }
        let (st, r) = self
            .jobs
            .run(move || {
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
