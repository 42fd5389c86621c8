//! Credentials to an authenticating parent proxy through the real binary:
//! a fake parent that answers 407 unless it gets the right
//! `Proxy-Authorization`; `[[rule]] parent_credentials = "pass"` (Squid's
//! `login=PASS`) sends the client's own, `[[upstream]] credentials_file`
//! (Squid's `login=user:password`) fixed ones, for absolute-form requests
//! and for CONNECT through the parent; by default the client's field is
//! stripped; the credentials never reach an origin directly, and configs
//! that could send them there are refused by `portico check` with file,
//! line and key.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// base64("alice:wonderland")
const ALICE: &str = "Basic YWxpY2U6d29uZGVybGFuZA==";
/// base64("portico:parent-secret")
const FIXED: &str = "Basic cG9ydGljbzpwYXJlbnQtc2VjcmV0";

/// A fake parent proxy that demands `Proxy-Authorization: <want>`: 407
/// with a challenge otherwise; with it, 200 echoing the request line for a
/// request, a tunnel to 127.0.0.1:PORT for a CONNECT. Records every head.
struct Parent {
    server: RawOrigin,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Parent {
    async fn start(want: &'static str) -> Parent {
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        let server = RawOrigin::start(move |s| serve(s, want, seen.clone())).await;
        Parent { server, heads }
    }

    fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("lock").clone()
    }
}

