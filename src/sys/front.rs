//! An allocator in front of us: the process's own `realloc` and `free` when its `malloc` is not
//! ours (Note [An allocator in front of us]), found once at load.

use super::next::{FreeFn, ReallocFn};
use core::sync::atomic::{AtomicUsize, Ordering};

// Note [An allocator in front of us]
// Preloaded after another allocator (LD_PRELOAD="libjemalloc.so.2 libtensormalloc.so": a
// container's global setting with ours appended), only the names it lacks reach us: reallocarray
// (which coreutils call), free_sized, free_aligned_sized. The blocks they are given are that
// allocator's, neither ours nor glibc's, and handing them on to the next allocator after us
// (glibc) crashed `ls`, `sed` and `grep`. glibc's own definitions of those names call realloc and
// free through the global scope, so ours do the same when the process's malloc is not ours: the
// allocator in front gets its own blocks back (a tracer in front sees the call, and hands it to
// us as before).

// Note [A copy the process does not allocate through]
// Loaded by path rather than preloaded or linked ahead of libc (a library linked with
// -ltensormalloc that is dlopened, RTLD_LOCAL as Python loads extensions; a copy dlopened late,
// even RTLD_GLOBAL, as the Python package loads us without the preload), our malloc is not the
// process's: glibc's comes first in the global scope. Our C++ operators and CUDA entry points
// may still be found first by the objects bound after us (none other defines them in their
// scope), and a block they hand out was then deleted by libstdc++ into glibc's free (SIGSEGV),
// or freed by the runtime that objects loaded before us use (an error, the block lost). Such a
// copy hands out none through those names: operator new and cudaMalloc go on to the next
// definitions, and what we explicitly serve (the numpy handler, PyTorch's pluggable allocator)
// stays ours; frees of our blocks still come back to us.

/// Whether the process allocates through us (Note [A copy the process does not allocate
/// through]): true until `resolve_at_load` looked.
static SERVES_THE_PROCESS: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(true);

/// Whether our operator new and cudaMalloc may hand out blocks of ours: our malloc is the
/// process's, or another allocator stands in front of us (preloaded before us).
pub fn serves_the_process() -> bool {
    SERVES_THE_PROCESS.load(Ordering::Relaxed)
}

/// Not looked yet (0) or no allocator in front (1); above: the function's address.
const NONE: usize = 1;
static REALLOC: AtomicUsize = AtomicUsize::new(0);
static FREE: AtomicUsize = AtomicUsize::new(0);

/// The process's realloc and free when an allocator stands in front of us; None when we come
/// first, or before `resolve_at_load` looked (never looked up here: this is called inside
/// allocation calls).
pub fn front() -> Option<(ReallocFn, FreeFn)> {
    let (realloc, free) = (REALLOC.load(Ordering::Acquire), FREE.load(Ordering::Acquire));
    // SAFETY: only `resolve_at_load` stores values above NONE: the addresses of the process's
    // realloc and free.
    (realloc > NONE && free > NONE).then(|| unsafe { (core::mem::transmute::<usize, ReallocFn>(realloc), core::mem::transmute::<usize, FreeFn>(free)) })
}

/// The process's definition of `name` when it is not ours (None when it is ours or there is
/// none).
fn found(name: &core::ffi::CStr) -> Option<usize> {
    let p = super::dlsym::process_definition(name);
    if !p.is_null() && !super::dlsym::is_ours(p) {
        return Some(p as usize);
    }
    // Note [Versioned interposers] (sys/dlsym.rs): one in front that defines only compat
    // symbols, which a plain lookup skips.
    super::dlsym::versioned_interposer(false, name).map(|q| q as usize)
}

/// Whether someone's malloc comes before ours in the global scope, where we are (our
/// tm_get_stats is the process's), and it is not the C library's: loaded by path (even
/// RTLD_GLOBAL, as Python's package loads us) or in a test, glibc's malloc comes first and
/// never calls us. Looks each time (dlsym: never inside an allocation call).
pub fn malloc_in_front() -> bool {
    super::dlsym::process_definition_is_ours(c"tm_get_stats") && found(c"malloc").is_some_and(|malloc| !super::dlsym::in_c_library(malloc))
}

/// Looks once, at load, outside every allocation call (glibc's dlsym may allocate, and inside
/// another allocator's call that could wait on its lock).
pub fn resolve_at_load() {
    let in_front = malloc_in_front();
    let (realloc, free) = if in_front { (found(c"realloc"), found(c"free")) } else { (None, None) };
    SERVES_THE_PROCESS.store(in_front || super::dlsym::process_definition_is_ours(c"malloc"), Ordering::Relaxed);
    REALLOC.store(realloc.unwrap_or(NONE), Ordering::Release);
    FREE.store(free.unwrap_or(NONE), Ordering::Release);
}
