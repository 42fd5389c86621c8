//! Running the real `portico` binary.

use std::fs::{self, File};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::dns::DnsServer;

const BIN: &str = env!("CARGO_BIN_EXE_portico");
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `portico run -c <dir>/portico.toml`; killed on Drop.
pub struct Portico {
    child: Child,
    dir: TempDir,
    config_path: PathBuf,
    listeners: Vec<SocketAddr>,
    /// The DNS server this Portico asks (None when the config named its own
    /// `[origin] nameservers`); it outlives the process (Drop kills that first).
    dns: Option<DnsServer>,
}

/// `config_toml` with `nameservers = ["<dns>"]` in its `[origin]` table
/// (added after the `[origin]` header, or as a new table at the end), so
/// that Portico asks the test DNS server and never the machine's resolver.
/// A config that names its own `[origin] nameservers` is returned as it is.
/// Panics if the result does not carry the server (an `[origin]` written
/// in a form this does not edit, such as dotted keys).
pub fn with_nameserver(config_toml: &str, dns: SocketAddr) -> String {
    let table: toml::Table = config_toml
        .parse()
        .unwrap_or_else(|e| panic!("config is not valid TOML: {e}\n{config_toml}"));
    let origin = table.get("origin").and_then(|o| o.as_table());
    if origin.is_some_and(|o| o.contains_key("nameservers")) {
        return config_toml.to_string();
    }
    let line = format!("nameservers = [\"{dns}\"]\n");
    let mut text = String::with_capacity(config_toml.len() + 64);
    let mut added = false;
    for l in config_toml.split_inclusive('\n') {
        text.push_str(l);
        if !added && l.trim() == "[origin]" {
            if !l.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&line);
            added = true;
        }
    }
    if !added {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("\n[origin]\n");
        text.push_str(&line);
    }
    let edited: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("adding the test name server broke the config: {e}\n{text}"));
    let servers = edited
        .get("origin")
        .and_then(|o| o.get("nameservers"))
        .and_then(|n| n.as_array())
        .map(|a| a.len());
    assert_eq!(
        servers,
        Some(1),
        "could not add the test name server to:\n{config_toml}"
    );
    text
}

/// Writes `config_toml` (with `{dir}` replaced by the temp dir path) to
/// `<tempdir>/portico.toml`; returns the dir, the path and the final text.
fn write_config(config_toml: &str) -> (TempDir, PathBuf, String) {
    let dir = tempfile::Builder::new()
        .prefix("portico-test-")
        .tempdir()
        .expect("create temp dir for portico config");
    let dir_str = dir.path().to_str().expect("temp dir path is not UTF-8");
    let text = config_toml.replace("{dir}", dir_str);
    let path = dir.path().join("portico.toml");
    fs::write(&path, &text).expect("write portico.toml");
    (dir, path, text)
}

/// The `address` of every `[[listener]]` in a config, with unspecified
/// IPs (`0.0.0.0`, `[::]`) replaced by loopback so they can be dialled.
/// Panics with the config text if it is not valid TOML.
pub fn listener_addrs(config_toml: &str) -> Vec<SocketAddr> {
    let table: toml::Table = config_toml
        .parse()
        .unwrap_or_else(|e| panic!("config is not valid TOML: {e}\n{config_toml}"));
    let Some(listeners) = table.get("listener") else {
        return Vec::new();
    };
    let listeners = listeners
        .as_array()
        .expect("`listener` must be an array of tables ([[listener]])");
    listeners
        .iter()
        .map(|l| {
            let text = l
                .get("address")
                .and_then(|a| a.as_str())
                .expect("every [[listener]] needs address = \"host:port\"");
            let mut addr = text
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .unwrap_or_else(|| panic!("listener address {text:?} does not resolve"));
            if addr.ip().is_unspecified() {
                addr.set_ip(match addr.ip() {
                    IpAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
                    IpAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
                });
            }
            addr
        })
        .collect()
}

impl Portico {
    /// Writes the config (see [`Portico::dir`] for `{dir}`), starts portico,
    /// and waits up to 10 s until every `[[listener]] address` accepts TCP
    /// connections. Panics with portico's stderr if it exits or times out.
    ///
    /// Unless the config names its own `[origin] nameservers`, a test DNS
    /// server is started for this Portico and put in its config
    /// ([`Portico::dns`]): names not given to it get NXDOMAIN, and
    /// `localhost` is answered by Portico itself.
    pub async fn start(config_toml: &str) -> Portico {
        Portico::start_with_env(config_toml, &[]).await
    }

