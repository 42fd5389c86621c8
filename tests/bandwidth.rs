//! `limits.client_bandwidth` through the real binary: what one client is
//! sent, over all its connections and whatever the way (a miss from the
//! origin, a hit from memory, a hit from disk through `sendfile`, an HTTP/2
//! stream, a `CONNECT` tunnel), keeps to the rate, while another client
//! has its own share. Time is what this limit is about, so the tests time
//! downloads, only from below: a paced download can never be quicker than
//! the rate allows, however slow the machine, and an unpaced one of these
//! sizes takes milliseconds.

mod common;

use bytes::Bytes;
use common::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 64 KiB a second with a 16 KiB burst: 96 KiB take at least 1.25 s, 48
/// KiB at least 0.5 s, from a full bucket.
const LIMITS: &str = "[limits]\nclient_bandwidth = \"64KiB\"\nclient_bandwidth_burst = \"16KiB\"\n";

const OTHER: &str = "127.0.0.2";
const PROBE: &str = "127.0.0.3";
const CLIENT: &str = "127.0.0.1";

/// An origin with `/disk` (96 KiB, stored on disk only: above the memory
/// tier's largest object), `/mem` (48 KiB, kept in memory), `/burst`
/// (16 KiB, the burst), `/large` (512 KiB) and `/big` (32 MiB, on disk),
/// fresh for ten minutes.
async fn origin() -> Origin {
    Origin::start(|req| async move {
        let len = match req.uri.path() {
            "/mem" => 48 << 10,
            "/burst" => 16 << 10,
            "/large" => 512 << 10,
            "/tiny" => 1 << 10,
            "/big" => 32 << 20,
            _ => 96 << 10,
        };
        Response::ok("").generated(len).header("Cache-Control", "max-age=600")
    })
    .await
}

/// A forward listener and an h2c reverse listener in front of `origin`,
/// a disk cache in the test's directory, and `rest`.
fn config(forward: &str, reverse: &str, origin: &Origin, rest: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{forward}\"\n\n\
         [[listener]]\naddress = \"{reverse}\"\nmode = \"reverse\"\nh2c = true\n\n\
         [[upstream]]\nname = \"web\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nmode = \"reverse\"\nupstream = \"web\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\nmax_memory_object = \"64KiB\"\n\n\
         [proxy]\nconnect_ports = [443, {}]\n\n{rest}",
        origin.addr(),
        origin.addr().port()
    )
}

/// Portico on [`config`] with `rest`, and its forward listener's address.
async fn start(origin: &Origin, rest: &str) -> (Portico, SocketAddr) {
    let (forward, reverse) = (free_addr(), free_addr());
    let p = Portico::start(&config(&forward, &reverse, origin, rest)).await;
    (p, forward.parse().expect("addr"))
}

/// A forward GET of `path` at `origin` through `proxy` from `src`: the
/// response and how long it took.
async fn timed_get(src: &str, proxy: SocketAddr, origin: &Origin, path: &str) -> (ParsedResponse, Duration) {
    let start = Instant::now();
    spawn_get(src, proxy, origin, path, start).await.expect("download")
}

/// [`timed_get`] in a task of its own, timed from `start`: for downloads
/// at the same time.
fn spawn_get(
    src: &str,
    proxy: SocketAddr,
    origin: &Origin,
    path: &str,
    start: Instant,
) -> tokio::task::JoinHandle<(ParsedResponse, Duration)> {
    let o = origin.addr();
    let req = format!("GET http://{o}{path} HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n");
    let src: std::net::IpAddr = src.parse().expect("ip");
    tokio::spawn(async move {
        let bytes = raw_request_from(src, proxy, req.as_bytes()).await;
        (parse_response(&bytes), start.elapsed())
    })
}

/// A `CONNECT` to `target` through `proxy`, read to its end: what came
/// after the `200` answer's head, and how long it all took.
async fn timed_tunnel(proxy: SocketAddr, target: SocketAddr) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut s = tokio::net::TcpStream::connect(proxy).await.expect("connect");
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .expect("send CONNECT");
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut all))
        .await
        .expect("the tunnel ends")
        .expect("read");
    let took = start.elapsed();
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("an answer head") + 4;
    assert!(
        all.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&all[..end])
    );
    (all.split_off(end), took)
}

/// Lets a quiet client's bucket fill again (16 KiB at 64 KiB a second
/// takes 250 ms).
async fn refill() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

