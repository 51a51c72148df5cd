//! The device layer over simulated devices: reuse, sync semantics, OOM recovery with a clean
//! last error, the cap, two devices, pinned memory, foreign pointers, pass-through.

use super::*;
use crate::device::device_layer::{Export, RangeAnswer};
use crate::backing::PrimaryContext;
use crate::config::Config;
use crate::sim::leak_table;
use crate::sim::SimRuntime;

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn layer(config: Config, capacities: &[usize]) -> Box<DeviceLayer<SimRuntime>> {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(capacities), leak_table, crate::sys::clock::now_ns));
    l.configure(&config);
    l
}

#[test]
fn freed_blocks_are_reused_without_runtime_calls() {
    let l = layer(Config::default(), &[8 * GB]);
    let a = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.free(a), Ok(FreeAnswer::Pooled));
    let b = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(a, b);
    let d = l.runtime().device(0);
    assert_eq!((d.mallocs, d.frees), (1, 0));
    assert_eq!(d.syncs, 1, "the free synchronized, as cudaFree does");
}

#[test]
fn deferred_mode_syncs_only_at_reuse() {
    let l = layer(Config { cuda_sync: crate::config::CudaSync::Reuse, ..Config::default() }, &[8 * GB]);
    let a = l.malloc(64 * MB, 0).unwrap();
    l.free(a).unwrap();
    assert_eq!(l.runtime().device(0).syncs, 0);
    assert_eq!(l.malloc(64 * MB, 0).unwrap(), a);
    assert_eq!(l.runtime().device(0).syncs, 1);
}

#[test]
fn out_of_memory_gives_back_cache_and_leaves_no_error() {
    let l = layer(Config::default(), &[GB]);
    let a = l.malloc(600 * MB, 0).unwrap();
    l.free(a).unwrap();
    let b = l.malloc(700 * MB, 0).expect("cache given back, then retried");
    assert_eq!(l.runtime().last_error(), 0, "no stale error after a recovered OOM");
    let mut retries = 0;
    l.for_each_pool(|_, p| retries += p.stats.oom_retries);
    assert_eq!(retries, 1);
    assert_eq!(l.malloc(900 * MB, 0), Err(DeviceError::OutOfMemory));
    l.free(b).unwrap();
}

#[test]
fn cap_in_bytes_and_percent() {
    let l = layer(Config { cuda_limit: DeviceLimit::Bytes(256 * MB as u64), ..Config::default() }, &[8 * GB]);
    let a = l.malloc(200 * MB, 0).unwrap();
    assert_eq!(l.malloc(100 * MB, 0), Err(DeviceError::CapReached));
    l.free(a).unwrap();
    assert!(l.malloc(100 * MB, 0).is_ok(), "freed segment given back under the cap");
    let l = layer(Config { cuda_limit: DeviceLimit::Percent(50), ..Config::default() }, &[GB]);
    assert!(l.malloc(400 * MB, 0).is_ok());
    assert_eq!(l.malloc(200 * MB, 0), Err(DeviceError::CapReached));
    let (free, total) = l.mem_info().unwrap();
    assert_eq!(total, GB);
    assert!(free <= 512 * MB - 400 * MB, "free reflects the cap: {free}");
}

#[test]
fn mem_info_counts_cached_bytes_as_free() {
    let l = layer(Config::default(), &[4 * GB]);
    let (free0, _) = l.mem_info().unwrap();
    let a = l.malloc(512 * MB, 0).unwrap();
    l.free(a).unwrap();
    let (free1, _) = l.mem_info().unwrap();
    assert_eq!(free1, free0, "the cached 512 MB still count as free");
}

#[test]
fn blocks_return_to_their_own_device() {
    let l = layer(Config::default(), &[4 * GB, 4 * GB]);
    let a = l.malloc(64 * MB, 0).unwrap();
    l.runtime().set_device(1).unwrap();
    let b = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.free(a), Ok(FreeAnswer::Pooled), "device 0's block freed while device 1 is current");
    assert!(l.malloc(64 * MB, 0).unwrap_or(0) != a, "device 1 does not get device 0's block");
    l.runtime().set_device(0).unwrap();
    assert_eq!(l.malloc(64 * MB, 0).unwrap(), a);
    assert_eq!(l.runtime().device(0).syncs, 1, "the owning device was synchronized");
    l.free(b).unwrap();
}

#[test]
fn foreign_pointers_and_pass_through() {
    let l = layer(Config::default(), &[4 * GB]);
    assert_eq!(l.free(0xdead_0000), Ok(FreeAnswer::NotOurs));
    let l = layer(Config { cuda_pool: crate::config::CudaPool::None, ..Config::default() }, &[4 * GB]);
    let a = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.free(a), Ok(FreeAnswer::NotOurs), "pool off: the runtime frees it");
    assert_eq!(l.runtime().device(0).mallocs, 1);
    let l = layer(Config { disabled: true, ..Config::default() }, &[4 * GB]);
    l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.stats.passthrough.get(), 1);
}

