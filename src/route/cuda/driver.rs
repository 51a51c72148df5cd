//! The driver's calls (`shim::cuda_driver`'s entry points, one call each), routed: allocations
//! from the pool; context resets, releases and destroys empty it; IPC handles and pointer-range
//! queries answer for our blocks; an allocation the pool does not serve gets the pool's cache back
//! when it runs out of memory. Anything not ours goes to the real driver unchanged, and so does a
//! call re-entered from inside a runtime call of ours (a runtime-level miss is never pooled a
//! second time). With no driver to reach, the answer is "not initialized".

use crate::record::holders::Asker;
use super::{answer_free, pool_on, pool_ready, pool_answers, without_context, FreeOf};
use crate::backing::{DeviceError, CUDA_ERROR_INITIALIZATION, CUDA_ERROR_MEMORY_ALLOCATION, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS};
use crate::device::device_layer::RangeAnswer;
use crate::device::ipc::OPENED;
use crate::sys::cuda_driver::{driver, DriverFns};
use crate::sys::reentry;
use crate::state::DEVICE;
use core::ffi::{c_int, c_uint, c_void};

const NO_DRIVER: c_int = CUDA_ERROR_INITIALIZATION;
/// The driver's out-of-memory code (the runtime's cudaErrorMemoryAllocation has the same value).
const CUDA_ERROR_OUT_OF_MEMORY: c_int = CUDA_ERROR_MEMORY_ALLOCATION;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;
const BUFFER_ID: c_int = 7;
const CONTEXT: c_int = 1;

/// Which of the driver's real functions a call stands for, where one entry point of ours serves
/// several spellings (cuCtxDestroy and cuCtxDestroy_v2, cuMemFreeAsync and its _ptsz form).
pub type Spelling<T> = fn(&DriverFns) -> Option<T>;

fn real<T>(pick: impl FnOnce(&DriverFns) -> Option<T>) -> Option<T> {
    driver().and_then(pick)
}

/// The pointer attributes a pooled block answers for itself: its range, and its buffer id; and,
/// in an expandable segment, its context (the driver names none for its virtual memory API's
/// memory, where a cudaMalloc'd block names the context it was allocated in).
fn blockwise(attribute: c_int) -> bool {
    matches!(attribute, RANGE_START_ADDR | RANGE_SIZE | BUFFER_ID | CONTEXT)
}

/// # Safety
/// As cuMemAlloc_v2.
pub unsafe extern "C" fn mem_alloc(dptr: *mut u64, size: usize, asker: Asker) -> c_int {
    let Some(alloc) = real(|d| d.mem_alloc) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| size != 0 && !dptr.is_null() && pool_ready()) else { return alloc(dptr, size) };
    pooled_alloc(size, dptr, asker, || alloc(dptr, size))
}

/// Serves `size` bytes from the pool into `*dptr`; when the pool cannot (out of memory after
/// giving its cache back, or a context it cannot use), the driver answers instead.
unsafe fn pooled_alloc(size: usize, dptr: *mut u64, asker: Asker, driver_answer: impl FnOnce() -> c_int) -> c_int {
    match DEVICE.malloc(size, asker.holder()) {
        Ok(addr) => {
            *dptr = addr as u64;
            CUDA_SUCCESS
        }
        Err(DeviceError::CapReached) => {
            DEVICE.out_of_memory(size, true, asker.holder());
            CUDA_ERROR_MEMORY_ALLOCATION
        }
        // The device refused even after our cache was given back, or the context cannot serve
        // the pool: the driver answers.
        Err(_) => {
            let rc = driver_answer();
            if rc == CUDA_ERROR_MEMORY_ALLOCATION {
                DEVICE.out_of_memory(size, false, asker.holder());
            }
            rc
        }
    }
}

