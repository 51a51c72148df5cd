//! The lookups that hand out driver entry points, and ours in their place where the pool serves
//! them: `cuGetProcAddress(_v2)` (both runtimes use it), the runtime's `cudaGetDriverEntryPoint*`,
//! and (x86-64) the exported `dlsym`: a program or runtime that takes libcuda's entry points by
//! name (`dlopen("libcuda.so.1")` then `dlsym`: nvcc's static runtime, Numba, JAX) gets ours for
//! the few the pool must see (`served_symbol` decides); every other lookup tail-jumps to glibc's
//! dlsym with the caller's registers and return address untouched, so `RTLD_NEXT` keeps meaning
//! "after the caller". On other targets dlsym is not interposed (README).

use super::cuda_driver::*;
use crate::backing::{CUDA_ERROR_INITIALIZATION, CUDA_SUCCESS};
use crate::route::cuda::pool_on;
use crate::sys::cuda_driver::{driver, DriverFns};
use core::ffi::{c_char, c_int, c_uint, c_void};

const NO_DRIVER: c_int = CUDA_ERROR_INITIALIZATION;

/// Our entry point for an exported driver symbol we serve, and the address of the real one it
/// stands in for.
fn served(symbol: &[u8], d: &DriverFns) -> Option<(*mut c_void, Option<usize>)> {
    macro_rules! row {
        ($ours:expr, $real:expr) => {
            Some(($ours as *mut c_void, $real.map(|f| f as usize)))
        };
    }
    match symbol {
        b"cuMemAlloc_v2" => row!(cuMemAlloc_v2, d.mem_alloc),
        b"cuMemAllocPitch_v2" => row!(cuMemAllocPitch_v2, d.mem_alloc_pitch),
        b"cuMemFree_v2" => row!(cuMemFree_v2, d.mem_free),
        b"cuMemGetInfo_v2" => row!(cuMemGetInfo_v2, d.mem_get_info),
        b"cuMemHostAlloc" => row!(cuMemHostAlloc, d.mem_host_alloc),
        b"cuMemAllocHost_v2" => row!(cuMemAllocHost_v2, d.mem_alloc_host),
        b"cuMemFreeHost" => row!(cuMemFreeHost, d.mem_free_host),
        b"cuMemAllocAsync" => row!(cuMemAllocAsync, d.mem_alloc_async),
        b"cuMemAllocAsync_ptsz" => row!(cuMemAllocAsync_ptsz, d.mem_alloc_async_ptsz),
        b"cuMemAllocManaged" => row!(cuMemAllocManaged, d.mem_alloc_managed),
        b"cuMemCreate" => row!(cuMemCreate, d.mem_create),
        b"cuMemFreeAsync" => row!(cuMemFreeAsync, d.mem_free_async),
        b"cuMemFreeAsync_ptsz" => row!(cuMemFreeAsync_ptsz, d.mem_free_async_ptsz),
        b"cuDevicePrimaryCtxRelease_v2" => row!(cuDevicePrimaryCtxRelease_v2, d.primary_release),
        b"cuDevicePrimaryCtxRelease" => row!(cuDevicePrimaryCtxRelease, d.primary_release_v1),
        b"cuDevicePrimaryCtxReset_v2" => row!(cuDevicePrimaryCtxReset_v2, d.primary_reset),
        b"cuDevicePrimaryCtxReset" => row!(cuDevicePrimaryCtxReset, d.primary_reset_v1),
        b"cuCtxDestroy_v2" => row!(cuCtxDestroy_v2, d.ctx_destroy),
        b"cuCtxDestroy" => row!(cuCtxDestroy, d.ctx_destroy_v1),
        b"cuIpcGetMemHandle" => row!(cuIpcGetMemHandle, d.ipc_get_mem_handle),
        b"cuMemGetAddressRange_v2" => row!(cuMemGetAddressRange_v2, d.address_range),
        b"cuPointerGetAttribute" => row!(cuPointerGetAttribute, d.pointer_get_attribute),
        b"cuPointerGetAttributes" => row!(cuPointerGetAttributes, d.pointer_get_attributes),
        b"cuGetProcAddress" => row!(cuGetProcAddress, d.get_proc_address),
        b"cuGetProcAddress_v2" => row!(cuGetProcAddress_v2, d.get_proc_address_v2),
        _ => None,
    }
}

