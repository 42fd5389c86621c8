//! `[error_pages] directory`: an administrator's pages answer the errors
//! Portico makes itself, through the real binary: a refusal, a failed
//! fetch, a malformed request; a reload reads them again, and a bad page
//! is named by `portico check` and refused by a reload.

mod common;

use common::*;
use std::path::Path;

/// A directory of pages: `files` as (name, text).
fn pages(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("pages dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write page");
    }
    dir
}

/// A forward listener on `addr` with the pages of `pages`.
fn config(addr: &str, pages: &Path) -> String {
    format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [error_pages]\ndirectory = \"{}\"\n",
        addr,
        pages.display()
    )
}

/// A request for a port outside `proxy.http_ports`: refused 403.
const TO_PORT_25: &str = "GET http://127.0.0.1:25/ HTTP/1.1\r\nHost: 127.0.0.1:25\r\nConnection: close\r\n\r\n";

async fn ask(p: &Portico, request: &str) -> ParsedResponse {
    parse_response(&raw_request(p.addr(), request.as_bytes()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrators_pages_answer_the_errors_portico_makes() {
    let dir = pages(&[
        (
            "403.html",
            "<h1>Blocked by Example Corp ({status})</h1><p>{message}</p><p>Call 555-0100.</p>",
        ),
        (
            "default.html",
            "<style>body { font: 12px sans-serif }</style><h1>{status} {reason}</h1><p>{message}</p>",
        ),
        ("README", "the pages of this site"),
    ]);
    let addr = free_addr();
    let p = Portico::start(&config(&addr, dir.path())).await;

    // A refusal: a port outside proxy.http_ports.
    let r = ask(&p, TO_PORT_25).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body_str(),
        "<h1>Blocked by Example Corp (403)</h1><p>requests to this port are not allowed</p><p>Call 555-0100.</p>"
    );
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("cache-control"), Some("no-store"));

    // A failed fetch: nothing listens on the origin's port.
    let dead = dead_addr();
    let r = ask(
        &p,
        &format!("GET http://{dead}/x HTTP/1.1\r\nHost: {dead}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert_eq!(r.status, 502);
    let body = r.body_str();
    assert!(
        body.starts_with("<style>body { font: 12px sans-serif }</style><h1>502 Bad Gateway</h1><p>"),
        "{body}"
    );
    assert!(body.contains(&dead.to_string()), "says which origin: {body}");

    // A request the HTTP layer rejects before any handler sees it.
    let r = ask(
        &p,
        "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(
        r.body_str()
            .starts_with("<style>body { font: 12px sans-serif }</style><h1>400 Bad Request</h1>"),
        "{}",
        r.body_str()
    );

    // A reload reads the pages again.
    std::fs::write(dir.path().join("403.html"), "<p>403, newly worded: {message}</p>").expect("rewrite");
    p.reload(&config(&addr, dir.path())).await;
    let r = ask(&p, TO_PORT_25).await;
    assert_eq!(
        r.body_str(),
        "<p>403, newly worded: requests to this port are not allowed</p>"
    );

    // A page a reload cannot use is named, and the pages in force stay.
    std::fs::write(dir.path().join("50x.html"), "x").expect("bad name");
    let said = p.reload_refused(&config(&addr, dir.path())).await;
    assert!(
        said.contains("50x.html") && said.contains("error_pages.directory"),
        "{said}"
    );
    let r = ask(&p, TO_PORT_25).await;
    assert_eq!(
        r.body_str(),
        "<p>403, newly worded: requests to this port are not allowed</p>"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pages_the_built_in_page_is_sent() {
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n",
        free_addr()
    ))
    .await;
    let r = ask(&p, TO_PORT_25).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body_str(),
        "<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>\n<body><h1>403 Forbidden</h1>\n\
         <p>requests to this port are not allowed</p>\n<hr><address>portico</address></body></html>\n"
    );
}

#[test]
fn check_names_the_key_line_and_file_of_a_page_it_cannot_use() {
    for (files, says) in [
        (
            &[("404.htm.html", "x")][..],
            "404.htm.html: an error page is named after its status",
        ),
        (&[("500.html", "\u{fffd}")][..], ""),
        (&[("notes.txt", "x")][..], "holds no error page"),
    ] {
        let dir = pages(files);
        let out = Portico::check(&config("127.0.0.1:1", dir.path()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if says.is_empty() {
            assert!(out.status.success(), "{stderr}");
            continue;
        }
        assert!(!out.status.success(), "{files:?} passed");
        assert!(
            stderr.contains(":9: key `error_pages.directory`") && stderr.contains(says),
            "{files:?}: {stderr}"
        );
    }
    // Bytes that are not UTF-8.
    let dir = pages(&[]);
    std::fs::write(dir.path().join("500.html"), b"caf\xe9").expect("latin-1 page");
    let out = Portico::check(&config("127.0.0.1:1", dir.path()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("500.html: not UTF-8 text"),
        "{stderr}"
    );
    // A directory that is not there.
    let out = Portico::check(&config("127.0.0.1:1", Path::new("/nonexistent/portico-pages")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("cannot read /nonexistent/portico-pages"),
        "{stderr}"
    );
}

/// As root with `server.user`: a page only root may read is named by
/// `portico check`, as a reload (read as that user) would fail on it.
#[test]
fn check_warns_of_a_page_the_server_user_cannot_read() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root, so no server.user to switch to");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = pages(&[("403.html", "readable"), ("502.html", "root's alone")]);
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    mode(dir.path(), 0o755);
    mode(&dir.path().join("403.html"), 0o644);
    mode(&dir.path().join("502.html"), 0o600);
    let config = format!("{}\n[server]\nuser = \"nobody\"\n", config("127.0.0.1:1", dir.path()));
    let out = Portico::check(&config);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let page = dir.path().join("502.html");
    assert!(
        said.contains(&format!(
            "server.user \"nobody\" cannot read {} (an error page of error_pages.directory: ",
            page.display()
        )),
        "{said}"
    );
    assert!(!said.contains("403.html"), "{said}");
}
