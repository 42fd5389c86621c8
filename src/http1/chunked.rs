//! The chunked transfer coding (RFC 9112 section 7.1): a resumable decoder
//! over a byte buffer (no I/O, fuzzed directly) and the encoder's framing.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Longest chunk-size line accepted, extensions included.
const MAX_SIZE_LINE: usize = 4096;

/// What one call to [`ChunkedDecoder::decode`] produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The trailer section (sent once, before `Done`, only when non-empty).
    Trailers(HeaderMap),
    /// The body is complete; bytes after it in the buffer belong to the next message.
    Done,
    /// More input is needed.
    NeedMore,
}

/// A chunked body that cannot be read safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ChunkError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Finished,
}

/// Decodes a chunked body incrementally from a buffer the caller fills.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    max_trailers: usize,
}

impl ChunkedDecoder {
    /// A decoder whose trailer section may hold at most `max_trailers` bytes.
    pub fn new(max_trailers: usize) -> Self {
        ChunkedDecoder {
            state: State::Size,
            max_trailers,
        }
    }

    /// True once the last chunk and trailers have been consumed.
    pub fn is_done(&self) -> bool {
        self.state == State::Finished
    }

    /// Consumes what it can from the front of `buf`; at most `max_data` bytes
    /// of body are returned at once.
    pub fn decode(&mut self, buf: &mut BytesMut, max_data: usize) -> Result<Decoded, ChunkError> {
        loop {
            match self.state {
                State::Finished => return Ok(Decoded::Done),
                State::Size => {
                    let Some(line_end) = find_crlf(buf, MAX_SIZE_LINE)? else {
                        return Ok(Decoded::NeedMore);
                    };
                    let size = parse_size_line(&buf[..line_end])?;
                    buf.advance(line_end + 2);
                    self.state = if size == 0 { State::Trailers } else { State::Data(size) };
                }
                State::Data(remaining) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let take = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(buf.len())
                        .min(max_data.max(1));
                    let data = buf.split_to(take).freeze();
                    let left = remaining - take as u64;
                    self.state = if left == 0 { State::DataEnd } else { State::Data(left) };
                    return Ok(Decoded::Data(data));
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        if buf.first().is_some_and(|&b| b != b'\r') {
                            return Err(ChunkError("chunk data not followed by CRLF"));
                        }
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(ChunkError("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailers => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        self.state = State::Finished;
                        return Ok(Decoded::Done);
                    }
                    let Some(end) = find_trailer_end(buf) else {
                        // A lone CR may still become the CRLF of an empty
                        // trailer section, which no limit refuses.
                        if buf.len() > self.max_trailers && buf[..] != b"\r"[..] {
                            return Err(ChunkError("trailer section too large"));
                        }
                        check_endings(buf)?;
                        return Ok(Decoded::NeedMore);
                    };
                    if end > self.max_trailers {
                        return Err(ChunkError("trailer section too large"));
                    }
                    check_endings(&buf[..end])?;
                    let trailers = parse_trailers(&buf[..end])?;
                    buf.advance(end);
                    self.state = State::Finished;
                    return Ok(if trailers.is_empty() {
                        Decoded::Done
                    } else {
                        Decoded::Trailers(trailers)
                    });
                }
            }
        }
    }
}

/// Position of the CRLF ending the first line, rejecting bare LF/CR and
/// lines longer than `max`.
fn find_crlf(buf: &[u8], max: usize) -> Result<Option<usize>, ChunkError> {
    for (i, &b) in buf.iter().enumerate().take(max + 1) {
        match b {
            b'\n' => return Err(ChunkError("bare LF in chunk size line")),
            b'\r' => {
                return match buf.get(i + 1) {
                    Some(b'\n') => Ok(Some(i)),
                    Some(_) => Err(ChunkError("bare CR in chunk size line")),
                    None => Ok(None),
                };
            }
            _ => {}
        }
    }
    if buf.len() > max {
        Err(ChunkError("chunk size line too long"))
    } else {
        Ok(None)
    }
}

