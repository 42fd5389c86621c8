//! `/nsc`: the cache status page, after the Sun Java System Web Proxy Server 4's file-cache page
//! (`service-nsc-dump`): utilisation, hits and misses, deletions, the
//! parameter settings, and with `?list` every object in the memory tier.

use crate::config::CacheConfig;
use crate::stats::snapshot::{Snapshot, percent};
use std::fmt::Write;

/// One object in the `?list` listing.
pub struct NscEntry {
    /// The cache key URL.
    pub key: String,
    /// Flags: C contents in memory, F also in a disk-tier file, V a Vary marker.
    pub flags: String,
    /// Body bytes.
    pub size: u64,
    /// The object id (hex).
    pub id: String,
}

/// The page; `message` reports a `?start` / `?stop` / `?restart` just done.
pub fn render(s: &Snapshot, cfg: &CacheConfig, list: Option<&[NscEntry]>, message: Option<&str>) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Portico Cache Status (pid {})\n", s.server.pid);
    if let Some(m) = message {
        let _ = writeln!(o, "{m}\n");
    }
    let Some(c) = &s.cache else {
        let _ = writeln!(o, "The cache is disabled (cache.enabled = false).");
        return o;
    };
    let _ = writeln!(
        o,
        "The cache is {}.",
        if c.running {
            "enabled"
        } else {
            "stopped (requests go to origins; ?start resumes it)"
        }
    );
    let _ = writeln!(o, "Cache resource utilization\n");
    let disk_entries = c.disk.as_ref().map_or(0, |d| d.objects);
    let _ = writeln!(
        o,
        "Number of cached entries = {} in memory, {} on disk",
        c.memory_entries, disk_entries
    );
    let _ = writeln!(
        o,
        "Heap space used for cache = {}/{} bytes",
        c.memory_bytes, c.memory_limit
    );
    match &c.disk {
        Some(d) => {
            let _ = writeln!(o, "Disk space used for cache = {}/{} bytes", d.bytes, d.limit);
        }
        None => {
            let _ = writeln!(o, "Disk space used for cache = 0/0 bytes (no disk tier)");
        }
    }
    let _ = writeln!(
        o,
        "Number of cache lookup hits = {}/{} ({:6.2} %)",
        c.hits,
        c.lookups,
        percent(c.hits, c.lookups)
    );
    let _ = writeln!(o, "Number of hits/misses on cached objects = {}/{}", c.hits, c.misses);
    let _ = writeln!(
        o,
        "Number of stale answers/revalidations = {}/{}",
        c.stale, c.revalidations
    );
    let _ = writeln!(o, "Number of requests sharing a fetch = {}", c.collapsed);
    let _ = writeln!(o, "Number of body bytes served from cache = {}", c.bytes_served);
    let evicted = c.disk.as_ref().map_or(0, |d| d.evictions);
    let _ = writeln!(o, "Number of outdated cache entries deleted = {evicted}");
    let _ = writeln!(o, "Number of cache entries stored = {}", c.stored);
    let _ = writeln!(o, "Total number of cache entries deleted = {}", evicted + c.invalidated);
    let _ = writeln!(o, "\nParameter settings\n");
    let secs = |d: crate::config::Dur| d.get().as_secs();
    let _ = writeln!(
        o,
        "MaxAge: {}",
        if secs(cfg.max_ttl) == 0 {
            "origin's lifetime (no cap)".to_string()
        } else {
            format!("{} seconds", secs(cfg.max_ttl))
        }
    );
    let _ = writeln!(o, "MinAge: {} seconds", secs(cfg.min_ttl));
    let _ = writeln!(o, "MemoryBudget: {} bytes", cfg.memory.bytes());
    let _ = writeln!(o, "MaxMemoryObject: {} bytes", cfg.max_memory_object.bytes());
    let _ = writeln!(o, "MaxObjectSize: {} bytes", cfg.max_object_size.bytes());
    let _ = writeln!(o, "DiskBudget: {} bytes", cfg.disk.bytes());
    let _ = writeln!(o, "Directory: {}", cfg.dir.display());
    let _ = writeln!(o, "Levels: {} x {}", cfg.levels[0], cfg.levels[1]);
    let _ = writeln!(o, "Watermarks: {}% / {}%", cfg.watermarks[0], cfg.watermarks[1]);
    // As spelt in the config (`cache.replacement`).
    let _ = writeln!(o, "Replacement: {}", format!("{:?}", cfg.replacement).to_lowercase());
    let _ = writeln!(o, "OpenFiles: {}", cfg.open_files);
    let _ = writeln!(o, "GC: {:?}", cfg.gc);
    let _ = writeln!(o, "Fsync: {:?}", cfg.fsync);
    let _ = writeln!(o, "IgnoreReload: {}", cfg.ignore_reload);
    let _ = writeln!(o, "IgnoreNoStore: {}", cfg.ignore_no_store);
    let _ = writeln!(o, "CacheQuery: {}", cfg.cache_query);
    let _ = writeln!(o, "IgnoreQueryInKey: {}", cfg.ignore_query_in_key);
    let _ = writeln!(o, "RefreshPatterns: {}", cfg.refresh.len());
    if let Some(list) = list {
        let _ = writeln!(
            o,
            "\nCached objects in memory ({}; flags: C contents in memory, F disk file, V Vary marker)\n",
            list.len()
        );
        for e in list {
            let _ = writeln!(o, "{:<4} {:>12} {} {}", e.flags, e.size, e.id, e.key);
        }
    }
    o
}
