//! Revalidation collapsing: concurrent requests for one stale stored
//! response send one conditional request to the origin, not one each (as
//! Squid's `collapsed_forwarding` and Varnish's waiting list do), and each
//! still gets the right answer: the updated stored response after a 304, the
//! new response after a 200 that is stored, its own answer from the origin
//! after a 200 that is not, the stale response after an origin failure only
//! where its own stale-on-error window allows. The real `portico` binary as
//! a forward proxy; the origins count the conditional requests they get and
//! answer them slowly, so that every client's request arrives while the
//! first one's revalidation is under way.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::AsyncWriteExt;

/// Just past a `max-age=1` lifetime (ages are whole seconds).
const PAST_ONE_SECOND: Duration = Duration::from_millis(1100);

/// How long the origins take to answer a conditional request: long enough
/// for every concurrent client to arrive on a loaded machine.
const SLOW: Duration = Duration::from_millis(1500);

/// Concurrent clients revalidating the same stale response.
const CLIENTS: usize = 6;

/// The body stored first.
const STORED: &str = "stored copy";

/// A forward proxy with a cache and an `origin.first_byte_timeout` of 5s;
/// `cache_extra` is more `[cache]` keys.
async fn proxy(cache_extra: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [origin]\nfirst_byte_timeout = \"5s\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n{cache_extra}\n"
    ))
    .await
}

/// `GET http://origin/path` through the proxy, `Connection: close`.
async fn get(proxy: SocketAddr, origin: SocketAddr, path: &str) -> ParsedResponse {
    let req = format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(proxy, req.as_bytes()).await)
}

/// `CLIENTS` concurrent GETs; their answers.
async fn concurrent_gets(p: &Portico, origin: SocketAddr, path: &'static str) -> Vec<ParsedResponse> {
    let proxy = p.addr();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(async move { get(proxy, origin, path).await }))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

fn x_cache(r: &ParsedResponse) -> &str {
    r.header("x-cache").unwrap_or("<none>")
}

/// What the origin answers a conditional request with.
#[derive(Clone, Copy)]
enum Answer {
    /// `304 Not Modified`, fresh for an hour.
    NotModified,
    /// A new `200` ("new copy"), storable, fresh for an hour.
    Replaced,
    /// A new `200` that may not be stored, its body numbered per request.
    NotStorable,
}

/// An origin that answers an unconditional request with `200 STORED`
/// (`max-age=1`, `ETag: "v1"`) and a conditional one (`If-None-Match`)
/// after [`SLOW`] as `answer` says; also returns its count of conditional
/// requests.
async fn counting_origin(answer: Answer) -> (Origin, Arc<AtomicUsize>) {
    let conditional = Arc::new(AtomicUsize::new(0));
    let n = conditional.clone();
    let o = Origin::start(move |req| {
        let n = n.clone();
        async move {
            if req.header("if-none-match").is_none() {
                return Response::ok(STORED)
                    .header("Cache-Control", "max-age=1")
                    .header("ETag", "\"v1\"");
            }
            let k = n.fetch_add(1, Ordering::SeqCst);
            let r = match answer {
                Answer::NotModified => Response::new(304)
                    .header("Cache-Control", "max-age=3600")
                    .header("ETag", "\"v1\""),
                Answer::Replaced => Response::ok("new copy")
                    .header("Cache-Control", "max-age=3600")
                    .header("ETag", "\"v2\""),
                Answer::NotStorable => Response::ok(format!("answer {k}")).header("Cache-Control", "no-store"),
            };
            r.delay(SLOW)
        }
    })
    .await;
    (o, conditional)
}

/// Stores the origin's first response and lets it go stale.
async fn store_then_stale(p: &Portico, o: SocketAddr) {
    let r = get(p.addr(), o, "/x").await;
    assert_eq!((r.status, r.body_str().as_str(), x_cache(&r)), (200, STORED, "MISS"));
    tokio::time::sleep(PAST_ONE_SECOND).await;
}

/// Concurrent requests for one stale response send one conditional request;
/// after its 304 every one of them is served the updated stored response
/// (RFC 9111 4.3.4), counted as collapsed requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_revalidations_of_one_stale_response_send_one_conditional_request_and_share_its_304() {
    let p = proxy("").await;
    let (o, conditional) = counting_origin(Answer::NotModified).await;
    store_then_stale(&p, o.addr()).await;
    let collapsed_before = metric(&p, "portico_cache_collapsed_total").await;
    for r in concurrent_gets(&p, o.addr(), "/x").await {
        assert_eq!(r.status, 200, "{:?}", r.headers);
        assert_eq!(r.body_str(), STORED);
        assert_eq!(x_cache(&r), "REVALIDATED", "{:?}", r.headers);
    }
    assert_eq!(conditional.load(Ordering::SeqCst), 1, "one conditional request");
    assert_eq!(
        metric(&p, "portico_cache_collapsed_total").await,
        collapsed_before + CLIENTS as u64 - 1
    );
    // Updated: fresh now.
    let r = get(p.addr(), o.addr(), "/x").await;
    assert_eq!((r.body_str().as_str(), x_cache(&r)), (STORED, "HIT"));
}

