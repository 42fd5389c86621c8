//! The upstream side: origin connections (DNS, TCP, TLS), Portico's own
//! pooled HTTP/1.1 client, server groups with round-robin and passive
//! health checks, and clients that go through a parent proxy.

mod body;
mod caps;
mod client;
mod connect;
pub mod credentials;
mod group;
pub mod response;

pub use body::{BodyProgress, BodySender, ClientBodyError, ProxyBody};
pub use caps::{Place, ServerLoad};
pub use client::{OnInterim, OriginBody, idle_connections};
pub use connect::{ConnectError, ConnectErrorKind, Connector, Destinations, DnsCache, UpstreamStats, Wire, tls_config};
pub use group::{Group, ServerAddr};

use crate::config::OriginConfig;
use caps::OriginCaps;
use client::Client;
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
    /// Every place at the origin (`origin.max_connections`) stayed taken
    /// for `origin.queue_timeout`: nothing was sent.
    Queue(String),
    /// The client went away while the request waited for a place at its
    /// server: nothing was sent, and no one is left to answer.
    Abandoned,
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
            UpstreamError::Timeout(s) | UpstreamError::Failed(s) | UpstreamError::Queue(s) => f.write_str(s),
            UpstreamError::ClientBody(e) => e.fmt(f),
            UpstreamError::Abandoned => {
                f.write_str("the client went away while its request waited for a connection place")
            }
        }
    }
}

/// A request's own cap on the connections in use to its server, in its
/// extensions: its `[[upstream]]` group's `max_connections`, which
/// overrides `origin.max_connections` (caps.rs: the group's places at a
/// server are counted apart from every other request's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerCap {
    /// Connections in use at once (0: no cap).
    pub limit: usize,
    /// The group (its index among the `[[upstream]]` groups).
    pub group: usize,
}

/// A request's place at its server ([`Upstream::reserve`]).
pub enum Reservation {
    /// Taken, or None when no cap applies: the request may go now.
    Ready(Option<Place>),
    /// Every place is taken: the place to wait for, in line
    /// ([`Upstream::wait_for_place`], [`Upstream::wait_unless`]).
    Waiting(Place),
}

/// A request's extension: its origin is dialled at this address, not at
/// those its name resolves to (a transparent listener's redirected
/// request, `proxy::intercepted`); a pooled connection is reused for it
/// only if it goes to this address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned(pub std::net::SocketAddr);

