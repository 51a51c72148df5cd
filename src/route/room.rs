//! When memory is short (Note [Room for others] in host/host_layer/release.rs): the limits on
//! what the process may map, followed as they change; the next allocator's entry points that
//! make room in front of it once there is one; and a large request we could not map, offered to
//! the next allocator before it fails (Note [The next allocator's free memory]).
//
// Note [The next allocator's free memory]
// A large request we cannot map, even with the cache emptied, may still fit in what the next
// allocator holds free. glibc keeps the heap a program's small blocks grew by brk after they
// are freed (600 MiB of 1000-byte blocks freed in reverse order stay mapped), and serves a 1 MiB
// request from it where a fresh mapping does not fit under RLIMIT_AS or RLIMIT_DATA: under
// glibc alone the program gets its block. So it does under us: the C entry points (malloc,
// calloc, realloc and the aligned ones, under either names) offer such a request to the next
// allocator, by the names they came in by, before failing. The block is then the next
// allocator's, as a small one is: its free, realloc and usable size go there (no table of ours
// has it), and the holders table and our figures do not count it. The C++ operators go on to
// the next operator new when we cannot serve (Note [Out of memory behind operator new] in
// cxx.rs). Only a request the next allocator refuses too is reported as out of memory.

use super::{enomem, free_large, Names, MIN_ALIGN, NEXT_CALLOC, NEXT_MALLOC, NEXT_REALLOC, UNCHECKED_REALLOC};
use crate::state::HOST;
use crate::sys::process::errno;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::{Relaxed, Release}};

/// The next allocator itself, behind the entry points that make room in front of it (those are
/// installed after init, so this is always `Some` where they call it).
pub(super) fn next_allocator() -> Option<&'static crate::sys::next::NextAllocator> {
    crate::state::globals().map(|g| &g.next)
}

/// A limit on what the process may map has been seen: the entry points that make room are in place.
pub(super) static LIMITED: AtomicBool = AtomicBool::new(false);
/// The mapping limit last seen (u64::MAX: none).
static SEEN_MAPPING_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Follows the limits on what the process may map (RLIMIT_AS, RLIMIT_DATA, a strict commit
/// limit), which a program may set at any time (Python's `resource.setrlimit`): the host cache's
/// ceiling follows the lowest, and once there is one the next allocator's entry points go
/// through those that make room (Note [Room for others]). At init, after the program's
/// setrlimit or prlimit (our shims), at every background pass (another process's prlimit), and
/// when a mapping fails: two getrlimit calls.
pub(super) fn follow_mapping_limits() {
    let limit = crate::sys::memory::mapping_limit_bytes();
    if SEEN_MAPPING_LIMIT.swap(limit, Relaxed) == limit {
        return;
    }
    HOST.limit_mappings(limit);
    if limit != u64::MAX && !LIMITED.swap(true, Relaxed) {
        NEXT_MALLOC.store(malloc_making_room as *const () as usize, Release);
        NEXT_CALLOC.store(calloc_making_room as *const () as usize, Release);
        UNCHECKED_REALLOC.store(realloc_making_room as *const () as usize, Release);
        // Unless the interior check took its place (it goes on through UNCHECKED_REALLOC).
        if let Some(next) = next_allocator() {
            let _ = NEXT_REALLOC.compare_exchange(next.realloc as usize, realloc_making_room as *const () as usize, Release, Relaxed);
        }
    }
}

/// After the next allocator failed a request of `size` bytes (`unmapped_before`: our unmapped
/// bytes before it): whether memory was given back so that one more try may succeed (Note [Room
/// for others]).
#[cold]
pub(super) fn room_made_for(size: usize, unmapped_before: u64) -> bool {
    errno() == libc::ENOMEM && HOST.may_make_room(unmapped_before) && HOST.make_room(size, unmapped_before)
}

/// `follow_mapping_limits` in the background pass, the overcommit mode read again with them
/// (at most once a second).
pub(super) fn follow_limits_in_pass() {
    crate::sys::memory::refresh_commit_limit(crate::sys::clock::coarse_ns());
    follow_mapping_limits();
}

/// NEXT_MALLOC under a mapping limit.
unsafe extern "C" fn malloc_making_room(size: usize) -> *mut c_void {
    let Some(own) = next_allocator().map(|n| n.malloc) else { return enomem() };
    let unmapped = HOST.unmapped_bytes();
    // SAFETY: plain forwarding.
    let p = unsafe { own(size) };
    if p.is_null() && room_made_for(size, unmapped) {
        // SAFETY: as above.
        return unsafe { own(size) };
    }
    p
}

/// NEXT_CALLOC under a mapping limit.
unsafe extern "C" fn calloc_making_room(count: usize, size: usize) -> *mut c_void {
    let Some(own) = next_allocator().map(|n| n.calloc) else { return enomem() };
    let unmapped = HOST.unmapped_bytes();
    // SAFETY: plain forwarding.
    let p = unsafe { own(count, size) };
    if p.is_null() && room_made_for(count.saturating_mul(size), unmapped) {
        // SAFETY: as above.
        return unsafe { own(count, size) };
    }
    p
}

/// The next allocator's realloc under a mapping limit (a failed realloc leaves the
/// block as it was, so trying again is safe).
unsafe extern "C" fn realloc_making_room(p: *mut c_void, size: usize) -> *mut c_void {
    let Some(own) = next_allocator().map(|n| n.realloc) else { return enomem() };
    let unmapped = HOST.unmapped_bytes();
    // SAFETY: plain forwarding under the caller's contract.
    let q = unsafe { own(p, size) };
    if q.is_null() && size != 0 && room_made_for(size, unmapped) {
        // SAFETY: as above.
        return unsafe { own(p, size) };
    }
    q
}

/// A large request of `size` bytes on `align` (MIN_ALIGN: malloc's own) that the host layer
/// could not map, offered to the next allocator by `names` (Note [The next allocator's free
/// memory]); null, with its errno, when it refuses too.
#[cold]
pub(super) fn next_instead(size: usize, align: usize, zeroed: bool, names: Names) -> *mut c_void {
    let Some(next) = next_allocator() else { return enomem() };
    // SAFETY: plain forwarding; `align` is a power of two and at least a pointer's size.
    unsafe {
        match (names, zeroed, align <= MIN_ALIGN, next.libc.memalign) {
            (Names::Malloc, true, ..) => (next.calloc)(1, size),
            (Names::Libc, true, ..) => (next.libc.calloc)(1, size),
            (Names::Malloc, false, true, _) => (next.malloc)(size),
            (Names::Libc, false, true, _) => (next.libc.malloc)(size),
            (Names::Libc, false, false, Some(memalign)) => memalign(align, size),
            _ => next.alloc_aligned(align, size),
        }
    }
}

/// A live block of ours (`len` bytes mapped at `p`) that could not grow to `size`: moved into
/// the next allocator's memory if it has room (Note [The next allocator's free memory]), else
/// left as it is (null, ENOMEM: realloc's contract).
#[cold]
pub(super) fn moved_to_next(p: *mut c_void, len: usize, size: usize, names: Names) -> *mut c_void {
    follow_mapping_limits();
    let q = next_instead(size, MIN_ALIGN, false, names);
    if q.is_null() {
        return enomem();
    }
    HOST.memory_copy(q as usize, p as usize, size.min(len));
    free_large(p, len);
    q
}
