//! A storable miss is read from the origin ahead of its client.
//!
//! Written in step (read a piece from the origin, write it to the client,
//! read the next), a miss goes at the pace of the client that asked first:
//! a slow reader, or one held to `limits.client_bandwidth`, slowed the
//! fill of the cache with it, so the requests collapsed onto that fetch
//! got the object no faster, and a request right after found it not yet
//! stored. Here the fill (origin, cache, collapsed requests) and the
//! writer to this request's client run side by side in the request's
//! task, and what the client has not been sent yet waits in a [`Queue`].
//!
//! The queue is bounded twice: per fetch by `cache.read_ahead_gap`
//! (Squid's setting of that name), and for the whole worker by
//! `Cache::read_ahead` (`cache.read_ahead_memory`), so that many slow
//! clients cannot make the worker hold their objects in memory. Past the gap the fill waits for
//! writes to make room; with the budget spent, until its client has been
//! sent all that is queued, then queues one piece more: about as far
//! ahead as when written in step.
//!
//! While it waits for the origin, the writer watches its client (after
//! [`WATCH_AFTER`] of quiet, and unless `origin.abort_on_close` is off):
//! a client that leaves then is told to the fill at once, which applies
//! the quick-abort rule without waiting for the origin's next piece. As
//! for a request waiting for an origin connection, a client that
//! half-closes its connection (`shutdown(SHUT_WR)`) looks gone.

use bytes::Bytes;
use http::HeaderMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

// The writer sends at most as many pieces at once as one
// `ResponseWriter` write takes.
use crate::http1::PARTS_PER_WRITE;

/// How long the writer waits for the origin before it watches its client.
/// An origin that keeps sending costs no watching (with a request
/// pipelined behind this one, each look at the client is two system calls
/// and a timer); a fetch stalled this long is worth them.
pub const WATCH_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// What the writer needs of the client's response: `ResponseWriter`'s
/// body calls.
pub trait ClientSink {
    /// Writes body pieces (paced by `limits.client_bandwidth`).
    async fn send_data_parts(&mut self, parts: &[Bytes]) -> std::io::Result<()>;
    /// Ends the body, with the origin's trailers.
    async fn finish(&mut self, trailers: Option<&HeaderMap>) -> std::io::Result<()>;
    /// Closes the connection after this response.
    fn close_after(&mut self);
    /// Completes when the client has gone away: closed, half-closed or
    /// reset its connection (also behind unread bytes, and a TLS
    /// close_notify), or reset its HTTP/2 stream.
    async fn gone(&mut self);
}

impl ClientSink for crate::http1::ResponseWriter<'_> {
    async fn send_data_parts(&mut self, parts: &[Bytes]) -> std::io::Result<()> {
        crate::http1::ResponseWriter::send_data_parts(self, parts).await
    }
    async fn finish(&mut self, trailers: Option<&HeaderMap>) -> std::io::Result<()> {
        crate::http1::ResponseWriter::finish(self, trailers).await
    }
    fn close_after(&mut self) {
        crate::http1::ResponseWriter::close_after(self)
    }
    async fn gone(&mut self) {
        self.client_gone(None::<std::future::Ready<()>>).await
    }
}

/// What goes from the fill to the writer.
enum Piece {
    /// Body bytes, with the share of the budget they hold (none for a
    /// piece sent in step).
    Data(Bytes, Option<OwnedSemaphorePermit>),
    /// The fetch ended: complete (with the origin's trailers) or not.
    End {
        complete: bool,
        trailers: Option<HeaderMap>,
    },
}

/// The fill's side of the queue: [`Queue::push`] and [`Queue::end`].
pub struct Queue {
    tx: UnboundedSender<Piece>,
    budget: Arc<Semaphore>,
    /// Bytes pushed and not yet written to the client.
    queued: AtomicU64,
    /// Most bytes queued (beyond one piece queued when nothing is). While
    /// the worker's budget lasts, an object up to this size (plus what
    /// the sockets hold) is stored at the origin's pace whatever the
    /// client's.
    gap: u64,
    /// Told by the writer after each write, and when it leaves.
    drained: Notify,
    /// The client could not be written to, or was seen gone while the
    /// writer waited: nothing more is queued.
    gone: AtomicBool,
    /// Told once, when `gone` is set: the fill, waiting on the origin,
    /// decides at once whether the fetch goes on without the client.
    left: Notify,
    /// Whether the writer watches its client while it waits
    /// (`origin.abort_on_close`).
    watch: bool,
    /// A piece has been queued: only the first is yielded for.
    started: AtomicBool,
}

/// The writer's side of the queue, for [`Queue::deliver`].
pub struct Pieces(UnboundedReceiver<Piece>);

