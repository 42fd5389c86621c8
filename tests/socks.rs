//! The SOCKS 5 server (`[[listener]] mode = "socks"`, RFC 1928 and RFC
//! 1929) end to end: the real `portico` binary, curl's `--socks5` and
//! `--socks5-hostname` clients, user files made by Apache's `htpasswd`, and
//! raw sockets for the reply codes and hostile input. Every target is on
//! loopback; names resolve through the test's own DNS server.

mod common;

use common::*;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A Portico with a forward listener first (for the monitoring pages) and
/// a SOCKS listener, `extra` appended to the config; returns it and the
/// SOCKS listener's address.
async fn socks_proxy(extra: &str) -> (Portico, SocketAddr) {
    let socks: SocketAddr = free_addr().parse().expect("address");
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n\
         [[listener]]\naddress = \"{socks}\"\nmode = \"socks\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\nformat = \"squid\"\n\n\
         [cache]\nenabled = false\n\n[limits]\nheader_timeout = \"1s\"\n\n{extra}\n",
        free_addr(),
    ))
    .await;
    (p, socks)
}

/// An origin answering 200 "hello from origin".
async fn origin() -> Origin {
    Origin::start(|_req| async move { Response::ok("hello from origin") }).await
}

/// A monitoring page of the forward listener (from loopback: an admin client).
async fn page(p: &Portico, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", p.addr());
    let r = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!(r.status, 200, "{path}");
    r.body_str()
}

/// The value of the unlabelled Prometheus sample `name` on the forward listener.
async fn metric(p: &Portico, name: &str) -> f64 {
    let m = page(p, "/metrics").await;
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{m}"))
}

/// The access log's lines once it holds `n`.
async fn log_lines(p: &Portico, n: usize) -> Vec<String> {
    file_lines(&p.dir().join("access.log"), n).await
}

fn assert_curl_ok(out: &std::process::Output, p: &Portico) {
    assert!(
        out.status.success(),
        "curl failed: {:?}\nstderr: {}\nportico: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        p.stderr()
    );
}

/// True if Apache's `htpasswd` is on PATH; tests skip (saying so) without it.
fn have_htpasswd() -> bool {
    let ok = std::process::Command::new("htpasswd")
        .args(["-nb", "u", "p"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: Apache's htpasswd (Debian apache2-utils) is not installed");
    }
    ok
}

/// An htpasswd file (bcrypt) made by the real tool with one user.
fn user_file(user: &str, password: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.htpasswd");
    let out = std::process::Command::new("htpasswd")
        .args(["-cbB", path.to_str().expect("utf-8 path"), user, password])
        .output()
        .expect("run htpasswd");
    assert!(
        out.status.success(),
        "htpasswd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, path)
}

fn auth_config(file: &Path) -> String {
    format!("[auth]\nhtpasswd = \"{}\"\nrequired = true\n", file.display())
}

/// Connects to the SOCKS listener.
async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect to the SOCKS listener")
}

/// Reads exactly `n` bytes (5 s at most).
async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .expect("no answer within 5 s")
        .expect("connection closed before the answer");
    buf
}

/// True if the server closes the connection within `within` (whatever
/// it still sends before is read and ignored).
async fn closes_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Sends the greeting offering "no authentication" and checks it is chosen.
async fn greet(s: &mut TcpStream) {
    s.write_all(&[5, 1, 0]).await.expect("send greeting");
    assert_eq!(read_n(s, 2).await, [5, 0], "method selection");
}

/// A CONNECT request to an IPv4 address.
fn connect_v4(ip: [u8; 4], port: u16) -> Vec<u8> {
    let mut r = vec![5, 1, 0, 1];
    r.extend_from_slice(&ip);
    r.extend_from_slice(&port.to_be_bytes());
    r
}

/// A CONNECT request to a domain name.
fn connect_name(name: &[u8], port: u16) -> Vec<u8> {
    let mut r = vec![5, 1, 0, 3, name.len() as u8];
    r.extend_from_slice(name);
    r.extend_from_slice(&port.to_be_bytes());
    r
}

/// Sends `request` after a "no authentication" greeting and returns the
/// reply code (the reply's 10 bytes must be a well-formed IPv4 reply).
async fn request_reply(addr: SocketAddr, request: &[u8]) -> (u8, TcpStream) {
    let mut s = connect(addr).await;
    greet(&mut s).await;
    s.write_all(request).await.expect("send request");
    let reply = read_n(&mut s, 10).await;
    assert_eq!(reply[0], 5, "reply version: {reply:?}");
    assert_eq!(reply[2], 0, "reserved byte: {reply:?}");
    assert_eq!(reply[3], 1, "a failure's bound address is IPv4 0.0.0.0:0: {reply:?}");
    (reply[1], s)
}

