//! Where `portico run` reads its configuration: the file named by `-c`, or,
//! in a worker process, what its supervisor validated.
//!
//! With `server.processes = N > 1` every worker is a fresh process (exec,
//! not fork) and reads its configuration itself. Were that the file, a
//! worker restarted after the file was edited but not reloaded would run
//! the edit (or fail to start on an invalid one, and be restarted forever)
//! while the others ran the version in force, and a SIGHUP would let each
//! worker read whatever the file held when it got there, not what the
//! supervisor checked. So the supervisor hands its workers the text it
//! validated (`handover`), as nginx's workers get the master's
//! configuration by being forked from it:
//!
//! - At start, a sealed memory file the worker inherits ([`ENV_FD`]), with
//!   the text the supervisor itself started on beside it after a reload
//!   ([`ENV_START_FD`]): a worker restarted then keeps the restart-only
//!   settings the others kept (`reload::keep_restart_only`).
//! - At a reload, a sealed memory file sent on the worker's channel
//!   ([`ENV_CHANNEL`]) before the SIGHUP, with a socket for each listener
//!   it adds ([`take_listeners`]). A SIGHUP with nothing sent (from
//!   anyone else) reloads the text in force.
//!
//! The configuration's text is never read from a file in a worker (unless
//! the supervisor could make no memory file, when it reads the file named
//! as before): a worker starts as root when the supervisor switches it to
//! `server.user`, and that user must not be able to choose what a worker
//! runs. Errors still name the file the text came from. (Files the
//! configuration names, certificates and lists, are read as they are.)

use super::{Config, ConfigError, parse_str};
use crate::handover::Channel;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// Names, in a worker, the inherited memory file holding the text its
/// supervisor validated last.
pub const ENV_FD: &str = "PORTICO_CONFIG_FD";

/// Names, in a worker, the inherited memory file holding the text its
/// supervisor started on (absent when that is the text validated last).
pub const ENV_START_FD: &str = "PORTICO_CONFIG_START_FD";

/// Names, in a worker, its end of the channel on which its supervisor
/// sends the text each reload validated.
pub const ENV_CHANNEL: &str = "PORTICO_CONFIG_CHANNEL";

/// In a worker handed its config: its channel, the text in force, the
/// text sent last while it is not applied yet, and the listener sockets
/// sent with it (`listen::reserve`) that no reload has used yet.
struct Handed {
    channel: Option<Channel>,
    text: Mutex<String>,
    sent: Mutex<Option<String>>,
    listeners: Mutex<Vec<(std::net::SocketAddr, std::os::fd::OwnedFd)>>,
}

static HANDED: OnceLock<Handed> = OnceLock::new();

/// Reads and checks the config file at `path`, with its text (what a
/// supervisor validates and hands its workers).
pub fn read_file(path: &Path) -> Result<(Config, String), ConfigError> {
    let text = super::load::read_text(path)?;
    Ok((parse_str(&text, &path.display().to_string())?, text))
}

/// Reads and checks the configuration `portico run` starts on: in a worker
/// (`worker`) started with its supervisor's memory files, the text they
/// hold, with the restart-only settings the supervisor started on; else
/// the file at `path`. Returns it with its text. Errors name `path`; one
/// about what the supervisor handed names the variable that named it.
pub fn read_at_start(path: &Path, worker: bool) -> Result<(Config, String), ConfigError> {
    let file = path.display().to_string();
    let Some(text) = worker.then(|| handed_text(ENV_FD, &file)).flatten() else {
        return read_file(path);
    };
    let text = text?;
    let mut config = parse_str(&text, &file)?;
    if let Some(start) = handed_text(ENV_START_FD, &file) {
        let start = parse_str(&start?, &file)?;
        crate::reload::keep_restart_only(&start, &mut config);
    }
    let channel = match Channel::take(ENV_CHANNEL) {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => return Err(unreadable(&file, e)),
        None => None,
    };
    let _ = HANDED.set(Handed {
        channel,
        text: Mutex::new(text.clone()),
        sent: Mutex::new(None),
        listeners: Mutex::new(Vec::new()),
    });
    Ok((config, text))
}

