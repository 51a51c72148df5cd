//! The host layer over simulated pages with a fake clock: every step is followed by an
//! invariant check, and a property test runs random programs against a shadow model.

use super::*;
use crate::config::Release;
use crate::host::registry::PageChange;
use crate::host::registry;
use crate::sim::SimPages;
use std::cell::Cell;
use std::collections::BTreeMap;

const MB: usize = 1 << 20;
const MS: u64 = 1_000_000;

thread_local! {
    static NOW: Cell<u64> = const { Cell::new(1) };
}
fn fake_clock() -> u64 {
    NOW.with(|n| n.get())
}
fn advance(ns: u64) {
    NOW.with(|n| n.set(n.get() + ns));
}
fn nothing() {}
fn nothing_due(_: u64) {}
fn yes() -> bool {
    true
}
fn no() -> bool {
    false
}

use crate::sim::leak_table;

mod slots;

/// A layer whose frees all reach the cache (its threads' slots closed: `slots.rs` tests them).
fn layer(config: Config) -> Box<HostLayer<SimPages>> {
    layer_with(config, no)
}

/// `background`: whether a background thread takes deferred unmaps (the test runs `reap`).
fn layer_with(config: Config, background: fn() -> bool) -> Box<HostLayer<SimPages>> {
    let l = Box::new(HostLayer::new(SimPages::new(), leak_table, fake_clock, Background { on_cached: nothing_due, running: background, wake: nothing }));
    l.configure(&config, 64 << 30, false);
    close_slots(&l);
    l
}

fn close_slots(l: &HostLayer<SimPages>) {
    l.set_slots(false, 0);
}

/// The mapped length of a live block.
fn live_len(l: &HostLayer<SimPages>, addr: usize) -> usize {
    match l.owner(addr) {
        Owner::Live { len } => len,
        other => panic!("{addr:#x} is not live: {other:?}"),
    }
}

/// Every byte the simulator has mapped is live, cached or waiting to be unmapped: nothing leaks.
fn check(l: &HostLayer<SimPages>) {
    l.check_invariants().unwrap();
    let (_, cached) = l.cached();
    assert_eq!(l.memory.mapped_bytes(), l.stats.live.current() as usize + cached + l.deferred_bytes(), "mapped = live + cached + deferred");
    assert_eq!(l.stats.deferred.current() as usize, l.deferred_bytes());
}

#[test]
fn hot_reuse_makes_no_system_calls() {
    let l = layer(Config::default());
    let a = l.alloc(80 * 1000 * 1000, 4096, false, 0).unwrap();
    let len = match l.owner(a) {
        Owner::Live { len } => len,
        other => panic!("{other:?}"),
    };
    assert_eq!(len % (2 * MB), 0, "rounded to huge pages");
    assert_eq!(a % (2 * MB), 0, "aligned to huge pages");
    l.free(a, len);
    assert_eq!(l.owner(a), Owner::Cached);
    let before = l.memory.calls();
    let b = l.alloc(80 * 1000 * 1000, 4096, false, 0).unwrap();
    assert_eq!(a, b);
    let after = l.memory.calls();
    assert_eq!((after.maps, after.unmaps, after.releases), (before.maps, before.unmaps, before.releases));
    assert_eq!(l.stats.hits.get(), 1);
    check(&l);
}

/// Note [calloc costs what is touched]: blocks that change hands (a training loop's buffers,
/// freed in another order each step) carry no votes of their own to the next calloc; the
/// process's votes say its callocs are dense, so zeros are written from the third on, however
/// the blocks circulate. Blocks the program then barely wrote (it turned sparse) are dropped once
/// the pages sampled before the writes have read zero for a while.
#[test]
fn a_process_whose_callocs_are_dense_writes_zeros_whatever_block_serves_them() {
    let l = layer(Config::default());
    let discarded = || l.memory.calls().discarded_bytes;
    let zeroed = || l.memory.calls().zeroed_bytes;
    let sizes = [8 * MB, 6 * MB, 5 * MB];
    let mut blocks: Vec<(usize, usize)> = sizes.iter().map(|&n| (l.alloc(n, 4096, false, 0).unwrap(), n)).collect();
    for step in 0..6 {
        // Freed in another order each step, each written whole before.
        for k in 0..blocks.len() {
            let (a, n) = blocks[(k + step) % blocks.len()];
            l.memory.write(a, n);
            l.free(a, n);
        }
        let before = discarded();
        blocks = sizes.iter().map(|&n| (l.alloc(n - 4096, 4096, true, 0).unwrap(), n)).collect();
        for &(a, n) in &blocks {
            assert!(l.memory.reads_zero(a, n - 4096));
        }
        if step >= 1 {
            assert_eq!(discarded(), before, "step {step}: nothing dropped once the process's callocs proved dense");
        }
    }
    assert_eq!(l.stats.zeroed_by_discard.get(), 2, "two drops found the blocks resident; writes after");
    // The program turns sparse: blocks it barely wrote. The pages sampled before each write read
    // zero; the first callocs still write (most owners of late wrote theirs), and once the
    // writers' share falls below a quarter, four callocs on, blocks are dropped.
    for (a, n) in blocks.drain(..) {
        l.free(a, n);
    }
    l.trim();
    let a = l.alloc(16 * MB, 4096, false, 0).unwrap();
    let mut written = Vec::new();
    for _ in 0..8 {
        l.memory.write(a, 4096);
        l.free(a, 16 * MB);
        let z = zeroed();
        assert_eq!(l.alloc(16 * MB, 4096, true, 0), Some(a));
        assert!(l.memory.reads_zero(a, 16 * MB));
        written.push(zeroed() > z);
    }
    assert_eq!(written, [true, true, true, true, false, false, false, false], "the writers' share fell: dropped from then on");
    l.free(a, 16 * MB);
}

/// Note [calloc costs what is touched]: a block written over by calloc, then used sparsely, is
/// dropped (the pages sampled read zero, and few owners of late wrote theirs); used densely again
/// (its pages faulted in once, as glibc's would each time), it is written over again, and used
/// sparsely once more, written over while the writers' share says most owners write.
#[test]
fn calloc_follows_a_block_from_dense_to_sparse_and_back() {
    let l = layer(Config::default());
    let (zeroed, discarded) = (|| l.memory.calls().zeroed_bytes, || l.memory.calls().discarded_bytes);
    let a = l.alloc(8 * MB, 4096, true, 0).unwrap();
    for _ in 0..3 {
        l.memory.write(a, 8 * MB);
        l.free(a, 8 * MB);
        assert_eq!(l.alloc(8 * MB, 4096, true, 0), Some(a));
    }
    let cost = (zeroed(), discarded());
    assert_eq!(cost.0, 8 * MB as u64, "two drops found it resident: the third calloc wrote it");
    let sparse_again = [(4096, true), (4096, true), (4096, false)];
    for (use_len, written) in [(4096, false), (4096, false), (8 * MB, true), (8 * MB, true)].into_iter().chain(sparse_again) {
        let cost = (zeroed(), discarded());
        l.memory.write(a, use_len);
        l.free(a, 8 * MB);
        assert_eq!(l.alloc(8 * MB, 4096, true, 0), Some(a));
        assert!(l.memory.reads_zero(a, 8 * MB));
        let wrote = zeroed() > cost.0;
        assert_eq!(wrote, written, "used {use_len} bytes: written {wrote}, dropped {}", discarded() > cost.1);
    }
}

