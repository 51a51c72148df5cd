//! Pinned host memory served for the device: the device layer's cudaHostAlloc / cudaFreeHost
//! through the pinned cache (cache.rs), with every runtime call outside the cache's lock, as for
//! device blocks (device_layer/). A pinned block freed into the cache and freed again is
//! refused (Note [Unexpected frees] in device_layer/free.rs).

use crate::device::device_layer::{DeviceLayer, FreeAnswer};
use crate::backing::{DeviceError, DeviceRuntime};
use crate::device::pinned::cache::{PinnedBlock, PinnedFree};
use crate::record::{self, holders::PLACE_PINNED};
use core::sync::atomic::Ordering::Relaxed;

impl<R: DeviceRuntime> DeviceLayer<R> {
    /// cudaHostAlloc / cudaMallocHost through the pinned cache, for `holder` (Note [Holders]).
    pub fn host_alloc(&self, size: usize, flags: u32, holder: u64) -> Result<usize, DeviceError> {
        if !self.enabled() {
            return self.runtime.host_alloc(size, flags);
        }
        // Counted as used before the cache is set up: a child forked meanwhile must not take the
        // parent's pinned blocks for its own (Note [Forked children]).
        if !self.used.load(Relaxed) {
            self.used.store(true, core::sync::atomic::Ordering::SeqCst);
        }
        if !self.pinned.lock().init(self.pinned_limit_bytes.load(Relaxed), self.table_source) {
            crate::device::fallback::say(crate::device::fallback::Fallback::PinnedTables);
            return self.runtime.host_alloc(size, flags);
        }
        let ctx = self.runtime.current_context();
        let taken = self.pinned.lock().take(size as u64, flags, ctx, holder);
        if let Some(b) = taken {
            record::alloc(recorded(&b), record::Found::Hit);
            return Ok(b.addr as usize);
        }
        // A size no machine could pin (or whose class would wrap) goes to the runtime as it is.
        let Some(len) = self.pinned.lock().len_for(size as u64) else { return self.runtime.host_alloc(size, flags) };
        let len = len as usize;
        let addr = match self.runtime.host_alloc(len, flags) {
            Ok(a) => a,
            Err(DeviceError::OutOfMemory) => {
                self.runtime.clear_last_error();
                self.trim_pinned();
                self.runtime.host_alloc(len, flags)?
            }
            Err(e) => return Err(e),
        };
        // The runtime may have made a context current for this very call.
        let ctx = if ctx == 0 { self.runtime.current_context() } else { ctx };
        let block = PinnedBlock::live(addr as u64, len as u64, size as u64, flags, ctx, holder);
        if self.pinned.lock().add_live(block) {
            record::alloc(recorded(&block), record::Found::Miss);
        } else {
            self.stats.passthrough.add(1);
        }
        Ok(addr)
    }

    /// Note [Context lifetime]: the pinned blocks of context `ctx` (every one, for None) are
    /// forgotten, as the runtime freed them.
    pub(in crate::device) fn forget_pinned(&self, ctx: Option<u64>) {
        if !self.answers() {
            return;
        }
        self.pinned.lock().forget(ctx, |b| record::forgotten(recorded(b)));
    }

    fn trim_pinned(&self) {
        let mut out = [(0u64, 0u64); 64];
        let n = self.pinned.lock().drain(&mut out);
        for &(addr, _) in out.iter().take(n) {
            let _ = self.runtime.host_free(addr as usize);
        }
    }

    /// cudaFreeHost: into the cache when it is ours.
    /// From any thread, with any context current or none, as the driver's own free.
    pub fn host_free(&self, addr: usize) -> Result<FreeAnswer, DeviceError> {
        let pinned_in = {
            let pinned = self.pinned.lock();
            if !pinned.owns(addr as u64) {
                // Note [Unexpected frees]: a cached block is still pinned, for the next request.
                return Ok(if pinned.is_cached(addr as u64) { FreeAnswer::Refused } else { FreeAnswer::NotOurs });
            }
            pinned.live_block(addr as u64).map_or(0, |b| b.ctx)
        };
        // Note [Graph captures under way]: no synchronization during a capture. Copies from or
        // to the block may still be queued, so it is not kept either: it goes back to the
        // runtime, as the program's own free would have given it.
        let call = if self.sync_on_free.load(Relaxed) { self.unasked() } else { None };
        let kept = !self.sync_on_free.load(Relaxed) || call.is_some();
        if call.is_some() {
            // Copies from or to this memory may still be queued (Note [Safe reuse]): wait for
            // the context it was pinned in when none is current (host memory is no context's).
            if self.runtime.current_context() == 0 && pinned_in != 0 {
                self.runtime.enter_context(pinned_in)?;
                let synced = self.synchronize();
                self.runtime.leave_device();
                synced?;
            } else {
                self.synchronize()?;
            }
        }
        let (outcome, block) = {
            let mut pinned = self.pinned.lock();
            let block = pinned.live_block(addr as u64);
            (if kept { pinned.free(addr as u64) } else { pinned.release(addr as u64) }, block)
        };
        drop(call);
        if let (false, Some(b)) = (matches!(outcome, PinnedFree::NotOurs), block) {
            record::free(recorded(&b));
        }
        match outcome {
            // Freed by another thread meanwhile.
            PinnedFree::NotOurs => return Ok(FreeAnswer::Refused),
            PinnedFree::Refused => self.runtime.host_free(addr)?,
            PinnedFree::Cached { evicted } => {
                for r in evicted.iter() {
                    self.runtime.host_free(r.addr)?;
                }
            }
        }
        Ok(FreeAnswer::Pooled)
    }

    /// Calls `f(block, live)` for every pinned block of ours, live or cached, under the cache's
    /// lock (`f` must not call CUDA or write).
    pub fn for_each_pinned(&self, f: impl FnMut(&crate::device::pinned::cache::PinnedBlock, bool)) {
        if self.answers() {
            self.pinned.lock().for_each(f);
        }
    }

    /// Pinned figures: (requests, hits, cached bytes, peak cached bytes).
    pub fn pinned_figures(&self) -> (u64, u64, u64, u64) {
        if !self.answers() {
            return (0, 0, 0, 0);
        }
        let c = self.pinned.lock();
        (c.requests, c.hits, c.cached_bytes(), c.peak_cached_bytes)
    }
}

/// A pinned block as the records see it.
fn recorded(b: &PinnedBlock) -> record::Block {
    record::Block { place: PLACE_PINNED, addr: b.addr, bytes: b.len, asked: b.len, holder: b.holder, stream: 0 }
}
