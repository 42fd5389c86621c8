//! Parent proxies reached over TLS (`servers = ["https://host:port"]` in a
//! `parent = true` group, Squid's `cache_peer ... tls`) through the real
//! binary: the parent is a second Portico with a TLS forward listener
//! (certificate generated here with rcgen), the child trusts it through
//! `[origin] ca_file`. Absolute-form requests, CONNECT tunnels and
//! `https://` URLs go inside the TLS connection to the parent; a parent
//! whose certificate is not trusted gets nothing and the client a 502
//! saying why; the group's `credentials_file` satisfies a parent's `[auth]`.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::*;

/// A self-signed certificate for `localhost` (subject CN `stem`, so that
/// two of them never pass for each other's issuer) written as
/// `<stem>.pem` and `<stem>.key`; the paths.
fn cert(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key pair");
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, stem);
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let c = params.self_signed(&key).expect("self-signed certificate");
    let (pem, k) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")));
    std::fs::write(&pem, c.pem()).expect("write certificate");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    (pem, k)
}

/// The parent: a Portico with a TLS forward listener on `port`, its own
/// `Via` name, a Squid access log, `extra` appended.
async fn parent(port: u16, pem: &Path, key: &Path, connect_port: u16, extra: &str) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n\
         [[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n\n\
         [cache]\nenabled = false\n\n[proxy]\nvia = \"parent\"\nconnect_ports = [{connect_port}]\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\nformat = \"squid\"\n\n{extra}",
        pem.display(),
        key.display()
    ))
    .await
}

/// The child: a plain forward listener at `addr` routing everything to the
/// TLS parent at `localhost:port`, trusting `ca_file`.
async fn child(addr: &str, port: u16, ca_file: &Path, connect_port: u16, group_extra: &str) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\nenabled = false\n\n[proxy]\nconnect_ports = [{connect_port}]\n\n\
         [origin]\nca_file = \"{}\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\nformat = \"squid\"\n\n\
         [[upstream]]\nname = \"tlsparents\"\nparent = true\nservers = [\"https://localhost:{port}\"]\n{group_extra}\n\
         [[rule]]\nhost = \"*\"\nupstream = \"tlsparents\"\n",
        ca_file.display()
    ))
    .await
}

async fn send(addr: SocketAddr, request: &str) -> ParsedResponse {
    parse_response(&raw_request(addr, request.as_bytes()).await)
}

