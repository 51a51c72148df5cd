//! Giving memory back: idle blocks released and expired by the background pass (`reap`, Note
//! [What RSS shows]), the whole cache emptied (`trim`), and room made for others under a
//! mapping limit or when a request fails (Note [Room for others]).
//
// Note [Room for others]
// Cached blocks take address space, count against RLIMIT_DATA (private writable mappings, brk's
// heap among them, since Linux 4.7) and, under strict overcommit, take commit charge, whether or
// not their pages were released. glibc unmaps a large block at free, so a program under
// `ulimit -v` or `ulimit -d` that frees 1 GiB can map 900 MiB next, or grow glibc's heap by it;
// with the block cached it could not. These rules keep us out of the way. (1) Under such a limit
// the cache keeps nothing unless the user set its bound (TENSORMALLOC_CACHE_BYTES): a freed
// block is unmapped at once, as glibc's free unmaps it. The ceiling was once an eighth of the
// limit, and the room it held failed what no shim of ours sees: the stack growing (SIGSEGV), the
// loader mapping a library, brk, the program's mprotect to writable or shmget, and, under strict
// overcommit, other processes' requests, for as long as the blocks stayed cached. The limit is
// read when it may have changed: after the program's setrlimit or prlimit (our shims: Python's
// resource.setrlimit comes at any time), at every background pass (another process's prlimit;
// the overcommit mode at most once a second: an administrator may switch strict overcommit on
// while we run), and when a mapping fails. (2) When
// the next allocator fails with ENOMEM while the cache holds something, the cache is emptied and
// the call made once more, as for our own mappings (route.rs installs the entry points that do
// this once a limit is seen, so the fast paths are unchanged otherwise). (3) The cache is
// emptied for a failed request only when the request could then succeed: a 64 TiB request that
// no limit could ever allow leaves the cache alone. (4) A lower limit takes effect at once: the
// cache is cut to its new ceiling and the deferred unmaps are done before the program's
// setrlimit or prlimit returns; a limit another process lowers (prlimit), or the program with a
// raw prlimit64, is seen by the background pass, which comes at least once a second while the
// cache holds anything. (5) The program's own mmap and mremap (our shims) and pthread_create
// (whose stack glibc maps itself) that fail for want of room empty the cache and try once more,
// as rule 2 does for the next allocator: so they succeed as under glibc alone even before the
// background pass has seen a limit. (6) Blocks another thread has taken out of the cache and is
// unmapping (the background pass cutting the cache to a limit it has just seen, a trim) give room
// only once unmapped: a retry waits for them (at most 100 ms), as a fork does (a mapping failed
// about two runs in five when the program's own setrlimit, in another thread, emptied the cache
// as its mapping failed); and one that came after the failure and before the retry counts too.
// (7) A block the background pass is releasing (its MADV_FREE under way, outside the lock) is
// left in the cache by a trim, marked for the pass to unmap once the madvise returns: a retry
// waits for that too (at most 100 ms; under TENSORMALLOC_HOST_RELEASE_MS=0, a 900 MiB mapping
// after 900 blocks of 1 MiB were freed failed about one run in thirty).
//
// Note [What RSS shows]
// A cached block's pages are resident while it is hot (reused soon, Note [Hot stays hot]). After
// TENSORMALLOC_HOST_RELEASE_MS idle they are released. MADV_FREE is the cheap way (reuse costs no
// fault), but its pages stay in RSS and in the cgroup's usage, as LazyFree in smaps, until the
// kernel needs them or the block expires: a Kubernetes kubelet or a dashboard reading RSS or the
// working set sees them as used (Go and jemalloc went back to MADV_DONTNEED for this). So under
// TENSORMALLOC_HOST_RELEASE=auto (the default) the background thread first asks whether the process
// nears a limit (its cgroup's usage at three quarters of memory.max, memory.high or v1's
// memory.limit_in_bytes, or the system's MemAvailable under an eighth): if so, idle blocks are
// dropped with MADV_DONTNEED (RSS and the cgroup's usage fall at once; they read zero after, so
// calloc takes them as they are) and blocks MADV_FREE'd earlier are unmapped; with room, MADV_FREE
// as before. `lazy` and `now` fix the choice. The report and `stats()` split the cache into
// resident (hot) and lazily freed bytes so RSS can be read against them. The answer (a dozen file
// reads up the cgroup tree) is kept NEAR_LIMIT_KEPT_NS: past the hot bound a pass can come every
// few milliseconds, and a stale "room" only MADV_FREEs pages the kernel takes back under pressure.

