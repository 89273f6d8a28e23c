//! SIGINT/SIGTERM: the first stops new sends, the second aborts the requests
//! in flight.

/// Waits for SIGINT or SIGTERM.
pub(super) struct Signals {
    #[cfg(unix)]
    pub(super) term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    pub(super) int: tokio::signal::unix::Signal,
}

impl Signals {
    pub(super) fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    pub(super) async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
