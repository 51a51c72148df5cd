//! The runtime's calls (`shim::cuda_runtime`'s entry points, one call each), routed: each over `DEVICE`
//! (the pool) and `sys::cuda::real()` (the runtime, for pointers that are not ours and for
//! pass-through). A call re-entered from inside the runtime on the same thread goes straight to
//! the real function (`sys::reentry`); with no runtime to reach, the answer is "not initialized".

use crate::record::holders::Asker;
use super::{answer_free, context_bound, runtime_ready, warn_refused, FreeOf};
use crate::backing::{DeviceError, CUDA_ERROR_INITIALIZATION, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_MEMORY_ALLOCATION, CUDA_SUCCESS};
use crate::device::device_layer::FreeAnswer;
use crate::sys::cuda_runtime::{real, CudaFns, FreeAsyncFn};
use crate::sys::reentry;
use crate::state::DEVICE;
use core::ffi::{c_int, c_uint, c_void};

const NO_RUNTIME: c_int = CUDA_ERROR_INITIALIZATION;

/// Our own error answer to a runtime call (a refused free, the cap's out of memory), recorded by
/// the runtime as its last error as it would have (cudaGetLastError and cudaPeekAtLastError
/// are per thread and read it): a call of its own that fails the same way and touches nothing,
/// a free of address 1 (no allocation is there: invalid value) or an allocation no device can
/// hold (out of memory). The runtime's driver calls meet our re-entry guard and go straight to
/// the driver. Error paths only.
pub(super) fn as_the_runtime(rt: &CudaFns, code: c_int) -> c_int {
    // SAFETY: calls of the real runtime with arguments it refuses without touching memory.
    unsafe {
        match code {
            CUDA_ERROR_INVALID_VALUE => {
                (rt.free)(core::ptr::without_provenance_mut(1));
            }
            CUDA_ERROR_MEMORY_ALLOCATION => {
                let mut nothing = core::ptr::null_mut();
                (rt.malloc)(&mut nothing, usize::MAX);
            }
            _ => {}
        }
    }
    code
}

/// # Safety
/// As cudaMalloc: `ptr` is writable.
pub unsafe extern "C" fn malloc(ptr: *mut *mut c_void, size: usize, asker: Asker) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.malloc)(ptr, size) };
    if ptr.is_null() {
        return as_the_runtime(rt, CUDA_ERROR_INVALID_VALUE);
    }
    if size == 0 || !runtime_ready(rt) {
        return (rt.malloc)(ptr, size);
    }
    match DEVICE.malloc(size, asker.holder()) {
        Ok(addr) => {
            *ptr = addr as *mut c_void;
            CUDA_SUCCESS
        }
        Err(DeviceError::CapReached) => {
            *ptr = core::ptr::null_mut();
            DEVICE.out_of_memory(size, true, asker.holder());
            as_the_runtime(rt, DeviceError::CapReached.code())
        }
        // The device refused even after our cache was given back, or the context cannot serve
        // the pool (reset a moment ago: the runtime brings it back at its next call): let the
        // runtime answer, so *ptr and its last error are exactly what it would leave (the
        // device layer's calls go to the driver, which keeps no last error for the runtime).
        Err(_) => {
            let rc = (rt.malloc)(ptr, size);
            if rc == DeviceError::OutOfMemory.code() {
                DEVICE.out_of_memory(size, false, asker.holder());
            }
            rc
        }
    }
}

/// # Safety
/// As cudaFree.
pub unsafe fn free(ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.free)(ptr) };
    if ptr.is_null() || !super::pool_answers() {
        return (rt.free)(ptr);
    }
    // As in free_host: the runtime binds a context first, and the program's driver calls after
    // count on it.
    if super::pool_on() {
        context_bound(rt);
    }
    // A refusal is recorded as the runtime's last error (once more, harmlessly, when the answer
    // was the runtime's own).
    let rc = answer_free("cudaFree", ptr as usize, FreeOf::Device, DEVICE.free(ptr as usize), || (rt.free)(ptr));
    if rc == CUDA_ERROR_INVALID_VALUE {
        as_the_runtime(rt, rc)
    } else {
        rc
    }
}

/// Our cached bytes count as free.
///
/// # Safety
/// As cudaMemGetInfo.
pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.mem_get_info)(free, total) };
    if free.is_null() || total.is_null() || !runtime_ready(rt) {
        return (rt.mem_get_info)(free, total);
    }
    match DEVICE.mem_info() {
        Ok((f, t)) => {
            *free = f;
            *total = t;
            CUDA_SUCCESS
        }
        // As in malloc: a context reset a moment ago is brought back by the runtime's own call.
        Err(_) => (rt.mem_get_info)(free, total),
    }
}

/// # Safety
/// As cudaHostAlloc.
pub unsafe extern "C" fn host_alloc(ptr: *mut *mut c_void, size: usize, flags: c_uint, asker: Asker) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.host_alloc)(ptr, size, flags) };
    if ptr.is_null() || size == 0 || !runtime_ready(rt) {
        return (rt.host_alloc)(ptr, size, flags);
    }
    match DEVICE.host_alloc(size, flags, asker.holder()) {
        Ok(addr) => {
            *ptr = addr as *mut c_void;
            CUDA_SUCCESS
        }
        // As in malloc: after cudaDeviceReset the current context is the destroyed one until
        // the runtime's next call makes a new one, which the pool's driver calls never do (they
        // answered 709 where the runtime alone succeeds); refused memory is the runtime's to
        // answer too, with *ptr and its last error as it leaves them.
        Err(_) => (rt.host_alloc)(ptr, size, flags),
    }
}

