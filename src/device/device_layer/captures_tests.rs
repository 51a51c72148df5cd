//! Note [Graph captures under way], over simulated devices: while a capture is under way the
//! layer makes no driver call the program did not ask for, and catches up after its end.

use super::*;
use crate::backing::DeviceError;
use crate::config::{Config, CudaSync};
use crate::device::device_layer::FreeAnswer;
use super::tests::{advance_ms, fake_now};
use crate::sim::{leak_table, SimRuntime};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn layer(config: Config, capacity: usize) -> Box<DeviceLayer<SimRuntime>> {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[capacity]), leak_table, fake_now));
    l.configure(&config);
    l
}

/// A capture begun on stream 0x5000, as the route counts one.
fn begin(l: &DeviceLayer<SimRuntime>) {
    l.capture_beginning();
    l.capture_begin_answered(0, 0x5000);
}

/// `begin`, the thread then in the relaxed mode, as PyTorch's allocator is around its cudaMalloc
/// in a capture (else the runtime may refuse the call: the driver answers it).
fn begin_relaxed(l: &DeviceLayer<SimRuntime>) {
    begin(l);
    let _ = l.runtime().exchange_capture_mode(crate::backing::RELAXED_CAPTURE);
}

fn calls(l: &DeviceLayer<SimRuntime>) -> (u64, u64, u64) {
    let d = l.runtime().device(0);
    (d.mallocs, d.frees, d.syncs)
}

#[test]
fn idle_memory_waits_for_the_end_of_a_capture() {
    let l = layer(Config { cuda_release_ms: 1000, ..Config::default() }, 8 * GB);
    let a = l.malloc(64 * MB, 0).unwrap();
    l.free(a).unwrap();
    let b = l.malloc_on_stream(96 * MB, 0, 0x77, 0).unwrap();
    assert_eq!(l.free_on_stream(b, 0, 0x77), FreeAnswer::Pooled);
    advance_ms(2000);
    l.capture_beginning();
    l.capture_begin_answered(0, 0x5000);
    let before = calls(&l);
    let due = l.release_idle().expect("looked at again after the capture");
    assert!(due > fake_now(), "not at once");
    assert!(!l.release_for_neighbour(0, fake_now()));
    assert_eq!(calls(&l), before, "no free, no synchronization during the capture");
    // An end the driver refused for the wrong thread ends nothing.
    l.capture_end_answered(908, 0x5000);
    l.release_idle();
    assert_eq!(calls(&l), before);
    l.capture_end_answered(901, 0x5000);
    assert!(!l.capturing());
    assert_eq!(l.release_idle(), None, "nothing left");
    let (_, frees, syncs) = calls(&l);
    assert_eq!(frees, 2, "both segments back after the capture");
    assert!(syncs > before.2);
}

#[test]
fn a_refused_begin_begins_no_capture_and_ends_never_go_below_zero() {
    let l = layer(Config::default(), 8 * GB);
    l.capture_beginning();
    l.capture_begin_answered(900, 0x5000);
    assert!(!l.capturing());
    l.capture_end_answered(0, 0x5000);
    assert!(!l.capturing());
    l.capture_beginning();
    assert!(l.capturing(), "counted before the driver's call");
}

#[test]
fn the_programs_calls_make_no_synchronization_of_ours_during_a_capture() {
    for sync in [CudaSync::Free, CudaSync::Reuse] {
        let l = layer(Config { cuda_sync: sync, ..Config::default() }, 8 * GB);
        let a = l.malloc_on_stream(96 * MB, 0, 0x77, 0).unwrap();
        assert_eq!(l.free_on_stream(a, 0, 0x77), FreeAnswer::Pooled);
        begin_relaxed(&l);
        let (mallocs, _, syncs) = calls(&l);
        // The freed block would need a synchronization to be reused: new memory instead.
        let b = l.malloc(96 * MB, 0).unwrap();
        assert_ne!(a, b);
        // A cudaFree does not synchronize either: the block waits for a later one.
        assert_eq!(l.free(b), Ok(FreeAnswer::Pooled));
        assert_eq!(calls(&l), (mallocs + 1, 0, syncs), "{sync:?}");
        l.capture_end_answered(0, 0x5000);
        advance_ms(1);
        // After the capture the freed blocks are reused, with a synchronization.
        let c = l.malloc(96 * MB, 0).unwrap_or_else(|e| panic!("{sync:?}: {e:?}"));
        assert!(c == a || c == b);
        assert_eq!(calls(&l).0, mallocs + 1);
        assert!(calls(&l).2 > syncs);
    }
}

