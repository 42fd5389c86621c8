//! Forwarding a request to an origin (directly, to a server of a group, or
//! through a parent proxy) and streaming the response back, with both
//! bodies streamed (never held whole), and retry on another server of a
//! group when a connect fails.

use super::Shared;
use super::headers::{add_via, decrement_max_forwards, forwarded_for, remove_framing_lookalikes, strip_hop_by_hop};
use crate::config::HostHeader;
use crate::http1::RequestHead;
use crate::http1::head::{list_tokens, normalise_content_length};
use crate::http1::{BodyFrame, BodyFraming, BodyLen, BodyReader, Exchange, ResponseWriter};
use crate::upstream::{BodySender, ConnectErrorKind, OriginBody, ProxyBody, Upstream, UpstreamError};
use http::header::{CONTENT_LENGTH, CONTENT_LOCATION, EXPECT, HOST, LOCATION, TE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use std::net::IpAddr;

/// A failure to report to the client as an error page.
pub type Failure = (StatusCode, String);

/// Where a request goes upstream, and the rule whose cache settings apply.
#[derive(Debug, Clone)]
pub struct Dest {
    /// The origin or group.
    pub to: To,
    /// The `[[rule]]` whose `cache = {...}` applies, if any.
    pub cache_rule: Option<usize>,
    /// The `[[acl]]` response entries the response is checked against.
    pub reply: crate::acl::ReplyFilter,
    /// `Proxy-Authorization` for a parent (`To::Parent` only): the group's
    /// `credentials_file`, or the client's own passed on by a rule.
    pub parent_auth: Option<HeaderValue>,
    /// The client's own credentials go to the parent (`parent_credentials =
    /// "pass"`): a 407 from the parent keeps its `Proxy-Authenticate`, so
    /// the client is asked for the parent's password.
    pub relay_challenge: bool,
    /// From a reverse listener: the cache obeys the targeted cache-control
    /// fields (RFC 9213, `CDN-Cache-Control`).
    pub reverse: bool,
    /// The destination exception the request's `[[acl]]` entry grants
    /// (`Acl::reach`; 0 for none): which client fetches a client-chosen
    /// origin, and, when not 0, that the cache neither stores nor shares
    /// what is fetched.
    pub reach: usize,
    /// The address an origin is fetched from whatever its name resolves
    /// to: where a transparent listener's redirected client was
    /// connecting (`intercepted`); None: the name's.
    pub pinned: Option<std::net::SocketAddr>,
}

/// The `Proxy-Authenticate` challenges of a parent's 407 when `relay` (the
/// client's credentials are the ones the parent judges); none otherwise,
/// the field being hop-by-hop.
fn parent_challenge(relay: bool, status: StatusCode, headers: &HeaderMap) -> Vec<HeaderValue> {
    if !relay || status != StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        return Vec::new();
    }
    headers
        .get_all(http::header::PROXY_AUTHENTICATE)
        .iter()
        .cloned()
        .collect()
}

/// [`response_headers`], with the parent's challenges kept when `relay`
/// (see [`Dest::relay_challenge`]).
pub fn response_headers_for(
    headers: HeaderMap,
    status: StatusCode,
    received: Version,
    sh: &Shared,
    rewrite: Option<&LocationRewrite>,
    relay: bool,
) -> HeaderMap {
    let challenge = parent_challenge(relay, status, &headers);
    let mut headers = response_headers(headers, received, sh, rewrite);
    for v in challenge {
        headers.append(http::header::PROXY_AUTHENTICATE, v);
    }
    headers
}

impl Dest {
    /// Adds the parent's credentials to a request going to a parent in
    /// absolute form. Never for anything else: an origin (direct or a
    /// group) must not get proxy credentials, nor an `https` origin reached
    /// through a parent's tunnel (the request inside goes to the origin;
    /// the tunnel's own CONNECT carries the group's fixed credentials).
    fn add_parent_credentials(&self, headers: &mut HeaderMap) {
        if let (To::Parent { origin, .. }, Some(auth)) = (&self.to, &self.parent_auth)
            && origin.scheme() != Some(&http::uri::Scheme::HTTPS)
        {
            headers.insert(http::header::PROXY_AUTHORIZATION, auth.clone());
        }
    }
}

