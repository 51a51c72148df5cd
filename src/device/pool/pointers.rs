//! What the pool knows of an address: whether it is a live block's start, which block of a
//! segment holds it, whether it may lie in our memory at all; and the mark an IPC export leaves
//! on a block (Note [IPC]). Bookkeeping only, under the pool's lock; never calls CUDA.

use super::*;

// Note [IPC]
// A legacy IPC handle (cuIpcGetMemHandle) names a whole driver allocation, our segment: a peer
// that opens it maps the segment from its base. A block that is its whole segment (binned blocks
// always are; split blocks when they were not split) gets the driver's handle as it is, and any
// process can open it. A block that shares its segment gets a handle of our own instead (the
// layer's export and device/ipc): the driver's handle of the segment with the block's offset,
// published in a per-user registry that a peer under the preload reads to open the segment and
// land on the block; a peer without us gets the driver's error for bytes it does not know, never
// the segment's start. Either way a block named by a handle is marked `exported`, and its free
// does not return it to the cache: it is dead, out of every list, never merged nor handed out
// again, so a peer that still maps the segment never reads a later block through an old handle;
// its registry entry is withdrawn (a later open fails). When a segment holds no live block any
// more, only dead and free ones, the segment goes back to the driver whole, and a peer's mapping
// keeps its memory alive as the driver keeps any freed allocation a peer maps. The cost: an
// exported block's room, until its segment empties.
//
// Note [Buffer ids]
// The runtime gives every allocation an id (CU_POINTER_ATTRIBUTE_BUFFER_ID) that no other
// allocation ever has; libraries that cache registrations of memory (NCCL, UCX, MPI) key them by
// it, so a block handed out again must not keep the id of its last life, and two blocks of one
// segment must not share the segment's. Each allocation of a block takes the pool's next number;
// the layer makes it an id no other pool and no runtime allocation has.
//

/// A block that contains an address, for pointer queries and IPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockView {
    pub addr: u64,
    pub size: u64,
    pub allocated: bool,
    /// The block is its segment, whole: an IPC handle would name exactly it.
    pub whole_segment: bool,
    /// Note [Buffer ids]: new at every allocation of the block (0 while it is free).
    pub buffer_id: u64,
}

impl DevicePool {
    pub fn owns(&self, addr: u64) -> bool {
        self.looked_up();
        self.live.get(addr).is_some()
    }

    /// The block of segment `segment_base` that contains `addr`; `None` when that segment is
    /// not ours or `addr` lies outside it.
    pub fn block_at(&self, segment_base: u64, addr: u64) -> Option<BlockView> {
        let mut i = self.segments.get(segment_base)?;
        loop {
            let b = self.blocks.get(i);
            if addr < b.addr {
                return None;
            }
            if addr - b.addr < b.size {
                let whole_segment = b.seg_prev == NONE && b.seg_next == NONE;
                // A dead block (exported, then freed: Note [IPC of expandable segments]) keeps its
                // room from reuse, and is freed memory to whoever asks.
                let allocated = b.allocated && !b.dead;
                let buffer_id = if allocated { b.buffer_id } else { 0 };
                return Some(BlockView { addr: b.addr, size: b.size, allocated, whole_segment, buffer_id });
            }
            if b.seg_next == NONE {
                return None;
            }
            i = b.seg_next;
        }
    }

    /// Looks a live block up by its start.
    pub fn live_block(&self, addr: u64) -> Option<BlockView> {
        self.looked_up();
        let b = self.blocks.get(self.live.get(addr)?);
        Some(BlockView { addr: b.addr, size: b.size, allocated: true, whole_segment: b.seg_prev == NONE && b.seg_next == NONE, buffer_id: b.buffer_id })
    }

    /// Whether `addr` is the base of one of our segments.
    pub fn has_segment(&self, addr: u64) -> bool {
        self.segments.get(addr).is_some()
    }

    /// Whether `addr` may lie inside one of our segments (false: it certainly does not).
    pub fn may_contain(&self, addr: u64) -> bool {
        self.span.0 <= addr && addr < self.span.1
    }

