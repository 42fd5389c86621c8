//! Connection handling through the real binary: admission and the
//! connection queue (busy 503 with Retry-After), the keep-alive subsystem
//! (flushes oldest first, timeouts, hits, refusals, slowloris cut-off, the
//! poller that holds connections idle past `park_after`), the
//! blocking pool under disk-cache traffic, and sizing from the machine.
//! Every counter is read from the monitoring JSON (`GET /.stats.json`, its
//! `snapshot`: admission in `sessions`, the queue in `connection_queue`,
//! `keepalive`, the blocking pool in `native_pool`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

/// A forward listener on a free port with `extra` config sections.
async fn proxy(extra: &str) -> Portico {
    proxy_with(extra, "").await
}

/// As [`proxy`], with `listener_extra` keys in the `[[listener]]` table.
async fn proxy_with(extra: &str, listener_extra: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n{listener_extra}\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n{extra}"
    ))
    .await
}

fn num(v: &Value, section: &str, key: &str) -> f64 {
    v[section][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {section}.{key} in {v}"))
}

fn int(v: &Value, section: &str, key: &str) -> u64 {
    v[section][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer {section}.{key} in {v}"))
}

/// An absolute-form GET through the proxy for `origin` + `path`.
fn get(origin: &Origin, path: &str, headers: &str) -> Vec<u8> {
    let o = origin.addr();
    format!("GET http://{o}{path} HTTP/1.1\r\nHost: {o}\r\n{headers}\r\n").into_bytes()
}

/// An origin whose responses wait until the test adds permits to `gate`;
/// `arrived` counts the requests it has received.
async fn gated_origin() -> (Origin, Arc<Semaphore>, Arc<AtomicUsize>) {
    gated_origin_with(false).await
}

/// As [`gated_origin`]; with `fresh`, every response is fresh for a minute,
/// and `/cached` is answered at once (with `stored`, and not counted).
async fn gated_origin_with(fresh: bool) -> (Origin, Arc<Semaphore>, Arc<AtomicUsize>) {
    let gate = Arc::new(Semaphore::new(0));
    let arrived = Arc::new(AtomicUsize::new(0));
    let (g, a) = (gate.clone(), arrived.clone());
    let origin = Origin::start(move |req| {
        let (g, a) = (g.clone(), a.clone());
        async move {
            let resp = if fresh && req.uri.path() == "/cached" {
                Response::ok("stored")
            } else {
                a.fetch_add(1, Ordering::SeqCst);
                if let Ok(p) = g.acquire().await {
                    p.forget();
                }
                Response::ok(format!("slow {}", req.uri.path()))
            };
            if fresh {
                resp.header("Cache-Control", "max-age=60")
            } else {
                resp
            }
        }
    })
    .await;
    (origin, gate, arrived)
}

/// Waits (10 s at most) until `done` holds; whether it does.
async fn until(done: impl Fn() -> bool) -> bool {
    for _ in 0..2000 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// Waits (10 s at most) until the origin has received `n` requests.
async fn until_arrived(arrived: &AtomicUsize, n: usize) {
    until(|| arrived.load(Ordering::SeqCst) >= n).await;
}

async fn fast_origin() -> Origin {
    Origin::start(|req| async move { Response::ok(format!("fast {}", req.uri.path())) }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_requests_queues_then_answers_busy_503_with_retry_after() {
    let (origin, gate, arrived) = gated_origin().await;
    let p = proxy_with(
        "[server]\nmax_requests = 2\nqueue_size = 1\nbusy_retry_after = \"7s\"\n\n[cache]\nenabled = false\n\n\
         [[rule]]\npath = \"/special/\"\nbusy_body = \"<p>special: busy</p>\"\n",
        "busy_body = \"<p>too busy, come back later</p>\"",
    )
    .await;
    let addr = p.addr();
    let before = stats_snapshot(&p).await;
    assert_eq!(int(&before, "sessions", "limit"), 2);
    assert_eq!(int(&before, "connection_queue", "limit"), 1);

    // Two slow requests take both places in service.
    let mut in_service = Vec::new();
    for i in 0..2 {
        let req = get(&origin, &format!("/slow{i}"), "Connection: close\r\n");
        in_service.push(tokio::spawn(async move {
            raw_request_timeout(addr, &req, Duration::from_secs(30)).await
        }));
    }
    until_arrived(&arrived, 2).await;
    assert_eq!(
        arrived.load(Ordering::SeqCst),
        2,
        "the two slow requests never reached the origin"
    );
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "sessions", "active"), 2);

    // The third waits in the connection queue.
    let req = get(&origin, "/queued", "Connection: close\r\n");
    let queued = tokio::spawn(async move { raw_request_timeout(addr, &req, Duration::from_secs(30)).await });
    let c = stats_when(&p, "one queued request", |c| c["connection_queue"]["current"] == 1).await;
    assert_eq!(int(&c, "connection_queue", "total_queued"), 1);
    assert_eq!(
        arrived.load(Ordering::SeqCst),
        2,
        "a queued request must not reach the origin"
    );

    // The fourth finds the queue full: 503 at once, Retry-After, the
    // listener's busy body. A request without a body keeps its connection
    // (a second one on it is refused the same way); one with a body is
    // closed cleanly after the 503 (no reset).
    let mut client = RawClient::connect(addr).await;
    for _ in 0..2 {
        client.send(&get(&origin, "/overflow", "")).await;
        let resp = client.read_response().await;
        assert_eq!(resp.status, 503);
        assert_eq!(resp.header("retry-after"), Some("7"));
        assert_ne!(resp.header("connection"), Some("close"));
        assert_eq!(resp.body_str(), "<p>too busy, come back later</p>");
    }
    let o = origin.addr();
    let post = format!("POST http://{o}/overflow HTTP/1.1\r\nHost: {o}\r\nContent-Length: 5\r\n\r\nhello");
    let resp = parse_response(&raw_request(addr, post.as_bytes()).await);
    assert_eq!((resp.status, resp.header("connection")), (503, Some("close")));
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "connection_queue", "overflows"), 3);
    // A route that names its own busy body gets it instead.
    let resp = parse_response(&raw_request(addr, &get(&origin, "/special/x", "Connection: close\r\n")).await);
    assert_eq!((resp.status, resp.header("retry-after")), (503, Some("7")));
    assert_eq!(resp.body_str(), "<p>special: busy</p>");

    // Let the origin answer: everything admitted is served, the queued one last.
    gate.add_permits(3);
    for t in in_service {
        let resp = parse_response(&t.await.expect("join"));
        assert_eq!(resp.status, 200);
    }
    let resp = parse_response(&queued.await.expect("join"));
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "slow /queued"));

    let c = stats_when(&p, "an empty queue", |c| c["sessions"]["active"] == 0).await;
    let q = "connection_queue";
    assert_eq!(int(&c, q, "current"), 0);
    assert_eq!(int(&c, q, "peak"), 1);
    assert_eq!(int(&c, q, "total_queued"), 1);
    assert_eq!(int(&c, q, "overflows"), 4);
    assert_eq!(int(&c, "sessions", "peak"), 2);
    assert_eq!(int(&c, q, "total_admitted"), 3);
    assert!(int(&c, q, "queue_time_us") > 0, "{c}");
    for avg in ["avg_1", "avg_5", "avg_15"] {
        assert!(num(&c, q, avg) > 0.0, "{avg} did not move: {c}");
    }
    assert!(num(&c, q, "avg_1") > num(&c, q, "avg_15"), "{c}");
    // The 503 is in the access log (written by a background thread).
    let needle = "/overflow HTTP/1.1\" 503";
    let mut log = String::new();
    for _ in 0..200 {
        log = std::fs::read_to_string(p.dir().join("access.log")).unwrap_or_default();
        if log.contains(needle) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(log.contains(needle), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_is_answered_at_once_while_slow_misses_hold_every_slot_and_the_queue() {
    // `/cached` is answered at once and fresh for a minute; every other
    // path waits for the gate.
    let (origin, gate, arrived) = gated_origin_with(true).await;
    let p = proxy("[server]\nmax_requests = 2\nqueue_size = 1\n").await;
    let addr = p.addr();
    let first = parse_response(&raw_request(addr, &get(&origin, "/cached", "Connection: close\r\n")).await);
    assert_eq!((first.status, first.header("x-cache")), (200, Some("MISS")));

    // Two slow misses take both places in service, a third the queue's one.
    let mut slow = Vec::new();
    for path in ["/slow0", "/slow1", "/queued"] {
        let req = get(&origin, path, "Connection: close\r\n");
        slow.push(tokio::spawn(async move {
            raw_request_timeout(addr, &req, Duration::from_secs(30)).await
        }));
        if path == "/slow1" {
            until_arrived(&arrived, 2).await;
        }
    }
    stats_when(&p, "one queued request", |c| c["connection_queue"]["current"] == 1).await;

    // The hit waits for nothing: answered from the cache without a slot.
    let hit = parse_response(
        &raw_request_timeout(
            addr,
            &get(&origin, "/cached", "Connection: close\r\n"),
            Duration::from_secs(5),
        )
        .await,
    );
    assert_eq!(
        (hit.status, hit.header("x-cache"), hit.body_str().as_str()),
        (200, Some("HIT"), "stored")
    );
    // A miss still needs a slot: the queue is full, so a busy 503, and
    // nothing reaches the origin for it.
    let miss = parse_response(&raw_request(addr, &get(&origin, "/overflow", "Connection: close\r\n")).await);
    assert_eq!(miss.status, 503);
    assert_eq!(
        arrived.load(Ordering::SeqCst),
        2,
        "only the two admitted misses reached the origin"
    );
    let c = stats_snapshot(&p).await;
    let q = "connection_queue";
    assert_eq!(int(&c, q, "unqueued_hits"), 1, "{c}");
    assert_eq!(int(&c, q, "overflows"), 1, "{c}");
    assert_eq!(int(&c, q, "total_queued"), 1, "{c}");
    let line = perf_line(&p, "Hits Answered Without Queueing").await;
    assert!(line.trim_end().ends_with(" 1"), "{line}");

    gate.add_permits(3);
    for (t, path) in slow.into_iter().zip(["/slow0", "/slow1", "/queued"]) {
        let resp = parse_response(&t.await.expect("join"));
        assert_eq!((resp.status, resp.body_str()), (200, format!("slow {path}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_that_waited_in_the_queue_is_answered_from_what_was_stored_meanwhile() {
    // Every answer waits for the gate and is fresh for a minute.
    let (origin, gate, arrived) = gated_origin_with(true).await;
    let p = proxy("[server]\nmax_requests = 1\nqueue_size = 4\n").await;
    let addr = p.addr();
    let req = get(&origin, "/a", "Connection: close\r\n");
    let r1 = req.clone();
    let first = tokio::spawn(async move { raw_request_timeout(addr, &r1, Duration::from_secs(30)).await });
    until_arrived(&arrived, 1).await;
    // The same URL, while the first holds the only place: looked up (a
    // miss), then queued for a place.
    let second = tokio::spawn(async move { raw_request_timeout(addr, &req, Duration::from_secs(30)).await });
    stats_when(&p, "one queued request", |c| c["connection_queue"]["current"] == 1).await;
    gate.add_permits(2);
    let first = parse_response(&first.await.expect("join"));
    assert_eq!((first.status, first.header("x-cache")), (200, Some("MISS")));
    // Admitted after the first stored its response: it looks again and
    // is answered from the cache, not sent to the origin a second time.
    let second = parse_response(&second.await.expect("join"));
    assert_eq!(
        (second.status, second.header("x-cache"), second.body_str().as_str()),
        (200, Some("HIT"), "slow /a")
    );
    assert_eq!(arrived.load(Ordering::SeqCst), 1, "one origin request for /a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_beyond_the_limit_are_closed_oldest_first() {
    let origin = fast_origin().await;
    let p = proxy("[keepalive]\nmax_connections = 2\n").await;
    let mut clients = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let mut c = RawClient::connect(p.addr()).await;
        c.send(&get(&origin, &format!("/{name}"), "")).await;
        assert_eq!(c.read_response().await.status, 200);
        clients.push(c);
        // Each becomes idle in turn, so their age order is a, b, c. The
        // set holds two: c's arrival flushes a.
        let idle = (i + 1).min(2) as u64;
        stats_when(&p, "the connection idle", |c| c["keepalive"]["count"] == idle).await;
    }
    let mut oldest = clients.remove(0);
    oldest.timeout = Duration::from_secs(10);
    assert!(oldest.read_to_end().await.is_empty());
    assert!(oldest.is_eof(), "the oldest idle connection was not closed");
    // The newer ones still work (and their second requests are hits).
    for (c, name) in clients.iter_mut().zip(["b", "c"]) {
        c.send(&get(&origin, &format!("/{name}2"), "")).await;
        let resp = c.read_response().await;
        assert_eq!((resp.status, resp.body_str()), (200, format!("fast /{name}2")));
    }
    let c = stats_when(&p, "two idle connections", |c| c["keepalive"]["count"] == 2).await;
    assert_eq!(int(&c, "keepalive", "max"), 2);
    assert_eq!(int(&c, "keepalive", "flushes"), 1);
    assert_eq!(int(&c, "keepalive", "hits"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_handed_to_the_poller_and_back() {
    let origin = fast_origin().await;
    let p = proxy("[keepalive]\npark_after = \"50ms\"\ntimeout = \"30s\"\n").await;
    // 20 connections that served a request, 10 that never sent one.
    let mut used = Vec::new();
    for i in 0..20 {
        let mut c = RawClient::connect(p.addr()).await;
        c.send(&get(&origin, &format!("/u{i}"), "")).await;
        assert_eq!(c.read_response().await.status, 200);
        used.push(c);
    }
    let mut fresh = Vec::new();
    for _ in 0..10 {
        fresh.push(RawClient::connect(p.addr()).await);
    }
    let c = stats_when(&p, "every idle connection with the poller", |c| {
        c["keepalive"]["parked"] == 20 && c["keepalive"]["parked_new"] == 10
    })
    .await;
    assert_eq!(
        int(&c, "keepalive", "count"),
        20,
        "new connections are not kept-alive ones: {c}"
    );
    assert!(int(&c, "keepalive", "parks") >= 30, "{c}");
    assert_eq!(int(&c, "keepalive", "hits"), 0);
    // The monitoring pages show the poller's share.
    let addr = p.addr();
    let perf = raw_request(addr, format!("GET /.perf HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes()).await;
    let perf = parse_response(&perf).body_str();
    assert!(perf.contains("KeepAlivePolled      20 kept-alive, 10 new"), "{perf}");
    let metrics = raw_request(
        addr,
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
    .await;
    let metrics = parse_response(&metrics).body_str();
    assert!(metrics.contains("portico_keepalive_polled_connections 20"), "{metrics}");

    // Every one of them is served when its client speaks again: in order,
    // with the right body, the used ones' requests counted as hits.
    for (i, c) in used.iter_mut().enumerate() {
        c.send(&get(&origin, &format!("/again{i}"), "")).await;
    }
    for (i, c) in fresh.iter_mut().enumerate() {
        c.send(&get(&origin, &format!("/first{i}"), "")).await;
    }
    for (i, c) in used.iter_mut().enumerate() {
        let resp = c.read_response().await;
        assert_eq!((resp.status, resp.body_str()), (200, format!("fast /again{i}")));
    }
    for (i, c) in fresh.iter_mut().enumerate() {
        let resp = c.read_response().await;
        assert_eq!((resp.status, resp.body_str()), (200, format!("fast /first{i}")));
    }
    // All 30 idle again, all kept-alive now, and back with the poller.
    let c = stats_when(&p, "the 30 connections parked again", |c| {
        c["keepalive"]["parked"] == 30 && c["keepalive"]["parked_new"] == 0
    })
    .await;
    assert_eq!(int(&c, "keepalive", "hits"), 20);
    assert_eq!(int(&c, "keepalive", "count"), 30);
    assert!(int(&c, "keepalive", "parks") >= 60, "{c}");
    // A pipelined pair on a parked connection is answered in order.
    let c0 = &mut used[0];
    let mut two = get(&origin, "/p1", "");
    two.extend_from_slice(&get(&origin, "/p2", ""));
    c0.send(&two).await;
    assert_eq!(c0.read_response().await.body_str(), "fast /p1");
    assert_eq!(c0.read_response().await.body_str(), "fast /p2");
    // A client that closes while parked is closed here too, uncounted.
    drop(used.pop());
    stats_when(&p, "the closed connection gone", |c| c["keepalive"]["count"] == 29).await;
}

/// A connection waiting in its own task (new and silent, or kept alive,
/// before `park_after`) costs about 1.4 KiB (docs/CONFIG.md): the task and
/// the HTTP/1 loop's future. Paths that are not that loop (SOCKS, HTTP/2,
/// the TLS handshake) are boxed when taken; inlined, SOCKS's state made
/// every connection's task 6,200 bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_waiting_in_its_task_costs_under_3_kib() {
    // Silent new connections, accepted at once (not held by the kernel).
    let p = proxy_with(
        "[keepalive]\npark_after = \"1min\"\ntimeout = \"1min\"\n\n[limits]\nheader_timeout = \"1min\"\n",
        "defer_accept = \"0s\"",
    )
    .await;
    let descriptors = || std::fs::read_dir(format!("/proc/{}/fd", p.pid())).map_or(0, |d| d.count());
    // As many as this test process may open (its soft limit raised to the
    // hard one), up to 3,000: the more connections, the less a stray page
    // the process touches meanwhile weighs per connection.
    let n = (raise_own_open_files().saturating_sub(300) as usize).min(3000);
    assert!(n >= 700, "this test needs about 1,000 open files, and has {}", n + 300);
    let mut held = Vec::with_capacity(n);
    // The first connections also grow the runtime's and the allocator's
    // structures once: measure from after a first batch.
    for _ in 0..100 {
        held.push(tokio::net::TcpStream::connect(p.addr()).await.expect("connect"));
    }
    assert!(
        until(|| descriptors() >= 100).await,
        "the first connections not accepted"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (before, open) = (p.rss_kib(), descriptors());
    for _ in 0..n {
        held.push(tokio::net::TcpStream::connect(p.addr()).await.expect("connect"));
    }
    assert!(
        until(|| descriptors() >= open + n).await,
        "{n} connections not accepted"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let per_connection = (p.rss_kib().saturating_sub(before)) * 1024 / n as u64;
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "keepalive", "parked_new"), 0, "still in their tasks: {c}");
    assert!(
        per_connection < 3 << 10,
        "{per_connection} bytes per connection waiting in its task"
    );
    drop(held);
}

/// Raises this process's open-files soft limit to its hard limit; returns
/// the limit now in force.
fn raise_own_open_files() -> u64 {
    let mut lim = open_files_limit();
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit only reads the struct passed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        lim = open_files_limit();
    }
    #[allow(clippy::useless_conversion)]
    u64::from(lim.rlim_cur)
}

/// This process's open-files limits.
fn open_files_limit() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim
}

/// The poller keeps no client address: a resumed connection takes the
/// socket's own peer address again. A client at 127.0.0.3 is still that
/// client after parking, for the access list and in the access log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_connection_keeps_its_client_address() {
    let origin = fast_origin().await;
    let p = proxy(
        "[keepalive]\npark_after = \"20ms\"\ntimeout = \"30s\"\n\n\
         [[acl]]\naction = \"allow\"\nclient = \"127.0.0.3\"\n\n\
         [[acl]]\naction = \"deny\"\nreason = \"Not the help desk\"\n",
    )
    .await;
    let mut desk = RawClient::connect_from("127.0.0.3".parse().expect("ip"), p.addr()).await;
    let mut other = RawClient::connect(p.addr()).await;
    desk.send(&get(&origin, "/before", "")).await;
    assert_eq!(desk.read_response().await.status, 200);
    other.send(&get(&origin, "/before", "")).await;
    assert_eq!(other.read_response().await.status, 403);
    stats_when(&p, "both connections parked", |c| c["keepalive"]["parked"] == 2).await;
    desk.send(&get(&origin, "/after", "")).await;
    let r = desk.read_response().await;
    assert_eq!((r.status, r.body_str()), (200, "fast /after".to_string()));
    other.send(&get(&origin, "/after", "")).await;
    assert_eq!(other.read_response().await.status, 403);
    // Each line is queued after its response was sent, so the two may
    // reach the file in either order: wait for both.
    access_log_with(p.dir(), "/after HTTP/1.1\" 200 ").await;
    let log = access_log_with(p.dir(), "/after HTTP/1.1\" 403 ").await;
    let lines: Vec<&str> = log.lines().collect();
    let after: Vec<&&str> = lines.iter().filter(|l| l.contains("/after")).collect();
    assert_eq!(after.len(), 2, "{lines:?}");
    assert!(
        after.iter().any(|l| l.starts_with("127.0.0.3 ") && l.contains(" 200 "))
            && after.iter().any(|l| l.starts_with("127.0.0.1 ") && l.contains(" 403 ")),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_steady_rhythm_is_not_parked_for_every_request() {
    let origin = fast_origin().await;
    let p = proxy("[keepalive]\npark_after = \"100ms\"\n").await;
    let parks = |c: &Value| int(c, "keepalive", "parks");
    // A request every 130 ms: the first pause parks the connection (past
    // 100 ms), the client speaks 30 ms later, so its wait doubles to 200 ms
    // and the following pauses are waited out in the task.
    let mut steady = RawClient::connect(p.addr()).await;
    let before = parks(&stats_snapshot(&p).await);
    for i in 0..9 {
        steady.send(&get(&origin, &format!("/s{i}"), "")).await;
        assert_eq!(steady.read_response().await.status, 200);
        tokio::time::sleep(Duration::from_millis(130)).await;
    }
    let steady_parks = parks(&stats_snapshot(&p).await) - before;
    assert!(
        (1..=3).contains(&steady_parks),
        "9 requests 130 ms apart were parked {steady_parks} times"
    );
    drop(steady);
    // A request every 400 ms: idle between requests, parked every time.
    let mut slow = RawClient::connect(p.addr()).await;
    slow.send(&get(&origin, "/first", "")).await;
    assert_eq!(slow.read_response().await.status, 200);
    let before = parks(&stats_snapshot(&p).await);
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        slow.send(&get(&origin, &format!("/slow{i}"), "")).await;
        assert_eq!(slow.read_response().await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let slow_parks = parks(&stats_snapshot(&p).await) - before;
    assert_eq!(slow_parks, 4, "4 pauses of 400 ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_times_out_and_flushes_the_connections_it_holds() {
    let origin = fast_origin().await;
    let p = proxy(
        "[keepalive]\npark_after = \"20ms\"\ntimeout = \"1s\"\nmax_connections = 2\n\n         [limits]\nheader_timeout = \"1s\"\n",
    )
    .await;
    let mut clients = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let mut c = RawClient::connect(p.addr()).await;
        c.timeout = Duration::from_secs(10);
        c.send(&get(&origin, &format!("/{name}"), "")).await;
        assert_eq!(c.read_response().await.status, 200);
        clients.push(c);
        // Parked in turn (a, b, c); the poller holds two: c's arrival in
        // the idle set flushes a, the one the poller has held the longest.
        let parked = (i + 1).min(2) as u64;
        stats_when(&p, "the connection parked", |c| c["keepalive"]["parked"] == parked).await;
    }
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "keepalive", "flushes"), 1, "{c}");
    assert!(clients[0].read_to_end().await.is_empty());
    assert!(clients[0].is_eof(), "the oldest parked connection was not flushed");
    // A silent new connection: the poller closes it after header_timeout.
    let mut silent = RawClient::connect(p.addr()).await;
    silent.timeout = Duration::from_secs(10);
    stats_when(&p, "the new connection parked", |c| c["keepalive"]["parked_new"] == 1).await;
    // b and c time out in the poller after keepalive.timeout.
    for c in &mut clients[1..] {
        assert!(c.read_to_end().await.is_empty());
        assert!(c.is_eof(), "a parked connection outlived keepalive.timeout");
    }
    assert!(silent.read_to_end().await.is_empty());
    assert!(silent.is_eof(), "a silent new connection outlived header_timeout");
    let c = stats_when(&p, "two timeouts and a header timeout", |c| {
        c["keepalive"]["timeouts"] == 2 && c["keepalive"]["header_timeouts"] == 1
    })
    .await;
    assert_eq!(int(&c, "keepalive", "count"), 0, "{c}");
    assert_eq!(int(&c, "keepalive", "parked"), 0, "{c}");
    assert_eq!(int(&c, "keepalive", "parked_new"), 0, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_cut_off_while_others_are_served() {
    let origin = fast_origin().await;
    let p = proxy("[limits]\nheader_timeout = \"1s\"\n").await;
    // A client that trickles its head, one header line at a time.
    let mut slow = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    let o = origin.addr();
    slow.write_all(format!("GET http://{o}/slow HTTP/1.1\r\nHost: {o}\r\n").as_bytes())
        .await
        .expect("write");
    let (mut reader, mut writer) = slow.into_split();
    let trickle = tokio::spawn(async move {
        for i in 0..200 {
            if writer.write_all(format!("X-Slow-{i}: a\r\n").as_bytes()).await.is_err() {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        200
    });
    // A client that says nothing at all.
    let mut silent = RawClient::connect(p.addr()).await;
    silent.timeout = Duration::from_secs(15);
    // Meanwhile others are served.
    for i in 0..3 {
        let raw = raw_request(p.addr(), &get(&origin, &format!("/other{i}"), "Connection: close\r\n")).await;
        assert_eq!(parse_response(&raw).status, 200);
    }
    // The trickler gets 408 and the connection closes.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the slowloris connection was never closed");
    assert_eq!(parse_response(&got).status, 408);
    let sent = trickle.await.expect("join");
    assert!(sent < 200, "the trickler was never cut off");
    // The silent one is closed without a response.
    assert!(silent.read_to_end().await.is_empty());
    assert!(silent.is_eof());
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "keepalive", "header_timeouts"), 2, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_hits_and_refusals_are_counted() {
    let origin = fast_origin().await;
    let p = proxy("[keepalive]\ntimeout = \"1s\"\nmax_requests = 3\n").await;
    let c = stats_snapshot(&p).await;
    assert_eq!(num(&c, "keepalive", "timeout_secs"), 1.0);

    // Three requests on one connection: two hits; the third response
    // closes it (max_requests): one refusal.
    let mut client = RawClient::connect(p.addr()).await;
    for i in 0..3 {
        client.send(&get(&origin, &format!("/k{i}"), "")).await;
        let resp = client.read_response().await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("connection") == Some("close"), i == 2);
    }
    assert!(client.read_to_end().await.is_empty());
    // HTTP/1.0 without keep-alive, and HTTP/1.1 with Connection: close: refusals.
    let o = origin.addr();
    let raw = raw_request(p.addr(), format!("GET http://{o}/old HTTP/1.0\r\n\r\n").as_bytes()).await;
    assert_eq!(parse_response(&raw).status, 200);
    let raw = raw_request(p.addr(), &get(&origin, "/close", "Connection: close\r\n")).await;
    assert_eq!(parse_response(&raw).status, 200);
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "keepalive", "hits"), 2);
    assert_eq!(int(&c, "keepalive", "refusals"), 3);
    assert_eq!(int(&c, "keepalive", "timeouts"), 0);

    // A kept connection left idle past keepalive.timeout is closed and counted.
    let mut idle = RawClient::connect(p.addr()).await;
    idle.timeout = Duration::from_secs(15);
    idle.send(&get(&origin, "/idle", "")).await;
    assert_eq!(idle.read_response().await.status, 200);
    assert!(idle.read_to_end().await.is_empty());
    assert!(idle.is_eof(), "the idle connection was not closed");
    let c = stats_when(&p, "a keep-alive timeout", |c| c["keepalive"]["timeouts"] == 1).await;
    assert_eq!(int(&c, "keepalive", "count"), 0);
    assert_eq!(int(&c, "keepalive", "refusals"), 3);
}

/// The one object file under a disk cache directory (tmp files excluded).
fn object_file(dir: &Path) -> PathBuf {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read cache dir").flatten() {
            let path = entry.path();
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() && entry.file_name() != "tmp" {
                stack.push(path);
            } else if kind.is_file() {
                found.push(path);
            }
        }
    }
    assert_eq!(found.len(), 1, "expected one cached object: {found:?}");
    found.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_pool_counts_disk_work_and_answers_busy_when_its_queue_is_full() {
    let origin =
        Origin::start(|_| async move { Response::ok(vec![b'x'; 10_000]).header("cache-control", "max-age=3600") })
            .await;
    let files = tempfile::tempdir().expect("tempdir");
    let busy_file = files.path().join("busy.html");
    std::fs::write(&busy_file, "<p>disk busy</p>").expect("write busy file");
    let p = proxy_with(
        // The file work on the pool even where the temporary directory is
        // on tmpfs (`cache.file_io = "auto"` would run it inline).
        "[server]\nblocking_threads = 1\nblocking_queue = 1\n\n[cache]\ndir = \"{dir}/cache\"\nmax_memory_object = \"1KiB\"\nfile_io = \"pool\"\n",
        &format!("busy_file = \"{}\"", busy_file.display()),
    )
    .await;
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "native_pool", "limit"), 1);
    assert_eq!(int(&c, "native_pool", "queue_limit"), 1);

    // A miss stores the object on disk (too big for the memory tier): the
    // file work runs on the pool. No hit yet: a hit would keep the file
    // open (`cache.open_files`) and later hits would not open it again.
    let raw = raw_request(p.addr(), &get(&origin, "/big", "Connection: close\r\n")).await;
    let resp = parse_response(&raw);
    assert_eq!((resp.status, resp.header("x-cache")), (200, Some("MISS")));
    assert_eq!(resp.body.len(), 10_000);
    let c = stats_when(&p, "an idle pool thread", |c| c["native_pool"]["idle"] == 1).await;
    assert!(int(&c, "native_pool", "jobs") >= 1, "{c}");
    assert_eq!(int(&c, "native_pool", "threads"), 1);
    assert_eq!(int(&c, "native_pool", "peak"), 1);

    // Swap the object's file for a FIFO: opening it blocks the pool's only
    // thread until the test opens the other end.
    let file = object_file(&p.dir().join("cache"));
    std::fs::remove_file(&file).expect("remove object");
    let made = std::process::Command::new("mkfifo")
        .arg(&file)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let addr = p.addr();
    let req = get(&origin, "/big", "Connection: close\r\n");
    let stuck = tokio::spawn({
        let req = req.clone();
        async move { raw_request_timeout(addr, &req, Duration::from_secs(30)).await }
    });
    stats_when(&p, "the pool thread busy", |c| {
        c["native_pool"]["threads"] == 1 && c["native_pool"]["idle"] == 0
    })
    .await;
    let queued = tokio::spawn({
        let req = req.clone();
        async move { raw_request_timeout(addr, &req, Duration::from_secs(30)).await }
    });
    stats_when(&p, "a queued disk job", |c| c["native_pool"]["queue"] == 1).await;
    // The work queue is full: the next lookup is refused with a busy 503.
    let raw = raw_request(p.addr(), &req).await;
    let resp = parse_response(&raw);
    assert_eq!(resp.status, 503);
    assert_eq!(resp.header("retry-after"), Some("5"));
    assert_eq!(resp.body_str(), "<p>disk busy</p>");

    // Release the thread: the FIFO reads as a corrupt object, so both
    // waiting requests are served from the origin.
    let writer = std::fs::OpenOptions::new().write(true).open(&file).expect("open FIFO");
    drop(writer);
    for t in [stuck, queued] {
        let resp = parse_response(&t.await.expect("join"));
        assert_eq!((resp.status, resp.body.len()), (200, 10_000));
    }
    let c = stats_when(&p, "the queue drained", |c| c["native_pool"]["idle"] == 1).await;
    let b = "native_pool";
    assert_eq!(int(&c, b, "queue"), 0);
    // At least the queued lookup; the two origin fetches' disk writes may
    // also queue behind each other (writes wait rather than being refused),
    // depending on timing.
    let queue_peak = int(&c, b, "queue_peak");
    assert!(queue_peak >= 1, "{c}");
    assert_eq!(int(&c, b, "refused"), 1);
    assert_eq!(int(&c, b, "peak"), 1);
    // The tuning advisor saw the queueing (the Sun Java System Web Proxy Server 4's guide: raise NativePoolMaxThreads).
    let perf = parse_response(
        &raw_request(
            p.addr(),
            format!("GET /.perf HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
        )
        .await,
    )
    .body_str();
    // The perfdump reports the peak the stats do (2 when a write queued
    // behind the lookup: writes may exceed the limit).
    assert!(
        perf.contains(&format!(
            "[blocking-pool-queueing] Work waited for a NativePool thread (queue peak {queue_peak}/1, threads peak 1/1)"
        )),
        "{perf}"
    );
    assert!(
        perf.contains(&format!("Work Queue Length/Peak/Limit   0/{queue_peak}/1\n")),
        "{perf}"
    );
}

/// The open-files limit a started portico runs with: the hard limit
/// (capped at 1 << 20), as `sizing::raise_open_files` sets it.
fn nofile_after_raise() -> u64 {
    #[allow(clippy::useless_conversion)]
    u64::from(open_files_limit().rlim_max).min(1 << 20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_sized_from_the_open_files_limit() {
    let nofile = nofile_after_raise();
    let usable = nofile - 64;
    let (max_requests, queue_size, keepalive) = (usable / 6, usable / 8, usable * 3 / 8);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["run", "--print-config"])
        .output()
        .expect("run portico");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!(
            "# sizing: open files {nofile}: server.max_requests = {max_requests} (derived)"
        )),
        "{text}"
    );
    let printed: toml::Table = text.parse().expect("printed config is TOML");
    assert_eq!(
        printed["server"]["max_requests"].as_integer(),
        Some(max_requests as i64)
    );
    assert_eq!(printed["server"]["queue_size"].as_integer(), Some(queue_size as i64));
    assert_eq!(
        printed["server"]["blocking_queue"].as_integer(),
        Some(max_requests as i64)
    );
    assert_eq!(
        printed["keepalive"]["max_connections"].as_integer(),
        Some(keepalive as i64)
    );

    // A running server uses the same values, says so in its log, and keeps
    // the ones the config sets.
    let p = proxy("[server]\nqueue_size = 7\n").await;
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "sessions", "limit"), max_requests);
    assert_eq!(int(&c, "connection_queue", "limit"), 7);
    assert_eq!(int(&c, "keepalive", "max"), keepalive);
    assert_eq!(int(&c, "native_pool", "queue_limit"), max_requests);
    assert!(
        p.stderr().contains(&format!("sizing: open files {nofile}: server.max_requests = {max_requests} (derived), server.queue_size = 7 (configured)")),
        "{}",
        p.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_sized_whatever_the_log_level() {
    // Regression: the sizing once ran inside an info-level log macro, so at
    // `level = "warn"` it never ran and the keep-alive set held 1 connection.
    let usable = nofile_after_raise() - 64;
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\nlevel = \"warn\"\n"
    ))
    .await;
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "sessions", "limit"), usable / 6);
    assert_eq!(int(&c, "keepalive", "max"), usable * 3 / 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_for_admin_clients_and_the_listener_itself() {
    let origin = fast_origin().await;
    // Nobody is an admin: 403.
    let p = proxy("[access]\nadmin_allow = []\n").await;
    let addr = p.addr();
    let raw = raw_request(
        addr,
        format!("GET /.stats.json HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(parse_response(&raw).status, 403);
    // On a transparent listener the path of another host is proxied, not answered.
    let t = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{t}\"\nmode = \"transparent\"\n\n[log]\naccess = \"\"\n"
    ))
    .await;
    let o = origin.addr();
    let raw = raw_request(
        p.addr(),
        format!("GET /.stats.json HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(parse_response(&raw).body_str(), "fast /.stats.json");
    let c = stats_snapshot(&p).await;
    assert!(c["keepalive"]["count"].is_u64(), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_timeout_zero_turns_keepalive_off() {
    let origin = fast_origin().await;
    let p = proxy("[keepalive]\ntimeout = \"0s\"\n").await;
    let mut client = RawClient::connect(p.addr()).await;
    client.send(&get(&origin, "/once", "")).await;
    let resp = client.read_response().await;
    assert_eq!((resp.status, resp.header("connection")), (200, Some("close")));
    assert!(client.read_to_end().await.is_empty());
    assert!(client.is_eof());
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "keepalive", "refusals"), 1);
    assert_eq!(num(&c, "keepalive", "timeout_secs"), 0.0);
}

#[test]
fn busy_page_settings_are_checked() {
    let out =
        Portico::check("[[listener]]\naddress = \"127.0.0.1:1\"\nbusy_body = \"x\"\nbusy_file = \"/etc/hostname\"\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("listener[0].busy_file") && err.contains("not both"),
        "{err}"
    );
    // An unreadable busy_file stops start-up with its name.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "[[listener]]\naddress = \"{}\"\nbusy_file = \"/nonexistent/busy.html\"\n[log]\naccess = \"\"\n[cache]\nenabled = false\n",
            free_addr()
        ),
    )
    .expect("write config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .current_dir(dir.path())
        .args(["run", "-c"])
        .arg(&config)
        .output()
        .expect("run portico");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read busy_file /nonexistent/busy.html"), "{err}");
}

/// A proxy serving one request at a time (`max_requests = 1`, a queue of
/// 4), the one in service a `/slow` GET its gated origin holds until the
/// test adds a permit: the origin, its gate, the proxy, and `/slow`'s
/// answer to come.
async fn one_request_in_service() -> (Origin, Arc<Semaphore>, Portico, tokio::task::JoinHandle<Vec<u8>>) {
    let (origin, gate, arrived) = gated_origin().await;
    let p = proxy("[server]\nmax_requests = 1\nqueue_size = 4\n\n[cache]\nenabled = false\n").await;
    let addr = p.addr();
    let req = get(&origin, "/slow", "Connection: close\r\n");
    let slow = tokio::spawn(async move { raw_request_timeout(addr, &req, Duration::from_secs(30)).await });
    until_arrived(&arrived, 1).await;
    (origin, gate, p, slow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_leaves_is_dropped() {
    let (origin, gate, p, slow) = one_request_in_service().await;
    let addr = p.addr();
    let mut leaving = RawClient::connect(addr).await;
    leaving.send(&get(&origin, "/abandoned", "")).await;
    stats_when(&p, "a queued request", |c| c["connection_queue"]["current"] == 1).await;
    drop(leaving);
    let c = stats_when(&p, "the queue emptied", |c| c["connection_queue"]["current"] == 0).await;
    assert_eq!(int(&c, "connection_queue", "abandoned"), 1);
    assert_eq!(int(&c, "sessions", "active"), 1);
    // The next request after the slow one is served; the abandoned one never
    // reaches the origin.
    gate.add_permits(2);
    assert_eq!(parse_response(&slow.await.expect("join")).status, 200);
    let raw = raw_request(addr, &get(&origin, "/next", "Connection: close\r\n")).await;
    assert_eq!(parse_response(&raw).status, 200);
    let paths: Vec<String> = origin.requests().iter().map(|r| r.uri.path().to_string()).collect();
    assert_eq!(paths, ["/slow", "/next"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_leaves_behind_its_unread_body_is_dropped() {
    // Nothing of the body is read while the request waits for a place
    // (but what came with the head): the client's FIN comes in behind the
    // rest, unread, and is seen there.
    let (origin, gate, p, slow) = one_request_in_service().await;
    let addr = p.addr();
    let o = origin.addr();
    let mut leaving = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = vec![b'x'; 64 << 10];
    let head = format!(
        "POST http://{o}/upload HTTP/1.1\r\nHost: {o}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    leaving
        .write_all(&[head.as_bytes(), &body].concat())
        .await
        .expect("send");
    stats_when(&p, "a queued request", |c| c["connection_queue"]["current"] == 1).await;
    let me = leaving.local_addr().expect("local_addr");
    let unread = server_side(addr, me).expect("the kernel knows the connection").unread;
    assert!(unread > 0, "the body is not all in Portico's hands");
    drop(leaving);
    let c = stats_when(&p, "the queue emptied", |c| c["connection_queue"]["current"] == 0).await;
    assert_eq!(int(&c, "connection_queue", "abandoned"), 1);
    gate.add_permits(1);
    assert_eq!(parse_response(&slow.await.expect("join")).status, 200);
    let paths: Vec<String> = origin.requests().iter().map(|r| r.uri.path().to_string()).collect();
    assert_eq!(paths, ["/slow"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_ends_without_lingering_only_when_nothing_more_was_sent() {
    // A `Connection: close` request read whole, with nothing after it, is
    // closed outright; but a client that sends more while its response is
    // on the way (here: 32 MiB it is slow to read) must still get all of it:
    // closing on its unread bytes would send a reset that can destroy the
    // response's tail in the client's buffers. The body is larger than the
    // socket buffers can hold (autotuned up to tcp_wmem's 4 MiB), so the
    // junk arrives while Portico is still writing: with 4 MiB, a loaded
    // machine sometimes let Portico finish and close first, and a client
    // that sends after that is reset whatever the server does.
    const BIG: usize = 32 << 20;
    let origin = Origin::start(|_req| async move { Response::ok("").generated(BIG as u64) }).await;
    let p = proxy("[cache]\nenabled = false\n").await;
    for junk in [false, true] {
        let mut s = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
        let r = close_request_then_junk(&mut s, &get(&origin, "/big", "Connection: close\r\n"), junk)
            .await
            .unwrap_or_else(|e| panic!("junk {junk}: {e}"));
        assert_eq!(r.status, 200, "junk {junk}");
        assert_eq!(r.body.len(), BIG, "junk {junk}: the response was cut");
    }
}

/// Sends `n` slow GETs (each on its own connection, `Connection: close`)
/// for `/slowI` through `addr`, answered when the test opens the gate.
fn slow_requests(addr: std::net::SocketAddr, origin: &Origin, n: usize) -> Vec<tokio::task::JoinHandle<Vec<u8>>> {
    (0..n)
        .map(|i| {
            let req = get(origin, &format!("/slow{i}"), "Connection: close\r\n");
            tokio::spawn(async move { raw_request_timeout(addr, &req, Duration::from_secs(60)).await })
        })
        .collect()
}

/// Open-files limit for the descriptor tests: `usable` = 192, so a derived
/// `max_requests` of 32 and a queue of 24.
const SMALL_NOFILE: u64 = 256;

/// A forward proxy without a cache, started with [`SMALL_NOFILE`]
/// descriptors; `server` is more `[server]` keys.
async fn small_proxy(server: &str) -> Portico {
    let addr = free_addr();
    Portico::start_with_open_files(
        &format!(
            "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[server]\n{server}\n\n[cache]\nenabled = false\n"
        ),
        SMALL_NOFILE,
    )
    .await
}

/// Waits for every request of [`slow_requests`] and checks it got a 200.
async fn all_ok(waiting: Vec<tokio::task::JoinHandle<Vec<u8>>>) {
    for t in waiting {
        assert_eq!(parse_response(&t.await.expect("join")).status, 200);
    }
}

/// The descriptor table's size, from /proc/PID/status (`FDSize`).
fn fd_table_size(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no FDSize in {status}"))
}

/// Growing the table while serving makes Linux wait for an RCU grace
/// period in the `accept` or `open` that needs the room (7-16 ms a time on
/// the bench machine, a stall of every connection of the thread): the
/// table holds the open-files limit from the start. Without it, this idle
/// proxy's table held 256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_descriptor_table_holds_the_open_files_limit_from_the_start() {
    let nofile = 1_000;
    let addr = free_addr();
    let p = Portico::start_with_open_files(
        &format!("[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[cache]\nenabled = false\n"),
        nofile,
    )
    .await;
    let size = fd_table_size(p.pid());
    assert!(size >= nofile, "FDSize {size}, open-files limit {nofile}");
    // The descriptor that grew it (the highest the limit allows) is closed,
    // and the proxy serves.
    let highest = format!("/proc/{}/fd/{}", p.pid(), nofile - 1);
    assert!(!std::path::Path::new(&highest).exists(), "{highest} is open");
    let c = stats_snapshot(&p).await;
    assert!(int(&c, "server", "open_fds") < 64, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_derived_limit_admits_beyond_itself_while_descriptors_are_free() {
    // The split behind a derived limit reserves three descriptors for each
    // request in service; these hold two (client, origin). Before
    // descriptor-aware admission, 16 of the 48 waited in the queue.
    let (origin, gate, arrived) = gated_origin().await;
    let p = small_proxy("").await;
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "sessions", "limit"), 32, "{c}");
    assert_eq!(int(&c, "connection_queue", "limit"), 24, "{c}");

    let waiting = slow_requests(p.addr(), &origin, 48);
    until_arrived(&arrived, 48).await;
    assert_eq!(arrived.load(Ordering::SeqCst), 48, "every request reached the origin");
    let c = stats_snapshot(&p).await;
    assert_eq!(int(&c, "sessions", "active"), 48, "{c}");
    let q = "connection_queue";
    assert_eq!(int(&c, q, "admitted_beyond_limit"), 16, "{c}");
    assert_eq!(int(&c, q, "total_queued"), 0, "{c}");
    gate.add_permits(48);
    all_ok(waiting).await;
    let label = "Admitted Beyond The Limit";
    assert_eq!(perf_line(&p, label).await, format!("{label:<40} 16"));
    let metrics = page(&p, "/metrics").await;
    assert!(
        metrics.contains("\nportico_connection_queue_admitted_beyond_limit_total 16\n"),
        "{metrics}"
    );

    // A limit the config sets stays a wall: 32 in service, the rest queued.
    let (origin, gate, arrived) = gated_origin().await;
    let p = small_proxy("max_requests = 32").await;
    let waiting = slow_requests(p.addr(), &origin, 48);
    let c = stats_when(&p, "16 queued", |c| c["connection_queue"]["current"] == 16).await;
    assert_eq!(int(&c, "sessions", "active"), 32, "{c}");
    until_arrived(&arrived, 32).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        arrived.load(Ordering::SeqCst),
        32,
        "a queued request reached the origin"
    );
    assert_eq!(int(&c, "connection_queue", "admitted_beyond_limit"), 0, "{c}");
    gate.add_permits(48);
    all_ok(waiting).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_a_derived_limit_descriptors_run_short_as_busy_503s_never_as_failures() {
    // 150 clients at once against 256 descriptors: each holds one, and each
    // request in service one more for its origin. Admission stops where the
    // descriptors would run short (with the headroom kept for accepting),
    // the queue takes what it can, and the rest get the busy 503 at once;
    // nobody gets a 502 from a connect that found no descriptor, and every
    // admitted request is answered.
    let (origin, gate, arrived) = gated_origin().await;
    let p = small_proxy("").await;
    let waiting = slow_requests(p.addr(), &origin, 150);
    let c = stats_when(&p, "a full queue", |c| c["connection_queue"]["current"] == 24).await;
    let in_service = int(&c, "sessions", "active");
    assert!((32..150 - 24).contains(&(in_service as usize)), "{c}");
    gate.add_permits(1000);
    let mut statuses = std::collections::BTreeMap::new();
    for t in waiting {
        *statuses
            .entry(parse_response(&t.await.expect("join")).status)
            .or_insert(0) += 1;
    }
    let served = statuses.get(&200).copied().unwrap_or(0);
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        vec![200, 503],
        "{statuses:?}"
    );
    assert_eq!(served, arrived.load(Ordering::SeqCst), "{statuses:?}");
    assert!(served >= in_service as usize + 24, "{statuses:?} {c}");
    assert!(p.stderr().find("accept failed").is_none(), "{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_is_handed_to_portico_once_its_client_speaks() {
    // `listener.defer_accept` (TCP_DEFER_ACCEPT, on by default): the kernel
    // completes the handshake but queues the connection for `accept` only
    // when its first bytes arrive, so Portico's first read finds them.
    let origin = fast_origin().await;
    let p = proxy("[cache]\nenabled = false\n").await;
    let mut s = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    let client = s.local_addr().expect("local_addr");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = server_side(p.addr(), client).expect("the kernel knows the connection");
    assert_eq!(
        waiting.state, 3,
        "a silent client's connection is not queued for accept yet: {waiting:?}"
    );
    s.write_all(&get(&origin, "/a", "Connection: close\r\n"))
        .await
        .expect("write");
    let mut raw = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut s, &mut raw)
        .await
        .expect("read");
    assert_eq!(parse_response(&raw).status, 200);

    // Off: the connection is Portico's (accepted, an open socket) at once.
    let p = proxy_with("[cache]\nenabled = false\n", "defer_accept = \"0s\"").await;
    let s = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    let client = s.local_addr().expect("local_addr");
    let side = server_side_when(p.addr(), client, |s| s.is_some_and(|s| s.inode != 0)).await;
    assert!(
        side.is_some_and(|s| s.state == 1 && s.inode != 0),
        "defer_accept = 0s: accepted at once: {side:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_connects_and_stays_silent_is_still_accepted_and_timed_out() {
    // The kernel holds a silent client for about `defer_accept`, then
    // queues it anyway (Linux since 2.6.32): Portico sees it and closes it
    // after `header_timeout` as any other silent client; none is left
    // hanging in the handshake.
    let p = proxy("[limits]\nheader_timeout = \"1s\"\n").await;
    let mut s = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    let client = s.local_addr().expect("local_addr");
    let first = server_side(p.addr(), client);
    assert!(first.is_some_and(|s| s.state == 3), "deferred first: {first:?}");
    let side = server_side_when(p.addr(), client, |s| s.is_some_and(|s| s.inode != 0)).await;
    assert!(
        side.is_some_and(|s| s.state == 1),
        "accepted after the deferral: {side:?}"
    );
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), tokio::io::AsyncReadExt::read(&mut s, &mut buf))
        .await
        .expect("closed after header_timeout")
        .unwrap_or(0);
    assert_eq!(n, 0, "nothing but the close");
    stats_when(&p, "one header timeout", |c| c["keepalive"]["header_timeouts"] == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_handed_over_silent_is_served_when_it_speaks() {
    // On a listener that defers accepts a new connection normally brings
    // its request; one the kernel handed over without data (the deferral
    // ran out) must still be waited for, its request in two parts here.
    let origin = fast_origin().await;
    let p = proxy("[cache]\nenabled = false\n").await;
    let mut s = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    let client = s.local_addr().expect("local_addr");
    let side = server_side_when(p.addr(), client, |s| s.is_some_and(|s| s.inode != 0)).await;
    assert!(side.is_some_and(|s| s.inode != 0), "accepted without data: {side:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let request = get(&origin, "/late", "Connection: close\r\n");
    let (head, rest) = request.split_at(10);
    s.write_all(head).await.expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(rest).await.expect("write");
    let mut raw = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut s, &mut raw)
        .await
        .expect("read");
    assert_eq!(parse_response(&raw).status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_turns_defer_accept_off_applies_to_the_connections_after_it() {
    let origin = fast_origin().await;
    let addr = free_addr();
    let config = |defer: &str| {
        format!(
            "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\ndefer_accept = \"{defer}\"\n\n[cache]\nenabled = false\n"
        )
    };
    let p = Portico::start(&config("1s")).await;
    p.rewrite_config(&config("0s"));
    p.signal(libc::SIGHUP);
    // The accept loop takes the new value with the next connection it
    // accepts (a request), and the kernel applies it to those after that.
    let mut silent = None;
    for _ in 0..50 {
        assert_eq!(
            parse_response(&raw_request(p.addr(), &get(&origin, "/a", "Connection: close\r\n")).await).status,
            200
        );
        let s = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
        tokio::time::sleep(Duration::from_millis(200)).await;
        silent = server_side(p.addr(), s.local_addr().expect("local_addr"));
        if silent.is_some_and(|side| side.inode != 0) {
            break;
        }
    }
    assert!(
        silent.is_some_and(|s| s.state == 1 && s.inode != 0),
        "after the reload a silent client is accepted at once: {silent:?}"
    );
}

#[test]
fn a_defer_accept_longer_than_a_minute_is_refused_with_its_line_and_key() {
    let out = Portico::check("[[listener]]\naddress = \"127.0.0.1:1\"\ndefer_accept = \"2min\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("portico.toml:3") && err.contains("defer_accept"), "{err}");
    let out = Portico::check("[[listener]]\naddress = \"127.0.0.1:1\"\ndefer_accept = \"soon\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("defer_accept"), "{err}");
}

/// `limits.max_connections_per_client` (Squid's `client_ip_max_connections`):
/// a client holding the cap gets its next connection closed before
/// anything is read or answered; other clients are served; a connection it
/// closes gives its place back. Counted, and logged naming the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_its_connection_cap_is_closed_and_others_are_served() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[log]\nerror = \"{{dir}}/error.log\"\n\n\
         [limits]\nmax_connections_per_client = 3\n",
        free_addr()
    ))
    .await;
    let capped: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let req = get(&origin, "/", "");
    // Three keep-alive connections, each served once: held open.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = RawClient::connect_from(capped, p.addr()).await;
        c.send(&req).await;
        assert_eq!(c.read_response().await.status, 200);
        held.push(c);
    }
    // The fourth: closed unanswered.
    let fourth = raw_request_from(capped, p.addr(), &req).await;
    assert!(fourth.is_empty(), "answered: {:?}", String::from_utf8_lossy(&fourth));
    // Another client is served; so is the capped one on its open connections.
    let close = get(&origin, "/", "Connection: close\r\n");
    assert_eq!(parse_response(&raw_request(p.addr(), &close).await).status, 200);
    held[0].send(&req).await;
    assert_eq!(held[0].read_response().await.status, 200);
    // One closed: a new connection takes its place.
    drop(held.pop());
    let mut served = false;
    for _ in 0..50 {
        let r = raw_request_from(capped, p.addr(), &close).await;
        if !r.is_empty() {
            assert_eq!(parse_response(&r).status, 200);
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the closed connection's place was not given back");
    let n = refusals_reported(
        &p,
        "Closed Over Client Limit",
        "portico_connection_queue_client_limited_total",
        "client-connection-cap",
        "limits.max_connections_per_client = 3",
    )
    .await;
    assert!(n >= 1);
}

/// How the refusals a per-client limit made are reported: the count the
/// perfdump's `label` line gives, after checking that `/metrics`' `series`
/// agrees, that the advisor speaks (`rule`), and that the error log names
/// the client (127.0.0.2) and the setting (`setting`).
async fn refusals_reported(p: &Portico, label: &str, series: &str, rule: &str, setting: &str) -> u64 {
    let line = perf_line(p, label).await;
    let n: u64 = line[label.len()..].trim().parse().expect("a count");
    assert_eq!(line, format!("{label:<40} {n}"));
    assert_eq!(metric(p, series).await, n);
    assert!(page(p, "/.perf").await.contains(&format!("[{rule}]")));
    let log = std::fs::read_to_string(p.dir().join("error.log")).expect("error log");
    assert!(log.contains("127.0.0.2") && log.contains(setting), "{log}");
    n
}

#[test]
fn a_connection_cap_above_a_million_is_refused() {
    let out =
        Portico::check("[[listener]]\naddress = \"127.0.0.1:1\"\n\n[limits]\nmax_connections_per_client = 1000001\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("limits.max_connections_per_client"),
        "{err}"
    );
}

/// The cap is set by a reload (SIGHUP) and holds on every listener, a
/// SOCKS one included: one client's connections are counted over all of
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_sets_the_connection_cap_and_it_counts_over_every_listener() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let (http, socks) = (free_addr(), free_addr());
    let config = |cap: u32| {
        format!(
            "[[listener]]\naddress = \"{http}\"\n\n[[listener]]\naddress = \"{socks}\"\nmode = \"socks\"\n\n\
             [limits]\nmax_connections_per_client = {cap}\n"
        )
    };
    let p = Portico::start(&config(0)).await;
    p.rewrite_config(&config(2));
    p.signal(libc::SIGHUP);
    let capped: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let socks: std::net::SocketAddr = socks.parse().expect("address");
    let hold_http = || async {
        let mut c = RawClient::connect_from(capped, p.addr()).await;
        c.send(&get(&origin, "/", "")).await;
        assert_eq!(c.read_response().await.status, 200);
        c
    };
    let third = || async { raw_request_from(capped, p.addr(), &get(&origin, "/", "Connection: close\r\n")).await };
    // Until the reload is in force, a third connection is served.
    let mut reloaded = false;
    for _ in 0..50 {
        let held = (hold_http().await, hold_http().await);
        if third().await.is_empty() {
            reloaded = true;
            break;
        }
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reloaded,
        "a third connection was still served after the reload\n{}",
        p.stderr()
    );
    // Every place given back (a new connection is served again), then one
    // HTTP and one SOCKS connection are the client's two.
    let mut free = false;
    for _ in 0..50 {
        if !third().await.is_empty() {
            free = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(free, "the closed connections' places were not given back");
    // The check's own connection gives its place back once the server has
    // closed it, shortly after the client saw the close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _http = hold_http().await;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::new(capped, 0))
        .expect("bind 127.0.0.2");
    let mut s = socket.connect(socks).await.expect("connect to SOCKS");
    s.write_all(&[5, 1, 0]).await.expect("greeting");
    let mut method = [0u8; 2];
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_exact(&mut s, &mut method),
    )
    .await
    .expect("a method in time")
    .expect("read the method");
    assert_eq!(method, [5, 0], "SOCKS method");
    let r = third().await;
    assert!(r.is_empty(), "served past the cap: {}", String::from_utf8_lossy(&r));
}

/// `limits.client_request_rate` and `client_request_burst` (nginx's
/// `limit_req` with `burst` and `nodelay`): a client's burst goes through,
/// the requests past it get 429 with `Retry-After` on the same keep-alive
/// connection, other clients are served, and the bucket refills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_request_rate_gets_429_and_others_are_served() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[log]\naccess = \"{{dir}}/access.log\"\nerror = \"{{dir}}/error.log\"\n\n\
         [cache]\nenabled = false\n\n[limits]\nclient_request_rate = 2\nclient_request_burst = 3\n\n\
         [access]\nallow = [\"127.0.0.1\", \"127.0.0.2\"]\n",
        free_addr()
    ))
    .await;
    let limited: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let mut c = RawClient::connect_from(limited, p.addr()).await;
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..8 {
        c.send(&get(&origin, "/", "")).await;
        let r = c.read_response().await;
        if r.status == 429 {
            retry_after = r.header("retry-after").map(str::to_string);
        }
        statuses.push(r.status);
    }
    // The burst of 3 first, then refused: the bucket refills at 2 a second,
    // a request per 500 ms, far slower than these are sent.
    assert_eq!(&statuses[..4], [200, 200, 200, 429], "{statuses:?}");
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert!(refused >= 2, "{statuses:?}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(origin.count(), 8 - refused, "a refused request reached the origin");
    // Another client is served meanwhile; one access.allow refuses gets its
    // 403 every time, never a 429.
    let close = get(&origin, "/", "Connection: close\r\n");
    assert_eq!(parse_response(&raw_request(p.addr(), &close).await).status, 200);
    let outsider: std::net::IpAddr = "127.0.0.3".parse().expect("ip");
    for _ in 0..6 {
        let r = parse_response(&raw_request_from(outsider, p.addr(), &close).await);
        assert_eq!(r.status, 403);
    }
    // A second later the bucket has a request again, on the same connection.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    c.send(&get(&origin, "/", "")).await;
    assert_eq!(c.read_response().await.status, 200);
    let reported = refusals_reported(
        &p,
        "Refused Over Client Rate",
        "portico_connection_queue_client_rate_limited_total",
        "client-request-rate",
        "limits.client_request_rate = 2",
    )
    .await;
    assert_eq!(reported, refused as u64);
    let access = std::fs::read_to_string(p.dir().join("access.log")).expect("access log");
    assert_eq!(access.matches("\" 429 ").count(), refused, "{access}");
}

/// A `[[rule]]`'s `request_rate` and `request_burst` (nginx's `limit_req`
/// in a `location`): the route's requests past a client's burst get 429
/// on the same keep-alive connection, the client's other requests and
/// other clients on the route are served, a later rule may lift it, and
/// a CONNECT matched by the rule counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_routes_request_rate_gets_429_on_that_route_alone() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let o = origin.addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[log]\naccess = \"{{dir}}/access.log\"\nerror = \"{{dir}}/error.log\"\n\n\
         [cache]\nenabled = false\n\n[proxy]\nconnect_ports = [{}]\n\n\
         [[rule]]\npath = \"/login\"\nrequest_rate = 1\nrequest_burst = 3\ncontinue = true\n\n\
         [[rule]]\npath = \"/login\"\nclient = \"127.0.0.4\"\nrequest_rate = 0\ncontinue = true\n\n\
         [[rule]]\nmethod = \"CONNECT\"\nrequest_rate = 1\n",
        free_addr(),
        o.port()
    ))
    .await;
    let limited: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let mut c = RawClient::connect_from(limited, p.addr()).await;
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for path in ["/login", "/login", "/login", "/login", "/home", "/login", "/home"] {
        c.send(&get(&origin, path, "")).await;
        let r = c.read_response().await;
        if r.status == 429 {
            retry_after = r.header("retry-after").map(str::to_string);
            assert!(r.body_str().contains("request_rate"), "{}", r.body_str());
        }
        statuses.push(r.status);
    }
    // The burst of 3, then refused on /login alone, far faster than the
    // bucket refills (a request a second).
    assert_eq!(statuses, [200, 200, 200, 429, 200, 429, 200]);
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(origin.count(), 5, "a refused request reached the origin");
    // Another client has its own bucket on the route; one a later rule
    // lifts it for has none.
    let close = get(&origin, "/login", "Connection: close\r\n");
    for (from, n) in [("127.0.0.3", 3), ("127.0.0.4", 6)] {
        let from: std::net::IpAddr = from.parse().expect("ip");
        for _ in 0..n {
            let r = parse_response(&raw_request_from(from, p.addr(), &close).await);
            assert_eq!(r.status, 200, "{from}");
        }
    }
    // A CONNECT matched by a rule counts once: the second within a second
    // is refused before anything is connected.
    let connect = format!("CONNECT {o} HTTP/1.1\r\nHost: {o}\r\n\r\n");
    let mut tunnel = RawClient::connect_from("127.0.0.5".parse().expect("ip"), p.addr()).await;
    tunnel.send(connect.as_bytes()).await;
    assert_eq!(tunnel.read_head_response().await.status, 200);
    let mut again = RawClient::connect_from("127.0.0.5".parse().expect("ip"), p.addr()).await;
    again.send(connect.as_bytes()).await;
    assert_eq!(again.read_head_response().await.status, 429);
    // A second later the bucket has a request again, on the same connection.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    c.send(&get(&origin, "/login", "")).await;
    assert_eq!(c.read_response().await.status, 200);
    let reported = refusals_reported(
        &p,
        "Refused Over Route Rate",
        "portico_connection_queue_route_rate_limited_total",
        "route-request-rate",
        "rule[0].request_rate = 1",
    )
    .await;
    assert_eq!(reported, 3);
    let access = std::fs::read_to_string(p.dir().join("access.log")).expect("access log");
    assert_eq!(access.matches("\" 429 ").count(), 3, "{access}");
    // The client limit's counter is not the route's.
    assert_eq!(
        metric(&p, "portico_connection_queue_client_rate_limited_total").await,
        0
    );
}

/// A request that finds every service place taken is refused before it
/// waits for one when its route's bucket is empty, not after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_its_routes_rate_is_refused_before_it_waits_for_a_place() {
    let origin = Origin::start(|req| async move {
        if req.uri.path() == "/slow" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Response::ok("served")
    })
    .await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[server]\nmax_requests = 1\n\n[cache]\nenabled = false\n\n\
         [[rule]]\npath = \"/login\"\nrequest_rate = 1\ncontinue = true\n\n\
         [[rule]]\npath = \"/login/closed\"\ndeny = 403\n\n\
         [[rule]]\npath = \"/report\"\ntotal_request_rate = 1\n",
        free_addr()
    ))
    .await;
    let limited: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let login = get(&origin, "/login", "Connection: close\r\n");
    let r = parse_response(&raw_request_from(limited, p.addr(), &login).await);
    assert_eq!(r.status, 200, "the burst of 1");
    // Another client spends the total of /report.
    let report = get(&origin, "/report", "Connection: close\r\n");
    let other: std::net::IpAddr = "127.0.0.3".parse().expect("ip");
    assert_eq!(
        parse_response(&raw_request_from(other, p.addr(), &report).await).status,
        200
    );
    // Another client's slow request holds the one place for 3 s.
    let slow = get(&origin, "/slow", "Connection: close\r\n");
    let addr = p.addr();
    let holder = tokio::spawn(async move { parse_response(&raw_request(addr, &slow).await).status });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The total of all clients first: it refills at 1 a second.
    let start = std::time::Instant::now();
    let r = parse_response(&raw_request_from(limited, p.addr(), &report).await);
    let took = start.elapsed();
    assert_eq!(r.status, 503);
    assert!(r.body_str().contains("total_request_rate"), "{}", r.body_str());
    assert!(
        took < Duration::from_secs(2),
        "refused after waiting {took:?} for a place"
    );
    let start = std::time::Instant::now();
    let r = parse_response(&raw_request_from(limited, p.addr(), &login).await);
    let took = start.elapsed();
    assert_eq!(r.status, 429);
    assert!(
        took < Duration::from_secs(2),
        "refused after waiting {took:?} for a place"
    );
    // A rule's own answer comes first, before the queue as after it.
    let closed = get(&origin, "/login/closed", "Connection: close\r\n");
    let r = parse_response(&raw_request_from(limited, p.addr(), &closed).await);
    assert_eq!(r.status, 403);
    assert_eq!(holder.await.expect("slow request"), 200);
    assert_eq!(metric(&p, "portico_connection_queue_route_rate_limited_total").await, 1);
    assert_eq!(
        metric(&p, "portico_connection_queue_route_total_rate_limited_total").await,
        1
    );
}

/// A `[[rule]]`'s `total_request_rate` (nginx's `limit_req` keyed by
/// `$server_name`): one bucket for all the route's clients, past which a
/// request gets 503 with `Retry-After`, whoever sends it. A client's own
/// `request_rate` is counted first (its 429 takes nothing from the
/// total), and a request the total refuses takes nothing from its client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_total_request_rate_refuses_every_client_with_503_once_spent() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[log]\naccess = \"{{dir}}/access.log\"\nerror = \"{{dir}}/error.log\"\n\n\
         [cache]\nenabled = false\n\n\
         [[rule]]\npath = \"/search\"\nrequest_rate = 1\nrequest_burst = 2\ntotal_request_rate = 1\ntotal_request_burst = 3\n",
        free_addr()
    ))
    .await;
    let (first, second): (std::net::IpAddr, std::net::IpAddr) =
        ("127.0.0.3".parse().expect("ip"), "127.0.0.2".parse().expect("ip"));
    let mut a = RawClient::connect_from(first, p.addr()).await;
    let mut b = RawClient::connect_from(second, p.addr()).await;
    let mut statuses = Vec::new();
    for (from_first, path) in [
        (true, "/search"),
        (true, "/search"),
        (true, "/search"),
        (false, "/search"),
        (false, "/search"),
        (false, "/search"),
        (false, "/home"),
    ] {
        let c = if from_first { &mut a } else { &mut b };
        c.send(&get(&origin, path, "")).await;
        let r = c.read_response().await;
        if r.status == 503 {
            assert_eq!(r.header("retry-after"), Some("1"));
            assert!(r.body_str().contains("total_request_rate"), "{}", r.body_str());
        }
        statuses.push(r.status);
    }
    // The first client spends its own burst of 2, then its bucket refuses
    // it (429), taking nothing from the total (3): the second client gets
    // the last one. Then the total refuses it (503), taking nothing from
    // its own bucket, or the third would be a 429 (its bucket of 2, one
    // spent). Another route is served.
    assert_eq!(statuses, [200, 200, 429, 200, 503, 503, 200]);
    assert_eq!(origin.count(), 4, "a refused request reached the origin");
    // A second later the bucket has a request again, for either client.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    b.send(&get(&origin, "/search", "")).await;
    assert_eq!(b.read_response().await.status, 200);
    let reported = refusals_reported(
        &p,
        "Refused Over Route Total Rate",
        "portico_connection_queue_route_total_rate_limited_total",
        "route-total-request-rate",
        "rule[0].total_request_rate = 1",
    )
    .await;
    assert_eq!(reported, 2);
    assert_eq!(metric(&p, "portico_connection_queue_route_rate_limited_total").await, 1);
    let access = std::fs::read_to_string(p.dir().join("access.log")).expect("access log");
    assert_eq!(access.matches("\" 503 ").count(), 2, "{access}");
}

/// A reload that leaves the `[[rule]]` list as it was keeps a route's
/// buckets (a client over its rate stays over it); one that changes a
/// rule starts them full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_a_routes_buckets_unless_the_rules_change() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let addr = free_addr();
    let config = |extra: &str| {
        format!(
            "[[listener]]\naddress = \"{addr}\"\n\n[cache]\nenabled = false\n\n\
             [[rule]]\npath = \"/login\"\nrequest_rate = 1\n{extra}"
        )
    };
    let p = Portico::start(&config("")).await;
    let limited: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let login = get(&origin, "/login", "Connection: close\r\n");
    let status = || async { parse_response(&raw_request_from(limited, p.addr(), &login).await).status };
    assert_eq!((status().await, status().await), (200, 429));
    // The same rules (another section changed): the bucket is still empty.
    p.reload(&format!("{}\n[limits]\nheader_timeout = \"9s\"\n", config("")))
        .await;
    assert_eq!(status().await, 429);
    // A rule changed: full buckets.
    p.reload(&config("request_burst = 2\n")).await;
    assert_eq!((status().await, status().await), (200, 200));
}

/// An `[[acl]]` entry a reload reads after it compiled the rules, and
/// refuses.
const BAD_ACL: &str = "\n[[acl]]\naction = \"deny\"\nhost_regex = \"(\"\n";

/// How many of `n` requests `req` through `p`, one after another, are served (200).
async fn served_of(p: &Portico, req: &[u8], n: usize) -> usize {
    let mut served = 0;
    for _ in 0..n {
        served += usize::from(parse_response(&raw_request(p.addr(), req).await).status == 200);
    }
    served
}

/// A reload that fails after it compiled a changed rule list (here an
/// `[[acl]]` entry it reads later is invalid) leaves the running route's
/// `total_request_rate` bucket as it was, and so does a reload back to the
/// running rules; one that changes them puts the new rules in force with a
/// full bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reload_leaves_a_routes_total_bucket_and_a_good_one_fills_it() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let addr = free_addr();
    let config = |burst: u32, extra: &str| {
        format!(
            "[[listener]]\naddress = \"{addr}\"\n\n[cache]\nenabled = false\n\n\
             [[rule]]\npath = \"/report\"\ntotal_request_rate = 1\ntotal_request_burst = {burst}\n{extra}"
        )
    };
    let p = Portico::start(&config(2, "")).await;
    let report = get(&origin, "/report", "Connection: close\r\n");
    let status = || async { parse_response(&raw_request(p.addr(), &report).await).status };
    let spent = std::time::Instant::now();
    assert_eq!((status().await, status().await, status().await), (200, 200, 503));
    let said = p.reload_refused(&config(3, BAD_ACL)).await;
    assert!(said.contains("host_regex"), "{said}");
    let served = served_of(&p, &report, 3).await;
    // Only what the rate gave back since the burst was spent, one a
    // second (a refilled bucket would have served 2 at once).
    let given = spent.elapsed().as_secs_f64().floor() as usize;
    assert!(served <= given, "{served} served {given} s after the burst was spent");
    // Nor does a reload back to the rules in force (compiled anew: the
    // failed reload's list took the compile cache's one place).
    p.reload(&config(2, "")).await;
    let served_too = served_of(&p, &report, 3).await;
    let given = spent.elapsed().as_secs_f64().floor() as usize;
    assert!(
        served + served_too <= given,
        "{} served {given} s after the burst was spent",
        served + served_too
    );
    // A good reload of changed rules: full, at its new burst.
    p.reload(&config(3, "")).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(status().await);
    }
    assert_eq!(statuses, [200, 200, 200]);
}

/// The same for a route's per-client `request_rate`: a reload back to the
/// rules in force, after one that failed with other rules, keeps the
/// clients' buckets (named by the rule list's hash, however compiled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_back_to_the_rules_in_force_after_a_failed_one_keeps_the_clients_buckets() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let addr = free_addr();
    let config = |burst: u32, extra: &str| {
        format!(
            "[[listener]]\naddress = \"{addr}\"\n\n[cache]\nenabled = false\n\n\
             [[rule]]\npath = \"/login\"\nrequest_rate = 1\nrequest_burst = {burst}\n{extra}"
        )
    };
    let p = Portico::start(&config(2, "")).await;
    let login = get(&origin, "/login", "Connection: close\r\n");
    let status = || async { parse_response(&raw_request(p.addr(), &login).await).status };
    let spent = std::time::Instant::now();
    assert_eq!((status().await, status().await, status().await), (200, 200, 429));
    let said = p.reload_refused(&config(3, BAD_ACL)).await;
    assert!(said.contains("host_regex"), "{said}");
    p.reload(&config(2, "")).await;
    let served = served_of(&p, &login, 3).await;
    // Only what the rate gave back since the burst was spent, one a
    // second (buckets started anew would have served 2 at once).
    let given = spent.elapsed().as_secs_f64().floor() as usize;
    assert!(served <= given, "{served} served {given} s after the burst was spent");
}

#[test]
fn a_routes_request_burst_without_a_rate_or_a_rate_over_a_million_is_refused() {
    for (rule, key) in [
        ("request_burst = 10", "rule[0].request_burst"),
        ("request_rate = 0\nrequest_burst = 10", "rule[0].request_burst"),
        ("request_rate = 1000001", "rule[0].request_rate"),
        ("total_request_burst = 10", "rule[0].total_request_burst"),
        (
            "total_request_rate = 0\ntotal_request_burst = 10",
            "rule[0].total_request_burst",
        ),
        ("total_request_rate = 1000001", "rule[0].total_request_rate"),
    ] {
        let out = Portico::check(&format!("[[rule]]\npath = \"/\"\n{rule}\n"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(key), "{rule}: {err}");
    }
}

#[test]
fn a_request_burst_without_a_rate_is_refused() {
    let out = Portico::check("[[listener]]\naddress = \"127.0.0.1:1\"\n\n[limits]\nclient_request_burst = 10\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("limits.client_request_burst") && err.contains("client_request_rate"),
        "{err}"
    );
}

/// `limits.client_table` sizes the per-client tables: with room for 1,024
/// clients, 1,100 clients each holding a connection open cannot all have a
/// place in the shared table of connection counts; those without one are
/// counted by their process apart, counted in the statistics, and the
/// advisor says to raise the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_table_too_small_for_the_clients_is_counted_and_advised_on() {
    assert!(
        raise_own_open_files() >= 1300,
        "too few descriptors for 1,100 connections"
    );
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\ndefer_accept = \"0s\"\n\n[log]\nerror = \"{{dir}}/error.log\"\n\n\
         [limits]\nmax_connections_per_client = 10\nclient_table = 1024\nheader_timeout = \"1min\"\n",
        free_addr()
    ))
    .await;
    // 127.0.0.1, which asks for the statistics below, has its place
    // before the table fills (the statistics' own connections would
    // otherwise be counted apart too).
    let mut first = RawClient::connect(p.addr()).await;
    first.send(b"GET /.perf HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(first.read_response().await.status, 200);
    let mut held = Vec::new();
    for i in 0..1100u32 {
        let src = std::net::IpAddr::from([127, 1, (i / 250) as u8, (i % 250 + 1) as u8]);
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(std::net::SocketAddr::new(src, 0)).expect("bind");
        held.push(socket.connect(p.addr()).await.expect("connect"));
    }
    // At least 76 found no place, maybe more: 8 places a client. Read
    // once every connection is accepted (the count has stopped growing).
    let label = "Connections Counted Apart";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = None;
    let apart = loop {
        let line = perf_line(&p, label).await;
        let n: u64 = line[label.len()..].trim().parse().expect("a count");
        if (n >= 76 && last == Some(n)) || std::time::Instant::now() > deadline {
            break n;
        }
        last = Some(n);
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!((76..1100).contains(&apart), "{apart} counted apart");
    assert_eq!(
        metric(&p, "portico_connection_queue_connections_counted_apart_total").await,
        apart
    );
    assert!(page(&p, "/.perf").await.contains("[client-table]"));
    let log = std::fs::read_to_string(p.dir().join("error.log")).expect("error log");
    assert!(log.contains("limits.client_table = 1024"), "{log}");
    drop((held, first));
}

#[test]
fn a_client_table_below_1024_is_refused_by_name() {
    let out = Portico::check("[[listener]]\naddress = \"127.0.0.1:1\"\n\n[limits]\nclient_table = 100\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("limits.client_table") && err.contains("between 1024"),
        "{err}"
    );
}

/// `ss -tmn`'s `rb` and `tb` (the receive and send buffers the kernel
/// keeps, twice the size asked for) of Portico's side of the established
/// connections to `port`.
fn socket_buffers(port: u16) -> Option<(u64, u64)> {
    let out = std::process::Command::new("ss")
        .args(["-tmnH", "state", "established", "sport", "=", &format!(":{port}")])
        .output()
        .expect("ss (Debian iproute2, scripts/install-test-deps)");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<u64> {
        let at = text.find(name)? + name.len();
        text[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some((field(",rb")?, field(",tb")?))
}

/// `receive_buffer` and `send_buffer` are the socket buffers of the
/// listener's connections (set on the listening socket, which they
/// inherit), as `ss -tm` shows them; a size over the kernel's cap is said
/// at start-up with the sysctl that lifts it, and one over 512 MiB is
/// refused by `portico check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listeners_socket_buffers_are_its_connections() {
    let config = |addr: &str, extra: &str| format!("[[listener]]\naddress = \"{addr}\"\n{extra}");
    let addr = free_addr();
    let p = Portico::start(&config(&addr, "receive_buffer = \"48KiB\"\nsend_buffer = \"24KiB\"\n")).await;
    // An unfinished request head keeps the connection open, accepted.
    let mut c = RawClient::connect(p.addr()).await;
    c.send(b"GET /.perf HTTP/1.1\r\n").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let buffers = loop {
        if let Some(b) = socket_buffers(p.addr().port()) {
            break b;
        }
        assert!(std::time::Instant::now() < deadline, "no established connection in ss");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(buffers, (2 * 48 * 1024, 2 * 24 * 1024));

    // A reload cannot change them (set before listen): said each time.
    let changed = config(&addr, "receive_buffer = \"64KiB\"\nsend_buffer = \"24KiB\"\n");
    for times in 1..=2 {
        p.reload(&changed).await;
        let said = p.until_logged("receive_buffer changed", times).await;
        assert!(said.contains("needs restart; keeping 48KiB"), "{said}");
    }

    // Over the kernel's cap: said, with the sysctl.
    // (Not checked where the network namespace hides the sysctl.)
    let cap = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(cap) = cap.filter(|c| c * 2 <= 512 << 20) {
        let p = Portico::start(&config(&free_addr(), &format!("receive_buffer = \"{}B\"\n", cap * 2))).await;
        let said = p.until_logged("net.core.rmem_max", 1).await;
        assert!(said.contains(&format!("is capped at {cap} by the kernel")), "{said}");
    }

    // Over what a socket buffer may be: refused, naming the key.
    let out = Portico::check(&config("127.0.0.1:1", "send_buffer = \"1GiB\"\n"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("key `listener[0].send_buffer`"),
        "{said}"
    );
}
