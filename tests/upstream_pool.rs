//! Portico's own HTTP/1.1 client towards origins, through the real binary
//! and hand-framed origins: pooled connections reused, checked, aged out
//! and never reused when bytes follow a response (response splitting); a
//! close racing a reused connection retried only for idempotent requests;
//! the request body flowing while the response streams; a 101's early
//! bytes; origin heads over the limits refused with their reason.

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

/// `METHOD <url>` through the proxy on a connection of its own.
async fn ask(p: &Portico, method: &str, origin: std::net::SocketAddr, path: &str) -> ParsedResponse {
    let request = format!("{method} http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
    let bytes = raw_request(p.addr(), request.as_bytes()).await;
    assert!(!bytes.is_empty(), "no answer to {method} {path}");
    parse_response(&bytes)
}

/// Serves requests on one connection until the peer closes it, answering
/// each with `answer(n)` (n counts the connection's requests from 0);
/// None closes the connection without answering.
async fn serve(mut s: TcpStream, answer: impl Fn(usize) -> Option<Vec<u8>>) {
    for n in 0.. {
        let head = read_request_head(&mut s).await;
        if head.is_empty() {
            return;
        }
        let Some(reply) = answer(n) else { return };
        if s.write_all(&reply).await.is_err() {
            return;
        }
    }
}

fn ok(body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_to_an_origin_are_reused() {
    let origin = RawOrigin::start(|s| serve(s, |n| Some(ok(&format!("answer {n}"))))).await;
    let p = forward("").await;
    for n in 0..5 {
        let resp = ask(&p, "GET", origin.addr(), &format!("/{n}")).await;
        assert_eq!((resp.status, resp.body_str()), (200, format!("answer {n}")));
    }
    assert_eq!(origin.connections(), 1, "one pooled connection carried all five");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_closes_an_idle_connection_costs_no_request() {
    // Keep-alive is not refused in the answer, but the origin closes the
    // connection 50 ms after it: Portico must see the close before reuse.
    let origin = RawOrigin::start(|mut s| async move {
        read_request_head(&mut s).await;
        let _ = s.write_all(&ok("once")).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    })
    .await;
    let p = forward("").await;
    // POST: not sent again if it failed, so only the check before reuse
    // saves it.
    for _ in 0..3 {
        let resp = ask(&p, "POST", origin.addr(), "/").await;
        assert_eq!((resp.status, resp.body_str().as_str()), (200, "once"));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(origin.connections(), 3);
}

/// An origin that answers the first request of each connection and closes
/// the connection, unanswered, at its second: the close racing a reuse.
async fn closes_at_the_second_request(seen: Arc<AtomicUsize>) -> RawOrigin {
    RawOrigin::start(move |s| {
        let seen = seen.clone();
        serve(s, move |n| {
            seen.fetch_add(1, Ordering::SeqCst);
            (n == 0).then(|| ok("fresh"))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_whose_reused_connection_closes_unanswered_is_sent_again() {
    let seen = Arc::new(AtomicUsize::new(0));
    let origin = closes_at_the_second_request(seen.clone()).await;
    let p = forward("").await;
    assert_eq!(ask(&p, "GET", origin.addr(), "/a").await.status, 200);
    let resp = ask(&p, "GET", origin.addr(), "/b").await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "fresh"));
    assert_eq!(origin.connections(), 2, "sent again on a new connection");
    assert_eq!(seen.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_whose_reused_connection_closes_unanswered_is_not_sent_again() {
    // RFC 9112 9.3.1: a non-idempotent request is not retried: the origin
    // may have acted on it.
    let seen = Arc::new(AtomicUsize::new(0));
    let origin = closes_at_the_second_request(seen.clone()).await;
    let p = forward("").await;
    assert_eq!(ask(&p, "GET", origin.addr(), "/a").await.status, 200);
    let resp = ask(&p, "POST", origin.addr(), "/b").await;
    assert_eq!(resp.status, 502, "{}", resp.body_str());
    assert!(
        resp.body_str()
            .contains("the origin closed the connection before answering"),
        "{}",
        resp.body_str()
    );
    assert_eq!(seen.load(Ordering::SeqCst), 2, "the POST reached the origin once");
    assert_eq!(origin.connections(), 1);
}

/// An origin that answers a HEAD with its length and then, a little later,
/// sends the body anyway (a bug RFC 9110 9.3.2 forbids) must not have that
/// body read as the next client's response: a connection after a HEAD
/// that announced a body is not reused. Before, a GET sent within the
/// delay on the pooled connection got the stray "evil" response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_an_origin_sends_late_after_a_head_never_answers_the_next_request() {
    let origin = RawOrigin::start(|mut s| async move {
        loop {
            let head = read_request_head(&mut s).await;
            if head.is_empty() {
                return;
            }
            if head.starts_with(b"HEAD") {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n").await;
                tokio::time::sleep(Duration::from_millis(400)).await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil").await;
            } else {
                let _ = s.write_all(&ok("good")).await;
            }
        }
    })
    .await;
    let p = forward("[cache]\nenabled = false\n").await;
    let o = origin.addr();
    let request = format!("HEAD http://{o}/x HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");
    let head = parse_head_response(&raw_request(p.addr(), request.as_bytes()).await);
    assert_eq!(head.status, 200);
    let r = ask(&p, "GET", origin.addr(), "/victim").await;
    assert_eq!(r.body_str(), "good", "{:?}", r.headers);
    assert_eq!(origin.connections(), 2, "a connection after such a HEAD is not reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_after_a_response_never_answer_the_next_request() {
    // Response splitting: a second response smuggled after the first, in
    // the same write or a moment later. Kept on a pooled connection, it
    // would be read as the answer to the next request, whoever sent it.
    for delay in [None, Some(Duration::from_millis(50))] {
        // The first request of all gets the injection, every other its own answer.
        let first = Arc::new(AtomicUsize::new(0));
        let origin = RawOrigin::start(move |mut s| {
            let first = first.clone();
            async move {
                if first.fetch_add(1, Ordering::SeqCst) == 0 {
                    read_request_head(&mut s).await;
                    let mut reply = ok("first");
                    match delay {
                        None => reply.extend_from_slice(&ok("INJECTED")),
                        Some(d) => {
                            let _ = s.write_all(&reply).await;
                            tokio::time::sleep(d).await;
                            reply = ok("INJECTED");
                        }
                    }
                    let _ = s.write_all(&reply).await;
                }
                serve(s, |_| Some(ok("own answer"))).await;
            }
        })
        .await;
        let p = forward("").await;
        assert_eq!(ask(&p, "GET", origin.addr(), "/a").await.body_str(), "first");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let resp = ask(&p, "GET", origin.addr(), "/b").await;
        assert_eq!(
            (resp.status, resp.body_str().as_str()),
            (200, "own answer"),
            "delay {delay:?}"
        );
        assert_eq!(
            origin.connections(),
            2,
            "delay {delay:?}: the first connection was not reused"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_origin_connections_are_closed_after_pool_idle_timeout() {
    let closed_after = Arc::new(std::sync::Mutex::new(None));
    let record = closed_after.clone();
    let origin = RawOrigin::start(move |mut s| {
        let record = record.clone();
        async move {
            read_request_head(&mut s).await;
            let _ = s.write_all(&ok("x")).await;
            let answered = Instant::now();
            let mut rest = [0u8; 16];
            if let Ok(0) = s.read(&mut rest).await {
                *record.lock().expect("lock") = Some(answered.elapsed());
            }
        }
    })
    .await;
    let p = forward("[origin]\npool_idle_timeout = \"400ms\"\n").await;
    assert_eq!(ask(&p, "GET", origin.addr(), "/").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = closed_after
        .lock()
        .expect("lock")
        .expect("Portico closed the idle connection");
    assert!(
        after >= Duration::from_millis(400) && after < Duration::from_millis(1300),
        "closed after {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_max_idle_zero_keeps_no_connection() {
    let origin = RawOrigin::start(|s| serve(s, |_| Some(ok("x")))).await;
    let p = forward("[origin]\npool_max_idle = 0\n").await;
    for _ in 0..3 {
        assert_eq!(ask(&p, "GET", origin.addr(), "/").await.status, 200);
    }
    assert_eq!(origin.connections(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_body_keeps_flowing_while_the_response_streams() {
    // An origin that echoes as it reads: it answers after the first half of
    // the body and needs the second half to finish. A client that waits for
    // the first echo before sending the rest only completes if Portico
    // sends and receives at the same time.
    let origin = RawOrigin::start(|mut s| async move {
        let mut got = read_request_head(&mut s).await;
        let end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
        let mut body = got.split_off(end);
        let mut tmp = [0u8; 64];
        while body.len() < 5 {
            let n = s.read(&mut tmp).await.expect("read");
            body.extend_from_slice(&tmp[..n]);
        }
        let mut reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        reply.extend_from_slice(format!("5\r\n{}\r\n", String::from_utf8_lossy(&body[..5])).as_bytes());
        s.write_all(&reply).await.expect("write");
        while body.len() < 10 {
            let n = s.read(&mut tmp).await.expect("read");
            assert!(n > 0, "the second half never came");
            body.extend_from_slice(&tmp[..n]);
        }
        let tail = format!("5\r\n{}\r\n0\r\n\r\n", String::from_utf8_lossy(&body[5..10]));
        s.write_all(tail.as_bytes()).await.expect("write");
    })
    .await;
    let p = forward("").await;
    let a = origin.addr();
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    s.write_all(format!("POST http://{a}/echo HTTP/1.1\r\nHost: {a}\r\nContent-Length: 10\r\n\r\nhello").as_bytes())
        .await
        .expect("write");
    let mut seen = Vec::new();
    let mut tmp = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(&seen).contains("hello") {
        assert!(
            Instant::now() < deadline,
            "no echo of the first half: {:?}",
            String::from_utf8_lossy(&seen)
        );
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
            .await
            .expect("echo in time")
            .expect("read");
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&tmp[..n]);
    }
    s.write_all(b"world").await.expect("write");
    while !String::from_utf8_lossy(&seen).contains("0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
            .await
            .expect("the rest in time")
            .expect("read");
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&tmp[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("hello") && text.contains("world"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_the_origin_sends_with_its_101_reach_the_client() {
    let origin = RawOrigin::start(|mut s| async move {
        read_request_head(&mut s).await;
        // The 101 and the first frame of the new protocol in one write.
        let _ = s
            .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nEARLY")
            .await;
        let mut tmp = [0u8; 16];
        if let Ok(n) = s.read(&mut tmp).await {
            let _ = s.write_all(&tmp[..n]).await;
        }
    })
    .await;
    let p = forward("").await;
    let a = origin.addr();
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    s.write_all(
        format!("GET http://{a}/ws HTTP/1.1\r\nHost: {a}\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("write");
    let mut seen = Vec::new();
    let mut tmp = [0u8; 1024];
    while !seen.ends_with(b"EARLY") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
            .await
            .expect("the early bytes in time")
            .expect("read");
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&tmp[..n]);
    }
    assert!(
        seen.starts_with(b"HTTP/1.1 101"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
    s.write_all(b"ping").await.expect("write");
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
        .await
        .expect("echo in time")
        .expect("read");
    assert_eq!(&tmp[..n], b"ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_heads_over_the_limits_are_refused_with_their_reason() {
    let origin = RawOrigin::start(|mut s| async move {
        let head = read_request_head(&mut s).await;
        let mut reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n".to_vec();
        if head.starts_with(b"GET /fields") {
            for i in 0..200 {
                reply.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
            }
        } else {
            reply.extend_from_slice(format!("X-Big: {}\r\n", "a".repeat(70 << 10)).as_bytes());
        }
        reply.extend_from_slice(b"\r\n");
        let _ = s.write_all(&reply).await;
    })
    .await;
    let p = forward("").await;
    for (path, reason) in [
        ("/fields", "has more than 128 header fields"),
        ("/big", "is larger than 64 KiB"),
    ] {
        let resp = ask(&p, "GET", origin.addr(), path).await;
        assert_eq!(resp.status, 502, "{path}");
        assert!(
            resp.body_str()
                .contains(&format!("response is not valid HTTP/1.1: its head {reason}")),
            "{path}: {}",
            resp.body_str()
        );
    }
}
