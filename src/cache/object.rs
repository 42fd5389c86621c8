//! What the cache stores about a response besides its body: status, headers,
//! the times RFC 9111's age calculation needs, and the request header values
//! a `Vary` variant was selected with. Shared by the memory and disk tiers;
//! `encode`/`decode` give the byte form the disk tier writes.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Header that marks a stored object as a Vary marker (never served): what
/// is stored under a primary key whose response varied, naming the request
/// fields its variants are selected by. The tiers facade writes and reads
/// it; the memory tier's listing (/nsc) shows it. Declared here, with the
/// stored metadata both use, so that the two do not import each other.
pub(crate) const MARKER: http::HeaderName = http::HeaderName::from_static("x-portico-vary-marker");

/// Header that marks a stored object as a slice marker (never served):
/// what is stored under the primary key of an object stored in slices
/// (`cache.slice`), its value `<slice size> <complete length>`, so that an
/// invalidation finds every slice. The slices themselves are stored as
/// variants of the primary key selected by [`SLICE_FIELD`].
pub(crate) const SLICED: http::HeaderName = http::HeaderName::from_static("x-portico-sliced");

/// The pseudo request field whose value (a slice's first byte offset)
/// selects one slice of a sliced object, as a `Vary` field selects a
/// variant: the slice's id is `CacheKey::variant_id` of it. No request
/// field is ever looked up by this name.
pub(crate) const SLICE_FIELD: &str = "x-portico-slice";

/// Stored response metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMeta {
    /// The primary cache key (normalised absolute URL), kept to detect hash
    /// collisions and for listing and purging by prefix.
    pub key: String,
    /// For a `Vary` variant: each varying request field (lower-case name)
    /// and the value the request had (None when absent).
    pub variant: Vec<(String, Option<String>)>,
    /// Response status.
    pub status: StatusCode,
    /// Response headers as stored (hop-by-hop fields removed).
    pub headers: HeaderMap,
    /// When the request that fetched this response was sent (RFC 9111 4.2.3 request_time).
    pub request_time: SystemTime,
    /// When the response was received (response_time).
    pub response_time: SystemTime,
    /// The address the response was fetched from when Portico connected
    /// to its origin itself (`OriginBody::origin_addr`); None through a
    /// parent proxy, for an `[[upstream]]` group's server, while
    /// `proxy.deny_destinations` refused nothing, and for what an earlier
    /// version stored. A destination
    /// a client chose is answered from the cache only while
    /// `proxy.deny_destinations` lets the client reach this address.
    pub origin: Option<IpAddr>,
    /// What the cache policy derives from the fields and times above on
    /// first use (see [`Derived`]); not part of the byte form.
    pub derived: Derived,
}

/// Facts the cache policy derives from a stored response's fields and
/// times, computed on first use and kept while the metadata is: its date
/// value and corrected initial age (RFC 9111 4.2.3), in seconds. A hit
/// used to parse the `Date` three times and the `Age` twice. Not written to
/// disk (recomputed after a restart). A clone starts without them, clones
/// being how stored metadata is changed (`policy::update_from_304` also
/// clears them after it changes the fields), and they never make two
/// metadata unequal.
///
/// Also kept: what the first cache policy to evaluate the response
/// concluded from its fields alone (its freshness lifetime and the
/// directives that matter on a hit, [`crate::cache::policy::StoredFacts`]),
/// which a hit used to reparse from `Cache-Control` every time; the
/// fields as its hits' heads write them ([`KeptLines`]); and whether it is
/// a plain response rather than a marker of the cache's own.
#[derive(Debug, Default)]
pub struct Derived {
    times: OnceLock<(u64, u64)>,
    facts: OnceLock<crate::cache::policy::StoredFacts>,
    lines: OnceLock<KeptLines>,
    plain: OnceLock<bool>,
}

/// A stored response's fields as the field lines of its hits' heads,
/// written on the first hit and kept with the metadata: writing a dozen
/// fields one by one cost every hit about 1,800 instructions, copying their
/// lines a few dozen. Which fields a head leaves out depends on the
/// cache policy (targeted fields it strips) and the cache status header's
/// name, so the lines carry a tag of those; a hit with another tag writes
/// its own.
#[derive(Debug)]
pub struct KeptLines {
    /// Identifies what chose the fields left out.
    pub tag: u64,
    /// `name: value` CRLF lines (with room for the fields left out: not
    /// shrunk, which would copy them again).
    pub lines: Vec<u8>,
    /// Whether the stored fields have `Date`.
    pub has_date: bool,
    /// Whether they have `Location` or `Content-Location`.
    pub has_location: bool,
}