#[test]
fn stream_frees_are_reused_on_that_stream_without_sync() {
    let l = layer(Config::default(), &[4 * GB]);
    let a = l.malloc_on_stream(64 * MB, 0, 0x77, 0).unwrap();
    assert_eq!(l.free_on_stream(a, 0, 0x77), FreeAnswer::Pooled);
    assert_eq!(l.malloc_on_stream(64 * MB, 0, 0x77, 0).unwrap(), a);
    assert_eq!(l.runtime().device(0).syncs, 0);
}

#[test]
fn pinned_memory_is_cached_and_trimmed() {
    let l = layer(Config::default(), &[4 * GB]);
    let p = l.host_alloc(100 * MB, 0, 0).unwrap();
    assert_eq!(l.host_free(p), Ok(FreeAnswer::Pooled));
    assert_eq!(l.host_alloc(100 * MB, 0, 0).unwrap(), p);
    assert_eq!(l.runtime().host_allocs(), 1);
    assert_eq!(l.host_free(0x1234_0000), Ok(FreeAnswer::NotOurs));
    l.host_free(p).unwrap();
    assert!(l.trim() >= 100 * MB as u64);
    assert_eq!(l.runtime().pinned_bytes(), 0);
}

/// What cudaDeviceReset does around the runtime's own reset.
fn reset_primary(l: &DeviceLayer<SimRuntime>, device: i32) {
    l.forget_primary(device);
    l.runtime().destroy_context(SimRuntime::primary_handle(device as usize));
    l.forget_primary(device);
}

#[test]
fn a_reset_forgets_cached_and_live_blocks() {
    for config in [Config::default(), Config { cuda_pool: crate::config::CudaPool::Binned, ..Config::default() }, Config { cuda_sync: crate::config::CudaSync::Reuse, ..Config::default() }] {
        let l = layer(config, &[4 * GB]);
        let cached = l.malloc(64 * MB, 0).unwrap();
        let live = l.malloc(8 * MB, 0).unwrap();
        l.free(cached).unwrap();
        reset_primary(&l, 0);
        let fresh = l.malloc(64 * MB, 0).unwrap();
        assert!(l.runtime().is_live(fresh), "a block of the reset context was handed out");
        assert_eq!(l.free(live), Ok(FreeAnswer::NotOurs), "a block live across the reset is the runtime's to answer for");
        let mut resets = 0;
        l.for_each_pool(|_, p| {
            resets += p.stats.resets;
            p.check_invariants().unwrap();
        });
        assert_eq!(resets, 2);
    }
}

#[test]
fn a_primary_context_released_to_zero_forgets_its_blocks() {
    let l = layer(Config::default(), &[4 * GB]);
    let cached = l.malloc(64 * MB, 0).unwrap();
    let live = l.malloc(8 * MB, 0).unwrap();
    l.free(cached).unwrap();
    let pinned = l.host_alloc(MB, 0, 0).unwrap();
    l.host_free(pinned).unwrap();
    let before = l.primary_context(0);
    assert_eq!(before, PrimaryContext::Active(SimRuntime::primary_handle(0)));
    l.primary_released(0, before);
    assert_eq!(l.malloc(64 * MB, 0).unwrap(), cached, "a release that leaves a reference keeps the cache");
    l.free(cached).unwrap();
    // The last reference: the context and its allocations die, the handle stays.
    l.runtime().destroy_context(SimRuntime::primary_handle(0));
    l.primary_released(0, before);
    let fresh = l.malloc(64 * MB, 0).unwrap();
    assert!(l.runtime().is_live(fresh), "a block of the released context was handed out");
    assert_eq!(l.free(live), Ok(FreeAnswer::NotOurs), "a block live across the release is the runtime's to answer for");
    l.host_alloc(MB, 0, 0).unwrap();
    assert_eq!(l.runtime().host_allocs(), 2, "the pinned block of the released context was handed out");
}

#[test]
fn destroying_a_user_context_forgets_only_its_pool() {
    let l = layer(Config::default(), &[4 * GB, 4 * GB]);
    let ctx = 0x9000;
    l.runtime().set_context(Some(ctx));
    let a = l.malloc(64 * MB, 0).unwrap();
    l.free(a).unwrap();
    l.runtime().set_context(None);
    l.runtime().set_device(1).unwrap();
    let other = l.malloc(64 * MB, 0).unwrap();
    l.free(other).unwrap();
    l.runtime().set_device(0).unwrap();
    // The primary context is not the pool's: no block of the user context's segment.
    let p = l.malloc(64 * MB, 0).unwrap();
    assert_ne!(p, a, "device 0's pool belongs to the user context");
    assert_eq!(l.free(p), Ok(FreeAnswer::NotOurs), "served by the runtime, outside the pool");
    l.forget_context(ctx);
    l.runtime().destroy_context(ctx);
    let b = l.malloc(64 * MB, 0).unwrap();
    assert!(l.runtime().is_live(b));
    l.runtime().set_device(1).unwrap();
    assert_eq!(l.malloc(64 * MB, 0).unwrap(), other, "device 1's pool kept its cache");
}

