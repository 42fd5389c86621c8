//! The connection counts of `limits.max_connections_per_client`, kept by
//! the worker processes together (`server.processes = N > 1`), so that a
//! client holds at most the cap over all of them, not N times it (as
//! nginx keeps a `limit_conn` zone in shared memory).
//!
//! A memory file the supervisor makes and every worker maps (`handover`):
//! a table of [`CLIENTS`] slots, each one word: a client's tag (40 bits of
//! a SipHash of the client, keyed by a secret drawn once into the memory)
//! and its open connections (24 bits), 0 when free. A client's slot is one
//! of the [`WINDOW`] from where its hash points; a connection is taken by
//! compare-and-swap on the word (the cap checked in the same step), given
//! back the same way, and the slot freed when its count reaches 0. No
//! lock.
//!
//! Then a column per worker: the connections that worker holds in each
//! slot, which only it writes. A worker that dies (killed, crashed) cannot
//! give its connections back; the supervisor does, from its column, before
//! it starts the next worker in its place ([`Shared::give_back`]). A
//! worker takes from the table before it adds to its column and takes
//! from its column before it gives back to the table, so one that dies
//! between the two can only leave a connection counted (a client with one
//! place fewer), never give back one it did not take (another client's).
//!
//! A single process keeps the same table in memory of its own. A client
//! finding every slot of its window held by others is counted by its
//! worker process alone (`client_limit`'s own table), and said so.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the inherited memory file to a worker.
pub const ENV_FD: &str = "PORTICO_CONNS_FD";

/// How many clients with connections open the table has room for: 512
/// KiB, and 256 KiB a worker for its column, touched a page at a time.
pub const CLIENTS: usize = 1 << 16;

/// The slots a client's count may be in: this many, from the one its hash
/// names.
const WINDOW: usize = 8;

/// The words of the memory: the layout's mark, the secret, the slots, then
/// each worker's column (two 32-bit counts a word).
const LAYOUT: usize = 0;
const SECRET: usize = 1;
const SLOTS: usize = 2;
const COLUMNS: usize = SLOTS + CLIENTS;
const COLUMN_WORDS: usize = CLIENTS / 2;

/// What the [`LAYOUT`] word holds: changed with the layout or the hash.
const LAYOUT_MARK: u64 = u64::from_be_bytes(*b"pconns\x00\x01");

/// A slot's count: its low 24 bits (the cap is at most 1,000,000).
const COUNT_BITS: u32 = 24;
const COUNT: u64 = (1 << COUNT_BITS) - 1;

/// The words a memory for `workers` workers has.
const fn words_for(workers: usize) -> usize {
    COLUMNS + workers * COLUMN_WORDS
}

/// The table as this process sees it: the memory, and whose column it
/// writes.
struct Table {
    words: &'static [AtomicU64],
    worker: usize,
}

/// Why this worker could not map the counts it was handed, if so.
static NOT_MAPPED: OnceLock<String> = OnceLock::new();

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| match inherited() {
        Some((worker, Ok(words))) => Table { words, worker },
        Some((_, Err(e))) => {
            // Said by `report`, once the error log is open.
            let _ = NOT_MAPPED.set(e);
            own()
        }
        None => own(),
    })
}

/// Maps the counts now if nothing has yet, and says in the error log if
/// this worker could not: called once the log is open.
pub fn report() {
    table();
    if let Some(e) = NOT_MAPPED.get() {
        tracing::warn!(
            "cannot map the connection counts shared with the other workers ({e}): this worker keeps \
             limits.max_connections_per_client on its own"
        );
    }
}

/// A table of this process's own.
fn own() -> Table {
    static OWN: [AtomicU64; words_for(1)] = [const { AtomicU64::new(0) }; words_for(1)];
    Table { words: &OWN, worker: 0 }
}

/// The memory file a supervisor handed this worker, mapped with room for
/// its column, and the worker's number: None when this is no worker or
/// none was handed.
fn inherited() -> Option<(usize, Result<&'static [AtomicU64], String>)> {
    let worker = std::env::var("PORTICO_WORKER").ok()?.parse::<usize>().ok()?;
    let mapped = crate::handover::map_inherited(ENV_FD, words_for(worker + 1))?;
    Some((worker, mapped.and_then(laid_out)))
}

