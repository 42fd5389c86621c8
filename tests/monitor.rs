//! Monitoring end to end: the real binary, known traffic, then every view
//! (perfdump, stats-xml, Prometheus, JSON, /nsc, the dashboard, `portico
//! stats`) checked for the numbers that traffic must produce, plus
//! promtool on /metrics, admin-only access, moved and disabled endpoints,
//! and the tuning advice the server can be driven into.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

/// A forward proxy with a cache; `more` is extra TOML.
async fn proxy(more: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"64MiB\"\n\n{more}"
    ))
    .await
}

/// An origin answering `"<path> #n"` with `Cache-Control: <cc>`.
async fn origin(cc: &'static str) -> Origin {
    let n = Arc::new(AtomicUsize::new(0));
    Origin::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Response::ok(format!("{} #{n}", req.uri.path())).header("Cache-Control", cc) }
    })
    .await
}

async fn get_via(p: &Portico, url: &str) -> ParsedResponse {
    let req = format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

/// A monitoring page in origin form.
async fn page(p: &Portico, path: &str) -> ParsedResponse {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", p.addr());
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

async fn text(p: &Portico, path: &str) -> String {
    let r = page(p, path).await;
    assert_eq!(r.status, 200, "{path}: {}", r.body_str());
    r.body_str()
}

/// 5 URLs fetched 3 times each: 5 misses, 10 hits.
async fn ten_hits_five_misses(p: &Portico, o: &Origin) {
    for round in 0..3 {
        for i in 0..5 {
            let r = get_via(p, &format!("{}/obj{i}", o.url())).await;
            assert_eq!(r.status, 200);
            let want = if round == 0 { "MISS" } else { "HIT" };
            assert_eq!(r.header("x-cache"), Some(want), "round {round} obj{i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_hits_five_misses_show_66_67_percent_on_every_view() {
    let o = origin("max-age=600").await;
    let p = proxy("").await;
    ten_hits_five_misses(&p, &o).await;
    assert_eq!(o.count(), 5);

    let perf = text(&p, "/.perf").await;
    assert!(perf.contains("Cache Hit Ratio              10/15 ( 66.67%)"), "{perf}");
    // Every body is 8 bytes ("/objN #1"): 80 served from the cache, 40 fetched.
    assert!(perf.contains("Byte Hit Ratio               80/120 ( 66.67%)"), "{perf}");
    for section in [
        "ConnectionQueue:",
        "ListenSocket ls1:",
        "KeepAliveInfo:",
        "SessionCreationInfo:",
        "CacheInfo:",
        "Native pools:",
        "DNSCacheInfo:",
        "TuningAdvice:",
        "Performance Counters:",
    ] {
        assert!(perf.contains(section), "{section} missing\n{perf}");
    }
    assert!(
        perf.contains(&format!("Address                  http://{}", p.addr())),
        "{perf}"
    );
    // 15 proxied requests, timed into the default bucket; the monitoring
    // pages themselves are not counted.
    assert!(
        perf.contains("Total number of requests:                             15"),
        "{perf}"
    );
    assert!(perf.contains("By Cache Status              HIT 10, MISS 5"), "{perf}");
    // The performance buckets come last: no other section after them.
    let buckets_at = perf.find("Performance Counters:").unwrap();
    for section in ["KeepAliveInfo:", "CacheInfo:", "DNSCacheInfo:", "TuningAdvice:"] {
        assert!(perf.find(section).unwrap() < buckets_at, "{section} after the buckets");
    }
    assert!(perf[buckets_at..].contains("default-bucket (Default bucket)"));
    for stage in [
        "access-check",
        "route",
        "cache-lookup",
        "upstream-response",
        "send-to-client",
        "log",
    ] {
        assert!(perf[buckets_at..].contains(stage), "{stage}\n{perf}");
    }

    let xml = text(&p, "/stats-xml").await;
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert!(xml.contains("<cache-bucket ") && xml.contains("countHits=\"10\"") && xml.contains("countMisses=\"5\""));
    assert!(xml.contains("percentHitRatio=\"66.67\""), "{xml}");
    assert!(
        xml.contains("countCacheHit=\"10\"") && xml.contains("countCacheMiss=\"5\""),
        "{xml}"
    );

    let metrics = text(&p, "/metrics").await;
    assert!(metrics.contains("portico_cache_hits_total 10\n"), "{metrics}");
    assert!(metrics.contains("portico_cache_lookups_total 15\n"));
    assert!(metrics.contains("portico_cache_hit_ratio 0.6667\n"));
    assert!(metrics.contains("portico_cache_requests_total{cache=\"HIT\"} 10\n"));
    assert!(metrics.contains("portico_requests_total{method=\"GET\"} 15\n"));
    assert!(metrics.contains("portico_response_seconds_count 15\n"));
    promtool_check(&metrics);

    let json: serde_json::Value = serde_json::from_str(&text(&p, "/.stats.json").await).expect("JSON");
    let ratio = json["derived"]["hit_ratio"].as_f64().expect("hit_ratio");
    assert!((ratio - 66.6667).abs() < 0.001, "{ratio}");
    assert_eq!(json["snapshot"]["cache"]["hits"], 10);
    assert_eq!(json["snapshot"]["requests"]["total"], 15);
    assert_eq!(json["derived"]["requests"], 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_xml_filters_drop_elements() {
    let p = proxy("").await;
    let all = text(&p, "/stats-xml").await;
    for el in [
        "<process ",
        "<thread ",
        "<request-bucket ",
        "<cache-bucket ",
        "<keepalive-bucket ",
        "<host-dns-bucket ",
        "<profile ",
    ] {
        assert!(all.contains(el), "{el}\n{all}");
    }
    let some = text(&p, "/stats-xml?thread=0&cache-bucket=0").await;
    assert!(!some.contains("<thread ") && !some.contains("<request-bucket ") && !some.contains("<cache-bucket "));
    assert!(
        some.contains("<process ") && some.contains("<keepalive-bucket "),
        "{some}"
    );
    let none = text(&p, "/stats-xml?process=0").await;
    assert!(!none.contains("<process ") && !none.contains("<keepalive-bucket "));
    assert!(none.contains("</stats>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_answer_only_admin_clients() {
    // Only 10.0.0.0/8 may administer: this loopback client is refused.
    let p = proxy("[access]\nadmin_allow = [\"10.0.0.0/8\"]\n").await;
    for path in [
        "/.perf",
        "/stats-xml",
        "/metrics",
        "/nsc",
        "/.dashboard",
        "/.stats.json",
    ] {
        let r = page(&p, path).await;
        assert_eq!(r.status, 403, "{path}");
        assert!(r.body_str().contains("admin_allow"), "{path}");
    }
    // /nsc?stop from a refused client changes nothing.
    page(&p, "/nsc?stop").await;
    let o = origin("max-age=600").await;
    get_via(&p, &format!("{}/a", o.url())).await;
    assert_eq!(
        get_via(&p, &format!("{}/a", o.url())).await.header("x-cache"),
        Some("HIT")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_move_disable_and_answer_absolute_form_to_own_address() {
    let p = proxy("[monitor]\nperf = \"/admin/perf\"\nmetrics = \"\"\n").await;
    assert!(text(&p, "/admin/perf?refresh=5").await.contains("ConnectionQueue:"));
    assert_eq!(page(&p, "/admin/perf?refresh=5").await.header("refresh"), Some("5"));
    // The old path and the disabled one are ordinary requests now: origin
    // form on a forward listener is refused.
    assert_eq!(page(&p, "/.perf").await.status, 400);
    assert_eq!(page(&p, "/metrics").await.status, 400);
    // Absolute form naming the listener itself is answered here...
    let own = get_via(&p, &format!("http://{}/stats-xml", p.addr())).await;
    assert_eq!(own.status, 200);
    assert!(own.body_str().contains("<stats "));
    // ...while another host's path of the same name is proxied.
    let o = Origin::start(|_| async { Response::ok("the origin's page") }).await;
    let other = get_via(&p, &format!("{}/admin/perf", o.url())).await;
    assert_eq!(other.body_str(), "the origin's page");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsc_lists_stops_starts_and_restarts_the_cache() {
    let o = origin("max-age=600").await;
    let p = proxy("").await;
    get_via(&p, &format!("{}/one", o.url())).await;
    get_via(&p, &format!("{}/two", o.url())).await;
    let page1 = text(&p, "/nsc?list").await;
    assert!(page1.contains("The cache is enabled."), "{page1}");
    assert!(
        page1.contains("Number of cached entries = 2 in memory, 2 on disk"),
        "{page1}"
    );
    assert!(page1.contains("Parameter settings") && page1.contains("MaxObjectSize: "));
    // The replacement policy in effect, as the config spells it (the default).
    assert!(page1.contains("\nReplacement: frequency\n"), "{page1}");
    let line = page1
        .lines()
        .find(|l| l.ends_with(&format!("{}/one", o.url())))
        .unwrap_or_else(|| panic!("no listing line\n{page1}"));
    assert!(line.starts_with("CF "), "{line}");
    assert_eq!(page(&p, "/nsc?refresh=7").await.header("refresh"), Some("7"));

    assert!(text(&p, "/nsc?stop").await.contains("The cache was stopped"));
    let bypass = get_via(&p, &format!("{}/one", o.url())).await;
    assert_eq!(bypass.header("x-cache"), None, "a stopped cache is bypassed");
    assert_eq!(bypass.body_str(), "/one #3");
    assert!(text(&p, "/nsc").await.contains("The cache is stopped"));

    assert!(text(&p, "/nsc?start").await.contains("The cache was started."));
    assert_eq!(
        get_via(&p, &format!("{}/one", o.url())).await.header("x-cache"),
        Some("HIT")
    );

    let restarted = text(&p, "/nsc?restart").await;
    assert!(restarted.contains("2 objects dropped from memory"), "{restarted}");
    assert!(restarted.contains("= 0 in memory, 2 on disk"), "{restarted}");
    // Still served from the disk tier.
    assert_eq!(
        get_via(&p, &format!("{}/two", o.url())).await.header("x-cache"),
        Some("HIT")
    );
}

/// `/nsc?stop`, `?start` and `?restart` are refused (403) when a browser
/// says another site's page asked for them (Fetch Metadata's
/// `Sec-Fetch-Site: cross-site`, or an `Origin` naming another host): an
/// `<img>` on any page an administrator opened stopped the cache. Typed in
/// the address bar, same-origin, or from a tool, they still act.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsc_actions_asked_by_another_sites_page_are_refused() {
    let p = proxy("").await;
    let host = p.addr().to_string();
    let ask = |path: &'static str, extra: String| {
        let (addr, host) = (p.addr(), host.clone());
        async move {
            let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
            parse_response(&raw_request(addr, req.as_bytes()).await)
        }
    };
    for extra in [
        "Sec-Fetch-Site: cross-site\r\n".to_string(),
        "Sec-Fetch-Site: same-site\r\n".to_string(),
        "Origin: http://evil.example\r\n".to_string(),
        "Origin: null\r\n".to_string(),
    ] {
        for path in ["/nsc?stop", "/nsc?restart"] {
            let r = ask(path, extra.clone()).await;
            assert_eq!(r.status, 403, "{path} {extra}: {}", r.body_str());
        }
    }
    assert!(text(&p, "/nsc").await.contains("The cache is enabled."));
    assert_eq!(metric(&p, "portico_cache_running").await, 1);
    // Reading the pages is not an action.
    assert_eq!(
        ask("/nsc?list", "Sec-Fetch-Site: cross-site\r\n".into()).await.status,
        200
    );
    // From the address bar, the same origin, or a tool: done.
    let r = ask("/nsc?stop", "Sec-Fetch-Site: none\r\n".into()).await;
    assert!(r.body_str().contains("The cache was stopped"), "{}", r.body_str());
    let r = ask("/nsc?start", format!("Origin: http://{host}\r\n")).await;
    assert!(r.body_str().contains("The cache was started."), "{}", r.body_str());
}

/// A browser's request for the pages must name an address, `localhost`,
/// the machine's name or one of `monitor.hosts` in `Host`: a page whose
/// name its owner pointed at 127.0.0.1 (DNS rebinding) read `/nsc?list`,
/// every cached URL with its query string, from an administrator's
/// browser. Tools, which send no Fetch Metadata, may use any name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_answer_only_to_host_names_they_know() {
    let p = proxy("[monitor]\nhosts = [\"proxy.test\"]\n").await;
    let port = p.addr().port();
    let ask = |host: String| {
        let addr = p.addr();
        async move {
            let req = format!(
                "GET /nsc?list HTTP/1.1\r\nHost: {host}\r\nSec-Fetch-Site: same-origin\r\nConnection: close\r\n\r\n"
            );
            parse_response(&raw_request(addr, req.as_bytes()).await).status
        }
    };
    assert_eq!(ask(format!("rebind.evil.example:{port}")).await, 403);
    assert_eq!(ask("rebind.evil.example".into()).await, 403);
    for ok in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("PROXY.test:{port}"),
        "proxy.test.".into(),
    ] {
        assert_eq!(ask(ok.clone()).await, 200, "{ok}");
    }
    // A tool (no Fetch Metadata) may use any name.
    let req = format!("GET /nsc?list HTTP/1.1\r\nHost: proxy.other:{port}\r\nConnection: close\r\n\r\n");
    assert_eq!(parse_response(&raw_request(p.addr(), req.as_bytes()).await).status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_name_their_performance_bucket() {
    let o = origin("no-store").await;
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"reverse\"\n\n\
         [[upstream]]\nname = \"o\"\nservers = [\"{}\"]\n\n\
         [[rule]]\npath = \"/api/\"\nupstream = \"o\"\nbucket = \"api-bucket\"\n\n\
         [[rule]]\nupstream = \"o\"\n\n\
         [log]\naccess = \"\"\n[cache]\ndir = \"{{dir}}/cache\"\n",
        o.addr()
    ))
    .await;
    for path in ["/api/1", "/api/2", "/api/3", "/other"] {
        let r = page(&p, path).await;
        assert_eq!(r.status, 200, "{path}");
    }
    let perf = text(&p, "/.perf").await;
    let at = perf
        .find("api-bucket (requests routed to bucket api-bucket)")
        .expect(&perf);
    let section = &perf[at..];
    assert!(
        section.contains("Number of Requests:                                    3    ( 75.00%)"),
        "{section}"
    );
    let default_at = perf.find("default-bucket (Default bucket)").expect("default bucket");
    assert!(perf[default_at..].contains("Number of Requests:                                    1    ( 25.00%)"));
    let metrics = text(&p, "/metrics").await;
    assert!(
        metrics.contains("portico_bucket_requests_total{bucket=\"api-bucket\"} 3\n"),
        "{metrics}"
    );
    assert!(metrics.contains("portico_stage_invocations_total{bucket=\"api-bucket\",stage=\"upstream-response\"} 3\n"));
    promtool_check(&metrics);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_off_keeps_counters_and_skips_timing() {
    let o = origin("max-age=600").await;
    let p = proxy("[monitor]\nenabled = false\n").await;
    ten_hits_five_misses(&p, &o).await;
    let perf = text(&p, "/.perf").await;
    assert!(perf.contains("10/15 ( 66.67%)"), "{perf}");
    assert!(perf.contains("(disabled: monitor.enabled = false)"), "{perf}");
    let metrics = text(&p, "/metrics").await;
    assert!(metrics.contains("portico_requests_total{method=\"GET\"} 15\n"));
    assert!(metrics.contains("portico_response_seconds_count 0\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_hit_ratio_advice_on_perf_json_and_portico_stats() {
    let o = origin("no-store").await;
    let p = proxy("").await;
    let quiet = text(&p, "/.perf").await;
    // Nothing to advise on an idle server with the defaults (the default
    // listen_queue is not above a default kernel's somaxconn).
    let advice: Vec<&str> = quiet.lines().filter(|l| l.starts_with('[')).collect();
    assert!(advice.is_empty(), "{quiet}");
    for i in 0..25 {
        get_via(&p, &format!("{}/u{i}", o.url())).await;
    }
    let perf = text(&p, "/.perf").await;
    assert!(
        perf.contains("[low-cache-hit-ratio] Cache hit ratio is 0/25 (0.00%)"),
        "{perf}"
    );
    let json: serde_json::Value = serde_json::from_str(&text(&p, "/.stats.json").await).unwrap();
    assert_eq!(json["advice"][0]["rule"], "low-cache-hit-ratio");

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["stats", "--addr", &p.addr().to_string()])
        .output()
        .await
        .expect("run portico stats");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("ConnectionQueue:") && stdout.contains("[low-cache-hit-ratio]"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portico_stats_reports_a_refusal_and_no_server() {
    let p = proxy("[access]\nadmin_allow = [\"10.0.0.0/8\"]\n").await;
    let run = |addr: String| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
            .args(["stats", "--addr", &addr])
            .output()
            .await
            .expect("run portico stats")
    };
    let refused = run(p.addr().to_string()).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("admin_allow"));
    let nobody = run(dead_addr()).await;
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("no server answering"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_error_advice() {
    let p = proxy("").await;
    let dead = dead_addr();
    for i in 0..20 {
        assert_eq!(get_via(&p, &format!("http://{dead}/x{i}")).await.status, 502);
    }
    let perf = text(&p, "/.perf").await;
    // Refused connections: the origin is down, not a timeout to raise.
    let advice = perf
        .lines()
        .find(|l| {
            l.starts_with("[upstream-refused] 20 of 20 requests to origins (100.0%) failed: the connection was refused")
        })
        .unwrap_or_else(|| panic!("no refused-origin advice in {perf}"));
    assert!(advice.contains("The origin is down"), "{advice}");
    assert!(!advice.contains("timeout"), "{advice}");
    let metrics = text(&p, "/metrics").await;
    assert!(
        metrics.contains("portico_upstream_errors_total{kind=\"refused\"} 20\n"),
        "{metrics}"
    );
    assert!(metrics.contains("portico_responses_total{code=\"5xx\"} 20\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_watermark_advice() {
    // 40 KiB objects into a 256 KiB disk tier: GC must evict.
    let body = "x".repeat(40 << 10);
    let o = Origin::start(move |_| {
        let b = body.clone();
        async move { Response::ok(b).header("Cache-Control", "max-age=600") }
    })
    .await;
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\ndisk = \"256KiB\"\n"
    ))
    .await;
    for i in 0..20 {
        assert_eq!(get_via(&p, &format!("{}/big{i}", o.url())).await.status, 200);
    }
    let mut perf = String::new();
    for _ in 0..50 {
        perf = text(&p, "/.perf").await;
        if perf.contains("[disk-near-watermark]") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        perf.contains("[disk-near-watermark] The disk cache reached its high watermark"),
        "{perf}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_hits_and_per_listener_requests_are_counted() {
    let o = origin("no-store").await;
    let p = proxy("").await;
    let mut c = RawClient::connect(p.addr()).await;
    for i in 0..3 {
        c.send(format!("GET {}/k{i} HTTP/1.1\r\nHost: x\r\n\r\n", o.url()).as_bytes())
            .await;
        assert_eq!(c.read_response().await.status, 200);
    }
    let perf = text(&p, "/.perf").await;
    assert!(perf.contains("KeepAliveHits        2\n"), "{perf}");
    assert!(perf.contains("Requests                 3\n"), "{perf}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_cache_entries_and_hit_ratio() {
    // The origin closes every connection, so each request opens a new one
    // and looks `localhost` up: the first from the resolver, then cached.
    let o = Origin::start(|_| async { Response::ok("d").header("Connection", "close") }).await;
    let p = proxy("").await;
    for i in 0..3 {
        let r = get_via(&p, &format!("http://localhost:{}/n{i}", o.addr().port())).await;
        assert_eq!(r.status, 200, "{}", r.body_str());
    }
    let perf = text(&p, "/.perf").await;
    assert!(perf.contains("CacheEntries     1/1024\n"), "{perf}");
    assert!(perf.contains("HitRatio         2/3 ( 66.67%)\n"), "{perf}");
    let xml = text(&p, "/stats-xml").await;
    assert!(xml.contains("countCacheHits=\"2\" countCacheMisses=\"1\""), "{xml}");
    let metrics = text(&p, "/metrics").await;
    assert!(metrics.contains("portico_dns_lookups_total 3\n") && metrics.contains("portico_dns_cache_hits_total 2\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_dns_hit_ratio_advice() {
    // Two names for this host alternate through a one-entry DNS cache:
    // each lookup evicts the other name, so nothing is ever a hit.
    let o = Origin::start(|_| async { Response::ok("d").header("Connection", "close") }).await;
    let p = proxy("[origin]\ndns_cache_entries = 1\n").await;
    let port = o.addr().port();
    for i in 0..12 {
        for host in ["localhost", "localhost."] {
            let r = get_via(&p, &format!("http://{host}:{port}/n{i}")).await;
            assert_eq!(r.status, 200, "{host}: {}", r.body_str());
        }
    }
    let perf = text(&p, "/.perf").await;
    assert!(
        perf.contains("[low-dns-hit-ratio] DNS cache hit ratio is 0/24 (0.00%) with 1/1 entries. The cache is full"),
        "{perf}"
    );
}

/// Polls /.perf until it contains `needle` (5 s at most).
async fn perf_when(p: &Portico, needle: &str) -> String {
    let mut perf = String::new();
    for _ in 0..100 {
        perf = text(p, "/.perf").await;
        if perf.contains(needle) {
            return perf;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/.perf never showed {needle:?}\n{perf}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_at_its_limit_and_max_requests_reached_advice() {
    // The origin holds every response until the test releases it.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let arrived = Arc::new(AtomicUsize::new(0));
    let (g, a) = (gate.clone(), arrived.clone());
    let o = Origin::start(move |_| {
        let (g, a) = (g.clone(), a.clone());
        async move {
            a.fetch_add(1, Ordering::SeqCst);
            if let Ok(p) = g.acquire().await {
                p.forget();
            }
            Response::ok("slow")
        }
    })
    .await;
    let p = proxy("[server]\nmax_requests = 1\nqueue_size = 1\n").await;
    let addr = p.addr();
    let slow = |path: &'static str| {
        let req = format!("GET {}{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", o.url());
        tokio::spawn(async move { raw_request_timeout(addr, req.as_bytes(), Duration::from_secs(30)).await })
    };
    let first = slow("/in-service");
    while arrived.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = slow("/queued");
    // Readable while saturated: the monitoring pages bypass admission.
    let queue = |v: &str| format!("{:<40} {v}\n", "Current/Peak/Limit Queue Length");
    perf_when(&p, &queue("1/1/1")).await;
    assert_eq!(get_via(&p, &format!("{}/overflow", o.url())).await.status, 503);
    gate.add_permits(2);
    for t in [first, second] {
        assert_eq!(parse_response(&t.await.expect("join")).status, 200);
    }
    let perf = perf_when(&p, &queue("0/1/1")).await;
    assert!(
        perf.contains(&format!("{:<40} 1\n", "Connections Overflowed")),
        "{perf}"
    );
    assert!(perf.contains("Peak/Limit Sessions          1/1\n"), "{perf}");
    assert!(
        perf.contains("[queue-near-limit] The connection queue peaked at 1/1 (100.0% of its limit) and 1 connections were refused."),
        "{perf}"
    );
    assert!(perf.contains("[max-requests-reached] 1 requests waited"), "{perf}");
    let metrics = text(&p, "/metrics").await;
    assert!(
        metrics.contains("portico_connection_queue_overflows_total 1\n"),
        "{metrics}"
    );
    promtool_check(&metrics);
    let xml = text(&p, "/stats-xml").await;
    assert!(
        xml.contains("<connection-queue-bucket ") && xml.contains("countOverflows=\"1\""),
        "{xml}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_flushes_and_refusals_advice() {
    let o = Origin::start(|_| async { Response::ok("k") }).await;
    let p = proxy("[keepalive]\nmax_connections = 1\n").await;
    // Three connections each go idle in turn; the set holds one, so the
    // second and third flush the one before: 2 flushes, 0 hits.
    let mut clients = Vec::new();
    for i in 0..3 {
        let mut c = RawClient::connect(p.addr()).await;
        c.send(format!("GET {}/f{i} HTTP/1.1\r\nHost: x\r\n\r\n", o.url()).as_bytes())
            .await;
        assert_eq!(c.read_response().await.status, 200);
        clients.push(c);
        perf_when(&p, "KeepAliveCount       1/1\n").await;
    }
    let perf = perf_when(&p, "KeepAliveFlushes     2\n").await;
    assert!(
        perf.contains("[keepalive-flushes] Keep-alive flushes (2) exceed keep-alive hits (0)"),
        "{perf}"
    );
    // A client that asks to close is a refusal, whatever the set holds:
    // no reason to raise keepalive.max_connections.
    get_via(&p, &format!("{}/closing", o.url())).await;
    let perf = perf_when(&p, "KeepAliveRefusals    1\n").await;
    assert!(!perf.contains("[keepalive-refusals]"), "{perf}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnels_are_counted_but_not_timed() {
    let o = Origin::start(|_| async { Response::ok("t") }).await;
    let port = o.addr().port();
    let p = proxy(&format!("[proxy]\nconnect_ports = [{port}]\n")).await;
    let mut c = RawClient::connect(p.addr()).await;
    c.send(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())
        .await;
    let head = c.read_head_response().await;
    assert_eq!(head.status, 200);
    drop(c);
    let perf = perf_when(&p, "By Method                    CONNECT 1\n").await;
    assert!(
        perf.contains("Total number of requests:                              0\n"),
        "{perf}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_survive_a_reload_and_name_the_worker() {
    let o = origin("max-age=600").await;
    let addr = free_addr();
    let text_of = |cap: &str| {
        format!(
            "[server]\nprocesses = 2\n\n[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
             [log]\naccess = \"\"\n\n[cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\nmax_ttl = \"{cap}\"\n"
        )
    };
    let p = Portico::start(&text_of("1h")).await;
    // Each worker process keeps its own statistics: a page names its worker.
    let perf = text(&p, "/.perf").await;
    assert!(perf.lines().next().is_some_and(|l| l.contains(", worker ")), "{perf}");
    let xml = text(&p, "/stats-xml").await;
    assert!(xml.contains("workerIndex=\""), "{xml}");

    // One worker, for the reload part: its counters outlive a SIGHUP.
    drop(p);
    let addr = free_addr();
    let single = |cap: &str| {
        format!(
            "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"\"\n\n\
             [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\nmax_ttl = \"{cap}\"\n"
        )
    };
    let p = Portico::start(&single("1h")).await;
    ten_hits_five_misses(&p, &o).await;
    p.rewrite_config(&single("2h"));
    p.signal(libc::SIGHUP);
    let perf = perf_when(&p, "Maximum Age                  7200\n").await;
    assert!(perf.contains("Cache Hit Ratio              10/15 ( 66.67%)"), "{perf}");
    assert!(
        perf.contains("Total number of requests:                             15"),
        "{perf}"
    );
}
