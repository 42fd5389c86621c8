//! Reading a config file: TOML syntax, then types, then cross-references.
//! Every error names the file, the line and the key, and suggests the
//! nearest known key when an unknown one looks like a typo.

use super::{Config, Mode};
use std::fmt;
use std::ops::Range;
use std::path::Path;
use toml::de::{DeTable, DeValue};

/// A configuration error, located in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<embedded>`).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted key path such as `listener[0].address`, when known.
    pub key: Option<String>,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Reads and checks the config file at `path`.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    parse_str(&read_text(path)?, &path.display().to_string())
}

/// The text of the config file at `path`.
pub(super) fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.display().to_string(),
        line: None,
        key: None,
        message: format!("cannot read the config file: {e}"),
    })
}

/// Parses and checks config text; `file` is used in error messages.
pub fn parse_str(text: &str, file: &str) -> Result<Config, ConfigError> {
    let locate = |span: Option<Range<usize>>, key: Option<String>, message: String| ConfigError {
        file: file.to_string(),
        line: span.map(|s| line_of(text, s.start)),
        key,
        message,
    };
    let de = toml::de::Deserializer::parse(text).map_err(|e| locate(e.span(), None, e.message().trim().to_string()))?;
    let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner();
        let key = (path != ".").then(|| path.clone());
        locate(inner.span(), key, explain(inner.message().trim()))
    })?;
    let tree = DeTable::parse(text).map_err(|e| locate(e.span(), None, e.message().to_string()))?;
    let span_of = |path: &[Seg]| find_span(tree.get_ref(), path);
    validate(&config).map_err(|(path, msg)| {
        let key = render_path(&path);
        locate(span_of(&path), Some(key), msg)
    })?;
    let mut config = config;
    let memory_written = span_of(&[Seg::Key("cache"), Seg::Key("memory")]).is_some();
    super::memory::share_default(&mut config, memory_written);
    Ok(config)
}

/// The 1-based line of each `[[rule]]` in config text (0 when unknown), for
/// tools that show rules to people (`portico rules test`).
pub fn rule_lines(text: &str) -> Vec<usize> {
    array_lines(text, "rule")
}

/// The 1-based line of each `[[acl]]` entry in config text (0 when
/// unknown), for `portico acl test`.
pub fn acl_lines(text: &str) -> Vec<usize> {
    array_lines(text, "acl")
}

