//! The start-up scan that rebuilds the index, and the directory walk the
//! offline tools share.
//!
//! The scan first deletes stale tmp files (named `<hex>.<pid>.<instance>.<n>`:
//! stale when that process is dead, when it is this process but that store
//! instance is gone, or when untouched for an hour), then walks every leaf
//! directory: each file named by 32 hex digits is read (header, meta,
//! trailer) under its stripe lock and indexed unless an entry exists (a
//! commit made while the scan runs is newer); an invalid one is deleted; one
//! in the wrong directory (the levels changed) is moved into place by a
//! server's scan and skipped by an offline tool's. Files
//! with other names are left alone: the scan never deletes what it did not
//! write, even if `cache.dir` points at the wrong directory.

use super::format::{self, Layout, ReadError, parse_level_name};
use super::index::Entry;
use super::{Inner, ScanProgress, key_matches, secs32};
use crate::cache::key::ObjectId;
use crate::cache::object::StoredMeta;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

/// Leaf directories (`<L1>/<L2>`) under `root`, sorted, whatever levels
/// they were made with.
pub fn leaf_dirs(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut level1: Vec<PathBuf> = Vec::new();
    for e in fs::read_dir(root)? {
        let e = e?;
        if e.file_name().to_str().and_then(parse_level_name).is_some() && e.file_type()?.is_dir() {
            level1.push(e.path());
        }
    }
    level1.sort();
    for d in level1 {
        let mut level2 = Vec::new();
        for e in fs::read_dir(&d)? {
            let e = e?;
            if e.file_name().to_str().and_then(parse_level_name).is_some() && e.file_type()?.is_dir() {
                level2.push(e.path());
            }
        }
        level2.sort();
        out.extend(level2);
    }
    Ok(out)
}

/// An object file found by `for_each_object_file`.
#[derive(Debug, Clone)]
pub struct ObjectFile {
    /// The id its name spells.
    pub id: ObjectId,
    /// Its path.
    pub path: PathBuf,
}

/// Calls `f` for every file named like an object in the leaf directories
/// under `root`; `on_dir(done, total)` after each directory.
pub fn for_each_object_file(
    root: &Path,
    on_dir: &mut dyn FnMut(u64, u64),
    f: &mut dyn FnMut(ObjectFile),
) -> io::Result<()> {
    let leaves = leaf_dirs(root)?;
    let total = leaves.len() as u64;
    for (i, leaf) in leaves.iter().enumerate() {
        let rd = match fs::read_dir(leaf) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for e in rd {
            let e = e?;
            if let Some(id) = e.file_name().to_str().and_then(ObjectId::from_hex) {
                f(ObjectFile { id, path: e.path() });
            }
        }
        on_dir(i as u64 + 1, total);
    }
    Ok(())
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks whether the
    // process exists. It has no memory-safety preconditions.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Whether a tmp file is left over from a writer that will never finish.
fn tmp_is_stale(name: &str, modified: Option<SystemTime>) -> bool {
    // The popularity file's (`popularity.<pid>`), while it is written.
    if let Some(pid) = name.strip_prefix("popularity.").and_then(|p| p.parse::<i32>().ok()) {
        return pid > 0 && pid as u32 != std::process::id() && !pid_alive(pid);
    }
    let mut parts = name.split('.');
    // Anything else not named as Portico names its files is not Portico's
    // to remove (a `cache.dir` that had a `tmp/` of its own keeps it).
    let (Some(hex), Some(pid), Some(instance), Some(_n), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Some(_), Ok(pid), Ok(instance)) = (ObjectId::from_hex(hex), pid.parse::<i32>(), instance.parse::<u64>())
    else {
        return false;
    };
    if pid <= 0 {
        return true;
    }
    if pid as u32 == std::process::id() {
        return !super::instance_live(instance);
    }
    if !pid_alive(pid) {
        return true;
    }
    // Live pid (or a reused one): stale once untouched for an hour.
    modified
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age > Duration::from_secs(3600))
}

