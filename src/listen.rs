//! Listening sockets: bound with the configured backlog and options, then an
//! accept loop per listener that hands each connection to its own task.

use crate::config::ListenerConfig;
use crate::http1::{ConnSettings, Handler, serve};
use socket2::{Domain, Protocol, Socket, Type};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Binds a listener; the error names the address and what went wrong.
pub fn bind(cfg: &ListenerConfig) -> Result<std::net::TcpListener, String> {
    let addr = cfg.address;
    let fail = |what: &str, e: std::io::Error| format!("cannot {what} listener {addr}: {e}");
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(|e| fail("create", e))?;
    socket.set_reuse_address(true).map_err(|e| fail("configure", e))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true).map_err(|e| fail("configure", e))?;
    }
    socket.set_nonblocking(true).map_err(|e| fail("configure", e))?;
    socket.bind(&addr.into()).map_err(|e| fail("bind", e))?;
    let backlog = i32::try_from(cfg.listen_queue).unwrap_or(i32::MAX);
    socket.listen(backlog).map_err(|e| fail("listen on", e))?;
    Ok(socket.into())
}

/// Accepts connections forever, serving each on its own task.
pub async fn accept_loop<H: Handler>(
    listener: TcpListener,
    nodelay: bool,
    settings: Arc<ConnSettings>,
    handler: Arc<H>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors or similar: back off instead of spinning.
                tracing::error!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if nodelay {
            let _ = stream.set_nodelay(true);
        }
        let settings = settings.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            serve(stream, peer, &settings, &*handler).await;
        });
    }
}
