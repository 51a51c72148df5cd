//! The cache across fork(): held by the fork handlers and kept from the child (Note [Fork at the
//! fork]), forgotten in the child with no system call, also when another library's fork handler
//! allocates before ours has run (Note [Fork handlers that allocate]).
//
// Note [Fork at the fork]
// A forked child must inherit none of the cache: it could not know which of the parent's cached
// blocks are its own, and fork() would copy page tables for idle memory and make the parent's
// next write to each cached page a copy. The fork's prepare handler, holding the cache lock,
// advises MADV_DONTFORK every cached block not already kept from children and every range
// waiting to be unmapped; a block stays kept while it is cached (PageFacts::kept_all/kept_any),
// and is readmitted (MADV_DOFORK) only as it leaves the cache for the program. So a fork makes
// a system call only for the blocks cached since the last fork, and the handlers after it none:
// with blocks cached and threads churning, each madvise took the address-space lock behind the
// other threads' page faults, and readmitting every block at every fork doubled that (the parent
// spent 8-21 ms in fork(), against glibc's 0.8-4). The child forgets the parent's records with no
// system call. A block that enters the cache during the fork (another library's handler
// freeing, Note [Fork handlers that allocate]) is kept from the child as it comes in. Ranges
// between the cache and the kernel (taken out of the records, not yet unmapped: `Transit`) would
// reach the child unrecorded, so the prepare handler first waits for them, a bounded wait (a fork
// from a signal handler may interrupt its own thread's unmap). Gathering pages into a new mapping
// takes the lock again before it ends and is not waited for: a fork in its middle can leave the
// moved pages in the child unrecorded, leaked there as glibc leaves a block some thread of the
// parent held. Per malloc/free pair this costs nothing; per fork, one madvise per block cached
// since the last fork, and one per such block when it is next handed out. A block still kept
// from children is recorded live only once it is readmitted: a fork meanwhile leaves it out of
// the child, records and all, and never with a record of a block the child would not have. The
// prepare handler sleeps while it waits for ranges in transit (a spinning wait took the CPU of
// the very thread it waited for: 3-5 ms per fork with four threads churning on two cores).

use super::HostLayer;
use crate::backing::{PageMemory, Presence};
use crate::host::cache::BlockCache;
use crate::host::registry::PageChange;
use crate::record::{self, Block};
use core::sync::atomic::Ordering::Relaxed;

impl<M: PageMemory> HostLayer<M> {
    /// In a forked child: the cached blocks and the deferred unmaps were left out of it (Note
    /// [Fork at the fork]), so they are forgotten without a system call.
    pub fn forget_cache_in_child(&self) {
        let pid = self.memory.process_id();
        if self.forgotten_in.swap(pid, Relaxed) == pid {
            return; // another library's child handler, run before ours, asked first
        }
        self.forget_blocks_of_parent(&mut self.cache());
    }

    fn forget_blocks_of_parent(&self, cache: &mut BlockCache) {
        cache.forget_all(|r| self.registry.clear(r.addr));
        self.transit.clear(); // the threads that had ranges in transit are not here
        self.releasing.clear();
        self.advising.clear();
        self.stats.cached.set(0);
        cache.tally.restart();
        // The child counts from the fork: reuses from slots before it were the parent's.
        let _ = self.slots.reuses_to_count();
        self.forget_blocks_kept_from_children(cache);
        cache.tally.publish(&self.stats);
        self.stats.deferred.set(0);
    }

    /// In a forked child: a live block the program advised MADV_DONTFORK is not here (wholly or
    /// in part). Its record goes when its first page is missing (a free of it then fails as under
    /// glibc alone, and a mapping the child makes there is never taken for ours). A block missing
    /// in part is recorded as long as the run of its pages that came first (Note [A block the
    /// child has in part]).
    fn forget_blocks_kept_from_children(&self, cache: &mut BlockCache) {
        self.registry.for_each_kept_from_children(|addr, len| match self.memory.presence(addr, len) {
            Presence::All => {}
            Presence::Part { mapped } => self.keep_mapped_part(cache, addr, len, mapped),
            Presence::None => {
                let (birth, asked, _) = self.registry.live_record(addr);
                self.registry.clear(addr);
                cache.tally.left(len);
                let block = Block::host(addr as u64, len as u64, asked, birth.holder);
                cache.book.forgotten(block, (self.clock)());
                record::forgotten(block);
            }
        });
    }

    // Note [A block the child has in part]
    // A live block part of which the program advised MADV_DONTFORK reaches a forked child with
    // holes. Recorded at its whole length, its holes were ours: a mapping the child then made
    // in one (glibc's own chunk for a small request) read as the inside of our block, and its
    // free aborted ("invalid pointer ... inside the large block", the integrity hunter's
    // fuzzer, one run in 10-30); the block's own free would have unmapped that mapping too. So
    // the child keeps the block recorded as far as its first hole (its pages from the start,
    // found by msync, which only checks they are mapped) and never reuses it; the pages after
    // the hole are no longer ours (the child leaks them, as glibc's child would leak them if its
    // free did not unmap the hole's new owner with them).

