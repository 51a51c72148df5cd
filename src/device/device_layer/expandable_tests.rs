//! Expandable segments (Note [Expandable segments] in device/pool/chunks.rs) over a simulated
//! device with the driver's virtual memory API: the promise (what fits in the driver's free
//! memory plus our idle chunks never fails), the bound on what the driver holds for us, idle
//! chunks given back whatever is live around them, reuse with no driver call, the fallback.

use super::*;
use crate::config::{CudaSegments, Config};
use crate::device::device_layer::{Export, RangeAnswer};
use crate::sim::{leak_table, SimRuntime};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn layer(segments: CudaSegments, capacity: usize) -> Box<DeviceLayer<SimRuntime>> {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[capacity]), leak_table, crate::sys::clock::now_ns));
    l.configure(&Config { cuda_segments: segments, ..Config::default() });
    l
}

fn reserved(l: &DeviceLayer<SimRuntime>) -> (u64, u64) {
    let mut r = (0, 0);
    l.for_each_pool(|_, p| r = (p.stats.reserved_bytes, p.stats.live_bytes));
    r
}

/// The checkerboard: 400 blocks of 2 MiB, every other one freed, then 500 MiB on a
/// 1000 MiB device. Classic segments cannot (each freed block is a segment's free part);
/// expandable ones give the idle chunks back and map the request.
#[test]
fn a_checkerboard_of_free_chunks_still_serves_a_large_request() {
    // Classic segments carve 1.5 MiB requests from 20 MiB segments (2 MiB ones get their own).
    for (segments, size, succeeds) in [(CudaSegments::Expandable, 2 * MB, true), (CudaSegments::Classic, 3 * MB / 2, false)] {
        let l = layer(segments, 1000 * MB);
        let blocks: Vec<usize> = (0..400).map(|_| l.malloc(size, 0).unwrap()).collect();
        for b in blocks.iter().step_by(2) {
            l.free(*b).unwrap();
        }
        let big = l.malloc(500 * MB, 0);
        assert_eq!(big.is_ok(), succeeds, "{segments:?}: {big:?}");
        if let Ok(big) = big {
            assert!(l.runtime().is_mapped(big as u64) && l.runtime().is_mapped((big + 500 * MB - 1) as u64));
            for b in blocks.iter().skip(1).step_by(2) {
                assert!(l.runtime().is_mapped(*b as u64), "live blocks never lose their memory");
            }
            let (reserved_bytes, live_bytes) = reserved(&l);
            assert!(reserved_bytes <= live_bytes + live_bytes / 10 + 4 * MB as u64, "idle chunks moved where needed: {reserved_bytes} for {live_bytes} live");
        }
    }
}

/// A long random sequence of sizes (512 B to 64 MiB, log-uniform) with random frees: the most
/// the driver ever holds for us stays within 15% of the most ever live.
#[test]
fn the_driver_holds_little_more_than_the_live_blocks() {
    let l = layer(CudaSegments::Expandable, 64 * GB);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut live: Vec<usize> = Vec::new();
    for _ in 0..20_000 {
        if live.len() < 40 && (live.is_empty() || next() % 3 != 0) {
            let bits = 9 + next() % 18; // 512 B .. 64 MiB
            let size = (1usize << bits) + (next() as usize % (1 << bits));
            live.push(l.malloc(size.min(64 * MB), 0).unwrap());
        } else {
            let i = next() as usize % live.len();
            l.free(live.swap_remove(i)).unwrap();
        }
    }
    let mut peaks = (0, 0);
    l.for_each_pool(|_, p| peaks = (p.stats.peak_reserved_bytes, p.stats.peak_live_bytes));
    assert!(peaks.0 as f64 <= peaks.1 as f64 * 1.15, "peak reserved {} vs peak live {}", peaks.0, peaks.1);
}