    /// [`Portico::start`] with `env` added to portico's environment (as
    /// `NOTIFY_SOCKET`, which a service manager sets).
    ///
    /// A listener address from [`free_addr`](super::free_addr) was free when
    /// it was picked, but another process (any test's outgoing connection
    /// takes an ephemeral port from the same range) may take it before
    /// Portico binds it. When Portico says so ("cannot bind listener ADDR:
    /// address already in use"), the config is started again with that
    /// address replaced by a newly picked one, up to three times; the
    /// listener addresses ([`Portico::addr`]) are the ones it listens on.
    pub async fn start_with_env(config_toml: &str, env: &[(&str, &std::ffi::OsStr)]) -> Portico {
        Portico::start_inner(config_toml, env, None).await
    }

    /// [`Portico::start`] with the open-files limit (soft and hard) set to
    /// `nofile` in the child before it runs portico, as `ulimit -n` would:
    /// portico cannot raise it, and sizes its limits from it.
    pub async fn start_with_open_files(config_toml: &str, nofile: u64) -> Portico {
        Portico::start_inner(config_toml, &[], Some(nofile)).await
    }

    async fn start_inner(config_toml: &str, env: &[(&str, &std::ffi::OsStr)], nofile: Option<u64>) -> Portico {
        let dns = DnsServer::start();
        let mut edited = with_nameserver(config_toml, dns.addr());
        let mut dns = (edited != config_toml).then_some(dns);
        for attempt in 0.. {
            let (dir, config_path, text) = write_config(&edited);
            let listeners = listener_addrs(&text);
            let out = File::create(dir.path().join("portico.stdout")).expect("create stdout file");
            let err = File::create(dir.path().join("portico.stderr")).expect("create stderr file");
            // Run in the temp dir, so relative paths (the default cache
            // directory, access.log) never land in the repository.
            let mut command = Command::new(BIN);
            command
                .current_dir(dir.path())
                .arg("run")
                .arg("-c")
                .arg(&config_path)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err);
            if let Some(n) = nofile {
                let limit = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                // SAFETY: the closure runs in the forked child before exec
                // and only calls setrlimit, which is async-signal-safe; it
                // touches no lock or allocation of the parent.
                unsafe {
                    std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                            Ok(())
                        } else {
                            Err(std::io::Error::last_os_error())
                        }
                    });
                }
            }
            let child = command.spawn().unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
            let mut portico = Portico {
                child,
                dir,
                config_path,
                listeners,
                dns: dns.take(),
            };
            let Err(report) = portico.wait_listening().await else {
                return portico;
            };
            let taken = portico
                .listeners
                .iter()
                .find(|a| report.contains(&format!("cannot bind listener {a}: address already in use")))
                .copied();
            match taken {
                Some(addr) if attempt < 3 => {
                    dns = portico.dns.take();
                    edited = edited.replace(&addr.to_string(), &super::free_addr());
                }
                _ => panic!("{report}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// Waits until every listener accepts connections; the report (with
    /// portico's output) when it exits first or does not listen in time.
    async fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        for addr in self.listeners.clone() {
            loop {
                if let Some(status) = self.child.try_wait().expect("try_wait on portico") {
                    return Err(format!(
                        "portico exited ({status}) before listening on {addr}\n{}",
                        self.output_report()
                    ));
                }
                let attempt = tokio::net::TcpStream::connect(addr);
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), attempt).await {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "portico did not listen on {addr} within {STARTUP_TIMEOUT:?}\n{}",
                        self.output_report()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    fn output_report(&self) -> String {
        format!(
            "--- portico stderr ---\n{}\n--- portico stdout ---\n{}",
            self.stderr(),
            self.stdout()
        )
    }

    /// Runs `portico check -c <tempdir>/portico.toml` (with `{dir}`
    /// replaced) and returns its output. Blocking; it is short.
    pub fn check(config_toml: &str) -> Output {
        let (dir, config_path, _) = write_config(config_toml);
        Command::new(BIN)
            .current_dir(dir.path())
            .arg("check")
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {BIN} check: {e}"))
    }

    /// Process id of the running portico.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// False once portico has exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends signal `sig` (e.g. `libc::SIGHUP`) to portico.
    pub fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.pid()).expect("pid fits in pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed: {}", std::io::Error::last_os_error());
    }

    /// Waits up to `timeout` for portico to exit; its status, or None if it
    /// is still running.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait on portico") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The temp dir holding the config and captured output; `{dir}` in the
    /// config text is replaced by this path (e.g. `access = "{dir}/access.log"`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Path of the written config file.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The test DNS server this Portico asks: give it the names a test
    /// needs ([`DnsServer::add`]), count its queries. Panics if the config
    /// named its own `[origin] nameservers`.
    pub fn dns(&self) -> &DnsServer {
        self.dns
            .as_ref()
            .expect("this Portico's config names its own [origin] nameservers")
    }

    /// Replaces the config file (for a reload) with `config_toml`, `{dir}`
    /// replaced and this Portico's test name server added as at start.
    pub fn rewrite_config(&self, config_toml: &str) {
        let mut text = config_toml.replace("{dir}", self.dir().to_str().expect("temp dir path is not UTF-8"));
        if let Some(dns) = &self.dns {
            text = with_nameserver(&text, dns.addr());
        }
        fs::write(&self.config_path, text).expect("rewrite portico.toml");
    }

    /// Rewrites the config to `config_toml` ([`Portico::rewrite_config`]),
    /// signals a reload (SIGHUP) and waits until Portico says it is in
    /// force (panics after 10 s).
    pub async fn reload(&self, config_toml: &str) {
        let reloads = |p: &Portico| p.stderr().matches("reloaded").count();
        let before = reloads(self);
        self.rewrite_config(config_toml);
        self.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(10);
        while reloads(self) == before {
            assert!(Instant::now() < deadline, "no reload: {}", self.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Like [`Portico::reload`], for a config the reload is to refuse:
    /// waits until Portico says it kept the previous one (panics after
    /// 10 s) and returns what it said in all.
    pub async fn reload_refused(&self, config_toml: &str) -> String {
        const KEPT: &str = "still running on the previous config";
        let before = self.stderr().matches(KEPT).count();
        self.rewrite_config(config_toml);
        self.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.stderr().matches(KEPT).count() == before {
            assert!(Instant::now() < deadline, "no refused reload: {}", self.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stderr()
    }

    /// The first listener's address (panics if the config had none).
    pub fn addr(&self) -> SocketAddr {
        *self.listeners.first().expect("config has no [[listener]]")
    }

    /// Everything portico wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.dir().join("portico.stderr")).unwrap_or_default()
    }

    /// Waits until portico's stderr holds `text` at least `times` times
    /// (10 s at most; then panics with the log) and returns the log.
    pub async fn until_logged(&self, text: &str, times: usize) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.stderr();
            if log.matches(text).count() >= times {
                return log;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{text:?} not logged {times} times:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything portico wrote to stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(self.dir().join("portico.stdout")).unwrap_or_default()
    }

    /// Current resident set size (VmRSS) in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS")
    }

    /// Peak resident set size (VmHWM) in KiB.
    pub fn hwm_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM")
    }

    fn proc_status_kib(&self, key: &str) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path} (has portico exited?): {e}"));
        status
            .lines()
            .find_map(|line| {
                let value = line.strip_prefix(key)?.strip_prefix(':')?;
                value.trim().strip_suffix("kB")?.trim().parse().ok()
            })
            .unwrap_or_else(|| panic!("no {key} line in {path}"))
    }
}

