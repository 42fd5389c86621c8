//! `[[acl_list]]` filter lists: files of domains, URL prefixes or regular
//! expressions, one a line, that `[[acl]]` entries name with `list` (Squid's
//! `dstdomain` and `url_regex` files, the Sun proxy's URL filters).
//!
//! Lists are built for size: a list of a million domains is one string of
//! names and one hash table keyed by the xxh3 hash of each name (as the
//! entry host tables in `mod.rs`), so a request costs one lookup for its host
//! and one per parent domain, whatever the list's length. The hash is never
//! trusted alone: a hit is confirmed by comparing the name, so a host
//! crafted to collide with an allowed domain is not let through.

use super::{Request, host_key};
use crate::config::{AclListConfig, AclListKind};
use regex::RegexSet;

/// Longest line a list file may have. A domain is at most 253 bytes; URL
/// prefixes and regexes get room, but a multi-megabyte "line" is a damaged
/// or wrong file, refused with its line number rather than compiled.
pub const MAX_LINE: usize = 8192;

type Table<V> = crate::util::PreHashedMap<u64, V>;

/// One compiled list.
#[derive(Debug)]
pub(super) struct List {
    /// The `name` it is referred to by.
    pub name: Box<str>,
    /// The file it was read from, as configured.
    pub file: Box<str>,
    patterns: Patterns,
}

#[derive(Debug)]
enum Patterns {
    Domains(Domains),
    Urls(Table<Vec<UrlPrefix>>),
    Regex {
        set: RegexSet,
        lines: Vec<u32>,
    },
    /// `kind = "mime"`: matched on responses (`mime.rs`), never on requests.
    Mime(super::mime::MimeSet),
}

/// A domain list: the names (lower-case, no leading or trailing dot)
/// concatenated in `text`, each located by a [`Span`], and indexed by hash.
#[derive(Debug, Default)]
struct Domains {
    text: String,
    spans: Vec<Span>,
    /// Hash of the name -> index into `spans`.
    table: Table<u32>,
    /// Names whose hash another name already holds (a 64-bit collision:
    /// practically never), checked only when the table's name differs.
    spill: Vec<u32>,
    /// Fewest dots in any listed name: parent domains with fewer (the `com`
    /// of every request, when no top-level domain is listed) are not looked up.
    min_dots: usize,
}

#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
    /// Written `.example.com`: subdomains match too.
    subdomains: bool,
    line: u32,
}

/// `http://host[:port]/path-prefix`, filed under the host's hash.
#[derive(Debug)]
struct UrlPrefix {
    https: bool,
    host: Box<str>,
    port: u16,
    path: Box<str>,
    line: u32,
}

/// What matched: the list, its line, and the pattern as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The 1-based line of the file.
    pub line: u32,
    /// The pattern (normalised for domains and URLs).
    pub pattern: String,
}

impl Domains {
    fn name(&self, s: &Span) -> &str {
        self.text
            .get(s.start as usize..(s.start + s.len) as usize)
            .unwrap_or("")
    }

    fn get(&self, name: &str) -> Option<&Span> {
        let idx = *self.table.get(&host_key(name))?;
        let span = &self.spans[idx as usize];
        if self.name(span) == name {
            return Some(span);
        }
        self.spill
            .iter()
            .map(|&i| &self.spans[i as usize])
            .find(|s| self.name(s) == name)
    }

    fn insert(&mut self, name: &str, subdomains: bool, line: u32) -> Result<(), String> {
        let start = u32::try_from(self.text.len()).map_err(|_| "the list is larger than 4 GiB".to_string())?;
        let key = host_key(name);
        if let Some(&idx) = self.table.get(&key) {
            let existing = self.spans[idx as usize];
            if self.name(&existing) == name {
                // `example.com` and `.example.com` both listed: the wider one
                // decides, with its line.
                if subdomains && !existing.subdomains {
                    self.spans[idx as usize].subdomains = true;
                    self.spans[idx as usize].line = line;
                }
                return Ok(());
            }
            if self.spill.iter().any(|&i| self.name(&self.spans[i as usize]) == name) {
                return Ok(());
            }
            self.spill.push(self.spans.len() as u32);
        } else {
            self.table.insert(key, self.spans.len() as u32);
        }
        let dots = name.bytes().filter(|&b| b == b'.').count();
        self.min_dots = if self.spans.is_empty() {
            dots
        } else {
            self.min_dots.min(dots)
        };
        self.text.push_str(name);
        self.spans.push(Span {
            start,
            len: name.len() as u32,
            subdomains,
            line,
        });
        Ok(())
    }

