//! An index from content hash to the id of the entry holding it (a KV
//! block, a router's prefix-index node), for the simulator's hottest
//! random-access lookups.
//!
//! An open-addressing table with linear probing and backward-shift
//! deletion, for a fixed number of entries: it starts small and doubles
//! when more than half full, so that an instance that caches little (one
//! of thousands in a cluster) holds little, up to the smallest power of
//! two with room for every entry at a load of at most 3/4 (an instance
//! of 4,000 GPU and 40,000 CPU KV blocks, whose tiers share one index:
//! 65,536 slots, 512 KiB, where a load of 1/2 would take twice that).
//! Full, at a load of 0.67, linear probing reads 2.0 slots on average to
//! find an entry and 5.1 to miss (Knuth's estimates), one cache line or
//! two.
//! Each slot is 8 bytes: the id and the hash's high 32 bits (a tag, which
//! also gives the home slot), so a probe reads one cache line, and the
//! owner confirms a matching tag against the full hash it keeps with the
//! id. Entries are removed exactly (no tombstones), so the table never
//! holds more than its capacity. A general hash map of the same entries
//! reads two cache lines per probe and takes twice the memory.

const EMPTY: u64 = 0;

/// Slots of a new index (128 bytes), before it grows: an instance of a
/// large cluster that caches nothing holds next to nothing.
const INITIAL_SLOTS: usize = 16;

/// Content hash → id, for at most `capacity` entries.
#[derive(Debug, Clone)]
pub(crate) struct HashIndex {
    slots: Vec<u64>,
    /// The most slots it grows to: the smallest power of two of at least
    /// 4/3 of the capacity (a load of at most 3/4).
    max_slots: usize,
    mask: usize,
    /// 64 − log2(slots): the home is the top bits of a Fibonacci hash.
    shift: u32,
    len: usize,
}

fn pack(hash: u64, block: u32) -> u64 {
    (hash & 0xFFFF_FFFF_0000_0000) | (u64::from(block) + 1)
}

fn tag_matches(slot: u64, hash: u64) -> bool {
    (slot ^ hash) >> 32 == 0
}

fn block_of(slot: u64) -> u32 {
    (slot as u32).wrapping_sub(1)
}

impl HashIndex {
    /// An empty index for up to `capacity` entries.
    pub(crate) fn new(capacity: u32) -> Self {
        let max_slots = (capacity as usize + capacity as usize / 3 + 1)
            .next_power_of_two()
            .max(16);
        Self::with_slots(max_slots.min(INITIAL_SLOTS), max_slots)
    }

    fn with_slots(n: usize, max_slots: usize) -> Self {
        Self {
            slots: vec![EMPTY; n],
            max_slots,
            mask: n - 1,
            shift: 64 - n.trailing_zeros(),
            len: 0,
        }
    }

    /// Doubles the table, every entry moved to its home in the new one
    /// (a slot keeps the hash's high half, which is all a home needs).
    #[cold]
    fn grow(&mut self) {
        let mut bigger = Self::with_slots(2 * self.slots.len(), self.max_slots);
        for &s in &self.slots {
            if s != EMPTY {
                let mut i = bigger.home(s);
                while bigger.slots[i] != EMPTY {
                    i = (i + 1) & bigger.mask;
                }
                bigger.slots[i] = s;
            }
        }
        bigger.len = self.len;
        *self = bigger;
    }