/// cudaHostAlloc with default flags; re-entered (the runtime's cudaHostAlloc calling it), the
/// runtime's own.
///
/// # Safety
/// As cudaMallocHost.
pub unsafe extern "C" fn malloc_host(ptr: *mut *mut c_void, size: usize, asker: Asker) -> c_int {
    match real() {
        Some(rt) if reentry::enter().is_none() => (rt.malloc_host)(ptr, size),
        _ => host_alloc(ptr, size, 0, asker),
    }
}

/// # Safety
/// As cudaFreeHost.
pub unsafe fn free_host(ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return (rt.free_host)(ptr) };
    if ptr.is_null() || !super::pool_answers() {
        return (rt.free_host)(ptr);
    }
    // The runtime binds a context before it frees, on a thread that made no CUDA call too; so
    // do we, for the synchronization a pooled free makes (with the pool off, the runtime does).
    if super::pool_on() {
        context_bound(rt);
    }
    let rc = answer_free("cudaFreeHost", ptr as usize, FreeOf::Pinned, DEVICE.host_free(ptr as usize), || (rt.free_host)(ptr));
    if rc == CUDA_ERROR_INVALID_VALUE {
        as_the_runtime(rt, rc)
    } else {
        rc
    }
}

/// Note [Context lifetime]: the reset frees every allocation of the current device's primary
/// context, our cached segments and the blocks still live among them; the pool forgets them all
/// (before, and again after, in case another thread mapped one meanwhile).
///
/// # Safety
/// As cudaDeviceReset.
pub unsafe fn device_reset() -> c_int {
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
        DEVICE.primary_reset_done(d, rc);
    }
    rc
}

/// A pooled pointer returns to our pool, reusable on `stream` at once and by others after a
/// synchronization (Note [Safe reuse]); anything else is the runtime's. `spelling` picks the
/// runtime's function the call stands for (cudaFreeAsync or its _ptsz form).
///
/// # Safety
/// As cudaFreeAsync.
pub unsafe fn free_async(ptr: *mut c_void, stream: *mut c_void, spelling: fn(&CudaFns) -> Option<FreeAsyncFn>, per_thread_default: bool) -> c_int {
    let Some(real_free) = real().and_then(spelling) else { return NO_RUNTIME };
    let Some(_entered) = reentry::enter() else { return real_free(ptr, stream) };
    if ptr.is_null() || !super::pool_answers() {
        return real_free(ptr, stream);
    }
    if let Some(rt) = real().filter(|_| super::pool_on()) {
        context_bound(rt);
    }
    let rc = answer_free("cudaFreeAsync", ptr as usize, FreeOf::Device, Ok(DEVICE.free_async(ptr as usize, super::stream_of(stream, per_thread_default))), || real_free(ptr, stream));
    match real() {
        Some(rt) if rc == CUDA_ERROR_INVALID_VALUE => as_the_runtime(rt, rc),
        _ => rc,
    }
}

/// PyTorch's CUDAPluggableAllocator `alloc`: reuse is stream-aware, a block freed on a stream is
/// reused on that stream with no synchronization. Null when the pool cannot serve it.
///
/// # Safety
/// Called by PyTorch with a valid device and stream.
pub unsafe extern "C" fn pluggable_alloc(size: isize, device: c_int, stream: *mut c_void, asker: Asker) -> *mut c_void {
    let size = usize::try_from(size).unwrap_or(0);
    if !super::pool_answers() || size == 0 {
        return core::ptr::null_mut();
    }
    if let Some(rt) = real() {
        context_bound(rt);
    }
    match DEVICE.malloc_on_stream(size, device, super::stream_of(stream, false), asker.holder()) {
        Ok(addr) => addr as *mut c_void,
        Err(e) => {
            if matches!(e, DeviceError::OutOfMemory | DeviceError::CapReached) {
                DEVICE.out_of_memory(size, e == DeviceError::CapReached, 0);
            }
            core::ptr::null_mut()
        }
    }
}

/// PyTorch's CUDAPluggableAllocator `free`: ours back to the pool, anything else to the runtime
/// (or, with none, the driver).
///
/// # Safety
/// `ptr` came from `pluggable_alloc`.
pub unsafe fn pluggable_free(ptr: *mut c_void, device: c_int, stream: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    match DEVICE.free_on_stream(ptr as usize, device, super::stream_of(stream, false)) {
        FreeAnswer::Pooled => return,
        FreeAnswer::Refused => return warn_refused("tm_cuda_free", ptr as usize, FreeOf::Device),
        FreeAnswer::NotOurs => {}
    }
    if let Some(rt) = real() {
        (rt.free)(ptr);
    } else if let Some(free) = crate::sys::cuda_driver::driver().and_then(|d| d.mem_free) {
        free(ptr as u64);
    }
}
