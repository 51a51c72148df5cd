//! Routing for the malloc family: who serves a request (the next allocator, the host layer, or
//! the bootstrap arena during init) and who owns a pointer. Implements the C contract around
//! the layers: errno, overflow, alignment rules, realloc edge cases as glibc has them (realloc
//! and the aligned calls in rooms of their own beside this file).
//
// Note [errno on success]
// A call that succeeds leaves errno as it found it, as glibc's large paths do (one mmap or one
// mremap that either works or is the failure). Ours try and recover: an mremap in place that a
// neighbour refuses before the pages move, a mapping retried after the cache is emptied, a
// discard that falls back to writing zeros, a contended lock's futex. A program that clears
// errno, reads to the end with getline (whose buffer grows by realloc) and then tests errno took
// such a leftover ENOMEM or EFAULT for a read error. So the large paths of malloc, calloc, the
// aligned calls, operator new and realloc put errno back when they succeed, as free always does.

use crate::host::registry::Owner;
use crate::record::holders::{self, Asker};
use crate::sys::next::{bootstrap_alloc, bootstrap_size, is_bootstrap};
use crate::backing::{BLOCK_ALIGN, PAGE};
use crate::state::{Globals, HOST};
use crate::sys::process::{abort, set_errno, SavedErrno};
use core::ffi::c_void;
use crate::sys::next::{CallocFn, FreeFn, MallocFn, ReallocFn};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering::{Acquire, Relaxed, Release}};

pub(crate) mod cxx;
pub(crate) mod control;
pub(crate) mod glibc_slide;
pub(crate) mod libc_names;
pub(crate) mod objects;
pub(crate) mod page_calls;
pub(crate) mod aligned_calls;
pub(crate) mod realloc;
mod room;
// Its callers are the CUDA shims, built only into the library.
#[cfg(not(any(test, feature = "no-interpose")))]
pub(crate) mod cuda;

/// malloc's guaranteed alignment on x86-64 (and glibc's MALLOC_ALIGNMENT).
const MIN_ALIGN: usize = 16;

/// Requests of at least this many bytes go to the host layer; smaller ones straight to the next
/// allocator. 0 until `ready` has set the targets (so every call takes the slow path, which
/// initializes); `usize::MAX` when caching is off.
///
/// This static and the NEXT_* targets below are read by the fast paths: the inline functions
/// of this file, and on x86-64 the exported entry points in `shim::fast_paths`, which read them
/// with plain loads (x86 loads are acquire loads).
pub(crate) static LARGE_FROM: AtomicUsize = AtomicUsize::new(0);

// The next allocator's entry points, copied out of `Globals` so the fast paths are one load and
// a tail call. Set before LARGE_FROM becomes non-zero (release), read after it (acquire).
pub(crate) static NEXT_MALLOC: AtomicUsize = AtomicUsize::new(0);
pub(crate) static NEXT_CALLOC: AtomicUsize = AtomicUsize::new(0);
/// Where realloc sends a pointer off a BLOCK_ALIGN boundary that stays small: the next
/// allocator's realloc, or `realloc_checked` in front of it (see NEXT_FREE).
pub(crate) static NEXT_REALLOC: AtomicUsize = AtomicUsize::new(0);
/// Where free sends a pointer that is not on a BLOCK_ALIGN boundary, so not the start of a
/// block of ours or the arena's: the slow path until init has resolved the next allocator, then
/// the next allocator's free. Valid at every moment, so free's fast path needs no test of the
/// init state.
/// Under TENSORMALLOC_CHECK_FREE it becomes `free_checked` once the first large block is handed
/// out (`arm_interior_check`): before that no pointer can be inside one of ours.
pub(crate) static NEXT_FREE: AtomicPtr<()> = AtomicPtr::new(free_slow as *mut ());
// The next allocator's own free and realloc, for the checked entry points to go on to.
static UNCHECKED_FREE: AtomicUsize = AtomicUsize::new(0);
static UNCHECKED_REALLOC: AtomicUsize = AtomicUsize::new(0);
/// TENSORMALLOC_CHECK_FREE is on and the checked entry points are not in place yet.
static CHECK_PENDING: AtomicBool = AtomicBool::new(false);

/// Whether the targets above are set: UNSET, SETTING (by one thread, once) or SET.
static TARGETS: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = 0;
const SETTING: u8 = 1;
const SET: u8 = 2;