use super::{mapping_span, push, HostLayer};
use crate::backing::PageMemory;
use crate::config::Release;
use crate::host::cache::{BlockCache, CacheLimits};
use crate::ranges::RangeList;
use core::sync::atomic::Ordering::Relaxed;

impl<M: PageMemory> HostLayer<M> {
    /// The process may map no more than `bytes` (the lowest of RLIMIT_AS, RLIMIT_DATA and a
    /// strict commit limit; u64::MAX for none): the cache keeps nothing under one, unless the
    /// user set the bound (TENSORMALLOC_CACHE_BYTES: the program's mallopt bound gives way), and
    /// nothing leaving the cache, or waiting in a thread's slot, waits to be unmapped (Note
    /// [Room for others]).
    /// A lower limit takes effect at once: the cache is cut to its new ceiling and the deferred
    /// unmaps are done before this returns (the program's next mmap or thread must find the room
    /// glibc's free would have left).
    /// On a stack of ours: its list of ranges takes 6 KiB (Note [A stack of our own] in
    /// sys/stack.rs).
    pub fn limit_mappings(&self, bytes: u64) {
        crate::sys::stack::on_own_stack_quiet(|| self.limit_mappings_here(bytes));
    }

    #[inline(never)]
    fn limit_mappings_here(&self, bytes: u64) {
        let was = self.mapping_limit_bytes.swap(bytes, Relaxed);
        self.follow_bounds_in_slots();
        // The ceiling follows the limit both ways: one raised again gives the memory's back.
        let ceiling = usize::try_from(self.memory_ceiling_bytes.load(Relaxed).min(super::space_ceiling(bytes))).unwrap_or(usize::MAX);
        let space = usize::try_from(super::space_ceiling(bytes)).unwrap_or(usize::MAX);
        let program = self.program_cache_bytes.load(Relaxed);
        self.unmap_lists(|cache| {
            let limits = *cache.limits();
            if limits.follow_bytes {
                cache.set_limits(CacheLimits { max_bytes: ceiling, ..limits });
            } else if program != usize::MAX {
                // The program's mallopt bound holds while no limit does (glibc's free unmaps).
                cache.set_limits(CacheLimits { max_bytes: program.min(space), ..limits });
            }
            let bound = cache.bounds().1;
            if bytes < was {
                cache.shrink_to(bound)
            } else {
                RangeList::new()
            }
        });
        if bytes < was {
            self.unmap_deferred();
        }
    }

    fn release_mode(&self) -> Release {
        match self.release.load(Relaxed) {
            1 => Release::Free,
            2 => Release::DontNeed,
            _ => Release::Auto,
        }
    }

    /// Unmaps the deferred list now (the background thread, trim, memory short); returns bytes.
    fn unmap_deferred(&self) -> usize {
        let (deferred, transit) = {
            let mut cache = self.cache();
            let d = cache.take_deferred();
            self.stats.deferred.set(0);
            let transit = self.transit(d.iter().copied());
            (d, transit)
        };
        self.unmap_timed(&deferred, &self.stats.phases.deferred_unmap);
        drop(transit);
        deferred.total_bytes()
    }

    /// After a request of `len` bytes failed for want of memory (ours, or the next allocator's):
    /// empties the cache when the request could then succeed (Note [Room for others]). True
    /// when something was given back: the caller tries once more.
    /// `unmapped_before`: `unmapped_bytes()` before the failed call; blocks other threads
    /// unmapped since (the background pass following a lowered limit, a trim) made room too.
    pub fn make_room(&self, len: usize, unmapped_before: u64) -> bool {
        let trimmed = if self.memory.could_map(len) { self.trim() } else { 0 };
        // Blocks the background pass is releasing are unmapped by it once their madvise
        // returns, and ranges another thread took out of the cache give room only once they
        // are unmapped (Note [Room for others], rules 6 and 7).
        if self.releasing.occupied() {
            self.wait_for_release();
        }
        if self.transit.occupied() {
            self.wait_for_transit();
        }
        if trimmed == 0 && self.unmapped_bytes() == unmapped_before {
            return false;
        }
        self.stats.retries_after_trim.add(1);
        true
    }

