//! Request collapsing: concurrent misses for one key make one origin fetch.
//! The first request (the leader) fetches; the others (followers) wait for
//! its response head and then read the body from the shared spool as it
//! arrives, each at its own pace.
//!
//! The spool is bounded: while it holds at most [`SPOOL_LIMIT`] bytes it
//! keeps the whole body, so a follower may join from the first byte; past
//! that, chunks every follower has read are dropped (a large object does not
//! sit in memory while it streams to the client and the disk), and a request
//! that joins afterwards is *late*: it reads the fetch's disk file (below),
//! or without one waits for the fetch to end, then looks the (now stored)
//! object up or fetches for itself.
//!
//! A follower whose client reads slower than the origin sends keeps what
//! it has not read: past [`LAG_LIMIT`] behind the leader it is left
//! *behind* (its chunks dropped). Without that, one client that stopped
//! reading held every byte of the object in memory for as long as its
//! connection lasted.
//!
//! Late and behind followers read from the disk tier's file as the
//! leader writes it, when the object is being stored there (the leader
//! publishes its [`WriteTap`] and how far it has written,
//! [`Leader::on_disk`]), as Squid's collapsed requests read a store entry
//! being swapped out and ATS's read-while-writer does: they chase the
//! writer, then send what is left from the stored object once the fetch
//! has ended. A body the memory tier is to keep whole is written to disk
//! only at the commit: the spool keeps all of it instead
//! ([`Leader::data_kept`]; the store holds those bytes anyway). Without a
//! file to read (no disk tier; a write that gave up), they wait for the
//! end.

use super::disk::WriteTap;
use super::key::ObjectId;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;
use tokio::sync::Notify;

/// Body bytes a flight keeps for followers that have not joined yet; past
/// this, only what joined followers still have to read is kept (unless
/// the store keeps the body in memory anyway while it is fetched,
/// [`Leader::data_kept`]).
pub const SPOOL_LIMIT: u64 = 1 << 20;

/// Most body bytes a flight keeps for its slowest follower: the followers
/// further behind are left behind ([`Next::Behind`]).
pub const LAG_LIMIT: u64 = 4 * SPOOL_LIMIT;

/// The body bytes the misses of one worker may hold ahead of their own
/// clients, all together (`cache.read_ahead_memory`; each fetch at most
/// `cache.read_ahead_gap` of them). Past it, each fetch waits for its
/// client.
#[derive(Debug, Clone)]
pub struct ReadAheadBudget {
    /// A permit a byte.
    pub permits: Arc<tokio::sync::Semaphore>,
    /// Its size in bytes.
    bytes: usize,
}

impl ReadAheadBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: u64) -> ReadAheadBudget {
        let bytes = ReadAheadBudget::size(bytes);
        ReadAheadBudget {
            permits: Arc::new(tokio::sync::Semaphore::new(bytes)),
            bytes,
        }
    }

    /// The budget after a reload to `bytes`: this one (with what fetches
    /// hold of it) when its size is unchanged, else a new one, which the
    /// fetches after the reload share; those under way keep to the old.
    pub fn resized(&self, bytes: u64) -> ReadAheadBudget {
        if ReadAheadBudget::size(bytes) == self.bytes {
            self.clone()
        } else {
            ReadAheadBudget::new(bytes)
        }
    }

    /// The permits a budget of `bytes` holds.
    fn size(bytes: u64) -> usize {
        usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS)
    }
}

/// Where a joined follower is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cursor {
    /// Its next chunk number.
    At(usize),
    /// Gone (dropped).
    Gone,
    /// Fell more than [`LAG_LIMIT`] behind; reads nothing more here.
    Behind,
}

impl Cursor {
    fn at(self) -> Option<usize> {
        match self {
            Cursor::At(n) => Some(n),
            Cursor::Gone | Cursor::Behind => None,
        }
    }
}

