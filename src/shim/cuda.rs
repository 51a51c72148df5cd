//! The CUDA runtime entry points we interpose, and the PyTorch pluggable-allocator pair. Each is
//! a few lines over `DEVICE` (the pool) and `sys::cuda::real()` (the runtime, for pointers that
//! are not ours and for pass-through). A call re-entered from inside the runtime on the same
//! thread goes straight to the real function (`sys::reentry`). Whether the pool serves a call,
//! and the answer to a free, are `route::cuda`'s; `cudaGetDriverEntryPoint*` is in `lookup.rs`.

use crate::backing::{DeviceError, CUDA_ERROR_INITIALIZATION, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::device::layer::Freed;
use crate::route::cuda::{self as route, answer_free, export_checked, warn_refused, FreeOf};
use crate::sys::cuda::real;
use crate::sys::reentry;
use crate::DEVICE;
use core::ffi::{c_int, c_uint, c_void};

const NO_RUNTIME: c_int = CUDA_ERROR_INITIALIZATION;


/// # Safety
/// `ptr` is writable, as cudaMalloc requires.
#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.malloc)(ptr, size) };
    if ptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if size == 0 || !route::runtime_ready(rt) {
        return (rt.malloc)(ptr, size);
    }
    match DEVICE.malloc(size) {
        Ok(addr) => {
            *ptr = addr as *mut c_void;
            CUDA_SUCCESS
        }
        Err(DeviceError::CapReached) => {
            *ptr = core::ptr::null_mut();
            DeviceError::CapReached.code()
        }
        // The device refused even after our cache was given back, or the context cannot serve
        // the pool (reset a moment ago: the runtime brings it back at its next call): let the
        // runtime answer, so *ptr and its last error are exactly what it would leave.
        Err(_) => {
            DEVICE.passthrough.add(1);
            (rt.malloc)(ptr, size)
        }
    }
}

/// # Safety
/// As cudaFree.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.free)(ptr) };
    if ptr.is_null() || crate::globals().is_none() {
        return (rt.free)(ptr);
    }
    answer_free("cudaFree", ptr as usize, FreeOf::Device, DEVICE.free(ptr as usize), || (rt.free)(ptr))
}

/// # Safety
/// As cudaMemGetInfo.
#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.mem_get_info)(free, total) };
    if free.is_null() || total.is_null() || !route::runtime_ready(rt) {
        return (rt.mem_get_info)(free, total);
    }
    match DEVICE.mem_info() {
        Ok((f, t)) => {
            *free = f;
            *total = t;
            CUDA_SUCCESS
        }
        Err(e) => e.code(),
    }
}

/// # Safety
/// As cudaHostAlloc.
#[no_mangle]
pub unsafe extern "C" fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.host_alloc)(ptr, size, flags) };
    if ptr.is_null() || size == 0 || !route::runtime_ready(rt) {
        return (rt.host_alloc)(ptr, size, flags);
    }
    match DEVICE.host_alloc(size, flags) {
        Ok(addr) => {
            *ptr = addr as *mut c_void;
            CUDA_SUCCESS
        }
        Err(e) => e.code(),
    }
}

/// # Safety
/// As cudaMallocHost (cudaHostAlloc with default flags).
#[no_mangle]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    match real() {
        // Re-entered (the runtime's cudaHostAlloc calling it): the runtime's own.
        Some(rt) if reentry::enter().is_none() => (rt.malloc_host)(ptr, size),
        _ => cudaHostAlloc(ptr, size, 0),
    }
}

/// # Safety
/// As cudaFreeHost.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.free_host)(ptr) };
    if ptr.is_null() || crate::globals().is_none() {
        return (rt.free_host)(ptr);
    }
    // The runtime binds a context before it frees, on a thread that made no CUDA call too; so
    // do we, for the synchronization a pooled free makes (with the pool off, the runtime does).
    if route::pool_on() {
        route::context_bound(rt);
    }
    answer_free("cudaFreeHost", ptr as usize, FreeOf::Pinned, DEVICE.host_free(ptr as usize), || (rt.free_host)(ptr))
}