/// A queue between a fill and the writer to its client. `budget`: the
/// worker's `Cache::read_ahead`; `gap`: `cache.read_ahead_gap`; `watch`:
/// `origin.abort_on_close`.
pub fn queue(budget: &Arc<Semaphore>, gap: u64, watch: bool) -> (Queue, Pieces) {
    let (tx, rx) = unbounded_channel();
    let q = Queue {
        tx,
        budget: budget.clone(),
        queued: AtomicU64::new(0),
        gap,
        drained: Notify::new(),
        gone: AtomicBool::new(false),
        left: Notify::new(),
        watch,
        started: AtomicBool::new(false),
    };
    (q, Pieces(rx))
}

impl Queue {
    /// Whether the client is still being written to.
    pub fn client_ok(&self) -> bool {
        !self.gone.load(Ordering::Acquire)
    }

    /// Resolves once the client could not be written to, or was seen gone.
    pub async fn left(&self) {
        if self.client_ok() {
            self.left.notified().await;
        }
    }

    /// Queues `data` for the client, first waiting while the fetch is
    /// its gap ahead or the worker's budget is spent, unless nothing is
    /// queued. The first piece is written before the fill reads on (the
    /// writer is polled first, and the fill yields once), so the client's
    /// first bytes go out at once; later ones go out when the fill waits
    /// for the origin, gathered. Dropped when the client is gone.
    pub async fn push(&self, data: Bytes) {
        let n = data.len() as u64;
        let permit = loop {
            if !self.client_ok() {
                return;
            }
            let queued = self.queued.load(Ordering::Acquire);
            if queued == 0 {
                break None;
            }
            if queued + n <= self.gap
                && let Ok(p) = self
                    .budget
                    .clone()
                    .try_acquire_many_owned(u32::try_from(n).unwrap_or(u32::MAX))
            {
                break Some(p);
            }
            // `notify_one` keeps its wake-up for a wait that starts after
            // it: a write that ends between the check and here is not lost.
            self.drained.notified().await;
        };
        self.queued.fetch_add(n, Ordering::AcqRel);
        // The writer gone after the check: the piece is dropped with the send.
        let _ = self.tx.send(Piece::Data(data, permit));
        if !self.started.swap(true, Ordering::AcqRel) {
            // Both run in one task: the writer is polled only when the
            // fill waits.
            tokio::task::yield_now().await;
        }
    }

    /// The fetch ended; the writer finishes the response after what is
    /// queued, or closes the connection after it when `complete` is false.
    pub fn end(&self, complete: bool, trailers: Option<HeaderMap>) {
        let _ = self.tx.send(Piece::End { complete, trailers });
    }

    /// Writes what the fill queues to `out`, gathering what is queued
    /// into one write, until the end; a failed write, or a client seen
    /// gone while the writer waited, leaves the client behind (the fill
    /// goes on without it, `cache.quick_abort` deciding). A client that
    /// leaves mid-write is noticed when that write fails (a stalled one
    /// after `limits.send_timeout`).
    pub async fn deliver(&self, pieces: Pieces, out: &mut impl ClientSink) {
        let Pieces(mut rx) = pieces;
        let mut next = None;
        loop {
            let first = match next.take() {
                Some(p) => p,
                None => {
                    let quick = tokio::time::timeout(WATCH_AFTER, rx.recv());
                    let p = match quick.await {
                        Ok(p) => p,
                        Err(_) if !self.watch => rx.recv().await,
                        // The origin is quiet: the client is watched, so
                        // one that leaves is told to the fill now, not at
                        // the next write.
                        Err(_) => tokio::select! {
                            p = rx.recv() => p,
                            () = out.gone() => {
                                self.leave(rx, out);
                                return;
                            }
                        },
                    };
                    // None: not while the queue (holding the sender)
                    // lives; taken as a broken fetch all the same.
                    p.unwrap_or(Piece::End {
                        complete: false,
                        trailers: None,
                    })
                }
            };
            let (data, permit) = match first {
                Piece::Data(d, p) => (d, p),
                Piece::End { complete, trailers } => {
                    if !complete || out.finish(trailers.as_ref()).await.is_err() {
                        out.close_after();
                    }
                    return;
                }
            };
            let mut parts: [Bytes; PARTS_PER_WRITE] = Default::default();
            let mut permits: [Option<OwnedSemaphorePermit>; PARTS_PER_WRITE] = Default::default();
            parts[0] = data;
            permits[0] = permit;
            let mut len = 1;
            while len < PARTS_PER_WRITE {
                match rx.try_recv() {
                    Ok(Piece::Data(d, p)) => {
                        parts[len] = d;
                        permits[len] = p;
                        len += 1;
                    }
                    Ok(end) => {
                        next = Some(end);
                        break;
                    }
                    Err(_) => break,
                }
            }
            let written = out.send_data_parts(&parts[..len]).await;
            let bytes: u64 = parts[..len].iter().map(|p| p.len() as u64).sum();
            drop(permits);
            self.queued.fetch_sub(bytes, Ordering::AcqRel);
            if written.is_err() {
                self.leave(rx, out);
                return;
            }
            self.drained.notify_one();
        }
    }

