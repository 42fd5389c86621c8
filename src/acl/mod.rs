//! Access control lists (`[[acl]]`): ordered `allow` / `deny` entries,
//! the first whose matchers all hold deciding, as Squid's `http_access`
//! lines and the Sun Java System Web Proxy's ACL files do.
//!
//! [`Acl::compile`] turns the config into one matcher at load time
//! (`compile.rs`), like the routing rules engine (`crate::rules`): each
//! entry is filed under its exact hosts, its `*.domain` suffixes, or (when
//! it names no host) the list checked for every request. A request looks
//! its host up once per kind of key, which yields the few candidate
//! entries, and only those are checked in full, lowest index first. So
//! 10,000 entries cost about what 10 do (benches/acl.rs).
//!
//! [`Acl::decide`] is pure: the request, the user (when an authentication
//! back-end found one) and the clock are parameters, so the server and
//! `portico acl test` take the same path and the tests can fix the time.

mod compile;
mod explain;
mod lists;
mod mime;
mod path;

pub use explain::{Probe, explain};
pub use mime::{MediaTypes, ReplyDenied, ReplyFilter};

use crate::config::{AclAction, Mode};
use http::{HeaderMap, Method, StatusCode};
use std::net::IpAddr;
use std::sync::Arc;

/// The reason on a deny page when the entry gives none: the wording of
/// the Sun proxy (and Smart Cache) for a refused request.
pub(crate) const DEFAULT_REASON: &str = "Cache access denied";

/// The time the server decides requests at: the system clock. Debug
/// builds (the integration tests' binary) read `PORTICO_TEST_NOW` (an RFC
/// 3339 instant, `2026-11-24T09:00:00Z`) once instead, so time-of-day
/// entries can be tested through the real server at a fixed time; release
/// builds never look at it.
pub(crate) fn now() -> jiff::Timestamp {
    #[cfg(debug_assertions)]
    {
        static FIXED: std::sync::OnceLock<Option<jiff::Timestamp>> = std::sync::OnceLock::new();
        let fixed = FIXED.get_or_init(|| std::env::var("PORTICO_TEST_NOW").ok().and_then(|t| t.parse().ok()));
        if let Some(t) = fixed {
            return *t;
        }
    }
    jiff::Timestamp::now()
}

/// An authenticated user, as an authentication back-end vouches for it.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    /// The user name.
    pub name: &'a str,
    /// The groups the user belongs to.
    pub groups: &'a [String],
}

/// What the ACL entries look at: one request, as the listener understood it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The client's address.
    pub client: IpAddr,
    /// The request method.
    pub method: &'a Method,
    /// `http` or `https`; empty for a CONNECT.
    pub scheme: &'a str,
    /// Host, lower-case, without port or trailing dot; an IP address in
    /// its canonical spelling ([`crate::util::canonical_host`]).
    pub host: &'a str,
    /// The URL's port (explicit, else by scheme), or the CONNECT target's.
    pub port: u16,
    /// Path and query (`/a/b?x=1`); empty for a CONNECT.
    pub path_and_query: &'a str,
    /// The request's header fields.
    pub headers: &'a HeaderMap,
    /// The mode of the listener that received it.
    pub mode: Mode,
    /// The authenticated user, if any.
    pub user: Option<Identity<'a>>,
}

impl<'a> Request<'a> {
    /// The request the entries see for a `CONNECT host:port`: method
    /// CONNECT, no scheme, empty path (as [`crate::rules::Request::tunnel`]),
    /// so entries with `scheme`, `path` or `regex` never match it. `host`
    /// must be in [`crate::rules::tunnel_host`] form. The server and
    /// `portico acl test` both build it here.
    pub fn tunnel(
        host: &'a str,
        port: u16,
        client: IpAddr,
        headers: &'a HeaderMap,
        mode: Mode,
        user: Option<Identity<'a>>,
    ) -> Request<'a> {
        Request {
            client,
            method: &Method::CONNECT,
            scheme: "",
            host,
            port,
            path_and_query: "",
            headers,
            mode,
            user,
        }
    }

    /// True for a CONNECT (no URL path or scheme to match).
    pub fn is_tunnel(&self) -> bool {
        *self.method == Method::CONNECT
    }

    /// `f` of this request as the entries and lists match it: its path
    /// normalised (`path.rs`: percent-encoded unreserved characters
    /// decoded, runs of `/` merged, dot-segments removed), so that no
    /// other spelling of a path the origin resolves the same way passes an
    /// entry. Done once per request, here, for every way into the entries.
    fn normalised<R>(&self, f: impl FnOnce(&Request<'_>) -> R) -> R {
        match path::normalize_path_and_query(self.path_and_query) {
            std::borrow::Cow::Borrowed(_) => f(self),
            std::borrow::Cow::Owned(pq) => f(&Request {
                path_and_query: &pq,
                ..*self
            }),
        }
    }
}

