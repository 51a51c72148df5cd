//! The CUDA driver entry points that must know our pool, for programs that call the driver
//! (linked with -lcuda, or found by name): context resets and destroys empty the pool, IPC
//! handles and pointer-range queries answer for our blocks, and a pooled pointer freed through
//! the driver returns to the pool. Anything not ours goes to the real driver unchanged.

use crate::backing::{CUDA_ERROR_INITIALIZATION, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS};
use crate::device::layer::{Freed, Range};
use crate::sys::cuda_driver::{driver, DriverFns};
use crate::sys::reentry;
use crate::DEVICE;
use core::ffi::{c_int, c_uint, c_void};

const NO_DRIVER: c_int = CUDA_ERROR_INITIALIZATION;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;

fn real<T>(pick: impl FnOnce(&DriverFns) -> Option<T>) -> Option<T> {
    driver().and_then(pick)
}

fn pooling() -> bool {
    crate::globals().is_some()
}

/// Note [Context lifetime] (device/pool.rs).
unsafe fn primary_reset(device: c_int, reset: unsafe extern "C" fn(c_int) -> c_int) -> c_int {
    let Some(_entered) = reentry::enter().filter(|_| pooling()) else { return reset(device) };
    DEVICE.forget_primary(device);
    let rc = reset(device);
    DEVICE.forget_primary(device);
    rc
}

/// # Safety
/// As cuDevicePrimaryCtxReset_v2.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> c_int {
    real(|d| d.primary_reset).map_or(NO_DRIVER, |f| primary_reset(device, f))
}

/// # Safety
/// As cuDevicePrimaryCtxReset.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(device: c_int) -> c_int {
    real(|d| d.primary_reset_v1).map_or(NO_DRIVER, |f| primary_reset(device, f))
}

unsafe fn ctx_destroy(ctx: *mut c_void, destroy: unsafe extern "C" fn(*mut c_void) -> c_int) -> c_int {
    let Some(_entered) = reentry::enter().filter(|_| pooling()) else { return destroy(ctx) };
    DEVICE.forget_context(ctx as u64);
    let rc = destroy(ctx);
    DEVICE.forget_context(ctx as u64);
    rc
}

/// # Safety
/// As cuCtxDestroy_v2.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> c_int {
    real(|d| d.ctx_destroy).map_or(NO_DRIVER, |f| ctx_destroy(ctx, f))
}

/// # Safety
/// As cuCtxDestroy.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy(ctx: *mut c_void) -> c_int {
    real(|d| d.ctx_destroy_v1).map_or(NO_DRIVER, |f| ctx_destroy(ctx, f))
}

/// Note [IPC] (device/pool.rs).
///
/// # Safety
/// As cuIpcGetMemHandle: `handle` points to a CUipcMemHandle.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut c_void, ptr: u64) -> c_int {
    let Some(get) = real(|d| d.ipc_get_mem_handle) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pooling()) else { return get(handle, ptr) };
    match super::cuda::export_checked("cuIpcGetMemHandle", ptr as usize) {
        Ok(()) => get(handle, ptr),
        Err(()) => CUDA_ERROR_INVALID_VALUE,
    }
}

/// Our block's start and size for a pooled pointer, not the segment the driver sees.
///
/// # Safety
/// As cuMemGetAddressRange_v2: each output may be null.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, ptr: u64) -> c_int {
    let Some(get) = real(|d| d.address_range) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pooling()) else { return get(base, size, ptr) };
    let (mut b, mut s) = (0u64, 0usize);
    let rc = get(&mut b, &mut s, ptr);
    if rc == CUDA_SUCCESS {
        match DEVICE.range(ptr as usize) {
            Range::NotOurs => {}
            Range::Live(start, len) => (b, s) = (start, len as usize),
            // Memory we cached after its free: as the driver answers after a free.
            Range::Freed => return CUDA_ERROR_NOT_FOUND,
        }
    }
    if rc == CUDA_SUCCESS {
        if !base.is_null() {
            *base = b;
        }
        if !size.is_null() {
            *size = s;
        }
    }
    rc
}

