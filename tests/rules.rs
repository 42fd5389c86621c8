//! The routing rules engine through the real binary: each matcher, each
//! action, `continue`, first match wins, bad-regex errors with their line,
//! a 10,000-rule config, and `portico rules test`.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// An origin answering `NAME URI`, recording every request.
async fn named_origin(name: &'static str) -> Origin {
    Origin::start(move |req| async move {
        Response::ok(format!("{name} {}", req.uri))
            .header("x-origin", name)
            .header("server", "test-origin")
    })
    .await
}

/// `[[upstream]]` entries for `(name, origin)` pairs.
fn upstreams(list: &[(&str, &Origin)]) -> String {
    list.iter()
        .map(|(n, o)| format!("[[upstream]]\nname = \"{n}\"\nservers = [\"{}\"]\n\n", o.addr()))
        .collect()
}

/// A config with one listener in `mode`, the upstreams and the rules.
fn config(addr: &str, mode: &str, ups: &str, rules: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"{mode}\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n[cache]\nenabled = false\n\n{ups}{rules}"
    )
}

/// Sends `request` (Connection: close is added) and parses the response.
async fn send(addr: SocketAddr, request: &str) -> ParsedResponse {
    let req = request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

async fn get(addr: SocketAddr, host: &str, path: &str) -> ParsedResponse {
    send(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")).await
}

fn body(r: &ParsedResponse) -> String {
    format!("{} {}", r.status, r.body_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_matcher_routes_and_the_first_match_wins() {
    let names = [
        "exact", "wild", "path", "regex", "method", "port", "hdr", "hdrval", "hdrre", "client", "other", "last",
    ];
    let mut origins = Vec::new();
    for n in names {
        origins.push(named_origin(n).await);
    }
    let list: Vec<(&str, &Origin)> = names.iter().copied().zip(origins.iter()).collect();
    let addr = free_addr();
    let rules = r#"
[[rule]]
host = "exact.test"
upstream = "exact"

[[rule]]
host = "*.wild.test"
upstream = "wild"

[[rule]]
path = "/p/"
upstream = "path"

[[rule]]
regex = '^/img/[a-z]+\.(png|jpg)$'
upstream = "regex"

[[rule]]
method = ["PUT", "DELETE"]
upstream = "method"

[[rule]]
port = [8081, 8082]
upstream = "port"

[[rule]]
header = { name = "X-Beta" }
upstream = "hdr"

[[rule]]
header = { name = "X-Tier", value = "gold" }
upstream = "hdrval"

[[rule]]
header = { name = "User-Agent", regex = "(?i)curl/" }
upstream = "hdrre"

[[rule]]
client = ["127.0.0.2", "10.0.0.0/8"]
upstream = "client"

[[rule]]
host = "exact.test"
upstream = "other"

[[rule]]
upstream = "last"
"#;
    let p = Portico::start(&config(&addr, "reverse", &upstreams(&list), rules)).await;
    let a = p.addr();
    let cases: Vec<(String, &str)> = vec![
        // exact host (any case, any port); it also beats the later rule 10 for the same host.
        ("GET /x HTTP/1.1\r\nHost: EXACT.test:8081\r\n\r\n".into(), "exact /x"),
        ("GET /x HTTP/1.1\r\nHost: a.b.wild.test\r\n\r\n".into(), "wild /x"),
        // `*.wild.test` does not match `wild.test` itself.
        ("GET /x HTTP/1.1\r\nHost: wild.test\r\n\r\n".into(), "last /x"),
        ("GET /p/q?r=1 HTTP/1.1\r\nHost: h.test\r\n\r\n".into(), "path /p/q?r=1"),
        ("GET /px HTTP/1.1\r\nHost: h.test\r\n\r\n".into(), "last /px"),
        (
            "GET /img/logo.png HTTP/1.1\r\nHost: h.test\r\n\r\n".into(),
            "regex /img/logo.png",
        ),
        (
            "GET /img/logo.png?x HTTP/1.1\r\nHost: h.test\r\n\r\n".into(),
            "last /img/logo.png?x",
        ),
        (
            "PUT /m HTTP/1.1\r\nHost: h.test\r\nContent-Length: 0\r\n\r\n".into(),
            "method /m",
        ),
        ("GET /m HTTP/1.1\r\nHost: h.test:8082\r\n\r\n".into(), "port /m"),
        ("GET /m HTTP/1.1\r\nHost: h.test:8083\r\n\r\n".into(), "last /m"),
        ("GET /h HTTP/1.1\r\nHost: h.test\r\nX-Beta: \r\n\r\n".into(), "hdr /h"),
        (
            "GET /h HTTP/1.1\r\nHost: h.test\r\nX-Tier: gold\r\n\r\n".into(),
            "hdrval /h",
        ),
        (
            "GET /h HTTP/1.1\r\nHost: h.test\r\nX-Tier: silver\r\n\r\n".into(),
            "last /h",
        ),
        (
            "GET /h HTTP/1.1\r\nHost: h.test\r\nUser-Agent: Curl/8.0\r\n\r\n".into(),
            "hdrre /h",
        ),
        // Absolute-form on a reverse listener: host and path from the URI.
        (
            "GET http://exact.test/abs HTTP/1.1\r\nHost: ignored.test\r\n\r\n".into(),
            "exact /abs",
        ),
    ];
    for (req, want) in &cases {
        let r = send(a, req).await;
        assert_eq!(body(&r), format!("200 {want}"), "{req:?}");
    }
    // The client matcher: the same request from 127.0.0.2 and from 127.0.0.1.
    let req = "GET /c HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n";
    let r = parse_response(&request_from("127.0.0.2", a, req).await);
    assert_eq!(body(&r), "200 client /c");
    let r = parse_response(&request_from("127.0.0.1", a, req).await);
    assert_eq!(body(&r), "200 last /c");
    assert_eq!(origins[10].count(), 0, "rule 10 is shadowed by rule 0");
}

/// Sends `req` from local address `from` (any 127.x address is loopback).
async fn request_from(from: &str, to: SocketAddr, req: &str) -> Vec<u8> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("addr"))
        .expect("bind the client address");
    let mut stream = socket.connect(to).await.expect("connect");
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), stream.read_to_end(&mut out))
        .await
        .expect("response in time")
        .expect("read");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_rewrite_headers_deny_and_redirect() {
    let o = named_origin("o").await;
    let addr = free_addr();
    let rules = r#"
[[rule]]
regex = '^/old/(?P<rest>.*)$'
redirect = { to = "https://new.test/${rest}", status = 301 }

[[rule]]
path = "/tmp/"
redirect = { to = "/elsewhere" }

[[rule]]
path = "/private/"
deny = 403

[[rule]]
path = "/gone/"
deny = 410

[[rule]]
regex = '^/v1/(\w+)/(\d+)'
upstream = "o"
rewrite = { to = "/api/v2/$1?id=$2" }

[[rule]]
path = "/static/"
upstream = "o"
rewrite = { regex = "^/static/", to = "/assets/" }

[[rule]]
upstream = "o"
request_headers = { set = { X-Added = "yes", X-Replaced = "new" }, remove = ["Cookie"] }
response_headers = { set = { X-Frame-Options = "DENY" }, remove = ["Server"] }
"#;
    let p = Portico::start(&config(&addr, "reverse", &upstreams(&[("o", &o)]), rules)).await;
    let a = p.addr();

    let r = get(a, "h.test", "/old/a/b?c=1").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("https://new.test/a/b?c=1"));
    let r = get(a, "h.test", "/tmp/x").await;
    assert_eq!((r.status, r.header("location")), (302, Some("/elsewhere")));
    let r = get(a, "h.test", "/private/x").await;
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert!(r.body_str().contains("denied by a routing rule"), "{}", r.body_str());
    assert_eq!(get(a, "h.test", "/gone/x").await.status, 410);
    assert_eq!(o.count(), 0, "deny and redirect never reach the origin");

    assert_eq!(
        body(&get(a, "h.test", "/v1/users/42/x").await),
        "200 o /api/v2/users?id=42/x"
    );
    assert_eq!(
        body(&get(a, "h.test", "/static/app.css?v=3").await),
        "200 o /assets/app.css?v=3"
    );

    let r = send(
        a,
        "GET /h HTTP/1.1\r\nHost: h.test\r\nCookie: s=1\r\nX-Replaced: old\r\nX-Kept: k\r\n\r\n",
    )
    .await;
    assert_eq!(body(&r), "200 o /h");
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("server"), None, "{:?}", r.headers);
    assert_eq!(r.header("x-origin"), Some("o"));
    let seen = o.requests().pop().expect("a request");
    assert_eq!(seen.header("x-added"), Some("yes"));
    assert_eq!(seen.header("x-replaced"), Some("new"));
    assert_eq!(seen.header("x-kept"), Some("k"));
    assert_eq!(seen.header("cookie"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_adds_actions_and_later_rules_override() {
    let a_origin = named_origin("a").await;
    let b_origin = named_origin("b").await;
    let addr = free_addr();
    let rules = r#"
[[rule]]
continue = true
upstream = "a"
response_headers = { set = { X-All = "1", X-Which = "general" } }
request_headers = { set = { X-Step = "one" } }

[[rule]]
path = "/b/"
continue = true
upstream = "b"
response_headers = { set = { X-Which = "b" } }

[[rule]]
path = "/b/stop/"

[[rule]]
path = "/b/"
request_headers = { remove = ["X-Step"] }
"#;
    let p = Portico::start(&config(
        &addr,
        "reverse",
        &upstreams(&[("a", &a_origin), ("b", &b_origin)]),
        rules,
    ))
    .await;
    let a = p.addr();
    // Only the catch-all matches: its upstream and headers.
    let r = get(a, "h.test", "/x").await;
    assert_eq!(body(&r), "200 a /x");
    assert_eq!((r.header("x-all"), r.header("x-which")), (Some("1"), Some("general")));
    assert_eq!(a_origin.requests()[0].header("x-step"), Some("one"));
    // Rules 0, 1, 3: upstream and X-Which overridden, X-Step set then removed.
    let r = get(a, "h.test", "/b/x").await;
    assert_eq!(body(&r), "200 b /b/x");
    assert_eq!((r.header("x-all"), r.header("x-which")), (Some("1"), Some("b")));
    assert_eq!(b_origin.requests()[0].header("x-step"), None);
    // Rule 2 has no actions but stops the search: rule 3 never runs.
    let r = get(a, "h.test", "/b/stop/x").await;
    assert_eq!(body(&r), "200 b /b/stop/x");
    assert_eq!(b_origin.requests()[1].header("x-step"), Some("one"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_listener_rules_deny_route_and_match_scheme() {
    let o = named_origin("direct").await;
    let g = named_origin("group").await;
    let addr = free_addr();
    let rules = r#"
# A reverse-only catch-all: never applies on this forward listener.
[[rule]]
mode = "reverse"
upstream = "g"

[[rule]]
host = "*.blocked.test"
deny = 403

[[rule]]
scheme = "https"
upstream = "g"

[[rule]]
host = "routed.test"
upstream = "g"

[[rule]]
path = "/old/"
rewrite = { regex = "^/old/", to = "/new/" }
"#;
    let p = Portico::start(&config(&addr, "forward", &upstreams(&[("g", &g)]), rules)).await;
    let a = p.addr();
    let r = send(
        a,
        "GET http://ads.blocked.test/x HTTP/1.1\r\nHost: ads.blocked.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 403);
    let r = send(a, "GET http://routed.test/y HTTP/1.1\r\nHost: routed.test\r\n\r\n").await;
    assert_eq!(body(&r), "200 group /y");
    // An https URL (no TLS needed: the rule sends it to the plain-HTTP group).
    let r = send(a, "GET https://secure.test/z HTTP/1.1\r\nHost: secure.test\r\n\r\n").await;
    assert_eq!(body(&r), "200 group /z");
    // No rule (the first is for reverse listeners): straight to the origin in the URL.
    let o_addr = o.addr();
    let r = send(a, &format!("GET http://{o_addr}/d HTTP/1.1\r\nHost: {o_addr}\r\n\r\n")).await;
    assert_eq!(body(&r), "200 direct /d");
    // A rewrite without an upstream: still the origin in the URL, new path.
    let r = send(
        a,
        &format!("GET http://{o_addr}/old/e?f=1 HTTP/1.1\r\nHost: {o_addr}\r\n\r\n"),
    )
    .await;
    assert_eq!(body(&r), "200 direct /new/e?f=1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_naming_an_ip_address_matches_every_spelling_of_it() {
    let o = named_origin("direct").await;
    let g = named_origin("group").await;
    let addr = free_addr();
    let port = o.addr().port();
    // The entries spell the address another way than the requests do.
    let rules = format!(
        r#"
[[rule]]
host = "127.1"
port = {port}
path = "/admin/"
deny = 403

[[rule]]
host = "[::ffff:127.0.0.1]"
port = {port}
upstream = "g"
"#
    );
    let p = Portico::start(&config(&addr, "forward", &upstreams(&[("g", &g)]), &rules)).await;
    for host in ["127.0.0.1", "2130706433", "0x7f.1", "0177.0.0.1", "[::ffff:7f00:1]"] {
        let r = send(
            p.addr(),
            &format!("GET http://{host}:{port}/admin/x HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"),
        )
        .await;
        assert_eq!(r.status, 403, "{host}: {}", r.body_str());
        let r = send(
            p.addr(),
            &format!("GET http://{host}:{port}/y HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"),
        )
        .await;
        assert_eq!(body(&r), "200 group /y", "{host}");
    }
    assert_eq!(o.count(), 0, "every spelling was routed by the rules");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_cache_override_and_reverse_default_is_404() {
    let o =
        Origin::start(|req| async move { Response::ok(format!("v {}", req.uri)).header("cache-control", "max-age=0") })
            .await;
    let addr = free_addr();
    let text = format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"reverse\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n[cache]\ndir = \"{{dir}}/cache\"\n\n{}{}",
        upstreams(&[("o", &o)]),
        r#"
[[rule]]
regex = '\.css$'
upstream = "o"
cache = { min_ttl = "1m" }

[[rule]]
host = "site.test"
upstream = "o"

[[rule]]
host = "nowhere.test"
bucket = "none"
"#
    );
    let p = Portico::start(&text).await;
    let a = p.addr();
    let r = get(a, "any.test", "/a.css").await;
    assert_eq!((r.status, r.header("x-cache")), (200, Some("MISS")));
    let r = get(a, "any.test", "/a.css").await;
    assert_eq!(
        (r.status, r.header("x-cache")),
        (200, Some("HIT")),
        "min_ttl from the rule"
    );
    get(a, "site.test", "/b").await;
    let r = get(a, "site.test", "/b").await;
    assert_eq!(
        r.header("x-cache"),
        Some("MISS"),
        "no override: max-age=0 is stale at once"
    );
    // A rule matched but chose no upstream, and no rule at all: both 404.
    for host in ["nowhere.test", "else.test"] {
        let r = get(a, host, "/").await;
        assert_eq!(r.status, 404, "{host}");
        assert!(r.body_str().contains("no route"), "{}", r.body_str());
    }
}

fn check_file(text: &str) -> (Output, tempfile::TempDir, std::time::Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("portico.toml");
    std::fs::write(&path, text).expect("write config");
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .expect("run portico check");
    (out, dir, started.elapsed())
}

#[test]
fn bad_regex_fails_check_and_run_with_its_line() {
    let text = "[[upstream]]\nname = \"o\"\nservers = [\"127.0.0.1:9\"]\n\n[[rule]]\npath = \"/a/\"\nupstream = \"o\"\n\n[[rule]]\nupstream = \"o\"\nregex = \"^/b/(unclosed\"\n";
    let (out, dir, _) = check_file(text);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("portico.toml:11: key `rule[1].regex`: invalid regular expression"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["run", "-c"])
        .arg(dir.path().join("portico.toml"))
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run portico run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("portico.toml:11: key `rule[1].regex`"), "{err}");

    // The rewrite's and a header matcher's regexes are checked the same way.
    let (out, _, _) = check_file(
        "[[upstream]]\nname = \"o\"\nservers = [\"127.0.0.1:9\"]\n\n[[rule]]\nupstream = \"o\"\nrewrite = { regex = \"*\", to = \"/\" }\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("portico.toml:7: key `rule[0].rewrite`"), "{err}");
    let (out, _, _) =
        check_file("[[rule]]\ndeny = 403\nheader = [\n  { name = \"A\" },\n  { name = \"B\", regex = \"(\" },\n]\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("portico.toml:5: key `rule[0].header[1].regex`"), "{err}");
}

/// The worst case of the Sun Java System Web Proxy Server 4's assign-name study: 10,000 rules. The config must pass `portico
/// check` (which compiles every rule); the time is printed, not asserted.
#[test]
fn ten_thousand_rule_config_passes_check() {
    let mut text = String::from("[[upstream]]\nname = \"o\"\nservers = [\"127.0.0.1:9\"]\n\n");
    for i in 0..10_000 {
        match i % 4 {
            0 => text += &format!("[[rule]]\npath = \"/r{i:05}/\"\nupstream = \"o\"\n\n"),
            1 => text += &format!("[[rule]]\nregex = \"^/r{i:05}/\"\nupstream = \"o\"\n\n"),
            2 => text += &format!("[[rule]]\nhost = \"h{i}.example.com\"\nupstream = \"o\"\n\n"),
            _ => text += &format!("[[rule]]\nregex = '\\.x{i}\\.(png|jpg)$'\nupstream = \"o\"\n\n"),
        }
    }
    let (out, dir, took) = check_file(&text);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("portico check of 10,000 rules took {took:?} (debug build)");
    let out = Command::new(BIN)
        .args(["rules", "test", "-c"])
        .arg(dir.path().join("portico.toml"))
        .args(["http://a.test/img/b.x9999.png", "--mode", "reverse"])
        .output()
        .expect("run portico rules test");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("matched rule 9999 ("), "{s}");
    assert!(s.contains("portico.toml:40001): regex"), "{s}");
}

#[test]
fn rules_test_prints_the_match_and_the_actions() {
    let text = r#"[[listener]]
address = "127.0.0.1:1"
mode = "reverse"

[[upstream]]
name = "api"
servers = ["127.0.0.1:9"]

[[rule]]
continue = true
bucket = "all"
response_headers = { set = { X-Frame-Options = "DENY" } }

[[rule]]
host = "www.example.com"
regex = "^/api/v1/(.*)"
method = ["GET", "HEAD"]
upstream = "api"
rewrite = { to = "/v2/$1" }
request_headers = { set = { X-Api = "1" }, remove = ["Cookie"] }
cache = { min_ttl = "10m" }
busy_body = "busy"
bandwidth = "1MiB"
bandwidth_after = "4MiB"
request_rate = 5
total_request_rate = 100
total_request_burst = 150

[[rule]]
client = "10.0.0.0/8"
deny = 403

[[rule]]
header = { name = "X-Old" }
redirect = { to = "https://new.test/", status = 308 }
"#;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("p.toml");
    std::fs::write(&path, text).expect("write");
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["rules", "test", "-c"])
            .arg(&path)
            .args(args)
            .output()
            .expect("run portico rules test");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let p = path.display().to_string();
    let s = run(&["http://www.example.com/api/v1/users?id=3"]);
    for want in [
        "request: GET http://www.example.com/api/v1/users?id=3 from 127.0.0.1 on a reverse listener (4 rules)"
            .to_string(),
        format!("matched rule 0 ({p}:9): (no matchers: every request) [continue]"),
        format!(
            "matched rule 1 ({p}:14): host = \"www.example.com\", regex = \"^/api/v1/(.*)\", method = [\"GET\", \"HEAD\"]"
        ),
        "  indexed by: exact-host table".into(),
        "  upstream: api".into(),
        "  url: /api/v1/users?id=3 -> /v2/users?id=3".into(),
        "  request headers: remove cookie; set x-api: 1".into(),
        "  response headers: set x-frame-options: DENY".into(),
        "  cache (rule 1): min_ttl = \"10m\"".into(),
        "  bucket: all".into(),
        "  busy body: 4 bytes".into(),
        "  bandwidth: 1048576 bytes a second per response, after its first 4194304 bytes".into(),
        "  request rate: 5 a second per client, burst 5".into(),
        "  request rate: 100 a second for all clients, burst 150".into(),
    ] {
        assert!(s.contains(&want), "want {want:?} in:\n{s}");
    }
    let s = run(&[
        "http://www.example.com/api/v1/x",
        "--method",
        "POST",
        "--client",
        "10.2.3.4",
    ]);
    assert!(
        s.contains(&format!("matched rule 2 ({p}:29): client = [\"10.0.0.0/8\"]")),
        "{s}"
    );
    assert!(s.contains("  deny: 403"), "{s}");
    let s = run(&["http://a.test/", "--header", "X-Old: 1"]);
    assert!(s.contains("  redirect: 308 https://new.test/"), "{s}");
    let s = run(&["http://a.test/", "--mode", "forward"]);
    assert!(s.contains("  upstream: none: straight to the origin"), "{s}");
    // Nothing matches when the only catch-all is skipped... use a config without one.
    let bare = dir.path().join("bare.toml");
    std::fs::write(
        &bare,
        "[[listener]]\naddress = \"127.0.0.1:1\"\nmode = \"reverse\"\n\n[[upstream]]\nname = \"o\"\nservers = [\"127.0.0.1:9\"]\n\n[[rule]]\nhost = \"x.test\"\nupstream = \"o\"\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["rules", "test", "-c"])
        .arg(&bare)
        .arg("http://y.test/")
        .output()
        .expect("run");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("no rule matched: default route: 404"), "{s}");
    let out = Command::new(BIN)
        .args(["rules", "test", "-c"])
        .arg(&bare)
        .args(["http://y.test/q", "--mode", "forward"])
        .output()
        .expect("run");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("no rule matched: default route: straight to the origin http://y.test/q"),
        "{s}"
    );
}
