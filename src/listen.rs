//! Listening sockets: bound with the configured backlog and options, then an
//! accept loop per listener that hands each connection to its own task, and
//! back from the keep-alive poller to a new task when its client sends again.

use crate::config::ListenerConfig;
use crate::http1::{ClientStream, ConnSettings, Handler, Start, serve};
use crate::keepalive::poller::{Parked, Resume};
use arc_swap::ArcSwap;
use socket2::{Domain, Protocol, Socket, Type};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Binds a listener; the error names the address and what went wrong.
/// `reuse_port` (multi-process mode) sets SO_REUSEPORT, so that sockets of
/// every worker process share the address and the kernel spreads
/// connections (the supervisor binds them, [`reserve`]; a worker without a
/// channel binds a listener a reload adds itself).
pub fn bind(cfg: &ListenerConfig, reuse_port: bool) -> Result<std::net::TcpListener, String> {
    listen_on(cfg, bind_only(cfg, reuse_port)?)
}

/// Listens on `socket`, bound to `cfg`'s address (by [`bind`], or by the
/// supervisor: [`reserve`]), with `cfg`'s backlog and TCP_DEFER_ACCEPT.
pub fn listen_on(cfg: &ListenerConfig, socket: Socket) -> Result<std::net::TcpListener, String> {
    let addr = cfg.address;
    // Before listen(2), so that no connection is queued without it (the
    // accept loop sets it again only when a reload changes it).
    if let Err(e) = set_defer_accept(&socket, defer_accept_secs(cfg.defer_accept.get())) {
        tracing::warn!(
            "listener {addr}: cannot set TCP_DEFER_ACCEPT: {}",
            crate::util::io_cause(&e)
        );
    }
    set_buffers(cfg, &socket);
    let backlog = i32::try_from(cfg.listen_queue).unwrap_or(i32::MAX);
    socket
        .listen(backlog)
        .map_err(|e| format!("cannot listen on listener {addr}: {}", crate::util::io_cause(&e)))?;
    let effective = effective_backlog(cfg.listen_queue);
    if effective < cfg.listen_queue {
        tracing::warn!(
            "listener {addr}: listen_queue = {} is capped at {effective} by the kernel (net.core.somaxconn); raise it with `sysctl -w net.core.somaxconn={}` for the configured backlog",
            cfg.listen_queue,
            cfg.listen_queue
        );
    }
    Ok(socket.into())
}

/// Sets `cfg`'s `receive_buffer` and `send_buffer` on the listening
/// `socket` (before listen(2): the window scale a connection offers in its
/// handshake is chosen from its receive buffer), which its connections
/// inherit; a size the kernel caps (`net.core.rmem_max`, `wmem_max`) is
/// said, with the `sysctl` that lifts the cap. A size of 0 leaves the
/// kernel's autotuning, which a set size turns off for those connections.
fn set_buffers(cfg: &ListenerConfig, socket: &Socket) {
    let receive: BufferCalls = (Socket::set_recv_buffer_size, Socket::recv_buffer_size);
    let send: BufferCalls = (Socket::set_send_buffer_size, Socket::send_buffer_size);
    set_buffer(
        cfg,
        socket,
        "receive_buffer",
        cfg.receive_buffer.bytes(),
        "net.core.rmem_max",
        receive,
    );
    set_buffer(
        cfg,
        socket,
        "send_buffer",
        cfg.send_buffer.bytes(),
        "net.core.wmem_max",
        send,
    );
}

/// The setter and getter of one socket buffer.
type BufferCalls = (
    fn(&Socket, usize) -> std::io::Result<()>,
    fn(&Socket) -> std::io::Result<usize>,
);

