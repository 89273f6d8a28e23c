//! The increments a per-token output delay adds to inter-token gaps.
//!
//! Under a delay that grows with a token's index (BLIS's α₂, see
//! `blis_traces::itl_steps::ItlTiming`), token `i` (1-based) is visible
//! `extra(i)` after its step's end, so its gap to token `i − 1` is the
//! step's gap plus `extra(i) − extra(i − 1)`: with each delay rounded to
//! whole µs, `⌊α₂⌋` or `⌊α₂⌋ + 1` depending on `i`. The same for every
//! request, so a table of them, indexed by token, lets a collector count a
//! step's gaps for all its steady decoders from how many of them sit at
//! indices of each increment, rather than computing each token's delays.

use blis_traces::itl_steps::ItlTiming;

/// The increments `extra(i) − extra(i − 1)` of one timing (not for a
/// request's last token, whose delay also holds the completion's), for
/// the tokens seen so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct DelaySteps {
    timing: Option<ItlTiming>,
    /// `increment[i]` for token `i` (`increment[0]` unused, 0).
    increment: Vec<i64>,
    /// The smallest increment of the table.
    lo: i64,
    /// `up[i]`: 1 where token `i`'s increment is `lo + 1`, 0 where `lo`.
    up: Vec<u8>,
    /// Whether the table's increments take values other than `lo` and
    /// `lo + 1` (a rounding corner): then it is not used.
    spread: bool,
}

impl DelaySteps {
    /// Makes the table hold tokens `1..=last` of `timing`; `false` when
    /// its increments take more than two adjacent values (the caller
    /// counts such gaps token by token).
    pub(crate) fn prepare(&mut self, timing: &ItlTiming, last: u32) -> bool {
        if self.timing.as_ref() != Some(timing) {
            *self = Self {
                timing: Some(*timing),
                increment: vec![0],
                lo: i64::MAX,
                up: vec![0],
                spread: false,
            };
        }
        let have = self.increment.len() as u32;
        if last >= have {
            let mut lo = self.lo;
            for i in have..=last {
                let d = timing.extra_us(i, false) - timing.extra_us(i - 1, false);
                self.increment.push(d);
                lo = lo.min(d);
            }
            if lo != self.lo {
                self.lo = lo;
                self.up.clear();
                self.up.push(0);
            }
            for i in self.up.len()..self.increment.len() {
                let d = self.increment[i] - lo;
                self.spread |= d > 1;
                self.up.push(d.clamp(0, 1) as u8);
            }
        }
        !self.spread
    }

    /// The smaller increment, µs.
    pub(crate) fn lo(&self) -> i64 {
        self.lo
    }

    /// Per token index: 1 where the increment is [`DelaySteps::lo`] + 1.
    pub(crate) fn up(&self) -> &[u8] {
        &self.up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increments_are_the_difference_of_rounded_delays() {
        for per_token_us in [0.0, 0.4, 1.0, 45.907545, 777.5, 3.25] {
            let t = ItlTiming {
                hop_us: 12.5,
                per_token_us,
                completion_us: 9.0,
            };
            let mut d = DelaySteps::default();
            assert!(d.prepare(&t, 300));
            // Growing it keeps every entry.
            assert!(d.prepare(&t, 2000));
            for i in 1..=2000u32 {
                let want = t.extra_us(i, false) - t.extra_us(i - 1, false);
                assert_eq!(
                    d.lo() + i64::from(d.up()[i as usize]),
                    want,
                    "α₂ {per_token_us}, token {i}"
                );
            }
        }
    }
}