/// A pitched block from the pool: rows padded to 512 bytes, the texture pitch alignment of
/// every CUDA device (the driver's own pitch may differ; any pitch at least the width is valid).
///
/// # Safety
/// As cuMemAllocPitch_v2.
pub unsafe extern "C" fn mem_alloc_pitch(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element_bytes: c_uint, asker: Asker) -> c_int {
    let Some(alloc) = real(|d| d.mem_alloc_pitch) else { return NO_DRIVER };
    let row = width.checked_next_multiple_of(512).filter(|_| width > 0 && height > 0 && matches!(element_bytes, 4 | 8 | 16));
    let bytes = row.and_then(|r| r.checked_mul(height));
    let Some(_entered) = reentry::enter().filter(|_| bytes.is_some() && !dptr.is_null() && !pitch.is_null() && pool_ready()) else {
        return alloc(dptr, pitch, width, height, element_bytes);
    };
    let (Some(row), Some(bytes)) = (row, bytes) else { return alloc(dptr, pitch, width, height, element_bytes) };
    let rc = pooled_alloc(bytes, dptr, asker, || alloc(dptr, pitch, width, height, element_bytes));
    if rc == CUDA_SUCCESS && DEVICE.range(*dptr as usize) != RangeAnswer::NotOurs {
        *pitch = row;
    }
    rc
}

/// Our cached bytes count as free.
///
/// # Safety
/// As cuMemGetInfo_v2.
pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> c_int {
    let Some(get) = real(|d| d.mem_get_info) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| !free.is_null() && !total.is_null() && pool_ready()) else { return get(free, total) };
    match DEVICE.mem_info() {
        Ok((f, t)) => {
            *free = f;
            *total = t;
            CUDA_SUCCESS
        }
        Err(_) => get(free, total),
    }
}

/// # Safety
/// As cuMemHostAlloc.
pub unsafe extern "C" fn mem_host_alloc(pp: *mut *mut c_void, size: usize, flags: c_uint, asker: Asker) -> c_int {
    let Some(alloc) = real(|d| d.mem_host_alloc) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| size != 0 && !pp.is_null() && pool_ready()) else { return alloc(pp, size, flags) };
    match DEVICE.host_alloc(size, flags, asker.holder()) {
        Ok(addr) => {
            *pp = addr as *mut c_void;
            CUDA_SUCCESS
        }
        Err(_) => alloc(pp, size, flags),
    }
}

/// cuMemHostAlloc with no flags; re-entered, the driver's own.
///
/// # Safety
/// As cuMemAllocHost_v2.
pub unsafe extern "C" fn mem_alloc_host(pp: *mut *mut c_void, size: usize, asker: Asker) -> c_int {
    match real(|d| d.mem_alloc_host) {
        Some(alloc) if reentry::enter().is_none() => alloc(pp, size),
        Some(_) => mem_host_alloc(pp, size, 0, asker),
        None => NO_DRIVER,
    }
}

/// # Safety
/// As cuMemFreeHost.
pub unsafe fn mem_free_host(p: *mut c_void) -> c_int {
    let Some(free) = real(|d| d.mem_free_host) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers() && !p.is_null()) else { return free(p) };
    // Any context or none: host memory is no context's, and the driver frees it so.
    answer_free("cuMemFreeHost", p as usize, FreeOf::Pinned, DEVICE.host_free(p as usize), || free(p))
}

/// A pinned block we cached after its free, or a pointer past what was asked of a live one, is
/// unknown host memory to the driver's pinned queries, as after the runtime's own free: asked for
/// the null pointer (Note [Freed memory answers as freed]).
fn host_query_target(p: *mut c_void) -> *mut c_void {
    if DEVICE.range(p as usize) == RangeAnswer::Free {
        core::ptr::null_mut()
    } else {
        p
    }
}

/// # Safety
/// As cuMemHostGetDevicePointer_v2.
pub unsafe fn mem_host_get_device_pointer(dptr: *mut u64, p: *mut c_void, flags: c_uint) -> c_int {
    let Some(get) = real(|d| d.mem_host_get_device_pointer) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return get(dptr, p, flags) };
    get(dptr, host_query_target(p), flags)
}

/// # Safety
/// As cuMemHostGetFlags.
pub unsafe fn mem_host_get_flags(flags: *mut c_uint, p: *mut c_void) -> c_int {
    let Some(get) = real(|d| d.mem_host_get_flags) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return get(flags, p) };
    get(flags, host_query_target(p))
}

