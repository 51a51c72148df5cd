//! The CUDA driver entry points the pool serves or must know, on every path a program reaches
//! them by: linked with -lcuda (these symbols); found by name or through `cuGetProcAddress`,
//! which both runtimes use (`cuda_lookup.rs` hands out these same functions). Each is one call into
//! `route::cuda::driver`, which decides whether the pool serves it and answers; a closure names
//! the driver's function a call stands for where one route serves several spellings.

use crate::route::cuda::driver as route;
use crate::sys::cuda_driver::IpcMemHandle;
use core::ffi::{c_int, c_uint, c_void};

with_caller!(
    /// # Safety
    /// As cuMemAlloc_v2.
    fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> c_int, "rdx" => route::mem_alloc
);

with_caller!(
    /// A pitched block from the pool: rows padded to 512 bytes.
    ///
    /// # Safety
    /// As cuMemAllocPitch_v2.
    fn cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element_bytes: c_uint) -> c_int, "r9" => route::mem_alloc_pitch
);

/// Our cached bytes count as free.
///
/// # Safety
/// As cuMemGetInfo_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    route::mem_get_info(free, total)
}

with_caller!(
    /// # Safety
    /// As cuMemHostAlloc.
    fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: c_uint) -> c_int, "rcx" => route::mem_host_alloc
);

with_caller!(
    /// # Safety
    /// As cuMemAllocHost_v2 (cuMemHostAlloc with no flags).
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> c_int, "rdx" => route::mem_alloc_host
);

/// # Safety
/// As cuMemFreeHost.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> c_int {
    route::mem_free_host(p)
}

/// Note [Freed memory answers as freed] (route/cuda/driver.rs).
///
/// # Safety
/// As cuMemHostGetDevicePointer_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(dptr: *mut u64, p: *mut c_void, flags: c_uint) -> c_int {
    route::mem_host_get_device_pointer(dptr, p, flags)
}

/// Note [Freed memory answers as freed] (route/cuda/driver.rs).
///
/// # Safety
/// As cuMemHostGetFlags.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> c_int {
    route::mem_host_get_flags(flags, p)
}

/// Note [Context lifetime] (device/pool/mod.rs).
///
/// # Safety
/// As cuDevicePrimaryCtxReset_v2.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> c_int {
    route::primary_reset(device, |d| d.primary_reset)
}

/// # Safety
/// As cuDevicePrimaryCtxReset.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(device: c_int) -> c_int {
    route::primary_reset(device, |d| d.primary_reset_v1)
}

/// Note [Context lifetime] (device/pool/mod.rs): the last release destroys the primary context.
///
/// # Safety
/// As cuDevicePrimaryCtxRelease_v2.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> c_int {
    route::primary_release(device, |d| d.primary_release)
}

/// # Safety
/// As cuDevicePrimaryCtxRelease.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(device: c_int) -> c_int {
    route::primary_release(device, |d| d.primary_release_v1)
}

/// # Safety
/// As cuCtxEnablePeerAccess.
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: *mut c_void, flags: c_uint) -> c_int {
    route::ctx_enable_peer_access(peer, flags)
}

/// # Safety
/// As cuCtxDestroy_v2.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> c_int {
    route::ctx_destroy(ctx, |d| d.ctx_destroy)
}

/// # Safety
/// As cuCtxDestroy.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: *mut c_void) -> c_int {
    route::ctx_destroy(ctx, |d| d.ctx_destroy_v1)
}

/// Note [Streams that end] (device/pool/blocks.rs).
///
/// # Safety
/// As cuStreamDestroy_v2.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> c_int {
    route::stream_destroy(stream, |d| d.stream_destroy)
}

/// # Safety
/// As cuStreamDestroy.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy(stream: *mut c_void) -> c_int {
    route::stream_destroy(stream, |d| d.stream_destroy_v1)
}

/// Note [IPC] (device/pool/pointers.rs): a block sharing a segment gets a handle of ours.
///
/// # Safety
/// As cuIpcGetMemHandle: `handle` points to a CUipcMemHandle.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut c_void, ptr: u64) -> c_int {
    crate::route::cuda::ipc::driver_get(handle, ptr)
}

/// Note [IPC]: a handle of ours opens the block it names.
///
/// # Safety
/// As cuIpcOpenMemHandle_v2.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcMemHandle, flags: c_uint) -> c_int {
    crate::route::cuda::ipc::driver_open(dptr, handle, flags, false)
}

/// # Safety
/// As cuIpcOpenMemHandle.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(dptr: *mut u64, handle: IpcMemHandle, flags: c_uint) -> c_int {
    crate::route::cuda::ipc::driver_open(dptr, handle, flags, true)
}

/// # Safety
/// As cuIpcCloseMemHandle.
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(dptr: u64) -> c_int {
    crate::route::cuda::ipc::driver_close(dptr)
}

/// Our block's start and size for a pooled pointer, not the segment the driver sees.
///
/// # Safety
/// As cuMemGetAddressRange_v2: each output may be null.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, ptr: u64) -> c_int {
    route::address_range(base, size, ptr)
}

/// The range and buffer-id attributes answer for our block (Note [Buffer ids] in device/pool/pointers.rs).
///
/// # Safety
/// As cuPointerGetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: u64) -> c_int {
    route::pointer_get_attribute(data, attribute, ptr)
}

/// # Safety
/// As cuPointerGetAttributes: `attributes` and `data` hold `count` entries.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(count: c_uint, attributes: *mut c_int, data: *mut *mut c_void, ptr: u64) -> c_int {
    route::pointer_get_attributes(count, attributes, data, ptr)
}

/// A pooled block freed through the driver: back to the pool, with cudaFree's synchronization.
///
/// # Safety
/// As cuMemFree_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> c_int {
    route::mem_free(ptr)
}

/// # Safety
/// As cuMemFreeAsync.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: u64, stream: *mut c_void) -> c_int {
    route::mem_free_async(ptr, stream, |d| d.mem_free_async, false)
}

/// # Safety
/// As cuMemFreeAsync_ptsz.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: *mut c_void) -> c_int {
    route::mem_free_async(ptr, stream, |d| d.mem_free_async_ptsz, true)
}

/// Out of memory, the pool's cache is given back and the call made once more (so for the next three).
///
/// # Safety
/// As cuMemAllocAsync.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, size: usize, stream: *mut c_void) -> c_int {
    route::mem_alloc_async(dptr, size, stream, |d| d.mem_alloc_async)
}

/// # Safety
/// As cuMemAllocAsync_ptsz.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut u64, size: usize, stream: *mut c_void) -> c_int {
    route::mem_alloc_async(dptr, size, stream, |d| d.mem_alloc_async_ptsz)
}

/// # Safety
/// As cuMemAllocManaged.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, size: usize, flags: c_uint) -> c_int {
    route::mem_alloc_managed(dptr, size, flags)
}

/// # Safety
/// As cuMemCreate: `prop` is null or points to a CUmemAllocationProp.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int {
    route::mem_create(handle, size, prop, flags)
}