/// `chunk-size [ chunk-ext ]`: 1 to 16 hex digits, then optional extensions
/// `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )`.
fn parse_size_line(line: &[u8]) -> Result<u64, ChunkError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ChunkError("missing chunk size"));
    }
    if digits > 16 {
        return Err(ChunkError("chunk size too large"));
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| ChunkError("invalid chunk size"))?;
    let size = u64::from_str_radix(text, 16).map_err(|_| ChunkError("chunk size too large"))?;
    check_extensions(&line[digits..])?;
    Ok(size)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && (s[i] == b' ' || s[i] == b'\t') {
        i += 1;
    }
    i
}

fn check_extensions(s: &[u8]) -> Result<(), ChunkError> {
    let err = ChunkError("invalid chunk extension");
    let mut i = skip_ws(s, 0);
    while i < s.len() {
        if s[i] != b';' {
            return Err(err);
        }
        i = skip_ws(s, i + 1);
        let name_start = i;
        while i < s.len() && is_tchar(s[i]) {
            i += 1;
        }
        if i == name_start {
            return Err(err);
        }
        i = skip_ws(s, i);
        if i < s.len() && s[i] == b'=' {
            i = skip_ws(s, i + 1);
            if i < s.len() && s[i] == b'"' {
                i += 1;
                loop {
                    match s.get(i) {
                        None => return Err(err),
                        Some(b'"') => {
                            i += 1;
                            break;
                        }
                        Some(b'\\')
                            if i + 1 < s.len() && (s[i + 1] == b'\t' || s[i + 1] >= 0x20) && s[i + 1] != 0x7f =>
                        {
                            i += 2
                        }
                        Some(&c) if c == b'\t' || (c >= 0x20 && c != 0x7f && c != b'\\') => i += 1,
                        Some(_) => return Err(err),
                    }
                }
            } else {
                let start = i;
                while i < s.len() && is_tchar(s[i]) {
                    i += 1;
                }
                if i == start {
                    return Err(err);
                }
            }
            i = skip_ws(s, i);
        }
    }
    Ok(())
}

fn find_trailer_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn check_endings(bytes: &[u8]) -> Result<(), ChunkError> {
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\n' if i == 0 || bytes[i - 1] != b'\r' => return Err(ChunkError("bare LF in trailer section")),
            b'\r' if i + 1 < bytes.len() && bytes[i + 1] != b'\n' => {
                return Err(ChunkError("bare CR in trailer section"));
            }
            _ => {}
        }
    }
    Ok(())
}

