//! Signals through the real binary: SIGHUP reloads the config (routes,
//! listeners; an invalid file changes nothing) without dropping a request
//! in flight; SIGTERM drains (new connections refused, in-flight requests
//! finish with `Connection: close`, idle connections closed, exit 0), and a
//! second SIGTERM exits at once.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;

/// An origin answering `<name> <path>`; `/slow` answers after `slow`.
async fn origin(name: &'static str, slow: Duration) -> Origin {
    Origin::start(move |req| async move {
        let resp = Response::ok(format!("{name} {}", req.uri));
        if req.uri.path() == "/slow" {
            resp.delay(slow)
        } else {
            resp
        }
    })
    .await
}

/// A reverse proxy on `listeners` routing every host to upstream `to`
/// (groups `a` and `b` are defined), plus `extra` config text.
fn config(listeners: &[&str], a: &Origin, b: &Origin, to: &str, extra: &str) -> String {
    let mut c = String::new();
    for l in listeners {
        c += &format!("[[listener]]\naddress = \"{l}\"\nmode = \"reverse\"\n\n");
    }
    c += &format!(
        "[log]\naccess = \"{{dir}}/access.log\"\n\n[cache]\nenabled = false\n\n\
         [[upstream]]\nname = \"a\"\nservers = [\"{}\"]\n\n\
         [[upstream]]\nname = \"b\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nhost = \"*\"\nupstream = \"{to}\"\n\n{extra}",
        a.addr(),
        b.addr()
    );
    c
}

/// Replaces portico's config file (`{dir}` substituted as at start).
fn rewrite(p: &Portico, text: &str) {
    p.rewrite_config(text);
}

/// `GET path` on a new connection; None if the connection failed.
async fn get(addr: SocketAddr, path: &str) -> Option<ParsedResponse> {
    let mut stream = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    (!buf.is_empty()).then(|| parse_response(&buf))
}

