//! Multi-process mode through the real binary: `processes = 2` starts a
//! supervisor and two workers sharing the listener (SO_REUSEPORT); both
//! serve, each with its own memory tier; a worker killed with SIGKILL is
//! restarted; SIGTERM and SIGHUP to the supervisor reach every worker.
//!
//! Which worker served a connection is read from /proc: the process holding
//! the server side of the connection's socket.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An origin answering `<name> <path>`, cacheable for 10 minutes; `/slow`
/// answers after 2 s.
async fn origin(name: &'static str) -> Origin {
    Origin::start(move |req| async move {
        let resp = Response::ok(format!("{name} {}", req.uri)).header("Cache-Control", "max-age=600");
        if req.uri.path() == "/slow" {
            resp.delay(Duration::from_secs(2))
        } else {
            resp
        }
    })
    .await
}

/// Two worker processes, one reverse listener routing to upstream `to`
/// (`a` or `b`), memory-only cache.
fn config(addr: &str, a: &Origin, b: &Origin, to: &str) -> String {
    config_with_disk(addr, a, b, to, "0B")
}

/// As [`config`], with a disk tier of `disk` under `{dir}/cache`.
fn config_with_disk(addr: &str, a: &Origin, b: &Origin, to: &str, disk: &str) -> String {
    format!(
        "[server]\nprocesses = 2\nworkers = 1\n\n\
         [[listener]]\naddress = \"{addr}\"\nmode = \"reverse\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndisk = \"{disk}\"\ndir = \"{{dir}}/cache\"\n\n\
         [[upstream]]\nname = \"a\"\nservers = [\"{}\"]\n\n\
         [[upstream]]\nname = \"b\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nhost = \"*\"\nupstream = \"{to}\"\n",
        a.addr(),
        b.addr()
    )
}

/// The pid of each worker index, from the supervisor's
/// `worker I started (pid P)` lines (the latest per index).
fn worker_pids(p: &Portico) -> BTreeMap<usize, u32> {
    let mut pids = BTreeMap::new();
    for line in p.stderr().lines() {
        let Some(rest) = line.split("worker ").nth(1) else {
            continue;
        };
        let Some((index, rest)) = rest.split_once(" started (pid ") else {
            continue;
        };
        let (Ok(i), Some(Ok(pid))) = (index.parse(), rest.strip_suffix(')').map(str::parse)) else {
            continue;
        };
        pids.insert(i, pid);
    }
    pids
}

/// Waits until the supervisor has logged a start for workers 0 and 1.
async fn both_started(p: &Portico) -> BTreeMap<usize, u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = worker_pids(p);
        // Spawned is not enough: a worker has read its config and sized
        // itself once it logs its sizing line.
        let err = p.stderr();
        if pids.len() == 2 && err.contains("worker 0: sizing:") && err.contains("worker 1: sizing:") {
            return pids;
        }
        assert!(Instant::now() < deadline, "workers not started\n{}", p.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Origins `a` and `b`, a two-worker server routing to `a` (both workers
/// started), each worker's pid by index, and the set of those pids.
async fn two_workers() -> (Origin, Origin, Portico, BTreeMap<usize, u32>, BTreeSet<u32>) {
    let a = origin("a").await;
    let b = origin("b").await;
    let p = Portico::start(&config(&free_addr(), &a, &b, "a")).await;
    let pids = both_started(&p).await;
    let all = pids.values().copied().collect();
    (a, b, p, pids, all)
}

/// The inode of the server side of the connection from `client` to `server`,
/// once a process has accepted it (0 while it waits in the accept queue).
fn server_inode(server: SocketAddr, client: SocketAddr) -> Option<u64> {
    server_side(server, client).map(|s| s.inode).filter(|inode| *inode != 0)
}

/// Which of `pids` holds socket `inode` open.
fn owner(pids: &BTreeSet<u32>, inode: u64) -> Option<u32> {
    let target = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_str() == Some(target.as_str())))
        })
    })
}

/// Which of `pids` accepted the connection from `client` to `addr`,
/// looked for for 5 s at most.
async fn worker_holding(addr: SocketAddr, client: SocketAddr, pids: &BTreeSet<u32>) -> Option<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = server_inode(addr, client).and_then(|inode| owner(pids, inode));
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `GET path` on a new connection: the pid (among `pids`) that accepted it
/// and the response.
async fn get_via(addr: SocketAddr, path: &str, pids: &BTreeSet<u32>) -> (Option<u32>, ParsedResponse) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let client = stream.local_addr().expect("local addr");
    let served_by = worker_holding(addr, client, pids).await;
    let req = format!("GET {path} HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.expect("write request");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .expect("response in time")
        .expect("read response");
    (served_by, parse_response(&buf))
}

