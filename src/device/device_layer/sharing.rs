//! IPC of blocks in expandable segments, the layer's side (Note [IPC of expandable segments] in
//! device/pool/exports.rs): an export gives the chunks under a block descriptors of their memory,
//! and a peer asking for them (device/ipc/channel.rs, on its own thread) gets duplicates while the
//! block is live and exported under the entry it names. Both under the device's grow lock, which
//! every unmapping holds too; no pool lock across a driver or system call.

use super::{DeviceLayer, ExpandableBlock};
use crate::backing::{DeviceError, DeviceRuntime, CUDA_ERROR_INVALID_VALUE};

impl<R: DeviceRuntime> DeviceLayer<R> {
    /// Gives every chunk under live block `b` a descriptor of its memory, in the block's context;
    /// the driver's error when one cannot be had (chunks made without the POSIX file descriptor
    /// handle type, a driver without it), invalid value when the block is no longer live.
    pub fn export_chunks(&self, b: &ExpandableBlock) -> Result<(), DeviceError> {
        let gone = DeviceError::Other(CUDA_ERROR_INVALID_VALUE);
        let (Some(pool), Some(grow)) = (self.pools().get(b.device), self.growing.get(b.device)) else { return Err(gone) };
        let _growing = grow.lock();
        self.with_device(b.device as i32, || loop {
            let mut todo = [(0u64, 0u64); 32];
            let n = pool.lock().chunks_to_export(b.addr, &mut todo).ok_or(gone)?;
            if n == 0 {
                return Ok(());
            }
            for &(va, handle) in todo.iter().take(n) {
                let fd = self.runtime.export_chunk(handle)?;
                if !pool.lock().set_chunk_fd(va, handle, fd) {
                    self.runtime.close_exported(fd);
                    return Err(gone);
                }
            }
        })
    }

    /// For a peer: duplicates of the descriptors of the chunks from the `first`-th on under live
    /// block `addr` of `device`'s pool, of life `buffer_id`, exported under registry entry
    /// `entry`, into `out`; how many (fewer at the block's end). None when no such block is live
    /// (freed since: a freed block's handle opens nothing) or the system refuses a duplicate.
    pub fn exported_fds(&self, device: usize, addr: u64, buffer_id: u64, entry: u32, first: u64, out: &mut [i32]) -> Option<usize> {
        let (pool, grow) = (self.pools().get(device)?, self.growing.get(device)?);
        let _growing = grow.lock();
        let n = pool.lock().exported_fds(addr, buffer_id, entry, first, out)?;
        let fds = out.get_mut(..n)?;
        for k in 0..fds.len() {
            let dup = fds.get(k).and_then(|&fd| self.runtime.dup_exported(fd));
            match (dup, fds.get_mut(k)) {
                (Some(d), Some(slot)) => *slot = d,
                _ => {
                    for &fd in fds.iter().take(k) {
                        self.runtime.close_exported(fd);
                    }
                    return None;
                }
            }
        }
        Some(n)
    }
}
