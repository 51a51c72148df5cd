//! A block back: into its thread's slot (slots.rs), or reset, renewed or unlocked as its marks
//! ask (Note [Plain memory] in mod.rs), offered to the cache, and what leaves the cache (evicted,
//! refused, a cut tail) unmapped now or put on the list the background thread unmaps (Note
//! [Deferred unmaps] in host/cache/release.rs).

use super::{holder_tag, single, HostLayer};
use crate::backing::PageMemory;
use crate::host::cache::{BlockCache, Inserted, Live, PageFacts};
use crate::host::tally::CallTimer;
use crate::ranges::{Range, RangeList};
use crate::record::stats::PhaseTimer;
use crate::host::registry::{Marks, Record};
use crate::record::{self, Block, HostBook};
use super::transit::InTransit;
use crate::sys::lock::Guard;
use core::sync::atomic::Ordering::Relaxed;

impl<M: PageMemory> HostLayer<M> {
    /// Takes back a live block (`owner` said `Live { len }`): into its thread's slot when it
    /// can go there (Note [A thread's own slot]), else towards the cache.
    pub fn free(&self, addr: usize, len: usize) {
        let now = (self.clock)();
        // One walk of the tables: the record read here is the one the slot's move checks.
        let registered = self.registry.record(addr);
        let (birth, asked, marks) = registered.as_ref().map_or(Default::default(), Record::live);
        let block = Block::host(addr as u64, len as u64, asked, birth.holder);
        if marks.huge() {
            self.note_adviser(holder_tag(birth.holder));
        }
        if registered.is_some_and(|r| self.free_into_slot(block, &r, now)) {
            return;
        }
        let mut timer = CallTimer::begin(self.stats.frees.get(), self.precise);
        record::free(block);
        self.take_back(block, marks, now, Freed::ByProgram, &mut timer);
        timer.finish(self.precise, &[&self.stats.phases.free]);
    }

    /// A block the program freed at `now` (its record made, `freed` says where) with `marks`:
    /// reset, renewed or unlocked as they ask, then cached, or unmapped when it cannot be reused.
    pub(super) fn take_back(&self, block: Block, marks: Marks, now: u64, freed: Freed, timer: &mut CallTimer) {
        let (addr, len, holder) = (block.addr as usize, block.bytes as usize, block.holder);
        // Note [Pages the program changed]: most blocks need no system call here.
        let reset = marks.changed() || self.reset_always.load(Relaxed);
        if reset || marks.no_huge() {
            timer.exact(self.precise);
        }
        let facts = PageFacts { votes: marks.votes(), advised_by: if marks.huge() { holder_tag(holder) } else { 0 }, ..PageFacts::DIRTY };
        // Off (tm_set_enabled(0), mallopt's M_MMAP_MAX 0 or M_PERTURB): no request takes a cached
        // block, so a block freed now goes back at once, as glibc unmaps its mmapped chunks.
        let off = !self.enabled.load(Relaxed);
        let kept = if marks.replaced() || off {
            None
        } else if marks.no_huge() {
            // Note [Huge-page advice]: fresh pages are the only way back to no advice.
            self.memory.renew(addr, len).then(|| {
                self.stats.resets.add(1); // a renewal is a reset (stats.rs counts them together)
                PageFacts::FRESH
            })
        } else if !reset || self.memory.reset_for_cache(addr, len, marks.keyed()) {
            if reset {
                self.stats.resets.add(1);
            }
            Some(facts)
        } else {
            None
        };
        if let Some(facts) = kept {
            // Note [Locked memory]: what the cache holds is never locked.
            if self.memory.future_locking().is_some() {
                timer.exact(self.precise);
                self.memory.unlock(addr, len);
            }
            self.cache_block(addr, len, facts, now, Some((block, freed)), timer);
        } else {
            // Never reused: part of it is gone or it is sealed, or the cache is off. Whatever is
            // still ours goes.
            timer.exact(self.precise);
            {
                let mut cache = self.cache();
                cache.tally.frees += 1;
                cache.tally.left(len);
                freed.book(&mut cache.book, block, now);
                cache.tally.publish(&self.stats);
            }
            self.registry.clear(addr);
            self.unmap_all(&single(Range { addr, len }));
            if !off {
                self.stats.unresettable.add(1);
            }
        }
    }

