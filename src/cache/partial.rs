//! Partial content (RFC 9111 3.3 and 3.4): the 206 responses stored for a
//! URL, reused for the ranges they hold and combined into the complete
//! response once they cover it.
//!
//! Parts live in memory only (the disk tier stores complete responses; the
//! complete response a combination makes is stored in both tiers, as any
//! other). They are kept for an object whose complete length is known and at
//! most [`PartialStore`]'s per-object limit; a response with `Vary` is not
//! kept. Parts combine only under one strong validator (RFC 9110 8.8.1,
//! RFC 9111 3.4): a new part with another validator, or with none, replaces
//! what was kept, and a weak entity tag is no strong validator.

use super::key::ObjectId;
use super::object::StoredMeta;
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http::header::{CONTENT_LENGTH, CONTENT_RANGE, DATE, ETAG, LAST_MODIFIED};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A single-part `Content-Range` (RFC 9110 14.4): the bytes it holds and
/// the complete length, None when the sender does not know it (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentRange {
    /// The bytes held (end exclusive).
    pub range: Range<u64>,
    /// The representation's complete length, if known.
    pub complete: Option<u64>,
}

/// Parses `bytes FIRST-LAST/COMPLETE` (or `/*`); None for anything else,
/// including an unsatisfied-range (`bytes */N`), a last position before
/// the first, or one at or past a known complete length.
pub fn parse_content_range(value: &[u8]) -> Option<ContentRange> {
    let s = std::str::from_utf8(value).ok()?.trim();
    let rest = s.strip_prefix("bytes ")?;
    let (span, complete) = rest.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let digits = |t: &str| (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse::<u64>().ok())?;
    let (first, last) = (digits(first)?, digits(last)?);
    let complete = match complete {
        "*" => None,
        n => Some(digits(n)?),
    };
    if last < first || complete.is_some_and(|c| last >= c) {
        return None;
    }
    Some(ContentRange {
        range: first..last.checked_add(1)?,
        complete,
    })
}

/// A strong validator (RFC 9110 8.8.1) of a response, by which its parts
/// may be combined with others'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validator {
    /// A strong entity tag.
    ETag(Vec<u8>),
    /// A `Last-Modified` that is strong: no entity tag, and a `Date` at
    /// least 60 seconds later (RFC 9110 8.8.2.2).
    LastModified(Vec<u8>),
}

/// The strong validator of a response with `headers`, if it has one. An
/// entity tag that is weak (`W/`) makes none: the response does not say its
/// bytes are the same as another's of the same tag.
pub fn strong_validator(headers: &HeaderMap) -> Option<Validator> {
    if let Some(etag) = headers.get(ETAG) {
        let v = etag.as_bytes().trim_ascii();
        return (v.len() >= 2 && v.starts_with(b"\"") && v.ends_with(b"\"")).then(|| Validator::ETag(v.to_vec()));
    }
    let lm = headers.get(LAST_MODIFIED)?;
    let time = |v: &http::HeaderValue| v.to_str().ok().and_then(|s| httpdate::parse_http_date(s).ok());
    let (modified, date) = (time(lm)?, time(headers.get(DATE)?)?);
    (date.duration_since(modified).ok()? >= Duration::from_secs(60))
        .then(|| Validator::LastModified(lm.as_bytes().to_vec()))
}

/// The parts kept for one object.
#[derive(Debug, Clone)]
pub struct Parts {
    /// The headers as a complete response would have them (no
    /// `Content-Range`, no `Content-Length`), status 200, and the times of
    /// the latest part (its freshness).
    pub meta: Arc<StoredMeta>,
    /// The complete length.
    pub complete: u64,
    /// The strong validator all parts share; None: the one part kept has none
    /// (it may be reused, never combined).
    pub validator: Option<Validator>,
    /// Disjoint, non-adjacent byte spans by start offset.
    spans: BTreeMap<u64, Bytes>,
}

