//! `PURGE`: removes a URL from the cache (every Vary variant), for clients
//! in `access.admin_allow` only. With `Portico-Purge: prefix`, every object
//! whose URL starts with the target is dropped from every worker's memory
//! tier (the disk tier is purged by prefix with `portico cache purge
//! --prefix`, which then sends this).
//!
//! The URL is the public one, on any listener: a PURGE removes every copy
//! stored for it, the one fetched from its origin (forward and transparent
//! proxying) and the one fetched from each `[[upstream]]` group (reverse
//! proxying, whose keys name the group: `crate::cache::key`), as
//! `portico cache purge URL` does on the disk. An administrator purging a
//! page wants it gone wherever it was stored. In an `[array]`, that is
//! on every member: the PURGE is passed on to each other member, once.

use super::Shared;
use super::forward::{Dest, Failure};
use crate::http1::Exchange;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};

/// True for the PURGE method, spelled exactly so: methods are
/// case-sensitive (RFC 9110 9.1), so `purge` is another method, unknown,
/// sent to the origin like any other. Compared without case, `purge`
/// purged while the `[[acl]]` entries (which compare methods exactly, as
/// the statistics do) saw no PURGE in it: a `method = "PURGE"` deny let
/// it through.
pub fn is_purge(method: &http::Method) -> bool {
    method.as_str() == "PURGE"
}

/// Serves a PURGE request; `fan_out`: also send it to every other
/// `[array]` member (false for a PURGE a member sent us, which it sends
/// to the others itself).
pub async fn purge(ex: &mut Exchange<'_>, sh: &Shared, dest: &Dest, fan_out: bool) -> Result<(), Failure> {
    if !sh.admin.allows(ex.peer.ip()) {
        return Err((
            StatusCode::FORBIDDEN,
            "PURGE is allowed only from access.admin_allow addresses".into(),
        ));
    }
    let Some(cache) = sh.cache.as_ref() else {
        return Err((StatusCode::NOT_FOUND, "the cache is disabled".into()));
    };
    let (scheme, authority, pq) = dest.public_url();
    let key = cache.key(scheme, authority, pq);
    // Every copy: the origin's and each upstream group's.
    let copies = std::iter::once(key.clone()).chain(
        sh.groups
            .iter()
            .filter(|g| !g.parent)
            .map(|g| key.clone().in_upstream(&g.name)),
    );
    let by_prefix = ex
        .head
        .headers
        .get("portico-purge")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"prefix"));
    let (mut status, mut text) = if by_prefix {
        let n = cache.purge_prefix(key.url());
        (
            StatusCode::OK,
            format!("purged {n} objects under {} from memory\n", key.url()),
        )
    } else if invalidate_all(cache, copies).await {
        (StatusCode::OK, format!("purged {}\n", key.url()))
    } else {
        (StatusCode::NOT_FOUND, format!("not in the cache: {}\n", key.url()))
    };
    if fan_out && let Some(a) = &sh.array {
        // The array holds each URL on one member: the PURGE succeeded if
        // any member held it. Each member's answer is one more line.
        for (i, m) in a.members.iter().enumerate() {
            if i == a.self_index {
                continue;
            }
            let answer = purge_member(sh, a.group_base + i, &ex.head, &a.members[a.self_index].name).await;
            if answer == Some(StatusCode::OK) {
                status = StatusCode::OK;
            }
            let said = answer.map_or("no answer".to_string(), |s| s.as_u16().to_string());
            text.push_str(&format!("array member {}: {said}\n", m.name));
        }
    }
    tracing::info!(client = %ex.peer.ip(), "PURGE {}: {}", key.url(), status.as_u16());
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if ex.out.send_full(status, headers, Bytes::from(text)).await.is_err() {
        ex.out.close_after();
    }
    Ok(())
}

/// Sends the PURGE `head` (its absolute URL and `Portico-Purge` field) to
/// the array member of parent group `group`, marked as from member `me`
/// so that it is not passed on again; its status, None if it did not
/// answer. The member applies its own `access.admin_allow` to it.
async fn purge_member(sh: &Shared, group: usize, head: &crate::http1::RequestHead, me: &str) -> Option<StatusCode> {
    let upstream = sh.parents.get(group)?.first()?;
    let uri: http::Uri = head.target.parse().ok()?;
    uri.scheme()?;
    let mut req = http::Request::builder()
        .method(head.method.clone())
        .uri(uri.clone())
        .header(http::header::HOST, uri.authority()?.as_str())
        .header(crate::array::route::MARKER, me);
    if let Some(v) = head.headers.get("portico-purge") {
        req = req.header("portico-purge", v.clone());
    }
    let req = req.body(crate::upstream::ProxyBody::empty()).ok()?;
    match upstream.send(req, None).await {
        Ok(response) => Some(response.status()),
        Err(e) => {
            tracing::warn!(group = %sh.groups[group].name, "PURGE not passed on to the array member: {e}");
            None
        }
    }
}

/// Invalidates every key of `copies`; true if any was stored.
async fn invalidate_all(cache: &crate::cache::Cache, copies: impl Iterator<Item = crate::cache::CacheKey>) -> bool {
    let mut any = false;
    for key in copies {
        any |= cache.invalidate(&key).await;
    }
    any
}

/// Asks a running Portico (the first listener of `config`) to drop `url`,
/// or everything under it with `prefix`, from its cache: `portico cache
/// purge` removes the disk files itself, but only the server can clear its
/// memory tier. `on_disk` is how many objects the disk purge removed, so
/// "too" is said only when there were some. Returns what happened, for the
/// operator.
pub fn purge_running(config: &crate::config::Config, url: &str, prefix: bool, on_disk: u64) -> String {
    use std::io::{Read, Write};
    use std::time::Duration;
    let Some(listener) = config.listener.first() else {
        return "no listener configured: only the disk was purged".into();
    };
    let Ok(uri) = url.parse::<http::Uri>() else {
        return format!("{url} is not a URL: only the disk was purged");
    };
    let host = uri.authority().map_or("", |a| a.as_str());
    let target = match listener.mode {
        crate::config::Mode::Forward => url.to_string(),
        _ => uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
    };
    let extra = if prefix { "Portico-Purge: prefix\r\n" } else { "" };
    let request = format!("PURGE {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    let addr = listener.address;
    let mut stream = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(s) => s,
        Err(_) => return format!("no server answering on {addr}: only the disk was purged"),
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut answer = Vec::new();
    if stream.write_all(request.as_bytes()).is_err() || (stream.read_to_end(&mut answer).is_err() && answer.is_empty())
    {
        return format!("the server on {addr} did not answer the PURGE");
    }
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).unwrap_or("?");
    match status {
        "200" if prefix => {
            // The body says `purged N objects under URL from memory`.
            let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            match body
                .strip_prefix("purged ")
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
            {
                Some(n) => format!("the server on {addr} dropped {n} objects under {url} from memory"),
                None => format!("the server on {addr} answered the PURGE with {:?}", body.trim()),
            }
        }
        "200" if on_disk > 0 => format!("the server on {addr} dropped it from memory too"),
        "200" => format!("the server on {addr} dropped it from memory (there was no copy on disk)"),
        "404" => format!("the server on {addr} did not hold it in memory"),
        "403" => format!("the server on {addr} refused the PURGE (this host is not in access.admin_allow)"),
        other => format!("the server on {addr} answered {other} to the PURGE"),
    }
}
