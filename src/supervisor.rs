//! Multi-process mode (`server.processes = N > 1`): `portico run` becomes a
//! supervisor that starts N worker processes and keeps them running.
//!
//! Each worker is this same binary run as `portico run --worker I -c FILE`
//! (with `PORTICO_WORKER=I` in its environment); it runs what the
//! supervisor last validated (`config::source`), not FILE as it is now, so
//! a worker restarted after an edit that was not reloaded runs what the
//! others run. The supervisor binds a socket for every listener and every
//! worker with SO_REUSEPORT (`listen::reserve`), at a worker's start and
//! when a reload adds a listener, and each worker listens on its own, so
//! the kernel spreads new connections over the workers; the supervisor
//! serves nothing. Workers run in their
//! own process group (a terminal's Ctrl-C reaches the supervisor only, which
//! forwards it once) and get SIGTERM if the supervisor dies.
//!
//! - A worker that exits is restarted and the event logged (warn) with its
//!   exit status or signal; one that dies within [`QUICK_EXIT`] of starting
//!   is restarted after a delay doubling from 100 ms up to 30 s. A worker
//!   whose very first run ends within [`QUICK_EXIT`] with a failure status
//!   stops the whole server (start-up failed, as it would in one process).
//! - SIGTERM / SIGINT: forwarded to every worker (each drains); the
//!   supervisor waits for them all and exits 0. A second one is forwarded
//!   too (the workers then exit at once).
//! - SIGHUP: the supervisor validates the file once; if it is invalid the
//!   error is logged and nothing changes, else it sends each worker the
//!   text it validated on the worker's channel (and hands it to those it
//!   starts later) and SIGHUP goes to every worker, which reloads itself
//!   from that text. A worker still starting gets it once it can (the
//!   signal waits, blocked). Each worker answers on its channel whether it
//!   applied it; one that could not (as `server.user`) is replaced by one
//!   started on it, one at a time, until a successor cannot start.
//! - SIGUSR1: the supervisor reopens its error log and forwards the signal;
//!   each worker reopens its error and access logs.
//! - `server.user`: the supervisor stays as started (root, to write and
//!   remove the pid file, and to bind every listener socket, which are all
//!   its own); each worker opens its logs and cache as root and then
//!   switches (`privdrop`). The supervisor gives the user the error log it creates
//!   and the private directory below, which the workers write to.
//! - `$NOTIFY_SOCKET` (systemd): the workers report to a datagram socket in
//!   that directory; the supervisor tells systemd once all are ready.
//!
//! Shared between the processes: the listeners (SO_REUSEPORT) and the disk
//! tier's directory (tmp files are named by pid, objects are published by
//! rename, so concurrent writers never see each other's partial files; see
//! `reload::per_process` for its budget), and a private directory (0700,
//! under the temp dir, removed at exit) where each worker leaves its
//! statistics once a second, so that whichever worker answers a monitoring
//! request shows the sum over all (`stats::workers`). Each worker inherits
//! the config and its TLS ticket key seed in sealed memory files, and gets
//! a reload's config on a channel of its own (`handover`), so every worker
//! runs what the supervisor validated and seals and opens session tickets
//! with the same rotating keys. The buckets of the
//! limits for all clients (`limits.total_bandwidth`, a route's
//! `total_request_rate`) and of the limits per client
//! (`limits.client_request_rate`, a route's `request_rate`,
//! `limits.client_bandwidth`) are a memory file the supervisor makes and
//! every worker maps (`shared_buckets`); the clients' connection counts
//! (`limits.max_connections_per_client`) another, with a column per
//! worker from which the supervisor gives back what a worker that died
//! held (`shared_conns`); and a third, a ring in which a worker that
//! removes an object from the cache (a `PURGE`, an unsafe request) tells
//! the others to drop their memory tier's copy (`cache::told`). Per
//! process: the memory tier, the upstream connection pools, the TLS
//! session cache, the counters.

use crate::config::{Config, ListenerConfig};
use crate::signals::{Sig, Signals};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::task::JoinSet;

/// A worker that exits sooner than this after starting counts as failing
/// at once: its restart is delayed, more each time.
pub const QUICK_EXIT: Duration = Duration::from_secs(5);

struct Worker {
    pid: Option<u32>,
    started: Instant,
    quick_failures: u32,
    /// Still its first run (never restarted).
    first_run: bool,
    /// The supervisor's end of its channel, on which a reload's config
    /// goes (`config::source`).
    channel: Option<std::os::fd::OwnedFd>,
    /// The task reading its reports on the channel (each reload's outcome).
    reports: Option<tokio::task::AbortHandle>,
}

enum Event {
    Exited(usize, std::io::Result<ExitStatus>),
    Restart(usize),
    /// Worker I (pid P) reported on its channel (the third field, handed
    /// back to read the next report from).
    Report(usize, u32, AsyncFd<std::os::fd::OwnedFd>, std::io::Result<Vec<u8>>),
    /// Worker I (pid P) was stopped to be replaced [`SERVING_WITHIN`] ago
    /// (or was last looked at then): time to see whether its successor
    /// runs.
    ReplaceDue(usize, u32),
}

