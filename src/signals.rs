//! The signals a server process acts on (SIGTERM, SIGINT, SIGHUP, SIGUSR1),
//! for the single-process server (`server.rs`) and the supervisor
//! (`supervisor.rs`) alike: registered once, then awaited one at a time.

/// A signal the server acts on.
pub(crate) enum Sig {
    /// SIGHUP: reload.
    Hup,
    /// SIGUSR1: reopen the error log and the access log (after rotation).
    Usr1,
    /// SIGTERM or SIGINT (named): shut down.
    Term(&'static str),
}

/// SIGTERM, SIGINT, SIGHUP and SIGUSR1, registered as soon as they are created.
pub(crate) struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    usr1: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Registers the handlers; must run inside the runtime.
    pub(crate) fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        let register = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("cannot catch {name}: {cause}", cause = crate::util::io_cause(&e));
                None
            }
        };
        Signals {
            term: register(SignalKind::terminate(), "SIGTERM"),
            int: register(SignalKind::interrupt(), "SIGINT"),
            hup: register(SignalKind::hangup(), "SIGHUP"),
            usr1: register(SignalKind::user_defined1(), "SIGUSR1"),
        }
    }

    /// Unblocks SIGHUP and SIGUSR1 in the calling thread, those whose
    /// handler is installed (one without would act as by default: a
    /// SIGHUP would end the process). A worker process starts with them
    /// blocked (`supervisor::start`), so that one sent while it started
    /// waits for its handler instead of killing it or being lost. The
    /// runtime's threads, started before, keep them blocked: the kernel
    /// delivers each to this thread, whose handler hands it to the runtime
    /// all the same.
    pub(crate) fn unblock(&self) {
        // SAFETY: the set lives on this stack for the calls, which only
        // read or fill it; pthread_sigmask changes this thread's mask only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            if self.hup.is_some() {
                libc::sigaddset(&mut set, libc::SIGHUP);
            }
            if self.usr1.is_some() {
                libc::sigaddset(&mut set, libc::SIGUSR1);
            }
            if libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) != 0 {
                tracing::error!(
                    "cannot unblock SIGHUP and SIGUSR1: reloads and log reopening will not reach this process"
                );
            }
        }
    }

    /// Waits for the next signal.
    pub(crate) async fn next(&mut self) -> Sig {
        async fn one(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    if s.recv().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = one(&mut self.term) => Sig::Term("SIGTERM"),
            () = one(&mut self.int) => Sig::Term("SIGINT"),
            () = one(&mut self.hup) => Sig::Hup,
            () = one(&mut self.usr1) => Sig::Usr1,
        }
    }
}
