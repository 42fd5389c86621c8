//! Offline operations on the disk tier, behind `portico cache
//! gc|list|purge|verify` (the Sun Java System Web Proxy Server 4's `cachegc` and more).
//! They work on the
//! files directly and are safe while a server uses the same directory:
//! objects are only ever removed (a removed object is a miss for the
//! server, whose index entry is dropped when it next finds the file gone),
//! and a file is removed only if it is still the very file found bad or
//! selected (same device and inode), so a newer object renamed over it
//! survives. Progress bars (indicatif) go to standard error and only when
//! it is a terminal; results go to standard output.
//!
//! URLs are public URLs: `purge URL` and `--prefix` match the URL of every
//! key, whichever `[[upstream]]` group the key names (`crate::cache::key`),
//! so a purge removes every copy of a page, reverse-proxied or not; `list`
//! shows the group as `upstream:<name>` after the other fields.
//!
//! Costs: `list`, `purge --prefix` and `verify` read every object's
//! metadata (`verify` every byte). `purge URL` costs one file read when no
//! `[[upstream]]` group is configured and the URL's plain object exists and
//! has no `Vary` (then it can have no variants or other copies); otherwise
//! the variants' ids are unknowable (they hash request header values), so
//! it reads every object's metadata: O(objects), about what `list` costs.

use super::disk::{self, DiskStore, Evicted, GcReport, ObjectFile, ScanProgress, format};
use super::key::{self, CacheKey};
use super::object::StoredMeta;
use crate::config::CacheConfig;
use indicatif::{ProgressBar, ProgressStyle};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// `portico cache ...`
#[derive(Debug, clap::Args)]
pub struct CacheArgs {
    /// Config file (TOML): its [cache] section gives the directory, levels and budget.
    #[arg(short, long, global = true)]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: CacheCommand,
}

/// The `portico cache` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum CacheCommand {
    /// Evict objects until the disk tier is at or below its low watermark
    /// (expired first, then least recently used); prints what it removed.
    /// Safe while a server runs.
    Gc,
    /// List stored objects sorted by key: URL, status, body bytes, stored
    /// time, expiry hint (and the Vary variant and the upstream group, if any).
    List {
        /// Only keys starting with this (normalised: lower-case scheme and host).
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Remove the objects stored for URL (all its Vary variants, from its
    /// origin and from every upstream group), or every object whose key URL
    /// starts with --prefix; prints the count.
    #[command(group(clap::ArgGroup::new("what").required(true).args(["url", "prefix"])))]
    Purge {
        /// Absolute URL (normalised like a cache key).
        url: Option<String>,
        /// Key URL prefix (normalised: lower-case scheme and host).
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Read every object and check its checksum; report and remove corrupt ones.
    #[command(
        after_help = "Exit status: 0 if no object was corrupt, 1 if any was (corrupt objects are removed) or on error."
    )]
    Verify,
}

/// One stored object, as `list` shows it.
#[derive(Debug, Clone)]
pub(crate) struct ListEntry {
    /// The key's (public) URL.
    pub key: String,
    /// The upstream group the object was fetched from, if it was not the
    /// URL's origin.
    pub upstream: Option<String>,
    /// The Vary variant it was selected with.
    pub variant: Vec<(String, Option<String>)>,
    /// Response status.
    pub status: u16,
    /// Body bytes.
    pub body_len: u64,
    /// When the response was received.
    pub stored: SystemTime,
    /// Expiry hint, unix seconds, 0 = unknown.
    pub expires: u64,
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Objects removed.
    pub removed: u64,
    /// Bytes freed.
    pub bytes: u64,
    /// Object files whose metadata was read (0: the id was enough).
    pub scanned: u64,
}

/// What a verify found.
#[derive(Debug, Clone, Default)]
pub(crate) struct VerifyReport {
    /// Objects checked.
    pub checked: u64,
    /// Body bytes read.
    pub bytes: u64,
    /// Corrupt objects (removed): path and reason.
    pub corrupt: Vec<(PathBuf, String)>,
}

