//! Client authentication: RFC 7617 Basic credentials checked against an
//! Apache htpasswd file (groups from an AuthGroupFile), in front of the
//! user cache (the Sun proxy's ACL user cache).
//!
//! The path of a request with credentials: the user cache first (a hit
//! costs one keyed hash of the credentials and a map lookup); on a miss,
//! the file's hash is verified on the blocking pool (bcrypt costs
//! milliseconds of CPU, which must not stall the runtime's threads).
//! The file is watched on use, at most once a second, by a background
//! check: a changed file is reloaded and empties the cache, so a changed
//! or removed password is never accepted from it; a verification that a
//! reload overtakes (it read the table the reload replaced) is not cached
//! but made again against the new table. A file that disappears
//! or becomes unreadable fails closed: users not in the cache get a 503
//! naming the reason, logged once per episode; cached users go on until
//! their entry is `max_age` old.
//!
//! With `[auth.ldap]`, an LDAP directory (ldap.rs) takes the file's place
//! behind the same cache: a miss binds to the directory (async, on the
//! runtime: it waits on the network, not the CPU). A directory that fails
//! (down, slow, refusing the service account) starts an episode, logged
//! once: users not in the cache get 503 at once, and one request a second
//! asks the directory again; the first answer ends the episode.

pub mod basic;
pub mod htpasswd;
pub mod ldap;

use crate::config::AuthConfig;
use crate::stats::Histogram;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// An authenticated user, as the access log and the access-control step see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name from the credentials.
    pub name: String,
    /// The user's groups from the groups file (at most `max_groups_per_user`).
    pub groups: Vec<String>,
}

impl User {
    /// The user as the `[[acl]]` entries see it (`user`, `group`,
    /// `authenticated` matchers).
    pub fn identity(&self) -> crate::acl::Identity<'_> {
        crate::acl::Identity {
            name: &self.name,
            groups: &self.groups,
        }
    }
}

/// Why credentials were not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Wrong password or unknown user: challenge again (407 / 401).
    Invalid,
    /// The back-end cannot answer (file missing, unreadable, verification
    /// queue full): 503 with this reason, never a challenge, so a browser
    /// does not loop asking for a password that cannot help.
    Unavailable(String),
}

/// The user cache's and the back-end's counters.
#[derive(Default)]
pub struct AuthStats {
    /// Requests whose credentials were found in the cache, still valid.
    pub hits: AtomicU64,
    /// Requests whose credentials had to be verified against the file.
    pub misses: AtomicU64,
    /// Users dropped from the cache to make room (`max_users`).
    pub evictions: AtomicU64,
    /// Verifications that failed (wrong password, unknown user).
    pub failures: AtomicU64,
    /// Failed logins answered from the failed-login cache (`failed_ttl`).
    pub failed_hits: AtomicU64,
    /// Requests refused 503 because the file could not be used.
    pub unavailable: AtomicU64,
    /// Times the file was (re)loaded after a change or SIGHUP.
    pub reloads: AtomicU64,
    /// Time to verify one password against the file (the back-end's latency).
    pub verify_time: Histogram,
}

/// What identifies one version of a file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

fn file_id(path: &std::path::Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(FileId {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: m.modified().ok(),
    })
}

/// The users and groups of one load of the files.
#[derive(Debug, Default)]
struct Table {
    users: HashMap<String, htpasswd::Hash>,
    groups: HashMap<String, Vec<String>>,
}

struct Cached {
    digest: [u8; 32],
    user: Arc<User>,
    verified: Instant,
}

#[derive(Default)]
struct Cache {
    users: HashMap<String, Cached>,
    /// Keyed hashes of credentials that failed, and when.
    failed: HashMap<[u8; 32], Instant>,
}

