//! `PURGE`: removes a URL from the cache (every Vary variant), for clients
//! in `access.admin_allow` only. With `Portico-Purge: prefix`, every object
//! whose URL starts with the target is dropped from the memory tier (the
//! disk tier is purged by prefix with `portico cache purge --prefix`).

use super::Shared;
use super::forward::{Dest, Failure};
use crate::http1::Exchange;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};

/// True for the PURGE method.
pub fn is_purge(method: &http::Method) -> bool {
    method.as_str().eq_ignore_ascii_case("PURGE")
}

/// Serves a PURGE request.
pub async fn purge(ex: &mut Exchange<'_>, sh: &Shared, dest: &Dest) -> Result<(), Failure> {
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
    let key = cache.key(&scheme, &authority, &pq);
    let by_prefix = ex
        .head
        .headers
        .get("portico-purge")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"prefix"));
    let (status, text) = if by_prefix {
        let n = cache.memory().purge_prefix(key.url());
        (
            StatusCode::OK,
            format!("purged {n} objects under {} from memory\n", key.url()),
        )
    } else if cache.invalidate(&key).await {
        (StatusCode::OK, format!("purged {}\n", key.url()))
    } else {
        (StatusCode::NOT_FOUND, format!("not in the cache: {}\n", key.url()))
    };
    tracing::info!(client = %ex.peer.ip(), "PURGE {}: {}", key.url(), status.as_u16());
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    if ex.out.send_full(status, headers, Bytes::from(text)).await.is_err() {
        ex.out.close_after();
    }
    Ok(())
}
