//! Admin rights belong to the original client only. Portico fetching a URL
//! that names one of its own listeners (through the forward proxy, or a
//! CONNECT tunnel) would reach itself from its own address, 127.0.0.1,
//! which `access.admin_allow` trusts: a client that is not admin could
//! read the monitoring pages, stop the cache with `/nsc?stop`, or PURGE.
//! Every such request is refused as a forwarding loop (508), whatever the
//! spelling of the address, while the admin client still gets the pages.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Allowed to use the proxy, not an admin.
const STRANGER: &str = "127.0.0.3";
/// The only admin address.
const ADMIN: &str = "127.0.0.1";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP address")
}

/// The config of a Portico with forward listeners on `addrs`, every
/// 127.0.0.0/8 client allowed, 127.0.0.1 alone admin, CONNECT allowed to
/// the listeners' own ports (so only the loop check stands in the way),
/// and a cache.
fn config(addrs: &[SocketAddr], extra: &str) -> String {
    let mut c = String::new();
    for a in addrs {
        c.push_str(&format!("[[listener]]\naddress = \"{a}\"\nmode = \"forward\"\n\n"));
    }
    let ports: Vec<String> = addrs.iter().map(|a| a.port().to_string()).collect();
    c.push_str(&format!(
        "[access]\nallow = [\"127.0.0.0/8\"]\nadmin_allow = [\"127.0.0.1/32\"]\n\n\
         [proxy]\nconnect_ports = [443, {}]\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n\n{extra}",
        ports.join(", ")
    ));
    c
}

fn addr() -> SocketAddr {
    free_addr().parse().expect("free address")
}

/// Two forward listeners, P and Q, of one Portico.
async fn two_listeners() -> (Portico, SocketAddr, SocketAddr) {
    let (p, q) = (addr(), addr());
    (Portico::start(&config(&[p, q], "")).await, p, q)
}

/// `GET <url>` sent to `proxy` from `src`.
async fn get_from(src: &str, proxy: SocketAddr, url: &str, host: &str) -> ParsedResponse {
    let req = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request_from(ip(src), proxy, req.as_bytes()).await)
}

/// The admin's view of `/nsc` on listener `at` (origin form, direct).
async fn nsc_as_admin(at: SocketAddr) -> String {
    let r = get_from(ADMIN, at, "/nsc", &at.to_string()).await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    r.body_str()
}

/// Asserts `r` holds none of what a monitoring page or `/nsc` shows.
fn assert_no_admin_content(r: &ParsedResponse, what: &str) {
    let body = r.body_str();
    for marker in [
        "ConnectionQueue",
        "portico_",
        "Cache Status",
        "The cache was stopped",
        "purged",
    ] {
        assert!(
            !body.contains(marker),
            "{what}: admin content {marker:?} leaked:\n{body}"
        );
    }
}

/// Sends `CONNECT authority` to `proxy` from `src`; returns the status and
/// the rest of the answer, plus the open connection when it is a tunnel.
async fn connect_from(src: &str, proxy: SocketAddr, authority: &str) -> (u16, String, Option<tokio::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(ip(src), 0)).expect("bind client address");
    let mut s = socket.connect(proxy).await.expect("connect to the proxy");
    let req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send CONNECT");
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            _ => panic!("no answer to CONNECT {authority}: {:?}", String::from_utf8_lossy(&buf)),
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad answer to CONNECT: {text:?}"));
    if status == 200 {
        return (status, text, Some(s));
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    (status, text + &String::from_utf8_lossy(&rest), None)
}

