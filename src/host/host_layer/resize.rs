//! realloc of a live large block: in place (the tail it no longer needs cached or unmapped), by
//! mremap onto its alignment, or copied into a new block as a last resort (and always when the
//! program changed its pages); a kept block is recorded as one resize.
//
// Note [Growing under a limit]
// A block that cannot grow in place moves by mremap into a fresh mapping on its alignment
// (`grow_into`): its pages move, nothing is copied. That fresh mapping needs address space for
// the old length and the new at once, where glibc's mremap(MREMAP_MAYMOVE) needs only the new:
// under `ulimit -v 1G`, 400 MiB grown to 800 MiB failed under us and worked under glibc. When
// the fresh mapping is refused, the block grows by MREMAP_MAYMOVE (`grow_anywhere`), which
// needs the new length and the alignment's slack; off the alignment, its contents are copied up
// to it (a copy, in this case only). Only then does the copying last resort (new block, copy,
// free) run, which needs both again.
//
// Note [Growing over the cache]
// A block served from the head of a cached one has the rest cached right after it, still
// mapped: a realloc that grew it could neither extend it in place (mremap found the rest's pages
// in the way) nor reuse the rest, and moved into a fresh mapping, leaving the rest behind. A
// loop of malloc, realloc to twice the size, free left one such rest per turn: RSS climbed to the
// cache's bound (1 GiB, with a fault per page: 515,146 faults for 2,000 turns of 1 to 2 MiB where
// glibc took 1,106). So a growth first takes what it needs of a cached block that starts where
// the live one ends, with the same huge-page advice: no system call, its pages already there.
//
// Note [Growing a changed block]
// A growth onto pages the block was not asked for keeps nothing the program changed: glibc's
// mremap is refused by the mapping a change split, and it copies into a plain block. One that
// fits the block's rounding (64 KiB, 2 MiB from 4 MiB up) was kept in place with its changes: a
// page the program had protected inside it faulted when the program wrote the grown block, and
// pages kept from children were missing in a child forked after. It copies as glibc's does;
// without room for the copy (an address-space limit) it stays in place, as glibc's mremap keeps a
// block the change covered whole.

use super::{holder_tag, single, HostLayer, PAGE};
use crate::backing::PageMemory;
use crate::host::cache::PageFacts;
use crate::host::registry::{Birth, Marks};
use crate::host::tally::CallTimer;
use crate::ranges::Range;
use crate::record::{self, Block};

impl<M: PageMemory> HostLayer<M> {
    /// Resizes a live large block to `new_size` (at or above the threshold): in place when it
    /// fits, by mremap otherwise (no copy), by copying as a last resort. `None` leaves the
    /// block as it was. On a stack of ours: the ranges it may unmap take 4 KiB of the caller's
    /// (Note [A stack of our own] in sys/stack.rs).
    #[inline(never)]
    pub fn resize(&self, addr: usize, len: usize, new_size: usize) -> Option<usize> {
        let start = (self.precise)();
        let out = crate::sys::stack::on_own_stack_quiet(|| self.resize_untimed(addr, len, new_size));
        self.stats.phases.realloc.record((self.precise)().saturating_sub(start));
        out
    }