#[test]
fn a_reset_while_a_segment_is_being_mapped_drops_that_segment() {
    let l = layer(Config::default(), &[4 * GB]);
    let a = l.malloc(64 * MB, 0).unwrap();
    l.free(a).unwrap();
    let generation = l.pools[0].lock().generation();
    reset_primary(&l, 0);
    assert_ne!(l.pools[0].lock().generation(), generation);
}

/// Note [IPC]: a whole-segment block gets the driver's handle; a block sharing its segment, the
/// segment's handle and its offset (the route publishes them); either, once named, is dead at its
/// free: never handed out again, and its segment goes back whole when no live block is left.
#[test]
fn ipc_exports_name_blocks_and_exported_blocks_are_never_reused() {
    let l = layer(Config::default(), &[4 * GB]);
    let small_a = l.malloc(MB, 0).unwrap();
    let small_b = l.malloc(MB, 0).unwrap();
    let Export::Shared(b) = l.export(small_b) else { panic!("{:?}", l.export(small_b)) };
    let segment = l.runtime().allocation_range(small_b).unwrap().0 as u64;
    assert_eq!((b.addr, b.size, b.offset, b.segment_len), (small_b as u64, MB as u64, small_b as u64 - segment, 20 * MB as u64));
    assert_eq!(&b.real[..8], b"SIMIPC\0\0", "the segment's own handle");
    assert_eq!(u64::from_le_bytes(b.real[8..16].try_into().unwrap()), segment);
    assert_eq!(l.export(small_b + 100), Export::Shared(b), "an interior pointer names its block");
    assert!(l.mark_export(b.device, b.addr, b.buffer_id, 7));
    assert!(!l.mark_export(b.device, b.addr, b.buffer_id, 8), "named once");
    let Export::Shared(again) = l.export(small_b) else { panic!() };
    assert_eq!(again.entry, Some(7), "the entry naming it already");
    let big = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.export(big), Export::Whole);
    assert_eq!(l.export(0xdead_0000), Export::NotOurs);
    let mallocs = l.runtime().device(0).mallocs;
    l.free(big).unwrap();
    assert!(!l.runtime().is_live(big), "an exported segment goes back to the runtime at its free");
    let again = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.runtime().device(0).mallocs, mallocs + 1, "and is never reused from the cache");
    l.free(again).unwrap();
    // The exported small block freed: dead, never handed out again while its segment lives.
    l.free(small_b).unwrap();
    assert_eq!(l.export(small_b), Export::NotLive);
    assert_eq!(l.free(small_b), Ok(FreeAnswer::Refused), "a dead block freed again");
    l.for_each_pool(|_, p| p.check_invariants().unwrap());
    let others: Vec<usize> = (0..30).map(|_| l.malloc(MB, 0).unwrap()).collect();
    assert!(others.iter().all(|&o| o + MB <= small_b || o >= small_b + MB), "no block over the dead one");
    assert!(others.iter().filter(|&&o| o.abs_diff(small_b) < 20 * MB).count() > 10, "its segment filled around it");
    l.for_each_pool(|_, p| p.check_invariants().unwrap());
    for o in others {
        l.free(o).unwrap();
    }
    let frees = l.runtime().device(0).frees;
    l.free(small_a).unwrap();
    assert_eq!(l.runtime().device(0).frees, frees + 1, "its segment's last live block: the segment goes back whole");
    assert!(!l.runtime().is_live(segment as usize));
    l.for_each_pool(|_, p| {
        p.check_invariants().unwrap();
        assert_eq!(p.stats.live_bytes, 0);
    });
    // Binned: every block is its segment.
    let l = layer(Config { cuda_pool: crate::config::CudaPool::Binned, ..Config::default() }, &[4 * GB]);
    let a = l.malloc(MB, 0).unwrap();
    assert_eq!(l.export(a), Export::Whole);
}

#[test]
fn ranges_are_our_blocks_not_the_segment() {
    let l = layer(Config::default(), &[4 * GB]);
    let a = l.malloc(MB, 0).unwrap();
    let b = l.malloc(MB, 0).unwrap();
    assert!(matches!(l.range(b), RangeAnswer::Live(s, n, _) if (s, n) == (b as u64, MB as u64)));
    assert!(matches!(l.range(b + MB - 1), RangeAnswer::Live(s, n, _) if (s, n) == (b as u64, MB as u64)));
    assert!(matches!(l.range(a + 5), RangeAnswer::Live(s, n, _) if (s, n) == (a as u64, MB as u64)));
    l.free(b).unwrap();
    assert_eq!(l.range(b + 10), RangeAnswer::Free);
    assert_eq!(l.range(0xdead_0000), RangeAnswer::NotOurs);
}

