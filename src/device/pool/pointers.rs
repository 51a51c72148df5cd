//! What the pool knows of an address: whether it is a live block's start, which block of a
//! segment holds it, whether it may lie in our memory at all; and the mark an IPC export leaves
//! on a block (Note [IPC]). Bookkeeping only, under the pool's lock; never calls CUDA.

use super::*;

// Note [IPC]
// An IPC handle names a whole runtime allocation, our segment: the peer maps all of it from its
// base. So a handle is handed out only for a block that is a whole segment (binned blocks always
// are; split blocks when they were not split), and that segment never returns to the cache: its
// free gives it back to the runtime, so no later block can be read through an old handle.
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
                let buffer_id = if b.allocated { b.buffer_id } else { 0 };
                return Some(BlockView { addr: b.addr, size: b.size, allocated: b.allocated, whole_segment, buffer_id });
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

    /// Marks the live block starting at `addr`, a whole segment, as named by an IPC handle
    /// (Note [IPC]); false when it is not such a block.
    pub fn mark_exported(&mut self, addr: u64) -> bool {
        let Some(i) = self.live.get(addr) else { return false };
        let b = self.blocks.get_mut(i);
        if b.seg_prev != NONE || b.seg_next != NONE {
            return false;
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
}