    /// Whether `make_room` could give anything back: the cache or the deferred list holds
    /// something, ranges taken out of them are on their way to the kernel, or some were unmapped
    /// since `unmapped_before`. Asked in the order a block goes through them (it leaves the
    /// records and enters transit under the lock, and leaves transit once its unmap is
    /// counted), so one moving meanwhile is seen at one step or the next.
    pub fn may_make_room(&self, unmapped_before: u64) -> bool {
        self.holds_idle_memory() || self.transit.occupied() || self.unmapped_bytes() != unmapped_before
    }

    /// Every byte of ours unmapped so far (counted once the unmap has returned): what a call that
    /// failed for want of room reads before, to tell whether room was made since.
    pub fn unmapped_bytes(&self) -> u64 {
        self.stats.unmapped_bytes.get()
    }

    /// Whether a mapping of `len` bytes on `align` could succeed under the limits were nothing
    /// of ours mapped (PageMemory::could_map). A request no memory could satisfy (its size or
    /// its alignment) is a probe, not a shortage: it leaves the cache alone.
    pub fn could_map(&self, len: usize, align: usize) -> bool {
        self.memory.could_map(mapping_span(len, align))
    }

    /// Whether the cache, the deferred list or a thread's slot holds anything `make_room`
    /// could give back.
    pub fn holds_idle_memory(&self) -> bool {
        self.idle_bytes() > 0 || self.slots.any()
    }

    /// Bytes cached or waiting to be unmapped.
    pub fn idle_bytes(&self) -> usize {
        let cache = self.cache();
        cache.cached_bytes() + cache.deferred_bytes()
    }

    /// Takes lists of blocks out of the cache with `take` (a list at a time: the cache may hold
    /// more blocks than one list), their records cleared under the lock, and unmaps each list
    /// outside it, until `take` gives an empty one; returns the bytes unmapped.
    fn unmap_lists(&self, mut take: impl FnMut(&mut BlockCache) -> RangeList) -> usize {
        let mut bytes = 0;
        loop {
            let (list, transit) = {
                let mut cache = self.cache();
                let list = take(&mut cache);
                for r in list.iter() {
                    self.registry.clear(r.addr);
                }
                self.stats.cached.set(cache.cached_bytes() as u64);
                let transit = self.transit(list.iter().copied());
                (list, transit)
            };
            self.unmap_all(&list);
            drop(transit);
            if list.is_empty() {
                return bytes;
            }
            bytes += list.total_bytes();
        }
    }

    /// Unmaps every cached block now; returns the bytes given back.
    pub fn trim(&self) -> usize {
        self.empty_slots();
        let bytes = self.unmap_lists(BlockCache::drain);
        bytes + self.unmap_deferred()
    }

    /// As `trim`, for the program's own malloc_trim and tm_trim: a block the background pass is
    /// releasing at that moment (the hot bound releases blocks as they are freed, Note [Hot
    /// within the memory]) is unmapped by the pass once its madvise returns, and the call
    /// returns after that (at most 100 ms), so RSS has fallen when it does.
    pub fn trim_now(&self) -> usize {
        let before = self.unmapped_bytes();
        let bytes = self.trim();
        if self.releasing.occupied() {
            self.wait_for_release();
        }
        // What the pass unmapped for us meanwhile was given back too.
        bytes.max(usize::try_from(self.unmapped_bytes().saturating_sub(before)).unwrap_or(usize::MAX))
    }

    /// Whether memory nears a limit at `now_ns`, read again once the last answer is
    /// NEAR_LIMIT_KEPT_NS old.
    fn near_limit(&self, now_ns: u64) -> bool {
        let kept = self.near_limit_kept.load(Relaxed);
        if kept != 0 && now_ns < kept >> 1 {
            return kept & 1 == 1;
        }
        let near = self.memory.near_limit();
        let until = now_ns.saturating_add(NEAR_LIMIT_KEPT_NS).min(u64::MAX >> 1);
        self.near_limit_kept.store(until << 1 | u64::from(near), Relaxed);
        near
    }

