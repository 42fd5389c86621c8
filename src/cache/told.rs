//! What one worker process removes from the cache, told to the others
//! (`server.processes = N > 1`). The disk tier is shared, but each worker
//! has a memory tier of its own and answers from it before it looks at
//! the disk: a `PURGE` one worker takes, or an unsafe request it forwards
//! (RFC 9111 4.4), must also reach the copies the others hold in memory,
//! or they serve what was purged.
//!
//! A ring of [`RING`] entries in memory the supervisor makes (`memfd`,
//! inherited as `shared_buckets`' is) and every worker maps: a worker
//! that removes an object numbers an entry (one atomic add on the shared
//! count), writes the object's id into it and marks it written with its
//! number, once the object is off the disk (before a `PURGE` is answered;
//! an unsafe request invalidates once its response is sent). Every lookup
//! first compares the count with how far its memory tier has read (three
//! loads while nothing new was told, the mapping's among them) and drops
//! what was told since, so no lookup that starts after the removal finds
//! the object.
//!
//! An entry is read as a seqlock's data: its number before and after the
//! id, both what the reader expects, or it is not trusted. A reader that
//! finds one overwritten (it fell [`RING`] entries behind: a worker that
//! looked nothing up while many objects were removed) cannot know what it
//! missed and drops its whole memory tier, which the disk tier then
//! refills; so does one that finds an entry numbered but still unwritten
//! while [`LATE`] later ones are numbered (its writer stopped, or died,
//! between the two steps). An entry numbered but not yet written while
//! the later ones are fewer is looked at again at the next lookup. Held
//! disk files and kept partial responses are dropped with the memory
//! tier's copies.
//!
//! A prefix purge (`Portico-Purge: prefix`, and `portico cache purge
//! --prefix` on a running server) is told the same way: the prefix goes
//! into one of [`PREFIXES`] slots after the ring (a seqlock of its own),
//! and the ring's entry, flagged, names the slot's number. A reader drops
//! from its memory tier, kept partial responses and held files everything
//! under the prefix; one that finds the slot rewritten since (it fell
//! that many prefix purges behind) drops everything. A prefix longer than
//! a slot is told cut short, at a character: everything under the whole
//! prefix is under the shorter one too.
//!
//! One process (no supervisor), or a worker that cannot map the memory
//! (it says so), tells no one: its memory tier is the only one.

use super::ObjectId;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the inherited memory file to a worker.
pub const ENV_FD: &str = "PORTICO_TOLD_FD";

/// Entries the ring holds: what a worker may fall behind before it must
/// drop its whole memory tier. 16,384 entries of 24 bytes: 384 KiB, a
/// page at a time as they are first written.
const RING: u64 = 16_384;

/// Entries numbered after one still unwritten, past which that one is
/// taken as lost.
const LATE: u64 = 64;

/// Words of an entry: its number (0: never written), the id's low and
/// high halves.
const ENTRY: usize = 3;

/// The word naming the layout, the count of prefixes ever told (beside
/// it: only prefix purges read or write it), the count of entries ever
/// numbered (on a cache line of its own: every lookup reads it, only
/// removals write it), the first entry, the first prefix slot.
const LAYOUT: usize = 0;
const PREFIX_COUNT: usize = 1;
const COUNT: usize = 8;
const FIRST: usize = 16;
const PREFIX_FIRST: usize = FIRST + RING as usize * ENTRY;
const WORDS: usize = PREFIX_FIRST + PREFIXES as usize * PREFIX_SLOT;

/// The prefix slots: how many prefix purges a worker may fall behind
/// before it must drop everything.
const PREFIXES: u64 = 64;

/// The bytes a slot holds of a prefix (a longer one is cut short).
const PREFIX_BYTES: usize = 2048;

/// Words of a slot: its number (0: never written), the prefix's length in
/// bytes, the bytes.
const PREFIX_SLOT: usize = 2 + PREFIX_BYTES / 8;

/// Set in an entry's number word: the entry names a prefix slot's number
/// (its low word), not an object.
const PREFIX_FLAG: u64 = 1 << 63;

/// What the [`LAYOUT`] word holds: a worker of another build keeps to
/// itself.
const LAYOUT_MARK: u64 = u64::from_be_bytes(*b"portold\x02");

