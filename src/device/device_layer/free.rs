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
        let synced = self.sync_on_free.load(Relaxed);
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
                pool.mark_all_synced();
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
        if f.segment_idle {
            self.segment_idle_at(f.freed_ns);
        }
        match f.release {
            // Note [IPC]: an exported segment goes back to the runtime, on its own device.
            Some((base, _)) => self.with_device(device as i32, || self.runtime_free(base as usize)),
            None => Ok(()),
        }
    }

    /// The pluggable allocator's free: reusable at once on the same stream.
    pub fn free_on_stream(&self, addr: usize, device: i32, stream: usize) -> FreeAnswer {
        timed(&self.stats.phases.free, || self.free_on_stream_untimed(addr, usize::try_from(device).ok(), stream))
    }

    /// `device` is a hint (the caller's word, or an owner just looked up): the owning pool is
    /// looked up again when it is absent or wrong.
    pub(super) fn free_on_stream_untimed(&self, addr: usize, device: Option<usize>, stream: usize) -> FreeAnswer {
        let index = device.filter(|&d| self.pools().get(d).is_some_and(|p| p.lock().owns(addr as u64)));
        let Some(d) = index.or_else(|| self.owning_device(addr)) else { return self.not_live(addr) };
        let now = (self.clock)();
        match self.pools().get(d).and_then(|p| p.lock().free(addr as u64, stream_tag(stream), now)) {
            Some(f) => {
                // An exported segment that cannot be given back stays with the runtime's
                // context until it ends; it is out of our pool either way.
                let _ = self.after_free(d, addr, f, stream_tag(stream));
                FreeAnswer::Pooled
            }
            // Freed by another thread meanwhile.
            None => FreeAnswer::Refused,
        }
    }

    /// cudaFreeAsync / cuMemFreeAsync of a pointer: back into its pool, reusable on `stream`
    /// at once and by anyone else after a device synchronization (Note [Safe reuse]).
    pub fn free_async(&self, addr: usize, stream: usize) -> FreeAnswer {
        let Some(d) = self.owning_device(addr) else { return self.not_live(addr) };
        timed(&self.stats.phases.free, || self.free_on_stream_untimed(addr, Some(d), stream))
    }
}
