//! The LDAP directory back-end of `[auth]` (RFC 4511), through the `ldap3`
//! crate on tokio with rustls.
//!
//! One login, as the Sun proxy and Squid's `basic_ldap_auth` do it:
//! 1. the user's DN: a search under `base_dn` with `user_filter` (bound as
//!    the service account `bind_dn`, or anonymously), which must find
//!    exactly one entry; or `dn_template` with the name put in;
//! 2. the password: a simple bind as that DN;
//! 3. the groups: a search under `group_base` with `group_filter` (the
//!    `member` / `uniqueMember` DN or the `memberUid` name), and/or the
//!    `memberOf` values of the user's entry, read as the service account.
//!
//! The user name is hostile input: it is escaped for filters (RFC 4515
//! 3: `*`, `(`, `)`, `\`, NUL) and for DNs (RFC 4514 2.4), so `*)(uid=*`
//! finds nobody instead of everybody. An empty password is refused before
//! the directory is asked: RFC 4513 5.1.2 makes a bind with a DN and no
//! password an "unauthenticated bind", which many servers answer with
//! success.
//!
//! Connections are pooled (`pool_size`); a connection that saw any error
//! or timeout is closed, not reused, since its state is unknown. Every
//! operation is bounded by `timeout`, opening one by `connect_timeout`:
//! a directory that stops answering costs a login that long, never a hang.

use crate::config::LdapConfig;
use ldap3::{LdapConnAsync, LdapConnSettings, Scope, SearchEntry, SearchOptions};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the directory said about a user name and password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The password is right.
    Valid {
        /// The user's name as the directory spells it (`user_attribute`),
        /// which the access log and `[[acl]] user` entries see.
        name: String,
        /// The user's group names (sorted, unique).
        groups: Vec<String>,
    },
    /// Unknown user, ambiguous user name, wrong or empty password.
    Invalid,
}

/// An open connection and the task that drives it.
struct Conn {
    ldap: ldap3::Ldap,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The driver ends by itself once every handle is gone; aborting
        // also ends it when the socket is stuck (a stopped directory).
        self.driver.abort();
    }
}

/// A directory and its connection pool.
pub struct Directory {
    cfg: LdapConfig,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The service account's password (from `bind_password_file`, re-read on SIGHUP).
    secret: Mutex<String>,
    idle: Mutex<Vec<Conn>>,
    slots: tokio::sync::Semaphore,
}

/// A failure of the directory (not of the user's password): the message
/// for the error log and the 503.
type Failure = String;

impl Directory {
    /// Reads the CA and password files named by `cfg`; `Err` names the file.
    /// Does not connect: the directory may come up after Portico does.
    pub fn new(cfg: &LdapConfig) -> Result<Directory, String> {
        let tls = if crate::config::ldap_url(&cfg.url).unwrap_or(false) || cfg.starttls {
            let ca = (!cfg.ca_file.as_os_str().is_empty()).then_some(cfg.ca_file.as_path());
            let c = crate::upstream::tls_config(ca.is_none(), ca)
                .map_err(|e| format!("auth.ldap.ca_file: {}", e.replace("origin.ca_file", "file")))?;
            Some(Arc::new(c))
        } else {
            None
        };
        let d = Directory {
            cfg: cfg.clone(),
            tls,
            secret: Mutex::new(String::new()),
            idle: Mutex::new(Vec::new()),
            slots: tokio::sync::Semaphore::new(cfg.pool_size.max(1)),
        };
        d.reload_secret()?;
        Ok(d)
    }

