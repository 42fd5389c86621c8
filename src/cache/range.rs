//! Byte ranges served from a complete stored response (RFC 9110 14).
//!
//! [`plan`] reads `Range` and `If-Range` against the stored response and
//! says what to send: the whole response (200), one part (206 with
//! `Content-Range:` [`content_range`]), several parts (206
//! `multipart/byteranges`, laid out by [`multipart`]) or nothing (416 with
//! `Content-Range:` [`unsatisfied_range`]).
//!
//! Choices where the RFC leaves room:
//! - a `Range` the parser does not understand (other unit, bad syntax,
//!   `last < first`, several `Range` fields) is ignored: 200;
//! - more than [`MAX_RANGES`] range specs: ignored (200), a cheap defence
//!   against many-small-ranges abuse;
//! - overlapping or adjacent ranges are coalesced (the parts are then in
//!   ascending order); disjoint ranges keep the order they were asked in;
//! - an empty representation has no bytes to send: a suffix range (`-N`)
//!   then gives the whole (empty) response, `N-` gives 416.

use crate::cache::policy::{etag_list, first_etag, parse_http_date};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use std::ops::Range;

/// The most range specs honoured in one `Range` header; more and the
/// header is ignored.
pub const MAX_RANGES: usize = 64;

/// What to send for a request that may carry `Range`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangePlan {
    /// The whole response (200): no `Range`, or one that is ignored.
    Full,
    /// One part (206): these bytes, with `Content-Range: content_range(..)`.
    Single(Range<u64>),
    /// Several parts (206, `multipart/byteranges`, see [`multipart`]), at
    /// least two, non-overlapping, non-adjacent.
    Multi(Vec<Range<u64>>),
    /// 416 Range Not Satisfiable, with `Content-Range: unsatisfied_range(len)`.
    Unsatisfiable,
}

/// Plans the answer to a request for a stored response of `len` bytes:
/// only `GET` requests for a `200` response are ranged (RFC 9110 14.2);
/// an `If-Range` that does not match the stored response makes the `Range`
/// ignored (13.1.5).
pub fn plan(
    method: &Method,
    req_headers: &HeaderMap,
    status: StatusCode,
    resp_headers: &HeaderMap,
    len: u64,
) -> RangePlan {
    if method != Method::GET || status != StatusCode::OK {
        return RangePlan::Full;
    }
    let mut ranges = req_headers.get_all(header::RANGE).iter();
    let (Some(range), None) = (ranges.next(), ranges.next()) else {
        return RangePlan::Full;
    };
    if let Some(if_range) = req_headers.get(header::IF_RANGE)
        && !if_range_matches(if_range, resp_headers)
    {
        return RangePlan::Full;
    }
    parse(range.as_bytes(), len)
}

/// Whether an `If-Range` value matches the stored response (RFC 9110
/// 13.1.5): an entity tag must be strong and equal to the stored strong
/// `ETag`; a date must equal the stored `Last-Modified`, which must itself
/// be strong, i.e. at least one second before the stored `Date` (8.8.2.2).
pub fn if_range_matches(if_range: &HeaderValue, resp_headers: &HeaderMap) -> bool {
    let value = if_range.as_bytes().trim_ascii();
    if value.starts_with(b"\"") || value.starts_with(b"W/") {
        let stored = first_etag(resp_headers);
        let asked = etag_list(value).into_iter().next();
        return matches!((stored, asked), (Some(s), Some(a)) if s.strong_eq(&a));
    }
    let Some(asked) = parse_http_date(if_range) else {
        return false;
    };
    let last_modified = resp_headers.get(header::LAST_MODIFIED).and_then(parse_http_date);
    let date = resp_headers.get(header::DATE).and_then(parse_http_date);
    match (last_modified, date) {
        (Some(lm), Some(date)) => lm == asked && lm < date,
        _ => false,
    }
}

/// One range spec as written.
enum Spec {
    /// `first-last` or `first-`.
    Int(u64, Option<u64>),
    /// `-suffix`.
    Suffix(u64),
}

/// Digits as u64, saturating; `None` for anything else.
fn number(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        text.iter()
            .fold(0u64, |n, &d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))),
    )
}

