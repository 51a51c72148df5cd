//! A range the program claims for pages of its own: what we still hold there leaves first.
//
// Note [Ranges the program claims]
// glibc's free unmaps a large block: its addresses are the kernel's again, and a program may
// then put pages of its own there (mmap with MAP_FIXED, MAP_FIXED_NOREPLACE, which fails where
// anything is mapped, mremap to a fixed address, shmat) or unmap them (harmless there). A block
// we took back stays mapped, in the cache, on the deferred list (Note [Deferred unmaps]) or on
// its way to the kernel; the program's pages would land inside it, and the next request be
// served from them, the idle release madvise them away and the expiry unmap them. So before
// such a call reaches the kernel, every cached block and deferred range it overlaps leaves our
// records and is unmapped whole, as glibc's free had unmapped it. A block the background pass is
// releasing leaves too, and is unmapped by the claim once the pass's madvise calls are over
// (the `advising` gate, entered under the lock that marked it Releasing; the pass's own step
// after them then finds it gone): that wait lasts as long as the calls take, with one line on
// stderr after CLAIM_WARN_NS (a 5 s bound on it let a pass stalled longer, its thread stopped
// by a tracer or starved on a busy CPU, madvise and unmap the program's own pages: SIGSEGV in
// the sched hunter's claimx.c). The calls need no lock, so no thread the program stopped can
// hold them up; the pass's next step, which takes the cache lock again, is not waited for.
// Pages being gathered move or come back, and a range on its way to the kernel is unmapped by
// the thread that took it out: the call waits for those that meet its range (Note [Ranges in
// transit] in transit.rs), however long where a thread has that one range in transit (with the
// same line after CLAIM_WARN_NS), at most CLAIM_WAIT_NS where its range lies within the span of
// several a thread has in transit together, and looks again,
// until a look finds nothing of ours there. It waited for every range in transit, anywhere, for
// at most 5 s: waited for without a bound, a stop-the-world program hung (a review: its
// collector mapped pages beside our blocks while a thread it had paused was in our free), and
// after 5 s our stalled thread's late munmap took the program's pages (SIGSEGV in
// c/claim_stalled.c). A range in transit on a thread the program paused meets the program's
// range only where the program maps over a block that thread is freeing at that moment, a race
// glibc's own munmap loses too, or one that thread took back from the cache for a trim or a
// gathering: there a collector that maps over it while the thread is paused waits for good
// (limits.md). Live blocks the range overlaps are marked as before (Note [Pages the program
// changed] in mod.rs).
// Far from every block we ever made the check is one load a 2 MiB granule. A signal handler on
// a thread inside our own work, or another library's fork handler while the fork holds the
// cache lock, would wait for itself: there the claim steps aside (Note [Inside our own work] in
// sys/lock.rs), as it did before it existed.

use super::HostLayer;
use crate::backing::PageMemory;
use crate::ranges::RangeList;

impl<M: PageMemory> HostLayer<M> {
    /// The program is about to put pages of its own at [addr, addr+len), or unmap it
    /// (Note [Ranges the program claims]). Far from our blocks, a few loads and no stack: every
    /// munmap of the program's comes here, from threads with 16 KiB stacks and from signal
    /// handlers on 8 KiB alternate stacks (a GC mapping pages in as they fault).
    #[inline(always)]
    pub fn claim_range(&self, addr: usize, len: usize) {
        if !self.registry.may_hold_ours(addr, len) || crate::sys::lock::held_here() {
            return;
        }
        self.claim_near_ours(addr, len);
    }

    /// Near our blocks: on a stack of ours, since its lists take 8 KiB of the caller's
    /// (Note [A stack of our own] in sys/stack.rs).
    #[cold]
    #[inline(never)]
    fn claim_near_ours(&self, addr: usize, len: usize) {
        crate::sys::stack::on_own_stack_quiet(|| self.claim_here(addr, len));
    }

    #[inline(never)]
    fn claim_here(&self, addr: usize, len: usize) {
        let end = addr.saturating_add(len.max(1));
        self.empty_slots_meeting(addr, end);
        for _ in 0..MAX_LOOKS {
            let found = self.claim_once(addr, end);
            // What another thread took out of the records before us is unmapped, moved or put
            // back by it.
            // Any span that meets the range, at most CLAIM_WAIT_NS; then one range's own, however
            // long (Note [Ranges in transit]).
            self.transit.wait_clear_of(addr, end, false, self.clock, (self.clock)().saturating_add(CLAIM_WAIT_NS));
            if self.transit.meets(addr, end, true) {
                warn_stalled();
                self.transit.wait_clear_of(addr, end, true, self.clock, u64::MAX);
            }
            if !found {
                return;
            }
        }
    }

    /// One look: the cached blocks, blocks being released and deferred ranges in [addr, end)
    /// unmapped; whether any was there.
    fn claim_once(&self, addr: usize, end: usize) -> bool {
        let mut found = false;
        loop {
            let (cached, deferred, releasing, transit) = {
                let mut cache = self.cache();
                // Most claims near our blocks find none of them there: no lists built (4 KiB).
                if !cache.holds_any_in(addr, end) {
                    return found;
                }
                let (mut deferred, mut releasing) = (RangeList::new(), RangeList::new());
                let cached = cache.claim(addr, end, &mut deferred, &mut releasing);
                for r in cached.iter().chain(releasing.iter()) {
                    self.registry.clear(r.addr);
                }
                self.stats.cached.set(cache.cached_bytes() as u64);
                self.stats.deferred.set(cache.deferred_bytes() as u64);
                let transit = self.transit(cached.iter().chain(deferred.iter()).chain(releasing.iter()).copied());
                (cached, deferred, releasing, transit)
            };
            self.unmap_all(&cached);
            self.unmap_all(&deferred);
            if !releasing.is_empty() {
                self.wait_for_advice();
                self.unmap_all(&releasing);
            }
            drop(transit);
            if cached.is_empty() && deferred.is_empty() && releasing.is_empty() {
                return found;
            }
            found = true;
        }
    }

    /// Waits until the background pass's madvise calls are over, however long (Note [Ranges
    /// the program claims]); after CLAIM_WARN_NS, says so once.
    fn wait_for_advice(&self) {
        self.advising.wait_empty(self.clock, (self.clock)().saturating_add(CLAIM_WARN_NS));
        if !self.advising.occupied() {
            return;
        }
        warn_stalled();
        self.advising.wait_empty(self.clock, u64::MAX);
    }
}

/// The one line a claim says once it has waited CLAIM_WARN_NS (once a process).
fn warn_stalled() {
    if !CLAIM_WARNED.swap(true, core::sync::atomic::Ordering::Relaxed) {
        crate::warn_line!("a mapping the program makes over memory tensormalloc is releasing waits for that release, whose thread has not run for {} s (stopped or starved)", CLAIM_WARN_NS / 1_000_000_000);
    }
}

/// How long a claim waits at most for a span of several ranges in transit that meets its range.
const CLAIM_WAIT_NS: u64 = 5_000_000_000;
/// How long a claim waits for our calls on the range before it says so (a pass releasing a
/// large block on a starved CPU takes hundreds of milliseconds).
const CLAIM_WARN_NS: u64 = 5_000_000_000;
/// Whether the line was said (once a process).
static CLAIM_WARNED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// Looks at most (each after the waits): a busy program may free into the range meanwhile.
const MAX_LOOKS: usize = 8;
