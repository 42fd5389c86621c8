//! Where `portico run` reads its configuration: the file named by `-c`, or,
//! in a worker process, the copy of it its supervisor last validated.
//!
//! With `server.processes = N > 1` every worker reads the configuration
//! itself (it is a fresh process, not a fork). Were that the file, a worker
//! restarted after the file was edited but not reloaded would run the edit
//! (or fail to start on an invalid one, and be restarted forever) while the
//! others ran the version in force, and a SIGHUP would let each worker
//! read whatever the file held when it got there, not what the supervisor
//! checked. So the supervisor writes the text it validated into its
//! private directory (0700, `stats::workers::make_dir`) before it starts
//! each worker and before it forwards a SIGHUP, and the workers read that
//! (named by [`ENV_COPY`]); errors still name the file it came from. This
//! is what nginx's workers get by being forked from the master.

use super::{Config, ConfigError, parse_str};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable that names, in a worker, the supervisor's copy
/// of the configuration.
pub const ENV_COPY: &str = "PORTICO_CONFIG_COPY";

/// The copy's name in the supervisor's private directory.
const COPY_NAME: &str = "config";

/// Reads and checks the configuration a `portico run` process runs on: in
/// a worker (`worker`) started with a copy from its supervisor, that copy;
/// else the file at `path`. Returns it with its text. Errors name `path`
/// (the copy holds its text); one about the copy itself names the copy.
pub fn read(path: &Path, worker: bool) -> Result<(Config, String), ConfigError> {
    let file = path.display().to_string();
    let copy = worker
        .then(|| std::env::var_os(ENV_COPY))
        .flatten()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let text = match &copy {
        Some(copy) => std::fs::read_to_string(copy).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            key: None,
            message: format!(
                "cannot read the supervisor's copy of it, {}: {}",
                copy.display(),
                crate::util::io_cause(&e)
            ),
        })?,
        None => super::load::read_text(path)?,
    };
    let config = parse_str(&text, &file)?;
    Ok((config, text))
}

/// In the supervisor: writes `text` as the workers' copy in `dir`, owned
/// by `owner` (uid, gid) when given (the workers switch to `server.user`
/// and read it again at a reload). The copy is replaced whole (written
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
    fn outside_a_worker_the_file_is_read_whatever_the_environment_says() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("portico.toml");
        std::fs::write(&file, "[server]\nworkers = 3\n").expect("write");
        // No copy named (a worker's environment is set by its supervisor,
        // never this test's): a worker reads the file too.
        let (c, text) = read(&file, true).expect("read");
        assert_eq!((c.server.workers, text.as_str()), (3, "[server]\nworkers = 3\n"));
        let (c, _) = read(&file, false).expect("read");
        assert_eq!(c.server.workers, 3);
    }
}
