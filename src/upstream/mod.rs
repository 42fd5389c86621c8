//! The upstream side: origin connections (DNS, TCP, TLS), the pooled HTTP/1.1
//! client (hyper), server groups with round-robin and passive health
//! checks, and clients that go through a parent proxy.

mod body;
mod connect;
mod group;

pub use body::{BodySender, ClientBodyError, ProxyBody};
pub use connect::{ConnectError, ConnectErrorKind, Connector, DnsCache, UpstreamStats, tls_config};
pub use group::{Group, ServerAddr};

use crate::config::OriginConfig;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;

/// Why an upstream exchange failed before a response head arrived.
#[derive(Debug)]
pub enum UpstreamError {
    /// The origin could not be reached.
    Connect(ConnectError),
    /// The origin did not answer in time.
    Timeout(String),
    /// The origin broke the exchange (closed, sent garbage).
    Failed(String),
    /// The client's request body failed while being forwarded.
    ClientBody(ClientBodyError),
}

impl UpstreamError {
    /// True when nothing reached the origin, so retrying elsewhere is safe.
    pub fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect(_))
    }
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => e.fmt(f),
            UpstreamError::Timeout(s) | UpstreamError::Failed(s) => f.write_str(s),
            UpstreamError::ClientBody(e) => e.fmt(f),
        }
    }
}

/// The pooled client every request to an origin goes through.
pub struct Upstream {
    client: Client<Connector, ProxyBody>,
    connector: Connector,
    pool_idle_timeout: Duration,
    pool_max_idle: usize,
    first_byte_timeout: Duration,
    /// Longest silence allowed while a response body arrives.
    pub idle_timeout: Duration,
}

impl Upstream {
    /// Builds the client from `[origin]`.
    pub fn new(cfg: &OriginConfig) -> Result<Upstream, String> {
        let tls = tls_config(cfg.system_roots, cfg.ca_file.as_deref())?;
        let connector = Connector::new(Arc::new(tls), cfg.connect_timeout.get(), cfg.dns_cache_entries);
        Ok(Upstream {
            client: Self::client(&connector, cfg.pool_idle_timeout.get(), cfg.pool_max_idle),
            connector,
            pool_idle_timeout: cfg.pool_idle_timeout.get(),
            pool_max_idle: cfg.pool_max_idle,
            first_byte_timeout: cfg.first_byte_timeout.get(),
            idle_timeout: cfg.idle_timeout.get(),
        })
    }

    fn client(connector: &Connector, idle: Duration, max_idle: usize) -> Client<Connector, ProxyBody> {
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(idle)
            .pool_max_idle_per_host(max_idle)
            .pool_timer(TokioTimer::new())
            .build(connector.clone())
    }

    /// A client with the same settings and counters whose every connection
    /// goes to the parent proxy `parent`: requests keep the origin's
    /// absolute URI, sent in absolute form for `http` origins, through a
    /// `CONNECT` tunnel for `https` ones. One such client per parent server
    /// keeps each pooled connection tied to the parent it was opened to
    /// (hyper pools by the request's scheme and authority, the origin's).
    pub fn via_parent(&self, parent: &ServerAddr) -> Upstream {
        let connector = self.connector.via_parent(parent.clone());
        Upstream {
            client: Self::client(&connector, self.pool_idle_timeout, self.pool_max_idle),
            connector,
            pool_idle_timeout: self.pool_idle_timeout,
            pool_max_idle: self.pool_max_idle,
            first_byte_timeout: self.first_byte_timeout,
            idle_timeout: self.idle_timeout,
        }
    }

    /// The connector, for CONNECT tunnels.
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// Counters and the DNS cache.
    pub fn stats(&self) -> (&UpstreamStats, &DnsCache) {
        (&self.connector.stats, &self.connector.dns)
    }

    /// Sends `req` (absolute URI) and waits for the response head.
    pub async fn send(&self, mut req: http::Request<ProxyBody>) -> Result<http::Response<Incoming>, UpstreamError> {
        use std::sync::atomic::Ordering::Relaxed;
        let connection = hyper_util::client::legacy::connect::capture_connection(&mut req);
        let stats = &self.connector.stats;
        stats.requests.fetch_add(1, Relaxed);
        let stage = crate::stats::stage(crate::stats::Stage::UpstreamResponse);
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(self.first_byte_timeout, self.client.request(req)).await {
            Err(_) => {
                stats.response_timeouts.fetch_add(1, Relaxed);
                Err(UpstreamError::Timeout(format!(
                    "origin sent no response within {}",
                    humantime::format_duration(self.first_byte_timeout)
                )))
            }
            Ok(Ok(resp)) => {
                stats.responses.fetch_add(1, Relaxed);
                stats.first_byte_time.record(started.elapsed());
                Ok(resp)
            }
            Ok(Err(e)) => {
                let e = classify(e);
                // Connect failures were counted by the connector.
                if !e.is_connect() {
                    stats.other_errors.fetch_add(1, Relaxed);
                }
                Err(e)
            }
        };
        drop(stage);
        result.and_then(|resp| refuse_ambiguous_framing(resp, &connection))
    }
}

/// A response with both `Transfer-Encoding` and `Content-Length` "might
/// indicate an attempt to perform request smuggling or response splitting
/// and ought to be handled as an error" (RFC 9112 6.3): hyper reads it as
/// chunked and would then reuse the connection, although the origin (or
/// whatever sits in front of it) may have meant the length, and the bytes
/// after it would be read as the answer to the next request, whoever sent
/// it. So, like nginx, Portico answers 502 instead (nothing of it is
/// passed on, nothing stored), and poisons the connection so the pool
/// never hands it out again: dropping the unread body closes it.
fn refuse_ambiguous_framing(
    resp: http::Response<Incoming>,
    connection: &hyper_util::client::legacy::connect::CaptureConnection,
) -> Result<http::Response<Incoming>, UpstreamError> {
    let headers = resp.headers();
    if !(headers.contains_key(http::header::TRANSFER_ENCODING) && headers.contains_key(http::header::CONTENT_LENGTH)) {
        return Ok(resp);
    }
    if let Some(connected) = connection.connection_metadata().as_ref() {
        connected.poison();
    }
    Err(UpstreamError::Failed(
        "the origin sent a response with both Content-Length and Transfer-Encoding (refused: RFC 9112 6.3)".into(),
    ))
}

/// Finds what really went wrong inside hyper's error chain.
fn classify(e: hyper_util::client::legacy::Error) -> UpstreamError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<ConnectError>() {
            return UpstreamError::Connect(ConnectError {
                kind: c.kind,
                target: c.target.clone(),
                detail: c.detail.clone(),
            });
        }
        if let Some(b) = s.downcast_ref::<body::ClientBodyError>() {
            return UpstreamError::ClientBody(b.clone());
        }
        source = s.source();
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    UpstreamError::Failed(text)
}
