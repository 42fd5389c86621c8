//! Client helpers: raw TCP requests, an HTTP/1.x response parser, curl.

use std::process::Output;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::time::{Instant, timeout_at};

/// Default time [`raw_request`] and [`RawClient`] wait for data.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `request` (one that asks to close the connection) on `s` and,
/// with `junk`, more bytes 300 ms later, once the server has read the head
/// and started writing; then reads to the end (20 s at most; panics if the
/// connection is never closed). The response, or the error that ended the
/// read with how many bytes came before it. For the lingering close: a
/// client that sends more must still get its whole response.
pub async fn close_request_then_junk<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    request: &[u8],
    junk: bool,
) -> Result<ParsedResponse, String> {
    s.write_all(request).await.expect("send");
    if junk {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.write_all(b"more bytes the client should not have sent\r\n")
            .await
            .expect("send junk");
    }
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got)).await;
    let read = read.expect("the connection was never closed");
    read.map_err(|e| format!("{e} after {} bytes", got.len()))?;
    Ok(parse_response(&got))
}

/// Connects to `addr`, writes `request`, and reads until EOF or 5 s have
/// passed; returns every byte received. Send `Connection: close` unless
/// you want to wait out the timeout.
pub async fn raw_request(addr: impl ToSocketAddrs, request: &[u8]) -> Vec<u8> {
    raw_request_timeout(addr, request, DEFAULT_TIMEOUT).await
}

/// [`raw_request`] with an explicit overall timeout.
pub async fn raw_request_timeout(addr: impl ToSocketAddrs, request: &[u8], timeout: Duration) -> Vec<u8> {
    let mut client = RawClient::connect(addr).await;
    client.timeout = timeout;
    client.send(request).await;
    client.read_to_end().await
}

/// [`raw_request`] from the local address `src` (see [`RawClient::connect_from`]).
pub async fn raw_request_from(src: std::net::IpAddr, addr: std::net::SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut client = RawClient::connect_from(src, addr).await;
    client.send(request).await;
    client.read_to_end().await
}

/// A raw TCP connection for keep-alive / pipelining tests: send bytes,
/// read one parsed response at a time.
pub struct RawClient {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
    /// Time each read call may take in total (default 5 s).
    pub timeout: Duration,
}

impl RawClient {
    /// Connects to `addr` (panics with the error if refused).
    pub async fn connect(addr: impl ToSocketAddrs) -> RawClient {
        let stream = TcpStream::connect(addr).await.expect("raw client: connect failed");
        RawClient {
            stream,
            buf: Vec::new(),
            eof: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The connection's own address (which a server sees it from).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.stream.local_addr().expect("raw client: local_addr")
    }

    /// Connects to `addr` from the local address `src` (port chosen by
    /// the system), e.g. `127.0.0.3` to be a client other than 127.0.0.1
    /// (every 127.0.0.0/8 address is local). Panics if refused.
    pub async fn connect_from(src: std::net::IpAddr, addr: std::net::SocketAddr) -> RawClient {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
        .expect("raw client: create socket");
        socket
            .bind(std::net::SocketAddr::new(src, 0))
            .unwrap_or_else(|e| panic!("raw client: bind {src}: {e}"));
        let stream = socket
            .connect(addr)
            .await
            .unwrap_or_else(|e| panic!("raw client: connect {src} -> {addr}: {e}"));
        RawClient {
            stream,
            buf: Vec::new(),
            eof: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Writes all of `bytes`.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("raw client: write failed");
    }

    /// Reads until EOF, an error (e.g. reset) or the timeout; returns all
    /// bytes not yet consumed by `read_response`.
    pub async fn read_to_end(&mut self) -> Vec<u8> {
        let deadline = Instant::now() + self.timeout;
        while !self.eof && self.fill(deadline).await {}
        std::mem::take(&mut self.buf)
    }

    /// Reads exactly one response (panics on malformed input or timeout).
    pub async fn read_response(&mut self) -> ParsedResponse {
        self.read_one(false).await
    }

    /// Reads one response to a HEAD request (no body expected).
    pub async fn read_head_response(&mut self) -> ParsedResponse {
        self.read_one(true).await
    }

    /// True once the peer has closed its side.
    pub fn is_eof(&self) -> bool {
        self.eof
    }

    async fn read_one(&mut self, head: bool) -> ParsedResponse {
        let deadline = Instant::now() + self.timeout;
        loop {
            match try_parse(&self.buf, self.eof, head) {
                Ok(Some((resp, used))) => {
                    self.buf.drain(..used);
                    return resp;
                }
                Ok(None) if !self.eof => {
                    if !self.fill(deadline).await && !self.eof {
                        panic!(
                            "raw client: timed out after {:?} waiting for a response; have {:?}",
                            self.timeout,
                            String::from_utf8_lossy(&self.buf)
                        );
                    }
                }
                Ok(None) => panic!("raw client: connection closed before any response"),
                Err(e) => panic!("{e}; bytes: {:?}", String::from_utf8_lossy(&self.buf)),
            }
        }
    }

    /// One read; false on timeout or error (sets `eof` on EOF/error).
    async fn fill(&mut self, deadline: Instant) -> bool {
        self.buf.reserve(64 * 1024);
        match timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                self.eof = true;
                false
            }
            Ok(Ok(_)) => true,
            Err(_) => false,
        }
    }
}

