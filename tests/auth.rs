//! Basic authentication (`[auth]`) end to end: the real `portico` binary,
//! user files written by Apache's own `htpasswd` tool (Debian
//! `apache2-utils`, installed by scripts/install-test-deps), raw-socket and curl clients.

mod common;

use base64::Engine;
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// True if Apache's `htpasswd` is on PATH; tests skip (saying so) without it.
fn have_htpasswd() -> bool {
    let ok = std::process::Command::new("htpasswd")
        .arg("-nb")
        .args(["u", "p"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "SKIPPED: Apache's htpasswd (Debian apache2-utils) is not installed; scripts/install-test-deps installs it"
        );
    }
    ok
}

/// Runs `htpasswd <args>` and panics with its output if it fails.
fn htpasswd(args: &[&str]) {
    let out = std::process::Command::new("htpasswd")
        .args(args)
        .output()
        .expect("run htpasswd");
    assert!(
        out.status.success(),
        "htpasswd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temporary directory with an htpasswd file made by the real tool:
/// `users` are (htpasswd format flag, user, password).
fn user_file(users: &[(&str, &str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("users.htpasswd");
    for (i, (flag, user, pw)) in users.iter().enumerate() {
        let p = path.to_str().expect("utf-8 path");
        // -c creates the file on the first user; -b takes the password
        // from the command line.
        let mut args = vec![if i == 0 { "-cb" } else { "-b" }];
        if !flag.is_empty() {
            args.push(flag);
        }
        args.extend([p, user, pw]);
        htpasswd(&args);
    }
    (dir, path)
}

/// A forward proxy with `[auth]` on `htpasswd` plus `extra` keys in `[auth]`.
async fn proxy(htpasswd: &Path, extra: &str) -> Portico {
    Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\nenabled = false\n\n[auth]\nhtpasswd = \"{}\"\n{extra}\n",
        free_addr(),
        htpasswd.display()
    ))
    .await
}

/// An origin answering 200 "ok" and recording what it received.
async fn origin() -> Origin {
    Origin::start(|_req| async move { Response::ok("ok") }).await
}

fn basic(user: &str, pw: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    )
}

/// GET through the proxy with `extra` header lines.
async fn get(p: &Portico, o: &Origin, extra: &str) -> ParsedResponse {
    let req = format!(
        "GET {}/x HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{extra}\r\n",
        o.url(),
        o.addr()
    );
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

async fn get_as(p: &Portico, o: &Origin, user: &str, pw: &str) -> ParsedResponse {
    get(p, o, &format!("Proxy-Authorization: {}\r\n", basic(user, pw))).await
}

/// A monitoring page (origin form, from loopback: an admin client).
async fn page(p: &Portico, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", p.addr());
    let r = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!(r.status, 200, "{path}");
    r.body_str()
}

/// The value of the unlabelled Prometheus sample `name`.
async fn metric(p: &Portico, name: &str) -> f64 {
    let m = page(p, "/metrics").await;
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{m}"))
}

fn assert_challenge(r: &ParsedResponse, what: &str) {
    assert_eq!(r.status, 407, "{what}: {}", r.body_str());
    assert_eq!(
        r.header("proxy-authenticate"),
        Some("Basic realm=\"Portico\", charset=\"UTF-8\""),
        "{what}"
    );
}

/// Password verifications wait in the blocking pool's queue no longer
/// than a disk lookup may: past `server.blocking_queue` a login is refused
/// at once (503), not queued. Before, a client sending wrong passwords
/// for a known user (a bcrypt run each) piled up work without limit,
/// which the disk tier's jobs then waited behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifications_past_the_blocking_queue_are_refused_at_once_not_queued() {
    if !have_htpasswd() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let users = dir.path().join("users.htpasswd");
    // bcrypt cost 12: each verification takes a while.
    htpasswd(&[
        "-cbB",
        "-C",
        "12",
        users.to_str().expect("utf-8 path"),
        "alice",
        "right",
    ]);
    let p = proxy(&users, "\n[server]\nblocking_threads = 1\nblocking_queue = 1\n").await;
    let o = origin().await;
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let (paddr, oaddr, url) = (p.addr(), o.addr(), o.url());
            tokio::spawn(async move {
                let req = format!(
                    "GET {url}/x HTTP/1.1\r\nHost: {oaddr}\r\nProxy-Authorization: {}\r\nConnection: close\r\n\r\n",
                    basic("alice", &format!("wrong{i}"))
                );
                parse_response(&raw_request(paddr, req.as_bytes()).await).status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task"));
    }
    assert!(statuses.iter().all(|s| *s == 407 || *s == 503), "{statuses:?}");
    assert!(statuses.contains(&503), "every login waited: {statuses:?}");
    assert!(statuses.contains(&407), "{statuses:?}");
    assert_eq!(o.count(), 0);
    // The right password still gets in.
    assert_eq!(get_as(&p, &o, "alice", "right").await.status, 200);
}

#[tokio::test]
async fn every_htpasswd_format_right_and_wrong_password() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[
        ("-B", "bcrypt", "pw-b"),
        ("-2", "sha256", "pw-2"),
        ("-5", "sha512", "pw-5"),
        ("-m", "md5", "pw-m"),
        ("-p", "plain", "pw-p"),
        ("-s", "sha1", "pw-s"),
    ]);
    let o = origin().await;
    let p = proxy(&file, "").await;
    for (user, pw) in [
        ("bcrypt", "pw-b"),
        ("sha256", "pw-2"),
        ("sha512", "pw-5"),
        ("md5", "pw-m"),
    ] {
        let r = get_as(&p, &o, user, pw).await;
        assert_eq!(r.status, 200, "{user} with the right password: {}", r.body_str());
        assert_challenge(
            &get_as(&p, &o, user, "wrong").await,
            &format!("{user} with a wrong password"),
        );
    }
    assert_challenge(&get_as(&p, &o, "nobody", "pw-b").await, "unknown user");
    // Weak formats are refused even with the right password, and the
    // start-up warning names the file line and the user.
    assert_challenge(&get_as(&p, &o, "plain", "pw-p").await, "plain-text line");
    assert_challenge(&get_as(&p, &o, "sha1", "pw-s").await, "{SHA} line");
    let err = p.stderr();
    assert!(
        err.contains("users.htpasswd:5: user \"plain\"") && err.contains("refused"),
        "plain-text warning: {err}"
    );
    assert!(
        err.contains("users.htpasswd:6: user \"sha1\""),
        "{{SHA}} warning: {err}"
    );
    // Credentials never reach the origin.
    let seen = o.requests();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|r| r.header("proxy-authorization").is_none()));
    // The user is in the access log's Combined %u field.
    let lines = file_lines(&p.dir().join("access.log"), 12).await;
    assert!(
        lines.iter().any(|l| l.contains(" - bcrypt [") && l.contains("\" 200 ")),
        "{lines:#?}"
    );
}

