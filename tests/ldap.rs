//! `[auth.ldap]` end to end: the real `portico` binary against a real
//! OpenLDAP `slapd` (tests/common/slapd.rs; Debian `slapd` and
//! `ldap-utils`, installed by .ci/run), raw-socket and curl clients.

mod common;

use base64::Engine;
use common::slapd::{self, BASE, SERVICE_DN, SERVICE_PW};
use common::*;
use std::time::{Duration, Instant};

/// The users most tests share: alice (groupOfNames `g-member`, so also
/// `memberOf`), bob (groupOfUniqueNames `g-unique`), carol (posixGroup
/// `g-posix`, by `memberUid`), dave (no group); and a referral among the
/// people, so every user search also gets a continuation reference, which
/// must not count as an entry (ldap3's `search` leaves them out).
fn people() -> String {
    let mut l = slapd::referral("branch");
    for (u, pw) in [("alice", "a-pw"), ("bob", "b-pw"), ("carol", "c-pw"), ("dave", "d-pw")] {
        l.push_str(&slapd::user_ldif(u, pw));
    }
    l.push_str(&slapd::group_of_names("g-member", &["alice"]));
    l.push_str(&slapd::group_of_unique_names("g-unique", &["bob"]));
    l.push_str(&slapd::posix_group("g-posix", 5000, &["carol"]));
    l
}

/// `[auth.ldap]` lines searching as the service account, its password
/// in a file under the proxy's directory (written by `proxy`).
fn search_settings(url: &str) -> String {
    format!(
        "url = \"{url}\"\nbind_dn = \"{SERVICE_DN}\"\nbind_password_file = \"{{dir}}/ldap-secret\"\n\
         base_dn = \"ou=people,{BASE}\"\n"
    )
}

/// A running proxy and the directory holding its service password file
/// (which must outlive start-up: the harness sees the port listening
/// before the configuration's files are read).
struct Proxy {
    portico: Portico,
    /// The service password file.
    secret: std::path::PathBuf,
    _secret_dir: tempfile::TempDir,
}

impl std::ops::Deref for Proxy {
    type Target = Portico;
    fn deref(&self) -> &Portico {
        &self.portico
    }
}

impl std::ops::DerefMut for Proxy {
    fn deref_mut(&mut self) -> &mut Portico {
        &mut self.portico
    }
}

/// A forward proxy with `[auth]` keys `auth`, `[auth.ldap]` keys `ldap`
/// and anything `rest` adds (ACL entries). The service password file is
/// written before start-up, in a directory of its own.
async fn proxy(auth: &str, ldap: &str, rest: &str) -> Proxy {
    let config = format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\nenabled = false\n\n{rest}\n[auth]\n{auth}\n[auth.ldap]\n{ldap}\n",
        free_addr()
    );
    let secret_dir = tempfile::tempdir().expect("tempdir");
    let secret = secret_dir.path().join("ldap-secret");
    std::fs::write(&secret, format!("{SERVICE_PW}\n")).expect("write secret");
    let config = config.replace("{dir}/ldap-secret", secret.to_str().expect("utf-8"));
    Proxy {
        portico: Portico::start(&config).await,
        secret,
        _secret_dir: secret_dir,
    }
}

async fn origin() -> Origin {
    Origin::start(|_req| async move { Response::ok("ok") }).await
}

fn basic(user: &str, pw: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    )
}

async fn get(p: &Portico, o: &Origin, extra: &str) -> ParsedResponse {
    let req = format!(
        "GET {}/x HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{extra}\r\n",
        o.url(),
        o.addr()
    );
    parse_response(&raw_request(p.addr(), req.as_bytes()).await)
}

async fn get_as(p: &Portico, o: &Origin, user: &str, pw: &str) -> ParsedResponse {
    get(p, o, &format!("Proxy-Authorization: {}\r\n", basic(user, pw))).await
}

async fn metric(p: &Portico, name: &str) -> f64 {
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        p.addr()
    );
    let m = parse_response(&raw_request(p.addr(), req.as_bytes()).await).body_str();
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{m}"))
}

fn assert_challenge(r: &ParsedResponse, what: &str) {
    assert_eq!(r.status, 407, "{what}: {}", r.body_str());
    assert_eq!(
        r.header("proxy-authenticate"),
        Some("Basic realm=\"Portico\", charset=\"UTF-8\""),
        "{what}"
    );
}

