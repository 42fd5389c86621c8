//! Dropping root privileges: started as root to bind ports below 1024 (80,
//! 443, as nginx and Squid are), Portico switches to `[server] user` and
//! `group` once every listener is bound and the log files and the cache
//! directory are open, before it serves a request.
//!
//! The switch is setgroups (the supplementary groups become the one group),
//! setgid, setuid, in that order: the group calls need root, so they come
//! before the uid changes. glibc applies each to every thread of the
//! process. If any call fails the process refuses to go on as root. Files
//! Portico created at this start (the error and access logs, the cache
//! directory) are given to the user first, so it can write and reopen them.
//! Threads started before the switch that create files (the disk cache's
//! start-up scan) wait for it ([`wait_for_switch`]).
//!
//! The pid file (`server.pid_file`) lives here too: it is written in the
//! same window, bound but not yet switched, and removed at exit.

use crate::config::Config;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Adds `027` to the process's umask (never loosening one already
/// stricter), as Squid's default `umask 027` does: the cache holds responses
/// meant for one user (a `public` answer to an `Authorization` request, a
/// cookie-stripped page) and the logs hold user names and URLs, none of
/// them for other local users, whoever starts Portico and however.
pub fn tighten_umask() {
    // SAFETY: umask has no preconditions; it returns the old mask.
    let old = unsafe { libc::umask(0o027) };
    // SAFETY: as above.
    unsafe { libc::umask(old | 0o027) };
}

/// The user and group to switch to.
#[derive(Debug, Clone)]
pub struct Target {
    /// The user's name as configured.
    pub user: String,
    /// Its uid.
    pub uid: libc::uid_t,
    /// The group's gid (`group`, else the user's primary group).
    pub gid: libc::gid_t,
}

/// What [`switch`] does: set by [`prepare`] before anything is created.
struct Plan {
    target: Target,
    /// Paths that did not exist before start-up: Portico creates them, so
    /// gives them to the user.
    created: Vec<PathBuf>,
    /// The cache directory, checked for its owner.
    cache_dir: Option<PathBuf>,
}

static PLAN: Mutex<Option<Plan>> = Mutex::new(None);

/// True from [`prepare`] finding a user to switch to until [`switch`] has
/// switched: background work that creates files (the disk cache's start-up
/// scan moving objects into new level directories) waits for it
/// ([`wait_for_switch`]), so that what it creates belongs to the user. Made
/// as root, a directory would refuse the user's writes from then on.
static PENDING: (Mutex<bool>, std::sync::Condvar) = (Mutex::new(false), std::sync::Condvar::new());

fn set_pending(pending: bool) {
    *PENDING.0.lock().unwrap_or_else(|p| p.into_inner()) = pending;
    PENDING.1.notify_all();
}

/// Blocks the calling thread until no switch to `server.user` is pending:
/// at once when none was planned or it is done. A switch that fails ends
/// the process, so a waiter never runs as root in its place.
pub(crate) fn wait_for_switch() {
    let mut pending = PENDING.0.lock().unwrap_or_else(|p| p.into_inner());
    while *pending {
        pending = PENDING.1.wait(pending).unwrap_or_else(|p| p.into_inner());
    }
}

/// Looks up `server.user` and `server.group`: Ok(None) when no user is
/// configured; an error for an unknown name or a group without a user.
pub fn target(config: &Config) -> Result<Option<Target>, String> {
    let s = &config.server;
    if s.user.is_empty() {
        if !s.group.is_empty() {
            return Err(format!(
                "server.group = {:?} needs server.user: a process left running as root gains nothing from a group",
                s.group
            ));
        }
        return Ok(None);
    }
    let (uid, primary) = lookup_user(&s.user)?;
    let gid = if s.group.is_empty() {
        primary
    } else {
        lookup_group(&s.group)?
    };
    Ok(Some(Target {
        user: s.user.clone(),
        uid,
        gid,
    }))
}

