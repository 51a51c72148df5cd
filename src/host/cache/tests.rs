//! The cache policy over plain numbers: hits, splits, bounds, expiry, calloc's zero rules.

use super::*;
use crate::ranges::RangeList;

const MB: usize = 1 << 20;
const MS: u64 = 1_000_000;

fn limits() -> CacheLimits {
    CacheLimits {
        max_blocks: 4,
        max_bytes: 1024 * MB,
        follow_blocks: false,
        follow_bytes: false,
        min_blocks: 0,
        min_bytes: 0,
        release_after_ns: 1000 * MS,
        expire_after_ns: 10_000 * MS,
        max_waste_percent: Some(25),
        max_hot_bytes: usize::MAX,
    }
}

#[test]
fn reuses_hot_block_untouched() {
    let mut c = BlockCache::new(limits());
    assert!(c.insert(0x1000_0000, 80 * MB, PageFacts::zeroed(false), 0, Live::default()).accepted);
    let t = c.take(80 * MB, 4096, 0).unwrap();
    assert_eq!((t.addr, t.len, t.was_released), (0x1000_0000, 80 * MB, false));
    assert_eq!(c.cached_bytes(), 0);
    c.check_invariants().unwrap();
}

#[test]
fn a_growing_block_takes_the_front_of_the_cached_block_after_it() {
    // Note [Growing over the cache]: the rest stays cached where it was; a block too short, of
    // other advice, or not there is no answer.
    let mut c = BlockCache::new(limits());
    assert!(c.insert(0x1000_0000, 8 * MB, PageFacts::DIRTY, 0, Live::default()).accepted);
    assert!(c.take_following(0x1000_0000, 16 * MB, 0).is_none(), "too short");
    assert!(c.take_following(0x1000_0000, MB, 7).is_none(), "other advice");
    assert!(c.take_following(0x1000_0000 + 4096, MB, 0).is_none(), "none starts there");
    let t = c.take_following(0x1000_0000, 3 * MB, 0).unwrap();
    assert_eq!((t.addr, t.len, t.tail_kept), (0x1000_0000, 3 * MB, Some(Range { addr: 0x1000_0000 + 3 * MB, len: 5 * MB })));
    assert_eq!((c.block_count(), c.cached_bytes()), (1, 5 * MB));
    c.check_invariants().unwrap();
    let t = c.take_following(0x1000_0000 + 3 * MB, 5 * MB, 0).unwrap();
    assert_eq!((t.len, t.tail_kept), (5 * MB, None), "the whole of it");
    assert_eq!((c.block_count(), c.cached_bytes()), (0, 0));
    c.check_invariants().unwrap();
}

#[test]
fn best_fit_and_alignment() {
    let mut c = BlockCache::new(limits());
    c.insert(0x1000_0000, 100 * MB, PageFacts::zeroed(false), 0, Live::default());
    c.insert(0x2000_0000 + 4096, 90 * MB, PageFacts::zeroed(false), 1, Live::default());
    c.insert(0x3000_0000, 82 * MB, PageFacts::zeroed(false), 2, Live::default());
    assert_eq!(c.take(80 * MB, 4096, 0).unwrap().addr, 0x3000_0000);
    // 0x2000_1000 is not 64 KiB aligned, so the 100 MB block serves this one.
    assert_eq!(c.take(85 * MB, 65536, 0).unwrap().addr, 0x1000_0000);
    c.check_invariants().unwrap();
}

#[test]
fn never_a_huge_block_for_a_small_request() {
    let mut c = BlockCache::new(limits());
    c.insert(0x4000_0000, 1024 * MB, PageFacts::zeroed(false), 0, Live::default());
    let t = c.take(8 * MB, 4096, 0).unwrap();
    assert_eq!(t.len, 8 * MB);
    assert_eq!(t.tail_kept, Some(Range { addr: 0x4000_0000 + 8 * MB, len: 1016 * MB }));
    assert_eq!(c.cached_bytes(), 1016 * MB);
    // A short tail within max_waste_percent goes out with the block.
    let t = c.take(1014 * MB, 4096, 0).unwrap();
    assert_eq!((t.len, t.tail_kept), (1016 * MB, None), "2 MB of 1016 is within 25%");
    c.check_invariants().unwrap();
    c.insert(0x9000_0000, 12 * MB, PageFacts::zeroed(false), 0, Live::default());
    let t = c.take(8 * MB, 4096, 0).unwrap();
    assert_eq!(t.tail_kept, Some(Range { addr: 0x9000_0000 + 8 * MB, len: 4 * MB }));
    // Past it, it is split off and kept, though shorter than any request.
    c.insert(0xa000_0000, 11 * MB, PageFacts::zeroed(false), 0, Live::default());
    let t = c.take(8 * MB, 4096, 0).unwrap();
    assert_eq!((t.len, t.tail_kept), (8 * MB, Some(Range { addr: 0xa000_0000 + 8 * MB, len: 3 * MB })));
    c.check_invariants().unwrap();
}

