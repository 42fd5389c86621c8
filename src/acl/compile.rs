//! Config -> [`Acl`]: checks every entry (errors name the entry and key,
//! so the config loader can give the line) and builds the host index;
//! reads and compiles the `[[acl_list]]` files the entries' `list` names.

use super::lists::List;
use super::{Acl, Check, Compiled, Local, Request};
use crate::config::{AclAction, AclConfig, Config, Mode};
use crate::rules::{HeaderCond, PathSeg, RuleError};
use http::{HeaderName, Method, StatusCode};
use ipnet::IpNet;
use regex::Regex;
use std::sync::Arc;

/// How an entry matches the host: one of these per `host` item.
#[derive(Debug, Clone)]
enum HostMatch {
    Exact(Box<str>),
    /// `*.example.com`, stored as `.example.com`.
    Suffix(Box<str>),
}

/// One compiled `[[acl]]` entry.
#[derive(Debug)]
pub(super) struct Entry {
    action: AclAction,
    status: StatusCode,
    reason: Arc<str>,
    clients: Vec<IpNet>,
    users: Vec<Box<str>>,
    groups: Vec<Box<str>>,
    authenticated: Option<bool>,
    methods: Vec<Method>,
    schemes: Vec<Box<str>>,
    /// Empty: any host (no `host`, or `*` among them).
    hosts: Vec<HostMatch>,
    host_regex: Option<Regex>,
    ports: Vec<u16>,
    paths: Vec<Box<str>>,
    regex: Option<Regex>,
    headers: Vec<(HeaderName, HeaderCond)>,
    modes: Vec<Mode>,
    /// `[start, end)` in minutes since midnight; start > end wraps midnight.
    time: Option<(u16, u16)>,
    /// Bit d (Monday = 0) set for each day given; 0 = any day.
    days: u8,
    /// `list`: filter lists, any pattern of any of which matches.
    pub lists: Vec<Arc<List>>,
    /// `content_type` and `kind = "mime"` lists: a response entry.
    pub reply: Option<super::mime::ReplyMatch>,
    /// `allow_destinations`: the networks this allow entry's requests may
    /// connect to despite `[proxy] deny_destinations`.
    allow_destinations: Vec<IpNet>,
    /// Index + 1 of those networks in [`Compiled::reach`]; 0 for none.
    pub reach: u16,
    /// The matchers as config text.
    pub describe: String,
}

type Fail = (Vec<PathSeg>, String);

fn at(i: usize, key: &'static str, message: impl Into<String>) -> Fail {
    (
        vec![PathSeg::Key("acl"), PathSeg::Index(i), PathSeg::Key(key)],
        message.into(),
    )
}

/// A regex as entries use it: compiled with the regex crate's default
/// size limit, so a pathological pattern is refused at load time with a
/// message, not compiled into a huge automaton.
fn regex(i: usize, key: &'static str, pattern: &str) -> Result<Regex, Fail> {
    Regex::new(pattern).map_err(|e| at(i, key, format!("invalid regular expression: {e}")))
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const DAY_NAMES: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// `"HH:MM"` as minutes since midnight; `24:00` only as an end.
fn clock(text: &str, end: bool) -> Option<u16> {
    let (h, m) = text.trim().split_once(':')?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return None;
    }
    let h: u16 = h.parse().ok()?;
    let m: u16 = m.parse().ok()?;
    match (h, m) {
        (24, 0) if end => Some(24 * 60),
        (0..=23, 0..=59) => Some(h * 60 + m),
        _ => None,
    }
}

/// `"08:00-18:00"`: `[start, end)` in minutes; wraps midnight when start > end.
pub(super) fn time_window(text: &str) -> Result<(u16, u16), String> {
    let bad =
        || format!("time {text:?}: write \"HH:MM-HH:MM\" (24-hour clock, e.g. \"08:00-18:00\" or \"22:00-06:00\")");
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let start = clock(a, false).ok_or_else(bad)?;
    let end = clock(b, true).ok_or_else(bad)?;
    if start == end || (start == 0 && end == 24 * 60) {
        return Err(format!(
            "time {text:?} covers the whole day or none of it: leave `time` out for every hour"
        ));
    }
    Ok((start, end))
}

