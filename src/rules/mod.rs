//! The routing rules engine (`[[rule]]`; the Sun Java System Web Proxy Server 4's assign-name).
//!
//! Rules are kept in config order; the first rule whose matchers all hold
//! wins, and a rule with `continue = true` adds its actions and lets the
//! next rules match too. [`Rules::compile`] turns the config into one
//! matcher at load time (`compile.rs`): each rule is filed under one
//! *index key* (an exact host, a wildcard host suffix, a path prefix, a
//! literal its regex needs, or the shared `RegexSet`), chosen so that few
//! rules share a key. A request looks each key up once (`matcher.rs`), which
//! yields the few candidate rules whose index key holds, and only those are
//! checked in full, lowest index first. So the cost of a request does not
//! grow with the number of rules, unlike the Sun proxy's one-regex-per-rule scan.
//!
//! Compilation is a pure function of the config (a reload builds a new
//! [`Rules`]); matching allocates only the small result.

mod actions;
mod compile;
mod explain;
mod matcher;

pub use actions::Bandwidth;
pub(crate) use actions::{HeaderEdits, Redirect};
pub(crate) use compile::{HeaderCond, header_cond, valid_host_pattern};
pub(crate) use compile::{PathSeg, RuleError, methods, schemes};
pub use explain::{Probe, explain};
pub(crate) use explain::{mode_name, parse_headers, tunnel_target};
pub(crate) use matcher::{canonical, header_holds};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use std::net::IpAddr;
use std::sync::Arc;

/// What the rules look at: one request, as the listener understood it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The request method.
    pub method: &'a Method,
    /// `http` or `https` (the absolute URI's scheme; `http` for origin-form).
    pub scheme: &'a str,
    /// Host, lower-case, without port or trailing dot; an IP address in
    /// its canonical spelling ([`crate::util::canonical_host`]).
    pub host: &'a str,
    /// The URL's port: explicit, else 80 (http) or 443 (https).
    pub port: u16,
    /// Path and query, origin-form (`/a/b?x=1`), as received.
    pub path_and_query: &'a str,
    /// The client's address.
    pub client: IpAddr,
    /// The request's header fields.
    pub headers: &'a HeaderMap,
    /// The mode of the listener that received it.
    pub mode: crate::config::Mode,
}

/// Why a CONNECT that a `redirect` rule matches is refused: a tunnel's
/// answer is a 2xx or an error, never a redirect a client would follow.
pub(crate) const REDIRECT_REFUSED_FOR_CONNECT: &str =
    "a routing rule redirects this request, but a CONNECT tunnel cannot be redirected";

impl<'a> Request<'a> {
    /// The request the rules see for a `CONNECT host:port`: method
    /// `CONNECT`, no scheme and an empty path, so that only `host`, `port`,
    /// `method`, `client`, `mode` and `header` matchers can hold. `host`
    /// must already be in [`tunnel_host`] form. The server and
    /// `portico rules test` both build it here, so they cannot disagree.
    pub fn tunnel(
        host: &'a str,
        port: u16,
        client: IpAddr,
        headers: &'a HeaderMap,
        mode: crate::config::Mode,
    ) -> Request<'a> {
        Request {
            method: &Method::CONNECT,
            scheme: "",
            host,
            port,
            path_and_query: "",
            client,
            headers,
            mode,
        }
    }
}

/// A CONNECT or SOCKS target's host as the rules and the `[[acl]]`
/// entries compare it: lower-case, without a trailing dot, an IP address
/// in its canonical spelling (like [`Request::host`] of an HTTP request,
/// [`crate::util::canonical_host`]).
pub(crate) fn tunnel_host(host: &str) -> String {
    crate::util::canonical_host(host)
}

impl Request<'_> {
    /// The path: `path_and_query` up to the `?`.
    pub fn path(&self) -> &str {
        self.path_and_query.split('?').next().unwrap_or("/")
    }
}

