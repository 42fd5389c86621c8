//! A real OpenLDAP `slapd` (Debian packages `slapd` and `ldap-utils`,
//! installed by .ci/run) for the LDAP tests: started on free loopback
//! ports from a generated slapd.conf with an mdb database in a temporary
//! directory, loaded with `ldapadd` (so the memberof overlay fills in
//! `memberOf`), plain LDAP (StartTLS offered) and LDAPS with a CA made
//! here; killed on Drop. No system slapd is used or needed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The directory's suffix.
pub const BASE: &str = "dc=example,dc=com";
/// The service account Portico searches as.
pub const SERVICE_DN: &str = "cn=portico,dc=example,dc=com";
/// Its password.
pub const SERVICE_PW: &str = "service-secret";
const ROOT_DN: &str = "cn=admin,dc=example,dc=com";
const ROOT_PW: &str = "root-secret";

/// A running slapd; killed (after a SIGCONT, if paused) on Drop.
pub struct Slapd {
    child: Option<Child>,
    dir: TempDir,
    port: u16,
    tls_port: u16,
}

/// True if slapd and ldap-utils are installed; tests skip (saying so) without them.
pub fn have_slapd() -> bool {
    let ok = Path::new("/usr/sbin/slapd").exists()
        && Command::new("ldapadd")
            .arg("-VV")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
    if !ok {
        eprintln!(
            "SKIPPED: OpenLDAP slapd / ldap-utils (Debian slapd, ldap-utils) are not installed; .ci/run installs them"
        );
    }
    ok
}

/// LDIF of a person `uid=<uid>,ou=people,<BASE>` with `password`.
pub fn user_ldif(uid: &str, password: &str) -> String {
    format!(
        "dn: uid={uid},ou=people,{BASE}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {uid}\nsn: {uid}\nuserPassword: {password}\n\n"
    )
}

/// The DN of user `uid`.
pub fn user_dn(uid: &str) -> String {
    format!("uid={uid},ou=people,{BASE}")
}

/// LDIF of a referral object `ou=<ou>,ou=people,<BASE>` pointing at
/// another server: a subtree search over it gets a continuation
/// reference (RFC 4511 4.5.3), as searches in Active Directory do.
pub fn referral(ou: &str) -> String {
    format!(
        "dn: ou={ou},ou=people,{BASE}\nobjectClass: referral\nobjectClass: extensibleObject\nou: {ou}\nref: ldap://elsewhere.invalid/ou={ou},{BASE}\n\n"
    )
}

/// LDIF of a `groupOfNames` (`member` DNs; the memberof overlay adds
/// `memberOf` to each member's entry).
pub fn group_of_names(cn: &str, uids: &[&str]) -> String {
    let mut s = format!("dn: cn={cn},ou=groups,{BASE}\nobjectClass: groupOfNames\ncn: {cn}\n");
    for u in uids {
        s.push_str(&format!("member: {}\n", user_dn(u)));
    }
    s + "\n"
}

/// LDIF of a `groupOfUniqueNames` (`uniqueMember` DNs).
pub fn group_of_unique_names(cn: &str, uids: &[&str]) -> String {
    let mut s = format!("dn: cn={cn},ou=groups,{BASE}\nobjectClass: groupOfUniqueNames\ncn: {cn}\n");
    for u in uids {
        s.push_str(&format!("uniqueMember: {}\n", user_dn(u)));
    }
    s + "\n"
}

/// LDIF of an RFC 2307 `posixGroup` (`memberUid` names).
pub fn posix_group(cn: &str, gid: u32, uids: &[&str]) -> String {
    let mut s = format!("dn: cn={cn},ou=groups,{BASE}\nobjectClass: posixGroup\ncn: {cn}\ngidNumber: {gid}\n");
    for u in uids {
        s.push_str(&format!("memberUid: {u}\n"));
    }
    s + "\n"
}

fn base_ldif() -> String {
    format!(
        "dn: {BASE}\nobjectClass: dcObject\nobjectClass: organization\no: Example\ndc: example\n\n\
         dn: ou=people,{BASE}\nobjectClass: organizationalUnit\nou: people\n\n\
         dn: ou=groups,{BASE}\nobjectClass: organizationalUnit\nou: groups\n\n\
         dn: {SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: portico\nuserPassword: {SERVICE_PW}\n\n"
    )
}

impl Slapd {
    /// Starts slapd with the base entries (suffix, `ou=people`,
    /// `ou=groups`, the service account) plus `ldif` (users first, then
    /// groups, so the memberof overlay sees the members).
    pub async fn start(ldif: &str) -> Slapd {
        Self::start_with_access(ldif, "access to * by * read\n").await
    }

