//! The connection counts of `limits.max_connections_per_client`, kept by
//! the worker processes together (`server.processes = N > 1`), so that a
//! client holds at most the cap over all of them, not N times it (as
//! nginx keeps a `limit_conn` zone in shared memory).
//!
//! A memory file the supervisor makes and every worker maps (`handover`):
//! a table of `limits.client_table` slots, each one word: a client's tag (40 bits of
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

/// How many clients with connections open a table of this process's own
/// has room for, unless [`set_client_table`] says otherwise
/// (`limits.client_table`): 8 bytes each, and 4 a worker for its column,
/// touched a page at a time.
static CLIENTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1 << 18);

/// The most slots a table may have: a slot's number is 24 bits of its
/// client's hash.
const MOST: usize = 1 << 24;

/// Sets the size of a table of this process's own (`limits.client_table`),
/// before the first connection: the supervisor's memory file is made with
/// as many ([`Shared::create`]), and a worker's table is the one it maps.
pub fn set_client_table(n: usize) {
    CLIENTS.store(n.clamp(WINDOW, MOST), Ordering::Relaxed);
}

/// The slots a client's count may be in: this many, from the one its hash
/// names.
const WINDOW: usize = 8;

/// The words of the memory: the layout's mark, the secret, the number of
/// slots, the slots, then each worker's column (two 32-bit counts a word).
const LAYOUT: usize = 0;
const SECRET: usize = 1;
const SIZE: usize = 2;
const SLOTS: usize = 3;

/// What the [`LAYOUT`] word holds: changed with the layout or the hash.
const LAYOUT_MARK: u64 = u64::from_be_bytes(*b"pconns\x00\x02");

/// A slot's count: its low 24 bits (the cap is at most 1,000,000).
const COUNT_BITS: u32 = 24;
const COUNT: u64 = (1 << COUNT_BITS) - 1;

/// The words of a column of a table of `n` slots.
const fn column_words(n: usize) -> usize {
    n.div_ceil(2)
}

/// The words a memory of `n` slots for `workers` workers has.
const fn words_for(n: usize, workers: usize) -> usize {
    SLOTS + n + workers * column_words(n)
}

/// The table as this process sees it: the memory, its number of slots,
/// and whose column it writes.
struct Table {
    words: &'static [AtomicU64],
    n: usize,
    worker: usize,
}

