//! The CPU tier of a tiered KV cache (`../shared/design/core-engine.md`,
//! "Tiered Cache"; `macro-plan.md` D.3, after vLLM's CPU offloading and
//! FlexGen): a store of offloaded block contents, by content hash, with
//! least-recently-offloaded eviction when full.
//!
//! Content is offloaded from free GPU blocks (cached, unreferenced) while
//! the GPU tier's usage (referenced blocks / all blocks) is above the
//! offload threshold, in one of two ways ([`OffloadPolicy`]):
//!
//! - `on-evict` (the default): a free block's content is offloaded when the
//!   GPU reuses the block for new content, the moment the content would be
//!   lost. The GPU's prefix cache behaves exactly as without the tier;
//!   what it evicts under pressure survives on the CPU (a victim cache, as
//!   vLLM's CPU offloading keeps the GPU's blocks on the host).
//! - `eager`: BLIS's model (`sim/kv/tiered.go`, `maybeOffload`): every free
//!   GPU block still holding content is offloaded at once, least recently
//!   freed first, and stays free but empty; a later hit on that content
//!   costs a reload even if the GPU would have kept it.
//!
//! Either way the content moves: its hash leaves the GPU's prefix cache
//! and enters this store, so a content is in at most one tier. A
//! prefix-cache lookup that misses on the GPU continues here; the blocks
//! found are reloaded into fresh GPU blocks instead of being recomputed,
//! and the transfer, `base_latency + blocks × block_bytes / bandwidth`, is
//! added to the step that admits the request. Unlike BLIS, a full store
//! drops its least recently offloaded content instead of refusing new
//! content (as vLLM's CPU offloading manager does, LRU), and counts it.
//!
//! Both tiers share one hash index (the GPU's, `KvCache`'s): a CPU
//! content's entry names its slot with its top bit (`CPU_ID`) set. As a content is in
//! at most one tier, the index holds one entry per content, and a content
//! moving between the tiers (an offload, a reload, a GPU block computing
//! it again) has its entry retargeted where it lies, one probe instead
//! of a removal from one index and an insertion into the other.

use std::collections::VecDeque;

use crate::engine::hash_index::HashIndex;
use serde::{Deserialize, Serialize};

/// When free GPU blocks' content is offloaded (`--kv-offload-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OffloadPolicy {
    /// When the GPU reuses the block (evicts its content), above the
    /// threshold.
    #[default]
    OnEvict,
    /// All at once whenever the usage is above the threshold (BLIS).
    Eager,
}

impl std::str::FromStr for OffloadPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on-evict" => Ok(Self::OnEvict),
            "eager" => Ok(Self::Eager),
            _ => Err(format!("unknown offload policy {s:?} (on-evict or eager)")),
        }
    }
}

/// Settings of the CPU tier (`--kv-cpu-blocks` and friends).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTierConfig {
    /// `--kv-offload-policy`: when content is offloaded.
    pub policy: OffloadPolicy,
    /// `--kv-cpu-blocks`: blocks the CPU tier holds (positive).
    pub cpu_blocks: u32,
    /// `--kv-offload-threshold`: GPU KV usage (0..1) above which free
    /// cached GPU blocks are offloaded (default 0.9).
    pub offload_threshold: f64,
    /// `--kv-transfer-bandwidth`: host↔device bandwidth of the instance,
    /// GB/s (10^9 bytes per second; all its GPUs together).
    pub transfer_bandwidth_gb_s: f64,
    /// `--kv-transfer-base-latency-us`: fixed cost of one reload, µs.
    pub transfer_base_latency_us: f64,
    /// Bytes of one KV block: layers × KV heads × head dim × 2 (K and V) ×
    /// dtype bytes × block size, from the model's config.
    pub block_bytes: f64,
    /// `--kv-thrashing-window-us`: a block reloaded within this long of its
    /// offload counts as thrashing (BLIS's 1000 µs).
    pub thrashing_window_us: i64,
}

