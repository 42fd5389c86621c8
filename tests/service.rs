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
/// renamed ones keep the old lines.
async fn rotate_and_check(p: &Portico, signalled: &Portico) {
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
            && read(&error).contains("access log reopened"))
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
    rotate_and_check(&p, &p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_to_the_supervisor_reopens_the_logs_of_every_process() {
    // Whichever worker gets a request, its lines land in the new files;
    // the supervisor's and every worker's reopen lines do too.
    let p = Portico::start(&logs_config(&free_addr(), "[server]\nprocesses = 2\n")).await;
    rotate_and_check(&p, &p).await;
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
