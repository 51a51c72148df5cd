//! The host layer: serves large requests from the block cache or fresh mappings, takes large
//! blocks back, and releases idle ones. Generic over `PageMemory` and the clock so tests drive
//! it over simulated memory. The cache lock is never held across a call into `PageMemory`:
//! decisions are made under the lock, system calls happen after it is dropped.
//
// Note [calloc costs what is touched]
// A calloc served from the cache must read zero. A block known zero (Note [Known zero]) goes
// out as it is. Another one of DISCARD_MIN bytes or more is zeroed either by dropping its pages
// (MADV_DONTNEED: costs about the resident pages; the program then faults in only what it
// touches) or by writing zeros (costs every byte, and faults in every page not resident).
// Dropping wins when the previous owner touched the block sparsely (64 MiB with two pages
// touched: microseconds against milliseconds), writing when it used all of it (dropping then
// rewriting 80 MB costs 16 ms against 1.2 ms). Which one it was is learnt from what we did, with
// no call that asks the kernel (mincore is refused by systemd's @system-service filter):
// a block is dropped first, and the drop's own duration says whether it was mostly resident
// (PageMemory::discard_weighed: a resident 4 KiB page costs 60-250 ns to drop, one never
// touched nothing). Two such findings in a row (a vote each, kept with the block in the
// registry while it is live and in the cache while it is cached; one finding could be a drop
// the scheduler interrupted) make calloc write zeros over the block from then on; a finding of
// "mostly not" starts over, and so does releasing the block (MADV_FREE'd pages may go at any
// time). A block the program fills after each calloc pays one dropped-and-refaulted round (a
// fresh mapping's cost, what glibc pays every time) before it is written over instead.
// Blocks change hands, though (a training loop frees its buffers in another order each step,
// and the next calloc gets one whose votes were never counted): the process keeps votes of its
// own beside each block's, counted the same way, and calloc writes zeros when either side has
// two. A write is weighed too (PageMemory::zero_weighed: pages not resident fault as they are
// written, 0.6-2 us each against 0.1-0.3): one that found the block mostly not resident takes
// a vote away, so a program whose callocs turned sparse is back to drops after two such.

// Note [Plain memory]
// A block we hand out is plain memory whatever its previous owner did to its pages: read-write
// (a JIT's read+exec buffer, a PROT_NONE guard page, a protection key), not locked, no guard
// regions, dumped, and inherited by forked children (MADV_DONTFORK, MADV_WIPEONFORK). glibc gets
// this for free by unmapping every large block at free. We restore it when the program frees a
// block whose pages it changed (`reset_for_cache`: pkey_mprotect, munlock, four madvise calls;
// Note [Pages the program changed] says how we know): then a locked block never meets MADV_FREE
// (which refuses it), and gathered pages are all alike. A block that cannot be restored (sealed),
// or part of which the program unmapped, moved or mapped over, is unmapped, never reused, as
// glibc's free would unmap it.
//
// Note [Huge-page advice]
// MADV_HUGEPAGE and MADV_NOHUGEPAGE set a flag on the mapping that no madvise takes back to
// "neither" (each one clears the other): only a fresh mapping has neither. So a block whose pages
// the program advised MADV_NOHUGEPAGE (the madvise shim marks it) is renewed at its free
// (PageMemory::renew: fresh pages mapped over it, contents and every other attribute gone) and
// cached known zero. MADV_HUGEPAGE is what numpy sets on every array from 4 MiB up: renewing
// those would make every reuse fault its pages in again, the cache's whole point lost. Such a
// block is cached with its pages and the tag of its holder (Note [Holders]: the library whose
// code asked for it), and goes back only to code of that same library, which will advise it
// again, before any block without advice; other code never gets it (it takes a block without
// advice, or a fresh mapping), and it merges only with neighbours of the same tag. The block
// handed back carries the mark on, so its next free tags it again. Renewing such a block for
// other code instead cost numpy's seed expression every page each time: Python's bytes
// (`c.tobytes()`) and numpy's temporary took turns at one 80 MB block, 19,532 faults per
// evaluation against none; with a mapping of its own for each, none. Advice set with a raw
// system call escapes the marks, as other changes do (Note [Pages the program changed]).

// Note [Locked memory]
// Under mlockall(MCL_FUTURE) the kernel locks every new mapping, ours included, so a block
// freed into the cache would stay locked (VmLck counts it, and the program's RLIMIT_MEMLOCK
// with it), where glibc's free would have unmapped it. Under MCL_FUTURE a block entering the cache is
// unlocked, and one leaving it is locked as a fresh mapping would be (with MCL_ONFAULT, as
// its pages are touched). mlockall(MCL_CURRENT) would lock and fault in every cached block:
// the shim empties the cache before and after the call (route/page_calls.rs).
//
// Note [Pages the program changed]
// Resetting every freed block cost seven system calls per malloc/free pair (4.7 us: 25-45x what
// tcmalloc or tuned glibc pay for a sparsely used buffer), though almost no program changes the
// pages of a block it got from malloc. A program changes pages through libc's mprotect,
// pkey_mprotect, madvise, mlock, mlock2, mlockall, munmap, mremap and mmap(MAP_FIXED); we
// export those names (shim/page_calls.rs), and each marks the live blocks of ours its range
// overlaps in the registry before the kernel hears of it (one or two loads for a range far from
// our blocks). At free, a marked block is reset (or unmapped, when part of it was replaced); an
// unmarked one goes to the cache with no system call. Advice that leaves a block plain
// (MADV_DONTNEED, FREE, HUGEPAGE, WILLNEED...: numpy advises huge pages on every array) marks
// nothing. A program that changes pages with raw system calls (syscall(2), its own assembly)
// escapes the marks: TENSORMALLOC_RESET=always resets every block at free, the old cost
// (docs/limits.md). Our own system calls go straight to the kernel (sys/page_calls.rs), never through
// the shims. What a forked child must not inherit is paid at the fork (Note [Fork at the fork]).
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

