//! Objects cached in slices (`cache.slice`, as nginx's slice module): a
//! Range request costs the origin only the slices it touches, each slice
//! is stored on its own and reused by every request that touches it, and
//! the slices of one response are one representation or the response is
//! cut short. The real `portico` binary as a forward proxy with both
//! tiers; an origin serving byte ranges of a generated representation
//! (`common::pattern_matches`) and counting the requests it gets.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

const MIB: u64 = 1 << 20;

/// A forward proxy storing objects in 1 MiB slices, with a memory tier
/// smaller than the objects (slices then come from the disk tier too).
async fn proxy() -> Portico {
    proxy_in("{dir}/cache", "1MiB").await
}

/// [`proxy`] with its disk tier in `dir` and slices of `slice`.
async fn proxy_in(dir: &str, slice: &str) -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\ndir = \"{dir}\"\nmemory = \"4MiB\"\ndisk = \"1GiB\"\nslice = \"{slice}\"\n"
    ))
    .await
}

/// What the origin does: the representation's length and entity tag, and
/// whether it answers `Range` at all.
#[derive(Clone)]
struct Repr {
    len: u64,
    etag: String,
    ranges: bool,
    chunk_delay: Duration,
    /// Wait before the response head.
    delay: Duration,
    max_age: u32,
}

/// An origin serving the generated pattern of `repr.len` bytes, fresh for
/// `max_age` seconds, a 206 for a `bytes=a-b` Range (as nginx or Apache
/// answer it) unless `ranges` is off, a 304 to an `If-None-Match` with its
/// entity tag; a POST gets a 200.
async fn origin(repr: Arc<Mutex<Repr>>) -> Origin {
    Origin::start(move |req| {
        let r = repr.lock().expect("lock").clone();
        async move {
            if req.method == "POST" {
                return Response::ok("posted");
            }
            let cache_control = format!("max-age={}", r.max_age);
            if req.header("if-none-match") == Some(r.etag.as_str()) {
                return Response::new(304)
                    .header("ETag", &r.etag)
                    .header("Cache-Control", &cache_control);
            }
            let range = req
                .header("range")
                .filter(|_| r.ranges)
                .and_then(|v| v.strip_prefix("bytes="))
                .and_then(|v| v.split_once('-'))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
            let resp = match range {
                Some((a, _)) if a >= r.len => {
                    return Response::new(416).header("Content-Range", &format!("bytes */{}", r.len));
                }
                Some((a, b)) => {
                    let b = b.min(r.len - 1);
                    Response::new(206)
                        .generated_range(a, b - a + 1)
                        .header("Content-Range", &format!("bytes {a}-{b}/{}", r.len))
                }
                None => Response::ok("").generated(r.len),
            };
            resp.header("Cache-Control", &cache_control)
                .header("ETag", &r.etag)
                .header("Accept-Ranges", "bytes")
                .chunk_delay(r.chunk_delay)
                .delay(r.delay)
        }
    })
    .await
}

fn repr(len: u64) -> Arc<Mutex<Repr>> {
    Arc::new(Mutex::new(Repr {
        len,
        etag: "\"v1\"".into(),
        ranges: true,
        chunk_delay: Duration::ZERO,
        delay: Duration::ZERO,
        max_age: 3600,
    }))
}

/// A client collapsed onto another's fetch of a large slice that stops
/// reading is left behind (its part of the spool dropped) and gets the
/// rest of the slice from the store when it reads again: the response
/// whole and in order, Portico's memory not held by it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collapsed_client_left_behind_on_a_large_slice_gets_the_rest_from_the_stored_slice() {
    const LEN: u64 = 48 * MIB;
    let r = repr(LEN);
    r.lock().expect("lock").delay = Duration::from_millis(500);
    let o = origin(r).await;
    let p = proxy_in("{dir}/cache", "16MiB").await;
    let oaddr = o.addr();
    let request = format!("GET http://{oaddr}/big HTTP/1.1\r\nHost: {oaddr}\r\nConnection: close\r\n\r\n");
    let (first, grown, r) = fast_and_stalled_clients(&p, &request).await;
    assert_eq!((first.status, first.body.len() as u64), (200, LEN));
    assert!(pattern_matches(0, &first.body));
    assert!(
        grown < 40 << 10,
        "a collapsed client that reads nothing grew Portico by {grown} KiB"
    );
    assert_eq!(r.status, 200, "{:?}", r.headers);
    assert_eq!(r.body.len() as u64, LEN);
    assert!(pattern_matches(0, &r.body), "the body is the object's, in order");
    // Three slices, each asked for once.
    assert_eq!(o.count(), 3, "{:?}", ranges_asked(&o));
}