#[tokio::test]
async fn curl_socks5_by_ipv4_address_reaches_the_origin_logged_and_counted() {
    let o = origin().await;
    let (p, socks) = socks_proxy("").await;
    let out = curl(&["--socks5", &socks.to_string(), &format!("{}/x", o.url())]).await;
    assert_curl_ok(&out, &p);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from origin");
    assert_eq!(o.count(), 1);
    // One Squid-format line: a tunnel, the target as the client named it,
    // the bytes sent to the client.
    let lines = log_lines(&p, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let f: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(f[3], "TCP_TUNNEL/200", "{}", lines[0]);
    assert_eq!(f[5], "CONNECT", "{}", lines[0]);
    assert_eq!(f[6], o.addr().to_string(), "{}", lines[0]);
    assert_eq!(f[8], format!("HIER_DIRECT/{}", o.addr().ip()), "{}", lines[0]);
    let sent: u64 = f[4].parse().expect("bytes field");
    assert!(sent > "hello from origin".len() as u64, "{}", lines[0]);
    assert_eq!(metric(&p, "portico_socks_sessions_total").await, 1.0);
    assert_eq!(metric(&p, "portico_socks_established_total").await, 1.0);
    assert_eq!(metric(&p, "portico_socks_received_bytes_total").await, sent as f64);
    let stats = page(&p, "/.stats.json").await;
    assert!(stats.contains("\"socks\":{\"sessions\":1,"), "{stats}");
    // The new figures are valid Prometheus (names, types, help texts).
    promtool_check(&page(&p, "/metrics").await);
    let xml = page(&p, "/stats-xml").await;
    assert!(xml.contains("<socks-bucket countSessions=\"1\""), "{xml}");
    let perf = page(&p, "/.perf").await;
    assert!(
        perf.contains("SocksInfo:") && perf.contains("Established      1\n"),
        "{perf}"
    );
}

#[tokio::test]
async fn curl_socks5_hostname_resolves_through_porticos_resolver() {
    let o = origin().await;
    let (p, socks) = socks_proxy("").await;
    p.dns().add("origin.test", o.addr().ip(), 60);
    let url = format!("http://origin.test:{}/y", o.addr().port());
    let out = curl(&["--socks5-hostname", &socks.to_string(), &url]).await;
    assert_curl_ok(&out, &p);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from origin");
    assert!(p.dns().queries("origin.test") >= 1, "{:?}", p.dns().questions());
    // Twice: the second session is answered from Portico's DNS cache.
    let out = curl(&["--socks5-hostname", &socks.to_string(), &url]).await;
    assert_curl_ok(&out, &p);
    assert_eq!(metric(&p, "portico_dns_cache_hits_total").await, 1.0);
    let lines = log_lines(&p, 2).await;
    assert!(
        lines[0].contains(&format!(" CONNECT origin.test:{} ", o.addr().port())),
        "{lines:?}"
    );
    // A name that does not exist: host unreachable (0x04).
    let (code, _) = request_reply(socks, &connect_name(b"nothing.test", 80)).await;
    assert_eq!(code, 4);
}

#[tokio::test]
async fn curl_socks5_to_an_ipv6_target() {
    let Ok(listener) = tokio::net::TcpListener::bind("[::1]:0").await else {
        eprintln!("SKIPPED: no IPv6 loopback on this machine");
        return;
    };
    let port = listener.local_addr().expect("local addr").port();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "request cut short");
            head.extend_from_slice(&buf[..n]);
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nover v6")
            .await
            .expect("write");
        String::from_utf8_lossy(&head).to_string()
    });
    let (p, socks) = socks_proxy("").await;
    let out = curl(&["--socks5", &socks.to_string(), &format!("http://[::1]:{port}/six")]).await;
    assert_curl_ok(&out, &p);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "over v6");
    let head = server.await.expect("origin task");
    assert!(head.starts_with("GET /six HTTP/1.1"), "{head}");
    let lines = log_lines(&p, 1).await;
    assert!(lines[0].contains(&format!(" CONNECT [::1]:{port} ")), "{lines:?}");
}

