//! IPC of expandable blocks (Note [IPC of expandable segments] in device/pool/exports.rs) over a
//! simulated device: the descriptors an export gives the chunks under a block, what a peer is
//! handed and when not, exported memory never moved (the simulator fails a move of it), closed
//! when it goes back, and a dead block's room free again once no exported memory lies under it.

use super::*;
use crate::config::{Config, CudaSegments};
use crate::device::device_layer::{Export, ExpandableBlock};
use crate::sim::{leak_table, SimRuntime};

const MB: usize = 1 << 20;
const GB: usize = 1 << 30;

fn layer(capacity: usize) -> Box<DeviceLayer<SimRuntime>> {
    let l = Box::new(DeviceLayer::new(SimRuntime::new(&[capacity]), leak_table, crate::sys::clock::now_ns));
    l.configure(&Config { cuda_segments: CudaSegments::Expandable, ..Config::default() });
    l
}

/// Exports live block `addr` as the route does: descriptors for its chunks, then its mark under
/// registry entry `entry`.
fn exported(l: &DeviceLayer<SimRuntime>, addr: usize, entry: u32) -> ExpandableBlock {
    let Export::Expandable(b) = l.export(addr) else { panic!("{:?}", l.export(addr)) };
    l.export_chunks(&b).unwrap();
    assert!(l.mark_export(b.device, b.addr, b.buffer_id, entry));
    b
}

fn dead(l: &DeviceLayer<SimRuntime>) -> (u64, u64) {
    let mut d = (0, 0);
    l.for_each_pool(|_, p| d = p.dead());
    d
}

#[test]
fn an_export_gives_each_chunk_a_descriptor_and_a_peer_gets_duplicates_while_the_block_lives() {
    let l = layer(4 * GB);
    let before = l.malloc(3 * MB, 0).unwrap();
    let a = l.malloc(5 * MB, 0).unwrap();
    let b = exported(&l, a, 7);
    let chunk = 2 * MB as u64;
    assert_eq!((b.addr, b.size, b.chunk_bytes), (a as u64, 5 * MB as u64, chunk));
    assert!(b.first_chunk <= b.addr && b.addr < b.first_chunk + chunk, "{b:?}");
    assert_eq!(b.chunks, (b.addr - b.first_chunk + b.size).div_ceil(chunk), "every chunk the block touches");
    let fds = l.runtime().exported_fds();
    assert_eq!(fds.len() as u64, b.chunks);
    for k in 0..b.chunks {
        let handle = l.runtime().chunk_handle(b.first_chunk + k * chunk).unwrap();
        assert!(fds.iter().any(|&(_, h)| h == handle), "chunk {k} has a descriptor of its own memory");
    }
    // A second export names the same entry and makes no new descriptor.
    let Export::Expandable(again) = l.export(a + 4096) else { panic!() };
    assert_eq!(again.entry, Some(7));
    l.export_chunks(&again).unwrap();
    assert_eq!(l.runtime().exported_fds().len() as u64, b.chunks);
    // A peer gets duplicates, in chunk order, a batch at a time.
    let mut out = [-1i32; 64];
    assert_eq!(l.exported_fds(0, b.addr, b.buffer_id, 7, 0, &mut out), Some(b.chunks as usize));
    let handle_of = |fd: i32| l.runtime().exported_fds().into_iter().find(|&(f, _)| f == fd).map(|(_, h)| h);
    for (k, &fd) in out.iter().enumerate().take(b.chunks as usize) {
        assert!(!fds.iter().any(|&(f, _)| f == fd), "a duplicate, not ours");
        assert_eq!(handle_of(fd), l.runtime().chunk_handle(b.first_chunk + k as u64 * chunk));
        l.runtime().close_exported(fd);
    }
    let mut one = [-1i32; 1];
    assert_eq!(l.exported_fds(0, b.addr, b.buffer_id, 7, 1, &mut one), Some(1));
    assert_eq!(handle_of(one[0]), l.runtime().chunk_handle(b.first_chunk + chunk));
    l.runtime().close_exported(one[0]);
    // Only for the entry and the life the export named.
    assert_eq!(l.exported_fds(0, b.addr, b.buffer_id, 8, 0, &mut out), None, "another entry");
    assert_eq!(l.exported_fds(0, b.addr, b.buffer_id + 1, 7, 0, &mut out), None, "another life");
    let unexported = l.malloc(MB, 0).unwrap();
    let Export::Expandable(u) = l.export(unexported) else { panic!() };
    assert_eq!(l.exported_fds(0, u.addr, u.buffer_id, 7, 0, &mut out), None, "not exported");
    // Freed: a peer gets nothing more.
    l.free(a).unwrap();
    assert_eq!(l.exported_fds(0, b.addr, b.buffer_id, 7, 0, &mut out), None, "a freed block's handle opens nothing");
    assert_eq!(l.runtime().exported_fds().len() as u64, b.chunks, "only its own descriptors are left");
    l.free(before).unwrap();
    l.free(unexported).unwrap();
}

