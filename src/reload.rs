//! The running server's listeners and shared state, and the config reload
//! (SIGHUP) that replaces them without dropping a connection.
//!
//! A reload reads the file again; an invalid file changes nothing (the
//! error, with the loader's `FILE:LINE` message, goes to the error log).
//! Otherwise a new `proxy::Shared` is built (rules, upstream groups, access
//! lists, access log, cache policy; the cached objects are kept) and
//! swapped in atomically: each request uses the state current when it
//! started, so requests in flight finish on the old config and new ones get
//! the new one. Listeners are matched by address: a kept one keeps its
//! socket (no rebind, no refused connection) and its new settings apply to
//! connections accepted after the reload; an added one is bound (a bind
//! failure aborts the whole reload); a removed one stops accepting and its
//! connections finish. Settings that need a restart keep their old value,
//! with a warning.

use crate::config::{Config, ListenerConfig};
use crate::http1::{ConnSettings, HeadLimits};
use crate::listen::{Serving, accept_loop, bind, listen_on};
use crate::proxy::{ListenerHandler, Shared};
use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;

/// One listening socket's accept loop.
struct Slot {
    cfg: ListenerConfig,
    /// The address the socket is bound to (what `listen::is_own_address`
    /// compares against).
    local: SocketAddr,
    serving: Arc<ArcSwap<Serving<ListenerHandler>>>,
    stop: watch::Sender<bool>,
}

/// The server as it runs: config, shared state, listeners.
pub struct Running {
    config: Config,
    config_path: Option<PathBuf>,
    shared: Arc<ArcSwap<Shared>>,
    slots: Vec<Slot>,
}

impl Running {
    /// Builds the shared state and starts an accept loop on each bound
    /// socket; must run inside the runtime.
    pub fn start(
        config: Config,
        config_path: Option<PathBuf>,
        sockets: Vec<(ListenerConfig, std::net::TcpListener)>,
    ) -> Result<Running, String> {
        let config = per_process(config);
        let state = Shared::new(config.clone())?;
        state.rules.activate(false);
        if let Some(disk) = state.cache.as_ref().and_then(|c| c.disk()) {
            if config.server.processes > 1 {
                disk.set_shared_dir(true);
            }
            disk.keep_popularity(crate::worker::index());
        }
        // The logs and the cache are open, the listeners bound: no longer
        // root (`server.user`) before the first request is accepted.
        crate::privdrop::switch()?;
        let shared = Arc::new(ArcSwap::from_pointee(state));
        crate::proxy::monitor::spawn_figures_writer(shared.clone());
        let mut running = Running {
            config,
            config_path,
            shared,
            slots: Vec::new(),
        };
        // Before any accept loop runs, so the very first request is
        // already checked against them.
        crate::listen::set_own_addresses(sockets.iter().map(|(c, s)| bound_address(c, s)).collect());
        running.publish_client_limit();
        for (cfg, socket) in sockets {
            running.spawn(cfg, socket)?;
        }
        Ok(running)
    }

    /// Saves what the disk cache keeps between runs besides its objects
    /// (the popularity sketch), at shutdown; a failure is logged.
    pub fn save_cache_state(&self) {
        if let Some(disk) = self.shared.load().cache.as_ref().and_then(|c| c.disk())
            && let Err(e) = disk.save_popularity()
        {
            tracing::warn!("disk cache: {e}");
        }
    }

    /// What listener `cfg` serves with under `config`; fails if its
    /// `busy_file` cannot be read.
    fn serving(&self, cfg: &ListenerConfig, config: &Config) -> Result<Serving<ListenerHandler>, String> {
        let keepalive = self.shared.load().keepalive.clone();
        Ok(Serving {
            nodelay: cfg.nodelay,
            defer_accept: crate::listen::defer_accept_secs(cfg.defer_accept.get()),
            settings: Arc::new(ConnSettings {
                h2: crate::http1::h2::H2Settings::for_listener(config, cfg),
                ..conn_settings(config, keepalive)
            }),
            handler: Arc::new(ListenerHandler::new(
                config
                    .listener
                    .iter()
                    .position(|l| l.address == cfg.address)
                    .unwrap_or(0),
                cfg,
                &config.server,
                self.shared.clone(),
            )?),
            tls: crate::tls::server_config(cfg)?,
        })
    }