impl CpuTierConfig {
    /// The transfer time of `blocks` blocks, µs (rounded):
    /// `base_latency + blocks × block_bytes / bandwidth`; 0 for no block.
    pub fn transfer_us(&self, blocks: u32) -> i64 {
        if blocks == 0 {
            return 0;
        }
        let bytes_per_us = self.transfer_bandwidth_gb_s * 1e3;
        let t = self.transfer_base_latency_us + f64::from(blocks) * self.block_bytes / bytes_per_us;
        t.round() as i64
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// A setting out of range, named by its flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.cpu_blocks == 0 {
            return Err("--kv-cpu-blocks must be positive".into());
        }
        if !(self.offload_threshold.is_finite() && (0.0..=1.0).contains(&self.offload_threshold)) {
            return Err(format!(
                "--kv-offload-threshold must be within 0..1, not {}",
                self.offload_threshold
            ));
        }
        if !(self.transfer_bandwidth_gb_s.is_finite() && self.transfer_bandwidth_gb_s > 0.0) {
            return Err(format!(
                "--kv-transfer-bandwidth must be a positive number of GB/s, not {}",
                self.transfer_bandwidth_gb_s
            ));
        }
        let max_us = blis_traces::csvio::MAX_TIME_US;
        if !(self.transfer_base_latency_us >= 0.0 && self.transfer_base_latency_us <= max_us as f64)
        {
            return Err(format!(
                "--kv-transfer-base-latency-us must be a non-negative number up to 2^53 µs, not {}",
                self.transfer_base_latency_us
            ));
        }
        if !(self.block_bytes.is_finite() && self.block_bytes > 0.0) {
            return Err(format!(
                "the KV block size in bytes must be positive, not {} (give --kv-block-bytes)",
                self.block_bytes
            ));
        }
        if !(0..=max_us).contains(&self.thrashing_window_us) {
            return Err(format!(
                "--kv-thrashing-window-us must be from 0 to 2^53 µs, not {}",
                self.thrashing_window_us
            ));
        }
        Ok(())
    }
}

/// The CPU tier's settings as given (`--kv-cpu-blocks` and friends, or a
/// policy bundle's `kv:` section); the block's size in bytes comes from the
/// model's config unless given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CpuTierSettings {
    /// CPU blocks.
    pub cpu_blocks: u32,
    /// When content is offloaded.
    pub offload_policy: OffloadPolicy,
    /// GPU usage above which free cached blocks are offloaded (0..1).
    pub offload_threshold: f64,
    /// Host↔device bandwidth, GB/s.
    pub transfer_bandwidth_gb_s: f64,
    /// Fixed cost of a reload, µs.
    pub transfer_base_latency_us: f64,
    /// Bytes of one KV block (None: from the model's config).
    pub block_bytes: Option<f64>,
    /// Thrashing window, µs.
    pub thrashing_window_us: i64,
}

impl Default for CpuTierSettings {
    /// The defaults of the flags: threshold 0.9 (BLIS), 32 GB/s (a PCIe 5.0
    /// x16 link's practical host↔device rate), 10 µs per transfer, a
    /// 1000 µs thrashing window (BLIS).
    fn default() -> Self {
        Self {
            cpu_blocks: 0,
            offload_policy: OffloadPolicy::OnEvict,
            offload_threshold: 0.9,
            transfer_bandwidth_gb_s: 32.0,
            transfer_base_latency_us: 10.0,
            block_bytes: None,
            thrashing_window_us: 1000,
        }
    }
}

/// What the CPU tier did (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCounters {
    /// Blocks offloaded from GPU to CPU.
    pub offloads: u64,
    /// Blocks reloaded from CPU to GPU.
    pub reloads: u64,
    /// Reloads of a block within the thrashing window of its offload
    /// (BLIS's `KVThrashingRate` numerator).
    pub thrashing: u64,
    /// Contents dropped from a full CPU tier to make room.
    pub cpu_evictions: u64,
    /// Reload operations (one per admitted request that reloaded blocks).
    pub transfers: u64,
    /// Transfer time charged to steps, µs.
    pub transfer_us: u64,
}

