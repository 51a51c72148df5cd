//! The device pool over a fake address space, with an invariant check after every step and a
//! property test against a shadow of live blocks.

use super::*;
use crate::sim::leak_table;
use std::collections::BTreeMap;

const MB: u64 = 1 << 20;

struct Harness {
    pool: Box<DevicePool>,
    next_segment: u64,
    capacity: u64,
    mapped: u64,
}

impl Harness {
    fn new(strategy: Strategy, capacity: u64) -> Self {
        let mut pool = Box::new(DevicePool::new());
        assert!(pool.init(strategy, u64::MAX, leak_table));
        Harness { pool, next_segment: 0x7000_0000_0000, capacity, mapped: 0 }
    }

    /// What the glue does: follow the pool's requests until it hits or fails.
    fn alloc(&mut self, size: u64, tag: u64) -> Option<u64> {
        for _ in 0..4 {
            match self.pool.alloc(size, tag, Birth::at(0)) {
                Alloc::Hit { addr, size: got } => {
                    assert!(got >= size);
                    return Some(addr);
                }
                Alloc::NeedSync => self.pool.mark_all_synced(),
                Alloc::NeedMap { .. } => unreachable!("classic pools map no chunks"),
                Alloc::NeedSegment { len, small } => {
                    if self.mapped + len > self.capacity {
                        self.pool.mark_all_synced();
                        let mut out = [(0, 0); 64];
                        let n = self.pool.release_free_segments(u64::MAX, &mut out);
                        for &(_, l) in &out[..n] {
                            self.mapped -= l;
                        }
                        if self.mapped + len > self.capacity {
                            if n == 0 {
                                return None;
                            }
                            continue;
                        }
                    }
                    let addr = self.next_segment;
                    self.next_segment += len + (2 << 20);
                    self.mapped += len;
                    assert!(self.pool.add_segment(addr, len, small));
                }
                Alloc::Untracked => panic!("tables full in a small test"),
            }
            self.pool.check_invariants().unwrap();
        }
        None
    }
}

#[test]
fn split_pool_reuses_splits_and_merges() {
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    // 1.5 MiB: a medium request, carved from a 20 MiB segment (2 MiB and more get their own).
    let a = h.alloc(3 * MB / 2, SYNCED).unwrap();
    assert_eq!(h.pool.stats.segments_mapped, 1, "one 20 MB segment");
    let b = h.alloc(3 * MB / 2, SYNCED).unwrap();
    assert_eq!(h.pool.stats.segments_mapped, 1, "split from the same segment");
    assert_eq!(b + 3 * MB / 2, a, "carved from the segment's tail (Note [Frees that bypass us])");
    h.pool.free(a, SYNCED, 0).unwrap();
    h.pool.free(b, SYNCED, 0).unwrap();
    h.pool.check_invariants().unwrap();
    let c = h.alloc(18 * MB, SYNCED).unwrap();
    assert_eq!(c + 18 * MB, a + 3 * MB / 2, "merged back into one 20 MB block");
    assert_eq!(h.pool.stats.hits, 2);
    let small = h.alloc(1000, SYNCED).unwrap();
    let small2 = h.alloc(1000, SYNCED).unwrap();
    assert_eq!(small2 + 1024, small);
    assert_eq!(h.pool.stats.segments_mapped, 2, "small blocks come from their own 2 MB segment");
    h.pool.check_invariants().unwrap();
}

#[test]
fn huge_blocks_are_not_split_for_small_requests() {
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    let a = h.alloc(1024 * MB, SYNCED).unwrap();
    h.pool.free(a, SYNCED, 0);
    let b = h.alloc(100 * MB, SYNCED).unwrap();
    assert_ne!(b, a, "a 1 GiB free block is not cut for 100 MB");
    let c = h.alloc(1010 * MB, SYNCED).unwrap();
    assert_eq!(c, a, "within 20 MB of waste it is used whole");
    h.pool.check_invariants().unwrap();
}