/// Exported chunks are never moved where another block needs memory (the simulator fails such
/// a move), idle ones go back with their descriptors closed, and the dead block's room is free
/// again after.
#[test]
fn exported_memory_is_never_moved_and_goes_back_with_its_descriptor_closed() {
    let l = layer(4 * GB);
    let a = l.malloc(20 * MB, 0).unwrap();
    exported(&l, a, 7);
    l.free(a).unwrap();
    assert_eq!(dead(&l), (1, 20 * MB as u64), "dead at its free");
    // Memory beyond a tenth over the most ever live: idle chunks are moved rather than new memory
    // made; the exported ones are idle too, the oldest, and must stay.
    let b = l.malloc(20 * MB, 0).unwrap();
    assert_ne!(b, a, "never handed out again while its memory is exported");
    let k = l.malloc(2 * MB, 0).unwrap(); // keeps the next request out of b's room
    l.free(b).unwrap();
    let c = l.malloc(30 * MB, 0).unwrap();
    assert!(l.runtime().device(0).moves > 0, "idle chunks were moved: the path that must skip exported ones ran");
    assert!(l.runtime().is_mapped(c as u64) && l.runtime().is_mapped((c + 30 * MB - 1) as u64));
    l.free(c).unwrap();
    l.free(k).unwrap();
    assert!(!l.runtime().exported_fds().is_empty());
    l.trim();
    assert_eq!(l.runtime().exported_fds(), vec![], "descriptors closed with their chunks");
    assert_eq!(l.runtime().device(0).used, 0, "nothing left at the driver");
    assert_eq!(dead(&l), (0, 0), "no exported memory under it: its room is free again");
    assert_eq!(l.range(a + 100), RangeAnswer::Free);
}

/// A dead block in a chunk a live block still touches keeps its room (never handed out again)
/// until that chunk goes back; then the room is free and handed out again.
#[test]
fn a_dead_block_beside_a_live_one_keeps_its_room_until_their_chunk_goes_back() {
    let l = layer(4 * GB);
    let s = l.malloc(4096, 0).unwrap();
    let n = l.malloc(4096, 0).unwrap();
    exported(&l, s, 3);
    l.free(s).unwrap();
    let others: Vec<usize> = (0..10).map(|_| l.malloc(4096, 0).unwrap()).collect();
    assert!(!others.contains(&s), "the dead block is never handed out again");
    l.trim();
    assert_eq!(dead(&l), (1, 4096), "its chunk is still live: it stays dead");
    assert_eq!(l.runtime().exported_fds().len(), 1, "and the chunk keeps its descriptor");
    for p in others.into_iter().chain([n]) {
        l.free(p).unwrap();
    }
    l.trim();
    assert_eq!(dead(&l), (0, 0));
    assert_eq!(l.runtime().exported_fds(), vec![]);
    assert_eq!(l.malloc(4096, 0).unwrap(), s, "its room serves again, on new memory");
}

/// A driver that gives no descriptor: the export is refused with its error, and the block is
/// freed and reused as any other.
#[test]
fn a_driver_that_cannot_export_refuses_with_its_error() {
    let l = layer(4 * GB);
    l.runtime().refuse_exports();
    let a = l.malloc(4 * MB, 0).unwrap();
    let Export::Expandable(b) = l.export(a) else { panic!() };
    assert_eq!(l.export_chunks(&b), Err(DeviceError::Other(801)));
    l.free(a).unwrap();
    assert_eq!(dead(&l), (0, 0));
    assert_eq!(l.malloc(4 * MB, 0).unwrap(), a);
}