/// How a parsed response's body was delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body by definition (HEAD, 1xx, 204, 304).
    NoBody,
    /// `Content-Length: n`.
    ContentLength(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Delimited by connection close.
    Close,
}

/// An HTTP/1.x response split into its parts.
#[derive(Clone, Debug)]
pub struct ParsedResponse {
    /// E.g. `HTTP/1.1`.
    pub version: String,
    /// Status code.
    pub status: u16,
    /// Reason phrase (may be empty).
    pub reason: String,
    /// Header fields in wire order, names as sent, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The decoded body (chunk framing removed).
    pub body: Vec<u8>,
    /// Trailer fields of a chunked body.
    pub trailers: Vec<(String, String)>,
    /// How the body was delimited.
    pub framing: Framing,
}

impl ParsedResponse {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name).first().copied()
    }

    /// All values of header `name` (case-insensitive), in order.
    pub fn headers_all(&self, name: &str) -> Vec<&str> {
        find(&self.headers, name)
    }

    /// First value of trailer `name` (case-insensitive).
    pub fn trailer(&self, name: &str) -> Option<&str> {
        find(&self.trailers, name).first().copied()
    }

    /// The body as (lossy) UTF-8.
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn find<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Parses the first response in `bytes` (the end of `bytes` counts as the
/// connection closing). Panics with a description if malformed or truncated.
/// Bytes after the first response are ignored; see [`parse_responses`].
pub fn parse_response(bytes: &[u8]) -> ParsedResponse {
    parse_all(bytes, false, true).remove(0)
}

/// Reads a response head (up to the blank line) off `s`, leaving what
/// follows unread in the socket except for bytes that came with the head,
/// which are returned too. Panics if no whole head comes within 10 s or
/// the connection ends first.
pub async fn read_response_head(s: &mut TcpStream) -> (ParsedResponse, Vec<u8>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = parse_head_response(&buf[..end + 4]);
            return (head, buf[end + 4..].to_vec());
        }
        match timeout_at(deadline, s.read(&mut tmp)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&tmp[..n]),
            other => panic!("no response head ({other:?}); have {:?}", String::from_utf8_lossy(&buf)),
        }
    }
}

/// [`parse_response`] for the answer to a HEAD request (no body read).
pub fn parse_head_response(bytes: &[u8]) -> ParsedResponse {
    parse_all(bytes, true, true).remove(0)
}

/// Parses every response in `bytes` (keep-alive / pipelining, or a 1xx
/// followed by the final response). Panics on malformed or trailing bytes.
pub fn parse_responses(bytes: &[u8]) -> Vec<ParsedResponse> {
    parse_all(bytes, false, false)
}

fn parse_all(bytes: &[u8], head: bool, first_only: bool) -> Vec<ParsedResponse> {
    let mut out = Vec::new();
    let mut rest = bytes;
    loop {
        match try_parse(rest, true, head) {
            Ok(Some((resp, used))) => {
                out.push(resp);
                rest = &rest[used..];
            }
            Ok(None) => panic!("parse_response: no response in {} bytes", bytes.len()),
            Err(e) => panic!(
                "{e}; {} bytes: {:?}",
                bytes.len(),
                String::from_utf8_lossy(shown(bytes))
            ),
        }
        if first_only || rest.is_empty() {
            return out;
        }
    }
}

/// The first 4 KiB of `bytes`: enough to see a head in a failure message
/// without printing a whole large body.
fn shown(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len().min(4096)]
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?.windows(2).position(|w| w == b"\r\n").map(|p| from + p)
}

fn parse_field(line: &[u8]) -> Result<(String, String), String> {
    let line = std::str::from_utf8(line).map_err(|_| format!("non-UTF-8 field {line:?}"))?;
    if line.starts_with([' ', '\t']) {
        return Err(format!("obsolete line folding: {line:?}"));
    }
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| format!("field without colon: {line:?}"))?;
    Ok((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()))
}