fn assert_body(r: &ParsedResponse, len: usize, what: &str) {
    assert_eq!(r.status, 200, "{what}: {:?}", r.headers);
    assert_eq!(r.body.len(), len, "{what}");
    assert!(pattern_matches(0, &r.body), "{what}: the body is not the origin's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_a_response_body_goes_out_keeps_to_the_clients_bandwidth() {
    let o = origin().await;
    let (p, proxy) = start(&o, LIMITS).await;
    // A miss (from the origin) and hits from disk (sendfile) and memory.
    for (path, len, how, least) in [
        ("/disk", 96 << 10, "MISS", 1.1),
        ("/disk", 96 << 10, "HIT", 1.1),
        ("/mem", 48 << 10, "MISS", 0.4),
        ("/mem", 48 << 10, "HIT", 0.4),
    ] {
        refill().await;
        let (r, took) = timed_get(CLIENT, proxy, &o, path).await;
        let what = format!("{path} {how}");
        assert_body(&r, len, &what);
        assert_eq!(r.header("X-Cache"), Some(how), "{what}");
        assert!(
            took.as_secs_f64() >= least,
            "{what}: {len} bytes in {took:?}, faster than 64 KiB/s allows"
        );
    }
    assert_eq!(o.count(), 2);
    // Responses one after another share the bucket: the first of these
    // four 16 KiB ones takes the burst, the next three wait for the rate
    // (48 KiB: at least 0.75 s), though none alone is over the burst.
    refill().await;
    let start = Instant::now();
    for n in 0..4 {
        let (r, _) = timed_get(CLIENT, proxy, &o, "/burst").await;
        assert_body(&r, 16 << 10, &format!("/burst #{n}"));
    }
    let took = start.elapsed();
    assert!(took.as_secs_f64() >= 0.65, "64 KiB in four responses took {took:?}");
    let waits = metric(&p, "portico_connection_queue_client_bandwidth_waits_total").await;
    assert!(waits > 0, "waits counted: {waits}");
    let metrics = page(&p, "/metrics").await;
    let waited: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("portico_connection_queue_client_bandwidth_wait_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no wait seconds in /metrics:\n{metrics}"));
    // About 1.25 + 1.25 + 0.5 + 0.5 s of waiting (less what writing took).
    assert!(waited >= 2.0, "waited {waited} s");
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains("Waits Over Client Bandwidth"), "{perf}");

    // Two connections of one client share its rate (192 KiB: at least
    // 2.75 s); another client, at the same time, has its own (1.25 s).
    refill().await;
    let start = Instant::now();
    let mine = (0..2)
        .map(|_| spawn_get(CLIENT, proxy, &o, "/disk", start))
        .collect::<Vec<_>>();
    let (theirs, their_time) = timed_get(OTHER, proxy, &o, "/disk").await;
    assert_body(&theirs, 96 << 10, "the other client's");
    assert!(their_time.as_secs_f64() >= 1.1, "{their_time:?}");
    let mut slowest = Duration::ZERO;
    for m in mine {
        let (r, took) = m.await.expect("download");
        assert_body(&r, 96 << 10, "one of the client's two");
        slowest = slowest.max(took);
    }
    assert!(
        slowest.as_secs_f64() >= 2.5,
        "two connections of one client got 192 KiB in {slowest:?}: more than its 64 KiB/s"
    );
    assert!(
        their_time < slowest,
        "the other client ({their_time:?}) waited for the first's share ({slowest:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_and_a_connect_tunnel_keep_to_it_too() {
    let o = origin().await;
    // What the tunnel carries: 96 KiB from a server that speaks first.
    let server = RawOrigin::start(|mut s| async move {
        let mut data = vec![0u8; 96 << 10];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let _ = s.write_all(&data).await;
        let _ = s.shutdown().await;
    })
    .await;
    let (forward, reverse) = (free_addr(), free_addr());
    let cfg = config(&forward, &reverse, &o, LIMITS).replace(
        &format!("connect_ports = [443, {}]", o.addr().port()),
        &format!("connect_ports = [443, {}]", server.addr().port()),
    );
    let p = Portico::start(&cfg).await;

    // HTTP/2 (h2c): a miss, then a hit.
    let tcp = tokio::net::TcpStream::connect(&reverse).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    for how in ["miss", "hit"] {
        refill().await;
        let start = Instant::now();
        let mut send = send.clone().ready().await.expect("ready");
        let req = http::Request::get(format!("http://{reverse}/disk"))
            .body(())
            .expect("request");
        let (resp, _) = send.send_request(req, true).expect("send request");
        let (parts, mut body) = resp.await.expect("response").into_parts();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk: Bytes = chunk.expect("body");
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        let took = start.elapsed();
        assert_eq!(parts.status, 200, "{how}");
        assert_eq!(got.len(), 96 << 10, "{how}");
        assert!(pattern_matches(0, &got), "{how}");
        assert!(took.as_secs_f64() >= 1.1, "HTTP/2 {how}: 96 KiB in {took:?}");
    }

    // A CONNECT tunnel: what the server sends the client.
    refill().await;
    let (got, took) = timed_tunnel(p.addr(), server.addr()).await;
    assert_eq!(got.len(), 96 << 10);
    assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    assert!(took.as_secs_f64() >= 1.1, "tunnel: 96 KiB in {took:?}");
}

