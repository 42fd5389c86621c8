//! HTTP/2 to clients (RFC 9113): ALPN `h2` on TLS listeners, cleartext h2
//! by prior knowledge (`h2c = true`), forward, reverse and cache hits over
//! h2, CONNECT over h2 (8.5), the `[http2]` limits and defences (rapid
//! reset, CONTINUATION floods, oversized headers, idle and ping timeouts)
//! and the counters. Real clients: curl, nghttp and h2load (Debian
//! `nghttp2-client`), the `h2` crate's client, and raw frames for what no
//! well-behaved client sends. Certificates generated here with rcgen.

mod common;

use bytes::Bytes;
use common::{Origin, Portico, Response, free_port, metric, page};
use rustls::pki_types::pem::PemObject;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A self-signed certificate for `name`, as `cert.pem` and `cert.key`.
fn cert(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let pem = common::Pem::new(dir, "cert", &[name]);
    (pem.cert, pem.key)
}

/// A `[[listener.certificate]]` table.
fn cert_table(c: &Path, k: &Path) -> String {
    format!(
        "[[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
        c.display(),
        k.display()
    )
}

/// curl, offering HTTP/2, to `https://www.test:{port}{path}` on a TLS
/// listener whose certificate `cert` it trusts (the name resolved to
/// loopback), with `args` before the URL.
async fn curl_www_test(cert: &Path, port: u16, path: &str, args: &[&str]) -> std::process::Output {
    let ca = cert.display().to_string();
    let resolve = format!("www.test:{port}:127.0.0.1");
    let url = format!("https://www.test:{port}{path}");
    let mut all = vec!["--http2", "--cacert", &ca, "--resolve", &resolve];
    all.extend_from_slice(args);
    all.push(&url);
    common::curl(&all).await
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

/// A reverse listener speaking h2c on a free port, in front of `origin`,
/// with `rest` added to the config: its port and the running Portico.
async fn h2c_portico(origin: &Origin, rest: &str) -> (u16, Portico) {
    let port = free_port();
    let p = Portico::start(&reverse_config(port, "h2c = true\n", origin, rest)).await;
    (port, p)
}

/// A reverse listener speaking TLS (a certificate for `www.test` made in
/// `dir`) on a free port, in front of `origin`, with `rest` added to the
/// config: its port, the certificate (for clients to trust) and the
/// running Portico.
async fn tls_portico(dir: &Path, origin: &Origin, rest: &str) -> (u16, PathBuf, Portico) {
    let (c, k) = cert(dir, "www.test");
    let port = free_port();
    let p = Portico::start(&reverse_config(port, &cert_table(&c, &k), origin, rest)).await;
    (port, c, p)
}

/// Waits (up to 10 s) for a /metrics series to reach `n`.
async fn wait_metric(p: &Portico, series: &str, n: u64) {
    for _ in 0..100 {
        if metric(p, series).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{series} never reached {n}: {}", metric(p, series).await);
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
    let origin = Origin::start(|req| async move {
        Response::ok(format!("page over {:?}", req.version)).header("Cache-Control", "max-age=300")
    })
    .await;
    let (port, c, p) = tls_portico(dir.path(), &origin, "").await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = curl_www_test(&c, port, "/page", &["-i", "-w", "\n%{http_version}"]).await;
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

/// A large request body over HTTP/2 on TLS reaches the origin whole, in
/// order: the connection's reads take rustls's plaintext record by record
/// into the h2 crate's buffer (`TlsConn::poll_read_buf`), many of them
/// per read while the upload streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_over_h2_on_tls_reaches_the_origin_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    let origin = Origin::start(|req| async move {
        let sum: u64 = req.body.iter().map(|b| u64::from(*b)).sum();
        Response::ok(format!("{} {sum}", req.body.len()))
    })
    .await;
    let (port, c, p) = tls_portico(dir.path(), &origin, "").await;
    let body: Vec<u8> = (0..2_500_000u32).map(|i| (i % 241) as u8).collect();
    let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
    let file = dir.path().join("upload.bin");
    std::fs::write(&file, &body).expect("write body");
    let data = format!("@{}", file.display());
    let out = curl_www_test(&c, port, "/up", &["--data-binary", &data, "-w", " %{http_version}"]).await;
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), p.stderr());
    assert_eq!(text(&out.stdout), format!("{} {sum} 2", body.len()));
    assert_eq!(origin.requests()[0].body, body, "the body was altered on the way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_false_keeps_a_tls_listener_to_http_1_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, k) = cert(dir.path(), "www.test");
    let origin = Origin::start(|_| async move { Response::ok("one") }).await;
    let port = free_port();
    let listener = format!("http2 = false\n{}", cert_table(&c, &k));
    let p = Portico::start(&reverse_config(port, &listener, &origin, "")).await;
    let out = curl_www_test(&c, port, "/", &["-w", " %{http_version}"]).await;
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), p.stderr());
    assert_eq!(text(&out.stdout), "one 1.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_by_prior_knowledge_is_served_only_where_enabled_beside_http1() {
    let origin = Origin::start(|req| async move { Response::ok(format!("got {}", req.uri.path())) }).await;
    let (port, p) = h2c_portico(&origin, "").await;
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

/// A connection's streams are served concurrently, inside the connection's
/// task: one waiting on a slow origin holds back neither the others'
/// responses nor their cache hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_waiting_on_a_slow_origin_holds_back_no_other_stream_of_its_connection() {
    let origin = Origin::start(|req| async move {
        let r = Response::ok(format!("got {}", req.uri.path())).header("Cache-Control", "max-age=60");
        if req.uri.path() == "/slow" {
            // Longer than both other requests' timeouts together, so that
            // /slow is still waiting when they are checked, even on a
            // loaded machine.
            r.delay(Duration::from_secs(8))
        } else {
            r
        }
    })
    .await;
    let (port, p) = h2c_portico(&origin, "").await;
    let mut send = h2c(port).await;
    let get = |path: &str| {
        http::Request::get(format!("http://127.0.0.1:{port}{path}"))
            .body(())
            .expect("request")
    };
    let mut slow_send = send.clone();
    let slow_req = get("/slow");
    let slow = tokio::spawn(async move { h2_get(&mut slow_send, slow_req).await });
    assert!(origin.wait_count(1, Duration::from_secs(5)).await, "{}", p.stderr());

    // While /slow waits on the origin: a miss, then the same URL as a hit.
    let started = std::time::Instant::now();
    for (n, x_cache) in [(0, "MISS"), (1, "HIT")] {
        let (parts, body) = tokio::time::timeout(Duration::from_secs(3), h2_get(&mut send, get("/fast")))
            .await
            .unwrap_or_else(|_| panic!("request {n} for /fast waited behind /slow"));
        assert_eq!(parts.status, 200);
        assert_eq!(text(&body), "got /fast");
        assert_eq!(
            parts.headers.get("x-cache").and_then(|v| v.to_str().ok()),
            Some(x_cache)
        );
    }
    assert!(!slow.is_finished(), "/slow answered within {:?}", started.elapsed());
    let (parts, body) = slow.await.expect("slow stream");
    assert_eq!(parts.status, 200);
    assert_eq!(text(&body), "got /slow");
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
    let (port, p) = h2c_portico(&origin, "").await;
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
    // Counted as they are relayed, the tunnel still open.
    let tunnels =
        common::stats_when(&p, "15 bytes down", |s| s["tunnels"]["bytes_down"] == 15).await["tunnels"].clone();
    assert_eq!(
        (
            tunnels["open"].as_u64(),
            tunnels["bytes_up"].as_u64(),
            tunnels["bytes_down"].as_u64()
        ),
        (Some(1), Some(15), Some(15)),
        "{tunnels}"
    );
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

/// One HTTP/2 frame (RFC 9113 4.1).
fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;

/// The HPACK block of `GET http://localhost/`: static-table indexes for
/// :method GET, :scheme http, :path /, and :authority as a literal.
fn get_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x84, 0x01, 9];
    b.extend_from_slice(b"localhost");
    b
}

