//! Blocks leaving the cache other than for a request: idle ones released and expired (Note [Hot
//! stays hot]), the oldest evicted to a lower bound, the whole cache emptied, the deferred
//! unmaps (Note [Deferred unmaps]), and what a fork does (kept from the child, forgotten in it).
//
// Note [Hot stays hot]
// A block reused soon after its free is handed out untouched: no madvise, so no faults and no
// re-dirtying cost (rewriting MADV_FREE'd pages costs 2.5x a plain rewrite: 3.6 ms against 1.45 ms for 80 MB). Only a
// block idle for `release_after_ns` is released, and only one idle for `expire_after_ns` is
// unmapped. A block being released is marked Releasing and is not handed out until the
// madvise call has returned (a child forked meanwhile inherits none of the cache: Note [Plain
// memory] in host/host_layer/mod.rs).
//
// Note [Hot within the memory]
// A hot block's pages are dirty anonymous memory: without swap the kernel cannot take them back,
// and a memory cgroup at its limit kills the process rather than wait for our idle release. A
// program that freed large blocks (glibc alone would have unmapped them) and then allocated as
// much again in small pieces, or in a forked child or a neighbour in its cgroup, was OOM-killed
// (512 MiB cgroup: 200 MiB live, 120 MiB freed, 250 MiB then made of malloc(1000); glibc peaks
// at 453 MiB). So in a cgroup whose limit bounds the process, no more than `max_hot_bytes` (a
// sixteenth of that limit) stays hot: past it the oldest hot blocks are released by the
// background pass, woken by the free, as soon as they have been idle HOT_GRACE_NS. MADV_FREE'd pages the kernel takes back under pressure,
// and one the program rewrites before that costs no fault. A block being released is not
// handed out (Note [Hot stays hot]): a request then may map afresh, as glibc would. An exact
// bound the user set (TENSORMALLOC_CACHE_BYTES) is kept hot as asked; without a cgroup limit,
// physical memory bounds the cache (a quarter) and the idle release and Note [What RSS shows]
// apply as before.
//
// A block is released past the bound only once idle HOT_GRACE_NS: blocks freed together merge
// (Note [Neighbours merge]), and a loop that frees its working set and asks for it again at
// once found the merged block being released and mapped afresh (8 blocks of 8 MiB in a 512 MiB
// cgroup: 94 misses in 800 and twice the cgroup's peak usage, against 8 and the same peak
// with the bound off). A program that needs the memory another way takes longer than that to
// fill it (250 MiB of malloc(1000): about 100 ms).
//
// Note [Deferred unmaps]
// Unmapping an evicted 5-25 MB block costs about 0.85 ms; inside the program's free that was
// most of a churn benchmark's time. Blocks leaving the cache (evicted or refused, and tails a
// realloc shrank off) go on a fixed list the background thread unmaps; they are out of the
// cache and the registry already, so they are never handed out again, and the report counts
// them. The caller unmaps inline when no background thread runs, when the list is full, or
// when memory is short.
// The list lives under the cache lock, which the fork handlers hold across fork(). A forked
// child forgets it with the cache (Note [Plain memory] in host/host_layer/mod.rs): evicted blocks were
// cached, so the child never inherited them, and unmapping their ranges there could unmap what
// the child maps in their place. A shrunk block's tail on the list stays mapped in the child
// (address space only: its pages are the parent's copy-on-write ones), as does a range the
// parent's thread had taken off the list but not yet unmapped.

use super::store::NONE;
use super::{BlockCache, BlockState, CachedBlock, PageFacts};
use crate::ranges::{Range, RangeList};

/// How long a block past the hot bound stays hot after its free (Note [Hot within the memory]).
pub const HOT_GRACE_NS: u64 = 20_000_000;

#[derive(Clone, Copy, Debug, Default)]
pub struct Due {
    /// Blocks now Releasing: the caller calls MADV_FREE on each, then `release_done`.
    pub release: RangeList,
    /// Blocks removed for idling past the expiry: the caller unmaps them.
    pub expire: RangeList,
}

impl BlockCache {
    /// Puts a range on the list the background thread unmaps; false when the list is full
    /// (the caller unmaps it). Note [Deferred unmaps].
    pub fn defer_unmap(&mut self, r: Range) -> bool {
        let Some(slot) = self.deferred.get_mut(self.deferred_count) else { return false };
        *slot = r;
        self.deferred_count += 1;
        self.deferred_bytes += r.len;
        true
    }

    /// The deferred list, left in place.
    pub fn deferred(&self) -> RangeList {
        let mut out = RangeList::new();
        for r in self.deferred.iter().take(self.deferred_count) {
            out.push(*r);
        }
        out
    }

    /// Bytes waiting on the deferred list.
    pub fn deferred_bytes(&self) -> usize {
        self.deferred_bytes
    }

