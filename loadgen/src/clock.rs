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

/// This machine's clock minus true time, µs, as its NTP daemon measures
/// it (`chronyc -c tracking`: its fifth field is the system time's offset
/// in seconds, positive when the clock is slow), with where the figure
/// came from or why there is none.
pub fn ntp_offset_us() -> (Option<i64>, String) {
    let out = match std::process::Command::new("chronyc")
        .args(["-c", "tracking"])
        .stderr(std::process::Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => o,
        Ok(_) => return (None, "unknown: chronyc tracking failed".into()),
        Err(_) => return (None, "unknown: no chronyc on this machine".into()),
    };
    match parse_chronyc_tracking(&String::from_utf8_lossy(&out.stdout)) {
        Some(us) => (Some(us), "chronyc tracking".into()),
        None => (None, "unknown: chronyc tracking said nothing usable".into()),
    }
}

/// The clock's offset (µs, clock minus true time) from `chronyc -c
/// tracking`'s CSV line.
fn parse_chronyc_tracking(csv: &str) -> Option<i64> {
    let slow_s: f64 = csv.lines().next()?.split(',').nth(4)?.trim().parse().ok()?;
    slow_s
        .is_finite()
        .then(|| (-slow_s * 1e6).round() as i64)
        .filter(|us| us.abs() < 86_400_000_000)
}

#[cfg(test)]
mod ntp_tests {
    #[test]
    fn chronyc_tracking_gives_the_clock_offset() {
        let line = "A9FEA9FE,169.254.169.254,3,1732520000.123,-0.000012345,0.000001,0.00002,-3.5,0.01,0.1,0.0001,0.001,64.0,Normal\n";
        assert_eq!(super::parse_chronyc_tracking(line), Some(12));
        assert_eq!(super::parse_chronyc_tracking("garbage"), None);
        assert_eq!(super::parse_chronyc_tracking(""), None);
    }
}
