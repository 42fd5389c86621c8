//! TLS listeners (`[[listener.certificate]]`): an HTTPS forward proxy port
//! (absolute-form requests and CONNECT inside TLS), HTTPS reverse proxying
//! with the cache, the certificate chosen by SNI, TLS versions, the
//! start-up errors, the SIGHUP reload of certificates, hostile clients and
//! the handshake counters. Real clients (curl, openssl s_client, rustls);
//! certificates generated here with rcgen.

mod common;

use common::{
    Origin, Pem, Portico, Response, cert_table, close_request_then_junk, free_port, metric, page, parse_response,
    server_side,
};
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_forward_proxy_port_serves_http_urls_and_connect_inside_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "proxy", &["proxy.test", "127.0.0.1"]);
    let origin = Origin::start(|req| async move { Response::ok(format!("plain {}", req.uri.path())) }).await;
    let secure = Origin::start_tls(|req| async move { Response::ok(format!("secure {}", req.uri.path())) }).await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}\n[proxy]\nconnect_ports = [{}]\n",
        cert_table(&pem),
        secure.addr().port()
    );
    let p = Portico::start(&config).await;
    let proxy = format!("https://127.0.0.1:{port}");
    let ca = pem.cert.display().to_string();
    // Two requests on one TLS connection to the proxy: keep-alive works.
    let a = format!("{}/a", origin.url());
    let b = format!("{}/b", origin.url());
    let out = common::curl(&["--proxy", &proxy, "--proxy-cacert", &ca, &a, &b]).await;
    assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
    assert_eq!(stdout(&out), "plain /aplain /b");
    // CONNECT inside TLS, then TLS to the origin inside the tunnel.
    let url = format!("https://127.0.0.1:{}/c", secure.addr().port());
    let origin_ca = secure.ca_pem_path().display().to_string();
    let out = common::curl(&["--proxy", &proxy, "--proxy-cacert", &ca, "--cacert", &origin_ca, &url]).await;
    assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
    assert_eq!(stdout(&out), "secure /c");
    // curl refuses a proxy whose certificate it cannot verify: the proxy
    // really presented ours.
    let other = Pem::new(dir.path(), "other", &["other.test"]);
    let out = common::curl(&[
        "--proxy",
        &proxy,
        "--proxy-cacert",
        &other.cert.display().to_string(),
        &a,
    ])
    .await;
    assert!(
        !out.status.success(),
        "a proxy certificate no CA vouches for was accepted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_both_ways_cross_a_tls_listener_intact() {
    // Larger than rustls's buffers (64 KiB of plaintext queued for
    // sending, 16 KiB records), so the writes wait for the client and the
    // reads span many records.
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "proxy", &["proxy.test", "127.0.0.1"]);
    let origin = Origin::start(|req| async move {
        if req.method == http::Method::POST {
            let sum: u64 = req.body.iter().map(|b| u64::from(*b)).sum();
            Response::ok(format!("{} {sum}", req.body.len()))
        } else {
            Response::ok("").generated(8 << 20)
        }
    })
    .await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}\n[cache]\nenabled = false\n",
        cert_table(&pem)
    );
    let p = Portico::start(&config).await;
    let proxy = format!("https://127.0.0.1:{port}");
    let ca = pem.cert.display().to_string();
    let url = format!("{}/big", origin.url());
    let out = common::curl(&["--proxy", &proxy, "--proxy-cacert", &ca, &url]).await;
    assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
    assert_eq!(out.stdout.len(), 8 << 20);
    assert!(common::pattern_matches(0, &out.stdout), "the body was altered");
    // An upload, chunked and with a length.
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
    let file = dir.path().join("upload");
    std::fs::write(&file, &body).expect("write upload");
    let data = format!("@{}", file.display());
    for extra in [&[][..], &["-H", "Transfer-Encoding: chunked"][..]] {
        let mut args = vec!["--proxy", &proxy, "--proxy-cacert", &ca, "--data-binary", &data];
        args.extend_from_slice(extra);
        args.push(&url);
        let out = common::curl(&args).await;
        assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
        assert_eq!(stdout(&out), format!("{} {sum}", body.len()), "{extra:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_process_serves_tls_and_the_supervisor_checks_the_certificates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "proxy", &["proxy.test", "127.0.0.1"]);
    let origin = Origin::start(|_| async move { Response::ok("ok") }).await;
    let port = free_port();
    let config = format!(
        "[server]\nprocesses = 2\nworkers = 1\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}",
        cert_table(&pem)
    );
    let p = Portico::start(&config).await;
    let proxy = format!("https://127.0.0.1:{port}");
    let ca = pem.cert.display().to_string();
    let url = format!("{}/x", origin.url());
    // New connections each time, spread by the kernel over both workers.
    for _ in 0..8 {
        let out = common::curl(&["--proxy", &proxy, "--proxy-cacert", &ca, &url]).await;
        assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
        assert_eq!(stdout(&out), "ok");
    }
    // And at a reload: a key that is not there is refused by the supervisor
    // (once), which hands the workers nothing they or a worker restarted
    // later would refuse.
    let missing = dir.path().join("missing.key");
    p.rewrite_config(&config.replace(&pem.key.display().to_string(), &missing.display().to_string()));
    p.signal(libc::SIGHUP);
    let log = p.until_logged("reload failed", 1).await;
    assert_eq!(log.matches("reload failed").count(), 1, "{log}");
    assert!(log.contains(&missing.display().to_string()), "{log}");
    assert!(!log.contains("the workers reload it"), "{log}");
    drop(p);
    // The supervisor refuses a bad certificate before starting any worker.
    std::fs::write(&pem.key, "not a key").expect("spoil key");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, format!("{config}\n[log]\naccess = \"\"\n")).expect("write config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .current_dir(dir.path())
        .args(["run", "-c"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run portico");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("key file {}: no private key in it", pem.key.display())),
        "{err}"
    );
    assert!(!err.contains("worker 0"), "a worker was started: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_reverse_listener_serves_from_the_cache() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let origin =
        Origin::start(|_| async move { Response::ok("cached page").header("Cache-Control", "max-age=300") }).await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"reverse\"\n{}\n[[upstream]]\nname = \"web\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"web\"\n",
        cert_table(&pem),
        origin.addr()
    );
    let p = Portico::start(&config).await;
    let resolve = format!("www.test:{port}:127.0.0.1");
    let url = format!("https://www.test:{port}/page");
    let ca = pem.cert.display().to_string();
    let mut seen = Vec::new();
    for _ in 0..2 {
        // HTTP/1.1 over TLS (tests/http2.rs has the same over h2).
        let out = common::curl(&["--http1.1", "-i", "--cacert", &ca, "--resolve", &resolve, &url]).await;
        assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
        let r = parse_response(&out.stdout);
        assert_eq!((r.status, r.body_str().as_str()), (200, "cached page"));
        seen.push(r.header("X-Cache").unwrap_or("").to_string());
    }
    assert_eq!(seen, ["MISS", "HIT"]);
    assert_eq!(origin.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transparent_listener_serves_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let origin = Origin::start_tls(|req| async move { Response::ok(format!("origin {}", req.uri.path())) }).await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"transparent\"\n{}\n\
         [origin]\nca_file = \"{}\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\nformat = \"squid\"\n",
        cert_table(&pem),
        origin.ca_pem_path().display()
    );
    let p = Portico::start(&config).await;
    // Traffic as a redirected client sends it (without the NAT rule, which
    // tests/intercepted.rs has): the client thinks it speaks TLS to the
    // origin, whose name (Host) says where the request goes, over TLS too.
    let resolve = format!("www.test:{port}:127.0.0.1");
    let url = format!("https://www.test:{port}/t");
    let host = format!("Host: {}", origin.addr());
    let ca = pem.cert.display().to_string();
    let out = common::curl(&["--cacert", &ca, "--resolve", &resolve, "-H", &host, &url]).await;
    assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
    assert_eq!(stdout(&out), "origin /t");
    assert_eq!(origin.count(), 1);
    // Squid's format logs the URL it was: https.
    let url = format!(" GET https://{}/t ", origin.addr());
    let log = common::access_log_with(p.dir(), &url).await;
    assert!(log.contains(&url), "{log}");
}

/// The subject line `openssl s_client` prints for the certificate the
/// server at `port` presents (with SNI `name`, or none).
fn subject_for(port: u16, name: Option<&str>) -> String {
    let connect = format!("127.0.0.1:{port}");
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["s_client", "-connect", &connect]);
    match name {
        Some(n) => cmd.args(["-servername", n]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run openssl s_client (is openssl installed?)");
    let text = stdout(&out);
    text.lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_else(|| panic!("no subject from s_client:\n{text}\n{}", stderr(&out)))
        .replace(' ', "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_chooses_the_certificate_and_the_first_is_the_default() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = Pem::new(dir.path(), "a", &["a.test"]);
    let b = Pem::new(dir.path(), "b", &["b.test", "*.b.test"]);
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}{}",
        cert_table(&a),
        cert_table(&b)
    );
    let p = Portico::start(&config).await;
    let subjects = tokio::task::spawn_blocking(move || {
        [
            subject_for(port, Some("b.test")),
            subject_for(port, Some("www.b.test")),
            subject_for(port, Some("a.test")),
            subject_for(port, Some("unknown.test")),
            subject_for(port, None),
        ]
    })
    .await
    .expect("s_client");
    assert_eq!(
        subjects,
        [
            "subject=CN=b.test",
            "subject=CN=b.test",
            "subject=CN=a.test",
            "subject=CN=a.test",
            "subject=CN=a.test"
        ],
        "{}",
        p.stderr()
    );
    // curl, checking the name against a CA bundle of b only, accepts b.test.
    let resolve = format!("b.test:{port}:127.0.0.1");
    let url = format!("https://b.test:{port}/.perf");
    let out = common::curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--cacert",
        &b.cert.display().to_string(),
        "--resolve",
        &resolve,
        &url,
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A client that sends an IP address as its SNI name (RFC 6066 forbids
/// it; wrk and some libraries do it anyway) makes rustls warn once per
/// handshake. Any client could fill the error log with those lines and
/// make every handshake cost a write, so at the default levels rustls's
/// lines are kept to errors; at debug level they are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_sending_an_ip_address_as_sni_write_nothing_to_the_error_log_below_debug() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "a", &["a.test"]);
    for (level, logged) in [("warn", false), ("info", false), ("debug", true)] {
        let port = free_port();
        let config = format!(
            "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}\n[log]\nlevel = \"{level}\"\n",
            cert_table(&pem)
        );
        let p = Portico::start(&config).await;
        let subjects = tokio::task::spawn_blocking(move || {
            (0..5).map(|_| subject_for(port, Some("127.0.0.1"))).collect::<Vec<_>>()
        })
        .await
        .expect("s_client");
        assert!(subjects.iter().all(|s| s == "subject=CN=a.test"), "{subjects:?}");
        // Each handshake was complete (the subject was printed) before its
        // log line, if any, would have been written.
        let err = p.stderr();
        assert_eq!(
            err.matches("Illegal SNI").count(),
            if logged { 5 } else { 0 },
            "level {level}:\n{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_and_1_3_are_served_and_tls_min_version_refuses_1_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let (both, only13) = (free_port(), free_port());
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{both}\"\nmode = \"forward\"\n{t}\n[[listener]]\naddress = \"127.0.0.1:{only13}\"\nmode = \"forward\"\ntls_min_version = \"1.3\"\n{t}",
        t = cert_table(&pem)
    );
    let p = Portico::start(&config).await;
    let ca = pem.cert.display().to_string();
    let get = |port: u16, versions: &'static [&'static str]| {
        let ca = ca.clone();
        async move {
            let resolve = format!("www.test:{port}:127.0.0.1");
            let url = format!("https://www.test:{port}/.perf");
            let mut args = vec![
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
            ];
            args.extend_from_slice(versions);
            args.push(&url);
            common::curl(&args).await
        }
    };
    const V12: &[&str] = &["--tlsv1.2", "--tls-max", "1.2"];
    const V13: &[&str] = &["--tlsv1.3"];
    for (port, versions) in [(both, V12), (both, V13), (only13, V13)] {
        let out = get(port, versions).await;
        assert!(
            out.status.success(),
            "{port} {versions:?}: {}\n{}",
            stderr(&out),
            p.stderr()
        );
        assert_eq!(stdout(&out), "200");
    }
    let out = get(only13, V12).await;
    assert!(
        !out.status.success(),
        "a TLS 1.2 client was served by a tls_min_version = \"1.3\" listener"
    );
}

/// The cipher suite `openssl s_client` reports after a handshake with
/// `port` made with the extra `args`.
fn negotiated(port: u16, args: &[&str]) -> String {
    let connect = format!("127.0.0.1:{port}");
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &connect, "-servername", "www.test"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run openssl s_client (is openssl installed?)");
    let text = stdout(&out);
    // "New, TLSv1.3, Cipher is TLS_AES_128_GCM_SHA256"
    text.lines()
        .find_map(|l| l.split_once("Cipher is ").map(|(_, c)| c.trim().to_string()))
        .unwrap_or_else(|| panic!("no cipher from s_client {args:?}:\n{text}\n{}", stderr(&out)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_picks_aes_128_gcm_over_a_clients_aes_256_preference_and_serves_what_it_offers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}",
        cert_table(&pem)
    ))
    .await;
    // OpenSSL's own order (AES-256 first): Portico's first choice wins.
    let all13 = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256";
    assert_eq!(
        negotiated(port, &["-tls1_3", "-ciphersuites", all13]),
        "TLS_AES_128_GCM_SHA256"
    );
    let no128 = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
    assert_eq!(
        negotiated(port, &["-tls1_3", "-ciphersuites", no128]),
        "TLS_CHACHA20_POLY1305_SHA256"
    );
    // A client that offers only AES-256 is still served.
    assert_eq!(
        negotiated(port, &["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"]),
        "TLS_AES_256_GCM_SHA384"
    );
    let all12 = "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-GCM-SHA256";
    assert_eq!(
        negotiated(port, &["-tls1_2", "-cipher", all12]),
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "{}",
        p.stderr()
    );
}

/// `portico check` on a listener with `certificate` tables; its output.
fn check(tables: &str) -> std::process::Output {
    let port = free_port();
    Portico::check(&format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{tables}"
    ))
}

#[test]
fn check_and_run_name_the_file_and_listener_of_a_bad_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = Pem::new(dir.path(), "good", &["good.test"]);
    let other = Pem::new(dir.path(), "other", &["other.test"]);
    let expired = Pem::between(dir.path(), "expired", &["old.test"], 2000, 2001);
    let future = Pem::between(dir.path(), "future", &["new.test"], 2090, 2100);
    let missing = dir.path().join("missing.pem");
    let table = |c: &Path, k: &Path| {
        format!(
            "[[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
            c.display(),
            k.display()
        )
    };
    let cases = [
        (
            table(&missing, &good.key),
            format!("certificate file {}: cannot read it", missing.display()),
        ),
        (
            table(&good.cert, &missing),
            format!("key file {}: cannot read it", missing.display()),
        ),
        (
            table(&good.cert, &other.key),
            format!(
                "key file {} does not match the certificate in {}",
                other.key.display(),
                good.cert.display()
            ),
        ),
        (
            table(&expired.cert, &expired.key),
            format!(
                "certificate file {}: the certificate expired on 2001-01-01 00:00:00 UTC",
                expired.cert.display()
            ),
        ),
        (
            table(&future.cert, &future.key),
            format!(
                "certificate file {}: the certificate is not valid before 2090-01-01 00:00:00 UTC",
                future.cert.display()
            ),
        ),
        // The files swapped: no certificate in the one, no key in the other.
        (
            table(&good.key, &good.key),
            format!("certificate file {}: no certificate in it", good.key.display()),
        ),
        (
            table(&good.cert, &good.cert),
            format!("key file {}: no private key in it", good.cert.display()),
        ),
        // The second certificate is checked too, and named.
        (
            format!("{}{}", table(&good.cert, &good.key), table(&expired.cert, &expired.key)),
            "(listener.certificate[1]): certificate file".to_string(),
        ),
    ];
    for (tables, wanted) in &cases {
        let out = check(tables);
        let err = stderr(&out);
        assert!(!out.status.success(), "check accepted:\n{tables}");
        assert!(err.contains(wanted), "wanted {wanted:?} in:\n{err}");
        assert!(err.contains("listener 127.0.0.1:"), "no listener named in:\n{err}");
    }
    let out = check(&table(&good.cert, &good.key));
    assert!(out.status.success(), "{}", stderr(&out));

    // `portico run` stops at start-up with the same message.
    let port = free_port();
    let path = dir.path().join("portico.toml");
    let mut f = std::fs::File::create(&path).expect("config");
    write!(
        f,
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}\n[log]\naccess = \"\"\n",
        table(&expired.cert, &expired.key)
    )
    .expect("write config");
    drop(f);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .current_dir(dir.path())
        .args(["run", "-c"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run portico");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "listener 127.0.0.1:{port} (listener.certificate[0]): certificate file {}: the certificate expired",
            expired.cert.display()
        )),
        "{err}"
    );
}

