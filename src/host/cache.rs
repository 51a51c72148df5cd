//! The large-block cache policy: which freed blocks are kept, which one serves a request, which
//! are known to read zero, how big the cache may grow (Note [Bounds follow the working set]),
//! when idle blocks are released (MADV_FREE) and expired (unmapped), and which unmaps wait for
//! the background thread. Pure: no system calls, the time comes in as an argument, outcomes come
//! back as fixed-size lists of ranges for the caller to act on outside its lock. The blocks live
//! in `store` (size bins, free order, address index: Note [Size bins]), so a request or a free
//! costs a few loads whatever the number of blocks cached.
//! This file holds the cache's state, a request (`take`) and a free (`insert`: merge, evict,
//! park) under the bounds; beside it: `facts` (what is known of a block's pages), `gather` (the
//! parts of a miss), `release` (idle release and expiry, emptying, the deferred unmaps, a fork).
//
// Note [Bounds follow the working set]
// A fixed bound (once 16 blocks, 1 GiB) is too small for 16 threads each with 80 MB temporaries:
// blocks were evicted, unmapped and faulted in again. Without a bound set by the user, the cache
// may hold as many blocks and bytes as were live at the recent peak (the highest point over the
// last one to two windows, seen at each free, since live bytes peak just before a free), never
// less than the floor (the old fixed bound) and never more than the ceiling (a quarter of the
// physical memory or of the cgroup's limit, whichever is smaller, read once at init). Idle
// release (MADV_FREE, then unmapping) is what keeps a large bound honest. A bound the user set
// is exact, as before.
//
// Note [Neighbours merge]
// A freed block merges with the cached blocks just before and after it (a block split earlier,
// or a mapping the kernel placed next to another), and a request takes what it needs from a
// bigger block, a rest past the allowed waste staying cached. So the cache works as a page
// heap: the pages of several freed blocks serve one bigger request with no system call and no
// fault. How much waste a block may carry out (`TENSORMALLOC_MAX_WASTE`, auto) follows how many
// large blocks are live: with few (at most the block floor, 16, at the recent peak), up to 50%:
// the cache has room, and a rest split off would mostly wait to be gathered back into a bigger
// request, a system call each; with many (16 threads each keeping 4), 10%: pages held unused
// inside live blocks are pages the other threads' requests fault in (c-large-churn at 16
// threads: 10% faults in 7% less than 50%, as little as tcmalloc; at 1 and 2 threads 50% is
// 5-10% faster than 10%; BENCHMARKS.md "Issue 13, second session"). A merged block may span
// several kernel mappings; kernels before 6.17 will not mremap those whole, so growing one
// falls back (copy, or Note [Gathering pages] halving it), as for a block the program madvised
// in part. The merged block counts as freed now (hot); it reads zero only if every part did.
// Rests shorter than any request stay cached too: alone they serve nothing, but they merge
// back or are gathered; unmapping them made their pages fault in again.
//
// Note [The block freed last]
// A loop that frees a block and asks for one of the same size again (a scratch buffer, numpy's
// temporaries) is the commonest use of the cache. The block freed last is therefore kept apart
// ("parked") when it has no cached neighbour to merge with and fits the bounds as they are:
// a request of exactly its length (hot, so no other block serves it better) takes it back with
// no bin, free order or index touched. Any other insert, request of another size or question
// about the whole cache puts it in the store first, as if it had gone there when freed.
// A parked block without huge-page advice is not taken back so by code whose own advised blocks
// the store may hold: those come first (Note [Huge-page advice] in host/host_layer/mod.rs).

use crate::ranges::Range;
use super::tally::Tally;
use crate::record::HostBook;
use store::{bin_of, NodeId, Store};

mod facts;
mod gather;
mod release;
mod store;

pub use facts::{drop_unwritten, votes_after, votes_after_write, writers_after, zero_by_discard, PageFacts, DENSE_VOTES, MIXED_ADVICE, MOST_VOTES, WRITERS_ONE};
pub use release::HOT_GRACE_NS;
pub use gather::{Part, Parts, MAX_PARTS};
pub use release::Due;
pub use store::CAPACITY;

