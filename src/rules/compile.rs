//! Config -> [`Rules`]: checks every rule (errors name the rule and key, so
//! the config loader can give the line) and builds the index.

use super::Rules;
use super::actions::{Actions, Bandwidth, HeaderEdits, Rewrite};
use super::matcher::{HostMatch, Index, Primary};
use crate::client_rate::RouteRate;
use crate::config::{Config, HeaderEditConfig, RuleConfig};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, StatusCode};
use ipnet::IpNet;
use regex::Regex;
use std::fmt;
use std::sync::Arc;

/// One step of the key path of a rule error (`rule[3].header[1].regex`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    /// A table key.
    Key(&'static str),
    /// An array element.
    Index(usize),
}

/// A rule that cannot be compiled: where (key path from the top of the
/// file) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    /// `rule`, index, key...
    pub path: Vec<PathSeg>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.path.iter().enumerate() {
            match seg {
                PathSeg::Key(k) if i == 0 => write!(f, "{k}")?,
                PathSeg::Key(k) => write!(f, ".{k}")?,
                PathSeg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for RuleError {}

/// A header condition of a rule (or of an ACL entry: `crate::acl` compiles
/// its `header` matchers with [`header_cond`] too).
#[derive(Debug)]
pub(crate) enum HeaderCond {
    Present,
    Equals(Vec<u8>),
    Matches(Regex),
}

/// One compiled rule: its matchers and actions.
#[derive(Debug)]
pub(super) struct Rule {
    pub host: HostMatch,
    pub path: Option<Box<str>>,
    pub regex: Option<Regex>,
    pub methods: Vec<Method>,
    pub schemes: Vec<Box<str>>,
    pub ports: Vec<u16>,
    pub clients: Vec<IpNet>,
    pub modes: Vec<crate::config::Mode>,
    pub headers: Vec<(HeaderName, HeaderCond)>,
    /// The index key the rule is filed under.
    pub primary: Primary,
    pub actions: Actions,
    /// The matchers as config text.
    pub describe: String,
}

/// Request header fields Portico manages itself (framing, connection,
/// routing): a rule may not set or remove them.
const MANAGED_REQUEST: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
    "trailer",
];
/// Response header fields that carry framing: a rule may not touch them.
const MANAGED_RESPONSE: [&str; 6] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "trailer",
];

type Fail = (Vec<PathSeg>, String);

fn at(i: usize, key: &'static str, message: impl Into<String>) -> Fail {
    (
        vec![PathSeg::Key("rule"), PathSeg::Index(i), PathSeg::Key(key)],
        message.into(),
    )
}

impl Rules {
    /// Compiles the `[[rule]]` list of `config` (upstream names are
    /// resolved against its `[[upstream]]` list, in order).
    ///
    /// `portico run` compiles the same rules twice (the config check, then
    /// the server), which for 10,000 regexes is ~0.4 s each; the last result
    /// is kept, keyed by a 128-bit hash of the rules and upstream names, so
    /// the second compile is a lookup. The result depends on the config
    /// only: the routes' buckets are in `shared_buckets`, named by that
    /// hash (the clients' `request_rate` buckets) or tagged with it (a
    /// `total_request_rate` bucket, filled only when a changed list is put
    /// in force, [`Rules::activate`]), so a reload that leaves the rules as
    /// they were keeps them, even compiled anew after a failed reload took
    /// the cache's one place, and one that changes any rule starts them full.
    pub fn compile(config: &Config) -> Result<Rules, RuleError> {
        static LAST: std::sync::Mutex<Option<(u128, Rules)>> = std::sync::Mutex::new(None);
        let names: Vec<&str> = config.upstream.iter().map(|u| u.name.as_str()).collect();
        let key = xxhash_rust::xxh3::xxh3_128(format!("{:?}{names:?}", config.rule).as_bytes());
        if let Ok(last) = LAST.lock()
            && let Some((k, rules)) = last.as_ref()
            && *k == key
        {
            return Ok(rules.clone());
        }
        let rules = Self::compile_fresh(config, key)?;
        if let Ok(mut last) = LAST.lock() {
            *last = Some((key, rules.clone()));
        }
        Ok(rules)
    }

