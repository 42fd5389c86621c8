//! Starting and stopping the server: runtime, logs, listeners, signals.
//!
//! Signals: SIGHUP reloads the config (`reload.rs`); SIGUSR1 reopens the
//! error and access logs (rotation); SIGTERM or SIGINT
//! drains (`drain.rs`): the listeners close at once, idle connections
//! close, busy ones finish their current response (sent with
//! `Connection: close`), and the process exits when none is left or
//! `server.shutdown_timeout` has passed; a second SIGTERM or SIGINT exits
//! at once. With `processes = N > 1` and no `--worker`, `run` is the
//! supervisor instead (`supervisor.rs`).

use crate::config::Config;
use crate::listen::bind_all;
use crate::reload::Running;
use crate::signals::{Sig, Signals};
use std::path::PathBuf;

/// Tasks a runtime worker runs between two polls for I/O events (tokio's
/// default).
const EVENT_INTERVAL: u32 = 61;
/// I/O events one poll takes at most: about half of [`EVENT_INTERVAL`], so
/// that the tasks one poll wakes fit the worker's local queue (see `run`).
const IO_EVENTS_PER_POLL: usize = 32;

/// How `portico run` was invoked.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The config file, re-read on SIGHUP (by a worker process, through
    /// its supervisor); None = embedded defaults.
    pub config_path: Option<PathBuf>,
    /// The text `config` was read from (`config::source::read_at_start`): what a
    /// supervisor hands its workers.
    pub config_text: Option<String>,
    /// Set in a worker process started by the supervisor: its index.
    pub worker: Option<usize>,
}

/// The warnings about destinations (`upstream::Destinations::warnings`):
/// clients reaching this host's loopback services, `allow_destinations`
/// that lift nothing. For `portico check`.
pub fn destination_warnings(config: &Config) -> Vec<String> {
    crate::upstream::Destinations::warnings(config)
}

