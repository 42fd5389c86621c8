//! HTTP/2 to clients (RFC 9113): ALPN `h2` on TLS listeners, cleartext h2
//! by prior knowledge (`h2c = true`), forward, reverse and cache hits over
//! h2, CONNECT over h2 (8.5), the `[http2]` limits and defences (rapid
//! reset, CONTINUATION floods, oversized headers, idle and ping timeouts)
//! and the counters. Real clients: curl, nghttp and h2load (Debian
//! `nghttp2-client`), the `h2` crate's client, and raw frames for what no
//! well-behaved client sends. Certificates generated here with rcgen.

mod common;

use bytes::Bytes;
use common::{Origin, Portico, Response, free_port, parse_response, raw_request};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A self-signed certificate for `name`, as `<stem>.pem` and `<stem>.key`.
fn cert(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key pair");
    let params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    let (c, k) = (dir.join("cert.pem"), dir.join("cert.key"));
    std::fs::write(&c, cert.pem()).expect("write certificate");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    (c, k)
}

/// A `[[listener.certificate]]` table.
fn cert_table(c: &Path, k: &Path) -> String {
    format!(
        "[[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
        c.display(),
        k.display()
    )
}

/// A reverse listener on `port` in front of `origin` (with `extra` keys
/// inside the listener table), and a plain admin listener for the pages.
fn reverse_config(port: u16, listener_extra: &str, origin: &Origin, rest: &str) -> String {
    format!(
        "[[listener]]\naddress = \"127.0.0.1:{}\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"reverse\"\n{listener_extra}\n[[upstream]]\nname = \"web\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"web\"\n\n[access]\nadmin_allow = [\"127.0.0.1\"]\n{rest}",
        free_port(),
        origin.addr()
    )
}

/// A monitoring page from the plain (first) listener.
async fn page(p: &Portico, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", p.addr());
    parse_response(&raw_request(p.addr(), req.as_bytes()).await).body_str()
}

