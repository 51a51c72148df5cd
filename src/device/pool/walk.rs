//! Walking the pool for reports (the memory snapshot): every segment, and the blocks that tile
//! it in address order, live and free. Read-only, under the pool's lock like everything else;
//! never allocates, and a walk touches only the segment table and each segment's block chain.

use super::*;

/// One block of a segment as a report shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkBlock {
    pub addr: u64,
    pub size: u64,
    pub allocated: bool,
    /// Free, but freed by a cudaFree whose synchronization was deferred (Note [Safe reuse]):
    /// kernels may still use it, and no request takes it before a device sync.
    pub pending: bool,
    /// The holder word of a live block (Note [Holders] in holders.rs); 0 for a free one.
    pub holder: u64,
}

/// One segment: its base, whether it serves small requests, and its blocks. For expandable
/// segments (Note [Expandable segments]), one run of mapped chunks, as PyTorch's snapshot shows
/// an expandable segment's mapped memory; its blocks are those of the range, cut to the run.
#[derive(Clone, Copy)]
pub struct WalkSegment<'a> {
    pub addr: u64,
    pub small: bool,
    pub expandable: bool,
    pool: &'a DevicePool,
    first: u32,
    /// The run's end (u64::MAX: a classic segment, whole).
    end: u64,
}

impl<'a> WalkSegment<'a> {
    /// The blocks from the segment's base up; their sizes add up to the segment's length.
    pub fn blocks(&self) -> impl Iterator<Item = WalkBlock> + 'a {
        let pool = self.pool;
        let mut next = self.first;
        let (start, end) = (self.addr, self.end);
        core::iter::from_fn(move || loop {
            if next == NONE {
                return None;
            }
            let b = pool.blocks.get(next);
            next = b.seg_next;
            let (from, to) = (b.addr.max(start), b.addr.saturating_add(b.size).min(end));
            if b.addr >= end {
                next = NONE;
                return None;
            }
            if from >= to {
                continue; // before the run
            }
            return Some(WalkBlock {
                addr: from,
                size: to - from,
                allocated: b.allocated,
                pending: !b.allocated && b.tag == PENDING,
                holder: if b.allocated { b.holder } else { 0 },
            });
        })
    }
}

impl DevicePool {
    /// Calls `f` for every segment of the pool, in no particular order.
    pub fn for_each_segment(&self, mut f: impl FnMut(WalkSegment<'_>)) {
        self.segments.for_each(|addr, first| {
            let small = self.blocks.get(first).small;
            if self.expandable() {
                self.for_each_mapped_run(addr, |run, end| f(WalkSegment { addr: run, small, expandable: true, pool: self, first, end }));
            } else {
                f(WalkSegment { addr, small, expandable: false, pool: self, first, end: u64::MAX });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::leak_table;

    #[test]
    fn segments_are_tiled_by_their_blocks() {
        let mut pool = Box::new(DevicePool::new());
        assert!(pool.init(Strategy::Split, u64::MAX, leak_table));
        assert!(matches!(pool.alloc(3 << 19, SYNCED, Birth::default()), Alloc::NeedSegment { len, small: false } if len == 20 << 20));
        assert!(pool.add_segment(0x7000_0000_0000, 20 << 20, false));
        let Alloc::Hit { addr: a, .. } = pool.alloc(3 << 19, SYNCED, Birth::default()) else { panic!() };
        let Alloc::Hit { addr: b, .. } = pool.alloc(1 << 20, SYNCED, Birth { ns: 5, holder: 7 << 48 | 0x1234 }) else { panic!() };
        assert!(matches!(pool.alloc(1000, SYNCED, Birth::default()), Alloc::NeedSegment { small: true, .. }));
        assert!(pool.add_segment(0x7100_0000_0000, 2 << 20, true));
        let Alloc::Hit { .. } = pool.alloc(1000, SYNCED, Birth::default()) else { panic!() };
        pool.free(a, PENDING, 0).unwrap();
        let mut seen = vec![];
        pool.for_each_segment(|s| seen.push((s.addr, s.small, s.blocks().collect::<Vec<_>>())));
        seen.sort_by_key(|s| s.0);
        assert_eq!(seen.len(), 2);
        for (base, _, blocks) in &seen {
            assert_eq!(blocks[0].addr, *base);
            assert!(blocks.windows(2).all(|w| w[0].addr + w[0].size == w[1].addr));
        }
        let (_, small, big) = &seen[0];
        assert!(!small);
        assert_eq!(big.iter().map(|b| b.size).sum::<u64>(), 20 << 20);
        let live: Vec<_> = big.iter().filter(|b| b.allocated).map(|b| (b.addr, b.size, b.holder)).collect();
        assert_eq!(live, vec![(b, 1 << 20, 7 << 48 | 0x1234)]);
        let freed = big.iter().find(|b| b.addr == a).unwrap();
        assert!(freed.pending && !freed.allocated && freed.holder == 0);
        let (_, small, little) = &seen[1];
        assert!(*small);
        assert_eq!(little.iter().map(|b| b.size).sum::<u64>(), 2 << 20);
        assert_eq!(little.iter().filter(|b| b.allocated).map(|b| b.size).sum::<u64>(), 1024);
    }
}
