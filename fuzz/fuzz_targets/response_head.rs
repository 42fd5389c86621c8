#![no_main]
//! `origin_response::parse_response` (the upstream client's parser of an
//! origin's response head) on arbitrary bytes; the first byte chooses the
//! request method it answers (odd: HEAD). The framing oracle re-derives
//! RFC 9112 6.3 from the raw head bytes, not from the parser's HeaderMap.

use bytes::BytesMut;
use http::{Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use portico::origin_response::{Framing, MAX_FIELDS, MAX_HEAD, parse_response};

fn trim(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(start, |i| i + 1);
    &s[start..end.max(start)]
}

/// (name, value) of each field line of a complete head, straight from the
/// bytes (httparse skips empty lines before the status line).
fn raw_fields(head: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .skip_while(|l| l.is_empty());
    lines.next(); // status line
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let colon = l.iter().position(|&b| b == b':').expect("field line without a colon");
            (&l[..colon], trim(&l[colon + 1..]))
        })
        .collect()
}

fn elements<'a>(fields: &[(&'a [u8], &'a [u8])], name: &str) -> Vec<&'a [u8]> {
    fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(trim)
        .filter(|e| !e.is_empty())
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else { return };
    let method = if selector & 1 == 1 { Method::HEAD } else { Method::GET };
    let mut buf = BytesMut::from(input);
    match parse_response(&mut buf, &method) {
        Err(e) => {
            assert!(!e.0.is_empty());
        }
        Ok(None) => {
            // Waiting for more only within the limit, and taking nothing.
            assert!(input.len() <= MAX_HEAD, "waiting with {} bytes", input.len());
            assert_eq!(&buf[..], input);
        }
        Ok(Some(head)) => {
            let used = input.len() - buf.len();
            assert_eq!(&buf[..], &input[used..], "more than the head was taken");
            assert!(used <= MAX_HEAD);
            assert!(head.headers.len() <= MAX_FIELDS);
            let raw = &input[..used];
            assert!(raw.ends_with(b"\n\n") || raw.ends_with(b"\n\r\n"), "head does not end with a blank line");
            // The same head from exactly its bytes; none from one byte fewer.
            let mut exact = BytesMut::from(raw);
            let again = parse_response(&mut exact, &method).expect("head alone refused").expect("head alone incomplete");
            assert!(exact.is_empty());
            assert_eq!((again.status, again.framing, again.keep_alive), (head.status, head.framing, head.keep_alive));
            assert_eq!(again.headers, head.headers);
            let mut short = BytesMut::from(&raw[..used - 1]);
            if let Ok(Some(h)) = parse_response(&mut short, &method) {
                panic!("a complete head from one byte fewer: {h:?}");
            }
            // Framing, from the raw fields (RFC 9112 6.3).
            let fields = raw_fields(raw);
            assert_eq!(fields.len(), head.headers.len(), "field count differs from the raw head");
            let te = elements(&fields, "transfer-encoding");
            let has_te = fields.iter().any(|(n, _)| n.eq_ignore_ascii_case(b"transfer-encoding"));
            let has_cl = fields.iter().any(|(n, _)| n.eq_ignore_ascii_case(b"content-length"));
            let bodiless = method == Method::HEAD
                || head.status.is_informational()
                || head.status == StatusCode::NO_CONTENT
                || head.status == StatusCode::NOT_MODIFIED;
            match head.framing {
                Framing::Empty => assert!(bodiless),
                Framing::Length(n) => {
                    assert!(!bodiless && !has_te);
                    let cl = elements(&fields, "content-length");
                    assert!(!cl.is_empty());
                    for v in cl {
                        assert_eq!(std::str::from_utf8(v).ok().and_then(|v| v.parse::<u64>().ok()), Some(n));
                    }
                }
                Framing::Chunked => {
                    assert!(!bodiless && !has_cl && has_te);
                    assert!(te.last().is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
                    assert_eq!(te.iter().filter(|c| c.eq_ignore_ascii_case(b"chunked")).count(), 1);
                }
                Framing::UntilClose => {
                    assert!(!bodiless && !has_cl);
                    assert!(!head.keep_alive, "a close-delimited body on a kept connection");
                    assert!(!te.last().is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
                }
            }
        }
    }
});
