//! Which worker this process is, in multi-process mode
//! (`server.processes = N > 1`): set once at start from `--worker I`, read
//! by the statistics (each worker counts its own traffic and the views sum
//! them, `stats::workers`), systemd notification and the error log, which
//! tags every line a worker writes (`log::init_error_log`).

use std::sync::OnceLock;

static WORKER: OnceLock<usize> = OnceLock::new();

/// This process's worker index (0..N-1) in multi-process mode; None in a
/// single-process server or the supervisor.
pub fn index() -> Option<usize> {
    WORKER.get().copied()
}

/// Names, in a worker, the pid of the supervisor that started it.
pub const ENV_SUPERVISOR: &str = "PORTICO_SUPERVISOR";

/// Records this process's worker index (once, at start).
pub(crate) fn set_index(i: usize) {
    let _ = WORKER.set(i);
}

/// True in a worker whose supervisor has exited (killed outright: the
/// worker was re-parented and got SIGTERM), so that nobody else will clean
/// up what the two shared. The supervisor names itself ([`ENV_SUPERVISOR`]):
/// one that died before the worker looked is not taken for its new parent.
pub(crate) fn supervisor_gone() -> bool {
    static SUPERVISOR: OnceLock<Option<u32>> = OnceLock::new();
    SUPERVISOR
        .get_or_init(|| std::env::var(ENV_SUPERVISOR).ok().and_then(|p| p.parse().ok()))
        .is_some_and(|pid| std::os::unix::process::parent_id() != pid)
}