/// The value of header `name` in a request head.
fn field(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

async fn serve(mut stream: TcpStream, want: &'static str, heads: Arc<Mutex<Vec<String>>>) {
    loop {
        let head = read_request_head(&mut stream).await;
        if head.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let line = text.lines().next().unwrap_or("").to_string();
        let ok = field(&text, "proxy-authorization").as_deref() == Some(want);
        heads.lock().expect("lock").push(text);
        if !ok {
            let _ = stream
                .write_all(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"parent\"\r\nContent-Length: 4\r\n\r\n407!",
                )
                .await;
            continue;
        }
        if let Some(target) = line.strip_prefix("CONNECT ") {
            let port: u16 = target
                .split(' ')
                .next()
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(0);
            let Ok(mut far) = TcpStream::connect(("127.0.0.1", port)).await else {
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
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\r\n{line}",
            line.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// An origin that echoes what a tunnel sends.
async fn echo() -> RawOrigin {
    RawOrigin::start(|mut s| async move {
        let mut buf = [0u8; 1024];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// `GET http://HOST/p` through `addr` with `headers`.
async fn get(addr: SocketAddr, host: &str, headers: &str) -> ParsedResponse {
    let req = format!("GET http://{host}/p HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

/// CONNECT to `127.0.0.1:port` (a name the parent resolves) with
/// `headers`; when it opens, checks bytes go both ways. Returns the head.
async fn tunnel(addr: SocketAddr, port: u16, headers: &str) -> String {
    let (head, mut s) = connect_tunnel(addr, &format!("tunnel.test:{port}"), headers).await;
    if head.starts_with("HTTP/1.1 200") {
        s.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.expect("echo");
        assert_eq!(&buf, b"ping");
    }
    head
}

/// A forward listener; `*.via.test` and CONNECT to `tunnel.test` go to the
/// parent group (with `group_extra`) by a rule with `rule_extra`; the other
/// names go straight to the origin.
fn config(listen: &str, parent: SocketAddr, echo_port: u16, group_extra: &str, rule_extra: &str) -> String {
    format!(
        r#"[[listener]]
address = "{listen}"
mode = "forward"

[cache]
enabled = false

[proxy]
connect_ports = [{echo_port}]

[origin]
hosts = {{ "direct.test" = "127.0.0.1" }}

[[upstream]]
name = "parents"
parent = true
servers = ["{parent}"]
{group_extra}

[[rule]]
host = "*.via.test"
upstream = "parents"
{rule_extra}

[[rule]]
host = "tunnel.test"
upstream = "parents"
{rule_extra}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_sends_the_clients_credentials_to_the_parent_only() {
    let parent = Parent::start(ALICE).await;
    let e = echo().await;
    let origin = Origin::start(|req| async move {
        let creds = req.header("proxy-authorization").unwrap_or("none").to_string();
        Response::ok(format!("origin saw {creds}"))
    })
    .await;
    let listen = free_addr();
    let p = Portico::start(&config(
        &listen,
        parent.addr(),
        e.addr().port(),
        "",
        "parent_credentials = \"pass\"",
    ))
    .await;
    let a: SocketAddr = listen.parse().expect("addr");
    let creds = format!("Proxy-Authorization: {ALICE}\r\n");
    let r = get(a, "www.via.test", &creds).await;
    assert_eq!(
        (r.status, r.body_str()),
        (200, "GET http://www.via.test/p HTTP/1.1".to_string()),
        "{}",
        p.stderr()
    );
    // Without credentials the parent's refusal reaches the client, with
    // its challenge (the client's password is the one that counts).
    let r = get(a, "www.via.test", "").await;
    assert_eq!(
        (r.status, r.header("proxy-authenticate")),
        (407, Some("Basic realm=\"parent\""))
    );
    // CONNECT through the parent carries them too.
    let head = tunnel(a, e.addr().port(), &creds).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{}", p.stderr());
    let head = tunnel(a, e.addr().port(), "").await;
    assert!(!head.starts_with("HTTP/1.1 200"), "{head}");
    let heads = parent.heads();
    assert_eq!(heads.len(), 4, "{heads:?}");
    assert_eq!(field(&heads[0], "proxy-authorization").as_deref(), Some(ALICE));
    assert!(heads[2].starts_with("CONNECT tunnel.test:"), "{}", heads[2]);
    assert_eq!(field(&heads[2], "proxy-authorization").as_deref(), Some(ALICE));
    assert_eq!(field(&heads[1], "proxy-authorization"), None);
    // A request no rule sends to the parent: the origin never sees them.
    let r = get(a, &format!("direct.test:{}", origin.addr().port()), &creds).await;
    assert_eq!((r.status, r.body_str()), (200, "origin saw none".to_string()));

    // The same through the cache (a GET miss is fetched by the cache stage).
    let listen = free_addr();
    let cfg = config(
        &listen,
        parent.addr(),
        e.addr().port(),
        "",
        "parent_credentials = \"pass\"",
    )
    .replace("enabled = false", "enabled = true");
    let _p = Portico::start(&cfg).await;
    let a: SocketAddr = listen.parse().expect("addr");
    let r = get(a, "www.via.test", &creds).await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    let r = get(a, "www.via.test", "").await;
    assert_eq!(
        (r.status, r.header("proxy-authenticate")),
        (407, Some("Basic realm=\"parent\""))
    );
    assert_eq!(field(&parent.heads()[4], "proxy-authorization").as_deref(), Some(ALICE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_clients_credentials_are_stripped() {
    let parent = Parent::start(ALICE).await;
    let e = echo().await;
    let listen = free_addr();
    let _p = Portico::start(&config(&listen, parent.addr(), e.addr().port(), "", "")).await;
    let a: SocketAddr = listen.parse().expect("addr");
    let creds = format!("Proxy-Authorization: {ALICE}\r\n");
    let r = get(a, "www.via.test", &creds).await;
    // The parent's challenge is hop-by-hop and not for this client to answer.
    assert_eq!((r.status, r.header("proxy-authenticate")), (407, None));
    assert!(!tunnel(a, e.addr().port(), &creds).await.starts_with("HTTP/1.1 200"));
    for h in parent.heads() {
        assert_eq!(field(&h, "proxy-authorization"), None, "{h}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_file_authenticates_portico_itself_to_the_parent() {
    let parent = Parent::start(FIXED).await;
    let e = echo().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("parent.cred");
    std::fs::write(&file, "# the parent's account for this proxy\nportico:parent-secret\n").expect("write");
    let listen = free_addr();
    let p = Portico::start(&config(
        &listen,
        parent.addr(),
        e.addr().port(),
        &format!("credentials_file = \"{}\"", file.display()),
        "",
    ))
    .await;
    let a: SocketAddr = listen.parse().expect("addr");
    // With or without the client's own credentials, the parent gets the fixed ones.
    let r = get(a, "www.via.test", &format!("Proxy-Authorization: {ALICE}\r\n")).await;
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), p.stderr());
    assert_eq!(get(a, "www.via.test", "").await.status, 200);
    let head = tunnel(a, e.addr().port(), "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{}", p.stderr());
    let heads = parent.heads();
    assert_eq!(heads.len(), 3, "{heads:?}");
    for h in &heads {
        assert_eq!(field(h, "proxy-authorization").as_deref(), Some(FIXED), "{h}");
    }
}

#[test]
fn check_refuses_configs_that_could_send_credentials_to_an_origin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cred = dir.path().join("c");
    std::fs::write(&cred, "u:p\n").expect("write");
    let listener = "[[listener]]\naddress = \"127.0.0.1:1\"\nmode = \"forward\"\n\n";
    let cases = [
        (
            format!(
                "{listener}[[upstream]]\nname = \"o\"\nservers = [\"127.0.0.1:2\"]\n\n[[rule]]\nhost = \"a.test\"\nupstream = \"o\"\nparent_credentials = \"pass\"\n"
            ),
            12,
            "key `rule[0].parent_credentials`: upstream `o` is not a parent group (parent = true): a client's proxy credentials must never go to an origin server",
        ),
        (
            format!("{listener}[[rule]]\nhost = \"a.test\"\nparent_credentials = \"pass\"\n"),
            7,
            "key `rule[0].parent_credentials`: \"pass\" needs `upstream` naming a parent group",
        ),
        (
            format!(
                "{listener}[[upstream]]\nname = \"o\"\nservers = [\"127.0.0.1:2\"]\ncredentials_file = \"{}\"\n",
                cred.display()
            ),
            8,
            "key `upstream[0].credentials_file`: only a parent group (parent = true) is sent credentials",
        ),
        (
            format!(
                "{listener}[[upstream]]\nname = \"p\"\nparent = true\nservers = [\"127.0.0.1:2\"]\ncredentials_file = \"{}\"\n\n[[rule]]\nupstream = \"p\"\nparent_credentials = \"pass\"\n",
                cred.display()
            ),
            13,
            "key `rule[0].parent_credentials`: upstream `p` has a credentials_file",
        ),
        (
            format!(
                "{listener}[[upstream]]\nname = \"p\"\nparent = true\nservers = [\"127.0.0.1:2\"]\ncredentials_file = \"{}/missing\"\n",
                dir.path().display()
            ),
            9,
            "key `upstream[0].credentials_file`: cannot read",
        ),
    ];
    for (config, line, want) in cases {
        let out = Portico::check(&config);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{config}");
        assert!(
            err.contains(&format!(":{line}: {want}")),
            "want line {line}: {want}\n{err}"
        );
    }
    // A bad credentials file: what is wrong, never the password.
    std::fs::write(&cred, "u:hunter2\nv:hunter2\n").expect("write");
    let config = format!(
        "{listener}[[upstream]]\nname = \"p\"\nparent = true\nservers = [\"127.0.0.1:2\"]\ncredentials_file = \"{}\"\n",
        cred.display()
    );
    let out = Portico::check(&config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("line 2: a second credentials line"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_forwards_credentials_that_portico_itself_verified() {
    // [auth] checks the client's Proxy-Authorization and removes it; a rule
    // passing credentials still sends the client's own to the parent (the
    // same account on both, as with Squid's login=PASS).
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users");
    let out = std::process::Command::new("htpasswd")
        .args(["-cbB"])
        .arg(&users)
        .args(["alice", "wonderland"])
        .output();
    let Ok(out) = out else {
        eprintln!("SKIPPED: Apache's htpasswd (Debian apache2-utils) is not installed; .ci/run installs it");
        return;
    };
    assert!(out.status.success(), "{out:?}");
    let parent = Parent::start(ALICE).await;
    let e = echo().await;
    let listen = free_addr();
    let cfg = config(
        &listen,
        parent.addr(),
        e.addr().port(),
        "",
        "parent_credentials = \"pass\"",
    ) + &format!("\n[auth]\nhtpasswd = \"{}\"\nrequired = true\n", users.display());
    let p = Portico::start(&cfg).await;
    let a: SocketAddr = listen.parse().expect("addr");
    let creds = format!("Proxy-Authorization: {ALICE}\r\n");
    let r = get(a, "www.via.test", &creds).await;
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), p.stderr());
    let head = tunnel(a, e.addr().port(), &creds).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Portico's own challenge comes first without them.
    let r = get(a, "www.via.test", "").await;
    assert_eq!(
        (r.status, r.header("proxy-authenticate")),
        (407, Some("Basic realm=\"Portico\", charset=\"UTF-8\""))
    );
    let heads = parent.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for h in &heads {
        assert_eq!(field(h, "proxy-authorization").as_deref(), Some(ALICE), "{h}");
    }
}
