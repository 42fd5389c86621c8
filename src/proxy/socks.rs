//! The SOCKS 5 server of `mode = "socks"` listeners (RFC 1928): method
//! negotiation, RFC 1929 username/password checked against `[auth]`'s user
//! databases, and the CONNECT command to an IPv4 address, an IPv6 address
//! or a domain name. BIND and UDP ASSOCIATE are answered "command not
//! supported" (0x07).
//!
//! Only the framing is SOCKS's own: once the target is known, a session is
//! a CONNECT tunnel, so it goes through the same steps as one (the client
//! allow-list, the `[[acl]]` decision for method CONNECT, the `[[rule]]`s,
//! an admission permit until the target is connected, the connector with
//! its DNS cache, connect timeout and own-address check, the tunnel's
//! relay and idle timeout) and is logged and counted as one (an access-log
//! line `CONNECT host:port SOCKS/5`, a CONNECT request in the statistics,
//! plus the `socks` section). What differs is how a refusal is said: a
//! SOCKS reply code where a tunnel has an HTTP status; the access log
//! keeps the HTTP status a CONNECT would have had (see `reply_status`), so
//! log analysers read both the same way.

use super::{ACCESS_DENIED, ACCESS_NONE, ListenerHandler, Shared, tunnel};
use crate::auth::{Refusal, User};
use crate::config::Mode;
use crate::http1::ClientStream;
use crate::log::AccessRecord;
use crate::upstream::{ConnectError, ConnectErrorKind};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The protocol version byte of every SOCKS 5 message (RFC 1928 3, 4).
const VERSION: u8 = 5;
/// Method "no authentication required" (RFC 1928 3).
pub(crate) const NO_AUTH: u8 = 0x00;
/// Method "username/password" (RFC 1928 3, RFC 1929).
pub(crate) const USER_PASS: u8 = 0x02;
/// "No acceptable methods": the client must close (RFC 1928 3).
pub(crate) const NO_ACCEPTABLE: u8 = 0xFF;
/// The version byte of the RFC 1929 sub-negotiation.
const AUTH_VERSION: u8 = 1;
/// The longest domain name (RFC 1035 2.3.4: 255 octets on the wire, so at
/// most 253 characters written out); the address field itself allows 255.
const MAX_NAME: usize = 253;

/// The commands of RFC 1928 4.
const CMD_CONNECT: u8 = 1;
/// The address types of RFC 1928 4 and 5.
const ATYP_IPV4: u8 = 1;
const ATYP_NAME: u8 = 3;
const ATYP_IPV6: u8 = 4;

/// A reply code (RFC 1928 6, the REP field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// 0x00 succeeded.
    Succeeded = 0,
    /// 0x01 general SOCKS server failure.
    GeneralFailure = 1,
    /// 0x02 connection not allowed by ruleset.
    NotAllowed = 2,
    /// 0x03 network unreachable.
    NetworkUnreachable = 3,
    /// 0x04 host unreachable.
    HostUnreachable = 4,
    /// 0x05 connection refused.
    Refused = 5,
    /// 0x06 TTL expired (what a connect timeout is told as).
    TtlExpired = 6,
    /// 0x07 command not supported.
    CommandNotSupported = 7,
    /// 0x08 address type not supported.
    AddressTypeNotSupported = 8,
}

/// The method the server selects from those the client `offered` (RFC 1928
/// 3): username/password whenever `[auth]` is on (`auth_on`) and the
/// client offers it, so that `[[acl]]` entries naming users and groups see
/// the user; else "no authentication" when credentials are not
/// `required` and the client offers it; else none acceptable.
pub(crate) fn select_method(offered: &[u8], auth_on: bool, required: bool) -> u8 {
    if auth_on && offered.contains(&USER_PASS) {
        USER_PASS
    } else if !(auth_on && required) && offered.contains(&NO_AUTH) {
        NO_AUTH
    } else {
        NO_ACCEPTABLE
    }
}

