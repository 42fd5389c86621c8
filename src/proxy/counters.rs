//! `GET /.portico/counters`: every connection-handling counter as JSON,
//! for `access.admin_allow` clients only. A stop-gap until the monitoring
//! views (perfdump, stats-xml, /metrics) exist; they read the same snapshots.
//!
//! It answers only an origin-form request addressed to the listener itself
//! (on a forward listener, where origin-form requests are otherwise
//! refused, any Host; elsewhere a Host naming the listener's own address),
//! so it never shadows a path of a proxied site. It bypasses admission: the
//! counters must be readable when the server is saturated. Its connection
//! is closed after the answer and left out of the keep-alive counters, so
//! reading the counters does not move them.

use super::Shared;
use crate::admit::ConnectionQueue;
use crate::blocking::NativePool;
use crate::config::Mode;
use crate::http1::{Exchange, Outcome};
use crate::keepalive::KeepAliveInfo;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde::Serialize;

/// The path of the endpoint.
pub const PATH: &str = "/.portico/counters";

/// Everything the endpoint reports.
#[derive(Debug, Serialize)]
pub struct Counters {
    /// Admission and the connection queue.
    pub connection_queue: ConnectionQueue,
    /// The keep-alive subsystem.
    pub keepalive: KeepAliveInfo,
    /// The blocking pool (disk I/O).
    pub blocking_pool: NativePool,
}

impl Counters {
    /// The counters of `sh` now.
    pub fn of(sh: &Shared) -> Counters {
        Counters {
            connection_queue: sh.admission.snapshot(),
            keepalive: sh.keepalive.snapshot(),
            blocking_pool: sh.blocking.snapshot(),
        }
    }
}

/// Whether this request is for the endpoint.
pub fn wanted(ex: &Exchange<'_>, mode: Mode) -> bool {
    let path = ex.head.target.split('?').next().unwrap_or("");
    if path != PATH || (ex.head.method != Method::GET && ex.head.method != Method::HEAD) {
        return false;
    }
    if mode == Mode::Forward {
        return true;
    }
    let host = ex.head.headers.get(http::header::HOST).and_then(|h| h.to_str().ok());
    host.is_some_and(|h| {
        h.eq_ignore_ascii_case(&ex.local.to_string())
            || h.strip_prefix("localhost:")
                .is_some_and(|port| port == ex.local.port().to_string())
    })
}

/// Answers the request: the JSON, or 403 for a client not in `admin_allow`.
pub async fn serve(ex: &mut Exchange<'_>, sh: &Shared) -> Outcome {
    ex.out.close_after();
    if !sh.admin.allows(ex.peer.ip()) {
        let _ = super::reply::error_page(
            &mut ex.out,
            StatusCode::FORBIDDEN,
            "administrative functions are not allowed from this address",
        )
        .await;
        return Outcome::Close;
    }
    let body = match serde_json::to_vec_pretty(&Counters::of(sh)) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            let _ = super::reply::error_page(&mut ex.out, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()).await;
            return Outcome::Close;
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let _ = ex.out.send_full(StatusCode::OK, headers, body).await;
    Outcome::Close
}
