//! The router's per-instance prefix index: an LRU set of block hashes with
//! bounded capacity (llm-d's prefix-cache scorer keeps the same kind of
//! index of the blocks it routed, without asking the instances).
//!
//! A compact hash index into a slab of nodes on a doubly linked recency
//! list, so a touch, an insert and an eviction are O(1) each. A request's
//! prompt is a chain of ~hundreds of block hashes, most of them a shared
//! prefix that every request of its tenant repeats; each chain's first node
//! remembers the nodes of the chain last inserted through it, so matching
//! a known prefix reads those nodes in order (independent reads, confirmed
//! one by one) instead of probing the hash index per block.
//!
//! A request's private blocks (its own body: see
//! `blis_traces::content::private_from`) can never be matched by another
//! request, so they take their place in the recency list (they still use
//! capacity and push others out) but not in the hash index, and all those
//! of one prompt as one node: a run, evicted block by block from its
//! front, its hashes kept in order for when they must be indexed after
//! all ([`PrefixIndex::index_all_private`]). A run never moves in the
//! recency list, so runs leave it in the order they came, and one queue
//! keeps every run's hashes (at most `capacity` of them).

use std::collections::VecDeque;

use crate::engine::hash_index::HashIndex;

const NO_NODE: u32 = u32::MAX;

/// A bounded LRU set of block hashes.
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    capacity: usize,
    /// Blocks held (a run's each counted).
    len: usize,
    map: HashIndex,
    nodes: Vec<LruNode>,
    free: Vec<u32>,
    /// Least recently used.
    head: u32,
    /// Most recently used.
    tail: u32,
    /// Remembered chains, by `LruNode::chain`.
    chains: Vec<Vec<u32>>,
    free_chains: Vec<u32>,
    /// The hashes of every run's held blocks, oldest run first.
    run_hashes: VecDeque<u64>,
    /// The position of `run_hashes`' front among all the hashes it ever
    /// held.
    run_base: u64,
    /// Runs of private blocks, by `LruNode::chain` of a run's node.
    runs: Vec<PrivateRun>,
    free_runs: Vec<u32>,
    scratch: Vec<u32>,
    /// Counts the changes to what it holds ([`PrefixIndex::version`]).
    version: u64,
}

#[derive(Debug, Clone, Copy)]
struct LruNode {
    /// Its block's hash (none for a run).
    hash: u64,
    prev: u32,
    next: u32,
    /// The chain remembered through this node (its first), or `NO_NODE`;
    /// a run's node: its run.
    chain: u32,
    /// Whether it is in the recency list (false once evicted, until
    /// reused).
    live: bool,
    /// Whether it stands for a run of private blocks (in no hash index)
    /// rather than one block (in the hash index).
    run: bool,
}

/// The private blocks of one prompt held, least recent first: the
/// positions `first..end` of `PrefixIndex::run_hashes`' hashes.
#[derive(Debug, Clone, Copy, Default)]
struct PrivateRun {
    first: u64,
    end: u64,
}