/// One of [`set_buffers`]: `want` bytes (0: left alone) through `calls`,
/// for `key`, which `sysctl` caps.
fn set_buffer(cfg: &ListenerConfig, socket: &Socket, key: &str, want: u64, sysctl: &str, calls: BufferCalls) {
    if want == 0 {
        return;
    }
    let addr = cfg.address;
    let (set, get) = calls;
    let want = usize::try_from(want).unwrap_or(usize::MAX);
    if let Err(e) = set(socket, want) {
        tracing::warn!("listener {addr}: cannot set {key}: {}", crate::util::io_cause(&e));
        return;
    }
    // Linux reports twice what it keeps room for (the rest is its
    // bookkeeping), and caps the request at the sysctl first.
    if let Ok(got) = get(socket)
        && got / 2 < want
    {
        tracing::warn!(
            "listener {addr}: {key} = {want} bytes is capped at {} by the kernel ({sysctl}); raise it with `sysctl -w {sysctl}={want}`",
            got / 2
        );
    }
}

/// The socket of a listener, bound to its address but not listening: no
/// client can connect to it yet.
fn bind_only(cfg: &ListenerConfig, reuse_port: bool) -> Result<Socket, String> {
    let addr = cfg.address;
    let fail = |what: &str, e: std::io::Error| format!("cannot {what} listener {addr}: {}", crate::util::io_cause(&e));
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(|e| fail("create", e))?;
    socket.set_reuse_address(true).map_err(|e| fail("configure", e))?;
    if reuse_port {
        socket.set_reuse_port(true).map_err(|e| fail("configure", e))?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true).map_err(|e| fail("configure", e))?;
    }
    socket.set_nonblocking(true).map_err(|e| fail("configure", e))?;
    socket.bind(&addr.into()).map_err(|e| fail("bind", e))?;
    Ok(socket)
}

/// A socket for one worker of several processes on the listener `cfg`:
/// bound to its address with SO_REUSEPORT, by the supervisor, and not
/// listening, so that no connection queues on it before the worker it is
/// handed to listens on it ([`listen_on`]), nor ever on one the worker
/// does not use. Made by the supervisor, every listener socket has the
/// supervisor's owner (root, when it switches to `server.user`): the
/// kernel lets into an SO_REUSEPORT group only sockets of the group's
/// owner, so no other program running as that user can join it and take
/// connections, and a worker restarted later joins the sockets a reload
/// added (a socket it bound itself as the user could not).
pub fn reserve(cfg: &ListenerConfig) -> Result<Socket, String> {
    bind_only(cfg, true)
}

/// What a supervisor says at start when the kernel would reset, rather
/// than hand to another worker, the connections waiting in the accept
/// queue of a listening socket a worker closes (a worker replaced after a
/// reload it could not apply, or killed): `net.ipv4.tcp_migrate_req`
/// (Linux 5.14 and later, per network namespace, IPv4 and IPv6 alike)
/// moves them to another socket of the SO_REUSEPORT group. None when it
/// is set, or the kernel has no such setting.
pub fn migration_advice() -> Option<String> {
    let setting = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req").ok()?;
    (setting.trim() == "0").then(|| {
        "net.ipv4.tcp_migrate_req is 0: connections waiting to be accepted by a worker that closes its \
         listening sockets (replaced after a failed reload, or killed) are reset by the kernel rather than \
         handed to another worker; `sysctl -w net.ipv4.tcp_migrate_req=1` has them moved"
            .to_string()
    })
}

/// Checks that every listener of `listeners` can be bound as the sockets
/// of several worker processes are ([`reserve`]: SO_REUSEPORT), without
/// listening: the multi-process supervisor's check at start-up and of the
/// listeners a reload adds. A listening socket here would take connections
/// in the moment before it is closed, and closing it would reset them.
pub fn check_bindable<'a>(listeners: impl IntoIterator<Item = &'a ListenerConfig>) -> Result<(), String> {
    let bound = listeners.into_iter().map(reserve).collect::<Result<Vec<_>, _>>()?;
    drop(bound);
    Ok(())
}

/// The environment variable naming, to a worker, the listener sockets its
/// supervisor made for it ([`reserve`]): `FD@ADDRESS`, comma-separated.
pub const ENV_LISTENERS: &str = "PORTICO_LISTENERS";

