//! The `Cache-Status` response field (RFC 9211): one list member per cache
//! a response went through, the cache's identifier with parameters saying
//! what that cache did. Pure: the caller knows what happened and the
//! response's remaining freshness; this writes the member.
//!
//! The parameters written are those a shared cache can state exactly:
//! `hit` (answered without going to the origin), `fwd` (why it went:
//! `miss`, `stale` to validate a stored response, or `request` when the
//! request's own directives sent it), `fwd-status` (the
//! origin's status code), `ttl` (whole seconds of freshness left, 0 or
//! less when stale), `stored` and `collapsed`. Portico cannot tell a URL
//! miss from a Vary miss at the point it answers, so it says `miss`, which
//! RFC 9211 §2.2 provides for exactly that.

use http::{HeaderValue, StatusCode};
use std::fmt::Write as _;

/// What one cache did for one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Member {
    /// Answered from the cache without contacting the origin.
    pub hit: bool,
    /// Why the request went to the origin, when it did.
    pub fwd: Option<Fwd>,
    /// The origin's status code, when the request went to it.
    pub fwd_status: Option<StatusCode>,
    /// Whole seconds the response stays fresh (0 or less: stale).
    pub ttl: Option<i64>,
    /// The response was stored.
    pub stored: bool,
    /// The request was collapsed with another one for the same response.
    pub collapsed: bool,
}

/// The `fwd` parameter's values that Portico uses (RFC 9211 §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fwd {
    /// Nothing stored could answer the request.
    Miss,
    /// A stored response was found stale and validated with the origin.
    Stale,
    /// A stored response could have been used, but the request did not
    /// allow it (`no-cache`, `max-age`, `min-fresh`, `no-store`).
    Request,
}

impl Member {
    /// The member for the cache named `id` (a structured-field token,
    /// checked by the configuration: [`is_sf_token`]).
    pub fn value(&self, id: &str) -> HeaderValue {
        let mut s = String::with_capacity(id.len() + 48);
        s.push_str(id);
        if self.hit {
            s.push_str("; hit");
        }
        if let Some(fwd) = self.fwd {
            s.push_str(match fwd {
                Fwd::Miss => "; fwd=miss",
                Fwd::Stale => "; fwd=stale",
                Fwd::Request => "; fwd=request",
            });
        }
        // Writing to a String cannot fail.
        if let Some(code) = self.fwd_status {
            let _ = write!(s, "; fwd-status={}", code.as_u16());
        }
        if let Some(ttl) = self.ttl {
            let _ = write!(s, "; ttl={ttl}");
        }
        if self.stored {
            s.push_str("; stored");
        }
        if self.collapsed {
            s.push_str("; collapsed");
        }
        // A token, "; ", "=", digits and "-" are all visible ASCII.
        HeaderValue::try_from(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
    }
}

/// Whether `s` is a structured-field token (RFC 8941 §3.3.4): a letter or
/// `*`, then letters, digits and `:/!#$%&'*+-.^_`|~`.
pub fn is_sf_token(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'*')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b":/!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hit_parameter_says_the_origin_was_not_contacted() {
        let m = Member {
            hit: true,
            ttl: Some(376),
            ..Member::default()
        };
        assert_eq!(m.value("ExampleCache"), "ExampleCache; hit; ttl=376");
    }

    #[test]
    fn fwd_status_is_the_status_the_next_hop_returned() {
        let m = Member {
            fwd: Some(Fwd::Miss),
            fwd_status: Some(StatusCode::OK),
            stored: true,
            ttl: Some(60),
            ..Member::default()
        };
        assert_eq!(
            m.value("p.example"),
            "p.example; fwd=miss; fwd-status=200; ttl=60; stored"
        );
    }

    #[test]
    fn a_negative_ttl_says_how_long_the_response_has_been_stale() {
        let m = Member {
            fwd: Some(Fwd::Stale),
            fwd_status: Some(StatusCode::NOT_MODIFIED),
            ttl: Some(-5),
            ..Member::default()
        };
        assert_eq!(m.value("c"), "c; fwd=stale; fwd-status=304; ttl=-5");
    }

    #[test]
    fn fwd_request_says_the_request_s_semantics_did_not_allow_a_stored_response() {
        let m = Member {
            fwd: Some(Fwd::Request),
            fwd_status: Some(StatusCode::NOT_MODIFIED),
            ttl: Some(30),
            ..Member::default()
        };
        assert_eq!(m.value("c"), "c; fwd=request; fwd-status=304; ttl=30");
    }

    #[test]
    fn collapsed_says_the_request_shared_another_request_s_forward() {
        let m = Member {
            fwd: Some(Fwd::Miss),
            fwd_status: Some(StatusCode::OK),
            collapsed: true,
            ..Member::default()
        };
        assert_eq!(m.value("c"), "c; fwd=miss; fwd-status=200; collapsed");
    }

    #[test]
    fn the_cache_identifier_is_a_token() {
        assert!(is_sf_token("proxy1.example.com"));
        assert!(is_sf_token("Portico/1"));
        assert!(is_sf_token("*"));
        for bad in ["", "1cache", "two words", "quo\"te", "semi;colon", "caf\u{e9}"] {
            assert!(!is_sf_token(bad), "{bad:?}");
        }
    }
}