    /// [`Slapd::start`] with `access` (slapd.conf `access to` lines) in
    /// place of the default `access to * by * read`, after the line that
    /// keeps passwords for binds: a directory whose users cannot read
    /// their own entries, say.
    pub async fn start_with_access(ldif: &str, access: &str) -> Slapd {
        let dir = tempfile::Builder::new()
            .prefix("portico-slapd-")
            .tempdir()
            .expect("temp dir for slapd");
        std::fs::create_dir(dir.path().join("data")).expect("slapd data dir");
        write_certificates(dir.path());
        let d = dir.path().display();
        // `allow bind_anon_dn`: accept RFC 4513 5.1.2 unauthenticated binds
        // (a DN with an empty password) as Active Directory and many
        // configured servers do, so the test of the empty password shows
        // Portico refusing it rather than slapd's default doing so.
        let conf = format!(
            "include /etc/ldap/schema/core.schema\n\
             include /etc/ldap/schema/cosine.schema\n\
             include /etc/ldap/schema/inetorgperson.schema\n\
             include /etc/ldap/schema/nis.schema\n\
             modulepath /usr/lib/ldap\n\
             moduleload back_mdb.la\n\
             moduleload memberof.la\n\
             pidfile {d}/slapd.pid\n\
             argsfile {d}/slapd.args\n\
             allow bind_anon_dn\n\
             TLSCACertificateFile {d}/ca.pem\n\
             TLSCertificateFile {d}/server.pem\n\
             TLSCertificateKeyFile {d}/server.key\n\
             database mdb\n\
             maxsize 268435456\n\
             suffix \"{BASE}\"\n\
             rootdn \"{ROOT_DN}\"\n\
             rootpw {ROOT_PW}\n\
             directory {d}/data\n\
             overlay memberof\n\
             access to attrs=userPassword by self write by anonymous auth by * none\n\
             {access}"
        );
        std::fs::write(dir.path().join("slapd.conf"), conf).expect("write slapd.conf");
        let mut s = Slapd {
            child: None,
            dir,
            port: super::free_port(),
            tls_port: super::free_port(),
        };
        s.run().await;
        s.ldap_tool("ldapadd", &(base_ldif() + ldif));
        s
    }

    /// Starts the process (again) on the same ports and data.
    async fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("slapd.log"))
            .expect("slapd log");
        let urls = format!("{} {}", self.url(), self.ldaps_url());
        // -d 0: stay in the foreground (a child the test can signal and
        // kill) without debug output.
        let child = Command::new("/usr/sbin/slapd")
            .args(["-d", "0", "-f"])
            .arg(self.dir.path().join("slapd.conf"))
            .args(["-h", &urls])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start /usr/sbin/slapd");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            let ok = Command::new("ldapsearch")
                .args([
                    "-x",
                    "-H",
                    &self.url(),
                    "-s",
                    "base",
                    "-b",
                    "",
                    "-LLL",
                    "namingContexts",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("slapd exited at start-up ({status}):\n{}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "slapd did not answer within 15 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `ldap://127.0.0.1:<port>` (StartTLS offered there).
    pub fn url(&self) -> String {
        format!("ldap://127.0.0.1:{}", self.port)
    }

    /// `ldaps://127.0.0.1:<port>`.
    pub fn ldaps_url(&self) -> String {
        format!("ldaps://127.0.0.1:{}", self.tls_port)
    }

    /// PEM of the CA that signed the server's certificate (for 127.0.0.1 and localhost).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// slapd's own log (its stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("slapd.log")).unwrap_or_default()
    }

    /// The process id (for signals).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("slapd is running").id()
    }

    /// Applies `ldif` as the directory's administrator with `ldapmodify`
    /// (changetype records) or `ldapadd` (`tool`).
    pub fn ldap_tool(&self, tool: &str, ldif: &str) {
        use std::io::Write;
        let mut child = Command::new(tool)
            // -M (ManageDsaIT): referral objects are added as entries.
            .args(["-x", "-M", "-H", &self.url(), "-D", ROOT_DN, "-w", ROOT_PW])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(ldif.as_bytes())
            .expect("write LDIF");
        let out = child.wait_with_output().expect(tool);
        assert!(
            out.status.success(),
            "{tool} failed: {}\n{ldif}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Adds entries.
    pub fn add(&self, ldif: &str) {
        self.ldap_tool("ldapadd", ldif);
    }

    /// Replaces the password of user `uid` in the directory.
    pub fn set_password(&self, uid: &str, password: &str) {
        self.ldap_tool(
            "ldapmodify",
            &format!(
                "dn: {}\nchangetype: modify\nreplace: userPassword\nuserPassword: {password}\n",
                user_dn(uid)
            ),
        );
    }

    /// Sends `sig` to slapd (SIGSTOP makes it a directory that accepts
    /// connections but never answers; SIGCONT ends that).
    pub fn signal(&self, sig: i32) {
        let pid = self.pid() as i32;
        // SAFETY: kill(2) has no memory-safety preconditions; pid is our child's.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }

    /// Stops slapd (SIGKILL: a crash, not a clean shutdown) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) has no memory-safety preconditions; a stopped
            // process is continued so that it can die.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts slapd again after `stop`, same ports and entries.
    pub async fn restart(&mut self) {
        self.stop();
        self.run().await;
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A CA, and a server certificate for 127.0.0.1 and localhost signed by it.
fn write_certificates(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Portico test directory CA");
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("self-signed CA");
    let key = KeyPair::generate().expect("server key");
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("server params");
    params.distinguished_name.push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &ca).expect("server certificate");
    std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write ca.pem");
    std::fs::write(dir.join("server.pem"), cert.pem()).expect("write server.pem");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("write server.key");
}
