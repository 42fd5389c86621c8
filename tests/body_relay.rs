//! How an origin's response body is relayed to the client: what the origin
//! has sent already leaves at once (gathered into one write when Portico
//! read it in several pieces), what it has not sent yet is never waited
//! for, and whatever follows the gathered bytes (trailers, the end of the
//! body, the origin failing) still reaches the client as it should. Both
//! paths that stream a body are covered: the cache's (a GET, stored or
//! not) and the plain forward path's (a POST).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Body bytes before the origin pauses (more than Portico reads with a
/// response head, so the body comes in several reads).
const FIRST: usize = 20_000;
/// The whole body.
const TOTAL: usize = 50_000;

/// A forward listener on a free port, with a memory cache.
async fn proxy() -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[cache]\nmemory = \"16MiB\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n"
    ))
    .await
}

/// Byte `i` of a body.
fn body(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// A raw absolute-form request to `origin`; a POST carries a 4-byte body.
fn request(method: &str, origin: SocketAddr, path: &str, extra: &str) -> Vec<u8> {
    let body = if method == "POST" {
        "Content-Length: 4\r\n\r\nping"
    } else {
        "\r\n"
    };
    format!("{method} http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\n{extra}{body}").into_bytes()
}

/// Reads into `got` until it holds `want` bytes or the peer closes;
/// panics if neither happens within 10 s.
async fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, want: usize, what: &str) {
    let mut tmp = [0u8; 65536];
    while got.len() < want {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
            .await
            .unwrap_or_else(|_| panic!("{what}: {} of {want} bytes after 10 s", got.len()))
            .unwrap_or(0);
        if n == 0 {
            return;
        }
        got.extend_from_slice(&tmp[..n]);
    }
}

/// Sends `method path` to `origin` through the proxy on a connection of
/// its own; checks the answer is a 200 and returns the connection and the
/// body bytes read with its head.
async fn ask(p: &Portico, method: &str, origin: SocketAddr, path: &str) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    s.write_all(&request(method, origin, path, "")).await.expect("send");
    let (head, got) = read_response_head(&mut s).await;
    assert!(
        head.version == "HTTP/1.1" && head.status == 200,
        "{method} {path}: {head:?}"
    );
    (s, got)
}

