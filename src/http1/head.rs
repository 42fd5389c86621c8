//! Request heads: parsing on `httparse` plus the framing rules of RFC 9112
//! that keep a proxy safe from request smuggling. Pure functions over
//! bytes (no I/O), so they are fuzzed directly.

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use std::mem::MaybeUninit;

/// Size limits applied while reading a request head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Longest request line (414 beyond it).
    pub max_request_line: usize,
    /// Largest head, request line and header fields together (431 beyond it).
    pub max_head: usize,
    /// Most header fields (431 beyond it).
    pub max_headers: usize,
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits {
            max_request_line: 8 << 10,
            max_head: 64 << 10,
            max_headers: 100,
        }
    }
}

/// How the request body is delimited (RFC 9112 section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body.
    Empty,
    /// `Content-Length: n` (n > 0).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed and checked request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// The method.
    pub method: Method,
    /// The request target exactly as sent (origin, absolute, authority or asterisk form).
    pub target: String,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Header fields in order, names lower-cased.
    pub headers: HeaderMap,
    /// How the body is framed.
    pub body: BodyFraming,
    /// Whether the client wants the connection kept open after this exchange.
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
}

/// Why a head was rejected: the status to answer with and a reason for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadError {
    /// 400, 414, 417, 431, 501 or 505.
    pub status: StatusCode,
    /// A short, specific reason, safe to show to the client.
    pub reason: &'static str,
}

fn bad(reason: &'static str) -> HeadError {
    HeadError {
        status: StatusCode::BAD_REQUEST,
        reason,
    }
}

const STACK_HEADERS: usize = 128;

/// Tries to parse one request head at the start of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, or the head and the number
/// of bytes it took (leading empty lines included). Any framing the proxy
/// could misread differently from an origin is rejected.
pub fn parse_request(buf: &[u8], limits: &HeadLimits) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let Some((start, end)) = locate(buf, limits)? else {
        return Ok(None);
    };
    let head = fields(&buf[start..start + end], limits, &mut |v| {
        HeaderValue::from_bytes(v).ok()
    })?;
    Ok(Some((head, start + end)))
}

/// [`parse_request`] on a connection's read buffer: the head (with the
/// empty lines before it) is taken off the front of `buf`, and the field
/// values are slices of its bytes instead of copies (no allocation per
/// field). After an error `buf` holds what it held before.
pub fn take_request(buf: &mut BytesMut, limits: &HeadLimits) -> Result<Option<RequestHead>, HeadError> {
    let Some((start, end)) = locate(buf, limits)? else {
        return Ok(None);
    };
    let bytes = buf.split_to(start + end).freeze();
    let parsed = fields(&bytes[start..], limits, &mut |v| {
        HeaderValue::from_maybe_shared(bytes.slice_ref(v)).ok()
    });
    match parsed {
        Ok(head) => Ok(Some(head)),
        Err(e) => {
            // Nothing refers to the head's bytes any more: they go back
            // in front of the rest (for the error's log line).
            let mut whole = bytes.try_into_mut().unwrap_or_else(|b| BytesMut::from(&b[..]));
            whole.unsplit(std::mem::take(buf));
            *buf = whole;
            Err(e)
        }
    }
}

