//! Reverse and transparent proxying through the real binary: routing rules,
//! round-robin, passive health checks and retry, Host handling, Location
//! rewriting, TLS upstreams, transparent mode and several listeners.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;

/// The `[[listener]]` and `[log]` part of a config: one listener on `addr`.
fn listener(addr: &str, mode: &str) -> String {
    format!("[[listener]]\naddress = \"{addr}\"\nmode = \"{mode}\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n")
}

/// An origin answering with its name and the path it saw.
async fn named_origin(name: &'static str) -> Origin {
    Origin::start(move |req| async move { Response::ok(format!("{name} {}", req.uri)) }).await
}

/// `GET path` with `Host: host` and `Connection: close`, parsed.
async fn get(addr: SocketAddr, host: &str, path: &str) -> ParsedResponse {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_route_by_host_and_path_first_match_wins() {
    let first = named_origin("first").await;
    let api = named_origin("api").await;
    let wild = named_origin("wild").await;
    let exact = named_origin("exact").await;
    let stat = named_origin("static").await;
    let star = named_origin("star").await;
    let mut config = listener(&free_addr(), "reverse");
    for (name, origin) in [
        ("first", &first),
        ("api", &api),
        ("wild", &wild),
        ("exact", &exact),
        ("static", &stat),
        ("star", &star),
    ] {
        config += &format!("[[upstream]]\nname = \"{name}\"\nservers = [\"{}\"]\n\n", origin.addr());
    }
    config += r#"
[[rule]]
host = "*"
path = "/first/"
upstream = "first"

[[rule]]
host = "www.example.com"
path = "/api/"
upstream = "api"

[[rule]]
host = "*.example.com"
upstream = "wild"

[[rule]]
host = "exact.test"
upstream = "exact"

[[rule]]
path = "/static/"
upstream = "static"

[[rule]]
host = "*"
path = "/any/"
upstream = "star"
"#;
    let portico = Portico::start(&config).await;
    let addr = portico.addr();

    let cases = [
        // Host exact, and exact beats the wildcard only because it comes first.
        ("www.example.com", "/api/v1?q=1", "api /api/v1?q=1"),
        ("www.example.com", "/other", "wild /other"),
        ("a.example.com", "/", "wild /"),
        ("deep.a.example.com", "/x", "wild /x"),
        ("exact.test", "/e", "exact /e"),
        // Port and upper case in Host still match.
        ("EXACT.Test:8080", "/e2", "exact /e2"),
        ("A.Example.COM:81", "/w", "wild /w"),
        // Path-only rule, any host.
        ("example.com", "/static/app.css", "static /static/app.css"),
        ("elsewhere.net", "/any/thing", "star /any/thing"),
        // The first rule wins although later rules name the host exactly.
        ("exact.test", "/first/1", "first /first/1"),
        ("www.example.com", "/first/2", "first /first/2"),
    ];
    for (host, path, want) in cases {
        let resp = get(addr, host, path).await;
        assert_eq!(resp.status, 200, "{host} {path}: {}", resp.body_str());
        assert_eq!(resp.body_str(), want, "{host} {path}");
    }

    // `*.example.com` does not match `example.com` itself; no rule: 404.
    for (host, path) in [("example.com", "/"), ("elsewhere.net", "/"), ("exact.test.evil", "/")] {
        let resp = get(addr, host, path).await;
        assert_eq!(resp.status, 404, "{host} {path}: {}", resp.body_str());
        assert!(resp.body_str().contains("no route"), "{}", resp.body_str());
    }
    assert_eq!(exact.count(), 2);
    assert_eq!(stat.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_over_two_servers() {
    let a = named_origin("a").await;
    let b = named_origin("b").await;
    let config = listener(&free_addr(), "reverse")
        + &format!(
            "[[upstream]]\nname = \"web\"\nservers = [\"{}\", \"{}\"]\n\n[[rule]]\nupstream = \"web\"\n",
            a.addr(),
            b.addr()
        );
    let portico = Portico::start(&config).await;
    let mut bodies = Vec::new();
    for i in 0..4 {
        let resp = get(portico.addr(), "site.test", &format!("/{i}")).await;
        assert_eq!(resp.status, 200);
        bodies.push(resp.body_str());
    }
    assert_eq!((a.count(), b.count()), (2, 2), "{bodies:?}");
    // Strictly alternating.
    let names: Vec<&str> = bodies.iter().map(|b| &b[..1]).collect();
    assert_ne!(names[0], names[1], "{bodies:?}");
    assert_eq!(names[0], names[2], "{bodies:?}");
    assert_eq!(names[1], names[3], "{bodies:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_server_is_marked_down_and_get_is_retried() {
    let live = named_origin("live").await;
    let dead = dead_addr();
    let config = listener(&free_addr(), "reverse")
        + &format!(
            "[[upstream]]\nname = \"web\"\nservers = [\"{dead}\", \"{}\"]\ndown_time = \"1m\"\n\n[[rule]]\nupstream = \"web\"\n",
            live.addr()
        );
    let portico = Portico::start(&config).await;
    for i in 0..4 {
        let resp = get(portico.addr(), "site.test", &format!("/{i}")).await;
        assert_eq!(resp.status, 200, "request {i}: {}", resp.body_str());
        assert_eq!(resp.body_str(), format!("live /{i}"));
    }
    assert_eq!(live.count(), 4);
    let log = portico.stderr();
    assert!(log.contains("marking server down"), "{log}");
    assert!(log.contains(&dead), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_are_up_share_the_load_evenly() {
    // A down server must not hand its turns to the server after it.
    let a = named_origin("a").await;
    let b = named_origin("b").await;
    let dead = dead_addr();
    let config = listener(&free_addr(), "reverse")
        + &format!(
            "[[upstream]]\nname = \"web\"\nservers = [\"{dead}\", \"{}\", \"{}\"]\ndown_time = \"1m\"\n\n[[rule]]\nupstream = \"web\"\n",
            a.addr(),
            b.addr()
        );
    let portico = Portico::start(&config).await;
    let mut bodies = Vec::new();
    for i in 0..6 {
        let resp = get(portico.addr(), "site.test", &format!("/{i}")).await;
        assert_eq!(resp.status, 200, "request {i}: {}", resp.body_str());
        bodies.push(resp.body_str());
    }
    assert_eq!((a.count(), b.count()), (3, 3), "{bodies:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_with_body_is_not_retried_on_another_server() {
    let live = named_origin("live").await;
    let dead = dead_addr();
    // Round-robin starts at the first server, so the first request goes to `dead`.
    let config = listener(&free_addr(), "reverse")
        + &format!(
            "[[upstream]]\nname = \"web\"\nservers = [\"{dead}\", \"{}\"]\n\n[[rule]]\nupstream = \"web\"\n",
            live.addr()
        );
    let portico = Portico::start(&config).await;
    let req = b"POST /submit HTTP/1.1\r\nHost: site.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    let resp = parse_response(&raw_request(portico.addr(), req).await);
    assert_eq!(resp.status, 502, "{}", resp.body_str());
    assert!(resp.body_str().contains("cannot connect to"), "{}", resp.body_str());
    assert_eq!(live.count(), 0, "the POST was silently sent to another server");

    // The dead server is now down: the next POST goes to the live one.
    let resp = parse_response(&raw_request(portico.addr(), req).await);
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    assert_eq!(&live.requests()[0].body[..], b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_dead_server_gives_502() {
    let dead = dead_addr();
    let config = listener(&free_addr(), "reverse")
        + &format!("[[upstream]]\nname = \"web\"\nservers = [\"{dead}\"]\n\n[[rule]]\nupstream = \"web\"\n");
    let portico = Portico::start(&config).await;
    let resp = get(portico.addr(), "site.test", "/").await;
    assert_eq!(resp.status, 502, "{}", resp.body_str());
    assert!(resp.body_str().contains(&dead), "{}", resp.body_str());
}

/// A reverse listener's cache keys the `Host` with its port as sent: an
/// origin that gets `Host: www.test:80` (and puts it in its answer) does
/// not answer for `www.test`, which on a TLS listener is port 443. Before,
/// `:80` was dropped from the key and the reflected answer served to
/// every request for `www.test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_key_keeps_the_hosts_port_as_sent() {
    let origin = Origin::start(|req| async move {
        Response::ok(format!("host {}", req.header("host").unwrap_or("-"))).header("Cache-Control", "max-age=60")
    })
    .await;
    let o = origin.addr();
    let config = listener(&free_addr(), "reverse")
        + &format!(
            "[cache]\ndir = \"{{dir}}/cache\"\n\n[[upstream]]\nname = \"web\"\nservers = [\"{o}\"]\n\n[[rule]]\nupstream = \"web\"\n"
        );
    let portico = Portico::start(&config).await;
    let r = get(portico.addr(), "www.test:80", "/page").await;
    assert_eq!(r.body_str(), "host www.test:80");
    let r = get(portico.addr(), "www.test", "/page").await;
    assert_eq!(r.body_str(), "host www.test", "{:?}", r.headers);
    let r = get(portico.addr(), "WWW.test", "/page").await;
    assert_eq!(r.body_str(), "host www.test", "{:?}", r.headers);
    assert_eq!(r.header("x-cache"), Some("HIT"));
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_header_preserved_or_rewritten() {
    let origin = Origin::start(|req| async move { Response::ok(req.header("host").unwrap_or("-").to_owned()) }).await;
    let o = origin.addr();
    let config = listener(&free_addr(), "reverse")
        + &format!(
            r#"[[upstream]]
name = "keep"
servers = ["{o}"]

[[upstream]]
name = "rw"
servers = ["{o}"]
host_header = "rewrite"

[[rule]]
host = "keep.test"
upstream = "keep"

[[rule]]
host = "rw.test"
upstream = "rw"
"#
        );
    let portico = Portico::start(&config).await;
    let resp = get(portico.addr(), "keep.test:8000", "/").await;
    assert_eq!(resp.body_str(), "keep.test:8000");
    let resp = get(portico.addr(), "rw.test", "/").await;
    assert_eq!(resp.body_str(), o.to_string());
    let hosts: Vec<String> = origin
        .requests()
        .iter()
        .map(|r| r.header("host").unwrap_or("-").to_owned())
        .collect();
    assert_eq!(hosts, ["keep.test:8000".to_string(), o.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_target_sets_the_host_sent_upstream() {
    let origin = Origin::start(|req| async move { Response::ok(req.header("host").unwrap_or("-").to_owned()) }).await;
    let config = listener(&free_addr(), "reverse")
        + &format!(
            "[[upstream]]\nname = \"keep\"\nservers = [\"{}\"]\n\n[[rule]]\nhost = \"keep.test\"\nupstream = \"keep\"\n",
            origin.addr()
        );
    let portico = Portico::start(&config).await;
    // Routed by the URI's host (the Host header names an unknown host) ...
    let resp = get(portico.addr(), "other.test", "http://keep.test/abs").await;
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    // ... so the origin must see that host too.
    assert_eq!(resp.body_str(), "keep.test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn location_pointing_at_the_server_is_rewritten() {
    // With host_header = "rewrite" the origin sees its own `127.0.0.1:port`
    // and builds absolute URLs from it, as a real application would.
    let origin = Origin::start(|req| async move {
        let me = req.header("host").unwrap_or("-").to_owned();
        match req.uri.path() {
            "/redir" => Response::new(302)
                .header("location", &format!("http://{me}/x?y=1"))
                .header("content-location", &format!("http://{me}/y")),
            "/root" => Response::new(301).header("location", &format!("http://{me}")),
            _ => Response::new(302).header("location", "http://other.test:1234/z"),
        }
    })
    .await;
    let config = listener(&free_addr(), "reverse")
        + &format!(
            "[[upstream]]\nname = \"web\"\nservers = [\"{}\"]\nhost_header = \"rewrite\"\n\n[[rule]]\nupstream = \"web\"\n",
            origin.addr()
        );
    let portico = Portico::start(&config).await;

    let resp = get(portico.addr(), "public.test", "/redir").await;
    assert_eq!(resp.status, 302);
    assert_eq!(resp.header("location"), Some("http://public.test/x?y=1"));
    assert_eq!(resp.header("content-location"), Some("http://public.test/y"));

    let resp = get(portico.addr(), "public.test:8443", "/root").await;
    assert_eq!(resp.header("location"), Some("http://public.test:8443"));

    let resp = get(portico.addr(), "public.test", "/elsewhere").await;
    assert_eq!(resp.header("location"), Some("http://other.test:1234/z"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstream_with_ca_file() {
    let origin = Origin::start_tls(|req| async move {
        Response::ok(format!("tls {} {}", req.uri, req.header("host").unwrap_or("-")))
    })
    .await;
    let ca = origin.ca_pem_path().to_str().expect("utf-8 path").to_owned();
    let upstream = format!(
        "[[upstream]]\nname = \"web\"\nservers = [\"https://127.0.0.1:{}\"]\n\n[[rule]]\nupstream = \"web\"\n",
        origin.addr().port()
    );
    let config = listener(&free_addr(), "reverse") + &format!("[origin]\nca_file = \"{ca}\"\n\n") + &upstream;
    let portico = Portico::start(&config).await;
    let resp = get(portico.addr(), "secure.test", "/s?1").await;
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    assert_eq!(resp.body_str(), "tls /s?1 secure.test");
    drop(portico);

    // Without the CA the origin's self-signed certificate is not trusted.
    let config = listener(&free_addr(), "reverse") + "[origin]\nsystem_roots = true\n\n" + &upstream;
    let portico = Portico::start(&config).await;
    let resp = get(portico.addr(), "secure.test", "/s").await;
    assert_eq!(resp.status, 502, "{}", resp.body_str());
    assert!(resp.body_str().contains("TLS"), "{}", resp.body_str());
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transparent_mode_routes_by_host() {
    let origin = Origin::start(|req| async move {
        Response::ok(format!(
            "{} {} {}",
            req.method,
            req.uri,
            req.header("host").unwrap_or("-")
        ))
    })
    .await;
    let portico = Portico::start(&listener(&free_addr(), "transparent")).await;
    let host = origin.addr().to_string();
    let resp = get(portico.addr(), &host, "/t/path?q=2").await;
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    assert_eq!(resp.body_str(), format!("GET /t/path?q=2 {host}"));
    assert_eq!(origin.requests()[0].uri, "/t/path?q=2");

    // HTTP/1.0 without Host: nothing to route by.
    let raw = raw_request(portico.addr(), b"GET /nohost HTTP/1.0\r\n\r\n").await;
    let resp = parse_response(&raw);
    assert_eq!(resp.status, 400, "{}", resp.body_str());
    assert!(resp.body_str().contains("Host"), "{}", resp.body_str());
    assert_eq!(origin.count(), 1);

    // A Host naming Portico itself would loop: the second pass sees our Via.
    let resp = get(portico.addr(), &portico.addr().to_string(), "/loop").await;
    assert_eq!(resp.status, 508, "{}", resp.body_str());
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_and_reverse_listeners_in_one_config() {
    let origin = named_origin("o").await;
    let (fwd, rev) = (free_addr(), free_addr());
    let config = format!(
        r#"[server]
workers = 1

[[listener]]
address = "{fwd}"
mode = "forward"

[[listener]]
address = "{rev}"
mode = "reverse"

[log]
access = "{{dir}}/access.log"

[[upstream]]
name = "web"
servers = ["{o}"]

[[rule]]
upstream = "web"
"#,
        o = origin.addr()
    );
    let portico = Portico::start(&config).await;
    let fwd: SocketAddr = fwd.parse().expect("addr");
    let rev: SocketAddr = rev.parse().expect("addr");

    let resp = get(
        fwd,
        &origin.addr().to_string(),
        &format!("http://{}/via-forward", origin.addr()),
    )
    .await;
    assert_eq!((resp.status, resp.body_str()), (200, "o /via-forward".to_string()));
    let resp = get(rev, "site.test", "/via-reverse").await;
    assert_eq!((resp.status, resp.body_str()), (200, "o /via-reverse".to_string()));
    // Each listener keeps its own mode: origin-form is not a forward-proxy
    // request, and CONNECT is for forward listeners only.
    let resp = get(fwd, "site.test", "/not-a-proxy-request").await;
    assert_eq!(resp.status, 400, "{}", resp.body_str());
    let connect = format!(
        "CONNECT {o} HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n",
        o = origin.addr()
    );
    let resp = parse_response(&raw_request(rev, connect.as_bytes()).await);
    assert_eq!(resp.status, 405, "{}", resp.body_str());
    assert_eq!(origin.count(), 2);

    // All four requests were logged (in whatever order their connections finished).
    let log_path = portico.dir().join("access.log");
    let mut log = String::new();
    for _ in 0..100 {
        log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.lines().count() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(log.contains("/via-forward HTTP/1.1\" 200"), "{log}");
    assert!(log.contains("\"GET /via-reverse HTTP/1.1\" 200"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_listener_is_v6_only_and_shares_the_port_with_ipv4() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("SKIPPED ipv6_listener_is_v6_only_and_shares_the_port_with_ipv4: no IPv6 loopback");
        return;
    }
    let origin = named_origin("o").await;
    let port = free_port();
    let config = format!(
        r#"[[listener]]
address = "127.0.0.1:{port}"
mode = "reverse"

[[listener]]
address = "[::]:{port}"
mode = "reverse"

[log]
access = "{{dir}}/access.log"

[[upstream]]
name = "web"
servers = ["{o}"]

[[rule]]
upstream = "web"
"#,
        o = origin.addr()
    );
    let portico = Portico::start(&config).await;
    let v4: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let v6: SocketAddr = format!("[::1]:{port}").parse().expect("addr");
    assert_eq!(get(v4, "site.test", "/four").await.body_str(), "o /four");
    assert_eq!(get(v6, "site.test", "/six").await.body_str(), "o /six");
    assert!(
        portico.stderr().contains(&format!("listening on [::]:{port}")),
        "{}",
        portico.stderr()
    );
}
