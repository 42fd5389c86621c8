//! Responses Portico makes itself: error pages, busy (503) pages and the
//! `Max-Forwards: 0` answers to TRACE and OPTIONS.

use super::ErrorPages;
use crate::config::{ListenerConfig, ServerConfig};
use crate::http1::{Exchange, Outcome, ResponseWriter};
use bytes::Bytes;
use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

/// The methods Portico passes on, for `Allow` (RFC 9110 10.2.1).
const ALLOW_ALL: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH, CONNECT";
/// The same without TRACE, when `proxy.allow_trace` is off.
const ALLOW_NO_TRACE: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, CONNECT";

/// Sends the error page for `status` (`pages`: the built-in one or
/// `[error_pages]`'s) saying the reason.
pub async fn error_page(
    out: &mut ResponseWriter<'_>,
    pages: &ErrorPages,
    status: StatusCode,
    reason: &str,
) -> std::io::Result<()> {
    error_page_with(out, pages, status, reason, HeaderMap::new()).await
}

/// [`error_page`] with extra header fields (`Allow` for a 405).
pub async fn error_page_with(
    out: &mut ResponseWriter<'_>,
    pages: &ErrorPages,
    status: StatusCode,
    reason: &str,
    mut headers: HeaderMap,
) -> std::io::Result<()> {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    out.send_full(status, headers, pages.body(status, reason)).await
}

/// Asks the client to authenticate, with a Basic challenge (RFC 7617):
/// the answer to missing or wrong credentials (`[auth]`) and to an
/// `[[acl]]` entry that needs a user when the request has none
/// (`acl::Decision::NeedAuth`), so every challenge Portico makes has the
/// same shape.
///
/// `proxy` (forward and transparent listeners, and every CONNECT) gives
/// 407 with `Proxy-Authenticate`, which browsers answer with
/// `Proxy-Authorization`; a reverse listener, where the client believes it
/// talks to the origin, gives 401 with `WWW-Authenticate` (RFC 9110 11.6,
/// 11.7). `realm` is `[auth] realm`, checked at load time to need no
/// escaping.
pub async fn auth_required(
    out: &mut ResponseWriter<'_>,
    pages: &ErrorPages,
    proxy: bool,
    realm: &str,
    reason: &str,
) -> Outcome {
    let (status, name) = if proxy {
        (
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            http::header::PROXY_AUTHENTICATE,
        )
    } else {
        (StatusCode::UNAUTHORIZED, http::header::WWW_AUTHENTICATE)
    };
    let mut headers = HeaderMap::new();
    let challenge = HeaderValue::from_str(&format!("Basic realm=\"{realm}\", charset=\"UTF-8\""))
        .unwrap_or_else(|_| HeaderValue::from_static("Basic realm=\"Portico\""));
    headers.insert(name, challenge);
    match error_page_with(out, pages, status, reason, headers).await {
        Ok(()) => Outcome::Done,
        Err(_) => Outcome::Close,
    }
}

/// The reason on a challenge's page: browsers show their password prompt,
/// not the page, so it is short.
pub const AUTH_REQUIRED: &str = "Authentication required: this proxy needs a valid user name and password.";

/// What a client is told when credentials cannot be checked. The cause
/// (a file path, the system's error) is for the operator, in the error
/// log: a client of the proxy has no business learning the server's paths.
pub const AUTH_UNAVAILABLE: &str =
    "the proxy cannot check credentials right now (its user directory is unavailable); try again later";

/// 503 when credentials cannot be checked (the user file is missing or
/// unreadable): not a challenge, so a browser does not loop asking for a
/// password that cannot help. The page says so in general words
/// ([`AUTH_UNAVAILABLE`]); the cause `why` goes to the error log at debug
/// level (the episode's one warning is `auth::Authenticator`'s).
pub async fn auth_unavailable(ex: &mut Exchange<'_>, pages: &ErrorPages, why: &str) -> Outcome {
    tracing::debug!(client = %ex.peer.ip(), "{} {}: 503, {why}", ex.head.method, ex.head.target);
    match error_page(&mut ex.out, pages, StatusCode::SERVICE_UNAVAILABLE, AUTH_UNAVAILABLE).await {
        Ok(()) => Outcome::Done,
        Err(_) => Outcome::Close,
    }
}

/// TRACE while `proxy.allow_trace` is off: 405 with the methods that are
/// allowed. Nothing of the request is echoed, and nothing is forwarded.
pub async fn trace_refused(ex: &mut Exchange<'_>, pages: &ErrorPages) -> Outcome {
    let mut headers = HeaderMap::new();
    headers.insert(ALLOW, HeaderValue::from_static(ALLOW_NO_TRACE));
    let reason = "TRACE is not allowed on this proxy (proxy.allow_trace = false)";
    match error_page_with(&mut ex.out, pages, StatusCode::METHOD_NOT_ALLOWED, reason, headers).await {
        Ok(()) => Outcome::Done,
        Err(_) => Outcome::Close,
    }
}

