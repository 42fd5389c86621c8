//! Cache keys: the normalised absolute URL (GET and HEAD share it), hashed
//! to 128 bits for the index and the file name; a `Vary` variant's key adds
//! the varying request header values.
//!
//! An object fetched from an `[[upstream]]` group (reverse proxying, or any
//! request a rule sends to a group) is keyed by where it came from as well
//! as by its public URL: its key text is `<URL> upstream=<group name>`. The
//! public URL of such a request is made of the client's `Host`, so without
//! the group a reverse client could store an upstream's page under any URL
//! a forward-proxy client might ask for, and a forward client could store
//! any origin's page under a reverse site's URL (nginx's default key,
//! `$scheme$proxy_host$request_uri`, names the upstream for the same
//! reason). A request fetched from the origin its URL names (forward and
//! transparent proxying, directly or through a parent proxy) is keyed by
//! the URL alone: that URL is where it really came from. A URL never holds
//! a space (the request parser and `http::Uri` reject one), so the first
//! space of a key text ends its URL and the two kinds can never collide.
//! The `Host` in such a key keeps the port it was sent with (`:80` too):
//! the listener may speak TLS, and the origin may get the `Host` as sent.
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

/// What separates a key's URL from the upstream group it names.
const UPSTREAM_SEP: &str = " upstream=";

/// The URL part of a stored key text (`StoredMeta::key`): the whole text
/// for a forward-proxy key, the text before ` upstream=` otherwise.
pub fn url_of(text: &str) -> &str {
    text.split_once(' ').map_or(text, |(url, _)| url)
}

/// The primary key of a request: its normalised absolute URL, and the
/// upstream group it is fetched from, if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// `<URL>` or `<URL> upstream=<group>`: what is hashed and stored.
    text: String,
    /// Length of the URL at the start of `text`.
    url_len: usize,
}

impl CacheKey {
    /// Builds the key for `scheme://authority/path?query`: scheme and host
    /// lower-cased, the default port dropped, an empty path made `/`, the
    /// query dropped when `ignore_query`.
    pub fn new(scheme: &str, authority: &str, path_and_query: &str, ignore_query: bool) -> CacheKey {
        let https = scheme.eq_ignore_ascii_case("https");
        let default_port = if https { ":443" } else { ":80" };
        let authority = match authority.len().checked_sub(default_port.len()) {
            Some(cut) if authority.get(cut..).is_some_and(|t| t == default_port) => &authority[..cut],
            _ => authority,
        };
        Self::with_authority_as_given(scheme, authority, path_and_query, ignore_query)
    }

    /// [`CacheKey::new`] keeping a port the authority names, whatever the
    /// scheme: for a reverse listener's `Host`, whose `http` scheme in the
    /// key is a fiction (the listener may speak TLS, where `:80` is no
    /// default), and which the origin may get and reflect as sent.
    pub fn with_authority_as_given(
        scheme: &str,
        authority: &str,
        path_and_query: &str,
        ignore_query: bool,
    ) -> CacheKey {
        // One allocation and no `core::fmt`: this runs for every cacheable request.
        let mut pq = if path_and_query.is_empty() { "/" } else { path_and_query };
        if ignore_query {
            pq = pq.split('?').next().unwrap_or("/");
        }
        // With room for an upstream group's name (`in_upstream`, on every
        // request a rule sends to a group), which would otherwise reallocate.
        let mut url = String::with_capacity(scheme.len() + 3 + authority.len() + pq.len() + 32);
        url.push_str(scheme);
        url.push_str("://");
        url.push_str(authority);
        // Lower-cased in place, as bytes: pushed char by char, the two took
        // about 20 instructions a character.
        url.make_ascii_lowercase();
        url.push_str(pq);
        CacheKey {
            url_len: url.len(),
            text: url,
        }
    }

    /// This key's URL as fetched from the upstream group `group`: a
    /// different object from the URL fetched from its origin, or from
    /// another group.
    pub fn in_upstream(mut self, group: &str) -> CacheKey {
        self.text.truncate(self.url_len);
        self.text.reserve(UPSTREAM_SEP.len() + group.len());
        self.text.push_str(UPSTREAM_SEP);
        self.text.push_str(group);
        self
    }