/// A personal page fetched in slices: `cache.set_cookie = "no-store"`
/// (the default) keeps it out of the cache, and the client whose request
/// fetched it gets its own `Set-Cookie`. Before, slices were judged on the
/// fields left after the cookie was taken out: alice's page was stored
/// and served to bob, and alice never got her cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_with_set_cookie_is_not_stored_and_its_fetcher_gets_the_cookie() {
    let o = Origin::start(|req| async move {
        let user = req.header("x-user").unwrap_or("nobody").to_string();
        let page = format!("PRIVATE PAGE FOR {user:<16}").into_bytes();
        let len = page.len();
        let cookie = format!("session={user}");
        let range = req
            .header("range")
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
        let resp = match range {
            Some((a, b)) if a < len => {
                let b = b.min(len - 1);
                Response::new(206)
                    .body(page[a..=b].to_vec())
                    .header("Content-Range", &format!("bytes {a}-{b}/{len}"))
            }
            _ => Response::ok(page),
        };
        resp.header("Cache-Control", "max-age=300")
            .header("Accept-Ranges", "bytes")
            .header("Set-Cookie", &cookie)
    })
    .await;
    let p = proxy_in("{dir}/cache", "1KiB").await;
    let ask = |user: &'static str, range: &'static str| {
        let (o, p) = (o.addr(), p.addr());
        async move {
            let req = format!(
                "GET http://{o}/page HTTP/1.1\r\nHost: {o}\r\nX-User: {user}\r\n{range}Connection: close\r\n\r\n"
            );
            parse_response(&raw_request(p, req.as_bytes()).await)
        }
    };
    let alice = ask("alice", "").await;
    assert_eq!(alice.status, 200, "{:?}", alice.headers);
    assert!(alice.body_str().contains("alice"), "{}", alice.body_str());
    assert_eq!(alice.header("set-cookie"), Some("session=alice"), "{:?}", alice.headers);
    let bob = ask("bob", "Range: bytes=0-31\r\n").await;
    assert_eq!(bob.status, 206, "{:?}", bob.headers);
    assert!(bob.body_str().contains("bob"), "bob got {:?}", bob.body_str());
    assert_eq!(bob.header("x-cache"), Some("MISS"), "{:?}", bob.headers);
    assert_eq!(bob.header("set-cookie"), Some("session=bob"), "{:?}", bob.headers);
}

/// `method` of the origin's `/big` through the proxy, with a `Range` if
/// given; the raw bytes (the connection closes after the response).
async fn send(p: &Portico, o: SocketAddr, method: &str, range: Option<&str>) -> Vec<u8> {
    let range = range.map(|r| format!("Range: {r}\r\n")).unwrap_or_default();
    let req = format!("{method} http://{o}/big HTTP/1.1\r\nHost: {o}\r\n{range}Connection: close\r\n\r\n");
    raw_request(p.addr(), req.as_bytes()).await
}

async fn get(p: &Portico, o: SocketAddr, range: Option<&str>) -> ParsedResponse {
    parse_response(&send(p, o, "GET", range).await)
}

/// The `Range` fields of the requests the origin got, in order.
fn ranges_asked(o: &Origin) -> Vec<String> {
    o.requests()
        .iter()
        .map(|r| r.header("range").unwrap_or("-").to_string())
        .collect()
}

/// GETs bytes `at..at + len` and checks the 206: `X-Cache` and the bytes.
async fn check_range(p: &Portico, o: SocketAddr, at: u64, len: u64, x_cache: &str) {
    let r = get(p, o, Some(&format!("bytes={at}-{}", at + len - 1))).await;
    check(&r, 206, x_cache, at, len);
}

