//! Response media-type filters: `[[acl]]` entries with `content_type`, or
//! naming a `kind = "mime"` `[[acl_list]]`, are *response entries*. They
//! are not part of the request's decision; once a request is allowed, the
//! response entries whose request matchers hold for it make its
//! [`ReplyFilter`], which the proxy applies to the response head (from the
//! origin, a parent or the cache) before any body byte goes to the client
//! and before anything is stored. This is Squid's `http_reply_access` with
//! `rep_mime_type`, and the Sun proxy's MIME-type filters.
//!
//! Matching follows RFC 9110 8.3.1: the media type is the field value up
//! to the first `;` (parameters are not matched), type and subtype are
//! compared case-insensitively, and whitespace around it is ignored.
//! A hostile origin cannot hide a type: every `Content-Type` field line and
//! every comma-separated element of each is read, and the response matches
//! when any of them does. A response whose fields give no valid
//! `type/subtype` at all (none, empty, non-ASCII, garbage) matches only
//! the pattern `none`.

use super::{Acl, Decision, Request};
use http::{HeaderMap, StatusCode};
use std::collections::HashMap;
use std::sync::Arc;

/// A set of media-type patterns: `type/subtype`, `type/*`, `*/*` (any
/// valid media type) and `none` (no valid media type). Each remembers the
/// line it came from (0 for `content_type` in the config itself).
#[derive(Debug, Default)]
pub(super) struct MimeSet {
    exact: HashMap<Box<str>, u32>,
    /// `video/*`, keyed by `video`.
    types: HashMap<Box<str>, u32>,
    any: Option<u32>,
    none: Option<u32>,
}

/// RFC 9110 `tchar`: what a type or subtype token is made of.
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(tchar)
}

impl MimeSet {
    /// Adds one pattern (from line `line`); the error says what is wrong
    /// with it.
    pub(super) fn insert(&mut self, pattern: &str, line: u32) -> Result<(), String> {
        let p = pattern.trim().to_ascii_lowercase();
        if p == "none" {
            self.none.get_or_insert(line);
            return Ok(());
        }
        if p.contains(';') {
            return Err(format!(
                "{pattern:?}: parameters are not matched (`text/html` matches `text/html; charset=utf-8`): write the type/subtype alone"
            ));
        }
        let bad = || {
            format!(
                "{pattern:?} is not a media type: write type/subtype (\"video/mp4\"), type/* (\"video/*\"), */* or none"
            )
        };
        let (ty, sub) = p.split_once('/').ok_or_else(bad)?;
        if !token(ty) || !token(sub) {
            return Err(bad());
        }
        match (ty, sub) {
            ("*", "*") => {
                self.any.get_or_insert(line);
            }
            ("*", _) => return Err(format!("{pattern:?}: a wildcard type needs a wildcard subtype (*/*)")),
            (_, "*") => {
                self.types.entry(ty.into()).or_insert(line);
            }
            _ if ty.contains('*') || sub.contains('*') => return Err(bad()),
            _ => {
                self.exact.entry(p.as_str().into()).or_insert(line);
            }
        }
        Ok(())
    }

