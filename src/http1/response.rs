//! Writing a response to the client: the head, then the body in the framing
//! the client's version allows (Content-Length, chunked, or until close).

use super::chunked::{chunk_header, last_chunk};
use super::io::ClientStream;
use super::io::{write_all, write_all_vectored, write_all_vectored_last};
use crate::keepalive::KeepAlive;
use bytes::Bytes;
use http::header::{AGE, CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use std::io;
use std::time::Duration;

/// What the handler knows about the length of the body it will send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLen {
    /// Exactly this many bytes.
    Known(u64),
    /// Unknown until the end (streamed from an origin that sent no length).
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body may follow (HEAD, 1xx, 204, 304).
    None,
    Length,
    Chunked,
    Close,
}

/// Where a response goes: bytes on an HTTP/1 connection, or an HTTP/2
/// stream's frames (`h2`).
enum Sink<'a> {
    H1(&'a ClientStream),
    H2(Box<super::h2::H2Out>),
}

/// Writes one response to the client connection.
pub struct ResponseWriter<'a> {
    sink: Sink<'a>,
    version: Version,
    head_request: bool,
    keep_alive: bool,
    framing: Framing,
    pending_head: Option<Vec<u8>>,
    status: Option<StatusCode>,
    declared: u64,
    locations: HeaderMap,
    body_bytes: u64,
    finished: bool,
    /// Header edits of the routing rules, applied to whatever head is sent.
    edits: Vec<std::sync::Arc<crate::rules::HeaderEdits>>,
    /// `limits.send_timeout`: longest wait for the client to take bytes.
    send_timeout: Duration,
    /// Where a send timeout is counted.
    keepalive: &'a KeepAlive,
    /// A send timeout has been counted: the client is gone, and a later
    /// write that times out too (a final empty frame on an HTTP/2 stream
    /// whose window never opens) is the same event.
    timeout_counted: bool,
    /// The client sent `Expect: 100-continue` with a body and has not been
    /// told to send it yet.
    awaiting_continue: bool,
    /// A `100 Continue` has been written (Portico's own or an origin's):
    /// never a second one.
    continue_sent: bool,
    /// The client's share of `limits.client_bandwidth` and of
    /// `limits.total_bandwidth`, and the route's `bandwidth`: every body
    /// byte waits for them when a limit is set, now or by a reload while
    /// this response is sent ([`ResponseWriter::limit_bandwidth`],
    /// [`ResponseWriter::limit_route_bandwidth`]).
    meter: crate::client_bandwidth::Pacer,
}

/// Appends a response's status line (always HTTP/1.1: RFC 9110 2.5, our
/// own highest minor version, which HTTP/1.0 clients accept).
fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written into the end of `buf` (20 digits hold any u64).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The bytes `fields` take as field lines (name, ": ", value, CRLF).
fn fields_len<'f>(fields: impl IntoIterator<Item = (&'f HeaderName, &'f HeaderValue)>) -> usize {
    fields.into_iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum()
}

/// Appends one field line.
fn field_line(out: &mut Vec<u8>, name: &HeaderName, value: &[u8]) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A stored response's fields as [`ResponseWriter::send_stored_head`]
/// takes them.
#[derive(Debug, Clone, Copy)]
pub struct StoredLines<'f> {
    /// Field lines from [`stored_field_lines`].
    pub lines: &'f [u8],
    /// Whether the lines include `Date` (else the head gets the time now).
    pub has_date: bool,
    /// The fields the lines were written from, when they include `Location`
    /// or `Content-Location` (noted for [`ResponseWriter::sent_headers`]).
    pub locations: Option<&'f HeaderMap>,
}

/// The field lines (`name: value` CRLF) of a stored response's fields
/// that a hit's head carries as they are: every field of `base` but those
/// `skip` names and those Portico writes itself (`Age`, `Content-Length`,
/// `Transfer-Encoding`, `Connection`). Written once per stored response and
/// kept with it, they cost a hit one copy instead of a line per field.
/// Also says whether `base` has `Date`, and `Location` or
/// `Content-Location` ([`StoredLines`]).
pub fn stored_field_lines(base: &HeaderMap, skip: impl Fn(&HeaderName) -> bool) -> (Vec<u8>, bool, bool) {
    let (mut has_date, mut has_location) = (false, false);
    let mut out = Vec::with_capacity(fields_len(base));
    for (name, value) in base {
        has_date |= name == DATE;
        has_location |= name == http::header::LOCATION || name == http::header::CONTENT_LOCATION;
        if !(name == AGE || name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION || skip(name)) {
            field_line(&mut out, name, value.as_bytes());
        }
    }
    (out, has_date, has_location)
}

