//! Forwarding a request to an origin and streaming the response back, with
//! both bodies streamed (never held whole), and retry on another server of
//! a group when a connect fails.

use super::Shared;
use super::headers::{add_via, decrement_max_forwards, forwarded_for, strip_hop_by_hop};
use crate::config::HostHeader;
use crate::http1::head::list_tokens;
use crate::http1::{BodyFrame, BodyFraming, BodyLen, BodyReader, Exchange, ResponseWriter};
use crate::upstream::{BodySender, ConnectErrorKind, Group, ProxyBody, UpstreamError};
use http::header::{CONTENT_LOCATION, EXPECT, HOST, LOCATION, TE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt;

/// A failure to report to the client as an error page.
pub type Failure = (StatusCode, String);

/// Forward (or transparent) proxying: the origin is named by the URI.
pub async fn to_origin(ex: &mut Exchange<'_>, sh: &Shared, uri: Uri) -> Result<(), Failure> {
    let host = HeaderValue::from_str(uri.authority().map_or("", |a| a.as_str())).map_err(|_| bad_uri())?;
    let parts = request_parts(ex, sh, uri, host)?;
    exchange(ex, sh, parts, None).await.map_err(failure)
}

/// Reverse proxying to a server of `group`, retrying an idempotent request
/// without a body once on another server when the connect fails.
pub async fn to_group(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    group: &Group,
    path_and_query: &str,
    public_host: &str,
) -> Result<(), Failure> {
    let retriable = group.retry
        && group.len() > 1
        && ex.head.body == BodyFraming::Empty
        && matches!(
            ex.head.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
        );
    let client_host = (!public_host.is_empty())
        .then(|| HeaderValue::from_str(public_host).ok())
        .flatten();
    let mut failed: Option<usize> = None;
    loop {
        let idx = group.pick(failed);
        let server = group.server(idx);
        let uri = server.uri(path_and_query).map_err(|_| bad_uri())?;
        let host = match (group.host_header, &client_host) {
            (HostHeader::Preserve, Some(h)) => h.clone(),
            _ => HeaderValue::from_str(server.authority.as_str()).map_err(|_| bad_uri())?,
        };
        let public = client_host
            .as_ref()
            .and_then(|h| h.to_str().ok())
            .map(|h| format!("http://{h}"));
        let rewrite = public.map(|public| LocationRewrite {
            from: format!("{}://{}", server.scheme, server.authority),
            to: public,
        });
        let parts = request_parts(ex, sh, uri, host)?;
        match exchange(ex, sh, parts, rewrite.as_ref()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_connect() => {
                tracing::warn!(upstream = %group.name, server = %server.authority, "marking server down: {e}");
                group.mark_down(idx);
                if retriable && failed.is_none() {
                    failed = Some(idx);
                    continue;
                }
                return Err(failure(e));
            }
            Err(e) => return Err(failure(e)),
        }
    }
}

/// Rewrites `Location`/`Content-Location` pointing at the origin server
/// back to the public name the client used.
pub struct LocationRewrite {
    from: String,
    to: String,
}

impl LocationRewrite {
    fn apply(&self, headers: &mut HeaderMap) {
        for name in [LOCATION, CONTENT_LOCATION] {
            let Some(value) = headers.get(&name).and_then(|v| v.to_str().ok()) else {
                continue;
            };
            let Some(rest) = value.strip_prefix(self.from.as_str()) else {
                continue;
            };
            if !(rest.is_empty() || rest.starts_with('/') || rest.starts_with('?')) {
                continue;
            }
            if let Ok(v) = HeaderValue::from_str(&format!("{}{rest}", self.to)) {
                headers.insert(name, v);
            }
        }
    }
}

fn bad_uri() -> Failure {
    (StatusCode::BAD_REQUEST, "invalid request URI or Host".into())
}

fn failure(e: UpstreamError) -> Failure {
    let status = match &e {
        UpstreamError::Connect(c) if c.kind == ConnectErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        UpstreamError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        UpstreamError::ClientBody(b) if b.too_large => StatusCode::PAYLOAD_TOO_LARGE,
        UpstreamError::ClientBody(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    (status, e.to_string())
}

/// The request to send upstream: the client's, with hop-by-hop fields
/// removed and Via / X-Forwarded-For / Max-Forwards applied.
fn request_parts(ex: &Exchange<'_>, sh: &Shared, uri: Uri, host: HeaderValue) -> Result<http::request::Parts, Failure> {
    let head = &ex.head;
    let mut headers = head.headers.clone();
    let accepts_trailers = list_tokens(&headers, &TE).any(|t| t.eq_ignore_ascii_case("trailers"));
    strip_hop_by_hop(&mut headers);
    if accepts_trailers {
        // TE is hop-by-hop, but Portico passes trailers on to this client,
        // so it may say so to the origin on the client's behalf.
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    // The expectation is met hop by hop: Portico sends 100 Continue itself.
    headers.remove(EXPECT);
    if head.body == BodyFraming::Chunked {
        // Said explicitly: hyper assumes a GET or HEAD body of unknown length
        // is empty and would silently drop it.
        headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    headers.insert(HOST, host);
    add_via(&mut headers, head.version, &sh.config.proxy.via);
    forwarded_for(&mut headers, ex.peer.ip(), sh.config.proxy.x_forwarded_for);
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
async fn exchange(
    ex: &mut Exchange<'_>,
    sh: &Shared,
    parts: http::request::Parts,
    rewrite: Option<&LocationRewrite>,
) -> Result<(), UpstreamError> {
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
        ex.out
            .send_continue()
            .await
            .map_err(|e| UpstreamError::Failed(format!("client connection failed: {e}")))?;
    }
    let client_version = ex.head.version;
    let request = Request::from_parts(parts, body);
    let reader = &mut ex.body;
    let out = &mut ex.out;

    let pump = pump(reader, sender);
    let respond = async {
        let response = sh.upstream.send(request).await?;
        stream_response(out, response, client_version, sh, rewrite).await;
        Ok::<(), UpstreamError>(())
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

/// Sends the origin's response to the client, streaming the body frame by
/// frame. Failures after the head is sent can only end the connection.
async fn stream_response(
    out: &mut ResponseWriter<'_>,
    response: http::Response<hyper::body::Incoming>,
    client_version: Version,
    sh: &Shared,
    rewrite: Option<&LocationRewrite>,
) {
    let (parts, mut body) = response.into_parts();
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    add_via(&mut headers, parts.version, &sh.config.proxy.via);
    if let Some(r) = rewrite {
        r.apply(&mut headers);
    }
    let len = match body.size_hint().exact() {
        Some(n) => BodyLen::Known(n),
        None => BodyLen::Unknown,
    };
    let _ = client_version;
    out.send_head(parts.status, headers, len);
    let idle = sh.upstream.idle_timeout;
    let mut trailers = None;
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                tracing::warn!("origin response body failed: {e}");
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
                if out.send_data(&data).await.is_err() {
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