/// Where the head at the start of `buf` lies: the length of the empty
/// lines before it and of the head itself (up to its blank line), once it
/// is all there and within `limits`.
fn locate(buf: &[u8], limits: &HeadLimits) -> Result<Option<(usize, usize)>, HeadError> {
    // RFC 9112 2.2: ignore empty lines received before the request line.
    let mut start = 0;
    while buf[start..].starts_with(b"\r\n") {
        start += 2;
    }
    // They count against the head limit, or a client could send them
    // without end while the caller keeps buffering.
    if start > limits.max_head {
        return Err(HeadError {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            reason: "too many empty lines before the request",
        });
    }
    if buf.len() > start && buf[start] == b'\n' {
        return Err(bad("bare LF before request line"));
    }
    let data = &buf[start..];

    match memchr::memchr(b'\n', data) {
        None if data.len() > limits.max_request_line => {
            return Err(HeadError {
                status: StatusCode::URI_TOO_LONG,
                reason: "request line too long",
            });
        }
        None => return Ok(None),
        Some(i) if i + 1 > limits.max_request_line => {
            return Err(HeadError {
                status: StatusCode::URI_TOO_LONG,
                reason: "request line too long",
            });
        }
        Some(_) => {}
    }

    // Bare CR and LF are rejected early too, rather than waiting for a
    // terminator that a confused peer may never send.
    let Some(end) = head_end(data)? else {
        if data.len() > limits.max_head {
            return Err(HeadError {
                status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                reason: "request head too large",
            });
        }
        return Ok(None);
    };
    if end > limits.max_head {
        return Err(HeadError {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            reason: "request head too large",
        });
    }
    Ok(Some((start, end)))
}

/// Where the head at the start of `data` ends (just past its blank line),
/// if it is all there, with every line ending sound: every LF follows a CR
/// and every CR precedes an LF (a bare CR or LF is a classic smuggling
/// vector between parsers that disagree), but for a CR that is the last
/// byte so far. One pass from LF to LF (SIMD), then a count of the CRs:
/// with each LF's CR checked, there are as many CRs as LFs unless one is
/// bare.
fn head_end(data: &[u8]) -> Result<Option<usize>, HeadError> {
    let mut lfs = 0;
    let mut end = None;
    for i in memchr::memchr_iter(b'\n', data) {
        if i == 0 || data[i - 1] != b'\r' {
            return Err(bad("bare LF in request head"));
        }
        lfs += 1;
        if data[i + 1..].starts_with(b"\r\n") {
            end = Some(i + 3);
            lfs += 1;
            break;
        }
    }
    let seen = &data[..end.unwrap_or(data.len())];
    let crs = memchr::memchr_iter(b'\r', seen).count();
    let pending = usize::from(end.is_none() && seen.last() == Some(&b'\r'));
    if crs != lfs + pending {
        return Err(bad("bare CR in request head"));
    }
    Ok(end)
}

/// Parses the head `head_bytes` (request line to blank line), each field
/// value made by `value`.
fn fields(
    head_bytes: &[u8],
    limits: &HeadLimits,
    value: &mut dyn FnMut(&[u8]) -> Option<HeaderValue>,
) -> Result<RequestHead, HeadError> {
    // Left uninitialised: httparse writes the slots it uses (4 KiB of
    // empty headers were written for every request otherwise).
    if limits.max_headers <= STACK_HEADERS {
        let mut storage = [const { MaybeUninit::uninit() }; STACK_HEADERS];
        parse_fields(head_bytes, &mut storage[..limits.max_headers], value)
    } else {
        let mut storage = Vec::new();
        storage.resize_with(limits.max_headers, MaybeUninit::uninit);
        parse_fields(head_bytes, &mut storage, value)
    }
}

