//! Updating and reusing stored responses (RFC 9111 3.2, 4.3.4) end to end:
//! the real `portico` binary as a forward proxy with scripted origins behind
//! it, answering as the cache-tests suite's origin does (in script order,
//! whatever the request). Every test checks what the client got and what the
//! origin was asked.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

/// Just past a `max-age=1` lifetime (ages are whole seconds).
const PAST_ONE_SECOND: Duration = Duration::from_millis(1100);

/// A forward proxy with a memory cache; `cache_extra` is more `[cache]` keys.
async fn proxy(cache_extra: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n{cache_extra}\n"
    ))
    .await
}

/// `GET http://origin/path` through the proxy with `headers`.
async fn get(p: &Portico, origin: &Origin, path: &str, headers: &[(&str, &str)]) -> ParsedResponse {
    send(p, "GET", origin, path, headers).await
}

/// `METHOD http://origin/path` through the proxy with `headers` and
/// `Connection: close`, parsed.
async fn send(p: &Portico, method: &str, origin: &Origin, path: &str, headers: &[(&str, &str)]) -> ParsedResponse {
    let o = origin.addr();
    let mut req = format!("{method} http://{o}{path} HTTP/1.1\r\nHost: {o}\r\n");
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

/// An origin answering its n-th request (from 0) with `script[n]`, and the
/// last entry once the script is used up, whatever the request asks.
async fn scripted(script: Vec<Response>) -> Origin {
    let n = Arc::new(AtomicUsize::new(0));
    let script = Arc::new(script);
    Origin::start(move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst).min(script.len() - 1);
        let r = script[i].clone();
        async move { r }
    })
    .await
}

#[track_caller]
fn check(r: &ParsedResponse, status: u16, body: &str, cache: &str) {
    assert_eq!(r.status, status, "status; headers {:?}", r.headers);
    assert_eq!(r.body_str(), body, "body; headers {:?}", r.headers);
    assert_eq!(r.header("x-cache"), Some(cache), "X-Cache; headers {:?}", r.headers);
}

// ---------------------------------------------------------------------------
// RFC 9111 3.2: updating stored header fields from a 304.
// ---------------------------------------------------------------------------

/// cache-tests `304-etag-update-response-Content-Encoding` and
/// `304-etag-update-response-Content-Range`: Portico stores the body as
/// received, so neither field is one its stored response depends upon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_must_add_each_header_field_in_the_provided_response_including_content_encoding_and_content_range() {
    let origin = scripted(vec![
        Response::ok("body")
            .header("ETag", "\"e1\"")
            .header("Cache-Control", "max-age=1")
            .header("Content-Encoding", "x-coding-a")
            .header("Content-Range", "x-range-a"),
        Response::new(304)
            .header("ETag", "\"e1\"")
            .header("Cache-Control", "max-age=60")
            .header("Content-Encoding", "x-coding-b")
            .header("Content-Range", "x-range-b"),
    ])
    .await;
    let p = proxy("").await;
    let first = get(&p, &origin, "/ce", &[]).await;
    check(&first, 200, "body", "MISS");
    assert_eq!(first.header("content-encoding"), Some("x-coding-a"));
    tokio::time::sleep(PAST_ONE_SECOND).await;

    let revalidated = get(&p, &origin, "/ce", &[]).await;
    check(&revalidated, 200, "body", "REVALIDATED");
    assert_eq!(origin.requests()[1].header("if-none-match"), Some("\"e1\""));
    for r in [&revalidated, &get(&p, &origin, "/ce", &[]).await] {
        assert_eq!(r.header("content-encoding"), Some("x-coding-b"), "{:?}", r.headers);
        assert_eq!(r.header("content-range"), Some("x-range-b"), "{:?}", r.headers);
        assert_eq!(r.header("content-length"), Some("4"), "{:?}", r.headers);
    }
    assert_eq!(origin.count(), 2);
}

