//! The response step of the ACL (`[[acl]]` response entries, `crate::acl`
//! `mime.rs`): a response head the request's [`ReplyFilter`] denies is
//! answered with the entry's deny page instead, before any of its body is
//! sent or stored. Every path that answers with an origin's or the cache's
//! response calls [`denied`] first: the pass-through (`forward.rs`), a
//! miss that may be stored, a collapsed follower, and a stored response
//! (hit, stale or revalidated) in `cached.rs`.

use super::Shared;
use crate::acl::{ReplyDenied, ReplyFilter};
use crate::http1::{RequestHead, ResponseWriter};
use http::{HeaderMap, StatusCode};

/// The response entry that refuses a response of `status` with `headers`
/// for this request, None when it may be sent.
pub(super) fn denied(filter: &ReplyFilter, status: StatusCode, headers: &HeaderMap) -> Option<ReplyDenied> {
    if filter.is_empty() {
        return None;
    }
    filter.check(status, headers)
}

/// Answers with the deny page of `why`, counted as `acl_denied` (as a
/// request the ACL refused) and noted in the error log with the types seen.
pub(super) async fn refuse(out: &mut ResponseWriter<'_>, sh: &Shared, head: &RequestHead, why: &ReplyDenied) {
    sh.stats.acl_denied();
    tracing::info!(
        "{} {}: response denied by acl[{}] (Content-Type: {})",
        head.method,
        head.target,
        why.entry,
        why.types
    );
    if crate::proxy::reply::error_page(out, &sh.error_pages, why.status, &why.reason)
        .await
        .is_err()
    {
        out.close_after();
    }
}
