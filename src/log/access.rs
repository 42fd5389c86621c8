//! The access log: one line per request in NCSA Common or Combined format.
//! Lines are formatted on the request's task and written by a dedicated
//! thread through a buffer, so a slow disk never stalls a request.

use crate::config::LogFormat;
use std::io::Write;
use std::net::IpAddr;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

/// What the access log records about one request.
pub struct AccessRecord<'a> {
    /// Client address.
    pub client: IpAddr,
    /// Authenticated user, if any.
    pub user: Option<&'a str>,
    /// The request line (`GET http://x/ HTTP/1.1`).
    pub request_line: &'a str,
    /// Status sent.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// `Referer` header.
    pub referer: Option<&'a str>,
    /// `User-Agent` header.
    pub user_agent: Option<&'a str>,
}

/// Handle to the access log writer thread; cheap to share.
pub struct AccessLog {
    tx: Option<mpsc::SyncSender<String>>,
    format: LogFormat,
}

/// Lines queued beyond this are dropped (and counted in the error log)
/// rather than letting memory grow when the disk cannot keep up.
const QUEUE: usize = 65536;

impl AccessLog {
    /// Opens (appends to) `path`; an empty path disables the log.
    pub fn open(path: &Path, format: LogFormat) -> Result<AccessLog, String> {
        if path.as_os_str().is_empty() {
            return Ok(AccessLog { tx: None, format });
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open access log {}: {e}", path.display()))?;
        let (tx, rx) = mpsc::sync_channel::<String>(QUEUE);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(file, rx))
            .map_err(|e| format!("cannot start the access log thread: {e}"))?;
        Ok(AccessLog { tx: Some(tx), format })
    }

    /// Records one request.
    pub fn record(&self, r: &AccessRecord<'_>) {
        let Some(tx) = &self.tx else { return };
        let line = format_line(self.format, r, SystemTime::now());
        if let Err(mpsc::TrySendError::Full(_)) = tx.try_send(line) {
            tracing::warn!("access log queue full: a line was dropped");
        }
    }
}

fn writer(file: std::fs::File, rx: mpsc::Receiver<String>) {
    let mut out = std::io::BufWriter::with_capacity(64 << 10, file);
    let write = |out: &mut std::io::BufWriter<std::fs::File>, line: String| {
        if let Err(e) = out.write_all(line.as_bytes()) {
            tracing::error!("access log write failed: {e}");
        }
    };
    loop {
        let line = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        write(&mut out, line);
        // Write whatever else is queued, then flush once the queue runs dry,
        // so the file is current without a write per line under load.
        loop {
            match rx.try_recv() {
                Ok(line) => write(&mut out, line),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    let _ = out.flush();
                    return;
                }
            }
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

/// `[10/Oct/2000:13:55:36 +0000]` style timestamp (UTC).
fn clf_time(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    let fmt = time::macros::format_description!("[day]/[month repr:short]/[year]:[hour]:[minute]:[second] +0000");
    dt.format(&fmt).unwrap_or_else(|_| "01/Jan/1970:00:00:00 +0000".into())
}

/// Quotes a header value for the log: `"` and `\` escaped, control bytes as \xHH.
fn quoted(v: Option<&str>) -> String {
    let Some(v) = v else { return "\"-\"".into() };
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if c.is_control() => s.push_str(&format!("\\x{:02x}", c as u32)),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn format_line(format: LogFormat, r: &AccessRecord<'_>, now: SystemTime) -> String {
    let bytes = if r.bytes == 0 {
        "-".to_string()
    } else {
        r.bytes.to_string()
    };
    let user = r.user.filter(|u| !u.is_empty()).unwrap_or("-");
    let mut line = format!(
        "{} - {} [{}] {} {} {}",
        r.client,
        user,
        clf_time(now),
        quoted(Some(r.request_line)),
        r.status,
        bytes
    );
    if format == LogFormat::Combined {
        line.push(' ');
        line.push_str(&quoted(r.referer));
        line.push(' ');
        line.push_str(&quoted(r.user_agent));
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queued_line_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::open(&path, LogFormat::Common).unwrap();
        let r = AccessRecord {
            client: "127.0.0.1".parse().unwrap(),
            user: None,
            request_line: "GET / HTTP/1.1",
            status: 200,
            bytes: 1,
            referer: None,
            user_agent: None,
        };
        for _ in 0..1000 {
            log.record(&r);
        }
        let mut lines = 0;
        for _ in 0..100 {
            lines = std::fs::read_to_string(&path).unwrap_or_default().lines().count();
            if lines == 1000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(lines, 1000);
    }

    #[test]
    fn combined_line() {
        let r = AccessRecord {
            client: "127.0.0.1".parse().unwrap(),
            user: None,
            request_line: "GET http://h/ HTTP/1.1",
            status: 200,
            bytes: 1234,
            referer: None,
            user_agent: Some("curl/8 \"x\""),
        };
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(971_185_336);
        assert_eq!(
            format_line(LogFormat::Combined, &r, t),
            "127.0.0.1 - - [10/Oct/2000:13:42:16 +0000] \"GET http://h/ HTTP/1.1\" 200 1234 \"-\" \"curl/8 \\\"x\\\"\"\n"
        );
        let common = format_line(LogFormat::Common, &AccessRecord { bytes: 0, ..r }, t);
        assert!(common.ends_with("\" 200 -\n"), "{common}");
    }
}
