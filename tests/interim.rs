//! Interim (1xx) responses through the real binary (RFC 9110 15.2): an
//! origin's `102 Processing` and `103 Early Hints` (with its `Link`
//! fields) reach HTTP/1.1 clients before the final response, on forward
//! and reverse listeners, through the cache's miss path and without it;
//! HTTP/1.0 clients never get them; the cache neither stores nor replays
//! them nor lets their fields into the final response (the cache-tests
//! `interim-not-cached`, `interim-102`, `interim-103`,
//! `interim-no-header-reuse`); `Expect: 100-continue` still yields one
//! `100 Continue`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

const EARLY_HINTS: &[u8] = b"HTTP/1.1 103 Early Hints\r\n\
    Link: </style.css>; rel=preload; as=style\r\n\
    Link: <https://cdn.example>; rel=preconnect\r\n\
    X-My-Header: from-the-103\r\n\r\n";

const PROCESSING: &[u8] = b"HTTP/1.1 102 Processing\r\n\r\n";

/// A final response the cache may store for an hour.
const FINAL_CACHEABLE: &[u8] = b"HTTP/1.1 200 OK\r\n\
    Cache-Control: max-age=3600\r\n\
    Content-Type: text/plain\r\n\
    Content-Length: 5\r\n\r\nfinal";

/// A final response the cache does not store.
const FINAL_UNCACHEABLE: &[u8] = b"HTTP/1.1 200 OK\r\n\
    Cache-Control: no-store\r\n\
    Content-Length: 5\r\n\r\nfinal";

/// An origin that answers each request (one per connection) with
/// `interim`, then, once `hold` (if any) is notified, with `last` and
/// closes.
async fn origin(interim: &'static [&'static [u8]], last: &'static [u8], hold: Option<Arc<Notify>>) -> RawOrigin {
    RawOrigin::start(move |mut s| {
        let hold = hold.clone();
        async move {
            read_request_head(&mut s).await;
            for i in interim {
                if s.write_all(i).await.is_err() {
                    return;
                }
            }
            let _ = s.flush().await;
            if let Some(h) = hold {
                h.notified().await;
            }
            let _ = s.write_all(last).await;
            let _ = s.shutdown().await;
        }
    })
    .await
}

/// A forward proxy; `more` is further config text.
async fn forward_proxy(more: &str) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n\n{more}",
        free_addr()
    ))
    .await
}

/// A reverse proxy sending everything to `origin`.
async fn reverse_proxy(origin: &RawOrigin) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"reverse\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n\n\
         [[upstream]]\nname = \"o\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nhost = \"*\"\nupstream = \"o\"\n",
        free_addr(),
        origin.addr()
    ))
    .await
}

/// `GET http://origin/path` (forward form) with `Connection: close`.
fn forward_get(origin: &RawOrigin, path: &str, version: &str) -> String {
    let o = origin.addr();
    format!("GET http://{o}{path} {version}\r\nHost: {o}\r\nConnection: close\r\n\r\n")
}

fn has_hint_fields(r: &ParsedResponse) -> bool {
    r.header("link").is_some() || r.header("x-my-header").is_some()
}

#[track_caller]
fn assert_early_hints(r: &ParsedResponse) {
    assert_eq!(r.status, 103, "{r:?}");
    assert_eq!(r.version, "HTTP/1.1");
    assert_eq!(
        r.headers_all("link"),
        vec![
            "</style.css>; rel=preload; as=style",
            "<https://cdn.example>; rel=preconnect"
        ],
        "the 103's Link fields, in order: {r:?}"
    );
    assert_eq!(r.header("x-my-header"), Some("from-the-103"));
    assert!(r.header("content-length").is_none() && r.header("transfer-encoding").is_none());
}