#[test]
fn out_of_memory_during_a_capture_keeps_the_cache() {
    let l = layer(Config::default(), GB);
    let a = l.malloc(600 * MB, 0).unwrap();
    l.free(a).unwrap();
    begin_relaxed(&l);
    assert_eq!(l.malloc(700 * MB, 0), Err(DeviceError::OutOfMemory), "the driver's answer, as without us");
    assert_eq!(calls(&l).1, 0, "the cache was not given back during the capture");
    l.capture_end_answered(0, 0x5000);
    let b = l.malloc(700 * MB, 0).expect("after it, the cache is given back and the request served");
    l.free(b).unwrap();
}

/// Note [Whole idle segments]: during a capture the cache cannot go back, so where the driver
/// has no room left a whole idle segment serves a small request after all, as it always did.
#[test]
fn during_a_capture_a_full_device_still_carves_a_whole_idle_segment() {
    let l = layer(Config::default(), GB);
    let live = l.malloc(820 * MB, 0).unwrap();
    let a = l.malloc(200 * MB, 0).unwrap();
    l.free(a).unwrap();
    begin_relaxed(&l);
    let small = l.malloc(MB, 0).expect("carved from the idle segment: the driver has no 20 MiB left");
    assert!((a..a + 200 * MB).contains(&small));
    assert_eq!(calls(&l).1, 0, "nothing given back during the capture");
    l.capture_end_answered(0, 0x5000);
    l.free(small).unwrap();
    l.free(live).unwrap();
}

/// A capture whose context ends (destroyed, reset) ends with it: the pool synchronizes for the
/// program again. An end after that ends nothing more.
#[test]
fn the_end_of_a_captures_context_ends_the_capture() {
    let l = layer(Config::default(), 8 * GB);
    let a = l.malloc(64 * MB, 0).unwrap();
    l.free(a).unwrap();
    let ctx = l.runtime().current_context();
    assert_ne!(ctx, 0);
    begin(&l);
    l.capture_beginning();
    l.capture_begin_answered(0, 0x6000);
    l.forget_context(ctx);
    assert!(!l.capturing(), "both captures ended with their context");
    l.capture_end_answered(0, 0x5000);
    begin(&l);
    l.capture_end_answered(0, 0x5000);
    assert!(!l.capturing(), "a later capture counts and ends as before");
}

/// Note [Graph captures under way]: during a capture, a cudaMalloc from a thread not in the
/// relaxed mode is the driver's to answer (the runtime alone may refuse it), not the cache's; in
/// the relaxed mode (PyTorch's, around its cudaMalloc) the cache serves it as before. The mode
/// is left as it was.
#[test]
fn a_cudamalloc_in_a_capture_is_the_drivers_unless_the_thread_is_relaxed() {
    let l = layer(Config::default(), 8 * GB);
    let a = l.malloc(64 * MB, 0).unwrap();
    l.free(a).unwrap();
    begin(&l);
    let before = calls(&l).0;
    let b = l.malloc(64 * MB, 0).unwrap();
    assert_ne!(b, a, "not the cached block");
    assert_eq!(calls(&l).0, before + 1, "the driver's allocation");
    assert_eq!(l.runtime().exchange_capture_mode(0), Some(0), "the thread's mode as it was");
    let _ = l.runtime().exchange_capture_mode(crate::backing::RELAXED_CAPTURE);
    assert_eq!(l.malloc(64 * MB, 0).unwrap(), a, "relaxed: the cache's block");
    assert_eq!(calls(&l).0, before + 1);
    assert_eq!(l.runtime().exchange_capture_mode(0), Some(crate::backing::RELAXED_CAPTURE));
    l.capture_end_answered(0, 0x5000);
    let c = l.malloc(64 * MB, 0).unwrap();
    assert_eq!(calls(&l).0, before + 2, "no capture: the pool's as before (a new segment: a and b are taken)");
    for p in [a, b, c] {
        let _ = l.free(p);
    }
}
