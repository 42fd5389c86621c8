//! Forward proxying end to end: the real `portico` binary on a loopback
//! port, scripted origins behind it, and curl or raw-socket clients in front.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A forward listener on a free port, logging into its temp dir, plus
/// `extra` config sections.
async fn proxy(extra: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n{extra}"
    ))
    .await
}

/// `http://127.0.0.1:port` of the proxy, for `curl -x`.
fn proxy_url(p: &Portico) -> String {
    format!("http://{}", p.addr())
}

/// A raw absolute-form request to `origin` (Host set to the origin).
fn request(method: &str, origin: SocketAddr, path: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\n{headers}\r\n").into_bytes();
    out.extend_from_slice(body);
    out
}

/// An origin answering `METHOD URI <body>`.
async fn echo_origin() -> Origin {
    Origin::start(|req| async move {
        let mut body = format!("{} {} ", req.method, req.uri).into_bytes();
        body.extend_from_slice(&req.body);
        Response::ok(body)
    })
    .await
}

/// `n` bytes of the harness pattern (byte `i` is `i % 251`).
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_curl_ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "curl failed: {:?}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A URL naming a port outside `proxy.http_ports` (Squid's `Safe_ports`)
/// gets 403 and nothing reaches that port: a POST carrying an SMTP
/// conversation was delivered to port 25 in full, where CONNECT is held
/// to `connect_ports`. Ports in the list (ranges too) are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_naming_a_port_outside_http_ports_is_refused_and_nothing_is_sent() {
    let o = Origin::start(|_| async { Response::ok("reached") }).await;
    let port = o.addr().port();
    let p = proxy(&format!(
        "[proxy]\nhttp_ports = [80, 443, \"{}-{}\"]\n",
        port + 1,
        port + 10
    ))
    .await;
    let post = format!(
        "POST {}/ HTTP/1.1\r\nHost: {}\r\nContent-Length: 10\r\nConnection: close\r\n\r\nHELO evil\n",
        o.url(),
        o.addr()
    );
    let r = parse_response(&raw_request(p.addr(), post.as_bytes()).await);
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert_eq!(o.count(), 0, "the body reached the port");
    // In a range of the list: served.
    let q = proxy(&format!("[proxy]\nhttp_ports = [80, \"{}-{}\"]\n", port - 1, port + 1)).await;
    let r = parse_response(&raw_request(q.addr(), post.as_bytes()).await);
    assert_eq!((r.status, r.body_str().as_str()), (200, "reached"));
    // The default list (1025-65535 among others) serves the test origin's port.
    let d = proxy("").await;
    assert_eq!(
        parse_response(&raw_request(d.addr(), post.as_bytes()).await).status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_get_reaches_origin_in_origin_form_with_via_and_forwarded_for() {
    let origin = Origin::start(|_| async { Response::ok("hello from origin") }).await;
    let p = proxy("").await;

    let out = curl(&["-i", "-x", &proxy_url(&p), &format!("{}/path?q", origin.url())]).await;
    assert_curl_ok(&out);
    let resp = parse_response(&out.stdout);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "hello from origin");
    assert_eq!(resp.header("via"), Some("1.1 portico"), "{:?}", resp.headers);

    let reqs = origin.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.method, "GET");
    assert_eq!(r.uri.to_string(), "/path?q", "origin must get the origin-form target");
    assert_eq!(r.header("host"), Some(origin.addr().to_string().as_str()));
    assert_eq!(r.header("via"), Some("1.1 portico"));
    assert_eq!(r.header("x-forwarded-for"), Some("127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_recipient_appends_its_via_entry_to_every_earlier_one() {
    // RFC 9110 7.6.3, both ways: the client's two proxies and the origin's
    // two, each on a line of its own, all kept, Portico's entry last.
    let origin = Origin::start(|_| async {
        Response::ok("v")
            .header("via", "1.1 origin-side")
            .header("via", "1.1 cdn")
    })
    .await;
    let p = proxy("").await;
    let o = origin.addr();
    let raw = format!(
        "GET http://{o}/v HTTP/1.1\r\nHost: {o}\r\nVia: 1.0 fred\r\nVia: 1.1 wilma\r\nConnection: close\r\n\r\n"
    );
    let resp = parse_response(&raw_request(p.addr(), raw.as_bytes()).await);
    assert_eq!(resp.status, 200);
    let sent: Vec<_> = origin.requests()[0].headers.get_all("via").iter().cloned().collect();
    assert_eq!(sent, ["1.0 fred, 1.1 wilma, 1.1 portico"]);
    assert_eq!(resp.headers_all("via"), ["1.1 origin-side, 1.1 cdn, 1.1 portico"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_is_forwarded_with_its_body() {
    let origin = echo_origin().await;
    let p = proxy("").await;

    // The common ones through curl.
    for method in ["POST", "PUT", "PATCH", "DELETE"] {
        let body = format!("{method}-body");
        let out = curl(&[
            "-x",
            &proxy_url(&p),
            "-X",
            method,
            "--data-binary",
            &body,
            &format!("{}/m", origin.url()),
        ])
        .await;
        assert_curl_ok(&out);
        assert_eq!(stdout(&out), format!("{method} /m {body}"));
    }
    // The odd ones (OPTIONS with a body, an extension method) raw.
    for method in ["OPTIONS", "PROPFIND"] {
        let body = format!("<{method}/>");
        let raw = request(
            method,
            origin.addr(),
            "/m",
            &format!("Content-Length: {}\r\nConnection: close\r\n", body.len()),
            body.as_bytes(),
        );
        let resp = parse_response(&raw_request(p.addr(), &raw).await);
        assert_eq!(resp.status, 200, "{method}: {}", resp.body_str());
        assert_eq!(resp.body_str(), format!("{method} /m {body}"));
    }

    let seen: Vec<(String, String)> = origin
        .requests()
        .iter()
        .map(|r| (r.method.to_string(), String::from_utf8_lossy(&r.body).into_owned()))
        .collect();
    let expected: Vec<(String, String)> = ["POST", "PUT", "PATCH", "DELETE"]
        .iter()
        .map(|m| (m.to_string(), format!("{m}-body")))
        .chain(
            ["OPTIONS", "PROPFIND"]
                .iter()
                .map(|m| (m.to_string(), format!("<{m}/>"))),
        )
        .collect();
    assert_eq!(seen, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_upload_of_3_mib_arrives_intact() {
    const LEN: usize = 3 << 20;
    let origin = Origin::start(|req| async move { Response::ok(format!("got {}", req.body.len())) }).await;
    let p = proxy("").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("upload.bin");
    std::fs::write(&file, pattern(LEN)).expect("write upload file");

    let out = curl(&[
        "-x",
        &proxy_url(&p),
        "--data-binary",
        &format!("@{}", file.display()),
        "-H",
        "Content-Type: application/octet-stream",
        &format!("{}/upload", origin.url()),
    ])
    .await;
    assert_curl_ok(&out);
    assert_eq!(stdout(&out), format!("got {LEN}"));

    let r = &origin.requests()[0];
    assert_eq!(r.header("content-length"), Some(LEN.to_string().as_str()));
    assert!(r.header("transfer-encoding").is_none());
    assert_eq!(r.body.len(), LEN);
    assert!(pattern_matches(0, &r.body), "upload corrupted on the way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_upload_from_curl_arrives_intact() {
    const LEN: usize = (1 << 20) + 12345;
    let origin = Origin::start(|req| async move { Response::ok(format!("got {}", req.body.len())) }).await;
    let p = proxy("").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("upload.bin");
    std::fs::write(&file, pattern(LEN)).expect("write upload file");

    let out = curl(&[
        "-x",
        &proxy_url(&p),
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("{}/upload", origin.url()),
    ])
    .await;
    assert_curl_ok(&out);
    assert_eq!(stdout(&out), format!("got {LEN}"));

    let r = &origin.requests()[0];
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert!(r.header("content-length").is_none());
    assert_eq!(r.body.len(), LEN);
    assert!(pattern_matches(0, &r.body), "upload corrupted on the way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_with_trailers_delivers_its_body() {
    let origin = echo_origin().await;
    let p = proxy("").await;
    let body = chunked_body(&[b"first,", b"second,", b"third"], &[("X-Checksum", "abc123")]);
    let raw = request(
        "POST",
        origin.addr(),
        "/t",
        "Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\nConnection: close\r\n",
        &body,
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    assert_eq!(resp.body_str(), "POST /t first,second,third");
    assert_eq!(&origin.requests()[0].body[..], b"first,second,third");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_on_a_get_is_forwarded() {
    let origin = echo_origin().await;
    let p = proxy("").await;
    let body = chunked_body(&[b"query ", b"in a body"], &[]);
    let raw = request(
        "GET",
        origin.addr(),
        "/g",
        "Transfer-Encoding: chunked\r\nConnection: close\r\n",
        &body,
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    assert_eq!(resp.body_str(), "GET /g query in a body");
    assert_eq!(&origin.requests()[0].body[..], b"query in a body");
}

/// Reads one chunked request off `stream` (head already in `buf`) and
/// returns the raw bytes of everything after the head up to the end of the
/// trailer section.
async fn read_chunked_request_tail(stream: &mut TcpStream, mut buf: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("request head") + 4;
    let head = buf[..head_end].to_vec();
    let mut tail = buf.split_off(head_end);
    let mut tmp = [0u8; 4096];
    // The chunked body ends with "0\r\n" + trailers + "\r\n".
    while !(tail.starts_with(b"0\r\n") && tail.ends_with(b"\r\n\r\n")
        || tail.windows(5).any(|w| w == b"\r\n0\r\n") && tail.ends_with(b"\r\n\r\n"))
    {
        match stream.read(&mut tmp).await {
            Ok(0) | Err(_) => break,
            Ok(n) => tail.extend_from_slice(&tmp[..n]),
        }
    }
    (head, tail)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_trailers_reach_the_origin() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Vec<u8>, Vec<u8>)>();
    let origin = RawOrigin::start(move |mut stream| {
        let tx = tx.clone();
        async move {
            let buf = read_request_head(&mut stream).await;
            let got = read_chunked_request_tail(&mut stream, buf).await;
            let _ = tx.send(got);
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                .await;
        }
    })
    .await;
    let p = proxy("").await;
    let body = chunked_body(&[b"first,", b"second"], &[("X-Checksum", "abc123")]);
    let raw = request(
        "POST",
        origin.addr(),
        "/t",
        "Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\nConnection: close\r\n",
        &body,
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "ok"));

    let (head, tail) = rx.recv().await.expect("origin saw the request");
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked\r\n"), "{head}");
    // Re-parse the origin's view of the body with the response parser.
    let mut as_response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    as_response.extend_from_slice(&tail);
    let seen = parse_response(&as_response);
    assert_eq!(seen.body_str(), "first,second");
    assert_eq!(
        seen.trailer("x-checksum"),
        Some("abc123"),
        "trailer lost on the way to the origin; origin got {:?}",
        String::from_utf8_lossy(&tail)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_download_arrives_intact() {
    const LEN: usize = (2 << 20) + 7;
    let origin = Origin::start(|_| async { Response::ok(pattern(LEN)) }).await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    client.send(&request("GET", origin.addr(), "/cl", "", b"")).await;
    let resp = client.read_response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.framing, Framing::ContentLength(LEN as u64));
    assert_eq!(resp.body.len(), LEN);
    assert!(pattern_matches(0, &resp.body), "download corrupted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_download_stays_chunked_and_arrives_intact() {
    let origin = Origin::start(|_| async { Response::ok("").chunked(["alpha ", "beta ", "gamma"], &[]) }).await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    client.send(&request("GET", origin.addr(), "/ch", "", b"")).await;
    let resp = client.read_response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.framing, Framing::Chunked);
    assert!(resp.header("content-length").is_none());
    assert_eq!(resp.body_str(), "alpha beta gamma");

    let out = curl(&["-x", &proxy_url(&p), &format!("{}/ch", origin.url())]).await;
    assert_curl_ok(&out);
    assert_eq!(stdout(&out), "alpha beta gamma");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_response_trailers_reach_a_client_accepting_them() {
    let origin = RawOrigin::start(|mut stream| async move {
        read_request_head(&mut stream).await;
        let mut resp =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\nConnection: close\r\n\r\n"
                .to_vec();
        resp.extend(chunked_body(&[b"hand", b"made"], &[("X-Checksum", "c0ffee")]));
        let _ = stream.write_all(&resp).await;
    })
    .await;
    let p = proxy("").await;
    let raw = request(
        "GET",
        origin.addr(),
        "/tr",
        "TE: trailers\r\nConnection: close\r\n",
        b"",
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.framing, Framing::Chunked);
    assert_eq!(resp.body_str(), "handmade");
    assert_eq!(resp.trailer("x-checksum"), Some("c0ffee"), "{:?}", resp.trailers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let origin = echo_origin().await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    client
        .send(&request(
            "PUT",
            origin.addr(),
            "/e",
            "Expect: 100-continue\r\nContent-Length: 11\r\n",
            b"",
        ))
        .await;
    let interim = client.read_response().await;
    assert_eq!((interim.status, interim.reason.as_str()), (100, "Continue"));

    client.send(b"hello world").await;
    let resp = client.read_response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "PUT /e hello world");
    let r = &origin.requests()[0];
    assert_eq!(&r.body[..], b"hello world");
    assert!(r.header("expect").is_none(), "Expect is met hop by hop, not forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_upload_with_expect_100_continue_works() {
    const LEN: usize = 200_000;
    let origin = Origin::start(|req| async move { Response::ok(format!("got {}", req.body.len())) }).await;
    let p = proxy("").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("upload.bin");
    std::fs::write(&file, pattern(LEN)).expect("write upload file");

    let out = curl(&[
        "-v",
        "-x",
        &proxy_url(&p),
        "-T",
        file.to_str().expect("utf-8 path"),
        "-H",
        "Expect: 100-continue",
        &format!("{}/put", origin.url()),
    ])
    .await;
    assert_curl_ok(&out);
    assert_eq!(stdout(&out), format!("got {LEN}"));
    let verbose = String::from_utf8_lossy(&out.stderr);
    assert!(
        verbose.contains("< HTTP/1.1 100 Continue"),
        "no 100 Continue seen by curl:\n{verbose}"
    );
    let r = &origin.requests()[0];
    assert_eq!(r.method, "PUT");
    assert_eq!(r.body.len(), LEN);
    assert!(pattern_matches(0, &r.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_request_fields_are_not_forwarded() {
    let origin = echo_origin().await;
    let p = proxy("").await;
    let raw = request(
        "GET",
        origin.addr(),
        "/h",
        "Connection: close, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nProxy-Authorization: Basic eA==\r\n\
         Upgrade: foo\r\nTE: gzip\r\nX-Kept: yes\r\n",
        b"",
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200);

    let r = &origin.requests()[0];
    for name in [
        "connection",
        "x-secret",
        "keep-alive",
        "proxy-authorization",
        "upgrade",
        "te",
    ] {
        assert!(
            r.headers.get(name).is_none(),
            "{name} reached the origin: {:?}",
            r.headers
        );
    }
    assert_eq!(r.header("x-kept"), Some("yes"), "end-to-end field lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_response_fields_are_not_forwarded() {
    let origin = RawOrigin::start(|mut stream| async move {
        read_request_head(&mut stream).await;
        let _ = stream
            .write_all(
                b"HTTP/1.1 200 OK\r\nConnection: X-Internal\r\nX-Internal: 1\r\nKeep-Alive: timeout=5\r\n\
                  Proxy-Authenticate: x\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\nok",
            )
            .await;
    })
    .await;
    let p = proxy("").await;
    let raw = request("GET", origin.addr(), "/h", "Connection: close\r\n", b"");
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "ok"));
    for name in ["x-internal", "keep-alive", "proxy-authenticate"] {
        assert!(
            resp.header(name).is_none(),
            "{name} reached the client: {:?}",
            resp.headers
        );
    }
    for value in resp.headers_all("connection") {
        assert!(
            !value.to_ascii_lowercase().contains("x-internal"),
            "origin's Connection reached the client: {value}"
        );
    }
    assert_eq!(resp.header("x-kept"), Some("yes"));
    assert_eq!(resp.header("via"), Some("1.1 portico"));
}

/// TRACE served, as it was before `proxy.allow_trace` existed.
const TRACE_ON: &str = "[proxy]\nallow_trace = true\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_is_refused_with_405_and_no_echo_by_default() {
    let origin = echo_origin().await;
    let p = proxy("").await;
    for max_forwards in ["Max-Forwards: 0\r\n", "Max-Forwards: 5\r\n", ""] {
        let headers = format!(
            "{max_forwards}Cookie: session=s3cr3t\r\nAuthorization: Basic c2VjcmV0\r\nX-Echo: yes\r\nConnection: close\r\n"
        );
        let raw = request("TRACE", origin.addr(), "/t", &headers, b"");
        let resp = parse_response(&raw_request(p.addr(), &raw).await);
        assert_eq!(resp.status, 405, "{max_forwards:?}: {}", resp.body_str());
        let allow = resp.header("allow").expect("Allow header on a 405").to_owned();
        assert!(allow.split(',').any(|m| m.trim() == "GET"), "Allow: {allow}");
        assert!(!allow.split(',').any(|m| m.trim() == "TRACE"), "Allow: {allow}");
        assert_ne!(resp.header("content-type"), Some("message/http"));
        let body = resp.body_str();
        for echoed in ["s3cr3t", "c2VjcmV0", "X-Echo", "x-echo"] {
            assert!(!body.contains(echoed), "{echoed} echoed: {body}");
        }
        assert!(body.contains("proxy.allow_trace"), "{body}");
    }
    assert_eq!((origin.count(), origin.connections()), (0, 0), "origin was contacted");
    // OPTIONS answered here does not offer TRACE either.
    let raw = request(
        "OPTIONS",
        origin.addr(),
        "/o",
        "Max-Forwards: 0\r\nConnection: close\r\n",
        b"",
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200);
    let allow = resp.header("allow").expect("Allow header").to_owned();
    assert!(!allow.contains("TRACE"), "Allow: {allow}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_with_max_forwards_0_is_answered_by_the_proxy() {
    let origin = echo_origin().await;
    let p = proxy(TRACE_ON).await;
    let raw = request(
        "TRACE",
        origin.addr(),
        "/t",
        "Max-Forwards: 0\r\nAuthorization: Basic c2VjcmV0\r\nCookie: session=s3cr3t\r\nX-Echo: yes\r\nConnection: close\r\n",
        b"",
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("message/http"));
    let body = resp.body_str();
    let line = format!("TRACE http://{}/t HTTP/1.1\r\n", origin.addr());
    assert!(
        body.starts_with(&line),
        "echo does not start with the request line: {body:?}"
    );
    assert!(body.to_ascii_lowercase().contains("x-echo: yes\r\n"), "{body:?}");
    assert!(!body.contains("c2VjcmV0"), "credentials echoed: {body:?}");
    assert!(!body.contains("s3cr3t"), "cookie echoed: {body:?}");
    assert!(!body.to_ascii_lowercase().contains("authorization"), "{body:?}");
    assert_eq!((origin.count(), origin.connections()), (0, 0), "origin was contacted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_with_max_forwards_0_is_answered_with_allow() {
    let origin = echo_origin().await;
    let p = proxy("").await;
    let raw = request(
        "OPTIONS",
        origin.addr(),
        "/o",
        "Max-Forwards: 0\r\nConnection: close\r\n",
        b"",
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200);
    let allow = resp.header("allow").expect("Allow header").to_owned();
    for method in ["GET", "OPTIONS"] {
        assert!(allow.split(',').any(|m| m.trim() == method), "Allow: {allow}");
    }
    assert!(resp.body.is_empty());
    assert_eq!((origin.count(), origin.connections()), (0, 0), "origin was contacted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_with_max_forwards_5_is_forwarded_with_4() {
    let origin = echo_origin().await;
    let p = proxy(TRACE_ON).await;
    let raw = request(
        "TRACE",
        origin.addr(),
        "/t",
        "Max-Forwards: 5\r\nConnection: close\r\n",
        b"",
    );
    let resp = parse_response(&raw_request(p.addr(), &raw).await);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "TRACE /t ");
    let r = &origin.requests()[0];
    assert_eq!(r.method, "TRACE");
    assert_eq!(r.header("max-forwards"), Some("4"));
}

/// What the origin sees as `X-Forwarded-For` when the client sent
/// `10.1.1.1`, under `[proxy] x_forwarded_for = policy`.
async fn forwarded_for_seen(policy: &str) -> Option<String> {
    let values = field_seen(policy, "X-Forwarded-For", "10.1.1.1").await;
    assert!(values.len() <= 1, "several X-Forwarded-For fields: {values:?}");
    values.into_iter().next()
}

/// The values of the field `name` the origin sees when the client sent
/// it as `value`, under `[proxy] x_forwarded_for = policy`.
async fn field_seen(policy: &str, name: &str, value: &str) -> Vec<String> {
    let origin = echo_origin().await;
    let p = proxy(&format!("[proxy]\nx_forwarded_for = \"{policy}\"\n")).await;
    let out = curl(&[
        "-x",
        &proxy_url(&p),
        "-H",
        &format!("{name}: {value}"),
        &format!("{}/seen", origin.url()),
    ])
    .await;
    assert_curl_ok(&out);
    let reqs = origin.requests();
    assert_eq!(reqs.len(), 1);
    reqs[0]
        .headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_append_adds_the_client() {
    assert_eq!(
        forwarded_for_seen("append").await.as_deref(),
        Some("10.1.1.1, 127.0.0.1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_replace_keeps_only_the_client() {
    assert_eq!(forwarded_for_seen("replace").await.as_deref(), Some("127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_remove_drops_the_field() {
    assert_eq!(forwarded_for_seen("remove").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_pass_leaves_the_client_value() {
    assert_eq!(forwarded_for_seen("pass").await.as_deref(), Some("10.1.1.1"));
}

/// What the origin sees as `Forwarded` (RFC 7239) when the client sent
/// `for=10.1.1.1;host=bank.example`, under `[proxy] x_forwarded_for =
/// policy`: the client's claims are the policy's to keep or correct, as
/// its `X-Forwarded-For` is.
async fn forwarded_seen(policy: &str) -> Vec<String> {
    field_seen(policy, "Forwarded", "for=10.1.1.1;host=bank.example").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_forwarded_field_follows_the_x_forwarded_for_policy() {
    assert_eq!(
        forwarded_seen("append").await,
        ["for=10.1.1.1;host=bank.example, for=127.0.0.1"]
    );
    assert_eq!(forwarded_seen("replace").await, ["for=127.0.0.1"]);
    assert!(forwarded_seen("remove").await.is_empty());
    assert_eq!(forwarded_seen("pass").await, ["for=10.1.1.1;host=bank.example"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_client_gets_close_delimited_body_from_a_chunked_origin() {
    let origin = Origin::start(|_| async { Response::ok("").chunked(["hello ", "old ", "client"], &[]) }).await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    client
        .send(format!("GET http://{}/old HTTP/1.0\r\n\r\n", origin.addr()).as_bytes())
        .await;
    let raw = client.read_to_end().await;
    assert!(client.is_eof(), "connection not closed after a close-delimited body");
    let resp = parse_response(&raw);
    assert_eq!(resp.status, 200);
    assert!(
        resp.header("transfer-encoding").is_none(),
        "chunked sent to an HTTP/1.0 client: {:?}",
        resp.headers
    );
    assert!(resp.header("content-length").is_none());
    assert_eq!(resp.framing, Framing::Close);
    assert_eq!(resp.body_str(), "hello old client");
    // Via records the version the request was received in.
    assert_eq!(origin.requests()[0].header("via"), Some("1.0 portico"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_keep_alive_with_content_length_serves_a_second_request() {
    let origin = Origin::start(|req| async move { Response::ok(format!("len for {}", req.uri)) }).await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    for path in ["/one", "/two"] {
        client
            .send(
                format!(
                    "GET http://{}{path} HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                    origin.addr()
                )
                .as_bytes(),
            )
            .await;
        let resp = client.read_response().await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("connection"), Some("keep-alive"), "{:?}", resp.headers);
        assert!(matches!(resp.framing, Framing::ContentLength(_)), "{:?}", resp.framing);
        assert_eq!(resp.body_str(), format!("len for {path}"));
    }
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_get_responses_in_order() {
    let origin = Origin::start(|req| async move {
        let resp = Response::ok(format!("answer {}", req.uri));
        // The first answer is the slow one, so order is not an accident.
        if req.uri.path() == "/1" {
            resp.delay(Duration::from_millis(200))
        } else {
            resp
        }
    })
    .await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    let mut both = request("GET", origin.addr(), "/1", "", b"");
    both.extend(request("GET", origin.addr(), "/2", "", b""));
    client.send(&both).await;
    assert_eq!(client.read_response().await.body_str(), "answer /1");
    assert_eq!(client.read_response().await.body_str(), "answer /2");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_closes_after_the_response() {
    let origin = echo_origin().await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    client
        .send(&request("GET", origin.addr(), "/c", "Connection: close\r\n", b""))
        .await;
    let resp = client.read_response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "GET /c ");
    assert_eq!(resp.header("connection"), Some("close"));
    let rest = client.read_to_end().await;
    assert!(rest.is_empty(), "bytes after the response: {rest:?}");
    assert!(client.is_eof(), "connection left open after Connection: close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_forwarded_without_a_body_and_the_connection_is_reused() {
    let origin = Origin::start(|_| async { Response::ok(vec![b'x'; 1234]) }).await;
    let p = proxy("").await;
    let mut client = RawClient::connect(p.addr()).await;
    client.send(&request("HEAD", origin.addr(), "/h", "", b"")).await;
    let head = client.read_head_response().await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some("1234"), "{:?}", head.headers);

    // Any stray body bytes after the HEAD response would corrupt this one.
    client.send(&request("GET", origin.addr(), "/g", "", b"")).await;
    let resp = client.read_response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, vec![b'x'; 1234]);

    let methods: Vec<String> = origin.requests().iter().map(|r| r.method.to_string()).collect();
    assert_eq!(methods, ["HEAD", "GET"]);
}

/// True if `ts` looks like `10/Oct/2000:13:55:36 +0000`.
fn is_clf_time(ts: &str) -> bool {
    const SHAPE: &str = "dd/Aaa/dddd:dd:dd:dd +0000";
    ts.len() == SHAPE.len()
        && ts.bytes().zip(SHAPE.bytes()).all(|(c, s)| match s {
            b'd' => c.is_ascii_digit(),
            b'A' => c.is_ascii_uppercase(),
            b'a' => c.is_ascii_lowercase(),
            _ => c == s,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_gets_a_combined_format_line() {
    let origin = Origin::start(|_| async { Response::ok("fifteen bytes!!") }).await;
    let p = proxy("").await;
    let url = format!("{}/x", origin.url());
    let out = curl(&["-x", &proxy_url(&p), "-A", "portico-test/1.0", &url]).await;
    assert_curl_ok(&out);
    assert_eq!(stdout(&out), "fifteen bytes!!");

    let path = p.dir().join("access.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let log = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.ends_with('\n') || std::time::Instant::now() >= deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 1, "expected one access-log line, got {log:?}");
    let line = lines[0];

    // ^127\.0\.0\.1 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000\] "GET URL HTTP/1\.1" 200 15 "-" "portico-test/1\.0"$
    let rest = line
        .strip_prefix("127.0.0.1 - - [")
        .unwrap_or_else(|| panic!("bad start: {line:?}"));
    let (ts, rest) = rest.split_once(']').unwrap_or_else(|| panic!("no ']': {line:?}"));
    assert!(is_clf_time(ts), "bad timestamp {ts:?} in {line:?}");
    assert_eq!(
        rest,
        format!(" \"GET {url} HTTP/1.1\" 200 15 \"-\" \"portico-test/1.0\"")
    );
}
