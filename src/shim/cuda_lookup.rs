//! The lookups that hand out driver entry points, and ours in their place where the pool serves
//! them: `cuGetProcAddress(_v2)` (both runtimes use it), the runtime's `cudaGetDriverEntryPoint*`,
//! and (x86-64) the exported `dlsym`: a program or runtime that takes libcuda's entry points by
//! name (`dlopen("libcuda.so.1")` then `dlsym`: nvcc's static runtime, Numba, JAX) gets ours for
//! the few the pool must see; every other lookup tail-jumps to glibc's dlsym with the caller's
//! registers and return address untouched, so `RTLD_NEXT` keeps meaning "after the caller". On
//! other targets dlsym is not interposed (docs/limits.md). Each entry point is one call into
//! `route::cuda::lookup`, given `served`: the table naming our entry points (`cuda_driver.rs`'s,
//! `cuda_captures.rs`' and this file's), the one thing the route cannot name. This file imports `cuda_driver.rs`;
//! nothing under `shim/` imports this one.

use super::cuda_captures::*;
use super::cuda_driver::*;
use crate::route::cuda::lookup as route;
use crate::sys::cuda_driver::DriverFns;
use core::ffi::{c_char, c_int, c_uint, c_void};

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
        b"cuMemHostGetDevicePointer_v2" => row!(cuMemHostGetDevicePointer_v2, d.mem_host_get_device_pointer),
        b"cuMemHostGetFlags" => row!(cuMemHostGetFlags, d.mem_host_get_flags),
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
        b"cuStreamDestroy_v2" => row!(cuStreamDestroy_v2, d.stream_destroy),
        b"cuStreamDestroy" => row!(cuStreamDestroy, d.stream_destroy_v1),
        b"cuCtxEnablePeerAccess" => row!(cuCtxEnablePeerAccess, d.ctx_enable_peer_access),
        b"cuIpcGetMemHandle" => row!(cuIpcGetMemHandle, d.ipc_get_mem_handle),
        b"cuIpcOpenMemHandle_v2" => row!(cuIpcOpenMemHandle_v2, d.ipc_open_mem_handle),
        b"cuIpcOpenMemHandle" => row!(cuIpcOpenMemHandle, d.ipc_open_mem_handle_v1),
        b"cuIpcCloseMemHandle" => row!(cuIpcCloseMemHandle, d.ipc_close_mem_handle),
        b"cuMemGetAddressRange_v2" => row!(cuMemGetAddressRange_v2, d.address_range),
        b"cuPointerGetAttribute" => row!(cuPointerGetAttribute, d.pointer_get_attribute),
        b"cuPointerGetAttributes" => row!(cuPointerGetAttributes, d.pointer_get_attributes),
        b"cuStreamBeginCapture" => row!(cuStreamBeginCapture, d.begin_capture_v1),
        b"cuStreamBeginCapture_ptsz" => row!(cuStreamBeginCapture_ptsz, d.begin_capture_v1_ptsz),
        b"cuStreamBeginCapture_v2" => row!(cuStreamBeginCapture_v2, d.begin_capture),
        b"cuStreamBeginCapture_v2_ptsz" => row!(cuStreamBeginCapture_v2_ptsz, d.begin_capture_ptsz),
        b"cuStreamBeginCaptureToGraph" => row!(cuStreamBeginCaptureToGraph, d.begin_capture_to_graph),
        b"cuStreamBeginCaptureToGraph_ptsz" => row!(cuStreamBeginCaptureToGraph_ptsz, d.begin_capture_to_graph_ptsz),
        b"cuStreamEndCapture" => row!(cuStreamEndCapture, d.end_capture),
        b"cuStreamEndCapture_ptsz" => row!(cuStreamEndCapture_ptsz, d.end_capture_ptsz),
        b"cuGetProcAddress" => row!(cuGetProcAddress, d.get_proc_address),
        b"cuGetProcAddress_v2" => row!(cuGetProcAddress_v2, d.get_proc_address_v2),
        _ => None,
    }
}

/// # Safety
/// As cuGetProcAddress (CUDA 11.3 to 11.8's form).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) -> c_int {
    route::get_proc_address(symbol, pfn, cuda_version, flags, served)
}

/// # Safety
/// As cuGetProcAddress_v2 (CUDA 12's, with the query result).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_int) -> c_int {
    route::get_proc_address_v2(symbol, pfn, cuda_version, flags, status, served)
}

/// The runtime's way to a driver entry point: ours for those the pool serves, as
/// cuGetProcAddress gives.
///
/// # Safety
/// As cudaGetDriverEntryPoint (CUDA 12's form; CUDA 11's has no status pointer, which the
/// runtime of such a program then does not read either).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int) -> c_int {
    route::driver_entry_point(symbol, pfn, flags, status, served)
}

/// # Safety
/// As cudaGetDriverEntryPointByVersion.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_uint, flags: u64, status: *mut c_int) -> c_int {
    route::driver_entry_point_by_version(symbol, pfn, cuda_version, flags, status, served)
}

/// Decides a `dlsym(handle, name)` for the exported dlsym below: ours, or null to let glibc's
/// dlsym answer (`route::cuda::lookup::served_symbol`, and for the names we define looked up
/// through a library's handle `route::control::served_symbol`).
#[cfg(target_arch = "x86_64")]
extern "C" fn served_symbol(handle: *mut c_void, name: *const c_char, caller: usize) -> *mut c_void {
    let cuda = route::served_symbol(handle, name, served, dlsym as *const ());
    if !cuda.is_null() || name.is_null() {
        return cuda;
    }
    // SAFETY: dlsym's name is a C string.
    let name = unsafe { core::ffi::CStr::from_ptr(name) };
    let real = crate::sys::dlsym::resolve(dlsym as *const ());
    crate::route::control::served_symbol(handle, name, real, caller).unwrap_or(core::ptr::null_mut())
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // Keep the arguments, align the stack for the call (entry leaves rsp 8 off 16); the
        // caller's return address is the third argument.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdx, [rsp + 24]",
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
