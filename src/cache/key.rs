//! Cache keys: the normalised absolute URL (GET and HEAD share it), hashed
//! to 128 bits for the index and the file name; a `Vary` variant's key adds
//! the varying request header values.

use xxhash_rust::xxh3::xxh3_128;

/// A 128-bit object identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u128);

impl ObjectId {
    /// 32 lower-case hex digits (the disk file name).
    pub fn hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses what `hex` wrote.
    pub fn from_hex(s: &str) -> Option<ObjectId> {
        (s.len() == 32)
            .then(|| u128::from_str_radix(s, 16).ok().map(ObjectId))
            .flatten()
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The primary key of a request: its normalised absolute URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    url: String,
}

impl CacheKey {
    /// Builds the key for `scheme://authority/path?query`: scheme and host
    /// lower-cased, the default port dropped, an empty path made `/`, the
    /// query dropped when `ignore_query`.
    pub fn new(scheme: &str, authority: &str, path_and_query: &str, ignore_query: bool) -> CacheKey {
        // One allocation and no `core::fmt`: this runs for every cacheable request.
        let https = scheme.eq_ignore_ascii_case("https");
        let default_port = if https { ":443" } else { ":80" };
        let authority = match authority.len().checked_sub(default_port.len()) {
            Some(cut) if authority.get(cut..).is_some_and(|t| t == default_port) => &authority[..cut],
            _ => authority,
        };
        let mut pq = if path_and_query.is_empty() { "/" } else { path_and_query };
        if ignore_query {
            pq = pq.split('?').next().unwrap_or("/");
        }
        let mut url = String::with_capacity(scheme.len() + 3 + authority.len() + pq.len());
        url.extend(scheme.chars().map(|c| c.to_ascii_lowercase()));
        url.push_str("://");
        url.extend(authority.chars().map(|c| c.to_ascii_lowercase()));
        url.push_str(pq);
        CacheKey { url }
    }

    /// Parses an absolute URL (as `portico cache purge URL` takes it).
    pub fn from_url(url: &str, ignore_query: bool) -> Option<CacheKey> {
        let uri: http::Uri = url.parse().ok()?;
        let scheme = uri.scheme_str()?;
        let authority = uri.authority()?.as_str();
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        Some(CacheKey::new(scheme, authority, pq, ignore_query))
    }

    /// The normalised URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The primary object's id.
    pub fn id(&self) -> ObjectId {
        ObjectId(xxh3_128(self.url.as_bytes()))
    }

    /// The id of the variant selected by these (field, value) pairs.
    pub fn variant_id(&self, variant: &[(String, Option<String>)]) -> ObjectId {
        if variant.is_empty() {
            return self.id();
        }
        let mut material = Vec::with_capacity(self.url.len() + 64);
        material.extend_from_slice(self.url.as_bytes());
        for (name, value) in variant {
            material.push(0);
            material.extend_from_slice(name.as_bytes());
            match value {
                Some(v) => {
                    material.push(1);
                    material.extend_from_slice(v.as_bytes());
                }
                None => material.push(2),
            }
        }
        ObjectId(xxh3_128(&material))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation() {
        let a = CacheKey::new("HTTP", "Example.COM:80", "/a?b=1", false);
        assert_eq!(a.url(), "http://example.com/a?b=1");
        assert_eq!(CacheKey::new("https", "h:443", "", false).url(), "https://h/");
        assert_eq!(CacheKey::new("http", "h:8080", "/x?q", true).url(), "http://h:8080/x");
        assert_eq!(
            CacheKey::from_url("http://H:80/p", false).unwrap(),
            CacheKey::new("http", "h", "/p", false)
        );
    }

    #[test]
    fn ids_differ_by_url_and_variant() {
        let k = CacheKey::new("http", "h", "/", false);
        assert_ne!(k.id(), CacheKey::new("http", "h", "/x", false).id());
        let gz = vec![("accept-encoding".to_string(), Some("gzip".to_string()))];
        let none = vec![("accept-encoding".to_string(), None)];
        assert_ne!(k.variant_id(&gz), k.variant_id(&none));
        assert_ne!(k.variant_id(&gz), k.id());
        assert_eq!(k.variant_id(&[]), k.id());
        assert_eq!(ObjectId::from_hex(&k.id().hex()), Some(k.id()));
    }
}
