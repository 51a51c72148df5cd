//! Shareable handles of the driver's virtual memory API (Note [IPC of expandable segments] in
//! device/pool/exports.rs): chunks created exportable as POSIX file descriptors on devices that
//! say they can be (as PyTorch's own expandable segments create theirs), a chunk's memory
//! exported as a descriptor, and a peer's side: descriptors imported and mapped side by side in
//! address space of its own, made accessible to its current device, and given back at the close.

use super::cuda_driver::{check, device_memory_shareable, get, set_access, DeviceGetAttributeFn};
use crate::backing::{DeviceError, CUDA_ERROR_INVALID_VALUE};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;
const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;
const CUDA_ERROR_NOT_SUPPORTED: c_int = 801;

const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

/// Per device ordinal: whether its chunks are created exportable.
static EXPORTABLE: [AtomicU8; 64] = [const { AtomicU8::new(UNKNOWN) }; 64];

fn exportable(device: i32) -> Option<&'static AtomicU8> {
    usize::try_from(device).ok().and_then(|d| EXPORTABLE.get(d))
}

/// Asks whether `device` (the driver's device `handle`) can export memory as POSIX file
/// descriptors: its chunks are created so from now on.
pub(super) fn learn(device: i32, attribute: DeviceGetAttributeFn, handle: c_int) {
    let mut supported: c_int = 0;
    // SAFETY: writes one int.
    let yes = unsafe { attribute(&mut supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, handle) } == 0 && supported != 0;
    if let Some(slot) = exportable(device) {
        slot.store(if yes { YES } else { NO }, Relaxed);
    }
}

/// cuMemCreate of `len` bytes on `device`: exportable where the device said it can be; a device
/// whose driver refuses the handle type for its memory gets plain chunks from then on (their
/// blocks' exports are refused, and say so).
pub(super) fn create(device: i32, len: u64) -> Result<u64, DeviceError> {
    let create = get(|d| d.mem_create)?;
    let mut handle = 0u64;
    if let Some(slot) = exportable(device).filter(|s| s.load(Relaxed) == YES) {
        let prop = device_memory_shareable(device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        // SAFETY: writes one handle; prop lives across the call.
        let rc = unsafe { create(&mut handle, len as usize, &prop as *const _ as *const c_void, 0) };
        if rc == 0 {
            return Ok(handle);
        }
        if rc != CUDA_ERROR_NOT_SUPPORTED && rc != CUDA_ERROR_INVALID_VALUE {
            check(rc)?; // out of memory, a context gone: the caller's to answer
        }
        slot.store(NO, Relaxed);
    }
    let prop = device_memory_shareable(device, 0);
    // SAFETY: as above.
    check(unsafe { create(&mut handle, len as usize, &prop as *const _ as *const c_void, 0) })?;
    Ok(handle)
}

/// The memory of chunk `handle` as a POSIX file descriptor (close-on-exec, ours to close); the
/// driver's error when it cannot (not supported without the entry point).
pub(super) fn export(handle: u64) -> Result<i32, DeviceError> {
    let f = driver_fn(|d| d.mem_export)?;
    let mut fd: c_int = -1;
    // SAFETY: writes one int, the descriptor.
    check(unsafe { f((&mut fd as *mut c_int).cast(), handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) })?;
    if fd < 0 {
        return Err(DeviceError::Other(CUDA_ERROR_INVALID_VALUE));
    }
    Ok(fd)
}

/// An entry point of the virtual memory API's sharing; not supported where the driver has none.
fn driver_fn<T>(pick: impl FnOnce(&super::cuda_driver::DriverFns) -> Option<T>) -> Result<T, DeviceError> {
    super::cuda_driver::driver().ok_or(DeviceError::Other(crate::backing::CUDA_ERROR_INITIALIZATION))?;
    get(pick).map_err(|_| DeviceError::Other(CUDA_ERROR_NOT_SUPPORTED))
}

/// A peer's side: `len` bytes of address space aligned to `align` (cuMemAddressReserve), no
/// memory behind them yet.
pub fn reserve(len: u64, align: u64) -> Result<u64, DeviceError> {
    let f = driver_fn(|d| d.mem_address_reserve)?;
    let mut addr = 0u64;
    // SAFETY: writes one CUdeviceptr.
    check(unsafe { f(&mut addr, len as usize, align as usize, 0, 0) })?;
    Ok(addr)
}

/// Imports descriptor `fd` (the caller closes it) and maps its first `len` bytes at `va`
/// (reserved, unmapped); the imported handle is released at once: the mapping keeps the memory
/// until it goes.
pub fn map_imported(va: u64, len: u64, fd: i32) -> Result<(), DeviceError> {
    let (import, map, release) = (driver_fn(|d| d.mem_import)?, driver_fn(|d| d.mem_map)?, driver_fn(|d| d.mem_release)?);
    let mut handle = 0u64;
    // SAFETY: the documented calls: a descriptor passed by value as the driver wants it, a
    // handle it gave us, a range we reserved.
    unsafe {
        check(import(&mut handle, fd as isize as *mut c_void, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))?;
        let mapped = check(map(va, len as usize, 0, handle, 0));
        release(handle);
        mapped
    }
}

/// Makes [base, base + len) (whole mappings) readable and writable by the current device.
pub fn allow_current_device(base: u64, len: u64) -> Result<(), DeviceError> {
    let f = driver_fn(|d| d.ctx_get_device)?;
    let mut device: c_int = 0;
    // SAFETY: writes one int; fails when no context is current.
    check(unsafe { f(&mut device) })?;
    set_access(base, len, device, 0)
}

/// Unmaps the first `mapped` chunks of `chunk_bytes` at `base` (each an imported mapping), then
/// frees the `len` bytes of address space reserved there. The first error, after doing all.
pub fn unmap_imported(base: u64, chunk_bytes: u64, mapped: u64, len: u64) -> Result<(), DeviceError> {
    let (unmap, free) = (driver_fn(|d| d.mem_unmap)?, driver_fn(|d| d.mem_address_free)?);
    let mut result = Ok(());
    for k in 0..mapped {
        // SAFETY: a mapping we made at this address.
        let r = check(unsafe { unmap(base + k * chunk_bytes, chunk_bytes as usize) });
        result = result.and(r);
    }
    // SAFETY: a range we reserved, with nothing of ours mapped in it any more.
    result.and(check(unsafe { free(base, len as usize) }))
}