/// The client connection preface (RFC 9113 3.4): the magic octets and a
/// SETTINGS frame carrying `settings`.
fn client_preface(settings: &[u8]) -> Vec<u8> {
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(SETTINGS, 0, 0, settings));
    hello
}

/// A raw h2c connection: the preface and an empty SETTINGS sent.
async fn raw_h2c(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    s.write_all(&client_preface(&[])).await.expect("preface");
    s
}

/// Reads frames until the server closes (true) or `within` passes
/// (false): (type, flags, stream, payload) each.
async fn read_frames(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> (Vec<(u8, u8, u32, Vec<u8>)>, bool) {
    read_frames_until(s, within, |_| false).await
}

/// As [`read_frames`], but returns (false) as soon as `done` says the
/// frames read so far are all that is wanted.
async fn read_frames_until(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
    done: impl Fn(&[(u8, u8, u32, Vec<u8>)]) -> bool,
) -> (Vec<(u8, u8, u32, Vec<u8>)>, bool) {
    let deadline = tokio::time::Instant::now() + within;
    let mut frames = Vec::new();
    loop {
        if done(&frames) {
            return (frames, false);
        }
        let mut head = [0u8; 9];
        match tokio::time::timeout_at(deadline, s.read_exact(&mut head)).await {
            Err(_) => return (frames, false),
            Ok(Err(_)) => return (frames, true),
            Ok(Ok(_)) => {}
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        match tokio::time::timeout_at(deadline, s.read_exact(&mut payload)).await {
            Err(_) => return (frames, false),
            Ok(Err(_)) => return (frames, true),
            Ok(Ok(_)) => {}
        }
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        frames.push((head[3], head[4], stream, payload));
    }
}

/// The error code of the first GOAWAY among `frames`.
fn goaway_code(frames: &[(u8, u8, u32, Vec<u8>)]) -> Option<u32> {
    frames
        .iter()
        .find(|f| f.0 == GOAWAY && f.3.len() >= 8)
        .map(|f| u32::from_be_bytes([f.3[4], f.3[5], f.3[6], f.3[7]]))
}

/// A plain h2c request by curl: the server still serves.
async fn still_serves(port: u16) {
    let url = format!("http://127.0.0.1:{port}/after");
    let out = common::curl(&["--http2-prior-knowledge", "-w", " %{http_version}", &url]).await;
    assert_eq!(text(&out.stdout), "fine 2", "{}", text(&out.stderr));
}

const DATA: u8 = 0;

/// A response body of known length ends its stream with its last DATA
/// frame (END_STREAM on it), with no empty DATA frame of its own after
/// the body: from the origin (a miss) and from the cache (a hit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_known_length_ends_the_stream_with_its_last_data_frame() {
    let origin =
        Origin::start(|_req| async move { Response::ok("b".repeat(5000)).header("Cache-Control", "max-age=300") })
            .await;
    let (port, p) = h2c_portico(&origin, "").await;
    for (stream, want) in [(1u32, "MISS"), (3, "HIT")] {
        let mut s = raw_h2c(port).await;
        s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, stream, &get_block()))
            .await
            .expect("request");
        let (frames, _) = read_frames(&mut s, Duration::from_secs(2)).await;
        let data: Vec<_> = frames.iter().filter(|f| f.0 == DATA && f.2 == stream).collect();
        let body: usize = data.iter().map(|f| f.3.len()).sum();
        assert_eq!(body, 5000, "{want}: {} DATA frames", data.len());
        let last = data.last().expect("DATA frames");
        assert!(!last.3.is_empty(), "{want}: an empty DATA frame ended the stream");
        assert_eq!(
            last.1 & END_STREAM,
            END_STREAM,
            "{want}: the last DATA frame does not end the stream"
        );
        assert!(
            data.iter().rev().skip(1).all(|f| f.1 & END_STREAM == 0),
            "{want}: END_STREAM before the last frame"
        );
    }
    assert_eq!(origin.count(), 1, "the second request was a hit\n{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_gets_goaway_enhance_your_calm_and_others_are_still_served() {
    let origin = Origin::start(|_| async move { Response::ok("fine").delay(Duration::from_millis(50)) }).await;
    let (port, p) = h2c_portico(&origin, "\n[http2]\nmax_pending_reset_streams = 10\n").await;
    let mut s = raw_h2c(port).await;
    // CVE-2023-44487: HEADERS then RST_STREAM, 200 times, in one go.
    let mut flood = Vec::new();
    for i in 0..200u32 {
        let id = 2 * i + 1;
        flood.extend(frame(HEADERS, END_HEADERS | END_STREAM, id, &get_block()));
        flood.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    s.write_all(&flood).await.expect("flood");
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(10)).await;
    assert_eq!(
        goaway_code(&frames),
        Some(0xb),
        "no GOAWAY ENHANCE_YOUR_CALM: {frames:?}"
    );
    assert!(closed, "the connection stayed open after the GOAWAY");
    still_serves(port).await;
    assert_eq!(
        metric(&p, "portico_http2_goaway_sent_total{reason=\"enhance_your_calm\"}").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_closes_the_connection_and_others_are_still_served() {
    let origin = Origin::start(|_| async move { Response::ok("fine") }).await;
    let (port, p) = h2c_portico(&origin, "\n[http2]\nmax_header_list_size = \"16KiB\"\n").await;
    let mut s = raw_h2c(port).await;
    // A header block that never ends: HEADERS without END_HEADERS, then
    // CONTINUATION frames (each a header field) without end.
    let mut flood = frame(HEADERS, END_STREAM, 1, &get_block());
    let mut field = vec![0x00, 5];
    field.extend_from_slice(b"x-pad");
    field.extend_from_slice(&[0x7f, 0x81, 0x07]); // a 1000-byte value
    field.extend(std::iter::repeat_n(b'a', 1000));
    for _ in 0..300 {
        flood.extend(frame(CONTINUATION, 0, 1, &field));
    }
    // The server may close before reading it all: the error is expected.
    let _ = s.write_all(&flood).await;
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(10)).await;
    assert!(goaway_code(&frames).is_some(), "no GOAWAY: {frames:?}");
    assert!(closed, "the connection stayed open after the GOAWAY");
    assert!(
        !frames.iter().any(|f| f.0 == HEADERS),
        "the flooded request was answered"
    );
    still_serves(port).await;
    let calm = metric(&p, "portico_http2_goaway_sent_total{reason=\"enhance_your_calm\"}").await;
    let proto = metric(&p, "portico_http2_goaway_sent_total{reason=\"protocol_error\"}").await;
    assert_eq!(calm + proto, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_list_over_max_header_list_size_gets_431_and_the_connection_serves_on() {
    let origin = Origin::start(|_| async move { Response::ok("fine") }).await;
    let port = free_port();
    let _p = Portico::start(&reverse_config(
        port,
        "h2c = true\n",
        &origin,
        "\n[http2]\nmax_header_list_size = \"16KiB\"\n",
    ))
    .await;
    let big = format!("X-Big: {}", "b".repeat(20_000));
    let url = format!("http://127.0.0.1:{port}/big");
    let out = common::curl(&[
        "--http2-prior-knowledge",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        &big,
        &url,
    ])
    .await;
    assert_eq!(text(&out.stdout), "431", "{}", text(&out.stderr));
    assert_eq!(origin.count(), 0);
    // Just under the limit is served.
    let fits = format!("X-Big: {}", "b".repeat(12_000));
    let out = common::curl(&["--http2-prior-knowledge", "-H", &fits, &url]).await;
    assert_eq!(text(&out.stdout), "fine");
    still_serves(port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nghttp_sees_the_configured_settings_and_h2load_is_held_to_max_concurrent_streams() {
    let now = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (n, pk) = (now.clone(), peak.clone());
    let origin = Origin::start(move |_| {
        let (n, pk) = (n.clone(), pk.clone());
        async move {
            use std::sync::atomic::Ordering::SeqCst;
            let cur = n.fetch_add(1, SeqCst) + 1;
            pk.fetch_max(cur, SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            n.fetch_sub(1, SeqCst);
            Response::ok("fine")
        }
    })
    .await;
    let port = free_port();
    let http2 = "\n[http2]\nmax_concurrent_streams = 5\ninitial_stream_window = \"100KiB\"\ninitial_connection_window = \"2MiB\"\nmax_header_list_size = \"16KiB\"\n";
    let p = Portico::start(&reverse_config(port, "h2c = true\n", &origin, http2)).await;
    let url = format!("http://127.0.0.1:{port}/");
    let out = tokio::process::Command::new("nghttp")
        .args(["-nv", &url])
        .output()
        .await
        .expect("nghttp (Debian nghttp2-client)");
    let v = text(&out.stdout);
    assert!(v.contains("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):5]"), "{v}");
    assert!(v.contains("[SETTINGS_INITIAL_WINDOW_SIZE(0x04):102400]"), "{v}");
    assert!(v.contains("[SETTINGS_MAX_HEADER_LIST_SIZE(0x06):16384]"), "{v}");
    // The connection window: 65,535 by the protocol, raised to 2 MiB.
    assert!(v.contains("(window_size_increment=2031617)"), "{v}");
    // 30 requests, 30 streams asked for at once on one connection.
    let urls: Vec<String> = (0..30).map(|i| format!("http://127.0.0.1:{port}/{i}")).collect();
    let out = tokio::process::Command::new("h2load")
        .args(["-n", "30", "-c", "1", "-m", "30"])
        .args(&urls)
        .output()
        .await
        .expect("h2load (Debian nghttp2-client)");
    let report = text(&out.stdout);
    assert!(
        report.contains("30 total, 30 started, 30 done"),
        "{report}\n{}",
        p.stderr()
    );
    // h2load opens its streams before the server's SETTINGS arrive: those
    // past the limit are refused (REFUSED_STREAM), which it counts as
    // failed; those within it are served.
    let succeeded: u32 = report
        .split(" succeeded")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(succeeded >= 5, "{report}");
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (2..=5).contains(&peak),
        "at most 5 streams at once, saw {peak} at the origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_gets_goaway_but_not_while_a_stream_is_open() {
    let origin = Origin::start(|req| async move {
        let wait = if req.uri.path() == "/slow" { 2500 } else { 0 };
        Response::ok("fine").delay(Duration::from_millis(wait))
    })
    .await;
    let port = free_port();
    let http2 = "\n[http2]\nidle_timeout = \"1s\"\nping_interval = \"0s\"\n";
    let p = Portico::start(&reverse_config(port, "h2c = true\n", &origin, http2)).await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    // A stream open longer than the idle timeout is not cut.
    let req = http::Request::get(format!("http://127.0.0.1:{port}/slow"))
        .body(())
        .expect("request");
    let (parts, body) = h2_get(&mut client, req).await;
    assert_eq!((parts.status.as_u16(), text(&body).as_str()), (200, "fine"));
    // Then idle: GOAWAY, the connection ends.
    let started = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "the idle connection was not closed");
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "closed before the idle timeout"
    );
    wait_metric(&p, "portico_http2_goaway_sent_total{reason=\"idle\"}", 1).await;
}

/// A client that opens the largest windows HTTP/2 allows, asks for a large
/// object on every stream it may open and then reads nothing pins only a
/// little response data per stream. With 256 KiB buffered per stream one
/// such connection held 34 MB of a 4 MiB cache hit's bytes; now about a
/// quarter of that, as nginx's output buffers would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_opens_its_windows_and_reads_nothing_pins_little_memory() {
    let big = vec![b'x'; 4 << 20];
    let origin = Origin::start(move |_| {
        let big = big.clone();
        async move { Response::ok(big).header("Cache-Control", "max-age=600") }
    })
    .await;
    let (port, p) = h2c_portico(&origin, "\n[cache]\nmemory = \"64MiB\"\ndir = \"{dir}/cache\"\n").await;
    // Cached first.
    let url = format!("http://127.0.0.1:{port}/big");
    let out = common::curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-H",
        "Host: www.test",
        "-w",
        "%{size_download}",
        &url,
    ])
    .await;
    assert_eq!(text(&out.stdout), (4 << 20).to_string());
    let before = p.rss_kib();

    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut s = sock.connect(([127, 0, 0, 1], port).into()).await.expect("connect");
    // SETTINGS_INITIAL_WINDOW_SIZE 2^31-1, and the connection's window to
    // the same.
    let mut hello = client_preface(&[0, 4, 0x7f, 0xff, 0xff, 0xff]);
    hello.extend(frame(WINDOW_UPDATE, 0, 0, &(0x7fff_ffffu32 - 65_535).to_be_bytes()));
    for i in 0..100u32 {
        let block = block_with(b"/big", &[(1, b"www.test")]);
        hello.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1 + 2 * i, &block));
    }
    s.write_all(&hello).await.expect("requests");
    // Let every stream fill what it may, then look.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = p.rss_kib().saturating_sub(before);
    assert!(
        grown < 16 << 10,
        "one connection that reads nothing grew Portico by {grown} KiB"
    );
    assert_eq!(origin.count(), 1);
    drop(s);
}