/// A calloc's block carries out no rest that may hold data: zeroed, it would be dropped and
/// faulted in again by whoever next reaches its pages. A known-zero rest costs nothing to carry.
#[test]
fn a_calloc_splits_off_any_rest_that_may_hold_data() {
    let mut c = BlockCache::new(limits());
    c.insert(0x9000_0000, 9 * MB, PageFacts::zeroed(false), 0, Live::default());
    let t = c.take_zeroed(8 * MB, 4096, 0).unwrap();
    assert_eq!((t.len, t.tail_kept), (8 * MB, Some(Range { addr: 0x9000_0000 + 8 * MB, len: MB })), "1 MB of 9 would go out with a malloc's block");
    c.insert(0xa000_0000, 9 * MB, PageFacts::zeroed(true), 0, Live::default());
    let t = c.take_zeroed(8 * MB, 4096, 0).unwrap();
    assert_eq!((t.len, t.tail_kept), (9 * MB, None), "known zero: carried out");
    c.insert(0xb000_0000, 8 * MB, PageFacts::zeroed(false), 0, Live::default());
    assert_eq!(c.take_zeroed(8 * MB, 4096, 0).unwrap().tail_kept, None, "an exact fit");
    c.check_invariants().unwrap();
}

#[test]
fn a_miss_gathers_the_largest_blocks() {
    let mut c = BlockCache::new(limits());
    c.insert(0x1000_0000, 8 * MB, PageFacts::zeroed(false), 0, Live::default());
    c.insert(0x2000_0000, 40 * MB, PageFacts::zeroed(true), 1, Live::default());
    c.insert(0x3000_0000, 90 * MB, PageFacts::zeroed(false), 2, Live::default());
    assert!(c.take(100 * MB, 4096, 0).is_none());
    let parts = c.take_parts(100 * MB, 0);
    let got: Vec<Part> = parts.iter().copied().collect();
    assert_eq!(got, [Part { addr: 0x3000_0000, len: 90 * MB, facts: PageFacts::DIRTY }, Part { addr: 0x2000_0000, len: 10 * MB, facts: PageFacts::FRESH }]);
    assert_eq!(parts.total_bytes(), 100 * MB);
    assert_eq!(parts.rest_kept, Some(Range { addr: 0x2000_0000 + 10 * MB, len: 30 * MB }), "the rest of the cut block stays");
    assert_eq!(c.cached_bytes(), 38 * MB);
    c.check_invariants().unwrap();
    // A rest shorter than any request stays cached too.
    let parts = c.take_parts(36 * MB, 0);
    assert_eq!(parts.total_bytes(), 36 * MB);
    assert_eq!(parts.rest_kept, Some(Range { addr: 0x1000_0000 + 6 * MB, len: 2 * MB }));
    assert_eq!(c.cached_bytes(), 2 * MB);
    // All that is cached is not enough: all of it.
    assert_eq!(c.take_parts(8 * MB, 0).total_bytes(), 2 * MB);
    assert!(c.take_parts(MB, 0).is_empty());
    // At most MAX_PARTS blocks.
    let mut c = BlockCache::new(CacheLimits { max_blocks: 16, ..limits() });
    for i in 0..12 {
        c.insert(0x1_0000_0000 + i * 0x1000_0000, 8 * MB, PageFacts::zeroed(false), i as u64, Live::default());
    }
    assert_eq!(c.take_parts(200 * MB, 0).total_bytes(), MAX_PARTS * 8 * MB);
    c.check_invariants().unwrap();
}

#[test]
fn freed_neighbours_merge_and_requests_take_what_they_need() {
    let mut c = BlockCache::new(limits());
    let ins = c.insert(0x1000_0000, 8 * MB, PageFacts::zeroed(true), 0, Live::default());
    assert_eq!((ins.block, ins.absorbed), (Range { addr: 0x1000_0000, len: 8 * MB }, [None, None]));
    c.insert(0x1000_0000 + 16 * MB, 8 * MB, PageFacts::zeroed(true), 1, Live::default());
    // The block between them joins both.
    let ins = c.insert(0x1000_0000 + 8 * MB, 8 * MB, PageFacts::zeroed(false), 2, Live::default());
    assert!(ins.accepted);
    assert_eq!(ins.block, Range { addr: 0x1000_0000, len: 24 * MB });
    let mut absorbed: Vec<usize> = ins.absorbed.iter().flatten().copied().collect();
    absorbed.sort();
    assert_eq!(absorbed, [0x1000_0000, 0x1000_0000 + 16 * MB]);
    assert_eq!((c.block_count(), c.cached_bytes()), (1, 24 * MB));
    let b = c.blocks().next().unwrap();
    assert!(!b.facts.zero && b.state == BlockState::Hot && b.idle_since_ns == 2, "zero only if every part was; freed now");
    // A request takes what it needs; a rest past max_waste_percent stays cached.
    let t = c.take(16 * MB, 4096, 0).unwrap();
    assert_eq!((t.addr, t.len, t.tail_kept), (0x1000_0000, 16 * MB, Some(Range { addr: 0x1000_0000 + 16 * MB, len: 8 * MB })));
    // A neighbour being released is left alone.
    c.insert(0x5000_0000, 8 * MB, PageFacts::zeroed(false), 3, Live::default());
    let due = c.due(3 + 1000 * MS, false);
    assert_eq!(due.release.len(), 2);
    assert!(!c.insert(0x5000_0000 + 8 * MB, 8 * MB, PageFacts::zeroed(false), 4, Live::default()).absorbed.iter().any(Option::is_some));
    c.check_invariants().unwrap();
}

