//! Trace replay for the device pool: allocation and free sequences shaped like a CNN training
//! step and a transformer training step (modelled on those networks' tensor shapes, not
//! recorded), a long random sequence (512 B to 64 MiB, log-uniform, at most 40 live), and one
//! recorded training step of a real PyTorch run (traces/README.md),
//! replayed through each pool (split and binned classic segments, split expandable segments:
//! Note [Expandable segments]) over a simulated device (fake addresses, never dereferenced),
//! with and without a memory cap. Reports the pool's own cost per call, peak reserved over peak
//! live (fragmentation: for expandable segments, reserved is the mapped chunks), driver calls
//! per 1,000 operations (allocations, frees, chunk maps, moves, unmaps, reservations), and OOMs.
//! This is how the strategies are compared without a GPU; the simulator says nothing about a
//! real GPU's cudaMalloc speed.
//!
//!     cargo bench --features no-interpose --bench pool_replay

use std::time::Instant;
use tensormalloc::backing::DeviceError;
use tensormalloc::config::{Config, CudaPool, CudaSegments, DeviceLimit};
use tensormalloc::device::device_layer::DeviceLayer;
use tensormalloc::sim::SimRuntime;
use tensormalloc::sys::os_pages::map_table;

const MB: usize = 1 << 20;

#[derive(Clone, Copy)]
enum Op {
    Alloc(usize, usize), // (id, bytes)
    Free(usize),
}

/// A ResNet-like step: activations kept for backward, cuDNN-style workspaces freed at once,
/// gradients produced in reverse and weights' gradients that live to the optimizer step.
fn cnn_step() -> Vec<Op> {
    let mut ops = vec![];
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    let batch = 32;
    let mut acts = vec![];
    let (mut hw, mut ch) = (112usize, 64usize);
    for stage in 0..4 {
        for _ in 0..[3, 4, 6, 3][stage] {
            for _ in 0..3 {
                let a = next();
                ops.push(Op::Alloc(a, batch * ch * hw * hw * 4));
                acts.push(a);
                let ws = next();
                ops.push(Op::Alloc(ws, (batch * ch * hw * hw * 4) / 3 + 7 * MB));
                ops.push(Op::Free(ws));
            }
        }
        hw /= 2;
        ch *= 2;
    }
    let mut grads = vec![];
    for &a in acts.iter().rev() {
        let g = next();
        ops.push(Op::Alloc(g, 3 * MB + (a % 5) * 4096));
        grads.push(g);
        let tmp = next();
        ops.push(Op::Alloc(tmp, 24 * MB + (a % 7) * MB));
        ops.push(Op::Free(tmp));
        ops.push(Op::Free(a));
    }
    grads.into_iter().for_each(|g| ops.push(Op::Free(g)));
    ops
}

/// A transformer-like step: per layer q/k/v, attention scores, MLP hidden; kept for backward.
fn transformer_step() -> Vec<Op> {
    let mut ops = vec![];
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    let (b, t, d, h) = (8usize, 1024usize, 1024usize, 16usize);
    let mut kept = vec![];
    for _layer in 0..12 {
        for bytes in [3 * b * t * d * 2, b * h * t * t * 2, b * t * 4 * d * 2, b * t * d * 2] {
            let a = next();
            ops.push(Op::Alloc(a, bytes));
            kept.push(a);
        }
        let tmp = next();
        ops.push(Op::Alloc(tmp, b * h * t * t * 4));
        ops.push(Op::Free(tmp));
    }
    for &a in kept.iter().rev() {
        let g = next();
        ops.push(Op::Alloc(g, b * t * d * 2));
        ops.push(Op::Free(a));
        ops.push(Op::Free(g));
    }
    ops
}

/// A recorded step: `traces/cs336-medium-512-training.ops`, made by `traces/from_snapshot.py`
/// from a PyTorch memory snapshot of one training step of a GPT-2-medium-sized transformer
/// (see traces/README.md for where it came from).
fn recorded_step() -> Vec<Op> {
    include_str!("traces/cs336-medium-512-training.ops")
        .lines()
        .map(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next().and_then(|w| w.parse().ok()), words.next().and_then(|w| w.parse().ok())) {
                (Some("a"), Some(id), Some(size)) => Op::Alloc(id, size),
                (Some("f"), Some(id), None) => Op::Free(id),
                _ => panic!("bad line in the recorded trace: {line}"),
            }
        })
        .collect()
}

/// The issue 28 random sequence: sizes 512 B to 64 MiB (log-uniform), at most 40 live.
fn random_sequence() -> Vec<Op> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut ops, mut live, mut id) = (vec![], vec![], 0);
    for _ in 0..4000 {
        if live.len() < 40 && (live.is_empty() || next() % 3 != 0) {
            let bits = 9 + next() % 18;
            let size = ((1usize << bits) + (next() as usize % (1 << bits))).min(64 * MB);
            id += 1;
            ops.push(Op::Alloc(id, size));
            live.push(id);
        } else {
            let i = next() as usize % live.len();
            ops.push(Op::Free(live.swap_remove(i)));
        }
    }
    live.into_iter().for_each(|i| ops.push(Op::Free(i)));
    ops
}