fn parse_fields<'b>(
    head_bytes: &'b [u8],
    storage: &mut [MaybeUninit<httparse::Header<'b>>],
    value: &mut dyn FnMut(&[u8]) -> Option<HeaderValue>,
) -> Result<RequestHead, HeadError> {
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(head_bytes, storage) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad("incomplete request head")),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError {
                status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                reason: "too many header fields",
            });
        }
        Err(httparse::Error::Version) => {
            return Err(HeadError {
                status: StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                reason: "unsupported HTTP version",
            });
        }
        Err(httparse::Error::HeaderName) => return Err(bad("invalid header field name")),
        Err(httparse::Error::HeaderValue) => return Err(bad("invalid header field value")),
        Err(httparse::Error::NewLine) => return Err(bad("invalid line ending")),
        Err(httparse::Error::Token) => return Err(bad("invalid method or request target")),
        Err(_) => return Err(bad("malformed request line")),
    }
    let method = Method::from_bytes(req.method.unwrap_or("").as_bytes()).map_err(|_| bad("invalid method"))?;
    let target = req.path.unwrap_or("").to_string();
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        Some(1) => Version::HTTP_11,
        _ => {
            return Err(HeadError {
                status: StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                reason: "unsupported HTTP version",
            });
        }
    };
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    // Which of the fields looked at below are present, noted as the map is
    // built: most requests have none but Host, and each lookup in the map
    // costs a hash and a probe.
    let (mut hosts, mut framed, mut connection, mut expect) = (0usize, false, false, false);
    for h in req.headers.iter() {
        if framing_lookalike(h.name) {
            return Err(bad("header field name resembling Content-Length or Transfer-Encoding"));
        }
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| bad("invalid header field name"))?;
        let value = value(h.value).ok_or(bad("invalid header field value"))?;
        if name == HOST {
            hosts += 1;
        } else if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            framed = true;
        } else if name == CONNECTION {
            connection = true;
        } else if name == EXPECT {
            expect = true;
        }
        headers.append(name, value);
    }

    check_target(&method, &target)?;
    let body = if framed {
        framing(&headers, version)?
    } else {
        BodyFraming::Empty
    };

    if hosts > 1 {
        return Err(bad("more than one Host header"));
    }
    if hosts == 0 && version == Version::HTTP_11 {
        return Err(bad("HTTP/1.1 request without Host header"));
    }
    if hosts == 1
        && let Some(h) = headers.get(HOST)
        && !h.is_empty()
        && !valid_host(h.as_bytes())
    {
        return Err(bad("invalid Host header"));
    }

    let (mut close, mut keep) = (false, false);
    if connection {
        for token in list_tokens(&headers, &CONNECTION) {
            close |= token.eq_ignore_ascii_case("close");
            keep |= token.eq_ignore_ascii_case("keep-alive");
        }
    }
    let keep_alive = !close && (version == Version::HTTP_11 || keep);

    let mut expect_continue = false;
    if expect {
        for value in headers.get_all(EXPECT) {
            if value.as_bytes().eq_ignore_ascii_case(b"100-continue") {
                expect_continue = version == Version::HTTP_11;
            } else {
                return Err(HeadError {
                    status: StatusCode::EXPECTATION_FAILED,
                    reason: "unsupported expectation",
                });
            }
        }
    }

    Ok(RequestHead {
        method,
        target,
        version,
        headers,
        body,
        keep_alive,
        expect_continue,
    })
}

/// The hop-by-hop fields a proxy never forwards (RFC 9110 7.6.1), besides
/// those a message names in its `Connection` field; `Proxy-Authorization`
/// and `Proxy-Authenticate` are this hop's credentials. `Trailer` is not
/// one of them (RFC 9110 6.6.2): it announces the trailer fields of a
/// chunked body, which are forwarded.
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
];

/// True when the request's field `name` (lower case) never reaches the
/// next hop: one of [`HOP_BY_HOP`] or named in its `Connection` field.
pub fn is_hop_by_hop(name: &str, headers: &HeaderMap) -> bool {
    HOP_BY_HOP.contains(&name) || list_tokens(headers, &CONNECTION).any(|t| t.eq_ignore_ascii_case(name))
}

/// True when `value` is a `Host` a request may carry (RFC 9112 3.2,
/// RFC 9110 7.2): `uri-host [ ":" port ]`, the host not empty, no user
/// information. Anything else (a `/`, a space, `user@host`) would make
/// the host the rules and the cache key see differ from the one the
/// connection goes to, so both HTTP/1 and HTTP/2 (`:authority`, or
/// `Host` without it) refuse it.
pub fn valid_host(value: &[u8]) -> bool {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<http::uri::Authority>().ok())
        .is_some_and(|a| !a.as_str().contains('@') && !a.host().is_empty())
}