#[test]
fn limits_evict_oldest_first() {
    let mut c = BlockCache::new(CacheLimits { max_bytes: 200 * MB, ..limits() });
    c.insert(0x1000_0000, 80 * MB, PageFacts::zeroed(false), 10, Live::default());
    c.insert(0x2000_0000, 80 * MB, PageFacts::zeroed(false), 20, Live::default());
    let ins = c.insert(0x3000_0000, 80 * MB, PageFacts::zeroed(false), 30, Live::default());
    assert!(ins.accepted);
    assert_eq!(c.evicted(&ins), [Range { addr: 0x1000_0000, len: 80 * MB }]);
    assert!(!c.insert(0x5000_0000, 300 * MB, PageFacts::zeroed(false), 40, Live::default()).accepted, "bigger than the whole cache");
    c.check_invariants().unwrap();
    let mut c = BlockCache::new(limits());
    for i in 0..6 {
        c.insert(0x1000_0000 * (i + 1), 8 * MB, PageFacts::zeroed(false), i as u64, Live::default());
    }
    assert_eq!(c.block_count(), 4);
    assert!(c.blocks().all(|b| b.idle_since_ns >= 2));
    let mut off = BlockCache::new(CacheLimits { max_blocks: 0, ..limits() });
    assert!(!off.insert(0x1000_0000, 8 * MB, PageFacts::zeroed(false), 0, Live::default()).accepted);
}

#[test]
fn idle_blocks_are_released_then_expired() {
    let mut c = BlockCache::new(limits());
    c.insert(0x1000_0000, 80 * MB, PageFacts::zeroed(false), 0, Live::default());
    assert_eq!(c.next_deadline_ns(), Some(1000 * MS));
    assert!(c.due(999 * MS, false).release.is_empty());
    let due = c.due(1000 * MS, false);
    assert_eq!(due.release.len(), 1);
    assert!(c.take(80 * MB, 4096, 0).is_none(), "not while the madvise runs");
    assert_eq!(c.release_done(0x1000_0000, false), None);
    assert_eq!(c.next_deadline_ns(), Some(10_000 * MS));
    let t = c.take(80 * MB, 4096, 0).unwrap();
    assert!(t.was_released);
    c.insert(t.addr, t.len, PageFacts::zeroed(false), 2000 * MS, Live::default());
    c.due(3000 * MS, false);
    c.release_done(t.addr, false);
    let due = c.due(12_000 * MS, false);
    assert_eq!(due.expire.len(), 1);
    assert_eq!(c.block_count(), 0);
    assert_eq!(c.next_deadline_ns(), None);
    c.check_invariants().unwrap();
}

#[test]
fn calloc_discards_only_big_blocks_mostly_not_resident() {
    assert!(zero_by_discard(64 * MB, 0, MB), "nothing known: drop the pages (a fresh mapping's cost at most)");
    assert!(zero_by_discard(64 * MB, 1, MB), "one dense finding could be a preempted drop");
    assert!(!zero_by_discard(64 * MB, DENSE_VOTES, MB), "found mostly resident twice: write zeros");
    assert!(!zero_by_discard(MB - 4096, 0, MB), "small: write zeros");
    assert_eq!(votes_after(0, Some(true)), 1);
    assert_eq!(votes_after(1, Some(true)), DENSE_VOTES);
    assert_eq!(votes_after(DENSE_VOTES, Some(true)), DENSE_VOTES);
    assert_eq!(votes_after(1, Some(false)), 0, "a sparse finding starts over");
    assert_eq!(votes_after(DENSE_VOTES, None), DENSE_VOTES, "writing zeros says nothing");
}

/// The writers' share: a block sampled as barely written is dropped only while fewer than a
/// quarter of the owners of late wrote theirs; each finding moves the share a quarter of the way.
#[test]
fn a_barely_written_block_is_dropped_only_while_few_owners_write() {
    assert!(drop_unwritten(0), "nothing known yet: as before, the sample decides");
    assert_eq!(writers_after(0, true), WRITERS_ONE / 4);
    assert!(!drop_unwritten(WRITERS_ONE / 4), "a quarter wrote: a write costs less than the faults a drop would bring");
    assert_eq!(writers_after(WRITERS_ONE, false), WRITERS_ONE * 3 / 4);
    assert_eq!(writers_after(u16::MAX, true), WRITERS_ONE, "never past one");
    // A program that filled its blocks turns sparse: four findings, then drops.
    let mut share = WRITERS_ONE;
    let writes = (0..8).take_while(|_| {
        share = writers_after(share, false);
        !drop_unwritten(share)
    });
    assert_eq!(writes.count(), 4);
    // Owners of whom a quarter only read (a mixed program): the share stays high.
    let mut share = 0;
    for k in 0..64 {
        share = writers_after(share, k % 4 != 0);
        if k >= 8 {
            assert!(!drop_unwritten(share), "finding {k}: share {share}");
        }
    }
}

#[test]
fn calloc_goes_back_to_dropping_only_after_two_writes_that_faulted() {
    // Writing from the first two dense findings on; resident writes give one vote of slack.
    let mut votes = votes_after(votes_after(0, Some(true)), Some(true));
    assert!(!zero_by_discard(64 * MB, votes, MB));
    votes = votes_after_write(votes_after_write(votes, true), true);
    assert_eq!(votes, MOST_VOTES, "saturates");
    votes = votes_after_write(votes, false);
    assert!(!zero_by_discard(64 * MB, votes, MB), "one slow write (a loaded machine) changes nothing");
    votes = votes_after_write(votes, true);
    assert_eq!(votes, MOST_VOTES, "and the next resident one restores the slack");
    votes = votes_after_write(votes_after_write(votes, false), false);
    assert!(zero_by_discard(64 * MB, votes, MB), "two in a row: the program's callocs turned sparse");
}

