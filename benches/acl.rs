//! Cost of deciding one request with the compiled `[[acl]]` list at 10,
//! 100, 1,000 and 10,000 entries (the access-control issue: 10,000 entries
//! must cost within 5% of 10).
//!
//! Scenarios (each list also starts with three host-less entries, checked
//! for every request, as an office config's LAN and method entries are):
//! - `host`: deny entries alternating exact hosts and `*.domain`
//!   suffixes; the request matches the *last* entry (the worst case for a
//!   linear scan such as the Sun proxy's ACL files or Squid's acl lists);
//! - `mix`: entries cycle through exact host + path, wildcard + port,
//!   host + method + header, and host + time window;
//! - `miss`: the `host` list, and a request no entry matches (the common
//!   case: allowed traffic falls through to `access.acl_default`).
//!
//! - `list`: a 10-entry list plus one entry using a generated
//!   `[[acl_list]]` file of 1,000,000 domains (half written `.domain`), for
//!   a request the list does not hold (`miss`: every parent domain is
//!   looked up) and one it holds through a parent (`hit`), against the
//!   same 10 entries without the list (`none`); and `list_load`: compiling
//!   the 1,000,000-domain list (the file changed each time, so nothing is
//!   cached).
//!
//! Run: `cargo bench --bench acl`; `ACL_PAIRED=1 cargo bench --bench acl`
//! alternates 10-entry and 10,000-entry rounds in one process and prints
//! the median cost of each and their ratio (steadier on a shared machine);
//! `ACL_LIST=1 cargo bench --bench acl` does the same for the list (without
//! and with the 1,000,000-domain list) and prints the load time and the
//! resident memory the list adds.

use criterion::{BenchmarkId, Criterion, criterion_group};
use http::{HeaderMap, Method};
use portico::acl::{Acl, Request};
use portico::config::Mode;
use std::hint::black_box;
use std::time::Duration;

const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];
const SCENARIOS: [&str; 3] = ["host", "mix", "miss"];

/// Entries every list starts with: checked for every request.
const HEAD: &str = r#"
[[acl]]
action = "deny"
client = "198.51.100.0/24"
[[acl]]
action = "deny"
method = ["TRACE", "TRACK"]
[[acl]]
action = "deny"
port = [25, 465, 587]
"#;

/// The i-th entry of a scenario whose last entry is `last`, and the (host,
/// path, port, method) that matches it. Numbers are zero-padded so requests
/// are the same length at every size, and kinds are counted back from the
/// last entry so the request matches the same kind of entry at every size
/// (a wildcard in `host`, a time window in `mix`).
fn entry(scenario: &str, i: usize, last: usize) -> (String, String, String, u16, Method) {
    let k = if scenario == "mix" {
        (i + 3 * last + 3) % 4
    } else {
        (i + last + 1) % 2
    };
    match (scenario, k) {
        (_, 0) if scenario != "mix" => (
            format!("host = \"h{i:05}.example.com\""),
            format!("h{i:05}.example.com"),
            "/".into(),
            80,
            Method::GET,
        ),
        (_, 1) if scenario != "mix" => (
            format!("host = \"*.w{i:05}.example.com\""),
            format!("a.w{i:05}.example.com"),
            "/".into(),
            80,
            Method::GET,
        ),
        (_, 0) => (
            format!("host = \"h{i:05}.example.com\"\npath = [\"/private/\", \"/admin/\"]"),
            format!("h{i:05}.example.com"),
            "/admin/x?y=1".into(),
            80,
            Method::GET,
        ),
        (_, 1) => (
            format!("host = [\"*.w{i:05}.example.com\", \"w{i:05}.example.com\"]\nport = [8080, 8443]"),
            format!("a.w{i:05}.example.com"),
            "/".into(),
            8443,
            Method::GET,
        ),
        (_, 2) => (
            format!(
                "host = \"m{i:05}.example.com\"\nmethod = [\"PUT\", \"POST\"]\nheader = {{ name = \"X-T\", value = \"{i:05}\" }}"
            ),
            format!("m{i:05}.example.com"),
            "/upload".into(),
            80,
            Method::POST,
        ),
        _ => (
            format!(
                "host = \"t{i:05}.example.com\"\ntime = \"00:00-23:59\"\ndays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]"
            ),
            format!("t{i:05}.example.com"),
            "/".into(),
            80,
            Method::GET,
        ),
    }
}