/// A domain name from the request's address field, if it can name a host:
/// 1 to 253 characters, letters, digits, `-`, `_` and `.` only. Anything
/// else (an empty field, spaces, `:`, `/`, `@`, control or non-ASCII bytes)
/// is refused rather than passed to the resolver, the `[[acl]]` host match
/// and the access log, none of which expect it.
pub(crate) fn domain_name(raw: &[u8]) -> Option<String> {
    let ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if raw.is_empty() || raw.len() > MAX_NAME || !raw.iter().all(ok) || raw.iter().all(|&b| b == b'.') {
        return None;
    }
    String::from_utf8(raw.to_vec()).ok()
}

/// The reply for a failed connection to the target: the name did not
/// resolve or the host cannot be reached (0x04), the host refused (0x05),
/// no connection within `origin.connect_timeout` (0x06, the closest code
/// RFC 1928 has for a timeout), the address is Portico's own (0x02: a
/// forwarding loop is refused by rule, as a CONNECT answers 508; so is an
/// address `proxy.deny_destinations` refuses), anything else (a parent
/// that would not tunnel) 0x01.
pub(crate) fn connect_reply(e: &ConnectError) -> Reply {
    match e.kind {
        ConnectErrorKind::Dns => Reply::HostUnreachable,
        ConnectErrorKind::Timeout => Reply::TtlExpired,
        ConnectErrorKind::Loop | ConnectErrorKind::Denied => Reply::NotAllowed,
        // The detail is `util::io_cause`'s plain words for the last address tried.
        ConnectErrorKind::Refused if e.detail.starts_with("connection refused") => Reply::Refused,
        ConnectErrorKind::Refused if e.detail.starts_with("network unreachable") => Reply::NetworkUnreachable,
        ConnectErrorKind::Refused => Reply::HostUnreachable,
        ConnectErrorKind::Tls | ConnectErrorKind::Parent => Reply::GeneralFailure,
    }
}

/// The HTTP status a CONNECT tunnel would have answered where this session
/// got `reply`: what its access-log line and the statistics record.
pub(crate) fn reply_status(reply: Reply, e: Option<&ConnectError>) -> u16 {
    match (reply, e.map(|e| e.kind)) {
        (Reply::Succeeded, _) => 200,
        (_, Some(ConnectErrorKind::Timeout)) => 504,
        (_, Some(ConnectErrorKind::Loop)) => 508,
        (_, Some(ConnectErrorKind::Denied)) => 403,
        (_, Some(_)) => 502,
        (Reply::NotAllowed, None) => 403,
        (Reply::CommandNotSupported | Reply::AddressTypeNotSupported, None) => 501,
        _ => 400,
    }
}

/// One session, as its access-log line and its counters need it.
struct Session {
    peer: SocketAddr,
    started: Instant,
    /// `host:port` as the client named it, once its request is read.
    target: Option<String>,
    user: Option<Arc<User>>,
    /// The HTTP status a CONNECT would have had (see [`reply_status`]).
    status: u16,
    cache: Option<&'static str>,
    hierarchy: Option<String>,
    /// Bytes relayed client to target, target to client.
    up: u64,
    down: u64,
}

/// Why negotiation stopped reading: the client closed, went silent past
/// the deadline, or the socket failed.
#[derive(Debug)]
enum Cut {
    Closed,
    TimedOut,
}

/// Reads exactly `buf.len()` bytes before `deadline`, straight from the
/// socket (a SOCKS listener has no TLS: `config::load` refuses
/// certificates on one), so that bytes after the request stay in the
/// kernel for the relay.
async fn read(stream: &ClientStream, buf: &mut [u8], deadline: tokio::time::Instant) -> Result<(), Cut> {
    let tcp = stream.tcp();
    let mut filled = 0;
    let fill = async {
        while filled < buf.len() {
            tcp.readable().await.map_err(|_| Cut::Closed)?;
            match tcp.try_read(&mut buf[filled..]) {
                Ok(0) => return Err(Cut::Closed),
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return Err(Cut::Closed),
            }
        }
        Ok(())
    };
    tokio::time::timeout_at(deadline, fill)
        .await
        .unwrap_or(Err(Cut::TimedOut))
}