impl Acl {
    /// Compiles the `[[acl]]` list and the `[access]` keys it uses
    /// (`acl_default`, `time_zone`).
    ///
    /// `portico run` compiles twice (the config check, then the server):
    /// the last result is kept, keyed by a 128-bit hash of what it is built
    /// from, so the second compile is a lookup (as `Rules::compile` does).
    /// The `[[acl_list]]` files are read on every call and their bytes are
    /// part of that key, so a reload after a list file changed rebuilds.
    pub fn compile(config: &Config) -> Result<Acl, RuleError> {
        static LAST: std::sync::Mutex<Option<(u128, Acl)>> = std::sync::Mutex::new(None);
        let a = &config.access;
        // The list files are read here, and their contents are part of the
        // key: a file changed before a SIGHUP must rebuild the ACL even
        // though the config text is the same.
        let files: Vec<Result<Vec<u8>, String>> = config.acl_list.iter().map(|l| read_list_file(&l.file)).collect();
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(
            format!(
                "{:?}{:?}{:?}{:?}{:?}",
                config.acl, config.acl_list, a.acl_default, a.time_zone, config.proxy.deny_destinations
            )
            .as_bytes(),
        );
        for f in &files {
            match f {
                Ok(bytes) => {
                    hasher.update(&(bytes.len() as u64).to_le_bytes());
                    hasher.update(bytes);
                }
                Err(e) => hasher.update(e.as_bytes()),
            }
        }
        let key = hasher.digest128();
        if let Ok(last) = LAST.lock()
            && let Some((k, acl)) = last.as_ref()
            && *k == key
        {
            return Ok(acl.clone());
        }
        let acl = Self::compile_fresh(config, files).map_err(|(path, message)| RuleError { path, message })?;
        if let Ok(mut last) = LAST.lock() {
            *last = Some((key, acl.clone()));
        }
        Ok(acl)
    }

    fn compile_fresh(config: &Config, files: Vec<Result<Vec<u8>, String>>) -> Result<Acl, Fail> {
        let access = &config.access;
        let zone = jiff::tz::TimeZone::get(&access.time_zone).map_err(|_| {
            (
                vec![PathSeg::Key("access"), PathSeg::Key("time_zone")],
                format!(
                    "unknown time zone {:?}: give an IANA name such as \"UTC\", \"Europe/Paris\" or \"America/New_York\"",
                    access.time_zone
                ),
            )
        })?;
        let list_at = |i: usize, key: &'static str, message: String| {
            (
                vec![PathSeg::Key("acl_list"), PathSeg::Index(i), PathSeg::Key(key)],
                message,
            )
        };
        let mut lists: Vec<Arc<List>> = Vec::with_capacity(files.len());
        for (i, (l, bytes)) in config.acl_list.iter().zip(files).enumerate() {
            if l.name.trim().is_empty() {
                return Err(list_at(
                    i,
                    "name",
                    "a list needs a name for `[[acl]]` entries to use".into(),
                ));
            }
            if lists.iter().any(|x| *x.name == *l.name) {
                return Err(list_at(i, "name", format!("a second list named {:?}", l.name)));
            }
            let bytes = bytes.map_err(|e| {
                list_at(
                    i,
                    "file",
                    format!("list {:?}: cannot read {}: {e}", l.name, l.file.display()),
                )
            })?;
            let list =
                super::lists::build(l, &bytes).map_err(|e| list_at(i, "file", format!("list {:?}: {e}", l.name)))?;
            lists.push(Arc::new(list));
        }
        let mut entries = Vec::with_capacity(config.acl.len());
        for (i, e) in config.acl.iter().enumerate() {
            entries.push(compile_entry(i, e, &lists)?);
        }
        // The distinct `allow_destinations` sets, each of which the server
        // gives a client (and a pool) of its own. None when nothing is
        // refused: there is nothing to make an exception to.
        let mut reach: Vec<Vec<IpNet>> = Vec::new();
        if !config.proxy.deny_destinations.is_empty() {
            for (i, e) in entries.iter_mut().enumerate() {
                if e.allow_destinations.is_empty() {
                    continue;
                }
                let k = match reach.iter().position(|r| *r == e.allow_destinations) {
                    Some(k) => k,
                    None => {
                        reach.push(e.allow_destinations.clone());
                        reach.len() - 1
                    }
                };
                e.reach = u16::try_from(k + 1).map_err(|_| {
                    at(
                        i,
                        "allow_destinations",
                        "more than 65,535 different allow_destinations sets",
                    )
                })?;
            }
        }
        let mut exact = super::HostTable::default();
        let mut suffix = super::HostTable::default();
        let mut rest = Vec::new();
        let mut reply = Vec::new();
        for (id, e) in entries.iter().enumerate() {
            let id = id as u32;
            if e.reply.is_some() {
                // Decided on the response, not with the request's entries.
                reply.push(id);
                continue;
            }
            if e.hosts.is_empty() {
                rest.push(id);
            }
            for h in &e.hosts {
                let list = match h {
                    HostMatch::Exact(h) => exact.entry(super::host_key(h)).or_default(),
                    HostMatch::Suffix(s) => suffix.entry(super::host_key(s)).or_default(),
                };
                // An entry listing `a.test` twice is one candidate.
                if list.last() != Some(&id) {
                    list.push(id);
                }
            }
        }
        Ok(Acl {
            inner: Arc::new(Compiled {
                entries,
                exact,
                suffix,
                rest,
                reply,
                reach,
                default: access.acl_default,
                zone,
                zone_name: access.time_zone.clone(),
            }),
        })
    }
}

