//! Statistics across worker processes (`server.processes = N > 1`).
//!
//! Each worker counts only its own traffic, and the kernel picks which
//! worker answers a monitoring request. So the supervisor makes a private
//! directory (mode 0700, removed when it exits) and names it to the workers
//! in [`ENV_DIR`]; every worker writes its figures there once a second as
//! `worker-I.json` (a [`Report`]; written to a tmp file and renamed, so a
//! reader never sees half a file), and the worker answering a monitoring
//! request adds its own live figures to the others' files ([`gather`]).
//! A file older than [`STALE_AFTER`], or whose pid is no longer running, is
//! left out of the sum and listed as such.
//!
//! The same directory carries `/nsc?stop|start|restart` to every worker: the
//! worker that answers takes the action and writes it as `nsc-I.json` (an
//! [`NscCommand`]); each worker looks for a newer one than it last took
//! every [`WRITE_EVERY`] and takes it too.
//!
//! A single-process server has no directory and writes nothing.

use super::snapshot::{ProcessInfo, Snapshot};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable naming the directory to the workers.
pub const ENV_DIR: &str = "PORTICO_STATS_DIR";

/// How often a worker writes its figures.
pub const WRITE_EVERY: Duration = Duration::from_secs(1);

/// Figures older than this are left out of the sum (a worker that stopped
/// writing is hung or gone).
pub const STALE_AFTER: Duration = Duration::from_secs(5);

/// One process's figures: what a worker writes, and what a view reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The statistics snapshot (its `server` holds pid, worker index, time).
    pub snapshot: Snapshot,
}

/// The directory named by the supervisor, in a worker process; None in a
/// single-process server (or a worker started by hand without it).
pub fn dir() -> Option<PathBuf> {
    crate::worker::index()?;
    std::env::var_os(ENV_DIR).filter(|d| !d.is_empty()).map(PathBuf::from)
}

fn file(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("worker-{index}.json"))
}

/// Writes `report` as worker `index`'s file: to a tmp file named by pid,
/// then renamed over the old one. Blocking: call it off the runtime's threads.
pub fn write(dir: &Path, index: usize, report: &Report) -> std::io::Result<()> {
    let text = serde_json::to_vec(report).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".worker-{index}.{}.tmp", std::process::id()));
    let result = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&text))
        .and_then(|()| std::fs::rename(&tmp, file(dir, index)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// What `/nsc` was asked to do with the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NscAction {
    /// Stop caching (requests go to origins).
    Stop,
    /// Start caching again.
    Start,
    /// Empty the memory tier and start caching.
    Restart,
}

/// An `/nsc` action one worker took, for the others to take too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NscCommand {
    /// When it was taken (nanoseconds since the Unix epoch): its order.
    pub seq: u64,
    /// The action.
    pub action: NscAction,
}

fn nsc_file(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("nsc-{index}.json"))
}

/// Publishes `command`, taken by worker `index`, to the other workers (a
/// tmp file renamed over the last one). Blocking.
pub fn publish_nsc(dir: &Path, index: usize, command: &NscCommand) -> std::io::Result<()> {
    let text = serde_json::to_vec(command).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".nsc-{index}.{}.tmp", std::process::id()));
    let result = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, nsc_file(dir, index)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The newest command any worker published after `after` (a `seq`), if
/// any. Blocking.
pub fn newest_nsc(dir: &Path, after: u64) -> Option<NscCommand> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("nsc-") && name.ends_with(".json")
        })
        .filter_map(|e| serde_json::from_slice::<NscCommand>(&std::fs::read(e.path()).ok()?).ok())
        .filter(|c| c.seq > after)
        .max_by_key(|c| c.seq)
}