/// A refused login is logged under the name the client presented, in a
/// field that is not quoted: spaces, brackets, quotes and line separators
/// in it are percent-encoded, so it can neither forge columns
/// (`bob - [01/Jan/2030`) nor start a line of its own (U+2028, which
/// Python's `splitlines` and JavaScript end a line at).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presented_user_name_cannot_forge_access_log_fields_or_lines() {
    if !have_htpasswd() {
        return;
    }
    let (_dir, users) = user_file(&[("-B", "alice", "right")]);
    let p = proxy(&users, "").await;
    let o = origin().await;
    for name in ["bob - [01/Jan/2030", "x\u{2028}1.0 GET forged 200", "q\"uote"] {
        assert_eq!(get_as(&p, &o, name, "pw").await.status, 407, "{name}");
    }
    let lines = file_lines(&p.dir().join("access.log"), 3).await;
    let log = lines.join("\n");
    assert!(!log.contains('\u{2028}'), "{log}");
    assert!(log.contains(" - bob%20-%20%5B01/Jan/2030 ["), "{log}");
    assert!(log.contains(" - x%E2%80%A81.0%20GET%20forged%20200 ["), "{log}");
    assert!(log.contains(" - q%22uote ["), "{log}");
    // Each line still has its one bracketed time and its request.
    for l in &lines {
        assert_eq!(l.matches(" [").count(), 1, "{l}");
        assert!(l.contains("\"GET http://"), "{l}");
    }
}