/// A scenario at `n` entries: the compiled list and a request matching the last.
struct Case {
    acl: Acl,
    method: Method,
    host: String,
    path: String,
    port: u16,
    headers: HeaderMap,
    expect: Option<usize>,
}

impl Case {
    fn request(&self) -> Request<'_> {
        Request {
            client: "10.1.2.3".parse().expect("address"),
            method: &self.method,
            scheme: "http",
            host: &self.host,
            port: self.port,
            path_and_query: &self.path,
            headers: &self.headers,
            mode: Mode::Forward,
            user: None,
        }
    }
}

fn now() -> jiff::Timestamp {
    "2026-11-24T12:00:00Z".parse().expect("instant")
}

fn case(scenario: &str, n: usize) -> Case {
    let head = 3;
    let last = n - 1;
    let body: String = (head..n)
        .map(|i| format!("[[acl]]\naction = \"deny\"\n{}\n", entry(scenario, i, last).0))
        .collect();
    let text = format!("{HEAD}{body}");
    let config = portico::config::parse_str(&text, "bench.toml").expect("generated config is valid");
    let acl = Acl::compile(&config).expect("generated entries compile");
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", "bench/1".parse().expect("value"));
    let (_, host, path, port, method) = entry(scenario, last, last);
    headers.insert("x-t", format!("{last:05}").parse().expect("value"));
    let (host, expect) = match scenario {
        "miss" => ("www.allowed.example.org".to_string(), None),
        _ => (host, Some(last)),
    };
    let c = Case {
        acl,
        method,
        host,
        path,
        port,
        headers,
        expect,
    };
    let got = match c.acl.decide(&c.request(), now()) {
        portico::acl::Decision::Deny { entry, .. } => entry,
        _ => None,
    };
    assert_eq!(got, c.expect, "{scenario} {n}");
    c
}

/// Domains in the generated list.
const LIST_SIZE: usize = 1_000_000;

/// Writes the generated list to `path`, first line `# round`, so each
/// round's file differs (the ACL compile cache is keyed by the contents).
fn write_list(path: &std::path::Path, round: usize) {
    const TLDS: [&str; 5] = ["com", "net", "org", "io", "de"];
    let mut text = String::with_capacity(LIST_SIZE * 16);
    text.push_str(&format!("# round {round}\n"));
    for i in 0..LIST_SIZE {
        let dot = if i % 2 == 0 { "." } else { "" };
        text.push_str(&format!("{dot}s{i:07}.{}\n", TLDS[i % TLDS.len()]));
    }
    std::fs::write(path, text).expect("write the generated list");
}

/// The ten `host` entries, then (with `list`) a deny entry using the list
/// at `path`: last, so every request reaches it.
fn list_config(list: Option<&std::path::Path>) -> portico::config::Config {
    let body: String = (3..10)
        .map(|i| format!("[[acl]]\naction = \"deny\"\n{}\n", entry("host", i, 9).0))
        .collect();
    let tail = match list {
        Some(p) => format!(
            "[[acl_list]]\nname = \"big\"\nfile = \"{}\"\n\n[[acl]]\naction = \"deny\"\nlist = \"big\"\n",
            p.display()
        ),
        None => String::new(),
    };
    portico::config::parse_str(&format!("{HEAD}{body}{tail}"), "bench.toml").expect("generated config is valid")
}

/// The request for `host`: a GET of `/` on port 80.
fn list_case(acl: Acl, host: &str) -> Case {
    Case {
        acl,
        method: Method::GET,
        host: host.to_string(),
        path: "/".into(),
        port: 80,
        headers: HeaderMap::new(),
        expect: None,
    }
}

/// Resident memory of this process, KiB (0 where /proc is missing).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Hosts the list benches ask for: not in the list (4 lookups), and in it
/// through its parent `.s0999990.com`.
const MISS: &str = "www.allowed.example.org";
const HIT: &str = "a.b.s0999990.com";

fn bench_list(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.txt");
    write_list(&path, 0);
    let with = Acl::compile(&list_config(Some(&path))).expect("generated list compiles");
    let without = Acl::compile(&list_config(None)).expect("entries compile");
    let mut group = c.benchmark_group("acl_list");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let t = now();
    for (name, case) in [
        ("none", list_case(without, MISS)),
        ("miss", list_case(with.clone(), MISS)),
        ("hit", list_case(with, HIT)),
    ] {
        let req = case.request();
        let denied = matches!(case.acl.decide(&req, t), portico::acl::Decision::Deny { .. });
        assert_eq!(denied, name == "hit", "{name}");
        group.bench_function(name, |b| b.iter(|| black_box(case.acl.decide(black_box(&req), t))));
    }
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    let mut round = 0;
    group.bench_function("list_load", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                write_list(&path, round);
                // As at start-up: the config check compiles the list, the
                // server's compile is then a cache lookup (file read again).
                let start = std::time::Instant::now();
                let config = list_config(Some(&path));
                black_box(Acl::compile(&config).expect("generated list compiles"));
                total += start.elapsed();
            }
            total
        })
    });
    group.finish();
}