/// `words` if laid out as this build lays them out.
fn laid_out(words: &'static [AtomicU64]) -> Result<&'static [AtomicU64], String> {
    let mark = words[LAYOUT].load(Ordering::Acquire);
    if mark != LAYOUT_MARK {
        return Err(format!(
            "the memory is laid out by another build of portico (mark {mark:#x}): restart the server"
        ));
    }
    Ok(words)
}

/// The supervisor's side: the memory file it hands each worker, and its
/// own mapping of it, to give back what a dead worker held.
pub struct Shared {
    fd: std::os::fd::OwnedFd,
    words: &'static [AtomicU64],
    workers: usize,
}

impl Shared {
    /// Makes the memory for `workers` workers: the table empty, each
    /// column 0. Close-on-exec (each worker is made to inherit it as it
    /// starts) and sealed at its size.
    pub fn create(workers: usize) -> std::io::Result<Shared> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let len = words_for(workers) * std::mem::size_of::<AtomicU64>();
        let file = crate::handover::shared_memory(c"portico-conns", len)?;
        file.write_all_at(&LAYOUT_MARK.to_ne_bytes(), (LAYOUT * 8) as u64)?;
        let words = crate::handover::map_words(file.as_raw_fd(), words_for(workers)).map_err(std::io::Error::other)?;
        Ok(Shared {
            fd: file.into(),
            words,
            workers,
        })
    }

    /// The memory file, to hand to a worker.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Gives back the connections worker `worker` held, now that it has
    /// exited (the next in its place starts with an empty column): their
    /// clients may open them again.
    pub fn give_back(&self, worker: usize) {
        if worker < self.workers {
            give_back_in(self.words, worker);
        }
    }
}

/// What [`admit`] found.
#[derive(Debug, PartialEq)]
pub enum Admit {
    /// Counted in this slot (give it back with [`release`]).
    In(u32),
    /// The client holds this many already, the cap or more.
    Over(u32),
    /// Every slot the client may use is another's: not counted here.
    NoRoom,
}

/// Takes a place for a new connection of `client` (`client_limit::key`)
/// under `cap`.
pub fn admit(client: u128, cap: u32) -> Admit {
    admit_in(table(), client, cap)
}

/// Gives back the place [`admit`] took in `slot`.
pub fn release(slot: u32) {
    release_in(table(), slot as usize);
}

/// The connections `client` holds open in the table, for tests.
#[cfg(test)]
pub fn open(client: u128) -> u32 {
    let t = table();
    let (start, tag) = place(t.words, client);
    window(start)
        .map(|i| slot(t.words, i).load(Ordering::Acquire))
        .find(|v| v >> COUNT_BITS == tag)
        .map_or(0, |v| (v & COUNT) as u32)
}

fn slot(words: &[AtomicU64], i: usize) -> &AtomicU64 {
    &words[SLOTS + i]
}

/// Worker `worker`'s word holding slot `i`'s count, and the count's shift
/// in it.
fn column(words: &[AtomicU64], worker: usize, i: usize) -> (&AtomicU64, u32) {
    (&words[COLUMNS + worker * COLUMN_WORDS + i / 2], 32 * (i % 2) as u32)
}

/// Where `client`'s window starts, and its tag (40 bits, never 0).
fn place(words: &[AtomicU64], client: u128) -> (usize, u64) {
    use std::hash::Hasher;
    // std's fixed SipHash-2-4, as `shared_buckets` uses: processes of two
    // builds sharing the memory place a client alike.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(crate::shared_buckets::secret_in(&words[SECRET]), LAYOUT_MARK);
    h.write_u128(client);
    let hash = h.finish();
    ((hash >> 40) as usize % CLIENTS, (hash & ((1 << 40) - 1)) | 1)
}

fn window(start: usize) -> impl Iterator<Item = usize> {
    (0..WINDOW).map(move |i| (start + i) % CLIENTS)
}

