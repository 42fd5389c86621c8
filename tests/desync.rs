//! The desync corpus: request smuggling and response splitting attempts
//! through a reverse listener of the real binary to a recording origin
//! with a strict RFC 9112 parser of its own (tests/common/raw_origin.rs).
//!
//! Each request case sends its raw bytes followed, on the same connection,
//! by a pipelined `GET /next` (with `Connection: close`), then checks
//! Portico's answers and the exact message boundaries the origin saw. A
//! case passes when no origin could see other message boundaries than
//! Portico did: Portico refused it (nothing, or only a message cut off
//! before its end, reached the origin), or the origin got a canonical
//! re-framed message that any RFC 9112 parser reads the same way. The
//! response cases do the same for what origins send back: Portico's
//! answer to the client is well framed, and an origin connection whose
//! framing was in doubt is never used for the next request.
//!
//! All cases share one Portico and one origin, run one after the other
//! (so the origin's record belongs to the case that ran).

mod common;

use std::time::Duration;

use common::*;

/// What follows the case's first response on the client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// The pipelined `GET /next` is forwarded and answered 200.
    Next,
    /// The connection is closed after the first response.
    Closed,
    /// Portico answers a second time with this status itself (the bytes
    /// after the first request's body are not a valid request).
    Second(u16),
}

/// A request case: the raw bytes a client sends, Portico's status for
/// them, what comes after, and the origin's view of what it received
/// (`Recorded::view`: request line, framing fields, body; several messages
/// joined by `" || "`; `""` for nothing; `CUT`).
struct Case {
    name: &'static str,
    raw: &'static [u8],
    status: u16,
    then: Then,
    origin: &'static str,
}

/// Forwarded as `origin`, answered 200, then the pipelined request too.
const fn ok(name: &'static str, raw: &'static [u8], origin: &'static str) -> Case {
    Case {
        name,
        raw,
        status: 200,
        then: Then::Next,
        origin,
    }
}

/// Refused with `status` before anything reaches the origin; connection closed.
const fn no(name: &'static str, raw: &'static [u8], status: u16) -> Case {
    Case {
        name,
        raw,
        status,
        then: Then::Closed,
        origin: "",
    }
}

/// Anything else.
const fn case(name: &'static str, raw: &'static [u8], status: u16, then: Then, origin: &'static str) -> Case {
    Case {
        name,
        raw,
        status,
        then,
        origin,
    }
}

use Then::{Closed, Next, Second};

/// The origin view of a request Portico refused while its body streamed:
/// nothing reached the origin, or only a message cut off before its end
/// (the connection closed), which no origin acts on.
const CUT: &str = "nothing, or a message cut off";