/// The resolved state, with the fast-path targets set from it: the first slow call after init
/// sets them. `None` while init, or the setting, is under way on another thread (or reentrantly):
/// callers then use the bootstrap arena, as during init.
#[inline]
fn ready() -> Option<&'static Globals> {
    let g = crate::state::globals()?;
    if TARGETS.load(Acquire) == SET {
        return Some(g);
    }
    set_targets(g)
}

#[cold]
#[inline(never)]
fn set_targets(g: &'static Globals) -> Option<&'static Globals> {
    if TARGETS.compare_exchange(UNSET, SETTING, Acquire, Acquire).is_err() {
        return (TARGETS.load(Acquire) == SET).then_some(g);
    }
    let next = &g.next;
    NEXT_MALLOC.store(next.malloc as usize, Relaxed);
    UNCHECKED_FREE.store(next.free as usize, Relaxed);
    UNCHECKED_REALLOC.store(next.realloc as usize, Relaxed);
    NEXT_FREE.store(next.free as *mut (), Release);
    NEXT_REALLOC.store(next.realloc as usize, Relaxed);
    CHECK_PENDING.store(g.config.check_free, Relaxed);
    NEXT_CALLOC.store(next.calloc as usize, Relaxed);
    room::follow_mapping_limits();
    crate::state::watch_limits(room::follow_limits_in_pass);
    set_large_from(HOST.is_enabled(), true);
    // Note [glibc's sliding threshold]: only where glibc alone would slide it.
    if let (true, false, Some(mallopt)) = (next.heap_is_glibcs, g.glibc_thresholds_fixed, next.control.mallopt) {
        if !g.config.disabled && HOST.threshold_bytes() <= glibc_slide::GLIBC_FIRST_MMAP_THRESHOLD {
            glibc_slide::arm(mallopt);
        }
    }
    TARGETS.store(SET, Release);
    Some(g)
}

/// The next allocator's malloc, through the entry point that makes room when a limit is in force.
fn next_malloc(size: usize) -> *mut c_void {
    // SAFETY: only called after ready(), which set NEXT_MALLOC.
    unsafe { core::mem::transmute::<usize, MallocFn>(NEXT_MALLOC.load(Relaxed))(size) }
}

/// Puts the interior-pointer check in front of the next allocator's free and realloc, before
/// the first large block is handed out. A process that never makes one (most small-object
/// programs) never pays for the check. The stores are ordered before the block reaches the
/// program, so any thread that can hold a pointer into the block sees the checked targets.
#[inline(always)]
fn arm_interior_check() {
    if CHECK_PENDING.load(Relaxed) {
        arm_interior_check_slow();
    }
}

#[cold]
#[inline(never)]
fn arm_interior_check_slow() {
    NEXT_REALLOC.store(realloc_checked as *const () as usize, Release);
    NEXT_FREE.store(free_checked as *mut (), Release);
    cxx::INTERIOR_CHECK.store(true, Release);
    CHECK_PENDING.store(false, Release);
}

/// Turns the host cache on or off at run time; returns the previous setting. Blocks already
/// handed out stay ours and are still taken back correctly (freed while off, they are unmapped).
/// Off empties the cache when `may_trim` (Note [The API inside our own work] in shim/api.rs).
/// Under TENSORMALLOC_DISABLE, or where we stepped aside (Note [Memory debuggers] in state.rs),
/// it stays off: the program runs as if we were not loaded.
pub fn set_enabled(on: bool, may_trim: bool) -> bool {
    let Some(g) = ready() else { return HOST.is_enabled() };
    if on && g.config.disabled {
        return false;
    }
    let was = HOST.swap_enabled(on);
    set_large_from(on, may_trim);
    was
}

pub fn is_enabled() -> bool {
    HOST.is_enabled()
}

fn set_large_from(on: bool, may_trim: bool) {
    LARGE_FROM.store(if on { HOST.threshold_bytes() } else { usize::MAX }, Release);
    if !on && may_trim {
        HOST.trim();
    }
}

fn enomem() -> *mut c_void {
    set_errno(libc::ENOMEM);
    core::ptr::null_mut()
}

#[inline]
fn owner(p: *mut c_void) -> Owner {
    // Our blocks start on BLOCK_ALIGN: one test filters out nearly all small pointers.
    if plainly_foreign(p) {
        return Owner::Foreign;
    }
    HOST.owner(p as usize)
}

#[cold]
fn invalid_pointer(what: &str, p: *mut c_void) -> ! {
    crate::warn_line!("{}(): invalid pointer {:p} (double free or not from malloc); aborting", what, p);
    // glibc's answer to a corrupted heap.
    abort()
}

/// Aborts, as glibc does for a pointer it did not hand out, if `p` points inside one of our
/// blocks without being its start: passed on, the next allocator would read our block's data as
/// its chunk header (and glibc may unmap part of the block on that word's say-so).
#[inline(always)]
fn refuse_interior(what: &str, p: *mut c_void) {
    if crate::host::registry::ever_overlapped(p as usize) {
        refuse_interior_slow(what, p);
    }
}

#[cold]
#[inline(never)]
fn refuse_interior_slow(what: &str, p: *mut c_void) {
    if let Some(start) = HOST.block_containing(p as usize) {
        crate::warn_line!("{}(): invalid pointer {:p} ({} bytes inside the large block at {:#x}); aborting", what, p, p as usize - start, start);
        abort()
    }
}

/// NEXT_FREE under TENSORMALLOC_CHECK_FREE=1.
unsafe extern "C" fn free_checked(p: *mut c_void) {
    refuse_interior("free", p);
    // SAFETY: set by ready() before this function was published; p is not ours.
    unsafe { core::mem::transmute::<usize, FreeFn>(UNCHECKED_FREE.load(Relaxed))(p) }
}

/// NEXT_REALLOC under TENSORMALLOC_CHECK_FREE=1.
unsafe extern "C" fn realloc_checked(p: *mut c_void, size: usize) -> *mut c_void {
    refuse_interior("realloc", p);
    // SAFETY: as in free_checked.
    unsafe { core::mem::transmute::<usize, ReallocFn>(UNCHECKED_REALLOC.load(Relaxed))(p, size) }
}

/// A large block for `asker` (Note [Holders]: a return address, or a hook's), for the C entry
/// points, which came in by `names`: a request we cannot map goes to the next allocator before it
/// fails (Note [The next allocator's free memory] in room.rs); null, reported as out of memory,
/// when neither can serve it.
fn large_or_next(size: usize, align: usize, zeroed: bool, asker: Asker, names: Names) -> *mut c_void {
    let saved = SavedErrno::save();
    match HOST.alloc(size, align, zeroed, asker.holder()) {
        Some(a) => {
            arm_interior_check();
            saved.restore();
            a as *mut c_void
        }
        None => {
            room::follow_mapping_limits();
            let p = room::next_instead(size, align, zeroed, names);
            if !p.is_null() {
                saved.restore();
                return p;
            }
            report_out_of_memory(size, align);
            enomem()
        }
    }
}

/// `large` for a caller that goes on elsewhere when we cannot map (the next C++ operator new):
/// null with no out-of-memory report, which is that caller's to make if the request fails there
/// too (Note [The next allocator's free memory] in room.rs).
fn large_unreported(size: usize, align: usize, asker: Asker) -> *mut c_void {
    let saved = SavedErrno::save();
    let p = match HOST.alloc(size, align, false, asker.holder()) {
        Some(a) => {
            arm_interior_check();
            a as *mut c_void
        }
        None => {
            room::follow_mapping_limits();
            core::ptr::null_mut()
        }
    };
    // Served or not: on failure the caller goes on to the next operator new, whose errno is the
    // one to see.
    saved.restore();
    p
}

/// The host layer's out-of-memory event for a request of `size` bytes on `align` that nothing
/// served. A request no limit could ever allow is a probe, not a shortage: no event.
#[cold]
fn report_out_of_memory(size: usize, align: usize) {
    if HOST.could_map(size, align) {
        let total_bytes = crate::sys::memory::mapping_limit_bytes();
        crate::record::out_of_memory(&crate::record::OutOfMemory { place: holders::PLACE_HOST, request_bytes: size as u64, total_bytes, ..Default::default() });
    }
}

/// free leaves errno as it was (POSIX 2024, glibc since 2.33), whatever the system calls of the
/// reset or an unmap said (Note [errno on success]).
fn free_large(p: *mut c_void, len: usize) {
    let saved = SavedErrno::save();
    HOST.free(p as usize, len);
    glibc_slide::after_free(len);
    saved.restore();
}

/// Off a BLOCK_ALIGN boundary: certainly the next allocator's pointer (our blocks and the
/// bootstrap arena's start on one), with no table lookup.
#[inline(always)]
fn plainly_foreign(p: *mut c_void) -> bool {
    p as usize & (BLOCK_ALIGN - 1) != 0
}

/// The current small/large boundary; 0 while init has not finished (see LARGE_FROM).
#[inline(always)]
fn small_below() -> usize {
    LARGE_FROM.load(Acquire)
}

/// malloc from a caller not known (non-x86 exports, our own fallbacks): a holder word of 0.
#[inline(always)]
pub fn malloc(size: usize) -> *mut c_void {
    malloc_as(size, Asker::UNKNOWN)
}

/// malloc's slow path, with the caller's return address (Note [Holders]): on x86-64 the naked
/// malloc jumps here, and this takes the address from the stack and jumps on.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub(crate) extern "C" fn malloc_slow(_size: usize) -> *mut c_void {
    core::arch::naked_asm!("mov rsi, qword ptr [rsp]", "jmp {from}", from = sym malloc_from)
}

