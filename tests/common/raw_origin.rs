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

/// One message as a [`RecordingOrigin`] read it off the wire.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Which connection it came on: 0 for the first accepted, and so on.
    pub conn: usize,
    /// The request line, without its CRLF.
    pub line: String,
    /// Header fields in wire order: names as sent, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body, chunk framing removed.
    pub body: Vec<u8>,
    /// Trailer fields of a chunked body.
    pub trailers: Vec<(String, String)>,
    /// Every byte of the message exactly as received (head and framed body).
    pub raw: Vec<u8>,
    /// Why the bytes are not a message a strict RFC 9112 parser accepts
    /// (`"incomplete"` when the connection ended mid-message); None for a
    /// well-framed message.
    pub error: Option<String>,
}

impl Recorded {
    /// All values of header `name` (case-insensitive), in order.
    pub fn headers_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The request target (second word of the request line).
    pub fn target(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or("")
    }

    /// A one-line summary of the message boundaries: the request line, then
    /// every `Content-Length` and `Transfer-Encoding` line as sent (and
    /// look-alikes spelt with `_`), the
    /// body (decoded) and any trailers, joined by `" | "`; `Host` too when
    /// it is not `default_host`. A message that is not well framed shows
    /// as `!<why>`.
    pub fn view(&self, default_host: &str) -> String {
        if let Some(e) = &self.error {
            return format!("!{e}");
        }
        let mut parts = vec![self.line.clone()];
        for (k, v) in &self.headers {
            // `Transfer_Encoding` too: some servers read `_` as `-`.
            let lower = k.to_ascii_lowercase().replace('_', "-");
            let shown = match lower.as_str() {
                "content-length" | "transfer-encoding" => true,
                "host" => v != default_host,
                _ => false,
            };
            if shown {
                parts.push(format!("{k}: {v}"));
            }
        }
        if !self.body.is_empty() {
            parts.push(String::from_utf8_lossy(&self.body).into_owned());
        }
        for (k, v) in &self.trailers {
            parts.push(format!("trailer {k}: {v}"));
        }
        parts.join(" | ")
    }
}

/// What a [`RecordingOrigin`] script answers to one request.
pub struct Reply {
    /// The raw response bytes.
    pub bytes: Vec<u8>,
    /// Close the connection after sending them.
    pub close: bool,
}

type Script = dyn Fn(&Recorded) -> Option<Reply> + Send + Sync;

/// An origin that reads requests with a strict RFC 9112 parser of its own
/// (CRLF only, one canonical `Content-Length` or `Transfer-Encoding:
/// chunked`, never both, plain chunk-size lines) and records every message
/// it reads, with the exact bytes. Anything else is recorded as an error
/// and its connection closed: so a test sees exactly the message
/// boundaries an origin sees. It answers each request with a script's
/// reply, or by default `200` with the request line as the body.
pub struct RecordingOrigin {
    origin: RawOrigin,
    log: Arc<std::sync::Mutex<Vec<Recorded>>>,
    mid_message: Arc<AtomicUsize>,
}

impl RecordingOrigin {
    /// Starts an origin that answers every request with the default reply.
    pub async fn start() -> RecordingOrigin {
        Self::scripted(|_| None).await
    }

    /// Starts an origin whose `script` may answer a request itself (None:
    /// the default reply).
    pub async fn scripted(script: impl Fn(&Recorded) -> Option<Reply> + Send + Sync + 'static) -> RecordingOrigin {
        let log: Arc<std::sync::Mutex<Vec<Recorded>>> = Arc::default();
        let mid_message = Arc::new(AtomicUsize::new(0));
        let next_conn = Arc::new(AtomicUsize::new(0));
        let script: Arc<Script> = Arc::new(script);
        let (l, m) = (log.clone(), mid_message.clone());
        let origin = RawOrigin::start(move |stream| {
            let conn = next_conn.fetch_add(1, Ordering::SeqCst);
            record_connection(stream, conn, l.clone(), m.clone(), script.clone())
        })
        .await;
        RecordingOrigin {
            origin,
            log,
            mid_message,
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.origin.addr()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.origin.connections()
    }

    /// Every message recorded so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().expect("recording origin log").clone()
    }

