//! The device pool's structural invariants, checked by the tests after every step: free lists
//! well formed and merged, bytes accounted, every free block's segment known, exported blocks
//! never cached, no live block at a segment's base with neighbours.

use super::*;

impl DevicePool {
    /// Checks the structure; tests call it after every step.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut free_bytes = 0;
        let mut pending = 0;
        for small in [false, true] {
            for bin in 0..BINS {
                let mut i = self.bin_head(small, bin);
                let mut prev = NONE;
                while i != NONE {
                    let b = self.blocks.get(i);
                    if b.allocated || bin_of(b.size) != bin || b.small != small || b.bin_prev != prev {
                        return Err(format!("bad free list entry {b:?} in bin {bin}"));
                    }
                    if b.seg_next != NONE && self.blocks.get(b.seg_next).addr != b.addr + b.size {
                        return Err(format!("segment neighbours not adjacent: {b:?}"));
                    }
                    if self.strategy == Strategy::Split && b.seg_next != NONE {
                        let n = self.blocks.get(b.seg_next);
                        if !n.allocated && n.tag == b.tag {
                            return Err(format!("unmerged free neighbours {b:?} {n:?}"));
                        }
                    }
                    free_bytes += b.size;
                    if b.tag == PENDING {
                        pending += b.size;
                    }
                    prev = i;
                    i = b.bin_next;
                }
            }
        }
        if free_bytes + self.stats.live_bytes + self.dead_bytes != self.stats.reserved_bytes {
            return Err(format!("free {free_bytes} + live {} + dead {} != reserved {}", self.stats.live_bytes, self.dead_bytes, self.stats.reserved_bytes));
        }
        if pending != self.pending_free_bytes {
            return Err("pending byte count is off".into());
        }
        // Every free block's segment is known by its head (a walk over the whole segment map
        // per step would make the property tests crawl).
        for small in [false, true] {
            for bin in 0..BINS {
                let mut i = self.bin_head(small, bin);
                while i != NONE {
                    let mut head = i;
                    while self.blocks.get(head).seg_prev != NONE {
                        head = self.blocks.get(head).seg_prev;
                    }
                    if head != i && self.blocks.get(head).allocated {
                        // Note [Frees that bypass us].
                        return Err(format!("live block {:?} at its segment's base has neighbours", self.blocks.get(head)));
                    }
                    if self.segments.get(self.blocks.get(head).addr) != Some(head) {
                        return Err(format!("segment of free block {:?} is not in the segment map", self.blocks.get(i)));
                    }
                    if self.blocks.get(i).exported {
                        return Err(format!("exported block {:?} is cached", self.blocks.get(i)));
                    }
                    i = self.blocks.get(i).bin_next;
                }
            }
        }
        Ok(())
    }
}