/// Runs the server on `config` until SIGINT or SIGTERM (then drains).
pub fn run(mut config: Config, opts: RunOptions) -> Result<(), String> {
    crate::log::init_error_log(&config.log)?;
    // Before anything is bound or started (and in the supervisor, before
    // any worker): a bad certificate stops start-up with its file named.
    crate::tls::check_listeners(&config)?;
    if opts.worker.is_none() {
        // Without -c the file may be a default one: say which.
        match &opts.config_path {
            Some(p) => tracing::info!("config file: {}", p.display()),
            None => tracing::info!("config: the embedded defaults (no config file)"),
        }
    }
    // The size of the per-client tables a process keeps itself (a worker
    // uses its supervisor's).
    crate::shared_buckets::set_client_table(config.limits.client_table as usize);
    crate::shared_conns::set_client_table(config.limits.client_table as usize);
    if opts.worker.is_none() && config.server.processes > 1 {
        return crate::supervisor::run(config, opts.config_path, opts.config_text);
    }
    if let Some(i) = opts.worker {
        // Logged before the index is set: from then on the error log tags
        // every line with "worker I: " itself (`log::init_error_log`).
        tracing::info!("worker {i} (pid {}) starting", std::process::id());
        crate::worker::set_index(i);
        // Whether it keeps the limits for all clients with the others.
        crate::shared_buckets::report();
        crate::shared_conns::report();
        crate::cache::told::report();
    }
    let workers = if config.server.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.server.workers
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(workers)
        .thread_name("portico-worker")
        // Fairness under many busy connections. A worker polls for I/O
        // every EVENT_INTERVAL tasks; tasks woken by one poll go to its
        // local queue (256), and those that do not fit go to the global
        // queue, which the worker looks at only every few dozen tasks while
        // its local queue keeps being refilled: with 1,000 busy keep-alive
        // connections the ones that overflowed waited 160 ms (the `busy`
        // benchmark's p99) while the median was 8 ms. A poll that brings no
        // more tasks than the worker runs before the next one never
        // overflows: the rest wait in the kernel's ready list, in the order
        // they became ready, as they do for nginx (the `busy` benchmark's
        // p99 now 31-47 ms, nginx's 27-31).
        .event_interval(EVENT_INTERVAL)
        .max_io_events_per_tick(IO_EVENTS_PER_POLL)
        .enable_all();
    let runtime = builder.build().map_err(|e| format!("cannot start the runtime: {e}"))?;
    // Catch the signals before any socket listens: once a client (or a
    // supervisor) can see us listening, a signal must mean a clean
    // shutdown or a reload, not the default action of killing the process.
    let mut signals = {
        let _enter = runtime.enter();
        Signals::install()
    };
    // A SIGHUP or SIGUSR1 the supervisor sent a worker before now waited,
    // blocked (`supervisor::start`): it comes now, to the handlers, and
    // the loop below acts on it once serving.
    signals.unblock();
    // TLS session resumption: a worker seals tickets with the keys the
    // supervisor handed it (the same in every worker); one process draws its own.
    let seed = match opts.worker {
        Some(_) => crate::tls_resume::Seed::from_supervisor()?,
        None => None,
    };
    let tls_listeners = config.listener.iter().any(|l| !l.certificate.is_empty());
    if opts.worker.is_some() && seed.is_none() && config.tls.session_tickets && tls_listeners {
        tracing::warn!("no ticket keys from the supervisor: this worker's session tickets resume only on it");
    }
    crate::tls_resume::install(&config.tls, seed)?;
    // Connections are bounded by file descriptors: use all the hard limit
    // allows, and size the connection limits left at 0 from it.
    let files = crate::sizing::raise_open_files();
    if files.now > files.before {
        tracing::info!("open-files limit raised from {} to {}", files.before, files.now);
    }
    if let Err(e) = crate::sizing::grow_descriptor_table(files.now) {
        tracing::warn!(
            "cannot grow the descriptor table at start-up ({}): it grows while serving, each time after a pause",
            crate::util::io_cause(&e)
        );
    }
    // Outside the log macro: its arguments are not evaluated when the
    // level is above info, and the sizing must happen regardless.
    let sized = crate::sizing::resolve(&mut config, files.now);
    tracing::info!("sizing: {sized}");
    if let Some(w) = crate::sizing::open_files_warning(&config, files.now) {
        tracing::warn!("{w}");
    }
    // Once per server: a worker's supervisor said it.
    if opts.worker.is_none() {
        for w in crate::upstream::Destinations::warnings(&config) {
            tracing::warn!("{w}");
        }
        // One process reads its configuration file again at a reload.
        for w in crate::privdrop::unreadable_warnings(&config, opts.config_path.as_deref()) {
            tracing::warn!("{w}");
        }
    }
    // Which of the files Portico writes exist before it opens them (those it
    // creates go to `server.user`); an unknown user fails start-up here.
    crate::privdrop::prepare(&config)?;
    // Bind before serving anything, so a busy port fails start-up with a
    // clear message and nothing half-running.
    // A worker listens on the sockets its supervisor made for it.
    let handed = match opts.worker {
        Some(_) => crate::listen::inherited()?,
        None => Vec::new(),
    };
    let sockets = bind_all(&config, handed)?;
    // The supervisor writes it in multi-process mode.
    let _pid_file = match opts.worker {
        None => crate::privdrop::PidFile::write(&config.server.pid_file)?,
        Some(_) => None,
    };
    let result = runtime.block_on(async move {
        // Opens the logs and the cache, switches to `server.user`, then serves.
        let mut running = Running::start(config, opts.config_path, sockets)?;
        let serving = |r: &Running| format!("serving on {} listeners", r.config().listener.len());
        crate::notify::ready(&serving(&running));
        crate::config::source::report_serving();
        loop {
            match signals.next().await {
                Sig::Hup => {
                    crate::notify::reloading();
                    running.reload();
                    // Also after a failed reload: the old config still serves.
                    crate::notify::ready(&serving(&running));
                }
                Sig::Usr1 => running.reopen_logs(),
                Sig::Term(name) => {
                    crate::notify::stopping("draining connections");
                    tracing::info!("{name}: shutting down (draining connections)");
                    break;
                }
            }
        }
        let drained = drain(&mut running, &mut signals).await;
        running.save_cache_state();
        drained
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // After the runtime: its figures writer can no longer recreate the file.
    crate::stats::workers::leave();
    result
}

/// Stops accepting and waits for the open connections to finish, for at
/// most `server.shutdown_timeout`; a second SIGTERM/SIGINT ends it at once.
async fn drain(running: &mut Running, signals: &mut Signals) -> Result<(), String> {
    crate::drain::start();
    running.stop_listening();
    let timeout = running.config().server.shutdown_timeout;
    let open = crate::drain::open_connections();
    if open > 0 {
        tracing::info!("waiting up to {timeout} for {open} open connections to finish");
    }
    let deadline = tokio::time::sleep(timeout.get());
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = crate::drain::all_closed() => {
                tracing::info!("all connections finished; exiting");
                return Ok(());
            }
            () = &mut deadline => {
                tracing::warn!(
                    "server.shutdown_timeout ({timeout}) passed with {} connections open; exiting",
                    crate::drain::open_connections()
                );
                return Ok(());
            }
            sig = signals.next() => match sig {
                Sig::Hup => tracing::warn!("SIGHUP ignored: shutting down"),
                Sig::Usr1 => running.reopen_logs(),
                Sig::Term(name) => {
                    return Err(format!(
                        "second {name}: exiting at once with {} connections open",
                        crate::drain::open_connections()
                    ));
                }
            },
        }
    }
}