/// The h2 crate's graceful close sends a PING with the GOAWAY and waits
/// for its acknowledgement. A client that acknowledged nothing after the
/// idle GOAWAY kept its connection (and its descriptor) for ever; now it
/// is closed `ping_timeout` after the GOAWAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_answers_the_idle_goaway_is_closed_after_ping_timeout() {
    let origin = Origin::start(|_| async move { Response::ok("fine") }).await;
    let port = free_port();
    let http2 = "\n[http2]\nidle_timeout = \"1s\"\nping_interval = \"0s\"\nping_timeout = \"1s\"\n";
    let p = Portico::start(&reverse_config(port, "h2c = true\n", &origin, http2)).await;
    let mut s = raw_h2c(port).await;
    // Acknowledge the server's SETTINGS, then never answer anything.
    s.write_all(&frame(SETTINGS, 1, 0, &[])).await.expect("settings ack");
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(8)).await;
    assert!(goaway_code(&frames).is_some(), "no GOAWAY: {frames:?}");
    assert!(frames.iter().any(|f| f.0 == PING), "no shutdown PING: {frames:?}");
    assert!(closed, "the connection is still open 8 s later: {frames:?}");
    wait_metric(&p, "portico_http2_goaway_sent_total{reason=\"idle\"}", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_acknowledges_a_ping_is_closed_after_ping_timeout() {
    let origin = Origin::start(|_| async move { Response::ok("fine") }).await;
    let port = free_port();
    let http2 = "\n[http2]\nping_interval = \"500ms\"\nping_timeout = \"1s\"\n";
    let p = Portico::start(&reverse_config(port, "h2c = true\n", &origin, http2)).await;
    // A client that answers PINGs (the h2 crate does) stays.
    let mut good = h2c(port).await;
    let mut s = raw_h2c(port).await;
    s.write_all(&frame(SETTINGS, 1, 0, &[])).await.expect("settings ack");
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(6)).await;
    assert!(frames.iter().any(|f| f.0 == PING && f.1 == 0), "no PING: {frames:?}");
    assert!(closed, "a client that never acknowledged the PING was kept");
    assert_eq!(
        metric(&p, "portico_http2_goaway_sent_total{reason=\"ping_timeout\"}").await,
        1
    );
    let req = http::Request::get(format!("http://127.0.0.1:{port}/"))
        .body(())
        .expect("request");
    let (parts, _) = h2_get(&mut good, req).await;
    assert_eq!(parts.status, 200, "the client that answered PINGs was closed");
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains("Http2Info:"), "{perf}");
    let xml = page(&p, "/stats-xml").await;
    assert!(xml.contains("countGoawayPingTimeout=\"1\""), "{xml}");
    let json: serde_json::Value = serde_json::from_str(&page(&p, "/.stats.json").await).expect("JSON statistics");
    assert_eq!(json["snapshot"]["http2"]["goaway_ping_timeout"], 1, "{json}");
    assert_eq!(json["snapshot"]["http2"]["connections"], 2, "{json}");
}