impl Parts {
    /// The bytes of `r` if one kept span holds them all.
    pub fn get(&self, r: &Range<u64>) -> Option<Bytes> {
        let (&start, span) = self.spans.range(..=r.start).next_back()?;
        let end = start + span.len() as u64;
        (r.end <= end).then(|| span.slice((r.start - start) as usize..(r.end - start) as usize))
    }

    /// Bytes held.
    fn held(&self) -> u64 {
        self.spans.values().map(|b| b.len() as u64).sum()
    }

    /// The complete body, when the spans cover it.
    fn whole(&self) -> Option<Bytes> {
        let span = self.spans.get(&0)?;
        (span.len() as u64 == self.complete).then(|| span.clone())
    }

    /// Adds `data` at `start`, merging it with the spans it overlaps or
    /// touches (under one strong validator, their bytes agree).
    fn add(&mut self, start: u64, data: Bytes) {
        let mut lo = start;
        let mut hi = start + data.len() as u64;
        let touching: Vec<u64> = self
            .spans
            .iter()
            .filter(|&(&s, b)| s <= hi && s + b.len() as u64 >= lo)
            .map(|(&s, _)| s)
            .collect();
        if touching.is_empty() {
            self.spans.insert(start, data);
            return;
        }
        for s in &touching {
            let b = &self.spans[s];
            lo = lo.min(*s);
            hi = hi.max(s + b.len() as u64);
        }
        let mut merged = BytesMut::zeroed((hi - lo) as usize);
        for s in &touching {
            if let Some(b) = self.spans.remove(s) {
                let at = (s - lo) as usize;
                merged[at..at + b.len()].copy_from_slice(&b);
            }
        }
        // The new bytes last: the newest response's content wins.
        let at = (start - lo) as usize;
        merged[at..at + data.len()].copy_from_slice(&data);
        self.spans.insert(lo, merged.freeze());
    }
}

/// A 206 response to keep: its part and what it says of the whole.
#[derive(Debug)]
pub struct NewPart {
    /// The headers as a complete response would have them, status 200.
    pub meta: StoredMeta,
    /// Where the body goes, and the complete length.
    pub start: u64,
    /// See [`Parts::complete`].
    pub complete: u64,
    /// The body (exactly the Content-Range's bytes).
    pub body: Bytes,
}

/// The headers of a 206 response as the complete response would have them:
/// no `Content-Range` (the parts' own) and no `Content-Length`.
pub fn whole_headers(mut headers: HeaderMap) -> HeaderMap {
    headers.remove(CONTENT_RANGE);
    headers.remove(CONTENT_LENGTH);
    headers
}

/// What adding a part did.
#[derive(Debug)]
pub enum Added {
    /// Kept; the object is still incomplete.
    Kept,
    /// The parts now make the complete response: its metadata and body
    /// (the parts are dropped; the caller stores the response).
    Complete(Box<StoredMeta>, Bytes),
    /// Not kept (over the per-object limit).
    Refused,
}

/// The parts kept for every object, in memory, with a byte budget: past it
/// the objects whose parts were first kept are dropped first.
#[derive(Debug)]
pub struct PartialStore {
    inner: Mutex<Inner>,
    /// Largest complete length kept in parts.
    max_object: u64,
    /// Bytes all parts may hold.
    budget: u64,
}

#[derive(Debug, Default)]
struct Inner {
    objects: HashMap<ObjectId, Parts>,
    order: VecDeque<ObjectId>,
    held: u64,
}

impl PartialStore {
    /// A store keeping objects of at most `max_object` bytes, `budget` in all.
    pub fn new(max_object: u64, budget: u64) -> PartialStore {
        PartialStore {
            inner: Mutex::default(),
            max_object,
            budget,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The parts kept for `id`, if any.
    pub fn get(&self, id: ObjectId) -> Option<Parts> {
        self.lock().objects.get(&id).cloned()
    }

    /// Drops every part kept.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.objects.clear();
        inner.order.clear();
        inner.held = 0;
    }

    /// Drops the parts of every object whose URL starts with `prefix` (a
    /// prefix purge).
    pub fn remove_under(&self, prefix: &str) {
        let mut inner = self.lock();
        let gone: Vec<ObjectId> = inner
            .objects
            .iter()
            .filter(|(_, p)| crate::cache::key::url_of(&p.meta.key).starts_with(prefix))
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            if let Some(p) = inner.objects.remove(id) {
                inner.held -= p.held();
            }
        }
        let gone: std::collections::HashSet<ObjectId> = gone.into_iter().collect();
        inner.order.retain(|o| !gone.contains(o));
    }