/// Note [Context lifetime] (device/pool/mod.rs): the reset frees every allocation of the primary
/// context; the pool forgets them (before, and again after).
///
/// # Safety
/// As cuDevicePrimaryCtxReset(_v2).
pub unsafe fn primary_reset(device: c_int, spelling: Spelling<unsafe extern "C" fn(c_int) -> c_int>) -> c_int {
    let Some(reset) = real(spelling) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return reset(device) };
    DEVICE.forget_primary(device);
    let rc = reset(device);
    DEVICE.primary_reset_done(device, rc);
    rc
}

/// Note [Context lifetime] (device/pool/mod.rs): the last release destroys the primary context and
/// every allocation in it, though its handle stays the same.
///
/// # Safety
/// As cuDevicePrimaryCtxRelease(_v2).
pub unsafe fn primary_release(device: c_int, spelling: Spelling<unsafe extern "C" fn(c_int) -> c_int>) -> c_int {
    let Some(release) = real(spelling) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return release(device) };
    let before = DEVICE.primary_context(device);
    // The release may end the context: no idle release of its pool may be half done then.
    DEVICE.wait_for_releases(device);
    let rc = release(device);
    if rc == 0 {
        DEVICE.primary_released(device, before);
    }
    rc
}

/// CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: enabled before, still enabled.
const PEER_ACCESS_ALREADY_ENABLED: c_int = 704;

/// Peer access enabled from the current context's device to `peer`'s memory: expandable pools
/// grant their chunks to it as well (DeviceLayer::peer_access_enabled).
///
/// # Safety
/// As cuCtxEnablePeerAccess.
pub unsafe fn ctx_enable_peer_access(peer: *mut c_void, flags: c_uint) -> c_int {
    let Some(enable) = real(|d| d.ctx_enable_peer_access) else { return NO_DRIVER };
    let rc = enable(peer, flags);
    if (rc == CUDA_SUCCESS || rc == PEER_ACCESS_ALREADY_ENABLED) && !peer.is_null() {
        if let Some(_entered) = reentry::enter().filter(|_| pool_answers()) {
            DEVICE.peer_access_enabled(peer as u64);
        }
    }
    rc
}

/// # Safety
/// As cuCtxDestroy(_v2).
pub unsafe fn ctx_destroy(ctx: *mut c_void, spelling: Spelling<unsafe extern "C" fn(*mut c_void) -> c_int>) -> c_int {
    let Some(destroy) = real(spelling) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return destroy(ctx) };
    DEVICE.forget_context(ctx as u64);
    let rc = destroy(ctx);
    DEVICE.forget_context(ctx as u64);
    rc
}

/// Note [Streams that end] (device/pool/blocks.rs): the blocks freed on `stream` wait for a
/// synchronization before the driver may give its handle to a new stream.
///
/// # Safety
/// As cuStreamDestroy(_v2).
pub unsafe fn stream_destroy(stream: *mut c_void, spelling: Spelling<unsafe extern "C" fn(*mut c_void) -> c_int>) -> c_int {
    let Some(destroy) = real(spelling) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return destroy(stream) };
    DEVICE.stream_ended(super::stream_of(stream, false));
    destroy(stream)
}

