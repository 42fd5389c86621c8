//! Serving the PAC file (`[array] pac_path`). A browser fetches it before
//! it uses any proxy, without credentials, so it is answered to every
//! client `access.allow` (or `access.admin_allow`) admits, before
//! admission and authentication, like the monitoring pages; `[[acl]]`
//! entries do not apply to it. The script itself comes from `crate::array`.

use super::Shared;
use crate::config::Mode;
use crate::http1::{Exchange, Outcome};
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

/// True if the request asks for the PAC file: GET or HEAD of `pac_path`,
/// origin-form (on a transparent listener, with a `Host` naming the
/// listener) or absolute-form naming the listener itself.
pub(super) fn wanted(sh: &Shared, ex: &Exchange<'_>, mode: Mode, tls: bool) -> bool {
    let Some(a) = &sh.config.array else {
        return false;
    };
    let head = &ex.head;
    if a.pac_path.is_empty() || (head.method != Method::GET && head.method != Method::HEAD) {
        return false;
    }
    let target = head.target.as_str();
    let path_and_query = if target.starts_with('/') {
        if mode == Mode::Transparent {
            let names_us = head
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .and_then(|h| h.parse().ok())
                .is_some_and(|auth| super::monitor::names_us(&auth, super::monitor::default_port(tls), ex.local.get()));
            if !names_us {
                return false;
            }
        }
        target
    } else {
        let Ok(uri) = target.parse::<http::Uri>() else {
            return false;
        };
        let default_port = super::monitor::default_port(uri.scheme() == Some(&http::uri::Scheme::HTTPS));
        if !uri
            .authority()
            .is_some_and(|auth| super::monitor::names_us(auth, default_port, ex.local.get()))
        {
            return false;
        }
        return uri.path() == a.pac_path;
    };
    path_and_query.split('?').next() == Some(a.pac_path.as_str())
}

/// Answers a PAC file request.
pub(super) async fn serve(ex: &mut Exchange<'_>, sh: &Shared, mode: Mode) -> Outcome {
    ex.out.close_after();
    let ip = ex.peer.ip();
    if !sh.allow.allows(ip) && !sh.admin.allows(ip) {
        tracing::warn!(client = %ip, "PAC file request refused: {}", ex.head.target);
        ex.cache_result = Some(super::ACCESS_DENIED);
        let _ = super::reply::error_page(
            &mut ex.out,
            &sh.error_pages,
            StatusCode::FORBIDDEN,
            "Cache access denied",
        )
        .await;
        return Outcome::Close;
    }
    let Some(body) = crate::array::pac_file(&sh.config, ex.local.get(), mode) else {
        let _ = super::reply::error_page(
            &mut ex.out,
            &sh.error_pages,
            StatusCode::NOT_FOUND,
            "no PAC file is configured",
        )
        .await;
        return Outcome::Close;
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(crate::array::pac::CONTENT_TYPE));
    // Browsers keep a PAC file for their session anyway; no-cache makes
    // them (and caches between) ask again whenever they do fetch it.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let _ = ex.out.send_full(StatusCode::OK, headers, Bytes::from(body)).await;
    Outcome::Close
}