/// Unmaps waiting for the background thread (Note [Deferred unmaps]).
pub const MAX_DEFERRED: usize = 32;
/// The length of one window over which the live peak is taken (Note [Bounds follow the working set]).
pub const PEAK_WINDOW_NS: u64 = 10_000_000_000;
/// The most blocks one insert evicts; a block that would need more is refused.
pub const MAX_EVICTED: usize = 128;
/// The most blocks of one bin a request looks at (Note [Size bins] in host/cache/store.rs): past
/// it, a fit further back is missed and a longer block serves, or a fresh mapping.
const SCAN_LIMIT: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockState {
    /// Freed recently; contents and pages intact.
    Hot = 0,
    /// Handed to the caller for MADV_FREE; not available until `release_done`.
    Releasing,
    /// MADV_FREE'd: the kernel may have taken the pages (they read back as zero).
    Released,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedBlock {
    pub addr: usize,
    pub len: usize,
    pub idle_since_ns: u64,
    pub state: BlockState,
    /// Trimmed while Releasing: unmap it once the release returns.
    doomed: bool,
    pub facts: PageFacts,
}

impl CachedBlock {
    const EMPTY: CachedBlock = CachedBlock { addr: 0, len: 0, idle_since_ns: 0, state: BlockState::Hot, doomed: false, facts: PageFacts::DIRTY };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// The most blocks: exact when `follow_blocks` is false, else the ceiling of a bound that
    /// follows the live peak from `min_blocks` up.
    pub max_blocks: usize,
    /// The most bytes: exact when `follow_bytes` is false, else the ceiling of a bound that
    /// follows the live peak from `min_bytes` up.
    pub max_bytes: usize,
    pub follow_blocks: bool,
    pub follow_bytes: bool,
    pub min_blocks: usize,
    pub min_bytes: usize,
    pub release_after_ns: u64,
    pub expire_after_ns: u64,
    /// None: WASTE_FEW_LIVE or WASTE_MANY_LIVE (Note [Neighbours merge]).
    pub max_waste_percent: Option<usize>,
    /// The most bytes kept hot (resident, not yet released): past them the oldest hot blocks
    /// are released at once, idle or not (Note [Hot within the memory] in cache/release.rs).
    pub max_hot_bytes: usize,
}

/// The waste a request may leave in a block, in percent, when at most `min_blocks` large blocks
/// were live at the recent peak, and when more were (Note [Neighbours merge]).
pub const WASTE_FEW_LIVE: usize = 50;
pub const WASTE_MANY_LIVE: usize = 10;

/// A block handed out by `take`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub addr: usize,
    pub len: usize,
    /// It had been MADV_FREE'd (contents unspecified, pages may fault back in).
    pub was_released: bool,
    /// What is known of its pages (`facts.zero`: calloc needs no memset, Note [Known zero]).
    pub facts: PageFacts,
    /// A tail cut off and kept in the cache: the caller records it as cached.
    pub tail_kept: Option<Range>,
}

#[derive(Clone, Copy, Debug)]
pub struct Inserted {
    pub accepted: bool,
    /// The freed block with the cached neighbours it merged with (Note [Neighbours merge]):
    /// cached when accepted, else for the caller to unmap whole.
    pub block: Range,
    /// The starts of the neighbours merged into `block`: their records go.
    pub absorbed: [Option<usize>; 2],
    /// How many older blocks were pushed out to make room: `BlockCache::evicted` lists them
    /// for the caller to unmap.
    pub evicted: usize,
}

/// Live large memory when a block is freed (before the free): what the bounds follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub bytes: usize,
    pub blocks: usize,
}

/// The highest live point seen in one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Peak {
    since_ns: u64,
    live: Live,
}

pub struct BlockCache {
    store: Store,
    /// The block freed last, kept out of the store while nothing else happens (Note [The
    /// block freed last]); its length is 0 when there is none. Counted in `cached_bytes`.
    parked: CachedBlock,
    limits: CacheLimits,
    cached_bytes: usize,
    /// The peaks of this window and the one before.
    peaks: [Peak; 2],
    deferred: [Range; MAX_DEFERRED],
    deferred_count: usize,
    deferred_bytes: usize,
    /// The blocks the last insert evicted (its `evicted` first ones).
    evicted: [Range; MAX_EVICTED],
    /// The host layer's figures that change on every call, counted under this cache's lock
    /// (Note [Figures under the lock] in host/tally.rs).
    pub tally: Tally,
    /// Host blocks' holder rows and history, written under this cache's lock (Note [Host
    /// records under the cache lock] in record/mod.rs).
    pub book: HostBook,
}

