//! The access log: one line per request in NCSA Common or Combined format,
//! Squid's native format, or a custom format string. Lines are formatted
//! on the request's task and handed to a dedicated writer thread through a
//! bounded queue: a request never waits for the disk; when the queue is
//! full the line is dropped and counted. SIGUSR1 asks the writer to reopen
//! the file (after log rotation renamed it).

use crate::config::LogFormat;
use http::HeaderMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Time from the request head to now.
    pub elapsed: Duration,
    /// What the cache did (HIT, MISS, STALE, STALE_ON_ERROR, REVALIDATED), or why nothing
    /// was looked up: DENIED (a refusal: `[access] allow`, an `[[acl]]` or
    /// rule deny, a 407), NONE (an answer made before any lookup: busy 503,
    /// malformed request 400, 408, 413, 414, 431, forwarding loop 508, ...),
    /// REDIRECT (a rule's redirect); None when unknown.
    pub cache: Option<&'static str>,
    /// Where the response came from (`HIER_DIRECT/host`, `FIRST_PARENT/host`,
    /// ...; the Squid format's hierarchy field); None: answered here.
    pub hierarchy: Option<&'a str>,
    /// The request's header fields, for `%{Name}i` in custom formats.
    pub headers: Option<&'a HeaderMap>,
    /// The request came over TLS: the Squid format's URL of a path-only
    /// target is `https://`.
    pub tls: bool,
}

/// Writer counters, shared with the statistics.
#[derive(Default)]
struct Counters {
    lines: AtomicU64,
    dropped: AtomicU64,
    queued: AtomicU64,
    reopen: AtomicBool,
    client_lookups: AtomicU64,
    client_hits: AtomicU64,
    client_entries: AtomicU64,
}

/// One piece of a custom format.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Text(String),
    Client,
    User,
    Time,
    RequestLine,
    Status,
    BytesClf,
    Bytes,
    Micros,
    Millis,
    Seconds,
    Method,
    Target,
    Protocol,
    Cache,
    Header(String),
}

/// Handle to the access log writer thread; cheap to share.
pub struct AccessLog {
    tx: Option<mpsc::SyncSender<String>>,
    resolve: bool,
    format: LogFormat,
    custom: Vec<Token>,
    counters: Arc<Counters>,
    /// Length of the writer's queue.
    queue_limit: u64,
}

/// Default length of the writer's queue (`log.access_queue`): lines queued
/// beyond it are dropped (and counted) rather than letting memory grow, or a
/// request wait, when the disk cannot keep up.
pub const DEFAULT_QUEUE: usize = 65536;

/// Parses a custom format (`%h %l %u %t "%r" %>s %b %D %C %{Name}i`...).
fn parse_format(f: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = f.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'>') {
            chars.next();
        }
        let Some(d) = chars.next() else {
            return Err("format ends with a lone %".into());
        };
        let tok = match d {
            '%' => {
                text.push('%');
                continue;
            }
            'h' | 'a' => Token::Client,
            'l' => Token::Text("-".into()),
            'u' => Token::User,
            't' => Token::Time,
            'r' => Token::RequestLine,
            's' => Token::Status,
            'b' => Token::BytesClf,
            'B' => Token::Bytes,
            'D' => Token::Micros,
            'M' => Token::Millis,
            'T' => Token::Seconds,
            'm' => Token::Method,
            'U' => Token::Target,
            'H' => Token::Protocol,
            'C' => Token::Cache,
            '{' => {
                let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
                match chars.next() {
                    Some('i') if !name.is_empty() => Token::Header(name.to_ascii_lowercase()),
                    _ => return Err(format!("%{{{name}}} must be followed by i (a request header)")),
                }
            }
            other => return Err(format!("unknown format directive %{other}")),
        };
        if !text.is_empty() {
            out.push(Token::Text(std::mem::take(&mut text)));
        }
        out.push(tok);
    }
    if !text.is_empty() {
        out.push(Token::Text(text));
    }
    Ok(out)
}

/// Checks a custom format string (for config validation).
pub fn check_format(f: &str) -> Result<(), String> {
    parse_format(f).map(|_| ())
}

