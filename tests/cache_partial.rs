//! Partial content (RFC 9111 3.3 and 3.4): the 206 responses to Range
//! requests are kept, reused for the ranges they hold, and combined into
//! the complete response when they cover it under one strong validator.
//! The real `portico` binary as a forward proxy; an origin serving ranges
//! of a ten-byte representation that counts the requests it gets. The
//! cache-tests suite's ids are quoted where a test follows one.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::*;

/// The representation the origin serves ranges of.
const BODY: &str = "0123456789";

/// A forward proxy with a memory cache.
async fn proxy() -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n"
    ))
    .await
}

/// An origin serving [`BODY`] fresh for an hour, a 206 for a single
/// `Range` (`a-b`, `a-`, `-n`) with the extra `headers` of the moment
/// (validators; the test changes them), `complete` as the Content-Range's
/// complete length (`"10"` or `"*"`).
async fn range_origin(headers: Arc<Mutex<Vec<(String, String)>>>, complete: &'static str) -> Origin {
    Origin::start(move |req| {
        let extra = headers.lock().expect("lock").clone();
        async move {
            let len = BODY.len() as u64;
            let range = req
                .header("range")
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, b)| match (a, b) {
                    ("", n) => n.parse::<u64>().ok().map(|n| (len - n.min(len), len - 1)),
                    (a, "") => a.parse().ok().map(|a| (a, len - 1)),
                    (a, b) => Some((a.parse().ok()?, b.parse::<u64>().ok()?.min(len - 1))),
                });
            let mut r = match range {
                Some((a, b)) => Response::new(206)
                    .body(BODY[a as usize..=b as usize].to_string())
                    .header("Content-Range", &format!("bytes {a}-{b}/{complete}")),
                None => Response::ok(BODY),
            };
            r = r.header("Cache-Control", "max-age=3600");
            for (n, v) in &extra {
                r = r.header(n, v);
            }
            r
        }
    })
    .await
}

fn strong(tag: &str) -> Arc<Mutex<Vec<(String, String)>>> {
    Arc::new(Mutex::new(vec![("ETag".into(), tag.into())]))
}

/// GET through the proxy, with a `Range` if given.
async fn get(p: &Portico, o: SocketAddr, range: Option<&str>) -> ParsedResponse {
    let range = range.map(|r| format!("Range: {r}\r\n")).unwrap_or_default();
    let req = format!("GET http://{o}/v HTTP/1.1\r\nHost: {o}\r\n{range}Connection: close\r\n\r\n");
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

#[track_caller]
fn check(r: &ParsedResponse, status: u16, body: &str, x_cache: &str) {
    assert_eq!(r.status, status, "{:?} {:?}", r.headers, r.body_str());
    assert_eq!(r.body_str(), body, "{:?}", r.headers);
    assert_eq!(r.header("x-cache"), Some(x_cache), "{:?}", r.headers);
}

/// RFC 9111 3.3: "A cache MAY store incomplete responses"; a Range request
/// that misses is forwarded with its Range (not turned into a fetch of the
/// whole), and later requests for ranges inside the stored part are hits
/// (cache-tests `partial-store-partial-reuse-partial`,
/// `partial-store-partial-reuse-partial-byterange`,
/// `partial-store-partial-reuse-partial-absent`,
/// `partial-store-partial-reuse-partial-suffix`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_may_store_incomplete_responses_and_serve_ranges_they_hold() {
    let p = proxy().await;
    let o = range_origin(strong("\"r1\""), "10").await;
    let r = get(&p, o.addr(), Some("bytes=-5")).await;
    check(&r, 206, "56789", "MISS");
    assert_eq!(o.requests()[0].header("range"), Some("bytes=-5"), "forwarded as asked");
    let r = get(&p, o.addr(), Some("bytes=-5")).await;
    check(&r, 206, "56789", "HIT");
    assert_eq!(r.header("content-range"), Some("bytes 5-9/10"));
    assert_eq!(r.header("etag"), Some("\"r1\""));
    check(&get(&p, o.addr(), Some("bytes=6-8")).await, 206, "678", "HIT");
    check(&get(&p, o.addr(), Some("bytes=6-")).await, 206, "6789", "HIT");
    check(&get(&p, o.addr(), Some("bytes=-1")).await, 206, "9", "HIT");
    assert_eq!(o.count(), 1);
    // Outside the part: the origin is asked.
    check(&get(&p, o.addr(), Some("bytes=0-1")).await, 206, "01", "MISS");
    assert_eq!(o.count(), 2);
}

