//! Blocks a thread frees into its own slot and asks for again (Note [A thread's own slot] in
//! host/thread_slots.rs), over simulated pages: what each reader of the cache sees of them.

use super::*;

/// A layer with its threads' slots open, as a process's is under the default settings.
fn layer_with_slots() -> Box<HostLayer<SimPages>> {
    let l = Box::new(HostLayer::new(SimPages::new(), leak_table, fake_clock, Background { on_cached: nothing_due, running: no, wake: nothing }));
    l.configure(&Config { release_ms: 100, expire_ms: 1000, ..Config::default() }, 64 << 30, false);
    l
}

#[test]
fn a_block_freed_and_asked_for_again_comes_back_from_its_threads_slot() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.memory.write(a, 8 * MB);
    l.free(a, 8 * MB);
    assert_eq!(l.owner(a), Owner::Cached, "freed: a second free is a double free");
    assert_eq!(l.cached(), (0, 0), "in the slot, not the cache");
    let calls = l.memory.calls();
    for _ in 0..100 {
        let b = l.alloc(8 * MB - 5, PAGE, false, 0).unwrap();
        assert_eq!((b, l.owner(b)), (a, Owner::Live { len: 8 * MB }));
        l.free(b, 8 * MB);
    }
    assert_eq!(format!("{:?}", l.memory.calls()), format!("{calls:?}"), "no system call");
    check(&l);
    // Read, the figures count each reuse as a request, a hit and a free; the block is cached.
    l.settle_slots();
    assert_eq!((l.stats.requests.get(), l.stats.hits.get(), l.stats.frees.get()), (101, 100, 101));
    assert_eq!(l.stats.hit_bytes.get(), 100 * 8 * MB as u64);
    assert_eq!((l.cached(), l.stats.live.current()), ((1, 8 * MB), 0));
    assert_eq!(l.alloc(8 * MB, PAGE, false, 0), Some(a), "then from the cache");
    check(&l);
}

/// A request of another length sends the block to the cache first: one thread's figures are
/// what they are without slots, whatever the sizes (the blocks may differ: the cache merges a
/// freed block with its neighbours, a slot keeps it whole).
#[test]
fn a_threads_figures_are_what_they_would_be_without_a_slot() {
    let with = layer_with_slots();
    let without = layer_with_slots();
    close_slots(&without);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut live: Vec<(usize, usize)> = vec![];
    let mut shadow: Vec<(usize, usize)> = vec![];
    for step in 0..400 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if !rng.is_multiple_of(3) || live.is_empty() {
            let size = [4 * MB, 8 * MB, 8 * MB, 24 * MB][(rng >> 8) as usize % 4];
            let (a, b) = (with.alloc(size, PAGE, false, 0).unwrap(), without.alloc(size, PAGE, false, 0).unwrap());
            for &(c, len) in &live {
                assert!(a + size <= c || c + len <= a, "step {step}: overlap");
            }
            live.push((a, live_len(&with, a)));
            shadow.push((b, live_len(&without, b)));
        } else {
            let i = (rng >> 8) as usize % live.len();
            let ((a, la), (b, lb)) = (live.swap_remove(i), shadow.swap_remove(i));
            with.free(a, la);
            without.free(b, lb);
        }
        check(&with);
        if step % 25 == 24 {
            with.settle_slots();
            assert_eq!(with.stats.live.current(), without.stats.live.current(), "step {step}");
            assert_eq!(with.stats.frees.get(), without.stats.frees.get(), "step {step}");
            assert_eq!(with.stats.requests.get(), without.stats.requests.get(), "step {step}");
        }
    }
}

#[test]
fn calloc_takes_the_block_back_zeroed() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.memory.write(a, 8 * MB);
    l.free(a, 8 * MB);
    let b = l.alloc(8 * MB, PAGE, true, 0).unwrap();
    assert_eq!(b, a);
    assert!(l.memory.reads_zero(b, 8 * MB) && l.memory.is_plain(b, 8 * MB));
    check(&l);
}

#[test]
fn a_block_whose_pages_changed_while_freed_is_made_plain_by_the_caches_path() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    // mlockall(MCL_CURRENT) marks every block as changed, freed ones too.
    change(&l, a, 8 * MB);
    let b = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    assert!(l.memory.is_plain(b, 8 * MB));
    assert_eq!(l.stats.resets.get(), 1, "reset on its way through the cache");
    // A block the program changed before its free never goes to the slot at all.
    change(&l, b, PAGE);
    l.free(b, 8 * MB);
    assert_eq!((l.stats.resets.get(), l.cached()), (2, (1, 8 * MB)));
    check(&l);
}

