//! Expandable segments' memory (Note [Expandable segments] in device/pool/chunks.rs): chunks
//! mapped where a live block needs them (an idle one moved there first), unmapped when they go
//! back, granted to the devices the program enabled peer access for, and every chunk and range
//! given back at a context's end. Each runs under the device's grow lock, with no pool lock held
//! across a driver call.

use super::DeviceLayer;
use crate::backing::{DeviceError, DeviceRuntime, CUDA_ERROR_INVALID_VALUE};
use crate::device::pool::chunks::Unmap;
use crate::device::pool::{DevicePool, SYNCED};
use crate::record;
use crate::record::holders::device_place;
use crate::record::stats::timed;
use crate::sys::lock::Lock;
use core::sync::atomic::Ordering::{AcqRel, Acquire};

impl<R: DeviceRuntime> DeviceLayer<R> {

    /// Maps the chunks live block [addr, addr + size) touches that are not mapped yet (Note
    /// [Expandable segments]), giving idle chunks back and asking the neighbours when the device
    /// is full, as a new classic segment would. On failure the block is freed again.
    pub(super) fn map_block(&self, device: i32, pool: &Lock<DevicePool>, addr: u64, size: u64) -> Result<(), DeviceError> {
        let d = device as usize;
        let (mut released, mut asked) = (false, false);
        let result = loop {
            match self.map_chunks(d, pool, addr, size) {
                Ok(()) => break Ok(()),
                Err(DeviceError::OutOfMemory) if !released && self.could_hold(size as usize) && !self.capturing() => {
                    self.runtime.clear_last_error();
                    pool.lock().stats.oom_retries += 1;
                    if let Err(e) = self.release_cached_unasked(d, pool) {
                        break Err(e);
                    }
                    released = true;
                }
                Err(DeviceError::CapReached) if !released => match self.release_cached_unasked(d, pool) {
                    Ok(true) => released = true,
                    Ok(false) => break Err(DeviceError::CapReached),
                    Err(e) => break Err(e),
                },
                Err(DeviceError::OutOfMemory) if !asked && self.could_hold(size as usize) && self.ask_neighbours(device) => {
                    self.runtime.clear_last_error();
                    asked = true;
                }
                Err(e) => break Err(e),
            }
        };
        if result.is_err() {
            {
                let mut p = pool.lock();
                if matches!(result, Err(DeviceError::OutOfMemory | DeviceError::CapReached)) {
                    p.stats.oom_failures += 1;
                }
                p.free(addr, SYNCED, (self.clock)());
            }
            // The chunks mapped for it are idle now: they go back, for the others on the GPU.
            let _ = self.release_cached_unasked(d, pool);
            self.runtime.clear_last_error();
        }
        result
    }

    /// One pass of `map_block` under the grow lock: maps what is still unmapped.
    pub(super) fn map_chunks(&self, d: usize, pool: &Lock<DevicePool>, addr: u64, size: u64) -> Result<(), DeviceError> {
        let Some(grow) = self.growing.get(d) else { return Err(DeviceError::Other(CUDA_ERROR_INVALID_VALUE)) };
        let _growing = grow.lock();
        let peers = self.peers.get(d).map_or(0, |p| p.load(Acquire));
        loop {
            let mut todo = [0u64; 32];
            let (n, chunk) = {
                let p = pool.lock();
                (p.unmapped_chunks(addr, size, &mut todo), p.chunk_bytes())
            };
            if n == 0 {
                return Ok(());
            }
            for &va in todo.iter().take(n) {
                // An idle chunk elsewhere is moved here before new memory is made.
                let spare = pool.lock().take_idle_chunk();
                let moved = spare.and_then(|u| {
                    let moved = timed(&self.stats.phases.malloc_runtime, || self.runtime.move_chunk(d as i32, u.addr, va, chunk, u.handle, peers));
                    record::segment(device_place(d), u.addr, chunk, false);
                    if moved.is_err() {
                        pool.lock().stats.segments_released += 1; // the move failed: released
                    }
                    moved.ok().map(|()| u.handle)
                });
                let handle = match moved {
                    Some(handle) => handle,
                    None if !pool.lock().fits_cap(chunk) => return Err(DeviceError::CapReached),
                    None => timed(&self.stats.phases.malloc_runtime, || self.runtime.map_chunk(d as i32, va, chunk, peers))?,
                };
                if !pool.lock().set_mapped(va, handle) {
                    // The range went with a reset meanwhile: this chunk is nobody's.
                    let _ = self.runtime.unmap_chunk(va, chunk, handle);
                    return Err(DeviceError::Other(CUDA_ERROR_INVALID_VALUE));
                }
                record::segment(device_place(d), va, chunk, true);
            }
        }
    }

