//! `origin.max_connections` and `origin.queue_timeout` through the real
//! binary: an origin never has more requests in hand than the cap, the
//! rest wait their turn and are all answered; a wait past the queue
//! timeout is a 503 that never reaches the origin, logged and counted; a
//! request whose client leaves while it waits leaves the line unsent
//! (HTTP/1 hang-up, with or without a request body, also behind body bytes
//! or a pipelined request not read yet; HTTP/2 stream reset;
//! a request collapsed onto it is still answered; `origin.abort_on_close
//! = false` keeps a half-closing client's request); a place is never lost,
//! neither to a client that gives up while waiting nor to an upgraded
//! (WebSocket) connection;
//! through a parent proxy the places are the parent's; a group's own cap
//! holds its servers and no other requests; a stale copy is served when no
//! place frees up.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A forward proxy on a free port with `extra` config.
async fn forward(extra: &str) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n{extra}\n",
        free_addr()
    ))
    .await
}

/// `GET http://origin/path` through the proxy on a connection of its own.
async fn get(p: &Portico, origin: std::net::SocketAddr, path: &str) -> ParsedResponse {
    let request = format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
    let bytes = raw_request(p.addr(), request.as_bytes()).await;
    assert!(!bytes.is_empty(), "no answer to GET {path}");
    parse_response(&bytes)
}

