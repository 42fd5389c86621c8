//! The request pipeline: access check, classify and route, then forward to
//! an origin (or tunnel), and log. One [`ListenerHandler`] per listener.

mod cached;
mod forward;
mod headers;
mod purge;

pub use purge::purge_running;
mod reply;
mod tunnel;

use crate::access::AllowList;
use crate::config::{Config, Mode};
use crate::http1::{Exchange, Handler, Outcome, RejectInfo};
use crate::log::{AccessLog, AccessRecord};
use crate::route::{Target, classify};
use crate::rules::Rules;
use crate::upstream::{Group, Upstream};
use http::{Method, StatusCode};
use std::sync::Arc;

/// Everything built from the config that requests share.
pub struct Shared {
    /// The configuration in force.
    pub config: Config,
    allow: AllowList,
    admin: AllowList,
    /// The compiled `[[rule]]`s.
    pub rules: Rules,
    groups: Vec<Group>,
    upstream: Upstream,
    access_log: AccessLog,
    /// The HTTP cache, unless `cache.enabled = false`.
    pub cache: Option<crate::cache::Cache>,
}

impl Shared {
    /// Builds the shared state; fails on a resource that cannot be opened.
    pub fn new(config: Config) -> Result<Shared, String> {
        let groups = config.upstream.iter().map(Group::new).collect::<Result<Vec<_>, _>>()?;
        // Groups are built in config order, which is how rules name them.
        let rules = Rules::compile(&config).map_err(|e| e.to_string())?;
        Ok(Shared {
            allow: AllowList::new(&config.access.allow),
            admin: AllowList::new(&config.access.admin_allow),
            rules,
            groups,
            upstream: Upstream::new(&config.origin)?,
            access_log: AccessLog::open(&config.log.access, config.log.format)?,
            cache: if config.cache.enabled {
                let overrides: Vec<_> = config.rule.iter().map(|r| r.cache.clone()).collect();
                Some(crate::cache::Cache::new(&config.cache, &overrides)?)
            } else {
                None
            },
            config,
        })
    }
}

/// Serves the requests of one listener.
pub struct ListenerHandler {
    /// forward | reverse | transparent.
    pub mode: Mode,
    /// State shared by all listeners.
    pub shared: Arc<Shared>,
}

impl Handler for ListenerHandler {
    async fn handle(&self, ex: &mut Exchange<'_>) -> Outcome {
        let outcome = self.serve(ex).await;
        self.log(ex);
        outcome
    }

    async fn reject(&self, mut rej: RejectInfo<'_>) {
        tracing::warn!(client = %rej.peer.ip(), status = rej.error.status.as_u16(), "rejected request: {} ({:?})", rej.error.reason, rej.first_line);
        let _ = reply::error_page(&mut rej.out, rej.error.status, rej.error.reason).await;
        let line = if rej.first_line.is_empty() {
            "-".to_string()
        } else {
            rej.first_line.clone()
        };
        self.shared.access_log.record(&AccessRecord {
            client: rej.peer.ip(),
            user: None,
            request_line: &line,
            status: rej.error.status.as_u16(),
            bytes: rej.out.body_bytes(),
            referer: None,
            user_agent: None,
        });
    }
}

