//! Response heads from origins and parent proxies: httparse, plus RFC
//! 9112's rules for how a response's body is delimited (section 6.3) and
//! whether its connection can carry another request. Pure functions over a
//! buffer (no I/O), like the client side's `http1::head`.
//!
//! The head's bytes are copied off the read buffer into one allocation of
//! their own (see `parse_response`), and every field value is a slice of
//! it: no value is copied on its own.

use crate::http1::head::{content_length, list_tokens};
use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use std::mem::MaybeUninit;
use std::ops::Range;

/// Largest response head read, status line and fields together (Squid's
/// `reply_header_max_size` default): an origin sending more gets a 502.
pub const MAX_HEAD: usize = 64 << 10;

/// Most header fields in one response head (hyper's client allowed 100).
pub const MAX_FIELDS: usize = 128;

/// How a response body is delimited (RFC 9112 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: a response to HEAD, a 1xx, 204 or 304 (rule 1).
    Empty,
    /// `Content-Length: n` (rule 6).
    Length(u64),
    /// `Transfer-Encoding` ending in `chunked` (rule 4).
    Chunked,
    /// Neither: the body ends when the origin closes the connection
    /// (rules 4 and 8); the connection is not reused.
    UntilClose,
}

/// A parsed and checked response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The fields in order, names lower-cased; values share the head's bytes.
    pub headers: HeaderMap,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the connection may carry another request after this
    /// response (RFC 9112 9.3).
    pub keep_alive: bool,
}

/// Why a response head cannot be used: the exchange fails with a 502 and
/// the connection is closed (RFC 9112 6.3: "the proxy MUST close the
/// connection to the server, discard the received response, and send a
/// 502 (Bad Gateway) response to the client").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidResponse(pub &'static str);

impl std::fmt::Display for InvalidResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Tries to parse one response head at the start of `buf`, the answer to a
/// request with `method`. On success the head's bytes are taken off `buf`,
/// which then starts with the body (or the next head, after a 1xx).
/// `Ok(None)`: more bytes are needed.
pub fn parse_response(buf: &mut BytesMut, method: &Method) -> Result<Option<ResponseHead>, InvalidResponse> {
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_FIELDS];
    let (used, status, version, count) = {
        // Left uninitialised: httparse writes the slots it uses.
        let mut storage = [const { MaybeUninit::uninit() }; MAX_FIELDS];
        let mut res = httparse::Response::new(&mut []);
        let used =
            match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut res, buf, &mut storage) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                    return Err(InvalidResponse("its head is larger than 64 KiB"));
                }
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(InvalidResponse("its head has more than 128 header fields"));
                }
                Err(httparse::Error::Status) => return Err(InvalidResponse("its status code is invalid")),
                Err(httparse::Error::Version) => return Err(InvalidResponse("it is not HTTP/1.0 or HTTP/1.1")),
                Err(httparse::Error::HeaderName) => return Err(InvalidResponse("a header field name is invalid")),
                Err(httparse::Error::HeaderValue) => return Err(InvalidResponse("a header field value is invalid")),
                Err(httparse::Error::NewLine) => return Err(InvalidResponse("a line ending is invalid")),
                Err(_) => return Err(InvalidResponse("its status line is malformed")),
            };
        if used > MAX_HEAD {
            return Err(InvalidResponse("its head is larger than 64 KiB"));
        }
        let status = res
            .code
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or(InvalidResponse("its status code is invalid"))?;
        let version = match res.version {
            Some(0) => Version::HTTP_10,
            Some(1) => Version::HTTP_11,
            _ => return Err(InvalidResponse("it is not HTTP/1.0 or HTTP/1.1")),
        };
        let base = buf.as_ptr() as usize;
        // Offsets into the head, so that values can be sliced from it once
        // it is frozen (`MAX_HEAD` fits in u32).
        let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        for (span, h) in spans.iter_mut().zip(res.headers.iter()) {
            let name = offset(h.name.as_bytes());
            let value = offset(h.value);
            *span = (name, name + h.name.len() as u32, value, value + h.value.len() as u32);
        }
        (used, status, version, res.headers.len())
    };
    // The head gets an allocation of its own rather than a share of the
    // read buffer: its values live as long as the stored response, and a
    // slice of the buffer would keep all of it (16 KiB and more) alive with
    // every cached object (a 128 MiB memory tier of 13 KB objects held a
    // 305 MiB process). Copying a few hundred bytes costs less than that.
    let head = Bytes::copy_from_slice(&buf[..used]);
    buf.advance(used);
    let range = |a: u32, b: u32| -> Range<usize> { a as usize..b as usize };
    // Room for what the proxy adds (Via, Date, Age, the cache status, the
    // framing field): growing a `HeaderMap` rehashes and reallocates it.
    let mut headers = HeaderMap::with_capacity(count + 6);
    for &(n0, n1, v0, v1) in &spans[..count] {
        let name = HeaderName::from_bytes(&head[range(n0, n1)])
            .map_err(|_| InvalidResponse("a header field name is invalid"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(range(v0, v1)))
            .map_err(|_| InvalidResponse("a header field value is invalid"))?;
        headers.append(name, value);
    }
    let framing = framing(method, status, version, &headers)?;
    let (mut close, mut keep) = (false, false);
    for token in list_tokens(&headers, &CONNECTION) {
        close |= token.eq_ignore_ascii_case("close");
        keep |= token.eq_ignore_ascii_case("keep-alive");
    }
    let keep_alive = framing != Framing::UntilClose && !close && (version == Version::HTTP_11 || keep);
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        framing,
        keep_alive,
    }))
}