/// A rustls client that trusts exactly `roots`.
fn client_config(roots: &[&Pem]) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store
            .add(rustls::pki_types::CertificateDer::from(r.der.clone()))
            .expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(store)
            .with_no_client_auth(),
    )
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection to `port` for `www.test`, and the certificate it got.
async fn tls_connect(port: u16, config: Arc<rustls::ClientConfig>) -> (Tls, Vec<u8>) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("www.test").expect("name");
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let der = tls.get_ref().1.peer_certificates().expect("certificate")[0].to_vec();
    (tls, der)
}

/// Sends one forward-proxy request for `url` on `tls` and reads its
/// response's status and body (the connection stays open).
async fn fetch(tls: &mut Tls, p: &Portico, url: &str) -> (u16, String) {
    let req = format!("GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    tls.write_all(req.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut chunk))
            .await
            .expect("response in time")
            .expect("read");
        assert!(
            n > 0,
            "connection closed: {}\n{}",
            String::from_utf8_lossy(&buf),
            p.stderr()
        );
        buf.extend_from_slice(&chunk[..n]);
        let r = common::parse_responses_lenient(&buf).0;
        if let Some(r) = r.first() {
            return (r.status, r.body_str());
        }
    }
}

/// A client session store that counts the TLS 1.3 tickets it is given.
#[derive(Debug)]
struct CountingStore {
    inner: rustls::client::ClientSessionMemoryCache,
    tickets: std::sync::atomic::AtomicUsize,
}