/// The exported name `cuGetProcAddress` hands out for `base` at `cuda_version`: the version
/// thresholds of the driver's own table for the entry points we serve.
fn versioned(base: &[u8], cuda_version: c_int, per_thread: bool) -> Option<&'static [u8]> {
    let at = |since: c_int, new: &'static [u8], old: &'static [u8]| Some(if cuda_version >= since { new } else { old });
    match base {
        b"cuMemAlloc" => at(3020, b"cuMemAlloc_v2", b"cuMemAlloc"),
        b"cuMemAllocPitch" => at(3020, b"cuMemAllocPitch_v2", b"cuMemAllocPitch"),
        b"cuMemFree" => at(3020, b"cuMemFree_v2", b"cuMemFree"),
        b"cuMemGetInfo" => at(3020, b"cuMemGetInfo_v2", b"cuMemGetInfo"),
        b"cuMemAllocHost" => at(3020, b"cuMemAllocHost_v2", b"cuMemAllocHost"),
        b"cuMemGetAddressRange" => at(3020, b"cuMemGetAddressRange_v2", b"cuMemGetAddressRange"),
        b"cuCtxDestroy" => at(4000, b"cuCtxDestroy_v2", b"cuCtxDestroy"),
        b"cuDevicePrimaryCtxRelease" => at(11000, b"cuDevicePrimaryCtxRelease_v2", b"cuDevicePrimaryCtxRelease"),
        b"cuDevicePrimaryCtxReset" => at(11000, b"cuDevicePrimaryCtxReset_v2", b"cuDevicePrimaryCtxReset"),
        b"cuGetProcAddress" => at(12000, b"cuGetProcAddress_v2", b"cuGetProcAddress"),
        b"cuMemFreeAsync" => Some(if per_thread { b"cuMemFreeAsync_ptsz" } else { b"cuMemFreeAsync" }),
        b"cuMemAllocAsync" => Some(if per_thread { b"cuMemAllocAsync_ptsz" } else { b"cuMemAllocAsync" }),
        b"cuMemAllocManaged" => Some(b"cuMemAllocManaged"),
        b"cuMemCreate" => Some(b"cuMemCreate"),
        b"cuMemHostAlloc" => Some(b"cuMemHostAlloc"),
        b"cuMemFreeHost" => Some(b"cuMemFreeHost"),
        b"cuIpcGetMemHandle" => Some(b"cuIpcGetMemHandle"),
        b"cuPointerGetAttribute" => Some(b"cuPointerGetAttribute"),
        b"cuPointerGetAttributes" => Some(b"cuPointerGetAttributes"),
        _ => None,
    }
}

const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// After a successful lookup of `symbol` that produced `*pfn`: ours in its place when we serve
/// that entry point at that version. `flags` are cuGetProcAddress's (the runtime's
/// cudaGetDriverEntryPoint flags have the same values).
unsafe fn substitute_proc(symbol: *const core::ffi::c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() || (*pfn).is_null() || !pool_on() {
        return;
    }
    let Some(d) = driver() else { return };
    let base = core::ffi::CStr::from_ptr(symbol).to_bytes();
    let per_thread = flags == PER_THREAD_DEFAULT_STREAM || d.mem_free_async_ptsz.is_some_and(|f| f as usize == *pfn as usize);
    // Only where our wrapper has the driver's export of that name to forward to.
    if let Some((ours, Some(_))) = versioned(base, cuda_version, per_thread).and_then(|name| served(name, d)) {
        *pfn = ours;
    }
}