fn compile_entry(i: usize, e: &AclConfig, known: &[Arc<List>]) -> Result<Entry, Fail> {
    let mut describe = Vec::new();
    let status = match (e.action, e.status) {
        (AclAction::Allow, Some(_)) => return Err(at(i, "status", "`status` applies to action = \"deny\" only")),
        (_, None) => StatusCode::FORBIDDEN,
        (_, Some(code)) => match StatusCode::from_u16(code) {
            Ok(s) if (400..=599).contains(&code) => s,
            _ => {
                return Err(at(
                    i,
                    "status",
                    format!("{code}: a deny takes an error status, 400 to 599"),
                ));
            }
        },
    };
    if e.action == AclAction::Allow && e.reason.is_some() {
        return Err(at(i, "reason", "`reason` applies to action = \"deny\" only"));
    }
    if e.action == AclAction::Deny && !e.allow_destinations.is_empty() {
        return Err(at(
            i,
            "allow_destinations",
            "`allow_destinations` applies to action = \"allow\" only (refuse networks with [proxy] deny_destinations)",
        ));
    }
    let reason: Arc<str> = match &e.reason {
        Some(r) if r.trim().is_empty() => return Err(at(i, "reason", "reason is empty: leave it out for the default")),
        Some(r) => Arc::from(r.as_str()),
        None => Arc::from(super::DEFAULT_REASON),
    };
    if !e.client.is_empty() {
        let nets: Vec<String> = e.client.iter().map(|n| n.to_string()).collect();
        describe.push(format!("client = {nets:?}"));
    }
    for (key, list) in [("user", &e.user), ("group", &e.group)] {
        if list.iter().any(|u| u.is_empty()) {
            return Err(at(i, key, format!("an empty {key} name never matches")));
        }
        if !list.is_empty() {
            describe.push(format!("{key} = {list:?}"));
        }
    }
    if let Some(a) = e.authenticated {
        describe.push(format!("authenticated = {a}"));
    }
    let methods = crate::rules::methods(&e.method).map_err(|m| at(i, "method", m))?;
    if !e.method.is_empty() {
        describe.push(format!("method = {:?}", e.method));
    }
    let schemes = crate::rules::schemes(&e.scheme).map_err(|m| at(i, "scheme", m))?;
    if !e.scheme.is_empty() {
        describe.push(format!("scheme = {:?}", e.scheme));
    }
    let mut hosts = Vec::new();
    let mut any_host = false;
    for h in &e.host {
        if !crate::rules::valid_host_pattern(h) {
            return Err(at(i, "host", format!("host {h:?} must be a name, `*.domain` or `*`")));
        }
        // An address in the spelling requests are compared in, whichever
        // one the entry is written in (`[::1]`, `::1`, `127.1`).
        let h = crate::util::canonical_host(h);
        match h.strip_prefix('*') {
            _ if h == "*" => any_host = true,
            Some(suffix) => hosts.push(HostMatch::Suffix(suffix.into())),
            None => hosts.push(HostMatch::Exact(h.into())),
        }
    }
    if any_host {
        hosts.clear();
    }
    if !e.host.is_empty() {
        describe.push(format!("host = {:?}", e.host));
    }
    let host_regex = match &e.host_regex {
        Some(p) => {
            describe.push(format!("host_regex = {p:?}"));
            Some(regex(i, "host_regex", p)?)
        }
        None => None,
    };
    if e.port.contains(&0) {
        return Err(at(i, "port", "port 0 never matches"));
    }
    if !e.port.is_empty() {
        describe.push(format!("port = {:?}", e.port));
    }
    for p in &e.path {
        if !p.starts_with('/') {
            return Err(at(i, "path", format!("path prefix {p:?} must start with '/'")));
        }
    }
    if !e.path.is_empty() {
        describe.push(format!("path = {:?}", e.path));
    }
    let re = match &e.regex {
        Some(p) => {
            describe.push(format!("regex = {p:?}"));
            Some(regex(i, "regex", p)?)
        }
        None => None,
    };
    let mut headers = Vec::new();
    for (j, h) in e.header.iter().enumerate() {
        let (name, cond, text) = crate::rules::header_cond(h).map_err(|(key, msg)| {
            (
                vec![
                    PathSeg::Key("acl"),
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
    if !e.mode.is_empty() {
        let names: Vec<&str> = e.mode.iter().map(|m| crate::rules::mode_name(*m)).collect();
        describe.push(format!("mode = {names:?}"));
    }
    let time = match &e.time {
        Some(t) => {
            describe.push(format!("time = {t:?}"));
            Some(time_window(t).map_err(|m| at(i, "time", m))?)
        }
        None => None,
    };
    let mut days = 0u8;
    for d in &e.days {
        let l = d.trim().to_ascii_lowercase();
        let n = DAYS
            .iter()
            .position(|x| *x == l)
            .or_else(|| DAY_NAMES.iter().position(|x| *x == l))
            .ok_or_else(|| {
                at(
                    i,
                    "days",
                    format!("unknown day {d:?}: use mon, tue, wed, thu, fri, sat or sun"),
                )
            })?;
        days |= 1 << n;
    }
    if !e.days.is_empty() {
        describe.push(format!("days = {:?}", e.days));
    }
    let mut lists: Vec<Arc<List>> = Vec::new();
    let mut reply = super::mime::ReplyMatch::default();
    for (j, t) in e.content_type.iter().enumerate() {
        reply.inline.insert(t, 0).map_err(|m| {
            (
                vec![
                    PathSeg::Key("acl"),
                    PathSeg::Index(i),
                    PathSeg::Key("content_type"),
                    PathSeg::Index(j),
                ],
                m,
            )
        })?;
    }
    if !e.content_type.is_empty() {
        describe.push(format!("content_type = {:?}", reply.inline.describe()));
    }
    for name in &e.list {
        let l = known.iter().find(|l| *l.name == **name).ok_or_else(|| {
            let names: Vec<&str> = known.iter().map(|l| &*l.name).collect();
            at(
                i,
                "list",
                if names.is_empty() {
                    format!("no [[acl_list]] named {name:?}: define one with name, file and kind")
                } else {
                    format!("no [[acl_list]] named {name:?} (lists: {})", names.join(", "))
                },
            )
        })?;
        if l.mime().is_some() {
            reply.lists.push(l.clone());
        } else {
            lists.push(l.clone());
        }
    }
    if let (Some(m), Some(r)) = (reply.lists.first(), lists.first()) {
        // `list` is "any of": a request list and a response list together
        // would silently mean "both"; two entries say it plainly.
        return Err(at(
            i,
            "list",
            format!(
                "list {:?} is a kind = \"mime\" list (matched on the response) and {:?} is matched on the request: give them to two entries",
                m.name, r.name
            ),
        ));
    }
    if !e.list.is_empty() {
        describe.push(format!("list = {:?}", e.list));
    }
    let reply = (!reply.inline.is_empty() || !reply.lists.is_empty()).then_some(reply);
    if reply.is_some() && !e.allow_destinations.is_empty() {
        // A response entry decides once the connection is made and answered.
        return Err(at(
            i,
            "allow_destinations",
            "`allow_destinations` cannot go with `content_type` or a kind = \"mime\" list: a response entry is decided after the connection is made; give it to a request entry",
        ));
    }
    if !e.allow_destinations.is_empty() {
        let nets: Vec<String> = e.allow_destinations.iter().map(|n| n.to_string()).collect();
        describe.push(format!("allow_destinations = {nets:?}"));
    }
    Ok(Entry {
        action: e.action,
        lists,
        reply,
        allow_destinations: e.allow_destinations.clone(),
        reach: 0,
        status,
        reason,
        clients: e.client.clone(),
        users: e.user.iter().map(|u| u.as_str().into()).collect(),
        groups: e.group.iter().map(|g| g.as_str().into()).collect(),
        authenticated: e.authenticated,
        methods,
        schemes,
        hosts,
        host_regex,
        ports: e.port.clone(),
        // In the form request paths are compared in (`path.rs`), so that
        // `/%7Euser/` in the config is the `/~user/` requests become.
        paths: e.path.iter().map(|p| super::path::normalize_path(p).into()).collect(),
        regex: re,
        headers,
        modes: e.mode.clone(),
        time,
        days,
        describe: if describe.is_empty() {
            "(no matchers: every request)".to_string()
        } else {
            describe.join(", ")
        },
    })
}

impl Entry {
    /// Whether the entry holds for `req`, whose path must be normalised
    /// (`Request::normalised`): cheap matchers first, regexes
    /// last, the user matchers at the very end (NeedAuth only when all the
    /// others hold). `local` gives the local time, computed on first use.
    pub(super) fn check(&self, req: &Request<'_>, local: impl FnOnce() -> Local) -> Check {
        let tunnel = req.is_tunnel();
        // A CONNECT has no URL scheme or path: such entries never match it.
        if tunnel && (!self.schemes.is_empty() || !self.paths.is_empty() || self.regex.is_some()) {
            return Check::No;
        }
        let host_ok = self.hosts.is_empty()
            || self.hosts.iter().any(|h| match h {
                HostMatch::Exact(h) => **h == *req.host,
                HostMatch::Suffix(s) => req.host.len() > s.len() && req.host.ends_with(&**s),
            });
        let ok = host_ok
            && (self.methods.is_empty() || self.methods.contains(req.method))
            && (self.ports.is_empty() || self.ports.contains(&req.port))
            && (self.modes.is_empty() || self.modes.contains(&req.mode))
            && (self.schemes.is_empty() || self.schemes.iter().any(|s| **s == *req.scheme))
            && (self.clients.is_empty()
                || self
                    .clients
                    .iter()
                    .any(|n| n.contains(&crate::rules::canonical(req.client))))
            && (self.paths.is_empty() || {
                let path = req.path_and_query.split('?').next().unwrap_or("");
                self.paths.iter().any(|p| path.starts_with(&**p))
            })
            && self
                .headers
                .iter()
                .all(|(name, cond)| crate::rules::header_holds(req.headers, name, cond));
        if !ok {
            return Check::No;
        }
        if self.time.is_some() || self.days != 0 {
            let now = local();
            if self.days != 0 && self.days & (1 << now.weekday) == 0 {
                return Check::No;
            }
            if let Some((start, end)) = self.time {
                let inside = if start < end {
                    (start..end).contains(&now.minute)
                } else {
                    now.minute >= start || now.minute < end
                };
                if !inside {
                    return Check::No;
                }
            }
        }
        if !self.host_regex.as_ref().is_none_or(|re| re.is_match(req.host))
            || !self.regex.as_ref().is_none_or(|re| re.is_match(req.path_and_query))
        {
            return Check::No;
        }
        // Last of the request matchers: a regex list is the dearest.
        if !self.lists.is_empty() && !self.lists.iter().any(|l| l.matches(req)) {
            return Check::No;
        }
        // `authenticated = false`: only requests without a user.
        if self.authenticated == Some(false) {
            return if req.user.is_none() { Check::Yes } else { Check::No };
        }
        let needs_user = !self.users.is_empty() || !self.groups.is_empty() || self.authenticated == Some(true);
        if !needs_user {
            return Check::Yes;
        }
        let Some(user) = req.user else {
            return Check::NeedAuth;
        };
        let user_ok = self.users.is_empty() || self.users.iter().any(|u| **u == *user.name);
        let group_ok = self.groups.is_empty() || user.groups.iter().any(|g| self.groups.iter().any(|x| **x == **g));
        if user_ok && group_ok { Check::Yes } else { Check::No }
    }

    /// The decision this entry gives when it matches.
    pub(super) fn decision(&self, id: usize) -> super::Decision {
        match self.action {
            AclAction::Allow => super::Decision::Allow { entry: Some(id) },
            AclAction::Deny => super::Decision::Deny {
                entry: Some(id),
                status: self.status,
                reason: self.reason.clone(),
            },
        }
    }
}

/// The largest `[[acl_list]]` file read: a list of 1,000,000 domains is
/// about 20 MB, so this leaves room for fifty of those, while a file name
/// that points at something endless (`/dev/zero`, a growing log) fails
/// start-up with a clear error instead of exhausting memory.
const MAX_LIST_FILE: u64 = 1 << 30;

/// Reads a list file whole: a regular file of at most [`MAX_LIST_FILE`]
/// bytes, the error in plain words otherwise.
fn read_list_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    crate::util::read_config_file(path, MAX_LIST_FILE)
}
