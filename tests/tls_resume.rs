//! TLS session resumption (`[tls]`): `openssl s_client -sess_out` then
//! `-sess_in` resumes TLS 1.2 (ticket, or session ID from the cache) and
//! TLS 1.3 (PSK ticket) sessions; with `processes = 2` a ticket resumes on
//! whichever worker accepts the connection; the counters tell full from
//! resumed handshakes in every view; tickets and cache off means no
//! resumption; a forged ticket or another server's gets a full handshake,
//! not a failure; ticket keys rotate and an older ticket still resumes
//! within `session_timeout`, then falls back to a full handshake.

mod common;

use common::{Pem, Portico, free_port, metric, page};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A config with a plain listener (statistics are read there) on
/// `plain`, a TLS one on `port`, and `extra` appended.
fn config(plain: u16, port: u16, pem: &Pem, extra: &str) -> String {
    format!(
        "[[listener]]\naddress = \"127.0.0.1:{plain}\"\nmode = \"forward\"\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nmode = \"forward\"\n\n[[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n\n{extra}",
        pem.cert.display(),
        pem.key.display()
    )
}

/// Waits until the /metrics series `series` is exactly `n` (the workers'
/// figures reach the sum once a second); panics with the page otherwise.
async fn wait_metric(p: &Portico, series: &str, n: u64) {
    for _ in 0..100 {
        if metric(p, series).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{series} never became {n}:\n{}", page(p, "/metrics").await);
}

/// The harness's start-up probe connects to every listener and closes
/// without a handshake: one failed handshake (`other`) before any test's.
const PROBE_FAILURES: &str = "portico_tls_handshake_failures_total{reason=\"other\"}";

const FULL: &str = "portico_tls_handshakes_by_kind_total{kind=\"full\"}";
const RESUMED: &str = "portico_tls_handshakes_by_kind_total{kind=\"resumed\"}";

/// What one `openssl s_client` connection saw.
struct Conn {
    /// s_client said `Reused` (not `New`).
    reused: bool,
    /// The HTTP response came back: the connection worked.
    served: bool,
    out: String,
}

/// One `openssl s_client` connection to `port` with TLS `version`
/// ("1.2" or "1.3"), SNI www.test, reading its session from `sess_in`
/// and writing the one it ends with to `sess_out`; it sends a request and
/// reads the answer to the end (TLS 1.3 tickets come after the handshake).
fn s_client(port: u16, version: &str, sess_in: Option<&Path>, sess_out: Option<&Path>, extra: &[&str]) -> Conn {
    let connect = format!("127.0.0.1:{port}");
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &connect, "-servername", "www.test", "-ign_eof"]);
    cmd.arg(if version == "1.2" { "-tls1_2" } else { "-tls1_3" });
    if let Some(f) = sess_in {
        cmd.arg("-sess_in").arg(f);
    }
    if let Some(f) = sess_out {
        cmd.arg("-sess_out").arg(f);
    }
    cmd.args(extra);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openssl s_client (is openssl installed?)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"GET /.perf HTTP/1.1\r\nHost: www.test\r\nConnection: close\r\n\r\n")
        .expect("send the request");
    let out = child.wait_with_output().expect("s_client output");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let reused = text.contains(&format!("Reused, TLSv{version}"));
    let new = text.contains(&format!("New, TLSv{version}"));
    assert!(reused || new, "s_client made no TLSv{version} connection:\n{text}");
    Conn {
        reused,
        served: text.contains("HTTP/1.1 200"),
        out: text,
    }
}