#[tokio::test]
async fn curl_socks5_with_user_and_password_from_htpasswd() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file("alice", "s3cret");
    let o = origin().await;
    let (p, socks) = socks_proxy(&auth_config(&file)).await;
    let url = format!("{}/z", o.url());
    let out = curl(&["--socks5", &format!("alice:s3cret@{socks}"), &url]).await;
    assert_curl_ok(&out, &p);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from origin");
    let out = curl(&["--socks5", &format!("alice:wrong@{socks}"), &url]).await;
    assert!(!out.status.success(), "wrong password served");
    // No credentials at all while `auth.required`: no acceptable method.
    let out = curl(&["--socks5", &socks.to_string(), &url]).await;
    assert!(!out.status.success(), "served without credentials");
    assert_eq!(o.count(), 1);
    let lines = log_lines(&p, 3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    let f: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!((f[3], f[7]), ("TCP_TUNNEL/200", "alice"), "{}", lines[0]);
    let f: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!((f[3], f[7]), ("TCP_DENIED/407", "alice"), "{}", lines[1]);
    let f: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!((f[3], f[7]), ("TCP_DENIED/407", "-"), "{}", lines[2]);
    assert_eq!(metric(&p, "portico_socks_auth_failures_total").await, 2.0);
    assert_eq!(metric(&p, "portico_auth_failures_total").await, 1.0);
}

#[tokio::test]
async fn rfc_1929_hostile_sub_negotiations_are_refused_and_closed() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file("alice", "s3cret");
    let (p, socks) = socks_proxy(&auth_config(&file)).await;
    let login = |ver: u8, user: &[u8], pw: &[u8]| {
        let mut m = vec![ver, user.len() as u8];
        m.extend_from_slice(user);
        m.push(pw.len() as u8);
        m.extend_from_slice(pw);
        m
    };
    let cases: [(&str, Vec<u8>); 5] = [
        ("wrong sub-negotiation version", login(5, b"alice", b"s3cret")),
        ("empty user", login(1, b"", b"s3cret")),
        ("empty password", login(1, b"alice", b"")),
        ("control character in the user", login(1, b"ali\0ce", b"s3cret")),
        ("wrong password", login(1, b"alice", b"nope")),
    ];
    for (what, msg) in &cases {
        let mut s = connect(socks).await;
        // Both methods offered: username/password is chosen.
        s.write_all(&[5, 2, 0, 2]).await.expect("greeting");
        assert_eq!(read_n(&mut s, 2).await, [5, 2], "{what}: method");
        s.write_all(msg).await.expect("login");
        let status = read_n(&mut s, 2).await;
        assert_eq!(status[0], 1, "{what}: {status:?}");
        assert_ne!(status[1], 0, "{what}: accepted");
        assert!(
            closes_within(&mut s, Duration::from_secs(3)).await,
            "{what}: not closed"
        );
    }
    // The right password still works after all that.
    let mut s = connect(socks).await;
    s.write_all(&[5, 1, 2]).await.expect("greeting");
    assert_eq!(read_n(&mut s, 2).await, [5, 2]);
    s.write_all(&login(1, b"alice", b"s3cret")).await.expect("login");
    assert_eq!(read_n(&mut s, 2).await, [1, 0]);
    drop(s);
    let lines = log_lines(&p, 6).await;
    assert_eq!(lines.len(), 6, "{lines:?}");
    // The wrong password is logged with its user (the malformed logins name none).
    let with_user: Vec<&String> = lines.iter().filter(|l| l.contains(" alice ")).collect();
    assert_eq!(with_user.len(), 2, "{lines:?}");
    assert_eq!(
        with_user.iter().filter(|l| l.contains(" TCP_DENIED/407 ")).count(),
        1,
        "{lines:?}"
    );
    assert_eq!(metric(&p, "portico_socks_auth_failures_total").await, 4.0);
    // The wrong version, and the last session closed before its request.
    assert_eq!(metric(&p, "portico_socks_malformed_total").await, 2.0);
}

