//! The request ids a replay has admitted, to tell whether an id repeats
//! (see `Instance::set_private_blocks`), in memory that grows with the
//! runs of consecutive ids rather than with the ids: a generated workload
//! or an imported trace numbers its requests 0, 1, 2, … and takes one
//! entry whatever its length (a hash set took 18 MB at a million
//! requests).

use std::collections::BTreeMap;

/// A set of `u64` as disjoint, non-adjacent inclusive ranges.
#[derive(Debug, Clone, Default)]
pub(super) struct IdSet {
    /// First id of each range to its last.
    ranges: BTreeMap<u64, u64>,
}

impl IdSet {
    /// Adds `id`; false when it was already in.
    pub(super) fn insert(&mut self, id: u64) -> bool {
        let below = self.ranges.range(..=id).next_back().map(|(&a, &b)| (a, b));
        if let Some((_, last)) = below
            && id <= last
        {
            return false;
        }
        let next = id
            .checked_add(1)
            .and_then(|n| self.ranges.remove_entry(&n))
            .map(|(_, last)| last);
        match below {
            Some((first, last)) if last.checked_add(1) == Some(id) => {
                self.ranges.insert(first, next.unwrap_or(id));
            }
            _ => {
                self.ranges.insert(id, next.unwrap_or(id));
            }
        }
        true
    }

    /// Ranges held (for tests).
    #[cfg(test)]
    fn ranges(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn consecutive_ids_take_one_range_in_any_order_of_arrival() {
        let mut s = IdSet::default();
        for id in 0..100_000u64 {
            assert!(s.insert(id));
        }
        assert_eq!(s.ranges(), 1);
        assert!(!s.insert(0) && !s.insert(99_999) && !s.insert(50_000));
        let mut s = IdSet::default();
        for id in [5, 3, 4, 1, 2, 0, u64::MAX, u64::MAX - 1] {
            assert!(s.insert(id));
        }
        assert_eq!(s.ranges(), 2);
        assert!(!s.insert(u64::MAX) && !s.insert(3));
    }

    proptest! {
        /// The same answers as a hash set, on ids drawn from a small range
        /// (many repeats and merges) or anywhere.
        #[test]
        fn answers_as_a_hash_set(ids in prop::collection::vec(
            prop_oneof![0u64..64, any::<u64>(), (u64::MAX - 8)..=u64::MAX], 0..300)) {
            let mut s = IdSet::default();
            let mut h = std::collections::HashSet::new();
            for id in ids {
                prop_assert_eq!(s.insert(id), h.insert(id), "id {}", id);
            }
            let mut sorted: Vec<u64> = h.into_iter().collect();
            sorted.sort_unstable();
            let runs = sorted.windows(2).filter(|w| w[1] != w[0] + 1).count()
                + usize::from(!sorted.is_empty());
            prop_assert_eq!(s.ranges(), runs);
        }
    }
}