    /// The home slot of `hash`: from its high half only (the half a slot
    /// keeps), so that deletion can recompute any entry's home.
    fn home(&self, hash: u64) -> usize {
        ((hash >> 32).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The id holding `hash`; `holds(id)` confirms that `id` holds it (a
    /// matching tag is only a likely match).
    pub(crate) fn get(&self, hash: u64, holds: impl Fn(u32) -> bool) -> Option<u32> {
        let mut i = self.home(hash);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if tag_matches(s, hash) && holds(block_of(s)) {
                return Some(block_of(s));
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Hints the CPU to fetch the slot where a probe for `hash` starts.
    pub(crate) fn prefetch(&self, hash: u64) {
        mem_prefetch::prefetch_write_data::<_, 3>(&self.slots[self.home(hash)]);
    }

    /// Adds `hash` → `block` (an id); the caller ensures `hash` is absent
    /// and the capacity is not exceeded.
    pub(crate) fn insert(&mut self, hash: u64, block: u32) {
        if 2 * (self.len + 1) > self.slots.len() && self.slots.len() < self.max_slots {
            self.grow();
        }
        debug_assert!(4 * self.len < 3 * self.slots.len(), "index over capacity");
        let mut i = self.home(hash);
        while self.slots[i] != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.slots[i] = pack(hash, block);
        self.len += 1;
    }

    /// Makes the entry `hash` → `from` say `hash` → `to` where it lies (an
    /// id's change moves nothing: the slot depends on the hash alone);
    /// returns whether it was there.
    pub(crate) fn retarget(&mut self, hash: u64, from: u32, to: u32) -> bool {
        let Some(i) = self.position(hash, from) else {
            return false;
        };
        self.slots[i] = pack(hash, to);
        true
    }

    /// Where the entry `hash` → `block` lies.
    #[inline]
    fn position(&self, hash: u64, block: u32) -> Option<usize> {
        let want = pack(hash, block);
        let mut i = self.home(hash);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if s == want {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes the entry `hash` → `block`; returns whether it was there.
    pub(crate) fn remove(&mut self, hash: u64, block: u32) -> bool {
        let Some(i) = self.position(hash, block) else {
            return false;
        };
        // Backward-shift deletion: move later entries of the probe run into
        // the hole when their home position allows it.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            // The entry at j may fill the hole unless its home lies
            // cyclically in (hole, j].
            let h = self.home(s);
            let stays = if hole <= j {
                hole < h && h <= j
            } else {
                hole < h || h <= j
            };
            if !stays {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        true
    }

    /// Every (hash tag, id) entry, for checks.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != EMPTY)
            .map(|&s| (s & 0xFFFF_FFFF_0000_0000, block_of(s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// An index that starts small and doubles (16 slots to 4,096 for
    /// 3,000 entries) finds every entry after each growth, and removes
    /// them exactly; hashes share high halves in groups of three, so tags
    /// collide and probe runs cross the moves.
    #[test]
    fn entries_survive_each_growth() {
        const N: u32 = 3_000;
        let hash = |k: u32| {
            (u64::from(k / 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) & 0xFFFF_FFFF_0000_0000)
                | u64::from(k)
        };
        let mut ix = HashIndex::new(N);
        assert_eq!(ix.slots.len(), INITIAL_SLOTS);
        let held: Vec<u64> = (0..N).map(hash).collect();
        for k in 0..N {
            ix.insert(held[k as usize], k);
            if k % 250 == 0 {
                for j in 0..=k {
                    assert_eq!(ix.get(held[j as usize], |b| b == j), Some(j));
                }
            }
        }
        // (Full size: 3,000 entries at a load of 0.73.)
        assert_eq!(ix.slots.len(), 4_096);
        assert_eq!(ix.len(), N as usize);
        for k in (0..N).step_by(2) {
            assert!(ix.remove(held[k as usize], k));
        }
        for k in 0..N {
            let want = (k % 2 == 1).then_some(k);
            assert_eq!(ix.get(held[k as usize], |b| b == k), want, "{k}");
        }
    }

    proptest! {
        /// Against a map: every get, insert, retarget and remove agrees, with hashes
        /// drawn from a few high halves so that tags collide, probe runs
        /// grow long and wrap around the table's end.
        #[test]
        fn agrees_with_a_map(ops in prop::collection::vec((0u8..4, 0u64..6, 0u64..40), 1..400)) {
            // (Up to a load of 47/64 when every block holds content.)
            const BLOCKS: u32 = 47;
            let mut ix = HashIndex::new(BLOCKS);
            // What each block holds, as the kv cache keeps it.
            let mut held: Vec<Option<u64>> = vec![None; BLOCKS as usize];
            let mut model: BTreeMap<u64, u32> = BTreeMap::new();
            for (op, hi, lo) in ops {
                let hash = (hi.wrapping_mul(0xF000_0000_0000_0000 / 6) & 0xFFFF_FFFF_0000_0000) | lo;
                let found = ix.get(hash, |b| held[b as usize] == Some(hash));
                prop_assert_eq!(found, model.get(&hash).copied());
                match op {
                    0 if found.is_none() => {
                        if let Some(b) = (0..BLOCKS).find(|&b| held[b as usize].is_none()) {
                            ix.insert(hash, b);
                            held[b as usize] = Some(hash);
                            model.insert(hash, b);
                        }
                    }
                    1 => {
                        if let Some(b) = found {
                            prop_assert!(ix.remove(hash, b));
                            held[b as usize] = None;
                            model.remove(&hash);
                        }
                    }
                    // The content moves to another block (a CPU slot's
                    // content reloaded, a GPU block's offloaded).
                    2 => {
                        let to = (0..BLOCKS).find(|&b| held[b as usize].is_none());
                        if let (Some(b), Some(to)) = (found, to) {
                            prop_assert!(!ix.retarget(hash, to, b), "no entry names it");
                            prop_assert!(ix.retarget(hash, b, to));
                            held[b as usize] = None;
                            held[to as usize] = Some(hash);
                            model.insert(hash, to);
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(ix.len(), model.len());
                for (&h, &b) in &model {
                    prop_assert_eq!(ix.get(h, |x| held[x as usize] == Some(h)), Some(b));
                }
            }
        }
    }
}