#[tokio::test]
async fn hostile_greetings_and_requests_are_answered_or_closed() {
    let o = origin().await;
    let (p, socks) = socks_proxy("").await;
    // A wrong version byte (SOCKS 4): closed without a reply.
    let mut s = connect(socks).await;
    s.write_all(&[4, 1, 0, 80, 127, 0, 0, 1, 0]).await.expect("send");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert!(buf.is_empty(), "answered a SOCKS 4 request: {buf:?}");
    // Zero methods: "no acceptable methods", then closed.
    let mut s = connect(socks).await;
    s.write_all(&[5, 0]).await.expect("send");
    assert_eq!(read_n(&mut s, 2).await, [5, 0xFF]);
    assert!(closes_within(&mut s, Duration::from_secs(3)).await);
    // Only methods Portico does not have (GSSAPI, a private one).
    let mut s = connect(socks).await;
    s.write_all(&[5, 2, 1, 0x80]).await.expect("send");
    assert_eq!(read_n(&mut s, 2).await, [5, 0xFF]);
    // Username/password without `[auth]`: nothing to check it against.
    let mut s = connect(socks).await;
    s.write_all(&[5, 1, 2]).await.expect("send");
    assert_eq!(read_n(&mut s, 2).await, [5, 0xFF]);
    // An empty domain name, and one longer than a name can be: general failure.
    let (code, mut s) = request_reply(socks, &connect_name(b"", 80)).await;
    assert_eq!(code, 1);
    assert!(closes_within(&mut s, Duration::from_secs(3)).await);
    let (code, _) = request_reply(socks, &connect_name(&[b'a'; 255], 80)).await;
    assert_eq!(code, 1);
    let (code, _) = request_reply(socks, &connect_name(b"evil.test/x@y", 80)).await;
    assert_eq!(code, 1);
    // An address type that does not exist.
    let (code, _) = request_reply(socks, &[5, 1, 0, 9, 1, 2, 3, 4, 0, 80]).await;
    assert_eq!(code, 8);
    // BIND and UDP ASSOCIATE: command not supported; nothing reaches the origin.
    let [a, b, c, d] = [127, 0, 0, 1];
    let port = o.addr().port().to_be_bytes();
    for cmd in [2u8, 3, 9] {
        let (code, _) = request_reply(socks, &[5, cmd, 0, 1, a, b, c, d, port[0], port[1]]).await;
        assert_eq!(code, 7, "command {cmd}");
    }
    // A request of another version.
    let (code, _) = request_reply(socks, &[6, 1, 0, 1, a, b, c, d, port[0], port[1]]).await;
    assert_eq!(code, 1);
    assert_eq!(o.connections(), 0);
    // Nothing hung: a good session after all that.
    let out = curl(&["--socks5", &socks.to_string(), &o.url()]).await;
    assert_curl_ok(&out, &p);
    assert_eq!(metric(&p, "portico_socks_unsupported_total").await, 4.0);
    assert_eq!(metric(&p, "portico_socks_malformed_total").await, 8.0);
    assert_eq!(metric(&p, "portico_socks_established_total").await, 1.0);
}

#[tokio::test]
async fn truncated_greetings_and_requests_are_closed_after_the_header_timeout() {
    let o = origin().await;
    let (p, socks) = socks_proxy("").await;
    let port = o.addr().port().to_be_bytes();
    let full = connect_v4([127, 0, 0, 1], o.addr().port());
    // Cut in the greeting, in the address, in the port.
    let cuts: [(&str, Vec<u8>, Vec<u8>); 3] = [
        ("greeting", vec![5, 2, 0], vec![]),
        ("address", vec![5, 1, 0], vec![5, 1, 0, 1, 127]),
        ("port", vec![5, 1, 0], vec![5, 1, 0, 1, 127, 0, 0, 1, port[0]]),
    ];
    let mut held = Vec::new();
    for (what, greeting, request) in cuts {
        let started = Instant::now();
        let mut s = connect(socks).await;
        s.write_all(&greeting).await.expect("send");
        if !request.is_empty() {
            assert_eq!(read_n(&mut s, 2).await, [5, 0], "{what}");
            s.write_all(&request).await.expect("send");
        }
        // `limits.header_timeout = "1s"` in the test config.
        assert!(
            closes_within(&mut s, Duration::from_secs(5)).await,
            "{what}: still open"
        );
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(900), "{what}: closed after {took:?}");
        held.push(s);
    }
    assert_eq!(o.connections(), 0);
    let lines = log_lines(&p, 3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    for l in &lines {
        assert!(l.contains("NONE/408"), "{l}");
    }
    // The tasks are gone: a full request is served.
    let mut s = connect(socks).await;
    greet(&mut s).await;
    s.write_all(&full).await.expect("send");
    let reply = read_n(&mut s, 10).await;
    assert_eq!(reply[1], 0, "{reply:?}");
    assert_eq!(metric(&p, "portico_socks_malformed_total").await, 3.0);
}