/// Resolves the target and records which of the files Portico writes do
/// not exist yet; call before the logs and the cache are opened.
pub(crate) fn prepare(config: &Config) -> Result<Option<Target>, String> {
    let Some(target) = target(config)? else {
        return Ok(None);
    };
    let mut created = Vec::new();
    if let Some(p) = crate::log::created_error_log() {
        created.push(p.to_path_buf());
    }
    let access = &config.log.access;
    if !access.as_os_str().is_empty() && std::fs::symlink_metadata(access).is_err() {
        created.push(access.clone());
    }
    let cache_dir = (config.cache.enabled && config.cache.disk.bytes() > 0).then(|| config.cache.dir.clone());
    if let Some(dir) = &cache_dir {
        // The disk tier creates its tmp directory when it opens, before the
        // switch: in a cache directory that exists already (the Debian
        // package creates /var/cache/portico for the user) it is new too,
        // and left to root the user could store nothing.
        let tmp = dir.join(crate::cache::disk::format::TMP_DIR);
        for path in [dir.clone(), tmp] {
            if std::fs::symlink_metadata(&path).is_err() {
                created.push(path);
            }
        }
    }
    *PLAN.lock().unwrap_or_else(|p| p.into_inner()) = Some(Plan {
        target: target.clone(),
        created,
        cache_dir,
    });
    set_pending(true);
    Ok(Some(target))
}

/// Switches to the prepared user, if any: the files created since
/// [`prepare`] are given to it first. Not root: nothing changes (a warning
/// if the user differs). Any failure as root is an error: Portico does not
/// serve as root when told not to.
pub(crate) fn switch() -> Result<(), String> {
    let Some(plan) = PLAN.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return Ok(());
    };
    let t = &plan.target;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        if euid != t.uid {
            tracing::warn!(
                "server.user = {:?} ignored: not started as root (running as uid {euid})",
                t.user
            );
        }
        set_pending(false);
        return Ok(());
    }
    for path in &plan.created {
        chown_tree(path, t.uid, t.gid);
    }
    if let Some(dir) = &plan.cache_dir {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(dir)
            && m.uid() != t.uid
        {
            tracing::warn!(
                "cache.dir {} belongs to uid {}, not to {} (uid {}): the disk cache may fail to write; chown it",
                dir.display(),
                m.uid(),
                t.user,
                t.uid
            );
        }
    }
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    drop_to(t)?;
    if crate::worker::index().is_some() {
        rearm_parent_death_signal(parent);
    }
    tracing::info!("switched to user {} (uid {}, gid {})", t.user, t.uid, t.gid);
    set_pending(false);
    Ok(())
}

/// A worker's parent-death signal again after the switch: the kernel clears
/// it when a process changes user (prctl(2)), and without it a worker whose
/// supervisor was killed outright would go on serving, reparented to init.
/// If the supervisor (`parent`) died before the signal was set again, the
/// worker stops now, as the signal would have made it.
fn rearm_parent_death_signal(parent: libc::pid_t) {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number; getppid and
    // raise have no preconditions.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
            tracing::warn!(
                "cannot set the parent-death signal again after the switch: {}",
                std::io::Error::last_os_error()
            );
        }
        if libc::getppid() != parent {
            libc::raise(libc::SIGTERM);
        }
    }
}

/// setgroups, setgid, setuid; then checks that root cannot be regained.
pub(crate) fn drop_to(t: &Target) -> Result<(), String> {
    let fail = |call: &str| {
        format!(
            "cannot switch to user {} (uid {}, gid {}): {call}: {}; refusing to run as root",
            t.user,
            t.uid,
            t.gid,
            std::io::Error::last_os_error()
        )
    };
    // SAFETY: setgroups reads one gid from the pointer given; setgid,
    // setuid and setuid(0) take plain integers.
    unsafe {
        if libc::setgroups(1, &t.gid) != 0 {
            return Err(fail("setgroups"));
        }
        if libc::setgid(t.gid) != 0 {
            return Err(fail("setgid"));
        }
        if libc::setuid(t.uid) != 0 {
            return Err(fail("setuid"));
        }
        if t.uid != 0 && libc::setuid(0) == 0 {
            return Err(fail("root could be regained after setuid"));
        }
    }
    Ok(())
}