/// The outcome of routing one request: which rules matched and the actions
/// they add up to. Later matching rules (after a `continue`) override the
/// single-valued actions of earlier ones; header edits and rewrites apply
/// in rule order.
#[derive(Debug, Clone, Default)]
pub struct Route {
    /// Indexes of the rules that matched, in order; the last one stopped the
    /// search unless every one had `continue = true`.
    pub matched: Vec<usize>,
    /// Upstream group (index into `[[upstream]]`), if a rule chose one.
    pub upstream: Option<usize>,
    /// The path and query to send, when a rewrite changed it.
    pub path_and_query: Option<String>,
    /// Request header edits, in the order to apply them.
    pub request_headers: Vec<Arc<HeaderEdits>>,
    /// Response header edits, in the order to apply them.
    pub response_headers: Vec<Arc<HeaderEdits>>,
    /// The rule whose `cache = {...}` overrides apply (its index).
    pub cache_rule: Option<usize>,
    /// Performance bucket name (`bucket = "..."`).
    pub bucket: Option<Arc<str>>,
    /// Body for a 503 busy response on this route (`busy_body = "..."`).
    pub busy_body: Option<Bytes>,
    /// Refuse the request with this status (`deny = 403`).
    pub deny: Option<StatusCode>,
    /// Answer with this redirect.
    pub redirect: Option<Redirect>,
    /// `parent_credentials = "pass"`: the client's `Proxy-Authorization`
    /// goes on to the parent group the request is sent to (never to an origin).
    pub pass_credentials: bool,
    /// The response's own bandwidth limit (`bandwidth = "..."`).
    pub bandwidth: Option<Bandwidth>,
    /// The route's request rate per client (`request_rate = N`).
    pub request_rate: Option<Arc<crate::client_rate::RouteRate>>,
    /// The route's request rate for all clients together
    /// (`total_request_rate = N`).
    pub total_request_rate: Option<Arc<crate::client_rate::RouteRate>>,
}

impl Route {
    /// Counts the request from `ip` against the route's request rates
    /// (`request_rate`, `total_request_rate`).
    pub(crate) fn check_rates(&self, ip: std::net::IpAddr) -> Result<(), crate::client_rate::RouteRefusal> {
        crate::client_rate::check_route(self.request_rate.as_deref(), self.total_request_rate.as_deref(), ip)
    }

    /// [`Route::check_rates`] that takes nothing.
    pub(crate) fn check_rates_ahead(&self, ip: std::net::IpAddr) -> Result<(), crate::client_rate::RouteRefusal> {
        crate::client_rate::check_route_ahead(self.request_rate.as_deref(), self.total_request_rate.as_deref(), ip)
    }
}

/// The compiled `[[rule]]` list (cheap to clone: shared).
#[derive(Debug, Default, Clone)]
pub struct Rules {
    inner: Arc<Compiled>,
}

