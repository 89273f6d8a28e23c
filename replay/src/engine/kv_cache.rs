//! The paged KV cache of one instance, with prefix caching as in vLLM V1:
//! fixed-size blocks, reference counts, chained block hashes, and an LRU
//! queue of free blocks whose contents stay findable until the block is
//! reused (evicted).

use std::collections::VecDeque;

use crate::engine::hash_index::HashIndex;
use crate::engine::kv_tier::{CPU_ID, CpuTier, CpuTierConfig, OffloadPolicy};
use rustc_hash::FxHashMap;

const NIL: u32 = u32::MAX;

/// The block of a free-queue entry standing for a run of forgotten blocks
/// ([`KvCache::release_forgetting`]); its generation is the run's number.
const RUN: u32 = u32::MAX;

/// `Block::ref_flags`' bit: the block holds a registered content hash.
const HASHED: u32 = 1 << 31;
/// `Block::ref_flags`' bit: its hash is private content (see
/// [`KvCache::commit_private`]) and not in the hash index.
const PRIVATE: u32 = 1 << 30;

/// One KV block's bookkeeping, 8 bytes: what allocation and release read
/// and write, kept apart from its content ([`Content`]) so that taking the
/// least recently freed block and releasing a table touch a small array.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// Reference count (low 30 bits), `HASHED` and `PRIVATE`.
    ref_flags: u32,
    /// The generation of its entry in the free queue: an entry whose
    /// generation differs is stale (the block left the queue since).
    queued: u32,
}

impl Block {
    fn ref_cnt(&self) -> u32 {
        self.ref_flags & !(HASHED | PRIVATE)
    }

    fn is_hashed(&self) -> bool {
        self.ref_flags & HASHED != 0
    }
}

/// What one KV block holds, 16 bytes: read on prefix-cache lookups and
/// commits, and on the eviction of a block whose hash is indexed.
#[derive(Debug, Clone, Copy)]
struct Content {
    /// Content hash, meaningful while the block's `HASHED` is set.
    hash_bits: u64,
    /// The block that last followed this one in a request's table when it
    /// was committed: a hint for chained lookups, checked before use.
    child: u32,
}

/// Blocks a request released at once whose content no one can look up
/// ([`KvCache::release_forgetting`]): one free-queue entry for them all.
/// Taken from the queue, the unhashed come first (a table is released
/// last block first, and only a request's last blocks can be partial).
#[derive(Debug, Clone, Copy)]
struct ForgottenRun {
    unhashed: u32,
    /// Full blocks: each taken is an eviction, as for any block whose
    /// content was committed.
    hashed: u32,
}

/// The KV blocks of one instance.
///
/// Invariant: `used() + free() == total()` after every operation; every
/// block with a zero reference count is in the free queue exactly once,
/// or among the forgotten blocks of a run ([`KvCache::release_forgetting`]).
#[derive(Debug, Clone)]
pub struct KvCache {
    block_size: u32,
    /// `log2(block_size)` when it is a power of two (vLLM's are): the
    /// divisions by the block size on every step become shifts.
    block_shift: Option<u32>,
    /// The blocks materialised so far (`[0, fresh_next)`); the others have
    /// never been used and are not materialised.
    blocks: Vec<Block>,
    content: Vec<Content>,
    /// All blocks.
    total_blocks: u32,
    /// Blocks materialised (`blocks.len()`); ids `[fresh_next,
    /// total_blocks)` have never been handed out.
    fresh_next: u32,
    /// Never-used blocks still at the head of the free queue, ahead of
    /// every entry of `queue` (at the start every block is queued in id
    /// order and a freed block goes to the tail, so the never-used ones
    /// always come first). Kept implicit, an instance costs memory for the
    /// blocks it uses only. A block taken from there is a forgotten one
    /// when there is one (see `forgotten`), a new id otherwise: both hold
    /// nothing, and no output names a block.
    fresh_left: u32,
    /// The free queue, least recently freed first: (block, generation)
    /// entries, stale ones skipped and compacted away (a block taken out
    /// of the middle by a prefix-cache hit leaves its entry behind).
    /// vLLM keeps a doubly linked list; this keeps the same order in a ring
    /// buffer, where taking a block touches only that block (a list also
    /// writes its neighbours: a cache miss per allocation on a large
    /// cache).
    queue: VecDeque<(u32, u32)>,
    free_count: u32,
    cached: HashIndex,
    /// Recently hit chains by the hash of their first block: the blocks a
    /// prefix was last found in, which [`KvCache::match_prefix`] checks
    /// first (a hint: each block is confirmed to still hold its hash).
    chains: FxHashMap<u64, Vec<u32>>,
    /// Whether a private hash may be outside the index.
    has_private: bool,
    prefix_caching: bool,
    evictions: u64,
    /// The CPU tier, when the cache is tiered ([`KvCache::with_cpu_tier`]).
    cpu: Option<Box<CpuTier>>,
    /// Tiered, eager: the free-queue entries before this position hold no
    /// cached content (offloaded, or fresh), so an offload pass starts here.
    offload_scan: usize,
    /// Tiered, on-evict: offload evicted content while more than this many
    /// blocks are in use (`u32::MAX`: never).
    evict_offload_above: u32,
    /// Tiered: the time of the operations being applied, µs (for the
    /// thrashing window).
    clock: i64,
    /// The runs of forgotten blocks, oldest first: one per `RUN` entry of
    /// `queue`, in its order.
    runs: VecDeque<ForgottenRun>,
    /// The number of the oldest run (`runs[0]`); runs are numbered in
    /// order, wrapping.
    run_number: u32,
    /// Blocks of `runs`: they hold nothing anyone can find, so any of
    /// them serves when a run is reached (the most recently freed first),
    /// and as a never-used block (`fresh_left`), sparing new memory. Their
    /// bookkeeping is not kept up to date until they are taken. With the
    /// ids never handed out, they are as many as the runs' blocks and the
    /// never-used ones together: `forgotten.len() + total_blocks −
    /// fresh_next == fresh_left + Σ runs + virtual_held`. Each is as its
    /// last owner left it, held once without content, which is what taking
    /// it makes it.
    forgotten: Vec<u32>,
    /// Blocks held without an id ([`KvCache::take_virtual`]): private
    /// blocks of requests that will forget them, backed by `forgotten` and
    /// the ids never handed out.
    virtual_held: u32,
    /// A one-block table for [`KvCache::take_virtual`]'s evictions.
    scratch_one: Vec<u32>,
}

/// How far ahead in the free queue a block is prefetched when one is
/// taken: the least recently freed blocks are the coldest memory of a
/// replay, and an admission takes tens at once. (Measured on the 16-instance
/// chat benchmark: the next block, 8, 32 and 64 ahead; 32 and 64 are
/// alike, about 8% faster than the next block.)
const PREFETCH_AHEAD: usize = 32;
/// How far ahead a walk over a request's blocks (its release, the commit of
/// its private hashes) fetches the block it will reach.
pub const PIPELINE: usize = 8;

/// At most this many chains are remembered (then all are forgotten).
const MAX_CHAINS: usize = 4096;