/// The 1-based line of each element of the top-level array `key`.
fn array_lines(text: &str, key: &str) -> Vec<usize> {
    let Ok(tree) = DeTable::parse(text) else {
        return Vec::new();
    };
    match tree.get_ref().get(key).map(|v| v.get_ref()) {
        Some(DeValue::Array(items)) => {
            // One pass: the rules come in file order (counting from the
            // start for each was quadratic: seconds for 10,000 rules).
            let (mut line, mut at) = (1, 0);
            items
                .iter()
                .map(|v| {
                    let to = v.span().start.clamp(at, text.len());
                    line += text.as_bytes()[at..to].iter().filter(|&&b| b == b'\n').count();
                    at = to;
                    line
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// One step of a key path used to locate a value in the file.
#[derive(Debug, Clone)]
enum Seg {
    Key(&'static str),
    Index(usize),
}

fn render_path(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn find_span(root: &DeTable<'_>, path: &[Seg]) -> Option<Range<usize>> {
    let (Seg::Key(first), rest) = path.split_first()? else {
        return None;
    };
    let mut cur = root.get(*first)?;
    for seg in rest {
        cur = match (seg, cur.get_ref()) {
            (Seg::Key(k), DeValue::Table(t)) => t.get(*k)?,
            (Seg::Index(i), DeValue::Array(a)) => a.get(*i)?,
            _ => return Some(cur.span()),
        };
    }
    Some(cur.span())
}

fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Turns serde's "unknown field `x`, expected one of `a`, `b`" into a message
/// with a "did you mean" when one known name is close to the typo.
fn explain(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_string();
    };
    let Some((unknown, tail)) = rest.split_once('`') else {
        return message.to_string();
    };
    let expected: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
    let best = expected
        .iter()
        .map(|k| (strsim::jaro_winkler(unknown, k), *k))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((_, k)) => format!("unknown key `{unknown}`, did you mean `{k}`?"),
        None if expected.is_empty() => format!("unknown key `{unknown}`"),
        None => format!("unknown key `{unknown}` (known keys here: {})", expected.join(", ")),
    }
}

type Invalid = (Vec<Seg>, String);

/// Credentials for parent proxies: `credentials_file` only on a parent
/// group (and readable), `parent_credentials = "pass"` only on a rule that
/// itself sends the request to a parent group without fixed credentials, so
/// that no configuration can hand a client's proxy credentials to an origin.
fn parent_credentials(c: &Config) -> Result<(), Invalid> {
    use Seg::{Index, Key};
    for (i, u) in c.upstream.iter().enumerate() {
        let Some(path) = &u.credentials_file else { continue };
        let at = || vec![Key("upstream"), Index(i), Key("credentials_file")];
        if !u.parent {
            return Err((
                at(),
                "only a parent group (parent = true) is sent credentials: an origin server must never get proxy credentials"
                    .into(),
            ));
        }
        crate::upstream::credentials::read(path).map_err(|e| (at(), e))?;
    }
    for (i, r) in c.rule.iter().enumerate() {
        if r.parent_credentials != Some(crate::config::ParentCredentials::Pass) {
            continue;
        }
        let at = vec![Key("rule"), Index(i), Key("parent_credentials")];
        let group = r
            .upstream
            .as_ref()
            .and_then(|n| c.upstream.iter().find(|u| &u.name == n));
        match group {
            Some(g) if g.parent && g.credentials_file.is_none() => {}
            Some(g) if g.parent => {
                return Err((
                    at,
                    format!(
                        "upstream `{}` has a credentials_file: its parents are sent those; leave parent_credentials out",
                        g.name
                    ),
                ));
            }
            Some(g) => {
                return Err((
                    at,
                    format!(
                        "upstream `{}` is not a parent group (parent = true): a client's proxy credentials must never go to an origin server",
                        g.name
                    ),
                ));
            }
            None => {
                return Err((
                    at,
                    "\"pass\" needs `upstream` naming a parent group (parent = true) in the same rule: without a parent the client's credentials would go to the origin"
                        .into(),
                ));
            }
        }
    }
    Ok(())
}

/// The longest `listener.defer_accept`: beyond it a silent client waits
/// more than a minute to be seen, and the kernel counts the wait in SYN-ACK
/// retransmissions (1, 3, 7, 15, 31, 63 s...), so it would be coarse too.
const MAX_DEFER_ACCEPT: std::time::Duration = std::time::Duration::from_secs(60);

/// The largest `listener.receive_buffer` or `send_buffer`: the kernel
/// takes an int and doubles it.
const MAX_SOCKET_BUFFER: u64 = 512 << 20;

/// Checks that are about more than one value: references, duplicates, ranges.
fn validate(c: &Config) -> Result<(), Invalid> {
    use Seg::{Index, Key};
    if c.listener.is_empty() {
        return Err((vec![Key("listener")], "at least one [[listener]] is needed".into()));
    }
    for (i, l) in c.listener.iter().enumerate() {
        if c.listener[..i].iter().any(|o| o.address == l.address) {
            return Err((
                vec![Key("listener"), Index(i), Key("address")],
                format!("address {} is used by two listeners", l.address),
            ));
        }
        if !l.busy_body.is_empty() && !l.busy_file.as_os_str().is_empty() {
            return Err((
                vec![Key("listener"), Index(i), Key("busy_file")],
                "set busy_body or busy_file, not both".into(),
            ));
        }
        for (key, size) in [("receive_buffer", l.receive_buffer), ("send_buffer", l.send_buffer)] {
            if size.bytes() > MAX_SOCKET_BUFFER {
                return Err((
                    vec![Key("listener"), Index(i), Key(key)],
                    format!(
                        "{size} is more than the {} MiB a socket buffer may be (the kernel takes an int, and doubles it)",
                        MAX_SOCKET_BUFFER >> 20
                    ),
                ));
            }
        }
        if l.defer_accept.get() > MAX_DEFER_ACCEPT {
            return Err((
                vec![Key("listener"), Index(i), Key("defer_accept")],
                format!(
                    "{} is longer than the {}s allowed: a client that connects and stays silent waits that long to be accepted",
                    l.defer_accept,
                    MAX_DEFER_ACCEPT.as_secs()
                ),
            ));
        }
        if l.mode == Mode::Socks && !l.certificate.is_empty() {
            // Clients speak SOCKS 5 in the clear (RFC 1928 has no TLS
            // wrapping); a TLS port is for HTTP.
            return Err((
                vec![Key("listener"), Index(i), Key("certificate")],
                "a SOCKS listener (mode = \"socks\") does not speak TLS: remove its certificates".into(),
            ));
        }
        if l.mode == Mode::Reverse && c.rule.iter().all(|r| r.upstream.is_none()) {
            return Err((
                vec![Key("listener"), Index(i), Key("mode")],
                "a reverse listener needs at least one [[rule]] with an `upstream` to route requests".into(),
            ));
        }
    }
    for (i, p) in c.proxy.upgrade_protocols.iter().enumerate() {
        // RFC 9110 7.8: protocol-name ["/" protocol-version], both tokens.
        let token = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        let valid = match p.split_once('/') {
            Some((name, version)) => token(name) && token(version),
            None => token(p),
        };
        if !valid {
            return Err((
                vec![Key("proxy"), Key("upgrade_protocols"), Index(i)],
                format!("{p:?} is not a protocol name (a token, optionally /version, such as \"websocket\")"),
            ));
        }
    }
    for (i, u) in c.upstream.iter().enumerate() {
        if c.upstream[..i].iter().any(|o| o.name == u.name) {
            return Err((
                vec![Key("upstream"), Index(i), Key("name")],
                format!("upstream `{}` is defined twice", u.name),
            ));
        }
        if u.servers.is_empty() {
            return Err((
                vec![Key("upstream"), Index(i), Key("servers")],
                "an upstream needs at least one server".into(),
            ));
        }
        if u.parent && u.host_header == crate::config::HostHeader::Rewrite {
            return Err((
                vec![Key("upstream"), Index(i), Key("host_header")],
                "a parent proxy is sent the origin's Host: host_header = \"rewrite\" does not apply to a parent group"
                    .into(),
            ));
        }
        for (j, s) in u.servers.iter().enumerate() {
            // `https://` is an origin over TLS, or a parent reached over TLS.
            if let Err(e) = crate::upstream::ServerAddr::parse(s) {
                return Err((vec![Key("upstream"), Index(i), Key("servers"), Index(j)], e));
            }
        }
    }
    // Rules are compiled here too (and thrown away) so that `portico check`
    // reports a bad regex or header name with its line, as `run` would.
    if let Err(e) = crate::rules::Rules::compile(c) {
        let path = e
            .path
            .iter()
            .map(|s| match s {
                crate::rules::PathSeg::Key(k) => Seg::Key(k),
                crate::rules::PathSeg::Index(i) => Seg::Index(*i),
            })
            .collect();
        return Err((path, e.message));
    }
    // The error pages likewise: a page `run` would refuse is named now.
    if let Err(e) = crate::proxy::ErrorPages::load(&c.error_pages.directory) {
        return Err((vec![Key("error_pages"), Key("directory")], e));
    }
    // ACL entries likewise (and `[access] time_zone`, which they are read in).
    if let Err(e) = crate::acl::Acl::compile(c) {
        let path = e
            .path
            .iter()
            .map(|s| match s {
                crate::rules::PathSeg::Key(k) => Seg::Key(k),
                crate::rules::PathSeg::Index(i) => Seg::Index(*i),
            })
            .collect();
        return Err((path, e.message));
    }
    parent_credentials(c)?;
    // `[array]`: members, `self`, the PAC file's keys.
    if let Err((path, message)) = crate::array::validate(c) {
        let path = path
            .iter()
            .map(|s| match s {
                crate::rules::PathSeg::Key(k) => Seg::Key(k),
                crate::rules::PathSeg::Index(i) => Seg::Index(*i),
            })
            .collect();
        return Err((path, message));
    }
    // A semaphore's permits; more places than any server has descriptors
    // for is no cap anyway.
    if c.origin.max_connections > 1_000_000 {
        return Err((
            vec![Key("origin"), Key("max_connections")],
            format!("{}: must be at most 1000000 (0 for no cap)", c.origin.max_connections),
        ));
    }
    for (i, u) in c.upstream.iter().enumerate() {
        if let Some(n) = u.max_connections.filter(|&n| n > 1_000_000) {
            return Err((
                vec![Key("upstream"), Index(i), Key("max_connections")],
                format!("{n}: must be at most 1000000 (0 for no cap)"),
            ));
        }
    }
    if c.server.processes == 0 || c.server.processes > 1024 {
        return Err((
            vec![Key("server"), Key("processes")],
            format!("{} processes: must be between 1 and 1024", c.server.processes),
        ));
    }
    for (i, r) in c.rule.iter().enumerate() {
        if let Some(b) = &r.bucket
            && (b.is_empty() || !b.bytes().all(|x| x.is_ascii_alphanumeric() || b"-_.".contains(&x)))
        {
            return Err((
                vec![Key("rule"), Index(i), Key("bucket")],
                format!("bucket name {b:?}: use letters, digits, '-', '_' or '.'"),
            ));
        }
    }
    if c.log.format == crate::config::LogFormat::Custom
        && let Err(e) = crate::log::check_format(&c.log.custom_format)
    {
        return Err((vec![Key("log"), Key("custom_format")], e));
    }
    if c.log.access_queue == 0 {
        return Err((
            vec![Key("log"), Key("access_queue")],
            "must be at least 1 (lines the writer may have queued)".to_string(),
        ));
    }
    let m = &c.monitor;
    let paths = [
        ("perf", &m.perf),
        ("stats_xml", &m.stats_xml),
        ("metrics", &m.metrics),
        ("nsc", &m.nsc),
        ("dashboard", &m.dashboard),
        ("json", &m.json),
    ];
    for (i, (key, p)) in paths.iter().enumerate() {
        if p.is_empty() {
            continue;
        }
        if !p.starts_with('/') || p.contains('?') || p.contains(char::is_whitespace) {
            return Err((
                vec![Key("monitor"), Key(key)],
                format!("{p:?} must be a path starting with '/' (or \"\" to disable)"),
            ));
        }
        if let Some((other, _)) = paths[..i].iter().find(|(_, q)| q == p) {
            return Err((vec![Key("monitor"), Key(key)], format!("{p:?} is also monitor.{other}")));
        }
    }
    if !c.cache.cache_status.is_empty() && !crate::cache::is_sf_token(&c.cache.cache_status) {
        return Err((
            vec![Key("cache"), Key("cache_status")],
            format!(
                "{:?} is not a structured-field token (RFC 8941: a letter or *, then letters, digits and :/!#$%&'*+-.^_`|~), such as \"proxy1.example.com\"",
                c.cache.cache_status
            ),
        ));
    }
    if c.cache.read_ahead_gap.bytes() > c.cache.read_ahead_memory.bytes() {
        // Blame the key that was written: a gap left at its default is
        // the memory's fault.
        let default_gap = c.cache.read_ahead_gap == crate::config::DEFAULT_READ_AHEAD_GAP;
        return Err(if default_gap {
            (
                vec![Key("cache"), Key("read_ahead_memory")],
                format!(
                    "{} is less than cache.read_ahead_gap ({}): lower the gap too (0: in step)",
                    c.cache.read_ahead_memory, c.cache.read_ahead_gap
                ),
            )
        } else {
            (
                vec![Key("cache"), Key("read_ahead_gap")],
                format!(
                    "{} is more than cache.read_ahead_memory ({}): no fetch could read that far ahead",
                    c.cache.read_ahead_gap, c.cache.read_ahead_memory
                ),
            )
        });
    }
    if c.cache.memory_cache_mode == crate::config::MemoryCacheMode::Disk && c.cache.disk.bytes() == 0 {
        return Err((
            vec![Key("cache"), Key("memory_cache_mode")],
            "\"disk\" keeps in memory only objects hit on disk, and cache.disk = 0 has no disk tier: \
             nothing would be cached (use \"always\" or \"network\", or give the disk tier a size)"
                .to_string(),
        ));
    }
    if c.cache.quick_abort_pct > 100 {
        return Err((
            vec![Key("cache"), Key("quick_abort_pct")],
            format!("{}: a percentage, at most 100", c.cache.quick_abort_pct),
        ));
    }
    let [low, high] = c.cache.watermarks;
    if low >= high || high > 100 {
        return Err((
            vec![Key("cache"), Key("watermarks")],
            format!("[low, high] must satisfy low < high <= 100, got [{low}, {high}]"),
        ));
    }
    for (i, level) in c.cache.levels.iter().enumerate() {
        if *level == 0 || *level > 4096 {
            return Err((
                vec![Key("cache"), Key("levels"), Index(i)],
                format!("{level} directories: must be between 1 and 4096"),
            ));
        }
    }
    for (i, r) in c.cache.refresh.iter().enumerate() {
        if let Err(e) = regex::Regex::new(&r.pattern) {
            return Err((
                vec![Key("cache"), Key("refresh"), Index(i), Key("pattern")],
                format!("invalid regular expression: {e}"),
            ));
        }
        if r.min > r.max {
            return Err((
                vec![Key("cache"), Key("refresh"), Index(i), Key("min")],
                "min is above max".into(),
            ));
        }
    }
    if c.cache.max_ttl.get() > std::time::Duration::ZERO && c.cache.min_ttl > c.cache.max_ttl {
        return Err((vec![Key("cache"), Key("min_ttl")], "min_ttl is above max_ttl".into()));
    }
    // A slice the cache may not store would be fetched again by every
    // request that touches it.
    let max_object = c.cache.max_object_size;
    let slices = std::iter::once((c.cache.slice, vec![Key("cache"), Key("slice")])).chain(
        c.rule.iter().enumerate().filter_map(|(i, r)| {
            let slice = r.cache.as_ref()?.slice?;
            Some((slice, vec![Key("rule"), Index(i), Key("cache"), Key("slice")]))
        }),
    );
    for (slice, at) in slices {
        if slice.bytes() > max_object.bytes() {
            return Err((
                at,
                format!("slice {slice} is larger than cache.max_object_size ({max_object}): no slice could be stored"),
            ));
        }
    }
    if tracing_level(&c.log.level).is_none() {
        return Err((
            vec![Key("log"), Key("level")],
            format!(
                "unknown level {:?} (use error, warn, info, debug or trace)",
                c.log.level
            ),
        ));
    }
    if c.server.blocking_threads == 0 {
        return Err((
            vec![Key("server"), Key("blocking_threads")],
            "must be at least 1 (disk I/O needs a thread)".into(),
        ));
    }
    let a = &c.auth;
    if a.required && !a.enabled() {
        return Err((
            vec![Key("auth"), Key("required")],
            "required = true needs auth.htpasswd (the file of users to check credentials against) or auth.ldap.url (a directory)".into(),
        ));
    }
    validate_ldap(a)?;
    if a.realm.is_empty() || a.realm.chars().any(|ch| ch == '"' || ch == '\\' || ch.is_control()) {
        return Err((
            vec![Key("auth"), Key("realm")],
            format!(
                "realm {:?}: must be non-empty, without quotes, backslashes or control characters",
                a.realm
            ),
        ));
    }
    if a.max_users == 0 {
        return Err((
            vec![Key("auth"), Key("max_users")],
            "must be at least 1 (the user cache cannot be turned off: every request would verify a password)".into(),
        ));
    }
    if !a.groups.as_os_str().is_empty() && !a.enabled() {
        return Err((
            vec![Key("auth"), Key("groups")],
            "a groups file needs auth.htpasswd".into(),
        ));
    }
    validate_tls(&c.tls)?;
    if c.limits.max_headers == 0 {
        return Err((vec![Key("limits"), Key("max_headers")], "must be at least 1".into()));
    }
    for (key, value, zero) in [
        ("client_request_rate", c.limits.client_request_rate, "no limit"),
        ("client_request_burst", c.limits.client_request_burst, "the rate"),
    ] {
        requests_limit(value, zero).map_err(|e| (vec![Key("limits"), Key(key)], e))?;
    }
    if c.limits.client_request_burst > 0 && c.limits.client_request_rate == 0 {
        return Err((
            vec![Key("limits"), Key("client_request_burst")],
            burst_without_rate("limits.client_request_rate"),
        ));
    }
    for (rate, burst, rate_key, burst_key) in [
        (
            c.limits.client_bandwidth,
            c.limits.client_bandwidth_burst,
            "client_bandwidth",
            "client_bandwidth_burst",
        ),
        (
            c.limits.total_bandwidth,
            c.limits.total_bandwidth_burst,
            "total_bandwidth",
            "total_bandwidth_burst",
        ),
    ] {
        bandwidth_limit(rate.bytes()).map_err(|e| (vec![Key("limits"), Key(rate_key)], e))?;
        if burst.bytes() > 0 && rate.bytes() == 0 {
            return Err((
                vec![Key("limits"), Key(burst_key)],
                burst_without_rate(&format!("limits.{rate_key}")),
            ));
        }
    }
    if !(1024..=1 << 24).contains(&c.limits.client_table) {
        return Err((
            vec![Key("limits"), Key("client_table")],
            "between 1024 and 16777216 clients".into(),
        ));
    }
    if c.limits.max_connections_per_client > 1_000_000 {
        return Err((
            vec![Key("limits"), Key("max_connections_per_client")],
            "at most 1000000 (0: no cap)".into(),
        ));
    }
    if c.limits.max_request_line.bytes() > c.limits.max_header_size.bytes() {
        return Err((
            vec![Key("limits"), Key("max_request_line")],
            "cannot be larger than limits.max_header_size".into(),
        ));
    }
    Ok(())
}

/// `[tls]`: the session lifetime within TLS 1.3's limit, and few enough
/// ticket keys kept to cover it.
fn validate_tls(t: &crate::config::TlsConfig) -> Result<(), Invalid> {
    use Seg::Key;
    let timeout = t.session_timeout.get().as_secs();
    if !(1..=crate::tls_resume::MAX_TIMEOUT_SECS).contains(&timeout) {
        return Err((
            vec![Key("tls"), Key("session_timeout")],
            format!(
                "{}: must be between 1s and 7days (RFC 8446 4.6.1: a ticket lives at most 604800 seconds)",
                t.session_timeout
            ),
        ));
    }
    let rotation = t.session_ticket_rotation.get().as_secs();
    if rotation == 0 {
        return Err((
            vec![Key("tls"), Key("session_ticket_rotation")],
            "must be at least 1s".into(),
        ));
    }
    if timeout.div_ceil(rotation) > crate::tls_resume::MAX_KEYS {
        return Err((
            vec![Key("tls"), Key("session_ticket_rotation")],
            format!(
                "{}: too short for session_timeout = {} (a ticket key is kept for each rotation within the timeout; at most {} keys)",
                t.session_ticket_rotation,
                t.session_timeout,
                crate::tls_resume::MAX_KEYS
            ),
        ));
    }
    Ok(())
}

/// `[auth.ldap]`: the directory settings, each mistake named by its key.
fn validate_ldap(a: &crate::config::AuthConfig) -> Result<(), Invalid> {
    use Seg::Key;
    let l = &a.ldap;
    let at = |k: &'static str| vec![Key("auth"), Key("ldap"), Key(k)];
    let any_set = *l
        != crate::config::LdapConfig {
            url: l.url.clone(),
            ..Default::default()
        };
    if !l.enabled() {
        if any_set {
            return Err((
                vec![Key("auth"), Key("ldap")],
                "the [auth.ldap] settings need url = \"ldap://host\" or \"ldaps://host\" (the directory to ask)".into(),
            ));
        }
        return Ok(());
    }
    if !a.htpasswd.as_os_str().is_empty() {
        return Err((
            at("url"),
            "auth.ldap and auth.htpasswd cannot both be set: users come from one back-end".into(),
        ));
    }
    if !a.groups.as_os_str().is_empty() {
        return Err((
            vec![Key("auth"), Key("groups")],
            "a groups file goes with auth.htpasswd; with auth.ldap, groups come from the directory (auth.ldap.group_base or auth.ldap.member_of)".into(),
        ));
    }
    let tls = match ldap_url(&l.url) {
        Ok(tls) => tls,
        Err(why) => return Err((at("url"), format!("url {:?}: {why}", l.url))),
    };
    if l.starttls && tls {
        return Err((
            at("starttls"),
            "starttls is for ldap:// URLs; an ldaps:// connection is TLS from the start".into(),
        ));
    }
    if !l.ca_file.as_os_str().is_empty() && !tls && !l.starttls {
        return Err((
            at("ca_file"),
            "a CA file is only used with TLS: use an ldaps:// URL or starttls = true".into(),
        ));
    }
    let has_password = !l.bind_password.is_empty() || !l.bind_password_file.as_os_str().is_empty();
    if !l.bind_password.is_empty() && !l.bind_password_file.as_os_str().is_empty() {
        return Err((
            at("bind_password"),
            "set bind_password or bind_password_file, not both".into(),
        ));
    }
    if has_password && l.bind_dn.is_empty() {
        let key = if l.bind_password.is_empty() {
            "bind_password_file"
        } else {
            "bind_password"
        };
        return Err((
            at(key),
            "a service password needs bind_dn (the account it belongs to)".into(),
        ));
    }
    if !l.bind_dn.is_empty() && !has_password {
        return Err((
            at("bind_dn"),
            "bind_dn needs bind_password_file (or bind_password); for anonymous searches leave bind_dn empty".into(),
        ));
    }
    if !l.bind_dn.is_empty() && !l.bind_dn.contains('=') {
        return Err((
            at("bind_dn"),
            format!("{:?} is not a DN (like \"cn=portico,dc=example,dc=com\")", l.bind_dn),
        ));
    }
    if !l.dn_template.is_empty() {
        if !l.dn_template.contains("{user}") {
            let hint = if l.dn_template.contains("%u") || l.dn_template.contains("%s") {
                " (Portico writes the user name as {user}, not %u or %s)"
            } else {
                ""
            };
            return Err((
                at("dn_template"),
                format!(
                    "{:?} has no {{user}}: every user would bind as the same DN{hint}",
                    l.dn_template
                ),
            ));
        }
        if !l.dn_template.contains('=') {
            return Err((
                at("dn_template"),
                format!(
                    "{:?} is not a DN template (like \"uid={{user}},ou=people,dc=example,dc=com\")",
                    l.dn_template
                ),
            ));
        }
    } else {
        if l.base_dn.is_empty() {
            // Not set, so no line of its own: the table's is named.
            return Err((
                vec![Key("auth"), Key("ldap")],
                "base_dn is needed to search for users (the subtree holding them), or set dn_template".into(),
            ));
        }
        if let Err(why) = ldap_filter_shape(&l.user_filter) {
            return Err((at("user_filter"), format!("{:?}: {why}", l.user_filter)));
        }
        if !l.user_filter.contains("{user}") {
            return Err((
                at("user_filter"),
                format!(
                    "{:?} has no {{user}}: it would find the same entry for every user name",
                    l.user_filter
                ),
            ));
        }
    }
    if !l.group_filter.is_empty() {
        if let Err(why) = ldap_filter_shape(&l.group_filter) {
            return Err((at("group_filter"), format!("{:?}: {why}", l.group_filter)));
        }
        if !l.group_filter.contains("{dn}") && !l.group_filter.contains("{user}") {
            return Err((
                at("group_filter"),
                format!(
                    "{:?} has neither {{dn}} nor {{user}}: it would give every user the same groups",
                    l.group_filter
                ),
            ));
        }
        if l.group_base.is_empty() {
            return Err((
                at("group_filter"),
                "a group filter needs group_base (where groups are searched)".into(),
            ));
        }
    }
    if !l.group_base.is_empty() && l.group_name_attribute.is_empty() {
        return Err((
            at("group_name_attribute"),
            "must name the attribute holding a group's name (such as cn)".into(),
        ));
    }
    if l.user_attribute.is_empty() || l.user_attribute.contains([' ', '(', ')', ',', '=']) {
        return Err((
            at("user_attribute"),
            format!(
                "{:?}: must name one attribute (such as uid or sAMAccountName)",
                l.user_attribute
            ),
        ));
    }
    if l.connect_timeout.get().is_zero() {
        return Err((
            at("connect_timeout"),
            "must be above 0 (a dead directory would hang logins)".into(),
        ));
    }
    if l.timeout.get().is_zero() {
        return Err((
            at("timeout"),
            "must be above 0 (a stalled directory would hang logins)".into(),
        ));
    }
    if l.pool_size == 0 {
        return Err((at("pool_size"), "must be at least 1".into()));
    }
    Ok(())
}

/// Checks an `[auth.ldap] url`; true for `ldaps://`. Only scheme, host and
/// port are used, so an LDAP URL's DN, attributes or filter (RFC 4516) are
/// refused rather than silently ignored.
pub fn ldap_url(url: &str) -> Result<bool, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("ldaps://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("ldap://") {
        (false, r)
    } else {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        return Err(if scheme.is_empty() {
            "must start with ldap:// or ldaps://".into()
        } else {
            format!("unknown scheme {scheme}:// (use ldap://, with starttls = true for TLS, or ldaps://)")
        });
    };
    let hostport = rest.strip_suffix('/').unwrap_or(rest);
    if hostport.is_empty() {
        return Err("names no host".into());
    }
    if hostport.contains(['/', '?', '@', '#', ' ']) {
        return Err("only ldap[s]://host[:port] is used: a DN, attributes, filter or user in the URL are not".into());
    }
    let port = if let Some(v6) = hostport.strip_prefix('[') {
        match v6.split_once(']') {
            Some((_, p)) => p.strip_prefix(':'),
            None => return Err("an IPv6 address needs its closing ]".into()),
        }
    } else {
        hostport.split_once(':').map(|(_, p)| p)
    };
    if let Some(p) = port
        && p.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(format!("port {p:?} is not a port number (1-65535)"));
    }
    Ok(tls)
}

/// A filter must be one parenthesised RFC 4515 filter: balanced
/// parentheses, starting with `(` and closed at its end.
fn ldap_filter_shape(f: &str) -> Result<(), &'static str> {
    if !f.starts_with('(') || !f.ends_with(')') {
        return Err("an LDAP filter is enclosed in parentheses, like (uid={user})");
    }
    let mut depth = 0i64;
    for (i, ch) in f.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 || (depth == 0 && i + 1 != f.len()) {
                    return Err("unbalanced parentheses");
                }
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses");
    }
    Ok(())
}

/// The tracing level named by `log.level`, if it is a known one.
pub fn tracing_level(name: &str) -> Option<tracing::Level> {
    match name.to_ascii_lowercase().as_str() {
        "error" => Some(tracing::Level::ERROR),
        "warn" | "warning" => Some(tracing::Level::WARN),
        "info" => Some(tracing::Level::INFO),
        "debug" => Some(tracing::Level::DEBUG),
        "trace" => Some(tracing::Level::TRACE),
        _ => None,
    }
}

/// A bandwidth (`limits.client_bandwidth`, `total_bandwidth`, a rule's
/// `bandwidth`), in bytes a second: 0 (no limit) or at least 1 KiB.
pub(crate) fn bandwidth_limit(rate: u64) -> Result<(), String> {
    if rate > 0 && rate < 1024 {
        return Err("at least 1KiB a second (0: no limit): writes go in pieces of at least 1 KiB".into());
    }
    Ok(())
}

/// A request rate or burst (`limits.client_request_*`, a rule's
/// `request_*`): at most a million; `zero` says what 0 means.
pub(crate) fn requests_limit(value: u32, zero: &str) -> Result<(), String> {
    if value > 1_000_000 {
        return Err(format!("at most 1000000 (0: {zero})"));
    }
    Ok(())
}

/// The error of a burst set without the rate it belongs to (`rate_key`).
pub(crate) fn burst_without_rate(rate_key: &str) -> String {
    format!("needs {rate_key} (a burst above no rate limits nothing)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse_str("", "t.toml").unwrap();
        assert_eq!(c.listener.len(), 1);
        assert_eq!(c.listener[0].address.to_string(), "127.0.0.1:8080");
        assert_eq!(c.keepalive.max_requests, 100);
    }

    #[test]
    fn unknown_key_names_line_and_suggests() {
        let e = parse_str(
            "[server]\nworkers = 1\n\n[[listener]]\nadress = \"127.0.0.1:1\"\n",
            "p.toml",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert_eq!(e.key.as_deref(), Some("listener[0].adress"), "{e}");
        assert!(e.to_string().contains("did you mean `address`"), "{e}");
        assert!(e.to_string().starts_with("p.toml:5:"), "{e}");
    }

    #[test]
    fn a_tls_session_timeout_beyond_tls_1_3_s_week_or_too_many_ticket_keys_is_refused_by_key() {
        let e = parse_str("[tls]\nsession_timeout = \"8days\"\n", "p.toml").unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("tls.session_timeout")),
            "{e}"
        );
        assert!(e.to_string().contains("between 1s and 7days"), "{e}");
        let e = parse_str("[tls]\nsession_ticket_rotation = \"1s\"\n", "p.toml").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("tls.session_ticket_rotation"), "{e}");
        assert!(e.to_string().contains("at most 10080 keys"), "{e}");
        let c = parse_str(
            "[tls]\nsession_timeout = \"10s\"\nsession_ticket_rotation = \"1s\"\n",
            "p.toml",
        )
        .unwrap();
        assert_eq!(c.tls.session_cache_entries, 10_000);
    }

    #[test]
    fn a_connection_cap_beyond_a_million_is_refused_by_key() {
        let e = parse_str("[origin]\nmax_connections = 4611686018427387904\n", "p.toml").unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("origin.max_connections")),
            "{e}"
        );
        assert!(e.to_string().contains("at most 1000000"), "{e}");
        let c = parse_str(
            "[origin]\nmax_connections = 1000000\nqueue_timeout = \"0s\"\n",
            "p.toml",
        )
        .unwrap();
        assert_eq!(c.origin.max_connections, 1_000_000);
        assert_eq!(
            parse_str("", "p.toml").unwrap().origin.max_connections,
            0,
            "no cap by default"
        );
        let e = parse_str(
            "[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:1\"]\nmax_connections = 2000000\n",
            "p.toml",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("at most 1000000"), "{e}");
    }

    #[test]
    fn bad_value_names_line_and_key() {
        let e = parse_str("[keepalive]\n\ntimeout = \"15 fortnights\"\n", "p.toml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.key.as_deref(), Some("keepalive.timeout"), "{e}");
        let e = parse_str("[access]\nallow = [\"10.0.0.0/33\"]\n", "p.toml").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn origin_hosts_take_one_address_or_a_list_and_fold_names() {
        let c = parse_str(
            "[origin]\nnameservers = [\"127.0.0.1:5353\"]\nhosts = { \"A.Test.\" = \"192.0.2.1\", \"b.test\" = [\"::1\", \"192.0.2.2\"] }\n",
            "p.toml",
        )
        .unwrap();
        assert_eq!(c.origin.nameservers, ["127.0.0.1:5353".parse().unwrap()]);
        let hosts: Vec<String> = c.origin.hosts.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        assert_eq!(hosts, ["a.test=[192.0.2.1]", "b.test=[::1, 192.0.2.2]"]);
        let e = parse_str("[origin]\nhosts = { \"a.test\" = \"not-an-ip\" }\n", "p.toml").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.to_string().contains("invalid address \"not-an-ip\""), "{e}");
    }

    #[test]
    fn rule_with_unknown_upstream_is_located() {
        let text =
            "[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\n\n[[rule]]\nhost = \"x\"\nupstream = \"b\"\n";
        let e = parse_str(text, "p.toml").unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
        assert_eq!(e.key.as_deref(), Some("rule[0].upstream"));
        assert!(e.message.contains("no [[upstream]] is named `b`"), "{e}");
    }

    #[test]
    fn networks_take_cidr_or_single_addresses() {
        let c = parse_str(
            "[access]\nallow = [\"127.0.0.0/8\", \"::1\", \"192.0.2.7\"]\n",
            "p.toml",
        )
        .unwrap();
        let shown: Vec<String> = c.access.allow.iter().map(|n| n.to_string()).collect();
        assert_eq!(shown, ["127.0.0.0/8", "::1/128", "192.0.2.7/32"]);
        let e = parse_str("[access]\n\nallow = [\"10.0.0.0/8\", \"nope\"]\n", "p.toml").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.key.as_deref(), Some("access.allow"), "{e}");
        assert!(e.message.contains("invalid network \"nope\""), "{e}");
    }

    #[test]
    fn syntax_error_names_line() {
        let e = parse_str("[server]\nworkers = = 2\n", "p.toml").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn printed_config_parses_back() {
        let c = parse_str("", "t.toml").unwrap();
        let again = parse_str(&c.to_toml(), "printed").unwrap();
        assert_eq!(again.to_toml(), c.to_toml());
    }
}
