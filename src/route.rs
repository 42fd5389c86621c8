//! Classify and route: what kind of request this is (forward, CONNECT,
//! reverse, transparent) and where it goes.

use crate::config::{Mode, RuleConfig};
use crate::http1::RequestHead;
use http::{Method, StatusCode, Uri};

/// Where a request goes.
#[derive(Debug)]
pub enum Target {
    /// A CONNECT tunnel to `host:port`.
    Tunnel {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
    /// Straight to the origin named in the URI (forward and transparent proxying).
    Origin(Uri),
    /// To a server of upstream group `group`, with this path and query.
    Group {
        /// Index into the group list.
        group: usize,
        /// Index of the `[[rule]]` that matched.
        rule: usize,
        /// Origin-form target to send.
        path_and_query: String,
        /// The host the client asked for: the absolute target's authority
        /// (which replaces `Host`, RFC 9112 3.2.2) or the `Host` header.
        host: String,
    },
}

/// A request that cannot be routed: status and reason.
pub type Refusal = (StatusCode, &'static str);

/// How a host is matched by a rule.
#[derive(Debug, Clone)]
enum HostMatch {
    Any,
    Exact(String),
    /// `*.example.com`: stored as `.example.com`.
    Suffix(String),
}

#[derive(Debug, Clone)]
struct Rule {
    host: HostMatch,
    path: Option<String>,
    group: usize,
}

/// The reverse-proxy routes, in config order.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    /// Compiles the rules; `group_index` maps upstream names to indexes.
    pub fn new(rules: &[RuleConfig], group_index: impl Fn(&str) -> Option<usize>) -> Result<Rules, String> {
        let mut out = Vec::with_capacity(rules.len());
        for (i, r) in rules.iter().enumerate() {
            let group =
                group_index(&r.upstream).ok_or_else(|| format!("rule {i}: unknown upstream `{}`", r.upstream))?;
            let host = match r.host.as_deref().map(str::to_ascii_lowercase) {
                None => HostMatch::Any,
                Some(h) if h == "*" => HostMatch::Any,
                Some(h) => match h.strip_prefix('*') {
                    Some(suffix) => HostMatch::Suffix(suffix.to_string()),
                    None => HostMatch::Exact(h),
                },
            };
            out.push(Rule {
                host,
                path: r.path.clone(),
                group,
            });
        }
        Ok(Rules { rules: out })
    }

    /// The group and index of the first rule matching `host` (lower-case,
    /// no port) and `path`.
    pub fn find(&self, host: &str, path: &str) -> Option<(usize, usize)> {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, r)| {
                let host_ok = match &r.host {
                    HostMatch::Any => true,
                    HostMatch::Exact(h) => h == host,
                    HostMatch::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
                };
                host_ok && r.path.as_deref().is_none_or(|p| path.starts_with(p))
            })
            .map(|(i, r)| (r.group, i))
    }
}

/// The host part of a Host header value, lower-cased, without port.
fn host_only(authority: &str) -> String {
    let a = authority.trim();
    let host = if a.starts_with('[') {
        a.split_inclusive(']').next().unwrap_or(a)
    } else {
        a.rsplit_once(':').map_or(a, |(h, _)| h)
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Decides where the request goes, for a listener in `mode`.
pub fn classify(head: &RequestHead, mode: Mode, rules: &Rules) -> Result<Target, Refusal> {
    if head.method == Method::CONNECT {
        if mode != Mode::Forward {
            return Err((
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is only served on forward-proxy listeners",
            ));
        }
        let authority: http::uri::Authority = head
            .target
            .parse()
            .map_err(|_| (StatusCode::BAD_REQUEST, "CONNECT target must be host:port"))?;
        let port = authority
            .port_u16()
            .ok_or((StatusCode::BAD_REQUEST, "CONNECT target must be host:port"))?;
        return Ok(Target::Tunnel {
            host: authority.host().to_string(),
            port,
        });
    }
    let absolute = !head.target.starts_with('/') && head.target != "*";
    match mode {
        Mode::Forward => {
            if !absolute {
                return Err((
                    StatusCode::BAD_REQUEST,
                    "not a proxy request: the target must be an absolute URI",
                ));
            }
            absolute_uri(&head.target).map(Target::Origin)
        }
        Mode::Transparent => {
            if absolute {
                return absolute_uri(&head.target).map(Target::Origin);
            }
            let host = head
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .filter(|h| !h.is_empty())
                .ok_or((StatusCode::BAD_REQUEST, "no Host header to route the request by"))?;
            let target = if head.target == "*" { "/" } else { head.target.as_str() };
            format!("http://{host}{target}")
                .parse::<Uri>()
                .map(Target::Origin)
                .map_err(|_| (StatusCode::BAD_REQUEST, "invalid Host header or target"))
        }
        Mode::Reverse => {
            let (host, path_and_query) = if absolute {
                let uri = absolute_uri(&head.target)?;
                let pq = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
                (uri.authority().map(|a| a.as_str().to_string()).unwrap_or_default(), pq)
            } else {
                let host = head
                    .headers
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                (host, head.target.clone())
            };
            let path = path_and_query.split('?').next().unwrap_or("/");
            let (group, rule) = rules
                .find(&host_only(&host), path)
                .ok_or((StatusCode::NOT_FOUND, "no route matches this host and path"))?;
            Ok(Target::Group {
                group,
                rule,
                path_and_query,
                host,
            })
        }
    }
}

fn absolute_uri(target: &str) -> Result<Uri, Refusal> {
    let uri: Uri = target
        .parse()
        .map_err(|_| (StatusCode::BAD_REQUEST, "invalid request URI"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err((StatusCode::BAD_REQUEST, "unsupported URI scheme (http and https only)")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err((StatusCode::BAD_REQUEST, "request URI has no host"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err((StatusCode::BAD_REQUEST, "user info in request URI is not allowed"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        let r = |host: Option<&str>, path: Option<&str>, up: &str| RuleConfig {
            host: host.map(String::from),
            path: path.map(String::from),
            upstream: up.into(),
            cache: None,
            bucket: None,
        };
        let cfg = vec![
            r(Some("www.example.com"), Some("/api/"), "api"),
            r(Some("www.example.com"), None, "web"),
            r(Some("*.example.org"), None, "org"),
            r(Some("*"), Some("/static/"), "static"),
        ];
        let names = ["api", "web", "org", "static"];
        Rules::new(&cfg, |n| names.iter().position(|x| *x == n)).unwrap()
    }

    #[test]
    fn first_match_wins() {
        let r = rules();
        assert_eq!(r.find("www.example.com", "/api/v1").map(|(g, _)| g), Some(0));
        assert_eq!(r.find("www.example.com", "/other").map(|(g, _)| g), Some(1));
        assert_eq!(r.find("a.example.org", "/").map(|(g, _)| g), Some(2));
        assert_eq!(r.find("example.org", "/"), None);
        assert_eq!(r.find("else.net", "/static/x.css").map(|(g, _)| g), Some(3));
        assert_eq!(r.find("else.net", "/"), None);
    }

    #[test]
    fn host_only_strips_port_and_case() {
        assert_eq!(host_only("WWW.Example.com:8080"), "www.example.com");
        assert_eq!(host_only("[::1]:80"), "[::1]");
        assert_eq!(host_only("example.com."), "example.com");
    }
}