/// Most bytes one `sendfile_all` of an unpaced response sends before the
/// pacer is looked at again: a reload that sets a bandwidth limit paces
/// the rest of a large file from the next one on. Each `sendfile` call
/// sends at most what the socket takes, so this adds about one system
/// call per 512 KiB.
const UNPACED_SENDFILE: u64 = 512 << 10;

/// Body pieces one write of [`ResponseWriter::send_data_parts`] carries.
pub const PARTS_PER_WRITE: usize = 8;

impl<'a> ResponseWriter<'a> {
    pub(super) fn new(
        stream: &'a ClientStream,
        version: Version,
        method: &Method,
        keep_alive: bool,
        settings: &'a super::ConnSettings,
    ) -> Self {
        Self::with_sink(Sink::H1(stream), version, method, keep_alive, settings)
    }

    /// A writer for one HTTP/2 stream's response.
    pub(super) fn h2(out: super::h2::H2Out, method: &Method, settings: &'a super::ConnSettings) -> Self {
        Self::with_sink(Sink::H2(Box::new(out)), Version::HTTP_2, method, true, settings)
    }

    fn with_sink(
        sink: Sink<'a>,
        version: Version,
        method: &Method,
        keep_alive: bool,
        settings: &'a super::ConnSettings,
    ) -> Self {
        ResponseWriter {
            sink,
            version,
            head_request: *method == Method::HEAD,
            keep_alive,
            framing: Framing::None,
            pending_head: None,
            status: None,
            declared: 0,
            locations: HeaderMap::new(),
            body_bytes: 0,
            finished: false,
            edits: Vec::new(),
            send_timeout: settings.send_timeout,
            keepalive: &settings.keepalive,
            timeout_counted: false,
            awaiting_continue: false,
            continue_sent: false,
            meter: crate::client_bandwidth::Pacer::unpaced(),
        }
    }

    /// Sends this response's body at the bandwidth `limits.client_bandwidth`
    /// and `limits.total_bandwidth` leave the client at `ip` (nothing
    /// changes without a limit). `known`: where the connection's earlier
    /// response found the client's bucket ([`ResponseWriter::known_place`]).
    pub(super) fn limit_bandwidth(&mut self, ip: std::net::IpAddr, known: crate::shared_buckets::KnownPlace) {
        self.meter = crate::client_bandwidth::Pacer::new(ip, known);
    }

    /// Where this response's writes found the client's bandwidth bucket,
    /// for the connection's next response.
    pub(super) fn known_place(&self) -> crate::shared_buckets::KnownPlace {
        self.meter.known()
    }

    /// Sends this response's body at `rate` bytes a second at most, but
    /// for its first `after` bytes (the route's `bandwidth` and
    /// `bandwidth_after`), besides the client's and the total's limits;
    /// `rate` 0 lifts it.
    pub fn limit_route_bandwidth(&mut self, rate: u64, after: u64) {
        self.meter.limit_route(rate, after);
    }

    /// The client's share of the bandwidth limits, with the route's: what
    /// a tunnel on this connection sends the client goes through it.
    pub fn bandwidth(&self) -> crate::client_bandwidth::Pacer {
        self.meter.clone()
    }

    /// The most body bytes one write sends: no bound without a bandwidth
    /// limit, a piece of the lowest in force with one (the client's, the
    /// total's, the route's: [`crate::client_bandwidth::Pacer::piece`]).
    fn piece(&mut self) -> usize {
        // At least a byte: the body loops advance by it.
        self.meter.piece().map_or(usize::MAX, |p| p.max(1))
    }

    /// The HTTP/2 stream this writer answers, if it is one (CONNECT over
    /// HTTP/2 sends its `200` and then tunnels on the stream).
    pub(crate) fn h2_out(&mut self) -> Option<&mut super::h2::H2Out> {
        match &mut self.sink {
            Sink::H2(o) => Some(o),
            Sink::H1(_) => None,
        }
    }

