//! `[proxy] deny_destinations` and `allow_destinations` through the real
//! binary: the addresses a client may not have Portico connect to (Squid's
//! `to_localhost` and `to_linklocal`), whatever the URL's spelling, the
//! name's answer or the way in (forward, transparent, `CONNECT`, SOCKS),
//! while the servers the configuration names stay reachable. Every target
//! is on loopback; names resolve through the test's own DNS server.

mod common;

use common::*;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An origin that answers everything with 200 "reached".
async fn origin() -> Origin {
    Origin::start(|_req| async { Response::ok("reached") }).await
}

/// A forward GET of `url` through `proxy`: status and body.
async fn get(proxy: SocketAddr, url: &str) -> (u16, String) {
    let r = get_from(STRANGER, proxy, url).await;
    (r.status, r.body_str())
}

/// A forward GET of `url` through `proxy`, from the loopback address `src`.
async fn get_from(src: &str, proxy: SocketAddr, url: &str) -> ParsedResponse {
    let host = url.split('/').nth(2).expect("authority");
    let req = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    parse_response(&raw_request_from(src.parse().expect("ip"), proxy, req.as_bytes()).await)
}

/// A CONNECT to `target` through `proxy`: the status.
async fn connect(proxy: SocketAddr, target: &str) -> u16 {
    connect_from(STRANGER, proxy, target).await
}

/// A CONNECT to `target` through `proxy` from the loopback address `src`.
async fn connect_from(src: &str, proxy: SocketAddr, target: &str) -> u16 {
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(src.parse().expect("ip"), 0))
        .expect("bind the client's address");
    let mut s = socket.connect(proxy).await.expect("connect to proxy");
    s.write_all(req.as_bytes()).await.expect("send CONNECT");
    let mut buf = vec![0; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("an answer to CONNECT in time")
        .expect("read");
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    head.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"))
}

const DENIED: &str = "portico_upstream_destinations_denied_total";

/// The client address the tests' `[[acl]]` entries grant exceptions to.
const ADMIN: &str = "127.0.0.2";
/// Any other client.
const STRANGER: &str = "127.0.0.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_link_local_and_unspecified_addresses_are_refused_and_loopback_is_not() {
    let o = origin().await;
    let port = o.addr().port();
    let p = Portico::start(&format!("[[listener]]\naddress = \"{}\"\n", free_addr())).await;
    // 0.0.0.0 is connected to this host by Linux: the origin on 127.0.0.1
    // would answer it.
    let (status, body) = get(p.addr(), &format!("http://0.0.0.0:{port}/")).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("proxy.deny_destinations"), "{body}");
    // The cloud metadata address: refused before any connect is tried.
    let (status, body) = get(p.addr(), "http://169.254.169.254/latest/meta-data/").await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = get(p.addr(), "http://[::ffff:169.254.169.254]/").await;
    assert_eq!(status, 403);
    assert_eq!(o.count(), 0, "a refused destination reached the origin");
    assert_eq!(get(p.addr(), &format!("http://127.0.0.1:{port}/")).await.0, 200);
    assert_eq!(metric(&p, DENIED).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_loopback_is_refused_in_every_spelling_and_by_every_name_that_resolves_to_it() {
    let o = origin().await;
    let port = o.addr().port();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[proxy]\ndeny_destinations = [\"127.0.0.0/8\", \"::1\"]\n\
         connect_ports = [443, {port}]\n",
        free_addr()
    ))
    .await;
    p.dns().add("rebound.test", "127.0.0.1".parse().expect("ip"), 0);
    for host in [
        "127.0.0.1",
        "127.1",
        "2130706433",
        "0x7f.0.0.1",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
        "localhost",
        "www.localhost",
        "rebound.test",
        "REBOUND.test.",
    ] {
        let (status, body) = get(p.addr(), &format!("http://{host}:{port}/")).await;
        assert_eq!(status, 403, "{host}: {body}");
        assert!(body.contains("not allowed (proxy.deny_destinations)"), "{host}: {body}");
    }
    for target in ["127.0.0.1", "localhost", "rebound.test"] {
        assert_eq!(
            connect(p.addr(), &format!("{target}:{port}")).await,
            403,
            "CONNECT {target}"
        );
    }
    assert_eq!(o.count(), 0, "a refused destination reached the origin");
    assert_eq!(metric(&p, DENIED).await, 13);
    let access = file_lines(&p.dir().join("access.log"), 14).await;
    let refused: Vec<&String> = access.iter().filter(|l| !l.contains("/metrics")).collect();
    assert_eq!(refused.len(), 13, "{access:#?}");
    assert!(refused.iter().all(|l| l.contains(" 403 ")), "{access:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_destinations_makes_exceptions_to_the_denied_networks() {
    let o = origin().await;
    let port = o.addr().port();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[proxy]\ndeny_destinations = [\"127.0.0.0/8\"]\n\
         allow_destinations = [\"127.0.0.1/32\"]\n",
        free_addr()
    ))
    .await;
    assert_eq!(
        get(p.addr(), &format!("http://127.0.0.1:{port}/")).await,
        (200, "reached".to_string())
    );
    assert_eq!(get(p.addr(), &format!("http://127.0.0.2:{port}/")).await.0, 403);
    assert_eq!(o.count(), 1);
}

