//! The disk tier through the real binary across restarts: objects survive
//! a stop, damaged files are never served, and a `kill -9` in the middle of
//! storing a large response leaves nothing that could be served corrupt.
//! Each test runs Portico twice (or more) on one cache directory.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(10);

/// A forward proxy whose disk cache lives in `cache_dir` (shared between
/// runs); `extra` is more `[cache]` keys.
async fn proxy(cache_dir: &Path, extra: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{}\"\nmemory = \"64MiB\"\n{extra}\n",
        cache_dir.display()
    ))
    .await
}

async fn get(p: &Portico, origin: &Origin, path: &str, headers: &[(&str, &str)]) -> ParsedResponse {
    let o = origin.addr();
    let mut req = format!("GET http://{o}{path} HTTP/1.1\r\nHost: {o}\r\n");
    for (name, value) in headers {
        req += &format!("{name}: {value}\r\n");
    }
    req += "Connection: close\r\n\r\n";
    parse_response(&raw_request_timeout(p.addr(), req.as_bytes(), Duration::from_secs(60)).await)
}

fn x_cache(r: &ParsedResponse) -> &str {
    r.header("x-cache").unwrap_or("<none>")
}

fn tmp_files(root: &Path) -> Vec<String> {
    std::fs::read_dir(root.join("tmp"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// An origin serving `/small` (text), `/large` (100 KiB of the pattern)
/// and `/vary` (by Accept-Encoding), each fresh for an hour; bodies carry
/// the request number so a refetch shows.
async fn origin() -> Origin {
    let n = Arc::new(AtomicUsize::new(0));
    Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let r = match req.uri.path() {
                "/large" => Response::ok("").generated(100 << 10),
                "/vary" => Response::ok(format!("vary {} #{n}", req.header("accept-encoding").unwrap_or("none")))
                    .header("Vary", "Accept-Encoding"),
                path => Response::ok(format!("{path} #{n}")),
            };
            r.header("Cache-Control", "max-age=3600")
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_survive_a_restart() {
    let cache = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let gzip = [("Accept-Encoding", "gzip")];
    {
        // max_memory_object small: /large lives on disk only.
        let p = proxy(cache.path(), "max_memory_object = \"4KiB\"").await;
        let r = get(&p, &origin, "/small", &[]).await;
        assert_eq!((r.body_str().as_str(), x_cache(&r)), ("/small #1", "MISS"));
        let r = get(&p, &origin, "/large", &[]).await;
        assert_eq!(x_cache(&r), "MISS");
        let r = get(&p, &origin, "/vary", &gzip).await;
        assert_eq!((r.body_str().as_str(), x_cache(&r)), ("vary gzip #3", "MISS"));
        assert_eq!(origin.count(), 3);
    } // stopped

    let p = proxy(cache.path(), "max_memory_object = \"4KiB\"").await;
    let r = get(&p, &origin, "/small", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!((r.body_str().as_str(), x_cache(&r)), ("/small #1", "HIT"));
    assert!(r.header("age").is_some());
    let r = get(&p, &origin, "/large", &[]).await;
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.body.len(), 100 << 10);
    assert!(pattern_matches(0, &r.body));
    let r = get(&p, &origin, "/vary", &gzip).await;
    assert_eq!((r.body_str().as_str(), x_cache(&r)), ("vary gzip #3", "HIT"));
    assert_eq!(origin.count(), 3, "everything came from the disk tier");
    // The other variant was never stored.
    let r = get(&p, &origin, "/vary", &[]).await;
    assert_eq!((r.body_str().as_str(), x_cache(&r)), ("vary none #4", "MISS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_object_is_not_served_after_restart() {
    let cache = tempfile::tempdir().unwrap();
    let origin = origin().await;
    {
        let p = proxy(cache.path(), "").await;
        assert_eq!(get(&p, &origin, "/small", &[]).await.body_str(), "/small #1");
    }
    let files = cache_object_files(cache.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = std::fs::OpenOptions::new().write(true).open(&files[0]).unwrap();
    let len = file.metadata().unwrap().len();
    file.set_len(len - 3).unwrap();
    drop(file);

    let p = proxy(cache.path(), "").await;
    let r = get(&p, &origin, "/small", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!((r.body_str().as_str(), x_cache(&r)), ("/small #2", "MISS"));
    assert_eq!(origin.count(), 2);
    // Stored again, whole.
    let r = get(&p, &origin, "/small", &[]).await;
    assert_eq!((r.body_str().as_str(), x_cache(&r)), ("/small #2", "HIT"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_object_is_never_served_complete_after_restart() {
    let cache = tempfile::tempdir().unwrap();
    let origin = origin().await;
    {
        let p = proxy(cache.path(), "max_memory_object = \"4KiB\"").await;
        assert_eq!(get(&p, &origin, "/large", &[]).await.body.len(), 100 << 10);
    }
    let files = cache_object_files(cache.path());
    assert_eq!(files.len(), 1, "{files:?}");
    // Flip one body byte in the middle of the file (the size stays right:
    // only the checksum can tell).
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&files[0], &bytes).unwrap();

    let p = proxy(cache.path(), "max_memory_object = \"4KiB\"").await;
    // Streamed from disk, the damage shows at the end: the client must be
    // cut off (short body, connection closed), never given a complete 200.
    let o = origin.addr();
    let req = format!("GET http://{o}/large HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");
    let mut c = RawClient::connect(p.addr()).await;
    c.send(req.as_bytes()).await;
    let bytes = c.read_to_end().await;
    assert!(c.is_eof(), "the connection is closed");
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head")
        + 4;
    let body = &bytes[end..];
    let head = parse_head_response(&bytes);
    assert_eq!(head.status, 200);
    assert_eq!(x_cache(&head), "HIT");
    assert_eq!(head.header("content-length"), Some("102400"));
    assert!(body.len() < 100 << 10, "a corrupt object was served whole");
    // The corrupt file is gone: the next request fetches a good copy.
    let r = get(&p, &origin, "/large", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100 << 10);
    assert!(pattern_matches(0, &r.body));
    assert_eq!(origin.count(), 2);
    let r = get(&p, &origin, "/large", &[]).await;
    assert_eq!(x_cache(&r), "HIT");
    assert!(pattern_matches(0, &r.body) && r.body.len() == 100 << 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_a_large_store_leaves_nothing_corrupt() {
    const LEN: u64 = 64 << 20;
    let cache = tempfile::tempdir().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    // The first response trickles (64 KiB every 2 ms, ~2 s in all) so the
    // kill lands mid-way; later ones come at full speed.
    let origin = Origin::start(move |_| {
        let first = n.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            let r = Response::ok("").generated(LEN).header("Cache-Control", "max-age=3600");
            if first {
                r.chunk_delay(Duration::from_millis(2))
            } else {
                r
            }
        }
    })
    .await;
    let o = origin.addr();
    let req = format!("GET http://{o}/huge HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");

    let p = proxy(cache.path(), "").await;
    let old_pid = p.pid();
    let mut client = TcpStream::connect(p.addr()).await.unwrap();
    client.write_all(req.as_bytes()).await.unwrap();
    // Read until 8 MiB arrived: the object is being written to a tmp file.
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let deadline = tokio::time::Instant::now() + WAIT;
    while got < 8 << 20 {
        match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => panic!("proxy closed after {got} bytes"),
            Ok(Ok(k)) => got += k,
            Err(_) => panic!("only {got} bytes arrived"),
        }
    }
    assert!(!tmp_files(cache.path()).is_empty(), "a tmp file is being written");
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(old_pid as i32, libc::SIGKILL) }, 0);
    drop(p); // reaps it
    drop(client);
    assert!(cache_object_files(cache.path()).is_empty(), "nothing was published");

    let p = proxy(cache.path(), "").await;
    let r = get(&p, &origin, "/huge", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(x_cache(&r), "MISS");
    assert_eq!(r.body.len() as u64, LEN);
    assert!(pattern_matches(0, &r.body), "body corrupt");
    assert_eq!(origin.count(), 2);
    // Stored whole this time, and served whole.
    let r = get(&p, &origin, "/huge", &[]).await;
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.body.len() as u64, LEN);
    assert!(pattern_matches(0, &r.body), "body corrupt");
    assert_eq!(origin.count(), 2);
    // The killed writer's tmp file is cleaned up by the new instance.
    let marker = format!(".{old_pid}.");
    let deadline = tokio::time::Instant::now() + WAIT;
    while tmp_files(cache.path()).iter().any(|f| f.contains(&marker)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stale tmp files left: {:?}",
            tmp_files(cache.path())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_updated_by_a_304_survive_a_restart() {
    let cache = tempfile::tempdir().unwrap();
    let origin = Origin::start(|req| async move {
        if req.header("if-none-match") == Some("\"u1\"") {
            Response::new(304)
                .header("ETag", "\"u1\"")
                .header("X-Version", "2")
                .header("Cache-Control", "max-age=3600")
        } else {
            Response::ok("kept body")
                .header("ETag", "\"u1\"")
                .header("X-Version", "1")
                .header("Cache-Control", "max-age=1")
        }
    })
    .await;
    {
        let p = proxy(cache.path(), "").await;
        let r = get(&p, &origin, "/u", &[]).await;
        assert_eq!((x_cache(&r), r.header("x-version")), ("MISS", Some("1")));
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let r = get(&p, &origin, "/u", &[]).await;
        assert_eq!((x_cache(&r), r.header("x-version")), ("REVALIDATED", Some("2")));
        assert_eq!(r.body_str(), "kept body");
    }
    let p = proxy(cache.path(), "").await;
    let r = get(&p, &origin, "/u", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!((x_cache(&r), r.header("x-version")), ("HIT", Some("2")));
    assert_eq!(r.header("cache-control"), Some("max-age=3600"));
    assert_eq!(r.body_str(), "kept body");
    assert_eq!(origin.count(), 2);
}

/// Stops `p` as a service manager does (SIGTERM), waiting for it to exit.
async fn stop(p: &mut Portico) {
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(WAIT).await.expect("portico did not exit on SIGTERM");
    assert!(status.success(), "exit status {status}\n{}", p.stderr());
}

/// Whether `p`'s error log says `text` within [`WAIT`].
async fn log_says(p: &Portico, text: &str) -> bool {
    let end = std::time::Instant::now() + WAIT;
    while !p.stderr().contains(text) {
        if std::time::Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// The number of lookups Portico said it restored ("popularity of N
/// lookups restored from ..."), waiting for the line; None if none came.
async fn restored_lookups(p: &Portico) -> Option<u64> {
    let said = log_says(p, "lookups restored from").await;
    let log = p.stderr();
    let line = log.lines().find(|l| l.contains("lookups restored from"));
    said.then(|| line.and_then(|l| l.split("popularity of ").nth(1)?.split(' ').next()?.parse().ok()))
        .flatten()
}

/// How often each object was asked for (`cache.replacement = "frequency"`,
/// the default, ranks objects for eviction by it) survives a restart as
/// the objects do: saved in the cache directory at shutdown, restored at
/// start, so the first evictions after a restart are not made blind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn how_often_objects_were_asked_for_survives_a_restart() {
    let cache = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let file = cache.path().join("popularity");
    let mut p = proxy(cache.path(), "").await;
    for _ in 0..5 {
        assert_eq!(get(&p, &origin, "/small", &[]).await.status, 200);
    }
    assert!(!file.exists(), "saved before shutdown (every five minutes)");
    stop(&mut p).await;
    let saved = std::fs::read(&file).expect("the sketch is saved at shutdown");
    assert!(saved.starts_with(b"PORTPOP2"), "{:?}", &saved[..saved.len().min(16)]);

    let mut p = proxy(cache.path(), "").await;
    let n = restored_lookups(&p).await;
    assert!(n.is_some_and(|n| n >= 5), "restored {n:?}\n{}", p.stderr());
    assert_eq!(x_cache(&get(&p, &origin, "/small", &[]).await), "HIT");
    stop(&mut p).await;
    // Counted on from where it was: the next run restores more.
    let p = proxy(cache.path(), "").await;
    let m = restored_lookups(&p).await;
    assert!(m > n, "restored {m:?} after {n:?}\n{}", p.stderr());
}

/// A damaged or foreign `popularity` file (truncated, overwritten, a
/// directory, another budget's) never stops the server or the cache: it is
/// named in the log with why, the sketch starts empty, every object on disk
/// is still served, and the next save replaces a bad file with a good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_popularity_file_is_refused_named_and_replaced() {
    let cache = tempfile::tempdir().unwrap();
    let origin = origin().await;
    let file = cache.path().join("popularity");
    let mut p = proxy(cache.path(), "").await;
    get(&p, &origin, "/small", &[]).await;
    stop(&mut p).await;
    let good = std::fs::read(&file).expect("saved at shutdown");

    let mut flipped = good.clone();
    flipped[100] ^= 0x40;
    let mut huge = good.clone();
    huge.resize(17 << 20, 0);
    // The file as Portico wrote it before an object's four counters shared
    // a cache line: whole and checksummed, but its counters would count
    // for other objects now.
    let mut earlier = good[..good.len() - 8].to_vec();
    earlier[..8].copy_from_slice(b"PORTPOP1");
    let sum = xxhash_rust::xxh3::xxh3_64(&earlier);
    earlier.extend_from_slice(&sum.to_le_bytes());
    let cases: [(&str, Vec<u8>, &str); 6] = [
        ("larger than 16 MiB", huge, "damaged (larger than any popularity file)"),
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "damaged (checksum mismatch)",
        ),
        ("one bit flipped", flipped, "damaged (checksum mismatch)"),
        (
            "another file",
            b"GET / HTTP/1.1\r\n\r\n".repeat(10),
            "damaged (not a popularity file)",
        ),
        ("empty", Vec::new(), "damaged (shorter than its header)"),
        (
            "the earlier layout",
            earlier,
            "written by an earlier Portico (layout PORTPOP1); counting anew",
        ),
    ];
    for (what, bytes, why) in cases {
        std::fs::write(&file, bytes).unwrap();
        let mut p = proxy(cache.path(), "").await;
        let said = log_says(&p, "not restored").await;
        let log = p.stderr();
        assert!(said, "{what}: nothing said\n{log}");
        let line = log.lines().find(|l| l.contains("not restored")).unwrap_or("");
        assert!(
            line.contains(&file.display().to_string()) && line.contains(why),
            "{what}: {line}"
        );
        assert!(!log.contains("lookups restored"), "{what}: {log}");
        let r = get(&p, &origin, "/small", &[]).await;
        assert_eq!((r.status, x_cache(&r)), (200, "HIT"), "{what}");
        stop(&mut p).await;
        let again = std::fs::read(&file).expect("saved again");
        assert!(
            again.starts_with(b"PORTPOP2") && again.len() == good.len(),
            "{what}: not replaced"
        );
    }
    assert_eq!(origin.count(), 1, "the object was served from disk every time");

    // A directory where the file should be: said, served, and the save at
    // shutdown fails with its reason in the log, not the exit status.
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    let mut p = proxy(cache.path(), "").await;
    assert_eq!(x_cache(&get(&p, &origin, "/small", &[]).await), "HIT");
    assert!(log_says(&p, "cannot read").await, "{}", p.stderr());
    stop(&mut p).await;
    assert!(p.stderr().contains("cannot write"), "{}", p.stderr());

    // Another disk budget: counted anew, at info level.
    std::fs::remove_dir(&file).unwrap();
    std::fs::write(&file, &good).unwrap();
    let mut p = proxy(cache.path(), "disk = \"64MiB\"").await;
    assert!(log_says(&p, "made for another disk budget").await, "{}", p.stderr());
    assert_eq!(x_cache(&get(&p, &origin, "/small", &[]).await), "HIT");
    stop(&mut p).await;
}

/// `cache.memory_cache_mode` (Squid's `memory_cache_mode`): which objects
/// the memory tier takes, seen in its object count and the disk tier's
/// reads. `always`: a stored miss at once, and a disk hit (after a
/// restart emptied the memory tier). `disk`: a stored miss goes to disk
/// alone and into memory when it is hit. `network`: a stored miss, never
/// a disk hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cache_mode_decides_what_the_memory_tier_takes() {
    let origin = origin().await;
    // (mode, in memory after the miss, after the first hit; disk reads
    // after the restart's two hits)
    for (mode, after_miss, after_hit, reads_after_restart) in
        [("always", 1, 1, 1), ("disk", 0, 1, 1), ("network", 1, 1, 2)]
    {
        let cache = tempfile::tempdir().unwrap();
        let extra = format!("memory_cache_mode = \"{mode}\"");
        let path = format!("/mode-{mode}");
        {
            let p = proxy(cache.path(), &extra).await;
            assert_eq!(x_cache(&get(&p, &origin, &path, &[]).await), "MISS", "{mode}");
            assert_eq!(
                metric(&p, "portico_cache_memory_objects").await,
                after_miss,
                "{mode}: after the miss"
            );
            let r = get(&p, &origin, &path, &[]).await;
            assert_eq!(
                (r.body_str(), x_cache(&r)),
                (format!("{path} #{}", origin.count()), "HIT")
            );
            assert_eq!(
                metric(&p, "portico_cache_memory_objects").await,
                after_hit,
                "{mode}: after a hit"
            );
        }
        let p = proxy(cache.path(), &extra).await;
        for _ in 0..2 {
            assert_eq!(x_cache(&get(&p, &origin, &path, &[]).await), "HIT", "{mode}");
        }
        assert_eq!(
            metric(&p, "portico_cache_disk_reads_total").await,
            reads_after_restart,
            "{mode}: disk reads of two hits after a restart"
        );
        let in_memory = u64::from(mode != "network");
        assert_eq!(
            metric(&p, "portico_cache_memory_objects").await,
            in_memory,
            "{mode}: after the restart"
        );
    }
}

#[test]
fn memory_cache_mode_disk_without_a_disk_tier_is_refused() {
    let out = Portico::check("[cache]\ndisk = \"0\"\nmemory_cache_mode = \"disk\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cache.memory_cache_mode"),
        "{err}"
    );
    let out = Portico::check("[cache]\nmemory_cache_mode = \"sometimes\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("memory_cache_mode"), "{err}");
}

/// Under `memory_cache_mode = "disk"` a new version of an object the
/// memory tier holds (taken in by a disk hit) is stored on disk only: the
/// old copy in memory must go, or it would be served instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cache_mode_disk_never_serves_an_old_version_from_memory() {
    let origin = origin().await;
    let cache = tempfile::tempdir().unwrap();
    let p = proxy(cache.path(), "memory_cache_mode = \"disk\"").await;
    assert_eq!(get(&p, &origin, "/versions", &[]).await.body_str(), "/versions #1");
    // A disk hit takes it into memory.
    assert_eq!(get(&p, &origin, "/versions", &[]).await.body_str(), "/versions #1");
    assert_eq!(metric(&p, "portico_cache_memory_objects").await, 1);
    // A client's reload fetches and stores version 2.
    let r = get(&p, &origin, "/versions", &[("Cache-Control", "no-cache")]).await;
    assert_eq!(r.body_str(), "/versions #2");
    let r = get(&p, &origin, "/versions", &[]).await;
    assert_eq!((r.body_str().as_str(), x_cache(&r)), ("/versions #2", "HIT"));
    assert_eq!(origin.count(), 2);
}

/// A new version too large for the memory tier (`max_memory_object`) of an
/// object it holds goes to disk alone: the old copy in memory goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_too_large_for_memory_is_not_shadowed_by_the_old_one() {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |_req| {
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move {
            let r = if n == 0 {
                Response::ok("small first version")
            } else {
                Response::ok("").generated(64 << 10)
            };
            r.header("Cache-Control", "max-age=3600")
        }
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let p = proxy(cache.path(), "max_memory_object = \"4KiB\"").await;
    assert_eq!(get(&p, &origin, "/grows", &[]).await.body_str(), "small first version");
    let r = get(&p, &origin, "/grows", &[("Cache-Control", "no-cache")]).await;
    assert_eq!(r.body.len(), 64 << 10);
    let r = get(&p, &origin, "/grows", &[]).await;
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.body.len(), 64 << 10, "the old version was served from memory");
    assert!(pattern_matches(0, &r.body));
    assert_eq!(origin.count(), 2);
}