/// cache-tests `304-etag-update-response-ETag`: the origin answers the
/// conditional request with a 304 carrying another strong ETag. The 304
/// selects no stored response (RFC 9111 4.3.4: the cache MUST NOT use it to
/// update any), and the client, who sent no conditional, gets the stored
/// response, not a second unconditional request's 304.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_none_of_the_stored_responses_contain_the_same_strong_validator_the_cache_must_not_use_the_304_to_update_any()
 {
    let origin = scripted(vec![
        Response::ok("stored body")
            .header("ETag", "\"abcdef\"")
            .header("Cache-Control", "max-age=1")
            .header("X-Version", "1"),
        Response::new(304)
            .header("ETag", "\"ghijkl\"")
            .header("Cache-Control", "max-age=60")
            .header("X-Version", "2"),
    ])
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/etag", &[]).await, 200, "stored body", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;

    let r = get(&p, &origin, "/etag", &[]).await;
    check(&r, 200, "stored body", "REVALIDATED");
    assert_eq!(r.header("etag"), Some("\"abcdef\""));
    assert_eq!(r.header("x-version"), Some("1"));
    assert_eq!(origin.count(), 2, "one conditional request, no unconditional retry");
    assert_eq!(origin.requests()[1].header("if-none-match"), Some("\"abcdef\""));

    // Not updated: still stale, so the next request revalidates again.
    let again = get(&p, &origin, "/etag", &[]).await;
    check(&again, 200, "stored body", "REVALIDATED");
    assert_eq!(again.header("x-version"), Some("1"));
    assert_eq!(origin.count(), 3);
}

// ---------------------------------------------------------------------------
// RFC 9111 5.2.1.5: request no-store.
// ---------------------------------------------------------------------------

/// cache-tests `ccreq-no-store`: with a fresh response stored, a request with
/// `Cache-Control: no-store` is forwarded, and its response replaces nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_no_store_is_not_answered_from_the_cache_and_its_response_is_not_stored() {
    let origin = scripted(vec![
        Response::ok("first").header("Cache-Control", "max-age=3600"),
        Response::ok("second").header("Cache-Control", "max-age=3600"),
    ])
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/ns", &[]).await, 200, "first", "MISS");
    check(&get(&p, &origin, "/ns", &[]).await, 200, "first", "HIT");
    let no_store = [("Cache-Control", "no-store")];
    check(&get(&p, &origin, "/ns", &no_store).await, 200, "second", "MISS");
    assert_eq!(origin.count(), 2);
    check(&get(&p, &origin, "/ns", &[]).await, 200, "first", "HIT");
    assert_eq!(origin.count(), 2);
}

// ---------------------------------------------------------------------------
// RFC 9111 4.3.5: freshening a stored response with a HEAD.
// ---------------------------------------------------------------------------

/// cache-tests `head-200-freshness-update` and `head-200-update`: a stale
/// stored GET response without validators, a HEAD forwarded for it, and the
/// HEAD's 200 gives it a new lifetime and a new field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_to_a_head_updates_the_stored_get_response_and_its_freshness() {
    let origin = scripted(vec![
        Response::ok("body")
            .header("Cache-Control", "max-age=1")
            .header("Template-A", "1")
            .header("Template-B", "1"),
        Response::ok("body")
            .header("Cache-Control", "max-age=1000")
            .header("Template-A", "2"),
    ])
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/h", &[]).await, 200, "body", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;

    let head = send(&p, "HEAD", &origin, "/h", &[]).await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("template-a"), Some("2"));
    assert_eq!(origin.requests()[1].method, "HEAD");

    let hit = get(&p, &origin, "/h", &[]).await;
    check(&hit, 200, "body", "HIT");
    assert_eq!(hit.header("template-a"), Some("2"), "{:?}", hit.headers);
    assert_eq!(hit.header("template-b"), Some("1"), "{:?}", hit.headers);
    assert_eq!(hit.header("cache-control"), Some("max-age=1000"));
    assert_eq!(origin.count(), 2);
}