/// RFC 9111 3.4: "a cache MAY combine [stored partial responses] into a
/// single stored response ... if ... the new response and the stored
/// response have the same strong validator": the complete response is then
/// a 200 hit (cache-tests `partial-store-partial-complete`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_with_the_same_strong_validator_combine_into_the_complete_response() {
    let p = proxy().await;
    let o = range_origin(strong("\"r1\""), "10").await;
    check(&get(&p, o.addr(), Some("bytes=0-4")).await, 206, "01234", "MISS");
    check(&get(&p, o.addr(), Some("bytes=5-9")).await, 206, "56789", "MISS");
    let r = get(&p, o.addr(), None).await;
    check(&r, 200, BODY, "HIT");
    assert_eq!(r.header("content-length"), Some("10"));
    assert_eq!(r.header("content-range"), None);
    assert_eq!(r.header("etag"), Some("\"r1\""));
    // And any range of it.
    check(&get(&p, o.addr(), Some("bytes=3-6")).await, 206, "3456", "HIT");
    assert_eq!(o.count(), 2);
}

/// RFC 9111 3.4 with RFC 9110 8.8.2.2: a strong `Last-Modified` (its
/// `Date` at least 60 seconds later) combines as a strong entity tag does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_with_the_same_strong_last_modified_combine() {
    let p = proxy().await;
    let h = Arc::new(Mutex::new(vec![(
        "Last-Modified".to_string(),
        "Mon, 01 Jan 2024 00:00:00 GMT".to_string(),
    )]));
    let o = range_origin(h, "10").await;
    check(&get(&p, o.addr(), Some("bytes=0-4")).await, 206, "01234", "MISS");
    check(&get(&p, o.addr(), Some("bytes=5-9")).await, 206, "56789", "MISS");
    check(&get(&p, o.addr(), None).await, 200, BODY, "HIT");
    assert_eq!(o.count(), 2);
}

/// RFC 9111 3.4: parts are combined only under the same strong validator;
/// parts of different representations never are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_with_different_strong_validators_are_never_combined() {
    let p = proxy().await;
    let headers = strong("\"r1\"");
    let o = range_origin(headers.clone(), "10").await;
    check(&get(&p, o.addr(), Some("bytes=0-4")).await, 206, "01234", "MISS");
    headers.lock().expect("lock")[0].1 = "\"r2\"".into();
    check(&get(&p, o.addr(), Some("bytes=5-9")).await, 206, "56789", "MISS");
    let r = get(&p, o.addr(), None).await;
    check(&r, 200, BODY, "MISS");
    assert_eq!(o.count(), 3);
}

/// RFC 9110 8.8.1: a weak entity tag is no strong validator; parts carrying
/// one are reused for their own bytes but never combined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_entity_tag_never_combines_parts() {
    let p = proxy().await;
    let o = range_origin(strong("W/\"w\""), "10").await;
    check(&get(&p, o.addr(), Some("bytes=0-4")).await, 206, "01234", "MISS");
    check(&get(&p, o.addr(), Some("bytes=5-9")).await, 206, "56789", "MISS");
    check(&get(&p, o.addr(), Some("bytes=6-7")).await, 206, "67", "HIT");
    check(&get(&p, o.addr(), None).await, 200, BODY, "MISS");
    assert_eq!(o.count(), 3);
}

/// RFC 9110 14.4: a `Content-Range` complete length of `*` is unknown: the
/// part cannot be placed in a representation of known length, so it is
/// not kept (each such request goes to the origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_of_unknown_complete_length_is_not_kept() {
    let p = proxy().await;
    let o = range_origin(strong("\"r1\""), "*").await;
    let r = get(&p, o.addr(), Some("bytes=0-4")).await;
    check(&r, 206, "01234", "MISS");
    assert_eq!(r.header("content-range"), Some("bytes 0-4/*"));
    check(&get(&p, o.addr(), Some("bytes=0-4")).await, 206, "01234", "MISS");
    assert_eq!(o.count(), 2);
}

/// RFC 9111 3.3 keeps the storing rules: a 206 marked `no-store` is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_may_not_be_stored_is_not_kept() {
    let p = proxy().await;
    let h = Arc::new(Mutex::new(vec![("Cache-Control".to_string(), "no-store".to_string())]));
    let o = range_origin(h, "10").await;
    check(&get(&p, o.addr(), Some("bytes=0-4")).await, 206, "01234", "MISS");
    check(&get(&p, o.addr(), Some("bytes=0-4")).await, 206, "01234", "MISS");
    assert_eq!(o.count(), 2);
}

/// Hostile origins: a 206 whose `Content-Range` does not describe its body
/// (another length, a last byte past the complete length, not bytes, a
/// multi-range without the multipart type) is passed on as received but
/// never kept, so no later request gets bytes placed at the wrong offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_whose_content_range_does_not_describe_its_body_is_not_kept() {
    let p = proxy().await;
    for content_range in [
        "bytes 0-4/10",
        "bytes 0-3/3",
        "items 0-3/10",
        "bytes 0-3,5-6/10",
        "bytes 3-0/10",
    ] {
        let o = Origin::start(move |_| async move {
            Response::new(206)
                .body("0123")
                .header("Content-Range", content_range)
                .header("Cache-Control", "max-age=3600")
                .header("ETag", "\"h\"")
        })
        .await;
        for _ in 0..2 {
            let r = get(&p, o.addr(), Some("bytes=0-3")).await;
            check(&r, 206, "0123", "MISS");
        }
        assert_eq!(o.count(), 2, "{content_range}");
    }
}
