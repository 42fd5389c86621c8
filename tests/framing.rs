//! Client-facing HTTP/1 framing rules (RFC 9112), through the real binary:
//! raw bytes to a forward-proxy Portico whose targets point at a scripted
//! origin. Every rejected request must get the right status, must never
//! reach the origin, and must end the connection.

mod common;

use std::time::Duration;

use common::*;

/// An origin that names what it got: `METHOD PATH BODYLEN:BODY`.
async fn echo_origin() -> Origin {
    Origin::start(|req| async move {
        let body = String::from_utf8_lossy(&req.body).into_owned();
        Response::ok(format!("{} {} {}:{body}", req.method, req.uri.path(), req.body.len()))
    })
    .await
}

/// A forward-proxy Portico on a free port with an access log, plus `extra`
/// config (e.g. a `[limits]` table).
async fn portico(extra: &str) -> Portico {
    let config = format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n{extra}\n",
        free_addr()
    );
    Portico::start(&config).await
}

/// Sends `request` on a fresh connection and reads until Portico closes it
/// (or 5 s pass); returns the bytes and whether the connection was closed.
async fn exchange(p: &Portico, request: &[u8]) -> (Vec<u8>, bool) {
    let mut client = RawClient::connect(p.addr()).await;
    client.send(request).await;
    let bytes = client.read_to_end().await;
    (bytes, client.is_eof())
}