impl std::ops::AddAssign for TierCounters {
    fn add_assign(&mut self, o: Self) {
        self.offloads += o.offloads;
        self.reloads += o.reloads;
        self.thrashing += o.thrashing;
        self.cpu_evictions += o.cpu_evictions;
        self.transfers += o.transfers;
        self.transfer_us += o.transfer_us;
    }
}

/// One CPU block: the content it holds and when it came.
#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    /// When it was offloaded, µs.
    at: i64,
    /// Bumped when the slot is emptied: older entries of the offload
    /// order that name it are stale.
    generation: u32,
}

/// The bit that marks a CPU slot's id in the hash index both tiers share.
/// GPU block ids are below it: a cache materialises each block it hands
/// out (24 bytes), so 2^31 of them would take some 50 GB first.
pub(crate) const CPU_ID: u32 = 1 << 31;

/// The slot of an offload-order entry standing for contents no one can
/// look up ([`CpuTier::offload_forgotten`]); its generation is how many.
const FORGOTTEN: u32 = u32::MAX;

/// How far ahead in the offload order the slot of a content to drop is
/// prefetched (its index entry: half as far): with every eviction
/// offloaded, a full tier drops a content per offload, and both are cache
/// misses otherwise.
const PREFETCH_AHEAD: usize = 16;

/// The CPU tier: offloaded contents by hash, in an array of up to
/// `cpu_blocks` slots found through the hash index the GPU uses (shared:
/// each method that reads or changes it takes it; one cache line per
/// probe). Slots and index grow as contents come, so
/// that a tier's memory follows what it holds, not its size (a tier of
/// billions of blocks that holds a few costs a few). The offload order is
/// a ring of (slot, generation) entries, 8 bytes each, oldest first, as the
/// GPU's free queue: a content taken out for a reload leaves a stale entry
/// behind, and the contents to drop next are read in sequence (their slots
/// prefetched, then the index entries their hashes lead to).
///
/// Invariant: `used() + free() == total()`; every used slot has exactly
/// one live entry in the order and one in the index, and the forgotten contents
/// (`CpuTier::offload_forgotten`) are counted by entries of their own.
#[derive(Debug, Clone)]
pub struct CpuTier {
    cfg: CpuTierConfig,
    slots: Vec<Slot>,
    /// Slots used before and free again.
    spare: Vec<u32>,
    /// (slot, generation) oldest first; ([`FORGOTTEN`], how many) for
    /// forgotten contents.
    order: VecDeque<(u32, u32)>,
    /// Contents that must not be dropped now ([`CpuTier::pin`]).
    pinned: Vec<u64>,
    /// Contents held that no one can look up
    /// ([`CpuTier::offload_forgotten`]).
    forgotten: u32,
    counters: TierCounters,
}

impl CpuTier {
    /// An empty tier; the hash index it shares must have room for
    /// `cfg.cpu_blocks` entries more than the GPU's.
    pub fn new(cfg: CpuTierConfig) -> Self {
        let n = cfg.cpu_blocks;
        // Room for the first 65,536 contents up front (2.5 MB); more as
        // they come.
        let first = n.min(1 << 16) as usize;
        Self {
            slots: Vec::with_capacity(first),
            spare: Vec::new(),
            order: VecDeque::with_capacity(first),
            pinned: Vec::new(),
            forgotten: 0,
            counters: TierCounters::default(),
            cfg,
        }
    }

    /// Its settings.
    pub fn config(&self) -> &CpuTierConfig {
        &self.cfg
    }

    /// Blocks it holds at most.
    pub fn total(&self) -> u32 {
        self.cfg.cpu_blocks
    }

    /// Blocks holding content.
    pub fn used(&self) -> u32 {
        self.held() + self.forgotten
    }

