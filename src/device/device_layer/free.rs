//! A block back into its pool: cudaFree (synchronizing, Note [Safe reuse] in device/pool/mod.rs),
//! the stream-ordered frees and the pluggable allocator's free; a pointer that is no live block
//! of ours is passed on or refused (Note [Unexpected frees]).

use super::DeviceLayer;
use crate::backing::{DeviceError, DeviceRuntime, CUDA_ERROR_INVALID_VALUE};
use crate::device::pool::{stream_tag, Freed, PENDING, SYNCED};
use crate::record;
use crate::record::stats::timed;
use core::sync::atomic::Ordering::Relaxed;

/// Where a free went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeAnswer {
    Pooled,
    /// Not ours: the caller passes it to the runtime unchanged.
    NotOurs,
    /// Inside our memory but not a live block's start (a double free, a pointer inside a block):
    /// nothing was freed, and the caller answers as the runtime does for a pointer it never
    /// handed out (Note [Unexpected frees]).
    Refused,
}

// Note [Unexpected frees]
// A free of an address in one of our segments that is not a live block's start would, passed to
// the runtime, free the whole segment under the blocks still live in it (or a cached segment the
// pool hands out next). The pool refuses it instead, as the runtime refuses a pointer it never
// handed out: invalid value, nothing freed. A segment base is recognized at once; an address
// inside a segment needs the runtime's allocation range, asked only for addresses within the
// span of some pool's segments. Pinned blocks freed into the cache are refused the same way.

impl<R: DeviceRuntime> DeviceLayer<R> {
    /// cudaFree of a pointer: back into its device's pool, whatever device is current.
    pub fn free(&self, addr: usize) -> Result<FreeAnswer, DeviceError> {
        let Some(device) = self.owning_device(addr) else { return Ok(self.not_live(addr)) };
        timed(&self.stats.phases.free, || self.free_ours(addr, device))
    }

    /// Note [Unexpected frees]: the answer for a free of `addr`, which is no live block of ours.
    pub(super) fn not_live(&self, addr: usize) -> FreeAnswer {
        if self.in_segment(addr) {
            FreeAnswer::Refused
        } else {
            FreeAnswer::NotOurs
        }
    }

    pub(super) fn free_ours(&self, addr: usize, device: usize) -> Result<FreeAnswer, DeviceError> {
        // Note [Graph captures under way]: during a capture the block waits for a later
        // synchronization instead, as one freed on a stream does.
        let call = if self.sync_on_free.load(Relaxed) { self.unasked() } else { None };
        let synced = call.is_some();
        let began = (self.clock)();
        if synced {
            // Note [Safe reuse]: the device that ran the block's kernels is the one to wait for.
            self.with_device(device as i32, || self.synchronize())?;
        }
        let pool = self.pools().get(device).ok_or(DeviceError::Other(CUDA_ERROR_INVALID_VALUE))?;
        let freed = {
            let mut pool = pool.lock();
            if synced {
                // The whole device is idle now: blocks freed on streams are reusable too, and
                // the report counts this sync.
                pool.mark_synced_before(began);
            }
            pool.free(addr as u64, if synced { SYNCED } else { PENDING }, (self.clock)())
        };
        match freed {
            Some(f) => {
                self.after_free(device, addr, f, if synced { SYNCED } else { PENDING })?;
                Ok(FreeAnswer::Pooled)
            }
            // Freed by another thread meanwhile: a double free (Note [Unexpected frees]).
            None => Ok(FreeAnswer::Refused),
        }
    }

    pub(super) fn after_free(&self, device: usize, addr: usize, f: Freed, tag: u64) -> Result<(), DeviceError> {
        record::free(Self::block(device, addr as u64, f.size, f.holder, tag));
        if let Some(entry) = f.ipc_entry {
            // Note [IPC]: the freed block's handle opens nothing from now on.
            crate::device::ipc::withdraw(entry);
        }
        if f.segment_idle {
            self.segment_idle_at(f.freed_ns);
        }
        match f.release {
            // Note [IPC]: an exported segment goes back to the runtime, on its own device.
            Some((base, _)) => self.with_device(device as i32, || self.runtime_free(base as usize)),
            None => Ok(()),
        }
    }

    /// The pluggable allocator's free: reusable at once on the same stream. `device` is the
    /// caller's word, the pool tried first.
    pub fn free_on_stream(&self, addr: usize, device: i32, stream: usize) -> FreeAnswer {
        self.free_tagged(addr, usize::try_from(device).ok(), stream_tag(stream))
    }

    /// cudaFreeAsync / cuMemFreeAsync of a pointer: back into its pool, reusable on `stream`
    /// at once and by anyone else after a device synchronization (Note [Safe reuse]).
    /// cuStreamDestroy: the blocks freed on `stream` wait for a synchronization (Note [Streams
    /// that end] in pool/blocks.rs).
    pub fn stream_ended(&self, stream: usize) {
        let tag = stream_tag(stream);
        for pool in self.pools() {
            let mut p = pool.lock();
            if p.is_ready() {
                p.stream_ended(tag);
            }
        }
    }

    pub fn free_async(&self, addr: usize, stream: usize) -> FreeAnswer {
        self.free_tagged(addr, None, stream_tag(stream))
    }

    /// A free that needs no synchronization: the block is found and taken back in one pass over
    /// the pools (the `first` one tried first), each looking `addr` up once under its lock. The
    /// free phase times pooled frees only, as cudaFree's does.
    fn free_tagged(&self, addr: usize, first: Option<usize>, tag: u64) -> FreeAnswer {
        let pools = self.pools();
        let start = crate::sys::clock::now_ns();
        let now = (self.clock)();
        let others = (0..pools.len()).filter(|&d| Some(d) != first);
        for d in first.into_iter().chain(others) {
            let Some(pool) = pools.get(d) else { continue };
            let freed = {
                let mut p = pool.lock();
                if !p.is_ready() {
                    continue;
                }
                p.free(addr as u64, tag, now)
            };
            if let Some(f) = freed {
                // An exported segment that cannot be given back stays with the runtime's
                // context until it ends; it is out of our pool either way.
                let _ = self.after_free(d, addr, f, tag);
                self.stats.phases.free.record(crate::sys::clock::now_ns().saturating_sub(start));
                return FreeAnswer::Pooled;
            }
        }
        // Not live anywhere: a stranger's pointer, or one inside our memory (a double free,
        // also when another thread freed it meanwhile: Note [Unexpected frees]).
        self.not_live(addr)
    }
}