/// How long a replaced worker's successor may take to say it serves
/// before the next worker is replaced anyway.
const SERVING_WITHIN: Duration = Duration::from_secs(30);

/// Logs that every worker awaited has answered a reload; `halted`: a
/// successor could not start on it, so the others are not replaced.
fn reload_done(replaced: bool, halted: bool) {
    if halted {
        tracing::info!(
            "reload: applied by the workers that could; the others keep the configuration they had (a worker \
             started on it could not serve)"
        );
    } else if replaced {
        tracing::info!(
            "reload: applied by the workers that could; those that could not are being replaced by workers \
             started on it"
        );
    } else {
        tracing::info!("reload: applied by every worker");
    }
}

/// Stops the next worker of `to_replace` still running as it was (it
/// drains and exits, and is started again on the configuration in force):
/// its index and pid, or None when none is left.
fn replace_next(
    to_replace: &mut std::collections::VecDeque<(usize, u32)>,
    workers: &[Worker],
    events: &mut JoinSet<Event>,
) -> Option<(usize, u32)> {
    while let Some((i, pid)) = to_replace.pop_front() {
        if workers[i].pid != Some(pid) {
            continue;
        }
        signal_one(&workers[i], libc::SIGTERM);
        // Looked at again every so often while it drains (up to
        // `server.shutdown_timeout`) or its successor starts; the
        // successor's `serving` normally comes first.
        replace_due_later(events, i, pid);
        return Some((i, pid));
    }
    None
}

/// Sends [`Event::ReplaceDue`] for worker `i` (pid `pid`) in
/// [`SERVING_WITHIN`].
fn replace_due_later(events: &mut JoinSet<Event>, i: usize, pid: u32) {
    events.spawn(async move {
        tokio::time::sleep(SERVING_WITHIN).await;
        Event::ReplaceDue(i, pid)
    });
}

