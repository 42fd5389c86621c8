//! Targeted cache-control fields (RFC 9213, `CDN-Cache-Control`; the
//! cache-tests suite's `cdn-*` tests) end to end: the real `portico` binary
//! with a reverse listener (a CDN, which obeys them) and a forward one (not
//! a CDN, which does not), in front of one origin. Every test checks what
//! the clients got (`X-Cache`, the fields) and how often the origin was asked.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;

/// The origin: each path answers with the fields its name describes.
async fn origin() -> Origin {
    Origin::start(|req| async move {
        let r = Response::ok(format!("page {}", req.uri.path()));
        match req.uri.path() {
            "/cdn-overrides-no-store" => r
                .header("Cache-Control", "no-store")
                .header("CDN-Cache-Control", "max-age=600"),
            "/cdn-no-store" => r
                .header("Cache-Control", "max-age=600")
                .header("CDN-Cache-Control", "no-store"),
            "/cdn-invalid" => r
                .header("Cache-Control", "no-store")
                .header("CDN-Cache-Control", "max-age=600,,"),
            // A String where max-age takes an Integer (cache-tests
            // cdn-cc-invalid-sh-type-wrong).
            "/cdn-wrong-type" => r
                .header("Cache-Control", "no-store")
                .header("CDN-Cache-Control", "max-age=\"10000\""),
            "/own-field-first" => r
                .header("Cache-Control", "no-store")
                .header("CDN-Cache-Control", "no-store")
                .header("Portico-Cache-Control", "max-age=600"),
            _ => r.header("Cache-Control", "max-age=600"),
        }
    })
    .await
}

/// A forward and a reverse listener (whose requests all go to `origin`),
/// with `cache_extra` more `[cache]` keys.
async fn proxy(origin: &Origin, cache_extra: &str) -> (Portico, SocketAddr, SocketAddr) {
    let (forward, reverse) = (free_addr(), free_addr());
    let p = Portico::start(&config(origin, &forward, &reverse, cache_extra)).await;
    let parse = |a: &str| a.parse::<SocketAddr>().expect("listener address");
    (p, parse(&forward), parse(&reverse))
}

/// The config [`proxy`] starts with (and a reload may rewrite).
fn config(origin: &Origin, forward: &str, reverse: &str, cache_extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{forward}\"\nmode = \"forward\"\n\n\
         [[listener]]\naddress = \"{reverse}\"\nmode = \"reverse\"\n\n\
         [[upstream]]\nname = \"site\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nmode = \"reverse\"\nupstream = \"site\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n{cache_extra}\n",
        origin.addr()
    )
}

/// `GET path` on the reverse listener.
async fn reverse_get(addr: SocketAddr, path: &str) -> ParsedResponse {
    let req = format!("GET {path} HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

/// `GET http://origin/path` on the forward listener.
async fn forward_get(addr: SocketAddr, origin: &Origin, path: &str) -> ParsedResponse {
    let o = origin.addr();
    let req = format!("GET http://{o}{path} HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

/// The `X-Cache` values of two requests made by `get`.
#[track_caller]
fn x_caches(a: &ParsedResponse, b: &ParsedResponse) -> (String, String) {
    assert_eq!((a.status, b.status), (200, 200), "{:?} {:?}", a.headers, b.headers);
    let x = |r: &ParsedResponse| r.header("x-cache").unwrap_or("<none>").to_string();
    (x(a), x(b))
}

/// RFC 9213 2.2: the cache MUST use the targeted field's value "to determine
/// the caching policy for the response, and it MUST ignore the Cache-Control
/// and Expires header fields in that response".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdn_uses_cdn_cache_control_and_ignores_cache_control() {
    let o = origin().await;
    let (_p, _, reverse) = proxy(&o, "").await;
    let (a, b) = (
        reverse_get(reverse, "/cdn-overrides-no-store").await,
        reverse_get(reverse, "/cdn-overrides-no-store").await,
    );
    assert_eq!(x_caches(&a, &b), ("MISS".into(), "HIT".into()));
    assert_eq!(b.body_str(), "page /cdn-overrides-no-store");
    // Passed on by default (a CDN in front of Portico obeys it too), with
    // Cache-Control for the browsers untouched.
    assert_eq!(b.header("cdn-cache-control"), Some("max-age=600"));
    assert_eq!(b.header("cache-control"), Some("no-store"));
    assert_eq!(o.count(), 1);

    let (a, b) = (
        reverse_get(reverse, "/cdn-no-store").await,
        reverse_get(reverse, "/cdn-no-store").await,
    );
    assert_eq!(x_caches(&a, &b), ("MISS".into(), "MISS".into()));
    assert_eq!(o.count(), 3);
}

/// RFC 9213 2.2: "Targeted fields that are not on a cache's target list
/// MUST NOT change that cache's behavior": a forward proxy is no CDN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_proxy_is_not_a_target_of_cdn_cache_control() {
    let o = origin().await;
    let (_p, forward, _) = proxy(&o, "").await;
    let (a, b) = (
        forward_get(forward, &o, "/cdn-overrides-no-store").await,
        forward_get(forward, &o, "/cdn-overrides-no-store").await,
    );
    assert_eq!(x_caches(&a, &b), ("MISS".into(), "MISS".into()));
    let (a, b) = (
        forward_get(forward, &o, "/cdn-no-store").await,
        forward_get(forward, &o, "/cdn-no-store").await,
    );
    assert_eq!(x_caches(&a, &b), ("MISS".into(), "HIT".into()));
    assert_eq!(o.count(), 3);
}

/// RFC 9213 2.1: a targeted field that fails to parse as a Dictionary, or
/// whose `max-age` is not an Integer, is ignored, and Cache-Control applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_cdn_cache_control_is_ignored() {
    let o = origin().await;
    let (_p, _, reverse) = proxy(&o, "").await;
    for path in ["/cdn-invalid", "/cdn-wrong-type"] {
        let before = o.count();
        let (a, b) = (reverse_get(reverse, path).await, reverse_get(reverse, path).await);
        assert_eq!(x_caches(&a, &b), ("MISS".into(), "MISS".into()), "{path}");
        assert_eq!(o.count() - before, 2, "{path}");
    }
}

/// An operator-named field first on the target list wins over
/// `CDN-Cache-Control`, and `strip_targeted_fields` keeps both from clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_field_on_the_target_list_wins_and_stripped_fields_reach_no_client() {
    let o = origin().await;
    let (_p, _, reverse) = proxy(
        &o,
        "targeted_fields = [\"Portico-Cache-Control\", \"CDN-Cache-Control\"]\nstrip_targeted_fields = true",
    )
    .await;
    let (a, b) = (
        reverse_get(reverse, "/own-field-first").await,
        reverse_get(reverse, "/own-field-first").await,
    );
    assert_eq!(x_caches(&a, &b), ("MISS".into(), "HIT".into()));
    assert_eq!(o.count(), 1);
    for r in [&a, &b] {
        assert_eq!(r.header("portico-cache-control"), None, "{:?}", r.headers);
        assert_eq!(r.header("cdn-cache-control"), None, "{:?}", r.headers);
        assert_eq!(r.header("cache-control"), Some("no-store"));
    }
}

