//! The earliest next step over a cluster's instances, kept up to date as
//! instances change, so that finding the next event costs O(log n) rather
//! than a scan of every instance (a tournament tree: each inner node holds
//! the earlier of its children's `(time, instance)`, ties to the lower
//! instance index as the scan it replaces did).

/// A leaf or node: `(time µs, instance)`; `i64::MAX` time: no step.
type Key = (i64, u32);

const NONE: Key = (i64::MAX, u32::MAX);

/// The instances' next step times and their minimum.
#[derive(Debug, Clone)]
pub(super) struct StepClock {
    /// Leaves at `[width, 2·width)`, the root at 1.
    tree: Vec<Key>,
    width: usize,
    /// Instances whose next step time may have changed since the tree was
    /// last brought up to date, and a mark per instance so each is listed
    /// once.
    dirty: Vec<u32>,
    marked: Vec<bool>,
}

impl StepClock {
    /// A clock over `n` instances, every one of them to be read.
    pub(super) fn new(n: usize) -> Self {
        let width = n.max(1).next_power_of_two();
        Self {
            tree: vec![NONE; 2 * width],
            width,
            dirty: (0..n as u32).collect(),
            marked: vec![true; n],
        }
    }

    /// Marks instance `i` as changed: its next step time is read again
    /// before the next [`StepClock::earliest`].
    #[inline]
    pub(super) fn touch(&mut self, i: usize) {
        if !self.marked[i] {
            self.marked[i] = true;
            self.dirty.push(i as u32);
        }
    }

    /// Marks every instance as changed.
    pub(super) fn touch_all(&mut self) {
        for i in 0..self.marked.len() {
            self.touch(i);
        }
    }

    /// Whether no instance changed since the last update.
    pub(super) fn is_current(&self) -> bool {
        self.dirty.is_empty()
    }

    /// Re-reads the next step time of every changed instance with `read`.
    pub(super) fn update(&mut self, mut read: impl FnMut(usize) -> Option<i64>) {
        while let Some(i) = self.dirty.pop() {
            self.marked[i as usize] = false;
            let key = read(i as usize).map_or(NONE, |t| (t, i));
            let mut p = self.width + i as usize;
            self.tree[p] = key;
            while p > 1 {
                p /= 2;
                let m = self.tree[2 * p].min(self.tree[2 * p + 1]);
                if self.tree[p] == m {
                    break;
                }
                self.tree[p] = m;
            }
        }
    }

    /// The earliest next step, `(time µs, instance)`, lowest instance on
    /// ties; `None` when no instance has a step to take. Valid after
    /// [`StepClock::update`].
    pub(super) fn earliest(&self) -> Option<(i64, usize)> {
        debug_assert!(self.is_current(), "the step clock is out of date");
        let (t, i) = self.tree[1];
        (i != u32::MAX).then_some((t, i as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// After any sequence of changes, the clock gives what a scan of
        /// every instance gives (earliest time, lowest index on ties).
        #[test]
        fn the_clock_agrees_with_a_scan(
            n in 1usize..40,
            changes in proptest::collection::vec((0usize..40, proptest::option::of(0i64..20)), 0..200),
        ) {
            let mut times: Vec<Option<i64>> = vec![None; n];
            let mut clock = StepClock::new(n);
            clock.update(|i| times[i]);
            for (i, t) in changes {
                let i = i % n;
                times[i] = t;
                clock.touch(i);
                clock.update(|j| times[j]);
                let mut scan: Option<(i64, usize)> = None;
                for (j, t) in times.iter().enumerate() {
                    if let Some(t) = *t && scan.is_none_or(|(b, _)| t < b) {
                        scan = Some((t, j));
                    }
                }
                prop_assert_eq!(clock.earliest(), scan);
            }
        }
    }
}
