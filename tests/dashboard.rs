//! The live dashboard in a real browser: headless Chromium (Debian) loads
//! the page from the binary, lets it poll the JSON endpoint, and the DOM it
//! leaves must hold the numbers the known traffic produced. Loaded as
//! `/.dashboard?layout`, the page reads its canvases' pixels back and
//! reports where the lines and the text landed, so the layout (axes with
//! ticks and units, legends beside the plots, lines filling the width) is
//! asserted, not only the numbers. Screenshots are saved in cargo's
//! temporary directory for integration tests (`target/tmp/dashboard*.png`,
//! under `CARGO_TARGET_DIR` when that is set) for a person to look at.

mod common;

use common::*;

fn chromium(args: &[&str], profile: &std::path::Path) -> std::process::Output {
    std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-proxy-server",
            // Chromium's own background traffic (update checks, time
            // queries) must not resolve names through the machine's
            // resolver: every name but 127.0.0.* is "not found" (IP literals
            // included, hence the pattern: the array test uses 127.0.0.11).
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.*",
            "--disable-background-networking",
            "--disable-component-update",
            "--window-size=1280,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium not found: install Debian package `chromium` (scripts/install-test-deps does)")
}

/// `id="NAME"...>TEXT<` in the dumped DOM.
fn element_text<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element {id}"));
    let rest = &dom[at..];
    let start = rest.find('>').expect("tag end") + 1;
    let end = rest[start..].find('<').expect("text end") + start;
    &rest[start..end]
}

/// The page's layout report (`?layout`): per plot, what its pixels show.
fn layout_report(dom: &str) -> serde_json::Map<String, serde_json::Value> {
    let text = element_text(dom, "layout-report");
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(m)) => m,
        other => panic!("layout report {text:?}: {other:?}"),
    }
}

