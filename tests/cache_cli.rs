//! `portico cache list|purge|gc|verify` on a cache directory populated
//! through the library: outputs, exit codes and the files left on disk.

use http::{HeaderMap, HeaderValue, StatusCode};
use portico::cache::disk::DiskStore;
use portico::cache::key::{CacheKey, ObjectId};
use portico::cache::object::StoredMeta;
use portico::config::{CacheConfig, GcMode, Size};
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_portico");

struct Cache {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Cache {
    /// An empty cache dir and a config file whose `[cache]` points at it.
    fn new(extra: &str) -> Cache {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("portico.toml");
        fs::write(
            &config,
            format!(
                "[cache]\ndir = \"{}\"\nlevels = [16, 256]\n{extra}\n",
                dir.path().join("cache").display()
            ),
        )
        .unwrap();
        Cache { dir, config }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    fn store(&self) -> DiskStore {
        let cfg = CacheConfig {
            dir: self.root(),
            disk: Size(1 << 30),
            gc: GcMode::Scheduled,
            ..CacheConfig::default()
        };
        DiskStore::start_offline(&cfg, &mut |_| {}).unwrap()
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["cache"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-c", self.config.to_str().unwrap()]);
        Command::new(BIN).args(&all).stdin(Stdio::null()).output().unwrap()
    }

    fn objects(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![self.root()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    if e.file_name() != "tmp" {
                        stack.push(e.path());
                    }
                } else {
                    out.push(e.path());
                }
            }
        }
        out
    }

    /// What the disk budget counts for the objects: each file's size
    /// rounded up to the directory's block size.
    fn bytes(&self) -> u64 {
        self.bytes_of(&self.objects())
    }

