//! The large-block cache policy: which freed blocks are kept, which one serves a request, and
//! when idle blocks are released (MADV_FREE) and expired (unmapped). Pure: no system calls,
//! the time comes in as an argument, outcomes come back as fixed-size lists of ranges for the
//! caller to act on outside its lock. See Note [Hot stays hot].
//
// Note [Hot stays hot]
// A block reused soon after its free is handed out untouched: no madvise, so no faults and no
// re-dirtying cost (NOTES.md: rewriting MADV_FREE'd pages costs 2.5x a plain rewrite). Only a
// block idle for `release_after_ns` is released, and only one idle for `expire_after_ns` is
// unmapped. A block being released is marked Releasing and is not handed out until the
// madvise call has returned.

use crate::config::MAX_CACHE_BLOCKS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub addr: usize,
    pub len: usize,
}

/// A fixed-capacity list of ranges, so outcomes never allocate.
#[derive(Clone, Copy, Debug)]
pub struct RangeList {
    items: [Range; MAX_CACHE_BLOCKS + 1],
    count: usize,
}

impl RangeList {
    pub const fn new() -> Self {
        RangeList { items: [Range { addr: 0, len: 0 }; MAX_CACHE_BLOCKS + 1], count: 0 }
    }
    pub fn push(&mut self, r: Range) {
        if let Some(slot) = self.items.get_mut(self.count) {
            *slot = r;
            self.count += 1;
        }
    }
    pub fn iter(&self) -> impl Iterator<Item = &Range> {
        self.items.iter().take(self.count)
    }
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn total_bytes(&self) -> usize {
        self.iter().map(|r| r.len).sum()
    }
}

impl Default for RangeList {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Freed recently; contents and pages intact.
    Hot,
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    pub max_blocks: usize,
    pub max_bytes: usize,
    pub release_after_ns: u64,
    pub expire_after_ns: u64,
    pub max_waste_percent: usize,
    /// A split-off tail shorter than this is unmapped rather than cached.
    pub min_block_len: usize,
}

/// A block handed out by `take`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub addr: usize,
    pub len: usize,
    /// It had been MADV_FREE'd (contents unspecified, pages may fault back in).
    pub was_released: bool,
    /// A tail cut off to bound the waste and too short to keep: the caller unmaps it.
    pub tail_to_unmap: Option<Range>,
    /// A tail cut off and kept in the cache: the caller records it as cached.
    pub tail_kept: Option<Range>,
}

#[derive(Clone, Copy, Debug)]
pub struct Inserted {
    pub accepted: bool,
    /// Older blocks pushed out to make room: the caller unmaps them.
    pub evicted: RangeList,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Due {
    /// Blocks now Releasing: the caller calls MADV_FREE on each, then `release_done`.
    pub release: RangeList,
    /// Blocks removed for idling past the expiry: the caller unmaps them.
    pub expire: RangeList,
}

pub struct BlockCache {
    slots: [Option<CachedBlock>; MAX_CACHE_BLOCKS],
    limits: CacheLimits,
    cached_bytes: usize,
}

impl BlockCache {
    pub const fn new(limits: CacheLimits) -> Self {
        BlockCache { slots: [None; MAX_CACHE_BLOCKS], limits, cached_bytes: 0 }
    }

    pub fn set_limits(&mut self, limits: CacheLimits) {
        self.limits = CacheLimits { max_blocks: limits.max_blocks.min(MAX_CACHE_BLOCKS), ..limits };
    }