fn existing_dir(cfg: &CacheConfig) -> io::Result<&Path> {
    if cfg.dir.is_dir() {
        Ok(&cfg.dir)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no cache directory at {}", cfg.dir.display()),
        ))
    }
}

/// Removes `path` if it is still the file `(dev, ino)`; true if removed.
fn remove_same(path: &Path, dev: u64, ino: u64) -> bool {
    match fs::symlink_metadata(path) {
        Ok(m) if m.dev() == dev && m.ino() == ino => fs::remove_file(path).is_ok(),
        _ => false,
    }
}

/// An object file's envelope and decoded metadata, if it is valid (the
/// body is not checked: that is `verify`'s job).
fn read_object(path: &Path) -> Option<(format::Envelope, StoredMeta)> {
    let file = crate::cache::disk::open_regular(path).ok()?;
    let env = format::read_envelope(&file).ok()?;
    let meta = StoredMeta::decode(&env.meta).ok().filter(|m| !m.key.is_empty())?;
    Some((env, meta))
}

fn dir_bar(what: &'static str, progress: bool) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("{msg:10} [{bar:40}] {pos}/{len} directories, {elapsed}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what);
    pb
}

fn walk(root: &Path, bar: &ProgressBar, f: &mut dyn FnMut(ObjectFile)) -> io::Result<()> {
    disk::for_each_object_file(
        root,
        &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
        f,
    )
}

/// Every object whose key starts with `prefix` (all without one), sorted
/// by key then variant. Invalid files are skipped (not removed).
pub(crate) fn list(cfg: &CacheConfig, prefix: Option<&str>) -> io::Result<Vec<ListEntry>> {
    let root = existing_dir(cfg)?;
    let mut out = Vec::new();
    walk(root, &ProgressBar::hidden(), &mut |of| {
        if let Some((env, meta)) = read_object(&of.path)
            && prefix.is_none_or(|p| key::url_of(&meta.key).starts_with(p))
        {
            let key = CacheKey::from_text(&meta.key);
            out.push(ListEntry {
                upstream: key.as_ref().and_then(|k| k.upstream()).map(str::to_string),
                key: key.as_ref().map_or(&*meta.key, |k| k.url()).to_string(),
                variant: meta.variant,
                status: meta.status.as_u16(),
                body_len: env.trailer.body_len,
                stored: meta.response_time,
                expires: env.trailer.expires,
            });
        }
    })?;
    out.sort_by(|a, b| (&a.key, &a.upstream, &a.variant).cmp(&(&b.key, &b.upstream, &b.variant)));
    Ok(out)
}

/// Removes every object (all variants, every upstream group's) whose key
/// URL is exactly `url`'s normalised form. `upstreams` says whether any
/// `[[upstream]]` group is configured (then copies under other ids may
/// exist). See the module doc for the cost.
pub(crate) fn purge_url(cfg: &CacheConfig, url: &str, upstreams: bool) -> io::Result<PurgeReport> {
    let root = existing_dir(cfg)?;
    let key = CacheKey::from_url(url, cfg.ignore_query_in_key)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("not an absolute URL: {url}")))?;
    let layout = disk::Layout::new(root, cfg.levels);
    let plain = layout.path_of(key.id());
    let mut report = PurgeReport::default();
    if !upstreams
        && let Some((env, meta)) = read_object(&plain)
        && meta.key == key.text()
        && meta.variant.is_empty()
        && !meta.headers.contains_key(http::header::VARY)
    {
        if remove_same(&plain, env.dev, env.ino) {
            report.removed = 1;
            report.bytes = env.file_len;
        }
        return Ok(report);
    }
    purge_where(root, &mut |k| key::url_of(k) == key.url(), false)
}

/// Removes every object whose key URL starts with `prefix`.
pub(crate) fn purge_prefix(cfg: &CacheConfig, prefix: &str, progress: bool) -> io::Result<PurgeReport> {
    let root = existing_dir(cfg)?;
    purge_where(root, &mut |k| key::url_of(k).starts_with(prefix), progress)
}