/// Why this worker could not map the ring it was handed, if so.
static NOT_MAPPED: OnceLock<String> = OnceLock::new();

/// The ring shared with the other workers, if this is a worker that
/// could map it.
fn shared() -> Option<&'static [AtomicU64]> {
    static SHARED: OnceLock<Option<&'static [AtomicU64]>> = OnceLock::new();
    *SHARED.get_or_init(|| {
        std::env::var_os(crate::notify::WORKER_KEY)?;
        match crate::handover::map_inherited(ENV_FD, WORDS)?
            .and_then(|w| crate::handover::check_mark(w, LAYOUT, LAYOUT_MARK).map(|()| w))
        {
            Ok(words) => Some(words),
            Err(e) => {
                let _ = NOT_MAPPED.set(e);
                None
            }
        }
    })
}

/// Maps the ring now if nothing has yet, and says in the error log if
/// this worker could not: called once the log is open.
pub fn report() {
    shared();
    if let Some(e) = NOT_MAPPED.get() {
        tracing::warn!(
            "cannot map the memory the workers tell each other the cache's removals in ({e}): a PURGE or an \
             unsafe request this worker takes leaves the other workers' memory tiers as they are"
        );
    }
}

/// Makes the memory file the supervisor hands its workers: the ring,
/// empty, and the layout's mark; close-on-exec and sealed at its size.
pub fn create() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::FileExt;
    let file = crate::handover::shared_memory(c"portico-told", WORDS * std::mem::size_of::<AtomicU64>())?;
    file.write_all_at(
        &LAYOUT_MARK.to_ne_bytes(),
        (LAYOUT * std::mem::size_of::<AtomicU64>()) as u64,
    )?;
    Ok(file.into())
}

/// Tells the other workers that `id` is gone from the cache: written
/// before this returns, so before the removal is answered.
pub fn tell(id: ObjectId) {
    if let Some(words) = shared() {
        tell_in(words, id);
    }
}

/// [`tell`] in `words`.
fn tell_in(words: &[AtomicU64], id: ObjectId) {
    write_entry(words, id.0 as u64, (id.0 >> 64) as u64, 0);
}

/// Numbers an entry and writes `low`, `high` into it, its number word
/// carrying `flag`.
fn write_entry(words: &[AtomicU64], low: u64, high: u64, flag: u64) {
    let n = words[COUNT].fetch_add(1, Ordering::AcqRel);
    let e = entry(n);
    // A seqlock's write: the number cleared, the id, the number set.
    words[e].store(0, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
    words[e + 1].store(low, Ordering::Relaxed);
    words[e + 2].store(high, Ordering::Relaxed);
    words[e].store((n + 1) | flag, Ordering::Release);
}

/// Tells the other workers that everything whose URL starts with
/// `prefix` is gone from the cache (a prefix purge): written before this
/// returns, so before the purge is answered.
pub fn tell_prefix(prefix: &str) {
    if let Some(words) = shared() {
        tell_prefix_in(words, prefix);
    }
}

/// [`tell_prefix`] in `words`.
fn tell_prefix_in(words: &[AtomicU64], prefix: &str) {
    let mut cut = prefix.len().min(PREFIX_BYTES);
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    let bytes = &prefix.as_bytes()[..cut];
    let p = words[PREFIX_COUNT].fetch_add(1, Ordering::AcqRel);
    let s = slot(p);
    // The slot is claimed from the prefix it held (or from never written):
    // a writer of an earlier turn still writing it (stalled between its
    // clearing and its marking) keeps it, and this prefix's entry is then
    // found lost, as a slot rewritten before it was read is.
    let previous = (p + 1).saturating_sub(PREFIXES);
    if words[s]
        .compare_exchange(previous, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        write_entry(words, p, 0, PREFIX_FLAG);
        return;
    }
    std::sync::atomic::fence(Ordering::Release);
    words[s + 1].store(bytes.len() as u64, Ordering::Relaxed);
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        words[s + 2 + i].store(u64::from_le_bytes(word), Ordering::Relaxed);
    }
    words[s].store(p + 1, Ordering::Release);
    write_entry(words, p, 0, PREFIX_FLAG);
}