/// The verdict on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Let it through; `entry` is the deciding entry, None for the default.
    Allow {
        /// Index of the deciding `[[acl]]` entry; None for the default, and
        /// for a path whose two readings (`;`, `\`) are allowed by entries
        /// granting different `allow_destinations` (so it gets neither).
        entry: Option<usize>,
    },
    /// Refuse it with `status` and a page showing `reason`.
    Deny {
        /// Index of the deciding `[[acl]]` entry; None for the default.
        entry: Option<usize>,
        /// The status to answer with (400..=599).
        status: StatusCode,
        /// The text of the deny page.
        reason: Arc<str>,
    },
    /// Entry `entry` names users or groups (or `authenticated = true`),
    /// its other matchers hold, and the request has no authenticated user:
    /// as in Squid, the client must authenticate before that entry (and so
    /// the request) can be decided.
    NeedAuth {
        /// Index of the `[[acl]]` entry that needs a user.
        entry: usize,
    },
}

/// The compiled `[[acl]]` list and `[access]` ACL settings (cheap to clone).
#[derive(Debug, Clone)]
pub struct Acl {
    inner: Arc<Compiled>,
}

/// The host tables are keyed by the xxh3 hash of the name, not the name:
/// one hash of the bytes and no string compare per lookup (SipHash over the
/// name was a third of a decision's time). A collision only adds a
/// candidate, which its own `host` matcher then rejects.
type HostTable = crate::util::PreHashedMap<u64, Vec<u32>>;

/// The hash of a host or suffix as the tables key it.
fn host_key(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

#[derive(Debug)]
struct Compiled {
    entries: Vec<compile::Entry>,
    /// Entries by exact host.
    exact: HostTable,
    /// Entries by wildcard suffix (`.example.com`).
    suffix: HostTable,
    /// Entries without a host key (no `host`, or `*`): always candidates.
    rest: Vec<u32>,
    /// Response entries (`content_type`, `kind = "mime"` lists), in config
    /// order: never candidates for a request's decision (`mime.rs`).
    reply: Vec<u32>,
    /// The distinct `allow_destinations` sets (`Entry::reach` - 1 indexes
    /// it); empty when `[proxy] deny_destinations` refuses nothing.
    reach: Vec<Vec<ipnet::IpNet>>,
    default: AclAction,
    zone: jiff::tz::TimeZone,
    zone_name: String,
}

/// The local time an entry's `time` and `days` are read in, computed once
/// per request and only if an entry asks.
#[derive(Debug, Clone, Copy)]
struct Local {
    /// Minutes since local midnight.
    minute: u16,
    /// Monday = 0 .. Sunday = 6.
    weekday: u8,
}

/// Whether an entry holds for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    No,
    Yes,
    NeedAuth,
}