/// In a worker: the listener sockets its supervisor made for it, by
/// address (made close-on-exec). Empty when it made none; see
/// [`inherited_from`].
pub fn inherited() -> Result<Vec<(std::net::SocketAddr, Socket)>, String> {
    // Taken once: the numbers may be reused once these are closed.
    static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Ok(list) = std::env::var(ENV_LISTENERS) else {
        return Ok(Vec::new());
    };
    if TAKEN.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return Ok(Vec::new());
    }
    inherited_from(&list)
}

/// The sockets `list` names (as [`ENV_LISTENERS`] does), taken: an entry
/// that does not name an open TCP socket bound to its address and not
/// listening, or names one twice, is an error, and then no descriptor is
/// taken (nor closed).
fn inherited_from(list: &str) -> Result<Vec<(std::net::SocketAddr, Socket)>, String> {
    let mut named: Vec<(std::os::fd::RawFd, std::net::SocketAddr)> = Vec::new();
    for entry in list.split(',').filter(|e| !e.is_empty()) {
        let bad = |why: &str| format!("{ENV_LISTENERS}: {entry:?}: {why}");
        let (fd, addr) = entry.split_once('@').ok_or_else(|| bad("not FD@ADDRESS"))?;
        let fd: std::os::fd::RawFd = fd.parse().map_err(|_| bad("not FD@ADDRESS"))?;
        let addr: std::net::SocketAddr = addr.parse().map_err(|_| bad("not FD@ADDRESS"))?;
        // SAFETY: fcntl with F_GETFD takes no pointer; it tells whether
        // the number is an open descriptor.
        if fd <= 2 || named.iter().any(|(f, _)| *f == fd) || unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            return Err(bad("not a descriptor of its own"));
        }
        // SAFETY: the descriptor is open (checked just above) and only
        // looked at through this borrow, which ends before anything here
        // could close it.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let socket = socket2::SockRef::from(&borrowed);
        let bound = socket.local_addr().ok().and_then(|a| a.as_socket());
        // Port 0: each worker's socket has a port of its own.
        let same = bound.is_some_and(|b| b == addr || (addr.port() == 0 && b.ip() == addr.ip()));
        let listening = rustix::net::sockopt::socket_acceptconn(borrowed).unwrap_or(true);
        if !same || !matches!(socket.r#type(), Ok(Type::STREAM)) || listening {
            return Err(bad("not a listener socket from the supervisor"));
        }
        named.push((fd, addr));
    }
    let mut out = Vec::with_capacity(named.len());
    for (fd, addr) in named {
        // SAFETY: fcntl with F_SETFD takes an integer flag, no pointer.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(format!("{ENV_LISTENERS}: {fd}: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: the supervisor made this descriptor inheritable for this
        // process alone and named it once (checked above); nothing else
        // here owns it.
        let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        out.push((addr, Socket::from(owned)));
    }
    Ok(out)
}

/// Where Linux keeps its cap on every listen(2) backlog.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// The backlog a listener asking for `configured` really gets: Linux
/// silently truncates a listen(2) backlog to `net.core.somaxconn` (4096
/// since Linux 5.4, 128 before), so a `listen_queue` above it only looks
/// larger. `configured` when the cap cannot be read.
pub fn effective_backlog(configured: u32) -> u32 {
    let cap = std::fs::read_to_string(SOMAXCONN)
        .ok()
        .and_then(|t| t.trim().parse().ok());
    capped_backlog(configured, cap)
}

/// `configured`, truncated to the kernel's `cap` when there is one.
fn capped_backlog(configured: u32, cap: Option<u32>) -> u32 {
    cap.map_or(configured, |c| configured.min(c))
}

