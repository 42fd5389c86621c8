//! `replay PORT PLAN OUT`: sends the GETs of PLAN to 127.0.0.1:PORT on
//! schedule, whether or not earlier ones were answered (an open loop), and
//! writes one record per request to OUT.
//!
//! The polygraph scenario's client (bench/polygraph_bench.py makes the plan
//! and reads the records). Python's asyncio client lagged its schedule by
//! about 280 ms at p99 at 1,600 requests/s, sharing its CPU with the
//! origin, and could not offer 2,400: a lagging client measures itself. As
//! Web Polygraph's robots do, each outstanding request has a keep-alive
//! connection, idle ones are reused (the most recently used first) and new
//! ones opened when none is idle, at most MAX_CONNS at once.
//!
//! PLAN: one request per line, `DUE_US PATH EXPECTED_BYTES OFFERED_HIT(0|1)`,
//! DUE_US microseconds from the start. OUT: one line per request in plan
//! order, tab-separated: offered hit (0|1), status (a number, or an error's
//! text), whole body (0|1: a 200 with EXPECTED_BYTES of body), X-Cache's
//! first word (or `-`; `COLLAPSED` when a `Cache-Status` member says
//! `collapsed`), response ms (from the request's write, or the
//! connect before it, to the body's last byte), lag ms (how late the
//! request left against its schedule). The last line is `# connections N`:
//! connections opened.

use std::cell::{Cell, RefCell};
use std::io::Write as _;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

const MAX_CONNS: usize = 8000;
const TIMEOUT: Duration = Duration::from_secs(60);

struct Planned {
    due: Duration,
    path: String,
    expected: u64,
    hit: bool,
}

#[derive(Default, Clone)]
struct Record {
    hit: bool,
    status: String,
    whole: bool,
    x_cache: String,
    ms: f64,
    lag_ms: f64,
}

type Conn = BufReader<TcpStream>;

/// What one response was: status, body bytes, X-Cache's first word (or
/// `COLLAPSED`), and whether the connection may carry another request.
struct Answer {
    status: u16,
    body: u64,
    x_cache: String,
    keep: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: replay PORT PLAN OUT");
        std::process::exit(2);
    }
    let port: u16 = args[1]
        .parse()
        .unwrap_or_else(|e| fail(&format!("port {}: {e}", args[1])));
    let plan = read_plan(&args[2]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("runtime: {e}")));
    let (records, opened) = rt.block_on(tokio::task::LocalSet::new().run_until(replay(port, plan)));
    let mut out =
        std::io::BufWriter::new(std::fs::File::create(&args[3]).unwrap_or_else(|e| fail(&format!("{}: {e}", args[3]))));
    for r in &records {
        let _ = writeln!(
            out,
            "{}\t{}\t{}\t{}\t{:.3}\t{:.3}",
            u8::from(r.hit),
            r.status,
            u8::from(r.whole),
            if r.x_cache.is_empty() { "-" } else { &r.x_cache },
            r.ms,
            r.lag_ms
        );
    }
    let _ = writeln!(out, "# connections {opened}");
    if let Err(e) = out.flush() {
        fail(&format!("{}: {e}", args[3]));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("replay: {why}");
    std::process::exit(1);
}

fn read_plan(path: &str) -> Vec<Planned> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = || {
                fail(&format!(
                    "{path}:{}: want DUE_US PATH EXPECTED_BYTES HIT: {line:?}",
                    i + 1
                ))
            };
            if f.len() != 4 {
                bad();
            }
            Planned {
                due: Duration::from_micros(f[0].parse().unwrap_or_else(|_| bad())),
                path: f[1].to_string(),
                expected: f[2].parse().unwrap_or_else(|_| bad()),
                hit: f[3] == "1",
            }
        })
        .collect()
}

