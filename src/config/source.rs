//! Where `portico run` reads its configuration: the file named by `-c`, or,
//! in a worker process, what its supervisor validated.
//!
//! With `server.processes = N > 1` every worker is a fresh process (exec,
//! not fork) and reads its configuration itself. Were that the file, a
//! worker restarted after the file was edited but not reloaded would run
//! the edit (or fail to start on an invalid one, and be restarted forever)
//! while the others ran the version in force, and a SIGHUP would let each
//! worker read whatever the file held when it got there, not what the
//! supervisor checked. So the supervisor hands its workers the text it
//! validated, as nginx's workers get the master's configuration by being
//! forked from it:
//!
//! - At start, in a sealed memory file the worker inherits ([`ENV_FD`]),
//!   with the text the supervisor itself started on ([`ENV_START_FD`]):
//!   a worker restarted after a reload keeps the restart-only settings the
//!   others kept (`reload::keep_restart_only`). A worker starts as root
//!   when the supervisor switches it to `server.user`, so it reads nothing
//!   that user could have written.
//! - At a reload, in a file in the supervisor's private directory
//!   ([`ENV_COPY`]; the directory is `server.user`'s, as the workers
//!   running as that user read it), written before the SIGHUP is
//!   forwarded. A worker reloads after it has switched user, so that file
//!   gives it nothing it could not already do.
//!
//! Errors still name the file the text came from.

use super::{Config, ConfigError, parse_str};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Names, in a worker, the inherited memory file holding the text its
/// supervisor validated last.
pub const ENV_FD: &str = "PORTICO_CONFIG_FD";

/// Names, in a worker, the inherited memory file holding the text its
/// supervisor started on (absent when that is the text validated last).
pub const ENV_START_FD: &str = "PORTICO_CONFIG_START_FD";

/// Names, in a worker, the supervisor's copy of the text it validated
/// last, which the worker reloads on SIGHUP.
pub const ENV_COPY: &str = "PORTICO_CONFIG_COPY";

/// The copy's name in the supervisor's private directory.
const COPY_NAME: &str = "config";

/// The seals a memory file of config text carries: nobody can change it.
const SEALS: libc::c_int = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Reads and checks the configuration `portico run` starts on: in a worker
/// (`worker`) started with its supervisor's memory files, the text they
/// hold, with the restart-only settings the supervisor started on; else
/// the file at `path`. Returns it with its text. Errors name `path`; one
/// about a memory file names the variable that gave it.
pub fn read_at_start(path: &Path, worker: bool) -> Result<(Config, String), ConfigError> {
    let file = path.display().to_string();
    let Some(text) = worker.then(|| inherited(ENV_FD, &file)).flatten() else {
        let text = super::load::read_text(path)?;
        return Ok((parse_str(&text, &file)?, text));
    };
    let text = text?;
    let mut config = parse_str(&text, &file)?;
    if let Some(start) = inherited(ENV_START_FD, &file) {
        let start = parse_str(&start?, &file)?;
        crate::reload::keep_restart_only(&start, &mut config);
    }
    Ok((config, text))
}

/// Reads and checks the configuration a SIGHUP reloads: in a worker
/// (`worker`) given a copy by its supervisor, that copy; else the file at
/// `path`. Returns it with its text. Errors name `path`; one about the
/// copy itself names the copy.
pub fn read_for_reload(path: &Path, worker: bool) -> Result<(Config, String), ConfigError> {
    let file = path.display().to_string();
    let copy = worker
        .then(|| std::env::var_os(ENV_COPY))
        .flatten()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let text = match &copy {
        Some(copy) => std::fs::read_to_string(copy).map_err(|e| {
            unreadable(
                &file,
                format!(
                    "the supervisor's copy of it, {}: {}",
                    copy.display(),
                    crate::util::io_cause(&e)
                ),
            )
        })?,
        None => super::load::read_text(path)?,
    };
    Ok((parse_str(&text, &file)?, text))
}

fn unreadable(file: &str, what: String) -> ConfigError {
    ConfigError {
        file: file.to_string(),
        line: None,
        key: None,
        message: format!("cannot read {what}"),
    }
}