/// Over TLS (an HTTPS proxy port) the body is written by the TLS stream,
/// not by `sendfile`: a miss and a disk hit keep to the rate all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_proxy_port_keeps_to_it_too() {
    let o = origin().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "proxy", &["127.0.0.1"]);
    let (tls, reverse) = (free_addr(), free_addr());
    let p =
        Portico::start(&config(&tls, &reverse, &o, LIMITS).replacen("\n\n", &format!("\n{}\n", cert_table(&pem)), 1))
            .await;
    let (proxy, ca) = (format!("https://{tls}"), pem.cert.display().to_string());
    let url = format!("{}/disk", o.url());
    for how in ["MISS", "HIT"] {
        refill().await;
        let start = Instant::now();
        let out = curl(&["-i", "--proxy", &proxy, "--proxy-cacert", &ca, &url]).await;
        let took = start.elapsed();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            p.stderr()
        );
        let r = parse_response(&out.stdout);
        assert_body(&r, 96 << 10, how);
        assert_eq!(r.header("X-Cache"), Some(how));
        assert!(took.as_secs_f64() >= 1.1, "{how} over TLS: 96 KiB in {took:?}");
    }
}

/// A miss is read from the origin and stored at the origin's pace, not at
/// that of the limited client that asked: while the first client is still
/// being sent its 96 KiB, the object is stored already, and another
/// client's request for it is a hit rather than a wait on that fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_clients_miss_is_stored_at_the_origins_pace_not_the_clients() {
    let o = origin().await;
    let (p, proxy) = start(&o, LIMITS).await;
    let first = spawn_get(CLIENT, proxy, &o, "/disk", Instant::now());
    // A third client asks whether it is stored, with a HEAD (no body to
    // pace) that only the cache may answer: 504 until it is.
    let probe = format!(
        "HEAD http://{0}/disk HTTP/1.1\r\nHost: {0}\r\nCache-Control: only-if-cached\r\nConnection: close\r\n\r\n",
        o.addr()
    );
    loop {
        assert!(
            !first.is_finished(),
            "not stored while its client was still being sent it"
        );
        let r = parse_head_response(&raw_request_from(PROBE.parse().expect("ip"), proxy, probe.as_bytes()).await);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 504, "{:?}", r.headers);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (theirs, _) = timed_get(OTHER, proxy, &o, "/disk").await;
    assert_body(&theirs, 96 << 10, "the other client's");
    assert_eq!(theirs.header("X-Cache"), Some("HIT"));
    let (r, took) = first.await.expect("download");
    assert_body(&r, 96 << 10, "the first client's");
    assert_eq!(r.header("X-Cache"), Some("MISS"));
    assert!(
        took.as_secs_f64() >= 1.1,
        "the first client was sent 96 KiB in {took:?}"
    );
    assert_eq!(o.count(), 1);
    // The other client's was a hit from the store, not a wait on the fetch.
    assert_eq!(metric(&p, "portico_cache_collapsed_total").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_lifts_the_limit_lets_the_next_requests_go_unpaced() {
    let o = origin().await;
    let (forward, reverse) = (free_addr(), free_addr());
    let p = Portico::start(&config(&forward, &reverse, &o, LIMITS)).await;
    let proxy: SocketAddr = forward.parse().expect("addr");
    let (r, took) = timed_get(CLIENT, proxy, &o, "/disk").await;
    assert_body(&r, 96 << 10, "paced");
    assert!(took.as_secs_f64() >= 1.1, "{took:?}");
    let series = "portico_connection_queue_client_bandwidth_waits_total";
    let waits = metric(&p, series).await;
    assert!(waits > 0);
    p.rewrite_config(&config(&forward, &reverse, &o, ""));
    p.signal(libc::SIGHUP);
    // Once the reload is in, downloads no longer wait: the counter stays.
    let mut quick = false;
    for _ in 0..50 {
        let before = metric(&p, series).await;
        let (r, _) = timed_get(CLIENT, proxy, &o, "/disk").await;
        assert_body(&r, 96 << 10, "after the reload");
        if metric(&p, series).await == before {
            quick = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(quick, "downloads still wait after the limit was lifted");
}

/// `limits.total_bandwidth`: all clients together keep to it. Two clients
/// downloading 96 KiB each at once under a 64 KiB/s total (16 KiB burst)
/// take at least 2.75 s for the 192 KiB, and the waits count as over the
/// total. Without a per-client rate, one client alone gets it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_clients_together_keep_to_the_total_bandwidth() {
    let o = origin().await;
    let total = "[limits]\ntotal_bandwidth = \"64KiB\"\ntotal_bandwidth_burst = \"16KiB\"\n";
    let (p, proxy) = start(&o, total).await;
    // One client alone: the whole rate (a miss, then a hit from disk).
    for how in ["MISS", "HIT"] {
        refill().await;
        let (r, took) = timed_get(CLIENT, proxy, &o, "/disk").await;
        assert_body(&r, 96 << 10, how);
        assert_eq!(r.header("X-Cache"), Some(how));
        assert!(took.as_secs_f64() >= 1.1, "{how}: 96 KiB in {took:?}");
    }
    // Two clients at once share it.
    refill().await;
    let start = Instant::now();
    let downloads: Vec<_> = [CLIENT, OTHER]
        .into_iter()
        .map(|src| spawn_get(src, proxy, &o, "/disk", start))
        .collect();
    let mut times = Vec::new();
    for d in downloads {
        let (r, took) = d.await.expect("download");
        assert_body(&r, 96 << 10, "a shared download");
        times.push(took);
    }
    // Only the two together are bounded: the second may start late.
    let last = times.iter().max().copied().unwrap_or_default();
    assert!(last.as_secs_f64() >= 2.5, "192 KiB to two clients in {last:?}");
    let waits = metric(&p, "portico_connection_queue_total_bandwidth_waits_total").await;
    assert!(waits > 0, "waits over the total counted: {waits}");
    assert_eq!(
        metric(&p, "portico_connection_queue_client_bandwidth_waits_total").await,
        0
    );
    let perf = page(&p, "/.perf").await;
    assert!(
        perf.lines()
            .any(|l| l.starts_with("Waits Over Total Bandwidth") && !l.contains(" 0 (")),
        "{perf}"
    );
}

/// Reads from `c` until `n` bytes past the end of the head have come (or
/// the connection ends): all the bytes read.
async fn read_past_head(c: &mut tokio::net::TcpStream, mut all: Vec<u8>, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if let Some(end) = all.windows(4).position(|w| w == b"\r\n\r\n")
            && all.len() - (end + 4) >= n
        {
            return all;
        }
        let got = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
            .await
            .expect("bytes in time")
            .expect("read");
        if got == 0 {
            return all;
        }
        all.extend_from_slice(&buf[..got]);
    }
}

/// What [`stepped_server`] sends at once, and what it sends when told.
const FIRST: usize = 32 << 10;
const REST: usize = 128 << 10;

/// A server that sends 32 KiB, then the rest (128 KiB) once `go` is told:
/// as an HTTP response (after a request head; not storable), as a
/// WebSocket's server (after a request head asking to upgrade: a 101,
/// then the bytes) and as a tunnel's server (after the client's first
/// byte).
async fn stepped_server(go: std::sync::Arc<tokio::sync::Notify>) -> RawOrigin {
    RawOrigin::start(move |mut s| {
        let go = go.clone();
        async move {
            let mut first = [0u8; 1];
            let _ = s.peek(&mut first).await;
            let mut head = Vec::new();
            if first[0] != b'G' {
                // Read, not left unread: a close with unread bytes is a reset.
                let _ = s.read_exact(&mut first).await;
            } else if String::from_utf8_lossy(&read_request_head(&mut s).await)
                .to_ascii_lowercase()
                .contains("upgrade: websocket")
            {
                head =
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec();
            } else {
                head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\r\n",
                    FIRST + REST
                )
                .into_bytes();
            }
            let body: Vec<u8> = (0..FIRST + REST).map(|i| (i % 251) as u8).collect();
            head.extend_from_slice(&body[..FIRST]);
            if s.write_all(&head).await.is_ok() {
                go.notified().await;
                let _ = s.write_all(&body[FIRST..]).await;
            }
            let _ = s.shutdown().await;
        }
    })
    .await
}