    /// True when no pattern was given.
    pub(super) fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.types.is_empty() && self.any.is_none() && self.none.is_none()
    }

    /// The line and text of the pattern the response's media types match
    /// (the lowest line when several do), None when none does.
    pub(super) fn find(&self, types: &MediaTypes) -> Option<(u32, String)> {
        if types.types.is_empty() {
            return self.none.map(|l| (l, "none".to_string()));
        }
        let mut best: Option<(u32, String)> = None;
        let mut offer = |line: u32, text: &dyn Fn() -> String| {
            if best.as_ref().is_none_or(|(b, _)| line < *b) {
                best = Some((line, text()));
            }
        };
        if let Some(l) = self.any {
            offer(l, &|| "*/*".to_string());
        }
        for t in &types.types {
            if let Some(&l) = self.exact.get(t.as_str()) {
                offer(l, &|| t.clone());
            }
            let ty = t.split_once('/').map_or(t.as_str(), |(ty, _)| ty);
            if let Some(&l) = self.types.get(ty) {
                offer(l, &|| format!("{ty}/*"));
            }
        }
        best
    }

    /// The patterns as config text, for `describe`.
    pub(super) fn describe(&self) -> Vec<String> {
        let mut all: Vec<(u32, String)> = self.exact.iter().map(|(t, l)| (*l, t.to_string())).collect();
        all.extend(self.types.iter().map(|(t, l)| (*l, format!("{t}/*"))));
        all.extend(self.any.map(|l| (l, "*/*".to_string())));
        all.extend(self.none.map(|l| (l, "none".to_string())));
        all.sort();
        all.into_iter().map(|(_, t)| t).collect()
    }
}

/// The media types a response declares: every valid `type/subtype` of
/// every `Content-Type` field line and comma-separated element, lower-case,
/// without parameters. Empty when there is none (the `none` pattern).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MediaTypes {
    types: Vec<String>,
}

/// At most this many media types are kept from one response: a field of
/// 100,000 commas costs one pass over it, not 100,000 table lookups later.
/// A response listing more than this is a hostile or broken one, and its
/// first types are the ones a client would use.
const MAX_TYPES: usize = 16;

impl MediaTypes {
    /// Reads the `Content-Type` fields of `headers`.
    pub fn of(headers: &HeaderMap) -> MediaTypes {
        let mut types = Vec::new();
        for value in headers.get_all(http::header::CONTENT_TYPE) {
            for element in value.as_bytes().split(|&b| b == b',') {
                if types.len() >= MAX_TYPES {
                    break;
                }
                let media = element.split(|&b| b == b';').next().unwrap_or(&[]);
                let media = media.trim_ascii();
                let Some(slash) = media.iter().position(|&b| b == b'/') else {
                    continue;
                };
                let (ty, sub) = (&media[..slash], &media[slash + 1..]);
                if ty.is_empty() || sub.is_empty() || !ty.iter().all(|&b| tchar(b)) || !sub.iter().all(|&b| tchar(b)) {
                    continue;
                }
                // All tchar: ASCII, so this is valid UTF-8.
                let t = String::from_utf8_lossy(media).to_ascii_lowercase();
                if !types.contains(&t) {
                    types.push(t);
                }
            }
        }
        MediaTypes { types }
    }

    /// The media types from a `--content-type` value (`portico acl test`).
    pub fn parse(text: &str) -> MediaTypes {
        let mut h = HeaderMap::new();
        if let Ok(v) = http::HeaderValue::from_str(text) {
            h.insert(http::header::CONTENT_TYPE, v);
        }
        MediaTypes::of(&h)
    }

    /// The types, for messages (`none` when there is none).
    pub fn describe(&self) -> String {
        if self.types.is_empty() {
            "none".to_string()
        } else {
            self.types.join(", ")
        }
    }
}

/// What a response entry matches the response on: its own `content_type`
/// patterns and the `kind = "mime"` lists it names.
#[derive(Debug, Default)]
pub(super) struct ReplyMatch {
    pub inline: MimeSet,
    pub lists: Vec<Arc<super::lists::List>>,
}

impl ReplyMatch {
    /// Where the match came from (`content_type "video/*"`, or `list "media"
    /// (FILE:LINE: video/*)`), None when the response does not match.
    pub(super) fn hit(&self, types: &MediaTypes) -> Option<String> {
        if let Some((_, p)) = self.inline.find(types) {
            return Some(format!("content_type {p:?}"));
        }
        self.lists.iter().find_map(|l| {
            let (line, p) = l.mime()?.find(types)?;
            Some(format!("list {:?} ({}:{line}: {p})", l.name, l.file))
        })
    }
}

