//! Small helpers shared by several stages.

use http::HeaderValue;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The current time as an HTTP-date header value, formatted at most once a
/// second per thread (no lock on the request path).
pub(crate) fn http_date_now() -> HeaderValue {
    thread_local! {
        static CACHE: RefCell<(u64, HeaderValue)> =
            const { RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    CACHE.with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.0 != secs {
            let text = httpdate::fmt_http_date(now);
            *cache = (
                secs,
                HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("")),
            );
        }
        cache.1.clone()
    })
}

/// A `Hasher` for map keys that are already hashes (an xxh3 of a host
/// name, an `ObjectId`): passes the key's low 64 bits through, where
/// SipHash would spend instructions re-mixing bits that are mixed already
/// (a third of an ACL decision's time; about 160 instructions per lookup of
/// a 128-bit id).
#[derive(Debug, Default)]
pub(crate) struct PreHashed(u64);

impl std::hash::Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` and `write_u128` are used; fold anything else
        // in to stay correct.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

/// A `HashMap` keyed by values that are already hashes ([`PreHashed`]).
pub(crate) type PreHashedMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<PreHashed>>;

/// Counts one in a gauge until dropped: each holder of a resource
/// (a cache file being written, a pooled origin connection, a pumping
/// tunnel) carries one, so the count cannot drift from what is held.
#[derive(Debug)]
pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// Adds one to `gauge`; the drop takes it away.
    pub(crate) fn new(gauge: &'a AtomicUsize) -> Counted<'a> {
        gauge.fetch_add(1, Ordering::Relaxed);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An I/O error's cause in plain words, for error pages and the error log:
/// "connection refused", not "Connection refused (os error 111)". The
/// system's own text (strerror) for kinds not named here, without the
/// error number.
pub fn io_cause(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    let plain = match e.kind() {
        ConnectionRefused => "connection refused",
        ConnectionReset => "connection reset",
        ConnectionAborted => "connection aborted",
        BrokenPipe => "connection closed by the other side",
        UnexpectedEof => "connection closed early",
        NotConnected => "not connected",
        TimedOut => "timed out",
        HostUnreachable => "host unreachable",
        NetworkUnreachable => "network unreachable",
        NetworkDown => "network down",
        AddrNotAvailable => "address not available on this host",
        AddrInUse => "address already in use",
        // EACCES: a file's or directory's permissions. EPERM: an operation
        // not allowed to this process, which for a connection is most
        // often a firewall rule (a socket filter, nftables' reject).
        PermissionDenied if e.raw_os_error() == Some(libc::EACCES) => "permission denied",
        PermissionDenied => "not permitted (for a connection: a firewall rule?)",
        NotFound => "file not found",
        StorageFull => "disk full",
        ReadOnlyFilesystem => "read-only file system",
        OutOfMemory => "out of memory",
        _ => {
            let text = e.to_string();
            let text = match text.find(" (os error ") {
                Some(i) => text[..i].to_string(),
                None => text,
            };
            return text.to_lowercase();
        }
    };
    plain.to_string()
}

/// Escapes text for inclusion in HTML.
pub(crate) fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether two config values are equal, compared by their `Debug` text (the
/// config types are compared rarely, on a reload, so they need not derive
/// `PartialEq`; their `Debug` output shows every field).
pub(crate) fn same_value<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// `ip` as text; an IPv4 address written digit by digit (its `Display`
/// goes through `core::fmt`, over a thousand instructions, on every
/// proxied request and access-log line).
pub(crate) fn ip_text(ip: std::net::IpAddr) -> String {
    let std::net::IpAddr::V4(v4) = ip else {
        return ip.to_string();
    };
    let mut text = [0u8; 15];
    let len = ipv4_digits(v4, &mut text);
    // Digits and dots only: never the empty default.
    std::str::from_utf8(&text[..len]).unwrap_or_default().to_string()
}

/// Writes `v4` in dotted decimal into `out`, returning its length (at most
/// 15): as bytes, where pushing each digit as a `char` onto a `String`
/// cost about 20 instructions a digit.
pub(crate) fn ipv4_digits(v4: std::net::Ipv4Addr, out: &mut [u8; 15]) -> usize {
    let mut at = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out[at] = b'.';
            at += 1;
        }
        if octet >= 100 {
            out[at] = b'0' + octet / 100;
            at += 1;
        }
        if octet >= 10 {
            out[at] = b'0' + octet / 10 % 10;
            at += 1;
        }
        out[at] = b'0' + octet % 10;
        at += 1;
    }
    at
}

/// The IPv4 address a host written as numbers stands for, the way
/// `inet_aton(3)`, browsers and curl read it (the WHATWG URL standard's IPv4
/// parser): one to four parts separated by dots, each decimal, octal
/// (leading `0`) or hexadecimal (`0x`), the last filling the remaining
/// bytes: `127.1`, `2130706433`, `0x7f.1` all mean 127.0.0.1. Such a host
/// is no DNS name (no top-level domain is numeric), and sending it to DNS
/// would both leak it and let it past the own-address check.
fn numeric_ipv4(host: &str) -> Option<std::net::Ipv4Addr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    // Every numeric form starts with a digit; a name almost never does.
    // This runs for every request's host: no allocation on either path.
    if !host.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let number = |p: &str| -> Option<u64> {
        if p.is_empty() || p.len() > 20 {
            return None;
        }
        if let Some(hex) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            return if hex.is_empty() {
                Some(0)
            } else {
                u64::from_str_radix(hex, 16).ok()
            };
        }
        if p.len() > 1 && p.starts_with('0') {
            return u64::from_str_radix(&p[1..], 8).ok();
        }
        p.parse().ok()
    };
    let mut values = [0u64; 4];
    let mut count = 0;
    for part in host.split('.') {
        *values.get_mut(count)? = number(part)?;
        count += 1;
    }
    let (last, first) = values[..count].split_last()?;
    if first.iter().any(|&v| v > 255) {
        return None;
    }
    let rest_bits = 8 * (4 - first.len() as u32);
    if *last >= 1u64 << rest_bits {
        return None;
    }
    let mut n: u64 = 0;
    for (i, v) in first.iter().enumerate() {
        n |= v << (24 - 8 * i);
    }
    u32::try_from(n | last).ok().map(std::net::Ipv4Addr::from)
}

/// The IP address the connector (`upstream::connect`) reads `host` as,
/// rather than as a name to resolve: an IPv4 or IPv6 address, bracketed
/// or not, or an IPv4 address written as numbers ([`numeric_ipv4`]). The
/// address as written: an IPv4-mapped IPv6 address stays IPv6 (dialled,
/// it reaches the IPv4 host all the same).
pub(crate) fn host_ip(host: &str) -> Option<std::net::IpAddr> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Some(ip);
    }
    numeric_ipv4(bare).map(std::net::IpAddr::V4)
}

/// `host` as the `[[acl]]` entries, the `[[rule]]`s and the filter lists
/// compare it: lower-case, without trailing dots, and a host the connector
/// reads as an IP address ([`host_ip`]) in one spelling, as a browser's
/// URL parser (WHATWG) writes it: dotted decimal for IPv4 and for
/// IPv4-mapped IPv6, the RFC 5952 form in brackets for other IPv6. The
/// connector dials `2130706433`, `0x7f.1`, `127.1` and
/// `[::ffff:127.0.0.1]` all as 127.0.0.1: compared as written, each would
/// pass an entry naming `127.0.0.1`.
pub(crate) fn canonical_host(host: &str) -> String {
    let host = host.trim_end_matches('.');
    match host_ip(host).map(|ip| ip.to_canonical()) {
        Some(ip @ std::net::IpAddr::V4(_)) => ip_text(ip),
        Some(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
        None => host.to_ascii_lowercase(),
    }
}

/// Boxes the future `make` makes, written straight into its allocation. A
/// request's future is sized for its largest path (about 11 KiB with a
/// miss's fetch) while a new one holds only its arguments; `Box::pin` of a
/// future made first may build it on the stack and copy it whole.
#[inline(always)]
pub fn box_in_place<F: std::future::Future>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// True at most once a second for each `last` (the second of the last
/// true, since the Unix epoch): what an abusive client or a failing disk
/// can cause by the thousand (refusals, read errors) is logged that often,
/// and counted in full elsewhere.
pub(crate) fn log_due(last: &std::sync::atomic::AtomicU64) -> bool {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    last.swap(now, Ordering::Relaxed) != now
}

/// Reads a file the configuration names whole (a filter list, an error
/// page): a regular file of at most `max` bytes, the error in plain words
/// otherwise. Opened with `O_NONBLOCK`, so a FIFO (or a symlink to one)
/// is refused at once instead of blocking start-up, `portico check` or a
/// reload until something writes to it; a device or directory is refused
/// too, and an endless file stops at `max`. Symbolic links are followed:
/// administrators link these files into place.
pub(crate) fn read_config_file(path: &std::path::Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = open_nonblocking(path).map_err(|e| io_cause(&e))?;
    let meta = file.metadata().map_err(|e| io_cause(&e))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len().min(max)).unwrap_or(0));
    file.take(max + 1).read_to_end(&mut bytes).map_err(|e| io_cause(&e))?;
    if bytes.len() as u64 > max {
        return Err(format!("larger than {}", size_text(max)));
    }
    Ok(bytes)
}

/// Opens `path` for reading with `O_NONBLOCK`: a FIFO opens at once
/// instead of waiting for a writer (reads of a regular file are not
/// affected by the flag).
pub(crate) fn open_nonblocking(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// `max` in the largest binary unit that divides it (`1 GiB`, `64 KiB`).
fn size_text(max: u64) -> String {
    match max {
        m if m >= 1 << 30 && m % (1 << 30) == 0 => format!("{} GiB", m >> 30),
        m if m >= 1 << 20 && m % (1 << 20) == 0 => format!("{} MiB", m >> 20),
        m if m >= 1 << 10 && m % (1 << 10) == 0 => format!("{} KiB", m >> 10),
        m => format!("{m} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_causes_are_plain_words() {
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(io_cause(&refused), "connection refused");
        // A kind not named: the system's text, without the error number.
        let other = std::io::Error::from_raw_os_error(libc::EPROTO);
        assert_eq!(io_cause(&other), "protocol error");
        // A file's permissions are not a firewall's doing.
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(io_cause(&denied), "permission denied");
        let refused = std::io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(io_cause(&refused), "not permitted (for a connection: a firewall rule?)");
    }

    #[test]
    fn numeric_hosts_are_ipv4_addresses() {
        let lo = Some(std::net::Ipv4Addr::LOCALHOST);
        for host in [
            "127.1",
            "127.0.1",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0177.0.0.1",
            "127.0.0.1.",
        ] {
            assert_eq!(numeric_ipv4(host), lo, "{host}");
        }
        assert_eq!(numeric_ipv4("0"), Some(std::net::Ipv4Addr::UNSPECIFIED));
        for name in [
            "localhost",
            "example.com",
            "1.example",
            "127.0.0.1.1",
            "256.1",
            "4294967296",
            "08",
            "",
            "1..1",
        ] {
            assert_eq!(numeric_ipv4(name), None, "{name}");
        }
    }

    #[test]
    fn ip_hosts_are_canonical_in_any_spelling() {
        for host in [
            "127.0.0.1",
            "127.1",
            "2130706433",
            "0x7f000001",
            "0X7F.1",
            "0177.0.0.1",
            "127.000.000.001",
            "127.0.0.1.",
            "[::ffff:127.0.0.1]",
            "[::FFFF:7F00:1]",
            "::ffff:127.0.0.1",
            "[127.0.0.1]",
        ] {
            assert_eq!(canonical_host(host), "127.0.0.1", "{host}");
        }
        for host in ["[::1]", "[0:0:0:0:0:0:0:1]", "::1", "[0000::0001]"] {
            assert_eq!(canonical_host(host), "[::1]", "{host}");
        }
        assert_eq!(canonical_host("[2001:DB8:0:0:1:0:0:1]"), "[2001:db8::1:0:0:1]");
    }

    #[test]
    fn names_are_lower_case_without_trailing_dots() {
        assert_eq!(canonical_host("WWW.Example.COM."), "www.example.com");
        assert_eq!(canonical_host("example.com.."), "example.com");
        assert_eq!(canonical_host("1.example"), "1.example");
        assert_eq!(canonical_host("127.0.0.1.1"), "127.0.0.1.1");
        assert_eq!(canonical_host("*.example.com"), "*.example.com");
        assert_eq!(canonical_host(""), "");
    }

    #[test]
    fn ip_text_matches_display() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.30.40",
            "127.0.0.1",
            "192.168.100.255",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }
}