#[tokio::test]
async fn acl_rule_and_allow_list_refusals_get_reply_2() {
    let o = origin().await;
    let (p, socks) = socks_proxy(&format!(
        "[[acl]]\naction = \"deny\"\nmethod = \"CONNECT\"\nhost = \"127.0.0.1\"\nport = {}\n\n\
         [[rule]]\nhost = \"ruled.test\"\ndeny = 403\n",
        o.addr().port()
    ))
    .await;
    p.dns().add("ruled.test", o.addr().ip(), 60);
    p.dns().add("fine.test", o.addr().ip(), 60);
    let (code, mut s) = request_reply(socks, &connect_v4([127, 0, 0, 1], o.addr().port())).await;
    assert_eq!(code, 2, "[[acl]] deny");
    assert!(closes_within(&mut s, Duration::from_secs(3)).await);
    let (code, _) = request_reply(socks, &connect_name(b"ruled.test", o.addr().port())).await;
    assert_eq!(code, 2, "[[rule]] deny");
    assert_eq!(o.connections(), 0);
    // The same origin by a name no entry denies is served.
    let (code, mut s) = request_reply(socks, &connect_name(b"fine.test", o.addr().port())).await;
    assert_eq!(code, 0, "allowed");
    s.write_all(b"GET / HTTP/1.1\r\nHost: fine.test\r\nConnection: close\r\n\r\n")
        .await
        .expect("send");
    let mut body = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut body)).await;
    assert!(String::from_utf8_lossy(&body).ends_with("hello from origin"));
    let lines = log_lines(&p, 3).await;
    let denied = lines.iter().filter(|l| l.contains(" TCP_DENIED/403 ")).count();
    assert_eq!(denied, 2, "{lines:?}");
    assert_eq!(metric(&p, "portico_socks_denied_total").await, 2.0);
    assert_eq!(metric(&p, "portico_acl_denied_total").await, 1.0);
}

#[tokio::test]
async fn an_acl_entry_naming_an_ip_address_holds_for_every_spelling_of_it() {
    let o = origin().await;
    let port = o.addr().port();
    let (p, socks) = socks_proxy("[[acl]]\naction = \"deny\"\nhost = \"127.0.0.1\"\n").await;
    // Domain names the connector reads as 127.0.0.1 (`inet_aton(3)` forms).
    for name in ["2130706433", "0x7f.1", "0177.0.0.1", "127.1", "127.000.000.001"] {
        let (code, _) = request_reply(socks, &connect_name(name.as_bytes(), port)).await;
        assert_eq!(code, 2, "domain name {name}");
    }
    // The IPv4-mapped IPv6 address of 127.0.0.1 (address type 4).
    let mut v6 = vec![5, 1, 0, 4];
    v6.extend_from_slice(&std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets());
    v6.extend_from_slice(&port.to_be_bytes());
    let (code, _) = request_reply(socks, &v6).await;
    assert_eq!(code, 2, "::ffff:127.0.0.1");
    assert_eq!(o.connections(), 0, "no spelling of the address reaches the origin");
    assert_eq!(metric(&p, "portico_acl_denied_total").await, 6.0);
}

#[tokio::test]
async fn clients_outside_access_allow_get_reply_2() {
    let o = origin().await;
    let (_p, socks) = socks_proxy("[access]\nallow = [\"192.0.2.0/24\"]\n").await;
    let (code, _) = request_reply(socks, &connect_v4([127, 0, 0, 1], o.addr().port())).await;
    assert_eq!(code, 2);
    assert_eq!(o.connections(), 0);
}

#[tokio::test]
async fn upstream_failures_map_to_reply_codes() {
    let (p, socks) = socks_proxy("[origin]\nconnect_timeout = \"1s\"\n").await;
    // Nothing listens there: connection refused (0x05).
    let dead: SocketAddr = dead_addr().parse().expect("address");
    let (code, _) = request_reply(socks, &connect_v4([127, 0, 0, 1], dead.port())).await;
    assert_eq!(code, 5);
    // Portico's own SOCKS listener: a loop, refused by rule (0x02).
    let (code, _) = request_reply(socks, &connect_v4([127, 0, 0, 1], socks.port())).await;
    assert_eq!(code, 2);
    // A name server slower than `origin.connect_timeout` (which covers the
    // lookup): TTL expired (0x06), within the timeout, not the answer's 5 s.
    p.dns().add("slow.test", std::net::Ipv4Addr::LOCALHOST.into(), 60);
    p.dns().delay(Duration::from_secs(5));
    let started = Instant::now();
    let (code, _) = request_reply(socks, &connect_name(b"slow.test", dead.port())).await;
    let took = started.elapsed();
    assert_eq!(code, 6);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(4500),
        "{took:?}"
    );
    assert_eq!(metric(&p, "portico_socks_connect_failures_total").await, 2.0);
    // In any order: a refused session is logged once the client has
    // closed (the lingering close), which may come after the next one, and
    // after the /metrics request above (logged too: four lines).
    let lines: Vec<String> = log_lines(&p, 4)
        .await
        .into_iter()
        .filter(|l| l.contains(" CONNECT "))
        .collect();
    for status in ["NONE/502", "NONE/508", "NONE/504"] {
        let n = lines.iter().filter(|l| l.contains(&format!(" {status} "))).count();
        assert_eq!(n, 1, "{status}: {lines:?}");
    }
}