#[test]
fn binned_pool_reuses_same_class_only() {
    let mut h = Harness::new(Strategy::Binned, 1 << 40);
    let a = h.alloc(5 * MB, SYNCED).unwrap();
    h.pool.free(a, SYNCED, 0);
    assert_eq!(h.alloc(4 * MB + 1, SYNCED), Some(a), "same class (5 MB)");
    let b = h.alloc(9 * MB, SYNCED).unwrap();
    h.pool.free(b, SYNCED, 0);
    assert_ne!(h.alloc(3 * MB, SYNCED), Some(b));
    assert_eq!(class_of(1000), 1024);
    assert_eq!(class_of(5 * MB + 1), 6 * MB);
    h.pool.check_invariants().unwrap();
}

#[test]
fn pending_blocks_need_a_sync_before_reuse() {
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    let a = h.alloc(32 * MB, SYNCED).unwrap();
    h.pool.free(a, PENDING, 0);
    assert_eq!(h.pool.alloc(32 * MB, SYNCED, Birth::at(0)), Alloc::NeedSync);
    h.pool.mark_all_synced();
    assert_eq!(h.pool.alloc(32 * MB, SYNCED, Birth::at(0)), Alloc::Hit { addr: a, size: 32 * MB });
    h.pool.check_invariants().unwrap();
}

#[test]
fn a_sync_covers_only_what_was_freed_before_it_began() {
    // A block freed on a stream while another thread's synchronization ran may still be used by
    // work queued after that synchronization began: it keeps its tag.
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    let s = stream_tag(0x1234);
    let a = h.alloc(32 * MB, s).unwrap();
    let b = h.alloc(32 * MB, s).unwrap();
    h.pool.free(a, s, 100);
    h.pool.free(b, PENDING, 200);
    assert_eq!(h.pool.oldest_unsynced_free(), Some(100));
    h.pool.mark_synced_before(150);
    assert_eq!(h.pool.oldest_unsynced_free(), Some(200), "freed after the synchronization began");
    assert_eq!(h.pool.alloc(32 * MB, SYNCED, Birth::at(300)), Alloc::Hit { addr: a, size: 32 * MB });
    assert_eq!(h.pool.alloc(32 * MB, SYNCED, Birth::at(300)), Alloc::NeedSync, "b waits for the next one");
    h.pool.mark_synced_before(250);
    assert_eq!(h.pool.oldest_unsynced_free(), None);
    h.pool.check_invariants().unwrap();
}

#[test]
fn stream_blocks_are_reused_on_their_stream_without_sync() {
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    let s1 = stream_tag(0x1234);
    let s2 = stream_tag(0x5678);
    let a = h.alloc(32 * MB, s1).unwrap();
    h.pool.free(a, s1, 0);
    assert_eq!(h.pool.alloc(32 * MB, s1, Birth::at(0)), Alloc::Hit { addr: a, size: 32 * MB });
    h.pool.free(a, s1, 0);
    assert!(matches!(h.pool.alloc(32 * MB, s2, Birth::at(0)), Alloc::NeedSegment { .. }), "another stream maps fresh memory");
    assert_eq!(stream_tag(0), 2);
    h.pool.check_invariants().unwrap();
}

#[test]
fn out_of_memory_releases_free_segments_and_retries() {
    let mut h = Harness::new(Strategy::Split, 100 * MB);
    let a = h.alloc(60 * MB, SYNCED).unwrap();
    h.pool.free(a, SYNCED, 0);
    let b = h.alloc(80 * MB, SYNCED).expect("the free 60 MB segment is given back first");
    assert_eq!(h.pool.stats.segments_released, 1);
    assert_eq!(h.alloc(90 * MB, SYNCED), None);
    h.pool.free(b, SYNCED, 0);
    h.pool.check_invariants().unwrap();
    assert_eq!(h.pool.cached_bytes(), 80 * MB);
}

