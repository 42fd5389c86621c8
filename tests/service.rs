//! Running Portico as a service, through the real binary: SIGUSR1 reopens
//! the error log and the access log after rotation (as nginx's and Squid's
//! rotate signals), readiness notification to systemd over `$NOTIFY_SOCKET`,
//! the pid file, the privilege drop to `[server] user`/`group`, and the
//! default config file.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// A `TRACE` through a forward listener: refused (`proxy.allow_trace` is
/// off by default) with a line in the error log naming `path` and a line
/// in the access log.
async fn trace(addr: SocketAddr, path: &str) -> u16 {
    let req = format!("TRACE http://127.0.0.1:9{path} HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request(addr, req.as_bytes()).await).status
}

/// The file's text ("" while it does not exist).
fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Polls `cond` every 50 ms until it holds (true) or `timeout` passes (false).
async fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn logs_config(addr: &str, extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{addr}\"\n\n[log]\naccess = \"{{dir}}/access.log\"\nerror = \"{{dir}}/error.log\"\n\n\
         [cache]\nenabled = false\n\n{extra}"
    )
}

/// Renames both logs as logrotate does, sends SIGUSR1 to `signalled`, and
/// checks that the next request's lines land in new files while the
/// renamed ones keep the old lines. `serving`: the processes that write the
/// access log, each of which reopens it (a request a worker serves before
/// its own reopen is, rightly, logged in the old file).
async fn rotate_and_check(p: &Portico, signalled: &Portico, serving: usize) {
    let dir = p.dir();
    let (access, error) = (dir.join("access.log"), dir.join("error.log"));
    assert_eq!(trace(p.addr(), "/before-rotation").await, 405);
    assert!(
        eventually(Duration::from_secs(5), || read(&access).contains("/before-rotation")
            && read(&error).contains("/before-rotation"))
        .await,
        "the first request was not logged:\naccess: {}\nerror: {}",
        read(&access),
        read(&error)
    );
    let (access_old, error_old) = (dir.join("access.log.1"), dir.join("error.log.1"));
    std::fs::rename(&access, &access_old).expect("rename access.log");
    std::fs::rename(&error, &error_old).expect("rename error.log");
    signalled.signal(libc::SIGUSR1);
    assert!(
        eventually(Duration::from_secs(5), || read(&error)
            .contains("reopened the error log")
            && read(&error).matches("access log reopened").count() == serving)
        .await,
        "no reopen line in the new error log: {:?}\nold: {}",
        read(&error),
        read(&error_old)
    );
    assert_eq!(trace(p.addr(), "/after-rotation").await, 405);
    assert!(
        eventually(Duration::from_secs(5), || read(&access).contains("/after-rotation")
            && read(&error).contains("/after-rotation"))
        .await,
        "the request after SIGUSR1 did not reach the new files:\naccess: {:?}\nerror: {:?}",
        read(&access),
        read(&error)
    );
    let (access_old, error_old) = (read(&access_old), read(&error_old));
    assert!(
        access_old.contains("/before-rotation") && !access_old.contains("/after-rotation"),
        "{access_old}"
    );
    assert!(
        error_old.contains("/before-rotation") && !error_old.contains("/after-rotation"),
        "{error_old}"
    );
    assert!(!read(&access).contains("/before-rotation") && !read(&error).contains("/before-rotation"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_error_log_and_the_access_log() {
    let p = Portico::start(&logs_config(&free_addr(), "")).await;
    rotate_and_check(&p, &p, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_to_the_supervisor_reopens_the_logs_of_every_process() {
    // Whichever worker gets a request, its lines land in the new files;
    // the supervisor's and every worker's reopen lines do too.
    let p = Portico::start(&logs_config(&free_addr(), "[server]\nprocesses = 2\n")).await;
    rotate_and_check(&p, &p, 2).await;
    let error = p.dir().join("error.log");
    let all = [
        "supervisor reopened the error log",
        "worker 0: SIGUSR1: reopened",
        "worker 1: SIGUSR1: reopened",
    ];
    assert!(
        eventually(Duration::from_secs(5), || all.iter().all(|l| read(&error).contains(l))).await,
        "{}",
        read(&error)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starting_while_logs_are_rotated_is_not_killed_by_sigusr1() {
    // The supervisor forwards SIGUSR1 to every worker, one still starting
    // included, whose handler is not installed yet: the default action
    // killed it (and the supervisor restarted it). Worker 1 is killed here
    // and, while the supervisor starts it again, SIGUSR1 keeps coming.
    let p = Portico::start(&logs_config(&free_addr(), "[server]\nprocesses = 2\n")).await;
    let error = p.dir().join("error.log");
    let children = read(Path::new(&format!("/proc/{0}/task/{0}/children", p.pid())));
    let workers: Vec<i32> = children.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    assert_eq!(workers.len(), 2, "{children:?}");
    // SAFETY: kill takes a pid and a signal number; no memory is shared.
    assert_eq!(unsafe { libc::kill(workers[1], libc::SIGKILL) }, 0);
    let until = Instant::now() + Duration::from_millis(800);
    while Instant::now() < until {
        p.signal(libc::SIGUSR1);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let restarted = |log: &str| log.matches(" started (pid ").count() >= 3;
    assert!(
        eventually(Duration::from_secs(5), || restarted(&read(&error))).await,
        "{}",
        read(&error)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = read(&error);
    assert!(!log.contains("killed by signal 10"), "{log}");
    assert_eq!(
        log.matches(" started (pid ").count(),
        3,
        "one restart, for the SIGKILL: {log}"
    );
}

const BIN: &str = env!("CARGO_BIN_EXE_portico");

/// Runs `portico ARGS` with `env` added; its output.
fn portico(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(args).env_remove("PORTICO_CONFIG").env_remove("NOTIFY_SOCKET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap_or_else(|e| panic!("run {BIN}: {e}"))
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every subcommand a user types, which the completions and man page must name.
const SUBCOMMANDS: &[&str] = &["run", "check", "cache", "stats", "rules", "completions", "man"];

#[test]
fn bash_completions_name_every_subcommand_and_parse() {
    let out = portico(&["completions", "bash"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script = stdout(&out);
    for sub in SUBCOMMANDS {
        assert!(
            script.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == *sub),
            "no {sub} in:\n{script}"
        );
    }
    // Nested ones too: `portico cache purge`, `portico rules test`.
    assert!(script.contains("purge") && script.contains("test"));
    let path = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(path.path(), &script).expect("write completions");
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(path.path())
        .output()
        .expect("run bash -n");
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shell in ["zsh", "fish"] {
        let out = portico(&["completions", shell], &[]);
        assert!(
            out.status.success() && stdout(&out).contains("completions"),
            "{shell}: {out:?}"
        );
    }
    let bad = portico(&["completions", "tcsh"], &[]);
    assert!(!bad.status.success());
}

#[test]
fn the_man_page_names_every_subcommand_and_renders() {
    let out = portico(&["man"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let roff = stdout(&out);
    assert!(roff.contains(".TH PORTICO 1"), "{roff}");
    for sub in SUBCOMMANDS {
        assert!(roff.contains(&format!("portico\\-{sub}(1)")), "no {sub} in:\n{roff}");
    }
    assert!(roff.contains("PORTICO_CONFIG") && roff.contains("SIGUSR1"));
    // One page per subcommand, as `portico-run(1)` above refers to.
    let dir = tempfile::tempdir().expect("temp dir");
    let out = portico(&["man", "--dir", dir.path().to_str().expect("UTF-8 temp dir")], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for sub in SUBCOMMANDS {
        let page = read(&dir.path().join(format!("portico-{sub}.1")));
        assert!(
            page.contains(&format!(".TH PORTICO-{} 1", sub.to_uppercase())),
            "portico-{sub}.1: {page}"
        );
    }
    assert_eq!(read(&dir.path().join("portico.1")), roff);
    // `man -l` formats it, where man is installed.
    let rendered = std::process::Command::new("man")
        .arg("-l")
        .arg(dir.path().join("portico-run.1"))
        .env("MANWIDTH", "100")
        .env("MAN_KEEP_FORMATTING", "0")
        .output();
    match rendered {
        Ok(r) => {
            // Not a terminal: man emboldens by overstriking (`c\x08c`); drop that.
            let mut text = String::new();
            for c in String::from_utf8_lossy(&r.stdout).chars() {
                if c == '\u{8}' {
                    text.pop();
                } else {
                    text.push(c);
                }
            }
            assert!(
                r.status.success() && text.contains("--print-config"),
                "man -l: {text}\n{r:?}"
            );
        }
        Err(e) => eprintln!("man not available ({e}): rendering not checked"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portico_config_names_the_default_config_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = free_addr();
    let file = dir.path().join("portico.toml");
    std::fs::write(
        &file,
        format!(
            "[[listener]]\naddress = \"{addr}\"\n\n[log]\naccess = \"\"\nerror = \"{}/error.log\"\n\n[cache]\nenabled = false\n\n\
             [origin]\nnameservers = [\"127.0.0.1:9\"]\n",
            dir.path().display()
        ),
    )
    .expect("write config");
    let env = [("PORTICO_CONFIG", file.as_os_str())];
    // `check` without -c checks it, and `--help` says it is the one in use.
    let out = portico(&["check"], &env);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out).trim(), format!("{}: OK", file.display()));
    let help = stdout(&portico(&["run", "--help"], &env));
    assert!(help.contains(&format!("now {}", file.display())), "{help}");
    // Without it: nothing to check, and the help says the defaults apply.
    let out = portico(&["check"], &[]);
    if !Path::new("/etc/portico/portico.toml").exists() {
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("/etc/portico/portico.toml does not exist"));
        assert!(stdout(&portico(&["run", "--help"], &[])).contains("now the embedded defaults"));
    }
    // A missing file named by PORTICO_CONFIG is an error, not the defaults.
    let missing = dir.path().join("missing.toml");
    let out = portico(&["run"], &[("PORTICO_CONFIG", missing.as_os_str())]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("named by PORTICO_CONFIG"),
        "{out:?}"
    );
    // `run` without -c serves on the file's listener and logs which file it read.
    let mut child = std::process::Command::new(BIN)
        .arg("run")
        .env("PORTICO_CONFIG", &file)
        .env_remove("NOTIFY_SOCKET")
        .current_dir(dir.path())
        .spawn()
        .expect("spawn portico");
    let listening = eventually(Duration::from_secs(10), || std::net::TcpStream::connect(&addr).is_ok()).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        listening,
        "portico run did not listen on {addr}: {}",
        read(&dir.path().join("error.log"))
    );
    let log = read(&dir.path().join("error.log"));
    assert!(log.contains(&format!("config file: {}", file.display())), "{log}");
}

/// A unix datagram socket standing in for systemd's `$NOTIFY_SOCKET`.
struct NotifySocket {
    socket: std::os::unix::net::UnixDatagram,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    fn new() -> NotifySocket {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("set a read timeout");
        NotifySocket {
            socket,
            path,
            _dir: dir,
        }
    }

    /// The next message (blocking, 15 s at most); panics on timeout.
    fn next(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification within 15 s: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// The next message, which must have the line `key` (e.g. `READY=1`).
    fn expect(&self, key: &str) -> String {
        let msg = self.next();
        assert!(msg.lines().any(|l| l == key), "expected {key}, got {msg:?}");
        msg
    }
}

/// Starts portico with `NOTIFY_SOCKET` set; waits for `READY=1` and checks
/// that the listener accepts at that moment (not only later).
async fn start_notified(config: &str, addr: &str) -> (Portico, NotifySocket, String) {
    let notify = NotifySocket::new();
    let path = notify.path.clone();
    let config = config.to_string();
    let starting =
        tokio::spawn(async move { Portico::start_with_env(&config, &[("NOTIFY_SOCKET", path.as_os_str())]).await });
    let addr = addr.to_string();
    let (notify, ready, accepted) = tokio::task::spawn_blocking(move || {
        let ready = notify.expect("READY=1");
        let accepted = std::net::TcpStream::connect(&addr).map(|_| ());
        (notify, ready, accepted)
    })
    .await
    .expect("notify reader");
    let p = starting.await.expect("start portico");
    assert!(
        accepted.is_ok(),
        "READY=1 came before the listener accepted: {accepted:?}"
    );
    assert!(ready.lines().any(|l| l.starts_with("STATUS=")), "{ready:?}");
    (p, notify, ready)
}

/// SIGHUP gives RELOADING=1 (with MONOTONIC_USEC) then READY=1; SIGTERM
/// gives STOPPING=1 and the process exits.
async fn reload_and_stop(mut p: Portico, notify: NotifySocket) -> NotifySocket {
    p.signal(libc::SIGHUP);
    let notify = tokio::task::spawn_blocking(move || {
        let reloading = notify.expect("RELOADING=1");
        assert!(reloading.contains("MONOTONIC_USEC="), "{reloading:?}");
        notify.expect("READY=1");
        notify
    })
    .await
    .expect("notify reader");
    p.signal(libc::SIGTERM);
    let notify = tokio::task::spawn_blocking(move || {
        notify.expect("STOPPING=1");
        notify
    })
    .await
    .expect("notify reader");
    assert!(
        p.wait_exit(Duration::from_secs(10)).await.is_some(),
        "portico did not exit"
    );
    notify
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_socket_gets_ready_reloading_and_stopping() {
    let addr = free_addr();
    let (p, notify, ready) = start_notified(&logs_config(&addr, ""), &addr).await;
    assert!(ready.contains("STATUS=serving on 1 listeners"), "{ready:?}");
    reload_and_stop(p, notify).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_socket_with_processes_hears_the_supervisor_once_every_worker_is_ready() {
    let addr = free_addr();
    let (p, notify, ready) = start_notified(&logs_config(&addr, "[server]\nprocesses = 2\n"), &addr).await;
    // From the supervisor, once both workers have reported to it.
    assert!(ready.contains("STATUS=2 worker processes serving"), "{ready:?}");
    assert!(
        !ready.contains("PORTICO_WORKER"),
        "a worker's message reached systemd: {ready:?}"
    );
    let error = read(&p.dir().join("error.log"));
    assert_eq!(error.matches("listening on").count(), 2, "{error}");
    reload_and_stop(p, notify).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_socket_may_be_an_abstract_name() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("portico-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
    let socket = std::os::unix::net::UnixDatagram::bind_addr(&addr).expect("bind the abstract socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("set a read timeout");
    let listen = free_addr();
    let at = format!("@{name}");
    let _p = Portico::start_with_env(
        &logs_config(&listen, ""),
        &[("NOTIFY_SOCKET", std::ffi::OsStr::new(&at))],
    )
    .await;
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("READY=1 on the abstract socket");
    assert!(String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "READY=1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pid_file_is_written_once_listening_and_removed_at_exit() {
    for processes in [1, 2] {
        let extra = format!("[server]\nprocesses = {processes}\npid_file = \"{{dir}}/portico.pid\"\n");
        let mut p = Portico::start(&logs_config(&free_addr(), &extra)).await;
        let pid_file = p.dir().join("portico.pid");
        // Written just after the listeners are bound, which is when a
        // client (and this harness) can first connect: looked at until it
        // is there, as a service manager reads it after READY=1.
        eventually(Duration::from_secs(5), || !read(&pid_file).is_empty()).await;
        assert_eq!(read(&pid_file), format!("{}\n", p.pid()), "processes = {processes}");
        p.signal(libc::SIGTERM);
        assert!(
            p.wait_exit(Duration::from_secs(10)).await.is_some(),
            "portico did not exit"
        );
        assert!(
            !pid_file.exists(),
            "processes = {processes}: the pid file outlived the server"
        );
    }
}

/// The `Uid:` or `Gid:` line of /proc/PID/status: real, effective, saved, fs.
fn proc_ids(pid: u32, key: &str) -> Vec<u32> {
    let status = read(Path::new(&format!("/proc/{pid}/status")));
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|ids| ids.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| panic!("no {key} line for pid {pid}:\n{status}"))
}

/// `nobody`'s uid and primary gid from /etc/passwd.
fn nobody() -> (u32, u32) {
    let passwd = read(Path::new("/etc/passwd"));
    let line = passwd
        .lines()
        .find(|l| l.starts_with("nobody:"))
        .expect("a nobody user in /etc/passwd");
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().expect("uid"), f[3].parse().expect("gid"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A forward proxy as `nobody` with a disk cache in a directory `nobody`
/// can reach (the harness's temp dir is root's, 0700).
fn dropping_config(addr: &str, cache: &Path, extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{addr}\"\n\n[server]\nuser = \"nobody\"\n{extra}\n\
         [log]\naccess = \"{{dir}}/access.log\"\nerror = \"{{dir}}/error.log\"\n\n\
         [cache]\ndir = \"{}/cache\"\n",
        cache.display()
    )
}

/// A GET of the origin's `/cached` through the proxy; its status and body.
async fn get_through(addr: SocketAddr, origin: &Origin) -> (u16, String) {
    let req = format!(
        "GET http://{0}/cached HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n",
        origin.addr()
    );
    let resp = parse_response(&raw_request(addr, req.as_bytes()).await);
    (resp.status, resp.body_str())
}

/// The (recursive) files under `dir`, with their owner uid.
fn owners(dir: &Path) -> Vec<(std::path::PathBuf, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            out.push((path.clone(), m.uid()));
            if m.is_dir() {
                out.extend(owners(&path));
            }
        }
    }
    out
}

/// The stored objects under `dir` (files named by a 32-digit hex id).
fn objects(dir: &Path) -> Vec<std::path::PathBuf> {
    owners(dir)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.len() == 32 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .collect()
}

/// Started as root, Portico opens its cache before it switches to the
/// user, and the start-up scan runs in a thread of its own. Objects the
/// scan moves into new level directories (`cache.levels` changed) must
/// land in directories the user owns, where it can go on writing: the scan
/// waits for the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_root_the_cache_scan_makes_its_directories_as_the_user() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    let (uid, _) = nobody();
    let origin =
        Origin::start(|_req| async { Response::ok("from the origin").header("Cache-Control", "max-age=600") }).await;
    let cache = open_dir();
    let root = cache.path().join("cache");
    let mut p = Portico::start(&dropping_config(&free_addr(), cache.path(), "")).await;
    assert_eq!(get_through(p.addr(), &origin).await.0, 200);
    assert!(
        eventually(Duration::from_secs(10), || objects(&root).len() == 1).await,
        "{:?}",
        owners(&root)
    );
    let before = objects(&root);
    p.signal(libc::SIGTERM);
    assert!(
        p.wait_exit(Duration::from_secs(10)).await.is_some(),
        "portico did not exit"
    );
    let p = Portico::start(&(dropping_config(&free_addr(), cache.path(), "") + "levels = [3, 5]\n")).await;
    assert!(
        eventually(Duration::from_secs(10), || {
            let now = objects(&root);
            now.len() == 1 && now != before
        })
        .await,
        "not moved from {before:?}: {:?}",
        owners(&root)
    );
    let not_nobodys: Vec<_> = owners(&root).into_iter().filter(|(_, u)| *u != uid).collect();
    assert!(not_nobodys.is_empty(), "not nobody's: {not_nobodys:?}");
    // Still a hit from where it moved to.
    assert_eq!(get_through(p.addr(), &origin).await.0, 200);
    assert_eq!(origin.count(), 1, "the moved object was not found");
}

/// A directory every user can reach, for the cache of a server running as nobody.
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod 755");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_root_it_serves_as_the_configured_user() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    let (uid, gid) = nobody();
    let origin =
        Origin::start(|_req| async { Response::ok("from the origin").header("Cache-Control", "max-age=600") }).await;
    let cache = open_dir();
    let p = Portico::start(&dropping_config(&free_addr(), cache.path(), "")).await;
    // The socket listens from the bind on; the switch comes before the
    // first accept, which the error log's line marks.
    let error = p.dir().join("error.log");
    assert!(
        eventually(Duration::from_secs(10), || read(&error)
            .contains("switched to user nobody"))
        .await,
        "{}",
        read(&error)
    );
    assert_eq!(
        proc_ids(p.pid(), "Uid:"),
        vec![uid; 4],
        "real, effective, saved and fs uid"
    );
    assert_eq!(proc_ids(p.pid(), "Gid:"), vec![gid; 4]);
    let groups = read(Path::new(&format!("/proc/{}/status", p.pid())));
    assert!(
        groups.lines().any(|l| l.trim() == format!("Groups:\t{gid}").trim()),
        "{groups}"
    );
    // Requests work, the access log (opened as root) is still written,
    // and the disk cache Portico created belongs to nobody and fills.
    assert_eq!(
        get_through(p.addr(), &origin).await,
        (200, "from the origin".to_string())
    );
    assert_eq!(
        get_through(p.addr(), &origin).await,
        (200, "from the origin".to_string())
    );
    let access = p.dir().join("access.log");
    assert!(
        eventually(Duration::from_secs(5), || read(&access).matches("/cached").count() == 2).await,
        "access log: {:?}",
        read(&access)
    );
    assert_eq!(origin.count(), 1, "the second request was not a cache hit");
    let cached = owners(&cache.path().join("cache"));
    assert!(cached.iter().all(|(_, u)| *u == uid), "files not nobody's: {cached:?}");
    let error = read(&p.dir().join("error.log"));
    assert!(
        error.contains(&format!("switched to user nobody (uid {uid}, gid {gid})")),
        "{error}"
    );
    // The logs Portico created are nobody's, so a rotation can reopen them.
    for log in ["access.log", "error.log"] {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p.dir().join(log)).expect("log file");
        assert_eq!(m.uid(), uid, "{log}");
    }
}

/// As the Debian package leaves it: the cache directory exists already,
/// owned by the user (postinst made it), and Portico is started as root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cache_directory_the_user_owns_the_disk_tier_stores_after_the_switch() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    let (uid, gid) = nobody();
    let origin =
        Origin::start(|_req| async { Response::ok("from the origin").header("Cache-Control", "max-age=600") }).await;
    let cache = open_dir();
    let dir = cache.path().join("cache");
    std::fs::create_dir(&dir).expect("mkdir cache");
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown cache to nobody");
    let p = Portico::start(&dropping_config(&free_addr(), cache.path(), "")).await;
    assert_eq!(
        get_through(p.addr(), &origin).await,
        (200, "from the origin".to_string())
    );
    // The object reaches a file of the disk tier (written through its tmp
    // directory), and everything in the directory is nobody's.
    let stored = || {
        owners(&dir)
            .iter()
            .any(|(path, _)| path.is_file() && !path.starts_with(dir.join("tmp")))
    };
    assert!(
        eventually(Duration::from_secs(10), stored).await,
        "no object file in the disk cache: {:?}\n{}",
        owners(&dir),
        read(&p.dir().join("error.log"))
    );
    let cached = owners(&dir);
    assert!(cached.iter().all(|(_, u)| *u == uid), "files not nobody's: {cached:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_processes_every_worker_serves_as_the_configured_user() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    let (uid, _) = nobody();
    let origin = Origin::start(|_req| async { Response::ok("from the origin") }).await;
    let cache = open_dir();
    let p = Portico::start(&dropping_config(&free_addr(), cache.path(), "processes = 2\n")).await;
    let error = p.dir().join("error.log");
    until_both_switched(&error).await;
    let children = read(Path::new(&format!("/proc/{0}/task/{0}/children", p.pid())));
    let workers: Vec<u32> = children.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    assert_eq!(workers.len(), 2, "{children:?}");
    for &w in &workers {
        assert_eq!(proc_ids(w, "Uid:"), vec![uid; 4], "worker {w}");
    }
    for _ in 0..4 {
        assert_eq!(get_through(p.addr(), &origin).await.0, 200);
    }
    // As nobody, each worker still takes the config the supervisor sends
    // it (`config::source`) when it reloads.
    p.signal(libc::SIGHUP);
    assert!(
        eventually(Duration::from_secs(10), || read(&error).matches(": reloaded ").count()
            == 2)
        .await,
        "{}",
        read(&error)
    );
    assert!(!read(&error).contains("reload failed"), "{}", read(&error));
    // The supervisor killed outright: its workers still go. The kernel
    // clears a process's parent-death signal when it changes user, so a
    // worker that dropped privileges must set it again, or it is left
    // serving on its own, reparented to init.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &p.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let gone = |w: u32| {
        std::fs::read_to_string(format!("/proc/{w}/status"))
            .map_or(true, |s| s.lines().any(|l| l.starts_with("State:") && l.contains('Z')))
    };
    assert!(
        eventually(Duration::from_secs(10), || workers.iter().all(|&w| gone(w))).await,
        "workers outlived their killed supervisor: {workers:?}"
    );
}

#[test]
fn an_unknown_user_fails_start_up_and_check_warns() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("portico.toml");
    std::fs::write(
        &file,
        format!(
            "[[listener]]\naddress = \"{}\"\n\n[server]\nuser = \"no-such-user-here\"\n",
            free_addr()
        ),
    )
    .expect("write config");
    let path = file.to_str().expect("UTF-8 path");
    let out = portico(&["run", "-c", path], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.user \"no-such-user-here\": no such user"), "{err}");
    // The file is valid (it may be meant for another machine): check warns.
    let out = portico(&["check", "-c", path], &[]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: server.user \"no-such-user-here\": no such user"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_switch_sigusr1_reopens_logs_in_the_users_directory() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    let (uid, gid) = nobody();
    for processes in [1usize, 2] {
        // As /var/log/portico in a package: a directory the user owns.
        let logs = open_dir();
        std::os::unix::fs::chown(logs.path(), Some(uid), Some(gid)).expect("chown the log directory");
        let l = logs.path().display();
        let config = format!(
            "[[listener]]\naddress = \"{}\"\n\n[server]\nuser = \"nobody\"\nprocesses = {processes}\n\n\
             [log]\naccess = \"{l}/access.log\"\nerror = \"{l}/error.log\"\n\n[cache]\nenabled = false\n",
            free_addr()
        );
        let p = Portico::start(&config).await;
        let (access, error) = (logs.path().join("access.log"), logs.path().join("error.log"));
        assert!(
            eventually(Duration::from_secs(10), || read(&error)
                .matches("switched to user nobody")
                .count()
                == processes)
            .await
        );
        assert_eq!(trace(p.addr(), "/before-rotation").await, 405);
        assert!(eventually(Duration::from_secs(5), || read(&access).contains("/before-rotation")).await);
        std::fs::rename(&access, logs.path().join("access.log.1")).expect("rename access.log");
        std::fs::rename(&error, logs.path().join("error.log.1")).expect("rename error.log");
        p.signal(libc::SIGUSR1);
        // Every process reopened both (the supervisor created the new error
        // log as root and gave it to the workers' user).
        assert!(
            eventually(Duration::from_secs(5), || read(&error)
                .matches("access log reopened")
                .count()
                == processes
                && read(&error).matches("SIGUSR1: reopened the error log").count() == processes)
            .await,
            "processes = {processes}: {:?}",
            read(&error)
        );
        assert!(!read(&error).contains("cannot reopen"), "{}", read(&error));
        assert_eq!(trace(p.addr(), "/after-rotation").await, 405);
        assert!(
            eventually(Duration::from_secs(5), || read(&access).contains("/after-rotation")
                && read(&error).contains("/after-rotation"))
            .await
        );
        use std::os::unix::fs::MetadataExt;
        for f in [&access, &error] {
            assert_eq!(std::fs::metadata(f).expect("new log").uid(), uid, "{}", f.display());
        }
    }
}

/// As the Debian package runs it: started as root with the pid file in a
/// directory the user owns (`/run/portico`), the server that switched to
/// the user still recognises the file as its own at exit and removes it.
/// The file is written as root under a umask of at least 027, so it must
/// stay readable by others, as nginx's and Squid's pid files are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_root_the_pid_file_is_removed_at_exit_after_the_switch() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let (uid, gid) = nobody();
    for processes in [1, 2] {
        let cache = open_dir();
        let run = cache.path().join("run");
        std::fs::create_dir(&run).expect("mkdir run");
        std::os::unix::fs::chown(&run, Some(uid), Some(gid)).expect("chown run to nobody");
        let pid_file = run.join("portico.pid");
        let extra = format!("processes = {processes}\npid_file = \"{}\"\n", pid_file.display());
        let mut p = Portico::start(&dropping_config(&free_addr(), cache.path(), &extra)).await;
        let error = p.dir().join("error.log");
        assert!(
            eventually(Duration::from_secs(10), || read(&error)
                .matches("switched to user nobody")
                .count()
                == processes)
            .await,
            "{}",
            read(&error)
        );
        assert_eq!(read(&pid_file), format!("{}\n", p.pid()), "processes = {processes}");
        let mode = std::fs::metadata(&pid_file).expect("pid file").permissions().mode();
        assert_eq!(mode & 0o777, 0o644, "processes = {processes}: pid file mode {mode:o}");
        p.signal(libc::SIGTERM);
        assert!(
            p.wait_exit(Duration::from_secs(10)).await.is_some(),
            "portico did not exit"
        );
        assert!(
            !pid_file.exists(),
            "processes = {processes}: the pid file outlived the server: {}",
            read(&error)
        );
    }
}

/// With `processes = N` and `user`, a reload the supervisor validated (as
/// root) that a worker cannot apply as `nobody` (here an htpasswd file only
/// root may read) is not left half-done: each worker tells the supervisor
/// how its reload went, and one that could not is replaced by a worker
/// started on the new configuration, which reads the files it names
/// before it switches user, as every starting worker does. Both then
/// challenge for credentials; before, they kept serving without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_processes_a_worker_that_cannot_apply_a_reload_as_its_user_is_replaced() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    let origin = Origin::start(|_req| async { Response::ok("from the origin") }).await;
    let (_cache, config, p, error) = two_workers_as_nobody().await;
    assert_eq!(get_through(p.addr(), &origin).await.0, 200);
    let users = p.dir().join("users.htpasswd");
    root_only_htpasswd(&users);
    p.rewrite_config(&format!(
        "{config}\n[auth]\nhtpasswd = \"{}\"\nrequired = true\n",
        users.display()
    ));
    p.signal(libc::SIGHUP);
    // The supervisor saw it coming.
    nobody_cannot_read_warned(&error, &users).await;
    let said = "could not apply the configuration the supervisor validated";
    assert!(
        eventually(Duration::from_secs(10), || read(&error).matches(said).count() == 2).await,
        "{}",
        read(&error)
    );
    assert!(read(&error).contains("Permission denied"), "{}", read(&error));
    // Their successors run it, whichever of them takes the request.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut challenged = 0;
    while challenged < 6 {
        assert!(
            Instant::now() < deadline,
            "still served without credentials\n{}",
            read(&error)
        );
        // A connection still queued on a replaced worker's socket when
        // it closes is closed unanswered (the kernel does not move it to
        // another socket of the group): not yet the successors.
        let req = format!(
            "GET http://{0}/cached HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n",
            origin.addr()
        );
        let answer = raw_request(p.addr(), req.as_bytes()).await;
        if !answer.is_empty() && parse_response(&answer).status == 407 {
            challenged += 1;
        } else {
            challenged = 0;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        read(&error).contains("those that could not are being replaced"),
        "{}",
        read(&error)
    );
}

/// With `processes = N` and `user`, the supervisor (root) makes every
/// listener socket and hands it to its worker, at start and on a reload,
/// so all belong to root, whoever listens on them. SO_REUSEPORT sockets of
/// different owners conflict: before, a listener a reload added was bound
/// by the workers as `nobody`, and a worker restarted after a crash could
/// not bind it as root and never came back; and no other program running
/// as `nobody` may join the group and take connections. A reload may add
/// a port below 1024 too, which the workers could not bind themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_processes_the_supervisor_makes_every_listener_socket_root_owned() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no privilege to drop");
        return;
    }
    let origin = Origin::start(|_req| async { Response::ok("from the origin") }).await;
    let (_cache, config, p, error) = two_workers_as_nobody().await;
    // (At start a worker binding its own would be root's too: the
    // reloads below are what tell.)
    assert_eq!(listening_owners(p.addr()), [0, 0], "at start");
    let added: SocketAddr = free_addr().parse().expect("address");
    let low = free_low_port();
    let applied = "reload: applied by every worker";
    let reloads = [
        format!("\n[[listener]]\naddress = \"{added}\"\n"),
        format!("\n[[listener]]\naddress = \"{added}\"\n# and again\n"),
        format!("\n[[listener]]\naddress = \"{added}\"\n\n[[listener]]\naddress = \"{low}\"\n"),
    ];
    for (n, more) in reloads.iter().enumerate() {
        p.rewrite_config(&format!("{config}{more}"));
        p.signal(libc::SIGHUP);
        assert!(
            eventually(Duration::from_secs(10), || read(&error).matches(applied).count()
                == n + 1)
            .await,
            "reload {n}\n{}",
            read(&error)
        );
        assert_eq!(get_through(added, &origin).await.0, 200, "reload {n}");
        assert_eq!(listening_owners(added), [0, 0], "reload {n}");
    }
    assert_eq!(get_through(low, &origin).await.0, 200, "the port below 1024");
    assert_eq!(listening_owners(low), [0, 0], "the port below 1024");
    let log = read(&error);
    assert!(
        !log.contains("reload failed") && !log.contains("could not apply"),
        "{log}"
    );
    // A worker killed now is started again, listens on every listener
    // and switches to the user like the first two.
    let pid = worker_pid(&log, 0);
    // SAFETY: kill has no memory-safety preconditions; the pid is a worker's.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        eventually(Duration::from_secs(10), || read(&error)
            .matches("switched to user nobody")
            .count()
            == 3)
        .await,
        "{}",
        read(&error)
    );
    assert!(!read(&error).contains("cannot bind"), "{}", read(&error));
    for addr in [p.addr(), added, low] {
        assert!(
            eventually(Duration::from_secs(5), || listening_owners(addr) == [0, 0]).await,
            "{addr} after the restart: {:?}",
            listening_owners(addr)
        );
        assert_eq!(get_through(addr, &origin).await.0, 200, "{addr} after the restart");
    }
}

/// The owners (uids) of the sockets listening on `addr` (IPv4), from
/// /proc/net/tcp, sorted.
fn listening_owners(addr: SocketAddr) -> Vec<u32> {
    let SocketAddr::V4(v4) = addr else {
        panic!("IPv4 only: {addr}");
    };
    let local = format!("{:08X}:{:04X}", u32::from_le_bytes(v4.ip().octets()), v4.port());
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let mut uids: Vec<u32> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A")).then(|| f[7].parse().expect("uid"))
        })
        .collect();
    uids.sort_unstable();
    uids
}

/// A loopback address on a port below 1024 that nothing holds.
fn free_low_port() -> SocketAddr {
    (900..1024)
        .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
        .find(|a| std::net::TcpListener::bind(a).is_ok())
        .expect("a free port below 1024")
}

/// The pid of worker `i` in the supervisor's `worker I started (pid P)`
/// lines of `log` (the first).
fn worker_pid(log: &str, i: usize) -> libc::pid_t {
    let prefix = format!("worker {i} started (pid ");
    log.lines()
        .find_map(|l| l.split_once(&prefix).and_then(|(_, rest)| rest.strip_suffix(')')))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid for worker {i} in\n{log}"))
}

/// As root with `server.user`, `portico check` and a starting server warn
/// of each file the configuration names that the user cannot read, by
/// path and key: here an htpasswd file only root may read, and a busy
/// page that is readable but in a directory only root may enter (which the
/// file's own mode does not show: the kernel is asked, as the user), and
/// the configuration file itself when one process reads it again at a
/// reload. The server starts all the same (it reads them as root), and
/// says so once per server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_root_check_and_start_warn_of_files_the_user_cannot_read() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no user to read as");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    let open = open_dir();
    let users = open.path().join("users.htpasswd");
    root_only_htpasswd(&users);
    let closed = open.path().join("closed");
    std::fs::create_dir(&closed).expect("mkdir");
    mode(&closed, 0o700);
    let busy = closed.join("busy.html");
    std::fs::write(&busy, "busy").expect("write busy page");
    mode(&busy, 0o644);
    let addr = free_addr();
    let config = |extra: &str| {
        format!(
            "[[listener]]\naddress = \"{addr}\"\nbusy_file = \"{}\"\n\n[server]\nuser = \"nobody\"\n{extra}\n\
             [log]\naccess = \"{{dir}}/access.log\"\nerror = \"{{dir}}/error.log\"\n\n\
             [cache]\ndir = \"{}/cache\"\n\n[auth]\nhtpasswd = \"{}\"\n",
            busy.display(),
            open.path().display(),
            users.display()
        )
    };
    let warned_users = format!(
        "server.user \"nobody\" cannot read {} (auth.htpasswd: ",
        users.display()
    );
    let warned_busy = format!(
        "server.user \"nobody\" cannot read {} (listener {addr} busy_file: ",
        busy.display()
    );
    // The configuration file itself, in that directory too: one process
    // reads it again at a reload, as the user; workers are handed it.
    let check_closed = |extra: &str| {
        let path = closed.join("portico.toml");
        std::fs::write(&path, config(extra).replace("{dir}", &open.path().to_string_lossy())).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
            .arg("check")
            .arg("-c")
            .arg(&path)
            .output()
            .expect("run portico check");
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        said
    };
    let warned_config = format!(
        "server.user \"nobody\" cannot read {} (the configuration file: ",
        closed.join("portico.toml").display()
    );
    let said = check_closed("");
    assert!(said.contains(&warned_users), "{said}");
    assert!(said.contains(&warned_busy), "{said}");
    assert!(said.contains(&warned_config), "{said}");
    assert!(said.contains("a reload reads it again"), "{said}");
    let said = check_closed("processes = 2\n");
    assert!(said.contains(&warned_users) && said.contains(&warned_busy), "{said}");
    assert!(!said.contains("configuration file"), "{said}");
    // Readable by the user: nothing to say.
    mode(&users, 0o644);
    mode(&closed, 0o755);
    let out = Portico::check(&config(""));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success() && !said.contains("cannot read"), "{said}");
    // The server says it at start, once, with one process or several.
    mode(&users, 0o600);
    for extra in ["", "processes = 2\n"] {
        let mut p = Portico::start(&config(extra)).await;
        let error = p.dir().join("error.log");
        let switched = if extra.is_empty() { 1 } else { 2 };
        assert!(
            eventually(Duration::from_secs(10), || read(&error)
                .matches("switched to user nobody")
                .count()
                == switched)
            .await,
            "{extra}{}",
            read(&error)
        );
        assert_eq!(
            read(&error).matches(&warned_users).count(),
            1,
            "{extra}{}",
            read(&error)
        );
        assert!(!read(&error).contains(&warned_busy), "{extra}{}", read(&error));
        p.signal(libc::SIGTERM);
        assert!(
            p.wait_exit(Duration::from_secs(10)).await.is_some(),
            "{extra}: portico did not exit"
        );
    }
}

/// The supervisor's warning at a reload is for the user the workers run
/// as: a reload that also changes `server.user` (a restart-only setting,
/// kept) is checked as the user in force, not the one it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_processes_a_reload_is_checked_for_the_user_the_workers_run_as() {
    if !is_root() {
        eprintln!("skipped: not root, so there is no user to read as");
        return;
    }
    let (cache, config, p, error) = two_workers_as_nobody().await;
    // Readable by daemon alone (the supervisor reads no more of it than
    // whether the user can).
    let users = cache.path().join("users.htpasswd");
    root_only_htpasswd(&users);
    let id = |flag: &str| -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, "daemon"])
            .output()
            .expect("run id");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("an id")
    };
    std::os::unix::fs::chown(&users, Some(id("-u")), Some(id("-g"))).expect("chown to daemon");
    p.rewrite_config(
        &(config.replace("user = \"nobody\"", "user = \"daemon\"")
            + &format!("\n[auth]\nhtpasswd = \"{}\"\n", users.display())),
    );
    p.signal(libc::SIGHUP);
    nobody_cannot_read_warned(&error, &users).await;
}