/// Warnings for the files `config` names that `server.user` cannot read
/// (see [`Config::files_read_on_reload`]), and for `config_file` (the
/// configuration itself, when a reload reads it from there: one process
/// alone), by path and key: none unless Portico runs as root with a user
/// to switch to. Portico reads them as root at start-up, before it
/// switches, so such a file starts fine; but a reload reads it again as
/// the user and fails (htpasswd and group files are also read again
/// whenever they change), and with `server.processes` each worker is then
/// replaced, starting with an empty memory cache. Asked of the kernel
/// itself (permissions, ACLs, each directory on the way), from a thread
/// that takes the user's file-system identity for the time of the check.
pub fn unreadable_warnings(config: &Config, config_file: Option<&Path>) -> Vec<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Vec::new();
    }
    match target(config) {
        Ok(Some(target)) => unreadable_by(&target, config, config_file),
        _ => Vec::new(),
    }
}

/// [`unreadable_warnings`] for `target`, the user a server started as root
/// switches to (the one in force, whatever `config` names now).
pub fn unreadable_by(target: &Target, config: &Config, config_file: Option<&Path>) -> Vec<String> {
    if cfg!(not(target_pointer_width = "64")) {
        return Vec::new();
    }
    let target = target.clone();
    let mut files: Vec<(String, PathBuf)> = config
        .files_read_on_reload()
        .into_iter()
        .map(|(key, path)| (key, path.to_path_buf()))
        .collect();
    if let Some(path) = config_file {
        files.insert(0, ("the configuration file".to_string(), path.to_path_buf()));
    }
    // Each error page is read, not only the directory listed: a page only
    // root may read fails the reload as surely as the directory would.
    let pages = &config.error_pages.directory;
    if !pages.as_os_str().is_empty()
        && let Ok(entries) = std::fs::read_dir(pages)
    {
        files.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| crate::proxy::ErrorPages::is_page_name(p))
                .map(|p| ("an error page of error_pages.directory".to_string(), p)),
        );
    }
    if files.is_empty() {
        return Vec::new();
    }
    let user = target.user.clone();
    // A thread of its own, ended after the check: its identity is never
    // taken back, so nothing else ever runs with it.
    let checked = std::thread::Builder::new()
        .name("portico-user-check".to_string())
        .spawn(move || -> Result<Vec<(String, PathBuf, std::io::Error)>, String> {
            as_user_for_files(&target)?;
            Ok(files
                .into_iter()
                // Without blocking on a FIFO (refused when read for real).
                .filter_map(|(key, path)| match crate::util::open_nonblocking(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Some((key, path, e)),
                    _ => None,
                })
                .collect())
        })
        .map_err(|e| e.to_string())
        .and_then(|t| t.join().map_err(|_| "the check panicked".to_string()))
        .and_then(|r| r);
    match checked {
        Ok(denied) => denied
            .into_iter()
            .map(|(key, path, e)| {
                format!(
                    "server.user {user:?} cannot read {} ({key}: {}): Portico reads it as root at start-up, but a \
                     reload reads it again as {user:?} and fails (with server.processes, each worker is then \
                     replaced and starts with an empty memory cache); make it readable by that user",
                    path.display(),
                    crate::util::io_cause(&e)
                )
            })
            .collect(),
        Err(e) => vec![format!(
            "cannot check which of the files the configuration names server.user {user:?} can read: {e}"
        )],
    }
}