    fn spawn(&mut self, cfg: ListenerConfig, socket: std::net::TcpListener) -> Result<(), String> {
        let local = bound_address(&cfg, &socket);
        let listener =
            tokio::net::TcpListener::from_std(socket).map_err(|e| format!("listener {}: {e}", cfg.address))?;
        tracing::info!(
            "listening on {} ({:?} proxy{})",
            cfg.address,
            cfg.mode,
            if cfg.certificate.is_empty() { "" } else { ", TLS" }
        );
        let serving = Arc::new(ArcSwap::from_pointee(self.serving(&cfg, &self.config)?));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept_loop(listener, serving.clone(), stopped));
        self.slots.push(Slot {
            cfg,
            local,
            serving,
            stop,
        });
        Ok(())
    }

    /// Tells the upstream side which addresses are this process's own: the
    /// listeners' and `extra` (listeners bound but not yet serving).
    fn publish_own_addresses(&self, extra: &[SocketAddr]) {
        let mut own: Vec<SocketAddr> = self.slots.iter().map(|s| s.local).collect();
        own.extend_from_slice(extra);
        crate::listen::set_own_addresses(own);
    }

    /// Tells the accept loops `limits.max_connections_per_client`, and the
    /// array members it does not apply to.
    fn publish_client_limit(&self) {
        let members = self
            .shared
            .load()
            .array
            .as_ref()
            .map_or_else(Vec::new, |a| a.member_ips());
        crate::client_limit::set_limit(self.config.limits.max_connections_per_client, members);
        crate::client_rate::set(
            self.config.limits.client_request_rate,
            self.config.limits.client_request_burst,
        );
        crate::client_bandwidth::set(
            self.config.limits.client_bandwidth.bytes(),
            self.config.limits.client_bandwidth_burst.bytes(),
        );
        crate::client_bandwidth::set_total(
            self.config.limits.total_bandwidth.bytes(),
            self.config.limits.total_bandwidth_burst.bytes(),
        );
    }

    /// The configuration in force (per process: see [`per_process`]).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Closes every listening socket (new connections are refused);
    /// connections already accepted go on.
    pub fn stop_listening(&mut self) {
        for slot in self.slots.drain(..) {
            let _ = slot.stop.send(true);
        }
    }

    /// SIGUSR1: the error log and the access log are reopened (log
    /// rotation renamed them). The error log first, so that the line saying
    /// so is the first of the new file.
    pub fn reopen_logs(&self) {
        crate::log::reopen_logs_line();
        self.shared.load().access_log.reopen();
    }

    /// SIGHUP: re-reads the config file (in a worker process, the text
    /// its supervisor sent, `config::source`) and applies it, or logs why not.
    pub fn reload(&mut self) {
        let Some(path) = self.config_path.clone() else {
            tracing::warn!("SIGHUP: running on the embedded defaults (no -c FILE): nothing to reload");
            return;
        };
        // A worker reloads what its supervisor has just validated.
        let new = match crate::config::source::read_for_reload(&path) {
            Ok(mut c) => {
                // Limits left at 0 are sized as at start-up, so they compare
                // equal to the running ones (they need a restart to change).
                crate::sizing::resolve(&mut c, crate::sizing::raise_open_files().now);
                c
            }
            Err(e) => {
                tracing::error!("reload failed, still running on the previous config: {e}");
                crate::config::source::report(Err(&e.to_string()));
                return;
            }
        };
        match self.apply(per_process(new)) {
            Ok(summary) => {
                crate::config::source::applied();
                tracing::info!("reloaded {}: {summary}", path.display());
                crate::config::source::report(Ok(()));
            }
            Err(e) => {
                tracing::error!(
                    "reload of {} failed, still running on the previous config: {e}",
                    path.display()
                );
                crate::config::source::report(Err(&e));
            }
        }
    }

    fn apply(&mut self, mut new: Config) -> Result<String, String> {
        keep_restart_only(&self.config, &mut new);
        let shared = self.shared.load().renew(new.clone())?;
        // A listener's busy page is read now, so an unreadable `busy_file`
        // fails the reload before anything changes.
        // So are its certificates: a bad new one (unreadable, expired, a
        // key that does not match) keeps the old ones serving.
        for l in &new.listener {
            crate::proxy::reply::BusyPage::for_listener(l, &new.server)?;
            crate::tls::server_config(l)?;
        }
        // Bind the added listeners before changing anything, so a busy port
        // leaves the running config whole.
        // A worker handed its config listens on the sockets its supervisor
        // sent with the text (`listen::reserve`), taken all at once;
        // any other process binds its own.
        let reuse_port = new.server.processes > 1;
        let adding: Vec<&ListenerConfig> = new
            .listener
            .iter()
            .filter(|l| !self.slots.iter().any(|s| s.cfg.address == l.address))
            .collect();
        let addrs: Vec<SocketAddr> = adding.iter().map(|l| l.address).collect();
        let mut added = Vec::new();
        match crate::config::source::take_listeners(&addrs) {
            None => {
                for l in adding {
                    added.push((l.clone(), bind(l, reuse_port)?));
                }
            }
            Some(handed) => {
                for (l, socket) in adding.into_iter().zip(handed?) {
                    added.push((l.clone(), listen_on(l, socket)?));
                }
            }
        }
        // Known as ours from the moment they are bound: a connection to
        // one waits in its backlog until its accept loop starts, and must
        // already be refused as a loop.
        let bound: Vec<SocketAddr> = added.iter().map(|(c, s)| bound_address(c, s)).collect();
        self.publish_own_addresses(&bound);
        shared.rules.activate(true);
        self.shared.store(Arc::new(shared));
        self.config = new;
        self.publish_client_limit();
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        for slot in std::mem::take(&mut self.slots) {
            match self
                .config
                .listener
                .iter()
                .find(|l| l.address == slot.cfg.address)
                .cloned()
            {
                Some(mut cfg) => {
                    if cfg.listen_queue != slot.cfg.listen_queue {
                        tracing::warn!(
                            "reload: listener {} listen_queue changed ({} -> {}): needs restart; keeping {}",
                            cfg.address,
                            slot.cfg.listen_queue,
                            cfg.listen_queue,
                            slot.cfg.listen_queue
                        );
                    }
                    for (key, was, now) in [
                        ("receive_buffer", slot.cfg.receive_buffer, cfg.receive_buffer),
                        ("send_buffer", slot.cfg.send_buffer, cfg.send_buffer),
                    ] {
                        if was != now {
                            tracing::warn!(
                                "reload: listener {} {key} changed ({was} -> {now}): needs restart; keeping {was}",
                                cfg.address
                            );
                        }
                    }
                    // The slot keeps what its socket has, so that a later
                    // reload compares against that (and warns again).
                    cfg.listen_queue = slot.cfg.listen_queue;
                    cfg.receive_buffer = slot.cfg.receive_buffer;
                    cfg.send_buffer = slot.cfg.send_buffer;
                    match self.serving(&cfg, &self.config) {
                        Ok(serving) => {
                            slot.serving.store(Arc::new(serving));
                            kept.push(Slot { cfg, ..slot });
                        }
                        Err(e) => {
                            // Checked before the swap (below), so only a file
                            // that vanished in between gets here.
                            tracing::error!("reload: listener {}: {e}; keeping its previous settings", cfg.address);
                            kept.push(slot);
                        }
                    }
                }
                None => {
                    tracing::info!("reload: listener {} removed: no longer accepting", slot.cfg.address);
                    let _ = slot.stop.send(true);
                    removed.push(slot.cfg.address);
                }
            }
        }
        self.slots = kept;
        let added_addrs: Vec<SocketAddr> = added.iter().map(|(c, _)| c.address).collect();
        for (cfg, socket) in added {
            let addr = cfg.address;
            // Past the point of no return: the new config is in force.
            if let Err(e) = self.spawn(cfg, socket) {
                tracing::error!("reload: cannot serve added listener {addr}: {e}");
            }
        }
        self.publish_own_addresses(&[]);
        Ok(format!(
            "{} listeners ({} added, {} removed)",
            self.slots.len(),
            added_addrs.len(),
            removed.len()
        ))
    }
}