/// Note [Context lifetime]: the reset frees every allocation of the current device's primary
/// context, our cached segments and the blocks still live among them; the pool forgets them all
/// (before, and again after, in case another thread mapped one meanwhile).
///
/// # Safety
/// As cudaDeviceReset.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(reset) = rt.device_reset else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return reset() };
    let mut current: c_int = 0;
    let device = ((rt.get_device)(&mut current) == CUDA_SUCCESS).then_some(current);
    if let Some(d) = device {
        DEVICE.forget_primary(d);
    }
    let rc = reset();
    if let Some(d) = device {
        DEVICE.forget_primary(d);
    }
    rc
}

/// Note [IPC]: a handle names a whole runtime allocation. A pooled block that is its own segment
/// gets the runtime's handle (and its segment never returns to the cache); a block sharing a
/// segment is refused, since the peer would map its neighbours.
///
/// # Safety
/// As cudaIpcGetMemHandle: `handle` points to a cudaIpcMemHandle_t.
#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(handle: *mut c_void, ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(get) = rt.ipc_get_mem_handle else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return get(handle, ptr) };
    match export_checked("cudaIpcGetMemHandle", ptr as usize) {
        Ok(()) => get(handle, ptr),
        Err(()) => CUDA_ERROR_INVALID_VALUE,
    }
}

/// A pooled pointer returns to our pool, reusable on `stream` at once and by others after a
/// synchronization (Note [Safe reuse]); anything else is the runtime's.
///
/// # Safety
/// As cudaFreeAsync.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(free_async) = rt.free_async else { return NO_RUNTIME };
    free_async_via(ptr, stream, free_async)
}

/// The per-thread-default-stream spelling of cudaFreeAsync.
///
/// # Safety
/// As cudaFreeAsync.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(free_async) = rt.free_async_ptsz else { return NO_RUNTIME };
    free_async_via(ptr, stream, free_async)
}

unsafe fn free_async_via(ptr: *mut c_void, stream: *mut c_void, real_free: crate::sys::cuda::FreeAsyncFn) -> c_int {
    let Some(_entered) = reentry::enter() else { return real_free(ptr, stream) };
    if ptr.is_null() || crate::globals().is_none() {
        return real_free(ptr, stream);
    }
    answer_free("cudaFreeAsync", ptr as usize, FreeOf::Device, Ok(DEVICE.free_async(ptr as usize, stream as usize)), || real_free(ptr, stream))
}

/// PyTorch's CUDAPluggableAllocator `alloc`: `torch.cuda.memory.CUDAPluggableAllocator(
/// "libtensormalloc.so", "tm_cuda_alloc", "tm_cuda_free")`. Reuse is stream-aware: a block freed
/// on a stream is reused on that stream with no synchronization.
///
/// # Safety
/// Called by PyTorch with a valid device and stream.
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let size = usize::try_from(size).unwrap_or(0);
    if crate::globals().is_none() || size == 0 {
        return core::ptr::null_mut();
    }
    if let Some(rt) = real() {
        route::context_bound(rt);
    }
    DEVICE.malloc_on_stream(size, device, stream as usize).map_or(core::ptr::null_mut(), |a| a as *mut c_void)
}

/// PyTorch's CUDAPluggableAllocator `free`.
///
/// # Safety
/// `ptr` came from `tm_cuda_alloc`.
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_free(ptr: *mut c_void, _size: isize, device: c_int, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    match DEVICE.free_on_stream(ptr as usize, device, stream as usize) {
        Freed::Pooled => return,
        Freed::Refused => return warn_refused("tm_cuda_free", ptr as usize, FreeOf::Device),
        Freed::NotOurs => {}
    }
    if let Some(rt) = real() {
        (rt.free)(ptr);
    } else if let Some(free) = crate::sys::cuda_driver::driver().and_then(|d| d.mem_free) {
        free(ptr as u64);
    }
}
