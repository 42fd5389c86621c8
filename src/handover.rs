//! What a supervisor hands its worker processes (`supervisor`) and how a
//! worker takes it, without a file anyone else could write: a worker starts
//! as root when the supervisor switches it to `server.user`, and what the
//! supervisor hands it (its configuration's text, its TLS ticket key seed)
//! must not come from a place that user (or anyone) could change.
//!
//! - Sealed memory files (`memfd_create`, sealed against writing, growing
//!   and shrinking): the supervisor makes one, the worker inherits it
//!   across exec (its number in an environment variable), checks its
//!   seals, reads it at offsets (its position is shared with every other
//!   holder) and closes it. The config text (`config::source`) and the TLS
//!   ticket key seed (`tls_resume`) go this way. Every descriptor the
//!   supervisor makes is close-on-exec: a child inherits only those made
//!   inheritable for it, between fork and exec ([`inherit_in_child`]).
//! - A channel for what comes later: a datagram socket pair per worker,
//!   the worker's end inherited, on which the supervisor sends a sealed
//!   memory file (`SCM_RIGHTS`) before it forwards a SIGHUP: the config a
//!   reload validated. No one but the supervisor holds the other end. The
//!   worker answers on it with each reload's outcome ([`Channel::report`]),
//!   a short datagram the supervisor reads as text and nothing more
//!   ([`next_report`]: a descriptor sent along is not taken).
//! - Shared memory files (sealed against growing and shrinking only): the
//!   supervisor makes one ([`shared_memory`]) and every worker maps it
//!   ([`map_inherited`]), for what the workers keep together (the limits'
//!   buckets, `shared_buckets`; the clients' connection counts,
//!   `shared_conns`; the cache's removals, `cache::told`).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU64;

/// The seals of a memory file handed over: nobody can change it.
const SEALS: libc::c_int = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A new memory file (`memfd_create`) named `name`: close-on-exec, open
/// to seals, and never executable where the kernel can say so
/// (`MFD_NOEXEC_SEAL`, Linux 6.3; older kernels refuse the flag).
pub(crate) fn memory_file(name: &std::ffi::CStr) -> std::io::Result<File> {
    const MFD_NOEXEC_SEAL: libc::c_uint = 0x0008;
    let flags = libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC;
    // SAFETY: the name is a NUL-terminated C string.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), flags | MFD_NOEXEC_SEAL) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    }
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened by memfd_create and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A new memory file of `len` bytes (zeros) for the workers to share:
/// close-on-exec, never executable, sealed at its size (a holder that
/// shrank it would crash every process mapping it with SIGBUS).
pub fn shared_memory(name: &std::ffi::CStr, len: usize) -> std::io::Result<File> {
    let file = memory_file(name)?;
    file.set_len(len as u64)?;
    add_seals(&file, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL)?;
    Ok(file)
}

/// Seals `file` with `seals` (F_ADD_SEALS).
fn add_seals(file: &File, seals: libc::c_int) -> std::io::Result<()> {
    // SAFETY: fcntl with F_ADD_SEALS takes an integer, no pointer.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a memory file sealed with (at least) `seals`.
fn has_seals(fd: RawFd, seals: libc::c_int) -> bool {
    // SAFETY: fcntl with F_GET_SEALS takes no pointer; any number is safe.
    let held = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    held >= 0 && held & seals == seals
}

/// The size of the file `fd` in bytes.
fn file_len(fd: RawFd) -> Result<usize, String> {
    // SAFETY: `libc::stat` is plain old data (integers only): all zeros
    // is a valid value of it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the `stat` it is given, which lives for the
    // call; any descriptor number is safe to ask about.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!("fd {fd}: {}", std::io::Error::last_os_error()));
    }
    Ok(usize::try_from(st.st_size).unwrap_or(0))
}

/// `Ok` when `words[at]` holds `mark`, the layout this build writes: a
/// supervisor of another build (the binary upgraded under it) laid the
/// memory out otherwise, and it is not to be used.
pub fn check_mark(words: &[AtomicU64], at: usize, mark: u64) -> Result<(), String> {
    let seen = words[at].load(std::sync::atomic::Ordering::Acquire);
    if seen != mark {
        return Err(format!(
            "the memory is laid out by another build of portico (mark {seen:#x}): restart the server"
        ));
    }
    Ok(())
}

/// In a worker: the shared memory file named in `var` ([`inherited_fd`]),
/// mapped whole as atomic words, if it is one (sealed against resizing and
/// at least `min_words` long: what else the number may be is not written
/// to); made close-on-exec whether mapped or not. None when `var` is not
/// set.
pub fn map_inherited(var: &'static str, min_words: usize) -> Option<Result<&'static [AtomicU64], String>> {
    let fd = match inherited_fd(var)? {
        Ok(fd) => fd,
        Err(e) => return Some(Err(e)),
    };
    let mapped = if has_seals(fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) {
        map_whole(fd, min_words)
    } else {
        Err(format!("fd {fd} is not the supervisor's sealed memory file"))
    };
    // Mapped or not: not handed on to anything this worker might start.
    // SAFETY: fcntl with F_SETFD takes an integer flag, no pointer.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(mapped)
}

/// Maps the whole memory file `fd` as atomic words, shared, if it has at
/// least `min_words` (a size that is no whole number of words is cut).
pub fn map_whole(fd: RawFd, min_words: usize) -> Result<&'static [AtomicU64], String> {
    let len = file_len(fd)?;
    let words = len / std::mem::size_of::<AtomicU64>();
    if words < min_words {
        return Err(format!("fd {fd} holds {len} bytes, not {}", min_words * 8));
    }
    mmap_words(fd, words)
}

/// `n` atomic words, zero, for the life of the process: taken from the
/// system a page at a time as they are first written (`alloc_zeroed`,
/// calloc, which large allocations get as untouched pages), whatever the
/// optimisation level.
pub fn zeroed_words(n: usize) -> &'static [AtomicU64] {
    use std::alloc::{Layout, alloc_zeroed, handle_alloc_error};
    let n = n.max(1);
    let layout = match Layout::array::<AtomicU64>(n) {
        Ok(layout) => layout,
        Err(_) => handle_alloc_error(Layout::new::<AtomicU64>()),
    };
    // SAFETY: the layout's size is not zero (one word at least).
    let at = unsafe { alloc_zeroed(layout) }.cast::<AtomicU64>();
    if at.is_null() {
        handle_alloc_error(layout);
    }
    // SAFETY: `at` is a new allocation of `n` AtomicU64s, aligned for
    // them, all zero bytes (the valid value 0 of each), never freed: it
    // lives as long as the process.
    unsafe { std::slice::from_raw_parts(at, n) }
}

