//! `[[acl_list]]` filter lists through the real binary: domain lists (exact
//! and dot-prefixed entries, CONNECT targets), URL-prefix and regex lists,
//! a list as an allow-list, comments and blank lines, `portico check`
//! errors naming the list file and its line (hostile bytes included), a
//! missing file, a changed file picked up on SIGHUP, and `portico acl test`
//! naming the list line that matched.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// The `.test` names the tests use, all on loopback.
const HOSTS: [&str; 9] = [
    "example.test",
    "sub.example.test",
    "notexample.test",
    "exact.test",
    "www.exact.test",
    "www.upper.test",
    "ok.test",
    "www.ok.test",
    "ads1.test",
];

/// A forward listener, no cache, the names in [`HOSTS`] on 127.0.0.1,
/// CONNECT allowed to `ports`, then `extra`.
fn forward(ports: &[u16], extra: &str) -> String {
    let hosts: Vec<String> = HOSTS.iter().map(|h| format!("\"{h}\" = \"127.0.0.1\"")).collect();
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[cache]\nenabled = false\n\n[proxy]\nconnect_ports = [443, {}]\n\n[origin]\nhosts = {{ {} }}\n\n{extra}",
        free_addr(),
        ports.join(", "),
        hosts.join(", ")
    )
}

/// An origin answering `ok PATH`.
async fn origin() -> Origin {
    Origin::start(|req| async move { Response::ok(format!("ok {}", req.uri)) }).await
}

