//! Keeps the Debian package's files (packaging/) true to the program: the
//! installed /etc/portico/portico.toml is the embedded defaults, commented,
//! with only the package's absolute paths and user set; the unit, the
//! logrotate snippet and the maintainer scripts agree with those paths.
//! packaging/test-deb installs the package itself (as root, in CI).

use portico::config::{self, Config};
use std::collections::BTreeSet;
use toml::Value;

fn read(rel: &str) -> String {
    let path = format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The keys the package sets (uncommented in its config), with their values.
const PACKAGE_KEYS: &[(&str, &str)] = &[
    ("server.user", "portico"),
    ("server.pid_file", "/run/portico/portico.pid"),
    ("cache.dir", "/var/cache/portico"),
    ("log.access", "/var/log/portico/access.log"),
    ("log.error", "/var/log/portico/error.log"),
];

/// Defaults that depend on the machine, so the file explains them in words
/// instead of showing a value.
const MACHINE_DEPENDENT: &[&str] = &["cache.memory"];

/// The config file with every commented-out setting (`# key = value`, `#
/// [table]`, `# [[table]]`) uncommented; comments in prose stay comments.
fn uncommented(text: &str) -> String {
    let setting = regex::Regex::new(r"^# (\[\[?[a-z0-9_.]+\]\]?$|[a-z][a-z0-9_]* = )").expect("regex");
    text.lines()
        .map(|l| if setting.is_match(l) { &l[2..] } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Dotted keys of a TOML tree (`listener[0].address` as `listener.address`).
fn keys(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    Value::Table(_) => keys(v, &key, out),
                    Value::Array(a) if a.iter().all(Value::is_table) && !a.is_empty() => {
                        for item in a {
                            keys(item, &key, out);
                        }
                    }
                    _ => {
                        out.insert(key);
                    }
                }
            }
        }
        _ => unreachable!("keys() is called on tables"),
    }
}

fn defaults_with_package_keys() -> Config {
    let mut c = Config::default();
    c.server.user = "portico".into();
    c.server.pid_file = "/run/portico/portico.pid".into();
    c.cache.dir = "/var/cache/portico".into();
    c.log.access = "/var/log/portico/access.log".into();
    c.log.error = "/var/log/portico/error.log".into();
    c
}

#[test]
fn the_installed_config_sets_only_the_package_paths_and_user_and_they_are_absolute() {
    let text = read("packaging/portico.toml");
    let tree: Value = toml::from_str(&text).expect("packaging/portico.toml is TOML");
    let mut set = BTreeSet::new();
    keys(&tree, "", &mut set);
    let want: BTreeSet<String> = PACKAGE_KEYS.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(set, want, "the keys packaging/portico.toml sets");
    let c = config::parse_str(&text, "packaging/portico.toml").expect("packaging/portico.toml passes portico check");
    assert_eq!(c.to_toml(), defaults_with_package_keys().to_toml());
    for (key, value) in PACKAGE_KEYS {
        if value.contains('/') {
            assert!(value.starts_with('/'), "{key} = {value:?} is not absolute");
        }
    }
}

#[test]
fn uncommented_the_installed_config_is_the_embedded_defaults() {
    let text = uncommented(&read("packaging/portico.toml"));
    let c = config::parse_str(&text, "packaging/portico.toml (uncommented)").unwrap_or_else(|e| panic!("{e}\n{text}"));
    // Every value shown equals the built-in default (a changed default
    // needs the file changed with it).
    assert_eq!(c.to_toml(), defaults_with_package_keys().to_toml());
    // And every key of the defaults is shown, but the machine-dependent ones.
    let shown: Value = toml::from_str(&text).expect("TOML");
    let mut shown_keys = BTreeSet::new();
    keys(&shown, "", &mut shown_keys);
    let defaults: Value = toml::from_str(&Config::default().to_toml()).expect("TOML");
    let mut default_keys = BTreeSet::new();
    keys(&defaults, "", &mut default_keys);
    let missing: Vec<_> = default_keys
        .iter()
        .filter(|k| !shown_keys.contains(*k) && !MACHINE_DEPENDENT.contains(&k.as_str()))
        // Arrays of tables that are empty by default: described, not shown.
        .filter(|k| !matches!(k.as_str(), "upstream" | "rule" | "acl" | "acl_list"))
        .collect();
    assert!(
        missing.is_empty(),
        "keys of the defaults not in packaging/portico.toml: {missing:?}"
    );
    for key in MACHINE_DEPENDENT {
        let name = key.rsplit('.').next().unwrap_or(key);
        assert!(
            read("packaging/portico.toml").contains(&format!("# {name}: ")),
            "packaging/portico.toml does not explain the default of {key}"
        );
    }
}