/// # Safety
/// As cuGetProcAddress (CUDA 11.3 to 11.8's form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const core::ffi::c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> c_int {
    let Some(get) = driver().and_then(|d| d.get_proc_address) else { return NO_DRIVER };
    let rc = get(symbol, pfn, cuda_version, flags);
    if rc == CUDA_SUCCESS {
        substitute_proc(symbol, pfn, cuda_version, flags);
    }
    rc
}

/// # Safety
/// As cuGetProcAddress_v2 (CUDA 12's, with the query result).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(symbol: *const core::ffi::c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_int) -> c_int {
    let Some(get) = driver().and_then(|d| d.get_proc_address_v2) else { return NO_DRIVER };
    let rc = get(symbol, pfn, cuda_version, flags, status);
    if rc == CUDA_SUCCESS {
        substitute_proc(symbol, pfn, cuda_version, flags);
    }
    rc
}

/// Decides a `dlsym(handle, name)` (called by our exported dlsym, `shim::dlsym`): ours when
/// `name` is a driver entry point we serve and `handle` resolves it to the very driver we bind;
/// null to let glibc's dlsym answer (every other lookup, `RTLD_DEFAULT` and `RTLD_NEXT`
/// included: by symbol those already reach ours, or deliberately the next definition).
/// Allocation-free; before our init or with the pool off it never serves.
#[cfg(target_arch = "x86_64")]
extern "C" fn served_symbol(handle: *mut c_void, name: *const core::ffi::c_char) -> *mut c_void {
    let real_dlsym = crate::sys::dlsym::resolve(dlsym as *const ());
    let none = core::ptr::null_mut();
    if name.is_null() || handle.is_null() || handle == libc::RTLD_NEXT {
        return none;
    }
    // SAFETY: dlsym's name is a C string.
    let symbol = unsafe { core::ffi::CStr::from_ptr(name) }.to_bytes();
    if !symbol.starts_with(b"cu") || !pool_on() {
        return none;
    }
    let Some(d) = driver() else { return none };
    let Some((ours, Some(real_addr))) = served(symbol, d) else { return none };
    // SAFETY: glibc's dlsym with the caller's handle and name.
    let found = unsafe { real_dlsym(handle, name) };
    if found as usize == real_addr {
        ours
    } else {
        none
    }
}

/// The runtime's way to a driver entry point: ours for those the pool serves, as
/// cuGetProcAddress gives (the runtime asks at its own CUDA version).
///
/// # Safety
/// As cudaGetDriverEntryPoint (CUDA 12's form; CUDA 11's has no status pointer, which the
/// runtime of such a program then does not read either).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(symbol: *const core::ffi::c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int) -> c_int {
    let Some(get) = crate::sys::cuda::real().and_then(|rt| rt.get_driver_entry_point) else { return CUDA_ERROR_INITIALIZATION };
    let rc = get(symbol, pfn, flags, status);
    if rc == CUDA_SUCCESS {
        substitute_proc(symbol, pfn, c_int::MAX, flags);
    }
    rc
}

/// # Safety
/// As cudaGetDriverEntryPointByVersion.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(symbol: *const core::ffi::c_char, pfn: *mut *mut c_void, cuda_version: c_uint, flags: u64, status: *mut c_int) -> c_int {
    let Some(get) = crate::sys::cuda::real().and_then(|rt| rt.get_driver_entry_point_by_version) else { return CUDA_ERROR_INITIALIZATION };
    let rc = get(symbol, pfn, cuda_version, flags, status);
    if rc == CUDA_SUCCESS {
        substitute_proc(symbol, pfn, c_int::try_from(cuda_version).unwrap_or(c_int::MAX), flags);
    }
    rc
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // Keep the arguments, align the stack for the call (entry leaves rsp 8 off 16).
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        decide = sym served_symbol,
        real = sym crate::sys::dlsym::REAL_DLSYM,
    )
}
