//! A miss served by the pages of several cached blocks, moved into one fresh mapping (Note
//! [Gathering pages] in host/cache/gather.rs): a part the kernel will not move whole is halved,
//! and what will not move goes back to the cache.

use super::{holder_tag, HostLayer, HUGE_PAGE};
use crate::backing::{Moved, PageMemory};
use crate::host::cache::{Part, Parts};
use crate::host::registry::{Birth, Marks};
use crate::host::tally::CallTimer;
use crate::ranges::{Range, RangeList};

impl<M: PageMemory> HostLayer<M> {
    /// A miss that cached blocks can still serve together: their pages move into a fresh
    /// mapping of the needed size, so only what they do not cover faults in (Note [Gathering
    /// pages]). Returns the block, its moved parts zeroed for a calloc of `zero_for` bytes.
    pub(super) fn gather_cached(&self, need: usize, align: usize, birth: Birth, zero_for: Option<usize>) -> Option<usize> {
        if need < GATHER_MIN {
            return None;
        }
        // In transit until they moved or came back: a claim of their range waits (Note [Ranges
        // the program claims]).
        let (parts, _transit) = {
            let mut cache = self.cache();
            let parts = cache.take_parts(need, holder_tag(birth.holder));
            for part in parts.iter() {
                self.registry.clear(part.addr);
            }
            if let Some(rest) = parts.rest_kept {
                let _ = self.registry.set_cached(rest.addr, rest.len);
            }
            self.stats.cached.set(cache.cached_bytes() as u64);
            let transit = self.transit(parts.iter().map(|p| Range { addr: p.addr, len: p.len }));
            (parts, transit)
        };
        if parts.is_empty() {
            return None;
        }
        // Its lists of ranges take 6 KiB of stack, which a thread may not have (Note [A stack of
        // our own] in sys/stack.rs).
        crate::sys::stack::on_own_stack_quiet(|| self.gathered(&parts, need, align, birth, zero_for))
    }

    /// `gather_cached` once there are parts.
    #[inline(never)]
    fn gathered(&self, parts: &Parts, need: usize, align: usize, birth: Birth, zero_for: Option<usize>) -> Option<usize> {
        let (addr, dirty) = self.timed(&self.stats.phases.alloc_grow, || self.move_into_new_mapping(parts, need, align, birth))?;
        if let Some(size) = zero_for {
            // Only the moved parts may hold data; the rest of the mapping is fresh.
            for part in dirty.iter() {
                self.zero_reused(part.addr, (addr + size).saturating_sub(part.addr).min(part.len), part.len, 0);
            }
        }
        Some(addr)
    }

    /// The second half of `gather_cached`, outside the lock: a new mapping, the parts moved in.
    fn move_into_new_mapping(&self, parts: &Parts, need: usize, align: usize, birth: Birth) -> Option<(usize, RangeList)> {
        let Some(dest) = self.map_recordable(need, align) else {
            for part in parts.iter() {
                self.cache_block(part.addr, part.len, part.facts, (self.clock)(), None, &mut CallTimer::untimed());
            }
            return None;
        };
        // What moved and may hold data, at its new address, in address order.
        let mut dirty = RangeList::new();
        let mut offset = 0;
        let mut lost = None;
        for part in parts.iter() {
            if lost.is_some() {
                self.cache_block(part.addr, part.len, part.facts, (self.clock)(), None, &mut CallTimer::untimed());
            } else {
                let to = dest + offset;
                lost = self.move_part(*part, to, &mut dirty);
            }
            offset += part.len;
        }
        if let Some(gone) = lost {
            // The rest of the destination is ours and goes; the lost range is never touched.
            let (end, gone_end) = (dest + need, gone.addr + gone.len);
            let mut ours = RangeList::new();
            for r in [Range { addr: dest, len: gone.addr - dest }, Range { addr: gone_end, len: end - gone_end }] {
                if r.len > 0 {
                    ours.push(r);
                }
            }
            self.unmap_all(&ours);
            return None;
        }
        // The moved pages may come kept from children (Note [Fork at the fork]), and advised by
        // the asker's own library (Note [Huge-page advice]); under mlockall(MCL_FUTURE) they
        // came unlocked (Note [Locked memory]).
        let kept = parts.iter().any(|p| p.facts.kept_any);
        let advised = parts.iter().any(|p| p.facts.advised_by != 0);
        let locked = self.memory.future_locking().is_none_or(|on_fault| self.memory.lock(dest, need, on_fault));
        if (kept && !self.memory.readmit(dest, need)) || !locked {
            self.memory.unmap(dest, need);
            return None;
        }
        // Cannot fail: the spare leaf was reserved.
        if !self.registry.set_live(dest, need, birth) {
            self.memory.unmap(dest, need);
            return None;
        }
        if advised {
            self.registry.keep_marks(dest, Marks::default().with_huge());
        }
        self.stats.grows.add(1);
        Some((dest, dirty))
    }

    /// Moves a cached part's pages to `to`, noting in `dirty` what may hold data. The kernel
    /// may refuse a range spanning two mappings; such a part is halved (on huge-page boundaries)
    /// until the halves move, and what will not move goes back to the cache, its share of the
    /// destination staying fresh (Note [Gathering pages]). Returns a destination range lost to
    /// a refusal (`Moved::DestinationLost`); what was not moved then is cached again.
    fn move_part(&self, part: Part, to: usize, dirty: &mut RangeList) -> Option<Range> {
        match self.memory.move_pages(part.addr, part.len, to) {
            Moved::Done => {
                if !part.facts.zero {
                    dirty.push_covering(Range { addr: to, len: part.len });
                }
                None
            }
            Moved::DestinationLost => {
                self.cache_block(part.addr, part.len, part.facts, (self.clock)(), None, &mut CallTimer::untimed());
                Some(Range { addr: to, len: part.len })
            }
            Moved::Refused => {
                let half = (part.len / 2) & !(HUGE_PAGE - 1);
                let second = Part { addr: part.addr + half, len: part.len - half, ..part };
                if half == 0 {
                    self.cache_block(part.addr, part.len, part.facts, (self.clock)(), None, &mut CallTimer::untimed());
                    return None;
                }
                if let Some(gone) = self.move_part(Part { len: half, ..part }, to, dirty) {
                    self.cache_block(second.addr, second.len, second.facts, (self.clock)(), None, &mut CallTimer::untimed());
                    return Some(gone);
                }
                self.move_part(second, to + half, dirty)
            }
        }
    }
}

/// The smallest request gathered (Note [Gathering pages]): below, a fresh mapping.
const GATHER_MIN: usize = 1 << 20;
