//! The device layer: a caching pool per CUDA device (`pool`) over fixed tables that never touch
//! the malloc family (`table`), pinned host memory served for the device (`pinned`), and the
//! glue that drives them over a `DeviceRuntime` (backing.rs) with every CUDA call made outside
//! the locks (`device_layer`, a room per concept); beside them the processes on one GPU
//! (`neighbours`), IPC handles of pooled blocks (`ipc`), and the line each fallback says
//! (`fallback`).
//
// Policy summary (see device/pool/mod.rs for the rules in full):
// - split (default): requests under 1 MiB come from 2 MiB segments, larger ones from 20 MiB
//   segments (under 10 MiB) or segments of their own size rounded to 2 MiB; free blocks are
//   split on reuse and merged with free neighbours on free. Huge free blocks (over 256 MiB)
//   are never split: a request takes one only if it wastes at most 20 MiB.
// - binned: sizes rounded to a quarter-power-of-two class, one segment per block, reused only
//   by a request of the same class.
// - Out of memory (or over the cap): fully free segments are given back, then the request is
//   retried once, then the neighbours are asked. See Note [Safe reuse] in device/pool/mod.rs
//   for when a freed block may be reused, Note [IPC] in device/pool/pointers.rs for a block a
//   handle names (never reused after its free).

pub mod device_layer;
pub mod fallback;
pub mod ipc;
pub mod neighbours;
pub mod pinned;
pub mod pool;
pub mod table;