/// Random programs over both strategies and mixed tags: no two live blocks overlap, every
/// live block lies inside a mapped segment, and the byte accounting always adds up.
#[test]
fn random_programs_keep_blocks_disjoint_and_accounted() {
    for seed in 1..=crate::sim::rounds(30, 3) as u64 {
        let strategy = if seed % 2 == 0 { Strategy::Split } else { Strategy::Binned };
        let mut h = Harness::new(strategy, 2048 * MB);
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut rand = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        for _ in 0..crate::sim::rounds(1500, 150) {
            let r = rand();
            if r % 3 != 0 || live.is_empty() {
                let size = match r % 4 {
                    0 => rand() % 4096 + 1,
                    1 => rand() % MB + 1,
                    2 => rand() % (32 * MB) + 1,
                    _ => rand() % (300 * MB) + 1,
                };
                let tag = [SYNCED, SYNCED, stream_tag(1), stream_tag(2)][(rand() % 4) as usize];
                if let Some(addr) = h.alloc(size, tag) {
                    if let Some((&lo, &ls)) = live.range(..=addr).next_back() {
                        assert!(lo + ls <= addr, "overlaps the block below");
                    }
                    if let Some((&hi, _)) = live.range(addr + 1..).next() {
                        assert!(addr + size <= hi, "overlaps the block above");
                    }
                    live.insert(addr, size);
                }
            } else {
                let k = *live.keys().nth((rand() % live.len() as u64) as usize).unwrap();
                live.remove(&k);
                let tag = [SYNCED, PENDING, stream_tag(1)][(rand() % 3) as usize];
                assert!(h.pool.free(k, tag, 0).is_some());
                assert!(h.pool.free(k, tag, 0).is_none(), "a second free is refused");
            }
            h.pool.check_invariants().unwrap();
            assert_eq!(h.pool.stats.reserved_bytes, h.mapped);
        }
    }
}

#[test]
fn the_first_segment_binds_the_pool_to_its_context() {
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    assert!(h.pool.serves(0) && h.pool.serves(0x10), "no owner yet: anyone may map the first segment");
    assert!(!h.pool.holds_memory(), "nothing to release: the device is never entered for it");
    assert!(h.pool.bind(0x10) && h.pool.add_segment(0x7000_0000_0000, 20 * MB, false));
    assert!(h.pool.holds_memory());
    assert!(!h.pool.serves(0x20) && !h.pool.serves(0), "a block here is unusable in another context");
    assert!(!h.pool.bind(0x20), "a segment a racing context mapped is refused");
    assert!(h.pool.bind(0x10));
    h.pool.forget_all();
    assert_eq!(h.pool.owner(), 0, "the context ended: the next one may own the pool");
    assert!(h.pool.is_ready() && !h.pool.holds_memory(), "forgotten: a release must not enter the device and make its context again");
    assert!(h.pool.serves(0x20) && h.pool.bind(0x20));
    h.pool.check_invariants().unwrap();
}

#[test]
fn a_segment_base_goes_out_only_as_the_whole_segment() {
    // Note [Frees that bypass us]: the driver frees a block pointer only at a segment's base.
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    let blocks: Vec<u64> = (0..4).map(|_| h.alloc(512 * 1024, SYNCED).unwrap()).collect();
    assert_eq!(h.pool.stats.segments_mapped, 2, "the head of a 2 MiB segment is not handed out beside live blocks");
    for &b in &blocks {
        assert!(!h.pool.has_segment(b), "block {b:#x} sits at a segment's base");
    }
    for b in blocks {
        h.pool.free(b, SYNCED, 0).unwrap();
        h.pool.check_invariants().unwrap();
    }
    let big = h.alloc(64 * MB, SYNCED).unwrap();
    assert!(h.pool.has_segment(big), "a whole segment goes out at its base");
    h.pool.free(big, SYNCED, 0).unwrap();
    let part = h.alloc(50 * MB, SYNCED).unwrap();
    assert_eq!(part, big + 14 * MB, "a cached segment is cut from its tail");
    h.pool.check_invariants().unwrap();
}