/// The response head the leader got, as followers will send it.
#[derive(Debug, Clone)]
pub struct SharedHead {
    /// Status.
    pub status: StatusCode,
    /// Headers as stored (hop-by-hop removed, Via added).
    pub headers: HeaderMap,
    /// Content length if known.
    pub length: Option<u64>,
    /// The response's Vary field names (empty if it does not vary).
    pub vary: Vec<String>,
    /// The leader's request values for those fields: a follower whose
    /// request differs must fetch its own variant.
    pub variant: Vec<(String, Option<String>)>,
    /// When the leader's request was sent and its response head arrived
    /// (RFC 9111 4.2.3), for the `Age` followers send.
    pub request_time: SystemTime,
    /// See `request_time`.
    pub response_time: SystemTime,
    /// The address the response comes from (`StoredMeta::origin`): a
    /// follower may be sent it only where its stored copy could be.
    pub origin: Option<std::net::IpAddr>,
}

/// How a fetch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Still arriving.
    Running,
    /// Complete.
    Complete,
    /// Broken mid-way (followers must cut their clients off).
    Failed,
    /// The response cannot be shared (not storable): followers fetch for
    /// themselves.
    NotShared,
    /// The leader failed before a response head arrived (origin down,
    /// timeout): one follower retries and the others follow it.
    Abandoned,
    /// A revalidation's leader got no usable answer from the origin (refused,
    /// reset, timed out, or a 5xx it served stale over): followers apply
    /// their own stale-on-error rules (RFC 9111 4.2.4) or ask the origin
    /// themselves, rather than retrying one after another.
    OriginFailed,
}

#[derive(Debug)]
struct State {
    head: Option<Arc<SharedHead>>,
    /// Body chunks not yet dropped; `chunks[0]` is chunk number `base`.
    chunks: VecDeque<Bytes>,
    base: usize,
    /// Bytes in `chunks`.
    spooled: u64,
    /// Chunks have been (or are being) dropped: new followers are late.
    trimming: bool,
    /// Each joined follower's place.
    cursors: Vec<Cursor>,
    /// Followers alive, late ones (without a cursor) included.
    followers: usize,
    ending: Ending,
    /// The file the leader's disk writer writes the body to, once it
    /// exists, and the body bytes written to it.
    disk: Option<WriteTap>,
    on_disk: u64,
}

impl State {
    /// Drops the chunks every joined follower has read.
    fn trim(&mut self) {
        let end = self.base + self.chunks.len();
        let keep_from = self.cursors.iter().filter_map(|c| c.at()).min().unwrap_or(end);
        while self.base < keep_from {
            let Some(c) = self.chunks.pop_front() else { break };
            self.spooled -= c.len() as u64;
            self.base += 1;
        }
    }

    /// Leaves behind the followers whose unread bytes exceed [`LAG_LIMIT`].
    fn leave_laggards_behind(&mut self) {
        if self.spooled <= LAG_LIMIT {
            return;
        }
        // The first chunk number within LAG_LIMIT of the end.
        let mut kept = 0u64;
        let mut first = self.base + self.chunks.len();
        for c in self.chunks.iter().rev() {
            if kept + c.len() as u64 > LAG_LIMIT {
                break;
            }
            kept += c.len() as u64;
            first -= 1;
        }
        for cursor in &mut self.cursors {
            if cursor.at().is_some_and(|n| n < first) {
                *cursor = Cursor::Behind;
            }
        }
    }
}

/// One fetch in flight.
#[derive(Debug)]
pub struct Flight {
    /// The key text of what is fetched: a request joins only a flight for
    /// the same text, not merely the same 128-bit id (as lookups compare
    /// the stored text), so two keys whose ids collide never share a
    /// response.
    key: Box<str>,
    state: Mutex<State>,
    changed: Notify,
    /// The last follower has gone (for [`Leader::unfollowed`]).
    unfollowed: Notify,
}

impl Flight {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_waiters();
    }
}

/// The leader's handle: publishes the head and the body; dropping it
/// without `finish` tells followers the fetch failed (or was not shared).
pub struct Leader {
    flights: Arc<Flights>,
    id: ObjectId,
    flight: Arc<Flight>,
    ended: bool,
    /// The last `on_disk` count published: the same again takes no lock.
    on_disk: u64,
    /// The disk write gave up (`off_disk`): nothing is published again.
    off_disk: bool,
}