/// The first word of prefix slot `p`.
fn slot(p: u64) -> usize {
    PREFIX_FIRST + (p % PREFIXES) as usize * PREFIX_SLOT
}

/// The prefix slot `p` holds, None when it holds a later one (or is being
/// rewritten for it).
fn read_prefix(words: &[AtomicU64], p: u64) -> Option<String> {
    let s = slot(p);
    if words[s].load(Ordering::Acquire) != p + 1 {
        return None;
    }
    let len = usize::try_from(words[s + 1].load(Ordering::Relaxed))
        .unwrap_or(usize::MAX)
        .min(PREFIX_BYTES);
    let mut bytes = Vec::with_capacity(len.next_multiple_of(8));
    for i in 0..len.div_ceil(8) {
        bytes.extend_from_slice(&words[s + 2 + i].load(Ordering::Relaxed).to_le_bytes());
    }
    std::sync::atomic::fence(Ordering::Acquire);
    if words[s].load(Ordering::Relaxed) != p + 1 {
        return None;
    }
    bytes.truncate(len);
    String::from_utf8(bytes).ok()
}

/// The first word of entry `n`.
fn entry(n: u64) -> usize {
    FIRST + (n % RING) as usize * ENTRY
}

/// Entry `n` as a reader finds it.
enum Found {
    Id(ObjectId),
    /// A prefix purge.
    Prefix(String),
    /// Numbered, not yet written.
    Unwritten,
    /// Overwritten by a later entry: what it said is lost.
    Lost,
}

/// Reads entry `n`, when `count` entries have been numbered.
fn read(words: &[AtomicU64], n: u64, count: u64) -> Found {
    let e = entry(n);
    let flagged = words[e].load(Ordering::Acquire);
    let low = words[e + 1].load(Ordering::Relaxed);
    let high = words[e + 2].load(Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Acquire);
    let after = words[e].load(Ordering::Relaxed) & !PREFIX_FLAG;
    let before = flagged & !PREFIX_FLAG;
    // Its slot numbered for entry n + RING: the id read may be that
    // entry's, or half of it (entry n's writer, stalled that long, may
    // even have marked the slot n's over the newer id).
    let now = words[COUNT].load(Ordering::Acquire).max(count);
    if before > n + 1 || after > n + 1 || now > n + RING {
        return Found::Lost;
    }
    if before == n + 1 && after == n + 1 {
        if flagged & PREFIX_FLAG != 0 {
            return read_prefix(words, low).map_or(Found::Lost, Found::Prefix);
        }
        return Found::Id(ObjectId(u128::from(high) << 64 | u128::from(low)));
    }
    Found::Unwritten
}

/// How far one memory tier has read the ring: every entry before it has
/// been applied.
#[derive(Debug)]
pub struct Reader(AtomicU64);

impl Default for Reader {
    /// A reader for a memory tier made now (empty: nothing told before
    /// concerns it).
    fn default() -> Reader {
        Reader(AtomicU64::new(shared().map_or(0, count)))
    }
}

impl Reader {
    /// Applies what the other workers have told since the last call:
    /// `forget` for each id, `forget_under` for each prefix purged, or
    /// `forget_all` once when what was told cannot be known (this tier
    /// fell behind, or a writer never finished). Costs three loads when
    /// nothing new was told (the mapping, the count, this reader's place).
    pub fn catch_up(&self, forget: impl FnMut(ObjectId), forget_under: impl FnMut(&str), forget_all: impl FnOnce()) {
        if let Some(words) = shared() {
            self.catch_up_in(words, forget, forget_under, forget_all);
        }
    }

    /// [`Reader::catch_up`] in `words`.
    fn catch_up_in(
        &self,
        words: &[AtomicU64],
        mut forget: impl FnMut(ObjectId),
        mut forget_under: impl FnMut(&str),
        forget_all: impl FnOnce(),
    ) {
        let end = count(words);
        let from = self.0.load(Ordering::Acquire);
        if from >= end {
            return;
        }
        // Several threads may apply the same entries at once: dropping an
        // object twice is harmless, and `fetch_max` keeps the furthest.
        let mut unwritten = None;
        for n in from..end {
            match read(words, n, end) {
                Found::Id(id) => forget(id),
                Found::Prefix(prefix) => forget_under(&prefix),
                Found::Unwritten if end - n - 1 < LATE => {
                    unwritten.get_or_insert(n);
                }
                Found::Unwritten | Found::Lost => {
                    forget_all();
                    self.0.fetch_max(end, Ordering::AcqRel);
                    return;
                }
            }
        }
        self.0.fetch_max(unwritten.unwrap_or(end), Ordering::AcqRel);
    }
}