/// The ways of writing 127.0.0.1 in a URL that the tests try.
const SPELLINGS: [&str; 8] = [
    "127.0.0.1",
    "[::ffff:127.0.0.1]",
    "127.1",
    "2130706433",
    "0x7f.0.0.1",
    "0.0.0.0",
    "localhost",
    // RFC 6761: every name under localhost. is loopback (answered by the
    // resolver itself, never sent to a DNS server).
    "admin.localhost",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitoring_pages_of_its_own_listeners_are_refused_through_the_proxy_in_every_spelling() {
    let (p, pa, qa) = two_listeners().await;
    for host in SPELLINGS {
        for target in [pa, qa] {
            for path in ["/.perf", "/metrics", "/nsc?stop"] {
                let authority = format!("{host}:{}", target.port());
                let url = format!("http://{authority}{path}");
                let r = get_from(STRANGER, pa, &url, &authority).await;
                assert_no_admin_content(&r, &url);
                // A URL naming the very listener it is sent to is a
                // monitoring request answered there: refused for this
                // client (403). Any other is fetched, and must be
                // recognised as Portico itself (508).
                let direct = target == pa && (host == "127.0.0.1" || host == "localhost");
                if direct {
                    assert_eq!(r.status, 403, "{url}: {}", r.body_str());
                } else {
                    assert_eq!(r.status, 508, "{url}: {}", r.body_str());
                    assert!(
                        r.body_str().contains("forwarding loop detected"),
                        "{url}: {}",
                        r.body_str()
                    );
                }
            }
        }
    }
    // None of the /nsc?stop requests stopped the cache.
    for at in [pa, qa] {
        let nsc = nsc_as_admin(at).await;
        assert!(nsc.contains("The cache is enabled."), "{nsc}");
    }
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brief_curl_scenario_with_curl_bound_to_127_0_0_3() {
    // `curl --interface 127.0.0.3 -x http://127.0.0.1:P http://127.0.0.1:Q/nsc?stop`
    let (p, pa, qa) = two_listeners().await;
    for url in [
        format!("http://[::ffff:127.0.0.1]:{}/.perf", pa.port()),
        format!("http://127.0.0.1:{}/.perf", qa.port()),
        format!("http://127.0.0.1:{}/metrics", qa.port()),
        format!("http://127.0.0.1:{}/nsc?stop", qa.port()),
    ] {
        let out = curl(&[
            "--interface",
            STRANGER,
            "-x",
            &format!("http://{pa}"),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ])
        .await;
        let code = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(code, "508", "{url}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let nsc = nsc_as_admin(qa).await;
    assert!(nsc.contains("The cache is enabled."), "{nsc}");
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_already_passed_through_portico_is_never_a_monitoring_request() {
    // Our own Via entry means Portico sent it: even from the admin address
    // it is a forwarding loop, not a monitoring request.
    let (p, pa, _) = two_listeners().await;
    for path in ["/.perf", "/metrics", "/nsc?stop"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {pa}\r\nVia: 1.1 portico\r\nConnection: close\r\n\r\n");
        let r = parse_response(&raw_request_from(ip(ADMIN), pa, req.as_bytes()).await);
        assert_eq!(r.status, 508, "{path}: {}", r.body_str());
        assert_no_admin_content(&r, path);
    }
    let nsc = nsc_as_admin(pa).await;
    assert!(nsc.contains("The cache is enabled."), "{nsc}");
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnels_to_its_own_listeners_are_refused_in_every_spelling() {
    let (p, pa, qa) = two_listeners().await;
    for host in SPELLINGS {
        for target in [pa, qa] {
            let authority = format!("{host}:{}", target.port());
            let (status, answer, tunnel) = connect_from(STRANGER, pa, &authority).await;
            assert!(tunnel.is_none(), "CONNECT {authority} opened a tunnel");
            assert_eq!(status, 508, "CONNECT {authority}: {answer}");
            assert!(answer.contains("forwarding loop detected"), "{answer}");
        }
    }
    drop(p);
}

/// An origin answering `"<path> #n"`, cacheable for 10 minutes.
async fn cacheable_origin() -> Origin {
    let n = Arc::new(AtomicUsize::new(0));
    Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Response::ok(format!("{} #{n}", req.uri.path())).header("Cache-Control", "max-age=600") }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_and_nsc_stop_through_a_tunnel_to_its_own_listener_change_nothing() {
    let o = cacheable_origin().await;
    let (p, pa, qa) = two_listeners().await;
    let url = format!("{}/x", o.url());
    let host = o.addr().to_string();
    assert_eq!(get_from(ADMIN, pa, &url, &host).await.header("x-cache"), Some("MISS"));
    assert_eq!(get_from(ADMIN, pa, &url, &host).await.header("x-cache"), Some("HIT"));

    // Asked directly, the stranger is refused, as always.
    let purge = format!("PURGE {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request_from(ip(STRANGER), pa, purge.as_bytes()).await);
    assert_eq!(r.status, 403, "{}", r.body_str());

    // Through a tunnel to the other listener, the PURGE and the /nsc?stop
    // would arrive from 127.0.0.1. The tunnel must not open.
    for inner in [
        purge.clone(),
        format!("GET /nsc?stop HTTP/1.1\r\nHost: {qa}\r\nConnection: close\r\n\r\n"),
    ] {
        let (status, answer, tunnel) = connect_from(STRANGER, pa, &qa.to_string()).await;
        if let Some(mut t) = tunnel {
            // Without the fix: show what the stranger achieved.
            t.write_all(inner.as_bytes()).await.expect("send through the tunnel");
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut got)).await;
            panic!(
                "tunnel to its own listener opened; {inner:?} got:\n{}",
                String::from_utf8_lossy(&got)
            );
        }
        assert_eq!(status, 508, "{answer}");
    }
    assert_eq!(get_from(ADMIN, pa, &url, &host).await.header("x-cache"), Some("HIT"));
    let nsc = nsc_as_admin(qa).await;
    assert!(nsc.contains("The cache is enabled."), "{nsc}");
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_client_still_gets_the_pages_directly() {
    let (p, pa, qa) = two_listeners().await;
    for at in [pa, qa] {
        for path in ["/.perf", "/metrics", "/nsc"] {
            let r = get_from(ADMIN, at, path, &at.to_string()).await;
            assert_eq!(r.status, 200, "{at}{path}: {}", r.body_str());
        }
        // Absolute form naming the listener it is sent to: answered there.
        let r = get_from(ADMIN, at, &format!("http://{at}/.perf"), &at.to_string()).await;
        assert_eq!(r.status, 200, "{}", r.body_str());
        assert!(r.body_str().contains("ConnectionQueue"), "{}", r.body_str());
    }
    // The stranger, directly, is refused as before.
    let r = get_from(STRANGER, pa, "/.perf", &pa.to_string()).await;
    assert_eq!(r.status, 403, "{}", r.body_str());
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_added_by_reload_is_recognised_as_its_own() {
    let (pa, ra) = (addr(), addr());
    let p = Portico::start(&config(&[pa], "")).await;
    // The new listener, and CONNECT allowed to its port.
    std::fs::write(
        p.config_path(),
        config(&[pa, ra], "").replace("{dir}", &p.dir().display().to_string()),
    )
    .expect("rewrite config");
    p.signal(libc::SIGHUP);
    let mut up = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(ra).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "added listener {ra} not listening:\n{}", p.stderr());
    let (status, answer, tunnel) = connect_from(STRANGER, pa, &ra.to_string()).await;
    assert!(tunnel.is_none(), "tunnel to the added listener opened");
    assert_eq!(status, 508, "{answer}");
    let url = format!("http://[::ffff:127.0.0.1]:{}/.perf", ra.port());
    let r = get_from(STRANGER, pa, &url, &ra.to_string()).await;
    assert_eq!(r.status, 508, "{}", r.body_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_of_a_multi_process_server_knows_the_listeners() {
    let (pa, qa) = (addr(), addr());
    let p = Portico::start(&config(&[pa, qa], "[server]\nprocesses = 2\nworkers = 1\n")).await;
    // Several connections, so both workers (SO_REUSEPORT) take some.
    for _ in 0..6 {
        let (status, answer, tunnel) = connect_from(STRANGER, pa, &qa.to_string()).await;
        assert!(tunnel.is_none(), "tunnel to its own listener opened");
        assert_eq!(status, 508, "{answer}");
    }
    drop(p);
}
