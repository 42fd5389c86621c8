//! `[[acl]]` response entries (`content_type`, `kind = "mime"` lists)
//! through the real binary and a real origin: a response of a denied
//! media type gets the entry's deny page before any body byte, counts as
//! `acl_denied`, is logged with its status and is never stored; forward
//! and reverse listeners, with and without the cache; a stored object of
//! a type a reload then denies, or stored for a client an entry does not
//! apply to, is refused from the cache to those it applies to; hostile
//! `Content-Type` fields; `portico check` errors and `portico acl test
//! --content-type`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// Body of the `video/mp4` object: must never reach a denied client.
const SECRET: &str = "SECRET-VIDEO-BYTES";

/// An origin whose path picks the `Content-Type` fields; all cacheable.
async fn typed_origin() -> Origin {
    Origin::start(|req| async move {
        let path = req.uri.path().rsplit('/').next().unwrap_or("").to_string();
        let r = Response::ok(format!("{SECRET} {path}")).header("Cache-Control", "max-age=600");
        match path.as_str() {
            "video" => r.header("Content-Type", "video/mp4"),
            "upper" => r.header("Content-Type", "  Video/MP4 ; codecs=\"avc1\""),
            "exe" => r.header("Content-Type", "application/x-msdownload"),
            "html" => r.header("Content-Type", "text/html; charset=utf-8"),
            "two" => r
                .header("Content-Type", "text/html")
                .header("Content-Type", "video/webm"),
            "comma" => r.header("Content-Type", "text/plain, video/ogg"),
            "empty" => r.header("Content-Type", ""),
            "junk" => r.header("Content-Type", "not a type"),
            "latin" => r.header("Content-Type", "vidéo/mp4"),
            "huge" => r.header("Content-Type", &format!("text/plain;{}", "a=b;".repeat(10_000))),
            _ => r, // no Content-Type at all
        }
    })
    .await
}

/// Sends `request` (Connection: close added) and parses the response.
async fn send(addr: SocketAddr, request: &str) -> ParsedResponse {
    let req = request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await)
}

/// GET of `path` through a forward (absolute form) or reverse listener.
async fn get(addr: SocketAddr, forward_to: Option<u16>, path: &str) -> ParsedResponse {
    match forward_to {
        Some(port) => {
            send(
                addr,
                &format!("GET http://ok.test:{port}{path} HTTP/1.1\r\nHost: ok.test:{port}\r\n\r\n"),
            )
            .await
        }
        None => send(addr, &format!("GET {path} HTTP/1.1\r\nHost: www.site.test\r\n\r\n")).await,
    }
}

/// Config: a forward listener (first) and a reverse one to `origin`, the
/// access log, the cache on or off, then `extra`.
fn config(fwd: &str, rev: &str, origin: u16, cache: bool, extra: &str) -> String {
    format!(
        r#"[[listener]]
address = "{fwd}"
mode = "forward"

[[listener]]
address = "{rev}"
mode = "reverse"

[log]
access = "{{dir}}/access.log"

[cache]
enabled = {cache}

[origin]
hosts = {{ "ok.test" = "127.0.0.1" }}

[[upstream]]
name = "o"
servers = ["127.0.0.1:{origin}"]

[[rule]]
mode = "reverse"
upstream = "o"

{extra}"#
    )
}

const DENY_TYPES: &str = r#"
[[acl]]
action = "deny"
content_type = ["video/*", "application/x-msdownload"]
reason = "This file type is blocked"
"#;

/// `acl_denied` from `/.stats.json`.
async fn acl_denied(p: &Portico) -> u64 {
    let r = send(
        p.addr(),
        &format!("GET /.stats.json HTTP/1.1\r\nHost: {}\r\n\r\n", p.addr()),
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&r.body_str()).expect("JSON");
    json["snapshot"]["requests"]["acl_denied"].as_u64().unwrap_or(u64::MAX)
}

fn assert_denied(r: &ParsedResponse, what: &str) {
    assert_eq!(r.status, 403, "{what}: {:?} {}", r.headers, r.body_str());
    assert!(
        r.body_str().contains("This file type is blocked"),
        "{what}: {}",
        r.body_str()
    );
    assert!(
        !r.body_str().contains(SECRET),
        "{what}: no byte of the body: {}",
        r.body_str()
    );
}