/// What a connection remembers of the last credentials it presented that
/// were accepted, so that the next request on it carrying the very same
/// field skips decoding, the keyed hash and the shared cache's lock
/// ([`Authenticator::remembered`]). It holds no password: only a keyed
/// hash of the field, and the user.
#[derive(Clone)]
pub struct Memo {
    /// Keyed hash (SipHash-1-3, a key random per authenticator) of the
    /// credentials field's bytes.
    tag: u64,
    user: Arc<User>,
    /// When the user cache's entry was verified: the memo lives no longer
    /// than the entry it was taken from.
    verified: Instant,
    /// The authenticator's generation then: a reload (or another
    /// authenticator after a SIGHUP) makes the memo worthless.
    generation: u64,
}

/// Generations of the authenticators' user caches, unique in the process.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The file back-end and the user cache. One per `[auth]` configuration;
/// a SIGHUP with the same `[auth]` keeps it (and its cache) and re-reads the files.
pub struct Authenticator {
    cfg: AuthConfig,
    table: ArcSwap<Table>,
    /// The files as last loaded.
    ids: Mutex<(Option<FileId>, Option<FileId>)>,
    /// Why the back-end is failing now (a failure episode), if it is.
    broken: Mutex<Option<String>>,
    /// Milliseconds since `epoch` after which the next file check may run.
    next_check_ms: AtomicU64,
    checking: AtomicBool,
    epoch: Instant,
    cache: Mutex<Cache>,
    /// Key of the credential hashes: random per process, so the cache's
    /// contents say nothing about passwords even to someone who reads memory dumps
    /// across restarts, and cannot be precomputed.
    key: ring::hmac::Key,
    /// Counters for the statistics views.
    pub stats: AuthStats,
    /// The LDAP directory, when `[auth.ldap]` replaces the file.
    directory: Option<ldap::Directory>,
    /// During a directory failure episode: milliseconds since `epoch`
    /// before which requests get 503 without asking the directory.
    next_probe_ms: AtomicU64,
    /// Why the last SIGHUP could not re-read `bind_password_file`.
    secret_error: Mutex<Option<String>>,
    /// The user cache's generation: taken anew whenever the cache is
    /// emptied, so that connections' [`Memo`]s of it stop matching.
    generation: AtomicU64,
    /// The key of the [`Memo`] tags.
    tagger: std::hash::RandomState,
}

/// How often the files may be looked at on use.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Verifications of one request's credentials, each overtaken by a reload
/// of the files, before it is refused (503) rather than verified again.
const MAX_VERIFY_ATTEMPTS: u32 = 3;

impl Authenticator {
    /// Loads the files named by `cfg` (which must be enabled), or, with
    /// `[auth.ldap]`, the directory's CA and password files (the directory
    /// itself is first asked at the first login). `Err` names the file
    /// that cannot be read: a start-up error. Refused lines (weak
    /// formats) are logged as warnings naming file, line and user.
    pub fn new(cfg: &AuthConfig) -> Result<Authenticator, String> {
        let rng = ring::rand::SystemRandom::new();
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .map_err(|_| "auth: no randomness for the user cache's key".to_string())?;
        let a = Authenticator {
            cfg: cfg.clone(),
            table: ArcSwap::from_pointee(Table::default()),
            ids: Mutex::new((None, None)),
            broken: Mutex::new(None),
            next_check_ms: AtomicU64::new(0),
            checking: AtomicBool::new(false),
            epoch: Instant::now(),
            cache: Mutex::new(Cache::default()),
            key,
            stats: AuthStats::default(),
            directory: None,
            next_probe_ms: AtomicU64::new(0),
            secret_error: Mutex::new(None),
            generation: AtomicU64::new(GENERATION.fetch_add(1, Relaxed)),
            tagger: std::hash::RandomState::new(),
        };
        if cfg.ldap.enabled() {
            let d = ldap::Directory::new(&cfg.ldap)?;
            tracing::info!("auth: users from the directory at {}", cfg.ldap.url);
            return Ok(Authenticator {
                directory: Some(d),
                ..a
            });
        }
        a.load()?;
        Ok(a)
    }