/// Idle chunks inside a partly used range go back after the release delay (and at trim),
/// whatever is live beside them; a loop that repeats its sizes makes no driver call.
#[test]
fn idle_chunks_go_back_around_live_blocks_and_busy_loops_pay_nothing() {
    let l = layer(CudaSegments::Expandable, 4 * GB);
    l.configure(&Config { cuda_segments: CudaSegments::Expandable, cuda_release_ms: 0, ..Config::default() });
    let keep = l.malloc(100, 0).unwrap();
    let big = l.malloc(300 * MB, 0).unwrap();
    let keep_large = l.malloc(10 * MB, 0).unwrap();
    let maps = l.runtime().device(0).maps;
    for _ in 0..100 {
        l.free(big).unwrap();
        assert_eq!(l.malloc(300 * MB, 0).unwrap(), big, "in place");
    }
    assert_eq!(l.runtime().device(0).maps, maps, "no driver call after warm-up");
    assert_eq!(l.runtime().device(0).unmaps, 0);
    l.free(big).unwrap();
    assert_eq!(l.release_idle(), None);
    let (reserved_bytes, live_bytes) = reserved(&l);
    assert!(reserved_bytes <= live_bytes + 4 * MB as u64, "{reserved_bytes} {live_bytes}");
    assert!(l.runtime().is_mapped(keep as u64) && l.runtime().is_mapped(keep_large as u64) && !l.runtime().is_mapped((big + 100 * MB) as u64));
    let mut released = 0;
    l.for_each_pool(|_, p| released = p.stats.idle_released_bytes);
    assert!(released >= 296 * MB as u64, "{released}");
    // The memory comes back when a block needs it again.
    let again = l.malloc(300 * MB, 0).unwrap();
    assert!(l.runtime().is_mapped((again + 150 * MB) as u64));
    l.free(again).unwrap();
    assert!(l.trim() >= 296 * MB as u64);
    l.free(keep).unwrap();
    l.free(keep_large).unwrap();
    l.trim();
    assert_eq!(reserved(&l), (0, 0));
    assert_eq!(l.runtime().device(0).used, 0, "nothing left at the driver after trim");
}

/// Pointer queries answer the block, not the chunk the driver would name; an IPC export names
/// the block and the run of chunks it lies on (sharing_tests.rs).
#[test]
fn an_expandable_block_answers_as_a_block_and_its_export_names_its_chunks() {
    let l = layer(CudaSegments::Expandable, 4 * GB);
    let a = l.malloc(5 * MB, 0).unwrap();
    let b = l.malloc(3 * MB, 0).unwrap();
    match l.range(b + 2 * MB + 7) {
        RangeAnswer::Live(start, size, _) => assert_eq!((start, size), (b as u64, 3 * MB as u64)),
        other => panic!("{other:?}"),
    }
    let Export::Expandable(e) = l.export(a) else { panic!("{:?}", l.export(a)) };
    assert_eq!((e.addr, e.size, e.entry), (a as u64, 5 * MB as u64, None));
    assert_eq!(l.export(a + 3 * MB), Export::Expandable(e), "an interior pointer names its block");
    l.free(a).unwrap();
    assert_eq!(l.range(a + 100), RangeAnswer::Free);
    assert_eq!(l.free(a), Ok(FreeAnswer::Refused), "a double free is refused, as the runtime's");
    l.free(b).unwrap();
}

/// A driver without the virtual memory API: classic segments, served as before.
#[test]
fn a_driver_without_virtual_memory_falls_back_to_classic_segments() {
    let l = layer(CudaSegments::Expandable, 4 * GB);
    l.runtime().set_granularity(0);
    let a = l.malloc(64 * MB, 0).unwrap();
    let mut expandable = true;
    l.for_each_pool(|_, p| expandable = p.expandable());
    assert!(!expandable);
    assert_eq!(l.runtime().device(0).mallocs, 1);
    l.free(a).unwrap();
}

/// Out of memory at the cap and at the driver, with idle chunks held: they go first; past that,
/// the driver's answer, and nothing of the failed request stays mapped.
#[test]
fn out_of_memory_gives_idle_chunks_back_first_and_leaves_nothing_behind() {
    let l = layer(CudaSegments::Expandable, 1000 * MB);
    let a = l.malloc(600 * MB, 0).unwrap();
    l.free(a).unwrap();
    let live = l.malloc(300 * MB, 0).unwrap();
    assert!(l.malloc(800 * MB, 0).is_err());
    let (reserved_bytes, live_bytes) = reserved(&l);
    assert_eq!(live_bytes, 300 * MB as u64);
    assert_eq!(l.runtime().device(0).used as u64, reserved_bytes);
    assert!(reserved_bytes <= live_bytes + 4 * MB as u64, "the failed request's chunks went back: {reserved_bytes}");
    let b = l.malloc(650 * MB, 0).unwrap();
    l.free(b).unwrap();
    l.free(live).unwrap();
}

/// cudaMemGetInfo counts idle chunks as free, and a request of all of it succeeds, with live
/// blocks scattered around.
#[test]
fn all_the_memory_reported_free_can_be_had_in_one_request() {
    let l = layer(CudaSegments::Expandable, 1000 * MB);
    let blocks: Vec<usize> = (0..100).map(|i| l.malloc(3 * MB + i * 4096 + 100, 0).unwrap()).collect();
    for b in blocks.iter().step_by(2) {
        l.free(*b).unwrap();
    }
    let (free, total) = l.mem_info().unwrap();
    assert_eq!(total, 1000 * MB);
    let all = l.malloc(free, 0);
    assert!(all.is_ok(), "{free} reported free: {all:?}");
}