#[tokio::test]
async fn curl_proxy_user_exchange_and_required() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "s3cret")]);
    let o = origin().await;
    let p = proxy(&file, "required = true").await;
    let proxy_url = format!("http://{}", p.addr());
    let url = format!("{}/x", o.url());
    // Plain --proxy-user sends Basic at once; --proxy-anyauth first asks
    // without credentials, reads the 407's Proxy-Authenticate, and retries
    // as a browser does.
    for extra in [&[][..], &["--proxy-anyauth"][..]] {
        let mut args = vec!["-x", &proxy_url, "--proxy-user", "alice:s3cret", "-w", "%{http_code}"];
        args.extend_from_slice(extra);
        args.push(&url);
        let out = curl(&args).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ok200", "curl {extra:?}: {out:?}");
    }
    // required = true: no credentials at all is challenged too.
    assert_challenge(&get(&p, &o, "").await, "no credentials with required = true");
    let out = curl(&["-x", &proxy_url, "-w", "%{http_code}", "-o", "/dev/null", &url]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "407");
}

#[tokio::test]
async fn without_required_anonymous_requests_pass() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "s3cret")]);
    let o = origin().await;
    let p = proxy(&file, "").await;
    assert_eq!(get(&p, &o, "").await.status, 200);
    assert_challenge(&get_as(&p, &o, "alice", "bad").await, "wrong password still refused");
}

/// Sends a CONNECT and returns the status line of the answer.
async fn connect(p: &Portico, target: &str, extra: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("CONNECT answer in time")
            .expect("read");
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    text.lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn connect_needs_credentials() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "s3cret")]);
    let o = origin().await;
    let ports = format!("required = true\n\n[proxy]\nconnect_ports = [{}]", o.addr().port());
    let p = proxy(&file, &ports).await;
    let target = o.addr().to_string();
    assert!(connect(&p, &target, "").await.starts_with("HTTP/1.1 407"));
    let bad = format!("Proxy-Authorization: {}\r\n", basic("alice", "nope"));
    assert!(connect(&p, &target, &bad).await.starts_with("HTTP/1.1 407"));
    let good = format!("Proxy-Authorization: {}\r\n", basic("alice", "s3cret"));
    let line = connect(&p, &target, &good).await;
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
}

#[tokio::test]
async fn changed_password_is_refused_once_the_file_changes() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "old-pw")]);
    let o = origin().await;
    let p = proxy(&file, "max_age = \"1h\"").await;
    // Cached now (a second request is a hit).
    assert_eq!(get_as(&p, &o, "alice", "old-pw").await.status, 200);
    assert_eq!(get_as(&p, &o, "alice", "old-pw").await.status, 200);
    assert_eq!(metric(&p, "portico_auth_cache_hits_total").await, 1.0);
    htpasswd(&["-bB", file.to_str().expect("utf-8"), "alice", "new-pw"]);
    // The file is looked at on use, at most once a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get_as(&p, &o, "alice", "old-pw").await;
        if r.status == 407 {
            break;
        }
        assert!(Instant::now() < deadline, "old password still accepted from the cache");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get_as(&p, &o, "alice", "new-pw").await.status, 200);
}

