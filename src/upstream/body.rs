//! The request body sent upstream: frames pumped from the client connection
//! through a small bounded channel, so a large upload streams through with
//! a few frames in memory at most.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

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

/// A request body for hyper: empty, or fed by a [`BodySender`].
pub struct ProxyBody {
    rx: Option<mpsc::Receiver<Item>>,
    length: Option<u64>,
    sent: u64,
}

/// The feeding end of a [`ProxyBody`].
pub struct BodySender {
    tx: mpsc::Sender<Item>,
}

impl ProxyBody {
    /// No body.
    pub fn empty() -> ProxyBody {
        ProxyBody {
            rx: None,
            length: Some(0),
            sent: 0,
        }
    }

    /// A streamed body of `length` bytes (None = chunked, unknown length).
    pub fn channel(length: Option<u64>) -> (ProxyBody, BodySender) {
        let (tx, rx) = mpsc::channel(4);
        (
            ProxyBody {
                rx: Some(rx),
                length,
                sent: 0,
            },
            BodySender { tx },
        )
    }
}

impl BodySender {
    /// Sends body bytes; false when the upstream side has gone away.
    pub async fn data(&self, data: Bytes) -> bool {
        self.tx.send(Ok(Frame::data(data))).await.is_ok()
    }

    /// Sends trailers.
    pub async fn trailers(&self, trailers: HeaderMap) -> bool {
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
                    _ => Poll::Ready(None),
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