/// A context's end (a reset, a destroy, the last release of a primary context): every chunk,
/// live or idle, goes back to the driver before the pool forgets its blocks.
#[test]
fn a_context_end_gives_every_chunk_back() {
    let l = layer(CudaSegments::Expandable, 4 * GB);
    let live = l.malloc(100 * MB, 0).unwrap();
    let idle = l.malloc(50 * MB, 0).unwrap();
    l.free(idle).unwrap();
    assert!(l.runtime().device(0).used >= 150 * MB);
    l.forget_primary(0);
    assert_eq!(l.runtime().device(0).used, 0, "nothing of ours left at the driver");
    assert_eq!(l.runtime().device(0).unreserves, l.runtime().device(0).reserves, "nor its address space");
    assert_eq!(reserved(&l), (0, 0));
    assert_eq!(l.free(live), Ok(FreeAnswer::NotOurs), "the block died with its context");
    let again = l.malloc(100 * MB, 0).unwrap();
    assert!(l.runtime().is_mapped(again as u64));
    l.free(again).unwrap();
}

/// A driver whose granularity is not 2 MiB (4 MiB here, on a device whose memory is no multiple
/// of it): ranges and chunks are whole numbers of it, and the pool serves as it does at 2 MiB.
#[test]
fn another_granularity_is_followed() {
    let l = layer(CudaSegments::Expandable, 4 * GB + 2 * MB);
    l.runtime().set_granularity(4 * MB as u64);
    let small = l.malloc(100, 0).unwrap();
    let big = l.malloc(10 * MB, 0).unwrap();
    let mut chunk = 0;
    l.for_each_pool(|_, p| chunk = p.chunk_bytes());
    assert_eq!(chunk, 4 * MB as u64, "expandable, at the driver's granularity");
    assert_eq!(l.runtime().device(0).mallocs, 0, "no classic segment");
    l.free(small).unwrap();
    l.free(big).unwrap();
}

/// A refused first reservation (an address-space limit): classic segments from then on, said
/// once; a refused later one passes that request to the driver, said once too.
#[test]
fn a_refused_reservation_falls_back_and_says_so() {
    use crate::device::fallback::{said, Fallback};
    let l = layer(CudaSegments::Expandable, 4 * GB);
    l.runtime().fail_next_reserves(1);
    let a = l.malloc(64 * MB, 0).unwrap();
    assert!(said(Fallback::Reservation { device: 0, code: 2, classic: true }));
    let d = l.runtime().device(0);
    assert_eq!((d.reserves, d.mallocs, d.maps), (0, 1, 0), "a classic segment: {d:?}");
    l.for_each_pool(|_, p| assert!(!p.expandable()));
    l.free(a).unwrap();
    assert_eq!(l.malloc(64 * MB, 0).unwrap(), a, "pooled as before");
    // With a range held already, a refused one passes the request through.
    let l = layer(CudaSegments::Expandable, 4 * GB);
    let small = l.malloc(4096, 0).unwrap(); // the range for small blocks
    l.runtime().fail_next_reserves(1);
    let big = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(l.range(big), RangeAnswer::NotOurs, "the driver's own allocation");
    l.for_each_pool(|_, p| assert!(p.expandable()));
    assert!(l.malloc(64 * MB, 0).is_ok(), "the next reservation is tried again");
    assert_eq!(l.free(small), Ok(FreeAnswer::Pooled));
}

/// More threads than the pool has ranges make their first requests at once, and each reserves a
/// range before any is added (the CI run of stop 53: 4 of 32 requests unpooled, "holds as many
/// address ranges as it tracks"). Each request is served from the range added first; the others'
/// ranges go back to the driver.
#[test]
fn first_requests_made_at_once_share_one_range() {
    const THREADS: u64 = 12;
    let l = layer(CudaSegments::Expandable, 4 * GB);
    l.runtime().meet_in_reserve(THREADS);
    let blocks: Vec<usize> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS).map(|_| s.spawn(|| l.malloc(MB, 0).unwrap())).collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(l.stats.passthrough.get(), 0, "every request pooled");
    let mut requests = 0;
    l.for_each_pool(|_, p| requests = p.stats.requests);
    assert_eq!(requests, THREADS);
    for b in &blocks {
        assert_ne!(l.range(*b), RangeAnswer::NotOurs);
        assert_eq!(l.free(*b), Ok(FreeAnswer::Pooled));
    }
    let d = l.runtime().device(0);
    assert_eq!((d.reserves, d.unreserves), (THREADS, THREADS - 1), "one range kept: {d:?}");
}
