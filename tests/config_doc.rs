//! Keeps docs/CONFIG.md honest: every key the binary knows is documented in
//! its table's section with the real default, every documented key exists,
//! and every example config in the document passes `portico check`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::Command;
use toml::Value;

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CONFIG.md");

/// Keys that `--print-config` cannot show: `[[upstream]]`, `[[rule]]` and `[[acl]]` are
/// empty by default, `origin.ca_file` and `origin.hosts` are unset by default, and
/// `[array]` is absent unless written.
const UNPRINTED_KEYS: &[&str] = &[
    "upstream.name",
    "upstream.servers",
    "upstream.host_header",
    "upstream.down_time",
    "upstream.retry",
    "upstream.parent",
    "rule.host",
    "rule.path",
    "rule.upstream",
    "rule.cache",
    "rule.regex",
    "rule.method",
    "rule.scheme",
    "rule.port",
    "rule.client",
    "rule.header",
    "rule.mode",
    "rule.continue",
    "rule.rewrite",
    "rule.request_headers",
    "rule.response_headers",
    "rule.bucket",
    "rule.busy_body",
    "rule.deny",
    "rule.redirect",
    "origin.ca_file",
    "origin.hosts",
    "acl.action",
    "acl.status",
    "acl.reason",
    "acl.client",
    "acl.user",
    "acl.group",
    "acl.authenticated",
    "acl.method",
    "acl.scheme",
    "acl.host",
    "acl.host_regex",
    "acl.port",
    "acl.path",
    "acl.regex",
    "acl.header",
    "acl.mode",
    "acl.time",
    "acl.days",
    "acl.list",
    "acl.content_type",
    "acl.allow_destinations",
    "upstream.credentials_file",
    "upstream.max_connections",
    "rule.parent_credentials",
    "rule.bandwidth",
    "rule.bandwidth_after",
    "rule.request_rate",
    "rule.request_burst",
    "rule.total_request_rate",
    "rule.total_request_burst",
    "acl_list.name",
    "acl_list.file",
    "acl_list.kind",
    "array",
    "array.members",
    "array.members.address",
    "array.members.load_factor",
    "array.members.name",
    "array.self",
    "array.pac_path",
    "array.pac_direct",
    "array.pac_fallback_direct",
    "listener.certificate",
    "listener.certificate.cert",
    "listener.certificate.key",
    "array.forward",
    "array.down_time",
    "array.probe_interval",
];

/// The certificates the TLS examples name: generated for the test (valid
/// now), written to a temporary directory, and the paths in the example
/// replaced by theirs.
const EXAMPLE_CERTIFICATES: &[(&str, &str, &str)] = &[
    (
        "/etc/portico/tls/proxy.pem",
        "/etc/portico/tls/proxy.key",
        "proxy.example.com",
    ),
    (
        "/etc/portico/tls/www.pem",
        "/etc/portico/tls/www.key",
        "www.example.com",
    ),
    (
        "/etc/portico/tls/shop.pem",
        "/etc/portico/tls/shop.key",
        "shop.example.com",
    ),
];

/// Files the examples name that `portico check` reads: written to a
/// temporary directory, and the path in the example replaced by it.
const EXAMPLE_FILES: &[(&str, &str)] = &[(
    "/etc/portico/blocked-sites.txt",
    "casino.example\n.casino.example\n.malware.example\n",
)];

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH).unwrap_or_else(|e| panic!("cannot read {DOC_PATH}: {e}"))
}

fn portico() -> Command {
    Command::new(env!("CARGO_BIN_EXE_portico"))
}

/// The default configuration as printed by `portico run --print-config`.
fn printed_defaults() -> toml::Table {
    let out = portico().args(["run", "--print-config"]).output().expect("run portico");
    assert!(
        out.status.success(),
        "--print-config failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("--print-config output is UTF-8");
    toml::from_str(&text).unwrap_or_else(|e| panic!("--print-config output is not TOML: {e}\n{text}"))
}

/// Every key path below `prefix` with its value; an array of tables
/// contributes its keys once, under the array's name.
fn collect(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, Value>) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            Value::Table(t) => collect(&path, t, out),
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_table) => {
                for item in items {
                    if let Value::Table(t) = item {
                        collect(&path, t, out);
                    }
                }
            }
            _ => {}
        }
        out.entry(path).or_insert_with(|| value.clone());
    }
}

/// A value as written in the document's default column: `"15s"`, `100`, `[443]`.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!("[{}]", items.iter().map(render).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// The part of the document under the `##` heading for `table`
/// (`## [server]` or `## [[listener]]`), up to the next `##` heading.
fn section<'a>(doc: &'a str, table: &str) -> Option<&'a str> {
    let wanted = [format!("## [{table}]"), format!("## [[{table}]]")];
    let mut offset = 0;
    let mut start = None;
    for line in doc.split_inclusive('\n') {
        offset += line.len();
        if wanted.iter().any(|w| line.trim_end() == w) {
            start = Some(offset);
            break;
        }
    }
    let rest = &doc[start?..];
    let end = rest.find("\n## ").map_or(rest.len(), |i| i + 1);
    Some(&rest[..end])
}