/// The servers of an `[[upstream]]` group are the configuration's choice:
/// a reverse listener reaches its server on loopback. Its pooled
/// connection is never lent to a forward client naming the same address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_servers_stay_reachable_and_their_connections_are_not_lent_to_clients() {
    let o = origin().await;
    let port = o.addr().port();
    let reverse: SocketAddr = free_addr().parse().expect("address");
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[[listener]]\naddress = \"{reverse}\"\nmode = \"reverse\"\n\n\
         [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:{port}\"]\n\n\
         [[rule]]\nhost = \"www.test\"\nupstream = \"app\"\n\n\
         [proxy]\ndeny_destinations = [\"127.0.0.0/8\"]\n\n[cache]\nenabled = false\n",
        free_addr()
    ))
    .await;
    // Keep-alive, so the reverse fetch leaves its connection in the pool.
    let req = "GET /app HTTP/1.1\r\nHost: www.test\r\nConnection: close\r\n\r\n";
    let r = parse_response(&raw_request(reverse, req.as_bytes()).await);
    assert_eq!((r.status, r.body_str()), (200, "reached".to_string()));
    let (status, body) = get(p.addr(), &format!("http://127.0.0.1:{port}/app")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(o.count(), 1, "the forward request reached the origin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transparent_request_for_a_denied_address_is_refused() {
    let o = origin().await;
    let port = o.addr().port();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\nmode = \"transparent\"\n\n[proxy]\ndeny_destinations = [\"127.0.0.0/8\"]\n",
        free_addr()
    ))
    .await;
    let req = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let r = parse_response(&raw_request(p.addr(), req.as_bytes()).await);
    assert_eq!(r.status, 403, "{}", r.body_str());
    assert_eq!(o.count(), 0);
}

/// SOCKS 5 (RFC 1928): a denied target gets reply 0x02, "connection not
/// allowed by ruleset", by address and by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socks_session_to_a_denied_address_gets_not_allowed() {
    let o = origin().await;
    let port = o.addr().port();
    let socks: SocketAddr = free_addr().parse().expect("address");
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[[listener]]\naddress = \"{socks}\"\nmode = \"socks\"\n\n\
         [proxy]\ndeny_destinations = [\"127.0.0.0/8\"]\n",
        free_addr()
    ))
    .await;
    p.dns().add("rebound.test", "127.0.0.1".parse().expect("ip"), 0);
    let by_address = [&[1u8, 127, 0, 0, 1][..], &port.to_be_bytes()].concat();
    let by_name = [&[3u8, 12][..], b"rebound.test", &port.to_be_bytes()].concat();
    for target in [by_address, by_name] {
        let mut s = TcpStream::connect(socks).await.expect("connect to SOCKS");
        s.write_all(&[5, 1, 0]).await.expect("greeting");
        let mut method = [0u8; 2];
        s.read_exact(&mut method).await.expect("method");
        assert_eq!(method, [5, 0]);
        s.write_all(&[&[5u8, 1, 0][..], &target].concat())
            .await
            .expect("request");
        let mut reply = [0u8; 2];
        s.read_exact(&mut reply).await.expect("reply");
        assert_eq!(reply, [5, 2], "target {target:?}");
    }
    assert_eq!(o.count(), 0);
}