/// True for `Transfer_Encoding`, `content_length` and the like: valid field
/// names, but servers that map `_` to `-` (CGI-style environments, some
/// frameworks) read them as the framing fields, which Portico does not.
/// Such an origin would wait for a body Portico never sends, and read the
/// next request on the pooled connection as that body.
pub fn framing_lookalike(name: &str) -> bool {
    let same = |framing: &str| {
        name.len() == framing.len()
            && name
                .bytes()
                .zip(framing.bytes())
                .all(|(a, b)| a.eq_ignore_ascii_case(&b) || (a == b'_' && b == b'-'))
    };
    // Only two lengths can match: the usual name is ruled out without a scan.
    (name.len() == 14 || name.len() == 17)
        && name.contains('_')
        && (same("content-length") || same("transfer-encoding"))
}

/// The request target must have the form its method allows (RFC 9112 3.2).
fn check_target(method: &Method, target: &str) -> Result<(), HeadError> {
    if target.is_empty() {
        return Err(bad("empty request target"));
    }
    if *method == Method::CONNECT {
        // authority-form: host:port, nothing else.
        let ok = target
            .parse::<http::uri::Authority>()
            .ok()
            .is_some_and(|a| a.port_u16().is_some() && !a.as_str().contains('@') && !a.host().is_empty());
        return if ok {
            Ok(())
        } else {
            Err(bad("CONNECT target must be host:port"))
        };
    }
    if target == "*" {
        return if *method == Method::OPTIONS {
            Ok(())
        } else {
            Err(bad("asterisk-form target is only for OPTIONS"))
        };
    }
    if target.starts_with('/') {
        return Ok(());
    }
    match target.parse::<http::Uri>() {
        Ok(uri) if uri.scheme().is_some() && uri.authority().is_some() => Ok(()),
        _ => Err(bad("invalid request target")),
    }
}

/// Decides the body framing, rejecting every ambiguous combination.
fn framing(headers: &HeaderMap, version: Version) -> Result<BodyFraming, HeadError> {
    let has_te = headers.contains_key(TRANSFER_ENCODING);
    let has_cl = headers.contains_key(CONTENT_LENGTH);
    if has_te {
        if version == Version::HTTP_10 {
            return Err(bad("Transfer-Encoding in an HTTP/1.0 request"));
        }
        if has_cl {
            return Err(bad("both Transfer-Encoding and Content-Length"));
        }
        // A coding with obs-text is no token: skipping it would leave a
        // `chunked` that another parser does not see as the final coding.
        if headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .any(|v| !v.as_bytes().is_ascii())
        {
            return Err(bad("invalid Transfer-Encoding"));
        }
        let codings: Vec<&str> = list_tokens(headers, &TRANSFER_ENCODING).collect();
        let chunked_count = codings.iter().filter(|c| c.eq_ignore_ascii_case("chunked")).count();
        let last_chunked = codings.last().is_some_and(|c| c.eq_ignore_ascii_case("chunked"));
        if codings.is_empty() || !last_chunked || chunked_count > 1 {
            return Err(bad("Transfer-Encoding must end with chunked, once"));
        }
        if codings.len() > 1 {
            return Err(HeadError {
                status: StatusCode::NOT_IMPLEMENTED,
                reason: "transfer codings other than chunked are not supported",
            });
        }
        return Ok(BodyFraming::Chunked);
    }
    if has_cl {
        return Ok(match content_length(headers).map_err(bad)? {
            Some(0) | None => BodyFraming::Empty,
            Some(n) => BodyFraming::Length(n),
        });
    }
    Ok(BodyFraming::Empty)
}

/// The one length that every `Content-Length` field and list element in
/// `headers` states (RFC 9110 8.6 allows `5, 5` or the field twice), or
/// None without the field. A value that is not 1 to 18 digits, an empty
/// element, or two different values are an error, with its reason.
///
/// Whoever passes a message on sends this number once, as
/// `Content-Length: 5`, never the fields as received: a next hop that
/// reads `5, 5` or `005` differently would see other message boundaries.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, &'static str> {
    let mut length: Option<u64> = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let text = value.to_str().map_err(|_| "invalid Content-Length")?;
        for part in text.split(',') {
            let part = part.trim_matches([' ', '\t']);
            if part.is_empty() || part.len() > 18 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err("invalid Content-Length");
            }
            let n: u64 = part.parse().map_err(|_| "invalid Content-Length")?;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length values");
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// Replaces the `Content-Length` fields of a message passed on by one
/// canonical field (`Content-Length: 5` for `5, 5`, `005` or the field
/// twice), or removes them when they state no valid length.
pub fn normalise_content_length(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(CONTENT_LENGTH).iter();
    match (fields.next(), fields.next()) {
        (None, _) => return,
        // Already one canonical field (the usual case): nothing to make.
        (Some(v), None) if canonical_digits(v.as_bytes()) => return,
        _ => {}
    }
    match content_length(headers) {
        Ok(Some(n)) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
        _ => {
            headers.remove(CONTENT_LENGTH);
        }
    }
}

