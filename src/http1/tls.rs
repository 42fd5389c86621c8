//! The TLS record layer of an established client connection, readiness
//! based like the plain reads and writes of `io`, on a shared reference:
//! the request-body reader and the response writer of one exchange (and
//! the two directions of a CONNECT tunnel) use the one connection at once.
//!
//! The handshake is driven here too ([`accept`]), on the same state: its
//! rustls state is kept behind a mutex that is
//! only ever held for one non-blocking step (never across an `await`, which
//! the compiler enforces: the guard is not `Send`), so the two users never
//! wait on each other for longer than a decryption or encryption.

use bytes::BytesMut;
use rustls::Connection;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// An established TLS connection with a client (or, for a `CONNECT`
/// tunnel through a parent proxy reached over TLS, with that parent: the
/// record layer is the same on both sides).
pub struct TlsConn {
    tcp: TcpStream,
    conn: Mutex<Connection>,
}

/// Why a handshake failed, as the statistics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// Not TLS, or TLS Portico does not speak (version, cipher suites):
    /// plain HTTP sent to a TLS port lands here.
    Protocol,
    /// The client refused Portico's certificate (an alert saying so).
    Certificate,
    /// The handshake did not complete within `limits.header_timeout`.
    Timeout,
    /// The client closed the connection, or another I/O error.
    Other,
}

/// Runs the server side of a TLS handshake on `tcp`, within `timeout`.
pub async fn accept(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    timeout: Duration,
) -> Result<TlsConn, HandshakeFailure> {
    let conn = rustls::ServerConnection::new(config).map_err(|_| HandshakeFailure::Other)?;
    let tls = TlsConn {
        tcp,
        conn: Mutex::new(Connection::Server(conn)),
    };
    match tokio::time::timeout(timeout, tls.handshake()).await {
        Err(_) => Err(HandshakeFailure::Timeout),
        Ok(r) => r.map(|()| tls),
    }
}

/// The coarse reason of a failed handshake.
fn classify(e: &rustls::Error) -> HandshakeFailure {
    use rustls::{AlertDescription as A, Error as E};
    match e {
        E::AlertReceived(
            A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::AccessDenied,
        )
        | E::InvalidCertificate(_)
        | E::NoCertificatesPresented => HandshakeFailure::Certificate,
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. }
        | E::PeerIncompatible(_)
        | E::PeerMisbehaved(_)
        | E::NoApplicationProtocol
        | E::DecryptError
        | E::AlertReceived(_) => HandshakeFailure::Protocol,
        _ => HandshakeFailure::Other,
    }
}

/// What [`TlsConn::read_waiting`] found.
enum Waiting {
    /// Decrypted bytes to read.
    Plaintext,
    /// The client closed: close_notify, or the TCP connection.
    Closed,
    /// A record rustls refused (it has queued an alert saying why).
    Broken(rustls::Error),
    /// The socket failed.
    Failed(io::Error),
    /// Nothing more is waiting.
    Nothing,
}

/// `Read` and `Write` on a shared tokio `TcpStream` for rustls, used only
/// inside `try_io` (which turns `WouldBlock` into "wait for readiness").
struct Sock<'a>(&'a TcpStream);

impl Read for Sock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*socket2::SockRef::from(self.0)).read(buf)
    }
}