/// Binds every listener of `config` (SO_REUSEPORT when it runs several
/// processes), or listens on the socket `handed` has for its address
/// (its supervisor's, [`inherited`]); the first failure is returned.
pub fn bind_all(
    config: &crate::config::Config,
    mut handed: Vec<(std::net::SocketAddr, Socket)>,
) -> Result<Vec<(ListenerConfig, std::net::TcpListener)>, String> {
    let reuse_port = config.server.processes > 1;
    config
        .listener
        .iter()
        .map(|l| {
            let socket = match handed.iter().position(|(a, _)| *a == l.address) {
                Some(i) => listen_on(l, handed.swap_remove(i).1),
                None => bind(l, reuse_port),
            };
            socket.map(|s| (l.clone(), s))
        })
        .collect()
}

/// TCP_NODELAY as the listening socket has it. Linux copies it to every
/// connection the socket accepts, so a connection costs no `setsockopt`
/// (one per connection before: a `Connection: close` request or a TLS
/// handshake paid it on every connection).
#[derive(Default)]
struct NoDelay(Applied<bool>);

impl NoDelay {
    /// Sets `want` on `listener` if it does not have it yet (at the start,
    /// or after a reload changed `listener.nodelay`), and then on
    /// `accepted` too: it was queued with the old setting. Connections
    /// queued behind it keep the old one; those that arrive later inherit
    /// the new.
    fn apply(&mut self, listener: &TcpListener, want: bool, accepted: Option<&TcpStream>) {
        if self.0.apply(want, "TCP_NODELAY", |v| {
            socket2::SockRef::from(listener).set_tcp_nodelay(v)
        }) && let Some(s) = accepted
        {
            let _ = s.set_nodelay(want);
        }
    }
}

/// An option of a listening socket as last set, so that the accept loop
/// sets it again only when a reload changed it.
#[derive(Default)]
struct Applied<T>(Option<T>);

impl<T: Copy + PartialEq> Applied<T> {
    /// Sets `want` with `set` unless it is set already (a failure is
    /// logged, and tried again next time); whether it was a change.
    fn apply(&mut self, want: T, name: &str, set: impl FnOnce(T) -> std::io::Result<()>) -> bool {
        if self.0 == Some(want) {
            return false;
        }
        match set(want) {
            Ok(()) => self.0 = Some(want),
            Err(e) => tracing::warn!("cannot set {name} on a listener: {}", crate::util::io_cause(&e)),
        }
        true
    }
}

/// `setsockopt(TCP_DEFER_ACCEPT)` (`listener.defer_accept`, whole seconds,
/// 0 = off; socket2 does not offer it). With it the kernel completes a
/// connection's handshake but queues it for `accept` only when its first
/// data arrives (or, for a client that stays silent, after about that many
/// seconds), so the first read of a new connection finds its request
/// instead of returning EAGAIN and waiting for the poller: under load, up
/// to two system calls fewer per new connection (a `recvfrom` and an
/// `epoll_wait`) and no wake-up in between. nginx's `listen ... deferred`
/// and HAProxy's `defer-accept` set the same option; every client of
/// Portico (HTTP, TLS, SOCKS 5) speaks first, so none waits for it.
fn set_defer_accept(listener: &impl std::os::fd::AsRawFd, secs: u32) -> std::io::Result<()> {
    let value = libc::c_int::try_from(secs).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is the listener's own and open for the
    // call's length (borrowed); `value` is a live c_int and the length
    // passed is its size, which is what TCP_DEFER_ACCEPT reads.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `listener.defer_accept` in the whole seconds TCP_DEFER_ACCEPT takes, a
/// fraction rounded up (so "500ms" still defers).
pub fn defer_accept_secs(d: Duration) -> u32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX)
}

