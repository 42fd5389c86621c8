//! Logs: the error log (tracing, with a level) and the access log.
//!
//! Both can be reopened after log rotation (SIGUSR1, as nginx's
//! `kill -USR1` and Squid's `squid -k rotate`): the error log's file sits
//! behind a lock that [`reopen_error_log`] swaps for a freshly opened file,
//! so lines written after the swap go to the new file and none is lost.

mod access;

pub use access::{AccessLog, AccessRecord, DEFAULT_QUEUE, check_format};

use crate::config::LogConfig;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The error log's file, when `log.error` names one: the path it is
/// reopened from, and the file the tracing writer writes to.
struct ErrorFile {
    path: PathBuf,
    file: Mutex<File>,
    /// The file did not exist before this process opened it (its owner
    /// may then be fixed before privileges are dropped, `privdrop`).
    created: bool,
}

static ERROR_FILE: OnceLock<ErrorFile> = OnceLock::new();

/// The tracing writer of a file error log: each line (tracing formats an
/// event, then writes it in one call) goes to the file current at the time.
struct ErrorWriter;

impl Write for ErrorWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match ERROR_FILE.get() {
            Some(e) => e.file.lock().unwrap_or_else(|p| p.into_inner()).write(buf),
            None => Ok(buf.len()),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match ERROR_FILE.get() {
            // Under one lock, so lines of two threads never interleave.
            Some(e) => e.file.lock().unwrap_or_else(|p| p.into_inner()).write_all(buf),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Opens a log file for appending (created if missing) without following
/// a symbolic link at its last component (see [`no_follow`]).
pub(crate) fn open_append(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(no_follow(path))
        .open(path)
}

/// `O_NOFOLLOW` for a file Portico writes (a log, the pid file), except
/// under `/dev/` and `/proc/` (`/dev/stdout` is a link, and nobody but
/// root makes links there). Portico opens these as root when started as
/// root, in directories the service user can write to (its log and run
/// directories): a link that user put in a log's place would make root
/// append to, or truncate, whatever it points at (`/root/.bashrc`).
/// Refused instead, with "Too many levels of symbolic links" (ELOOP).
pub(crate) fn no_follow(path: &Path) -> i32 {
    if path.starts_with("/dev") || path.starts_with("/proc") {
        0
    } else {
        libc::O_NOFOLLOW
    }
}

/// Installs the error log: standard error, or the file `log.error`.
pub fn init_error_log(cfg: &LogConfig) -> Result<(), String> {
    let level = crate::config::tracing_level(&cfg.level).unwrap_or(tracing::Level::INFO);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(error_log_filter(level))
        .with_target(false)
        .fmt_fields(WorkerTagged::default());
    let result = if cfg.error.as_os_str().is_empty() {
        use std::io::IsTerminal;
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .try_init()
    } else {
        let created = std::fs::symlink_metadata(&cfg.error).is_err();
        let file = open_append(&cfg.error).map_err(|e| {
            format!(
                "cannot open error log {}: {}",
                cfg.error.display(),
                crate::util::io_cause(&e)
            )
        })?;
        if ERROR_FILE
            .set(ErrorFile {
                path: cfg.error.clone(),
                file: Mutex::new(file),
                created,
            })
            .is_err()
        {
            return Err("the error log is already installed".to_string());
        }
        builder.with_ansi(false).with_writer(|| ErrorWriter).try_init()
    };
    result.map_err(|e| format!("cannot install the error log: {e}"))
}

/// What the error log lets through at `level`: everything at that level or
/// above, except rustls's own log lines, which stay at error unless the
/// level is debug or trace. rustls warns about each peer that breaks a
/// rule (a client sending an IP address as its SNI name, as wrk and some
/// libraries do, an unexpected alert): one line per connection that any
/// client can make the server write, and a write per handshake. Portico
/// counts its failed handshakes by reason itself
/// (`portico_tls_handshake_failures_total`);
/// the detail is there at debug level for whoever chases one.
fn error_log_filter(level: tracing::Level) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::filter::{Directive, LevelFilter};
    let rustls = if level >= tracing::Level::DEBUG {
        LevelFilter::from_level(level)
    } else {
        LevelFilter::ERROR
    };
    let mut f = tracing_subscriber::EnvFilter::default().add_directive(LevelFilter::from_level(level).into());
    if let Ok(d) = format!("rustls={rustls}").parse::<Directive>() {
        f = f.add_directive(d);
    }
    f
}

/// The error log's field formatter: tracing's own, after `worker I: ` in a
/// worker process (`crate::worker`), so that the lines the workers write to
/// their shared log say whose they are. Set once here for every line, on
/// every thread (runtime, blocking pool, access-log writer, keep-alive
/// poller), where a tracing span would have to be entered on each thread
/// and would print as `worker{index=0}:`.
#[derive(Default)]
struct WorkerTagged(tracing_subscriber::fmt::format::DefaultFields);

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for WorkerTagged {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        if let Some(i) = crate::worker::index() {
            write!(writer, "worker {i}: ")?;
        }
        self.0.format_fields(writer, fields)
    }
}

/// SIGUSR1: reopens the error log file by its path (rotation renamed the
/// old one, which keeps every line written before). Ok(None) when the
/// error log is standard error; on failure the old file stays in use.
pub fn reopen_error_log() -> Result<Option<&'static Path>, String> {
    let Some(e) = ERROR_FILE.get() else {
        return Ok(None);
    };
    let new = open_append(&e.path).map_err(|err| {
        format!(
            "cannot reopen error log {}: {}; still writing to the old file",
            e.path.display(),
            crate::util::io_cause(&err)
        )
    })?;
    // A writer that panicked mid-line poisoned the lock; the file is still
    // a file, so take it over rather than lose the log.
    let mut file = e.file.lock().unwrap_or_else(|p| p.into_inner());
    *file = new;
    Ok(Some(&e.path))
}

/// The error log file if this process created it at start-up (so its owner
/// is Portico's to set), else None.
pub fn created_error_log() -> Option<&'static Path> {
    ERROR_FILE.get().filter(|e| e.created).map(|e| e.path.as_path())
}

/// Reopens the error log and logs one line saying what SIGUSR1 reopens
/// (the caller then reopens its access log, whose writer thread confirms).
pub fn reopen_logs_line() {
    match reopen_error_log() {
        Ok(Some(path)) => tracing::info!(
            "SIGUSR1: reopened the error log {} and reopening the access log",
            path.display()
        ),
        Ok(None) => tracing::info!("SIGUSR1: reopening the access log (the error log is standard error)"),
        Err(e) => tracing::error!("SIGUSR1: {e}; reopening the access log"),
    }
}