impl rustls::client::ClientSessionStore for CountingStore {
    fn set_kx_hint(&self, name: rustls::pki_types::ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &rustls::pki_types::ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: rustls::pki_types::ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(name, value)
    }
    fn tls12_session(
        &self,
        name: &rustls::pki_types::ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &rustls::pki_types::ServerName<'static>) {
        self.inner.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(
        &self,
        name: rustls::pki_types::ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.tickets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(
        &self,
        name: &rustls::pki_types::ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(name)
    }
}

/// TLS 1.3 session tickets leave with a connection's first response (one
/// write for both); a client that sends nothing after its handshake (a
/// browser's preconnected socket) still gets them, as they are sent
/// before the server waits for the client. Its next connection resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_nothing_after_its_handshake_still_gets_its_session_tickets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}",
        cert_table(&pem)
    );
    let p = Portico::start(&config).await;
    let store = Arc::new(CountingStore {
        inner: rustls::client::ClientSessionMemoryCache::new(8),
        tickets: Default::default(),
    });
    let mut client = (*client_config(&[&pem])).clone();
    client.resumption = rustls::client::Resumption::store(store.clone());
    let client = Arc::new(client);
    let (mut tls, _) = tls_connect(port, client.clone()).await;
    // Reading (which processes what arrives) without sending anything:
    // nothing but the tickets may come, and they must.
    let mut one = [0u8; 1];
    for _ in 0..50 {
        if store.tickets.load(std::sync::atomic::Ordering::SeqCst) >= 2 {
            break;
        }
        let read = tokio::time::timeout(Duration::from_millis(100), tls.read(&mut one)).await;
        assert!(
            read.is_err(),
            "the server sent data or closed: {read:?}\n{}",
            p.stderr()
        );
    }
    assert_eq!(store.tickets.load(std::sync::atomic::Ordering::SeqCst), 2);
    drop(tls);
    let (again, _) = tls_connect(port, client).await;
    assert_eq!(again.get_ref().1.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
}

/// A `Connection: close` response over TLS ends with close_notify, and
/// the connection is closed without lingering only when the client sent
/// nothing more: one that sends more while its 32 MiB response is on the
/// way (see `connection_close_ends_without_lingering_only_when_nothing_
/// more_was_sent` in tests/connections.rs for plain TCP) still gets all of
/// it, where a close on its unread bytes would reset the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_close_response_over_tls_ends_cleanly_and_lingers_only_for_a_client_that_sent_more() {
    const BIG: usize = 32 << 20;
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let origin = Origin::start(|_| async move { Response::ok("").generated(BIG as u64) }).await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"reverse\"\n{}\n[[upstream]]\nname = \"web\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"web\"\n\n[cache]\nenabled = false\n",
        cert_table(&pem),
        origin.addr()
    );
    let p = Portico::start(&config).await;
    for junk in [false, true] {
        let (mut tls, _) = tls_connect(port, client_config(&[&pem])).await;
        let request = b"GET /big HTTP/1.1\r\nHost: www.test\r\nConnection: close\r\n\r\n";
        // rustls reports a TCP close without close_notify as an error.
        let r = close_request_then_junk(&mut tls, request, junk)
            .await
            .unwrap_or_else(|e| panic!("junk {junk}: {e}\n{}", p.stderr()));
        assert_eq!(r.status, 200, "junk {junk}");
        assert_eq!(r.body.len(), BIG, "junk {junk}: the response was cut");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_certificates_keeping_connections_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let old = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{}\"\nmode = \"forward\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}",
        free_port(),
        cert_table(&old)
    );
    let p = Portico::start(&config).await;
    let origin = Origin::start(|_| async move { Response::ok("kept") }).await;
    let url = format!("{}/x", origin.url());
    // Renewal writes the new files over the old ones, as certbot's deploy
    // hook would copy them.
    let new_dir = tempfile::tempdir().expect("temp dir");
    let new = Pem::new(new_dir.path(), "www", &["www.test"]);
    let trust = client_config(&[&old, &new]);
    let (mut kept, der) = tls_connect(port, trust.clone()).await;
    assert_eq!(der, old.der);
    assert_eq!(fetch(&mut kept, &p, &url).await, (200, "kept".to_string()));

    std::fs::copy(&new.cert, &old.cert).expect("copy cert");
    std::fs::copy(&new.key, &old.key).expect("copy key");
    p.signal(libc::SIGHUP);
    wait_for(&p, "reloaded", 1).await;
    // The connection opened before the reload goes on.
    assert_eq!(fetch(&mut kept, &p, &url).await, (200, "kept".to_string()));
    // A new handshake gets the new certificate.
    let (mut fresh, der) = tls_connect(port, trust.clone()).await;
    assert_eq!(der, new.der, "a handshake after the reload got the old certificate");
    assert_eq!(fetch(&mut fresh, &p, &url).await, (200, "kept".to_string()));

    // A bad certificate (expired) is refused; the running one stays.
    let expired = Pem::between(new_dir.path(), "expired", &["www.test"], 2000, 2001);
    std::fs::copy(&expired.cert, &old.cert).expect("copy cert");
    std::fs::copy(&expired.key, &old.key).expect("copy key");
    p.signal(libc::SIGHUP);
    wait_for(&p, "failed, still running on the previous config", 1).await;
    let err = p.stderr();
    assert!(
        err.contains(&format!(
            "certificate file {}: the certificate expired",
            old.cert.display()
        )),
        "{err}"
    );
    let (mut after, der) = tls_connect(port, trust).await;
    assert_eq!(der, new.der);
    assert_eq!(fetch(&mut after, &p, &url).await, (200, "kept".to_string()));
    assert_eq!(fetch(&mut kept, &p, &url).await, (200, "kept".to_string()));
}