/// The Squid log's hierarchy field.
fn hierarchy(line: &str) -> &str {
    line.split_whitespace().nth(8).unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_urls_connect_and_https_urls_go_inside_tls_to_the_parent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (pem, key) = cert(dir.path(), "parent");
    let origin = Origin::start(|req| async move { Response::ok(format!("plain {}", req.uri.path())) }).await;
    let secure = Origin::start_tls(|req| async move { Response::ok(format!("secure {}", req.uri.path())) }).await;
    let sport = secure.addr().port();
    // One trust file: the parent's certificate and the https origin's CA.
    let trust = dir.path().join("trust.pem");
    let mut both = std::fs::read(&pem).expect("read");
    both.extend(std::fs::read(secure.ca_pem_path()).expect("read origin CA"));
    std::fs::write(&trust, both).expect("write trust");

    let pport = free_port();
    let parent = parent(pport, &pem, &key, sport, "").await;
    let addr = free_addr();
    let child = child(&addr, pport, &trust, sport, "").await;
    let caddr: SocketAddr = addr.parse().unwrap();

    // http:// in absolute form, twice (the second on a pooled connection).
    for i in 0..2 {
        let r = send(caddr, &format!("GET {}/p{i} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url())).await;
        assert_eq!(
            r.status,
            200,
            "{}\n{}\n{}",
            r.body_str(),
            child.stderr(),
            parent.stderr()
        );
        assert_eq!(r.body_str(), format!("plain /p{i}"));
    }
    let plines = file_lines(&parent.dir().join("access.log"), 2).await;
    assert_eq!(plines.len(), 2, "{plines:?}");
    assert!(plines[0].contains(&format!("{}/p0", origin.url())), "{}", plines[0]);
    let clines = file_lines(&child.dir().join("access.log"), 2).await;
    assert_eq!(hierarchy(&clines[0]), "FIRST_PARENT/localhost", "{}", clines[0]);

    // A client's CONNECT: tunnelled through the parent, TLS with the origin inside.
    let url = format!("https://127.0.0.1:{sport}/c");
    let ca = secure.ca_pem_path().display().to_string();
    let out = common::curl(&["--proxy", &format!("http://{addr}"), "--cacert", &ca, &url]).await;
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        child.stderr(),
        parent.stderr()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "secure /c");

    // An https:// URL in absolute form: Portico's own CONNECT through the
    // parent, TLS to the origin inside TLS to the parent.
    let r = send(
        caddr,
        &format!("GET https://127.0.0.1:{sport}/d HTTP/1.1\r\nHost: x\r\n\r\n"),
    )
    .await;
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), child.stderr());
    assert_eq!(r.body_str(), "secure /d");
    // The parent logs a tunnel when it closes (the child pools the one for
    // /d): the client's CONNECT is there.
    let plines = file_lines(&parent.dir().join("access.log"), 3).await;
    assert!(
        plines[2].contains(" CONNECT ") && plines[2].contains(&format!("127.0.0.1:{sport}")),
        "{plines:?}"
    );
    let clines = file_lines(&child.dir().join("access.log"), 4).await;
    assert_eq!(clines.len(), 4, "{clines:?}");
    for line in &clines {
        assert_eq!(hierarchy(line), "FIRST_PARENT/localhost", "{line}");
    }
    assert_eq!(secure.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_with_an_untrusted_certificate_gets_nothing_and_the_client_502() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (pem, key) = cert(dir.path(), "parent");
    let (other, _) = cert(dir.path(), "other");
    let origin = Origin::start(|_| async { Response::ok("origin") }).await;
    let pport = free_port();
    let parent = parent(pport, &pem, &key, 443, "").await;
    let addr = free_addr();
    let child = child(&addr, pport, &other, 443, "").await;
    let caddr: SocketAddr = addr.parse().unwrap();
    let r = send(caddr, &format!("GET {}/x HTTP/1.1\r\nHost: x\r\n\r\n", origin.url())).await;
    assert_eq!(r.status, 502, "{}", r.body_str());
    assert!(
        r.body_str().contains(&format!(
            "TLS handshake failed with localhost:{pport}: parent proxy: the parent&#39;s certificate is not signed by a trusted authority"
        )),
        "{}",
        r.body_str()
    );
    let clines = file_lines(&child.dir().join("access.log"), 1).await;
    assert!(
        clines[0].contains(" 502 ") || clines[0].contains("/502 "),
        "{}",
        clines[0]
    );
    assert_eq!(hierarchy(&clines[0]), "FIRST_PARENT/localhost", "{}", clines[0]);
    assert!(
        child.stderr().contains("marking server down"),
        "the parent is marked down:\n{}",
        child.stderr()
    );
    assert_eq!(origin.count(), 0, "the request went nowhere");
    let plog = std::fs::read_to_string(parent.dir().join("access.log")).unwrap_or_default();
    assert!(plog.is_empty(), "the parent got no request: {plog}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_credentials_satisfy_the_parents_auth_inside_tls() {
    let ok = std::process::Command::new("htpasswd").arg("-h").output().is_ok();
    if !ok {
        eprintln!("SKIPPED: Apache's htpasswd (Debian apache2-utils) is not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (pem, key) = cert(dir.path(), "parent");
    let users = dir.path().join("users.htpasswd");
    let out = std::process::Command::new("htpasswd")
        .args(["-cbB", users.to_str().expect("utf-8"), "alice", "wonderland"])
        .output()
        .expect("htpasswd");
    assert!(out.status.success());
    let creds = dir.path().join("parent.credentials");
    std::fs::write(&creds, "alice:wonderland\n").expect("write credentials");
    let origin = Origin::start(|_| async { Response::ok("behind auth") }).await;
    let pport = free_port();
    let auth = format!("[auth]\nhtpasswd = \"{}\"\nrequired = true\n", users.display());
    let parent = parent(pport, &pem, &key, 443, &auth).await;

    // Without credentials: the parent's 407 comes back.
    let addr = free_addr();
    let anonymous = child(&addr, pport, &pem, 443, "").await;
    let r = send(
        addr.parse().unwrap(),
        &format!("GET {}/x HTTP/1.1\r\nHost: x\r\n\r\n", origin.url()),
    )
    .await;
    assert_eq!(r.status, 407, "{}\n{}", r.body_str(), anonymous.stderr());

    let addr = free_addr();
    let group = format!("credentials_file = \"{}\"\n", creds.display());
    let child = child(&addr, pport, &pem, 443, &group).await;
    let r = send(
        addr.parse().unwrap(),
        &format!("GET {}/y HTTP/1.1\r\nHost: x\r\n\r\n", origin.url()),
    )
    .await;
    assert_eq!(r.status, 200, "{}\n{}", r.body_str(), child.stderr());
    assert_eq!(r.body_str(), "behind auth");
    // The parent's log: the user it authenticated.
    let plines = file_lines(&parent.dir().join("access.log"), 2).await;
    assert_eq!(plines.len(), 2, "{plines:?}");
    assert_eq!(plines[1].split_whitespace().nth(7), Some("alice"), "{}", plines[1]);
}
