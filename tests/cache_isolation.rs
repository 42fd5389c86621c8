//! What one client's response may do to another's, through the real
//! `portico` binary with scripted origins behind it.
//!
//! The cache keys: one Portico with a forward and a reverse listener
//! sharing its cache. A reverse client names the public URL with its
//! `Host`, so a reverse object's key also names the `[[upstream]]` group it
//! came from: no client of one listener kind can plant an object for the
//! other, and two reverse routes to different groups never share one.
//! `PURGE` and `portico cache purge|list` take public URLs and see every copy.
//!
//! Cookies: a response's `Set-Cookie` reaches another client only when the
//! operator chose `set_cookie = "store"` (`[cache]` or a rule's `cache`).

mod common;

use std::net::SocketAddr;
use std::process::Output;

use common::*;

/// A Portico with a forward listener, a reverse listener and a disk and
/// memory cache under its temp dir; `more` is further config (upstreams,
/// rules). Returns it with the forward and reverse addresses.
async fn two_listeners(more: &str) -> (Portico, SocketAddr, SocketAddr) {
    let (forward, reverse) = (free_addr(), free_addr());
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{forward}\"\nmode = \"forward\"\n\n\
         [[listener]]\naddress = \"{reverse}\"\nmode = \"reverse\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n\n{more}"
    ))
    .await;
    let parse = |a: &str| a.parse::<SocketAddr>().expect("listener address");
    (p, parse(&forward), parse(&reverse))
}

/// An origin answering every request with `<name> <target>`, cacheable
/// for ten minutes.
async fn named(name: &'static str) -> Origin {
    Origin::start(move |req| async move {
        Response::ok(format!("{name} {}", req.uri)).header("cache-control", "max-age=600")
    })
    .await
}

/// `[[upstream]] name` serving from `origin`.
fn upstream(name: &str, origin: &Origin) -> String {
    format!("[[upstream]]\nname = \"{name}\"\nservers = [\"{}\"]\n\n", origin.addr())
}

/// `METHOD target` on `addr` with `Host: host`, `extra` header lines and
/// `Connection: close`, parsed.
async fn request(addr: SocketAddr, method: &str, target: &str, host: &str, extra: &str) -> ParsedResponse {
    let req = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

/// A reverse client's `GET path` with `Host: host`.
async fn reverse_get(addr: SocketAddr, host: &str, path: &str, extra: &str) -> ParsedResponse {
    request(addr, "GET", path, host, extra).await
}

/// A forward-proxy client's `GET url` (`http://authority/path`).
async fn forward_get(addr: SocketAddr, authority: &str, path: &str) -> ParsedResponse {
    request(addr, "GET", &format!("http://{authority}{path}"), authority, "").await
}

/// Asserts status, body and X-Cache.
#[track_caller]
fn check(r: &ParsedResponse, status: u16, body: &str, cache: &str) {
    assert_eq!(
        (r.status, r.body_str().as_str(), r.header("x-cache").unwrap_or("<none>")),
        (status, body, cache),
        "headers {:?}",
        r.headers
    );
}

/// Runs `portico cache ARGS -c <p's config>` in p's directory.
async fn cache_command(p: &Portico, args: &[&str]) -> Output {
    let config = p.config_path().to_path_buf();
    let dir = p.dir().to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
            .current_dir(dir)
            .arg("cache")
            .args(&args)
            .arg("-c")
            .arg(config)
            .output()
            .expect("run portico cache")
    })
    .await
    .expect("join")
}

/// The finding: a reverse client sending `Host: 127.0.0.1:<port where
/// nothing listens>` stored the reverse origin's page under
/// `http://127.0.0.1:<port>/...`, and a forward-proxy client asking for
/// that URL got it as a HIT. It must reach for the (absent) origin instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_client_cannot_plant_a_page_for_a_forward_proxy_url() {
    let site = named("site").await;
    let (_p, forward, reverse) = two_listeners(&format!(
        "{}[[rule]]\nmode = \"reverse\"\nupstream = \"site\"\n",
        upstream("site", &site)
    ))
    .await;
    let nothing = dead_addr();
    check(
        &reverse_get(reverse, &nothing, "/page", "").await,
        200,
        "site /page",
        "MISS",
    );
    check(
        &reverse_get(reverse, &nothing, "/page", "").await,
        200,
        "site /page",
        "HIT",
    );

    let r = forward_get(forward, &nothing, "/page").await;
    assert!(
        r.status == 502 || r.status == 504,
        "the forward client must reach for the origin, which is not there: {} {:?} {:?}",
        r.status,
        r.headers,
        r.body_str()
    );
    assert!(!r.body_str().contains("site /page"), "{:?}", r.body_str());
    assert_ne!(r.header("x-cache"), Some("HIT"));
    assert_eq!(site.count(), 1);
}