/// Squid's `http_access allow admins intranet` before `deny intranet`: an
/// `[[acl]]` entry's `allow_destinations` lets the requests it allows
/// reach a network `deny_destinations` refuses to everyone else, over
/// connections of their own (a pooled one is never lent to a stranger),
/// by address, by name and through `CONNECT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_entry_lets_its_clients_reach_a_denied_network_over_connections_of_their_own() {
    let o = origin().await;
    let port = o.addr().port();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[proxy]\ndeny_destinations = [\"127.0.0.0/8\", \"::1\"]\n\
         connect_ports = [443, {port}]\n\n[cache]\nenabled = false\n\n\
         [[acl]]\naction = \"allow\"\nclient = \"{ADMIN}\"\nallow_destinations = \"127.0.0.0/8\"\n",
        free_addr()
    ))
    .await;
    p.dns().add("intranet.test", "127.0.0.1".parse().expect("ip"), 0);
    for url in [
        format!("http://127.0.0.1:{port}/a"),
        format!("http://intranet.test:{port}/b"),
    ] {
        let r = get_from(ADMIN, p.addr(), &url).await;
        assert_eq!((r.status, r.body_str()), (200, "reached".to_string()), "{url}");
    }
    assert_eq!(o.count(), 2);
    // The admin's connection to 127.0.0.1:port is in a pool; the
    // stranger's requests for the same origin are refused all the same.
    for url in [
        format!("http://127.0.0.1:{port}/a"),
        format!("http://intranet.test:{port}/c"),
    ] {
        let r = get_from(STRANGER, p.addr(), &url).await;
        assert_eq!(r.status, 403, "{url}: {}", r.body_str());
    }
    assert_eq!(o.count(), 2, "a stranger's request reached the denied origin");
    assert_eq!(connect_from(ADMIN, p.addr(), &format!("127.0.0.1:{port}")).await, 200);
    assert_eq!(
        connect_from(STRANGER, p.addr(), &format!("127.0.0.1:{port}")).await,
        403
    );
    assert_eq!(metric(&p, DENIED).await, 3);
}