    /// Releases and expires idle blocks; returns when it next has work (monotonic ns).
    pub fn reap(&self) -> Option<u64> {
        // Blocks in slots are idle as cached ones are, since they were freed (Note [A thread's
        // own slot]).
        let slot_due = self.empty_idle_slots((self.clock)());
        self.unmap_deferred();
        let now = (self.clock)();
        let drop_pages = match self.release_mode() {
            Release::Free => false,
            Release::DontNeed => true,
            // Only with something due, or lazily freed, is the question worth a few reads (the
            // pass comes every second while the cache holds anything: Note [Room for others]).
            Release::Auto => {
                let (due, lazy) = {
                    let cache = self.cache();
                    (cache.next_deadline_ns().is_some_and(|d| d <= now), cache.resident_split().1 > 0)
                };
                (due || lazy) && self.near_limit(now)
            }
        };
        let (due, transit, releasing, advising) = {
            let mut cache = self.cache();
            let due = cache.due(now, drop_pages);
            for r in due.expire.iter() {
                self.registry.clear(r.addr);
            }
            self.stats.cached.set(cache.cached_bytes() as u64);
            // Entered under the lock that marked them Releasing: a trim that finds them
            // finds the gate occupied (rule 7), and so does a claim that takes one out (Note
            // [Ranges the program claims]).
            let releasing = (!due.release.is_empty()).then(|| self.releasing.enter());
            let advising = (!due.release.is_empty()).then(|| self.advising.enter());
            let transit = self.transit(due.expire.iter().copied());
            (due, transit, releasing, advising)
        };
        for r in due.expire.iter() {
            self.timed(&self.stats.phases.expire, || self.memory.unmap(r.addr, r.len));
            self.stats.unmapped_blocks.add(1);
            self.stats.unmapped_bytes.add(r.len as u64);
        }
        drop(transit);
        let mut zeroed = [false; RangeList::CAPACITY];
        for (r, zero) in due.release.iter().zip(zeroed.iter_mut()) {
            *zero = self.timed(&self.stats.phases.release, || if drop_pages { self.memory.discard(r.addr, r.len) } else { self.memory.release(r.addr, r.len) });
            self.stats.released_blocks.add(1);
            self.stats.released_bytes.add(r.len as u64);
        }
        // The calls are over: a claim that took one of these blocks out may unmap it now.
        drop(advising);
        let (doomed, deadline, transit) = {
            let mut cache = self.cache();
            let mut doomed = RangeList::new();
            for (r, &zero) in due.release.iter().zip(zeroed.iter()) {
                if let Some(gone) = cache.release_done(r.addr, zero) {
                    self.registry.clear(gone.addr);
                    doomed = push(doomed, gone);
                }
            }
            self.stats.cached.set(cache.cached_bytes() as u64);
            let transit = self.transit(doomed.iter().copied());
            (doomed, cache.next_deadline_ns(), transit)
        };
        self.unmap_all(&doomed);
        drop(transit);
        drop(releasing);
        // While it holds idle memory, the background pass (which reads the mapping limits
        // first) comes at least once a second: a limit another process lowers with prlimit, or
        // the program with a raw system call, is seen within one (Note [Room for others]).
        let deadline = match (deadline, slot_due) {
            (Some(d), Some(s)) => Some(d.min(s)),
            (d, s) => d.or(s),
        };
        if self.holds_idle_memory() {
            let poll = (self.clock)().saturating_add(LIMIT_POLL_NS);
            return Some(deadline.map_or(poll, |d| d.min(poll)));
        }
        deadline
    }
}

/// How long an answer to "near a limit?" holds (Note [What RSS shows]).
const NEAR_LIMIT_KEPT_NS: u64 = 50_000_000;

/// The longest the background pass waits while the cache holds something (Note [Room for
/// others]).
const LIMIT_POLL_NS: u64 = 1_000_000_000;