/// Waits for worker `i`'s next report.
async fn read_report(i: usize, pid: u32, channel: AsyncFd<std::os::fd::OwnedFd>) -> Event {
    let report = crate::handover::next_report(&channel).await;
    if report.is_err() {
        // Read again, but not in a loop a worker could keep busy.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Event::Report(i, pid, channel, report)
}

/// Runs the supervisor until SIGTERM/SIGINT and every worker has exited.
pub fn run(config: Config, config_path: Option<PathBuf>, config_text: Option<String>) -> Result<(), String> {
    let n = config.server.processes;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let mut signals = {
        let _enter = runtime.enter();
        Signals::install()
    };
    // An unknown `server.user` fails here, not in every worker.
    let target = crate::privdrop::target(&config)?;
    // SAFETY: geteuid has no preconditions.
    let switching = target.as_ref().filter(|_| unsafe { libc::geteuid() } == 0);
    // The workers switch to `server.user` and must still be able to reopen
    // the error log the supervisor (root) created, now and after rotation.
    let give_error_log = |path: &std::path::Path| {
        if let Some(t) = switching {
            crate::privdrop::chown_tree(path, t.uid, t.gid);
        }
    };
    if let Some(path) = crate::log::created_error_log() {
        give_error_log(path);
    }
    // Fail start-up (rather than restart workers forever) when a listener
    // cannot be bound: bind each one once here (without listening), then
    // let go of it.
    crate::listen::check_bindable(&config.listener)?;
    let _pid_file = crate::privdrop::PidFile::write(&config.server.pid_file)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the portico executable: {e}"))?;
    tracing::info!("supervisor (pid {}) starting {n} worker processes", std::process::id());
    for w in crate::upstream::Destinations::warnings(&config) {
        tracing::warn!("{w}");
    }
    // Its workers are handed the configuration's text: not the file.
    for w in crate::privdrop::unreadable_warnings(&config, None) {
        tracing::warn!("{w}");
    }
    if let Some(advice) = crate::listen::migration_advice() {
        tracing::info!("{advice}");
    }
    // Where the workers leave their statistics for each other (removed when
    // the supervisor exits). Without it each worker shows only its own.
    let stats_guard = match crate::stats::workers::make_dir() {
        Ok(dir) => Some(RemoveOnDrop(dir)),
        Err(e) => {
            tracing::warn!(
                "cannot make a statistics directory: {cause}; each worker will show only its own statistics",
                cause = crate::util::io_cause(&e)
            );
            None
        }
    };
    let stats_dir = stats_guard.as_ref().map(|d| &d.0);
    // The workers report readiness to the supervisor, which tells systemd
    // once they all have (a worker's own message would reach a service
    // manager that only listens to the main process, or count too early).
    let relay = match (std::env::var_os(crate::notify::ENV), stats_dir) {
        (Some(_), Some(dir)) => {
            let _enter = runtime.enter();
            let path = dir.join("notify.sock");
            match tokio::net::UnixDatagram::bind(&path) {
                Ok(socket) => Some((socket, path)),
                Err(e) => {
                    tracing::warn!(
                        "cannot relay the workers' readiness: {cause}",
                        cause = crate::util::io_cause(&e)
                    );
                    None
                }
            }
        }
        _ => None,
    };
    // The workers drop to `server.user` and must still write their
    // statistics and their notifications there.
    if let (Some(t), Some(dir)) = (switching, stats_dir) {
        crate::privdrop::chown_tree(dir, t.uid, t.gid);
    }
    let relay_path = relay.as_ref().map(|(_, p)| p.clone());
    // The ticket keys every worker shares (`tls_resume`): one chain drawn
    // here, handed to each worker as it starts (`handover`).
    let seed = match config.tls.session_tickets {
        true => Some(crate::tls_resume::Seed::generate(&config.tls, now_unix())?),
        false => None,
    };
    // The buckets of the limits for all clients, which the workers keep
    // together (`shared_buckets`).
    let clients = config.limits.client_table as usize;
    let buckets = match crate::shared_buckets::create(clients) {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!(
                "cannot make the limits' shared buckets: {cause}; each worker keeps limits.total_bandwidth, \
                 limits.client_bandwidth, limits.client_request_rate and the routes' total_request_rate and \
                 request_rate on its own",
                cause = crate::util::io_cause(&e)
            );
            None
        }
    };
    // The clients' connection counts, which the workers keep together
    // (`shared_conns`).
    let conns = match crate::shared_conns::Shared::create(clients, n) {
        Ok(shared) => Some(shared),
        Err(e) => {
            tracing::warn!(
                "cannot make the shared connection counts: {cause}; each worker keeps \
                 limits.max_connections_per_client on its own",
                cause = crate::util::io_cause(&e)
            );
            None
        }
    };
    // Where the workers tell each other what they removed from the cache
    // (`cache::told`).
    let told = match crate::cache::told::create() {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!(
                "cannot make the memory the workers tell each other the cache's removals in: {cause}; a PURGE \
                 or an unsafe request a worker takes leaves the other workers' memory tiers as they are",
                cause = crate::util::io_cause(&e)
            );
            None
        }
    };
    // What the workers run on (`config::source`): the text read at start,
    // sealed in a memory file each inherits (`handover`). Without it they
    // read the file.
    let start_file = match config_text
        .as_deref()
        .map(|t| crate::handover::sealed(c"portico-config", t.as_bytes()))
    {
        Some(Ok(fd)) => Some(fd),
        Some(Err(e)) => {
            tracing::warn!(
                "cannot hand the config to the workers in memory: {cause}; each reads the file itself",
                cause = crate::util::io_cause(&e)
            );
            None
        }
        None => None,
    };
    let mut env = WorkerEnv {
        stats_dir: stats_dir.cloned(),
        start_file,
        validated_file: None,
        notify: relay_path,
        seed,
        tls: config.tls.clone(),
        buckets,
        conns,
        told,
        listeners: config.listener.clone(),
        switching: switching.cloned(),
    };
    runtime.block_on(async move {
        let relay = relay.map(|(s, _)| s);
        // Workers whose READY=1 arrived since the start or the last reload;
        // None once systemd has been told.
        let mut waiting: Option<Vec<bool>> = relay.as_ref().map(|_| vec![false; n]);
        let mut events: JoinSet<Event> = JoinSet::new();
        let mut workers: Vec<Worker> = Vec::with_capacity(n);
        for i in 0..n {
            workers.push(Worker {
                pid: None,
                started: Instant::now(),
                quick_failures: 0,
                first_run: true,
                channel: None,
                reports: None,
            });
            start(&exe, config_path.as_ref(), &mut env, i, &mut workers[i], &mut events);
        }
        // The supervisor's copy of the ticket key chain moves on as keys
        // age out, so it holds nothing older than the workers keep.
        let mut ratchet = tokio::time::interval(env.tls.session_ticket_rotation.get().max(Duration::from_secs(1)));
        ratchet.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if relay.is_none() {
            // Without the relay (no statistics directory), the best the
            // supervisor knows: the workers are started.
            crate::notify::ready(&format!("{n} worker processes started"));
        }
        let mut stopping = false;
        let mut failure: Option<String> = None;
        // The workers a reload's outcome is awaited from, and whether one
        // of them could not apply it.
        let mut awaiting: Vec<usize> = Vec::new();
        let mut replaced = false;
        // Workers (index, pid) that could not apply a reload, to be
        // replaced one at a time, each once the one replaced before it has
        // a successor serving (`replacing`), so that the listeners always
        // have workers behind them.
        let mut to_replace: std::collections::VecDeque<(usize, u32)> = std::collections::VecDeque::new();
        let mut replacing: Option<(usize, u32)> = None;
        // A successor exited before it served: no more are replaced until
        // the next reload.
        let mut halted = false;
        loop {
            if stopping && workers.iter().all(|w| w.pid.is_none()) {
                tracing::info!("all workers have exited; supervisor exiting");
                return failure.map_or(Ok(()), Err);
            }
            tokio::select! {
                _ = ratchet.tick() => {
                    let tls = env.tls.clone();
                    if let Some(seed) = env.seed.as_mut() {
                        seed.ratchet(&tls, now_unix());
                    }
                }
                sig = signals.next() => match sig {
                    Sig::Term(name) => {
                        crate::notify::stopping("stopping the workers");
                        tracing::info!("{name}: stopping the workers");
                        // A worker being replaced drains already: a second
                        // SIGTERM would make it exit at once (as a second
                        // one to the supervisor means).
                        let draining = replacing.filter(|(r, old)| !stopping && workers[*r].pid == Some(*old));
                        stopping = true;
                        for (i, w) in workers.iter().enumerate() {
                            if draining.is_none_or(|(r, _)| r != i) {
                                signal_one(w, libc::SIGTERM);
                            }
                        }
                    }
                    Sig::Hup if stopping => tracing::warn!("SIGHUP ignored: shutting down"),
                    Sig::Hup => {
                        if reload(&config, config_path.as_ref(), &mut env, &workers) {
                            // Every worker answers this one afresh: those
                            // that could not apply the last may apply it.
                            awaiting = (0..n).filter(|&i| workers[i].reports.is_some()).collect();
                            replaced = false;
                            halted = false;
                            to_replace.clear();
                            crate::notify::reloading();
                            if relay.is_some() {
                                // Ready again once every worker says so.
                                waiting = Some(vec![false; n]);
                            } else {
                                crate::notify::ready(&format!("{n} worker processes serving"));
                            }
                        }
                    }
                    // The supervisor writes the error log too; each worker
                    // writes both logs: each reopens its own.
                    Sig::Usr1 => {
                        match crate::log::reopen_error_log() {
                            Ok(Some(path)) => {
                                give_error_log(path);
                                tracing::info!(
                                    "SIGUSR1: supervisor reopened the error log {}; forwarding to the workers",
                                    path.display()
                                );
                            }
                            Ok(None) => tracing::info!("SIGUSR1: forwarding to the workers"),
                            Err(e) => tracing::error!("SIGUSR1: {e}; forwarding to the workers"),
                        }
                        signal_all(&workers, libc::SIGUSR1);
                    }
                },
                Some(i) = worker_ready(relay.as_ref()) => {
                    if let Some(ready) = waiting.as_mut()
                        && let Some(r) = ready.get_mut(i)
                    {
                        *r = true;
                        if ready.iter().all(|r| *r) {
                            crate::notify::ready(&format!("{n} worker processes serving"));
                            waiting = None;
                        }
                    }
                }
                Some(event) = events.join_next() => match event {
                    Ok(Event::Exited(i, status)) => {
                        let pid = workers[i].pid.take().unwrap_or(0);
                        if let Some(reports) = workers[i].reports.take() {
                            reports.abort();
                        }
                        let was_awaited = awaiting.contains(&i);
                        awaiting.retain(|&a| a != i);
                        if awaiting.is_empty() && was_awaited && !stopping {
                            reload_done(replaced, halted);
                        }
                        // The successor of a worker being replaced died
                        // before it served: the new configuration does not
                        // start either (a file no check reads, say),
                        // and replacing the others would stop them too. They
                        // keep what they run, until the next reload.
                        if replacing.is_some_and(|(r, old)| r == i && old != pid) && !stopping {
                            replacing = None;
                            halted = true;
                            tracing::error!(
                                "worker {i}'s successor, started on the configuration the supervisor validated, \
                                 exited before it served: the other workers that could not apply it are not \
                                 replaced, and keep running the configuration they had, until the next reload"
                            );
                            to_replace.clear();
                        }
                        let w = &mut workers[i];
                        // Its connections are closed: their clients may
                        // open them again (`shared_conns`). Not when the
                        // wait failed: it may still hold them (they stay
                        // counted; a place taken is the safe way to be
                        // wrong).
                        if let (Some(conns), Ok(_)) = (&env.conns, &status) {
                            conns.give_back(i);
                        }
                        // A worker whose first run fails at once (exit status
                        // not 0: a file it cannot open, a port it cannot
                        // bind) would fail again: stop, as a single process would.
                        let failed_at_start = w.first_run
                            && w.started.elapsed() < QUICK_EXIT
                            && status.as_ref().is_ok_and(|s| s.code().is_some_and(|c| c != 0));
                        let status = match status {
                            Ok(s) => describe(s),
                            Err(e) => format!("wait failed: {e}"),
                        };
                        if stopping {
                            tracing::info!("worker {i} (pid {pid}) exited: {status}");
                            continue;
                        }
                        if failed_at_start {
                            tracing::error!("worker {i} (pid {pid}) failed at start-up ({status}); stopping");
                            stopping = true;
                            signal_all(&workers, libc::SIGTERM);
                            failure = Some(format!("worker {i} failed at start-up ({status}); see its error above"));
                            continue;
                        }
                        w.first_run = false;
                        let delay = if w.started.elapsed() < QUICK_EXIT {
                            w.quick_failures += 1;
                            let doublings = (w.quick_failures - 1).min(9);
                            Duration::from_millis(100 << doublings).min(Duration::from_secs(30))
                        } else {
                            w.quick_failures = 0;
                            Duration::ZERO
                        };
                        tracing::warn!("worker {i} (pid {pid}) exited: {status}; restarting it in {delay:?}");
                        events.spawn(async move {
                            tokio::time::sleep(delay).await;
                            Event::Restart(i)
                        });
                    }
                    Ok(Event::Restart(i)) if !stopping => {
                        start(&exe, config_path.as_ref(), &mut env, i, &mut workers[i], &mut events);
                    }
                    Ok(Event::Restart(_)) => {}
                    Ok(Event::Report(i, pid, channel, report)) => {
                        let w = &mut workers[i];
                        if w.pid != Some(pid) {
                            continue;
                        }
                        // Read on until it exits (its reader is stopped then):
                        // an empty datagram or an error is not an end.
                        w.reports = Some(events.spawn(read_report(i, pid, channel)));
                        let text = match report {
                            Ok(bytes) if bytes.is_empty() => continue,
                            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                            Err(e) => {
                                static LOGGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                                if crate::util::log_due(&LOGGED) {
                                    tracing::warn!(
                                        "cannot read worker {i}'s reports: {} (logged at most once a second)",
                                        crate::util::io_cause(&e)
                                    );
                                }
                                continue;
                            }
                        };
                        // Only an outcome answers a reload (a worker still
                        // starting says it serves first).
                        let was_awaited = awaiting.contains(&i) && text != crate::config::source::SERVING;
                        if was_awaited {
                            awaiting.retain(|&a| a != i);
                        }
                        if text == crate::config::source::APPLIED {
                            to_replace.retain(|&(a, _)| a != i);
                        }
                        // Its successor serves (not the worker replaced).
                        if text == crate::config::source::SERVING
                            && replacing.is_some_and(|(r, old)| r == i && old != pid)
                        {
                            replacing = None;
                        }
                        if let Some(why) = text.strip_prefix(crate::config::source::FAILED) {
                            // It runs another configuration than the
                            // others, and would start on the new one if it
                            // were restarted: it is. A worker starts as the
                            // supervisor's user and reads the files the
                            // configuration names before it switches to
                            // `server.user`, as the supervisor checked them.
                            tracing::error!(
                                "worker {i} (pid {pid}) could not apply the configuration the supervisor validated \
                                 ({why:?}); replacing it with a worker started on it"
                            );
                            replaced = true;
                            if halted {
                                tracing::error!(
                                    "worker {i} is not replaced: a successor already could not start on this \
                                     configuration"
                                );
                            } else if !to_replace.iter().any(|&(a, _)| a == i) {
                                to_replace.push_back((i, pid));
                            }
                        }
                        // (Nothing is queued while halted.)
                        if replacing.is_none() && !stopping {
                            replacing = replace_next(&mut to_replace, &workers, &mut events);
                        }
                        if was_awaited && awaiting.is_empty() {
                            reload_done(replaced, halted);
                        }
                    }
                    Ok(Event::ReplaceDue(i, old)) => {
                        if replacing == Some((i, old)) && !stopping {
                            if workers[i].pid.is_some_and(|p| p != old) {
                                // Its successor has run that long without
                                // saying it serves (its report lost, or not
                                // read): it runs; the next goes.
                                replacing = replace_next(&mut to_replace, &workers, &mut events);
                            } else {
                                // Still draining, or not started again yet.
                                replace_due_later(&mut events, i, old);
                            }
                        }
                    }
                    // A worker's report reader, stopped with it.
                    Err(e) if e.is_cancelled() => {}
                    Err(e) => tracing::error!("supervisor task failed: {e}"),
                },
            }
        }
    })
}