/// A reload that sets a limit applies at once to what is being sent: a
/// response, a `CONNECT` tunnel, an upgraded (WebSocket) connection, a
/// SOCKS session and an HTTP/2 stream that began unpaced get their last
/// 128 KiB at 64 KiB/s (16 KiB burst: at least 1.75 s), not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_sets_a_limit_paces_what_is_under_way() {
    let go = std::sync::Arc::new(tokio::sync::Notify::new());
    let server = stepped_server(go.clone()).await;
    let (forward, reverse, socks) = (free_addr(), free_addr(), free_addr());
    let o = origin().await;
    // The reverse listener (h2c) sends to the server; a SOCKS listener too.
    let plain = config(
        &forward,
        &reverse,
        &o,
        &format!("[[listener]]\naddress = \"{socks}\"\nmode = \"socks\"\n\n"),
    )
    .replace(
        &format!("connect_ports = [443, {}]", o.addr().port()),
        &format!("connect_ports = [443, {}]", server.addr().port()),
    )
    .replace(
        &format!("servers = [\"{}\"]", o.addr()),
        &format!("servers = [\"{}\"]", server.addr()),
    );
    let limited = format!("{plain}{LIMITS}");
    let target = server.addr();
    for what in ["response", "tunnel", "websocket", "socks"] {
        let p = Portico::start(&plain).await;
        let to = if what == "socks" {
            socks.parse().expect("addr")
        } else {
            p.addr()
        };
        let mut c = tokio::net::TcpStream::connect(to).await.expect("connect");
        let mut all = Vec::new();
        match what {
            "response" => {
                let req = format!("GET http://{target}/x HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
                c.write_all(req.as_bytes()).await.expect("request");
            }
            "websocket" => {
                let req = format!(
                    "GET http://{target}/ws HTTP/1.1\r\nHost: {target}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                     Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
                );
                c.write_all(req.as_bytes()).await.expect("request");
            }
            "tunnel" => {
                let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
                c.write_all(req.as_bytes()).await.expect("request");
                // The tunnel's server speaks once it has heard from the client.
                all = read_past_head(&mut c, all, 0).await;
                c.write_all(b"T").await.expect("into the tunnel");
            }
            _ => {
                // SOCKS 5: no authentication, CONNECT to the server's IPv4
                // address; the reply (10 bytes) stands in for a head.
                let std::net::IpAddr::V4(ip) = target.ip() else {
                    panic!("IPv4")
                };
                let mut req = vec![5, 1, 0, 5, 1, 0, 1];
                req.extend_from_slice(&ip.octets());
                req.extend_from_slice(&target.port().to_be_bytes());
                c.write_all(&req).await.expect("SOCKS request");
                let mut reply = [0u8; 12];
                c.read_exact(&mut reply).await.expect("SOCKS replies");
                assert_eq!((reply[0], reply[1], reply[2], reply[3]), (5, 0, 5, 0), "{reply:?}");
                c.write_all(b"T").await.expect("into the session");
                all = b"SOCKS\r\n\r\n".to_vec();
            }
        }
        let all = read_past_head(&mut c, all, FIRST).await;
        // The reload, in force before the rest is sent.
        p.reload(&limited).await;
        let start = Instant::now();
        go.notify_one();
        let all = read_past_head(&mut c, all, FIRST + REST).await;
        let took = start.elapsed();
        let end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        assert_eq!(all.len() - end, FIRST + REST, "{what}");
        assert!(pattern_matches(0, &all[end..]), "{what}");
        assert!(took.as_secs_f64() >= 1.5, "{what}: the last 128 KiB in {took:?}");
    }

    // An HTTP/2 stream (h2c, the reverse listener).
    let p = Portico::start(&plain).await;
    let tcp = tokio::net::TcpStream::connect(&reverse).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut send = send.ready().await.expect("ready");
    let req = http::Request::get(format!("http://{reverse}/x"))
        .body(())
        .expect("request");
    let (resp, _) = send.send_request(req, true).expect("send request");
    let (parts, mut body) = resp.await.expect("response").into_parts();
    assert_eq!(parts.status, 200);
    let mut got = Vec::new();
    let mut start = None;
    while let Some(chunk) = body.data().await {
        let chunk: Bytes = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
        if got.len() >= FIRST && start.is_none() {
            p.reload(&limited).await;
            start = Some(Instant::now());
            go.notify_one();
        }
    }
    let took = start.expect("the first part").elapsed();
    assert_eq!(got.len(), FIRST + REST);
    assert!(pattern_matches(0, &got));
    assert!(took.as_secs_f64() >= 1.5, "HTTP/2: the last 128 KiB in {took:?}");
}