/// malloc for `asker` (its return address, or a hook's, Note [Holders]).
#[inline(always)]
pub fn malloc_as(size: usize, asker: Asker) -> *mut c_void {
    if size < small_below() {
        // SAFETY: LARGE_FROM > 0 means NEXT_MALLOC holds the next allocator's malloc.
        return unsafe { core::mem::transmute::<usize, MallocFn>(NEXT_MALLOC.load(Relaxed))(size) };
    }
    malloc_from(size, asker)
}

#[cold]
#[inline(never)]
pub(crate) extern "C" fn malloc_from(size: usize, asker: Asker) -> *mut c_void {
    if ready().is_none() {
        return bootstrap_alloc(size, MIN_ALIGN);
    }
    if size < LARGE_FROM.load(Relaxed) {
        return next_malloc(size);
    }
    large_or_next(size, MIN_ALIGN, false, asker, Names::Malloc)
}

/// # Safety
/// `p` is null or a pointer from this process's malloc family (the C contract).
#[inline(always)]
pub unsafe fn free(p: *mut c_void) {
    if plainly_foreign(p) {
        // SAFETY: NEXT_FREE always holds a free for pointers that are not ours (see its doc).
        return unsafe { core::mem::transmute::<*mut (), FreeFn>(NEXT_FREE.load(Acquire))(p) };
    }
    unsafe { free_slow(p) }
}