    /// The program enabled peer access from the current device to the memory of context
    /// `peer_ctx` (cuCtxEnablePeerAccess; cudaDeviceEnablePeerAccess comes through it): as for
    /// cudaMalloc'd memory, its device's blocks must work in the current device's kernels. Chunks
    /// of an expandable pool are made accessible to it, those mapped already and every later one
    /// (Note [Expandable segments]); classic segments need nothing.
    pub fn peer_access_enabled(&self, peer_ctx: u64) {
        let Ok(accessor) = self.runtime.current_device() else { return };
        if self.runtime.enter_context(peer_ctx).is_err() {
            return;
        }
        let owner = self.runtime.current_device();
        self.runtime.leave_device();
        let Ok(owner) = owner else { return };
        let (Some(pool), Some(grow), Some(peers)) = (self.pools().get(owner as usize), self.growing.get(owner as usize), self.peers.get(owner as usize)) else { return };
        if owner == accessor || !(0..64).contains(&accessor) {
            return;
        }
        let _growing = grow.lock();
        peers.fetch_or(1 << accessor, AcqRel);
        let mut from = 0;
        loop {
            let mut runs = [(0u64, 0u64); 64];
            let n = {
                let p = pool.lock();
                if !p.is_ready() || !p.expandable() {
                    return;
                }
                p.mapped_runs_from(from, &mut runs)
            };
            for &(start, end) in runs.iter().take(n) {
                let _ = self.runtime.grant_access(start, end - start, accessor);
                from = end;
            }
            if n < runs.len() {
                return;
            }
        }
    }

    /// Unmaps and releases chunks taken out of `device`'s pool, in the current context (the
    /// caller closes their exported descriptors: `close_exported`).
    pub(super) fn unmap_chunks(&self, device: usize, chunk: u64, batch: &[Unmap]) -> Result<(), DeviceError> {
        for u in batch {
            timed(&self.stats.phases.free_runtime, || self.runtime.unmap_chunk(u.addr, chunk, u.handle))?;
            record::segment(device_place(device), u.addr, chunk, false);
        }
        Ok(())
    }

    /// Closes the descriptors exported for chunks taken out of a pool (Note [IPC of expandable
    /// segments]): the driver keeps a peer's imported memory on its own.
    pub(super) fn close_exported(&self, batch: &[Unmap]) {
        for u in batch.iter().filter(|u| u.fd >= 0) {
            self.runtime.close_exported(u.fd);
        }
    }

    /// Forgets every block of a pool whose context is gone, as the runtime freed them: its live
    /// blocks leave the holders table (Note [Holders]), and the history frees them and unmaps
    /// their segments (the snapshot's timeline must not keep them).
    /// Note [Expandable segments]: a context's end frees its cuMemAlloc'd segments, not our
    /// chunks (the virtual memory API's memory is the device's): before the pool forgets them,
    /// every chunk of `device`'s pool (bound to `ctx`, or any when 0) goes back to the driver,
    /// live ones too (the program's pointers into them die with the context, as cudaMalloc'd ones
    /// do), after the work queued on them finished. Best effort: a context already gone refuses
    /// the synchronization, and the driver answers for what it freed itself.
    pub(super) fn release_all_chunks(&self, device: usize, pool: &Lock<DevicePool>, ctx: u64) {
        let ours = |p: &DevicePool| p.holds_memory() && p.expandable() && (ctx == 0 || p.owner() == ctx);
        if !ours(&pool.lock()) {
            return;
        }
        let Some(grow) = self.growing.get(device) else { return };
        let _growing = grow.lock();
        let _ = self.with_device(device as i32, || self.synchronize());
        loop {
            let mut batch = [Unmap::default(); 32];
            let (n, chunk) = {
                let mut p = pool.lock();
                if !ours(&p) {
                    return;
                }
                (p.take_all_chunks(&mut batch), p.chunk_bytes())
            };
            for u in batch.iter().take(n) {
                let _ = self.runtime.unmap_chunk(u.addr, chunk, u.handle);
                record::segment(device_place(device), u.addr, chunk, false);
            }
            self.close_exported(batch.get(..n).unwrap_or(&[]));
            if n < batch.len() {
                return;
            }
        }
    }

    /// Gives back the address space of ranges a forgotten pool reserved (Note [Expandable
    /// segments]); best effort: a chunk mapped meanwhile keeps its range (the driver refuses).
    pub(super) fn unreserve(&self, ranges: &[(u64, u64)]) {
        for &(base, len) in ranges {
            let _ = self.runtime.unreserve(base, len);
        }
    }
}
