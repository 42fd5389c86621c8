//! Self-test of the integration-test harness: the origins, clients and
//! helpers, and what `Portico`'s start-up does around the real binary
//! (a taken listener address replaced, the open-files limit set).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: origin\r\n{extra}Connection: close\r\n\r\n").into_bytes()
}

async fn echo_origin() -> Origin {
    Origin::start(|req| async move {
        Response::ok(format!("{} {} {}", req.method, req.uri, req.body.len()))
            .header("x-origin", "yes")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2")
    })
    .await
}

#[test]
fn free_port_and_addr_are_bindable() {
    let port = free_port();
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("free_port is bindable");
    let addr = free_addr();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    std::net::TcpListener::bind(&addr).expect("free_addr is bindable");
}

#[test]
fn free_port_never_gives_the_same_port_twice() {
    let ports: Vec<u16> = (0..300).map(|_| free_port()).collect();
    let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len());
}

#[test]
fn server_side_reads_the_accepted_sockets_state_and_unread_bytes() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = listener.local_addr().expect("local_addr");
    let mut client = std::net::TcpStream::connect(server).expect("connect");
    let me = client.local_addr().expect("client address");
    let (mut accepted, _) = listener.accept().expect("accept");
    let side = server_side(server, me).expect("the kernel knows the connection");
    assert_eq!((side.state, side.unread), (1, 0));
    assert_ne!(side.inode, 0);
    client.write_all(&[b'x'; 1000]).expect("send");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while server_side(server, me).expect("still there").unread < 1000 {
        assert!(std::time::Instant::now() < deadline, "1000 bytes never arrived");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut some = [0u8; 400];
    accepted.read_exact(&mut some).expect("read");
    assert_eq!(server_side(server, me).expect("still there").unread, 600);
    assert!(
        server_side(me, server).is_some(),
        "the client's own row is found the other way round"
    );
}

