//! The paged KV cache of one instance, with prefix caching as in vLLM V1:
//! fixed-size blocks, reference counts, chained block hashes, and an LRU
//! queue of free blocks whose contents stay findable until the block is
//! reused (evicted).

use rustc_hash::FxHashMap;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Block {
    ref_cnt: u32,
    /// Content hash when the block is registered in the prefix cache.
    hash: Option<u64>,
    prev: u32,
    next: u32,
    in_free_list: bool,
}

/// The KV blocks of one instance.
///
/// Invariant: `used() + free() == total()` after every operation; every
/// block with a zero reference count is in the free queue exactly once.
#[derive(Debug, Clone)]
pub struct KvCache {
    block_size: u32,
    blocks: Vec<Block>,
    free_head: u32,
    free_tail: u32,
    free_count: u32,
    cached: FxHashMap<u64, u32>,
    prefix_caching: bool,
    evictions: u64,
}

impl KvCache {
    /// `total_blocks` blocks of `block_size` tokens, all free.
    pub fn new(total_blocks: u32, block_size: u32, prefix_caching: bool) -> Self {
        let mut c = Self {
            block_size: block_size.max(1),
            blocks: vec![
                Block {
                    ref_cnt: 0,
                    hash: None,
                    prev: NIL,
                    next: NIL,
                    in_free_list: false,
                };
                total_blocks as usize
            ],
            free_head: NIL,
            free_tail: NIL,
            free_count: 0,
            cached: FxHashMap::default(),
            prefix_caching,
            evictions: 0,
        };
        for b in 0..total_blocks {
            c.push_tail(b);
        }
        c
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// All blocks.
    pub fn total(&self) -> u32 {
        self.blocks.len() as u32
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
        if self.blocks.is_empty() {
            0.0
        } else {
            f64::from(self.used()) / f64::from(self.total())
        }
    }

    /// Cached blocks reused by another block's content (evicted).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    /// The block holding content `hash`, if cached.
    ///
    /// The map is invalidated lazily: evicting a block only clears the
    /// block's own hash, and an entry is valid only while its block still
    /// holds that hash (stale entries are purged when they outnumber the
    /// blocks). This keeps hash-map traffic off the allocation path.
    pub fn lookup(&self, hash: u64) -> Option<u32> {
        if !self.prefix_caching {
            return None;
        }
        let b = *self.cached.get(&hash)?;
        (self.blocks[b as usize].hash == Some(hash)).then_some(b)
    }

    /// Whether `new_blocks` fresh blocks can be allocated after taking the
    /// cached blocks `hits` (some of which may sit in the free queue).
    pub fn can_allocate(&self, hits: &[u32], new_blocks: u32) -> bool {
        let free_hits = hits
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_cnt == 0)
            .count() as u32;
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
        for &b in hits {
            let blk = &mut self.blocks[b as usize];
            if blk.ref_cnt == 0 {
                self.unlink(b);
            }
            self.blocks[b as usize].ref_cnt += 1;
            table.push(b);
        }
        for _ in 0..new_blocks {
            let b = self.free_head;
            debug_assert_ne!(b, NIL, "checked by can_allocate");
            self.unlink(b);
            let blk = &mut self.blocks[b as usize];
            if blk.hash.take().is_some() {
                // Its map entry is now stale (see `lookup`).
                self.evictions += 1;
            }
            blk.ref_cnt = 1;
            table.push(b);
        }
        true
    }

    /// Releases a request's blocks, last block first, so that its tail is
    /// evicted before its prefix (vLLM's order). Cached content stays
    /// findable until the block is reused.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        for &b in table.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            debug_assert!(blk.ref_cnt > 0);
            blk.ref_cnt -= 1;
            if blk.ref_cnt == 0 {
                self.push_tail(b);
            }
        }
        table.clear();
    }

    /// Registers the content hash of a full block. If another block already
    /// holds that content, this one stays unregistered (as vLLM does).
    pub fn commit(&mut self, block: u32, hash: u64) {
        if !self.prefix_caching || self.blocks[block as usize].hash.is_some() {
            return;
        }
        let blocks = &mut self.blocks;
        match self.cached.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(block);
                blocks[block as usize].hash = Some(hash);
            }
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let holder = *e.get();
                if blocks[holder as usize].hash != Some(hash) {
                    // A stale entry: this block takes the content over.
                    e.insert(block);
                    blocks[block as usize].hash = Some(hash);
                }
            }
        }
        if self.cached.len() > 4 * self.blocks.len() + 1024 {
            let blocks = &self.blocks;
            self.cached
                .retain(|h, b| blocks[*b as usize].hash == Some(*h));
        }
    }

    fn push_tail(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        blk.prev = self.free_tail;
        blk.next = NIL;
        blk.in_free_list = true;
        if self.free_tail == NIL {
            self.free_head = b;
        } else {
            self.blocks[self.free_tail as usize].next = b;
        }
        self.free_tail = b;
        self.free_count += 1;
    }

    fn unlink(&mut self, b: u32) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let blk = &mut self.blocks[b as usize];
        blk.prev = NIL;
        blk.next = NIL;
        blk.in_free_list = false;
        self.free_count -= 1;
    }

    /// Checks the cache's invariants (for tests): conservation of blocks,
    /// free-queue consistency, and that cached hashes point at blocks holding
    /// them.
    pub fn check(&self) -> Result<(), String> {
        let mut in_list = 0u32;
        let mut b = self.free_head;
        let mut prev = NIL;
        while b != NIL {
            let blk = &self.blocks[b as usize];
            if blk.ref_cnt != 0 || !blk.in_free_list || blk.prev != prev {
                return Err(format!("free queue corrupt at block {b}"));
            }
            in_list += 1;
            if in_list > self.total() {
                return Err("free queue has a cycle".into());
            }
            prev = b;
            b = blk.next;
        }
        if in_list != self.free_count {
            return Err(format!(
                "free count {} but {} blocks queued",
                self.free_count, in_list
            ));
        }
        let used = self.blocks.iter().filter(|b| b.ref_cnt > 0).count() as u32;
        if used + self.free_count != self.total() {
            return Err(format!(
                "used {used} + free {} != total {}",
                self.free_count,
                self.total()
            ));
        }
        for (i, blk) in self.blocks.iter().enumerate() {
            if let Some(h) = blk.hash
                && self.cached.get(&h) != Some(&(i as u32))
            {
                return Err(format!(
                    "block {i} holds hash {h:#x} but the map does not point at it"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        kv.commit(a[0], 100);
        kv.commit(a[1], 101);
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
    fn shared_blocks_are_reference_counted() {
        let mut kv = KvCache::new(4, 16, true);
        let mut a = Vec::new();
        kv.allocate(&mut a, &[], 1);
        kv.commit(a[0], 7);
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
