//! The HTTP cache (RFC 9111, shared cache) end to end: the real `portico`
//! binary as a forward proxy (reverse for the Host test) with scripted
//! origins behind it. Every test checks what the client got (status, body,
//! `X-Cache`, `Age`, ...) and whether and how the origin was asked.
//!
//! Staleness comes from short lifetimes (`max-age=1`) and sleeping just past
//! them; nothing here asserts how long anything took.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Just past a `max-age=1` lifetime (ages are whole seconds).
const PAST_ONE_SECOND: Duration = Duration::from_millis(1100);
/// Bound on every wait for something the proxy does in the background.
const WAIT: Duration = Duration::from_secs(5);

/// A forward proxy with a cache under its temp dir; `cache_extra` is more
/// `[cache]` keys, `more` further sections.
async fn proxy_with(cache_extra: &str, more: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n{cache_extra}\n\n{more}"
    ))
    .await
}

async fn proxy(cache_extra: &str) -> Portico {
    proxy_with(cache_extra, "").await
}

/// Sends `METHOD http://origin/path` through the proxy with `headers` and
/// `Connection: close`, and parses the answer.
async fn send(p: &Portico, method: &str, origin: SocketAddr, path: &str, headers: &[(&str, &str)]) -> ParsedResponse {
    let mut req = format!("{method} http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\n");
    for (name, value) in headers {
        req += &format!("{name}: {value}\r\n");
    }
    req += "Connection: close\r\n\r\n";
    let bytes = raw_request(p.addr(), req.as_bytes()).await;
    if method == "HEAD" {
        parse_head_response(&bytes)
    } else {
        parse_response(&bytes)
    }
}

async fn get(p: &Portico, origin: &Origin, path: &str, headers: &[(&str, &str)]) -> ParsedResponse {
    send(p, "GET", origin.addr(), path, headers).await
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

/// An origin answering every request with `resp`.
async fn fixed(resp: Response) -> Origin {
    Origin::start(move |_| {
        let r = resp.clone();
        async move { r }
    })
    .await
}

/// An origin answering `"<body> #n"` (n counts requests from 1) with `headers`.
async fn counting(body: &'static str, headers: &'static [(&'static str, &'static str)]) -> Origin {
    let n = Arc::new(AtomicUsize::new(0));
    Origin::start(move |_| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut r = Response::ok(format!("{body} #{n}"));
            for (k, v) in headers {
                r = r.header(k, v);
            }
            r
        }
    })
    .await
}

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

fn day_ago() -> String {
    http_date(SystemTime::now() - Duration::from_secs(86_400))
}

/// `n` bytes of the harness pattern (byte `i` is `i % 251`).
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