    /// The configuration this was built from.
    pub fn config(&self) -> &AuthConfig {
        &self.cfg
    }

    /// Reads both files now and swaps them in, emptying the cache; `Err`
    /// (nothing changed) when one cannot be read.
    fn load(&self) -> Result<(), String> {
        let hid = file_id(&self.cfg.htpasswd)
            .map_err(|e| format!("htpasswd file {}: cannot read: {e}", self.cfg.htpasswd.display()))?;
        let users = htpasswd::read_users(&self.cfg.htpasswd)?;
        for r in &users.refused {
            tracing::warn!("auth: {r}");
        }
        let (gid, groups) = if self.cfg.groups.as_os_str().is_empty() {
            (None, HashMap::new())
        } else {
            let gid = file_id(&self.cfg.groups)
                .map_err(|e| format!("groups file {}: cannot read: {e}", self.cfg.groups.display()))?;
            (Some(gid), htpasswd::read_groups(&self.cfg.groups)?)
        };
        tracing::info!(
            "auth: {} users from {}{}",
            users.users.len(),
            self.cfg.htpasswd.display(),
            if self.cfg.groups.as_os_str().is_empty() {
                String::new()
            } else {
                format!(", groups from {}", self.cfg.groups.display())
            }
        );
        self.table.store(Arc::new(Table {
            users: users.users,
            groups,
        }));
        // A changed file may change any password or membership: nothing
        // verified against the old one is trusted any more.
        if let Ok(mut c) = self.cache.lock() {
            *c = Cache::default();
            self.generation.store(GENERATION.fetch_add(1, Relaxed), Relaxed);
        }
        if let Ok(mut ids) = self.ids.lock() {
            *ids = (Some(hid), gid);
        }
        self.stats.reloads.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Re-reads the files if they changed since the last load (or always,
    /// with `force`: SIGHUP). Blocking file I/O: run off the runtime.
    /// Starts or ends a failure episode, logging each once.
    pub fn check_files(&self, force: bool) {
        if let Some(d) = &self.directory {
            // The directory has no file to watch; SIGHUP re-reads the
            // service password file (a rotated secret). One that cannot
            // be read keeps the old secret and refuses the reload
            // (`reload_error`): a directory that works is not cut off by
            // a typo in a file name.
            if force && let Ok(mut e) = self.secret_error.lock() {
                *e = d.reload_secret().err();
                if let Some(why) = e.as_deref() {
                    tracing::error!("auth: {why}; the previous service password stays in use");
                }
            }
            return;
        }
        let current = (
            file_id(&self.cfg.htpasswd),
            (!self.cfg.groups.as_os_str().is_empty()).then(|| file_id(&self.cfg.groups)),
        );
        let changed = match (&current, self.ids.lock()) {
            ((Ok(h), g), Ok(ids)) => {
                let g = g.as_ref().map(|r| r.as_ref().ok().copied());
                force || ids.0 != Some(*h) || g.is_some_and(|g| g != ids.1) || g == Some(None)
            }
            _ => true,
        };
        let broken_now = self.broken.lock().map(|b| b.is_some()).unwrap_or(false);
        if !changed && !broken_now {
            return;
        }
        match self.load() {
            Ok(()) => {
                if let Ok(mut b) = self.broken.lock()
                    && let Some(why) = b.take()
                {
                    tracing::warn!("auth: the user file is readable again (was: {why}); authentication resumed");
                }
            }
            Err(why) => {
                if let Ok(mut b) = self.broken.lock()
                    && b.as_deref() != Some(why.as_str())
                {
                    // Once per episode: every request until it ends is
                    // answered 503 without another line.
                    tracing::error!(
                        "auth: {why}; failing closed: users not in the user cache get 503 until it is fixed"
                    );
                    *b = Some(why);
                }
            }
        }
    }

    /// Starts a background file check if the last one is over a second
    /// old; the request that triggers it does not wait for it.
    fn maybe_check(self: &Arc<Self>) {
        if self.directory.is_some() {
            return;
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        if now < self.next_check_ms.load(Relaxed) || self.checking.swap(true, Relaxed) {
            return;
        }
        self.next_check_ms.store(now + CHECK_EVERY.as_millis() as u64, Relaxed);
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            me.check_files(false);
            me.checking.store(false, Relaxed);
        });
    }

    fn digest(&self, user: &str, password: &str) -> [u8; 32] {
        let mut ctx = ring::hmac::Context::with_key(&self.key);
        ctx.update(user.as_bytes());
        // The separator keeps ("ab", "c") and ("a", "bc") apart; a user
        // name has no ':' (RFC 7617), so no other split yields the same bytes.
        ctx.update(b":");
        ctx.update(password.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// The user of `field` (the raw credentials field) if it is the one
    /// `memo` remembers and still good: same authenticator and cache
    /// generation (no reload since), within `max_age` of the cache entry's
    /// verification. Counted as a user cache hit.
    pub fn remembered(self: &Arc<Self>, field: &http::HeaderValue, memo: &Option<Memo>) -> Option<Arc<User>> {
        let m = memo.as_ref()?;
        if m.generation != self.generation.load(Relaxed)
            || m.tag != self.tag(field)
            || m.verified.elapsed() >= self.cfg.max_age.get()
        {
            return None;
        }
        self.maybe_check();
        self.stats.hits.fetch_add(1, Relaxed);
        Some(m.user.clone())
    }

    /// A [`Memo`] of `field`, accepted as `user` verified at `verified`.
    fn memo(&self, field: &http::HeaderValue, user: &Arc<User>, verified: Instant, generation: u64) -> Memo {
        Memo {
            tag: self.tag(field),
            user: user.clone(),
            verified,
            generation,
        }
    }

    fn tag(&self, field: &http::HeaderValue) -> u64 {
        use std::hash::BuildHasher;
        self.tagger.hash_one(field.as_bytes())
    }

    /// [`Authenticator::authenticate`], then, when the credentials came
    /// from `field` and were accepted, their [`Memo`] in `memo`.
    pub async fn authenticate_remembering(
        self: &Arc<Self>,
        creds: basic::Basic,
        field: &http::HeaderValue,
        memo: &mut Option<Memo>,
        pool: &crate::blocking::BlockingPool,
    ) -> Result<Arc<User>, Refusal> {
        // The generation before the check: a reload during it leaves a
        // memo that no longer matches, never one that outlives the reload.
        let generation = self.generation.load(Relaxed);
        let (user, verified) = self.check(creds, pool).await?;
        *memo = Some(self.memo(field, &user, verified, generation));
        Ok(user)
    }

    /// Checks credentials: the user cache, then the file (verified on `pool`).
    pub async fn authenticate(
        self: &Arc<Self>,
        creds: basic::Basic,
        pool: &crate::blocking::BlockingPool,
    ) -> Result<Arc<User>, Refusal> {
        self.check(creds, pool).await.map(|(user, _)| user)
    }

    /// [`Authenticator::authenticate`], with when the accepted user's cache
    /// entry was verified.
    async fn check(
        self: &Arc<Self>,
        creds: basic::Basic,
        pool: &crate::blocking::BlockingPool,
    ) -> Result<(Arc<User>, Instant), Refusal> {
        self.maybe_check();
        let digest = self.digest(&creds.user, &creds.password);
        let now = Instant::now();
        let mut generation = self.generation.load(Relaxed);
        if let Ok(c) = self.cache.lock() {
            // Read under the lock `load` empties the cache and takes a new
            // generation under, after swapping the table in: the table the
            // verification below reads is this generation's or a newer one.
            generation = self.generation.load(Relaxed);
            if let Some(e) = c.users.get(&creds.user)
                && e.digest == digest
                && now.duration_since(e.verified) < self.cfg.max_age.get()
            {
                self.stats.hits.fetch_add(1, Relaxed);
                return Ok((e.user.clone(), e.verified));
            }
            if let Some(t) = c.failed.get(&digest)
                && now.duration_since(*t) < self.cfg.failed_ttl.get()
            {
                self.stats.failed_hits.fetch_add(1, Relaxed);
                return Err(Refusal::Invalid);
            }
        }
        self.stats.misses.fetch_add(1, Relaxed);
        let mut attempts = 0;
        let (ok, mut groups, directory_name, now, mut c) = loop {
            attempts += 1;
            // The directory may spell the name differently (ldap::canonical_name).
            let mut directory_name = None;
            let (ok, groups) = match &self.directory {
                Some(dir) => match self.ask_directory(dir, &creds.user, &creds.password).await? {
                    ldap::Verdict::Valid { name, groups } => {
                        directory_name = Some(name);
                        (true, groups)
                    }
                    ldap::Verdict::Invalid => (false, Vec::new()),
                },
                None => self.ask_file(&creds.user, creds.password.clone(), pool).await?,
            };
            let now = Instant::now();
            let Ok(c) = self.cache.lock() else {
                return Err(Refusal::Unavailable(
                    "authentication is unavailable: internal error".into(),
                ));
            };
            let current = self.generation.load(Relaxed);
            if current == generation {
                break (ok, groups, directory_name, now, c);
            }
            // The files were reloaded while this was verified (typically by
            // the check `maybe_check` started above): the answer came from
            // the table that reload replaced, and the cache it emptied would
            // keep it, a removed or changed password working for `max_age`.
            // Asked again, of the new table.
            drop(c);
            generation = current;
            if attempts >= MAX_VERIFY_ATTEMPTS {
                // Reloads keep overtaking the verification: no answer is
                // known to hold for the file as it is. Fail closed.
                if !ok {
                    return Err(Refusal::Invalid);
                }
                self.stats.unavailable.fetch_add(1, Relaxed);
                return Err(Refusal::Unavailable(
                    "authentication is unavailable: the user file keeps changing".into(),
                ));
            }
        };
        if !ok {
            self.stats.failures.fetch_add(1, Relaxed);
            let ttl = self.cfg.failed_ttl.get();
            if !ttl.is_zero() {
                if c.failed.len() >= self.cfg.max_users {
                    c.failed.retain(|_, t| now.duration_since(*t) < ttl);
                    if c.failed.len() >= self.cfg.max_users {
                        c.failed.clear();
                    }
                }
                c.failed.insert(digest, now);
            }
            return Err(Refusal::Invalid);
        }
        groups.truncate(self.cfg.max_groups_per_user);
        let user = Arc::new(User {
            name: directory_name.unwrap_or_else(|| creds.user.clone()),
            groups,
        });
        if !c.users.contains_key(&creds.user) && c.users.len() >= self.cfg.max_users {
            // The entry verified longest ago goes: a scan, but only on a
            // miss that already paid for a password verification.
            if let Some(oldest) = c.users.iter().min_by_key(|(_, e)| e.verified).map(|(k, _)| k.clone()) {
                c.users.remove(&oldest);
                self.stats.evictions.fetch_add(1, Relaxed);
            }
        }
        c.users.insert(
            creds.user,
            Cached {
                digest,
                user: user.clone(),
                verified: now,
            },
        );
        Ok((user, now))
    }

    /// The htpasswd file's answer: (password right, the user's groups).
    async fn ask_file(
        &self,
        user: &str,
        password: String,
        pool: &crate::blocking::BlockingPool,
    ) -> Result<(bool, Vec<String>), Refusal> {
        if let Some(why) = self.broken.lock().ok().and_then(|b| b.clone()) {
            self.stats.unavailable.fetch_add(1, Relaxed);
            return Err(Refusal::Unavailable(format!("authentication is unavailable: {why}")));
        }
        let table = self.table.load_full();
        let hash = table.users.get(user).cloned();
        let started = Instant::now();
        let ok = match hash {
            // An unknown user is refused without a verification, as
            // Apache's mod_authn_file does: cheaper under a flood of
            // made-up names, at the price of a timing difference that
            // tells an unknown name from a wrong password.
            None => false,
            // `try_run`: refused at once when the blocking pool's queue
            // (`server.blocking_queue`) is full, as a disk lookup is. A
            // verification costs a bcrypt run (a quarter of a second at
            // cost 12), and waiting for one however long the queue let a
            // client sending wrong passwords for a known user pile up
            // work the disk tier's jobs then waited behind.
            Some(h) => match pool.try_run(move || htpasswd::verify(&h, &password)).await {
                Ok(ok) => {
                    self.stats.verify_time.record(started.elapsed());
                    ok
                }
                Err(e) => {
                    self.stats.unavailable.fetch_add(1, Relaxed);
                    return Err(Refusal::Unavailable(format!(
                        "authentication is unavailable: cannot verify the password now ({e})"
                    )));
                }
            },
        };
        let groups = if ok {
            table.groups.get(user).cloned().unwrap_or_default()
        } else {
            Vec::new()
        };
        Ok((ok, groups))
    }

    /// The directory's answer, inside the failure-episode bookkeeping:
    /// during an episode, requests get 503 at once except one a second,
    /// which asks the directory again.
    async fn ask_directory(&self, dir: &ldap::Directory, user: &str, password: &str) -> Result<ldap::Verdict, Refusal> {
        if let Some(why) = self.failing() {
            let now = self.epoch.elapsed().as_millis() as u64;
            let next = self.next_probe_ms.load(Relaxed);
            if now < next
                || self
                    .next_probe_ms
                    .compare_exchange(next, now + ldap::RETRY_EVERY.as_millis() as u64, Relaxed, Relaxed)
                    .is_err()
            {
                self.stats.unavailable.fetch_add(1, Relaxed);
                return Err(Refusal::Unavailable(format!("authentication is unavailable: {why}")));
            }
        }
        let started = Instant::now();
        match dir.verify(user, password).await {
            Ok(v) => {
                self.stats.verify_time.record(started.elapsed());
                self.end_episode();
                Ok(v)
            }
            Err(why) => {
                self.start_episode(&why);
                self.next_probe_ms.store(
                    self.epoch.elapsed().as_millis() as u64 + ldap::RETRY_EVERY.as_millis() as u64,
                    Relaxed,
                );
                self.stats.unavailable.fetch_add(1, Relaxed);
                Err(Refusal::Unavailable(format!("authentication is unavailable: {why}")))
            }
        }
    }

    /// Notes a directory failure; the first of an episode is logged.
    fn start_episode(&self, why: &str) {
        if let Ok(mut b) = self.broken.lock() {
            if b.is_none() {
                tracing::error!(
                    "auth: {why}; failing closed: users not in the user cache get 503 until the directory answers again"
                );
            }
            // The latest reason is what the 503 page says.
            *b = Some(why.to_string());
        }
    }

    /// Ends a failure episode, if one is running, with one log line.
    fn end_episode(&self) {
        if let Ok(mut b) = self.broken.lock()
            && let Some(why) = b.take()
        {
            tracing::warn!("auth: the directory answers again (was: {why}); authentication resumed");
        }
    }

    /// Users in the cache now.
    pub fn cached_users(&self) -> usize {
        self.cache.lock().map(|c| c.users.len()).unwrap_or(0)
    }

    /// The current failure episode's reason, if the back-end is failing.
    pub fn failing(&self) -> Option<String> {
        self.broken.lock().ok().and_then(|b| b.clone())
    }

    /// Why a reload must be refused after `check_files(true)`: the user
    /// file cannot be read, or the directory's password file; never a
    /// directory that is down, which a reload cannot mend.
    pub fn reload_error(&self) -> Option<String> {
        if self.directory.is_some() {
            return self.secret_error.lock().ok().and_then(|e| e.clone());
        }
        self.failing()
    }
}
