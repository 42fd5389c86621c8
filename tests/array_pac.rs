//! The generated PAC file end to end: fetched from a running portico,
//! evaluated in a real JavaScript engine (Node's `vm` module, with the PAC
//! helper functions defined by the test: `dnsResolve` answers only the
//! loopback addresses a test gives it, never a real lookup), and its answer
//! for thousands of URLs compared with `portico array owner --pac`, Portico's
//! own CARP choice. Node is the Debian package `nodejs`, which
//! scripts/install-test-deps installs.

mod common;

use common::*;
use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// Runs a PAC file in a fresh `vm` context holding only the PAC helper
/// functions, calls `FindProxyForURL(url, host)` for each case, and
/// reports the answers and whether the script defined `pwned` (which only
/// a configuration value breaking out of its string literal could do).
const DRIVER: &str = r#"
const vm = require("vm");
const fs = require("fs");
const [pacFile, casesFile, dnsFile] = process.argv.slice(2);
const dns = JSON.parse(fs.readFileSync(dnsFile, "utf8"));
function quad(ip) {
  const m = /^([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]+)$/.exec(ip);
  if (!m) return null;
  return ((+m[1] << 24) | (+m[2] << 16) | (+m[3] << 8) | +m[4]) >>> 0;
}
const sandbox = {
  isPlainHostName: (h) => h.indexOf(".") < 0,
  dnsDomainIs: (h, d) => h.length >= d.length && h.substring(h.length - d.length) === d,
  shExpMatch: (s, p) => new RegExp("^" + p.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".") + "$").test(s),
  // Only the test's own loopback answers; anything else does not resolve.
  dnsResolve: (h) => (Object.prototype.hasOwnProperty.call(dns, h) ? dns[h] : null),
  myIpAddress: () => "127.0.0.1",
  isInNet: (host, pattern, mask) => {
    let ip = quad(host) === null ? sandbox.dnsResolve(host) : host;
    if (ip === null) return false;
    return ((quad(ip) & quad(mask)) >>> 0) === ((quad(pattern) & quad(mask)) >>> 0);
  },
};
const ctx = vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(pacFile, "utf8"), ctx, { filename: "proxy.pac" });
const answers = JSON.parse(fs.readFileSync(casesFile, "utf8")).map(([url, host]) => ctx.FindProxyForURL(url, host));
console.log(JSON.stringify({ answers, pwned: typeof ctx.pwned }));
"#;

/// What the PAC file answers for each `(url, host)`; `dns` maps names to
/// the loopback addresses `dnsResolve` returns for them.
fn evaluate(pac: &str, cases: &[(String, String)], dns: &[(&str, &str)]) -> Vec<String> {
    for (_, ip) in dns {
        assert!(ip.starts_with("127."), "dnsResolve answers loopback only, not {ip}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let driver = write("driver.js", DRIVER);
    let pac_file = write("proxy.pac", pac);
    let cases_file = write("cases.json", &serde_json::to_string(cases).expect("json"));
    let dns_map: serde_json::Map<String, serde_json::Value> = dns
        .iter()
        .map(|(n, ip)| (n.to_string(), serde_json::Value::from(*ip)))
        .collect();
    let dns_file = write("dns.json", &serde_json::Value::Object(dns_map).to_string());
    let out = Command::new("node")
        .arg(&driver)
        .arg(&pac_file)
        .arg(&cases_file)
        .arg(&dns_file)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run node ({e}): install it with scripts/install-test-deps (Debian package nodejs)")
        });
    assert!(
        out.status.success(),
        "node failed to evaluate the PAC file: {}\n{pac}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("driver output is JSON");
    assert_eq!(
        v["pwned"], "undefined",
        "a configuration value broke out of its string:\n{pac}"
    );
    v["answers"]
        .as_array()
        .expect("answers")
        .iter()
        .map(|a| a.as_str().expect("FindProxyForURL returns a string").to_string())
        .collect()
}

/// `portico array owner --pac -` for `urls`, one answer each.
fn portico_answers(config: &std::path::Path, urls: &[String]) -> Vec<String> {
    let mut child = Command::new(BIN)
        .args(["array", "owner", "--pac", "-c"])
        .arg(config)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run portico array owner");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = urls.join("\n");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("portico array owner");
    writer.join().expect("writer").expect("write URLs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .map(String::from)
        .collect()
}

/// `n` URLs of many shapes (the PAC's `host` argument with each),
/// hostile ones among them: quotes, backslashes, `</script>`, non-ASCII.
fn urls(n: usize) -> Vec<(String, String)> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| {
            let r = next();
            let host = format!("www{}.site{}.example", r % 7, (r >> 8) % 1000);
            let url = match i % 8 {
                0 => format!("http://{host}/"),
                1 => format!("http://{host}/img/{}.png", r >> 20),
                2 => format!("https://{host}/"),
                3 => format!("http://{host}:8081/a?b={}&c=\"d\"", r >> 30),
                4 => format!("http://{host}/back\\slash/'quote'/</script>/{}", r % 1000),
                5 => format!("http://{host}/\u{e9}t\u{e9}/\u{2028}/{}", r % 977),
                6 => format!("ftp://{host}/pub/{}", r % 10_000),
                _ => format!("http://{host}/{}", "x".repeat((r % 300) as usize)),
            };
            (url, host)
        })
        .collect()
}

