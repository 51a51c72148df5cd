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
// releasing is unmapped by the pass once its madvise returns, and a range on its way to the
// kernel by the thread unmapping it: the call waits for both (TRANSIT_WAIT_NS at most). Live
// blocks the range overlaps are marked as before (Note [Pages the program changed] in mod.rs).
// Far from every block we ever made the check is one load a 2 MiB granule.

use super::HostLayer;
use crate::backing::PageMemory;
use crate::ranges::RangeList;

impl<M: PageMemory> HostLayer<M> {
    /// The program is about to put pages of its own at [addr, addr+len), or unmap it
    /// (Note [Ranges the program claims]).
    pub fn claim_range(&self, addr: usize, len: usize) {
        if !self.registry.may_hold_ours(addr, len) {
            return;
        }
        let end = addr.saturating_add(len.max(1));
        let mut doomed_any = false;
        loop {
            let mut deferred = RangeList::new();
            let (cached, transit) = {
                let mut cache = self.cache();
                let (cached, doomed) = cache.claim(addr, end, &mut deferred);
                doomed_any |= doomed;
                for r in cached.iter() {
                    self.registry.clear(r.addr);
                }
                self.stats.cached.set(cache.cached_bytes() as u64);
                self.stats.deferred.set(cache.deferred_bytes() as u64);
                (cached, self.transit())
            };
            self.unmap_all(&cached);
            self.unmap_all(&deferred);
            drop(transit);
            if cached.is_empty() && deferred.is_empty() {
                break;
            }
        }
        // What another thread took out of the records before us is unmapped by it.
        self.wait_for_transit();
        if doomed_any {
            self.wait_for_release();
        }
    }
}
