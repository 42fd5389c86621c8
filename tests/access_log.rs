//! The access log as written by the real binary: GoAccess (Debian) parses
//! every line of a Combined log, SIGUSR1 reopens the file after rotation,
//! the Squid format (with Squid's `TCP_DENIED` and `NONE` for refusals and
//! busy 503s, and full URLs on reverse listeners) and custom formats, and
//! `access = ""`.

mod common;

use std::time::Duration;

use common::*;

async fn proxy(log: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\n{log}\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n"
    ))
    .await
}

async fn send(p: &Portico, raw: &str) -> ParsedResponse {
    parse_response(&raw_request(p.addr(), raw.as_bytes()).await)
}

async fn get(p: &Portico, url: &str, extra: &str) -> ParsedResponse {
    send(
        p,
        &format!("GET {url} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n"),
    )
    .await
}

/// The body of a monitoring page (origin form, to the server's own address).
async fn admin_page(p: &Portico, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", p.addr());
    parse_response(&raw_request(p.addr(), req.as_bytes()).await).body_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaccess_parses_every_line_of_a_combined_log() {
    let o = Origin::start(|req| async move {
        match req.uri.path() {
            "/missing" => Response::new(404).body("no"),
            _ => Response::ok("hello").header("Cache-Control", "max-age=60"),
        }
    })
    .await;
    let p = proxy("access = \"{dir}/access.log\"\nformat = \"combined\"").await;
    let url = o.url();
    get(&p, &format!("{url}/a"), "").await;
    get(&p, &format!("{url}/a"), "Referer: http://example.com/page?q=1\r\n").await;
    get(
        &p,
        &format!("{url}/missing"),
        "User-Agent: Mozilla/5.0 (X11; \"quoted\")\r\n",
    )
    .await;
    get(&p, &format!("{url}/q?x=%20y&z=1"), "").await;
    get(&p, &format!("http://{}/gone", dead_addr()), "").await;
    raw_request(p.addr(), format!("HEAD {url}/a HTTP/1.0\r\n\r\n").as_bytes()).await;
    send(
        &p,
        &format!("POST {url}/post HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"),
    )
    .await;
    // A head that cannot be parsed is logged too (400).
    raw_request(p.addr(), b"BROKEN\r\n\r\n").await;
    let path = p.dir().join("access.log");
    let logged = file_lines(&path, 8).await;
    assert_eq!(logged.len(), 8, "{logged:#?}");

    let report = p.dir().join("report.json");
    let out = tokio::process::Command::new("goaccess")
        .arg(&path)
        .args(["--log-format=COMBINED", "--no-global-config", "-o"])
        .arg(&report)
        .output()
        .await
        .expect("goaccess not found: install Debian package `goaccess` (scripts/install-test-deps does)");
    assert!(
        out.status.success(),
        "goaccess: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("goaccess report")).expect("JSON");
    let general = &json["general"];
    assert_eq!(general["total_requests"], 8, "{general}\n{logged:#?}");
    assert_eq!(general["valid_requests"], 8, "{general}\n{logged:#?}");
    assert_eq!(general["failed_requests"], 0, "{general}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_log_after_rotation() {
    let o = Origin::start(|_| async { Response::ok("x") }).await;
    let p = proxy("access = \"{dir}/access.log\"").await;
    let path = p.dir().join("access.log");
    get(&p, &format!("{}/before", o.url()), "").await;
    assert_eq!(file_lines(&path, 1).await.len(), 1);

    let rotated = p.dir().join("access.log.1");
    std::fs::rename(&path, &rotated).expect("rotate");
    let status = std::process::Command::new("kill")
        .args(["-USR1", &p.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    // The writer reopens within its 200 ms wake-up; wait for the new file.
    for _ in 0..50 {
        if path.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(path.exists(), "no new access.log after SIGUSR1");
    get(&p, &format!("{}/after", o.url()), "").await;
    let new = file_lines(&path, 1).await;
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(new[0].contains("/after"), "{new:?}");
    let old = file_lines(&rotated, 1).await;
    assert_eq!(old.len(), 1);
    assert!(old[0].contains("/before"));
    assert!(p.stderr().contains("reopening the access log"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_format() {
    squid_format_with("").await;
}

/// The cache's result in the line does not depend on the statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_format_with_statistics_off() {
    squid_format_with("\n\n[monitor]\nenabled = false").await;
}

async fn squid_format_with(extra: &str) {
    let o = Origin::start(|_| async { Response::ok("12345").header("Cache-Control", "max-age=60") }).await;
    let p = proxy(&format!("access = \"{{dir}}/access.log\"\nformat = \"squid\"{extra}")).await;
    get(&p, &format!("{}/s", o.url()), "").await;
    get(&p, &format!("{}/s", o.url()), "").await;
    let l = file_lines(&p.dir().join("access.log"), 2).await;
    assert_eq!(l.len(), 2);
    let url = format!("{}/s", o.url());
    for (line, result) in l.iter().zip(["TCP_MISS/200", "TCP_HIT/200"]) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 10, "{line}");
        assert!(
            f[0].contains('.') && f[0].split('.').all(|x| x.parse::<u64>().is_ok()),
            "{line}"
        );
        assert!(f[1].parse::<u64>().is_ok(), "{line}");
        assert_eq!(&f[2..7], ["127.0.0.1", result, "5", "GET", url.as_str()], "{line}");
    }
    // The miss came from the origin, the hit from nowhere.
    assert_eq!(
        l[0].split_whitespace().nth(8),
        Some("HIER_DIRECT/127.0.0.1"),
        "{}",
        l[0]
    );
    assert_eq!(l[1].split_whitespace().nth(8), Some("HIER_NONE/-"), "{}", l[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_format() {
    let o = Origin::start(|_| async { Response::ok("abc") }).await;
    let p = proxy(
        "access = \"{dir}/access.log\"\nformat = \"custom\"\ncustom_format = \"%m %U %>s %B %{X-Trace}i cache=%C\"",
    )
    .await;
    get(&p, &format!("{}/c", o.url()), "X-Trace: t-42\r\n").await;
    let l = file_lines(&p.dir().join("access.log"), 1).await;
    assert_eq!(l, [format!("GET {}/c 200 3 t-42 cache=MISS", o.url())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_custom_format_is_refused_and_empty_access_disables() {
    let out = Portico::check("[log]\nformat = \"custom\"\ncustom_format = \"%h %q\"\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("log.custom_format") && err.contains("%q"), "{err}");
    let out = Portico::check("[log]\naccess_queue = 0\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":2: key `log.access_queue`: must be at least 1"), "{err}");

    let o = Origin::start(|_| async { Response::ok("x") }).await;
    let p = proxy("access = \"\"").await;
    assert_eq!(get(&p, &format!("{}/x", o.url()), "").await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let files: Vec<_> = std::fs::read_dir(p.dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("access"))
        .collect();
    assert!(files.is_empty(), "{files:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_names_are_resolved_off_the_request_path_when_asked() {
    let o = Origin::start(|_| async { Response::ok("x") }).await;
    let p = proxy("access = \"{dir}/access.log\"\nformat = \"common\"\nresolve_clients = true").await;
    for i in 0..3 {
        get(&p, &format!("{}/r{i}", o.url()), "").await;
    }
    let l = file_lines(&p.dir().join("access.log"), 3).await;
    assert_eq!(l.len(), 3);
    // 127.0.0.1 is named in /etc/hosts on any Debian machine.
    for line in &l {
        assert!(line.starts_with("localhost - - ["), "{line}");
    }
    let perf = admin_page(&p, "/.perf").await;
    assert!(perf.contains("ClientDNSCacheInfo:"), "{perf}");
    assert!(
        perf.contains("CacheEntries     1/1024\nHitRatio         2/3 ( 66.67%)"),
        "{perf}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_cannot_keep_up_drops_lines_never_requests_and_the_advisor_says_so() {
    use std::os::unix::fs::OpenOptionsExt;
    // The access log is a pipe nobody reads: once the pipe and the
    // writer's buffer are full, the writer thread blocks for good, as on a
    // disk that stopped answering.
    let fifo_dir = tempfile::tempdir().expect("tempdir");
    let fifo = fifo_dir.path().join("access.pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    // Held open for reading (never read) so the server's open for writing
    // does not wait for a reader.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open fifo");
    let o = Origin::start(|_| async { Response::ok("x").header("Cache-Control", "max-age=600") }).await;
    let p = proxy(&format!("access = \"{}\"\naccess_queue = 16", fifo.display())).await;
    // Long User-Agents make long Combined lines: about 300 requests fill
    // the 64 KiB pipe and the writer's 64 KiB buffer.
    let ua = "u".repeat(1000);
    let url = format!("{}/obj", o.url());
    let mut c = RawClient::connect(p.addr()).await;
    for i in 0..1000 {
        // A new connection now and then: keepalive.max_requests ends each one.
        if i % 50 == 0 {
            c = RawClient::connect(p.addr()).await;
        }
        c.send(format!("GET {url} HTTP/1.1\r\nHost: x\r\nUser-Agent: {ua}{i}\r\n\r\n").as_bytes())
            .await;
        // Every request is answered, whatever the log does.
        assert_eq!(c.read_response().await.status, 200, "request {i}");
    }
    let perf = admin_page(&p, "/.perf").await;
    // "Access Log                   combined (N lines, D dropped)"
    let dropped: u64 = perf
        .lines()
        .find(|l| l.starts_with("Access Log"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Access Log line in {perf}"));
    assert!(dropped > 500, "dropped {dropped}\n{perf}");
    assert!(perf.contains("[access-log-slow] The access log"), "{perf}");
    assert!(perf.contains(&format!("{dropped} lines dropped")), "{perf}");
    let metrics = admin_page(&p, "/metrics").await;
    // The monitoring requests are logged (and dropped) too.
    let in_metrics: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("portico_access_log_dropped_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no dropped counter in {metrics}"));
    assert!(in_metrics >= dropped, "{in_metrics} < {dropped}");
}

/// The Squid-format line whose URL field (the 7th) contains `marker`, split
/// into fields; panics with the whole log when there is none.
fn squid_line<'a>(lines: &'a [String], marker: &str) -> Vec<&'a str> {
    lines
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(6).is_some_and(|u| u.contains(marker)))
        .unwrap_or_else(|| panic!("no line for {marker:?} in:\n{}", lines.join("\n")))
}

/// Every answer Portico makes itself gets a line, with Squid's codes:
/// `TCP_DENIED` for refusals, `NONE` for answers made before any lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_format_logs_every_refusal_and_busy_503_with_squids_codes() {
    let o = Origin::start(|req| async move {
        let r = Response::ok("slow");
        if req.uri.path().starts_with("/slow") {
            r.delay(Duration::from_secs(2))
        } else {
            r
        }
    })
    .await;
    let users = tempfile::tempdir().expect("tempdir");
    let htpasswd = users.path().join("users");
    std::fs::write(&htpasswd, "alice:$apr1$1Bd8UTMo$Fd8nz/j3fcfZPJK0my8Vy.\n").expect("write users");
    let addr = free_addr();
    let p = Portico::start(&format!(
        r#"[server]
max_requests = 1
queue_size = 1

[[listener]]
address = "{addr}"

[access]
allow = ["127.0.0.1/32"]

[limits]
max_request_line = "1k"
max_header_size = "2k"
max_body_size = "1k"
header_timeout = "1s"

[log]
access = "{{dir}}/access.log"
format = "squid"

[cache]
dir = "{{dir}}/cache"
memory = "16MiB"

[auth]
htpasswd = "{}"

[[acl]]
action = "allow"
host = "secret.test"
authenticated = true

[[acl]]
action = "deny"
host = "blocked.test"

[[rule]]
host = "ruled.test"
deny = 451
"#,
        htpasswd.display()
    ))
    .await;
    let url = o.url();
    let status = |raw: Vec<u8>| parse_response(&raw).status;
    let get =
        |target: &str, extra: &str| format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
    let pa = p.addr();
    let send = |req: String| async move { status(raw_request(pa, req.as_bytes()).await) };

    assert_eq!(send(get("http://blocked.test/by-acl", "")).await, 403);
    assert_eq!(send(get("http://ruled.test/by-rule", "")).await, 451);
    assert_eq!(send(get("http://secret.test/needs-user", "")).await, 407);
    let from_other = raw_request_from(
        "127.0.0.2".parse().unwrap(),
        pa,
        get(&format!("{url}/not-allowed"), "").as_bytes(),
    )
    .await;
    assert_eq!(status(from_other), 403);
    let connect = "CONNECT tunnel.test:25 HTTP/1.1\r\nHost: tunnel.test:25\r\n\r\n".to_string();
    assert_eq!(send(connect).await, 403);
    assert_eq!(send("GARBAGE\r\n\r\n".to_string()).await, 400);
    assert_eq!(send(get(&format!("{url}/long-{}", "a".repeat(1100)), "")).await, 414);
    assert_eq!(
        send(get(
            &format!("{url}/big-head"),
            &format!("X-Pad: {}\r\n", "p".repeat(2100))
        ))
        .await,
        431
    );
    assert_eq!(send(get(&format!("{url}/looped"), "Via: 1.1 portico\r\n")).await, 508);
    let post = format!("POST {url}/too-big HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nConnection: close\r\n\r\n");
    assert_eq!(send(post).await, 413);
    // A head that never ends: 408 after header_timeout.
    let mut slow = RawClient::connect(pa).await;
    slow.send(format!("GET {url}/unfinished-head HTTP/1.1\r\n").as_bytes())
        .await;
    assert_eq!(slow.read_response().await.status, 408);

    // One request in service, one in the connection queue, the third
    // finds the queue full: busy 503.
    let in_service = tokio::spawn(send(get(&format!("{url}/slow-1"), "")));
    assert!(
        o.wait_count(1, Duration::from_secs(10)).await,
        "the slow request never reached the origin"
    );
    let queued = tokio::spawn(send(get(&format!("{url}/slow-2"), "")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(send(get(&format!("{url}/overflow"), "")).await, 503);
    assert_eq!(in_service.await.expect("join"), 200);
    assert_eq!(queued.await.expect("join"), 200);

    let lines = file_lines(&p.dir().join("access.log"), 14).await;
    for (marker, result) in [
        ("http://blocked.test/by-acl", "TCP_DENIED/403"),
        ("http://ruled.test/by-rule", "TCP_DENIED/451"),
        ("http://secret.test/needs-user", "TCP_DENIED/407"),
        ("/not-allowed", "TCP_DENIED/403"),
        ("tunnel.test:25", "TCP_DENIED/403"),
        ("/long-aaa", "NONE/414"),
        ("/big-head", "NONE/431"),
        ("/looped", "NONE/508"),
        ("/too-big", "NONE/413"),
        ("/unfinished-head", "NONE/408"),
        ("/overflow", "NONE/503"),
        ("/slow-1", "TCP_MISS/200"),
        ("/slow-2", "TCP_MISS/200"),
    ] {
        let f = squid_line(&lines, marker);
        assert_eq!(f[3], result, "{marker}: {}", f.join(" "));
        assert_eq!(
            f[8],
            if result.starts_with("TCP_MISS") {
                "HIER_DIRECT/127.0.0.1"
            } else {
                "HIER_NONE/-"
            },
            "{}",
            f.join(" ")
        );
    }
    // The malformed request: its method field is what was sent, no URL.
    let garbage = lines
        .iter()
        .find(|l| l.contains(" GARBAGE "))
        .unwrap_or_else(|| panic!("no line for the malformed request in:\n{}", lines.join("\n")));
    assert!(garbage.contains(" NONE/400 "), "{garbage}");
    assert_eq!(lines.len(), 14, "one line per response:\n{}", lines.join("\n"));
}

/// Squid logs the full URL of a reverse proxy's requests, which arrive
/// with a path only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squid_format_logs_the_full_url_on_a_reverse_listener() {
    let o = Origin::start(|_| async { Response::ok("r") }).await;
    let addr = free_addr();
    let p = Portico::start(&format!(
        r#"[[listener]]
address = "{addr}"
mode = "reverse"

[log]
access = "{{dir}}/access.log"
format = "squid"

[cache]
dir = "{{dir}}/cache"
memory = "16MiB"

[[upstream]]
name = "o"
servers = ["{}"]

[[rule]]
upstream = "o"
"#,
        o.addr()
    ))
    .await;
    let req = "GET /page?q=1 HTTP/1.1\r\nHost: www.example.test:8080\r\nConnection: close\r\n\r\n";
    assert_eq!(parse_response(&raw_request(p.addr(), req.as_bytes()).await).status, 200);
    let lines = file_lines(&p.dir().join("access.log"), 1).await;
    let f = squid_line(&lines, "/page");
    assert_eq!(f[6], "http://www.example.test:8080/page?q=1", "{}", f.join(" "));
    assert_eq!(f[3], "TCP_MISS/200", "{}", f.join(" "));
}
