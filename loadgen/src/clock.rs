//! Timestamps of a run: absolute Unix microseconds read off the monotonic
//! clock, anchored to the wall clock once, so that intervals between any two
//! recorded times are exact even if the system clock is stepped mid-run.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic clock that reads as Unix microseconds.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    origin: Instant,
    origin_unix_us: i64,
}

impl Default for RunClock {
    fn default() -> Self {
        Self::new()
    }
}

impl RunClock {
    /// Anchors the clock to the wall clock now.
    pub fn new() -> Self {
        let origin = Instant::now();
        let origin_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        Self {
            origin,
            origin_unix_us,
        }
    }

    /// Unix µs of the instant `t`.
    pub fn unix_us(&self, t: Instant) -> i64 {
        match t.checked_duration_since(self.origin) {
            Some(d) => self.origin_unix_us + d.as_micros() as i64,
            None => self.origin_unix_us - self.origin.duration_since(t).as_micros() as i64,
        }
    }

    /// Unix µs now.
    pub fn now_us(&self) -> i64 {
        self.unix_us(Instant::now())
    }

    /// The instant of Unix µs `us`.
    pub fn instant(&self, us: i64) -> Instant {
        let d = us - self.origin_unix_us;
        if d >= 0 {
            self.origin + Duration::from_micros(d as u64)
        } else {
            self.origin
                .checked_sub(Duration::from_micros(d.unsigned_abs()))
                .unwrap_or(self.origin)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_and_unix_times_convert_both_ways() {
        let c = RunClock::new();
        let t = Instant::now() + Duration::from_millis(5);
        let us = c.unix_us(t);
        assert_eq!(c.unix_us(c.instant(us)), us);
        assert!(c.now_us() <= us);
    }
}