/// What an accept loop gives each new connection; replaced as a whole when
/// a reload changes the listener's settings (connections keep the one they
/// were accepted with; the handler picks up a new config per request).
pub struct Serving<H> {
    /// TCP_NODELAY (`listener.nodelay`): set on the listening socket, so
    /// that every connection has it from its start ([`NoDelay`]).
    pub nodelay: bool,
    /// TCP_DEFER_ACCEPT in seconds (`listener.defer_accept`): set on the
    /// listening socket ([`set_defer_accept`]).
    pub defer_accept: u32,
    /// Timeouts and limits for the connection.
    pub settings: Arc<ConnSettings>,
    /// Serves its requests.
    pub handler: Arc<H>,
    /// TLS (`[[listener.certificate]]`): every connection starts with a
    /// handshake. Replaced by a reload with the certificates read again.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Accepts connections until `stop` is set (or its sender dropped), serving
/// each on its own task; the listening socket is closed on return, so new
/// connection attempts are refused from then on.
pub async fn accept_loop<H: Handler>(
    listener: TcpListener,
    serving: Arc<ArcSwap<Serving<H>>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut nodelay = NoDelay::default();
    nodelay.apply(&listener, serving.load().nodelay, None);
    // Set again here, not taken as the value `bind` set: a reload (SIGHUP)
    // handled between the bind and this task's first poll has changed
    // `serving` already, and would never reach the socket otherwise.
    let mut defer = Applied(None);
    defer.apply(serving.load().defer_accept, "TCP_DEFER_ACCEPT", |v| {
        set_defer_accept(&listener, v)
    });
    loop {
        let accepted = tokio::select! {
            biased;
            r = stop.wait_for(|s| *s) => {
                let _ = r;
                return;
            }
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors while cache files are held open:
                // close some of those and accept again at once (the
                // connection waits in the backlog meanwhile).
                if crate::sizing::relieve(&e) {
                    continue;
                }
                // Out of file descriptors or similar: back off instead of spinning.
                tracing::error!("accept failed: {}", crate::util::io_cause(&e));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Past `limits.max_connections_per_client`: closed before anything
        // is read (counted and logged there).
        let Ok(client) = crate::client_limit::admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        let serving = serving.load_full();
        nodelay.apply(&listener, serving.nodelay, Some(&stream));
        // A reload's new value applies from the next connection the kernel
        // queues (this one was queued under the old).
        defer.apply(serving.defer_accept, "TCP_DEFER_ACCEPT", |v| {
            set_defer_accept(&listener, v)
        });
        let open = crate::drain::track(client);
        tokio::spawn(first(serving, stream, peer, open));
    }
}

/// A new connection's task: the TLS handshake on a TLS listener, then
/// [`run`]. The handshake has `limits.header_timeout`, as the request head
/// that follows it: a client that sends half a ClientHello holds a task
/// and a descriptor no longer than one that sends half a request head.
async fn first<H: Handler>(
    serving: Arc<Serving<H>>,
    stream: TcpStream,
    peer: std::net::SocketAddr,
    open: crate::drain::ConnGuard,
) {
    let stream = match &serving.tls {
        None => ClientStream::Plain(stream),
        Some(config) => {
            // Boxed, as SOCKS and HTTP/2 in `run`: see there.
            match Box::pin(crate::http1::tls::accept(
                stream,
                config.clone(),
                serving.settings.header_timeout,
            ))
            .await
            {
                Ok(tls) => {
                    crate::tls::counters().handshake_done();
                    crate::tls_resume::count_handshake(tls.resumed());
                    ClientStream::Tls(Box::new(tls))
                }
                Err(why) => {
                    crate::tls::counters().handshake_failed(why);
                    tracing::debug!(client = %peer.ip(), "TLS handshake failed: {why:?}");
                    return;
                }
            }
        }
    };
    run(serving, stream, peer, Start::default(), open).await;
}

/// One task's share of a connection: serve it until it closes, or until it
/// has been idle long enough to be handed to the keep-alive poller, which
/// gives it a new task ([`Resume`]) when the client sends again.
async fn run<H: Handler>(
    serving: Arc<Serving<H>>,
    stream: ClientStream,
    peer: std::net::SocketAddr,
    start: Start,
    open: crate::drain::ConnGuard,
) {
    if serving.handler.takes_connections() {
        // Not HTTP (a SOCKS listener): the handler has the connection to
        // its end, and it never goes idle in the keep-alive set.
        //
        // Boxed, as HTTP/2 below and the TLS handshake in `first`: a task's
        // future is as large as its largest path, and tokio copies it
        // whole several times as it spawns, polls and completes the task.
        // SOCKS's future inlined made every connection's task 6,200 bytes
        // (the HTTP/1 path alone needs 1,136), and those copies 6,200 of a
        // `Connection: close` hit's 39,100 instructions.
        Box::pin(serving.handler.serve_connection(stream, peer)).await;
        drop(open);
        return;
    }
    if let Some(h2) = &serving.settings.h2 {
        // HTTP/2: chosen by ALPN on TLS, announced by its preface on an
        // h2c listener (only on a new connection: one back from the
        // keep-alive poller has spoken HTTP/1 already).
        let is_h2 = match &stream {
            ClientStream::Tls(t) => t.alpn_h2(),
            ClientStream::Plain(_) => {
                h2.h2c
                    && start.served == 0
                    && crate::http1::h2::sniff_preface(&stream, serving.settings.header_timeout).await
            }
        };
        if is_h2 {
            // Boxed: see SOCKS above.
            Box::pin(crate::http1::h2::serve(
                stream,
                peer,
                serving.settings.clone(),
                h2,
                serving.handler.clone(),
            ))
            .await;
            drop(open);
            return;
        }
    }
    let Some(idle) = serve(stream, peer, start, &serving.settings, &*serving.handler).await else {
        return;
    };
    if let Some(poller) = serving.settings.keepalive.poller() {
        let conn = Parked {
            stream: idle.stream,
            served: idle.served,
            waited: idle.waited,
            open,
        };
        poller.park(conn, idle.deadline, serving.clone());
    }
}

impl<H: Handler> Resume for Serving<H> {
    fn resume(self: Arc<Self>, conn: Parked, ready: bool, runtime: &tokio::runtime::Handle) {
        runtime.spawn(async move {
            // The poller keeps no address: the kernel's is the one accept
            // returned. A socket that has none any more is already dead.
            let Ok(peer) = conn.stream.peer_addr() else {
                return;
            };
            // Registers the socket with this runtime's reactor again.
            let Ok(stream) = TcpStream::from_std(conn.stream) else {
                return;
            };
            let start = Start {
                served: conn.served,
                ready,
                park_after: Some(conn.waited),
            };
            run(self, ClientStream::Plain(stream), peer, start, conn.open).await;
        });
    }
}

/// The addresses this process's listeners are bound to (their bound
/// addresses, not the configured text), kept current across reloads by
/// `reload::Running`. The upstream side refuses to connect to any of them
/// (`is_own_address`): a request Portico sent to itself would arrive from
/// Portico's own address, which may be an admin address, and so be served
/// monitoring pages or `/nsc` control the original client may not have.
/// A process-wide list because every origin client (the direct one, the
/// parents', the tunnels') must see the same listeners, whatever config
/// generation it was built from. In multi-process mode each worker binds
/// every listener (SO_REUSEPORT), so each holds the same list.
static OWN_ADDRESSES: std::sync::RwLock<Vec<std::net::SocketAddr>> = std::sync::RwLock::new(Vec::new());

/// Replaces the list of this process's listening addresses.
pub fn set_own_addresses(addrs: Vec<std::net::SocketAddr>) {
    match OWN_ADDRESSES.write() {
        Ok(mut own) => *own = addrs,
        // A panic while holding the lock cannot leave a half-written Vec
        // (the assignment is the only write): take it over.
        Err(poisoned) => *poisoned.into_inner() = addrs,
    }
}

/// True if a connection to `dest` would reach one of this process's own
/// listeners: the same port, and the listener's address, or any local
/// address when the listener is bound to the wildcard address of `dest`'s
/// family. IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) count as the
/// IPv4 address they carry, and the unspecified address as loopback (the
/// kernel connects `0.0.0.0` and `::` to the host itself).
pub fn is_own_address(dest: std::net::SocketAddr) -> bool {
    let own = match OWN_ADDRESSES.read() {
        Ok(own) => own,
        Err(poisoned) => poisoned.into_inner(),
    };
    matches_listener(&own, dest, is_local_ip)
}

/// [`is_own_address`] against the listening addresses `own`, with
/// `is_local` deciding whether an address belongs to this host.
fn matches_listener(
    own: &[std::net::SocketAddr],
    dest: std::net::SocketAddr,
    is_local: impl Fn(std::net::IpAddr) -> bool,
) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match dest.ip().to_canonical() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    own.iter().filter(|l| l.port() == dest.port()).any(|l| {
        let bound = l.ip().to_canonical();
        bound == ip || (bound.is_unspecified() && bound.is_ipv4() == ip.is_ipv4() && is_local(ip))
    })
}

/// True if `ip` is an address of this host: loopback, or one a socket can
/// be bound to (the kernel refuses to bind an address no interface has).
/// Only asked for a destination on the port of a wildcard listener, so the
/// system call is rare.
fn is_local_ip(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::{NoDelay, bind_only, capped_backlog, inherited_from, matches_listener, reserve};
    use std::os::fd::AsRawFd;

    /// A connection to `listener`, as accepted.
    async fn accept_one(listener: &tokio::net::TcpListener) -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let addr = listener.local_addr().expect("listener address");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        (accepted, client)
    }