impl ListenerHandler {
    /// Serves one connection of a SOCKS listener to its end: negotiation,
    /// then the relay; one access-log line for any session that sent a byte.
    pub(super) async fn serve_socks(&self, stream: ClientStream, peer: SocketAddr) {
        let sh = self.shared.load_full();
        let header_timeout = sh.config.limits.header_timeout.get();
        // The wait for the first byte, as `limits.header_timeout` bounds an
        // HTTP connection's: a connection that says nothing is closed
        // without a log line, as an HTTP one is.
        let mut first = [0u8; 1];
        let deadline = tokio::time::Instant::now() + header_timeout;
        if read(&stream, &mut first, deadline).await.is_err() {
            return;
        }
        sh.stats.begin(self.index);
        sh.stats.socks.sessions.fetch_add(1, Relaxed);
        let mut s = Session {
            peer,
            started: Instant::now(),
            target: None,
            user: None,
            status: 400,
            cache: Some(ACCESS_NONE),
            hierarchy: None,
            up: 0,
            down: 0,
        };
        let closed_by_us = self.session(&sh, &stream, first[0], &mut s).await;
        if closed_by_us {
            crate::http1::lingering_close(&stream).await;
        }
        let request_line = match &s.target {
            Some(t) => ["CONNECT ", t, " SOCKS/5"].concat(),
            None => "- - SOCKS/5".to_string(),
        };
        sh.access_log.record(&AccessRecord {
            client: peer.ip(),
            user: s.user.as_deref().map(|u| u.name.as_str()),
            request_line: &request_line,
            status: s.status,
            bytes: s.down,
            referer: None,
            user_agent: None,
            elapsed: s.started.elapsed(),
            cache: s.cache,
            hierarchy: s.hierarchy.as_deref(),
            headers: None,
            tls: false,
        });
        sh.stats.end(&http::Method::CONNECT, s.status, s.up, s.down);
    }