impl Dest {
    /// Marks a request going to an `[array]` member (`Portico-Array: <our
    /// name>`), so that member serves it itself: one hop at most.
    fn add_array_marker(&self, sh: &Shared, attempt: &Attempt, headers: &mut HeaderMap) {
        if let (To::Parent { group, .. }, Some(_), Some(a)) = (&self.to, attempt.server, &sh.array)
            && *group >= a.group_base
            && let Ok(v) = HeaderValue::from_str(&a.members[a.self_index].name)
        {
            headers.insert(crate::array::route::MARKER, v);
        }
    }
}

/// The origin or group a request goes to.
#[derive(Debug, Clone)]
pub enum To {
    /// The origin named by the absolute URI (forward and transparent proxying).
    Origin(Uri),
    /// A server of an upstream group (chosen by a rule).
    Group {
        /// Index into the shared group list.
        group: usize,
        /// Origin-form target.
        path_and_query: String,
        /// The host the client asked for (public name, for Host and Location).
        public_host: String,
    },
    /// The origin named by `origin`, fetched through a parent proxy of a
    /// `parent = true` group (chosen by a rule).
    Parent {
        /// Index into the shared group list.
        group: usize,
        /// The origin's absolute URI, sent to the parent as the request target.
        origin: Uri,
    },
}

/// One try at sending a request: where, with which Host, and how to
/// rewrite the response's Location.
struct Attempt<'a> {
    uri: Uri,
    host: HeaderValue,
    rewrite: Option<LocationRewrite>,
    server: Option<usize>,
    /// The client that sends it: the direct one, or a parent server's.
    upstream: &'a Upstream,
    /// Its group's cap on connections in use per server, if it has one.
    cap: Option<crate::upstream::ServerCap>,
    /// The address the origin is fetched from ([`Dest::pinned`]).
    pinned: Option<std::net::SocketAddr>,
}

impl Attempt<'_> {
    /// The request's parts, marked with the group's cap
    /// (`upstream::ServerCap`) and the origin's address if it is pinned
    /// (`upstream::Pinned`).
    fn mark(&self, parts: &mut http::request::Parts) {
        if let Some(cap) = self.cap {
            parts.extensions.insert(cap);
        }
        if let Some(addr) = self.pinned {
            parts.extensions.insert(crate::upstream::Pinned(addr));
        }
    }
}

impl Dest {
    /// The scheme, authority and path the client asked for (the cache key's parts).
    pub fn public_url(&self) -> (&str, &str, &str) {
        match &self.to {
            To::Origin(uri) | To::Parent { origin: uri, .. } => (
                uri.scheme_str().unwrap_or("http"),
                uri.authority().map_or("", |a| a.as_str()),
                uri.path_and_query().map_or("/", |p| p.as_str()),
            ),
            To::Group {
                path_and_query,
                public_host,
                ..
            } => ("http", public_host, path_and_query),
        }
    }