    /// `keep_mapped_part`: the block at `addr` of `len` bytes is now the `mapped` bytes from its
    /// start, never reused; its figures follow, as a resize's.
    fn keep_mapped_part(&self, cache: &mut BlockCache, addr: usize, len: usize, mapped: usize) {
        let (birth, asked, marks) = self.registry.live_record(addr);
        if !self.registry.set_live(addr, mapped, birth) {
            // No table memory: the entry is as it was, never reused at least.
            self.registry.note_change(addr, len, PageChange::Replaced);
            return;
        }
        self.registry.keep_marks(addr, marks);
        self.registry.note_change(addr, mapped, PageChange::Replaced);
        let asked_now = asked.min(mapped as u64);
        self.registry.set_asked(addr, asked_now);
        let (old, new) = (Block::host(addr as u64, len as u64, asked, birth.holder), Block::host(addr as u64, mapped as u64, asked_now, birth.holder));
        cache.tally.resized(len, mapped);
        cache.book.resize(old, new, (self.clock)());
        record::resize(old, new);
    }

    // Note [Fork handlers that allocate]
    // Other libraries' fork handlers may allocate and free large blocks (threading runtimes,
    // RNGs and tracers register them), and they run between ours: prepare handlers registered
    // before ours run after it, parent and child handlers registered before ours run before it.
    // The forking thread holds the cache lock across the fork, so it gets the cache again at
    // once when such a handler asks (Lock::lock_contended); every other thread waits as before.
    // In the parent that is the cache as it was. In the child, before our child handler has run,
    // the cache still lists blocks the child did not inherit (Note [Plain memory]): the first
    // such call forgets them, as our child handler would, and our handler then forgets nothing
    // more (the blocks other handlers freed meanwhile are the child's own).

    #[cold]
    #[inline(never)]
    pub(super) fn entered_during_fork(&self, cache: &mut BlockCache) {
        let pid = self.memory.process_id();
        if pid != self.fork_pid.load(Relaxed) && self.forgotten_in.swap(pid, Relaxed) != pid {
            self.forget_blocks_of_parent(cache);
        }
    }

    /// Whether this thread holds the cache lock across a fork (in the fork's handlers).
    pub fn fork_held_here(&self) -> bool {
        self.cache.held_across_fork_here()
    }

    /// Takes the cache lock and keeps it: the fork handlers hold it across fork(). The cache is
    /// kept from the child (Note [Fork at the fork]).
    pub fn lock_for_fork(&self) {
        // Freed blocks waiting in slots are idle memory: the child gets none (Note [Fork at the
        // fork]); one freed into a slot after this is the child's to give back. A fork from a
        // signal handler inside our own work leaves them (the lock is this thread's already).
        if !crate::sys::lock::held_here() {
            self.empty_slots();
        }
        self.fork_pid.store(self.memory.process_id(), Relaxed);
        self.cache.lock_for_fork();
        self.forking.store(true, Relaxed);
        self.wait_for_transit();
        let mut cache = self.cache(); // this thread's again: it holds the lock
        cache.keep_from_fork(|r| {
            self.memory.keep_from_fork(r.addr, r.len);
        });
        for r in cache.deferred().iter() {
            self.memory.keep_from_fork(r.addr, r.len);
        }
    }

    /// Waits, at most TRANSIT_WAIT_NS, until no range is in transit: asleep, not spinning (the
    /// threads it waits for may need this CPU).
    pub(super) fn wait_for_transit(&self) {
        self.transit.wait_empty(self.clock, (self.clock)().saturating_add(TRANSIT_WAIT_NS));
    }

    /// Waits, as long at most, until the background pass has released, and unmapped what a trim
    /// doomed meanwhile (Note [Room for others], rule 7).
    pub(super) fn wait_for_release(&self) {
        self.releasing.wait_empty(self.clock, (self.clock)().saturating_add(TRANSIT_WAIT_NS));
    }

    /// In a child our fork handlers did not see (Note [Children our handlers did not see] in
    /// sys/fork_mark.rs): whoever held the cache lock at the fork, our background thread or the
    /// forking thread's own prepare handler, is done with it here.
    ///
    /// # Safety
    /// Only while adopting the parent's records, before any other thread of the child can hold
    /// the lock; the records are forgotten next (`forget_cache_in_child`).
    pub unsafe fn free_lock_in_child(&self) {
        self.forking.store(false, Relaxed);
        // SAFETY: the caller's contract.
        unsafe { self.cache.free_in_child() };
    }

    /// # Safety
    /// Only in the fork handlers, after `lock_for_fork`. The cached blocks stay kept from
    /// children until they leave the cache (Note [Fork at the fork]).
    pub unsafe fn unlock_after_fork(&self) {
        // In the child, this forgets the parent's blocks first (Note [Fork handlers that
        // allocate]).
        drop(self.cache());
        self.forking.store(false, Relaxed);
        self.cache.force_unlock();
    }
}

/// How long a fork, or a retry for room, waits for ranges in transit (Note [Fork at the fork]),
/// and a retry for blocks being released.
const TRANSIT_WAIT_NS: u64 = 100_000_000;