impl Leader {
    /// The response head is known and shareable.
    pub fn head(&self, head: SharedHead) {
        self.flight.update(|s| s.head = Some(Arc::new(head)));
    }

    /// More body bytes.
    pub fn data(&self, chunk: Bytes) {
        self.data_with(chunk, false);
    }

    /// More body bytes, which the store keeps in memory anyway while the
    /// body is fetched (for the memory tier, or for the disk writer's
    /// commit): the spool keeps them all too, at no cost while the fetch
    /// runs, past [`SPOOL_LIMIT`], so that requests joining later start
    /// from the first byte. The first chunk the store does not keep
    /// starts the trimming, as [`Leader::data`] does, and so does the
    /// fetch's end.
    pub fn data_kept(&self, chunk: Bytes) {
        self.data_with(chunk, true);
    }

    fn data_with(&self, chunk: Bytes, kept: bool) {
        self.flight.update(|s| {
            s.spooled += chunk.len() as u64;
            s.chunks.push_back(chunk);
            if s.spooled > SPOOL_LIMIT && !kept {
                s.trimming = true;
            }
            if s.trimming {
                s.leave_laggards_behind();
                s.trim();
            }
        });
    }

    /// The leader's disk writer has written `written` body bytes to its
    /// file (`tap`, asked for only the first time): late and behind
    /// followers read them there. Followers are woken only when it grew.
    pub fn on_disk(&mut self, written: u64, tap: impl FnOnce() -> Option<WriteTap>) {
        if written <= self.on_disk || self.off_disk {
            return;
        }
        let mut s = self.flight.lock();
        if s.disk.is_none() {
            let Some(t) = tap() else { return };
            s.disk = Some(t);
        }
        s.on_disk = written;
        self.on_disk = written;
        drop(s);
        self.flight.changed.notify_waiters();
    }

    /// The body is no longer being written to disk (the store gave up:
    /// a write failed, the disk budget, an unknown length past
    /// `max_object_size`): followers stop reading the file, and requests
    /// that join later wait for the end as without one. The flight lets
    /// go of the file, so an aborted write's space is freed at once.
    pub fn off_disk(&mut self) {
        if self.off_disk {
            return;
        }
        self.off_disk = true;
        if self.on_disk > 0 {
            self.flight.update(|s| s.disk = None);
        }
    }

    /// Whether any follower is still waiting on this fetch (its client
    /// may still be there): a fetch whose own client left goes on for it.
    pub fn followed(&self) -> bool {
        self.flight.lock().followers > 0
    }

    /// Completes when no follower is left (at once if none is): a fetch
    /// whose own client left and which went on for its followers decides
    /// again when the last of them goes, though the origin is quiet.
    pub async fn unfollowed(&self) {
        loop {
            let notified = self.flight.unfollowed.notified();
            tokio::pin!(notified);
            // Registered before the count is read: a follower leaving in
            // between still wakes it.
            notified.as_mut().enable();
            if self.flight.lock().followers == 0 {
                return;
            }
            notified.await;
        }
    }

    /// True when no follower waits, and then no request can join this
    /// fetch any more: a later one leads a fetch of its own. The check and
    /// the closing are one step under the lock [`Flights::join`] takes, so
    /// a leader about to stop a fetch nobody waits for (`cache.quick_abort`)
    /// never has a request join it in between, to be sent part of a body.
    pub fn close_if_unfollowed(&self) -> bool {
        let mut map = self.flights.map.lock().unwrap_or_else(|e| e.into_inner());
        if self.flight.lock().followers > 0 {
            return false;
        }
        if map.get(&self.id).is_some_and(|f| Arc::ptr_eq(f, &self.flight)) {
            map.remove(&self.id);
        }
        true
    }

    /// Ends the fetch.
    pub fn finish(mut self, ending: Ending) {
        self.end(ending);
    }