/// calloc reads zero on every path (fresh, hit on a dirtied block, on a sparsely touched one, on
/// a released one, a split tail, a gathered block, madvise refused), and costs what was touched:
/// a block is dropped until two drops in a row found it mostly resident (Note [calloc costs what
/// is touched]), with no call that asks the kernel.
#[test]
fn calloc_reads_zero_on_every_path_and_costs_what_was_touched() {
    let l = layer(Config { release_ms: 100, ..Config::default() });
    let zeroed = || l.memory.calls().zeroed_bytes;
    let discarded = || l.memory.calls().discarded_bytes;
    let mb = MB as u64;
    // Fresh: already zero, nothing written.
    let a = l.alloc(8 * MB, 4096, true, 0).unwrap();
    assert!(l.memory.reads_zero(a, 8 * MB));
    assert_eq!((zeroed(), discarded()), (0, 0), "fresh mappings are already zero");
    // Dense use, then calloc again: nothing is known of the block, so its pages are dropped (a
    // fresh mapping's cost at most), and the drop finds it mostly resident: a vote. Twice in a
    // row, and zeros are written from then on (dropping makes every page fault again).
    for round in 1..=2 {
        l.memory.write(a, 8 * MB);
        l.free(a, 8 * MB);
        let b = l.alloc(8 * MB - 100, 4096, true, 0).unwrap();
        assert_eq!(b, a);
        assert!(l.memory.reads_zero(b, 8 * MB), "the whole usable size reads zero");
        assert_eq!((zeroed(), discarded()), (0, round * 8 * mb), "round {round}: dropped");
    }
    l.memory.write(a, 8 * MB);
    l.free(a, 8 * MB);
    let b = l.alloc(8 * MB - 100, 4096, true, 0).unwrap();
    assert!(l.memory.reads_zero(b, 8 * MB));
    assert_eq!((zeroed(), discarded()), (8 * mb, 16 * mb), "found mostly resident twice: written");
    // Sparse use (two pages): each drop finds little resident, so it stays dropped. (In a
    // process whose callocs have been dense so far; the process's votes are another test's.)
    l.calloc_votes.store(0, Relaxed);
    let s = l.alloc(32 * MB, 4096, true, 0).unwrap();
    for _ in 0..3 {
        l.memory.write(s, 4096);
        l.memory.write(s + 20 * MB, 4096);
        l.free(s, 32 * MB);
        let s2 = l.alloc(32 * MB, 4096, true, 0).unwrap();
        assert_eq!(s2, s);
        assert!(l.memory.reads_zero(s2, 32 * MB));
    }
    assert_eq!((zeroed(), discarded()), (8 * mb, 16 * mb + 96 * mb));
    assert_eq!(l.stats.zeroed_by_discard.get(), 5);
    l.free(s, 32 * MB);
    // A block found dense, then used sparsely: the pages sampled before the write read zero
    // (our last write, not the program's), so it is dropped.
    l.memory.write(b, 4096);
    l.free(b, 8 * MB);
    let dropped = discarded();
    let c = l.alloc(8 * MB, 4096, true, 0).unwrap();
    assert!(l.memory.reads_zero(c, 8 * MB));
    assert_eq!((zeroed(), discarded()), (8 * mb, dropped + 8 * mb));
    // Released (MADV_FREE keeps contents until the kernel takes the pages, which may be at any
    // time): zeroed, and its votes gone, so dropped.
    l.memory.write(c, 8 * MB);
    l.free(c, 8 * MB);
    advance(100 * MS);
    l.reap();
    assert_eq!(l.memory.calls().releases, 2, "c and s");
    let before = discarded();
    let d = l.alloc(8 * MB, 4096, true, 0).unwrap();
    assert_eq!((d, l.stats.hits_after_release.get()), (c, 1));
    assert!(l.memory.reads_zero(d, 8 * MB));
    assert_eq!(discarded(), before + 8 * mb);
    // A split: the kept tail of a zeroed block is known zero; the head was written.
    l.memory.write(d, 4096);
    l.free(d, 8 * MB);
    let e = l.alloc(64 * MB, 4096, true, 0).unwrap(); // grown from d: only d's 8 MB may hold data
    assert!(l.memory.reads_zero(e, 64 * MB));
    assert_eq!(l.stats.grows.get(), 1);
    let before = (zeroed(), discarded());
    l.memory.write(e, 64 * MB);
    l.free(e, 64 * MB);
    let f = l.alloc(16 * MB, 4096, true, 0).unwrap();
    assert!(l.memory.reads_zero(f, live_len(&l, f)));
    assert_eq!((zeroed(), discarded()), (before.0, before.1 + live_len(&l, f) as u64), "only what is handed out is zeroed");
    let g = l.alloc(40 * MB, 4096, true, 0).unwrap();
    assert_eq!(g, f + 16 * MB, "the tail");
    assert!(l.memory.reads_zero(g, 40 * MB));
    // A request short of the block it is served from: the rest past the request's rounding is
    // split off and stays cached with its data (carried out, it would be zeroed, and faulted in
    // again by whoever reaches its pages next); the usable size reads zero, the head written (the
    // process's callocs proved dense), the rounding's rest dropped when it is long.
    l.memory.write(g, 40 * MB);
    l.free(g, live_len(&l, g));
    let cost = (zeroed(), discarded(), l.cached().1);
    let g = l.alloc(38 * MB + 1, 4096, true, 0).unwrap();
    let len = live_len(&l, g);
    assert_eq!(len, 40 * MB, "the request's rounding to huge pages, the rest of the 48 MB tail split off");
    assert_eq!(l.cached().1, cost.2 - len, "the rest stays cached");
    assert!(l.memory.reads_zero(g, len));
    let head = 38 * MB + 4096;
    assert_eq!((zeroed() - cost.0, discarded() - cost.1), (head as u64, (len - head) as u64));
    // A kernel without MADV_FREE: idle blocks are released with MADV_DONTNEED, so they are
    // known zero and handed to calloc with nothing written or dropped.
    l.memory.release_discards();
    l.memory.write(g, 40 * MB);
    l.free(g, live_len(&l, g));
    advance(100 * MS);
    l.reap();
    let cost = (zeroed(), discarded());
    let g = l.alloc(40 * MB, 4096, true, 0).unwrap();
    assert!(l.memory.reads_zero(g, 40 * MB));
    assert_eq!((zeroed(), discarded()), cost, "known zero: nothing to do");
    // A kernel that refuses madvise: zeros are written instead.
    l.memory.fail_discards();
    l.memory.write(g, 4096);
    l.free(g, live_len(&l, g));
    let h = l.alloc(48 * MB, 4096, true, 0).unwrap();
    assert!(l.memory.reads_zero(h, 48 * MB));
    l.free(f, live_len(&l, f));
    l.free(h, live_len(&l, h));
    check(&l);
}

/// The program changes pages through libc: the simulated pages change, and the shim tells the
/// layer (Note [Pages the program changed]).
fn change(l: &HostLayer<SimPages>, addr: usize, len: usize) {
    l.memory.alter(addr, len);
    l.note_page_change(addr, len, PageChange::Changed);
}

/// Whatever the program did to a block's pages, the next owner gets plain memory; a child
/// forgets the cache without a system call; a block that cannot be restored, or part of which
/// the program replaced, is unmapped, never reused (Note [Plain memory]).
#[test]
fn blocks_handed_out_are_plain_memory() {
    let l = layer(Config::default());
    let a = l.alloc(40 * MB, 4096, false, 0).unwrap();
    l.memory.write(a, 40 * MB);
    change(&l, a, 40 * MB); // read-only, locked, MADV_DONTFORK: whatever it was
    l.free(a, 40 * MB);
    assert_eq!((l.memory.calls().resets, l.stats.resets.get()), (1, 1));
    let b = l.alloc(40 * MB, 4096, true, 0).unwrap();
    assert_eq!(b, a, "reused");
    assert!(l.memory.is_plain(b, 40 * MB) && l.memory.reads_zero(b, 40 * MB));
    // Gathered from two altered blocks: plain too.
    let c = l.alloc(24 * MB, 4096, false, 0).unwrap();
    change(&l, b + 8 * MB, PAGE);
    change(&l, c, PAGE);
    l.free(b, 40 * MB);
    l.free(c, 24 * MB);
    let d = l.alloc(64 * MB, 4096, false, 0).unwrap();
    assert!(l.memory.is_plain(d, live_len(&l, d)));
    l.free(d, live_len(&l, d));
    // A forked child: the cache (blocks being released included) is forgotten, nothing unmapped.
    let (blocks, _) = l.cached();
    assert!(blocks > 0);
    let unmaps = l.memory.calls().unmaps;
    l.forget_cache_in_child();
    assert_eq!((l.cached(), l.memory.calls().unmaps), ((0, 0), unmaps));
    assert_eq!(l.stats.cached.current(), 0);
    // A block that cannot be restored (sealed, or partly unmapped by the program) is unmapped.
    let l = layer(Config::default());
    let e = l.alloc(8 * MB, 4096, false, 0).unwrap();
    change(&l, e, PAGE);
    l.memory.fail_resets();
    l.free(e, 8 * MB);
    assert_eq!((l.cached(), l.stats.unresettable.get()), ((0, 0), 1));
    assert!(!l.memory.is_mapped(e, 8 * MB));
    let f = l.alloc(8 * MB, 4096, false, 0).unwrap();
    l.note_page_change(f + 4 * MB, PAGE, PageChange::Replaced); // munmap, mremap or mmap(MAP_FIXED) of a page
    l.free(f, 8 * MB);
    assert_eq!((l.cached(), l.stats.unresettable.get()), ((0, 0), 2), "a replaced block is never reused");
    assert!(!l.memory.is_mapped(f, 8 * MB));
    check(&l);
}

/// Note [Pages the program changed]: a block whose pages nobody changed goes to the cache and
/// back with no system call; a change is remembered across a resize; TENSORMALLOC_RESET=always
/// resets every block.
#[test]
fn only_blocks_the_program_changed_are_reset() {
    let l = layer(Config::default());
    let a = l.alloc(64 * MB, PAGE, false, 0).unwrap();
    l.free(a, 64 * MB);
    for _ in 0..100 {
        let b = l.alloc(64 * MB, PAGE, false, 0).unwrap();
        l.memory.write(b, 8);
        l.free(b, 64 * MB);
    }
    let calls = l.memory.calls();
    assert_eq!((calls.resets, calls.fork_advice, calls.maps), (0, 0, 1), "no system call per pair");
    let b = l.alloc(64 * MB, PAGE, false, 0).unwrap();
    change(&l, b + 32 * MB, PAGE);
    let b = l.resize(b, 64 * MB, 32 * MB + PAGE).unwrap();
    l.free(b, live_len(&l, b));
    assert_eq!(l.memory.calls().resets, 1, "shrunk in place, still changed");
    let c = l.alloc(32 * MB, PAGE, false, 0).unwrap();
    assert!(l.memory.is_plain(c, 32 * MB));
    l.free(c, 32 * MB);

    let always = layer(Config { reset_always: true, ..Config::default() });
    let d = always.alloc(8 * MB, PAGE, false, 0).unwrap();
    always.free(d, 8 * MB);
    assert_eq!(always.memory.calls().resets, 1);
    check(&l);
    check(&always);
}