#[test]
fn async_frees_are_reused_after_a_sync_by_cudamalloc() {
    let l = layer(Config::default(), &[4 * GB]);
    let a = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.free_async(a, 0x55), FreeAnswer::Pooled);
    let syncs = l.runtime().device(0).syncs;
    assert_eq!(l.malloc(64 * MB, 0).unwrap(), a, "reused once the device is synchronized");
    assert_eq!(l.runtime().device(0).syncs, syncs + 1);
    assert_eq!(l.runtime().device(0).mallocs, 1, "no new segment for a block freed on a stream");
    assert_eq!(l.free_async(0xdead_0000, 0x55), FreeAnswer::NotOurs);
}

#[test]
fn pinned_blocks_of_a_reset_context_are_never_handed_out_again() {
    let l = layer(Config::default(), &[4 * GB]);
    l.malloc(MB, 0).unwrap(); // the primary context exists now
    let p = l.host_alloc(100 * MB, 0, 0).unwrap();
    l.host_free(p).unwrap();
    reset_primary(&l, 0);
    let q = l.host_alloc(100 * MB, 0, 0).unwrap();
    assert_eq!(l.runtime().host_allocs(), 2, "pinned anew after the reset");
    assert_eq!(l.host_free(q), Ok(FreeAnswer::Pooled));
}

#[test]
fn frees_of_pointers_that_are_no_live_block_are_refused_and_free_nothing() {
    // Note [Unexpected frees], in both strategies: a double free of a segment's first block, a
    // pointer inside a live block, a cached pinned block freed again.
    for pool in [crate::config::CudaPool::Split, crate::config::CudaPool::Binned] {
        let l = layer(Config { cuda_pool: pool, ..Config::default() }, &[8 * GB]);
        let a = l.malloc(MB, 0).unwrap();
        let b = l.malloc(MB, 0).unwrap();
        let big = l.malloc(64 * MB, 0).unwrap();
        assert_eq!(l.free(a), Ok(FreeAnswer::Pooled));
        assert_eq!(l.free(a), Ok(FreeAnswer::Refused), "{pool:?}: double free");
        assert_eq!(l.free_async(a, 7), FreeAnswer::Refused);
        assert_eq!(l.free_on_stream(a, 0, 7), FreeAnswer::Refused);
        assert_eq!(l.free(b + 4096), Ok(FreeAnswer::Refused), "inside a live block");
        assert_eq!(l.free(big + 32 * MB), Ok(FreeAnswer::Refused), "inside a block of its own segment");
        assert_eq!(l.runtime().device(0).frees, 0, "no segment went back to the runtime");
        assert!(l.runtime().is_live(b) && l.runtime().is_live(big));
        assert!(l.holds(a) && l.holds(b + 4096) && !l.holds(0x10));
        assert_eq!(l.free(0x10), Ok(FreeAnswer::NotOurs), "not ours: the runtime answers");
        assert_eq!(l.malloc(MB, 0).unwrap(), a, "the block freed once is handed out again");
        let p = l.host_alloc(MB, 0, 0).unwrap();
        assert_eq!(l.host_free(p), Ok(FreeAnswer::Pooled));
        assert_eq!(l.host_free(p), Ok(FreeAnswer::Refused), "a cached pinned block freed again");
        assert!(l.holds(p));
        assert_eq!(l.runtime().pinned_bytes(), MB.next_multiple_of(4096), "still pinned, for the next request");
        assert_eq!(l.host_alloc(MB, 0, 0).unwrap(), p);
    }
}

#[test]
fn buffer_ids_are_distinct_per_block_and_new_at_every_reuse() {
    // Note [Buffer ids], over two devices and both strategies.
    for pool in [crate::config::CudaPool::Split, crate::config::CudaPool::Binned] {
        let l = layer(Config { cuda_pool: pool, ..Config::default() }, &[4 * GB, 4 * GB]);
        let id = |addr: usize| match l.range(addr) {
            RangeAnswer::Live(_, _, id) => id,
            other => panic!("{other:?}"),
        };
        let a = l.malloc(MB, 0).unwrap();
        let b = l.malloc(MB, 0).unwrap();
        let (ida, idb) = (id(a), id(b));
        assert_ne!(ida, idb, "{pool:?}: two live blocks");
        assert_eq!(id(b + 100), idb, "any address inside the block");
        l.free(a).unwrap();
        assert_eq!(l.malloc(MB, 0).unwrap(), a);
        assert!(id(a) != ida && id(a) != idb, "a reused block has a new id");
        l.runtime().set_device(1).unwrap();
        let c = l.malloc(MB, 0).unwrap();
        assert!(![ida, idb, id(a)].contains(&id(c)), "another device's pool");
        assert!(id(c) > 1 << 62, "far from the runtime's own ids");
    }
}

