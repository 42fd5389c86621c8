//! Logs: the error log (tracing, with a level) and the access log.

mod access;

pub use access::{AccessLog, AccessRecord, DEFAULT_QUEUE, check_format};

use crate::config::LogConfig;

/// Installs the error log: standard error, or the file `log.error`.
pub fn init_error_log(cfg: &LogConfig) -> Result<(), String> {
    let level = crate::config::tracing_level(&cfg.level).unwrap_or(tracing::Level::INFO);
    let builder = tracing_subscriber::fmt().with_max_level(level).with_target(false);
    let result = if cfg.error.as_os_str().is_empty() {
        use std::io::IsTerminal;
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .try_init()
    } else {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&cfg.error)
            .map_err(|e| format!("cannot open error log {}: {e}", cfg.error.display()))?;
        builder
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file))
            .try_init()
    };
    result.map_err(|e| format!("cannot install the error log: {e}"))
}