/// Asserts that `request` is answered with `status`, the connection is
/// closed afterwards, and the origin never received a request.
async fn assert_rejected(p: &Portico, origin: &Origin, request: &[u8], status: u16) {
    let shown = String::from_utf8_lossy(&request[..request.len().min(300)]).into_owned();
    let (bytes, closed) = exchange(p, request).await;
    assert!(!bytes.is_empty(), "no response to {shown:?}");
    let resp = parse_response(&bytes);
    assert_eq!(
        resp.status,
        status,
        "request {shown:?} got {}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(closed, "connection not closed after {status} to {shown:?}");
    assert_eq!(resp.header("connection"), Some("close"), "{shown:?}");
    assert_eq!(origin.count(), 0, "origin received {shown:?}");
}

/// Sends `request` (which should carry `Connection: close`) and returns
/// the single response.
async fn accepted(p: &Portico, request: &[u8]) -> ParsedResponse {
    let (bytes, _) = exchange(p, request).await;
    assert!(
        !bytes.is_empty(),
        "no response to {:?}",
        String::from_utf8_lossy(request)
    );
    parse_response(&bytes)
}

/// A POST of `body` to the origin with the given extra header lines.
fn post(origin: &Origin, extra: &str, body: &str) -> Vec<u8> {
    let a = origin.addr();
    format!("POST http://{a}/up HTTP/1.1\r\nHost: {a}\r\n{extra}Connection: close\r\n\r\n{body}").into_bytes()
}

/// A GET of `path` with the given extra header lines.
fn get(origin: &Origin, path: &str, extra: &str) -> Vec<u8> {
    let a = origin.addr();
    format!("GET http://{a}{path} HTTP/1.1\r\nHost: {a}\r\n{extra}Connection: close\r\n\r\n").into_bytes()
}

// ---------------------------------------------------------------- Content-Length

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_content_lengths_are_rejected_400() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let two_fields = post(&origin, "Content-Length: 5\r\nContent-Length: 6\r\n", "hello!");
    assert_rejected(&p, &origin, &two_fields, 400).await;
    let one_field = post(&origin, "Content-Length: 5, 6\r\n", "hello!");
    assert_rejected(&p, &origin, &one_field, 400).await;
    assert_eq!(origin.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_duplicate_content_lengths_are_accepted() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let req = post(&origin, "Content-Length: 5\r\nContent-Length: 5\r\n", "hello");
    let resp = accepted(&p, &req).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "POST /up 5:hello");
    let reqs = origin.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(&reqs[0].body[..], b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_with_sign_hex_or_too_many_digits_is_rejected_400() {
    let origin = echo_origin().await;
    let p = portico("").await;
    for value in ["+5", "-5", "0x5", "5a", "99999999999999999999", "1 2"] {
        let req = post(&origin, &format!("Content-Length: {value}\r\n"), "hello");
        assert_rejected(&p, &origin, &req, 400).await;
    }
    assert_eq!(origin.connections(), 0);
}

// ---------------------------------------------------------------- Transfer-Encoding

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_encoding_chunked_in_any_case_is_accepted() {
    let origin = echo_origin().await;
    let p = portico("").await;
    for te in ["chunked", "ChUnKeD"] {
        let req = post(
            &origin,
            &format!("Transfer-Encoding: {te}\r\n"),
            "5\r\nhello\r\n0\r\n\r\n",
        );
        let resp = accepted(&p, &req).await;
        assert_eq!(
            (resp.status, resp.body_str().as_str()),
            (200, "POST /up 5:hello"),
            "{te}"
        );
    }
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transfer_encodings_are_rejected_400() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let body = "5\r\nhello\r\n0\r\n\r\n";
    for extra in [
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding: identity\r\n",
        "Transfer-Encoding: xchunked\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: \r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 15\r\n",
        "Content-Length: 15\r\nTransfer-Encoding: chunked\r\n",
    ] {
        assert_rejected(&p, &origin, &post(&origin, extra, body), 400).await;
    }
    // Transfer-Encoding in an HTTP/1.0 request.
    let a = origin.addr();
    let http10 = format!("POST http://{a}/up HTTP/1.0\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\n\r\n{body}");
    assert_rejected(&p, &origin, http10.as_bytes(), 400).await;
    assert_eq!(origin.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_codings_before_chunked_are_not_implemented_501() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let req = post(
        &origin,
        "Transfer-Encoding: gzip, chunked\r\n",
        "5\r\nhello\r\n0\r\n\r\n",
    );
    assert_rejected(&p, &origin, &req, 501).await;
    assert_eq!(origin.connections(), 0);
}

// ---------------------------------------------------------------- chunked bodies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_extensions_are_accepted_and_body_is_intact() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let body = "5;name=value;q=\"quoted \\\" str\"\r\nhello\r\n6 ; a = b ;flag\r\n world\r\n0;last=1\r\n\r\n";
    let resp = accepted(&p, &post(&origin, "Transfer-Encoding: chunked\r\n", body)).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "POST /up 11:hello world");
    assert_eq!(&origin.requests()[0].body[..], b"hello world");
}

/// Chunk-level errors are found while the body streams, so the origin may
/// already have the request head; it must never get a complete request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunked_bodies_are_rejected_400() {
    let origin = echo_origin().await;
    let p = portico("").await;
    for body in [
        "5;\r\nhello\r\n0\r\n\r\n",                 // extension without a name
        "5 x\r\nhello\r\n0\r\n\r\n",                // junk after the size
        "5\r\nhelloXX0\r\n\r\n",                    // data not followed by CRLF
        "000000000000000005\r\nhello\r\n0\r\n\r\n", // 18 hex digits
        "00000000000000005\r\nhello\r\n0\r\n\r\n",  // 17 hex digits
        "5\nhello\r\n0\r\n\r\n",                    // bare LF after the size
        "zz\r\nhello\r\n0\r\n\r\n",                 // no size at all
    ] {
        assert_rejected(&p, &origin, &post(&origin, "Transfer-Encoding: chunked\r\n", body), 400).await;
    }
    assert_eq!(origin.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_after_last_chunk_are_accepted() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let body = "5\r\nhello\r\n0\r\nX-Checksum: 42\r\nX-Other: a b\r\n\r\n";
    let resp = accepted(&p, &post(&origin, "Transfer-Encoding: chunked\r\n", body)).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "POST /up 5:hello"));
    assert_eq!(origin.count(), 1);
}