#[test]
fn out_of_memory_outside_the_pool_gets_its_cache_back_once() {
    let l = layer(Config::default(), &[GB]);
    let a = l.malloc(600 * MB, 0).unwrap();
    l.free(a).unwrap();
    l.runtime().set_context(Some(0x77)); // a user context on the device: not the pool's
    let b = l.malloc(700 * MB, 0).expect("the pool's segment given back in its own context, then retried");
    assert!(crate::device::fallback::said(crate::device::fallback::Fallback::OtherContext { device: 0 }), "said once on stderr");
    assert_eq!(l.runtime().last_error(), 0, "no stale error after a recovered OOM");
    assert_eq!(l.malloc(700 * MB, 0), Err(DeviceError::OutOfMemory), "nothing cached: the runtime's answer");
    l.runtime().set_context(None);
    l.runtime().free(b).unwrap();
    // The runtime's stream-ordered pool asks for the current device's cache back.
    let c = l.malloc(600 * MB, 0).unwrap();
    l.free(c).unwrap();
    assert_eq!(l.give_back_current(), 600 * MB as u64);
    assert_eq!(l.give_back_current(), 0);
    assert_eq!(l.runtime().device(0).used, 0);
}

/// The holders table's row of `word` on device 0: (live, peak, blocks).
fn holder_row(word: u64) -> (u64, u64, u64) {
    let mut out = (0, 0, 0);
    crate::record::holders::for_each_row(|r| {
        if r.id == crate::record::holders::id_of(word) && r.place == crate::record::holders::device_place(0) {
            out = (r.live_bytes, r.peak_bytes, r.blocks);
        }
    });
    out
}

#[test]
fn the_holders_table_follows_blocks_and_forgets_them_with_their_context() {
    let l = layer(Config::default(), &[GB]);
    // A key of this test's own: the table is the process's, shared with other tests.
    let w = crate::record::holders::table_to_write().unwrap().holder_of_hook(0x1234, 0x5151_0000);
    let a = l.malloc(MB, w).unwrap();
    let b = l.malloc(3 * MB, w).unwrap();
    let size = |p: usize| match l.range(p) {
        RangeAnswer::Live(_, n, _) => n,
        other => panic!("{other:?}"),
    };
    let (sa, sb) = (size(a), size(b));
    assert_eq!(holder_row(w), (sa + sb, sa + sb, 2));
    l.free(a).unwrap();
    assert_eq!(holder_row(w), (sb, sa + sb, 1));
    reset_primary(&l, 0);
    assert_eq!(holder_row(w), (0, sa + sb, 0), "a reset freed the block with its context");
}

/// Sizes no device could hold, and those whose rounding would wrap (a negative size cast to
/// size_t): the runtime's answer, never a block of ours; the cache left as it was.
#[test]
fn impossible_sizes_get_the_runtimes_answer_and_leave_the_cache() {
    for pool in [crate::config::CudaPool::Split, crate::config::CudaPool::Binned] {
        let l = layer(Config { cuda_pool: pool, ..Config::default() }, &[GB]);
        let a = l.malloc(100 * MB, 0).unwrap();
        l.free(a).unwrap();
        let cached_bytes = |l: &DeviceLayer<SimRuntime>| {
            let mut total = 0;
            l.for_each_pool(|_, p| total += p.cached_bytes());
            total
        };
        let cached = cached_bytes(&l);
        assert!(cached > 0);
        for size in [usize::MAX, usize::MAX - 3, usize::MAX - 510, usize::MAX - 15, 1 << 60, 2 * GB] {
            assert_eq!(l.malloc(size, 0), Err(DeviceError::OutOfMemory), "{size:#x} under {pool:?}");
            assert_eq!(cached_bytes(&l), cached, "nothing given back for {size:#x}");
        }
        assert_eq!(l.host_alloc(usize::MAX, 0, 0), Err(DeviceError::OutOfMemory));
        assert_eq!(l.host_alloc(usize::MAX - 4095, 0, 0), Err(DeviceError::OutOfMemory));
        assert_eq!(l.malloc(100 * MB, 0), Ok(a), "the cache still serves");
    }
}