/// Why this worker could not map the counts it was handed, if so.
static NOT_MAPPED: OnceLock<String> = OnceLock::new();

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| match inherited() {
        Some((worker, Ok((words, n)))) => Table { words, n, worker },
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

/// A table of this process's own, made at its first use (a connection,
/// after [`set_client_table`]).
fn own() -> Table {
    let n = CLIENTS.load(Ordering::Relaxed);
    Table {
        words: crate::handover::zeroed_words(words_for(n, 1)),
        n,
        worker: 0,
    }
}

/// The memory file a supervisor handed this worker, mapped, and its
/// number of slots; and the worker's number: None when this is no worker
/// or none was handed.
#[allow(clippy::type_complexity)]
fn inherited() -> Option<(usize, Result<(&'static [AtomicU64], usize), String>)> {
    let worker = std::env::var(crate::notify::WORKER_KEY).ok()?.parse::<usize>().ok()?;
    let mapped = crate::handover::map_inherited(ENV_FD, SLOTS)?;
    Some((worker, mapped.and_then(|words| laid_out(words, worker))))
}

/// `words` and their number of slots, if laid out as this build lays them
/// out, with a column for `worker`.
fn laid_out(words: &'static [AtomicU64], worker: usize) -> Result<(&'static [AtomicU64], usize), String> {
    crate::handover::check_mark(words, LAYOUT, LAYOUT_MARK)?;
    let n = usize::try_from(words[SIZE].load(Ordering::Acquire)).unwrap_or(0);
    // The worker's number comes from the environment: no arithmetic on
    // it overflows.
    let needed = worker
        .checked_add(1)
        .and_then(|w| w.checked_mul(column_words(n)))
        .and_then(|w| w.checked_add(SLOTS + n));
    if !(WINDOW..=MOST).contains(&n) || needed.is_none_or(|needed| words.len() < needed) {
        return Err(format!(
            "the memory has {} words, {n} slots: no column for worker {worker}",
            words.len()
        ));
    }
    Ok((words, n))
}

/// The supervisor's side: the memory file it hands each worker, and its
/// own mapping of it, to give back what a dead worker held.
pub struct Shared {
    file: std::fs::File,
    words: &'static [AtomicU64],
    n: usize,
    workers: usize,
}

impl Shared {
    /// Makes the memory of `n` slots for `workers` workers: the table
    /// empty, each column 0. Close-on-exec (each worker is made to inherit
    /// it as it starts) and sealed at its size.
    pub fn create(n: usize, workers: usize) -> std::io::Result<Shared> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let n = n.clamp(WINDOW, MOST);
        let len = words_for(n, workers) * std::mem::size_of::<AtomicU64>();
        let file = crate::handover::shared_memory(c"portico-conns", len)?;
        file.write_all_at(&LAYOUT_MARK.to_ne_bytes(), (LAYOUT * 8) as u64)?;
        file.write_all_at(&(n as u64).to_ne_bytes(), (SIZE * 8) as u64)?;
        let words =
            crate::handover::map_words(file.as_raw_fd(), words_for(n, workers)).map_err(std::io::Error::other)?;
        Ok(Shared {
            file,
            words,
            n,
            workers,
        })
    }

    /// The memory file, to hand to a worker.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    /// Gives back the connections worker `worker` held, now that it has
    /// exited (the next in its place starts with an empty column): their
    /// clients may open them again. The column is read with `pread`, which
    /// reads the pages the worker never touched as zeros without making
    /// them, and only the words it finds counts in are written.
    pub fn give_back(&self, worker: usize) {
        use std::os::unix::fs::FileExt;
        if worker >= self.workers {
            return;
        }
        let (n, words) = (self.n, column_words(self.n));
        let first = SLOTS + n + worker * words;
        let mut buf = vec![0u8; 64 << 10];
        let mut w = 0;
        while w < words {
            let want = ((words - w) * 8).min(buf.len());
            match self.file.read_at(&mut buf[..want], ((first + w) * 8) as u64) {
                Ok(got) if got >= 8 => {
                    let held = buf[..got - got % 8]
                        .chunks_exact(8)
                        .enumerate()
                        .filter(|(_, word)| word.iter().any(|b| *b != 0))
                        .map(|(k, _)| w + k);
                    give_back_in(self.words, n, worker, held);
                    w += got / 8;
                }
                // Unreadable (or cut short, which a memory file of this
                // size is not): the rest is looked at through the mapping.
                _ => {
                    give_back_in(self.words, n, worker, w..words);
                    return;
                }
            }
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

/// How many slots the table has (`limits.client_table`, or the
/// supervisor's).
pub fn size() -> usize {
    table().n
}

/// Gives back the place [`admit`] took in `slot`.
pub fn release(slot: u32) {
    release_in(table(), slot as usize);
}

/// The connections `client` holds open in the table, for tests.
#[cfg(test)]
pub fn open(client: u128) -> u32 {
    let t = table();
    let (start, tag) = place(t.words, t.n, client);
    window(start, t.n)
        .map(|i| slot(t.words, i).load(Ordering::Acquire))
        .find(|v| v >> COUNT_BITS == tag)
        .map_or(0, |v| (v & COUNT) as u32)
}

fn slot(words: &[AtomicU64], i: usize) -> &AtomicU64 {
    &words[SLOTS + i]
}

/// Worker `worker`'s word holding slot `i`'s count in a table of `n`, and
/// the count's shift in it.
fn column(words: &[AtomicU64], n: usize, worker: usize, i: usize) -> (&AtomicU64, u32) {
    (
        &words[SLOTS + n + worker * column_words(n) + i / 2],
        32 * (i % 2) as u32,
    )
}

/// Where `client`'s window starts in a table of `n`, and its tag (40
/// bits, never 0).
fn place(words: &[AtomicU64], n: usize, client: u128) -> (usize, u64) {
    use std::hash::Hasher;
    // std's fixed SipHash-2-4, as `shared_buckets` uses: processes of two
    // builds sharing the memory place a client alike.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(crate::shared_buckets::secret_in(&words[SECRET]), LAYOUT_MARK);
    h.write_u128(client);
    let hash = h.finish();
    ((hash >> 40) as usize % n, (hash & ((1 << 40) - 1)) | 1)
}

fn window(start: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..WINDOW).map(move |i| (start + i) % n)
}

fn admit_in(t: &Table, client: u128, cap: u32) -> Admit {
    let (start, tag) = place(t.words, t.n, client);
    // Each try loses only to another process changing the window at that
    // moment; after a few, the client is counted by this process alone.
    'tries: for _ in 0..4 * WINDOW {
        let mut empty = None;
        let mut found = None;
        for i in window(start, t.n) {
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
                // same time (chosen before a slot earlier in the window was
                // freed): ours goes back and we look again. Both look after
                // their own swap, so at least one sees the other's; if
                // both give theirs back, the next look finds one empty slot
                // first for both.
                if window(start, t.n)
                    .filter(|&j| j != i)
                    .any(|j| slot(t.words, j).load(Ordering::SeqCst) >> COUNT_BITS == tag)
                {
                    drop_from(t.words, i, 1, usize::MAX);
                    continue;
                }
                i
            }
        };
        let (word, shift) = column(t.words, t.n, t.worker, i);
        word.fetch_add(1 << shift, Ordering::AcqRel);
        return Admit::In(i as u32);
    }
    Admit::NoRoom
}

fn release_in(t: &Table, i: usize) {
    if i >= t.n {
        return;
    }
    let (word, shift) = column(t.words, t.n, t.worker, i);
    // Never below 0, which would borrow from the neighbouring count; and
    // the table only for what the column held (a column the supervisor
    // emptied no longer counts in the table).
    let held = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
        ((w >> shift) & u64::from(u32::MAX) > 0).then(|| w - (1 << shift))
    });
    if held.is_ok() {
        drop_from(t.words, i, 1, usize::MAX);
    }
}