/// `HH:MM` or `HH:MM:SS`.
fn is_clock_time(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    (parts.len() == 2 || parts.len() == 3)
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// What the issue asked of every plot: a time axis with clock-time tick
/// labels, a value axis with labels and its unit, a legend that does not
/// overlap the plot, no text drawn over the lines, and data that fills the
/// width of the plot area (the time axis spans the samples kept, not a
/// fixed window they sit squeezed in).
fn assert_plot_layout(id: &str, p: &serde_json::Value, must_fill: bool) {
    let num = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{id}: no {k} in {p}"));
    let ticks = |k: &str| -> Vec<String> {
        p[k].as_array()
            .unwrap_or_else(|| panic!("{id}: no {k} in {p}"))
            .iter()
            .map(|t| t.as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert!(
        num("width") >= 300.0 && num("height") >= 120.0,
        "{id}: plot too small: {p}"
    );
    let xt = ticks("xticks");
    assert!(xt.len() >= 2, "{id}: time axis ticks {xt:?}");
    assert!(xt.iter().all(|t| is_clock_time(t)), "{id}: time axis ticks {xt:?}");
    let yt = ticks("yticks");
    assert!(yt.len() >= 2 && yt[0] == "0", "{id}: value axis ticks {yt:?}");
    assert!(!p["unit"].as_str().unwrap_or_default().is_empty(), "{id}: no unit");
    // Tick labels and the unit are drawn outside the plot area, and are there.
    assert!(num("left_axis_ink") > 30.0, "{id}: no value axis labels drawn: {p}");
    assert!(num("bottom_axis_ink") > 30.0, "{id}: no time axis labels drawn: {p}");
    assert_eq!(num("text_ink_in_area"), 0.0, "{id}: text drawn over the plot: {p}");
    assert_eq!(p["legend_overlaps_plot"], false, "{id}: legend overlaps the plot: {p}");
    if must_fill {
        let (l, r) = (num("data_left"), num("data_right"));
        assert!(
            l <= 0.05 && r >= 0.95,
            "{id}: data spans {l:.2}..{r:.2} of the width: {p}"
        );
    } else {
        assert!(p["data_right"].is_number(), "{id}: no data drawn: {p}");
    }
}

/// Loads `url` in headless Chromium (as the DOM after `budget_ms` of the
/// page's virtual time) and takes a screenshot of it into the file `png` of
/// cargo's temporary directory for integration tests, which exists wherever
/// the target directory is (Chromium writes nothing, and still succeeds,
/// into a directory that does not exist).
async fn browse(url: String, profile: std::path::PathBuf, png: &str, budget_ms: u32) -> String {
    let png = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(png);
    let (dump, shot) = tokio::task::spawn_blocking(move || {
        let budget = format!("--virtual-time-budget={budget_ms}");
        let dump = chromium(&["--dump-dom", &budget, &url], &profile);
        let shot = chromium(&[&format!("--screenshot={}", png.display()), &budget, &url], &profile);
        (dump, (shot, png))
    })
    .await
    .expect("chromium task");
    assert!(
        dump.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let (shot, png) = shot;
    assert!(
        shot.status.success(),
        "screenshot: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).expect("screenshot file");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{} bytes",
        bytes.len()
    );
    String::from_utf8_lossy(&dump.stdout).into_owned()
}

/// `data-updates` of the page: how many times it polled the JSON.
fn updates(dom: &str) -> u32 {
    dom.split("data-updates=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no data-updates\n{dom}"))
}

/// True if the dumped DOM has the element `id` with the `hidden` attribute.
fn is_hidden(dom: &str, id: &str) -> bool {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element {id}"));
    let start = dom[..at].rfind('<').expect("tag start");
    let end = at + dom[at..].find('>').expect("tag end");
    dom[start..end].contains(" hidden")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_plots_live_numbers_in_headless_chromium() {
    let o = Origin::start(|_| async { Response::ok("hello").header("Cache-Control", "max-age=600") }).await;
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n"
    ))
    .await;
    // 1 miss + 2 hits per URL: hit ratio 66.67%.
    for _ in 0..3 {
        for i in 0..4 {
            let req = format!("GET {}/d{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", o.url());
            assert_eq!(parse_response(&raw_request(p.addr(), req.as_bytes()).await).status, 200);
        }
    }
    let url = format!("http://{}/.dashboard?layout", p.addr());
    let dom = browse(url, p.dir().join("chromium-profile"), "dashboard.png", 6000).await;
    // The page polled several times (so rates and a time span exist) and wrote the values.
    let updates = updates(&dom);
    assert!(updates >= 3, "updates {updates}\n{dom}");
    assert_eq!(element_text(&dom, "v-hit"), "66.67", "{dom}");
    assert_eq!(element_text(&dom, "v-bytehit"), "66.67", "{dom}");
    for id in [
        "v-rps",
        "v-p50",
        "v-p99",
        "v-active",
        "v-mem",
        "v-disk",
        "v-uperr",
        "v-upwait",
        "v-bytehit",
        "v-queue",
        "v-idle",
    ] {
        let v = element_text(&dom, id);
        assert!(v.parse::<f64>().is_ok(), "{id} = {v:?}");
    }
    // Nothing waits in the connection queue, nor for an origin connection.
    assert_eq!(element_text(&dom, "v-queue"), "0.00");
    assert_eq!(element_text(&dom, "v-upwait"), "0.00");
    // 12 proxied requests, plus whatever the browser asked for itself (/favicon.ico).
    let status = element_text(&dom, "status");
    let requests: u64 = status
        .split(" requests")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("status {status:?}"));
    assert!(
        status.starts_with(&format!("pid {}", p.pid())) && requests >= 12,
        "{status}"
    );
    // Every plot has its axes, units and legend, and its data fills it.
    let report = layout_report(&dom);
    let mut ids: Vec<&str> = report.keys().map(String::as_str).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["conn", "hit", "lat", "rps", "uperr", "upwait", "use"], "plots");
    for (id, plot) in &report {
        assert_plot_layout(id, plot, true);
    }
    // Without [auth] the user cache tile is hidden.
    assert!(is_hidden(&dom, "card-auth"), "user cache tile shown without [auth]");
    assert!(is_hidden(&dom, "card-array"), "array tile shown without [array]");
    // The page itself names no external asset.
    let page = parse_response(
        &raw_request(
            p.addr(),
            format!(
                "GET /.dashboard HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                p.addr()
            )
            .as_bytes(),
        )
        .await,
    )
    .body_str();
    assert!(
        !page.contains("http://") && !page.contains("https://") && !page.contains("src="),
        "external asset"
    );
}