fn process_exists(pid: u32) -> bool {
    // A zombie still has a /proc entry; its state is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_serve_from_both_workers_and_survive_kill_9() {
    let (a, _b, p, pids, all) = two_workers().await;
    let addr = p.addr();
    assert!(!all.contains(&p.pid()), "the supervisor is not a worker");
    // The supervisor advises moving queued connections of a closing
    // worker's sockets to the others when the kernel would reset them.
    let migrate = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req").ok();
    assert_eq!(
        p.stderr().contains("net.ipv4.tcp_migrate_req is 0"),
        migrate.as_deref().map(str::trim) == Some("0"),
        "{}",
        p.stderr()
    );

    // New connections land on both workers; each has its own memory tier,
    // so the cacheable page is fetched once per worker.
    let mut seen = BTreeSet::new();
    let mut misses = 0;
    for _ in 0..200 {
        let (by, resp) = get_via(addr, "/page", &all).await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body_str(), "a /page");
        misses += usize::from(resp.header("x-cache") == Some("MISS"));
        seen.insert(by.expect("a worker accepted the connection"));
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, all, "not every worker served a connection");
    assert_eq!(misses, 2, "one miss per worker's memory tier");
    assert_eq!(a.requests().iter().filter(|r| r.uri.path() == "/page").count(), 2);

    // SIGKILL one worker: the supervisor logs it and starts another.
    let victim = pids[&0];
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let replacement = loop {
        let now = worker_pids(&p);
        if now[&0] != victim {
            break now[&0];
        }
        assert!(Instant::now() < deadline, "worker 0 not restarted\n{}", p.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = p.stderr();
    let exit_line = log
        .lines()
        .find(|l| l.contains(&format!("worker 0 (pid {victim}) exited")))
        .unwrap_or_else(|| panic!("no exit logged\n{log}"));
    assert!(exit_line.contains("WARN"), "{exit_line}");
    assert!(exit_line.contains("killed by signal 9 (SIGKILL)"), "{exit_line}");
    assert!(!process_exists(victim));

    // Requests keep succeeding, and the new worker takes its share.
    let live: BTreeSet<u32> = [pids[&1], replacement].into();
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        let (by, resp) = get_via(addr, "/page", &live).await;
        assert_eq!(resp.status, 200, "{}", p.stderr());
        assert_eq!(resp.body_str(), "a /page");
        seen.insert(by.expect("a live worker accepted the connection"));
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, live, "the restarted worker does not serve");
    // Its memory tier started empty.
    assert_eq!(a.requests().iter().filter(|r| r.uri.path() == "/page").count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_supervisor_drains_every_worker_and_exits_0() {
    let a = origin("a").await;
    let b = origin("b").await;
    let mut p = Portico::start(&config(&free_addr(), &a, &b, "a")).await;
    let addr = p.addr();
    let pids = both_started(&p).await;
    let before = a.count();
    let slow = tokio::spawn(async move {
        let mut c = RawClient::connect(addr).await;
        c.send(b"GET /slow HTTP/1.1\r\nHost: www.example.com\r\n\r\n").await;
        c.read_response().await
    });
    assert!(a.wait_count(before + 1, Duration::from_secs(5)).await);
    p.signal(libc::SIGTERM);
    let refused = {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            if TcpStream::connect(addr).await.is_err() {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert!(refused, "still accepting after SIGTERM");
    let resp = slow.await.expect("slow request");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), "a /slow");
    assert_eq!(resp.header("connection"), Some("close"));
    let status = p
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("supervisor did not exit");
    assert!(status.success(), "{status}\n{}", p.stderr());
    for pid in pids.values() {
        assert!(!process_exists(*pid), "worker {pid} still running");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_to_the_supervisor_reloads_every_worker_unless_the_file_is_invalid() {
    let a = origin("a").await;
    let b = origin("b").await;
    let addr = free_addr();
    let p = Portico::start(&config(&addr, &a, &b, "a")).await;
    let pids = both_started(&p).await;
    let all: BTreeSet<u32> = pids.values().copied().collect();
    let text = config(&addr, &a, &b, "b").replace("{dir}", p.dir().to_str().expect("utf-8"));
    p.rewrite_config(&text);
    // Sent at once, as the workers have just started.
    p.signal(libc::SIGHUP);
    until_all_on_b(&p, &all, "w").await;
    // Each worker told the supervisor it applied it.
    p.until_logged("reload: applied by every worker", 1).await;
    for i in 0..20 {
        let (by, resp) = get_via(p.addr(), &format!("/x{i}"), &all).await;
        assert_eq!(
            resp.body_str(),
            format!("b /x{i}"),
            "worker {by:?} went back to the old route"
        );
    }

    // An invalid file: the supervisor says why and the workers keep running on b.
    std::fs::write(p.config_path(), "[server]\nprocesses = 0\n").expect("rewrite config");
    p.signal(libc::SIGHUP);
    let log = p.until_logged("reload failed", 1).await;
    assert_eq!(
        log.matches("reload failed").count(),
        1,
        "only the supervisor reads it:\n{log}"
    );
    assert!(log.contains("portico.toml:2: key `server.processes`"), "{log}");
    for i in 0..10 {
        let (_, resp) = get_via(p.addr(), &format!("/y{i}"), &all).await;
        assert_eq!(resp.body_str(), format!("b /y{i}"));
    }
    assert_eq!(worker_pids(&p), pids, "no worker was restarted");
}

/// SIGKILLs worker `i` (pid `victim`) and waits until its replacement has
/// served a request; every response on the way must be `expect(path)`.
/// Returns the replacement's pid.
async fn replace_worker(p: &Portico, i: usize, victim: u32, other: u32, expect: impl Fn(&str) -> String) -> u32 {
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "worker {i} not serving again\n{}",
            p.stderr()
        );
        let now = worker_pids(p)[&i];
        if now == victim {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let live: BTreeSet<u32> = [other, now].into();
        let path = format!("/r{i}-{n}");
        n += 1;
        let (by, resp) = get_via(p.addr(), &path, &live).await;
        assert_eq!(resp.body_str(), expect(&path), "served by {by:?}\n{}", p.stderr());
        if by == Some(now) {
            return now;
        }
    }
}

/// A worker restarted after the config file was edited but not reloaded
/// runs the config the others run (what the supervisor last validated,
/// handed in a sealed memory file, `config::source`): not the edit, and
/// not a failure to start over an invalid file. A SIGHUP sent to a worker
/// directly does not make it read the file either. A reload through the
/// supervisor then puts the edit in force everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_runs_the_config_in_force_not_the_file_as_edited() {
    let (a, b, p, pids, _) = two_workers().await;
    let addr = p.addr().to_string();
    let on_a = |path: &str| format!("a {path}");

    // Edited to route to b, not reloaded.
    p.rewrite_config(&config(&addr, &a, &b, "b"));
    let first = replace_worker(&p, 0, pids[&0], pids[&1], on_a).await;

    // Edited into an invalid file: the next restart still serves.
    std::fs::write(p.config_path(), "[server]\nprocesses = 0\n").expect("rewrite config");
    let second = replace_worker(&p, 1, pids[&1], first, on_a).await;
    assert!(
        !p.stderr().contains("key `server.processes`"),
        "nobody read the invalid file:\n{}",
        p.stderr()
    );

    // A SIGHUP sent to a worker directly (by anyone allowed to signal it:
    // `server.user`) reloads what the supervisor validated, not the file,
    // edited to route to b again and left so.
    p.rewrite_config(&config(&addr, &a, &b, "b"));
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(first as i32, libc::SIGHUP) }, 0);
    p.until_logged(": reloaded ", 1).await;
    let live: BTreeSet<u32> = [first, second].into();
    for n in 0..20 {
        let (by, resp) = get_via(p.addr(), &format!("/d{n}"), &live).await;
        assert_eq!(resp.body_str(), format!("a /d{n}"), "worker {by:?}");
    }
    let third = replace_worker(&p, 0, first, second, on_a).await;

    // Reloaded: both workers, the restarted ones, go to b.
    p.rewrite_config(&config(&addr, &a, &b, "b"));
    p.signal(libc::SIGHUP);
    until_all_on_b(&p, &[third, second].into(), "h").await;
}

/// Sends requests (paths `/{prefix}N`) until each of `all` has answered
/// one from upstream `b` (10 s at most).
async fn until_all_on_b(p: &Portico, all: &BTreeSet<u32>, prefix: &str) {
    let mut on_b = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    while on_b != *all {
        assert!(
            Instant::now() < deadline,
            "workers on b: {on_b:?} of {all:?}\n{}",
            p.stderr()
        );
        let path = format!("/{prefix}{i}");
        let (by, resp) = get_via(p.addr(), &path, all).await;
        if resp.body_str() == format!("b {path}") {
            on_b.insert(by.expect("accepted"));
        }
        i += 1;
    }
}

/// `server.workers` as worker `i` runs it, from its own figures, once they
/// come from process `pid` (10 s at most).
async fn workers_setting(addr: SocketAddr, i: usize, pid: u32, pids: &BTreeSet<u32>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, status, body) = monitor_page(addr, &format!("/.stats.json?worker={i}"), pids).await;
        if status == 200 {
            let server = &json(&body)["snapshot"]["server"];
            if server["pid"].as_u64() == Some(u64::from(pid)) {
                return server["workers"].as_u64().expect("server.workers");
            }
        }
        assert!(
            Instant::now() < deadline,
            "no figures of worker {i} from pid {pid}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A reload changing a restart-only setting (`server.workers`) keeps the
/// old value in every worker, and so does a worker restarted after it: it
/// gets the text the supervisor started on beside the one validated last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_after_a_reload_keeps_the_restart_only_settings_the_others_kept() {
    let (a, b, p, pids, all) = two_workers().await;
    let addr = p.addr().to_string();
    assert_eq!(workers_setting(p.addr(), 0, pids[&0], &all).await, 1, "workers = 1");
    p.rewrite_config(&config(&addr, &a, &b, "b").replace("workers = 1", "workers = 2"));
    p.signal(libc::SIGHUP);
    p.until_logged(": reloaded ", 2).await;
    let changed = "`server.workers` changed (1 -> 2): needs restart";
    assert_eq!(p.stderr().matches(changed).count(), 2, "{}", p.stderr());
    let on_b = |path: &str| format!("b {path}");
    let replacement = replace_worker(&p, 0, pids[&0], pids[&1], on_b).await;
    let live = [replacement, pids[&1]].into();
    assert_eq!(
        workers_setting(p.addr(), 0, replacement, &live).await,
        1,
        "the restarted worker kept workers = 1"
    );
}