// ---------------------------------------------------------------- size limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_line_is_414() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let long_path = format!("/{}", "a".repeat(9000));
    assert_rejected(&p, &origin, &get(&origin, &long_path, ""), 414).await;
    // Unterminated: the line is already too long before its end arrives.
    let a = origin.addr();
    let unterminated = format!("GET http://{a}/{}", "a".repeat(9000));
    assert_rejected(&p, &origin, unterminated.as_bytes(), 414).await;
    // Just under the limit is fine.
    let ok_path = format!("/{}", "a".repeat(7000));
    assert_eq!(accepted(&p, &get(&origin, &ok_path, "")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_head_is_431() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let big = format!("X-Big: {}\r\n", "b".repeat(70_000));
    assert_rejected(&p, &origin, &get(&origin, "/", &big), 431).await;
    // Many medium fields adding up to more than 64 KiB.
    let many: String = (0..20).map(|i| format!("X-F{i}: {}\r\n", "c".repeat(4000))).collect();
    assert_rejected(&p, &origin, &get(&origin, "/", &many), 431).await;
    assert_eq!(origin.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_100_header_fields_is_431() {
    let origin = echo_origin().await;
    let p = portico("").await;
    // Host + Connection + 99 more = 101 fields.
    let many: String = (0..99).map(|i| format!("X-F{i}: v\r\n")).collect();
    assert_rejected(&p, &origin, &get(&origin, "/", &many), 431).await;
    assert_eq!(origin.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_smaller_limits_move_the_414_and_431_thresholds() {
    let origin = echo_origin().await;
    let p = portico("[limits]\nmax_request_line = \"1KiB\"\nmax_headers = 10\n").await;
    let default = portico("").await;

    // A 1.5 KiB request line: fine by default, 414 with the 1 KiB limit.
    let path = format!("/{}", "a".repeat(1500));
    assert_eq!(accepted(&default, &get(&origin, &path, "")).await.status, 200);
    let before = origin.count();
    assert_rejected_after(&p, &origin, &get(&origin, &path, ""), 414, before).await;
    // Just under 1 KiB passes.
    let path = format!("/{}", "a".repeat(900));
    assert_eq!(accepted(&p, &get(&origin, &path, "")).await.status, 200);

    // Host + Connection + 8 = 10 fields pass; one more is 431.
    let eight: String = (0..8).map(|i| format!("X-F{i}: v\r\n")).collect();
    assert_eq!(accepted(&p, &get(&origin, "/", &eight)).await.status, 200);
    let nine: String = (0..9).map(|i| format!("X-F{i}: v\r\n")).collect();
    assert_eq!(accepted(&default, &get(&origin, "/", &nine)).await.status, 200);
    let before = origin.count();
    assert_rejected_after(&p, &origin, &get(&origin, "/", &nine), 431, before).await;
}

/// [`assert_rejected`] for an origin that already served `before` requests.
async fn assert_rejected_after(p: &Portico, origin: &Origin, request: &[u8], status: u16, before: usize) {
    let (bytes, closed) = exchange(p, request).await;
    let resp = parse_response(&bytes);
    assert_eq!(resp.status, status, "{}", String::from_utf8_lossy(&bytes));
    assert!(closed, "connection not closed after {status}");
    assert_eq!(origin.count(), before, "origin got the rejected request");
}

// ---------------------------------------------------------------- line syntax

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obs_fold_and_bare_cr_or_lf_are_rejected_400() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let a = origin.addr();
    // obs-fold
    assert_rejected(&p, &origin, &get(&origin, "/", "X-A: a\r\n b\r\n"), 400).await;
    assert_rejected(&p, &origin, &get(&origin, "/", "X-A: a\r\n\tb\r\n"), 400).await;
    // bare LF line endings throughout, and in one place
    let lf = format!("GET http://{a}/ HTTP/1.1\nHost: {a}\nConnection: close\n\n");
    assert_rejected(&p, &origin, lf.as_bytes(), 400).await;
    assert_rejected(&p, &origin, &get(&origin, "/", "X-A: a\nX-B: b\r\n"), 400).await;
    // bare CR inside a header line
    assert_rejected(&p, &origin, &get(&origin, "/", "X-A: a\rb\r\n"), 400).await;
    assert_rejected(&p, &origin, &get(&origin, "/", "X-A: a\rX-B: b\r\n"), 400).await;
    assert_eq!(origin.connections(), 0);
}

// ---------------------------------------------------------------- Host, version, Expect

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_version_and_expect_rules() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let a = origin.addr();
    let no_host = format!("GET http://{a}/ HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_rejected(&p, &origin, no_host.as_bytes(), 400).await;
    let two_hosts = get(&origin, "/", &format!("Host: {a}\r\n"));
    assert_rejected(&p, &origin, &two_hosts, 400).await;
    let http2 = format!("GET http://{a}/ HTTP/2.0\r\nHost: {a}\r\nConnection: close\r\n\r\n");
    assert_rejected(&p, &origin, http2.as_bytes(), 505).await;
    assert_rejected(&p, &origin, &get(&origin, "/", "Expect: foo\r\n"), 417).await;
    assert_eq!(origin.connections(), 0);

    // HTTP/1.0 without Host is fine.
    let http10 = format!("GET http://{a}/ten HTTP/1.0\r\n\r\n");
    let resp = accepted(&p, http10.as_bytes()).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "GET /ten 0:"));
}

// ---------------------------------------------------------------- pipelining and smuggling

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_gets_are_answered_in_order() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let a = origin.addr();
    let req = format!(
        "GET http://{a}/one HTTP/1.1\r\nHost: {a}\r\n\r\n\
         GET http://{a}/two HTTP/1.1\r\nHost: {a}\r\n\r\n\
         GET http://{a}/three HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"
    );
    let (bytes, closed) = exchange(&p, req.as_bytes()).await;
    assert!(closed);
    let bodies: Vec<String> = parse_responses(&bytes).iter().map(|r| r.body_str()).collect();
    assert_eq!(bodies, ["GET /one 0:", "GET /two 0:", "GET /three 0:"]);
    let paths: Vec<String> = origin.requests().iter().map(|r| r.uri.path().to_owned()).collect();
    assert_eq!(paths, ["/one", "/two", "/three"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_get_after_post_body_is_not_confused_with_the_body() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let a = origin.addr();
    // The body looks like a request; it must stay a body.
    let body = format!("GET http://{a}/evil HTTP/1.1\r\nHost: {a}\r\n\r\n");
    let req = format!(
        "POST http://{a}/post HTTP/1.1\r\nHost: {a}\r\nContent-Length: {}\r\n\r\n{body}\
         GET http://{a}/after HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let (bytes, _) = exchange(&p, req.as_bytes()).await;
    let resps = parse_responses(&bytes);
    assert_eq!(resps.len(), 2, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(resps[0].body_str(), format!("POST /post {}:{body}", body.len()));
    assert_eq!(resps[1].body_str(), "GET /after 0:");
    let paths: Vec<String> = origin.requests().iter().map(|r| r.uri.path().to_owned()).collect();
    assert_eq!(paths, ["/post", "/after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_cl_zero_plus_chunked_is_rejected_and_smuggled_request_never_seen() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let a = origin.addr();
    // A CL-reading hop would see an empty POST then "GET /smuggled";
    // a TE-reading hop would see one chunked POST. Portico must refuse both.
    let smuggled = format!("GET http://{a}/smuggled HTTP/1.1\r\nHost: {a}\r\n\r\n");
    let req = format!(
        "POST http://{a}/front HTTP/1.1\r\nHost: {a}\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n\
         {smuggled}"
    );
    assert_rejected(&p, &origin, req.as_bytes(), 400).await;
    let req = format!(
        "POST http://{a}/front HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n\
         0\r\n\r\n{smuggled}"
    );
    assert_rejected(&p, &origin, req.as_bytes(), 400).await;
    assert!(!origin.wait_count(1, Duration::from_millis(200)).await);
    assert_eq!(origin.connections(), 0);
}

// ---------------------------------------------------------------- timeouts and body limits

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_head_times_out_408_while_others_are_served() {
    let origin = echo_origin().await;
    let p = portico("[limits]\nheader_timeout = \"1s\"\n").await;
    let a = origin.addr();
    let mut slow = RawClient::connect(p.addr()).await;
    slow.send(format!("GET http://{a}/slow HTTP/1.1\r\nHost: {a}\r\nX-Half: ").as_bytes())
        .await;

    // Another client is served while the slow one hangs.
    let resp = accepted(&p, &get(&origin, "/fast", "")).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "GET /fast 0:"));

    let bytes = slow.read_to_end().await;
    assert!(slow.is_eof(), "slow client's connection was not closed");
    if !bytes.is_empty() {
        assert_eq!(parse_response(&bytes).status, 408);
    }
    let paths: Vec<String> = origin.requests().iter().map(|r| r.uri.path().to_owned()).collect();
    assert_eq!(paths, ["/fast"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_max_body_size_is_413() {
    let origin = echo_origin().await;
    let p = portico("[limits]\nmax_body_size = \"1KiB\"\n").await;

    // Exactly at the limit is fine.
    let ok = "x".repeat(1024);
    let resp = accepted(&p, &post(&origin, "Content-Length: 1024\r\n", &ok)).await;
    assert_eq!(
        (resp.status, resp.body_str().len()),
        (200, "POST /up 1024:".len() + 1024)
    );
    let served = origin.count();
    let conns = origin.connections();

    // Content-Length over the limit: 413 before any origin is contacted.
    let big = "x".repeat(2048);
    assert_rejected_after(
        &p,
        &origin,
        &post(&origin, "Content-Length: 2048\r\n", &big),
        413,
        served,
    )
    .await;
    assert_eq!(origin.connections(), conns, "origin contacted for a 413");

    // Chunked growing past the limit: cut off with 413, or the connection closed.
    let chunked = format!(
        "400\r\n{}\r\n400\r\n{}\r\n0\r\n\r\n",
        "y".repeat(1024),
        "z".repeat(1024)
    );
    let (bytes, closed) = exchange(&p, &post(&origin, "Transfer-Encoding: chunked\r\n", &chunked)).await;
    assert!(closed, "connection not closed after an oversized chunked body");
    if !bytes.is_empty() {
        assert_eq!(
            parse_response(&bytes).status,
            413,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
    }
    assert_eq!(origin.count(), served, "origin got the oversized chunked body");
}

// ---------------------------------------------------------------- leading empty lines

/// Writes `request` (ignoring a write cut short by the peer closing) and
/// reads until EOF or 5 s; returns the bytes and whether EOF was reached.
async fn exchange_lenient(p: &Portico, request: &[u8]) -> (Vec<u8>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    let _ = stream.write_all(request).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_few_leading_empty_lines_are_ignored() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let mut req = b"\r\n\r\n".to_vec();
    req.extend(get(&origin, "/after-blank", ""));
    let resp = accepted(&p, &req).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "GET /after-blank 0:"));
}

/// Leading empty lines count toward the head limit: without that, a client
/// could make Portico buffer (and rescan) an unbounded run of CRLFs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leading_empty_lines_beyond_the_head_limit_are_rejected() {
    let origin = echo_origin().await;
    let p = portico("").await;
    let mut req = b"\r\n".repeat(64 * 1024); // 128 KiB of blank lines
    req.extend(get(&origin, "/after-blank", ""));
    let (bytes, closed) = exchange_lenient(&p, &req).await;
    assert!(closed, "connection not closed");
    if !bytes.is_empty() {
        let status = parse_response(&bytes).status;
        assert!(status == 431 || status == 400, "{}", String::from_utf8_lossy(&bytes));
    }
    assert_eq!(origin.count(), 0, "request behind 128 KiB of blank lines was served");
}

// ---------------------------------------------------------------- what the origin is sent

/// A POST through the forward proxy to `origin` with the given framing
/// field lines and body, on its own connection.
fn post_to(origin: &RecordingOrigin, fields: &str, body: &str) -> Vec<u8> {
    let a = origin.addr();
    format!("POST http://{a}/up HTTP/1.1\r\nHost: {a}\r\n{fields}Connection: close\r\n\r\n{body}").into_bytes()
}

/// RFC 9110 8.6 lets a client send `Content-Length: 5, 5` (or the field
/// twice, or `005`); an origin that reads such a list as 0, or as invalid,
/// sees other message boundaries than Portico on a pooled connection. The
/// origin must get exactly one canonical `Content-Length: 5`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_is_sent_upstream_once_and_canonical() {
    let origin = RecordingOrigin::start().await;
    let p = portico("").await;
    for fields in [
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
        "Content-Length: 005\r\n",
        "Content-Length: 5,5\r\nContent-Length: 05\r\n",
    ] {
        let resp = accepted(&p, &post_to(&origin, fields, "hello")).await;
        assert_eq!(resp.status, 200, "{fields:?}: {resp:?}");
        let got = origin.take().await;
        assert_eq!(got.len(), 1, "{fields:?}: {got:?}");
        assert_eq!(
            got[0].error,
            None,
            "{fields:?}: {:?}",
            String::from_utf8_lossy(&got[0].raw)
        );
        assert_eq!(got[0].headers_all("content-length"), ["5"], "{fields:?}");
        assert_eq!(got[0].body, b"hello");
        let head = String::from_utf8_lossy(&got[0].raw).to_ascii_lowercase();
        assert_eq!(head.matches("content-length").count(), 1, "{head}");
    }
    // An empty body keeps its explicit, canonical zero length.
    let resp = accepted(&p, &post_to(&origin, "Content-Length: 0, 00\r\n", "")).await;
    assert_eq!(resp.status, 200);
    let got = origin.take().await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].headers_all("content-length"), ["0"]);
    // Different values: 400, and nothing reaches the origin.
    for fields in ["Content-Length: 5, 6\r\n", "Content-Length: 5\r\nContent-Length: 6\r\n"] {
        let (bytes, closed) = exchange(&p, &post_to(&origin, fields, "hello!")).await;
        assert_eq!(parse_response(&bytes).status, 400, "{fields:?}");
        assert!(closed);
    }
    assert!(origin.take().await.is_empty());
    assert_eq!(origin.connections(), 1);
}

/// The first read of a head takes 1 KiB (as nginx's
/// `client_header_buffer_size`); a larger head grows the buffer. Heads on
/// either side of that edge and far past it, each sent at once, in pieces,
/// and with the next request right behind it on a keep-alive connection,
/// reach the origin whole, their bodies too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_past_the_first_read_reach_the_origin_whole() {
    let origin = RecordingOrigin::start().await;
    let a = origin.addr();
    let p = portico("").await;
    // A POST whose head is `size` bytes (an X-Pad field fills it), and the pad.
    let request = |size: usize, body: &str| {
        let head = format!(
            "POST http://{a}/up HTTP/1.1\r\nHost: {a}\r\nContent-Length: {}\r\nX-Pad: ",
            body.len()
        );
        let pad = "p".repeat(size - head.len() - 4);
        (format!("{head}{pad}\r\n\r\n{body}").into_bytes(), pad)
    };
    for size in [900, 1023, 1024, 1025, 2048, 3000, 5000, 40_000] {
        let (first, pad) = request(size, "hello");
        let (second, _) = request(size, "again");
        assert_eq!(first.len(), size + 5);
        let one: &[&[u8]] = &[b"hello"];
        let two: &[&[u8]] = &[b"hello", b"again"];
        for (how, pieces, bodies) in [
            ("at once", vec![first.clone()], one),
            (
                "in 700-byte pieces",
                first.chunks(700).map(<[u8]>::to_vec).collect(),
                one,
            ),
            ("two in one write", vec![[first.clone(), second.clone()].concat()], two),
        ] {
            let mut client = RawClient::connect(p.addr()).await;
            for piece in &pieces {
                client.send(piece).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            for _ in bodies {
                let resp = client.read_response().await;
                assert_eq!(resp.status, 200, "{size} {how}: {resp:?}");
            }
            let got = origin.take().await;
            assert_eq!(got.len(), bodies.len(), "{size} {how}");
            for (req, body) in got.iter().zip(bodies) {
                assert_eq!(req.headers_all("x-pad"), [pad.as_str()], "{size} {how}");
                assert_eq!(req.body, *body, "{size} {how}");
            }
        }
    }
}

/// `OPTIONS *` asks about the server, `OPTIONS /` about one resource: the
/// asterisk form goes upstream unchanged (RFC 9112 3.2.4), from a reverse
/// listener, and a forward proxy turns `OPTIONS http://host:port` (empty
/// path) into `OPTIONS *` as the last proxy before the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_asterisk_is_forwarded_as_asterisk() {
    let origin = RecordingOrigin::start().await;
    let a = origin.addr();
    let forward = portico("").await;
    let reverse = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"reverse\"\n\n\
         [[upstream]]\nname = \"o\"\nservers = [\"{a}\"]\n\n[[rule]]\nupstream = \"o\"\n",
        free_addr()
    ))
    .await;
    let cases = [
        (
            &reverse,
            "OPTIONS * HTTP/1.1\r\nHost: site.test\r\n".to_string(),
            "OPTIONS * HTTP/1.1",
        ),
        (
            &reverse,
            "OPTIONS / HTTP/1.1\r\nHost: site.test\r\n".to_string(),
            "OPTIONS / HTTP/1.1",
        ),
        (
            &forward,
            format!("OPTIONS http://{a} HTTP/1.1\r\nHost: {a}\r\n"),
            "OPTIONS * HTTP/1.1",
        ),
        (
            &forward,
            format!("OPTIONS http://{a}/ HTTP/1.1\r\nHost: {a}\r\n"),
            "OPTIONS / HTTP/1.1",
        ),
    ];
    for (p, head, line) in cases {
        let resp = accepted(p, format!("{head}Connection: close\r\n\r\n").as_bytes()).await;
        assert_eq!(resp.status, 200, "{head:?}");
        let got = origin.take().await;
        assert_eq!(got.len(), 1, "{head:?}: {got:?}");
        assert_eq!(got[0].line, line, "{head:?}");
    }
}