    /// Re-reads `bind_password_file` (SIGHUP); `Err` names the file.
    pub fn reload_secret(&self) -> Result<(), String> {
        let secret = if self.cfg.bind_password_file.as_os_str().is_empty() {
            self.cfg.bind_password.clone()
        } else {
            let path = &self.cfg.bind_password_file;
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("auth.ldap.bind_password_file {}: cannot read: {e}", path.display()))?;
            // One line; the newline an editor or `echo` adds is not part of it.
            let line = text.lines().next().unwrap_or("").to_string();
            if line.is_empty() {
                return Err(format!(
                    "auth.ldap.bind_password_file {}: the file is empty (an empty password would be an unauthenticated bind)",
                    path.display()
                ));
            }
            line
        };
        if let Ok(mut s) = self.secret.lock() {
            *s = secret;
        }
        // Connections bound with the old password are not reused.
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
        Ok(())
    }

    /// Checks `user` / `password` against the directory. `Err` when the
    /// directory cannot answer (down, slow, refusing the service account,
    /// misconfigured): the caller fails closed.
    pub async fn verify(&self, user: &str, password: &str) -> Result<Verdict, Failure> {
        if password.is_empty() || user.is_empty() {
            return Ok(Verdict::Invalid);
        }
        let timeout = self.cfg.timeout.get();
        let _permit = match tokio::time::timeout(timeout, self.slots.acquire()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err("the directory connection pool is closed".into()),
            Err(_) => {
                return Err(format!(
                    "all {} directory connections stayed busy for {} (auth.ldap.pool_size, auth.ldap.timeout)",
                    self.cfg.pool_size,
                    humantime::format_duration(timeout)
                ));
            }
        };
        let pooled = self.idle.lock().ok().and_then(|mut v| v.pop());
        if let Some(mut conn) = pooled.filter(|c| !c.driver.is_finished()) {
            match self.login(&mut conn.ldap, user, password).await {
                Ok(v) => {
                    self.put_back(conn);
                    return Ok(v);
                }
                // An idle connection may have been closed by the directory
                // (its idle timeout, a restart) or a firewall without the
                // driver noticing yet: one more try on a new connection
                // before calling the directory failed.
                Err(why) => tracing::debug!("auth: pooled directory connection failed ({why}); reconnecting"),
            }
        }
        let mut conn = self.connect().await?;
        let result = self.login(&mut conn.ldap, user, password).await;
        if result.is_ok() {
            self.put_back(conn);
        }
        result
    }

    fn put_back(&self, conn: Conn) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }

    async fn connect(&self) -> Result<Conn, Failure> {
        let limit = self.cfg.connect_timeout.get();
        let mut settings = LdapConnSettings::new()
            .set_conn_timeout(limit)
            .set_starttls(self.cfg.starttls);
        if let Some(tls) = &self.tls {
            settings = settings.set_config(tls.clone());
        }
        let url = &self.cfg.url;
        // ldap3's own limit covers TCP and TLS; this one StartTLS too.
        let (conn, ldap) = match tokio::time::timeout(limit, LdapConnAsync::with_settings(settings, url)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(format!("cannot connect to {url}: {}", plain(&e))),
            Err(_) => {
                return Err(format!(
                    "cannot connect to {url}: no connection within {} (auth.ldap.connect_timeout)",
                    humantime::format_duration(limit)
                ));
            }
        };
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.drive().await {
                tracing::debug!("auth: directory connection ended: {e}");
            }
        });
        Ok(Conn { ldap, driver })
    }

    /// One operation, bounded by `timeout`.
    async fn op<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = ldap3::result::Result<T>>,
    ) -> Result<T, Failure> {
        let limit = self.cfg.timeout.get();
        match tokio::time::timeout(limit, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(format!("{what} at {} failed: {}", self.cfg.url, plain(&e))),
            Err(_) => Err(format!(
                "{what} at {}: no answer within {} (auth.ldap.timeout)",
                self.cfg.url,
                humantime::format_duration(limit)
            )),
        }
    }

    /// Binds as the service account (or anonymously) for the searches.
    async fn bind_service(&self, ldap: &mut ldap3::Ldap) -> Result<(), Failure> {
        let secret = self.secret.lock().map(|s| s.clone()).unwrap_or_default();
        let dn = &self.cfg.bind_dn;
        let r = self.op("the service bind", ldap.simple_bind(dn, &secret)).await?;
        if r.rc != 0 {
            let who = if dn.is_empty() {
                "an anonymous bind".to_string()
            } else {
                format!("the service account {dn:?} (auth.ldap.bind_dn)")
            };
            return Err(format!(
                "{} refused {who}: {}",
                self.cfg.url,
                result_text(r.rc, &r.text)
            ));
        }
        Ok(())
    }

    /// `attr` of the entry `dn` as the current bind may read it, the value
    /// matching `user` first: None when the entry or the attribute cannot
    /// be read (noSuchObject and insufficientAccessRights are what a
    /// directory answers for an entry it hides).
    async fn read_name(
        &self,
        ldap: &mut ldap3::Ldap,
        dn: &str,
        attr: &str,
        user: &str,
    ) -> Result<Option<String>, Failure> {
        let ldap3::SearchResult(entries, result) = self
            .op(
                "the user entry read",
                ldap.search(dn, Scope::Base, "(objectClass=*)", vec![attr]),
            )
            .await?;
        match result.rc {
            0 => {}
            32 | 50 => return Ok(None),
            rc => {
                return Err(format!(
                    "reading {attr} of {dn:?} at {} failed: {}",
                    self.cfg.url,
                    result_text(rc, &result.text)
                ));
            }
        }
        match entries.into_iter().next() {
            Some(e) => Ok(canonical_name(&self.read_entry(e)?, attr, user)),
            None => Ok(None),
        }
    }

    fn read_entry(&self, raw: ldap3::ResultEntry) -> Result<SearchEntry, Failure> {
        decode_entry(raw).ok_or_else(|| format!("{} sent a malformed search result entry", self.cfg.url))
    }

    async fn login(&self, ldap: &mut ldap3::Ldap, user: &str, password: &str) -> Result<Verdict, Failure> {
        let cfg = &self.cfg;
        let attr = cfg.user_attribute.as_str();
        let (dn, mut name) = if cfg.dn_template.is_empty() {
            self.bind_service(ldap).await?;
            let filter = fill(&cfg.user_filter, user, "");
            // Two are enough to tell "exactly one" from "ambiguous".
            ldap.with_search_options(SearchOptions::new().sizelimit(2));
            let found = self
                .op(
                    "the user search",
                    ldap.search(&cfg.base_dn, Scope::Subtree, &filter, vec![attr]),
                )
                .await?;
            // rc 4: sizeLimitExceeded, more than one match.
            let ambiguous = found.1.rc == 4;
            let (entries, _) = if ambiguous {
                (Vec::new(), found.1)
            } else {
                found
                    .non_error()
                    .map_err(|e| format!("the user search at {} failed: {}", cfg.url, plain(&e)))?
            };
            if ambiguous || entries.len() > 1 {
                tracing::warn!(
                    "auth: user name {user:?} matches several entries under {:?} with {filter:?}; refused",
                    cfg.base_dn
                );
                return Ok(Verdict::Invalid);
            }
            let Some(entry) = entries.into_iter().next() else {
                return Ok(Verdict::Invalid);
            };
            let entry = self.read_entry(entry)?;
            let name = canonical_name(&entry, attr, user);
            (entry.dn, name)
        } else {
            (cfg.dn_template.replace("{user}", &ldap3::dn_escape(user)), None)
        };
        let r = self.op("the user bind", ldap.simple_bind(&dn, password)).await?;
        match r.rc {
            0 => {}
            // invalidCredentials, inappropriateAuthentication,
            // insufficientAccessRights, unwillingToPerform (a locked or
            // expired account, or a refused unauthenticated bind): the
            // user's problem, answered with a new challenge.
            49 | 48 | 50 | 53 => return Ok(Verdict::Invalid),
            rc => {
                return Err(format!(
                    "the user bind at {} failed: {}",
                    cfg.url,
                    result_text(rc, &r.text)
                ));
            }
        }
        let mut service_bound = false;
        if name.is_none() {
            // The DN came from the template: the entry says how the
            // directory spells the name. Read as the user just bound, else
            // as the service identity (a directory may hide users' own
            // entries from them). The name as typed is never taken
            // instead: the directory matched it without regard to case,
            // so `BOB` would pass an `[[acl]]` entry denying `bob`.
            name = self.read_name(ldap, &dn, attr, user).await?;
            if name.is_none() {
                self.bind_service(ldap).await?;
                service_bound = true;
                name = self.read_name(ldap, &dn, attr, user).await?;
            }
            if name.is_none() {
                tracing::warn!(
                    "auth: cannot read {attr} of {dn:?} at {}, as the user or as the service identity, so the \
                     directory's spelling of {user:?} is unknown; refused (let users read their own {attr}, or \
                     give auth.ldap.bind_dn an account that may)",
                    cfg.url
                );
                return Ok(Verdict::Invalid);
            }
        }
        // A searched entry without the attribute keeps the name as
        // presented (the filter matched it as such).
        let name = name.unwrap_or_else(|| user.to_string());
        let mut groups = Vec::new();
        if cfg.group_base.is_empty() && !cfg.member_of {
            return Ok(Verdict::Valid { name, groups });
        }
        // Back to the service identity: a user may not read the groups.
        if !service_bound {
            self.bind_service(ldap).await?;
        }
        if cfg.member_of {
            let (entries, _) = self
                .op(
                    "the memberOf read",
                    ldap.search(&dn, Scope::Base, "(objectClass=*)", vec!["memberOf"]),
                )
                .await?
                .success()
                .map_err(|e| format!("reading memberOf of {dn:?} at {} failed: {}", cfg.url, plain(&e)))?;
            for e in entries {
                let e = self.read_entry(e)?;
                for (attr, values) in e.attrs {
                    if attr.eq_ignore_ascii_case("memberOf") {
                        groups.extend(values.iter().filter_map(|v| first_rdn_value(v)));
                    }
                }
            }
        }
        if !cfg.group_base.is_empty() {
            let filter = fill(cfg.group_filter(), &name, &dn);
            let (entries, _) = self
                .op(
                    "the group search",
                    ldap.search(
                        &cfg.group_base,
                        Scope::Subtree,
                        &filter,
                        vec![cfg.group_name_attribute.as_str()],
                    ),
                )
                .await?
                .success()
                .map_err(|e| format!("the group search at {} failed: {}", cfg.url, plain(&e)))?;
            for e in entries {
                let e = self.read_entry(e)?;
                for (attr, values) in e.attrs {
                    if attr.eq_ignore_ascii_case(&cfg.group_name_attribute) {
                        groups.extend(values);
                    }
                }
            }
        }
        groups.sort();
        groups.dedup();
        Ok(Verdict::Valid { name, groups })
    }
}