    /// Marks live block `addr` of life `buffer_id` (Note [Buffer ids]) as named by an IPC handle
    /// (Note [IPC]), through registry entry `entry` (NONE: the driver's own handle, for a whole
    /// segment); false when no such block is live (freed meanwhile), or a handle of ours names it
    /// already.
    pub fn mark_exported(&mut self, addr: u64, buffer_id: u64, entry: u32) -> bool {
        let Some(i) = self.live.get(addr) else { return false };
        let b = self.blocks.get_mut(i);
        if b.buffer_id != buffer_id || (entry != NONE && b.ipc_entry != NONE) {
            return false;
        }
        if entry != NONE {
            b.ipc_entry = entry;
        }
        if !b.exported {
            b.exported = true;
            self.stats.ipc_exports += 1;
        }
        true
    }

    /// Counts a lookup of a block by its address (tests only).
    pub(super) fn looked_up(&self) {
        #[cfg(test)]
        self.lookups.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    }

    /// The segment holding block `addr` (a live block's start): its (base, length).
    pub fn segment_of(&self, addr: u64) -> Option<(u64, u64)> {
        let mut i = self.live.get(addr)?;
        while self.blocks.get(i).seg_prev != NONE {
            i = self.blocks.get(i).seg_prev;
        }
        let base = self.blocks.get(i).addr;
        let mut len = 0;
        while i != NONE {
            len += self.blocks.get(i).size;
            i = self.blocks.get(i).seg_next;
        }
        Some((base, len))
    }

    /// Calls `f` with the registry entry of every live block a handle of ours names.
    pub fn for_each_ipc_entry(&self, mut f: impl FnMut(u32)) {
        self.live.for_each(|_, i| {
            let b = self.blocks.get(i);
            if b.exported && b.ipc_entry != NONE {
                f(b.ipc_entry);
            }
        });
    }

    /// The registry entry of live block `addr`, if a handle of ours names it already.
    pub fn ipc_entry(&self, addr: u64) -> Option<u32> {
        let b = self.blocks.get(self.live.get(addr)?);
        (b.exported && b.ipc_entry != NONE).then_some(b.ipc_entry)
    }

    /// Note [IPC]: exported block `i`, just out of the live map, is dead now; its segment goes
    /// back whole when no live block is left in it. In an expandable segment (Note [IPC of
    /// expandable segments]) its chunks stop counting it, and go back by the usual paths.
    pub(super) fn retire_exported(&mut self, i: u32, now_ns: u64) -> Freed {
        let b = {
            let r = self.blocks.get_mut(i);
            r.dead = true;
            *r
        };
        self.stats.live_bytes -= b.size;
        self.dead_blocks += 1;
        self.dead_bytes += b.size;
        let ipc_entry = (b.ipc_entry != NONE).then_some(b.ipc_entry);
        if self.expandable() {
            let chunk_idle = self.untouch(b.addr, b.size, now_ns);
            self.revive_if_unshared(i);
            return Freed { size: b.size, holder: b.holder, release: None, segment_idle: chunk_idle, freed_ns: now_ns, ipc_entry };
        }
        let release = self.release_if_dead(i);
        Freed { size: b.size, holder: b.holder, release, segment_idle: false, freed_ns: now_ns, ipc_entry }
    }

    /// When the segment of block `i` holds no live block, only dead and free ones: takes it out
    /// of the pool whole, for the caller to give back; its (base, length).
    pub(super) fn release_if_dead(&mut self, i: u32) -> Option<(u64, u64)> {
        let mut head = i;
        while self.blocks.get(head).seg_prev != NONE {
            head = self.blocks.get(head).seg_prev;
        }
        let mut k = head;
        while k != NONE {
            let b = self.blocks.get(k);
            if b.allocated && !b.dead {
                return None;
            }
            k = b.seg_next;
        }
        let base = self.blocks.get(head).addr;
        let mut len = 0;
        let mut k = head;
        while k != NONE {
            let b = *self.blocks.get(k);
            if b.dead {
                self.dead_blocks -= 1;
                self.dead_bytes -= b.size;
            } else {
                self.unlink(k);
            }
            len += b.size;
            self.blocks.remove(k);
            k = b.seg_next;
        }
        self.segments.remove(base);
        self.stats.reserved_bytes -= len;
        self.stats.segments_released += 1;
        Some((base, len))
    }
}