    /// Drops the parts of `id` (a complete response was stored, or the
    /// object was invalidated).
    pub fn remove(&self, id: ObjectId) {
        let mut inner = self.lock();
        if let Some(p) = inner.objects.remove(&id) {
            inner.held -= p.held();
            inner.order.retain(|o| *o != id);
        }
    }

    /// Keeps `part` of object `id`; combines it with the parts kept when
    /// both have the same strong validator (RFC 9111 3.4), the same
    /// complete length and came from the same address (`StoredMeta::origin`,
    /// which the kept parts share), else it replaces them. A combination updates the
    /// kept headers from the new part's (as a 304 would, RFC 9111 3.4 with
    /// 3.2), at `times`.
    pub fn add(&self, id: ObjectId, part: NewPart) -> Added {
        if part.complete > self.max_object || part.body.len() as u64 > self.budget {
            return Added::Refused;
        }
        let validator = strong_validator(&part.meta.headers);
        let mut guard = self.lock();
        let inner = &mut *guard;
        let combinable = inner.objects.get(&id).is_some_and(|p| {
            validator.is_some()
                && p.validator == validator
                && p.complete == part.complete
                && p.meta.origin == part.meta.origin
        });
        if !combinable && let Some(old) = inner.objects.remove(&id) {
            inner.held -= old.held();
            inner.order.retain(|o| *o != id);
        }
        if let Some(p) = inner.objects.get_mut(&id) {
            let mut meta = StoredMeta::clone(&p.meta);
            super::policy::update_from_304(
                &mut meta,
                &part.meta.headers,
                part.meta.request_time,
                part.meta.response_time,
            );
            p.meta = Arc::new(meta);
        } else {
            inner.order.push_back(id);
            inner.objects.insert(
                id,
                Parts {
                    meta: Arc::new(part.meta),
                    complete: part.complete,
                    validator,
                    spans: BTreeMap::new(),
                },
            );
        }
        let Some(parts) = inner.objects.get_mut(&id) else {
            return Added::Refused;
        };
        let before = parts.held();
        parts.add(part.start, part.body);
        let after = parts.held();
        if let Some(body) = parts.whole() {
            let meta = StoredMeta::clone(&parts.meta);
            inner.objects.remove(&id);
            inner.order.retain(|o| *o != id);
            inner.held -= before;
            return Added::Complete(Box::new(meta), body);
        }
        inner.held = inner.held - before + after;
        while inner.held > self.budget {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(p) = inner.objects.remove(&oldest) {
                inner.held -= p.held();
            }
        }
        Added::Kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// Metadata with these headers, received at `at`.
    fn meta_with(headers: &[(&str, &str)], at: SystemTime) -> StoredMeta {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        StoredMeta {
            key: "http://o/x".into(),
            variant: Vec::new(),
            status: http::StatusCode::OK,
            headers: h,
            request_time: at,
            response_time: at,
            origin: None,
            derived: Default::default(),
        }
    }

    fn part(headers: &[(&str, &str)], start: u64, complete: u64, body: &'static [u8]) -> NewPart {
        NewPart {
            meta: meta_with(headers, SystemTime::UNIX_EPOCH),
            start,
            complete,
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn content_range_is_first_last_and_complete_length_or_unknown() {
        let cr = |s: &str| parse_content_range(s.as_bytes());
        assert_eq!(
            cr("bytes 4-9/10"),
            Some(ContentRange {
                range: 4..10,
                complete: Some(10)
            })
        );
        assert_eq!(
            cr("bytes 0-4/*"),
            Some(ContentRange {
                range: 0..5,
                complete: None
            })
        );
        for bad in [
            "bytes */10",
            "bytes 5-4/10",
            "bytes 0-10/10",
            "bytes -1/10",
            "items 0-1/2",
            "bytes 0-1/",
            "bytes 0-18446744073709551615/*",
        ] {
            assert_eq!(cr(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_weak_entity_tag_is_not_a_strong_validator() {
        let h = |p: &[(&str, &str)]| meta_with(p, SystemTime::UNIX_EPOCH).headers;
        assert_eq!(
            strong_validator(&h(&[("etag", "\"a\"")])),
            Some(Validator::ETag(b"\"a\"".to_vec()))
        );
        assert_eq!(strong_validator(&h(&[("etag", "W/\"a\"")])), None);
        // Even with a strong-looking Last-Modified beside it.
        assert_eq!(
            strong_validator(&h(&[
                ("etag", "W/\"a\""),
                ("last-modified", "Mon, 01 Jan 2024 00:00:00 GMT"),
                ("date", "Tue, 02 Jan 2024 00:00:00 GMT")
            ])),
            None
        );
    }

    #[test]
    fn a_last_modified_is_strong_only_60_seconds_before_the_date() {
        let h = |date: &str| {
            meta_with(
                &[("last-modified", "Mon, 01 Jan 2024 00:00:00 GMT"), ("date", date)],
                SystemTime::UNIX_EPOCH,
            )
            .headers
        };
        assert!(strong_validator(&h("Mon, 01 Jan 2024 00:01:00 GMT")).is_some());
        assert_eq!(strong_validator(&h("Mon, 01 Jan 2024 00:00:59 GMT")), None);
    }

    #[test]
    fn parts_with_the_same_strong_validator_combine_into_the_complete_response() {
        let s = PartialStore::new(1 << 20, 1 << 20);
        let v = [("etag", "\"v\"")];
        assert!(matches!(s.add(ObjectId(1), part(&v, 5, 10, b"56789")), Added::Kept));
        assert_eq!(
            s.get(ObjectId(1)).and_then(|p| p.get(&(6..9))),
            Some(Bytes::from_static(b"678"))
        );
        assert_eq!(s.get(ObjectId(1)).and_then(|p| p.get(&(4..9))), None);
        match s.add(ObjectId(1), part(&v, 0, 10, b"012345")) {
            Added::Complete(_, body) => assert_eq!(&body[..], b"0123456789"),
            other => panic!("{other:?}"),
        }
        assert!(s.get(ObjectId(1)).is_none());
    }

    #[test]
    fn parts_with_different_validators_or_none_never_combine() {
        let s = PartialStore::new(1 << 20, 1 << 20);
        s.add(ObjectId(1), part(&[("etag", "\"a\"")], 0, 10, b"01234"));
        assert!(matches!(
            s.add(ObjectId(1), part(&[("etag", "\"b\"")], 5, 10, b"56789")),
            Added::Kept
        ));
        // The new one replaced the old one.
        let p = s.get(ObjectId(1)).expect("kept");
        assert_eq!(p.get(&(0..1)), None);
        assert_eq!(p.validator, Some(Validator::ETag(b"\"b\"".to_vec())));
        for v in [&[("etag", "W/\"w\"")][..], &[][..]] {
            let s = PartialStore::new(1 << 20, 1 << 20);
            s.add(ObjectId(2), part(v, 0, 10, b"01234"));
            assert!(
                matches!(s.add(ObjectId(2), part(v, 5, 10, b"56789")), Added::Kept),
                "{v:?}"
            );
        }
    }

    #[test]
    fn parts_are_kept_within_the_budget_and_the_object_limit() {
        let s = PartialStore::new(10, 8);
        assert!(matches!(s.add(ObjectId(1), part(&[], 0, 11, b"0")), Added::Refused));
        s.add(ObjectId(1), part(&[], 0, 10, b"0123"));
        s.add(ObjectId(2), part(&[], 0, 10, b"0123"));
        s.add(ObjectId(3), part(&[], 0, 10, b"0123"));
        assert!(s.get(ObjectId(1)).is_none(), "the oldest went");
        assert!(s.get(ObjectId(3)).is_some());
    }
}