/// True when `headers` has exactly one `Content-Length` field and it is
/// `n` in canonical form (decimal digits, no leading zero, nothing else):
/// then it can stay as it is, with no new value made.
pub fn states_length(headers: &HeaderMap, n: u64) -> bool {
    let mut fields = headers.get_all(CONTENT_LENGTH).iter();
    let (Some(v), None) = (fields.next(), fields.next()) else {
        return false;
    };
    canonical_digits(v.as_bytes())
        && std::str::from_utf8(v.as_bytes())
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            == Some(n)
}

/// A length as Portico writes one: 1 to 18 decimal digits (as
/// `content_length` accepts), no leading zero.
fn canonical_digits(b: &[u8]) -> bool {
    !b.is_empty() && b.len() <= 18 && (b[0] != b'0' || b.len() == 1) && b.iter().all(u8::is_ascii_digit)
}

/// The comma-separated tokens of every field named `name`, trimmed.
///
/// Elements holding obs-text (bytes 0x80 and up) are skipped one by one; a
/// whole field value is never dropped for one such element, or a
/// `Connection: \x90, close` would lose its `close`.
pub fn list_tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|t| std::str::from_utf8(t).ok().filter(|t| t.is_ascii()))
        .map(|t| t.trim_matches([' ', '\t']))
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_canonical_content_length_states_a_length() {
        let with = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(CONTENT_LENGTH, HeaderValue::from_static(v));
            }
            h
        };
        assert!(states_length(&with(&["5"]), 5));
        assert!(states_length(&with(&["0"]), 0));
        assert!(states_length(&with(&["999999999999999999"]), 999_999_999_999_999_999));
        assert!(
            !states_length(&with(&["18446744073709551615"]), u64::MAX),
            "longer than content_length reads"
        );
        for values in [&["05"][..], &["5, 5"], &["5", "5"], &[" 5"], &["+5"], &[""], &["6"]] {
            assert!(!states_length(&with(values), 5), "{values:?}");
        }
        assert!(!states_length(&HeaderMap::new(), 0));
        // normalise_content_length leaves the canonical field and fixes the rest.
        for (values, want) in [
            (&["5"][..], Some("5")),
            (&["5, 5"], Some("5")),
            (&["005"], Some("5")),
            (&["x"], None),
        ] {
            let mut h = with(values);
            normalise_content_length(&mut h);
            let got: Vec<&str> = h
                .get_all(CONTENT_LENGTH)
                .iter()
                .map(|v| v.to_str().unwrap_or("?"))
                .collect();
            assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{values:?}");
        }
    }

    #[test]
    fn take_request_agrees_with_parse_request_and_shares_the_head_bytes() {
        let inputs: [&[u8]; 6] = [
            b"GET /a HTTP/1.1\r\nHost: h\r\nX-Long: some value\r\n\r\nGET /b",
            b"\r\n\r\nPOST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-Empty:\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nzz",
            b"GET / HTTP/1.1\r\nHost: h\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        ];
        for input in inputs {
            let mut buf = BytesMut::from(input);
            let taken = take_request(&mut buf, &HeadLimits::default());
            match (parse_request(input, &HeadLimits::default()), taken) {
                (Ok(Some((a, used))), Ok(Some(b))) => {
                    assert_eq!(
                        (a.method, a.target, a.headers, a.body),
                        (b.method, b.target, b.headers, b.body)
                    );
                    assert_eq!(&buf[..], &input[used..], "{input:?}");
                }
                (Ok(None), Ok(None)) => assert_eq!(&buf[..], input),
                (Err(a), Err(b)) => {
                    assert_eq!(a, b);
                    assert_eq!(&buf[..], input, "the buffer is as it was after an error");
                }
                (a, b) => panic!("{input:?}: {a:?} vs {b:?}"),
            }
        }
    }

    fn parse(s: &str) -> Result<Option<(RequestHead, usize)>, HeadError> {
        parse_request(s.as_bytes(), &HeadLimits::default())
    }
    fn status(s: &str) -> u16 {
        parse(s).expect_err("should be rejected").status.as_u16()
    }

    #[test]
    fn simple_get() {
        let (h, n) = parse("GET /a?b HTTP/1.1\r\nHost: x\r\n\r\nrest").unwrap().unwrap();
        assert_eq!(n, 30);
        assert_eq!(h.method, Method::GET);
        assert_eq!(h.target, "/a?b");
        assert!(h.keep_alive);
        assert_eq!(h.body, BodyFraming::Empty);
    }

    #[test]
    fn leading_empty_lines_are_limited() {
        // Found by fuzz/request_head: they were skipped without limit, so
        // the caller kept buffering them.
        assert_eq!(status(&"\r\n".repeat(40_000)), 431);
        let limits = HeadLimits {
            max_head: 4,
            ..HeadLimits::default()
        };
        assert!(parse_request(b"\r\n\r\n", &limits).unwrap().is_none());
        assert_eq!(parse_request(b"\r\n\r\n\r\n", &limits).unwrap_err().status, 431);
    }

    #[test]
    fn partial_heads_wait() {
        assert!(parse("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
        assert!(parse("GET / HT").unwrap().is_none());
    }

    #[test]
    fn leading_empty_lines_are_skipped() {
        let (h, n) = parse("\r\n\r\nGET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert_eq!(n, 22);
        assert!(!h.keep_alive);
    }

    #[test]
    fn content_length_rules() {
        let (h, _) = parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyFraming::Length(5));
        let (h, _) = parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyFraming::Length(5));
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\n"),
            400
        );
        assert_eq!(status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n"), 400);
        assert_eq!(status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\n"), 400);
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"),
            400
        );
    }

    #[test]
    fn content_length_is_normalised_to_one_field() {
        let mut h = HeaderMap::new();
        for v in ["5, 5", "005", "5"] {
            h.append(CONTENT_LENGTH, HeaderValue::from_static(v));
        }
        normalise_content_length(&mut h);
        assert_eq!(h.get_all(CONTENT_LENGTH).iter().collect::<Vec<_>>(), ["5"]);
        // No valid length: no field at all, rather than one passed on as received.
        h.append(CONTENT_LENGTH, HeaderValue::from_static("6"));
        normalise_content_length(&mut h);
        assert!(!h.contains_key(CONTENT_LENGTH));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("+5"));
        normalise_content_length(&mut h);
        assert!(!h.contains_key(CONTENT_LENGTH));
    }

    #[test]
    fn transfer_encoding_rules() {
        let (h, _) = parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyFraming::Chunked);
        let (h, _) = parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: ChUnKeD\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyFraming::Chunked);
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n"),
            400
        );
        assert_eq!(status("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
        assert_eq!(status("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \r\n\r\n"), 400);
    }

    #[test]
    fn framing_lookalikes_are_rejected() {
        for name in [
            "Transfer_Encoding",
            "transfer_encoding",
            "Content_Length",
            "content-LENGTH",
        ] {
            let head = format!("POST / HTTP/1.1\r\nHost: x\r\n{name}: 5\r\n\r\n");
            if name.contains('_') {
                assert_eq!(status(&head), 400, "{name}");
            } else {
                assert!(parse(&head).unwrap().is_some(), "{name}");
            }
        }
        assert!(!framing_lookalike("x_content_length"));
        assert!(!framing_lookalike("Content-Length"));
    }

    #[test]
    fn transfer_encoding_with_obs_text_is_rejected() {
        // Found by fuzz/request_head: the element (or, before, the whole
        // field) holding obs-text was skipped and the head taken as chunked.
        for head in [
            &b"T / HTTP/1.1\r\nHost:\r\nTransfer-Encoding:chunked,\xff\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\x80\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \xffx\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let err = parse_request(head, &HeadLimits::default()).expect_err("should be rejected");
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn obs_fold_and_bare_line_endings_are_rejected() {
        assert_eq!(status("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\nHost: x\n\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: x\r\nX: y\n\r\n"), 400);
        assert_eq!(status("\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
        // A bare LF is caught even before the head is complete.
        assert_eq!(status("GET / HTTP/1.1\r\nHost: x\nX: "), 400);
    }

    #[test]
    fn every_cr_in_a_head_precedes_an_lf_and_every_lf_follows_a_cr() {
        let end = |s: &str| head_end(s.as_bytes()).map_err(|e| e.reason);
        let head = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(end(head), Ok(Some(head.len())));
        // What follows the blank line is the body's, not the head's.
        assert_eq!(end(&format!("{head}a\rb\nc")), Ok(Some(head.len())));
        // A CR that is the last byte so far may be a CRLF's first half.
        assert_eq!(end("GET / HTTP/1.1\r\nHost: x\r"), Ok(None));
        assert_eq!(end("GET / HTTP/1.1\r\nHost: x\r\n\r"), Ok(None));
        assert_eq!(end("GET / HTTP/1.1\r\nHost: x\rX"), Err("bare CR in request head"));
        assert_eq!(
            end("GET / HTTP/1.1\r\nHost: x\r\n\r\r\n"),
            Err("bare CR in request head")
        );
        assert_eq!(end("GET / HTTP/1.1\r\nA: \r\r\n\r\n"), Err("bare CR in request head"));
        assert_eq!(end("GET / HTTP/1.1\r\nHost: x\r\n\n"), Err("bare LF in request head"));
        assert_eq!(end("\nGET / HTTP/1.1\r\n\r\n"), Err("bare LF in request head"));
    }

    #[test]
    fn oversized_heads() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(9000));
        assert_eq!(status(&long), 414);
        let unterminated = format!("GET /{}", "a".repeat(9000));
        assert_eq!(status(&unterminated), 414);
        let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n", "b".repeat(70_000));
        assert_eq!(status(&big), 431);
        let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(status(&format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n")), 431);
    }

    #[test]
    fn host_rules() {
        assert_eq!(status("GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: u@h\r\n\r\n"), 400);
        assert!(parse("GET / HTTP/1.0\r\n\r\n").unwrap().is_some());
    }

    #[test]
    fn targets_and_versions() {
        assert!(
            parse("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
                .unwrap()
                .is_some()
        );
        assert_eq!(status("CONNECT example.com HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
        assert_eq!(status("CONNECT /x HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
        assert!(parse("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n").unwrap().is_some());
        assert_eq!(status("GET * HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
        assert!(
            parse("GET http://h:1/p HTTP/1.1\r\nHost: h:1\r\n\r\n")
                .unwrap()
                .is_some()
        );
        assert_eq!(status("GET h/p HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/2.0\r\nHost: x\r\n\r\n"), 505);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n"), 417);
        let (h, _) = parse("PUT / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.expect_continue);
    }

    #[test]
    fn connection_tokens() {
        let (h, _) = parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, Close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
        let (h, _) = parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
    }

    #[test]
    fn obs_text_does_not_hide_connection_tokens() {
        // Found by fuzz/request_head: the whole value used to be skipped.
        let (h, _) = parse_request(
            b"T / HTTP/1.1\r\nHost:\r\nConnection:\x90,Close\r\n\r\n",
            &HeadLimits::default(),
        )
        .unwrap()
        .unwrap();
        assert!(!h.keep_alive);
        let tokens: Vec<&str> = list_tokens(&h.headers, &CONNECTION).collect();
        assert_eq!(tokens, ["Close"]);
    }
}