/// A request Portico refuses itself (here: neither `:authority` nor
/// `Host`, RFC 9113 8.3.1) gets its 400 on its stream, is logged with its
/// request line, and leaves the connection serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_authority_gets_400_on_its_stream_and_is_logged() {
    let origin = Origin::start(|_| async move { Response::ok("fine") }).await;
    let (port, p) = h2c_portico(&origin, "\n[log]\naccess = \"{dir}/access.log\"\n").await;
    let mut s = raw_h2c(port).await;
    // :method GET, :scheme http, :path /nohost: no :authority, no Host.
    let mut requests = frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &[0x82, 0x86, 0x04, 7, b'/', b'n', b'o', b'h', b'o', b's', b't'],
    );
    // Then a good one on the same connection.
    requests.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &get_block()));
    s.write_all(&requests).await.expect("requests");
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(2)).await;
    let status = |stream| {
        frames
            .iter()
            .find(|f| f.0 == HEADERS && f.2 == stream)
            .and_then(|f| f.3.first().copied())
    };
    // HPACK static table: 0x8c is `:status 400`, 0x88 `:status 200`.
    assert_eq!(status(1), Some(0x8c), "{frames:?}");
    assert_eq!(status(3), Some(0x88), "{frames:?}");
    assert!(!closed, "{frames:?}");
    assert_eq!(origin.count(), 1);
    let mut log = String::new();
    for _ in 0..50 {
        log = std::fs::read_to_string(p.dir().join("access.log")).unwrap_or_default();
        if log.lines().count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(log.contains("\"GET /nohost HTTP/2.0\" 400"), "access log: {log}");
    assert!(p.stderr().contains("no :authority and no Host"), "{}", p.stderr());
}

