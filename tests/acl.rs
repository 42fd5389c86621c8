//! Access control lists (`[[acl]]`) through the real binary: allow and deny
//! in order with the default, each matcher kind, CONNECT decided by its
//! target's host and port, header conditions (non-UTF-8 values included),
//! listener modes, time windows with a fixed clock, the authentication
//! challenge (407 / 401), the statistics, `portico check` errors with their
//! line and key, and `portico acl test`.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// An origin answering `ok PATH`.
async fn origin() -> Origin {
    Origin::start(|req| async move { Response::ok(format!("ok {}", req.uri)) }).await
}

/// A forward listener, the access log in `{dir}`, no cache, the names
/// `*.test` used below pointing at loopback, then `extra`.
fn forward(extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n[cache]\nenabled = false\n\n[origin]\nhosts = {{ \"ok.test\" = \"127.0.0.1\", \"www.ok.test\" = \"127.0.0.1\", \"ads1.test\" = \"127.0.0.1\", \"blocked.test\" = \"127.0.0.1\", \"www.blocked.test\" = \"127.0.0.1\" }}\n\n{extra}",
        free_addr()
    )
}

/// Sends `request` (Connection: close added) and parses the response.
async fn send(addr: SocketAddr, request: &str) -> ParsedResponse {
    let req = request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

/// `METHOD http://HOST:PORT/PATH` through the forward proxy, with `headers`.
async fn via(p: &Portico, method: &str, host: &str, port: u16, path: &str, headers: &str) -> ParsedResponse {
    let body = if method == "POST" { "Content-Length: 2\r\n" } else { "" };
    let req = format!("{method} http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n{headers}{body}\r\n");
    let req = req.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    let req = if method == "POST" { format!("{req}hi") } else { req };
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

/// A monitoring page of `p`.
async fn page(p: &Portico, path: &str) -> String {
    let r = send(p.addr(), &format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", p.addr())).await;
    assert_eq!(r.status, 200, "{path}: {}", r.body_str());
    r.body_str()
}

/// Sends `CONNECT target` with `headers`; returns the response head and
/// the open stream.
async fn connect(p: &Portico, target: &str, headers: &str) -> (String, TcpStream) {
    connect_tunnel(p.addr(), target, headers).await
}

/// An origin echoing every byte until EOF.
async fn echo_origin() -> RawOrigin {
    RawOrigin::start(|mut stream| async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_decide_in_order_and_the_default_takes_the_rest_with_counters() {
    let o = origin().await;
    let port = o.addr().port();
    let p = Portico::start(&forward(
        r#"
[access]
acl_default = "deny"

[[acl]]
action = "allow"
host = "www.ok.test"
path = "/public/"

[[acl]]
action = "deny"
host = "*.ok.test"
status = 451
reason = "Blocked by the office policy"

[[acl]]
action = "allow"
client = "127.0.0.0/8"
host = ["ok.test", "127.0.0.1"]
method = "GET"
"#,
    ))
    .await;
    // Entry 0 comes before the wildcard deny that also matches.
    let r = via(&p, "GET", "www.ok.test", port, "/public/a", "").await;
    assert_eq!((r.status, r.body_str()), (200, "ok /public/a".to_string()));
    let r = via(&p, "GET", "www.ok.test", port, "/private", "").await;
    assert_eq!(r.status, 451, "{}", r.body_str());
    assert!(
        r.body_str().contains("Blocked by the office policy"),
        "{}",
        r.body_str()
    );
    let r = via(&p, "GET", "ok.test", port, "/x", "").await;
    assert_eq!((r.status, r.body_str()), (200, "ok /x".to_string()));
    // POST matches no entry: acl_default = "deny", the default wording.
    let r = via(&p, "POST", "ok.test", port, "/x", "").await;
    assert_eq!(r.status, 403);
    assert!(r.body_str().contains("Cache access denied"), "{}", r.body_str());
    assert_eq!(o.count(), 2, "denied requests never reach the origin");

    let log = access_log_with(p.dir(), "\"POST http://ok.test").await;
    assert!(
        log.contains(&format!("\"GET http://www.ok.test:{port}/private HTTP/1.1\" 451 ")),
        "{log}"
    );
    assert!(
        log.contains(&format!("\"POST http://ok.test:{port}/x HTTP/1.1\" 403 ")),
        "{log}"
    );

    // Every statistics view counts the two denials.
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains(&format!("{:<28} 2", "ACL Denied")), "{perf}");
    assert!(perf.contains(&format!("{:<28} none: ", "ACL Cache")), "{perf}");
    assert!(page(&p, "/stats-xml").await.contains("countAclDenied=\"2\""));
    assert!(page(&p, "/metrics").await.contains("\nportico_acl_denied_total 2\n"));
    let json: serde_json::Value = serde_json::from_str(&page(&p, "/.stats.json").await).expect("JSON");
    assert_eq!(json["snapshot"]["requests"]["acl_denied"], 2, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_acl_entries_everything_passes_as_before() {
    let o = origin().await;
    let p = Portico::start(&forward("")).await;
    let r = via(&p, "POST", "ok.test", o.addr().port(), "/x", "").await;
    assert_eq!(r.status, 200, "{}", r.body_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_matcher_kind_denies_only_what_it_names() {
    let o = origin().await;
    let port = o.addr().port();
    let rev = free_addr();
    // Every port a URL may name (proxy.http_ports would refuse port 1
    // first): the `port` entry below decides.
    let cfg = forward(&format!(
        r#"
[proxy]
http_ports = ["1-65535"]

[[listener]]
address = "{rev}"
mode = "reverse"

[[upstream]]
name = "o"
servers = ["127.0.0.1:{port}"]

[[rule]]
upstream = "o"
mode = "reverse"

[[acl]]
action = "deny"
regex = '\.exe(\?|$)'
reason = "regex"
[[acl]]
action = "deny"
host_regex = '^ads[0-9]+\.'
reason = "host_regex"
[[acl]]
action = "deny"
header = [{{ name = "X-Block" }}, {{ name = "User-Agent", regex = "^BadBot" }}]
reason = "header"
[[acl]]
action = "deny"
header = {{ name = "X-Raw", regex = ".*" }}
reason = "raw header"
[[acl]]
action = "deny"
method = "DELETE"
reason = "method"
[[acl]]
action = "deny"
mode = "reverse"
path = "/admin/"
reason = "mode"
[[acl]]
action = "deny"
port = 1
reason = "port"
[[acl]]
action = "deny"
client = "10.0.0.0/8"
reason = "client"
"#
    ));
    let p = Portico::start(&cfg).await;
    let reason = |r: &ParsedResponse| {
        if r.status == 403 {
            r.body_str()
                .split("<p>")
                .nth(1)
                .and_then(|t| t.split("</p>").next())
                .unwrap_or("?")
                .to_string()
        } else {
            format!("{} {}", r.status, r.body_str())
        }
    };
    let ok = |path: &str| format!("200 ok {path}");
    assert_eq!(
        reason(&via(&p, "GET", "ok.test", port, "/setup.exe", "").await),
        "regex"
    );
    assert_eq!(
        reason(&via(&p, "GET", "ok.test", port, "/setup.exe?v=2", "").await),
        "regex"
    );
    assert_eq!(
        reason(&via(&p, "GET", "ok.test", port, "/setup.exes", "").await),
        ok("/setup.exes")
    );
    assert_eq!(reason(&via(&p, "GET", "ads1.test", port, "/", "").await), "host_regex");
    let both = "X-Block: 1\r\nUser-Agent: BadBot/2\r\n";
    assert_eq!(reason(&via(&p, "GET", "ok.test", port, "/h", both).await), "header");
    let one = "X-Block: 1\r\nUser-Agent: curl\r\n";
    assert_eq!(reason(&via(&p, "GET", "ok.test", port, "/h", one).await), ok("/h"));
    assert_eq!(reason(&via(&p, "DELETE", "ok.test", port, "/d", "").await), "method");
    assert_eq!(
        reason(&via(&p, "GET", "ok.test", port, "/admin/x", "").await),
        ok("/admin/x"),
        "forward mode"
    );
    let rev: SocketAddr = rev.parse().expect("address");
    let r = send(rev, "GET /admin/x HTTP/1.1\r\nHost: site.test\r\n\r\n").await;
    assert_eq!(reason(&r), "mode");
    let r = send(rev, "GET /other HTTP/1.1\r\nHost: site.test\r\n\r\n").await;
    assert_eq!(reason(&r), ok("/other"));
    let r = send(p.addr(), "GET http://ok.test:1/ HTTP/1.1\r\nHost: ok.test:1\r\n\r\n").await;
    assert_eq!(reason(&r), "port");

    // A header value that is not UTF-8 is not text a regex could mean: it
    // never matches one, and the request goes on (the proxy does not fail).
    let mut bytes = format!("GET http://ok.test:{port}/raw HTTP/1.1\r\nHost: ok.test\r\nX-Raw: ").into_bytes();
    bytes.extend_from_slice(b"caf\xe9 \xff\xfe\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request(p.addr(), &bytes).await);
    assert_eq!(reason(&r), ok("/raw"));
    assert_eq!(
        reason(&via(&p, "GET", "ok.test", port, "/raw", "X-Raw: text\r\n").await),
        "raw header"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_is_decided_by_its_target_host_and_port() {
    let allowed = echo_origin().await;
    let refused = echo_origin().await;
    let (a, b) = (allowed.addr().port(), refused.addr().port());
    let p = Portico::start(&forward(&format!(
        r#"
[proxy]
connect_ports = [443, {a}, {b}]

[[acl]]
action = "deny"
path = "/"
reason = "a path entry never matches a CONNECT"
[[acl]]
action = "deny"
scheme = "https"
reason = "a scheme entry never matches a CONNECT"
[[acl]]
action = "deny"
host = "*.blocked.test"
reason = "blocked host"
[[acl]]
action = "deny"
method = "CONNECT"
port = {b}
reason = "blocked port"
[[acl]]
action = "deny"
method = "CONNECT"
header = {{ name = "User-Agent", regex = "^BadBot" }}
reason = "blocked agent"
"#
    )))
    .await;
    let (head, _) = connect(&p, "www.blocked.test:443", "").await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
    assert!(head.contains("blocked host"), "{head}");
    let (head, _) = connect(&p, &format!("127.0.0.1:{b}"), "").await;
    assert!(
        head.starts_with("HTTP/1.1 403 ") && head.contains("blocked port"),
        "{head}"
    );
    let (head, _) = connect(&p, &format!("127.0.0.1:{a}"), "User-Agent: BadBot/1\r\n").await;
    assert!(
        head.starts_with("HTTP/1.1 403 ") && head.contains("blocked agent"),
        "{head}"
    );
    // Allowed: the tunnel is made and carries bytes both ways.
    let (head, mut s) = connect(&p, &format!("127.0.0.1:{a}"), "User-Agent: curl\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"ping").await.expect("write through tunnel");
    let mut buf = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&buf, b"ping");
    assert_eq!(refused.connections(), 0, "a denied tunnel is never attempted");
    let log = access_log_with(p.dir(), "CONNECT www.blocked.test:443").await;
    assert!(log.contains("\"CONNECT www.blocked.test:443 HTTP/1.1\" 403 "), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_entries_match_the_path_as_the_origin_resolves_it() {
    let o = origin().await;
    let port = o.addr().port();
    let p = Portico::start(&forward(
        r#"
[[acl]]
action = "deny"
host = "ok.test"
path = "/admin/"
reason = "admin path"

[[acl]]
action = "deny"
regex = '^/secret/'
reason = "secret path"
"#,
    ))
    .await;
    // Each of these is /admin/x or /secret/x to the origin.
    for (path, reason) in [
        ("/admin/x", "admin path"),
        ("/%61dmin/x", "admin path"),
        ("/%61%64%6D%69%6E/x", "admin path"),
        ("//admin/x", "admin path"),
        ("/./admin/x", "admin path"),
        ("/x/../admin/x", "admin path"),
        ("/%2e%2e/admin/x", "admin path"),
        ("/x//..//admin/x", "admin path"),
        // Tomcat's and Jetty's segment parameters, IIS's backslash.
        ("/admin;jsessionid=1/x", "admin path"),
        ("/x/..;/admin/x", "admin path"),
        ("/x\\..\\admin\\x", "admin path"),
        // And the other way round: still under /admin/ to nginx or an
        // application router, which keep `;` and `\` as characters.
        ("/admin/..;/public", "admin path"),
        ("/admin/x\\..\\..\\public", "admin path"),
        ("/admin/%2e%2e;/public", "admin path"),
        ("/%73ecret/x", "secret path"),
        ("//secret/x", "secret path"),
        ("/a/./../secret/x?q=1", "secret path"),
    ] {
        let r = via(&p, "GET", "ok.test", port, path, "").await;
        assert_eq!(r.status, 403, "{path}: {}", r.body_str());
        assert!(r.body_str().contains(reason), "{path}: {}", r.body_str());
    }
    assert_eq!(o.count(), 0, "no spelling of the denied paths reaches the origin");
    // Not the denied path: an encoded `/` is not a separator, and paths
    // are case-sensitive. What is allowed goes to the origin as sent.
    for path in ["/%2Fadmin/x", "/Admin/x", "/public/./%61//b/../c", "/public;v=1/x"] {
        let r = via(&p, "GET", "ok.test", port, path, "").await;
        assert_eq!((r.status, r.body_str()), (200, format!("ok {path}")), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_method_purge_purges_so_an_entry_for_purge_is_not_passed_by_another_case() {
    // GET is cacheable; any other method is refused by the origin, which
    // records what it was sent.
    let o = Origin::start(|req| async move {
        if req.method == http::Method::GET {
            Response::ok(format!("ok {}", req.uri)).header("cache-control", "max-age=600")
        } else {
            Response::new(405)
        }
    })
    .await;
    let port = o.addr().port();
    let cfg = forward(
        r#"
[[acl]]
action = "deny"
method = "PURGE"
reason = "no purging"
"#,
    )
    .replace(
        "[cache]\nenabled = false",
        "[cache]\ndir = \"{dir}/cache\"\nmemory = \"16MiB\"",
    );
    let p = Portico::start(&cfg).await;
    let url = format!("http://ok.test:{port}/x");
    let request = |method: &str| format!("{method} {url} HTTP/1.1\r\nHost: ok.test:{port}\r\n\r\n");
    let r = send(p.addr(), &request("GET")).await;
    assert_eq!((r.status, r.header("x-cache")), (200, Some("MISS")));
    let r = send(p.addr(), &request("GET")).await;
    assert_eq!((r.status, r.header("x-cache")), (200, Some("HIT")));
    let r = send(p.addr(), &request("PURGE")).await;
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert!(r.body_str().contains("no purging"), "{}", r.body_str());
    // Methods are case-sensitive (RFC 9110 9.1): `purge` is another,
    // unknown method, which goes to the origin like any other.
    let r = send(p.addr(), &request("purge")).await;
    assert_eq!(r.status, 405, "{}", r.body_str());
    let methods: Vec<String> = o.requests().iter().map(|r| r.method.to_string()).collect();
    assert_eq!(methods, ["GET", "purge"]);
    let r = send(p.addr(), &request("GET")).await;
    assert_eq!(
        (r.status, r.header("x-cache")),
        (200, Some("HIT")),
        "the object was not purged"
    );
}

/// Spellings of 127.0.0.1 that Portico's connector (like `inet_aton(3)`
/// and browsers) dials as that address.
const LOOPBACK_SPELLINGS: [&str; 9] = [
    "2130706433",
    "0x7f.1",
    "0177.0.0.1",
    "127.1",
    "0x7f000001",
    "127.000.000.001",
    "127.0.0.1.",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_naming_an_ip_address_holds_for_every_spelling_of_it() {
    let o = origin().await;
    let tunnel = echo_origin().await;
    let (port, t) = (o.addr().port(), tunnel.addr().port());
    let p = Portico::start(&forward(&format!(
        r#"
[proxy]
connect_ports = [{t}]

[[acl]]
action = "deny"
host = "127.0.0.1"
reason = "blocked address"
"#
    )))
    .await;
    for host in LOOPBACK_SPELLINGS {
        let r = via(&p, "GET", host, port, "/a", "").await;
        assert_eq!(r.status, 403, "GET http://{host}:{port}/a: {}", r.body_str());
        assert!(r.body_str().contains("blocked address"), "{host}: {}", r.body_str());
        let (head, _) = connect(&p, &format!("{host}:{t}"), "").await;
        assert!(head.starts_with("HTTP/1.1 403 "), "CONNECT {host}:{t}: {head}");
    }
    // Transparent-style: the same address in a Host header.
    let r = send(
        p.addr(),
        &format!("GET http://2130706433:{port}/h HTTP/1.1\r\nHost: 127.1:{port}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert_eq!(o.count(), 0, "no spelling of the address reaches the origin");
    assert_eq!(tunnel.connections(), 0, "no tunnel to any spelling is made");
    // The same origin by a name the entry does not list is served: the
    // entries above were refused for their address, not their port.
    let r = via(&p, "GET", "ok.test", port, "/a", "").await;
    assert_eq!((r.status, r.body_str()), (200, "ok /a".to_string()));
    let log = access_log_with(p.dir(), "\"GET http://ok.test").await;
    assert!(
        log.contains(&format!("\"GET http://2130706433:{port}/a HTTP/1.1\" 403 ")),
        "the access log keeps the request as the client wrote it: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_needing_a_user_asks_for_credentials() {
    let o = origin().await;
    let port = o.addr().port();
    let rev = free_addr();
    let cfg = forward(&format!(
        r#"
[auth]
realm = "Office Proxy"

[[listener]]
address = "{rev}"
mode = "reverse"

[[upstream]]
name = "o"
servers = ["127.0.0.1:{port}"]

[[rule]]
upstream = "o"
mode = "reverse"

[[acl]]
action = "allow"
group = "admins"
path = "/admin/"
[[acl]]
action = "deny"
path = "/admin/"
[[acl]]
action = "allow"
method = "CONNECT"
authenticated = true
"#
    ));
    let p = Portico::start(&cfg).await;
    let r = via(&p, "GET", "ok.test", port, "/admin/x", "").await;
    assert_eq!(r.status, 407, "{}", r.body_str());
    assert_eq!(
        r.header("proxy-authenticate"),
        Some("Basic realm=\"Office Proxy\", charset=\"UTF-8\"")
    );
    assert_eq!(r.header("www-authenticate"), None);
    // Entries that need no user still decide without credentials.
    assert_eq!(via(&p, "GET", "ok.test", port, "/public", "").await.status, 200);

    let rev: SocketAddr = rev.parse().expect("address");
    let r = send(rev, "GET /admin/x HTTP/1.1\r\nHost: site.test\r\n\r\n").await;
    assert_eq!(r.status, 401, "{}", r.body_str());
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"Office Proxy\", charset=\"UTF-8\"")
    );
    assert_eq!(r.header("proxy-authenticate"), None);

    let (head, _) = connect(&p, "ok.test:443", "").await;
    assert!(head.starts_with("HTTP/1.1 407 "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authenticate: basic realm=\"office proxy\""),
        "{head}"
    );
    assert_eq!(o.count(), 1);
    let log = access_log_with(p.dir(), "CONNECT ok.test:443").await;
    assert!(
        log.contains(&format!("\"GET http://ok.test:{port}/admin/x HTTP/1.1\" 407 ")),
        "{log}"
    );
    assert!(log.contains("\"GET /admin/x HTTP/1.1\" 401 "), "{log}");
}

const OFFICE_HOURS: &str = r#"
[access]
time_zone = "Europe/Paris"

[[acl]]
action = "deny"
host = "*.ok.test"
days = ["mon", "tue", "wed", "thu", "fri"]
time = "09:00-18:00"
reason = "not during office hours"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_windows_use_the_configured_zone_and_the_clock() {
    let o = origin().await;
    let port = o.addr().port();
    // Tuesday 09:30 in Paris (UTC+1 in November).
    let p = Portico::start_with_env(
        &forward(OFFICE_HOURS),
        &[("PORTICO_TEST_NOW", std::ffi::OsStr::new("2026-11-24T08:30:00Z"))],
    )
    .await;
    let r = via(&p, "GET", "www.ok.test", port, "/", "").await;
    assert_eq!(r.status, 403);
    assert!(r.body_str().contains("not during office hours"), "{}", r.body_str());
    // 08:30 UTC is 09:30 in Paris but 08:30 in UTC: outside the window there.
    let utc = OFFICE_HOURS.replace("Europe/Paris", "UTC");
    let p = Portico::start_with_env(
        &forward(&utc),
        &[("PORTICO_TEST_NOW", std::ffi::OsStr::new("2026-11-24T08:30:00Z"))],
    )
    .await;
    assert_eq!(via(&p, "GET", "www.ok.test", port, "/", "").await.status, 200);
    // Saturday.
    let p = Portico::start_with_env(
        &forward(OFFICE_HOURS),
        &[("PORTICO_TEST_NOW", std::ffi::OsStr::new("2026-11-28T10:00:00Z"))],
    )
    .await;
    assert_eq!(via(&p, "GET", "www.ok.test", port, "/", "").await.status, 200);
}

/// Writes `text` to a temporary portico.toml and runs `portico ARGS... -c it`.
fn run_with_config(text: &str, args: &[&str], tail: &[&str]) -> (Output, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("portico.toml");
    std::fs::write(&path, text).expect("write config");
    let out = Command::new(BIN)
        .args(args)
        .arg("-c")
        .arg(&path)
        .args(tail)
        .output()
        .expect("run portico");
    (out, path.display().to_string())
}

#[test]
fn check_names_file_line_and_key_of_acl_mistakes() {
    let cases: [(&str, &str); 7] = [
        (
            "[[acl]]\naction = \"allow\"\n\n[[acl]]\naction = \"deny\"\nregex = \"(unclosed\"\n",
            ":6: key `acl[1].regex`: invalid regular expression",
        ),
        (
            "[[acl]]\naction = \"deny\"\ntime = \"18:00-25:00\"\n",
            ":3: key `acl[0].time`: time \"18:00-25:00\": write \"HH:MM-HH:MM\"",
        ),
        (
            "[[acl]]\naction = \"deny\"\ndays = [\"mon\", \"someday\"]\n",
            ":3: key `acl[0].days`: unknown day \"someday\"",
        ),
        (
            "[access]\ntime_zone = \"Europe/Nowhere\"\n",
            ":2: key `access.time_zone`: unknown time zone \"Europe/Nowhere\"",
        ),
        (
            "[[acl]]\naction = \"deny\"\nstatus = 302\n",
            ":3: key `acl[0].status`: 302: a deny takes an error status, 400 to 599",
        ),
        (
            "[[acl]]\naction = \"deny\"\nhost_regex = \"(x{1000}){1000}\"\n",
            ":3: key `acl[0].host_regex`: invalid regular expression",
        ),
        ("[[acl]]\naction = \"block\"\n", ":2: key `acl[0].action`"),
    ];
    for (text, want) in cases {
        let (out, path) = run_with_config(text, &["check"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(err.contains(&format!("{path}{want}")), "want {want:?} in {err}");
    }
    // User and group entries are valid before an authentication back-end
    // exists (they answer with a challenge).
    let (out, _) = run_with_config("[[acl]]\naction = \"allow\"\nuser = \"alice\"\n", &["check"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn acl_test_explains_the_deciding_entry_and_the_verdict() {
    let text = r#"[[listener]]
address = "127.0.0.1:1"
mode = "forward"

[access]
time_zone = "Europe/Paris"

[auth]
realm = "Office"

[[acl]]
action = "allow"
client = "10.0.0.0/8"
group = "admins"

[[acl]]
action = "deny"
host = ["*.blocked.test", "blocked.test"]
reason = "Blocked site"

[[acl]]
action = "deny"
host = "*.video.test"
days = ["mon", "tue", "wed", "thu", "fri"]
time = "09:00-18:00"
"#;
    let run = |tail: &[&str]| {
        let (out, path) = run_with_config(text, &["acl", "test"], tail);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), path)
    };
    let (s, path) = run(&["http://www.blocked.test/a", "--at", "2026-11-24T10:00"]);
    assert!(
        s.contains(
            "request: GET http://www.blocked.test/a from 127.0.0.1 on a forward listener, no authenticated user, at 2026-11-24 10:00 Tue Europe/Paris (3 entries)"
        ),
        "{s}"
    );
    assert!(
        s.contains(&format!(
            "decided by entry 1 ({path}:16): host = [\"*.blocked.test\", \"blocked.test\"] [deny]"
        )),
        "{s}"
    );
    assert!(s.contains("verdict: deny 403: Blocked site"), "{s}");
    // host:port is a CONNECT, decided by the same entries.
    let (s, _) = run(&["blocked.test:443"]);
    assert!(
        s.contains("request: CONNECT blocked.test:443") && s.contains("verdict: deny 403"),
        "{s}"
    );
    // Time windows: Tuesday 10:00 local is inside, 19:00 and Saturday are not.
    let (s, _) = run(&["http://www.video.test/", "--at", "2026-11-24T10:00"]);
    assert!(
        s.contains("decided by entry 2 (") && s.contains("portico.toml:21): host = [\"*.video.test\"]"),
        "{s}"
    );
    for at in ["2026-11-24T19:00", "2026-11-28T10:00"] {
        let (s, _) = run(&["http://www.video.test/", "--at", at]);
        assert!(
            s.contains("no entry matched: access.acl_default = \"allow\"\nverdict: allow"),
            "{at}: {s}"
        );
    }
    // A group entry reached without a user asks for one; with one it decides.
    let (s, _) = run(&["http://a.test/", "--client", "10.1.1.1"]);
    assert!(s.contains("[needs an authenticated user]"), "{s}");
    assert!(
        s.contains("verdict: authentication required: 407 with Proxy-Authenticate: Basic realm=\"Office\""),
        "{s}"
    );
    let (s, _) = run(&["http://a.test/", "--client", "10.1.1.1", "--mode", "reverse"]);
    assert!(s.contains("401 with WWW-Authenticate"), "{s}");
    let (s, _) = run(&[
        "http://a.test/",
        "--client",
        "10.1.1.1",
        "--user",
        "ann",
        "--group",
        "admins",
    ]);
    assert!(
        s.contains("user ann (groups: admins)") && s.contains("[allow]\nverdict: allow"),
        "{s}"
    );
    // A bad --at is an error, not a guess.
    let (out, _) = run_with_config(text, &["acl", "test"], &["http://a.test/", "--at", "24/11/2026"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--at \"24/11/2026\""));
}

/// A path whose two readings are allowed by entries with different
/// `allow_destinations` gets neither exception; `portico acl test` says
/// why instead of blaming the default.
#[test]
fn acl_test_explains_two_readings_that_grant_different_destination_exceptions() {
    let text = r#"[[listener]]
address = "127.0.0.1:8080"

[access]
acl_default = "deny"

[proxy]
deny_destinations = ["10.0.0.0/8"]

[[acl]]
action = "allow"
path = "/a/"
allow_destinations = "10.1.0.0/16"

[[acl]]
action = "allow"
path = "/b/"
allow_destinations = "10.2.0.0/16"
"#;
    let (out, _) = run_with_config(text, &["acl", "test"], &["http://x.test/a/..;/b/x"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        s.contains("allowed by entry 0 (") && s.contains("and by entry 1 (") && s.contains("neither applies"),
        "{s}"
    );
    assert!(!s.contains("acl_default"), "{s}");
    assert!(s.contains("verdict: allow"), "{s}");
}
