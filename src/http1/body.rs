//! Reading a request body off the client connection, frame by frame, so it
//! can be streamed upstream without ever holding the whole body.

use super::chunked::{ChunkedDecoder, Decoded};
use super::head::BodyFraming;
use super::io::ClientStream;
use super::io::read_buf;
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use std::time::Duration;

/// Largest piece of body handed on at once.
const MAX_FRAME: usize = 64 << 10;

/// One piece of a request body.
#[derive(Debug)]
pub enum BodyFrame {
    /// Body bytes.
    Data(Bytes),
    /// The trailer section of a chunked body.
    Trailers(HeaderMap),
}

/// Why a request body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// The client closed the connection before the body ended.
    Truncated,
    /// The chunked framing was invalid.
    Framing(&'static str),
    /// The body exceeded `limits.max_body_size`.
    TooLarge,
    /// No body bytes arrived for too long.
    Timeout,
    /// A socket error.
    Io(std::io::Error),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Truncated => f.write_str("client closed the connection mid-body"),
            BodyError::Framing(r) => write!(f, "invalid chunked body: {r}"),
            BodyError::TooLarge => f.write_str("request body too large"),
            BodyError::Timeout => f.write_str("timed out reading the request body"),
            BodyError::Io(e) => write!(
                f,
                "reading the request body from the client: {}",
                crate::util::io_cause(e)
            ),
        }
    }
}

impl std::error::Error for BodyError {}

enum State {
    Length(u64),
    Chunked(Box<ChunkedDecoder>),
    /// An HTTP/2 stream's DATA frames (and trailers).
    H2(Box<h2::RecvStream>),
    Done,
}

/// The body of the request being served, read from the connection's buffer
/// and socket on demand.
pub struct BodyReader<'a> {
    /// None for an HTTP/2 stream, whose frames come from `h2`.
    stream: Option<&'a ClientStream>,
    buf: &'a mut BytesMut,
    state: State,
    max_size: u64,
    received: u64,
    idle_timeout: Duration,
}

impl<'a> BodyReader<'a> {
    pub(super) fn new(
        stream: &'a ClientStream,
        buf: &'a mut BytesMut,
        framing: BodyFraming,
        max_size: u64,
        max_trailers: usize,
        idle_timeout: Duration,
    ) -> Self {
        let state = match framing {
            BodyFraming::Empty => State::Done,
            BodyFraming::Length(n) => State::Length(n),
            BodyFraming::Chunked => State::Chunked(Box::new(ChunkedDecoder::new(max_trailers))),
        };
        BodyReader {
            stream: Some(stream),
            buf,
            state,
            max_size,
            received: 0,
            idle_timeout,
        }
    }

    /// The body of an HTTP/2 request; `buf` stays empty (a tunnel takes
    /// nothing from it: its bytes come from the stream).
    pub(super) fn h2(recv: h2::RecvStream, buf: &'a mut BytesMut, max_size: u64, idle_timeout: Duration) -> Self {
        let state = if recv.is_end_stream() {
            State::Done
        } else {
            State::H2(Box::new(recv))
        };
        BodyReader {
            stream: None,
            buf,
            state,
            max_size,
            received: 0,
            idle_timeout,
        }
    }

    /// The HTTP/2 stream's receiving half, taken whole (CONNECT over
    /// HTTP/2: the client's DATA frames are the tunnel's bytes).
    pub(crate) fn take_h2(&mut self) -> Option<h2::RecvStream> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::H2(r) => Some(*r),
            other => {
                self.state = other;
                None
            }
        }
    }

    /// Body bytes received so far (decoded; for the statistics).
    pub fn received(&self) -> u64 {
        self.received
    }

    /// True once the whole body has been read (or there was none).
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The next piece of the body, or `None` at its end.
    pub async fn frame(&mut self) -> Result<Option<BodyFrame>, BodyError> {
        loop {
            match &mut self.state {
                State::Done => return Ok(None),
                State::Length(remaining) => {
                    let remaining = *remaining;
                    if remaining == 0 {
                        self.state = State::Done;
                        return Ok(None);
                    }
                    if self.buf.is_empty() {
                        self.fill().await?;
                    }
                    let take = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(self.buf.len())
                        .min(MAX_FRAME);
                    let left = remaining - take as u64;
                    self.state = if left == 0 { State::Done } else { State::Length(left) };
                    let data = self.buf.split_to(take).freeze();
                    self.count(data.len())?;
                    return Ok(Some(BodyFrame::Data(data)));
                }
                State::Chunked(dec) => match dec.decode(self.buf, MAX_FRAME).map_err(|e| BodyError::Framing(e.0))? {
                    Decoded::Data(d) => {
                        self.count(d.len())?;
                        return Ok(Some(BodyFrame::Data(d)));
                    }
                    Decoded::Trailers(t) => return Ok(Some(BodyFrame::Trailers(t))),
                    Decoded::Done => {
                        self.state = State::Done;
                        return Ok(None);
                    }
                    Decoded::NeedMore => self.fill().await?,
                },
                State::H2(recv) => {
                    let next = tokio::time::timeout(self.idle_timeout, recv.data()).await;
                    match next {
                        Err(_) => {
                            self.state = State::Done;
                            return Err(BodyError::Timeout);
                        }
                        Ok(Some(Ok(data))) => {
                            // Taken from the window as soon as it is handed
                            // on: the caller asks for the next frame only
                            // when the origin has taken this one.
                            let _ = recv.flow_control().release_capacity(data.len());
                            self.count(data.len())?;
                            return Ok(Some(BodyFrame::Data(data)));
                        }
                        Ok(Some(Err(_))) => {
                            self.state = State::Done;
                            return Err(BodyError::Truncated);
                        }
                        Ok(None) => {
                            let trailers = tokio::time::timeout(self.idle_timeout, recv.trailers()).await;
                            self.state = State::Done;
                            return match trailers {
                                Ok(Ok(Some(t))) => Ok(Some(BodyFrame::Trailers(t))),
                                Ok(Ok(None)) => Ok(None),
                                Ok(Err(_)) => Err(BodyError::Truncated),
                                Err(_) => Err(BodyError::Timeout),
                            };
                        }
                    }
                }
            }
        }
    }

    /// Takes the bytes already received after the head (for a tunnel, whose
    /// first bytes may have arrived with the CONNECT request).
    pub fn take_buffered(&mut self) -> BytesMut {
        self.buf.split()
    }

    /// Reads and discards the rest of the body, up to `limit` bytes; true if
    /// the body ended within it (so the connection can serve another request).
    pub async fn drain(&mut self, limit: u64) -> bool {
        let start = self.received;
        loop {
            match self.frame().await {
                Ok(None) => return true,
                Ok(Some(_)) if self.received - start <= limit => {}
                _ => return false,
            }
        }
    }

    fn count(&mut self, n: usize) -> Result<(), BodyError> {
        self.received += n as u64;
        if self.max_size > 0 && self.received > self.max_size {
            self.state = State::Done;
            return Err(BodyError::TooLarge);
        }
        Ok(())
    }

    async fn fill(&mut self) -> Result<(), BodyError> {
        let Some(stream) = self.stream else {
            return Err(BodyError::Truncated);
        };
        match tokio::time::timeout(self.idle_timeout, read_buf(stream, self.buf, MAX_FRAME)).await {
            Err(_) => Err(BodyError::Timeout),
            Ok(Err(e)) => Err(BodyError::Io(e)),
            Ok(Ok(0)) => Err(BodyError::Truncated),
            Ok(Ok(_)) => Ok(()),
        }
    }
}