/// TRACE or OPTIONS with `Max-Forwards: 0`: answered here, not forwarded
/// (RFC 9110 7.6.2). `allow_trace` (`proxy.allow_trace`) decides whether
/// OPTIONS lists TRACE among the allowed methods.
pub async fn max_forwards_zero(ex: &mut Exchange<'_>, allow_trace: bool) -> Outcome {
    let mut headers = HeaderMap::new();
    let body = if ex.head.method == Method::TRACE {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("message/http"));
        let mut echo = format!("TRACE {} {:?}\r\n", ex.head.target, ex.head.version).into_bytes();
        for (name, value) in &ex.head.headers {
            // Credentials are not echoed back (RFC 9110 9.3.8).
            if name == http::header::AUTHORIZATION
                || name == http::header::PROXY_AUTHORIZATION
                || name == http::header::COOKIE
            {
                continue;
            }
            echo.extend_from_slice(name.as_str().as_bytes());
            echo.extend_from_slice(b": ");
            echo.extend_from_slice(value.as_bytes());
            echo.extend_from_slice(b"\r\n");
        }
        Bytes::from(echo)
    } else {
        let allow = if allow_trace { ALLOW_ALL } else { ALLOW_NO_TRACE };
        headers.insert(ALLOW, HeaderValue::from_static(allow));
        Bytes::new()
    };
    match ex.out.send_full(StatusCode::OK, headers, body).await {
        Ok(()) => Outcome::Done,
        Err(_) => Outcome::Close,
    }
}

/// The body and `Retry-After` of a busy (503) response: what the Sun Java
/// System Web Proxy Server 4's busy function sends when the server cannot
/// take a request now.
#[derive(Debug, Clone)]
pub struct BusyPage {
    body: Bytes,
    retry_after: HeaderValue,
}

impl BusyPage {
    /// A listener's page: its `busy_body`, else the content of its
    /// `busy_file` (read now: an unreadable file fails start-up), else a
    /// short built-in HTML page.
    pub fn for_listener(l: &ListenerConfig, server: &ServerConfig) -> Result<BusyPage, String> {
        let secs = server.busy_retry_after.get().as_secs_f64().ceil() as u64;
        let body = if !l.busy_body.is_empty() {
            Bytes::from(l.busy_body.clone())
        } else if !l.busy_file.as_os_str().is_empty() {
            std::fs::read(&l.busy_file).map(Bytes::from).map_err(|e| {
                format!(
                    "listener {}: cannot read busy_file {}: {e}",
                    l.address,
                    l.busy_file.display()
                )
            })?
        } else {
            Bytes::from(format!(
                "<!DOCTYPE html>\n<html><head><title>503 Service Unavailable</title></head>\n<body><h1>503 Service Unavailable</h1>\n<p>The server is busy. Please try again in {secs} seconds.</p>\n<hr><address>portico</address></body></html>\n"
            ))
        };
        Ok(BusyPage {
            body,
            retry_after: HeaderValue::from(secs),
        })
    }
}

impl BusyPage {
    /// This page with another body (a route's `busy_body`), same `Retry-After`.
    pub fn with_body(&self, body: Bytes) -> BusyPage {
        BusyPage {
            body,
            retry_after: self.retry_after.clone(),
        }
    }
}

/// Sends a busy response: 503 with `Retry-After`, the body of `route_page`
/// when the request's route names one (the rules engine's hook), else the
/// listener's `page`. Whether the connection stays open is the caller's choice.
pub async fn busy(out: &mut ResponseWriter<'_>, page: &BusyPage, route_page: Option<&BusyPage>) -> std::io::Result<()> {
    let page = route_page.unwrap_or(page);
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(RETRY_AFTER, page.retry_after.clone());
    out.send_full(StatusCode::SERVICE_UNAVAILABLE, headers, page.body.clone())
        .await
}

/// A redirect chosen by a routing rule: `Location` and a short HTML body.
pub async fn redirect(ex: &mut Exchange<'_>, pages: &ErrorPages, redirect: &crate::rules::Redirect) -> Outcome {
    let Ok(location) = HeaderValue::from_str(&redirect.location) else {
        let reason = "a routing rule produced an invalid redirect location";
        return match error_page(&mut ex.out, pages, StatusCode::INTERNAL_SERVER_ERROR, reason).await {
            Ok(()) => Outcome::Done,
            Err(_) => Outcome::Close,
        };
    };
    let href = crate::util::html_escape(&redirect.location);
    let body = format!("<!DOCTYPE html>\n<html><body><a href=\"{href}\">{href}</a></body></html>\n");
    let mut headers = HeaderMap::new();
    headers.insert(http::header::LOCATION, location);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    match ex.out.send_full(redirect.status, headers, Bytes::from(body)).await {
        Ok(()) => Outcome::Done,
        Err(_) => Outcome::Close,
    }
}