/// `until_logged` waits for a line logged after it was called, and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_logged_waits_for_lines_yet_to_come_and_counts_them() {
    let p = Portico::start(&format!("[[listener]]\naddress = \"{}\"\n", free_addr())).await;
    let text = "reloaded ";
    assert!(!p.stderr().contains(text));
    // The wait runs while the lines are yet to come (a future runs only
    // when polled: joined, not awaited after the signals).
    let signals = async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        p.signal(libc::SIGHUP);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        p.signal(libc::SIGHUP);
    };
    let (log, ()) = tokio::join!(p.until_logged(text, 2), signals);
    assert_eq!(log.matches(text).count(), 2, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_address_taken_before_portico_binds_it_is_replaced() {
    // Something else took the port free_addr() found free, as an outgoing
    // connection's ephemeral port does: bound, not listening.
    let taken = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    taken
        .bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into())
        .unwrap();
    let busy = taken.local_addr().unwrap().as_socket().unwrap();
    let p = Portico::start(&format!("[[listener]]\naddress = \"{busy}\"\nmode = \"forward\"\n")).await;
    assert_ne!(p.addr(), busy);
    let config = std::fs::read_to_string(p.dir().join("portico.toml")).unwrap();
    assert!(
        config.contains(&p.addr().to_string()) && !config.contains(&busy.to_string()),
        "{config}"
    );
    let r =
        parse_response(&raw_request(p.addr(), b"GET /.perf HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await);
    assert_eq!(r.status, 200, "{}", r.body_str());
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_with_open_files_sets_both_limits_of_the_child() {
    let addr = free_addr();
    let p = Portico::start_with_open_files(
        &format!("[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n"),
        300,
    )
    .await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", p.pid())).expect("read /proc/PID/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("{limits}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    // "Max open files  SOFT  HARD  files": portico cannot raise either.
    assert_eq!(&fields[3..5], ["300", "300"], "{line}");
}

#[test]
fn listener_addrs_parses_config() {
    let cfg = "[[listener]]\naddress = \"127.0.0.1:8001\"\n\n[[listener]]\naddress = \"0.0.0.0:8002\"\n\n[cache]\npath = \"{dir}/cache\"\n";
    let addrs: Vec<String> = listener_addrs(cfg).iter().map(|a| a.to_string()).collect();
    assert_eq!(addrs, ["127.0.0.1:8001", "127.0.0.1:8002"]);
    assert!(listener_addrs("[cache]\n").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_reads_plain_and_labelled_samples_and_panics_on_a_missing_one() {
    let origin = echo_origin().await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n",
        free_addr()
    ))
    .await;
    assert_eq!(metric(&p, "portico_upstream_requests_total").await, 0);
    let req = format!(
        "GET {}/m HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        origin.url(),
        origin.addr()
    );
    assert_eq!(parse_response(&raw_request(p.addr(), req.as_bytes()).await).status, 200);
    assert_eq!(metric(&p, "portico_upstream_requests_total").await, 1);
    assert_eq!(metric(&p, "portico_requests_total{method=\"GET\"}").await, 1);
    let p = std::sync::Arc::new(p);
    let missing = tokio::spawn({
        let p = p.clone();
        async move { metric(&p, "portico_no_such_metric").await }
    });
    assert!(missing.await.is_err(), "a missing sample panics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_answers_curl_and_raw() {
    let origin = echo_origin().await;

    let out = curl(&["-i", &format!("{}/hello?x=1", origin.url())]).await;
    assert!(out.status.success(), "curl failed: {out:?}");
    let text = stdout(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("x-origin: yes"), "{text}");
    assert!(text.ends_with("GET /hello?x=1 0"), "{text}");

    let out = curl(&["-d", "payload", &format!("{}/post", origin.url())]).await;
    assert_eq!(stdout(&out), "POST /post 7");

    let resp = parse_response(&raw_request(origin.addr(), &get("/raw", "X-Test: 1\r\n")).await);
    assert_eq!((resp.version.as_str(), resp.status), ("HTTP/1.1", 200));
    assert_eq!(resp.reason, "OK");
    assert_eq!(resp.framing, Framing::ContentLength(10));
    assert_eq!(resp.body_str(), "GET /raw 0");
    assert_eq!(resp.headers_all("Set-Cookie"), ["a=1", "b=2"]);

    assert_eq!(origin.count(), 3);
    let reqs = origin.requests();
    assert_eq!(reqs[1].method, "POST");
    assert_eq!(&reqs[1].body[..], b"payload");
    assert_eq!(reqs[2].uri, "/raw");
    assert_eq!(reqs[2].header("x-test"), Some("1"));
    assert_eq!(reqs[2].version, http::Version::HTTP_11);
}

/// `Origin::start_at` listens on the loopback address asked for, and
/// `raw_request_from` connects from the one asked for: the origin sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origins_and_clients_can_use_other_loopback_addresses() {
    let origin = Origin::start_at("127.0.0.3", |req| async move { Response::ok(req.uri.to_string()) }).await;
    assert_eq!(origin.addr().ip().to_string(), "127.0.0.3");
    let from: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    let resp = parse_response(&raw_request_from(from, origin.addr(), &get("/at", "")).await);
    assert_eq!(resp.body_str(), "/at");
    // The source address, as a listener sees it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local_addr");
    let peer = tokio::spawn(async move {
        let (mut s, peer) = listener.accept().await.expect("accept");
        let _ = tokio::io::AsyncWriteExt::write_all(&mut s, b"HTTP/1.1 204 No Content\r\n\r\n").await;
        peer.ip()
    });
    raw_request_from(from, addr, &get("/", "")).await;
    assert_eq!(peer.await.expect("accept task"), from);
    // `Origin::start_on`: another origin on the first one's port.
    let at = std::net::SocketAddr::new("127.0.0.4".parse().expect("ip"), origin.addr().port());
    let other = Origin::start_on(at, |_req| async move { Response::ok("other") }).await;
    assert_eq!(other.addr(), at);
    let resp = parse_response(&raw_request(at, &get("/", "")).await);
    assert_eq!(resp.body_str(), "other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_with_raw_client() {
    let origin = echo_origin().await;
    let mut client = RawClient::connect(origin.addr()).await;
    assert!(client.local_addr().ip().is_loopback() && client.local_addr().port() != 0);
    client.send(b"GET /1 HTTP/1.1\r\nHost: o\r\n\r\n").await;
    assert_eq!(client.read_response().await.body_str(), "GET /1 0");
    client.send(b"HEAD /2 HTTP/1.1\r\nHost: o\r\n\r\n").await;
    let head = client.read_head_response().await;
    assert_eq!((head.status, head.framing), (200, Framing::NoBody));
    client
        .send(b"GET /3 HTTP/1.1\r\nHost: o\r\n\r\nGET /4 HTTP/1.1\r\nHost: o\r\n\r\n")
        .await;
    assert_eq!(client.read_response().await.body_str(), "GET /3 0");
    assert_eq!(client.read_response().await.body_str(), "GET /4 0");
    assert_eq!((origin.count(), origin.connections()), (4, 1));
    assert!(origin.wait_count(4, Duration::from_secs(1)).await);
    assert!(!origin.wait_count(5, Duration::from_millis(50)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_response_with_trailers_is_framed_right() {
    let origin = Origin::start(|_| async {
        Response::ok("")
            .header("content-type", "text/plain")
            .chunked(["ab", "cde"], &[("x-checksum", "123")])
    })
    .await;

    let raw = raw_request(origin.addr(), &get("/", "TE: trailers\r\n")).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
    assert!(
        text.ends_with("\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\nx-checksum: 123\r\n\r\n"),
        "{text}"
    );
    let resp = parse_response(&raw);
    assert_eq!(resp.framing, Framing::Chunked);
    assert_eq!(resp.body_str(), "abcde");
    assert_eq!(resp.header("trailer"), Some("x-checksum"));
    assert_eq!(resp.trailer("X-Checksum"), Some("123"));

    // Without `TE: trailers` hyper drops the trailers but keeps the framing.
    let resp = parse_response(&raw_request(origin.addr(), &get("/", "")).await);
    assert_eq!((resp.framing, resp.body_str().as_str()), (Framing::Chunked, "abcde"));
    assert!(resp.trailers.is_empty());

    let out = curl(&[&origin.url()]).await;
    assert_eq!(stdout(&out), "abcde");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_are_applied() {
    let origin = Origin::start(|_| async {
        Response::new(200)
            .chunked(["a", "b", "c"], &[])
            .delay(Duration::from_millis(300))
            .chunk_delay(Duration::from_millis(100))
    })
    .await;
    let mut client = RawClient::connect(origin.addr()).await;
    let started = Instant::now();
    client.send(&get("/", "")).await;
    let resp = client.read_response().await;
    assert_eq!(resp.body_str(), "abc");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    // The request is recorded before the delay starts.
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_origin_works_with_curl_cacert() {
    let origin = Origin::start_tls(|req| async move { Response::ok(format!("tls {}", req.uri)) }).await;
    let ca = origin.ca_pem_path().to_str().expect("utf-8 path").to_owned();
    let port = origin.addr().port();
    assert_eq!(origin.url(), format!("https://127.0.0.1:{port}"));

    for host in ["localhost", "127.0.0.1"] {
        let out = curl(&["--cacert", &ca, &format!("https://{host}:{port}/x")]).await;
        assert!(out.status.success(), "curl {host}: {out:?}");
        assert_eq!(stdout(&out), "tls /x");
    }
    // Untrusted without the CA (curl exit 60: peer certificate problem).
    let out = curl(&[&format!("https://localhost:{port}/")]).await;
    assert_eq!(out.status.code(), Some(60), "{out:?}");
    assert_eq!(origin.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_origin_ca_is_trusted_by_rustls() {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let origin = Origin::start_tls(|_| async { Response::ok("hi") }).await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(origin.ca_pem_path()).expect("read CA PEM"))
        .expect("add CA to root store");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(origin.addr()).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("server name");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake with origin");
    tls.write_all(&get("/", "")).await.expect("write");
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await.expect("read");
    assert_eq!(parse_response(&raw).body_str(), "hi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_100mib_stream_arrives_whole() {
    const LEN: u64 = 100 * 1024 * 1024;
    let origin = Origin::start(|req| async move {
        match req.uri.path() {
            "/chunked" => Response::new(200).generated_chunked(LEN),
            _ => Response::new(200).generated(LEN),
        }
    })
    .await;

    let out = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download}",
        &format!("{}/cl", origin.url()),
    ])
    .await;
    assert_eq!(stdout(&out), format!("200 {LEN}"), "{out:?}");

    let mut client = RawClient::connect(origin.addr()).await;
    client.timeout = Duration::from_secs(30);
    client.send(&get("/chunked", "")).await;
    let resp = client.read_response().await;
    assert_eq!(resp.framing, Framing::Chunked);
    assert_eq!(resp.body.len() as u64, LEN);
    assert!(pattern_matches(0, &resp.body), "generated body content is wrong");
    assert!(pattern_matches(1000, &resp.body[1000..2000]));
    assert!(!pattern_matches(1, &resp.body[..100]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_accepts_but_never_answers_and_dead_addr_refuses() {
    let hole = Blackhole::start().await;
    let started = Instant::now();
    let got = raw_request_timeout(hole.addr(), &get("/", ""), Duration::from_millis(500)).await;
    assert!(got.is_empty(), "blackhole answered: {got:?}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(hole.accepted(), 1);

    let out = curl(&["--max-time", "1", &format!("http://{}/", hole.addr())]).await;
    assert_eq!(out.status.code(), Some(28), "expected curl timeout: {out:?}");
    assert_eq!(hole.accepted(), 2);

    let dead = dead_addr();
    assert!(tokio::net::TcpStream::connect(&dead).await.is_err());
    let out = curl(&[&format!("http://{dead}/")]).await;
    assert_eq!(out.status.code(), Some(7), "expected connection refused: {out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_origin_sends_hand_framed_bytes() {
    let origin = RawOrigin::start(|mut stream| async move {
        let head = read_request_head(&mut stream).await;
        assert!(head.starts_with(b"GET /r HTTP/1.1\r\n"));
        let mut resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        resp.extend(chunked_body(&[b"hand", b"", b"made"], &[("x-t", "1")]));
        stream.write_all(&resp).await.expect("raw origin write");
    })
    .await;
    let resp = parse_response(&raw_request(origin.addr(), &get("/r", "")).await);
    assert_eq!(resp.body_str(), "handmade");
    assert_eq!(resp.trailer("x-t"), Some("1"));
    assert_eq!(origin.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_response_head_returns_the_head_and_only_the_bytes_that_came_with_it() {
    // The head arrives in two writes, the first body bytes with its end;
    // the rest of the body only after the client answers.
    let origin = RawOrigin::start(|mut stream| async move {
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Le").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = stream.write_all(b"ngth: 10\r\nX-A: b\r\n\r\n01234").await;
        let mut go = [0u8; 1];
        let _ = stream.read_exact(&mut go).await;
        let _ = stream.write_all(b"56789").await;
    })
    .await;
    let mut s = tokio::net::TcpStream::connect(origin.addr()).await.expect("connect");
    let (head, rest) = read_response_head(&mut s).await;
    assert_eq!((head.version.as_str(), head.status), ("HTTP/1.1", 200));
    assert_eq!(head.header("x-a"), Some("b"));
    assert_eq!(rest, b"01234");
    s.write_all(b"!").await.expect("go");
    let mut more = [0u8; 5];
    s.read_exact(&mut more).await.expect("the rest, left in the socket");
    assert_eq!(&more, b"56789");
}

#[test]
fn parser_handles_the_three_framings() {
    let cl = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A:  b \r\n\r\nhelloEXTRA");
    assert_eq!(
        (cl.framing, cl.body_str().as_str()),
        (Framing::ContentLength(5), "hello")
    );
    assert_eq!(cl.header("x-a"), Some("b"));

    let chunked = parse_response(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 99\r\n\r\n\
          4;ext=1\r\nWiki\r\nA\r\n pedia in \r\n0\r\nExpires: never\r\nX-Sum: 9\r\n\r\n",
    );
    assert_eq!(chunked.framing, Framing::Chunked);
    assert_eq!(chunked.body_str(), "Wiki pedia in ");
    assert_eq!(chunked.trailers.len(), 2);
    assert_eq!(chunked.trailer("x-sum"), Some("9"));

    let close = parse_response(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nuntil\r\nclose");
    assert_eq!(
        (close.framing, close.body_str().as_str()),
        (Framing::Close, "until\r\nclose")
    );
    assert_eq!(close.version, "HTTP/1.0");

    let no_body = parse_response(b"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n");
    assert_eq!((no_body.framing, no_body.body.len()), (Framing::NoBody, 0));
    let head = parse_head_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n");
    assert_eq!(head.framing, Framing::NoBody);

    let all = parse_responses(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
    let statuses: Vec<u16> = all.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [100, 200, 404]);
}

#[test]
#[should_panic(expected = "truncated body: Content-Length 10, got 3")]
fn parser_rejects_truncated_content_length() {
    parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
}

#[test]
#[should_panic(expected = "truncated chunk data")]
fn parser_rejects_truncated_chunked() {
    parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab");
}

#[test]
#[should_panic(expected = "conflicting Content-Length")]
fn parser_rejects_conflicting_lengths() {
    parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab");
}

// ---------------------------------------------------------------- the test DNS server

/// A hickory resolver asking only `server`, with short timeouts.
fn resolver_for(server: std::net::SocketAddr) -> hickory_resolver::TokioResolver {
    use hickory_resolver::config::{NameServerConfig, ResolverConfig};
    let mut ns = NameServerConfig::udp(server.ip());
    for c in &mut ns.connections {
        c.port = server.port();
    }
    let mut builder = hickory_resolver::TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
    );
    builder.options_mut().timeout = Duration::from_millis(500);
    builder.options_mut().attempts = 1;
    builder.options_mut().cache_size = 0;
    builder.build().expect("build resolver")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_server_answers_known_names_and_nxdomain_and_can_be_slow_or_silent() {
    use std::net::IpAddr;
    let dns = DnsServer::start();
    assert!(dns.addr().ip().is_loopback());
    let v4: IpAddr = "127.0.0.7".parse().unwrap();
    let v6: IpAddr = "::1".parse().unwrap();
    dns.add("Known.Test", v4, 30);
    dns.add("known.test.", v6, 30);
    let r = resolver_for(dns.addr());

    let found = r.lookup_ip("known.test.").await.expect("known.test resolves");
    let mut ips: Vec<IpAddr> = found.iter().collect();
    ips.sort();
    assert_eq!(ips, [v4, v6]);
    let ttl = found.valid_until().saturating_duration_since(Instant::now());
    assert!(
        ttl > Duration::from_secs(25) && ttl <= Duration::from_secs(30),
        "{ttl:?}"
    );
    let types: Vec<u16> = dns.questions().iter().map(|q| q.qtype).collect();
    assert!(types.contains(&1) && types.contains(&28), "{types:?}");
    assert_eq!(dns.queries("KNOWN.test"), dns.questions().len());

    let err = r
        .lookup_ip("unknown.test.")
        .await
        .expect_err("unknown.test must not resolve");
    assert!(err.is_nx_domain(), "{err}");
    assert!(dns.queries("unknown.test") >= 1);

    dns.add("slow.test", v4, 30);
    dns.delay(Duration::from_millis(300));
    let started = Instant::now();
    r.lookup_ip("slow.test.").await.expect("slow.test resolves, late");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );

    // `replace`: the new address alone.
    let v4b: IpAddr = "127.0.0.8".parse().unwrap();
    dns.replace("known.test", v4b, 30);
    let found = r.lookup_ip("known.test.").await.expect("known.test resolves");
    assert_eq!(found.iter().collect::<Vec<_>>(), [v4b]);

    dns.delay(Duration::ZERO);
    dns.silent(true);
    let before = dns.queries("known.test");
    assert!(r.lookup_ip("known.test.").await.is_err(), "a silent server answered");
    assert!(
        dns.queries("known.test") > before,
        "the silent server did not count the question"
    );
}

#[test]
fn with_nameserver_adds_the_test_dns_server_to_every_config() {
    let dns: std::net::SocketAddr = "127.0.0.1:5353".parse().unwrap();
    let want = |text: &str| {
        let t: toml::Table = text.parse().expect("valid TOML");
        let servers = t["origin"]["nameservers"].as_array().expect("nameservers").clone();
        assert_eq!(servers, [toml::Value::from("127.0.0.1:5353")], "{text}");
        t
    };
    want(&with_nameserver("", dns));
    let t = want(&with_nameserver("[cache]\nenabled = false", dns));
    assert_eq!(t["cache"]["enabled"].as_bool(), Some(false));
    let t = want(&with_nameserver(
        "[origin]\nconnect_timeout = \"1s\"\n\n[log]\naccess = \"\"\n",
        dns,
    ));
    assert_eq!(t["origin"]["connect_timeout"].as_str(), Some("1s"));
    assert_eq!(t["log"]["access"].as_str(), Some(""));
    // A config naming its own servers is left alone.
    let own = "[origin]\nnameservers = [\"127.0.0.1:53\"]\n";
    assert_eq!(with_nameserver(own, dns), own);
}

/// Runs an ldap-utils tool and returns (success, stdout).
fn ldap_tool(args: &[&str], env: &[(&str, &std::path::Path)]) -> (bool, String) {
    let mut cmd = std::process::Command::new(args[0]);
    cmd.args(&args[1..]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run ldap-utils tool");
    (out.status.success(), stdout(&out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slapd_serves_users_groups_tls_and_can_be_stopped_and_restarted() {
    if !have_slapd() {
        return;
    }
    use common::slapd::{self, BASE, SERVICE_DN, SERVICE_PW};
    let ldif = slapd::user_ldif("alice", "a-pw") + &slapd::group_of_names("admins", &["alice"]);
    let mut d = Slapd::start(&ldif).await;
    let alice = slapd::user_dn("alice");
    let url = d.url();
    // The user's password binds; a wrong one does not.
    let (ok, who) = ldap_tool(&["ldapwhoami", "-x", "-H", &url, "-D", &alice, "-w", "a-pw"], &[]);
    assert!(ok && who.contains(&alice), "{who}");
    assert!(!ldap_tool(&["ldapwhoami", "-x", "-H", &url, "-D", &alice, "-w", "nope"], &[]).0);
    // The service account can search, and the memberof overlay filled in memberOf.
    let (ok, found) = ldap_tool(
        &[
            "ldapsearch",
            "-x",
            "-LLL",
            "-H",
            &url,
            "-D",
            SERVICE_DN,
            "-w",
            SERVICE_PW,
            "-b",
            BASE,
            "(uid=alice)",
            "memberOf",
        ],
        &[],
    );
    assert!(
        ok && found.contains(&format!("memberOf: cn=admins,ou=groups,{BASE}")),
        "{found}"
    );
    // StartTLS and LDAPS with the generated CA.
    let ca = d.ca_file();
    let env = [("LDAPTLS_CACERT", ca.as_path())];
    assert!(
        ldap_tool(
            &["ldapwhoami", "-ZZ", "-x", "-H", &url, "-D", &alice, "-w", "a-pw"],
            &env
        )
        .0
    );
    assert!(
        ldap_tool(
            &["ldapwhoami", "-x", "-H", &d.ldaps_url(), "-D", &alice, "-w", "a-pw"],
            &env
        )
        .0
    );
    // A changed password takes effect.
    d.set_password("alice", "new-pw");
    assert!(ldap_tool(&["ldapwhoami", "-x", "-H", &url, "-D", &alice, "-w", "new-pw"], &[]).0);
    // Stopped: refused; restarted: the same entries on the same port.
    d.stop();
    assert!(std::net::TcpStream::connect(url.trim_start_matches("ldap://")).is_err());
    d.restart().await;
    assert!(ldap_tool(&["ldapwhoami", "-x", "-H", &url, "-D", &alice, "-w", "new-pw"], &[]).0);
    // SIGSTOP: connections are accepted but nothing is answered.
    d.signal(libc::SIGSTOP);
    let started = Instant::now();
    // coreutils `timeout` ends the client: ldapwhoami itself would wait forever.
    let (ok, _) = ldap_tool(
        &[
            "timeout",
            "2",
            "ldapwhoami",
            "-x",
            "-H",
            &url,
            "-D",
            &alice,
            "-w",
            "new-pw",
        ],
        &[],
    );
    d.signal(libc::SIGCONT);
    assert!(
        !ok && started.elapsed() >= Duration::from_millis(1900),
        "a stopped slapd answered"
    );
    assert!(
        ldap_tool(&["ldapwhoami", "-x", "-H", &url, "-D", &alice, "-w", "new-pw"], &[]).0,
        "SIGCONT resumes it"
    );
}

/// `reload` returns once the new config is in force: the very next
/// request gets the new rule's response header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_returns_with_the_new_config_in_force() {
    let origin = echo_origin().await;
    let config = |value: &str| {
        format!(
            "[[listener]]\naddress = \"{{addr}}\"\n\n[[rule]]\nresponse_headers = {{ set = {{ X-Config = \"{value}\" }} }}\n"
        )
    };
    let addr = free_addr();
    let p = Portico::start(&config("one").replace("{addr}", &addr)).await;
    let header = || async {
        let r = parse_response(&raw_request(p.addr(), &get(&format!("{}/x", origin.url()), "")).await);
        r.header("x-config").map(str::to_string)
    };
    assert_eq!(header().await.as_deref(), Some("one"));
    p.reload(&config("two").replace("{addr}", &addr)).await;
    assert_eq!(header().await.as_deref(), Some("two"));
    // A refused reload returns once Portico said so; the old config serves.
    let said = p
        .reload_refused(&format!(
            "{}\n[server]\nprocesses = 0\n",
            config("three").replace("{addr}", &addr)
        ))
        .await;
    assert!(said.contains("server.processes"), "{said}");
    assert_eq!(header().await.as_deref(), Some("two"));
    // Requests in service: none (monitoring requests are not counted),
    // then one waiting for a slow origin.
    assert_eq!(in_service(&p).await, 0);
    let slow = Origin::start(|_req| async { Response::ok("late").delay(Duration::from_secs(1)) }).await;
    let (paddr, url) = (p.addr(), format!("{}/slow", slow.url()));
    let waiting = tokio::spawn(async move { raw_request(paddr, &get(&url, "")).await });
    until_in_service_over(&p, 0, "the request to the slow origin").await;
    assert_eq!(parse_response(&waiting.await.expect("request")).body_str(), "late");
}