    fn compile_fresh(config: &Config, key: u128) -> Result<Rules, RuleError> {
        let mut rules = Vec::with_capacity(config.rule.len());
        // The K-th rule with a `total_request_rate` has the K-th bucket of
        // those the worker processes share (`shared_buckets::route`), put
        // in force for this rule list (its tag).
        let mut total = TotalSlot { k: 0, list: key as u64 };
        for (i, r) in config.rule.iter().enumerate() {
            rules.push(compile_rule(i, total, r, config).map_err(|(path, message)| RuleError { path, message })?);
            total.k += usize::from(r.total_request_rate.is_some_and(|t| t > 0));
        }
        let index = Index::build(&mut rules).map_err(|message| RuleError {
            path: vec![PathSeg::Key("rule")],
            message,
        })?;
        let passes_credentials = config
            .rule
            .iter()
            .any(|r| r.parent_credentials == Some(crate::config::ParentCredentials::Pass));
        Ok(Rules {
            inner: Arc::new(super::Compiled {
                rules,
                index,
                passes_credentials,
            }),
        })
    }
}

fn regex(i: usize, key: &'static str, pattern: &str) -> Result<Regex, Fail> {
    Regex::new(pattern).map_err(|e| at(i, key, format!("invalid regular expression: {e}")))
}

/// Where a rule's `total_request_rate` bucket is: the `k`-th shared one,
/// put in force for the rule list hashed as `list` (which also names its
/// clients' `request_rate` buckets).
#[derive(Debug, Clone, Copy)]
struct TotalSlot {
    k: usize,
    list: u64,
}

/// Rule `i`; `total`: its `total_request_rate` bucket, if it sets one.
fn compile_rule(i: usize, total: TotalSlot, r: &RuleConfig, config: &Config) -> Result<Rule, Fail> {
    let mut describe = Vec::new();
    let host = match r.host.as_deref() {
        None => HostMatch::Any,
        Some(h) => {
            describe.push(format!("host = {h:?}"));
            if !valid_host_pattern(h) {
                return Err(at(i, "host", format!("host {h:?} must be a name, `*.domain` or `*`")));
            }
            // An address in the spelling requests are compared in, whichever
            // one the entry is written in (`[::1]`, `::1`, `127.1`).
            let h = crate::util::canonical_host(h);
            match h.strip_prefix('*') {
                _ if h == "*" => HostMatch::Any,
                Some(suffix) => HostMatch::Suffix(suffix.into()),
                None => HostMatch::Exact(h.into()),
            }
        }
    };
    if let Some(p) = &r.path {
        describe.push(format!("path = {p:?}"));
        if !p.starts_with('/') {
            return Err(at(i, "path", format!("path prefix {p:?} must start with '/'")));
        }
    }
    let re = match &r.regex {
        Some(p) => {
            describe.push(format!("regex = {p:?}"));
            Some(regex(i, "regex", p)?)
        }
        None => None,
    };
    let methods = methods(&r.method).map_err(|m| at(i, "method", m))?;
    if !r.method.is_empty() {
        describe.push(format!("method = {:?}", r.method));
    }
    let schemes = schemes(&r.scheme).map_err(|m| at(i, "scheme", m))?;
    if !r.scheme.is_empty() {
        describe.push(format!("scheme = {:?}", r.scheme));
    }
    if r.port.contains(&0) {
        return Err(at(i, "port", "port 0 never matches"));
    }
    if !r.port.is_empty() {
        describe.push(format!("port = {:?}", r.port));
    }
    if !r.client.is_empty() {
        let nets: Vec<String> = r.client.iter().map(|n| n.to_string()).collect();
        describe.push(format!("client = {nets:?}"));
    }
    if !r.mode.is_empty() {
        let names: Vec<&str> = r
            .mode
            .iter()
            .map(|m| match m {
                crate::config::Mode::Forward => "forward",
                crate::config::Mode::Reverse => "reverse",
                crate::config::Mode::Transparent => "transparent",
                crate::config::Mode::Socks => "socks",
            })
            .collect();
        describe.push(format!("mode = {names:?}"));
    }
    let mut headers = Vec::new();
    for (j, h) in r.header.iter().enumerate() {
        let (name, cond, text) = header_cond(h).map_err(|(key, msg)| {
            (
                vec![
                    PathSeg::Key("rule"),
                    PathSeg::Index(i),
                    PathSeg::Key("header"),
                    PathSeg::Index(j),
                    PathSeg::Key(key),
                ],
                msg,
            )
        })?;
        describe.push(text);
        headers.push((name, cond));
    }
    let actions = compile_actions(i, total, r, config, re.as_ref())?;
    Ok(Rule {
        host,
        path: r.path.as_deref().map(Into::into),
        regex: re,
        methods,
        schemes,
        ports: r.port.clone(),
        clients: r.client.clone(),
        modes: r.mode.clone(),
        headers,
        primary: Primary::Always,
        actions,
        describe: if describe.is_empty() {
            "(no matchers: every request)".to_string()
        } else {
            describe.join(", ")
        },
    })
}