/// The text of the memory file named by `var`, closed once read: None when
/// the variable is not set; an error when it names no sealed memory file.
fn inherited(var: &str, file: &str) -> Option<Result<String, ConfigError>> {
    let number = std::env::var(var).ok()?;
    let fd: std::os::fd::RawFd = match number.parse() {
        Ok(fd) if fd > 2 => fd,
        _ => {
            return Some(Err(unreadable(
                file,
                format!("it from {var}={number:?}: not a file descriptor"),
            )));
        }
    };
    // Only a memory file nobody can change is taken (and closed): what
    // else that number may be is left alone.
    // SAFETY: fcntl with F_GET_SEALS takes no pointer; any number is safe.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 || seals & SEALS != SEALS {
        return Some(Err(unreadable(
            file,
            format!("it from {var}={fd}: not the supervisor's sealed memory file"),
        )));
    }
    // SAFETY: the descriptor was inherited for this process to read once
    // and is owned by nothing else here: it is closed once read.
    let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    Some(read_whole(&f).map_err(|e| unreadable(file, format!("it from {var}: {}", crate::util::io_cause(&e)))))
}

/// The whole of `f`, read at offsets: the file's position is shared with
/// the supervisor and every worker that inherited it, so it is never moved.
fn read_whole(f: &File) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let len = usize::try_from(f.metadata()?.len()).map_err(std::io::Error::other)?;
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, 0)?;
    String::from_utf8(buf).map_err(|_| std::io::Error::other("the text is not UTF-8"))
}

/// In the supervisor: a memory file holding `text`, sealed (nobody, the
/// supervisor included, can change it), inherited by the workers it starts.
pub fn sealed(text: &str) -> std::io::Result<OwnedFd> {
    let mut f = crate::util::memory_file(c"portico-config")?;
    f.write_all(text.as_bytes())?;
    // SAFETY: fcntl with F_ADD_SEALS takes an integer, no pointer.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f.into())
}

/// In the supervisor: writes `text` as the workers' copy for reloads in
/// `dir`, owned by `owner` (uid, gid) when given (the workers switch to
/// `server.user` before they reload). The copy is replaced whole (written
/// aside, then renamed), so a worker reading it meanwhile reads the old
/// text or the new, never a mix. Returns its path.
pub fn hand_over(dir: &Path, text: &str, owner: Option<(u32, u32)>) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(COPY_NAME);
    let aside = dir.join(format!("{COPY_NAME}.new"));
    // Left by a supervisor that failed half-way: start again.
    match std::fs::remove_file(&aside) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&aside)?;
    f.write_all(text.as_bytes())?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
    }
    drop(f);
    std::fs::rename(&aside, &path)?;
    Ok(path)
}

/// In a worker whose supervisor is gone: removes the copy from `dir`, so
/// that the last worker out can remove the directory (`stats::workers::leave`).
pub fn remove_copy(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(COPY_NAME));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_handed_over_is_private_and_replaces_the_last_one_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let first = hand_over(dir.path(), "[server]\nworkers = 1\n", None).expect("hand over");
        let second = hand_over(dir.path(), "[server]\nworkers = 2\n", None).expect("hand over again");
        assert_eq!(first, second);
        assert_eq!(
            std::fs::read_to_string(&second).expect("read"),
            "[server]\nworkers = 2\n"
        );
        let mode = std::fs::metadata(&second).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["config"], "nothing left aside");
        remove_copy(dir.path());
        assert!(std::fs::read_dir(dir.path()).expect("list").next().is_none());
    }

    #[test]
    fn a_sealed_memory_file_cannot_be_changed_and_is_read_whole_wherever_its_position() {
        use std::io::{Read, Seek};
        let fd = sealed("[server]\nworkers = 3\n").expect("memory file");
        let mut f = File::from(fd);
        assert!(f.write_all(b"x").is_err(), "sealed against writes");
        assert!(f.set_len(0).is_err(), "and against shrinking");
        // Another holder moved the shared position: still read whole.
        f.seek(std::io::SeekFrom::Start(5)).expect("seek");
        let mut rest = String::new();
        f.read_to_string(&mut rest).expect("read");
        assert_eq!(rest, "er]\nworkers = 3\n");
        assert_eq!(read_whole(&f).expect("read whole"), "[server]\nworkers = 3\n");
    }

    #[test]
    fn outside_a_worker_the_file_is_read_whatever_the_environment_says() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("portico.toml");
        std::fs::write(&file, "[server]\nworkers = 3\n").expect("write");
        // No variable set (a worker's environment is its supervisor's
        // doing, never this test's): a worker reads the file too.
        for worker in [true, false] {
            let (c, text) = read_at_start(&file, worker).expect("read");
            assert_eq!((c.server.workers, text.as_str()), (3, "[server]\nworkers = 3\n"));
            let (c, _) = read_for_reload(&file, worker).expect("read");
            assert_eq!(c.server.workers, 3);
        }
    }
}
