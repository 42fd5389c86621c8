//! The request body sent upstream: frames pumped from the client connection
//! through a small bounded channel, so a large upload streams through with
//! a few frames in memory at most.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::{Notify, mpsc};

/// The client's body failed while it was being forwarded.
#[derive(Debug, Clone)]
pub struct ClientBodyError {
    /// What went wrong.
    pub message: String,
    /// The body went over `limits.max_body_size` (413 rather than 400).
    pub too_large: bool,
}

impl std::fmt::Display for ClientBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "client request body: {}", self.message)
    }
}

impl std::error::Error for ClientBodyError {}

type Item = Result<Frame<Bytes>, ClientBodyError>;

/// A request body for the upstream client: empty, or fed by a [`BodySender`].
pub struct ProxyBody {
    rx: Option<mpsc::Receiver<Item>>,
    length: Option<u64>,
    sent: u64,
    progress: Arc<BodyProgress>,
}

/// The feeding end of a [`ProxyBody`].
pub struct BodySender {
    tx: mpsc::Sender<Item>,
    progress: Arc<BodyProgress>,
}

/// How far a request body has gone: frames offered by the client side,
/// frames taken by the upstream client to write to the origin, and whether the end has
/// been taken. The exchange's timers follow it: `origin.first_byte_timeout`
/// starts only once the whole body is out (a slow upload is not a slow
/// origin), and a frame the origin does not take for `origin.idle_timeout`
/// is the origin stalling.
#[derive(Debug, Default)]
pub struct BodyProgress {
    offered: AtomicU64,
    taken: AtomicU64,
    ended: AtomicBool,
    /// The sender is gone: the client side reads no more of the body
    /// (all of it was read, or the reading failed).
    sender_gone: AtomicBool,
    /// Woken at every frame offered or taken, at the end, and when the
    /// sender goes.
    changed: Notify,
}

impl BodyProgress {
    /// True once the client has taken the end of the body (or there was none).
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// True while a frame the client sent waits for the origin to take it.
    pub fn pending(&self) -> bool {
        self.offered.load(Ordering::Acquire) > self.taken.load(Ordering::Acquire)
    }

    /// Completes at the next change. Create it before looking at the
    /// state: a change after its creation is never missed.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// Completes once the sender has gone: the client's connection then
    /// holds no more of this body for the reader (an HTTP/1 client's
    /// departure can be watched for from there).
    pub async fn sender_gone(&self) {
        loop {
            let changed = self.changed();
            if self.sender_gone.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    fn offer(&self) {
        self.offered.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    fn take(&self) {
        self.taken.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }
}

impl ProxyBody {
    /// No body.
    pub fn empty() -> ProxyBody {
        let progress = BodyProgress::default();
        progress.ended.store(true, Ordering::Relaxed);
        ProxyBody {
            rx: None,
            length: Some(0),
            sent: 0,
            progress: Arc::new(progress),
        }
    }

    /// A streamed body of `length` bytes (None = chunked, unknown length).
    pub fn channel(length: Option<u64>) -> (ProxyBody, BodySender) {
        let (tx, rx) = mpsc::channel(4);
        let progress = Arc::new(BodyProgress::default());
        (
            ProxyBody {
                rx: Some(rx),
                length,
                sent: 0,
                progress: progress.clone(),
            },
            BodySender { tx, progress },
        )
    }

    /// How far this body has gone (shared with its sender).
    pub fn progress(&self) -> Arc<BodyProgress> {
        self.progress.clone()
    }
}

impl Drop for BodySender {
    fn drop(&mut self) {
        self.progress.sender_gone.store(true, Ordering::Release);
        self.progress.changed.notify_waiters();
    }
}

impl BodySender {
    /// Sends body bytes; false when the upstream side has gone away.
    pub async fn data(&self, data: Bytes) -> bool {
        self.progress.offer();
        self.tx.send(Ok(Frame::data(data))).await.is_ok()
    }

    /// Sends trailers.
    pub async fn trailers(&self, trailers: HeaderMap) -> bool {
        self.progress.offer();
        self.tx.send(Ok(Frame::trailers(trailers))).await.is_ok()
    }

    /// Aborts the upstream request because the client's body failed.
    pub async fn fail(&self, why: &crate::http1::BodyError) {
        let err = ClientBodyError {
            message: why.to_string(),
            too_large: matches!(why, crate::http1::BodyError::TooLarge),
        };
        let _ = self.tx.send(Err(err)).await;
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = &mut *self;
        let Some(rx) = this.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.sent += d.len() as u64;
                }
                this.progress.take();
                // With a Content-Length, the upstream client stops polling
                // once that many bytes are out: the last of them is the end.
                if this.length == Some(this.sent) {
                    this.progress.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => {
                this.rx = None;
                match this.length {
                    Some(n) if this.sent < n => Poll::Ready(Some(Err(ClientBodyError {
                        message: "body ended early".into(),
                        too_large: false,
                    }))),
                    _ => {
                        this.progress.end();
                        Poll::Ready(None)
                    }
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(n) => SizeHint::with_exact(n.saturating_sub(self.sent)),
            None => SizeHint::default(),
        }
    }
}