/// Every case, through one listener (`forward_to`: the origin's port for
/// the forward listener, None for the reverse one), with the cache `cache`.
async fn denies_by_type(cache: bool, reverse: bool) {
    let o = typed_origin().await;
    let port = o.addr().port();
    let (fwd, rev) = (free_addr(), free_addr());
    let p = Portico::start(&config(&fwd, &rev, port, cache, DENY_TYPES)).await;
    let (addr, to): (SocketAddr, Option<u16>) = if reverse {
        (rev.parse().expect("addr"), None)
    } else {
        (fwd.parse().expect("addr"), Some(port))
    };
    let what = |path: &str| format!("{path} (cache {cache}, reverse {reverse})");
    // Denied types, twice each: the second is not served from the cache
    // either, it goes to the origin again (nothing was stored).
    let denied = ["/video", "/upper", "/exe", "/two", "/comma"];
    for path in denied {
        for _ in 0..2 {
            assert_denied(&get(addr, to, path).await, &what(path));
        }
    }
    // Allowed: other types, parameters, no type or garbage (no `none`
    // pattern here), a huge field.
    let allowed = ["/html", "/plain", "/empty", "/junk", "/latin", "/huge"];
    for path in allowed {
        for round in 0..2 {
            let r = get(addr, to, path).await;
            assert_eq!(r.status, 200, "{}: {}", what(path), r.body_str());
            assert!(r.body_str().contains(SECRET), "{}", what(path));
            if cache && round == 1 {
                assert_eq!(r.header("X-Cache"), Some("HIT"), "{}: {:?}", what(path), r.headers);
            }
        }
    }
    let to_origin = |path: &str| o.requests().iter().filter(|r| r.uri.path().ends_with(path)).count();
    for path in denied {
        assert_eq!(to_origin(path), 2, "{}: fetched each time, never stored", what(path));
    }
    for path in allowed {
        assert_eq!(to_origin(path), if cache { 1 } else { 2 }, "{}", what(path));
    }
    assert_eq!(acl_denied(&p).await, 10, "{}", what("counter"));
    let target = if reverse {
        "/comma".to_string()
    } else {
        format!("http://ok.test:{port}/comma")
    };
    let log = access_log_with(p.dir(), &format!("\"GET {target} HTTP/1.1\" 403 ")).await;
    assert_eq!(log.matches("\" 403 ").count(), 10, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_responses_of_a_denied_type_are_refused_and_never_stored() {
    denies_by_type(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_responses_of_a_denied_type_are_refused_without_the_cache() {
    denies_by_type(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_responses_of_a_denied_type_are_refused_and_never_stored() {
    denies_by_type(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_responses_of_a_denied_type_are_refused_without_the_cache() {
    denies_by_type(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_object_of_a_type_a_reload_denies_is_refused_from_the_cache() {
    let o = typed_origin().await;
    let port = o.addr().port();
    let (fwd, rev) = (free_addr(), free_addr());
    let p = Portico::start(&config(&fwd, &rev, port, true, "")).await;
    let addr: SocketAddr = fwd.parse().expect("addr");
    assert_eq!(get(addr, Some(port), "/video").await.status, 200);
    assert_eq!(get(addr, Some(port), "/video").await.header("X-Cache"), Some("HIT"));
    p.rewrite_config(&config(&fwd, &rev, port, true, DENY_TYPES));
    p.signal(libc::SIGHUP);
    let mut r = get(addr, Some(port), "/video").await;
    for _ in 0..100 {
        if r.status == 403 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        r = get(addr, Some(port), "/video").await;
    }
    assert_denied(&r, "stored, then denied by a reload");
    // A conditional request for it is refused too, not answered 304.
    let r = send(
        addr,
        &format!("GET http://ok.test:{port}/video HTTP/1.1\r\nHost: ok.test:{port}\r\nRange: bytes=0-3\r\n\r\n"),
    )
    .await;
    assert_denied(&r, "a range of it");
    assert_eq!(o.count(), 1, "refused from the cache, never refetched");
    // The object is still stored: with the entry gone it is a hit again.
    p.rewrite_config(&config(&fwd, &rev, port, true, ""));
    p.signal(libc::SIGHUP);
    let mut r = get(addr, Some(port), "/video").await;
    for _ in 0..100 {
        if r.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        r = get(addr, Some(port), "/video").await;
    }
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("HIT")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mime_list_an_allow_exception_and_none_decide_in_order() {
    let o = typed_origin().await;
    let port = o.addr().port();
    let lists = tempfile::tempdir().expect("tempdir");
    let file = lists.path().join("types.txt");
    std::fs::write(&file, "# blocked types\nVIDEO/*\n\napplication/x-msdownload\n").expect("write list");
    let (fwd, rev) = (free_addr(), free_addr());
    let extra = format!(
        r#"
[[acl_list]]
name = "media"
file = "{}"
kind = "mime"

# The help desk may download programs.
[[acl]]
action = "allow"
client = "127.0.0.2"
content_type = "application/x-msdownload"

[[acl]]
action = "deny"
list = "media"
status = 451
reason = "Listed type"

[[acl]]
action = "deny"
content_type = "none"
reason = "No type"
"#,
        file.display()
    );
    let p = Portico::start(&config(&fwd, &rev, port, false, &extra)).await;
    let addr: SocketAddr = fwd.parse().expect("addr");
    let r = get(addr, Some(port), "/upper").await;
    assert_eq!(r.status, 451, "{}", r.body_str());
    assert!(r.body_str().contains("Listed type") && !r.body_str().contains(SECRET));
    assert_eq!(get(addr, Some(port), "/exe").await.status, 451);
    let req = format!("GET http://ok.test:{port}/exe HTTP/1.1\r\nHost: ok.test:{port}\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request_from("127.0.0.2".parse().expect("ip"), addr, req.as_bytes()).await);
    assert_eq!(r.status, 200, "the allow entry before the list: {}", r.body_str());
    for path in ["/plain", "/empty", "/junk", "/latin"] {
        let r = get(addr, Some(port), path).await;
        assert_eq!(r.status, 403, "{path}: {}", r.body_str());
        assert!(r.body_str().contains("No type"), "{path}");
    }
    assert_eq!(get(addr, Some(port), "/html").await.status, 200);
    // Portico's own pages are not responses of an origin: not filtered.
    assert_eq!(acl_denied(&p).await, 6);
}

/// Writes `config` (with `{dir}` replaced by a temporary directory holding
/// `files`) and runs `portico ARGS -c it TAIL`: stdout or stderr, the path.
fn run(config: &str, files: &[(&str, &str)], args: &[&str], tail: &[&str]) -> (bool, String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    let path = dir.path().join("portico.toml");
    std::fs::write(&path, config.replace("{dir}", &d)).expect("write config");
    let out = Command::new(BIN)
        .args(args)
        .arg("-c")
        .arg(&path)
        .args(tail)
        .output()
        .expect("run portico");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        path.display().to_string(),
    )
}

#[test]
fn check_names_file_line_and_key_of_a_bad_media_type() {
    let cases = [
        (
            "[[acl]]\naction = \"deny\"\ncontent_type = [\"video/*\", \"text/html; charset=utf-8\"]\n",
            3,
            "key `acl[0].content_type[1]`: \"text/html; charset=utf-8\": parameters are not matched",
        ),
        (
            "[[acl]]\naction = \"deny\"\n\ncontent_type = \"*/mp4\"\n",
            4,
            "key `acl[0].content_type[0]`: \"*/mp4\": a wildcard type needs a wildcard subtype",
        ),
        (
            "[[acl]]\naction = \"deny\"\ncontent_type = \"video\"\n",
            3,
            "key `acl[0].content_type[0]`: \"video\" is not a media type",
        ),
    ];
    for (config, line, want) in cases {
        let (ok, _, err, path) = run(config, &[], &["check"], &[]);
        assert!(!ok && err.contains(&format!("{path}:{line}: {want}")), "{err}");
    }
    // A bad line of a mime list: the list file and its line.
    let list = "[[acl_list]]\nname = \"m\"\nfile = \"{dir}/m.txt\"\nkind = \"mime\"\n[[acl]]\naction = \"deny\"\nlist = \"m\"\n";
    let (ok, _, err, path) = run(list, &[("m.txt", "# ok\nvideo/*\nvideo mp4\n")], &["check"], &[]);
    let dir = Path::new(&path).parent().expect("dir").display().to_string();
    assert!(
        !ok && err.contains(&format!("{dir}/m.txt:3: \"video mp4\" is not a media type")),
        "{err}"
    );
    // A response list and a request list in one entry's `list`.
    let mixed = "[[acl_list]]\nname = \"m\"\nfile = \"{dir}/m.txt\"\nkind = \"mime\"\n[[acl_list]]\nname = \"d\"\nfile = \"{dir}/d.txt\"\n[[acl]]\naction = \"deny\"\nlist = [\"m\", \"d\"]\n";
    let (ok, _, err, path) = run(
        mixed,
        &[("m.txt", "video/*\n"), ("d.txt", "ok.test\n")],
        &["check"],
        &[],
    );
    assert!(
        !ok && err.contains(&format!(
            "{path}:10: key `acl[0].list`: list \"m\" is a kind = \"mime\" list"
        )),
        "{err}"
    );
}

#[test]
fn acl_test_decides_the_response_with_content_type() {
    let config = "[[acl_list]]\nname = \"m\"\nfile = \"{dir}/m.txt\"\nkind = \"mime\"\n\n[[acl]]\naction = \"deny\"\nhost = \"ok.test\"\nlist = \"m\"\nreason = \"Blocked type\"\n";
    let files = [("m.txt", "# types\n\nvideo/*\n")];
    let (ok, out, err, path) = run(
        config,
        &files,
        &["acl", "test"],
        &["http://ok.test/a", "--content-type", "Video/MP4; codecs=x"],
    );
    assert!(ok, "{err}");
    let dir = Path::new(&path).parent().expect("dir").display().to_string();
    assert!(out.contains("verdict: allow"), "the request itself: {out}");
    assert!(
        out.contains(&format!(
            "response decided by entry 0 ({path}:6): host = [\"ok.test\"], list = [\"m\"] [deny]"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("matched by list \"m\" ({dir}/m.txt:3: video/*)")),
        "{out}"
    );
    assert!(out.contains("response verdict: deny 403: Blocked type"), "{out}");
    let (_, out, _, _) = run(
        config,
        &files,
        &["acl", "test"],
        &["http://ok.test/a", "--content-type", "text/html"],
    );
    assert!(
        out.contains("no response entry matched\nresponse verdict: allow"),
        "{out}"
    );
    let (_, out, _, _) = run(
        config,
        &files,
        &["acl", "test"],
        &["http://other.test/a", "--content-type", "video/mp4"],
    );
    assert!(out.contains("response verdict: allow"), "another host: {out}");
    let (_, out, _, _) = run(config, &files, &["acl", "test"], &["http://ok.test/a"]);
    assert!(out.contains("give --content-type"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_stored_for_one_client_is_refused_from_the_cache_to_a_client_denied_its_type() {
    let o = typed_origin().await;
    let port = o.addr().port();
    let (fwd, rev) = (free_addr(), free_addr());
    let extra = "[[acl]]\naction = \"deny\"\nclient = \"127.0.0.1\"\ncontent_type = \"video/*\"\nreason = \"This file type is blocked\"\n";
    let p = Portico::start(&config(&fwd, &rev, port, true, extra)).await;
    let addr: SocketAddr = fwd.parse().expect("addr");
    let req = format!("GET http://ok.test:{port}/video HTTP/1.1\r\nHost: ok.test:{port}\r\nConnection: close\r\n\r\n");
    let from = |ip: &'static str| {
        let req = req.clone();
        async move { parse_response(&raw_request_from(ip.parse().expect("ip"), addr, req.as_bytes()).await) }
    };
    let r = from("127.0.0.2").await;
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("MISS")), "{}", p.stderr());
    assert_eq!(from("127.0.0.2").await.header("X-Cache"), Some("HIT"));
    assert_denied(&from("127.0.0.1").await, "stored, but denied to this client");
    assert_eq!(from("127.0.0.2").await.header("X-Cache"), Some("HIT"));
    assert_eq!(
        o.count(),
        1,
        "the refusal did not touch the stored object or the origin"
    );
    assert_eq!(acl_denied(&p).await, 1);
}