/// SIGHUP and SIGUSR1 sent to a worker the moment the supervisor has
/// started it (before it can have its handlers) neither kill it nor are
/// lost: it reloads once it serves (the supervisor starts it with them
/// blocked). Killed by them, it would be restarted ("killed by signal 1").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_sent_to_a_worker_as_it_starts_wait_for_it() {
    let (_a, _b, p, pids, _) = two_workers().await;
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pids[&0] as i32, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let fresh = loop {
        let now = worker_pids(&p)[&0];
        if now != pids[&0] {
            break now;
        }
        assert!(Instant::now() < deadline, "not restarted\n{}", p.stderr());
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    // SAFETY: as above.
    unsafe {
        libc::kill(fresh as i32, libc::SIGHUP);
        libc::kill(fresh as i32, libc::SIGUSR1);
    }
    let log = p.until_logged("worker 0: reloaded ", 1).await;
    assert!(!log.contains(&format!("worker 0 (pid {fresh}) exited")), "{log}");
    assert_eq!(worker_pids(&p)[&0], fresh, "{log}");
}

/// A SIGHUP that reaches a worker before it has its handler waits
/// (blocked, as the supervisor starts it) and reloads the worker once it
/// can: it neither kills it (the default action) nor is lost. Here the
/// worker is started by hand with SIGHUP blocked and already pending.
#[test]
fn a_sighup_pending_when_a_worker_starts_reloads_it_once_it_serves() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("portico.toml");
    std::fs::write(
        &config,
        format!(
            "[[listener]]\naddress = \"{}\"\n\n[log]\naccess = \"{}/access.log\"\n",
            free_addr(),
            dir.path().display()
        ),
    )
    .expect("write config");
    let stderr = std::fs::File::create(dir.path().join("stderr")).expect("stderr file");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_portico"));
    cmd.args(["run", "--worker", "0", "-c"])
        .arg(&config)
        .env("PORTICO_WORKER", "0")
        .stderr(stderr);
    // SAFETY: between fork and exec the closure only calls
    // async-signal-safe functions on a set on its stack.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            libc::raise(libc::SIGHUP);
            Ok(())
        });
    }
    /// Killed if the test fails, so no worker outlives it.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Reaped(cmd.spawn().expect("start portico"));
    let child = &mut child.0;
    let log = || std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log().contains("worker 0: reloaded") {
        assert!(child.try_wait().expect("wait").is_none(), "the worker died: {}", log());
        assert!(
            Instant::now() < deadline,
            "the pending SIGHUP never reloaded it: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(log().contains("worker 0: listening on"), "{}", log());
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().expect("wait").success(), "{}", log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_port_fails_start_up_instead_of_restarting_workers() {
    let a = origin("a").await;
    let b = origin("b").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("portico.toml");
    std::fs::write(
        &path,
        config(&addr, &a, &b, "a").replace("{dir}", dir.path().to_str().expect("utf-8")),
    )
    .expect("write config");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .current_dir(dir.path())
        .arg("run")
        .arg("-c")
        .arg(&path)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), out)
        .await
        .expect("portico exits")
        .expect("run portico");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot bind listener {addr}")), "{err}");
    assert!(!err.contains("worker 0 started"), "{err}");
}

/// Object files in the disk tier (everything under `cache/` but `tmp/`).
fn disk_objects(dir: &std::path::Path) -> usize {
    fn walk(p: &std::path::Path) -> usize {
        std::fs::read_dir(p).map_or(0, |d| {
            d.flatten()
                .map(|e| {
                    let path = e.path();
                    if path.is_dir() {
                        if e.file_name() == "tmp" { 0 } else { walk(&path) }
                    } else {
                        1
                    }
                })
                .sum()
        })
    }
    walk(&dir.join("cache"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_share_the_disk_tier() {
    let a = origin("a").await;
    let b = origin("b").await;
    let p = Portico::start(&config_with_disk(&free_addr(), &a, &b, "a", "64MiB")).await;
    let all: BTreeSet<u32> = both_started(&p).await.values().copied().collect();
    let (_, first) = get_via(p.addr(), "/page", &all).await;
    assert_eq!(first.header("x-cache"), Some("MISS"));
    // Published (renamed into place) once the body is complete.
    let deadline = Instant::now() + Duration::from_secs(5);
    while disk_objects(p.dir()) == 0 {
        assert!(Instant::now() < deadline, "object never reached the disk tier");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Whichever worker a new connection lands on finds it: on disk, or in
    // the memory tier of the worker that fetched or read it.
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        let (by, resp) = get_via(p.addr(), "/page", &all).await;
        assert_eq!(resp.body_str(), "a /page");
        assert_eq!(resp.header("x-cache"), Some("HIT"));
        seen.insert(by.expect("accepted"));
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, all);
    assert_eq!(a.count(), 1, "fetched once for both workers");
}

/// A PURGE one worker takes, and an unsafe request it forwards (RFC 9111
/// 4.4), remove the URL from every worker's memory tier and held files,
/// not only from its own and the shared disk: each worker answers from its
/// memory before it looks at the disk, and a copy left there was served
/// after the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_or_a_post_one_worker_takes_reaches_every_workers_memory_tier() {
    purge_and_post_reach_both_workers("64MiB").await;
}

/// The same without a disk tier: each worker fetched its own copy, and
/// the one that takes the PURGE may hold none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_disk_tier_a_purge_or_a_post_reaches_every_workers_memory_tier() {
    purge_and_post_reach_both_workers("0B").await;
}

/// Both workers answer `/page` from their memory tiers (with a disk tier
/// of `disk`); a PURGE, then a POST, each on a new connection, then a
/// prefix purge (`Portico-Purge: prefix` for `/pa`; with a disk tier,
/// `portico cache purge --prefix`, which removes the files and sends it);
/// whichever worker answers after each, it is with a version fetched after
/// it.
async fn purge_and_post_reach_both_workers(disk: &str) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let version = Arc::new(AtomicUsize::new(0));
    let v = version.clone();
    // Each GET the origin answers is a new version of the page.
    let a = Origin::start(move |req| {
        let v = v.clone();
        async move {
            if req.method == "POST" {
                return Response::ok("posted");
            }
            let n = v.fetch_add(1, Ordering::SeqCst) + 1;
            Response::ok(format!("v{n}")).header("Cache-Control", "max-age=600")
        }
    })
    .await;
    let b = origin("b").await;
    let p = Portico::start(&config_with_disk(&free_addr(), &a, &b, "a", disk)).await;
    let all: BTreeSet<u32> = both_started(&p).await.values().copied().collect();
    let ask = |method: &'static str| {
        let all = all.clone();
        let addr = p.addr();
        async move {
            let (by, resp) = ask_sent_first(addr, method, "/page", &all).await;
            let body = resp.body_str();
            let n: usize = body.trim_start_matches('v').parse().unwrap_or(0);
            (by.expect("accepted"), resp, n)
        }
    };
    // Each worker answers from its memory tier: a copy it fetched, or
    // (with a disk tier) read from the disk.
    let mut hits: BTreeMap<u32, usize> = BTreeMap::new();
    for _ in 0..400 {
        let (by, resp, _) = ask("GET").await;
        if resp.header("x-cache") == Some("HIT") {
            *hits.entry(by).or_default() += 1;
        }
        if hits.len() == 2 && hits.values().all(|n| *n >= 3) {
            break;
        }
    }
    assert_eq!(hits.keys().copied().collect::<BTreeSet<_>>(), all, "{hits:?}");
    for method in ["PURGE", "POST", "prefix PURGE"] {
        let before = version.load(Ordering::SeqCst);
        if method == "prefix PURGE" && disk != "0B" {
            // The version fetched after the POST is on the disk (written as
            // it was sent): the CLI removes that file, which a write still
            // under way could put back.
            let deadline = Instant::now() + Duration::from_secs(5);
            while disk_objects(p.dir()) != 1 {
                assert!(Instant::now() < deadline, "{} objects on disk", disk_objects(p.dir()));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
                .current_dir(p.dir())
                .args(["cache", "purge", "--prefix", "http://www.example.com/pa", "-c"])
                .arg(p.config_path())
                .output()
                .expect("portico cache purge");
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
            // The disk's count, then the server's answer.
            assert!(
                said.contains("purged 1 objects") && said.contains("from memory"),
                "{said}"
            );
        } else {
            let (method, extra) = match method.split_once(' ') {
                Some((_, m)) => (m, "Portico-Purge: prefix\r\n"),
                None => (method, ""),
            };
            let target = if extra.is_empty() { "/page" } else { "/pa" };
            // Read to the end of the connection: a POST's invalidation
            // comes once its response is sent, before the connection goes on.
            let mut c = RawClient::connect(p.addr()).await;
            let request =
                format!("{method} {target} HTTP/1.1\r\nHost: www.example.com\r\n{extra}Connection: close\r\n\r\n");
            c.send(request.as_bytes()).await;
            let resp = parse_response(&c.read_to_end().await);
            assert_eq!(resp.status, 200, "{method}: {}", resp.body_str());
        }
        let mut seen = BTreeSet::new();
        for i in 0..400 {
            let (by, resp, n) = ask("GET").await;
            assert!(
                n > before,
                "after the {method}, worker {by} answered {} ({:?}); v{before} was the last before it",
                resp.body_str(),
                resp.header("x-cache")
            );
            seen.insert(by);
            if seen.len() == 2 && i >= 20 {
                break;
            }
        }
        assert_eq!(seen, all, "both workers answered after the {method}");
    }
}

