//! glibc's own names for the malloc family (`__libc_malloc`, `__libc_free`, ...), which debugging
//! tools, old hooks and allocators built over glibc call directly. Each routes as its plain twin
//! (large requests to the host layer, a block of ours freed by whichever name frees it), and its
//! small side goes on to the next allocator's entry point under the same `__libc_` name (Note
//! [glibc's own names]).
//
// Note [glibc's own names]
// Without them, `__libc_free(malloc(40 MiB))` hands our block to glibc's free: a crash. With
// them, a next allocator built over `__libc_malloc` (preload-tests/c/plt_next.c, a spy counting
// calls) calls ours when we come first in the lookup order; going on to the next allocator's
// plain `malloc` would call it again, forever. So the small side goes on to the next object's
// `__libc_` definition: glibc's, or jemalloc's and tcmalloc's, which define them too (what the
// call reaches without us), or its plain name where no object has one.

use super::aligned_calls::aligned_with;
use super::realloc::realloc_named;
use super::{free_large, invalid_pointer, large_or_next, owner, ready, refuse_interior, refuse_interior_slow, Names, LARGE_FROM, MIN_ALIGN, PAGE};
use crate::host::registry::Owner;
use crate::record::holders::Asker;
use crate::state::HOST;
use crate::sys::next::{bootstrap_alloc, is_bootstrap};
use core::ffi::c_void;
use core::sync::atomic::Ordering::Relaxed;

pub extern "C" fn malloc(size: usize, asker: Asker) -> *mut c_void {
    let Some(g) = ready() else { return bootstrap_alloc(size, MIN_ALIGN) };
    if size < LARGE_FROM.load(Relaxed) {
        // SAFETY: plain forwarding.
        return unsafe { (g.next.libc.malloc)(size) };
    }
    large_or_next(size, MIN_ALIGN, false, asker, Names::Libc)
}

pub extern "C" fn calloc(count: usize, size: usize, asker: Asker) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else { return super::enomem() };
    let Some(g) = ready() else { return bootstrap_alloc(total, MIN_ALIGN) };
    if total < LARGE_FROM.load(Relaxed) {
        // SAFETY: plain forwarding.
        return unsafe { (g.next.libc.calloc)(count, size) };
    }
    large_or_next(total, MIN_ALIGN, true, asker, Names::Libc)
}

/// # Safety
/// `p` is null or a pointer from this process's malloc family (the C contract).
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize, asker: Asker) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { realloc_named(p, size, asker, Names::Libc) }
}

/// # Safety
/// `p` is null or a pointer from this process's malloc family (the C contract).
pub unsafe fn free(p: *mut c_void) {
    if p.is_null() || is_bootstrap(p) {
        return;
    }
    if HOST.may_contain(p as usize) {
        match owner(p) {
            Owner::Live { len } => return free_large(p, len),
            Owner::Cached => invalid_pointer("__libc_free", p),
            Owner::Foreign => refuse_interior_slow("__libc_free", p),
        }
    } else {
        refuse_interior("__libc_free", p);
    }
    if let Some(g) = ready() {
        // SAFETY: not ours and not the arena's: the next allocator's.
        unsafe { (g.next.libc.free)(p) }
    }
}

/// memalign, valloc and pvalloc under glibc's names; `align` as memalign takes it.
pub extern "C" fn memalign(align: usize, size: usize, asker: Asker) -> *mut c_void {
    let Some(align) = align.max(1).checked_next_power_of_two() else {
        crate::sys::process::set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    };
    aligned_with(align, size, asker, Names::Libc)
}

pub extern "C" fn valloc(size: usize, asker: Asker) -> *mut c_void {
    aligned_with(PAGE, size, asker, Names::Libc)
}

pub extern "C" fn pvalloc(size: usize, asker: Asker) -> *mut c_void {
    match size.max(1).checked_add(PAGE - 1) {
        Some(s) => aligned_with(PAGE, s & !(PAGE - 1), asker, Names::Libc),
        None => super::enomem(),
    }
}