    /// The session after its first byte `version`; fills `s` and returns
    /// true when it ended on a refusal, so the caller closes lingering
    /// (the reply must not be lost to a reset over unread input).
    async fn session(&self, sh: &Shared, stream: &ClientStream, version: u8, s: &mut Session) -> bool {
        let counters = &sh.stats.socks;
        let header_timeout = sh.config.limits.header_timeout.get();
        let mut deadline = tokio::time::Instant::now() + header_timeout;
        let malformed = |s: &mut Session, why: &str, cut: Option<Cut>| {
            counters.malformed.fetch_add(1, Relaxed);
            if matches!(cut, Some(Cut::TimedOut)) {
                s.status = 408;
            }
            tracing::info!(client = %s.peer.ip(), "SOCKS: {why}");
        };
        if version != VERSION {
            // No reply: RFC 1928 has none for another version, and a SOCKS 4
            // client would misread a version 5 one.
            malformed(s, &format!("not SOCKS version 5 (version byte {version:#04x})"), None);
            return true;
        }
        // The greeting: VER NMETHODS METHODS (RFC 1928 3).
        let mut n = [0u8; 1];
        if let Err(cut) = read(stream, &mut n, deadline).await {
            malformed(s, "greeting cut short", Some(cut));
            return false;
        }
        if n[0] == 0 {
            let _ = self.send(stream, &[VERSION, NO_ACCEPTABLE], header_timeout).await;
            malformed(s, "greeting offers no method", None);
            return true;
        }
        let mut offered = vec![0u8; usize::from(n[0])];
        if let Err(cut) = read(stream, &mut offered, deadline).await {
            malformed(s, "greeting cut short", Some(cut));
            return false;
        }
        // A client outside `access.allow` is not asked for credentials: it
        // is refused on its request (0x02), the one reply that says why.
        let allowed = sh.allow.allows(s.peer.ip());
        let auth = sh.auth.as_ref().filter(|_| allowed);
        let method = select_method(&offered, auth.is_some(), sh.config.auth.required);
        if self.send(stream, &[VERSION, method], header_timeout).await.is_err() {
            return false;
        }
        if method == NO_ACCEPTABLE {
            if auth.is_some() {
                counters.auth_failures.fetch_add(1, Relaxed);
                s.status = 407;
                s.cache = Some(ACCESS_DENIED);
                tracing::info!(client = %s.peer.ip(), "SOCKS: refused: no username/password offered (auth.required)");
            } else {
                malformed(s, "no acceptable method offered", None);
            }
            return true;
        }
        if method == USER_PASS
            && let Some(auth) = auth
        {
            match self.login(sh, stream, auth, s, deadline).await {
                Ok(()) => {}
                Err(closed_by_us) => return closed_by_us,
            }
            // Verification may have waited on the directory: the request
            // gets a fresh header timeout.
            deadline = tokio::time::Instant::now() + header_timeout;
        }
        // The request: VER CMD RSV ATYP DST.ADDR DST.PORT (RFC 1928 4).
        let mut head = [0u8; 4];
        if let Err(cut) = read(stream, &mut head, deadline).await {
            malformed(s, "request cut short", Some(cut));
            return false;
        }
        let [ver, cmd, _reserved, atyp] = head;
        if ver != VERSION {
            let _ = self.reply(stream, Reply::GeneralFailure, None, header_timeout).await;
            malformed(s, &format!("request of version {ver:#04x}"), None);
            return true;
        }
        let host = match atyp {
            ATYP_IPV4 => {
                let mut a = [0u8; 4];
                if let Err(cut) = read(stream, &mut a, deadline).await {
                    malformed(s, "request cut short", Some(cut));
                    return false;
                }
                Ipv4Addr::from(a).to_string()
            }
            ATYP_IPV6 => {
                let mut a = [0u8; 16];
                if let Err(cut) = read(stream, &mut a, deadline).await {
                    malformed(s, "request cut short", Some(cut));
                    return false;
                }
                format!("[{}]", Ipv6Addr::from(a))
            }
            ATYP_NAME => {
                let mut len = [0u8; 1];
                if let Err(cut) = read(stream, &mut len, deadline).await {
                    malformed(s, "request cut short", Some(cut));
                    return false;
                }
                let mut raw = vec![0u8; usize::from(len[0])];
                if let Err(cut) = read(stream, &mut raw, deadline).await {
                    malformed(s, "request cut short", Some(cut));
                    return false;
                }
                match domain_name(&raw) {
                    Some(name) => name,
                    None => {
                        let _ = self.reply(stream, Reply::GeneralFailure, None, header_timeout).await;
                        malformed(s, &format!("not a host name ({} bytes)", raw.len()), None);
                        return true;
                    }
                }
            }
            other => {
                // The rest of the request cannot even be delimited.
                let _ = self
                    .reply(stream, Reply::AddressTypeNotSupported, None, header_timeout)
                    .await;
                counters.unsupported.fetch_add(1, Relaxed);
                s.status = reply_status(Reply::AddressTypeNotSupported, None);
                tracing::info!(client = %s.peer.ip(), "SOCKS: address type {other:#04x} not supported");
                return true;
            }
        };
        let mut p = [0u8; 2];
        if let Err(cut) = read(stream, &mut p, deadline).await {
            malformed(s, "request cut short", Some(cut));
            return false;
        }
        let port = u16::from_be_bytes(p);
        s.target = Some(format!("{host}:{port}"));
        if cmd != CMD_CONNECT {
            // BIND (2) and UDP ASSOCIATE (3) would need listening sockets
            // and a UDP relay; other values are no command at all.
            let _ = self
                .reply(stream, Reply::CommandNotSupported, None, header_timeout)
                .await;
            counters.unsupported.fetch_add(1, Relaxed);
            s.status = reply_status(Reply::CommandNotSupported, None);
            tracing::info!(client = %s.peer.ip(), "SOCKS: command {cmd:#04x} to {host}:{port} not supported");
            return true;
        }
        self.connect(sh, stream, &host, port, allowed, s).await
    }

