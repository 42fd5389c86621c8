//! Readiness-based reads and writes on a shared `&ClientStream`.
//!
//! Reading and writing through `&ClientStream` (rather than split halves)
//! lets the request-body reader and the response writer of one exchange run
//! concurrently in one task, and lets an idle connection wait for
//! readability while holding no buffer at all.
//!
//! A client connection is plain TCP or TLS ([`ClientStream`]): an enum,
//! matched once per read or write, so plain TCP pays a predictable branch
//! and no dynamic dispatch; the TLS record layer is `http1::tls`.

use bytes::BytesMut;
use std::io::{self, IoSlice};
use std::time::Duration;
use tokio::net::TcpStream;

/// Where a byte relay (a CONNECT tunnel, over HTTP/1 or HTTP/2, or a
/// SOCKS session) adds the bytes it copies each way, as it copies them:
/// a tunnel open for hours shows in the statistics while it carries its
/// bytes, not only once it closes.
#[derive(Clone, Copy)]
pub struct Tally<'a> {
    /// Bytes from the client.
    pub up: &'a std::sync::atomic::AtomicU64,
    /// Bytes to the client.
    pub down: &'a std::sync::atomic::AtomicU64,
}

impl Tally<'_> {
    /// Adds `n` bytes from the client.
    pub fn add_up(&self, n: u64) {
        self.up.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds `n` bytes to the client.
    pub fn add_down(&self, n: u64) {
        self.down.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A client connection: plain TCP, or TLS on a listener with certificates.
pub enum ClientStream {
    /// Plain TCP (and the origin side of a CONNECT tunnel).
    Plain(TcpStream),
    /// TLS, its handshake done.
    Tls(Box<super::tls::TlsConn>),
}

impl ClientStream {
    /// The TCP connection (underneath TLS): addresses, socket options,
    /// readiness, shutdown.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(t) => t.tcp(),
        }
    }

    /// True for a TLS connection.
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }
}

/// Reads whatever is available into `buf` (growing it by up to `chunk`
/// bytes); returns 0 at end of stream. Over TLS, decrypted bytes.
pub async fn read_buf(stream: &ClientStream, buf: &mut BytesMut, chunk: usize) -> io::Result<usize> {
    match stream {
        ClientStream::Plain(s) => read_buf_tcp(s, buf, chunk).await,
        ClientStream::Tls(t) => t.read_buf(buf, chunk).await,
    }
}

/// [`read_buf`], reading at most `most` bytes (at least 512) also on
/// plain TCP, as over TLS: a relay paced by a bandwidth limit reads a
/// piece of it at a time, not whatever the buffer has room for.
pub async fn read_at_most(stream: &ClientStream, buf: &mut BytesMut, most: usize) -> io::Result<usize> {
    match stream {
        ClientStream::Plain(s) => read_buf_tcp_at_most(s, buf, most, most).await,
        ClientStream::Tls(t) => t.read_buf(buf, most).await,
    }
}

/// [`read_buf`] on plain TCP.
async fn read_buf_tcp(stream: &TcpStream, buf: &mut BytesMut, chunk: usize) -> io::Result<usize> {
    read_buf_tcp_at_most(stream, buf, chunk, usize::MAX).await
}

/// [`read_buf`] on plain TCP, at most `most` bytes (at least 512).
async fn read_buf_tcp_at_most(stream: &TcpStream, buf: &mut BytesMut, chunk: usize, most: usize) -> io::Result<usize> {
    loop {
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(chunk);
        }
        match try_read_drained_at_most(stream, buf, most.max(512)) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.readable().await?,
            Err(e) => return Err(e),
        }
    }
}

/// One non-blocking read into `buf`'s spare room (as `try_read_buf`). A
/// read that fills less than the room emptied the socket's receive queue:
/// the socket's readiness is then cleared, so that the next read waits for
/// the next event instead of making a `recv` that can only fail with
/// EAGAIN (nginx's `ngx_unix_recv` does the same). The readiness cleared is
/// the one observed before the read: an event that arrives during it keeps
/// the socket readable (tokio compares its tick), and a close behind the
/// data stays seen (tokio never clears READ_CLOSED).
pub fn try_read_drained(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    try_read_drained_at_most(stream, buf, usize::MAX)
}

/// [`try_read_drained`] of at most `most` bytes: a read that fills them
/// all may have left more in the socket, so only a shorter one clears the
/// readiness.
fn try_read_drained_at_most(stream: &TcpStream, buf: &mut BytesMut, most: usize) -> io::Result<usize> {
    use bytes::BufMut as _;
    if buf.capacity() == buf.len() {
        // A full buffer gets room, as `try_read_buf` gives it: a read into
        // none would return 0, taken for the end of the stream.
        buf.reserve(64);
    }
    let room = (buf.capacity() - buf.len()).min(most.max(1));
    let mut got = 0;
    let read = stream.try_io(tokio::io::Interest::READABLE, || {
        got = stream.try_read_buf(&mut (&mut *buf).limit(room))?;
        if got > 0 && got < room {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(got)
        }
    });
    match read {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        other => other,
    }
}

