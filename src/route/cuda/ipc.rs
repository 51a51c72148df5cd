//! IPC handles, routed (Note [IPC] in device/pool/pointers.rs), for the runtime's and the driver's
//! entry points alike. Exporting a pooled block: the driver's handle when the block is its whole
//! segment; one of ours (device/ipc) when it shares its segment, or lies in an expandable one
//! (`ipc_chunks`). Opening a handle of ours: its registry entry read, the segment opened with the
//! driver once per process (`OPENED`; a chunk run: `ipc_chunks`), the block's pointer handed out;
//! closing that pointer: counted off, the segment closed with its last. Every other handle and
//! pointer is the driver's (or the runtime's), unchanged.

use super::runtime::as_the_runtime;
use super::{context_bound, pool_answers};
use crate::backing::{CUDA_ERROR_INITIALIZATION, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::device::device_layer::{Export, SharedBlock};
use crate::device::ipc::handle::{ChunkRun, Handle};
use crate::device::ipc::opened::Close;
use crate::device::ipc::{self, Published, OPENED};
use crate::state::DEVICE;
use crate::sys::cuda_driver::{driver, IpcMemHandle, IpcOpenMemHandleFn};
use crate::sys::cuda_runtime::real;
use crate::sys::reentry;
use core::ffi::{c_int, c_uint, c_void};

const NO_DRIVER: c_int = CUDA_ERROR_INITIALIZATION;

/// What an export of `addr` answers: `Ok(Some(bytes))`, a handle of ours; `Ok(None)`, the
/// driver's (or runtime's) own handle is right; `Err(code)`, refused.
fn export(call: &str, addr: usize) -> Result<Option<[u8; 64]>, c_int> {
    if !pool_answers() {
        return Ok(None);
    }
    // Another thread may name the block between our look and our mark: look again, once.
    for _ in 0..2 {
        match DEVICE.export(addr) {
            Export::NotOurs | Export::Whole => return Ok(None),
            Export::NotLive => return Err(CUDA_ERROR_INVALID_VALUE),
            Export::Failed(e) => return Err(e.code()),
            Export::Expandable(b) => {
                if let Some(h) = super::ipc_chunks::export(call, &b)? {
                    return Ok(Some(h));
                }
            }
            Export::Shared(b) => {
                if let Some(h) = publish(&b) {
                    return Ok(Some(h.encode()));
                }
                if b.entry.is_none() && DEVICE.export(addr) == Export::NotLive {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
            }
        }
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// Names `b` in the registry (or finds the entry naming it already): our handle.
fn publish(b: &SharedBlock) -> Option<Handle> {
    let what = Published { real: b.real, offset: b.offset, size: b.size, segment_len: b.segment_len };
    if let Some(entry) = b.entry {
        return ipc::handle_of(entry, &what);
    }
    let (handle, entry) = ipc::publish(&what)?;
    if !DEVICE.mark_export(b.device, b.addr, b.buffer_id, entry) {
        ipc::withdraw(entry);
        return None;
    }
    ipc::say_ours();
    Some(handle)
}

/// # Safety
/// As cuIpcGetMemHandle: `handle` points to a CUipcMemHandle.
pub unsafe fn driver_get(handle: *mut c_void, ptr: u64) -> c_int {
    let Some(get) = driver().and_then(|d| d.ipc_get_mem_handle) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| !handle.is_null()) else { return get(handle, ptr) };
    match export("cuIpcGetMemHandle", ptr as usize) {
        Ok(None) => get(handle, ptr),
        Ok(Some(bytes)) => {
            handle.cast::<[u8; 64]>().write_unaligned(bytes);
            CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

/// # Safety
/// As cudaIpcGetMemHandle: `handle` points to a cudaIpcMemHandle_t.
pub unsafe fn runtime_get(handle: *mut c_void, ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_DRIVER };
    let Some(get) = rt.ipc_get_mem_handle else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| !handle.is_null()) else { return get(handle, ptr) };
    // The runtime binds a context first (as in runtime.rs's frees).
    if super::pool_on() {
        super::context_bound(rt);
    }
    match export("cudaIpcGetMemHandle", ptr as usize) {
        Ok(None) => get(handle, ptr),
        Ok(Some(bytes)) => {
            handle.cast::<[u8; 64]>().write_unaligned(bytes);
            CUDA_SUCCESS
        }
        Err(code) => as_the_runtime(rt, code),
    }
}

/// Opens handle of ours `h` with the driver's `open` (`flags` as given): the block's pointer.
///
/// # Safety
/// `open` is the driver's cuIpcOpenMemHandle.
unsafe fn open_ours(h: &Handle, flags: c_uint, open: IpcOpenMemHandleFn) -> Result<u64, c_int> {
    // A process opens no handle of its own (as the driver refuses its own).
    if h.pid == crate::sys::process::id() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let what = ipc::lookup(h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let Some(run) = ChunkRun::decode(&what.real) {
        return super::ipc_chunks::open(h, &what, &run);
    }
    // The driver's handle names one segment of one process; the pid keeps two processes'
    // handles apart should the driver's bytes ever be the same.
    OPENED.open_once(&what.real, [u64::from(h.pid), 0], (what.offset, what.size), || {
        let mut base = 0u64;
        // SAFETY: the caller's contract: `open` is the driver's cuIpcOpenMemHandle.
        let rc = unsafe { open(&mut base, IpcMemHandle { reserved: what.real }, flags) };
        if rc != CUDA_SUCCESS {
            return Err(rc);
        }
        // The segment must hold the block the entry names (the registry is not trusted).
        let holds = crate::sys::cuda_driver::allocation_range(base as usize).is_some_and(|(b, len)| b as u64 == base && what.offset + what.size <= len as u64);
        if !holds {
            close_driver_mapping(base);
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(base)
    }, close_driver_mapping, crate::sys::clock::pause)
}

/// Gives back what the driver's cuIpcOpenMemHandle mapped at `base`.
fn close_driver_mapping(base: u64) {
    if let Some(close) = driver().and_then(|d| d.ipc_close_mem_handle) {
        // SAFETY: the driver's cuIpcMemCloseHandle, on a base its open returned.
        unsafe { close(base) };
    }
}

/// The driver's open for the spelling a call stands for, else the other.
fn driver_open_fn(v1: bool) -> Option<IpcOpenMemHandleFn> {
    let d = driver()?;
    if v1 { d.ipc_open_mem_handle_v1.or(d.ipc_open_mem_handle) } else { d.ipc_open_mem_handle.or(d.ipc_open_mem_handle_v1) }
}

/// # Safety
/// As cuIpcOpenMemHandle(_v2).
pub unsafe fn driver_open(dptr: *mut u64, handle: IpcMemHandle, flags: c_uint, v1: bool) -> c_int {
    let Some(open) = driver_open_fn(v1) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| crate::state::globals().is_some() && Handle::looks_ours(&handle.reserved)) else { return open(dptr, handle, flags) };
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(h) = Handle::decode(&handle.reserved) else { return CUDA_ERROR_INVALID_VALUE };
    match open_ours(&h, flags, open) {
        Ok(ptr) => {
            *dptr = ptr;
            CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

/// # Safety
/// As cudaIpcOpenMemHandle.
pub unsafe fn runtime_open(ptr: *mut *mut c_void, handle: IpcMemHandle, flags: c_uint) -> c_int {
    let Some(rt) = real() else { return NO_DRIVER };
    let Some(real_open) = rt.ipc_open_mem_handle else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| crate::state::globals().is_some() && Handle::looks_ours(&handle.reserved)) else { return real_open(ptr, handle, flags) };
    let (Some(h), Some(open)) = (Handle::decode(&handle.reserved), driver_open_fn(false)) else { return as_the_runtime(rt, CUDA_ERROR_INVALID_VALUE) };
    if ptr.is_null() {
        return as_the_runtime(rt, CUDA_ERROR_INVALID_VALUE);
    }
    // The runtime binds a context first, on a thread that made no CUDA call too; so do we.
    context_bound(rt);
    match open_ours(&h, flags, open) {
        Ok(p) => {
            *ptr = p as *mut c_void;
            CUDA_SUCCESS
        }
        Err(code) => as_the_runtime(rt, code),
    }
}

/// Closes `ptr` when it is a pointer an open of ours handed out: `Some(code)`; None: not ours.
unsafe fn close_ours(ptr: u64) -> Option<c_int> {
    match OPENED.close(ptr) {
        Close::NotOurs => None,
        Close::Kept => Some(CUDA_SUCCESS),
        Close::Last { slot, base, real } => {
            let rc = match ChunkRun::decode(&real) {
                Some(run) => super::ipc_chunks::close(base, &run),
                None => driver().and_then(|d| d.ipc_close_mem_handle).map_or(NO_DRIVER, |close| close(base)),
            };
            OPENED.end_close(slot);
            Some(rc)
        }
    }
}

/// # Safety
/// As cuIpcCloseMemHandle.
pub unsafe fn driver_close(ptr: u64) -> c_int {
    let Some(close) = driver().and_then(|d| d.ipc_close_mem_handle) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter() else { return close(ptr) };
    close_ours(ptr).unwrap_or_else(|| close(ptr))
}

/// # Safety
/// As cudaIpcCloseMemHandle.
pub unsafe fn runtime_close(ptr: *mut c_void) -> c_int {
    let Some(rt) = real() else { return NO_DRIVER };
    let Some(real_close) = rt.ipc_close_mem_handle else { return NO_DRIVER };
    let Some(_entered) = reentry::enter() else { return real_close(ptr) };
    match close_ours(ptr as u64) {
        None => real_close(ptr),
        Some(CUDA_SUCCESS) => CUDA_SUCCESS,
        Some(code) => as_the_runtime(rt, code),
    }
}