/// Reads and checks the configuration a SIGHUP reloads: in a worker handed
/// its config, the text its supervisor sent last (or, if it sent none, the
/// text in force: a SIGHUP from anyone else changes nothing); else the
/// file at `path`. Errors name `path`. A worker that applied it says so
/// ([`applied`]).
pub fn read_for_reload(path: &Path) -> Result<Config, ConfigError> {
    let file = path.display().to_string();
    let Some(handed) = HANDED.get() else {
        return super::load_file(path);
    };
    let received = match &handed.channel {
        Some(channel) => channel
            .latest()
            .map_err(|e| unreadable(&file, format!("from the supervisor: {}", crate::util::io_cause(&e))))?,
        None => Default::default(),
    };
    let mut listeners = handed.listeners.lock().unwrap_or_else(|p| p.into_inner());
    for (addr, fd) in received.listeners {
        listeners.retain(|(a, _)| *a != addr);
        listeners.push((addr, fd));
    }
    drop(listeners);
    let mut sent = handed.sent.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(bytes) = received.config {
        *sent = Some(String::from_utf8(bytes).map_err(|_| unreadable(&file, "from the supervisor: not UTF-8".into()))?);
    }
    match sent.as_deref() {
        Some(text) => parse_str(text, &file),
        None => parse_str(&handed.text.lock().unwrap_or_else(|p| p.into_inner()), &file),
    }
}

/// After a reload applied what [`read_for_reload`] read: that text is in
/// force. (One that failed leaves the text the supervisor sent pending,
/// tried again at the next SIGHUP.)
pub fn applied() {
    if let Some(handed) = HANDED.get() {
        if let Some(text) = handed.sent.lock().unwrap_or_else(|p| p.into_inner()).take() {
            *handed.text.lock().unwrap_or_else(|p| p.into_inner()) = text;
        }
        // Sockets it did not use are for listeners it does not have.
        handed.listeners.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// In a worker handed its config: the sockets its supervisor sent for the
/// listeners at `addrs` (bound, not listening: `listen::reserve`), in
/// order, all taken, or an error naming one it did not send (none taken).
/// None in a process that binds its own.
pub fn take_listeners(addrs: &[std::net::SocketAddr]) -> Option<Result<Vec<socket2::Socket>, String>> {
    let handed = HANDED.get().filter(|h| h.channel.is_some())?;
    let mut listeners = handed.listeners.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(missing) = addrs.iter().find(|a| !listeners.iter().any(|(l, _)| l == *a)) {
        return Some(Err(format!(
            "no socket for listener {missing} from the supervisor (it sends one with the reload that adds a \
             listener; one this worker could not serve then is not sent again)"
        )));
    }
    Some(Ok(addrs
        .iter()
        .filter_map(|a| {
            let i = listeners.iter().position(|(l, _)| l == a)?;
            Some(socket2::Socket::from(listeners.swap_remove(i).1))
        })
        .collect()))
}

/// In a worker handed its config: tells the supervisor how the reload it
/// asked for went (`Err`: why it was not applied), on the channel. A
/// process on its own, or a worker with no channel, has no one to tell.
pub fn report(outcome: Result<(), &str>) {
    let text = match outcome {
        Ok(()) => APPLIED.to_string(),
        Err(e) => format!("{FAILED}{e}"),
    };
    tell_supervisor(&text, "how the reload went");
}

/// In a worker handed its config: tells the supervisor it serves (its
/// listeners are open, it runs as `server.user`), so that it may replace
/// the next worker that could not apply a reload.
pub fn report_serving() {
    tell_supervisor(SERVING, "that it serves");
}

/// What [`report_serving`] says.
pub const SERVING: &str = "serving";
/// What [`report`] says of a reload applied.
pub const APPLIED: &str = "applied";
/// How [`report`] starts a reload's failure, followed by why.
pub const FAILED: &str = "failed: ";

fn tell_supervisor(text: &str, what: &str) {
    let Some(channel) = HANDED.get().and_then(|h| h.channel.as_ref()) else {
        return;
    };
    if let Err(e) = channel.report(text.as_bytes()) {
        tracing::warn!("cannot tell the supervisor {what}: {}", crate::util::io_cause(&e));
    }
}

/// The text of the sealed memory file named by `var`, if set.
fn handed_text(var: &'static str, file: &str) -> Option<Result<String, ConfigError>> {
    let bytes = crate::handover::take_sealed(var)?;
    Some(
        bytes
            .and_then(|b| String::from_utf8(b).map_err(|_| format!("{var}: not UTF-8")))
            .map_err(|e| unreadable(file, e)),
    )
}

fn unreadable(file: &str, what: String) -> ConfigError {
    ConfigError {
        file: file.to_string(),
        line: None,
        key: None,
        message: format!("cannot read what the supervisor handed: {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_anything_handed_the_file_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("portico.toml");
        std::fs::write(&file, "[server]\nworkers = 3\n").expect("write");
        // No variable set (a worker's environment is its supervisor's
        // doing, never this test's): a worker reads the file too.
        for worker in [true, false] {
            let (c, text) = read_at_start(&file, worker).expect("read");
            assert_eq!((c.server.workers, text.as_str()), (3, "[server]\nworkers = 3\n"));
        }
        std::fs::write(&file, "[server]\nworkers = 4\n").expect("write");
        assert_eq!(read_for_reload(&file).expect("read").server.workers, 4);
    }
}
