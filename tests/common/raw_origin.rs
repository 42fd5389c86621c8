//! Origins that speak raw TCP: hand-framed responses and a blackhole.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A TCP server that hands each accepted connection to a closure, for
/// malformed or hand-framed responses. Stops (closing connections) on Drop.
pub struct RawOrigin {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl RawOrigin {
    /// Starts the server; `handler` runs once per connection.
    ///
    /// ```ignore
    /// let o = RawOrigin::start(|mut s| async move {
    ///     read_request_head(&mut s).await;
    ///     s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").await.unwrap();
    /// }).await;
    /// ```
    pub async fn start<F, Fut>(handler: F) -> RawOrigin
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("raw origin: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("raw origin: local_addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                while conns.try_join_next().is_some() {}
                counter.fetch_add(1, Ordering::SeqCst);
                conns.spawn(handler(stream));
            }
        });
        RawOrigin {
            addr,
            connections,
            task,
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Number of connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RawOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An origin that accepts TCP connections, reads and discards whatever
/// arrives, and never answers (for upstream-timeout / 504 tests).
pub struct Blackhole(RawOrigin);

impl Blackhole {
    /// Starts the blackhole.
    pub async fn start() -> Blackhole {
        Blackhole(
            RawOrigin::start(|mut stream| async move {
                let mut sink = [0u8; 16 * 1024];
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                // Peer closed: keep silent until the blackhole is dropped.
                std::future::pending::<()>().await;
            })
            .await,
        )
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// Number of connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.0.connections()
    }
}

/// Reads from `stream` until the end of a request head (`\r\n\r\n`) and
/// returns everything read, which may include the start of the body.
/// Returns what it has if the peer closes first.
pub async fn read_request_head(stream: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut tmp).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    buf
}

/// Encodes a chunked body (chunks, last chunk, trailers, final CRLF) for
/// hand-framed responses. Empty chunks are skipped (they would end the body).
pub fn chunked_body(chunks: &[&[u8]], trailers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in chunks.iter().filter(|c| !c.is_empty()) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}
