//! A freed block into its thread's slot, and back out: to the same thread's next request of its
//! length, or to the cache for whoever must see every idle block (Note [A thread's own slot] in
//! host/thread_slots.rs).

use super::{holder_tag, HostLayer};
use crate::backing::PageMemory;
use crate::host::registry::{Birth, Marks, Record};
use crate::host::tally::CallTimer;
use crate::host::thread_slots::{self, SlotBlock};
use crate::record::{self, Block};
use super::free::Freed;
use core::sync::atomic::Ordering::Relaxed;

impl<M: PageMemory> HostLayer<M> {
    /// free's first step: `block`, freed at `now` (`registered`: its registry record as free
    /// read it), goes to its thread's slot if it can, and what the slot held goes to the cache.
    /// False: the caller takes it back as before.
    pub(super) fn free_into_slot(&self, block: Block, registered: &Record, now: u64) -> bool {
        let (addr, len) = (block.addr as usize, block.bytes as usize);
        // Each at most a SLOTS-th of the cache's ceiling (a quarter of memory): all of them
        // together hold no more than the cache may, for a second at most.
        let most = self.memory_ceiling_bytes.load(Relaxed) / thread_slots::SLOTS as u64;
        if !self.slots_open() || !thread_slots::fits(addr, len) || len as u64 > most {
            return false;
        }
        let Some(i) = self.slots.own_slot() else { return false };
        // Its marks decide: a block the program changed is reset or unmapped by the cache's path.
        if !registered.move_to_slot(len) {
            return false;
        }
        record::freed_to_slot(block, now);
        if let Some(before) = self.slots.put(i, SlotBlock { addr, len, freed_ns: now }) {
            self.free_from_slot(before);
        }
        // The background pass comes when the block is due, as it would for a cached one.
        (self.background.on_cached)(now.saturating_add(self.slot_due_after_ns.load(Relaxed)));
        true
    }

    /// alloc's first step: the calling thread's block, if its slot holds one of `size`'s length
    /// on `align`, handed out to `holder` (zeroed for calloc when `zeroed`). A block of another
    /// length goes to the cache first, where the request may find it.
    pub(super) fn alloc_from_slot(&self, size: usize, align: usize, zeroed: bool, holder: u64) -> Option<usize> {
        let i = self.slots.slot_given()?;
        let seen = self.slots.peek_freed(i)?;
        let (addr, len) = (seen.addr, seen.len);
        let fits = self.block_shape(size).is_some_and(|(need, _)| need == len) && addr & (align - 1) == 0;
        if !fits || !self.slots_open() {
            self.own_block_to_cache(i);
            return None;
        }
        let Some(registered) = self.registry.record(addr) else {
            self.own_block_to_cache(i);
            return None;
        };
        let (was, was_asked, marks) = registered.live();
        // Note [Huge-page advice]: advised pages go back only to code of the library that advised
        // them, and code that advises its own is served first from those, which the cache may
        // hold (as the cache's block freed last: Note [The block freed last]).
        let asker = holder_tag(holder);
        let theirs = if marks.huge() { holder_tag(was.holder) != asker } else { self.may_advise(asker) && self.stats.cached.current() > 0 };
        if theirs {
            self.own_block_to_cache(i);
            return None;
        }
        let Some(taken) = self.slots.take_seen(i, seen) else {
            return None; // the background pass took it meanwhile
        };
        // No clock read: the block is stamped with its free's time, at most a slot's longest
        // wait early (Note [A thread's own slot]).
        let now = taken.freed_ns;
        if !registered.take_from_slot(len, Birth { ns: now, holder }, size as u64) {
            // The program changed its pages while it was freed: the cache's path resets them.
            self.free_from_slot(taken);
            return None;
        }
        self.slots.count_reuse(i, len);
        let (old, new) = (Block::host(addr as u64, len as u64, was_asked, was.holder), Block::host(addr as u64, len as u64, size as u64, holder));
        if old != new {
            self.cache().book.changed_hands(old, new);
        }
        record::taken_from_slot(new, now);
        if zeroed {
            let votes = self.zero_reused(addr, size, len, marks.votes());
            if votes != marks.votes() {
                self.registry.keep_marks(addr, Marks::default().with_votes(votes));
            }
        }
        Some(addr)
    }