#[tokio::test]
async fn a_removed_user_is_refused_even_when_its_verification_races_the_reload() {
    // The request that notices the changed file starts the reload in the
    // background and, its user not in the cache, verifies the password at
    // the same time. Verified against the table the reload replaces, the
    // answer must not be cached past the reload: the removed user would
    // keep working for max_age.
    if !have_htpasswd() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("users.htpasswd");
    let path = file.to_str().expect("utf-8");
    // The race made to go one way: a file of 20,000 users takes the reload
    // longer to read than the request takes to reach the table it replaces,
    // and a bcrypt cost of 12 makes the verification outlast that reading.
    htpasswd(&["-cbB", "-C", "12", path, "alice", "pw"]);
    let out = std::process::Command::new("htpasswd")
        .args(["-nbm", "filler", "x"])
        .output()
        .expect("run htpasswd");
    let line = String::from_utf8_lossy(&out.stdout);
    let hash = line.trim().strip_prefix("filler:").expect("an htpasswd line");
    let fillers: String = (0..20_000).map(|i| format!("filler{i}:{hash}\n")).collect();
    let mut text = std::fs::read_to_string(&file).expect("read the user file");
    text.push_str(&fillers);
    std::fs::write(&file, text).expect("write the user file");
    let o = origin().await;
    let p = proxy(&file, "max_age = \"1h\"").await;
    assert_eq!(get_as(&p, &o, "alice", "pw").await.status, 200);
    // Another user is added: the reload that follows empties the cache.
    htpasswd(&["-bB", "-C", "4", path, "carol", "pw3"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&p, "portico_auth_reloads_total").await < 2.0 {
        assert!(Instant::now() < deadline, "the added user was not noticed");
        assert_eq!(get_as(&p, &o, "alice", "pw").await.status, 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // alice is removed; her next request is the one that notices it (the
    // file is looked at at most once a second) and finds no cache entry.
    htpasswd(&["-D", path, "alice"]);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get_as(&p, &o, "alice", "pw").await;
        if r.status == 407 {
            break;
        }
        assert_eq!(r.status, 200, "{}", r.body_str());
        assert!(
            Instant::now() < deadline,
            "the removed user's password is still accepted (cached from the replaced file)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_challenge(&get_as(&p, &o, "alice", "pw").await, "a removed user");
    assert_eq!(get_as(&p, &o, "carol", "pw3").await.status, 200);
}

#[tokio::test]
async fn max_age_sends_users_back_to_the_file() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-m", "alice", "pw")]);
    let o = origin().await;
    let p = proxy(&file, "max_age = \"1s\"").await;
    assert_eq!(get_as(&p, &o, "alice", "pw").await.status, 200);
    assert_eq!(get_as(&p, &o, "alice", "pw").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(get_as(&p, &o, "alice", "pw").await.status, 200);
    assert_eq!(metric(&p, "portico_auth_cache_hits_total").await, 1.0);
    assert_eq!(metric(&p, "portico_auth_cache_misses_total").await, 2.0);
}

/// GET on a kept-alive connection with `alice`'s credentials `pw`.
async fn get_on(c: &mut common::RawClient, o: &Origin, pw: &str) -> ParsedResponse {
    let req = format!(
        "GET {}/x HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: {}\r\n\r\n",
        o.url(),
        o.addr(),
        basic("alice", pw)
    );
    c.send(req.as_bytes()).await;
    c.read_response().await
}

#[tokio::test]
async fn a_connection_that_repeats_its_credentials_is_still_checked_after_a_change() {
    // A connection that sends the field it had accepted is answered from
    // its own memo (no decoding, no lock); that memo must not outlive a
    // changed file, and another field on the same connection is checked.
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "old-pw")]);
    let o = origin().await;
    // The connection stays in its task (and keeps its memo) between requests.
    let p = proxy(&file, "max_age = \"1h\"\n\n[keepalive]\npark_after = \"1min\"").await;
    let mut c = common::RawClient::connect(p.addr()).await;
    assert_eq!(get_on(&mut c, &o, "old-pw").await.status, 200);
    assert_eq!(get_on(&mut c, &o, "old-pw").await.status, 200);
    assert_eq!(metric(&p, "portico_auth_cache_hits_total").await, 1.0);
    assert_challenge(&get_on(&mut c, &o, "wrong").await, "a wrong password after a good one");
    assert_eq!(get_on(&mut c, &o, "old-pw").await.status, 200);
    assert_eq!(metric(&p, "portico_auth_cache_misses_total").await, 2.0);
    htpasswd(&["-bB", file.to_str().expect("utf-8"), "alice", "new-pw"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get_on(&mut c, &o, "old-pw").await;
        if r.status == 407 {
            break;
        }
        assert_eq!(r.status, 200);
        assert!(
            Instant::now() < deadline,
            "the old password is still accepted on a connection that used it"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get_on(&mut c, &o, "new-pw").await.status, 200);
    assert_eq!(get_on(&mut c, &o, "new-pw").await.status, 200);
}

#[tokio::test]
async fn a_connections_memo_of_its_credentials_ends_with_the_user_cache_entry() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-m", "alice", "pw")]);
    let o = origin().await;
    let p = proxy(&file, "max_age = \"1s\"\n\n[keepalive]\npark_after = \"1min\"").await;
    let mut c = common::RawClient::connect(p.addr()).await;
    assert_eq!(get_on(&mut c, &o, "pw").await.status, 200);
    assert_eq!(get_on(&mut c, &o, "pw").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Past max_age the file is asked again, memo or not.
    assert_eq!(get_on(&mut c, &o, "pw").await.status, 200);
    assert_eq!(metric(&p, "portico_auth_cache_hits_total").await, 1.0);
    assert_eq!(metric(&p, "portico_auth_cache_misses_total").await, 2.0);
}

#[tokio::test]
async fn thousand_users_through_a_hundred_entry_cache() {
    if !have_htpasswd() {
        return;
    }
    // One hash from the real tool, given to 1,000 names: a valid file,
    // without 1,000 runs of the tool.
    let out = std::process::Command::new("htpasswd")
        .args(["-nbm", "u0", "pw"])
        .output()
        .expect("htpasswd");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let hash = line.split_once(':').expect("user:hash").1.to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("users");
    let text: String = (0..1000).map(|i| format!("u{i}:{hash}\n")).collect();
    std::fs::write(&file, text).expect("write users");
    let o = origin().await;
    let p = proxy(&file, "max_users = 100").await;
    for i in 0..1000 {
        let r = get_as(&p, &o, &format!("u{i}"), "pw").await;
        assert_eq!(r.status, 200, "u{i}");
    }
    assert_eq!(metric(&p, "portico_auth_cache_misses_total").await, 1000.0);
    assert_eq!(metric(&p, "portico_auth_cache_evictions_total").await, 900.0);
    assert_eq!(metric(&p, "portico_auth_cache_users").await, 100.0);
    promtool_check(&page(&p, "/metrics").await);
    // The back-end's latency: one verification per miss.
    assert_eq!(metric(&p, "portico_auth_verify_seconds_count").await, 1000.0);
    // The tuning advisor says the cache is too small; the perfdump and
    // stats-xml show the user cache.
    let json = page(&p, "/.stats.json").await;
    assert!(json.contains("auth-user-cache-too-small"), "{json}");
    assert!(
        json.contains("\"evictions\":900"),
        "user cache figures in the JSON: {json}"
    );
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains("ACLUserCacheInfo") && perf.contains("100/100"), "{perf}");
    let xml = page(&p, "/stats-xml").await;
    assert!(
        xml.contains("acl-user-cache-bucket") && xml.contains("countEvictions=\"900\""),
        "{xml}"
    );
}

#[tokio::test]
async fn failed_logins_are_cached() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "s3cret")]);
    let o = origin().await;
    let p = proxy(&file, "failed_ttl = \"1m\"").await;
    for _ in 0..5 {
        assert_challenge(&get_as(&p, &o, "alice", "guess").await, "wrong password");
    }
    // Verified once against the file, then answered from the failed-login cache.
    assert_eq!(metric(&p, "portico_auth_failures_total").await, 1.0);
    assert_eq!(metric(&p, "portico_auth_failed_cache_hits_total").await, 4.0);
    // The right password is not blocked by someone's wrong guesses.
    assert_eq!(get_as(&p, &o, "alice", "s3cret").await.status, 200);
}