/// Entries numbered so far.
fn count(words: &[AtomicU64]) -> u64 {
    words[COUNT].load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> &'static [AtomicU64] {
        crate::handover::zeroed_words(WORDS)
    }

    fn reader_at(words: &[AtomicU64]) -> Reader {
        Reader(AtomicU64::new(count(words)))
    }

    /// What a catch-up applies: the ids, and whether it dropped everything.
    fn applied(r: &Reader, words: &[AtomicU64]) -> (Vec<u128>, bool) {
        let (ids, prefixes, all) = applied_all(r, words);
        assert!(prefixes.is_empty(), "{prefixes:?}");
        (ids, all)
    }

    /// [`applied`] with the prefixes.
    fn applied_all(r: &Reader, words: &[AtomicU64]) -> (Vec<u128>, Vec<String>, bool) {
        let mut ids = Vec::new();
        let mut prefixes = Vec::new();
        let mut all = false;
        r.catch_up_in(
            words,
            |id| ids.push(id.0),
            |p| prefixes.push(p.to_string()),
            || all = true,
        );
        (ids, prefixes, all)
    }

    #[test]
    fn a_prefix_is_told_in_order_with_the_ids() {
        let w = ring();
        let r = reader_at(w);
        tell_in(w, ObjectId(1));
        tell_prefix_in(w, "http://www.example.com/docs/");
        tell_in(w, ObjectId(2));
        tell_prefix_in(w, "");
        assert_eq!(
            applied_all(&r, w),
            (
                vec![1, 2],
                vec!["http://www.example.com/docs/".to_string(), String::new()],
                false
            )
        );
        assert_eq!(applied_all(&r, w), (vec![], vec![], false));
    }

    #[test]
    fn a_long_prefix_is_told_cut_short_at_a_character() {
        let w = ring();
        let r = reader_at(w);
        // 2047 bytes, then a two-byte character across the slot's end.
        let long = format!("http://h/{}\u{e9}tail", "a".repeat(PREFIX_BYTES - 1 - 9));
        tell_prefix_in(w, &long);
        let (_, prefixes, all) = applied_all(&r, w);
        assert!(!all);
        assert_eq!(prefixes, vec![long[..PREFIX_BYTES - 1].to_string()]);
        assert!(long.starts_with(&prefixes[0]));
    }

    #[test]
    fn a_slot_still_being_written_by_an_earlier_turn_is_left_to_it() {
        let w = ring();
        let r = reader_at(w);
        // Prefix 0's writer cleared its slot and stalled.
        w[PREFIX_COUNT].store(1, Ordering::Release);
        w[slot(0)].store(0, Ordering::Release);
        for i in 1..PREFIXES {
            tell_prefix_in(w, &format!("http://h/{i}"));
        }
        // Prefix 64 finds its slot not yet marked for prefix 0: told lost.
        tell_prefix_in(w, "http://h/64");
        assert_eq!(w[slot(0)].load(Ordering::Acquire), 0, "left to its writer");
        let (_, _, all) = applied_all(&r, w);
        assert!(all, "prefix 64 cannot be read");
    }

    #[test]
    fn a_prefix_slot_rewritten_before_it_was_read_drops_everything() {
        let w = ring();
        let r = reader_at(w);
        for i in 0..=PREFIXES {
            tell_prefix_in(w, &format!("http://h/{i}"));
        }
        let (_, prefixes, all) = applied_all(&r, w);
        assert!(all, "the first slot holds the 65th prefix: {prefixes:?}");
        tell_prefix_in(w, "http://h/next");
        assert_eq!(applied_all(&r, w), (vec![], vec!["http://h/next".to_string()], false));
    }

    #[test]
    fn a_reader_applies_what_was_told_since_it_last_looked_once() {
        let w = ring();
        let r = reader_at(w);
        assert_eq!(applied(&r, w), (vec![], false));
        tell_in(w, ObjectId(7));
        tell_in(w, ObjectId(u128::MAX - 1));
        assert_eq!(applied(&r, w), (vec![7, u128::MAX - 1], false));
        assert_eq!(applied(&r, w), (vec![], false), "nothing new");
        tell_in(w, ObjectId(9));
        assert_eq!(applied(&r, w), (vec![9], false));
    }

    #[test]
    fn a_reader_made_later_ignores_what_was_told_before() {
        let w = ring();
        tell_in(w, ObjectId(1));
        let r = reader_at(w);
        tell_in(w, ObjectId(2));
        assert_eq!(applied(&r, w), (vec![2], false));
    }

    #[test]
    fn a_reader_a_whole_ring_behind_drops_everything() {
        let w = ring();
        let r = reader_at(w);
        for i in 0..RING + 1 {
            tell_in(w, ObjectId(u128::from(i)));
        }
        assert_eq!(applied(&r, w), (vec![], true));
        tell_in(w, ObjectId(5));
        assert_eq!(applied(&r, w), (vec![5], false), "caught up after it");
    }

    #[test]
    fn a_reader_exactly_a_ring_behind_still_reads_every_entry() {
        let w = ring();
        let r = reader_at(w);
        for i in 0..RING {
            tell_in(w, ObjectId(u128::from(i)));
        }
        let (ids, all) = applied(&r, w);
        assert!(!all);
        assert_eq!(ids.len() as u64, RING);
    }

    /// An entry numbered (the count added to) and not yet written.
    fn number_only(w: &[AtomicU64]) -> u64 {
        w[COUNT].fetch_add(1, Ordering::AcqRel)
    }

    #[test]
    fn an_entry_not_yet_written_is_read_again_and_the_later_ones_applied() {
        let w = ring();
        let r = reader_at(w);
        let n = number_only(w);
        tell_in(w, ObjectId(3));
        assert_eq!(applied(&r, w), (vec![3], false));
        // Its writer finishes.
        let e = entry(n);
        w[e + 1].store(11, Ordering::Relaxed);
        w[e + 2].store(0, Ordering::Relaxed);
        w[e].store(n + 1, Ordering::Release);
        assert_eq!(applied(&r, w), (vec![11, 3], false), "from the unwritten one on");
        assert_eq!(applied(&r, w), (vec![], false));
    }

    #[test]
    fn an_entry_left_unwritten_while_many_later_ones_were_written_drops_everything() {
        let w = ring();
        let r = reader_at(w);
        number_only(w);
        for i in 0..LATE - 1 {
            tell_in(w, ObjectId(u128::from(i)));
        }
        assert!(!applied(&r, w).1, "{} later entries: still waited for", LATE - 1);
        tell_in(w, ObjectId(99));
        assert_eq!(applied(&r, w), (vec![], true));
        assert_eq!(applied(&r, w), (vec![], false), "and past it");
    }

    #[test]
    fn an_entry_overwritten_while_it_was_read_is_not_trusted() {
        let w = ring();
        tell_in(w, ObjectId(1));
        // Entry 0's slot half rewritten for entry RING: number cleared.
        w[COUNT].store(RING + 1, Ordering::Release);
        w[entry(0)].store(0, Ordering::Relaxed);
        assert!(matches!(read(w, 0, RING + 1), Found::Lost));
        w[entry(0)].store(RING + 1, Ordering::Relaxed);
        assert!(matches!(read(w, 0, RING + 1), Found::Lost));
    }

    #[test]
    fn two_threads_telling_at_once_lose_no_entry() {
        let w = ring();
        let r = reader_at(w);
        std::thread::scope(|s| {
            for t in 0..2u128 {
                s.spawn(move || {
                    for i in 0..1000u128 {
                        tell_in(w, ObjectId(t << 64 | i));
                    }
                });
            }
        });
        let (mut ids, all) = applied(&r, w);
        assert!(!all);
        ids.sort_unstable();
        let mut want: Vec<u128> = (0..2u128).flat_map(|t| (0..1000).map(move |i| t << 64 | i)).collect();
        want.sort_unstable();
        assert_eq!(ids, want);
    }
}
