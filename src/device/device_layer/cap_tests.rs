//! Note [What the cap leaves] (device/pool/cap.rs), over simulated devices: under the cap,
//! cudaMemGetInfo reports no more than a request gets, before the pool's first segment and
//! after, and a medium request the carved segment would not fit takes one of its own size.

use super::*;
use crate::config::{Config, CudaPool, DeviceLimit};
use crate::sim::{leak_table, SimRuntime};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn layer(limit: DeviceLimit, pool: CudaPool) -> Box<DeviceLayer<SimRuntime>> {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[GB]), leak_table, crate::sys::clock::now_ns));
    l.configure(&Config { cuda_limit: limit, cuda_pool: pool, ..Config::default() });
    l
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

/// Random mixes of live and freed blocks under caps: what is reported is always served.
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
    for round in 0..60 {
        let pool = if round % 2 == 0 { CudaPool::Split } else { CudaPool::Binned };
        let limit = [DeviceLimit::Bytes(40 * MB as u64), DeviceLimit::Bytes(100 * MB as u64), DeviceLimit::Percent(30)][round % 3];
        let l = layer(limit, pool);
        let mut live = Vec::new();
        for _ in 0..20 {
            if live.is_empty() || next(3) > 0 {
                if let Ok(a) = l.malloc(SIZES[next(SIZES.len())], 0) {
                    live.push(a);
                }
            } else {
                let i = next(live.len());
                l.free(live.swap_remove(i)).unwrap();
            }
        }
        let (free, _) = l.mem_info().unwrap();
        if free > 0 {
            let a = l.malloc(free, 0).unwrap_or_else(|e| panic!("round {round} {pool:?} {limit:?}: {free} reported, {e:?}"));
            l.free(a).unwrap();
        }
        for a in live {
            l.free(a).unwrap();
        }
    }
}
