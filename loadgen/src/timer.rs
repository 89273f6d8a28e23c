//! A sleep precise to microseconds inside the async runtime.
//!
//! tokio's timer has millisecond granularity (a `sleep_until` ends up to
//! 1 ms late), too coarse for a send schedule judged by a 2 ms p99 lag. On
//! Linux a `timerfd` armed for the exact instant is registered with the
//! runtime's reactor, so the runtime's own `epoll_wait` wakes at that
//! instant (within the kernel's timer slack, ~50 µs): no extra thread and no
//! cross-thread wake-up per send. Elsewhere it falls back to tokio's timer.

use std::time::Instant;

/// A reusable one-shot timer.
#[derive(Debug)]
pub struct PreciseTimer {
    #[cfg(target_os = "linux")]
    fd: Option<tokio::io::unix::AsyncFd<linux::Fd>>,
}

impl PreciseTimer {
    /// A timer on the current runtime (falls back to tokio's timer if a
    /// timerfd cannot be created).
    pub fn new() -> Self {
        #[cfg(target_os = "linux")]
        {
            #[allow(
                deprecated,
                reason = "AsyncFd::new is unsound only for types that do not own their \
                          descriptor; linux::Fd owns its timerfd for its whole life, and \
                          the sound replacement, AsyncFd::register, is `unsafe`"
            )]
            let fd = linux::Fd::new()
                .ok()
                .and_then(|f| tokio::io::unix::AsyncFd::new(f).ok());
            Self { fd }
        }
        #[cfg(not(target_os = "linux"))]
        Self {}
    }

    /// Whether waits are precise (a timerfd), not millisecond-grained.
    pub fn is_precise(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            self.fd.is_some()
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Sleeps until `at` (returns at once if it has passed).
    pub async fn sleep_until(&self, at: Instant) {
        let now = Instant::now();
        if at <= now {
            return;
        }
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.fd
            && fd.get_ref().arm(at - now).is_ok()
        {
            loop {
                let Ok(mut guard) = fd.readable().await else {
                    break;
                };
                match guard.try_io(|f| f.get_ref().expired()) {
                    Ok(Ok(())) => return,
                    Ok(Err(_)) => break,
                    Err(_would_block) => continue,
                }
            }
        }
        tokio::time::sleep_until(at.into()).await;
    }
}

impl Default for PreciseTimer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::os::fd::{AsFd, AsRawFd, RawFd};
    use std::time::Duration;

    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

    /// A non-blocking monotonic timerfd.
    #[derive(Debug)]
    pub struct Fd(TimerFd);

    impl Fd {
        pub fn new() -> nix::Result<Self> {
            TimerFd::new(
                ClockId::CLOCK_MONOTONIC,
                TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
            )
            .map(Fd)
        }

        /// Arms the timer to expire once after `d` (> 0).
        pub fn arm(&self, d: Duration) -> nix::Result<()> {
            let d = d.max(Duration::from_nanos(1));
            self.0.set(
                Expiration::OneShot(TimeSpec::from_duration(d)),
                TimerSetTimeFlags::empty(),
            )
        }

        /// Consumes an expiry; `WouldBlock` if it has not expired yet.
        pub fn expired(&self) -> std::io::Result<()> {
            self.0.wait().map_err(std::io::Error::from)
        }
    }

    impl AsRawFd for Fd {
        fn as_raw_fd(&self) -> RawFd {
            self.0.as_fd().as_raw_fd()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn sleeps_end_at_the_instant_not_before() {
        let t = PreciseTimer::new();
        if cfg!(target_os = "linux") {
            assert!(t.is_precise());
        }
        for us in [300u64, 1500, 50] {
            let at = Instant::now() + Duration::from_micros(us);
            t.sleep_until(at).await;
            assert!(Instant::now() >= at);
        }
        // A passed instant returns at once.
        t.sleep_until(Instant::now() - Duration::from_millis(1))
            .await;
    }
}