/// Note [Whole idle segments]: a small block kept from a freed large segment held the whole
/// segment, and a request for nearly all of the device then failed where alone it succeeds.
#[test]
fn a_whole_idle_segment_is_carved_only_when_new_memory_cannot_be_had() {
    let mut h = Harness::new(Strategy::Split, 1 << 30);
    let big = h.alloc(100 * MB, SYNCED).unwrap();
    h.pool.free(big, SYNCED, 0).unwrap();
    let kept = h.alloc(MB, SYNCED).unwrap();
    assert!(!(big..big + 100 * MB).contains(&kept), "new memory, not a piece of the idle 100 MiB");
    assert!(h.alloc(1000 * MB, SYNCED).is_some(), "the idle segment went back for it");
    // Where new memory cannot be had, the whole segment serves after all.
    let mut pool = Box::new(DevicePool::new());
    assert!(pool.init(Strategy::Split, u64::MAX, leak_table));
    assert!(pool.add_segment(0x7000_0000_0000, 100 * MB, false));
    assert!(matches!(pool.alloc(MB, SYNCED, Birth::at(0)), Alloc::NeedSegment { .. }));
    assert!(pool.whole_segment_fits(MB, SYNCED));
    assert!(!pool.whole_segment_fits(90 * MB, SYNCED), "one it would fill (10 MiB left) is no whole-segment fallback: it is a plain hit");
    assert!(!pool.whole_segment_fits(50 * MB, SYNCED), "nor one of half the segment: it holds back no more than it serves");
    assert!(matches!(pool.alloc_deciding(MB, SYNCED, Birth::at(0), true, true), Alloc::Hit { .. }));
    assert!(matches!(pool.alloc(90 * MB, SYNCED, Birth::at(0)), Alloc::Hit { .. }), "the rest is no whole segment now");
    pool.check_invariants().unwrap();
}

/// A free block whose rest is too small to split is handed out whole: the hit names the block's
/// size, the size its free will name (holders and traces count both; they must agree).
#[test]
fn a_hit_names_the_size_its_free_will_name() {
    let mut pool = Box::new(DevicePool::new());
    assert!(pool.init(Strategy::Split, u64::MAX, leak_table));
    assert!(matches!(pool.alloc(3 << 19, SYNCED, Birth::at(0)), Alloc::NeedSegment { len, .. } if len == 20 << 20));
    assert!(pool.add_segment(0x7000_0000_0000, 20 << 20, false));
    let Alloc::Hit { addr: a, .. } = pool.alloc(3 << 19, SYNCED, Birth::at(0)) else { panic!() };
    let Alloc::Hit { .. } = pool.alloc(3 << 19, SYNCED, Birth::at(0)) else { panic!() };
    pool.free(a, SYNCED, 0).unwrap();
    let Alloc::Hit { addr, size } = pool.alloc((3 << 19) - 4096, SYNCED, Birth::at(0)) else { panic!() };
    assert_eq!((addr, size), (a, 3 << 19), "the freed block, whole: a 4 KiB rest is not split off");
    assert_eq!(pool.free(addr, SYNCED, 0).map(|f| f.size), Some(size));
}