impl Derived {
    /// The kept facts, computing them with `compute` the first time.
    pub(crate) fn get_or_init(&self, compute: impl FnOnce() -> (u64, u64)) -> (u64, u64) {
        *self.times.get_or_init(compute)
    }

    /// The policy's conclusions, when some policy has kept them.
    pub(crate) fn facts(&self) -> Option<&crate::cache::policy::StoredFacts> {
        self.facts.get()
    }

    /// Keeps a policy's conclusions, unless some are kept already (the
    /// first policy's stay: each is tagged with the policy it holds for).
    pub(crate) fn keep_facts(&self, facts: crate::cache::policy::StoredFacts) {
        let _ = self.facts.set(facts);
    }

    /// The kept field lines, writing them with `write` the first time
    /// (whatever their tag: the caller compares it with its own).
    pub(crate) fn lines_or_init(&self, write: impl FnOnce() -> KeptLines) -> &KeptLines {
        self.lines.get_or_init(write)
    }

    /// Whether the object is a plain response (neither a `Vary` marker nor
    /// a record of slices), decided with `decide` the first time. Every
    /// lookup asks, and deciding costs two lookups of custom field names in
    /// the stored map (about 400 instructions of a hit).
    pub(crate) fn plain_or_init(&self, decide: impl FnOnce() -> bool) -> bool {
        *self.plain.get_or_init(decide)
    }

    /// Forgets the facts (after the fields they come from changed).
    pub(crate) fn clear(&mut self) {
        *self = Derived::default();
    }
}

impl Clone for Derived {
    fn clone(&self) -> Derived {
        Derived::default()
    }
}

impl PartialEq for Derived {
    fn eq(&self, _: &Derived) -> bool {
        true
    }
}

impl Eq for Derived {}

/// Why stored metadata could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "corrupt cache metadata: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// The byte form's version: 2 added the origin address at the end. A
/// version 1 form is read as having none.
const VERSION: u8 = 2;

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether two times are equal as stored on disk (to the millisecond).
pub fn same_millis(a: SystemTime, b: SystemTime) -> bool {
    millis(a) == millis(b)
}

fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&b[..b.len().min(u32::MAX as usize)]);
}

struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.data.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError("invalid UTF-8"))
    }
}

/// A copy of `headers` in a map with room for no more fields than it
/// holds. A response's map is made with room for the fields a proxy adds
/// (Via, Date, Age...), and a clone keeps that room; stored metadata lives
/// as long as the object and never grows, so it should not carry it (a
/// `HeaderMap` slot costs about 100 bytes).
pub fn exact_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        out.append(name.clone(), value.clone());
    }
    out
}

