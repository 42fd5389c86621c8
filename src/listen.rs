//! Listening sockets: bound with the configured backlog and options, then an
//! accept loop per listener that hands each connection to its own task, and
//! back from the keep-alive poller to a new task when its client sends again.

use crate::config::ListenerConfig;
use crate::http1::{ConnSettings, Handler, Start, serve};
use crate::keepalive::poller::{Parked, Resume};
use arc_swap::ArcSwap;
use socket2::{Domain, Protocol, Socket, Type};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// Binds a listener; the error names the address and what went wrong.
/// `reuse_port` (multi-process mode) sets SO_REUSEPORT, so every worker
/// process binds the same address and the kernel spreads connections.
pub fn bind(cfg: &ListenerConfig, reuse_port: bool) -> Result<std::net::TcpListener, String> {
    let addr = cfg.address;
    let fail = |what: &str, e: std::io::Error| format!("cannot {what} listener {addr}: {e}");
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
    let backlog = i32::try_from(cfg.listen_queue).unwrap_or(i32::MAX);
    socket.listen(backlog).map_err(|e| fail("listen on", e))?;
    Ok(socket.into())
}

/// What an accept loop gives each new connection; replaced as a whole when
/// a reload changes the listener's settings (connections keep the one they
/// were accepted with; the handler picks up a new config per request).
pub struct Serving<H> {
    /// Set TCP_NODELAY on accepted connections.
    pub nodelay: bool,
    /// Timeouts and limits for the connection.
    pub settings: Arc<ConnSettings>,
    /// Serves its requests.
    pub handler: Arc<H>,
}

/// Accepts connections until `stop` is set (or its sender dropped), serving
/// each on its own task; the listening socket is closed on return, so new
/// connection attempts are refused from then on.
pub async fn accept_loop<H: Handler>(
    listener: TcpListener,
    serving: Arc<ArcSwap<Serving<H>>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
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
                // Out of file descriptors or similar: back off instead of spinning.
                tracing::error!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let serving = serving.load_full();
        if serving.nodelay {
            let _ = stream.set_nodelay(true);
        }
        let open = crate::drain::track();
        tokio::spawn(run(serving, stream, peer, Start::default(), open));
    }
}

/// One task's share of a connection: serve it until it closes, or until it
/// has been idle long enough to be handed to the keep-alive poller, which
/// gives it a new task ([`Resume`]) when the client sends again.
async fn run<H: Handler>(
    serving: Arc<Serving<H>>,
    stream: TcpStream,
    peer: std::net::SocketAddr,
    start: Start,
    open: crate::drain::ConnGuard,
) {
    let Some(idle) = serve(stream, peer, start, &serving.settings, &*serving.handler).await else {
        return;
    };
    if let Some(poller) = serving.settings.keepalive.poller() {
        let conn = Parked {
            stream: idle.stream,
            peer,
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
            // Registers the socket with this runtime's reactor again.
            let Ok(stream) = TcpStream::from_std(conn.stream) else {
                return;
            };
            let start = Start {
                served: conn.served,
                ready,
                park_after: Some(conn.waited),
            };
            run(self, stream, conn.peer, start, conn.open).await;
        });
    }
}
