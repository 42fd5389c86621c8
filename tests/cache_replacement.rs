//! Which objects the disk tier keeps when it is full (`cache.replacement`),
//! through the real binary: a popular object and a flood of objects asked
//! for once, the origin's request count telling whether the popular one was
//! kept. `frequency` ranks by lookups counted in a sketch, so the popular
//! object outlives the flood; `balanced` ages every priority with a clock
//! that each eviction raises, so a long enough flood pushes it out.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use common::*;

const DISK: u64 = 256 << 10;
/// `watermarks = [50, 90]`: collection starts above 90% of the budget.
const HIGH: u64 = DISK * 90 / 100;

/// A forward proxy with a 256 KiB disk tier and a memory tier that keeps
/// nothing over 1 KiB, so every object lives on disk only.
async fn proxy(cache_dir: &Path, replacement: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\ndir = \"{}\"\nmemory = \"16MiB\"\nmax_memory_object = \"1KiB\"\n\
         disk = \"{DISK}B\"\nwatermarks = [50, 90]\nreplacement = \"{replacement}\"\n",
        cache_dir.display()
    ))
    .await
}

/// 6,000-byte bodies, fresh for an hour; counts the requests per path.
async fn origin() -> (Origin, Arc<Mutex<HashMap<String, usize>>>) {
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let seen = counts.clone();
    let origin = Origin::start(move |req| {
        *seen.lock().unwrap().entry(req.uri.path().to_string()).or_insert(0) += 1;
        async move {
            Response::ok("")
                .generated(6_000)
                .header("Cache-Control", "max-age=3600")
        }
    })
    .await;
    (origin, counts)
}

async fn get(p: &Portico, origin: &Origin, path: &str) -> ParsedResponse {
    let o = origin.addr();
    let req = format!("GET http://{o}{path} HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request_timeout(p.addr(), req.as_bytes(), Duration::from_secs(30)).await);
    assert_eq!((r.status, r.body.len()), (200, 6_000), "{path}");
    r
}

/// Asks for `/popular` six times, then for 400 objects once each (about
/// fourteen times what the tier holds), each after the collection has brought
/// the tier back under its high watermark, so that many collections run
/// one after another as in a long-running cache. Returns the X-Cache of
/// the next request for `/popular` and how often the origin was asked
/// for it in all.
async fn popular_after_a_flood(replacement: &str) -> (String, usize) {
    let cache = tempfile::tempdir().unwrap();
    let (origin, counts) = origin().await;
    let p = proxy(cache.path(), replacement).await;
    for _ in 0..6 {
        get(&p, &origin, "/popular").await;
    }
    for i in 0..400 {
        get(&p, &origin, &format!("/once/{i}")).await;
        stats_when(&p, "the disk tier under its high watermark", |s| {
            s["cache"]["disk"]["bytes"].as_u64().is_some_and(|b| b <= HIGH)
        })
        .await;
    }
    let s = stats_snapshot(&p).await;
    let evicted = s["cache"]["disk"]["evictions"].as_u64().unwrap_or(0);
    assert!(
        evicted >= 100,
        "{replacement}: the flood evicted only {evicted} objects"
    );
    let r = get(&p, &origin, "/popular").await;
    let x_cache = r.header("x-cache").unwrap_or("<none>").to_string();
    let fetched = counts.lock().unwrap().get("/popular").copied().unwrap_or(0);
    (x_cache, fetched)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frequency_keeps_an_object_asked_for_often_through_a_flood_of_objects_asked_for_once() {
    let (x_cache, fetched) = popular_after_a_flood("frequency").await;
    assert_eq!((x_cache.as_str(), fetched), ("HIT", 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balanced_ages_an_object_no_longer_asked_for_out_of_a_long_flood() {
    let (x_cache, fetched) = popular_after_a_flood("balanced").await;
    assert_eq!((x_cache.as_str(), fetched), ("MISS", 2));
}