fn assert_unavailable(r: &ParsedResponse, what: &str) {
    assert_eq!(r.status, 503, "{what}: {}", r.body_str());
    assert!(
        r.header("proxy-authenticate").is_none(),
        "{what}: a 503 is no challenge"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_and_wrong_password_unknown_user_and_the_empty_password() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let p = proxy("", &search_settings(&d.url()), "").await;
    let r = get_as(&p, &o, "alice", "a-pw").await;
    assert_eq!(r.status, 200, "right password: {}", r.body_str());
    assert_challenge(&get_as(&p, &o, "alice", "wrong").await, "wrong password");
    assert_challenge(&get_as(&p, &o, "nobody", "a-pw").await, "unknown user");
    // RFC 4513 5.1.2: a bind with a DN and no password is an
    // unauthenticated bind, which this slapd (like many directories)
    // answers with success. Portico must not take that for a login.
    assert_challenge(&get_as(&p, &o, "alice", "").await, "empty password");
    assert_challenge(&get_as(&p, &o, "bob", "").await, "empty password, another user");
    // Credentials never reach the origin; the user is in the access log.
    let seen = o.requests();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].header("proxy-authorization").is_none());
    let lines = file_lines(&p.dir().join("access.log"), 5).await;
    assert!(
        lines.iter().any(|l| l.contains(" - alice [") && l.contains("\" 200 ")),
        "{lines:#?}"
    );
    // The directory's latency is measured, every miss counted.
    assert_eq!(metric(&p, "portico_auth_cache_misses_total").await, 5.0);
    assert_eq!(metric(&p, "portico_auth_failures_total").await, 4.0);
    assert!(metric(&p, "portico_auth_verify_seconds_count").await >= 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_user_names_do_not_widen_the_search() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    // Denies alice by name: a wildcard that found her entry would log in
    // as "ali*" and pass this entry.
    let mut p = proxy(
        "",
        &search_settings(&d.url()),
        "[[acl]]\naction = \"deny\"\nuser = \"alice\"\nreason = \"alice is blocked\"\n\n",
    )
    .await;
    assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 403, "alice herself");
    // RFC 4515 3: '*', '(', ')', '\' and NUL are escaped, so none of these
    // finds alice's (or anyone's) entry with her password.
    for name in [
        "ali*",
        "*",
        "*)(uid=*",
        "alice)(uid=alice",
        "*)(|(objectClass=*",
        "alice\\",
        "a*e",
        "alice\u{0}",
    ] {
        let r = get_as(&p, &o, name, "a-pw").await;
        // NUL is a control character: the Basic parser refuses it first (400).
        if name.contains('\u{0}') {
            assert_eq!(r.status, 400, "{name:?}: {}", r.body_str());
        } else {
            assert_challenge(&r, &format!("user name {name:?}"));
        }
    }
    // Other spellings of her name find her entry (the directory compares
    // uid without case and drops insignificant spaces, RFC 4518): she is
    // still alice to the ACL and the access log, and still denied.
    for name in ["ALICE", "Alice", "alice ", " alice"] {
        let r = get_as(&p, &o, name, "a-pw").await;
        assert_eq!(r.status, 403, "{name:?}: {}", r.body_str());
    }
    assert_eq!(o.requests().len(), 0, "nothing reached the origin");
    let lines = file_lines(&p.dir().join("access.log"), 13).await;
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(" - alice [") && l.contains("\" 403 "))
            .count(),
        5,
        "{lines:#?}"
    );
    assert!(p.is_running(), "portico survived");
}