/// The address `socket` is bound to; the configured one if the system
/// cannot say (they differ only for port 0).
fn bound_address(cfg: &ListenerConfig, socket: &std::net::TcpListener) -> SocketAddr {
    socket.local_addr().unwrap_or(cfg.address)
}

/// The config a process runs on: with `processes = N`, each worker's disk
/// tier keeps what it knows of within `cache.disk / N`, so the shared
/// directory as a whole stays within `cache.disk` (each process's index
/// counts the objects it wrote and those it found at start).
fn per_process(mut c: Config) -> Config {
    let n = c.server.processes.max(1) as u64;
    if n > 1 {
        c.cache.disk = crate::config::Size(c.cache.disk.bytes() / n);
    }
    c
}

/// Settings a running process cannot change: `new` gets the old value back,
/// and each change is logged as needing a restart.
pub(crate) fn keep_restart_only(old: &Config, new: &mut Config) {
    macro_rules! keep {
        ($($($field:ident).+),+ $(,)?) => {$(
            if !crate::util::same_value(&old.$($field).+, &new.$($field).+) {
                tracing::warn!(
                    "reload: `{}` changed ({} -> {}): needs restart; keeping {}",
                    stringify!($($field).+).replace(' ', ""),
                    as_written(&old.$($field).+),
                    as_written(&new.$($field).+),
                    as_written(&old.$($field).+)
                );
                new.$($field).+ = old.$($field).+.clone();
            }
        )+};
    }
    keep!(
        server.workers,
        server.processes,
        server.pid_file,
        server.user,
        server.group,
        cache.enabled,
        cache.memory,
        cache.max_memory_object,
        cache.dir,
        cache.disk,
        cache.open_files,
        cache.levels,
        cache.gc,
        cache.watermarks,
        cache.fsync,
        cache.file_io,
        server.max_requests,
        server.queue_size,
        server.blocking_threads,
        server.blocking_queue,
        keepalive.max_connections,
        keepalive.timeout,
        keepalive.park_after,
        log.error,
        log.level,
        limits.client_table,
        tls,
    );
}

/// A setting's value as the config file writes it (`"16MiB"`, `[2, 16]`),
/// for operators: its Rust form (`Size(16777216)`) is not what they wrote.
fn as_written<T: serde::Serialize>(value: &T) -> String {
    match toml::Value::try_from(value) {
        Ok(v) => v.to_string(),
        // Only an absent optional setting has no TOML value.
        Err(_) => "(not set)".to_string(),
    }
}

/// Connection settings from the config, with the process's keep-alive subsystem.
pub fn conn_settings(c: &Config, keepalive: Arc<crate::keepalive::KeepAlive>) -> ConnSettings {
    ConnSettings {
        limits: HeadLimits {
            max_request_line: c.limits.max_request_line.as_usize(),
            max_head: c.limits.max_header_size.as_usize(),
            max_headers: c.limits.max_headers,
        },
        header_timeout: c.limits.header_timeout.get(),
        keepalive,
        max_requests: c.keepalive.max_requests,
        max_body: c.limits.max_body_size.bytes(),
        body_idle_timeout: c.origin.idle_timeout.get(),
        send_timeout: c.limits.send_timeout.get(),
        // The listener's own `h2` replaces this (`serving`).
        h2: None,
    }
}
