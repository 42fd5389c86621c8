//! The memory tier's budget bounds what the process holds: a tier filled
//! past its budget with small objects grows the real binary's resident
//! memory by no more than the budget plus a quarter, and the perfdump shows
//! the resident size beside the tier's budget. Small objects are the hard
//! case: what a stored response costs besides its body (the header map, the
//! key, the allocator's overhead) is larger than a 1 KB body.

mod common;

use std::time::Duration;

use common::*;

/// Bodies of 1,000 bytes with the fields a typical origin sends.
async fn origin() -> Origin {
    Origin::start(|req| async move {
        let tag = format!("\"{}\"", req.uri.query().unwrap_or("none"));
        Response::ok(vec![b'm'; 1000])
            .header("Cache-Control", "max-age=3600")
            .header("Content-Type", "application/octet-stream")
            .header("Last-Modified", "Tue, 24 Nov 2026 10:00:00 GMT")
            .header("ETag", &tag)
            .header("Server", "origin/1.0")
            .header("Accept-Ranges", "bytes")
    })
    .await
}

/// Requests `/obj?i=N` for N in `from..to`, 50 pipelined on each
/// connection (a connection serves 100 by default); every answer must be
/// the 1,000-byte body.
async fn fetch(p: &Portico, origin: &Origin, from: usize, to: usize) {
    let o = origin.addr();
    let mut i = from;
    while i < to {
        let batch = (to - i).min(50);
        let mut client = RawClient::connect(p.addr()).await;
        client.timeout = Duration::from_secs(30);
        let mut reqs = String::new();
        for n in i..i + batch {
            reqs += &format!("GET http://{o}/obj?i={n} HTTP/1.1\r\nHost: {o}\r\n\r\n");
        }
        client.send(reqs.as_bytes()).await;
        for _ in 0..batch {
            let r = client.read_response().await;
            assert_eq!((r.status, r.body.len()), (200, 1000), "{}", r.body_str());
        }
        i += batch;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_tier_of_small_objects_holds_no_more_than_its_budget_and_a_quarter() {
    let origin = origin().await;
    let addr = free_addr();
    let budget: u64 = 8 << 20;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\nmemory = \"8MiB\"\ndisk = \"0B\"\ncache_query = true\n"
    ))
    .await;
    // Connections, buffers and the runtime's pools exist before the
    // baseline is read.
    fetch(&p, &origin, 0, 200).await;
    let before = p.rss_kib() * 1024;
    // 12,000 objects of 1,000 bytes: more than the tier can hold when each
    // is counted at what it really costs (about 3 KB).
    fetch(&p, &origin, 200, 12_200).await;
    let s = stats_snapshot(&p).await;
    let cache = &s["cache"];
    let (held, limit) = (cache["memory_bytes"].as_u64(), cache["memory_limit"].as_u64());
    assert_eq!(limit, Some(budget), "{cache}");
    let held = held.expect("memory_bytes");
    let entries = cache["memory_entries"].as_u64().expect("memory_entries");
    assert!(held <= budget, "the tier holds {held} of {budget} bytes");
    // The tier is full, not bypassed: at least 2,000 objects (the figure a
    // 3 KB-per-object estimate gives is about 2,700).
    assert!(
        entries >= 2000 && held >= budget / 2,
        "{entries} objects, {held} bytes: {cache}"
    );
    let grown = (p.rss_kib() * 1024).saturating_sub(before);
    assert!(
        grown <= budget + budget / 4,
        "resident memory grew by {grown} bytes for a tier of {budget} holding {entries} objects ({held} bytes by its count)"
    );
    let line = perf_line(&p, "Memory Tier").await;
    assert!(
        line.contains(&format!(
            "{held}/{budget} bytes in {entries} objects (process resident "
        )),
        "{line}"
    );
}
