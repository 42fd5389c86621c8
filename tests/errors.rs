//! Error handling through the real binary: unreachable, slow and broken
//! origins, refused clients, requests Portico will not proxy, forwarding
//! loops. Each checks what a user sees (status, error page, logs) and
//! whether an origin was contacted.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An origin that answers `origin PATH`.
async fn origin() -> Origin {
    Origin::start(|req| async move { Response::ok(format!("origin {}", req.uri.path())) }).await
}

/// The text of one `[[listener]]` table.
fn listener(addr: &str, mode: &str) -> String {
    format!("[[listener]]\naddress = \"{addr}\"\nmode = \"{mode}\"\n\n")
}

/// A Portico with a forward listener on a free port, an access log, and `extra` config.
async fn forward(extra: &str) -> Portico {
    let config = format!(
        "{}[log]\naccess = \"{{dir}}/access.log\"\n\n{extra}\n",
        listener(&free_addr(), "forward")
    );
    Portico::start(&config).await
}

/// `GET <url>` in absolute form with `Connection: close`.
fn get_abs(url: &str, host: &str) -> Vec<u8> {
    format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Sends `request` to `addr` and returns the parsed response.
async fn ask(addr: SocketAddr, request: &[u8]) -> ParsedResponse {
    let bytes = raw_request(addr, request).await;
    assert!(
        !bytes.is_empty(),
        "no response to {:?}",
        String::from_utf8_lossy(request)
    );
    parse_response(&bytes)
}

/// Asserts the response is a Portico HTML error page with `status` whose
/// text contains `reason`.
fn assert_error_page(resp: &ParsedResponse, status: u16, reason: &str) {
    let body = resp.body_str();
    assert_eq!(resp.status, status, "{body}");
    assert!(
        resp.header("content-type").is_some_and(|t| t.starts_with("text/html")),
        "{:?}",
        resp.headers
    );
    assert!(body.contains("<html>"), "{body}");
    assert!(body.contains(&status.to_string()), "{body}");
    assert!(body.contains(reason), "page lacks {reason:?}: {body}");
}

/// Waits up to 5 s for `path` to contain `needle`; returns its contents.
async fn wait_file_contains(path: &Path, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) || tokio::time::Instant::now() >= deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits up to 5 s for Portico's error log to contain `needle`.
async fn wait_stderr_contains(p: &Portico, needle: &str) -> String {
    wait_file_contains(&p.dir().join("portico.stderr"), needle).await
}

/// Connects to `dst` from source address `src`, sends `request`, and
/// reads until EOF or 5 s.
async fn request_from(src: IpAddr, dst: SocketAddr, request: &[u8]) -> Vec<u8> {
    let socket = if dst.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .expect("create socket");
    socket
        .bind(SocketAddr::new(src, 0))
        .unwrap_or_else(|e| panic!("bind {src}: {e}"));
    let mut stream = socket.connect(dst).await.expect("connect from bound address");
    stream.write_all(request).await.expect("write request");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut got)).await;
    got
}

/// Library internals that must never reach an error page or a warning:
/// hyper's and hickory's Debug and Display forms, OS error numbers.
const INTERNALS: [&str; 7] = [
    "SendRequest",
    "Query {",
    "Name(",
    "hyper",
    "os error",
    "client error",
    "Kind(",
];

/// Asserts `text` (a page or a log line) names no library internals.
fn assert_plain(text: &str) {
    for internal in INTERNALS {
        assert!(
            !text.contains(internal),
            "internal error text {internal:?} shown: {text}"
        );
    }
}

