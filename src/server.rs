//! Starting and stopping the server: runtime, logs, listeners.

use crate::config::Config;
use crate::http1::{ConnSettings, HeadLimits};
use crate::listen::{accept_loop, bind};
use crate::proxy::{ListenerHandler, Shared};
use std::sync::Arc;

/// Runs the server on `config` until SIGINT or SIGTERM.
pub fn run(mut config: Config) -> Result<(), String> {
    crate::log::init_error_log(&config.log)?;
    // Connections are bounded by file descriptors: use all the hard limit
    // allows, and size the connection limits left at 0 from it.
    let files = crate::sizing::raise_open_files();
    if files.now > files.before {
        tracing::info!("open-files limit raised from {} to {}", files.before, files.now);
    }
    tracing::info!("sizing: {}", crate::sizing::resolve(&mut config, files.now));
    let workers = if config.server.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.server.workers
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("portico-worker")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    // Catch SIGTERM and SIGINT before any socket listens: once a client (or
    // a supervisor) can see us listening, a signal must mean a clean
    // shutdown, not the default action of killing the process.
    let signals = {
        let _enter = runtime.enter();
        Signals::install()
    };
    // Bind before serving anything, so a busy port fails start-up with a
    // clear message and nothing half-running.
    let mut sockets = Vec::with_capacity(config.listener.len());
    for l in &config.listener {
        sockets.push((l.clone(), bind(l)?));
    }
    runtime.block_on(async move {
        let shared = Arc::new(Shared::new(config)?);
        spawn_log_reopen(shared.clone());
        let settings = Arc::new(conn_settings(&shared));
        for (index, (cfg, socket)) in sockets.into_iter().enumerate() {
            let listener =
                tokio::net::TcpListener::from_std(socket).map_err(|e| format!("listener {}: {e}", cfg.address))?;
            tracing::info!("listening on {} ({:?} proxy)", cfg.address, cfg.mode);
            let handler = Arc::new(ListenerHandler::new(index, &cfg, shared.clone())?);
            tokio::spawn(accept_loop(listener, cfg.nodelay, settings.clone(), handler));
        }
        signals.recv().await;
        tracing::info!("shutting down");
        Ok::<(), String>(())
    })?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}

/// SIGUSR1 reopens the access log (after rotation renamed it).
fn spawn_log_reopen(shared: Arc<Shared>) {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::user_defined1()) {
        Ok(mut usr1) => {
            tokio::spawn(async move {
                while usr1.recv().await.is_some() {
                    tracing::info!("SIGUSR1: reopening the access log");
                    shared.access_log.reopen();
                }
            });
        }
        Err(e) => tracing::warn!("cannot catch SIGUSR1 (log reopen): {e}"),
    }
}

fn conn_settings(shared: &Shared) -> ConnSettings {
    let c = &shared.config;
    ConnSettings {
        limits: HeadLimits {
            max_request_line: c.limits.max_request_line.as_usize(),
            max_head: c.limits.max_header_size.as_usize(),
            max_headers: c.limits.max_headers,
        },
        header_timeout: c.limits.header_timeout.get(),
        keepalive: shared.keepalive.clone(),
        max_requests: c.keepalive.max_requests,
        max_body: c.limits.max_body_size.bytes(),
        body_idle_timeout: c.origin.idle_timeout.get(),
    }
}

/// SIGTERM and SIGINT, registered as soon as they are created.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Registers the handlers; must run inside the runtime.
    fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        let register = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("cannot catch {name}: {e}");
                None
            }
        };
        Signals {
            term: register(SignalKind::terminate(), "SIGTERM"),
            int: register(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// Waits for either signal.
    async fn recv(mut self) {
        async fn one(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = one(&mut self.term) => {}
            () = one(&mut self.int) => {}
        }
    }
}