    /// Completes when the client has gone away before its response:
    /// closed its connection (HTTP/1, see `conn::client_closed`), or reset
    /// the request's stream (HTTP/2). `body_read`, for a request whose body
    /// is being read from the connection: completes once the reader is done
    /// with it. Until then the connection's bytes are the body reader's,
    /// and the reader may have stopped a few frames ahead of the origin,
    /// so meanwhile an HTTP/1 client is watched for a hang-up behind the
    /// unread rest (`conn::hung_up`).
    pub(crate) async fn client_gone(&mut self, body_read: Option<impl std::future::Future<Output = ()>>) {
        match &mut self.sink {
            Sink::H1(stream) => {
                if let Some(read) = body_read {
                    tokio::select! {
                        () = read => {}
                        () = super::conn::hung_up(stream) => return,
                    }
                }
                super::conn::client_closed(stream).await
            }
            Sink::H2(o) => o.reset().await,
        }
    }

    /// CONNECT over HTTP/2: sends the `200` and hands over the stream's
    /// sending half, the tunnel's way to the client.
    pub(crate) fn open_h2_tunnel(&mut self) -> io::Result<h2::SendStream<Bytes>> {
        let Sink::H2(o) = &mut self.sink else {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "not an HTTP/2 stream"));
        };
        let send = o.open_tunnel()?;
        self.status = Some(StatusCode::OK);
        Ok(send)
    }

    /// `limits.send_timeout`, for bytes written to the client outside this
    /// writer (a tunnel's early bytes).
    pub fn send_timeout(&self) -> Duration {
        self.send_timeout
    }

    /// Counts a write that failed because the client took nothing for
    /// `limits.send_timeout` (the connection has been aborted).
    fn counted(&mut self, e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::TimedOut {
            self.keep_alive = false;
            if !self.timeout_counted {
                self.timeout_counted = true;
                self.keepalive.send_timed_out();
            }
        }
        e
    }

    /// Notes that the client waits for `100 Continue` before sending its body.
    pub(super) fn expect_continue(&mut self) {
        self.awaiting_continue = true;
    }

    /// The status sent, once a head has been sent.
    pub fn status(&self) -> Option<StatusCode> {
        self.status
    }

    /// Body bytes written so far (for the access log).
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// Whether the connection stays open after this response.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// The `Location` and `Content-Location` fields of the response sent
    /// (what a cache needs to invalidate after an unsafe request).
    pub fn sent_headers(&self) -> &HeaderMap {
        &self.locations
    }

    /// True once a final response head has been queued or sent.
    pub fn head_sent(&self) -> bool {
        self.status.is_some()
    }

    /// True once the response is complete.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Asks for the connection to be closed after this response.
    pub fn close_after(&mut self) {
        self.keep_alive = false;
    }

    /// Sends `100 Continue` to a client that asked for it.
    pub async fn send_continue(&mut self) -> io::Result<()> {
        self.awaiting_continue = false;
        self.continue_sent = true;
        let stream = match &mut self.sink {
            Sink::H1(s) => *s,
            Sink::H2(o) => return o.interim(StatusCode::CONTINUE, &HeaderMap::new()),
        };
        let r = write_all(stream, b"HTTP/1.1 100 Continue\r\n\r\n", self.send_timeout).await;
        r.map_err(|e| self.counted(e))
    }

    /// Relays an interim (1xx) response from the origin, before the final
    /// head; returns whether it was written. Not to an HTTP/1.0 client (RFC
    /// 9110 15.2: "A server MUST NOT send a 1xx response to an HTTP/1.0
    /// client"), not after the final head, and a `100 Continue` only when
    /// the client has had none and waits for none: Portico answers
    /// `Expect: 100-continue` itself (hop by hop), so an origin's 100 would
    /// be a second one, or would invite a body Portico is not forwarding.
    /// `headers` must already be free of hop-by-hop fields. The head is
    /// written at once (an Early Hints' links are of use only before the
    /// final response) and never kept: nothing of it reaches the final
    /// response or the cache.
    pub async fn send_interim(&mut self, status: StatusCode, headers: &HeaderMap) -> io::Result<bool> {
        let is_continue = status == StatusCode::CONTINUE;
        if self.version < Version::HTTP_11
            || !status.is_informational()
            || status == StatusCode::SWITCHING_PROTOCOLS
            || self.head_sent()
            || (is_continue && (self.continue_sent || self.awaiting_continue))
        {
            return Ok(false);
        }
        let stream = match &mut self.sink {
            Sink::H1(s) => *s,
            Sink::H2(o) => {
                self.continue_sent |= is_continue;
                o.interim(status, headers)?;
                return Ok(true);
            }
        };
        let mut out = Vec::with_capacity(128);
        status_line(&mut out, status);
        for (name, value) in headers {
            // A 1xx has no body: framing fields would only mislead.
            if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION {
                continue;
            }
            field_line(&mut out, name, value.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        self.continue_sent |= is_continue;
        let r = write_all(stream, &out, self.send_timeout).await;
        r.map_err(|e| self.counted(e))?;
        Ok(true)
    }

    /// Response header edits (from the routing rules) to apply to the head
    /// this writer sends, whatever produces it (origin, cache, error page).
    pub fn edit_headers(&mut self, edits: Vec<std::sync::Arc<crate::rules::HeaderEdits>>) {
        self.edits = edits;
    }

    /// Queues the response head (written together with the first body bytes).
    /// `headers` must already be free of hop-by-hop fields; framing fields
    /// are set here from `len`, except for bodiless responses (HEAD, 204,
    /// 304), whose `Content-Length` is passed as given.
    pub fn send_head(&mut self, status: StatusCode, mut headers: HeaderMap, len: BodyLen) {
        for e in &self.edits {
            e.apply(&mut headers);
        }
        let bodiless = self.head_request
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        headers.remove(TRANSFER_ENCODING);
        headers.remove(CONNECTION);
        self.framing = if bodiless {
            if status == StatusCode::NO_CONTENT || status.is_informational() {
                headers.remove(CONTENT_LENGTH);
            }
            // Passed on, but as one canonical field (never `5, 5` or
            // `005`), like every length Portico sends.
            super::head::normalise_content_length(&mut headers);
            Framing::None
        } else {
            match len {
                BodyLen::Known(n) => {
                    self.declared = n;
                    if !super::head::states_length(&headers, n) {
                        headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
                    }
                    Framing::Length
                }
                BodyLen::Unknown if self.version == Version::HTTP_11 => {
                    headers.remove(CONTENT_LENGTH);
                    headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
                    Framing::Chunked
                }
                BodyLen::Unknown => {
                    headers.remove(CONTENT_LENGTH);
                    self.keep_alive = false;
                    Framing::Close
                }
            }
        };
        for name in [http::header::LOCATION, http::header::CONTENT_LOCATION] {
            if let Some(v) = headers.get(&name) {
                self.locations.insert(name, v.clone());
            }
        }
        if !headers.contains_key(DATE) {
            headers.insert(DATE, crate::util::http_date_now());
        }
        if let Sink::H2(o) = &mut self.sink {
            // RFC 9113 8.2.2: no connection-specific fields in HTTP/2;
            // the stream's end, not a field, delimits the body.
            super::h2::strip_connection_fields(&mut headers);
            o.queue_head(status, headers);
            self.status = Some(status);
            return;
        }
        if let Some(c) = self.connection_field() {
            headers.insert(CONNECTION, HeaderValue::from_static(c));
        }
        self.queue_head(status, fields_len(&headers), |out| {
            for (name, value) in &headers {
                field_line(out, name, value.as_bytes());
            }
        });
    }

    /// Queues an HTTP/1 head of `status` whose field lines `write_fields`
    /// appends (about `fields` bytes of them: the buffer is sized for that,
    /// as a head that outgrew its first buffer would be copied into a
    /// larger one); it is written with the first body bytes.
    fn queue_head(&mut self, status: StatusCode, fields: usize, write_fields: impl FnOnce(&mut Vec<u8>)) {
        let mut out = Vec::with_capacity(64 + fields);
        status_line(&mut out, status);
        write_fields(&mut out);
        out.extend_from_slice(b"\r\n");
        self.pending_head = Some(out);
        self.status = Some(status);
    }

    /// The `Connection` field an HTTP/1 head carries: `close` when this is
    /// the connection's last response, `keep-alive` to an HTTP/1.0 client
    /// that keeps it; decides which first.
    fn connection_field(&mut self) -> Option<&'static str> {
        // A final answer instead of 100 Continue: the client may send its
        // body anyway or skip it (RFC 9110 10.1.1), and its next request
        // would be read as that body, or the body as its next request. Only
        // closing leaves no doubt.
        if self.awaiting_continue {
            self.keep_alive = false;
        }
        // Draining (SIGTERM): this is the connection's last response.
        if crate::drain::is_draining() {
            self.keep_alive = false;
        }
        if !self.keep_alive {
            Some("close")
        } else if self.version == Version::HTTP_10 {
            Some("keep-alive")
        } else {
            None
        }
    }

    /// Whether [`ResponseWriter::send_stored_head`] can send a `status`
    /// response: on HTTP/1, to a request that is not HEAD, with no header
    /// edits from the rules, and a status that has a body.
    pub fn takes_stored_head(&self, status: StatusCode) -> bool {
        matches!(self.sink, Sink::H1(_))
            && self.edits.is_empty()
            && !self.head_request
            && !status.is_informational()
            && status != StatusCode::NO_CONTENT
            && status != StatusCode::NOT_MODIFIED
    }

    /// [`ResponseWriter::send_head`] for a response with a body of `len`
    /// bytes whose fields were written as lines once ([`stored_field_lines`]:
    /// a cache hit sends its stored response's so, with no map of their own
    /// to edit and no field written one by one); `Age: age` (written from
    /// the number: a `HeaderValue` of it would be an allocation per hit),
    /// `extra`, `Content-Length`, and `Date` when the lines have none,
    /// follow them. Only where [`ResponseWriter::takes_stored_head`] says so.
    pub fn send_stored_head<'x>(
        &mut self,
        status: StatusCode,
        fields: StoredLines<'_>,
        age: u64,
        extra: impl Iterator<Item = &'x (HeaderName, HeaderValue)> + Clone,
        len: u64,
    ) {
        debug_assert!(self.takes_stored_head(status));
        self.framing = Framing::Length;
        self.declared = len;
        if let Some(base) = fields.locations {
            for name in [http::header::LOCATION, http::header::CONTENT_LOCATION] {
                if let Some(v) = base.get(&name) {
                    self.locations.insert(name, v.clone());
                }
            }
        }
        let date = (!fields.has_date).then(crate::util::http_date_now);
        let connection = self.connection_field();
        // Sized for the lines and Portico's own fields (Age, Content-Length,
        // Date, Connection).
        let size = fields.lines.len() + fields_len(extra.clone().map(|(n, v)| (n, v))) + 96;
        self.queue_head(status, size, |out| {
            out.extend_from_slice(fields.lines);
            let mut digits = [0u8; 20];
            field_line(out, &AGE, decimal(age, &mut digits));
            for (name, value) in extra {
                field_line(out, name, value.as_bytes());
            }
            field_line(out, &CONTENT_LENGTH, decimal(len, &mut digits));
            if let Some(d) = &date {
                field_line(out, &DATE, d.as_bytes());
            }
            if let Some(c) = connection {
                field_line(out, &CONNECTION, c.as_bytes());
            }
        });
    }

    /// [`ResponseWriter::send_data`] for bytes already in a `Bytes` (a
    /// cached body): an HTTP/2 stream takes them as they are, where a
    /// slice must be copied into a buffer of the stream's own.
    pub async fn send_bytes(&mut self, data: Bytes) -> io::Result<()> {
        self.send_data_parts(std::slice::from_ref(&data)).await
    }

    /// The HTTP/2 form of [`ResponseWriter::send_data`].
    async fn send_h2(&mut self, data: Bytes) -> io::Result<()> {
        let Sink::H2(o) = &mut self.sink else {
            return Ok(());
        };
        if data.is_empty() {
            return Ok(());
        }
        let len = data.len() as u64;
        if self.framing == Framing::Length && self.body_bytes + len > self.declared {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "body longer than its Content-Length",
            ));
        }
        if self.framing == Framing::None {
            return Ok(());
        }
        // The bytes that complete an announced length end the stream.
        let last = self.framing == Framing::Length && self.body_bytes + len == self.declared;
        self.meter.pace(data.len()).await;
        let r = o.send_data(data, last, self.send_timeout).await;
        r.map_err(|e| self.counted(e))?;
        self.body_bytes += len;
        Ok(())
    }

    /// Writes body bytes (and the queued head, if not yet written). The
    /// piece is looked at before every write, so a reload that sets or
    /// changes a bandwidth limit applies from the next write on.
    pub async fn send_data(&mut self, data: &[u8]) -> io::Result<()> {
        let mut at = 0;
        while at < data.len() {
            let p = &data[at..data.len().min(at.saturating_add(self.piece()))];
            at += p.len();
            if matches!(self.sink, Sink::H2(_)) {
                self.send_h2(Bytes::copy_from_slice(p)).await?;
            } else {
                self.write_body(&[p]).await?;
            }
        }
        Ok(())
    }

    /// Writes several pieces of body (and the queued head, if not yet
    /// written): what the origin had sent by the time the first piece was
    /// read (`OriginBody::ready_data`), on HTTP/1 in one system call for
    /// every [`PARTS_PER_WRITE`] pieces and, on plain TCP, as few segments
    /// as the bytes need (chunked, each write is one chunk); an HTTP/2
    /// stream takes them as they are.
    ///
    /// Paced, a piece at a time, each waiting for the client's share. The
    /// piece is looked at before every write: a reload that sets, changes
    /// or lifts a limit applies from the next write on, not after the
    /// pieces this call was given (a piece of the old rate's size would
    /// owe seconds at a lower one).
    pub async fn send_data_parts(&mut self, parts: &[Bytes]) -> io::Result<()> {
        let h2 = matches!(self.sink, Sink::H2(_));
        // The next part, and where in it.
        let (mut i, mut at) = (0, 0);
        while let Some(part) = parts.get(i) {
            if at >= part.len() {
                (i, at) = (i + 1, 0);
                continue;
            }
            let piece = self.piece();
            if piece == usize::MAX && at == 0 {
                // Unpaced: whole parts, several in one write.
                if h2 {
                    self.send_h2(part.clone()).await?;
                    i += 1;
                } else {
                    let group = &parts[i..parts.len().min(i + PARTS_PER_WRITE)];
                    self.write_body(group).await?;
                    i += group.len();
                }
                continue;
            }
            let p = part.slice(at..part.len().min(at.saturating_add(piece)));
            at += p.len();
            if h2 {
                self.send_h2(p).await?;
            } else {
                self.write_body(&[p]).await?;
            }
        }
        Ok(())
    }

    /// HTTP/1 body bytes, at most [`PARTS_PER_WRITE`] pieces, framed and in
    /// one write with the queued head if it is not yet written.
    async fn write_body<P: AsRef<[u8]>>(&mut self, parts: &[P]) -> io::Result<()> {
        debug_assert!(parts.len() <= PARTS_PER_WRITE);
        let Sink::H1(stream) = self.sink else { return Ok(()) };
        let len: u64 = parts.iter().map(|p| p.as_ref().len() as u64).sum();
        if len == 0 {
            return Ok(());
        }
        let head = self.pending_head.take();
        let head = head.as_deref().unwrap_or(&[]);
        let t = self.send_timeout;
        let chunked = self.framing == Framing::Chunked;
        let size = if chunked {
            chunk_header(usize::try_from(len).unwrap_or(usize::MAX))
        } else {
            Vec::new()
        };
        // The head, a chunk's size line, the pieces, the chunk's end.
        let mut slices: [&[u8]; PARTS_PER_WRITE + 3] = [&[]; PARTS_PER_WRITE + 3];
        slices[0] = head;
        let mut n = 1;
        if chunked {
            slices[n] = &size;
            n += 1;
        }
        for part in parts {
            slices[n] = part.as_ref();
            n += 1;
        }
        if chunked {
            slices[n] = b"\r\n";
            n += 1;
        }
        if self.framing != Framing::None {
            self.meter.pace(usize::try_from(len).unwrap_or(usize::MAX)).await;
        }
        let written = match self.framing {
            Framing::None => write_all(stream, head, t).await,
            Framing::Length if self.body_bytes + len > self.declared => {
                // Never write past the announced length: the excess would be
                // read by the client as the start of the next response.
                self.keep_alive = false;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "body longer than its Content-Length",
                ));
            }
            // The bytes that complete a response after which the
            // connection closes are its last.
            Framing::Length if !self.keep_alive && self.body_bytes + len == self.declared => {
                write_all_vectored_last(stream, &slices[..n], t).await
            }
            Framing::Length | Framing::Close | Framing::Chunked => write_all_vectored(stream, &slices[..n], t).await,
        };
        written.map_err(|e| self.counted(e))?;
        if self.framing != Framing::None {
            self.body_bytes += len;
        }
        Ok(())
    }

    /// Whether [`ResponseWriter::send_file`] can send file bytes with
    /// `sendfile` here: an HTTP/1 client on plain TCP.
    pub fn takes_files(&self) -> bool {
        matches!(self.sink, Sink::H1(ClientStream::Plain(_)))
    }

    /// Sends `len` body bytes of `file` from `offset` (and the queued head
    /// before them): on plain TCP with `sendfile`, the head written with
    /// `MSG_MORE` so head and body share packets. Ok(false) when this
    /// stream cannot (TLS: the record layer must encrypt the bytes; a
    /// chunked or bodiless response): nothing was written, send the bytes
    /// with [`ResponseWriter::send_data`] instead.
    pub async fn send_file(&mut self, file: &std::fs::File, offset: u64, len: u64) -> io::Result<bool> {
        // An HTTP/2 stream's DATA frames go through the stream's windows.
        let Sink::H1(ClientStream::Plain(tcp)) = self.sink else {
            return Ok(false);
        };
        match self.framing {
            Framing::Length if self.body_bytes + len > self.declared => {
                self.keep_alive = false;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "body longer than its Content-Length",
                ));
            }
            Framing::Length | Framing::Close => {}
            Framing::None | Framing::Chunked => return Ok(false),
        }
        if len == 0 {
            return Ok(true);
        }
        let t = self.send_timeout;
        if let Some(head) = self.pending_head.take() {
            let r = super::io::send_more(tcp, &head, t).await;
            r.map_err(|e| self.counted(e))?;
        }
        // Paced, a piece at a time, each waiting for the client's share;
        // unpaced, in calls of UNPACED_SENDFILE, between which a limit a
        // reload sets is taken up.
        let mut at = 0;
        while at < len {
            let piece = self.meter.piece().map_or(UNPACED_SENDFILE, |p| p as u64);
            let n = piece.min(len - at);
            self.meter.pace(usize::try_from(n).unwrap_or(usize::MAX)).await;
            // Counted as they go: a client that leaves part-way is logged
            // with the bytes it was sent, not none.
            let mut sent = 0;
            let r = super::io::sendfile_all(tcp, file, offset + at, n, t, &mut sent).await;
            self.body_bytes += sent;
            r.map_err(|e| self.counted(e))?;
            at += n;
        }
        Ok(true)
    }

    /// Ends the response (with trailers, for a chunked body).
    pub async fn finish(&mut self, trailers: Option<&HeaderMap>) -> io::Result<()> {
        if self.framing == Framing::Length && self.body_bytes != self.declared {
            self.keep_alive = false;
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "body shorter than its Content-Length",
            ));
        }
        let stream = match &mut self.sink {
            Sink::H1(s) => *s,
            Sink::H2(o) => {
                o.finish(trailers)?;
                self.finished = true;
                return Ok(());
            }
        };
        let head = self.pending_head.take();
        let head = head.as_deref().unwrap_or(&[]);
        let t = self.send_timeout;
        let written = if self.framing == Framing::Chunked {
            write_all_vectored(stream, &[head, &last_chunk(trailers)], t).await
        } else if !head.is_empty() {
            write_all(stream, head, t).await
        } else {
            Ok(())
        };
        written.map_err(|e| self.counted(e))?;
        self.finished = true;
        Ok(())
    }

    /// Writes a head made by the caller (the `200 Connection established`
    /// of a CONNECT tunnel, which must carry no framing fields).
    pub async fn send_raw_head(&mut self, status: StatusCode, head: &[u8]) -> io::Result<()> {
        self.status = Some(status);
        self.keep_alive = false;
        let Sink::H1(stream) = self.sink else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a raw head on an HTTP/2 stream",
            ));
        };
        let r = write_all(stream, head, self.send_timeout).await;
        r.map_err(|e| self.counted(e))
    }

    /// Counts bytes sent outside `send_data` (tunnelled bytes) for the log.
    pub fn add_body_bytes(&mut self, n: u64) {
        self.body_bytes += n;
    }

    /// Sends a complete response with a small in-memory body.
    pub async fn send_full(&mut self, status: StatusCode, headers: HeaderMap, body: Bytes) -> io::Result<()> {
        self.send_head(status, headers, BodyLen::Known(body.len() as u64));
        self.send_data(&body).await?;
        self.finish(None).await
    }
}

#[cfg(test)]
mod tests {
    use super::decimal;

    #[test]
    fn decimal_writes_every_u64_as_its_digits() {
        let mut buf = [0u8; 20];
        for n in [0, 7, 10, 11, 999, 1_000, 65_536, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes(), "{n}");
        }
    }
}