impl ListenerHandler {
    async fn serve(&self, ex: &mut Exchange<'_>) -> Outcome {
        let sh = &*self.shared;
        if !sh.allow.allows(ex.peer.ip()) {
            return self.fail(ex, StatusCode::FORBIDDEN, "Cache access denied").await;
        }
        if headers::via_contains(&ex.head.headers, &sh.config.proxy.via) {
            return self
                .fail(
                    ex,
                    StatusCode::LOOP_DETECTED,
                    "forwarding loop detected (our Via entry is already in the request)",
                )
                .await;
        }
        if (ex.head.method == Method::TRACE || ex.head.method == Method::OPTIONS)
            && headers::max_forwards(&ex.head.headers) == Some(0)
        {
            return reply::max_forwards_zero(ex).await;
        }
        let max_body = sh.config.limits.max_body_size.bytes();
        if let crate::http1::BodyFraming::Length(n) = ex.head.body
            && max_body > 0
            && n > max_body
        {
            return self
                .fail(
                    ex,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body exceeds limits.max_body_size",
                )
                .await;
        }
        let target = match classify(&ex.head, self.mode) {
            Ok(Target::Tunnel { host, port }) => return tunnel::run(ex, sh, &host, port).await,
            Ok(Target::Http(t)) => t,
            Err((status, reason)) => return self.fail(ex, status, reason).await,
        };
        let mut route = sh.rules.route(&crate::rules::Request {
            method: &ex.head.method,
            scheme: target.scheme,
            host: &target.host,
            port: target.port,
            path_and_query: &target.path_and_query,
            client: ex.peer.ip(),
            headers: &ex.head.headers,
            mode: self.mode,
        });
        ex.out.edit_headers(std::mem::take(&mut route.response_headers));
        if let Some(status) = route.deny {
            return self.fail(ex, status, "denied by a routing rule").await;
        }
        if let Some(redirect) = &route.redirect {
            return reply::redirect(ex, redirect).await;
        }
        for e in &route.request_headers {
            e.apply(&mut ex.head.headers);
        }
        let path_and_query = match route.path_and_query.take() {
            Some(pq) if pq.parse::<http::uri::PathAndQuery>().is_err() => {
                return self
                    .fail(
                        ex,
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "a routing rule rewrote the URL into an invalid one",
                    )
                    .await;
            }
            Some(pq) => Some(pq),
            None => None,
        };
        let to = match (route.upstream, target.origin) {
            (Some(group), _) => forward::To::Group {
                group,
                path_and_query: path_and_query.unwrap_or(target.path_and_query),
                public_host: target.authority,
            },
            (None, Some(uri)) => match path_and_query {
                None => forward::To::Origin(uri),
                Some(pq) => {
                    let mut parts = uri.into_parts();
                    parts.path_and_query = pq.parse().ok();
                    match http::Uri::from_parts(parts) {
                        Ok(uri) => forward::To::Origin(uri),
                        Err(_) => {
                            return self
                                .fail(
                                    ex,
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                    "a routing rule rewrote the URL into an invalid one",
                                )
                                .await;
                        }
                    }
                }
            },
            (None, None) => {
                return self
                    .fail(ex, StatusCode::NOT_FOUND, "no route matches this host and path")
                    .await;
            }
        };
        let dest = forward::Dest {
            to,
            cache_rule: route.cache_rule,
        };
        let result = if purge::is_purge(&ex.head.method) {
            purge::purge(ex, sh, &dest).await
        } else {
            cached::serve(ex, &self.shared, dest).await
        };
        match result {
            Ok(()) => Outcome::Done,
            Err((status, reason)) => self.fail(ex, status, &reason).await,
        }
    }

    /// Answers with an error page (unless a response is already under way)
    /// and writes the reason to the error log.
    async fn fail(&self, ex: &mut Exchange<'_>, status: StatusCode, reason: &str) -> Outcome {
        tracing::warn!(client = %ex.peer.ip(), status = status.as_u16(), "{} {}: {reason}", ex.head.method, ex.head.target);
        if ex.out.head_sent() {
            return Outcome::Close;
        }
        if status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE {
            ex.out.close_after();
        }
        match reply::error_page(&mut ex.out, status, reason).await {
            Ok(()) => Outcome::Done,
            Err(_) => Outcome::Close,
        }
    }

    fn log(&self, ex: &Exchange<'_>) {
        let h = &ex.head;
        let version = if h.version == http::Version::HTTP_10 {
            "HTTP/1.0"
        } else {
            "HTTP/1.1"
        };
        let request_line = format!("{} {} {version}", h.method, h.target);
        let header = |name: http::header::HeaderName| h.headers.get(name).and_then(|v| v.to_str().ok());
        self.shared.access_log.record(&AccessRecord {
            client: ex.peer.ip(),
            user: None,
            request_line: &request_line,
            status: ex.out.status().map_or(0, |s| s.as_u16()),
            bytes: ex.out.body_bytes(),
            referer: header(http::header::REFERER),
            user_agent: header(http::header::USER_AGENT),
        });
    }
}
