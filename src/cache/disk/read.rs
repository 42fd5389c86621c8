//! The disk tier's read path: opening an object (its envelope and metadata
//! checked, an invalid file removed) and streaming its body in chunks on
//! the blocking pool, the checksum verified on the last one.

use super::format::{self, Checksum, ReadError, Trailer};
use super::index::Entry;
use super::{DiskStore, Inner, READ_CHUNK, blocking, key_matches, now_secs, secs32};
use crate::blocking::{BlockingPool, PoolError};
use crate::cache::key::ObjectId;
use crate::cache::object::StoredMeta;
use bytes::Bytes;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

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
}

impl DiskStore {
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