/// Our block's start and size for a pooled pointer, not the segment the driver sees.
///
/// # Safety
/// As cuMemGetAddressRange_v2: each output may be null.
pub unsafe fn address_range(base: *mut u64, size: *mut usize, ptr: u64) -> c_int {
    let Some(get) = real(|d| d.address_range) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return get(base, size, ptr) };
    let (mut b, mut s) = (0u64, 0usize);
    let rc = get(&mut b, &mut s, ptr);
    if rc == CUDA_SUCCESS {
        match DEVICE.range(ptr as usize) {
            RangeAnswer::NotOurs => {
                if let Some((start, len)) = OPENED.block_of(ptr) {
                    (b, s) = (start, len as usize);
                }
            }
            RangeAnswer::Live(start, len, _) | RangeAnswer::Pinned(start, len) => (b, s) = (start, len as usize),
            // Memory we cached after its free: as the driver answers after a free.
            RangeAnswer::Free => return CUDA_ERROR_NOT_FOUND,
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

// Note [Freed memory answers as freed]
// Memory we cached after the program freed it is still a live allocation to the driver, which
// would go on calling it device memory of its context. Code that sorts pointers by what the driver
// says (UCX, MPI, DLPack importers) would then take a freed pointer for a live one. So every
// attribute of such memory is asked of the driver for the null pointer instead, which no
// allocation contains: the error or the defaults the driver gives for memory it does not know,
// written at each attribute's own size.

/// The range and buffer-id attributes answer for our block (Note [Buffer ids] in
/// device/pool/pointers.rs); every other attribute is the driver's, and every attribute of memory
/// we cached after its free is the driver's for unknown memory (Note [Freed memory answers as
/// freed]).
///
/// # Safety
/// As cuPointerGetAttribute.
pub unsafe fn pointer_get_attribute(data: *mut c_void, attribute: c_int, ptr: u64) -> c_int {
    let Some(get) = real(|d| d.pointer_get_attribute) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return get(data, attribute, ptr) };
    // Note [Freed memory answers as freed]: asked first, so the driver, which knows our segment
    // as live, never writes into the caller's answer for a block the program freed.
    let answer = DEVICE.range(ptr as usize);
    if answer == RangeAnswer::Free {
        return get(data, attribute, 0);
    }
    let rc = get(data, attribute, ptr);
    if rc != CUDA_SUCCESS || data.is_null() {
        return rc;
    }
    match answer {
        RangeAnswer::NotOurs => {
            if let Some((start, len)) = OPENED.block_of(ptr).filter(|_| range_attribute(attribute)) {
                write_blockwise(data, attribute, (start, len, 0), ptr);
            }
            rc
        }
        RangeAnswer::Live(start, len, id) => {
            if blockwise(attribute) {
                write_blockwise(data, attribute, (start, len, id), ptr);
            }
            rc
        }
        RangeAnswer::Pinned(start, len) => {
            if range_attribute(attribute) {
                write_blockwise(data, attribute, (start, len, 0), ptr);
            }
            rc
        }
        RangeAnswer::Free => rc,
    }
}

/// # Safety
/// As cuPointerGetAttributes: `attributes` and `data` hold `count` entries.
pub unsafe fn pointer_get_attributes(count: c_uint, attributes: *mut c_int, data: *mut *mut c_void, ptr: u64) -> c_int {
    let Some(get) = real(|d| d.pointer_get_attributes) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers()) else { return get(count, attributes, data, ptr) };
    // Note [Freed memory answers as freed]: asked first, as in pointer_get_attribute.
    let answer = DEVICE.range(ptr as usize);
    if answer == RangeAnswer::Free {
        return get(count, attributes, data, 0);
    }
    let rc = get(count, attributes, data, ptr);
    if rc != CUDA_SUCCESS || attributes.is_null() || data.is_null() {
        return rc;
    }
    let (block, answered): (_, fn(c_int) -> bool) = match answer {
        RangeAnswer::NotOurs => match OPENED.block_of(ptr) {
            Some((start, len)) => ((start, len, 0), range_attribute),
            None => return rc,
        },
        RangeAnswer::Live(start, len, id) => ((start, len, id), blockwise),
        RangeAnswer::Pinned(start, len) => ((start, len, 0), range_attribute),
        RangeAnswer::Free => return rc,
    };
    for i in 0..count as usize {
        let (attribute, out) = (*attributes.add(i), *data.add(i));
        if !out.is_null() && answered(attribute) {
            write_blockwise(out, attribute, block, ptr);
        }
    }
    rc
}

/// The attributes answered for a block opened from a handle of ours: its range (its buffer id
/// and context stay the driver's). The driver maps the exporter's whole segment, and answered
/// with it where the driver alone answers with the block's own allocation.
fn range_attribute(attribute: c_int) -> bool {
    attribute == RANGE_START_ADDR || attribute == RANGE_SIZE
}

/// RANGE_START_ADDR is a CUdeviceptr, RANGE_SIZE a size_t, BUFFER_ID an unsigned long long,
/// CONTEXT a CUcontext: all 8 bytes here. `block` is (start, size, buffer id); the driver's
/// answer for CONTEXT stands unless `ptr` lies in an expandable segment.
unsafe fn write_blockwise(out: *mut c_void, attribute: c_int, block: (u64, u64, u64), ptr: u64) {
    *(out as *mut u64) = match attribute {
        RANGE_START_ADDR => block.0,
        RANGE_SIZE => block.1,
        CONTEXT => match DEVICE.expandable_context(ptr as usize) {
            Some(ctx) if block.0 != 0 => ctx,
            _ => return,
        },
        _ => block.2,
    };
}