    /// Empties the deferred list: the caller unmaps every range.
    pub fn take_deferred(&mut self) -> RangeList {
        let out = self.deferred();
        self.deferred_count = 0;
        self.deferred_bytes = 0;
        out
    }

    /// Blocks whose idle time has passed a delay, oldest first, as many as the lists hold (the
    /// rest are due at once on the next call): expired ones leave the cache, hot ones become
    /// Releasing. `near_limit`: released blocks whose pages the kernel may still hold
    /// (MADV_FREE'd) expire as soon as they are due for release (Note [What RSS shows] in
    /// host/host_layer/release.rs).
    pub fn due(&mut self, now_ns: u64, near_limit: bool) -> Due {
        self.unpark();
        let mut due = Due::default();
        let limits = self.limits;
        let first_due = limits.release_after_ns.min(limits.expire_after_ns);
        let mut at = self.store.oldest();
        while at != NONE && due.release.len() < RangeList::CAPACITY && due.expire.len() < RangeList::CAPACITY {
            let b = *self.store.get(at);
            let next = self.store.newer(at);
            let idle = now_ns.saturating_sub(b.idle_since_ns);
            if idle < first_due {
                break; // every block after it was freed later
            }
            let lazily_freed = b.state == BlockState::Released && !b.facts.zero;
            let expire_after = if near_limit && lazily_freed { limits.release_after_ns } else { limits.expire_after_ns };
            if b.state != BlockState::Releasing && idle >= expire_after {
                due.expire.push(Range { addr: b.addr, len: b.len });
                self.store.remove(at);
                self.cached_bytes -= b.len;
            } else if b.state == BlockState::Hot && idle >= limits.release_after_ns {
                self.store.set_state(at, BlockState::Releasing);
                due.release.push(Range { addr: b.addr, len: b.len });
            }
            at = next;
        }
        // Note [Hot within the memory]: the oldest hot blocks past the bound, once idle for
        // HOT_GRACE_NS (those on their way already count as gone).
        let mut excess = self.hot_bytes().saturating_sub(limits.max_hot_bytes);
        let mut at = self.store.oldest();
        while excess > 0 && at != NONE && due.release.len() < RangeList::CAPACITY {
            let b = *self.store.get(at);
            let next = self.store.newer(at);
            if b.state == BlockState::Releasing {
                excess = excess.saturating_sub(b.len);
            } else if b.state == BlockState::Hot && now_ns.saturating_sub(b.idle_since_ns) >= HOT_GRACE_NS {
                self.store.set_state(at, BlockState::Releasing);
                due.release.push(Range { addr: b.addr, len: b.len });
                excess = excess.saturating_sub(b.len);
            }
            at = next;
        }
        due
    }

    /// The madvise for a Releasing block has returned (`zero`: it dropped the pages, Note
    /// [Known zero]). Returns the block if it was trimmed meanwhile: the caller unmaps it.
    pub fn release_done(&mut self, addr: usize, zero: bool) -> Option<Range> {
        let id = self.store.starting_at(addr).filter(|&id| self.store.get(id).state == BlockState::Releasing)?;
        let b = *self.store.get(id);
        if b.doomed {
            self.store.remove(id);
            self.cached_bytes -= b.len;
            return Some(Range { addr: b.addr, len: b.len });
        }
        // MADV_FREE'd pages may go at any time: nothing is known of their residency.
        let facts = &mut self.store.block_mut(id).facts;
        *facts = PageFacts { zero, votes: 0, ..*facts };
        self.store.set_state(id, BlockState::Released);
        None
    }

    /// Whether a cached block or a deferred range overlaps [addr, end) (what `claim` would take
    /// out), with no list built.
    pub fn holds_any_in(&self, addr: usize, end: usize) -> bool {
        self.blocks().any(|b| Range { addr: b.addr, len: b.len }.overlaps(addr, end)) || self.deferred.iter().take(self.deferred_count).any(|r| r.overlaps(addr, end))
    }

    /// The program claims [addr, end) for pages of its own (Note [Ranges the program claims] in
    /// host/host_layer/claim.rs): the cached blocks that overlap it leave, as many as a list
    /// holds (the caller unmaps them and asks again until the list comes back empty), and so
    /// do the deferred ranges that overlap it (`deferred_out`) and the blocks being released
    /// (`releasing_out`: the caller unmaps them once the pass's madvise is over; `release_done`
    /// then finds them gone).
    pub fn claim(&mut self, addr: usize, end: usize, deferred_out: &mut RangeList, releasing_out: &mut RangeList) -> RangeList {
        self.unpark();
        let mut out = RangeList::new();
        let mut at = self.store.oldest();
        while at != NONE && out.len() < RangeList::CAPACITY && releasing_out.len() < RangeList::CAPACITY {
            let next = self.store.newer(at);
            let b = *self.store.get(at);
            if (Range { addr: b.addr, len: b.len }).overlaps(addr, end) {
                let list = if b.state == BlockState::Releasing { &mut *releasing_out } else { &mut out };
                list.push(Range { addr: b.addr, len: b.len });
                self.store.remove(at);
                self.cached_bytes -= b.len;
            }
            at = next;
        }
        let mut kept = 0;
        for i in 0..self.deferred_count {
            let Some(&r) = self.deferred.get(i) else { break };
            if r.overlaps(addr, end) && deferred_out.len() < RangeList::CAPACITY {
                deferred_out.push(r);
                self.deferred_bytes -= r.len;
            } else if let Some(slot) = self.deferred.get_mut(kept) {
                *slot = r;
                kept += 1;
            }
        }
        self.deferred_count = kept;
        out
    }

