//! The access step: who may use the proxy. The client address allow-lists
//! (CIDR, IPv4 and IPv6), the credentials (`[auth]`) and carrying out the
//! `[[acl]]` decision on a classified request.

use super::{ListenerHandler, Shared, reply};
use crate::config::Mode;
use crate::http1::{Exchange, Outcome};
use http::StatusCode;
use ipnet::IpNet;
use std::net::IpAddr;
use std::sync::Arc;

/// A list of networks; an address is allowed if any network contains it.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    nets: Vec<IpNet>,
}

impl AllowList {
    /// Builds the list from the config's networks.
    pub fn new(nets: &[IpNet]) -> AllowList {
        AllowList { nets: nets.to_vec() }
    }

    /// True if `ip` is inside one of the networks. IPv4-mapped IPv6
    /// addresses (`::ffff:a.b.c.d`, seen on dual-stack listeners) are
    /// checked as the IPv4 address they carry.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

/// The Basic challenge (`reply::auth_required`) with this configuration's
/// realm and error pages; `proxy`: 407 rather than 401.
async fn challenge(ex: &mut Exchange<'_>, sh: &Shared, proxy: bool) -> Outcome {
    reply::auth_required(
        &mut ex.out,
        &sh.error_pages,
        proxy,
        &sh.config.auth.realm,
        reply::AUTH_REQUIRED,
    )
    .await
}

impl ListenerHandler {
    /// The credential step (`[auth]`): reads the listener's credentials
    /// field (`Authorization` on a reverse listener, `Proxy-Authorization`
    /// otherwise, CONNECT included), verifies it, notes the user in
    /// `ex.user` and removes the field so it is never forwarded. `Some` is
    /// the answer when the request goes no further: 407/401 challenge for
    /// missing (with `auth.required`) or wrong credentials, 400 for a
    /// malformed field, 503 when the user file cannot be used.
    pub(super) async fn authenticate(
        &self,
        ex: &mut Exchange<'_>,
        sh: &Shared,
        auth: &Arc<crate::auth::Authenticator>,
    ) -> Option<Outcome> {
        use crate::auth::basic::{Presented, parse};
        let reverse = self.mode == Mode::Reverse;
        let field = if reverse {
            http::header::AUTHORIZATION
        } else {
            http::header::PROXY_AUTHORIZATION
        };
        // Removed whatever it holds: on a reverse listener with `[auth]`
        // the field is Portico's, not the origin's (docs/CONFIG.md).
        let value = ex.head.headers.remove(&field);
        // The field this connection's last request presented and had
        // accepted: no decoding, no hashing of the password, no lock.
        if let Some(v) = &value
            && let Some(user) = auth.remembered(v, &ex.memory.auth)
        {
            ex.user = Some(user);
            return None;
        }
        let presented = match value.as_ref().map(|v| (v, parse(v))) {
            None | Some((_, Ok(Presented::OtherScheme))) => None,
            Some((v, Ok(Presented::Basic(b)))) => Some((v, b)),
            Some((_, Err(why))) => {
                return Some(self.refuse(ex, super::ACCESS_NONE, StatusCode::BAD_REQUEST, why).await);
            }
        };
        let Some((field, creds)) = presented else {
            if sh.config.auth.required || value.is_some() {
                ex.cache_result = Some(super::ACCESS_DENIED);
                return Some(challenge(ex, sh, !reverse).await);
            }
            return None;
        };
        let name = creds.user.clone();
        // Boxed: a verification (the user cache, bcrypt on the blocking
        // pool, an LDAP search and bind) is 4 KB of future state that every
        // request's future would otherwise carry, authenticated or not; the
        // connection's memo above answers most authenticated requests.
        match Box::pin(auth.authenticate_remembering(creds, field, &mut ex.memory.auth, &sh.blocking)).await {
            Ok(user) => {
                ex.user = Some(user);
                None
            }
            Err(crate::auth::Refusal::Invalid) => {
                tracing::debug!(client = %ex.peer.ip(), "{} {}: wrong credentials for user {name:?}", ex.head.method, ex.head.target);
                // Logged as the name presented: Squid and Apache log the
                // user of a refused request too, which is what shows a guesser.
                ex.user = Some(Arc::new(crate::auth::User {
                    name,
                    groups: Vec::new(),
                }));
                ex.cache_result = Some(super::ACCESS_DENIED);
                Some(challenge(ex, sh, !reverse).await)
            }
            Err(crate::auth::Refusal::Unavailable(why)) => {
                // Not `fail`: the error log has the episode's one line
                // already (auth::Authenticator::check_files).
                ex.cache_result = Some(super::ACCESS_NONE);
                Some(reply::auth_unavailable(ex, &sh.error_pages, &why).await)
            }
        }
    }

    /// Carries out the ACL's `decision` (`[[acl]]`): None lets the request
    /// go on; a deny answers with its status and reason page (counted in
    /// the statistics as `acl_denied`); an entry that needs a user answers
    /// with a challenge (407 on forward and transparent listeners and for
    /// CONNECT, 401 on reverse ones).
    pub(super) async fn enforce(
        &self,
        ex: &mut Exchange<'_>,
        sh: &Shared,
        decision: crate::acl::Decision,
        tunnel: bool,
    ) -> Option<Outcome> {
        match decision {
            crate::acl::Decision::Allow { .. } => None,
            crate::acl::Decision::Deny { entry, status, reason } => {
                sh.stats.acl_denied();
                let by = entry.map_or_else(|| "access.acl_default".to_string(), |i| format!("acl[{i}]"));
                tracing::info!(client = %ex.peer.ip(), "{} {}: denied by {by}", ex.head.method, ex.head.target);
                ex.cache_result = Some(super::ACCESS_DENIED);
                Some(
                    match reply::error_page(&mut ex.out, &sh.error_pages, status, &reason).await {
                        Ok(()) => Outcome::Done,
                        Err(_) => Outcome::Close,
                    },
                )
            }
            crate::acl::Decision::NeedAuth { entry } => {
                tracing::debug!(client = %ex.peer.ip(), "{} {}: acl[{entry}] needs an authenticated user", ex.head.method, ex.head.target);
                let proxy = tunnel || self.mode != Mode::Reverse;
                ex.cache_result = Some(super::ACCESS_DENIED);
                Some(challenge(ex, sh, proxy).await)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_v4_and_v6() {
        let list = AllowList::new(&[
            "127.0.0.0/8".parse().unwrap(),
            "::1/128".parse().unwrap(),
            "192.168.1.0/24".parse().unwrap(),
        ]);
        assert!(list.allows("127.0.0.2".parse().unwrap()));
        assert!(list.allows("192.168.1.77".parse().unwrap()));
        assert!(!list.allows("192.168.2.1".parse().unwrap()));
        assert!(list.allows("::1".parse().unwrap()));
        assert!(list.allows("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!list.allows("::2".parse().unwrap()));
        assert!(!AllowList::default().allows("127.0.0.1".parse().unwrap()));
    }
}
