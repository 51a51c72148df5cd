//! Where the cache keeps its blocks: a fixed slab of nodes, each on three structures that make
//! every question the policy asks cost a few loads, never a scan of the whole cache and never a
//! move of an array: size bins (which blocks could serve a request), the free order (which block
//! is oldest), and an address index (which block ends where a freed one starts, or starts where it
//! ends). Pure data structure, no policy; all zero bytes is the empty store (Note [Zero is empty]).
//
// Note [Size bins]
// A block's length in pages picks its bin: one bin per length below 8 pages, then 8 bins per
// power of two (lengths within an eighth of each other share a bin), as TLSF has them. A bitmap
// says which bins hold a block, so the first bin at or past a length is found in a few words.
// Hot blocks go to the front of their bin and released ones to the back: a walk from the front
// meets a hot block of a length before a released one (Note [Hot stays hot] in host/cache/release.rs).
// Blocks being released are in no bin: they serve nothing until the madvise returns.
//
// Note [Zero is empty]
// Node 0 is never used, so a link of 0 is "none"; a node whose length is 0 is free; an index word
// of 0 is an empty slot. So `Store::new` is all zero bytes, and a store nobody touched costs no
// resident page.

use super::{BlockState, CachedBlock};

/// The most blocks one cache holds (`TENSORMALLOC_CACHE_BLOCKS` ceiling).
pub const CAPACITY: usize = crate::config::MAX_CACHE_BLOCKS;
const PAGE_SHIFT: u32 = 12;
/// Bins: 8 exact ones, then 8 per power of two of pages up to 2^47 bytes.
const SUB_BITS: u32 = 3;
const BINS: usize = 8 + (47 - PAGE_SHIFT as usize - SUB_BITS as usize + 1) * 8;
const BITMAP_WORDS: usize = BINS.div_ceil(64);
/// Index slots: twice the keys (two per block), a power of two.
const INDEX_SLOTS: usize = (4 * CAPACITY).next_power_of_two();
/// The index's node field: 16 bits (nodes 1..=CAPACITY), then the key's kind.
const NODE_BITS: u32 = 16;
const END_KEY: u64 = 1 << NODE_BITS;
const _: () = assert!(CAPACITY < (1 << NODE_BITS));

pub type NodeId = u32;
pub const NONE: NodeId = 0;

#[derive(Clone, Copy, Debug)]
pub struct Node {
    pub block: CachedBlock,
    bin: u16,
    bin_prev: NodeId,
    bin_next: NodeId,
    /// The free order: the front was freed longest ago.
    older: NodeId,
    newer: NodeId,
}

impl Node {
    const EMPTY: Node = Node { block: CachedBlock::EMPTY, bin: 0, bin_prev: NONE, bin_next: NONE, older: NONE, newer: NONE };
}

pub struct Store {
    nodes: [Node; CAPACITY + 1],
    /// Nodes 1..=used have been handed out at least once; freed ones are on `free_list`.
    used: NodeId,
    free_list: NodeId,
    count: usize,
    bin_front: [NodeId; BINS],
    bin_back: [NodeId; BINS],
    bitmap: [u64; BITMAP_WORDS],
    oldest: NodeId,
    newest: NodeId,
    /// Open addressing, linear probing: (addr >> PAGE_SHIFT) << 17 | END_KEY? | node.
    index: [u64; INDEX_SLOTS],
    /// The bytes of the blocks in state Released (Note [Hot within the memory]).
    released_bytes: usize,
}

/// What a block adds to `Store::released_bytes`.
fn released_len(block: &CachedBlock) -> usize {
    if block.state == BlockState::Released { block.len } else { 0 }
}

/// The bin of a block of `len` bytes (Note [Size bins]).
pub fn bin_of(len: usize) -> usize {
    let pages = (len >> PAGE_SHIFT).max(1);
    if pages < 8 {
        return pages;
    }
    let octave = usize::BITS - 1 - pages.leading_zeros(); // >= 3
    let sub = (pages >> (octave - SUB_BITS)) & 7;
    (8 + (octave - SUB_BITS) as usize * 8 + sub).min(BINS - 1)
}

