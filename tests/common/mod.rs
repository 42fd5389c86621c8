//! Shared integration-test harness for Portico.
//!
//! Everything runs on real sockets bound to 127.0.0.1 with ephemeral ports.
//! Helpers that touch the network are `async` and meant to be called from
//! `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` tests, so
//! in-process origins keep being served while a test waits on a client.
//!
//! - [`Portico`]: the real binary, started from a TOML config, asking its
//!   own [`DnsServer`] for names (never the machine's resolver).
//! - [`Origin`]: scripted hyper-based HTTP/1.1 origin (plain or TLS).
//! - [`RawOrigin`], [`Blackhole`], [`dead_addr`]: misbehaving origins.
//! - [`Slapd`]: a real OpenLDAP directory for the LDAP tests.
//! - [`raw_request`], [`RawClient`], [`parse_response`],
//!   [`read_response_head`], [`curl`]: clients.
//! - [`page`], [`metric`], [`stats_snapshot`], [`stats_when`]: the monitoring
//!   pages of a running Portico.
//! - [`Pem`], [`cert_table`]: self-signed certificates for TLS listeners.

// Not every test file uses every helper.
#![allow(dead_code, unused_imports)]

mod certs;
mod client;
mod dns;
mod origin;
mod portico;
mod raw_origin;
pub mod slapd;

pub use certs::{Pem, cert_table};
pub use client::{
    Framing, ParsedResponse, RawClient, close_request_then_junk, connect_tunnel, curl, parse_head_response,
    parse_response, parse_responses, parse_responses_lenient, raw_request, raw_request_from, raw_request_timeout,
    read_response_head,
};
pub use dns::{DnsServer, Question};
pub use origin::{Body, Origin, Request, Response, pattern_matches};
pub use portico::{
    Portico, in_service, listener_addrs, metric, page, perf_line, stats_snapshot, stats_when, until_in_service_over,
    with_nameserver,
};
pub use raw_origin::{Blackhole, RawOrigin, Recorded, RecordingOrigin, Reply, chunked_body, read_request_head};
pub use slapd::{Slapd, have_slapd};

use std::net::TcpListener;

/// The disk tier's object files (named by 32 hex digits) under a cache
/// directory's levels, without the files being written in `tmp`.
pub fn cache_object_files(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let path = e.path();
            if e.file_name() == "tmp" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if e.file_name().len() == 32 {
                out.push(path);
            }
        }
    }
    out
}

/// The server side of the IPv4 TCP connection from `client` to `server`,
/// as the kernel lists it in /proc/net/tcp (what `ss -tn` shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerSide {
    /// The TCP state: 1 ESTABLISHED, 3 SYN_RECV (a handshake the kernel
    /// has not queued for `accept` yet, as with TCP_DEFER_ACCEPT), ...
    pub state: u8,
    /// The socket's inode: 0 until a process has accepted it.
    pub inode: u64,
    /// Bytes the kernel has received on it that the server has not read
    /// (`rx_queue`).
    pub unread: u64,
}

/// Looks up [`ServerSide`] for `client` -> `server`; None when the kernel
/// has no such connection (yet, or any more).
pub fn server_side(server: std::net::SocketAddr, client: std::net::SocketAddr) -> Option<ServerSide> {
    let proc_addr = |a: std::net::SocketAddr| {
        let std::net::SocketAddr::V4(v4) = a else {
            panic!("IPv4 only")
        };
        format!("{:08X}:{:04X}", u32::from_le_bytes(v4.ip().octets()), v4.port())
    };
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let (local, remote) = (proc_addr(server), proc_addr(client));
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == local && f[2] == remote).then(|| ServerSide {
            state: u8::from_str_radix(f[3], 16).unwrap_or(0),
            inode: f[9].parse().unwrap_or(0),
            unread: f[4]
                .split_once(':')
                .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
                .unwrap_or(0),
        })
    })
}

/// [`server_side`], polled for up to 5 s until `want` says it is there.
pub async fn server_side_when(
    server: std::net::SocketAddr,
    client: std::net::SocketAddr,
    want: impl Fn(Option<ServerSide>) -> bool,
) -> Option<ServerSide> {
    let mut side = server_side(server, client);
    for _ in 0..100 {
        if want(side) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        side = server_side(server, client);
    }
    side
}

/// Returns a TCP port on 127.0.0.1 that was free a moment ago
/// (bound to port 0, read back, released).
///
/// Never the same port twice in one test process: the kernel may hand a
/// port just released to the next bind, and two listeners of one config
/// picked one after the other then got the same address.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port");
        let port = listener.local_addr().expect("local_addr of ephemeral listener").port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// `"127.0.0.1:<free port>"`, ready to paste into a config.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// An address where nothing listens (bound, then dropped): connecting to it
/// is refused, which makes it a "dead origin".
pub fn dead_addr() -> String {
    free_addr()
}

/// Waits until the file at `path` (an access log, written by its own
/// thread) holds `n` lines, 5 s at most; returns the lines it has.
pub async fn file_lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..100 {
        got = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect();
        if got.len() >= n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    got
}

/// Sends `request` on a new connection, waits until it is in service (it
/// waits for something the test holds back), then hangs up. Returns the
/// access log once it has a line containing `logged`.
pub async fn hang_up_in_service(p: &Portico, request: &str, logged: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let serving = in_service(p).await;
    let mut gone = tokio::net::TcpStream::connect(p.addr()).await.expect("connect");
    gone.write_all(request.as_bytes()).await.expect("request");
    until_in_service_over(p, serving, "the request").await;
    drop(gone);
    access_log_with(p.dir(), logged).await
}

/// Waits (up to 5 s) for `dir`'s `access.log` (written by its own thread)
/// to contain `needle`; returns the log as it then is.
pub async fn access_log_with(dir: &std::path::Path, needle: &str) -> String {
    let path = dir.join("access.log");
    let mut log = String::new();
    for _ in 0..100 {
        log = std::fs::read_to_string(&path).unwrap_or_default();
        if log.contains(needle) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    log
}

/// Asserts that `promtool check metrics` accepts a Prometheus exposition,
/// lint included (metric names, types, help texts). promtool is the
/// Debian package `prometheus`, which scripts/install-test-deps installs.
pub fn promtool_check(metrics: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool not found: install Debian package `prometheus` (scripts/install-test-deps does)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\n{metrics}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two clients ask for `request` (a large object the origin holds back
/// for a moment, so they are collapsed onto one fetch): the first reads it
/// whole at once; the second, with a 4 KiB receive buffer, joins while the
/// head is held back and reads nothing until the first has it all and
/// half a second more. Returns the first's response, how much Portico's
/// resident memory grew (KiB) while the second read nothing, and the
/// second's response once it reads (30 s at most).
pub async fn fast_and_stalled_clients(p: &Portico, request: &str) -> (ParsedResponse, u64, ParsedResponse) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = p.addr();
    let before = p.rss_kib();
    let first = {
        let request = request.to_string();
        // 96 MiB through a debug build beside the rest of the suite on two
        // cores can take longer than `raw_request`'s 5 s.
        tokio::spawn(
            async move { raw_request_timeout(addr, request.as_bytes(), std::time::Duration::from_secs(30)).await },
        )
    };
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut slow = sock.connect(addr).await.expect("connect");
    slow.write_all(request.as_bytes()).await.expect("request");
    let first = parse_response(&first.await.expect("first client"));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let grown = p.rss_kib().saturating_sub(before);
    let mut got = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), slow.read_to_end(&mut got))
        .await
        .expect("the slow client's response ends")
        .expect("read");
    (first, grown, parse_response(&got))
}