/// Also NEXT_FREE's value before init: everything goes the slow way.
///
/// # Safety
/// As for `free`.
#[cold]
#[inline(never)]
pub(crate) unsafe extern "C" fn free_slow(p: *mut c_void) {
    if p.is_null() || is_bootstrap(p) {
        return;
    }
    // Small blocks of the next allocator on a BLOCK_ALIGN boundary (one in 16 of jemalloc's
    // 4 KiB objects) are common: no block of ours near p settles it in a few loads, and they go
    // straight on.
    if HOST.may_contain(p as usize) {
        return unsafe { free_near_ours(p) };
    }
    let next_free = UNCHECKED_FREE.load(Relaxed);
    if next_free != 0 {
        // SAFETY: set by ready() to the next allocator's free; p is not ours or the arena's.
        return unsafe { core::mem::transmute::<usize, FreeFn>(next_free)(p) };
    }
    unsafe { free_foreign(p) }
}

/// free's slow path for a pointer in a granule one of our blocks overlaps: our block, a bad
/// pointer, or the next allocator's.
#[cold]
#[inline(never)]
unsafe fn free_near_ours(p: *mut c_void) {
    match owner(p) {
        Owner::Live { len } => return free_large(p, len),
        Owner::Cached => invalid_pointer("free", p),
        Owner::Foreign => refuse_interior_slow("free", p),
    }
    unsafe { free_foreign(p) }
}

/// The next allocator's free, through `ready()`: it resolves the next allocator if init has
/// not run yet.
#[cold]
#[inline(never)]
unsafe fn free_foreign(p: *mut c_void) {
    if let Some(g) = ready() {
        // SAFETY: not ours and not the arena's: it came from the next allocator.
        unsafe { (g.next.free)(p) }
    }
}

// x86-64 exports shim::fast_paths::calloc instead.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline(always)]
pub fn calloc(count: usize, size: usize) -> *mut c_void {
    calloc_as(count, size, Asker::UNKNOWN)
}