#[test]
fn a_range_the_program_claims_takes_the_block_out_of_its_slot() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    // A program mapping pages of its own over the freed block's addresses (MAP_FIXED).
    l.claim_range(a + MB, PAGE);
    assert!(!l.memory.is_mapped(a, 8 * MB), "unmapped before the program's mapping lands there");
    assert_eq!(l.owner(a), Owner::Foreign);
    let b = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    assert!(l.memory.is_mapped(b, 8 * MB) && l.memory.is_plain(b, 8 * MB));
    // A range elsewhere leaves the slot alone.
    l.free(b, 8 * MB);
    l.claim_range(b + 8 * MB, PAGE);
    assert_eq!(l.alloc(8 * MB, PAGE, false, 0), Some(b));
    check(&l);
}

#[test]
fn trims_and_the_background_pass_see_the_blocks_in_slots() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    assert!(l.holds_idle_memory());
    assert_eq!(l.trim(), 8 * MB, "malloc_trim gives it back");
    assert_eq!(l.memory.mapped_bytes(), 0);
    // Idle since its free: the pass releases it once the release delay has passed since then.
    let b = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.memory.write(b, 8 * MB);
    l.free(b, 8 * MB);
    advance(60 * MS);
    l.reap();
    assert_eq!(l.memory.calls().releases, 0, "60 ms idle: kept");
    advance(60 * MS);
    l.reap();
    assert_eq!(l.memory.calls().releases, 1, "120 ms idle: released");
    check(&l);
}

#[test]
fn bounds_the_user_sets_close_the_slots() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    // mallopt(M_TRIM_THRESHOLD, 0): nothing kept, the block in the slot included.
    l.set_cache_bytes(0);
    assert_eq!(l.memory.mapped_bytes(), 0);
    let b = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(b, 8 * MB);
    assert_eq!(l.memory.mapped_bytes(), 0, "freed as glibc frees");
    // A limit on mappings (RLIMIT_AS): the same.
    let l = layer_with_slots();
    let c = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(c, 8 * MB);
    l.limit_mappings(1 << 30);
    assert_eq!(l.memory.mapped_bytes(), 0);
    check(&l);
}

#[test]
fn the_cache_turned_off_takes_nothing_from_a_slot() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    l.swap_enabled(false);
    let b = l.alloc(8 * MB, PAGE, false, 0);
    assert_ne!(b, Some(a), "off: no freed block is handed out");
    l.trim();
    assert!(!l.memory.is_mapped(a, 8 * MB));
    check(&l);
}

/// A block in one thread's slot is that thread's; another thread gets it only where it would
/// otherwise miss, through the cache (the slots are emptied into it first), never both at once.
#[test]
fn another_thread_gets_the_block_only_through_the_cache() {
    let l: &'static HostLayer<SimPages> = Box::leak(layer_with_slots());
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    let b = std::thread::spawn(move || l.alloc(8 * MB, PAGE, false, 0).unwrap()).join().unwrap();
    assert_eq!(b, a, "a miss would map fresh memory: the idle block in the slot serves instead");
    let c = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    assert_ne!(c, a, "the other thread holds it now");
    assert_eq!(l.stats.misses.get(), 2);
    check(l);
}

#[test]
fn huge_page_advice_goes_back_from_a_slot_only_to_the_code_that_set_it() {
    let l = layer_with_slots();
    let (numpy, other) = (3u64 << 48, 5u64 << 48);
    let a = l.alloc(16 * MB, PAGE, false, numpy).unwrap();
    l.memory.advise(a, 16 * MB);
    l.note_page_change(a, 16 * MB, PageChange::HugeAdvice(true));
    l.free(a, 16 * MB);
    assert_eq!(l.alloc(16 * MB, PAGE, false, numpy), Some(a), "numpy's next array: as it is");
    l.free(a, 16 * MB);
    let c = l.alloc(16 * MB, PAGE, false, other).unwrap();
    assert_ne!(c, a);
    assert!(!l.memory.is_advised(c, 16 * MB));
    assert_eq!(l.cached(), (1, 16 * MB), "the advised block waits in the cache for numpy");
    check(&l);
}

#[test]
fn a_fork_leaves_the_slots_empty() {
    let l = layer_with_slots();
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    l.lock_for_fork();
    // SAFETY: lock_for_fork ran on this thread.
    unsafe { l.unlock_after_fork() };
    assert_eq!(l.cached(), (1, 8 * MB), "cached, and kept from the child with the rest");
    check(&l);
}

#[test]
fn the_holders_rows_follow_a_block_to_another_holder() {
    let l = layer_with_slots();
    let (first, second) = (7u64 << 48 | 0x1000, 9u64 << 48 | 0x2000);
    let a = l.alloc(8 * MB, PAGE, false, first).unwrap();
    l.free(a, 8 * MB);
    assert_eq!(l.alloc(8 * MB, PAGE, false, second), Some(a));
    let (mut rows, mut bytes) = (0, 0);
    crate::record::holders::for_each_row(|r| {
        if r.live_bytes > 0 && (r.id == crate::record::holders::id_of(second) || r.id == crate::record::holders::id_of(first)) {
            rows += 1;
            bytes += r.live_bytes;
        }
    });
    assert!(rows >= 1 && bytes >= 8 * MB as u64);
    check(&l);
}