/// Waits until `text` appears `n` times in portico's stderr.
async fn wait_for(p: &Portico, text: &str, n: usize) {
    for _ in 0..200 {
        if p.stderr().matches(text).count() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no {text:?} in the error log:\n{}", p.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_or_a_truncated_client_hello_on_a_tls_port_is_closed_and_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    // The first listener is plain: the statistics are read there.
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{}\"\nmode = \"forward\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}\n[limits]\nheader_timeout = \"1s\"\n",
        free_port(),
        cert_table(&pem)
    );
    let p = Portico::start(&config).await;

    // Plain HTTP: no HTTP answer, the connection closed at once.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    c.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("send");
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got))
        .await
        .expect("closed in time")
        .ok();
    assert!(!got.starts_with(b"HTTP/"), "{}", String::from_utf8_lossy(&got));

    // The start of a ClientHello, then silence: closed by the timeout
    // (header_timeout, 1 s), not held for ever.
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03])
        .await
        .expect("send");
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut got))
        .await
        .expect("a half ClientHello held the connection past the timeout")
        .ok();
    assert!(started.elapsed() >= Duration::from_millis(500));

    // A good handshake, for the completed count.
    let origin = Origin::start(|_| async move { Response::ok("kept") }).await;
    let url = format!("{}/x", origin.url());
    let (mut tls, _) = tls_connect(port, client_config(&[&pem])).await;
    assert_eq!(fetch(&mut tls, &p, &url).await, (200, "kept".to_string()));

    assert_eq!(
        metric(&p, "portico_tls_handshake_failures_total{reason=\"protocol\"}").await,
        1
    );
    assert_eq!(
        metric(&p, "portico_tls_handshake_failures_total{reason=\"timeout\"}").await,
        1
    );
    assert_eq!(metric(&p, "portico_tls_handshakes_total").await, 1);
    let xml = page(&p, "/stats-xml").await;
    assert!(xml.contains("countHandshakes=\"1\""), "{xml}");
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains("SSLInfo:"), "{perf}");
}

