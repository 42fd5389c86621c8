//! Large bodies stream through the forward proxy in flat memory: a 1 GiB
//! download and a 256 MiB upload, with portico's resident set watched.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Portico's peak resident set must stay under this whatever the body size.
const RSS_LIMIT_KIB: u64 = 64 * 1024;

/// Bytes in one period of the harness pattern (byte `i` is `i % 251`).
const PERIOD: usize = 251;

async fn proxy() -> Portico {
    let addr = free_addr();
    Portico::start(&format!(
        "[[listener]]\naddress = \"{addr}\"\nmode = \"forward\"\n\n[log]\naccess = \"{{dir}}/access.log\"\n"
    ))
    .await
}

/// Reads from `stream` until the end of a response/request head; returns
/// the head text and the bytes read after it.
async fn read_head(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            return (head, buf[end + 4..].to_vec());
        }
        let n = stream.read(&mut tmp).await.expect("read head");
        assert!(
            n > 0,
            "peer closed before the end of the head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&tmp[..n]);
    }
}

/// The value of header `name` in a head (case-insensitive).
fn head_field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Samples portico's RSS while bytes move; keeps the largest value.
#[derive(Default)]
struct RssWatch {
    max_kib: u64,
    samples: usize,
}

impl RssWatch {
    fn sample(&mut self, p: &Portico) {
        self.max_kib = self.max_kib.max(p.rss_kib());
        self.samples += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_download_streams_through_in_flat_memory() {
    const LEN: u64 = 1 << 30;
    let origin = Origin::start(|_| async { Response::new(200).generated(LEN) }).await;
    let p = proxy().await;
    let started = Instant::now();

    let mut stream = TcpStream::connect(p.addr()).await.expect("connect to portico");
    let req = format!(
        "GET http://{0}/big HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n",
        origin.addr()
    );
    stream.write_all(req.as_bytes()).await.expect("send request");
    let (head, first) = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(
        head_field(&head, "content-length"),
        Some(LEN.to_string().as_str()),
        "{head}"
    );

    let mut total = first.len() as u64;
    assert!(pattern_matches(0, &first), "body start corrupted");
    let mut watch = RssWatch::default();
    let mut next_sample = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
            .await
            .expect("download stalled")
            .expect("read body");
        if n == 0 {
            break;
        }
        // Every byte is checked: a memcmp per read, cheap next to the copy.
        assert!(pattern_matches(total, &buf[..n]), "body corrupted at offset {total}");
        total += n as u64;
        if total >= next_sample {
            watch.sample(&p);
            next_sample = total + (16 << 20);
        }
    }
    let elapsed = started.elapsed();
    let hwm = p.hwm_kib();
    eprintln!(
        "1 GiB download: {elapsed:?}, peak RSS {hwm} KiB, max sampled RSS {} KiB over {} samples",
        watch.max_kib, watch.samples
    );
    assert_eq!(total, LEN, "wrong body length");
    assert!(watch.samples > 32, "too few RSS samples: {}", watch.samples);
    assert!(
        watch.max_kib < RSS_LIMIT_KIB,
        "RSS grew with the body: {} KiB",
        watch.max_kib
    );
    assert!(hwm < RSS_LIMIT_KIB, "peak RSS grew with the body: {hwm} KiB");
}

/// An origin that reads a `Content-Length` request body without storing it,
/// checks it against the pattern, and answers `<bytes> <ok|bad>`.
async fn counting_origin() -> RawOrigin {
    RawOrigin::start(|mut stream| async move {
        let (head, first) = read_head(&mut stream).await;
        let len: u64 = head_field(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let chunked = head_field(&head, "transfer-encoding").is_some();
        let mut count = first.len() as u64;
        let mut good = pattern_matches(0, &first);
        let mut buf = vec![0u8; 256 * 1024];
        while count < len {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    good &= pattern_matches(count, &buf[..n]);
                    count += n as u64;
                }
            }
        }
        let verdict = if chunked {
            "chunked".to_owned()
        } else {
            format!("{count} {}", if good { "ok" } else { "bad" })
        };
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{verdict}",
            verdict.len()
        );
        let _ = stream.write_all(resp.as_bytes()).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_of_256_mib_streams_through_in_flat_memory() {
    const LEN: u64 = 256 << 20;
    let origin = counting_origin().await;
    let p = proxy().await;
    let started = Instant::now();

    let stream = TcpStream::connect(p.addr()).await.expect("connect to portico");
    let (mut rd, mut wr) = stream.into_split();
    let head = format!(
        "POST http://{0}/upload HTTP/1.1\r\nHost: {0}\r\nContent-Length: {LEN}\r\nConnection: close\r\n\r\n",
        origin.addr()
    );
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await.expect("send head");
        // 64 KiB + one period, so every offset's next 64 KiB is a slice.
        let pattern: Vec<u8> = (0..(64 << 10) + PERIOD).map(|i| (i % PERIOD) as u8).collect();
        let mut sent = 0u64;
        while sent < LEN {
            let n = (LEN - sent).min(64 << 10) as usize;
            let start = (sent % PERIOD as u64) as usize;
            wr.write_all(&pattern[start..start + n]).await.expect("send body");
            sent += n as u64;
        }
        wr
    });

    // Sample RSS while the upload runs.
    let mut watch = RssWatch::default();
    while !writer.is_finished() {
        watch.sample(&p);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _wr = writer.await.expect("writer task");

    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), rd.read_to_end(&mut raw))
        .await
        .expect("response stalled")
        .expect("read response");
    let elapsed = started.elapsed();
    let hwm = p.hwm_kib();
    eprintln!(
        "256 MiB upload: {elapsed:?}, peak RSS {hwm} KiB, max sampled RSS {} KiB over {} samples",
        watch.max_kib, watch.samples
    );
    let resp = parse_response(&raw);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body_str(), format!("{LEN} ok"), "origin's count and pattern check");
    assert!(
        watch.max_kib < RSS_LIMIT_KIB,
        "RSS grew with the body: {} KiB",
        watch.max_kib
    );
    assert!(hwm < RSS_LIMIT_KIB, "peak RSS grew with the body: {hwm} KiB");
}
