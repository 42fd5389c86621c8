//! Protocol upgrades through the real binary (RFC 9110 7.8): WebSocket
//! between Python's `websockets` client and echo server (Debian
//! `python3-websockets`) through a reverse listener, the handshake in
//! absolute form through a forward listener to the same echo server, the
//! 101's fields relayed unchanged, bytes both ways, the tunnel idle
//! timeout, a protocol not allowed stripped, an ACL deny, and the
//! `proxy.upgrade_protocols` key.

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// The Python with Debian's `python3-websockets` (a pyenv or venv `python3`
/// first on PATH does not see Debian's packages).
fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A `websockets` echo server on a loopback port; prints the port.
const ECHO_SERVER: &str = r#"
import asyncio, sys, websockets

async def echo(ws, path=None):
    async for message in ws:
        await ws.send(message)

async def main():
    async with websockets.serve(echo, "127.0.0.1", 0, max_size=None) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()

asyncio.run(main())
"#;

/// A `websockets` client: connects to argv[1], sends text and binary
/// messages, checks each echo, prints `OK`.
const ECHO_CLIENT: &str = r#"
import asyncio, sys, websockets

async def main():
    async with websockets.connect(sys.argv[1], max_size=None, open_timeout=10) as ws:
        for message in ["hello", "w\u00f6rld " * 50, bytes(range(256)) * 400, "last"]:
            await ws.send(message)
            echo = await asyncio.wait_for(ws.recv(), 10)
            assert echo == message, (type(echo), len(echo))
    print("OK", flush=True)

asyncio.run(main())
"#;

/// The echo server, running, and its address.
struct EchoServer {
    child: Child,
    addr: std::net::SocketAddr,
}

impl EchoServer {
    async fn start() -> EchoServer {
        let mut child = Command::new(python())
            .args(["-c", ECHO_SERVER])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start python3 (Debian python3-websockets: scripts/install-test-deps)");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(10), BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("the echo server printed no port in 10 s")
            .expect("read the echo server's port");
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("echo server: {line:?} (is python3-websockets installed?)"));
        EchoServer {
            child,
            addr: ([127, 0, 0, 1], port).into(),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A reverse proxy sending everything to `origin`; `more` is further config.
async fn reverse_proxy(origin: std::net::SocketAddr, more: &str) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"reverse\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [[upstream]]\nname = \"o\"\nservers = [\"{origin}\"]\n\n\
         [[rule]]\nhost = \"*\"\nupstream = \"o\"\n\n{more}",
        free_addr()
    ))
    .await
}

async fn forward_proxy(more: &str) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n{more}",
        free_addr()
    ))
    .await
}

/// The figure `name` (without labels) on `/metrics` (forward listener).
async fn metric(p: &Portico, name: &str) -> Option<f64> {
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        p.addr()
    );
    let page = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!(page.status, 200, "/metrics: {}", page.body_str());
    page.body_str().lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// A masked client text frame (RFC 6455 5.2), payload under 126 bytes.