    /// The client cannot be written to: the fill is told, and what is
    /// queued goes with its share of the budget.
    fn leave(&self, mut rx: UnboundedReceiver<Piece>, out: &mut impl ClientSink) {
        self.gone.store(true, Ordering::Release);
        self.drained.notify_one();
        self.left.notify_one();
        out.close_after();
        rx.close();
        while rx.try_recv().is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const BUDGET: usize = 64 << 20;
    const GAP: u64 = 1 << 20;

    fn piece(n: usize) -> Bytes {
        Bytes::from(vec![0u8; n])
    }

    fn budget() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(BUDGET))
    }

    #[tokio::test]
    async fn the_first_piece_goes_in_step_and_the_next_hold_a_share_of_the_budget() {
        let budget = budget();
        let (q, mut pieces) = queue(&budget, GAP, true);
        q.push(piece(1000)).await;
        assert_eq!(budget.available_permits(), BUDGET, "in step: nothing held");
        q.push(piece(500)).await;
        assert_eq!(budget.available_permits(), BUDGET - 500);
        let Ok(Piece::Data(_, None)) = pieces.0.try_recv() else {
            panic!("first piece")
        };
        let Ok(Piece::Data(_, Some(p))) = pieces.0.try_recv() else {
            panic!("second piece")
        };
        drop(p);
        assert_eq!(budget.available_permits(), BUDGET, "written: the share comes back");
    }

    #[tokio::test]
    async fn a_fill_waits_once_it_is_a_gap_ahead_of_its_client() {
        let budget = budget();
        let (q, _pieces) = queue(&budget, GAP, true);
        let half = (GAP / 2) as usize;
        q.push(piece(half)).await;
        q.push(piece(half)).await;
        // GAP queued: the next waits for a write.
        let waited = tokio::time::timeout(Duration::from_millis(50), q.push(piece(1))).await;
        assert!(waited.is_err(), "pushed past the gap");
    }

    #[tokio::test]
    async fn a_piece_larger_than_the_gap_waits_until_nothing_is_queued() {
        let budget = budget();
        let (q, _pieces) = queue(&budget, 1000, true);
        q.push(piece(10)).await;
        let waited = tokio::time::timeout(Duration::from_millis(50), q.push(piece(2000))).await;
        assert!(waited.is_err(), "pushed a piece over the gap behind another");
        // Once the first is written, it goes, holding none of the budget.
        let (q, rx) = queue(&budget, 1000, true);
        let mut client = Client::default();
        let fill = async {
            q.push(piece(10)).await;
            q.push(Bytes::from(vec![1u8; 2000])).await;
            let held = BUDGET - budget.available_permits();
            q.end(true, None);
            held
        };
        let (held, ()) = tokio::join!(fill, q.deliver(rx, &mut client));
        assert_eq!(held, 0);
        assert_eq!(client.body.len(), 2010);
        assert!(client.finished);
    }

    #[tokio::test]
    async fn a_spent_budget_makes_a_fill_wait_for_its_client() {
        let budget = budget();
        let (other, _other_pieces) = queue(&budget, GAP, true);
        // Another fetch holds all but 10 bytes of the budget.
        let hold = budget
            .clone()
            .try_acquire_many_owned(BUDGET as u32 - 10)
            .expect("budget");
        let (q, _pieces) = queue(&budget, GAP, true);
        q.push(piece(100)).await; // in step
        let waited = tokio::time::timeout(Duration::from_millis(50), q.push(piece(100))).await;
        assert!(waited.is_err(), "pushed past the budget");
        drop((hold, other));
    }

    /// A client's response as the writer sees it.
    #[derive(Default)]
    struct Client {
        body: Vec<u8>,
        writes: usize,
        /// The write that fails (0: none).
        fails_at: usize,
        finished: bool,
        closed: bool,
        /// Told when the client leaves (never, without it).
        leaves: Option<Arc<Notify>>,
    }

    impl ClientSink for Client {
        async fn send_data_parts(&mut self, parts: &[Bytes]) -> std::io::Result<()> {
            self.writes += 1;
            if self.writes == self.fails_at {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            // A slow client: the fill gets ahead of it.
            tokio::time::sleep(Duration::from_millis(5)).await;
            parts.iter().for_each(|p| self.body.extend_from_slice(p));
            Ok(())
        }
        async fn finish(&mut self, _: Option<&HeaderMap>) -> std::io::Result<()> {
            self.finished = true;
            Ok(())
        }
        fn close_after(&mut self) {
            self.closed = true;
        }
        async fn gone(&mut self) {
            match &self.leaves {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        }
    }

    /// 3 MiB in 256 pieces of 12 KiB, numbered.
    fn pieces() -> Vec<Bytes> {
        (0..256u32).map(|i| Bytes::from(vec![i as u8; 12 << 10])).collect()
    }

    #[tokio::test]
    async fn a_fill_gaps_ahead_of_a_slow_client_gets_every_byte_to_it_in_order_then_the_end() {
        let budget = budget();
        let (q, rx) = queue(&budget, GAP, true);
        let mut client = Client::default();
        let fill = async {
            let mut most = 0;
            for p in pieces() {
                q.push(p).await;
                most = most.max(q.queued.load(Ordering::Acquire));
            }
            q.end(true, None);
            most
        };
        let (most, ()) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(fill, q.deliver(rx, &mut client))
        })
        .await
        .expect("the fill and the writer ended");
        let sent: Vec<u8> = pieces().iter().flat_map(|p| p.to_vec()).collect();
        assert!(client.body == sent, "not the bytes queued, in order");
        assert!(client.finished && !client.closed);
        assert!(most > 12 << 10, "the fill never got ahead: {most}");
        assert!(most <= GAP + (12 << 10), "{most} bytes queued");
        assert!(client.writes < 256, "queued pieces not written together");
        assert_eq!(budget.available_permits(), BUDGET);
    }

    #[tokio::test]
    async fn a_fetch_that_broke_closes_the_connection_after_what_was_queued() {
        let budget = budget();
        let (q, rx) = queue(&budget, GAP, true);
        let mut client = Client::default();
        let fill = async {
            q.push(piece(100)).await;
            q.push(piece(100)).await;
            q.end(false, None);
        };
        tokio::join!(fill, q.deliver(rx, &mut client));
        assert_eq!(client.body.len(), 200);
        assert!(client.closed && !client.finished);
    }

    #[tokio::test]
    async fn a_client_that_fails_lets_a_waiting_fill_go_and_tells_it() {
        let budget = budget();
        let (q, rx) = queue(&budget, GAP, true);
        let mut client = Client {
            fails_at: 2,
            ..Client::default()
        };
        let fill = async {
            for p in pieces() {
                q.push(p).await;
            }
            // The fill, waiting on its origin, hears of it.
            q.left().await;
            q.end(true, None);
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(fill, q.deliver(rx, &mut client))
        })
        .await
        .expect("the fill waited for a client that failed");
        assert!(!q.client_ok());
        assert!(client.closed && !client.finished);
        assert_eq!(budget.available_permits(), BUDGET, "what was queued kept its share");
    }

    #[tokio::test]
    async fn a_client_that_leaves_while_the_origin_is_quiet_is_told_to_the_fill_unless_not_watched() {
        for watch in [true, false] {
            let budget = budget();
            let (q, rx) = queue(&budget, GAP, watch);
            let leaves = Arc::new(Notify::new());
            // Gone from the start: seen once the writer has waited WATCH_AFTER.
            leaves.notify_one();
            let mut client = Client {
                leaves: Some(leaves),
                ..Client::default()
            };
            let fill = async {
                q.push(piece(100)).await;
                let told = tokio::time::timeout(WATCH_AFTER * 5, q.left()).await.is_ok();
                q.end(true, None);
                told
            };
            let (told, ()) = tokio::join!(fill, q.deliver(rx, &mut client));
            assert_eq!(client.body.len(), 100, "watch = {watch}");
            assert_eq!(told, watch, "watch = {watch}");
            assert_eq!(!q.client_ok(), watch);
            assert_eq!((client.closed, client.finished), (watch, !watch));
        }
    }

    #[tokio::test]
    async fn once_the_client_is_gone_pushes_neither_wait_nor_queue() {
        let budget = budget();
        let (q, pieces) = queue(&budget, GAP, true);
        q.push(piece(10)).await;
        q.gone.store(true, Ordering::Release);
        let pushed = tokio::time::timeout(Duration::from_millis(50), q.push(piece((GAP * 2) as usize))).await;
        assert!(pushed.is_ok(), "waited for a client that is gone");
        assert_eq!(q.queued.load(Ordering::Acquire), 10);
        drop(pieces);
    }
}