// ---------------------------------------------------------------- origins that fail

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_origin_is_502_cannot_connect_with_a_warning_naming_the_target() {
    let p = forward("").await;
    let dead = dead_addr();
    let url = format!("http://{dead}/gone");
    let resp = ask(p.addr(), &get_abs(&url, &dead)).await;
    assert_error_page(&resp, 502, "cannot connect");
    assert!(resp.body_str().contains(&dead), "{}", resp.body_str());
    let log = wait_stderr_contains(&p, &url).await;
    let line = log
        .lines()
        .find(|l| l.contains(&url))
        .unwrap_or_else(|| panic!("no error-log line names {url}:\n{log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("cannot connect"), "{line}");
    // The cause in plain words, on the page and in the log.
    let plain = format!("cannot connect to {dead}: connection refused");
    assert!(
        resp.body_str().contains(&format!("<p>{plain}</p>")),
        "{}",
        resp.body_str()
    );
    assert!(line.contains(&plain), "{line}");
    assert_plain(&resp.body_str());
    assert_plain(line);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_closing_without_answering_is_502_in_plain_words() {
    let raw = RawOrigin::start(|mut stream| async move {
        read_request_head(&mut stream).await;
        // Dropped: closed with no answer.
    })
    .await;
    let p = forward("").await;
    let a = raw.addr();
    let url = format!("http://{a}/mute");
    let resp = ask(p.addr(), &get_abs(&url, &a.to_string())).await;
    assert_error_page(&resp, 502, "the origin closed the connection before answering");
    assert!(
        resp.body_str()
            .contains("<p>the origin closed the connection before answering</p>"),
        "{}",
        resp.body_str()
    );
    assert_plain(&resp.body_str());
    let log = wait_stderr_contains(&p, &url).await;
    let line = log
        .lines()
        .find(|l| l.contains(&url) && l.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning names {url}:\n{log}"));
    assert!(
        line.contains("the origin closed the connection before answering"),
        "{line}"
    );
    assert_plain(line);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_origin_is_504_after_first_byte_timeout() {
    let p = forward("[origin]\nfirst_byte_timeout = \"1s\"\n").await;
    let hole = Blackhole::start().await;
    let url = format!("http://{}/slow", hole.addr());
    let resp = ask(p.addr(), &get_abs(&url, &hole.addr().to_string())).await;
    assert_error_page(&resp, 504, "no response within 1s");
    assert_eq!(hole.accepted(), 1);
    let log = wait_stderr_contains(&p, &url).await;
    assert!(log.lines().any(|l| l.contains("WARN") && l.contains(&url)), "{log}");
}

/// Sends `POST <url>` with a 6-byte body one byte every 400 ms (2.4 s in
/// all) and returns the response and the time from the last byte to it.
async fn slow_upload(p: &Portico, url: &str, host: &str) -> (ParsedResponse, Duration) {
    let mut client = RawClient::connect(p.addr()).await;
    client.timeout = Duration::from_secs(15);
    client
        .send(
            format!("POST {url} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 6\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
    for byte in b"abcdef" {
        tokio::time::sleep(Duration::from_millis(400)).await;
        client.send(&[*byte]).await;
    }
    let last = std::time::Instant::now();
    let resp = client.read_response().await;
    (resp, last.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_byte_timeout_starts_when_the_request_body_has_been_sent() {
    // The harness's origin reads the whole body before answering.
    let o = Origin::start(|req| async move {
        let resp = Response::ok(req.body.clone());
        if req.uri.path() == "/stall" {
            resp.delay(Duration::from_secs(6))
        } else {
            resp
        }
    })
    .await;
    let p = forward("[origin]\nfirst_byte_timeout = \"1s\"\n").await;
    let a = o.addr().to_string();

    // A 2.4 s upload is not a slow origin: the echo arrives.
    let (resp, _) = slow_upload(&p, &format!("http://{a}/echo"), &a).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "abcdef"));

    // An origin silent after the whole body still times out, 1 s after it.
    let (resp, after_body) = slow_upload(&p, &format!("http://{a}/stall"), &a).await;
    assert_error_page(&resp, 504, "no response within 1s");
    assert!(
        after_body >= Duration::from_millis(800) && after_body < Duration::from_secs(4),
        "{after_body:?}"
    );
    let bodies: Vec<_> = o.requests().iter().map(|r| r.body.clone()).collect();
    assert_eq!(bodies, ["abcdef", "abcdef"]);
}

/// A listener whose accept queue is full drops new SYNs, so connecting to
/// it hangs: a reliable connect timeout on loopback. Returns the listener,
/// the connections that fill it, and its address, or None if the kernel
/// did not behave that way.
async fn saturated_listener() -> Option<(socket2::Socket, Vec<tokio::net::TcpStream>, SocketAddr)> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).ok()?;
    socket.listen(0).ok()?;
    let addr = socket.local_addr().ok()?.as_socket()?;
    let mut held = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(Duration::from_millis(300), tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => held.push(s),
            Ok(Err(_)) => return None,
            Err(_) => return Some((socket, held, addr)),
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_is_504() {
    let Some((_listener, _held, addr)) = saturated_listener().await else {
        eprintln!("SKIPPED: could not saturate a loopback accept queue to make connects hang");
        return;
    };
    let p = forward("[origin]\nconnect_timeout = \"500ms\"\n").await;
    let url = format!("http://{addr}/");
    let resp = ask(p.addr(), &get_abs(&url, &addr.to_string())).await;
    assert_error_page(&resp, 504, "timed out connecting to");
    assert!(resp.body_str().contains(&addr.to_string()), "{}", resp.body_str());
    assert_plain(&resp.body_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolvable_origin_name_is_502_in_plain_words() {
    // `.invalid` never resolves (RFC 6761: the resolver answers NXDOMAIN
    // itself); `nothing.test` is asked of the harness's name server, which
    // does not know it. Either way the page names the cause in plain words,
    // not the resolver's dump of its query.
    let p = forward("[origin]\nconnect_timeout = \"30s\"\n").await;
    for name in ["does-not-exist.invalid", "nothing.test"] {
        let mut client = RawClient::connect(p.addr()).await;
        client.timeout = Duration::from_secs(10);
        client.send(&get_abs(&format!("http://{name}/x"), name)).await;
        let resp = client.read_response().await;
        assert_error_page(&resp, 502, &format!("cannot resolve {name}: no address found"));
        let body = resp.body_str();
        for internal in ["Query", "Name(", "{", "DNS error"] {
            assert!(!body.contains(internal), "{internal:?} in {body}");
        }
    }
    assert!(p.dns().queries("nothing.test") >= 1, "{:?}", p.dns().questions());
}

/// The perfdump (`/.perf`), asked of Portico in origin form.
async fn perfdump(p: &Portico) -> String {
    let req = format!("GET /.perf HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", p.addr());
    let resp = ask(p.addr(), req.as_bytes()).await;
    assert_eq!(resp.status, 200, "{}", resp.body_str());
    resp.body_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_or_silent_name_server_is_504_within_connect_timeout() {
    let o = origin().await;
    let port = o.addr().port();
    let p = forward("[origin]\nconnect_timeout = \"1s\"\n").await;
    p.dns().add("slow.test", o.addr().ip(), 60);
    p.dns().add("quiet.test", o.addr().ip(), 60);
    p.dns().delay(Duration::from_secs(5));
    let started = std::time::Instant::now();
    let resp = ask(p.addr(), &get_abs(&format!("http://slow.test:{port}/x"), "slow.test")).await;
    let took = started.elapsed();
    assert_error_page(&resp, 504, "timed out connecting to slow.test");
    // Loose bounds: the machine may be busy, but the 5 s answer must not
    // have been waited for.
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(4500),
        "{took:?}"
    );

    p.dns().delay(Duration::ZERO);
    p.dns().silent(true);
    let started = std::time::Instant::now();
    let resp = ask(p.addr(), &get_abs(&format!("http://quiet.test:{port}/x"), "quiet.test")).await;
    let took = started.elapsed();
    assert_error_page(&resp, 504, "timed out connecting to quiet.test");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(4500),
        "{took:?}"
    );
    assert!(p.dns().queries("quiet.test") >= 1);
    assert_eq!(o.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answers_are_cached_for_their_ttl_and_counted() {
    // Every response closes its connection, so each request opens a new
    // one and looks the name up.
    let o =
        Origin::start(
            |req| async move { Response::ok(format!("origin {}", req.uri.path())).header("Connection", "close") },
        )
        .await;
    let p = forward("").await;
    p.dns().add("ttl.test", o.addr().ip(), 1);
    let url = |path: &str| format!("http://ttl.test:{}{path}", o.addr().port());

    let resp = ask(p.addr(), &get_abs(&url("/1"), "ttl.test")).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /1"));
    let asked = p.dns().queries("ttl.test");
    assert!(asked >= 1, "the test name server was not asked");
    let resp = ask(p.addr(), &get_abs(&url("/2"), "ttl.test")).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /2"));
    assert_eq!(p.dns().queries("ttl.test"), asked, "asked again within the TTL");

    // Past the 1 s TTL the name is asked again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let resp = ask(p.addr(), &get_abs(&url("/3"), "ttl.test")).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /3"));
    assert!(p.dns().queries("ttl.test") > asked, "not asked again after the TTL");

    let perf = perfdump(&p).await;
    let dns = perf
        .split("DNSCacheInfo:")
        .nth(1)
        .unwrap_or_else(|| panic!("no DNSCacheInfo in {perf}"));
    assert!(dns.contains("CacheEntries     1/1024\n"), "{perf}");
    assert!(dns.contains("HitRatio         1/3 ( 33.33%)\n"), "{perf}");
    assert_eq!(o.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_hosts_and_localhost_resolve_without_a_query() {
    let o = origin().await;
    let port = o.addr().port();
    let p = forward("[origin]\nhosts = { \"fixed.test\" = \"127.0.0.1\", \"Both.Test\" = [\"::1\", \"127.0.0.1\"] }\n")
        .await;
    for name in ["fixed.test", "both.test", "FIXED.test.", "localhost", "a.localhost"] {
        let resp = ask(p.addr(), &get_abs(&format!("http://{name}:{port}/h"), name)).await;
        assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /h"), "{name}");
    }
    let asked = p.dns().questions();
    assert!(asked.is_empty(), "a name server was asked: {asked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_closing_mid_body_truncates_the_response_and_portico_keeps_serving() {
    let raw = RawOrigin::start(|mut stream| async move {
        let head = read_request_head(&mut stream).await;
        let reply: &[u8] = if head.starts_with(b"GET /trunc ") {
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nwhole"
        };
        let _ = stream.write_all(reply).await;
        // Dropping the stream closes the connection mid-body for /trunc.
    })
    .await;
    let p = forward("").await;
    let a = raw.addr();

    // Keep-alive request: only Portico closing the connection ends the read.
    let mut client = RawClient::connect(p.addr()).await;
    client
        .send(format!("GET http://{a}/trunc HTTP/1.1\r\nHost: {a}\r\n\r\n").as_bytes())
        .await;
    let bytes = client.read_to_end().await;
    assert!(client.is_eof(), "connection left open after a truncated response");
    let text = String::from_utf8_lossy(&bytes);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head arrived");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-length: 100"), "{head}");
    assert!(body.len() < 100, "complete body despite the origin failing: {body:?}");
    assert!("0123456789".starts_with(body), "{body:?}");

    let resp = ask(p.addr(), &get_abs(&format!("http://{a}/next"), &a.to_string())).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "whole"));
    assert!(p.stderr().contains("WARN"), "{}", p.stderr());
    let warned = p.stderr();
    assert!(
        warned.contains("the origin closed the connection before the end of the body"),
        "{warned}"
    );
    for line in warned.lines().filter(|l| l.contains("WARN")) {
        assert_plain(line);
    }
}

// ---------------------------------------------------------------- clients that do not read

/// A connection to `addr` whose receive buffer is as small as the kernel
/// allows, so that a client that does not read stops the sender at once.
fn tiny_window_client(addr: SocketAddr) -> tokio::net::TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(1024).expect("SO_RCVBUF");
    socket.connect(&addr.into()).expect("connect to portico");
    socket.set_nonblocking(true).expect("nonblocking");
    tokio::net::TcpStream::from_std(socket.into()).expect("tokio stream")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_never_reads_is_closed_after_send_timeout_and_frees_its_slot() {
    // Far more than the socket buffers on both sides can hold.
    const BIG: u64 = 64 << 20;
    let o = Origin::start(|req| async move {
        if req.uri.path() == "/big" {
            Response::new(200).header("Cache-Control", "no-store").generated(BIG)
        } else {
            Response::ok("small")
        }
    })
    .await;
    // One request in service at a time: the stuck client holds the only slot.
    let p = forward("[server]\nmax_requests = 1\nqueue_size = 4\n\n[limits]\nsend_timeout = \"1s\"\n").await;
    let a = o.addr();
    let mut stuck = tiny_window_client(p.addr());
    stuck
        .write_all(&get_abs(&format!("http://{a}/big"), &a.to_string()))
        .await
        .expect("send the request");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Waits in the connection queue until the stuck client's slot is freed.
    let started = std::time::Instant::now();
    let bytes = raw_request_timeout(
        p.addr(),
        &get_abs(&format!("http://{a}/small"), &a.to_string()),
        Duration::from_secs(10),
    )
    .await;
    let resp = parse_response(&bytes);
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "small"));
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());

    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        p.addr()
    );
    let metrics = ask(p.addr(), req.as_bytes()).await.body_str();
    assert!(metrics.contains("\nportico_send_timeouts_total 1\n"), "{metrics}");
    let perf = perfdump(&p).await;
    assert!(perf.contains("SendTimeouts         1\n"), "{perf}");

    // The stuck client's connection was cut: reading now ends (reset or end
    // of stream) well before the whole body.
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(n) = stuck.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got += n as u64;
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection was still open after {got} bytes");
    assert!(got < BIG, "the whole body arrived");
}

// ---------------------------------------------------------------- clients that are refused

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_outside_allow_list_gets_403_and_origin_is_not_contacted() {
    let o = origin().await;
    let p = forward("[access]\nallow = [\"127.0.0.1/32\"]\n").await;
    let url = format!("{}/secret", o.url());
    let req = get_abs(&url, &o.addr().to_string());

    let bytes = request_from("127.0.0.2".parse().unwrap(), p.addr(), &req).await;
    let resp = parse_response(&bytes);
    assert_error_page(&resp, 403, "Cache access denied");
    assert_eq!((o.count(), o.connections()), (0, 0));
    let log = wait_file_contains(&p.dir().join("access.log"), "127.0.0.2 ").await;
    assert!(
        log.lines()
            .any(|l| l.starts_with("127.0.0.2 ") && l.contains("\" 403 ")),
        "{log}"
    );

    let bytes = request_from("127.0.0.1".parse().unwrap(), p.addr(), &req).await;
    let resp = parse_response(&bytes);
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /secret"));
    assert_eq!(o.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_allow_list_admits_only_the_listed_address() {
    let v6 = match std::net::TcpListener::bind("[::1]:0") {
        Ok(l) => l.local_addr().expect("local_addr"),
        Err(e) => {
            eprintln!("SKIPPED: no IPv6 loopback on this machine ({e})");
            return;
        }
    };
    let o = origin().await;
    let config = format!(
        "{}{}[access]\nallow = [\"::1/128\"]\n\n[log]\naccess = \"{{dir}}/access.log\"\n",
        listener(&v6.to_string(), "forward"),
        listener(&free_addr(), "forward"),
    );
    let p = Portico::start(&config).await;
    let v4 = listener_addrs(&config)[1];
    let url = format!("{}/six", o.url());
    let req = get_abs(&url, &o.addr().to_string());

    let resp = parse_response(&request_from("127.0.0.1".parse().unwrap(), v4, &req).await);
    assert_error_page(&resp, 403, "Cache access denied");
    assert_eq!(o.count(), 0);

    let resp = parse_response(&request_from("::1".parse().unwrap(), p.addr(), &req).await);
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /six"));
    assert_eq!(o.count(), 1);
}

/// CONFIG.md: networks are CIDR "or single addresses (`"192.0.2.7"`)".
#[test]
fn single_addresses_in_allow_list_are_accepted() {
    for allow in ["\"192.0.2.7\"", "\"::1\"", "\"127.0.0.1\", \"::1\""] {
        let out = Portico::check(&format!("[access]\nallow = [{allow}]\nadmin_allow = [{allow}]\n"));
        assert!(
            out.status.success(),
            "allow = [{allow}] refused: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_allow_list_is_all_of_127_0_0_0_8_so_127_0_0_2_is_served() {
    let o = origin().await;
    // No [access] section: the default allow list applies.
    let p = forward("").await;
    let req = get_abs(&format!("{}/lo", o.url()), &o.addr().to_string());
    let resp = parse_response(&request_from("127.0.0.2".parse().unwrap(), p.addr(), &req).await);
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /lo"));
    assert_eq!(o.count(), 1);
}

#[test]
fn default_config_listens_on_loopback_only() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["run", "--print-config"])
        .output()
        .expect("run portico --print-config");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let config: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}\n{text}"));
    let listeners: Vec<&str> = config["listener"]
        .as_array()
        .expect("[[listener]]")
        .iter()
        .filter_map(|l| l["address"].as_str())
        .collect();
    assert_eq!(listeners, ["127.0.0.1:8080"], "{text}");
    let allow: Vec<&str> = config["access"]["allow"]
        .as_array()
        .expect("access.allow")
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert_eq!(allow, ["127.0.0.0/8", "::1/128"], "{text}");
}

// ---------------------------------------------------------------- requests Portico refuses

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_is_400_in_access_log_and_warned_in_error_log() {
    let o = origin().await;
    let p = forward("").await;
    let a = o.addr();
    let req = format!("GET http://{a}/bad HTTP/1.1\r\nHost: {a}\r\nBad Name: x\r\n\r\n");
    let mut client = RawClient::connect(p.addr()).await;
    client.send(req.as_bytes()).await;
    let bytes = client.read_to_end().await;
    assert!(client.is_eof(), "connection not closed after 400");
    let resp = parse_response(&bytes);
    assert_error_page(&resp, 400, "invalid header field name");
    assert_eq!(o.connections(), 0);

    let request_line = format!("\"GET http://{a}/bad HTTP/1.1\" 400 ");
    let log = wait_file_contains(&p.dir().join("access.log"), &request_line).await;
    assert!(
        log.lines()
            .any(|l| l.starts_with("127.0.0.1 ") && l.contains(&request_line)),
        "{log}"
    );
    let err = wait_stderr_contains(&p, "invalid header field name").await;
    assert!(
        err.lines()
            .any(|l| l.contains("WARN") && l.contains("invalid header field name") && l.contains("400")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_form_request_to_forward_listener_is_400_not_a_proxy_request() {
    let o = origin().await;
    let p = forward("").await;
    let req = format!("GET /x HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", o.addr());
    let resp = ask(p.addr(), req.as_bytes()).await;
    assert_error_page(&resp, 400, "not a proxy request");
    assert_eq!(o.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_scheme_is_400() {
    let o = origin().await;
    let p = forward("").await;
    let a = o.addr();
    let resp = ask(p.addr(), &get_abs(&format!("ftp://{a}/file"), &a.to_string())).await;
    assert_error_page(&resp, 400, "unsupported URI scheme");
    assert_eq!(o.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_port_not_in_connect_ports_is_403() {
    let o = origin().await;
    let p = forward("").await;
    let a = o.addr();
    let req = format!("CONNECT {a} HTTP/1.1\r\nHost: {a}\r\n\r\n");
    let mut client = RawClient::connect(p.addr()).await;
    client.send(req.as_bytes()).await;
    let bytes = client.read_to_end().await;
    assert!(client.is_eof(), "connection not closed after a refused CONNECT");
    assert_error_page(&parse_response(&bytes), 403, "not allowed");
    assert_eq!(o.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transparent_listener_pointed_at_itself_ends_in_508_not_a_loop() {
    let o = origin().await;
    let addr = free_addr();
    let config = format!(
        "{}[log]\naccess = \"{{dir}}/access.log\"\n",
        listener(&addr, "transparent")
    );
    let p = Portico::start(&config).await;
    let req = format!("GET /loop HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let resp = ask(p.addr(), req.as_bytes()).await;
    assert_error_page(&resp, 508, "forwarding loop");
    assert_eq!(o.count(), 0);
    // Exactly two hops: the client's request and the one Portico sent itself.
    let log = wait_file_contains(&p.dir().join("access.log"), "\" 508 ").await;
    let looped = log.lines().filter(|l| l.contains("/loop")).count();
    assert!(looped <= 2, "{log}");

    // Still serving.
    let req = format!("GET /after HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", o.addr());
    let resp = ask(p.addr(), req.as_bytes()).await;
    assert_eq!((resp.status, resp.body_str().as_str()), (200, "origin /after"));
    assert_eq!(o.count(), 1);
}