#[track_caller]
fn check(r: &ParsedResponse, status: u16, x_cache: &str, from: u64, len: u64) {
    assert_eq!(r.status, status, "{:?}", r.headers);
    assert_eq!(r.header("x-cache"), Some(x_cache), "{:?}", r.headers);
    assert_eq!(r.body.len() as u64, len, "{:?}", r.headers);
    assert!(pattern_matches(from, &r.body), "wrong bytes from {from}");
}

/// A seek into the middle of a large object costs the origin the one slice
/// holding it, and is a hit once that slice is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_in_the_middle_of_a_large_object_fetches_only_its_slice() {
    let p = proxy().await;
    let o = origin(repr(64 * MIB)).await;
    let r = get(&p, o.addr(), Some("bytes=40000000-40000099")).await;
    check(&r, 206, "MISS", 40_000_000, 100);
    assert_eq!(r.header("content-range"), Some("bytes 40000000-40000099/67108864"));
    assert_eq!(r.header("etag"), Some("\"v1\""));
    // The slice holding byte 40,000,000: 38 MiB to 39 MiB.
    assert_eq!(ranges_asked(&o), ["bytes=39845888-40894463"]);
    assert_eq!(metric(&p, "portico_cache_fetched_bytes_total").await, MIB);
    // Elsewhere in the same slice: a hit.
    let r = get(&p, o.addr(), Some("bytes=40500000-")).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), Some("bytes 40500000-67108863/67108864"));
    assert_eq!(r.header("x-cache"), Some("HIT"), "the first slice is stored");
    assert_eq!(r.body.len() as u64, 64 * MIB - 40_500_000);
    assert!(pattern_matches(40_500_000, &r.body));
    // It needed the 25 slices after the first: each fetched once.
    assert_eq!(o.count(), 1 + 25);
    let r = get(&p, o.addr(), Some("bytes=40000050-40000059")).await;
    check(&r, 206, "HIT", 40_000_050, 10);
    let r = get(&p, o.addr(), Some("bytes=-10")).await;
    assert_eq!(r.header("content-range"), Some("bytes 67108854-67108863/67108864"));
    assert!(pattern_matches(64 * MIB - 10, &r.body));
    // A suffix range asks for the first slice (which says the length) first.
    assert_eq!(o.count(), 1 + 25 + 1);
    assert_eq!(ranges_asked(&o).last().map(String::as_str), Some("bytes=0-1048575"));
}

/// A request for the whole object is answered with its complete length,
/// fetched slice after slice; then every part of it is a hit, HEAD and
/// multipart ranges included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_object_is_fetched_slice_by_slice_then_served_from_the_slices() {
    let p = proxy().await;
    let len = 5 * MIB + MIB / 2;
    let o = origin(repr(len)).await;
    let r = get(&p, o.addr(), None).await;
    check(&r, 200, "MISS", 0, len);
    assert_eq!(r.header("content-length"), Some(len.to_string().as_str()));
    assert_eq!(r.header("content-range"), None);
    let want: Vec<String> = (0..6)
        .map(|i| format!("bytes={}-{}", i * MIB, (i + 1) * MIB - 1))
        .collect();
    assert_eq!(ranges_asked(&o), want);
    let r = get(&p, o.addr(), None).await;
    check(&r, 200, "HIT", 0, len);
    let head = parse_head_response(&send(&p, o.addr(), "HEAD", None).await);
    assert_eq!((head.status, head.header("x-cache")), (200, Some("HIT")));
    assert_eq!(head.header("content-length"), Some(len.to_string().as_str()));
    let r = get(&p, o.addr(), Some("bytes=0-9,3000000-3000009")).await;
    assert_eq!(r.status, 206);
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("multipart/byteranges; boundary="), "{ct}");
    for at in [0u64, 3_000_000] {
        let label = format!("Content-Range: bytes {at}-{}/{len}\r\n\r\n", at + 9);
        let found = r
            .body
            .windows(label.len())
            .position(|w| w == label.as_bytes())
            .unwrap_or_else(|| panic!("no part {label:?}"));
        let bytes = &r.body[found + label.len()..found + label.len() + 10];
        assert!(pattern_matches(at, bytes), "part at {at}");
    }
    assert_eq!(o.count(), 6, "every later request was answered from the slices");
    assert!(metric(&p, "portico_cache_stored_total").await >= 6);
}