/// What a request fetches under an exception may come from where other
/// clients may not go: it is neither stored nor shared with a concurrent
/// request for the same URL. Fresh stored responses (fetched for clients
/// without the exception) still answer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_exception_fetches_is_not_stored_or_shared_but_stored_responses_answer_it() {
    let public = Origin::start(|_req| async { Response::ok("public").header("Cache-Control", "max-age=600") }).await;
    let intranet = Origin::start_at("127.0.0.3", |_req| async {
        Response::ok("intranet")
            .header("Cache-Control", "max-age=600")
            .delay(std::time::Duration::from_millis(600))
    })
    .await;
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{}\"\n\n[proxy]\ndeny_destinations = [\"127.0.0.3\"]\n\n\
         [[acl]]\naction = \"allow\"\nclient = \"{ADMIN}\"\nallow_destinations = \"127.0.0.3\"\n",
        free_addr()
    ))
    .await;
    let (pa, ia) = (public.addr(), intranet.addr());
    // Stored for a stranger, then a hit for the admin.
    assert_eq!(
        get_from(STRANGER, p.addr(), &format!("http://{pa}/p")).await.status,
        200
    );
    let r = get_from(ADMIN, p.addr(), &format!("http://{pa}/p")).await;
    assert_eq!(r.body_str(), "public");
    assert_eq!(r.header("X-Cache"), Some("HIT"), "{:?}", r.headers);
    assert_eq!(public.count(), 1);
    // The admin's fetch from the intranet, with a stranger asking for the
    // same URL while it is under way: the stranger is not given it.
    let url = format!("http://{ia}/i");
    let admin = tokio::spawn({
        let (proxy, url) = (p.addr(), url.clone());
        async move { get_from(ADMIN, proxy, &url).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let r = get_from(STRANGER, p.addr(), &url).await;
    assert_eq!(r.status, 403, "{}", r.body_str());
    let r = admin.await.expect("admin's request");
    assert_eq!((r.status, r.body_str()), (200, "intranet".to_string()));
    assert_eq!(r.header("X-Cache"), Some("MISS"), "{:?}", r.headers);
    // Not stored: a stranger is refused, the admin fetches it again.
    assert_eq!(get_from(STRANGER, p.addr(), &url).await.status, 403);
    assert_eq!(get_from(ADMIN, p.addr(), &url).await.status, 200);
    assert_eq!(intranet.count(), 2);
    // The cost: the admin's fetch of a public URL is not stored either.
    assert_eq!(get_from(ADMIN, p.addr(), &format!("http://{pa}/q")).await.status, 200);
    assert_eq!(
        get_from(STRANGER, p.addr(), &format!("http://{pa}/q")).await.status,
        200
    );
    assert_eq!(public.count(), 3);
}

/// Portico's configuration for `stored_responses_from_an_address_denied_later_are_not_served`:
/// a forward listener at `addr`, a disk cache in `cache`, and `rest`.
fn stored_config(addr: &str, cache: &std::path::Path, rest: &str) -> String {
    format!(
        "[[listener]]\naddress = \"{addr}\"\n\n[cache]\ndir = \"{}\"\nmemory = \"16MiB\"\n\n{rest}",
        cache.display()
    )
}

/// A response stored while its origin's address was allowed is not served
/// once `deny_destinations` refuses that address, after a reload as after a
/// restart that finds it on disk: the fetch would be refused, and so is the
/// copy. A client whose `[[acl]]` exception reaches the address still gets
/// the copy, and a response from an address still allowed is still a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_from_an_address_denied_later_are_not_served() {
    let public = Origin::start(|_req| async { Response::ok("public").header("Cache-Control", "max-age=600") }).await;
    let intranet = Origin::start_at("127.0.0.3", |_req| async {
        Response::ok("intranet").header("Cache-Control", "max-age=600")
    })
    .await;
    let cache = tempfile::tempdir().expect("cache dir");
    let addr = free_addr();
    let allowing = stored_config(
        &addr,
        cache.path(),
        "[proxy]\ndeny_destinations = [\"169.254.0.0/16\"]\n",
    );
    let denying = stored_config(
        &addr,
        cache.path(),
        &format!(
            "[proxy]\ndeny_destinations = [\"169.254.0.0/16\", \"127.0.0.3\"]\n\n\
             [[acl]]\naction = \"allow\"\nclient = \"{ADMIN}\"\nallow_destinations = \"127.0.0.3\"\n"
        ),
    );
    let p = Portico::start(&allowing).await;
    p.dns().add("intranet.test", "127.0.0.3".parse().expect("ip"), 0);
    let by_name = format!("http://intranet.test:{}/n", intranet.addr().port());
    let urls = [format!("http://{}/i", intranet.addr()), by_name];
    let public_url = format!("http://{}/p", public.addr());
    for url in urls.iter().chain([&public_url]) {
        assert_eq!(get_from(STRANGER, p.addr(), url).await.status, 200, "{url}");
        let r = get_from(STRANGER, p.addr(), url).await;
        assert_eq!(r.header("X-Cache"), Some("HIT"), "{url}: {:?}", r.headers);
    }
    assert_eq!(intranet.count(), 2);

    // A reload denies the intranet's address.
    p.rewrite_config(&denying);
    p.signal(libc::SIGHUP);
    let mut r = get_from(STRANGER, p.addr(), &urls[0]).await;
    for _ in 0..100 {
        if r.status != 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        r = get_from(STRANGER, p.addr(), &urls[0]).await;
    }
    let after_reload = |p: &Portico| {
        let (addr, urls, public_url) = (p.addr(), urls.clone(), public_url.clone());
        async move {
            for url in &urls {
                let r = get_from(STRANGER, addr, url).await;
                assert_eq!(r.status, 403, "{url}: {:?} {}", r.headers, r.body_str());
                assert!(r.body_str().contains("deny_destinations"), "{}", r.body_str());
                let r = get_from(ADMIN, addr, url).await;
                assert_eq!((r.status, r.body_str()), (200, "intranet".to_string()), "{url}");
                assert_eq!(r.header("X-Cache"), Some("HIT"), "{url}: {:?}", r.headers);
            }
            let r = get_from(STRANGER, addr, &public_url).await;
            assert_eq!(r.header("X-Cache"), Some("HIT"), "{:?}", r.headers);
        }
    };
    after_reload(&p).await;
    drop(p);

    // A restart with the same settings finds them on disk, and knows
    // where each came from.
    let p = Portico::start(&denying).await;
    p.dns().add("intranet.test", "127.0.0.3".parse().expect("ip"), 0);
    after_reload(&p).await;
    assert_eq!(intranet.count(), 2, "the intranet was never asked again");
    assert_eq!(public.count(), 1);
}

/// The address is known for a response fetched over a pooled connection
/// too (the pool keeps it with the connection): after a reload denies the
/// origin, the admin's exception still gets it from the cache and a
/// stranger does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_fetched_over_a_pooled_connection_knows_where_it_came_from() {
    let intranet = Origin::start_at("127.0.0.3", |_req| async {
        Response::ok("intranet").header("Cache-Control", "max-age=600")
    })
    .await;
    let cache = tempfile::tempdir().expect("cache dir");
    let addr = free_addr();
    let p = Portico::start(&stored_config(&addr, cache.path(), "")).await;
    let (first, pooled) = (
        format!("http://{}/first", intranet.addr()),
        format!("http://{}/pooled", intranet.addr()),
    );
    for url in [&first, &pooled] {
        assert_eq!(get_from(STRANGER, p.addr(), url).await.status, 200, "{url}");
    }
    assert_eq!(
        intranet.connections(),
        1,
        "the second fetch reused the first's connection"
    );
    p.rewrite_config(&stored_config(
        &addr,
        cache.path(),
        &format!(
            "[proxy]\ndeny_destinations = [\"127.0.0.3\"]\n\n\
             [[acl]]\naction = \"allow\"\nclient = \"{ADMIN}\"\nallow_destinations = \"127.0.0.3\"\n"
        ),
    ));
    p.signal(libc::SIGHUP);
    let mut r = get_from(STRANGER, p.addr(), &pooled).await;
    for _ in 0..100 {
        if r.status != 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        r = get_from(STRANGER, p.addr(), &pooled).await;
    }
    assert_eq!(r.status, 403, "{:?} {}", r.headers, r.body_str());
    let r = get_from(ADMIN, p.addr(), &pooled).await;
    assert_eq!(r.header("X-Cache"), Some("HIT"), "{:?}", r.headers);
    assert_eq!(intranet.count(), 2);
}