/// The pooled client every request to an origin goes through.
pub struct Upstream {
    client: Client,
    connector: Connector,
    pool_idle_timeout: Duration,
    pool_max_idle: usize,
    first_byte_timeout: Duration,
    /// Longest silence allowed while a response body arrives.
    pub idle_timeout: Duration,
    /// Places per server connected to (`origin.max_connections`), shared
    /// by this client and those made from it for parents.
    caps: Arc<OriginCaps>,
    /// `origin.abort_on_close`: a waiting request whose client leaves is
    /// dropped from the line ([`Upstream::wait_unless`]).
    abort_on_close: bool,
    /// The server this client connects to when it is not the request's
    /// origin: a parent proxy or an array member, whose places it takes.
    server: Option<(bool, Box<str>)>,
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
            caps: OriginCaps::new(cfg.max_connections, cfg.queue_timeout.get()),
            abort_on_close: cfg.abort_on_close,
            server: None,
        })
    }

    /// The addresses `host` resolves to (none when it does not), as a
    /// request to it would find them: `[origin] hosts`, the DNS cache, the
    /// resolver.
    pub async fn resolve(&self, host: &str, port: u16) -> Vec<std::net::SocketAddr> {
        self.connector.resolve(host, port).await.unwrap_or_default()
    }

    fn client(connector: &Connector, idle: Duration, max_idle: usize) -> Client {
        Client::new(connector.clone(), idle, max_idle)
    }

    /// A client with the same settings and counters whose every connection
    /// goes to the parent proxy `parent`: requests keep the origin's
    /// absolute URI, sent in absolute form for `http` origins, through a
    /// `CONNECT` tunnel for `https` ones. One such client per parent server
    /// keeps each pooled connection tied to the parent it was opened to
    /// (the pool is keyed by the request's scheme and authority, the origin's).
    /// `credentials` (the group's `credentials_file`) go with the `CONNECT`
    /// of every tunnel this client opens through the parent.
    pub fn via_parent(&self, parent: &ServerAddr, credentials: Option<http::HeaderValue>) -> Upstream {
        let connector = self.connector.via_parent(parent.clone(), credentials);
        self.through(connector, Some(parent))
    }

    /// [`Upstream::via_parent`], its connections made from the local
    /// address `source` (a proxy array member's own, which the member it
    /// forwards to checks).
    pub fn via_member(&self, member: &ServerAddr, source: Option<std::net::IpAddr>) -> Upstream {
        let connector = self.connector.via_parent(member.clone(), None).with_source(source);
        self.through(connector, Some(member))
    }

    /// The client for the destinations clients choose (a forward or
    /// transparent request's origin, and through [`Upstream::connector`] a
    /// `CONNECT` or SOCKS target): these settings, counters, places and DNS
    /// cache, refusing the addresses `guard` refuses. Its pool is its own,
    /// so a connection opened to a reverse listener's configured server
    /// (`127.0.0.1:8081`, say) is never lent to a client that names it.
    pub fn guarded(&self, guard: Option<Arc<Destinations>>) -> Upstream {
        self.through(self.connector.guarded(guard), None)
    }

    /// See [`Connector::may_have_fetched_from`].
    pub fn may_have_fetched_from(&self, origin: Option<std::net::IpAddr>) -> bool {
        self.connector.may_have_fetched_from(origin)
    }

    /// A client with these settings, counters and places on `connector`,
    /// whose connections all go to `server` when it is set.
    fn through(&self, connector: Connector, server: Option<&ServerAddr>) -> Upstream {
        Upstream {
            client: Self::client(&connector, self.pool_idle_timeout, self.pool_max_idle),
            connector,
            pool_idle_timeout: self.pool_idle_timeout,
            pool_max_idle: self.pool_max_idle,
            first_byte_timeout: self.first_byte_timeout,
            idle_timeout: self.idle_timeout,
            caps: self.caps.clone(),
            abort_on_close: self.abort_on_close,
            server: server.map(|server| {
                (
                    server.scheme == http::uri::Scheme::HTTPS,
                    server.authority.as_str().into(),
                )
            }),
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

    /// Requests waiting now for a place at their server (`origin.max_connections`).
    pub fn waiting(&self) -> u64 {
        self.caps.waiting()
    }

    /// The servers with a place in use or a request waiting under a cap,
    /// busiest first, at most `n`.
    pub fn busy_servers(&self, n: usize) -> Vec<ServerLoad> {
        self.caps.servers(n)
    }

    /// Sends `req` (absolute URI) and waits for the response head: its
    /// place at the server first ([`Upstream::reserve`], waiting in line
    /// if need be), then [`Upstream::send_reserved`].
    pub async fn send(
        &self,
        req: http::Request<ProxyBody>,
        on_interim: Option<OnInterim<'_>>,
    ) -> Result<http::Response<OriginBody>, UpstreamError> {
        let place = match self.reserve(&req) {
            Reservation::Ready(place) => place,
            Reservation::Waiting(place) => self.wait_for_place(place).await?,
        };
        self.send_reserved(req, on_interim, place).await
    }

    /// Takes `req`'s place at the server it goes to (the origin, or the
    /// parent proxy or array member this client goes through) when one is
    /// free (`origin.max_connections`, or the request's [`ServerCap`]);
    /// else says that the request must wait in that server's line. Apart
    /// from the wait, so that a caller can stop waiting when its client
    /// leaves (`proxy::interim`), and so that the future every request
    /// carries holds no timer for a wait few requests make.
    pub fn reserve(&self, req: &http::Request<ProxyBody>) -> Reservation {
        let (https, authority) = match &self.server {
            Some((https, authority)) => (*https, &**authority),
            None => (
                req.uri().scheme() == Some(&http::uri::Scheme::HTTPS),
                req.uri().authority().map_or("", |a| a.as_str()),
            ),
        };
        let cap = req.extensions().get::<ServerCap>().copied();
        match self.caps.take_now(https, authority, cap) {
            Ok(place) => Reservation::Ready(place),
            Err(waiting) => {
                self.connector
                    .stats
                    .queued
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Reservation::Waiting(waiting)
            }
        }
    }

    /// Waits in line for `place` (from [`Upstream::reserve`]), at most
    /// `origin.queue_timeout`; then [`UpstreamError::Queue`].
    pub async fn wait_for_place(&self, place: Place) -> Result<Option<Place>, UpstreamError> {
        // Boxed: the wait's timer stays out of the future that every
        // request carries.
        let waited = Box::pin(self.caps.wait(place)).await;
        waited.map(Some).map_err(|e| {
            self.connector
                .stats
                .queue_timeouts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            UpstreamError::Queue(format!(
                "{} has all its {} connections in use (max_connections) and none was free within {}",
                e.server,
                e.max,
                humantime::format_duration(e.waited)
            ))
        })
    }

    /// [`Upstream::wait_for_place`], unless `gone` (the client's departure)
    /// completes first: then the request leaves the line unsent
    /// ([`UpstreamError::Abandoned`]), as HAProxy's `option abortonclose`
    /// drops a queued request whose client has closed, instead of sending
    /// the origin work no one will read. With `origin.abort_on_close =
    /// false`, `gone` is not watched (a client that half-closes after its
    /// request still waits for the answer).
    pub async fn wait_unless(
        &self,
        place: Place,
        gone: impl std::future::Future<Output = ()>,
    ) -> Result<Option<Place>, UpstreamError> {
        if !self.abort_on_close {
            return self.wait_for_place(place).await;
        }
        tokio::select! {
            biased;
            () = gone => {
                self.connector
                    .stats
                    .queue_abandoned
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(UpstreamError::Abandoned)
            }
            r = self.wait_for_place(place) => r,
        }
    }

    /// Sends `req` holding `place` (from [`Upstream::reserve`] or a wait;
    /// None: no cap applies) and waits for the response head.
    ///
    /// `origin.first_byte_timeout` runs from the moment the whole request
    /// body has gone to the origin (at once for a request without one),
    /// not from the request head: a client uploading slowly is not an
    /// origin answering slowly. While the body goes out, a frame the origin
    /// does not take for `origin.idle_timeout` ends the exchange (504); a
    /// client that sends nothing for that long is cut off by the body
    /// reader's own idle timeout (its error reaches the exchange through
    /// the body). `on_interim` gets the 1xx responses before the final one.
    /// The place goes back when the exchange is over (caps.rs).
    pub async fn send_reserved(
        &self,
        req: http::Request<ProxyBody>,
        on_interim: Option<OnInterim<'_>>,
        place: Option<Place>,
    ) -> Result<http::Response<OriginBody>, UpstreamError> {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = &self.connector.stats;
        stats.requests.fetch_add(1, Relaxed);
        let stage = crate::stats::stage(crate::stats::Stage::UpstreamResponse);
        let started = std::time::Instant::now();
        let progress = req.body().progress();
        let request = self.client.send(req, on_interim, place);
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
                // Connect failures were counted by the connector.
                if !e.is_connect() {
                    tracing::debug!("origin exchange failed: {e}");
                    stats.other_errors.fetch_add(1, Relaxed);
                }
                Err(e)
            }
        };
        drop(stage);
        result
    }
}