/// RFC 9112 6.3, in its order, for a response to `method`.
fn framing(
    method: &Method,
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
) -> Result<Framing, InvalidResponse> {
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    let has_te = headers.contains_key(TRANSFER_ENCODING);
    if has_te {
        // Both "might indicate an attempt to perform request smuggling or
        // response splitting and ought to be handled as an error" (6.3):
        // nginx refuses it too.
        if headers.contains_key(CONTENT_LENGTH) {
            return Err(InvalidResponse(
                "it has both Content-Length and Transfer-Encoding (refused: RFC 9112 6.3)",
            ));
        }
        // 6.1: "A recipient that receives an HTTP/1.0 message containing a
        // Transfer-Encoding header field MUST treat the message as if the
        // framing is faulty".
        if version == Version::HTTP_10 {
            return Err(InvalidResponse("it is HTTP/1.0 with Transfer-Encoding"));
        }
        if headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .any(|v| !v.as_bytes().is_ascii())
        {
            return Err(InvalidResponse("its Transfer-Encoding is invalid"));
        }
        let mut chunked = 0;
        let mut last_chunked = false;
        for coding in list_tokens(headers, &TRANSFER_ENCODING) {
            last_chunked = coding.eq_ignore_ascii_case("chunked");
            chunked += usize::from(last_chunked);
        }
        // 6.1: "A sender MUST NOT apply the chunked transfer coding more
        // than once to a message body".
        if chunked > 1 {
            return Err(InvalidResponse("its Transfer-Encoding applies chunked twice"));
        }
        return Ok(if last_chunked {
            Framing::Chunked
        } else {
            // 6.3 rule 4: chunked is not the final coding: the body lasts
            // until the connection closes.
            Framing::UntilClose
        });
    }
    match content_length(headers) {
        Ok(Some(n)) => Ok(Framing::Length(n)),
        Ok(None) => Ok(Framing::UntilClose),
        Err(_) => Err(InvalidResponse("its Content-Length is invalid")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, method: Method) -> Result<Option<ResponseHead>, InvalidResponse> {
        let mut buf = BytesMut::from(text.as_bytes());
        parse_response(&mut buf, &method)
    }

    fn head(text: &str) -> ResponseHead {
        match parse(text, Method::GET) {
            Ok(Some(h)) => h,
            other => panic!("{text:?}: {other:?}"),
        }
    }

    fn refused(text: &str) -> &'static str {
        match parse(text, Method::GET) {
            Err(InvalidResponse(why)) => why,
            other => panic!("{text:?} was accepted: {other:?}"),
        }
    }

    #[test]
    fn the_head_is_taken_off_the_buffer_and_the_body_stays() {
        let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhelloHTTP/1.1"[..]);
        let h = parse_response(&mut buf, &Method::GET)
            .expect("valid")
            .expect("complete");
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.framing, Framing::Length(5));
        assert_eq!(h.headers["x-a"], "b");
        assert_eq!(&buf[..], b"helloHTTP/1.1");
    }

    #[test]
    fn an_incomplete_head_waits_for_more_and_takes_nothing() {
        let text = &b"HTTP/1.1 200 OK\r\nContent-Len"[..];
        let mut buf = BytesMut::from(text);
        assert!(parse_response(&mut buf, &Method::GET).expect("valid").is_none());
        assert_eq!(&buf[..], text);
    }

    #[test]
    fn any_response_to_a_head_request_is_terminated_by_the_first_empty_line() {
        // RFC 9112 6.3 rule 1.
        let h = parse("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", Method::HEAD)
            .expect("valid")
            .expect("complete");
        assert_eq!(h.framing, Framing::Empty);
        assert!(h.keep_alive);
        for status in ["101", "103", "204", "304"] {
            let h = head(&format!("HTTP/1.1 {status} X\r\nContent-Length: 7\r\n\r\n"));
            assert_eq!(h.framing, Framing::Empty, "{status}");
        }
    }

    #[test]
    fn chunked_as_the_final_coding_delimits_the_body() {
        // Rule 4.
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").framing,
            Framing::Chunked
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n").framing,
            Framing::Chunked
        );
    }

    #[test]
    fn if_chunked_is_not_the_final_coding_the_body_lasts_until_the_server_closes() {
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive);
    }

    #[test]
    fn transfer_encoding_and_content_length_together_are_refused() {
        assert!(
            refused("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n")
                .contains("both Content-Length and Transfer-Encoding")
        );
    }

    #[test]
    fn transfer_encoding_in_http_1_0_is_faulty_framing() {
        assert!(refused("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").contains("HTTP/1.0"));
    }

    #[test]
    fn chunked_twice_or_with_obs_text_is_refused() {
        refused("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n");
        refused("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n");
        refused("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, \u{ff}\r\n\r\n");
    }

    #[test]
    fn an_invalid_content_length_is_an_unrecoverable_error() {
        // Rule 5: "the proxy MUST close the connection to the server,
        // discard the received response, and send a 502".
        for cl in ["5, 6", "-1", "abc", "1e3", "", "99999999999999999999"] {
            assert!(
                refused(&format!("HTTP/1.1 200 OK\r\nContent-Length: {cl}\r\n\r\n")).contains("Content-Length"),
                "{cl:?}"
            );
        }
        refused("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n");
    }

    #[test]
    fn repeated_equal_content_lengths_state_one_length() {
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n").framing,
            Framing::Length(5)
        );
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n").framing,
            Framing::Length(5)
        );
    }

    #[test]
    fn without_length_or_coding_the_body_lasts_until_close() {
        // Rule 8.
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive);
    }

    #[test]
    fn http_1_0_is_kept_alive_only_when_it_says_so() {
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
        assert!(head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(!head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: x, close\r\n\r\n").keep_alive);
        assert!(head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
    }

    #[test]
    fn malformed_heads_are_refused_with_a_reason() {
        assert!(refused("HTTP/2.0 200 OK\r\n\r\n").contains("HTTP/1"));
        assert!(refused("HTTP/1.1 20 OK\r\n\r\n").contains("status"));
        assert!(refused("HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n").contains("name"));
        assert!(refused("SSH-2.0-OpenSSH_9.2\r\n\r\n").len() > 5);
        let many: String = (0..=MAX_FIELDS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert!(refused(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")).contains("128"));
    }

    #[test]
    fn a_head_larger_than_the_limit_is_refused_before_it_ends() {
        let mut text = String::from("HTTP/1.1 200 OK\r\nX-Big: ");
        text.push_str(&"a".repeat(MAX_HEAD));
        let mut buf = BytesMut::from(text.as_bytes());
        assert!(parse_response(&mut buf, &Method::GET).is_err());
    }

    #[test]
    fn field_values_keep_their_bytes_obs_text_included() {
        let h = head("HTTP/1.1 200 OK\r\nX-Text: caf\u{e9}\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(h.headers["x-text"].as_bytes(), "caf\u{e9}".as_bytes());
    }
}