impl BlockCache {
    pub const fn new(limits: CacheLimits) -> Self {
        const NO_PEAK: Peak = Peak { since_ns: 0, live: Live { bytes: 0, blocks: 0 } };
        BlockCache {
            store: Store::new(),
            parked: CachedBlock::EMPTY,
            limits,
            cached_bytes: 0,
            peaks: [NO_PEAK; 2],
            deferred: [Range { addr: 0, len: 0 }; MAX_DEFERRED],
            deferred_count: 0,
            deferred_bytes: 0,
            evicted: [Range { addr: 0, len: 0 }; MAX_EVICTED],
            tally: Tally::new(),
            // SAFETY: a cache is kept under its layer's lock, and the process has one host layer.
            book: unsafe { HostBook::new() },
        }
    }

    pub fn set_limits(&mut self, limits: CacheLimits) {
        self.limits = CacheLimits { max_blocks: limits.max_blocks.min(CAPACITY), ..limits };
    }

    pub fn limits(&self) -> &CacheLimits {
        &self.limits
    }

    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// The bytes of the blocks not released (hot, or being released): what the kernel cannot
    /// take back without a swap device.
    pub fn hot_bytes(&self) -> usize {
        self.cached_bytes - self.store.released_bytes()
    }

    /// Whether more is hot than the limits allow: the background pass has work now.
    pub fn over_hot_bound(&self) -> bool {
        self.hot_bytes() > self.limits.max_hot_bytes
    }

    pub fn block_count(&self) -> usize {
        self.store.count() + usize::from(self.parked.len != 0)
    }

    pub fn blocks(&self) -> impl Iterator<Item = &CachedBlock> {
        self.store.iter().map(|(_, b)| b).chain(core::iter::once(&self.parked).filter(|b| b.len != 0))
    }

    /// Puts the parked block in the store, where every question can find it (Note [The block
    /// freed last]). It was counted when parked, and nothing was freed since: it goes in newest,
    /// with no merge and no eviction.
    fn unpark(&mut self) {
        if self.parked.len != 0 {
            let _ = self.store.add(self.parked);
            self.parked = CachedBlock::EMPTY;
        }
    }

    /// The blocks the last `insert` evicted, for the caller to unmap.
    pub fn evicted(&self, inserted: &Inserted) -> &[Range] {
        self.evicted.get(..inserted.evicted).unwrap_or(&[])
    }

    /// Best fit among available blocks of at least `need` bytes whose start honours `align`,
    /// for code whose holder tag is `asker`: only blocks that fit it (`PageFacts::fits`).
    /// Note [Size bins]: the first bin with a fit holds the best one; in it, the asker's own
    /// huge-page advice first (blocks without any stay for other code), then less waste, then
    /// hot before released. A rest of more than `waste_percent` of the block is split off and
    /// stays cached (Note [Neighbours merge]); a shorter one goes out with the block.
    pub fn take(&mut self, need: usize, align: usize, asker: u32) -> Option<Taken> {
        self.take_splitting(need, align, asker, false)
    }

    /// `take` for a calloc: a rest that may hold data is split off whatever its length, since
    /// carried out it would be zeroed, its pages dropped and faulted in again by the next
    /// request that reaches them (Note [calloc costs what is touched]).
    pub fn take_zeroed(&mut self, need: usize, align: usize, asker: u32) -> Option<Taken> {
        self.take_splitting(need, align, asker, true)
    }

