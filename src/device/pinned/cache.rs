//! The pinned host memory cache (cudaMallocHost / cudaHostAlloc / cudaFreeHost): pinning costs
//! milliseconds for large sizes, so freed blocks are kept, bounded in count and bytes, and
//! reused by a request of the same size class, flags and context (pinned memory belongs to the
//! context that allocated it: a reset frees it, Note [Context lifetime] in device/pool/mod.rs). Bookkeeping
//! only, like the pool.

use crate::device::table::{AddrMap, Slab};
use crate::ranges::{Range, RangeList};
use crate::backing::TableSource;

const SLOTS: usize = 64;
const LIVE_CAPACITY: u32 = 1 << 16;
const MAP_CAPACITY: usize = 1 << 17;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedBlock {
    pub addr: u64,
    pub len: u64,
    pub flags: u32,
    /// The CUDA context current when it was pinned (0: unknown).
    pub ctx: u64,
    /// Its holder word while live (Note [Holders]).
    pub holder: u64,
    /// The bytes asked for in its current life: the allocation range a query answers (Note
    /// [Pinned memory answers as asked]).
    pub asked: u64,
    freed_seq: u64,
}

impl PinnedBlock {
    pub const fn live(addr: u64, len: u64, asked: u64, flags: u32, ctx: u64, holder: u64) -> Self {
        PinnedBlock { addr, len, flags, ctx, holder, asked, freed_seq: 0 }
    }
}

// Note [Pinned memory answers as asked]
// A pinned block is the driver's allocation of its class's length, and stays pinned in our
// cache after cudaFreeHost. Asked about it, the driver would call a freed block live pinned
// memory, and a live one as long as its class (8 KiB for 5,000 bytes), pinned past its end. So
// a pointer query (cuPointerGetAttribute(s), cuMemGetAddressRange, and the runtime's
// cudaPointerGetAttributes over them) answers for our blocks: a live block's range is what was
// asked for, and a pointer past it or in a cached block is unknown memory, as after the
// runtime's own free (Note [Freed memory answers as freed] in route/cuda/driver.rs).

/// Size classes: whole pages, then four classes per power of two. None past
/// MAX_POOLED_BYTES (more than any machine pins, or a size whose rounding would wrap): such a
/// request goes to the runtime as it is.
pub fn pinned_class(size: u64) -> Option<u64> {
    if size > crate::device::pool::MAX_POOLED_BYTES {
        return None;
    }
    let size = size.max(1).div_ceil(4096) * 4096;
    let step = ((1u64 << (63 - size.leading_zeros())) >> 2).max(4096);
    Some(size.div_ceil(step) * step)
}

pub struct PinnedCache {
    free: [Option<PinnedBlock>; SLOTS],
    live_records: Slab<PinnedBlock>,
    live: AddrMap,
    limit_bytes: u64,
    cached_bytes: u64,
    seq: u64,
    ready: bool,
    pub requests: u64,
    pub hits: u64,
    pub peak_cached_bytes: u64,
}

// The list is returned by value on purpose: boxing it would allocate on the free path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum PinnedFree {
    NotOurs,
    /// Kept; the caller gives `evicted` (older blocks pushed out) back with cudaFreeHost.
    Cached { evicted: RangeList },
    /// Not kept (larger than the whole cache): the caller gives it back.
    Refused,
}

impl PinnedCache {
    pub const fn new() -> Self {
        PinnedCache {
            free: [None; SLOTS],
            live_records: Slab::empty(),
            live: AddrMap::empty(),
            limit_bytes: 0,
            cached_bytes: 0,
            seq: 0,
            ready: false,
            requests: 0,
            hits: 0,
            peak_cached_bytes: 0,
        }
    }