/// Note [Streams that end]: a block freed on a stream that ended waits for a synchronization
/// begun after its free, even for a stream given the same handle.
#[test]
fn blocks_freed_on_a_stream_that_ended_wait_for_a_synchronization() {
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    let (stream, other) = (stream_tag(0xfa4e_0010), stream_tag(0xfa4e_0020));
    let a = h.alloc(8 * MB, SYNCED).unwrap();
    let kept = h.alloc(8 * MB, SYNCED).unwrap();
    h.pool.free(a, stream, 5).unwrap();
    h.pool.stream_ended(other);
    let Alloc::Hit { addr, .. } = h.pool.alloc(8 * MB, stream, Birth::at(6)) else { panic!("another stream's end changes nothing") };
    assert_eq!(addr, a);
    h.pool.free(a, stream, 7).unwrap();
    h.pool.stream_ended(stream);
    h.pool.check_invariants().unwrap();
    assert_eq!(h.pool.alloc(8 * MB, stream, Birth::at(8)), Alloc::NeedSync, "the handle's next stream waits");
    h.pool.mark_synced_before(7);
    assert_eq!(h.pool.alloc(8 * MB, stream, Birth::at(8)), Alloc::NeedSync, "a synchronization begun before the free does not do");
    h.pool.mark_synced_before(8);
    let Alloc::Hit { addr, .. } = h.pool.alloc(8 * MB, SYNCED, Birth::at(9)) else { panic!("after one begun later, anyone may") };
    assert_eq!(addr, a);
    h.pool.free(addr, SYNCED, 10).unwrap();
    h.pool.free(kept, SYNCED, 10).unwrap();
    h.pool.check_invariants().unwrap();
}

/// A segment with no live block whose free parts wait for different synchronizations counts as
/// releasable whole (cudaMemGetInfo reads it as free), and a request for all of it gets it.
#[test]
fn a_free_segment_in_parts_of_different_tags_is_releasable_whole() {
    let mut h = Harness::new(Strategy::Split, 1 << 40);
    let a = h.alloc(21 * MB, SYNCED).unwrap();
    let total = h.mapped;
    assert!(total > 21 * MB, "a segment with a free tail beside the block");
    assert_eq!(h.pool.releasable_bytes(), 0, "a live block in the one segment");
    h.pool.free(a, PENDING, 1).unwrap();
    h.pool.check_invariants().unwrap();
    assert_eq!(h.pool.releasable_bytes(), total, "the pending block and the synchronized tail, together");
    let mut out = [(0, 0); 4];
    assert_eq!(h.pool.release_free_segments(u64::MAX, &mut out), 0, "not whole until synchronized");
    h.pool.mark_all_synced();
    assert_eq!(h.pool.release_free_segments(u64::MAX, &mut out), 1);
    assert_eq!(out[0].1, total);
}

/// Note [Whole idle segments], through a segment that is not whole when the small block comes:
/// what a larger request left of it is not carved for one under half the segment that would
/// leave more than HUGE_WASTE, unless new memory cannot be had; freed, the segment is whole again.
#[test]
fn a_segments_leftover_is_carved_only_when_new_memory_cannot_be_had() {
    let mut h = Harness::new(Strategy::Split, 1 << 30);
    let big = h.alloc(100 * MB, SYNCED).unwrap();
    h.pool.free(big, SYNCED, 0).unwrap();
    let mid = h.alloc(60 * MB, SYNCED).unwrap();
    assert!((big..big + 100 * MB).contains(&mid), "half the segment or more carves it");
    let kept = h.alloc(MB, SYNCED).unwrap();
    assert!(!(big..big + 100 * MB).contains(&kept), "new memory, not a piece of the 40 MiB left");
    let near_full = h.alloc(30 * MB, SYNCED).unwrap();
    assert!((big..big + 100 * MB).contains(&near_full), "one that leaves 20 MiB or less carves it");
    h.pool.check_invariants().unwrap();
    // Where new memory cannot be had, the leftover serves after all.
    let mut pool = Box::new(DevicePool::new());
    assert!(pool.init(Strategy::Split, u64::MAX, leak_table));
    assert!(pool.add_segment(0x7000_0000_0000, 100 * MB, false));
    assert!(matches!(pool.alloc(60 * MB, SYNCED, Birth::at(0)), Alloc::Hit { .. }));
    assert!(matches!(pool.alloc(MB, SYNCED, Birth::at(0)), Alloc::NeedSegment { .. }));
    assert!(pool.whole_segment_fits(MB, SYNCED));
    assert!(matches!(pool.alloc_deciding(MB, SYNCED, Birth::at(0), true, true), Alloc::Hit { .. }));
    pool.check_invariants().unwrap();
}