/// Only a block the program tagged with a protection key is reset with keys (pkey_mprotect, which
/// @system-service refuses); any other changed block with plain mprotect.
#[test]
fn only_keyed_blocks_are_reset_with_keys() {
    let l = layer(Config { reset_always: true, ..Config::default() });
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    let b = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.memory.alter(b, PAGE);
    l.note_page_change(b, PAGE, PageChange::Keyed);
    l.free(b, 8 * MB);
    let calls = l.memory.calls();
    assert_eq!((calls.resets, calls.keyed_resets), (2, 1), "RESET=always resets every block, with keys only the keyed one");
    check(&l);
}

/// Note [Huge-page advice]: MADV_NOHUGEPAGE is undone by fresh pages at free; a block advised
/// MADV_HUGEPAGE goes back, pages and advice, only to its own holder's code, and anyone else
/// gets a block without advice or a fresh mapping.
#[test]
fn huge_page_advice_goes_back_only_to_the_code_that_set_it() {
    let l = layer(Config::default());
    let numpy = 3u64 << 48; // holder id 3
    let other = 5u64 << 48;
    let a = l.alloc(16 * MB, PAGE, false, numpy).unwrap();
    l.memory.write(a, 16 * MB);
    l.memory.advise(a + PAGE, 16 * MB - PAGE);
    l.note_page_change(a + PAGE, 16 * MB - PAGE, PageChange::HugeAdvice(true));
    l.free(a, 16 * MB);
    assert_eq!(l.memory.calls().renews, 0, "MADV_HUGEPAGE: pages kept");
    // The same library again (numpy's next array): as it is, no system call, no fault.
    let b = l.alloc(16 * MB, PAGE, false, numpy).unwrap();
    assert_eq!(b, a);
    assert!(l.memory.is_advised(b, 16 * MB) && !l.memory.reads_zero(b, 16 * MB));
    // Freed again by that code with no new madvise: the block still carries the advice.
    l.free(b, 16 * MB);
    // Another library: a fresh mapping; the advised block stays cached for its own code.
    let maps = l.memory.calls().maps;
    let c = l.alloc(16 * MB, PAGE, true, other).unwrap();
    assert_ne!(c, a);
    assert!(!l.memory.is_advised(c, 16 * MB) && l.memory.is_plain(c, 16 * MB) && l.memory.reads_zero(c, 16 * MB));
    assert_eq!(l.memory.calls().maps, maps + 1);
    assert_eq!(l.owner(a), Owner::Cached);
    // Freed, it serves that other code from then on, and numpy keeps its own.
    l.free(c, 16 * MB);
    assert_eq!(l.alloc(16 * MB, PAGE, false, other), Some(c));
    assert_eq!(l.alloc(16 * MB, PAGE, false, numpy), Some(a));
    // Advised neighbours do not merge with plain ones.
    l.free(a, 16 * MB);
    l.free(c, 16 * MB);
    assert_eq!(l.cached().0, 2);
    // MADV_NOHUGEPAGE: renewed at free, whoever comes next.
    let d = l.alloc(16 * MB, PAGE, false, other).unwrap();
    assert_eq!(d, c);
    l.memory.write(d, 16 * MB);
    l.memory.advise(d, 16 * MB);
    l.note_page_change(d, 16 * MB, PageChange::HugeAdvice(false));
    l.free(d, 16 * MB);
    assert_eq!(l.memory.calls().renews, 1);
    assert!(!l.memory.is_advised(d, 16 * MB) && l.memory.reads_zero(d, 16 * MB));
    let e = l.alloc(16 * MB, PAGE, true, numpy << 1).unwrap();
    let cost = l.memory.calls();
    assert_eq!((e, cost.zeroed_bytes + cost.discarded_bytes), (d, 0), "fresh pages: known zero");
    l.free(e, 16 * MB);
    check(&l);
}

/// Note [Locked memory]: under mlockall(MCL_FUTURE) the cache holds nothing locked, and what it
/// hands out is locked as a fresh mapping would be.
#[test]
fn under_mcl_future_the_cache_holds_nothing_locked() {
    let l = layer(Config::default());
    l.memory.lock_future(true);
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    assert!(l.memory.is_locked(a, 8 * MB), "the kernel locks a fresh mapping");
    l.free(a, 8 * MB);
    assert!(!l.memory.any_locked(a, 8 * MB), "unlocked as it enters the cache");
    let b = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    assert_eq!(b, a);
    assert!(l.memory.is_locked(b, 8 * MB), "locked as it leaves it");
    l.memory.lock_future(false);
    l.free(b, 8 * MB);
    let c = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    assert_eq!(l.memory.calls().locks, 1, "no longer once munlockall ran");
    // Pages gathered under MCL_FUTURE come locked too.
    l.memory.lock_future(true);
    l.free(c, 8 * MB);
    let d = l.alloc(24 * MB, PAGE, false, 0).unwrap();
    assert_eq!(l.stats.grows.get(), 1);
    assert!(l.memory.is_locked(d, 24 * MB));
    l.free(d, 24 * MB);
    assert_eq!(l.cached().0, 1);
    assert!(l.memory.calls().unlocks >= 2);
    check(&l);
}

/// Note [Room for others]: under a limit on what the process may map the cache keeps nothing
/// (rule 1); a lower limit empties it before it returns, unmapping what waited to be unmapped.
#[test]
fn a_lower_address_limit_empties_the_cache_at_once() {
    let l = layer_with(Config::default(), yes);
    let blocks = [0; 4].map(|_| l.alloc(256 * MB, PAGE, false, 0).unwrap());
    for b in blocks {
        l.free(b, 256 * MB);
    }
    assert_eq!(l.cached().1, 1024 * MB);
    let unlimited = l.bounds();
    l.limit_mappings(64 << 30);
    assert_eq!(l.cached().1, 0, "a limit, even a generous one: nothing kept");
    assert_eq!(l.memory.mapped_bytes(), 0, "unmapped before it returned");
    let b = l.alloc(256 * MB, PAGE, false, 0).unwrap();
    l.free(b, 256 * MB);
    assert_eq!((l.cached().1, l.memory.mapped_bytes()), (0, 0), "a freed block is unmapped at once, as glibc's");
    assert_eq!(l.deferred_bytes(), 0);
    // A raised limit is still a limit; none gives the bound its ceiling back.
    l.limit_mappings(128 << 30);
    assert_eq!(l.bounds().1, 0);
    l.limit_mappings(u64::MAX);
    assert_eq!(l.bounds(), unlimited);
    assert_eq!(l.memory.mapped_bytes(), 0);
    check(&l);
}

/// A bound the program set with mallopt(M_TRIM_THRESHOLD) is no leave to keep memory under a
/// mapping limit: glibc's free unmaps whatever the program set (-1, "never trim", is the
/// real-time recipe), so the limit empties the cache and the bound comes back without it.
#[test]
fn a_bound_the_program_set_with_mallopt_gives_way_to_a_mapping_limit() {
    for bound in [usize::MAX, 512 * MB] {
        let l = layer_with(Config::default(), yes);
        l.set_cache_bytes(bound);
        let b = l.alloc(256 * MB, PAGE, false, 0).unwrap();
        l.free(b, 256 * MB);
        assert_eq!(l.cached().1, 256 * MB);
        l.limit_mappings(1 << 30);
        assert_eq!((l.cached().1, l.memory.mapped_bytes()), (0, 0), "bound {bound}: emptied at once");
        let b = l.alloc(256 * MB, PAGE, false, 0).unwrap();
        l.free(b, 256 * MB);
        assert_eq!(l.memory.mapped_bytes(), 0, "bound {bound}: freed as glibc frees");
        l.set_cache_bytes(bound);
        assert_eq!(l.bounds().1, 0, "bound {bound}: set again under the limit");
        l.limit_mappings(u64::MAX);
        assert_eq!(l.bounds().1, bound.min(usize::MAX - 1), "bound {bound}: back without the limit");
        check(&l);
    }
}

/// Note [Room for others], rule 1: a bound the user set holds under a limit too.
#[test]
fn a_bound_the_user_set_holds_under_a_mapping_limit() {
    let l = layer_with(Config { cache_bytes: Some(512 * MB as u64), ..Config::default() }, yes);
    l.limit_mappings(1 << 30);
    assert_eq!(l.bounds().1, 512 * MB);
    let b = l.alloc(256 * MB, PAGE, false, 0).unwrap();
    l.free(b, 256 * MB);
    assert_eq!(l.cached(), (1, 256 * MB));
    check(&l);
}

