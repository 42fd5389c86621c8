//! The `portico` command line: `check` error reports, `run --print-config`,
//! start-up failures, and `run` on the embedded defaults.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_portico");

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `portico check` on `config` and asserts it fails with one error
/// naming the file, `line` and `key`, and containing `message`.
fn assert_check_error(config: &str, line: usize, key: &str, message: &str) {
    let out = Portico::check(config);
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "check accepted:\n{config}\nstdout: {}",
        stdout(&out)
    );
    assert!(
        err.contains(&format!("portico.toml:{line}: key `{key}`: ")),
        "want line {line} and key `{key}` in: {err}"
    );
    assert!(err.contains(message), "want {message:?} in: {err}");
    assert!(err.starts_with("portico: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Runs the binary with `args` in `cwd` and returns its output.
fn run_portico(args: &[&str], cwd: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {BIN}: {e}"))
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("portico-cli-")
        .tempdir()
        .expect("create temp dir")
}

/// Kills the child on drop, so a failed assertion leaves no process behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` to exit; panics if it is still running after 20 s
/// (a guard against a hang, not a timing assertion).
fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "portico kept running");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn check_reports_a_bad_port_range_in_http_ports() {
    assert_check_error(
        "[proxy]\nhttp_ports = [80, \"9-2\"]\n",
        2,
        "proxy.http_ports[1]",
        "not a port or a range of ports",
    );
    assert_check_error(
        "[proxy]\nhttp_ports = [0]\n",
        2,
        "proxy.http_ports[0]",
        "0 is not a port",
    );
}

/// `portico run -c file` in `dir`, expected to stop by itself (a start-up
/// failure): its exit status and standard error.
fn run_to_exit(file: &Path, dir: &Path) -> (std::process::ExitStatus, String) {
    let child = Command::new(BIN)
        .args(["run", "-c", file.to_str().expect("utf-8")])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn portico");
    let mut child = KillOnDrop(child);
    let status = wait_exit(&mut child.0);
    let mut err = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().expect("stderr"), &mut err).expect("read stderr");
    (status, err)
}

#[test]
fn check_reports_unknown_key_with_suggestion() {
    let config = "# a comment\n\n[[listener]]\nadress = \"127.0.0.1:8000\"\n";
    assert_check_error(
        config,
        4,
        "listener[0].adress",
        "unknown key `adress`, did you mean `address`?",
    );
}

#[test]
fn check_reports_wrong_type_bad_duration_bad_cidr_unknown_upstream() {
    assert_check_error(
        "[[listener]]\naddress = \"127.0.0.1:8000\"\nlisten_queue = \"big\"\n",
        3,
        "listener[0].listen_queue",
        "invalid type: string \"big\"",
    );
    assert_check_error(
        "[server]\nworkers = 1\n\n[keepalive]\ntimeout = \"15 fortnights\"\n",
        5,
        "keepalive.timeout",
        "15 fortnights",
    );
    assert_check_error(
        "[keepalive]\nmax_requests = 5\ntimeout = 15\n",
        3,
        "keepalive.timeout",
        "invalid type",
    );
    // A bad network: the key is the list (`access.allow`) or its element
    // (`access.allow[1]`), on the line where it is written.
    let out =
        Portico::check("[access]\nadmin_allow = [\"127.0.0.0/8\"]\n\nallow = [\"127.0.0.0/8\", \"10.0.0.0/33\"]\n");
    let err = stderr(&out);
    assert!(!out.status.success(), "check accepted a /33");
    assert!(err.contains("portico.toml:4: key `access.allow"), "{err}");
    assert!(err.contains("invalid"), "{err}");
    assert_check_error(
        "[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\n\n[[rule]]\nhost = \"x\"\nupstream = \"b\"\n",
        7,
        "rule[0].upstream",
        "no [[upstream]] is named `b` (defined: a)",
    );
}