/// The figure `name` (without labels) on `/metrics`.
async fn metric(p: &Portico, name: &str) -> Option<f64> {
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        p.addr()
    );
    let page = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!(page.status, 200, "/metrics: {}", page.body_str());
    page.body_str().lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_forwards_a_103_to_an_http11_client_before_the_final_response() {
    let hold = Arc::new(Notify::new());
    let o = origin(&[EARLY_HINTS], FINAL_UNCACHEABLE, Some(hold.clone())).await;
    let p = forward_proxy("").await;
    let mut c = RawClient::connect(p.addr()).await;
    c.send(forward_get(&o, "/page", "HTTP/1.1").as_bytes()).await;
    // The origin holds its final response until the client has the 103: a
    // proxy that waited for the final response before writing would time
    // out here.
    let hints = c.read_response().await;
    assert_early_hints(&hints);
    hold.notify_one();
    let last = c.read_response().await;
    assert_eq!(last.status, 200);
    assert_eq!(last.body_str(), "final");
    assert!(
        !has_hint_fields(&last),
        "the 103's fields leaked into the final response: {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_proxy_forwards_102_and_103_in_order_then_the_final_response() {
    let o = origin(&[PROCESSING, EARLY_HINTS], FINAL_UNCACHEABLE, None).await;
    let p = reverse_proxy(&o).await;
    let bytes = raw_request(
        p.addr(),
        b"GET /page HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    let all = parse_responses(&bytes);
    let statuses: Vec<u16> = all.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [102, 103, 200], "{}", String::from_utf8_lossy(&bytes));
    assert_early_hints(&all[1]);
    assert_eq!(all[2].body_str(), "final");
    assert!(!has_hint_fields(&all[2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_must_not_send_a_1xx_response_to_an_http10_client() {
    let o = origin(&[PROCESSING, EARLY_HINTS], FINAL_UNCACHEABLE, None).await;
    let p = forward_proxy("").await;
    for path in ["/a", "/b"] {
        let bytes = raw_request(p.addr(), forward_get(&o, path, "HTTP/1.0").as_bytes()).await;
        let all = parse_responses(&bytes);
        assert_eq!(all.len(), 1, "one response only: {}", String::from_utf8_lossy(&bytes));
        assert_eq!(all[0].status, 200);
        assert_eq!(all[0].body_str(), "final");
        assert!(!has_hint_fields(&all[0]));
    }
    // The same origin does send them to an HTTP/1.1 client.
    let bytes = raw_request(p.addr(), forward_get(&o, "/c", "HTTP/1.1").as_bytes()).await;
    assert_eq!(parse_responses(&bytes).len(), 3);
}

/// cache-tests `interim-102`, `interim-103`, `interim-not-cached` and
/// `interim-no-header-reuse`: the interim responses pass through on the
/// miss, the final response is stored without their fields, and the hit
/// that follows replays none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_passes_interim_responses_through_and_never_stores_or_replays_them() {
    let o = origin(&[PROCESSING, EARLY_HINTS], FINAL_CACHEABLE, None).await;
    let p = forward_proxy("").await;
    let bytes = raw_request(p.addr(), forward_get(&o, "/cached", "HTTP/1.1").as_bytes()).await;
    let miss = parse_responses(&bytes);
    let statuses: Vec<u16> = miss.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [102, 103, 200], "{}", String::from_utf8_lossy(&bytes));
    assert_early_hints(&miss[1]);
    assert_eq!(miss[2].header("x-cache"), Some("MISS"));
    assert!(!has_hint_fields(&miss[2]), "{:?}", miss[2]);

    for _ in 0..2 {
        let bytes = raw_request(p.addr(), forward_get(&o, "/cached", "HTTP/1.1").as_bytes()).await;
        let hit = parse_responses(&bytes);
        assert_eq!(
            hit.len(),
            1,
            "a hit replays no interim response: {}",
            String::from_utf8_lossy(&bytes)
        );
        assert_eq!(hit[0].status, 200);
        assert_eq!(hit[0].header("x-cache"), Some("HIT"));
        assert_eq!(hit[0].body_str(), "final");
        assert!(
            !has_hint_fields(&hit[0]),
            "the stored response took the 103's fields: {:?}",
            hit[0]
        );
    }
    assert_eq!(o.connections(), 1, "the hits came from the cache");
    assert_eq!(metric(&p, "portico_upstream_interim_responses_total").await, Some(2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_gets_one_100_and_the_origins_hints_follow_it() {
    // The origin sends its own (unsolicited) 100 and a 103, reads the
    // 5-byte body, then answers.
    let o = RawOrigin::start(|mut s| async move {
        let mut got = read_request_head(&mut s).await;
        let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
        let _ = s.write_all(EARLY_HINTS).await;
        let head_end = got
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(got.len(), |p| p + 4);
        let mut tmp = [0u8; 64];
        while got.len() < head_end + 5 {
            match tokio::time::timeout(Duration::from_secs(5), s.read(&mut tmp)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&tmp[..n]),
                _ => return,
            }
        }
        let body = String::from_utf8_lossy(&got[head_end..]).into_owned();
        let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        let _ = s.write_all(resp.as_bytes()).await;
    })
    .await;
    let p = forward_proxy("").await;
    let a = o.addr();
    let mut c = RawClient::connect(p.addr()).await;
    c.send(
        format!(
            "POST http://{a}/upload HTTP/1.1\r\nHost: {a}\r\nExpect: 100-continue\r\n\
             Content-Length: 5\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let cont = c.read_response().await;
    assert_eq!(cont.status, 100);
    c.send(b"hello").await;
    let rest = c.read_to_end().await;
    let rest = parse_responses(&rest);
    let statuses: Vec<u16> = rest.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [103, 200], "one 100 only, the 103 relayed");
    assert_eq!(rest[1].body_str(), "hello");
}

/// An origin flooding interim responses gets at most a bounded number of
/// them queued for a client that reads slowly, and the final response
/// still arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_interim_responses_ends_in_the_final_response() {
    let o = RawOrigin::start(|mut s| async move {
        read_request_head(&mut s).await;
        let mut flood = Vec::new();
        for _ in 0..5000 {
            flood.extend_from_slice(PROCESSING);
        }
        let _ = s.write_all(&flood).await;
        let _ = s.write_all(FINAL_UNCACHEABLE).await;
    })
    .await;
    let p = forward_proxy("").await;
    let bytes = raw_request(p.addr(), forward_get(&o, "/flood", "HTTP/1.1").as_bytes()).await;
    let all = parse_responses(&bytes);
    let last = all.last().expect("responses");
    assert_eq!(last.status, 200);
    assert_eq!(last.body_str(), "final");
    assert!(all[..all.len() - 1].iter().all(|r| r.status == 102));
}
