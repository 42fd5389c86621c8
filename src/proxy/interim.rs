//! Interim (1xx) responses from an origin, relayed to the client before
//! the final response (RFC 9110 15.2: "A proxy MUST forward 1xx responses
//! unless the proxy itself requested the generation of the 1xx
//! response"): `102 Processing`, `103 Early Hints` with its `Link` fields,
//! an unsolicited `100 Continue`. The upstream client reads them while it
//! waits for the final head and hands each to a callback
//! (`upstream::OnInterim`); the callback runs inside the client's poll and
//! cannot write to the client, so it queues them and the request's task
//! writes them out while the client goes on waiting. They are never stored: the
//! final response is a separate head, and what the cache keeps is built
//! from it alone (cache-tests `interim-not-cached`,
//! `interim-no-header-reuse`).

use super::Shared;
use super::headers::{add_via, remove_framing_lookalikes, strip_hop_by_hop};
use crate::http1::ResponseWriter;
use crate::upstream::{BodyProgress, OriginBody, Place, ProxyBody, Reservation, Upstream, UpstreamError};
use http::{HeaderMap, Request, Response, StatusCode, Version};
use http_body::Body as _;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Interim responses queued while the client takes the earlier ones. An
/// origin sending more than this before the client reads them loses the
/// excess: they are hints, and an origin flooding them must not grow
/// Portico's memory (the first-byte timeout bounds the flood's length).
const QUEUE: usize = 16;

/// Sends `request` through `upstream` and returns the final response head,
/// writing every interim response that arrives before it to `out` (when
/// there is a client: background revalidation has none, and drops them).
pub async fn send(
    upstream: &Upstream,
    request: Request<ProxyBody>,
    mut out: Option<&mut ResponseWriter<'_>>,
    sh: &Shared,
) -> Result<Response<OriginBody>, UpstreamError> {
    // The place at the server first, for both kinds of callers.
    let place = match upstream.reserve(&request) {
        Reservation::Ready(place) => place,
        // Boxed: the wait is the rare path.
        Reservation::Waiting(place) => {
            let body = (!request.body().is_end_stream()).then(|| request.body().progress());
            Box::pin(wait_in_line(upstream, place, body, out.as_deref_mut())).await?
        }
    };
    let Some(out) = out else {
        // Boxed: a background revalidation's exchange would otherwise sit
        // beside the client's in this future, which every miss carries and
        // copies into its box (7,824 bytes for a miss's whole future with
        // it boxed, 8,464 without).
        return Box::pin(upstream.send_reserved(request, None, place)).await;
    };
    // Nothing is allocated for a request whose origin sends no 1xx (most).
    let queue: Mutex<VecDeque<(StatusCode, HeaderMap)>> = Mutex::new(VecDeque::new());
    let arrived = Notify::new();
    let mut on_interim = |status, headers| {
        if let Ok(mut q) = queue.lock()
            && q.len() < QUEUE
        {
            q.push_back((status, headers));
        }
        arrived.notify_one();
    };
    let next = || queue.lock().ok().and_then(|mut q| q.pop_front());
    let sending = upstream.send_reserved(request, Some(&mut on_interim), place);
    tokio::pin!(sending);
    let mut client_ok = true;
    let result = loop {
        tokio::select! {
            // The final head wins a tie only after the interim ones queued
            // before it: the client calls back before it returns the head.
            biased;
            () = arrived.notified() => {
                while let Some((status, headers)) = next() {
                    client_ok = client_ok && relay(out, upstream, sh, status, headers).await;
                }
            }
            r = &mut sending => break r,
        }
    };
    if result.is_ok() {
        while let Some((status, headers)) = next() {
            client_ok = client_ok && relay(out, upstream, sh, status, headers).await;
        }
    }
    result
}

/// Waits for `place` at the request's server: until the client goes
/// (`Upstream::wait_unless`: the request then leaves the line unsent;
/// with a request body, `body`, watched for a hang-up behind the bytes the
/// client side has not read yet, and as a bodyless request once it has
/// read all of it), or, without a client (a background revalidation), as
/// long as `origin.queue_timeout` allows.
async fn wait_in_line(
    upstream: &Upstream,
    place: Place,
    body: Option<Arc<BodyProgress>>,
    out: Option<&mut ResponseWriter<'_>>,
) -> Result<Option<Place>, UpstreamError> {
    match out {
        Some(out) => {
            let body_read = body.as_deref().map(BodyProgress::sender_gone);
            upstream.wait_unless(place, out.client_gone(body_read)).await
        }
        None => upstream.wait_for_place(place).await,
    }
}

/// Writes one interim response to the client; false once the client
/// connection failed (the final response will fail too, and end it).
async fn relay(
    out: &mut ResponseWriter<'_>,
    upstream: &Upstream,
    sh: &Shared,
    status: StatusCode,
    mut headers: HeaderMap,
) -> bool {
    strip_hop_by_hop(&mut headers);
    remove_framing_lookalikes(&mut headers);
    // RFC 9110 7.6.3: a proxy sends Via in each message it forwards.
    add_via(&mut headers, Version::HTTP_11, &sh.config.proxy.via);
    match out.send_interim(status, &headers).await {
        Ok(sent) => {
            if sent {
                upstream.stats().0.interim_relayed.fetch_add(1, Relaxed);
            }
            true
        }
        Err(e) => {
            tracing::debug!("relaying a {status} to the client failed: {e}");
            out.close_after();
            false
        }
    }
}
