//! Parent proxies (`[[upstream]] parent = true`) through the real binary: a
//! rule-matched request reaches the parent in absolute form (forward,
//! reverse and transparent listeners) while others go straight to the
//! origin; a refused parent is skipped for the next one; responses via a
//! parent are cached; CONNECT and `https://` origins are tunnelled through
//! the parent; a Portico parent with another Via name serves, one with the
//! same name is a loop (508); and `portico check` / `portico rules test` on
//! parent configs.
//!
//! The parent here is a fake proxy written in the test: it records each
//! request head it gets and answers a canned response whose body is the
//! request line; a CONNECT it answers 200 and then pumps bytes to
//! 127.0.0.1 at the requested port (so names like `tunnel.test`, which
//! Portico itself could not resolve, prove the route went through it).

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// A fake parent proxy and the request heads it received.
struct Parent {
    server: RawOrigin,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Parent {
    async fn start() -> Parent {
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        let server = RawOrigin::start(move |stream| serve_parent(stream, seen.clone())).await;
        Parent { server, heads }
    }

    fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The request heads received so far.
    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("parent lock").clone()
    }

    /// The request lines received so far.
    fn lines(&self) -> Vec<String> {
        self.heads()
            .iter()
            .map(|h| h.lines().next().unwrap_or("").to_string())
            .collect()
    }
}