/// A client's debt run up at a high rate is not paid at the lower rate a
/// reload sets: the clients' buckets start afresh. Eight downloads at once
/// at 4 MiB/s owe up to eight pieces of 64 KiB, which at 8 KiB/s would
/// stall the client's next response for a minute; it waits a second or
/// two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_lowers_the_rate_does_not_make_a_client_pay_its_old_debt_at_it() {
    let o = origin().await;
    let (forward, reverse) = (free_addr(), free_addr());
    let fast = config(&forward, &reverse, &o, "[limits]\nclient_bandwidth = \"4MiB\"\n");
    let slow = config(&forward, &reverse, &o, "[limits]\nclient_bandwidth = \"8KiB\"\n");
    let p = Portico::start(&fast).await;
    let proxy: SocketAddr = forward.parse().expect("addr");
    let a = o.addr();
    let mut readers = Vec::new();
    for n in 0..8 {
        let mut c = tokio::net::TcpStream::connect(proxy).await.expect("connect");
        c.write_all(format!("GET http://{a}/big?{n} HTTP/1.1\r\nHost: {a}\r\n\r\n").as_bytes())
            .await
            .expect("send");
        // Read and drop, as fast as it comes.
        readers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 256 << 10];
            while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
        }));
    }
    // The bucket's first second (its burst) spent, the writes owe.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let waits = metric(&p, "portico_connection_queue_client_bandwidth_waits_total").await;
    assert!(waits > 8, "the eight downloads were not being paced: {waits} waits");
    p.reload(&slow).await;
    // 1 KiB behind the other writes' pieces of 1 KiB: a second or two.
    // With the debt kept: a minute; with the
    // writes under way still in pieces of the old rate's 64 KiB: 9 s.
    let start = Instant::now();
    let mut c = tokio::net::TcpStream::connect(proxy).await.expect("connect");
    let req = format!("GET http://{a}/tiny HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n");
    c.write_all(req.as_bytes()).await.expect("send");
    let all = read_past_head(&mut c, Vec::new(), 1 << 10).await;
    let took = start.elapsed();
    assert_body(&parse_response(&all), 1 << 10, "/tiny after the cut");
    assert!(took < Duration::from_millis(4500), "/tiny took {took:?}");
    readers.iter().for_each(|r| r.abort());
}