#[tokio::test]
async fn acl_entries_see_the_socks_user_and_its_login() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file("alice", "s3cret");
    let out = std::process::Command::new("htpasswd")
        .args(["-bB", file.to_str().expect("utf-8 path"), "bob", "hunter2"])
        .output()
        .expect("run htpasswd");
    assert!(out.status.success());
    let o = origin().await;
    // Credentials optional (`required` unset): only alice may reach the
    // origin, an anonymous session is asked to log in (and cannot be).
    let (p, socks) = socks_proxy(&format!(
        "[auth]\nhtpasswd = \"{}\"\n\n\
         [[acl]]\naction = \"allow\"\nmethod = \"CONNECT\"\nport = {port}\nuser = \"alice\"\nmode = \"socks\"\n\n\
         [[acl]]\naction = \"deny\"\nport = {port}\n",
        file.display(),
        port = o.addr().port()
    ))
    .await;
    let url = format!("{}/acl", o.url());
    let out = curl(&["--socks5", &format!("alice:s3cret@{socks}"), &url]).await;
    assert_curl_ok(&out, &p);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from origin");
    let out = curl(&["--socks5", &format!("bob:hunter2@{socks}"), &url]).await;
    assert!(!out.status.success(), "bob served");
    let (code, _) = request_reply(socks, &connect_v4([127, 0, 0, 1], o.addr().port())).await;
    assert_eq!(code, 2, "anonymous");
    assert_eq!(o.count(), 1);
    let lines = log_lines(&p, 3).await;
    let has = |status: &str, user: &str| {
        lines
            .iter()
            .any(|l| l.contains(&format!(" {status} ")) && l.contains(&format!(" {user} ")))
    };
    assert!(has("TCP_TUNNEL/200", "alice"), "{lines:?}");
    assert!(has("TCP_DENIED/403", "bob"), "{lines:?}");
    assert!(has("TCP_DENIED/407", "-"), "{lines:?}");
    assert_eq!(metric(&p, "portico_acl_denied_total").await, 1.0);
}

#[test]
fn a_socks_listener_with_certificates_is_refused_by_portico_check() {
    let out = Portico::check(
        "[[listener]]\naddress = \"127.0.0.1:1080\"\nmode = \"socks\"\n\n\
         [[listener.certificate]]\ncert = \"{dir}/c.pem\"\nkey = \"{dir}/k.pem\"\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("listener[0].certificate") && err.contains("does not speak TLS"),
        "{err}"
    );
}

/// `limits.client_bandwidth` paces what a SOCKS session carries to its
/// client: at 64 KiB a second with a 16 KiB burst, 96 KiB a server sends
/// take at least 1.25 s (timed from below only: pacing is never quicker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socks_session_keeps_to_the_clients_bandwidth() {
    let server = RawOrigin::start(|mut s| async move {
        let data: Vec<u8> = (0..96usize << 10).map(|i| (i % 251) as u8).collect();
        let _ = s.write_all(&data).await;
        let _ = s.shutdown().await;
    })
    .await;
    let (p, socks) = socks_proxy("client_bandwidth = \"64KiB\"\nclient_bandwidth_burst = \"16KiB\"\n").await;
    let start = Instant::now();
    let (code, mut s) = request_reply(socks, &connect_v4([127, 0, 0, 1], server.addr().port())).await;
    assert_eq!(code, 0, "{}", p.stderr());
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got))
        .await
        .expect("the session ends")
        .expect("read");
    let took = start.elapsed();
    assert_eq!(got.len(), 96 << 10);
    assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    assert!(took.as_secs_f64() >= 1.1, "96 KiB through SOCKS in {took:?}");
}