    pub fn init(&mut self, limit_bytes: u64, source: TableSource) -> bool {
        if !self.ready {
            self.limit_bytes = limit_bytes;
            self.ready = self.live_records.init(LIVE_CAPACITY, source) && self.live.init(MAP_CAPACITY, source);
        }
        self.ready
    }

    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// A cached block of `size`'s class with the same flags and context, if any, now `holder`'s.
    pub fn take(&mut self, size: u64, flags: u32, ctx: u64, holder: u64) -> Option<PinnedBlock> {
        self.requests += 1;
        let len = pinned_class(size)?;
        let index = self.free.iter().position(|s| s.is_some_and(|b| b.len == len && b.flags == flags && b.ctx == ctx))?;
        let block = PinnedBlock { holder, asked: size, ..self.free.get(index).copied().flatten()? };
        // Untrackable (tables full): leave it cached and let the caller allocate fresh.
        if !self.track(block) {
            return None;
        }
        if let Some(slot) = self.free.get_mut(index) {
            *slot = None;
        }
        self.cached_bytes -= block.len;
        self.hits += 1;
        Some(block)
    }

    /// The length to pin for a request that missed.
    /// The length pinned for a request of `size` bytes; None: not ours to pin (pinned_class).
    pub fn len_for(&self, size: u64) -> Option<u64> {
        pinned_class(size)
    }

    /// Records a freshly pinned block; false when the tables are full (leave it untracked).
    pub fn add_live(&mut self, block: PinnedBlock) -> bool {
        self.track(block)
    }

    /// The block starting at `base` (each is an allocation of the runtime's own, so the
    /// runtime's range of any address in it starts there), live or cached (Note [Pinned memory
    /// answers as asked]).
    pub fn starting_at(&self, base: u64) -> Option<(PinnedBlock, bool)> {
        if let Some(b) = self.live_block(base) {
            return Some((b, true));
        }
        self.free.iter().flatten().find(|b| b.addr == base).map(|b| (*b, false))
    }

    /// Whether it holds no block, live or cached.
    pub fn is_empty(&self) -> bool {
        !self.ready || (self.live.is_empty() && self.free.iter().all(Option::is_none))
    }

    /// The live block starting at `addr`.
    pub fn live_block(&self, addr: u64) -> Option<PinnedBlock> {
        self.live.get(addr).map(|i| *self.live_records.get(i))
    }

    /// Note [Context lifetime]: forgets every block, cached or live, of context `ctx` (every
    /// block when `None`): the runtime freed them. A live one freed later is not ours.
    /// `on_live` sees each live block forgotten.
    pub fn forget(&mut self, ctx: Option<u64>, mut on_live: impl FnMut(&PinnedBlock)) {
        let doomed = |b: &PinnedBlock| ctx.is_none_or(|c| b.ctx == c || b.ctx == 0);
        for slot in self.free.iter_mut() {
            if let Some(b) = *slot {
                if doomed(&b) {
                    *slot = None;
                    self.cached_bytes -= b.len;
                }
            }
        }
        loop {
            let mut batch = [0u64; 64];
            let mut n = 0;
            self.live.for_each(|addr, i| {
                if n < batch.len() && doomed(self.live_records.get(i)) {
                    if let Some(slot) = batch.get_mut(n) {
                        *slot = addr;
                    }
                    n += 1;
                }
            });
            for &addr in batch.iter().take(n) {
                if let Some(i) = self.live.remove(addr) {
                    on_live(self.live_records.get(i));
                    self.live_records.remove(i);
                }
            }
            if n < batch.len() {
                return;
            }
        }
    }

    fn track(&mut self, block: PinnedBlock) -> bool {
        let Some(i) = self.live_records.insert(block) else { return false };
        if !self.live.insert(block.addr, i) {
            self.live_records.remove(i);
            return false;
        }
        true
    }

    pub fn owns(&self, addr: u64) -> bool {
        self.live.get(addr).is_some()
    }

    /// Whether `addr` starts a block freed into the cache (a second free of it is the program's
    /// mistake, and the block is still pinned for the next request).
    pub fn is_cached(&self, addr: u64) -> bool {
        self.free.iter().any(|s| s.is_some_and(|b| b.addr == addr))
    }