/// The slices of one response must be one representation: when the object
/// changed at the origin between two slices, the response is cut short
/// (the client sees fewer bytes than announced, never a mix), and the next
/// request gets the new representation whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_of_two_representations_never_make_one_response() {
    let p = proxy().await;
    let len = 3 * MIB;
    let state = repr(len);
    let o = origin(state.clone()).await;
    check_range(&p, o.addr(), 0, 10, "MISS").await;
    state.lock().expect("lock").etag = "\"v2\"".into();
    let raw = send(&p, o.addr(), "GET", None).await;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("ETag: \"v1\"") || head.contains("etag: \"v1\""), "{head}");
    let body = &raw[split..];
    assert!(
        (body.len() as u64) <= MIB,
        "cut short after the first slice, not {} bytes",
        body.len()
    );
    assert!(pattern_matches(0, body));
    // Invalidated: the next request fetches every slice, all of "v2".
    let before = o.count();
    let r = get(&p, o.addr(), None).await;
    check(&r, 200, "MISS", 0, len);
    assert_eq!(r.header("etag"), Some("\"v2\""));
    assert_eq!(o.count() - before, 3);
}

/// The same when the head came from the first slice and the bytes would
/// come from another: a suffix range learns the length from the first
/// slice (stored, "v1"), and the last slice is now "v2".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suffix_range_is_never_sent_from_another_representation_than_its_head() {
    let p = proxy().await;
    let state = repr(3 * MIB);
    let o = origin(state.clone()).await;
    check_range(&p, o.addr(), 0, 10, "MISS").await;
    state.lock().expect("lock").etag = "\"v2\"".into();
    // The head waits for the first body byte, so the client sees the
    // connection close with nothing, or at most v1's head and no byte.
    let raw = send(&p, o.addr(), "GET", Some("bytes=-10")).await;
    if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
        assert!(head.contains("etag: \"v1\""), "{head}");
        assert_eq!(raw.len(), split + 4, "no byte of v2 under v1's head");
    }
    let r = get(&p, o.addr(), Some("bytes=-10")).await;
    check(&r, 206, "MISS", 3 * MIB - 10, 10);
    assert_eq!(r.header("etag"), Some("\"v2\""));
}

/// RFC 9111 4.3: a stale slice is validated with the origin (its `Range`
/// and its validators); a 304 makes it fresh again without its bytes being
/// fetched, and a new representation replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_slice_is_revalidated_rather_than_fetched_again() {
    let p = proxy().await;
    let state = repr(3 * MIB);
    // Long enough that the 304's whole-second Date leaves it fresh after.
    state.lock().expect("lock").max_age = 3;
    let o = origin(state.clone()).await;
    check_range(&p, o.addr(), 100, 100, "MISS").await;
    tokio::time::sleep(Duration::from_millis(4100)).await;
    let r = get(&p, o.addr(), Some("bytes=100-199")).await;
    check(&r, 206, "REVALIDATED", 100, 100);
    let asked = &o.requests()[1];
    assert_eq!(
        (asked.header("range"), asked.header("if-none-match")),
        (Some("bytes=0-1048575"), Some("\"v1\""))
    );
    assert_eq!(
        metric(&p, "portico_cache_fetched_bytes_total").await,
        MIB,
        "no byte fetched again"
    );
    // Fresh again for max-age: a hit.
    check_range(&p, o.addr(), 150, 10, "HIT").await;
    assert_eq!(o.count(), 2);
    // Counted as a whole response's would be: one miss, one revalidation, one hit.
    for (series, n) in [
        ("portico_cache_misses_total", 1),
        ("portico_cache_revalidations_total", 1),
        ("portico_cache_hits_total", 1),
    ] {
        assert_eq!(metric(&p, series).await, n, "{series}");
    }
    // Changed at the origin: the new slice replaces the stale one.
    state.lock().expect("lock").etag = "\"v2\"".into();
    tokio::time::sleep(Duration::from_millis(4100)).await;
    let r = get(&p, o.addr(), Some("bytes=100-199")).await;
    check(&r, 206, "MISS", 100, 100);
    assert_eq!(r.header("etag"), Some("\"v2\""));
}

