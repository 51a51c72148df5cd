//! The CUDA runtime entry points we interpose, and the PyTorch pluggable-allocator pair. Each is
//! a few lines over `DEVICE` (the pool) and `sys::cuda::real()` (the runtime, for pointers that
//! are not ours and for pass-through).

use crate::backing::{DeviceError, CUDA_ERROR_INITIALIZATION, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::device::layer::Freed;
use crate::sys::cuda::real;
use crate::DEVICE;
use core::ffi::{c_int, c_uint, c_void};

const NO_RUNTIME: c_int = CUDA_ERROR_INITIALIZATION;

fn ready() -> bool {
    crate::globals().is_some() && DEVICE.enabled()
}

/// # Safety
/// `ptr` is writable, as cudaMalloc requires.
#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    if ptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if !ready() || size == 0 {
        return (rt.malloc)(ptr, size);
    }
    match DEVICE.malloc(size) {
        Ok(addr) => {
            *ptr = addr as *mut c_void;
            CUDA_SUCCESS
        }
        // The runtime itself refused even after our cache was given back: let it answer the
        // program once more, so *ptr and its last error are exactly what it would leave.
        Err(DeviceError::OutOfMemory) => (rt.malloc)(ptr, size),
        Err(e) => {
            *ptr = core::ptr::null_mut();
            e.code()
        }
    }
}

/// # Safety
/// As cudaFree.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    if ptr.is_null() || crate::globals().is_none() {
        return (rt.free)(ptr);
    }
    match DEVICE.free(ptr as usize) {
        Ok(Freed::Pooled) => CUDA_SUCCESS,
        Ok(Freed::NotOurs) => (rt.free)(ptr),
        Err(e) => e.code(),
    }
}

/// # Safety
/// As cudaMemGetInfo.
#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    if !ready() || free.is_null() || total.is_null() {
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
    if !ready() || ptr.is_null() || size == 0 {
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
    cudaHostAlloc(ptr, size, 0)
}

/// # Safety
/// As cudaFreeHost.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    if ptr.is_null() || crate::globals().is_none() {
        return (rt.free_host)(ptr);
    }
    match DEVICE.host_free(ptr as usize) {
        Ok(Freed::Pooled) => CUDA_SUCCESS,
        Ok(Freed::NotOurs) => (rt.free_host)(ptr),
        Err(e) => e.code(),
    }
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
    if real().is_none() || crate::globals().is_none() || size == 0 {
        return core::ptr::null_mut();
    }
    DEVICE.malloc_on_stream(size, device, stream as usize).map_or(core::ptr::null_mut(), |a| a as *mut c_void)
}

/// PyTorch's CUDAPluggableAllocator `free`.
///
/// # Safety
/// `ptr` came from `tm_cuda_alloc`.
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_free(ptr: *mut c_void, _size: isize, device: c_int, stream: *mut c_void) {
    let Some(rt) = real() else { return };
    if ptr.is_null() {
        return;
    }
    if DEVICE.free_on_stream(ptr as usize, device, stream as usize) == Freed::NotOurs {
        (rt.free)(ptr);
    }
}
