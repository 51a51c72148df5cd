//! The malloc family, exported under its C names. Each shim is one call into `route`; on
//! x86-64 the four hot ones are `fast_paths`' instead, and those that allocate hand their
//! caller on (`with_caller!`, Note [Holders]).

use crate::route;
use crate::sys::next::MallInfo;
use core::ffi::{c_int, c_void};

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    route::malloc(size)
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub extern "C" fn free(p: *mut c_void) {
    // SAFETY: the caller holds the C contract for the pointer.
    unsafe { route::free(p) }
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    route::calloc(count, size)
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller holds the C contract for the pointer.
    unsafe { route::realloc(p, size) }
}

with_caller!(fn reallocarray(p: *mut c_void, count: usize, size: usize) -> *mut c_void, "rcx" => route::realloc::reallocarray);
with_caller!(fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32, "rcx" => route::aligned_calls::posix_memalign);
with_caller!(fn aligned_alloc(align: usize, size: usize) -> *mut c_void, "rdx" => route::aligned_calls::memalign);
with_caller!(fn memalign(align: usize, size: usize) -> *mut c_void, "rdx" => route::aligned_calls::memalign);
with_caller!(fn valloc(size: usize) -> *mut c_void, "rsi" => route::aligned_calls::valloc);
with_caller!(fn pvalloc(size: usize) -> *mut c_void, "rsi" => route::aligned_calls::pvalloc);

#[no_mangle]
pub extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: the caller holds the C contract for the pointer.
    unsafe { route::usable_size(p) }
}

/// C23; glibc 2.40+ programs may call it. The size is only a hint.
#[no_mangle]
pub extern "C" fn free_sized(p: *mut c_void, _size: usize) {
    // SAFETY: the caller holds the C contract for the pointer.
    unsafe { route::free_sized(p) }
}

/// C23, as `free_sized`.
#[no_mangle]
pub extern "C" fn free_aligned_sized(p: *mut c_void, _align: usize, _size: usize) {
    // SAFETY: the caller holds the C contract for the pointer.
    unsafe { route::free_sized(p) }
}

// glibc's own names (route/libc_names.rs, Note [glibc's own names]): the same routing, the small
// side on to the next allocator's entry points of the same names.
with_caller!(fn __libc_malloc(size: usize) -> *mut c_void, "rsi" => route::libc_names::malloc);
with_caller!(fn __libc_calloc(count: usize, size: usize) -> *mut c_void, "rdx" => route::libc_names::calloc);
with_caller!(fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void, "rdx" => route::libc_names::realloc);
with_caller!(fn __libc_memalign(align: usize, size: usize) -> *mut c_void, "rdx" => route::libc_names::memalign);
with_caller!(fn __libc_valloc(size: usize) -> *mut c_void, "rsi" => route::libc_names::valloc);
with_caller!(fn __libc_pvalloc(size: usize) -> *mut c_void, "rsi" => route::libc_names::pvalloc);

#[no_mangle]
pub extern "C" fn __libc_free(p: *mut c_void) {
    // SAFETY: the caller holds the C contract for the pointer.
    unsafe { route::libc_names::free(p) }
}

// glibc's control and inspection calls (route/control.rs, report/glibc.rs): our blocks counted
// and controlled as glibc's mmapped ones, then the next allocator's.

#[no_mangle]
pub extern "C" fn malloc_trim(pad: usize) -> c_int {
    route::control::malloc_trim(pad)
}

#[no_mangle]
pub extern "C" fn mallopt(param: c_int, value: c_int) -> c_int {
    route::control::mallopt(param, value)
}

#[no_mangle]
pub extern "C" fn mallinfo() -> MallInfo<c_int> {
    crate::report::glibc::mallinfo()
}

#[no_mangle]
pub extern "C" fn mallinfo2() -> MallInfo<usize> {
    crate::report::glibc::mallinfo2()
}

#[no_mangle]
pub extern "C" fn malloc_stats() {
    crate::report::glibc::malloc_stats()
}

/// # Safety
/// `fp` is an open `FILE` (malloc_info's contract).
#[no_mangle]
pub unsafe extern "C" fn malloc_info(options: c_int, fp: *mut libc::FILE) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { crate::report::glibc::malloc_info(options, fp) }
}