async fn fetch_pac(p: &Portico) -> ParsedResponse {
    let req = format!(
        "GET /proxy.pac HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        p.addr()
    );
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A forward proxy whose `[array]` has `members` (name, address, load factor).
async fn array_proxy(members: &[(&str, &str, f64)], extra: &str) -> Portico {
    let addr = free_addr();
    let listed: Vec<String> = members
        .iter()
        .map(|(name, address, lf)| {
            format!(
                "  {{ name = {}, address = \"{address}\", load_factor = {lf:?} }},\n",
                toml_str(name)
            )
        })
        .collect();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n\n\
         [array]\nself = {}\n{extra}\nmembers = [\n{}]\n",
        toml_str(members[0].0),
        listed.concat()
    ))
    .await
}

fn assert_same(pac: &[String], rust: &[String], cases: &[(String, String)]) {
    assert_eq!(pac.len(), cases.len());
    assert_eq!(rust.len(), cases.len());
    for ((js, rs), (url, _)) in pac.iter().zip(rust).zip(cases) {
        assert_eq!(js, rs, "the PAC file and `portico array owner` disagree on {url:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pac_file_picks_the_same_carp_owner_as_portico_for_3000_urls() {
    let members = [
        ("127.0.0.11:8080", "127.0.0.11:8080", 1.0),
        ("127.0.0.12:8080", "127.0.0.12:8080", 1.0),
        ("127.0.0.13:8080", "127.0.0.13:8080", 1.0),
    ];
    let p = array_proxy(&members, "").await;
    let r = fetch_pac(&p).await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("content-type"), Some("application/x-ns-proxy-autoconfig"));
    let cases = urls(3000);
    let js = evaluate(&r.body_str(), &cases, &[]);
    let url_list: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
    let rust = portico_answers(p.config_path(), &url_list);
    assert_same(&js, &rust, &cases);
    // Every member owns a share (about a third) and every answer lists all
    // three, owner first, with no DIRECT (pac_fallback_direct is off).
    for (_, address, _) in members {
        let owned = js
            .iter()
            .filter(|a| a.starts_with(&format!("PROXY {address};")))
            .count();
        assert!((800..=1200).contains(&owned), "{address} owns {owned} of 3000");
    }
    assert!(
        js.iter()
            .all(|a| a.matches("PROXY ").count() == 3 && !a.contains("DIRECT")),
        "{:?}",
        &js[..3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unequal_load_factors_and_hostile_member_names_agree_and_stay_inside_their_strings() {
    let members = [
        ("a\"; pwned = 1; \"", "127.0.0.11:8080", 1.0),
        ("b\\\"; pwned = 2; //\n pwned = 3; '", "127.0.0.12:8080", 2.0),
        ("</script><script>pwned = 4</script>", "127.0.0.13:8080", 0.5),
        ("\u{2028}pwned = 5;\u{2029}\u{e9}t\u{e9}", "proxy4.example:3128", 1.5),
    ];
    let p = array_proxy(&members, "pac_fallback_direct = true").await;
    let r = fetch_pac(&p).await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    let pac = r.body_str();
    assert!(
        !pac.contains("</script>") && !pac.contains('\u{2028}'),
        "raw hostile text in the PAC file"
    );
    let cases = urls(2000);
    let js = evaluate(&pac, &cases, &[]);
    let url_list: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
    assert_same(&js, &portico_answers(p.config_path(), &url_list), &cases);
    assert!(
        js.iter().all(|a| a.ends_with("; DIRECT")),
        "pac_fallback_direct ends every list with DIRECT"
    );
    // Load factor 2 owns about twice what load factor 1 does.
    let owned = |address: &str| {
        js.iter()
            .filter(|a| a.starts_with(&format!("PROXY {address};")))
            .count() as f64
    };
    let ratio = owned("127.0.0.12:8080") / owned("127.0.0.11:8080");
    assert!((1.5..=2.6).contains(&ratio), "load factor 2 against 1: ratio {ratio}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pac_direct_hosts_and_networks_go_direct() {
    let members = [("a", "127.0.0.11:8080", 1.0), ("b", "127.0.0.12:8080", 1.0)];
    let direct = "pac_direct = [\"<local>\", \"10.0.0.0/8\", \"127.0.0.0/24\", \".corp.example\", \"intranet.example\", \"*.lan\"]";
    let p = array_proxy(&members, direct).await;
    let pac = fetch_pac(&p).await.body_str();
    let case = |url: &str, host: &str| (url.to_string(), host.to_string());
    let cases = [
        case("http://intranet/", "intranet"),
        case("http://10.1.2.3/x", "10.1.2.3"),
        case("http://11.1.2.3/x", "11.1.2.3"),
        case("http://db.corp.example/", "db.corp.example"),
        case("http://corp.example/", "corp.example"),
        case("http://notcorp.example/", "notcorp.example"),
        case("http://INTRANET.example/", "INTRANET.example"),
        case("http://www.intranet.example/", "www.intranet.example"),
        case("http://printer.lan/", "printer.lan"),
        case("http://inside.test/", "inside.test"),
        case("http://elsewhere.test/", "elsewhere.test"),
        case("http://unresolved.test/", "unresolved.test"),
    ];
    let dns = [("inside.test", "127.0.0.5"), ("elsewhere.test", "127.0.1.5")];
    let js = evaluate(&pac, &cases, &dns);
    let direct: Vec<bool> = js.iter().map(|a| a == "DIRECT").collect();
    assert_eq!(
        direct,
        [
            true, true, false, true, true, false, true, false, true, true, false, false
        ],
        "{js:?}"
    );
    let url_list: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
    let rust = portico_answers(p.config_path(), &url_list);
    for ((js, rs), d) in js.iter().zip(&rust).zip(&direct) {
        if !d {
            assert_eq!(js, rs);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_members_the_pac_file_names_this_proxy() {
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n\n\
         [array]\npac_direct = [\"<local>\", \".example.org\"]\npac_fallback_direct = true\n"
    ))
    .await;
    let r = fetch_pac(&p).await;
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.header("content-type"), Some("application/x-ns-proxy-autoconfig"));
    let cases = [
        ("http://example.com/a".to_string(), "example.com".to_string()),
        ("http://intranet/".to_string(), "intranet".to_string()),
        ("https://www.example.org/".to_string(), "www.example.org".to_string()),
    ];
    let js = evaluate(&r.body_str(), &cases, &[]);
    assert_eq!(
        js,
        [
            format!("PROXY {addr}; DIRECT"),
            "DIRECT".to_string(),
            "DIRECT".to_string()
        ]
    );
    // Absolute-form naming the listener gets it too.
    let req = format!("GET http://{addr}/proxy.pac HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!(r.header("content-type"), Some("application/x-ns-proxy-autoconfig"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_access_allow_admits_may_fetch_it_and_only_those() {
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n\n\
         [access]\nallow = [\"127.0.0.1\", \"127.0.0.2\"]\nadmin_allow = [\"127.0.0.1\"]\n\n\
         [array]\npac_path = \"/wpad.dat\"\n"
    ))
    .await;
    let get = |from: &str, path: &str| {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let from: std::net::IpAddr = from.parse().expect("ip");
        let to = p.addr();
        async move { parse_response(&raw_request_from(from, to, req.as_bytes()).await) }
    };
    // 127.0.0.2 is a proxy client, not an admin: the PAC file yes, the perfdump no.
    let r = get("127.0.0.2", "/wpad.dat").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/x-ns-proxy-autoconfig"));
    assert!(r.body_str().contains(&format!("PROXY {addr}")), "{}", r.body_str());
    assert_eq!(get("127.0.0.2", "/.perf").await.status, 403);
    // 127.0.0.3 may not use the proxy: no PAC file either.
    let r = get("127.0.0.3", "/wpad.dat").await;
    assert_eq!(r.status, 403);
    assert_ne!(r.header("content-type"), Some("application/x-ns-proxy-autoconfig"));
    // The default path is not served when pac_path moved it.
    assert_ne!(
        get("127.0.0.1", "/proxy.pac").await.header("content-type"),
        Some("application/x-ns-proxy-autoconfig")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_array_section_no_pac_file_is_served() {
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n"
    ))
    .await;
    let r = fetch_pac(&p).await;
    assert_ne!(r.header("content-type"), Some("application/x-ns-proxy-autoconfig"));
}

#[test]
fn array_owner_prints_the_owner_and_the_fall_back_order() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("portico.toml");
    std::fs::write(
        &config,
        "[array]\nself = \"b\"\nmembers = [\n  { address = \"127.0.0.11:8080\", name = \"a\" },\n  \
         { address = \"127.0.0.12:8080\", name = \"b\" },\n  { address = \"127.0.0.13:8080\" },\n]\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["array", "owner", "-c"])
        .arg(&config)
        .arg("http://example.com/")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let pac = portico_answers(&config, &["http://example.com/".to_string()]);
    // The same order both ways: the addresses in the line appear in the PAC answer's order.
    let order: Vec<&str> = pac[0].split("; ").map(|p| p.trim_start_matches("PROXY ")).collect();
    let at: Vec<usize> = order
        .iter()
        .map(|a| text.find(a).expect("every member named"))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{text} vs {pac:?}");
    assert!(text.starts_with("http://example.com/: owner "), "{text}");
    assert!(text.contains("\"b\" (127.0.0.12:8080) [self]"), "{text}");
    // An error for a config without members.
    std::fs::write(&config, "").expect("write");
    let out = Command::new(BIN)
        .args(["array", "owner", "-c"])
        .arg(&config)
        .arg("http://x/")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no [array] members"));
}