/// The same for a disk hit going out with `sendfile`: a 32 MiB hit to a
/// client that stops reading after its first 64 KiB, then a reload that
/// sets 8 MiB/s: the rest, less what the sockets hold (a few MiB), takes
/// seconds, not the one unpaced `sendfile` call it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_sets_a_limit_paces_a_disk_hit_under_way() {
    const SIZE: usize = 32 << 20;
    let o = origin().await;
    let (forward, reverse) = (free_addr(), free_addr());
    let plain = config(&forward, &reverse, &o, "");
    let p = Portico::start(&plain).await;
    let proxy: SocketAddr = forward.parse().expect("addr");
    // A miss, then a hit that checks the file and keeps it open: the next
    // hit goes out with `sendfile`.
    for how in ["MISS", "HIT"] {
        let (r, _) = timed_get(OTHER, proxy, &o, "/big").await;
        assert_body(&r, SIZE, how);
        assert_eq!(r.header("X-Cache"), Some(how));
    }
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(format!("{CLIENT}:0").parse().expect("addr")).expect("bind");
    let mut c = socket.connect(proxy).await.expect("connect");
    let target = o.addr();
    c.write_all(format!("GET http://{target}/big HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let all = read_past_head(&mut c, Vec::new(), 64 << 10).await;
    p.reload(&format!(
        "{plain}[limits]\nclient_bandwidth = \"8MiB\"\nclient_bandwidth_burst = \"64KiB\"\n"
    ))
    .await;
    let start = Instant::now();
    let all = read_past_head(&mut c, all, SIZE).await;
    let took = start.elapsed();
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&all[..end]);
    assert!(head.contains("x-cache: HIT"), "{head}");
    assert_eq!(all.len() - end, SIZE);
    assert!(pattern_matches(0, &all[end..]));
    assert!(
        took.as_secs_f64() >= 1.5,
        "the rest of a 32 MiB hit in {took:?} at 8 MiB/s"
    );
}