/// A request that would share a fetch in progress (a collapsed miss) is
/// not sent its bytes when they come from an address it may not reach
/// now: here a reload denies the origin while a slow download from it
/// goes on. The later request fetches for itself and is refused; the one
/// that started the download, under the old settings, finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_in_progress_from_an_address_denied_since_is_not_shared() {
    let intranet = Origin::start_at("127.0.0.3", |req| async move {
        if req.uri.path() == "/slow" {
            Response::ok("")
                .chunked(["one ", "two ", "three ", "four ", "five ", "six"], &[])
                .chunk_delay(std::time::Duration::from_millis(500))
                .header("Cache-Control", "max-age=600")
        } else {
            Response::ok("probe")
        }
    })
    .await;
    let cache = tempfile::tempdir().expect("cache dir");
    let addr = free_addr();
    let p = Portico::start(&stored_config(&addr, cache.path(), "")).await;
    let slow = format!("http://{}/slow", intranet.addr());
    let first = tokio::spawn({
        let (proxy, url) = (p.addr(), slow.clone());
        async move { get_from(STRANGER, proxy, &url).await }
    });
    // The download is under way; then a reload denies its origin.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    p.rewrite_config(&stored_config(
        &addr,
        cache.path(),
        "[proxy]\ndeny_destinations = [\"127.0.0.3\"]\n",
    ));
    p.signal(libc::SIGHUP);
    let probe = format!("http://{}/probe", intranet.addr());
    let mut seen = false;
    for _ in 0..40 {
        if get_from(STRANGER, p.addr(), &probe).await.status == 403 {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(seen, "the reload took effect");
    assert!(!first.is_finished(), "the download still goes on (the test needs it)");
    let r = get_from(STRANGER, p.addr(), &slow).await;
    assert_eq!(r.status, 403, "{:?} {}", r.headers, r.body_str());
    assert!(r.body_str().contains("deny_destinations"), "{}", r.body_str());
    let r = first.await.expect("first request");
    assert_eq!(
        (r.status, r.body_str()),
        (200, "one two three four five six".to_string())
    );
    // Stored now, and not served either.
    let r = get_from(STRANGER, p.addr(), &slow).await;
    assert_eq!(r.status, 403, "{:?} {}", r.headers, r.body_str());
}

/// The same for a revalidation of a stale stored response that another
/// request joins: the stored response came from an address still allowed,
/// so the later request waits for the revalidation, but the name has
/// moved and what the revalidation brings comes from the new address, which
/// a reload denied meanwhile. The later request fetches for itself and is
/// refused; the one that revalidated, under the old settings, gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revalidation_in_progress_from_an_address_denied_since_is_not_shared() {
    let before = Origin::start_at("127.0.0.4", |_req| async {
        Response::ok("from 127.0.0.4").header("Cache-Control", "max-age=1")
    })
    .await;
    let port = before.addr().port();
    // Holds its answer until the test lets it go.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let after = Origin::start_on(SocketAddr::new("127.0.0.3".parse().expect("ip"), port), move |_req| {
        let held = held.clone();
        async move {
            held.acquire().await.expect("gate").forget();
            Response::ok("from 127.0.0.3").header("Cache-Control", "max-age=600")
        }
    })
    .await;
    let cache = tempfile::tempdir().expect("cache dir");
    let addr = free_addr();
    // No pooled connection: the revalidation resolves the name again.
    let unpooled = "[origin]\npool_max_idle = 0\n";
    let p = Portico::start(&stored_config(&addr, cache.path(), unpooled)).await;
    p.dns().add("moving.test", "127.0.0.4".parse().expect("ip"), 0);
    let url = format!("http://moving.test:{port}/r");
    let r = get_from(STRANGER, p.addr(), &url).await;
    assert_eq!((r.status, r.body_str()), (200, "from 127.0.0.4".to_string()));
    // Stale after a second; the name moves meanwhile.
    p.dns().replace("moving.test", "127.0.0.3".parse().expect("ip"), 0);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let first = tokio::spawn({
        let (proxy, url) = (p.addr(), url.clone());
        async move { get_from(STRANGER, proxy, &url).await }
    });
    for _ in 0..100 {
        if after.count() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        after.count(),
        1,
        "the revalidation did not reach the name's new address"
    );
    p.reload(&stored_config(
        &addr,
        cache.path(),
        &format!("{unpooled}\n[proxy]\ndeny_destinations = [\"127.0.0.3\"]\n"),
    ))
    .await;
    // The later request joins the revalidation (in service, waiting for
    // it) before the origin answers.
    let serving = in_service(&p).await;
    let second = tokio::spawn({
        let (proxy, url) = (p.addr(), url.clone());
        async move { get_from(STRANGER, proxy, &url).await }
    });
    until_in_service_over(&p, serving, "the later request").await;
    // (From in service to waiting on the revalidation: a few steps more.)
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !first.is_finished() && !second.is_finished(),
        "both wait for the held answer"
    );
    gate.add_permits(1);
    let r = second.await.expect("second request");
    assert_eq!(r.status, 403, "{:?} {}", r.headers, r.body_str());
    assert!(r.body_str().contains("deny_destinations"), "{}", r.body_str());
    let r = first.await.expect("first request");
    assert_eq!((r.status, r.body_str()), (200, "from 127.0.0.3".to_string()));
    assert_eq!((before.count(), after.count()), (1, 1));
}

