//! The cache as the proxy sees it: one object store over the memory tier
//! (hot, whole objects) and the disk tier (everything, streamed), with the
//! policy, the fetches in flight and the counters.
//!
//! Vary: a response with `Vary` is stored under its variant's id
//! (`CacheKey::variant_id`), and a small *marker* under the primary id
//! records the varying field names and the variants stored, so a lookup
//! finds the right variant and an invalidation removes them all.
//!
//! Slices (`cache.slice`): each slice of an object is stored as a variant
//! of its primary key selected by its first byte's offset
//! ([`slice_variant`]), and a *slice marker* under the primary id records
//! the slice size and the complete length, so an invalidation can name
//! every slice. A plain lookup never returns a marker of either kind.

use super::disk::{BodyReader, DiskStore, DiskWriter, OpenObject};
use super::flight::Flights;
use super::key::{CacheKey, ObjectId};
use super::memory::{MemObject, MemoryTier};
use super::object::StoredMeta;
use super::object::{MARKER, SLICE_FIELD, SLICED};
use super::policy::{self, Policy};
use crate::blocking::BlockingPool;
use crate::config::CacheConfig;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Cache counters, kept with relaxed atomics (no lock on the request path).
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Lookups of cacheable requests.
    pub lookups: AtomicU64,
    /// Served fresh from the cache.
    pub hits: AtomicU64,
    /// Not found.
    pub misses: AtomicU64,
    /// Conditional requests sent to origins.
    pub revalidations: AtomicU64,
    /// Served stale.
    pub stale_served: AtomicU64,
    /// Requests that waited for another's fetch instead of fetching.
    pub collapsed: AtomicU64,
    /// Objects stored.
    pub stored: AtomicU64,
    /// Body bytes served from the cache.
    pub bytes_served: AtomicU64,
    /// Objects removed by invalidation or purge.
    pub invalidated: AtomicU64,
    /// Variants removed because their URL had more than [`MAX_VARIANTS`].
    pub variants_dropped: AtomicU64,
    /// Body bytes fetched from origins for lookups that missed (the other
    /// half of the byte hit ratio).
    pub bytes_fetched: AtomicU64,
    /// Fetches being stored that were stopped because every client left
    /// with too much still to come (`cache.quick_abort`).
    pub fetches_abandoned: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl CacheStats {
    /// Counts a lookup.
    pub fn lookup(&self) {
        bump(&self.lookups);
    }
    /// Counts a hit.
    pub fn hit(&self) {
        bump(&self.hits);
    }
    /// Counts a miss.
    pub fn miss(&self) {
        bump(&self.misses);
    }
    /// Counts a revalidation.
    pub fn revalidation(&self) {
        bump(&self.revalidations);
    }
    /// Counts a stale answer.
    pub fn stale(&self) {
        bump(&self.stale_served);
    }
    /// Counts a collapsed request.
    pub fn collapsed(&self) {
        bump(&self.collapsed);
    }
    /// Counts a stored object.
    pub fn stored(&self) {
        bump(&self.stored);
    }
    /// Counts body bytes served from the cache.
    pub fn served(&self, bytes: u64) {
        self.bytes_served.fetch_add(bytes, Ordering::Relaxed);
    }
    /// Counts body bytes fetched from an origin after a miss.
    pub fn fetched(&self, bytes: u64) {
        self.bytes_fetched.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// The smallest memory-tier body sent from its disk tier file with
/// `sendfile` rather than copied into the socket (StoredBody::Mirrored).
/// Below it, head and body go in one `writev`: one system call, where a
/// head sent with `MSG_MORE` and then a `sendfile` are two. Chosen, not
/// measured (bench/README.md).
pub const MIRROR_FROM: u64 = 8 << 10;

/// Most variants kept for one URL (responses that vary on a field with as
/// many values as clients, `User-Agent` say, gain nothing from more);
/// storing another removes the oldest.
pub const MAX_VARIANTS: usize = 100;

/// A lookup needed the disk and the blocking pool's work queue was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBusy;

/// A stored response found by a lookup.
pub struct Stored {
    /// The id it is stored under.
    pub id: ObjectId,
    /// Its metadata (shared with the memory tier).
    pub meta: Arc<StoredMeta>,
    /// Body length.
    pub len: u64,
    /// Where the body is.
    pub body: StoredBody,
}

/// Where a stored body is.
pub enum StoredBody {
    /// Whole, in memory.
    Memory(Bytes),
    /// Whole in memory, and the same version in a held, checksummed file of
    /// the disk tier: read from memory (TLS, HTTP/2), sent from the file
    /// with `sendfile` to a plain-TCP client, which saves copying the body
    /// into the socket (as nginx serves every hit from the page cache).
    Mirrored {
        /// The memory tier's copy.
        memory: Bytes,
        /// The disk tier's file of the same version.
        file: Arc<OpenObject>,
    },
    /// In a held-open file of the disk tier whose checksum has matched in
    /// this process: read at any offset, or sent with `sendfile`.
    File(Arc<OpenObject>),
    /// In a file of the disk tier opened for this request and not yet
    /// checksummed: the whole body is read front to back and checked at
    /// the end (`cursor`); a part of it is read at its offset (`file`).
    Disk {
        /// The open file.
        file: Arc<OpenObject>,
        /// The checksummed front-to-back read (taken out while awaiting).
        cursor: std::sync::Mutex<Option<DiskCursor>>,
    },
}

/// Reads a range of a stored body in chunks.
pub struct RangeReader<'a> {
    source: &'a StoredBody,
    range: Range<u64>,
    /// Reading the whole body of an unchecked file: through its cursor.
    whole: bool,
}

impl StoredBody {
    /// The bytes in `range`, chunk by chunk. A range is read at its offset
    /// (never the bytes before it); the whole body of a file not yet
    /// checksummed in this process is read front to back and checked.
    pub fn read(&self, range: Range<u64>) -> RangeReader<'_> {
        let whole = match self {
            StoredBody::Disk { file, .. } => range.start == 0 && range.end >= file.body_len,
            _ => false,
        };
        RangeReader {
            source: self,
            range,
            whole,
        }
    }

    /// The held, checksummed file a body can be sent from with `sendfile`.
    pub fn sendable(&self) -> Option<&OpenObject> {
        match self {
            StoredBody::File(f) | StoredBody::Mirrored { file: f, .. } => Some(f),
            _ => None,
        }
    }
}