    pub fn limits(&self) -> &CacheLimits {
        &self.limits
    }

    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    pub fn block_count(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    pub fn blocks(&self) -> impl Iterator<Item = &CachedBlock> {
        self.slots.iter().flatten()
    }

    /// Best fit among available blocks of at least `need` bytes whose start honours `align`;
    /// a block that would leave more than `max_waste_percent` unused is split.
    pub fn take(&mut self, need: usize, align: usize) -> Option<Taken> {
        let align_mask = align.max(1) - 1;
        let mut best: Option<(usize, usize, bool)> = None; // (slot, waste, released)
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(b) = slot else { continue };
            if b.state == BlockState::Releasing || b.len < need || b.addr & align_mask != 0 {
                continue;
            }
            let waste = b.len - need;
            let released = b.state == BlockState::Released;
            let better = match best {
                None => true,
                // Prefer less waste; on a tie prefer a hot block (Note [Hot stays hot]).
                Some((_, w, r)) => waste < w || (waste == w && r && !released),
            };
            if better {
                best = Some((i, waste, released));
            }
        }
        let (index, waste, was_released) = best?;
        let block = self.slots.get_mut(index)?.take()?;
        self.cached_bytes -= block.len;

        let mut taken = Taken { addr: block.addr, len: block.len, was_released, tail_to_unmap: None, tail_kept: None };
        let allowed_waste = block.len / 100 * self.limits.max_waste_percent;
        if waste > allowed_waste {
            let tail = Range { addr: block.addr + need, len: waste };
            taken.len = need;
            if tail.len >= self.limits.min_block_len {
                if let Some(slot) = self.slots.get_mut(index) {
                    *slot = Some(CachedBlock { addr: tail.addr, len: tail.len, ..block });
                }
                self.cached_bytes += tail.len;
                taken.tail_kept = Some(tail);
            } else {
                taken.tail_to_unmap = Some(tail);
            }
        }
        Some(taken)
    }