fn parse_spec(item: &[u8]) -> Option<Spec> {
    let dash = item.iter().position(|&b| b == b'-')?;
    let (first, last) = (&item[..dash], &item[dash + 1..]);
    if first.is_empty() {
        return Some(Spec::Suffix(number(last)?));
    }
    let first = number(first)?;
    if last.is_empty() {
        return Some(Spec::Int(first, None));
    }
    let last = number(last)?;
    // 14.1.1: last-pos < first-pos makes the range set invalid.
    (last >= first).then_some(Spec::Int(first, Some(last)))
}

/// The first byte the first range of a `Range` value asks for, when it
/// names one (`bytes=N-` or `bytes=N-M`, then anything): where a sliced
/// object's first slice is (`cache.slice`). None for a suffix range, another
/// unit or a value that does not parse so far.
pub fn first_byte(value: &[u8]) -> Option<u64> {
    let eq = value.iter().position(|&b| b == b'=')?;
    if !value[..eq].trim_ascii().eq_ignore_ascii_case(b"bytes") {
        return None;
    }
    let first = value[eq + 1..]
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .find(|item| !item.is_empty())?;
    match parse_spec(first)? {
        Spec::Int(first, _) => Some(first),
        Spec::Suffix(_) => None,
    }
}

/// Parses a `Range` value (`bytes=0-499, -500, 9500-`) against a total
/// length, with the rules in the module documentation.
pub fn parse(value: &[u8], len: u64) -> RangePlan {
    let Some(eq) = value.iter().position(|&b| b == b'=') else {
        return RangePlan::Full;
    };
    if !value[..eq].trim_ascii().eq_ignore_ascii_case(b"bytes") {
        return RangePlan::Full;
    }
    let mut specs = Vec::new();
    for item in value[eq + 1..].split(|&b| b == b',') {
        let item = item.trim_ascii();
        if item.is_empty() {
            continue; // empty list elements are allowed (RFC 9110 5.6.1)
        }
        if specs.len() == MAX_RANGES {
            return RangePlan::Full;
        }
        match parse_spec(item) {
            Some(spec) => specs.push(spec),
            None => return RangePlan::Full,
        }
    }
    if specs.is_empty() {
        return RangePlan::Full;
    }
    // 14.1.1: an int-range is satisfiable when first < len, a suffix range
    // when its length is not zero.
    let mut ranges = Vec::with_capacity(specs.len());
    let mut empty_but_satisfiable = false;
    for spec in specs {
        match spec {
            Spec::Int(first, last) if first < len => {
                let end = last.map_or(len, |last| last.saturating_add(1).min(len));
                ranges.push(first..end);
            }
            Spec::Int(..) | Spec::Suffix(0) => {}
            Spec::Suffix(_) if len == 0 => empty_but_satisfiable = true,
            Spec::Suffix(n) => ranges.push(len - n.min(len)..len),
        }
    }
    if ranges.is_empty() {
        return if empty_but_satisfiable {
            RangePlan::Full
        } else {
            RangePlan::Unsatisfiable
        };
    }
    let ranges = coalesce(ranges);
    if ranges.len() == 1 {
        RangePlan::Single(ranges[0].clone())
    } else {
        RangePlan::Multi(ranges)
    }
}

/// Keeps the order asked when no two ranges overlap or touch; otherwise
/// sorts and merges them (RFC 9110 15.3.7.2 allows coalescing).
fn coalesce(ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    let mut sorted = ranges.clone();
    sorted.sort_by_key(|r| r.start);
    if sorted.windows(2).all(|w| w[0].end < w[1].start) {
        return ranges;
    }
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// `Content-Range` of one part: `bytes FIRST-LAST/LEN` (`range` is
/// half-open, the header inclusive). `range` must be non-empty.
pub fn content_range(range: &Range<u64>, len: u64) -> String {
    format!("bytes {}-{}/{}", range.start, range.end.saturating_sub(1), len)
}

/// `Content-Range` of a 416: `bytes */LEN`.
pub fn unsatisfied_range(len: u64) -> String {
    format!("bytes */{len}")
}

/// A multipart boundary from a caller-chosen seed (a counter or random
/// number): 16 hex digits after a fixed prefix, well within the 70
/// characters RFC 2046 allows.
pub fn boundary(seed: u64) -> String {
    format!("portico-byteranges-{seed:016x}")
}

/// The layout of a `multipart/byteranges` body (RFC 9110 14.6): the caller
/// writes, for each part, its prefix then the stored bytes of its range,
/// then the trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Multipart {
    /// The response's `Content-Type`: `multipart/byteranges; boundary=...`.
    pub content_type: String,
    /// Each part: the delimiter and part headers to write, then the range of
    /// stored bytes to write after them.
    pub parts: Vec<(Bytes, Range<u64>)>,
    /// The closing delimiter, written after the last part's bytes.
    pub trailer: Bytes,
    /// The response's `Content-Length`: every prefix, range and the trailer.
    pub content_length: u64,
}