    /// Contents held in slots, each with an entry in the shared index:
    /// the slots not spare.
    fn held(&self) -> u32 {
        (self.slots.len() - self.spare.len()) as u32
    }

    /// Blocks free.
    pub fn free(&self) -> u32 {
        self.total() - self.used()
    }

    /// What it did so far.
    pub fn counters(&self) -> TierCounters {
        self.counters
    }

    /// Whether the index entry `id` is this tier's slot holding `hash`.
    #[inline]
    pub(crate) fn holds(&self, id: u32, hash: u64) -> bool {
        id & CPU_ID != 0
            && self
                .slots
                .get((id & !CPU_ID) as usize)
                .is_some_and(|s| s.hash == hash)
    }

    /// The slot holding `hash`.
    fn find(&self, index: &HashIndex, hash: u64) -> Option<u32> {
        index
            .get(hash, |id| self.holds(id, hash))
            .map(|id| id & !CPU_ID)
    }

    /// Whether it holds content `hash`.
    pub(crate) fn contains(&self, index: &HashIndex, hash: u64) -> bool {
        self.find(index, hash).is_some()
    }

    fn is_live(&self, (s, g): (u32, u32)) -> bool {
        s == FORGOTTEN || self.slots[s as usize].generation == g
    }

    /// Empties slot `s` (holding `hash`) and removes its index entry: its
    /// order entry goes stale.
    fn take(&mut self, index: &mut HashIndex, s: u32, hash: u64) {
        let found = index.remove(hash, CPU_ID | s);
        debug_assert!(found, "a used CPU slot is indexed");
        self.take_slot(s);
    }

    /// Empties slot `s`, whose index entry the caller retargets or
    /// removes: its order entry goes stale.
    fn take_slot(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        slot.generation = slot.generation.wrapping_add(1);
        self.spare.push(s);
    }

    /// Drops the least recently offloaded unpinned content; `false` when
    /// every content is pinned.
    fn drop_oldest(&mut self, index: &mut HashIndex) -> bool {
        let mut kept = Vec::new();
        let mut dropped = false;
        while let Some(e) = self.order.pop_front() {
            // The slot of a content dropped soon (its liveness, its hash
            // and the new content it takes), and, half as far ahead (that
            // slot fetched by then), the index entry its hash leads to; at
            // every entry, stale ones too (they come in runs).
            if let Some(slot) = self
                .order
                .get(PREFETCH_AHEAD)
                .and_then(|&(s, _)| self.slots.get(s as usize))
            {
                mem_prefetch::prefetch_write_data::<_, 3>(slot);
            }
            if let Some(slot) = self
                .order
                .get(PREFETCH_AHEAD / 2)
                .and_then(|&(s, _)| self.slots.get(s as usize))
            {
                index.prefetch(slot.hash);
            }
            if e.0 == FORGOTTEN {
                // A forgotten content (never pinned) goes; the others of
                // its entry stay oldest.
                if e.1 > 1 {
                    self.order.push_front((FORGOTTEN, e.1 - 1));
                }
                self.forgotten -= 1;
                dropped = true;
                break;
            }
            if !self.is_live(e) {
                continue;
            }
            let hash = self.slots[e.0 as usize].hash;
            if !self.pinned.is_empty() && self.pinned.contains(&hash) {
                kept.push(e);
                continue;
            }
            self.take(index, e.0, hash);
            dropped = true;
            break;
        }
        // Pinned contents keep their places, oldest first.
        for e in kept.into_iter().rev() {
            self.order.push_front(e);
        }
        dropped
    }

    /// Stores content `hash`, which no index entry names (a GPU block's
    /// private content), offloaded at `now` (µs), dropping the least
    /// recently offloaded unpinned content when full.
    pub(crate) fn offload(&mut self, index: &mut HashIndex, hash: u64, now: i64) {
        debug_assert!(!self.contains(index, hash), "content offloaded twice");
        if !self.make_room(index) {
            return;
        }
        let s = self.store(hash, now);
        index.insert(hash, CPU_ID | s);
    }

