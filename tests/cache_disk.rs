//! The disk tier through its public API: round trips (0 B to 256 MiB,
//! streamed with bounded memory), corruption and truncation never served,
//! tmp files left by a crash cleaned, restart with a background index
//! rebuild (past a FIFO put in place of a file), GC order, concurrent
//! writers, metadata updates, and a real kill -9 of a process in the
//! middle of writing.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode};
use portico::cache::disk::{DiskStore, READ_CHUNK};
use portico::cache::key::{CacheKey, ObjectId};
use portico::cache::object::StoredMeta;
use portico::config::{CacheConfig, GcMode, Size};
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn config(dir: &Path) -> CacheConfig {
    CacheConfig {
        dir: dir.to_path_buf(),
        disk: Size(4 << 30),
        gc: GcMode::Scheduled,
        ..CacheConfig::default()
    }
}

fn meta(url: &str) -> StoredMeta {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/octet-stream"));
    StoredMeta {
        key: url.to_string(),
        variant: vec![],
        status: StatusCode::OK,
        headers,
        request_time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        response_time: UNIX_EPOCH + Duration::from_secs(1_700_000_001),
        origin: None,
        derived: Default::default(),
    }
}

fn id_of(url: &str) -> ObjectId {
    CacheKey::from_url(url, false).unwrap().id()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Deterministic body bytes.
fn body(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn put(store: &DiskStore, url: &str, data: &[u8], expires: u64) -> ObjectId {
    let id = id_of(url);
    let mut w = store.writer(id, &meta(url));
    for c in data.chunks(10_000) {
        w.write(c).await.unwrap();
    }
    w.commit(expires).await.unwrap();
    id
}

async fn read_all(store: &DiskStore, id: ObjectId) -> Option<std::io::Result<Vec<u8>>> {
    let mut o = store.open(id).await?;
    let mut out = Vec::new();
    loop {
        match o.body.chunk().await {
            Ok(Some(c)) => {
                assert!(c.len() <= READ_CHUNK);
                out.extend_from_slice(&c);
            }
            Ok(None) => return Some(Ok(out)),
            Err(e) => return Some(Err(e)),
        }
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// Object files under `dir` and what the budget charges for them: each
/// file's size rounded up to the directory's block size.
fn object_bytes_on_disk(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let block = fs::metadata(dir).unwrap().blksize().clamp(512, 1 << 20);
    let files = object_files(dir);
    (
        files.len() as u64,
        files
            .iter()
            .map(|p| fs::metadata(p).unwrap().len().div_ceil(block) * block)
            .sum(),
    )
}

fn object_files(dir: &Path) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| !p.starts_with(dir.join("tmp")))
        .collect()
}

fn tmp_count(dir: &Path) -> usize {
    fs::read_dir(dir.join("tmp")).map_or(0, |d| d.count())
}

fn rss_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_small_and_medium() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::start(&config(dir.path())).unwrap();
    store.wait_scan().await;
    for (i, len) in [0usize, 1, 1 << 20].into_iter().enumerate() {
        let url = format!("http://example.com/obj{i}");
        let data = body(len, i as u8);
        let id = put(&store, &url, &data, 0).await;
        assert!(store.contains(id).await);
        let o = store.open(id).await.unwrap();
        assert_eq!(*o.meta, meta(&url));
        assert_eq!(o.body_len, len as u64);
        drop(o);
        assert_eq!(read_all(&store, id).await.unwrap().unwrap(), data, "len {len}");
        let file_len = fs::metadata(store.path_of(id)).unwrap().len();
        assert_eq!(file_len, 12 + meta(&url).encode().len() as u64 + len as u64 + 32);
    }
    let s = store.stats().snapshot();
    assert_eq!(s.objects, 3);
    assert_eq!((s.objects, s.bytes), object_bytes_on_disk(dir.path()));
    assert_eq!(tmp_count(dir.path()), 0);
    assert!(store.open(id_of("http://example.com/absent")).await.is_none());
}

/// Chunk `i` of the big object: distinct per chunk so misordering shows.
fn big_chunk(base: &[u8], i: u64) -> Bytes {
    let mut b = BytesMut::from(base);
    b[..8].copy_from_slice(&i.to_le_bytes());
    b.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_object_streams_with_bounded_memory() {
    const LEN: u64 = 256 << 20;
    // Streaming holds a few chunks (observed: 1-2 MiB of growth); buffering
    // the object would add 256 MiB. The margin absorbs allocator noise.
    const LIMIT_KIB: u64 = 96 << 10;
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::start(&config(dir.path())).unwrap();
    store.wait_scan().await;
    let url = "http://example.com/big";
    let id = id_of(url);
    let base = body(READ_CHUNK, 7);
    let baseline = rss_kib();
    let mut peak = baseline;
    let mut w = store.writer(id, &meta(url));
    let chunks = LEN / READ_CHUNK as u64;
    for i in 0..chunks {
        w.write_bytes(big_chunk(&base, i)).await.unwrap();
        if i.is_multiple_of(64) {
            peak = peak.max(rss_kib());
        }
    }
    w.commit(0).await.unwrap();
    assert_eq!(
        fs::metadata(store.path_of(id)).unwrap().len(),
        LEN + 12 + meta(url).encode().len() as u64 + 32
    );
    let mut o = store.open(id).await.unwrap();
    assert_eq!(o.body_len, LEN);
    let mut i = 0u64;
    while let Some(c) = o.body.chunk().await.unwrap() {
        assert_eq!(c, big_chunk(&base, i), "chunk {i}");
        i += 1;
        if i.is_multiple_of(64) {
            peak = peak.max(rss_kib());
        }
    }
    assert_eq!(i, chunks);
    eprintln!("RSS {baseline} KiB before, peak {peak} KiB while streaming 256 MiB");
    assert!(
        peak - baseline < LIMIT_KIB,
        "RSS grew by {} KiB streaming a 256 MiB object",
        peak - baseline
    );
    assert_eq!(store.stats().snapshot().checksum_failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_file_is_not_served_and_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let a = put(&store, "http://h/a", &body(100_000, 1), 0).await;
    let b = put(&store, "http://h/b", &body(100_000, 2), 0).await;
    let cc = put(&store, "http://h/c", &body(200_000, 3), 0).await;
    // Truncated at rest: open refuses it and removes it.
    let pa = store.path_of(a);
    let len = fs::metadata(&pa).unwrap().len();
    File::options().write(true).open(&pa).unwrap().set_len(len - 3).unwrap();
    assert!(store.open(a).await.is_none());
    assert!(!pa.exists());
    assert!(store.entry(a).is_none());
    // Truncated while being read: the read errors, and the file goes.
    let mut o = store.open(cc).await.unwrap();
    let first = o.body.chunk().await.unwrap().unwrap();
    assert_eq!(first.len(), READ_CHUNK);
    let pc = store.path_of(cc);
    File::options().write(true).open(&pc).unwrap().set_len(100_000).unwrap();
    let mut err = None;
    loop {
        match o.body.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    assert!(err.is_some(), "a truncated body must not read to a clean end");
    assert!(!pc.exists());
    // Truncated while the server was down: the scan removes it.
    drop(o);
    let pb = store.path_of(b);
    drop(store);
    let len = fs::metadata(&pb).unwrap().len();
    File::options().write(true).open(&pb).unwrap().set_len(len - 5).unwrap();
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    assert!(!pb.exists());
    assert!(store.open(b).await.is_none());
    assert_eq!(store.stats().snapshot().objects, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_fails_checksum_and_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::start(&config(dir.path())).unwrap();
    store.wait_scan().await;
    for (n, len) in [(0, 1usize), (1, 300_000)] {
        let url = format!("http://h/flip{n}");
        let id = put(&store, &url, &body(len, 9), 0).await;
        let p = store.path_of(id);
        let f = File::options().read(true).write(true).open(&p).unwrap();
        let off = 12 + meta(&url).encode().len() as u64 + len as u64 / 2;
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, off).unwrap();
        f.write_all_at(&[byte[0] ^ 0x10], off).unwrap();
        drop(f);
        // The envelope is fine, so it opens; the body read fails at the end.
        let mut o = store.open(id).await.unwrap();
        let mut got = 0;
        let err = loop {
            match o.body.chunk().await {
                Ok(Some(c)) => got += c.len(),
                Ok(None) => panic!("corrupt body read to a clean end"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(got < len, "the last chunk is withheld");
        assert!(o.body.chunk().await.is_err(), "stays failed");
        assert!(!p.exists());
        assert!(store.open(id).await.is_none());
    }
    let s = store.stats().snapshot();
    assert_eq!(s.checksum_failures, 2);
    assert_eq!(s.objects, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_tmp_files_are_removed_and_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    // A writer that "dies" mid-write: leaked, its tmp file stays.
    let id = id_of("http://h/partial");
    let mut w = store.writer(id, &meta("http://h/partial"));
    w.write(&body(600_000, 1)).await.unwrap();
    std::mem::forget(w);
    // A partial copy of a real object dropped into tmp by hand.
    let full = put(&store, "http://h/full", &body(50_000, 2), 0).await;
    let bytes = fs::read(store.path_of(full)).unwrap();
    fs::write(
        dir.path().join("tmp").join(format!("{}.999999999.1.0", full.hex())),
        &bytes[..20_000],
    )
    .unwrap();
    assert_eq!(tmp_count(dir.path()), 2);
    assert!(store.open(id).await.is_none(), "a tmp file is never visible");
    drop(store);
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    assert_eq!(tmp_count(dir.path()), 0);
    assert_eq!(store.stats().snapshot().tmp_removed, 2);
    assert!(store.open(id).await.is_none());
    assert_eq!(read_all(&store, full).await.unwrap().unwrap(), body(50_000, 2));
    assert_eq!(store.stats().snapshot().objects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_the_index_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let mut ids = Vec::new();
    for i in 0..3000 {
        let len = (i * 37) % 5000;
        ids.push(put(&store, &format!("http://h/{i}"), &body(len, i as u8), 0).await);
    }
    let (n, bytes) = object_bytes_on_disk(dir.path());
    assert_eq!(n, 3000);
    assert_eq!(store.stats().snapshot().bytes, bytes);
    drop(store);

    let t = Instant::now();
    let store = DiskStore::start(&c).unwrap();
    let usable = t.elapsed();
    // Served by path before the scan gets to it.
    assert_eq!(
        read_all(&store, ids[2999]).await.unwrap().unwrap(),
        body((2999 * 37) % 5000, 2999u32 as u8)
    );
    // Commits racing the scan: a replacement and new objects.
    put(&store, "http://h/0", &body(10, 0), 0).await;
    for i in 3000..3100 {
        put(&store, &format!("http://h/{i}"), &body(100, 1), 0).await;
    }
    let during = store.scan_progress();
    store.wait_scan().await;
    let p = store.scan_progress();
    assert!(p.done);
    assert_eq!(p.dirs_done, p.dirs_total);
    eprintln!(
        "3000 objects: usable after {usable:?}, index complete after {:?} (progress when racing: {during:?})",
        p.elapsed
    );
    let s = store.stats().snapshot();
    assert_eq!(
        (s.objects, s.bytes),
        object_bytes_on_disk(dir.path()),
        "no double counting"
    );
    assert_eq!(s.objects, 3100);
    for id in &ids[..50] {
        assert!(store.contains(*id).await);
    }
    assert_eq!(read_all(&store, ids[0]).await.unwrap().unwrap(), body(10, 0));
}

fn set_times(path: &Path, secs_ago: u64) {
    let t = SystemTime::now() - Duration::from_secs(secs_ago);
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_times(FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_evicts_expired_then_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let now = now();
    // 3 expired but recently used, 7 fresh with staggered access times.
    let mut expired = vec![];
    for i in 0..3 {
        expired.push(put(&store, &format!("http://h/e{i}"), &body(10_000, 1), now - 100).await);
    }
    let mut fresh = vec![];
    for i in 0..7 {
        let id = put(&store, &format!("http://h/f{i}"), &body(10_000, 1), now + 3600).await;
        set_times(&store.path_of(id), 7000 - i * 1000);
        fresh.push(id);
    }
    let size = fs::metadata(store.path_of(fresh[0])).unwrap().len();
    drop(store);
    // Room for 4.5 objects at the low watermark.
    let block = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(dir.path()).unwrap().blksize().clamp(512, 1 << 20)
    };
    let charged = size.div_ceil(block) * block;
    c.disk = Size(charged * 9);
    c.watermarks = [50, 90];
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    assert_eq!(store.used(), store.charged(size) * 10);
    let r = store.gc().await;
    assert_eq!((r.evicted, r.expired), (6, 3));
    assert!(store.used() <= store.budget().low);
    for id in &expired {
        assert!(!store.contains(*id).await);
    }
    for (i, id) in fresh.iter().enumerate() {
        assert_eq!(store.contains(*id).await, i >= 3, "fresh{i}");
    }
    let s = store.stats().snapshot();
    assert_eq!((s.evictions, s.bytes_evicted, s.gc_runs), (6, 6 * size, 1));
    assert_eq!((s.objects, s.bytes), object_bytes_on_disk(dir.path()));
    // Below the low watermark a pass does nothing.
    assert_eq!(store.gc().await.evicted, 0);
}

/// A pass that frees a little of a large index sorts only the lowest
/// ranked candidates: what it evicts is still exactly the least recently
/// used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_of_a_few_objects_among_many_evicts_exactly_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let now = now();
    let mut ids = vec![];
    for i in 0..300u64 {
        let id = put(&store, &format!("http://h/many{i}"), &body(1_000, 1), now + 3600).await;
        // Object 0 used longest ago, in no order of writing.
        set_times(&store.path_of(id), 400_000 - ((i * 7) % 300) * 1000);
        ids.push(id);
    }
    let size = fs::metadata(store.path_of(ids[0])).unwrap().len();
    drop(store);
    let block = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(dir.path()).unwrap().blksize().clamp(512, 1 << 20)
    };
    let charged = size.div_ceil(block) * block;
    // Room for 294 at the low watermark: 6 go.
    c.disk = Size(charged * 300);
    c.watermarks = [98, 99];
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let r = store.gc().await;
    assert_eq!(r.evicted, 6);
    for (i, id) in ids.iter().enumerate() {
        let rank = (i as u64 * 7) % 300;
        assert_eq!(store.contains(*id).await, rank >= 6, "object {i}, rank {rank}");
    }
}

/// When the lowest-ranked candidates are much smaller than the average,
/// the first ones sorted do not free enough: the pass sorts the rest and
/// goes on, still in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_whose_first_choices_are_small_goes_on_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // By recency alone (the other policies weigh size).
    c.replacement = portico::config::Replacement::Lru;
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let now = now();
    // 300 small objects used longest ago, then 20 large ones.
    let mut ids = vec![];
    for i in 0..320u64 {
        let len = if i < 300 { 100 } else { 1 << 20 };
        let id = put(&store, &format!("http://h/mixed{i}"), &body(len, 1), now + 3600).await;
        set_times(&store.path_of(id), 400_000 - i * 1000);
        ids.push(id);
    }
    let charged = |id: ObjectId| store.charged(fs::metadata(store.path_of(id)).unwrap().len());
    let (small, large) = (charged(ids[0]), charged(ids[300]));
    drop(store);
    // Room for all but the small ones and 5 large: far more than the
    // first sorted (twice the need at the average size, plus 64: about
    // 260 of the small ones) free.
    let total = 300 * small + 20 * large;
    c.disk = Size(total);
    let keep = total - 300 * small - 5 * large;
    let low = (keep * 100).div_ceil(total);
    c.watermarks = [u8::try_from(low).unwrap(), 99];
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let target = store.budget().low;
    let r = store.gc().await;
    assert!(store.used() <= target);
    let mut evicted = vec![];
    for (i, id) in ids.iter().enumerate() {
        if !store.contains(*id).await {
            evicted.push(i);
        }
    }
    // The oldest first, whatever their size: all the small ones, then the
    // oldest large ones, as many as it takes.
    let n = evicted.len();
    assert!(n > 300 && r.evicted as usize == n, "{evicted:?}");
    assert_eq!(evicted, (0..n).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_recently_used_objects_and_runs_automatically() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.disk = Size(200_000);
    c.watermarks = [50, 90];
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    // Hits count: objects used since they were written outlive the others.
    // As through a proxy, each object is looked up (a miss) before it is
    // stored, and a hit is a lookup counted (`frequency`) and an access
    // (the heap policies).
    let mut ids = vec![];
    for i in 0..8 {
        let url = format!("http://h/{i}");
        store.asked(id_of(&url));
        ids.push(put(&store, &url, &body(20_000, 1), 0).await);
    }
    for id in &ids[..4] {
        store.asked(*id);
        assert!(store.touch(*id));
    }
    assert!(store.used() <= 180_000);
    store.gc().await;
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(store.contains(*id).await, i < 4, "object {i}");
    }
    drop(store);
    // Automatic: commits over the high watermark wake the GC thread.
    c.gc = GcMode::Auto;
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    for i in 100..120 {
        put(&store, &format!("http://h/{i}"), &body(20_000, 1), 0).await;
    }
    let t = Instant::now();
    while store.stats().snapshot().gc_runs == 0 || store.used() > 180_000 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "auto gc did not run: {:?}",
            store.stats().snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.stats().snapshot().evictions > 0);
    // Passes run one at a time: once this one returns the automatic one is over.
    store.gc().await;
    assert!(store.used() <= 100_000);
    assert_eq!(
        (store.stats().snapshot().objects, store.used()),
        object_bytes_on_disk(dir.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_of_one_id_leave_one_valid_object() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::start(&config(dir.path())).unwrap();
    store.wait_scan().await;
    let url = "http://h/contended";
    let id = id_of(url);
    let mut tasks = vec![];
    for n in 0..8u8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut w = store.writer(id, &meta(url));
            for _ in 0..10 {
                w.write(&vec![n; 30_000]).await.unwrap();
                tokio::task::yield_now().await;
            }
            w.commit(0).await.unwrap();
        }));
    }
    // Readers racing the writers only ever see whole objects.
    for _ in 0..20 {
        if let Some(r) = read_all(&store, id).await {
            let data = r.unwrap();
            assert_eq!(data.len(), 300_000);
            assert!(data.iter().all(|b| *b == data[0]));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let data = read_all(&store, id).await.unwrap().unwrap();
    assert_eq!(data.len(), 300_000);
    assert!(data.iter().all(|b| *b == data[0]));
    let s = store.stats().snapshot();
    assert_eq!((s.objects, s.writes), (1, 8));
    assert_eq!((s.objects, s.bytes), object_bytes_on_disk(dir.path()));
    assert_eq!(tmp_count(dir.path()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_meta_replaces_headers_and_keeps_old_readers_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::start(&config(dir.path())).unwrap();
    store.wait_scan().await;
    let url = "http://h/revalidated";
    let data = body(500_000, 4);
    let id = put(&store, url, &data, 100).await;
    let mut old = store.open(id).await.unwrap();
    let first = old.body.chunk().await.unwrap().unwrap();
    let mut m = meta(url);
    m.headers.insert("etag", HeaderValue::from_static("\"v2\""));
    m.response_time = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    assert!(store.update_meta(id, &m, 200).await.unwrap());
    // The old reader finishes the old file, checksum and all.
    let mut rest = first.to_vec();
    while let Some(c) = old.body.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    assert_eq!(rest, data);
    let new = store.open(id).await.unwrap();
    assert_eq!(*new.meta, m);
    assert_eq!(new.expires, 200);
    drop(new);
    assert_eq!(read_all(&store, id).await.unwrap().unwrap(), data);
    assert_eq!(store.entry(id).unwrap().expires, 200);
    assert_eq!(
        (store.stats().snapshot().objects, store.used()),
        object_bytes_on_disk(dir.path())
    );
    assert!(!store.update_meta(id_of("http://h/none"), &m, 0).await.unwrap());
    // A corrupt body is not carried over.
    let p = store.path_of(id);
    let f = File::options().write(true).open(&p).unwrap();
    f.write_all_at(b"XX", 12 + m.encode().len() as u64 + 10).unwrap();
    assert!(store.update_meta(id, &meta(url), 0).await.is_err());
    assert!(!p.exists());
    assert_eq!(tmp_count(dir.path()), 0);
}

const KILL9_ENV: &str = "PORTICO_TEST_KILL9_DIR";

/// Not a test on its own: when re-executed by `kill_9_mid_write` with the
/// variable set, commits one object, then writes a second one slowly
/// until killed.
#[test]
fn kill9_child_writer() {
    let Ok(dir) = std::env::var(KILL9_ENV) else { return };
    let store = DiskStore::start_offline(&config(Path::new(&dir)), &mut |_| {}).unwrap();
    let mut w = store
        .writer_blocking(id_of("http://h/committed"), &meta("http://h/committed"))
        .unwrap();
    w.write_blocking(&body(100_000, 5)).unwrap();
    w.commit_blocking(0).unwrap();
    let mut w = store
        .writer_blocking(id_of("http://h/big"), &meta("http://h/big"))
        .unwrap();
    let chunk = body(64 << 10, 6);
    for _ in 0..100_000 {
        w.write_blocking(&chunk).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("was not killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["kill9_child_writer", "--exact", "--nocapture", "--test-threads=1"])
        .env(KILL9_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the big object's tmp file holds a few MiB.
    let t = Instant::now();
    loop {
        let big: u64 = fs::read_dir(dir.path().join("tmp"))
            .map(|d| d.flatten().map(|e| e.metadata().map_or(0, |m| m.len())).sum())
            .unwrap_or(0);
        if big > 4 << 20 {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "writer exited early");
        assert!(t.elapsed() < Duration::from_secs(60), "writer too slow");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(tmp_count(dir.path()), 1, "the killed writer left its tmp file");
    let store = DiskStore::start(&config(dir.path())).unwrap();
    assert!(store.open(id_of("http://h/big")).await.is_none());
    store.wait_scan().await;
    assert_eq!(tmp_count(dir.path()), 0);
    assert!(store.open(id_of("http://h/big")).await.is_none());
    assert_eq!(
        read_all(&store, id_of("http://h/committed")).await.unwrap().unwrap(),
        body(100_000, 5)
    );
    let s = store.stats().snapshot();
    assert_eq!((s.objects, s.tmp_removed, s.corrupt_removed), (1, 1, 0));
    assert_eq!((s.objects, s.bytes), object_bytes_on_disk(dir.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_counts_the_blocks_small_objects_occupy_not_their_sizes() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // 300 objects of about 300 bytes: 90 KB of content, but each file
    // takes at least one whole block (4 KiB here): about 1.2 MB on disk.
    c.disk = Size(600 * 1024);
    c.watermarks = [50, 90];
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    for i in 0..300 {
        put(&store, &format!("http://h/small{i}"), &body(100, 1), now() + 3600).await;
    }
    let files = object_files(dir.path());
    let apparent: u64 = files.iter().map(|p| fs::metadata(p).unwrap().len()).sum();
    let allocated: u64 = files.iter().map(|p| fs::metadata(p).unwrap().blocks() * 512).sum();
    // Portico's count is what the files occupy, not the sum of their sizes.
    assert_eq!(store.used(), object_bytes_on_disk(dir.path()).1);
    assert!(
        store.used() >= 4 * apparent,
        "used {} apparent {apparent}",
        store.used()
    );
    if allocated > 0 {
        // (A file system that packs small files, such as btrfs inlining
        // them, allocates less; the budget stays on the safe side.)
        assert!(
            store.used() >= allocated * 9 / 10,
            "used {} allocated {allocated}",
            store.used()
        );
    }
    // Over the budget by blocks (though under it by sizes): the GC evicts
    // down to the low watermark, and the files left fit the budget.
    assert!(apparent < c.disk.bytes() && store.used() > c.disk.bytes());
    let r = store.gc().await;
    assert!(r.evicted > 100, "{r:?}");
    assert!(store.used() <= store.budget().low);
    let left = object_bytes_on_disk(dir.path());
    assert_eq!((store.stats().snapshot().objects, store.used()), left);
    assert!(left.1 <= c.disk.bytes() / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_file_is_dropped_when_its_object_is_replaced_evicted_or_removed() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::start(&config(dir.path())).unwrap();
    store.wait_scan().await;
    let url = "http://h/held";
    let v1 = body(150_000, 1);
    let id = put(&store, url, &v1, 0).await;
    // Not held before its checksum has matched once in this process.
    assert!(store.held(id).is_none());
    assert_eq!(read_all(&store, id).await.unwrap().unwrap(), v1);
    let held = store.held(id).expect("held after a checked read");
    assert_eq!(store.held_files(), 1);
    // Replaced while held: the next lookup sees the new object; whoever
    // still has the old file reads the old bytes, whole and right.
    let v2 = body(120_000, 2);
    put(&store, url, &v2, 0).await;
    assert!(store.held(id).is_none());
    assert_eq!(held.read_at(0, u64::MAX).await.unwrap(), v1[..READ_CHUNK]);
    assert_eq!(held.read_at(100, 110).await.unwrap(), v1[100..110]);
    assert_eq!(held.read_all().await.unwrap(), v1);
    assert_eq!(read_all(&store, id).await.unwrap().unwrap(), v2);
    assert_eq!(store.held(id).expect("the new file held").body_len, 120_000);
    // Evicted by the GC while held.
    let report = store.gc_blocking(0, false, &mut |_| {});
    assert_eq!(report.evicted, 1);
    assert!(store.held(id).is_none());
    assert!(store.open(id).await.is_none());
    assert_eq!(store.held_files(), 0);
    // Removed (a purge) while held.
    let id = put(&store, url, &v1, 0).await;
    assert_eq!(read_all(&store, id).await.unwrap().unwrap(), v1);
    let held = store.held(id).expect("held");
    assert!(store.remove(id).await);
    assert!(store.held(id).is_none());
    assert!(store.open(id).await.is_none());
    assert_eq!(held.read_all().await.unwrap(), v1, "an open file outlives its name");
    let s = store.stats().snapshot();
    assert!(s.open_file_hits >= 2 && s.open_file_misses >= 3, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_whose_checksum_failed_is_never_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::start(&config(dir.path())).unwrap();
    store.wait_scan().await;
    let url = "http://h/bad";
    let id = put(&store, url, &body(100_000, 3), 0).await;
    let p = store.path_of(id);
    let f = File::options().read(true).write(true).open(&p).unwrap();
    let off = 12 + meta(url).encode().len() as u64 + 50_000;
    f.write_all_at(b"\xff\xfe", off).unwrap();
    drop(f);
    assert!(read_all(&store, id).await.unwrap().is_err());
    assert!(store.held(id).is_none());
    assert_eq!(store.held_files(), 0);
    assert!(store.open(id).await.is_none());
    assert_eq!(store.stats().snapshot().checksum_failures, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_place_of_an_object_file_is_removed_by_the_scan_which_still_completes() {
    // Opening a FIFO waits for a writer: a scan that opened it would never
    // finish, and until it does every miss looks for files by path.
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let store = DiskStore::start(&c).unwrap();
    store.wait_scan().await;
    let kept = put(&store, "http://h/kept", &body(5000, 1), 0).await;
    let gone = put(&store, "http://h/fifo", &body(5000, 2), 0).await;
    let fifo = store.path_of(gone);
    drop(store);
    fs::remove_file(&fifo).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );

    let store = DiskStore::start(&c).unwrap();
    tokio::time::timeout(Duration::from_secs(10), store.wait_scan())
        .await
        .expect("the scan completes past the FIFO");
    assert!(!fifo.exists(), "the FIFO is removed");
    let s = store.stats().snapshot();
    assert_eq!((s.objects, s.corrupt_removed), (1, 1));
    assert_eq!(read_all(&store, kept).await.unwrap().unwrap(), body(5000, 1));
    assert!(read_all(&store, gone).await.is_none());
}