/// The other direction: a forward client storing an origin's page under a
/// URL whose host is the reverse site's public name must not have it
/// served to the reverse site's clients, and the reverse fetch must not
/// replace the forward object either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_client_cannot_plant_a_page_for_a_reverse_site() {
    let site = named("site").await;
    let evil = named("evil").await;
    let (_p, forward, reverse) = two_listeners(&format!(
        "{}[[rule]]\nmode = \"reverse\"\nupstream = \"site\"\n",
        upstream("site", &site)
    ))
    .await;
    // The reverse site's public name is whatever clients send as Host:
    // here the evil origin's address, which a forward client can fetch.
    let public = evil.addr().to_string();
    check(&forward_get(forward, &public, "/x").await, 200, "evil /x", "MISS");
    check(&forward_get(forward, &public, "/x").await, 200, "evil /x", "HIT");

    check(&reverse_get(reverse, &public, "/x", "").await, 200, "site /x", "MISS");
    check(&reverse_get(reverse, &public, "/x", "").await, 200, "site /x", "HIT");
    check(&forward_get(forward, &public, "/x").await, 200, "evil /x", "HIT");
    assert_eq!((site.count(), evil.count()), (1, 1));
}

/// Two reverse routes for the same public host and path, to different
/// groups (chosen by a request header): each group's page is stored and
/// served on its own route only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reverse_routes_to_different_upstreams_never_share_an_object() {
    let a = named("a").await;
    let b = named("b").await;
    let (_p, _forward, reverse) = two_listeners(&format!(
        "{}{}\
         [[rule]]\nmode = \"reverse\"\nheader = {{ name = \"X-Pool\", value = \"b\" }}\nupstream = \"b\"\n\n\
         [[rule]]\nmode = \"reverse\"\nupstream = \"a\"\n",
        upstream("a", &a),
        upstream("b", &b)
    ))
    .await;
    let host = "www.example.test";
    check(&reverse_get(reverse, host, "/same", "").await, 200, "a /same", "MISS");
    check(
        &reverse_get(reverse, host, "/same", "X-Pool: b\r\n").await,
        200,
        "b /same",
        "MISS",
    );
    check(&reverse_get(reverse, host, "/same", "").await, 200, "a /same", "HIT");
    check(
        &reverse_get(reverse, host, "/same", "X-Pool: b\r\n").await,
        200,
        "b /same",
        "HIT",
    );
    assert_eq!((a.count(), b.count()), (1, 1));
}

/// PURGE takes a public URL and removes every copy stored for it: on a
/// reverse listener (Host and path) as on the forward one (absolute URL),
/// the forward object and each upstream group's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_every_copy_of_a_public_url() {
    let a = named("a").await;
    let b = named("b").await;
    let (_p, forward, reverse) = two_listeners(&format!(
        "{}{}\
         [[rule]]\nmode = \"reverse\"\nheader = {{ name = \"X-Pool\", value = \"b\" }}\nupstream = \"b\"\n\n\
         [[rule]]\nmode = \"reverse\"\nupstream = \"a\"\n",
        upstream("a", &a),
        upstream("b", &b)
    ))
    .await;
    // The public host is a's address, so a forward client stores a copy too.
    let host = a.addr().to_string();
    let fill = || async {
        reverse_get(reverse, &host, "/p", "").await;
        reverse_get(reverse, &host, "/p", "X-Pool: b\r\n").await;
        forward_get(forward, &host, "/p").await;
    };
    fill().await;
    assert_eq!((a.count(), b.count()), (2, 1));

    // On the reverse listener.
    let r = request(reverse, "PURGE", "/p", &host, "").await;
    assert_eq!(r.status, 200, "{:?}", r.body_str());
    check(&reverse_get(reverse, &host, "/p", "").await, 200, "a /p", "MISS");
    check(
        &reverse_get(reverse, &host, "/p", "X-Pool: b\r\n").await,
        200,
        "b /p",
        "MISS",
    );
    check(&forward_get(forward, &host, "/p").await, 200, "a /p", "MISS");

    // On the forward listener.
    let r = request(forward, "PURGE", &format!("http://{host}/p"), &host, "").await;
    assert_eq!(r.status, 200, "{:?}", r.body_str());
    check(&reverse_get(reverse, &host, "/p", "").await, 200, "a /p", "MISS");
    check(
        &reverse_get(reverse, &host, "/p", "X-Pool: b\r\n").await,
        200,
        "b /p",
        "MISS",
    );
    check(&forward_get(forward, &host, "/p").await, 200, "a /p", "MISS");
    let r = request(forward, "PURGE", &format!("http://{host}/p"), &host, "").await;
    assert_eq!(r.status, 200);
    let r = request(forward, "PURGE", &format!("http://{host}/p"), &host, "").await;
    assert_eq!(r.status, 404, "nothing left: {:?}", r.body_str());
}