/// An entry of a search answer, decoded. `ldap3`'s decoder panics on a
/// malformed entry; a directory's answer is input like any other, so a
/// bad one is a failure of the directory, not of the process.
pub fn decode_entry(raw: ldap3::ResultEntry) -> Option<SearchEntry> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| SearchEntry::construct(raw))).ok()
}

/// The user's name from `entry`'s `attr`: the value equal to the presented
/// name but for case and surrounding spaces if there is one (a multi-valued
/// `uid`), else the first. Directories match names case-insensitively and
/// ignore insignificant spaces (RFC 4518), so `ALICE` or `alice ` find
/// alice's entry: taking her spelling keeps `[[acl]] user = "alice"`
/// entries (compared exactly) from being sidestepped by another spelling.
pub fn canonical_name(entry: &SearchEntry, attr: &str, presented: &str) -> Option<String> {
    let values = entry
        .attrs
        .iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(attr))
        .map(|(_, v)| v)?;
    let wanted = presented.trim();
    values
        .iter()
        .find(|v| v.trim().eq_ignore_ascii_case(wanted))
        .or_else(|| values.first())
        .cloned()
}

/// `template` with `{user}` and `{dn}` replaced by their RFC 4515 escapes,
/// in one pass: an escaped value is never scanned for placeholders again.
pub fn fill(template: &str, user: &str, dn: &str) -> String {
    let mut out = String::with_capacity(template.len() + user.len() + dn.len());
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("{user}") {
            out.push_str(&ldap3::ldap_escape(user));
            rest = t;
        } else if let Some(t) = tail.strip_prefix("{dn}") {
            out.push_str(&ldap3::ldap_escape(dn));
            rest = t;
        } else {
            out.push('{');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The value of a DN's first RDN (`cn=admins,ou=groups,...` → `admins`),
/// with RFC 4514 escapes undone; None for a multi-valued or malformed RDN.
pub fn first_rdn_value(dn: &str) -> Option<String> {
    let mut value = Vec::new();
    let mut chars = dn.split_once('=')?.1.bytes().peekable();
    while let Some(b) = chars.next() {
        match b {
            b',' => break,
            b'+' => return None,
            b'\\' => {
                let a = chars.next()?;
                if a.is_ascii_hexdigit() && chars.peek().is_some_and(u8::is_ascii_hexdigit) {
                    let b2 = chars.next()?;
                    let hex = [a, b2];
                    value.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
                } else {
                    value.push(a);
                }
            }
            _ => value.push(b),
        }
    }
    let v = String::from_utf8(value).ok()?;
    (!v.is_empty()).then_some(v)
}

/// An LDAP result code with its RFC 4511 name and the server's text.
fn result_text(rc: u32, text: &str) -> String {
    let name = match rc {
        1 => "operationsError",
        2 => "protocolError",
        3 => "timeLimitExceeded",
        4 => "sizeLimitExceeded",
        7 => "authMethodNotSupported",
        8 => "strongerAuthRequired",
        11 => "adminLimitExceeded",
        13 => "confidentialityRequired",
        32 => "noSuchObject",
        34 => "invalidDNSyntax",
        48 => "inappropriateAuthentication",
        49 => "invalidCredentials",
        50 => "insufficientAccessRights",
        51 => "busy",
        52 => "unavailable",
        53 => "unwillingToPerform",
        80 => "other",
        _ => "",
    };
    let mut out = format!("result {rc}");
    if !name.is_empty() {
        out.push_str(&format!(" ({name})"));
    }
    if !text.is_empty() {
        out.push_str(&format!(": {text}"));
    }
    out
}

/// An `ldap3` error in words, its LDAP result named when it carries one.
fn plain(e: &ldap3::LdapError) -> String {
    match e {
        ldap3::LdapError::LdapResult { result } => result_text(result.rc, &result.text),
        e => e.to_string(),
    }
}

/// How long a directory failure episode lets requests be answered 503
/// at once before one of them asks the directory again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_values_are_escaped_per_rfc4515_section_3() {
        assert_eq!(fill("(uid={user})", "alice", ""), "(uid=alice)");
        // The classic injection finds nobody instead of everybody.
        assert_eq!(fill("(uid={user})", "*)(uid=*", ""), "(uid=\\2a\\29\\28uid=\\2a)");
        assert_eq!(fill("(uid={user})", "a\\b\0", ""), "(uid=a\\5cb\\00)");
        // A value holding a placeholder is not expanded again.
        assert_eq!(
            fill("(|(member={dn})(memberUid={user}))", "{dn}", "uid=x,dc=t"),
            "(|(member=uid=x,dc=t)(memberUid={dn}))"
        );
        assert_eq!(fill("(cn={other})", "u", ""), "(cn={other})");
    }

    #[test]
    fn memberof_values_name_groups_by_their_first_rdn() {
        assert_eq!(
            first_rdn_value("cn=admins,ou=groups,dc=example,dc=com").as_deref(),
            Some("admins")
        );
        assert_eq!(first_rdn_value("cn=a\\2cb,dc=x").as_deref(), Some("a,b"));
        assert_eq!(first_rdn_value("cn=a\\,b,dc=x").as_deref(), Some("a,b"));
        assert_eq!(first_rdn_value("cn=a+ou=b,dc=x"), None);
        assert_eq!(first_rdn_value("garbage"), None);
        assert_eq!(first_rdn_value("cn=,dc=x"), None);
    }

    #[test]
    fn the_directory_spelling_of_the_name_wins() {
        let entry = |values: &[&str]| SearchEntry {
            dn: "uid=alice,dc=x".into(),
            attrs: [("uid".to_string(), values.iter().map(|v| v.to_string()).collect())].into(),
            bin_attrs: Default::default(),
        };
        assert_eq!(
            canonical_name(&entry(&["alice"]), "uid", "ALICE ").as_deref(),
            Some("alice")
        );
        assert_eq!(
            canonical_name(&entry(&["a1", "alice"]), "UID", "Alice").as_deref(),
            Some("alice")
        );
        // Logged in by another attribute (a mail filter): the first uid.
        assert_eq!(
            canonical_name(&entry(&["alice", "a1"]), "uid", "alice@example.com").as_deref(),
            Some("alice")
        );
        assert_eq!(canonical_name(&entry(&["alice"]), "cn", "alice"), None);
    }

    #[test]
    fn malformed_entries_from_the_directory_are_refused_not_a_panic() {
        use ldap3::asn1::{PL, StructureTag, TagClass};
        let tag = |id, payload| StructureTag {
            class: TagClass::Application,
            id,
            payload,
        };
        let octets = |b: &[u8]| StructureTag {
            class: TagClass::Universal,
            id: 4,
            payload: PL::P(b.to_vec()),
        };
        let raw = ldap3::ResultEntry::new;
        // Not a SearchResultEntry (application 4) at all.
        assert!(decode_entry(raw(tag(5, PL::C(Vec::new())))).is_none());
        // No attributes element; a DN that is not UTF-8.
        assert!(decode_entry(raw(tag(4, PL::C(vec![octets(b"uid=a")])))).is_none());
        let seq = |v| StructureTag {
            class: TagClass::Universal,
            id: 16,
            payload: PL::C(v),
        };
        assert!(decode_entry(raw(tag(4, PL::C(vec![octets(&[0xff, 0xfe]), seq(Vec::new())])))).is_none());
        // A well-formed one decodes.
        let ok = decode_entry(raw(tag(4, PL::C(vec![octets(b"uid=a,dc=x"), seq(Vec::new())])))).expect("entry");
        assert_eq!(ok.dn, "uid=a,dc=x");
    }

    #[test]
    fn the_service_password_file_is_one_line_and_never_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("secret");
        let cfg = LdapConfig {
            url: "ldap://127.0.0.1".into(),
            bind_dn: "cn=svc,dc=x".into(),
            bind_password_file: file.clone(),
            base_dn: "dc=x".into(),
            ..Default::default()
        };
        let missing = Directory::new(&cfg).err().expect("a missing file is an error");
        assert!(
            missing.contains("bind_password_file") && missing.contains("secret"),
            "{missing}"
        );
        // An empty secret would make the service bind an unauthenticated one.
        for empty in ["", "\n", "\nsecond line"] {
            std::fs::write(&file, empty).expect("write");
            let e = Directory::new(&cfg).err().expect("an empty password is an error");
            assert!(e.contains("empty"), "{e}");
        }
        std::fs::write(&file, "s3cret\r\n").expect("write");
        let d = Directory::new(&cfg).expect("a one-line file");
        assert_eq!(d.secret.lock().map(|s| s.clone()).unwrap_or_default(), "s3cret");
    }

    #[test]
    fn result_codes_are_named() {
        assert_eq!(result_text(49, "bad"), "result 49 (invalidCredentials): bad");
        assert_eq!(result_text(999, ""), "result 999");
    }
}