    /// Marks every block not yet wholly kept from forked children as kept, and gives each to
    /// `f`, which advises it MADV_DONTFORK (Note [Fork at the fork] in host/host_layer/fork.rs).
    pub fn keep_from_fork(&mut self, mut f: impl FnMut(Range)) {
        self.unpark();
        let mut at = self.store.oldest();
        while at != NONE {
            let next = self.store.newer(at);
            let b = self.store.block_mut(at);
            if !b.facts.kept_all {
                b.facts.kept_all = true;
                b.facts.kept_any = true;
                f(Range { addr: b.addr, len: b.len });
            }
            at = next;
        }
    }

    /// Evicts the least recently freed blocks until at most `max_bytes` stay cached (a lower
    /// address-space limit, Note [Room for others]), as many as a list holds: the caller unmaps
    /// them and asks again until the list comes back empty. Blocks being released stay.
    pub fn shrink_to(&mut self, max_bytes: usize) -> RangeList {
        self.unpark();
        let mut out = RangeList::new();
        while self.cached_bytes > max_bytes && out.len() < RangeList::CAPACITY {
            let Some(r) = Self::evict_oldest(&mut self.store) else { break };
            self.cached_bytes -= r.len;
            out.push(r);
        }
        out
    }

    /// Empties the cache, as many blocks at a time as a list holds: the caller unmaps them and
    /// asks again until the list comes back empty. Blocks being released are unmapped by
    /// `release_done`.
    pub fn drain(&mut self) -> RangeList {
        self.unpark();
        let mut out = RangeList::new();
        let mut at = self.store.oldest();
        while at != NONE && out.len() < RangeList::CAPACITY {
            let next = self.store.newer(at);
            let b = *self.store.get(at);
            if b.state == BlockState::Releasing {
                self.store.block_mut(at).doomed = true;
            } else {
                out.push(Range { addr: b.addr, len: b.len });
                self.store.remove(at);
                self.cached_bytes -= b.len;
            }
            at = next;
        }
        out
    }

    /// Empties the cache and the deferred list with nothing left for the caller to unmap (a
    /// forked child, which inherited none of it); `f` hears of every block that was cached.
    pub fn forget_all(&mut self, mut f: impl FnMut(Range)) {
        for b in self.blocks() {
            f(Range { addr: b.addr, len: b.len });
        }
        // Block by block, not a fresh store: writing a whole new one dirtied every page of its
        // tables, a copy-on-write fault each (25 a fork) in every child, the cache empty or not.
        while self.store.oldest() != NONE {
            self.store.remove(self.store.oldest());
        }
        self.parked = CachedBlock::EMPTY;
        self.cached_bytes = 0;
        self.deferred_count = 0;
        self.deferred_bytes = 0;
    }

    /// Cached bytes by what they cost in RSS: (hot: freed recently, pages resident; lazily
    /// freed: MADV_FREE'd, resident until the kernel needs them, and counted in RSS and the
    /// cgroup's usage meanwhile). The rest (dropped with MADV_DONTNEED) costs nothing.
    pub fn resident_split(&self) -> (usize, usize) {
        self.blocks().fold((0, 0), |(hot, lazy), b| match b.state {
            BlockState::Released if b.facts.zero => (hot, lazy),
            BlockState::Released => (hot, lazy + b.len),
            _ => (hot + b.len, lazy),
        })
    }

    /// When `due` will next have work; `None` with nothing pending.
    pub fn next_deadline_ns(&self) -> Option<u64> {
        if self.over_hot_bound() {
            // The oldest hot block's grace ends first (Note [Hot within the memory]).
            if let Some(first) = self.blocks().filter(|b| b.state == BlockState::Hot).map(|b| b.idle_since_ns).min() {
                return Some(first.saturating_add(HOT_GRACE_NS));
            }
        }
        self.blocks()
            .filter(|b| b.state != BlockState::Releasing)
            .map(|b| {
                let expire = b.idle_since_ns.saturating_add(self.limits.expire_after_ns);
                if b.state == BlockState::Hot {
                    expire.min(b.idle_since_ns.saturating_add(self.limits.release_after_ns))
                } else {
                    expire
                }
            })
            .min()
    }
}