fn purge_where(root: &Path, matches: &mut dyn FnMut(&str) -> bool, progress: bool) -> io::Result<PurgeReport> {
    let bar = dir_bar("purging", progress);
    let mut report = PurgeReport::default();
    walk(root, &bar, &mut |of| {
        report.scanned += 1;
        if let Some((env, meta)) = read_object(&of.path)
            && matches(&meta.key)
            && remove_same(&of.path, env.dev, env.ino)
        {
            report.removed += 1;
            report.bytes += env.file_len;
        }
    })?;
    bar.finish_and_clear();
    Ok(report)
}

/// Reads every object in full and checks its checksum; removes corrupt
/// (or invalid) ones, calling `on_corrupt` for each.
pub(crate) fn verify(
    cfg: &CacheConfig,
    progress: bool,
    on_corrupt: &mut dyn FnMut(&Path, &str),
) -> io::Result<VerifyReport> {
    let root = existing_dir(cfg)?;
    let bar = dir_bar("verifying", progress);
    let mut report = VerifyReport::default();
    walk(root, &bar, &mut |of| {
        let file = match crate::cache::disk::open_regular(&of.path) {
            Ok(f) => f,
            Err(_) => return, // vanished (evicted by a running server)
        };
        let Ok(st) = file.metadata() else { return };
        let outcome = format::read_envelope(&file).and_then(|env| {
            let meta = StoredMeta::decode(&env.meta).map_err(|e| format::ReadError::Corrupt(format::Corrupt(e.0)))?;
            if meta.key.is_empty() {
                return Err(format::ReadError::Corrupt(format::Corrupt("empty key")));
            }
            format::verify_body(&file, &env, &mut |n| report.bytes += n)
        });
        report.checked += 1;
        let why = match outcome {
            Ok(_) => return,
            Err(format::ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => e.to_string(),
        };
        if remove_same(&of.path, st.dev(), st.ino()) {
            on_corrupt(&of.path, &why);
            report.corrupt.push((of.path.clone(), why));
        }
    })?;
    bar.finish_and_clear();
    Ok(report)
}

/// Indexes the store (scanning every object, with a progress bar) and
/// evicts down to the low watermark, calling `on_evict` for each object
/// removed (its key read first). Returns the budget's low watermark too.
pub(crate) fn gc(
    cfg: &CacheConfig,
    progress: bool,
    on_evict: &mut dyn FnMut(&Evicted),
) -> io::Result<(GcReport, disk::Budget)> {
    existing_dir(cfg)?;
    let bar = dir_bar("indexing", progress);
    let store = DiskStore::start_offline(cfg, &mut |p: &ScanProgress| {
        bar.set_length(p.dirs_total);
        bar.set_position(p.dirs_done);
    })?;
    bar.finish_and_clear();
    let budget = store.budget();
    let to_free = store.used().saturating_sub(budget.low);
    let bar = if progress && to_free > 0 {
        let pb = ProgressBar::new(to_free);
        if let Ok(style) = ProgressStyle::with_template("evicting   [{bar:40}] {bytes}/{total_bytes}, {elapsed}") {
            pb.set_style(style.progress_chars("=> "));
        }
        pb
    } else {
        ProgressBar::hidden()
    };
    let report = store.gc_blocking(budget.low, true, &mut |ev| {
        bar.inc(ev.size);
        bar.suspend(|| on_evict(ev));
    });
    bar.finish_and_clear();
    Ok((report, budget))
}

fn unix_time(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
            ))
            .ok()
        })
        .unwrap_or_else(|| secs.to_string())
}

fn system_time(t: SystemTime) -> String {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    unix_time(secs)
}

fn variant_text(variant: &[(String, Option<String>)]) -> String {
    let parts: Vec<String> = variant
        .iter()
        .map(|(n, v)| match v {
            Some(v) => format!("{n}={v}"),
            None => format!("{n}=(absent)"),
        })
        .collect();
    parts.join(";")
}

