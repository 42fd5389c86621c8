//! Classify: what kind of request this is (CONNECT, or an HTTP request on a
//! forward, reverse or transparent listener) and the URL the routing rules
//! (`crate::rules`) look at.

use crate::config::Mode;
use crate::http1::RequestHead;
use http::{Method, StatusCode, Uri};

/// What the request asks for.
#[derive(Debug)]
pub enum Target {
    /// A CONNECT tunnel to `host:port`.
    Tunnel {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
    /// An HTTP request, to be routed by the rules.
    Http(HttpTarget),
}

/// An HTTP request's URL, as the rules see it.
#[derive(Debug)]
pub struct HttpTarget {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// The authority the client asked for: the absolute target's (which
    /// replaces `Host`, RFC 9112 3.2.2) or the `Host` header (may be empty).
    pub authority: String,
    /// The host, lower-case, without port or trailing dot; an IP address
    /// (in any spelling the connector reads as one) in its canonical form
    /// ([`crate::util::canonical_host`]), so `[[acl]]` and `[[rule]]`
    /// entries naming an address match every spelling of it.
    pub host: String,
    /// Explicit port, else the scheme's default.
    pub port: u16,
    /// Origin-form path and query.
    pub path_and_query: String,
    /// Where the request goes when no rule names an upstream: the origin
    /// URI (forward and transparent listeners); None on reverse listeners.
    pub origin: Option<Uri>,
}

/// A request that cannot be routed: status and reason.
pub type Refusal = (StatusCode, &'static str);

impl HttpTarget {
    /// The target of an absolute-form request for `uri`.
    pub fn from_uri(uri: Uri) -> HttpTarget {
        let scheme = if uri.scheme_str() == Some("https") {
            "https"
        } else {
            "http"
        };
        let authority = uri.authority().map_or(String::new(), |a| a.as_str().to_string());
        HttpTarget {
            scheme,
            host: host_only(&authority),
            port: port_of(&authority, scheme),
            path_and_query: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
            authority,
            origin: Some(uri),
        }
    }
}

/// The port an authority names, if it names one.
fn explicit_port(authority: &str) -> Option<u16> {
    let port = if authority.starts_with('[') {
        authority.split_once("]:").map(|(_, p)| p)
    } else {
        authority.rsplit_once(':').map(|(_, p)| p)
    };
    port.and_then(|p| p.parse().ok())
}

/// The port in an authority, else the scheme's default.
fn port_of(authority: &str, scheme: &str) -> u16 {
    explicit_port(authority).unwrap_or(if scheme == "https" { 443 } else { 80 })
}

/// The host part of a Host header value, without port, as the rules see
/// it ([`crate::util::canonical_host`]: lower-cased, and an IP address in
/// one spelling however the client wrote it).
fn host_only(authority: &str) -> String {
    let a = authority.trim();
    let host = if a.starts_with('[') {
        a.split_inclusive(']').next().unwrap_or(a)
    } else {
        a.rsplit_once(':').map_or(a, |(h, _)| h)
    };
    crate::util::canonical_host(host)
}

/// Decides what the request asks for, for a listener in `mode` (over TLS
/// when `tls`); the rules (`crate::rules`) then decide where it goes.
pub fn classify(head: &RequestHead, mode: Mode, tls: bool) -> Result<Target, Refusal> {
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
        // Never asked: a SOCKS listener's connections do not reach the
        // HTTP layer (`proxy/socks.rs` takes them whole).
        Mode::Socks => Err((StatusCode::BAD_REQUEST, "a SOCKS listener serves no HTTP requests")),
        Mode::Forward => {
            if !absolute {
                return Err((
                    StatusCode::BAD_REQUEST,
                    "not a proxy request: the target must be an absolute URI",
                ));
            }
            absolute_uri(&head.target).map(|u| Target::Http(HttpTarget::from_uri(u)))
        }
        Mode::Transparent => {
            if absolute {
                return absolute_uri(&head.target).map(|u| Target::Http(HttpTarget::from_uri(u)));
            }
            let host = head
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .filter(|h| !h.is_empty())
                .ok_or((StatusCode::BAD_REQUEST, "no Host header to route the request by"))?;
            let target = if head.target == "*" { "/" } else { head.target.as_str() };
            // A client whose TLS connection was redirected here was speaking
            // `https` to its origin: its request is fetched as that, on port
            // 443, never downgraded to `http` on port 80.
            let scheme = if tls { "https" } else { "http" };
            format!("{scheme}://{host}{target}")
                .parse::<Uri>()
                .map(|u| Target::Http(HttpTarget::from_uri(u)))
                .map_err(|_| (StatusCode::BAD_REQUEST, "invalid Host header or target"))
        }
        Mode::Reverse => {
            if absolute {
                let mut t = HttpTarget::from_uri(absolute_uri(&head.target)?);
                t.origin = None;
                return Ok(Target::Http(t));
            }
            let authority = head
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("")
                .to_string();
            let path_and_query = if head.target == "*" {
                "/".to_string()
            } else {
                head.target.clone()
            };
            Ok(Target::Http(HttpTarget {
                scheme: "http",
                host: host_only(&authority),
                port: port_of(&authority, "http"),
                authority,
                path_and_query,
                origin: None,
            }))
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

    #[test]
    fn host_only_strips_port_and_case() {
        assert_eq!(host_only("WWW.Example.com:8080"), "www.example.com");
        assert_eq!(host_only("[::1]:80"), "[::1]");
        assert_eq!(host_only("example.com."), "example.com");
        assert_eq!(host_only("2130706433:80"), "127.0.0.1");
        assert_eq!(host_only("[::ffff:127.0.0.1]:80"), "127.0.0.1");
        assert_eq!(host_only("[0::1]"), "[::1]");
    }

    #[test]
    fn a_transparent_listeners_origin_form_request_is_https_over_tls() {
        let mut head = RequestHead {
            method: Method::GET,
            target: "/x?y".to_string(),
            version: http::Version::HTTP_11,
            headers: http::HeaderMap::new(),
            body: crate::http1::BodyFraming::Empty,
            keep_alive: true,
            expect_continue: false,
        };
        head.headers
            .insert(http::header::HOST, http::HeaderValue::from_static("www.example"));
        let url = |tls| match classify(&head, Mode::Transparent, tls) {
            Ok(Target::Http(t)) => (t.scheme, t.port, t.path_and_query),
            _ => panic!("not an HTTP target"),
        };
        assert_eq!(url(true), ("https", 443, "/x?y".to_string()));
        assert_eq!(url(false), ("http", 80, "/x?y".to_string()));
    }

    #[test]
    fn port_of_authority() {
        assert_eq!(port_of("a.test:8080", "http"), 8080);
        assert_eq!(port_of("a.test", "http"), 80);
        assert_eq!(port_of("a.test", "https"), 443);
        assert_eq!(port_of("[::1]:81", "http"), 81);
        assert_eq!(port_of("[::1]", "https"), 443);
        assert_eq!(port_of("", "http"), 80);
    }
}
