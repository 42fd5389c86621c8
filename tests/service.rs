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
