//! A real browser through Portico: headless Chromium configured with an
//! HTTPS proxy (`--proxy-server=https://...`, the TLS forward listener,
//! which Chromium speaks HTTP/2 to) loads a page and its script over plain
//! HTTP (requests for absolute URLs inside the TLS connection to the
//! proxy), and an HTTPS page (CONNECT inside that TLS connection, then TLS
//! to the origin inside the tunnel).
//!
//! And Chromium over HTTP/2 (ALPN `h2`) to a TLS reverse listener.
//!
//! Chromium trusts exactly the proxy's and the origin's certificates by
//! their public keys (`--ignore-certificate-errors-spki-list`), so a proxy
//! that presented anything else would fail the test. Its background traffic
//! (update checks, time queries) also goes to the proxy, which denies every
//! host but 127.0.0.1 before any name is resolved: nothing leaves loopback.

mod common;

use base64::Engine as _;
use common::{Origin, Portico, Response, free_port};
use std::path::Path;

/// base64(SHA-256(SubjectPublicKeyInfo)) of the first certificate in a PEM
/// file: the form `--ignore-certificate-errors-spki-list` takes.
fn spki_hash(pem_file: &Path) -> String {
    let pem = std::fs::read(pem_file).expect("read certificate");
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).expect("PEM certificate");
    let cert = pem.parse_x509().expect("X.509 certificate");
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.tbs_certificate.subject_pki.raw);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// Headless Chromium's DOM of `url`, fetched through the HTTPS proxy
/// `proxy` (an empty string: directly).
async fn load_through(proxy: String, spki: String, profile: std::path::PathBuf, url: String) -> String {
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-domain-reliability",
                "--virtual-time-budget=5000",
                // Chromium itself resolves nothing (the proxy does); belt and braces.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.*",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(if proxy.is_empty() {
                vec!["--no-proxy-server".to_string()]
            } else {
                // Chromium sends loopback URLs direct unless told otherwise.
                vec![
                    format!("--proxy-server={proxy}"),
                    "--proxy-bypass-list=<-loopback>".to_string(),
                ]
            })
            .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
            .arg("--dump-dom")
            .arg(&url)
            .output()
            .expect("chromium not found: install Debian package `chromium` (scripts/install-test-deps does)")
    })
    .await
    .expect("chromium task");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A self-signed certificate for proxy.test and 127.0.0.1, written as
/// PEM files in `dir`: (certificate, key).
fn certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key pair");
    let mut params = rcgen::CertificateParams::new(vec!["proxy.test".to_string(), "127.0.0.1".to_string()])
        .expect("certificate parameters");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, "proxy.test");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    let (cert_file, key_file) = (dir.join("proxy.pem"), dir.join("proxy.key"));
    std::fs::write(&cert_file, cert.pem()).expect("write certificate");
    std::fs::write(&key_file, key.serialize_pem()).expect("write key");
    (cert_file, key_file)
}

/// The page both origins serve: its script, fetched by the browser as a
/// second request, replaces the paragraph's text.
const PAGE: &str = "<html><body><p id=\"t\">static</p><script src=\"/s.js\"></script></body></html>";

async fn site(req: common::Request) -> Response {
    let via = req
        .headers
        .get("via")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_string();
    match req.uri.path() {
        "/" => Response::ok(PAGE).header("content-type", "text/html"),
        "/s.js" => Response::ok(format!(
            "document.getElementById('t').textContent = 'script ran, via ' + {via:?};"
        ))
        .header("content-type", "application/javascript"),
        _ => Response::ok("").header("content-type", "text/plain"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_loads_http_and_https_pages_through_an_https_proxy_port() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert_file, key_file) = certificate(dir.path());

    let plain = Origin::start(site).await;
    let secure = Origin::start_tls(site).await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n\
         [[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n\
         [proxy]\nconnect_ports = [{}]\n\
         [access]\nacl_default = \"deny\"\n\
         [[acl]]\naction = \"allow\"\nhost = \"127.0.0.1\"\n",
        cert_file.display(),
        key_file.display(),
        secure.addr().port()
    );
    let p = Portico::start(&config).await;
    let proxy = format!("https://127.0.0.1:{port}");
    let spki = format!("{},{}", spki_hash(&cert_file), spki_hash(secure.ca_pem_path()));

    // Plain HTTP: the page and its script are requests for absolute URLs
    // inside the TLS connection to the proxy; Chromium speaks HTTP/2 to an
    // HTTPS proxy that offers it by ALPN (Portico does by default), so
    // the origin sees Portico's Via with the client's version, 2.
    let dom = load_through(
        proxy.clone(),
        spki.clone(),
        p.dir().join("profile-1"),
        format!("{}/", plain.url()),
    )
    .await;
    assert!(
        dom.contains("script ran, via 2 portico"),
        "the page or its script did not come through the proxy:\n{dom}\n{}",
        p.stderr()
    );

    // HTTPS: CONNECT (an HTTP/2 CONNECT stream, RFC 9113 8.5) inside the
    // proxy's TLS, the origin's TLS inside the tunnel.
    let url = format!("https://127.0.0.1:{}/", secure.addr().port());
    let dom = load_through(proxy, spki, p.dir().join("profile-2"), url).await;
    assert!(
        dom.contains("script ran, via none"),
        "the HTTPS page or its script did not load through the tunnel:\n{dom}\n{}",
        p.stderr()
    );

    // The access log shows both kinds of traffic on the TLS listener (a
    // tunnel is logged when it closes, so give the writer a moment).
    let script = format!("\"GET {}/s.js HTTP/2.0\" 200", plain.url());
    let tunnel = format!("\"CONNECT 127.0.0.1:{} HTTP/2.0\" 200", secure.addr().port());
    let mut log = String::new();
    for _ in 0..50 {
        log = std::fs::read_to_string(p.dir().join("access.log")).unwrap_or_default();
        if log.contains(&script) && log.contains(&tunnel) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(log.contains(&script), "{log}");
    assert!(log.contains(&tunnel), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_loads_a_page_over_http2_from_a_tls_reverse_listener() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert_file, key_file) = certificate(dir.path());
    let origin = Origin::start(site).await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"reverse\"\n\
         [[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[upstream]]\nname = \"web\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"web\"\n",
        cert_file.display(),
        key_file.display(),
        origin.addr()
    );
    let p = Portico::start(&config).await;
    // The browser picks h2 by ALPN: the origin's request (HTTP/1.1, as
    // Portico always speaks upstream) carries `Via: 2 portico`.
    let url = format!("https://127.0.0.1:{port}/");
    let dom = load_through(String::new(), spki_hash(&cert_file), p.dir().join("profile"), url).await;
    assert!(
        dom.contains("script ran, via 2 portico"),
        "the page or its script did not come over HTTP/2:\n{dom}\n{}",
        p.stderr()
    );
    let script = "\"GET /s.js HTTP/2.0\" 200";
    let mut log = String::new();
    for _ in 0..50 {
        log = std::fs::read_to_string(p.dir().join("access.log")).unwrap_or_default();
        if log.contains(script) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(log.contains(script), "{log}");
}