/// `Proxy-Authorization: Basic ...` for `user:password`.
fn basic(user: &str, pw: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    )
}

/// A request through the proxy as `user`; its status.
async fn get_as(proxy: std::net::SocketAddr, origin: &str, user: &str) -> u16 {
    let req = format!(
        "GET {origin}/a HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {}\r\nConnection: close\r\n\r\n",
        basic(user, &format!("pw-{user}"))
    );
    parse_response(&raw_request(proxy, req.as_bytes()).await).status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_the_user_cache_when_auth_is_on() {
    // A user file written by Apache's own htpasswd (APR1-MD5, its default:
    // fast to verify, so many checks fit in the page's few seconds).
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("users.htpasswd");
    for i in 0..8 {
        let flag = if i == 0 { "-cbm" } else { "-bm" };
        let out = std::process::Command::new("htpasswd")
            .args([
                flag,
                file.to_str().expect("utf-8 path"),
                &format!("u{i}"),
                &format!("pw-u{i}"),
            ])
            .output()
            .expect("htpasswd not found: install Debian package `apache2-utils` (scripts/install-test-deps does)");
        assert!(
            out.status.success(),
            "htpasswd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let o = Origin::start(|_| async { Response::ok("hello") }).await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[log]\naccess = \"\"\n\n\
         [cache]\nenabled = false\n\n[auth]\nhtpasswd = \"{}\"\nrequired = true\nmax_users = 3\n",
        free_addr(),
        file.display()
    ))
    .await;
    // 8 users through a cache of 3: 8 misses, 5 evictions; u7 again: a hit.
    for i in 0..8 {
        assert_eq!(get_as(p.addr(), &o.url(), &format!("u{i}")).await, 200);
    }
    assert_eq!(get_as(p.addr(), &o.url(), "u7").await, 200);
    // Logins go on while the browser polls, so the rates and the
    // directory latency have points in every interval.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = tokio::spawn({
        let (stop, addr, origin) = (stop.clone(), p.addr(), o.url());
        async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                get_as(addr, &origin, &format!("u{}", i % 8)).await;
                i += 1;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    });
    let url = format!("http://{}/.dashboard?layout", p.addr());
    let dom = browse(url, p.dir().join("chromium-profile"), "dashboard-auth.png", 6000).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.await.expect("traffic task");
    assert!(updates(&dom) >= 3, "{dom}");
    assert!(!is_hidden(&dom, "card-auth"), "user cache tile hidden with [auth]");
    // Entries against the maximum: the cache is full.
    assert_eq!(element_text(&dom, "v-auth-users"), "3");
    assert_eq!(element_text(&dom, "v-auth-max"), "3");
    let checks: u64 = element_text(&dom, "v-auth-checks").parse().expect("checks");
    assert!(checks >= 8, "checks {checks}");
    let mean: f64 = element_text(&dom, "v-auth-mean").parse().expect("mean check time");
    assert!(mean > 0.0, "mean check time {mean}");
    for id in ["v-auth-hits", "v-auth-misses", "v-auth-evictions"] {
        let v = element_text(&dom, id);
        assert!(v.parse::<f64>().is_ok(), "{id} = {v:?}");
    }
    let report = layout_report(&dom);
    assert_plot_layout("authrate", &report["authrate"], true);
    assert_plot_layout("authlat", &report["authlat"], false);
}