/// The HPACK block of `GET <path>` (`:scheme http`) with the literal
/// fields `fields` after it, each as (static-table name index, value),
/// without Huffman coding: :authority is index 1, host 38.
fn block_with(path: &[u8], fields: &[(u8, &[u8])]) -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x04, path.len() as u8];
    b.extend_from_slice(path);
    for (index, value) in fields {
        if *index < 15 {
            b.push(*index);
        } else {
            b.extend([0x0f, index - 15]);
        }
        b.push(value.len() as u8);
        b.extend_from_slice(value);
    }
    b
}

/// The `:status` of each stream's HEADERS among `frames` (HPACK static
/// index: 0x88 is 200, 0x8c 400).
fn statuses(frames: &[(u8, u8, u32, Vec<u8>)], streams: &[u32]) -> Vec<Option<u8>> {
    streams
        .iter()
        .map(|s| {
            frames
                .iter()
                .find(|f| f.0 == HEADERS && f.2 == *s)
                .and_then(|f| f.3.first().copied())
        })
        .collect()
}

/// A `Host` (without `:authority`) or `:authority` an HTTP/1 request could
/// not carry gets 400 over h2 too. Before, a reverse listener took `Host:
/// www.test/static` with `:path /login.js` as is: the origin was asked for
/// `/login.js` and the answer stored under `http://www.test/static/login.js`,
/// for every client asking for that (cache poisoning by any h2 client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_or_authority_http1_would_refuse_gets_400_over_h2_and_poisons_no_key() {
    let origin = Origin::start(|req| async move {
        Response::ok(format!("origin {}", req.uri.path())).header("Cache-Control", "max-age=300")
    })
    .await;
    let (port, _p) = h2c_portico(&origin, "").await;
    let mut s = raw_h2c(port).await;
    let mut requests = Vec::new();
    // No :authority, a Host with a path in it.
    requests.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &block_with(b"/login.js", &[(38, b"www.test/static")]),
    ));
    // No :authority, two Hosts.
    requests.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &block_with(b"/login.js", &[(38, b"www.test"), (38, b"evil.test")]),
    ));
    // User information in :authority.
    requests.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        5,
        &block_with(b"/login.js", &[(1, b"x@www.test")]),
    ));
    // A space in Host.
    requests.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        7,
        &block_with(b"/login.js", &[(38, b"www.test x")]),
    ));
    s.write_all(&requests).await.expect("requests");
    let (frames, _) = read_frames_until(&mut s, Duration::from_secs(5), |f| {
        statuses(f, &[1, 3, 5, 7]).iter().all(Option::is_some)
    })
    .await;
    assert_eq!(statuses(&frames, &[1, 3, 5, 7]), vec![Some(0x8c); 4], "{frames:?}");
    assert_eq!(origin.count(), 0, "a refused request reached the origin");

    // What a victim asks for comes from the origin, not from a poisoned entry.
    let url = format!("http://127.0.0.1:{port}/static/login.js");
    let out = common::curl(&["-s", "-H", "Host: www.test", &url]).await;
    assert_eq!(text(&out.stdout), "origin /static/login.js");
    assert_eq!(origin.count(), 1);
}

