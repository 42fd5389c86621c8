//! `portico acl test`: which `[[acl]]` entry decides a request and the
//! verdict, through [`Acl::decide`] exactly as the server calls it.

use super::{Acl, Decision, Identity, Request};
use crate::config::{Config, Mode};
use crate::proxy::classify::HttpTarget;
use crate::rules::{parse_headers, tunnel_target};
use http::{Method, Uri};
use std::fmt::Write;
use std::net::IpAddr;

/// A request to try against the ACL.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Absolute URL (`http://host[:port]/path?query`), or `host:port` for CONNECT.
    pub url: String,
    /// Method.
    pub method: String,
    /// Client address.
    pub client: IpAddr,
    /// The authenticated user, if any.
    pub user: Option<String>,
    /// The user's groups.
    pub groups: Vec<String>,
    /// `Name: value` header fields.
    pub headers: Vec<String>,
    /// Listener mode; None = the config's first listener's.
    pub mode: Option<Mode>,
    /// Local time in `[access] time_zone`, `YYYY-MM-DDTHH:MM`; None = now.
    pub at: Option<String>,
    /// The response's `Content-Type`, to try the response entries
    /// (`content_type`, `kind = "mime"` lists) too; None = request only.
    pub content_type: Option<String>,
}

/// Decides `probe` with `config`'s ACL and describes the result. `file`
/// and `lines` (from `config::acl_lines`) locate each entry.
pub fn explain(config: &Config, file: &str, lines: &[usize], probe: &Probe) -> Result<String, String> {
    let acl = Acl::compile(config).map_err(|e| e.to_string())?;
    let method =
        Method::from_bytes(probe.method.as_bytes()).map_err(|_| format!("{:?} is not a method", probe.method))?;
    let headers = parse_headers(&probe.headers)?;
    let mode = probe
        .mode
        .or_else(|| config.listener.first().map(|l| l.mode))
        .unwrap_or(Mode::Forward);
    let now = match &probe.at {
        None => jiff::Timestamp::now(),
        Some(at) => local_time(&acl, at)?,
    };
    if probe.user.is_none() && !probe.groups.is_empty() {
        return Err("--group needs --user (groups belong to an authenticated user)".into());
    }
    let user = probe.user.as_deref().map(|name| Identity {
        name,
        groups: &probe.groups,
    });
    let tunnel;
    let target;
    let req = if method == Method::CONNECT {
        let (host, port) = tunnel_target(&probe.url)?;
        tunnel = (crate::rules::tunnel_host(&host), port);
        Request::tunnel(&tunnel.0, tunnel.1, probe.client, &headers, mode, user)
    } else {
        let uri: Uri = probe
            .url
            .parse()
            .map_err(|e| format!("{:?} is not a URL: {e}", probe.url))?;
        if !matches!(uri.scheme_str(), Some("http") | Some("https")) || uri.host().is_none() {
            return Err(format!("{:?}: give an absolute http:// or https:// URL", probe.url));
        }
        target = HttpTarget::from_uri(uri);
        Request {
            client: probe.client,
            method: &method,
            scheme: target.scheme,
            host: &target.host,
            port: target.port,
            path_and_query: &target.path_and_query,
            headers: &headers,
            mode,
            user,
        }
    };
    let decision = acl.decide(&req, now);
    let matched_list = match &decision {
        Decision::Allow { entry: Some(i) }
        | Decision::Deny { entry: Some(i), .. }
        | Decision::NeedAuth { entry: i } => acl.list_hit(*i, &req),
        _ => None,
    };
    let mut out = String::new();
    let who = match &probe.user {
        None => "no authenticated user".to_string(),
        Some(u) if probe.groups.is_empty() => format!("user {u}"),
        Some(u) => format!("user {u} (groups: {})", probe.groups.join(", ")),
    };
    let when = acl.zone().to_datetime(now).strftime("%Y-%m-%d %H:%M %a").to_string();
    let _ = writeln!(
        out,
        "request: {method} {} from {} on a {} listener, {who}, at {when} {} ({} entries)",
        probe.url,
        probe.client,
        crate::rules::mode_name(mode),
        acl.zone_name(),
        acl.len()
    );
    let entry_line = |i: usize| {
        let place = lines
            .get(i)
            .copied()
            .filter(|l| *l > 0)
            .map_or_else(String::new, |l| format!(" ({file}:{l})"));
        format!("entry {i}{place}: {}", acl.describe(i))
    };
    match &decision {
        Decision::Allow { entry: Some(i) } => {
            let _ = writeln!(out, "decided by {} [allow]", entry_line(*i));
            let _ = writeln!(out, "verdict: allow");
        }
        Decision::Allow { entry: None } => {
            match acl.disagreeing_reach(&req, now) {
                Some((a, b)) => {
                    let _ = writeln!(
                        out,
                        "allowed by {} as nginx reads the path, and by {} as Tomcat or IIS read it; \
                         their allow_destinations differ, so neither applies",
                        entry_line(a),
                        entry_line(b)
                    );
                }
                None => {
                    let _ = writeln!(out, "no entry matched: access.acl_default = \"allow\"");
                }
            }
            let _ = writeln!(out, "verdict: allow");
        }
        Decision::Deny { entry, status, reason } => {
            match entry {
                Some(i) => {
                    let _ = writeln!(out, "decided by {} [deny]", entry_line(*i));
                }
                None => {
                    let _ = writeln!(out, "no entry matched: access.acl_default = \"deny\"");
                }
            }
            let _ = writeln!(out, "verdict: deny {}: {reason}", status.as_u16());
        }
        Decision::NeedAuth { entry } => {
            let _ = writeln!(out, "decided by {} [needs an authenticated user]", entry_line(*entry));
            let (status, header) = if mode == Mode::Reverse {
                (401, "WWW-Authenticate")
            } else {
                (407, "Proxy-Authenticate")
            };
            let _ = writeln!(
                out,
                "verdict: authentication required: {status} with {header}: Basic realm=\"{}\" (try again with --user)",
                config.auth.realm
            );
        }
    }
    if let Some(hit) = matched_list {
        let _ = writeln!(out, "matched by {hit}");
    }
    if matches!(decision, Decision::Allow { .. }) && acl.has_reply_entries() {
        explain_reply(&mut out, &acl, &req, probe, now, &entry_line);
    }
    Ok(out)
}