    /// Stores content `hash`, whose index entry names GPU block `block`
    /// (evicted, or emptied by an eager offload), offloaded at `now` (µs):
    /// the entry is retargeted to the slot it takes. When full of pinned
    /// contents the content is dropped, and so is the entry.
    pub(crate) fn offload_indexed(
        &mut self,
        index: &mut HashIndex,
        hash: u64,
        block: u32,
        now: i64,
    ) {
        debug_assert!(!self.contains(index, hash), "content offloaded twice");
        // (Room first: a drop's backward shift may move the entry.)
        if !self.make_room(index) {
            let found = index.remove(hash, block);
            debug_assert!(found, "an offloaded GPU block's content is indexed");
            return;
        }
        let s = self.store(hash, now);
        let found = index.retarget(hash, block, CPU_ID | s);
        debug_assert!(found, "an offloaded GPU block's content is indexed");
    }

    /// Puts content `hash` in a free slot (room made) and returns it.
    fn store(&mut self, hash: u64, now: i64) -> u32 {
        let s = self.spare.pop().unwrap_or_else(|| {
            // A slot never used yet (room was made: fewer are held than
            // the tier's blocks).
            self.slots.push(Slot {
                hash: 0,
                at: 0,
                generation: 0,
            });
            self.slots.len() as u32 - 1
        });
        debug_assert!(s < CPU_ID, "a CPU slot's id has its top bit clear");
        let slot = &mut self.slots[s as usize];
        slot.hash = hash;
        slot.at = now;
        self.order.push_back((s, slot.generation));
        self.counters.offloads += 1;
        self.compact_order();
        s
    }

    /// Drops the least recently offloaded unpinned content when full;
    /// `false` when full of pinned contents (the content to come is then
    /// what is dropped).
    fn make_room(&mut self, index: &mut HashIndex) -> bool {
        if self.used() < self.total() {
            return true;
        }
        self.counters.cpu_evictions += 1;
        self.drop_oldest(index)
    }

    /// Removes the stale entries of the offload order once they are most.
    fn compact_order(&mut self) {
        if self.order.len() > 2 * self.used() as usize + 64 {
            let slots = &self.slots;
            self.order
                .retain(|&(s, g)| s == FORGOTTEN || slots[s as usize].generation == g);
        }
    }

    /// [`CpuTier::offload`] of a content no one will ever look up (the
    /// private content a request left, forgotten: see
    /// `KvCache::release_forgetting`): it takes room and is dropped in its
    /// turn like any other, but has no hash, no slot and no index entry.
    pub(crate) fn offload_forgotten(&mut self, index: &mut HashIndex) {
        if !self.make_room(index) {
            return;
        }
        self.add_forgotten(1);
    }

    /// `n` calls of [`CpuTier::offload_forgotten`] (a forgotten run's
    /// evicted blocks), the same contents dropped and the same counts, in
    /// steps of many where they are counts: the room still free, then, when
    /// full, the oldest forgotten contents (each dropped for one to come).
    /// Other oldest contents go one at a time, as they would.
    pub(crate) fn offload_forgotten_many(&mut self, index: &mut HashIndex, n: u32) {
        let mut left = n;
        while left > 0 {
            let free = self.free();
            if free > 0 {
                let k = left.min(free);
                self.add_forgotten(k);
                left -= k;
                continue;
            }
            match self.order.front_mut() {
                Some(e) if e.0 == FORGOTTEN => {
                    // Full, the oldest forgotten (never pinned): each to
                    // come drops one of them.
                    let k = left.min(e.1);
                    e.1 -= k;
                    if e.1 == 0 {
                        self.order.pop_front();
                    }
                    self.forgotten -= k;
                    self.counters.cpu_evictions += u64::from(k);
                    self.add_forgotten(k);
                    left -= k;
                }
                _ => {
                    self.offload_forgotten(index);
                    left -= 1;
                }
            }
        }
    }