/// Waits until `stream` can take more bytes, at most `timeout`. A peer
/// that accepted nothing for that long (it does not read: nginx's
/// `send_timeout`) gets its connection aborted: the unsent bytes are
/// discarded and a reset is sent when the socket is closed, rather than
/// the kernel holding them for a peer that may never take them. The error
/// is `TimedOut`.
/// A zero `timeout` waits for ever.
pub(super) async fn writable_within(stream: &TcpStream, timeout: Duration) -> io::Result<()> {
    if timeout.is_zero() {
        return stream.writable().await;
    }
    match tokio::time::timeout(timeout, stream.writable()).await {
        Ok(r) => r,
        Err(_) => {
            let sock = socket2::SockRef::from(stream);
            let _ = sock.set_linger(Some(Duration::ZERO));
            // Also wakes anything else waiting on the socket (the other
            // direction of a tunnel, a lingering close) at once.
            let _ = sock.shutdown(std::net::Shutdown::Both);
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer accepted no data for {}", humantime::format_duration(timeout)),
            ))
        }
    }
}

/// Writes all of `data`; fails with `TimedOut` (and aborts the connection)
/// when the peer accepts no bytes for `timeout`.
pub async fn write_all(stream: &ClientStream, data: &[u8], timeout: Duration) -> io::Result<()> {
    match stream {
        ClientStream::Plain(s) => write_all_tcp(s, data, timeout).await,
        ClientStream::Tls(t) => t.write_all(&[data], false, timeout).await,
    }
}

/// [`write_all`] on plain TCP.
async fn write_all_tcp(stream: &TcpStream, mut data: &[u8], timeout: Duration) -> io::Result<()> {
    while !data.is_empty() {
        match stream.try_write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable_within(stream, timeout).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of the given slices, in order, with as few syscalls as the
/// kernel allows (a response head and its first body bytes go out in one);
/// fails with `TimedOut` as [`write_all`] does.
pub async fn write_all_vectored(stream: &ClientStream, parts: &[&[u8]], timeout: Duration) -> io::Result<()> {
    write_parts(stream, parts, false, timeout).await
}

/// [`write_all_vectored`] for the last bytes the connection will carry:
/// over TLS the close_notify alert leaves in the same write (on plain TCP
/// the close that follows is the FIN).
pub async fn write_all_vectored_last(stream: &ClientStream, parts: &[&[u8]], timeout: Duration) -> io::Result<()> {
    write_parts(stream, parts, true, timeout).await
}

async fn write_parts(stream: &ClientStream, parts: &[&[u8]], last: bool, timeout: Duration) -> io::Result<()> {
    match stream {
        ClientStream::Plain(s) => write_all_vectored_tcp(s, parts, timeout).await,
        // One TLS record layer call: the head and the first body bytes
        // still leave in as few records (and syscalls) as rustls makes.
        ClientStream::Tls(t) => t.write_all(parts, last, timeout).await,
    }
}

/// [`write_all_vectored`] on plain TCP.
async fn write_all_vectored_tcp(stream: &TcpStream, parts: &[&[u8]], timeout: Duration) -> io::Result<()> {
    let mut idx = 0; // first slice not completely written
    let mut off = 0; // bytes of parts[idx] already written
    while idx < parts.len() {
        if parts[idx].len() == off {
            idx += 1;
            off = 0;
            continue;
        }
        let mut slices = [IoSlice::new(&[]); 8];
        let mut count = 0;
        for (k, part) in parts[idx..].iter().enumerate().take(slices.len()) {
            slices[k] = IoSlice::new(if k == 0 { &part[off..] } else { part });
            count = k + 1;
        }
        match stream.try_write_vectored(&slices[..count]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(mut n) => {
                while n > 0 && idx < parts.len() {
                    let left = parts[idx].len() - off;
                    if n >= left {
                        n -= left;
                        idx += 1;
                        off = 0;
                    } else {
                        off += n;
                        n = 0;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable_within(stream, timeout).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `data` with `MSG_MORE`: the kernel holds the last partial
/// segment for what follows (a body sent with [`sendfile_all`]), so a
/// response head and a small body leave in one packet, as nginx's
/// `tcp_nopush` does, without `TCP_CORK`'s extra system calls. Fails with
/// `TimedOut` as [`write_all`] does.
pub(super) async fn send_more(stream: &TcpStream, mut data: &[u8], timeout: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    while !data.is_empty() {
        let r = stream.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: `data` is valid for reads of its length during the
            // call; the descriptor belongs to `stream`, open while borrowed.
            let n = unsafe {
                libc::send(
                    stream.as_raw_fd(),
                    data.as_ptr().cast(),
                    data.len(),
                    libc::MSG_MORE | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable_within(stream, timeout).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` with `sendfile(2)`: from the
/// page cache to the socket without passing through user space. A file
/// shorter than that fails with `UnexpectedEof`; a client that takes
/// nothing for `timeout`, with `TimedOut` as [`write_all`]. `sent` grows
/// by each call's bytes, so a failure part-way says how many went.
pub(super) async fn sendfile_all(
    stream: &TcpStream,
    file: &std::fs::File,
    mut offset: u64,
    mut len: u64,
    timeout: Duration,
    sent: &mut u64,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    while len > 0 {
        let chunk = len.min(1 << 30) as usize;
        let mut off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset out of range"))?;
        let r = stream.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the call (owned by
            // `stream` and `file`, borrowed here); `off` is a valid,
            // exclusively borrowed off_t the kernel updates.
            let n = unsafe { libc::sendfile(stream.as_raw_fd(), file.as_raw_fd(), &mut off, chunk) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "cached file shorter than its body",
                ));
            }
            Ok(n) => {
                offset += n as u64;
                len -= n as u64;
                *sent += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => writable_within(stream, timeout).await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