impl PrefixIndex {
    /// An empty index of at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, u32::MAX as usize / 4);
        Self {
            capacity,
            len: 0,
            map: HashIndex::new(capacity as u32),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NO_NODE,
            tail: NO_NODE,
            chains: Vec::new(),
            free_chains: Vec::new(),
            run_hashes: VecDeque::new(),
            run_base: 0,
            runs: Vec::new(),
            free_runs: Vec::new(),
            scratch: Vec::new(),
            version: 0,
        }
    }

    /// Forgets every block (a new replica's index), keeping its capacity;
    /// its [`PrefixIndex::version`] still moves on.
    pub fn clear(&mut self) {
        let version = self.version.wrapping_add(1);
        *self = Self {
            version,
            ..Self::new(self.capacity)
        };
    }

    /// A count of the changes to the blocks it holds: while it stays the
    /// same, [`PrefixIndex::matched`] gives the same answers (a caller may
    /// keep them).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The most blocks it remembers.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn holds(&self, i: u32, h: u64) -> bool {
        let n = &self.nodes[i as usize];
        n.live && !n.run && n.hash == h
    }

    fn find(&self, h: u64) -> Option<u32> {
        self.map.get(h, |i| self.holds(i, h))
    }

    /// How many leading `hashes` the chain remembered through node `first`
    /// (which holds `hashes[0]`) still gives, with their nodes appended to
    /// `out` when given.
    fn remembered(&self, first: u32, hashes: &[u64], mut out: Option<&mut Vec<u32>>) -> usize {
        let c = self.nodes[first as usize].chain;
        if c == NO_NODE {
            return 1;
        }
        let chain = &self.chains[c as usize];
        let lim = chain.len().min(hashes.len());
        let mut m = 1;
        while m < lim && self.holds(chain[m], hashes[m]) {
            if let Some(o) = out.as_deref_mut() {
                o.push(chain[m]);
            }
            m += 1;
        }
        m
    }

    /// Leading hashes of `hashes` present.
    pub fn matched(&self, hashes: &[u64]) -> usize {
        let Some(&h0) = hashes.first() else {
            return 0;
        };
        let Some(first) = self.find(h0) else {
            return 0;
        };
        let mut m = self.remembered(first, hashes, None);
        while m < hashes.len() && self.find(hashes[m]).is_some() {
            m += 1;
        }
        m
    }

    /// Records `hashes` as used now, in order (the last is the most
    /// recent), keeping the `capacity` most recently used. (The least
    /// recently used are evicted as new hashes come in; the set and order
    /// kept are those of inserting all, then evicting down to capacity.)
    pub fn insert(&mut self, hashes: &[u64]) {
        self.insert_private(hashes, hashes.len());
    }

    /// [`PrefixIndex::insert`] of a prompt whose blocks from `private_from`
    /// on are private to it (their hashes new to the index; the caller
    /// guarantees it): they are added without entering the hash index.
    pub fn insert_private(&mut self, hashes: &[u64], private_from: usize) {
        let Some(&h0) = hashes.first() else {
            return;
        };
        self.version = self.version.wrapping_add(1);
        let mut found = std::mem::take(&mut self.scratch);
        found.clear();
        let first = self.find(h0);
        let known = match first {
            Some(f) => {
                found.push(f);
                self.remembered(f, hashes, Some(&mut found))
            }
            None => 0,
        };
        let private_from = private_from.min(hashes.len());
        // `found` holds the nodes of the first `known` hashes. They are all
        // touched before the first new node is added, so no eviction in
        // this loop takes one of them first.
        let mut chain = Vec::new();
        if first.is_some() && private_from > 1 {
            chain = self.take_chain_buffer(found[0]);
        }
        for (j, &h) in hashes[..private_from].iter().enumerate() {
            let hit = if j < known {
                debug_assert!(self.holds(found[j], h));
                Some(found[j])
            } else {
                self.find(h)
            };
            let i = match hit {
                Some(i) => {
                    if i != self.tail {
                        self.unlink(i);
                        self.push_tail(i);
                    }
                    i
                }
                None => self.add(h),
            };
            if first.is_some() {
                chain.push(i);
            }
        }
        self.add_run(&hashes[private_from..]);
        // Remember the shared part's chain through its first node when it
        // was known before (a shared prefix) and is still held.
        if first.is_some() && chain.len() > 1 && self.holds(chain[0], h0) {
            let n0 = chain[0];
            let c = match self.free_chains.pop() {
                Some(c) => c,
                None => {
                    self.chains.push(Vec::new());
                    (self.chains.len() - 1) as u32
                }
            };
            self.chains[c as usize] = chain;
            self.nodes[n0 as usize].chain = c;
        }
        self.scratch = found;
    }

    /// The chain buffer remembered through node `n`, released for reuse
    /// (empty if none).
    fn take_chain_buffer(&mut self, n: u32) -> Vec<u32> {
        let c = std::mem::replace(&mut self.nodes[n as usize].chain, NO_NODE);
        if c == NO_NODE {
            return Vec::new();
        }
        self.free_chains.push(c);
        let mut v = std::mem::take(&mut self.chains[c as usize]);
        v.clear();
        v
    }

    /// A new most recent node for `h`, in the hash index, evicting the
    /// least recently used block when full.
    fn add(&mut self, h: u64) -> u32 {
        if self.len >= self.capacity {
            self.evict(self.len + 1 - self.capacity);
        }
        let i = self.block_node(h);
        self.len += 1;
        self.push_tail(i);
        i
    }

    /// A new most recent run of the private blocks `hashes` (none in any
    /// index: the caller guarantees it), then the least recently used
    /// blocks evicted down to capacity (this run's own first, last): the
    /// same blocks held, in the same order, as adding them one by one.
    fn add_run(&mut self, hashes: &[u64]) {
        if hashes.is_empty() {
            return;
        }
        debug_assert!(
            hashes.iter().all(|&h| self.find(h).is_none()),
            "private block already held"
        );
        let first = self.run_base + self.run_hashes.len() as u64;
        let run = PrivateRun {
            first,
            end: first + hashes.len() as u64,
        };
        self.run_hashes.extend(hashes);
        let r = match self.free_runs.pop() {
            Some(r) => {
                self.runs[r as usize] = run;
                r
            }
            None => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
        };
        let i = self.new_node(LruNode {
            hash: 0,
            prev: NO_NODE,
            next: NO_NODE,
            chain: r,
            live: true,
            run: true,
        });
        self.len += hashes.len();
        self.push_tail(i);
        if self.len > self.capacity {
            self.evict(self.len - self.capacity);
        }
    }

    /// A node for block `h` in a free place, in the hash index, not yet
    /// in the list.
    fn block_node(&mut self, h: u64) -> u32 {
        let i = self.new_node(LruNode {
            hash: h,
            prev: NO_NODE,
            next: NO_NODE,
            chain: NO_NODE,
            live: true,
            run: false,
        });
        self.map.insert(h, i);
        i
    }

    /// Node `node` in a free place.
    fn new_node(&mut self, node: LruNode) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Node `i`, out of the list, free again.
    fn release(&mut self, i: u32) {
        self.unlink(i);
        let n = &mut self.nodes[i as usize];
        n.live = false;
        n.run = false;
        n.chain = NO_NODE;
        self.free.push(i);
    }

    /// Evicts the `k` least recently used blocks (at most all).
    fn evict(&mut self, mut k: usize) {
        while k > 0 && self.head != NO_NODE {
            let i = self.head;
            let n = self.nodes[i as usize];
            if n.run {
                // The run's least recent blocks, together: the oldest
                // run's, at the front of the runs' hashes.
                let run = &mut self.runs[n.chain as usize];
                debug_assert_eq!(run.first, self.run_base, "the oldest run goes first");
                let take = (run.end - run.first).min(k as u64);
                run.first += take;
                self.run_hashes.drain(..take as usize);
                self.run_base += take;
                self.len -= take as usize;
                k -= take as usize;
                if run.first == run.end {
                    self.free_runs.push(n.chain);
                    self.release(i);
                }
                continue;
            }
            self.map.remove(n.hash, i);
            self.len -= 1;
            k -= 1;
            if n.chain != NO_NODE {
                self.chains[n.chain as usize].clear();
                self.free_chains.push(n.chain);
            }
            self.release(i);
        }
    }

    /// Puts every private block (the runs') into the hash index (see
    /// [`PrefixIndex::insert_private`]), as if all had been inserted with
    /// [`PrefixIndex::insert`].
    pub fn index_all_private(&mut self) {
        // (Every run held has a block, its hash in the runs' queue.)
        if self.run_hashes.is_empty() {
            return;
        }
        self.version = self.version.wrapping_add(1);
        // Each run's held blocks become nodes of their own in its place.
        for i in 0..self.nodes.len() as u32 {
            let n = self.nodes[i as usize];
            if !(n.live && n.run) {
                continue;
            }
            let run = self.runs[n.chain as usize];
            for p in run.first..run.end {
                let h = self.run_hashes[(p - self.run_base) as usize];
                let j = self.block_node(h);
                self.link_before(j, i);
            }
            self.free_runs.push(n.chain);
            self.release(i);
        }
        // (No run is left.)
        self.run_base += self.run_hashes.len() as u64;
        self.run_hashes.clear();
    }

    /// Links node `j` into the list just before node `i`.
    fn link_before(&mut self, j: u32, i: u32) {
        let p = self.nodes[i as usize].prev;
        let n = &mut self.nodes[j as usize];
        n.prev = p;
        n.next = i;
        self.nodes[i as usize].prev = j;
        if p == NO_NODE {
            self.head = j;
        } else {
            self.nodes[p as usize].next = j;
        }
    }

    fn unlink(&mut self, i: u32) {
        let LruNode { prev, next, .. } = self.nodes[i as usize];
        if prev == NO_NODE {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NO_NODE {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn push_tail(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        n.prev = self.tail;
        n.next = NO_NODE;
        if self.tail == NO_NODE {
            self.head = i;
        } else {
            self.nodes[self.tail as usize].next = i;
        }
        self.tail = i;
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_prefix_index_is_a_bounded_lru() {
        let mut ix = PrefixIndex::new(3);
        ix.insert(&[1, 2, 3]);
        ix.insert(&[1]);
        ix.insert(&[4]);
        assert_eq!(ix.len(), 3);
        assert_eq!(ix.matched(&[1]), 1);
        assert_eq!(ix.matched(&[2]), 0, "2 was the least recently used");
        for i in 0..10_000 {
            ix.insert(&[100 + i % 5]);
        }
        assert_eq!(ix.len(), 3);
    }

    /// A chain's later node evicted and reused for another hash while its
    /// first node stays: a query through the reused node is answered from
    /// what the node holds now, and so is one through the chain's old
    /// content afterwards.
    #[test]
    fn a_reused_node_of_a_remembered_chain_answers_what_it_holds() {
        let mut ix = PrefixIndex::new(4);
        ix.insert(&[1, 2, 3]);
        ix.insert(&[1, 2, 3]); // remembered through 1's node
        ix.insert(&[1]); // 1 now more recent than 2 and 3
        ix.insert(&[7]);
        ix.insert(&[8]); // evicts 2; its node now holds 8
        assert_eq!(ix.matched(&[1, 8]), 2);
        assert_eq!(ix.matched(&[1, 2]), 1, "2 is no longer held");
        assert_eq!(ix.matched(&[1, 8]), 2);
    }

    /// The plain definition: a recency list, all of a chain touched in
    /// order, then the least recent dropped down to capacity.
    struct Model {
        capacity: usize,
        order: Vec<u64>,
    }

    impl Model {
        fn insert(&mut self, hashes: &[u64]) {
            for h in hashes {
                self.order.retain(|x| x != h);
                self.order.push(*h);
            }
            let over = self.order.len().saturating_sub(self.capacity);
            self.order.drain(..over);
        }

        fn matched(&self, hashes: &[u64]) -> usize {
            hashes.iter().take_while(|h| self.order.contains(h)).count()
        }
    }

    proptest! {
        /// Chains of a few tenants' shared prefixes, shared bodies and
        /// private bodies of their own, some longer than the capacity:
        /// every answer and the final recency order agree with the plain
        /// definition, with private nodes indexed now and then.
        #[test]
        fn agrees_with_the_plain_lru(
            capacity in 1usize..40,
            reqs in prop::collection::vec(
                (0u64..4, 0usize..30, 0u64..6, 0usize..8, 0usize..6, 0u8..10),
                1..80,
            ),
        ) {
            let mut ix = PrefixIndex::new(capacity);
            let mut model = Model { capacity, order: Vec::new() };
            let mut earlier: Vec<Vec<u64>> = Vec::new();
            for (n, (tenant, prefix, body, body_len, own_len, flush)) in reqs.into_iter().enumerate() {
                let mut chain: Vec<u64> = (0..prefix as u64).map(|j| tenant * 1000 + j).collect();
                chain.extend((0..body_len as u64).map(|j| 1_000_000 + body * 100 + j));
                let private_from = chain.len();
                chain.extend((0..own_len as u64).map(|j| 2_000_000 + n as u64 * 100 + j));
                prop_assert_eq!(ix.matched(&chain), model.matched(&chain));
                // Earlier prompts' shared parts again, some cut short.
                for old in earlier.iter().rev().take(3) {
                    let old: &Vec<u64> = old;
                    prop_assert_eq!(ix.matched(old), model.matched(old));
                    let half = &old[..old.len() / 2];
                    prop_assert_eq!(ix.matched(half), model.matched(half));
                }
                ix.insert_private(&chain, private_from);
                earlier.push(chain[..private_from].to_vec());
                model.insert(&chain);
                prop_assert_eq!(ix.len(), model.order.len());
                // The runs keep the hashes of the blocks held, no more.
                prop_assert!(ix.run_hashes.len() <= ix.len());
                if flush == 0 {
                    ix.index_all_private();
                }
            }
            // The recency order, least recent first (a run's blocks in
            // its place), before and after every private block is indexed.
            let order = |ix: &PrefixIndex| {
                let mut order = Vec::new();
                let mut i = ix.head;
                while i != NO_NODE {
                    let n = &ix.nodes[i as usize];
                    if n.run {
                        let r = ix.runs[n.chain as usize];
                        let at = |p: u64| (p - ix.run_base) as usize;
                        order.extend(ix.run_hashes.range(at(r.first)..at(r.end)));
                    } else {
                        order.push(n.hash);
                    }
                    i = n.next;
                }
                order
            };
            prop_assert_eq!(&order(&ix), &model.order);
            // Private blocks are found once indexed.
            ix.index_all_private();
            prop_assert_eq!(&order(&ix), &model.order);
            prop_assert_eq!(ix.len(), model.order.len());
            for h in &model.order {
                prop_assert_eq!(ix.matched(&[*h]), 1);
            }
        }
    }
}
