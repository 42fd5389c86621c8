//! `portico rules test`: which rule a request matches and what it does,
//! in words (the operator's "why did this request go there").

use super::{Request, Route, Rules};
use crate::config::{Config, Mode};
use crate::proxy::classify::HttpTarget;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use std::fmt::Write;
use std::net::IpAddr;

/// A request to try against the rules.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Absolute URL (`http://host[:port]/path?query`).
    pub url: String,
    /// Method.
    pub method: String,
    /// Client address.
    pub client: IpAddr,
    /// `Name: value` header fields.
    pub headers: Vec<String>,
    /// Listener mode; None = the config's first listener's.
    pub mode: Option<Mode>,
}

/// Routes `probe` through `config`'s rules and describes the result.
/// `file` and `lines` (from `config::rule_lines`) locate each rule.
pub fn explain(config: &Config, file: &str, lines: &[usize], probe: &Probe) -> Result<String, String> {
    let rules = Rules::compile(config).map_err(|e| e.to_string())?;
    let method =
        Method::from_bytes(probe.method.as_bytes()).map_err(|_| format!("{:?} is not a method", probe.method))?;
    let headers = parse_headers(&probe.headers)?;
    let mode = probe
        .mode
        .or_else(|| config.listener.first().map(|l| l.mode))
        .unwrap_or(Mode::Forward);
    if method == Method::CONNECT {
        return explain_tunnel(config, &rules, file, lines, probe, &headers, mode);
    }
    let uri: Uri = probe
        .url
        .parse()
        .map_err(|e| format!("{:?} is not a URL: {e}", probe.url))?;
    if !matches!(uri.scheme_str(), Some("http") | Some("https")) || uri.host().is_none() {
        return Err(format!("{:?}: give an absolute http:// or https:// URL", probe.url));
    }
    let target = HttpTarget::from_uri(uri);
    let req = Request {
        method: &method,
        scheme: target.scheme,
        host: &target.host,
        port: target.port,
        path_and_query: &target.path_and_query,
        client: probe.client,
        headers: &headers,
        mode,
    };
    let route = rules.route(&req);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "request: {method} {} from {} on a {} listener ({} rules)",
        probe.url,
        probe.client,
        mode_name(mode),
        rules.len()
    );
    let origin = format!("{}://{}{}", target.scheme, target.authority, target.path_and_query);
    if route.matched.is_empty() {
        let default = match mode {
            Mode::Reverse => "404 (on a reverse listener only a rule with an `upstream` routes a request)".to_string(),
            _ => format!("straight to the origin {origin}"),
        };
        let _ = writeln!(out, "no rule matched: default route: {default}");
        return Ok(out);
    }
    describe_matched(&mut out, config, &rules, file, lines, &route);
    let _ = writeln!(out, "actions:");
    if let Some(d) = route.deny {
        let _ = writeln!(out, "  deny: {}", d.as_u16());
    } else if let Some(r) = &route.redirect {
        let _ = writeln!(out, "  redirect: {} {}", r.status.as_u16(), r.location);
    } else {
        match route.upstream {
            Some(g) => match config.upstream.get(g) {
                Some(u) if u.parent => {
                    let pq = route.path_and_query.as_deref().unwrap_or(&target.path_and_query);
                    let how = if target.scheme == "https" {
                        format!("CONNECT {}:{} through the parent, then TLS", target.host, target.port)
                    } else {
                        format!("{method} {}://{}{pq} in absolute form", target.scheme, target.authority)
                    };
                    let _ = writeln!(
                        out,
                        "  upstream: {} (parent proxies: {}): {how}",
                        u.name,
                        u.servers.join(", ")
                    );
                }
                u => {
                    let name = u.map_or("?", |u| u.name.as_str());
                    let _ = writeln!(out, "  upstream: {name}");
                }
            },
            None if mode == Mode::Reverse => {
                let _ = writeln!(out, "  upstream: none: 404 (no matching rule chose an upstream)");
            }
            None => {
                let _ = writeln!(out, "  upstream: none: straight to the origin");
            }
        }
        match &route.path_and_query {
            Some(pq) => {
                let _ = writeln!(out, "  url: {} -> {pq}", target.path_and_query);
            }
            None => {
                let _ = writeln!(out, "  url: {} (not rewritten)", target.path_and_query);
            }
        }
    }
    for (label, list) in [
        ("request headers", &route.request_headers),
        ("response headers", &route.response_headers),
    ] {
        if !list.is_empty() {
            let text: Vec<String> = list.iter().map(|e| e.describe()).collect();
            let _ = writeln!(out, "  {label}: {}", text.join("; "));
        }
    }
    if let Some(i) = route.cache_rule
        && let Some(o) = &config.rule[i].cache
    {
        let text = toml::to_string(o).unwrap_or_default();
        let keys: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        let _ = writeln!(out, "  cache (rule {i}): {}", keys.join(", "));
    }
    if let Some(b) = &route.bucket {
        let _ = writeln!(out, "  bucket: {b}");
    }
    if let Some(b) = &route.busy_body {
        let _ = writeln!(out, "  busy body: {} bytes", b.len());
    }
    describe_limits(&mut out, &route, "", "per response");
    Ok(out)
}