/// The same for what the cache keeps of a response in pieces: a part an
/// origin's 206 left (RFC 9111 3.3), and slices (`cache.slice`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_parts_and_slices_from_an_address_denied_later_are_not_served() {
    const BODY: &str = "0123456789abcdef";
    let intranet = Origin::start_at("127.0.0.3", |req| async move {
        let range = req
            .header("range")
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
        let r = match range {
            Some((a, b)) => {
                let b = b.min(BODY.len() - 1);
                Response::new(206)
                    .body(&BODY[a..=b])
                    .header("Content-Range", &format!("bytes {a}-{b}/{}", BODY.len()))
            }
            None => Response::ok(BODY),
        };
        r.header("Cache-Control", "max-age=600").header("ETag", "\"v1\"")
    })
    .await;
    let cache = tempfile::tempdir().expect("cache dir");
    let addr = free_addr();
    let slices = "[[rule]]\npath = \"/sliced/\"\ncache = { slice = \"8B\" }\n\n";
    let p = Portico::start(&stored_config(&addr, cache.path(), slices)).await;
    let ranged = |url: String| {
        let proxy = p.addr();
        async move {
            let host = url.split('/').nth(2).expect("authority").to_string();
            let req = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nRange: bytes=0-3\r\nConnection: close\r\n\r\n");
            parse_response(&raw_request_from(STRANGER.parse().expect("ip"), proxy, req.as_bytes()).await)
        }
    };
    let urls = [
        format!("http://{}/part", intranet.addr()),
        format!("http://{}/sliced/s", intranet.addr()),
    ];
    for url in &urls {
        let r = ranged(url.clone()).await;
        assert_eq!((r.status, r.body_str()), (206, "0123".to_string()), "{url}");
        let r = ranged(url.clone()).await;
        assert_eq!((r.status, r.body_str()), (206, "0123".to_string()), "{url}");
        assert_eq!(r.header("X-Cache"), Some("HIT"), "{url}: {:?}", r.headers);
    }
    assert_eq!(intranet.count(), 2);
    p.rewrite_config(&stored_config(
        &addr,
        cache.path(),
        &format!("[proxy]\ndeny_destinations = [\"127.0.0.3\"]\n\n{slices}"),
    ));
    p.signal(libc::SIGHUP);
    // The reload is seen when a request not cached at all is refused.
    let fresh = format!("http://{}/fresh", intranet.addr());
    for _ in 0..100 {
        if get_from(STRANGER, p.addr(), &fresh).await.status == 403 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let before = intranet.count();
    for url in &urls {
        let r = ranged(url.clone()).await;
        assert_eq!(r.status, 403, "{url}: {:?} {}", r.headers, r.body_str());
        assert!(r.body_str().contains("deny_destinations"), "{}", r.body_str());
    }
    assert_eq!(intranet.count(), before, "refused at the connect, as a fetch");
}

