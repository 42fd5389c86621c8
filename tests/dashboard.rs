//! The live dashboard in a real browser: headless Chromium (Debian) loads
//! the page from the binary, lets it poll the JSON endpoint, and the DOM it
//! leaves must hold the numbers the known traffic produced. A screenshot is
//! saved as target/dashboard.png for a person to look at.

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
            "--window-size=1280,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium not found: install Debian package `chromium` (.ci/run does)")
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
    let url = format!("http://{}/.dashboard", p.addr());
    let profile = p.dir().join("chromium-profile");
    let (dump, shot) = tokio::task::spawn_blocking({
        let profile = profile.clone();
        let url = url.clone();
        move || {
            let dump = chromium(&["--dump-dom", "--virtual-time-budget=4000", &url], &profile);
            let png = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard.png");
            let shot = chromium(
                &[
                    &format!("--screenshot={}", png.display()),
                    "--virtual-time-budget=4000",
                    &url,
                ],
                &profile,
            );
            (dump, (shot, png))
        }
    })
    .await
    .expect("chromium task");
    let dom = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    // The page polled at least twice (so rates exist) and wrote the values.
    let updates: u32 = dom
        .split("data-updates=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no data-updates\n{dom}"));
    assert!(updates >= 2, "updates {updates}\n{dom}");
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
        "v-bytehit",
        "v-queue",
        "v-idle",
    ] {
        let v = element_text(&dom, id);
        assert!(v.parse::<f64>().is_ok(), "{id} = {v:?}");
    }
    // Nothing waits in the connection queue.
    assert_eq!(element_text(&dom, "v-queue"), "0.00");
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
