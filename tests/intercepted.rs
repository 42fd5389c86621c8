//! A transparent listener behind the kernel's NAT, as it is deployed: in a
//! network namespace of the test's own (root only; nothing outside it is
//! touched), an nftables rule redirects the client's connections to port
//! 80 (or 443, to a TLS listener) to Portico's transparent listener. A request there must name where
//! its client was connecting (CVE-2009-0801, Squid's
//! `host_verify_strict`): otherwise a page could have the proxy fetch any
//! host its browser may not reach, past the same-origin policy.
//!
//! The namespace belongs to one thread, which runs the whole test (origins,
//! the DNS server, Portico started from it, the clients) on a runtime of its
//! own: a network namespace is a property of a thread, inherited by what it
//! starts.

mod common;

use common::*;
use std::net::{IpAddr, SocketAddr};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `args[0]` with the rest, which must succeed.
fn run(args: &[&str]) {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e} (scripts/install-test-deps installs it)"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `body` on a thread moved into a new network namespace with its
/// loopback up and `addresses` on it, where the nftables `rules` are
/// loaded; a panic in it fails the test.
fn in_own_network<F, Fut>(addresses: &[&str], rules: impl FnOnce() -> String + Send + 'static, body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let addresses: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
    let thread = std::thread::spawn(move || {
        // SAFETY: unshare takes flags only; CLONE_NEWNET moves this thread
        // alone (not the test process) into a new network namespace.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        run(&["ip", "link", "set", "lo", "up"]);
        for a in &addresses {
            if a.contains(':') {
                run(&["ip", "-6", "addr", "add", a, "dev", "lo", "nodad"]);
            } else {
                run(&["ip", "addr", "add", a, "dev", "lo"]);
            }
        }
        let rules_file = tempfile::NamedTempFile::new().expect("rules file");
        std::fs::write(rules_file.path(), rules()).expect("write rules");
        run(&["nft", "-f", &rules_file.path().display().to_string()]);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(body());
    });
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// The site the client connects to, and a host it may not reach itself.
const SITE: &str = "192.0.2.7";
const INTRANET: &str = "192.0.2.9";
/// The client whose connections are redirected (Portico's own, from the
/// site's address, are not).
const CLIENT: &str = "127.0.0.2";
/// The same over IPv6.
const SITE6: &str = "2001:db8::7";
const INTRANET6: &str = "2001:db8::9";
const CLIENT6: &str = "2001:db8::2";

/// `request` sent from `from` to `to`, and the response.
async fn ask(from: &str, to: SocketAddr, request: &str) -> ParsedResponse {
    let mut c = RawClient::connect_from(from.parse::<IpAddr>().expect("ip"), to).await;
    c.send(request.as_bytes()).await;
    c.read_response().await
}

#[test]
fn a_redirected_request_must_name_the_address_its_client_was_connecting_to() {
    if !is_root() {
        eprintln!("skipped: not root, so no network namespace of the test's own");
        return;
    }
    // The listeners' ports, picked inside the namespace as the rules are
    // written.
    let ports = std::sync::Arc::new(std::sync::OnceLock::<(u16, u16)>::new());
    let rule_ports = ports.clone();
    in_own_network(
        &[
            &format!("{SITE}/32"),
            &format!("{INTRANET}/32"),
            &format!("{SITE6}/128"),
            &format!("{INTRANET6}/128"),
            &format!("{CLIENT6}/128"),
        ],
        move || {
            let (p4, p6) = *rule_ports.get_or_init(|| (free_port(), free_port()));
            format!(
                "table ip portico_test {{\n  chain out {{\n    type nat hook output priority -100;\n    \
                 ip saddr {CLIENT} tcp dport 80 redirect to :{p4}\n  }}\n}}\n\
                 table ip6 portico_test {{\n  chain out {{\n    type nat hook output priority -100;\n    \
                 ip6 saddr {CLIENT6} tcp dport 80 redirect to :{p6}\n  }}\n}}\n"
            )
        },
        move || async move {
            let _site = Origin::start_on(format!("{SITE}:80").parse().expect("addr"), |_req| async {
                Response::ok("the site").header("Cache-Control", "max-age=600")
            })
            .await;
            let intranet = Origin::start_on(format!("{INTRANET}:80").parse().expect("addr"), |_req| async {
                Response::ok("the intranet's secret").header("Cache-Control", "max-age=600")
            })
            .await;
            let _site6 = Origin::start_on(format!("[{SITE6}]:80").parse().expect("addr"), |_req| async {
                Response::ok("the site over IPv6")
            })
            .await;
            let intranet6 = Origin::start_on(format!("[{INTRANET6}]:80").parse().expect("addr"), |_req| async {
                Response::ok("the intranet's secret over IPv6")
            })
            .await;
            let dns = DnsServer::start();
            dns.add("www.example", SITE.parse().expect("ip"), 60);
            dns.add("intranet.example", INTRANET.parse().expect("ip"), 60);
            // A name its owner points at both (the intranet first): it
            // passes the check, and must be fetched from the site alone.
            dns.add("rebind.example", INTRANET.parse().expect("ip"), 0);
            dns.add("rebind.example", SITE.parse().expect("ip"), 0);
            dns.add("www6.example", SITE6.parse().expect("ip"), 60);
            dns.add("intranet6.example", INTRANET6.parse().expect("ip"), 60);
            let (p4, p6) = *ports.get().expect("picked with the rules");
            let p = Portico::start(&format!(
                "[[listener]]\naddress = \"127.0.0.1:{p4}\"\nmode = \"transparent\"\nh2c = true\n\n\
                 [[listener]]\naddress = \"[::1]:{p6}\"\nmode = \"transparent\"\n\n\
                 [access]\nallow = [\"127.0.0.0/8\", \"2001:db8::/32\"]\n\n\
                 [log]\naccess = \"{{dir}}/access.log\"\n\n\
                 [origin]\nnameservers = [\"{}\"]\n",
                dns.addr()
            ))
            .await;
            let redirected: SocketAddr = format!("{SITE}:80").parse().expect("addr");
            let get = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");

            // Naming the site, by name or address: served.
            for host in ["www.example", SITE, "www.example:80"] {
                let resp = ask(CLIENT, redirected, &get(host)).await;
                assert_eq!(
                    (resp.status, resp.body_str().as_str()),
                    (200, "the site"),
                    "Host: {host}"
                );
            }
            let resp = ask(CLIENT, redirected, &get("rebind.example")).await;
            assert_eq!(
                (resp.status, resp.body_str().as_str()),
                (200, "the site"),
                "rebind.example"
            );

            // Naming another host, another address, another port, or
            // another host in an absolute URI: 409, nothing fetched.
            for request in [
                get("intranet.example"),
                get(INTRANET),
                get("www.example:8080"),
                get("nowhere.example"),
                format!("GET http://intranet.example/ HTTP/1.1\r\nHost: {SITE}\r\n\r\n"),
            ] {
                let resp = ask(CLIENT, redirected, &request).await;
                assert_eq!(resp.status, 409, "{request}: {}", resp.body_str());
                assert!(resp.body_str().contains(SITE), "says where: {}", resp.body_str());
            }
            assert_eq!(intranet.count(), 0, "the intranet was never asked");
            assert!(
                p.stderr().contains("its redirected connection was to"),
                "{}",
                p.stderr()
            );
            let refused = "\"GET http://intranet.example/ HTTP/1.1\" 409 ";
            let log = access_log_with(p.dir(), refused).await;
            assert!(log.contains(refused), "{log}");

            // And over HTTP/2 (prior knowledge): its `:authority`.
            // (curl runs while this thread's runtime serves the origins.)
            let curl = |authority: &str| {
                let mut cmd = tokio::process::Command::new("curl");
                cmd.args([
                    "-s",
                    "--http2-prior-knowledge",
                    "--interface",
                    CLIENT,
                    "-o",
                    "-",
                    "-w",
                    "\n%{http_code}",
                ])
                .args(["-H", &format!("Host: {authority}"), &format!("http://{SITE}/")]);
                async move { String::from_utf8_lossy(&cmd.output().await.expect("curl").stdout).into_owned() }
            };
            assert_eq!(curl("www.example").await, "the site\n200");
            let refused = curl("intranet.example").await;
            assert!(refused.ends_with("\n409"), "{refused}");
            assert_eq!(intranet.count(), 0, "the intranet was never asked over HTTP/2");

            // The same over IPv6.
            let redirected6: SocketAddr = format!("[{SITE6}]:80").parse().expect("addr");
            let resp = ask(CLIENT6, redirected6, &get("www6.example")).await;
            assert_eq!((resp.status, resp.body_str().as_str()), (200, "the site over IPv6"));
            for host in ["intranet6.example", &format!("[{INTRANET6}]")] {
                let resp = ask(CLIENT6, redirected6, &get(host)).await;
                assert_eq!(resp.status, 409, "Host: {host}: {}", resp.body_str());
            }
            assert_eq!(intranet6.count(), 0, "the intranet was never asked over IPv6");

            // A client that connects to the listener's own address chose
            // the proxy: its Host routes the request, as a forward
            // listener's URL does.
            let resp = ask("127.0.0.1", p.addr(), &get("intranet.example")).await;
            assert_eq!((resp.status, resp.body_str().as_str()), (200, "the intranet's secret"));
        },
    );
}

/// A client's TLS connection to port 443, redirected to a transparent
/// listener that holds a certificate for the name it asks for: the client
/// was speaking `https` to its origin, so its requests are fetched as
/// `https` from where it was connecting (port 443), never as `http` from
/// port 80, whose service may be another and whose leg is cleartext.
#[test]
fn a_redirected_tls_connection_is_fetched_over_https_from_where_its_client_was_connecting() {
    if !is_root() {
        eprintln!("skipped: not root, so no network namespace of the test's own");
        return;
    }
    let port = std::sync::Arc::new(std::sync::OnceLock::<u16>::new());
    let rule_port = port.clone();
    in_own_network(
        &[&format!("{SITE}/32"), &format!("{INTRANET}/32")],
        move || {
            let p = *rule_port.get_or_init(free_port);
            format!(
                "table ip portico_test {{\n  chain out {{\n    type nat hook output priority -100;\n    \
                 ip saddr {CLIENT} tcp dport 443 redirect to :{p}\n  }}\n}}\n"
            )
        },
        move || async move {
            let tls_site = Origin::start_tls_on(
                format!("{SITE}:443").parse().expect("addr"),
                &["www.example"],
                |_req| async { Response::ok("the site over TLS") },
            )
            .await;
            // The same address's cleartext service: where a downgraded
            // fetch would go.
            let plain_site = Origin::start_on(format!("{SITE}:80").parse().expect("addr"), |_req| async {
                Response::ok("the site's port 80")
            })
            .await;
            let intranet = Origin::start_tls_on(
                format!("{INTRANET}:443").parse().expect("addr"),
                &["intranet.example"],
                |_req| async { Response::ok("the intranet's secret") },
            )
            .await;
            let dns = DnsServer::start();
            dns.add("www.example", SITE.parse().expect("ip"), 60);
            dns.add("intranet.example", INTRANET.parse().expect("ip"), 60);
            let dir = tempfile::tempdir().expect("dir");
            let pem = Pem::new(dir.path(), "portico", &["www.example", "intranet.example"]);
            // The origins' self-signed certificates, trusted by Portico.
            let trusted = dir.path().join("origins.pem");
            let cas = [tls_site.ca_pem_path(), intranet.ca_pem_path()]
                .map(|p| std::fs::read_to_string(p).expect("origin CA"))
                .concat();
            std::fs::write(&trusted, cas).expect("write origins' CAs");
            let p = Portico::start(&format!(
                "[[listener]]\naddress = \"127.0.0.1:{}\"\nmode = \"transparent\"\n{}\n\
                 [access]\nallow = [\"127.0.0.0/8\"]\n\n\
                 [origin]\nnameservers = [\"{}\"]\nca_file = \"{}\"\nsystem_roots = false\n",
                port.get().expect("picked with the rules"),
                cert_table(&pem),
                dns.addr(),
                trusted.display()
            ))
            .await;
            // curl resolves the names itself (--resolve), then connects to
            // the site's address on 443: redirected to Portico.
            let curl = |version: &str, extra: &[&str]| {
                let mut cmd = tokio::process::Command::new("curl");
                cmd.args(["-s", version, "--interface", CLIENT, "--cacert"])
                    .arg(&pem.cert)
                    .args(["--resolve", &format!("www.example:443:{SITE}")])
                    .args(["--resolve", &format!("intranet.example:443:{SITE}")])
                    .args(["-o", "-", "-w", "\n%{http_code}"])
                    .args(extra);
                async move { String::from_utf8_lossy(&cmd.output().await.expect("curl").stdout).into_owned() }
            };
            for version in ["--http1.1", "--http2"] {
                // The site, its port left out or written (curl leaves the
                // default port out of Host, so it is set here).
                for extra in [
                    &["https://www.example/"][..],
                    &["-H", "Host: www.example:443", "https://www.example/x"],
                ] {
                    let answer = curl(version, extra).await;
                    assert_eq!(answer, "the site over TLS\n200", "{version} {extra:?}");
                }
                // A name the redirected address is not, another port, or an
                // http URL (port 80, in cleartext): refused, nothing fetched.
                for extra in [
                    &["https://intranet.example/"][..],
                    &["-H", "Host: www.example:80", "https://www.example/"],
                ] {
                    let refused = curl(version, extra).await;
                    assert!(refused.ends_with("\n409"), "{version} {extra:?}: {refused}");
                }
            }
            let refused = curl(
                "--http1.1",
                &["--request-target", "http://www.example/", "https://www.example/"],
            )
            .await;
            assert!(refused.ends_with("\n409"), "absolute http URL: {refused}");
            assert_eq!(plain_site.count(), 0, "nothing fetched from port 80");
            assert_eq!(intranet.count(), 0, "the intranet was never asked");
            assert_eq!(tls_site.count(), 4);
            drop(p);
        },
    );
}
