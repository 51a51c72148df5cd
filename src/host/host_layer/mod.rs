//! The host layer: serves large requests from the block cache or fresh mappings, takes large
//! blocks back, and releases idle ones. Generic over `PageMemory` and the clock so tests drive
//! it over simulated memory. The cache lock is never held across a call into `PageMemory`:
//! decisions are made under the lock, system calls happen after it is dropped.
//! This file holds the layer's state, its set-up and configuration, the cache lock and what the
//! reports read, and the Notes on the pages of a block (plain, advised, locked, changed); one room
//! per concept beside it: `alloc` (serving a request), `gather` (a miss served by cached pages),
//! `free` (a block back, and what leaves the cache), `slots` (a block into its thread's slot and
//! back), `resize` (realloc), `release` (idle release, trim, room for others), `fork` (the cache
//! across fork()), `claim` (ranges the program maps over or unmaps).
//
// Note [Plain memory]
// A block we hand out is plain memory whatever its previous owner did to its pages: read-write
// (a JIT's read+exec buffer, a PROT_NONE guard page, a protection key), not locked, no guard
// regions, dumped, and inherited by forked children (MADV_DONTFORK, MADV_WIPEONFORK). glibc gets
// this for free by unmapping every large block at free. We restore it when the program frees a
// block whose pages it changed (`reset_for_cache`: pkey_mprotect, munlock, five madvise calls;
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

use super::cache::{BlockCache, CacheLimits};
use super::registry::{Birth, Owner, PageChange, Registry};
use super::thread_slots::ThreadSlots;
use crate::backing::{PageMemory, TableSource, BLOCK_ALIGN, PAGE};
use crate::config::{Config, HugePages, MAX_CACHE_BLOCKS};
use crate::ranges::{Range, RangeList};
use crate::record::stats::{HostStats, PhaseTimer};
use crate::sys::lock::{Gate, Guard, Lock};
use transit::Transit;
use core::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};

mod alloc;
mod claim;
mod fork;
mod free;
mod gather;
mod release;
mod resize;
mod slots;
mod transit;

const HUGE_PAGE: usize = 2 << 20;
/// Blocks from this size up are aligned and rounded to huge pages under `HugePages::Auto`
/// (numpy asks for huge pages from 4 MiB up).
const HUGE_MIN: usize = 4 << 20;
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
    /// Ranges out of the cache's records and not yet unmapped (Note [Ranges in transit]).
    transit: Transit,
    /// The background pass is releasing blocks, which a trim meanwhile leaves it to unmap
    /// (Note [Room for others], rule 7).
    releasing: Gate,
    /// The background pass's madvise calls are under way (outside every lock): a claim waits
    /// for them before it unmaps a block being released (Note [Ranges the program claims]).
    advising: Gate,
    /// A fork is under way: the cache's blocks are kept from the child (Note [Fork at the fork]).
    forking: AtomicBool,
    /// TENSORMALLOC_RESET=always (Note [Pages the program changed]).
    reset_always: AtomicBool,
    /// The process's own votes, beside each block's (Note [calloc costs what is touched]).
    calloc_votes: AtomicU8,
    /// The share of sampled blocks their owners had written (Note [calloc costs what is touched]).
    calloc_writers: AtomicU16,
    threshold_bytes: AtomicUsize,
    /// Large requests come here (TENSORMALLOC_DISABLE turns it off, tm_set_enabled at run time).
    enabled: AtomicBool,
    hugepages: AtomicU8,
    /// What the process may map (`limit_mappings`); u64::MAX without a limit.
    mapping_limit_bytes: AtomicU64,
    /// The bound the program set with mallopt (M_TRIM_THRESHOLD; usize::MAX: none set), which
    /// a mapping limit lowers to nothing meanwhile.
    program_cache_bytes: AtomicUsize,
    /// The byte bound's ceiling from memory alone (a quarter of it), which a mapping limit
    /// lowers and a raised one gives back.
    memory_ceiling_bytes: AtomicU64,
    /// How idle blocks give their pages back (`Release` as a code).
    release: AtomicU8,
    /// The last answer to "near a limit?" and until when it holds (Note [What RSS shows]):
    /// `until_ns << 1 | near`; 0 before the first.
    near_limit_kept: AtomicU64,
    /// The process that last held the cache across a fork, and the forked child that has
    /// forgotten its parent's cache (Note [Fork handlers that allocate]).
    fork_pid: AtomicU32,
    forgotten_in: AtomicU32,
    /// Freed blocks waiting for their threads' next requests (Note [A thread's own slot]),
    /// whether the cache's bounds let them wait there, and when one there is first due.
    slots: ThreadSlots,
    slots_allowed: AtomicBool,
    slot_due_after_ns: AtomicU64,
    /// The holder tags (modulo 64) of code that has advised huge pages on blocks it freed
    /// (Note [Huge-page advice]).
    advisers: AtomicU64,
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
/// up to a ceiling of a quarter of `memory_bytes` (Note [Bounds follow the working set]), and
/// nothing under a mapping limit (`space_ceiling`); in a cgroup whose limit is
/// `memory_bytes`, a sixteenth of it hot (Note [Hot within the memory]).
const fn limits_from(c: &Config, memory_bytes: u64, in_limited_cgroup: bool, mapping_limit_bytes: u64) -> CacheLimits {
    let ceiling = {
        let (memory, space) = (memory_bytes / 4, space_ceiling(mapping_limit_bytes));
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
    // Note [Hot within the memory] in host/cache/release.rs.
    let max_hot_bytes = if follow_bytes && in_limited_cgroup { (memory_bytes / 16) as usize } else { usize::MAX };
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
        max_hot_bytes,
    }
}