// ---------------------------------------------------------------------------
// Storability.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storable_200_with_max_age_is_served_from_cache() {
    let origin = counting("body", &[("Cache-Control", "max-age=60")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/a", &[]).await, 200, "body #1", "MISS");
    let hit = get(&p, &origin, "/a", &[]).await;
    check(&hit, 200, "body #1", "HIT");
    assert_eq!(hit.header("cache-control"), Some("max-age=60"));
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_store_response_is_not_stored() {
    let origin = counting("body", &[("Cache-Control", "no-store, max-age=60")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/a", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/a", &[]).await, 200, "body #2", "MISS");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_no_store_is_not_stored() {
    let origin = counting("body", &[("Cache-Control", "max-age=60")]).await;
    let p = proxy("").await;
    let no_store = [("Cache-Control", "no-store")];
    check(&get(&p, &origin, "/a", &no_store).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/a", &[]).await, 200, "body #2", "MISS");
    check(&get(&p, &origin, "/a", &[]).await, 200, "body #2", "HIT");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_miss_is_not_stored() {
    let origin = counting("body", &[("Cache-Control", "max-age=60")]).await;
    let p = proxy("").await;
    let head = send(&p, "HEAD", origin.addr(), "/h", &[]).await;
    assert_eq!(head.status, 200);
    assert_eq!(x_cache(&head), "MISS");
    check(&get(&p, &origin, "/h", &[]).await, 200, "body #2", "MISS");
    check(&get(&p, &origin, "/h", &[]).await, 200, "body #2", "HIT");
    assert_eq!(origin.count(), 2);
    assert_eq!(origin.requests()[0].method, "HEAD");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_response_is_not_stored() {
    let origin = counting("body", &[("Cache-Control", "private, max-age=60")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/a", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/a", &[]).await, 200, "body #2", "MISS");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_request_is_stored_only_with_public_or_s_maxage() {
    let origin = Origin::start(|req| async move {
        let cc = match req.uri.path() {
            "/plain" => "max-age=60",
            "/public" => "public, max-age=60",
            _ => "s-maxage=60",
        };
        Response::ok(format!(
            "{} {}",
            req.uri.path(),
            req.header("authorization").unwrap_or("-")
        ))
        .header("Cache-Control", cc)
    })
    .await;
    let p = proxy("").await;
    let auth = [("Authorization", "Basic dTpw")];

    // max-age alone: not stored, both go to the origin.
    check(
        &get(&p, &origin, "/plain", &auth).await,
        200,
        "/plain Basic dTpw",
        "MISS",
    );
    check(
        &get(&p, &origin, "/plain", &auth).await,
        200,
        "/plain Basic dTpw",
        "MISS",
    );
    assert_eq!(origin.count(), 2);

    // public or s-maxage: stored.
    for path in ["/public", "/shared"] {
        let body = format!("{path} Basic dTpw");
        check(&get(&p, &origin, path, &auth).await, 200, &body, "MISS");
        check(&get(&p, &origin, path, &auth).await, 200, &body, "HIT");
    }
    assert_eq!(origin.count(), 4);
    assert!(
        origin
            .requests()
            .iter()
            .all(|r| r.header("authorization") == Some("Basic dTpw"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_with_max_age_is_stored() {
    let origin = fixed(Response::new(404).body("gone").header("Cache-Control", "max-age=60")).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/missing", &[]).await, 404, "gone", "MISS");
    check(&get(&p, &origin, "/missing", &[]).await, 404, "gone", "HIT");
    assert_eq!(origin.count(), 1);
}

/// One client's `Range` or `If-Match` must not decide what every later
/// client gets: an origin that puts `public, max-age=300` on every status
/// (as nginx's `add_header ... always` does) answers 416 and 412 to them;
/// before, those were stored and every plain GET of the URL was refused
/// from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_416_or_412_caused_by_one_clients_range_or_precondition_is_not_served_to_others() {
    let origin = Origin::start(|req| async move {
        let status = if req.header("range").is_some() {
            416
        } else if req.header("if-match").is_some() {
            412
        } else {
            200
        };
        Response::new(status)
            .body("body")
            .header("Cache-Control", "public, max-age=300")
            .header("ETag", "\"v1\"")
    })
    .await;
    let p = proxy("").await;
    let r = get(&p, &origin, "/r416", &[("Range", "bytes=9999-")]).await;
    assert_eq!(r.status, 416, "{:?}", r.headers);
    check(&get(&p, &origin, "/r416", &[]).await, 200, "body", "MISS");
    let r = get(&p, &origin, "/r412", &[("If-Match", "\"nope\"")]).await;
    assert_eq!(r.status, 412, "{:?}", r.headers);
    check(&get(&p, &origin, "/r412", &[]).await, 200, "body", "MISS");
    check(&get(&p, &origin, "/r412", &[]).await, 200, "body", "HIT");
    assert_eq!(origin.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_response_is_not_stored() {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Response::ok(format!("{} {} #{n}", req.method, String::from_utf8_lossy(&req.body)))
                .header("Cache-Control", "max-age=60")
        }
    })
    .await;
    let p = proxy("").await;
    let (o, paddr) = (origin.addr(), p.addr());
    let post = |_: u32| async move {
        let req =
            format!("POST http://{o}/p HTTP/1.1\r\nHost: {o}\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndata");
        parse_response(&raw_request(paddr, req.as_bytes()).await)
    };
    check(&post(1).await, 200, "POST data #1", "<none>");
    check(&post(2).await, 200, "POST data #2", "<none>");
    // Nor is a GET of the same URL answered from it.
    check(&get(&p, &origin, "/p", &[]).await, 200, "GET  #3", "MISS");
    assert_eq!(origin.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_star_is_not_stored() {
    let origin = counting("body", &[("Cache-Control", "max-age=60"), ("Vary", "*")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/v", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/v", &[]).await, 200, "body #2", "MISS");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_without_freshness_or_validator_is_not_stored() {
    // Not even with a refresh pattern whose min is 0: no heuristic lifetime
    // without Last-Modified (the cache-tests convention).
    let origin = counting("body", &[("Content-Type", "text/plain")]).await;
    let p = proxy("refresh = [{ pattern = \".\", min = \"0s\", percent = 10, max = \"1h\" }]").await;
    check(&get(&p, &origin, "/n", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/n", &[]).await, 200, "body #2", "MISS");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_may_use_heuristic_freshness_from_last_modified_by_default_or_by_refresh_pattern() {
    let lm = day_ago();
    let origin = Origin::start(move |_| {
        let lm = lm.clone();
        async move { Response::ok("heuristic").header("Last-Modified", &lm) }
    })
    .await;
    let p = proxy("refresh = [{ pattern = \".\", min = \"0s\", percent = 10, max = \"1h\" }]").await;
    check(&get(&p, &origin, "/h", &[]).await, 200, "heuristic", "MISS");
    check(&get(&p, &origin, "/h", &[]).await, 200, "heuristic", "HIT");
    assert_eq!(origin.count(), 1);

    // Without a refresh pattern the default heuristic applies: 10% of the
    // day since Last-Modified (RFC 9111 4.2.2), at most cache.heuristic_max.
    let p = proxy("").await;
    check(&get(&p, &origin, "/h", &[]).await, 200, "heuristic", "MISS");
    check(&get(&p, &origin, "/h", &[]).await, 200, "heuristic", "HIT");
    assert_eq!(origin.count(), 2);

    // Turned off, the stored response is stale at once and is revalidated.
    let p = proxy("heuristic_percent = 0").await;
    check(&get(&p, &origin, "/h", &[]).await, 200, "heuristic", "MISS");
    let again = get(&p, &origin, "/h", &[]).await;
    assert_ne!(x_cache(&again), "HIT");
    assert_eq!(origin.count(), 4);
    assert!(origin.requests()[3].header("if-modified-since").is_some());
}

// ---------------------------------------------------------------------------
// Freshness.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s_maxage_wins_over_max_age() {
    let origin = counting("body", &[("Cache-Control", "s-maxage=60, max-age=0")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/s", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/s", &[]).await, 200, "body #1", "HIT");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expires_in_the_future_is_fresh() {
    let origin = Origin::start(|_| async {
        Response::ok("expires").header("Expires", &http_date(SystemTime::now() + Duration::from_secs(3600)))
    })
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/e", &[]).await, 200, "expires", "MISS");
    check(&get(&p, &origin, "/e", &[]).await, 200, "expires", "HIT");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expires_in_the_past_is_not_fresh() {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |_| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Response::ok(format!("expired #{n}"))
                .header("Expires", &http_date(SystemTime::now() - Duration::from_secs(3600)))
        }
    })
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/e", &[]).await, 200, "expired #1", "MISS");
    check(&get(&p, &origin, "/e", &[]).await, 200, "expired #2", "MISS");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_header_on_hits_counts_the_origin_age() {
    let origin = fixed(
        Response::ok("aged")
            .header("Cache-Control", "max-age=3600")
            .header("Age", "30"),
    )
    .await;
    let p = proxy("").await;
    let miss = get(&p, &origin, "/age", &[]).await;
    check(&miss, 200, "aged", "MISS");
    let hit = get(&p, &origin, "/age", &[]).await;
    check(&hit, 200, "aged", "HIT");
    let ages = hit.headers_all("age");
    assert_eq!(ages.len(), 1, "exactly one Age: {:?}", hit.headers);
    let age: u64 = ages[0]
        .parse()
        .unwrap_or_else(|_| panic!("Age is not an integer: {:?}", ages[0]));
    assert!(age >= 30, "Age {age} < the origin's 30");
    assert!(age < 3600, "Age {age} is absurd");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_based_age_uses_its_first_member_and_an_invalid_age_is_ignored() {
    // RFC 9111 5.1: "a cache encountering a message with a list-based Age
    // field value SHOULD use the first member of the field value,
    // discarding subsequent ones", and "If the field value (after
    // discarding additional members ...) is invalid ..., a cache SHOULD
    // ignore the field" (cache-tests age-parse-*). max-age allows an hour.
    for (i, (age, fresh)) in [
        ("7200, 0", false),
        ("0, 7200", true),
        ("7200;foo=bar", false),
        ("-5", true),
        ("abc", true),
    ]
    .into_iter()
    .enumerate()
    {
        let n = Arc::new(AtomicUsize::new(0));
        let origin = Origin::start(move |_| {
            let n = n.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Response::ok(format!("aged #{n}"))
                    .header("Cache-Control", "max-age=3600")
                    .header("Age", age)
            }
        })
        .await;
        let p = proxy("").await;
        let path = format!("/age-{i}");
        check(&get(&p, &origin, &path, &[]).await, 200, "aged #1", "MISS");
        let again = get(&p, &origin, &path, &[]).await;
        let from_cache = if fresh {
            check(&again, 200, "aged #1", "HIT");
            again
        } else {
            check(&again, 200, "aged #2", "MISS");
            // A client that accepts stale gets the stored copy.
            let stale = get(&p, &origin, &path, &[("Cache-Control", "max-stale")]).await;
            check(&stale, 200, "aged #2", "STALE");
            stale
        };
        // From the cache, whatever the origin sent, the Age is one valid integer.
        let ages = from_cache.headers_all("age");
        assert!(ages.len() == 1 && ages[0].parse::<u64>().is_ok(), "{age:?}: {ages:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_age_with_a_fraction_counts_its_whole_seconds() {
    let origin = counting("fraction", &[("Cache-Control", "max-age=3600.5")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/f", &[]).await, 200, "fraction #1", "MISS");
    check(&get(&p, &origin, "/f", &[]).await, 200, "fraction #1", "HIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_max_age_values_the_more_restrictive_counts() {
    let origin = counting("twice", &[("Cache-Control", "max-age=3600, max-age=0")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/t", &[]).await, 200, "twice #1", "MISS");
    check(&get(&p, &origin, "/t", &[]).await, 200, "twice #2", "MISS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expires_date_with_a_wrong_weekday_in_lower_case_is_still_a_date() {
    let origin = Origin::start(|_| async {
        // One hour ahead, its weekday replaced by another, all in lower case.
        let date = http_date(SystemTime::now() + Duration::from_secs(3600));
        let weekday = if date.starts_with("Mon") { "tue" } else { "mon" };
        let expires = format!("{weekday}{}", &date[3..]).to_ascii_lowercase();
        Response::ok("lenient").header("Expires", &expires)
    })
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/x", &[]).await, 200, "lenient", "MISS");
    check(&get(&p, &origin, "/x", &[]).await, 200, "lenient", "HIT");
    assert_eq!(origin.count(), 1);
}

// ---------------------------------------------------------------------------
// Revalidation.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_etag_is_revalidated_and_304_refreshes_headers_and_freshness() {
    let origin = Origin::start(|req| async move {
        if req.header("if-none-match") == Some("\"v1\"") {
            Response::new(304)
                .header("ETag", "\"v1\"")
                .header("X-Version", "2")
                .header("Cache-Control", "max-age=60")
        } else {
            Response::ok("stored body")
                .header("ETag", "\"v1\"")
                .header("X-Version", "1")
                .header("Cache-Control", "max-age=1")
        }
    })
    .await;
    let p = proxy("").await;
    let first = get(&p, &origin, "/r", &[]).await;
    check(&first, 200, "stored body", "MISS");
    assert_eq!(first.header("x-version"), Some("1"));
    tokio::time::sleep(PAST_ONE_SECOND).await;

    let revalidated = get(&p, &origin, "/r", &[]).await;
    check(&revalidated, 200, "stored body", "REVALIDATED");
    assert_eq!(revalidated.header("x-version"), Some("2"), "{:?}", revalidated.headers);
    assert_eq!(revalidated.header("etag"), Some("\"v1\""));
    assert_eq!(origin.count(), 2);
    let reqs = origin.requests();
    assert_eq!(reqs[0].header("if-none-match"), None);
    assert_eq!(reqs[1].header("if-none-match"), Some("\"v1\""));

    // The 304 refreshed the stored response: fresh again.
    let hit = get(&p, &origin, "/r", &[]).await;
    check(&hit, 200, "stored body", "HIT");
    assert_eq!(hit.header("x-version"), Some("2"));
    assert_eq!(hit.header("cache-control"), Some("max-age=60"));
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_last_modified_is_revalidated_and_200_replaces_it() {
    let lm = day_ago();
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |_| {
        let lm = lm.clone();
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Response::ok("old body")
                    .header("Last-Modified", &lm)
                    .header("Cache-Control", "max-age=1")
            } else {
                Response::ok("new body")
                    .header("Last-Modified", &http_date(SystemTime::now()))
                    .header("Cache-Control", "max-age=60")
            }
        }
    })
    .await;
    let p = proxy("").await;
    let first = get(&p, &origin, "/lm", &[]).await;
    check(&first, 200, "old body", "MISS");
    let lm = first.header("last-modified").expect("Last-Modified").to_string();
    tokio::time::sleep(PAST_ONE_SECOND).await;

    let replaced = get(&p, &origin, "/lm", &[]).await;
    check(&replaced, 200, "new body", "MISS");
    assert_eq!(origin.count(), 2);
    let reqs = origin.requests();
    assert_eq!(reqs[1].header("if-modified-since"), Some(lm.as_str()));
    assert_eq!(reqs[1].header("if-none-match"), None);

    // The new response is stored once its last byte is sent: under load
    // the client may ask again before that.
    assert!(
        until(Duration::from_secs(5), || async {
            metric(&p, "portico_cache_stored_total").await == 2
        })
        .await,
        "the replacement was not stored"
    );
    check(&get(&p, &origin, "/lm", &[]).await, 200, "new body", "HIT");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_no_cache_is_revalidated_every_time() {
    let origin = Origin::start(|req| async move {
        if req.header("if-none-match") == Some("\"nc\"") {
            Response::new(304).header("ETag", "\"nc\"")
        } else {
            Response::ok("must check")
                .header("ETag", "\"nc\"")
                .header("Cache-Control", "no-cache, max-age=600")
        }
    })
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/nc", &[]).await, 200, "must check", "MISS");
    for n in 2..=3 {
        check(&get(&p, &origin, "/nc", &[]).await, 200, "must check", "REVALIDATED");
        assert_eq!(origin.count(), n);
        assert_eq!(origin.requests()[n - 1].header("if-none-match"), Some("\"nc\""));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revalidation_of_a_disk_object_updates_it_on_disk() {
    let origin = Origin::start(|req| async move {
        if req.header("if-none-match") == Some("\"d1\"") {
            Response::new(304)
                .header("ETag", "\"d1\"")
                .header("X-Version", "2")
                .header("Cache-Control", "max-age=60")
        } else {
            Response::ok("")
                .generated(100 << 10)
                .header("ETag", "\"d1\"")
                .header("X-Version", "1")
                .header("Cache-Control", "max-age=1")
        }
    })
    .await;
    let p = proxy("max_memory_object = \"4KiB\"").await;
    let first = get(&p, &origin, "/disk", &[]).await;
    assert_eq!((first.status, x_cache(&first)), (200, "MISS"));
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let r = get(&p, &origin, "/disk", &[]).await;
    assert_eq!(
        (r.status, x_cache(&r), r.header("x-version")),
        (200, "REVALIDATED", Some("2"))
    );
    assert_eq!(r.body, pattern(100 << 10));
    let r = get(&p, &origin, "/disk", &[]).await;
    assert_eq!((r.status, x_cache(&r), r.header("x-version")), (200, "HIT", Some("2")));
    assert_eq!(r.body, pattern(100 << 10));
    let r = get(&p, &origin, "/disk", &[("Range", "bytes=1000-1009")]).await;
    assert_eq!((r.status, x_cache(&r)), (206, "HIT"));
    assert_eq!(r.body, &pattern(1010)[1000..]);
    assert_eq!(origin.count(), 2);
}

// ---------------------------------------------------------------------------
// Client conditional requests answered from the cache.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_none_match_with_stored_etag_gets_304_from_cache() {
    let origin = fixed(
        Response::ok("tagged")
            .header("ETag", "\"abc\"")
            .header("Cache-Control", "max-age=60"),
    )
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/c", &[]).await, 200, "tagged", "MISS");
    let nm = get(&p, &origin, "/c", &[("If-None-Match", "\"xyz\", \"abc\"")]).await;
    check(&nm, 304, "", "HIT");
    assert_eq!(nm.header("etag"), Some("\"abc\""));
    assert!(nm.header("age").is_some());
    // A different tag gets the full response.
    check(
        &get(&p, &origin, "/c", &[("If-None-Match", "\"other\"")]).await,
        200,
        "tagged",
        "HIT",
    );
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_modified_since_after_last_modified_gets_304_from_cache() {
    let lm = day_ago();
    let origin = fixed(
        Response::ok("dated")
            .header("Last-Modified", &lm)
            .header("Cache-Control", "max-age=60"),
    )
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/d", &[]).await, 200, "dated", "MISS");
    let now = http_date(SystemTime::now());
    let nm = get(&p, &origin, "/d", &[("If-Modified-Since", &now)]).await;
    check(&nm, 304, "", "HIT");
    assert_eq!(nm.header("last-modified"), Some(lm.as_str()));
    // Earlier than Last-Modified: the full response.
    let before = http_date(SystemTime::now() - Duration::from_secs(2 * 86_400));
    check(
        &get(&p, &origin, "/d", &[("If-Modified-Since", &before)]).await,
        200,
        "dated",
        "HIT",
    );
    assert_eq!(origin.count(), 1);
}

// ---------------------------------------------------------------------------
// HEAD.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_served_from_the_stored_get() {
    let origin = fixed(Response::ok("twelve bytes").header("Cache-Control", "max-age=60")).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/head", &[]).await, 200, "twelve bytes", "MISS");
    let bytes = raw_request(
        p.addr(),
        format!(
            "HEAD http://{o}/head HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n",
            o = origin.addr()
        )
        .as_bytes(),
    )
    .await;
    let head = parse_head_response(&bytes);
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some("12"));
    assert_eq!(x_cache(&head), "HIT");
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("head end") + 4;
    assert_eq!(bytes.len(), end, "HEAD answer carries no body");
    assert_eq!(origin.count(), 1);
}

// ---------------------------------------------------------------------------
// Ranges from a stored object.
// ---------------------------------------------------------------------------

/// One part of a multipart/byteranges body.
struct Part {
    /// Content-Range: first and last byte (inclusive) and the total length.
    first: usize,
    last: usize,
    total: usize,
    /// Content-Type, if any.
    ctype: Option<String>,
    bytes: Vec<u8>,
}

/// Parses a multipart/byteranges body: each part's Content-Range (start,
/// end inclusive, total), Content-Type and bytes. Strict: every byte of the
/// body must be accounted for.
fn parse_byteranges(body: &[u8], boundary: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    let delimiter = format!("--{boundary}");
    let mut pos = 0;
    loop {
        if parts.is_empty() {
            assert!(
                body[pos..].starts_with(delimiter.as_bytes()),
                "body starts with the delimiter"
            );
        } else {
            assert!(
                body[pos..].starts_with(format!("\r\n{delimiter}").as_bytes()),
                "CRLF delimiter after a part"
            );
            pos += 2;
        }
        pos += delimiter.len();
        if body[pos..].starts_with(b"--") {
            assert_eq!(&body[pos..], b"--\r\n", "closing delimiter ends the body");
            return parts;
        }
        assert!(body[pos..].starts_with(b"\r\n"));
        pos += 2;
        let head_end = pos
            + body[pos..]
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("part head end");
        let head = std::str::from_utf8(&body[pos..head_end]).expect("part head is text");
        let mut range = None;
        let mut ctype = None;
        for line in head.split("\r\n") {
            let (name, value) = line.split_once(':').expect("part field");
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-range") {
                let spec = value.strip_prefix("bytes ").expect("bytes unit");
                let (r, total) = spec.split_once('/').unwrap();
                let (a, b) = r.split_once('-').unwrap();
                range = Some((
                    a.parse::<usize>().unwrap(),
                    b.parse::<usize>().unwrap(),
                    total.parse::<usize>().unwrap(),
                ));
            } else if name.eq_ignore_ascii_case("content-type") {
                ctype = Some(value.to_string());
            }
        }
        let (a, b, total) = range.expect("part has Content-Range");
        pos = head_end + 4;
        let len = b - a + 1;
        parts.push(Part {
            first: a,
            last: b,
            total,
            ctype,
            bytes: body[pos..pos + len].to_vec(),
        });
        pos += len;
    }
}

/// Single, multiple and unsatisfiable ranges of a stored `len`-byte object.
async fn check_ranges(p: &Portico, origin: &Origin, path: &str, len: usize) {
    let full = pattern(len);
    let first = get(p, origin, path, &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, full);
    assert_eq!(x_cache(&first), "MISS");

    // One range (crossing a 64 KiB read chunk when the object is that large).
    let (a, b) = if len > 70_000 { (65_000, 70_000) } else { (100, 199) };
    let single = get(p, origin, path, &[("Range", &format!("bytes={a}-{b}"))]).await;
    assert_eq!(single.status, 206, "{:?}", single.headers);
    assert_eq!(x_cache(&single), "HIT");
    assert_eq!(
        single.header("content-range"),
        Some(format!("bytes {a}-{b}/{len}").as_str())
    );
    assert_eq!(single.header("content-length"), Some((b - a + 1).to_string().as_str()));
    assert_eq!(single.body, &full[a..=b]);

    // A suffix range.
    let suffix = get(p, origin, path, &[("Range", "bytes=-10")]).await;
    assert_eq!(suffix.status, 206);
    assert_eq!(
        suffix.header("content-range"),
        Some(format!("bytes {}-{}/{len}", len - 10, len - 1).as_str())
    );
    assert_eq!(suffix.body, &full[len - 10..]);

    // Several ranges: multipart/byteranges, every part checked.
    let asked = [(0usize, 9usize), (len / 2, len / 2 + 99), (len - 5, len - 1)];
    let spec = asked
        .iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(", ");
    let multi = get(p, origin, path, &[("Range", &format!("bytes={spec}"))]).await;
    assert_eq!(multi.status, 206, "{:?}", multi.headers);
    assert_eq!(x_cache(&multi), "HIT");
    assert!(multi.header("content-range").is_none());
    let ctype = multi.header("content-type").expect("Content-Type");
    let boundary = ctype
        .strip_prefix("multipart/byteranges; boundary=")
        .unwrap_or_else(|| panic!("multipart type: {ctype}"));
    assert_eq!(
        multi.header("content-length"),
        Some(multi.body.len().to_string().as_str())
    );
    let parts = parse_byteranges(&multi.body, boundary);
    assert_eq!(parts.len(), asked.len());
    for (part, (ea, eb)) in parts.iter().zip(asked) {
        assert_eq!((part.first, part.last, part.total), (ea, eb, len));
        assert_eq!(part.ctype.as_deref(), Some("application/octet-stream"));
        assert_eq!(part.bytes.as_slice(), &full[ea..=eb], "part {ea}-{eb}");
    }

    // Several ranges asked in decreasing order: the parts come in that order.
    let asked = [(len - 100, len - 1), (len / 2, len / 2 + 9), (0usize, 9usize)];
    let spec = asked
        .iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(",");
    let multi = get(p, origin, path, &[("Range", &format!("bytes={spec}"))]).await;
    assert_eq!(multi.status, 206, "{:?}", multi.headers);
    let ctype = multi.header("content-type").expect("Content-Type");
    let boundary = ctype
        .strip_prefix("multipart/byteranges; boundary=")
        .expect("multipart");
    let parts = parse_byteranges(&multi.body, boundary);
    assert_eq!(parts.len(), asked.len());
    for (part, (ea, eb)) in parts.iter().zip(asked) {
        assert_eq!((part.first, part.last), (ea, eb));
        assert_eq!(part.bytes.as_slice(), &full[ea..=eb], "part {ea}-{eb}");
    }

    // If-Range with the stored validator: the range; with another: all of it.
    let etag = first.header("etag").expect("ETag").to_string();
    let ir = get(p, origin, path, &[("Range", "bytes=0-4"), ("If-Range", &etag)]).await;
    assert_eq!(ir.status, 206);
    assert_eq!(ir.body, &full[..5]);
    let ir = get(p, origin, path, &[("Range", "bytes=0-4"), ("If-Range", "\"other\"")]).await;
    assert_eq!(ir.status, 200);
    assert_eq!(ir.body, full);

    // Unsatisfiable.
    let none = get(p, origin, path, &[("Range", &format!("bytes={len}-"))]).await;
    assert_eq!(none.status, 416);
    assert_eq!(none.header("content-range"), Some(format!("bytes */{len}").as_str()));
    assert!(none.body.is_empty());
    assert_eq!(origin.count(), 1, "every range answered from the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_of_a_memory_object() {
    let origin = fixed(
        Response::ok("")
            .generated(1000)
            .header("Cache-Control", "max-age=60")
            .header("ETag", "\"r1\"")
            .header("Content-Type", "application/octet-stream"),
    )
    .await;
    let p = proxy("").await;
    check_ranges(&p, &origin, "/small", 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_of_a_disk_object() {
    let len = 100 << 10;
    let origin = fixed(
        Response::ok("")
            .generated(len as u64)
            .header("Cache-Control", "max-age=60")
            .header("ETag", "\"r1\"")
            .header("Content-Type", "application/octet-stream"),
    )
    .await;
    let p = proxy("max_memory_object = \"4KiB\"").await;
    check_ranges(&p, &origin, "/large", len).await;
    // It is served from the disk tier: the object file exists there.
    let files = cache_object_files(&p.dir().join("cache"));
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(std::fs::metadata(&files[0]).unwrap().len() > len as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_from_the_cache_keep_a_persistent_connection_in_step() {
    // Every kind of answer the cache makes (200, HEAD, 304, 206 single and
    // multipart, 416, 412), one after another and pipelined on one
    // connection, for a memory object and a disk object: each must be
    // framed exactly, or the next one would be read wrong.
    let origin = Origin::start(|req| async move {
        let len = if req.uri.path() == "/big" { 100 << 10 } else { 1000 };
        Response::ok("")
            .generated(len)
            .header("Cache-Control", "max-age=60")
            .header("ETag", "\"k\"")
            .header("Content-Type", "application/octet-stream")
    })
    .await;
    let p = proxy("max_memory_object = \"4KiB\"").await;
    let o = origin.addr();
    let mut c = RawClient::connect(p.addr()).await;
    for (path, len) in [("/small", 1000usize), ("/big", 100 << 10)] {
        let full = pattern(len);
        let req = |method: &str, extra: &str| format!("{method} http://{o}{path} HTTP/1.1\r\nHost: {o}\r\n{extra}\r\n");
        c.send(req("GET", "").as_bytes()).await;
        let r = c.read_response().await;
        assert_eq!((r.status, x_cache(&r)), (200, "MISS"));
        assert_eq!(r.body, full);
        // One at a time, then all of them pipelined.
        for pipelined in [false, true] {
            let asks = [
                req("GET", ""),
                req("HEAD", ""),
                req("GET", "If-None-Match: \"k\"\r\n"),
                req("GET", "Range: bytes=10-19\r\n"),
                req("GET", "Range: bytes=0-0,-1\r\n"),
                req("GET", &format!("Range: bytes={len}-\r\n")),
                req("GET", "If-Match: \"nope\"\r\n"),
            ];
            if pipelined {
                c.send(asks.concat().as_bytes()).await;
            }
            for (i, ask) in asks.iter().enumerate() {
                if !pipelined {
                    c.send(ask.as_bytes()).await;
                }
                let r = if i == 1 {
                    c.read_head_response().await
                } else {
                    c.read_response().await
                };
                let want = [200, 200, 304, 206, 206, 416, 412][i];
                assert_eq!(
                    r.status, want,
                    "{path} answer {i} (pipelined {pipelined}): {:?}",
                    r.headers
                );
                match i {
                    0 => assert_eq!(r.body, full),
                    1 => assert_eq!(r.header("content-length"), Some(len.to_string().as_str())),
                    3 => assert_eq!(r.body, &full[10..20]),
                    4 => {
                        let ctype = r.header("content-type").unwrap();
                        let boundary = ctype.strip_prefix("multipart/byteranges; boundary=").unwrap();
                        let parts = parse_byteranges(&r.body, boundary);
                        assert_eq!(parts.len(), 2);
                        assert_eq!(parts[0].bytes, &full[..1]);
                        assert_eq!(parts[1].bytes, &full[len - 1..]);
                    }
                    _ => {}
                }
            }
        }
    }
    assert_eq!(origin.count(), 2);
    assert!(!c.is_eof());
}

// ---------------------------------------------------------------------------
// Vary.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vary_keeps_one_variant_per_request_value() {
    let origin = Origin::start(|req| async move {
        let ae = req.header("accept-encoding").unwrap_or("none").to_string();
        Response::ok(format!("variant {ae}"))
            .header("Vary", "Accept-Encoding")
            .header("Cache-Control", "max-age=60")
    })
    .await;
    let p = proxy("").await;
    let gzip = [("Accept-Encoding", "gzip")];
    check(&get(&p, &origin, "/v", &gzip).await, 200, "variant gzip", "MISS");
    check(&get(&p, &origin, "/v", &[]).await, 200, "variant none", "MISS");
    assert_eq!(origin.count(), 2);
    check(&get(&p, &origin, "/v", &gzip).await, 200, "variant gzip", "HIT");
    check(&get(&p, &origin, "/v", &[]).await, 200, "variant none", "HIT");
    assert_eq!(origin.count(), 2);
    check(
        &get(&p, &origin, "/v", &[("Accept-Encoding", "br")]).await,
        200,
        "variant br",
        "MISS",
    );
    assert_eq!(origin.count(), 3);
    check(&get(&p, &origin, "/v", &gzip).await, 200, "variant gzip", "HIT");
    assert_eq!(origin.count(), 3);
}

/// A varying field the client names in `Connection` never reaches the
/// origin, so the response is the one for its absence, and it is stored
/// as that. Before, it was stored under the client's value: `X-Tenant:
/// acme` with `Connection: X-Tenant` filled acme's variant with the
/// tenant-less page for every later acme request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_varying_field_named_in_connection_selects_the_variant_for_its_absence() {
    let origin = Origin::start(|req| async move {
        let tenant = req.header("x-tenant").unwrap_or("none").to_string();
        Response::ok(format!("tenant {tenant}"))
            .header("Vary", "X-Tenant")
            .header("Cache-Control", "max-age=60")
    })
    .await;
    let p = proxy("").await;
    let attack = [("X-Tenant", "acme"), ("Connection", "X-Tenant")];
    check(&get(&p, &origin, "/dash", &attack).await, 200, "tenant none", "MISS");
    let acme = [("X-Tenant", "acme")];
    check(&get(&p, &origin, "/dash", &acme).await, 200, "tenant acme", "MISS");
    check(&get(&p, &origin, "/dash", &acme).await, 200, "tenant acme", "HIT");
    // The attacker's answer is the one for no tenant.
    check(&get(&p, &origin, "/dash", &[]).await, 200, "tenant none", "HIT");
    assert_eq!(origin.count(), 2);
}

/// A URL keeps at most 100 variants: the 101st removes the oldest, which
/// is then a miss, and the variants kept are still all removed when the
/// URL is invalidated. Without a limit, a client sending a new value with
/// every request grew one list that every Vary store rewrote under one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_keeps_at_most_100_variants_and_the_oldest_gives_way() {
    let origin = Origin::start(|req| async move {
        let v = req.header("x-v").unwrap_or("none").to_string();
        Response::ok(format!("v {v}"))
            .header("Vary", "X-V")
            .header("Cache-Control", "max-age=600")
    })
    .await;
    let p = proxy("").await;
    for i in 0..101 {
        let v = i.to_string();
        check(
            &get(&p, &origin, "/many", &[("X-V", &v)]).await,
            200,
            &format!("v {i}"),
            "MISS",
        );
    }
    assert_eq!(metric(&p, "portico_cache_variants_dropped_total").await, 1);
    check(&get(&p, &origin, "/many", &[("X-V", "100")]).await, 200, "v 100", "HIT");
    check(&get(&p, &origin, "/many", &[("X-V", "1")]).await, 200, "v 1", "HIT");
    check(&get(&p, &origin, "/many", &[("X-V", "0")]).await, 200, "v 0", "MISS");
    assert_eq!(origin.count(), 102);
    // An unsafe request invalidates every variant still listed.
    let r = send(&p, "DELETE", origin.addr(), "/many", &[]).await;
    assert_eq!(r.status, 200);
    check(&get(&p, &origin, "/many", &[("X-V", "50")]).await, 200, "v 50", "MISS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_for_different_variants_get_their_own() {
    // A request that finds another variant's fetch under way follows the
    // fetch of its own variant: one origin request per variant. (The slow
    // origin keeps every request inside the first fetch.)
    let origin = Origin::start(|req| async move {
        let ae = req.header("accept-encoding").unwrap_or("none").to_string();
        Response::ok(format!("variant {ae}"))
            .header("Vary", "Accept-Encoding")
            .header("Cache-Control", "max-age=60")
            .delay(Duration::from_millis(1000))
    })
    .await;
    let p = proxy("").await;
    let (paddr, oaddr) = (p.addr(), origin.addr());
    let tasks: Vec<_> = ["gzip", "br", "gzip", "br"]
        .into_iter()
        .map(|ae| {
            tokio::spawn(async move {
                let req = format!(
                    "GET http://{oaddr}/cv HTTP/1.1\r\nHost: {oaddr}\r\nAccept-Encoding: {ae}\r\nConnection: close\r\n\r\n"
                );
                (ae, parse_response(&raw_request(paddr, req.as_bytes()).await))
            })
        })
        .collect();
    for t in tasks {
        let (ae, r) = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body_str(), format!("variant {ae}"));
    }
    assert_eq!(origin.count(), 2, "one fetch per variant");
    check(
        &get(&p, &origin, "/cv", &[("Accept-Encoding", "gzip")]).await,
        200,
        "variant gzip",
        "HIT",
    );
    check(
        &get(&p, &origin, "/cv", &[("Accept-Encoding", "br")]).await,
        200,
        "variant br",
        "HIT",
    );
    assert_eq!(origin.count(), 2);
}

// ---------------------------------------------------------------------------
// Unsafe methods invalidate.
// ---------------------------------------------------------------------------

/// An origin counting GETs per path and answering POSTs with 200 (and a
/// `Location` naming the request's `X-Location`, if any).
async fn invalidation_origin() -> Origin {
    let n = Arc::new(AtomicUsize::new(0));
    Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if req.method != "GET" {
                if req.header("x-fail").is_some() {
                    return Response::new(500).body("failed");
                }
                let mut r = Response::ok("posted");
                if let Some(loc) = req.header("x-location") {
                    r = r.header("Location", loc);
                }
                r
            } else {
                Response::ok(format!("{} #{n}", req.uri.path())).header("Cache-Control", "max-age=60")
            }
        }
    })
    .await
}

async fn post(p: &Portico, origin: &Origin, path: &str, headers: &[(&str, &str)]) -> ParsedResponse {
    let mut all = headers.to_vec();
    all.push(("Content-Length", "0"));
    send(p, "POST", origin.addr(), path, &all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_invalidates_its_target() {
    let origin = invalidation_origin().await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/x", &[]).await, 200, "/x #1", "MISS");
    check(&get(&p, &origin, "/x", &[]).await, 200, "/x #1", "HIT");
    let posted = post(&p, &origin, "/x", &[]).await;
    assert_eq!(posted.status, 200);
    assert_eq!(posted.body_str(), "posted");
    check(&get(&p, &origin, "/x", &[]).await, 200, "/x #3", "MISS");
    assert_eq!(origin.count(), 3);
    // DELETE too.
    let deleted = send(&p, "DELETE", origin.addr(), "/x", &[]).await;
    assert_eq!(deleted.status, 200);
    check(&get(&p, &origin, "/x", &[]).await, 200, "/x #5", "MISS");
    // An unsafe request that fails changes nothing.
    let failed = post(&p, &origin, "/x", &[("X-Fail", "1")]).await;
    assert_eq!(failed.status, 500);
    check(&get(&p, &origin, "/x", &[]).await, 200, "/x #5", "HIT");
    assert_eq!(origin.count(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_location_invalidates_that_url() {
    let origin = invalidation_origin().await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/y", &[]).await, 200, "/y #1", "MISS");
    check(&get(&p, &origin, "/z", &[]).await, 200, "/z #2", "MISS");
    let posted = post(&p, &origin, "/x", &[("X-Location", "/y")]).await;
    assert_eq!(posted.status, 200);
    assert_eq!(posted.header("location"), Some("/y"));
    check(&get(&p, &origin, "/y", &[]).await, 200, "/y #4", "MISS");
    // Others are left alone.
    check(&get(&p, &origin, "/z", &[]).await, 200, "/z #2", "HIT");
    assert_eq!(origin.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_invalidates_every_variant() {
    post_invalidates_every_variant_with("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_invalidates_every_variant_of_disk_only_objects() {
    // Objects (and the list of variants) too large for the memory tier.
    post_invalidates_every_variant_with("max_memory_object = \"16B\"").await;
}

async fn post_invalidates_every_variant_with(cache_extra: &str) {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let ae = req.header("accept-encoding").unwrap_or("none").to_string();
            Response::ok(format!("{ae} #{n}"))
                .header("Vary", "Accept-Encoding")
                .header("Cache-Control", "max-age=60")
        }
    })
    .await;
    let p = proxy(cache_extra).await;
    let gzip = [("Accept-Encoding", "gzip")];
    check(&get(&p, &origin, "/x", &gzip).await, 200, "gzip #1", "MISS");
    check(&get(&p, &origin, "/x", &[]).await, 200, "none #2", "MISS");
    check(&get(&p, &origin, "/x", &gzip).await, 200, "gzip #1", "HIT");
    assert_eq!(post(&p, &origin, "/x", &[]).await.status, 200);
    check(&get(&p, &origin, "/x", &gzip).await, 200, "gzip #4", "MISS");
    check(&get(&p, &origin, "/x", &[]).await, 200, "none #5", "MISS");
    assert_eq!(origin.count(), 5);
}

// ---------------------------------------------------------------------------
// Request directives.
// ---------------------------------------------------------------------------

/// An origin whose response has an ETag and max-age=60, answering 304 to a
/// matching If-None-Match.
async fn etag_origin() -> Origin {
    Origin::start(|req| async move {
        if req.header("if-none-match") == Some("\"e1\"") {
            Response::new(304)
                .header("ETag", "\"e1\"")
                .header("Cache-Control", "max-age=60")
        } else {
            Response::ok("etagged")
                .header("ETag", "\"e1\"")
                .header("Cache-Control", "max-age=60")
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_no_cache_revalidates() {
    let origin = etag_origin().await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/nc", &[]).await, 200, "etagged", "MISS");
    let r = get(&p, &origin, "/nc", &[("Cache-Control", "no-cache")]).await;
    check(&r, 200, "etagged", "REVALIDATED");
    assert_eq!(origin.count(), 2);
    assert_eq!(origin.requests()[1].header("if-none-match"), Some("\"e1\""));
    // Pragma: no-cache (without Cache-Control) too.
    check(
        &get(&p, &origin, "/nc", &[("Pragma", "no-cache")]).await,
        200,
        "etagged",
        "REVALIDATED",
    );
    assert_eq!(origin.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_no_cache_is_ignored_with_ignore_reload() {
    let origin = etag_origin().await;
    let p = proxy("ignore_reload = true").await;
    check(&get(&p, &origin, "/nc", &[]).await, 200, "etagged", "MISS");
    check(
        &get(&p, &origin, "/nc", &[("Cache-Control", "no-cache")]).await,
        200,
        "etagged",
        "HIT",
    );
    check(
        &get(&p, &origin, "/nc", &[("Pragma", "no-cache")]).await,
        200,
        "etagged",
        "HIT",
    );
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_max_age_zero_revalidates() {
    let origin = etag_origin().await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/ma", &[]).await, 200, "etagged", "MISS");
    check(
        &get(&p, &origin, "/ma", &[("Cache-Control", "max-age=0")]).await,
        200,
        "etagged",
        "REVALIDATED",
    );
    assert_eq!(origin.count(), 2);
    assert_eq!(origin.requests()[1].header("if-none-match"), Some("\"e1\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_if_cached_miss_is_504_without_contacting_the_origin() {
    let origin = etag_origin().await;
    let p = proxy("").await;
    let r = get(&p, &origin, "/oic", &[("Cache-Control", "only-if-cached")]).await;
    assert_eq!(r.status, 504, "{:?}", r.headers);
    assert_eq!(origin.count(), 0);
    // Once stored, it is served.
    check(&get(&p, &origin, "/oic", &[]).await, 200, "etagged", "MISS");
    check(
        &get(&p, &origin, "/oic", &[("Cache-Control", "only-if-cached")]).await,
        200,
        "etagged",
        "HIT",
    );
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_stale_serves_a_stale_response_without_the_origin() {
    let origin = counting("body", &[("Cache-Control", "max-age=1"), ("ETag", "\"s\"")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/ms", &[]).await, 200, "body #1", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let stale = get(&p, &origin, "/ms", &[("Cache-Control", "max-stale=60")]).await;
    check(&stale, 200, "body #1", "STALE");
    let age: u64 = stale.header("age").expect("Age").parse().unwrap();
    assert!(age >= 1, "a stale response is at least max-age old: {age}");
    check(
        &get(&p, &origin, "/ms", &[("Cache-Control", "max-stale")]).await,
        200,
        "body #1",
        "STALE",
    );
    // only-if-cached: stale and no max-stale is a 504, never the origin.
    let r = get(&p, &origin, "/ms", &[("Cache-Control", "only-if-cached")]).await;
    assert_eq!(r.status, 504);
    let r = get(&p, &origin, "/ms", &[("Cache-Control", "only-if-cached, max-stale")]).await;
    check(&r, 200, "body #1", "STALE");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_fresh_beyond_the_remaining_freshness_goes_to_the_origin() {
    let origin = etag_origin().await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/mf", &[]).await, 200, "etagged", "MISS");
    check(
        &get(&p, &origin, "/mf", &[("Cache-Control", "min-fresh=10")]).await,
        200,
        "etagged",
        "HIT",
    );
    assert_eq!(origin.count(), 1);
    let r = get(&p, &origin, "/mf", &[("Cache-Control", "min-fresh=120")]).await;
    check(&r, 200, "etagged", "REVALIDATED");
    assert_eq!(origin.count(), 2);
}

// ---------------------------------------------------------------------------
// Stale responses and origin errors.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_is_not_served_stale_when_the_origin_is_down() {
    let origin =
        fixed(Response::ok("strict").header("Cache-Control", "max-age=1, must-revalidate, stale-if-error=60")).await;
    let addr = origin.addr();
    let p = proxy("").await;
    check(&send(&p, "GET", addr, "/mr", &[]).await, 200, "strict", "MISS");
    drop(origin);
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let r = send(&p, "GET", addr, "/mr", &[]).await;
    assert!(r.status == 502 || r.status == 504, "{} {:?}", r.status, r.headers);
    assert_ne!(r.body_str(), "strict");
    assert_ne!(x_cache(&r), "STALE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_stale_when_the_origin_is_down() {
    let origin = fixed(Response::ok("fallback").header("Cache-Control", "max-age=1, stale-if-error=60")).await;
    let addr = origin.addr();
    let p = proxy("").await;
    check(&send(&p, "GET", addr, "/sie", &[]).await, 200, "fallback", "MISS");
    drop(origin);
    tokio::time::sleep(PAST_ONE_SECOND).await;
    check(&send(&p, "GET", addr, "/sie", &[]).await, 200, "fallback", "STALE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_stale_when_the_origin_answers_503() {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |_| {
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Response::ok("good").header("Cache-Control", "max-age=1, stale-if-error=60")
            } else {
                Response::new(503).body("down")
            }
        }
    })
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/503", &[]).await, 200, "good", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    check(&get(&p, &origin, "/503", &[]).await, 200, "good", "STALE");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_serves_stale_and_refreshes_once_in_the_background() {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |_| {
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Response::ok("v1").header("Cache-Control", "max-age=1, stale-while-revalidate=30")
            } else {
                Response::ok("v2").header("Cache-Control", "max-age=60")
            }
        }
    })
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/swr", &[]).await, 200, "v1", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    check(&get(&p, &origin, "/swr", &[]).await, 200, "v1", "STALE");
    assert!(
        origin.wait_count(2, WAIT).await,
        "the background revalidation reached the origin"
    );

    // Until the refresh is stored, the stale one may still be served; then a HIT.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = get(&p, &origin, "/swr", &[]).await;
        if x_cache(&r) == "HIT" {
            check(&r, 200, "v2", "HIT");
            break;
        }
        check(&r, 200, "v1", "STALE");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refreshed response was never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.count(), 2, "exactly one background request");
}

/// `origin.idle_timeout` bounds the silence of every response body,
/// including a background revalidation's: one whose new response stalls
/// mid-body gives up, and frees the object's one refresh slot for the next
/// stale hit (else no refresh would ever start again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_revalidation_whose_response_stalls_gives_up_after_the_idle_timeout() {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |_| {
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move {
            match n {
                0 => Response::ok("v1").header("Cache-Control", "max-age=1, stale-while-revalidate=60"),
                // The first refresh: one chunk, then a minute of silence.
                1 => Response::ok("")
                    .header("Cache-Control", "max-age=60")
                    .chunked(["v2-", "never"], &[])
                    .chunk_delay(Duration::from_secs(60)),
                _ => Response::ok("v2").header("Cache-Control", "max-age=60"),
            }
        }
    })
    .await;
    let p = proxy_with("", "[origin]\nidle_timeout = \"1s\"\n").await;
    check(&get(&p, &origin, "/stall", &[]).await, 200, "v1", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    check(&get(&p, &origin, "/stall", &[]).await, 200, "v1", "STALE");
    assert!(origin.wait_count(2, WAIT).await, "the first refresh reached the origin");

    // Past the idle timeout, a stale hit starts a second refresh, which
    // completes: the next requests get its response.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    check(&get(&p, &origin, "/stall", &[]).await, 200, "v1", "STALE");
    assert!(
        origin.wait_count(3, WAIT).await,
        "a second refresh once the stalled one timed out"
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = get(&p, &origin, "/stall", &[]).await;
        if x_cache(&r) == "HIT" {
            check(&r, 200, "v2", "HIT");
            break;
        }
        check(&r, 200, "v1", "STALE");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second refresh was never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An origin whose first response is `v1` (max-age=1,
/// stale-while-revalidate=30) and later ones `v2` (max-age=60); it honours
/// `Range` with a 206, as real servers do.
async fn swr_origin() -> Origin {
    let n = Arc::new(AtomicUsize::new(0));
    Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move {
            let body: &[u8] = if n == 0 { b"v1 body" } else { b"v2 body" };
            let cc = if n == 0 {
                "max-age=1, stale-while-revalidate=30"
            } else {
                "max-age=60"
            };
            if let Some(spec) = req.header("range").and_then(|r| r.strip_prefix("bytes=")) {
                let (a, b) = spec.split_once('-').unwrap();
                let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                return Response::new(206)
                    .body(body[a..=b].to_vec())
                    .header("Content-Range", &format!("bytes {a}-{b}/{}", body.len()))
                    .header("Cache-Control", cc);
            }
            Response::ok(body).header("Cache-Control", cc)
        }
    })
    .await
}

/// After a stale answer that started a background refresh, polls until the
/// refreshed response is served (bounded); no other request may reach the origin.
async fn wait_refreshed(p: &Portico, origin: &Origin) {
    assert!(
        origin.wait_count(2, WAIT).await,
        "the background refresh reached the origin"
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = get(p, origin, "/swr", &[]).await;
        if x_cache(&r) == "HIT" {
            check(&r, 200, "v2 body", "HIT");
            break;
        }
        check(&r, 200, "v1 body", "STALE");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refreshed response was never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.count(), 2, "exactly one background request");
    let refresh = &origin.requests()[1];
    assert_eq!(refresh.method, "GET");
    assert_eq!(refresh.header("range"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_started_by_head_refreshes_with_get() {
    let origin = swr_origin().await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/swr", &[]).await, 200, "v1 body", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let head = send(&p, "HEAD", origin.addr(), "/swr", &[]).await;
    assert_eq!(head.status, 200);
    assert_eq!(x_cache(&head), "STALE");
    assert_eq!(head.header("content-length"), Some("7"));
    wait_refreshed(&p, &origin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_while_revalidate_started_by_a_range_refreshes_the_whole_response() {
    let origin = swr_origin().await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/swr", &[]).await, 200, "v1 body", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let part = get(&p, &origin, "/swr", &[("Range", "bytes=0-1")]).await;
    check(&part, 206, "v1", "STALE");
    assert_eq!(part.header("content-range"), Some("bytes 0-1/7"));
    wait_refreshed(&p, &origin).await;
}

// ---------------------------------------------------------------------------
// Request collapsing.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_collapse_into_one_origin_request() {
    const LEN: u64 = 256 << 10;
    let origin = fixed(
        Response::ok("")
            .generated(LEN)
            .header("Cache-Control", "max-age=60")
            .delay(Duration::from_millis(500)),
    )
    .await;
    let p = proxy("").await;
    let (paddr, oaddr) = (p.addr(), origin.addr());
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(async move {
                let req = format!("GET http://{oaddr}/collapse HTTP/1.1\r\nHost: {oaddr}\r\nConnection: close\r\n\r\n");
                parse_response(&raw_request_timeout(paddr, req.as_bytes(), Duration::from_secs(30)).await)
            })
        })
        .collect();
    let mut misses = 0;
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len() as u64, LEN);
        assert!(pattern_matches(0, &r.body), "body corrupt");
        match x_cache(&r) {
            "MISS" => misses += 1,
            "HIT" => {}
            other => panic!("X-Cache {other}"),
        }
    }
    assert_eq!(origin.count(), 1);
    assert_eq!(misses, 1, "only the leader fetched");
    // The statistics keep the requests that waited for the leader's fetch
    // apart from hits (they had a miss's wait): COLLAPSED, as many as the
    // collapsed-request counter, and with the hits, every follower.
    let s = stats_snapshot(&p).await;
    let by_cache = |name: &str| -> u64 {
        s["requests"]["by_cache"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e[0] == name))
            .and_then(|e| e[1].as_u64())
            .unwrap_or_else(|| panic!("no {name} in requests.by_cache: {}", s["requests"]))
    };
    assert_eq!(by_cache("MISS"), 1, "{}", s["requests"]);
    assert!(by_cache("COLLAPSED") > 0, "{}", s["requests"]);
    assert_eq!(
        by_cache("COLLAPSED"),
        s["cache"]["collapsed"].as_u64().unwrap_or(0),
        "{s}"
    );
    assert_eq!(by_cache("COLLAPSED") + by_cache("HIT"), 49, "{}", s["requests"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_for_an_unstorable_response_each_go_to_the_origin() {
    // Nothing to share: the waiting requests fetch for themselves, and
    // every client gets its own, complete answer.
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |_| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Response::ok(format!("private #{n}"))
                .header("Cache-Control", "private")
                .delay(Duration::from_millis(300))
        }
    })
    .await;
    let p = proxy("").await;
    let (paddr, oaddr) = (p.addr(), origin.addr());
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            tokio::spawn(async move {
                let req = format!("GET http://{oaddr}/u HTTP/1.1\r\nHost: {oaddr}\r\nConnection: close\r\n\r\n");
                parse_response(&raw_request(paddr, req.as_bytes()).await)
            })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!((r.status, x_cache(&r)), (200, "MISS"));
        bodies.push(r.body_str());
    }
    bodies.sort();
    let want: Vec<String> = (1..=5).map(|n| format!("private #{n}")).collect();
    assert_eq!(bodies, want, "each got its own response");
    assert_eq!(origin.count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collapsed_followers_get_an_age_no_less_than_the_origin_age() {
    let origin = fixed(
        Response::ok("aged")
            .header("Cache-Control", "max-age=3600")
            .header("Age", "30")
            .delay(Duration::from_millis(300)),
    )
    .await;
    let p = proxy("").await;
    let (paddr, oaddr) = (p.addr(), origin.addr());
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let req = format!("GET http://{oaddr}/age HTTP/1.1\r\nHost: {oaddr}\r\nConnection: close\r\n\r\n");
                parse_response(&raw_request(paddr, req.as_bytes()).await)
            })
        })
        .collect();
    let mut hits = 0;
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.body_str(), "aged");
        let ages = r.headers_all("age");
        assert_eq!(ages.len(), 1, "{:?}", r.headers);
        let age: u64 = ages[0].parse().unwrap();
        assert!(age >= 30, "{}: Age {age} understates the origin's 30", x_cache(&r));
        hits += usize::from(x_cache(&r) == "HIT");
    }
    assert_eq!(hits, 3);
    assert_eq!(origin.count(), 1);
}

/// A raw client connection reading a response incrementally.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Conn {
    async fn get(proxy: SocketAddr, origin: SocketAddr, path: &str) -> Conn {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        let req = format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        Conn {
            stream,
            buf: Vec::new(),
            eof: false,
        }
    }

    fn head_end(&self) -> Option<usize> {
        self.buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
    }

    /// Reads until the head and at least `n` bytes after it have arrived;
    /// panics after 5 s.
    async fn read_head_and(&mut self, n: usize) -> (String, Vec<u8>) {
        assert!(
            self.got_head_and(n, WAIT).await,
            "closed early or timed out; have {:?}",
            String::from_utf8_lossy(&self.buf[..self.buf.len().min(4096)])
        );
        let end = self.head_end().expect("a head");
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        (head, self.buf[end..].to_vec())
    }

    /// Reads until the head and at least `n` bytes after it have arrived,
    /// for at most `within`: whether they did.
    async fn got_head_and(&mut self, n: usize, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        let mut tmp = [0u8; 65536];
        loop {
            if self.head_end().is_some_and(|end| self.buf.len() >= end + n) {
                return true;
            }
            match tokio::time::timeout_at(deadline, self.stream.read(&mut tmp)).await {
                Ok(Ok(k)) if k > 0 => self.buf.extend_from_slice(&tmp[..k]),
                _ => return false,
            }
        }
    }

    /// Body bytes received so far.
    fn body_len(&self) -> usize {
        self.head_end().map_or(0, |end| self.buf.len() - end)
    }

    /// Reads until the peer closes (or 5 s pass); all bytes received.
    async fn finish(mut self) -> (Vec<u8>, bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut tmp = [0u8; 65536];
        while !self.eof {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut tmp)).await {
                Ok(Ok(0)) | Ok(Err(_)) => self.eof = true,
                Ok(Ok(k)) => self.buf.extend_from_slice(&tmp[..k]),
                Err(_) => break,
            }
        }
        (self.buf, self.eof)
    }
}

fn head_field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// An origin whose first response sends its head and `first`, then waits
/// for `release` before sending `rest` (or, with `fail`, closing instead);
/// later requests get the whole body at once. `got` is notified when the
/// first request has arrived. Counts requests.
struct HeldOrigin {
    raw: RawOrigin,
    got: Arc<Notify>,
    release: Arc<Notify>,
    requests: Arc<AtomicUsize>,
}

impl HeldOrigin {
    async fn start(chunked: bool, first: &'static [u8], rest: &'static [u8], fail: bool) -> HeldOrigin {
        let got = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let requests = Arc::new(AtomicUsize::new(0));
        let (g, r, n) = (got.clone(), release.clone(), requests.clone());
        let raw = RawOrigin::start(move |mut s| {
            let (got, release, n) = (g.clone(), r.clone(), n.clone());
            async move {
                read_request_head(&mut s).await;
                let i = n.fetch_add(1, Ordering::SeqCst);
                let framing = if chunked {
                    "Transfer-Encoding: chunked".to_string()
                } else {
                    format!("Content-Length: {}", first.len() + rest.len())
                };
                let head = format!("HTTP/1.1 200 OK\r\n{framing}\r\nCache-Control: max-age=60\r\n\r\n");
                let enc = |b: &[u8]| if chunked { chunked_piece(b) } else { b.to_vec() };
                let mut out = head.into_bytes();
                out.extend(enc(first));
                if i > 0 {
                    out.extend(enc(rest));
                    if chunked {
                        out.extend_from_slice(b"0\r\n\r\n");
                    }
                    let _ = s.write_all(&out).await;
                    return;
                }
                let _ = s.write_all(&out).await;
                got.notify_one();
                release.notified().await;
                if fail {
                    return; // closes the connection mid-body
                }
                let mut out = enc(rest);
                if chunked {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                let _ = s.write_all(&out).await;
                // Let the proxy read the end before the connection closes.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        HeldOrigin {
            raw,
            got,
            release,
            requests,
        }
    }
}

fn chunked_piece(b: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", b.len()).into_bytes();
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collapsed_followers_get_the_body_as_it_arrives() {
    let origin = HeldOrigin::start(false, b"first part|", b"the rest", false).await;
    let p = proxy("").await;
    let o = origin.raw.addr();

    let mut leader = Conn::get(p.addr(), o, "/stream").await;
    tokio::time::timeout(WAIT, origin.got.notified())
        .await
        .expect("origin got the request");
    let (head, body) = leader.read_head_and(11).await;
    assert_eq!(head_field(&head, "x-cache"), Some("MISS"));
    assert_eq!(body, b"first part|");

    // The origin still holds the rest: a second request follows the fetch
    // and gets the head and the first part now.
    let mut follower = Conn::get(p.addr(), o, "/stream").await;
    let (fhead, fbody) = follower.read_head_and(11).await;
    assert!(fhead.starts_with("HTTP/1.1 200"), "{fhead}");
    assert_eq!(head_field(&fhead, "x-cache"), Some("HIT"), "{fhead}");
    assert_eq!(head_field(&fhead, "content-length"), Some("19"));
    assert_eq!(fbody, b"first part|");

    origin.release.notify_one();
    for conn in [leader, follower] {
        let (bytes, eof) = conn.finish().await;
        assert!(eof);
        let r = parse_response(&bytes);
        assert_eq!(r.status, 200);
        assert_eq!(r.body_str(), "first part|the rest");
    }
    assert_eq!(origin.requests.load(Ordering::SeqCst), 1);
    // And it was stored.
    let again = send(&p, "GET", o, "/stream", &[]).await;
    check(&again, 200, "first part|the rest", "HIT");
    assert_eq!(origin.requests.load(Ordering::SeqCst), 1);
}

/// A client collapsed onto another's fetch that stops reading holds little:
/// once it is `LAG_LIMIT` (4 MiB) behind, its part of the spool is dropped,
/// and when it reads again it gets the rest from the stored object. Before,
/// it kept every byte it had not read in memory (a 96 MiB object: 96 MiB
/// for as long as its connection lasted; three such clients held 900 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collapsed_client_that_stops_reading_pins_little_and_later_gets_the_rest_from_the_store() {
    const LEN: u64 = 96 << 20;
    let origin = Origin::start(|_| async move {
        Response::ok("")
            .generated(LEN)
            .header("Cache-Control", "max-age=600")
            .delay(Duration::from_millis(500))
    })
    .await;
    let p = proxy("").await;
    let o = origin.addr();
    let request = format!("GET http://{o}/big HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");
    let (first, grown, r) = fast_and_stalled_clients(&p, &request).await;
    assert_eq!((first.status, first.body.len() as u64), (200, LEN));
    assert!(pattern_matches(0, &first.body));
    // While the fetch is over and stored and the slow client reads nothing.
    assert!(
        grown < 40 << 10,
        "a collapsed client that reads nothing grew Portico by {grown} KiB"
    );
    // When it reads, it gets the whole response.
    assert_eq!(r.status, 200, "{:?}", r.headers);
    assert_eq!(x_cache(&r), "HIT", "collapsed: {:?}", r.headers);
    assert_eq!(r.body.len() as u64, LEN);
    assert!(pattern_matches(0, &r.body), "the body is the object's, in order");
    assert_eq!(origin.count(), 1);
}

/// The origin breaks the first response mid-body: the leader's and the
/// follower's clients are cut off (never a short response that looks
/// complete), nothing is stored, and the next request fetches again.
async fn leader_failure(chunked: bool) {
    let origin = HeldOrigin::start(chunked, b"partial|", b"and the missing rest", true).await;
    let p = proxy("").await;
    let o = origin.raw.addr();

    let mut leader = Conn::get(p.addr(), o, "/broken").await;
    tokio::time::timeout(WAIT, origin.got.notified())
        .await
        .expect("origin got the request");
    let (head, _) = leader.read_head_and(if chunked { 1 } else { 8 }).await;
    assert_eq!(head_field(&head, "x-cache"), Some("MISS"));
    let mut follower = Conn::get(p.addr(), o, "/broken").await;
    let (fhead, _) = follower.read_head_and(1).await;
    assert_eq!(head_field(&fhead, "x-cache"), Some("HIT"), "{fhead}");

    origin.release.notify_one();
    for (who, conn) in [("leader", leader), ("follower", follower)] {
        let (bytes, eof) = conn.finish().await;
        assert!(eof, "{who}: connection closed");
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let body = &bytes[end..];
        if chunked {
            assert_eq!(head_field(&head, "transfer-encoding"), Some("chunked"), "{who}: {head}");
            assert!(
                !body.ends_with(b"0\r\n\r\n"),
                "{who}: a broken body must not end with the last chunk"
            );
        } else {
            let len: usize = head_field(&head, "content-length").unwrap().parse().unwrap();
            assert_eq!(len, 28);
            assert!(body.len() < len, "{who}: got the whole body from a broken fetch?");
        }
        assert!(!String::from_utf8_lossy(body).contains("missing rest"));
    }

    let again = send(&p, "GET", o, "/broken", &[]).await;
    check(&again, 200, "partial|and the missing rest", "MISS");
    assert_eq!(origin.requests.load(Ordering::SeqCst), 2);
    check(
        &send(&p, "GET", o, "/broken", &[]).await,
        200,
        "partial|and the missing rest",
        "HIT",
    );
    assert_eq!(origin.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failure_cuts_followers_off_content_length() {
    leader_failure(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failure_cuts_followers_off_chunked() {
    leader_failure(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_miss_does_not_hold_its_body_in_memory() {
    // Stored on disk while it streams: neither the store nor the collapsing
    // spool may keep the 64 MiB body in memory.
    const LEN: u64 = 64 << 20;
    let origin = fixed(Response::ok("").generated(LEN).header("Cache-Control", "max-age=60")).await;
    let p = proxy("").await;
    let before = p.hwm_kib();
    let req = format!(
        "GET http://{o}/big HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n",
        o = origin.addr()
    );
    let r = parse_response(&raw_request_timeout(p.addr(), req.as_bytes(), Duration::from_secs(60)).await);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len() as u64, LEN);
    assert!(pattern_matches(0, &r.body));
    let grown = p.hwm_kib().saturating_sub(before);
    assert!(
        grown < 24 << 10,
        "peak memory grew by {grown} KiB for a {LEN}-byte miss"
    );
    let r = parse_response(&raw_request_timeout(p.addr(), req.as_bytes(), Duration::from_secs(60)).await);
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.body.len() as u64, LEN);
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_follower_of_a_large_fetch_is_served_without_a_second_origin_request() {
    // 8 MiB trickled in 64 KiB pieces: a request arriving once more than
    // the collapsing spool has streamed cannot start from the spool; it
    // reads the fetch's file, then the stored object, without a second
    // origin request.
    const LEN: u64 = 8 << 20;
    let origin = fixed(
        Response::ok("")
            .generated(LEN)
            .header("Cache-Control", "max-age=60")
            .chunk_delay(Duration::from_millis(5)),
    )
    .await;
    let p = proxy("").await;
    let mut leader = Conn::get(p.addr(), origin.addr(), "/late").await;
    let (head, _) = leader.read_head_and(2 << 20).await;
    assert_eq!(head_field(&head, "x-cache"), Some("MISS"));
    let late = tokio::spawn({
        let (paddr, oaddr) = (p.addr(), origin.addr());
        async move {
            let req = format!("GET http://{oaddr}/late HTTP/1.1\r\nHost: {oaddr}\r\nConnection: close\r\n\r\n");
            parse_response(&raw_request_timeout(paddr, req.as_bytes(), Duration::from_secs(30)).await)
        }
    });
    let (bytes, eof) = leader.finish().await;
    assert!(eof);
    let r = parse_response(&bytes);
    assert_eq!(r.body.len() as u64, LEN);
    assert!(pattern_matches(0, &r.body));
    let r = late.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(x_cache(&r), "HIT");
    assert_eq!(r.body.len() as u64, LEN);
    assert!(pattern_matches(0, &r.body));
    assert_eq!(origin.count(), 1);
}

/// How [`gated_pattern_origin`] frames and ends its body.
#[derive(Clone, Copy, PartialEq)]
enum Framing {
    /// `Content-Length`, the whole body.
    Length,
    /// Chunked (no length known ahead), the whole body.
    Chunked,
    /// `Content-Length`, but the connection is closed at the last stop.
    BrokenAtLastStop,
}

/// An origin that sends `len` pattern bytes (`Cache-Control: max-age=60`),
/// pausing at each of `stops` (body offsets) until the test adds a permit
/// to the semaphore; counts its requests.
async fn gated_pattern_origin(
    len: u64,
    stops: &'static [u64],
    framing: Framing,
) -> (RawOrigin, Arc<tokio::sync::Semaphore>, Arc<AtomicUsize>) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (g, n) = (gate.clone(), requests.clone());
    let origin = RawOrigin::start(move |mut s| {
        let (gate, requests) = (g.clone(), n.clone());
        async move {
            read_request_head(&mut s).await;
            requests.fetch_add(1, Ordering::SeqCst);
            let length = if framing == Framing::Chunked {
                "Transfer-Encoding: chunked".to_string()
            } else {
                format!("Content-Length: {len}")
            };
            let head = format!("HTTP/1.1 200 OK\r\n{length}\r\nCache-Control: max-age=60\r\n\r\n");
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut at = 0u64;
            for &stop in stops.iter().chain(std::iter::once(&len)) {
                let piece = &body[at as usize..stop as usize];
                let sent = if framing == Framing::Chunked && !piece.is_empty() {
                    let mut framed = format!("{:x}\r\n", piece.len()).into_bytes();
                    framed.extend_from_slice(piece);
                    framed.extend_from_slice(b"\r\n");
                    s.write_all(&framed).await
                } else {
                    s.write_all(piece).await
                };
                if sent.is_err() {
                    return;
                }
                at = stop;
                if stop < len {
                    gate.acquire().await.expect("gate").forget();
                    if framing == Framing::BrokenAtLastStop && stops.last() == Some(&stop) {
                        return;
                    }
                }
            }
            if framing == Framing::Chunked {
                let _ = s.write_all(b"0\r\n\r\n").await;
            }
        }
    })
    .await;
    (origin, gate, requests)
}

/// Reads each connection to its end: a 200 with the whole `len` bytes of
/// the pattern, in order.
async fn whole_pattern_bodies<const N: usize>(conns: [Conn; N], len: u64) {
    for conn in conns {
        let (bytes, eof) = conn.finish().await;
        assert!(eof);
        let r = parse_response(&bytes);
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len() as u64, len);
        assert!(pattern_matches(0, &r.body), "the body is the object's, in order");
    }
}

/// A request for an object whose fetch has streamed past the collapsing
/// spool (1 MiB) is served from the disk tier's file as the fetch writes
/// it, as Squid's collapsed requests and ATS's read-while-writer are: it
/// gets its head and the body written so far while the origin is still
/// sending. Before, it got nothing until the fetch had ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_follower_reads_the_fetch_from_disk_while_it_runs() {
    late_follower_served_while_the_fetch_runs("").await;
}

/// Two requests for an 8 MiB object, the second once the origin has sent
/// 4 MiB and waits (past the spool's 1 MiB): it must get 3 MiB before the
/// origin goes on, then both the whole body, from one origin request.
async fn late_follower_served_while_the_fetch_runs(cache_extra: &str) {
    const LEN: u64 = 8 << 20;
    let (origin, gate, requests) = gated_pattern_origin(LEN, &[4 << 20], Framing::Length).await;
    let p = proxy(cache_extra).await;
    let mut leader = Conn::get(p.addr(), origin.addr(), "/late").await;
    let (head, _) = leader.read_head_and(4 << 20).await;
    assert_eq!(head_field(&head, "x-cache"), Some("MISS"));
    let mut late = Conn::get(p.addr(), origin.addr(), "/late").await;
    assert!(
        late.got_head_and(3 << 20, WAIT).await,
        "the late request got {} body bytes while the fetch ran",
        late.body_len()
    );
    gate.add_permits(1);
    whole_pattern_bodies([leader, late], LEN).await;
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

/// A body the memory tier will keep whole (`max_memory_object` above the
/// collapsing spool's 1 MiB) is written to disk only at its commit, so
/// there is no file to read: the spool keeps it all instead (the store
/// holds those bytes anyway), and a request joining late starts from the
/// first byte while the fetch runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_follower_of_a_body_kept_in_memory_starts_from_the_spool() {
    late_follower_served_while_the_fetch_runs("max_memory_object = \"16MiB\"").await;
}

/// Once the store gave up on a fetch (here an unknown length past
/// `max_object_size`), a request that joins late is not sent the part
/// on disk only to be cut off: it waits for the end, as without a file,
/// and then fetches for itself, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_request_does_not_read_a_file_the_store_gave_up_on() {
    const LEN: u64 = 8 << 20;
    let (origin, gate, requests) = gated_pattern_origin(LEN, &[4 << 20], Framing::Chunked).await;
    let p = proxy("max_object_size = \"3MiB\"").await;
    let mut leader = Conn::get(p.addr(), origin.addr(), "/given-up").await;
    leader.read_head_and(4 << 20).await;
    let mut late = Conn::get(p.addr(), origin.addr(), "/given-up").await;
    assert!(
        !late.got_head_and(0, Duration::from_secs(1)).await,
        "a late request was answered from a file the store gave up on"
    );
    // The fetch ends unstored; the late request's own fetch is let
    // through the gate too.
    gate.add_permits(2);
    whole_pattern_bodies([leader, late], LEN).await;
    assert_eq!(requests.load(Ordering::SeqCst), 2);
}

/// A late request reading the fetch's file whose fetch then breaks is cut
/// off: its connection closes short of the `Content-Length` it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_request_reading_the_file_is_cut_off_when_the_fetch_breaks() {
    const LEN: u64 = 8 << 20;
    let (origin, gate, _) = gated_pattern_origin(LEN, &[4 << 20], Framing::BrokenAtLastStop).await;
    let p = proxy("").await;
    let mut leader = Conn::get(p.addr(), origin.addr(), "/broken-late").await;
    leader.read_head_and(4 << 20).await;
    let mut late = Conn::get(p.addr(), origin.addr(), "/broken-late").await;
    assert!(late.got_head_and(3 << 20, WAIT).await, "got {}", late.body_len());
    gate.add_permits(1);
    for conn in [leader, late] {
        let (bytes, eof) = conn.finish().await;
        assert!(eof, "the connection is closed");
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        assert_eq!(head_field(&head, "content-length"), Some("8388608"), "{head}");
        assert!(((bytes.len() - end) as u64) < LEN, "a broken fetch gave a whole body");
        assert!(pattern_matches(0, &bytes[end..]));
    }
}

/// A collapsed client that fell more than 4 MiB behind reads on from the
/// disk tier's file while the fetch still runs, rather than waiting for
/// its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_left_behind_reads_on_from_disk_while_the_fetch_runs() {
    const LEN: u64 = 40 << 20;
    // 64 KiB until the follower has joined, then up to 32 MiB, then the rest.
    let (origin, gate, requests) = gated_pattern_origin(LEN, &[64 << 10, 32 << 20], Framing::Length).await;
    let p = proxy("").await;
    let mut leader = Conn::get(p.addr(), origin.addr(), "/behind").await;
    leader.read_head_and(64 << 10).await;
    let mut slow = Conn::get(p.addr(), origin.addr(), "/behind").await;
    let (head, _) = slow.read_head_and(64 << 10).await;
    assert_eq!(head_field(&head, "x-cache"), Some("HIT"), "collapsed: {head}");
    gate.add_permits(1);
    // The leader's client reads 32 MiB while the slow one reads nothing:
    // it is left behind (socket buffers hold far less than 28 MiB).
    leader.read_head_and(32 << 20).await;
    assert!(
        slow.got_head_and(28 << 20, Duration::from_secs(10)).await,
        "the client left behind got {} body bytes while the fetch ran",
        slow.body_len()
    );
    gate.add_permits(1);
    whole_pattern_bodies([leader, slow], LEN).await;
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// The status header.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_header_name_is_configurable() {
    let origin = fixed(Response::ok("named").header("Cache-Control", "max-age=60")).await;
    let p = proxy("status_header = \"X-Portico-Cache\"").await;
    let miss = get(&p, &origin, "/n", &[]).await;
    assert_eq!(miss.header("x-portico-cache"), Some("MISS"));
    assert_eq!(miss.header("x-cache"), None);
    let hit = get(&p, &origin, "/n", &[]).await;
    assert_eq!(hit.body_str(), "named");
    assert_eq!(hit.header("x-portico-cache"), Some("HIT"));
    assert_eq!(hit.header("x-cache"), None);
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_header_can_be_disabled() {
    let origin = fixed(Response::ok("quiet").header("Cache-Control", "max-age=60")).await;
    let p = proxy("status_header = \"\"").await;
    let miss = get(&p, &origin, "/q", &[]).await;
    let hit = get(&p, &origin, "/q", &[]).await;
    for r in [&miss, &hit] {
        assert_eq!(r.body_str(), "quiet");
        assert!(
            !r.headers
                .iter()
                .any(|(n, v)| n.eq_ignore_ascii_case("x-cache") || v == "HIT" || v == "MISS"),
            "{:?}",
            r.headers
        );
    }
    assert!(hit.header("age").is_some(), "the second answer came from the cache");
    assert_eq!(origin.count(), 1);
}

// ---------------------------------------------------------------------------
// Cache-Status (RFC 9211).
// ---------------------------------------------------------------------------

/// The `Cache-Status` values of a response, in order.
fn cache_status(r: &ParsedResponse) -> Vec<&str> {
    r.headers_all("cache-status")
}

/// An origin that answers `body` with `ETag: "v1"` and `Cache-Control:
/// cc`, and a request validating that ETag with a 304 carrying
/// `Cache-Control: refreshed_cc`.
async fn validating_origin(body: &'static str, cc: &'static str, refreshed_cc: &'static str) -> Origin {
    Origin::start(move |req| async move {
        if req.header("if-none-match") == Some("\"v1\"") {
            Response::new(304)
                .header("ETag", "\"v1\"")
                .header("Cache-Control", refreshed_cc)
        } else {
            Response::ok(body).header("ETag", "\"v1\"").header("Cache-Control", cc)
        }
    })
    .await
}

/// The `ttl` parameter of the last `Cache-Status` member.
fn ttl_of(r: &ParsedResponse) -> i64 {
    let last = *cache_status(r).last().expect("a Cache-Status member");
    let ttl = last
        .split("; ")
        .find_map(|p| p.strip_prefix("ttl="))
        .unwrap_or_else(|| panic!("no ttl in {last:?}"));
    ttl.parse().expect("ttl is an integer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_says_the_miss_was_forwarded_and_stored_then_the_hit_with_its_ttl() {
    let origin = fixed(Response::ok("status").header("Cache-Control", "max-age=60")).await;
    let p = proxy("cache_status = \"edge1.example\"").await;
    let miss = get(&p, &origin, "/s", &[]).await;
    check(&miss, 200, "status", "MISS");
    // RFC 9211 2.2, 2.3, 2.6: fwd says why it went forward, fwd-status
    // what the next hop answered, stored that the response was kept.
    assert_eq!(cache_status(&miss), ["edge1.example; fwd=miss; fwd-status=200; stored"]);
    let hit = get(&p, &origin, "/s", &[]).await;
    check(&hit, 200, "status", "HIT");
    // 2.1 hit: the origin was not contacted; 2.5 ttl: freshness left.
    let member = cache_status(&hit)[0];
    assert!(member.starts_with("edge1.example; hit; ttl="), "{member}");
    assert!((58..=60).contains(&ttl_of(&hit)), "{member}");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_says_a_revalidation_went_forward_because_the_stored_response_was_stale() {
    let origin = validating_origin("old", "max-age=1", "max-age=30").await;
    let p = proxy("cache_status = \"c\"").await;
    get(&p, &origin, "/v", &[]).await;
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let revalidated = get(&p, &origin, "/v", &[]).await;
    check(&revalidated, 200, "old", "REVALIDATED");
    let member = cache_status(&revalidated)[0];
    assert!(member.starts_with("c; fwd=stale; fwd-status=304; ttl="), "{member}");
    assert!((28..=30).contains(&ttl_of(&revalidated)), "{member}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_says_a_stale_response_replaced_by_the_origin_went_forward_as_stale() {
    let origin = counting("version", &[("Cache-Control", "max-age=1"), ("ETag", "\"e\"")]).await;
    let p = proxy("cache_status = \"c\"").await;
    get(&p, &origin, "/r", &[]).await;
    tokio::time::sleep(PAST_ONE_SECOND).await;
    // The conditional request got a new 200 (this origin ignores
    // validators), which replaced the stored one.
    let replaced = get(&p, &origin, "/r", &[]).await;
    check(&replaced, 200, "version #2", "MISS");
    assert_eq!(cache_status(&replaced), ["c; fwd=stale; fwd-status=200; stored"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_says_fwd_request_when_the_request_s_directives_sent_it_to_the_origin() {
    let origin = validating_origin("fresh", "max-age=60", "max-age=60").await;
    let p = proxy("cache_status = \"c\"").await;
    get(&p, &origin, "/f", &[]).await;
    // Fresh, but the client's no-cache asks for validation: RFC 9211 2.2
    // `request`, not `stale`.
    let reloaded = get(&p, &origin, "/f", &[("Cache-Control", "no-cache")]).await;
    check(&reloaded, 200, "fresh", "REVALIDATED");
    let member = cache_status(&reloaded)[0];
    assert!(member.starts_with("c; fwd=request; fwd-status=304; ttl="), "{member}");
    // The client's no-store: answered by the origin, not stored.
    let unstored = get(&p, &origin, "/f", &[("Cache-Control", "no-store")]).await;
    check(&unstored, 200, "fresh", "MISS");
    assert_eq!(cache_status(&unstored), ["c; fwd=request; fwd-status=200"]);
    assert_eq!(origin.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_members_of_caches_nearer_the_origin_come_first() {
    let origin = fixed(
        Response::ok("layered")
            .header("Cache-Control", "max-age=60")
            .header("Cache-Status", "OriginCache; hit; ttl=1100"),
    )
    .await;
    let p = proxy("cache_status = \"edge\"").await;
    let miss = get(&p, &origin, "/l", &[]).await;
    assert_eq!(
        cache_status(&miss),
        ["OriginCache; hit; ttl=1100", "edge; fwd=miss; fwd-status=200; stored"]
    );
    let hit = get(&p, &origin, "/l", &[]).await;
    let all = cache_status(&hit);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0], "OriginCache; hit; ttl=1100");
    assert!(all[1].starts_with("edge; hit; ttl="), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_is_off_unless_named() {
    let origin = fixed(Response::ok("plain").header("Cache-Control", "max-age=60")).await;
    let p = proxy("").await;
    for _ in 0..2 {
        let r = get(&p, &origin, "/o", &[]).await;
        assert!(cache_status(&r).is_empty(), "{:?}", r.headers);
    }
}

#[test]
fn a_cache_status_identifier_that_is_not_a_token_is_refused_with_its_key() {
    for bad in ["two words", "9lives", "quo\\\"te"] {
        let out = Portico::check(&format!(
            "[[listener]]\naddress = \"127.0.0.1:1\"\nmode = \"forward\"\n\n[cache]\ncache_status = \"{bad}\"\n"
        ));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(err.contains("cache.cache_status"), "{err}");
        assert!(err.contains("is not a structured-field token"), "{err}");
    }
}

// ---------------------------------------------------------------------------
// Operator overrides.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_no_store_stores_a_no_store_response() {
    let origin = counting("body", &[("Cache-Control", "no-store, max-age=60")]).await;
    let p = proxy("ignore_no_store = true").await;
    check(&get(&p, &origin, "/ns", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/ns", &[]).await, 200, "body #1", "HIT");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_ttl_makes_a_max_age_zero_response_fresh() {
    let origin = counting("body", &[("Cache-Control", "max-age=0")]).await;
    let p = proxy("min_ttl = \"60s\"").await;
    check(&get(&p, &origin, "/min", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/min", &[]).await, 200, "body #1", "HIT");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ttl_makes_a_long_lived_response_stale() {
    let origin = counting("body", &[("Cache-Control", "max-age=3600")]).await;
    let p = proxy("max_ttl = \"1s\"").await;
    check(&get(&p, &origin, "/max", &[]).await, 200, "body #1", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    check(&get(&p, &origin, "/max", &[]).await, 200, "body #2", "MISS");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_query_false_does_not_store_query_urls() {
    let origin = counting("body", &[("Cache-Control", "max-age=60")]).await;
    let p = proxy("cache_query = false").await;
    check(&get(&p, &origin, "/q?x=1", &[]).await, 200, "body #1", "MISS");
    check(&get(&p, &origin, "/q?x=1", &[]).await, 200, "body #2", "MISS");
    // Without a query it is stored as usual.
    check(&get(&p, &origin, "/q", &[]).await, 200, "body #3", "MISS");
    check(&get(&p, &origin, "/q", &[]).await, 200, "body #3", "HIT");
    assert_eq!(origin.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_query_in_key_shares_one_object() {
    let origin =
        Origin::start(
            |req| async move { Response::ok(format!("for {}", req.uri)).header("Cache-Control", "max-age=60") },
        )
        .await;
    let p = proxy("ignore_query_in_key = true").await;
    check(&get(&p, &origin, "/q?x=1", &[]).await, 200, "for /q?x=1", "MISS");
    check(&get(&p, &origin, "/q?x=2", &[]).await, 200, "for /q?x=1", "HIT");
    assert_eq!(origin.count(), 1);
    assert_eq!(origin.requests()[0].uri, "/q?x=1", "the origin still gets the query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_cache_stores_nothing() {
    let origin = counting("body", &[("Cache-Control", "max-age=60")]).await;
    let p = proxy("enabled = false").await;
    for n in 1..=2 {
        let r = get(&p, &origin, "/off", &[]).await;
        check(&r, 200, &format!("body #{n}"), "<none>");
        assert_eq!(r.header("age"), None);
    }
    assert_eq!(origin.count(), 2);
}

// ---------------------------------------------------------------------------
// Reverse mode.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_mode_keys_objects_by_public_host() {
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Response::ok(format!("{} #{n}", req.header("host").unwrap_or("-"))).header("Cache-Control", "max-age=60")
        }
    })
    .await;
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"reverse\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n\n\
         [[upstream]]\nname = \"site\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nhost = \"*\"\nupstream = \"site\"\n",
        origin.addr()
    ))
    .await;
    let paddr = p.addr();
    let get_host = |host: &'static str| async move {
        let req = format!("GET /page HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        parse_response(&raw_request(paddr, req.as_bytes()).await)
    };
    check(&get_host("a.example").await, 200, "a.example #1", "MISS");
    check(&get_host("b.example").await, 200, "b.example #2", "MISS");
    check(&get_host("a.example").await, 200, "a.example #1", "HIT");
    check(&get_host("b.example").await, 200, "b.example #2", "HIT");
    assert_eq!(origin.count(), 2);
    drop(p);
}

/// The first fetch fails before any response head (the origin closes the
/// connection after a pause): one waiter retries and the others follow
/// its fetch, so the origin sees two requests, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failing_before_its_head_is_retried_by_one_waiter() {
    let requests = Arc::new(AtomicUsize::new(0));
    let n = requests.clone();
    let raw = RawOrigin::start(move |mut s| {
        let n = n.clone();
        async move {
            read_request_head(&mut s).await;
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                // Long enough for the other clients to join the flight.
                tokio::time::sleep(Duration::from_millis(500)).await;
                return; // closed without a response
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let body = "retried";
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: max-age=60\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).await;
        }
    })
    .await;
    let p = proxy("").await;
    let origin = raw.addr();
    let first = {
        let addr = p.addr();
        tokio::spawn(async move {
            let req = format!("GET http://{origin}/r HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
            parse_response(&raw_request(addr, req.as_bytes()).await)
        })
    };
    // The first request leads: the waiters come once it reached the origin
    // (a fixed pause let a waiter overtake it on a loaded machine).
    assert!(
        until(WAIT, || async { requests.load(Ordering::SeqCst) == 1 }).await,
        "the first request never reached the origin"
    );
    let mut waiters = Vec::new();
    for _ in 0..10 {
        let addr = p.addr();
        waiters.push(tokio::spawn(async move {
            let req = format!("GET http://{origin}/r HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
            parse_response(&raw_request(addr, req.as_bytes()).await)
        }));
    }
    let first = first.await.expect("first client");
    assert_eq!(first.status, 502, "the failed leader's client gets the error");
    for w in waiters {
        let r = w.await.expect("waiter");
        assert_eq!(
            (r.status, r.body_str()),
            (200, "retried".to_string()),
            "{:?}",
            r.headers
        );
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "one failed fetch, one retry for all waiters"
    );
}

/// `cache = {...}` on a `[[rule]]` overrides `[cache]` for that route only:
/// a `max-age=0` response is fresh for a minute on `/pinned/` (min_ttl),
/// is revalidated elsewhere, and `/live/` bypasses the cache altogether.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_cache_overrides_apply_to_their_route_only() {
    let origin = Origin::start(|req| async move {
        Response::ok(format!("body {}", req.uri))
            .header("cache-control", "max-age=0")
            .header("etag", "\"v1\"")
    })
    .await;
    let addr = free_addr();
    let p = Portico::start(&format!(
        r#"[[listener]]
address = "{addr}"
mode = "reverse"

[log]
access = "{{dir}}/access.log"

[cache]
dir = "{{dir}}/cache"

[[upstream]]
name = "o"
servers = ["{o}"]

[[rule]]
path = "/pinned/"
upstream = "o"
cache = {{ min_ttl = "60s" }}

[[rule]]
path = "/live/"
upstream = "o"
cache = {{ enabled = false }}

[[rule]]
upstream = "o"
"#,
        o = origin.addr()
    ))
    .await;
    let get = |path: &'static str| {
        let addr = p.addr();
        async move {
            let req = format!("GET {path} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n");
            parse_response(&raw_request(addr, req.as_bytes()).await)
        }
    };
    check(&get("/pinned/a").await, 200, "body /pinned/a", "MISS");
    check(&get("/pinned/a").await, 200, "body /pinned/a", "HIT");
    check(&get("/other").await, 200, "body /other", "MISS");
    // Stale at once there: revalidated (this origin ignores validators and
    // answers 200 again, so the new response replaces the stored one).
    check(&get("/other").await, 200, "body /other", "MISS");
    let conditional = origin
        .requests()
        .iter()
        .filter(|r| r.uri == "/other")
        .filter(|r| r.header("if-none-match") == Some("\"v1\""))
        .count();
    assert_eq!(conditional, 1, "the second /other was a revalidation");
    let live = get("/live/x").await;
    assert_eq!((live.status, live.body_str()), (200, "body /live/x".to_string()));
    assert!(live.header("x-cache").is_none(), "bypassed: {:?}", live.headers);
    get("/live/x").await;
    let paths: Vec<String> = origin.requests().iter().map(|r| r.uri.to_string()).collect();
    assert_eq!(
        paths.iter().filter(|p| p.as_str() == "/pinned/a").count(),
        1,
        "{paths:?}"
    );
    assert_eq!(paths.iter().filter(|p| p.as_str() == "/other").count(), 2, "{paths:?}");
    assert_eq!(paths.iter().filter(|p| p.as_str() == "/live/x").count(), 2, "{paths:?}");
}

/// `portico cache purge --prefix` says what the disk purge removed and,
/// apart from it, what the running server dropped from memory: its own
/// count, not "it ... too" after "purged 0 objects".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_purge_prefix_reports_the_servers_own_count() {
    let origin = counting("page", &[("cache-control", "max-age=60")]).await;
    let p = proxy("").await;
    for path in ["/p/a", "/p/b"] {
        get(&p, &origin, path, &[]).await;
        check(
            &get(&p, &origin, path, &[]).await,
            200,
            &format!("page #{}", if path == "/p/a" { 1 } else { 2 }),
            "HIT",
        );
    }
    let purge = |prefix: String| {
        let config = p.config_path().to_path_buf();
        let dir = p.dir().to_path_buf();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
                .current_dir(dir)
                .args(["cache", "purge", "--prefix", &prefix, "-c"])
                .arg(config)
                .output()
                .expect("run portico cache purge")
        })
    };
    let o = origin.addr();
    let out = purge(format!("http://{o}/none/")).await.expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("purged 0 objects (0 bytes) from the disk tier"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("dropped 0 objects under http://{o}/none/ from memory")),
        "{stdout}"
    );
    assert!(!stdout.contains("too"), "{stdout}");

    let out = purge(format!("http://{o}/p/")).await.expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("from the disk tier"), "{stdout}");
    assert!(
        stdout.contains(&format!("dropped 2 objects under http://{o}/p/ from memory")),
        "{stdout}"
    );
    check(&get(&p, &origin, "/p/a", &[]).await, 200, "page #3", "MISS");
}

/// `portico cache purge URL` removes the files and also asks the running
/// server to drop its memory copy, so the next request really is a miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_purge_command_also_clears_the_running_server() {
    let origin = counting("page", &[("cache-control", "max-age=60")]).await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/purge-me", &[]).await, 200, "page #1", "MISS");
    check(&get(&p, &origin, "/purge-me", &[]).await, 200, "page #1", "HIT");
    let url = format!("http://{}/purge-me", origin.addr());
    let out = tokio::task::spawn_blocking({
        let config = p.config_path().to_path_buf();
        let dir = p.dir().to_path_buf();
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
                .current_dir(dir)
                .args(["cache", "purge", &url, "-c"])
                .arg(config)
                .output()
                .expect("run portico cache purge")
        }
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("dropped it from memory too"), "{stdout}");
    check(&get(&p, &origin, "/purge-me", &[]).await, 200, "page #2", "MISS");
    assert_eq!(origin.count(), 2);
}

/// A hit on HTTP/1 writes the stored fields straight from the stored
/// response (no copy of them to edit); a HEAD hit builds its head the
/// general way. Both must say the same: the stored fields in their order
/// (repeated ones too), an upstream cache's `Cache-Status` before ours, our
/// `X-Cache` and `Age` instead of the stored ones, one `Content-Length`.
#[tokio::test]
async fn a_hit_sends_the_stored_fields_whichever_way_its_head_is_written() {
    let origin = Origin::start(|_| async {
        Response::ok("stored body")
            .header("Cache-Control", "max-age=600")
            .header("Age", "5")
            .header("X-Cache", "HIT from upstream")
            .header("Cache-Status", "upstream; hit")
            .header("ETag", "\"v1\"")
            .header("X-Custom", "a")
            .header("Content-Type", "text/plain")
            .header("X-Custom", "b")
    })
    .await;
    let p = proxy("cache_status = \"edge1\"").await;
    check(&get(&p, &origin, "/f", &[]).await, 200, "stored body", "MISS");
    let hit = get(&p, &origin, "/f", &[]).await;
    check(&hit, 200, "stored body", "HIT");
    let head = send(&p, "HEAD", origin.addr(), "/f", &[]).await;
    assert_eq!((head.status, x_cache(&head)), (200, "HIT"), "{:?}", head.headers);
    let fields = |r: &ParsedResponse| {
        let mut f: Vec<(String, String)> = r
            .headers
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case("date") && !n.eq_ignore_ascii_case("age"))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
            .collect();
        f.sort();
        f
    };
    assert_eq!(
        fields(&hit),
        fields(&head),
        "GET hit {:?}\nHEAD hit {:?}",
        hit.headers,
        head.headers
    );
    for r in [&hit, &head] {
        let one = |name: &str| r.headers_all(name).len() == 1;
        assert!(
            one("date") && one("age") && one("content-length") && one("x-cache"),
            "{:?}",
            r.headers
        );
        let age: u64 = r.header("age").and_then(|a| a.parse().ok()).expect("a numeric Age");
        assert!(age >= 5, "the stored Age counts: {age}");
        assert_eq!(r.header("content-length"), Some("11"));
        assert_eq!(r.headers_all("x-custom"), ["a", "b"], "repeated fields in order");
        let statuses = r.headers_all("cache-status");
        assert_eq!(statuses.len(), 2, "{statuses:?}");
        assert_eq!(statuses[0], "upstream; hit");
        assert!(statuses[1].starts_with("edge1; hit; ttl="), "{statuses:?}");
    }
}

/// An origin sending `size` cacheable pattern bytes slowly (64 KiB every
/// 10 ms), so that clients can leave, join or pile up mid-fetch.
async fn slow_download(size: u64) -> Origin {
    Origin::start(move |_req| async move {
        Response::ok("")
            .generated(size)
            .chunk_delay(Duration::from_millis(10))
            .header("Cache-Control", "max-age=600")
    })
    .await
}

/// Reads at least `n` bytes of a response from `c`.
async fn read_some(c: &mut TcpStream, n: usize) {
    let mut got = 0;
    let mut buf = vec![0; 65536];
    while got < n {
        let r = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .expect("body in time")
            .expect("read");
        assert!(r > 0, "the response ended early");
        got += r;
    }
}

/// Polls `cond` every 100 ms until it holds or `timeout` passes.
async fn until<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Squid's quick abort (`cache.quick_abort`): when the only client of a
/// large download hangs up early, the fetch is stopped and nothing stored,
/// so one client cannot make Portico fetch any number of large objects in
/// full by asking and leaving; with `quick_abort = false` the fetch is
/// finished for the cache, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_fetch_every_client_left_is_stopped_unstored_unless_quick_abort_is_off() {
    const SIZE: u64 = 8 << 20;
    for quick_abort in [true, false] {
        let o = slow_download(SIZE).await;
        let p = proxy(&format!("quick_abort = {quick_abort}")).await;
        let mut c = TcpStream::connect(p.addr()).await.expect("connect");
        let req = format!("GET http://{0}/big HTTP/1.1\r\nHost: {0}\r\n\r\n", o.addr());
        c.write_all(req.as_bytes()).await.expect("request");
        read_some(&mut c, 200_000).await;
        drop(c);
        if quick_abort {
            assert!(
                until(WAIT, || async {
                    metric(&p, "portico_cache_fetches_abandoned_total").await == 1
                })
                .await,
                "the fetch was not stopped"
            );
            let fetched = metric(&p, "portico_cache_fetched_bytes_total").await;
            assert!(fetched < SIZE / 2, "{fetched} bytes fetched for a client that left");
            // Not stored: the next request is fetched again, in full.
            let r = get(&p, &o, "/big", &[]).await;
            assert_eq!(r.body.len() as u64, SIZE);
            assert_eq!(o.count(), 2, "the stopped fetch was stored");
        } else {
            let stored = || async { x_cache(&get(&p, &o, "/big", &[]).await).starts_with("HIT") };
            assert!(until(Duration::from_secs(15), stored).await, "not stored");
            assert_eq!(o.count(), 1);
            assert_eq!(metric(&p, "portico_cache_fetches_abandoned_total").await, 0);
        }
    }
}

/// A miss is read ahead of its client, but only so far: a client that
/// stops reading a 64 MiB download holds the fetch within 1 MiB of read-ahead
/// plus what the sockets hold (4 MiB of send buffer at most with Linux's
/// default `tcp_wmem`), not the whole object in memory; once it reads
/// again it gets every byte, and the object is stored. Written in step,
/// as before the read-ahead, the fetch was held the same way: this guards
/// the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_whose_client_stops_reading_is_fetched_only_a_few_mib_ahead_of_it() {
    const SIZE: u64 = 64 << 20;
    let o =
        Origin::start(|_req| async move { Response::ok("").generated(SIZE).header("Cache-Control", "max-age=600") })
            .await;
    let p = proxy("").await;
    let mut c = TcpStream::connect(p.addr()).await.expect("connect");
    let req = format!("GET http://{0}/big HTTP/1.1\r\nHost: {0}\r\n\r\n", o.addr());
    c.write_all(req.as_bytes()).await.expect("request");
    let mut body = Vec::new();
    let mut buf = vec![0; 1 << 16];
    let head_end = loop {
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .expect("head in time")
            .expect("read");
        assert!(n > 0, "no response");
        body.extend_from_slice(&buf[..n]);
        if let Some(i) = body.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    // Unbounded, the fetch would read all 64 MiB in well under a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fetched = metric(&p, "portico_cache_fetched_bytes_total").await;
    assert!(
        fetched < 16 << 20,
        "{fetched} bytes fetched for a client that read none"
    );
    while ((body.len() - head_end) as u64) < SIZE {
        let n = tokio::time::timeout(WAIT, c.read(&mut buf))
            .await
            .expect("body in time")
            .expect("read");
        assert!(n > 0, "the response ended early");
        body.extend_from_slice(&buf[..n]);
    }
    assert_eq!((body.len() - head_end) as u64, SIZE);
    assert!(pattern_matches(0, &body[head_end..]), "not the origin's bytes");
    assert!(
        until(WAIT, || async { metric(&p, "portico_cache_stored_total").await == 1 }).await,
        "not stored"
    );
}

/// A client that leaves while the origin is quiet is noticed then, not at
/// the origin's next piece: the fetch, read ahead of its client, is
/// stopped at once (`cache.quick_abort`), though the origin sends nothing
/// more for half a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_the_origin_is_quiet_stops_the_fetch_at_once() {
    clients_leave_while_the_origin_is_quiet(false).await;
}

/// So is one collapsed onto that fetch, which has been sent all the
/// origin sent: waiting for the next piece, it watches its client, and
/// gone, it no longer keeps the fetch going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collapsed_client_that_leaves_while_the_origin_is_quiet_no_longer_holds_the_fetch() {
    clients_leave_while_the_origin_is_quiet(true).await;
}

/// [`clients_leave_while_the_origin_pauses`] with the fill ahead of its client.
async fn clients_leave_while_the_origin_is_quiet(collapsed: bool) {
    clients_leave_while_the_origin_pauses(collapsed, false).await;
}

/// With `read_ahead_gap = 0` the fill goes at its client's pace and sees
/// it gone only when a write fails: after that, a collapsed client that
/// leaves while the origin is quiet stops the fetch at once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_step_a_collapsed_client_that_leaves_while_the_origin_is_quiet_no_longer_holds_the_fetch() {
    clients_leave_while_the_origin_pauses(true, true).await;
}

/// A fetch of 8 MiB whose origin goes quiet after 512 KiB, its client
/// (and a second collapsed onto it if `collapsed`) leaving then. With
/// `in_step` (`read_ahead_gap = 0`), the origin sends two more pieces
/// once the first client has left, so that a write to it fails.
async fn clients_leave_while_the_origin_pauses(collapsed: bool, in_step: bool) {
    const SIZE: usize = 8 << 20;
    const SENT: usize = 512 << 10;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let o = RawOrigin::start(move |mut s| {
        let gate = g.clone();
        async move {
            read_request_head(&mut s).await;
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\nCache-Control: max-age=600\r\n\r\n");
            let body: Vec<u8> = (0..SENT).map(|i| (i % 251) as u8).collect();
            if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
                return;
            }
            gate.acquire().await.expect("gate").forget();
            for _ in 0..2 {
                if s.write_all(&body[..64 << 10]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    })
    .await;
    let p = proxy(if in_step { "read_ahead_gap = \"0B\"" } else { "" }).await;
    let mut c = TcpStream::connect(p.addr()).await.expect("connect");
    let req = format!("GET http://{0}/big HTTP/1.1\r\nHost: {0}\r\n\r\n", o.addr());
    c.write_all(req.as_bytes()).await.expect("request");
    read_some(&mut c, 64 << 10).await;
    // Until all 512 KiB have reached the proxy, the fetch is not quiet.
    assert!(
        until(WAIT, || async {
            metric(&p, "portico_cache_fetched_bytes_total").await == SENT as u64
        })
        .await,
        "the origin's first 512 KiB did not arrive"
    );
    let follower = if collapsed {
        let mut f = TcpStream::connect(p.addr()).await.expect("connect");
        f.write_all(req.as_bytes()).await.expect("request");
        // All but the last bytes of what the origin sent (read_some reads
        // at least as many): the follower then waits for the next piece.
        read_some(&mut f, SENT - 1024).await;
        assert_eq!(metric(&p, "portico_cache_collapsed_total").await, 1);
        Some(f)
    } else {
        None
    };
    drop(c);
    if in_step {
        // Two more pieces: a write to the client that left fails.
        gate.add_permits(1);
        let fetched = (SENT + (128 << 10)) as u64;
        assert!(
            until(WAIT, || async {
                metric(&p, "portico_cache_fetched_bytes_total").await == fetched
            })
            .await,
            "the origin's two more pieces did not arrive"
        );
    }
    if follower.is_some() {
        // The fetch goes on for the follower, then must stop when it goes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(metric(&p, "portico_cache_fetches_abandoned_total").await, 0);
        drop(follower);
    }
    assert!(
        until(WAIT, || async {
            metric(&p, "portico_cache_fetches_abandoned_total").await == 1
        })
        .await,
        "the fetch went on waiting for the origin after its clients left"
    );
    assert_eq!(o.connections(), 1);
}

/// A client that half-closes its connection after its request
/// (`shutdown(SHUT_WR)`, as some scripted HTTP/1.0 clients do) and still
/// reads: by default it looks gone once the origin pauses, as in the line
/// for an origin connection, whether it leads the fetch of a stored miss
/// or follows another's; with `origin.abort_on_close = false` both are
/// sent the whole response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_is_sent_a_stored_miss_whole_only_with_abort_on_close_off() {
    const SIZE: usize = 128 << 10;
    for abort in [true, false] {
        let o = RawOrigin::start(|mut s| async move {
            read_request_head(&mut s).await;
            // Time for the second request to join the fetch.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\nCache-Control: max-age=600\r\n\r\n");
            let body: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
            let (first, rest) = body.split_at(SIZE / 2);
            if s.write_all(head.as_bytes()).await.is_ok() && s.write_all(first).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = s.write_all(rest).await;
            }
        })
        .await;
        let p = proxy_with("", &format!("[origin]\nabort_on_close = {abort}\n")).await;
        let get = |delay: u64| {
            let (proxy, origin) = (p.addr(), o.addr());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let mut c = TcpStream::connect(proxy).await.expect("connect");
                let req = format!("GET http://{origin}/half HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
                c.write_all(req.as_bytes()).await.expect("request");
                c.shutdown().await.expect("half-close");
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut answer)).await;
                answer
            })
        };
        let (leader, follower) = (get(0), get(100));
        for (who, answer) in [("leader", leader.await), ("follower", follower.await)] {
            let answer = answer.expect("client");
            // Not `parse_response`, which refuses a body cut short.
            let whole = answer.windows(4).position(|w| w == b"\r\n\r\n").is_some_and(|i| {
                let body = &answer[i + 4..];
                answer.starts_with(b"HTTP/1.1 200 ") && body.len() == SIZE && pattern_matches(0, body)
            });
            assert_eq!(
                whole,
                !abort,
                "abort_on_close = {abort}: the {who} got {} bytes",
                answer.len()
            );
        }
    }
}

/// The bytes of the files in `dir` (not recursive; 0 if it is missing).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// Objects being written to the disk tier are held to `cache.disk` on top
/// of the stored ones: three 3 MiB downloads at once under a 4 MiB budget
/// never put more than 4 MiB in tmp files (the GC does not see those), and
/// each client still gets its whole response, the ones past the budget
/// unstored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_being_written_never_take_more_than_cache_disk_in_tmp_files() {
    const SIZE: u64 = 3 << 20;
    let o = slow_download(SIZE).await;
    let p = proxy("disk = \"4MiB\"\nmax_memory_object = \"64KiB\"").await;
    let tmp = p.dir().join("cache").join("tmp");
    let clients: Vec<_> = ["/a", "/b", "/c"]
        .into_iter()
        .map(|path| {
            let (addr, origin) = (p.addr(), o.addr());
            tokio::spawn(async move {
                let req = format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
                parse_response(&raw_request(addr, req.as_bytes()).await)
            })
        })
        .collect();
    let mut peak = 0;
    while !clients.iter().all(|c| c.is_finished()) {
        peak = peak.max(dir_bytes(&tmp));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for c in clients {
        let r = c.await.expect("client");
        assert_eq!((r.status, r.body.len() as u64), (200, SIZE), "a response was cut short");
        assert!(pattern_matches(0, &r.body));
    }
    assert!(peak > SIZE / 2, "the sampling saw no tmp file grow ({peak} bytes)");
    assert!(
        peak <= (4 << 20) + (64 << 10),
        "{peak} bytes in tmp files under a 4 MiB cache.disk"
    );
    assert!(metric(&p, "portico_cache_disk_write_aborts_total").await >= 1);
}

/// A request collapsed onto a fetch (here a late one, joined after the
/// first MiB) watches its client while it waits: when both clients hang
/// up, nothing keeps the abandoned fetch going (`cache.quick_abort`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_collapsed_request_whose_client_left_does_not_keep_an_abandoned_fetch_going() {
    const SIZE: u64 = 16 << 20;
    let o = slow_download(SIZE).await;
    let p = proxy("").await;
    let req = format!("GET http://{0}/big HTTP/1.1\r\nHost: {0}\r\n\r\n", o.addr());
    let mut a = TcpStream::connect(p.addr()).await.expect("connect");
    a.write_all(req.as_bytes()).await.expect("request");
    read_some(&mut a, 2 << 20).await;
    // Joins late (past the first MiB): it waits for the end, then the store.
    let mut b = TcpStream::connect(p.addr()).await.expect("connect");
    b.write_all(req.as_bytes()).await.expect("request");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(b);
    drop(a);
    assert!(
        until(WAIT, || async {
            metric(&p, "portico_cache_fetches_abandoned_total").await == 1
        })
        .await,
        "the waiting request kept the abandoned fetch going"
    );
    assert!(metric(&p, "portico_cache_fetched_bytes_total").await < SIZE / 2);
    assert_eq!(o.count(), 1);
}

/// A request waiting for another's revalidation of a stale response
/// watches its client too: one that hangs up is done with (logged with
/// status 0) while the origin still holds the revalidation, not when it
/// answers or `cache.revalidation_wait` (10 s) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_revalidation_whose_client_left_is_done_with_at_once() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (g, n) = (gate.clone(), Arc::new(AtomicUsize::new(0)));
    let seen = n.clone();
    let o = RawOrigin::start(move |mut s| {
        let (gate, n) = (g.clone(), n.clone());
        async move {
            read_request_head(&mut s).await;
            // The first answer is stored, stale a second later; the
            // revalidation's waits for the gate.
            if n.fetch_add(1, Ordering::SeqCst) > 0 {
                gate.acquire().await.expect("gate").forget();
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: max-age=1\r\n\r\nstale")
                .await;
        }
    })
    .await;
    let p = proxy("").await;
    let req = format!(
        "GET http://{0}/r HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n",
        o.addr()
    );
    assert_eq!(parse_response(&raw_request(p.addr(), req.as_bytes()).await).status, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let first = {
        let (addr, req) = (p.addr(), req.clone());
        tokio::spawn(async move { parse_response(&raw_request_timeout(addr, req.as_bytes(), WAIT * 2).await) })
    };
    assert!(
        until(WAIT, || async { seen.load(Ordering::SeqCst) == 2 }).await,
        "the revalidation never reached the origin"
    );
    let log = hang_up_in_service(&p, &req, "/r HTTP/1.1\" 0 ").await;
    assert!(
        log.contains("/r HTTP/1.1\" 0 "),
        "the waiting request whose client left was not done with:\n{log}"
    );
    gate.add_permits(1);
    assert_eq!(first.await.expect("first").status, 200);
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}