impl Store {
    pub const fn new() -> Self {
        Store {
            nodes: [Node::EMPTY; CAPACITY + 1],
            used: NONE,
            free_list: NONE,
            count: 0,
            bin_front: [NONE; BINS],
            bin_back: [NONE; BINS],
            bitmap: [0; BITMAP_WORDS],
            oldest: NONE,
            newest: NONE,
            index: [0; INDEX_SLOTS],
            released_bytes: 0,
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    #[inline]
    pub fn get(&self, id: NodeId) -> &CachedBlock {
        // Ids come from this store: in range by construction; node 0 is a harmless empty one.
        &self.node(id).block
    }

    /// The node `id`; ids come from this store, and one out of range reads node 0 (unused).
    #[inline]
    fn node(&self, id: NodeId) -> &Node {
        // SAFETY: the index is at most CAPACITY, and there are CAPACITY + 1 nodes.
        unsafe { self.nodes.get_unchecked((id as usize).min(CAPACITY)) }
    }

    #[inline]
    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        // SAFETY: as in node().
        unsafe { self.nodes.get_unchecked_mut((id as usize).min(CAPACITY)) }
    }

    /// Every block with its id, in node order.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &CachedBlock)> {
        self.nodes.iter().enumerate().take(self.used as usize + 1).skip(1).filter(|(_, n)| n.block.len != 0).map(|(i, n)| (i as NodeId, &n.block))
    }

    /// Adds a block: indexed by address, newest in the free order, and in its bin unless it is
    /// being released. `None` when the store is full.
    pub fn add(&mut self, block: CachedBlock) -> Option<NodeId> {
        let id = if self.free_list != NONE {
            let id = self.free_list;
            self.free_list = self.node(id).bin_next;
            id
        } else if (self.used as usize) < CAPACITY {
            self.used += 1;
            self.used
        } else {
            return None;
        };
        *self.node_mut(id) = Node { block, ..Node::EMPTY };
        self.count += 1;
        self.released_bytes += released_len(&block);
        self.index_put(block.addr, false, id);
        self.index_put(block.addr + block.len, true, id);
        self.push_newest(id);
        if block.state != BlockState::Releasing {
            self.bin_link(id);
        }
        Some(id)
    }

    /// Removes a block from every structure and frees its node; returns it.
    pub fn remove(&mut self, id: NodeId) -> CachedBlock {
        let block = self.node(id).block;
        if block.state != BlockState::Releasing {
            self.bin_unlink(id);
        }
        self.unlink_order(id);
        self.index_del(block.addr, false);
        self.index_del(block.addr + block.len, true);
        let free_list = self.free_list;
        *self.node_mut(id) = Node { bin_next: free_list, ..Node::EMPTY };
        self.free_list = id;
        self.count -= 1;
        self.released_bytes -= released_len(&block);
        block
    }

    /// Moves a block's start to `addr` and its length to `len`, keeping its end, its place in the
    /// free order and everything else (the rest of a block a request took the front of).
    pub fn cut_front(&mut self, id: NodeId, addr: usize, len: usize) {
        let old = self.node(id).block;
        let in_bin = old.state != BlockState::Releasing;
        if in_bin {
            self.bin_unlink(id);
        }
        self.index_del(old.addr, false);
        self.released_bytes = self.released_bytes - released_len(&old) + released_len(&CachedBlock { len, ..old });
        let n = self.node_mut(id);
        n.block.addr = addr;
        n.block.len = len;
        self.index_put(addr, false, id);
        if in_bin {
            self.bin_link(id);
        }
    }

    /// Changes a block's state, moving it in or out of the bins: a released block goes to the
    /// back of its bin, a hot one to the front, a releasing one out.
    pub fn set_state(&mut self, id: NodeId, state: BlockState) {
        let block = self.node(id).block;
        let old = block.state;
        if old != BlockState::Releasing {
            self.bin_unlink(id);
        }
        self.released_bytes = self.released_bytes - released_len(&block) + released_len(&CachedBlock { state, ..block });
        self.node_mut(id).block.state = state;
        if state != BlockState::Releasing {
            self.bin_link(id);
        }
    }

    /// The bytes of the blocks in state Released.
    pub fn released_bytes(&self) -> usize {
        self.released_bytes
    }

    /// Its facts and its doom (not its place, length or state, which the structures follow).
    pub fn block_mut(&mut self, id: NodeId) -> &mut CachedBlock {
        &mut self.node_mut(id).block
    }

    /// The block that starts at `addr`.
    pub fn starting_at(&self, addr: usize) -> Option<NodeId> {
        self.index_get(addr, false)
    }

    /// The block that ends at `addr`.
    pub fn ending_at(&self, addr: usize) -> Option<NodeId> {
        self.index_get(addr, true)
    }

    /// When the block freed last was freed (0 when empty).
    pub fn newest_idle_since_ns(&self) -> u64 {
        if self.newest == NONE {
            0
        } else {
            self.get(self.newest).idle_since_ns
        }
    }

    /// The block freed longest ago (NONE when empty).
    pub fn oldest(&self) -> NodeId {
        self.oldest
    }

    /// The block freed next after `id` (NONE for the newest).
    pub fn newer(&self, id: NodeId) -> NodeId {
        self.node(id).newer
    }

