//! A counted multiset of inter-token gaps (µs), the replay's ITL
//! distribution: every produced token after a request's first adds one
//! gap, so a replay of a million requests counts hundreds of millions.
//! Gaps below [`DENSE_LIMIT_US`] are counted in an array indexed by the
//! gap (one add per count, no hashing); the rare longer or negative ones
//! in a map.

use rustc_hash::FxHashMap;

/// Gaps in `[0, DENSE_LIMIT_US)` µs are counted in the array, which grows
/// to the largest such gap seen (at most 1 MiB of counters).
pub const DENSE_LIMIT_US: i64 = 1 << 17;

/// Counts of inter-token gaps, µs.
#[derive(Debug, Clone, Default)]
pub struct GapCounts {
    /// `dense[g]`: how many gaps of `g` µs.
    dense: Vec<u64>,
    /// The gaps outside `[0, DENSE_LIMIT_US)`.
    sparse: FxHashMap<i64, u64>,
}

impl GapCounts {
    /// Counts `n` gaps of `gap` µs.
    #[inline]
    pub fn add(&mut self, gap: i64, n: u64) {
        if (0..DENSE_LIMIT_US).contains(&gap) {
            let g = gap as usize;
            if g >= self.dense.len() {
                self.grow(g);
            }
            self.dense[g] += n;
        } else {
            *self.sparse.entry(gap).or_default() += n;
        }
    }

    #[cold]
    fn grow(&mut self, g: usize) {
        let len = (g + 1).next_power_of_two().max(1024);
        self.dense.resize(len.min(DENSE_LIMIT_US as usize), 0);
    }

    /// The gaps counted at least once, ascending, with their counts.
    pub fn sorted(&self) -> Vec<(i64, u64)> {
        let mut v: Vec<(i64, u64)> = self
            .dense
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(g, n)| (g as i64, *n))
            .chain(
                self.sparse
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(g, n)| (*g, *n)),
            )
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The counts are those of a plain map, whatever the gaps' range
        /// (negative, dense, beyond the array).
        #[test]
        fn counts_equal_a_plain_map(
            adds in prop::collection::vec((-5i64..DENSE_LIMIT_US + 5_000, 1u64..4), 0..300),
        ) {
            let mut c = GapCounts::default();
            let mut want = std::collections::BTreeMap::<i64, u64>::new();
            for &(g, n) in &adds {
                c.add(g, n);
                *want.entry(g).or_default() += n;
            }
            let want: Vec<(i64, u64)> = want.into_iter().collect();
            prop_assert_eq!(c.sorted(), want);
        }
    }
}