// Note [Room for others]
// Cached blocks take address space and, under strict overcommit, commit charge, whether or not
// their pages were released. glibc unmaps a large block at free, so a program under `ulimit -v`
// that frees 1 GiB can map 900 MiB next; with the block cached it could not. Three rules keep us
// out of the way. (1) Under such a limit the cache's ceiling is an eighth of it, and blocks
// leaving the cache are unmapped at once rather than by the background thread; the limit is read
// when it may have changed: after the program's setrlimit or prlimit (our shims: Python's
// resource.setrlimit comes at any time), at every background pass (another process's prlimit),
// and when a mapping fails. (2) When
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
// background pass has seen a limit.
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
// resident (hot) and lazily freed bytes so RSS can be read against them.

use super::cache::{BlockCache, CacheLimits, Inserted, Live, PageFacts, Part, Parts, Taken};
use super::tally::{CallTimer, Tally};
use super::registry::{Birth, Marks, Owner, PageChange, Registry};
use crate::backing::{Moved, PageMemory, Presence, TableSource, BLOCK_ALIGN};
use crate::config::{Config, HugePages, Release, MAX_CACHE_BLOCKS};
use crate::ranges::{Range, RangeList};
use crate::record::stats::{HostStats, PhaseTimer};
use crate::record::{self, Block, Found};
use crate::sys::lock::{Gate, Guard, Lock, Pass};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};

pub const PAGE: usize = 4096;
const HUGE_PAGE: usize = 2 << 20;
/// Blocks from this size up are aligned and rounded to huge pages under `HugePages::Auto`
/// (numpy asks for huge pages from 4 MiB up).
const HUGE_MIN: usize = 4 << 20;
/// From this many bytes a calloc hit may discard pages instead of writing zeros.
const DISCARD_MIN: usize = 1 << 20;
/// The byte bound never follows the live peak below this (the fixed bound it replaced).
const MIN_FOLLOWED_BYTES: usize = 1 << 30;
/// The block bound never follows the live peak below this.
const MIN_FOLLOWED_BLOCKS: usize = 16;

/// What the background thread offers the layer.
pub struct Background {
    /// After a block entered the cache, outside the lock, with the time it is first due
    /// (starts the thread, or wakes it when it sleeps past that).
    pub on_cached: fn(u64),
    /// Whether a thread runs that will unmap deferred blocks (Note [Deferred unmaps]).
    pub running: fn() -> bool,
    /// Wakes it: the deferred list went from empty to not.
    pub wake: fn(),
}

pub struct HostLayer<M: PageMemory> {
    memory: M,
    registry: Registry,
    cache: Lock<BlockCache>,
    /// Ranges out of the cache's records and not yet unmapped (Note [Fork at the fork]).
    transit: Gate,
    /// A fork is under way: the cache's blocks are kept from the child (Note [Fork at the fork]).
    forking: AtomicBool,
    /// TENSORMALLOC_RESET=always (Note [Pages the program changed]).
    reset_always: AtomicBool,
    /// The process's own votes, beside each block's (Note [calloc costs what is touched]).
    calloc_votes: AtomicU8,
    threshold_bytes: AtomicUsize,
    /// Large requests come here (TENSORMALLOC_DISABLE turns it off, tm_set_enabled at run time).
    enabled: AtomicBool,
    hugepages: AtomicU8,
    /// What the process may map (`limit_address_space`); u64::MAX without a limit.
    address_space_bytes: AtomicU64,
    /// How idle blocks give their pages back (`Release` as a code).
    release: AtomicU8,
    /// The process that last held the cache across a fork, and the forked child that has
    /// forgotten its parent's cache (Note [Fork handlers that allocate]).
    fork_pid: AtomicU32,
    forgotten_in: AtomicU32,
    /// Timestamps: when a block was born, freed, due (the coarse clock: Note [Timing one call
    /// in 64] in host/tally.rs).
    clock: fn() -> u64,
    /// The timing table's clock (precise).
    precise: fn() -> u64,
    background: Background,
    pub stats: HostStats,
}

/// The address space a mapping of `len` bytes on `align` takes before it is trimmed: an
/// alignment past a huge page's is had by mapping that much more (OsPages::map); up to it, the
/// kernel's own placement of huge-page multiples usually gives it for nothing.
fn mapping_span(len: usize, align: usize) -> usize {
    if align > HUGE_PAGE {
        len.saturating_add(align - PAGE)
    } else {
        len
    }
}


/// A process id no process has (fork_pid, forgotten_in before any fork).
const NO_PROCESS: u32 = u32::MAX;

