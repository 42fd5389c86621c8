//! Invariants of `parse_request` (and of `take_request`, the server's way
//! to the same result), shared by the `request_head` and `pipeline` targets. The oracles re-derive the framing from the raw head
//! bytes (not from the parser's `HeaderMap`), so a field the parser silently
//! skipped still counts.

use http::Version;
use bytes::BytesMut;
use portico::http1::head::{BodyFraming, HeadLimits, RequestHead, parse_request, take_request};

/// Small limits from three control bytes (0 included: a zero limit must be
/// an error, never a panic).
#[allow(dead_code)] // used by request_head only
pub fn small_limits(b: [u8; 3]) -> HeadLimits {
    HeadLimits {
        max_request_line: b[0] as usize,
        max_head: b[1] as usize * 4,
        // Up to 129, so the heap path (more than 128 header slots) is reached too.
        max_headers: b[2] as usize % 130,
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// The header lines of a complete head (`...\r\n\r\n`), as (name, value) with
/// the value trimmed, straight from the bytes.
fn raw_fields(head: &[u8]) -> Vec<(&[u8], &[u8])> {
    let body = &head[..head.len() - 4];
    let mut lines = body.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    lines.next(); // request line
    lines
        .map(|l| {
            let colon = l.iter().position(|&b| b == b':').expect("header line without a colon");
            (&l[..colon], trim(&l[colon + 1..]))
        })
        .collect()
}

fn values<'a>(fields: &[(&'a [u8], &'a [u8])], name: &str) -> Vec<&'a [u8]> {
    fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .map(|&(_, v)| v)
        .collect()
}

/// Non-empty comma-separated elements of all the values, trimmed.
fn elements<'a>(vals: &[&'a [u8]]) -> Vec<&'a [u8]> {
    vals.iter()
        .flat_map(|v| v.split(|&b| b == b','))
        .map(trim)
        .filter(|t| !t.is_empty())
        .collect()
}

fn same_head(a: &RequestHead, b: &RequestHead) -> bool {
    a.method == b.method
        && a.target == b.target
        && a.version == b.version
        && a.body == b.body
        && a.headers == b.headers
        && a.keep_alive == b.keep_alive
        && a.expect_continue == b.expect_continue
}