/// A block the program advised MADV_DONTFORK is not in a forked child: the child forgets its
/// record (wholly missing) or keeps it as far as its first hole and never reuses it (missing in
/// part: Note [A block the child has in part]); blocks it has stay as they are.
#[test]
fn a_child_forgets_the_blocks_the_program_kept_from_it() {
    let l = layer(Config::default());
    let [a, b, c] = [0; 3].map(|_| l.alloc(8 * MB, PAGE, false, 0).unwrap());
    for (addr, len) in [(a, 8 * MB), (b + 4 * MB, PAGE)] {
        l.memory.keep_from_fork(addr, len); // the kernel's side of the program's madvise
        l.note_page_change(addr, len, PageChange::KeptFromChildren);
    }
    let live = l.stats.live_blocks.current();
    l.memory.become_child();
    l.forget_cache_in_child();
    assert_eq!(l.owner(a), Owner::Foreign, "not in the child: no record");
    assert_eq!(l.stats.live_blocks.current(), live - 1);
    assert_eq!((l.registry.marks(b).changed(), l.registry.marks(b).replaced()), (true, true), "in part: never reused");
    assert_eq!(l.owner(b), Owner::Live { len: 4 * MB }, "recorded as far as its hole");
    assert_eq!(l.block_containing(b + 4 * MB), None, "the hole is not ours: the child may map there");
    assert_eq!(l.block_containing(b + 4 * MB - 1), Some(b));
    assert_eq!(l.registry.live_record(b).1, 4 * MB as u64, "asked: what is left");
    assert_eq!(l.stats.live.current(), 8 * MB as u64 + 4 * MB as u64, "c and what is left of b");
    assert_eq!(l.registry.marks(c), registry::Marks::default(), "untouched");
    l.free(b, live_len(&l, b));
    assert!(!l.memory.is_mapped(b, 4 * MB) && l.cached() == (0, 0));
    assert!(l.memory.is_mapped(b + 4 * MB + PAGE, 4 * MB - PAGE), "after the hole: no longer ours, never unmapped by us");
    l.free(c, 8 * MB);
    assert_eq!(l.cached().0, 1);
}

/// Note [Fork at the fork]: the prepare handler keeps every cached block and every range waiting
/// to be unmapped from the child; live blocks are the child's; a block stays kept while it is
/// cached (the next fork makes no system call for it) and is readmitted as it is handed out.
#[test]
fn a_fork_keeps_the_cache_from_the_child_and_nothing_else() {
    let l = layer(Config::default());
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    let b = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    assert!(!l.memory.hidden_from_children(a, 8 * MB), "cached blocks are plain between forks");
    let advice = l.memory.calls().fork_advice;
    l.lock_for_fork();
    assert!(l.memory.hidden_from_children(a, 8 * MB) && !l.memory.hidden_from_children(b, 8 * MB));
    // SAFETY: lock_for_fork ran on this thread.
    unsafe { l.unlock_after_fork() };
    assert_eq!(l.memory.calls().fork_advice, advice + 1, "one madvise for the one cached block, none after the fork");
    assert!(l.memory.hidden_from_children(a, 8 * MB), "kept while cached");
    l.lock_for_fork();
    // SAFETY: as above.
    unsafe { l.unlock_after_fork() };
    assert_eq!(l.memory.calls().fork_advice, advice + 1, "a second fork: nothing new cached, no system call");
    assert_eq!(l.alloc(8 * MB, PAGE, false, 0), Some(a));
    assert!(l.memory.is_plain(a, 8 * MB), "readmitted as it is handed out");
    assert_eq!(l.memory.calls().fork_advice, advice + 2);
    l.free(a, 8 * MB);
    l.free(b, 8 * MB);
    assert!(l.alloc(8 * MB, PAGE, false, 0).is_some());
    assert_eq!(l.memory.calls().fork_advice, advice + 2, "a block cached since: no readmission");
    check(&l);
}

/// Evicted blocks wait on the deferred list for the background thread; they are never handed
/// out again, count as mapped until it runs, and are unmapped inline without one.
#[test]
fn evictions_leave_the_callers_path() {
    let l = layer_with(Config { cache_blocks: Some(1), ..Config::default() }, yes);
    let a = l.alloc(8 * MB, 4096, false, 0).unwrap();
    let b = l.alloc(16 * MB, 4096, false, 0).unwrap();
    l.free(a, 8 * MB);
    let unmaps = l.memory.calls().unmaps;
    l.free(b, 16 * MB); // evicts a
    assert_eq!(l.memory.calls().unmaps, unmaps, "no munmap in free");
    assert_eq!(l.deferred_bytes(), 8 * MB);
    assert_eq!(l.owner(a), Owner::Foreign);
    assert!(l.memory.is_mapped(a, 8 * MB));
    check(&l);
    let c = l.alloc(8 * MB, 4096, false, 0).unwrap();
    assert_ne!(c, a, "a deferred block is never handed out");
    assert_eq!(c, b, "the cached block serves it (split)");
    l.reap();
    assert_eq!(l.deferred_bytes(), 0);
    assert!(!l.memory.is_mapped(a, 8 * MB));
    check(&l);
    // Memory short: a failed map unmaps the deferred list and the cache, then retries.
    let d = l.alloc(8 * MB, 4096, false, 0).unwrap();
    assert_eq!(d, c + 8 * MB, "the rest of b");
    let x = l.alloc(8 * MB, 4096, false, 0).unwrap();
    l.free(c, live_len(&l, c));
    l.free(x, 8 * MB); // evicts c (not next to x)
    assert_eq!(l.deferred_bytes(), 8 * MB);
    l.memory.fail_next_maps(2); // growing x, then the fresh mapping
    let e = l.alloc(32 * MB, 4096, false, 0).expect("retried after unmapping");
    assert_eq!((l.deferred_bytes(), l.cached()), (0, (0, 0)));
    l.free(e, 32 * MB);
    l.free(d, 8 * MB);
    check(&l);
    // No background thread: inline, as before.
    let l = layer(Config { cache_blocks: Some(1), ..Config::default() });
    let a = l.alloc(8 * MB, 4096, false, 0).unwrap();
    let b = l.alloc(8 * MB, 4096, false, 0).unwrap();
    l.free(a, 8 * MB);
    l.free(b, 8 * MB);
    assert_eq!((l.deferred_bytes(), l.memory.is_mapped(a, 8 * MB)), (0, false));
    check(&l);
}

/// Many blocks live at once (16 threads with 4 each): all of them fit in the cache when freed,
/// where the old fixed bound (16 blocks, 1 GiB) evicted most.
#[test]
fn the_bound_follows_the_working_set() {
    let l = layer(Config::default());
    let blocks: Vec<usize> = (0..64).map(|_| l.alloc(40 * MB, 4096, false, 0).unwrap()).collect();
    for &b in &blocks {
        l.free(b, 40 * MB);
    }
    assert_eq!(l.cached(), (64, 64 * 40 * MB));
    assert_eq!(l.stats.unmapped_blocks.get(), 0);
    let again: Vec<usize> = (0..64).map(|_| l.alloc(40 * MB, 4096, false, 0).unwrap()).collect();
    assert_eq!(l.stats.hits.get(), 64);
    for &b in &again {
        l.free(b, 40 * MB);
    }
    check(&l);
    // A bound the user set stays exact.
    let l = layer(Config { cache_bytes: Some(1 << 30), ..Config::default() });
    for b in (0..64).map(|_| l.alloc(40 * MB, 4096, false, 0).unwrap()).collect::<Vec<_>>() {
        l.free(b, 40 * MB);
    }
    assert_eq!(l.cached().1, 25 * 40 * MB);
    check(&l);
}

#[test]
fn idle_blocks_are_released_then_unmapped() {
    let l = layer(Config { release_ms: 100, expire_ms: 1000, ..Config::default() });
    let a = l.alloc(16 * MB, 4096, false, 0).unwrap();
    l.free(a, 16 * MB);
    assert_eq!(l.reap(), Some(fake_clock() + 100 * MS));
    advance(100 * MS);
    l.reap();
    assert_eq!(l.memory.calls().releases, 1);
    assert_eq!(l.stats.released_bytes.get(), 16 * MB as u64);
    check(&l);
    // Reuse after release is a hit (no fault cost to map it again).
    let b = l.alloc(16 * MB, 4096, false, 0).unwrap();
    assert_eq!(b, a);
    assert_eq!(l.stats.hits_after_release.get(), 1);
    l.free(b, 16 * MB);
    advance(1000 * MS);
    assert_eq!(l.reap(), None);
    assert_eq!(l.memory.mapped_bytes(), 0);
    assert_eq!(l.owner(a), Owner::Foreign);
    check(&l);
}

