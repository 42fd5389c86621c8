//! Cost of routing one request through the compiled `[[rule]]` matcher at
//! 10, 100, 1,000 and 10,000 rules (the project's target: 10,000 rules must cost
//! < 5% more than 10). Each request matches the *last* rule, the worst case
//! for a linear scan such as the Sun Java System Web Proxy Server 4's assign-name.
//!
//! Scenarios:
//! - `regex`: every rule is `regex = "^/rNNNN/"` (the bench suite's `rules` scenario);
//! - `path`: every rule is `path = "/rNNNN/"`;
//! - `mix`: rules cycle through exact host, wildcard host, path prefix,
//!   anchored regex, unanchored regex, and method + header rules;
//! - `set`: regexes with no literal to index (they all go to the RegexSet),
//!   to show what the fallback costs.
//!
//! Run: `cargo bench --bench rules` (medians in target/criterion/).
//!
//! On a shared, noisy machine sequential runs drift; `RULES_PAIRED=1 cargo
//! bench --bench rules` instead alternates 10-rule and 10,000-rule rounds
//! in one process and prints the median cost of each and their ratio;
//! `RULES_LOOP=path:10000:1000000` loops for `perf stat` (see `looped`).

use criterion::{BenchmarkId, Criterion, criterion_group};
use http::{HeaderMap, Method};
use portico::config::Mode;
use portico::rules::{Request, Rules};
use std::hint::black_box;
use std::time::Duration;

const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];

fn config(rules: &str) -> Rules {
    let text = format!("[[upstream]]\nname = \"o\"\nservers = [\"127.0.0.1:9\"]\n\n{rules}");
    let config = portico::config::parse_str(&text, "bench.toml").expect("generated config is valid");
    Rules::compile(&config).expect("generated rules compile")
}

/// The i-th rule of the `mix` scenario, and the (host, path, method) that
/// matches it. Numbers are zero-padded so that requests at every rule
/// count are the same length (the cost of a scan grows with the URL).
fn mix_rule(i: usize) -> (String, String, String, Method) {
    match i % 6 {
        0 => (
            format!("host = \"h{i:05}.example.com\""),
            format!("h{i:05}.example.com"),
            "/".into(),
            Method::GET,
        ),
        1 => (
            format!("host = \"*.w{i:05}.example.com\""),
            format!("a.w{i:05}.example.com"),
            "/".into(),
            Method::GET,
        ),
        2 => (
            format!("path = \"/p{i:05}/\""),
            "x.test".into(),
            format!("/p{i:05}/a"),
            Method::GET,
        ),
        3 => (
            format!("regex = \"^/r{i:05}/\""),
            "x.test".into(),
            format!("/r{i:05}/a?b=1"),
            Method::GET,
        ),
        4 => (
            format!("regex = '\\.e{i:05}\\.(jpg|png)$'"),
            "x.test".into(),
            format!("/img/a.e{i:05}.png"),
            Method::GET,
        ),
        _ => (
            format!(
                "path = \"/m{i:05}/\"\nmethod = [\"PUT\", \"POST\"]\nheader = {{ name = \"X-T\", value = \"{i:05}\" }}"
            ),
            "x.test".into(),
            format!("/m{i:05}/z"),
            Method::POST,
        ),
    }
}

/// A scenario at `n` rules: the compiled rules and a request matching the last.
struct Case {
    rules: Rules,
    method: Method,
    host: String,
    path: String,
    headers: HeaderMap,
}

impl Case {
    fn request(&self) -> Request<'_> {
        Request {
            method: &self.method,
            scheme: "http",
            host: &self.host,
            port: 80,
            path_and_query: &self.path,
            client: "127.0.0.1".parse().expect("address"),
            headers: &self.headers,
            mode: Mode::Reverse,
        }
    }
}

const SCENARIOS: [&str; 4] = ["regex", "path", "mix", "set"];

fn case(scenario: &str, n: usize) -> Case {
    let last = n - 1;
    let mut headers = HeaderMap::new();
    headers.insert("user-agent", "bench/1".parse().expect("value"));
    let rule = |i: usize| -> String {
        match scenario {
            "regex" => format!("regex = \"^/r{i:05}/\""),
            "path" => format!("path = \"/r{i:05}/\""),
            "mix" => mix_rule(i).0,
            _ => format!("regex = \"^/s/[0-9]+/{i:05}/[a-z]+$\""),
        }
    };
    let text: String = (0..n)
        .map(|i| format!("[[rule]]\n{}\nupstream = \"o\"\n", rule(i)))
        .collect();
    let rules = config(&text);
    let (method, host, path) = match scenario {
        "regex" | "path" => (
            Method::GET,
            "www.example.com".to_string(),
            format!("/r{last:05}/index.html?x=1"),
        ),
        "mix" => {
            let (_, host, path, method) = mix_rule(last);
            headers.insert("x-t", format!("{last:05}").parse().expect("value"));
            (method, host, path)
        }
        _ => (
            Method::GET,
            "www.example.com".to_string(),
            format!("/s/42/{last:05}/page"),
        ),
    };
    let c = Case {
        rules,
        method,
        host,
        path,
        headers,
    };
    assert_eq!(c.rules.route(&c.request()).matched, [last], "{scenario} {n}");
    c
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("rules");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for n in SIZES {
        for scenario in SCENARIOS {
            let case = case(scenario, n);
            let req = case.request();
            group.bench_with_input(BenchmarkId::new(scenario, n), &n, |b, _| {
                b.iter(|| black_box(case.rules.route(black_box(&req))))
            });
        }
    }
    group.finish();
}

/// Alternates rounds at 10 and 10,000 rules; prints medians and the ratio.
fn paired() {
    const ROUNDS: usize = 101;
    const PER_ROUND: u32 = 20_000;
    println!("scenario   10 rules ns   10,000 rules ns   ratio (median of per-round ratios)");
    for scenario in SCENARIOS {
        let small = case(scenario, 10);
        let large = case(scenario, 10_000);
        let time = |c: &Case| {
            let req = c.request();
            let start = std::time::Instant::now();
            for _ in 0..PER_ROUND {
                black_box(c.rules.route(black_box(&req)));
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
            "{scenario:<8} {:>11.1} {:>17.1} {:>9.3}",
            median(&mut a),
            median(&mut b),
            median(&mut r)
        );
    }
}

/// `RULES_LOOP=scenario:rules:count`: routes `count` times and exits, for
/// `perf stat` (instructions per route are immune to the machine's noise:
/// run it with count 0 and with a large count, and divide the difference).
fn looped(spec: &str) {
    let mut parts = spec.split(':');
    let scenario = parts.next().unwrap_or("path");
    let n: usize = parts.next().and_then(|x| x.parse().ok()).unwrap_or(10);
    let count: u64 = parts.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let c = case(scenario, n);
    let req = c.request();
    for _ in 0..count {
        black_box(c.rules.route(black_box(&req)));
    }
}

fn main() {
    if let Ok(spec) = std::env::var("RULES_LOOP") {
        looped(&spec);
        return;
    }
    if std::env::var_os("RULES_PAIRED").is_some() {
        paired();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

criterion_group!(benches, bench);