    /// The free order, oldest first.
    pub fn oldest_first(&self) -> Chain<'_, false> {
        Chain { store: self, at: self.oldest }
    }

    /// The blocks of the first non-empty bin at or past `bin`, front to back, with the bin;
    /// `None` past the last.
    pub fn next_bin(&self, bin: usize) -> Option<(usize, Chain<'_, true>)> {
        let mut word = bin / 64;
        let mut bits = *self.bitmap.get(word)? & (!0u64 << (bin % 64));
        loop {
            if bits != 0 {
                let b = word * 64 + bits.trailing_zeros() as usize;
                let front = *self.bin_front.get(b)?;
                return Some((b, Chain { store: self, at: front }));
            }
            word += 1;
            bits = *self.bitmap.get(word)?;
        }
    }

    fn push_newest(&mut self, id: NodeId) {
        let newest = self.newest;
        {
            let n = self.node_mut(id);
            n.older = newest;
            n.newer = NONE;
        }
        if newest != NONE {
            self.node_mut(newest).newer = id;
        } else {
            self.oldest = id;
        }
        self.newest = id;
    }

    fn unlink_order(&mut self, id: NodeId) {
        let (older, newer) = (self.node(id).older, self.node(id).newer);
        if older != NONE {
            self.node_mut(older).newer = newer;
        } else {
            self.oldest = newer;
        }
        if newer != NONE {
            self.node_mut(newer).older = older;
        } else {
            self.newest = older;
        }
    }

    /// Puts the block in its bin: hot ones at the front, released ones at the back.
    fn bin_link(&mut self, id: NodeId) {
        let block = self.node(id).block;
        let bin = bin_of(block.len);
        let (front, back) = (self.bin_front.get(bin).copied().unwrap_or(NONE), self.bin_back.get(bin).copied().unwrap_or(NONE));
        let hot = block.state == BlockState::Hot;
        {
            let n = self.node_mut(id);
            n.bin = bin as u16;
            (n.bin_prev, n.bin_next) = if hot { (NONE, front) } else { (back, NONE) };
        }
        if hot {
            if front != NONE {
                self.node_mut(front).bin_prev = id;
            }
            self.set_bin_ends(bin, Some(id), (back == NONE).then_some(id));
        } else {
            if back != NONE {
                self.node_mut(back).bin_next = id;
            }
            self.set_bin_ends(bin, (front == NONE).then_some(id), Some(id));
        }
        if let Some(w) = self.bitmap.get_mut(bin / 64) {
            *w |= 1 << (bin % 64);
        }
    }

    fn bin_unlink(&mut self, id: NodeId) {
        let n = *self.node(id);
        let bin = n.bin as usize;
        if n.bin_prev != NONE {
            self.node_mut(n.bin_prev).bin_next = n.bin_next;
        } else if let Some(f) = self.bin_front.get_mut(bin) {
            *f = n.bin_next;
        }
        if n.bin_next != NONE {
            self.node_mut(n.bin_next).bin_prev = n.bin_prev;
        } else if let Some(b) = self.bin_back.get_mut(bin) {
            *b = n.bin_prev;
        }
        if self.bin_front.get(bin) == Some(&NONE) {
            if let Some(w) = self.bitmap.get_mut(bin / 64) {
                *w &= !(1 << (bin % 64));
            }
        }
        let m = self.node_mut(id);
        (m.bin_prev, m.bin_next) = (NONE, NONE);
    }

    fn set_bin_ends(&mut self, bin: usize, front: Option<NodeId>, back: Option<NodeId>) {
        if let (Some(f), Some(slot)) = (front, self.bin_front.get_mut(bin)) {
            *slot = f;
        }
        if let (Some(b), Some(slot)) = (back, self.bin_back.get_mut(bin)) {
            *slot = b;
        }
    }

    fn index_key(addr: usize, end: bool) -> u64 {
        ((addr as u64 >> PAGE_SHIFT) << (NODE_BITS + 1)) | if end { END_KEY } else { 0 }
    }

    fn index_home(key: u64) -> usize {
        // Fibonacci hashing: block addresses share their low bits.
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - INDEX_SLOTS.trailing_zeros())) as usize
    }

    fn index_get(&self, addr: usize, end: bool) -> Option<NodeId> {
        let key = Self::index_key(addr, end);
        let mut i = Self::index_home(key);
        // Bounded, though an empty slot always ends the probe (at most half the slots hold keys).
        for _ in 0..INDEX_SLOTS {
            let word = *self.index.get(i)?;
            if word == 0 {
                return None;
            }
            if word & !((1 << NODE_BITS) - 1) == key {
                return Some((word & ((1 << NODE_BITS) - 1)) as NodeId);
            }
            i = (i + 1) & (INDEX_SLOTS - 1);
        }
        None
    }

    fn index_put(&mut self, addr: usize, end: bool, id: NodeId) {
        let key = Self::index_key(addr, end);
        let mut i = Self::index_home(key);
        // At most 2 * CAPACITY keys in 4 * CAPACITY slots: an empty slot is always found.
        for _ in 0..INDEX_SLOTS {
            let Some(slot) = self.index.get_mut(i) else { return };
            if *slot == 0 || *slot & !((1 << NODE_BITS) - 1) == key {
                *slot = key | id as u64;
                return;
            }
            i = (i + 1) & (INDEX_SLOTS - 1);
        }
    }

    /// Deletes a key, shifting back the keys after it that probed past it (no tombstones).
    fn index_del(&mut self, addr: usize, end: bool) {
        let key = Self::index_key(addr, end);
        let mask = INDEX_SLOTS - 1;
        let mut i = Self::index_home(key);
        let mut probes = 0;
        loop {
            match self.index.get(i) {
                Some(&0) | None => return,
                Some(&w) if w & !((1 << NODE_BITS) - 1) == key => break,
                _ if probes == INDEX_SLOTS => return,
                _ => i = (i + 1) & mask,
            }
            probes += 1;
        }
        let mut hole = i;
        let mut j = i;
        for _ in 0..INDEX_SLOTS {
            j = (j + 1) & mask;
            let w = self.index.get(j).copied().unwrap_or(0);
            if w == 0 {
                break;
            }
            let home = Self::index_home(w & !((1 << NODE_BITS) - 1));
            // Move w into the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j { hole < home && home <= j } else { hole < home || home <= j };
            if !stays {
                if let Some(h) = self.index.get_mut(hole) {
                    *h = w;
                }
                hole = j;
            }
        }
        if let Some(h) = self.index.get_mut(hole) {
            *h = 0;
        }
    }

    /// Checks that every structure agrees with the nodes; tests call it after every step.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), &'static str> {
        if self.iter().map(|(_, b)| released_len(b)).sum::<usize>() != self.released_bytes {
            return Err("released_bytes disagrees with the blocks");
        }
        let live: Vec<NodeId> = self.iter().map(|(id, _)| id).collect();
        if live.len() != self.count {
            return Err("count disagrees with the nodes");
        }
        // The free order holds every node once, oldest first.
        let order: Vec<NodeId> = self.oldest_first().map(|(id, _)| id).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        if sorted != live {
            return Err("the free order does not hold every block once");
        }
        if order.windows(2).any(|w| self.get(w[0]).idle_since_ns > self.get(w[1]).idle_since_ns) {
            return Err("the free order is not oldest first");
        }
        // Bins: every available block once, in its bin, hot before released; bitmap agrees.
        let mut binned = 0;
        for bin in 0..BINS {
            let mut at = self.bin_front[bin];
            let mut prev = NONE;
            let mut seen_released = false;
            while at != NONE {
                let n = self.node(at);
                if n.bin as usize != bin || bin_of(n.block.len) != bin || n.bin_prev != prev {
                    return Err("a block is in the wrong bin or its links are broken");
                }
                match n.block.state {
                    BlockState::Releasing => return Err("a releasing block is in a bin"),
                    BlockState::Released => seen_released = true,
                    BlockState::Hot if seen_released => return Err("a hot block behind a released one"),
                    BlockState::Hot => {}
                }
                binned += 1;
                prev = at;
                at = n.bin_next;
            }
            if self.bin_back[bin] != prev {
                return Err("a bin's back is not its last block");
            }
            if (self.bitmap[bin / 64] >> (bin % 64) & 1 == 1) != (self.bin_front[bin] != NONE) {
                return Err("the bitmap disagrees with the bins");
            }
        }
        if binned != self.iter().filter(|(_, b)| b.state != BlockState::Releasing).count() {
            return Err("an available block is in no bin");
        }
        // The index: two keys per block, each finding it.
        if self.index.iter().filter(|&&w| w != 0).count() != 2 * self.count {
            return Err("the index holds keys of no block");
        }
        for (id, b) in self.iter() {
            if self.starting_at(b.addr) != Some(id) || self.ending_at(b.addr + b.len) != Some(id) {
                return Err("the index does not find a block");
            }
        }
        Ok(())
    }
}

/// The blocks along one chain of links, each with its id: a bin's (`IN_BIN`) or the free
/// order's (a constant, so the scan of a bin makes no indirect call).
pub struct Chain<'a, const IN_BIN: bool> {
    store: &'a Store,
    at: NodeId,
}

impl<'a, const IN_BIN: bool> Iterator for Chain<'a, IN_BIN> {
    type Item = (NodeId, &'a CachedBlock);
    fn next(&mut self) -> Option<Self::Item> {
        if self.at == NONE {
            return None;
        }
        let id = self.at;
        let n = self.store.node(id);
        self.at = if IN_BIN { n.bin_next } else { n.newer };
        Some((id, &n.block))
    }
}