/// Deletes stale tmp files; returns how many.
pub(super) fn clean_tmp(layout: &Layout) -> u64 {
    // Not through a link (DiskStore::create refuses one; this may run in
    // `portico cache gc`, as root, over a directory another user owns).
    if !fs::symlink_metadata(layout.tmp_dir()).is_ok_and(|m| m.is_dir()) {
        return 0;
    }
    let Ok(rd) = fs::read_dir(layout.tmp_dir()) else {
        return 0;
    };
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let modified = e.metadata().ok().and_then(|m| m.modified().ok());
        if e.file_type().is_ok_and(|t| t.is_file()) && tmp_is_stale(name, modified) && fs::remove_file(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Indexes one file (holding its stripe lock). A file in the wrong
/// directory is moved into place when `relocate`, else skipped.
fn scan_file(inner: &Inner, id: ObjectId, path: &Path, relocate: bool) {
    let _guard = inner.lock(id);
    if inner.index.get(id).is_some() {
        return; // committed while the scan runs: newer than what we would read
    }
    let file = match super::open_read(path) {
        Ok(f) => f,
        Err(_) => return,
    };
    let remove = |why: &str| {
        tracing::warn!("disk cache: removing invalid object {}: {why}", path.display());
        if fs::remove_file(path).is_ok() {
            inner.stats.corrupt_removed.fetch_add(1, Ordering::Relaxed);
        }
    };
    let env = match format::read_envelope(&file) {
        Ok(env) => env,
        Err(ReadError::Corrupt(c)) => return remove(c.0),
        Err(ReadError::Io(e)) => {
            tracing::warn!(
                "disk cache: cannot read {}: {cause}",
                path.display(),
                cause = crate::util::io_cause(&e)
            );
            return;
        }
    };
    let meta = match StoredMeta::decode(&env.meta) {
        Ok(m) if !m.key.is_empty() => m,
        Ok(_) => return remove("empty key"),
        Err(e) => return remove(e.0),
    };
    let want = inner.layout.path_of(id);
    if path != want {
        if !relocate {
            inner.stats.scan_misplaced.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // The levels changed: move it where lookups will find it, unless a
        // copy is there already.
        if want.exists() {
            let _ = fs::remove_file(path);
            return;
        }
        if fs::create_dir_all(inner.layout.dir_of(id))
            .and_then(|()| fs::rename(path, &want))
            .is_err()
        {
            return;
        }
    }
    let last = env.atime.max(env.mtime).max(0) as u64;
    inner.index.insert_if_absent(
        id,
        Entry {
            clock: 0,
            size: env.file_len,
            last_access: secs32(last),
            expires: secs32(env.trailer.expires),
            hits: 0,
            generation: inner.index.next_generation(),
            key_ok: key_matches(id, &meta),
            verified: false,
        },
    );
}

/// Rebuilds the index. Stops early if the store is dropped. Only a
/// server's scan relocates files (`relocate`): an offline tool run with
/// other levels than the server must not move objects from under it.
pub(super) fn run(store: Weak<Inner>, relocate: bool, on_progress: &mut dyn FnMut(&ScanProgress)) {
    // A server started as root opens its cache before it switches to
    // `server.user`: the scan's files and directories are made as that user.
    crate::privdrop::wait_for_switch();
    let started = Instant::now();
    let Some(inner) = store.upgrade() else { return };
    let removed = clean_tmp(&inner.layout);
    inner.stats.tmp_removed.fetch_add(removed, Ordering::Relaxed);
    let leaves = leaf_dirs(inner.layout.root()).unwrap_or_else(|e| {
        tracing::warn!(
            "disk cache: cannot list {}: {cause}",
            inner.layout.root().display(),
            cause = crate::util::io_cause(&e)
        );
        Vec::new()
    });
    inner
        .stats
        .scan_dirs_total
        .store(leaves.len() as u64, Ordering::Relaxed);
    drop(inner);
    for leaf in &leaves {
        let Some(inner) = store.upgrade() else { return };
        if let Ok(rd) = fs::read_dir(leaf) {
            for e in rd.flatten() {
                if let Some(id) = e.file_name().to_str().and_then(ObjectId::from_hex) {
                    inner.stats.scan_scanned.fetch_add(1, Ordering::Relaxed);
                    // The type comes with the directory entry. What is not
                    // a regular file (a FIFO, a device, a socket put there)
                    // is not opened: that could wait for ever, and the
                    // index would never be complete. Links and
                    // directories are left alone.
                    match e.file_type() {
                        Ok(t) if t.is_file() => scan_file(&inner, id, &e.path(), relocate),
                        Ok(t) if !t.is_dir() && !t.is_symlink() => {
                            tracing::warn!("disk cache: removing {}: not a regular file", e.path().display());
                            if fs::remove_file(e.path()).is_ok() {
                                inner.stats.corrupt_removed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        inner.stats.scan_dirs_done.fetch_add(1, Ordering::Relaxed);
        on_progress(&inner.stats.scan_progress());
    }
    let Some(inner) = store.upgrade() else { return };
    inner
        .stats
        .scan_micros
        .store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    inner.stats.scan_done.store(true, Ordering::Release);
    inner.scan_notify.notify_waiters();
    let misplaced = inner.stats.scan_misplaced.load(Ordering::Relaxed);
    if misplaced > 0 {
        tracing::warn!(
            "disk cache: {misplaced} objects are in directories of other levels than {:?}; left alone",
            inner.layout.levels()
        );
    }
    on_progress(&inner.stats.scan_progress());
    if inner.over_high() {
        inner.gc_signal.kick();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmp_staleness() {
        let hex = ObjectId(1).hex();
        let now = Some(SystemTime::now());
        // Not named as Portico names its files: not Portico's to remove.
        assert!(!tmp_is_stale("junk", now));
        assert!(!tmp_is_stale(&format!("{hex}.x.1.0"), now));
        assert!(tmp_is_stale("popularity.999999999", now), "dead pid");
        assert!(!tmp_is_stale(&format!("popularity.{}", std::process::id()), now));
        assert!(tmp_is_stale(&format!("{hex}.999999999.1.0"), now), "dead pid");
        assert!(!tmp_is_stale(&format!("{hex}.1.1.0"), now), "live pid, fresh");
        let old = Some(SystemTime::now() - Duration::from_secs(7200));
        assert!(tmp_is_stale(&format!("{hex}.1.1.0"), old), "live pid, an hour old");
        let me = std::process::id();
        assert!(
            tmp_is_stale(&format!("{hex}.{me}.0.0"), now),
            "our pid, no such instance"
        );
    }
}