/// Minutes since midnight of an `HH:MM` tick label.
fn minutes(label: &str) -> i64 {
    let (h, m) = label.split_once(':').unwrap_or_else(|| panic!("tick {label:?}"));
    h.parse::<i64>().expect("hour") * 60 + m.parse::<i64>().expect("minute")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_plots_keep_five_minutes_and_scroll() {
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[log]\naccess = \"\"\n",
        free_addr()
    ))
    .await;
    // 7 minutes of the page's (virtual) time: 420 polls, in about 20 s.
    let url = format!("http://{}/.dashboard?layout", p.addr());
    let profile = p.dir().join("chromium-profile");
    let dump =
        tokio::task::spawn_blocking(move || chromium(&["--dump-dom", "--virtual-time-budget=420000", &url], &profile))
            .await
            .expect("chromium task");
    assert!(
        dump.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dom = String::from_utf8_lossy(&dump.stdout);
    assert!(updates(&dom) >= 360, "updates {}", updates(&dom));
    for (id, plot) in &layout_report(&dom) {
        // Still filled after the window started scrolling ...
        assert_plot_layout(id, plot, true);
        // ... and the time axis covers the last 5 minutes, not the 7 since
        // the page opened: ticks on whole minutes, at most 5 apart.
        let ticks: Vec<i64> = plot["xticks"]
            .as_array()
            .expect("xticks")
            .iter()
            .map(|t| minutes(t.as_str().expect("tick label")))
            .collect();
        let span = (ticks[ticks.len() - 1] - ticks[0]).rem_euclid(24 * 60);
        assert!((2..=5).contains(&span), "{id}: time axis ticks {ticks:?}");
    }
}

/// The `<tr>` of array member `name` in the dumped DOM, as written.
fn member_row<'a>(dom: &'a str, name: &str) -> &'a str {
    let at = dom
        .find(&format!("data-member=\"{name}\""))
        .unwrap_or_else(|| panic!("no row for member {name}\n{dom}"));
    let end = at + dom[at..].find("</tr>").expect("row end");
    &dom[at..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_the_array_members_their_state_and_the_duplicate_rate() {
    let o = Origin::start(|_| async { Response::ok("hello").header("Cache-Control", "max-age=600") }).await;
    let port = free_port();
    let (me, gone) = (format!("127.0.0.11:{port}"), format!("127.0.0.12:{port}"));
    // The other member never answers: the probe marks it down, and this
    // node serves its URLs itself, each counted as a duplicate.
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{me}\"\nmode = \"forward\"\n\n[log]\naccess = \"\"\n\n\
         [array]\nself = \"{me}\"\nprobe_interval = \"100ms\"\ndown_time = \"30s\"\nmembers = [\n\
           {{ address = \"{me}\", name = \"alpha\" }},\n  {{ address = \"{gone}\", name = \"beta\" }},\n]\n"
    ))
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    for i in 0..40 {
        let req = format!("GET {}/d{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", o.url());
        assert_eq!(parse_response(&raw_request(p.addr(), req.as_bytes()).await).status, 200);
    }
    let url = format!("http://{}/.dashboard?layout", p.addr());
    let dom = browse(url, p.dir().join("chromium-profile"), "dashboard-array.png", 4000).await;
    assert!(updates(&dom) >= 2, "{dom}");
    assert!(!is_hidden(&dom, "card-array"), "array tile hidden with [array]");
    let alpha = member_row(&dom, "alpha");
    assert!(
        alpha.contains("class=\"up\"") && alpha.contains(&format!("<td>{me}</td>")),
        "{alpha}"
    );
    let beta = member_row(&dom, "beta");
    assert!(
        beta.contains("class=\"down\"") && beta.contains("<td>down</td>"),
        "{beta}"
    );
    // Of 40 URLs, beta owns some (about half): served here for it.
    let rate: f64 = element_text(&dom, "v-array-dup").parse().expect("duplicate rate");
    assert!(rate > 10.0 && rate < 90.0, "duplicate rate {rate} %");
    assert_plot_layout("arrayrate", &layout_report(&dom)["arrayrate"], false);
}