    /// Offers a block that is ours and in no record (a freed one, or a part that could not be
    /// gathered) to the cache at time `now_ns`; unmaps what leaves it. `freed`: the program
    /// freed it, this live block (it leaves; the bounds follow what was live before).
    pub(super) fn cache_block(&self, addr: usize, len: usize, facts: PageFacts, now_ns: u64, freed: Option<(Block, Freed)>, timer: &mut CallTimer) {
        let (accepted, due_ns) = {
            let mut cache = self.cache();
            // Live before this free: the bounds follow its peak, reached just before some free.
            let live = if freed.is_some() { Live { bytes: cache.tally.live_bytes as usize, blocks: cache.tally.live_blocks as usize } } else { Live::default() };
            if let Some((block, how)) = freed {
                cache.tally.frees += 1;
                cache.tally.left(len);
                how.book(&mut cache.book, block, now_ns);
            }
            let due_ns = now_ns.saturating_add(cache.limits().release_after_ns.min(cache.limits().expire_after_ns));
            // Note [Hot within the memory]: past the hot bound the background pass comes once
            // the grace has passed.
            let due_ns = if cache.hot_bytes() + len > cache.limits().max_hot_bytes { due_ns.min(now_ns.saturating_add(crate::host::cache::HOT_GRACE_NS)) } else { due_ns };
            // Note [Fork at the fork]: a block freed by a fork handler is kept from the child.
            let forking = self.forking.load(Relaxed);
            let facts = if forking && self.memory.keep_from_fork(addr, len) { PageFacts { kept_all: true, kept_any: true, ..facts } } else { facts };
            let inserted = cache.insert(addr, len, facts, now_ns, live);
            // The merged block's records: its parts' go, then its own (the leaves exist: its
            // start and last page were the starts and last pages of blocks recorded before). A
            // block cached where it starts keeps its entry, rewritten: clearing it would unmark
            // and remark every 2 MiB granule it spans (256 atomics for 256 MiB).
            if !(inserted.accepted && inserted.block.addr == addr) {
                self.registry.clear(addr);
            }
            for &neighbour in inserted.absorbed.iter().flatten() {
                self.registry.clear(neighbour);
            }
            if inserted.accepted {
                let _ = self.registry.set_cached(inserted.block.addr, inserted.block.len);
            }
            for r in cache.evicted(&inserted) {
                self.registry.clear(r.addr);
            }
            self.stats.cached.set(cache.cached_bytes() as u64);
            cache.tally.publish(&self.stats);
            // Most frees leave nothing to unmap: no list is built for them (nor room for one
            // on this call's stack).
            if inserted.evicted > 0 {
                timer.exact(self.precise);
                // 4 KiB of stack for the list (Note [A stack of our own] in sys/stack.rs).
                crate::sys::stack::on_own_stack_quiet(|| self.unmap_leaving(cache, &inserted));
            } else if !inserted.accepted {
                // The block alone, refused (under a mapping limit, every free): no list.
                timer.exact(self.precise);
                self.unmap_refused(cache, inserted.block);
            }
            (inserted.accepted, due_ns)
        };
        if accepted {
            (self.background.on_cached)(due_ns);
        }
    }

    /// What an insert evicted or refused leaves the cache: deferred or unmapped, the lock let
    /// go first.
    #[cold]
    #[inline(never)]
    fn unmap_leaving(&self, mut cache: Guard<'_, BlockCache>, inserted: &Inserted) {
        let mut leaving = RangeList::new();
        for r in cache.evicted(inserted) {
            leaving.push(*r);
        }
        if !inserted.accepted {
            leaving.push(inserted.block);
        }
        let unmaps = self.defer_unmaps(&mut cache, &leaving);
        drop(cache);
        self.finish_unmaps(unmaps);
    }

    /// A freed block the cache refused, evicting nothing: deferred or unmapped as
    /// `unmap_leaving` would, without its list.
    #[cold]
    #[inline(never)]
    fn unmap_refused(&self, mut cache: Guard<'_, BlockCache>, r: Range) {
        let was_empty = cache.deferred_bytes() == 0;
        let running = (self.background.running)() && self.mapping_limit_bytes.load(Relaxed) == u64::MAX;
        let deferred = running && cache.defer_unmap(r);
        self.stats.deferred.set(cache.deferred_bytes() as u64);
        let transit = self.transit([r]);
        drop(cache);
        if !deferred {
            self.unmap_one(r, &self.stats.phases.free_unmap);
        }
        drop(transit);
        if deferred && was_empty {
            (self.background.wake)();
        }
    }

    pub(super) fn unmap_all(&self, ranges: &RangeList) {
        self.unmap_timed(ranges, &self.stats.phases.free_unmap);
    }

    pub(super) fn unmap_timed(&self, ranges: &RangeList, phase: &PhaseTimer) {
        for r in ranges.iter() {
            self.unmap_one(*r, phase);
        }
    }

    fn unmap_one(&self, r: Range, phase: &PhaseTimer) {
        self.timed(phase, || self.memory.unmap(r.addr, r.len));
        self.stats.unmapped_blocks.add(1);
        self.stats.unmapped_bytes.add(r.len as u64);
    }

    /// Under the cache lock: `ranges`, leaving the records for the kernel, are in transit until
    /// the result drops (Note [Ranges in transit]).
    pub(super) fn transit(&self, ranges: impl IntoIterator<Item = Range>) -> InTransit<'_> {
        self.transit.enter(ranges)
    }

    /// Under the cache lock: puts ranges leaving us on the deferred list (Note [Deferred
    /// unmaps]); returns those the caller must unmap itself, and whether to wake the thread.
    pub(super) fn defer_unmaps(&self, cache: &mut BlockCache, ranges: &RangeList) -> (RangeList, bool, InTransit<'_>) {
        let mut inline = RangeList::new();
        let was_empty = cache.deferred_bytes() == 0;
        // Under a mapping limit the room is needed now, not when the thread wakes.
        let running = (self.background.running)() && self.mapping_limit_bytes.load(Relaxed) == u64::MAX;
        for r in ranges.iter() {
            if !(running && cache.defer_unmap(*r)) {
                inline.push(*r);
            }
        }
        self.stats.deferred.set(cache.deferred_bytes() as u64);
        let transit = self.transit(inline.iter().copied());
        (inline, was_empty && cache.deferred_bytes() > 0, transit)
    }

    /// After the lock: unmaps what could not wait and wakes the thread for the rest.
    pub(super) fn finish_unmaps(&self, (inline, wake, transit): (RangeList, bool, InTransit<'_>)) {
        self.unmap_all(&inline);
        drop(transit);
        if wake {
            (self.background.wake)();
        }
    }
}

/// Where a block the program freed comes from on its way to the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Freed {
    /// Its free, now.
    ByProgram,
    /// Its thread's slot, where its free put it and recorded its event (Note [A thread's own
    /// slot]).
    FromSlot,
}

impl Freed {
    /// The book's record of the free, under the cache lock.
    fn book(self, book: &mut HostBook, block: Block, now_ns: u64) {
        match self {
            Freed::ByProgram => book.free(block, now_ns),
            Freed::FromSlot => book.left_slot(block),
        }
    }
}