#[test]
fn known_zero_follows_the_block_and_its_split_tail() {
    let mut c = BlockCache::new(limits());
    c.insert(0x1000_0000, 100 * MB, PageFacts::zeroed(true), 0, Live::default());
    let t = c.take(10 * MB, 4096, 0).unwrap();
    assert!(t.facts.zero && t.tail_kept.is_some());
    assert!(c.take(90 * MB, 4096, 0).unwrap().facts.zero, "the tail of a zero block is zero");
    c.insert(0x2000_0000, 10 * MB, PageFacts::zeroed(false), 1, Live::default());
    assert!(!c.take(10 * MB, 4096, 0).unwrap().facts.zero, "a freed block is never known zero");
}

#[test]
fn bounds_follow_the_live_peak_within_floor_and_ceiling() {
    let follow = CacheLimits { max_blocks: 100, max_bytes: 4096 * MB, follow_blocks: true, follow_bytes: true, min_blocks: 16, min_bytes: 1024 * MB, ..limits() };
    let mut c = BlockCache::new(follow);
    assert_eq!(c.bounds(), (16, 1024 * MB), "the floor before any free");
    // 64 live blocks of 40 MB: all of them fit when freed.
    let live = Live { bytes: 64 * 40 * MB, blocks: 64 };
    for i in 0..64 {
        let ins = c.insert(0x1_0000_0000 + i * 64 * MB, 40 * MB, PageFacts::zeroed(false), i as u64, live);
        assert!(ins.accepted && ins.evicted == 0, "block {i}");
    }
    assert_eq!(c.bounds(), (64, 64 * 40 * MB));
    c.check_invariants().unwrap();
    // The ceiling holds whatever the peak.
    c.insert(0x9_0000_0000, 40 * MB, PageFacts::DIRTY, 100, Live { bytes: 10_000 * MB, blocks: 500 });
    assert_eq!(c.bounds(), (100, 4096 * MB));
    // Two quiet windows later the peak is forgotten: back to the floor.
    let later = 2 * PEAK_WINDOW_NS + 200;
    let ins = c.insert(0xa_0000_0000, 40 * MB, PageFacts::DIRTY, later, Live { bytes: 40 * MB, blocks: 1 });
    assert_eq!(c.bounds(), (16, 1024 * MB));
    assert_eq!(c.block_count(), 16);
    assert!(c.cached_bytes() <= 1024 * MB && ins.accepted && ins.evicted == 50);
    c.check_invariants().unwrap();
    // A bound the user set is exact.
    let mut fixed = BlockCache::new(CacheLimits { max_blocks: 2, ..follow });
    fixed.set_limits(CacheLimits { follow_blocks: false, ..*fixed.limits() });
    for i in 0..4 {
        fixed.insert(0x1_0000_0000 + i * 64 * MB, 40 * MB, PageFacts::zeroed(false), i as u64, live);
    }
    assert_eq!(fixed.block_count(), 2);
}

#[test]
fn deferred_unmaps_are_bounded_and_taken_once() {
    let mut c = BlockCache::new(limits());
    for i in 0..MAX_DEFERRED {
        assert!(c.defer_unmap(Range { addr: 0x1_0000_0000 + i * 0x100_0000, len: 4 * MB }));
    }
    assert!(!c.defer_unmap(Range { addr: 0x9_0000_0000, len: 4 * MB }), "full: the caller unmaps");
    assert_eq!(c.deferred_bytes(), MAX_DEFERRED * 4 * MB);
    c.check_invariants().unwrap();
    assert_eq!(c.take_deferred().len(), MAX_DEFERRED);
    assert_eq!((c.deferred_bytes(), c.take_deferred().len()), (0, 0));
    c.check_invariants().unwrap();
}

#[test]
fn trim_during_release_unmaps_when_release_returns() {
    let mut c = BlockCache::new(limits());
    c.insert(0x1000_0000, 80 * MB, PageFacts::zeroed(false), 0, Live::default());
    c.insert(0x2000_0000, 80 * MB, PageFacts::zeroed(false), 5000 * MS, Live::default());
    c.due(1000 * MS, false);
    let drained = c.drain();
    assert_eq!(drained.len(), 1);
    assert_eq!(c.release_done(0x1000_0000, false), Some(Range { addr: 0x1000_0000, len: 80 * MB }));
    assert_eq!(c.cached_bytes(), 0);
    c.check_invariants().unwrap();
}