    /// The entry matching `host`: the host itself (either form), else the
    /// nearest parent written with a leading dot.
    fn find(&self, host: &str) -> Option<&Span> {
        if host.is_empty() {
            return None;
        }
        if let Some(s) = self.get(host) {
            return Some(s);
        }
        let mut dots_left = host.bytes().filter(|&b| b == b'.').count();
        for (pos, b) in host.bytes().enumerate() {
            if b != b'.' {
                continue;
            }
            dots_left -= 1;
            if dots_left < self.min_dots {
                break;
            }
            if let Some(s) = self.get(&host[pos + 1..])
                && s.subdomains
            {
                return Some(s);
            }
        }
        None
    }
}

/// The URL a request's regexes are matched against: `scheme://host/path?query`
/// with `:port` only when it is not the scheme's default (as a browser shows
/// it); `host:port` for a CONNECT.
pub fn url_of(req: &Request<'_>) -> String {
    if req.is_tunnel() {
        return format!("{}:{}", req.host, req.port);
    }
    let default = if req.scheme == "https" { 443 } else { 80 };
    let mut url = String::with_capacity(req.scheme.len() + req.host.len() + req.path_and_query.len() + 10);
    url.push_str(req.scheme);
    url.push_str("://");
    url.push_str(req.host);
    if req.port != default {
        url.push(':');
        url.push_str(&req.port.to_string());
    }
    url.push_str(req.path_and_query);
    url
}

impl List {
    /// Whether any pattern matches `req`.
    pub fn matches(&self, req: &Request<'_>) -> bool {
        match &self.patterns {
            Patterns::Domains(d) => d.find(req.host).is_some(),
            Patterns::Urls(t) => url_prefix(t, req).is_some(),
            Patterns::Regex { set, .. } => set.is_match(&url_of(req)),
            Patterns::Mime(_) => false,
        }
    }

    /// The media-type patterns of a `kind = "mime"` list.
    pub(super) fn mime(&self) -> Option<&super::mime::MimeSet> {
        match &self.patterns {
            Patterns::Mime(m) => Some(m),
            _ => None,
        }
    }

    /// The first pattern (by line) that matches `req`, for `portico acl test`.
    pub fn hit(&self, req: &Request<'_>) -> Option<Hit> {
        match &self.patterns {
            Patterns::Domains(d) => d.find(req.host).map(|s| Hit {
                line: s.line,
                pattern: format!("{}{}", if s.subdomains { "." } else { "" }, d.name(s)),
            }),
            Patterns::Urls(t) => url_prefix(t, req).map(|u| Hit {
                line: u.line,
                pattern: format!(
                    "{}://{}:{}{}",
                    if u.https { "https" } else { "http" },
                    u.host,
                    u.port,
                    u.path
                ),
            }),
            Patterns::Regex { set, lines } => {
                let i = set.matches(&url_of(req)).iter().next()?;
                Some(Hit {
                    line: lines.get(i).copied().unwrap_or(0),
                    pattern: set.patterns().get(i).cloned().unwrap_or_default(),
                })
            }
            Patterns::Mime(_) => None,
        }
    }
}

/// The URL prefix matching `req` (its path normalised by the caller,
/// `Request::normalised`), lowest line first; never for a CONNECT
/// (it has no URL: a scheme-less `host:port` cannot match `http://...`).
fn url_prefix<'t>(table: &'t Table<Vec<UrlPrefix>>, req: &Request<'_>) -> Option<&'t UrlPrefix> {
    if req.is_tunnel() || table.is_empty() {
        return None;
    }
    let https = req.scheme == "https";
    table.get(&host_key(req.host))?.iter().find(|u| {
        u.https == https && u.port == req.port && *u.host == *req.host && req.path_and_query.starts_with(&*u.path)
    })
}