/// Gives the calling thread, and only it, `t`'s identity for file access:
/// its file-system uid and gid and `t`'s one group as its supplementary
/// groups, as [`drop_to`] leaves a worker. The raw system calls act on
/// this thread alone (glibc's `setgroups` would change every thread's
/// groups), and the kernel drops the thread's file capabilities with a
/// non-root file-system uid, so what it opens is what the user could open.
/// The thread must end after its checks: its identity is not taken back.
#[cfg(target_pointer_width = "64")]
fn as_user_for_files(t: &Target) -> Result<(), String> {
    let fail = |call: &str| format!("{call}: {}", std::io::Error::last_os_error());
    let (uid, gid) = (libc::c_long::from(t.uid), libc::c_long::from(t.gid));
    // SAFETY: setgroups reads one gid from the pointer given, which lives
    // for the call; setfsgid and setfsuid take plain integers. Each acts
    // on the calling thread's credentials only. (These are the 32-bit-id
    // calls on 64-bit Linux; hence the cfg.)
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 1 as libc::c_long, &t.gid as *const libc::gid_t) != 0 {
            return Err(fail("setgroups"));
        }
        // Both return the previous id whatever happens (and set no
        // errno): a second call tells whether the first took.
        libc::syscall(libc::SYS_setfsgid, gid);
        if libc::syscall(libc::SYS_setfsgid, gid) != gid {
            return Err(format!("setfsgid({gid}) did not take"));
        }
        libc::syscall(libc::SYS_setfsuid, uid);
        if libc::syscall(libc::SYS_setfsuid, uid) != uid {
            return Err(format!("setfsuid({uid}) did not take"));
        }
    }
    Ok(())
}

/// Elsewhere the raw calls take 16-bit ids: not checked there (nor
/// called: [`unreadable_warnings`] says nothing).
#[cfg(not(target_pointer_width = "64"))]
fn as_user_for_files(_: &Target) -> Result<(), String> {
    Err("not supported on this architecture".to_string())
}

/// Gives `path` (and, for a directory, everything under it) to uid:gid;
/// failures are logged (the file stays usable by root only).
///
/// Runs as root over places the service user may write to (its log and
/// cache directories), so no symbolic link is ever followed, not even one
/// swapped in while this runs: each entry is opened with `O_PATH |
/// O_NOFOLLOW` relative to its parent's descriptor (a link is opened as
/// itself, never as its target, and nothing is read from a device or a
/// FIFO), changed through that descriptor, and only a directory so opened
/// is descended into. Following paths instead, a user who replaced a log
/// file with a link to `/etc` between its creation and this walk was given
/// `/etc`.
pub(crate) fn chown_tree(path: &Path, uid: libc::uid_t, gid: libc::gid_t) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    match open_nofollow(libc::AT_FDCWD, &c) {
        Ok(fd) => chown_fd(&fd, path, uid, gid, 0),
        Err(e) => tracing::warn!(
            "cannot give {} to uid {uid}: {}",
            path.display(),
            crate::util::io_cause(&e)
        ),
    }
}

/// Deepest directory [`chown_tree`] descends into (the cache's tree is
/// three levels deep).
const CHOWN_DEPTH: usize = 16;

/// `name` opened relative to `dir` (`AT_FDCWD` or a directory descriptor)
/// with `O_PATH | O_NOFOLLOW`: a descriptor of the entry itself.
fn open_nofollow(dir: libc::c_int, name: &std::ffi::CStr) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: `name` is a valid NUL-terminated string for the call; the
    // descriptor returned, when not -1, is new and owned by nobody else.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned here alone.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Changes the entry `fd` stands for (shown as `shown` in warnings) and,
/// for a directory, its entries.
fn chown_fd(fd: &std::os::fd::OwnedFd, shown: &Path, uid: libc::uid_t, gid: libc::gid_t, depth: usize) {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: `fd` is open; the empty path with AT_EMPTY_PATH names it
    // (works on an O_PATH descriptor, a symbolic link's included).
    let rc = unsafe { libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(
            "cannot give {} to uid {uid}: {}",
            shown.display(),
            crate::util::io_cause(&e)
        );
        return;
    }
    // SAFETY: stat is plain data that fstat fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` valid for the call.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFDIR
        || depth >= CHOWN_DEPTH
    {
        return;
    }
    // The directory's entries, listed through the descriptor (its
    // /proc/self/fd link is the directory itself, not a path looked up again).
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Ok(c) = CString::new(name.as_bytes()) else {
            continue;
        };
        let shown = shown.join(&name);
        match open_nofollow(fd.as_raw_fd(), &c) {
            Ok(child) => chown_fd(&child, &shown, uid, gid, depth + 1),
            Err(e) => tracing::warn!(
                "cannot give {} to uid {uid}: {}",
                shown.display(),
                crate::util::io_cause(&e)
            ),
        }
    }
}