    /// Adds `k` forgotten contents, room made, as the most recently
    /// offloaded.
    fn add_forgotten(&mut self, k: u32) {
        match self.order.back_mut() {
            Some(e) if e.0 == FORGOTTEN => e.1 += k,
            _ => self.order.push_back((FORGOTTEN, k)),
        }
        self.forgotten += k;
        self.counters.offloads += u64::from(k);
    }

    /// Keeps content `hash` from being dropped to make room until
    /// [`CpuTier::unpin_all`]: an admission about to reload it first takes
    /// GPU blocks, whose evicted content may come here.
    pub fn pin(&mut self, hash: u64) {
        self.pinned.push(hash);
    }

    /// Ends every [`CpuTier::pin`].
    pub fn unpin_all(&mut self) {
        self.pinned.clear();
    }

    /// Takes content `hash` out to reload it into GPU block `block` at
    /// `now` (µs): its index entry is retargeted to the block. `false`
    /// when it is not here.
    pub(crate) fn reload(
        &mut self,
        index: &mut HashIndex,
        hash: u64,
        block: u32,
        now: i64,
    ) -> bool {
        let Some(s) = self.find(index, hash) else {
            return false;
        };
        let at = self.slots[s as usize].at;
        self.take_slot(s);
        let found = index.retarget(hash, CPU_ID | s, block);
        debug_assert!(found, "a used CPU slot is indexed");
        self.counters.reloads += 1;
        if now - at <= self.cfg.thrashing_window_us {
            self.counters.thrashing += 1;
        }
        true
    }

    /// Drops the content of slot `id` (an index entry's id, [`CPU_ID`]
    /// set) because GPU block `block` computed it again: the entry is
    /// retargeted to the block (a content is in at most one tier).
    pub(crate) fn forget_into(&mut self, index: &mut HashIndex, id: u32, block: u32) {
        let hash = self.slots[(id & !CPU_ID) as usize].hash;
        self.take_slot(id & !CPU_ID);
        let found = index.retarget(hash, id, block);
        debug_assert!(found, "a used CPU slot is indexed");
    }

    /// Counts one transfer of `blocks` blocks and returns its time, µs.
    pub fn charge_transfer(&mut self, blocks: u32) -> i64 {
        let t = self.cfg.transfer_us(blocks);
        self.counters.transfers += 1;
        self.counters.transfer_us += t as u64;
        t
    }