#[test]
fn allow_destinations_is_refused_on_deny_and_response_entries() {
    let base = "[[listener]]\naddress = \"127.0.0.1:8080\"\n\n[[acl]]\n";
    let (ok, err) = check(&format!(
        "{base}action = \"deny\"\nallow_destinations = \"10.0.0.0/8\"\n"
    ));
    assert!(!ok, "{err}");
    assert!(
        err.contains("acl[0].allow_destinations") && err.contains("applies to action = \"allow\" only"),
        "{err}"
    );
    let (ok, err) = check(&format!(
        "{base}action = \"allow\"\ncontent_type = \"video/*\"\nallow_destinations = \"10.0.0.0/8\"\n"
    ));
    assert!(!ok && err.contains("acl[0].allow_destinations"), "{err}");
    let (ok, err) = check(&format!(
        "{base}action = \"allow\"\nallow_destinations = \"10.0.0.0/33\"\n"
    ));
    assert!(!ok && err.contains("10.0.0.0/33"), "{err}");
}

/// `portico check` on a config in a temporary file: success, stderr.
fn check(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("portico.toml");
    std::fs::write(&file, config).expect("write config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["check", "-c"])
        .arg(&file)
        .env_remove("PORTICO_CONFIG")
        .output()
        .expect("run portico check");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn check_warns_when_clients_from_other_machines_can_reach_loopback() {
    const WARNING: &str = "proxy.deny_destinations does not refuse loopback";
    let forward = "[[listener]]\naddress = \"127.0.0.1:8080\"\n\n";
    // The LAN admitted, loopback not refused: warned, still valid.
    let (ok, err) = check(&format!("{forward}[access]\nallow = [\"10.0.0.0/8\", \"127.0.0.1\"]\n"));
    assert!(ok, "{err}");
    assert!(
        err.contains(&format!(
            "access.allow admits clients beyond this host (10.0.0.0/8) and {WARNING}"
        )),
        "{err}"
    );
    // Part of loopback refused is not enough.
    for partial in ["[\"127.0.0.0/8\"]", "[\"127.0.0.1/32\", \"::1\"]"] {
        let (ok, err) = check(&format!(
            "{forward}[access]\nallow = [\"10.0.0.0/8\"]\n\n[proxy]\ndeny_destinations = {partial}\n"
        ));
        assert!(ok && err.contains(WARNING), "{partial}: {err}");
    }
    // The defaults (loopback clients only), loopback refused, or a reverse
    // listener only (its clients choose no destination): no warning.
    for quiet in [
        forward.to_string(),
        format!(
            "{forward}[access]\nallow = [\"0.0.0.0/0\"]\n\n[proxy]\ndeny_destinations = [\"127.0.0.0/8\", \"::1\"]\n"
        ),
        "[[listener]]\naddress = \"127.0.0.1:8080\"\nmode = \"reverse\"\n\n[access]\nallow = [\"0.0.0.0/0\"]\n\n\
         [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:8081\"]\n\n[[rule]]\nupstream = \"app\"\n"
            .to_string(),
    ] {
        let (ok, err) = check(&quiet);
        assert!(ok, "{err}");
        assert!(!err.contains(WARNING), "{quiet}\n{err}");
    }
}

#[test]
fn check_warns_about_allow_destinations_that_lift_nothing() {
    let config = |deny: &str| {
        format!(
            "[[listener]]\naddress = \"127.0.0.1:8080\"\n\n[proxy]\ndeny_destinations = {deny}\n\n\
             [[acl]]\naction = \"allow\"\nclient = \"{ADMIN}\"\nallow_destinations = [\"10.1.0.0/16\", \"192.168.0.0/16\"]\n"
        )
    };
    let (ok, err) = check(&config("[\"10.0.0.0/8\"]"));
    assert!(ok, "{err}");
    assert!(
        err.contains("acl[0].allow_destinations: 192.168.0.0/16 lifts nothing"),
        "{err}"
    );
    assert!(!err.contains("10.1.0.0/16 lifts nothing"), "{err}");
    // A narrower denied network inside an exception is lifted by it.
    let (_, err) = check(&config("[\"10.0.0.0/8\", \"192.168.1.0/24\"]"));
    assert!(!err.contains("lifts nothing"), "{err}");
    let (ok, err) = check(&config("[]"));
    assert!(ok && err.matches("lifts nothing").count() == 2, "{err}");
}
