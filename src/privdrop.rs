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

/// The owner listening sockets are created with: `server.user`'s uid when
/// Portico runs as root with a user to switch to, else None (its own).
/// Every listener socket of a server has the same owner this way, whoever
/// binds it: a worker at start (as root), a worker on a reload (as the
/// user, after its switch), the supervisor's check (as root). The kernel
/// refuses an SO_REUSEPORT bind next to a socket of another owner, so a
/// listener a reload added would otherwise stop a worker restarted as
/// root from binding it, and the supervisor from checking it again.
pub(crate) fn socket_owner(config: &Config) -> Option<libc::uid_t> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    target(config).ok().flatten().map(|t| t.uid)
}

/// Runs `create` with the calling thread's file-system uid set to `owner`
/// (the kernel gives a new socket that uid), then sets it back to root's:
/// no other thread's identity changes, and the thread keeps its other
/// privileges meanwhile (binding a port below 1024, for one). `None` runs
/// it as it is.
pub(crate) fn creating_as<T>(owner: Option<libc::uid_t>, create: impl FnOnce() -> T) -> Result<T, String> {
    let Some(uid) = owner else {
        return Ok(create());
    };
    // SAFETY: setfsuid takes a plain integer and changes the calling
    // thread's credentials only (the raw call: no library wrapper that
    // would change every thread's). It returns the previous fsuid whatever
    // happens, so a second call tells whether the first took.
    let set = |uid: libc::uid_t| unsafe {
        libc::syscall(libc::SYS_setfsuid, uid);
        libc::syscall(libc::SYS_setfsuid, uid) == libc::c_long::from(uid)
    };
    if !set(uid) {
        return Err(format!(
            "cannot create a socket owned by uid {uid}: setfsuid: {}",
            std::io::Error::last_os_error()
        ));
    }
    let made = create();
    if !set(0) {
        // Left with another file-system uid, this thread would create
        // files as that user from now on: stop rather than misbehave.
        return Err(format!(
            "cannot take back root's file-system uid after creating a socket: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(made)
}

/// Warnings for the files `config` names that `server.user` cannot read
/// (see [`Config::files_read_on_reload`]): none unless Portico runs as
/// root with a user to switch to. A starting worker reads them as root,
/// before it switches, so such a file starts fine; but every reload reads
/// it again as the user and fails, and with `server.processes` each worker
/// is then replaced (its memory tier lost). Asked of the kernel itself
/// (permissions, ACLs, each directory on the way), from a thread that
/// takes the user's file-system identity for the time of the check.
pub fn unreadable_warnings(config: &Config) -> Vec<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Vec::new();
    }
    let Ok(Some(target)) = target(config) else {
        return Vec::new();
    };
    let files: Vec<(String, PathBuf)> = config
        .files_read_on_reload()
        .into_iter()
        .map(|(key, path)| (key, path.to_path_buf()))
        .collect();
    if files.is_empty() {
        return Vec::new();
    }
    let user = target.user.clone();
    let checked = std::thread::Builder::new()
        .name("portico-user-check".to_string())
        .spawn(move || -> Result<Vec<(String, PathBuf, std::io::Error)>, String> {
            as_user_for_files(&target)?;
            Ok(files
                .into_iter()
                .filter_map(|(key, path)| match std::fs::File::open(&path) {
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
                    "server.user {user:?} cannot read {} ({key}: {}): a worker reads it at start-up as root, \
                     but every reload reads it again as {user:?} and fails (with server.processes, each worker \
                     is then replaced and starts with an empty memory cache); make it readable by that user",
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
/// this thread alone (glibc's wrappers would change every thread), and the
/// kernel drops the thread's file capabilities with a non-root
/// file-system uid, so what it opens is what the user could open. The
/// thread must end after its checks: it cannot be trusted as root again.
fn as_user_for_files(t: &Target) -> Result<(), String> {
    let fail = |call: &str| format!("{call}: {}", std::io::Error::last_os_error());
    // SAFETY: setgroups reads one gid from the pointer given, which lives
    // for the call; setfsgid and setfsuid take plain integers. Each acts
    // on the calling thread's credentials only.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 1, &t.gid as *const libc::gid_t) != 0 {
            return Err(fail("setgroups"));
        }
        // Both return the previous id whatever happens: a second call
        // tells whether the first took.
        libc::syscall(libc::SYS_setfsgid, t.gid);
        if libc::syscall(libc::SYS_setfsgid, t.gid) != libc::c_long::from(t.gid) {
            return Err(fail("setfsgid"));
        }
        libc::syscall(libc::SYS_setfsuid, t.uid);
        if libc::syscall(libc::SYS_setfsuid, t.uid) != libc::c_long::from(t.uid) {
            return Err(fail("setfsuid"));
        }
    }
    Ok(())
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

    /// Run as root (CI's user), else skipped: only root can change its
    /// file-system uid.
    #[test]
    fn a_socket_created_as_another_owner_is_theirs_and_the_thread_is_root_again_after() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: not root");
            return;
        }
        let nobody = 65534;
        let socket = creating_as(Some(nobody), || std::net::UdpSocket::bind("127.0.0.1:0"))
            .expect("setfsuid")
            .expect("socket");
        // A socket's inode carries its owner.
        let owner = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&socket)))
            .expect("stat the socket")
            .uid();
        assert_eq!(owner, nobody);
        // What the thread creates next is root's again.
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("after");
        std::fs::write(&file, "x").expect("write");
        assert_eq!(std::fs::metadata(&file).expect("stat").uid(), 0);
        let own = creating_as(None, || std::net::UdpSocket::bind("127.0.0.1:0"))
            .expect("no change")
            .expect("socket");
        let owner = std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&own)))
            .expect("stat the socket")
            .uid();
        assert_eq!(owner, 0);
    }

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