/// The route's `request_rate`, `total_request_rate` and `bandwidth`, as `rules test` prints
/// them: `counted` after the rate, `paced` what the bandwidth applies to.
fn describe_limits(out: &mut String, route: &Route, counted: &str, paced: &str) {
    for (r, whose) in [
        (&route.request_rate, "per client"),
        (&route.total_request_rate, "for all clients"),
    ] {
        if let Some(r) = r {
            let _ = writeln!(
                out,
                "  request rate: {} a second {whose}, burst {}{counted}",
                r.rate(),
                r.burst()
            );
        }
    }
    match route.bandwidth {
        Some(b) if b.rate == 0 => {
            let _ = writeln!(out, "  bandwidth: no limit");
        }
        Some(b) => {
            let after = if b.after > 0 {
                format!(", after its first {} bytes", b.after)
            } else {
                String::new()
            };
            let _ = writeln!(out, "  bandwidth: {} bytes a second {paced}{after}", b.rate);
        }
        None => {}
    }
}

/// A listener mode as written in the config.
pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Forward => "forward",
        Mode::Reverse => "reverse",
        Mode::Transparent => "transparent",
        Mode::Socks => "socks",
    }
}

/// `Name: value` strings as a header map (the `--header` options of the
/// `rules test` and `acl test` commands).
pub fn parse_headers(list: &[String]) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for h in list {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| format!("header {h:?}: write it as 'Name: value'"))?;
        let name =
            HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| format!("{name:?} is not a header name"))?;
        let value = HeaderValue::from_str(value.trim()).map_err(|_| format!("{value:?} is not a header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// One line per matched rule, with where it is and how it was found.
fn describe_matched(out: &mut String, config: &Config, rules: &Rules, file: &str, lines: &[usize], route: &Route) {
    for &i in &route.matched {
        let line = lines.get(i).copied().filter(|l| *l > 0);
        let place = line.map_or_else(String::new, |l| format!(" ({file}:{l})"));
        let cont = if config.rule[i].continue_ { " [continue]" } else { "" };
        let _ = writeln!(out, "matched rule {i}{place}: {}{cont}", rules.describe_matchers(i));
        let _ = writeln!(out, "  indexed by: {}", rules.index_key(i));
    }
}

/// The CONNECT target named by a test command's probe: `host:port`, or a URL whose host
/// and port (443 for `https`, 80 for `http` when none is given) are taken.
pub fn tunnel_target(url: &str) -> Result<(String, u16), String> {
    let bad = || format!("{url:?}: give a CONNECT target as host:port (or an https:// URL)");
    if url.contains("://") {
        let uri: Uri = url.parse().map_err(|_| bad())?;
        let host = uri.host().ok_or_else(bad)?;
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("http") { 80 } else { 443 });
        return Ok((host.to_string(), port));
    }
    let authority: http::uri::Authority = url.parse().map_err(|_| bad())?;
    let port = authority.port_u16().ok_or_else(bad)?;
    Ok((authority.host().to_string(), port))
}

/// `rules test --method CONNECT`: the rules matched exactly as the server
/// matches a CONNECT ([`Request::tunnel`]), and what they do to a tunnel.
fn explain_tunnel(
    config: &Config,
    rules: &Rules,
    file: &str,
    lines: &[usize],
    probe: &Probe,
    headers: &HeaderMap,
    mode: Mode,
) -> Result<String, String> {
    let (host, port) = tunnel_target(&probe.url)?;
    let target = format!("{host}:{port}");
    let host = super::tunnel_host(&host);
    let route = rules.route(&Request::tunnel(&host, port, probe.client, headers, mode));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "request: CONNECT {target} from {} on a {} listener ({} rules)",
        probe.client,
        mode_name(mode),
        rules.len()
    );
    if mode != Mode::Forward {
        let _ = writeln!(out, "refused: 405: CONNECT is only served on forward-proxy listeners");
        return Ok(out);
    }
    if route.matched.is_empty() {
        let _ = writeln!(out, "no rule matched: default route: tunnel straight to {target}");
        return Ok(out);
    }
    describe_matched(&mut out, config, rules, file, lines, &route);
    let _ = writeln!(out, "actions:");
    if let Some(d) = route.deny {
        let _ = writeln!(out, "  deny: {} (the tunnel is refused)", d.as_u16());
    } else if let Some(r) = &route.redirect {
        let _ = writeln!(
            out,
            "  refused: 403: {} (the rule redirects to {})",
            super::REDIRECT_REFUSED_FOR_CONNECT,
            r.location
        );
    } else {
        match route.upstream.and_then(|g| config.upstream.get(g)) {
            Some(u) if u.parent => {
                let _ = writeln!(
                    out,
                    "  upstream: {} (parent proxies: {}): CONNECT {target} through the parent",
                    u.name,
                    u.servers.join(", ")
                );
            }
            Some(u) => {
                let _ = writeln!(
                    out,
                    "  upstream: {} is not a parent group, so it does not apply: tunnel straight to {target}",
                    u.name
                );
            }
            None => {
                let _ = writeln!(out, "  upstream: none: tunnel straight to {target}");
            }
        }
        if !config.proxy.connect_ports.contains(&port) {
            let _ = writeln!(
                out,
                "  but port {port} is not in proxy.connect_ports: the tunnel is refused with 403"
            );
        }
    }
    if !route.response_headers.is_empty() {
        let text: Vec<String> = route.response_headers.iter().map(|e| e.describe()).collect();
        let _ = writeln!(out, "  response headers: {}", text.join("; "));
    }
    describe_limits(&mut out, &route, " (the CONNECT counts once)", "towards the client");
    Ok(out)
}