/// An origin that echoes what a tunnel sends.
async fn echo_origin() -> RawOrigin {
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

/// `GET http://HOST:PORT/PATH` through the proxy: the status and the deny
/// page's reason (empty when not denied).
async fn get(addr: SocketAddr, host: &str, port: u16, path: &str) -> (u16, String) {
    let req = format!("GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request(addr, req.as_bytes()).await);
    let body = r.body_str();
    let reason = if r.status == 403 {
        body.split("<p>")
            .nth(1)
            .and_then(|t| t.split("</p>").next())
            .unwrap_or("?")
            .to_string()
    } else {
        String::new()
    };
    (r.status, reason)
}

/// `CONNECT target`: the response head.
async fn connect(addr: SocketAddr, target: &str) -> String {
    connect_tunnel(addr, target, "").await.0
}

/// Writes `text` to `dir/name`; returns the path as config text.
fn write_list(dir: &Path, name: &str, text: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write list file");
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_list_blocks_listed_hosts_their_subdomains_and_connect_targets() {
    let o = origin().await;
    let echo = echo_origin().await;
    let (port, eport) = (o.addr().port(), echo.addr().port());
    let lists = tempfile::tempdir().expect("tempdir");
    let file = write_list(
        lists.path(),
        "blocked.txt",
        "# Blocked sites\n\n.example.test\r\nexact.test\n   WWW.Upper.Test.   \n  # indented comment\n",
    );
    let p = Portico::start(&forward(
        &[eport],
        &format!(
            "[[acl_list]]\nname = \"blocked\"\nfile = \"{file}\"\nkind = \"domains\"\n\n[[acl]]\naction = \"deny\"\nlist = \"blocked\"\nreason = \"listed\"\n"
        ),
    ))
    .await;
    // `.example.test`: the domain itself and every subdomain, not a name
    // that merely ends the same way.
    assert_eq!(
        get(p.addr(), "sub.example.test", port, "/").await,
        (403, "listed".into())
    );
    assert_eq!(get(p.addr(), "example.test", port, "/").await, (403, "listed".into()));
    assert_eq!(get(p.addr(), "notexample.test", port, "/").await, (200, String::new()));
    // `exact.test`: that host only.
    assert_eq!(get(p.addr(), "exact.test", port, "/").await, (403, "listed".into()));
    assert_eq!(get(p.addr(), "www.exact.test", port, "/").await, (200, String::new()));
    // Case, surrounding blanks and the trailing dot do not matter.
    assert_eq!(get(p.addr(), "www.upper.test", port, "/").await, (403, "listed".into()));
    // CONNECT targets are matched by their host.
    let head = connect(p.addr(), "sub.example.test:443").await;
    assert!(head.starts_with("HTTP/1.1 403 ") && head.contains("listed"), "{head}");
    let head = connect(p.addr(), &format!("notexample.test:{eport}")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The 200 can reach us before the echo origin's accept loop has counted
    // the connection (the kernel completes the handshake first): wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while echo.connections() < 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(echo.connections(), 1, "only the unlisted tunnel is made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_prefix_and_regex_lists_match_the_url_and_only_regexes_match_connect() {
    let o = origin().await;
    let echo = echo_origin().await;
    let (port, eport) = (o.addr().port(), echo.addr().port());
    let lists = tempfile::tempdir().expect("tempdir");
    let urls = write_list(
        lists.path(),
        "urls.txt",
        format!("# ad paths\nhttp://ok.test:{port}/ads/\nHTTP://OK.TEST:{port}/Private\nhttp://ok.test:{eport}/\n"),
    );
    let regex = write_list(
        lists.path(),
        "regex.txt",
        format!("# downloads\n\\.exe(\\?|$)\n\n^http://www\\.ok\\.test:{port}/track/\n^ads[0-9]+\\.test:443$\n"),
    );
    let p = Portico::start(&forward(
        &[eport],
        &format!(
            r#"[[acl_list]]
name = "ads"
file = "{urls}"
kind = "urls"

[[acl_list]]
name = "patterns"
file = "{regex}"
kind = "regex"

[[acl]]
action = "deny"
list = "ads"
reason = "url list"

[[acl]]
action = "deny"
list = ["patterns"]
reason = "regex list"
"#
        ),
    ))
    .await;
    let a = p.addr();
    assert_eq!(
        get(a, "ok.test", port, "/ads/banner.gif").await,
        (403, "url list".into())
    );
    assert_eq!(get(a, "OK.test", port, "/ads/x?y=1").await, (403, "url list".into()));
    assert_eq!(
        get(a, "ok.test", port, "/ads").await,
        (200, String::new()),
        "the prefix ends in /"
    );
    assert_eq!(get(a, "ok.test", port, "/Private/1").await, (403, "url list".into()));
    // Other spellings of a listed path (as the origin resolves them).
    for path in ["/%61ds/x", "//ads/x", "/./ads/x", "/x/../ads/x", "/%2E%2E/ads/"] {
        assert_eq!(get(a, "ok.test", port, path).await, (403, "url list".into()), "{path}");
    }
    assert_eq!(
        get(a, "www.ok.test", port, "/x//../track/./1").await,
        (403, "regex list".into()),
        "regexes see the path normalised"
    );

    assert_eq!(
        get(a, "ok.test", port, "/private/1").await,
        (200, String::new()),
        "paths are case-sensitive"
    );
    assert_eq!(
        get(a, "www.ok.test", port, "/ads/").await,
        (200, String::new()),
        "another host"
    );
    assert_eq!(
        get(a, "www.ok.test", port, "/x/setup.exe").await,
        (403, "regex list".into())
    );
    assert_eq!(
        get(a, "www.ok.test", port, "/x/setup.exe?v=2").await,
        (403, "regex list".into())
    );
    assert_eq!(
        get(a, "www.ok.test", port, "/x/setup.exe.txt").await,
        (200, String::new())
    );
    assert_eq!(
        get(a, "www.ok.test", port, "/track/1").await,
        (403, "regex list".into())
    );
    assert_eq!(get(a, "ok.test", port, "/track/1").await, (200, String::new()));
    // A URL list never matches a CONNECT (it has no URL), even to a
    // host:port the list names; a regex list sees `host:port`.
    let head = connect(a, &format!("ok.test:{eport}")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let head = connect(a, "ads1.test:443").await;
    assert!(
        head.starts_with("HTTP/1.1 403 ") && head.contains("regex list"),
        "{head}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_in_an_allow_entry_is_an_allow_list_of_sites() {
    let o = origin().await;
    let port = o.addr().port();
    let lists = tempfile::tempdir().expect("tempdir");
    let file = write_list(lists.path(), "sites.txt", ".ok.test\n");
    let p = Portico::start(&forward(
        &[],
        &format!(
            "[access]\nacl_default = \"deny\"\n\n[[acl_list]]\nname = \"sites\"\nfile = \"{file}\"\n\n[[acl]]\naction = \"allow\"\nlist = \"sites\"\n"
        ),
    ))
    .await;
    assert_eq!(get(p.addr(), "www.ok.test", port, "/").await.0, 200);
    assert_eq!(get(p.addr(), "ok.test", port, "/").await.0, 200);
    assert_eq!(get(p.addr(), "example.test", port, "/").await.0, 403);
    assert_eq!(o.requests().len(), 2, "the refused request never reached the origin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_a_changed_list_file() {
    let o = origin().await;
    let port = o.addr().port();
    let lists = tempfile::tempdir().expect("tempdir");
    let file = write_list(lists.path(), "blocked.txt", "example.test\n");
    let p = Portico::start(&forward(
        &[],
        &format!(
            "[[acl_list]]\nname = \"blocked\"\nfile = \"{file}\"\n\n[[acl]]\naction = \"deny\"\nlist = \"blocked\"\n"
        ),
    ))
    .await;
    assert_eq!(get(p.addr(), "www.ok.test", port, "/").await.0, 200);
    // Only the list file changes, not portico.toml.
    write_list(lists.path(), "blocked.txt", "example.test\n.ok.test\n");
    p.signal(libc::SIGHUP);
    let mut status = 0;
    for _ in 0..100 {
        status = get(p.addr(), "www.ok.test", port, "/").await.0;
        if status == 403 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 403, "the new pattern blocks after SIGHUP: {}", p.stderr());
    // A broken list fails the reload with the file and line; the running
    // list stays in force.
    write_list(lists.path(), "blocked.txt", "example.test\nnot a domain\n");
    p.signal(libc::SIGHUP);
    let want = format!("{file}:2: \"not a domain\"");
    let mut err = String::new();
    for _ in 0..100 {
        err = p.stderr();
        if err.contains(&want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(err.contains("reload failed") && err.contains(&want), "{err}");
    assert_eq!(get(p.addr(), "www.ok.test", port, "/").await.0, 403);
    assert_eq!(get(p.addr(), "notexample.test", port, "/").await.0, 200);
}

/// Writes `config` (with `{lists}` replaced by a temporary directory that
/// holds `files`) and runs `portico ARGS... -c it TAIL...`; returns the
/// output, the config's path and the directory's path.
fn run(config: &str, files: &[(&str, &[u8])], args: &[&str], tail: &[&str]) -> (Output, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_s = dir.path().display().to_string();
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).expect("write list");
    }
    let path = dir.path().join("portico.toml");
    std::fs::write(&path, config.replace("{lists}", &dir_s)).expect("write config");
    let out = Command::new(BIN)
        .args(args)
        .arg("-c")
        .arg(&path)
        .args(tail)
        .output()
        .expect("run portico");
    (out, path.display().to_string(), dir_s)
}

#[test]
fn check_names_the_list_file_and_line_of_a_bad_pattern() {
    let entry = |kind: &str| {
        format!(
            "[[acl]]\naction = \"deny\"\nlist = \"l\"\n\n[[acl_list]]\nname = \"l\"\nfile = \"{{lists}}/l.txt\"\nkind = \"{kind}\"\n"
        )
    };
    let huge = format!("ok.test\n{}\n", "a".repeat(100_000));
    let cases: Vec<(String, Vec<u8>, &str)> = vec![
        (
            entry("domains"),
            b"# c\nok.test\nbad domain.test\n".to_vec(),
            "l.txt:3: \"bad domain.test\": ' ' cannot be in a domain name",
        ),
        (
            entry("domains"),
            b"ok.test\n*.ads.test\n".to_vec(),
            "l.txt:2: \"*.ads.test\": write .ads.test",
        ),
        (
            entry("domains"),
            b"a..test\n".to_vec(),
            "l.txt:1: \"a..test\": a domain name with an empty label",
        ),
        (
            entry("domains"),
            b"ok.test\nex\0ample.test\n".to_vec(),
            "l.txt:2: line contains a NUL byte",
        ),
        (
            entry("domains"),
            b"ok.test\n\nbad\xff\xfe.test\n".to_vec(),
            "l.txt:3: line is not UTF-8 text (bad byte at column 4)",
        ),
        (
            entry("domains"),
            huge.into_bytes(),
            "l.txt:2: line is 100000 bytes long (at most 8192)",
        ),
        (
            entry("urls"),
            b"http://ok.test/\nexample.test/ads/\n".to_vec(),
            "l.txt:2: \"example.test/ads/\": not an absolute URL",
        ),
        (
            entry("urls"),
            b"ftp://ok.test/\n".to_vec(),
            "l.txt:1: \"ftp://ok.test/\": only http and https URLs",
        ),
        (
            entry("regex"),
            b"\\.exe$\n# c\n(unclosed\n".to_vec(),
            "l.txt:3: invalid regular expression",
        ),
    ];
    for (config, bytes, want) in &cases {
        let (out, path, dir) = run(config, &[("l.txt", bytes)], &["check"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{want}");
        // The config's line and key of the list, then the list file's line.
        assert!(
            err.contains(&format!("{path}:7: key `acl_list[0].file`: list \"l\": {dir}/{want}")),
            "want {want:?} in {err}"
        );
    }
    // A missing file is named with the list.
    let (out, path, dir) = run(&entry("domains"), &[], &["check"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{path}:7: key `acl_list[0].file`: list \"l\": cannot read {dir}/l.txt:"
        )),
        "{err}"
    );
    // Something endless is refused up front, not read until memory runs out.
    let endless = "[[acl_list]]\nname = \"l\"\nfile = \"/dev/zero\"\n";
    let (out, path, _) = run(endless, &[], &["check"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{path}:3: key `acl_list[0].file`: list \"l\": cannot read /dev/zero: not a regular file"
        )),
        "{err}"
    );
    // An entry naming no defined list, and two lists of one name.
    let (out, path, _) = run("[[acl]]\naction = \"deny\"\nlist = \"nope\"\n", &[], &["check"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{path}:3: key `acl[0].list`: no [[acl_list]] named \"nope\"")),
        "{err}"
    );
    let twice =
        "[[acl_list]]\nname = \"l\"\nfile = \"{lists}/l.txt\"\n[[acl_list]]\nname = \"l\"\nfile = \"{lists}/l.txt\"\n";
    let (out, path, _) = run(twice, &[("l.txt", b"ok.test\n")], &["check"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{path}:5: key `acl_list[1].name`: a second list named \"l\"")),
        "{err}"
    );
    // Comments, blank lines and CRLF line ends are fine.
    let (out, _, _) = run(
        &entry("domains"),
        &[("l.txt", b"# x\r\n\r\n  .ok.test  \r\n")],
        &["check"],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn acl_test_names_the_list_and_the_line_that_matched() {
    let config = r#"[[acl_list]]
name = "blocked"
file = "{lists}/blocked.txt"

[[acl_list]]
name = "tracking"
file = "{lists}/tracking.txt"
kind = "regex"

[[acl]]
action = "deny"
list = ["tracking", "blocked"]
reason = "Blocked site"
"#;
    let files: [(&str, &[u8]); 2] = [
        ("blocked.txt", b"# sites\nexact.test\n\n.example.test\n"),
        ("tracking.txt", b"^http://[^/]+/pixel\\.gif\n"),
    ];
    let (out, path, dir) = run(config, &files, &["acl", "test"], &["http://sub.example.test/a"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        s.contains(&format!(
            "decided by entry 0 ({path}:10): list = [\"tracking\", \"blocked\"] [deny]"
        )),
        "{s}"
    );
    assert!(
        s.contains(&format!(
            "matched by list \"blocked\" ({dir}/blocked.txt:4: .example.test)"
        )),
        "{s}"
    );
    let (out, _, dir) = run(config, &files, &["acl", "test"], &["exact.test:443"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("verdict: deny 403: Blocked site")
            && s.contains(&format!(
                "matched by list \"blocked\" ({dir}/blocked.txt:2: exact.test)"
            )),
        "{s}"
    );
    let (out, _, dir) = run(config, &files, &["acl", "test"], &["http://ok.test/pixel.gif"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains(&format!(
            "matched by list \"tracking\" ({dir}/tracking.txt:1: ^http://[^/]+/pixel\\.gif)"
        )),
        "{s}"
    );
    let (out, _, _) = run(config, &files, &["acl", "test"], &["http://www.exact.test/"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("no entry matched") && !s.contains("matched by"), "{s}");
}