impl Drop for Portico {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A monitoring page (`/metrics`, `/.stats.json`, ...) read from
/// `p.addr()`, the first listener, as a loopback admin client.
pub async fn page(p: &Portico, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", p.addr());
    super::client::parse_response(&super::client::raw_request(p.addr(), req.as_bytes()).await).body_str()
}

/// The perfdump (`/.perf`) line that starts with `label`; panics with the
/// page when there is none.
pub async fn perf_line(p: &Portico, label: &str) -> String {
    let perf = page(p, "/.perf").await;
    perf.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label} line in the perfdump:\n{perf}"))
        .to_string()
}

/// The statistics snapshot of the monitoring JSON (`/.stats.json`,
/// its `snapshot`); panics unless it is a 200 with JSON.
pub async fn stats_snapshot(p: &Portico) -> serde_json::Value {
    let addr = p.addr();
    let req = format!("GET /.stats.json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let resp = super::client::parse_response(&super::client::raw_request(addr, req.as_bytes()).await);
    assert_eq!(resp.status, 200, "statistics: {}", resp.body_str());
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let doc: serde_json::Value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("statistics are not JSON: {e}\n{}", resp.body_str()));
    doc["snapshot"].clone()
}

/// Polls [`stats_snapshot`] until `ready` holds for it (10 s at most);
/// panics naming `what` with the last snapshot.
pub async fn stats_when(p: &Portico, what: &str, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    for _ in 0..1000 {
        let s = stats_snapshot(p).await;
        if ready(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the statistics never showed {what}: {}", stats_snapshot(p).await);
}

/// Requests in service now (`portico_sessions_active`; monitoring
/// requests, the one asking included, are not counted).
pub async fn in_service(p: &Portico) -> u64 {
    metric(p, "portico_sessions_active").await
}

/// Waits until more than `than` requests are in service (what
/// [`in_service`] said before one more was sent), 10 s at most, then
/// panics naming `what`.
pub async fn until_in_service_over(p: &Portico, than: u64, what: &str) {
    for _ in 0..1000 {
        if in_service(p).await > than {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} never came into service");
}

/// The value of a line of /metrics (`name{labels}` as written).
pub async fn metric(p: &Portico, series: &str) -> u64 {
    let text = page(p, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{text}"))
}