impl Write for Sock<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*socket2::SockRef::from(self.0)).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        (&*socket2::SockRef::from(self.0)).write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl TlsConn {
    /// Drives a server handshake to its end: each flight rustls queues is
    /// sent before the client's next one is read, except what it queues
    /// with the last step: TLS 1.3's session tickets (and, in a full TLS
    /// 1.2 handshake, the server's last flight). Those leave with the first
    /// response, or before the connection first waits for the client
    /// ([`TlsConn::plaintext_or_flushed`], [`TlsConn::read_buf`]). A client
    /// whose request follows its Finished at once (a resumed connection
    /// with `Connection: close`, the common case) gets tickets, response and
    /// all in one write: two system calls and packets fewer than sending
    /// the tickets on their own.
    async fn handshake(&self) -> Result<(), HandshakeFailure> {
        loop {
            // This step's flight first: the client waits for it.
            loop {
                let sent = {
                    let mut conn = self.lock();
                    if !conn.is_handshaking() {
                        return Ok(());
                    }
                    self.flush_now(&mut conn).map_err(|_| HandshakeFailure::Other)?
                };
                if sent {
                    break;
                }
                self.tcp.writable().await.map_err(|_| HandshakeFailure::Other)?;
            }
            let wait = {
                let mut conn = self.lock();
                match self
                    .tcp
                    .try_io(Interest::READABLE, || conn.read_tls(&mut Sock(&self.tcp)))
                {
                    // The client left mid-handshake.
                    Ok(0) => return Err(HandshakeFailure::Other),
                    Ok(_) => {
                        // The client's Finished is processed here: the
                        // tickets rustls sends after it are capped once
                        // the ClientHello has said the handshake resumes.
                        let resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                        let step = crate::tls_resume::one_ticket_if_resumed(resumed, || conn.process_new_packets());
                        if let Err(e) = step {
                            // rustls has queued an alert saying why.
                            let _ = self.flush_now(&mut conn);
                            return Err(classify(&e));
                        }
                        false
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
                    Err(_) => return Err(HandshakeFailure::Other),
                }
            };
            if wait {
                self.tcp.readable().await.map_err(|_| HandshakeFailure::Other)?;
            }
        }
    }

    /// Before a wait for the client: reads the records already waiting on
    /// the socket, and when they hold no decrypted bytes, sends what rustls
    /// has queued (see [`TlsConn::handshake`]), so that nothing the client
    /// may be waiting for stays unsent while the connection waits. True
    /// when decrypted bytes are waiting, or the client has closed (the read
    /// that follows says which).
    pub async fn plaintext_or_flushed(&self) -> io::Result<bool> {
        loop {
            {
                let mut conn = self.lock();
                match self.read_waiting(&mut conn) {
                    Waiting::Plaintext | Waiting::Closed => return Ok(true),
                    Waiting::Broken(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
                    Waiting::Failed(e) => return Err(e),
                    Waiting::Nothing => {}
                }
                if self.flush_now(&mut conn)? {
                    return Ok(false);
                }
            }
            self.tcp.writable().await?;
        }
    }

    /// Reads the records waiting on the socket into rustls, without
    /// waiting, and processes them, until decrypted bytes are there, the
    /// client has closed, or nothing more is waiting.
    fn read_waiting(&self, conn: &mut Connection) -> Waiting {
        loop {
            match conn.process_new_packets() {
                Err(e) => return Waiting::Broken(e),
                Ok(s) if s.peer_has_closed() => return Waiting::Closed,
                Ok(s) if s.plaintext_bytes_to_read() > 0 => return Waiting::Plaintext,
                Ok(_) => {}
            }
            match self
                .tcp
                .try_io(Interest::READABLE, || conn.read_tls(&mut Sock(&self.tcp)))
            {
                Ok(0) => return Waiting::Closed,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Waiting::Nothing,
                Err(e) => return Waiting::Failed(e),
            }
        }
    }

    /// Sends everything rustls has queued, waiting for the socket as needed.
    async fn flush_queued(&self) -> io::Result<()> {
        while !self.flush_now(&mut self.lock())? {
            self.tcp.writable().await?;
        }
        Ok(())
    }

    /// The client side of an established TLS connection (its handshake
    /// done by tokio-rustls), to a parent proxy: a `CONNECT` tunnel through
    /// it is relayed with the same record layer as a client's.
    pub fn from_client(tcp: TcpStream, conn: rustls::ClientConnection) -> TlsConn {
        TlsConn {
            tcp,
            conn: Mutex::new(Connection::Client(conn)),
        }
    }

    /// Whether the handshake resumed an earlier session (a ticket or a
    /// cached session) rather than doing a full one.
    pub fn resumed(&self) -> bool {
        self.lock().handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    }

    /// The TCP connection underneath (addresses, socket options, shutdown).
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves rustls's state as it was
        // between two calls: take it over.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends what rustls has queued (records, alerts) without waiting:
    /// true when nothing is left.
    fn flush_now(&self, conn: &mut Connection) -> io::Result<bool> {
        while conn.wants_write() {
            match self
                .tcp
                .try_io(Interest::WRITABLE, || conn.write_tls(&mut Sock(&self.tcp)))
            {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Decrypted bytes, at most `room` of them, handed to `put` as rustls
    /// holds them (one slice per record's plaintext), without waiting:
    /// `WouldBlock` when the socket must become readable first, 0 at the
    /// end of the stream (close_notify, or the client closed the TCP
    /// connection). Nothing is zeroed first, as reading into a slice of
    /// spare capacity would need: the HTTP/2 reader's was up to 8 KiB a
    /// read (a tenth of an h2 hit's instructions).
    fn try_read_with(&self, room: usize, mut put: impl FnMut(&[u8])) -> io::Result<usize> {
        use std::io::BufRead;
        let mut conn = self.lock();
        loop {
            let mut reader = conn.reader();
            let mut taken = 0;
            while taken < room {
                match reader.fill_buf() {
                    Ok(chunk) if !chunk.is_empty() => {
                        let n = chunk.len().min(room - taken);
                        put(&chunk[..n]);
                        reader.consume(n);
                        taken += n;
                    }
                    // close_notify, after whatever preceded it.
                    Ok(_) => return Ok(taken),
                    // No more for now (or the end, which the next read
                    // reports): what was taken is the answer.
                    Err(_) if taken > 0 => return Ok(taken),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // The client closed without close_notify: for HTTP/1 the
                    // message framing says whether anything was cut short.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) => return Err(e),
                }
            }
            if taken > 0 || room == 0 {
                return Ok(taken);
            }
            let read = self
                .tcp
                .try_io(Interest::READABLE, || conn.read_tls(&mut Sock(&self.tcp)))?;
            if read == 0 {
                return Ok(0);
            }
            if let Err(e) = conn.process_new_packets() {
                // rustls has queued an alert saying why: send it if we can.
                let _ = self.flush_now(&mut conn);
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            // Anything the records asked for (a key update's answer).
            let _ = self.flush_now(&mut conn)?;
        }
    }

    /// Reads whatever is available into `buf` (growing it by up to
    /// `chunk` bytes); 0 at end of stream.
    pub async fn read_buf(&self, buf: &mut BytesMut, chunk: usize) -> io::Result<usize> {
        loop {
            if buf.capacity() - buf.len() < 512 {
                buf.reserve(chunk);
            }
            // At most `chunk` bytes, and never more than the spare
            // capacity: a read never moves the buffer.
            let room = (buf.capacity() - buf.len()).min(chunk.max(512));
            match self.try_read_with(room, |plain| buf.extend_from_slice(plain)) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Nothing queued may wait on the client's next bytes.
                    self.flush_queued().await?;
                    self.tcp.readable().await?
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the client has closed, without waiting and without taking
    /// any decrypted bytes: records waiting on the socket are read into
    /// rustls and processed. `Ok(true)`: closed (close_notify, the TCP
    /// connection closed, or a broken record); `Ok(false)`: the client is
    /// there and has sent data (a pipelined request, a body);
    /// `WouldBlock`: nothing to tell yet.
    pub fn closed_now(&self) -> io::Result<bool> {
        match self.read_waiting(&mut self.lock()) {
            Waiting::Plaintext => Ok(false),
            Waiting::Nothing => Err(io::ErrorKind::WouldBlock.into()),
            Waiting::Closed | Waiting::Broken(_) | Waiting::Failed(_) => Ok(true),
        }
    }

    /// True when rustls holds no decrypted bytes the server has not read
    /// and the records it holds are all valid (a partial record waiting for
    /// its end is not seen).
    pub fn nothing_buffered(&self) -> bool {
        self.lock()
            .process_new_packets()
            .is_ok_and(|s| s.plaintext_bytes_to_read() == 0)
    }

    /// Encrypts and sends all of `parts`, in order; fails with `TimedOut`
    /// (and aborts the connection) when the client accepts no bytes for
    /// `timeout`, as plain writes do. With `close`, the close_notify alert
    /// follows the last part in the same write: these are the last bytes
    /// of the connection (a response that ends it).
    pub async fn write_all(&self, parts: &[&[u8]], close: bool, timeout: Duration) -> io::Result<()> {
        let mut idx = 0;
        let mut off = 0;
        loop {
            {
                let mut conn = self.lock();
                // rustls buffers a bounded amount of plaintext (64 KiB by
                // default) and takes what fits; the rest after a flush.
                let mut taken = 0;
                while idx < parts.len() {
                    let n = conn.writer().write(&parts[idx][off..])?;
                    taken += n;
                    off += n;
                    if off < parts[idx].len() {
                        break;
                    }
                    idx += 1;
                    off = 0;
                }
                if taken == 0 && idx < parts.len() && !conn.wants_write() {
                    // Nothing accepted and nothing to send: rustls will not
                    // take more (the connection is closing); never spin.
                    return Err(io::ErrorKind::WriteZero.into());
                }
                if close && idx == parts.len() {
                    conn.send_close_notify();
                }
                if self.flush_now(&mut conn)? {
                    if idx == parts.len() {
                        return Ok(());
                    }
                    // All sent and more to encrypt: the buffer has room again.
                    continue;
                }
            }
            // The socket is full: wait until the client takes bytes.
            super::io::writable_within(&self.tcp, timeout).await?;
        }
    }

    /// True when ALPN chose `h2` in the handshake: the client speaks HTTP/2.
    pub fn alpn_h2(&self) -> bool {
        self.lock().alpn_protocol() == Some(b"h2")
    }

    /// Poll form of a read, for the HTTP/2 connection: what is available
    /// into `buf`'s unfilled part (left uninitialised until then).
    pub fn poll_read_buf(
        &self,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        loop {
            match self.try_read_with(buf.remaining(), |plain| buf.put_slice(plain)) {
                // What rustls holds to send goes out when the HTTP/2
                // connection's pass is over (`h2::send_pass`), not here.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self.tcp.poll_read_ready(cx) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
                r => return Poll::Ready(r.map(|_| ())),
            }
        }
    }

    /// Poll form of a vectored write, for the HTTP/2 connection: encrypts
    /// what rustls's buffer takes of `bufs` (one record for all of them,
    /// up to the record size) and leaves the sending to the end of the
    /// HTTP/2 connection's pass (`h2::send_pass`). So a pass's
    /// frames (a HEADERS frame, a DATA frame's 9-byte head, its payload,
    /// other streams' frames) leave in full records and one system call,
    /// where sending at each write cost a record and a `sendmsg` per piece:
    /// 2.8 per response in the `h2-hits` benchmark. Sends first only when
    /// rustls's buffer is full (its 64 KiB limit on unsent records);
    /// `Pending` only when the socket then takes nothing.
    pub fn poll_write_vectored_deferred(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        use std::task::Poll;
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        loop {
            {
                let mut conn = self.lock();
                let n = conn.writer().write_vectored(bufs)?;
                if n > 0 {
                    return Poll::Ready(Ok(n));
                }
                if self.flush_now(&mut conn)? {
                    // Everything sent and still nothing taken: closing.
                    let n = conn.writer().write_vectored(bufs)?;
                    return Poll::Ready(if n > 0 {
                        Ok(n)
                    } else {
                        Err(io::ErrorKind::WriteZero.into())
                    });
                }
            }
            match self.tcp.poll_write_ready(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Poll form of a flush: every encrypted byte handed to the socket.
    pub fn poll_flush_all(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        loop {
            if self.flush_now(&mut self.lock())? {
                return Poll::Ready(Ok(()));
            }
            match self.tcp.poll_write_ready(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Sends close_notify (best effort, not waiting for a slow client).
    pub fn send_close_notify(&self) {
        let mut conn = self.lock();
        conn.send_close_notify();
        let _ = self.flush_now(&mut conn);
    }
}
