//! Note [What the cap leaves] (device/pool/cap.rs), over simulated devices: under the cap,
//! cudaMemGetInfo reports no more than a request gets, before the pool's first segment and
//! after, and a medium request the carved segment would not fit takes one of its own size.

use super::*;
use crate::config::{Config, CudaPool, CudaSegments, CudaSync, DeviceLimit};
use crate::sim::{leak_table, SimRuntime};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn layer(limit: DeviceLimit, pool: CudaPool) -> Box<DeviceLayer<SimRuntime>> {
    layer_with(Config { cuda_limit: limit, cuda_pool: pool, ..Config::default() })
}

fn layer_with(config: Config) -> Box<DeviceLayer<SimRuntime>> {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[GB]), leak_table, crate::sys::clock::now_ns));
    l.configure(&config);
    l
}

/// The four ways a pool may be set up: split, binned, expandable, expandable with deferred sync.
fn setup(round: usize, limit: DeviceLimit) -> Config {
    let base = Config { cuda_limit: limit, ..Config::default() };
    match round % 4 {
        0 => base,
        1 => Config { cuda_pool: CudaPool::Binned, ..base },
        2 => Config { cuda_segments: CudaSegments::Expandable, ..base },
        _ => Config { cuda_segments: CudaSegments::Expandable, cuda_sync: CudaSync::Reuse, ..base },
    }
}

/// What cudaMemGetInfo reports can be allocated in one request.
fn all_reported_is_served(l: &DeviceLayer<SimRuntime>, why: &str) -> usize {
    let (free, _) = l.mem_info().unwrap();
    assert!(free > 0, "{why}");
    let a = l.malloc(free, 0).unwrap_or_else(|e| panic!("{why}: {free} reported, {e:?}"));
    l.free(a).unwrap();
    free
}

#[test]
fn under_the_cap_all_that_is_reported_is_served() {
    for pool in [CudaPool::Split, CudaPool::Binned] {
        for limit in [DeviceLimit::Percent(50), DeviceLimit::Percent(33), DeviceLimit::Bytes(30 * MB as u64)] {
            let l = layer(limit, pool);
            let before = all_reported_is_served(&l, &format!("{pool:?} {limit:?} before the first segment"));
            assert!(before <= GB / 2, "{pool:?} {limit:?}: the cap applies before the pool is set up ({before})");
            for size in [MB, 3_000_000] {
                let live = l.malloc(size, 0).unwrap();
                all_reported_is_served(&l, &format!("{pool:?} {limit:?} with {size} live"));
                l.free(live).unwrap();
                all_reported_is_served(&l, &format!("{pool:?} {limit:?} after {size} freed"));
            }
        }
    }
}

#[test]
fn a_medium_request_the_cap_refuses_a_carved_segment_takes_its_own() {
    let l = layer(DeviceLimit::Bytes(10 * MB as u64), CudaPool::Split);
    let blocks: Vec<usize> = (0..5).map(|i| l.malloc(MB, 0).unwrap_or_else(|e| panic!("block {i}: {e:?}"))).collect();
    assert_eq!(l.malloc(MB, 0), Err(DeviceError::CapReached), "10 MiB hold five 2 MiB segments");
    for b in blocks {
        l.free(b).unwrap();
    }
}

/// Random mixes of live and freed blocks (on streams too) under caps and none, in every kind of
/// pool: what is reported is always served. Few layers (each keeps its tables for good), many
/// checks each.
#[test]
fn after_any_mix_of_requests_all_that_is_reported_is_served() {
    const SIZES: [usize; 7] = [300 << 10, MB, 3 * MB / 2, 3 * MB, 17 * MB, 64 * MB, 5_000_001];
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for round in 0..16 {
        let limit = [DeviceLimit::Bytes(40 * MB as u64), DeviceLimit::Bytes(100 * MB as u64), DeviceLimit::Percent(30), DeviceLimit::Unlimited][round % 4];
        let config = setup(round / 4, limit);
        let pool = (config.cuda_pool, config.cuda_segments, config.cuda_sync);
        let l = layer_with(config);
        let mut live: Vec<(usize, usize)> = Vec::new();
        for step in 0..200 {
            if live.is_empty() || next(3) > 0 {
                let stream = [0usize, 0x77, 0x99][next(3)];
                let size = SIZES[next(SIZES.len())];
                let got = if stream == 0 { l.malloc(size, 0) } else { l.malloc_on_stream(size, 0, stream, 0) };
                if let Ok(a) = got {
                    live.push((a, stream));
                }
            } else {
                let (a, stream) = live.swap_remove(next(live.len()));
                if stream == 0 {
                    l.free(a).unwrap();
                } else {
                    l.free_on_stream(a, 0, stream);
                }
            }
            if step % 10 == 9 {
                let (free, _) = l.mem_info().unwrap();
                if free > 0 {
                    let a = l.malloc(free, 0).unwrap_or_else(|e| panic!("round {round} step {step} {pool:?} {limit:?}: {free} reported, {e:?}"));
                    l.free(a).unwrap();
                }
            }
            if live.len() > 12 {
                let (a, _) = live.swap_remove(0);
                l.free(a).unwrap();
            }
        }
        for (a, _) in live {
            l.free(a).unwrap();
        }
    }
}