/// Settings that cannot work are refused, naming the key and why.
#[test]
fn a_burst_without_a_bandwidth_and_a_bandwidth_below_1_kib_are_refused_by_name() {
    for (config, key, why) in [
        (
            "client_bandwidth_burst = \"1MiB\"",
            "client_bandwidth_burst",
            "needs limits.client_bandwidth",
        ),
        (
            "client_bandwidth = \"512B\"",
            "limits.client_bandwidth",
            "at least 1KiB",
        ),
        (
            "total_bandwidth_burst = \"1MiB\"",
            "total_bandwidth_burst",
            "needs limits.total_bandwidth",
        ),
        ("total_bandwidth = \"1000B\"", "limits.total_bandwidth", "at least 1KiB"),
    ] {
        let out = Portico::check(&format!("[limits]\n{config}\n"));
        assert!(!out.status.success(), "{config}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key) && err.contains(why), "{config}: {err}");
    }
}

/// `[[rule]] bandwidth`: every response to the route at 64 KiB a second,
/// each on its own (nginx's `limit_rate`), over HTTP/1 (a miss, a disk
/// hit through `sendfile`), HTTP/2 and a `CONNECT` tunnel; `/after` gets
/// its first 64 KiB at full speed (`bandwidth_after`); other routes go
/// unpaced.
const ROUTES: &str = "[[rule]]\npath = \"/disk\"\nbandwidth = \"64KiB\"\ncontinue = true\n\n\
                      [[rule]]\npath = \"/after\"\nbandwidth = \"32KiB\"\nbandwidth_after = \"64KiB\"\ncontinue = true\n\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_bandwidth_paces_each_response_to_it_on_its_own() {
    let o = origin().await;
    let server = RawOrigin::start(|mut s| async move {
        let _ = s.write_all(&vec![7u8; 96 << 10]).await;
        let _ = s.shutdown().await;
    })
    .await;
    let (forward, reverse) = (free_addr(), free_addr());
    let tunnel_rule = format!(
        "[[rule]]\nhost = \"127.0.0.1\"\nport = {}\nbandwidth = \"64KiB\"\ncontinue = true\n\n",
        server.addr().port()
    );
    let cfg = config(&forward, &reverse, &o, "")
        .replace(
            "[[rule]]\nmode = \"reverse\"",
            &format!("{ROUTES}{tunnel_rule}[[rule]]\nmode = \"reverse\""),
        )
        .replace(
            &format!("connect_ports = [443, {}]", o.addr().port()),
            &format!("connect_ports = [443, {}]", server.addr().port()),
        );
    let p = Portico::start(&cfg).await;
    let proxy: SocketAddr = forward.parse().expect("addr");

    // 96 KiB at 64 KiB/s, a piece (8 KiB) in hand: at least 1.3 s, from
    // the origin and from the disk cache alike.
    for how in ["MISS", "HIT"] {
        let (r, took) = timed_get(CLIENT, proxy, &o, "/disk").await;
        assert_body(&r, 96 << 10, how);
        assert_eq!(r.header("X-Cache"), Some(how));
        assert!(took.as_secs_f64() >= 1.1, "/disk {how}: 96 KiB in {took:?}");
    }
    // Another route is not paced (48 KiB at the rate: 0.6 s).
    let (r, took) = timed_get(CLIENT, proxy, &o, "/mem").await;
    assert_body(&r, 48 << 10, "/mem");
    assert!(took.as_secs_f64() < 0.5, "/mem, on no limited route, took {took:?}");
    // Nor is the next request on a connection whose last was: the limit
    // is the response's, not the connection's.
    let mut c = tokio::net::TcpStream::connect(proxy).await.expect("connect");
    let a = o.addr();
    for (path, len, least, most) in [("/disk", 96 << 10, 1.1, 60.0), ("/mem", 48 << 10, 0.0, 0.5)] {
        let start = Instant::now();
        c.write_all(format!("GET http://{a}{path} HTTP/1.1\r\nHost: {a}\r\n\r\n").as_bytes())
            .await
            .expect("send");
        let all = read_past_head(&mut c, Vec::new(), len).await;
        let took = start.elapsed().as_secs_f64();
        let end = all.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
        assert_eq!(all.len() - end, len, "{path} on a kept-alive connection");
        assert!(
            (least..most).contains(&took),
            "{path} on a kept-alive connection: {took} s"
        );
    }

    // Each response has its own rate, not the client's share: three at
    // once from one client take about as long as one (as one share: 4 s).
    let start = Instant::now();
    let three: Vec<_> = (0..3).map(|_| spawn_get(CLIENT, proxy, &o, "/disk", start)).collect();
    let mut slowest = Duration::ZERO;
    for d in three {
        let (r, took) = d.await.expect("download");
        assert_body(&r, 96 << 10, "one of three at once");
        assert!(took.as_secs_f64() >= 1.1, "one of three: {took:?}");
        slowest = slowest.max(took);
    }
    assert!(
        slowest.as_secs_f64() < 3.5,
        "three responses of the route shared a rate: {slowest:?}"
    );

    // bandwidth_after: 64 KiB at once, then 32 KiB at 32 KiB/s (less a
    // piece in hand): about 0.9 s; at the rate from the first byte it
    // would take 2.9 s.
    let (r, took) = timed_get(CLIENT, proxy, &o, "/after").await;
    assert_body(&r, 96 << 10, "/after");
    let t = took.as_secs_f64();
    assert!((0.75..2.2).contains(&t), "/after: 96 KiB in {took:?}");

    // HTTP/2 (h2c, the reverse listener): a disk hit on one stream.
    let tcp = tokio::net::TcpStream::connect(&reverse).await.expect("connect");
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let start = Instant::now();
    let mut send = send.ready().await.expect("ready");
    let req = http::Request::get(format!("http://{reverse}/disk"))
        .body(())
        .expect("request");
    let (resp, _) = send.send_request(req, true).expect("send request");
    let (parts, mut body) = resp.await.expect("response").into_parts();
    let mut got = 0;
    while let Some(chunk) = body.data().await {
        let chunk: Bytes = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
        got += chunk.len();
    }
    let took = start.elapsed();
    assert_eq!((parts.status.as_u16(), got), (200, 96 << 10));
    assert!(took.as_secs_f64() >= 1.1, "HTTP/2: 96 KiB in {took:?}");

    // A CONNECT tunnel matched by host and port.
    let (got, took) = timed_tunnel(p.addr(), server.addr()).await;
    assert_eq!(got.len(), 96 << 10);
    assert!(took.as_secs_f64() >= 1.1, "tunnel: 96 KiB in {took:?}");

    // Counted as the route's waits, not the client's or the total's.
    let waits = metric(&p, "portico_connection_queue_route_bandwidth_waits_total").await;
    assert!(waits > 0, "route waits counted: {waits}");
    let client = metric(&p, "portico_connection_queue_client_bandwidth_waits_total").await;
    assert_eq!(client, 0);
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains("Waits Over Route Bandwidth"), "{perf}");
}

/// The route's rate and the client's together: the lower one holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_faster_than_the_clients_bandwidth_does_not_lift_it() {
    let o = origin().await;
    let (forward, reverse) = (free_addr(), free_addr());
    let cfg = config(&forward, &reverse, &o, LIMITS).replace(
        "[[rule]]\nmode = \"reverse\"",
        "[[rule]]\npath = \"/disk\"\nbandwidth = \"1MiB\"\ncontinue = true\n\n[[rule]]\nmode = \"reverse\"",
    );
    let _p = Portico::start(&cfg).await;
    let (r, took) = timed_get(CLIENT, forward.parse().expect("addr"), &o, "/disk").await;
    assert_body(&r, 96 << 10, "/disk");
    assert!(
        took.as_secs_f64() >= 1.1,
        "96 KiB in {took:?}: over the client's 64 KiB/s"
    );
}