/// Parses `buf` and checks every invariant of the result; returns it.
pub fn check(buf: &[u8], limits: &HeadLimits) -> Option<(RequestHead, usize)> {
    let parsed = parse_request(buf, limits);
    // The server's `take_request` gives the same answer, takes exactly the
    // used bytes off the buffer, and leaves it untouched otherwise.
    let mut owned = BytesMut::from(buf);
    match (&parsed, take_request(&mut owned, limits)) {
        (Ok(Some((a, used))), Ok(Some(b))) => {
            assert!(same_head(a, &b), "take_request differs: {a:?} vs {b:?}");
            assert_eq!(&owned[..], &buf[*used..], "take_request took other bytes");
        }
        (Ok(None), Ok(None)) => assert_eq!(&owned[..], buf),
        (Err(a), Err(b)) => {
            assert_eq!(*a, b);
            assert_eq!(&owned[..], buf, "take_request lost bytes on an error");
        }
        (a, b) => panic!("parse_request {a:?} but take_request {b:?}"),
    }
    let (head, used) = match parsed {
        Err(e) => {
            assert!(
                matches!(e.status.as_u16(), 400 | 414 | 417 | 431 | 501 | 505),
                "unexpected status {e:?}"
            );
            assert!(!e.reason.is_empty());
            return None;
        }
        Ok(None) => {
            // Waiting for more is only allowed while every byte held is
            // within a limit: leading empty lines within max_head, the rest
            // within the request-line or head limit. Otherwise a client can
            // make the caller buffer without end.
            let mut start = 0;
            while buf[start..].starts_with(b"\r\n") {
                start += 2;
            }
            assert!(start <= limits.max_head, "unbounded leading empty lines: {start}");
            let rest = buf.len() - start;
            assert!(
                rest <= limits.max_request_line.max(limits.max_head),
                "waiting with {rest} bytes over the limits"
            );
            return None;
        }
        Ok(Some(parsed)) => parsed,
    };

    // Where the head is.
    assert!(used <= buf.len(), "used {used} > len {}", buf.len());
    assert!(buf[..used].ends_with(b"\r\n\r\n"), "head does not end with CRLFCRLF");
    let mut start = 0;
    while buf[start..used].starts_with(b"\r\n") {
        start += 2;
    }
    let raw = &buf[start..used];
    assert!(raw.len() >= 4 && !raw.starts_with(b"\r\n"));
    let first_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(first_end, raw.len(), "head runs past the first blank line");

    // Limits.
    let line_len = raw.iter().position(|&b| b == b'\n').unwrap() + 1;
    assert!(line_len <= limits.max_request_line, "request line over the limit");
    assert!(raw.len() <= limits.max_head, "head over the limit");
    assert!(head.headers.len() <= limits.max_headers, "too many fields accepted");

    // Line endings: no bare CR or LF, no obs-fold.
    for (i, &b) in raw.iter().enumerate() {
        match b {
            b'\n' => assert!(i > 0 && raw[i - 1] == b'\r', "bare LF accepted"),
            b'\r' => assert!(raw.get(i + 1) == Some(&b'\n'), "bare CR accepted"),
            _ => {}
        }
    }
    for line in raw.split(|&b| b == b'\n').skip(1) {
        assert!(!line.starts_with(b" ") && !line.starts_with(b"\t"), "obs-fold accepted");
    }

    // Same head from exactly the used bytes; none from one byte fewer.
    let (again, used_again) = parse_request(&buf[..used], limits)
        .expect("used bytes alone rejected")
        .expect("used bytes alone incomplete");
    assert_eq!(used_again, used);
    assert!(same_head(&head, &again), "reparse differs: {head:?} vs {again:?}");
    if let Ok(Some((other, n))) = parse_request(&buf[..used - 1], limits) {
        panic!("a complete head from one byte fewer: {n} {other:?}");
    }

    // Request line.
    assert!(head.version == Version::HTTP_10 || head.version == Version::HTTP_11);
    assert!(!head.target.is_empty());
    assert!(
        !head
            .target
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    );

    // Framing, from the raw fields.
    let fields = raw_fields(raw);
    assert_eq!(
        fields.len(),
        head.headers.len(),
        "field count differs from the raw head"
    );
    // No field another server could take for a framing field: `_` for `-`.
    for (name, _) in &fields {
        let dashed: Vec<u8> = name
            .iter()
            .map(|b| if *b == b'_' { b'-' } else { b.to_ascii_lowercase() })
            .collect();
        assert!(
            !name.contains(&b'_') || (dashed != b"content-length" && dashed != b"transfer-encoding"),
            "framing look-alike accepted: {}",
            String::from_utf8_lossy(name)
        );
    }
    let te = values(&fields, "transfer-encoding");
    let cl = values(&fields, "content-length");
    let cl_elems = elements(&cl);
    let mut cl_distinct: Vec<u64> = cl_elems
        .iter()
        .map(|e| {
            assert!(e.iter().all(u8::is_ascii_digit), "non-numeric Content-Length accepted");
            std::str::from_utf8(e)
                .unwrap()
                .parse::<u64>()
                .expect("Content-Length overflow accepted")
        })
        .collect();
    cl_distinct.sort_unstable();
    cl_distinct.dedup();
    if !cl.is_empty() {
        // Every listed element is a number: no empty ones either.
        let all: usize = cl.iter().map(|v| v.split(|&b| b == b',').count()).sum();
        assert_eq!(all, cl_elems.len(), "empty Content-Length element accepted");
    }
    match head.body {
        BodyFraming::Length(n) => {
            assert!(n > 0);
            assert!(te.is_empty(), "Length with Transfer-Encoding");
            assert_eq!(cl_distinct, [n], "Length needs exactly one distinct Content-Length");
        }
        BodyFraming::Chunked => {
            assert!(cl.is_empty(), "Chunked with Content-Length");
            assert_eq!(head.version, Version::HTTP_11, "Chunked in HTTP/1.0");
            let codings = elements(&te);
            assert!(
                codings.len() == 1 && codings[0].eq_ignore_ascii_case(b"chunked"),
                "Chunked but the codings are {:?}",
                codings.iter().map(|c| String::from_utf8_lossy(c)).collect::<Vec<_>>()
            );
        }
        BodyFraming::Empty => {
            assert!(te.is_empty(), "Empty with Transfer-Encoding");
            assert!(
                cl_distinct.is_empty() || cl_distinct == [0],
                "Empty with a non-zero Content-Length"
            );
        }
    }

    // Host.
    let hosts = values(&fields, "host").len();
    match head.version {
        Version::HTTP_11 => assert_eq!(hosts, 1, "HTTP/1.1 needs exactly one Host"),
        _ => assert!(hosts <= 1, "more than one Host"),
    }

    // Connection and Expect.
    let conn = elements(&values(&fields, "connection"));
    if conn.iter().any(|t| t.eq_ignore_ascii_case(b"close")) {
        assert!(!head.keep_alive, "Connection: close ignored");
    }
    if head.version == Version::HTTP_10 && !conn.iter().any(|t| t.eq_ignore_ascii_case(b"keep-alive")) {
        assert!(!head.keep_alive, "HTTP/1.0 kept alive without keep-alive");
    }
    let expect = values(&fields, "expect");
    assert!(expect.iter().all(|v| v.eq_ignore_ascii_case(b"100-continue")));
    if head.expect_continue {
        assert_eq!(head.version, Version::HTTP_11);
        assert!(!expect.is_empty());
    }

    Some((head, used))
}
