//! The route step: the compiled `[[rule]]`s' verdict (a [`Route`]) on a
//! classified request or a CONNECT, and the URL a rewrite makes.

use super::classify::{self, Target, classify};
use super::{ListenerHandler, Shared, reply};
use crate::http1::Exchange;
use crate::rules::Route;

/// `uri` with its path and query replaced by `path_and_query`, if given
/// (a rule's rewrite); None if the result is not a valid URI.
pub(super) fn with_path(uri: http::Uri, path_and_query: Option<String>) -> Option<http::Uri> {
    let Some(pq) = path_and_query else {
        return Some(uri);
    };
    let mut parts = uri.into_parts();
    parts.path_and_query = Some(pq.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

impl ListenerHandler {
    /// The routing rules' verdict on `target`.
    pub(super) fn route(&self, ex: &Exchange<'_>, sh: &Shared, target: &classify::HttpTarget) -> Route {
        sh.rules.route(&crate::rules::Request {
            method: &ex.head.method,
            scheme: target.scheme,
            host: &target.host,
            port: target.port,
            path_and_query: &target.path_and_query,
            client: ex.peer.ip(),
            headers: &ex.head.headers,
            mode: self.mode,
        })
    }

    /// The rules' verdict on a CONNECT to `host:port`
    /// ([`crate::rules::Request::tunnel`]). Of its actions, `deny` refuses
    /// the tunnel, `redirect` is refused (a tunnel cannot be redirected),
    /// `response_headers` edit the answer, an `upstream` naming a
    /// `parent = true` group tunnels through a parent, `request_rate` and
    /// `total_request_rate` count the CONNECT, and `bandwidth` paces what the tunnel carries
    /// to the client; the others (an
    /// upstream that is not a parent group, rewrites, request headers,
    /// cache settings) have nothing to act on.
    pub(super) fn tunnel_route(&self, ex: &Exchange<'_>, sh: &Shared, host: &str, port: u16) -> Route {
        if sh.rules.is_empty() {
            return Route::default();
        }
        let host = crate::rules::tunnel_host(host);
        sh.rules.route(&crate::rules::Request::tunnel(
            &host,
            port,
            ex.peer.ip(),
            &ex.head.headers,
            self.mode,
        ))
    }

    /// For a request that found every service place taken, before it
    /// waits in the connection queue: its route's busy page, if its rules
    /// name one (`busy_body`), and Err when its route's `request_rate`
    /// has no request for its client now, or its `total_request_rate`
    /// none for anyone (it is refused at once rather than after its wait;
    /// [`crate::rules::Route::check_rates_ahead`] takes nothing, the
    /// request is counted once it is routed for good).
    /// Only this path pays for routing twice.
    pub(super) fn route_before_queue(
        &self,
        ex: &Exchange<'_>,
        sh: &Shared,
    ) -> Result<Option<reply::BusyPage>, crate::client_rate::RouteRefusal> {
        // A tunnel's busy page is the listener's: `busy_body` is not one
        // of the actions a CONNECT takes.
        let (route, tunnel) = match classify(&ex.head, self.mode, self.tls) {
            Ok(Target::Http(target)) => (self.route(ex, sh, &target), false),
            Ok(Target::Tunnel { host, port }) => (self.tunnel_route(ex, sh, &host, port), true),
            _ => return Ok(None),
        };
        // A rule's own answer (deny, redirect) comes first, as it will.
        if route.deny.is_none() && route.redirect.is_none() {
            route.check_rates_ahead(ex.peer.ip())?;
        }
        Ok(route
            .busy_body
            .filter(|_| !tunnel)
            .map(|body| self.busy.with_body(body)))
    }
}