/// Waits (10 s at most) for the supervisor's warning, at a reload, that
/// `nobody` (the user in force) cannot read `users` (`auth.htpasswd`), in
/// the error log at `error`.
async fn nobody_cannot_read_warned(error: &Path, users: &Path) {
    let warned = format!(
        "reload: server.user \"nobody\" cannot read {} (auth.htpasswd: ",
        users.display()
    );
    assert!(
        eventually(Duration::from_secs(10), || read(error).contains(&warned)).await,
        "{}",
        read(error)
    );
}

/// As root: a two-process forward proxy switching to `nobody`, with its
/// cache in a directory `nobody` can reach, both workers switched: the
/// directory, the config, the server and its error log.
async fn two_workers_as_nobody() -> (tempfile::TempDir, String, Portico, std::path::PathBuf) {
    let cache = open_dir();
    let config = dropping_config(&free_addr(), cache.path(), "processes = 2\n");
    let p = Portico::start(&config).await;
    let error = p.dir().join("error.log");
    until_both_switched(&error).await;
    (cache, config, p, error)
}

/// An htpasswd file at `path` (alice, secret) only its owner may read.
fn root_only_htpasswd(path: &Path) {
    let made = std::process::Command::new("htpasswd")
        .args(["-cbB", &path.to_string_lossy(), "alice", "secret"])
        .output()
        .expect("run htpasswd");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Waits until both workers have logged their switch to `nobody` in
/// `error` (panics after 10 s).
async fn until_both_switched(error: &Path) {
    assert!(
        eventually(Duration::from_secs(10), || read(error)
            .matches("switched to user nobody")
            .count()
            == 2)
        .await,
        "{}",
        read(error)
    );
}