/// The cache's limits: a bound the user set is exact; without one, bounds follow the live peak
/// up to a ceiling of a quarter of `memory_bytes` (Note [Bounds follow the working set]) and an
/// eighth of `address_space_bytes` (Note [Room for others]).
const fn limits_from(c: &Config, memory_bytes: u64, address_space_bytes: u64) -> CacheLimits {
    let ceiling = {
        let (memory, space) = (memory_bytes / 4, address_space_bytes / 8);
        if memory < space {
            memory
        } else {
            space
        }
    };
    let (max_blocks, follow_blocks) = match c.cache_blocks {
        Some(n) => (n, false),
        None => (MAX_CACHE_BLOCKS, true),
    };
    let (max_bytes, follow_bytes) = match c.cache_bytes {
        Some(n) => (n as usize, false),
        None => (ceiling as usize, true),
    };
    CacheLimits {
        max_blocks,
        max_bytes,
        follow_blocks,
        follow_bytes,
        min_blocks: MIN_FOLLOWED_BLOCKS,
        min_bytes: MIN_FOLLOWED_BYTES,
        release_after_ns: c.release_ms.saturating_mul(1_000_000),
        expire_after_ns: c.expire_ms.saturating_mul(1_000_000),
        max_waste_percent: match c.max_waste_percent {
            Some(p) => Some(p as usize),
            None => None,
        },
    }
}

fn hugepages_code(h: HugePages) -> u8 {
    match h {
        HugePages::Auto => 0,
        HugePages::Always => 1,
        HugePages::Never => 2,
    }
}

impl<M: PageMemory> HostLayer<M> {
    /// `clock` gives the timestamps (when blocks are born, freed and due); the timing table
    /// reads the precise monotonic clock.
    pub const fn new(memory: M, table_source: TableSource, clock: fn() -> u64, background: Background) -> Self {
        const DEFAULTS: CacheLimits = limits_from(&Config::DEFAULT, 4 << 30, u64::MAX);
        HostLayer {
            memory,
            registry: Registry::new(table_source),
            cache: Lock::new(BlockCache::new(DEFAULTS)),
            transit: Gate::new(),
            forking: AtomicBool::new(false),
            reset_always: AtomicBool::new(false),
            calloc_votes: AtomicU8::new(0),
            threshold_bytes: AtomicUsize::new(Config::DEFAULT.threshold_bytes as usize),
            enabled: AtomicBool::new(false),
            address_space_bytes: AtomicU64::new(u64::MAX),
            release: AtomicU8::new(0),
            fork_pid: AtomicU32::new(NO_PROCESS),
            forgotten_in: AtomicU32::new(NO_PROCESS),
            hugepages: AtomicU8::new(0),
            clock,
            precise: crate::sys::clock::now_ns,
            background,
            stats: HostStats::new(),
        }
    }

    /// Whether large requests come here (the route sends them by this).
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// Turns the cache on or off for new requests; returns the previous setting. The caller
    /// trims after turning it off, once requests no longer come.
    pub fn swap_enabled(&self, on: bool) -> bool {
        self.enabled.swap(on, Relaxed)
    }

    /// `memory_bytes`: what the process may use (physical memory, or its cgroup's limit).
    /// The address-space limit comes later, from `limit_address_space`.
    pub fn configure(&self, config: &Config, memory_bytes: u64) {
        self.threshold_bytes.store(config.threshold_bytes as usize, Relaxed);
        self.enabled.store(!config.disabled, Relaxed);
        self.hugepages.store(hugepages_code(config.hugepages), Relaxed);
        self.release.store(config.release as u8, Relaxed);
        self.reset_always.store(config.reset_always, Relaxed);
        self.cache().set_limits(limits_from(config, memory_bytes, self.address_space_bytes.load(Relaxed)));
    }