impl KvCache {
    /// `total_blocks` blocks of `block_size` tokens, all free.
    pub fn new(total_blocks: u32, block_size: u32, prefix_caching: bool) -> Self {
        let mut c = Self {
            block_size: block_size.max(1),
            block_shift: block_size
                .max(1)
                .is_power_of_two()
                .then(|| block_size.max(1).trailing_zeros()),
            blocks: Vec::new(),
            content: Vec::new(),
            total_blocks,
            fresh_next: 0,
            fresh_left: total_blocks,
            queue: VecDeque::new(),
            free_count: total_blocks,
            cached: HashIndex::new(if prefix_caching { total_blocks } else { 0 }),
            chains: FxHashMap::default(),
            has_private: false,
            prefix_caching,
            evictions: 0,
            cpu: None,
            offload_scan: 0,
            evict_offload_above: u32::MAX,
            clock: 0,
            runs: VecDeque::new(),
            run_number: 0,
            forgotten: Vec::new(),
            virtual_held: 0,
            scratch_one: Vec::new(),
        };
        c.blocks.reserve(total_blocks.min(1024) as usize);
        c.content.reserve(total_blocks.min(1024) as usize);
        c
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// All blocks.
    pub fn total(&self) -> u32 {
        self.total_blocks
    }

    /// Blocks in the free queue (including freed blocks still holding cached
    /// content).
    pub fn free(&self) -> u32 {
        self.free_count
    }

    /// Blocks referenced by requests.
    pub fn used(&self) -> u32 {
        self.total() - self.free_count
    }

    /// Fraction of blocks in use, vLLM's `kv_cache_usage_perc` (0..1).
    pub fn usage(&self) -> f64 {
        if self.total_blocks == 0 {
            0.0
        } else {
            f64::from(self.used()) / f64::from(self.total())
        }
    }

    /// Cached blocks reused by another block's content (evicted).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// This cache with a CPU tier of `cfg` (see [`crate::engine::kv_tier`]).
    pub fn with_cpu_tier(mut self, cfg: CpuTierConfig) -> Self {
        if cfg.policy == OffloadPolicy::OnEvict && self.prefix_caching {
            self.evict_offload_above =
                (cfg.offload_threshold * f64::from(self.total())).floor() as u32;
        }
        // One index for both tiers (a content is in at most one): room
        // for the CPU's contents too.
        if self.prefix_caching {
            debug_assert_eq!(
                self.cached.len(),
                0,
                "a CPU tier is added to an empty cache"
            );
            self.cached = HashIndex::new(self.total_blocks.saturating_add(cfg.cpu_blocks));
        }
        self.cpu = Some(Box::new(CpuTier::new(cfg)));
        self
    }

    /// Tiered: the time of the operations that follow, µs (an offload's
    /// time, for the thrashing window).
    pub fn set_clock(&mut self, now: i64) {
        self.clock = now;
    }

    /// Whether the cache has a CPU tier.
    #[inline]
    pub fn tiered(&self) -> bool {
        self.cpu.is_some()
    }

    /// The CPU tier, when the cache is tiered.
    pub fn cpu_tier(&self) -> Option<&CpuTier> {
        self.cpu.as_deref()
    }

    /// Tiered: whether the CPU tier holds content `hash`; if so it stays
    /// there until [`KvCache::reload`] or [`KvCache::unpin_all`] (the
    /// admission about to reload it may evict GPU content into the tier).
    pub fn cpu_holds_pinned(&mut self, hash: u64) -> bool {
        if !self.prefix_caching {
            return false;
        }
        let Some(cpu) = self.cpu.as_mut() else {
            return false;
        };
        let held = cpu.contains(&self.cached, hash);
        if held {
            cpu.pin(hash);
        }
        held
    }

    /// Tiered: ends the pins of [`KvCache::cpu_holds_pinned`].
    pub fn unpin_all(&mut self) {
        if let Some(cpu) = self.cpu.as_mut() {
            cpu.unpin_all();
        }
    }

    /// Tiered, eager: while the GPU usage is above the offload threshold,
    /// moves the content of every free GPU block still holding cached
    /// content to the CPU tier, least recently freed first, at `now` (µs).
    /// The blocks stay free, now empty. (BLIS's `maybeOffload`; the free
    /// queue is scanned once overall: blocks freed since the last pass are
    /// at its tail.)
    pub fn maybe_offload(&mut self, now: i64) {
        let Some(cpu) = self.cpu.as_mut() else {
            return;
        };
        if cpu.config().policy != OffloadPolicy::Eager {
            return;
        }
        let (total, used) = (self.total_blocks, self.total_blocks - self.free_count);
        if !self.prefix_caching
            || f64::from(used) <= cpu.config().offload_threshold * f64::from(total)
        {
            return;
        }
        for i in self.offload_scan..self.queue.len() {
            let (b, g) = self.queue[i];
            if b == RUN {
                // Forgotten full blocks: their contents go as such, and
                // the blocks stay free, now empty.
                let r = &mut self.runs[g.wrapping_sub(self.run_number) as usize];
                cpu.offload_forgotten_many(&mut self.cached, r.hashed);
                r.unhashed += std::mem::take(&mut r.hashed);
                continue;
            }
            let blk = &mut self.blocks[b as usize];
            if blk.queued != g || blk.ref_flags & HASHED == 0 {
                continue;
            }
            let h = self.content[b as usize].hash_bits;
            if blk.ref_flags & PRIVATE == 0 {
                // (Its index entry now names the CPU slot.)
                cpu.offload_indexed(&mut self.cached, h, b, now);
            } else {
                cpu.offload(&mut self.cached, h, now);
            }
            blk.ref_flags &= !(HASHED | PRIVATE);
        }
        self.offload_scan = self.queue.len();
    }

    /// Tiered, eager: the most blocks in use at which the usage is not
    /// above the offload threshold, when crossing it offloads at the next
    /// batch (`None` otherwise).
    pub fn offload_cap(&self) -> Option<u32> {
        let cpu = self
            .cpu
            .as_ref()
            .filter(|c| self.prefix_caching && c.config().policy == OffloadPolicy::Eager)?;
        Some((cpu.config().offload_threshold * f64::from(self.total())).floor() as u32)
    }

    /// Tiered: reloads content `hash` from the CPU tier into `block` (a
    /// fresh block of the request's table, after `parent`) at `now` (µs):
    /// it leaves the CPU tier and is committed on the GPU (its index entry
    /// retargeted to the block).
    pub fn reload(&mut self, block: u32, hash: u64, parent: Option<u32>, now: i64) {
        let moved = self.prefix_caching
            && self
                .cpu
                .as_mut()
                .is_some_and(|cpu| cpu.reload(&mut self.cached, hash, block, now));
        debug_assert!(
            moved || !self.prefix_caching,
            "reloading content the CPU tier does not hold"
        );
        if !moved {
            self.commit(block, hash, parent);
            return;
        }
        debug_assert!(!self.blocks[block as usize].is_hashed(), "a fresh block");
        self.blocks[block as usize].ref_flags |= HASHED;
        self.content[block as usize].hash_bits = hash;
        if let Some(p) = parent {
            self.content[p as usize].child = block;
        }
    }

    /// Tiered: counts a transfer of `blocks` reloaded blocks and returns
    /// its time, µs (0 without a CPU tier).
    pub fn charge_transfer(&mut self, blocks: u32) -> i64 {
        match self.cpu.as_mut() {
            Some(c) if blocks > 0 => c.charge_transfer(blocks),
            _ => 0,
        }
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        self.full_blocks(tokens) + u32::from(self.in_block(tokens) != 0)
    }

    /// Full blocks in `tokens` tokens.
    pub fn full_blocks(&self, tokens: u32) -> u32 {
        match self.block_shift {
            Some(sh) => tokens >> sh,
            None => tokens / self.block_size,
        }
    }

    /// `j % block_size`.
    pub fn in_block(&self, j: u32) -> u32 {
        match self.block_shift {
            Some(_) => j & (self.block_size - 1),
            None => j % self.block_size,
        }
    }

    /// A decoding request's phase: with `computed` tokens in KV, after how
    /// many more tokens (mod `block_size`) its last block is full,
    /// `(block_size - computed % block_size) % block_size`.
    pub fn phase(&self, computed: u32) -> u32 {
        self.in_block(self.block_size - self.in_block(computed))
    }

    /// Whether block `b` holds registered content `hash` (`false` for an
    /// index entry naming a CPU slot).
    fn holds(&self, b: u32, hash: u64) -> bool {
        b & CPU_ID == 0
            && self.blocks[b as usize].is_hashed()
            && self.content[b as usize].hash_bits == hash
    }

    /// The content hash registered for block `b` in the prefix cache.
    #[cfg(test)]
    fn hash_of(&self, b: u32) -> Option<u64> {
        self.blocks[b as usize]
            .is_hashed()
            .then(|| self.content[b as usize].hash_bits)
    }

    /// Block `b`'s hash when the hash index holds it.
    fn indexed_hash(&self, b: u32) -> Option<u64> {
        (self.blocks[b as usize].ref_flags & (HASHED | PRIVATE) == HASHED)
            .then(|| self.content[b as usize].hash_bits)
    }

    /// The block holding content `hash`, if cached.
    pub fn lookup(&self, hash: u64) -> Option<u32> {
        if !self.prefix_caching {
            return None;
        }
        self.cached.get(hash, |b| self.holds(b, hash))
    }

    /// [`KvCache::lookup`] of the block after `parent` in a chain (the
    /// cached block holding the previous block's content, if any): the
    /// same answer, found by following the child recorded at commit time
    /// when it still holds `hash` (no two blocks hold the same hash, so a
    /// block holding it is the answer), so a cached prefix costs one block
    /// read per block instead of a hash-index probe.
    pub fn lookup_after(&self, parent: Option<u32>, hash: u64) -> Option<u32> {
        if let Some(p) = parent {
            let c = self.content[p as usize].child;
            if c != NIL && self.holds(c, hash) {
                return Some(c);
            }
        }
        self.lookup(hash)
    }

    /// The cached blocks holding the leading blocks of a sequence whose
    /// blocks' chained hashes are `hashes` (as many as may hit), into
    /// `out` (cleared first): what vLLM's prefix-cache query finds,
    /// stopping at the first block not cached.
    ///
    /// The chain last found for the same first block is checked first,
    /// block by block (independent reads, unlike a walk of child hints),
    /// then the rest is looked up as usual; the answer is the same as
    /// with [`KvCache::lookup`] alone.
    pub fn match_prefix(&mut self, hashes: &[u64], out: &mut Vec<u32>) {
        out.clear();
        let Some(&h0) = hashes.first() else {
            return;
        };
        if !self.prefix_caching {
            return;
        }
        let mut known = 0;
        if let Some(chain) = self.chains.get(&h0) {
            known = chain
                .iter()
                .zip(hashes)
                .take_while(|&(&b, &h)| self.holds(b, h))
                .count();
            out.extend_from_slice(&chain[..known]);
        }
        let mut parent = out.last().copied();
        for &h in &hashes[known..] {
            match self.lookup_after(parent, h) {
                Some(b) => {
                    out.push(b);
                    parent = Some(b);
                }
                None => break,
            }
        }
        // Remember a chain of more than one block that the memo did not
        // already give in full.
        if out.len() > known && out.len() > 1 {
            if self.chains.len() >= MAX_CHAINS && !self.chains.contains_key(&h0) {
                self.chains.clear();
            }
            let chain = self.chains.entry(h0).or_default();
            chain.clear();
            chain.extend_from_slice(out);
        }
    }

    /// The number of leading `hashes` cached, as a prefix-cache query
    /// does: it stops at the first miss.
    pub fn matched(&self, hashes: &[u64]) -> usize {
        let mut parent = None;
        for (i, &h) in hashes.iter().enumerate() {
            match self.lookup_after(parent, h) {
                Some(b) => parent = Some(b),
                None => return i,
            }
        }
        hashes.len()
    }

    /// Whether `new_blocks` fresh blocks can be allocated after taking the
    /// cached blocks `hits` (some of which may sit in the free queue).
    pub fn can_allocate(&self, hits: &[u32], new_blocks: u32) -> bool {
        self.can_allocate_after(self.free_hits(hits), new_blocks)
    }

    /// How many of the cached blocks `hits` sit in the free queue (no
    /// request holds them): taking them leaves fewer free blocks.
    pub fn free_hits(&self, hits: &[u32]) -> u32 {
        hits.iter()
            .filter(|&&b| self.blocks[b as usize].ref_cnt() == 0)
            .count() as u32
    }

    /// [`KvCache::can_allocate`] of hits of which `free_hits` are free
    /// ([`KvCache::free_hits`]).
    pub fn can_allocate_after(&self, free_hits: u32, new_blocks: u32) -> bool {
        new_blocks + free_hits <= self.free_count
    }

    /// Appends the cached blocks `hits` and `new_blocks` fresh blocks to
    /// `table`, all or nothing. Fresh blocks come from the head of the free
    /// queue (least recently freed); a reused block's cached content is
    /// evicted.
    pub fn allocate(&mut self, table: &mut Vec<u32>, hits: &[u32], new_blocks: u32) -> bool {
        if !self.can_allocate(hits, new_blocks) {
            return false;
        }
        self.allocate_checked(table, hits, new_blocks);
        true
    }

    /// [`KvCache::allocate`] of one fresh block and no hits (a decoding
    /// request's next block): `false` when none is free. A never-used
    /// block (or a forgotten one in its place) is taken inline; any other
    /// goes through [`KvCache::allocate_checked`].
    #[inline]
    pub fn allocate_one(&mut self, table: &mut Vec<u32>) -> bool {
        if self.free_count == 0 {
            return false;
        }
        if self.fresh_left > 0 {
            self.take_fresh(1, table);
            return true;
        }
        if self.queue.front().is_some_and(|e| e.0 == RUN) {
            // (The head of the free queue a forgotten run, where
            // `allocate_checked` would call `take_forgotten` too.)
            self.take_forgotten_one(table);
            return true;
        }
        self.allocate_checked(table, &[], 1);
        true
    }

    /// [`KvCache::allocate`] where [`KvCache::can_allocate`]`(hits,
    /// new_blocks)` has just said yes (nothing changed since): it does not
    /// count the free hits again. Debug builds check the promise.
    pub fn allocate_checked(&mut self, table: &mut Vec<u32>, hits: &[u32], new_blocks: u32) {
        debug_assert!(
            self.can_allocate(hits, new_blocks),
            "allocate_checked without room"
        );
        for &b in hits {
            let blk = &mut self.blocks[b as usize];
            if blk.ref_cnt() == 0 {
                self.unlink(b);
            }
            self.blocks[b as usize].ref_flags += 1;
            table.push(b);
        }
        let on_evict = self.evict_offload_above != u32::MAX;
        // Never-used blocks first: they head vLLM's free queue.
        let fresh = new_blocks.min(self.fresh_left);
        if fresh > 0 {
            self.take_fresh(fresh, table);
        }
        let mut left = new_blocks - fresh;
        while left > 0 {
            let Some(b) = self.pop_head() else {
                left -= self.take_forgotten(left, table);
                continue;
            };
            left -= 1;
            let flags = self.blocks[b as usize].ref_flags;
            if flags & HASHED != 0 {
                // Evict its content (a private hash is in no index).
                let h = self.content[b as usize].hash_bits;
                self.evictions += 1;
                let indexed = flags & PRIVATE == 0;
                if on_evict && self.used() > self.evict_offload_above {
                    self.offload_evicted(h, indexed.then_some(b));
                } else if indexed {
                    let found = self.cached.remove(h, b);
                    debug_assert!(found, "a block holding a shared hash is indexed");
                }
            }
            self.blocks[b as usize].ref_flags = 1;
            table.push(b);
        }
    }

    /// Tiered, on-evict: the evicted content `hash` goes to the CPU tier;
    /// `block`: the block that held it, when its index entry names it
    /// (retargeted to the CPU slot; `None`: private content, in no index).
    #[cold]
    fn offload_evicted(&mut self, hash: u64, block: Option<u32>) {
        let cpu = self
            .cpu
            .as_mut()
            .expect("on-evict offloads need a CPU tier");
        match block {
            Some(b) => cpu.offload_indexed(&mut self.cached, hash, b, self.clock),
            None => cpu.offload(&mut self.cached, hash, self.clock),
        }
    }

    /// Hints the CPU to fetch where [`KvCache::commit`] of content `hash`
    /// will look (the hash index both tiers share): [`PIPELINE`] blocks
    /// ahead of a walk committing a request's blocks.
    #[inline]
    pub fn prefetch_commit(&self, hash: u64) {
        self.cached.prefetch(hash);
    }

    /// Hints the CPU to fetch block `b`'s bookkeeping and content (one
    /// [`PIPELINE`] blocks ahead of a walk over a request's blocks).
    #[inline]
    pub fn prefetch_block(&self, b: u32) {
        if let (Some(blk), Some(c)) = (self.blocks.get(b as usize), self.content.get(b as usize)) {
            mem_prefetch::prefetch_write_data::<_, 3>(blk);
            mem_prefetch::prefetch_write_data::<_, 3>(c);
        }
    }

    /// Releases a request's blocks, last block first, so that its tail is
    /// evicted before its prefix (vLLM's order). Cached content stays
    /// findable until the block is reused.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        for (i, &b) in table.iter().enumerate().rev() {
            if i >= PIPELINE {
                self.prefetch_block(table[i - PIPELINE]);
            }
            let blk = &mut self.blocks[b as usize];
            debug_assert!(blk.ref_cnt() > 0);
            blk.ref_flags -= 1;
            if blk.ref_cnt() == 0 {
                self.push_tail(b);
            }
        }
        table.clear();
    }

    /// [`KvCache::release`] of a table whose blocks from `from` on hold
    /// content that no one will ever look up: private content (see
    /// [`KvCache::commit_private`]) of a request never preempted, released
    /// for good, while no request id repeats. Those blocks are not touched:
    /// their content is forgotten rather than committed, and they join the
    /// free queue as one entry where they would have been, whose first
    /// `hashed` blocks taken (after the unhashed rest) count as evictions,
    /// as the committed blocks would have. Every count and every cached
    /// block's place in the queue is as after committing them with
    /// [`KvCache::commit_private`] and releasing; only which block ids
    /// later allocations get differs (no output depends on them). Their
    /// content can no longer be indexed ([`KvCache::index_all_private`]);
    /// with a CPU tier it is offloaded when evicted as content no one can
    /// look up (`CpuTier::offload_forgotten`), taking the room the
    /// committed content would have.
    pub fn release_forgetting(&mut self, table: &mut Vec<u32>, from: usize, hashed: u32) {
        self.release_forgetting_virtual(table, from, hashed, 0);
    }

    /// [`KvCache::release_forgetting`] of a table and `virt` more private
    /// blocks held without ids ([`KvCache::take_virtual`]): they join the
    /// forgotten run with the table's own.
    pub fn release_forgetting_virtual(
        &mut self,
        table: &mut Vec<u32>,
        from: usize,
        hashed: u32,
        virt: u32,
    ) {
        debug_assert!(virt <= self.virtual_held);
        self.virtual_held -= virt;
        let from = from.min(table.len());
        let k = (table.len() - from) as u32 + virt;
        if k > 0 {
            let hashed = if self.prefix_caching {
                hashed.min(k)
            } else {
                0
            };
            let number = self.run_number.wrapping_add(self.runs.len() as u32);
            self.runs.push_back(ForgottenRun {
                unhashed: k - hashed,
                hashed,
            });
            self.queue.push_back((RUN, number));
            self.forgotten.extend_from_slice(&table[from..]);
            self.free_count += k;
            table.truncate(from);
        }
        self.release(table);
    }

    /// Appends up to `max` blocks of the oldest forgotten run, which heads
    /// the free queue, to `table` (held once each), and returns how many:
    /// its unhashed blocks first, then the hashed ones, whose eviction is
    /// counted. The same blocks, counts and offloads as taking them one
    /// at a time from the head of the queue.
    fn take_forgotten(&mut self, max: u32, table: &mut Vec<u32>) -> u32 {
        let k = self.count_forgotten(max);
        // The blocks: forgotten ids last lent first, then new ones.
        self.hand_out(k, table);
        k
    }

    /// [`KvCache::take_forgotten`]'s counts and offloads, without the ids;
    /// returns how many blocks it took.
    fn count_forgotten(&mut self, max: u32) -> u32 {
        let r = self.runs.front_mut().expect("a run per queue entry");
        let unhashed = max.min(r.unhashed);
        let hashed = (max - unhashed).min(r.hashed);
        r.unhashed -= unhashed;
        r.hashed -= hashed;
        if r.unhashed == 0 && r.hashed == 0 {
            self.end_forgotten_run();
        }
        let k = unhashed + hashed;
        let used = self.used();
        self.free_count -= k;
        self.evictions += u64::from(hashed);
        if self.evict_offload_above != u32::MAX
            && let Some(cpu) = self.cpu.as_mut()
        {
            // Tiered, on-evict: an evicted content goes to the CPU tier,
            // as the committed content would have, when the usage after
            // taking its block is above the threshold: the `p`-th block
            // taken (from 0) when `used + p + 1 > evict_offload_above`.
            let first = unhashed.max(self.evict_offload_above.saturating_sub(used));
            cpu.offload_forgotten_many(&mut self.cached, k.saturating_sub(first));
        }
        k
    }

    /// [`KvCache::take_forgotten`] of one block (a decoding request's next
    /// block, the commonest allocation), the same counts and offloads
    /// without the general case's arithmetic and calls.
    #[inline]
    fn take_forgotten_one(&mut self, table: &mut Vec<u32>) {
        self.count_forgotten_one();
        self.hand_out_one(table);
    }

    /// [`KvCache::take_forgotten_one`]'s counts and offloads, without the
    /// id.
    #[inline]
    fn count_forgotten_one(&mut self) {
        let r = self.runs.front_mut().expect("a run per queue entry");
        // Its unhashed blocks first (a run is never empty).
        let hashed = r.unhashed == 0;
        if hashed {
            r.hashed -= 1;
        } else {
            r.unhashed -= 1;
        }
        if r.unhashed == 0 && r.hashed == 0 {
            self.end_forgotten_run();
        }
        let used = self.used();
        self.free_count -= 1;
        if hashed {
            self.evictions += 1;
            if self.evict_offload_above != u32::MAX
                && used + 1 > self.evict_offload_above
                && let Some(cpu) = self.cpu.as_mut()
            {
                cpu.offload_forgotten(&mut self.cached);
            }
        }
    }

    /// Takes `n` free blocks for private content that will be forgotten
    /// ([`KvCache::release_forgetting_virtual`]) without handing out ids:
    /// the same blocks leave the free queue, with the same evictions and
    /// CPU-tier offloads, as `n` calls of [`KvCache::allocate_one`] (only
    /// which ids later allocations get differs); the id of an evicted
    /// block joins the forgotten ones. The caller has checked that `n`
    /// blocks are free.
    pub fn take_virtual(&mut self, n: u32) {
        debug_assert!(n <= self.free_count, "take_virtual without room");
        let mut left = n;
        while left > 0 {
            if self.fresh_left > 0 {
                let k = left.min(self.fresh_left);
                self.fresh_left -= k;
                self.free_count -= k;
                left -= k;
            } else if self.queue.front().is_some_and(|e| e.0 == RUN) {
                left -= self.count_forgotten(left);
            } else {
                let mut one = std::mem::take(&mut self.scratch_one);
                self.allocate_checked(&mut one, &[], 1);
                // (Evicted and held once: what a forgotten id is.)
                self.forgotten.append(&mut one);
                self.scratch_one = one;
                left -= 1;
            }
        }
        self.virtual_held += n;
    }

    /// Gives ids to `n` blocks held without them
    /// ([`KvCache::take_virtual`]), appended to `table`: their request is
    /// about to commit or share its content.
    pub fn materialise_virtual(&mut self, table: &mut Vec<u32>, n: u32) {
        debug_assert!(n <= self.virtual_held);
        self.virtual_held -= n;
        table.reserve(n as usize);
        for _ in 0..n {
            self.hand_out_one(table);
        }
    }

    /// The oldest forgotten run, all taken, leaves the head of the free
    /// queue.
    fn end_forgotten_run(&mut self) {
        self.runs.pop_front();
        self.run_number = self.run_number.wrapping_add(1);
        let head = self.queue.pop_front();
        debug_assert_eq!(head.map(|e| e.0), Some(RUN));
        self.offload_scan = self.offload_scan.saturating_sub(1);
    }

    /// Appends `k` of the never-used blocks (`k <= fresh_left`; forgotten
    /// ones serve in their place, see [`KvCache::hand_out`]) to `table`:
    /// they hold nothing to evict.
    #[inline]
    fn take_fresh(&mut self, k: u32, table: &mut Vec<u32>) {
        debug_assert!(k <= self.fresh_left);
        self.fresh_left -= k;
        self.free_count -= k;
        self.hand_out(k, table);
    }

    /// Appends `k` blocks that hold nothing anyone can find to `table`,
    /// held once each: forgotten ids, the last lent first, then ids never
    /// handed out.
    #[inline]
    fn hand_out(&mut self, k: u32, table: &mut Vec<u32>) {
        if k == 1 {
            // (A decoding request's next block: no loop.)
            self.hand_out_one(table);
            return;
        }
        table.reserve(k as usize);
        let lent = (k as usize).min(self.forgotten.len());
        let at = self.forgotten.len() - lent;
        for &b in self.forgotten[at..].iter().rev() {
            self.debug_assert_held_once(b);
            table.push(b);
        }
        self.forgotten.truncate(at);
        for _ in lent..k as usize {
            let b = self.materialise();
            table.push(b);
        }
    }

    /// [`KvCache::hand_out`] of one block.
    #[inline(always)]
    fn hand_out_one(&mut self, table: &mut Vec<u32>) {
        let b = match self.forgotten.pop() {
            Some(b) => b,
            None => self.materialise(),
        };
        self.debug_assert_held_once(b);
        table.push(b);
    }

    /// A forgotten id's bookkeeping is what its last owner left: held once,
    /// no content (a private block, never committed, of a request that was
    /// never preempted, the only one that held it). Handed out again it is
    /// held once: its bookkeeping is not touched, sparing the cache miss of
    /// a block last touched when it was last lent.
    #[inline(always)]
    fn debug_assert_held_once(&self, b: u32) {
        debug_assert_eq!(
            self.blocks[b as usize].ref_flags, 1,
            "forgotten block {b} is not held once without content"
        );
    }

    /// A block id never handed out, its bookkeeping made (what queueing it
    /// at the start and taking it now would have left: held once).
    fn materialise(&mut self) -> u32 {
        let b = self.fresh_next;
        debug_assert!(b < self.total_blocks, "a block id left");
        self.fresh_next += 1;
        self.blocks.push(Block {
            ref_flags: 1,
            queued: 2,
        });
        self.content.push(Content {
            hash_bits: 0,
            child: NIL,
        });
        b
    }

    /// Registers the hash of a full block whose content is private to the
    /// request that computed it (see `blis_traces::content::private_from`):
    /// as [`KvCache::commit`], but outside the hash index. No other
    /// request can look such content up, and the request itself finds its
    /// blocks by their table, so the index would only be written at commit
    /// and at eviction, for nothing: the two cache misses per new block
    /// that dominate a replay. The block counts as cached in every other
    /// respect (its eviction is counted). The owner calls
    /// [`KvCache::index_private`] on its blocks before it could look them
    /// up by hash (when it is preempted), and a run whose requests turn out
    /// not to have private content (a repeated request id) calls
    /// [`KvCache::index_all_private`].
    pub fn commit_private(&mut self, block: u32, hash: u64, parent: Option<u32>) {
        if !self.prefix_caching {
            return;
        }
        let blk = &mut self.blocks[block as usize];
        if !blk.is_hashed() {
            blk.ref_flags |= HASHED | PRIVATE;
            self.content[block as usize].hash_bits = hash;
            self.has_private = true;
            // Content private to a request never preempted was never
            // offloaded (a preempted request's blocks are indexed first).
            debug_assert!(
                !self
                    .cpu
                    .as_ref()
                    .is_some_and(|c| c.contains(&self.cached, hash))
            );
        }
        if let Some(p) = parent {
            self.content[p as usize].child = block;
        }
    }

    /// Puts `block`'s private hash (if it holds one) into the hash index.
    pub fn index_private(&mut self, block: u32) {
        let blk = &mut self.blocks[block as usize];
        if blk.ref_flags & PRIVATE == 0 {
            return;
        }
        blk.ref_flags &= !PRIVATE;
        let h = self.content[block as usize].hash_bits;
        debug_assert!(
            self.cached.get(h, |b| self.holds(b, h)).is_none(),
            "private content held twice"
        );
        self.cached.insert(h, block);
    }

    /// Puts every private hash into the hash index: from now on the cache
    /// is as if every block had been committed with [`KvCache::commit`].
    pub fn index_all_private(&mut self) {
        if !self.has_private {
            return;
        }
        for b in 0..self.fresh_next {
            self.index_private(b);
        }
        self.has_private = false;
    }

    /// Registers the content hash of a full block. If another block already
    /// holds that content, this one stays unregistered (as vLLM does).
    /// `parent`: the block before it in the request's table, whose chain
    /// hint (see [`KvCache::lookup_after`]) is pointed at the block now
    /// holding `hash`.
    pub fn commit(&mut self, block: u32, hash: u64, parent: Option<u32>) {
        if !self.prefix_caching {
            return;
        }
        let holder = if self.blocks[block as usize].is_hashed() {
            block
        } else {
            // One probe finds the content on either tier.
            let found = self.cached.get(hash, |id| {
                self.holds(id, hash) || self.cpu.as_ref().is_some_and(|c| c.holds(id, hash))
            });
            match found {
                Some(holder) if holder & CPU_ID == 0 => holder,
                _ => {
                    match (found, self.cpu.as_mut()) {
                        // Computed again: the GPU copy is the one now, and
                        // the entry names it.
                        (Some(id), Some(cpu)) => cpu.forget_into(&mut self.cached, id, block),
                        _ => self.cached.insert(hash, block),
                    }
                    self.blocks[block as usize].ref_flags |= HASHED;
                    self.content[block as usize].hash_bits = hash;
                    block
                }
            }
        };
        if let Some(p) = parent {
            self.content[p as usize].child = holder;
        }
    }

    fn push_tail(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        blk.queued = blk.queued.wrapping_add(1);
        self.queue.push_back((b, blk.queued));
        self.free_count += 1;
        if self.queue.len() > 2 * self.free_count as usize + self.total_blocks as usize / 8 + 64 {
            let blocks = &self.blocks;
            self.queue
                .retain(|&(b, g)| b == RUN || blocks[b as usize].queued == g);
            self.offload_scan = 0;
        }
    }

    /// Takes block `b` out of the free queue (its entry goes stale).
    fn unlink(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        blk.queued = blk.queued.wrapping_add(1);
        self.free_count -= 1;
    }

    /// Takes the head of the free queue after the never-used blocks
    /// (there is one: checked by [`KvCache::can_allocate`]; the never-used
    /// ones are [`KvCache::take_fresh`]'s), skipping stale entries; `None`
    /// when the head is a run of forgotten blocks
    /// ([`KvCache::take_forgotten`]).
    fn pop_head(&mut self) -> Option<u32> {
        debug_assert_eq!(self.fresh_left, 0, "never-used blocks come first");
        loop {
            let &(b, g) = self.queue.front().expect("checked by can_allocate");
            if b == RUN {
                return None;
            }
            self.queue.pop_front();
            self.offload_scan = self.offload_scan.saturating_sub(1);
            if self.blocks[b as usize].queued == g {
                self.unlink(b);
                // A block soon to be taken: fetch it, and the content it
                // evicts if it holds any, ahead of its allocation.
                if let Some(&(next, _)) = self.queue.get(PREFETCH_AHEAD)
                    && next != RUN
                {
                    mem_prefetch::prefetch_write_data::<_, 3>(&self.blocks[next as usize]);
                    mem_prefetch::prefetch_read_data::<_, 3>(&self.content[next as usize]);
                }
                // And, half as far ahead (its content fetched by then), the
                // hash index's slot its eviction removes (or, tiered,
                // retargets to the CPU slot it goes to).
                if let Some(&(mid, _)) = self.queue.get(PREFETCH_AHEAD / 2)
                    && mid != RUN
                {
                    self.cached.prefetch(self.content[mid as usize].hash_bits);
                }
                return Some(b);
            }
        }
    }

    /// Checks the cache's invariants (for tests): conservation of blocks,
    /// free-queue consistency, and that cached hashes point at blocks holding
    /// them.
    pub fn check(&self) -> Result<(), String> {
        if self.blocks.len() != self.fresh_next as usize
            || self.content.len() != self.fresh_next as usize
            || self.fresh_next > self.total_blocks
        {
            return Err(format!(
                "{} blocks materialised but {} handed out of {}",
                self.blocks.len(),
                self.fresh_next,
                self.total_blocks
            ));
        }
        let mut in_list = self.fresh_left;
        let mut seen = vec![false; self.blocks.len()];
        let mut forgotten = vec![false; self.blocks.len()];
        for &b in &self.forgotten {
            if forgotten[b as usize] {
                return Err(format!("block {b} forgotten twice"));
            }
            forgotten[b as usize] = true;
        }
        let run_blocks: u32 = self.runs.iter().map(|r| r.unhashed + r.hashed).sum();
        let run_entries = self.queue.iter().filter(|e| e.0 == RUN).count();
        if run_blocks as usize + self.fresh_left as usize + self.virtual_held as usize
            != self.forgotten.len() + (self.total_blocks - self.fresh_next) as usize
            || run_entries != self.runs.len()
            || self.runs.iter().any(|r| r.unhashed + r.hashed == 0)
        {
            return Err(format!(
                "{} forgotten blocks and {} never used for {} runs ({run_blocks} blocks, {run_entries} queue entries), {} never-used places and {} blocks held without ids",
                self.forgotten.len(),
                self.total_blocks - self.fresh_next,
                self.runs.len(),
                self.fresh_left,
                self.virtual_held
            ));
        }
        in_list += run_blocks;
        for &(b, g) in &self.queue {
            if b == RUN {
                continue;
            }
            let blk = &self.blocks[b as usize];
            if blk.queued != g {
                continue;
            }
            if blk.ref_cnt() != 0 || seen[b as usize] || forgotten[b as usize] {
                return Err(format!("free queue corrupt at block {b}"));
            }
            seen[b as usize] = true;
            in_list += 1;
        }
        if in_list != self.free_count {
            return Err(format!(
                "free count {} but {} blocks queued",
                self.free_count, in_list
            ));
        }
        // (A forgotten block's bookkeeping is what its last owner left.)
        let used = (self.blocks.iter().enumerate())
            .filter(|&(i, b)| b.ref_cnt() > 0 && !forgotten[i])
            .count() as u32
            + self.virtual_held;
        if used + self.free_count != self.total() {
            return Err(format!(
                "used {used} + free {} != total {}",
                self.free_count,
                self.total()
            ));
        }
        let mut hashed = 0usize;
        for i in 0..self.fresh_next {
            if forgotten[i as usize] && self.blocks[i as usize].ref_flags & (HASHED | PRIVATE) != 0
            {
                return Err(format!("forgotten block {i} holds content"));
            }
            if let Some(h) = self.indexed_hash(i) {
                hashed += 1;
                if self.lookup(h) != Some(i) {
                    return Err(format!(
                        "block {i} holds hash {h:#x} but the index does not find it"
                    ));
                }
            }
        }
        let gpu_entries = self
            .cached
            .entries()
            .filter(|&(_, b)| b & CPU_ID == 0)
            .count();
        if hashed != gpu_entries {
            return Err(format!(
                "{hashed} blocks hold shared hashes but the index has {gpu_entries} entries for GPU blocks"
            ));
        }
        for (tag, b) in self.cached.entries().filter(|&(_, b)| b & CPU_ID == 0) {
            match (b < self.fresh_next)
                .then(|| self.indexed_hash(b))
                .flatten()
            {
                Some(h) if h & 0xFFFF_FFFF_0000_0000 == tag => {}
                _ => return Err(format!("index entry for block {b} is stale")),
            }
        }
        if let Some(cpu) = &self.cpu {
            cpu.check(&self.cached)?;
            for b in 0..self.fresh_next {
                let blk = &self.blocks[b as usize];
                let h = self.content[b as usize].hash_bits;
                if blk.is_hashed() && cpu.contains(&self.cached, h) {
                    return Err(format!(
                        "content {h:#x} is on the GPU (block {b}) and the CPU"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Fresh blocks come in vLLM's order: the least recently freed
        /// first, a block taken out of the middle by a prefix-cache hit
        /// and freed again going to the tail. Checked against a plain list
        /// under random allocations, hits and releases (which also leave
        /// enough stale entries to compact the queue).
        #[test]
        fn fresh_blocks_come_least_recently_freed_first(
            ops in proptest::collection::vec((0u8..3, 1u32..6, 0usize..8), 1..300)
        ) {
            let total = 24u32;
            let mut kv = KvCache::new(total, 16, true);
            let mut free: Vec<u32> = (0..total).collect();
            let mut refs = vec![0u32; total as usize];
            let mut live: Vec<Vec<u32>> = Vec::new();
            let mut released: Vec<Vec<u32>> = Vec::new();
            let mut next_hash = 1u64;
            for (op, n, k) in ops {
                match op {
                    0 => {
                        let mut t = Vec::new();
                        let ok = kv.allocate(&mut t, &[], n);
                        prop_assert_eq!(ok, n as usize <= free.len());
                        if ok {
                            let want: Vec<u32> = free.drain(..n as usize).collect();
                            prop_assert_eq!(&t, &want);
                            for &b in &t {
                                refs[b as usize] += 1;
                                kv.commit(b, next_hash, None);
                                next_hash += 1;
                            }
                            live.push(t);
                        }
                    }
                    1 if !live.is_empty() => {
                        let mut t = live.remove(k % live.len());
                        for &b in t.iter().rev() {
                            refs[b as usize] -= 1;
                            if refs[b as usize] == 0 {
                                free.push(b);
                            }
                        }
                        released.push(t.clone());
                        kv.release(&mut t);
                    }
                    _ if !released.is_empty() => {
                        // Hit the blocks of a released table still cached.
                        let t = &released[k % released.len()];
                        let hits: Vec<u32> = t
                            .iter()
                            .copied()
                            .filter(|&b| kv.hash_of(b).is_some())
                            .collect();
                        let mut table = Vec::new();
                        prop_assert!(kv.allocate(&mut table, &hits, 0));
                        for &b in &hits {
                            if refs[b as usize] == 0 {
                                free.retain(|&f| f != b);
                            }
                            refs[b as usize] += 1;
                        }
                        live.push(table);
                    }
                    _ => {}
                }
                prop_assert_eq!(kv.free() as usize, free.len());
                prop_assert!(kv.check().is_ok(), "{:?}", kv.check());
            }
        }
    }

    /// Hits on a free block leave stale entries in the free queue; once
    /// they outnumber the live ones the queue is compacted, keeping its
    /// order.
    /// Block arithmetic by shifts (power-of-two sizes) and by division
    /// agree with the definitions.
    #[test]
    fn block_arithmetic_holds_for_any_block_size() {
        for bs in [1u32, 2, 3, 7, 16, 32, 48, 256] {
            let kv = KvCache::new(4, bs, true);
            for t in 0..1000u32 {
                assert_eq!(kv.blocks_for(t), t.div_ceil(bs), "bs {bs}, {t} tokens");
                assert_eq!(kv.full_blocks(t), t / bs);
                assert_eq!(kv.phase(t), (bs - t % bs) % bs);
                assert_eq!(kv.in_block(t), t % bs);
            }
        }
    }

    #[test]
    fn the_free_queue_keeps_its_order_through_compaction() {
        let mut kv = KvCache::new(8, 16, true);
        let mut t = Vec::new();
        assert!(kv.allocate(&mut t, &[], 1));
        let a = t[0];
        kv.commit(a, 7, None);
        kv.release(&mut t);
        for _ in 0..500 {
            let mut hit = Vec::new();
            assert!(kv.allocate(&mut hit, &[a], 0));
            kv.release(&mut hit);
        }
        assert!(kv.queue.len() < 200, "compacted: {}", kv.queue.len());
        kv.check().unwrap();
        let mut all = Vec::new();
        assert!(kv.allocate(&mut all, &[], 8));
        let mut want: Vec<u32> = (0..8).filter(|&b| b != a).collect();
        want.push(a);
        assert_eq!(all, want);
    }

    #[test]
    fn forgotten_blocks_serve_as_never_used_ones_before_new_memory() {
        // A large cache where every request forgets its blocks: the ids it
        // hands out cycle through the few already in memory, while the
        // never-used places at the head of the queue are taken in turn.
        let mut kv = KvCache::new(10_000, 16, true);
        for _ in 0..100 {
            let mut t = Vec::new();
            assert!(kv.allocate(&mut t, &[], 8));
            kv.release_forgetting(&mut t, 0, 0);
            kv.check().unwrap();
        }
        assert_eq!(kv.blocks.len(), 8, "in memory");
        assert_eq!(kv.fresh_left, 10_000 - 800, "never-used places taken");
        assert_eq!((kv.used(), kv.free()), (0, 10_000));
        // Once the never-used places are gone, the runs are reached in turn
        // and new ids are made when their blocks were lent out.
        let mut all = Vec::new();
        assert!(kv.allocate(&mut all, &[], 10_000));
        kv.check().unwrap();
        let mut ids = all.clone();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 10_000, "every id once");
        kv.release(&mut all);
        kv.check().unwrap();
    }

    #[test]
    fn allocation_is_all_or_nothing_and_conserves_blocks() {
        let mut kv = KvCache::new(4, 16, true);
        let mut a = Vec::new();
        assert!(kv.allocate(&mut a, &[], 3));
        let mut b = Vec::new();
        assert!(!kv.allocate(&mut b, &[], 2));
        assert!(b.is_empty());
        assert_eq!((kv.used(), kv.free()), (3, 1));
        kv.check().unwrap();
        kv.release(&mut a);
        assert_eq!((kv.used(), kv.free()), (0, 4));
        kv.check().unwrap();
    }

    #[test]
    fn freed_blocks_stay_cached_until_reused_lru_first() {
        let mut kv = KvCache::new(3, 16, true);
        let mut a = Vec::new();
        kv.allocate(&mut a, &[], 2);
        kv.commit(a[0], 100, None);
        kv.commit(a[1], 101, Some(a[0]));
        let (a0, a1) = (a[0], a[1]);
        kv.release(&mut a);
        // Released tail first: a1 then a0 are at the tail, after the never-used block.
        assert_eq!(kv.lookup(100), Some(a0));
        // A hit on a free cached block takes it out of the free queue.
        let mut b = Vec::new();
        assert!(kv.allocate(&mut b, &[a0], 1));
        assert_eq!(b[0], a0);
        assert_eq!(kv.used(), 2);
        // The fresh block was the never-used one; now a1 is next to go.
        let mut c = Vec::new();
        assert!(kv.allocate(&mut c, &[], 1));
        assert_eq!(c[0], a1);
        assert_eq!(kv.lookup(101), None);
        assert_eq!(kv.evictions(), 1);
        kv.check().unwrap();
    }

    #[test]
    fn private_blocks_are_cached_but_found_only_once_indexed() {
        let mut kv = KvCache::new(2, 16, true);
        let mut a = Vec::new();
        kv.allocate(&mut a, &[], 2);
        kv.commit(a[0], 1, None);
        kv.commit_private(a[1], 2, Some(a[0]));
        kv.check().unwrap();
        assert_eq!(kv.lookup(1), Some(a[0]));
        assert_eq!(kv.lookup(2), None, "private content is not indexed");
        // ... but its owner still finds it through its chain.
        assert_eq!(kv.lookup_after(Some(a[0]), 2), Some(a[1]));
        let (a0, a1) = (a[0], a[1]);
        kv.release(&mut a);
        kv.index_private(a1);
        kv.check().unwrap();
        assert_eq!(kv.lookup(2), Some(a1));
        // Evicting private content counts as an eviction, indexed or not.
        let mut b = Vec::new();
        kv.commit_private(a0, 3, None); // already holds 1: no change
        assert_eq!(kv.lookup(1), Some(a0));
        kv.allocate(&mut b, &[], 2);
        assert_eq!(kv.evictions(), 2);
        kv.commit_private(b[0], 4, None);
        kv.release(&mut b);
        let mut c = Vec::new();
        kv.allocate(&mut c, &[], 2);
        assert_eq!(kv.evictions(), 3);
        kv.check().unwrap();
    }

    proptest! {
        /// Releasing a table forgetting its private tail leaves the same
        /// counts as committing that tail privately and releasing it: free
        /// blocks, evictions as the blocks are reused, and which shared
        /// content stays findable, under random tables, tails and reuse.
        #[test]
        fn forgetting_a_private_tail_counts_as_committing_it(
            ops in proptest::collection::vec((1u32..6, 0u32..6, 0u32..6, 1u32..12), 1..60)
        ) {
            let total = 40u32;
            let mut a = KvCache::new(total, 16, true);
            let mut b = KvCache::new(total, 16, true);
            let mut next_hash = 1u64;
            for (shared, private, partial, reuse) in ops {
                let n = shared + private + partial.min(1);
                let (mut ta, mut tb) = (Vec::new(), Vec::new());
                let ok = a.allocate(&mut ta, &[], n);
                prop_assert_eq!(ok, b.allocate(&mut tb, &[], n));
                if ok {
                    for j in 0..shared as usize {
                        let parent = j.checked_sub(1);
                        a.commit(ta[j], next_hash, parent.map(|p| ta[p]));
                        b.commit(tb[j], next_hash, parent.map(|p| tb[p]));
                        next_hash += 1;
                    }
                    for j in shared as usize..(shared + private) as usize {
                        a.commit_private(ta[j], next_hash, j.checked_sub(1).map(|p| ta[p]));
                        next_hash += 1;
                    }
                    a.release(&mut ta);
                    b.release_forgetting(&mut tb, shared as usize, private);
                }
                // Reuse: the same number of fresh blocks on both.
                let (mut ra, mut rb) = (Vec::new(), Vec::new());
                let k = reuse.min(a.free());
                prop_assert!(a.allocate(&mut ra, &[], k));
                prop_assert!(b.allocate(&mut rb, &[], k));
                prop_assert_eq!(a.evictions(), b.evictions());
                prop_assert_eq!(a.free(), b.free());
                a.release(&mut ra);
                b.release(&mut rb);
                for h in 1..next_hash {
                    prop_assert_eq!(a.lookup(h).is_some(), b.lookup(h).is_some(), "hash {}", h);
                }
                prop_assert!(b.check().is_ok(), "{:?}", b.check());
            }
        }
    }

    proptest! {
        /// Blocks taken in one `allocate(table, &[], n)` are the blocks
        /// `n` calls of `allocate_one` (a decoding request's next block)
        /// give, in the same order and with the same counts, whether they
        /// come from never-used memory, forgotten runs or the free queue
        /// (evicting cached content): two caches under the same random
        /// requests, one taking every block one at a time.
        #[test]
        fn one_block_at_a_time_is_allocate_of_one(
            ops in proptest::collection::vec((1u32..8, 0u32..5, 0u32..4, any::<bool>()), 1..80)
        ) {
            let total = 48u32;
            let mut a = KvCache::new(total, 16, true);
            let mut b = KvCache::new(total, 16, true);
            let mut next_hash = 1u64;
            let mut live: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
            for (n, grow, private, forget) in ops {
                let (mut ta, mut tb) = (Vec::new(), Vec::new());
                let fits = n <= b.free();
                let ok = a.allocate(&mut ta, &[], n);
                prop_assert_eq!(ok, fits);
                if ok {
                    for _ in 0..n {
                        prop_assert!(b.allocate_one(&mut tb));
                    }
                    prop_assert_eq!(&ta, &tb);
                    for _ in 0..grow {
                        let ok = a.allocate(&mut ta, &[], 1);
                        prop_assert_eq!(ok, b.allocate_one(&mut tb));
                    }
                    prop_assert_eq!(&ta, &tb);
                    let private = (private as usize).min(ta.len());
                    let shared = ta.len() - private;
                    for j in 0..ta.len() {
                        let parent = j.checked_sub(1);
                        if j < shared {
                            a.commit(ta[j], next_hash, parent.map(|p| ta[p]));
                            b.commit(tb[j], next_hash, parent.map(|p| tb[p]));
                        } else if !forget {
                            a.commit_private(ta[j], next_hash, parent.map(|p| ta[p]));
                            b.commit_private(tb[j], next_hash, parent.map(|p| tb[p]));
                        }
                        next_hash += 1;
                    }
                    if forget {
                        a.release_forgetting(&mut ta, shared, private as u32);
                        b.release_forgetting(&mut tb, shared, private as u32);
                    } else {
                        live.push((ta, tb));
                    }
                }
                if live.len() > 3 {
                    let (mut ta, mut tb) = live.remove(0);
                    a.release(&mut ta);
                    b.release(&mut tb);
                }
                prop_assert_eq!(a.evictions(), b.evictions());
                prop_assert_eq!(a.free(), b.free());
                prop_assert!(b.check().is_ok(), "{:?}", b.check());
            }
        }
    }

    proptest! {
        /// Private blocks held without ids ([`KvCache::take_virtual`]) take
        /// from the free queue what the same blocks taken one at a time
        /// with ids take: the same evictions, free blocks and findable
        /// content, whether they are forgotten at release or given ids
        /// first ([`KvCache::materialise_virtual`], as for a preempted
        /// request) and committed.
        #[test]
        fn blocks_without_ids_take_what_blocks_with_ids_take(
            ops in proptest::collection::vec((1u32..6, 0u32..6, any::<bool>()), 1..80)
        ) {
            let total = 40u32;
            let mut a = KvCache::new(total, 16, true);
            let mut b = KvCache::new(total, 16, true);
            let mut next_hash = 1u64;
            let mut chains: Vec<Vec<u64>> = Vec::new();
            let mut live: Vec<(Vec<u32>, u32, Vec<u32>)> = Vec::new();
            for (shared, private, keep_ids) in ops {
                if shared + private > b.free() {
                    if let Some((mut ta, _, mut tb)) = (!live.is_empty()).then(|| live.remove(0)) {
                        a.release(&mut ta);
                        b.release(&mut tb);
                    }
                    continue;
                }
                let (mut ta, mut tb) = (Vec::new(), Vec::new());
                prop_assert!(a.allocate(&mut ta, &[], shared));
                prop_assert!(b.allocate(&mut tb, &[], shared));
                let mut chain = Vec::new();
                for j in 0..shared as usize {
                    let parent = j.checked_sub(1);
                    a.commit(ta[j], next_hash, parent.map(|p| ta[p]));
                    b.commit(tb[j], next_hash, parent.map(|p| tb[p]));
                    chain.push(next_hash);
                    next_hash += 1;
                }
                chains.push(chain);
                a.take_virtual(private);
                for _ in 0..private {
                    prop_assert!(b.allocate_one(&mut tb));
                }
                if keep_ids {
                    // Preempted: the blocks get ids, their private content
                    // is committed, and they are released later.
                    a.materialise_virtual(&mut ta, private);
                    for j in shared as usize..ta.len() {
                        let parent = j.checked_sub(1);
                        a.commit_private(ta[j], next_hash, parent.map(|p| ta[p]));
                        b.commit_private(tb[j], next_hash, parent.map(|p| tb[p]));
                        next_hash += 1;
                    }
                    live.push((ta, 0, tb));
                } else {
                    a.release_forgetting_virtual(&mut ta, shared as usize, private, private);
                    b.release_forgetting(&mut tb, shared as usize, private);
                }
                if live.len() > 2 {
                    let (mut ta, _, mut tb) = live.remove(0);
                    a.release(&mut ta);
                    b.release(&mut tb);
                }
                prop_assert_eq!(a.evictions(), b.evictions());
                prop_assert_eq!(a.free(), b.free());
                for c in &chains {
                    prop_assert_eq!(a.matched(c), b.matched(c));
                }
                prop_assert!(a.check().is_ok(), "{:?}", a.check());
                prop_assert!(b.check().is_ok(), "{:?}", b.check());
            }
        }
    }

    #[test]
    fn shared_blocks_are_reference_counted() {
        let mut kv = KvCache::new(4, 16, true);
        let mut a = Vec::new();
        kv.allocate(&mut a, &[], 1);
        kv.commit(a[0], 7, None);
        let mut b = Vec::new();
        assert!(kv.allocate(&mut b, &[a[0]], 1));
        assert_eq!(kv.used(), 2);
        kv.release(&mut a);
        assert_eq!(kv.used(), 2, "still referenced by b");
        kv.release(&mut b);
        assert_eq!(kv.used(), 0);
        kv.check().unwrap();
    }
}