    /// The RFC 1929 sub-negotiation: VER ULEN UNAME PLEN PASSWD, checked
    /// by `[auth]` (its user cache, the htpasswd file or the directory).
    /// `Err(closed_by_us)` ends the session.
    async fn login(
        &self,
        sh: &Shared,
        stream: &ClientStream,
        auth: &Arc<crate::auth::Authenticator>,
        s: &mut Session,
        deadline: tokio::time::Instant,
    ) -> Result<(), bool> {
        let counters = &sh.stats.socks;
        let send_timeout = sh.config.limits.header_timeout.get();
        let cut = |s: &mut Session, cut: Cut| {
            counters.malformed.fetch_add(1, Relaxed);
            if matches!(cut, Cut::TimedOut) {
                s.status = 408;
            }
            tracing::info!(client = %s.peer.ip(), "SOCKS: username/password cut short");
            Err(false)
        };
        let mut b = [0u8; 2];
        if let Err(c) = read(stream, &mut b, deadline).await {
            return cut(s, c);
        }
        let [ver, ulen] = b;
        if ver != AUTH_VERSION {
            // RFC 1929 2: any status but 0x00 is a failure, and the
            // server closes the connection.
            let _ = crate::http1::write_all(stream, &[AUTH_VERSION, 1], send_timeout).await;
            counters.malformed.fetch_add(1, Relaxed);
            tracing::info!(client = %s.peer.ip(), "SOCKS: username/password sub-negotiation of version {ver:#04x}");
            return Err(true);
        }
        let mut user = vec![0u8; usize::from(ulen)];
        if let Err(c) = read(stream, &mut user, deadline).await {
            return cut(s, c);
        }
        let mut plen = [0u8; 1];
        if let Err(c) = read(stream, &mut plen, deadline).await {
            return cut(s, c);
        }
        let mut password = vec![0u8; usize::from(plen[0])];
        if let Err(c) = read(stream, &mut password, deadline).await {
            return cut(s, c);
        }
        s.cache = Some(ACCESS_DENIED);
        s.status = 407;
        let refuse = |s: &Session, why: &str| {
            counters.auth_failures.fetch_add(1, Relaxed);
            tracing::info!(client = %s.peer.ip(), "SOCKS: login refused: {why}");
        };
        // The rules of Basic credentials (`auth::basic`): a user-id without
        // `:` or control characters, a password without control
        // characters, both UTF-8; and neither empty.
        let text = |raw: Vec<u8>| String::from_utf8(raw).ok().filter(|t| !t.chars().any(char::is_control));
        let (Some(name), Some(password)) = (text(user), text(password)) else {
            let _ = crate::http1::write_all(stream, &[AUTH_VERSION, 1], send_timeout).await;
            refuse(s, "user or password not UTF-8 text");
            return Err(true);
        };
        if name.is_empty() || password.is_empty() || name.contains(':') {
            let _ = crate::http1::write_all(stream, &[AUTH_VERSION, 1], send_timeout).await;
            refuse(s, "empty user or password, or a user with ':'");
            return Err(true);
        }
        let creds = crate::auth::basic::Basic {
            user: name.clone(),
            password,
        };
        match auth.authenticate(creds, &sh.blocking).await {
            Ok(user) => {
                s.user = Some(user);
                s.cache = Some(ACCESS_NONE);
                s.status = 400;
                if crate::http1::write_all(stream, &[AUTH_VERSION, 0], send_timeout)
                    .await
                    .is_err()
                {
                    return Err(false);
                }
                Ok(())
            }
            Err(Refusal::Invalid) => {
                // Logged as the name presented, as a refused HTTP request
                // is: that is what shows a guesser.
                s.user = Some(Arc::new(User {
                    name: name.clone(),
                    groups: Vec::new(),
                }));
                let _ = crate::http1::write_all(stream, &[AUTH_VERSION, 1], send_timeout).await;
                refuse(s, &format!("wrong credentials for user {name:?}"));
                Err(true)
            }
            Err(Refusal::Unavailable(_)) => {
                // The error log has the episode's line already (`auth`).
                s.status = 503;
                s.cache = Some(ACCESS_NONE);
                let _ = crate::http1::write_all(stream, &[AUTH_VERSION, 1], send_timeout).await;
                Err(true)
            }
        }
    }