/// A pooled block freed through the driver (the same allocation as cudaMalloc's): back to the
/// pool, with cudaFree's synchronization.
///
/// # Safety
/// As cuMemFree_v2.
pub unsafe fn mem_free(ptr: u64) -> c_int {
    let Some(free) = real(|d| d.mem_free) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers() && ptr != 0) else { return free(ptr) };
    // Any context or none: the driver finds a pointer's allocation by unified addressing and
    // frees it in its owning context; so does the pool (in the block's pool's context).
    answer_free("cuMemFree_v2", ptr as usize, FreeOf::Device, DEVICE.free(ptr as usize), || free(ptr))
}

/// # Safety
/// As cuMemFreeAsync(_ptsz).
pub unsafe fn mem_free_async(ptr: u64, stream: *mut c_void, spelling: Spelling<unsafe extern "C" fn(u64, *mut c_void) -> c_int>, per_thread_default: bool) -> c_int {
    let Some(free) = real(spelling) else { return NO_DRIVER };
    let Some(_entered) = reentry::enter().filter(|_| pool_answers() && ptr != 0) else { return free(ptr, stream) };
    if let Some(rc) = without_context(ptr as usize) {
        return rc;
    }
    answer_free("cuMemFreeAsync", ptr as usize, FreeOf::Device, Ok(DEVICE.free_async(ptr as usize, super::stream_of(stream, per_thread_default))), || free(ptr, stream))
}

/// An allocation the pool does not serve (the runtime's stream-ordered pool, managed memory,
/// VMM) cannot have the memory our pool caches. Out of memory, the cache of `device` (the
/// current one when `None`) is given back and the call made once more; the driver's answer
/// stands otherwise.
unsafe fn with_cache_given_back(device: Option<i32>, alloc: impl Fn() -> c_int) -> c_int {
    let rc = alloc();
    if rc != CUDA_ERROR_OUT_OF_MEMORY || !pool_on() {
        return rc;
    }
    let Some(_entered) = reentry::enter() else { return rc };
    if device.map_or_else(|| DEVICE.give_back_current(), |d| DEVICE.give_back(d)) == 0 {
        return rc;
    }
    alloc()
}

/// # Safety
/// As cuMemAllocAsync(_ptsz).
pub unsafe fn mem_alloc_async(dptr: *mut u64, size: usize, stream: *mut c_void, spelling: Spelling<crate::sys::cuda_driver::MemAllocAsyncFn>) -> c_int {
    real(spelling).map_or(NO_DRIVER, |f| with_cache_given_back(None, || f(dptr, size, stream)))
}

/// # Safety
/// As cuMemAllocManaged.
pub unsafe fn mem_alloc_managed(dptr: *mut u64, size: usize, flags: c_uint) -> c_int {
    real(|d| d.mem_alloc_managed).map_or(NO_DRIVER, |f| with_cache_given_back(None, || f(dptr, size, flags)))
}

/// The head of CUmemAllocationProp: its type, the handle types, and where the memory lives.
#[repr(C)]
struct AllocationPropHead {
    kind: c_int,
    handle_types: c_int,
    location_kind: c_int,
    location_id: c_int,
}

const LOCATION_DEVICE: c_int = 1;

/// # Safety
/// As cuMemCreate: `prop` is null or points to a CUmemAllocationProp.
pub unsafe fn mem_create(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) -> c_int {
    let Some(create) = real(|d| d.mem_create) else { return NO_DRIVER };
    let head = prop.cast::<AllocationPropHead>();
    // SAFETY: a non-null prop is a CUmemAllocationProp, which starts with these four ints.
    let device = (!head.is_null()).then(|| unsafe { ((*head).location_kind, (*head).location_id) });
    let device = device.filter(|&(kind, _)| kind == LOCATION_DEVICE).map(|(_, id)| id);
    with_cache_given_back(device, || create(handle, size, prop, flags))
}