/// calloc's slow path, with the caller's return address, as malloc_slow.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub(crate) extern "C" fn calloc_slow(_count: usize, _size: usize) -> *mut c_void {
    core::arch::naked_asm!("mov rdx, qword ptr [rsp]", "jmp {from}", from = sym calloc_from)
}

/// calloc for `asker`.
#[inline(always)]
pub fn calloc_as(count: usize, size: usize, asker: Asker) -> *mut c_void {
    match count.checked_mul(size) {
        Some(total) if total < small_below() => {
            // SAFETY: as in malloc_as.
            unsafe { core::mem::transmute::<usize, CallocFn>(NEXT_CALLOC.load(Relaxed))(count, size) }
        }
        _ => calloc_from(count, size, asker),
    }
}

#[cold]
#[inline(never)]
pub(crate) extern "C" fn calloc_from(count: usize, size: usize, asker: Asker) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else { return enomem() };
    if ready().is_none() {
        return bootstrap_alloc(total, MIN_ALIGN);
    }
    if total < LARGE_FROM.load(Relaxed) {
        // SAFETY: ready() set NEXT_CALLOC; plain forwarding.
        return unsafe { core::mem::transmute::<usize, CallocFn>(NEXT_CALLOC.load(Relaxed))(count, size) };
    }
    large_or_next(total, MIN_ALIGN, true, asker, Names::Malloc)
}

/// # Safety
/// `p` is null or a pointer from this process's malloc family (the C contract).
// x86-64 exports shim::fast_paths::realloc instead.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline(always)]
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { realloc_as(p, size, Asker::UNKNOWN) }
}

/// realloc's slow path, with the caller's return address, as malloc_slow.
///
/// # Safety
/// As for `realloc`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub(crate) unsafe extern "C" fn realloc_slow(_p: *mut c_void, _size: usize) -> *mut c_void {
    core::arch::naked_asm!("mov rdx, qword ptr [rsp]", "jmp {from}", from = sym realloc_from)
}

/// realloc for `asker`.
///
/// # Safety
/// As for `realloc`.
#[inline(always)]
pub unsafe fn realloc_as(p: *mut c_void, size: usize, asker: Asker) -> *mut c_void {
    if plainly_foreign(p) && size < small_below() {
        // SAFETY: a small pointer of the next allocator staying small: its own realloc.
        return unsafe { core::mem::transmute::<usize, ReallocFn>(NEXT_REALLOC.load(Relaxed))(p, size) };
    }
    unsafe { realloc_from(p, size, asker) }
}

/// # Safety
/// As for `realloc`.
#[cold]
#[inline(never)]
pub(crate) unsafe extern "C" fn realloc_from(p: *mut c_void, size: usize, asker: Asker) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { realloc::realloc_named(p, size, asker, Names::Malloc) }
}

/// Which names of the next allocator a call came in by, and so goes on to: malloc's, or glibc's
/// own `__libc_` ones (libc_names.rs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Names {
    Malloc,
    Libc,
}

/// malloc under either names.
fn malloc_named(size: usize, asker: Asker, names: Names) -> *mut c_void {
    match names {
        Names::Malloc => malloc_as(size, asker),
        Names::Libc => libc_names::malloc(size, asker),
    }
}

/// free_sized and free_aligned_sized: free, or the free of an allocator in front of us (Note [An
/// allocator in front of us] in sys/front.rs).
///
/// # Safety
/// As free.
pub unsafe fn free_sized(p: *mut c_void) {
    match crate::sys::front::front() {
        // SAFETY: the process's free, for a block the program got from the process's malloc.
        Some((_, free)) => unsafe { free(p) },
        // SAFETY: the caller's contract.
        None => unsafe { free(p) },
    }
}


/// # Safety
/// `p` is null or a pointer from this process's malloc family (the C contract).
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if is_bootstrap(p) {
        // SAFETY: p is an arena block.
        return unsafe { bootstrap_size(p) };
    }
    match owner(p) {
        Owner::Live { len } => len,
        Owner::Cached => 0,
        Owner::Foreign => match ready().and_then(|g| g.next.usable_size) {
            // SAFETY: p came from the next allocator.
            Some(f) => unsafe { f(p) },
            None => 0,
        },
    }
}

#[cfg(test)]
mod contract_tests;