/// Lays out a multipart/byteranges body for `ranges` of a `len`-byte
/// representation whose type is `part_type` (sent as each part's
/// `Content-Type` when given), separated by `boundary`.
pub fn multipart(ranges: &[Range<u64>], len: u64, part_type: Option<&str>, boundary: &str) -> Multipart {
    let mut parts = Vec::with_capacity(ranges.len());
    let mut content_length = 0u64;
    for (i, range) in ranges.iter().enumerate() {
        let mut prefix = String::with_capacity(128);
        if i > 0 {
            prefix.push_str("\r\n");
        }
        prefix.push_str("--");
        prefix.push_str(boundary);
        prefix.push_str("\r\n");
        if let Some(part_type) = part_type {
            prefix.push_str("Content-Type: ");
            prefix.push_str(part_type);
            prefix.push_str("\r\n");
        }
        prefix.push_str("Content-Range: ");
        prefix.push_str(&content_range(range, len));
        prefix.push_str("\r\n\r\n");
        content_length += prefix.len() as u64 + (range.end - range.start);
        parts.push((Bytes::from(prefix), range.clone()));
    }
    let trailer = Bytes::from(format!("\r\n--{boundary}--\r\n"));
    content_length += trailer.len() as u64;
    Multipart {
        content_type: format!("multipart/byteranges; boundary={boundary}"),
        parts,
        trailer,
        content_length,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    fn p(value: &str, len: u64) -> RangePlan {
        parse(value.as_bytes(), len)
    }

    fn get(req: &[(&str, &str)], resp: &[(&str, &str)], len: u64) -> RangePlan {
        plan(&Method::GET, &hm(req), StatusCode::OK, &hm(resp), len)
    }

    #[test]
    fn single_ranges() {
        assert_eq!(p("bytes=0-499", 1000), RangePlan::Single(0..500));
        assert_eq!(p("bytes=500-999", 1000), RangePlan::Single(500..1000));
        assert_eq!(p("bytes=0-0", 1000), RangePlan::Single(0..1));
        assert_eq!(p("bytes=999-999", 1000), RangePlan::Single(999..1000));
        // Open and suffix ranges.
        assert_eq!(p("bytes=500-", 1000), RangePlan::Single(500..1000));
        assert_eq!(p("bytes=-500", 1000), RangePlan::Single(500..1000));
        assert_eq!(p("bytes=-1", 1000), RangePlan::Single(999..1000));
        assert_eq!(p("bytes=0-", 1000), RangePlan::Single(0..1000));
    }

    #[test]
    fn ranges_beyond_the_end_are_clamped() {
        assert_eq!(p("bytes=500-5000", 1000), RangePlan::Single(500..1000));
        assert_eq!(p("bytes=0-99999999999999999999999", 10), RangePlan::Single(0..10));
        // A suffix longer than the representation selects all of it.
        assert_eq!(p("bytes=-5000", 1000), RangePlan::Single(0..1000));
    }

    #[test]
    fn unsatisfiable_ranges() {
        assert_eq!(p("bytes=1000-", 1000), RangePlan::Unsatisfiable);
        assert_eq!(p("bytes=1000-2000", 1000), RangePlan::Unsatisfiable);
        assert_eq!(p("bytes=-0", 1000), RangePlan::Unsatisfiable);
        assert_eq!(p("bytes=2000-3000, 1000-", 1000), RangePlan::Unsatisfiable);
        assert_eq!(p("bytes=99999999999999999999999-", 10), RangePlan::Unsatisfiable);
        // Satisfiable parts win over unsatisfiable ones.
        assert_eq!(p("bytes=2000-3000, 0-9", 1000), RangePlan::Single(0..10));
        assert_eq!(unsatisfied_range(1000), "bytes */1000");
    }

    #[test]
    fn empty_representation() {
        assert_eq!(p("bytes=0-0", 0), RangePlan::Unsatisfiable);
        assert_eq!(p("bytes=0-", 0), RangePlan::Unsatisfiable);
        assert_eq!(p("bytes=-0", 0), RangePlan::Unsatisfiable);
        // A suffix range is satisfiable but selects nothing: send it whole.
        assert_eq!(p("bytes=-500", 0), RangePlan::Full);
    }

    #[test]
    fn invalid_syntax_is_ignored() {
        for value in [
            "bytes=a-b",
            "bytes=5-3",
            "bytes=0-1, 5-3",
            "bytes=",
            "bytes=,",
            "bytes=-",
            "bytes=1",
            "bytes=1-2-3",
            "bytes=+1-2",
            "bytes=0x10-20",
            "items=0-1",
            "bytes 0-1",
            "0-1",
            "",
        ] {
            assert_eq!(p(value, 1000), RangePlan::Full, "{value:?}");
        }
    }

    #[test]
    fn unit_is_case_insensitive_and_whitespace_tolerated() {
        assert_eq!(p("Bytes=0-1", 10), RangePlan::Single(0..2));
        assert_eq!(p(" BYTES = 0-1 ,, ", 10), RangePlan::Single(0..2));
    }

    #[test]
    fn multiple_ranges_keep_their_order_when_disjoint() {
        assert_eq!(p("bytes=0-9, 20-29", 100), RangePlan::Multi(vec![0..10, 20..30]));
        assert_eq!(
            p("bytes=50-59,0-9,-10", 100),
            RangePlan::Multi(vec![50..60, 0..10, 90..100])
        );
    }

    #[test]
    fn overlapping_or_adjacent_ranges_are_coalesced() {
        assert_eq!(p("bytes=0-9, 5-19", 100), RangePlan::Single(0..20));
        assert_eq!(p("bytes=0-9, 10-19", 100), RangePlan::Single(0..20));
        assert_eq!(p("bytes=50-59, 0-9, 55-70", 100), RangePlan::Multi(vec![0..10, 50..71]));
        assert_eq!(p("bytes=0-,0-,0-,-100", 100), RangePlan::Single(0..100));
    }

    #[test]
    fn too_many_ranges_are_ignored() {
        let many: Vec<String> = (0..=MAX_RANGES as u64)
            .map(|i| format!("{}-{}", i * 10, i * 10 + 1))
            .collect();
        assert_eq!(p(&format!("bytes={}", many.join(",")), 100_000), RangePlan::Full);
        let ok = &many[..MAX_RANGES];
        match p(&format!("bytes={}", ok.join(",")), 100_000) {
            RangePlan::Multi(r) => assert_eq!(r.len(), MAX_RANGES),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn plan_ranges_only_get_of_a_200() {
        let req = [("range", "bytes=0-9")];
        assert_eq!(get(&req, &[], 100), RangePlan::Single(0..10));
        assert_eq!(get(&[], &[], 100), RangePlan::Full);
        assert_eq!(
            plan(&Method::HEAD, &hm(&req), StatusCode::OK, &HeaderMap::new(), 100),
            RangePlan::Full
        );
        assert_eq!(
            plan(&Method::GET, &hm(&req), StatusCode::NOT_FOUND, &HeaderMap::new(), 100),
            RangePlan::Full
        );
        // Several Range fields: invalid, ignored.
        assert_eq!(
            get(&[("range", "bytes=0-9"), ("range", "bytes=20-29")], &[], 100),
            RangePlan::Full
        );
    }

    #[test]
    fn if_range_with_entity_tags_needs_a_strong_match() {
        let strong = [("etag", "\"v1\"")];
        let range = ("range", "bytes=0-9");
        assert_eq!(
            get(&[range, ("if-range", "\"v1\"")], &strong, 100),
            RangePlan::Single(0..10)
        );
        assert_eq!(get(&[range, ("if-range", "\"v2\"")], &strong, 100), RangePlan::Full);
        assert_eq!(get(&[range, ("if-range", "W/\"v1\"")], &strong, 100), RangePlan::Full);
        assert_eq!(
            get(&[range, ("if-range", "\"v1\"")], &[("etag", "W/\"v1\"")], 100),
            RangePlan::Full
        );
        assert_eq!(get(&[range, ("if-range", "\"v1\"")], &[], 100), RangePlan::Full);
    }

    #[test]
    fn if_range_with_a_date_needs_the_exact_strong_last_modified() {
        let lm = "Tue, 14 Nov 2023 22:00:00 GMT";
        let range = ("range", "bytes=0-9");
        let stored = [("last-modified", lm), ("date", "Tue, 14 Nov 2023 22:13:20 GMT")];
        assert_eq!(get(&[range, ("if-range", lm)], &stored, 100), RangePlan::Single(0..10));
        let later = "Tue, 14 Nov 2023 22:00:01 GMT";
        assert_eq!(get(&[range, ("if-range", later)], &stored, 100), RangePlan::Full);
        assert_eq!(get(&[range, ("if-range", "garbage")], &stored, 100), RangePlan::Full);
        // Last-Modified equal to Date is weak; no Date, weak too.
        let weak = [("last-modified", lm), ("date", lm)];
        assert_eq!(get(&[range, ("if-range", lm)], &weak, 100), RangePlan::Full);
        assert_eq!(
            get(&[range, ("if-range", lm)], &[("last-modified", lm)], 100),
            RangePlan::Full
        );
    }

    #[test]
    fn content_range_values() {
        assert_eq!(content_range(&(0..500), 1234), "bytes 0-499/1234");
        assert_eq!(content_range(&(0..1), 1), "bytes 0-0/1");
        assert_eq!(unsatisfied_range(0), "bytes */0");
    }

    #[test]
    fn multipart_layout_and_length() {
        let body: Vec<u8> = (0..100u8).collect();
        let b = boundary(0xabc);
        assert_eq!(b, "portico-byteranges-0000000000000abc");
        let mp = multipart(&[0..10, 50..60], 100, Some("text/plain"), &b);
        assert_eq!(mp.content_type, format!("multipart/byteranges; boundary={b}"));
        // Assemble the body the way the caller streams it.
        let mut out = Vec::new();
        for (prefix, r) in &mp.parts {
            out.extend_from_slice(prefix);
            out.extend_from_slice(&body[r.start as usize..r.end as usize]);
        }
        out.extend_from_slice(&mp.trailer);
        assert_eq!(out.len() as u64, mp.content_length);
        let mut expected = Vec::new();
        expected.extend_from_slice(
            format!("--{b}\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-9/100\r\n\r\n").as_bytes(),
        );
        expected.extend_from_slice(&body[0..10]);
        expected.extend_from_slice(
            format!("\r\n--{b}\r\nContent-Type: text/plain\r\nContent-Range: bytes 50-59/100\r\n\r\n").as_bytes(),
        );
        expected.extend_from_slice(&body[50..60]);
        expected.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
        assert_eq!(out, expected);
        // Without a type the parts carry only Content-Range.
        let mp = multipart(&[0..1, 2..3], 3, None, "B");
        assert_eq!(&mp.parts[0].0[..], b"--B\r\nContent-Range: bytes 0-0/3\r\n\r\n");
        assert_eq!(&mp.parts[1].0[..], b"\r\n--B\r\nContent-Range: bytes 2-2/3\r\n\r\n");
    }

    #[test]
    fn the_first_byte_is_that_of_the_first_range_as_written() {
        assert_eq!(first_byte(b"bytes=100-199"), Some(100));
        assert_eq!(first_byte(b"Bytes = , 5000-, 0-9"), Some(5000));
        assert_eq!(first_byte(b"bytes=-500"), None);
        assert_eq!(first_byte(b"items=1-2"), None);
        assert_eq!(first_byte(b"bytes=9-1"), None);
    }
}