/// A hit's head is written from field lines kept with the stored response
/// on its first hit; a reload that starts stripping targeted fields must
/// not go on sending the lines written before it (nor, reloaded back, the
/// lines written while stripping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_fields_are_stripped_from_hits_after_a_reload_that_strips_them() {
    let o = origin().await;
    let (forward, reverse) = (free_addr(), free_addr());
    let p = Portico::start(&config(&o, &forward, &reverse, "")).await;
    let reverse: SocketAddr = reverse.parse().expect("listener address");
    let path = "/cdn-overrides-no-store";
    let (a, b) = (reverse_get(reverse, path).await, reverse_get(reverse, path).await);
    assert_eq!(x_caches(&a, &b), ("MISS".into(), "HIT".into()));
    assert_eq!(b.header("cdn-cache-control"), Some("max-age=600"));

    // Reloads until a hit shows the field `present` or not (a reload takes
    // effect a moment after the signal), checking every answer is a hit.
    let reload_until = |extra: &'static str, present: bool| {
        p.rewrite_config(&config(&o, &forward, &reverse.to_string(), extra));
        p.signal(libc::SIGHUP);
        async move {
            for _ in 0..100 {
                let r = reverse_get(reverse, path).await;
                assert_eq!((r.status, r.header("x-cache")), (200, Some("HIT")), "{:?}", r.headers);
                if r.header("cdn-cache-control").is_some() == present {
                    return r;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!(
                "CDN-Cache-Control still {} after the reload",
                if present { "absent" } else { "sent" }
            );
        }
    };
    let r = reload_until("strip_targeted_fields = true", false).await;
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.body_str(), "page /cdn-overrides-no-store");
    let r = reload_until("", true).await;
    assert_eq!(r.header("cdn-cache-control"), Some("max-age=600"));
    assert_eq!(o.count(), 1, "every answer after the first came from the cache");
}

/// Per route: a rule's `cache = { targeted_fields = [] }` obeys none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_can_turn_targeted_fields_off_for_its_route() {
    let o = origin().await;
    let reverse = free_addr();
    let _p = Portico::start(&format!(
        "[[listener]]\naddress = \"{reverse}\"\nmode = \"reverse\"\n\n\
         [[upstream]]\nname = \"site\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nmode = \"reverse\"\nupstream = \"site\"\ncache = {{ targeted_fields = [] }}\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n",
        o.addr()
    ))
    .await;
    let reverse: SocketAddr = reverse.parse().expect("address");
    let (a, b) = (
        reverse_get(reverse, "/cdn-overrides-no-store").await,
        reverse_get(reverse, "/cdn-overrides-no-store").await,
    );
    assert_eq!(x_caches(&a, &b), ("MISS".into(), "MISS".into()));
    assert_eq!(o.count(), 2);
}
