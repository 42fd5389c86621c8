//! A DNS server for the tests, on a UDP port of 127.0.0.1: every Portico the
//! harness starts asks it (`[origin] nameservers`), so no test ever queries
//! the machine's resolver.
//!
//! It answers `A` and `AAAA` questions for the names given to
//! [`DnsServer::add`] (with their TTL), an empty answer (NOERROR) for other
//! types of a known name, and NXDOMAIN for every other name. It can be made
//! slow ([`DnsServer::delay`]) or silent ([`DnsServer::silent`]), and it
//! counts the questions it got ([`DnsServer::queries`]).
//!
//! Only the small part of the wire format (RFC 1035 §4) a stub resolver
//! uses is handled: one question, answers with a compression pointer to it.
//! Answers are never truncated, so a resolver never falls back to TCP and
//! no TCP listener is needed. Answers carry no OPT record (RFC 6891 allows
//! a server without EDNS to answer without one).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Record type A (RFC 1035).
const TYPE_A: u16 = 1;
/// Record type AAAA (RFC 3596).
const TYPE_AAAA: u16 = 28;
/// Response code NXDOMAIN.
const NXDOMAIN: u16 = 3;
/// Response code FORMERR (a question it cannot parse).
const FORMERR: u16 = 1;

/// A question the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The name, in lower case, without the trailing dot.
    pub name: String,
    /// The type asked for (1 = A, 28 = AAAA, ...).
    pub qtype: u16,
}

/// State shared with the serving thread.
#[derive(Default)]
struct Shared {
    /// Name (lower case, no trailing dot) -> addresses with their TTL.
    records: Mutex<HashMap<String, Vec<(IpAddr, u32)>>>,
    /// Every question received, in order.
    questions: Mutex<Vec<Question>>,
    /// Answers wait this long (milliseconds) before they are sent.
    delay_ms: AtomicU64,
    /// Questions are read and counted, but never answered.
    silent: AtomicBool,
    /// Ends the serving thread.
    stop: AtomicBool,
}

/// The running server; stopped on Drop.
pub struct DnsServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Binds a UDP socket on 127.0.0.1 (ephemeral port) and serves it from
    /// a thread of its own, so it keeps answering whatever runtime the test
    /// uses (and whether or not the test is async).
    pub fn start() -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind the test DNS server on 127.0.0.1");
        let addr = socket.local_addr().expect("local_addr of the test DNS server");
        // A short read timeout lets the thread notice `stop`.
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("set_read_timeout");
        let shared = Arc::new(Shared::default());
        let thread = std::thread::Builder::new()
            .name("test-dns".into())
            .spawn({
                let shared = shared.clone();
                move || serve(socket, shared)
            })
            .expect("spawn the test DNS server thread");
        DnsServer {
            addr,
            shared,
            thread: Some(thread),
        }
    }

    /// Where it listens (`127.0.0.1:PORT`, UDP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Makes `name` resolve to `ip` (an A or AAAA record by the address
    /// family) with a TTL of `ttl` seconds, besides any address it had.
    pub fn add(&self, name: &str, ip: IpAddr, ttl: u32) {
        let mut records = self.shared.records.lock().expect("dns records lock");
        records.entry(normalise(name)).or_default().push((ip, ttl));
    }

    /// Makes `name` resolve to `ip` alone from now on (the addresses it
    /// had are forgotten), with a TTL of `ttl` seconds.
    pub fn replace(&self, name: &str, ip: IpAddr, ttl: u32) {
        let mut records = self.shared.records.lock().expect("dns records lock");
        records.insert(normalise(name), vec![(ip, ttl)]);
    }

    /// Answers wait `delay` before they are sent (zero: at once).
    pub fn delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// `true`: questions are counted but never answered.
    pub fn silent(&self, silent: bool) {
        self.shared.silent.store(silent, Ordering::Relaxed);
    }

    /// Every question received so far, in order.
    pub fn questions(&self) -> Vec<Question> {
        self.shared.questions.lock().expect("dns questions lock").clone()
    }

    /// How many questions (of any type) named `name`.
    pub fn queries(&self, name: &str) -> usize {
        let name = normalise(name);
        self.questions().iter().filter(|q| q.name == name).count()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Lower case, no trailing dot: DNS names compare case-insensitively.
fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn serve(socket: UdpSocket, shared: Arc<Shared>) {
    let mut buf = [0u8; 1500];
    while !shared.stop.load(Ordering::Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(x) => x,
            // Read timeout (WouldBlock / TimedOut): look at `stop` again.
            Err(_) => continue,
        };
        let Some(answer) = answer(&buf[..n], &shared) else {
            continue;
        };
        if shared.silent.load(Ordering::Relaxed) {
            continue;
        }
        let delay = Duration::from_millis(shared.delay_ms.load(Ordering::Relaxed));
        if delay.is_zero() {
            let _ = socket.send_to(&answer, from);
        } else if let Ok(sender) = socket.try_clone() {
            // A thread per slow answer, so one wait does not delay the
            // questions behind it (a resolver asks A and AAAA at once).
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let _ = sender.send_to(&answer, from);
            });
        }
    }
}

/// The answer to the message `query`, recording its question; None for
/// what is not a query at all (too short, or a response).
fn answer(query: &[u8], shared: &Shared) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    let id = &query[..2];
    // Echo the opcode and the RD bit; set QR and RA.
    let flags = (u16::from(query[2] & 0x79) << 8) | 0x8080;
    let reply = |rcode: u16, question: &[u8], answers: &[Vec<u8>]| {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(id);
        out.extend_from_slice(&(flags | rcode).to_be_bytes());
        out.extend_from_slice(&u16::from(!question.is_empty()).to_be_bytes());
        out.extend_from_slice(&(answers.len() as u16).to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(question);
        for a in answers {
            out.extend_from_slice(a);
        }
        out
    };
    let qdcount = u16::from_be_bytes([query[4], query[5]]);
    let Some((name, end)) = (qdcount == 1).then(|| read_name(query, 12)).flatten() else {
        return Some(reply(FORMERR, &[], &[]));
    };
    let Some(fixed) = query.get(end..end + 4) else {
        return Some(reply(FORMERR, &[], &[]));
    };
    let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let question = &query[12..end + 4];
    shared.questions.lock().ok()?.push(Question {
        name: name.clone(),
        qtype,
    });
    let records = shared.records.lock().ok()?;
    let Some(addrs) = records.get(&name) else {
        return Some(reply(NXDOMAIN, question, &[]));
    };
    let answers: Vec<Vec<u8>> = addrs
        .iter()
        .filter_map(|(ip, ttl)| {
            let (rtype, data) = match ip {
                IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
                IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
            };
            (rtype == qtype).then(|| {
                // Name: a pointer to the question's name at offset 12.
                let mut rr = vec![0xC0, 12];
                rr.extend_from_slice(&rtype.to_be_bytes());
                rr.extend_from_slice(&1u16.to_be_bytes()); // class IN
                rr.extend_from_slice(&ttl.to_be_bytes());
                rr.extend_from_slice(&(data.len() as u16).to_be_bytes());
                rr.extend_from_slice(&data);
                rr
            })
        })
        .collect();
    Some(reply(0, question, &answers))
}

/// The name starting at `at` (uncompressed labels, as in a question) in
/// lower case without the trailing dot, and the offset just past it.
fn read_name(msg: &[u8], mut at: usize) -> Option<(String, usize)> {
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            return Some((labels.join(".").to_ascii_lowercase(), at));
        }
        // 0xC0: a compression pointer, which a question does not use.
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(msg.get(at..at + len)?).into_owned());
        at += len;
    }
}