impl StoredMeta {
    /// The byte form written to disk.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.key.len());
        out.push(VERSION);
        put_bytes(&mut out, self.key.as_bytes());
        out.extend_from_slice(&self.status.as_u16().to_le_bytes());
        out.extend_from_slice(&millis(self.request_time).to_le_bytes());
        out.extend_from_slice(&millis(self.response_time).to_le_bytes());
        out.extend_from_slice(&u32::try_from(self.variant.len()).unwrap_or(0).to_le_bytes());
        for (name, value) in &self.variant {
            put_bytes(&mut out, name.as_bytes());
            match value {
                Some(v) => {
                    out.push(1);
                    put_bytes(&mut out, v.as_bytes());
                }
                None => out.push(0),
            }
        }
        out.extend_from_slice(&u32::try_from(self.headers.len()).unwrap_or(0).to_le_bytes());
        for (name, value) in &self.headers {
            put_bytes(&mut out, name.as_str().as_bytes());
            put_bytes(&mut out, value.as_bytes());
        }
        match self.origin {
            None => out.push(0),
            Some(IpAddr::V4(a)) => {
                out.push(4);
                out.extend_from_slice(&a.octets());
            }
            Some(IpAddr::V6(a)) => {
                out.push(6);
                out.extend_from_slice(&a.octets());
            }
        }
        out
    }

    /// Parses what `encode` wrote. The header values are slices of
    /// `shared` (each checked as a header value), not a copy (and an
    /// allocation) each.
    pub fn decode(shared: &bytes::Bytes) -> Result<StoredMeta, DecodeError> {
        let data: &[u8] = shared;
        let mut r = Reader { data };
        let version = r.u8()?;
        if version != 1 && version != VERSION {
            return Err(DecodeError("unknown metadata version"));
        }
        let key = r.string()?;
        let status = StatusCode::from_u16(r.u16()?).map_err(|_| DecodeError("invalid status"))?;
        let request_time = from_millis(r.u64()?);
        let response_time = from_millis(r.u64()?);
        let nvariant = r.u32()? as usize;
        let mut variant = Vec::with_capacity(nvariant.min(64));
        for _ in 0..nvariant {
            let name = r.string()?;
            let value = match r.u8()? {
                0 => None,
                1 => Some(r.string()?),
                _ => return Err(DecodeError("invalid variant flag")),
            };
            variant.push((name, value));
        }
        let nheaders = r.u32()? as usize;
        let mut headers = HeaderMap::with_capacity(nheaders.min(256));
        for _ in 0..nheaders {
            let name = HeaderName::from_bytes(r.bytes()?).map_err(|_| DecodeError("invalid header name"))?;
            let value = HeaderValue::from_maybe_shared(shared.slice_ref(r.bytes()?))
                .map_err(|_| DecodeError("invalid header value"))?;
            headers.append(name, value);
        }
        let origin = match version {
            1 => None,
            _ => match r.u8()? {
                0 => None,
                4 => Some(IpAddr::from(
                    <[u8; 4]>::try_from(r.take(4)?).map_err(|_| DecodeError("truncated"))?,
                )),
                6 => Some(IpAddr::from(
                    <[u8; 16]>::try_from(r.take(16)?).map_err(|_| DecodeError("truncated"))?,
                )),
                _ => return Err(DecodeError("invalid origin address")),
            },
        };
        if !r.data.is_empty() {
            return Err(DecodeError("trailing bytes"));
        }
        Ok(StoredMeta {
            key,
            variant,
            status,
            headers,
            request_time,
            response_time,
            origin,
            derived: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StoredMeta {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.append("set-thing", HeaderValue::from_static("a"));
        headers.append("set-thing", HeaderValue::from_static("b"));
        StoredMeta {
            key: "http://example.com/a?b".into(),
            variant: vec![
                ("accept-encoding".into(), Some("gzip".into())),
                ("x-absent".into(), None),
            ],
            status: StatusCode::OK,
            headers,
            request_time: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            response_time: UNIX_EPOCH + Duration::from_millis(1_700_000_000_456),
            origin: Some(IpAddr::from([192, 0, 2, 7])),
            derived: Default::default(),
        }
    }

    #[test]
    fn round_trip() {
        let m = sample();
        assert_eq!(StoredMeta::decode(&m.encode().into()).unwrap(), m);
        for origin in [None, Some("2001:db8::5".parse().unwrap())] {
            let m = StoredMeta { origin, ..sample() };
            assert_eq!(StoredMeta::decode(&m.encode().into()).unwrap(), m);
        }
    }

    #[test]
    fn what_version_1_wrote_is_read_as_coming_from_no_known_address() {
        // Version 1 ended with the fields: the same bytes less the
        // address's tag byte (0, none).
        let mut old = StoredMeta {
            origin: None,
            ..sample()
        }
        .encode();
        assert_eq!(old.pop(), Some(0));
        old[0] = 1;
        let read = StoredMeta::decode(&old.into()).unwrap();
        assert_eq!(read.origin, None);
        assert_eq!(
            read,
            StoredMeta {
                origin: None,
                ..sample()
            }
        );
    }

    #[test]
    fn an_unknown_address_tag_is_an_error() {
        let mut bytes = StoredMeta {
            origin: None,
            ..sample()
        }
        .encode();
        *bytes.last_mut().unwrap() = 5;
        assert!(StoredMeta::decode(&bytes.into()).is_err());
    }

    #[test]
    fn truncated_or_extended_is_an_error() {
        let bytes = sample().encode();
        for cut in [0, 1, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                StoredMeta::decode(&bytes::Bytes::copy_from_slice(&bytes[..cut])).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(StoredMeta::decode(&longer.into()).is_err());
    }
}