/// Note [What RSS shows]: with room, idle blocks are MADV_FREE'd (lazily freed, still in RSS);
/// near a limit they are dropped (MADV_DONTNEED: known zero after), and blocks lazily freed
/// earlier are unmapped once due; `free` and `dontneed` fix the choice.
#[test]
fn idle_blocks_leave_rss_at_once_near_a_limit() {
    let l = layer(Config { release_ms: 100, expire_ms: 10_000, ..Config::default() });
    let a = l.alloc(16 * MB, 4096, false, 0).unwrap();
    let b = l.alloc(32 * MB, 4096, false, 0).unwrap();
    l.memory.write(a, 16 * MB);
    l.memory.write(b, 32 * MB);
    l.free(a, 16 * MB);
    advance(100 * MS);
    l.reap();
    assert_eq!((l.memory.calls().releases, l.memory.calls().discarded_bytes), (1, 0), "room: MADV_FREE");
    assert_eq!(l.cached_resident(), (0, 16 * MB));
    l.memory.set_near_limit(true);
    l.free(b, 32 * MB);
    advance(100 * MS);
    l.reap();
    assert_eq!(l.memory.calls().discarded_bytes, 32 * MB as u64, "near the limit: dropped");
    assert!(l.memory.reads_zero(b, 32 * MB));
    assert!(!l.memory.is_mapped(a, 16 * MB), "the lazily freed block is unmapped, not left in RSS");
    assert_eq!(l.cached_resident(), (0, 0));
    let c = l.alloc(32 * MB, 4096, true, 0).unwrap();
    assert_eq!(c, b);
    assert_eq!(l.memory.calls().zeroed_bytes, 0, "known zero: calloc writes nothing");
    l.free(c, 32 * MB);
    check(&l);
    // The setting fixes the choice whatever the room.
    for (mode, near, dropped) in [(Release::DontNeed, false, true), (Release::Free, true, false)] {
        let l = layer(Config { release_ms: 100, release: mode, ..Config::default() });
        l.memory.set_near_limit(near);
        let a = l.alloc(16 * MB, 4096, false, 0).unwrap();
        l.free(a, 16 * MB);
        advance(100 * MS);
        l.reap();
        assert_eq!(l.memory.calls().discarded_bytes > 0, dropped, "{mode:?}");
        assert_eq!(l.memory.calls().releases > 0, !dropped, "{mode:?}");
        check(&l);
    }
}

/// Note [What RSS shows]: the answer to "near a limit?" holds 50 ms; passes meanwhile do not
/// read the cgroup's files again, and a change is seen once it has passed.
#[test]
fn the_limit_question_is_asked_once_in_50_ms() {
    let l = layer(Config { release_ms: 1, expire_ms: 10_000, ..Config::default() });
    let reads = |l: &HostLayer<SimPages>| l.memory.calls().near_limit_reads;
    let idle_pass = |l: &HostLayer<SimPages>| {
        let a = l.alloc(16 * MB, 4096, false, 0).unwrap();
        l.memory.write(a, 16 * MB);
        l.free(a, 16 * MB);
        advance(2 * MS);
        l.reap();
    };
    idle_pass(&l);
    assert_eq!(reads(&l), 1);
    l.memory.set_near_limit(true);
    for _ in 0..10 {
        idle_pass(&l);
    }
    assert_eq!(reads(&l), 1, "20 ms of passes: the kept answer");
    assert_eq!(l.memory.calls().discarded_bytes, 0, "the kept answer was room");
    advance(30 * MS);
    idle_pass(&l);
    assert_eq!(reads(&l), 2, "52 ms on: read again");
    assert_eq!(l.memory.calls().discarded_bytes, 16 * MB as u64, "near the limit now: dropped");
    check(&l);
}

/// Note [Room for others]: under an address-space limit a freed block is unmapped at once, not
/// deferred; with a bound the user set, a failed request empties the cache only when it could
/// then succeed.
#[test]
fn the_cache_gives_way_under_an_address_space_limit() {
    let l = layer_with(Config::default(), yes);
    l.limit_mappings(1 << 30);
    assert_eq!(l.bounds().1, 0);
    let big = l.alloc(256 * MB, 4096, false, 0).unwrap();
    l.free(big, 256 * MB);
    assert!(!l.memory.is_mapped(big, 256 * MB), "unmapped at once, not deferred");
    assert_eq!(l.deferred_bytes(), 0);
    check(&l);
    let l = layer_with(Config { cache_bytes: Some(128 * MB as u64), ..Config::default() }, yes);
    l.limit_mappings(1 << 30);
    let small = l.alloc(64 * MB, 4096, false, 0).unwrap();
    l.free(small, 64 * MB);
    assert_eq!(l.cached(), (1, 64 * MB));
    // A request no limit could ever allow leaves the cache alone.
    l.memory.set_largest_mapping(1 << 30);
    l.memory.fail_next_maps(2); // the gather's mapping, then the fresh one
    assert!(l.alloc(2 << 30, 4096, false, 0).is_none());
    assert_eq!(l.cached(), (1, 64 * MB));
    assert!(!l.make_room(2 << 30, l.unmapped_bytes()));
    // One that could: the cache is emptied and the call tried once more.
    assert!(l.make_room(100 * MB, l.unmapped_bytes()));
    assert_eq!((l.cached(), l.stats.retries_after_trim.get()), ((0, 0), 1));
    assert!(!l.make_room(100 * MB, l.unmapped_bytes()), "nothing left to give back");
    check(&l);
}

#[test]
fn a_retry_waits_for_blocks_on_their_way_to_the_kernel() {
    // Note [Room for others], rule 6: another thread took a block out of the cache and is
    // unmapping it; the cache reads empty, yet the retry must come after the unmap.
    let l = layer(Config::default());
    let before = l.unmapped_bytes();
    assert!(!l.may_make_room(before));
    assert!(!l.make_room(100 * MB, before), "nothing cached, nothing in transit, nothing unmapped");
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let (returned, entered) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let (gate, returned, entered, stats) = (&l.transit, &returned, &entered, &l.stats);
        // Its unmap returns (and is counted, as unmap_timed does) once make_room waits for it,
        // or has returned without waiting. A pass is dropped by the thread that entered.
        s.spawn(move || {
            let pass = gate.enter([]);
            entered.store(true, SeqCst);
            while !gate.awaited() && !returned.load(SeqCst) {
                std::hint::spin_loop();
            }
            stats.unmapped_bytes.add(64 * MB as u64);
            drop(pass);
        });
        while !entered.load(SeqCst) {
            std::hint::spin_loop();
        }
        assert!(l.may_make_room(before));
        let made = l.make_room(100 * MB, before);
        returned.store(true, SeqCst);
        assert!(made, "room, once the other thread's unmap is done");
        assert!(!l.transit.occupied());
    });
    assert_eq!(l.stats.retries_after_trim.get(), 1);
    assert!(!l.may_make_room(l.unmapped_bytes()));
    // Another thread unmapped a block between the failed call and this question: room was made.
    let a = l.alloc(64 * MB, 4096, false, 0).unwrap();
    l.free(a, 64 * MB);
    let before = l.unmapped_bytes();
    l.trim();
    assert!(l.may_make_room(before) && l.make_room(100 * MB, before), "the other thread's unmap made room");
    assert!(!l.make_room(100 * MB, l.unmapped_bytes()));
    check(&l);
}

#[test]
fn a_retry_waits_for_blocks_the_background_pass_is_releasing() {
    // Note [Room for others], rule 7: the background pass is releasing a block (its madvise
    // under way, outside the lock) when a mapping fails. The trim leaves the block for the pass
    // to unmap once the madvise returns; the retry must come after that unmap.
    let l = layer(Config::default());
    let a = l.alloc(64 * MB, 4096, false, 0).unwrap();
    l.free(a, 64 * MB);
    l.memory.hold_releases();
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let returned = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (l, returned) = (&*l, &returned);
        s.spawn(move || {
            advance(2_000 * MS); // this thread's clock: idle past the release, short of the unmap
            l.reap();
        });
        while !l.memory.release_waiting() {
            std::thread::yield_now();
        }
        let before = l.unmapped_bytes();
        assert!(l.may_make_room(before));
        // The madvise returns once the retry waits for it, or has returned without waiting.
        s.spawn(move || {
            while !l.releasing.awaited() && !returned.load(SeqCst) {
                std::thread::yield_now();
            }
            l.memory.let_releases_go();
        });
        let made = l.make_room(100 * MB, before);
        returned.store(true, SeqCst);
        assert!(made, "room, once the pass has unmapped the block the trim left it");
        assert!(!l.memory.is_mapped(a, 64 * MB));
    });
    assert_eq!(l.stats.released_blocks.get(), 1);
    check(&l);
}

#[test]
fn out_of_memory_empties_the_cache_then_fails_cleanly() {
    let l = layer(Config::default());
    let a = l.alloc(64 * MB, 4096, false, 0).unwrap();
    l.free(a, 64 * MB);
    l.memory.fail_next_maps(2); // gathering a into 128 MB, then a fresh mapping
    let b = l.alloc(128 * MB, 4096, false, 0).expect("retried after trimming");
    assert_eq!(l.cached(), (0, 0));
    l.memory.fail_next_maps(2);
    assert_eq!(l.alloc(256 * MB, 4096, false, 0), None);
    assert_eq!(l.stats.map_failures.get(), 1);
    l.free(b, 128 * MB);
    check(&l);
}

