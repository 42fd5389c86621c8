//! Readiness notification to systemd, the sd_notify(3) protocol without
//! libsystemd: when `$NOTIFY_SOCKET` is set (a service with `Type=notify`),
//! each state change is one datagram of `KEY=value` lines sent to that
//! unix socket: a path, or an abstract-namespace name written `@name`.
//!
//! Portico sends `READY=1` once every listener is bound and served (and the
//! privileges dropped), `RELOADING=1` (with `MONOTONIC_USEC`, which
//! `Type=notify-reload` requires) then `READY=1` around a SIGHUP reload,
//! and `STOPPING=1` when it starts draining; each with a `STATUS=` line that
//! `systemctl status` shows. With `processes = N`, the workers send theirs
//! to the supervisor (`supervisor.rs`), which tells systemd once all are ready.

use std::os::unix::net::UnixDatagram;

/// The environment variable naming the socket.
pub const ENV: &str = "NOTIFY_SOCKET";

/// The line a worker adds to its notifications: `PORTICO_WORKER=I`.
pub const WORKER_KEY: &str = "PORTICO_WORKER";

/// Sends `state` (newline-separated `KEY=value` lines) to `$NOTIFY_SOCKET`;
/// nothing when it is not set. A failure is logged, never fatal: the
/// service manager then times the start-up out, which says more than we could.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os(ENV).filter(|t| !t.is_empty()) else {
        return;
    };
    // A worker reports to the supervisor, which needs to know which one.
    let state = match crate::worker::index() {
        Some(i) => format!("{state}\n{WORKER_KEY}={i}"),
        None => state.to_string(),
    };
    if let Err(e) = send(&target, &state) {
        tracing::warn!(
            "cannot notify the service manager at {ENV}={}: {}",
            target.to_string_lossy(),
            crate::util::io_cause(&e)
        );
    }
}

/// Sends one datagram to the socket `target` names (`/path` or `@abstract`).
pub fn send(target: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let bytes = target.as_bytes();
    let sent = match bytes.first() {
        Some(b'/') => socket.send_to(state.as_bytes(), target)?,
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&bytes[1..])?;
            socket.send_to_addr(state.as_bytes(), &addr)?
        }
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a unix socket path or @abstract name",
            ));
        }
    };
    if sent != state.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "datagram cut short"));
    }
    Ok(())
}

/// `READY=1` with a status line.
pub fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={status}"));
}

/// `RELOADING=1`, stamped with CLOCK_MONOTONIC as `Type=notify-reload` requires.
pub fn reloading() {
    notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the configuration",
        monotonic_usec()
    ));
}

/// `STOPPING=1` with a status line.
pub fn stopping(status: &str) {
    notify(&format!("STOPPING=1\nSTATUS={status}"));
}

/// CLOCK_MONOTONIC in microseconds.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("portico-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");

        assert!(send(std::ffi::OsStr::new("vsock:2:1"), "READY=1").is_err());
    }
}
