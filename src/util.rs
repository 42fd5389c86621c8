//! Small helpers shared by several stages.

use http::HeaderValue;
use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// The current time as an HTTP-date header value, formatted at most once a
/// second per thread (no lock on the request path).
pub fn http_date_now() -> HeaderValue {
    thread_local! {
        static CACHE: RefCell<(u64, HeaderValue)> =
            const { RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    CACHE.with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.0 != secs {
            let text = httpdate::fmt_http_date(now);
            *cache = (
                secs,
                HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("")),
            );
        }
        cache.1.clone()
    })
}

/// Escapes text for inclusion in HTML.
pub fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether two config values are equal, compared by their `Debug` text (the
/// config types are compared rarely, on a reload, so they need not derive
/// `PartialEq`; their `Debug` output shows every field).
pub fn same_value<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
    format!("{a:?}") == format!("{b:?}")
}