fn admit_in(t: &Table, client: u128, cap: u32) -> Admit {
    let (start, tag) = place(t.words, client);
    // Each try loses only to another process changing the window at that
    // moment; after a few, the client is counted by this process alone.
    'tries: for _ in 0..4 * WINDOW {
        let mut empty = None;
        let mut found = None;
        for i in window(start) {
            let v = slot(t.words, i).load(Ordering::SeqCst);
            if v >> COUNT_BITS == tag {
                found = Some((i, v));
                break;
            }
            if v == 0 && empty.is_none() {
                empty = Some(i);
            }
        }
        let i = match found {
            Some((i, mut v)) => loop {
                if v >> COUNT_BITS != tag {
                    // Freed (and maybe taken by another client) meanwhile.
                    continue 'tries;
                }
                let open = (v & COUNT) as u32;
                if open >= cap {
                    return Admit::Over(open);
                }
                match slot(t.words, i).compare_exchange(v, v + 1, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => break i,
                    Err(seen) => v = seen,
                }
            },
            None => {
                let Some(i) = empty else {
                    return Admit::NoRoom;
                };
                let first = (tag << COUNT_BITS) | 1;
                if slot(t.words, i)
                    .compare_exchange(0, first, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    continue;
                }
                // Another process may have given this client a slot at the
                // same time: the earlier in the window is the one, and
                // ours goes back (both look after their own swap, so at
                // least one sees the other's).
                if window(start)
                    .take_while(|&j| j != i)
                    .any(|j| slot(t.words, j).load(Ordering::SeqCst) >> COUNT_BITS == tag)
                {
                    drop_from(t.words, i, 1);
                    continue;
                }
                i
            }
        };
        let (word, shift) = column(t.words, t.worker, i);
        word.fetch_add(1 << shift, Ordering::AcqRel);
        return Admit::In(i as u32);
    }
    Admit::NoRoom
}

fn release_in(t: &Table, i: usize) {
    if i >= CLIENTS {
        return;
    }
    let (word, shift) = column(t.words, t.worker, i);
    // Never below 0, which would borrow from the neighbouring count.
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
        ((w >> shift) & u64::from(u32::MAX) > 0).then(|| w - (1 << shift))
    });
    drop_from(t.words, i, 1);
}

/// Takes `n` connections from slot `i`'s count, freeing it at 0. The
/// memory is written by every worker: a count short of `n` (which no
/// worker of this build leaves) is taken to 0, and a slot another process
/// keeps changing is left after a while rather than spun on.
fn drop_from(words: &[AtomicU64], i: usize, n: u64) {
    let s = slot(words, i);
    let mut v = s.load(Ordering::SeqCst);
    for _ in 0..1000 {
        let left = (v & COUNT).saturating_sub(n);
        let new = if left == 0 { 0 } else { (v & !COUNT) | left };
        match s.compare_exchange(v, new, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return,
            Err(seen) => v = seen,
        }
    }
}