    /// On a miss: the largest available block smaller than `need`, to be grown (its pages are
    /// kept, so only the difference faults). Only plain page alignment can be grown into.
    pub fn take_smaller(&mut self, need: usize) -> Option<Taken> {
        let index = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|b| b.state != BlockState::Releasing && b.len < need).map(|b| (i, b.len)))
            .max_by_key(|&(_, len)| len)?
            .0;
        let block = self.slots.get_mut(index)?.take()?;
        self.cached_bytes -= block.len;
        Some(Taken {
            addr: block.addr,
            len: block.len,
            was_released: block.state == BlockState::Released,
            tail_to_unmap: None,
            tail_kept: None,
        })
    }

    /// Offers a freed block. Older blocks are evicted (least recently freed first) to respect
    /// the block and byte limits; a block larger than the byte limit is refused.
    pub fn insert(&mut self, addr: usize, len: usize, now_ns: u64) -> Inserted {
        let mut out = Inserted { accepted: false, evicted: RangeList::new() };
        if self.limits.max_blocks == 0 || len > self.limits.max_bytes {
            return out;
        }
        while self.block_count() >= self.limits.max_blocks || self.cached_bytes + len > self.limits.max_bytes {
            match self.evict_oldest() {
                Some(r) => out.evicted.push(r),
                None => return out,
            }
        }
        let Some(free_slot) = self.slots.iter_mut().find(|s| s.is_none()) else { return out };
        *free_slot = Some(CachedBlock { addr, len, idle_since_ns: now_ns, state: BlockState::Hot, doomed: false });
        self.cached_bytes += len;
        out.accepted = true;
        out
    }

    fn evict_oldest(&mut self) -> Option<Range> {
        let index = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|b| b.state != BlockState::Releasing).map(|b| (i, b.idle_since_ns)))
            .min_by_key(|&(_, t)| t)?
            .0;
        let b = self.slots.get_mut(index)?.take()?;
        self.cached_bytes -= b.len;
        Some(Range { addr: b.addr, len: b.len })
    }

    /// Blocks whose idle time has passed a delay: expired ones leave the cache, hot ones
    /// become Releasing.
    pub fn due(&mut self, now_ns: u64) -> Due {
        let mut due = Due::default();
        let limits = self.limits;
        for slot in self.slots.iter_mut() {
            let Some(b) = slot else { continue };
            let idle = now_ns.saturating_sub(b.idle_since_ns);
            if b.state != BlockState::Releasing && idle >= limits.expire_after_ns {
                due.expire.push(Range { addr: b.addr, len: b.len });
                self.cached_bytes -= b.len;
                *slot = None;
            } else if b.state == BlockState::Hot && idle >= limits.release_after_ns {
                b.state = BlockState::Releasing;
                due.release.push(Range { addr: b.addr, len: b.len });
            }
        }
        due
    }

    /// The madvise for a Releasing block has returned. Returns the block if it was trimmed
    /// meanwhile: the caller unmaps it.
    pub fn release_done(&mut self, addr: usize) -> Option<Range> {
        let index = self.slots.iter().position(|s| s.is_some_and(|b| b.addr == addr && b.state == BlockState::Releasing))?;
        let slot = self.slots.get_mut(index)?;
        let b = slot.as_mut()?;
        if b.doomed {
            let r = Range { addr: b.addr, len: b.len };
            self.cached_bytes -= b.len;
            *slot = None;
            return Some(r);
        }
        b.state = BlockState::Released;
        None
    }

    /// Empties the cache: every available block comes back for unmapping; blocks being
    /// released are unmapped by `release_done`.
    pub fn drain(&mut self) -> RangeList {
        let mut out = RangeList::new();
        for slot in self.slots.iter_mut() {
            let Some(b) = slot else { continue };
            if b.state == BlockState::Releasing {
                b.doomed = true;
                continue;
            }
            out.push(Range { addr: b.addr, len: b.len });
            self.cached_bytes -= b.len;
            *slot = None;
        }
        out
    }

    /// When `due` will next have work; `None` with nothing pending.
    pub fn next_deadline_ns(&self) -> Option<u64> {
        self.blocks()
            .filter(|b| b.state != BlockState::Releasing)
            .map(|b| {
                let expire = b.idle_since_ns.saturating_add(self.limits.expire_after_ns);
                if b.state == BlockState::Hot {
                    expire.min(b.idle_since_ns.saturating_add(self.limits.release_after_ns))
                } else {
                    expire
                }
            })
            .min()
    }

    /// Checks the bookkeeping; tests call it after every step.
    #[cfg(test)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let bytes: usize = self.blocks().map(|b| b.len).sum();
        if bytes != self.cached_bytes {
            return Err("cached_bytes disagrees with the blocks");
        }
        if self.block_count() > self.limits.max_blocks.max(1) && self.limits.max_blocks > 0 {
            return Err("more blocks than the limit");
        }
        let mut blocks: [(usize, usize); MAX_CACHE_BLOCKS] = [(0, 0); MAX_CACHE_BLOCKS];
        let mut n = 0;
        for b in self.blocks() {
            if b.len == 0 {
                return Err("empty block");
            }
            blocks[n] = (b.addr, b.len);
            n += 1;
        }
        let blocks = &mut blocks[..n];
        blocks.sort_unstable();
        for w in blocks.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err("overlapping blocks");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;
    const MS: u64 = 1_000_000;

    fn limits() -> CacheLimits {
        CacheLimits {
            max_blocks: 4,
            max_bytes: 1024 * MB,
            release_after_ns: 1000 * MS,
            expire_after_ns: 10_000 * MS,
            max_waste_percent: 25,
            min_block_len: 4 * MB,
        }
    }

    #[test]
    fn reuses_hot_block_untouched() {
        let mut c = BlockCache::new(limits());
        assert!(c.insert(0x1000_0000, 80 * MB, 0).accepted);
        let t = c.take(80 * MB, 4096).unwrap();
        assert_eq!((t.addr, t.len, t.was_released), (0x1000_0000, 80 * MB, false));
        assert_eq!(c.cached_bytes(), 0);
        c.check_invariants().unwrap();
    }

    #[test]
    fn best_fit_and_alignment() {
        let mut c = BlockCache::new(limits());
        c.insert(0x1000_0000, 100 * MB, 0);
        c.insert(0x2000_0000 + 4096, 90 * MB, 1);
        c.insert(0x3000_0000, 82 * MB, 2);
        assert_eq!(c.take(80 * MB, 4096).unwrap().addr, 0x3000_0000);
        // 0x2000_1000 is not 64 KiB aligned, so the 100 MB block serves this one.
        assert_eq!(c.take(85 * MB, 65536).unwrap().addr, 0x1000_0000);
        c.check_invariants().unwrap();
    }

    #[test]
    fn never_a_huge_block_for_a_small_request() {
        let mut c = BlockCache::new(limits());
        c.insert(0x4000_0000, 1024 * MB, 0);
        let t = c.take(8 * MB, 4096).unwrap();
        assert_eq!(t.len, 8 * MB);
        assert_eq!(t.tail_kept, Some(Range { addr: 0x4000_0000 + 8 * MB, len: 1016 * MB }));
        assert_eq!(c.cached_bytes(), 1016 * MB);
        // A short tail is given back instead of cached.
        let t = c.take(1014 * MB, 4096).unwrap();
        assert_eq!(t.tail_to_unmap, None, "2 MB of 1016 is within 25%");
        c.check_invariants().unwrap();
        c.insert(0x9000_0000, 12 * MB, 0);
        let t = c.take(8 * MB, 4096).unwrap();
        assert_eq!(t.tail_kept, Some(Range { addr: 0x9000_0000 + 8 * MB, len: 4 * MB }));
        c.insert(0xa000_0000, 11 * MB, 0);
        let t = c.take(8 * MB, 4096).unwrap();
        assert_eq!(t.tail_to_unmap, Some(Range { addr: 0xa000_0000 + 8 * MB, len: 3 * MB }));
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_miss_can_grow_the_largest_smaller_block() {
        let mut c = BlockCache::new(limits());
        c.insert(0x1000_0000, 8 * MB, 0);
        c.insert(0x2000_0000, 40 * MB, 1);
        c.insert(0x3000_0000, 90 * MB, 2);
        assert!(c.take(100 * MB, 4096).is_none());
        let t = c.take_smaller(100 * MB).unwrap();
        assert_eq!((t.addr, t.len), (0x3000_0000, 90 * MB));
        assert_eq!(c.cached_bytes(), 48 * MB);
        c.check_invariants().unwrap();
    }

    #[test]
    fn limits_evict_oldest_first() {
        let mut c = BlockCache::new(CacheLimits { max_bytes: 200 * MB, ..limits() });
        c.insert(0x1000_0000, 80 * MB, 10);
        c.insert(0x2000_0000, 80 * MB, 20);
        let ins = c.insert(0x3000_0000, 80 * MB, 30);
        assert!(ins.accepted);
        assert_eq!(ins.evicted.iter().next(), Some(&Range { addr: 0x1000_0000, len: 80 * MB }));
        assert!(!c.insert(0x5000_0000, 300 * MB, 40).accepted, "bigger than the whole cache");
        c.check_invariants().unwrap();
        let mut c = BlockCache::new(limits());
        for i in 0..6 {
            c.insert(0x1000_0000 * (i + 1), 8 * MB, i as u64);
        }
        assert_eq!(c.block_count(), 4);
        assert!(c.blocks().all(|b| b.idle_since_ns >= 2));
        let mut off = BlockCache::new(CacheLimits { max_blocks: 0, ..limits() });
        assert!(!off.insert(0x1000_0000, 8 * MB, 0).accepted);
    }

    #[test]
    fn idle_blocks_are_released_then_expired() {
        let mut c = BlockCache::new(limits());
        c.insert(0x1000_0000, 80 * MB, 0);
        assert_eq!(c.next_deadline_ns(), Some(1000 * MS));
        assert!(c.due(999 * MS).release.is_empty());
        let due = c.due(1000 * MS);
        assert_eq!(due.release.len(), 1);
        assert!(c.take(80 * MB, 4096).is_none(), "not while the madvise runs");
        assert_eq!(c.release_done(0x1000_0000), None);
        assert_eq!(c.next_deadline_ns(), Some(10_000 * MS));
        let t = c.take(80 * MB, 4096).unwrap();
        assert!(t.was_released);
        c.insert(t.addr, t.len, 2000 * MS);
        c.due(3000 * MS);
        c.release_done(t.addr);
        let due = c.due(12_000 * MS);
        assert_eq!(due.expire.len(), 1);
        assert_eq!(c.block_count(), 0);
        assert_eq!(c.next_deadline_ns(), None);
        c.check_invariants().unwrap();
    }

    #[test]
    fn trim_during_release_unmaps_when_release_returns() {
        let mut c = BlockCache::new(limits());
        c.insert(0x1000_0000, 80 * MB, 0);
        c.insert(0x2000_0000, 80 * MB, 5000 * MS);
        c.due(1000 * MS);
        let drained = c.drain();
        assert_eq!(drained.len(), 1);
        assert_eq!(c.release_done(0x1000_0000), Some(Range { addr: 0x1000_0000, len: 80 * MB }));
        assert_eq!(c.cached_bytes(), 0);
        c.check_invariants().unwrap();
    }
}