/// At a worker's exit: removes its file, then the directory if that left it
/// empty. The supervisor removes the directory when it exits; this covers a
/// supervisor killed outright (the workers get SIGTERM and exit cleanly),
/// so the last worker out leaves no directory behind.
pub fn leave() {
    let (Some(dir), Some(index)) = (dir(), crate::worker::index()) else {
        return;
    };
    let _ = std::fs::remove_file(file(&dir, index));
    let _ = std::fs::remove_file(nsc_file(&dir, index));
    // Fails (and is meant to) while another worker's file is there.
    let _ = std::fs::remove_dir(&dir);
}

/// True if process `pid` exists (and is not a zombie waiting to be reaped).
fn running(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists.
    let exists =
        unsafe { libc::kill(p, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(')').next().is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
}

/// Worker `index`'s figures from its file, if they are current: else why not.
pub fn read(dir: &Path, index: usize, now_unix: f64) -> Result<Report, String> {
    let text = match std::fs::read(file(dir, index)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("no figures yet".to_string()),
        Err(e) => return Err(format!("cannot read its figures: {}", crate::util::io_cause(&e))),
    };
    let report: Report = serde_json::from_slice(&text).map_err(|e| {
        tracing::debug!("worker figures: {e}");
        "its figures are unreadable (not the JSON this version writes)".to_string()
    })?;
    let srv = &report.snapshot.server;
    if !running(srv.pid) {
        return Err(format!("pid {} not running", srv.pid));
    }
    let age = now_unix - srv.time_unix;
    if age > STALE_AFTER.as_secs_f64() {
        return Err(format!("figures {age:.0} s old"));
    }
    Ok(report)
}

/// The figures the views show: the sum over the workers whose figures are
/// current (`snapshot.processes` lists every worker, counted or not), each
/// and each counted worker's own snapshot in index order (the answering
/// one live).
#[derive(Debug, Clone)]
pub struct Gathered {
    /// The sum; `processes` is filled in.
    pub snapshot: Snapshot,
    /// The counted workers' own snapshots.
    pub parts: Vec<Snapshot>,
}

fn info(index: usize, s: &Snapshot, status: &str, age_secs: f64) -> ProcessInfo {
    let srv = &s.server;
    ProcessInfo {
        index,
        pid: srv.pid,
        counted: true,
        status: status.to_string(),
        age_secs,
        requests: s.requests.total,
        active: s.sessions.active,
        rss_bytes: srv.rss_bytes,
        cpu_secs: srv.cpu_user_secs + srv.cpu_system_secs,
        uptime_secs: srv.uptime_secs,
    }
}

/// Sums `own` (this worker's live figures; its `server.process_index` says
/// which worker it is) with the current files of the other workers of
/// `0..processes` in `dir`. Blocking (reads files).
pub fn gather(own: Report, processes: usize, dir: &Path) -> Gathered {
    let own_index = own.snapshot.server.process_index.unwrap_or(0);
    let now = own.snapshot.server.time_unix;
    let mut infos = Vec::new();
    let mut reports: Vec<(usize, Report)> = Vec::new();
    for i in 0..processes.max(own_index + 1) {
        if i == own_index {
            infos.push(info(i, &own.snapshot, "this process", 0.0));
            continue;
        }
        match read(dir, i, now) {
            Ok(r) => {
                let age = (now - r.snapshot.server.time_unix).max(0.0);
                infos.push(info(i, &r.snapshot, "live", age));
                reports.push((i, r));
            }
            Err(why) => infos.push(ProcessInfo {
                index: i,
                counted: false,
                status: why,
                ..Default::default()
            }),
        }
    }
    // The answering process first: the sum keeps its settings and pid.
    let mut ordered = vec![own];
    ordered.extend(reports.into_iter().map(|(_, r)| r));
    let snaps: Vec<Snapshot> = ordered.into_iter().map(|r| r.snapshot).collect();
    let mut snapshot = Snapshot::sum(&snaps);
    snapshot.processes = infos;
    let mut parts = snaps;
    parts.sort_by_key(|s| s.server.process_index);
    Gathered { snapshot, parts }
}

/// Makes the supervisor's directory, `<temp dir>/portico-<pid>-<random>-stats`,
/// mode 0700 (statistics name clients' hosts and paths). The random part makes the name unguessable: with
/// the pid alone, another local user could make that name first (in a
/// shared `/tmp`), and the workers would lose their shared figures. It is
/// created, never reused: `mkdir` fails on any existing name, and another
/// random name is tried.
pub fn make_dir() -> std::io::Result<PathBuf> {
    use ring::rand::SecureRandom;
    use std::os::unix::fs::DirBuilderExt;
    let rng = ring::rand::SystemRandom::new();
    let mut last = None;
    for _ in 0..8 {
        let mut bytes = [0u8; 8];
        rng.fill(&mut bytes)
            .map_err(|_| std::io::Error::other("no random bytes from the system"))?;
        let dir = std::env::temp_dir().join(format!(
            "portico-{}-{:016x}-stats",
            std::process::id(),
            u64::from_le_bytes(bytes)
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statistics_directory_is_private_and_its_name_unguessable() {
        use std::os::unix::fs::PermissionsExt;
        let a = make_dir().unwrap();
        let b = make_dir().unwrap();
        assert_ne!(a, b, "two directories of one process share no name");
        let name = a.file_name().unwrap().to_string_lossy().into_owned();
        let prefix = format!("portico-{}-", std::process::id());
        assert!(name.starts_with(&prefix) && name.ends_with("-stats"), "{name}");
        assert_eq!(name.len(), prefix.len() + 16 + "-stats".len(), "{name}");
        assert_eq!(std::fs::metadata(&a).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::remove_dir(&a).unwrap();
        std::fs::remove_dir(&b).unwrap();
    }

    fn report(index: usize, pid: u32, requests: u64, time_unix: f64) -> Report {
        let mut s = Snapshot::default();
        s.server.pid = pid;
        s.server.process_index = Some(index);
        s.server.time_unix = time_unix;
        s.requests.total = requests;
        Report { snapshot: s }
    }

    #[test]
    fn gathers_current_files_and_says_why_others_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let now = 1_000_000.0;
        write(dir.path(), 1, &report(1, me, 5, now - 1.0)).unwrap();
        write(dir.path(), 2, &report(2, me, 7, now - 60.0)).unwrap();
        write(dir.path(), 3, &report(3, u32::MAX / 2, 9, now)).unwrap();
        let g = gather(report(0, me, 3, now), 5, dir.path());
        assert_eq!(g.snapshot.requests.total, 8);
        assert_eq!(g.parts.len(), 2);
        let status: Vec<(bool, &str)> = g
            .snapshot
            .processes
            .iter()
            .map(|p| (p.counted, p.status.as_str()))
            .collect();
        assert_eq!(status[0], (true, "this process"));
        assert_eq!(status[1], (true, "live"));
        assert_eq!(status[2], (false, "figures 60 s old"));
        assert!(!status[3].0 && status[3].1.ends_with("not running"), "{status:?}");
        assert_eq!(status[4], (false, "no figures yet"));
        // No tmp files left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| n.starts_with("worker-")), "{names:?}");
    }

    #[test]
    fn the_newest_nsc_command_of_any_worker_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(newest_nsc(dir.path(), 0), None);
        let stop = NscCommand {
            seq: 10,
            action: NscAction::Stop,
        };
        let start = NscCommand {
            seq: 20,
            action: NscAction::Start,
        };
        publish_nsc(dir.path(), 1, &start).unwrap();
        publish_nsc(dir.path(), 0, &stop).unwrap();
        assert_eq!(newest_nsc(dir.path(), 0), Some(start));
        assert_eq!(newest_nsc(dir.path(), 20), None, "already taken");
        // A worker's next command replaces its last one.
        let restart = NscCommand {
            seq: 30,
            action: NscAction::Restart,
        };
        publish_nsc(dir.path(), 0, &restart).unwrap();
        assert_eq!(newest_nsc(dir.path(), 20), Some(restart));
    }
}