impl RangeReader<'_> {
    /// The next chunk; None at the end of the range.
    pub async fn next(&mut self) -> Option<std::io::Result<Bytes>> {
        if self.range.is_empty() {
            return None;
        }
        let file = match self.source {
            StoredBody::Memory(b) | StoredBody::Mirrored { memory: b, .. } => {
                let start = usize::try_from(self.range.start).ok()?.min(b.len());
                let end = usize::try_from(self.range.end).ok()?.min(b.len());
                self.range.start = self.range.end;
                return (start < end).then(|| Ok(b.slice(start..end)));
            }
            StoredBody::Disk { cursor, .. } if self.whole => {
                // The reader is taken out while awaiting (a std Mutex is not
                // held across the await) and put back after.
                let taken = cursor.lock().ok()?.take();
                let mut state = taken?;
                let result = state.next_in(&mut self.range).await;
                if let Ok(mut guard) = cursor.lock() {
                    *guard = Some(state);
                }
                return result;
            }
            StoredBody::Disk { file, .. } | StoredBody::File(file) => file,
        };
        let end = self.range.end.min(file.body_len);
        if self.range.start >= end {
            return None;
        }
        match file.read_at(self.range.start, end).await {
            Ok(c) if c.is_empty() => Some(Err(file.truncated())),
            Ok(c) => {
                let take = (end - self.range.start).min(c.len() as u64) as usize;
                self.range.start += take as u64;
                Some(Ok(c.slice(..take)))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// A disk body being read front to back, with the unread rest of the last
/// chunk (`carry` holds the bytes from offset `base`).
pub struct DiskCursor {
    reader: BodyReader,
    base: u64,
    carry: Bytes,
}

impl DiskCursor {
    async fn next_in(&mut self, range: &mut Range<u64>) -> Option<std::io::Result<Bytes>> {
        loop {
            if range.is_empty() {
                return None;
            }
            if range.start < self.base {
                return Some(Err(std::io::Error::other("stored body read out of order")));
            }
            if self.carry.is_empty() {
                match self.reader.chunk().await {
                    Ok(Some(c)) => self.carry = c,
                    Ok(None) => return None,
                    Err(e) => return Some(Err(e)),
                }
            }
            let len = self.carry.len() as u64;
            if range.start >= self.base + len {
                self.base += len;
                self.carry = Bytes::new();
                continue;
            }
            let from = (range.start - self.base) as usize;
            let to = (range.end - self.base).min(len) as usize;
            let out = self.carry.slice(from..to);
            self.carry = self.carry.slice(to..);
            self.base += to as u64;
            range.start = self.base;
            return Some(Ok(out));
        }
    }
}

/// The cache.
pub struct Cache {
    /// The RFC 9111 decisions, configured by `[cache]`.
    pub policy: Policy,
    /// Which objects the memory tier takes (`cache.memory_cache_mode`).
    memory_mode: crate::config::MemoryCacheMode,
    /// Per-route policies (`cache = {...}` in a `[[rule]]`): None = `policy`;
    /// the flag says whether the route uses the cache at all.
    routes: Vec<(bool, Option<Policy>)>,
    /// `policy` and the routes' policies as reverse listeners apply them,
    /// obeying the targeted cache-control fields (RFC 9213).
    reverse: (Policy, Vec<Option<Policy>>),
    /// Fetches in flight (request collapsing).
    pub flights: Arc<Flights>,
    /// The body bytes misses may hold ahead of their clients, all together
    /// (`cache.read_ahead_memory`); kept across reloads that keep its size.
    pub read_ahead: super::flight::ReadAheadBudget,
    /// Counters.
    pub stats: Arc<CacheStats>,
    /// The response header naming what the cache did, if enabled.
    pub status_header: Option<HeaderName>,
    /// This cache's identifier in the `Cache-Status` field (RFC 9211), if enabled.
    pub cache_status: Option<Box<str>>,
    /// `status_header` hashed: see [`Cache::lines_tag`].
    status_tag: u64,
    /// `cache.revalidation_wait`: how long a request waits for another's
    /// revalidation of the same stored object.
    pub revalidation_wait: std::time::Duration,
    /// The 206 responses kept (memory only) until they combine into the
    /// complete response (RFC 9111 3.4).
    pub partials: Arc<super::partial::PartialStore>,
    memory: Arc<MemoryTier>,
    disk: Option<DiskStore>,
    max_object: u64,
    ignore_query: bool,
    marker_lock: Arc<tokio::sync::Mutex<()>>,
    /// Shared with the reconfigured caches of later reloads.
    running: Arc<std::sync::atomic::AtomicBool>,
}

/// Unix seconds at which a stored response stops being fresh (the disk
/// tier's GC evicts expired objects first).
fn expires_hint(policy: &Policy, meta: &StoredMeta) -> u64 {
    let lifetime = policy.freshness_lifetime(meta);
    let age = policy::current_age(meta, SystemTime::now());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    now + lifetime.saturating_sub(age).as_secs()
}

impl Cache {
    /// Builds the cache from `[cache]`; starts the disk tier (its index
    /// rebuild and GC run in the background) with its file I/O on `pool`.
    pub fn new(
        cfg: &CacheConfig,
        route_overrides: &[Option<crate::config::CacheOverrides>],
        pool: BlockingPool,
    ) -> Result<Cache, String> {
        let disk = if cfg.disk.bytes() > 0 {
            Some(
                DiskStore::start_with_pool(cfg, pool)
                    .map_err(|e| format!("cannot open the disk cache {}: {e}", cfg.dir.display()))?,
            )
        } else {
            None
        };
        let storage = Cache {
            policy: Policy::new(cfg)?,
            memory_mode: cfg.memory_cache_mode,
            routes: Vec::new(),
            reverse: (Policy::new(cfg)?, Vec::new()),
            flights: Arc::new(Flights::default()),
            read_ahead: super::flight::ReadAheadBudget::new(cfg.read_ahead_memory.bytes()),
            stats: Arc::default(),
            status_header: None,
            cache_status: None,
            status_tag: 0,
            revalidation_wait: std::time::Duration::ZERO,
            // Parts of objects the memory tier would admit whole, within an
            // eighth of its budget.
            partials: Arc::new(super::partial::PartialStore::new(
                cfg.max_memory_object.bytes(),
                cfg.memory.bytes() / 8,
            )),
            memory: Arc::new(MemoryTier::new(cfg.memory.bytes(), cfg.max_memory_object.bytes())),
            disk,
            max_object: 0,
            ignore_query: false,
            marker_lock: Arc::default(),
            running: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        };
        storage.reconfigure(cfg, route_overrides)
    }

    /// A cache over the same stored objects, fetches in flight and counters
    /// as `self`, with the policy settings of `cfg` and the routes'
    /// overrides (a config reload). The storage settings (memory and disk
    /// sizes, directory, levels, GC) stay those `self` was built with.
    pub fn reconfigure(
        &self,
        cfg: &CacheConfig,
        route_overrides: &[Option<crate::config::CacheOverrides>],
    ) -> Result<Cache, String> {
        let policy = Policy::new(cfg)?;
        let reverse = (
            policy.clone().targeted(cfg)?,
            route_overrides
                .iter()
                .enumerate()
                .map(|(i, o)| match o {
                    None => Ok(None),
                    Some(o) => {
                        let c = o.apply(cfg);
                        Policy::new(&c)
                            .and_then(|p| p.targeted(&c))
                            .map(Some)
                            .map_err(|e| format!("rule[{i}].cache: {e}"))
                    }
                })
                .collect::<Result<Vec<_>, String>>()?,
        );
        let routes = route_overrides
            .iter()
            .enumerate()
            .map(|(i, o)| match o {
                None => Ok((true, None)),
                Some(o) => {
                    let c = o.apply(cfg);
                    Policy::new(&c)
                        .map(|p| (c.enabled, Some(p)))
                        .map_err(|e| format!("rule[{i}].cache: {e}"))
                }
            })
            .collect::<Result<Vec<_>, String>>()?;
        let status_header = if cfg.status_header.is_empty() {
            None
        } else {
            Some(
                HeaderName::from_bytes(cfg.status_header.as_bytes())
                    .map_err(|_| format!("cache.status_header {:?} is not a header name", cfg.status_header))?,
            )
        };
        let status_tag = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            status_header.as_ref().map(HeaderName::as_str).hash(&mut h);
            h.finish()
        };
        Ok(Cache {
            policy,
            memory_mode: cfg.memory_cache_mode,
            routes,
            reverse,
            flights: self.flights.clone(),
            read_ahead: self.read_ahead.resized(cfg.read_ahead_memory.bytes()),
            stats: self.stats.clone(),
            status_header,
            status_tag,
            cache_status: (!cfg.cache_status.is_empty()).then(|| cfg.cache_status.as_str().into()),
            revalidation_wait: cfg.revalidation_wait.get(),
            partials: self.partials.clone(),
            memory: self.memory.clone(),
            disk: self.disk.clone(),
            max_object: cfg.max_object_size.bytes(),
            ignore_query: cfg.ignore_query_in_key,
            marker_lock: self.marker_lock.clone(),
            running: self.running.clone(),
        })
    }

    /// The tag of a stored response's kept field lines
    /// ([`crate::cache::object::KeptLines`]) written for hits under
    /// `policy`: which fields a hit's head leaves out depends on the
    /// policy's settings and on the cache status header's name.
    pub fn lines_tag(&self, policy: &Policy) -> u64 {
        policy.fingerprint() ^ self.status_tag
    }

    /// The policy for requests routed by rule `route` (None: not routed by a rule).
    pub fn policy_for(&self, route: Option<usize>) -> &Policy {
        route
            .and_then(|r| self.routes.get(r))
            .and_then(|(_, p)| p.as_ref())
            .unwrap_or(&self.policy)
    }

    /// The policy for requests of a reverse listener routed by rule `route`:
    /// as [`Cache::policy_for`], obeying the targeted cache-control fields
    /// (`cache.targeted_fields`, RFC 9213), which address the CDN a
    /// reverse proxy is, not a forward proxy.
    pub fn reverse_policy_for(&self, route: Option<usize>) -> &Policy {
        route
            .and_then(|r| self.reverse.1.get(r))
            .and_then(Option::as_ref)
            .unwrap_or(&self.reverse.0)
    }

    /// Whether requests routed by rule `route` use the cache.
    pub fn enabled_for(&self, route: Option<usize>) -> bool {
        route.and_then(|r| self.routes.get(r)).is_none_or(|(on, _)| *on)
    }

    /// False after [`Cache::set_running`]`(false)` (`/nsc?stop`): requests
    /// then bypass the cache.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Starts or stops serving from and storing into the cache at run time.
    pub fn set_running(&self, on: bool) {
        self.running.store(on, Ordering::Relaxed);
    }

    /// Largest object stored.
    pub fn max_object_size(&self) -> u64 {
        self.max_object
    }

    /// The memory tier.
    pub fn memory(&self) -> &MemoryTier {
        &self.memory
    }

    /// The disk tier, if enabled.
    pub fn disk(&self) -> Option<&DiskStore> {
        self.disk.as_ref()
    }

    /// The key for a request URL.
    pub fn key(&self, scheme: &str, authority: &str, path_and_query: &str) -> CacheKey {
        CacheKey::new(scheme, authority, path_and_query, self.ignore_query)
    }

    /// [`Cache::key`] with the authority's port kept as given
    /// ([`CacheKey::with_authority_as_given`]).
    pub fn key_as_given(&self, scheme: &str, authority: &str, path_and_query: &str) -> CacheKey {
        CacheKey::with_authority_as_given(scheme, authority, path_and_query, self.ignore_query)
    }

    /// Counts a request's lookup of `id`, whichever tier answers it or
    /// none: the disk tier's replacement may rank objects by how often they
    /// are asked for (`cache.replacement = "frequency"`).
    fn asked(&self, id: ObjectId) {
        if let Some(disk) = &self.disk {
            disk.asked(id);
        }
    }

    /// The stored object under `id`: memory first, then disk (a disk hit
    /// copied into memory as [`Cache::promotes`] says).
    async fn get(&self, id: ObjectId) -> Option<Stored> {
        self.get_or_busy(id, false, true).await.ok().flatten()
    }

    /// `get`; with `refuse_when_busy`, a disk read that would wait in a
    /// full blocking-pool queue is refused with `PoolBusy` instead. Without
    /// `files` (a client that cannot take `sendfile`: TLS, HTTP/2), a
    /// memory-tier body is not paired with its disk file
    /// ([`StoredBody::Mirrored`]): it would be read from memory anyway.
    async fn get_or_busy(&self, id: ObjectId, refuse_when_busy: bool, files: bool) -> Result<Option<Stored>, PoolBusy> {
        self.catch_up_told();
        if let Some(obj) = self.memory.get(id) {
            let mirrored = if files { self.mirror(id, &obj) } else { None };
            let body = match mirrored {
                Some(file) => StoredBody::Mirrored {
                    memory: obj.body.clone(),
                    file,
                },
                None => StoredBody::Memory(obj.body.clone()),
            };
            return Ok(Some(Stored {
                id,
                len: obj.body.len() as u64,
                meta: obj.meta.clone(),
                body,
            }));
        }
        let Some(disk) = self.disk.as_ref() else {
            return Ok(None);
        };
        // A held, checksummed file: no blocking pool, no system call.
        if let Some(file) = disk.held(id) {
            return Ok(Some(self.stored_from_held(id, file).await));
        }
        let found = if refuse_when_busy {
            disk.try_open(id).await.map_err(|_| PoolBusy)?
        } else {
            disk.open(id).await
        };
        let Some(found) = found else {
            return Ok(None);
        };
        Ok(self.stored_from_disk(disk, id, found).await)
    }

    /// The disk tier's held, checksummed file of the very version of `obj`
    /// the memory tier holds, when its body is large enough for `sendfile`
    /// to beat a copy ([`MIRROR_FROM`]). The version is told by its length
    /// and its request and response times (stored to the millisecond):
    /// between a new version's memory insert and its disk commit, and
    /// between a 304's two metadata updates, the held file is the old
    /// version and differs in them, so the memory copy is used.
    fn mirror(&self, id: ObjectId, obj: &MemObject) -> Option<Arc<OpenObject>> {
        if (obj.body.len() as u64) < MIRROR_FROM {
            return None;
        }
        let disk = self.disk.as_ref()?;
        let Some(file) = disk.held_quiet(id) else {
            disk.check_in_background(id);
            return None;
        };
        let same = file.body_len == obj.body.len() as u64
            && crate::cache::object::same_millis(file.meta.response_time, obj.meta.response_time)
            && crate::cache::object::same_millis(file.meta.request_time, obj.meta.request_time);
        same.then_some(file)
    }

    /// Whether a disk hit of `len` body bytes goes into the memory tier.
    /// With `memory_cache_mode = "always"` only while the tier has room
    /// without evicting: once full, copying every disk hit into it would
    /// push out as much as it brings in (with a working set larger than
    /// the memory tier, most of it), and the file serves the hit without a
    /// copy. With `"disk"`, a disk hit is the only way in, so every one the
    /// tier admits (its S3-FIFO admission then decides what stays); with
    /// `"network"`, none.
    fn promotes(&self, len: u64) -> bool {
        use crate::config::MemoryCacheMode;
        match self.memory_mode {
            MemoryCacheMode::Always => self.memory.has_room(len),
            MemoryCacheMode::Disk => self.memory.admits(len),
            MemoryCacheMode::Network => false,
        }
    }

    /// Copies a disk hit's body, read whole from `file`, into the memory
    /// tier: only if `file` is still the indexed version and the tier has
    /// none of `id` (a store while the body was read is newer and wins:
    /// the copy would hide it).
    fn promote(&self, id: ObjectId, file: &OpenObject, meta: &Arc<StoredMeta>, body: &Bytes) {
        let Some(disk) = self.disk.as_ref() else { return };
        if !disk.is_current(file) {
            return;
        }
        let copy = Arc::new(MemObject {
            meta: meta.clone(),
            body: body.clone(),
        });
        // A store that committed between the check and the insert (and
        // removed the memory copy before this one went in) is seen here.
        if self.memory.insert_if_absent(id, copy.clone()) && !disk.is_current(file) {
            self.memory.remove_if_same(id, &copy);
        }
    }

    /// A hit on a held file, into the memory tier when it [`Cache::promotes`] it.
    async fn stored_from_held(&self, id: ObjectId, file: Arc<OpenObject>) -> Stored {
        let (meta, len) = (file.meta.clone(), file.body_len);
        if self.promotes(len)
            && let Ok(body) = file.read_all().await
        {
            self.promote(id, &file, &meta, &body);
            return Stored {
                id,
                len,
                meta,
                body: StoredBody::Memory(body),
            };
        }
        Stored {
            id,
            len,
            meta,
            body: StoredBody::File(file),
        }
    }

    async fn stored_from_disk(
        &self,
        disk: &DiskStore,
        id: ObjectId,
        found: crate::cache::disk::DiskObject,
    ) -> Option<Stored> {
        disk.touch(id);
        if found.file.verified() {
            // A held file whose path was checked again (`open` after
            // `HELD_VALID_SECS`): as a held hit.
            return Some(self.stored_from_held(id, found.file).await);
        }
        let (meta, body_len, mut reader) = (found.file.meta.clone(), found.body_len, found.body);
        // Into the memory tier (read whole and checksummed before anything
        // is sent) as `Cache::promotes` says.
        if self.promotes(body_len) {
            let mut body = BytesMut::with_capacity(usize::try_from(body_len).unwrap_or(0));
            loop {
                match reader.chunk().await {
                    Ok(Some(c)) => body.extend_from_slice(&c),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!("disk cache object {id}: {e}");
                        return None;
                    }
                }
            }
            let body = body.freeze();
            self.promote(id, &found.file, &meta, &body);
            return Some(Stored {
                id,
                len: body_len,
                meta,
                body: StoredBody::Memory(body),
            });
        }
        Some(Stored {
            id,
            len: body_len,
            meta,
            body: StoredBody::Disk {
                file: found.file,
                cursor: std::sync::Mutex::new(Some(DiskCursor {
                    reader,
                    base: 0,
                    carry: Bytes::new(),
                })),
            },
        })
    }

    /// The stored response for a request, following a Vary marker to the
    /// request's variant. `PoolBusy` when the disk tier would have to be
    /// read and the blocking pool's queue is full: the request gets a busy
    /// response rather than waiting.
    pub async fn lookup(&self, key: &CacheKey, req_headers: &HeaderMap) -> Result<Option<Stored>, PoolBusy> {
        self.lookup_for(key, req_headers, true).await
    }

    /// [`Cache::lookup`] for a client that can (`files`) or cannot take a
    /// body with `sendfile`: without, a memory-tier hit skips looking for
    /// its disk file (an index lookup, and a check started when the file is
    /// not held) that only `sendfile` would use.
    pub async fn lookup_for(
        &self,
        key: &CacheKey,
        req_headers: &HeaderMap,
        files: bool,
    ) -> Result<Option<Stored>, PoolBusy> {
        let id = key.id();
        self.asked(id);
        let Some(primary) = self.get_or_busy(id, true, files).await? else {
            return Ok(None);
        };
        if primary.meta.key != key.text() {
            // A 128-bit hash collision.
            return Ok(None);
        }
        // Looked up once per stored object, not on every hit.
        let headers = &primary.meta.headers;
        let plain = primary
            .meta
            .derived
            .plain_or_init(|| !headers.contains_key(SLICED) && !headers.contains_key(MARKER));
        if plain {
            return Ok(policy::variant_matches(&primary.meta, req_headers).then_some(primary));
        }
        // Not plain: stored in slices (`lookup_slice`: a miss for a lookup
        // of the whole), or a `Vary` marker.
        let Some(fields) = headers.get(MARKER).filter(|_| !headers.contains_key(SLICED)) else {
            return Ok(None);
        };
        let fields: Vec<String> = fields
            .to_str()
            .unwrap_or("")
            .split(',')
            .map(|f| f.trim().to_string())
            .filter(|f| !f.is_empty())
            .collect();
        let variant = policy::variant_of(&fields, req_headers);
        self.asked(key.variant_id(&variant));
        // This request already holds a place on the disk: wait, do not refuse.
        let found = self.get_or_busy(key.variant_id(&variant), false, files).await;
        let Some(found) = found.ok().flatten() else {
            return Ok(None);
        };
        Ok((found.meta.key == key.text() && found.meta.variant == variant).then_some(found))
    }

    /// The stored slice of `key` that starts at byte `start` (`cache.slice`);
    /// `PoolBusy` as for [`Cache::lookup`].
    pub async fn lookup_slice(&self, key: &CacheKey, start: u64) -> Result<Option<Stored>, PoolBusy> {
        let variant = slice_variant(start);
        self.asked(key.variant_id(&variant));
        let Some(found) = self.get_or_busy(key.variant_id(&variant), true, true).await? else {
            return Ok(None);
        };
        Ok((found.meta.key == key.text() && found.meta.variant == variant).then_some(found))
    }

    /// Records under the primary id of `key` that the object is stored in
    /// slices of `size` bytes, `complete` bytes in all, unless that is
    /// recorded already. A complete response or a Vary marker stored there
    /// is left alone (its own invalidation would lose track of it): the
    /// slices are then found by their own ids, and removed by `purge` and
    /// the garbage collector as any object is.
    pub async fn mark_sliced(&self, key: &CacheKey, size: u64, complete: u64) {
        let value = format!("{size} {complete}");
        let primary = key.id();
        if let Some(old) = self.get(primary).await {
            match old.meta.headers.get(SLICED) {
                Some(v) if v.as_bytes() == value.as_bytes() => return,
                Some(_) => {}
                None if old.meta.key != key.text() => {}
                None => return,
            }
        }
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(SLICED, v);
        }
        self.write_primary_marker(key, headers, Bytes::new()).await;
    }

    /// Starts storing a response as it streams: `vary` is its Vary field
    /// list (empty when it does not vary), `length` its announced length.
    pub async fn sink(&self, key: &CacheKey, meta: StoredMeta, vary: &[String], length: Option<u64>) -> StoreSink<'_> {
        let id = key.variant_id(&meta.variant);
        if !vary.is_empty() {
            self.write_marker(key, vary, id).await;
        }
        let to_memory = length.is_none_or(|n| self.memory.admits(n));
        let disk = self.disk.as_ref().map(|d| d.writer(id, &meta));
        StoreSink {
            cache: self,
            id,
            meta,
            memory: to_memory.then(Vec::new),
            size: 0,
            disk,
        }
    }

    /// Records under the primary id that `key` varies on `vary`, and that
    /// `variant` is one of its stored variants.
    async fn write_marker(&self, key: &CacheKey, vary: &[String], variant: ObjectId) {
        // Read, add, write back: one at a time, or concurrent stores of two
        // variants would each drop the other's id.
        let _one_at_a_time = self.marker_lock.lock().await;
        let primary = key.id();
        let mut variants: Vec<ObjectId> = Vec::new();
        if let Some(old) = self.get(primary).await
            && old.meta.headers.contains_key(MARKER)
        {
            variants = marker_ids(&old).await;
        }
        if !variants.contains(&variant) {
            variants.push(variant);
        }
        // The oldest variants give way past the limit: every store rewrites
        // the list under this lock, so without one a client sending a new
        // value of a varying field with each request made every Vary store
        // in the cache wait longer (11,000 variants of one URL: 1.7 ms a
        // store became 8.5 ms). A variant must leave the store with its id,
        // or invalidating the URL would miss it.
        if variants.len() > MAX_VARIANTS {
            let gone: Vec<ObjectId> = variants.drain(..variants.len() - MAX_VARIANTS).collect();
            for id in gone {
                self.memory.remove(id);
                if let Some(d) = &self.disk {
                    d.remove(id).await;
                }
                self.stats.variants_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        let body: String = variants.iter().map(|v| format!("{v}\n")).collect();
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&vary.join(", ")) {
            headers.insert(MARKER, v);
        }
        self.write_primary_marker(key, headers, Bytes::from(body)).await;
    }

    /// Stores a marker (never served: `headers` say which kind) with `body`
    /// under the primary id of `key`, in both tiers.
    async fn write_primary_marker(&self, key: &CacheKey, headers: HeaderMap, body: Bytes) {
        let primary = key.id();
        let now = SystemTime::now();
        let meta = StoredMeta {
            key: key.text().to_string(),
            variant: Vec::new(),
            status: StatusCode::OK,
            headers,
            request_time: now,
            response_time: now,
            origin: None,
            derived: Default::default(),
        };
        if let Some(d) = &self.disk {
            let mut w = d.writer(primary, &meta);
            if w.write(&body).await.is_ok() {
                let _ = w.commit(u64::MAX / 2).await;
            }
        }
        self.memory.insert(
            primary,
            Arc::new(MemObject {
                meta: Arc::new(meta),
                body,
            }),
        );
    }

    /// Replaces the stored metadata of `id` (both tiers).
    pub async fn update_meta(&self, id: ObjectId, meta: Arc<StoredMeta>) {
        if let Some(obj) = self.memory.get(id) {
            self.memory.insert(
                id,
                Arc::new(MemObject {
                    meta: meta.clone(),
                    body: obj.body.clone(),
                }),
            );
        }
        if let Some(d) = &self.disk
            && let Err(e) = d.update_meta(id, &meta, expires_hint(&self.policy, &meta)).await
        {
            tracing::warn!("cannot update cached object {id}: {e}");
        }
    }

    /// Drops from the memory tier what the other worker processes have
    /// removed from the cache since the last lookup (`told`), before this
    /// one looks: each of their removals is told once it is off the disk
    /// (before a `PURGE` is answered).
    fn catch_up_told(&self) {
        self.memory.told.catch_up(
            |id| self.forget_in_memory(id),
            |prefix| {
                self.forget_under(prefix);
            },
            || {
                let n = self.memory.clear();
                self.partials.clear();
                if let Some(d) = &self.disk {
                    d.forget_held_files();
                }
                tracing::warn!(
                    "the memory tier dropped all {n} objects: this worker fell too far behind what the other \
                     workers removed from the cache to know which of them to drop"
                );
            },
        );
    }

    /// Drops `id` from the memory tier and from the partial responses
    /// kept, and forgets its disk file (`DiskStore::forget_removed`), with
    /// what it names in the memory tier: the variants of a `Vary` marker,
    /// the slices of a sliced object (another worker's removal told only
    /// the ids it found).
    fn forget_in_memory(&self, id: ObjectId) {
        let mut ids = vec![id];
        if let Some(obj) = self.memory.get(id) {
            let headers = &obj.meta.headers;
            if headers.contains_key(MARKER) {
                ids.extend(parse_ids(&obj.body));
            }
            if let Some(v) = headers.get(SLICED)
                && let Some(key) = CacheKey::from_text(&obj.meta.key)
            {
                ids.extend(slice_ids(&key, v.as_bytes()));
            }
        }
        for id in ids {
            // The disk's record first: a read of the old file under way
            // here then cannot put it back into the memory tier.
            if let Some(d) = &self.disk {
                d.forget_removed(id);
            }
            self.memory.remove(id);
            self.partials.remove(id);
        }
    }

    /// Drops everything whose URL starts with `prefix` from the memory
    /// tier, the partial responses kept and the held disk files (whose
    /// paths a `portico cache purge --prefix` may just have removed): the
    /// objects dropped from the memory tier. The disk tier's files stay.
    fn forget_under(&self, prefix: &str) -> usize {
        if let Some(d) = &self.disk {
            d.forget_held_under(prefix);
        }
        self.partials.remove_under(prefix);
        self.memory.purge_prefix(prefix)
    }

    /// A prefix purge (`Portico-Purge: prefix`): drops everything whose URL
    /// starts with `prefix` from this process's memory tier, partial
    /// responses and held files, and tells the other worker processes to
    /// do the same (`told`); the objects this memory tier dropped. The
    /// disk tier is purged by prefix with `portico cache purge --prefix`.
    pub fn purge_prefix(&self, prefix: &str) -> usize {
        let n = self.forget_under(prefix);
        super::told::tell_prefix(prefix);
        n
    }

    /// Removes everything stored for `key` (every variant), and tells the
    /// other worker processes to drop their memory tier's copies (`told`);
    /// true if anything was stored.
    pub async fn invalidate(&self, key: &CacheKey) -> bool {
        let primary = key.id();
        self.partials.remove(primary);
        let Some(found) = self.get(primary).await else {
            // Another worker may still hold it in memory (with no disk
            // tier, or one that has evicted it).
            super::told::tell(primary);
            return false;
        };
        let mut ids = vec![primary];
        if found.meta.headers.contains_key(MARKER) {
            ids.extend(marker_ids(&found).await);
        }
        if let Some(v) = found.meta.headers.get(SLICED) {
            ids.extend(slice_ids(key, v.as_bytes()));
        }
        for id in ids {
            self.memory.remove(id);
            if let Some(d) = &self.disk {
                d.remove(id).await;
            }
            // Once off the disk: told earlier, another worker could read
            // it from there into its memory again.
            super::told::tell(id);
            self.stats.invalidated.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

/// The variant that selects the slice starting at byte `start` of a sliced
/// object (see the module's documentation).
pub fn slice_variant(start: u64) -> Vec<(String, Option<String>)> {
    vec![(SLICE_FIELD.to_string(), Some(start.to_string()))]
}

/// The ids of every slice a slice marker's value (`<size> <complete>`)
/// names; none for a value that is not one.
fn slice_ids(key: &CacheKey, value: &[u8]) -> Vec<ObjectId> {
    let text = std::str::from_utf8(value).unwrap_or("");
    let mut numbers = text.split(' ').map(|n| n.parse::<u64>().ok());
    let (Some(Some(size)), Some(Some(complete)), None) = (numbers.next(), numbers.next(), numbers.next()) else {
        return Vec::new();
    };
    if size == 0 {
        return Vec::new();
    }
    (0..complete.div_ceil(size))
        .map(|i| key.variant_id(&slice_variant(i * size)))
        .collect()
}

/// The variant ids a Vary marker lists, wherever its body is (a marker
/// larger than `max_memory_object` is only on disk).
async fn marker_ids(marker: &Stored) -> Vec<ObjectId> {
    let mut body = Vec::new();
    let mut chunks = marker.body.read(0..marker.len);
    while let Some(Ok(c)) = chunks.next().await {
        body.extend_from_slice(&c);
    }
    parse_ids(&body)
}

fn parse_ids(body: &[u8]) -> Vec<ObjectId> {
    std::str::from_utf8(body)
        .unwrap_or("")
        .lines()
        .filter_map(ObjectId::from_hex)
        .collect()
}

/// Stores one response while it streams: whole in memory when small, to a
/// temporary file on disk (published on `commit`).
pub struct StoreSink<'a> {
    cache: &'a Cache,
    id: ObjectId,
    meta: StoredMeta,
    memory: Option<Vec<Bytes>>,
    size: u64,
    disk: Option<DiskWriter>,
}

impl StoreSink<'_> {
    /// Adds body bytes; false once the object cannot be stored any more
    /// (too large, disk error), after which the sink should be dropped.
    pub async fn data(&mut self, data: &Bytes) -> bool {
        self.size += data.len() as u64;
        if self.size > self.cache.max_object {
            return false;
        }
        if let Some(chunks) = self.memory.as_mut()
            && self.cache.memory.admits(self.size)
        {
            // The disk writer gets the body from the memory tier's copy at
            // the commit: one copy of the bytes, not two.
            chunks.push(data.clone());
            return true;
        }
        // Too large for the memory tier after all: the disk writer takes
        // what was kept for it.
        if let Some(kept) = self.memory.take() {
            for c in &kept {
                if !self.write_disk(c).await {
                    break;
                }
            }
        }
        self.write_disk(data).await
    }

    /// Whether the body so far is kept in memory for the memory tier (or
    /// for the disk writer's commit): it fits `max_memory_object`.
    pub fn keeps_in_memory(&self) -> bool {
        self.memory.is_some()
    }

    /// Whether the body is still being written to disk (a writer that
    /// failed or gave up is dropped).
    pub fn writes_to_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// Body bytes the disk writer has written out to its file so far (0
    /// without a writer, or before its file exists).
    pub fn disk_written(&self) -> u64 {
        self.disk.as_ref().map_or(0, DiskWriter::written)
    }

    /// The disk writer's file, for requests that follow the fetch from it
    /// (`flight::Leader::on_disk`).
    pub fn disk_tap(&self) -> Option<super::disk::WriteTap> {
        self.disk.as_ref().and_then(DiskWriter::tap)
    }

    /// Writes body bytes to the disk writer, dropping it on an error;
    /// false when there is none (left).
    async fn write_disk(&mut self, data: &[u8]) -> bool {
        if let Some(w) = self.disk.as_mut()
            && let Err(e) = w.write(data).await
        {
            tracing::warn!(key = self.meta.key, "disk cache write failed: {e}");
            self.disk = None;
        }
        self.disk.is_some()
    }

    /// The body is complete: publish the object.
    pub async fn commit(self) {
        let expires = expires_hint(&self.cache.policy, &self.meta);
        // With `memory_cache_mode = "disk"` the body is kept only for the
        // disk writer (its chunks go out as they are, in one write): the
        // memory tier takes the object when it is hit.
        let disk_mode = self.cache.memory_mode == crate::config::MemoryCacheMode::Disk;
        // The memory tier's body in one allocation of its own: the chunks
        // are slices of the origin's read buffers, which they would keep.
        let whole = |chunks: &[Bytes]| {
            let mut body = BytesMut::with_capacity(usize::try_from(self.size).unwrap_or(0));
            for c in chunks {
                body.extend_from_slice(c);
            }
            Arc::new(MemObject {
                meta: Arc::new(self.meta.clone()),
                body: body.freeze(),
            })
        };
        let in_memory = match &self.memory {
            Some(chunks) if !disk_mode => {
                let object = whole(chunks);
                self.cache.memory.insert(self.id, object.clone());
                Some(object)
            }
            _ => None,
        };
        let on_disk = match self.disk {
            Some(w) => {
                let rest = match &in_memory {
                    Some(object) => vec![object.body.clone()],
                    None => self.memory.clone().unwrap_or_default(),
                };
                match w.commit_with(rest, expires).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(key = self.meta.key, "disk cache commit failed: {e}");
                        false
                    }
                }
            }
            None => false,
        };
        match (&in_memory, &self.memory) {
            (Some(_), _) => {}
            // The disk could not take it: memory rather than nowhere.
            (None, Some(chunks)) if !on_disk => self.cache.memory.insert(self.id, whole(chunks)),
            // Not in memory (too large for it, or kept for disk hits): an
            // older version there must not be found instead of this one.
            _ => self.cache.memory.remove(self.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Size;
    use std::time::Duration;

    fn cache(dir: &std::path::Path) -> Cache {
        let cfg = CacheConfig {
            dir: dir.to_path_buf(),
            disk: Size(64 << 20),
            memory: Size(16 << 20),
            ..CacheConfig::default()
        };
        Cache::new(&cfg, &[], BlockingPool::new(2, 16)).expect("cache")
    }

    fn meta(key: &CacheKey, at: u64) -> StoredMeta {
        StoredMeta {
            key: key.text().to_string(),
            variant: Vec::new(),
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            request_time: UNIX_EPOCH + Duration::from_millis(at),
            response_time: UNIX_EPOCH + Duration::from_millis(at + 1),
            origin: None,
            derived: Default::default(),
        }
    }

    async fn store(c: &Cache, key: &CacheKey, meta: StoredMeta, body: &Bytes) {
        let mut sink = c.sink(key, meta, &[], Some(body.len() as u64)).await;
        assert!(sink.data(body).await);
        sink.commit().await;
    }

    fn mirrored(s: &Stored) -> bool {
        matches!(s.body, StoredBody::Mirrored { .. })
    }

    fn memory_bytes(s: &Stored) -> &Bytes {
        match &s.body {
            StoredBody::Memory(b) | StoredBody::Mirrored { memory: b, .. } => b,
            _ => panic!("not a memory-tier body"),
        }
    }

    /// The whole body of `s`, read from wherever it is.
    async fn body_of(s: &Stored) -> Vec<u8> {
        let mut out = Vec::new();
        let mut chunks = s.body.read(0..s.len);
        while let Some(c) = chunks.next().await {
            out.extend_from_slice(&c.expect("read"));
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bodies_kept_for_memory_and_bodies_that_outgrow_it_reach_the_disk_whole() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path());
        c.disk().expect("disk tier").wait_scan().await;
        // Kept whole for the memory tier: the disk writer gets its copy.
        let small_key = c.key("http", "h", "/kept");
        let small: Bytes = (0..64u32 << 10).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        let mut sink = c.sink(&small_key, meta(&small_key, 1_700_000_000_000), &[], None).await;
        for part in small.chunks(10_000) {
            assert!(sink.data(&Bytes::copy_from_slice(part)).await);
        }
        sink.commit().await;
        // No length, and past max_memory_object (1 MiB) midway: what was
        // kept for memory goes to disk first, then the rest.
        let big_key = c.key("http", "h", "/outgrown");
        let big: Bytes = (0..(3u32 << 19))
            .map(|i| (i / 1000 % 256) as u8)
            .collect::<Vec<u8>>()
            .into();
        let mut sink = c.sink(&big_key, meta(&big_key, 1_700_000_000_000), &[], None).await;
        for part in big.chunks(100_000) {
            assert!(sink.data(&Bytes::copy_from_slice(part)).await);
        }
        sink.commit().await;
        drop(c);
        // A new process (an empty memory tier): both come from their files.
        let c = cache(dir.path());
        c.disk().expect("disk tier").wait_scan().await;
        let none = HeaderMap::new();
        for (key, body) in [(&small_key, &small), (&big_key, &big)] {
            let s = c.lookup(key, &none).await.unwrap().expect("stored on disk");
            assert_eq!(s.len, body.len() as u64);
            assert!(body_of(&s).await == body[..], "{} read back as stored", key.text());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_memory_object_is_mirrored_only_by_a_checked_file_of_its_own_version() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path());
        let disk = c.disk().expect("disk tier").clone();
        disk.wait_scan().await;
        let key = c.key("http", "h", "/big");
        let v1 = Bytes::from(vec![b'1'; 64 << 10]);
        store(&c, &key, meta(&key, 1_700_000_000_000), &v1).await;
        let none = HeaderMap::new();
        // Not checked yet: served from memory; the lookup starts the check.
        let s = c.lookup(&key, &none).await.unwrap().unwrap();
        assert!(!mirrored(&s) && memory_bytes(&s) == &v1);
        let mut checked = false;
        for _ in 0..100 {
            if disk.held_quiet(key.id()).is_some() {
                checked = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(checked, "the background check held the file");
        let s = c.lookup(&key, &none).await.unwrap().unwrap();
        assert!(mirrored(&s), "same version: sent from the file");
        let file = s.body.sendable().expect("a file to send");
        assert_eq!(file.body_len, v1.len() as u64);

        // A new version in memory before its disk commit (StoreSink::commit
        // inserts it first), same length: never paired with the old file.
        let v2 = Bytes::from(vec![b'2'; 64 << 10]);
        let newer = Arc::new(MemObject {
            meta: Arc::new(meta(&key, 1_700_000_005_000)),
            body: v2.clone(),
        });
        c.memory.insert(key.id(), newer);
        let s = c.lookup(&key, &none).await.unwrap().unwrap();
        assert!(!mirrored(&s) && memory_bytes(&s) == &v2);
        assert!(s.body.sendable().is_none());
        // A 304's refreshed metadata in memory before the disk update: the
        // body is the same, but the pair is told apart the same way.
        let refreshed = Arc::new(MemObject {
            meta: Arc::new(meta(&key, 1_700_000_009_000)),
            body: v1.clone(),
        });
        c.memory.insert(key.id(), refreshed);
        let s = c.lookup(&key, &none).await.unwrap().unwrap();
        assert!(!mirrored(&s));
        // Small bodies are copied, never sent from a file.
        let small_key = c.key("http", "h", "/small");
        let small = Bytes::from(vec![b's'; 100]);
        store(&c, &small_key, meta(&small_key, 1_700_000_000_000), &small).await;
        for _ in 0..3 {
            let s = c.lookup(&small_key, &none).await.unwrap().unwrap();
            assert!(!mirrored(&s));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_object_stored_under_another_keys_id_is_never_its_hit() {
        // What a 128-bit id collision (an accidental one, or one crafted
        // against xxh3, which is not keyed) would leave: the object of one
        // key where another key's id leads.
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path());
        c.disk().expect("disk tier").wait_scan().await;
        let asked = c.key("http", "h", "/asked");
        let other = c.key("http", "h", "/other");
        let none = HeaderMap::new();
        let body = Bytes::from_static(b"the other object");
        c.memory.insert(
            asked.id(),
            Arc::new(MemObject {
                meta: Arc::new(meta(&other, 1_700_000_000_000)),
                body: body.clone(),
            }),
        );
        assert!(
            c.lookup(&asked, &none).await.unwrap().is_none(),
            "another key's object served"
        );
        // Its own key's object is a hit.
        c.memory.insert(
            asked.id(),
            Arc::new(MemObject {
                meta: Arc::new(meta(&asked, 1_700_000_000_000)),
                body: body.clone(),
            }),
        );
        let hit = c.lookup(&asked, &none).await.unwrap().expect("its own object");
        assert_eq!(hit.meta.key, asked.text());
    }
}