/// The response entries that apply to one request, in config order: what
/// its response head is checked against. Empty (and free) when the config
/// has no response entries.
#[derive(Debug, Clone, Default)]
pub struct ReplyFilter {
    inner: Option<Arc<(Acl, Vec<u32>)>>,
}

/// A response refused by a response entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyDenied {
    /// Index of the `[[acl]]` entry.
    pub entry: usize,
    /// The status to answer with.
    pub status: StatusCode,
    /// The deny page's text.
    pub reason: Arc<str>,
    /// The response's media types, for the error log.
    pub types: String,
}

impl ReplyFilter {
    /// True when no response entry applies (nothing to check).
    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }

    /// Checks a response head: the first applicable entry whose media types
    /// match decides; none matching lets it through. Responses without
    /// content (1xx, 204 No Content, 304 Not Modified: the client already
    /// has the body it refers to, checked when it was sent) are not checked:
    /// they carry no type, and would otherwise all match `none`.
    pub fn check(&self, status: StatusCode, headers: &HeaderMap) -> Option<ReplyDenied> {
        let inner = self.inner.as_ref()?;
        if status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return None;
        }
        let (acl, ids) = &**inner;
        let types = MediaTypes::of(headers);
        let (id, decision) = acl.reply_decide(ids.iter().copied(), &types)?;
        match decision {
            Decision::Deny { status, reason, .. } => Some(ReplyDenied {
                entry: id,
                status,
                reason,
                types: types.describe(),
            }),
            _ => None,
        }
    }
}

impl Acl {
    /// True when some `[[acl]]` entry is a response entry.
    pub fn has_reply_entries(&self) -> bool {
        !self.inner.reply.is_empty()
    }

    /// The response entries whose request matchers hold for `req` (an
    /// entry that needs a user holds only with one: a response cannot ask
    /// for credentials), for [`ReplyFilter::check`]. The clock is read
    /// only when such an entry has `time` or `days`.
    pub fn reply_filter(&self, req: &Request<'_>) -> ReplyFilter {
        self.reply_filter_at(req, super::now)
    }

    pub(super) fn reply_filter_at(&self, req: &Request<'_>, now: impl Fn() -> jiff::Timestamp) -> ReplyFilter {
        let c = &*self.inner;
        if c.reply.is_empty() {
            return ReplyFilter::default();
        }
        let mut local = None;
        let ids: Vec<u32> = req.normalised(|req| {
            c.reply
                .iter()
                .copied()
                .filter(|&id| {
                    c.entries[id as usize].check(req, || *local.get_or_insert_with(|| c.local(now())))
                        == super::Check::Yes
                })
                .collect()
        });
        if ids.is_empty() {
            return ReplyFilter::default();
        }
        ReplyFilter {
            inner: Some(Arc::new((self.clone(), ids))),
        }
    }

    /// The first of `ids` whose media-type matcher holds for `types`, and
    /// its decision.
    pub(super) fn reply_decide(&self, ids: impl Iterator<Item = u32>, types: &MediaTypes) -> Option<(usize, Decision)> {
        for id in ids {
            let e = &self.inner.entries[id as usize];
            if e.reply.as_ref().is_some_and(|r| r.hit(types).is_some()) {
                return Some((id as usize, e.decision(id as usize)));
            }
        }
        None
    }