#[test]
fn large_alignments_are_honoured() {
    let l = layer(Config::default());
    for shift in 12..=27 {
        let align = 1usize << shift;
        let a = l.alloc(5 * MB, align, false, 0).unwrap();
        assert_eq!(a % align, 0, "align {align}");
        let Owner::Live { len } = l.owner(a) else { panic!() };
        l.free(a, len);
        check(&l);
    }
}

#[test]
fn resize_in_place_by_moving_pages_and_shrink() {
    let l = layer(Config::default());
    let a = l.alloc(8 * MB, 4096, false, 0).unwrap();
    assert_eq!(l.resize(a, 8 * MB, 7 * MB), Some(a), "fits: unchanged");
    let b = l.resize(a, 8 * MB, 64 * MB).unwrap();
    assert_eq!(l.memory.calls().copied_bytes, 0, "mremap, not a copy");
    assert_eq!(l.owner(b), Owner::Live { len: 64 * MB });
    assert_eq!(l.owner(a), if a == b { Owner::Live { len: 64 * MB } } else { Owner::Foreign });
    let c = l.resize(b, 64 * MB, 8 * MB).unwrap();
    assert_eq!(c, b);
    assert_eq!(l.owner(c), Owner::Live { len: 8 * MB }, "the tail went back");
    check(&l);
    l.memory.fail_next_maps(5);
    assert_eq!(l.resize(c, 8 * MB, 512 * MB), None, "failure leaves the block as it was");
    assert_eq!(l.owner(c), Owner::Live { len: 8 * MB });
    check(&l);
}

#[test]
fn a_block_grows_by_moving_where_no_fresh_mapping_fits_beside_it() {
    // Note [Growing under a limit]: room for the new length, not for the old and the new.
    let l = layer(Config::default());
    let a = l.alloc(8 * MB, 4096, false, 0).unwrap();
    let neighbour = l.alloc(8 * MB, 4096, false, 0).unwrap();
    l.memory.write(a, 8 * MB);
    l.memory.room_to_move_only();
    let b = l.resize(a, 8 * MB, 64 * MB).expect("grown by moving");
    assert_ne!(b, a, "the neighbour stood in the way");
    assert_eq!(b % BLOCK_ALIGN, 0);
    assert_eq!(l.owner(b), Owner::Live { len: 64 * MB });
    assert_eq!(l.owner(a), Owner::Foreign, "the old range is no longer ours");
    assert_eq!(l.memory.calls().copied_bytes, 0, "moved, not copied");
    l.free(b, 64 * MB);
    l.free(neighbour, 8 * MB);
    check(&l);
}

#[test]
fn resized_blocks_keep_block_alignment() {
    let l = layer(Config { hugepages: HugePages::Never, threshold_bytes: 4096, ..Config::default() });
    let a = l.alloc(100_000, 4096, false, 0).unwrap();
    assert_eq!(l.owner(a), Owner::Live { len: 2 * BLOCK_ALIGN }, "length rounded to BLOCK_ALIGN");
    let last = l.alloc(100_000, 4096, false, 0).unwrap();
    let b = l.resize(last, 2 * BLOCK_ALIGN, 300_000).unwrap();
    assert_eq!((b, l.owner(b)), (last, Owner::Live { len: 5 * BLOCK_ALIGN }), "the newest mapping grows in place");
    let c = l.resize(a, 2 * BLOCK_ALIGN, 300_000).unwrap();
    assert_ne!(c, a, "a neighbour follows: the pages move");
    assert_eq!(c % BLOCK_ALIGN, 0);
    assert_eq!(l.memory.calls().copied_bytes, 0, "moved by mremap, not copied");
    let d = l.resize(c, 5 * BLOCK_ALIGN, 70_000).unwrap();
    assert_eq!((d, l.owner(d)), (c, Owner::Live { len: 2 * BLOCK_ALIGN }), "shrunk to a BLOCK_ALIGN multiple");
    check(&l);
}

#[test]
fn cache_off_unmaps_at_once() {
    let l = layer(Config { cache_blocks: Some(0), ..Config::default() });
    let a = l.alloc(8 * MB, 4096, false, 0).unwrap();
    l.free(a, 8 * MB);
    assert_eq!(l.memory.mapped_bytes(), 0);
    assert_eq!(l.owner(a), Owner::Foreign);
}

/// A random program of allocs, calloc, frees, resizes, trims and clock jumps, checked against
/// a shadow of the live blocks after every step.
#[test]
fn random_programs_match_the_shadow_model() {
    for seed in 1..=crate::sim::rounds(40, 4) as u64 {
        let config = Config {
            cache_blocks: if seed % 6 == 5 { None } else { Some((seed % 5) as usize) },
            cache_bytes: if seed % 4 == 3 { None } else { Some((seed % 7 + 1) * 64 * MB as u64) },
            release_ms: seed % 3 * 50,
            expire_ms: 200,
            max_waste_percent: if seed % 5 == 4 { None } else { Some(seed % 50) },
            hugepages: if seed % 2 == 0 { HugePages::Auto } else { HugePages::Never },
            ..Config::default()
        };
        // Every third program with mappings back to back (merged blocks mremap will not move).
        let pages = if seed % 3 == 0 { SimPages::adjacent() } else { SimPages::new() };
        let l = Box::new(HostLayer::new(pages, leak_table, fake_clock, Background { on_cached: nothing_due, running: if seed % 2 == 0 { yes } else { no }, wake: nothing }));
        l.configure(&config, 64 << 30, false);
        // Threads' slots in every other program, whatever the bounds (Note [A thread's own slot]).
        let slots = seed % 4 < 2;
        l.set_slots(slots, config.release_ms * MS);
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut live: BTreeMap<usize, usize> = BTreeMap::new(); // addr -> requested size
        for _ in 0..crate::sim::rounds(400, 60) {
            match next() % 10 {
                0..=3 => {
                    // A third below 4 MiB: blocks rounded to BLOCK_ALIGN rather than huge pages.
                    let size = if next() % 3 == 0 { 4096 + (next() % (4 * MB as u64)) as usize } else { 4 * MB + (next() % (96 * MB as u64)) as usize };
                    let align = 1usize << (12 + next() % 10);
                    let zeroed = next() % 3 == 0;
                    let a = l.alloc(size, align, zeroed, 0).unwrap();
                    let Owner::Live { len } = l.owner(a) else { panic!("not live") };
                    if zeroed {
                        assert!(l.memory.reads_zero(a, len), "calloc handed out a block that does not read zero to its usable size");
                    }
                    assert!(l.memory.is_plain(a, len), "a block handed out is not plain memory (Note [Plain memory])");
                    // The program uses it densely, sparsely, or not at all; and at times changes
                    // the protection or advice of some of its pages.
                    match next() % 3 {
                        0 => l.memory.write(a, size),
                        1 => {
                            l.memory.write(a, 8);
                            l.memory.write(a + size / 2, 8);
                        }
                        _ => {}
                    }
                    if next() % 4 == 0 {
                        change(&l, a + ((size / 2) & !(PAGE - 1)), PAGE);
                    }
                    assert_eq!(a % align, 0);
                    assert_eq!(a % BLOCK_ALIGN, 0, "free's fast path needs it");
                    let Owner::Live { len } = l.owner(a) else { panic!("not live") };
                    assert!(len >= size);
                    assert!(l.memory.is_mapped(a, len));
                    for (&b, &bs) in &live {
                        assert!(a + size <= b || b + bs <= a, "overlap");
                    }
                    live.insert(a, size);
                }
                4..=6 if !live.is_empty() => {
                    let k = *live.keys().nth((next() % live.len() as u64) as usize).unwrap();
                    live.remove(&k);
                    let Owner::Live { len } = l.owner(k) else { panic!() };
                    l.free(k, len);
                    assert_ne!(l.owner(k), Owner::Live { len });
                    // The commonest use: the same size asked for again at once.
                    if next() % 2 == 0 {
                        let size = len - (next() % 4096) as usize;
                        let zeroed = next() % 4 == 0;
                        let a = l.alloc(size, 4096, zeroed, 0).unwrap();
                        let Owner::Live { len: got } = l.owner(a) else { panic!("not live") };
                        assert!(got >= size && l.memory.is_plain(a, got));
                        assert!(!zeroed || l.memory.reads_zero(a, got), "calloc again: not zero");
                        for (&b, &bs) in &live {
                            assert!(a + size <= b || b + bs <= a, "overlap");
                        }
                        if next() % 2 == 0 {
                            l.memory.write(a, size);
                        }
                        live.insert(a, size);
                    }
                }
                7 if !live.is_empty() => {
                    let k = *live.keys().next().unwrap();
                    let Owner::Live { len } = l.owner(k) else { panic!() };
                    let size = 4 * MB + (next() % (128 * MB as u64)) as usize;
                    let moved = l.resize(k, len, size).unwrap();
                    live.remove(&k);
                    live.insert(moved, size);
                    let Owner::Live { len } = l.owner(moved) else { panic!() };
                    assert!(len >= size && l.memory.is_mapped(moved, len));
                    assert_eq!(moved % BLOCK_ALIGN, 0);
                }
                8 => advance(next() % (150 * MS)),
                9 => {
                    match next() % 8 {
                        0 | 1 => {
                            l.trim();
                        }
                        2 => l.settle_slots(),
                        _ => {
                            l.reap();
                        }
                    }
                }
                _ => {}
            }
            if let Some(&a) = live.keys().nth((next() % (live.len() as u64 + 1)) as usize) {
                // Near either end: the walk back from the middle is page by page, too slow here.
                let Owner::Live { len } = l.owner(a) else { panic!() };
                assert_eq!(l.block_containing(a + len - 1), Some(a), "interior of a live block");
                assert_eq!(l.block_containing(a + PAGE + 8), Some(a), "interior of a live block");
                assert_ne!(l.block_containing(a + len), Some(a), "past a live block");
                assert!(registry::ever_overlapped(a + 8) && registry::ever_overlapped(a + len - 8), "the free check's filter");
            }
            check(&l);
        }
    }
}