#[tokio::test]
async fn deleted_user_file_fails_closed_and_cached_users_continue() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "a-pw"), ("-B", "bob", "b-pw")]);
    let o = origin().await;
    let p = proxy(&file, "").await;
    assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 200);
    std::fs::remove_file(&file).expect("remove users file");
    // Until the next look at the file (at most a second) the old users
    // still verify; wait for it with guesses that are never cached as good.
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in 0.. {
        if get_as(&p, &o, "bob", &format!("guess{n}")).await.status == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "the deleted file was not noticed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = get_as(&p, &o, "bob", "b-pw").await;
    // 503 with the reason, not a 407 a browser would loop on.
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert!(r.header("proxy-authenticate").is_none());
    assert!(
        r.body_str().contains("cannot check credentials right now"),
        "{}",
        r.body_str()
    );
    // The cause (the file's path) is the operator's, in the error log.
    assert!(!r.body_str().contains(&file.display().to_string()), "{}", r.body_str());
    for _ in 0..5 {
        assert_eq!(get_as(&p, &o, "bob", "b-pw").await.status, 503);
        assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 200, "cached user");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(get_as(&p, &o, "bob", "b-pw").await.status, 503);
    let err = p.stderr();
    assert_eq!(
        err.matches("failing closed").count(),
        1,
        "one error line per episode:\n{err}"
    );
}

#[tokio::test]
async fn hostile_credentials_never_crash() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "s3cret")]);
    let o = origin().await;
    let p = proxy(&file, "").await;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let long = format!("Basic {}", "QUFB".repeat(3000));
    let hostile = [
        "Basic".to_string(),
        "Basic ".to_string(),
        "Basic !!!!".to_string(),
        format!("Basic {}", b64(b"nocolon")),
        format!("Basic {}", b64(b":nouser")),
        format!("Basic {}", b64(&[0xff, 0xfe, b':', 0x80])),
        format!("Basic {}", b64(b"al\x01ice:x")),
        long,
        "Digest username=\"alice\"".to_string(),
        "Bearer abc".to_string(),
        format!("Basic {}", b64(&vec![b'a'; 2000])),
    ];
    for h in &hostile {
        let r = get(&p, &o, &format!("Proxy-Authorization: {h}\r\n")).await;
        assert!(r.status == 400 || r.status == 407, "{h:.40}: {}", r.status);
    }
    assert_eq!(get_as(&p, &o, "alice", "s3cret").await.status, 200, "still serving");
    assert_eq!(o.count(), 1);
}