impl AccessLog {
    /// Opens (appends to) `path`; an empty path disables the log. With
    /// `resolve_clients`, the writer thread replaces client addresses by
    /// their names (reverse DNS, cached), off the request path.
    pub fn open(
        path: &Path,
        format: LogFormat,
        custom_format: &str,
        resolve_clients: bool,
        queue: usize,
    ) -> Result<AccessLog, String> {
        let custom = if format == LogFormat::Custom {
            parse_format(custom_format).map_err(|e| format!("log.custom_format: {e}"))?
        } else {
            Vec::new()
        };
        let counters = Arc::new(Counters::default());
        if path.as_os_str().is_empty() {
            return Ok(AccessLog {
                tx: None,
                resolve: false,
                format,
                custom,
                counters,
                queue_limit: 0,
            });
        }
        let file = super::open_append(path).map_err(|e| format!("cannot open access log {}: {e}", path.display()))?;
        let (tx, rx) = mpsc::sync_channel::<String>(queue.max(1));
        let c = counters.clone();
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(file, path, rx, c))
            .map_err(|e| format!("cannot start the access log thread: {e}"))?;
        Ok(AccessLog {
            tx: Some(tx),
            resolve: resolve_clients,
            format,
            custom,
            counters,
            queue_limit: queue.max(1) as u64,
        })
    }

    /// Whether lines are being written (`log.access` is not empty): when
    /// they are not, the caller need not gather a record at all.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Records one request; never waits (a full queue drops the line and counts it).
    pub fn record(&self, r: &AccessRecord<'_>) {
        let Some(tx) = &self.tx else { return };
        // A client to resolve is marked for the writer thread, which
        // replaces it by its name (never the request's task: DNS can be slow).
        let client = if self.resolve {
            format!("{MARK}{}{MARK}", r.client)
        } else {
            crate::util::ip_text(r.client)
        };
        let line = format_line(self.format, &self.custom, r, &client, SystemTime::now());
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        if tx.try_send(line).is_err() {
            self.counters.queued.fetch_sub(1, Ordering::Relaxed);
            if self
                .counters
                .dropped
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(1000)
            {
                tracing::warn!("access log queue full: lines are being dropped");
            }
        }
    }

    /// Asks the writer to reopen the file (SIGUSR1, after rotation).
    pub fn reopen(&self) {
        self.counters.reopen.store(true, Ordering::Relaxed);
    }

    /// The writer's counters.
    pub fn info(&self) -> crate::stats::AccessLogInfo {
        let c = &self.counters;
        crate::stats::AccessLogInfo {
            resolve_clients: self.resolve,
            client_dns_entries: c.client_entries.load(Ordering::Relaxed),
            client_dns_max_entries: CLIENT_CACHE as u64,
            client_dns_lookups: c.client_lookups.load(Ordering::Relaxed),
            client_dns_hits: c.client_hits.load(Ordering::Relaxed),
            enabled: self.tx.is_some(),
            format: format!("{:?}", self.format).to_lowercase(),
            lines: c.lines.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            queued: c.queued.load(Ordering::Relaxed),
            queue_limit: self.queue_limit,
        }
    }
}

/// Marks a client address the writer is to resolve.
const MARK: char = '\u{1}';
/// Client names kept (the Sun Java System Web Proxy Server 4's ClientDNSCacheInfo default).
const CLIENT_CACHE: usize = 1024;
/// How long a client name is kept (reverse lookups carry no TTL here).
const CLIENT_TTL: Duration = Duration::from_secs(300);

/// The writer thread's client-name cache.
struct ClientNames {
    map: std::collections::HashMap<IpAddr, (String, std::time::Instant)>,
}

impl ClientNames {
    /// `line` with its marked address replaced by the client's name (or the address).
    fn resolve(&mut self, line: String, c: &Counters) -> String {
        let Some(start) = line.find(MARK) else { return line };
        let Some(len) = line[start + 1..].find(MARK) else {
            return line;
        };
        let addr = &line[start + 1..start + 1 + len];
        let name = match addr.parse::<IpAddr>() {
            Ok(ip) => {
                c.client_lookups.fetch_add(1, Ordering::Relaxed);
                let now = std::time::Instant::now();
                match self.map.get(&ip) {
                    Some((name, until)) if *until > now => {
                        c.client_hits.fetch_add(1, Ordering::Relaxed);
                        name.clone()
                    }
                    _ => {
                        let name = reverse_dns(ip).unwrap_or_else(|| addr.to_string());
                        if self.map.len() >= CLIENT_CACHE {
                            self.map.retain(|_, (_, u)| *u > now);
                            if self.map.len() >= CLIENT_CACHE {
                                self.map.clear();
                            }
                        }
                        self.map.insert(ip, (name.clone(), now + CLIENT_TTL));
                        c.client_entries.store(self.map.len() as u64, Ordering::Relaxed);
                        name
                    }
                }
            }
            Err(_) => addr.to_string(),
        };
        format!("{}{name}{}", &line[..start], &line[start + len + 2..])
    }
}