/// `portico cache list` shows which group a reverse object came from, and
/// `portico cache purge URL` removes every copy of the public URL, on the
/// disk and in the running server's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_command_lists_and_purges_every_copy_of_a_public_url() {
    let a = named("a").await;
    let b = named("b").await;
    let (p, forward, reverse) = two_listeners(&format!(
        "{}{}\
         [[rule]]\nmode = \"reverse\"\nheader = {{ name = \"X-Pool\", value = \"b\" }}\nupstream = \"b\"\n\n\
         [[rule]]\nmode = \"reverse\"\nupstream = \"a\"\n",
        upstream("a", &a),
        upstream("b", &b)
    ))
    .await;
    let host = a.addr().to_string();
    reverse_get(reverse, &host, "/c", "").await;
    reverse_get(reverse, &host, "/c", "X-Pool: b\r\n").await;
    forward_get(forward, &host, "/c").await;
    reverse_get(reverse, &host, "/other", "").await;

    // The disk writes finish after the responses: wait for the four objects.
    let mut listed = String::new();
    for _ in 0..50 {
        let out = cache_command(&p, &["list"]).await;
        listed = String::from_utf8_lossy(&out.stdout).into_owned();
        if listed.lines().count() == 4 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let url = format!("http://{host}/c");
    let firsts: Vec<(&str, Option<&str>)> = listed
        .lines()
        .map(|l| (l.split(' ').next().unwrap_or(""), l.split(" upstream:").nth(1)))
        .collect();
    assert_eq!(
        firsts,
        [
            (url.as_str(), None),
            (url.as_str(), Some("a")),
            (url.as_str(), Some("b")),
            (format!("http://{host}/other").as_str(), Some("a")),
        ],
        "{listed}"
    );

    let out = cache_command(&p, &["purge", &url]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("purged 3 objects"), "{stdout}");
    assert!(stdout.contains("dropped it from memory too"), "{stdout}");
    check(&reverse_get(reverse, &host, "/c", "").await, 200, "a /c", "MISS");
    check(
        &reverse_get(reverse, &host, "/c", "X-Pool: b\r\n").await,
        200,
        "b /c",
        "MISS",
    );
    check(&forward_get(forward, &host, "/c").await, 200, "a /c", "MISS");
    check(&reverse_get(reverse, &host, "/other", "").await, 200, "a /other", "HIT");
}

/// A forward proxy with `[cache]` keys `cache_extra` and further config `more`.
async fn forward_proxy(cache_extra: &str, more: &str) -> (Portico, SocketAddr) {
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n{cache_extra}\n\n{more}"
    ))
    .await;
    let addr = addr.parse().expect("listener address");
    (p, addr)
}

/// An origin setting a cookie numbered by its request count on every
/// response, cacheable for ten minutes with a validator; a conditional
/// request gets a 304 (with a fresh cookie too). Under `/quiet/` only the
/// 304s set a cookie.
async fn cookie_origin() -> Origin {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    Origin::start(move |req| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        async move {
            let cookie = format!("session={n}");
            let resp = if req.header("if-none-match").is_some() {
                Response::new(304).header("set-cookie", &cookie)
            } else if req.uri.path().starts_with("/quiet/") {
                Response::ok(format!("page {}", req.uri))
            } else {
                Response::ok(format!("page {}", req.uri)).header("set-cookie", &cookie)
            };
            resp.header("cache-control", "max-age=600").header("etag", "\"v1\"")
        }
    })
    .await
}

/// The Set-Cookie fields of a response.
fn cookies(r: &ParsedResponse) -> Vec<&str> {
    r.headers_all("set-cookie")
}

/// `GET http://origin/path` through the forward proxy with extra header lines.
async fn get_through(proxy: SocketAddr, origin: &Origin, path: &str, extra: &str) -> ParsedResponse {
    let authority = origin.addr().to_string();
    request(proxy, "GET", &format!("http://{authority}{path}"), &authority, extra).await
}

/// Default (`set_cookie = "no-store"`): a response with Set-Cookie goes to
/// the client that asked and is not stored: the next client fetches its
/// own, with its own cookie, never the first client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_set_cookie_response_is_not_stored() {
    let origin = cookie_origin().await;
    let (_p, proxy) = forward_proxy("", "").await;
    let first = get_through(proxy, &origin, "/login", "").await;
    check(&first, 200, "page /login", "MISS");
    assert_eq!(cookies(&first), ["session=1"]);
    let second = get_through(proxy, &origin, "/login", "").await;
    check(&second, 200, "page /login", "MISS");
    assert_eq!(cookies(&second), ["session=2"]);
    assert_eq!(origin.count(), 2);
}

