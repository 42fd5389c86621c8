//! Cost of routing one request through the compiled `[[rule]]` matcher at
//! 10, 100, 1,000 and 10,000 rules (DESIGN 1.5: 10,000 rules must cost
//! < 5% more than 10). Each request matches the *last* rule, the worst case
//! for a linear scan such as the seeds' assign-name.
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

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
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
/// matches it.
fn mix_rule(i: usize) -> (String, String, String, Method) {
    match i % 6 {
        0 => (
            format!("host = \"h{i}.example.com\""),
            format!("h{i}.example.com"),
            "/".into(),
            Method::GET,
        ),
        1 => (
            format!("host = \"*.w{i}.example.com\""),
            format!("a.w{i}.example.com"),
            "/".into(),
            Method::GET,
        ),
        2 => (
            format!("path = \"/p{i}/\""),
            "x.test".into(),
            format!("/p{i}/a"),
            Method::GET,
        ),
        3 => (
            format!("regex = \"^/r{i}/\""),
            "x.test".into(),
            format!("/r{i}/a?b=1"),
            Method::GET,
        ),
        4 => (
            format!("regex = '\\.e{i}\\.(jpg|png)$'"),
            "x.test".into(),
            format!("/img/a.e{i}.png"),
            Method::GET,
        ),
        _ => (
            format!("path = \"/m{i}/\"\nmethod = [\"PUT\", \"POST\"]\nheader = {{ name = \"X-T\", value = \"{i}\" }}"),
            "x.test".into(),
            format!("/m{i}/z"),
            Method::POST,
        ),
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("rules");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let client = "127.0.0.1".parse().expect("address");
    let mut headers = HeaderMap::new();
    headers.insert("x-t", "0".parse().expect("value"));
    headers.insert("user-agent", "bench/1".parse().expect("value"));
    for n in SIZES {
        let last = n - 1;
        // regex: ^/rNNNN/
        let text: String = (0..n)
            .map(|i| format!("[[rule]]\nregex = \"^/r{i:05}/\"\nupstream = \"o\"\n"))
            .collect();
        let rules = config(&text);
        let path = format!("/r{last:05}/index.html?x=1");
        let req = Request {
            method: &Method::GET,
            scheme: "http",
            host: "www.example.com",
            port: 80,
            path_and_query: &path,
            client,
            headers: &headers,
            mode: Mode::Reverse,
        };
        assert_eq!(rules.route(&req).matched, [last]);
        group.bench_with_input(BenchmarkId::new("regex", n), &n, |b, _| {
            b.iter(|| black_box(rules.route(black_box(&req))))
        });

        // path: /rNNNN/
        let text: String = (0..n)
            .map(|i| format!("[[rule]]\npath = \"/r{i:05}/\"\nupstream = \"o\"\n"))
            .collect();
        let rules = config(&text);
        assert_eq!(rules.route(&req).matched, [last]);
        group.bench_with_input(BenchmarkId::new("path", n), &n, |b, _| {
            b.iter(|| black_box(rules.route(black_box(&req))))
        });

        // mix
        let text: String = (0..n)
            .map(|i| format!("[[rule]]\n{}\nupstream = \"o\"\n", mix_rule(i).0))
            .collect();
        let rules = config(&text);
        let (_, host, path, method) = mix_rule(last);
        let mut mix_headers = headers.clone();
        mix_headers.insert("x-t", last.to_string().parse().expect("value"));
        let req = Request {
            method: &method,
            scheme: "http",
            host: &host,
            port: 80,
            path_and_query: &path,
            client,
            headers: &mix_headers,
            mode: Mode::Reverse,
        };
        assert_eq!(rules.route(&req).matched, [last]);
        group.bench_with_input(BenchmarkId::new("mix", n), &n, |b, _| {
            b.iter(|| black_box(rules.route(black_box(&req))))
        });

        // set: no usable literal, all in the RegexSet.
        let text: String = (0..n)
            .map(|i| format!("[[rule]]\nregex = \"^/s/[0-9]+/{i}/[a-z]+$\"\nupstream = \"o\"\n"))
            .collect();
        let rules = config(&text);
        let path = format!("/s/42/{last}/page");
        let req = Request {
            method: &Method::GET,
            scheme: "http",
            host: "www.example.com",
            port: 80,
            path_and_query: &path,
            client,
            headers: &headers,
            mode: Mode::Reverse,
        };
        assert_eq!(rules.route(&req).matched, [last]);
        group.bench_with_input(BenchmarkId::new("set", n), &n, |b, _| {
            b.iter(|| black_box(rules.route(black_box(&req))))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
