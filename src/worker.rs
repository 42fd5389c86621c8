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

/// Records this process's worker index (once, at start).
pub(crate) fn set_index(i: usize) {
    let _ = WORKER.set(i);
}