    /// The upstream group the response comes from, when it is not the
    /// origin the public URL names (a group of origin servers chosen by a
    /// rule): the cache keys the object by it too (`crate::cache::key`).
    /// None for an origin fetched directly or through a parent proxy.
    pub fn fetched_from<'a>(&self, sh: &'a Shared) -> Option<&'a str> {
        match &self.to {
            To::Group { group, .. } => sh.groups.get(*group).map(|g| g.name.as_str()),
            To::Origin(_) | To::Parent { .. } => None,
        }
    }

    /// The next attempt; `failed` is the server whose connect failed last.
    fn attempt<'a>(&self, sh: &'a Shared, failed: Option<usize>) -> Result<Attempt<'a>, Failure> {
        match &self.to {
            To::Origin(uri) => Ok(Attempt {
                host: HeaderValue::from_str(uri.authority().map_or("", |a| a.as_str())).map_err(|_| bad_uri())?,
                uri: uri.clone(),
                rewrite: None,
                server: None,
                upstream: sh.direct_for(self.reach),
                cap: None,
                pinned: self.pinned,
            }),
            // An array member that could not be reached: this node serves
            // the request itself, directly from the origin.
            To::Parent { group, origin } if failed.is_some() && is_array_group(sh, *group) => Ok(Attempt {
                host: HeaderValue::from_str(origin.authority().map_or("", |a| a.as_str())).map_err(|_| bad_uri())?,
                uri: origin.clone(),
                rewrite: None,
                server: None,
                upstream: sh.direct_for(self.reach),
                cap: None,
                pinned: self.pinned,
            }),
            To::Parent { group, origin } => {
                let idx = sh.groups[*group].pick(failed);
                let upstream = sh
                    .parents
                    .get(*group)
                    .and_then(|servers| servers.get(idx))
                    .ok_or_else(|| {
                        (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "parent proxy client missing".to_string(),
                        )
                    })?;
                Ok(Attempt {
                    // The parent fetches the origin: Host is the origin's.
                    host: HeaderValue::from_str(origin.authority().map_or("", |a| a.as_str()))
                        .map_err(|_| bad_uri())?,
                    uri: origin.clone(),
                    rewrite: None,
                    server: Some(idx),
                    upstream,
                    cap: sh.groups[*group]
                        .max_connections
                        .map(|limit| crate::upstream::ServerCap { limit, group: *group }),
                    // The parent resolves the name itself.
                    pinned: None,
                })
            }
            To::Group {
                group: index,
                path_and_query,
                public_host,
            } => {
                let group = &sh.groups[*index];
                let idx = group.pick(failed);
                // Made when the group was built: no formatting per request.
                let preserved = match group.host_header {
                    HostHeader::Preserve if !public_host.is_empty() => HeaderValue::from_str(public_host).ok(),
                    _ => None,
                };
                let host = preserved.unwrap_or_else(|| group.host_value(idx).clone());
                let rewrite = (!public_host.is_empty()).then(|| LocationRewrite {
                    from: group.prefix(idx).clone(),
                    to_host: public_host.clone(),
                });
                Ok(Attempt {
                    uri: group.server(idx).uri(path_and_query).map_err(|_| bad_uri())?,
                    host,
                    rewrite,
                    server: Some(idx),
                    upstream: &sh.upstream,
                    cap: group
                        .max_connections
                        .map(|limit| crate::upstream::ServerCap { limit, group: *index }),
                    pinned: None,
                })
            }
        }
    }

    /// The Squid log's hierarchy field for `attempt`: a parent (the only
    /// one of its group, or one picked round-robin) or the origin server.
    fn hierarchy(&self, sh: &Shared, attempt: &Attempt) -> String {
        match (&self.to, attempt.server) {
            (To::Parent { group, .. }, Some(idx)) => parent_hierarchy(sh, *group, idx),
            _ => ["HIER_DIRECT/", attempt.uri.host().unwrap_or("-")].concat(),
        }
    }

    /// After a failed attempt: marks a group server down on connect
    /// failures and says whether to try another server (once, for an
    /// idempotent request without a body).
    fn retry_after(&self, sh: &Shared, attempt: &Attempt, head: &RequestHead, e: &UpstreamError, tried: bool) -> bool {
        let (To::Group { group, .. } | To::Parent { group, .. }, Some(idx)) = (&self.to, attempt.server) else {
            return false;
        };
        // A parent that answered CONNECT with an error is up: the origin
        // behind it is what failed, and another parent would likely fail too.
        if !e.is_connect() || matches!(e, UpstreamError::Connect(c) if c.kind == ConnectErrorKind::Parent) {
            return false;
        }
        let array_member = is_array_group(sh, *group);
        let group = &sh.groups[*group];
        tracing::warn!(upstream = %group.name, server = %group.server(idx).authority, "marking server down: {e}");
        group.mark_down(idx);
        if array_member {
            // Only GET and HEAD without a body are sent to a member: the
            // retry goes to the origin (`attempt`).
            return !tried;
        }
        !tried
            && group.retry
            && group.len() > 1
            && head.body == BodyFraming::Empty
            && matches!(
                head.method,
                Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
            )
    }
}

/// Forwards the request (its body streamed) and streams the response back.
pub async fn forward(ex: &mut Exchange<'_>, sh: &Shared, dest: &Dest) -> Result<(), Failure> {
    send_upstream(ex, sh, dest, None).await.map(|_| ())
}