/// A block longer than a thirty-second of the cache's ceiling (a quarter of memory) goes the
/// cache's way: the slots together hold no more than the cache may (the rerun helper's 7 GiB
/// block and eight threads' 1 GiB blocks were kept resident past the bound until due).
#[test]
fn a_block_past_a_slots_share_of_the_ceiling_goes_the_caches_way() {
    let l = Box::new(HostLayer::new(SimPages::new(), leak_table, fake_clock, Background { on_cached: nothing_due, running: no, wake: nothing }));
    l.configure(&Config::default(), 4 << 30, false); // ceiling 1 GiB: 32 MiB a slot
    let a = l.alloc(32 * MB, PAGE, false, 0).unwrap();
    l.free(a, 32 * MB);
    assert_eq!(l.cached(), (0, 0), "32 MiB: its slot");
    let b = l.alloc(64 * MB, PAGE, false, 0).unwrap();
    l.free(b, 64 * MB);
    assert!(!l.registry.in_slot(b) && l.owner(b) == Owner::Cached, "64 MiB: the cache");
    check(&l);
}

/// The host timeline's events of blocks held by `holder` (each test its own: the rings are the
/// process's): (action, address, time).
fn events_of(holder: u64) -> Vec<(u8, usize, u64)> {
    let mut seen = vec![];
    crate::record::history::for_each_before(crate::record::history::cut(), |e| {
        if e.holder == holder && e.place == crate::record::holders::PLACE_HOST {
            seen.push((e.action, e.addr as usize, e.time_ns));
        }
    });
    seen
}

/// A pair reads the clock once, at the free: the block taken back is stamped with its free's
/// time, on the timeline and as its birth (the leak report's age).
#[test]
fn a_block_taken_back_from_its_slot_is_stamped_with_its_frees_time() {
    use crate::record::history::{ALLOC, FREE};
    let l = layer_with_slots();
    let holder = 0x5107u64 << 48 | 0x4242;
    let t0 = fake_clock();
    let a = l.alloc(8 * MB, PAGE, false, holder).unwrap();
    advance(3 * MS);
    l.free(a, 8 * MB);
    advance(2 * MS);
    assert_eq!(l.alloc(8 * MB, PAGE, false, holder), Some(a));
    let mut births = vec![];
    l.for_each_live(|addr, _, birth| births.push((addr, birth.ns)));
    assert_eq!(births, vec![(a, t0 + 3 * MS)]);
    advance(4 * MS);
    l.free(a, 8 * MB);
    assert_eq!(events_of(holder), vec![(ALLOC, a, t0), (FREE, a, t0 + 3 * MS), (ALLOC, a, t0 + 3 * MS), (FREE, a, t0 + 9 * MS)]);
    check(&l);
}

/// Two frees in a row: the first block leaves the slot with its own free's time, and the cache
/// releases it by that time.
#[test]
fn a_block_pushed_out_of_its_slot_keeps_its_frees_time() {
    let l = layer_with_slots();
    let (a, b) = (l.alloc(8 * MB, PAGE, false, 0).unwrap(), l.alloc(8 * MB, PAGE, false, 0).unwrap());
    l.memory.write(a, 8 * MB);
    l.memory.write(b, 8 * MB);
    l.free(a, 8 * MB);
    advance(7 * MS);
    l.free(b, 8 * MB);
    assert_eq!(l.cached(), (1, 8 * MB), "a left the slot for b");
    advance(95 * MS);
    l.reap();
    assert_eq!(l.memory.calls().releases, 1, "102 ms after its free, a is released; b, 95 ms after its own, is not");
    check(&l);
}

/// However long the cache keeps an idle block, a block waits in a slot LONGEST_WAIT_NS (a
/// second) at most: the stamp of a block taken back is at most that early.
#[test]
fn a_block_waits_in_its_slot_a_second_at_most() {
    let l = Box::new(HostLayer::new(SimPages::new(), leak_table, fake_clock, Background { on_cached: nothing_due, running: no, wake: nothing }));
    l.configure(&Config { release_ms: 5000, expire_ms: 60_000, ..Config::default() }, 64 << 30, false);
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    advance(990 * MS);
    l.reap();
    assert_eq!(l.cached(), (0, 0), "990 ms: in its slot");
    advance(20 * MS);
    l.reap();
    assert_eq!(l.cached(), (1, 8 * MB), "1,010 ms: in the cache");
    assert_eq!(l.memory.calls().releases, 0, "kept hot as the cache's release delay says");
    check(&l);
}