/// A directory removed (with its files) when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        // Already gone when the last worker out removed it (`workers::leave`).
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                "cannot remove {}: {cause}",
                self.0.display(),
                cause = crate::util::io_cause(&e)
            );
        }
    }
}

/// Starts worker `i`; a failure to start is an exit, so it is retried.
fn start(
    exe: &PathBuf,
    config_path: Option<&PathBuf>,
    env: &mut WorkerEnv,
    i: usize,
    w: &mut Worker,
    events: &mut JoinSet<Event>,
) {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("run").arg("--worker").arg(i.to_string());
    if let Some(p) = config_path {
        cmd.arg("-c").arg(p);
    }
    if let Some(dir) = &env.stats_dir {
        cmd.env(crate::stats::workers::ENV_DIR, dir);
    }
    // What this worker inherits: every descriptor the supervisor makes is
    // close-on-exec, and the child makes these, and only these, inheritable
    // (`handover::inherit_in_child`): no worker holds another's channel or
    // seed.
    use std::os::fd::AsRawFd;
    let mut inherit: [Option<std::os::fd::RawFd>; 7] = [None; 7];
    // The config validated last (and, after a reload, the one started on),
    // and the channel later ones come on (`config::source`).
    use crate::config::source::{ENV_CHANNEL, ENV_FD, ENV_START_FD};
    for var in [ENV_FD, ENV_START_FD, ENV_CHANNEL] {
        cmd.env_remove(var);
    }
    w.channel = None;
    let mut theirs = None;
    if let Some(start) = &env.start_file {
        let (ours, their_end) = match crate::handover::channel() {
            Ok(pair) => pair,
            Err(e) => {
                // Started without it, the worker could never be sent a
                // reload: a failed start, retried as one.
                let err = std::io::Error::new(e.kind(), format!("cannot open its config channel: {e}"));
                w.pid = Some(0);
                w.started = Instant::now();
                events.spawn(async move { Event::Exited(i, Err(err)) });
                return;
            }
        };
        let last = env.validated_file.as_ref().unwrap_or(start);
        cmd.env(ENV_FD, last.as_raw_fd().to_string());
        inherit[0] = Some(last.as_raw_fd());
        if env.validated_file.is_some() {
            cmd.env(ENV_START_FD, start.as_raw_fd().to_string());
            inherit[1] = Some(start.as_raw_fd());
        }
        cmd.env(ENV_CHANNEL, their_end.as_raw_fd().to_string());
        inherit[2] = Some(their_end.as_raw_fd());
        w.channel = Some(ours);
        theirs = Some(their_end);
    }
    // The memory the workers share (`handover::shared_memory`).
    let shared = [
        (
            crate::shared_buckets::ENV_FD,
            env.buckets.as_ref().map(|fd| fd.as_raw_fd()),
            3,
        ),
        (
            crate::shared_conns::ENV_FD,
            env.conns.as_ref().map(|s| s.fd().as_raw_fd()),
            5,
        ),
        (
            crate::cache::told::ENV_FD,
            env.told.as_ref().map(|fd| fd.as_raw_fd()),
            6,
        ),
    ];
    for (var, fd, slot) in shared {
        match fd {
            Some(fd) => {
                cmd.env(var, fd.to_string());
                inherit[slot] = Some(fd);
            }
            None => {
                cmd.env_remove(var);
            }
        }
    }
    // The ticket keys: the chain as of the oldest period a worker keeps
    // now, in a memory file this worker alone inherits (closed here once
    // it is started).
    cmd.env_remove(crate::tls_resume::ENV_SEED);
    let mut seed_file = None;
    if let Some(seed) = env.seed.as_mut() {
        seed.ratchet(&env.tls, now_unix());
        match seed.sealed() {
            Ok(fd) => {
                cmd.env(crate::tls_resume::ENV_SEED, fd.as_raw_fd().to_string());
                inherit[4] = Some(fd.as_raw_fd());
                seed_file = Some(fd);
            }
            Err(e) => tracing::warn!(
                "cannot hand the ticket keys to worker {i}: {cause}; its session tickets resume only on it",
                cause = crate::util::io_cause(&e)
            ),
        }
    }
    // A socket for each listener, made here (`listen::reserve`), so that
    // every listener socket is the supervisor's; one that cannot be made
    // the worker binds itself (and says why if it cannot either).
    let mut listeners = Vec::with_capacity(env.listeners.len());
    for l in &env.listeners {
        match crate::listen::reserve(l) {
            Ok(socket) => listeners.push((l.address, socket)),
            Err(e) => tracing::warn!("worker {i}: {e}; it binds the listener itself"),
        }
    }
    let named: Vec<String> = listeners
        .iter()
        .map(|(addr, socket)| format!("{}@{addr}", socket.as_raw_fd()))
        .collect();
    cmd.env(crate::listen::ENV_LISTENERS, named.join(","));
    let inherit_listeners: Vec<std::os::fd::RawFd> = listeners.iter().map(|(_, s)| s.as_raw_fd()).collect();
    // The supervisor's relay, or none: only the supervisor talks to systemd.
    match &env.notify {
        Some(path) => cmd.env(crate::notify::ENV, path),
        None => cmd.env_remove(crate::notify::ENV),
    };
    cmd.env(crate::notify::WORKER_KEY, i.to_string())
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(false);
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls fcntl, prctl, sigemptyset, sigaddset and sigprocmask, which are
    // async-signal-safe, on descriptor numbers it copied (a vector made
    // before the fork, only read) and a set on its own stack; it allocates
    // nothing.
    unsafe {
        cmd.pre_exec(move || {
            for fd in inherit.into_iter().flatten().chain(inherit_listeners.iter().copied()) {
                crate::handover::inherit_in_child(fd)?;
            }
            // The supervisor gone (even by SIGKILL) means the worker drains and exits.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A SIGHUP forwarded before the worker has installed its
            // handler must neither kill it (the default action) nor be
            // lost (it may have read the config before the reload): it
            // stays pending, blocked across exec, until the worker has its
            // handler and unblocks it (`Signals::unblock`), and then
            // reloads. A SIGUSR1 (log rotation) likewise: it killed a
            // worker still starting, then was ignored while it started.
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    w.started = Instant::now();
    let spawned = cmd.spawn();
    // The child has its copies; these were for it alone.
    drop((theirs, seed_file, listeners));
    match spawned {
        Ok(mut child) => {
            w.pid = child.id();
            tracing::info!("worker {i} started (pid {})", w.pid.unwrap_or(0));
            // Its reports (each reload's outcome) come on its channel.
            let reader = w.channel.as_ref().map(|ours| {
                let ours = ours.try_clone()?;
                // SAFETY: the OwnedFd is the AsyncFd's own: its descriptor
                // stays open, and the same, until the AsyncFd is dropped.
                unsafe { AsyncFd::register_with_interest(ours, tokio::io::Interest::READABLE) }
                    .map_err(std::io::Error::from)
            });
            match (reader, w.pid) {
                (Some(Ok(channel)), Some(pid)) => w.reports = Some(events.spawn(read_report(i, pid, channel))),
                (Some(Err(e)), _) => tracing::warn!(
                    "cannot read worker {i}'s reports: {}; a reload it cannot apply goes unnoticed here",
                    crate::util::io_cause(&e)
                ),
                _ => {}
            }
            events.spawn(async move { Event::Exited(i, child.wait().await) });
        }
        Err(e) => {
            w.pid = Some(0);
            let err = std::io::Error::new(e.kind(), format!("cannot start: {e}"));
            events.spawn(async move { Event::Exited(i, Err(err)) });
        }
    }
}

/// What the workers get in their environment from the supervisor.
struct WorkerEnv {
    /// Where they leave their statistics.
    stats_dir: Option<PathBuf>,
    /// The config text the supervisor started on, in a sealed memory file
    /// (`config::source`); None on the embedded defaults.
    start_file: Option<std::os::fd::OwnedFd>,
    /// The text a reload validated since, likewise.
    validated_file: Option<std::os::fd::OwnedFd>,
    /// The supervisor's readiness relay (their `NOTIFY_SOCKET`).
    notify: Option<PathBuf>,
    /// The ticket key chain every worker gets (`tls_resume`).
    seed: Option<crate::tls_resume::Seed>,
    /// `[tls]` as the supervisor started: how far the chain moves on.
    tls: crate::config::TlsConfig,
    /// The memory file of the limits' buckets (`shared_buckets`), inherited.
    buckets: Option<std::os::fd::OwnedFd>,
    /// The clients' connection counts (`shared_conns`), inherited.
    conns: Option<crate::shared_conns::Shared>,
    /// The ring of the cache's removals (`cache::told`), inherited.
    told: Option<std::os::fd::OwnedFd>,
    /// The listeners of the configuration validated last: a worker
    /// started is handed a socket for each (`listen::reserve`).
    listeners: Vec<ListenerConfig>,
    /// The user the workers switch to, if the supervisor runs as root
    /// (`server.user` is restart-only: the one it started with).
    switching: Option<crate::privdrop::Target>,
}

/// The current time in seconds since the epoch.
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The index of the next worker reporting `READY=1` on the relay; never
/// resolves without a relay.
async fn worker_ready(relay: Option<&tokio::net::UnixDatagram>) -> Option<usize> {
    let Some(relay) = relay else {
        return std::future::pending().await;
    };
    let mut buf = [0u8; 4096];
    loop {
        let n = relay.recv(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf[..n]);
        let mut lines = text.lines();
        let ready = text.lines().any(|l| l == "READY=1");
        let worker = lines.find_map(|l| {
            l.strip_prefix(crate::notify::WORKER_KEY)?
                .strip_prefix('=')?
                .parse()
                .ok()
        });
        if let (true, Some(i)) = (ready, worker) {
            return Some(i);
        }
    }
}

/// Validates the config file once (the listeners it adds bound, as at the
/// start), hands the workers the text it validated with a socket for each
/// added listener, then asks every worker to reload; true if it did.
fn reload(config: &Config, config_path: Option<&PathBuf>, env: &mut WorkerEnv, workers: &[Worker]) -> bool {
    let Some(path) = config_path else {
        tracing::warn!("SIGHUP: running on the embedded defaults (no -c FILE): nothing to reload");
        return false;
    };
    // Checked as `portico check` does, certificates included: what the
    // workers get is what a worker restarted later starts on, and one it
    // would refuse would keep it from starting. A listener it adds is
    // bound here once (and then a socket for each worker, sent with the
    // text): one on a port another program holds refuses the reload here,
    // rather than in every worker and then every successor.
    let checked = crate::config::source::read_file(path)
        .map_err(|e| e.to_string())
        .and_then(|(new, text)| crate::tls::check_listeners(&new).map(|()| (new, text)))
        .and_then(|(new, text)| {
            let added: Vec<ListenerConfig> = new
                .listener
                .iter()
                .filter(|l| !env.listeners.iter().any(|k| k.address == l.address))
                .cloned()
                .collect();
            // Workers that read the file bind what it adds themselves, as
            // the user; a worker restarted later could not bind next to
            // them as root (SO_REUSEPORT sockets of two owners), and would
            // be restarted forever.
            if !added.is_empty() && env.start_file.is_none() && env.switching.is_some() {
                return Err(format!(
                    "listener {} is new, and the workers, which read the file (no memory file could be made \
                     for them), would bind it as server.user; restart Portico to add listeners",
                    added[0].address
                ));
            }
            if added.len() > crate::handover::MOST_LISTENERS {
                return Err(format!(
                    "{} listeners added at once; at most {} are (add them over several reloads)",
                    added.len(),
                    crate::handover::MOST_LISTENERS
                ));
            }
            crate::listen::check_bindable(&added)?;
            Ok((new, text, added))
        });
    match checked {
        Err(e) => {
            tracing::error!("reload failed, still running on the previous config: {e}");
            false
        }
        Ok((new, text, added)) => {
            // Applied as `server.user`, the one in force (a restart-only
            // setting): what that user cannot read fails in every worker,
            // which is then replaced.
            if let Some(user) = &env.switching {
                let read_at_reload = env.start_file.is_none().then_some(path.as_path());
                for w in crate::privdrop::unreadable_by(user, &new, read_at_reload) {
                    tracing::warn!("reload: {w}");
                }
            }
            // Workers handed their config get the new text on their
            // channel, before the signal, with a socket for each listener
            // it adds; the others read the file.
            if env.start_file.is_some() {
                let sealed = match crate::handover::sealed(c"portico-config", text.as_bytes()) {
                    Ok(fd) => fd,
                    Err(e) => {
                        tracing::error!(
                            "reload failed, still running on the previous config: cannot hand {} to the workers: {cause}",
                            path.display(),
                            cause = crate::util::io_cause(&e)
                        );
                        return false;
                    }
                };
                for (i, w) in workers.iter().enumerate() {
                    let (Some(pid), Some(channel)) = (w.pid.filter(|p| *p > 0), &w.channel) else {
                        continue;
                    };
                    // Its sockets for the added listeners, made and sent
                    // one worker at a time (a worker not running gets
                    // them when it starts).
                    let sent = added
                        .iter()
                        .map(|l| crate::listen::reserve(l).map(|s| (l.address, s)))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(std::io::Error::other)
                        .and_then(|sockets| {
                            use std::os::fd::AsFd;
                            let fds: Vec<_> = sockets.iter().map(|(a, s)| (*a, s.as_fd())).collect();
                            crate::handover::send(channel, sealed.as_fd(), &fds)
                        });
                    if let Err(e) = sent {
                        // It would run another config than the others: it
                        // drains and is started again on this one.
                        tracing::error!(
                            "cannot send worker {i} (pid {pid}) the new config: {cause}; stopping it, to be \
                             restarted on it",
                            cause = crate::util::io_cause(&e)
                        );
                        if let Ok(pid) = libc::pid_t::try_from(pid) {
                            // SAFETY: kill has no memory-safety preconditions.
                            // (The pid is our child's; if it has exited, its
                            // exit event clears it before it can be reused.)
                            unsafe { libc::kill(pid, libc::SIGTERM) };
                        }
                    }
                }
                env.validated_file = Some(sealed);
            }
            env.listeners = new.listener.clone();
            if new.server.processes != config.server.processes {
                tracing::warn!(
                    "reload: `server.processes` changed ({} -> {}): needs restart; keeping {}",
                    config.server.processes,
                    new.server.processes,
                    config.server.processes
                );
            }
            tracing::info!("SIGHUP: {} is valid; the workers reload it", path.display());
            signal_all(workers, libc::SIGHUP);
            true
        }
    }
}

/// Sends `sig` to every worker that runs.
fn signal_all(workers: &[Worker], sig: libc::c_int) {
    workers.iter().for_each(|w| signal_one(w, sig));
}

/// Sends `sig` to worker `w`, if it runs.
fn signal_one(w: &Worker, sig: libc::c_int) {
    if let Some(pid) = w.pid
        && let Ok(pid) = libc::pid_t::try_from(pid)
        && pid > 0
    {
        // SAFETY: kill has no memory-safety preconditions; the pid is a
        // child of ours not yet reaped (its exit event clears it).
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// "exit status 1" or "killed by signal 9 (SIGKILL)".
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGINT => " (SIGINT)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("killed by signal {sig}{name}")
        }
        None => format!("{status}"),
    }
}