fn lookup_user(name: &str) -> Result<(libc::uid_t, libc::gid_t), String> {
    let c = CString::new(name).map_err(|_| format!("server.user {name:?}: contains a NUL byte"))?;
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: passwd is plain data that getpwnam_r fills in.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the strings it points
    // `pw` at live in `buf`, which outlives their (no) use here.
    let rc = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc == 0 && !result.is_null() {
        return Ok((pw.pw_uid, pw.pw_gid));
    }
    Err(format!("server.user {name:?}: no such user (see /etc/passwd)"))
}

fn lookup_group(name: &str) -> Result<libc::gid_t, String> {
    let c = CString::new(name).map_err(|_| format!("server.group {name:?}: contains a NUL byte"))?;
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: group is plain data that getgrnam_r fills in.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as in lookup_user.
    let rc = unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc == 0 && !result.is_null() {
        return Ok(gr.gr_gid);
    }
    Err(format!("server.group {name:?}: no such group (see /etc/group)"))
}

/// The pid file `server.pid_file`: written once the listeners are bound,
/// removed when dropped (at exit).
pub(crate) struct PidFile(PathBuf);

impl PidFile {
    /// Writes this process's pid to `path`, or nothing when it is empty.
    pub fn write(path: &Path) -> Result<Option<PidFile>, String> {
        if path.as_os_str().is_empty() {
            return Ok(None);
        }
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::fs::PermissionsExt;
        // Not through a symbolic link (`log::no_follow`): written as root,
        // in a directory the service user may own. Readable by all, as
        // nginx's and Squid's are, whatever the umask (`tighten_umask`
        // takes "other" away): after the switch to `server.user` the
        // server reads it back at exit to see it is still its own.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(crate::log::no_follow(path))
            .open(path)
            .and_then(|mut f| {
                f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
                f.write_all(format!("{}\n", std::process::id()).as_bytes())
            })
            .map_err(|e| {
                format!(
                    "cannot write server.pid_file {}: {}",
                    path.display(),
                    crate::util::io_cause(&e)
                )
            })?;
        Ok(Some(PidFile(path.to_path_buf())))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Only our own: a newer server may have written the file since.
        let ours = std::fs::read_to_string(&self.0).is_ok_and(|t| t.trim() == std::process::id().to_string());
        if ours && let Err(e) = std::fs::remove_file(&self.0) {
            tracing::warn!(
                "cannot remove server.pid_file {}: {} (after the switch to server.user, its directory must be writable by that user)",
                self.0.display(),
                crate::util::io_cause(&e)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Run as root (CI's user), else skipped: only root can give files away.
    #[test]
    fn chown_tree_gives_away_links_themselves_never_what_they_point_at() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: not root");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = dir.path().join("tree");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(tree.join("sub")).expect("tree");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(tree.join("a"), "a").expect("a");
        std::fs::write(tree.join("sub/b"), "b").expect("b");
        std::fs::write(outside.join("victim"), "v").expect("victim");
        std::os::unix::fs::symlink(outside.join("victim"), tree.join("link")).expect("link");
        std::os::unix::fs::symlink(&outside, tree.join("sub/dirlink")).expect("dirlink");
        chown_tree(&tree, 65534, 65534);
        let owner = |p: &Path| std::fs::symlink_metadata(p).expect("lstat").uid();
        for p in ["", "a", "sub", "sub/b", "link", "sub/dirlink"] {
            assert_eq!(owner(&tree.join(p)), 65534, "{p}");
        }
        assert_eq!(owner(&outside), 0, "a linked directory is not entered");
        assert_eq!(owner(&outside.join("victim")), 0, "a linked file is not changed");
    }
}