/// Maps the first `words` atomic words of the memory file `fd`, shared,
/// for the life of the process (the descriptor may be closed after).
pub fn map_words(fd: RawFd, words: usize) -> Result<&'static [AtomicU64], String> {
    let len = file_len(fd)?;
    if len < words * std::mem::size_of::<AtomicU64>() {
        return Err(format!("fd {fd} holds {len} bytes, not {}", words * 8));
    }
    mmap_words(fd, words)
}

/// Maps `words` atomic words of `fd`, which holds at least that many.
fn mmap_words(fd: RawFd, words: usize) -> Result<&'static [AtomicU64], String> {
    let len = words * std::mem::size_of::<AtomicU64>();
    // SAFETY: a new shared mapping of `len` bytes of `fd` at an address the
    // kernel picks; nothing else in this process is mapped there.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(format!("mmap of fd {fd}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the mapping is `len` bytes, page-aligned (so aligned for
    // AtomicU64, which has u64's size and layout), readable and writable,
    // and never unmapped: it lives as long as the process ('static). Every
    // access, in this process and the others mapping the file, goes
    // through these atomics.
    Ok(unsafe { std::slice::from_raw_parts(at.cast::<AtomicU64>(), words) })
}

/// Makes `fd` inheritable across exec. For the closure a child runs
/// between fork and exec (`CommandExt::pre_exec`): it calls only fcntl,
/// which is async-signal-safe, and allocates nothing.
pub fn inherit_in_child(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl with F_SETFD takes an integer flag, no pointer.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A memory file named `name` holding `bytes`, sealed: nobody, its maker
/// included, can change it.
pub fn sealed(name: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let mut f = memory_file(name)?;
    f.write_all(bytes)?;
    add_seals(&f, SEALS)?;
    Ok(f.into())
}

/// In a worker: the descriptor number its supervisor named in the
/// environment variable `var`, the first time it is asked for (a number
/// taken once may be closed and reused since: never again). None when the
/// variable is not set or was taken; an error when it is not a number
/// above the standard streams.
pub fn inherited_fd(var: &'static str) -> Option<Result<RawFd, String>> {
    static TAKEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let number = std::env::var(var).ok()?;
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    if taken.contains(&var) {
        return None;
    }
    taken.push(var);
    Some(match number.parse() {
        Ok(fd) if fd > 2 => Ok(fd),
        _ => Err(format!("{var}={number:?} is not a file descriptor")),
    })
}

/// In a worker: the bytes of the sealed memory file its supervisor named
/// in the environment variable `var`, which is closed once read. None when
/// the variable is not set; an error when it names no sealed memory file
/// (a number that is something else is left alone).
pub fn take_sealed(var: &'static str) -> Option<Result<Vec<u8>, String>> {
    let fd = match inherited_fd(var)? {
        Ok(fd) => fd,
        Err(e) => return Some(Err(e)),
    };
    if !has_seals(fd, SEALS) {
        return Some(Err(format!("{var}={fd} is not the supervisor's sealed memory file")));
    }
    // SAFETY: the descriptor was inherited for this process to read once
    // and, taken once (`inherited_fd`), is owned by nothing else here: it
    // is closed once read.
    let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    Some(read_whole(&f).map_err(|e| format!("{var}: {}", crate::util::io_cause(&e))))
}

/// The whole of `f`, read at offsets: its position is shared with every
/// process holding it, so it is never moved.
pub fn read_whole(f: &File) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let len = usize::try_from(f.metadata()?.len()).map_err(std::io::Error::other)?;
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

/// The longest report a worker sends its supervisor; more is cut.
pub const REPORT_MAX: usize = 2048;

/// In the supervisor: the next report on a worker's channel (`ours`, its
/// end), waited for (a closed end says nothing: it is the worker's exit
/// that ends the wait). Only bytes
/// are read: descriptors a worker sends along are closed by the kernel
/// (no room is given for them), and a report longer than [`REPORT_MAX`]
/// is cut.
pub async fn next_report(ours: &tokio::io::unix::AsyncFd<OwnedFd>) -> std::io::Result<Vec<u8>> {
    use rustix::net::{RecvFlags, recv};
    loop {
        let mut ready = ours.readable().await?;
        let mut buf = vec![0u8; REPORT_MAX];
        match ready.try_io(|fd| recv(fd.get_ref(), &mut buf[..], RecvFlags::DONTWAIT).map_err(Into::into)) {
            Ok(Ok((n, _))) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// A new channel: (the supervisor's end, the worker's end), both
/// close-on-exec (the worker's is made inheritable in the child only) and
/// non-blocking.
pub fn channel() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    Ok((ours, theirs))
}

/// How a message on a channel starts: a config text follows, and the
/// addresses of the listener sockets sent with it, a line each.
const CONFIG: u8 = b'c';

/// Most listener sockets one message carries, beside its config (Linux
/// takes at most 253 descriptors in one message, `SCM_MAX_FD`).
pub const MOST_LISTENERS: usize = 252;

/// Room for a message's bytes: its tag, and each address (at most 58
/// bytes, an IPv6 address with a scope and a port) on a line.
const MESSAGE_ROOM: usize = 1 + MOST_LISTENERS * 60;

/// Sends `file` (a sealed memory file) on the supervisor's end `ours`,
/// with a socket for each listener the text adds (`listen::reserve`), in
/// one message: a worker never sees the sockets without the text they go
/// with.
pub fn send(
    ours: &OwnedFd,
    file: BorrowedFd<'_>,
    listeners: &[(std::net::SocketAddr, BorrowedFd<'_>)],
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    if listeners.len() > MOST_LISTENERS {
        return Err(std::io::Error::other(format!(
            "{} listeners added at once; at most {MOST_LISTENERS} are",
            listeners.len()
        )));
    }
    let mut bytes = vec![CONFIG];
    let mut fds = vec![file];
    for (addr, socket) in listeners {
        bytes.push(b'\n');
        bytes.extend_from_slice(addr.to_string().as_bytes());
        fds.push(*socket);
    }
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MOST_LISTENERS + 1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("no room for the descriptors in the message"));
    }
    sendmsg(
        ours,
        &[std::io::IoSlice::new(&bytes)],
        &mut control,
        SendFlags::DONTWAIT,
    )?;
    Ok(())
}

/// What a worker's supervisor sent it since it last looked ([`Channel::latest`]).
#[derive(Debug, Default)]
pub struct Received {
    /// The last config text, read whole (those before it are closed
    /// unread).
    pub config: Option<Vec<u8>>,
    /// The listener sockets sent with the texts, by address: the last one
    /// sent for each (a listener one text added and the next one kept is
    /// sent with the first alone).
    pub listeners: Vec<(std::net::SocketAddr, OwnedFd)>,
}

/// A worker's end of its channel.
#[derive(Debug)]
pub struct Channel(OwnedFd);

impl Channel {
    /// In a worker: the end its supervisor named in `var` (made
    /// close-on-exec). None when the variable is not set; an error when it
    /// names no socket.
    pub fn take(var: &'static str) -> Option<Result<Channel, String>> {
        let fd = match inherited_fd(var)? {
            Ok(fd) => fd,
            Err(e) => return Some(Err(e)),
        };
        // SAFETY: `libc::stat` is plain old data (integers only): all
        // zeros is a valid value of it; fstat writes into it, and any
        // descriptor number is safe to ask about.
        let is_socket = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
        };
        if !is_socket {
            return Some(Err(format!("{var}={fd} is not the supervisor's channel")));
        }
        // SAFETY: fcntl with F_SETFD takes an integer flag, no pointer.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Some(Err(format!("{var}={fd}: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: the descriptor was inherited for this process and, taken
        // once (`inherited_fd`), is owned by nothing else here from now on.
        Some(Ok(Channel(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Tells the supervisor `report` (cut to [`REPORT_MAX`] bytes), without
    /// waiting: lost if its side is full.
    pub fn report(&self, report: &[u8]) -> std::io::Result<()> {
        use rustix::net::{SendFlags, send};
        send(&self.0, &report[..report.len().min(REPORT_MAX)], SendFlags::DONTWAIT)?;
        Ok(())
    }

    /// What the supervisor sent since the last call: the last config text
    /// (a sealed memory file, read whole) and the listener sockets sent
    /// with the texts.
    pub fn latest(&self) -> std::io::Result<Received> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, recvmsg};
        let mut last: Option<OwnedFd> = None;
        let mut listeners: Vec<(std::net::SocketAddr, OwnedFd)> = Vec::new();
        let mut bytes = vec![0u8; MESSAGE_ROOM];
        let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MOST_LISTENERS + 1))];
        // Bounded: what a worker is sent between two reloads is a few
        // messages at most.
        for _ in 0..1024 {
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let got = match recvmsg(
                &self.0,
                &mut [std::io::IoSliceMut::new(&mut bytes)],
                &mut control,
                RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(got) => got,
                Err(e) if e == rustix::io::Errno::AGAIN => break,
                Err(e) => return Err(e.into()),
            };
            // Taken first, so that they are closed whatever the message.
            let mut fds: Vec<OwnedFd> = Vec::new();
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = message {
                    fds.extend(received);
                }
            }
            if got.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC) {
                return Err(std::io::Error::other("a message from the supervisor did not fit"));
            }
            let text = bytes.get(..got.bytes).and_then(|b| b.strip_prefix(&[CONFIG]));
            let addresses: Option<Vec<std::net::SocketAddr>> = text.and_then(|t| {
                let mut lines = std::str::from_utf8(t).ok()?.split('\n');
                if lines.next() != Some("") {
                    return None;
                }
                lines.map(|a| a.parse().ok()).collect()
            });
            let (Some(addresses), false) = (addresses, fds.is_empty()) else {
                return Err(std::io::Error::other(
                    "the supervisor sent something else than a config",
                ));
            };
            let mut fds = fds.into_iter();
            let config = fds.next();
            if fds.len() != addresses.len() {
                return Err(std::io::Error::other(
                    "the supervisor sent a config with another number of listener sockets than it names",
                ));
            }
            for (addr, fd) in addresses.into_iter().zip(fds) {
                listeners.retain(|(a, _)| *a != addr);
                listeners.push((addr, fd));
            }
            last = config;
        }
        let config = match last {
            None => None,
            Some(fd) => {
                if !has_seals(fd.as_fd().as_raw_fd(), SEALS) {
                    return Err(std::io::Error::other(
                        "the supervisor sent something else than a sealed memory file",
                    ));
                }
                Some(read_whole(&File::from(fd))?)
            }
        };
        Ok(Received { config, listeners })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_memory_file_cannot_be_changed_and_is_read_whole_wherever_its_position() {
        use std::io::{Read, Seek};
        let fd = sealed(c"test", b"[server]\nworkers = 3\n").expect("memory file");
        assert!(has_seals(fd.as_raw_fd(), SEALS));
        let mut f = File::from(fd);
        assert!(f.write_all(b"x").is_err(), "sealed against writes");
        assert!(f.set_len(0).is_err(), "and against shrinking");
        // Another holder moved the shared position: still read whole.
        f.seek(std::io::SeekFrom::Start(5)).expect("seek");
        let mut rest = String::new();
        f.read_to_string(&mut rest).expect("read");
        assert_eq!(rest, "er]\nworkers = 3\n");
        assert_eq!(read_whole(&f).expect("read whole"), b"[server]\nworkers = 3\n");
    }

    #[test]
    fn a_channel_gives_the_last_file_sent_and_then_nothing() {
        let (ours, theirs) = channel().expect("channel");
        let theirs = Channel(theirs);
        assert!(theirs.latest().expect("nothing yet").config.is_none());
        for text in [&b"first"[..], b"second"] {
            let f = sealed(c"test", text).expect("memory file");
            send(&ours, f.as_fd(), &[]).expect("send");
        }
        assert_eq!(theirs.latest().expect("latest").config.as_deref(), Some(&b"second"[..]));
        assert!(theirs.latest().expect("drained").config.is_none());
        // What is not sealed is refused.
        let open = memory_file(c"test").expect("memory file");
        send(&ours, open.as_fd(), &[]).expect("send");
        assert!(theirs.latest().is_err());
    }

    #[test]
    fn a_channel_gives_the_listener_sockets_sent_with_the_texts_the_last_for_each_address() {
        let (ours, theirs) = channel().expect("channel");
        let theirs = Channel(theirs);
        let a: std::net::SocketAddr = "127.0.0.1:1".parse().expect("address");
        let b: std::net::SocketAddr = "[::1]:2".parse().expect("address");
        let sockets: Vec<_> = (0..3)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("socket"))
            .collect();
        let first = sealed(c"test", b"first").expect("memory file");
        send(
            &ours,
            first.as_fd(),
            &[(a, sockets[0].as_fd()), (b, sockets[1].as_fd())],
        )
        .expect("send");
        let second = sealed(c"test", b"second").expect("memory file");
        send(&ours, second.as_fd(), &[(a, sockets[2].as_fd())]).expect("send");
        let got = theirs.latest().expect("latest");
        assert_eq!(got.config.as_deref(), Some(&b"second"[..]));
        let local = |fd: &OwnedFd| {
            std::net::UdpSocket::from(fd.try_clone().expect("dup"))
                .local_addr()
                .expect("address")
        };
        let listeners: Vec<_> = got.listeners.iter().map(|(addr, fd)| (*addr, local(fd))).collect();
        assert_eq!(
            listeners,
            vec![
                (b, sockets[1].local_addr().expect("address")),
                (a, sockets[2].local_addr().expect("address"))
            ]
        );
        let drained = theirs.latest().expect("drained");
        assert!(drained.config.is_none() && drained.listeners.is_empty());
    }

    #[test]
    fn a_message_naming_more_or_fewer_sockets_than_it_carries_is_refused() {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
        let (ours, theirs) = channel().expect("channel");
        let theirs = Channel(theirs);
        let text = sealed(c"test", b"text").expect("memory file");
        for bytes in [&b"c\n127.0.0.1:1"[..], b"c\nnot an address", b"cx", b"x"] {
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            let fds = [text.as_fd()];
            assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
            sendmsg(
                &ours,
                &[std::io::IoSlice::new(bytes)],
                &mut control,
                SendFlags::DONTWAIT,
            )
            .expect("send");
            assert!(theirs.latest().is_err(), "{:?}", String::from_utf8_lossy(bytes));
        }
    }
}