    /// The CONNECT command to `host:port`: access, routing, admission,
    /// the connection, the reply, then the relay. True when it ended on a
    /// refusal.
    async fn connect(
        &self,
        sh: &Shared,
        stream: &ClientStream,
        host: &str,
        port: u16,
        allowed: bool,
        s: &mut Session,
    ) -> bool {
        let counters = &sh.stats.socks;
        let send_timeout = sh.config.limits.header_timeout.get();
        let deny = |s: &mut Session, status: u16, why: &str| {
            counters.denied.fetch_add(1, Relaxed);
            s.status = status;
            s.cache = Some(ACCESS_DENIED);
            tracing::info!(client = %s.peer.ip(), "SOCKS CONNECT {host}:{port}: denied by {why}");
        };
        if !allowed {
            let _ = self.reply(stream, Reply::NotAllowed, None, send_timeout).await;
            deny(s, 403, "access.allow");
            return true;
        }
        let acl_host = crate::rules::tunnel_host(host);
        let headers = http::HeaderMap::new();
        let user = s.user.clone();
        let decision = sh.acl.decide_now(&crate::acl::Request::tunnel(
            &acl_host,
            port,
            s.peer.ip(),
            &headers,
            Mode::Socks,
            user.as_deref().map(User::identity),
        ));
        let reach = sh.reach_of(&decision, s.peer.ip());
        match decision {
            crate::acl::Decision::Allow { .. } => {}
            crate::acl::Decision::Deny { entry, .. } => {
                sh.stats.acl_denied();
                let _ = self.reply(stream, Reply::NotAllowed, None, send_timeout).await;
                let by = entry.map_or_else(|| "access.acl_default".to_string(), |i| format!("acl[{i}]"));
                deny(s, 403, &by);
                return true;
            }
            crate::acl::Decision::NeedAuth { entry } => {
                // A SOCKS client cannot be asked for credentials after its
                // method was chosen: the entry's condition is unmet.
                let _ = self.reply(stream, Reply::NotAllowed, None, send_timeout).await;
                deny(
                    s,
                    407,
                    &format!("acl[{entry}] (it needs a user; log in with username/password)"),
                );
                return true;
            }
        }
        let route = match sh.rules.is_empty() {
            true => crate::rules::Route::default(),
            false => sh.rules.route(&crate::rules::Request::tunnel(
                &acl_host,
                port,
                s.peer.ip(),
                &headers,
                Mode::Socks,
            )),
        };
        if route.deny.is_some() || route.redirect.is_some() {
            let _ = self.reply(stream, Reply::NotAllowed, None, send_timeout).await;
            deny(s, 403, "a routing rule");
            return true;
        }
        // A service place (`server.max_requests`) while the target is
        // connected, given back once the relay starts, as a CONNECT's is.
        let admitted = tokio::select! {
            biased;
            admitted = sh.admission.admit() => admitted,
            () = crate::http1::client_closed(stream) => {
                sh.admission.abandoned();
                return false;
            }
        };
        let Ok(permit) = admitted else {
            let _ = self.reply(stream, Reply::GeneralFailure, None, send_timeout).await;
            s.status = 503;
            tracing::debug!(client = %s.peer.ip(), "SOCKS CONNECT {host}:{port}: connection queue full");
            return true;
        };
        let parent = route.upstream.filter(|&g| sh.groups.get(g).is_some_and(|g| g.parent));
        let opened = match parent {
            None => {
                s.hierarchy = Some(format!("HIER_DIRECT/{host}"));
                sh.direct_for(reach)
                    .connector()
                    .tcp(host, port)
                    .await
                    .map(|u| (crate::upstream::Wire::Tcp(u), bytes::Bytes::new()))
            }
            Some(g) => {
                // No client credentials to pass on: only a group's own.
                let auth = super::parent_credentials(sh, g, &route, &None);
                tunnel::through_parent(&mut s.hierarchy, sh, g, host, port, auth.as_ref()).await
            }
        };
        let (upstream, early) = match opened {
            Ok(o) => o,
            Err(e) => {
                let reply = connect_reply(&e);
                let _ = self.reply(stream, reply, None, send_timeout).await;
                s.status = reply_status(reply, Some(&e));
                if matches!(e.kind, ConnectErrorKind::Loop | ConnectErrorKind::Denied) {
                    counters.denied.fetch_add(1, Relaxed);
                } else {
                    counters.connect_failures.fetch_add(1, Relaxed);
                }
                tracing::warn!(client = %s.peer.ip(), "SOCKS CONNECT {host}:{port}: {e}");
                return true;
            }
        };
        // BND.ADDR and BND.PORT: the address Portico connected from.
        let bound = upstream.tcp().local_addr().ok();
        if self.reply(stream, Reply::Succeeded, bound, send_timeout).await.is_err() {
            return false;
        }
        let _pump = permit.into_pump();
        counters.established.fetch_add(1, Relaxed);
        s.status = 200;
        s.cache = None;
        if !early.is_empty() && crate::http1::write_all(stream, &early, send_timeout).await.is_err() {
            return false;
        }
        add(&counters.bytes_down, early.len() as u64);
        let idle = sh.config.proxy.tunnel_idle_timeout.get();
        let upstream = upstream.into_relay();
        let mut meter = crate::client_bandwidth::Pacer::new(s.peer.ip(), Default::default());
        if let Some(b) = route.bandwidth {
            meter.limit_route(b.rate, b.after);
        }
        let tally = crate::http1::Tally {
            up: &counters.bytes_up,
            down: &counters.bytes_down,
        };
        let (up, down) = tunnel::relay(stream, &upstream, idle, meter, tally).await;
        s.up = up;
        s.down = down + early.len() as u64;
        tracing::debug!("SOCKS {host}:{port} closed: {up} bytes up, {} bytes down", s.down);
        false
    }