#[test]
fn a_routes_bandwidth_below_1_kib_or_an_after_alone_is_refused_by_name() {
    for (rule, why) in [
        ("bandwidth = \"512B\"", "rule[0].bandwidth"),
        ("bandwidth_after = \"1MiB\"", "rule[0].bandwidth_after"),
        (
            "bandwidth = \"0B\"\nbandwidth_after = \"1MiB\"",
            "rule[0].bandwidth_after",
        ),
    ] {
        let out = Portico::check(&format!("[[rule]]\npath = \"/\"\n{rule}\n"));
        assert!(!out.status.success(), "{rule}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{rule}: {err}");
    }
}

/// Asks, from a third client, whether `path` at `o` is stored: a HEAD
/// with `only-if-cached`, which only the cache answers (504 when not).
async fn stored(proxy: SocketAddr, o: &Origin, path: &str) -> bool {
    let probe = format!(
        "HEAD http://{0}{path} HTTP/1.1\r\nHost: {0}\r\nCache-Control: only-if-cached\r\nConnection: close\r\n\r\n",
        o.addr()
    );
    let r = parse_head_response(&raw_request_from(PROBE.parse().expect("ip"), proxy, probe.as_bytes()).await);
    assert!(r.status == 200 || r.status == 504, "{}: {:?}", r.status, r.headers);
    r.status == 200
}

/// Whether `path`, a 512 KiB object a client held to 64 KiB/s asks for
/// (8 s), is stored half a second in, on Portico with `cache` in its
/// `[cache]` table. `hold` runs first: the downloads that spend the
/// budget. The object is far larger than the read-ahead gap allowed it,
/// plus a piece, and far smaller than the default gap.
async fn stored_half_a_second_in(o: &Origin, cache: &str, path: &str, big: usize) -> bool {
    let (forward, reverse) = (free_addr(), free_addr());
    let cfg = config(&forward, &reverse, o, LIMITS).replace(
        "max_memory_object = \"64KiB\"\n",
        &format!("max_memory_object = \"64KiB\"\n{cache}\n"),
    );
    let _p = Portico::start(&cfg).await;
    let proxy: SocketAddr = forward.parse().expect("addr");
    // Downloads of 32 MiB at 64 KiB/s, on URLs of their own (one would be
    // collapsed onto the other's fetch): each fill takes its gap (1 MiB)
    // of the budget, or what is left of it, within a moment.
    let mut held = Vec::new();
    for n in 0..big {
        let mut c = tokio::net::TcpStream::connect(proxy).await.expect("connect");
        let a = o.addr();
        c.write_all(format!("GET http://{a}/big?{n} HTTP/1.1\r\nHost: {a}\r\n\r\n").as_bytes())
            .await
            .expect("send");
        let _ = read_past_head(&mut c, Vec::new(), 1).await;
        held.push(c);
    }
    if big > 0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let download = spawn_get(OTHER, proxy, o, path, Instant::now());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stored = stored(proxy, o, path).await;
    assert!(
        !download.is_finished(),
        "{cache}: 512 KiB at 64 KiB/s ended within 0.5 s"
    );
    download.abort();
    stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_ahead_gap_of_0_or_under_the_object_keeps_the_fill_near_its_client() {
    let o = origin().await;
    for (gap, ahead) in [
        ("", true),
        ("read_ahead_gap = \"0B\"", false),
        ("read_ahead_gap = \"16KiB\"", false),
    ] {
        let stored = stored_half_a_second_in(&o, gap, "/large", 0).await;
        assert_eq!(stored, ahead, "{gap:?}: stored half a second in: {stored}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_read_ahead_memory_is_spent_another_fill_keeps_near_its_client() {
    let o = origin().await;
    for (memory, ahead) in [("", true), ("read_ahead_memory = \"1MiB\"", false)] {
        let stored = stored_half_a_second_in(&o, memory, "/large", 2).await;
        assert_eq!(stored, ahead, "{memory:?}: stored half a second in: {stored}");
    }
}

#[test]
fn a_read_ahead_gap_over_the_memory_is_refused_naming_the_key_written() {
    for (cache, key) in [
        (
            "read_ahead_gap = \"2MiB\"\nread_ahead_memory = \"1MiB\"",
            "cache.read_ahead_gap",
        ),
        ("read_ahead_memory = \"512KiB\"", "cache.read_ahead_memory"),
    ] {
        let out = Portico::check(&format!("[cache]\n{cache}\n"));
        assert!(!out.status.success(), "{cache}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!(":2: key `{key}`")), "{cache}: {err}");
    }
}