/// large_churn.c's pattern, 16 threads round robin, each replacing one of 4 blocks of 4-64 MB
/// and writing all of it: the pages faulted in over the whole run come to no more than the
/// highest live total (Notes [Neighbours merge] and [Gathering pages]: a request bigger than
/// every cached block gathers their pages instead of faulting in new ones). The old policy
/// faulted 40% more here. With mappings back to back too, where merged blocks span mappings
/// that mremap will not move whole.
#[test]
fn churn_faults_in_no_more_than_the_live_peak() {
    for adjacent in [false, true] {
        let pages = if adjacent { SimPages::adjacent() } else { SimPages::new() };
        let l = Box::new(HostLayer::new(pages, leak_table, fake_clock, Background { on_cached: nothing_due, running: yes, wake: nothing }));
        l.configure(&Config::default(), 24 << 30, false);
        let mut slots = [[0usize; 4]; 16];
        let mut seeds: Vec<u32> = (0..16).map(|i| i * 7919 + 17).collect();
        let mut peak = 0;
        for round in 0..crate::sim::rounds(100, 3) {
            for (slot, seed) in slots.iter_mut().zip(seeds.iter_mut()) {
                *seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                let i = (*seed >> 8) as usize % 4;
                let size = ((*seed >> 4) as usize % 61 + 4) * MB;
                if slot[i] != 0 {
                    l.free(slot[i], live_len(&l, slot[i]));
                }
                slot[i] = l.alloc(size, 16, false, 0).unwrap();
                l.memory.write(slot[i], size);
                peak = peak.max(l.stats.live.current() as usize);
                advance(MS / 4);
            }
            if round % 10 == 0 {
                l.reap();
            }
            check(&l);
        }
        let faulted = l.memory.calls().faulted_bytes as usize;
        assert!(faulted <= peak + peak / 100, "adjacent {adjacent}: faulted {} MiB, live peak {} MiB", faulted / MB, peak / MB);
        assert!(l.stats.grows.get() > 0 && l.stats.hits.get() > l.stats.grows.get());
        for &a in slots.iter().flatten() {
            l.free(a, live_len(&l, a));
        }
        check(&l);
    }
}

/// A merged block spanning two kernel mappings, which kernels before 6.17 will not move whole:
/// gathered by halves. And when a refusal loses the destination to another thread, the gather
/// is abandoned without touching that range again; the request is served fresh.
#[test]
fn gathering_survives_refused_moves() {
    for zeroed in [false, true] {
        let l = Box::new(HostLayer::new(SimPages::adjacent(), leak_table, fake_clock, Background { on_cached: nothing_due, running: no, wake: nothing }));
        l.configure(&Config::default(), 64 << 30, false);
        close_slots(&l);
        let a = l.alloc(8 * MB, 4096, false, 0).unwrap();
        let b = l.alloc(8 * MB, 4096, false, 0).unwrap();
        assert_eq!(b, a + 8 * MB, "back to back");
        l.memory.write(a, 16 * MB);
        l.free(a, 8 * MB);
        l.free(b, 8 * MB);
        assert_eq!(l.cached(), (1, 16 * MB), "merged");
        let faulted = l.memory.calls().faulted_bytes;
        let c = l.alloc(32 * MB, 4096, zeroed, 0).unwrap();
        assert_eq!((l.stats.grows.get(), l.cached()), (1, (0, 0)), "both halves moved");
        assert!(!zeroed || l.memory.reads_zero(c, 32 * MB));
        l.memory.write(c, 32 * MB);
        // calloc drops the moved pages it knows nothing of (Note [calloc costs what is touched]).
        let lacked = if zeroed { 32 * MB } else { 16 * MB };
        assert_eq!(l.memory.calls().faulted_bytes - faulted, lacked as u64, "only what the cache lacked");
        l.free(c, 32 * MB);
        check(&l);

        let l = Box::new(HostLayer::new(SimPages::adjacent(), leak_table, fake_clock, Background { on_cached: nothing_due, running: no, wake: nothing }));
        l.configure(&Config::default(), 64 << 30, false);
        let a = l.alloc(8 * MB, 4096, false, 0).unwrap();
        let b = l.alloc(8 * MB, 4096, false, 0).unwrap();
        l.free(a, 8 * MB);
        l.free(b, 8 * MB);
        l.memory.lose_destinations();
        let c = l.alloc(32 * MB, 4096, zeroed, 0).unwrap();
        assert_eq!((l.stats.grows.get(), l.stats.misses.get()), (0, 3), "served fresh");
        assert_eq!(l.cached(), (1, 16 * MB), "the parts are cached again");
        assert!(!zeroed || l.memory.reads_zero(c, 32 * MB));
        l.memory.write(c, 32 * MB);
        l.free(c, 32 * MB);
        check(&l);
    }
}

#[test]
fn the_holders_table_follows_allocs_resizes_and_frees_with_what_was_asked() {
    let l = layer(Config::default());
    // A key of this test's own: the table is the process's, shared with other tests.
    let w = crate::record::holders::table_to_write().unwrap().holder_of_hook(0x4321, 0x4242_0000);
    let row = || {
        let mut out = (0, 0, 0, 0);
        crate::record::holders::for_each_row(|r| {
            if r.id == crate::record::holders::id_of(w) && r.place == crate::record::holders::PLACE_HOST {
                out = (r.live_bytes, r.peak_bytes, r.blocks, r.unused_bytes);
            }
        });
        out
    };
    let mb = MB as u64;
    let a = l.alloc(8 * MB, PAGE, false, w).unwrap();
    let b = l.alloc(16 * MB - 100, PAGE, false, w).unwrap();
    let (la, lb) = (live_len(&l, a) as u64, live_len(&l, b) as u64);
    let asked = 8 * mb + 16 * mb - 100;
    assert_eq!(row(), (asked, asked, 2, la + lb - asked), "what was asked, and the rest as unused");
    let b = l.resize(b, lb as usize, 40 * MB).unwrap();
    let lb2 = live_len(&l, b) as u64;
    assert_eq!(row(), (48 * mb, 48 * mb, 2, la + lb2 - 48 * mb), "a grown block counts its new request");
    l.free(a, la as usize);
    l.free(b, lb2 as usize);
    assert_eq!(row(), (0, 48 * mb, 0, 0));
    assert_eq!(l.stats.live.current(), 0);
}

/// Note [Fork handlers that allocate]: another library's handlers, run between ours, allocate
/// and free on the forking thread: the parent's get the cache at once, the child's never get a
/// block the child did not inherit, and our child handler then forgets nothing they freed.
#[test]
fn fork_handlers_of_other_libraries_may_allocate_between_ours() {
    let l = layer(Config::default());
    let a = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    l.free(a, 8 * MB);
    l.lock_for_fork();
    // A prepare handler registered before ours runs after it, in the parent.
    let b = l.alloc(8 * MB, PAGE, false, 0).expect("no deadlock on the lock we hold");
    assert_eq!(b, a, "the parent's handler gets the cache as it was");
    l.free(b, 8 * MB);
    // The child: a child handler registered before ours runs before it.
    l.memory.become_child();
    assert!(l.memory.hidden_from_children(a, 8 * MB));
    let c = l.alloc(8 * MB, PAGE, false, 0).unwrap();
    assert_ne!(c, a, "never a block the child did not inherit");
    assert!(!l.memory.hidden_from_children(c, 8 * MB));
    assert_eq!(l.owner(a), registry::Owner::Foreign, "the parent's cache is forgotten in the child");
    l.free(c, 8 * MB);
    // SAFETY: lock_for_fork ran on this thread (the child's copy of it).
    unsafe { l.unlock_after_fork() };
    l.forget_cache_in_child();
    assert_eq!(l.owner(c), registry::Owner::Cached, "what the other handler freed stays the child's");
    assert_eq!(l.alloc(8 * MB, PAGE, false, 0), Some(c));
    assert!(l.memory.is_plain(c, 8 * MB), "and is readmitted as the child's program takes it");
    l.free(c, 8 * MB);
    l.check_invariants().unwrap();
}

