//! Where the disk tier's file work runs (`cache.file_io`), through the real
//! binary: `inline` stores and serves objects on the worker threads, the
//! blocking pool running no job for them, and leaves the same whole files
//! on disk as the pool (a restarted server serves them); `auto` runs the
//! work inline for a directory on tmpfs and on the pool elsewhere; the
//! statistics say which (`cache.disk.file_io`) and count the inline jobs.
//! With the pool, a disk-tier open that has nothing to read from the device
//! is still done on the worker thread (`opens_nowait`), and so is a body
//! read the page cache holds (`reads_nowait`).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

/// A forward proxy whose memory tier keeps nothing over 4 KiB, so the
/// objects below live on disk only; `extra` goes into `[cache]`.
async fn proxy(cache_dir: &Path, extra: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\ndir = \"{}\"\nmemory = \"16MiB\"\nmax_memory_object = \"4KiB\"\n{extra}\n",
        cache_dir.display()
    ))
    .await
}

/// `/big`: 1 MiB of the pattern (several of the disk writer's 256 KiB
/// batches); any other path 100 KiB of it. Fresh for an hour; requests
/// counted.
async fn origin() -> (Origin, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    let origin = Origin::start(move |req| {
        n.fetch_add(1, Ordering::SeqCst);
        async move {
            let len = if req.uri.path() == "/big" { 1 << 20 } else { 100 << 10 };
            Response::ok("").generated(len).header("Cache-Control", "max-age=3600")
        }
    })
    .await;
    (origin, count)
}