/// One connection to the fake parent: requests answered in turn (keep-alive),
/// or one CONNECT turned into a tunnel.
async fn serve_parent(mut stream: TcpStream, heads: Arc<Mutex<Vec<String>>>) {
    loop {
        let head = read_request_head(&mut stream).await;
        if head.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let line = text.lines().next().unwrap_or("").to_string();
        heads.lock().expect("parent lock").push(text);
        if let Some(target) = line.strip_prefix("CONNECT ") {
            let port: u16 = target
                .split(' ')
                .next()
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(0);
            let Ok(mut far) = TcpStream::connect(("127.0.0.1", port)).await else {
                let _ = stream
                    .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                    .await;
                return;
            };
            if stream
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut stream, &mut far).await;
            return;
        }
        let body = line;
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: max-age=60\r\nX-Parent: yes\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A header field of a request head (case-insensitive name).
fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Sends `request` (Connection: close is added) and parses the response.
async fn send(addr: SocketAddr, request: &str) -> ParsedResponse {
    let req = request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

/// The Squid log line's hierarchy field.
fn hierarchy(line: &str) -> &str {
    line.split_whitespace().nth(8).unwrap_or("")
}

fn parents_group(servers: &[String]) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[[upstream]]\nname = \"parents\"\nparent = true\nservers = [{}]\n\n",
        list.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_matched_requests_reach_the_parent_in_absolute_form_others_go_direct() {
    let parent = Parent::start().await;
    let origin = Origin::start(|req| async move { Response::ok(format!("origin {}", req.uri)) }).await;
    let fwd = free_addr();
    let rev = free_addr();
    let tra = free_addr();
    let config = format!(
        "[[listener]]\naddress = \"{fwd}\"\nmode = \"forward\"\n\n[[listener]]\naddress = \"{rev}\"\nmode = \"reverse\"\n\n\
         [[listener]]\naddress = \"{tra}\"\nmode = \"transparent\"\n\n\
         [proxy]\nvia = \"portico-child\"\n\n[cache]\nenabled = false\n\n{}\
         [[rule]]\nhost = \"*.via.test\"\nupstream = \"parents\"\n\n\
         [[rule]]\nmode = \"reverse\"\nupstream = \"parents\"\n",
        parents_group(&[parent.addr().to_string()])
    );
    let portico = Portico::start(&config).await;
    let fwd: SocketAddr = fwd.parse().unwrap();
    let rev: SocketAddr = rev.parse().unwrap();
    let tra: SocketAddr = tra.parse().unwrap();

    // Forward listener, rule matches: the parent gets the absolute URL.
    let r = send(
        fwd,
        "GET http://www.via.test:8080/path?q=1 HTTP/1.1\r\nHost: www.via.test:8080\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), portico.stderr());
    assert_eq!(r.body_str(), "GET http://www.via.test:8080/path?q=1 HTTP/1.1");
    assert_eq!(r.header("x-parent"), Some("yes"));
    let heads = parent.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert_eq!(field(&heads[0], "host"), Some("www.via.test:8080"), "{}", heads[0]);
    let via = field(&heads[0], "via").unwrap_or("");
    assert!(via.contains("portico-child"), "our Via goes to the parent: {via:?}");

    // Forward listener, no rule matches: straight to the origin.
    let r = send(
        fwd,
        &format!(
            "GET {}/direct HTTP/1.1\r\nHost: {}\r\n\r\n",
            origin.url(),
            origin.addr()
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), "origin /direct");
    assert_eq!(parent.heads().len(), 1, "the parent saw only the matched request");

    // Reverse listener: the URL is made of Host and the target.
    let r = send(rev, "GET /r?x HTTP/1.1\r\nHost: Site.Test\r\n\r\n").await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.body_str(), "GET http://Site.Test/r?x HTTP/1.1");
    let heads = parent.heads();
    assert_eq!(field(&heads[1], "host"), Some("Site.Test"), "{}", heads[1]);

    // Transparent listener: the URL is made of Host and the target too.
    let r = send(tra, "GET /t HTTP/1.1\r\nHost: www.via.test\r\n\r\n").await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.body_str(), "GET http://www.via.test/t HTTP/1.1");
    assert_eq!(parent.heads().len(), 3);
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_parent_is_skipped_for_the_next_one() {
    let parent = Parent::start().await;
    let dead = dead_addr();
    let addr = free_addr();
    let config = format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[cache]\nenabled = false\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\nformat = \"squid\"\n\n{}\
         [[rule]]\nhost = \"*\"\nupstream = \"parents\"\n",
        parents_group(&[dead.clone(), parent.addr().to_string()])
    );
    let portico = Portico::start(&config).await;
    let addr: SocketAddr = addr.parse().unwrap();
    for i in 0..3 {
        let r = send(addr, &format!("GET http://a.test/{i} HTTP/1.1\r\nHost: a.test\r\n\r\n")).await;
        assert_eq!(r.status, 200, "request {i}: {}\n{}", r.body_str(), portico.stderr());
        assert_eq!(r.body_str(), format!("GET http://a.test/{i} HTTP/1.1"));
    }
    assert_eq!(parent.lines().len(), 3);
    // The Squid log names the parent that answered (picked round-robin).
    let lines = file_lines(&portico.dir().join("access.log"), 3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert_eq!(hierarchy(line), "ROUNDROBIN_PARENT/127.0.0.1", "{line}");
    }
    let log = portico.stderr();
    assert!(
        log.contains("marking server down") && log.contains(&dead),
        "the dead parent is marked down:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_via_a_parent_are_cached_under_the_origin_url() {
    let parent = Parent::start().await;
    let addr = free_addr();
    let config = format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[cache]\ndir = \"{{dir}}/cache\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\nformat = \"squid\"\n\n{}\
         [[rule]]\nhost = \"c.test\"\nupstream = \"parents\"\n",
        parents_group(&[parent.addr().to_string()])
    );
    let portico = Portico::start(&config).await;
    let addr: SocketAddr = addr.parse().unwrap();
    let request = "GET http://c.test/page HTTP/1.1\r\nHost: c.test\r\n\r\n";
    let first = send(addr, request).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-cache"), Some("MISS"));
    let second = send(addr, request).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.header("x-cache"), Some("HIT"));
    assert_eq!(second.body_str(), "GET http://c.test/page HTTP/1.1");
    assert_eq!(parent.lines().len(), 1, "the second answer came from the cache");
    // The Squid log: the miss from the group's only parent, the hit from nowhere.
    let lines = file_lines(&portico.dir().join("access.log"), 2).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains(" TCP_MISS/200 "), "{}", lines[0]);
    assert_eq!(hierarchy(&lines[0]), "FIRST_PARENT/127.0.0.1", "{}", lines[0]);
    assert!(lines[1].contains(" TCP_HIT/200 "), "{}", lines[1]);
    assert_eq!(hierarchy(&lines[1]), "HIER_NONE/-", "{}", lines[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_https_origins_are_tunnelled_through_the_parent() {
    let parent = Parent::start().await;
    let tls = Origin::start_tls(|req| async move { Response::ok(format!("tls {}", req.uri)) }).await;
    let plain = Origin::start(|req| async move { Response::ok(format!("plain {}", req.uri)) }).await;
    let addr = free_addr();
    let config = format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[cache]\nenabled = false\n\n\
         [proxy]\nconnect_ports = [{}]\n\n[origin]\nca_file = \"{}\"\n\n{}\
         [[rule]]\nhost = \"tunnel.test\"\nupstream = \"parents\"\n\n\
         [[rule]]\nhost = \"localhost\"\nscheme = \"https\"\nupstream = \"parents\"\n",
        plain.addr().port(),
        tls.ca_pem_path().display(),
        parents_group(&[parent.addr().to_string()])
    );
    let portico = Portico::start(&config).await;
    let addr: SocketAddr = addr.parse().unwrap();

    // A client's CONNECT to a name only the parent can reach.
    let port = plain.addr().port();
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(format!("CONNECT tunnel.test:{port} HTTP/1.1\r\nHost: tunnel.test:{port}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_request_head(&mut c).await;
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{}", portico.stderr());
    c.write_all(b"GET /t HTTP/1.1\r\nHost: tunnel.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await;
    let r = parse_response(&rest);
    assert_eq!(r.body_str(), "plain /t");
    assert_eq!(parent.lines(), [format!("CONNECT tunnel.test:{port} HTTP/1.1")]);

    // An https:// URL on the forward listener: CONNECT to the parent, then
    // TLS to the origin inside the tunnel.
    let tport = tls.addr().port();
    let r = send(
        addr,
        &format!("GET https://localhost:{tport}/s HTTP/1.1\r\nHost: localhost:{tport}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), portico.stderr());
    assert_eq!(r.body_str(), "tls /s");
    assert_eq!(parent.lines()[1], format!("CONNECT localhost:{tport} HTTP/1.1"));

    // The parent cannot reach the far end and answers 502: the client gets
    // a 502 naming the parent's answer, and the parent stays up.
    let dead_port = dead_addr().rsplit_once(':').map_or(0, |(_, p)| p.parse().unwrap_or(0));
    let r = send(
        addr,
        &format!("GET https://localhost:{dead_port}/x HTTP/1.1\r\nHost: localhost:{dead_port}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.status, 502, "{}", r.body_str());
    assert!(r.body_str().contains("did not open a tunnel"), "{}", r.body_str());
    assert!(
        !portico.stderr().contains("marking server down"),
        "{}",
        portico.stderr()
    );
    let r = send(
        addr,
        &format!("GET https://localhost:{tport}/again HTTP/1.1\r\nHost: localhost:{tport}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.body_str(), "tls /again");
}

#[test]
fn check_accepts_parent_groups_and_rejects_unknown_ones_or_other_schemes() {
    let base = "[[listener]]\naddress = \"127.0.0.1:1\"\nmode = \"forward\"\n\n";
    let good = format!(
        "{base}{}[[rule]]\nhost = \"*.example.com\"\nupstream = \"parents\"\n",
        parents_group(&["127.0.0.1:3128".into(), "proxy2.example.net:8080".into()])
    );
    let out = Portico::check(&good);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let unknown = format!(
        "{base}{}[[rule]]\nhost = \"*.example.com\"\nupstream = \"parent\"\n",
        parents_group(&["127.0.0.1:3128".into()])
    );
    let out = Portico::check(&unknown);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no [[upstream]] is named `parent`"), "{err}");

    // `https://`: a parent reached over TLS (tests/parent_tls.rs); any
    // other scheme is refused with its key.
    let https = format!("{base}{}", parents_group(&["https://127.0.0.1:3128".into()]));
    let out = Portico::check(&https);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let socks = format!("{base}{}", parents_group(&["socks5://127.0.0.1:1080".into()]));
    let out = Portico::check(&socks);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("upstream[0].servers[0]") && err.contains("scheme must be http or https"),
        "{err}"
    );
}

#[test]
fn rules_test_names_the_parent() {
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("p.toml");
    let text = format!(
        "[[listener]]\naddress = \"127.0.0.1:1\"\nmode = \"forward\"\n\n{}[[rule]]\nhost = \"*.example.com\"\nupstream = \"parents\"\n",
        parents_group(&["127.0.0.1:3128".into()])
    );
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BIN)
        .args(["rules", "test", "-c"])
        .arg(&path)
        .arg("http://www.example.com/a")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(
            "upstream: parents (parent proxies: 127.0.0.1:3128): GET http://www.example.com/a in absolute form"
        ),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portico_parent_with_another_via_name_serves_and_both_vias_reach_the_origin() {
    let origin = Origin::start(|req| async move {
        let via = req.header("via").unwrap_or("").to_string();
        Response::ok(format!("origin {} via [{via}]", req.uri))
    })
    .await;
    let upper = free_addr();
    let upper_config = format!(
        "[[listener]]\naddress = \"{upper}\"\nmode = \"forward\"\n\n[proxy]\nvia = \"portico-parent\"\n\n[cache]\nenabled = false\n"
    );
    let _upper = Portico::start(&upper_config).await;
    let lower = free_addr();
    let lower_config = format!(
        "[[listener]]\naddress = \"{lower}\"\nmode = \"forward\"\n\n[proxy]\nvia = \"portico-child\"\n\n[cache]\nenabled = false\n\n{}\
         [[rule]]\nupstream = \"parents\"\n",
        parents_group(std::slice::from_ref(&upper))
    );
    let lower_portico = Portico::start(&lower_config).await;
    let r = send(
        lower.parse().unwrap(),
        &format!("GET {}/chain HTTP/1.1\r\nHost: {}\r\n\r\n", origin.url(), origin.addr()),
    )
    .await;
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), lower_portico.stderr());
    let body = r.body_str();
    assert!(body.starts_with("origin /chain via ["), "{body}");
    let child = body.find("portico-child").unwrap_or(usize::MAX);
    let parent = body.find("portico-parent").unwrap_or(usize::MAX);
    assert!(
        child < parent && parent < usize::MAX,
        "child's Via, then the parent's: {body}"
    );
    // The response's Via lists both too.
    let via = r.headers_all("via").join(", ");
    assert!(via.contains("portico-child") && via.contains("portico-parent"), "{via}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_that_loops_back_is_detected_by_via() {
    let addr = free_addr();
    // Portico as its own parent, both with the same Via name: the request
    // comes back carrying our Via entry, which answers 508.
    let config = format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[cache]\nenabled = false\n\n{}\
         [[rule]]\nupstream = \"parents\"\n",
        parents_group(std::slice::from_ref(&addr))
    );
    let _portico = Portico::start(&config).await;
    let r = send(
        addr.parse().unwrap(),
        "GET http://loop.test/ HTTP/1.1\r\nHost: loop.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 508, "{}", r.body_str());
}
