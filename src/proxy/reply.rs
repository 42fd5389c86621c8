//! Responses Portico makes itself: error pages and the `Max-Forwards: 0`
//! answers to TRACE and OPTIONS.

use crate::http1::{Exchange, Outcome, ResponseWriter};
use bytes::Bytes;
use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

/// Sends a short HTML error page naming the reason.
pub async fn error_page(out: &mut ResponseWriter<'_>, status: StatusCode, reason: &str) -> std::io::Result<()> {
    let title = format!("{} {}", status.as_u16(), status.canonical_reason().unwrap_or("Error"));
    let body = format!(
        "<!DOCTYPE html>\n<html><head><title>{title}</title></head>\n<body><h1>{title}</h1>\n<p>{}</p>\n<hr><address>portico</address></body></html>\n",
        crate::util::html_escape(reason)
    );
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    out.send_full(status, headers, Bytes::from(body)).await
}

/// TRACE or OPTIONS with `Max-Forwards: 0`: answered here, not forwarded
/// (RFC 9110 7.6.2).
pub async fn max_forwards_zero(ex: &mut Exchange<'_>) -> Outcome {
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
        headers.insert(
            ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH, CONNECT"),
        );
        Bytes::new()
    };
    match ex.out.send_full(StatusCode::OK, headers, body).await {
        Ok(()) => Outcome::Done,
        Err(_) => Outcome::Close,
    }
}

/// A redirect chosen by a routing rule: `Location` and a short HTML body.
pub async fn redirect(ex: &mut Exchange<'_>, redirect: &crate::rules::Redirect) -> Outcome {
    let Ok(location) = HeaderValue::from_str(&redirect.location) else {
        let reason = "a routing rule produced an invalid redirect location";
        return match error_page(&mut ex.out, StatusCode::INTERNAL_SERVER_ERROR, reason).await {
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