/// A field named `transfer_encoding` or `content_length` gets 400 over h2
/// as over HTTP/1. Forwarded, it framed the body for an origin that reads
/// `_` as `-` (CGI-style servers): a POST whose DATA was `0\r\n\r\nGET
/// /smuggled ...` left that request on the pooled connection, answered to
/// the next client with its cookies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_lookalike_fields_get_400_over_h2_and_reach_no_origin() {
    let origin = Origin::start(|_| async move { Response::ok("fine") }).await;
    let (port, _p) = h2c_portico(&origin, "").await;
    let mut s = raw_h2c(port).await;
    let literal = |name: &[u8], value: &[u8]| {
        let mut b = vec![0x00, name.len() as u8];
        b.extend_from_slice(name);
        b.push(value.len() as u8);
        b.extend_from_slice(value);
        b
    };
    let mut requests = Vec::new();
    for (stream, name, value) in [
        (1, &b"transfer_encoding"[..], &b"chunked"[..]),
        (3, b"content_length", b"39"),
    ] {
        let mut block = get_block();
        block.extend(literal(name, value));
        requests.extend(frame(HEADERS, END_HEADERS | END_STREAM, stream, &block));
    }
    requests.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, &get_block()));
    s.write_all(&requests).await.expect("requests");
    let (frames, _) = read_frames_until(&mut s, Duration::from_secs(5), |f| {
        statuses(f, &[1, 3, 5]).iter().all(Option::is_some)
    })
    .await;
    assert_eq!(
        statuses(&frames, &[1, 3, 5]),
        vec![Some(0x8c), Some(0x8c), Some(0x88)],
        "{frames:?}"
    );
    assert_eq!(origin.count(), 1);
}