/// A TLS forward listener serving one request at a time (`max_requests =
/// 1`, a queue of 4), its place taken by a GET whose origin holds it until
/// the test lets it go. `leave` gets a second client's connection, the
/// origin URL and the listener's port; it queues a request and leaves.
/// Then the queue must be empty with that request counted as abandoned, the
/// first answered, and the origin asked once.
async fn queued_tls_client_leaves<F, Fut>(leave: F)
where
    F: FnOnce(Arc<Portico>, Tls, String, u16) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let origin = Origin::start(move |_| {
        let g = g.clone();
        async move {
            let _ = g.acquire().await.map(|p| p.forget());
            Response::ok("slow")
        }
    })
    .await;
    let port = free_port();
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{}\"\nmode = \"forward\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n{}\n[server]\nmax_requests = 1\nqueue_size = 4\n\n[cache]\nenabled = false\n",
        free_port(),
        cert_table(&pem)
    );
    let p = Arc::new(Portico::start(&config).await);
    let url = format!("{}/x", origin.url());
    let trust = client_config(&[&pem]);
    // The one request in service waits on the origin.
    let (mut first, _) = tls_connect(port, trust.clone()).await;
    let req = format!("GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    first.write_all(req.as_bytes()).await.expect("send");
    wait_metric(&p, "portico_upstream_requests_total", 1).await;
    let (leaving, _) = tls_connect(port, trust).await;
    leave(p.clone(), leaving, url, port).await;
    wait_metric(&p, "portico_connection_queue_abandoned_total", 1).await;
    assert_eq!(metric(&p, "portico_connection_queue_length").await, 0);
    gate.add_permits(1);
    let mut got = vec![0u8; 4096];
    let n = first.read(&mut got).await.expect("response");
    assert!(
        got[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got[..n])
    );
    assert_eq!(origin.count(), 1, "the abandoned request reached the origin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_tls_client_that_leaves_with_close_notify_is_dropped_from_the_queue() {
    queued_tls_client_leaves(|p, mut leaving, url, _| async move {
        // It queues, then leaves: close_notify, then its TCP close. The
        // alert's bytes are waiting on the socket, which a plain peek takes
        // for a client still there: only reading the records tells.
        let req = format!("GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        leaving.write_all(req.as_bytes()).await.expect("send");
        wait_metric(&p, "portico_connection_queue_length", 1).await;
        leaving.shutdown().await.expect("close_notify");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_tls_client_that_leaves_behind_its_unread_body_is_dropped_from_the_queue() {
    queued_tls_client_leaves(|p, mut leaving, url, port| async move {
        // Nothing of a queued request's body is read: its records wait on
        // the socket in front of the close_notify and the FIN, and are
        // still unread when the client is seen gone.
        let body = vec![b'x'; 64 << 10];
        let head = format!(
            "POST {url} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        leaving
            .write_all(&[head.as_bytes(), &body].concat())
            .await
            .expect("send");
        wait_metric(&p, "portico_connection_queue_length", 1).await;
        let me = leaving.get_ref().0.local_addr().expect("local_addr");
        let unread = server_side(format!("127.0.0.1:{port}").parse().expect("addr"), me)
            .expect("the kernel knows the connection")
            .unread;
        assert!(unread > 0, "the body is not all in Portico's hands");
        leaving.shutdown().await.expect("close_notify");
    })
    .await;
}

/// Waits until the /metrics series `series` reaches `n`.
async fn wait_metric(p: &Portico, series: &str, n: u64) {
    for _ in 0..500 {
        if metric(p, series).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{series} never reached {n}:\n{}", page(p, "/metrics").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_gets_a_disk_hit_from_a_held_file_copied_not_sendfiled() {
    // `sendfile` cannot encrypt: over TLS a held disk file is read (from
    // the page cache, else on the blocking pool) and sent through rustls.
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let origin = Origin::start(|_| async move {
        Response::ok("")
            .generated(200 << 10)
            .header("Cache-Control", "max-age=300")
    })
    .await;
    let (port, plain) = (free_port(), free_port());
    // The plain listener first: the statistics are read there.
    let config = format!(
        "[[listener]]\naddress = \"127.0.0.1:{plain}\"\nmode = \"reverse\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"reverse\"\n{}\n[[upstream]]\nname = \"web\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"web\"\n\n[cache]\nmax_memory_object = \"4KiB\"\n",
        cert_table(&pem),
        origin.addr()
    );
    let p = Portico::start(&config).await;
    let resolve = format!("www.test:{port}:127.0.0.1");
    let url = format!("https://www.test:{port}/big");
    let ca = pem.cert.display().to_string();
    let mut seen = Vec::new();
    // Body reads done (on the worker or the pool) before the third request.
    let reads = || async {
        metric(&p, "portico_cache_disk_reads_nowait_total").await
            + metric(&p, "portico_cache_disk_reads_blocked_total").await
    };
    let mut before_third = 0;
    for i in 0..3 {
        if i == 2 {
            before_third = reads().await;
        }
        let out = common::curl(&["--http1.1", "-i", "--cacert", &ca, "--resolve", &resolve, &url]).await;
        assert!(out.status.success(), "{}\n{}", stderr(&out), p.stderr());
        let r = parse_response(&out.stdout);
        assert_eq!((r.status, r.body.len()), (200, 200 << 10));
        assert!(common::pattern_matches(0, &r.body), "the bytes of the stored body");
        seen.push(r.header("X-Cache").unwrap_or("").to_string());
    }
    assert_eq!(seen, ["MISS", "HIT", "HIT"]);
    assert_eq!(origin.count(), 1);
    // The third request was answered from the held file, by reads (the
    // second one's, through the checksum, may be counted too: not those).
    assert_eq!(metric(&p, "portico_cache_disk_open_file_hits_total").await, 1);
    assert_eq!(reads().await - before_third, 4, "200 KiB in 64 KiB reads");
}