/// Takes `n` connections from slot `i`'s count, freeing it at 0, in at
/// most `tries` compare-and-swaps (each lost only to another process that
/// changed the slot meanwhile). The memory is written by every worker: a
/// count short of `n` (which no worker of this build leaves) is taken to
/// 0, and the supervisor leaves a slot a worker keeps changing after a
/// while rather than spin on it.
fn drop_from(words: &[AtomicU64], i: usize, n: u64, tries: usize) {
    let s = slot(words, i);
    let mut v = s.load(Ordering::SeqCst);
    for _ in 0..tries {
        let left = (v & COUNT).saturating_sub(n);
        let new = if left == 0 { 0 } else { (v & !COUNT) | left };
        match s.compare_exchange(v, new, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return,
            Err(seen) => v = seen,
        }
    }
}

/// Gives back what worker `worker`'s column holds in the words `held`
/// names (those that may hold counts) of a table of `n`, and empties them.
fn give_back_in(words: &[AtomicU64], n: usize, worker: usize, held: impl Iterator<Item = usize>) {
    for w in held.filter(|w| *w < column_words(n)) {
        let word = &words[SLOTS + n + worker * column_words(n) + w];
        let held = word.swap(0, Ordering::AcqRel);
        for half in 0..2 {
            let count = (held >> (32 * half)) & u64::from(u32::MAX);
            if count > 0 && 2 * w + half < n {
                drop_from(words, 2 * w + half, count, 1000);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots of a test's table.
    const N: usize = 1 << 16;

    /// Memory of its own for a test, with room for `workers` columns.
    fn fresh(workers: usize) -> &'static [AtomicU64] {
        let words: &'static [AtomicU64] = Box::leak((0..words_for(N, workers)).map(|_| AtomicU64::new(0)).collect());
        words[LAYOUT].store(LAYOUT_MARK, Ordering::Release);
        words[SIZE].store(N as u64, Ordering::Release);
        words
    }

    fn worker(words: &'static [AtomicU64], worker: usize) -> Table {
        Table { words, n: N, worker }
    }

    fn in_use(words: &[AtomicU64]) -> usize {
        (0..N).filter(|&i| slot(words, i).load(Ordering::Acquire) != 0).count()
    }

    /// Worker `w`'s column, in a test's table.
    fn column_of(words: &[AtomicU64], w: usize) -> &[AtomicU64] {
        let first = SLOTS + N + w * column_words(N);
        &words[first..first + column_words(N)]
    }

    /// Every word of a column.
    fn whole_column() -> impl Iterator<Item = usize> {
        0..column_words(N)
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
        assert!(
            column_of(words, 0).iter().all(|w| w.load(Ordering::Acquire) == 0),
            "the column still counts"
        );
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
        for c in 100..300u128 {
            assert!(matches!(admit_in(&b, c, 4), Admit::In(_)));
        }
        assert_eq!(admit_in(&a, client, 4), Admit::Over(4));
        give_back_in(words, N, 1, whole_column());
        // The two b held are back; the two a holds still count.
        assert!(matches!(admit_in(&a, client, 4), Admit::In(_)));
        assert!(matches!(admit_in(&a, client, 4), Admit::In(_)));
        assert_eq!(admit_in(&a, client, 4), Admit::Over(4));
        assert_eq!(in_use(words), 1, "the dead worker's other clients are still counted");
        assert!(column_of(words, 1).iter().all(|w| w.load(Ordering::Acquire) == 0));
    }

    #[test]
    fn a_connection_closed_after_its_column_was_given_back_takes_nothing_from_another_client() {
        let words = fresh(2);
        let (a, b) = (worker(words, 0), worker(words, 1));
        let Admit::In(i) = admit_in(&b, 5, 3) else {
            panic!("not admitted")
        };
        // Given back (the supervisor took worker b for dead), the slot is
        // free, and the client's connection on worker a takes it: b's late
        // release must not take a's off the count.
        give_back_in(words, N, 1, whole_column());
        assert_eq!(admit_in(&a, 5, 3), Admit::In(i));
        release_in(&b, i as usize);
        assert_eq!(
            slot(words, i as usize).load(Ordering::Acquire) & COUNT,
            1,
            "a's connection was taken off the count"
        );
    }

    #[test]
    fn a_client_whose_window_is_all_taken_is_not_counted_here() {
        let words = fresh(1);
        let a = worker(words, 0);
        let client = 42;
        let (start, tag) = place(words, N, client);
        for i in window(start, N) {
            slot(words, i).store(((tag ^ 2) << COUNT_BITS) | 1, Ordering::Release);
        }
        assert_eq!(admit_in(&a, client, 5), Admit::NoRoom);
        // One freed: the client takes it.
        slot(words, (start + 5) % N).store(0, Ordering::Release);
        assert_eq!(admit_in(&a, client, 5), Admit::In(((start + 5) % N) as u32));
    }

    #[test]
    fn a_clients_slot_is_found_past_slots_freed_before_it() {
        let words = fresh(1);
        let a = worker(words, 0);
        let client = 43;
        let (start, tag) = place(words, N, client);
        // Its slot is the third of its window; the first two were freed
        // since it took it.
        slot(words, (start + 2) % N).store((tag << COUNT_BITS) | 1, Ordering::Release);
        assert_eq!(admit_in(&a, client, 5), Admit::In(((start + 2) % N) as u32));
        assert_eq!(slot(words, (start + 2) % N).load(Ordering::Acquire) & COUNT, 2);
        assert_eq!(in_use(words), 1);
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
    fn a_memory_file_of_another_layout_or_without_a_workers_column_is_not_mapped() {
        let words = fresh(2);
        assert!(laid_out(words, 1).is_ok());
        let err = laid_out(words, 2).expect_err("no third column");
        assert!(err.contains("no column for worker 2"), "{err}");
        words[LAYOUT].store(1, Ordering::Release);
        let err = laid_out(words, 0).expect_err("another layout");
        assert!(err.contains("another build"), "{err}");
    }

    #[test]
    fn the_supervisors_mapping_and_a_workers_are_one_table() {
        let shared = Shared::create(1024, 2).expect("memfd");
        use std::os::fd::AsRawFd;
        let theirs = crate::handover::map_whole(shared.fd().as_raw_fd(), SLOTS).expect("map");
        let (words, n) = laid_out(theirs, 1).expect("laid out");
        assert_eq!(n, 1024);
        let b = Table { words, n, worker: 1 };
        assert!(matches!(admit_in(&b, 9, 1), Admit::In(_)));
        assert_eq!(admit_in(&b, 9, 1), Admit::Over(1));
        shared.give_back(1);
        assert!(matches!(admit_in(&b, 9, 1), Admit::In(_)));
        // A worker number past the memory's is nothing to give back: the
        // place just taken stays taken.
        shared.give_back(7);
        assert_eq!(admit_in(&b, 9, 1), Admit::Over(1));
    }
}