#[test]
fn check_accepts_a_valid_config() {
    let config = r#"
[[listener]]
address = "127.0.0.1:8000"
mode = "reverse"

[[listener]]
address = "127.0.0.1:8001"

[access]
allow = ["127.0.0.0/8", "::1/128", "10.0.0.0/8"]

[keepalive]
timeout = "1m 30s"

[limits]
max_body_size = "10MiB"

[[upstream]]
name = "web"
servers = ["127.0.0.1:9000", "https://localhost:9443"]
host_header = "rewrite"

[[rule]]
host = "*.example.com"
path = "/"
upstream = "web"
"#;
    let out = Portico::check(config);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).trim_end().ends_with("portico.toml: OK"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn check_accepts_single_addresses_in_allow() {
    let out = Portico::check("[access]\nallow = [\"192.0.2.7\", \"::1\", \"10.0.0.0/8\"]\n");
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn print_config_without_file_shows_the_defaults() {
    let dir = temp_dir();
    let out = run_portico(&["run", "--print-config"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for want in [
        "address = \"127.0.0.1:8080\"",
        "mode = \"forward\"",
        "[keepalive]\ntimeout = \"15s\"\nmax_requests = 100\n",
        "connect_ports = [443]",
        "tunnel_idle_timeout = \"5m\"",
        "max_header_size = \"64KiB\"",
    ] {
        assert!(text.contains(want), "want {want:?} in:\n{text}");
    }
    // It printed and exited: nothing was started, no access log created.
    assert!(!dir.path().join("access.log").exists());

    let check = Portico::check(&text);
    assert!(check.status.success(), "{}\n{text}", stderr(&check));
}

#[test]
fn print_config_with_file_fills_in_the_rest() {
    let dir = temp_dir();
    let file = dir.path().join("mine.toml");
    std::fs::write(
        &file,
        r#"[[listener]]
address = "127.0.0.1:9999"
mode = "reverse"

[keepalive]
max_requests = 7

[proxy]
connect_ports = [443, 8443]

[[upstream]]
name = "web"
servers = ["127.0.0.1:9000"]

[[rule]]
host = "*.example.com"
upstream = "web"
"#,
    )
    .expect("write config");
    let out = run_portico(
        &["run", "-c", file.to_str().expect("utf-8"), "--print-config"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let printed: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("printed config is not TOML: {e}\n{text}"));
    let get = |path: &str| -> toml::Value {
        let mut cur = toml::Value::Table(printed.clone());
        for seg in path.split('.') {
            cur = match seg.parse::<usize>() {
                Ok(i) => cur.get(i).cloned(),
                Err(_) => cur.get(seg).cloned(),
            }
            .unwrap_or_else(|| panic!("no `{path}` in:\n{text}"));
        }
        cur
    };
    let s = |v: &str| toml::Value::String(v.to_owned());
    let i = toml::Value::Integer;
    // From the file.
    assert_eq!(get("listener.0.address"), s("127.0.0.1:9999"));
    assert_eq!(get("listener.0.mode"), s("reverse"));
    assert_eq!(get("keepalive.max_requests"), i(7));
    assert_eq!(get("proxy.connect_ports"), toml::Value::Array(vec![i(443), i(8443)]));
    assert_eq!(get("upstream.0.name"), s("web"));
    assert_eq!(get("upstream.0.servers.0"), s("127.0.0.1:9000"));
    assert_eq!(get("rule.0.host"), s("*.example.com"));
    assert_eq!(get("rule.0.upstream"), s("web"));
    // Every other default filled in.
    assert_eq!(get("listener.0.listen_queue"), i(4096));
    assert_eq!(get("listener.0.nodelay"), toml::Value::Boolean(true));
    assert_eq!(get("keepalive.timeout"), s("15s"));
    assert_eq!(get("upstream.0.host_header"), s("preserve"));
    assert_eq!(get("upstream.0.down_time"), s("10s"));
    assert_eq!(get("upstream.0.retry"), toml::Value::Boolean(true));
    assert_eq!(get("limits.max_header_size"), s("64KiB"));
    assert_eq!(get("proxy.tunnel_idle_timeout"), s("5m"));
    assert_eq!(get("origin.first_byte_timeout"), s("1m"));
    assert_eq!(get("access.allow.0"), s("127.0.0.0/8"));
    assert_eq!(get("log.format"), s("combined"));
    assert_eq!(get("server.workers"), i(0));
    assert_eq!(printed["listener"].as_array().map(Vec::len), Some(1), "{text}");
    assert!(!text.contains("127.0.0.1:8080"), "{text}");

    let check = Portico::check(&text);
    assert!(check.status.success(), "{}\n{text}", stderr(&check));
}

#[test]
fn busy_port_fails_start_up_with_a_clear_message() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("local_addr");
    let dir = temp_dir();
    let file = dir.path().join("portico.toml");
    std::fs::write(
        &file,
        format!(
            "[[listener]]\naddress = \"{addr}\"\n\n[log]\naccess = \"{}/access.log\"\n",
            dir.path().display()
        ),
    )
    .expect("write config");
    let (status, err) = run_to_exit(&file, dir.path());
    assert!(!status.success(), "{status}: {err}");
    assert!(err.contains(&format!("cannot bind listener {addr}")), "{err}");
    drop(held);
}

/// A symbolic link in the place of a log or the pid file is refused, never
/// followed: started as root, Portico opens these in directories the
/// service user may write to, and a link planted there made root append a
/// request line to, or truncate, whatever it pointed at (a shell's startup
/// file, `/etc/shadow`). The file the link points at is left as it was.
#[test]
fn a_symbolic_link_in_the_place_of_a_log_or_the_pid_file_is_refused_and_its_target_untouched() {
    for (key, section) in [("access", "log"), ("error", "log"), ("pid_file", "server")] {
        let dir = temp_dir();
        let d = dir.path();
        let victim = d.join("victim");
        std::fs::write(&victim, "precious\n").expect("victim");
        let link = d.join("planted");
        std::os::unix::fs::symlink(&victim, &link).expect("symlink");
        let addr = free_addr();
        let file = d.join("portico.toml");
        let logs = if section == "log" {
            format!("[log]\n{key} = \"{}\"\n", link.display())
        } else {
            format!("[log]\naccess = \"{}/access.log\"\n", d.display())
        };
        let server = if section == "server" {
            format!("[server]\npid_file = \"{}\"\n\n", link.display())
        } else {
            String::new()
        };
        std::fs::write(&file, format!("{server}[[listener]]\naddress = \"{addr}\"\n\n{logs}")).expect("config");
        let (status, err) = run_to_exit(&file, d);
        assert!(!status.success(), "{section}.{key}: {status}: {err}");
        assert!(err.contains("symbolic links"), "{section}.{key}: {err}");
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "precious\n",
            "{section}.{key}"
        );
    }
}

#[test]
fn unusable_resources_fail_start_up() {
    let dir = temp_dir();
    let d = dir.path().display();
    let cases = [
        (
            format!("[origin]\nca_file = \"{d}/missing.pem\"\n"),
            format!("cannot read origin.ca_file {d}/missing.pem"),
        ),
        (
            "[log]\naccess = \"/nonexistent-portico-dir/access.log\"\n".to_string(),
            "cannot open access log /nonexistent-portico-dir/access.log".to_string(),
        ),
    ];
    for (extra, want) in cases {
        let file = dir.path().join("portico.toml");
        let log = if extra.contains("[log]") {
            String::new()
        } else {
            format!("[log]\naccess = \"{d}/access.log\"\n")
        };
        std::fs::write(
            &file,
            format!("[[listener]]\naddress = \"{}\"\n\n{log}{extra}", free_addr()),
        )
        .expect("write config");
        let mut child = KillOnDrop(
            Command::new(BIN)
                .args(["run", "-c", file.to_str().expect("utf-8")])
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn portico"),
        );
        let status = wait_exit(&mut child.0);
        let mut err = String::new();
        std::io::Read::read_to_string(child.0.stderr.as_mut().expect("stderr"), &mut err).expect("read stderr");
        assert!(!status.success(), "{status}: {err}");
        assert!(err.contains(&want), "want {want:?} in: {err}");
    }
    // `check` does not read ca_file.
    let out = Portico::check("[origin]\nca_file = \"/nonexistent-portico-dir/ca.pem\"\n");
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn check_on_a_missing_file_names_it() {
    let dir = temp_dir();
    let out = run_portico(&["check", "-c", "no-such-portico.toml"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr(&out).starts_with("portico: no-such-portico.toml: cannot read the config file"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_without_config_proxies_on_8080() {
    const DEFAULT: &str = "127.0.0.1:8080";
    match std::net::TcpListener::bind(DEFAULT) {
        Ok(probe) => drop(probe),
        Err(e) => {
            eprintln!("SKIPPED run_without_config_proxies_on_8080: {DEFAULT} is in use ({e})");
            return;
        }
    }
    let origin =
        Origin::start(
            |req| async move { Response::ok(format!("{} via {}", req.uri, req.header("via").unwrap_or("-"))) },
        )
        .await;
    // The default access log is relative to the working directory.
    let dir = temp_dir();
    let child = Command::new(BIN)
        .arg("run")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn portico");
    let mut child = KillOnDrop(child);

    let started = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().expect("try_wait") {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.0.stderr.as_mut().expect("stderr"), &mut err);
            if err.contains("cannot bind listener 127.0.0.1:8080") {
                eprintln!("SKIPPED run_without_config_proxies_on_8080: 8080 was taken meanwhile: {err}");
                return;
            }
            panic!("portico exited ({status}): {err}");
        }
        if tokio::net::TcpStream::connect(DEFAULT).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "portico did not listen on {DEFAULT}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let out = curl(&["-x", "http://127.0.0.1:8080", &format!("{}/default", origin.url())]).await;
    if child.0.try_wait().expect("try_wait").is_some() {
        eprintln!("SKIPPED run_without_config_proxies_on_8080: portico exited (8080 taken by someone else?)");
        return;
    }
    assert!(out.status.success(), "curl: {out:?}");
    assert_eq!(stdout(&out), "/default via 1.1 portico");
    assert_eq!(origin.count(), 1);
}

#[test]
fn sigterm_stops_portico_cleanly() {
    let dir = temp_dir();
    let addr = free_addr();
    let file = dir.path().join("portico.toml");
    std::fs::write(
        &file,
        format!(
            "[[listener]]\naddress = \"{addr}\"\n\n[log]\naccess = \"{}/access.log\"\n",
            dir.path().display()
        ),
    )
    .expect("write config");
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["run", "-c", file.to_str().expect("utf-8")])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn portico"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(child.0.try_wait().expect("try_wait").is_none(), "portico exited early");
        assert!(Instant::now() < deadline, "portico did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success());
    let status = wait_exit(&mut child.0);
    let mut err = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().expect("stderr"), &mut err).expect("read stderr");
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("shutting down"), "{err}");
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "still listening after exit"
    );
}

/// A printed size (`"16MiB"`, `"4096B"`) in bytes.
fn printed_bytes(v: &toml::Value) -> u64 {
    let text = v.as_str().unwrap_or_else(|| panic!("not a size string: {v}"));
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("not a size: {text}"));
    n << match unit {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        _ => panic!("unknown unit in {text}"),
    }
}

/// `run --print-config` of `config` (written to a file), parsed.
fn print_config(config: &str) -> (toml::Table, String) {
    let dir = temp_dir();
    let file = dir.path().join("portico.toml");
    std::fs::write(&file, config).expect("write config");
    let out = run_portico(
        &["run", "-c", file.to_str().expect("utf-8"), "--print-config"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let table = text
        .parse()
        .unwrap_or_else(|e| panic!("printed config is not TOML: {e}\n{text}"));
    (table, text)
}

/// nginx and Squid spellings mean what they mean there: single letters are
/// powers of 1024 in either case, for every size in the file.
#[test]
fn sizes_take_nginx_and_squid_single_letter_units_as_powers_of_1024() {
    let (printed, text) = print_config(
        "[limits]\nmax_body_size = \"16m\"\nmax_header_size = \"64k\"\nmax_request_line = \"8K\"\n\n\
         [cache]\nmemory = \"1g\"\ndisk = \"2G\"\nmax_object_size = \"16M\"\nmax_memory_object = \"512KiB\"\n",
    );
    let get = |table: &str, key: &str| printed[table][key].clone();
    let s = |v: &str| toml::Value::String(v.to_owned());
    assert_eq!(get("limits", "max_body_size"), s("16MiB"), "{text}");
    assert_eq!(get("limits", "max_header_size"), s("64KiB"), "{text}");
    assert_eq!(get("limits", "max_request_line"), s("8KiB"), "{text}");
    assert_eq!(get("cache", "memory"), s("1GiB"), "{text}");
    assert_eq!(get("cache", "disk"), s("2GiB"), "{text}");
    assert_eq!(get("cache", "max_object_size"), s("16MiB"), "{text}");
    assert_eq!(get("cache", "max_memory_object"), s("512KiB"), "{text}");
}

/// `16MB` is 16 MiB to Squid and 16,000,000 bytes to SI: refused, with
/// both spellings that say which.
#[test]
fn ambiguous_two_letter_size_units_are_refused_with_the_alternatives() {
    assert_check_error(
        "[server]\nworkers = 1\n\n[limits]\nmax_body_size = \"16MB\"\n",
        5,
        "limits.max_body_size",
        "invalid size \"16MB\": \"MB\" is ambiguous (Squid reads it as a power of 1024, SI as a power of 1000): write \"16m\" or \"16MiB\" for 16777216 bytes (the nginx and Squid reading), or 16000000 for 16000000 bytes (the SI reading)",
    );
    assert_check_error(
        "[cache]\ndisk = \"10GB\"\n",
        2,
        "cache.disk",
        "write \"10g\" or \"10GiB\" for 10737418240 bytes",
    );
    assert_check_error(
        "[cache]\nmemory = \"512kb\"\n",
        2,
        "cache.memory",
        "\"kb\" is ambiguous",
    );
}

/// The default memory tier (1/16 of RAM) is a budget for the whole server:
/// with `processes = 4` each worker gets a quarter, and `--print-config`
/// says so. A value written in the file is kept per process.
#[test]
fn the_default_memory_tier_is_divided_among_the_processes() {
    let (one, one_text) = print_config("");
    let total = printed_bytes(&one["cache"]["memory"]);
    let (four, text) = print_config("[server]\nprocesses = 4\n");
    let each = printed_bytes(&four["cache"]["memory"]);
    let want = ((total / 4) & !((1 << 20) - 1)).max(16 << 20);
    assert_eq!(each, want, "{total} bytes among 4 processes:\n{text}");
    assert!(one_text.contains("# memory: cache.memory = "), "{one_text}");
    assert!(one_text.contains("(derived: 1/16 of RAM"), "{one_text}");
    assert!(
        text.contains("per process (derived: 1/16 of RAM") && text.contains("shared by 4 processes"),
        "{text}"
    );

    let (written, text) = print_config("[server]\nprocesses = 4\n\n[cache]\nmemory = \"100MiB\"\n");
    assert_eq!(printed_bytes(&written["cache"]["memory"]), 100 << 20, "{text}");
    assert!(
        text.contains("# memory: cache.memory = 100MiB per process (configured)"),
        "{text}"
    );
}

/// A `listen_queue` above the kernel's `net.core.somaxconn` is truncated to
/// it: the perfdump shows the backlog in effect, the advisor and the error
/// log say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_queue_above_somaxconn_shows_the_backlog_in_effect() {
    let Some(somaxconn) = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    else {
        eprintln!("SKIPPED: /proc/sys/net/core/somaxconn is not readable (not Linux?)");
        return;
    };
    let asked = somaxconn + 1;
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nlisten_queue = {asked}\n\n[cache]\ndir = \"{{dir}}/cache\"\nmemory = \"16MiB\"\n"
    ))
    .await;
    let req = format!("GET /.perf HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let perf = parse_response(&raw_request(p.addr(), req.as_bytes()).await).body_str();
    let line = perf
        .lines()
        .find(|l| l.starts_with("Listen Queue"))
        .unwrap_or_else(|| panic!("no Listen Queue in:\n{perf}"));
    assert!(
        line.ends_with(&format!(
            " {somaxconn} (listen_queue = {asked} capped by net.core.somaxconn)"
        )),
        "{line}"
    );
    assert!(perf.contains("[listen-queue-capped]"), "{perf}");
    assert!(
        p.stderr().contains(&format!(
            "listen_queue = {asked} is capped at {somaxconn} by the kernel"
        )),
        "{}",
        p.stderr()
    );
}