/// The name of `ip` by reverse lookup (getnameinfo: hosts file and DNS), if any.
fn reverse_dns(ip: IpAddr) -> Option<String> {
    let sa = socket2::SockAddr::from(std::net::SocketAddr::new(ip, 0));
    let mut host = [0 as libc::c_char; 1025];
    // SAFETY: `sa` is a valid socket address of the length given; `host` is
    // a writable buffer of the length given; no service buffer is asked for.
    let rc = unsafe {
        libc::getnameinfo(
            sa.as_ptr().cast(),
            sa.len(),
            host.as_mut_ptr(),
            host.len() as libc::socklen_t,
            std::ptr::null_mut(),
            0,
            libc::NI_NAMEREQD,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: on success getnameinfo wrote a NUL-terminated string into `host`.
    let name = unsafe { std::ffi::CStr::from_ptr(host.as_ptr()) };
    name.to_str()
        .ok()
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic()))
        .map(String::from)
}

fn writer(file: std::fs::File, path: PathBuf, rx: mpsc::Receiver<String>, c: Arc<Counters>) {
    let mut out = std::io::BufWriter::with_capacity(64 << 10, file);
    let mut names = ClientNames {
        map: std::collections::HashMap::new(),
    };
    let mut write = |out: &mut std::io::BufWriter<std::fs::File>, line: String| {
        c.queued.fetch_sub(1, Ordering::Relaxed);
        let line = names.resolve(line, &c);
        match out.write_all(line.as_bytes()) {
            Ok(()) => {
                c.lines.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::error!("access log write failed: {}", crate::util::io_cause(&e)),
        }
    };
    loop {
        if c.reopen.swap(false, Ordering::Relaxed) {
            let _ = out.flush();
            match super::open_append(&path) {
                Ok(f) => {
                    out = std::io::BufWriter::with_capacity(64 << 10, f);
                    tracing::info!("access log reopened: {}", path.display());
                }
                Err(e) => tracing::error!(
                    "cannot reopen access log {}: {}",
                    path.display(),
                    crate::util::io_cause(&e)
                ),
            }
        }
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
/// Appends the Common Log Format date of `t` (`10/Oct/2000:13:42:16 +0000`).
fn push_clf_time(out: &mut String, t: SystemTime) {
    // Formatting a date costs more than the rest of a line: reuse this
    // thread's text for the same second.
    thread_local! {
        static LAST: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != secs {
            let dt = time::OffsetDateTime::from(t);
            let fmt =
                time::macros::format_description!("[day]/[month repr:short]/[year]:[hour]:[minute]:[second] +0000");
            *last = (
                secs,
                dt.format(&fmt).unwrap_or_else(|_| "01/Jan/1970:00:00:00 +0000".into()),
            );
        }
        out.push_str(&last.1);
    })
}

/// Appends a header value quoted for the log: `"` and `\` escaped, control
/// bytes as \xHH; `"-"` for none.
fn push_quoted(out: &mut String, v: Option<&str>) {
    let Some(v) = v else {
        out.push_str("\"-\"");
        return;
    };
    out.push('"');
    push_escaped(out, v);
    out.push('"');
}

/// `v` with `"` and `\` escaped and control characters as \xHH.
fn escaped(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    push_escaped(&mut s, v);
    s
}

/// True for a character that ends a line for some reader: the controls,
/// and Unicode's line and paragraph separators (Python's `splitlines`,
/// JavaScript).
fn breaks_lines(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

fn push_escaped(out: &mut String, v: &str) {
    // Almost every value needs no escaping: copy it whole.
    if !v.chars().any(|c| c == '"' || c == '\\' || breaks_lines(c)) {
        out.push_str(v);
        return;
    }
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if breaks_lines(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
}

/// A user name as an unquoted log field: the name a client presented is
/// logged even when it was refused, so anything that could end the field
/// or the line (a space, a quote, a bracket, `%`, a control, any
/// non-ASCII character such as U+2028) is percent-encoded byte by byte,
/// as Squid encodes it. Before, `bob - [01/Jan/2030` or a U+2028 in a
/// refused name forged columns and whole lines.
fn user_field(user: &str) -> std::borrow::Cow<'_, str> {
    let safe = |b: u8| b.is_ascii_graphic() && !matches!(b, b'"' | b'%' | b'[' | b']' | b'\\');
    if user.bytes().all(safe) {
        return std::borrow::Cow::Borrowed(user);
    }
    let mut out = String::with_capacity(user.len() * 3);
    for b in user.bytes() {
        if safe(b) {
            out.push(char::from(b));
        } else {
            let _ = std::fmt::Write::write_fmt(&mut out, format_args!("%{b:02X}"));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The request line's method, target and protocol.
fn parts(line: &str) -> (&str, &str, &str) {
    let mut it = line.splitn(3, ' ');
    (
        it.next().unwrap_or("-"),
        it.next().unwrap_or("-"),
        it.next().unwrap_or("-"),
    )
}

/// The URL Squid's format logs: the target as sent for a forward-proxy
/// request (`http://h/x`) or CONNECT (`h:443`), and for the path-only
/// target of a reverse or transparent listener (`/x`), the full URL rebuilt
/// from `Host` as Squid logs it (`http://h/x`, `https://h/x` over TLS:
/// `tls`). A `Host` that is not one
/// plain token (spaces, control bytes, a `/`) is not trusted to build a URL
/// from: the path is logged alone rather than a line that splits wrongly.
fn absolute_url<'t>(target: &'t str, headers: Option<&HeaderMap>, tls: bool) -> std::borrow::Cow<'t, str> {
    let host = headers
        .and_then(|h| h.get(http::header::HOST))
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic() && b != b'/'));
    match host {
        Some(host) if target.starts_with('/') => {
            let scheme = if tls { "https" } else { "http" };
            format!("{scheme}://{host}{target}").into()
        }
        _ => target.into(),
    }
}

fn format_line(format: LogFormat, custom: &[Token], r: &AccessRecord<'_>, client: &str, now: SystemTime) -> String {
    let bytes_clf = if r.bytes == 0 {
        "-".to_string()
    } else {
        r.bytes.to_string()
    };
    let user = user_field(r.user.filter(|u| !u.is_empty()).unwrap_or("-"));
    let mut line = match format {
        LogFormat::Common | LogFormat::Combined => {
            let mut line = String::with_capacity(160 + r.request_line.len());
            line.push_str(client);
            line.push_str(" - ");
            line.push_str(&user);
            line.push_str(" [");
            push_clf_time(&mut line, now);
            line.push_str("] ");
            push_quoted(&mut line, Some(r.request_line));
            line.push(' ');
            line.push_str(&r.status.to_string());
            line.push(' ');
            line.push_str(&bytes_clf);
            if format == LogFormat::Combined {
                line.push(' ');
                push_quoted(&mut line, r.referer);
                line.push(' ');
                push_quoted(&mut line, r.user_agent);
            }
            line
        }
        LogFormat::Squid => {
            // time.ms elapsed-ms client result/status bytes method URL user hierarchy type
            let t = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            let (method, target, _) = parts(r.request_line);
            let result = match r.cache {
                // Squid's codes for answers made without a lookup.
                Some("DENIED") => "TCP_DENIED",
                Some("NONE") => "NONE",
                Some("REDIRECT") => "TCP_REDIRECT",
                Some("HIT") => "TCP_HIT",
                Some("COLLAPSED") => "TCP_CF_HIT",
                Some("MISS") => "TCP_MISS",
                Some("STALE") => "TCP_STALE_HIT",
                Some("STALE_ON_ERROR") => "TCP_REFRESH_FAIL_OLD",
                Some("REVALIDATED") => "TCP_REFRESH_UNMODIFIED",
                _ if method == "CONNECT" => "TCP_TUNNEL",
                _ => "TCP_MISS",
            };
            // A hit, or a response made here (an error page, a monitoring
            // page), fetched nothing: Squid's HIER_NONE.
            let hier = match (r.cache, r.hierarchy) {
                (Some("HIT" | "STALE" | "COLLAPSED"), _) | (_, None) => "HIER_NONE/-",
                (_, Some(h)) => h,
            };
            format!(
                "{}.{:03} {:>6} {} {}/{:03} {} {} {} {} {} -",
                t.as_secs(),
                t.subsec_millis(),
                r.elapsed.as_millis(),
                client,
                result,
                r.status,
                r.bytes,
                escaped(method),
                escaped(&absolute_url(target, r.headers, r.tls)),
                user,
                hier
            )
        }
        LogFormat::Custom => {
            let mut s = String::new();
            let (method, target, protocol) = parts(r.request_line);
            for t in custom {
                match t {
                    Token::Text(x) => s.push_str(x),
                    Token::Client => s.push_str(client),
                    Token::User => s.push_str(&user),
                    Token::Time => {
                        s.push('[');
                        push_clf_time(&mut s, now);
                        s.push(']');
                    }
                    Token::RequestLine => s.push_str(&escaped(r.request_line)),
                    Token::Status => s.push_str(&r.status.to_string()),
                    Token::BytesClf => s.push_str(&bytes_clf),
                    Token::Bytes => s.push_str(&r.bytes.to_string()),
                    Token::Micros => s.push_str(&r.elapsed.as_micros().to_string()),
                    Token::Millis => s.push_str(&r.elapsed.as_millis().to_string()),
                    Token::Seconds => s.push_str(&r.elapsed.as_secs().to_string()),
                    Token::Method => s.push_str(&escaped(method)),
                    Token::Target => s.push_str(&escaped(target)),
                    Token::Protocol => s.push_str(&escaped(protocol)),
                    Token::Cache => s.push_str(r.cache.unwrap_or("-")),
                    Token::Header(name) => {
                        let v = r
                            .headers
                            .and_then(|h| h.get(name.as_str()))
                            .and_then(|v| v.to_str().ok());
                        s.push_str(&v.map_or_else(|| "-".to_string(), escaped));
                    }
                }
            }
            s
        }
    };
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(bytes: u64) -> AccessRecord<'static> {
        AccessRecord {
            client: "127.0.0.1".parse().unwrap(),
            user: None,
            request_line: "GET http://h/ HTTP/1.1",
            status: 200,
            bytes,
            referer: None,
            user_agent: Some("curl/8 \"x\""),
            elapsed: Duration::from_micros(1500),
            cache: Some("HIT"),
            hierarchy: None,
            headers: None,
            tls: false,
        }
    }

    fn wait_lines(path: &Path, n: usize) -> usize {
        let mut lines = 0;
        for _ in 0..100 {
            lines = std::fs::read_to_string(path).unwrap_or_default().lines().count();
            if lines == n {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        lines
    }

    #[test]
    fn every_queued_line_is_written_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::open(&path, LogFormat::Common, "", false, DEFAULT_QUEUE).unwrap();
        for _ in 0..1000 {
            log.record(&record(1));
        }
        assert_eq!(wait_lines(&path, 1000), 1000);
        let info = log.info();
        assert_eq!((info.lines, info.dropped, info.queued), (1000, 0, 0));
    }

    #[test]
    fn reopen_after_rename_writes_to_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::open(&path, LogFormat::Common, "", false, DEFAULT_QUEUE).unwrap();
        log.record(&record(1));
        assert_eq!(wait_lines(&path, 1), 1);
        let old = dir.path().join("access.log.1");
        std::fs::rename(&path, &old).unwrap();
        log.reopen();
        std::thread::sleep(Duration::from_millis(400));
        log.record(&record(2));
        assert_eq!(wait_lines(&path, 1), 1);
        assert_eq!(wait_lines(&old, 1), 1);
    }

    #[test]
    fn the_date_follows_the_second_and_control_bytes_are_escaped() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(971_185_336);
        let line = |t: SystemTime| format_line(LogFormat::Common, &[], &record(1), "h", t);
        assert!(line(t).contains("[10/Oct/2000:13:42:16 +0000]"));
        assert!(line(t + Duration::from_millis(999)).contains("[10/Oct/2000:13:42:16 +0000]"));
        assert!(line(t + Duration::from_secs(1)).contains("[10/Oct/2000:13:42:17 +0000]"));
        assert!(line(t).contains("[10/Oct/2000:13:42:16 +0000]"));
        let mut out = String::new();
        push_quoted(&mut out, Some("a\u{7}b\\c"));
        assert_eq!(out, "\"a\\x07b\\\\c\"");
    }

    #[test]
    fn squid_logs_refusals_as_tcp_denied_and_answers_made_before_a_lookup_as_none() {
        let t = SystemTime::UNIX_EPOCH;
        let line = |cache, status| {
            let r = AccessRecord {
                cache,
                status,
                ..record(0)
            };
            format_line(LogFormat::Squid, &[], &r, "127.0.0.1", t)
        };
        assert!(line(Some("DENIED"), 403).contains(" TCP_DENIED/403 "));
        assert!(line(Some("DENIED"), 407).contains(" TCP_DENIED/407 "));
        assert!(line(Some("NONE"), 503).contains(" NONE/503 "));
        assert!(line(Some("REDIRECT"), 302).contains(" TCP_REDIRECT/302 "));
        assert!(line(Some("NONE"), 400).ends_with(" HIER_NONE/- -\n"));
    }

    #[test]
    fn squid_logs_the_full_url_of_a_path_only_target_from_host() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "www.example.com:8000".parse().unwrap());
        assert_eq!(
            absolute_url("/a?b", Some(&headers), false),
            "http://www.example.com:8000/a?b"
        );
        // Over TLS (an HTTPS reverse or transparent listener).
        assert_eq!(
            absolute_url("/a?b", Some(&headers), true),
            "https://www.example.com:8000/a?b"
        );
        // Already absolute (forward proxy) or authority-form (CONNECT): as sent.
        assert_eq!(absolute_url("http://h/x", Some(&headers), true), "http://h/x");
        assert_eq!(absolute_url("h:443", Some(&headers), false), "h:443");
        assert_eq!(absolute_url("/x", None, false), "/x");
    }

    #[test]
    fn a_hostile_host_is_not_used_to_build_the_logged_url() {
        for bad in ["a b", "a/b", "", "a\tb"] {
            let mut headers = HeaderMap::new();
            headers.insert("host", http::HeaderValue::from_str(bad).unwrap());
            assert_eq!(absolute_url("/x", Some(&headers), false), "/x", "{bad:?}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("host", http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
        assert_eq!(absolute_url("/x", Some(&headers), false), "/x");
    }

    #[test]
    fn combined_common_squid_and_custom_lines() {
        let r = record(1234);
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(971_185_336_250);
        assert_eq!(
            format_line(LogFormat::Combined, &[], &r, "127.0.0.1", t),
            "127.0.0.1 - - [10/Oct/2000:13:42:16 +0000] \"GET http://h/ HTTP/1.1\" 200 1234 \"-\" \"curl/8 \\\"x\\\"\"\n"
        );
        let common = format_line(
            LogFormat::Common,
            &[],
            &AccessRecord { bytes: 0, ..record(0) },
            "127.0.0.1",
            t,
        );
        assert!(common.ends_with("\" 200 -\n"), "{common}");
        assert_eq!(
            format_line(LogFormat::Squid, &[], &r, "127.0.0.1", t),
            "971185336.250      1 127.0.0.1 TCP_HIT/200 1234 GET http://h/ - HIER_NONE/- -\n"
        );
        // A request answered from another's fetch: Squid's collapsed-forwarding hit.
        assert_eq!(
            format_line(
                LogFormat::Squid,
                &[],
                &AccessRecord {
                    cache: Some("COLLAPSED"),
                    ..record(1234)
                },
                "127.0.0.1",
                t
            ),
            "971185336.250      1 127.0.0.1 TCP_CF_HIT/200 1234 GET http://h/ - HIER_NONE/- -\n"
        );
        let mut headers = HeaderMap::new();
        headers.insert("x-trace", "abc".parse().unwrap());
        let custom = parse_format("%h \"%r\" %>s %B %D %C %m %U %H %{X-Trace}i %{Missing}i 100%%").unwrap();
        let line = format_line(
            LogFormat::Custom,
            &custom,
            &AccessRecord {
                headers: Some(&headers),
                ..record(1234)
            },
            "127.0.0.1",
            t,
        );
        assert_eq!(
            line,
            "127.0.0.1 \"GET http://h/ HTTP/1.1\" 200 1234 1500 HIT GET http://h/ HTTP/1.1 abc - 100%\n"
        );
        assert!(check_format("%q").is_err());
        assert!(check_format("%{X}o").is_err());
        assert!(check_format("50%").is_err());
    }
}