/// The rows of the key tables in a section: key name -> default cell.
fn documented_rows(section: &str) -> BTreeMap<String, String> {
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().strip_prefix('|')?.split('|').map(str::trim).collect();
            let key = cells.first()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((key.to_string(), cells.get(2).copied().unwrap_or("").to_string()))
        })
        .collect()
}

/// Keys whose printed default depends on the machine (the doc says how).
const MACHINE_DEPENDENT: [&str; 6] = [
    "cache.memory",
    "cache.open_files",
    "server.max_requests",
    "server.queue_size",
    "server.blocking_queue",
    "keepalive.max_connections",
];

/// All key paths: top-level tables plus their keys.
fn known_keys() -> BTreeMap<String, Option<Value>> {
    let mut printed = BTreeMap::new();
    collect("", &printed_defaults(), &mut printed);
    let mut keys: BTreeMap<String, Option<Value>> = printed.into_iter().map(|(k, v)| (k, Some(v))).collect();
    for &key in UNPRINTED_KEYS {
        keys.entry(key.to_string()).or_insert(None);
    }
    keys
}

#[test]
fn every_key_is_documented_with_its_default() {
    let doc = doc();
    let keys = known_keys();
    let tables: BTreeSet<&str> = keys.keys().filter(|k| !k.contains('.')).map(String::as_str).collect();
    for table in [
        "server",
        "listener",
        "access",
        "keepalive",
        "limits",
        "proxy",
        "origin",
        "upstream",
        "rule",
        "cache",
        "log",
    ] {
        assert!(tables.contains(table), "--print-config no longer has `{table}`");
    }

    let mut problems = Vec::new();
    for table in &tables {
        let Some(text) = section(&doc, table) else {
            problems.push(format!("no `## [{table}]` or `## [[{table}]]` heading"));
            continue;
        };
        let rows = documented_rows(text);
        let prefix = format!("{table}.");
        let table_keys: BTreeMap<&str, &Option<Value>> = keys
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&prefix).map(|rest| (rest, v)))
            .collect();
        for (key, value) in &table_keys {
            let last = key.rsplit('.').next().unwrap_or(key);
            if !doc.contains(&format!("`{last}`")) {
                problems.push(format!("`{last}` is not in CONFIG.md at all"));
            }
            match rows.get(*key) {
                None => problems.push(format!("`{table}.{key}` has no row in the [{table}] section")),
                Some(default) => {
                    // Defaults sized from the machine are described, not quoted.
                    let machine_dependent = MACHINE_DEPENDENT.contains(&format!("{table}.{key}").as_str());
                    if let Some(value) = value.as_ref().filter(|v| !v.is_table() && !machine_dependent) {
                        let expected = format!("`{}`", render(value));
                        if !default.contains(&expected) {
                            problems.push(format!(
                                "`{table}.{key}`: default column says {default:?}, --print-config says {expected}"
                            ));
                        }
                    }
                }
            }
        }
        for key in rows.keys() {
            if !table_keys.contains_key(key.as_str()) {
                problems.push(format!("[{table}] documents `{key}`, which the config does not have"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/CONFIG.md is out of date:\n{}",
        problems.join("\n")
    );
}

/// The fenced ```toml blocks of the document.
fn toml_blocks(doc: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match current.as_mut() {
            None if line.trim() == "```toml" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "unterminated ```toml block in CONFIG.md");
    blocks
}

#[test]
fn every_example_passes_check() {
    let blocks = toml_blocks(&doc());
    assert!(
        blocks.len() >= 2,
        "expected the forward and reverse examples, found {} blocks",
        blocks.len()
    );
    let files = tempfile::tempdir().expect("create temp dir");
    for (i, block) in blocks.iter().enumerate() {
        let mut block = block.clone();
        for (j, (path, text)) in EXAMPLE_FILES.iter().enumerate() {
            let copy = files.path().join(format!("example-{j}.txt"));
            std::fs::write(&copy, text).expect("write example file");
            block = block.replace(path, &copy.display().to_string());
        }
        for (j, (cert, key, name)) in EXAMPLE_CERTIFICATES.iter().enumerate() {
            let ck = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("generate certificate");
            let cert_copy = files.path().join(format!("cert-{j}.pem"));
            let key_copy = files.path().join(format!("key-{j}.pem"));
            std::fs::write(&cert_copy, ck.cert.pem()).expect("write certificate");
            std::fs::write(&key_copy, ck.signing_key.serialize_pem()).expect("write key");
            block = block.replace(cert, &cert_copy.display().to_string());
            block = block.replace(key, &key_copy.display().to_string());
        }
        let mut file = tempfile::Builder::new()
            .prefix("config-doc-")
            .suffix(".toml")
            .tempfile()
            .expect("create temp file");
        file.write_all(block.as_bytes()).expect("write temp file");
        file.flush().expect("flush temp file");
        let out = portico()
            .arg("check")
            .arg("-c")
            .arg(file.path())
            .output()
            .expect("run portico check");
        assert!(
            out.status.success(),
            "```toml block {} of CONFIG.md fails `portico check`:\n{}\n{block}",
            i + 1,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