impl Rules {
    /// Puts the routes' `total_request_rate` buckets in force: at a reload
    /// (`fill`), those of a rule list compiled anew start full (filled once,
    /// by the first worker process to put that list in force); at start,
    /// they are as the buckets the worker processes share hold them (full
    /// when the server starts; as the other workers left them when a
    /// worker is restarted). Rules already in force are left as they are.
    pub(crate) fn activate(&self, fill: bool) {
        for r in &self.inner.rules {
            if let Some(Some(total)) = &r.actions.total_request_rate {
                total.activate(fill);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Compiled {
    rules: Vec<compile::Rule>,
    index: matcher::Index,
    /// Some rule has `parent_credentials = "pass"`: only then does a request
    /// keep a copy of its `Proxy-Authorization` past the credential step.
    passes_credentials: bool,
}

impl Rules {
    /// Number of rules.
    pub fn len(&self) -> usize {
        self.inner.rules.len()
    }

    /// True when there are no rules.
    pub fn is_empty(&self) -> bool {
        self.inner.rules.is_empty()
    }

    /// True when some rule passes the client's credentials to a parent.
    pub fn passes_credentials(&self) -> bool {
        self.inner.passes_credentials
    }

    /// Routes one request: the rules that match and their actions.
    pub fn route(&self, req: &Request<'_>) -> Route {
        let mut route = Route::default();
        if self.inner.rules.is_empty() {
            return route;
        }
        thread_local! {
            // Reused per thread: routing allocates only its result.
            static CANDIDATES: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut rewritten: Option<String> = None;
        CANDIDATES.with_borrow_mut(|candidates| {
            self.inner.index.candidates(req, candidates);
            for &id in candidates.iter() {
                let rule = &self.inner.rules[id as usize];
                if !rule.matches(req) {
                    continue;
                }
                route.matched.push(id as usize);
                rule.actions
                    .add_to(&mut route, &mut rewritten, req, rule.regex.as_ref(), id as usize);
                if !rule.actions.continue_ {
                    break;
                }
            }
        });
        route.path_and_query = rewritten;
        route
    }

    /// The matchers of rule `i` as config text (`host = "a", path = "/x/"`).
    pub fn describe_matchers(&self, i: usize) -> String {
        self.inner.rules.get(i).map_or_else(String::new, |r| r.describe.clone())
    }

    /// Which index key rule `i` is filed under (for `portico rules test`).
    pub fn index_key(&self, i: usize) -> String {
        self.inner
            .rules
            .get(i)
            .map_or_else(String::new, |r| r.primary.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_str;

    const UPSTREAMS: &str = "[[upstream]]\nname = \"a\"\nservers = [\"127.0.0.1:1\"]\n\n[[upstream]]\nname = \"b\"\nservers = [\"127.0.0.1:2\"]\n\n";

    fn rules(text: &str) -> Rules {
        let c = parse_str(&format!("{UPSTREAMS}{text}"), "t.toml").unwrap_or_else(|e| panic!("{e}"));
        Rules::compile(&c).unwrap_or_else(|e| panic!("{e}"))
    }

    fn get<'a>(host: &'a str, pq: &'a str, headers: &'a HeaderMap) -> Request<'a> {
        static GET: Method = Method::GET;
        Request {
            method: &GET,
            scheme: "http",
            host,
            port: 80,
            path_and_query: pq,
            client: "127.0.0.1".parse().unwrap(),
            headers,
            mode: crate::config::Mode::Reverse,
        }
    }

    #[test]
    fn first_match_wins_across_index_kinds() {
        let r = rules(
            r#"
[[rule]]
host = "www.example.com"
path = "/api/"
upstream = "a"
[[rule]]
host = "www.example.com"
upstream = "b"
[[rule]]
host = "*.example.org"
upstream = "a"
[[rule]]
path = "/static/"
upstream = "b"
[[rule]]
regex = "\\.jpg$"
upstream = "a"
[[rule]]
regex = "^/(x|y)+z"
upstream = "b"
"#,
        );
        let h = HeaderMap::new();
        let m = |host, pq| r.route(&get(host, pq, &h)).matched;
        assert_eq!(m("www.example.com", "/api/v1"), [0]);
        assert_eq!(m("www.example.com", "/other"), [1]);
        assert_eq!(m("a.b.example.org", "/"), [2]);
        assert!(m("example.org", "/").is_empty());
        assert_eq!(m("else.net", "/static/x.jpg"), [3]);
        assert_eq!(m("else.net", "/img/x.jpg"), [4]);
        assert!(m("else.net", "/img/x.jpgs").is_empty());
        assert_eq!(m("else.net", "/xyxyz"), [5]);
    }

    #[test]
    fn continue_adds_actions_and_later_rules_override() {
        let r = rules(
            r#"
[[rule]]
continue = true
bucket = "all"
upstream = "a"
response_headers = { set = { X-One = "1" } }
[[rule]]
path = "/b/"
upstream = "b"
rewrite = { regex = "^/b/", to = "/" }
[[rule]]
upstream = "a"
"#,
        );
        let h = HeaderMap::new();
        let route = r.route(&get("h", "/b/c?d", &h));
        assert_eq!(route.matched, [0, 1]);
        assert_eq!(route.upstream, Some(1));
        assert_eq!(route.bucket.as_deref(), Some("all"));
        assert_eq!(route.path_and_query.as_deref(), Some("/c?d"));
        assert_eq!(route.response_headers.len(), 1);
        let route = r.route(&get("h", "/x", &h));
        assert_eq!(route.matched, [0, 2]);
        assert_eq!(route.path_and_query, None);
    }

    #[test]
    fn literals_are_extracted_from_prefix_or_suffix() {
        assert_eq!(matcher_literals("^/r12/"), Some(vec![b"/r12/".to_vec()]));
        assert_eq!(matcher_literals("[a-z]+\\.jpg$"), Some(vec![b".jpg".to_vec()]));
        assert_eq!(matcher_literals(".*"), None);
        assert_eq!(matcher_literals("^/"), None, "one byte is no filter");
        assert_eq!(matcher::required_literals("^/a").map(|l| l.1), Some(true), "anchored");
        assert_eq!(matcher::required_literals("/a").map(|l| l.1), Some(false));
        assert_eq!(matcher::required_literals("(?m)^/a").map(|l| l.1), Some(false));
    }

    fn matcher_literals(p: &str) -> Option<Vec<Vec<u8>>> {
        matcher::required_literals(p).map(|l| l.0)
    }

    #[test]
    fn crowded_literals_go_to_the_regex_set_and_still_match_in_order() {
        let mut text = String::new();
        for i in 0..100 {
            text += &format!("[[rule]]\nregex = \"^/shared/[0-9]+/{i}$\"\nupstream = \"a\"\n");
        }
        let r = rules(&text);
        assert!(r.inner.rules.iter().all(|x| x.primary == matcher::Primary::Set));
        let h = HeaderMap::new();
        assert_eq!(r.route(&get("h", "/shared/123/57", &h)).matched, [57]);
        assert!(r.route(&get("h", "/shared/1/570", &h)).matched.is_empty());
    }

    #[test]
    fn many_rules_match_the_last_one() {
        let mut text = String::new();
        for i in 0..2000 {
            if i % 2 == 0 {
                text += &format!("[[rule]]\npath = \"/r{i:04}/\"\nupstream = \"a\"\n");
            } else {
                text += &format!("[[rule]]\nregex = \"^/r{i:04}/\"\nupstream = \"b\"\n");
            }
        }
        let r = rules(&text);
        let h = HeaderMap::new();
        assert_eq!(r.route(&get("h", "/r1999/x", &h)).matched, [1999]);
        assert_eq!(r.route(&get("h", "/r1998/x", &h)).matched, [1998]);
        assert!(r.route(&get("h", "/r2000/x", &h)).matched.is_empty());
    }

    #[test]
    fn other_matchers_checked_on_candidates() {
        let r = rules(
            r#"
[[rule]]
method = ["POST", "PUT"]
deny = 405
[[rule]]
client = "10.0.0.0/8"
deny = 403
[[rule]]
header = [{ name = "X-Beta" }, { name = "Cookie", regex = "beta=1" }]
upstream = "b"
[[rule]]
port = 8080
scheme = "http"
mode = ["reverse", "transparent"]
upstream = "a"
"#,
        );
        let mut h = HeaderMap::new();
        let mut req = get("h", "/", &h);
        assert!(r.route(&req).matched.is_empty());
        req.port = 8080;
        assert_eq!(r.route(&req).matched, [3]);
        req.mode = crate::config::Mode::Forward;
        assert!(r.route(&req).matched.is_empty());
        req.mode = crate::config::Mode::Transparent;
        assert_eq!(r.route(&req).matched, [3]);
        req.client = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(r.route(&req).deny, Some(StatusCode::FORBIDDEN));
        static POST: Method = Method::POST;
        req.method = &POST;
        assert_eq!(r.route(&req).matched, [0]);
        h.insert("x-beta", "yes".parse().unwrap());
        h.insert("cookie", "a=2; beta=1".parse().unwrap());
        let req = get("h", "/", &h);
        assert_eq!(r.route(&req).matched, [2]);
    }

    #[test]
    fn redirect_expands_captures() {
        let r = rules(
            r#"
[[rule]]
regex = "^/old/(?P<rest>.*)$"
redirect = { to = "https://new.test/${rest}", status = 301 }
"#,
        );
        let h = HeaderMap::new();
        let route = r.route(&get("h", "/old/a/b?c=1", &h));
        assert_eq!(
            route.redirect,
            Some(Redirect {
                status: StatusCode::MOVED_PERMANENTLY,
                location: "https://new.test/a/b?c=1".into()
            })
        );
    }

    #[test]
    fn errors_name_the_rule_and_key() {
        let bad = |text: &str| {
            let c = parse_str(&format!("{UPSTREAMS}{text}"), "t.toml").unwrap_err();
            c.to_string()
        };
        let e = bad("[[rule]]\nupstream = \"a\"\n\n[[rule]]\nregex = \"(unclosed\"\n");
        assert!(
            e.starts_with("t.toml:13: key `rule[1].regex`: invalid regular expression"),
            "{e}"
        );
        let e = bad("[[rule]]\nheader = { name = \"X\", regex = \"[\" }\n");
        assert!(e.contains("key `rule[0].header[0].regex`"), "{e}");
        let e = bad("[[rule]]\ndeny = 200\n");
        assert!(e.contains("key `rule[0].deny`"), "{e}");
        let e = bad("[[rule]]\ndeny = 403\ncontinue = true\n");
        assert!(e.contains("cannot go on"), "{e}");
        let e = bad("[[rule]]\nrequest_headers = { set = { Host = \"x\" } }\n");
        assert!(e.contains("managed by Portico"), "{e}");
        let e = bad("[[rule]]\nrewrite = { to = \"/x\" }\n");
        assert!(e.contains("rewrite needs a `regex`"), "{e}");
    }

    #[test]
    fn every_rule_key_survives_print_config() {
        let text = format!(
            "{UPSTREAMS}{}",
            r#"
[[rule]]
host = "*.a.test"
path = "/p/"
regex = "^/p/(.*)"
method = "GET"
scheme = ["http", "https"]
port = 8080
client = "10.0.0.0/8"
mode = "reverse"
header = [{ name = "X-A" }, { name = "X-B", value = "1" }, { name = "X-C", regex = "^a" }]
continue = true
upstream = "a"
rewrite = { to = "/q/$1" }
request_headers = { set = { X-Set = "1" }, remove = ["Cookie"] }
response_headers = { remove = ["Server"] }
cache = { min_ttl = "1m" }
bucket = "b"
busy_body = "busy"
bandwidth = "1MiB"
bandwidth_after = "4MiB"

[[rule]]
redirect = { to = "/x" }
"#
        );
        let c = parse_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        let printed = c.to_toml();
        let again = parse_str(&printed, "printed").unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(again.to_toml(), printed);
        assert_eq!(again.rule[0].header.len(), 3);
        assert!(again.rule[0].continue_);
        assert_eq!(again.rule[1].redirect.as_ref().map(|r| r.status), Some(302));
        assert_eq!(again.rule[0].bandwidth.map(|b| b.bytes()), Some(1 << 20));
        assert_eq!(again.rule[0].bandwidth_after.map(|b| b.bytes()), Some(4 << 20));
    }

    #[test]
    fn a_later_matching_rules_bandwidth_wins_and_zero_lifts_it() {
        let r = rules(
            r#"
[[rule]]
continue = true
bandwidth = "64KiB"
bandwidth_after = "1MiB"
[[rule]]
path = "/fast/"
continue = true
bandwidth = "0B"
[[rule]]
path = "/slow/"
bandwidth = "8KiB"
[[rule]]
upstream = "a"
"#,
        );
        let h = HeaderMap::new();
        let rate = |pq| r.route(&get("x", pq, &h)).bandwidth.map(|b| (b.rate, b.after));
        assert_eq!(rate("/"), Some((64 << 10, 1 << 20)));
        assert_eq!(rate("/fast/f"), Some((0, 0)));
        assert_eq!(rate("/slow/s"), Some((8 << 10, 0)));
    }

    #[test]
    fn a_later_matching_rules_request_rate_wins_and_zero_lifts_it() {
        let r = rules(
            r#"
[[rule]]
continue = true
request_rate = 10
request_burst = 20
[[rule]]
path = "/open/"
continue = true
request_rate = 0
[[rule]]
path = "/login"
request_rate = 1
[[rule]]
upstream = "a"
"#,
        );
        let h = HeaderMap::new();
        let rate = |pq| r.route(&get("x", pq, &h)).request_rate.map(|r| (r.rate(), r.burst()));
        assert_eq!(rate("/"), Some((10.0, 20.0)));
        assert_eq!(rate("/open/x"), None);
        assert_eq!(rate("/login"), Some((1.0, 1.0)));
        // One rule's buckets, whichever request reaches them.
        let a = r.route(&get("x", "/a", &h)).request_rate.expect("rate");
        let b = r.route(&get("x", "/b", &h)).request_rate.expect("rate");
        assert!(Arc::ptr_eq(&a, &b));
    }

    const PARENTS: &str = "[[listener]]\naddress = \"127.0.0.1:1\"\nmode = \"forward\"\n\n[[upstream]]\nname = \"origins\"\nservers = [\"127.0.0.1:3\"]\n\n[[upstream]]\nname = \"parents\"\nparent = true\nservers = [\"127.0.0.1:4\", \"proxy2.test:3128\"]\n\n[[rule]]\nhost = \"*.via.test\"\nupstream = \"parents\"\n";

    #[test]
    fn parent_groups_parse_print_and_validate() {
        let c = parse_str(PARENTS, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.upstream[0].parent);
        assert!(c.upstream[1].parent);
        let printed = c.to_toml();
        assert!(printed.contains("parent = true"), "{printed}");
        let again = parse_str(&printed, "printed").unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert!(again.upstream[1].parent);
        // Parents are reached over plain TCP or TLS; any other scheme is named.
        let tls = parse_str(&PARENTS.replace("proxy2.test:3128", "https://proxy2.test"), "t.toml");
        assert!(tls.is_ok(), "{:?}", tls.err());
        let e = parse_str(&PARENTS.replace("proxy2.test:3128", "ftp://proxy2.test"), "t.toml").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("upstream[1].servers[1]"), "{e}");
        let e = parse_str(
            &PARENTS.replace("parent = true", "parent = true\nhost_header = \"rewrite\""),
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("upstream[1].host_header"), "{e}");
        let e = parse_str(&PARENTS.replace("parent = true", "parent = \"yes\""), "t.toml").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("upstream[1].parent"), "{e}");
    }

    #[test]
    fn explain_names_the_parent_and_the_absolute_form() {
        let c = parse_str(PARENTS, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        let probe = |url: &str| Probe {
            url: url.into(),
            method: "GET".into(),
            client: "127.0.0.1".parse().unwrap(),
            headers: Vec::new(),
            mode: None,
        };
        let out = explain(&c, "t.toml", &[], &probe("http://www.via.test:8080/a?b")).unwrap();
        assert!(
            out.contains(
                "upstream: parents (parent proxies: 127.0.0.1:4, proxy2.test:3128): GET http://www.via.test:8080/a?b in absolute form"
            ),
            "{out}"
        );
        let out = explain(&c, "t.toml", &[], &probe("https://www.via.test/a")).unwrap();
        assert!(
            out.contains("CONNECT www.via.test:443 through the parent, then TLS"),
            "{out}"
        );
        let out = explain(&c, "t.toml", &[], &probe("http://other.test/a")).unwrap();
        assert!(out.contains("no rule matched"), "{out}");
    }

    #[test]
    fn connect_requests_match_host_and_port_but_not_path_or_scheme() {
        let r = rules(
            r#"
[[rule]]
path = "/"
upstream = "a"
[[rule]]
scheme = "https"
upstream = "a"
[[rule]]
host = "x.test"
port = 443
upstream = "b"
"#,
        );
        let h = HeaderMap::new();
        // What `ListenerHandler::tunnel_parent` asks for a CONNECT.
        let connect = |host, port| Request {
            method: &Method::CONNECT,
            scheme: "",
            host,
            port,
            path_and_query: "",
            client: "127.0.0.1".parse().unwrap(),
            headers: &h,
            mode: crate::config::Mode::Forward,
        };
        assert_eq!(r.route(&connect("x.test", 443)).matched, [2]);
        assert!(r.route(&connect("x.test", 8443)).matched.is_empty());
    }
}