struct Outcome {
    ns_per_call: f64,
    peak_live: usize,
    peak_reserved: u64,
    /// Driver calls in the first step (warm-up), and per 1,000 operations after it.
    warmup_calls: u64,
    driver_calls: f64,
    ooms: usize,
}

fn driver_calls(layer: &DeviceLayer<SimRuntime>) -> u64 {
    let d = layer.runtime().device(0);
    d.mallocs + d.frees + d.maps + d.unmaps + d.moves + d.reserves
}

fn replay(ops: &[Op], steps: usize, pool: CudaPool, segments: CudaSegments, limit: Option<usize>, capacity: usize) -> Outcome {
    let layer = Box::leak(Box::new(DeviceLayer::new(SimRuntime::new(&[capacity]), map_table, tensormalloc::sys::clock::now_ns)));
    let config = Config { cuda_pool: pool, cuda_segments: segments, cuda_limit: limit.map_or(DeviceLimit::Unlimited, |l| DeviceLimit::Bytes(l as u64)), ..Config::default() };
    layer.configure(&config);
    let max_id = ops.iter().map(|op| match op { Op::Alloc(i, _) | Op::Free(i) => *i }).max().unwrap_or(0);
    let mut addr = vec![0usize; max_id + 1];
    let mut size = vec![0usize; max_id + 1];
    let (mut live, mut peak_live, mut ooms, mut calls) = (0usize, 0usize, 0usize, 0usize);
    let start = Instant::now();
    let mut warmup_calls = 0;
    for step in 0..steps {
        if step == 1 {
            warmup_calls = driver_calls(layer);
        }
        for op in ops {
            calls += 1;
            match *op {
                Op::Alloc(i, bytes) => match layer.malloc(bytes, 0) {
                    Ok(a) => {
                        addr[i] = a;
                        size[i] = bytes;
                        live += bytes;
                        peak_live = peak_live.max(live);
                    }
                    Err(DeviceError::OutOfMemory | DeviceError::CapReached) => {
                        ooms += 1;
                        addr[i] = 0;
                    }
                    Err(e) => panic!("{e:?}"),
                },
                Op::Free(i) => {
                    if addr[i] != 0 {
                        layer.free(addr[i]).unwrap();
                        live -= size[i];
                        addr[i] = 0;
                    }
                }
            }
        }
    }
    let elapsed = start.elapsed().as_nanos() as f64;
    let mut peak_reserved = 0;
    layer.for_each_pool(|_, p| peak_reserved += p.stats.peak_reserved_bytes);
    let after = (driver_calls(layer) - warmup_calls) as f64 * 1000.0 / (calls - ops.len()).max(1) as f64;
    Outcome { ns_per_call: elapsed / calls as f64, peak_live, peak_reserved, warmup_calls, driver_calls: after, ooms }
}

fn main() {
    // A simulated H100's 80 GiB.
    const DEVICE: usize = 80 << 30;
    println!("| trace | pool | cap | ns/call (pool + simulator) | peak reserved / peak live | driver calls, first step | driver calls per 1,000 ops after | OOMs |");
    println!("|---|---|---|---|---|---|---|---|");
    let pools = [(CudaPool::Split, CudaSegments::Classic, "split"), (CudaPool::Binned, CudaSegments::Classic, "binned"), (CudaPool::Split, CudaSegments::Expandable, "split, expandable")];
    for (name, ops, steps) in [("cnn", cnn_step(), 50), ("transformer", transformer_step(), 50), ("random", random_sequence(), 50), ("recorded GPT-2-medium step", recorded_step(), 10)] {
        let uncapped = replay(&ops, 2, CudaPool::Split, CudaSegments::Classic, None, DEVICE);
        for cap_factor in [None, Some(1.25f64), Some(1.05)] {
            for (pool, segments, label) in pools {
                let limit = cap_factor.map(|f| (uncapped.peak_live as f64 * f) as usize);
                let o = replay(&ops, steps, pool, segments, limit, DEVICE);
                println!(
                    "| {name} ({} ops/step) | {label} | {} | {:.0} | {:.3} | {} | {:.1} | {} |",
                    ops.len(),
                    cap_factor.map_or("none".to_string(), |f| format!("{f}x peak live")),
                    o.ns_per_call,
                    o.peak_reserved as f64 / o.peak_live as f64,
                    o.warmup_calls,
                    o.driver_calls,
                    o.ooms
                );
            }
        }
    }
}