/// [`forward`], for an upgrade request too: `upgrade` is the `Upgrade`
/// field to send (the allowed protocols the client offered, see
/// `upgrade::offered`), with `Connection: upgrade`; a `101` answer is then
/// returned unsent, for `upgrade::serve` to relay. Every other answer is
/// streamed back here.
pub async fn send_upstream(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    dest: &Dest,
    upgrade: Option<&HeaderValue>,
) -> Result<Option<http::Response<OriginBody>>, Failure> {
    let mut failed = None;
    loop {
        let attempt = dest.attempt(sh, failed)?;
        ex.hierarchy = Some(dest.hierarchy(sh, &attempt));
        let mut parts = request_parts(
            &ex.head,
            ex.peer.ip(),
            sh,
            asterisk_form(&ex.head, dest, attempt.uri.clone()),
            attempt.host.clone(),
            None,
        )?;
        dest.add_parent_credentials(&mut parts.headers);
        dest.add_array_marker(sh, &attempt, &mut parts.headers);
        attempt.mark(&mut parts);
        if let Some(offer) = upgrade {
            parts.headers.insert(http::header::UPGRADE, offer.clone());
            parts
                .headers
                .insert(http::header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
        match exchange(
            ex,
            sh,
            attempt.upstream,
            parts,
            attempt.rewrite.as_ref(),
            dest,
            upgrade.is_some(),
        )
        .await
        {
            Ok(switched) => return Ok(switched),
            Err(e) => {
                if dest.retry_after(sh, &attempt, &ex.head, &e, failed.is_some()) {
                    failed = attempt.server;
                    continue;
                }
                return Err(failure(e));
            }
        }
    }
}

/// `uri` with the asterisk-form target (`OPTIONS *`) when the client asked
/// about the server as a whole, not about its resource `/` (RFC 9112
/// 3.2.4): with `OPTIONS *`, or with an absolute-form OPTIONS whose URI has
/// an empty path and no query, which the last proxy must send on as
/// `OPTIONS *`. A parent proxy is not the last one: it gets the absolute
/// form, with a `/` path (an absolute URI has no asterisk). A routing rule that
/// rewrote the path wins.
fn asterisk_form(head: &RequestHead, dest: &Dest, uri: Uri) -> Uri {
    let whole_server = head.target == "*"
        || head
            .target
            .split_once("://")
            .is_some_and(|(_, rest)| !rest.contains(['/', '?']));
    if head.method != Method::OPTIONS
        || !whole_server
        || matches!(dest.to, To::Parent { .. })
        || uri.path_and_query().is_some_and(|p| p.as_str() != "/")
    {
        return uri;
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static("*"));
    // The upstream client writes this absolute URI's path in origin form: `*`.
    Uri::from_parts(parts).unwrap_or(uri)
}

/// Whether `group` is one of the `[array]` members' (which follow the
/// configured groups).
fn is_array_group(sh: &Shared, group: usize) -> bool {
    sh.array.as_ref().is_some_and(|a| group >= a.group_base)
}

/// The Squid log's hierarchy field for server `idx` of parent group `group`
/// (`CARP/member` for an array member, as Squid logs its CARP parents).
pub fn parent_hierarchy(sh: &Shared, group: usize, idx: usize) -> String {
    let g = &sh.groups[group];
    if is_array_group(sh, group) {
        return ["CARP/", g.server(idx).authority.host()].concat();
    }
    let code = if g.len() > 1 {
        "ROUNDROBIN_PARENT"
    } else {
        "FIRST_PARENT"
    };
    [code, "/", g.server(idx).authority.host()].concat()
}

/// Sends a request without a body (the client's head, plus `extra` header
/// fields such as validators) and returns the origin's response, with the
/// Location rewrite to apply to it and where it came from (the Squid log's
/// hierarchy field). Used by the cache, also from
/// background revalidation tasks, so it borrows no connection: `out` is the
/// client's response writer when there is a client, for the interim (1xx)
/// responses that come before the final one.
pub async fn fetch(
    sh: &Shared,
    head: &RequestHead,
    client: IpAddr,
    dest: &Dest,
    extra: Option<&HeaderMap>,
    mut out: Option<&mut ResponseWriter<'_>>,
) -> Result<(http::Response<OriginBody>, Option<LocationRewrite>, String), Failure> {
    let mut failed = None;
    loop {
        let attempt = dest.attempt(sh, failed)?;
        let mut parts = request_parts(head, client, sh, attempt.uri.clone(), attempt.host.clone(), extra)?;
        dest.add_parent_credentials(&mut parts.headers);
        attempt.mark(&mut parts);
        let request = Request::from_parts(parts, ProxyBody::empty());
        match super::interim::send(attempt.upstream, request, out.as_deref_mut(), sh).await {
            // This request offered no upgrade (those go through
            // `send_upstream`): the origin would take over a connection no
            // one asked it to.
            Ok(response) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                return Err((
                    StatusCode::BAD_GATEWAY,
                    "the origin answered 101 Switching Protocols to a request that offered no upgrade".into(),
                ));
            }
            Ok(response) => {
                let hierarchy = dest.hierarchy(sh, &attempt);
                return Ok((response, attempt.rewrite, hierarchy));
            }
            Err(e) => {
                if dest.retry_after(sh, &attempt, head, &e, failed.is_some()) {
                    failed = attempt.server;
                    continue;
                }
                return Err(failure(e));
            }
        }
    }
}

/// Rewrites `Location`/`Content-Location` pointing at the origin server
/// back to the public name the client used.
#[derive(Debug, Clone)]
pub struct LocationRewrite {
    /// The server's `scheme://host:port`.
    from: std::sync::Arc<str>,
    /// The host the client asked for: the rewritten URL is `http://` and it.
    to_host: String,
}

impl LocationRewrite {
    /// Rewrites the fields in `headers`.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in [LOCATION, CONTENT_LOCATION] {
            let Some(value) = headers.get(&name).and_then(|v| v.to_str().ok()) else {
                continue;
            };
            let Some(rest) = value.strip_prefix(&*self.from) else {
                continue;
            };
            if !(rest.is_empty() || rest.starts_with('/') || rest.starts_with('?')) {
                continue;
            }
            if let Ok(v) = HeaderValue::from_str(&["http://", &self.to_host, rest].concat()) {
                headers.insert(name, v);
            }
        }
    }
}