/// Reads `bytes` (the file's contents) as a list of `config.kind`. Errors
/// are `FILE:LINE: what is wrong`.
pub(super) fn build(config: &AclListConfig, bytes: &[u8]) -> Result<List, String> {
    let file = config.file.display().to_string();
    let at = |line: usize, msg: String| format!("{file}:{line}: {msg}");
    let mut lines = Vec::new();
    for (n, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let n = n + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.len() > MAX_LINE {
            return Err(at(
                n,
                format!(
                    "line is {} bytes long (at most {MAX_LINE}): is this the right file?",
                    raw.len()
                ),
            ));
        }
        if raw.contains(&0) {
            return Err(at(n, "line contains a NUL byte: is this a text file?".into()));
        }
        let text = std::str::from_utf8(raw).map_err(|e| {
            at(
                n,
                format!("line is not UTF-8 text (bad byte at column {})", e.valid_up_to() + 1),
            )
        })?;
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        lines.push((n as u32, text));
    }
    let patterns = match config.kind {
        AclListKind::Domains => {
            let mut d = Domains::default();
            d.table.reserve(lines.len());
            d.spans.reserve(lines.len());
            for &(n, text) in &lines {
                let (name, subdomains) = domain(text).map_err(|m| at(n as usize, m))?;
                d.insert(&name, subdomains, n).map_err(|m| at(n as usize, m))?;
            }
            Patterns::Domains(d)
        }
        AclListKind::Urls => {
            let mut t: Table<Vec<UrlPrefix>> = Table::default();
            for &(n, text) in &lines {
                let u = url(text, n).map_err(|m| at(n as usize, m))?;
                t.entry(host_key(&u.host)).or_default().push(u);
            }
            Patterns::Urls(t)
        }
        AclListKind::Regex => {
            let set = match RegexSet::new(lines.iter().map(|(_, t)| *t)) {
                Ok(set) => set,
                Err(e) => {
                    // Name the line: the first pattern that fails alone.
                    for &(n, text) in &lines {
                        if let Err(e) = regex::Regex::new(text) {
                            return Err(at(n as usize, format!("invalid regular expression: {e}")));
                        }
                    }
                    return Err(format!(
                        "{file}: the regular expressions together are too large to compile ({e}): split the list"
                    ));
                }
            };
            Patterns::Regex {
                set,
                lines: lines.iter().map(|(n, _)| *n).collect(),
            }
        }
        AclListKind::Mime => {
            let mut m = super::mime::MimeSet::default();
            for &(n, text) in &lines {
                m.insert(text, n).map_err(|e| at(n as usize, e))?;
            }
            Patterns::Mime(m)
        }
    };
    Ok(List {
        name: config.name.as_str().into(),
        file: file.into(),
        patterns,
    })
}

/// A `domains` line: `example.com` or `.example.com`, lower-cased, the
/// trailing dot dropped. Letters, digits, `-`, `_` and non-ASCII (an IDN
/// as written) are allowed in labels.
fn domain(text: &str) -> Result<(String, bool), String> {
    if let Some(rest) = text.strip_prefix("*.") {
        return Err(format!("{text:?}: write .{rest} for a domain and its subdomains"));
    }
    let subdomains = text.starts_with('.');
    let name = text.strip_prefix('.').unwrap_or(text);
    let name = name.strip_suffix('.').unwrap_or(name);
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') || !c.is_ascii()))
    {
        return Err(format!(
            "{text:?}: {c:?} cannot be in a domain name (one domain a line: example.com or .example.com)"
        ));
    }
    if name.is_empty() || name.split('.').any(str::is_empty) {
        return Err(format!("{text:?}: a domain name with an empty label"));
    }
    if name.len() > 253 {
        return Err(format!("{text:?}: a domain name is at most 253 characters"));
    }
    // An address (`127.1`) in the spelling requests' hosts are compared in.
    let name = if subdomains {
        name.to_ascii_lowercase()
    } else {
        crate::util::canonical_host(name)
    };
    Ok((name, subdomains))
}

/// A `urls` line: an absolute `http://` or `https://` URL prefix.
fn url(text: &str, line: u32) -> Result<UrlPrefix, String> {
    let bad = |why: &str| format!("{text:?}: {why} (write an absolute URL prefix such as http://example.com/ads/)");
    let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("not an absolute URL"))?;
    let https = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        _ => return Err(bad("only http and https URLs")),
    };
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("spaces and control characters are not allowed"));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err(bad("user names are not part of what is matched"));
    }
    let authority: http::uri::Authority = authority.parse().map_err(|_| bad("no valid host"))?;
    let host = crate::util::canonical_host(authority.host());
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        // In the form request paths are compared in (`path.rs`).
        p => super::path::normalize_path_and_query(p).into_owned(),
    };
    Ok(UrlPrefix {
        https,
        host: host.into(),
        port,
        path: path.into(),
        line,
    })
}

/// The list of `kind` that `lines` (joined by newlines) compile to, for
/// the unit tests.
#[cfg(test)]
pub(super) fn from_text(kind: AclListKind, text: &str) -> Result<List, String> {
    let config = AclListConfig {
        name: "t".into(),
        file: "t.txt".into(),
        kind,
    };
    build(&config, text.as_bytes())
}