/// RFC 9111 4.3.5: a HEAD's 200 whose validator differs from the stored
/// response's invalidates it; the next GET goes to the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_to_a_head_with_another_etag_invalidates_the_stored_response() {
    let origin = scripted(vec![
        Response::ok("old")
            .header("Cache-Control", "max-age=1")
            .header("ETag", "\"v1\""),
        Response::ok("new")
            .header("Cache-Control", "max-age=1000")
            .header("ETag", "\"v2\""),
    ])
    .await;
    let p = proxy("").await;
    check(&get(&p, &origin, "/i", &[]).await, 200, "old", "MISS");
    tokio::time::sleep(PAST_ONE_SECOND).await;
    let head = send(&p, "HEAD", &origin, "/i", &[]).await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("etag"), Some("\"v2\""));
    check(&get(&p, &origin, "/i", &[]).await, 200, "new", "MISS");
    assert_eq!(origin.count(), 3);
    // Nothing stored left to revalidate: a plain request.
    assert_eq!(origin.requests()[2].header("if-none-match"), None);
}

// ---------------------------------------------------------------------------
// RFC 9111 5.2.2.4 and 5.2.2.7: qualified no-cache and private.
// ---------------------------------------------------------------------------

/// The qualified forms let a shared cache store and reuse the response
/// without the named fields: the client it was fetched for gets them, a hit
/// does not, and the origin is asked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_qualified_form_of_no_cache_or_private_allows_a_cache_to_reuse_the_response_without_the_listed_fields() {
    for (path, cc) in [
        ("/no-cache", "max-age=600, no-cache=\"X-User\""),
        ("/private", "max-age=600, private=\"X-User\""),
    ] {
        let origin = scripted(vec![
            Response::ok("page")
                .header("Cache-Control", cc)
                .header("X-User", "alice")
                .header("X-Other", "kept"),
        ])
        .await;
        let p = proxy("").await;
        let first = get(&p, &origin, path, &[]).await;
        check(&first, 200, "page", "MISS");
        assert_eq!(first.header("x-user"), Some("alice"), "{cc}");
        let hit = get(&p, &origin, path, &[]).await;
        check(&hit, 200, "page", "HIT");
        assert_eq!(hit.header("x-user"), None, "{cc}: {:?}", hit.headers);
        assert_eq!(hit.header("x-other"), Some("kept"), "{cc}");
        assert_eq!(origin.count(), 1, "{cc}");
    }
}

// ---------------------------------------------------------------------------
// Unquoted entity tags (not RFC 9110 8.8.3 syntax, but seen in the wild).
// ---------------------------------------------------------------------------

/// An unquoted `ETag` or `If-None-Match` is passed on as received, never
/// "fixed" into the quoted form, and matches itself: forwarded on a miss,
/// sent back as the validator of a revalidation (whose 304 then applies), and
/// compared for a client's conditional request answered from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unquoted_entity_tags_are_forwarded_as_received_and_match_themselves() {
    let origin = scripted(vec![
        Response::ok("tagged")
            .header("ETag", "abcdef")
            .header("Cache-Control", "max-age=1"),
        Response::new(304)
            .header("ETag", "abcdef")
            .header("Cache-Control", "max-age=600"),
    ])
    .await;
    let p = proxy("").await;
    let miss = get(&p, &origin, "/u", &[("If-None-Match", "abcdef")]).await;
    check(&miss, 200, "tagged", "MISS");
    assert_eq!(miss.header("etag"), Some("abcdef"));
    assert_eq!(origin.requests()[0].header("if-none-match"), Some("abcdef"));
    tokio::time::sleep(PAST_ONE_SECOND).await;

    let revalidated = get(&p, &origin, "/u", &[]).await;
    check(&revalidated, 200, "tagged", "REVALIDATED");
    assert_eq!(origin.requests()[1].header("if-none-match"), Some("abcdef"));
    assert_eq!(revalidated.header("etag"), Some("abcdef"));

    let not_modified = get(&p, &origin, "/u", &[("If-None-Match", "abcdef")]).await;
    check(&not_modified, 304, "", "HIT");
    assert_eq!(not_modified.header("etag"), Some("abcdef"));
    assert_eq!(origin.count(), 2);
}