/// The response step of an allowed request: which response entry decides
/// a response of `--content-type`, as the server's `ReplyFilter` would.
fn explain_reply(
    out: &mut String,
    acl: &Acl,
    req: &Request<'_>,
    probe: &Probe,
    now: jiff::Timestamp,
    entry_line: &dyn Fn(usize) -> String,
) {
    let Some(ct) = &probe.content_type else {
        let _ = writeln!(
            out,
            "response entries (content_type) not tried: give --content-type to check a response"
        );
        return;
    };
    if req.is_tunnel() {
        let _ = writeln!(
            out,
            "response: a CONNECT tunnel's responses are encrypted: content_type entries never apply"
        );
        return;
    }
    let types = super::MediaTypes::parse(ct);
    let _ = writeln!(out, "response: Content-Type {ct:?} (media types: {})", types.describe());
    match acl.explain_reply(req, &types, now) {
        None => {
            let _ = writeln!(out, "no response entry matched");
            let _ = writeln!(out, "response verdict: allow");
        }
        Some((i, decision, hit)) => match decision {
            Decision::Deny { status, reason, .. } => {
                let _ = writeln!(out, "response decided by {} [deny]", entry_line(i));
                let _ = writeln!(out, "matched by {hit}");
                let _ = writeln!(out, "response verdict: deny {}: {reason}", status.as_u16());
            }
            _ => {
                let _ = writeln!(out, "response decided by {} [allow]", entry_line(i));
                let _ = writeln!(out, "matched by {hit}");
                let _ = writeln!(out, "response verdict: allow");
            }
        },
    }
}

/// `YYYY-MM-DDTHH:MM` (seconds optional) read in the ACL's time zone.
fn local_time(acl: &Acl, at: &str) -> Result<jiff::Timestamp, String> {
    let bad = |e: &dyn std::fmt::Display| format!("--at {at:?}: write YYYY-MM-DDTHH:MM ({e})");
    let civil: jiff::civil::DateTime = at.parse().map_err(|e| bad(&e))?;
    civil
        .to_zoned_datetime(acl.zone().clone())
        .map(|z| z.timestamp())
        .map_err(|e| bad(&e))
}