/// A 304 that revalidates a stored response gives its cookie to the client
/// that revalidated, and never to the clients served from the cache after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revalidation_passes_its_set_cookie_to_its_own_client_only() {
    let origin = cookie_origin().await;
    let (_p, proxy) = forward_proxy("", "").await;
    let first = get_through(proxy, &origin, "/quiet/a", "").await;
    check(&first, 200, "page /quiet/a", "MISS");
    assert!(cookies(&first).is_empty());
    // max-age=0: revalidate; the origin's 304 sets session=2.
    let reval = get_through(proxy, &origin, "/quiet/a", "Cache-Control: max-age=0\r\n").await;
    check(&reval, 200, "page /quiet/a", "REVALIDATED");
    assert_eq!(cookies(&reval), ["session=2"]);
    let hit = get_through(proxy, &origin, "/quiet/a", "").await;
    check(&hit, 200, "page /quiet/a", "HIT");
    assert!(cookies(&hit).is_empty(), "{:?}", hit.headers);
    assert_eq!(origin.count(), 2);
}

/// `set_cookie = "strip"` in `[cache]`: stored without the cookie, which
/// the fetching client still gets; a rule can go back to `no-store` or
/// choose `store` (RFC 9111's replay) for its route; revalidations never
/// leak a cookie under `strip` either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_cookie_strip_globally_and_per_rule_overrides() {
    let origin = cookie_origin().await;
    let (_p, proxy) = forward_proxy(
        "set_cookie = \"strip\"",
        "[[rule]]\npath = \"/private/\"\ncache = { set_cookie = \"no-store\" }\n\n\
         [[rule]]\npath = \"/shared/\"\ncache = { set_cookie = \"store\" }\n",
    )
    .await;
    // strip: the first client has its cookie, the second a HIT without it.
    let first = get_through(proxy, &origin, "/page", "").await;
    check(&first, 200, "page /page", "MISS");
    assert_eq!(cookies(&first), ["session=1"]);
    let hit = get_through(proxy, &origin, "/page", "").await;
    check(&hit, 200, "page /page", "HIT");
    assert!(cookies(&hit).is_empty(), "{:?}", hit.headers);
    // A revalidation: its 304's cookie to the revalidating client only.
    let reval = get_through(proxy, &origin, "/page", "Cache-Control: max-age=0\r\n").await;
    check(&reval, 200, "page /page", "REVALIDATED");
    assert_eq!(cookies(&reval), ["session=2"]);
    let hit = get_through(proxy, &origin, "/page", "").await;
    check(&hit, 200, "page /page", "HIT");
    assert!(cookies(&hit).is_empty(), "{:?}", hit.headers);

    // The rule's no-store: each client fetches its own.
    let a = get_through(proxy, &origin, "/private/p", "").await;
    let b = get_through(proxy, &origin, "/private/p", "").await;
    check(&a, 200, "page /private/p", "MISS");
    check(&b, 200, "page /private/p", "MISS");
    assert_eq!((cookies(&a), cookies(&b)), (vec!["session=3"], vec!["session=4"]));

    // The rule's store: the operator chose to replay the cookie.
    let a = get_through(proxy, &origin, "/shared/s", "").await;
    let b = get_through(proxy, &origin, "/shared/s", "").await;
    check(&a, 200, "page /shared/s", "MISS");
    check(&b, 200, "page /shared/s", "HIT");
    assert_eq!((cookies(&a), cookies(&b)), (vec!["session=5"], vec!["session=5"]));
    assert_eq!(origin.count(), 5);
}

/// Requests collapsed onto another client's fetch are other clients: under
/// `strip` they get the response without the fetching client's cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collapsed_requests_do_not_get_the_fetching_clients_cookie() {
    let origin = Origin::start(|req| async move {
        Response::ok(format!("page {}", req.uri))
            .header("cache-control", "max-age=600")
            .header("set-cookie", "session=leader")
            .delay(std::time::Duration::from_millis(500))
    })
    .await;
    let (_p, proxy) = forward_proxy("set_cookie = \"strip\"", "").await;
    let leader = get_through(proxy, &origin, "/slow", "");
    let follower = async {
        // Joins while the leader's fetch waits for the origin.
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        get_through(proxy, &origin, "/slow", "").await
    };
    let (leader, follower) = tokio::join!(leader, follower);
    check(&leader, 200, "page /slow", "MISS");
    assert_eq!(cookies(&leader), ["session=leader"]);
    check(&follower, 200, "page /slow", "HIT");
    assert!(cookies(&follower).is_empty(), "{:?}", follower.headers);
    assert_eq!(origin.count(), 1);
}