/// Note [Forked children]: a child forked after the layer was used leaves the parent's pools
/// and pinned cache alone for good; one forked before any use pools as any process.
#[test]
fn a_forked_child_leaves_the_parents_pools_alone() {
    let fresh = layer(Config::default(), &[GB]);
    // Note [Locks a child inherits]: parent threads in the unused pools at the fork.
    core::mem::forget(fresh.pools[0].lock());
    core::mem::forget(fresh.pinned.lock());
    core::mem::forget(fresh.growing[0].lock());
    assert!(!fresh.after_fork_in_child(), "never used: the child is a process of its own");
    assert!(!fresh.pools[0].held() && !fresh.pinned.held() && !fresh.growing[0].held(), "their locks are free in the child");
    assert_eq!(fresh.release_idle(), None);
    let a = fresh.malloc(8 * MB, 0).unwrap();
    assert!(fresh.holds(a));

    let l = layer(Config::default(), &[GB]);
    let live = l.malloc(8 * MB, 0).unwrap();
    let cached = l.malloc(8 * MB, 0).unwrap();
    l.free(cached).unwrap();
    let pinned = l.host_alloc(MB, 0, 0).unwrap();
    assert!(l.after_fork_in_child());
    assert!(!l.answers() && !l.enabled());
    assert!(!l.holds(live) && !l.holds(cached) && !l.holds(pinned), "none of the parent's blocks are ours here");
    assert_eq!(l.free(live), Ok(FreeAnswer::NotOurs), "the driver answers for it");
    let mut pools = 0;
    l.for_each_pool(|_, _| pools += 1);
    let mut pinned_blocks = 0;
    l.for_each_pinned(|_, _| pinned_blocks += 1);
    assert_eq!((pools, pinned_blocks, l.pinned_figures()), (0, 0, (0, 0, 0, 0)), "the reports list none of them");
    let mallocs = l.runtime().device(0).mallocs;
    let b = l.malloc(8 * MB, 0).unwrap();
    assert!(b != cached && l.runtime().device(0).mallocs == mallocs + 1, "a request goes to the runtime");
    assert_eq!(l.trim(), 0);
}

/// cudaMemGetInfo counts as free what a single request could get: the segments the pool would
/// give back, not the free part of a segment a small block keeps; a request of all of it is
/// served (the cache given back, the runtime's).
#[test]
fn reported_free_memory_can_be_had_in_one_request() {
    let l = layer(Config::default(), &[GB]);
    let (free0, _) = l.mem_info().unwrap();
    let small = l.malloc(1000, 0).unwrap();
    let big = l.malloc(100 * MB, 0).unwrap();
    l.free(big).unwrap();
    let (free, _) = l.mem_info().unwrap();
    let (driver_free, _) = l.runtime().mem_info().unwrap();
    let mut releasable = 0;
    l.for_each_pool(|_, p| releasable = p.releasable_bytes());
    assert_eq!(free, driver_free + releasable as usize);
    assert!(free < free0 && releasable >= 100 * MB as u64);
    assert!(l.malloc(free, 0).is_ok() || l.runtime().malloc(free).is_ok(), "the cache given back, the runtime serves it");
    l.free(small).unwrap();
}

thread_local! {
    static NOW_NS: core::cell::Cell<u64> = const { core::cell::Cell::new(1) };
}
/// A clock the test moves (each test thread has its own).
pub(super) fn fake_now() -> u64 {
    NOW_NS.with(|n| n.get())
}
pub(super) fn advance_ms(ms: u64) {
    NOW_NS.with(|n| n.set(n.get() + ms * 1_000_000));
}

/// Note [Idle segments], pressure: with the device short of memory (a neighbour took most of
/// it), segments idle for a second go back at once, not after the release delay; counted apart.
/// Off (0), they wait for the delay.
#[test]
fn a_device_short_of_memory_gets_idle_segments_back_after_a_second() {
    for below in [10, 0] {
        let l = Box::new(DeviceLayer::new(SimRuntime::new(&[GB]), leak_table, fake_now));
        l.configure(&Config { cuda_release_ms: 60_000, cuda_release_below_percent: below, ..Config::default() });
        let a = l.malloc(256 * MB, 0).unwrap();
        l.free(a).unwrap();
        advance_ms(2000);
        assert!(l.release_idle().is_some());
        assert_eq!(l.runtime().device(0).frees, 0, "room on the device: the segment waits for the delay");
        l.runtime().neighbour_uses(0, 700 * MB as isize);
        let due = l.release_idle();
        let mut freed = (0, 0);
        l.for_each_pool(|_, p| freed = (p.stats.idle_released_bytes, p.stats.pressure_released_bytes));
        if below > 0 {
            assert_eq!(l.runtime().device(0).frees, 1, "short of memory: given back");
            assert_eq!(freed, (256 * MB as u64, 256 * MB as u64));
            assert_eq!(due, None);
        } else {
            assert_eq!(l.runtime().device(0).frees, 0);
            assert!(due.is_some_and(|d| d > fake_now() + 50_000_000_000), "the delay, not a second");
        }
    }
}