fn client_text_frame(payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut f = vec![0x81, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads one short unmasked server frame; returns (opcode, payload).
async fn read_server_frame(s: &mut TcpStream, pending: &mut Vec<u8>) -> (u8, Vec<u8>) {
    let mut tmp = [0u8; 1024];
    loop {
        if pending.len() >= 2 {
            let len = (pending[1] & 0x7f) as usize;
            assert!(
                len < 126 && pending[1] & 0x80 == 0,
                "a short unmasked frame: {pending:?}"
            );
            if pending.len() >= 2 + len {
                let opcode = pending[0] & 0x0f;
                let payload = pending[2..2 + len].to_vec();
                pending.drain(..2 + len);
                return (opcode, payload);
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => pending.extend_from_slice(&tmp[..n]),
            other => panic!("no frame ({other:?}); have {pending:?}"),
        }
    }
}

/// A WebSocket opening handshake; `target` in origin or absolute form.
fn handshake(target: &str, host: &str) -> String {
    format!(
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_and_echo_server_talk_through_a_reverse_listener() {
    let echo = EchoServer::start().await;
    let p = reverse_proxy(echo.addr, "").await;
    let out = Command::new(python())
        .args(["-c", ECHO_CLIENT, &format!("ws://{}/chat", p.addr())])
        .output()
        .await
        .expect("run the websockets client");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "OK",
        "client stderr: {}\nportico: {}",
        String::from_utf8_lossy(&out.stderr),
        p.stderr()
    );
    // Two clients at once, each with its own upgraded connection.
    let url = format!("ws://{}/chat", p.addr());
    let (a, b) = tokio::join!(
        Command::new(python()).args(["-c", ECHO_CLIENT, &url]).output(),
        Command::new(python()).args(["-c", ECHO_CLIENT, &url]).output()
    );
    for o in [a.expect("client a"), b.expect("client b")] {
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "OK",
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// The WebSocket handshake for `target` (`Host: host`) through `proxy`
/// with hand-made frames: three text messages echoed, then a clean close.
async fn raw_websocket_echo(proxy: std::net::SocketAddr, target: &str, host: &str) {
    let mut s = TcpStream::connect(proxy).await.expect("connect");
    s.write_all(handshake(target, host).as_bytes()).await.expect("send");
    let (head, mut pending) = read_response_head(&mut s).await;
    assert_eq!(head.status, 101, "{head:?}");
    assert_eq!(
        head.header("upgrade").map(str::to_ascii_lowercase).as_deref(),
        Some("websocket")
    );
    // RFC 6455 1.3's example key and its accept value.
    assert_eq!(
        head.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    for i in 0..3 {
        let msg = format!("message {i} through {target}");
        s.write_all(&client_text_frame(msg.as_bytes()))
            .await
            .expect("send frame");
        let (opcode, payload) = read_server_frame(&mut s, &mut pending).await;
        assert_eq!(opcode, 1, "a text frame");
        assert_eq!(payload, msg.as_bytes());
    }
    // A close frame (masked with a zero key, status 1000), answered by
    // the server's own.
    s.write_all(&[0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8])
        .await
        .expect("send close");
    let (opcode, _) = read_server_frame(&mut s, &mut pending).await;
    assert_eq!(opcode, 8, "the server's close frame");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_through_a_forward_listener_echoes_both_ways_and_is_counted() {
    let echo = EchoServer::start().await;
    let p = forward_proxy("").await;
    let e = echo.addr;
    raw_websocket_echo(p.addr(), &format!("http://{e}/chat"), &e.to_string()).await;
    assert_eq!(metric(&p, "portico_upstream_upgrades_total").await, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_through_a_transparent_listener_echoes_both_ways() {
    let echo = EchoServer::start().await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"transparent\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n",
        free_addr()
    ))
    .await;
    raw_websocket_echo(p.addr(), "/chat", &echo.addr.to_string()).await;
}

/// An origin that answers every upgrade request with `reply`, records the
/// request heads, then echoes raw bytes until the peer closes.
async fn switching_origin(reply: &'static str, seen: Arc<Mutex<Vec<String>>>) -> RawOrigin {
    RawOrigin::start(move |mut s| {
        let seen = seen.clone();
        async move {
            let got = read_request_head(&mut s).await;
            let end = got
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(got.len(), |p| p + 4);
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&got[..end]).into_owned());
            if s.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            // Bytes that came with the head, then the rest, echoed.
            if s.write_all(&got[end..]).await.is_err() {
                return;
            }
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf).await {
                    Ok(n) if n > 0 => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        }
    })
    .await
}

const SWITCHED: &str = "HTTP/1.1 101 Switching Protocols\r\n\
    Upgrade: websocket\r\n\
    Connection: Upgrade\r\n\
    Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
    Sec-WebSocket-Protocol: chat\r\n\
    X-Origin-Said: hello there\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_101s_fields_reach_the_client_unchanged_and_bytes_flow_both_ways() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let o = switching_origin(SWITCHED, seen.clone()).await;
    let p = reverse_proxy(o.addr(), "").await;
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    // The request head and the first bytes of the new protocol in one write.
    let mut first = handshake("/chat", "www.example.com").into_bytes();
    first.extend_from_slice(b"early bytes|");
    s.write_all(&first).await.expect("send");
    let (head, mut rest) = read_response_head(&mut s).await;
    assert_eq!(head.status, 101);
    assert_eq!(head.reason, "Switching Protocols");
    assert_eq!(head.header("upgrade"), Some("websocket"));
    assert_eq!(
        head.header("connection").map(str::to_ascii_lowercase).as_deref(),
        Some("upgrade")
    );
    assert_eq!(
        head.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    assert_eq!(head.header("sec-websocket-protocol"), Some("chat"));
    assert_eq!(head.header("x-origin-said"), Some("hello there"));
    assert!(head.header("content-length").is_none() && head.header("transfer-encoding").is_none());

    s.write_all(b"more bytes").await.expect("send");
    let want = b"early bytes|more bytes";
    let mut tmp = [0u8; 256];
    while rest.len() < want.len() {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => rest.extend_from_slice(&tmp[..n]),
            other => panic!("echo stopped ({other:?}) at {:?}", String::from_utf8_lossy(&rest)),
        }
    }
    assert_eq!(&rest[..], want);

    let request = seen.lock().unwrap()[0].to_ascii_lowercase();
    assert!(request.contains("\r\nupgrade: websocket\r\n"), "{request}");
    assert!(request.contains("\r\nconnection: upgrade\r\n"), "{request}");
    assert!(
        request.contains("\r\nsec-websocket-key: dghlihnhbxbszsbub25jzq==\r\n"),
        "{request}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_silent_for_the_tunnel_idle_timeout_is_closed() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let o = switching_origin(SWITCHED, seen).await;
    let p = reverse_proxy(o.addr(), "[proxy]\ntunnel_idle_timeout = \"1s\"\n").await;
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    s.write_all(handshake("/chat", "www.example.com").as_bytes())
        .await
        .expect("send");
    let (head, _) = read_response_head(&mut s).await;
    assert_eq!(head.status, 101);
    let started = Instant::now();
    let mut tmp = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut tmp))
        .await
        .expect("the idle upgraded connection was not closed in 10 s");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "closed after {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_not_allowed_has_its_upgrade_offer_removed() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = seen.clone();
    let o = RawOrigin::start(move |mut s| {
        let record = record.clone();
        async move {
            let got = read_request_head(&mut s).await;
            record.lock().unwrap().push(String::from_utf8_lossy(&got).into_owned());
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nplain")
                .await;
        }
    })
    .await;
    // websocket is allowed by default; h2c is not. With the list emptied,
    // websocket is not either.
    let p = reverse_proxy(o.addr(), "").await;
    let q = reverse_proxy(o.addr(), "[proxy]\nupgrade_protocols = []\n").await;
    for (proxy, offer) in [(&p, "h2c"), (&q, "websocket")] {
        let req = format!(
            "GET /x HTTP/1.1\r\nHost: www.example.com\r\nUpgrade: {offer}\r\nConnection: Upgrade, HTTP2-Settings\r\n\
             HTTP2-Settings: AAMAAABkAAQAAP__\r\nConnection: close\r\n\r\n"
        );
        let r = parse_response(&raw_request(proxy.addr(), req.as_bytes()).await);
        assert_eq!((r.status, r.body_str().as_str()), (200, "plain"), "{offer}");
    }
    for request in seen.lock().unwrap().iter() {
        let lower = request.to_ascii_lowercase();
        assert!(!lower.contains("\r\nupgrade:"), "{request}");
        assert!(!lower.contains("http2-settings"), "{request}");
        assert!(!lower.contains("\r\nconnection: upgrade"), "{request}");
    }
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_to_a_request_that_offered_no_upgrade_is_a_bad_gateway() {
    let o = switching_origin(SWITCHED, Arc::new(Mutex::new(Vec::new()))).await;
    let p = reverse_proxy(o.addr(), "").await;
    let req = "GET /x HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n";
    let r = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!(r.status, 502, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_switching_to_a_protocol_not_offered_is_a_bad_gateway() {
    const OTHER: &str = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n";
    let o = switching_origin(OTHER, Arc::new(Mutex::new(Vec::new()))).await;
    let p = reverse_proxy(o.addr(), "").await;
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    s.write_all(handshake("/chat", "www.example.com").as_bytes())
        .await
        .expect("send");
    let (head, _) = read_response_head(&mut s).await;
    assert_eq!(head.status, 502, "{head:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_deny_refuses_an_upgrade_request_before_the_origin() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let o = switching_origin(SWITCHED, seen.clone()).await;
    let p = reverse_proxy(o.addr(), "[[acl]]\naction = \"deny\"\npath = \"/chat\"\nstatus = 403\n").await;
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    s.write_all(handshake("/chat", "www.example.com").as_bytes())
        .await
        .expect("send");
    let (head, _) = read_response_head(&mut s).await;
    assert_eq!(head.status, 403, "{head:?}");
    assert_eq!(o.connections(), 0, "the origin was never contacted");
}

#[test]
fn upgrade_protocols_must_be_protocol_names() {
    let listener = format!("[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n", free_addr());
    let out = Portico::check(&format!(
        "{listener}[proxy]\nupgrade_protocols = [\"websocket\", \"web socket\"]\n"
    ));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("upgrade_protocols"), "{err}");
    assert!(err.contains("web socket"), "{err}");
    let ok = Portico::check(&format!(
        "{listener}[proxy]\nupgrade_protocols = [\"websocket\", \"h2c/1\"]\n"
    ));
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

/// `limits.client_bandwidth` paces what an upgraded connection carries to
/// the client: 96 KiB echoed back at 64 KiB a second with a 16 KiB burst
/// take at least 1.25 s (timed from below only: pacing is never quicker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_upgraded_connection_carries_to_the_client_keeps_to_its_bandwidth() {
    let o = switching_origin(SWITCHED, Arc::new(Mutex::new(Vec::new()))).await;
    let p = reverse_proxy(
        o.addr(),
        "[limits]\nclient_bandwidth = \"64KiB\"\nclient_bandwidth_burst = \"16KiB\"\n",
    )
    .await;
    let mut s = TcpStream::connect(p.addr()).await.expect("connect");
    s.write_all(handshake("/chat", "www.example.com").as_bytes())
        .await
        .expect("send");
    let (head, mut echoed) = read_response_head(&mut s).await;
    assert_eq!(head.status, 101);
    let data: Vec<u8> = (0..96usize << 10).map(|i| (i % 251) as u8).collect();
    let start = Instant::now();
    let (mut from, mut to) = s.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        to.write_all(&sent).await.expect("send");
        to
    });
    let mut buf = vec![0u8; 16 << 10];
    while echoed.len() < data.len() {
        match tokio::time::timeout(Duration::from_secs(20), from.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => echoed.extend_from_slice(&buf[..n]),
            other => panic!("echo stopped ({other:?}) after {} bytes", echoed.len()),
        }
    }
    let took = start.elapsed();
    drop(writer.await.expect("writer"));
    assert_eq!(echoed, data);
    assert!(took.as_secs_f64() >= 1.1, "96 KiB echoed in {took:?}");
}
