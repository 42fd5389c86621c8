//! The memory tier's default budget when `server.processes = N`.
//!
//! The machine-derived default (1/16 of RAM, between 16MiB and 4GiB) is a
//! budget for the whole server. Each worker process has its own memory tier,
//! so giving every worker the full default multiplied it by N (four workers
//! on a 100 GB machine took 6.3 GB instead of 1.6 GB). An unset
//! `cache.memory` is therefore split among the workers; a value written in
//! the file is the admin's per-process figure and is kept as written.

use super::{Config, Size};

/// No worker's share of the default goes below this (the single-process
/// floor), so a small machine with many workers still caches something.
const FLOOR: u64 = 16 << 20;

/// One worker's share of the default budget `total` among `processes`
/// workers: `total / processes`, rounded down to whole MiB, at least 16MiB.
pub fn per_process(total: Size, processes: usize) -> Size {
    let n = u64::try_from(processes.max(1)).unwrap_or(u64::MAX);
    Size(((total.0 / n) & !((1 << 20) - 1)).max(FLOOR))
}

/// Called once the file is parsed: `written` says whether the file sets
/// `cache.memory`. Unset, the machine default is split among the workers.
pub(super) fn share_default(config: &mut Config, written: bool) {
    config.cache.memory_derived = !written;
    if !written {
        config.cache.memory = per_process(super::default_memory_budget(), config.server.processes);
    }
}

/// One line saying where `cache.memory` came from, for `--print-config`.
pub fn note(config: &Config) -> String {
    let memory = config.cache.memory;
    let processes = config.server.processes;
    if !config.cache.memory_derived {
        return format!("cache.memory = {memory} per process (configured)");
    }
    let rule = "1/16 of RAM, between 16MiB and 4GiB";
    if processes <= 1 {
        format!("cache.memory = {memory} (derived: {rule})")
    } else {
        format!(
            "cache.memory = {memory} per process (derived: {rule} = {} for the server, shared by {processes} processes, at least 16MiB each)",
            super::default_memory_budget()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_divided_among_the_worker_processes() {
        assert_eq!(per_process(Size(4 << 30), 1), Size(4 << 30));
        assert_eq!(per_process(Size(4 << 30), 4), Size(1 << 30));
        // Rounded down to whole MiB: 1GiB / 3 = 341.33MiB.
        assert_eq!(per_process(Size(1 << 30), 3), Size(341 << 20));
    }

    #[test]
    fn no_share_goes_below_the_single_process_floor() {
        assert_eq!(per_process(Size(16 << 20), 8), Size(16 << 20));
        assert_eq!(per_process(Size(64 << 20), 1024), Size(16 << 20));
    }

    #[test]
    fn a_memory_written_in_the_file_is_kept_with_any_number_of_processes() {
        let c = crate::config::parse_str("[server]\nprocesses = 4\n[cache]\nmemory = \"100m\"\n", "t.toml").unwrap();
        assert_eq!(c.cache.memory, Size(100 << 20));
        assert!(note(&c).contains("(configured)"), "{}", note(&c));
    }

    #[test]
    fn an_unset_memory_is_the_default_split_among_the_processes() {
        let one = crate::config::parse_str("", "t.toml").unwrap();
        let four = crate::config::parse_str("[server]\nprocesses = 4\n", "t.toml").unwrap();
        assert_eq!(four.cache.memory, per_process(one.cache.memory, 4));
        assert!(note(&four).contains("shared by 4 processes"), "{}", note(&four));
    }
}