async fn replay(port: u16, plan: Vec<Planned>) -> (Vec<Record>, usize) {
    let idle: Rc<RefCell<Vec<Conn>>> = Rc::default();
    let opened = Rc::new(Cell::new(0usize));
    let records: Rc<RefCell<Vec<Record>>> = Rc::new(RefCell::new(vec![Record::default(); plan.len()]));
    let slots = Rc::new(Semaphore::new(MAX_CONNS));
    let t0 = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(plan.len());
    for (i, p) in plan.into_iter().enumerate() {
        tokio::time::sleep_until(t0 + p.due).await;
        let (idle, opened, records, slots) = (idle.clone(), opened.clone(), records.clone(), slots.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let lag_ms = (t0.elapsed().saturating_sub(p.due)).as_secs_f64() * 1000.0;
            let _slot = slots.acquire().await;
            let mut r = Record {
                hit: p.hit,
                status: "error".into(),
                lag_ms,
                ..Record::default()
            };
            // One retry on a fresh or other idle connection, as a keep-alive
            // connection the proxy closed meanwhile fails its next request.
            for _ in 0..2 {
                let reused = idle.borrow_mut().pop();
                let start = Instant::now();
                let conn = match reused {
                    Some(c) => Ok(c),
                    None => match TcpStream::connect(("127.0.0.1", port)).await {
                        Ok(s) => {
                            opened.set(opened.get() + 1);
                            let _ = s.set_nodelay(true);
                            Ok(BufReader::with_capacity(64 << 10, s))
                        }
                        Err(e) => Err(e.to_string()),
                    },
                };
                let mut conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        r.status = e;
                        continue;
                    }
                };
                match tokio::time::timeout(TIMEOUT, get(&mut conn, &p.path, port)).await {
                    Ok(Ok(a)) => {
                        r.ms = start.elapsed().as_secs_f64() * 1000.0;
                        r.status = a.status.to_string();
                        r.whole = a.status == 200 && a.body == p.expected;
                        r.x_cache = a.x_cache;
                        if a.keep {
                            idle.borrow_mut().push(conn);
                        }
                        break;
                    }
                    Ok(Err(e)) => r.status = e,
                    Err(_) => r.status = "timeout".into(),
                }
            }
            records.borrow_mut()[i] = r;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    (records.take(), opened.get())
}

/// One GET on `conn`, its body read whole (Content-Length or chunked).
async fn get(conn: &mut Conn, path: &str, port: u16) -> Result<Answer, String> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    conn.get_mut()
        .write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    read_line(conn, &mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {:?}", line.trim_end()))?;
    let (mut length, mut chunked, mut keep, mut x_cache) = (0u64, false, true, String::new());
    let mut collapsed = false;
    loop {
        read_line(conn, &mut line).await?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().map_err(|_| format!("bad Content-Length {value:?}"))?,
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            "connection" => keep = !value.eq_ignore_ascii_case("close"),
            // Squid's "HIT from host", a list: the first word, upper-case.
            "x-cache" => x_cache = value.split([' ', ',']).next().unwrap_or("").to_ascii_uppercase(),
            // RFC 9211: a request that waited for another's fetch says
            // `collapsed` (Portico with cache.cache_status set); its X-Cache
            // says HIT, as no origin request was made for it.
            "cache-status" => collapsed |= value.split(',').any(|m| m.split(';').any(|p| p.trim() == "collapsed")),
            _ => {}
        }
    }
    if collapsed {
        x_cache = String::from("COLLAPSED");
    }
    let mut body = 0;
    if chunked {
        loop {
            read_line(conn, &mut line).await?;
            let size = line.trim_end().split(';').next().unwrap_or("");
            let size = u64::from_str_radix(size.trim(), 16).map_err(|_| format!("bad chunk size {size:?}"))?;
            if size == 0 {
                read_line(conn, &mut line).await?; // no trailers expected
                break;
            }
            body += skip(conn, size).await?;
            skip(conn, 2).await?;
        }
    } else {
        body = skip(conn, length).await?;
    }
    Ok(Answer {
        status,
        body,
        x_cache,
        keep,
    })
}

/// Reads the next line into `line`; an error at the end of the stream.
async fn read_line(conn: &mut Conn, line: &mut String) -> Result<(), String> {
    line.clear();
    match conn.read_line(line).await {
        Ok(0) => Err("closed".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Reads and drops `n` bytes.
async fn skip(conn: &mut Conn, n: u64) -> Result<u64, String> {
    let copied = tokio::io::copy(&mut conn.take(n), &mut tokio::io::sink())
        .await
        .map_err(|e| e.to_string())?;
    if copied < n {
        return Err("closed".into());
    }
    Ok(copied)
}