    pub fn free(&mut self, addr: u64) -> PinnedFree {
        let Some(i) = self.live.remove(addr) else { return PinnedFree::NotOurs };
        let mut block = *self.live_records.get(i);
        self.live_records.remove(i);
        if block.len > self.limit_bytes {
            return PinnedFree::Refused;
        }
        self.seq += 1;
        block.freed_seq = self.seq;
        let mut evicted = RangeList::new();
        while self.cached_bytes + block.len > self.limit_bytes || self.free.iter().all(|s| s.is_some()) {
            let oldest = self.free.iter_mut().filter(|s| s.is_some()).min_by_key(|s| s.map_or(u64::MAX, |b| b.freed_seq));
            let Some(old) = oldest.and_then(|s| s.take()) else { break };
            self.cached_bytes -= old.len;
            evicted.push(Range { addr: old.addr as usize, len: old.len as usize });
        }
        if let Some(slot) = self.free.iter_mut().find(|s| s.is_none()) {
            *slot = Some(block);
            self.cached_bytes += block.len;
            self.peak_cached_bytes = self.peak_cached_bytes.max(self.cached_bytes);
        }
        PinnedFree::Cached { evicted }
    }

    /// Takes `addr`'s live block out without keeping it: the caller gives it back itself.
    pub fn release(&mut self, addr: u64) -> PinnedFree {
        let Some(i) = self.live.remove(addr) else { return PinnedFree::NotOurs };
        self.live_records.remove(i);
        PinnedFree::Refused
    }

    /// Calls `f(block, live)` for every block, live then cached (the memory snapshot).
    pub fn for_each(&self, mut f: impl FnMut(&PinnedBlock, bool)) {
        self.live.for_each(|_, i| f(self.live_records.get(i), true));
        for b in self.free.iter().flatten() {
            f(b, false);
        }
    }

    /// Empties the cache into `out`; returns how many were written.
    pub fn drain(&mut self, out: &mut [(u64, u64)]) -> usize {
        let mut n = 0;
        for slot in self.free.iter_mut() {
            if let (Some(b), Some(o)) = (*slot, out.get_mut(n)) {
                *o = (b.addr, b.len);
                *slot = None;
                self.cached_bytes -= b.len;
                n += 1;
            }
        }
        n
    }
}

impl Default for PinnedCache {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::leak_table;

    /// Note [Pinned memory answers as asked]: the block at a start, live or cached, with the size
    /// asked for in its current life.
    #[test]
    fn a_block_is_found_by_its_start_with_what_was_asked() {
        let mut c = Box::new(PinnedCache::new());
        assert!(c.init(64 << 20, leak_table));
        let len = c.len_for(5000).unwrap();
        assert!(c.add_live(PinnedBlock::live(0x1000_0000, len, 5000, 0, 7, 0)));
        assert_eq!(c.starting_at(0x1000_0000).map(|(b, live)| (b.addr, b.asked, live)), Some((0x1000_0000, 5000, true)));
        assert_eq!(c.starting_at(0x1000_0000 + 4096), None);
        c.free(0x1000_0000);
        assert_eq!(c.starting_at(0x1000_0000).map(|(_, live)| live), Some(false));
        let b = c.take(6000, 0, 7, 0).unwrap();
        assert_eq!(c.starting_at(b.addr).map(|(b, live)| (b.asked, live)), Some((6000, true)), "asked anew");
        c.free(b.addr);
        c.forget(None, |_| {});
        assert!(c.is_empty());
    }