/// One `openssl s_client` connection to a TLS port (SNI www.test), reading
/// its session from `sess_in` if given and saving the one it ends with.
fn tls_visit(port: u16, sess: &std::path::Path, resume: bool) {
    let connect = format!("127.0.0.1:{port}");
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["s_client", "-connect", &connect, "-servername", "www.test", "-tls1_2"]);
    cmd.arg(if resume { "-sess_in" } else { "-sess_out" }).arg(sess);
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl not found: install Debian package `openssl` (scripts/install-test-deps does)");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("TLSv1.2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_tls_handshakes_and_resumption_once_a_tls_listener_is_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = rcgen::KeyPair::generate().expect("key pair");
    let cert = rcgen::CertificateParams::new(vec!["www.test".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let (cert_file, key_file) = (dir.path().join("www.pem"), dir.path().join("www.key"));
    std::fs::write(&cert_file, cert.pem()).expect("write certificate");
    std::fs::write(&key_file, key.serialize_pem()).expect("write key");
    let tls_addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[[listener]]\naddress = \"{tls_addr}\"\nmode = \"forward\"\n\n\
         [[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n\n[log]\naccess = \"\"\n",
        free_addr(),
        cert_file.display(),
        key_file.display()
    ))
    .await;
    let port: u16 = tls_addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("port");
    // One full handshake, then resumed ones while the browser polls.
    let sess = dir.path().join("session.pem");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = tokio::task::spawn_blocking({
        let (stop, sess) = (stop.clone(), sess.clone());
        move || {
            tls_visit(port, &sess, false);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tls_visit(port, &sess, true);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    });
    let url = format!("http://{}/.dashboard?layout", p.addr());
    let dom = browse(url, p.dir().join("chromium-profile"), "dashboard-tls.png", 6000).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.await.expect("traffic task");
    assert!(updates(&dom) >= 3, "{dom}");
    assert!(!is_hidden(&dom, "card-tls"), "TLS tile hidden after TLS handshakes");
    let ratio: f64 = element_text(&dom, "v-tls-ratio").parse().expect("resumed percent");
    assert!(ratio > 50.0, "resumed {ratio}%");
    let cache = element_text(&dom, "v-tls-cache");
    assert!(cache.contains("/10000"), "{cache}");
    let tickets = element_text(&dom, "v-tls-tickets");
    assert!(tickets.contains("issued") && tickets.contains("0 refused"), "{tickets}");
    for id in ["v-tls-full", "v-tls-resumed", "v-tls-failed", "v-tls-entries"] {
        let v = element_text(&dom, id);
        assert!(v.parse::<f64>().is_ok(), "{id} = {v:?}");
    }
    let report = layout_report(&dom);
    assert_plot_layout("tlsrate", &report["tlsrate"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_requests_waiting_for_an_origin_connection() {
    // One place at the origin, which holds every request 12 s: one request
    // in hand, two waiting while the browser polls.
    let o = Origin::start(|_| async move {
        tokio::time::sleep(std::time::Duration::from_secs(12)).await;
        Response::ok("late")
    })
    .await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[origin]\nmax_connections = 1\nqueue_timeout = \"30s\"\n\n[log]\naccess = \"\"\n",
        free_addr()
    ))
    .await;
    let clients: Vec<_> = (0..3)
        .map(|i| {
            let (proxy, url) = (p.addr(), o.url());
            tokio::spawn(async move {
                let req = format!("GET {url}/w{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                raw_request_timeout(proxy, req.as_bytes(), std::time::Duration::from_secs(40)).await
            })
        })
        .collect();
    assert!(o.wait_count(1, std::time::Duration::from_secs(5)).await);
    let url = format!("http://{}/.dashboard?layout", p.addr());
    let dom = browse(url, p.dir().join("chromium-profile"), "dashboard-upstream.png", 5000).await;
    assert!(updates(&dom) >= 3, "{dom}");
    assert_eq!(
        element_text(&dom, "v-upwait"),
        "2.00",
        "two requests wait for the origin's one place"
    );
    let report = layout_report(&dom);
    assert_plot_layout("upwait", &report["upwait"], true);
    for c in clients {
        c.abort();
    }
}
