//! What a matching rule does: the compiled actions and how they add up
//! into a [`Route`].

use super::{Request, Route};
use bytes::Bytes;
use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use regex::Regex;
use std::sync::Arc;

/// Header fields to remove, then to set (replacing any of the same name).
#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    /// Removed first.
    pub remove: Vec<HeaderName>,
    /// Then set.
    pub set: Vec<(HeaderName, HeaderValue)>,
}

impl HeaderEdits {
    /// Applies the edits to `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
    }

    /// `set X: v; remove Y` for people.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.remove.iter().map(|n| format!("remove {n}")).collect();
        parts.extend(
            self.set
                .iter()
                .map(|(n, v)| format!("set {n}: {}", String::from_utf8_lossy(v.as_bytes()))),
        );
        parts.join("; ")
    }
}

/// A redirect to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// 301, 302, 303, 307 or 308.
    pub status: StatusCode,
    /// The `Location`, captures expanded.
    pub location: String,
}

/// A compiled `rewrite = { regex, to }`.
#[derive(Debug)]
pub(super) struct Rewrite {
    pub regex: Regex,
    pub to: String,
}

/// A rule's compiled actions.
#[derive(Debug, Default)]
pub(super) struct Actions {
    pub continue_: bool,
    pub upstream: Option<usize>,
    pub rewrite: Option<Rewrite>,
    pub request_headers: Option<Arc<HeaderEdits>>,
    pub response_headers: Option<Arc<HeaderEdits>>,
    pub cache: bool,
    pub bucket: Option<Arc<str>>,
    pub busy_body: Option<Bytes>,
    pub deny: Option<StatusCode>,
    pub redirect: Option<(StatusCode, String)>,
    /// `parent_credentials`: Some(true) = pass, Some(false) = strip.
    pub pass_credentials: Option<bool>,
    /// `bandwidth` (and `bandwidth_after`).
    pub bandwidth: Option<Bandwidth>,
    /// `request_rate` (and `request_burst`): Some(None) lifts an earlier
    /// rule's.
    pub request_rate: Option<Option<Arc<crate::client_rate::RouteRate>>>,
    /// `total_request_rate` (and `total_request_burst`): Some(None)
    /// lifts an earlier rule's.
    pub total_request_rate: Option<Option<Arc<crate::client_rate::RouteRate>>>,
}

/// A route's `bandwidth`: each response to it is sent at `rate` bytes a
/// second at most, but for its first `after` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bandwidth {
    /// Bytes a second; 0: no limit (a later rule lifting an earlier one's).
    pub rate: u64,
    /// Bytes sent at full speed first (`bandwidth_after`).
    pub after: u64,
}

impl Actions {
    /// Adds these actions (of rule `id`) to `route`. `rewritten` is the
    /// path and query as earlier rewrites left it; `regex` is the rule's
    /// own `regex` matcher, whose captures a redirect may use.
    pub fn add_to(
        &self,
        route: &mut Route,
        rewritten: &mut Option<String>,
        req: &Request<'_>,
        regex: Option<&Regex>,
        id: usize,
    ) {
        if let Some(u) = self.upstream {
            route.upstream = Some(u);
        }
        if let Some(rw) = &self.rewrite {
            let current = rewritten.as_deref().unwrap_or(req.path_and_query);
            if let std::borrow::Cow::Owned(new) = rw.regex.replace(current, rw.to.as_str()) {
                *rewritten = Some(new);
            }
        }
        if let Some(e) = &self.request_headers {
            route.request_headers.push(Arc::clone(e));
        }
        if let Some(e) = &self.response_headers {
            route.response_headers.push(Arc::clone(e));
        }
        if self.cache {
            route.cache_rule = Some(id);
        }
        if let Some(b) = &self.bucket {
            route.bucket = Some(Arc::clone(b));
        }
        if let Some(b) = &self.busy_body {
            route.busy_body = Some(b.clone());
        }
        if let Some(d) = self.deny {
            route.deny = Some(d);
        }
        if let Some(p) = self.pass_credentials {
            route.pass_credentials = p;
        }
        if let Some(b) = self.bandwidth {
            route.bandwidth = Some(b);
        }
        if let Some(r) = &self.request_rate {
            route.request_rate = r.clone();
        }
        if let Some(r) = &self.total_request_rate {
            route.total_request_rate = r.clone();
        }
        if let Some((status, to)) = &self.redirect {
            let location = match regex.and_then(|re| re.captures(req.path_and_query)) {
                Some(caps) => {
                    let mut out = String::new();
                    caps.expand(to, &mut out);
                    out
                }
                None => to.clone(),
            };
            route.redirect = Some(Redirect {
                status: *status,
                location,
            });
        }
    }
}
