//! CONNECT tunnels and forward proxying to https:// origins through the
//! real binary.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A forward listener on a free port, the access log in `{dir}`, plus `extra`.
fn forward_config(extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n{extra}",
        free_addr()
    )
}

/// An origin that echoes every byte back until the peer half-closes, then
/// closes its side.
async fn echo_origin() -> RawOrigin {
    RawOrigin::start(|mut stream| async move {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = stream.shutdown().await;
    })
    .await
}

const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Reads from `stream` until `buf` holds at least `len` bytes (panics after 5 s or on EOF).
async fn read_at_least(stream: &mut TcpStream, buf: &mut Vec<u8>, len: usize) {
    let mut tmp = [0u8; 4096];
    while buf.len() < len {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut tmp))
            .await
            .unwrap_or_else(|_| panic!("timed out; have {:?}", String::from_utf8_lossy(buf)))
            .expect("read from portico");
        assert!(n > 0, "EOF early; have {:?}", String::from_utf8_lossy(buf));
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// Reads until EOF (Ok) or `limit` passes (Err with what arrived).
async fn read_until_eof(stream: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, Vec<u8>> {
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut tmp)).await {
            Err(_) => return Err(got),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(got),
            Ok(Ok(n)) => got.extend_from_slice(&tmp[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_connect_tunnel_to_tls_origin() {
    let origin =
        Origin::start_tls(|req| async move { Response::ok(format!("tunnelled {} {}", req.method, req.uri)) }).await;
    let port = origin.addr().port();
    let ca = origin.ca_pem_path().to_str().expect("utf-8 path").to_owned();
    let portico = Portico::start(&forward_config(&format!("[proxy]\nconnect_ports = [{port}]\n"))).await;

    let out = curl(&[
        "-x",
        &format!("http://{}", portico.addr()),
        "--proxytunnel",
        "--cacert",
        &ca,
        &format!("https://127.0.0.1:{port}/x"),
    ])
    .await;
    assert!(out.status.success(), "curl: {out:?}\n{}", portico.stderr());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tunnelled GET /x");

    // The origin saw a plain GET: Portico did not touch the bytes.
    let reqs = origin.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        (reqs[0].method.as_str(), reqs[0].uri.to_string()),
        ("GET", "/x".to_string())
    );
    assert!(reqs[0].header("via").is_none(), "{:?}", reqs[0].headers);

    let needle = format!("\"CONNECT 127.0.0.1:{port} HTTP/1.1\" 200 ");
    let log = access_log_with(portico.dir(), &needle).await;
    assert!(log.contains(&needle), "{log}");

    // A host name is resolved by Portico (CONNECT localhost:PORT).
    let out = curl(&[
        "-x",
        &format!("http://{}", portico.addr()),
        "--proxytunnel",
        "--cacert",
        &ca,
        &format!("https://localhost:{port}/by-name"),
    ])
    .await;
    assert!(out.status.success(), "curl: {out:?}\n{}", portico.stderr());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tunnelled GET /by-name");
    let needle = format!("\"CONNECT localhost:{port} HTTP/1.1\" 200 ");
    let log = access_log_with(portico.dir(), &needle).await;
    assert!(log.contains(&needle), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_proxy_to_https_uri_does_tls_itself() {
    let origin = Origin::start_tls(|req| async move {
        Response::ok(format!("secure {} {}", req.uri, req.header("via").unwrap_or("-")))
    })
    .await;
    let port = origin.addr().port();
    let ca = origin.ca_pem_path().to_str().expect("utf-8 path").to_owned();
    let portico = Portico::start(&forward_config(&format!("[origin]\nca_file = \"{ca}\"\n"))).await;
    let req = format!("GET https://127.0.0.1:{port}/y HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let resp = parse_response(&raw_request(portico.addr(), req.as_bytes()).await);
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    assert_eq!(resp.body_str(), "secure /y 1.1 portico");
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_port_not_allowed_is_403() {
    let origin = echo_origin().await;
    let port = origin.addr().port();
    // Default connect_ports: only 443.
    let portico = Portico::start(&forward_config("")).await;
    let req = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let raw = raw_request(portico.addr(), req.as_bytes()).await;
    let resp = parse_response(&raw);
    assert_eq!(resp.status, 403, "{}", resp.body_str());
    assert!(resp.body_str().contains("not allowed"), "{}", resp.body_str());
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(origin.connections(), 0, "portico connected to a forbidden port");

    let needle = format!("\"CONNECT 127.0.0.1:{port} HTTP/1.1\" 403 ");
    let log = access_log_with(portico.dir(), &needle).await;
    assert!(log.contains(&needle), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_dead_port_is_502() {
    let dead: SocketAddr = dead_addr().parse().expect("addr");
    let port = dead.port();
    let portico = Portico::start(&forward_config(&format!("[proxy]\nconnect_ports = [{port}]\n"))).await;
    let req = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let resp = parse_response(&raw_request(portico.addr(), req.as_bytes()).await);
    assert_eq!(resp.status, 502, "{}", resp.body_str());
    assert!(resp.body_str().contains(&dead.to_string()), "{}", resp.body_str());
}

/// The `tunnels` section of the JSON statistics.
async fn tunnels(p: &Portico) -> serde_json::Value {
    stats_snapshot(p).await["tunnels"].clone()
}

/// CONNECT tunnels are counted: established, open now, and the bytes each
/// way as they are relayed (a tunnel open for hours shows what it carries),
/// in the JSON document, /metrics and the perfdump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_are_counted_open_and_their_bytes_as_they_are_relayed() {
    let origin = echo_origin().await;
    let port = origin.addr().port();
    let portico = Portico::start(&forward_config(&format!("[proxy]\nconnect_ports = [{port}]\n"))).await;
    assert_eq!(tunnels(&portico).await["established"], 0);

    let mut stream = TcpStream::connect(portico.addr()).await.expect("connect to portico");
    let head = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n12345");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    read_at_least(&mut stream, &mut got, ESTABLISHED.len() + 5).await;
    stream.write_all(b"6789").await.expect("write");
    read_at_least(&mut stream, &mut got, ESTABLISHED.len() + 9).await;
    // Counted just after each write: looked at until it is there.
    let open = stats_when(&portico, "9 bytes down", |s| s["tunnels"]["bytes_down"] == 9).await["tunnels"].clone();
    assert_eq!(
        (
            open["established"].as_u64(),
            open["open"].as_u64(),
            open["bytes_up"].as_u64(),
            open["bytes_down"].as_u64()
        ),
        (Some(1), Some(1), Some(9), Some(9)),
        "counted while the tunnel is open: {open}"
    );

    stream.shutdown().await.expect("shutdown write");
    read_until_eof(&mut stream, Duration::from_secs(10))
        .await
        .expect("closed");
    let closed = stats_when(&portico, "no tunnel open", |s| s["tunnels"]["open"] == 0).await["tunnels"].clone();
    assert_eq!(
        (
            closed["established"].as_u64(),
            closed["open"].as_u64(),
            closed["bytes_up"].as_u64(),
            closed["bytes_down"].as_u64()
        ),
        (Some(1), Some(0), Some(9), Some(9)),
        "{closed}"
    );
    let metrics = page(&portico, "/metrics").await;
    promtool_check(&metrics);
    assert!(metrics.contains("portico_tunnels_established_total 1"), "{metrics}");
    assert!(metrics.contains("portico_tunnels_received_bytes_total 9"), "{metrics}");
    let perf = page(&portico, "/.perf").await;
    assert!(perf.contains("TunnelInfo:"), "{perf}");
    assert!(perf.contains("Bytes up/down    9/9"), "{perf}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_carries_early_bytes_and_ends_on_half_close() {
    let origin = echo_origin().await;
    let port = origin.addr().port();
    let portico = Portico::start(&forward_config(&format!("[proxy]\nconnect_ports = [{port}]\n"))).await;

    let mut stream = TcpStream::connect(portico.addr()).await.expect("connect to portico");
    // The first payload travels in the same write as the CONNECT head.
    let first = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\nearly-bytes|");
    stream.write_all(first.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    read_at_least(&mut stream, &mut got, ESTABLISHED.len() + b"early-bytes|".len()).await;
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!("{}early-bytes|", String::from_utf8_lossy(ESTABLISHED))
    );

    // More bytes, binary included, after the tunnel is up (written while
    // the echo is read, so no socket buffer has to hold it all).
    let more: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let mut echo = Vec::new();
    let (mut rd, mut wr) = stream.split();
    let write = async { wr.write_all(&more).await.expect("write") };
    let read = async {
        let mut tmp = vec![0u8; 64 << 10];
        while echo.len() < more.len() {
            let n = tokio::time::timeout(Duration::from_secs(10), rd.read(&mut tmp))
                .await
                .expect("echo timed out")
                .expect("read");
            assert!(n > 0, "EOF after {} echoed bytes", echo.len());
            echo.extend_from_slice(&tmp[..n]);
        }
    };
    tokio::join!(write, read);
    assert!(echo == more, "echo differs ({} bytes)", echo.len());

    // Half-close: the origin sees EOF, closes, and the client gets EOF.
    stream.shutdown().await.expect("shutdown write");
    let rest = read_until_eof(&mut stream, Duration::from_secs(10))
        .await
        .unwrap_or_else(|got| panic!("tunnel still open after half-close; got {got:?}"));
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(origin.connections(), 1);

    let needle = format!("\"CONNECT 127.0.0.1:{port} HTTP/1.1\" 200 ");
    let log = access_log_with(portico.dir(), &needle).await;
    assert!(log.contains(&needle), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnel_is_closed() {
    let origin = echo_origin().await;
    let port = origin.addr().port();
    let portico = Portico::start(&forward_config(&format!(
        "[proxy]\nconnect_ports = [{port}]\ntunnel_idle_timeout = \"1s\"\n"
    )))
    .await;

    let mut stream = TcpStream::connect(portico.addr()).await.expect("connect to portico");
    let head = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    read_at_least(&mut stream, &mut got, ESTABLISHED.len()).await;
    assert_eq!(got, ESTABLISHED);
    stream.write_all(b"ping").await.expect("write");
    let mut echo = Vec::new();
    read_at_least(&mut stream, &mut echo, 4).await;
    assert_eq!(echo, b"ping");

    // Now silence both ways: Portico closes the tunnel.
    let rest = read_until_eof(&mut stream, Duration::from_secs(10))
        .await
        .unwrap_or_else(|got| panic!("idle tunnel was not closed; got {got:?}"));
    assert!(rest.is_empty(), "{rest:?}");
    assert!(!portico.stderr().contains("panicked"), "{}", portico.stderr());
}

/// Runs `portico rules test` on the config of `portico` for a CONNECT to
/// `target` with `args`; returns what it printed.
fn rules_test_connect(portico: &Portico, target: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["rules", "test", "-c"])
        .arg(portico.config_path())
        .args([target, "--method", "CONNECT"])
        .args(args)
        .output()
        .expect("run portico rules test");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sends `CONNECT target` (plus `extra` header lines) and returns the answer's head and body.
async fn connect_answer(portico: &Portico, target: &str, extra: &str) -> ParsedResponse {
    let mut c = RawClient::connect(portico.addr()).await;
    c.send(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n").as_bytes())
        .await;
    c.read_response().await
}

/// The bug of the access-control issue: a `deny` rule for every host did
/// not stop a CONNECT (the tunnel was attempted) while `rules test`
/// reported `deny: 403`. Now the server and `rules test` match a CONNECT
/// the same way: `deny` refuses it, `redirect` is refused with a reason,
/// header conditions hold, and no byte reaches the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_deny_and_redirect_stop_connect_as_rules_test_says() {
    let origin = echo_origin().await;
    let port = origin.addr().port();
    let target = format!("127.0.0.1:{port}");
    let rules = format!(
        "[proxy]\nconnect_ports = [{port}]\n\n\
         [[rule]]\nhost = \"*\"\nheader = {{ name = \"User-Agent\", regex = \"(?i)badbot\" }}\ndeny = 451\n\n\
         [[rule]]\nhost = \"127.0.0.1\"\nport = {port}\nheader = {{ name = \"X-Go-Elsewhere\" }}\n\
         redirect = {{ to = \"https://elsewhere.test/\" }}\nresponse_headers = {{ set = {{ X-Rule = \"redirect\" }} }}\n\n\
         [[rule]]\nhost = \"127.0.0.1\"\nheader = {{ name = \"X-Allowed\", value = \"yes\" }}\n\n\
         [[rule]]\nhost = \"*\"\ndeny = 403\n"
    );
    let portico = Portico::start(&forward_config(&rules)).await;

    // Matches no header condition: the catch-all deny.
    let r = connect_answer(&portico, &target, "").await;
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert!(r.body_str().contains("denied by a routing rule"), "{}", r.body_str());
    let s = rules_test_connect(&portico, &target, &[]);
    assert!(s.contains(&format!("request: CONNECT {target} from 127.0.0.1")), "{s}");
    assert!(s.contains("matched rule 3 ("), "{s}");
    assert!(s.contains("  deny: 403 (the tunnel is refused)"), "{s}");

    // A header condition on the CONNECT request itself.
    let r = connect_answer(&portico, &target, "User-Agent: BadBot/1.0\r\n").await;
    assert_eq!(r.status, 451, "{}", r.body_str());
    let s = rules_test_connect(&portico, &target, &["--header", "User-Agent: BadBot/1.0"]);
    assert!(s.contains("matched rule 0 (") && s.contains("  deny: 451"), "{s}");

    // A redirect cannot apply to a tunnel: refused, with the reason, and
    // the rule's response headers still apply to the answer.
    let r = connect_answer(&portico, &target, "X-Go-Elsewhere: 1\r\n").await;
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert!(
        r.body_str().contains("a CONNECT tunnel cannot be redirected"),
        "{}",
        r.body_str()
    );
    assert_eq!(r.header("x-rule"), Some("redirect"));
    assert!(r.header("location").is_none());
    let s = rules_test_connect(&portico, &target, &["--header", "X-Go-Elsewhere: 1"]);
    assert!(
        s.contains("  refused: 403: a routing rule redirects this request, but a CONNECT tunnel cannot be redirected"),
        "{s}"
    );

    // Nothing was tunnelled so far.
    assert_eq!(origin.connections(), 0, "a refused CONNECT reached the target");

    // The rule that lets it through (no action): the tunnel works.
    let s = rules_test_connect(&portico, &target, &["--header", "X-Allowed: yes"]);
    assert!(
        s.contains("matched rule 2 (") && s.contains(&format!("tunnel straight to {target}")),
        "{s}"
    );
    let mut c = TcpStream::connect(portico.addr()).await.expect("connect");
    c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nX-Allowed: yes\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let mut got = Vec::new();
    read_at_least(&mut c, &mut got, ESTABLISHED.len()).await;
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
    c.write_all(b"ping").await.expect("send");
    let mut echoed = Vec::new();
    read_at_least(&mut c, &mut echoed, 4).await;
    assert_eq!(echoed, b"ping");
    assert_eq!(origin.connections(), 1);

    // `rules test` accepts an https:// URL for the target too (port 443).
    let s = rules_test_connect(&portico, "https://blocked.test/", &[]);
    assert!(
        s.contains("request: CONNECT blocked.test:443") && s.contains("  deny: 403"),
        "{s}"
    );
}