/// A request no mapping could ever satisfy, for its alignment, leaves the cache as it was
/// (Note [Room for others]): emptying it would lose the cache and gain nothing.
#[test]
fn an_impossible_alignment_leaves_the_cache_alone() {
    let l = layer(Config::default());
    l.memory.set_largest_mapping(1 << 30);
    let a = l.alloc(64 * MB, PAGE, false, 0).unwrap();
    l.free(a, 64 * MB);
    // Every mapping fails (the simulator would place any alignment); its addresses start on
    // 2^46, so no cached block is on 2^47.
    l.memory.fail_next_maps(100);
    assert_eq!(l.alloc(8 * MB, 1 << 47, false, 0), None);
    l.memory.fail_next_maps(0);
    assert_eq!(l.cached().1, 64 * MB, "nothing given back for a request no room could serve");
    assert_eq!(l.stats.retries_after_trim.get(), 0);
    assert!(!l.could_map(8 * MB, 1 << 47) && l.could_map(8 * MB, 2 * MB) && l.could_map(8 * MB, 64 * MB));
    check(&l);
}

/// Note [Hot within the memory]: in a cgroup whose limit bounds the process, a sixteenth of it
/// stays hot; with physical memory the bound, or with a fixed cache size, all of it may.
#[test]
fn a_cgroup_limit_bounds_what_stays_hot() {
    let l = Box::new(HostLayer::new(SimPages::new(), leak_table, fake_clock, Background { on_cached: nothing_due, running: yes, wake: nothing }));
    l.configure(&Config::default(), 512 * MB as u64, true);
    assert_eq!(l.cache().limits().max_hot_bytes, 32 * MB);
    l.configure(&Config::default(), 512 * MB as u64, false);
    assert_eq!(l.cache().limits().max_hot_bytes, usize::MAX);
    l.configure(&Config { cache_bytes: Some(256 << 20), ..Config::default() }, 512 * MB as u64, true);
    assert_eq!(l.cache().limits().max_hot_bytes, usize::MAX, "a bound the user set is kept hot");
}

/// Note [Ranges the program claims]: a cached block the program maps over (or unmaps) leaves the
/// cache and is unmapped whole before the call; live blocks and far ranges are left alone.
#[test]
fn a_range_the_program_claims_leaves_the_cache() {
    let l = layer(Config::default());
    let a = l.alloc(16 * MB, 4096, false, 0).unwrap();
    let b = l.alloc(16 * MB, 4096, false, 0).unwrap();
    l.memory.write(a, 16 * MB);
    l.free(a, 16 * MB);
    assert_eq!(l.cached(), (1, 16 * MB));
    l.claim_range(b + 4096, 8192);
    assert_eq!(l.cached(), (1, 16 * MB), "a live block is only marked");
    l.claim_range(a + 2 * MB, 2 * MB);
    assert_eq!(l.cached(), (0, 0));
    assert!(!l.memory.is_mapped(a, 16 * MB), "unmapped whole, as glibc's free had");
    assert_eq!(l.registry.owner(a), Owner::Foreign);
    let maps = l.memory.calls().maps;
    let c = l.alloc(16 * MB, 4096, false, 0).unwrap();
    assert_eq!(l.memory.calls().maps, maps + 1, "the next request: a fresh mapping");
    check(&l);
    l.free(b, 16 * MB);
    l.free(c, 16 * MB);
    let unmaps = l.memory.calls().unmaps;
    l.claim_range(0x7000_0000_0000, 4096);
    assert_eq!((l.cached().0, l.memory.calls().unmaps), (2, unmaps), "far from our blocks: nothing");
    check(&l);
}

/// A realloc that grows a block whose pages the program changed copies into a plain block (the
/// old one is reset at its free), as glibc's refused mremap does; an unchanged one moves.
#[test]
fn a_block_grows_over_the_cached_rest_that_follows_it() {
    // Note [Growing over the cache]: a block from the head of a cached one grows over the rest
    // with no system call, turn after turn, and the cache holds no more than it did.
    let l = layer(Config { max_waste_percent: Some(10), ..Config::default() });
    let first = l.alloc(16 * MB, 4096, false, 0).unwrap();
    l.free(first, 16 * MB);
    let before = (l.memory.calls(), l.cached());
    for _ in 0..100 {
        let a = l.alloc(4 * MB, 4096, false, 0).unwrap();
        assert_eq!(a, first, "the head of the cached block");
        assert_eq!(l.resize(a, 4 * MB, 8 * MB), Some(a), "grown in place");
        assert_eq!(l.owner(a), Owner::Live { len: 8 * MB });
        check(&l);
        l.free(a, 8 * MB);
    }
    let after = (l.memory.calls(), l.cached());
    assert_eq!((after.0.maps, after.0.remaps, after.0.copied_bytes), (before.0.maps, before.0.remaps, before.0.copied_bytes), "no system call");
    assert_eq!(after.1, before.1, "the cache holds what it held");
    check(&l);
}

#[test]
fn a_changed_block_grown_within_its_rounding_is_copied_into_a_plain_one() {
    // Note [Growing a changed block]: 5 MB is a 6 MiB block; 5.5 MB fits it, onto new pages.
    let l = layer(Config::default());
    let a = l.alloc(5_000_000, 4096, false, 0).unwrap();
    assert_eq!(l.owner(a), Owner::Live { len: 6 * MB });
    l.memory.write(a, 6 * MB);
    l.note_page_change(a + MB, MB, PageChange::Changed);
    let b = l.resize(a, 6 * MB, 5_500_000).unwrap();
    assert_ne!(b, a, "copied");
    assert!(!l.registry.marks(b).changed(), "the new block is plain");
    // The same pages (a growth inside the last page asked for): kept, as glibc keeps it.
    l.note_page_change(b, MB, PageChange::Changed);
    assert_eq!(l.resize(b, live_len(&l, b), 5_500_001), Some(b));
    l.free(b, live_len(&l, b));
    check(&l);
}

#[test]
fn growing_a_changed_block_copies_into_a_plain_one() {
    let l = layer(Config::default());
    let a = l.alloc(16 * MB, 4096, false, 0).unwrap();
    l.memory.write(a, 16 * MB);
    l.note_page_change(a + 4 * MB, MB, PageChange::Changed);
    let (copied, resets) = (l.memory.calls().copied_bytes, l.memory.calls().resets);
    let b = l.resize(a, 16 * MB, 64 * MB).unwrap();
    assert_ne!(b, a);
    assert_eq!(l.memory.calls().copied_bytes, copied + 16 * MB as u64, "copied");
    assert_eq!(l.memory.calls().resets, resets + 1, "the old block reset at its free");
    assert!(!l.registry.marks(b).changed(), "the new block is plain");
    let remaps = l.stats.remaps.get();
    let c = l.resize(b, 64 * MB, 128 * MB).unwrap();
    assert_eq!(l.stats.remaps.get(), remaps + 1, "plain: grown without a copy");
    // Changed, and no room for a copy (an address-space limit): grown by mremap, as glibc's is
    // when the change covered the whole mapping.
    l.note_page_change(c, 128 * MB, PageChange::Changed);
    l.memory.room_to_move_only();
    let copied = l.memory.calls().copied_bytes;
    let d = l.resize(c, 128 * MB, 160 * MB).unwrap();
    assert_eq!(l.memory.calls().copied_bytes, copied, "no copy");
    assert_eq!(l.stats.remaps.get(), remaps + 2, "moved");
    assert!(l.registry.marks(d).changed(), "the change carries on, as in glibc's grown mapping");
    l.free(d, 160 * MB);
    check(&l);
}

#[test]
fn blocks_freed_while_the_cache_is_off_go_back_at_once() {
    let l = layer(Config::default());
    let a = l.alloc(32 * MB, 4096, false, 0).unwrap();
    let b = l.alloc(32 * MB, 4096, false, 0).unwrap();
    let (len_a, len_b) = (live_len(&l, a), live_len(&l, b));
    // Off (tm_set_enabled(0), mallopt): no request would take a cached block.
    assert!(l.swap_enabled(false));
    let unmaps = l.memory.calls().unmaps;
    l.free(a, len_a);
    assert_eq!(l.owner(a), Owner::Foreign, "unmapped, not cached");
    assert_eq!(l.memory.calls().unmaps, unmaps + 1);
    // A realloc that shrinks keeps nothing of its tail either.
    assert_eq!(l.resize(b, len_b, 4 * MB), Some(b));
    assert_eq!(l.cached(), (0, 0));
    assert_eq!(l.stats.unresettable.get(), 0, "not a block that could not be reset");
    check(&l);
    // On again: freed blocks are cached.
    l.swap_enabled(true);
    l.free(b, live_len(&l, b));
    assert_eq!(l.owner(b), Owner::Cached);
    check(&l);
}