#[test]
fn waste_follows_how_many_blocks_are_live() {
    let mut c = BlockCache::new(CacheLimits { max_waste_percent: None, min_blocks: 16, max_blocks: 64, ..limits() });
    // Few live blocks: a 100 MB block serves 60 MB whole (40% unused).
    c.insert(0x1000_0000, 100 * MB, PageFacts::DIRTY, 0, Live { bytes: 400 * MB, blocks: 4 });
    assert_eq!(c.waste_percent(), WASTE_FEW_LIVE);
    let t = c.take(60 * MB, 4096, 0).unwrap();
    assert_eq!((t.len, t.tail_kept), (100 * MB, None));
    // Many: the rest is split off and stays cached.
    c.insert(t.addr, t.len, PageFacts::DIRTY, 1, Live { bytes: 2000 * MB, blocks: 64 });
    assert_eq!(c.waste_percent(), WASTE_MANY_LIVE);
    let t = c.take(60 * MB, 4096, 0).unwrap();
    assert_eq!((t.len, t.tail_kept), (60 * MB, Some(Range { addr: 0x1000_0000 + 60 * MB, len: 40 * MB })));
    // A value the user set holds either way.
    let c = BlockCache::new(CacheLimits { max_waste_percent: Some(0), min_blocks: 16, ..limits() });
    assert_eq!(c.waste_percent(), 0);
}

#[test]
fn a_block_advised_by_one_holder_goes_to_that_holder_first() {
    let mut c = BlockCache::new(limits());
    let advised = PageFacts { advised_by: 7, ..PageFacts::DIRTY };
    c.insert(0x1000_0000, 8 * MB, advised, 0, Live::default());
    c.insert(0x3000_0000, 16 * MB, PageFacts::DIRTY, 1, Live::default());
    // Holder 9 gets the plain block though it wastes more (its rest stays cached), then the rest.
    assert_eq!(c.take(8 * MB, 4096, 9).unwrap().addr, 0x3000_0000);
    assert_eq!(c.take(8 * MB, 4096, 9).unwrap().addr, 0x3000_0000 + 8 * MB);
    // Holder 7 gets its own block back, advice and all, before a plain one.
    c.insert(0x7000_0000, 8 * MB, PageFacts::DIRTY, 2, Live::default());
    let t = c.take(8 * MB, 4096, 7).unwrap();
    assert_eq!((t.addr, t.facts.advised_by), (0x1000_0000, 7));
    c.insert(t.addr, t.len, t.facts, 3, Live::default());
    assert_eq!(c.take(8 * MB, 4096, 9).unwrap().addr, 0x7000_0000, "holder 9: the plain one");
    // Another holder's advised block never serves holder 9: a miss (a fresh mapping) instead.
    assert!(c.take(8 * MB, 4096, 9).is_none());
    assert_eq!(c.take(8 * MB, 4096, 7).unwrap().facts.advised_by, 7);
    // Gathering takes only what fits.
    c.insert(0x5000_0000, 8 * MB, advised, 4, Live::default());
    assert!(c.take_parts(8 * MB, 9).is_empty());
    assert_eq!(c.take_parts(8 * MB, 7).total_bytes(), 8 * MB);
}

#[test]
fn facts_merge_as_the_pages_do() {
    let a = PageFacts { zero: true, votes: 2, advised_by: 7, kept_all: true, kept_any: true };
    let b = PageFacts { zero: false, votes: 1, advised_by: 0, kept_all: false, kept_any: false };
    let m = a.merge(b);
    assert_eq!(m, PageFacts { zero: false, votes: 1, advised_by: 7, kept_all: false, kept_any: true });
    assert_eq!(a.merge(PageFacts { advised_by: 8, ..a }).advised_by, MIXED_ADVICE);
    assert!(!PageFacts { advised_by: MIXED_ADVICE, ..b }.fits(7) && b.fits(7) && a.fits(7) && !a.fits(8));
    let mut c = BlockCache::new(limits());
    c.insert(0x1000_0000, 8 * MB, PageFacts { votes: 2, advised_by: 7, ..PageFacts::DIRTY }, 0, Live::default());
    let ins = c.insert(0x1000_0000 + 8 * MB, 8 * MB, a, 1, Live::default());
    assert!(ins.accepted && ins.absorbed[0].is_some());
    let t = c.take(16 * MB, 4096, 7).unwrap();
    assert_eq!((t.facts.votes, t.facts.advised_by, t.facts.kept_all, t.facts.kept_any), (2, 7, false, true));
    // Neighbours with different advice stay apart.
    c.insert(0x3000_0000, 8 * MB, PageFacts::DIRTY, 2, Live::default());
    assert!(c.insert(0x3000_0000 + 8 * MB, 8 * MB, a, 3, Live::default()).absorbed.iter().all(Option::is_none));
}

#[test]
fn a_fork_keeps_each_block_once_and_releases_forget_residency() {
    let mut c = BlockCache::new(limits());
    c.insert(0x1000_0000, 8 * MB, PageFacts::DIRTY, 0, Live::default());
    c.insert(0x3000_0000, 8 * MB, PageFacts::DIRTY, 0, Live::default());
    let kept = |c: &mut BlockCache| {
        let mut out = Vec::new();
        c.keep_from_fork(|r| out.push(r.addr));
        out
    };
    assert_eq!(kept(&mut c).len(), 2);
    assert_eq!(kept(&mut c).len(), 0, "kept since the last fork: no second madvise");
    c.insert(0x5000_0000, 8 * MB, PageFacts { votes: 2, ..PageFacts::DIRTY }, 0, Live::default());
    assert_eq!(kept(&mut c), [0x5000_0000]);
    let t = c.take(8 * MB, 4096, 0).unwrap();
    assert!(t.facts.kept_all && t.facts.kept_any, "the taker readmits it");
    let due = c.due(2000 * MS, false);
    for r in due.release.iter() {
        assert_eq!(c.release_done(r.addr, false), None);
    }
    assert!(c.blocks().all(|b| b.facts.votes == 0), "MADV_FREE'd pages may go at any time");
}