/// Gives back everything worker `worker`'s column holds and empties it.
fn give_back_in(words: &[AtomicU64], worker: usize) {
    for w in 0..COLUMN_WORDS {
        let word = &words[COLUMNS + worker * COLUMN_WORDS + w];
        // Most columns are mostly zeros: read before writing.
        if word.load(Ordering::Acquire) == 0 {
            continue;
        }
        let held = word.swap(0, Ordering::AcqRel);
        for half in 0..2 {
            let n = (held >> (32 * half)) & u64::from(u32::MAX);
            if n > 0 {
                drop_from(words, 2 * w + half, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory of its own for a test, with room for `workers` columns.
    fn fresh(workers: usize) -> &'static [AtomicU64] {
        let words: &'static [AtomicU64] = Box::leak(
            (0..words_for(workers))
                .map(|_| AtomicU64::new(0))
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        );
        words[LAYOUT].store(LAYOUT_MARK, Ordering::Release);
        words
    }

    fn worker(words: &'static [AtomicU64], worker: usize) -> Table {
        Table { words, worker }
    }

    fn in_use(words: &[AtomicU64]) -> usize {
        (0..CLIENTS)
            .filter(|&i| slot(words, i).load(Ordering::Acquire) != 0)
            .count()
    }

    #[test]
    fn the_cap_holds_over_the_workers_together() {
        let words = fresh(2);
        let (a, b) = (worker(words, 0), worker(words, 1));
        let client = 0xC633_6401;
        let first = admit_in(&a, client, 3);
        assert!(matches!(first, Admit::In(_)));
        assert_eq!(admit_in(&b, client, 3), first);
        assert_eq!(admit_in(&b, client, 3), first);
        assert_eq!(admit_in(&a, client, 3), Admit::Over(3));
        assert_eq!(admit_in(&b, client, 3), Admit::Over(3));
        // Another client is not affected.
        assert!(matches!(admit_in(&a, 0xC633_6402, 3), Admit::In(_)));
        // A connection closed anywhere gives its place back.
        let Admit::In(i) = first else { unreachable!() };
        release_in(&a, i as usize);
        assert_eq!(admit_in(&b, client, 3), first);
    }

    #[test]
    fn the_last_connection_closed_frees_the_clients_slot() {
        let words = fresh(1);
        let a = worker(words, 0);
        let Admit::In(i) = admit_in(&a, 7, 2) else {
            panic!("not admitted")
        };
        assert_eq!(admit_in(&a, 7, 2), Admit::In(i));
        release_in(&a, i as usize);
        assert_eq!(in_use(words), 1);
        release_in(&a, i as usize);
        assert_eq!(in_use(words), 0, "the slot was not freed");
        assert_eq!(words[COLUMNS].load(Ordering::Acquire), 0, "the column still counts");
    }

    #[test]
    fn what_a_dead_worker_held_is_given_back_and_no_more() {
        let words = fresh(3);
        let (a, b) = (worker(words, 0), worker(words, 1));
        let client = 0x2001_0db8_0000_0001u128 << 64;
        for _ in 0..2 {
            assert!(matches!(admit_in(&a, client, 4), Admit::In(_)));
        }
        for _ in 0..2 {
            assert!(matches!(admit_in(&b, client, 4), Admit::In(_)));
        }
        // Clients only the dead worker held are freed altogether.
        let others: Vec<u128> = (100..300).collect();
        for c in &others {
            assert!(matches!(admit_in(&b, *c, 4), Admit::In(_)));
        }
        assert_eq!(admit_in(&a, client, 4), Admit::Over(4));
        give_back_in(words, 1);
        // The two b held are back; the two a holds still count.
        assert!(matches!(admit_in(&a, client, 4), Admit::In(_)));
        assert!(matches!(admit_in(&a, client, 4), Admit::In(_)));
        assert_eq!(admit_in(&a, client, 4), Admit::Over(4));
        assert_eq!(in_use(words), 1, "the dead worker's other clients are still counted");
        let column = &words[COLUMNS + COLUMN_WORDS..COLUMNS + 2 * COLUMN_WORDS];
        assert!(column.iter().all(|w| w.load(Ordering::Acquire) == 0));
    }

    #[test]
    fn a_client_whose_window_is_all_taken_is_not_counted_here() {
        let words = fresh(1);
        let a = worker(words, 0);
        let client = 42;
        let (start, tag) = place(words, client);
        for i in window(start) {
            slot(words, i).store(((tag ^ 2) << COUNT_BITS) | 1, Ordering::Release);
        }
        assert_eq!(admit_in(&a, client, 5), Admit::NoRoom);
        // One freed: the client takes it.
        slot(words, (start + 5) % CLIENTS).store(0, Ordering::Release);
        assert_eq!(admit_in(&a, client, 5), Admit::In(((start + 5) % CLIENTS) as u32));
    }

    #[test]
    fn two_workers_opening_and_closing_one_clients_connections_at_once_end_at_zero() {
        let words = fresh(2);
        let run = |w: usize| {
            std::thread::spawn(move || {
                let t = worker(words, w);
                let mut refused = 0;
                for n in 0..20_000u32 {
                    // Three clients, each opened and closed by both.
                    let client = u128::from(n % 3);
                    match admit_in(&t, client, 1_000) {
                        Admit::In(i) => release_in(&t, i as usize),
                        Admit::Over(_) | Admit::NoRoom => refused += 1,
                    }
                }
                refused
            })
        };
        let (x, y) = (run(0), run(1));
        assert_eq!(x.join().unwrap() + y.join().unwrap(), 0);
        assert_eq!(in_use(words), 0, "a slot was left counted");
    }

    #[test]
    fn a_memory_file_of_another_layout_is_not_mapped() {
        let words = fresh(1);
        words[LAYOUT].store(1, Ordering::Release);
        let err = laid_out(words).expect_err("another layout");
        assert!(err.contains("another build"), "{err}");
    }

    #[test]
    fn the_supervisors_mapping_and_a_workers_are_one_table() {
        let shared = Shared::create(2).expect("memfd");
        use std::os::fd::AsRawFd;
        let theirs = crate::handover::map_words(shared.fd().as_raw_fd(), words_for(2)).expect("map");
        let b = worker(laid_out(theirs).expect("laid out"), 1);
        assert!(matches!(admit_in(&b, 9, 1), Admit::In(_)));
        assert_eq!(admit_in(&b, 9, 1), Admit::Over(1));
        shared.give_back(1);
        assert!(matches!(admit_in(&b, 9, 1), Admit::In(_)));
        // A worker number past the memory's is nothing to give back.
        shared.give_back(7);
    }
}
