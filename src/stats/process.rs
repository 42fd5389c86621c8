//! Process facts from /proc/self: threads, memory, CPU time, open files.

/// Threads, RSS, peak RSS (bytes), user and system CPU (seconds), open fds.
pub struct ProcFacts {
    /// OS threads.
    pub threads: u64,
    /// Resident set, bytes.
    pub rss: u64,
    /// Peak resident set, bytes.
    pub peak_rss: u64,
    /// User CPU seconds.
    pub user: f64,
    /// System CPU seconds.
    pub system: f64,
    /// Open file descriptors.
    pub fds: u64,
}

/// Reads /proc/self; fields it cannot read are 0 (non-Linux, restricted /proc).
pub fn read() -> ProcFacts {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (user, system) = cpu_times(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default());
    ProcFacts {
        threads: field("Threads:"),
        rss: field("VmRSS:") * 1024,
        peak_rss: field("VmHWM:") * 1024,
        user,
        system,
        fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
    }
}

/// utime and stime (fields 14 and 15) of /proc/self/stat, in seconds.
fn cpu_times(stat: &str) -> (f64, f64) {
    // The command name (field 2) may hold spaces: count after its ')'.
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return (0.0, 0.0);
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions; -1 on error is handled.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    let get = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) as f64 / hz;
    // After ')' field 3 (state) is index 0, so utime (14) is index 11.
    (get(11), get(12))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_times_after_a_name_with_spaces() {
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let stat = "42 (a b) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0";
        let (u, s) = cpu_times(stat);
        assert_eq!((u * hz).round() as u64, 250);
        assert_eq!((s * hz).round() as u64, 50);
    }

    #[test]
    fn reads_this_process() {
        let f = read();
        assert!(f.threads >= 1 && f.rss > 0 && f.fds > 0);
    }
}