#[test]
fn a_lower_ceiling_evicts_the_oldest_first() {
    let mut c = BlockCache::new(limits());
    for i in 0..3u64 {
        c.insert(0x1000_0000 * (i as usize + 1), 100 * MB, PageFacts::DIRTY, i, Live::default());
    }
    let out = c.shrink_to(150 * MB);
    assert_eq!(out.iter().map(|r| r.addr).collect::<Vec<_>>(), [0x1000_0000, 0x2000_0000]);
    assert_eq!(c.cached_bytes(), 100 * MB);
    assert!(c.shrink_to(100 * MB).is_empty());
    c.check_invariants().unwrap();
}

/// The store's structures (bins, free order, address index) over random programs, against a
/// model that recomputes every answer from the list of blocks: takes are best fits (hot on a
/// tie), merges join exactly the neighbours, evictions take the least recently freed, and no
/// byte is lost or counted twice.
#[test]
fn random_programs_keep_every_structure_and_answer_as_a_scan_would() {
    const PAGE: usize = 4096;
    for seed in 1..=crate::sim::rounds(24, 4) as u64 {
        let limits = CacheLimits {
            max_blocks: [3, 16, 200, CAPACITY][seed as usize % 4],
            max_bytes: if seed % 3 == 0 { 64 * MB } else { 1 << 40 },
            max_waste_percent: Some([0, 10, 50][seed as usize % 3]),
            release_after_ns: 100 * MS,
            expire_after_ns: 400 * MS,
            ..limits()
        };
        let mut c = BlockCache::new(limits);
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Address space handed out in slices of a big arena; `owned` are ranges the program
        // holds (never cached), so inserts never overlap what is cached.
        let mut owned: Vec<(usize, usize)> = Vec::new();
        let mut cursor = 0x10_0000_0000usize;
        let mut now = 0u64;
        for _ in 0..crate::sim::rounds(2000, 200) {
            now += next() % (20 * MS);
            let before: Vec<CachedBlock> = c.blocks().copied().collect();
            match next() % 10 {
                0..=3 => {
                    // Free a block: a held one (perhaps next to cached ones) or a fresh range.
                    let (addr, len) = if !owned.is_empty() && next() % 2 == 0 {
                        owned.swap_remove(next() as usize % owned.len())
                    } else {
                        let len = (1 + next() as usize % 64) * 16 * PAGE;
                        cursor += len + if next() % 3 == 0 { 0 } else { 16 * PAGE };
                        (cursor - len, len)
                    };
                    // A third carry another holder's huge-page advice: holder 9 never gets them.
                    let facts = PageFacts { zero: next() % 4 == 0, advised_by: if next() % 3 == 0 { 7 } else { 0 }, ..PageFacts::DIRTY };
                    let ins = c.insert(addr, len, facts, now, Live { bytes: 0, blocks: next() as usize % 300 });
                    let evicted: Vec<Range> = c.evicted(&ins).to_vec();
                    let absorbed: Vec<usize> = ins.absorbed.iter().flatten().copied().collect();
                    // The merged block is the freed one and exactly the absorbed neighbours.
                    let merged_len: usize = len + absorbed.iter().map(|a| before.iter().find(|b| b.addr == *a).unwrap().len).sum::<usize>();
                    assert_eq!(ins.block.len, merged_len, "seed {seed}");
                    assert!(ins.block.addr <= addr && addr + len <= ins.block.addr + ins.block.len);
                    for a in &absorbed {
                        let b = before.iter().find(|b| b.addr == *a).unwrap();
                        assert_ne!(b.state, BlockState::Releasing, "a releasing block never merges");
                    }
                    // Evicted blocks are the least recently freed of those that could go.
                    let stayed = c.blocks().filter(|b| b.addr != ins.block.addr || !ins.accepted);
                    let youngest_evicted = evicted.iter().map(|r| before.iter().find(|b| b.addr == r.addr).unwrap().idle_since_ns).max();
                    if let Some(y) = youngest_evicted {
                        for b in stayed.filter(|b| b.state != BlockState::Releasing) {
                            assert!(b.idle_since_ns >= y, "seed {seed}: evicted a block younger than one kept");
                        }
                    }
                    if ins.accepted {
                        let b = c.blocks().find(|b| b.addr == ins.block.addr).unwrap();
                        assert_eq!((b.len, b.state, b.idle_since_ns), (ins.block.len, BlockState::Hot, now));
                    }
                    let kept: usize = c.blocks().map(|b| b.len).sum();
                    let went: usize = evicted.iter().map(|r| r.len).sum::<usize>() + if ins.accepted { 0 } else { ins.block.len };
                    assert_eq!(kept + went, before.iter().map(|b| b.len).sum::<usize>() + len, "seed {seed}: bytes lost");
                }
                4..=6 => {
                    let need = (1 + next() as usize % 80) * 16 * PAGE;
                    let align = if next() % 4 == 0 { 2 * MB } else { 64 << 10 };
                    // The model: least waste among fitting, aligned, available blocks; hot on a tie.
                    let best = before
                        .iter()
                        .filter(|b| b.state != BlockState::Releasing && b.len >= need && b.addr % align == 0 && b.facts.fits(9))
                        .map(|b| (b.len - need, b.state == BlockState::Released))
                        .min();
                    let t = c.take(need, align, 9);
                    match (best, t) {
                        (None, None) => {}
                        (Some((waste, released)), Some(t)) => {
                            let whole = t.len + t.tail_kept.map_or(0, |r| r.len);
                            assert_eq!((whole - need, t.was_released), (waste, released), "seed {seed}: not the best fit");
                            assert!(t.addr % align == 0 && t.len >= need);
                            assert_eq!(t.facts.advised_by, 0, "seed {seed}: another holder's advice");
                            owned.push((t.addr, t.len));
                        }
                        (b, t) => panic!("seed {seed}: model {b:?}, cache {t:?}"),
                    }
                }
                7 => {
                    let due = c.due(now, next() % 2 == 0);
                    for r in due.release.iter() {
                        if next() % 4 != 0 {
                            assert_eq!(c.release_done(r.addr, next() % 2 == 0), None);
                        }
                    }
                    // Still releasing ones finish later, or are trimmed meanwhile.
                    for b in before.iter().filter(|b| b.state == BlockState::Releasing) {
                        if next() % 2 == 0 {
                            let _ = c.release_done(b.addr, false);
                        }
                    }
                }
                8 => {
                    if next() % 8 == 0 {
                        while !c.drain().is_empty() {}
                        assert!(c.blocks().all(|b| b.state == BlockState::Releasing));
                        for b in before.iter().filter(|b| b.state == BlockState::Releasing) {
                            assert!(c.release_done(b.addr, false).is_some(), "a trimmed releasing block is unmapped when done");
                        }
                    }
                }
                _ => {
                    // Parts gathered for a miss: largest first, their bytes leave the cache.
                    if next() % 4 == 0 {
                        let need = (1 + next() as usize % 200) * 16 * PAGE;
                        let parts = c.take_parts(need, 9);
                        let total: usize = before.iter().filter(|b| b.state != BlockState::Releasing && b.facts.fits(9)).map(|b| b.len).sum();
                        assert!(parts.total_bytes() == need.min(total) || parts.iter().count() == MAX_PARTS);
                        for p in parts.iter() {
                            owned.push((p.addr, p.len));
                        }
                    }
                }
            }
            c.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
    }
}

#[test]
fn many_blocks_of_one_size_are_served_hot_first_and_evicted_oldest_first() {
    let mut c = BlockCache::new(CacheLimits { max_blocks: 500, ..limits() });
    for i in 0..500usize {
        assert!(c.insert(0x1_0000_0000 + i * 0x100_0000, 256 << 10, PageFacts::zeroed(false), i as u64, Live::default()).accepted);
    }
    // The 100 oldest are released; the rest stay hot.
    let due = c.due(1000 * MS + 99, false);
    assert_eq!(due.release.len(), 100);
    for r in due.release.iter() {
        c.release_done(r.addr, false);
    }
    for _ in 0..400 {
        assert!(!c.take(256 << 10, 4096, 0).unwrap().was_released, "hot blocks go first");
    }
    assert!(c.take(256 << 10, 4096, 0).unwrap().was_released);
    c.check_invariants().unwrap();
    // A full cache evicts the block freed longest ago.
    let mut c = BlockCache::new(CacheLimits { max_blocks: CAPACITY, ..limits() });
    for i in 0..CAPACITY + 3 {
        let ins = c.insert(0x1_0000_0000 + i * 0x100_0000, 128 << 10, PageFacts::zeroed(false), i as u64, Live::default());
        let want: &[Range] = if i < CAPACITY { &[] } else { &[Range { addr: 0x1_0000_0000 + (i - CAPACITY) * 0x100_0000, len: 128 << 10 }] };
        assert_eq!(c.evicted(&ins), want);
    }
    assert_eq!(c.block_count(), CAPACITY);
    c.check_invariants().unwrap();
}

/// A forked child forgets the parent's blocks one by one (a fresh store would dirty every page
/// of its tables): nothing of them is left to find, and the cache serves as a new one.
#[test]
fn forgotten_blocks_leave_a_cache_as_good_as_new() {
    let mut c = BlockCache::new(CacheLimits { max_blocks: 16, ..limits() });
    for i in 0..6 {
        c.insert(0x1000_0000 + i * 0x1000_0000, (8 + i) * MB, PageFacts::zeroed(false), i as u64, Live::default());
    }
    let _ = c.due(5 + 1000 * MS, false); // some of them being released
    let mut heard = Vec::new();
    c.forget_all(|r| heard.push(r.addr));
    heard.sort();
    assert_eq!(heard, (0..6).map(|i| 0x1000_0000 + i * 0x1000_0000).collect::<Vec<_>>());
    assert_eq!((c.block_count(), c.cached_bytes(), c.blocks().count()), (0, 0, 0));
    assert!(c.take(8 * MB, 4096, 0).is_none(), "none of the parent's blocks is handed out");
    c.check_invariants().unwrap();
    // The same addresses, cached again, are found and merged as in a new cache.
    c.insert(0x1000_0000, 8 * MB, PageFacts::zeroed(false), 10, Live::default());
    let ins = c.insert(0x1000_0000 + 8 * MB, 8 * MB, PageFacts::zeroed(false), 11, Live::default());
    assert_eq!(ins.block, Range { addr: 0x1000_0000, len: 16 * MB });
    assert_eq!(c.take(16 * MB, 4096, 12).unwrap().addr, 0x1000_0000);
    c.check_invariants().unwrap();
}

#[test]
fn past_the_hot_bound_the_oldest_hot_blocks_are_released_at_once() {
    // Note [Hot within the memory]: 3 blocks of 40 MB hot against a bound of 64 MB.
    let mut c = BlockCache::new(CacheLimits { max_hot_bytes: 64 * MB, ..limits() });
    assert!(!c.over_hot_bound() && c.next_deadline_ns().is_none());
    for (i, addr) in [0x1000_0000, 0x2000_0000, 0x3000_0000].into_iter().enumerate() {
        assert!(c.insert(addr, 40 * MB, PageFacts::zeroed(false), i as u64, Live::default()).accepted);
    }
    assert_eq!(c.hot_bytes(), 120 * MB);
    assert!(c.over_hot_bound());
    assert_eq!(c.next_deadline_ns(), Some(HOT_GRACE_NS), "the oldest's grace, not its idle release");
    assert!(c.due(3, false).release.is_empty(), "freed just now: a loop may ask for it again");
    let due = c.due(HOT_GRACE_NS + 3, false);
    assert!(due.expire.is_empty());
    let released: Vec<usize> = due.release.iter().map(|r| r.addr).collect();
    assert_eq!(released, [0x1000_0000, 0x2000_0000], "the oldest, until what stays hot fits");
    assert!(c.due(HOT_GRACE_NS + 4, false).release.is_empty(), "blocks on their way count as gone");
    for addr in released {
        assert!(c.release_done(addr, false).is_none());
    }
    assert_eq!(c.hot_bytes(), 40 * MB);
    assert!(!c.over_hot_bound());
    assert_eq!(c.next_deadline_ns(), Some(1000 * MS + 2), "the hot one's idle release");
    c.check_invariants().unwrap();
    // Released blocks are still served (their pages rewritten, no fault unless reclaimed).
    let t = c.take(40 * MB, 4096, 0).unwrap();
    assert!(t.was_released || t.addr == 0x3000_0000);
    c.check_invariants().unwrap();
}

/// Note [Ranges the program claims]: the cached blocks and deferred ranges a claimed range
/// overlaps leave (and only those); a block being released leaves too, apart, and its
/// madvise's return finds it gone.
#[test]
fn a_claimed_range_takes_out_what_overlaps_it() {
    let mut c = BlockCache::new(CacheLimits { max_blocks: 16, ..limits() });
    let (a, b, r) = (0x1000_0000, 0x2000_0000, 0x3000_0000);
    c.insert(a, 16 * MB, PageFacts::zeroed(false), 0, Live::default());
    c.insert(b, 16 * MB, PageFacts::zeroed(false), 0, Live::default());
    c.insert(r, 16 * MB, PageFacts::zeroed(false), 500 * MS, Live::default());
    assert!(c.defer_unmap(Range { addr: 0x4000_0000, len: 4 * MB }));
    assert!(c.defer_unmap(Range { addr: 0x5000_0000, len: 4 * MB }));
    // The first two become Releasing; the third is freed later and stays hot.
    assert_eq!(c.due(1000 * MS, false).release.len(), 2);
    let (mut deferred, mut releasing) = (RangeList::new(), RangeList::new());
    // The last page of the hot one.
    let out = c.claim(r + 16 * MB - 4096, r + 16 * MB, &mut deferred, &mut releasing);
    assert_eq!(out.iter().map(|x| (x.addr, x.len)).collect::<Vec<_>>(), vec![(r, 16 * MB)]);
    assert!(releasing.is_empty() && deferred.is_empty());
    // The second deferred range, and nothing else.
    let out = c.claim(0x5000_0000 + 4096, 0x5000_0000 + 8192, &mut deferred, &mut releasing);
    assert!(out.is_empty() && releasing.is_empty());
    assert_eq!(deferred.iter().map(|x| x.addr).collect::<Vec<_>>(), vec![0x5000_0000], "only the overlapping deferred range");
    assert_eq!((c.deferred_bytes(), c.deferred().len()), (4 * MB, 1));
    assert_eq!(c.deferred().iter().next().map(|x| x.addr), Some(0x4000_0000));
    c.check_invariants().unwrap();
    // Nothing overlaps the space between blocks.
    let (mut none, mut none_releasing) = (RangeList::new(), RangeList::new());
    let out = c.claim(a + 16 * MB, b, &mut none, &mut none_releasing);
    assert!(out.is_empty() && none.is_empty() && none_releasing.is_empty());
    // a was not claimed: it goes on to Released; b was (its first page): out, apart.
    let (mut d, mut r2) = (RangeList::new(), RangeList::new());
    let out = c.claim(b, b + 4096, &mut d, &mut r2);
    assert!(out.is_empty(), "b is Releasing: not with the cached blocks");
    assert_eq!(r2.iter().map(|x| (x.addr, x.len)).collect::<Vec<_>>(), vec![(b, 16 * MB)]);
    assert_eq!(c.release_done(a, false), None);
    assert_eq!(c.release_done(b, false), None, "gone: the claimer unmaps it");
    assert_eq!(c.block_count(), 1);
    c.check_invariants().unwrap();
}