/// What the cache may keep under a limit on what the process may map (u64::MAX: none): nothing,
/// as glibc's free unmaps (Note [Room for others], rule 1).
const fn space_ceiling(mapping_limit_bytes: u64) -> u64 {
    if mapping_limit_bytes == u64::MAX {
        u64::MAX
    } else {
        0
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
        const DEFAULTS: CacheLimits = limits_from(&Config::DEFAULT, 4 << 30, false, u64::MAX);
        HostLayer {
            memory,
            registry: Registry::new(table_source),
            cache: Lock::new(BlockCache::new(DEFAULTS)),
            transit: Transit::new(),
            releasing: Gate::new(),
            advising: Gate::new(),
            forking: AtomicBool::new(false),
            reset_always: AtomicBool::new(false),
            calloc_votes: AtomicU8::new(0),
            calloc_writers: AtomicU16::new(0),
            near_limit_kept: AtomicU64::new(0),
            threshold_bytes: AtomicUsize::new(Config::DEFAULT.threshold_bytes as usize),
            enabled: AtomicBool::new(false),
            mapping_limit_bytes: AtomicU64::new(u64::MAX),
            memory_ceiling_bytes: AtomicU64::new(DEFAULTS.max_bytes as u64),
            program_cache_bytes: AtomicUsize::new(usize::MAX),
            release: AtomicU8::new(0),
            fork_pid: AtomicU32::new(NO_PROCESS),
            forgotten_in: AtomicU32::new(NO_PROCESS),
            hugepages: AtomicU8::new(0),
            slots: ThreadSlots::new(),
            slots_allowed: AtomicBool::new(true),
            slot_due_after_ns: AtomicU64::new(DEFAULTS.release_after_ns),
            advisers: AtomicU64::new(0),
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

    /// `memory_bytes`: what the process may use (physical memory, or its cgroup's limit when
    /// `in_limited_cgroup`). The mapping limit (RLIMIT_AS, RLIMIT_DATA, strict overcommit)
    /// comes later, from `limit_mappings`.
    pub fn configure(&self, config: &Config, memory_bytes: u64, in_limited_cgroup: bool) {
        self.threshold_bytes.store(config.threshold_bytes as usize, Relaxed);
        self.enabled.store(!config.disabled, Relaxed);
        self.hugepages.store(hugepages_code(config.hugepages), Relaxed);
        self.release.store(config.release as u8, Relaxed);
        self.reset_always.store(config.reset_always, Relaxed);
        self.memory_ceiling_bytes.store(memory_bytes / 4, Relaxed);
        self.cache().set_limits(limits_from(config, memory_bytes, in_limited_cgroup, self.mapping_limit_bytes.load(Relaxed)));
        self.follow_bounds_in_slots();
    }

    /// Freed blocks wait in their threads' slots only while the cache's bounds follow the
    /// working set, nothing limits what the process maps, and no cgroup bounds what is hot
    /// (Note [A thread's own slot]).
    fn follow_bounds_in_slots(&self) {
        let (loose, due_after_ns) = {
            let cache = self.cache();
            let l = cache.limits();
            (l.follow_bytes && l.follow_blocks && l.max_hot_bytes == usize::MAX, l.release_after_ns.min(l.expire_after_ns))
        };
        self.set_slots(loose && self.mapping_limit_bytes.load(Relaxed) == u64::MAX, due_after_ns.min(crate::host::thread_slots::LONGEST_WAIT_NS));
    }

    /// Requests of at least `bytes` come here from now on (mallopt's M_MMAP_THRESHOLD); the
    /// route follows it.
    pub fn set_threshold_bytes(&self, bytes: usize) {
        self.threshold_bytes.store(bytes, Relaxed);
    }

    /// The cache keeps at most `bytes` from now on, an exact bound (mallopt's
    /// M_TRIM_THRESHOLD), and nothing while a limit bounds what the process maps, as glibc's
    /// free unmaps whatever the program set (Note [Room for others], rule 1); holding more, it
    /// is emptied now.
    pub fn set_cache_bytes(&self, bytes: usize) {
        // usize::MAX says "none set": "never trim" (-1) is a bound too, one that never binds.
        self.program_cache_bytes.store(bytes.min(usize::MAX - 1), Relaxed);
        let bound = bytes.min(usize::try_from(space_ceiling(self.mapping_limit_bytes.load(Relaxed))).unwrap_or(usize::MAX));
        {
            let mut cache = self.cache();
            let limits = *cache.limits();
            cache.set_limits(CacheLimits { max_bytes: bound, follow_bytes: false, ..limits });
        }
        self.follow_bounds_in_slots();
        if self.cached().1 > bound {
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
    /// keeps block starts on BLOCK_ALIGN. A huge-page block's length is a whole number of huge
    /// pages (its tail too can be one), except under a limit on what the process may map
    /// (`ulimit -v`, `ulimit -d`, strict overcommit): a request of 4 MiB and a page would take
    /// 6 MiB of it, and 70 live blocks that fit under glibc alone failed at the 61st.
    fn block_shape(&self, size: usize) -> Option<(usize, usize)> {
        let huge = self.hugepages.load(Relaxed) != hugepages_code(HugePages::Never) && size >= HUGE_MIN;
        let granule = if huge { HUGE_PAGE } else { BLOCK_ALIGN };
        let length_granule = if huge && self.mapping_limit_bytes.load(Relaxed) != u64::MAX { BLOCK_ALIGN } else { granule };
        Some((size.checked_add(length_granule - 1)? & !(length_granule - 1), granule))
    }

    fn timed<T>(&self, phase: &PhaseTimer, f: impl FnOnce() -> T) -> T {
        crate::record::stats::timed_by(self.precise, phase, f)
    }

    /// The cache's block and byte bounds now, for the report.
    pub fn bounds(&self) -> (usize, usize) {
        self.cache().bounds()
    }

    /// Bytes waiting to be unmapped by the background thread.
    pub fn deferred_bytes(&self) -> usize {
        self.cache().deferred_bytes()
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

    /// The cache, locked (Note [Fork handlers that allocate]).
    #[inline]
    fn cache(&self) -> Guard<'_, BlockCache> {
        self.memory.adopt_unseen_fork();
        let mut cache = self.cache.lock();
        if cache.reentered() {
            self.entered_during_fork(&mut cache);
        }
        cache
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