#[tokio::test]
async fn reverse_listener_answers_401_and_keeps_credentials_from_the_origin() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "s3cret")]);
    let o = origin().await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"reverse\"\n\n[[upstream]]\nname = \"app\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nupstream = \"app\"\n\n[cache]\nenabled = false\n\n[auth]\nhtpasswd = \"{}\"\nrequired = true\n",
        free_addr(),
        o.addr(),
        file.display()
    ))
    .await;
    let send = |extra: String| {
        let req = format!("GET /x HTTP/1.1\r\nHost: site\r\nConnection: close\r\n{extra}\r\n");
        let addr = p.addr();
        async move { parse_response(&raw_request(addr, req.as_bytes()).await) }
    };
    let r = send(String::new()).await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Basic realm=\"Portico\", charset=\"UTF-8\"")
    );
    let r = send(format!("Authorization: {}\r\n", basic("alice", "s3cret"))).await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert!(o.requests().iter().all(|r| r.header("authorization").is_none()));
}

#[tokio::test]
async fn sighup_rereads_the_user_file_and_keeps_serving() {
    if !have_htpasswd() {
        return;
    }
    let (_d, file) = user_file(&[("-B", "alice", "s3cret")]);
    let o = origin().await;
    let p = proxy(&file, "").await;
    assert_eq!(get_as(&p, &o, "alice", "s3cret").await.status, 200);
    assert_eq!(metric(&p, "portico_auth_reloads_total").await, 1.0);
    p.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&p, "portico_auth_reloads_total").await < 2.0 {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not re-read the user file\n{}",
            p.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get_as(&p, &o, "alice", "s3cret").await.status, 200);
}

#[tokio::test]
async fn missing_user_file_is_a_startup_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope");
    let cfg = format!(
        "[[listener]]\naddress = \"{}\"\n\n[auth]\nhtpasswd = \"{}\"\n",
        free_addr(),
        missing.display()
    );
    let path = dir.path().join("portico.toml");
    std::fs::write(&path, cfg).expect("write config");
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
            .current_dir(dir.path())
            .args(["run", "-c"])
            .arg(&path)
            .output(),
    )
    .await
    .expect("portico exits at once")
    .expect("run portico");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("htpasswd file") && err.contains("nope"), "{err}");
}

/// `[auth]` and `[[acl]]` together: the verified user and the groups of the
/// groups file are what `user` and `group` entries match; a request without
/// credentials that reaches an entry needing a user is asked for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_entries_match_the_authenticated_user_and_groups() {
    if !have_htpasswd() {
        return;
    }
    let (dir, file) = user_file(&[("-B", "alice", "a-pw"), ("-B", "bob", "b-pw")]);
    let groups = dir.path().join("groups");
    std::fs::write(&groups, "admins: alice\nstaff: alice bob\n").expect("write groups");
    let o = origin().await;
    let p = proxy(
        &file,
        &format!(
            "groups = \"{}\"\n\n\
             [[acl]]\naction = \"allow\"\ngroup = \"admins\"\n\n\
             [[acl]]\naction = \"deny\"\nuser = \"bob\"\nreason = \"bob may not browse\"\n",
            groups.display()
        ),
    )
    .await;
    assert_challenge(&get(&p, &o, "").await, "no credentials, an entry needs a group");
    let r = get_as(&p, &o, "alice", "a-pw").await;
    assert_eq!(r.status, 200, "alice is in admins: {}", r.body_str());
    let r = get_as(&p, &o, "bob", "b-pw").await;
    assert_eq!(r.status, 403, "bob is not: {}", r.body_str());
    assert!(r.body_str().contains("bob may not browse"), "{}", r.body_str());
    assert_challenge(&get_as(&p, &o, "alice", "wrong").await, "wrong password");
    assert_eq!(o.requests().len(), 1, "only alice's request reached the origin");
    let lines = file_lines(&p.dir().join("access.log"), 4).await;
    assert!(
        lines.iter().any(|l| l.contains(" alice [") && l.contains("\" 200 ")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains(" bob [") && l.contains("\" 403 ")),
        "{lines:?}"
    );
}