    /// `url`'s key with this key's upstream group (a URL that an unsafe
    /// request invalidates besides its own, RFC 9111 4.4, was fetched
    /// from the same place).
    pub fn same_upstream(&self, url: CacheKey) -> CacheKey {
        match self.upstream() {
            Some(group) => url.in_upstream(group),
            None => url,
        }
    }

    /// Parses an absolute URL (as `portico cache purge URL` takes it).
    pub fn from_url(url: &str, ignore_query: bool) -> Option<CacheKey> {
        let uri: http::Uri = url.parse().ok()?;
        let scheme = uri.scheme_str()?;
        let authority = uri.authority()?.as_str();
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        Some(CacheKey::new(scheme, authority, pq, ignore_query))
    }

    /// The key a stored key text (`StoredMeta::key`, what [`CacheKey::text`]
    /// gave) stands for; None when it is not one (an older format).
    pub fn from_text(text: &str) -> Option<CacheKey> {
        let url = url_of(text);
        match &text[url.len()..] {
            "" => {}
            rest if rest.starts_with(UPSTREAM_SEP) => {}
            _ => return None,
        }
        url.parse::<http::Uri>().ok()?.scheme()?;
        Some(CacheKey {
            text: text.to_string(),
            url_len: url.len(),
        })
    }

    /// The normalised public URL (what the client asked for).
    pub fn url(&self) -> &str {
        &self.text[..self.url_len]
    }

    /// The upstream group the object is fetched from; None when it is
    /// fetched from the origin its URL names.
    pub fn upstream(&self) -> Option<&str> {
        self.text[self.url_len..].strip_prefix(UPSTREAM_SEP)
    }

    /// The whole key as stored with the object (`StoredMeta::key`) and hashed.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The primary object's id.
    pub fn id(&self) -> ObjectId {
        ObjectId(xxh3_128(self.text.as_bytes()))
    }

    /// The id of the variant selected by these (field, value) pairs.
    pub fn variant_id(&self, variant: &[(String, Option<String>)]) -> ObjectId {
        if variant.is_empty() {
            return self.id();
        }
        let mut material = Vec::with_capacity(self.text.len() + 64);
        material.extend_from_slice(self.text.as_bytes());
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
        // Only the scheme and the authority are lower-cased.
        assert_eq!(
            CacheKey::new("HTTP", "H.Test", "/A/B?C=D", false).url(),
            "http://h.test/A/B?C=D"
        );
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

    #[test]
    fn an_upstream_object_is_a_different_object_from_the_origin_one() {
        let origin = CacheKey::new("http", "www.example.com", "/x", false);
        let a = origin.clone().in_upstream("a");
        let b = origin.clone().in_upstream("b");
        assert_eq!(a.text(), "http://www.example.com/x upstream=a");
        assert_eq!(a.url(), origin.url());
        assert_eq!((a.upstream(), origin.upstream()), (Some("a"), None));
        assert_ne!(a.id(), origin.id());
        assert_ne!(a.id(), b.id());
        assert_eq!(a.clone().in_upstream("b"), b);
        assert_eq!(url_of(a.text()), "http://www.example.com/x");
        // Invalidated URLs keep the group.
        let other = CacheKey::new("http", "www.example.com", "/y", false);
        assert_eq!(
            a.same_upstream(other.clone()).text(),
            "http://www.example.com/y upstream=a"
        );
        assert_eq!(origin.same_upstream(other.clone()), other);
    }

    #[test]
    fn stored_texts_parse_back_to_their_keys() {
        let plain = CacheKey::new("http", "h", "/p?q", false);
        let scoped = plain.clone().in_upstream("my group");
        assert_eq!(CacheKey::from_text(plain.text()), Some(plain));
        assert_eq!(CacheKey::from_text(scoped.text()), Some(scoped));
        assert_eq!(CacheKey::from_text("http://h/ extra"), None);
        assert_eq!(CacheKey::from_text("not a url"), None);
    }
}