fn parse_trailers(section: &[u8]) -> Result<HeaderMap, ChunkError> {
    let mut storage = [httparse::EMPTY_HEADER; 64];
    let fields = match httparse::parse_headers(section, &mut storage) {
        Ok(httparse::Status::Complete((_, fields))) => fields,
        Ok(httparse::Status::Partial) => return Err(ChunkError("incomplete trailer section")),
        Err(httparse::Error::TooManyHeaders) => return Err(ChunkError("too many trailer fields")),
        Err(_) => return Err(ChunkError("malformed trailer field")),
    };
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| ChunkError("invalid trailer name"))?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| ChunkError("invalid trailer value"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// The line that starts a chunk of `len` bytes: `"<hex>\r\n"`.
pub fn chunk_header(len: usize) -> Vec<u8> {
    format!("{len:X}\r\n").into_bytes()
}

/// Whether a field may be passed on in a trailer section. RFC 9110 6.5.1:
/// fields that must be known before the content (framing, routing,
/// authentication, request modifiers, response controls, content format)
/// cannot be processed as trailers, and a sender "MUST NOT generate a
/// trailer field unless the sender knows the corresponding header field
/// name's definition permits the field to be sent in trailers". Passed
/// on, a `Content-Length` trailer is read as framing by a next hop that
/// merges trailers into the header section.
pub fn allowed_in_trailers(name: &HeaderName) -> bool {
    const NOT_IN_TRAILERS: [&str; 26] = [
        "authorization",
        "age",
        "cache-control",
        "connection",
        "content-encoding",
        "content-length",
        "content-range",
        "content-type",
        "cookie",
        "expect",
        "expires",
        "host",
        "keep-alive",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "range",
        "set-cookie",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "vary",
        "www-authenticate",
    ];
    !NOT_IN_TRAILERS.contains(&name.as_str()) && !crate::http1::head::framing_lookalike(name.as_str())
}

/// The last chunk with an optional trailer section, ending the body; the
/// fields [`allowed_in_trailers`] refuses are left out.
pub fn last_chunk(trailers: Option<&HeaderMap>) -> Vec<u8> {
    let mut out = b"0\r\n".to_vec();
    if let Some(t) = trailers {
        for (name, value) in t.iter().filter(|(n, _)| allowed_in_trailers(n)) {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Body, trailers and the bytes left after the body.
    type DecodedBody = (Vec<u8>, Option<HeaderMap>, Vec<u8>);

    /// Decodes `input` fed in pieces of `step` bytes.
    fn run(input: &[u8], step: usize) -> Result<DecodedBody, ChunkError> {
        run_limited(input, step, 4096)
    }

    /// Like `run`, with a trailer section of at most `max_trailers` bytes.
    fn run_limited(input: &[u8], step: usize, max_trailers: usize) -> Result<DecodedBody, ChunkError> {
        let mut dec = ChunkedDecoder::new(max_trailers);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut trailers = None;
        let mut fed = 0;
        loop {
            match dec.decode(&mut buf, 7)? {
                Decoded::Data(d) => body.extend_from_slice(&d),
                Decoded::Trailers(t) => trailers = Some(t),
                Decoded::Done => return Ok((body, trailers, buf.to_vec())),
                Decoded::NeedMore => {
                    if fed >= input.len() {
                        return Err(ChunkError("eof"));
                    }
                    let end = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..end]);
                    fed = end;
                }
            }
        }
    }

    #[test]
    fn decodes_in_any_split() {
        let input = b"5\r\nhello\r\n1;a=b;c=\"q\\\"x\" \r\n!\r\n0\r\nX-Sum: 1\r\n\r\nNEXT";
        for step in [1, 2, 3, 5, 100] {
            let (body, trailers, rest) = run(input, step).unwrap();
            assert_eq!(body, b"hello!");
            assert_eq!(trailers.unwrap().get("x-sum").unwrap(), "1");
            assert!(b"NEXT".starts_with(&rest));
        }
    }

    #[test]
    fn trailer_limit_does_not_depend_on_the_split() {
        // Found by fuzz/chunked_body: fed byte by byte with a zero trailer
        // limit, the first byte of the final CRLF was taken as an oversized
        // trailer section, while the same body in one piece was accepted.
        let input = b"5\r\nhello\r\n0\r\n\r\nNEXT";
        for step in [1, 2, 3, 100] {
            let (body, trailers, rest) = run_limited(input, step, 0).unwrap();
            assert_eq!(body, b"hello");
            assert!(trailers.is_none());
            assert!(b"NEXT".starts_with(&rest));
        }
        for step in [1, 2, 100] {
            assert_eq!(
                run_limited(b"0\r\nX: 1\r\n\r\n", step, 0).unwrap_err(),
                ChunkError("trailer section too large")
            );
        }
    }

    #[test]
    fn no_trailers() {
        let (body, trailers, _) = run(b"a\r\n0123456789\r\n0\r\n\r\n", 64).unwrap();
        assert_eq!(body, b"0123456789");
        assert!(trailers.is_none());
    }

    #[test]
    fn rejects_bad_framing() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\rhello\r\n0\r\n\r\n",
            b"g\r\n",
            b"\r\n",
            b"11111111111111111\r\n",
            b"5;\r\nhello\r\n0\r\n\r\n",
            b"5;a=\r\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"unterminated\r\nhello\r\n0\r\n\r\n",
            b"0\r\nX: a\n\r\n",
            b"0\r\nX: a\r\n b\r\n\r\n",
            b"-1\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
        ] {
            assert!(run(bad, 3).is_err(), "accepted {:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn size_line_limit() {
        let mut line = b"1;".to_vec();
        line.extend(std::iter::repeat_n(b'a', 5000));
        assert_eq!(run(&line, 10000).unwrap_err(), ChunkError("chunk size line too long"));
    }

    #[test]
    fn encoder_framing() {
        assert_eq!(chunk_header(255), b"FF\r\n");
        let mut t = HeaderMap::new();
        t.insert("x-a", HeaderValue::from_static("1"));
        assert_eq!(last_chunk(Some(&t)), b"0\r\nx-a: 1\r\n\r\n");
        assert_eq!(last_chunk(None), b"0\r\n\r\n");
    }
}