    /// Writes `bytes` within `timeout`.
    async fn send(&self, stream: &ClientStream, bytes: &[u8], timeout: Duration) -> std::io::Result<()> {
        crate::http1::write_all(stream, bytes, timeout).await
    }

    /// Writes a reply (RFC 1928 6): VER REP RSV ATYP BND.ADDR BND.PORT,
    /// with `bound` or, for a failure, the IPv4 address 0.0.0.0 port 0.
    async fn reply(
        &self,
        stream: &ClientStream,
        rep: Reply,
        bound: Option<SocketAddr>,
        timeout: Duration,
    ) -> std::io::Result<()> {
        let bound = bound.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let mut out = vec![VERSION, rep as u8, 0];
        match bound.ip().to_canonical() {
            IpAddr::V4(a) => {
                out.push(ATYP_IPV4);
                out.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                out.push(ATYP_IPV6);
                out.extend_from_slice(&a.octets());
            }
        }
        out.extend_from_slice(&bound.port().to_be_bytes());
        self.send(stream, &out, timeout).await
    }
}

/// Adds `n` to a counter.
fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: ConnectErrorKind, detail: &str) -> ConnectError {
        ConnectError {
            kind,
            target: "h:1".into(),
            detail: detail.into(),
        }
    }

    #[test]
    fn the_server_selects_username_password_when_auth_is_on_and_offered() {
        assert_eq!(select_method(&[NO_AUTH, USER_PASS], true, false), USER_PASS);
        assert_eq!(select_method(&[NO_AUTH, USER_PASS], true, true), USER_PASS);
        assert_eq!(select_method(&[USER_PASS], true, true), USER_PASS);
    }

    #[test]
    fn no_authentication_is_selected_only_when_credentials_are_not_required() {
        assert_eq!(select_method(&[NO_AUTH], false, false), NO_AUTH);
        assert_eq!(select_method(&[NO_AUTH], false, true), NO_AUTH);
        assert_eq!(select_method(&[NO_AUTH], true, false), NO_AUTH);
        assert_eq!(select_method(&[NO_AUTH], true, true), NO_ACCEPTABLE);
    }

    #[test]
    fn if_no_offered_method_is_acceptable_the_server_replies_ff() {
        assert_eq!(select_method(&[], false, false), NO_ACCEPTABLE);
        assert_eq!(select_method(&[0x01, 0x80], false, false), NO_ACCEPTABLE);
        // Username/password without `[auth]` has nothing to check against.
        assert_eq!(select_method(&[USER_PASS], false, false), NO_ACCEPTABLE);
    }

    #[test]
    fn a_domain_name_is_one_to_253_host_name_characters() {
        assert_eq!(domain_name(b"origin.test").as_deref(), Some("origin.test"));
        assert_eq!(domain_name(b"a-b_c.test.").as_deref(), Some("a-b_c.test."));
        assert_eq!(domain_name(&[b'a'; 253]).map(|n| n.len()), Some(253));
        assert_eq!(domain_name(&[b'a'; 254]), None);
        assert_eq!(domain_name(b""), None);
        assert_eq!(domain_name(b"."), None);
        for bad in [
            &b"a b"[..],
            b"a:80",
            b"a/b",
            b"user@a",
            b"a\0b",
            b"a\r\nb",
            "é.test".as_bytes(),
        ] {
            assert_eq!(domain_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn connect_failures_map_to_the_rfc_1928_reply_codes() {
        let r = |k, d| connect_reply(&error(k, d));
        assert_eq!(r(ConnectErrorKind::Dns, "no address found"), Reply::HostUnreachable);
        assert_eq!(r(ConnectErrorKind::Refused, "connection refused"), Reply::Refused);
        assert_eq!(
            r(ConnectErrorKind::Refused, "connection refused (at 127.0.0.1:9)"),
            Reply::Refused
        );
        assert_eq!(
            r(ConnectErrorKind::Refused, "network unreachable"),
            Reply::NetworkUnreachable
        );
        assert_eq!(r(ConnectErrorKind::Refused, "host unreachable"), Reply::HostUnreachable);
        assert_eq!(
            r(ConnectErrorKind::Timeout, "no connection within 1s"),
            Reply::TtlExpired
        );
        assert_eq!(r(ConnectErrorKind::Loop, "is this proxy's own"), Reply::NotAllowed);
        assert_eq!(r(ConnectErrorKind::Parent, "403"), Reply::GeneralFailure);
    }

    #[test]
    fn the_access_log_records_the_status_a_connect_tunnel_would_have_had() {
        assert_eq!(reply_status(Reply::Succeeded, None), 200);
        assert_eq!(reply_status(Reply::NotAllowed, None), 403);
        assert_eq!(reply_status(Reply::CommandNotSupported, None), 501);
        assert_eq!(reply_status(Reply::AddressTypeNotSupported, None), 501);
        assert_eq!(reply_status(Reply::GeneralFailure, None), 400);
        let timeout = error(ConnectErrorKind::Timeout, "");
        assert_eq!(reply_status(Reply::TtlExpired, Some(&timeout)), 504);
        let refused = error(ConnectErrorKind::Refused, "connection refused");
        assert_eq!(reply_status(Reply::Refused, Some(&refused)), 502);
        let own = error(ConnectErrorKind::Loop, "");
        assert_eq!(reply_status(Reply::NotAllowed, Some(&own)), 508);
    }
}