    /// Removes and returns every message recorded so far, once no
    /// connection holds part of a message (waiting up to 3 s for it, so a
    /// message cut off by the proxy is recorded as incomplete first).
    pub async fn take(&self) -> Vec<Recorded> {
        for _ in 0..300 {
            if self.mid_message.load(Ordering::SeqCst) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        std::mem::take(&mut *self.log.lock().expect("recording origin log"))
    }
}

/// Reads, records and answers messages on one connection until it ends or
/// a message is not well framed.
async fn record_connection(
    mut stream: TcpStream,
    conn: usize,
    log: Arc<std::sync::Mutex<Vec<Recorded>>>,
    mid_message: Arc<AtomicUsize>,
    script: Arc<Script>,
) {
    use tokio::io::AsyncWriteExt;
    let mut buf: Vec<u8> = Vec::new();
    let mut tmp = [0u8; 16 * 1024];
    let record = |rec: Recorded| log.lock().expect("recording origin log").push(rec);
    let failed = |raw: &[u8], why: String| Recorded {
        conn,
        line: String::new(),
        headers: Vec::new(),
        body: Vec::new(),
        trailers: Vec::new(),
        raw: raw.to_vec(),
        error: Some(why),
    };
    loop {
        match strict_message(&buf) {
            Ok(Some((mut rec, used))) => {
                buf.drain(..used);
                if buf.is_empty() {
                    mid_message.fetch_sub(1, Ordering::SeqCst);
                }
                rec.conn = conn;
                let reply = script(&rec).unwrap_or_else(|| {
                    let body = if rec.line.starts_with("HEAD ") {
                        String::new()
                    } else {
                        rec.line.clone()
                    };
                    Reply {
                        bytes: format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", rec.line.len())
                            .into_bytes(),
                        close: false,
                    }
                });
                record(rec);
                if stream.write_all(&reply.bytes).await.is_err() || reply.close {
                    if !buf.is_empty() {
                        mid_message.fetch_sub(1, Ordering::SeqCst);
                    }
                    return;
                }
            }
            Ok(None) => {
                let n = stream.read(&mut tmp).await.unwrap_or_default();
                if n == 0 {
                    if !buf.is_empty() {
                        record(failed(&buf, "incomplete".into()));
                        mid_message.fetch_sub(1, Ordering::SeqCst);
                    }
                    return;
                }
                if buf.is_empty() {
                    mid_message.fetch_add(1, Ordering::SeqCst);
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            Err(why) => {
                record(failed(&buf, why));
                mid_message.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        }
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Position just past the first CRLF at or after `from`, refusing a bare
/// CR or LF before it.
fn strict_line_end(buf: &[u8], from: usize) -> Result<Option<usize>, String> {
    for i in from..buf.len() {
        match buf[i] {
            b'\n' => return Err("bare LF".into()),
            b'\r' => {
                return match buf.get(i + 1) {
                    Some(b'\n') => Ok(Some(i + 2)),
                    Some(_) => Err("bare CR".into()),
                    None => Ok(None),
                };
            }
            _ => {}
        }
    }
    Ok(None)
}

/// Header fields in wire order, as (name, trimmed value).
type Fields = Vec<(String, String)>;

/// Header lines from `pos` up to the empty line; returns them and the
/// position after the empty line.
fn strict_fields(buf: &[u8], mut pos: usize) -> Result<Option<(Fields, usize)>, String> {
    let mut fields = Vec::new();
    loop {
        let Some(end) = strict_line_end(buf, pos)? else {
            return Ok(None);
        };
        let line = &buf[pos..end - 2];
        pos = end;
        if line.is_empty() {
            return Ok(Some((fields, pos)));
        }
        let colon = line.iter().position(|&b| b == b':').ok_or("field without colon")?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(format!("invalid field name {:?}", String::from_utf8_lossy(name)));
        }
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err("control byte in a field value".into());
        }
        let value = String::from_utf8_lossy(value).trim_matches([' ', '\t']).to_string();
        fields.push((String::from_utf8_lossy(name).into_owned(), value));
    }
}

/// One strictly parsed message at the start of `buf`: Ok(None) if more
/// bytes are needed.
fn strict_message(buf: &[u8]) -> Result<Option<(Recorded, usize)>, String> {
    if buf.is_empty() {
        return Ok(None);
    }
    let Some(line_end) = strict_line_end(buf, 0)? else {
        return Ok(None);
    };
    let line = String::from_utf8(buf[..line_end - 2].to_vec()).map_err(|_| "request line not UTF-8")?;
    let words: Vec<&str> = line.split(' ').collect();
    let valid = words.len() == 3
        && !words[0].is_empty()
        && words[0].bytes().all(is_tchar)
        && !words[1].is_empty()
        && words[1].bytes().all(|b| b.is_ascii_graphic())
        && (words[2] == "HTTP/1.1" || words[2] == "HTTP/1.0");
    if !valid {
        return Err(format!("invalid request line {line:?}"));
    }
    let Some((headers, head_end)) = strict_fields(buf, line_end)? else {
        return Ok(None);
    };
    let mut rec = Recorded {
        conn: 0,
        line,
        headers,
        body: Vec::new(),
        trailers: Vec::new(),
        raw: Vec::new(),
        error: None,
    };
    let te = rec.headers_all("transfer-encoding");
    let cl = rec.headers_all("content-length");
    let end = match (te.as_slice(), cl.as_slice()) {
        ([], []) => head_end,
        ([_, ..], [_, ..]) => return Err("both Transfer-Encoding and Content-Length".into()),
        ([te], []) if te.eq_ignore_ascii_case("chunked") => {
            let mut pos = head_end;
            loop {
                let Some(size_end) = strict_line_end(buf, pos)? else {
                    return Ok(None);
                };
                let size_line = &buf[pos..size_end - 2];
                if size_line.is_empty() || size_line.len() > 15 || !size_line.iter().all(u8::is_ascii_hexdigit) {
                    return Err(format!(
                        "invalid chunk-size line {:?}",
                        String::from_utf8_lossy(size_line)
                    ));
                }
                let size = usize::from_str_radix(std::str::from_utf8(size_line).unwrap_or("x"), 16)
                    .map_err(|_| "invalid chunk size")?;
                pos = size_end;
                if size == 0 {
                    let Some((trailers, after)) = strict_fields(buf, pos)? else {
                        return Ok(None);
                    };
                    rec.trailers = trailers;
                    break after;
                }
                if buf.len() < pos + size + 2 {
                    return Ok(None);
                }
                if &buf[pos + size..pos + size + 2] != b"\r\n" {
                    return Err("chunk data not followed by CRLF".into());
                }
                rec.body.extend_from_slice(&buf[pos..pos + size]);
                pos += size + 2;
            }
        }
        ([te, ..], []) => return Err(format!("Transfer-Encoding {te:?} (not exactly one chunked)")),
        ([], [cl]) => {
            let canonical =
                !cl.is_empty() && cl.bytes().all(|b| b.is_ascii_digit()) && (*cl == "0" || !cl.starts_with('0'));
            let n: usize = cl
                .parse()
                .ok()
                .filter(|_| canonical)
                .ok_or_else(|| format!("non-canonical Content-Length {cl:?}"))?;
            if buf.len() < head_end + n {
                return Ok(None);
            }
            rec.body = buf[head_end..head_end + n].to_vec();
            head_end + n
        }
        ([], _) => return Err(format!("{} Content-Length fields", cl.len())),
    };
    rec.raw = buf[..end].to_vec();
    Ok(Some((rec, end)))
}