/// An origin that holds every request `hold` before answering it, and
/// the most requests it ever had in hand at once.
async fn holding_origin(hold: Duration) -> (Origin, Arc<AtomicUsize>) {
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (now.clone(), most.clone());
    let origin = Origin::start(move |req| {
        let (n, m) = (n.clone(), m.clone());
        async move {
            let inside = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(inside, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            n.fetch_sub(1, Ordering::SeqCst);
            Response::ok(format!("answer to {}", req.uri))
        }
    })
    .await;
    (origin, most)
}

/// [`get`] on a task of its own, so that the test goes on meanwhile.
fn spawn_get(p: &Arc<Portico>, origin: std::net::SocketAddr, path: &str) -> tokio::task::JoinHandle<ParsedResponse> {
    let (p, path) = (p.clone(), path.to_string());
    tokio::spawn(async move { get(&p, origin, &path).await })
}

/// A forward proxy allowing one connection at a time to the origin
/// (`[origin]` with `max_connections = 1` and `rest`), in front of an
/// origin that holds each request `hold`, its one place taken by `/first`:
/// the proxy, the origin and `/first`'s answer to come.
async fn one_place_taken(
    hold: Duration,
    rest: &str,
) -> (Arc<Portico>, Origin, tokio::task::JoinHandle<ParsedResponse>) {
    let (origin, _) = holding_origin(hold).await;
    let p = Arc::new(forward(&format!("[origin]\nmax_connections = 1\n{rest}")).await);
    let first = spawn_get(&p, origin.addr(), "/first");
    assert!(origin.wait_count(1, Duration::from_secs(5)).await, "/first is in hand");
    (p, origin, first)
}

/// `request` written to the proxy on a connection of its own, left open
/// for the test to hang up, half-close or read.
async fn send_raw(p: &Portico, request: &str) -> TcpStream {
    let mut c = TcpStream::connect(p.addr()).await.expect("connect");
    c.write_all(request.as_bytes()).await.expect("send");
    c
}

/// The targets the origin was asked for, in order.
fn sent(origin: &Origin) -> Vec<String> {
    origin.requests().iter().map(|r| r.uri.to_string()).collect()
}

/// Eight GETs for eight URLs (no collapsing) at once; their answers.
async fn eight_at_once(p: &Arc<Portico>, origin: std::net::SocketAddr) -> Vec<ParsedResponse> {
    let tasks: Vec<_> = (0..8).map(|i| spawn_get(p, origin, &format!("/{i}"))).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_origin_never_has_more_requests_in_hand_than_the_cap_and_all_are_answered() {
    let (origin, most) = holding_origin(Duration::from_millis(400)).await;
    let p = Arc::new(forward("[origin]\nmax_connections = 2\n").await);
    let started = Instant::now();
    let answers = eight_at_once(&p, origin.addr()).await;
    for (i, r) in answers.iter().enumerate() {
        assert_eq!((r.status, r.body_str()), (200, format!("answer to /{i}")));
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "two at a time, never more");
    assert!(origin.connections() <= 2, "{} connections opened", origin.connections());
    // Four turns of 400 ms: the six that waited were answered in turn.
    assert!(
        started.elapsed() >= Duration::from_millis(1590),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(metric(&p, "portico_upstream_queued_total").await, 6);
    assert_eq!(metric(&p, "portico_upstream_queue_timeouts_total").await, 0);
    assert_eq!(metric(&p, "portico_upstream_waiting_requests").await, 0);
    assert_eq!(metric(&p, "portico_upstream_requests_total").await, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_cap_the_origin_gets_every_request_at_once() {
    // The default: what the test above would see without its setting.
    let (origin, most) = holding_origin(Duration::from_millis(600)).await;
    let p = Arc::new(forward("").await);
    let answers = eight_at_once(&p, origin.addr()).await;
    assert!(answers.iter().all(|r| r.status == 200));
    assert!(
        most.load(Ordering::SeqCst) > 2,
        "at most {} at once",
        most.load(Ordering::SeqCst)
    );
    assert_eq!(metric(&p, "portico_upstream_queued_total").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_queue_timeout_is_a_503_that_never_reaches_the_origin() {
    let (origin, _) = holding_origin(Duration::from_millis(1500)).await;
    let p = Arc::new(forward("[origin]\nmax_connections = 1\nqueue_timeout = \"300ms\"\n").await);
    let first = spawn_get(&p, origin.addr(), "/slow");
    assert!(
        origin.wait_count(1, Duration::from_secs(5)).await,
        "the first is in hand"
    );
    let started = Instant::now();
    let refused = get(&p, origin.addr(), "/waits").await;
    let waited = started.elapsed();
    assert_eq!(refused.status, 503, "{}", refused.body_str());
    assert!(
        refused.body_str().contains("connections in use"),
        "the page says why: {}",
        refused.body_str()
    );
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_millis(1400),
        "answered after {waited:?}"
    );
    let slow = first.await.expect("first");
    assert_eq!(slow.status, 200, "the one in hand is unharmed");
    assert_eq!(sent(&origin), ["/slow"], "the refused request was never sent");
    assert_eq!(metric(&p, "portico_upstream_queue_timeouts_total").await, 1);
    assert_eq!(metric(&p, "portico_upstream_requests_total").await, 1);
    let log = access_log_with(p.dir(), "/waits").await;
    let line = log.lines().find(|l| l.contains("/waits")).expect("logged");
    assert!(line.contains(" 503 "), "{line}");
    // The error log says which server and why.
    let errors = p.stderr();
    assert!(
        errors.contains(&format!(
            "/waits: {} has all its 1 connections in use (max_connections) and none was free within 300ms",
            origin.addr()
        )) && errors.contains("status=503"),
        "{errors}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_timeout_of_zero_refuses_at_once() {
    let (origin, _) = holding_origin(Duration::from_millis(2000)).await;
    let p = Arc::new(forward("[origin]\nmax_connections = 1\nqueue_timeout = \"0s\"\n").await);
    let first = spawn_get(&p, origin.addr(), "/held");
    assert!(origin.wait_count(1, Duration::from_secs(5)).await);
    let started = Instant::now();
    assert_eq!(get(&p, origin.addr(), "/now").await.status, 503);
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(first.await.expect("first").status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_while_waiting_costs_no_place() {
    let (p, origin, first) = one_place_taken(Duration::from_millis(400), "queue_timeout = \"3s\"\n").await;
    let o = origin.addr();
    // Three clients queue behind it and hang up before their turn.
    for i in 0..3 {
        let c = send_raw(&p, &format!("GET http://{o}/gone{i} HTTP/1.1\r\nHost: {o}\r\n\r\n")).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(c);
    }
    // They leave the line as their clients go, before any place frees up
    // (as HAProxy's `option abortonclose`).
    stats_when(&p, "three left the line", |s| {
        s["upstream"]["queue_abandoned"] == 3 && s["upstream"]["waiting"] == 0
    })
    .await;
    assert_eq!(first.await.expect("first").status, 200);
    // Had any of them kept its place (or its wait a place), this one would
    // wait out the 3 s queue timeout and get 503.
    let next = get(&p, origin.addr(), "/next").await;
    assert_eq!(next.status, 200);
    assert_eq!(
        sent(&origin),
        ["/first", "/next"],
        "requests whose client left are never sent"
    );
    assert_eq!(metric(&p, "portico_upstream_queue_abandoned_total").await, 3);
    assert_eq!(metric(&p, "portico_upstream_queue_timeouts_total").await, 0);
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains("3 left by their client"), "{perf}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_body_whose_client_leaves_in_line_is_never_sent() {
    // Its body is read while it waits; from then on its client's
    // departure is watched as a bodyless request's is.
    let (p, origin, first) = one_place_taken(Duration::from_millis(500), "queue_timeout = \"5s\"\n").await;
    let o = origin.addr();
    let c = send_raw(
        &p,
        &format!("POST http://{o}/form HTTP/1.1\r\nHost: {o}\r\nContent-Length: 11\r\n\r\nname=value&"),
    )
    .await;
    stats_when(&p, "it waits", |s| s["upstream"]["queued"] == 1).await;
    drop(c);
    stats_when(&p, "it left the line", |s| {
        s["upstream"]["queue_abandoned"] == 1 && s["upstream"]["waiting"] == 0
    })
    .await;
    assert_eq!(first.await.expect("first").status, 200);
    // A POST that stays is still sent, body and all.
    let req =
        format!("POST http://{o}/kept HTTP/1.1\r\nHost: {o}\r\nContent-Length: 4\r\nConnection: close\r\n\r\nkept");
    let r = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!((r.status, r.body_str().as_str()), (200, "answer to /kept"));
    let sent: Vec<(String, String)> = origin
        .requests()
        .iter()
        .map(|r| (r.uri.to_string(), String::from_utf8_lossy(&r.body).into_owned()))
        .collect();
    assert_eq!(
        sent,
        [
            ("/first".to_string(), String::new()),
            ("/kept".to_string(), "kept".to_string())
        ]
    );
}

/// Writes body bytes to `c`, 16 KiB at a time, until Portico stops
/// reading them: its body reader is as far ahead of the origin as it goes,
/// and the kernel holds bytes for it that stay unread. Each write is small
/// enough for Portico's receive buffer to take whole, so none stays in the
/// client's own send buffer and a hang-up reaches Portico behind them.
/// Returns the bytes left unread.
async fn write_until_unread(p: &Portico, c: &mut TcpStream) -> u64 {
    let me = c.local_addr().expect("local_addr");
    let unread = || {
        server_side(p.addr(), me)
            .expect("the kernel knows the connection")
            .unread
    };
    for _ in 0..64 {
        c.write_all(&[b'x'; 16 << 10]).await.expect("send body bytes");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = unread();
        if now > 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if unread() == now {
                return now;
            }
        }
    }
    panic!("Portico read 1 MiB of a body whose request has no origin place");
}

/// After its client hung up: the waiting request left the line (counted)
/// while `/first` still held the place, and only `/first` reached the
/// origin.
async fn left_before_its_turn(p: &Portico, origin: &Origin, first: tokio::task::JoinHandle<ParsedResponse>) {
    stats_when(p, "it left the line", |s| {
        s["upstream"]["queue_abandoned"] == 1 && s["upstream"]["waiting"] == 0
    })
    .await;
    assert!(
        !first.is_finished(),
        "it left the line only when /first gave its place back"
    );
    assert_eq!(first.await.expect("first").status, 200);
    assert_eq!(sent(origin), ["/first"]);
    assert_eq!(metric(p, "portico_upstream_queue_abandoned_total").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_behind_body_bytes_not_read_yet_leaves_the_line() {
    // Portico reads a few frames of a body ahead of the origin; the rest
    // waits in the kernel, unread, in front of the client's FIN. /first is
    // held long enough for the writes below (about a second) on a loaded
    // machine, and less than its client's 5 s timeout.
    let (p, origin, first) = one_place_taken(Duration::from_millis(4500), "queue_timeout = \"10s\"\n").await;
    let o = origin.addr();
    let mut c = send_raw(
        &p,
        &format!("POST http://{o}/upload HTTP/1.1\r\nHost: {o}\r\nContent-Length: 10000000\r\n\r\n"),
    )
    .await;
    stats_when(&p, "it waits", |s| s["upstream"]["queued"] == 1).await;
    assert!(write_until_unread(&p, &mut c).await > 0);
    drop(c);
    left_before_its_turn(&p, &origin, first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_behind_a_pipelined_request_leaves_the_line() {
    let (p, origin, first) = one_place_taken(Duration::from_secs(3), "queue_timeout = \"10s\"\n").await;
    let o = origin.addr();
    let mut c = send_raw(&p, &format!("GET http://{o}/one HTTP/1.1\r\nHost: {o}\r\n\r\n")).await;
    stats_when(&p, "it waits", |s| s["upstream"]["queued"] == 1).await;
    // The next request, sent while the first waits: Portico leaves it in
    // the kernel until the first is answered.
    let next = format!("GET http://{o}/two HTTP/1.1\r\nHost: {o}\r\n\r\n");
    c.write_all(next.as_bytes()).await.expect("send the next request");
    let me = c.local_addr().expect("local_addr");
    let side = server_side_when(p.addr(), me, |s| s.is_some_and(|s| s.unread > 0)).await;
    assert_eq!(side.map(|s| s.unread), Some(next.len() as u64));
    drop(c);
    left_before_its_turn(&p, &origin, first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_in_line_is_answered_only_with_abort_on_close_off() {
    // A client that shuts its sending side after the request (as some
    // scripted HTTP/1.0 clients do) still reads the answer. By default it
    // looks gone and leaves the line unsent; with `abort_on_close = false`
    // it waits its turn and is answered, as HAProxy without the option.
    for abort in [true, false] {
        let (p, origin, first) = one_place_taken(
            Duration::from_millis(300),
            &format!("queue_timeout = \"5s\"\nabort_on_close = {abort}\n"),
        )
        .await;
        let o = origin.addr();
        let mut c = send_raw(
            &p,
            &format!("GET http://{o}/half HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n"),
        )
        .await;
        stats_when(&p, "it waits", |s| s["upstream"]["queued"] == 1).await;
        c.shutdown().await.expect("half-close");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut answer)).await;
        assert_eq!(first.await.expect("first").status, 200);
        if abort {
            assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
            assert_eq!(sent(&origin), ["/first"]);
            assert_eq!(metric(&p, "portico_upstream_queue_abandoned_total").await, 1);
        } else {
            let r = parse_response(&answer);
            assert_eq!((r.status, r.body_str().as_str()), (200, "answer to /half"));
            assert_eq!(sent(&origin), ["/first", "/half"]);
            assert_eq!(metric(&p, "portico_upstream_queue_abandoned_total").await, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_collapsed_onto_one_whose_client_left_the_line_is_still_answered() {
    // The first client for /same leads its fetch and waits for the place;
    // a second asks for /same meanwhile and follows it. The leader's client
    // hangs up: the follower takes over the fetch and gets its answer, and
    // the origin is asked once.
    let (p, origin, first) = one_place_taken(Duration::from_millis(500), "queue_timeout = \"5s\"\n").await;
    let o = origin.addr();
    let leader = send_raw(&p, &format!("GET http://{o}/same HTTP/1.1\r\nHost: {o}\r\n\r\n")).await;
    stats_when(&p, "the leader waits", |s| s["upstream"]["waiting"] == 1).await;
    let follower = spawn_get(&p, o, "/same");
    // Followers wait on the leader's flight, not in the line.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(leader);
    stats_when(&p, "the leader left", |s| s["upstream"]["queue_abandoned"] == 1).await;
    assert_eq!(first.await.expect("first").status, 200);
    let answer = follower.await.expect("follower");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body_str(), "answer to /same");
    assert_eq!(sent(&origin), ["/first", "/same"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_reset_while_waiting_leaves_the_line_unsent() {
    let (origin, _) = holding_origin(Duration::from_millis(800)).await;
    let port = free_port();
    let p = Arc::new(
        Portico::start(&format!(
            "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\nh2c = true\n\n\
             [origin]\nmax_connections = 1\nqueue_timeout = \"5s\"\n"
        ))
        .await,
    );
    let first = spawn_get(&p, origin.addr(), "/first");
    assert!(origin.wait_count(1, Duration::from_secs(5)).await);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (mut h2, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get(format!("http://{}/reset", origin.addr()))
        .body(())
        .expect("request");
    let (response, mut stream) = h2.send_request(req, true).expect("send");
    stats_when(&p, "the stream's request waits", |s| s["upstream"]["waiting"] == 1).await;
    stream.send_reset(h2::Reason::CANCEL);
    drop(response);
    stats_when(&p, "it left the line", |s| {
        s["upstream"]["queue_abandoned"] == 1 && s["upstream"]["waiting"] == 0
    })
    .await;
    assert_eq!(first.await.expect("first").status, 200);
    // The connection serves its next stream.
    let req = http::Request::get(format!("http://{}/after", origin.addr()))
        .body(())
        .expect("request");
    let (response, _) = h2.send_request(req, true).expect("send");
    assert_eq!(response.await.expect("response").status(), 200);
    assert_eq!(sent(&origin), ["/first", "/after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_gives_its_place_back() {
    // A WebSocket may live for hours: it must not hold the origin's only
    // place while plain requests wait behind it.
    let origin = RawOrigin::start(|mut s| async move {
        let head = String::from_utf8_lossy(&read_request_head(&mut s).await).to_ascii_lowercase();
        if head.contains("upgrade: websocket") {
            let _ = s
                .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                .await;
            // Echo until the client goes.
            let mut buf = [0u8; 64];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        } else {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nplain").await;
        }
    })
    .await;
    let p = forward("[origin]\nmax_connections = 1\nqueue_timeout = \"1s\"\n").await;
    let o = origin.addr();
    let mut ws = TcpStream::connect(p.addr()).await.expect("connect");
    ws.write_all(
        format!(
            "GET http://{o}/chat HTTP/1.1\r\nHost: {o}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("send");
    let (head, _) = read_response_head(&mut ws).await;
    assert_eq!(head.status, 101);
    ws.write_all(b"ping").await.expect("ping");
    let mut echo = [0u8; 4];
    ws.read_exact(&mut echo).await.expect("echo");
    assert_eq!(&echo, b"ping", "the tunnel is up");
    // The tunnel still open, a plain request gets the place.
    let plain = get(&p, o, "/plain").await;
    assert_eq!((plain.status, plain.body_str().as_str()), (200, "plain"));
    assert_eq!(metric(&p, "portico_upstream_queue_timeouts_total").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_parent_the_places_are_the_parents() {
    // Requests for two origins, both through one parent proxy: the parent
    // is the server connected to, so they share its one place.
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (now.clone(), most.clone());
    let parent = RawOrigin::start(move |mut s| {
        let (n, m) = (n.clone(), m.clone());
        async move {
            loop {
                let head = read_request_head(&mut s).await;
                if head.is_empty() {
                    return;
                }
                m.fetch_max(n.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(600)).await;
                n.fetch_sub(1, Ordering::SeqCst);
                let target = String::from_utf8_lossy(&head)
                    .split(' ')
                    .nth(1)
                    .unwrap_or("")
                    .to_string();
                let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{target}", target.len());
                if s.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let p = Arc::new(
        forward(&format!(
            "[cache]\nenabled = false\n\n[origin]\nmax_connections = 1\n\n\
             [[upstream]]\nname = \"parents\"\nparent = true\nservers = [\"{}\"]\n\n\
             [[rule]]\nhost = \"*.via.test\"\nupstream = \"parents\"\n",
            parent.addr()
        ))
        .await,
    );
    let tasks: Vec<_> = ["a.via.test", "b.via.test"]
        .into_iter()
        .map(|host| {
            let p = p.clone();
            tokio::spawn(async move {
                let req = format!("GET http://{host}/x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
                parse_response(&raw_request(p.addr(), req.as_bytes()).await)
            })
        })
        .collect();
    for (t, host) in tasks.into_iter().zip(["a.via.test", "b.via.test"]) {
        let r = t.await.expect("client");
        assert_eq!((r.status, r.body_str()), (200, format!("http://{host}/x")));
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "one at a time at the parent");
    assert_eq!(metric(&p, "portico_upstream_queued_total").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_copy_is_served_while_the_origin_has_no_place_free() {
    // RFC 9111 4.2.4: the queue timeout is the origin failing to answer,
    // as a 503 from it would be (`cache.max_stale_on_error`).
    let origin = Origin::start(|req| async move {
        if req.uri.path() == "/slow" {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        Response::ok(format!("copy of {}", req.uri)).header("Cache-Control", "max-age=1")
    })
    .await;
    let p = Arc::new(forward("[origin]\nmax_connections = 1\nqueue_timeout = \"300ms\"\n").await);
    assert_eq!(get(&p, origin.addr(), "/page").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let held = spawn_get(&p, origin.addr(), "/slow");
    assert!(origin.wait_count(2, Duration::from_secs(5)).await);
    let stale = get(&p, origin.addr(), "/page").await;
    assert_eq!((stale.status, stale.body_str().as_str()), (200, "copy of /page"));
    assert!(
        stale.header("x-cache").is_some_and(|x| x.starts_with("STALE")),
        "{:?}",
        stale.header("x-cache")
    );
    assert_eq!(origin.count(), 2, "the revalidation never reached the origin");
    assert_eq!(held.await.expect("held").status, 200);
    assert_eq!(metric(&p, "portico_upstream_queue_timeouts_total").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_own_cap_holds_its_servers_and_leaves_other_requests_alone() {
    // Application servers of one worker behind a reverse listener; the
    // same server asked directly through the forward listener is not held
    // back by the group's count.
    let (origin, most) = holding_origin(Duration::from_millis(500)).await;
    let (fwd, rev) = (free_addr(), free_addr());
    let p = Arc::new(
        Portico::start(&format!(
            "[[listener]]\naddress = \"{fwd}\"\nmode = \"forward\"\n\n\
             [[listener]]\naddress = \"{rev}\"\nmode = \"reverse\"\n\n\
             [cache]\nenabled = false\n\n\
             [[upstream]]\nname = \"app\"\nservers = [\"{}\"]\nmax_connections = 1\n\n\
             [[rule]]\nmode = \"reverse\"\nupstream = \"app\"\n",
            origin.addr()
        ))
        .await,
    );
    let rev: std::net::SocketAddr = rev.parse().expect("addr");
    let started = Instant::now();
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(async move {
                let req = format!("GET /r{i} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n");
                parse_response(&raw_request(rev, req.as_bytes()).await)
            })
        })
        .collect();
    // While the group's three wait their turns, a forward request for the
    // same server goes straight in.
    assert!(origin.wait_count(1, Duration::from_secs(5)).await);
    // The statistics name the group after the server.
    let label = format!("{} (app)", origin.addr());
    let listed = stats_when(&p, "the group's server", |s| {
        s["upstream"]["servers"][0]["server"] == label.as_str()
    })
    .await["upstream"]["servers"]
        .clone();
    assert_eq!(listed[0]["server"], label.as_str(), "{listed}");
    let direct = get(&p, origin.addr(), "/direct").await;
    assert_eq!(direct.status, 200);
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "the direct request did not wait for the group's: {:?}",
        started.elapsed()
    );
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.expect("client");
        assert_eq!((r.status, r.body_str()), (200, format!("answer to /r{i}")));
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "the group's one, and the direct one beside it"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1490),
        "three turns: {:?}",
        started.elapsed()
    );
    assert_eq!(metric(&p, "portico_upstream_queued_total").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statistics_name_the_server_at_its_cap_and_how_many_wait() {
    let (origin, _) = holding_origin(Duration::from_millis(1500)).await;
    let p = Arc::new(forward("[origin]\nmax_connections = 1\n").await);
    let clients: Vec<_> = (0..3)
        .map(|i| spawn_get(&p, origin.addr(), &format!("/s{i}")))
        .collect();
    assert!(origin.wait_count(1, Duration::from_secs(5)).await);
    // Until both others wait (they may still be on their way in).
    let servers =
        stats_when(&p, "two waiting", |s| s["upstream"]["servers"][0]["waiting"] == 2).await["upstream"]["servers"]
            .clone();
    let o = origin.addr().to_string();
    assert_eq!(
        servers,
        serde_json::json!([{"server": o, "in_use": 1, "limit": 1, "waiting": 2}]),
        "JSON"
    );
    assert_eq!(
        metric(
            &p,
            &format!("portico_upstream_server_waiting_requests{{server=\"{o}\"}}")
        )
        .await,
        2
    );
    let req = format!("GET /.perf HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", p.addr());
    let perf = parse_response(&raw_request(p.addr(), req.as_bytes()).await).body_str();
    assert!(
        perf.lines()
            .any(|l| l.trim_start().starts_with(&o) && l.contains("1/1 in use, 2 waiting")),
        "{perf}"
    );
    for c in clients {
        assert_eq!(c.await.expect("client").status, 200);
    }
    assert_eq!(
        stats_snapshot(&p).await["upstream"]["servers"],
        serde_json::json!([]),
        "none busy now"
    );
}