/// Ok(None): need more bytes. With `eof`, missing bytes are an error.
fn try_parse(buf: &[u8], eof: bool, head: bool) -> Result<Option<(ParsedResponse, usize)>, String> {
    let incomplete = |what: &str| {
        if eof {
            Err(format!("parse_response: truncated {what}"))
        } else {
            Ok(None)
        }
    };
    if buf.is_empty() && eof {
        return Ok(None);
    }
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return incomplete("response head");
    };
    let head_text =
        std::str::from_utf8(&buf[..head_end]).map_err(|_| "parse_response: non-UTF-8 response head".to_owned())?;
    let mut lines = head_text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default().to_owned();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|_| version.starts_with("HTTP/1."))
        .ok_or_else(|| format!("parse_response: bad status line {status_line:?}"))?;
    let reason = parts.next().unwrap_or_default().to_owned();
    let headers = lines
        .map(|l| parse_field(l.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut resp = ParsedResponse {
        version,
        status,
        reason,
        headers,
        body: Vec::new(),
        trailers: Vec::new(),
        framing: Framing::NoBody,
    };
    let start = head_end + 4;
    let te = resp.headers_all("transfer-encoding").join(",");
    let last_coding = te.rsplit(',').next().unwrap_or_default().trim();
    let lengths = resp.headers_all("content-length");

    if head || status < 200 || status == 204 || status == 304 {
        return Ok(Some((resp, start)));
    }
    if last_coding.eq_ignore_ascii_case("chunked") {
        resp.framing = Framing::Chunked;
        // Chunk data ranges; copied only once the body is complete, so
        // re-parsing a growing buffer stays cheap.
        let mut ranges = Vec::new();
        let mut pos = start;
        loop {
            let Some(line_end) = find_crlf(buf, pos) else {
                return incomplete("chunked body");
            };
            let size_line = String::from_utf8_lossy(&buf[pos..line_end]);
            let size_hex = size_line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_hex, 16)
                .map_err(|_| format!("parse_response: bad chunk size line {size_line:?}"))?;
            pos = line_end + 2;
            if size == 0 {
                loop {
                    let Some(end) = find_crlf(buf, pos) else {
                        return incomplete("chunked trailers");
                    };
                    let line = &buf[pos..end];
                    pos = end + 2;
                    if line.is_empty() {
                        for (from, to) in ranges {
                            resp.body.extend_from_slice(&buf[from..to]);
                        }
                        return Ok(Some((resp, pos)));
                    }
                    resp.trailers.push(parse_field(line)?);
                }
            }
            if buf.len() < pos + size + 2 {
                return incomplete("chunk data");
            }
            if &buf[pos + size..pos + size + 2] != b"\r\n" {
                return Err(format!("parse_response: chunk of {size} bytes not followed by CRLF"));
            }
            ranges.push((pos, pos + size));
            pos += size + 2;
        }
    }
    if te.is_empty() && !lengths.is_empty() {
        let len: u64 = lengths[0]
            .parse()
            .map_err(|_| format!("parse_response: bad Content-Length {:?}", lengths[0]))?;
        if lengths.iter().any(|l| *l != lengths[0]) {
            return Err(format!("parse_response: conflicting Content-Length {lengths:?}"));
        }
        resp.framing = Framing::ContentLength(len);
        let end = start + len as usize;
        if buf.len() < end {
            return incomplete(&format!("body: Content-Length {len}, got {}", buf.len() - start));
        }
        resp.body = buf[start..end].to_vec();
        return Ok(Some((resp, end)));
    }
    if !eof {
        return Ok(None);
    }
    resp.framing = Framing::Close;
    resp.body = buf[start..].to_vec();
    Ok(Some((resp, buf.len())))
}

/// Runs `curl -q -s -S --max-time 30 <args>` (from PATH) with proxy
/// environment variables cleared, and returns its output.
pub async fn curl(args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-q", "-s", "-S", "--max-time", "30"]).args(args);
    for var in [
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd.output()
        .await
        .expect("failed to run curl (is /usr/bin/curl installed?)")
}

/// Parses the responses in `bytes` (the end of `bytes` counting as the
/// connection closing) up to the first truncated or malformed one; returns
/// those parsed and what stopped the parse (None when every byte was used).
pub fn parse_responses_lenient(bytes: &[u8]) -> (Vec<ParsedResponse>, Option<String>) {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        match try_parse(rest, true, false) {
            Ok(Some((resp, used))) => {
                out.push(resp);
                rest = &rest[used..];
            }
            Ok(None) => return (out, Some("no response".into())),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// Sends `CONNECT target` (plus `headers`, each line ending in CRLF) and
/// reads the answer's head; returns it as text with the still-open stream
/// (for the tunnel's bytes after a 200). Panics after 5 s without a head.
pub async fn connect_tunnel(addr: std::net::SocketAddr, target: &str, headers: &str) -> (String, TcpStream) {
    let mut s = TcpStream::connect(addr).await.expect("connect to portico");
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{headers}\r\n");
    s.write_all(req.as_bytes()).await.expect("send CONNECT");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("CONNECT answered in time")
            .expect("read CONNECT answer");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    (String::from_utf8_lossy(&got).into_owned(), s)
}