/// `ACL_LIST=1`: load time and memory of the 1,000,000-domain list, then
/// alternating rounds without and with it.
fn paired_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.txt");
    let mut loads = Vec::new();
    let mut rss = 0;
    let mut with = None;
    for round in 0..5 {
        write_list(&path, round);
        let before = rss_kib();
        // As at start-up: the config check compiles the list, the server's
        // compile is then a cache lookup (the file read and hashed again).
        let start = std::time::Instant::now();
        let config = list_config(Some(&path));
        with = Some(Acl::compile(&config).expect("generated list compiles"));
        loads.push(start.elapsed().as_secs_f64() * 1000.0);
        if round == 0 {
            // The first load only: later rounds reuse memory the allocator kept.
            rss = rss_kib().saturating_sub(before);
        }
    }
    let with = with.expect("compiled");
    loads.sort_by(f64::total_cmp);
    println!(
        "load of {LIST_SIZE} domains: median {:.0} ms (min {:.0}, max {:.0}); resident memory +{} MiB with the list loaded",
        loads[loads.len() / 2],
        loads[0],
        loads[loads.len() - 1],
        rss / 1024
    );
    let without = list_case(Acl::compile(&list_config(None)).expect("entries compile"), MISS);
    let t = now();
    const ROUNDS: usize = 101;
    const PER_ROUND: u32 = 20_000;
    let time = |c: &Case| {
        let req = c.request();
        let start = std::time::Instant::now();
        for _ in 0..PER_ROUND {
            black_box(c.acl.decide(black_box(&req), t));
        }
        start.elapsed().as_nanos() as f64 / f64::from(PER_ROUND)
    };
    println!("request   without list ns   with 1M-domain list ns   ratio");
    for host in [MISS, HIT] {
        let with = list_case(with.clone(), host);
        let denied = matches!(with.acl.decide(&with.request(), t), portico::acl::Decision::Deny { .. });
        assert_eq!(denied, host == HIT, "{host}");
        let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let x = time(&without);
            let y = time(&with);
            a.push(x);
            b.push(y);
            r.push(y / x);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{host:<24} {:>8.1} {:>14.1} {:>9.3}",
            median(&mut a),
            median(&mut b),
            median(&mut r)
        );
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("acl");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let t = now();
    for n in SIZES {
        for scenario in SCENARIOS {
            let case = case(scenario, n);
            let req = case.request();
            group.bench_with_input(BenchmarkId::new(scenario, n), &n, |b, _| {
                b.iter(|| black_box(case.acl.decide(black_box(&req), t)))
            });
        }
    }
    group.finish();
}

/// Alternates rounds at 10 and 10,000 entries; prints medians and the ratio.
fn paired() {
    const ROUNDS: usize = 101;
    const PER_ROUND: u32 = 20_000;
    let t = now();
    println!("scenario   10 entries ns   10,000 entries ns   ratio (median of per-round ratios)");
    for scenario in SCENARIOS {
        let small = case(scenario, 10);
        let large = case(scenario, 10_000);
        let time = |c: &Case| {
            let req = c.request();
            let start = std::time::Instant::now();
            for _ in 0..PER_ROUND {
                black_box(c.acl.decide(black_box(&req), t));
            }
            start.elapsed().as_nanos() as f64 / f64::from(PER_ROUND)
        };
        let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Alternate which goes first, so drift hits both alike.
            let (x, y) = if round % 2 == 0 {
                let x = time(&small);
                (x, time(&large))
            } else {
                let y = time(&large);
                (time(&small), y)
            };
            a.push(x);
            b.push(y);
            r.push(y / x);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{scenario:<8} {:>13.1} {:>19.1} {:>9.3}",
            median(&mut a),
            median(&mut b),
            median(&mut r)
        );
    }
}

fn main() {
    if std::env::var_os("ACL_PAIRED").is_some() {
        paired();
        return;
    }
    if std::env::var_os("ACL_LIST").is_some() {
        paired_list();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

criterion_group!(benches, bench, bench_list);
