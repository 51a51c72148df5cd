//! numpy's NEP 49 data-memory handler, exported as a static `PyDataMem_Handler` named
//! "tensormalloc" whose four functions are the malloc shims' routes: the Python package wraps it
//! in a "mem_handler" capsule and installs it with `PyDataMem_SetHandler`, no LD_PRELOAD needed.
//! Loaded by path the calls reach the host layer directly; preloaded, the same cache serves both.

use crate::config::HugePages;
use crate::route;
use core::ffi::c_void;

/// Blocks numpy asks for through the handler are numpy's (Note [Holders]).
const NUMPY: crate::record::holders::Asker = crate::record::holders::Asker::hook(0, crate::record::holders::KEY_NUMPY);

/// numpy's `PyDataMemAllocator` (numpy/ndarraytypes.h, version 1): a context and four functions.
#[repr(C)]
pub struct DataMemAllocator {
    ctx: *mut c_void,
    malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize),
}

/// numpy's `PyDataMem_Handler`: a 127-byte name, a version byte, the allocator.
#[repr(C)]
pub struct DataMemHandler {
    name: [u8; 127],
    version: u8,
    allocator: DataMemAllocator,
}

// SAFETY: immutable after link time; ctx is never dereferenced.
unsafe impl Sync for DataMemHandler {}

// Evaluated at compile time: an index out of range would fail the build, not panic.
#[allow(clippy::indexing_slicing)]
const fn handler_name() -> [u8; 127] {
    let mut name = [0u8; 127];
    let src = b"tensormalloc";
    let mut i = 0;
    while i < src.len() {
        name[i] = src[i];
        i += 1;
    }
    name
}

/// The handler the capsule points to. A static, so it outlives every array made with it.
#[no_mangle]
pub static tm_numpy_handler: DataMemHandler = DataMemHandler {
    name: handler_name(),
    version: 1,
    allocator: DataMemAllocator {
        ctx: core::ptr::null_mut(),
        malloc: tm_numpy_malloc,
        calloc: tm_numpy_calloc,
        realloc: tm_numpy_realloc,
        free: tm_numpy_free,
    },
};

/// The capsule's name ("mem_handler"): a capsule keeps a pointer to its name, not a copy, so it
/// must live as long as the capsule, which numpy's arrays may keep past the Python module.
#[no_mangle]
pub static tm_numpy_capsule_name: [u8; 12] = *b"mem_handler\0";

/// numpy's default handler asks for transparent huge pages on data of 4 MiB and more
/// (`indicate_hugepages`); under LD_PRELOAD it still does so on our blocks. Through this
/// handler numpy no longer does, so we do, on the same range: else a fresh block faults in
/// 4 KiB pages where the default handler's faulted in 2 MiB ones.
const HUGEPAGE_FROM: usize = 4 << 20;

fn advise_hugepages(p: *mut c_void, size: usize) {
    if p.is_null() || size < HUGEPAGE_FROM {
        return;
    }
    if crate::state::globals().is_some_and(|g| g.config.hugepages == HugePages::Never) {
        return;
    }
    // [p + off, p + size) lies inside the block just handed out; MADV_HUGEPAGE changes no
    // contents, and its failure (an old kernel, THP off) is harmless and ignored, as numpy does.
    let off = 4096 - (p as usize) % 4096;
    crate::backing::PageMemory::advise_huge(&crate::sys::os_pages::OsPages, p as usize + off, size.saturating_sub(off));
}

/// numpy's `malloc`: the malloc shim's route.
///
/// # Safety
/// Called by numpy as its allocator's malloc.
#[no_mangle]
pub unsafe extern "C" fn tm_numpy_malloc(_ctx: *mut c_void, size: usize) -> *mut c_void {
    let p = route::malloc_as(size, NUMPY);
    advise_hugepages(p, size);
    p
}

/// numpy's `calloc`.
///
/// # Safety
/// Called by numpy as its allocator's calloc.
#[no_mangle]
pub unsafe extern "C" fn tm_numpy_calloc(_ctx: *mut c_void, count: usize, size: usize) -> *mut c_void {
    let p = route::calloc_as(count, size, NUMPY);
    advise_hugepages(p, count.saturating_mul(size));
    p
}

/// numpy's `realloc`.
///
/// # Safety
/// `p` is NULL or came from this handler and is not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tm_numpy_realloc(_ctx: *mut c_void, p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller holds the C contract for the pointer.
    let q = unsafe { route::realloc_as(p, size, NUMPY) };
    advise_hugepages(q, size);
    q
}

/// numpy's `free`; the size is only a hint.
///
/// # Safety
/// `p` is NULL or came from this handler and is not yet freed.
#[no_mangle]
pub unsafe extern "C" fn tm_numpy_free(_ctx: *mut c_void, p: *mut c_void, _size: usize) {
    // SAFETY: the caller holds the C contract for the pointer.
    unsafe { route::free(p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout numpy reads (numpy/ndarraytypes.h on x86-64 and aarch64): the allocator at
    /// offset 128, 48 bytes of it; the name NUL-terminated.
    #[test]
    fn handler_has_numpys_layout() {
        assert_eq!(core::mem::offset_of!(DataMemHandler, version), 127);
        assert_eq!(core::mem::offset_of!(DataMemHandler, allocator), 128);
        assert_eq!(core::mem::size_of::<DataMemHandler>(), 128 + 5 * 8);
        let name = &tm_numpy_handler.name;
        assert_eq!(&name[..13], b"tensormalloc\0");
        assert_eq!(tm_numpy_handler.version, 1);
        assert_eq!(&tm_numpy_capsule_name, b"mem_handler\0");
    }
}