/// The request side. Host is `t` unless the case is about Host.
const CASES: &[Case] = &[
    // Baselines: well-framed requests are re-framed canonically.
    ok("plain GET", b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n", "GET /a HTTP/1.1"),
    ok("POST with Content-Length", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("POST chunked", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("POST chunked, two chunks", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello world"),
    ok("POST empty with Content-Length 0", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n", "POST /a HTTP/1.1 | content-length: 0"),
    ok("GET with a body", b"GET /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", "GET /a HTTP/1.1 | content-length: 5 | hello"),
    ok("GET with a chunked body", b"GET /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "GET /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("a request inside a body stays body", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 35\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n", "POST /a HTTP/1.1 | content-length: 35 | GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"),
    ok("chunked trailers announced", b"POST /a HTTP/1.1\r\nHost: t\r\nTrailer: x-sum\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello | trailer x-sum: 1"),
    ok("leading empty lines", b"\r\n\r\nGET /a HTTP/1.1\r\nHost: t\r\n\r\n", "GET /a HTTP/1.1"),
    // CL.TE and TE.CL: both framings at once.
    no("CL.TE", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nSMUGGLED", 400),
    no("TE.CL", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n", 400),
    no("CL 0 with TE", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    no("TE with a CL list", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 5, 5\r\n\r\n0\r\n\r\n", 400),
    no("TE with CL in odd case", b"POST /a HTTP/1.1\r\nHost: t\r\ncontent-LENGTH: 5\r\nTRANSFER-encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    no("TE in HTTP/1.0 with CL", b"POST /a HTTP/1.0\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello", 400),
    no("GET with CL 0 and TE", b"GET /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    // TE.TE: obfuscated Transfer-Encoding.
    no("TE chunked, identity", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
    no("TE identity, chunked", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n", 501),
    no("TE gzip, chunked", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    no("TE identity", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity\r\n\r\n", 400),
    no("TE xchunked", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400),
    no("TE chunkedx", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunkedx\r\n\r\n0\r\n\r\n", 400),
    no("TE chunked twice, two fields", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    no("TE chunked, chunked", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400),
    no("TE chunked then identity field", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n", 400),
    no("TE in HTTP/1.0", b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    no("TE with a parameter", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n", 400),
    no("TE quoted", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: \"chunked\"\r\n\r\n0\r\n\r\n", 400),
    no("TE empty", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: \r\n\r\n", 400),
    no("TE with obs-text", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\xff\r\n\r\n0\r\n\r\n", 400),
    no("TE with NUL", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\x00\r\n\r\n0\r\n\r\n", 400),
    no("TE with form feed", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: \x0cchunked\r\n\r\n0\r\n\r\n", 400),
    no("Transfer_Encoding look-alike", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer_Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    no("Content_Length look-alike", b"POST /a HTTP/1.1\r\nHost: t\r\nContent_Length: 5\r\n\r\nhello", 400),
    ok("TE leading space", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding:  chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("TE leading tab", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("TE trailing space", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked \r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("TE upper case", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("TE with an empty element", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: , chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("TE named in Connection", b"POST /a HTTP/1.1\r\nHost: t\r\nConnection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    // Content-Length: lists, duplicates, signs, bases, overflow.
    ok("CL list of equal values", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 5\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("CL twice, equal", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("CL twice, odd case", b"POST /a HTTP/1.1\r\nHost: t\r\ncontent-length: 5\r\nCONTENT-LENGTH: 5\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("CL leading zeros", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 005\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("CL list with leading zeros", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5,05,005\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("CL with whitespace", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length:  5 \r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("CL 0 on GET", b"GET /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n", "GET /a HTTP/1.1 | content-length: 0"),
    ok("CL list of zeros", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0, 00\r\n\r\n", "POST /a HTTP/1.1 | content-length: 0"),
    ok("CL named in Connection", b"POST /a HTTP/1.1\r\nHost: t\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    no("CL list of different values", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5, 6\r\n\r\nhello!", 400),
    no("CL twice, different", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400),
    no("CL 0 then 5", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\nhello", 400),
    no("CL +5", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\nhello", 400),
    no("CL -5", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\nhello", 400),
    no("CL -0", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: -0\r\n\r\n", 400),
    no("CL list with a signed value", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5, +5\r\n\r\nhello", 400),
    no("CL hex", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0x5\r\n\r\nhello", 400),
    no("CL decimal point", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5.0\r\n\r\nhello", 400),
    no("CL exponent", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5e0\r\n\r\nhello", 400),
    no("CL trailing letter", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5a\r\n\r\nhello", 400),
    no("CL two numbers", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5 5\r\n\r\nhello", 400),
    no("CL empty", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: \r\n\r\n", 400),
    no("CL empty element", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5,\r\n\r\nhello", 400),
    no("CL only a comma", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: ,\r\n\r\n", 400),
    no("CL overflow", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999999999\r\n\r\nhello", 400),
    no("CL 2^64", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 18446744073709551616\r\n\r\nhello", 400),
    no("CL with NUL", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\x00\r\n\r\nhello", 400),
    no("CL with vertical tab", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\x0b\r\n\r\nhello", 400),
    no("CL over max_body_size", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 999999999999999999\r\n\r\nhello", 413),
    case("CL longer than the body sent", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nhello", 200, Second(400), "POST /a HTTP/1.1 | content-length: 10 | helloGET /"),
    // Chunk-size oddities.
    ok("chunk size with trailing space", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("chunk size with trailing tab", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\t\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("chunk size upper-case hex", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | 0123456789"),
    ok("chunk size leading zeros", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0005\r\nhello\r\n000\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("chunk extension", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;foo=bar\r\nhello\r\n0;last\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    ok("chunk extension, quoted", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5 ; a=\"b;\\\" c\"\r\nhello\r\n0\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    no("chunk size with leading space", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk size 0x5", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk size -5", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk size +5", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk size missing", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk size 17 digits", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk size junk after digits", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5 x\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk extension without name", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk extension with NUL", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;a\x00b\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk extension unterminated quote", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\"b\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk extension value missing", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\r\nhello\r\n0\r\n\r\n", 400),
    no("chunk size line with bare LF", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", 400),
    no("chunk size line with bare CR", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\rhello\r\n0\r\n\r\n", 400),
    no("last-chunk line with bare LF", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\n\r\n", 400),
    case("chunk data longer than its size", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", 400, Closed, CUT),
    case("chunk data shorter than its size", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n7\r\nhello\r\n0\r\n\r\n", 400, Closed, CUT),
    case("chunk data followed by bare LF", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n", 400, Closed, CUT),
    case("chunk size beyond max_body_size", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n", 400, Closed, CUT),
    case("no final CRLF: next request read as trailers", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n", 400, Closed, CUT),
    case("trailer with obs-fold", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-A: 1\r\n b\r\n\r\n", 400, Closed, CUT),
    case("trailer with bare LF", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-A: 1\n\r\n", 400, Closed, CUT),
    ok("Content-Length as a trailer", b"POST /a HTTP/1.1\r\nHost: t\r\nTrailer: content-length\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 50\r\n\r\n", "POST /a HTTP/1.1 | transfer-encoding: chunked | hello"),
    // Bare LF and bare CR line endings.
    no("bare LF after the request line", b"GET /a HTTP/1.1\nHost: t\r\n\r\n", 400),
    no("bare LF everywhere", b"GET /a HTTP/1.1\nHost: t\n\n", 400),
    no("bare LF ends the head", b"GET /a HTTP/1.1\r\nHost: t\r\n\n", 400),
    no("bare LF before the request", b"\nGET /a HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("bare CR inside a field", b"GET /a HTTP/1.1\r\nHost: t\rX-A: 1\r\n\r\n", 400),
    no("bare CR before CRLF", b"GET /a HTTP/1.1\r\nHost: t\r\r\n\r\n", 400),
    no("bare CR hides TE", b"POST /a HTTP/1.1\r\nHost: t\r\nX-A: 1\rTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    // obs-fold.
    no("obs-fold", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n 2\r\n\r\n", 400),
    no("obs-fold with a tab", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n\t2\r\n\r\n", 400),
    no("obs-fold of TE", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", 400),
    no("obs-fold of CL", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length:\r\n 5\r\n\r\nhello", 400),
    no("first field line folded", b"GET /a HTTP/1.1\r\n Host: t\r\n\r\n", 400),
    // Whitespace before the colon.
    no("space before the colon of TE", b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400),
    no("space before the colon of CL", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length : 5\r\n\r\nhello", 400),
    no("tab before the colon", b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length\t: 5\r\n\r\nhello", 400),
    no("space before the colon of Host", b"GET /a HTTP/1.1\r\nHost : t\r\n\r\n", 400),
    // Invalid name bytes.
    no("NUL in a name", b"GET /a HTTP/1.1\r\nHost: t\r\nX\x00A: 1\r\n\r\n", 400),
    no("space in a name", b"GET /a HTTP/1.1\r\nHost: t\r\nX A: 1\r\n\r\n", 400),
    no("obs-text in a name", b"GET /a HTTP/1.1\r\nHost: t\r\nX\xffA: 1\r\n\r\n", 400),
    no("@ in a name", b"GET /a HTTP/1.1\r\nHost: t\r\nX@A: 1\r\n\r\n", 400),
    no("slash in a name", b"GET /a HTTP/1.1\r\nHost: t\r\nX/A: 1\r\n\r\n", 400),
    no("empty name", b"GET /a HTTP/1.1\r\nHost: t\r\n: 1\r\n\r\n", 400),
    no("line without colon", b"GET /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding chunked\r\n\r\n", 400),
    // NUL and control bytes in values.
    no("NUL in a value", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: 1\x002\r\n\r\n", 400),
    no("SOH in a value", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: 1\x012\r\n\r\n", 400),
    no("DEL in a value", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: 1\x7f2\r\n\r\n", 400),
    no("ESC in a value", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: \x1b[0m\r\n\r\n", 400),
    ok("tab in a value", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: 1\t2\r\n\r\n", "GET /a HTTP/1.1"),
    ok("obs-text in a value", b"GET /a HTTP/1.1\r\nHost: t\r\nX-A: caf\xe9\r\n\r\n", "GET /a HTTP/1.1"),
    // absolute-form and Host.
    ok("absolute-form overrides Host", b"GET http://a.test/x HTTP/1.1\r\nHost: t\r\n\r\n", "GET /x HTTP/1.1 | host: a.test"),
    ok("absolute-form with an empty path", b"GET http://a.test HTTP/1.1\r\nHost: t\r\n\r\n", "GET / HTTP/1.1 | host: a.test"),
    ok("absolute-form with a port", b"GET http://a.test:8080/x?q=1 HTTP/1.1\r\nHost: b.test\r\n\r\n", "GET /x?q=1 HTTP/1.1 | host: a.test:8080"),
    no("absolute-form with user info", b"GET http://u@a.test/x HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    case("absolute-form, unknown scheme", b"GET ftp://a.test/x HTTP/1.1\r\nHost: t\r\n\r\n", 400, Closed, ""),
    no("absolute-form without Host", b"GET http://a.test/x HTTP/1.1\r\n\r\n", 400),
    no("two Host fields", b"GET /a HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n", 400),
    no("Host with user info", b"GET /a HTTP/1.1\r\nHost: u@t\r\n\r\n", 400),
    no("Host with a space", b"GET /a HTTP/1.1\r\nHost: t u\r\n\r\n", 400),
    no("Host with a path", b"GET /a HTTP/1.1\r\nHost: t/x\r\n\r\n", 400),
    no("HTTP/1.1 without Host", b"GET /a HTTP/1.1\r\n\r\n", 400),
    // Request-line oddities.
    no("two spaces after the method", b"GET  /a HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("two spaces before the version", b"GET /a  HTTP/1.1\r\nHost: t\r\n\r\n", 505),
    no("tab as separator", b"GET\t/a HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("space before the method", b" GET /a HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("space after the version", b"GET /a HTTP/1.1 \r\nHost: t\r\n\r\n", 400),
    no("HTTP/1.2", b"GET /a HTTP/1.2\r\nHost: t\r\n\r\n", 505),
    no("HTTP/2.0", b"GET /a HTTP/2.0\r\nHost: t\r\n\r\n", 505),
    no("HTTP/0.9 without version", b"GET /a\r\nHost: t\r\n\r\n", 400),
    no("lower-case version", b"GET /a http/1.1\r\nHost: t\r\n\r\n", 505),
    no("NUL in the target", b"GET /a\x00b HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("invalid byte in the method", b"G@T /a HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("NUL before the method", b"\x00GET /a HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("asterisk-form with GET", b"GET * HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    no("relative target", b"GET a HTTP/1.1\r\nHost: t\r\n\r\n", 400),
    ok("lower-case method", b"get /a HTTP/1.1\r\nHost: t\r\n\r\n", "get /a HTTP/1.1"),
    ok("extension method with a body", b"PURGEX /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", "PURGEX /a HTTP/1.1 | content-length: 5 | hello"),
    ok("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n", "OPTIONS * HTTP/1.1"),
    case("CONNECT on a reverse listener", b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", 405, Next, ""),
    case("HTTP/1.0 POST", b"POST /a HTTP/1.0\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", 200, Closed, "POST /a HTTP/1.1 | content-length: 5 | hello"),
    ok("HTTP/1.0 keep-alive", b"GET /a HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\n", "GET /a HTTP/1.1"),
    // Expect: 100-continue.
    ok("100-continue, body sent", b"POST /a HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", "POST /a HTTP/1.1 | content-length: 5 | hello"),
    no("100-continue, early 403, no body", b"POST /deny HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", 403),
    no("100-continue, early 403, body sent", b"POST /deny HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello", 403),
    no("100-continue, early 403, chunked", b"POST /deny HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n", 403),
    no("100-continue over max_body_size", b"POST /a HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n", 413),
    no("unknown expectation", b"POST /a HTTP/1.1\r\nHost: t\r\nExpect: 200-ok\r\nContent-Length: 5\r\n\r\nhello", 417),
    case("403 without Expect drains the body", b"POST /deny HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello", 403, Next, ""),
];

/// A response case: what the origin answers to `GET /r/<index>` (and
/// whether it then closes), and what the client must get: status and body
/// (`"!truncated"`: no complete response, the connection closed). The
/// pipelined `GET /next` must always get its own answer; when `fresh`, on
/// another origin connection than the case's.
struct Resp {
    name: &'static str,
    reply: &'static [u8],
    close: bool,
    status: u16,
    body: &'static str,
    fresh: bool,
}

const fn resp(
    name: &'static str,
    reply: &'static [u8],
    close: bool,
    status: u16,
    body: &'static str,
    fresh: bool,
) -> Resp {
    Resp {
        name,
        reply,
        close,
        status,
        body,
        fresh,
    }
}

/// The response side: `fresh` is asked where the origin's framing was in
/// doubt (or it closed), so its connection must not serve the next request.
const RESPONSES: &[Resp] = &[
    resp(
        "well framed",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        false,
        200,
        "hello",
        false,
    ),
    resp(
        "chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        false,
        200,
        "hello",
        false,
    ),
    resp(
        "CL and TE",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        false,
        502,
        "",
        true,
    ),
    resp(
        "TE and CL",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 30\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        false,
        502,
        "",
        true,
    ),
    resp(
        "CL and TE not chunked",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: identity\r\n\r\nhello",
        true,
        502,
        "",
        true,
    ),
    resp(
        "CL list of equal values",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        false,
        200,
        "hello",
        false,
    ),
    resp(
        "CL twice",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        false,
        200,
        "hello",
        false,
    ),
    resp(
        "CL leading zeros",
        b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\nhello",
        false,
        200,
        "hello",
        false,
    ),
    resp(
        "CL list of different values",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!",
        false,
        502,
        "",
        true,
    ),
    resp(
        "CL +5",
        b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        false,
        502,
        "",
        true,
    ),
    resp(
        "CL -5",
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
        false,
        502,
        "",
        true,
    ),
    resp(
        "CL not a number",
        b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\nhello",
        false,
        502,
        "",
        true,
    ),
    resp(
        "body longer than CL",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
        false,
        200,
        "hi",
        true,
    ),
    resp(
        "body shorter than CL, then close",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",
        true,
        200,
        "!truncated",
        true,
    ),
    resp(
        "no framing on keep-alive, then close",
        b"HTTP/1.1 200 OK\r\n\r\nhello",
        true,
        200,
        "hello",
        true,
    ),
    resp(
        "TE not chunked: read to close",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nhello",
        true,
        200,
        "hello",
        true,
    ),
    resp(
        "TE xchunked: read to close",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        true,
        200,
        "5\r\nhello\r\n0\r\n\r\n",
        true,
    ),
    resp(
        "TE in HTTP/1.0",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        true,
        502,
        "",
        true,
    ),
    resp(
        "invalid chunk size",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n",
        false,
        200,
        "!truncated",
        true,
    ),
    resp(
        "204 with a body",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
        false,
        204,
        "",
        true,
    ),
    resp(
        "Transfer_Encoding look-alike",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer_Encoding: chunked\r\n\r\nhello",
        false,
        200,
        "hello",
        false,
    ),
];

const NEXT: &[u8] = b"GET /next HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

/// The corpus's Portico: a reverse listener to `origin`, no cache (every
/// request reaches the origin), short timeouts so a case that leaves
/// Portico waiting for bytes ends within a second.
async fn start(origin: &RecordingOrigin) -> Portico {
    Portico::start(&format!(
        r#"[[listener]]
address = "{}"
mode = "reverse"

[limits]
header_timeout = "1s"
max_body_size = "64KiB"

[origin]
idle_timeout = "1s"

[cache]
enabled = false

[[upstream]]
name = "o"
servers = ["{}"]

[[rule]]
path = "/deny"
deny = 403

[[rule]]
upstream = "o"
"#,
        free_addr(),
        origin.addr()
    ))
    .await
}

/// Sends `raw` then the pipelined `GET /next`; returns the final (non-1xx)
/// responses, what stopped their parse, and whether Portico closed.
async fn send(p: &Portico, raw: &[u8]) -> (Vec<ParsedResponse>, Option<String>, bool) {
    let mut client = RawClient::connect(p.addr()).await;
    client.timeout = Duration::from_secs(4);
    client.send(&[raw, NEXT].concat()).await;
    let bytes = client.read_to_end().await;
    let (responses, stop) = parse_responses_lenient(&bytes);
    let finals = responses.into_iter().filter(|r| r.status >= 200).collect();
    (finals, stop, client.is_eof())
}

/// Every framing field Portico sends a client must be canonical: at most
/// one `Content-Length`, digits only, never with `Transfer-Encoding`, and
/// no look-alike spelt with `_`.
fn framing_problem(r: &ParsedResponse) -> Option<String> {
    let cl = r.headers_all("content-length");
    let te = r.headers_all("transfer-encoding");
    let lookalike = r.headers.iter().any(|(k, _)| {
        k.contains('_')
            && matches!(
                k.to_ascii_lowercase().replace('_', "-").as_str(),
                "content-length" | "transfer-encoding"
            )
    });
    let canonical = cl.len() <= 1
        && cl
            .iter()
            .all(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && (*v == "0" || !v.starts_with('0')))
        && (cl.is_empty() || te.is_empty())
        && te.iter().all(|v| *v == "chunked")
        && !lookalike;
    (!canonical).then(|| format!("non-canonical framing sent to the client: {:?}", r.headers))
}

/// Runs one request case; None if it passed, else what went wrong.
async fn run_case(p: &Portico, origin: &RecordingOrigin, c: &Case) -> Option<String> {
    let (responses, stop, closed) = send(p, c.raw).await;
    let mut views: Vec<String> = origin.take().await.iter().map(|r| r.view("t")).collect();
    let mut wrong = Vec::new();
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    match responses.first() {
        Some(r) if r.status == c.status => {}
        _ => wrong.push(format!("client got {statuses:?} (parse: {stop:?}), want {}", c.status)),
    }
    wrong.extend(responses.iter().filter_map(framing_problem));
    match c.then {
        Then::Next => {
            if views.last().map(String::as_str) == Some("GET /next HTTP/1.1") {
                views.pop();
            } else {
                wrong.push("the pipelined GET /next did not reach the origin last".into());
            }
            let second = responses.get(1).map(|r| (r.status, r.body_str()));
            if second != Some((200, "GET /next HTTP/1.1".into())) || responses.len() != 2 {
                wrong.push(format!("pipelined GET /next answered {second:?}; all: {statuses:?}"));
            }
        }
        Then::Closed => {
            if responses.len() != 1 || !closed {
                wrong.push(format!(
                    "want one response then close; got {statuses:?}, closed: {closed}"
                ));
            }
        }
        Then::Second(status) => {
            if responses.get(1).map(|r| r.status) != Some(status) || responses.len() != 2 {
                wrong.push(format!("want a second response {status}; got {statuses:?}"));
            }
        }
    }
    let seen = views.join(" || ");
    let cut = c.origin == CUT && views.iter().all(|v| v == "!incomplete");
    if seen != c.origin && !cut {
        wrong.push(format!("origin saw {seen:?}, want {:?}", c.origin));
    }
    (!wrong.is_empty()).then(|| format!("{}: {}", c.name, wrong.join("; ")))
}

/// Runs one response case (`index` into `RESPONSES`).
async fn run_response(p: &Portico, origin: &RecordingOrigin, index: usize) -> Option<String> {
    let c = &RESPONSES[index];
    let request = format!("GET /r/{index} HTTP/1.1\r\nHost: t\r\n\r\n");
    let (responses, stop, closed) = send(p, request.as_bytes()).await;
    let got = origin.take().await;
    let mut wrong = Vec::new();
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    if c.body == "!truncated" {
        // The head may have gone out or not: either way no complete
        // response, and the connection closed.
        if !responses.is_empty() || !closed {
            wrong.push(format!("want no complete response; got {statuses:?} ({stop:?})"));
        }
    } else {
        match responses.first() {
            // Portico's own error pages are not compared.
            Some(r) if r.status == c.status && (r.status >= 500 || r.body_str() == c.body) => {}
            Some(r) => wrong.push(format!(
                "client got {} {:?}, want {} {:?}",
                r.status,
                r.body_str(),
                c.status,
                c.body
            )),
            None => wrong.push(format!("no response ({stop:?})")),
        }
        let second = responses.get(1).map(|r| (r.status, r.body_str()));
        if second != Some((200, "GET /next HTTP/1.1".into())) {
            wrong.push(format!("pipelined GET /next answered {second:?}"));
        }
        let lines: Vec<&str> = got.iter().map(|r| r.line.as_str()).collect();
        let want = [format!("GET /r/{index} HTTP/1.1"), "GET /next HTTP/1.1".to_string()];
        if lines != want {
            wrong.push(format!("origin saw {lines:?}"));
        } else if c.fresh && got[0].conn == got[1].conn {
            wrong.push("GET /next reused the connection of the doubtful response".into());
        }
    }
    wrong.extend(responses.iter().filter_map(framing_problem));
    (!wrong.is_empty()).then(|| format!("response {}: {}", c.name, wrong.join("; ")))
}

/// The origin's answer for `GET /r/<index>`, from `RESPONSES`.
fn scripted(rec: &Recorded) -> Option<Reply> {
    let index: usize = rec.target().strip_prefix("/r/")?.parse().ok()?;
    let c = RESPONSES.get(index)?;
    Some(Reply {
        bytes: c.reply.to_vec(),
        close: c.close,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn desync_corpus() {
    assert!(
        CASES.len() + RESPONSES.len() >= 100,
        "the corpus has {} cases",
        CASES.len() + RESPONSES.len()
    );
    let origin = RecordingOrigin::scripted(scripted).await;
    let p = start(&origin).await;
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    for c in CASES {
        failures.extend(run_case(&p, &origin, c).await);
    }
    for index in 0..RESPONSES.len() {
        failures.extend(run_response(&p, &origin, index).await);
    }
    eprintln!(
        "{} request and {} response cases in {:?}",
        CASES.len(),
        RESPONSES.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of the corpus failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Finding 7 of issue 13: a response with both Content-Length and
/// Transfer-Encoding was read as chunked, stored, and its connection
/// reused. It is refused (502), never stored, and its connection closed:
/// the same request reaches the origin again, on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_with_both_lengths_is_refused_not_stored_and_its_connection_closed() {
    let origin = RecordingOrigin::scripted(|rec| {
        (rec.target() == "/both").then(|| Reply {
            bytes: b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 5\r\n\
                     Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
            close: false,
        })
    })
    .await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"reverse\"\n\n[cache]\ndisk = \"0\"\n\n\
         [[upstream]]\nname = \"o\"\nservers = [\"{}\"]\n\n[[rule]]\nupstream = \"o\"\n",
        free_addr(),
        origin.addr()
    ))
    .await;
    for path in ["/both", "/both", "/after"] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let resp = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
        let want = if path == "/both" { 502 } else { 200 };
        assert_eq!(resp.status, want, "{path}: {resp:?}");
    }
    let got = origin.take().await;
    let lines: Vec<&str> = got.iter().map(|r| r.line.as_str()).collect();
    assert_eq!(
        lines,
        ["GET /both HTTP/1.1", "GET /both HTTP/1.1", "GET /after HTTP/1.1"]
    );
    let conns: Vec<usize> = got.iter().map(|r| r.conn).collect();
    assert_eq!(conns, [0, 1, 2], "a connection was reused after the ambiguous response");
    assert_eq!(origin.connections(), 3);
}