    #[tokio::test]
    async fn connections_have_tcp_nodelay_from_the_listener_and_a_reload_changes_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut nodelay = NoDelay::default();
        nodelay.apply(&listener, true, None);
        // Accepted with no setsockopt of its own: the kernel copied it.
        let (a, _ca) = accept_one(&listener).await;
        assert!(a.nodelay().expect("getsockopt"));
        // A reload turns it off: the first connection accepted after it
        // was queued with the old setting and is corrected; later ones
        // inherit the new one.
        let (b, _cb) = accept_one(&listener).await;
        assert!(b.nodelay().expect("getsockopt"));
        nodelay.apply(&listener, false, Some(&b));
        assert!(!b.nodelay().expect("getsockopt"));
        let (c, _cc) = accept_one(&listener).await;
        nodelay.apply(&listener, false, Some(&c));
        assert!(!c.nodelay().expect("getsockopt"));
        // And on again.
        let (d, _cd) = accept_one(&listener).await;
        assert!(!d.nodelay().expect("getsockopt"));
        nodelay.apply(&listener, true, Some(&d));
        let (e, _ce) = accept_one(&listener).await;
        assert!(d.nodelay().expect("getsockopt") && e.nodelay().expect("getsockopt"));
    }

    /// A listener's config at `address`.
    fn at(address: &str) -> crate::config::ListenerConfig {
        crate::config::ListenerConfig {
            address: address.parse().expect("test address"),
            ..Default::default()
        }
    }

    /// Whether `fd` is an open descriptor.
    fn is_open(fd: i32) -> bool {
        // SAFETY: fcntl with F_GETFD takes no pointer.
        unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
    }

    #[test]
    fn a_worker_takes_the_sockets_its_supervisor_names_by_address_port_0_each_its_own() {
        let a = reserve(&at("127.0.0.1:0")).expect("reserve");
        let bound = a.local_addr().expect("address").as_socket().expect("inet");
        let b = reserve(&at("127.0.0.1:0")).expect("reserve");
        let b_at = b.local_addr().expect("address").as_socket().expect("inet");
        let list = format!("{}@{bound},{}@127.0.0.1:0", a.as_raw_fd(), b.as_raw_fd());
        // Owned by what is taken from now on (closed with it).
        std::mem::forget((a, b));
        let taken = inherited_from(&list).expect("taken");
        let named: Vec<_> = taken.iter().map(|(addr, _)| addr.to_string()).collect();
        assert_eq!(named, [bound.to_string(), "127.0.0.1:0".to_string()]);
        let at: Vec<_> = taken
            .iter()
            .map(|(_, s)| s.local_addr().expect("address").as_socket().expect("inet"))
            .collect();
        assert_eq!(at, [bound, b_at], "the sockets themselves");
    }

    #[test]
    fn a_worker_refuses_what_is_not_its_supervisors_socket_and_takes_nothing() {
        let good = reserve(&at("127.0.0.1:0")).expect("reserve");
        let good_at = good.local_addr().expect("address").as_socket().expect("inet");
        let listening = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        let g = good.as_raw_fd();
        let lists = [
            format!("{g}@127.0.0.1:1"),
            format!("{g}@{good_at},{g}@{good_at}"),
            format!("{}@{}", listening.as_raw_fd(), listening.local_addr().expect("address")),
            format!("{}@{}", udp.as_raw_fd(), udp.local_addr().expect("address")),
            format!("{g}@{good_at},999999@{good_at}"),
            format!("2@{good_at}"),
            format!("{g}:{good_at}"),
        ];
        for list in lists {
            assert!(inherited_from(&list).is_err(), "{list}");
            assert!(is_open(g), "{list}: the good one was taken and closed");
        }
    }

    #[test]
    fn a_socket_bound_for_the_start_up_check_refuses_connections() {
        // Held as the supervisor holds it during its check: a client that
        // connects then must be refused, not queued on a socket about to be
        // closed (which would reset the connection after it was accepted).
        let cfg = crate::config::ListenerConfig {
            address: "127.0.0.1:0".parse().expect("test address"),
            ..Default::default()
        };
        let socket = bind_only(&cfg, true).expect("bind");
        let bound = socket
            .local_addr()
            .expect("local address")
            .as_socket()
            .expect("inet address");
        let connect = std::net::TcpStream::connect_timeout(&bound, std::time::Duration::from_secs(2));
        assert!(connect.is_err(), "a connection to the checked address was accepted");
    }

    #[test]
    fn a_backlog_above_somaxconn_is_truncated_to_it() {
        assert_eq!(capped_backlog(8192, Some(4096)), 4096);
        assert_eq!(capped_backlog(1024, Some(4096)), 1024);
        assert_eq!(capped_backlog(8192, None), 8192);
    }
    use std::net::SocketAddr;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn own_listener_in_every_spelling() {
        let own = [addr("127.0.0.1:8080"), addr("[::1]:8081")];
        let never_local = |_| false;
        for dest in [
            "127.0.0.1:8080",
            "[::ffff:127.0.0.1]:8080",
            "0.0.0.0:8080",
            "[::1]:8081",
            "[::]:8081",
        ] {
            assert!(matches_listener(&own, addr(dest), never_local), "{dest}");
        }
        // Another port, or another loopback address, is another server.
        for dest in ["127.0.0.1:8081", "127.0.0.2:8080", "[::1]:8080", "192.0.2.1:8080"] {
            assert!(!matches_listener(&own, addr(dest), never_local), "{dest}");
        }
    }

    #[test]
    fn wildcard_listener_matches_local_addresses_of_its_family() {
        let own = [addr("0.0.0.0:8080"), addr("[::]:8081")];
        let local = |ip: std::net::IpAddr| ip.is_loopback() || ip.to_string() == "192.0.2.7";
        assert!(matches_listener(&own, addr("127.0.0.5:8080"), local));
        assert!(matches_listener(&own, addr("192.0.2.7:8080"), local));
        assert!(matches_listener(&own, addr("[::ffff:192.0.2.7]:8080"), local));
        assert!(matches_listener(&own, addr("[::1]:8081"), local));
        assert!(!matches_listener(&own, addr("192.0.2.8:8080"), local));
        // The IPv6 wildcard listener is IPv6-only (`listen::bind`).
        assert!(!matches_listener(&own, addr("127.0.0.1:8081"), local));
        assert!(!matches_listener(&own, addr("[::1]:8080"), local));
    }

    #[test]
    fn every_loopback_address_is_local() {
        assert!(super::is_local_ip("127.0.0.5".parse().expect("ip")));
        assert!(!super::is_local_ip("192.0.2.1".parse().expect("ip")));
    }
}
