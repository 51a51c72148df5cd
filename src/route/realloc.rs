//! realloc and reallocarray: a block resized in the host layer, moved across the threshold
//! between us and the next allocator (copied between two blocks we hold), or passed on.

use super::{enomem, free_large, invalid_pointer, large_or_next, malloc_named, next_malloc, owner, ready, realloc_as, refuse_interior, room, Names, LARGE_FROM, MIN_ALIGN, UNCHECKED_REALLOC};
use crate::host::registry::Owner;
use crate::record::holders::Asker;
use crate::state::HOST;
use crate::sys::next::{bootstrap_size, is_bootstrap, ReallocFn};
use crate::sys::process::SavedErrno;
use core::ffi::c_void;
use core::sync::atomic::Ordering::Relaxed;

/// realloc under either names: the small side goes on to the next allocator's entry point of
/// the same names.
///
/// # Safety
/// As for `realloc`.
pub(super) unsafe fn realloc_named(p: *mut c_void, size: usize, asker: Asker, names: Names) -> *mut c_void {
    let alloc = |size| malloc_named(size, asker, names);
    if p.is_null() {
        return alloc(size);
    }
    if is_bootstrap(p) {
        let q = alloc(size);
        if !q.is_null() {
            // SAFETY: p is a live arena block of bootstrap_size(p) bytes; q has room for size.
            unsafe { core::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, bootstrap_size(p).min(size)) };
        }
        return q;
    }
    let Some(g) = ready() else { return enomem() };
    match owner(p) {
        Owner::Cached => invalid_pointer("realloc", p),
        Owner::Live { len } => {
            if size == 0 {
                // glibc frees and returns NULL for realloc(p, 0).
                free_large(p, len);
                return core::ptr::null_mut();
            }
            if size >= LARGE_FROM.load(Relaxed) {
                let saved = SavedErrno::save();
                let q = match HOST.resize(p as usize, len, size) {
                    Some(a) => a as *mut c_void,
                    None => room::moved_to_next(p, len, size, names),
                };
                if !q.is_null() {
                    saved.restore();
                }
                return q;
            }
            // Shrinking below the threshold: move to the next allocator, then copy between two
            // blocks we hold.
            let q = match names {
                Names::Malloc => next_malloc(size),
                // SAFETY: plain forwarding.
                Names::Libc => unsafe { (g.next.libc.malloc)(size) },
            };
            if q.is_null() {
                return enomem();
            }
            HOST.memory_copy(q as usize, p as usize, size.min(len));
            free_large(p, len);
            q
        }
        Owner::Foreign => {
            refuse_interior("realloc", p);
            let (next_realloc, next_free) = match names {
                // SAFETY: UNCHECKED_REALLOC is the next allocator's realloc, or the one that
                // makes room in front of it (set by ready()).
                Names::Malloc => (unsafe { core::mem::transmute::<usize, ReallocFn>(UNCHECKED_REALLOC.load(Relaxed)) }, g.next.free),
                Names::Libc => (g.next.libc.realloc, g.next.libc.free),
            };
            if size < LARGE_FROM.load(Relaxed) {
                // SAFETY: p came from the next allocator.
                return unsafe { next_realloc(p, size) };
            }
            // Growing past the threshold: move into the host layer.
            let Some(usable) = g.next.sizes_its_blocks else {
                // SAFETY: as above; without its own malloc_usable_size we cannot know what to
                // copy.
                return unsafe { next_realloc(p, size) };
            };
            // One the next allocator serves when we cannot (Note [The next allocator's free
            // memory] in room.rs); on failure p is left as it was.
            let q = large_or_next(size, MIN_ALIGN, false, asker, names);
            if q.is_null() {
                return q;
            }
            // SAFETY: p is live in the next allocator with `old` usable bytes.
            unsafe {
                let old = usable(p);
                core::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size));
                next_free(p);
            }
            q
        }
    }
}

/// # Safety
/// `p` is null or a pointer from this process's malloc family (the C contract).
pub unsafe extern "C" fn reallocarray(p: *mut c_void, count: usize, size: usize, asker: Asker) -> *mut c_void {
    match count.checked_mul(size) {
        // Note [An allocator in front of us] (sys/front.rs): its realloc, as glibc's would call.
        // SAFETY: forwarded under the caller's contract.
        Some(total) => match crate::sys::front::front() {
            Some((realloc, _)) => unsafe { realloc(p, total) },
            None => unsafe { realloc_as(p, total, asker) },
        },
        None => enomem(),
    }
}