/// RFC 9110 13.1 and 14.2 on a sliced object: the client's own
/// conditionals and unsatisfiable ranges are answered from the first
/// slice's head, as for a whole stored response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditionals_and_unsatisfiable_ranges_are_answered_from_the_slices() {
    let p = proxy().await;
    // 100 bytes short of 3 MiB: its last slice ends before 3 MiB.
    let len = 3 * MIB - 100;
    let o = origin(repr(len)).await;
    check_range(&p, o.addr(), 0, 10, "MISS").await;
    let o_addr = o.addr();
    let ask =
        |extra: &str| format!("GET http://{o_addr}/big HTTP/1.1\r\nHost: {o_addr}\r\n{extra}Connection: close\r\n\r\n");
    let r = parse_response(&raw_request(p.addr(), ask("If-None-Match: \"v1\"\r\n").as_bytes()).await);
    assert_eq!((r.status, r.header("etag")), (304, Some("\"v1\"")), "{:?}", r.headers);
    let r = parse_response(&raw_request(p.addr(), ask("If-Match: \"v0\"\r\n").as_bytes()).await);
    assert_eq!(r.status, 412, "{:?}", r.headers);
    // Past the last slice: the slice asked for does not exist, and the
    // origin's 416 is relayed.
    let r = get(&p, o.addr(), Some("bytes=5000000-")).await;
    assert_eq!(r.status, 416, "{:?}", r.headers);
    // Within the last slice but past the end: Portico's own 416, from the
    // complete length that slice gives.
    let r = get(&p, o.addr(), Some("bytes=3145700-")).await;
    assert_eq!(
        (r.status, r.header("content-range")),
        (416, Some("bytes */3145628")),
        "{:?}",
        r.headers
    );
    // A wrong If-Range: the whole object, as a 200.
    let r = parse_response(&raw_request(p.addr(), ask("Range: bytes=0-9\r\nIf-Range: \"v0\"\r\n").as_bytes()).await);
    check(&r, 200, "HIT", 0, len);
}

/// An origin that ignores `Range` answers the first slice's request with
/// the whole object: relayed, stored whole, and later ranges are hits on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_without_ranges_is_answered_and_stored_whole() {
    let p = proxy().await;
    let state = repr(2 * MIB);
    state.lock().expect("lock").ranges = false;
    let o = origin(state).await;
    let r = get(&p, o.addr(), Some("bytes=5-9")).await;
    check(&r, 200, "MISS", 0, 2 * MIB);
    let r = get(&p, o.addr(), Some("bytes=5-9")).await;
    check(&r, 206, "HIT", 5, 5);
    assert_eq!(o.count(), 1);
}

/// Hostile origin: a 206 of another range than the slice asked for (or of
/// another length than its Content-Range says) is not what anyone asked:
/// 502, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_answered_with_another_range_is_a_bad_gateway() {
    let p = proxy().await;
    let o = Origin::start(|_req| async {
        Response::new(206)
            .body("0123456789")
            .header("Content-Range", "bytes 0-9/100")
            .header("Cache-Control", "max-age=3600")
    })
    .await;
    for _ in 0..2 {
        let r = get(&p, o.addr(), Some("bytes=0-9")).await;
        assert_eq!(r.status, 502, "{:?} {}", r.headers, r.body_str());
    }
    assert_eq!(o.count(), 2, "nothing stored");
}

/// Slices are stored objects of the disk tier: one file each, and a
/// restarted Portico answers from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_are_disk_objects_that_outlive_a_restart() {
    let cache = tempfile::tempdir().expect("tempdir");
    let dir = cache.path().display().to_string();
    let o = origin(repr(3 * MIB)).await;
    {
        let p = proxy_in(&dir, "1MiB").await;
        check(&get(&p, o.addr(), None).await, 200, "MISS", 0, 3 * MIB);
    }
    // Three slices and the marker that lists them under the URL's own key.
    let mut files = Vec::new();
    let mut stack = vec![cache.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let path = e.path();
            if path.is_dir() && e.file_name() != "tmp" {
                stack.push(path);
            } else if e.file_name().len() == 32 {
                files.push(std::fs::metadata(&path).expect("stat").len());
            }
        }
    }
    assert_eq!(files.len(), 4, "{files:?}");
    assert_eq!(files.iter().filter(|&&n| n > MIB).count(), 3, "{files:?}");
    let p = proxy_in(&dir, "1MiB").await;
    check_range(&p, o.addr(), 1_500_000, 1_000_001, "HIT").await;
    assert_eq!(o.count(), 3);
}