/// Compiles one `header = { name, value | regex }` condition: the field
/// name, the condition and its description (`header X ~ "re"`), or the
/// key inside the condition that is wrong and why. Shared by `[[rule]]`
/// and `[[acl]]`, so both read header conditions the same way.
pub(crate) fn header_cond(
    h: &crate::config::HeaderMatchConfig,
) -> Result<(HeaderName, HeaderCond, String), (&'static str, String)> {
    let name = HeaderName::from_bytes(h.name.as_bytes())
        .map_err(|_| ("name", format!("{:?} is not a header field name", h.name)))?;
    let (cond, text) = match (&h.value, &h.regex) {
        (Some(_), Some(_)) => return Err(("regex", "give `value` or `regex`, not both".into())),
        (Some(v), None) => (
            HeaderCond::Equals(v.as_bytes().to_vec()),
            format!("header {} = {v:?}", h.name),
        ),
        (None, Some(p)) => (
            HeaderCond::Matches(Regex::new(p).map_err(|e| ("regex", format!("invalid regular expression: {e}")))?),
            format!("header {} ~ {p:?}", h.name),
        ),
        (None, None) => (HeaderCond::Present, format!("header {} present", h.name)),
    };
    Ok((name, cond, text))
}

fn compile_actions(
    i: usize,
    total: TotalSlot,
    r: &RuleConfig,
    config: &Config,
    rule_regex: Option<&Regex>,
) -> Result<Actions, Fail> {
    let upstream = match &r.upstream {
        None => None,
        Some(name) => Some(config.upstream.iter().position(|u| &u.name == name).ok_or_else(|| {
            let known: Vec<&str> = config.upstream.iter().map(|u| u.name.as_str()).collect();
            at(
                i,
                "upstream",
                format!(
                    "no [[upstream]] is named `{name}` (defined: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })?),
    };
    let rewrite = match &r.rewrite {
        None => None,
        Some(rw) => {
            let regex = match (&rw.regex, rule_regex) {
                (Some(p), _) => regex(i, "rewrite", p)?,
                (None, Some(re)) => re.clone(),
                (None, None) => {
                    return Err(at(
                        i,
                        "rewrite",
                        "rewrite needs a `regex`, in the rewrite or as the rule's own `regex`",
                    ));
                }
            };
            if !rw.to.starts_with('/') {
                return Err(at(i, "rewrite", format!("`to` = {:?} must start with '/'", rw.to)));
            }
            Some(Rewrite {
                regex,
                to: rw.to.clone(),
            })
        }
    };
    let request_headers = edits(i, "request_headers", r.request_headers.as_ref(), &MANAGED_REQUEST)?;
    let response_headers = edits(i, "response_headers", r.response_headers.as_ref(), &MANAGED_RESPONSE)?;
    let deny = match r.deny {
        None => None,
        Some(code) => match StatusCode::from_u16(code) {
            Ok(s) if (400..=599).contains(&code) => Some(s),
            _ => return Err(at(i, "deny", format!("{code}: deny takes an error status, 400 to 599"))),
        },
    };
    let redirect = match &r.redirect {
        None => None,
        Some(rd) => {
            let status = match rd.status {
                301 | 302 | 303 | 307 | 308 => StatusCode::from_u16(rd.status).ok(),
                _ => None,
            }
            .ok_or_else(|| {
                at(
                    i,
                    "redirect",
                    format!("status {}: use 301, 302, 303, 307 or 308", rd.status),
                )
            })?;
            if rd.to.is_empty() || HeaderValue::from_str(&rd.to).is_err() {
                return Err(at(i, "redirect", format!("`to` = {:?} is not a valid Location", rd.to)));
            }
            Some((status, rd.to.clone()))
        }
    };
    let ends = if deny.is_some() {
        Some("deny")
    } else if redirect.is_some() {
        Some("redirect")
    } else {
        None
    };
    if let Some(key) = ends {
        if deny.is_some() && redirect.is_some() {
            return Err(at(i, "redirect", "a rule cannot both deny and redirect"));
        }
        if r.continue_ {
            return Err(at(
                i,
                key,
                format!("`{key}` answers the request: `continue = true` cannot go on"),
            ));
        }
        if r.upstream.is_some() || r.rewrite.is_some() {
            return Err(at(
                i,
                key,
                format!("`{key}` answers the request itself: `upstream` and `rewrite` would have no effect"),
            ));
        }
    }
    if r.bucket.as_deref().is_some_and(str::is_empty) {
        return Err(at(i, "bucket", "bucket name is empty"));
    }
    let bandwidth = r.bandwidth.map(|b| b.bytes());
    if let Some(b) = bandwidth {
        crate::config::load::bandwidth_limit(b).map_err(|e| at(i, "bandwidth", e))?;
    }
    if r.bandwidth_after.is_some_and(|a| a.bytes() > 0) && bandwidth.is_none_or(|b| b == 0) {
        return Err(at(
            i,
            "bandwidth_after",
            "needs a bandwidth on the same rule (bytes sent at full speed before what?)",
        ));
    }
    for (key, value, zero) in [
        ("request_rate", r.request_rate, "no limit"),
        ("request_burst", r.request_burst, "the rate"),
        ("total_request_rate", r.total_request_rate, "no limit"),
        ("total_request_burst", r.total_request_burst, "the rate"),
    ] {
        if let Some(v) = value {
            crate::config::load::requests_limit(v, zero).map_err(|e| at(i, key, e))?;
        }
    }
    for (burst_key, burst, rate) in [
        ("request_burst", r.request_burst, r.request_rate),
        ("total_request_burst", r.total_request_burst, r.total_request_rate),
    ] {
        if burst.is_some_and(|b| b > 0) && rate.is_none_or(|r| r == 0) {
            let rate_key = burst_key.replace("burst", "rate");
            return Err(at(
                i,
                burst_key,
                crate::config::load::burst_without_rate(&format!("a {rate_key} on the same rule")),
            ));
        }
    }
    Ok(Actions {
        continue_: r.continue_,
        upstream,
        rewrite,
        request_headers,
        response_headers,
        cache: r.cache.is_some(),
        bucket: r.bucket.as_deref().map(Arc::from),
        busy_body: r.busy_body.as_ref().map(|b| Bytes::from(b.clone())),
        deny,
        redirect,
        pass_credentials: r
            .parent_credentials
            .map(|p| p == crate::config::ParentCredentials::Pass),
        request_rate: r.request_rate.map(|rate| {
            (rate > 0).then(|| Arc::new(RouteRate::new(i, total.list, rate, r.request_burst.unwrap_or(0))))
        }),
        total_request_rate: r.total_request_rate.map(|rate| {
            (rate > 0).then(|| {
                let bucket = crate::shared_buckets::route(total.k);
                // Not 0, which a fresh memory holds for no list.
                let tag = (total.list ^ total.k as u64).max(1);
                Arc::new(RouteRate::total(
                    i,
                    bucket,
                    tag,
                    rate,
                    r.total_request_burst.unwrap_or(0),
                ))
            })
        }),
        bandwidth: bandwidth.map(|rate| Bandwidth {
            rate,
            after: r.bandwidth_after.map_or(0, |a| a.bytes()),
        }),
    })
}

fn edits(
    i: usize,
    key: &'static str,
    cfg: Option<&HeaderEditConfig>,
    managed: &[&str],
) -> Result<Option<Arc<HeaderEdits>>, Fail> {
    let Some(cfg) = cfg else { return Ok(None) };
    let name = |n: &str| {
        let name = HeaderName::from_bytes(n.as_bytes())
            .map_err(|_| at(i, key, format!("{n:?} is not a header field name")))?;
        if managed.contains(&name.as_str()) {
            return Err(at(
                i,
                key,
                format!("`{name}` is managed by Portico and cannot be set or removed"),
            ));
        }
        Ok(name)
    };
    let mut out = HeaderEdits::default();
    for n in &cfg.remove {
        out.remove.push(name(n)?);
    }
    for (n, v) in &cfg.set {
        let value =
            HeaderValue::from_str(v).map_err(|_| at(i, key, format!("{v:?} is not a valid value for `{n}`")))?;
        out.set.push((name(n)?, value));
    }
    Ok(Some(Arc::new(out)))
}

/// `name`, `*.domain` or `*`: a wildcard only as the whole first label.
pub(crate) fn valid_host_pattern(h: &str) -> bool {
    match h.strip_prefix("*.") {
        _ if h == "*" => true,
        Some(rest) => !rest.is_empty() && !rest.contains('*'),
        None => !h.is_empty() && !h.contains('*'),
    }
}

/// A matcher's `method` list as methods; the error names the one that is
/// not a method (shared by `[[rule]]` and `[[acl]]`).
pub fn methods(list: &[String]) -> Result<Vec<Method>, String> {
    list.iter()
        .map(|m| Method::from_bytes(m.as_bytes()).map_err(|_| format!("{m:?} is not a method")))
        .collect()
}

/// A matcher's `scheme` list, lower-cased: only `http` and `https`, the
/// schemes a proxied URL can have (shared by `[[rule]]` and `[[acl]]`).
pub fn schemes(list: &[String]) -> Result<Vec<Box<str>>, String> {
    list.iter()
        .map(|s| {
            let s = s.to_ascii_lowercase();
            if s == "http" || s == "https" {
                Ok(s.into_boxed_str())
            } else {
                Err(format!("scheme {s:?}: use \"http\" or \"https\""))
            }
        })
        .collect()
}
