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
// releasing is unmapped by the pass once its madvise returns, pages being gathered move or come
// back, and a range on its way to the kernel is unmapped by the thread that took it out: the
// call waits for those, for as long as they take (the madvise and the unmap must be over
// before the program's pages are there: a wait that gave up after 5 s let a pass stalled
// longer, its thread stopped by a tracer or starved on a busy CPU, madvise and unmap the
// program's own pages, SIGSEGV in the sched hunter's claimx.c), with one line on stderr once
// it has waited CLAIM_WARN_NS, and looks again, until a look finds nothing of ours there. Live
// blocks the range overlaps are marked as before (Note [Pages the program changed] in mod.rs).
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
        let since = (self.clock)();
        for _ in 0..MAX_LOOKS {
            let (found, doomed) = self.claim_once(addr, end);
            // What another thread took out of the records before us is unmapped, or put back,
            // by it; a block being released, by the pass.
            self.wait_out(&self.transit, since);
            if doomed {
                self.wait_out(&self.releasing, since);
            }
            if !found && !doomed {
                return;
            }
        }
    }

    /// Waits until no thread is inside `gate`, however long (Note [Ranges the program claims]);
    /// after CLAIM_WARN_NS since `since`, says so once.
    fn wait_out(&self, gate: &crate::sys::lock::Gate, since: u64) {
        let warn_at = since.saturating_add(CLAIM_WARN_NS);
        gate.wait_empty(self.clock, warn_at);
        if gate.is_empty() {
            return;
        }
        if !CLAIM_WARNED.swap(true, core::sync::atomic::Ordering::Relaxed) {
            crate::warn_line!("a mapping the program makes over memory tensormalloc is releasing waits for that release, whose thread has not run for {} s (stopped or starved)", CLAIM_WARN_NS / 1_000_000_000);
        }
        gate.wait_empty(self.clock, u64::MAX);
    }

    /// One look: the cached blocks and deferred ranges in [addr, end) unmapped; whether any
    /// was there, and whether one being released was doomed.
    fn claim_once(&self, addr: usize, end: usize) -> (bool, bool) {
        let (mut found, mut doomed_any) = (false, false);
        loop {
            let (cached, deferred, transit) = {
                let mut cache = self.cache();
                // Most claims near our blocks find none of them there: no lists built (4 KiB).
                if !cache.holds_any_in(addr, end) {
                    return (found, doomed_any);
                }
                let mut deferred = RangeList::new();
                let (cached, doomed) = cache.claim(addr, end, &mut deferred);
                doomed_any |= doomed;
                for r in cached.iter() {
                    self.registry.clear(r.addr);
                }
                self.stats.cached.set(cache.cached_bytes() as u64);
                self.stats.deferred.set(cache.deferred_bytes() as u64);
                (cached, deferred, self.transit())
            };
            self.unmap_all(&cached);
            self.unmap_all(&deferred);
            drop(transit);
            if cached.is_empty() && deferred.is_empty() {
                return (found, doomed_any);
            }
            found = true;
        }
    }
}

/// How long a claim waits for what others are doing in its range before it says so (a pass
/// releasing a large block on a starved CPU takes hundreds of milliseconds).
const CLAIM_WARN_NS: u64 = 5_000_000_000;
/// Whether the line was said (once a process).
static CLAIM_WARNED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
/// Looks at most (each after the waits): a busy program may free into the range meanwhile.
const MAX_LOOKS: usize = 8;