/// [`s_client`] off the runtime's threads.
async fn connect(
    port: u16,
    version: &'static str,
    sess_in: Option<PathBuf>,
    sess_out: Option<PathBuf>,
    extra: &'static [&'static str],
) -> Conn {
    tokio::task::spawn_blocking(move || s_client(port, version, sess_in.as_deref(), sess_out.as_deref(), extra))
        .await
        .expect("s_client task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_resumes_tls_1_2_and_1_3_sessions_and_every_view_counts_full_and_resumed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let p = Portico::start(&config(free_port(), port, &pem, "")).await;
    let sess = dir.path().join("session.pem");
    for version in ["1.2", "1.3"] {
        let first = connect(port, version, None, Some(sess.clone()), &[]).await;
        assert!(!first.reused && first.served, "{}\n{}", first.out, p.stderr());
        let again = connect(port, version, Some(sess.clone()), None, &[]).await;
        assert!(
            again.reused && again.served,
            "TLS {version} did not resume:\n{}",
            again.out
        );
    }
    // TLS 1.2 without tickets: the session ID, from the session cache.
    let first = connect(port, "1.2", None, Some(sess.clone()), &["-no_ticket"]).await;
    assert!(!first.reused);
    let again = connect(port, "1.2", Some(sess.clone()), None, &["-no_ticket"]).await;
    assert!(
        again.reused,
        "the cached TLS 1.2 session did not resume:\n{}",
        again.out
    );

    assert_eq!(metric(&p, FULL).await, 3);
    assert_eq!(metric(&p, RESUMED).await, 3);
    assert_eq!(metric(&p, "portico_tls_handshakes_total").await, 6);
    assert_eq!(metric(&p, "portico_tls_session_cache_hits_total").await, 1);
    assert!(metric(&p, "portico_tls_tickets_issued_total").await >= 3);
    assert_eq!(metric(&p, "portico_tls_tickets_refused_total").await, 0);
    assert!(metric(&p, "portico_tls_session_cache_entries").await >= 1);
    assert_eq!(metric(&p, "portico_tls_session_cache_limit").await, 10_000);
    let perf = page(&p, "/.perf").await;
    assert!(perf.contains("3 full, 3 resumed (50.00% resumed)"), "{perf}");
    assert!(perf.contains("Session Cache Lookups"), "{perf}");
    let xml = page(&p, "/stats-xml").await;
    assert!(
        xml.contains("countResumedHandshakes=\"3\"") && xml.contains("countFullHandshakes=\"3\""),
        "{xml}"
    );
    let json: serde_json::Value = serde_json::from_str(&page(&p, "/.stats.json").await).expect("JSON");
    let tls = &json["snapshot"]["tls"];
    assert_eq!(
        (tls["full"].as_u64(), tls["resumed"].as_u64()),
        (Some(3), Some(3)),
        "{tls}"
    );
    assert_eq!(tls["session_cache_hits"].as_u64(), Some(1), "{tls}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_worker_processes_every_connection_after_the_first_resumes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let p = Portico::start(&config(
        free_port(),
        port,
        &pem,
        "[server]\nprocesses = 2\nworkers = 1\n",
    ))
    .await;
    let sess = dir.path().join("session.pem");
    const N: u64 = 16;
    for (i, version) in ["1.2", "1.3"].into_iter().enumerate() {
        let first = connect(port, version, None, Some(sess.clone()), &[]).await;
        assert!(!first.reused && first.served, "{}\n{}", first.out, p.stderr());
        // New connections, spread over the two workers by the kernel
        // (SO_REUSEPORT hashes each one's source port): all resume.
        for n in 0..N {
            let c = connect(port, version, Some(sess.clone()), None, &[]).await;
            assert!(
                c.reused && c.served,
                "TLS {version} connection {n} after the first did not resume:\n{}",
                c.out
            );
        }
        wait_metric(&p, FULL, i as u64 + 1).await;
        wait_metric(&p, RESUMED, N * (i as u64 + 1)).await;
    }
    // Both workers resumed sessions: so one of them opened tickets the
    // other sealed (the first, full, handshake was on one worker only).
    for w in 0..2 {
        let json: serde_json::Value =
            serde_json::from_str(&page(&p, &format!("/.stats.json?worker={w}")).await).expect("JSON");
        let resumed = json["snapshot"]["tls"]["resumed"].as_u64().unwrap_or(0);
        assert!(resumed > 0, "worker {w} resumed nothing: {}", json["snapshot"]["tls"]);
    }
    // The keys' seed (and the config) reached each worker in memory it
    // inherited, named by a descriptor number: never through a file, which
    // a worker starting as root would read where another user could have
    // put it.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", p.pid())).expect("children");
    let workers: Vec<&str> = children.split_whitespace().collect();
    assert_eq!(workers.len(), 2, "{children:?}");
    for w in workers {
        let environ = std::fs::read(format!("/proc/{w}/environ")).expect("environ");
        for var in ["PORTICO_TICKET_SEED", "PORTICO_CONFIG_FD"] {
            let value = environ
                .split(|b| *b == 0)
                .filter_map(|kv| std::str::from_utf8(kv).ok())
                .find_map(|kv| kv.strip_prefix(&format!("{var}=")).map(str::to_string))
                .unwrap_or_else(|| panic!("worker {w} has no {var}"));
            assert!(value.parse::<u32>().is_ok(), "worker {w}: {var}={value}");
        }
        // Read, and closed: no worker keeps the seed or the config text.
        let held: Vec<String> = std::fs::read_dir(format!("/proc/{w}/fd"))
            .expect("fds")
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .map(|l| l.display().to_string())
            .filter(|l| l.starts_with("/memfd:portico-config") || l.starts_with("/memfd:portico-ticket-seed"))
            .collect();
        assert!(held.is_empty(), "worker {w} holds {held:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tickets_two_workers_resume_only_sessions_their_own_cache_holds() {
    // The control for the test above: session IDs live in each worker's
    // own cache, so some connections land on the worker that does not
    // have the session and get a full handshake.
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let p = Portico::start(&config(
        free_port(),
        port,
        &pem,
        "[server]\nprocesses = 2\nworkers = 1\n\n[tls]\nsession_tickets = false\n",
    ))
    .await;
    let sess = dir.path().join("session.pem");
    let first = connect(port, "1.2", None, Some(sess.clone()), &[]).await;
    assert!(!first.reused && first.served, "{}\n{}", first.out, p.stderr());
    let mut reused = 0;
    for _ in 0..20 {
        if connect(port, "1.2", Some(sess.clone()), None, &[]).await.reused {
            reused += 1;
        }
    }
    assert!(
        reused < 20,
        "every connection resumed: the workers shared no cache, so one served all"
    );
    assert!(reused > 0, "no connection reached the worker holding the session");
    wait_metric(&p, "portico_tls_tickets_issued_total", 0).await;
    wait_metric(&p, "portico_tls_tickets_enabled", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tickets_and_the_cache_off_nothing_resumes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let p = Portico::start(&config(
        free_port(),
        port,
        &pem,
        "[tls]\nsession_tickets = false\nsession_cache_entries = 0\n",
    ))
    .await;
    // The server gave neither a session ID nor a ticket: s_client, which
    // saves a session only when it can be resumed, has none to save (it
    // does with the defaults: see the first test).
    for version in ["1.2", "1.3"] {
        let sess = dir.path().join(format!("session-{version}.pem"));
        let c = connect(port, version, None, Some(sess.clone()), &[]).await;
        assert!(c.served && !c.reused, "{}\n{}", c.out, p.stderr());
        assert!(
            !sess.exists(),
            "TLS {version}: the server gave a resumable session:\n{}",
            c.out
        );
        assert!(!c.out.contains("TLS session ticket:"), "{}", c.out);
    }
    assert_eq!(metric(&p, RESUMED).await, 0);
    assert_eq!(metric(&p, FULL).await, 2);
    assert_eq!(metric(&p, "portico_tls_tickets_issued_total").await, 0);
}

/// The session ticket in an s_client session file (`openssl sess_id`).
fn ticket_of(sess: &Path) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(["sess_id", "-noout", "-text", "-in"])
        .arg(sess)
        .output()
        .expect("openssl sess_id");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = text
        .find("TLS session ticket:")
        .unwrap_or_else(|| panic!("no ticket in the session:\n{text}"));
    let mut bytes = Vec::new();
    // Lines like `0000 - 00 01 ... 0f   ................`.
    for line in text[start..].lines().skip(1) {
        let Some((offset, rest)) = line.trim().split_once(" - ") else {
            break;
        };
        if offset.len() != 4 || !offset.bytes().all(|b| b.is_ascii_hexdigit()) {
            break;
        }
        let hex = rest.get(..48).unwrap_or(rest).replace('-', " ");
        bytes.extend(hex.split_whitespace().filter_map(|h| u8::from_str_radix(h, 16).ok()));
    }
    bytes
}

/// Rewrites the session file with one bit of its ticket flipped (in the
/// sealed part: a forgery the server must not open).
fn forge(sess: &Path) {
    use base64::Engine as _;
    let ticket = ticket_of(sess);
    assert!(ticket.len() > 40, "ticket too short: {ticket:?}");
    let pem = std::fs::read_to_string(sess).expect("read session");
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let mut der = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    let at = der
        .windows(ticket.len())
        .position(|w| w == ticket.as_slice())
        .expect("the ticket in the session's DER");
    der[at + 30] ^= 0x01;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
    let mut out = String::from("-----BEGIN SSL SESSION PARAMETERS-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END SSL SESSION PARAMETERS-----\n");
    std::fs::write(sess, out).expect("write forged session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_ticket_or_another_server_s_gets_a_full_handshake_not_a_failure() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let (plain, port) = (free_port(), free_port());
    let cfg = config(plain, port, &pem, "");
    let p = Portico::start(&cfg).await;
    wait_metric(&p, PROBE_FAILURES, 1).await;
    for version in ["1.2", "1.3"] {
        let sess = dir.path().join(format!("forged-{version}.pem"));
        let first = connect(port, version, None, Some(sess.clone()), &[]).await;
        assert!(first.served, "{}\n{}", first.out, p.stderr());
        forge(&sess);
        let forged = connect(port, version, Some(sess.clone()), None, &[]).await;
        assert!(
            !forged.reused && forged.served,
            "TLS {version}: a forged ticket {}:\n{}",
            if forged.reused {
                "resumed"
            } else {
                "broke the connection"
            },
            forged.out
        );
    }
    assert_eq!(metric(&p, "portico_tls_tickets_refused_total").await, 2);
    assert_eq!(metric(&p, RESUMED).await, 0);
    assert_eq!(metric(&p, FULL).await, 4);
    for reason in ["protocol", "certificate", "timeout"] {
        let series = format!("portico_tls_handshake_failures_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&p, &series).await, 0, "{reason}");
    }
    assert_eq!(metric(&p, PROBE_FAILURES).await, 1);
    // A ticket from before a restart (new keys): a full handshake too.
    let sess = dir.path().join("before-restart.pem");
    let first = connect(port, "1.3", None, Some(sess.clone()), &[]).await;
    assert!(first.served);
    drop(p);
    let p = Portico::start(&cfg).await;
    let after = connect(port, "1.3", Some(sess.clone()), None, &[]).await;
    assert!(!after.reused && after.served, "{}", after.out);
    assert_eq!(metric(&p, "portico_tls_tickets_refused_total").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_keys_rotate_and_an_older_ticket_resumes_within_the_session_timeout() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let p = Portico::start(&config(
        free_port(),
        port,
        &pem,
        "[tls]\nsession_ticket_rotation = \"1s\"\nsession_timeout = \"4s\"\n",
    ))
    .await;
    wait_metric(&p, PROBE_FAILURES, 1).await;
    let old = dir.path().join("old.pem");
    let newer = dir.path().join("newer.pem");
    let first = connect(port, "1.3", None, Some(old.clone()), &[]).await;
    assert!(first.served, "{}\n{}", first.out, p.stderr());
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    // Two rotations later the old ticket still resumes (its key is kept
    // while a ticket it sealed can be younger than session_timeout), and
    // the tickets issued now are sealed with a newer key: their first 8
    // bytes are the key's period.
    let again = connect(port, "1.3", Some(old.clone()), Some(newer.clone()), &[]).await;
    assert!(again.reused && again.served, "{}", again.out);
    let period = |t: Vec<u8>| u64::from_be_bytes(t[..8].try_into().expect("8 bytes"));
    let (p_old, p_new) = (period(ticket_of(&old)), period(ticket_of(&newer)));
    assert!(p_new >= p_old + 2, "no rotation: periods {p_old} then {p_new}");
    // Past the timeout: a full handshake, cleanly.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let late = connect(port, "1.3", Some(old.clone()), None, &[]).await;
    assert!(!late.reused && late.served, "{}", late.out);
    assert_eq!(metric(&p, RESUMED).await, 1);
    assert_eq!(metric(&p, FULL).await, 2);
    assert_eq!(metric(&p, PROBE_FAILURES).await, 1);
}

/// Worker `i`'s pid from the supervisor's log (`worker I started (pid N)`),
/// the latest start.
fn worker_pid(p: &Portico, i: usize) -> Option<u32> {
    let needle = format!("worker {i} started (pid ");
    p.stderr()
        .lines()
        .rev()
        .filter_map(|l| l.split_once(&needle).map(|(_, rest)| rest))
        .find_map(|rest| rest.split(')').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_opens_the_tickets_sealed_before_it_started() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    let port = free_port();
    let p = Portico::start(&config(
        free_port(),
        port,
        &pem,
        "[server]\nprocesses = 2\nworkers = 1\n",
    ))
    .await;
    let sess = dir.path().join("session.pem");
    let first = connect(port, "1.3", None, Some(sess.clone()), &[]).await;
    assert!(first.served, "{}\n{}", first.out, p.stderr());
    let victim = worker_pid(&p, 0).expect("worker 0's pid in the log");
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is a
    // worker of the Portico this test started.
    assert_eq!(unsafe { libc::kill(victim as i32, libc::SIGKILL) }, 0);
    // Its replacement is serving once its own figures are readable.
    let mut ready = false;
    for _ in 0..200 {
        let restarted = worker_pid(&p, 0).is_some_and(|pid| pid != victim);
        if restarted {
            let doc = page(&p, "/.stats.json?worker=0").await;
            if let Ok(json) = serde_json::from_str::<serde_json::Value>(&doc)
                && json["snapshot"]["server"]["pid"]
                    .as_u64()
                    .is_some_and(|pid| pid != u64::from(victim))
            {
                ready = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "worker 0 was not restarted:\n{}", p.stderr());
    for n in 0..16 {
        let c = connect(port, "1.3", Some(sess.clone()), None, &[]).await;
        assert!(c.reused && c.served, "connection {n} did not resume:\n{}", c.out);
    }
    // The new worker (its counters start at 0) resumed some of them: it
    // opened a ticket sealed before it existed.
    let mut resumed = 0;
    for _ in 0..50 {
        let json: serde_json::Value =
            serde_json::from_str(&page(&p, "/.stats.json?worker=0").await).unwrap_or_default();
        resumed = json["snapshot"]["tls"]["resumed"].as_u64().unwrap_or(0);
        if resumed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(resumed > 0, "the restarted worker resumed nothing");
}

/// The NewSessionTicket messages `s_client` reported.
fn tickets_in(out: &str) -> usize {
    out.matches("Post-Handshake New Session Ticket arrived").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tls_1_3_handshake_gets_two_tickets_and_a_resumed_one_gets_one() {
    // As OpenSSL's servers (nginx's) send them: the resumed client has a
    // ticket left from before for its next connection.
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = Pem::new(dir.path(), "www", &["www.test"]);
    for extra in ["", "[tls]\nsession_tickets = false\n"] {
        // With tickets, and with TLS 1.3 "tickets" that name sessions in
        // the session cache.
        let port = free_port();
        let p = Portico::start(&config(free_port(), port, &pem, extra)).await;
        let (one, two) = (dir.path().join("one.pem"), dir.path().join("two.pem"));
        let full = connect(port, "1.3", None, Some(one.clone()), &[]).await;
        assert!(!full.reused && full.served, "{}\n{}", full.out, p.stderr());
        assert_eq!(tickets_in(&full.out), 2, "{extra}: {}", full.out);
        let resumed = connect(port, "1.3", Some(one), Some(two.clone()), &[]).await;
        assert!(resumed.reused && resumed.served, "{extra}: {}", resumed.out);
        assert_eq!(tickets_in(&resumed.out), 1, "{extra}: {}", resumed.out);
        // That one ticket resumes in turn.
        let again = connect(port, "1.3", Some(two), None, &[]).await;
        assert!(again.reused, "{extra}: {}", again.out);
        if extra.is_empty() {
            assert_eq!(metric(&p, "portico_tls_tickets_issued_total").await, 4);
        }
        assert_eq!(metric(&p, RESUMED).await, 2);
    }
}
