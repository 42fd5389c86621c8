//! A client's TCP connection, registered with the runtime's reactor only
//! when it first has to wait.
//!
//! tokio registers every socket it wraps (`epoll_ctl` ADD) and removes it
//! before the close (DEL): two system calls per connection, and an epoll
//! entry whose callback runs at each of the socket's wake-ups. Most
//! connections never need it: a client's request has usually arrived by
//! the time its connection is accepted, and the answer fits in the send
//! buffer. HAProxy reads a new connection at once and adds it to epoll only
//! when a read or write would block (0.018 `epoll_ctl` per `Connection:
//! close` request under wrk, against tokio's 2). [`Tcp`] does the same: its
//! reads and writes go straight to the socket until one returns
//! `WouldBlock`, and only a wait for readiness registers it. From then on
//! it is an ordinary `AsyncFd`, with tokio's readiness tracking.
//!
//! The first read is made without waiting for an epoll event: a socket
//! registered at accept (as before) waited for the reactor's next turn even
//! when its request was already there.

use bytes::{BufMut, BytesMut};
use std::io::{self, IoSlice, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::task::{Context, Poll};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The descriptor as the reactor knows it; [`Tcp::sock`] owns it.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A non-blocking TCP connection, registered with the reactor of the
/// runtime it first waits on (see the module documentation).
pub struct Tcp {
    /// The registration, made by the first wait for readiness (a failed
    /// one is kept: the connection is then unusable). Declared before
    /// `sock` so that it is dropped first: its deregistration needs the
    /// descriptor still open.
    reactor: OnceLock<io::Result<AsyncFd<Fd>>>,
    /// Before registration, the directions in which the last operation
    /// returned `WouldBlock` ([`READ_BLOCKED`], [`WRITE_BLOCKED`]): the
    /// next one fails the same way without a system call, as tokio's
    /// cleared readiness does, so that the caller waits (and registers).
    blocked: AtomicU8,
    sock: TcpStream,
}

/// A read found nothing waiting.
const READ_BLOCKED: u8 = 1;
/// A write found the send buffer full.
const WRITE_BLOCKED: u8 = 2;

impl Tcp {
    /// Wraps a connected socket that is already in non-blocking mode
    /// (`accept4` with `SOCK_NONBLOCK`, or a socket the keep-alive poller
    /// held). No system call.
    pub fn from_std(sock: TcpStream) -> Tcp {
        Tcp {
            reactor: OnceLock::new(),
            blocked: AtomicU8::new(0),
            sock,
        }
    }

    /// Takes over a tokio socket (an origin connection that becomes one
    /// side of a tunnel): it leaves tokio's reactor, to join it again at its
    /// first wait.
    pub fn from_tokio(sock: tokio::net::TcpStream) -> io::Result<Tcp> {
        Ok(Tcp::from_std(sock.into_std()?))
    }

    /// The registration, made now if the socket has none yet.
    #[inline]
    fn reactor(&self) -> io::Result<&AsyncFd<Fd>> {
        match self.reactor.get() {
            Some(Ok(r)) => Ok(r),
            _ => self.register(),
        }
    }

    /// [`Tcp::reactor`]'s first call (or a failed registration's error).
    #[cold]
    fn register(&self) -> io::Result<&AsyncFd<Fd>> {
        let fd = self.sock.as_raw_fd();
        let register = || {
            // SAFETY: `fd` is `sock`'s, which stays open while the
            // registration lives: the registration is dropped first (field
            // order) or taken off in `into_std` before `sock` is given up.
            unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE | Interest::WRITABLE) }
                .map_err(io::Error::from)
        };
        match self.reactor.get_or_init(register) {
            Ok(r) => Ok(r),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }

    /// Whether the socket has been registered with a reactor (it has had to
    /// wait once).
    pub fn is_registered(&self) -> bool {
        self.reactor.get().is_some()
    }

    /// Waits until the socket is readable (data, end of stream or an error
    /// to read), as tokio's `TcpStream::readable`.
    pub async fn readable(&self) -> io::Result<()> {
        let _ = self.reactor()?.readable().await?;
        Ok(())
    }

    /// Waits until a read is worth trying: at once while the socket is not
    /// registered and no read has found it empty (a new connection, whose
    /// request is usually there), otherwise as [`Tcp::readable`].
    pub async fn read_worth_trying(&self) -> io::Result<()> {
        if self.reactor.get().is_none() && self.blocked.load(Relaxed) & READ_BLOCKED == 0 {
            return Ok(());
        }
        let _ = self.reactor()?.readable().await?;
        Ok(())
    }

    /// Waits until the socket can take more bytes.
    pub async fn writable(&self) -> io::Result<()> {
        let _ = self.reactor()?.writable().await?;
        Ok(())
    }

    /// Polls for read readiness, registering the socket if needed.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.reactor() {
            Ok(r) => r.poll_read_ready(cx).map_ok(drop),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Polls for write readiness, registering the socket if needed.
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.reactor() {
            Ok(r) => r.poll_write_ready(cx).map_ok(drop),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Runs one non-blocking operation `f` on the socket, as tokio's
    /// `TcpStream::try_io`: once registered, `WouldBlock` without calling
    /// `f` when the reactor has seen no readiness for `interest`, and a
    /// `WouldBlock` from `f` clears that readiness. Before registration `f`
    /// runs unless an earlier operation in the same direction returned
    /// `WouldBlock`: there is no readiness to go by, and a new connection's
    /// socket is usually ready. `interest` is one direction.
    pub fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self.reactor.get() {
            None => {
                let flag = if interest.is_readable() {
                    READ_BLOCKED
                } else {
                    WRITE_BLOCKED
                };
                if self.blocked.load(Relaxed) & flag != 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let r = f();
                if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                    self.blocked.fetch_or(flag, Relaxed);
                }
                r
            }
            Some(Ok(r)) => r.try_io(interest, |_| f()),
            Some(Err(e)) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }

    /// Reads what is waiting into `buf`'s spare room (one `recv`); 0 at
    /// end of stream or when `buf` has no room.
    pub fn try_read_buf(&self, buf: &mut BytesMut) -> io::Result<usize> {
        self.try_io(Interest::READABLE, || {
            let room = buf.chunk_mut();
            // SAFETY: `UninitSlice` is a `[MaybeUninit<u8>]` of the buffer's
            // spare room, which `recv` only writes to.
            let spare = unsafe { room.as_uninit_slice_mut() };
            let n = socket2::SockRef::from(&self.sock).recv(spare)?;
            // SAFETY: `recv` initialised the first `n` bytes of the room.
            unsafe { buf.advance_mut(n) };
            Ok(n)
        })
    }

    /// Reads what is waiting into `buf` (one `recv`).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.try_io(Interest::READABLE, || io::Read::read(&mut &self.sock, buf))
    }

    /// Copies what is waiting into `buf` without consuming it, waiting for
    /// readability if nothing is.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.try_io(Interest::READABLE, || self.sock.peek(buf)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable().await?,
                r => return r,
            }
        }
    }

    /// Writes what the socket takes of `data` (one `send`).
    pub fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        self.try_io(Interest::WRITABLE, || (&self.sock).write(data))
    }

    /// Writes what the socket takes of `parts` (one `writev`).
    pub fn try_write_vectored(&self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        self.try_io(Interest::WRITABLE, || (&self.sock).write_vectored(parts))
    }

    /// The client's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    /// The address the client connected to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Sets TCP_NODELAY.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.sock.set_nodelay(on)
    }

    /// The plain socket, off the reactor (deregistered if it was
    /// registered), still non-blocking: for the keep-alive poller.
    pub fn into_std(self) -> io::Result<TcpStream> {
        let Tcp { reactor, sock, .. } = self;
        if let Some(Ok(r)) = reactor.into_inner() {
            // Deregisters (epoll_ctl DEL) while `sock` is still open.
            let _ = r.into_inner();
        }
        Ok(sock)
    }

    /// A tokio socket on this runtime's reactor (HTTP/2, whose framing
    /// layer reads and writes through tokio's split halves).
    pub fn into_tokio(self) -> io::Result<tokio::net::TcpStream> {
        tokio::net::TcpStream::from_std(self.into_std()?)
    }
}

impl AsRawFd for Tcp {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for Tcp {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl std::fmt::Debug for Tcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tcp")
            .field("fd", &self.sock.as_raw_fd())
            .field("registered", &self.is_registered())
            .finish()
    }
}