/// Polls `cond` every 50 ms until it holds (true) or `timeout` passes (false).
async fn eventually<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts `GET /slow` on its own connection and returns once the origin has it.
async fn slow_request(addr: SocketAddr, origin: &Origin) -> tokio::task::JoinHandle<Vec<u8>> {
    let before = origin.count();
    let task = tokio::spawn(async move {
        let mut c = RawClient::connect(addr).await;
        c.timeout = Duration::from_secs(20);
        c.send(b"GET /slow HTTP/1.1\r\nHost: www.example.com\r\n\r\n").await;
        let resp = c.read_response().await;
        // Keep-alive was asked for; what the server says about it is the point.
        format!(
            "{} {} connection={}",
            resp.status,
            resp.body_str(),
            resp.header("connection").unwrap_or("-")
        )
        .into_bytes()
    });
    assert!(
        origin.wait_count(before + 1, Duration::from_secs(5)).await,
        "the slow request did not reach the origin"
    );
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_changes_the_route_for_new_requests_and_the_request_in_flight_finishes() {
    let a = origin("a", Duration::from_secs(2)).await;
    let b = origin("b", Duration::from_secs(2)).await;
    let addr = free_addr();
    let p = Portico::start(&config(&[&addr], &a, &b, "a", "")).await;
    let addr = p.addr();
    assert_eq!(get(addr, "/x").await.expect("response").body_str(), "a /x");

    let slow = slow_request(addr, &a).await;
    rewrite(&p, &config(&[&format!("{addr}")], &a, &b, "b", ""));
    p.signal(libc::SIGHUP);
    let switched = eventually(Duration::from_secs(5), || async {
        get(addr, "/x").await.is_some_and(|r| r.body_str() == "b /x")
    })
    .await;
    assert!(switched, "new requests still go to a after SIGHUP\n{}", p.stderr());
    // The request that was in flight finished on the old route, untouched.
    let slow = String::from_utf8(slow.await.expect("slow request task")).expect("utf-8");
    assert_eq!(slow, "200 a /slow connection=-");
    assert!(p.stderr().contains("reloaded"), "{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_changes_the_access_list() {
    let a = origin("a", Duration::ZERO).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let p = Portico::start(&config(&[&addr], &a, &b, "a", "")).await;
    assert_eq!(get(p.addr(), "/x").await.expect("response").status, 200);
    // Loopback no longer allowed: 403 for new requests.
    rewrite(
        &p,
        &config(&[&addr], &a, &b, "a", "[access]\nallow = [\"192.0.2.0/24\"]\n"),
    );
    p.signal(libc::SIGHUP);
    let denied = eventually(Duration::from_secs(5), || async {
        get(p.addr(), "/x").await.is_some_and(|r| r.status == 403)
    })
    .await;
    assert!(denied, "the new access list was not applied\n{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_an_invalid_config_keeps_serving_and_logs_why() {
    let a = origin("a", Duration::ZERO).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let p = Portico::start(&config(&[&addr], &a, &b, "a", "")).await;
    // Line 1 is fine, line 2 names an unknown key.
    rewrite(&p, "[server]\nwrkers = 2\n");
    p.signal(libc::SIGHUP);
    let logged = eventually(Duration::from_secs(5), || async {
        p.stderr().contains("reload failed")
    })
    .await;
    assert!(logged, "no reload error logged\n{}", p.stderr());
    let err = p.stderr();
    let line = err.lines().find(|l| l.contains("reload failed")).expect("error line");
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains("portico.toml:2"),
        "the loader's FILE:LINE is missing: {line}"
    );
    assert!(line.contains("wrkers"), "{line}");
    // Still serving on the old config.
    assert_eq!(get(p.addr(), "/x").await.expect("response").body_str(), "a /x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_binds_an_added_listener_and_closes_a_removed_one() {
    let a = origin("a", Duration::ZERO).await;
    let b = origin("b", Duration::ZERO).await;
    let (first, second) = (free_addr(), free_addr());
    let p = Portico::start(&config(&[&first], &a, &b, "a", "")).await;
    let second_addr: SocketAddr = second.parse().expect("addr");
    assert!(
        get(second_addr, "/x").await.is_none(),
        "nothing listens on {second} yet"
    );

    rewrite(&p, &config(&[&first, &second], &a, &b, "a", ""));
    p.signal(libc::SIGHUP);
    let answering = eventually(Duration::from_secs(5), || async {
        get(second_addr, "/x").await.is_some_and(|r| r.body_str() == "a /x")
    })
    .await;
    assert!(answering, "the added listener does not answer\n{}", p.stderr());
    assert_eq!(get(p.addr(), "/x").await.expect("kept listener").body_str(), "a /x");

    // An idle keep-alive connection on the first listener survives its removal.
    let mut idle = RawClient::connect(p.addr()).await;
    idle.send(b"GET /y HTTP/1.1\r\nHost: www.example.com\r\n\r\n").await;
    assert_eq!(idle.read_response().await.body_str(), "a /y");

    rewrite(&p, &config(&[&second], &a, &b, "a", ""));
    p.signal(libc::SIGHUP);
    let closed = eventually(Duration::from_secs(5), || async {
        tokio::net::TcpStream::connect(p.addr()).await.is_err()
    })
    .await;
    assert!(closed, "the removed listener still accepts\n{}", p.stderr());
    assert_eq!(get(second_addr, "/x").await.expect("response").body_str(), "a /x");
    idle.send(b"GET /z HTTP/1.1\r\nHost: www.example.com\r\n\r\n").await;
    assert_eq!(idle.read_response().await.body_str(), "a /z");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_request_in_flight_finish_refuses_new_connections_and_exits_0() {
    let a = origin("a", Duration::from_secs(2)).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let mut p = Portico::start(&config(&[&addr], &a, &b, "a", "")).await;
    let addr = p.addr();
    // An idle keep-alive connection: closed at once by the drain.
    let mut idle = RawClient::connect(addr).await;
    idle.send(b"GET /i HTTP/1.1\r\nHost: www.example.com\r\n\r\n").await;
    assert_eq!(idle.read_response().await.body_str(), "a /i");

    let slow = slow_request(addr, &a).await;
    p.signal(libc::SIGTERM);
    let refused = eventually(Duration::from_secs(2), || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(refused, "new connections are still accepted after SIGTERM");
    assert!(p.is_running(), "exited before the request in flight finished");
    idle.timeout = Duration::from_secs(2);
    assert!(
        idle.read_to_end().await.is_empty() && idle.is_eof(),
        "idle connection not closed"
    );

    let slow = String::from_utf8(slow.await.expect("slow request task")).expect("utf-8");
    assert_eq!(slow, "200 a /slow connection=close");
    let status = p
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("portico did not exit");
    assert!(status.success(), "exit status {status}\n{}", p.stderr());
    let log = std::fs::read_to_string(p.dir().join("access.log")).expect("access log");
    assert!(
        log.contains("\"GET /slow HTTP/1.1\" 200"),
        "the drained request was not logged:\n{log}"
    );
}

/// A keep-alive connection idle in its own task (never handed to the
/// poller here) is closed as soon as the drain starts, not after
/// `keepalive.timeout`: the keep-alive set shuts it down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_keepalive_connections_idle_in_their_tasks_at_once() {
    let a = origin("a", Duration::ZERO).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let mut p = Portico::start(&config(
        &[&addr],
        &a,
        &b,
        "a",
        "[keepalive]\ntimeout = \"60s\"\npark_after = \"1h\"\n",
    ))
    .await;
    let addr = p.addr();
    let mut idle = Vec::new();
    for i in 0..3 {
        let mut c = RawClient::connect(addr).await;
        c.send(format!("GET /i{i} HTTP/1.1\r\nHost: www.example.com\r\n\r\n").as_bytes())
            .await;
        assert_eq!(c.read_response().await.body_str(), format!("a /i{i}"));
        idle.push(c);
    }
    // Each enters the idle set once its response is logged, a moment after
    // the client has it.
    let idle_in_tasks = eventually(Duration::from_secs(5), || async {
        let k = keepalive(addr).await;
        (k["count"].as_u64(), k["parked"].as_u64()) == (Some(3), Some(0))
    })
    .await;
    assert!(
        idle_in_tasks,
        "not three connections idle in their tasks: {}",
        keepalive(addr).await
    );
    p.signal(libc::SIGTERM);
    for c in &mut idle {
        c.timeout = Duration::from_secs(3);
        assert!(
            c.read_to_end().await.is_empty() && c.is_eof(),
            "idle connection not closed"
        );
    }
    let status = p
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("portico did not exit");
    assert!(status.success(), "exit status {status}\n{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_the_connections_the_keepalive_poller_holds_at_once() {
    let a = origin("a", Duration::ZERO).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let mut p = Portico::start(&config(&[&addr], &a, &b, "a", "[keepalive]\npark_after = \"10ms\"\n")).await;
    let addr = p.addr();
    let mut kept = RawClient::connect(addr).await;
    kept.send(b"GET /k HTTP/1.1\r\nHost: www.example.com\r\n\r\n").await;
    assert_eq!(kept.read_response().await.body_str(), "a /k");
    let mut fresh = RawClient::connect(addr).await;
    let parked = eventually(Duration::from_secs(5), || async {
        let ka = keepalive(addr).await;
        ka["parked"] == 1 && ka["parked_new"] == 1
    })
    .await;
    assert!(
        parked,
        "the idle connections were not handed to the poller: {}",
        keepalive(addr).await
    );
    let t = Instant::now();
    p.signal(libc::SIGTERM);
    for c in [&mut kept, &mut fresh] {
        c.timeout = Duration::from_secs(5);
        assert!(
            c.read_to_end().await.is_empty() && c.is_eof(),
            "a parked connection was not closed"
        );
    }
    let status = p.wait_exit(Duration::from_secs(5)).await.expect("portico did not exit");
    assert!(status.success(), "exit status {status}\n{}", p.stderr());
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the drain waited {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_exits_at_once() {
    let a = origin("a", Duration::from_secs(30)).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let mut p = Portico::start(&config(&[&addr], &a, &b, "a", "[server]\nshutdown_timeout = \"60s\"\n")).await;
    let slow = slow_request(p.addr(), &a).await;
    p.signal(libc::SIGTERM);
    assert!(
        p.wait_exit(Duration::from_millis(500)).await.is_none(),
        "exited with a request in flight"
    );
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("no exit after a second SIGTERM");
    assert!(!status.success(), "a forced exit reports failure: {status}");
    assert!(p.stderr().contains("second SIGTERM"), "{}", p.stderr());
    slow.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_bounds_the_drain() {
    let a = origin("a", Duration::from_secs(30)).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let mut p = Portico::start(&config(&[&addr], &a, &b, "a", "[server]\nshutdown_timeout = \"1s\"\n")).await;
    let slow = slow_request(p.addr(), &a).await;
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("no exit after shutdown_timeout");
    assert!(status.success(), "exit status {status}");
    assert!(
        p.stderr()
            .contains("shutdown_timeout (1s) passed with 1 connections open"),
        "{}",
        p.stderr()
    );
    slow.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_keeps_restart_only_settings_and_applies_the_rest() {
    let a = origin("a", Duration::ZERO).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let p = Portico::start(&config(&[&addr], &a, &b, "a", "[server]\nworkers = 2\n")).await;
    rewrite(&p, &config(&[&addr], &a, &b, "b", "[server]\nworkers = 3\n"));
    p.signal(libc::SIGHUP);
    let switched = eventually(Duration::from_secs(5), || async {
        get(p.addr(), "/x").await.is_some_and(|r| r.body_str() == "b /x")
    })
    .await;
    assert!(switched, "{}", p.stderr());
    let err = p.stderr();
    let line = err
        .lines()
        .find(|l| l.contains("`server.workers` changed"))
        .unwrap_or_else(|| panic!("no warning\n{err}"));
    assert!(
        line.contains("WARN") && line.contains("(2 -> 3): needs restart; keeping 2"),
        "{line}"
    );
    // The runtime still has its 2 worker threads.
    let threads = std::fs::read_dir(format!("/proc/{}/task", p.pid()))
        .expect("task dir")
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "portico-worker"))
        .count();
    assert_eq!(threads, 2);
}

/// The process's statistics snapshot (the monitoring JSON's `snapshot`).
async fn connection_counters(addr: SocketAddr) -> serde_json::Value {
    let raw = raw_request(
        addr,
        format!("GET /.stats.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    let resp = parse_response(&raw);
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("counters are JSON");
    v["snapshot"].clone()
}

/// The admission counters: `sessions` (in service, `limit`) and the
/// `connection_queue` (`total_admitted`).
async fn admission(addr: SocketAddr) -> serde_json::Value {
    connection_counters(addr).await
}

/// The keep-alive counters.
async fn keepalive(addr: SocketAddr) -> serde_json::Value {
    connection_counters(addr).await["keepalive"].clone()
}

#[tokio::test]
async fn sighup_keeps_the_admission_limits_and_counters_of_the_process() {
    let a = origin("a", Duration::ZERO).await;
    let b = origin("b", Duration::ZERO).await;
    let addr = free_addr();
    let p = Portico::start(&config(&[&addr], &a, &b, "a", "[server]\nmax_requests = 4\n")).await;
    for _ in 0..3 {
        assert_eq!(
            get(p.addr(), "/x").await.map(|r| r.body_str()),
            Some("a /x".to_string())
        );
    }
    let before = admission(p.addr()).await;
    assert_eq!(before["sessions"]["limit"], 4, "{before}");
    assert_eq!(before["connection_queue"]["total_admitted"], 3, "{before}");
    rewrite(&p, &config(&[&addr], &a, &b, "b", "[server]\nmax_requests = 8\n"));
    p.signal(libc::SIGHUP);
    let switched = eventually(Duration::from_secs(5), || async {
        get(p.addr(), "/x").await.is_some_and(|r| r.body_str() == "b /x")
    })
    .await;
    assert!(switched, "{}", p.stderr());
    // Same queue, same counters: the requests before the reload still count,
    // and the limit needs a restart.
    let after = admission(p.addr()).await;
    assert_eq!(after["sessions"]["limit"], 4, "{after}");
    assert!(
        after["connection_queue"]["total_admitted"].as_u64() > Some(3),
        "{after}"
    );
    let err = p.stderr();
    assert!(
        err.lines()
            .any(|l| l.contains("`server.max_requests` changed (4 -> 8): needs restart; keeping 4")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_only_settings_are_named_as_the_config_writes_them() {
    let addr = free_addr();
    let text = |memory: &str, timeout: &str| {
        format!(
            "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
             [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"{memory}\"\n\n\
             [keepalive]\ntimeout = \"{timeout}\"\n"
        )
    };
    let p = Portico::start(&text("16MiB", "15s")).await;
    rewrite(&p, &text("32MiB", "30s"));
    p.signal(libc::SIGHUP);
    let mut err = String::new();
    for _ in 0..100 {
        err = p.stderr();
        if err.contains("`keepalive.timeout` changed") && err.contains("`cache.memory` changed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for want in [
        "`cache.memory` changed (\"16MiB\" -> \"32MiB\"): needs restart; keeping \"16MiB\"",
        "`keepalive.timeout` changed (\"15s\" -> \"30s\"): needs restart; keeping \"15s\"",
    ] {
        assert!(
            err.lines().any(|l| l.contains("WARN") && l.contains(want)),
            "no {want:?} in\n{err}"
        );
    }
    for internal in ["Size(", "Dur("] {
        assert!(!err.contains(internal), "{internal} in\n{err}");
    }
}