/// The value of a line of /metrics (`name{labels}` as written).
async fn metric(p: &Portico, series: &str) -> u64 {
    let text = page(p, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An `h2` client connection over plain TCP (h2c by prior knowledge).
async fn h2c(port: u16) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// Sends `req` (no body) and reads the whole response.
async fn h2_get(send: &mut h2::client::SendRequest<Bytes>, req: http::Request<()>) -> (http::response::Parts, Vec<u8>) {
    let mut send = send.clone().ready().await.expect("ready");
    let (resp, _) = send.send_request(req, true).expect("send request");
    let (parts, mut body) = resp.await.expect("response").into_parts();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    (parts, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_speaks_http2_by_alpn_to_a_tls_reverse_listener_and_gets_a_cache_hit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, k) = cert(dir.path(), "www.test");
    let origin = Origin::start(|req| async move {
        Response::ok(format!("page over {:?}", req.version)).header("Cache-Control", "max-age=300")
    })
    .await;
    let port = free_port();
    let p = Portico::start(&reverse_config(port, &cert_table(&c, &k), &origin, "")).await;
    let resolve = format!("www.test:{port}:127.0.0.1");
    let url = format!("https://www.test:{port}/page");
    let ca = c.display().to_string();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = common::curl(&[
            "--http2",
            "-i",
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-w",
            "\n%{http_version}",
            &url,
        ])
        .await;
        assert!(out.status.success(), "{}\n{}", text(&out.stderr), p.stderr());
        let stdout = text(&out.stdout);
        assert!(stdout.starts_with("HTTP/2 200"), "{stdout}");
        assert!(stdout.ends_with("\n2"), "curl did not speak HTTP/2: {stdout}");
        // The origin is reached over HTTP/1.1, whatever the client spoke.
        assert!(stdout.contains("page over HTTP/1.1"), "{stdout}");
        let x_cache = stdout
            .lines()
            .find_map(|l| l.strip_prefix("x-cache: "))
            .unwrap_or("")
            .trim()
            .to_string();
        seen.push(x_cache);
    }
    assert_eq!(seen, ["MISS", "HIT"]);
    assert_eq!(origin.count(), 1);
    let via = origin.requests()[0].header("via").unwrap_or("").to_string();
    assert!(
        via.starts_with("2 "),
        "Via names the protocol received (RFC 9110 7.6.3): {via}"
    );
    assert_eq!(metric(&p, "portico_http2_connections_total").await, 2);
    assert_eq!(metric(&p, "portico_http2_streams_total").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_false_keeps_a_tls_listener_to_http_1_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, k) = cert(dir.path(), "www.test");
    let origin = Origin::start(|_| async move { Response::ok("one") }).await;
    let port = free_port();
    let listener = format!("http2 = false\n{}", cert_table(&c, &k));
    let p = Portico::start(&reverse_config(port, &listener, &origin, "")).await;
    let resolve = format!("www.test:{port}:127.0.0.1");
    let url = format!("https://www.test:{port}/");
    let ca = c.display().to_string();
    let out = common::curl(&[
        "--http2",
        "--cacert",
        &ca,
        "--resolve",
        &resolve,
        "-w",
        " %{http_version}",
        &url,
    ])
    .await;
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), p.stderr());
    assert_eq!(text(&out.stdout), "one 1.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_by_prior_knowledge_is_served_only_where_enabled_beside_http1() {
    let origin = Origin::start(|req| async move { Response::ok(format!("got {}", req.uri.path())) }).await;
    let port = free_port();
    let p = Portico::start(&reverse_config(port, "h2c = true\n", &origin, "")).await;
    let url = format!("http://127.0.0.1:{port}/a?b=1");
    let out = common::curl(&["--http2-prior-knowledge", "-w", " %{http_version}", &url]).await;
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), p.stderr());
    assert_eq!(text(&out.stdout), "got /a 2");
    // HTTP/1.1 on the same listener, as before.
    let out = common::curl(&["-w", " %{http_version}", &url]).await;
    assert_eq!(text(&out.stdout), "got /a 1.1");
    drop(p);

    // Without `h2c`, the preface is a bad HTTP/1 request: no HTTP/2.
    let port = free_port();
    let _p = Portico::start(&reverse_config(port, "", &origin, "")).await;
    let url = format!("http://127.0.0.1:{port}/");
    let out = common::curl(&["--http2-prior-knowledge", &url]).await;
    assert!(
        !out.status.success(),
        "h2c served without h2c = true: {}",
        text(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_listener_serves_absolute_urls_from_scheme_and_authority_over_h2() {
    let origin = Origin::start(|req| async move {
        Response::ok(format!(
            "{} {} host={}",
            req.method,
            req.uri,
            req.header("host").unwrap_or("")
        ))
        .header("Cache-Control", "max-age=60")
    })
    .await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{}\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nh2c = true\n\n[access]\nadmin_allow = [\"127.0.0.1\"]\n",
        free_port()
    );
    let p = Portico::start(&config).await;
    let mut client = h2c(port).await;
    let url = format!("http://{}/fwd?x=1", origin.addr());
    let mut caches = Vec::new();
    for _ in 0..2 {
        let req = http::Request::get(&url).body(()).expect("request");
        let (parts, body) = h2_get(&mut client, req).await;
        assert_eq!(parts.status, 200, "{}", p.stderr());
        assert_eq!(text(&body), format!("GET /fwd?x=1 host={}", origin.addr()));
        caches.push(
            parts
                .headers
                .get("x-cache")
                .map(|v| text(v.as_bytes()))
                .unwrap_or_default(),
        );
    }
    assert_eq!(caches, ["MISS", "HIT"], "a cache hit over h2 on a forward listener");
    assert_eq!(origin.count(), 1);
    // The access log line names the protocol as nginx and Squid do.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(p.dir().join("access.log")).unwrap_or_default();
    assert!(log.contains(&format!("GET {url} HTTP/2.0")), "access log: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_with_and_without_a_length_reach_the_origin_over_h2() {
    let origin = Origin::start(|req| async move {
        Response::ok(format!(
            "{} bytes, te={}",
            req.body.len(),
            req.header("transfer-encoding").unwrap_or("-")
        ))
    })
    .await;
    let port = free_port();
    let p = Portico::start(&reverse_config(port, "h2c = true\n", &origin, "")).await;
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let file = p.dir().join("upload.bin");
    std::fs::write(&file, &body).expect("write body");
    let url = format!("http://127.0.0.1:{port}/up");
    let data = format!("@{}", file.display());
    let out = common::curl(&["--http2-prior-knowledge", "--data-binary", &data, &url]).await;
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), p.stderr());
    assert_eq!(text(&out.stdout), "300000 bytes, te=-");
    assert_eq!(origin.requests()[0].body, body);
    // No content-length: streamed to the origin chunked.
    let mut client = h2c(port).await.ready().await.expect("ready");
    let req = http::Request::post(format!("http://127.0.0.1:{port}/up2"))
        .body(())
        .expect("request");
    let (resp, mut up) = client.send_request(req, false).expect("send");
    up.send_data(Bytes::from_static(b"hello "), false).expect("data");
    up.send_data(Bytes::from_static(b"world"), true).expect("data");
    let (parts, mut down) = resp.await.expect("response").into_parts();
    assert_eq!(parts.status, 200);
    let mut got = Vec::new();
    while let Some(c) = down.data().await {
        got.extend_from_slice(&c.expect("data"));
    }
    assert_eq!(text(&got), "11 bytes, te=chunked");
    assert_eq!(origin.requests()[1].body, &b"hello world"[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_over_h2_tunnels_a_stream_to_the_target() {
    // An echo server as the CONNECT target.
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let echo_port = echo.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    let port = free_port();
    let config =
        format!("[[listener]]\naddress = \"127.0.0.1:{port}\"\nh2c = true\n\n[proxy]\nconnect_ports = [{echo_port}]\n");
    let p = Portico::start(&config).await;
    let mut client = h2c(port).await.ready().await.expect("ready");
    let req = http::Request::connect(format!("127.0.0.1:{echo_port}"))
        .body(())
        .expect("request");
    let (resp, mut up) = client.send_request(req, false).expect("send");
    let (parts, mut down) = resp.await.expect("response").into_parts();
    assert_eq!(parts.status, 200, "{}", p.stderr());
    let mut got = Vec::new();
    for word in ["ping ", "through ", "h2"] {
        up.send_data(Bytes::from(word), false).expect("data");
        let want = got.len() + word.len();
        while got.len() < want {
            let c = tokio::time::timeout(Duration::from_secs(5), down.data())
                .await
                .expect("echo in time")
                .expect("stream open")
                .expect("data");
            let _ = down.flow_control().release_capacity(c.len());
            got.extend_from_slice(&c);
        }
    }
    assert_eq!(text(&got), "ping through h2");
    // END_STREAM from the client half-closes the target, which closes:
    // its end comes back as the stream's end.
    up.send_data(Bytes::new(), true).expect("end");
    loop {
        let end = tokio::time::timeout(Duration::from_secs(5), down.data())
            .await
            .expect("end in time");
        match end {
            None => break,
            // The END_STREAM may come on an empty DATA frame.
            Some(Ok(c)) if c.is_empty() => continue,
            other => panic!("the tunnel did not end: {other:?}"),
        }
    }

    // A port not in connect_ports: 403 on the stream, the connection stays.
    let req = http::Request::connect("127.0.0.1:9").body(()).expect("request");
    let (parts, _) = h2_get(&mut client.clone(), req).await;
    assert_eq!(parts.status, 403);
}