    fn end(&mut self, ending: Ending) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.flights.remove(self.id, &self.flight);
        // The file is let go of too: what a follower has not read from it
        // comes from the stored object now (or never, the fetch broken).
        // A spool kept whole (`data_kept`) is trimmed as any other from
        // here: the store's copy is its own now, and a follower that
        // stopped reading must not hold a second one.
        self.flight.update(|s| {
            s.ending = ending;
            s.disk = None;
            s.trimming = true;
            s.leave_laggards_behind();
            s.trim();
        });
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        let head_known = self.flight.lock().head.is_some();
        self.end(if head_known { Ending::Failed } else { Ending::Abandoned });
    }
}

/// A follower's view of a flight.
pub struct Follower {
    flight: Arc<Flight>,
    /// Its slot in the flight's cursors; None for a late follower (joined
    /// after chunks were dropped), which cannot read the spool (only the
    /// fetch's disk file).
    slot: Option<usize>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        let mut s = self.flight.lock();
        s.followers -= 1;
        if let Some(slot) = self.slot {
            s.cursors[slot] = Cursor::Gone;
            if s.trimming {
                s.trim();
            }
        }
        if s.followers == 0 {
            self.flight.unfollowed.notify_waiters();
        }
    }
}

/// What a follower gets next.
#[derive(Debug)]
pub enum Next {
    /// Body bytes.
    Data(Bytes),
    /// The body is complete.
    End,
    /// The fetch broke: cut the client off.
    Failed,
    /// This follower fell more than [`LAG_LIMIT`] behind and its chunks
    /// were dropped (or joined late, after they were): read what the
    /// leader has written to disk ([`Follower::on_disk`]) until the fetch
    /// ends, then send the rest from the stored object.
    Behind,
}

/// What a late or behind follower may read next.
#[derive(Debug)]
pub enum OnDisk {
    /// The body up to this many bytes is in the tap's file.
    Written(WriteTap, u64),
    /// The fetch ended (or broke) with no more bytes on disk for it.
    Ended(Ending),
}

impl Follower {
    /// Waits for the head; None when the response is not shared, and for
    /// a late follower once the fetch has ended: look the object up again
    /// or fetch it yourself. A late follower gets the head while the
    /// fetch runs if the body is being written to disk, where it reads it
    /// ([`Next::Behind`]).
    pub async fn head(&mut self) -> Option<Arc<SharedHead>> {
        loop {
            let notified = self.flight.changed.notified();
            {
                let s = self.flight.lock();
                if self.slot.is_none()
                    && s.ending == Ending::Running
                    && s.disk.is_some()
                    && let Some(h) = &s.head
                {
                    return Some(h.clone());
                }
                if s.ending != Ending::Running && (self.slot.is_none() || s.head.is_none()) {
                    return None;
                }
                if let (Some(h), Some(_)) = (&s.head, self.slot) {
                    return Some(h.clone());
                }
            }
            notified.await;
        }
    }

    /// True when the leader failed before any response head: the caller
    /// should join again, so one waiter retries and the rest follow it.
    pub fn abandoned(&self) -> bool {
        self.flight.lock().ending == Ending::Abandoned
    }

    /// True when a revalidation's leader ended with [`Ending::OriginFailed`].
    pub fn origin_failed(&self) -> bool {
        self.flight.lock().ending == Ending::OriginFailed
    }

    /// The next piece of the body.
    pub async fn next(&mut self) -> Next {
        let Some(slot) = self.slot else {
            // A late follower is given the head only while the fetch's file
            // is there, and reads from it; should the fetch end (or its
            // write give up) in between, `on_disk` says so and the rest
            // comes from the stored object.
            return Next::Behind;
        };
        loop {
            let notified = self.flight.changed.notified();
            {
                let mut s = self.flight.lock();
                if s.cursors[slot] == Cursor::Behind {
                    return Next::Behind;
                }
                let next = s.cursors[slot].at().unwrap_or(usize::MAX);
                if let Some(c) = next.checked_sub(s.base).and_then(|i| s.chunks.get(i)).cloned() {
                    s.cursors[slot] = Cursor::At(next + 1);
                    if s.trimming {
                        s.trim();
                    }
                    return Next::Data(c);
                }
                match s.ending {
                    Ending::Running => {}
                    Ending::Complete => return Next::End,
                    Ending::Failed | Ending::NotShared | Ending::Abandoned | Ending::OriginFailed => {
                        return Next::Failed;
                    }
                }
            }
            notified.await;
        }
    }