/// An origin that sends the head and the first [`FIRST`] bytes of a
/// [`TOTAL`]-byte body, then waits for `go` before sending the rest.
async fn pausing_origin(go: Arc<Notify>) -> RawOrigin {
    RawOrigin::start(move |mut s| {
        let go = go.clone();
        async move {
            read_request_head(&mut s).await;
            let all = body(TOTAL);
            let mut first =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {TOTAL}\r\nCache-Control: max-age=60\r\n\r\n").into_bytes();
            first.extend_from_slice(&all[..FIRST]);
            let _ = s.write_all(&first).await;
            go.notified().await;
            let _ = s.write_all(&all[FIRST..]).await;
            // Keeps the connection until Portico has read it all.
            let _ = s.read(&mut [0u8; 1]).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_bytes_the_origin_sent_reach_the_client_while_the_rest_is_still_to_come() {
    for method in ["GET", "POST"] {
        let go = Arc::new(Notify::new());
        let origin = pausing_origin(go.clone()).await;
        let p = proxy().await;
        let (mut s, mut got) = ask(&p, method, origin.addr(), "/pause").await;
        // The origin sends no more until the client has these: a relay
        // that held them back for the rest would stall here.
        read_until(&mut s, &mut got, FIRST, &format!("{method}: the first part")).await;
        assert_eq!(
            got.len(),
            FIRST,
            "{method}: exactly the first part, before the rest was sent"
        );
        go.notify_one();
        read_until(&mut s, &mut got, TOTAL, &format!("{method}: the rest")).await;
        assert_eq!(got, body(TOTAL), "{method}: the body arrives whole and in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_after_a_body_sent_in_one_go_reach_a_client_accepting_them() {
    // Head, three chunks (30,000 bytes, more than one read) and the
    // trailer section in one write: the bytes Portico reads after the
    // first data hold the rest of the body and then the trailers.
    // Every request on a connection is answered (Portico pools it).
    let origin = RawOrigin::start(|mut s| async move {
        while !read_request_head(&mut s).await.is_empty() {
            let all = body(30_000);
            let mut resp =
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\nCache-Control: no-store\r\n\r\n"
                    .to_vec();
            resp.extend(chunked_body(
                &[&all[..10_000], &all[10_000..20_000], &all[20_000..]],
                &[("X-Checksum", "c0ffee")],
            ));
            if s.write_all(&resp).await.is_err() {
                break;
            }
        }
    })
    .await;
    let p = proxy().await;
    for method in ["GET", "POST"] {
        let mut client = RawClient::connect(p.addr()).await;
        client
            .send(&request(method, origin.addr(), "/tr", "TE: trailers\r\n"))
            .await;
        let resp = client.read_response().await;
        assert_eq!(resp.status, 200, "{method}");
        assert_eq!(resp.framing, Framing::Chunked, "{method}");
        assert_eq!(resp.body, body(30_000), "{method}: the body whole");
        assert_eq!(
            resp.trailer("x-checksum"),
            Some("c0ffee"),
            "{method}: {:?}",
            resp.trailers
        );
        // The connection is still good for the next request.
        client
            .send(&request(method, origin.addr(), "/tr", "TE: trailers\r\n"))
            .await;
        let again = client.read_response().await;
        assert_eq!(
            (again.status, again.body.len()),
            (200, 30_000),
            "{method}: the next response"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_closes_inside_a_body_sent_in_one_go_cuts_the_clients_response() {
    // Content-Length promises 50,000 bytes; the origin sends 30,000 in one
    // write and closes. The client must not get a response that looks
    // complete, and nothing is stored.
    let origin = RawOrigin::start(|mut s| async move {
        read_request_head(&mut s).await;
        let mut resp =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {TOTAL}\r\nCache-Control: max-age=60\r\n\r\n").into_bytes();
        resp.extend_from_slice(&body(30_000));
        let _ = s.write_all(&resp).await;
    })
    .await;
    let p = proxy().await;
    for method in ["GET", "POST"] {
        let (mut s, mut got) = ask(&p, method, origin.addr(), "/cut").await;
        read_until(&mut s, &mut got, TOTAL, &format!("{method}: the cut body")).await;
        assert_eq!(got, body(30_000), "{method}: what the origin sent, then the close");
    }
    // Neither answer was stored: a third request goes to the origin again.
    let before = origin.connections();
    ask(&p, "GET", origin.addr(), "/cut").await;
    assert_eq!(
        origin.connections(),
        before + 1,
        "the cut response was not served from the cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunk_after_a_body_part_sent_in_one_go_cuts_the_clients_response() {
    // A valid 20,000-byte chunk, then a chunk-size line that is not hex,
    // all in one write: the error is met while gathering what follows the
    // first part. The client gets the first part and then the close, never
    // a chunked body that ends cleanly.
    let origin = RawOrigin::start(|mut s| async move {
        read_request_head(&mut s).await;
        let mut resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nCache-Control: max-age=60\r\n\r\n".to_vec();
        resp.extend_from_slice(format!("{:x}\r\n", 20_000).as_bytes());
        resp.extend_from_slice(&body(20_000));
        resp.extend_from_slice(b"\r\nzz\r\nnot a chunk\r\n0\r\n\r\n");
        let _ = s.write_all(&resp).await;
        let _ = s.read(&mut [0u8; 1]).await;
    })
    .await;
    let p = proxy().await;
    for method in ["GET", "POST"] {
        let (mut s, mut got) = ask(&p, method, origin.addr(), "/bad-chunk").await;
        // Read to the close (bounded: a relay that kept the connection
        // open would time out here).
        read_until(&mut s, &mut got, usize::MAX, &format!("{method}: the cut body")).await;
        let (data, complete) = dechunk(&got);
        assert!(
            !complete,
            "{method}: the body must not end like a complete chunked body"
        );
        assert_eq!(data, body(20_000), "{method}: the valid first part, and nothing else");
    }
}

/// The data of a chunked body as far as it is well formed, and whether it
/// ended with its last chunk.
fn dechunk(mut raw: &[u8]) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return (data, false);
        };
        let Some(size) = std::str::from_utf8(&raw[..eol])
            .ok()
            .and_then(|t| usize::from_str_radix(t.trim(), 16).ok())
        else {
            return (data, false);
        };
        if size == 0 {
            return (data, raw[eol + 2..].starts_with(b"\r\n"));
        }
        let start = eol + 2;
        if raw.len() < start + size + 2 {
            data.extend_from_slice(&raw[start.min(raw.len())..]);
            return (data, false);
        }
        data.extend_from_slice(&raw[start..start + size]);
        raw = &raw[start + size + 2..];
    }
}