/// Slices stored at another size (`cache.slice` changed across a restart)
/// are used only where they are exactly a slice of the new size; the others
/// are fetched again, never mistaken for the slice a request needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_of_an_older_size_are_fetched_again_at_the_new_one() {
    let cache = tempfile::tempdir().expect("tempdir");
    let dir = cache.path().display().to_string();
    let o = origin(repr(3 * MIB)).await;
    {
        let p = proxy_in(&dir, "1MiB").await;
        check(&get(&p, o.addr(), None).await, 200, "MISS", 0, 3 * MIB);
    }
    let p = proxy_in(&dir, "2MiB").await;
    check(&get(&p, o.addr(), None).await, 200, "MISS", 0, 3 * MIB);
    // The old first slice (0-1 MiB) is not the new one (0-2 MiB); the old
    // third (2-3 MiB) is the new second exactly, cut at the end: reused.
    let asked = ranges_asked(&o);
    assert_eq!(asked[3..], ["bytes=0-2097151"]);
    check(&get(&p, o.addr(), None).await, 200, "HIT", 0, 3 * MIB);
}

/// Concurrent requests touching one slice that is being fetched wait for
/// that fetch (one origin request) and get its bytes as they arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_one_slice_make_one_origin_request() {
    let p = proxy().await;
    let state = repr(2 * MIB);
    state.lock().expect("lock").chunk_delay = Duration::from_millis(40);
    let o = origin(state).await;
    let clients: Vec<_> = (0..4u64)
        .map(|i| {
            let (p_addr, o_addr) = (p.addr(), o.addr());
            tokio::spawn(async move {
                let at = 1000 * i;
                let req = format!(
                    "GET http://{o_addr}/big HTTP/1.1\r\nHost: {o_addr}\r\nRange: bytes={at}-{}\r\nConnection: close\r\n\r\n",
                    at + 99
                );
                (at, parse_response(&raw_request(p_addr, req.as_bytes()).await))
            })
        })
        .collect();
    for c in clients {
        let (at, r) = c.await.expect("client");
        assert_eq!(r.status, 206);
        assert!(pattern_matches(at, &r.body), "bytes at {at}");
    }
    assert_eq!(ranges_asked(&o), ["bytes=0-1048575"]);
}

/// RFC 9111 4.4: a successful unsafe request invalidates the URL: every
/// slice of it; so does a PURGE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_request_invalidates_every_slice() {
    let p = proxy().await;
    let o = origin(repr(3 * MIB)).await;
    check(&get(&p, o.addr(), None).await, 200, "MISS", 0, 3 * MIB);
    check_range(&p, o.addr(), 2_500_000, 10, "HIT").await;
    assert_eq!(o.count(), 3);
    let posted = parse_response(&send(&p, o.addr(), "POST", None).await);
    assert_eq!(posted.status, 200);
    check_range(&p, o.addr(), 2_500_000, 10, "MISS").await;
    assert_eq!(
        ranges_asked(&o).last().map(String::as_str),
        Some("bytes=2097152-3145727")
    );
    check_range(&p, o.addr(), 2_500_000, 10, "HIT").await;
    let purged = parse_response(&send(&p, o.addr(), "PURGE", None).await);
    assert_eq!(purged.status, 200, "{}", purged.body_str());
    check_range(&p, o.addr(), 2_500_000, 10, "MISS").await;
    assert_eq!(
        o.count(),
        3 + 1 + 1 + 1,
        "the POST, and one slice after each invalidation"
    );
}

