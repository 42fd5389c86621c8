//! Serving a stored response stale when the origin fails (RFC 9111 4.2.4,
//! "disconnected"; the cache-tests suite's `stale-close`, `stale-503` and
//! `stale-close-must-revalidate` / `-proxy-revalidate` / `-no-cache` /
//! `-s-maxage=2`): the real `portico` binary as a forward proxy, origins
//! that answer once and then close, hang, refuse or answer 503. Every test
//! checks what the client got (status, body, `X-Cache`, `Age`), and the
//! first one the statistics and the access log too.
//!
//! Staleness comes from short lifetimes (`max-age=1`) and sleeping just past
//! them; nothing here asserts how long anything took.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::AsyncWriteExt;

/// Just past a `max-age=1` lifetime (ages are whole seconds).
const PAST_ONE_SECOND: Duration = Duration::from_millis(1100);

/// The body of the response the origin answers first, the one stored.
const STORED: &str = "stored copy";

/// What the origin does with every request after the first.
#[derive(Debug, Clone, Copy)]
enum Failing {
    /// Reads the request and closes the connection without a byte.
    Close,
    /// Reads the request and never answers.
    Hang,
    /// Answers `503 Service Unavailable` ("origin down").
    Unavailable,
}

/// An origin that answers its first request with `200 STORED` and
/// `Cache-Control: cc` (and `Connection: close`, so nothing is pooled), and
/// the later ones as `failing` says. Also returns its request counter.
async fn origin(cc: &'static str, failing: Failing) -> (RawOrigin, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    let o = RawOrigin::start(move |mut s| {
        let n = n.clone();
        async move {
            if read_request_head(&mut s).await.is_empty() {
                return;
            }
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nCache-Control: {cc}\r\nETag: \"v1\"\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{STORED}",
                    STORED.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                return;
            }
            match failing {
                Failing::Close => drop(s),
                Failing::Hang => std::future::pending::<()>().await,
                Failing::Unavailable => {
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\n\
                              Connection: close\r\n\r\norigin down",
                        )
                        .await;
                }
            }
        }
    })
    .await;
    (o, count)
}

/// A forward proxy with a cache, a Squid-format access log under its temp
/// dir and an `origin.first_byte_timeout` of 1s; `cache_extra` is more
/// `[cache]` keys.
async fn proxy(cache_extra: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [origin]\nfirst_byte_timeout = \"1s\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\nformat = \"squid\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n{cache_extra}\n"
    ))
    .await
}