    /// For `portico acl test --content-type`: the response entry deciding a
    /// response of `types` to `req` at `now`, with what matched.
    pub(super) fn explain_reply(
        &self,
        req: &Request<'_>,
        types: &MediaTypes,
        now: jiff::Timestamp,
    ) -> Option<(usize, Decision, String)> {
        let filter = self.reply_filter_at(req, || now);
        let (_, ids) = &**filter.inner.as_ref()?;
        let (id, decision) = self.reply_decide(ids.iter().copied(), types)?;
        let hit = self.inner.entries[id].reply.as_ref().and_then(|r| r.hit(types))?;
        Some((id, decision, hit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(patterns: &[&str]) -> MimeSet {
        let mut s = MimeSet::default();
        for (i, p) in patterns.iter().enumerate() {
            s.insert(p, i as u32 + 1).unwrap();
        }
        s
    }

    fn ct(values: &[&[u8]]) -> MediaTypes {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(http::header::CONTENT_TYPE, http::HeaderValue::from_bytes(v).unwrap());
        }
        MediaTypes::of(&h)
    }

    #[test]
    fn the_type_and_subtype_are_case_insensitive_and_parameters_are_not_matched() {
        let s = set(&["text/html"]);
        assert!(s.find(&ct(&[b"text/html"])).is_some());
        assert!(s.find(&ct(&[b"TEXT/HTML; charset=utf-8"])).is_some());
        assert!(s.find(&ct(&[b"  Text/Html ;q"])).is_some());
        assert!(s.find(&ct(&[b"text/plain"])).is_none());
        assert!(s.find(&ct(&[b"text/htmlx"])).is_none());
    }

    #[test]
    fn a_wildcard_subtype_matches_every_subtype_of_its_type() {
        let s = set(&["video/*"]);
        assert_eq!(s.find(&ct(&[b"video/mp4"])), Some((1, "video/*".into())));
        assert!(s.find(&ct(&[b"videox/mp4"])).is_none());
        assert!(s.find(&ct(&[])).is_none());
        let any = set(&["*/*"]);
        assert!(any.find(&ct(&[b"a/b"])).is_some());
        assert!(any.find(&ct(&[])).is_none(), "*/* needs a media type");
    }

    #[test]
    fn a_missing_empty_or_invalid_content_type_matches_only_none() {
        let s = set(&["none"]);
        for v in [
            &b""[..],
            b"   ",
            b"html",
            b"/",
            b"text/",
            b"/html",
            b"t\xe9xt/html",
            b"text/ht ml",
        ] {
            assert_eq!(s.find(&ct(&[v])), Some((1, "none".into())), "{v:?}");
            assert!(set(&["*/*"]).find(&ct(&[v])).is_none(), "{v:?}");
        }
        assert!(s.find(&ct(&[])).is_some());
        assert!(s.find(&ct(&[b"text/html"])).is_none());
    }

    #[test]
    fn a_type_hidden_in_a_second_field_or_element_still_matches() {
        let s = set(&["video/*"]);
        assert!(s.find(&ct(&[b"text/html", b"video/mp4"])).is_some());
        assert!(s.find(&ct(&[b"text/html, video/mp4"])).is_some());
        assert!(s.find(&ct(&[b"garbage, video/mp4"])).is_some());
        // Only garbage besides: not `none`, since one type is valid.
        assert!(set(&["none"]).find(&ct(&[b"garbage, video/mp4"])).is_none());
    }

    #[test]
    fn a_huge_field_is_read_once_and_its_first_types_kept() {
        let mut v = b"video/mp4".to_vec();
        v.extend(std::iter::repeat_n(b",x/y".as_slice(), 100_000).flatten());
        let types = ct(&[&v]);
        assert!(types.types.len() <= MAX_TYPES);
        assert!(set(&["video/*"]).find(&types).is_some());
    }

    #[test]
    fn patterns_with_parameters_or_misplaced_wildcards_are_refused() {
        let mut s = MimeSet::default();
        assert!(
            s.insert("text/html; charset=utf-8", 0)
                .unwrap_err()
                .contains("parameters")
        );
        assert!(s.insert("*/html", 0).is_err());
        assert!(s.insert("text", 0).is_err());
        assert!(s.insert("te xt/html", 0).is_err());
        assert!(s.insert("vid*/mp4", 0).is_err());
        assert!(s.insert("", 0).is_err());
        assert!(s.is_empty());
        s.insert("NONE", 0).unwrap();
        s.insert("Video/*", 0).unwrap();
        assert_eq!(s.describe(), vec!["none", "video/*"]);
    }
}