    /// For a follower past [`Next::Behind`] that has sent `from` body
    /// bytes: waits until the leader's disk writer has written more than
    /// that, or the fetch has ended (a broken fetch says so at once, a
    /// complete one once every byte written is read).
    pub async fn on_disk(&mut self, from: u64) -> OnDisk {
        loop {
            let notified = self.flight.changed.notified();
            {
                let s = self.flight.lock();
                match s.ending {
                    Ending::Running | Ending::Complete => {}
                    broken => return OnDisk::Ended(broken),
                }
                if let Some(tap) = &s.disk
                    && s.on_disk > from
                {
                    return OnDisk::Written(tap.clone(), s.on_disk);
                }
                if s.ending == Ending::Complete {
                    return OnDisk::Ended(Ending::Complete);
                }
            }
            notified.await;
        }
    }
}

/// The fetches in flight, by object id.
#[derive(Debug, Default)]
pub struct Flights {
    map: Mutex<crate::util::PreHashedMap<ObjectId, Arc<Flight>>>,
}

/// Leading a new fetch, or following one under way.
pub enum Role {
    /// Fetch, and publish through this handle.
    Leader(Leader),
    /// Wait for the leader.
    Follower(Follower),
}

impl Flights {
    /// Joins the fetch for `id` (the id of `key`), or starts one.
    pub fn join(self: &Arc<Self>, id: ObjectId, key: &str) -> Role {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let existing = map.get(&id);
        // Another key's flight under the same id keeps its place: this
        // fetch leads alone, shared with nobody.
        let collides = existing.is_some_and(|f| &*f.key != key);
        if let Some(f) = existing.filter(|_| !collides) {
            // Joined from the first chunk, unless chunks are being dropped
            // (decided under the same lock, so none is dropped unseen).
            let mut s = f.lock();
            s.followers += 1;
            let slot = (!s.trimming).then(|| {
                let base = s.base;
                s.cursors.push(Cursor::At(base));
                s.cursors.len() - 1
            });
            drop(s);
            return Role::Follower(Follower {
                flight: f.clone(),
                slot,
            });
        }
        let flight = Arc::new(Flight {
            key: key.into(),
            state: Mutex::new(State {
                head: None,
                chunks: VecDeque::new(),
                base: 0,
                spooled: 0,
                trimming: false,
                cursors: Vec::new(),
                followers: 0,
                ending: Ending::Running,
                disk: None,
                on_disk: 0,
            }),
            changed: Notify::new(),
            unfollowed: Notify::new(),
        });
        if !collides {
            map.insert(id, flight.clone());
        }
        Role::Leader(Leader {
            flights: self.clone(),
            id,
            flight,
            ended: false,
            on_disk: 0,
            off_disk: false,
        })
    }