    /// What the disk budget counts for these files.
    fn bytes_of(&self, files: &[PathBuf]) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let block = fs::metadata(self.root()).unwrap().blksize().clamp(512, 1 << 20);
        files
            .iter()
            .map(|p| fs::metadata(p).unwrap().len().div_ceil(block) * block)
            .sum()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn meta(url: &str, variant: &[(&str, Option<&str>)], vary: bool) -> StoredMeta {
    let mut headers = HeaderMap::new();
    if vary {
        headers.insert("vary", HeaderValue::from_static("accept-encoding"));
    }
    StoredMeta {
        key: url.to_string(),
        variant: variant
            .iter()
            .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
            .collect(),
        status: StatusCode::OK,
        headers,
        request_time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        response_time: UNIX_EPOCH + Duration::from_secs(1_700_000_001),
        origin: None,
        derived: Default::default(),
    }
}

/// Stores `body` under the URL's (variant) id; returns the id.
fn put(store: &DiskStore, url: &str, variant: &[(&str, Option<&str>)], body: &[u8], expires: u64) -> ObjectId {
    let m = meta(url, variant, !variant.is_empty());
    let id = CacheKey::from_url(url, false).unwrap().variant_id(&m.variant);
    let mut w = store.writer_blocking(id, &m).unwrap();
    w.write_blocking(body).unwrap();
    w.commit_blocking(expires).unwrap();
    id
}

fn put_plain(store: &DiskStore, url: &str, body: &[u8]) -> ObjectId {
    put(store, url, &[], body, 0)
}

#[test]
fn list_prints_sorted_objects_and_filters_by_prefix() {
    let c = Cache::new("");
    let store = c.store();
    put_plain(&store, "http://b.example/z", b"zz");
    put_plain(&store, "http://a.example/", b"hello");
    put(
        &store,
        "http://b.example/v",
        &[("accept-encoding", Some("gzip"))],
        b"gz",
        1_800_000_000,
    );
    put(&store, "http://b.example/v", &[("accept-encoding", None)], b"plain", 0);
    drop(store);
    let out = c.run(&["list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        vec![
            "http://a.example/ 200 5 2023-11-14T22:13:21Z -",
            "http://b.example/v 200 5 2023-11-14T22:13:21Z - vary:accept-encoding=(absent)",
            "http://b.example/v 200 2 2023-11-14T22:13:21Z 2027-01-15T08:00:00Z vary:accept-encoding=gzip",
            "http://b.example/z 200 2 2023-11-14T22:13:21Z -",
        ],
        "{text}"
    );
    let out = c.run(&["list", "--prefix", "http://b.example/v"]);
    assert_eq!(stdout(&out).lines().count(), 2);
    let out = c.run(&["list", "--prefix", "http://nothing/"]);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "");
}

/// Runs `portico cache ARGS` with a deadline: a tool that blocks on a FIFO
/// fails the test instead of hanging it.
fn run_within(c: &Cache, args: &[&str]) -> Output {
    let mut all = vec!["cache"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-c", c.config.to_str().unwrap()]);
    let mut child = Command::new(BIN)
        .args(&all)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("portico cache {args:?} hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// What another user may put in a cache directory it can write to does
/// not hang the tools, lose files that are not Portico's, or make the tmp
/// cleaning (run as root from cron by `portico cache gc`) remove files
/// elsewhere: a FIFO named as an object is skipped (it blocked `list`,
/// `verify` and `purge` for ever), a file in `tmp/` not named as Portico
/// names its own is kept (every such file was removed), and a `tmp` that is
/// a symbolic link is refused (the cleaning followed it).
#[test]
fn hostile_entries_in_the_cache_directory_neither_hang_the_tools_nor_cost_other_files() {
    let c = Cache::new("");
    let store = c.store();
    put_plain(&store, "http://a.example/", b"hello");
    drop(store);
    let object = c.objects().pop().unwrap();
    let mut name = object.file_name().unwrap().to_str().unwrap().to_string();
    let last = if name.ends_with('0') { "1" } else { "0" };
    name.replace_range(name.len() - 1.., last);
    let fifo = object.with_file_name(name);
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    fs::write(c.root().join("tmp").join("notes.txt"), "mine").unwrap();
    for args in [
        &["list"][..],
        &["verify"],
        &["purge", "--prefix", "http://b.example/"],
        &["gc"],
    ] {
        let out = run_within(&c, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(stdout(&run_within(&c, &["list"])).lines().count(), 1);
    assert_eq!(fs::read_to_string(c.root().join("tmp/notes.txt")).unwrap(), "mine");

    let outside = c.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("precious"), "p").unwrap();
    fs::remove_dir_all(c.root().join("tmp")).unwrap();
    std::os::unix::fs::symlink(&outside, c.root().join("tmp")).unwrap();
    let out = run_within(&c, &["gc"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(outside.join("precious")).unwrap(), "p");
}

#[test]
fn purge_removes_a_url_with_its_variants_or_a_prefix() {
    let c = Cache::new("");
    let store = c.store();
    let plain = put_plain(&store, "http://h/plain", b"1");
    put(&store, "http://h/v", &[("accept-encoding", Some("gzip"))], b"2", 0);
    put(&store, "http://h/v", &[("accept-encoding", Some("br"))], b"3", 0);
    put(&store, "http://h/v", &[("accept-encoding", None)], b"4", 0);
    let other = put_plain(&store, "http://h/vv", b"5");
    for i in 0..5 {
        put_plain(&store, &format!("http://img.example/a/{i}"), b"6");
        put_plain(&store, &format!("http://img.example/b/{i}"), b"7");
    }
    let root = c.root();
    let path = |id: ObjectId| portico::cache::disk::Layout::new(&root, [16, 256]).path_of(id);
    drop(store);
    assert_eq!(c.objects().len(), 15);

    // The plain object: found by id (URL normalised like a key).
    let out = c.run(&["purge", "HTTP://H:80/plain"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("purged 1 objects"), "{}", stdout(&out));
    assert!(!path(plain).exists());
    // All three variants, and not the URL that merely starts the same.
    let out = c.run(&["purge", "http://h/v"]);
    assert!(stdout(&out).contains("purged 3 objects"), "{}", stdout(&out));
    assert!(path(other).exists());
    assert_eq!(c.objects().len(), 11);
    // Nothing stored: 0, still success.
    let out = c.run(&["purge", "http://h/v"]);
    assert!(out.status.success());
    assert!(stdout(&out).contains("purged 0 objects"));
    // By prefix: exactly the matching ones.
    let out = c.run(&["purge", "--prefix", "http://img.example/a/"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("purged 5 objects"), "{}", stdout(&out));
    let left = stdout(&c.run(&["list"]));
    assert!(!left.contains("img.example/a/"), "{left}");
    assert_eq!(left.matches("img.example/b/").count(), 5, "{left}");
    assert_eq!(c.objects().len(), 6);
    // Bad usage.
    let out = c.run(&["purge"]);
    assert!(!out.status.success());
    let out = c.run(&["purge", "not a url"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not an absolute URL"), "{}", stderr(&out));
}

#[test]
fn gc_brings_usage_under_the_low_watermark() {
    let c = Cache::new("disk = \"200KiB\"\nwatermarks = [50, 80]");
    let store = c.store();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let mut expired = vec![];
    for i in 0..3 {
        expired.push(put(&store, &format!("http://h/old/{i}"), &[], &[1; 10_000], now - 60));
    }
    for i in 0..27 {
        put(&store, &format!("http://h/new/{i:02}"), &[], &[1; 10_000], now + 3600);
    }
    let root = c.root();
    let path = |id: ObjectId| portico::cache::disk::Layout::new(&root, [16, 256]).path_of(id);
    drop(store);
    let before = c.bytes();
    assert!(before > 200 << 10);
    let out = c.run(&["gc"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let low = (200 << 10) / 2;
    assert!(c.bytes() <= low, "{} > {low}\n{text}", c.bytes());
    // One object more than needed would take a whole object's blocks.
    let one = c.bytes() / c.objects().len() as u64;
    assert!(c.bytes() > low - one, "evicts no more than needed");
    for id in &expired {
        assert!(!path(*id).exists());
    }
    // The expired ones are removed first, and every removal is printed.
    let removed: Vec<&str> = text.lines().filter(|l| l.starts_with("removed ")).collect();
    assert!(removed.len() > 3, "{text}");
    for line in &removed[..3] {
        assert!(
            line.starts_with("removed http://h/old/") && line.ends_with(" (expired)"),
            "{text}"
        );
    }
    assert_eq!(removed.len(), 30 - c.objects().len(), "{text}");
    assert!(
        text.contains(&format!("used {before} -> {} bytes", c.bytes())),
        "{text}"
    );
    // At the watermark already: nothing to do.
    let out = c.run(&["gc"]);
    assert!(stdout(&out).contains("removed 0 objects"), "{}", stdout(&out));
}

#[test]
fn verify_reports_and_removes_corrupt_objects() {
    let c = Cache::new("");
    let store = c.store();
    let ids: Vec<ObjectId> = (0..6)
        .map(|i| put_plain(&store, &format!("http://h/{i}"), &[7; 100_000]))
        .collect();
    let root = c.root();
    let path = |id: ObjectId| portico::cache::disk::Layout::new(&root, [16, 256]).path_of(id);
    drop(store);
    let out = c.run(&["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("verify: 6 objects (600000 body bytes) checked, 0 corrupt"),
        "{}",
        stdout(&out)
    );
    // A flipped body byte and a truncated file.
    let f = File::options().write(true).open(path(ids[1])).unwrap();
    f.write_all_at(b"\x00", 5_000).unwrap();
    let f = File::options().write(true).open(path(ids[4])).unwrap();
    f.set_len(50_000).unwrap();
    let out = c.run(&["verify"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "corrupt {}: corrupt: checksum mismatch (removed)",
            path(ids[1]).display()
        )),
        "{text}"
    );
    assert!(text.contains(&format!("corrupt {}:", path(ids[4]).display())), "{text}");
    assert!(text.contains("6 objects"), "{text}");
    assert!(text.contains("2 corrupt"), "{text}");
    assert!(!path(ids[1]).exists() && !path(ids[4]).exists());
    assert_eq!(c.objects().len(), 4);
    let out = c.run(&["verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // --help says what the exit status means.
    let help = stdout(&c.run(&["verify", "--help"]));
    assert!(
        help.contains("Exit status: 0 if no object was corrupt, 1 if any was"),
        "{help}"
    );
}

#[test]
fn missing_cache_directory_is_an_error() {
    let c = Cache::new("");
    for cmd in [&["list"][..], &["verify"], &["gc"], &["purge", "--prefix", "http://"]] {
        let out = c.run(cmd);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        assert!(
            stderr(&out).contains("no cache directory at"),
            "{cmd:?}: {}",
            stderr(&out)
        );
        assert!(!Path::new(&c.root()).exists(), "{cmd:?} created the directory");
    }
}

/// `cache.replacement` decides which live objects a collection removes:
/// `gdsf`, `balanced` and `frequency` the large unused one first (it frees
/// the most room for the least value per byte; `portico cache gc` has
/// counted no lookups, so `frequency` ranks by size alone), `lru` and
/// `lfuda` the least recently used small ones (objects just read back from
/// disk have no hits yet).
#[test]
fn gc_removes_live_objects_in_the_replacement_policys_order() {
    for (policy, big_goes) in [
        ("gdsf", true),
        ("balanced", true),
        ("frequency", true),
        ("lru", false),
        ("lfuda", false),
    ] {
        let c = Cache::new("");
        let store = c.store();
        let root = c.root();
        let path = |id: ObjectId| portico::cache::disk::Layout::new(&root, [16, 256]).path_of(id);
        let now = SystemTime::now();
        let age = |id: ObjectId, secs: u64| {
            let t = now - Duration::from_secs(secs);
            File::options()
                .write(true)
                .open(path(id))
                .unwrap()
                .set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
                .unwrap();
        };
        let small: Vec<ObjectId> = (0..40)
            .map(|i| {
                let id = put_plain(&store, &format!("http://h/small/{i:02}"), &[1; 3_000]);
                age(id, 1000 - i);
                id
            })
            .collect();
        // The most recently used object of all.
        let big = put_plain(&store, "http://h/big", &[2; 150_000]);
        drop(store);
        let total = c.bytes();
        let big_bytes = total - c.bytes_of(&small.iter().map(|&id| path(id)).collect::<Vec<_>>());
        assert!(
            big_bytes * 2 > total * 9 / 10 && big_bytes < total,
            "{big_bytes} of {total}"
        );
        // High watermark just under the total, low at 62% of it: a third
        // of the bytes must go, less than the big object's share.
        let disk = total * 100 / 81;
        fs::write(
            &c.config,
            format!(
                "[cache]\ndir = \"{}\"\nlevels = [16, 256]\ndisk = \"{disk}B\"\nwatermarks = [50, 80]\nreplacement = \"{policy}\"\n",
                root.display()
            ),
        )
        .unwrap();
        let out = c.run(&["gc"]);
        assert!(out.status.success(), "{policy}: {}", stderr(&out));
        let text = stdout(&out);
        assert_eq!(!path(big).exists(), big_goes, "{policy}: {text}");
        let kept = small.iter().filter(|&&id| path(id).exists()).count();
        if big_goes {
            assert_eq!(kept, 40, "{policy}: only the big one goes\n{text}");
        } else {
            assert!((1..40).contains(&kept), "{policy}: {kept} small ones kept\n{text}");
            // Least recently used first: the ones kept are the newest.
            let newest = &small[40 - kept..];
            assert!(newest.iter().all(|&id| path(id).exists()), "{policy}: {text}");
        }
    }
}