    /// The process may map no more than `bytes` (RLIMIT_AS, a strict commit limit; u64::MAX
    /// for none): the cache's ceiling becomes an eighth of it, unless the user set the bound,
    /// and nothing leaving the cache waits to be unmapped (Note [Room for others]).
    /// A lower limit takes effect at once: the cache is cut to its new ceiling and the deferred
    /// unmaps are done before this returns (the program's next mmap or thread must find the room
    /// glibc's free would have left).
    pub fn limit_address_space(&self, bytes: u64) {
        let was = self.address_space_bytes.swap(bytes, Relaxed);
        self.unmap_lists(|cache| {
            let limits = *cache.limits();
            let ceiling = usize::try_from(bytes / 8).unwrap_or(usize::MAX);
            if limits.follow_bytes {
                cache.set_limits(CacheLimits { max_bytes: limits.max_bytes.min(ceiling), ..limits });
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

    /// Requests of at least `bytes` come here from now on (mallopt's M_MMAP_THRESHOLD); the
    /// route follows it.
    pub fn set_threshold_bytes(&self, bytes: usize) {
        self.threshold_bytes.store(bytes, Relaxed);
    }

    /// The cache keeps at most `bytes` from now on, an exact bound (mallopt's
    /// M_TRIM_THRESHOLD); holding more, it is emptied now.
    pub fn set_cache_bytes(&self, bytes: usize) {
        {
            let mut cache = self.cache();
            let limits = *cache.limits();
            cache.set_limits(CacheLimits { max_bytes: bytes, follow_bytes: false, ..limits });
        }
        if self.cached().1 > bytes {
            self.trim();
        }
    }

    pub fn threshold_bytes(&self) -> usize {
        self.threshold_bytes.load(Relaxed)
    }

    /// Copies between blocks we own (realloc moving a block out of the host layer).
    pub fn memory_copy(&self, dst: usize, src: usize, len: usize) {
        self.memory.copy(dst, src, len);
    }

    pub fn owner(&self, addr: usize) -> Owner {
        self.registry.owner(addr)
    }

    /// See Registry::may_contain.
    #[inline(always)]
    pub fn may_contain(&self, addr: usize) -> bool {
        self.registry.may_contain(addr)
    }

    /// The start of the live or cached block containing `addr` (see Registry::block_containing).
    pub fn block_containing(&self, addr: usize) -> Option<usize> {
        self.registry.block_containing(addr)
    }

    /// The mapped length for a request, and the alignment every mapping of that length gets.
    /// Lengths are multiples of BLOCK_ALIGN too, so every split and every shrunk tail of a block
    /// keeps block starts on BLOCK_ALIGN.
    fn block_shape(&self, size: usize) -> Option<(usize, usize)> {
        let huge = self.hugepages.load(Relaxed) != hugepages_code(HugePages::Never) && size >= HUGE_MIN;
        let granule = if huge { HUGE_PAGE } else { BLOCK_ALIGN };
        Some((size.checked_add(granule - 1)? & !(granule - 1), granule))
    }

    fn timed<T>(&self, phase: &PhaseTimer, f: impl FnOnce() -> T) -> T {
        crate::record::stats::timed_by(self.precise, phase, f)
    }

    fn unmap_all(&self, ranges: &RangeList) {
        self.unmap_timed(ranges, &self.stats.phases.free_unmap);
    }

    fn unmap_timed(&self, ranges: &RangeList, phase: &PhaseTimer) {
        for r in ranges.iter() {
            self.timed(phase, || self.memory.unmap(r.addr, r.len));
            self.stats.unmapped_blocks.add(1);
            self.stats.unmapped_bytes.add(r.len as u64);
        }
    }

    /// Under the cache lock: ranges leaving the records for the kernel are in transit until the
    /// guard drops (Note [Fork at the fork]).
    fn transit(&self) -> Pass<'_> {
        self.transit.enter()
    }

    /// Under the cache lock: puts ranges leaving us on the deferred list (Note [Deferred
    /// unmaps]); returns those the caller must unmap itself, and whether to wake the thread.
    fn defer_unmaps(&self, cache: &mut BlockCache, ranges: &RangeList) -> (RangeList, bool, Pass<'_>) {
        let mut inline = RangeList::new();
        let was_empty = cache.deferred_bytes() == 0;
        // Under an address-space limit the room is needed now, not when the thread wakes.
        let running = (self.background.running)() && self.address_space_bytes.load(Relaxed) == u64::MAX;
        for r in ranges.iter() {
            if !(running && cache.defer_unmap(*r)) {
                inline.push(*r);
            }
        }
        self.stats.deferred.set(cache.deferred_bytes() as u64);
        (inline, was_empty && cache.deferred_bytes() > 0, self.transit())
    }

    /// After the lock: unmaps what could not wait and wakes the thread for the rest.
    fn finish_unmaps(&self, (inline, wake, transit): (RangeList, bool, Pass<'_>)) {
        self.unmap_all(&inline);
        drop(transit);
        if wake {
            (self.background.wake)();
        }
    }

    /// Unmaps the deferred list now (the background thread, trim, memory short); returns bytes.
    fn unmap_deferred(&self) -> usize {
        let (deferred, transit) = {
            let mut cache = self.cache();
            let d = cache.take_deferred();
            self.stats.deferred.set(0);
            (d, self.transit())
        };
        self.unmap_timed(&deferred, &self.stats.phases.deferred_unmap);
        drop(transit);
        deferred.total_bytes()
    }

    /// The cache's block and byte bounds now, for the report.
    pub fn bounds(&self) -> (usize, usize) {
        self.cache().bounds()
    }

    /// Bytes waiting to be unmapped by the background thread.
    pub fn deferred_bytes(&self) -> usize {
        self.cache().deferred_bytes()
    }

    /// calloc on a reused range of `len` bytes that may hold data, of which the program asked
    /// for the first `asked`, with `votes` (Note [calloc costs what is touched]); returns its
    /// votes after. The rest reads zero too: malloc_usable_size promises it to the program, and
    /// glibc's calloc zeroes it. It is dropped rather than written: a program rarely touches it.
    fn zero_reused(&self, addr: usize, asked: usize, len: usize, votes: u8) -> u8 {
        let head = asked.checked_add(PAGE - 1).map_or(len, |a| a & !(PAGE - 1)).min(len);
        self.timed(&self.stats.phases.alloc_zero, || {
            use super::cache::{votes_after, votes_after_write, zero_by_discard};
            let mut votes = votes;
            let process = self.calloc_votes.load(Relaxed);
            if head >= DISCARD_MIN {
                let dropped = if zero_by_discard(head, votes.max(process), DISCARD_MIN) { self.memory.discard_weighed(addr, head) } else { None };
                match dropped {
                    Some(found) => {
                        self.stats.zeroed_by_discard.add(1);
                        votes = votes_after(votes, Some(found));
                        self.calloc_votes.store(votes_after(process, Some(found)), Relaxed);
                    }
                    None => {
                        let resident = self.memory.zero_weighed(addr, head);
                        votes = votes_after_write(votes, resident);
                        self.calloc_votes.store(votes_after_write(process, resident), Relaxed);
                    }
                }
            } else if head > 0 {
                self.memory.zero(addr, head);
            }
            // A tail shorter than BLOCK_ALIGN (a mid-size request's rounding) is written: dropping
            // it costs a system call, and the next request that reaches its pages faults.
            let tail = len - head;
            if tail > 0 && (tail < BLOCK_ALIGN || !self.memory.discard(addr + head, tail)) {
                self.memory.zero(addr + head, tail);
            }
            votes
        })
    }

    /// Makes a block taken from the cache ready for the program (its record says live, or
    /// will once it is readmitted): inherited by forked children again if a fork kept it from
    /// them (Note [Fork at the fork]), locked under mlockall(MCL_FUTURE) (Note [Locked
    /// memory]). Returns what is then known of its pages; `None` when the kernel refused: the
    /// block is unmapped (its record goes) and the request is served otherwise. Note [Plain
    /// memory].
    fn make_fit(&self, addr: usize, len: usize, facts: PageFacts) -> Option<PageFacts> {
        if facts.kept_any && !self.memory.readmit(addr, len) {
            return self.drop_taken(addr, len);
        }
        if let Some(on_fault) = self.memory.future_locking() {
            // A refusal (RLIMIT_MEMLOCK) leaves the block as glibc's mmap would have failed to
            // make it: the request is served otherwise, or fails as it would have.
            if !self.memory.lock(addr, len, on_fault) {
                return self.drop_taken(addr, len);
            }
        }
        Some(PageFacts { kept_all: false, kept_any: false, ..facts })
    }

    /// A block taken from the cache that cannot be handed out: unmapped, its record gone.
    fn drop_taken(&self, addr: usize, len: usize) -> Option<PageFacts> {
        self.registry.clear(addr);
        self.memory.unmap(addr, len);
        self.stats.unmapped_blocks.add(1);
        self.stats.unmapped_bytes.add(len as u64);
        None
    }

    /// A large block of at least `size` bytes starting at a multiple of `align` (a power of
    /// two); zero-filled when `zeroed`; `holder` is its holder word (Note [Holders]). `None`
    /// means out of memory.
    pub fn alloc(&self, size: usize, align: usize, zeroed: bool, holder: u64) -> Option<usize> {
        let mut timer = CallTimer::begin(self.stats.requests.get(), self.precise);
        let birth = Birth { ns: (self.clock)(), holder };
        let out = self.alloc_untimed(size, align, zeroed, birth, &mut timer);
        let (addr, len, found) = match out {
            Some(o) => o,
            None => {
                timer.exact(self.precise);
                timer.finish(self.precise, &[&self.stats.phases.alloc]);
                return None;
            }
        };
        record::alloc(Block::host(addr as u64, len as u64, size as u64, holder), found);
        let phases = &self.stats.phases;
        if found == Found::Hit {
            timer.finish(self.precise, &[&phases.alloc, &phases.alloc_hit]);
        } else {
            timer.finish(self.precise, &[&phases.alloc]);
        }
        Some(addr)
    }

    // Note [One recording point] (record/mod.rs): a block's event is recorded in alloc,
    // record_free and record_resize, with its mapped length; beside it, the live figures the
    // cache's bounds follow, in the tally (Note [Figures under the lock] in host/tally.rs).

    /// A block mapped or gathered outside the lock became live: asked for `size` bytes by
    /// `birth`.
    fn went_live(&self, addr: usize, len: usize, size: usize, birth: Birth) {
        self.registry.set_asked(addr, size as u64);
        let mut cache = self.cache();
        cache.tally.went_live(len);
        cache.book.alloc(Block::host(addr as u64, len as u64, size as u64, birth.holder), birth.ns);
        cache.tally.publish(&self.stats);
    }

    /// A taken block, counted as a hit, is live under the lock.
    fn hit_went_live(&self, cache: &mut BlockCache, t: &Taken, size: usize, birth: Birth) {
        Self::count_hit(&mut cache.tally, t);
        self.registry.set_asked(t.addr, size as u64);
        cache.book.alloc(Block::host(t.addr as u64, t.len as u64, size as u64, birth.holder), birth.ns);
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

    /// The block, its mapped length and how it was found.
    fn alloc_untimed(&self, size: usize, align: usize, zeroed: bool, birth: Birth, timer: &mut CallTimer) -> Option<(usize, usize, Found)> {
        let Some((need, granule)) = self.block_shape(size) else {
            let mut cache = self.cache();
            cache.tally.requests += 1;
            cache.tally.publish(&self.stats);
            return None;
        };
        let align = align.max(BLOCK_ALIGN);
        let tag = holder_tag(birth.holder);
        let taken = {
            let mut cache = self.cache();
            cache.tally.requests += 1;
            let taken = cache.take(need, align, tag);
            let mut counted = false;
            if let Some(t) = &taken {
                // The leaf exists: the block was recorded as cached. One still kept from
                // children is recorded only once readmitted (Note [Fork at the fork]).
                if t.facts.kept_any {
                    self.registry.clear(t.addr);
                } else {
                    let _ = self.registry.set_live(t.addr, t.len, birth);
                }
                if let Some(tail) = t.tail_kept {
                    let _ = self.registry.set_cached(tail.addr, tail.len);
                }
                self.stats.cached.set(cache.cached_bytes() as u64);
                // A block that make_fit may still drop is counted once it is fit.
                counted = !t.facts.kept_any && self.memory.future_locking().is_none();
                if counted {
                    self.hit_went_live(&mut cache, t, size, birth);
                }
            }
            cache.tally.publish(&self.stats);
            taken.map(|t| (t, counted))
        };
        let taken = taken.and_then(|(t, counted)| {
            if !counted {
                timer.exact(self.precise);
            }
            let Some(facts) = self.make_fit(t.addr, t.len, t.facts) else {
                if counted {
                    // mlockall came meanwhile, and the lock was refused: the block left.
                    let mut cache = self.cache();
                    cache.tally.left(t.len);
                    cache.book.free(Block::host(t.addr as u64, t.len as u64, size as u64, birth.holder), birth.ns);
                    cache.tally.publish(&self.stats);
                }
                return None;
            };
            // Cannot fail: its leaf exists.
            if t.facts.kept_any && !self.registry.set_live(t.addr, t.len, birth) {
                self.memory.unmap(t.addr, t.len);
                return None;
            }
            if !counted {
                let mut cache = self.cache();
                self.hit_went_live(&mut cache, &t, size, birth);
                cache.tally.publish(&self.stats);
            }
            Some(Taken { facts, ..t })
        });
        if let Some(t) = taken {
            let mut votes = t.facts.votes;
            if zeroed && !t.facts.zero {
                timer.exact(self.precise);
                votes = self.zero_reused(t.addr, size, t.len, votes);
            }
            // What the block carries on (a fresh record has neither): its votes, its advice.
            if votes != 0 || t.facts.advised_by != 0 {
                let marks = Marks::default().with_votes(votes);
                self.registry.keep_marks(t.addr, if t.facts.advised_by == 0 { marks } else { marks.with_huge() });
            }
            return Some((t.addr, t.len, Found::Hit));
        }

        timer.exact(self.precise);
        if let Some((addr, dirty)) = self.gather_cached(need, align.max(granule), birth) {
            if zeroed {
                // Only the moved parts may hold data; the rest of the mapping is fresh.
                for part in dirty.iter() {
                    self.zero_reused(part.addr, (addr + size).saturating_sub(part.addr).min(part.len), part.len, 0);
                }
            }
            self.went_live(addr, need, size, birth);
            return Some((addr, need, Found::Grown));
        }
        self.stats.misses.add(1);
        let addr = self.timed(&self.stats.phases.alloc_map, || self.map_fresh(need, align.max(granule)))?;
        if !self.registry.set_live(addr, need, birth) {
            self.memory.unmap(addr, need);
            self.stats.map_failures.add(1);
            return None;
        }
        self.went_live(addr, need, size, birth);
        Some((addr, need, Found::Miss))
    }

    /// Under the cache lock: a block taken from the cache is live.
    fn count_hit(tally: &mut Tally, t: &Taken) {
        tally.hits += 1;
        tally.hit_bytes += t.len as u64;
        tally.hits_after_release += u64::from(t.was_released);
        tally.splits += u64::from(t.tail_kept.is_some());
        tally.went_live(t.len);
    }

    /// A miss that cached blocks can still serve together: their pages move into a fresh
    /// mapping of the needed size, so only what they do not cover faults in (Note [Gathering
    /// pages]). Returns the block and the ranges in it that may hold data.
    fn gather_cached(&self, need: usize, align: usize, birth: Birth) -> Option<(usize, RangeList)> {
        let parts = {
            let mut cache = self.cache();
            let parts = cache.take_parts(need, holder_tag(birth.holder));
            for part in parts.iter() {
                self.registry.clear(part.addr);
            }
            if let Some(rest) = parts.rest_kept {
                let _ = self.registry.set_cached(rest.addr, rest.len);
            }
            self.stats.cached.set(cache.cached_bytes() as u64);
            parts
        };
        if parts.is_empty() {
            return None;
        }
        self.timed(&self.stats.phases.alloc_grow, || self.move_into_new_mapping(&parts, need, align, birth))
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

    /// A fresh mapping whose record cannot fail (the registry's spare leaf is reserved first),
    /// advised for huge pages under `HugePages::Always`.
    fn map_recordable(&self, len: usize, align: usize) -> Option<usize> {
        let addr = self.registry.reserve_spare().then(|| self.memory.map(len, align)).flatten()?;
        if self.hugepages.load(Relaxed) == hugepages_code(HugePages::Always) {
            self.memory.advise_huge(addr, len);
        }
        Some(addr)
    }

    /// A fresh mapping; when the system refuses it, the cache is emptied (if that can help) and
    /// the mapping retried.
    fn map_fresh(&self, len: usize, align: usize) -> Option<usize> {
        let addr = self.map_recordable(len, align).or_else(|| self.make_room(mapping_span(len, align)).then(|| self.map_recordable(len, align)).flatten());
        if addr.is_none() {
            self.stats.map_failures.add(1);
        }
        addr
    }

    /// After a request of `len` bytes failed for want of memory (ours, or the next allocator's):
    /// empties the cache when the request could then succeed (Note [Room for others]). True
    /// when something was given back: the caller tries once more.
    pub fn make_room(&self, len: usize) -> bool {
        if !self.memory.could_map(len) || self.trim() == 0 {
            return false;
        }
        self.stats.retries_after_trim.add(1);
        true
    }

    /// Whether a mapping of `len` bytes on `align` could succeed under the limits were nothing
    /// of ours mapped (PageMemory::could_map). A request no memory could satisfy (its size or
    /// its alignment) is a probe, not a shortage: it leaves the cache alone.
    pub fn could_map(&self, len: usize, align: usize) -> bool {
        self.memory.could_map(mapping_span(len, align))
    }

    /// Whether the cache or the deferred list holds anything `make_room` could give back.
    pub fn holds_idle_memory(&self) -> bool {
        self.idle_bytes() > 0
    }

    /// Bytes cached or waiting to be unmapped.
    pub fn idle_bytes(&self) -> usize {
        let cache = self.cache();
        cache.cached_bytes() + cache.deferred_bytes()
    }

    /// Takes back a live block (`owner` said `Live { len }`).
    pub fn free(&self, addr: usize, len: usize) {
        let mut timer = CallTimer::begin(self.stats.frees.get(), self.precise);
        let now = (self.clock)();
        let (birth, asked, marks) = self.registry.live_record(addr);
        let holder = birth.holder;
        let block = Block::host(addr as u64, len as u64, asked, holder);
        record::free(block);
        // Note [Pages the program changed]: most blocks need no system call here.
        let reset = marks.changed() || self.reset_always.load(Relaxed);
        if reset || marks.no_huge() {
            timer.exact(self.precise);
        }
        let facts = PageFacts { votes: marks.votes(), advised_by: if marks.huge() { holder_tag(holder) } else { 0 }, ..PageFacts::DIRTY };
        let kept = if marks.replaced() {
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
            self.cache_block(addr, len, facts, now, Some(block), &mut timer);
        } else {
            // Never reused: part of it is gone or it is sealed. Whatever is still ours goes.
            timer.exact(self.precise);
            {
                let mut cache = self.cache();
                cache.tally.frees += 1;
                cache.tally.left(len);
                cache.book.free(block, now);
                cache.tally.publish(&self.stats);
            }
            self.registry.clear(addr);
            self.unmap_all(&single(Range { addr, len }));
            self.stats.unresettable.add(1);
        }
        timer.finish(self.precise, &[&self.stats.phases.free]);
    }

    /// Offers a block that is ours and in no record (a freed one, or a part that could not be
    /// gathered) to the cache at time `now_ns`; unmaps what leaves it. `freed`: the program
    /// freed it, this live block (it leaves; the bounds follow what was live before).
    fn cache_block(&self, addr: usize, len: usize, facts: PageFacts, now_ns: u64, freed: Option<Block>, timer: &mut CallTimer) {
        let (accepted, due_ns) = {
            let mut cache = self.cache();
            // Live before this free: the bounds follow its peak, reached just before some free.
            let live = if freed.is_some() { Live { bytes: cache.tally.live_bytes as usize, blocks: cache.tally.live_blocks as usize } } else { Live::default() };
            if let Some(block) = freed {
                cache.tally.frees += 1;
                cache.tally.left(len);
                cache.book.free(block, now_ns);
            }
            let due_ns = now_ns.saturating_add(cache.limits().release_after_ns.min(cache.limits().expire_after_ns));
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
            if inserted.evicted > 0 || !inserted.accepted {
                timer.exact(self.precise);
                self.unmap_leaving(cache, &inserted);
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

    /// Resizes a live large block to `new_size` (at or above the threshold): in place when it
    /// fits, by mremap otherwise (no copy), by copying as a last resort. `None` leaves the
    /// block as it was.
    pub fn resize(&self, addr: usize, len: usize, new_size: usize) -> Option<usize> {
        let start = (self.precise)();
        let out = self.resize_untimed(addr, len, new_size);
        self.stats.phases.realloc.record((self.precise)().saturating_sub(start));
        out
    }

    fn resize_untimed(&self, addr: usize, len: usize, new_size: usize) -> Option<usize> {
        let (need, granule) = self.block_shape(new_size)?;
        let (born, was_asked, marks) = self.registry.live_record(addr);
        if need <= len {
            let spare = len - need;
            // Kept whole when the spare is too small to give back.
            let cut = spare > len / 100 * self.cache().waste_percent();
            if cut {
                let _ = self.registry.set_live(addr, need, born);
                self.registry.keep_marks(addr, marks);
                let tail = Range { addr: addr + need, len: spare };
                if !marks.changed() && !marks.replaced() && !marks.no_huge() {
                    // Plain pages, written before: cached like a freed block (a page heap keeps
                    // what a realloc cut off; unmapped, its pages faulted in again at the next
                    // request that reached them). Note [Locked memory]: never cached locked.
                    if self.memory.future_locking().is_some() {
                        self.memory.unlock(tail.addr, tail.len);
                    }
                    let facts = PageFacts { advised_by: if marks.huge() { holder_tag(born.holder) } else { 0 }, ..PageFacts::DIRTY };
                    self.cache_block(tail.addr, tail.len, facts, (self.clock)(), None, &mut CallTimer::untimed());
                } else {
                    // Note [Plain memory]: pages the program changed are not cached unreset.
                    let unmaps = self.defer_unmaps(&mut self.cache(), &single(tail));
                    self.finish_unmaps(unmaps);
                }
            }
            self.record_resize((addr, len, was_asked), (addr, if cut { need } else { len }), new_size, born);
            return Some(addr);
        }
        if self.registry.reserve_spare() {
            self.registry.clear(addr);
            // Not mremap's MAYMOVE: it would put the block on any page, not on its alignment.
            let moved = if self.memory.extend(addr, len, need) { Some(addr) } else { self.memory.grow_into(addr, len, need, granule) };
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
        // of the block): copy instead.
        let fresh = self.alloc(new_size, PAGE, false, born.holder)?;
        self.memory.copy(fresh, addr, len);
        self.free(addr, len);
        Some(fresh)
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
                (list, self.transit())
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
        let bytes = self.unmap_lists(BlockCache::drain);
        bytes + self.unmap_deferred()
    }

    /// Releases and expires idle blocks; returns when it next has work (monotonic ns).
    pub fn reap(&self) -> Option<u64> {
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
                (due || lazy) && self.memory.near_limit()
            }
        };
        let (due, transit) = {
            let mut cache = self.cache();
            let due = cache.due(now, drop_pages);
            for r in due.expire.iter() {
                self.registry.clear(r.addr);
            }
            self.stats.cached.set(cache.cached_bytes() as u64);
            (due, self.transit())
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
            (doomed, cache.next_deadline_ns(), self.transit())
        };
        self.unmap_all(&doomed);
        drop(transit);
        // While it holds idle memory, the background pass (which reads the address-space limit
        // first) comes at least once a second: a limit another process lowers with prlimit, or
        // the program with a raw system call, is seen within one (Note [Room for others]).
        if self.holds_idle_memory() {
            let poll = (self.clock)().saturating_add(LIMIT_POLL_NS);
            return Some(deadline.map_or(poll, |d| d.min(poll)));
        }
        deadline
    }

    /// Every live block: (address, mapped length, birth); for the reports.
    pub fn for_each_live(&self, f: impl FnMut(usize, usize, Birth)) {
        self.registry.for_each_live(f);
    }

    /// Cached bytes by what they cost in RSS: (hot, lazily freed); see BlockCache::resident_split.
    pub fn cached_resident(&self) -> (usize, usize) {
        self.cache().resident_split()
    }

    /// Cached blocks and bytes now, for the stats API.
    pub fn cached(&self) -> (usize, usize) {
        let cache = self.cache();
        (cache.block_count(), cache.cached_bytes())
    }

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
        self.stats.cached.set(0);
        cache.tally.restart();
        self.forget_blocks_kept_from_children(cache);
        cache.tally.publish(&self.stats);
        self.stats.deferred.set(0);
    }

    /// In a forked child: a live block the program advised MADV_DONTFORK is not here (wholly or
    /// in part). Its record goes when its first page is missing (a free of it then fails as under
    /// glibc alone, and a mapping the child makes there is never taken for ours); a block missing
    /// only in part is never reused (its free unmaps what is left).
    fn forget_blocks_kept_from_children(&self, cache: &mut BlockCache) {
        self.registry.for_each_kept_from_children(|addr, len| match self.memory.presence(addr, len) {
            Presence::All => {}
            Presence::Part => self.registry.note_change(addr, len, PageChange::Replaced),
            Presence::None => {
                let asked = self.registry.asked(addr);
                let holder = self.registry.birth(addr).holder;
                self.registry.clear(addr);
                cache.tally.left(len);
                let block = Block::host(addr as u64, len as u64, asked, holder);
                cache.book.forgotten(block, (self.clock)());
                record::forgotten(block);
            }
        });
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

    /// The cache, locked (Note [Fork handlers that allocate]).
    #[inline]
    fn cache(&self) -> Guard<'_, BlockCache> {
        let mut cache = self.cache.lock();
        if cache.reentered() {
            self.entered_during_fork(&mut cache);
        }
        cache
    }

    #[cold]
    #[inline(never)]
    fn entered_during_fork(&self, cache: &mut BlockCache) {
        let pid = self.memory.process_id();
        if pid != self.fork_pid.load(Relaxed) && self.forgotten_in.swap(pid, Relaxed) != pid {
            self.forget_blocks_of_parent(cache);
        }
    }

    /// Calls `f(addr, len)` for each of our own tables (Note [Locked memory]).
    pub fn for_each_table(&self, f: impl FnMut(usize, usize)) {
        self.registry.for_each_table(f);
    }

    /// The program changes the pages of [addr, addr+len) through libc: the live blocks there
    /// are reset, or unmapped when replaced, at their free (Note [Pages the program changed]).
    #[inline]
    pub fn note_page_change(&self, addr: usize, len: usize, change: PageChange) {
        self.registry.note_change(addr, len, change);
    }

    /// Takes the cache lock and keeps it: the fork handlers hold it across fork(). The cache is
    /// kept from the child (Note [Fork at the fork]).
    pub fn lock_for_fork(&self) {
        self.fork_pid.store(self.memory.process_id(), Relaxed);
        self.cache.lock_for_fork();
        self.forking.store(true, Relaxed);
        // Asleep, not spinning: the threads it waits for may need this CPU.
        self.transit.wait_empty(self.clock, (self.clock)().saturating_add(TRANSIT_WAIT_NS));
        let mut cache = self.cache(); // this thread's again: it holds the lock
        cache.keep_from_fork(|r| {
            self.memory.keep_from_fork(r.addr, r.len);
        });
        for r in cache.deferred().iter() {
            self.memory.keep_from_fork(r.addr, r.len);
        }
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

    #[cfg(test)]
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let cache = self.cache();
        cache.check_invariants()?;
        let deferred = cache.deferred();
        for r in deferred.iter() {
            if self.registry.owner(r.addr) != Owner::Foreign {
                return Err("a block waiting to be unmapped is still in the registry");
            }
        }
        for b in cache.blocks() {
            if b.addr % BLOCK_ALIGN != 0 || b.len % BLOCK_ALIGN != 0 {
                return Err("a cached block is off BLOCK_ALIGN (free's fast path would miss it)");
            }
            if self.registry.owner(b.addr) != Owner::Cached {
                return Err("a cached block is not recorded as cached");
            }
            if self.registry.block_containing(b.addr + b.len - 1) != Some(b.addr) || self.registry.block_containing(b.addr + b.len) == Some(b.addr) {
                return Err("a cached block's tail does not lead back to its start");
            }
        }
        Ok(())
    }
}

/// The longest the background pass waits while the cache holds something (Note [Room for
/// others]).
const LIMIT_POLL_NS: u64 = 1_000_000_000;

/// How long a fork waits for ranges in transit (Note [Fork at the fork]).
const TRANSIT_WAIT_NS: u64 = 100_000_000;

/// The tag of the library a holder word names, as a cached block's advice records it (Note
/// [Huge-page advice]): never 0.
fn holder_tag(holder: u64) -> u32 {
    u32::from(crate::record::holders::id_of(holder)) + 1
}

fn single(r: Range) -> RangeList {
    push(RangeList::new(), r)
}

fn push(mut list: RangeList, r: Range) -> RangeList {
    list.push(r);
    list
}

#[cfg(test)]
mod tests;