    /// Checks the tier's invariants against the shared index (for tests).
    pub(crate) fn check(&self, index: &HashIndex) -> Result<(), String> {
        if !self.pinned.is_empty() {
            return Err(format!("{} CPU contents left pinned", self.pinned.len()));
        }
        let indexed = index.entries().filter(|&(_, id)| id & CPU_ID != 0).count();
        if indexed != self.held() as usize {
            return Err(format!(
                "CPU tier: {indexed} index entries for {} contents held",
                self.held()
            ));
        }
        if self.spare.len() > self.slots.len() || self.slots.len() > self.total() as usize {
            return Err(format!(
                "CPU tier: {} spare of {} slots (of {})",
                self.spare.len(),
                self.slots.len(),
                self.total()
            ));
        }
        if self.used() > self.total() {
            return Err(format!(
                "CPU tier: {} used of {}",
                self.used(),
                self.total()
            ));
        }
        let mut live = 0u32;
        for &e in &self.order {
            if e.0 == FORGOTTEN {
                if e.1 == 0 {
                    return Err("CPU tier: an empty entry of forgotten contents".into());
                }
                live += e.1;
            } else if self.is_live(e) {
                live += 1;
                if self.find(index, self.slots[e.0 as usize].hash) != Some(e.0) {
                    return Err(format!("CPU tier: slot {} is misplaced", e.0));
                }
            }
        }
        if live != self.used() {
            return Err(format!(
                "CPU tier: {live} live entries in offload order, {} used",
                self.used()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tier and the index it shares (no GPU content in it).
    fn tier(blocks: u32) -> (CpuTier, HashIndex) {
        (CpuTier::new(cfg(blocks)), HashIndex::new(blocks))
    }

    fn cfg(blocks: u32) -> CpuTierConfig {
        CpuTierConfig {
            policy: OffloadPolicy::OnEvict,
            cpu_blocks: blocks,
            offload_threshold: 0.9,
            transfer_bandwidth_gb_s: 32.0,
            transfer_base_latency_us: 10.0,
            block_bytes: 2_097_152.0,
            thrashing_window_us: 1000,
        }
    }

    #[test]
    fn forgotten_contents_take_room_and_go_in_their_turn() {
        let (mut t, mut ix) = tier(3);
        t.offload(&mut ix, 1, 0);
        t.offload_forgotten(&mut ix);
        t.offload_forgotten(&mut ix);
        assert_eq!((t.used(), t.free()), (3, 0));
        t.check(&ix).unwrap();
        // Full: the oldest (content 1) goes first, then the forgotten ones
        // one at a time, in offload order.
        t.offload(&mut ix, 2, 10);
        assert!(!t.contains(&ix, 1) && t.contains(&ix, 2));
        t.offload(&mut ix, 3, 20);
        t.offload(&mut ix, 4, 30);
        assert_eq!(t.used(), 3);
        assert!(t.contains(&ix, 2) && t.contains(&ix, 3) && t.contains(&ix, 4));
        assert_eq!(t.counters().cpu_evictions, 3);
        assert_eq!(t.counters().offloads, 6);
        t.check(&ix).unwrap();
    }

    proptest::proptest! {
        /// Many forgotten contents at once leave the tier, its index and
        /// its counts exactly as that many one at a time, whatever the tier
        /// held (stale entries, pinned contents, forgotten runs at either
        /// end).
        #[test]
        fn forgotten_in_bulk_as_one_at_a_time(
            blocks in 1u32..12,
            ops in proptest::collection::vec((0u8..5, 0u64..24, 0u32..9), 1..120),
        ) {
            let (mut bulk, mut bulk_ix) = tier(blocks);
            let (mut one, mut one_ix) = tier(blocks);
            for (i, &(op, h, n)) in ops.iter().enumerate() {
                let h = h + 1;
                let now = i as i64;
                match op {
                    0 => {
                        if !bulk.contains(&bulk_ix, h) {
                            bulk.offload(&mut bulk_ix, h, now);
                            one.offload(&mut one_ix, h, now);
                        }
                    }
                    1 => {
                        bulk.offload_forgotten_many(&mut bulk_ix, n);
                        for _ in 0..n {
                            one.offload_forgotten(&mut one_ix);
                        }
                    }
                    2 => {
                        // A reload leaves a stale entry in the order.
                        let b = 1000 + i as u32;
                        let x = bulk.reload(&mut bulk_ix, h, b, now);
                        let y = one.reload(&mut one_ix, h, b, now);
                        proptest::prop_assert_eq!(x, y);
                        if x {
                            bulk_ix.remove(h, b);
                            one_ix.remove(h, b);
                        }
                    }
                    3 => {
                        bulk.pin(h);
                        one.pin(h);
                    }
                    _ => {
                        bulk.unpin_all();
                        one.unpin_all();
                    }
                }
                proptest::prop_assert_eq!(format!("{bulk:?}"), format!("{one:?}"));
                proptest::prop_assert_eq!(format!("{bulk_ix:?}"), format!("{one_ix:?}"));
            }
            bulk.unpin_all();
            bulk.check(&bulk_ix).map_err(proptest::test_runner::TestCaseError::fail)?;
        }
    }

    #[test]
    fn transfer_time_is_base_plus_bytes_over_bandwidth() {
        let c = cfg(4);
        // 3 blocks × 2 MiB at 32 GB/s = 196.608 µs, + 10 µs.
        assert_eq!(c.transfer_us(3), 207);
        assert_eq!(c.transfer_us(0), 0);
    }

    #[test]
    fn a_full_tier_drops_its_least_recently_offloaded_content() {
        let (mut t, mut ix) = tier(2);
        t.offload(&mut ix, 1, 0);
        t.offload(&mut ix, 2, 10);
        t.offload(&mut ix, 3, 20);
        assert!(!t.contains(&ix, 1) && t.contains(&ix, 2) && t.contains(&ix, 3));
        assert_eq!(t.counters().cpu_evictions, 1);
        assert_eq!(t.used() + t.free(), t.total());
        t.check(&ix).unwrap();
    }

    #[test]
    fn a_pinned_content_is_not_dropped_to_make_room() {
        let (mut t, mut ix) = tier(2);
        t.offload(&mut ix, 1, 0);
        t.offload(&mut ix, 2, 10);
        t.pin(1);
        t.offload(&mut ix, 3, 20);
        assert!(t.contains(&ix, 1) && !t.contains(&ix, 2) && t.contains(&ix, 3));
        t.pin(3);
        // Everything pinned: the new content is the one dropped.
        t.offload(&mut ix, 4, 30);
        assert!(t.contains(&ix, 1) && t.contains(&ix, 3) && !t.contains(&ix, 4));
        assert_eq!(t.counters().cpu_evictions, 2);
        t.unpin_all();
        // 1 kept its place: the oldest, dropped first.
        t.offload(&mut ix, 5, 40);
        assert!(!t.contains(&ix, 1) && t.contains(&ix, 3) && t.contains(&ix, 5));
        t.check(&ix).unwrap();
    }

    #[test]
    fn an_offloaded_gpu_content_keeps_its_index_entry_retargeted() {
        let (mut t, mut ix) = tier(1);
        // Contents 7 and 9 on GPU blocks 5 and 6.
        ix.insert(7, 5);
        ix.insert(9, 6);
        t.offload_indexed(&mut ix, 7, 5, 0);
        assert!(t.contains(&ix, 7));
        assert_eq!(ix.len(), 2, "the entry moved, none was added");
        assert_eq!(ix.get(7, |id| id == 5), None);
        t.check(&ix).unwrap();
        // Full of a pinned content: the new one is dropped, and so is the
        // entry that named its GPU block.
        t.pin(7);
        t.offload_indexed(&mut ix, 9, 6, 10);
        assert!(!t.contains(&ix, 9));
        assert_eq!(ix.len(), 1);
        t.unpin_all();
        // Reloaded into block 3: the entry names the block again.
        assert!(t.reload(&mut ix, 7, 3, 20));
        assert_eq!(ix.get(7, |id| id == 3), Some(3));
        assert_eq!(t.used(), 0);
        t.check(&ix).unwrap();
    }

    #[test]
    fn a_reload_within_the_window_is_thrashing() {
        let (mut t, mut ix) = tier(8);
        t.offload(&mut ix, 1, 0);
        t.offload(&mut ix, 2, 0);
        assert!(t.reload(&mut ix, 1, 0, 1000));
        assert!(t.reload(&mut ix, 2, 1, 1001));
        assert!(
            !t.reload(&mut ix, 2, 0, 1002),
            "a reloaded content left the tier"
        );
        let c = t.counters();
        assert_eq!((c.offloads, c.reloads, c.thrashing), (2, 2, 1));
        t.check(&ix).unwrap();
    }

    #[test]
    fn bad_settings_name_their_flag() {
        let mut c = cfg(0);
        assert!(c.validate().unwrap_err().contains("--kv-cpu-blocks"));
        c.cpu_blocks = 1;
        c.offload_threshold = f64::NAN;
        assert!(c.validate().unwrap_err().contains("--kv-offload-threshold"));
        c.offload_threshold = 0.5;
        c.transfer_bandwidth_gb_s = 0.0;
        assert!(
            c.validate()
                .unwrap_err()
                .contains("--kv-transfer-bandwidth")
        );
    }
}
