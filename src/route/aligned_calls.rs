//! The aligned calls (posix_memalign, aligned_alloc, memalign, valloc, pvalloc) with glibc's
//! argument rules: small ones go to the next allocator's aligned entry, large ones to us.

use super::{enomem, large_or_next, ready, room, Names, LARGE_FROM, MIN_ALIGN, PAGE};
use crate::record::holders::Asker;
use crate::state::HOST;
use crate::sys::next::bootstrap_alloc;
use crate::sys::process::{errno, set_errno};
use core::ffi::c_void;
use core::sync::atomic::Ordering::Relaxed;

/// The shared core of posix_memalign, aligned_alloc, memalign, valloc and pvalloc; `align` is
/// a power of two. Returns null with errno set on failure.
pub(super) fn aligned(align: usize, size: usize, asker: Asker) -> *mut c_void {
    aligned_with(align, size, asker, Names::Malloc)
}

/// `aligned` under either names (see `realloc_named`).
pub(super) fn aligned_with(align: usize, size: usize, asker: Asker, names: Names) -> *mut c_void {
    let align = align.max(MIN_ALIGN);
    let Some(g) = ready() else { return bootstrap_alloc(size, align) };
    // An allocator or tracer in front of us that lacks these names (glibc's memusage) frees
    // every block through its own free, which reads the bytes before it for its header: glibc's
    // aligned blocks have a chunk header there, ours may start a mapping (SIGSEGV; the
    // glibc-tools hunter). Its own large blocks still come to us through its malloc.
    if size < LARGE_FROM.load(Relaxed) || crate::sys::front::front().is_some() {
        if let (Names::Libc, Some(memalign)) = (names, g.next.libc.memalign) {
            // SAFETY: plain forwarding; align is a power of two.
            return unsafe { memalign(align, size) };
        }
        // The unmapped count only under a limit: this is a small request's path.
        let unmapped = room::LIMITED.load(Relaxed).then(|| HOST.unmapped_bytes());
        // SAFETY: align is a power of two and at least a pointer's size.
        let p = unsafe { g.next.alloc_aligned(align, size) };
        if p.is_null() && unmapped.is_some_and(|u| room::room_made_for(size, u)) {
            // SAFETY: as above.
            return unsafe { g.next.alloc_aligned(align, size) };
        }
        return p;
    }
    large_or_next(size, align, false, asker, names)
}

/// # Safety
/// `p` is null or a pointer from this process's malloc family (the C contract).
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize, asker: Asker) -> i32 {
    if out.is_null() {
        return libc::EINVAL;
    }
    if !align.is_power_of_two() || !align.is_multiple_of(core::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let saved = errno();
    let p = aligned(align, size, asker);
    if p.is_null() {
        let e = errno();
        set_errno(saved);
        return if e == 0 { libc::ENOMEM } else { e };
    }
    // SAFETY: out is non-null and, by contract, writable.
    unsafe { *out = p };
    0
}

/// memalign and aligned_alloc as glibc 2.36 has them: an alignment that is not a power of two
/// is rounded up to one; one too large to round fails with EINVAL.
pub extern "C" fn memalign(align: usize, size: usize, asker: Asker) -> *mut c_void {
    let Some(align) = align.max(1).checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    };
    aligned(align, size, asker)
}

pub extern "C" fn valloc(size: usize, asker: Asker) -> *mut c_void {
    aligned(PAGE, size, asker)
}

pub extern "C" fn pvalloc(size: usize, asker: Asker) -> *mut c_void {
    match size.max(1).checked_add(PAGE - 1) {
        Some(s) => aligned(PAGE, s & !(PAGE - 1), asker),
        None => enomem(),
    }
}