#[test]
fn the_unit_logrotate_and_scripts_use_the_configs_paths() {
    let unit = read("packaging/portico.service");
    let line = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(line("Type"), ["notify"]);
    assert_eq!(
        line("ExecStart"),
        ["/usr/bin/portico run"],
        "the default config path, no -c"
    );
    assert_eq!(
        line("ExecReload").last().map(String::as_str),
        Some("/bin/kill -HUP $MAINPID")
    );
    assert_eq!(line("User"), ["portico"]);
    assert_eq!(line("ProtectSystem"), ["strict"]);
    assert_eq!(line("NoNewPrivileges"), ["yes"]);
    assert_eq!(line("PrivateTmp"), ["yes"]);
    assert_eq!(line("AmbientCapabilities"), ["CAP_NET_BIND_SERVICE"]);
    assert_eq!(line("CapabilityBoundingSet"), ["CAP_NET_BIND_SERVICE"]);
    assert_eq!(line("LimitNOFILE").len(), 1);
    // Writable under ProtectSystem=strict: the cache, the logs' directory,
    // and the pid file's (RuntimeDirectory= is /run/NAME).
    let c = defaults_with_package_keys();
    let writable: Vec<String> = line("ReadWritePaths")
        .iter()
        .flat_map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect();
    let dir_of = |p: &std::path::Path| p.parent().expect("a parent").display().to_string();
    assert!(writable.contains(&c.cache.dir.display().to_string()), "{writable:?}");
    assert!(writable.contains(&dir_of(&c.log.access)), "{writable:?}");
    assert!(writable.contains(&dir_of(&c.log.error)), "{writable:?}");
    assert_eq!(
        line("RuntimeDirectory")
            .iter()
            .map(|d| format!("/run/{d}"))
            .collect::<Vec<_>>(),
        [dir_of(&c.server.pid_file)]
    );
    // TimeoutStopSec leaves the drain its time.
    let stop: u64 = line("TimeoutStopSec")[0].parse().expect("TimeoutStopSec in seconds");
    assert!(stop > c.server.shutdown_timeout.get().as_secs());

    let logrotate = read("packaging/logrotate");
    let pattern = logrotate.lines().find(|l| l.ends_with(" {")).expect("a log pattern");
    let pattern = pattern.trim_end_matches(" {");
    for log in [&c.log.access, &c.log.error] {
        assert_eq!(
            format!("{}/*.log", dir_of(log)),
            pattern,
            "logrotate misses {}",
            log.display()
        );
    }
    assert!(logrotate.contains("--signal=USR1"), "{logrotate}");
    assert!(
        logrotate.contains(&c.server.pid_file.display().to_string()),
        "{logrotate}"
    );
    // docs/CONFIG.md shows the snippet the package installs.
    let body: String = logrotate
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!body.contains("copytruncate"), "Portico reopens on SIGUSR1");
    assert!(
        read("docs/CONFIG.md").contains(&body),
        "docs/CONFIG.md's logrotate snippet is not packaging/logrotate's:\n{body}"
    );

    let postinst = read("packaging/debian/postinst");
    let postrm = read("packaging/debian/postrm");
    for dir in [
        c.cache.dir.display().to_string(),
        dir_of(&c.log.access),
        dir_of(&c.server.pid_file),
    ] {
        assert!(postinst.contains(&dir), "postinst does not create {dir}");
        assert!(postrm.contains(&dir), "postrm purge does not remove {dir}");
    }
}