/// A group search (the default filter: `member`, `uniqueMember` with the
/// DN, `memberUid` with the name) and `memberOf` each give their users the
/// group an `[[acl]]` entry asks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_by_member_unique_member_member_uid_and_member_of() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let acl = "[access]\nacl_default = \"deny\"\n\n\
               [[acl]]\naction = \"allow\"\ngroup = [\"g-member\", \"g-unique\", \"g-posix\"]\n\n";
    let by_search = proxy(
        "",
        &format!("{}group_base = \"ou=groups,{BASE}\"\n", search_settings(&d.url())),
        acl,
    )
    .await;
    for (user, pw, want, how) in [
        ("alice", "a-pw", 200, "member"),
        ("bob", "b-pw", 200, "uniqueMember"),
        ("carol", "c-pw", 200, "memberUid"),
        // memberUid compares with case (caseExactIA5Match): the filter
        // takes the name as the directory spells it, not as typed.
        ("CAROL", "c-pw", 200, "memberUid, the name typed in capitals"),
        ("dave", "d-pw", 403, "in no group"),
    ] {
        let r = get_as(&by_search, &o, user, pw).await;
        assert_eq!(r.status, want, "{user} ({how}): {}", r.body_str());
    }
    // memberOf (the slapd memberof overlay fills it in for groupOfNames):
    // only alice has one; the other groups are not searched.
    let by_member_of = proxy("", &format!("{}member_of = true\n", search_settings(&d.url())), acl).await;
    for (user, pw, want) in [("alice", "a-pw", 200), ("bob", "b-pw", 403), ("carol", "c-pw", 403)] {
        let r = get_as(&by_member_of, &o, user, pw).await;
        assert_eq!(r.status, want, "{user} by memberOf: {}", r.body_str());
    }
    // A group filter of one kind only: memberUid.
    let posix_only = proxy(
        "",
        &format!(
            "{}group_base = \"ou=groups,{BASE}\"\ngroup_filter = \"(&(objectClass=posixGroup)(memberUid={{user}}))\"\n",
            search_settings(&d.url())
        ),
        acl,
    )
    .await;
    assert_eq!(get_as(&posix_only, &o, "carol", "c-pw").await.status, 200);
    assert_eq!(get_as(&posix_only, &o, "Carol", "c-pw").await.status, 200);
    assert_eq!(get_as(&posix_only, &o, "alice", "a-pw").await.status, 403);
}

/// A DN template instead of a search, binding anonymously for memberOf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dn_template_without_a_service_account() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let p = proxy(
        "",
        &format!(
            "url = \"{}\"\ndn_template = \"uid={{user}},ou=people,{BASE}\"\nmember_of = true\n",
            d.url()
        ),
        "[[acl]]\naction = \"deny\"\ngroup = \"g-member\"\nreason = \"members out\"\n\n",
    )
    .await;
    assert_eq!(get_as(&p, &o, "bob", "b-pw").await.status, 200);
    assert_challenge(&get_as(&p, &o, "bob", "wrong").await, "wrong password");
    assert_challenge(&get_as(&p, &o, "nobody", "b-pw").await, "no such DN");
    // RFC 4514 escaping: a name with ',' or '=' cannot reach another DN.
    assert_challenge(
        &get_as(&p, &o, &format!("bob,ou=people,{BASE}"), "b-pw").await,
        "DN injection",
    );
    let r = get_as(&p, &o, "alice", "a-pw").await;
    assert_eq!(r.status, 403, "alice's memberOf: {}", r.body_str());
    // The name as the directory spells it, read from the entry.
    assert_eq!(get_as(&p, &o, "BOB", "b-pw").await.status, 200);
    let lines = file_lines(&p.dir().join("access.log"), 7).await;
    assert!(
        lines
            .iter()
            .filter(|l| l.contains(" - bob [") && l.contains("\" 200 "))
            .count()
            == 2,
        "{lines:#?}"
    );
}