/// Note [Idle segments]: a segment with no live block goes back to the driver once idle for
/// the release delay; a loop that reuses its blocks every step never pays a driver call.
#[test]
fn idle_segments_go_back_to_the_driver_and_busy_ones_stay() {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[GB]), leak_table, fake_now));
    l.configure(&Config { cuda_release_ms: 1000, ..Config::default() });
    // A training-like loop: the same sizes every step, 50 ms apart.
    for _ in 0..100 {
        let a = l.malloc(64 * MB, 0).unwrap();
        let b = l.malloc(100, 0).unwrap();
        l.free(a).unwrap();
        l.free(b).unwrap();
        advance_ms(50);
        assert_eq!(l.release_idle().map(|due| due > fake_now()), Some(true), "due later");
    }
    let dev = l.runtime().device(0);
    assert_eq!((dev.mallocs, dev.frees), (2, 0), "after warm-up, no driver call");
    // Then the program idles: past the delay, every idle segment goes back.
    advance_ms(1001);
    assert_eq!(l.release_idle(), None, "nothing left to wait for");
    let dev = l.runtime().device(0);
    assert_eq!(dev.frees, 2);
    let mut reserved = (0, 0, 0);
    l.for_each_pool(|_, p| reserved = (p.stats.reserved_bytes, p.stats.idle_released_segments, p.stats.idle_released_bytes));
    assert_eq!(reserved.0, 0);
    assert_eq!(reserved.1, 2);
    assert!(reserved.2 >= 64 * MB as u64);
    // A segment a small block keeps is not idle.
    let small = l.malloc(100, 0).unwrap();
    let other = l.malloc(100, 0).unwrap();
    l.free(other).unwrap();
    advance_ms(5000);
    l.release_idle();
    assert_eq!(l.runtime().device(0).frees, 2, "the segment of a live block stays");
    l.free(small).unwrap();
    assert!(l.release_idle().is_some_and(|due| due > fake_now()));
    advance_ms(1001);
    assert_eq!(l.release_idle(), None);
    assert_eq!(l.runtime().device(0).frees, 3);
}

/// Note [Idle blocks freed on streams]: an idle segment freed on a stream (or by a deferred
/// cudaFree) is not given back while it is young, and the background thread is not asked to
/// look again at once; once idle for the release delay, the thread synchronizes the device and
/// gives it back, also under pressure and to a neighbour. Before, it stayed for good.
#[test]
fn a_segment_freed_on_a_stream_goes_back_after_the_delay_with_a_synchronization() {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[GB]), leak_table, fake_now));
    l.configure(&Config { cuda_release_ms: 1000, ..Config::default() });
    let a = l.malloc_on_stream(64 * MB, 0, 0x77, 0).unwrap();
    assert_eq!(l.free_on_stream(a, 0, 0x77), FreeAnswer::Pooled);
    let syncs = l.runtime().device(0).syncs;
    let due = l.release_idle().expect("the pending segment is looked at again");
    assert!(due >= fake_now() + 100_000_000, "not at once");
    assert_eq!((l.runtime().device(0).frees, l.runtime().device(0).syncs), (0, syncs), "young: a stream may still use it");
    advance_ms(1001);
    assert_eq!(l.release_idle(), None, "nothing left to wait for");
    // One synchronization of ours, then the free (which synchronizes too, as cudaFree does).
    assert_eq!((l.runtime().device(0).frees, l.runtime().device(0).syncs), (1, syncs + 2), "synchronized, then given back");
    // A neighbour's ask does the same for a segment idle since its moment.
    let b = l.malloc_on_stream(64 * MB, 0, 0x77, 0).unwrap();
    assert_eq!(l.free_on_stream(b, 0, 0x77), FreeAnswer::Pooled);
    advance_ms(10);
    assert!(!l.release_for_neighbour(0, fake_now()), "nothing left");
    assert_eq!(l.runtime().device(0).frees, 2);
}

/// Note [No driver call after exit]: once exit began, neither the background pass nor a
/// neighbour's ask makes a driver call; the program's own calls still work.
#[test]
fn after_exit_began_the_background_makes_no_driver_call() {
    let l = layer(Config { cuda_release_ms: 0, ..Config::default() }, &[GB]);
    let a = l.malloc(64 * MB, 0).unwrap();
    let b = l.malloc(64 * MB, 0).unwrap();
    l.free(a).unwrap();
    l.free(b).unwrap();
    assert!(l.stop_background(1_000_000), "no batch under way");
    let before = l.runtime().device(0);
    assert_eq!(l.release_idle(), None);
    assert!(!l.release_for_neighbour(0, u64::MAX));
    let after = l.runtime().device(0);
    assert_eq!((after.frees, after.syncs), (before.frees, before.syncs), "not one driver call");
    assert_eq!(l.trim(), 128 * MB as u64, "the program's own call gives the cache back");
}

/// A forked child's exit does not wait for a background batch its parent had under way (the
/// thread that ran it is not the child's).
#[test]
fn a_forked_child_does_not_wait_for_its_parents_background_batch() {
    let l = layer(Config::default(), &[GB]);
    let batch = l.background_batch().unwrap(); // the parent's thread, mid-batch, at the fork
    core::mem::forget(batch);
    l.after_fork_in_child();
    assert!(l.stop_background(0), "nothing to wait for");
}

thread_local! {
    /// The layer whose runtime the neighbour of `neighbour_gives_back` shares.
    static ASKER: core::cell::Cell<*const DeviceLayer<SimRuntime>> = const { core::cell::Cell::new(core::ptr::null()) };
    static ASKED: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
}