/// A 200 answering the one conditional request replaces the stored
/// response (RFC 9111 4.3.3) and the waiting requests get that new response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_response_replacing_the_stale_one_is_sent_to_every_waiting_request() {
    let p = proxy("").await;
    let (o, conditional) = counting_origin(Answer::Replaced).await;
    store_then_stale(&p, o.addr()).await;
    for r in concurrent_gets(&p, o.addr(), "/x").await {
        assert_eq!(r.status, 200, "{:?}", r.headers);
        assert_eq!(r.body_str(), "new copy", "{:?}", r.headers);
        assert_eq!(r.header("etag"), Some("\"v2\""));
    }
    assert_eq!(conditional.load(Ordering::SeqCst), 1, "one conditional request");
    let r = get(p.addr(), o.addr(), "/x").await;
    assert_eq!((r.body_str().as_str(), x_cache(&r)), ("new copy", "HIT"));
}

/// A 200 that may not be stored is the answer to the leading request alone:
/// no waiting request gets its body; each gets an answer of the origin to
/// its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_response_that_may_not_be_stored_is_not_shared_each_request_gets_its_own() {
    let p = proxy("").await;
    let (o, conditional) = counting_origin(Answer::NotStorable).await;
    store_then_stale(&p, o.addr()).await;
    let mut bodies: Vec<String> = Vec::new();
    for r in concurrent_gets(&p, o.addr(), "/x").await {
        assert_eq!(r.status, 200, "{:?}", r.headers);
        let body = r.body_str();
        assert!(body.starts_with("answer "), "{body:?}");
        bodies.push(body);
    }
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), CLIENTS, "every client its own answer: {bodies:?}");
    assert_eq!(conditional.load(Ordering::SeqCst), CLIENTS);
}

/// A request waits at most `cache.revalidation_wait` for another's
/// revalidation, then revalidates for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_another_revalidation_at_most_revalidation_wait() {
    let p = proxy("revalidation_wait = \"0s\"").await;
    let (o, conditional) = counting_origin(Answer::NotModified).await;
    store_then_stale(&p, o.addr()).await;
    for r in concurrent_gets(&p, o.addr(), "/x").await {
        assert_eq!((r.status, r.body_str().as_str()), (200, STORED), "{:?}", r.headers);
    }
    assert_eq!(conditional.load(Ordering::SeqCst), CLIENTS, "nobody waited");
}

/// An origin answering its first request with `200 STORED` (`Cache-Control:
/// cc`, `ETag`), and closing every later connection after [`SLOW`]
/// without an answer; also returns its count of those later requests.
async fn closing_origin(cc: &'static str) -> (RawOrigin, Arc<AtomicUsize>) {
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
            tokio::time::sleep(SLOW).await;
            drop(s);
        }
    })
    .await;
    (o, count)
}

/// RFC 9111 4.2.4: when the one revalidation finds the origin
/// disconnected, every waiting request is served the stale response within
/// its stale-on-error window, without asking the origin again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_one_revalidation_fails_the_waiting_requests_are_served_stale_within_their_window() {
    let p = proxy("").await;
    let (o, n) = closing_origin("max-age=1").await;
    store_then_stale(&p, o.addr()).await;
    for r in concurrent_gets(&p, o.addr(), "/x").await {
        assert_eq!(r.status, 200, "{:?}", r.headers);
        assert_eq!(r.body_str(), STORED);
        assert_eq!(x_cache(&r), "STALE");
    }
    assert_eq!(n.load(Ordering::SeqCst), 2, "one store, one revalidation");
}

/// RFC 9111 4.2.4: "A cache MUST NOT generate a stale response if it is
/// prohibited by an explicit in-protocol directive (e.g., ... a
/// must-revalidate response directive ...)": a failed collapsed
/// revalidation gives no waiting request the stale response; each asks the
/// origin and gets the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_revalidate_prohibits_the_waiting_requests_a_stale_response_when_the_one_revalidation_fails() {
    let p = proxy("").await;
    let (o, _) = closing_origin("max-age=1, must-revalidate").await;
    store_then_stale(&p, o.addr()).await;
    for r in concurrent_gets(&p, o.addr(), "/x").await {
        assert_eq!(r.status, 502, "{:?} {:?}", r.headers, r.body_str());
        assert_ne!(r.body_str(), STORED);
        assert_ne!(x_cache(&r), "STALE");
    }
}

/// Concurrent requests for a URL not stored yet: one goes to the origin,
/// the others wait for its response and get it. `Cache-Status` (RFC 9211
/// 2.7) tells them apart: the first was forwarded and stored, each other
/// one `collapsed` into it, though `X-Cache` calls those hits (no origin
/// request was made for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_status_says_which_requests_were_collapsed_into_another_s_fetch() {
    let p = proxy("cache_status = \"edge\"").await;
    let o = Origin::start(|_| async move {
        Response::ok("first fetch")
            .header("Cache-Control", "max-age=3600")
            .delay(SLOW)
    })
    .await;
    let answers = concurrent_gets(&p, o.addr(), "/new").await;
    assert_eq!(o.count(), 1, "one origin request");
    let members: Vec<&str> = answers
        .iter()
        .map(|r| {
            assert_eq!((r.status, r.body_str().as_str()), (200, "first fetch"));
            let all = r.headers_all("cache-status");
            assert_eq!(all.len(), 1, "{:?}", r.headers);
            all[0]
        })
        .collect();
    let leader: Vec<_> = members.iter().filter(|m| !m.contains("collapsed")).collect();
    assert_eq!(leader, [&"edge; fwd=miss; fwd-status=200; stored"], "{members:?}");
    for m in members.iter().filter(|m| m.contains("collapsed")) {
        assert!(m.starts_with("edge; fwd=miss; fwd-status=200; ttl="), "{m}");
        assert!(m.ends_with("; collapsed"), "{m}");
    }
    let collapsed = answers.iter().filter(|r| x_cache(r) == "HIT").count();
    assert_eq!(collapsed, CLIENTS - 1, "{members:?}");
}
