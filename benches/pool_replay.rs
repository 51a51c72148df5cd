//! Trace replay for the device pool: allocation and free sequences shaped like a CNN training
//! step and a transformer training step, replayed through each pool strategy over a simulated
//! device (fake addresses, never dereferenced), with and without a memory cap. Reports the pool's
//! own cost per call, peak reserved over peak live (fragmentation), runtime calls, and OOMs.
//! This is how the strategies are compared without a GPU; the simulator says nothing about a
//! real GPU's cudaMalloc speed.
//!
//!     cargo bench --features no-interpose --bench pool_replay

use std::time::Instant;
use tensormalloc::backing::DeviceError;
use tensormalloc::config::{Config, CudaPool, DeviceLimit};
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

struct Outcome {
    ns_per_call: f64,
    peak_live: usize,
    peak_reserved: u64,
    runtime_mallocs: u64,
    ooms: usize,
}

fn replay(ops: &[Op], steps: usize, pool: CudaPool, limit: Option<usize>, capacity: usize) -> Outcome {
    let layer = Box::leak(Box::new(DeviceLayer::new(SimRuntime::new(&[capacity]), map_table, tensormalloc::sys::clock::now_ns)));
    let config = Config { cuda_pool: pool, cuda_limit: limit.map_or(DeviceLimit::Unlimited, |l| DeviceLimit::Bytes(l as u64)), ..Config::default() };
    layer.configure(&config);
    let max_id = ops.iter().map(|op| match op { Op::Alloc(i, _) | Op::Free(i) => *i }).max().unwrap_or(0);
    let mut addr = vec![0usize; max_id + 1];
    let mut size = vec![0usize; max_id + 1];
    let (mut live, mut peak_live, mut ooms, mut calls) = (0usize, 0usize, 0usize, 0usize);
    let start = Instant::now();
    for _ in 0..steps {
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
    Outcome { ns_per_call: elapsed / calls as f64, peak_live, peak_reserved, runtime_mallocs: layer.runtime().device(0).mallocs, ooms }
}

fn main() {
    let steps = 50;
    println!("| trace | strategy | cap | ns/call (pool + simulator) | peak reserved / peak live | runtime cudaMalloc calls | OOMs |");
    println!("|---|---|---|---|---|---|---|");
    for (name, ops) in [("cnn", cnn_step()), ("transformer", transformer_step())] {
        let uncapped = replay(&ops, 2, CudaPool::Split, None, 1 << 40);
        for cap_factor in [None, Some(1.25f64), Some(1.05)] {
            for pool in [CudaPool::Split, CudaPool::Binned] {
                let limit = cap_factor.map(|f| (uncapped.peak_live as f64 * f) as usize);
                let o = replay(&ops, steps, pool, limit, 1 << 40);
                println!(
                    "| {name} ({} ops/step) | {:?} | {} | {:.0} | {:.3} | {} | {} |",
                    ops.len(),
                    pool,
                    cap_factor.map_or("none".to_string(), |f| format!("{f}x peak live")),
                    o.ns_per_call,
                    o.peak_reserved as f64 / o.peak_live as f64,
                    o.runtime_mallocs,
                    o.ooms
                );
            }
        }
    }
}