/// A neighbour that holds 600 MiB idle of the asker's device and gives it back when asked.
fn neighbour_gives_back(device: i32) -> bool {
    assert_eq!(device, 0);
    ASKED.with(|a| a.set(a.get() + 1));
    // SAFETY: set by the test to a layer that outlives the call.
    ASKER.with(|l| unsafe { (*l.get()).runtime().neighbour_uses(0, -(600 * MB as isize)) });
    true
}

fn neighbour_answers_nothing(_: i32) -> bool {
    ASKED.with(|a| a.set(a.get() + 1));
    false
}

fn no_join(_: i32) {}

/// Note [Neighbours]: an allocation that fails with our own cache given back asks the
/// neighbours, then retries once; nobody answering, the driver's out of memory stands, and the
/// last error is the runtime's.
#[test]
fn a_failed_allocation_asks_the_neighbours_once_and_retries() {
    for (ask, succeeds) in [(neighbour_gives_back as fn(i32) -> bool, true), (neighbour_answers_nothing, false)] {
        let l = Box::new(DeviceLayer::new(SimRuntime::new(&[GB]), leak_table, fake_now));
        l.configure(&Config::default());
        l.set_neighbours(no_join, ask);
        ASKER.with(|a| a.set(&*l));
        ASKED.with(|a| a.set(0));
        l.runtime().neighbour_uses(0, 900 * MB as isize);
        let got = l.malloc(600 * MB, 0);
        assert_eq!(got.is_ok(), succeeds, "{got:?}");
        assert_eq!(ASKED.with(|a| a.get()), 1, "asked once");
        if !succeeds {
            assert_eq!(got, Err(DeviceError::OutOfMemory));
        }
        // Room of our own: nobody is asked.
        let small = l.malloc(10 * MB, 0).unwrap();
        assert_eq!(ASKED.with(|a| a.get()), 1);
        l.free(small).unwrap();
        ASKER.with(|a| a.set(core::ptr::null()));
    }
}

/// Note [Neighbours]: asked, a pool gives back the segments idle since the time given, whatever
/// the release delay (a minute here), counted apart; a younger idle segment stays (and is said
/// to be left), and so does one a live block keeps.
#[test]
fn a_neighbours_ask_gives_back_what_stayed_idle_long_enough() {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[GB]), leak_table, fake_now));
    l.configure(&Config { cuda_release_ms: 60_000, ..Config::default() });
    let big = l.malloc(256 * MB, 0).unwrap();
    let small = l.malloc(100, 0).unwrap();
    let kept = l.malloc(200, 0).unwrap();
    l.free(big).unwrap();
    l.free(small).unwrap();
    let freed_at = fake_now();
    advance_ms(50);
    let young = l.malloc(300 * MB, 0).unwrap(); // a segment of its own
    l.free(young).unwrap();
    let reserved_before = l.runtime().device(0).used;
    assert!(l.release_for_neighbour(0, freed_at - 1), "idle only since after the cutoff: nothing goes, both are left");
    assert_eq!(l.runtime().device(0).used, reserved_before);
    assert!(l.release_for_neighbour(0, freed_at), "the young one is left");
    let mut stats = (0, 0);
    l.for_each_pool(|_, p| stats = (p.stats.neighbour_released_bytes, p.stats.idle_released_bytes));
    assert_eq!(stats, (256 * MB as u64, 256 * MB as u64), "the small segment holds a live block");
    assert_eq!(l.runtime().device(0).frees, 1);
    assert!(!l.release_for_neighbour(0, fake_now()), "the young one goes too; nothing idle left");
    assert_eq!(l.runtime().device(0).frees, 2);
    assert!(!l.release_for_neighbour(-1, u64::MAX) && !l.release_for_neighbour(99, u64::MAX), "no such device");
    l.free(kept).unwrap();
}

#[test]
fn a_stream_ordered_free_finds_its_block_once() {
    // One lookup of the block in the pool that owns it, and one in each pool tried before it
    // (the caller's device first for the pluggable free); before, a free looked its owner up
    // three times.
    let l = layer(Config::default(), &[4 * GB, 4 * GB]);
    let a = l.malloc(MB, 0).unwrap();
    l.runtime().set_device(1).unwrap();
    let b = l.malloc(MB, 0).unwrap();
    let lookups = |l: &DeviceLayer<SimRuntime>| {
        let mut n = 0;
        l.for_each_pool(|_, p| n += p.lookups.load(Relaxed));
        n
    };
    let before = lookups(&l);
    assert_eq!(l.free_async(a, 7), FreeAnswer::Pooled);
    assert_eq!(lookups(&l) - before, 1, "device 0's block, found in the first pool");
    let before = lookups(&l);
    assert_eq!(l.free_async(b, 7), FreeAnswer::Pooled);
    assert_eq!(lookups(&l) - before, 2, "device 1's block: pool 0 says no, pool 1 takes it");
    let c = l.malloc(MB, 0).unwrap();
    let before = lookups(&l);
    assert_eq!(l.free_on_stream(c, 1, 7), FreeAnswer::Pooled);
    assert_eq!(lookups(&l) - before, 1, "the caller's device is tried first");
}