/// A slice larger than any object the cache may store is refused at start.
#[test]
fn a_slice_larger_than_the_largest_object_is_a_config_error() {
    let out = Portico::check("[cache]\nmax_object_size = \"1MiB\"\nslice = \"2MiB\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("portico.toml:3: key `cache.slice`"), "{err}");
    assert!(err.contains("larger than cache.max_object_size"), "{err}");
    let out = Portico::check("[[rule]]\npath = \"/video/\"\ncache = { slice = \"4GiB\" }\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("key `rule[0].cache.slice`"), "{err}");
}

/// Slices are fetched one after another, each giving its origin
/// connection back before the next is asked for: with one connection
/// allowed to the origin (`origin.max_connections = 1`), a whole object
/// still comes through, never waiting on itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_fetched_under_a_cap_of_one_origin_connection_never_wait_on_each_other() {
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"4MiB\"\ndisk = \"1GiB\"\nslice = \"1MiB\"\n\n\
         [origin]\nmax_connections = 1\nqueue_timeout = \"0s\"\n"
    ))
    .await;
    let len = 4 * MIB + 100;
    let o = origin(repr(len)).await;
    let r = get(&p, o.addr(), None).await;
    check(&r, 200, "MISS", 0, len);
    assert_eq!(ranges_asked(&o).len(), 5, "{:?}", ranges_asked(&o));
    // A Range across three slices, none stored yet.
    let o2 = origin(repr(len)).await;
    let r = get(&p, o2.addr(), Some("bytes=500000-2600000")).await;
    check(&r, 206, "MISS", 500_000, 2_100_001);
    assert_eq!(metric(&p, "portico_upstream_queue_timeouts_total").await, 0);
}

/// A client collapsed onto another's fetch of a large slice that fell
/// behind reads on from the slice's disk file while the fetch runs, not
/// only once it has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_left_behind_on_a_slice_reads_on_from_disk_while_it_is_fetched() {
    left_behind_on_a_slice(None).await;
}

/// So does one that asked for a range of the slice: what it is sent is
/// that range's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_request_left_behind_on_a_slice_reads_its_range_from_disk() {
    left_behind_on_a_slice(Some(8 * MIB)).await;
}

/// A fast and a slow client of one 64 MiB slice of a 40 MiB object, the
/// slow one asking from `range_from` on if given.
async fn left_behind_on_a_slice(range_from: Option<u64>) {
    const LEN: u64 = 40 * MIB;
    let skip = range_from.unwrap_or(0);
    // Answers the slice's range: 64 KiB, a wait for the first permit, up
    // to 32 MiB, a wait for the second, then the rest.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let o = RawOrigin::start(move |mut s| {
        let gate = g.clone();
        async move {
            let head = String::from_utf8_lossy(&read_request_head(&mut s).await).into_owned();
            let (from, to) = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Range: bytes=")
                        .or_else(|| l.strip_prefix("range: bytes="))
                })
                .and_then(|r| r.trim().split_once('-'))
                .map(|(a, b)| {
                    (
                        a.parse::<u64>().unwrap(),
                        b.parse::<u64>().map_or(LEN - 1, |b| b.min(LEN - 1)),
                    )
                })
                .unwrap_or((0, LEN - 1));
            let reply = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {from}-{to}/{LEN}\r\nContent-Length: {}\r\n\
                 ETag: \"v1\"\r\nCache-Control: max-age=3600\r\n\r\n",
                to + 1 - from
            );
            use tokio::io::AsyncWriteExt;
            if s.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            let body: Vec<u8> = (from..=to).map(|i| (i % 251) as u8).collect();
            let mut at = 0usize;
            for stop in [64 << 10, 32 << 20, body.len()] {
                let stop = stop.min(body.len());
                if s.write_all(&body[at..stop]).await.is_err() {
                    return;
                }
                at = stop;
                if at < body.len() {
                    gate.acquire().await.expect("gate").forget();
                }
            }
        }
    })
    .await;
    // One slice for the whole object.
    let p = proxy_in("{dir}/cache", "64MiB").await;
    let oaddr = o.addr();
    let request = format!("GET http://{oaddr}/big HTTP/1.1\r\nHost: {oaddr}\r\nConnection: close\r\n\r\n");
    let slow_request = match range_from {
        Some(from) => format!(
            "GET http://{oaddr}/big HTTP/1.1\r\nHost: {oaddr}\r\nRange: bytes={from}-\r\nConnection: close\r\n\r\n"
        ),
        None => request.clone(),
    };
    let mut leader = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    let mut slow = tokio::net::TcpStream::connect(p.addr()).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    leader.write_all(request.as_bytes()).await.unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    assert!(read_at_least(&mut leader, &mut a, 64 << 10, Duration::from_secs(5)).await);
    slow.write_all(slow_request.as_bytes()).await.unwrap();
    if range_from.is_none() {
        assert!(
            read_at_least(&mut slow, &mut b, 1, Duration::from_secs(5)).await,
            "the follower's head"
        );
    } else {
        // Its head waits for the range's first byte: give it time to join.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    gate.add_permits(1);
    // The leader's client reads 32 MiB while the slow one reads nothing.
    assert!(read_at_least(&mut leader, &mut a, 32 << 20, Duration::from_secs(10)).await);
    assert!(
        read_at_least(&mut slow, &mut b, (28 << 20) - skip as usize, Duration::from_secs(10)).await,
        "the client left behind got {} bytes while the slice was fetched",
        b.len()
    );
    gate.add_permits(1);
    for (mut s, mut buf, from) in [(leader, a, 0), (slow, b, skip)] {
        s.read_to_end(&mut buf).await.unwrap();
        let r = parse_response(&buf);
        let status = if from > 0 { 206 } else { 200 };
        assert_eq!((r.status, r.body.len() as u64), (status, LEN - from));
        assert!(
            pattern_matches(from, &r.body),
            "the body is the object's from {from}, in order"
        );
    }
}