    #[test]
    fn reuses_same_class_and_flags_and_bounds_bytes() {
        let mut c = Box::new(PinnedCache::new());
        assert!(c.init(64 << 20, leak_table));
        assert_eq!(c.take(10 << 20, 0, 7, 0), None);
        let len = c.len_for(10 << 20).unwrap();
        assert_eq!(len, 10 << 20);
        assert!(c.add_live(PinnedBlock::live(0x1000_0000, len, len, 0, 7, 0)));
        assert!(matches!(c.free(0x1000_0000), PinnedFree::Cached { evicted } if evicted.is_empty()));
        assert!(c.is_cached(0x1000_0000) && !c.owns(0x1000_0000));
        assert!(matches!(c.free(0x1000_0000), PinnedFree::NotOurs), "double free is not ours");
        assert_eq!(c.take(9 << 20, 1, 7, 0), None, "other flags");
        assert_eq!(c.take(9 << 20, 0, 8, 0), None, "other context");
        assert_eq!(c.take((9 << 20) + 1, 0, 7, 0).map(|b| b.addr), Some(0x1000_0000), "same class");
        assert_eq!(c.hits, 1);
        // Over the byte limit the oldest blocks go.
        c.free(0x1000_0000);
        c.add_live(PinnedBlock::live(0x2000_0000, c.len_for(40 << 20).unwrap(), 40 << 20, 0, 7, 0));
        c.add_live(PinnedBlock::live(0x3000_0000, c.len_for(40 << 20).unwrap(), 40 << 20, 0, 7, 0));
        assert!(matches!(c.free(0x2000_0000), PinnedFree::Cached { .. }));
        let PinnedFree::Cached { evicted } = c.free(0x3000_0000) else { panic!() };
        let evicted: Vec<_> = evicted.iter().map(|r| (r.addr, r.len)).collect();
        assert_eq!(evicted, vec![(0x1000_0000, 10 << 20), (0x2000_0000, 40 << 20)]);
        c.add_live(PinnedBlock::live(0x4000_0000, c.len_for(100 << 20).unwrap(), 100 << 20, 0, 7, 0));
        assert!(matches!(c.free(0x4000_0000), PinnedFree::Refused));
        assert_eq!(c.cached_bytes(), 40 << 20);
        assert!(c.add_live(PinnedBlock::live(0x5000_0000, 4096, 4000, 0, 7, 9 << 48)));
        let mut seen = vec![];
        c.for_each(|b, live| seen.push((b.addr, b.len, b.holder, live)));
        assert_eq!(seen, vec![(0x5000_0000, 4096, 9 << 48, true), (0x3000_0000, 40 << 20, 0, false)]);
        let mut out = [(0, 0); 64];
        assert_eq!(c.drain(&mut out), 1);
        assert_eq!(c.cached_bytes(), 0);
    }

    #[test]
    fn forgetting_a_context_drops_its_blocks_cached_and_live() {
        let mut c = Box::new(PinnedCache::new());
        assert!(c.init(1 << 30, leak_table));
        for (i, ctx) in [(1u64, 7u64), (2, 7), (3, 8), (4, 8)] {
            assert!(c.add_live(PinnedBlock::live(i << 28, 1 << 20, 1 << 20, 0, ctx, 0)));
        }
        c.free(1 << 28);
        c.free(3 << 28);
        c.forget(Some(7), |_| {});
        assert!(!c.owns(2 << 28), "live block of the reset context is no longer ours");
        assert!(c.owns(4 << 28));
        assert_eq!(c.take(1 << 20, 0, 7, 0), None, "its cached block is never handed out");
        assert_eq!(c.take(1 << 20, 0, 8, 0).map(|b| b.addr), Some(3 << 28));
        c.forget(None, |_| {});
        assert!(!c.owns(4 << 28) && !c.owns(3 << 28));
        assert_eq!(c.cached_bytes(), 0);
    }

    /// Note [Graph captures under way]: a block freed during a capture is given back, not kept.
    #[test]
    fn a_released_block_is_neither_ours_nor_kept() {
        let mut c = Box::new(PinnedCache::new());
        assert!(c.init(64 << 20, leak_table));
        assert!(c.add_live(PinnedBlock::live(0x1000_0000, 1 << 20, 1 << 20, 0, 7, 0)));
        assert!(matches!(c.release(0x1000_0000), PinnedFree::Refused));
        assert!(!c.owns(0x1000_0000) && !c.is_cached(0x1000_0000) && c.cached_bytes() == 0);
        assert_eq!(c.take(1 << 20, 0, 7, 0), None, "never handed out again");
        assert!(matches!(c.release(0x1000_0000), PinnedFree::NotOurs), "a second free is not ours");
    }
}