/// On a transparent listener the host comes from `:authority`: with user
/// information in it (`allowed.test:x@127.0.0.1:PORT`) the access rules
/// read one host and the connection went to another. 400 now, as for an
/// HTTP/1 `Host` with `@`, and nothing reaches the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_information_in_authority_gets_400_on_a_transparent_h2c_listener() {
    let origin = Origin::start(|_| async move { Response::ok("reached") }).await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{}\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"transparent\"\nh2c = true\n\n[access]\nadmin_allow = [\"127.0.0.1\"]\n",
        free_port()
    );
    let _p = Portico::start(&config).await;
    let mut s = raw_h2c(port).await;
    let authority = format!("allowed.test:x@{}", origin.addr());
    let mut requests = frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &block_with(b"/", &[(1, authority.as_bytes())]),
    );
    let good = origin.addr().to_string();
    requests.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &block_with(b"/", &[(1, good.as_bytes())]),
    ));
    s.write_all(&requests).await.expect("requests");
    let (frames, _) = read_frames_until(&mut s, Duration::from_secs(5), |f| {
        statuses(f, &[1, 3]).iter().all(Option::is_some)
    })
    .await;
    assert_eq!(statuses(&frames, &[1, 3]), vec![Some(0x8c), Some(0x88)], "{frames:?}");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_streams_past_max_error_resets_close_the_connection() {
    // Each request carries a `Connection` field: malformed in HTTP/2
    // (RFC 9113 8.2.2), so its stream is reset with PROTOCOL_ERROR.
    let mut bad = Vec::new();
    for i in 0..30u32 {
        let mut block = get_block();
        block.extend_from_slice(&[0x00, 10]);
        block.extend_from_slice(b"connection");
        block.extend_from_slice(&[5]);
        block.extend_from_slice(b"close");
        bad.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, &block));
    }
    let origin = Origin::start(|_| async move { Response::ok("fine") }).await;
    // Within the default bound (1024): each stream reset, the connection kept.
    let (port, p) = h2c_portico(&origin, "").await;
    let mut s = raw_h2c(port).await;
    s.write_all(&bad).await.expect("requests");
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(1)).await;
    let resets = frames.iter().filter(|f| f.0 == RST_STREAM).count();
    assert_eq!(resets, 30, "{frames:?}");
    assert!(!closed && goaway_code(&frames).is_none(), "{frames:?}");
    drop(p);
    // Past `max_error_resets`: GOAWAY ENHANCE_YOUR_CALM, closed.
    let (port, p) = h2c_portico(&origin, "\n[http2]\nmax_error_resets = 5\n").await;
    let mut s = raw_h2c(port).await;
    s.write_all(&bad).await.expect("requests");
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(10)).await;
    assert_eq!(
        goaway_code(&frames),
        Some(0xb),
        "no GOAWAY ENHANCE_YOUR_CALM: {frames:?}"
    );
    assert!(closed, "the connection stayed open after the GOAWAY");
    assert_eq!(origin.count(), 0);
    still_serves(port).await;
    assert_eq!(
        metric(&p, "portico_http2_goaway_sent_total{reason=\"enhance_your_calm\"}").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_open_stream_finish_then_ends_the_connection() {
    let origin = Origin::start(|_| async move { Response::ok("finished").delay(Duration::from_millis(1500)) }).await;
    let (port, mut p) = h2c_portico(&origin, "").await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.expect("ready");
    let req = http::Request::get(format!("http://127.0.0.1:{port}/slow"))
        .body(())
        .expect("request");
    let (resp, _) = client.send_request(req, true).expect("send");
    assert!(origin.wait_count(1, Duration::from_secs(5)).await);
    p.signal(15);
    let (parts, mut body) = resp.await.expect("response").into_parts();
    assert_eq!(parts.status, 200);
    let mut got = Vec::new();
    while let Some(c) = body.data().await {
        got.extend_from_slice(&c.expect("data"));
    }
    assert_eq!(text(&got), "finished");
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(
        ended.is_ok(),
        "the connection was kept after its last stream while draining"
    );
    assert!(
        p.wait_exit(Duration::from_secs(10)).await.is_some(),
        "portico did not exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origins_early_hints_reach_an_h2_client_before_the_final_response() {
    let origin = common::RawOrigin::start(|mut s| async move {
        common::read_request_head(&mut s).await;
        let _ = s
            .write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n")
            .await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 5\r\n\r\nfinal")
            .await;
        let _ = s.shutdown().await;
    })
    .await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"reverse\"\nh2c = true\n\n[[upstream]]\nname = \"web\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"web\"\n",
        origin.addr()
    );
    let p = Portico::start(&config).await;
    let url = format!("http://127.0.0.1:{port}/hints");
    let out = common::curl(&["--http2-prior-knowledge", "-v", &url]).await;
    assert_eq!(text(&out.stdout), "final", "{}", p.stderr());
    let verbose = text(&out.stderr);
    let hints = verbose
        .find("< HTTP/2 103")
        .unwrap_or_else(|| panic!("no 103 over h2: {verbose}"));
    let link = verbose
        .find("< link: </style.css>; rel=preload; as=style")
        .expect("the 103's Link field");
    let last = verbose.find("< HTTP/2 200").expect("the final response");
    assert!(hints < link && link < last, "{verbose}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_opens_no_window_has_its_stream_reset_after_send_timeout() {
    let origin = Origin::start(|_| async move { Response::ok(vec![b'x'; 100_000]) }).await;
    let (port, p) = h2c_portico(&origin, "\n[limits]\nsend_timeout = \"1s\"\n").await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    // A window of 0: the server may send headers, never a body byte.
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let mut client = client.ready().await.expect("ready");
    let req = http::Request::get(format!("http://127.0.0.1:{port}/big"))
        .body(())
        .expect("request");
    let (resp, _) = client.send_request(req, true).expect("send");
    let (parts, mut body) = resp.await.expect("response head").into_parts();
    assert_eq!(parts.status, 200);
    let started = std::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(10), body.data())
        .await
        .expect("an answer in time");
    let err = match got {
        Some(Err(e)) => e,
        other => panic!("no reset: {other:?}"),
    };
    assert_eq!(err.reason(), Some(h2::Reason::CANCEL), "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "reset before send_timeout"
    );
    assert_eq!(metric(&p, "portico_http2_resets_sent_total").await, 1);
    assert_eq!(metric(&p, "portico_send_timeouts_total").await, 1);
}

/// The body the origin serves for `/big/N`: `BIG` bytes, different per N.
fn big_body(n: u8) -> Vec<u8> {
    (0..BIG).map(|i| ((i * 31 + n as usize) % 251) as u8).collect()
}

const BIG: usize = 3 << 20;

/// An origin serving `/big/N` (`big_body(N)`), cacheable.
async fn big_origin() -> Origin {
    Origin::start(|req| async move {
        let n: u8 = req.uri.path().trim_start_matches("/big/").parse().unwrap_or(0);
        Response::ok(big_body(n)).header("Cache-Control", "max-age=300")
    })
    .await
}

/// Four 3 MiB bodies at once on the HTTP/2 connection `io` (to Portico on
/// `port`, in front of [`big_origin`]), twice: missed then hit.
async fn large_bodies_arrive_whole(
    io: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    scheme: &str,
    port: u16,
    p: &Portico,
) {
    let (send, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    for want in ["MISS", "HIT"] {
        let mut streams = Vec::new();
        for n in 0..4u8 {
            let mut send = send.clone();
            let url = format!("{scheme}://www.test:{port}/big/{n}");
            streams.push(tokio::spawn(async move {
                let req = http::Request::get(url).body(()).expect("request");
                let (parts, body) = h2_get(&mut send, req).await;
                (n, parts, body)
            }));
        }
        for s in streams {
            let (n, parts, body) = tokio::time::timeout(Duration::from_secs(60), s)
                .await
                .expect("a stream stalled")
                .expect("stream task");
            assert_eq!(parts.status, 200, "{}", p.stderr());
            let x_cache = parts.headers.get("x-cache").and_then(|v| v.to_str().ok()).unwrap_or("");
            assert_eq!(x_cache, want, "/big/{n}");
            assert_eq!(body.len(), BIG, "/big/{n} {want}: length");
            assert!(
                body == big_body(n),
                "/big/{n} {want}: the bytes differ from the origin's"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_on_concurrent_tls_streams_arrive_whole_missed_and_hit() {
    // Several 3 MiB bodies at once on one TLS connection: more than rustls
    // buffers before it must send (64 KiB), so the writes that fill its
    // buffer, wait for the socket and go on are all taken, while the
    // client's flow control paces the streams. Once missed (the origin's
    // bytes relayed), once hit (the cache's bytes handed to the stream).
    let dir = tempfile::tempdir().expect("temp dir");
    let origin = big_origin().await;
    let (port, c, p) = tls_portico(dir.path(), &origin, "\n[cache]\nmemory = \"64MiB\"\n").await;
    large_bodies_arrive_whole(tls_h2(&c, port).await, "https", port, &p).await;
    assert_eq!(origin.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_on_concurrent_h2c_streams_arrive_whole_missed_and_hit() {
    // The same over cleartext: what a pass writes is held up to 64 KiB
    // before it is sent without waiting for the pass's end, the same
    // fill, wait and go on as rustls's buffer over TLS.
    let origin = big_origin().await;
    let (port, p) = h2c_portico(&origin, "\n[cache]\nmemory = \"64MiB\"\n").await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    large_bodies_arrive_whole(tcp, "http", port, &p).await;
    assert_eq!(origin.count(), 4);
}

/// A TLS connection to `www.test` on `port` (trusting `cert`) that
/// negotiated `h2` by ALPN.
async fn tls_h2(cert: &Path, port: u16) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    let der = rustls::pki_types::CertificateDer::from_pem_file(cert).expect("certificate");
    roots.add(der).expect("root");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("www.test").expect("name");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    tls
}

/// An origin that answers every request after 300 ms.
async fn late_origin() -> Origin {
    Origin::start(|_req| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Response::ok(b"answered late".to_vec())
    })
    .await
}

/// Raw frames on `s`: the prefaces and their acknowledgements, then one
/// GET of `/late` (`scheme`: the HPACK static index of `:scheme`), and
/// nothing more from the client: the response must still arrive whole.
/// The frames of a pass are held and sent once the pass is over; the
/// response, ready 300 ms after the request was read, is written in a
/// pass of its own, woken by its stream with nothing for the connection
/// to read, and must leave then, not wait for the client's next frame.
/// `server_first`: the server's preface (its SETTINGS) comes before the
/// client's (RFC 9113 3.4 lets it; over TLS Portico sends it while its
/// handshake waits for the client's; h2c is only known from the client's).
async fn a_late_response_reaches_a_silent_client(
    s: &mut (impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin),
    scheme: u8,
    server_first: bool,
    p: &Portico,
) {
    let mut frames = Vec::new();
    if server_first {
        let (got, closed) = read_frames(s, Duration::from_millis(500)).await;
        assert!(!closed && got.iter().any(|f| f.0 == SETTINGS && f.1 == 0), "{got:?}");
        frames = got;
    }
    s.write_all(&client_preface(&[])).await.expect("preface");
    s.flush().await.expect("flush");
    frames.extend(read_frames(s, Duration::from_millis(500)).await.0);
    assert!(frames.iter().any(|f| f.0 == SETTINGS && f.1 == 0), "{frames:?}");
    s.write_all(&frame(SETTINGS, 1, 0, &[])).await.expect("SETTINGS ACK");
    s.flush().await.expect("flush");
    // The server's acknowledgement of ours, the last frame it owes, may
    // have come with its SETTINGS or come now.
    frames.extend(read_frames(s, Duration::from_millis(500)).await.0);
    assert!(frames.iter().any(|f| f.0 == SETTINGS && f.1 == 1), "{frames:?}");
    // GET /late: :method GET, :scheme, then :path and :authority as
    // literals without indexing.
    let mut block = vec![0x82, scheme, 0x04, 5];
    block.extend_from_slice(b"/late");
    block.extend_from_slice(&[0x01, 8]);
    block.extend_from_slice(b"www.test");
    s.write_all(&frame(HEADERS, END_STREAM | END_HEADERS, 1, &block))
        .await
        .expect("request");
    s.flush().await.expect("flush");
    let ended = |f: &[(u8, u8, u32, Vec<u8>)]| f.iter().any(|f| f.0 == DATA && f.2 == 1 && f.1 & END_STREAM != 0);
    let (frames, closed) = read_frames_until(s, Duration::from_secs(3), ended).await;
    assert!(!closed, "{}", p.stderr());
    assert!(
        frames.iter().any(|f| f.0 == HEADERS && f.2 == 1),
        "no response head within 3 s: {frames:?}"
    );
    let body: Vec<u8> = frames
        .iter()
        .filter(|f| f.0 == DATA && f.2 == 1)
        .flat_map(|f| f.3.clone())
        .collect();
    assert_eq!(text(&body), "answered late");
    assert!(ended(&frames), "{frames:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_tls_leaves_when_ready_though_the_client_sends_nothing_more() {
    let dir = tempfile::tempdir().expect("temp dir");
    let origin = late_origin().await;
    let (port, c, p) = tls_portico(dir.path(), &origin, "").await;
    let mut tls = tls_h2(&c, port).await;
    a_late_response_reaches_a_silent_client(&mut tls, 0x87, true, &p).await;
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_h2c_leaves_when_ready_though_the_client_sends_nothing_more() {
    let origin = late_origin().await;
    let (port, p) = h2c_portico(&origin, "").await;
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    a_late_response_reaches_a_silent_client(&mut tcp, 0x86, false, &p).await;
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_socket_has_its_streams_reset_after_send_timeout() {
    // The frames of a pass are held (64 KiB at most) and sent at its end:
    // a client that asks for large bodies, opens every window and then
    // reads nothing more from its socket fills the kernel's buffers, then
    // the pass's, then each stream's send buffer. Nothing grows past
    // those: each stream waits for room, and `send_timeout` ends the wait
    // (a CANCEL, counted), while other clients are served.
    let origin = Origin::start(|req| async move {
        if req.uri.path() == "/after" {
            Response::ok(b"fine".to_vec())
        } else {
            Response::ok(vec![b'x'; 8 << 20])
        }
    })
    .await;
    let (port, p) = h2c_portico(&origin, "\n[limits]\nsend_timeout = \"1s\"\n").await;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut s = socket.connect(([127, 0, 0, 1], port).into()).await.expect("connect");
    // SETTINGS_INITIAL_WINDOW_SIZE = 2^31-1, and the connection's window
    // opened as far: flow control never holds the server back.
    let max = 0x7fff_ffffu32;
    let mut settings = vec![0, 4];
    settings.extend_from_slice(&max.to_be_bytes());
    let mut hello = client_preface(&settings);
    hello.extend(frame(WINDOW_UPDATE, 0, 0, &(max - 65_535).to_be_bytes()));
    for stream in [1u32, 3, 5, 7] {
        hello.extend(frame(HEADERS, END_STREAM | END_HEADERS, stream, &get_block()));
    }
    s.write_all(&hello).await.expect("requests");
    wait_metric(&p, "portico_send_timeouts_total", 1).await;
    still_serves(port).await;
    assert!(metric(&p, "portico_http2_resets_sent_total").await >= 1);
    drop(s);
}

/// `limits.client_request_rate` counts HTTP/2 streams: each is a request,
/// and the ones past the client's burst get 429 with `Retry-After` on
/// their stream while the connection goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_http2_stream_counts_against_the_clients_request_rate() {
    let origin = Origin::start(|_req| async { Response::ok("served") }).await;
    let (port, p) = h2c_portico(
        &origin,
        "\n[cache]\nenabled = false\n\n[limits]\nclient_request_rate = 1\nclient_request_burst = 3\n",
    )
    .await;
    let mut send = h2c(port).await;
    let get = || {
        http::Request::get(format!("http://127.0.0.1:{port}/"))
            .body(())
            .expect("request")
    };
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..5 {
        let (parts, _) = h2_get(&mut send, get()).await;
        if parts.status == 429 {
            retry_after = parts
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
        }
        statuses.push(parts.status.as_u16());
    }
    // The burst of 3, then refused: one more a second is far slower than
    // these are sent.
    assert_eq!(&statuses[..4], [200, 200, 200, 429], "{statuses:?}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(origin.count(), 5 - refused, "a refused stream reached the origin");
    assert_eq!(
        metric(&p, "portico_connection_queue_client_rate_limited_total").await,
        refused as u64
    );
    // The same connection is served again once the bucket has a request.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(h2_get(&mut send, get()).await.0.status, 200);
}