impl Acl {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.inner.entries.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.inner.entries.is_empty()
    }

    /// The IANA name of the zone `time` and `days` are read in.
    pub fn zone(&self) -> &jiff::tz::TimeZone {
        &self.inner.zone
    }

    /// The zone's name, as configured.
    pub fn zone_name(&self) -> &str {
        &self.inner.zone_name
    }

    /// Decides `req` at time `now`: the first entry whose matchers all
    /// hold, else `[access] acl_default`.
    pub fn decide(&self, req: &Request<'_>, now: jiff::Timestamp) -> Decision {
        self.decide_with(req, || now)
    }

    /// [`Acl::decide`] at the current time ([`now`]), read only when an
    /// entry with `time` or `days` is reached: the server's per-request
    /// call, which pays no clock read for ACLs without time windows.
    pub fn decide_now(&self, req: &Request<'_>) -> Decision {
        self.decide_with(req, now)
    }

    /// The decisions under each reading of the path: nginx's, and when the
    /// path holds `;` or `\`, Tomcat's or IIS's (`path::servlet_reading`).
    fn readings(&self, req: &Request<'_>, now: &impl Fn() -> jiff::Timestamp) -> (Decision, Option<Decision>) {
        let plain = req.normalised(|req| self.decide_normalised(req, now));
        let other = path::servlet_reading(req.path_and_query).map(|other| {
            self.decide_normalised(
                &Request {
                    path_and_query: &other,
                    ..*req
                },
                now,
            )
        });
        (plain, other)
    }

    /// For `portico acl test`: the entries that allow `req` under its two
    /// readings of the path when they grant different `allow_destinations`
    /// (so the request is allowed with neither: [`Decision::Allow`] with no entry).
    pub fn disagreeing_reach(&self, req: &Request<'_>, now: jiff::Timestamp) -> Option<(usize, usize)> {
        match self.readings(req, &|| now) {
            (Decision::Allow { entry: Some(a) }, Some(Decision::Allow { entry: Some(b) }))
                if self.entry_reach(a) != self.entry_reach(b) =>
            {
                Some((a, b))
            }
            _ => None,
        }
    }

    fn decide_with(&self, req: &Request<'_>, now: impl Fn() -> jiff::Timestamp) -> Decision {
        let c = &*self.inner;
        if c.entries.is_empty() {
            return c.default_decision();
        }
        // A path with `;` or `\` means one thing to nginx and another to
        // Tomcat or IIS (`path::servlet_reading`), and the origin behind
        // is not known: the request goes through only if both readings
        // are allowed, and the stricter verdict answers otherwise.
        let (plain, other) = self.readings(req, &now);
        let Some(other) = other else {
            return plain;
        };
        match (&plain, &other) {
            // Both allowed: no destination exception unless both readings'
            // entries grant the same one (`/a/..;/b/x` is under /a/ to
            // nginx and is /b/x to Tomcat: neither entry's networks were
            // meant for the other path).
            (Decision::Allow { .. }, Decision::Allow { .. }) if self.reach(&other) == 0 => other,
            (Decision::Allow { .. }, Decision::Allow { .. }) if self.reach(&plain) != self.reach(&other) => {
                Decision::Allow { entry: None }
            }
            (Decision::Deny { .. }, _) | (_, Decision::Allow { .. }) => plain,
            (_, Decision::Deny { .. }) => other,
            (Decision::NeedAuth { .. }, _) => plain,
            (Decision::Allow { .. }, Decision::NeedAuth { .. }) => other,
        }
    }

    fn decide_normalised(&self, req: &Request<'_>, now: &impl Fn() -> jiff::Timestamp) -> Decision {
        let c = &*self.inner;
        thread_local! {
            // Reused per thread: deciding allocates nothing (but the
            // normalised path of a request whose path needs it).
            static CANDIDATES: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut local: Option<Local> = None;
        CANDIDATES.with_borrow_mut(|candidates| {
            c.candidates(req.host, candidates);
            for &id in candidates.iter() {
                let e = &c.entries[id as usize];
                match e.check(req, || *local.get_or_insert_with(|| c.local(now()))) {
                    Check::No => continue,
                    Check::NeedAuth => return Decision::NeedAuth { entry: id as usize },
                    Check::Yes => return e.decision(id as usize),
                }
            }
            c.default_decision()
        })
    }

    /// The destination exception a decision grants: `k` when its entry's
    /// `allow_destinations` is [`Acl::reach_sets`]`[k - 1]`, 0 when it
    /// grants none (a deny, the default, an entry without the key, or
    /// `[proxy] deny_destinations` refusing nothing).
    pub fn reach(&self, decision: &Decision) -> usize {
        match decision {
            Decision::Allow { entry: Some(i) } => self.entry_reach(*i),
            _ => 0,
        }
    }

    /// Entry `i`'s exception, as [`Acl::reach`] numbers them.
    fn entry_reach(&self, i: usize) -> usize {
        self.inner.entries.get(i).map_or(0, |e| e.reach as usize)
    }

    /// The distinct `allow_destinations` sets of the entries, in the order
    /// [`Acl::reach`] numbers them (from 1).
    pub fn reach_sets(&self) -> &[Vec<ipnet::IpNet>] {
        &self.inner.reach
    }

    /// For entry `i`'s `list` matcher: which list, file line and pattern
    /// match `req` (`list "blocked" (/etc/portico/blocked.txt:17: .example.com)`),
    /// for `portico acl test`. None when the entry has no list or none matches.
    pub fn list_hit(&self, i: usize, req: &Request<'_>) -> Option<String> {
        let e = self.inner.entries.get(i)?;
        req.normalised(|req| {
            e.lists.iter().find_map(|l| {
                l.hit(req)
                    .map(|h| format!("list {:?} ({}:{}: {})", l.name, l.file, h.line, h.pattern))
            })
        })
    }

    /// The matchers of entry `i` as config text (`host = ["a"], port = [443]`).
    pub fn describe(&self, i: usize) -> String {
        self.inner
            .entries
            .get(i)
            .map_or_else(String::new, |e| e.describe.clone())
    }
}

impl Compiled {
    fn default_decision(&self) -> Decision {
        match self.default {
            AclAction::Allow => Decision::Allow { entry: None },
            AclAction::Deny => Decision::Deny {
                entry: None,
                status: StatusCode::FORBIDDEN,
                reason: Arc::from(DEFAULT_REASON),
            },
        }
    }

    fn local(&self, now: jiff::Timestamp) -> Local {
        let t = self.zone.to_datetime(now);
        Local {
            minute: (t.hour() as u16) * 60 + t.minute() as u16,
            weekday: t.weekday().to_monday_zero_offset() as u8,
        }
    }

    /// Fills `out` with the entries that may match `host`, in config
    /// order, without duplicates.
    fn candidates(&self, host: &str, out: &mut Vec<u32>) {
        out.clear();
        out.extend_from_slice(&self.rest);
        let before = out.len();
        if !self.exact.is_empty()
            && let Some(list) = self.exact.get(&host_key(host))
        {
            out.extend_from_slice(list);
        }
        if !self.suffix.is_empty() {
            for (pos, &b) in host.as_bytes().iter().enumerate() {
                // `*.example.com` needs at least one label before the suffix.
                if b == b'.'
                    && pos > 0
                    && let Some(list) = self.suffix.get(&host_key(&host[pos..]))
                {
                    out.extend_from_slice(list);
                }
            }
        }
        if out.len() > before {
            out.sort_unstable();
            out.dedup();
        }
    }
}

#[cfg(test)]
mod tests;