    /// The block in the calling thread's slot `i`, not for this request, goes to the cache.
    fn own_block_to_cache(&self, i: usize) {
        if let Some(b) = self.slots.take(i) {
            self.free_from_slot(b);
        }
    }

    /// Notes that code of the library tagged `tag` advises huge pages on its blocks.
    pub(super) fn note_adviser(&self, tag: u32) {
        let bit = 1u64 << (tag % 64);
        if self.advisers.load(Relaxed) & bit == 0 {
            self.advisers.fetch_or(bit, Relaxed);
        }
    }

    /// Whether code of the library tagged `tag` may have advised blocks of its own (tags 64
    /// apart share a bit: a "maybe" sends a block to the cache, which knows).
    fn may_advise(&self, tag: u32) -> bool {
        self.advisers.load(Relaxed) & 1u64 << (tag % 64) != 0
    }

    /// Whether freed blocks may go to slots now: the cache is on, nothing asks every free to
    /// reach it (a reset of every block, a fork under way, mlockall's future locking), and
    /// its bounds count what it holds loosely enough (Note [A thread's own slot]).
    fn slots_open(&self) -> bool {
        self.slots_allowed.load(Relaxed)
            && self.enabled.load(Relaxed)
            && !self.reset_always.load(Relaxed)
            && !self.forking.load(Relaxed)
            && self.memory.future_locking().is_none()
    }

    /// A block out of its slot goes on to the cache, freed when the program freed it.
    fn free_from_slot(&self, b: SlotBlock) {
        let (birth, asked, marks) = self.registry.out_of_slot(b.addr);
        let block = Block::host(b.addr as u64, b.len as u64, asked, birth.holder);
        self.take_back(block, marks, b.freed_ns, Freed::FromSlot, &mut CallTimer::untimed());
    }

    /// Every slot's block goes to the cache: for whoever must see every idle block.
    pub fn empty_slots(&self) {
        self.empty_slots_where(|_| true);
    }

    /// The blocks in slots freed `slot_due_after_ns` ago or more go to the cache, where the
    /// background pass releases them as cached ones (a block its thread takes back and frees
    /// again meanwhile stays: a pass taking it from a loop made that loop's next request map
    /// anew while the block was on its way to the cache). Returns when the next one is due.
    pub(super) fn empty_idle_slots(&self, now: u64) -> Option<u64> {
        let after = self.slot_due_after_ns.load(Relaxed);
        let mut next: Option<u64> = None;
        self.empty_slots_where(|b| {
            let due = b.freed_ns.saturating_add(after);
            if due > now {
                next = Some(next.map_or(due, |n| n.min(due)));
            }
            due <= now
        });
        next
    }

    /// The blocks in slots that meet [addr, end) go to the cache (a range the program claims).
    pub(super) fn empty_slots_meeting(&self, addr: usize, end: usize) {
        self.empty_slots_where(|b| b.addr < end && addr < b.addr + b.len);
    }

    /// Each slot's block that `leaves` picks goes to the cache, with the time the slot says it
    /// was freed (that of a later free of it, if its thread took it back and freed it again
    /// meanwhile: never an earlier one).
    fn empty_slots_where(&self, mut leaves: impl FnMut(&SlotBlock) -> bool) {
        if !self.slots.any() {
            return;
        }
        for i in 0..thread_slots::SLOTS {
            let Some(b) = self.slots.peek_freed(i) else { continue };
            if !leaves(&b) {
                continue;
            }
            if let Some(b) = self.slots.take_seen(i, b) {
                self.free_from_slot(b);
            }
        }
    }

    /// Brings the figures up to date for a reader (the stats, the reports): every slot's block
    /// goes to the cache, and the blocks handed out again from slots are counted (each a
    /// request, a hit and a free).
    pub fn settle_slots(&self) {
        self.empty_slots();
        let mut cache = self.cache();
        let (reuses, bytes) = self.slots.reuses_to_count();
        cache.tally.count_reuses(reuses, bytes);
        cache.tally.publish(&self.stats);
    }

    /// Sets whether the cache's bounds let freed blocks wait in slots, and when a block in a
    /// slot is first due (Note [A thread's own slot]); closing them empties them.
    pub(super) fn set_slots(&self, allowed: bool, due_after_ns: u64) {
        self.slot_due_after_ns.store(due_after_ns, Relaxed);
        self.slots_allowed.store(allowed, Relaxed);
        if !allowed {
            self.empty_slots();
        }
    }
}