/// A directory whose users may not read their own name: with a DN
/// template, Portico reads it as the service account, and with no account
/// that may read it refuses the login. Taking the name as typed would let
/// `BOB` (whom the directory binds as bob, matching names without regard
/// to case) past an `[[acl]]` entry that denies `bob`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dn_template_users_who_cannot_read_their_name_are_named_by_the_service_account_or_refused() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start_with_access(
        &people(),
        &format!("access to attrs=uid by dn.exact=\"{SERVICE_DN}\" read by * none\naccess to * by * read\n"),
    )
    .await;
    let o = origin().await;
    let template = format!("dn_template = \"uid={{user}},ou=people,{BASE}\"\n");
    let deny_bob = "[[acl]]\naction = \"deny\"\nuser = \"bob\"\nreason = \"not bob\"\n\n";
    let service = proxy(
        "",
        &format!(
            "url = \"{}\"\nbind_dn = \"{SERVICE_DN}\"\nbind_password_file = \"{{dir}}/ldap-secret\"\n{template}",
            d.url()
        ),
        deny_bob,
    )
    .await;
    for spelling in ["bob", "BOB", "Bob"] {
        let r = get_as(&service, &o, spelling, "b-pw").await;
        assert_eq!(r.status, 403, "{spelling}: {}", r.body_str());
    }
    assert_eq!(get_as(&service, &o, "ALICE", "a-pw").await.status, 200);
    let anonymous = proxy("", &format!("url = \"{}\"\n{template}", d.url()), deny_bob).await;
    for spelling in ["BOB", "alice"] {
        assert_challenge(&get_as(&anonymous, &o, spelling, "x-pw").await, "wrong password");
        let pw = if spelling == "BOB" { "b-pw" } else { "a-pw" };
        assert_challenge(&get_as(&anonymous, &o, spelling, pw).await, "name unreadable");
    }
    assert!(
        anonymous.stderr().contains("cannot read uid of"),
        "{}",
        anonymous.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_password_old_refused_after_max_age_new_accepted() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let p = proxy("max_age = \"1s\"\nfailed_ttl = \"0s\"", &search_settings(&d.url()), "").await;
    assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 200);
    d.set_password("alice", "new-pw");
    // Within max_age the old password still passes from the cache (the
    // Sun proxy's documented trade-off)...
    let started = Instant::now();
    assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 200);
    assert_eq!(metric(&p, "portico_auth_cache_hits_total").await, 1.0);
    // ...and once the entry is max_age old it is refused.
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(started.elapsed())).await;
    assert_challenge(&get_as(&p, &o, "alice", "a-pw").await, "old password after max_age");
    let r = get_as(&p, &o, "alice", "new-pw").await;
    assert_eq!(r.status, 200, "new password: {}", r.body_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_directory_fails_closed_logs_once_and_cached_users_continue() {
    if !have_slapd() {
        return;
    }
    let mut d = Slapd::start(&people()).await;
    let o = origin().await;
    let p = proxy("max_age = \"10m\"", &search_settings(&d.url()), "").await;
    assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 200);
    d.stop();
    let r = get_as(&p, &o, "bob", "b-pw").await;
    assert_unavailable(&r, "directory down");
    assert!(
        r.body_str().contains("cannot check credentials right now"),
        "503 says why: {}",
        r.body_str()
    );
    for n in 0..20 {
        let who = ["bob", "carol", "dave"][n % 3];
        assert_unavailable(&get_as(&p, &o, who, "any-pw").await, "still down");
        // Not a 407 for a wrong password either: nobody can tell.
        assert_eq!(
            get_as(&p, &o, "alice", "a-pw").await.status,
            200,
            "cached alice goes on"
        );
        if n == 10 {
            // Past the once-a-second retry: the directory is asked again.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }
    let err = p.stderr();
    assert_eq!(err.matches("failing closed").count(), 1, "one line per episode:\n{err}");
    assert!(err.contains(&d.url()), "the log names the directory:\n{err}");
    // The directory comes back: the episode ends (once) and bob gets in.
    d.restart().await;
    let started = Instant::now();
    loop {
        let r = get_as(&p, &o, "bob", "b-pw").await;
        if r.status == 200 {
            break;
        }
        assert_unavailable(&r, "until the retry");
        assert!(started.elapsed() < Duration::from_secs(5), "bob not let in again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let err = p.stderr();
    assert_eq!(err.matches("authentication resumed").count(), 1, "{err}");
    assert_eq!(err.matches("failing closed").count(), 1, "{err}");
}

/// SIGSTOP: slapd keeps its sockets (connections are accepted by the
/// kernel) but never answers. The operation timeout turns that into a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_directory_times_out_with_503_not_a_hang() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let p = proxy(
        "",
        &format!(
            "{}timeout = \"500ms\"\nconnect_timeout = \"500ms\"\n",
            search_settings(&d.url())
        ),
        "",
    )
    .await;
    // One login leaves a pooled connection; the next one uses it.
    assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 200);
    d.signal(libc::SIGSTOP);
    let started = Instant::now();
    let r = get_as(&p, &o, "bob", "b-pw").await;
    let took = started.elapsed();
    d.signal(libc::SIGCONT);
    assert_unavailable(&r, "stalled directory");
    assert!(took < Duration::from_secs(3), "answered in {took:?}, not held");
    assert!(
        took >= Duration::from_millis(400),
        "the timeout was waited for: {took:?}"
    );
    let err = p.stderr();
    assert!(err.contains("auth.ldap.timeout"), "{err}");
    // Answering again, bob gets in (after the once-a-second retry).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = get_as(&p, &o, "bob", "b-pw").await;
    assert_eq!(r.status, 200, "after SIGCONT: {}", r.body_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_service_password_is_a_503_not_a_407() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let p = proxy(
        "",
        &format!(
            "url = \"{}\"\nbind_dn = \"{SERVICE_DN}\"\nbind_password = \"not-the-password\"\nbase_dn = \"{BASE}\"\n",
            d.url()
        ),
        "",
    )
    .await;
    for _ in 0..3 {
        assert_unavailable(&get_as(&p, &o, "alice", "a-pw").await, "service bind refused");
    }
    let err = p.stderr();
    assert_eq!(err.matches("failing closed").count(), 1, "{err}");
    assert!(
        err.contains("invalidCredentials") && err.contains("auth.ldap.bind_dn"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_users_through_a_hundred_entry_cache() {
    if !have_slapd() {
        return;
    }
    let mut ldif = String::new();
    for i in 0..1000 {
        ldif.push_str(&slapd::user_ldif(&format!("u{i}"), &format!("pw{i}")));
    }
    let d = Slapd::start(&ldif).await;
    let o = origin().await;
    let p = proxy("max_users = 100", &search_settings(&d.url()), "").await;
    let addr = p.addr();
    let url = o.url();
    let host = o.addr();
    // Four clients at once, as the pool has four connections.
    let mut tasks = Vec::new();
    for t in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for i in (t..1000).step_by(4) {
                let req = format!(
                    "GET {url}/x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nProxy-Authorization: {}\r\n\r\n",
                    basic(&format!("u{i}"), &format!("pw{i}"))
                );
                statuses.push(parse_response(&raw_request(addr, req.as_bytes()).await).status);
            }
            statuses
        }));
    }
    for t in tasks {
        let statuses = t.await.expect("client task");
        assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    }
    assert_eq!(metric(&p, "portico_auth_cache_misses_total").await, 1000.0);
    assert_eq!(metric(&p, "portico_auth_cache_evictions_total").await, 900.0);
    assert_eq!(metric(&p, "portico_auth_cache_users").await, 100.0);
    assert_eq!(metric(&p, "portico_auth_verify_seconds_count").await, 1000.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_with_and_without_credentials_and_a_curl_407_exchange() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let ports = format!("[proxy]\nconnect_ports = [{}]\n", o.addr().port());
    let p = proxy("required = true", &search_settings(&d.url()), &ports).await;
    let target = o.addr().to_string();
    let (head, _s) = connect_tunnel(p.addr(), &target, "").await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("proxy-authenticate: basic realm="),
        "{head}"
    );
    let (head, _s) = connect_tunnel(
        p.addr(),
        &target,
        &format!("Proxy-Authorization: {}\r\n", basic("alice", "wrong")),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    let (head, _s) = connect_tunnel(
        p.addr(),
        &target,
        &format!("Proxy-Authorization: {}\r\n", basic("alice", "a-pw")),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // A browser-style exchange: --proxy-anyauth asks first without
    // credentials, reads the 407's challenge and retries with Basic.
    let proxy_url = format!("http://{}", p.addr());
    let url = format!("{}/x", o.url());
    let out = curl(&[
        "-x",
        &proxy_url,
        "--proxy-anyauth",
        "--proxy-user",
        "bob:b-pw",
        "-w",
        "%{http_code}",
        &url,
    ])
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok200", "{out:?}");
    let out = curl(&[
        "-x",
        &proxy_url,
        "--proxy-user",
        "bob:wrong",
        "-w",
        "%{http_code}",
        "-o",
        "/dev/null",
        &url,
    ])
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "407");
}

/// StartTLS on ldap:// and ldaps://, each verified against the test CA:
/// with a CA that did not sign the directory's certificate (the system
/// roots), the connection is refused and the login is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_and_ldaps_verify_the_directory_certificate() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let ca = d.ca_file();
    let starttls = proxy(
        "",
        &format!(
            "{}starttls = true\nca_file = \"{}\"\n",
            search_settings(&d.url()),
            ca.display()
        ),
        "",
    )
    .await;
    let r = get_as(&starttls, &o, "alice", "a-pw").await;
    assert_eq!(r.status, 200, "StartTLS: {}", r.body_str());
    assert_challenge(
        &get_as(&starttls, &o, "alice", "wrong").await,
        "StartTLS, wrong password",
    );
    let ldaps = proxy(
        "",
        &format!("{}ca_file = \"{}\"\n", search_settings(&d.ldaps_url()), ca.display()),
        "",
    )
    .await;
    let r = get_as(&ldaps, &o, "bob", "b-pw").await;
    assert_eq!(r.status, 200, "ldaps: {}", r.body_str());
    for (what, ldap) in [
        ("ldaps", search_settings(&d.ldaps_url())),
        ("StartTLS", format!("{}starttls = true\n", search_settings(&d.url()))),
    ] {
        let untrusted = proxy("", &ldap, "").await;
        assert_unavailable(
            &get_as(&untrusted, &o, "bob", "b-pw").await,
            &format!("{what}, untrusted CA"),
        );
        let err = untrusted.stderr();
        assert!(err.to_lowercase().contains("certificate"), "{what}: {err}");
    }
}

/// `portico check` names file, line and key for mistakes in `[auth.ldap]`.
#[test]
fn check_explains_directory_mistakes() {
    let base = "[[listener]]\naddress = \"127.0.0.1:3128\"\n\n[auth]\n\n[auth.ldap]\n";
    for (extra, line, key, message) in [
        (
            "url = \"http://dir.example\"\nbase_dn = \"dc=x\"\n",
            7,
            "auth.ldap.url",
            "unknown scheme http://",
        ),
        (
            "url = \"ldap://dir.example:0\"\nbase_dn = \"dc=x\"\n",
            7,
            "auth.ldap.url",
            "port",
        ),
        (
            "url = \"ldap://dir.example\"\ndn_template = \"uid=%u,dc=x\"\n",
            8,
            "auth.ldap.dn_template",
            "{user}, not %u",
        ),
        ("url = \"ldap://dir.example\"\n", 6, "auth.ldap", "base_dn is needed"),
        (
            "url = \"ldaps://dir.example\"\nstarttls = true\nbase_dn = \"dc=x\"\n",
            8,
            "auth.ldap.starttls",
            "ldaps://",
        ),
        (
            "url = \"ldap://dir.example\"\nbase_dn = \"dc=x\"\nbind_dn = \"cn=svc,dc=x\"\n",
            9,
            "auth.ldap.bind_dn",
            "bind_password_file",
        ),
        (
            "url = \"ldap://dir.example\"\nbase_dn = \"dc=x\"\nuser_filter = \"uid={user}\"\n",
            9,
            "auth.ldap.user_filter",
            "parentheses",
        ),
        (
            "url = \"ldap://dir.example\"\nbase_dn = \"dc=x\"\ngroup_base = \"dc=x\"\ngroup_filter = \"(cn=staff)\"\n",
            10,
            "auth.ldap.group_filter",
            "same groups",
        ),
        ("base_dn = \"dc=x\"\n", 6, "auth.ldap", "need url"),
    ] {
        let config = format!("{base}{extra}");
        let out = Portico::check(&config);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted:\n{config}");
        assert!(
            err.contains(&format!("portico.toml:{line}: key `{key}`: ")),
            "want line {line} and key `{key}` in: {err}\n{config}"
        );
        assert!(err.contains(message), "want {message:?} in: {err}");
    }
    // And a good one passes.
    let ok = format!("{base}url = \"ldaps://dir.example\"\nbase_dn = \"dc=x\"\n");
    let out = Portico::check(&ok);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A rotated service password: the directory's and the file's change,
/// SIGHUP re-reads the file; a file that cannot be read at a SIGHUP keeps
/// the previous password in use and refuses the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_service_password_file() {
    if !have_slapd() {
        return;
    }
    let d = Slapd::start(&people()).await;
    let o = origin().await;
    let p = proxy("", &search_settings(&d.url()), "").await;
    assert_eq!(get_as(&p, &o, "alice", "a-pw").await.status, 200);
    d.ldap_tool(
        "ldapmodify",
        &format!("dn: {SERVICE_DN}\nchangetype: modify\nreplace: userPassword\nuserPassword: rotated\n"),
    );
    // The old password no longer binds: the directory refuses the service account.
    assert_unavailable(&get_as(&p, &o, "bob", "b-pw").await, "old service password");
    std::fs::write(&p.secret, "rotated\n").expect("write the new secret");
    p.signal(libc::SIGHUP);
    let started = Instant::now();
    loop {
        let r = get_as(&p, &o, "bob", "b-pw").await;
        if r.status == 200 {
            break;
        }
        assert_unavailable(&r, "until the reload and the retry");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the new secret was not used:\n{}",
            p.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Gone at the next SIGHUP: said so, the reload refused, the
    // password read before still in use.
    std::fs::remove_file(&p.secret).expect("remove the secret");
    p.signal(libc::SIGHUP);
    let started = Instant::now();
    while !p.stderr().contains("still running on the previous config") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no refused reload:\n{}",
            p.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = p.stderr();
    assert!(
        err.contains("bind_password_file") && err.contains("previous service password stays in use"),
        "{err}"
    );
    assert_eq!(get_as(&p, &o, "carol", "c-pw").await.status, 200);
}