fn bad_uri() -> Failure {
    (StatusCode::BAD_REQUEST, "invalid request URI or Host".into())
}

/// The error page status and reason for an upstream failure.
pub fn failure(e: UpstreamError) -> Failure {
    let status = match &e {
        UpstreamError::Connect(c) if c.kind == ConnectErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        UpstreamError::Connect(c) if c.kind == ConnectErrorKind::Loop => StatusCode::LOOP_DETECTED,
        UpstreamError::Connect(c) if c.kind == ConnectErrorKind::Denied => StatusCode::FORBIDDEN,
        UpstreamError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        // As HAProxy answers a request whose server queue timed out.
        UpstreamError::Queue(_) => StatusCode::SERVICE_UNAVAILABLE,
        UpstreamError::ClientBody(b) if b.too_large => StatusCode::PAYLOAD_TOO_LARGE,
        UpstreamError::ClientBody(_) => StatusCode::BAD_REQUEST,
        UpstreamError::Abandoned => client_gone(),
        _ => StatusCode::BAD_GATEWAY,
    };
    (status, e.to_string())
}

/// The status a failure carries when the client went away before anything
/// was sent upstream (nginx logs such a request as 499, "client closed
/// request"): never sent; `Handler::fail` sees it and closes without an
/// error page, and the cache neither serves stale nor tells collapsed
/// requests that the origin failed (it did not).
pub fn client_gone() -> StatusCode {
    StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST)
}

/// True for [`client_gone`]'s status.
pub fn is_client_gone(status: StatusCode) -> bool {
    status.as_u16() == 499
}