/// A GET through the proxy; asserts the whole pattern body and returns
/// `X-Cache`.
async fn get(p: &Portico, origin: &Origin, path: &str) -> String {
    let o = origin.addr();
    let req = format!("GET http://{o}{path} HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request_timeout(p.addr(), req.as_bytes(), Duration::from_secs(30)).await);
    let len = if path == "/big" { 1 << 20 } else { 100 << 10 };
    assert_eq!((r.status, r.body.len()), (200, len), "{path}: {}", p.stderr());
    assert!(pattern_matches(0, &r.body), "{path}: the bytes of the body");
    r.header("x-cache").unwrap_or("<none>").to_string()
}

fn n(v: &serde_json::Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {path:?} in {v}"))
}

const POOL_JOBS: &[&str] = &["native_pool", "jobs"];
const INLINE_JOBS: &[&str] = &["cache", "disk", "inline_jobs"];
const WRITES: &[&str] = &["cache", "disk", "writes"];

/// Once the index is ready, fetches each of `paths` (each a miss) and
/// waits until all are stored; returns the statistics from before.
async fn store_all<S: AsRef<str>>(p: &Portico, origin: &Origin, paths: &[S]) -> serde_json::Value {
    stats_when(p, "the index ready", |s| s["cache"]["disk"]["index_ready"] == true).await;
    let before = stats_snapshot(p).await;
    for path in paths {
        assert_eq!(get(p, origin, path.as_ref()).await, "MISS");
    }
    let stored = n(&before, WRITES) + paths.len() as u64;
    stats_when(p, "all stored", |s| n(s, WRITES) == stored).await;
    before
}

/// Stores `/big` and `/small` (misses), then reads each from its file
/// twice (the first hit opens it, the second uses it held open); returns
/// the statistics before and after.
async fn store_and_hit(p: &Portico, origin: &Origin) -> (serde_json::Value, serde_json::Value) {
    let before = store_all(p, origin, &["/big", "/small"]).await;
    for path in ["/big", "/small", "/big", "/small"] {
        assert_eq!(get(p, origin, path).await, "HIT");
    }
    (before, stats_snapshot(p).await)
}

/// Asserts that the statistics say the file work runs inline and that the
/// pool ran no job between `before` and `after`; returns the inline jobs.
fn all_inline(before: &serde_json::Value, after: &serde_json::Value) -> u64 {
    assert_eq!(
        after["cache"]["disk"]["file_io"], "inline",
        "{}",
        after["cache"]["disk"]
    );
    assert_eq!(n(after, POOL_JOBS), n(before, POOL_JOBS), "{}", after["native_pool"]);
    n(after, INLINE_JOBS) - n(before, INLINE_JOBS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_file_work_stores_and_serves_objects_without_the_blocking_pool() {
    let cache = tempfile::tempdir().unwrap();
    let (origin, fetched) = origin().await;
    let p = proxy(cache.path(), "file_io = \"inline\"").await;
    let (before, after) = store_and_hit(&p, &origin).await;
    // Two commits, /big's earlier batches, two opens: at least five.
    let inline = all_inline(&before, &after);
    assert!(inline >= 5, "{inline} inline jobs: {}", after["cache"]["disk"]);
    assert_eq!(n(&after, &["cache", "disk", "open_file_misses"]), 2);
    assert_eq!(fetched.load(Ordering::SeqCst), 2);
    assert!(
        p.stderr()
            .contains("file work runs on the worker threads (cache.file_io = inline)")
    );

    // The files written on the worker threads are whole: a new server on
    // the same directory serves both from disk, checksum included.
    drop(p);
    let p = proxy(cache.path(), "file_io = \"inline\"").await;
    stats_when(&p, "the index rebuilt", |s| n(s, &["cache", "disk", "objects"]) == 2).await;
    for path in ["/big", "/small"] {
        assert_eq!(get(&p, &origin, path).await, "HIT");
    }
    assert_eq!(fetched.load(Ordering::SeqCst), 2);
    assert_eq!(n(&stats_snapshot(&p).await, &["cache", "disk", "checksum_failures"]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_runs_file_work_inline_on_tmpfs_and_on_the_blocking_pool_on_a_disk() {
    // /dev/shm is tmpfs on Linux; the build directory is on a disk.
    let on_tmpfs = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
    let on_disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (origin, _) = origin().await;

    let p = proxy(on_tmpfs.path(), "").await;
    let (before, after) = store_and_hit(&p, &origin).await;
    assert!(all_inline(&before, &after) > 0);
    assert!(
        p.stderr()
            .contains("(cache.file_io = auto: the directory is on tmpfs or ramfs)")
    );
    drop(p);

    for (dir, extra) in [(on_disk.path(), ""), (on_tmpfs.path(), "file_io = \"pool\"")] {
        let p = proxy(&dir.join("pool"), extra).await;
        let (before, after) = store_and_hit(&p, &origin).await;
        assert_eq!(
            after["cache"]["disk"]["file_io"], "pool",
            "{extra:?}: {}",
            after["cache"]["disk"]
        );
        assert!(
            n(&after, POOL_JOBS) >= n(&before, POOL_JOBS) + 4,
            "{}",
            after["native_pool"]
        );
        assert_eq!(n(&after, INLINE_JOBS), 0);
        assert!(!p.stderr().contains("file work runs on the worker threads"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_pool_an_open_with_nothing_to_read_from_the_disk_is_done_on_the_worker() {
    // On a disk (the build directory), four files held open for forty
    // objects: most hits of a second round must open their file again.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (origin, fetched) = origin().await;
    let p = proxy(dir.path(), "file_io = \"pool\"\nopen_files = 4").await;
    let paths: Vec<String> = (0..40).map(|i| format!("/o{i}")).collect();
    store_all(&p, &origin, &paths).await;
    // The first hit of each reads its body through the checksum (on the
    // pool: not verified yet in this process).
    for path in &paths {
        assert_eq!(get(&p, &origin, path).await, "HIT");
    }
    let before = stats_snapshot(&p).await;
    for path in &paths {
        assert_eq!(get(&p, &origin, path).await, "HIT");
    }
    let after = stats_snapshot(&p).await;
    let opens = |s: &serde_json::Value| n(s, &["cache", "disk", "open_file_misses"]);
    let nowait = |s: &serde_json::Value| n(s, &["cache", "disk", "opens_nowait"]);
    let reopened = opens(&after) - opens(&before);
    assert!(
        reopened >= 20,
        "{reopened} files opened again: {}",
        after["cache"]["disk"]
    );
    // Every one of them opened on the worker: no pool job at all (the
    // bodies, checked already, are sent from the files).
    assert_eq!(nowait(&after) - nowait(&before), reopened, "{}", after["cache"]["disk"]);
    assert_eq!(n(&after, POOL_JOBS), n(&before, POOL_JOBS), "{}", after["native_pool"]);
    assert_eq!(n(&after, INLINE_JOBS), 0);
    assert_eq!(fetched.load(Ordering::SeqCst), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_pool_a_first_read_after_a_restart_is_checked_on_the_worker_from_the_page_cache() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (origin, fetched) = origin().await;
    let p = proxy(dir.path(), "file_io = \"pool\"").await;
    store_all(&p, &origin, &["/big", "/small"]).await;
    drop(p);
    // A new process has checked neither file: each first hit reads its body
    // through the checksum, chunk by chunk, from the page cache.
    let p = proxy(dir.path(), "file_io = \"pool\"").await;
    stats_when(&p, "the index rebuilt", |s| {
        s["cache"]["disk"]["index_ready"] == true && n(s, &["cache", "disk", "objects"]) == 2
    })
    .await;
    let before = stats_snapshot(&p).await;
    for path in ["/big", "/small", "/big", "/small"] {
        assert_eq!(get(&p, &origin, path).await, "HIT");
    }
    let after = stats_snapshot(&p).await;
    let disk = |s: &serde_json::Value, k: &str| n(s, &["cache", "disk", k]);
    assert_eq!(n(&after, POOL_JOBS), n(&before, POOL_JOBS), "{}", after["native_pool"]);
    // 1 MiB and 100 KiB in chunks of at most 64 KiB: at least 18 reads.
    let nowait = disk(&after, "reads_nowait") - disk(&before, "reads_nowait");
    assert!(nowait >= 18, "{nowait} reads on the worker: {}", after["cache"]["disk"]);
    assert_eq!(disk(&after, "checksum_failures"), 0);
    assert_eq!(fetched.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_place_of_an_object_file_holds_up_no_worker_thread() {
    // Inline, the open runs on a worker thread: a FIFO opened the usual way
    // waits for a writer for ever, and every connection of the thread with
    // it. Opened without waiting, it is refused as no object.
    let cache = tempfile::tempdir().unwrap();
    let (origin, fetched) = origin().await;
    let p = proxy(cache.path(), "file_io = \"inline\"").await;
    store_all(&p, &origin, &["/small"]).await;
    let files = cache_object_files(cache.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    std::fs::remove_file(file).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(file)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let again = tokio::time::timeout(Duration::from_secs(10), get(&p, &origin, "/small"))
        .await
        .expect("an answer, not a worker stuck opening the FIFO");
    assert_eq!(again, "MISS");
    assert_eq!(fetched.load(Ordering::SeqCst), 2);
    assert_eq!(get(&p, &origin, "/small").await, "HIT");
    assert!(n(&stats_snapshot(&p).await, &["cache", "disk", "corrupt_removed"]) >= 1);
}

#[test]
fn a_file_io_mode_that_does_not_exist_is_refused_with_its_line_and_key() {
    let out = Portico::check("[cache]\nfile_io = \"threads\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("portico.toml:2") && err.contains("cache.file_io"), "{err}");
    assert!(
        err.contains("auto") && err.contains("pool") && err.contains("inline"),
        "{err}"
    );
}