    fn take_splitting(&mut self, need: usize, align: usize, asker: u32, split_dirty: bool) -> Option<Taken> {
        let align_mask = align.max(1) - 1;
        let p = self.parked;
        // An exact fit, and hot: nothing in the store serves better, unless it carries no
        // advice and the store may hold a block of the asker's own (Note [The block freed last]).
        if p.len == need && p.addr & align_mask == 0 && p.facts.fits(asker) && (p.facts.rank(asker) == 0 || self.store.count() == 0) {
            self.parked = CachedBlock::EMPTY;
            self.cached_bytes -= p.len;
            return Some(Taken { addr: p.addr, len: p.len, was_released: false, facts: p.facts, tail_kept: None });
        }
        if p.len >= need {
            self.unpark();
        }
        let mut best: Option<(NodeId, u8, usize, bool)> = None; // (node, rank, waste, released)
        let mut bin = bin_of(need);
        while let Some((found, blocks)) = self.store.next_bin(bin) {
            for (id, b) in blocks.take(SCAN_LIMIT) {
                if b.len < need || b.addr & align_mask != 0 || !b.facts.fits(asker) {
                    continue;
                }
                let waste = b.len - need;
                let released = b.state == BlockState::Released;
                let rank = b.facts.rank(asker);
                // Prefer the better rank, then less waste; on a tie prefer a hot block (Note
                // [Hot stays hot]).
                if best.is_none_or(|(_, k, w, r)| rank < k || (rank == k && (waste < w || (waste == w && r && !released)))) {
                    best = Some((id, rank, waste, released));
                    if rank == 0 && waste == 0 && !released {
                        break;
                    }
                }
            }
            if best.is_some() {
                break;
            }
            bin = found + 1;
        }
        let (id, _, waste, was_released) = best?;
        let block = *self.store.get(id);
        let mut taken = Taken { addr: block.addr, len: block.len, was_released, facts: block.facts, tail_kept: None };
        if waste > 0 && (split_dirty && !block.facts.zero || waste > block.len / 100 * self.waste_percent()) {
            let tail = Range { addr: block.addr + need, len: waste };
            self.store.cut_front(id, tail.addr, tail.len);
            self.cached_bytes -= need;
            taken.len = need;
            taken.tail_kept = Some(tail);
        } else {
            self.store.remove(id);
            self.cached_bytes -= block.len;
        }
        Some(taken)
    }

    /// The first `want` bytes of the available cached block that starts at `addr`, with the
    /// huge-page advice `advised_by` (a live block ending there grows over them: Note [Growing
    /// over the cache] in host/host_layer/resize.rs); a rest stays cached.
    pub fn take_following(&mut self, addr: usize, want: usize, advised_by: u32) -> Option<Taken> {
        if self.parked.addr == addr {
            self.unpark();
        }
        let id = self.store.starting_at(addr)?;
        let b = *self.store.get(id);
        if b.state == BlockState::Releasing || b.len < want || b.facts.advised_by != advised_by {
            return None;
        }
        let mut taken = Taken { addr, len: want, was_released: b.state == BlockState::Released, facts: b.facts, tail_kept: None };
        if b.len > want {
            let rest = Range { addr: addr + want, len: b.len - want };
            self.store.cut_front(id, rest.addr, rest.len);
            taken.tail_kept = Some(rest);
        } else {
            self.store.remove(id);
        }
        self.cached_bytes -= want;
        Some(taken)
    }

    /// Offers a freed block (`facts`: what is known of its pages); `live` is the live large
    /// memory before this free. It merges with cached blocks on either side (Note
    /// [Neighbours merge]); older blocks are evicted (least recently freed first) to respect
    /// the bounds; a block larger than the byte bound, or one that would need more than
    /// MAX_EVICTED blocks out, is refused.
    pub fn insert(&mut self, addr: usize, len: usize, facts: PageFacts, now_ns: u64, live: Live) -> Inserted {
        // The free order is oldest first: a block freed earlier than one cached already (one
        // that waited in its thread's slot, Note [A thread's own slot]) goes in as freed with it.
        let now_ns = now_ns.max(self.store.newest_idle_since_ns()).max(if self.parked.len != 0 { self.parked.idle_since_ns } else { 0 });
        self.note_live(now_ns, live);
        let (max_blocks, max_bytes) = self.bounds();
        let mut block = CachedBlock { addr, len, idle_since_ns: now_ns, state: BlockState::Hot, doomed: false, facts };
        let mut out = Inserted { accepted: false, block: Range { addr, len }, absorbed: [None; 2], evicted: 0 };
        if max_blocks == 0 || len > max_bytes {
            return out;
        }
        self.unpark();
        for absorbed in out.absorbed.iter_mut() {
            let Some(neighbour) = self.take_neighbour(&block, max_bytes) else { break };
            block.addr = block.addr.min(neighbour.addr);
            block.len += neighbour.len;
            block.facts = block.facts.merge(neighbour.facts);
            *absorbed = Some(neighbour.addr);
        }
        out.block = Range { addr: block.addr, len: block.len };
        if out.absorbed[0].is_none() && self.store.count() < max_blocks && self.cached_bytes + block.len <= max_bytes {
            // Nothing to merge and room as it is: parked (Note [The block freed last]).
            self.parked = block;
            self.cached_bytes += block.len;
            out.accepted = true;
            return out;
        }
        while self.store.count() >= max_blocks || self.cached_bytes + block.len > max_bytes {
            let Some(slot) = self.evicted.get_mut(out.evicted) else { return out };
            let Some(r) = Self::evict_oldest(&mut self.store) else { return out };
            *slot = r;
            self.cached_bytes -= r.len;
            out.evicted += 1;
        }
        if self.store.add(block).is_none() {
            return out;
        }
        self.cached_bytes += block.len;
        out.accepted = true;
        out
    }

