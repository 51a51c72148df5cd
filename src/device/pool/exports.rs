//! IPC of blocks in expandable segments, as far as the pool is concerned (Note [IPC of expandable
//! segments]): the file descriptors kept with exported chunks, the ones a peer is given, and the
//! room of a dead exported block, free again once no chunk under it holds exported memory.
//! Bookkeeping only, under the pool's lock; never calls CUDA or the system.
//
// Note [IPC of expandable segments]
// A block of an expandable segment lies on chunks (Note [Expandable segments] in chunks.rs), and
// a peer must map those chunks' physical memory. At its first export (DeviceLayer::export_chunks)
// each chunk under the block gets a POSIX file descriptor of its memory
// (cuMemExportToShareableHandle; chunks are created exportable where the device can be asked so:
// sys/cuda_shareable.rs), kept with the chunk (`fd`) until the chunk goes back to the driver, when
// the layer closes it; the block is published in the IPC registry as a classic sub-block is
// (Note [IPC] in pointers.rs), its entry naming the chunk run and the block's place in it. A peer
// under the preload asks this process for the descriptors over a Unix socket (device/ipc/
// channel.rs), imports them, maps them side by side in address space of its own and lands on the
// block. What keeps a peer on the block's bytes:
// - a chunk with a descriptor is never moved to another place (`take_idle_chunk` skips it): the
//   memory a peer maps stays where the block is;
// - an exported block dies at its free, as a classic one does: out of every list, never handed
//   out again, its registry entry withdrawn (a later open fails), so no later block is read
//   through an old handle. Its chunks stop counting it: once no live block touches them they go
//   back to the driver by the usual paths (idle, pressure, neighbours, trim, before an out of
//   memory), and the driver keeps a peer's imported memory alive on its own. When no chunk under
//   the dead block holds exported memory any more, its room is free again (a block there gets new
//   memory). Cost: an exported block's room while a chunk under it holds exported memory;
// - descriptors go to a peer only while the block is live and exported under the entry the peer
//   names, duplicated under the device's grow lock, which every unmapping holds too: a descriptor
//   is never closed (and its number reused) while it is being duplicated.

use super::*;

impl DevicePool {
    /// The mapped chunks under live block `addr` that have no descriptor yet, (address, physical
    /// handle) into `out`; how many. None when `addr` is no live block of an expandable pool.
    pub fn chunks_to_export(&self, addr: u64, out: &mut [(u64, u64)]) -> Option<usize> {
        let b = self.blocks.get(self.live.get(addr).filter(|_| self.expandable())?);
        let mut n = 0;
        for k in self.chunk_span(b.addr, b.size) {
            let c = self.chunks.get(k);
            if c.handle == 0 {
                return None; // a live block's chunks are mapped; a reset took them
            }
            if c.fd < 0 {
                let Some(slot) = out.get_mut(n) else { break };
                *slot = (c.addr, c.handle);
                n += 1;
            }
        }
        Some(n)
    }

    /// The layer exported the memory `handle` of chunk `va` as descriptor `fd`: kept with the
    /// chunk. False when the chunk holds other memory now, or a descriptor already (the caller
    /// closes `fd`).
    pub fn set_chunk_fd(&mut self, va: u64, handle: u64, fd: i32) -> bool {
        let Some(k) = self.chunk_span(va, 1).next() else { return false };
        let c = self.chunks.get_mut(k);
        if c.addr != va || c.handle != handle || c.handle == 0 || c.fd >= 0 || fd < 0 {
            return false;
        }
        c.fd = fd;
        true
    }

    /// The run of chunks block [addr, addr + size) lies on: (first chunk's address, count).
    pub fn chunk_run(&self, addr: u64, size: u64) -> Option<(u64, u64)> {
        let span = self.chunk_span(addr, size);
        let first = self.chunks.get(span.clone().next()?).addr;
        Some((first, u64::from(span.end - span.start)))
    }

    /// For a peer: the descriptors of the chunks from the `first`-th on under live block `addr` of
    /// life `buffer_id` (Note [Buffer ids]) exported under registry entry `entry`, into `out`;
    /// how many (fewer at the block's end). None when no such block is live or a chunk has no
    /// descriptor.
    pub fn exported_fds(&self, addr: u64, buffer_id: u64, entry: u32, first: u64, out: &mut [i32]) -> Option<usize> {
        let b = self.blocks.get(self.live.get(addr).filter(|_| self.expandable())?);
        if b.buffer_id != buffer_id || !b.exported || b.ipc_entry != entry || entry == NONE {
            return None;
        }
        let span = self.chunk_span(b.addr, b.size);
        let mut n = 0;
        for (k, slot) in span.skip(usize::try_from(first).ok()?).zip(out.iter_mut()) {
            let fd = self.chunks.get(k).fd;
            if fd < 0 {
                return None;
            }
            *slot = fd;
            n += 1;
        }
        Some(n)
    }

    /// Dead block `i` (a freed exported one) whose chunks hold no exported memory any more:
    /// free again, merged with free neighbours. Returns the block that holds its room now.
    pub(super) fn revive_if_unshared(&mut self, i: u32) -> u32 {
        let b = *self.blocks.get(i);
        if !b.dead || !self.expandable() || self.chunk_span(b.addr, b.size).any(|k| self.chunks.get(k).fd >= 0) {
            return i;
        }
        {
            let r = self.blocks.get_mut(i);
            r.dead = false;
            r.allocated = false;
            r.exported = false;
            r.ipc_entry = NONE;
            r.holder = 0;
            r.born_ns = 0;
            // No chunk under it holds memory a stream used for it: reusable by anyone.
            r.tag = SYNCED;
        }
        self.dead_blocks -= 1;
        self.dead_bytes -= b.size;
        let merged = self.merge_neighbours(i);
        self.link(merged);
        merged
    }

    /// The exported chunk at `va` went back (or lost its descriptor): the dead blocks over it
    /// whose chunks hold no exported memory any more are free again.
    pub(super) fn revive_dead_over(&mut self, va: u64) {
        if self.dead_blocks == 0 {
            return;
        }
        let Some(base) = self.range_containing(va).map(|r| r.base) else { return };
        let Some(mut i) = self.segments.get(base) else { return };
        let end = va.saturating_add(self.chunk_bytes);
        while i != NONE {
            let b = *self.blocks.get(i);
            if b.addr >= end {
                break;
            }
            if b.dead && b.addr + b.size > va {
                i = self.revive_if_unshared(i);
            }
            i = self.blocks.get(i).seg_next;
        }
    }

    /// Dead blocks and their bytes (Note [IPC]).
    pub fn dead(&self) -> (u64, u64) {
        (self.dead_blocks, self.dead_bytes)
    }
}