/// The range attributes answer for our block; every other attribute is the driver's.
///
/// # Safety
/// As cuPointerGetAttribute.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: u64) -> c_int {
    let Some(get) = real(|d| d.pointer_get_attribute) else { return NO_DRIVER };
    let ranged = attribute == RANGE_START_ADDR || attribute == RANGE_SIZE;
    let Some(_entered) = reentry::enter().filter(|_| pooling() && ranged) else { return get(data, attribute, ptr) };
    let rc = get(data, attribute, ptr);
    if rc != CUDA_SUCCESS || data.is_null() {
        return rc;
    }
    match DEVICE.range(ptr as usize) {
        Range::NotOurs => rc,
        Range::Live(start, len) => {
            write_range(data, attribute, start, len);
            rc
        }
        Range::Freed => CUDA_ERROR_INVALID_VALUE,
    }
}

/// # Safety
/// As cuPointerGetAttributes: `attributes` and `data` hold `count` entries.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(count: c_uint, attributes: *mut c_int, data: *mut *mut c_void, ptr: u64) -> c_int {
    let Some(get) = real(|d| d.pointer_get_attributes) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pooling()) else { return get(count, attributes, data, ptr) };
    let rc = get(count, attributes, data, ptr);
    if rc != CUDA_SUCCESS || attributes.is_null() || data.is_null() {
        return rc;
    }
    let range = DEVICE.range(ptr as usize);
    let (start, len) = match range {
        Range::NotOurs => return rc,
        Range::Live(start, len) => (start, len),
        // No allocation there any more: zeros, as the driver writes for unknown memory.
        Range::Freed => (0, 0),
    };
    for i in 0..count as usize {
        let (attribute, out) = (*attributes.add(i), *data.add(i));
        if !out.is_null() && (attribute == RANGE_START_ADDR || attribute == RANGE_SIZE) {
            write_range(out, attribute, start, len);
        }
    }
    rc
}

/// RANGE_START_ADDR is a CUdeviceptr, RANGE_SIZE a size_t: both 8 bytes here.
unsafe fn write_range(out: *mut c_void, attribute: c_int, start: u64, len: u64) {
    *(out as *mut u64) = if attribute == RANGE_START_ADDR { start } else { len };
}

/// A pooled block freed through the driver (the same allocation as cudaMalloc's): back to the
/// pool, with cudaFree's synchronization.
///
/// # Safety
/// As cuMemFree_v2.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: u64) -> c_int {
    let Some(free) = real(|d| d.mem_free) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pooling() && ptr != 0) else { return free(ptr) };
    match DEVICE.free(ptr as usize) {
        Ok(Freed::Pooled) => CUDA_SUCCESS,
        Ok(Freed::NotOurs) => free(ptr),
        Err(e) => e.code(),
    }
}

unsafe fn mem_free_async(ptr: u64, stream: *mut c_void, free: unsafe extern "C" fn(u64, *mut c_void) -> c_int) -> c_int {
    let Some(_entered) = reentry::enter().filter(|_| pooling() && ptr != 0) else { return free(ptr, stream) };
    match DEVICE.free_async(ptr as usize, stream as usize) {
        Freed::Pooled => CUDA_SUCCESS,
        Freed::NotOurs => free(ptr, stream),
    }
}

/// # Safety
/// As cuMemFreeAsync.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: u64, stream: *mut c_void) -> c_int {
    real(|d| d.mem_free_async).map_or(NO_DRIVER, |f| mem_free_async(ptr, stream, f))
}

/// # Safety
/// As cuMemFreeAsync_ptsz.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: *mut c_void) -> c_int {
    real(|d| d.mem_free_async_ptsz).map_or(NO_DRIVER, |f| mem_free_async(ptr, stream, f))
}