    fn resize_untimed(&self, addr: usize, len: usize, new_size: usize) -> Option<usize> {
        let (need, granule) = self.block_shape(new_size)?;
        let (born, was_asked, marks) = self.registry.live_record(addr);
        // Note [Growing a changed block].
        let onto_new_pages = new_size.div_ceil(PAGE) > (was_asked as usize).div_ceil(PAGE);
        if need <= len && marks.changed() && onto_new_pages {
            if let Some(fresh) = self.copied(addr, len, new_size, born.holder) {
                return Some(fresh);
            }
        }
        if need <= len {
            let spare = len - need;
            // Kept whole when the spare is too small to give back.
            let cut = spare > len / 100 * self.cache().waste_percent();
            if cut {
                let _ = self.registry.set_live(addr, need, born);
                self.registry.keep_marks(addr, marks);
                let tail = Range { addr: addr + need, len: spare };
                if !marks.changed() && !marks.replaced() && !marks.no_huge() && self.is_enabled() {
                    // Plain pages, written before: cached like a freed block (a page heap keeps
                    // what a realloc cut off; unmapped, its pages faulted in again at the next
                    // request that reached them). Note [Locked memory]: never cached locked.
                    if self.memory.future_locking().is_some() {
                        self.memory.unlock(tail.addr, tail.len);
                    }
                    let facts = PageFacts { advised_by: if marks.huge() { holder_tag(born.holder) } else { 0 }, ..PageFacts::DIRTY };
                    self.cache_block(tail.addr, tail.len, facts, (self.clock)(), None, &mut CallTimer::untimed());
                } else {
                    // Note [Plain memory]: pages the program changed are not cached unreset;
                    // nor is anything while the cache is off.
                    let unmaps = self.defer_unmaps(&mut self.cache(), &single(tail));
                    self.finish_unmaps(unmaps);
                }
            }
            self.record_resize((addr, len, was_asked), (addr, if cut { need } else { len }), new_size, born);
            return Some(addr);
        }
        // Pages the program changed (protected, locked, kept from children, mapped over) would
        // carry on into the grown block, where glibc's mremap, refused by the mapping the change
        // split, copies into a plain one: so do we (the free resets or unmaps the old block).
        // Without room for the copy (an address-space limit) the block grows by mremap, as
        // glibc's does when the change covered it whole.
        let changed = marks.changed();
        if changed {
            if let Some(fresh) = self.copied(addr, len, new_size, born.holder) {
                return Some(fresh);
            }
        }
        if !changed && self.grow_over_cached(addr, len, need, born, marks) {
            self.record_resize((addr, len, was_asked), (addr, need), new_size, born);
            return Some(addr);
        }
        if self.registry.reserve_spare() {
            self.registry.clear(addr);
            // Not mremap's MAYMOVE first: it puts the block on any page, and moving the
            // contents up to the alignment is a copy (Note [Growing under a limit]).
            let moved = if self.memory.extend(addr, len, need) {
                Some(addr)
            } else {
                self.memory.grow_into(addr, len, need, granule).or_else(|| self.memory.grow_anywhere(addr, len, need, granule))
            };
            if let Some(moved) = moved {
                // Cannot fail: the spare leaf was reserved above.
                let _ = self.registry.set_live(moved, need, born);
                self.registry.keep_marks(moved, marks);
                self.stats.remaps.add(1);
                self.record_resize((addr, len, was_asked), (moved, need), new_size, born);
                return Some(moved);
            }
            let _ = self.registry.set_live(addr, len, born);
            self.registry.keep_marks(addr, marks);
        }
        // mremap refuses ranges that span several mappings (a program may have madvised part
        // of the block without our shims seeing it): copy instead.
        if changed {
            return None;
        }
        self.copied(addr, len, new_size, born.holder)
    }

    /// Grows the live block at `addr` from `len` to `need` bytes over the cached block that
    /// follows it (Note [Growing over the cache]); false leaves everything as it was, but for a
    /// cached part that could not be made fit (unmapped, as alloc's make_fit does).
    fn grow_over_cached(&self, addr: usize, len: usize, need: usize, born: Birth, marks: Marks) -> bool {
        if !self.registry.reserve_spare() {
            return false;
        }
        let advice = if marks.huge() { holder_tag(born.holder) } else { 0 };
        let taken = {
            let mut cache = self.cache();
            let Some(t) = cache.take_following(addr + len, need - len, advice) else { return false };
            self.registry.clear(t.addr);
            if let Some(rest) = t.tail_kept {
                let _ = self.registry.set_cached(rest.addr, rest.len);
            }
            self.stats.cached.set(cache.cached_bytes() as u64);
            t
        };
        if self.make_fit(taken.addr, taken.len, taken.facts).is_none() {
            return false;
        }
        // Cannot fail: the spare leaf was reserved above, and the taken part's leaves exist.
        let _ = self.registry.set_live(addr, need, born);
        self.registry.keep_marks(addr, marks);
        true
    }

    /// The block's contents copied into a new one of `new_size` bytes, and the block freed.
    fn copied(&self, addr: usize, len: usize, new_size: usize, holder: u64) -> Option<usize> {
        let fresh = self.alloc(new_size, PAGE, false, holder)?;
        // A growth within the old block's rounding asks for less than its mapped length.
        self.memory.copy(fresh, addr, len.min(new_size));
        self.free(addr, len);
        Some(fresh)
    }

    /// A resize that kept the block (in place or by mremap); the copying fallback records
    /// through alloc and free.
    /// `was_asked`: what the block was asked for before.
    fn record_resize(&self, (addr, len, was_asked): (usize, usize, u64), (moved, need): (usize, usize), asked: usize, birth: Birth) {
        let (old, new) = (Block::host(addr as u64, len as u64, was_asked, birth.holder), Block::host(moved as u64, need as u64, asked as u64, birth.holder));
        self.registry.set_asked(moved, asked as u64);
        {
            let mut cache = self.cache();
            cache.tally.resized(len, need);
            cache.book.resize(old, new, (self.clock)());
            cache.tally.publish(&self.stats);
        }
        record::resize(old, new);
    }
}