    fn remove(&self, id: ObjectId, flight: &Arc<Flight>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&id).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            map.remove(&id);
        }
    }

    /// True if no fetch is in flight (the tests' check that every flight
    /// ends).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.lock().map_or(0, |m| m.len()) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_closed_while_unfollowed_takes_no_follower_and_the_next_request_leads() {
        let flights = Arc::new(Flights::default());
        let Role::Leader(leader) = flights.join(ObjectId(1), "k") else {
            panic!("first is leader")
        };
        let Role::Follower(f) = flights.join(ObjectId(1), "k") else {
            panic!("second follows")
        };
        assert!(!leader.close_if_unfollowed(), "a follower waits");
        drop(f);
        assert!(leader.close_if_unfollowed());
        assert!(flights.is_empty(), "closed to joins at once");
        let Role::Leader(next) = flights.join(ObjectId(1), "k") else {
            panic!("a request after the close must lead, not follow a stopping fetch")
        };
        // The first leader's end does not remove the new flight.
        leader.finish(Ending::Failed);
        assert!(!flights.is_empty());
        next.finish(Ending::Complete);
        assert!(flights.is_empty());
    }

    #[tokio::test]
    async fn followers_stream_what_the_leader_publishes() {
        let flights = Arc::new(Flights::default());
        let Role::Leader(leader) = flights.join(ObjectId(1), "k") else {
            panic!("first is leader")
        };
        let Role::Follower(mut f) = flights.join(ObjectId(1), "k") else {
            panic!("second follows")
        };
        let task = tokio::spawn(async move {
            let head = f.head().await.expect("shared");
            let mut body = Vec::new();
            loop {
                match f.next().await {
                    Next::Data(d) => body.extend_from_slice(&d),
                    Next::End => return (head.status, body),
                    Next::Failed | Next::Behind => panic!("failed"),
                }
            }
        });
        leader.head(SharedHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            length: Some(6),
            vary: Vec::new(),
            variant: Vec::new(),
            request_time: SystemTime::now(),
            response_time: SystemTime::now(),
            origin: None,
        });
        leader.data(Bytes::from_static(b"abc"));
        tokio::task::yield_now().await;
        leader.data(Bytes::from_static(b"def"));
        leader.finish(Ending::Complete);
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, b"abcdef");
        assert!(flights.is_empty());
        // A new request after the end leads a new fetch.
        assert!(matches!(flights.join(ObjectId(1), "k"), Role::Leader(_)));
    }

    #[tokio::test]
    async fn dropped_leader_releases_followers() {
        let flights = Arc::new(Flights::default());
        let leader = flights.join(ObjectId(2), "k");
        let Role::Follower(mut f) = flights.join(ObjectId(2), "k") else {
            panic!()
        };
        drop(leader);
        assert!(f.head().await.is_none());
        assert!(f.abandoned(), "a leader gone before its head abandons the flight");
        // Rejoining makes exactly one new leader.
        assert!(matches!(flights.join(ObjectId(2), "k"), Role::Leader(_)));
    }

    fn head_of(len: Option<u64>) -> SharedHead {
        SharedHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            length: len,
            vary: Vec::new(),
            variant: Vec::new(),
            request_time: SystemTime::now(),
            response_time: SystemTime::now(),
            origin: None,
        }
    }

    fn spooled(f: &Arc<Flight>) -> u64 {
        f.lock().spooled
    }

    #[tokio::test]
    async fn spool_is_bounded_and_late_followers_wait_for_the_end() {
        let flights = Arc::new(Flights::default());
        let Role::Leader(leader) = flights.join(ObjectId(3), "k") else {
            panic!("first is leader")
        };
        let Role::Follower(mut early) = flights.join(ObjectId(3), "k") else {
            panic!("second follows")
        };
        let flight = leader.flight.clone();
        leader.head(head_of(None));
        let chunk = Bytes::from(vec![7u8; 64 << 10]);
        let n = (SPOOL_LIMIT as usize / chunk.len()) * 3;
        // The early follower reads nothing yet: everything is kept for it.
        for _ in 0..n {
            leader.data(chunk.clone());
        }
        assert_eq!(spooled(&flight), (n * chunk.len()) as u64);
        // Past the limit a new follower is late.
        let Role::Follower(mut late) = flights.join(ObjectId(3), "k") else {
            panic!("joins")
        };
        // As the early follower reads, what it read is dropped.
        assert!(early.head().await.is_some());
        for _ in 0..n {
            assert!(matches!(early.next().await, Next::Data(d) if d.len() == chunk.len()));
        }
        assert_eq!(spooled(&flight), 0);
        // With no follower left, nothing is kept at all.
        drop(early);
        for _ in 0..n {
            leader.data(chunk.clone());
            assert_eq!(spooled(&flight), 0);
        }
        let waiting = tokio::spawn(async move { late.head().await.is_none() });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a late follower waits for the end");
        leader.finish(Ending::Complete);
        assert!(waiting.await.unwrap(), "then looks up or fetches itself");
    }

    /// A disk writer's file holding `body` for [`Leader::on_disk`].
    fn written_file(dir: &std::path::Path, body: &[u8]) -> (crate::cache::disk::DiskWriter, u64) {
        let cfg = crate::config::CacheConfig {
            dir: dir.to_path_buf(),
            disk: crate::config::Size(1 << 30),
            gc: crate::config::GcMode::Scheduled,
            ..crate::config::CacheConfig::default()
        };
        let store = crate::cache::disk::DiskStore::start_offline(&cfg, &mut |_| {}).expect("store");
        let meta = crate::cache::object::StoredMeta {
            key: "http://h/k".into(),
            variant: vec![],
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            request_time: SystemTime::UNIX_EPOCH,
            response_time: SystemTime::UNIX_EPOCH,
            origin: None,
            derived: Default::default(),
        };
        let mut w = store.writer_blocking(ObjectId(11), &meta).expect("writer");
        w.write_blocking(body).expect("write");
        let n = w.written();
        (w, n)
    }

    /// Whether `f` is still pending after a moment.
    async fn pending<T>(f: impl std::future::Future<Output = T>) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(50), f)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_late_follower_reads_the_fetchs_file_and_is_told_when_it_ends() {
        let dir = tempfile::tempdir().expect("dir");
        let flights = Arc::new(Flights::default());
        let Role::Leader(mut leader) = flights.join(ObjectId(11), "k") else {
            panic!("first is leader")
        };
        leader.head(head_of(None));
        leader.data(Bytes::from(vec![1u8; SPOOL_LIMIT as usize + 1]));
        let Role::Follower(mut late) = flights.join(ObjectId(11), "k") else {
            panic!("late follower")
        };
        // No file yet: it waits, as it did before files were read.
        assert!(pending(late.head()).await);
        let (w, n) = written_file(dir.path(), b"abc");
        leader.on_disk(n, || w.tap());
        assert!(late.head().await.is_some(), "the head, once there is a file to read");
        let Role::Follower(mut later) = flights.join(ObjectId(11), "k") else {
            panic!("another late follower")
        };
        assert!(later.head().await.is_some());
        assert!(matches!(late.next().await, Next::Behind));
        let OnDisk::Written(tap, upto) = late.on_disk(0).await else {
            panic!("the file's bytes")
        };
        assert_eq!(
            (tap.read(0, 3).await.expect("read"), upto),
            (Bytes::from_static(b"abc"), 3)
        );
        assert!(pending(late.on_disk(3)).await, "nothing more written yet");
        // The fetch ends before the other one's first read: it is not cut
        // off, it is told, and takes the rest from the stored object.
        leader.finish(Ending::Complete);
        assert!(matches!(later.next().await, Next::Behind));
        assert!(matches!(later.on_disk(0).await, OnDisk::Ended(Ending::Complete)));
        assert!(matches!(late.on_disk(3).await, OnDisk::Ended(Ending::Complete)));
    }

    #[tokio::test]
    async fn a_spool_kept_whole_is_trimmed_from_the_first_chunk_not_kept_or_the_end() {
        let chunk = Bytes::from(vec![3u8; 64 << 10]);
        let n = (LAG_LIMIT as usize / chunk.len()) * 2;
        for end_instead in [false, true] {
            let flights = Arc::new(Flights::default());
            let Role::Leader(leader) = flights.join(ObjectId(13), "k") else {
                panic!("first is leader")
            };
            let Role::Follower(mut slow) = flights.join(ObjectId(13), "k") else {
                panic!("follows")
            };
            let flight = leader.flight.clone();
            leader.head(head_of(None));
            assert!(slow.head().await.is_some());
            for _ in 0..n {
                leader.data_kept(chunk.clone());
            }
            // Kept whole: a request joining now starts from the first byte.
            let Role::Follower(mut joined) = flights.join(ObjectId(13), "k") else {
                panic!("follows")
            };
            assert!(joined.slot.is_some() && joined.head().await.is_some());
            assert_eq!(spooled(&flight), n as u64 * chunk.len() as u64);
            drop(joined);
            if end_instead {
                leader.finish(Ending::Complete);
            } else {
                leader.data(chunk.clone());
                let Role::Follower(late) = flights.join(ObjectId(13), "k") else {
                    panic!("follows")
                };
                assert!(late.slot.is_none(), "trimming: a later request is late");
            }
            // The follower that read nothing is left behind, the spool bounded.
            assert!(matches!(slow.next().await, Next::Behind), "end instead: {end_instead}");
            assert!(spooled(&flight) <= LAG_LIMIT, "{}", spooled(&flight));
        }
    }

    #[tokio::test]
    async fn once_the_store_gives_up_a_late_follower_waits_for_the_end() {
        let dir = tempfile::tempdir().expect("dir");
        let flights = Arc::new(Flights::default());
        let Role::Leader(mut leader) = flights.join(ObjectId(12), "k") else {
            panic!("first is leader")
        };
        leader.head(head_of(None));
        let (w, n) = written_file(dir.path(), b"abc");
        leader.on_disk(n, || w.tap());
        leader.data(Bytes::from(vec![1u8; SPOOL_LIMIT as usize + 1]));
        leader.off_disk();
        let Role::Follower(mut late) = flights.join(ObjectId(12), "k") else {
            panic!("late follower")
        };
        assert!(pending(late.head()).await, "no file to read any more");
        leader.finish(Ending::Complete);
        assert!(late.head().await.is_none(), "look it up, or fetch it");
    }

    #[tokio::test]
    async fn a_follower_more_than_lag_limit_behind_is_left_behind_and_pins_nothing() {
        let flights = Arc::new(Flights::default());
        let Role::Leader(leader) = flights.join(ObjectId(5), "k") else {
            panic!("first is leader")
        };
        let Role::Follower(mut slow) = flights.join(ObjectId(5), "k") else {
            panic!("second follows")
        };
        let Role::Follower(mut fast) = flights.join(ObjectId(5), "k") else {
            panic!("third follows")
        };
        let flight = leader.flight.clone();
        leader.head(head_of(None));
        assert!(slow.head().await.is_some() && fast.head().await.is_some());
        let chunk = Bytes::from(vec![7u8; 64 << 10]);
        let n = (LAG_LIMIT as usize / chunk.len()) * 4;
        for _ in 0..n {
            leader.data(chunk.clone());
            // The fast one keeps up.
            assert!(matches!(fast.next().await, Next::Data(_)));
            assert!(spooled(&flight) <= LAG_LIMIT, "{}", spooled(&flight));
        }
        // The slow one read nothing: left behind, its bytes dropped.
        assert!(matches!(slow.next().await, Next::Behind));
        assert_eq!(spooled(&flight), 0);
        // No file to read: it waits for the end of the fetch.
        let waiting = tokio::spawn(async move { slow.on_disk(0).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "it waits for the end of the fetch");
        leader.finish(Ending::Complete);
        assert!(matches!(waiting.await.unwrap(), OnDisk::Ended(Ending::Complete)));
        assert!(matches!(fast.next().await, Next::End));
    }

    #[test]
    fn a_key_whose_id_collides_with_a_fetch_in_flight_leads_its_own() {
        let flights = Arc::new(Flights::default());
        let Role::Leader(first) = flights.join(ObjectId(6), "http://a/") else {
            panic!("first is leader")
        };
        // Same id, another key: never a follower of the first.
        let Role::Leader(other) = flights.join(ObjectId(6), "http://b/") else {
            panic!("a colliding key must not follow")
        };
        // The first flight keeps its place for its own key.
        assert!(matches!(flights.join(ObjectId(6), "http://a/"), Role::Follower(_)));
        drop(other);
        assert!(matches!(flights.join(ObjectId(6), "http://a/"), Role::Follower(_)));
        drop(first);
        assert!(flights.is_empty());
    }

    #[tokio::test]
    async fn small_bodies_are_kept_whole_for_followers_joining_late() {
        let flights = Arc::new(Flights::default());
        let Role::Leader(leader) = flights.join(ObjectId(4), "k") else {
            panic!("first is leader")
        };
        leader.head(head_of(Some(6)));
        leader.data(Bytes::from_static(b"abc"));
        leader.data(Bytes::from_static(b"def"));
        let Role::Follower(mut f) = flights.join(ObjectId(4), "k") else {
            panic!("follows")
        };
        leader.finish(Ending::Complete);
        assert!(f.head().await.is_some());
        let mut body = Vec::new();
        while let Next::Data(d) = f.next().await {
            body.extend_from_slice(&d);
        }
        assert_eq!(body, b"abcdef");
    }
}