    /// Removes and returns an available cached block that ends where `block` starts or starts
    /// where it ends, with the same huge-page advice, when the two together stay within
    /// `max_bytes`.
    fn take_neighbour(&mut self, block: &CachedBlock, max_bytes: usize) -> Option<CachedBlock> {
        // Advice from different code (or none beside some) stays apart: a merged block would
        // suit neither (Note [Huge-page advice] in host/host_layer/mod.rs).
        let fits = |b: &CachedBlock| b.state != BlockState::Releasing && b.len + block.len <= max_bytes && b.facts.advised_by == block.facts.advised_by;
        let id = [self.store.ending_at(block.addr), self.store.starting_at(block.addr + block.len)]
            .into_iter()
            .flatten()
            .find(|&id| fits(self.store.get(id)))?;
        let neighbour = self.store.remove(id);
        self.cached_bytes -= neighbour.len;
        Some(neighbour)
    }

    /// Records the live point in the current window, opening a new window when it has run out.
    fn note_live(&mut self, now_ns: u64, live: Live) {
        let [older, current] = &mut self.peaks;
        let age = now_ns.saturating_sub(current.since_ns);
        if age >= PEAK_WINDOW_NS {
            *older = if age >= 2 * PEAK_WINDOW_NS { Peak { since_ns: now_ns, live: Live::default() } } else { *current };
            *current = Peak { since_ns: now_ns, live: Live::default() };
        }
        current.live.bytes = current.live.bytes.max(live.bytes);
        current.live.blocks = current.live.blocks.max(live.blocks);
    }

    /// How much of a block a request may leave unused before the rest is split off (Note
    /// [Neighbours merge]).
    pub fn waste_percent(&self) -> usize {
        match self.limits.max_waste_percent {
            Some(p) => p,
            None => {
                let [older, current] = &self.peaks;
                if older.live.blocks.max(current.live.blocks) > self.limits.min_blocks {
                    WASTE_MANY_LIVE
                } else {
                    WASTE_FEW_LIVE
                }
            }
        }
    }

    /// The block and byte bounds now (Note [Bounds follow the working set]).
    pub fn bounds(&self) -> (usize, usize) {
        let l = &self.limits;
        let [older, current] = &self.peaks;
        let blocks = if l.follow_blocks { older.live.blocks.max(current.live.blocks).max(l.min_blocks).min(l.max_blocks) } else { l.max_blocks };
        let bytes = if l.follow_bytes { older.live.bytes.max(current.live.bytes).max(l.min_bytes).min(l.max_bytes) } else { l.max_bytes };
        (blocks.min(CAPACITY), bytes)
    }

    /// The least recently freed block that is not being released, out of the store.
    fn evict_oldest(store: &mut Store) -> Option<Range> {
        let id = store.oldest_first().find(|(_, b)| b.state != BlockState::Releasing)?.0;
        let b = store.remove(id);
        Some(Range { addr: b.addr, len: b.len })
    }

    /// Checks the bookkeeping; tests call it after every step.
    #[cfg(test)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        self.store.check()?;
        if self.parked.len != 0 && (self.parked.state != BlockState::Hot || self.store.iter().any(|(_, b)| b.idle_since_ns > self.parked.idle_since_ns)) {
            return Err("the parked block is not the hot one freed last");
        }
        let bytes: usize = self.blocks().map(|b| b.len).sum();
        if bytes != self.cached_bytes {
            return Err("cached_bytes disagrees with the blocks");
        }
        if self.deferred.iter().take(self.deferred_count).map(|r| r.len).sum::<usize>() != self.deferred_bytes {
            return Err("deferred_bytes disagrees with the list");
        }
        if self.block_count() > self.limits.max_blocks.max(1) && self.limits.max_blocks > 0 {
            return Err("more blocks than the limit");
        }
        let mut blocks: Vec<(usize, usize)> = self.blocks().map(|b| (b.addr, b.len)).collect();
        if blocks.iter().any(|b| b.1 == 0) {
            return Err("empty block");
        }
        blocks.extend(self.deferred.iter().take(self.deferred_count).map(|r| (r.addr, r.len)));
        blocks.sort_unstable();
        for w in blocks.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err("overlapping blocks (cached or waiting to be unmapped)");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
