//! Measures the disk tier's restart: fills DIR with N small objects (only
//! the ones missing), then reopens the store and reports how long until it
//! serves (`start` returned and a first object was read) and until the
//! background index rebuild is complete.
//!
//! ```text
//! cargo run --release --example disk_restart -- DIR N [BODY_BYTES]
//! ```

use http::{HeaderMap, HeaderValue, StatusCode};
use portico::cache::disk::DiskStore;
use portico::cache::key::CacheKey;
use portico::cache::object::StoredMeta;
use portico::config::{CacheConfig, GcMode, Size};
use std::path::PathBuf;
use std::time::{Duration, Instant, UNIX_EPOCH};

fn url(i: u64) -> String {
    format!("http://bench.example/objects/{i}")
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: disk_restart DIR N [BODY_BYTES]");
        std::process::exit(2);
    }
    let dir = PathBuf::from(&args[1]);
    let n: u64 = args[2].parse().expect("N");
    let body_len: usize = args.get(3).map_or(500, |s| s.parse().expect("BODY_BYTES"));
    let cfg = CacheConfig {
        dir,
        disk: Size(1 << 40),
        gc: GcMode::Scheduled,
        ..CacheConfig::default()
    };
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("text/html"));
    headers.insert("etag", HeaderValue::from_static("\"0123456789abcdef\""));
    let body = vec![b'x'; body_len];

    // Fill (two threads), skipping objects already there.
    let t = Instant::now();
    let store = DiskStore::start_offline(&cfg, &mut |_| {}).expect("open");
    let have = store.stats().snapshot().objects;
    eprintln!("{have} objects present (scanned in {:?})", t.elapsed());
    if have < n {
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in 0..2u64 {
                let (store, headers, body) = (&store, &headers, &body);
                s.spawn(move || {
                    for i in (part..n).step_by(2) {
                        let u = url(i);
                        let id = CacheKey::from_url(&u, false).unwrap().id();
                        if store.entry(id).is_some() {
                            continue;
                        }
                        let meta = StoredMeta {
                            key: u,
                            variant: vec![],
                            status: StatusCode::OK,
                            headers: headers.clone(),
                            request_time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
                            response_time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
                            origin: None,
                            derived: Default::default(),
                        };
                        let mut w = store.writer_blocking(id, &meta).unwrap();
                        w.write_blocking(body).unwrap();
                        w.commit_blocking(1_900_000_000).unwrap();
                    }
                });
            }
        });
        eprintln!(
            "filled to {} objects in {:?}",
            store.stats().snapshot().objects,
            t.elapsed()
        );
    }
    drop(store);

    // Restart.
    let probe = CacheKey::from_url(&url(n - 1), false).unwrap().id();
    let rss0 = rss_mib();
    let t = Instant::now();
    let store = DiskStore::start(&cfg).expect("start");
    let usable = t.elapsed();
    let first = store.open_blocking(probe).expect("probe object");
    let mut len = 0;
    let mut b = first.body;
    while let Some(c) = b.chunk_blocking().unwrap() {
        len += c.len();
    }
    assert_eq!(len, body_len);
    let first_hit = t.elapsed();
    let mut last = Instant::now();
    while !store.wait_scan_blocking(Duration::from_millis(100)) {
        if last.elapsed() > Duration::from_secs(5) {
            let p = store.scan_progress();
            eprintln!(
                "  ... {} files, {}/{} dirs after {:?}",
                p.scanned,
                p.dirs_done,
                p.dirs_total,
                t.elapsed()
            );
            last = Instant::now();
        }
    }
    let complete = t.elapsed();
    let s = store.stats().snapshot();
    println!(
        "{} objects ({} bytes): start() returned in {usable:?}, first object read in {first_hit:?}, \
         index complete in {complete:?} (scan {:?}, {:.0} files/s); index RSS +{:.1} MiB",
        s.objects,
        s.bytes,
        s.scan.elapsed,
        s.scan.scanned as f64 / s.scan.elapsed.as_secs_f64(),
        rss_mib() - rss0
    );
}