/// The request to send upstream: the client's, with hop-by-hop fields
/// removed and Via / X-Forwarded-For / Max-Forwards applied.
fn request_parts(
    head: &RequestHead,
    client: IpAddr,
    sh: &Shared,
    uri: Uri,
    host: HeaderValue,
    extra: Option<&HeaderMap>,
) -> Result<http::request::Parts, Failure> {
    // Built with room for what is added below (Host, Via, X-Forwarded-For,
    // the framing field, validators): a clone of the client's map has no
    // spare room, and growing a `HeaderMap` rehashes and reallocates it.
    let mut headers = HeaderMap::with_capacity(head.headers.len() + 6);
    for (name, value) in &head.headers {
        headers.append(name.clone(), value.clone());
    }
    let accepts_trailers = list_tokens(&headers, &TE).any(|t| t.eq_ignore_ascii_case("trailers"));
    strip_hop_by_hop(&mut headers);
    if accepts_trailers {
        // TE is hop-by-hop, but Portico passes trailers on to this client,
        // so it may say so to the origin on the client's behalf.
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    // The expectation is met hop by hop: Portico sends 100 Continue itself.
    headers.remove(EXPECT);
    // The framing sent upstream is exactly the one Portico read the body
    // by, in one canonical field: never the client's fields as received.
    // Passed through verbatim, `Content-Length: 5, 5` (or `005`, or the
    // field twice) may be read another way by the origin, which then sees
    // other message boundaries on a connection pooled across clients.
    headers.remove(CONTENT_LENGTH);
    match head.body {
        BodyFraming::Length(n) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
        // Said explicitly in the one framing field the body goes out with
        // (the client's own fields were removed as hop-by-hop).
        BodyFraming::Chunked => {
            headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        }
        // A `Content-Length: 0` the client sent (a POST without a body) is
        // kept: some origins refuse a POST without a length (411).
        BodyFraming::Empty if head.headers.contains_key(CONTENT_LENGTH) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        BodyFraming::Empty => {}
    }
    headers.insert(HOST, host);
    add_via(&mut headers, head.version, &sh.config.proxy.via);
    forwarded_for(&mut headers, client, sh.config.proxy.x_forwarded_for);
    super::headers::forwarded(&mut headers, client, sh.config.proxy.x_forwarded_for);
    if let Some(extra) = extra {
        for (name, value) in extra {
            headers.insert(name.clone(), value.clone());
        }
    }
    if head.method == Method::TRACE || head.method == Method::OPTIONS {
        decrement_max_forwards(&mut headers);
    }
    let (mut parts, ()) = Request::builder()
        .method(head.method.clone())
        .uri(uri)
        .version(Version::HTTP_11)
        .body(())
        .map_err(|_| bad_uri())?
        .into_parts();
    parts.headers = headers;
    Ok(parts)
}

/// Sends the request with its body streamed from the client, and streams
/// the response back. An error is returned only while no response head has
/// been sent (so the caller can still answer with an error page or retry).
/// A `101` to a request that offered an upgrade (`upgrading`) is returned
/// unsent; to one that did not, it is an error (the origin would take
/// over a connection no one asked it to).
async fn exchange(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    upstream: &Upstream,
    parts: http::request::Parts,
    rewrite: Option<&LocationRewrite>,
    dest: &Dest,
    upgrading: bool,
) -> Result<Option<http::Response<OriginBody>>, UpstreamError> {
    let (body, sender) = match ex.head.body {
        BodyFraming::Empty => (ProxyBody::empty(), None),
        BodyFraming::Length(n) => {
            let (b, s) = ProxyBody::channel(Some(n));
            (b, Some(s))
        }
        BodyFraming::Chunked => {
            let (b, s) = ProxyBody::channel(None);
            (b, Some(s))
        }
    };
    if ex.head.expect_continue && sender.is_some() {
        ex.out.send_continue().await.map_err(|e| {
            UpstreamError::Failed(format!("the client connection failed: {}", crate::util::io_cause(&e)))
        })?;
    }
    let request = Request::from_parts(parts, body);
    let reader = &mut ex.body;
    let out = &mut ex.out;
    let head = &ex.head;

    let pump = pump(reader, sender);
    let respond = async {
        let response = super::interim::send(upstream, request, Some(&mut *out), sh).await?;
        if let Some(why) = super::reply_acl::denied(&dest.reply, response.status(), response.headers()) {
            // Dropped unread: the origin connection is closed, not pooled.
            drop(response);
            super::reply_acl::refuse(out, sh, head, &why).await;
            return Ok(None);
        }
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            if upgrading {
                return Ok(Some(response));
            }
            return Err(UpstreamError::Failed(
                "the origin answered 101 Switching Protocols to a request that offered no upgrade".into(),
            ));
        }
        stream_response(out, response, sh, rewrite, dest.relay_challenge).await;
        Ok::<_, UpstreamError>(None)
    };
    tokio::pin!(pump, respond);
    let mut pumped = false;
    let result = loop {
        tokio::select! {
            () = &mut pump, if !pumped => pumped = true,
            r = &mut respond => break r,
        }
    };
    if !pumped {
        // The response ended before the client finished sending its body:
        // the rest is drained (if small) or the connection closed by the caller.
        tracing::debug!("response complete before the request body");
    }
    result
}