/// `GET http://origin/path` through the proxy, `Connection: close`.
async fn get(p: &Portico, origin: SocketAddr, path: &str) -> ParsedResponse {
    let req = format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

fn x_cache(r: &ParsedResponse) -> &str {
    r.header("x-cache").unwrap_or("<none>")
}

/// Asserts status, body and X-Cache of a response.
#[track_caller]
fn check(r: &ParsedResponse, status: u16, body: &str, cache: &str) {
    assert_eq!(
        r.status,
        status,
        "status; headers {:?}, body {:?}",
        r.headers,
        r.body_str()
    );
    assert_eq!(r.body_str(), body, "body; headers {:?}", r.headers);
    assert_eq!(x_cache(r), cache, "X-Cache; headers {:?}", r.headers);
}

/// Stores `cc`'s response from a fresh origin failing as `failing`, lets it
/// go stale, and asks again: the answer, and how many requests the origin saw.
async fn stale_then_failing(p: &Portico, cc: &'static str, failing: Failing) -> (ParsedResponse, usize) {
    let (o, n) = origin(cc, failing).await;
    check(&get(p, o.addr(), "/x").await, 200, STORED, "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let r = get(p, o.addr(), "/x").await;
    (r, n.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_cache_serves_the_stale_response_when_the_origin_closes_without_answering() {
    let p = proxy("").await;
    let stale_before = metric(&p, "portico_cache_stale_total").await;
    let (r, asked) = stale_then_failing(&p, "max-age=1", Failing::Close).await;
    check(&r, 200, STORED, "STALE");
    assert_eq!(asked, 2, "the origin was asked to revalidate");
    // Its true age, and no Warning (RFC 9111 dropped it).
    let age: u64 = r.header("age").and_then(|a| a.parse().ok()).expect("Age");
    assert!(age >= 1, "Age {age}");
    assert_eq!(r.header("warning"), None);
    // A stale hit in the statistics, TCP_REFRESH_FAIL_OLD in Squid's log.
    assert_eq!(metric(&p, "portico_cache_stale_total").await, stale_before + 1);
    let lines = file_lines(&p.dir().join("access.log"), 2).await;
    let line = lines
        .iter()
        .find(|l| l.contains(" TCP_REFRESH_FAIL_OLD/200 "))
        .unwrap_or_else(|| panic!("no TCP_REFRESH_FAIL_OLD/200 line in:\n{}", lines.join("\n")));
    assert!(line.contains(&format!(" {} ", STORED.len())), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_cache_serves_the_stale_response_when_the_origin_refuses_connections() {
    let p = proxy("").await;
    let (o, _) = origin("max-age=1", Failing::Close).await;
    let addr = o.addr();
    check(&get(&p, addr, "/x").await, 200, STORED, "MISS");
    // Stopped: its port refuses connections.
    drop(o);
    tokio::time::sleep(PAST_ONE_SECOND).await;
    check(&get(&p, addr, "/x").await, 200, STORED, "STALE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_cache_serves_the_stale_response_when_the_origin_times_out() {
    let p = proxy("").await;
    let (r, asked) = stale_then_failing(&p, "max-age=1", Failing::Hang).await;
    check(&r, 200, STORED, "STALE");
    assert_eq!(asked, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_serves_the_stale_response_when_the_origin_answers_503() {
    let p = proxy("cache_status = \"edge\"").await;
    let (r, asked) = stale_then_failing(&p, "max-age=1", Failing::Unavailable).await;
    check(&r, 200, STORED, "STALE");
    assert_eq!(asked, 2);
    // RFC 9211: it went forward to validate the stale response and the
    // origin answered 503; the stored response is past its freshness.
    let member = r.header("cache-status").expect("Cache-Status");
    assert!(member.starts_with("edge; fwd=stale; fwd-status=503; ttl="), "{member}");
    assert!(ttl_of(member) <= 0, "{member}");
}

/// The `ttl` of a `Cache-Status` member: at most 0 for a stale response
/// (its age, in whole seconds, has reached its freshness lifetime).
fn ttl_of(member: &str) -> i64 {
    let ttl = member.split("; ").find_map(|p| p.strip_prefix("ttl=")).expect("a ttl");
    ttl.parse().expect("ttl is an integer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_says_a_stale_response_served_for_a_failed_connection_went_forward() {
    let p = proxy("cache_status = \"edge\"").await;
    let (r, _) = stale_then_failing(&p, "max-age=1", Failing::Close).await;
    check(&r, 200, STORED, "STALE");
    let member = r.header("cache-status").expect("Cache-Status");
    assert!(member.starts_with("edge; fwd=stale; ttl="), "{member}");
    assert!(ttl_of(member) <= 0, "{member}");
}

/// RFC 9111 4.2.4: "A cache MUST NOT generate a stale response if it is
/// prohibited by an explicit in-protocol directive (e.g., by a no-cache
/// response directive, a must-revalidate response directive, or an
/// applicable s-maxage or proxy-revalidate response directive".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_proxy_revalidate_no_cache_and_s_maxage_prohibit_a_stale_response_when_the_origin_fails() {
    let p = proxy("").await;
    for cc in [
        "max-age=1, must-revalidate",
        "max-age=1, proxy-revalidate",
        "max-age=1, no-cache",
        "s-maxage=1",
    ] {
        let (r, asked) = stale_then_failing(&p, cc, Failing::Close).await;
        assert_eq!(r.status, 502, "{cc}: {:?} {:?}", r.headers, r.body_str());
        assert_ne!(r.body_str(), STORED, "{cc}");
        assert_ne!(x_cache(&r), "STALE", "{cc}");
        assert_eq!(asked, 2, "{cc}");
        // The origin's own error is passed on.
        let (r, _) = stale_then_failing(&p, cc, Failing::Unavailable).await;
        assert_eq!(r.status, 503, "{cc}: {:?}", r.headers);
        assert_eq!(r.body_str(), "origin down", "{cc}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_stale_on_error_past_its_expiry_the_error_is_returned() {
    // A window of 3 s, so that a loaded machine (CI runs many test
    // binaries at once) still makes the first check inside it.
    let p = proxy("max_stale_on_error = \"3s\"").await;
    let (o, _) = origin("max-age=1", Failing::Close).await;
    check(&get(&p, o.addr(), "/x").await, 200, STORED, "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    // Stale since well under 3 seconds: within the window.
    check(&get(&p, o.addr(), "/x").await, 200, STORED, "STALE");
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Stale since more than 4 seconds: past it.
    let r = get(&p, o.addr(), "/x").await;
    assert_eq!(r.status, 502, "{:?} {:?}", r.headers, r.body_str());
    assert_ne!(x_cache(&r), "STALE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_stale_on_error_of_zero_serves_stale_only_where_stale_if_error_allows() {
    let p = proxy("max_stale_on_error = \"0s\"").await;
    let (r, _) = stale_then_failing(&p, "max-age=1", Failing::Close).await;
    assert_eq!(r.status, 502, "{:?} {:?}", r.headers, r.body_str());
    let (r, _) = stale_then_failing(&p, "max-age=1, stale-if-error=60", Failing::Close).await;
    check(&r, 200, STORED, "STALE");
}