/// Each worker counts how often objects are asked for in a sketch of its
/// own, and keeps it in a file of its own in the shared directory
/// (`popularity.I`): saved when SIGTERM reaches it, restored by worker I
/// of the next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_keeps_its_own_popularity_file() {
    let a = origin("a").await;
    let b = origin("b").await;
    // One cache directory for both runs (each run has its own {dir}).
    let shared = tempfile::tempdir().expect("temp dir");
    let cache = shared.path().join("cache");
    let config =
        |addr: &str| config_with_disk(addr, &a, &b, "a", "64MiB").replace("{dir}/cache", &cache.display().to_string());
    let mut p = Portico::start(&config(&free_addr())).await;
    let all: BTreeSet<u32> = both_started(&p).await.values().copied().collect();
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        let (by, resp) = get_via(p.addr(), "/page", &all).await;
        assert_eq!(resp.status, 200);
        seen.insert(by.expect("accepted"));
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen, all, "both workers served");
    p.signal(libc::SIGTERM);
    let status = p
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("supervisor did not exit");
    assert!(status.success(), "{status}\n{}", p.stderr());
    let mut files: Vec<String> = std::fs::read_dir(&cache)
        .expect("cache dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("popularity"))
        .collect();
    files.sort();
    assert_eq!(files, ["popularity.0", "popularity.1"]);

    let p = Portico::start(&config(&free_addr())).await;
    let restored = |i: usize| {
        let file = cache.join(format!("popularity.{i}")).display().to_string();
        p.stderr()
            .lines()
            .any(|l| l.contains(&format!("worker {i}")) && l.contains("lookups restored from") && l.contains(&file))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(restored(0) && restored(1)) {
        assert!(Instant::now() < deadline, "not both restored:\n{}", p.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `portico run` on `config` (with `{dir}` set to `dir`) to its exit.
async fn run_to_exit(dir: &std::path::Path, config: &str) -> std::process::Output {
    let path = dir.join("portico.toml");
    std::fs::write(&path, config.replace("{dir}", dir.to_str().expect("utf-8"))).expect("write config");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .current_dir(dir)
        .arg("run")
        .arg("-c")
        .arg(&path)
        .output();
    tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("portico exits")
        .expect("run portico")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_failing_at_start_up_stops_the_server() {
    let a = origin("a").await;
    let b = origin("b").await;
    let dir = tempfile::tempdir().expect("tempdir");
    // The supervisor does not open the access log; each worker fails to.
    let config = config(&free_addr(), &a, &b, "a").replace("{dir}/access.log", "{dir}/missing/access.log");
    let out = run_to_exit(dir.path(), &config).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot open access log"), "{err}");
    assert!(err.contains("failed at start-up (exit status 1)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_keeps_dying_is_restarted_after_growing_delays() {
    let a = origin("a").await;
    let b = origin("b").await;
    let addr = free_addr();
    // The access log in a directory of the test's, removed once both
    // workers have opened it: from then on a (re)starting worker cannot.
    let logs = tempfile::tempdir().expect("tempdir");
    let log_dir = logs.path().join("logs");
    std::fs::create_dir(&log_dir).expect("mkdir logs");
    let access = log_dir.join("access.log");
    let config = config(&addr, &a, &b, "a").replace("{dir}/access.log", access.to_str().expect("utf-8"));
    let p = Portico::start(&config).await;
    let pids = both_started(&p).await;
    // Each has opened its logs once it listens.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(0..2).all(|i| p.stderr().contains(&format!("worker {i}: listening on"))) {
        assert!(Instant::now() < deadline, "workers not listening\n{}", p.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::remove_dir_all(&log_dir).expect("remove logs");
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pids[&0] as i32, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    let delays = loop {
        let log = p.stderr();
        let delays: Vec<String> = log
            .lines()
            .filter(|l| l.contains("worker 0 (pid ") && l.contains("restarting it in "))
            .filter_map(|l| l.rsplit("restarting it in ").next().map(str::to_string))
            .collect();
        if delays.len() >= 4 {
            break delays;
        }
        assert!(Instant::now() < deadline, "{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The first exit (SIGKILL) may or may not count as quick; the failures
    // after it do, and each waits twice as long as the one before.
    let ms: Vec<u64> = delays
        .iter()
        .map(|d| d.trim_end_matches("ms").parse().unwrap_or(0))
        .collect();
    assert!(
        ms[1..4].windows(2).all(|w| w[1] == 2 * w[0] && w[0] >= 100),
        "{delays:?}"
    );
    assert!(p.stderr().contains("cannot open access log"), "{}", p.stderr());
    // Fixed: worker 0 comes back and serves.
    std::fs::create_dir(&log_dir).expect("mkdir logs");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = worker_pids(&p);
        let live: BTreeSet<u32> = now.values().copied().filter(|pid| process_exists(*pid)).collect();
        if live.len() == 2 && !live.contains(&pids[&0]) {
            let (by, resp) = get_via(p.addr(), "/after", &live).await;
            if resp.status == 200 && by == Some(now[&0]) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "worker 0 did not come back\n{}", p.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A monitoring page fetched on a new connection: the worker pid that
/// answered (among `pids`), the status and the body.
async fn monitor_page(addr: SocketAddr, path: &str, pids: &BTreeSet<u32>) -> (Option<u32>, u16, String) {
    // Sent before the worker is looked for: a connection with nothing to
    // read waits up to a second to be accepted (TCP_DEFER_ACCEPT), and a
    // test reading many pages must see both workers within its deadline.
    // The worker closes a monitoring connection after its answer, but
    // keeps its socket (lingering close) until the client closes, which it
    // does after the look; a test that must know the worker reads it from
    // the page when it can.
    let (by, resp) = get_sent_first(addr, path, pids).await;
    (by, resp.status, resp.body_str())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn total(doc: &serde_json::Value) -> u64 {
    doc["snapshot"]["requests"]["total"].as_u64().expect("requests.total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_are_summed_over_the_workers_and_shown_per_worker() {
    let (_a, _b, mut p, pids, all) = two_workers().await;
    let addr = p.addr();

    // Known traffic over many new connections, until both workers served some.
    let mut served: BTreeMap<u32, u64> = BTreeMap::new();
    let mut sent = 0u64;
    while sent < 30 || served.len() < 2 {
        assert!(sent < 300, "one worker took every connection: {served:?}");
        let (by, resp) = get_sent_first(addr, &format!("/n{sent}"), &all).await;
        assert_eq!(resp.status, 200);
        *served.entry(by.expect("a worker accepted")).or_default() += 1;
        sent += 1;
    }

    // Each worker publishes its figures once a second and sums its own live
    // counts with the others' published ones: wait until each worker's sum
    // has every request (so each has published its share), then the sum
    // must hold whichever worker answers.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut complete = BTreeSet::new();
    while complete != all {
        let (_, status, body) = monitor_page(addr, "/.stats.json", &all).await;
        assert_eq!(status, 200, "{body}");
        let doc = json(&body);
        if total(&doc) == sent {
            // The worker that answered says so in the page.
            let pid = doc["snapshot"]["server"]["pid"].as_u64().expect("server.pid");
            complete.insert(u32::try_from(pid).expect("a pid"));
        }
        assert!(
            Instant::now() < deadline,
            "sum never reached {sent} in both: {complete:?} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut answered = BTreeSet::new();
    let mut late = 0;
    for n in 0..100 {
        let (by, _, body) = monitor_page(addr, "/.stats.json", &all).await;
        let doc = json(&body);
        let procs = doc["processes"].as_array().expect("processes array");
        assert_eq!(procs.len(), 2, "{body}");
        // A worker whose figures are older than the staleness limit is left
        // out of the sum, as designed: on an overloaded machine its writer
        // can fall that far behind. That read says nothing about the sum;
        // a few are tolerated, a persistent one fails below.
        if late < 20
            && procs
                .iter()
                .any(|p| p["status"].as_str().is_some_and(|s| s.starts_with("figures ")))
        {
            late += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        assert_eq!(total(&doc), sent, "answered by {by:?}: {body}");
        for (i, proc) in procs.iter().enumerate() {
            assert_eq!(proc["index"].as_u64(), Some(i as u64));
            assert_eq!(proc["counted"].as_bool(), Some(true), "{proc}");
            let pid = u32::try_from(proc["pid"].as_u64().expect("pid")).expect("pid");
            assert_eq!(pid, pids[&i]);
            assert_eq!(proc["requests"].as_u64(), Some(served[&pid]), "worker {i}");
        }
        answered.insert(by.expect("accepted"));
        if answered.len() == 2 && n >= 5 {
            break;
        }
    }
    assert_eq!(answered, all, "both workers answered the statistics page");

    // perfdump: the same sum, and a line per worker.
    for _ in 0..4 {
        let (_, status, text) = monitor_page(addr, "/.perf", &all).await;
        assert_eq!(status, 200);
        assert!(text.contains("summed over 2 of 2 processes"), "{text}");
        assert!(
            text.contains(&format!("\nRequests                     {sent}\n")),
            "{text}"
        );
        let section = &text[text.find("Processes:").expect("Processes section")..];
        for (i, pid) in &pids {
            let line = section
                .lines()
                .find(|l| l.starts_with(&format!("{i} ")))
                .unwrap_or_else(|| panic!("no line for worker {i}\n{text}"));
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields[1], pid.to_string(), "{line}");
            assert_eq!(fields[2], served[pid].to_string(), "{line}");
        }
    }

    // ?worker=I: one worker's own figures, which add up to the sum.
    let mut by_worker = 0;
    for (i, pid) in &pids {
        let (_, status, body) = monitor_page(addr, &format!("/.stats.json?worker={i}"), &all).await;
        assert_eq!(status, 200, "{body}");
        let doc = json(&body);
        assert_eq!(doc["snapshot"]["server"]["pid"].as_u64(), Some(u64::from(*pid)));
        assert_eq!(doc["snapshot"]["server"]["process_index"].as_u64(), Some(*i as u64));
        assert_eq!(doc["processes"].as_array().map(Vec::len), Some(0));
        assert_eq!(total(&doc), served[pid]);
        by_worker += total(&doc);
        let (_, _, perf) = monitor_page(addr, &format!("/.perf?worker={i}"), &all).await;
        assert!(perf.contains(&format!("(pid {pid}, worker {i})")), "{perf}");
    }
    assert_eq!(by_worker, sent);
    let (_, status, body) = monitor_page(addr, "/.perf?worker=2", &all).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("0 to 1"), "{body}");

    // stats-xml: one <process> per worker; /metrics: the summed counters.
    let (_, _, xml) = monitor_page(addr, "/stats-xml", &all).await;
    assert_eq!(xml.matches("<process ").count(), 2, "{xml}");
    assert!(xml.contains("maxProcs=\"2\""), "{xml}");
    for pid in pids.values() {
        assert!(xml.contains(&format!("<process pid=\"{pid}\"")), "{xml}");
    }
    let (_, _, metrics) = monitor_page(addr, "/metrics", &all).await;
    assert!(metrics.contains("\nportico_processes 2\n"), "{metrics}");
    assert!(
        metrics.contains(&format!("portico_requests_total{{method=\"GET\"}} {sent}\n")),
        "{metrics}"
    );

    // The workers' figures live in the supervisor's private directory,
    // removed when it exits.
    use std::os::unix::fs::PermissionsExt;
    let dir = stats_dir(p.pid());
    let mode = std::fs::metadata(&dir)
        .expect("statistics directory")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(Duration::from_secs(10)).await.expect("supervisor exits");
    assert!(status.success(), "{status}\n{}", p.stderr());
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// The statistics directory of the supervisor `pid`
/// (`<temp dir>/portico-<pid>-<random>-stats`); panics unless exactly one
/// exists.
fn stats_dir(pid: u32) -> std::path::PathBuf {
    let prefix = format!("portico-{pid}-");
    let found: Vec<std::path::PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .expect("read the temp dir")
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&prefix) && name.ends_with("-stats")
        })
        .map(|e| e.path())
        .collect();
    assert_eq!(found.len(), 1, "statistics directories of {pid}: {found:?}");
    found.into_iter().next().expect("one")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_leaves_no_statistics_directory() {
    let a = origin("a").await;
    let b = origin("b").await;
    let mut p = Portico::start(&config(&free_addr(), &a, &b, "a")).await;
    let pids = both_started(&p).await;
    let dir = stats_dir(p.pid());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dir.join("worker-0.json").exists() || !dir.join("worker-1.json").exists() {
        assert!(Instant::now() < deadline, "no figures written to {}", dir.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The workers get SIGTERM when the supervisor dies, and the last one
    // out removes the directory.
    p.signal(libc::SIGKILL);
    let _ = p.wait_exit(Duration::from_secs(5)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.values().any(|pid| process_exists(*pid)) || dir.exists() {
        assert!(
            Instant::now() < deadline,
            "{} left behind\n{}",
            dir.display(),
            p.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether worker `i`'s cache is running, from its own figures; None
/// before the worker published its first (a 404 that says so).
async fn cache_running(addr: SocketAddr, i: usize, pids: &BTreeSet<u32>) -> Option<bool> {
    let (_, status, body) = monitor_page(addr, &format!("/.stats.json?worker={i}"), pids).await;
    if status == 404 && body.contains(&format!("worker {i}: no figures yet")) {
        return None;
    }
    assert_eq!(status, 200, "{body}");
    json(&body)["snapshot"]["cache"]["running"].as_bool()
}

/// Waits until both workers' caches are `running` (10 s at most).
async fn both_caches(addr: SocketAddr, running: bool, pids: &BTreeSet<u32>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = [cache_running(addr, 0, pids).await, cache_running(addr, 1, pids).await];
        if now == [Some(running), Some(running)] {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "workers' caches running: {now:?}, wanted {running}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nsc_stop_and_start_reach_every_worker() {
    let (_a, _b, p, _, all) = two_workers().await;
    let addr = p.addr();
    both_caches(addr, true, &all).await;

    // Whichever worker answers ?stop, both stop; then both start again.
    let (_, status, body) = monitor_page(addr, "/nsc?stop", &all).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("The other workers follow within a second."), "{body}");
    both_caches(addr, false, &all).await;
    let (_, status, body) = monitor_page(addr, "/nsc?start", &all).await;
    assert_eq!(status, 200, "{body}");
    both_caches(addr, true, &all).await;
    let log = p.stderr();
    assert!(
        log.contains("/nsc (from another worker): The cache was stopped"),
        "{log}"
    );
}

/// The connection layer's figures (admission, keep-alive, the blocking
/// pool) are in the JSON document once, in its snapshot, and summed over
/// the workers like every other figure: not a second time beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_carries_the_connection_figures_once_summed_over_the_workers() {
    let (_a, _b, p, _pids, all) = two_workers().await;
    let addr = p.addr();
    let mut served = BTreeSet::new();
    let mut sent = 0u64;
    while sent < 10 || served.len() < 2 {
        assert!(sent < 300, "one worker took every connection");
        let (by, resp) = get_sent_first(addr, &format!("/c{sent}"), &all).await;
        assert_eq!(resp.status, 200);
        served.insert(by.expect("a worker accepted"));
        sent += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let doc = loop {
        let (_, status, body) = monitor_page(addr, "/.stats.json", &all).await;
        assert_eq!(status, 200, "{body}");
        let doc = json(&body);
        if doc["snapshot"]["connection_queue"]["total_admitted"].as_u64() == Some(sent) {
            break doc;
        }
        assert!(Instant::now() < deadline, "admissions never summed to {sent}: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let keys: BTreeSet<&str> = doc.as_object().expect("an object").keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["advice", "derived", "processes", "snapshot"]),
        "{doc}"
    );
    // The sum of the workers' own figures, each counted once.
    let mut limits = 0;
    let mut pools = 0;
    for i in 0..2 {
        let (_, _, body) = monitor_page(addr, &format!("/.stats.json?worker={i}"), &all).await;
        let own = json(&body);
        limits += own["snapshot"]["sessions"]["limit"].as_u64().expect("sessions.limit");
        pools += own["snapshot"]["native_pool"]["limit"]
            .as_u64()
            .expect("native_pool.limit");
    }
    let s = &doc["snapshot"];
    assert_eq!(s["sessions"]["limit"].as_u64(), Some(limits), "{s}");
    assert_eq!(s["native_pool"]["limit"].as_u64(), Some(pools), "{s}");
    assert!(s["keepalive"]["max"].as_u64() > Some(0), "{s}");
}

/// Every line a worker writes to the shared error log starts with the
/// worker's tag, a request's line as much as a start-up or reload line, so
/// that the lines of two workers can be told apart: a refused TRACE (logged
/// at info by the worker that read it) says `worker I: ` with I the index
/// of the process that accepted the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_log_line_of_a_worker_names_the_worker() {
    let (_a, _b, p, pids, all) = two_workers().await;
    let index_of: BTreeMap<u32, usize> = pids.iter().map(|(i, pid)| (*pid, *i)).collect();
    for n in 0..4 {
        let mut stream = TcpStream::connect(p.addr()).await.expect("connect");
        let client = stream.local_addr().expect("local addr");
        let served_by = worker_holding(p.addr(), client, &all).await;
        let pid = served_by.expect("a worker accepted the connection");
        let req = format!("TRACE /tagged-{n} HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.expect("write request");
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
            .await
            .expect("response in time")
            .expect("read response");
        assert_eq!(parse_response(&buf).status, 405);
        let want = format!("worker {}: TRACE /tagged-{n}: refused", index_of[&pid]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !p.stderr().lines().any(|l| l.contains("INFO") && l.contains(&want)) {
            assert!(Instant::now() < deadline, "no line {want:?}\n{}", p.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A two-worker server routing to `origin`, with `limits` in `[limits]`
/// and `rule` in its one rule, both workers started. `defer_accept` is off:
/// a connection is accepted before it sends anything, so the test can
/// tell which worker holds it.
async fn limited_workers(origin: &Origin, limits: &str, rule: &str) -> (Portico, BTreeSet<u32>) {
    let p = Portico::start(&format!(
        "[server]\nprocesses = 2\nworkers = 1\n\n\
         [[listener]]\naddress = \"{}\"\nmode = \"reverse\"\ndefer_accept = \"0s\"\n\n\
         [limits]\n{limits}\n\n\
         [[upstream]]\nname = \"o\"\nservers = [\"{}\"]\n\n\
         [[rule]]\nhost = \"*\"\nupstream = \"o\"\n{rule}\n",
        free_addr(),
        origin.addr()
    ))
    .await;
    let pids = both_started(&p).await.values().copied().collect();
    (p, pids)
}

/// [`get_via`] that sends the request before it looks for the worker
/// (which then has accepted the connection at once, whatever the
/// listener's `defer_accept`).
async fn get_sent_first(addr: SocketAddr, path: &str, pids: &BTreeSet<u32>) -> (Option<u32>, ParsedResponse) {
    ask_sent_first(addr, "GET", path, pids).await
}

/// [`get_sent_first`] with another method (no body).
async fn ask_sent_first(
    addr: SocketAddr,
    method: &str,
    path: &str,
    pids: &BTreeSet<u32>,
) -> (Option<u32>, ParsedResponse) {
    let mut stream = RawClient::connect(addr).await;
    let client = stream.local_addr();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: www.example.com\r\n\r\n");
    stream.send(req.as_bytes()).await;
    let served_by = worker_holding(addr, client, pids).await;
    // Kept alive (the socket is still there to be found), then closed.
    (served_by, stream.read_response().await)
}

/// A route's `total_request_rate` is kept by the workers together (their
/// buckets are one, `shared_buckets`): with a burst of 5 and 1 a second,
/// requests spread over both workers get 5 answers and 1 more a second,
/// not 5 from each worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_total_request_rate_is_kept_by_the_workers_together() {
    let o = origin("o").await;
    let (p, pids) = limited_workers(&o, "", "total_request_rate = 1\ntotal_request_burst = 5\n").await;
    one_bucket_over_both_workers(&p, &pids, 503).await;
}

/// So is a client's `limits.client_request_rate` (its bucket is one in
/// both workers, `shared_buckets::client_at`), as nginx keeps a `limit_req`
/// zone keyed by the client's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_request_rate_is_kept_by_the_workers_together() {
    let o = origin("o").await;
    let (p, pids) = limited_workers(&o, "client_request_rate = 1\nclient_request_burst = 5", "").await;
    one_bucket_over_both_workers(&p, &pids, 429).await;
}

/// And a client's bucket on a route (`request_rate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_request_rate_on_a_route_is_kept_by_the_workers_together() {
    let o = origin("o").await;
    let (p, pids) = limited_workers(&o, "", "request_rate = 1\nrequest_burst = 5\n").await;
    one_bucket_over_both_workers(&p, &pids, 429).await;
}

/// Requests from one client, each on a new connection, until both
/// workers have had 6: with a bucket of 5 refilled at 1 a second, kept by
/// the workers together, 5 are answered at once and about 1 a second
/// after, the others refused with `refused`. Each worker keeping its own
/// would have answered 5 at once each.
async fn one_bucket_over_both_workers(p: &Portico, pids: &BTreeSet<u32>, refused: u16) {
    let started = Instant::now();
    let mut by_worker: BTreeMap<u32, usize> = BTreeMap::new();
    let mut answered = 0;
    for n in 0..400 {
        let (pid, r) = get_sent_first(p.addr(), &format!("/n{n}"), pids).await;
        match r.status {
            200 => answered += 1,
            s if s == refused => {}
            other => panic!("status {other}: {}", r.body_str()),
        }
        *by_worker.entry(pid.expect("a worker accepted it")).or_default() += 1;
        if by_worker.len() == 2 && by_worker.values().all(|&c| c >= 6) {
            break;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        by_worker.len() == 2 && by_worker.values().all(|&c| c >= 6),
        "the requests did not reach both workers 6 times each: {by_worker:?}"
    );
    assert!(
        answered as f64 <= 5.0 + elapsed.ceil(),
        "{answered} answered in {elapsed:.1} s over {by_worker:?}"
    );
    assert!(answered >= 5, "{answered} answered");
}

/// `limits.total_bandwidth` too: two downloads of 128 KiB, one from each
/// worker, under 64 KiB a second for all (a burst of 64 KiB) take about
/// 3 s together, not 1 s each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_bandwidth_is_kept_by_the_workers_together() {
    let elapsed =
        two_downloads_one_from_each_worker("total_bandwidth = \"64KiB\"\ntotal_bandwidth_burst = \"64KiB\"").await;
    // 256 KiB, 64 KiB of them at once: 3 s at 64 KiB a second. Each
    // worker on its own: 1 s.
    assert!(elapsed >= 2.4, "both downloads done in {elapsed:.2} s");
}

/// And `limits.client_bandwidth`: one client's two downloads of 128 KiB,
/// one from each worker, under 64 KiB a second for the client (a burst of
/// 64 KiB) take about 3 s together, not 1 s each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_bandwidth_is_kept_by_the_workers_together() {
    let elapsed = two_downloads_one_from_each_worker(
        "client_bandwidth = \"64KiB\"\nclient_bandwidth_burst = \"64KiB\"\nclient_table = 1024",
    )
    .await;
    assert!((2.4..6.0).contains(&elapsed), "both downloads done in {elapsed:.2} s");
}

/// The seconds two downloads of 128 KiB by one client take together, one
/// from each of two workers under `limits`.
async fn two_downloads_one_from_each_worker(limits: &str) -> f64 {
    let o = Origin::start(|_req| async { Response::ok("").generated(128 << 10) }).await;
    let (p, pids) = limited_workers(&o, limits, "").await;
    // A connection to each worker.
    let mut conns: BTreeMap<u32, TcpStream> = BTreeMap::new();
    for _ in 0..200 {
        let stream = TcpStream::connect(p.addr()).await.expect("connect");
        let client = stream.local_addr().expect("local addr");
        let served_by = worker_holding(p.addr(), client, &pids).await;
        conns.entry(served_by.expect("a worker accepted it")).or_insert(stream);
        if conns.len() == 2 {
            break;
        }
    }
    assert_eq!(conns.len(), 2, "no connection reached the second worker");
    let started = Instant::now();
    let downloads: Vec<_> = conns
        .into_values()
        .enumerate()
        .map(|(n, mut s)| {
            tokio::spawn(async move {
                let req = format!("GET /big{n} HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n");
                s.write_all(req.as_bytes()).await.expect("write request");
                let mut buf = Vec::new();
                tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
                    .await
                    .expect("response in time")
                    .expect("read response");
                parse_response(&buf)
            })
        })
        .collect();
    for d in downloads {
        let r = d.await.expect("download");
        assert_eq!((r.status, r.body.len()), (200, 128 << 10));
    }
    started.elapsed().as_secs_f64()
}

/// `limits.max_connections_per_client` holds over the workers together
/// (`shared_conns`): a client holding 3 connections, wherever they are,
/// gets every further one closed unanswered, whichever worker accepts it
/// (each worker on its own would take up to 3). When a worker holding
/// some of them is killed, their places come back: the supervisor gives
/// back what the worker held before its successor starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_connection_cap_holds_over_the_workers_together() {
    let o = Origin::start(|_req| async { Response::ok("served") }).await;
    // A table smaller than the default: the workers map the supervisor's.
    let (p, pids) = limited_workers(&o, "max_connections_per_client = 3\nclient_table = 1024", "").await;
    let client: std::net::IpAddr = "127.0.0.3".parse().expect("ip");
    let mut held: Vec<(u32, TcpStream)> = Vec::new();
    let mut refused = 0;
    for _ in 0..40 {
        match served_and_held(client, p.addr()).await {
            Some((stream, local)) => {
                let by = worker_holding(p.addr(), local, &pids).await.expect("a worker holds it");
                held.push((by, stream));
            }
            None => refused += 1,
        }
        if held.len() == 3 && refused >= 12 {
            break;
        }
    }
    assert_eq!(held.len(), 3, "{refused} refused");
    assert!(refused >= 12, "{refused} refused");
    // The three are still served.
    for (_, s) in &mut held {
        s.write_all(b"GET / HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
            .await
            .expect("send again");
        assert!(read_served(s).await, "a held connection was closed");
    }
    // Kill the worker holding the first; its places come back.
    let workers = worker_pids(&p);
    let victim = held[0].0;
    let (i, _) = workers
        .iter()
        .find(|(_, pid)| **pid == victim)
        .expect("the victim is a worker");
    let freed = held.iter().filter(|(by, _)| *by == victim).count();
    // Killed before its connections are closed here: it gives nothing
    // back itself.
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
    held.retain(|(by, _)| *by != victim);
    let deadline = Instant::now() + Duration::from_secs(15);
    let sized = |p: &Portico| p.stderr().matches(&format!("worker {i}: sizing:")).count();
    while worker_pids(&p)[i] == victim || sized(&p) < 2 {
        assert!(Instant::now() < deadline, "worker {i} not restarted\n{}", p.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut again = Vec::new();
    for _ in 0..12 {
        if let Some((stream, _)) = served_and_held(client, p.addr()).await {
            again.push(stream);
        }
    }
    assert_eq!(
        again.len(),
        freed,
        "the killed worker held {freed}; {} came back",
        again.len()
    );
}

/// A keep-alive `GET /` from `src` on a new connection: the connection
/// and its local address if it was served, None if it was closed
/// unanswered.
async fn served_and_held(src: std::net::IpAddr, addr: SocketAddr) -> Option<(TcpStream, SocketAddr)> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(src, 0)).expect("bind");
    let mut s = socket.connect(addr).await.expect("connect");
    let local = s.local_addr().expect("local addr");
    if s.write_all(b"GET / HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
        .await
        .is_err()
    {
        return None;
    }
    read_served(&mut s).await.then_some((s, local))
}

/// Whether `s` gets a response saying "served" (false: closed first).
async fn read_served(s: &mut TcpStream) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(5);
    while !got.ends_with(b"served") {
        match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            Ok(_) => return false,
            Err(_) => panic!("neither served nor closed: {:?}", String::from_utf8_lossy(&got)),
        }
    }
    true
}

/// A reload no worker can apply and no worker could start on (an
/// `origin.ca_file` that does not exist, which the supervisor's check,
/// like `portico check`, does not read): the first worker that says so is
/// replaced, its successor exits before it serves, and the replacements
/// stop there: the other worker keeps serving the configuration it runs
/// instead of being stopped to crash-loop as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_replacement_cannot_start_leaves_the_other_workers_serving() {
    let a = origin("a").await;
    let b = origin("b").await;
    let addr = free_addr();
    let p = Portico::start(&config(&addr, &a, &b, "a")).await;
    both_started(&p).await;
    let text = format!(
        "{}
[origin]
ca_file = \"{{dir}}/no-such-ca.pem\"
",
        config(&addr, &a, &b, "b")
    )
    .replace("{dir}", p.dir().to_str().expect("utf-8"));
    p.rewrite_config(&text);
    p.signal(libc::SIGHUP);
    let log = p.until_logged("exited before it served", 1).await;
    assert!(log.contains("keep running the configuration they had"), "{log}");
    assert_eq!(log.matches("could not apply the configuration").count(), 2, "{log}");
    // The other worker serves on, on route a; the slot being replaced
    // keeps failing to start (and may reset a connection that lands on
    // it meanwhile).
    let mut served = 0;
    for i in 0..20 {
        let Ok(mut s) = TcpStream::connect(p.addr()).await else {
            continue;
        };
        let req = format!("GET /z{i} HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n");
        let mut buf = Vec::new();
        if s.write_all(req.as_bytes()).await.is_err()
            || !matches!(
                tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await,
                Ok(Ok(_))
            )
            || buf.is_empty()
        {
            continue;
        }
        assert_eq!(parse_response(&buf).body_str(), format!("a /z{i}"));
        served += 1;
    }
    assert!(served >= 10, "{served} of 20 served\n{}", p.stderr());
}

/// A listener a reload adds is bound by the supervisor, a socket for each
/// worker sent with the text, and every worker serves on it; a later
/// reload that keeps it and adds another serves both from both workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_a_reload_adds_is_served_by_every_worker() {
    let (a, b, p, _, all) = two_workers().await;
    let added: Vec<SocketAddr> = (0..2).map(|_| free_addr().parse().expect("address")).collect();
    let listener = |addr: &SocketAddr| format!("\n[[listener]]\naddress = \"{addr}\"\nmode = \"reverse\"\n");
    for n in 1..=2 {
        let text = format!(
            "{}{}",
            config(&p.addr().to_string(), &a, &b, "a"),
            added[..n].iter().map(listener).collect::<String>()
        )
        .replace("{dir}", p.dir().to_str().expect("utf-8"));
        p.rewrite_config(&text);
        p.signal(libc::SIGHUP);
        p.until_logged("reload: applied by every worker", n).await;
        for addr in &added[..n] {
            let mut served_by = BTreeSet::new();
            for i in 0..40 {
                let (pid, resp) = get_via(*addr, &format!("/l{i}"), &all).await;
                assert_eq!(resp.body_str(), format!("a /l{i}"));
                served_by.extend(pid);
                if served_by == all {
                    break;
                }
            }
            assert_eq!(served_by, all, "reload {n}, {addr}\n{}", p.stderr());
        }
    }
}

/// A reload adding a listener on a port another program holds is refused
/// by the supervisor, which binds the new listeners as it binds them at
/// the start: no worker is asked to apply it, none is replaced, and both
/// serve on, on the configuration they had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adding_a_listener_on_a_held_port_is_refused_before_any_worker_gets_it() {
    let (a, b, p, pids, all) = two_workers().await;
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let port = held.local_addr().expect("addr").port();
    let text = format!(
        "{}\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"reverse\"\n",
        config(&p.addr().to_string(), &a, &b, "b")
    )
    .replace("{dir}", p.dir().to_str().expect("utf-8"));
    let log = p.reload_refused(&text).await;
    assert!(
        log.contains(&format!(
            "reload failed, still running on the previous config: cannot bind listener 127.0.0.1:{port}"
        )),
        "{log}"
    );
    // Neither worker heard of it: each serves on, on route a, and
    // neither was replaced.
    let mut served_by = BTreeSet::new();
    for i in 0..40 {
        let (pid, resp) = get_via(p.addr(), &format!("/r{i}"), &all).await;
        assert_eq!(resp.body_str(), format!("a /r{i}"));
        served_by.extend(pid);
        if served_by.len() == 2 {
            break;
        }
    }
    assert_eq!(served_by, all, "{}", p.stderr());
    let err = p.stderr();
    assert!(
        !err.contains("could not apply") && !err.contains("the workers reload it"),
        "{err}"
    );
    assert_eq!(worker_pids(&p), pids, "{err}");
    drop(held);
}