/// Copies the client's request body into the upstream request.
async fn pump(reader: &mut BodyReader<'_>, sender: Option<BodySender>) {
    let Some(sender) = sender else { return };
    loop {
        match reader.frame().await {
            Ok(Some(BodyFrame::Data(d))) => {
                if !sender.data(d).await {
                    return;
                }
            }
            Ok(Some(BodyFrame::Trailers(t))) => {
                if !sender.trailers(t).await {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("request body failed: {e}");
                sender.fail(&e).await;
                return;
            }
        }
    }
}

/// The origin's response headers as Portico passes them on: hop-by-hop
/// fields removed, `Via` added, `Location`/`Content-Location` rewritten
/// back to the public host (reverse proxying).
pub fn response_headers(
    mut headers: HeaderMap,
    received: Version,
    sh: &Shared,
    rewrite: Option<&LocationRewrite>,
) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    // What is stored and sent carries one canonical length field; the
    // response writer then sets it from the body actually sent.
    normalise_content_length(&mut headers);
    remove_framing_lookalikes(&mut headers);
    add_via(&mut headers, received, &sh.config.proxy.via);
    if let Some(r) = rewrite {
        r.apply(&mut headers);
    }
    headers
}

/// Body bytes in hand after which [`gather`] takes no more (one more read
/// of up to 64 KiB may have brought it past).
const GATHER: usize = 64 << 10;

/// The body pieces [`gather`] took, for one write to the client.
pub(super) struct Gathered {
    parts: [bytes::Bytes; crate::http1::PARTS_PER_WRITE],
    len: usize,
}

impl Gathered {
    /// The pieces, in order.
    pub(super) fn parts(&self) -> &[bytes::Bytes] {
        &self.parts[..self.len]
    }
}

/// `first` and the body bytes the origin had already sent after it
/// (`OriginBody::ready_data`), until [`GATHER`] bytes are in hand or one
/// write's worth of pieces, for one write to the client. A body that came
/// in two reads (the head's, then the rest) then leaves in one: without it,
/// the client got two segments, and was woken for each. Held on the stack:
/// no allocation per response.
pub(super) fn gather(body: &mut OriginBody, first: bytes::Bytes) -> Gathered {
    let mut bytes = first.len();
    let mut g = Gathered {
        parts: Default::default(),
        len: 1,
    };
    g.parts[0] = first;
    while bytes < GATHER
        && g.len < g.parts.len()
        && !body.is_end_stream()
        && let Some(more) = body.ready_data()
    {
        bytes += more.len();
        g.parts[g.len] = more;
        g.len += 1;
    }
    g
}

/// Sends the origin's response to the client, streaming the body frame by
/// frame (what has arrived gathered into one write). Failures after the
/// head is sent can only end the connection.
async fn stream_response(
    out: &mut ResponseWriter<'_>,
    response: http::Response<OriginBody>,
    sh: &Shared,
    rewrite: Option<&LocationRewrite>,
    relay_challenge: bool,
) {
    let _send = crate::stats::stage(crate::stats::Stage::Send);
    let (parts, mut body) = response.into_parts();
    let headers = response_headers_for(parts.headers, parts.status, parts.version, sh, rewrite, relay_challenge);
    let len = match body.size_hint().exact() {
        Some(n) => BodyLen::Known(n),
        None => BodyLen::Unknown,
    };
    out.send_head(parts.status, headers, len);
    let idle = sh.upstream.idle_timeout;
    let mut trailers = None;
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                tracing::warn!("{e}");
                out.close_after();
                return;
            }
            Err(_) => {
                tracing::warn!("origin response body stalled for {}", humantime::format_duration(idle));
                out.close_after();
                return;
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if out.send_data_parts(gather(&mut body, data).parts()).await.is_err() {
                    out.close_after();
                    return;
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    if out.finish(trailers.as_ref()).await.is_err() {
        out.close_after();
    }
}