/// A request collapsed onto another's fetch of a slice watches its client
/// while it waits: one that hangs up is done with at once (logged with
/// status 0, as Squid logs a client's abort), not when the slice's origin at last answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collapsed_request_for_a_slice_whose_client_left_is_done_with_at_once() {
    // Holds the head until the gate opens.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let o = RawOrigin::start(move |mut s| {
        let gate = g.clone();
        async move {
            read_request_head(&mut s).await;
            gate.acquire().await.expect("gate").forget();
            let body: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-{}/{MIB}\r\nContent-Length: {MIB}\r\n\
                 Cache-Control: max-age=3600\r\n\r\n",
                MIB - 1
            );
            use tokio::io::AsyncWriteExt;
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&body).await;
        }
    })
    .await;
    let addr = free_addr();
    let p = Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n\
         [log]\naccess = \"{{dir}}/access.log\"\n\n\
         [cache]\ndir = \"{{dir}}/cache\"\nmemory = \"4MiB\"\ndisk = \"1GiB\"\nslice = \"1MiB\"\n"
    ))
    .await;
    let oaddr = o.addr();
    let request = format!("GET http://{oaddr}/held HTTP/1.1\r\nHost: {oaddr}\r\nConnection: close\r\n\r\n");
    let leader = {
        let (paddr, request) = (p.addr(), request.clone());
        tokio::spawn(async move {
            parse_response(&raw_request_timeout(paddr, request.as_bytes(), Duration::from_secs(30)).await)
        })
    };
    // The leader's fetch has reached the origin (and is held there)...
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while o.connections() < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the leader's fetch never reached the origin"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...and the second request is in service, waiting for it, when its
    // client hangs up.
    let log = hang_up_in_service(&p, &request, "/held HTTP/1.1\" 0 ").await;
    assert!(
        log.contains("/held HTTP/1.1\" 0 "),
        "the request whose client left was not done with while the origin held its answer:\n{log}"
    );
    gate.add_permits(1);
    let r = leader.await.unwrap();
    assert_eq!((r.status, r.body.len() as u64), (200, MIB));
    assert!(pattern_matches(0, &r.body));
    assert_eq!(o.connections(), 1);
}

/// Reads from `s` into `buf` until it holds `n` bytes: whether it did
/// within `within`.
async fn read_at_least(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>, n: usize, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + within;
    let mut tmp = vec![0u8; 1 << 16];
    while buf.len() < n {
        match tokio::time::timeout_at(deadline, s.read(&mut tmp)).await {
            Ok(Ok(k)) if k > 0 => buf.extend_from_slice(&tmp[..k]),
            _ => return false,
        }
    }
    true
}