/// Formats one `list` line: `URL STATUS BODY-BYTES STORED EXPIRES
/// [vary:...] [upstream:NAME]`.
pub(crate) fn list_line(e: &ListEntry) -> String {
    let expires = if e.expires == 0 {
        "-".to_string()
    } else {
        unix_time(e.expires as i64)
    };
    let mut line = format!(
        "{} {} {} {} {}",
        e.key,
        e.status,
        e.body_len,
        system_time(e.stored),
        expires
    );
    if !e.variant.is_empty() {
        line.push_str(" vary:");
        line.push_str(&variant_text(&e.variant));
    }
    if let Some(group) = &e.upstream {
        line.push_str(" upstream:");
        line.push_str(group);
    }
    line
}

/// `portico cache purge URL` or `--prefix PREFIX` on the disk tier: removes
/// the files, prints how many (`purged N objects (B bytes) from the disk
/// tier`) and returns the report, so the caller can say truthfully what a
/// running server did beyond it.
pub fn purge(
    cfg: &CacheConfig,
    upstreams: bool,
    url: Option<&str>,
    prefix: Option<&str>,
) -> Result<PurgeReport, String> {
    use std::io::IsTerminal;
    let progress = io::stderr().is_terminal();
    let r = match (url, prefix) {
        (_, Some(p)) => purge_prefix(cfg, p, progress),
        (Some(u), None) => purge_url(cfg, u, upstreams),
        (None, None) => return Err("purge needs a URL or --prefix".into()),
    }
    .map_err(|e| format!("cache {}: {e}", cfg.dir.display()))?;
    println!("purged {} objects ({} bytes) from the disk tier", r.removed, r.bytes);
    Ok(r)
}

/// Runs a `portico cache` subcommand, printing its results; `upstreams`
/// says whether the config has `[[upstream]]` groups. Ok(false) means it
/// ran but found a problem (verify: corrupt objects): exit 1.
pub fn run(cfg: &CacheConfig, upstreams: bool, cmd: &CacheCommand) -> Result<bool, String> {
    use std::io::IsTerminal;
    let progress = io::stderr().is_terminal();
    let dir = cfg.dir.display().to_string();
    let err = |e: io::Error| format!("cache {dir}: {e}");
    match cmd {
        CacheCommand::Gc => {
            let (r, budget) = gc(cfg, progress, &mut |ev| {
                println!(
                    "removed {} {} bytes{}",
                    ev.key.as_deref().unwrap_or(&ev.id.hex()),
                    ev.size,
                    if ev.expired { " (expired)" } else { "" }
                );
            })
            .map_err(err)?;
            println!(
                "gc: removed {} objects ({} bytes, {} expired) in {:.1?}; used {} -> {} bytes (low watermark {}, high {}, budget {})",
                r.evicted, r.bytes, r.expired, r.elapsed, r.before, r.after, budget.low, budget.high, budget.disk
            );
            Ok(true)
        }
        CacheCommand::List { prefix } => {
            let entries = list(cfg, prefix.as_deref()).map_err(err)?;
            use std::io::Write;
            let mut out = io::BufWriter::new(io::stdout().lock());
            for e in &entries {
                let _ = writeln!(out, "{}", list_line(e));
            }
            Ok(true)
        }
        CacheCommand::Purge { url, prefix } => {
            purge(cfg, upstreams, url.as_deref(), prefix.as_deref())?;
            Ok(true)
        }
        CacheCommand::Verify => {
            let r = verify(cfg, progress, &mut |path, why| {
                println!("corrupt {}: {why} (removed)", path.display())
            })
            .map_err(err)?;
            println!(
                "verify: {} objects ({} body bytes) checked, {} corrupt",
                r.checked,
                r.bytes,
                r.corrupt.len()
            );
            Ok(r.corrupt.is_empty())
        }
    }
}
