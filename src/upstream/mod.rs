//! The upstream side: origin connections (DNS, TCP, TLS), the pooled HTTP/1.1
//! client (hyper), server groups with round-robin and passive health
//! checks, and clients that go through a parent proxy.

mod body;
mod connect;
pub mod credentials;
mod group;

pub use body::{BodySender, ClientBodyError, ProxyBody};
pub use connect::{ConnectError, ConnectErrorKind, Connector, DnsCache, UpstreamStats, Wire, tls_config};
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
        let connector = Connector::new(Arc::new(tls), cfg);
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
    /// `credentials` (the group's `credentials_file`) go with the `CONNECT`
    /// of every tunnel this client opens through the parent.
    pub fn via_parent(&self, parent: &ServerAddr, credentials: Option<http::HeaderValue>) -> Upstream {
        let connector = self.connector.via_parent(parent.clone(), credentials);
        Upstream {
            client: Self::client(&connector, self.pool_idle_timeout, self.pool_max_idle),
            connector,
            pool_idle_timeout: self.pool_idle_timeout,
            pool_max_idle: self.pool_max_idle,
            first_byte_timeout: self.first_byte_timeout,
            idle_timeout: self.idle_timeout,
        }
    }

    /// [`Upstream::via_parent`], its connections made from the local
    /// address `source` (a proxy array member's own, which the member it
    /// forwards to checks).
    pub fn via_member(&self, member: &ServerAddr, source: Option<std::net::IpAddr>) -> Upstream {
        let connector = self.connector.via_parent(member.clone(), None).with_source(source);
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
    ///
    /// `origin.first_byte_timeout` runs from the moment the whole request
    /// body has gone to the origin (at once for a request without one),
    /// not from the request head: a client uploading slowly is not an
    /// origin answering slowly. While the body goes out, a frame the origin
    /// does not take for `origin.idle_timeout` ends the exchange (504); a
    /// client that sends nothing for that long is cut off by the body
    /// reader's own idle timeout (its error reaches hyper through the body).
    pub async fn send(&self, mut req: http::Request<ProxyBody>) -> Result<http::Response<Incoming>, UpstreamError> {
        use std::sync::atomic::Ordering::Relaxed;
        let connection = hyper_util::client::legacy::connect::capture_connection(&mut req);
        let stats = &self.connector.stats;
        stats.requests.fetch_add(1, Relaxed);
        let stage = crate::stats::stage(crate::stats::Stage::UpstreamResponse);
        let started = std::time::Instant::now();
        let progress = req.body().progress();
        let request = self.client.request(req);
        tokio::pin!(request);
        let answered = loop {
            let changed = progress.changed();
            let ended = progress.ended();
            let limit = if ended {
                self.first_byte_timeout
            } else {
                self.idle_timeout
            };
            tokio::select! {
                r = &mut request => break Ok(r),
                // A frame moved or the body ended: the timers start over.
                () = changed => {}
                () = tokio::time::sleep(limit) => {
                    if ended {
                        break Err(format!(
                            "origin sent no response within {}",
                            humantime::format_duration(limit)
                        ));
                    }
                    if progress.pending() {
                        break Err(format!(
                            "origin took no request body bytes for {}",
                            humantime::format_duration(limit)
                        ));
                    }
                    // Waiting for the client's next bytes: its own timeout applies.
                }
            }
        };
        let result = match answered {
            Err(why) => {
                stats.response_timeouts.fetch_add(1, Relaxed);
                Err(UpstreamError::Timeout(why))
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
    // hyper's own text (`client error (SendRequest): connection closed
    // before message completed`) is for the debug log; pages and warnings
    // get the cause in plain words.
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    let mut hyper_error = None;
    let mut io_error = None;
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        hyper_error = hyper_error.or_else(|| s.downcast_ref::<hyper::Error>());
        io_error = io_error.or_else(|| s.downcast_ref::<std::io::Error>());
        source = s.source();
    }
    tracing::debug!("origin exchange failed: {text}");
    let cause = match (hyper_error, io_error) {
        (Some(h), _) => origin_cause(h, false),
        (None, Some(io)) => format!("the origin connection failed: {}", crate::util::io_cause(io)),
        (None, None) => "the exchange with the origin failed".to_string(),
    };
    UpstreamError::Failed(cause)
}

/// What hyper's error `e` means for an exchange with an origin, in plain
/// words; `in_body` when it happened while the response body arrived.
pub fn origin_cause(e: &hyper::Error, in_body: bool) -> String {
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    let closed_early = io.is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof);
    let text = if e.is_incomplete_message() || closed_early {
        if in_body {
            "the origin closed the connection before the end of the body"
        } else {
            "the origin closed the connection before answering"
        }
    } else if e.is_parse_status() {
        "the origin's response has an invalid status code"
    } else if e.is_parse() {
        // hyper tells a head too large apart only in a server build.
        "the origin's response is not valid HTTP/1.1, or its head is too large"
    } else if e.is_canceled() {
        "the origin connection closed before the request could be sent"
    } else if e.is_body_write_aborted() {
        "sending the request body to the origin was cut short"
    } else if let Some(io) = io {
        return format!("the origin connection failed: {}", crate::util::io_cause(io));
    } else if e.is_closed() {
        "the origin closed the connection"
    } else if in_body {
        "reading the response body from the origin failed"
    } else {
        "the exchange with the origin failed"
    };
    text.to_string()
}
