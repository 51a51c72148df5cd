//! The program's CUDA driver (libcuda.so.1): its real entry points, which the device pool's
//! backing calls (sys/cuda_backing.rs) and the driver entry points we interpose pass on to. Found
//! with dlsym(RTLD_NEXT), else in the copy a runtime dlopened privately (dlopen RTLD_NOLOAD),
//! when first needed and again after any later load until found (`sys::bind`): no number of
//! look-ups before the driver is loaded stops it being bound. We never load the driver; every
//! entry is optional, and an answer we cannot get is "unknown" to the policy.

use crate::backing::{DeviceError, CUDA_ERROR_INITIALIZATION};
use core::ffi::{c_int, c_uint, c_void, CStr};
use super::bind::Binding;

pub type CtxFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type DeviceFn = unsafe extern "C" fn(c_int) -> c_int;
pub type CtxGetCurrentFn = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
pub type PrimaryGetStateFn = unsafe extern "C" fn(c_int, *mut c_uint, *mut c_int) -> c_int;
pub type PrimaryRetainFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
pub type DeviceGetFn = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
pub type DeviceGetUuidFn = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
pub type AddressRangeFn = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> c_int;
pub type PointerGetAttributeFn = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;
pub type PointerGetAttributesFn = unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, u64) -> c_int;
pub type IpcGetMemHandleFn = unsafe extern "C" fn(*mut c_void, u64) -> c_int;
pub type IpcOpenMemHandleFn = unsafe extern "C" fn(*mut u64, IpcMemHandle, c_uint) -> c_int;
pub type IpcCloseMemHandleFn = unsafe extern "C" fn(u64) -> c_int;

/// CUipcMemHandle (and the runtime's cudaIpcMemHandle_t): 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}
pub type MemFreeFn = unsafe extern "C" fn(u64) -> c_int;
pub type MemFreeAsyncFn = unsafe extern "C" fn(u64, *mut c_void) -> c_int;
pub type MemAllocFn = unsafe extern "C" fn(*mut u64, usize) -> c_int;
pub type MemAllocAsyncFn = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> c_int;
pub type MemAllocManagedFn = unsafe extern "C" fn(*mut u64, usize, c_uint) -> c_int;
pub type MemCreateFn = unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> c_int;
pub type MemAllocPitchFn = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> c_int;
pub type MemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
pub type MemHostAllocFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int;
pub type MemAllocHostFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
pub type MemFreeHostFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type MemHostGetDevicePointerFn = unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> c_int;
pub type MemHostGetFlagsFn = unsafe extern "C" fn(*mut c_uint, *mut c_void) -> c_int;
pub type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> c_int;
pub type CtxSynchronizeFn = unsafe extern "C" fn() -> c_int;
/// cuThreadExchangeStreamCaptureMode: the calling thread's mode in, its old mode out.
pub type ExchangeCaptureModeFn = unsafe extern "C" fn(*mut c_int) -> c_int;
/// cuStreamBeginCapture (CUDA 10.0's, and its _ptsz form): the stream only.
pub type BeginCaptureV1Fn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// cuStreamBeginCapture_v2: the stream and the capture mode.
pub type BeginCaptureFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
/// cuStreamBeginCaptureToGraph: stream, graph, dependencies, their edge data, their count, mode.
pub type BeginCaptureToGraphFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *const c_void, *const c_void, usize, c_int) -> c_int;
/// cuStreamEndCapture: the stream, and where the graph goes.
pub type EndCaptureFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> c_int;
pub type CtxPopFn = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
pub type DeviceGetAttributeFn = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
pub type MemGetGranularityFn = unsafe extern "C" fn(*mut usize, *const MemAllocationProp, c_int) -> c_int;
pub type MemAddressReserveFn = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> c_int;
pub type CtxEnablePeerAccessFn = unsafe extern "C" fn(*mut c_void, c_uint) -> c_int;
pub type MemAddressFreeFn = unsafe extern "C" fn(u64, usize) -> c_int;
pub type MemMapFn = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> c_int;
pub type MemSetAccessFn = unsafe extern "C" fn(u64, usize, *const MemAccessDesc, usize) -> c_int;
pub type MemUnmapFn = unsafe extern "C" fn(u64, usize) -> c_int;
pub type MemReleaseFn = unsafe extern "C" fn(u64) -> c_int;
pub type MemExportFn = unsafe extern "C" fn(*mut c_void, u64, c_int, u64) -> c_int;
pub type MemImportFn = unsafe extern "C" fn(*mut u64, *mut c_void, c_int) -> c_int;
pub type GetProcAddressFn = unsafe extern "C" fn(*const core::ffi::c_char, *mut *mut c_void, c_int, u64) -> c_int;
pub type GetProcAddressV2Fn = unsafe extern "C" fn(*const core::ffi::c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// CUmemAllocationProp (cuda.h): pinned device memory on one device.
#[repr(C)]
pub struct MemAllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

/// CUmemAccessDesc (cuda.h).
#[repr(C)]
pub struct MemAccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}

const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
pub(super) const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;

/// Pinned memory on `device`.
pub(super) fn device_memory(device: i32) -> MemAllocationProp {
    device_memory_shareable(device, 0)
}

/// Pinned memory on `device`, exportable as the handle types `types` ask (0: none).
pub(super) fn device_memory_shareable(device: i32, types: c_int) -> MemAllocationProp {
    MemAllocationProp {
        kind: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: types,
        location_type: CU_MEM_LOCATION_TYPE_DEVICE,
        location_id: device,
        win32_handle_meta_data: core::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// cuMemSetAccess of [addr, addr + len) for `device` and each device in the `peers` bit mask.
pub(super) fn set_access(addr: u64, len: u64, device: i32, peers: u64) -> Result<(), DeviceError> {
    let access = get(|d| d.mem_set_access)?;
    let mut descs = [const { MemAccessDesc { location_type: CU_MEM_LOCATION_TYPE_DEVICE, location_id: 0, flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE } }; 17];
    let mut n = 0;
    for d in core::iter::once(device).chain((0..64).filter(|p| peers >> p & 1 == 1 && *p != device)) {
        let Some(slot) = descs.get_mut(n) else { break };
        slot.location_id = d;
        n += 1;
    }
    // SAFETY: `n` descriptors on our stack, for chunks we mapped.
    check(unsafe { access(addr, len as usize, descs.as_ptr(), n) })
}

/// The driver's real entry points, each present or not.
pub struct DriverFns {
    pub ctx_get_current: Option<CtxGetCurrentFn>,
    pub device_get: Option<DeviceGetFn>,
    pub primary_get_state: Option<PrimaryGetStateFn>,
    pub primary_retain: Option<PrimaryRetainFn>,
    pub primary_release: Option<DeviceFn>,
    pub primary_release_v1: Option<DeviceFn>,
    pub primary_reset: Option<DeviceFn>,
    pub primary_reset_v1: Option<DeviceFn>,
    pub ctx_destroy: Option<CtxFn>,
    pub ctx_destroy_v1: Option<CtxFn>,
    pub stream_destroy: Option<CtxFn>,
    pub stream_destroy_v1: Option<CtxFn>,
    pub address_range: Option<AddressRangeFn>,
    pub pointer_get_attribute: Option<PointerGetAttributeFn>,
    pub pointer_get_attributes: Option<PointerGetAttributesFn>,
    pub ipc_get_mem_handle: Option<IpcGetMemHandleFn>,
    pub ipc_open_mem_handle: Option<IpcOpenMemHandleFn>,
    pub ipc_open_mem_handle_v1: Option<IpcOpenMemHandleFn>,
    pub ipc_close_mem_handle: Option<IpcCloseMemHandleFn>,
    pub mem_free: Option<MemFreeFn>,
    pub mem_free_async: Option<MemFreeAsyncFn>,
    pub mem_free_async_ptsz: Option<MemFreeAsyncFn>,
    pub mem_alloc: Option<MemAllocFn>,
    pub mem_alloc_async: Option<MemAllocAsyncFn>,
    pub mem_alloc_async_ptsz: Option<MemAllocAsyncFn>,
    pub mem_alloc_managed: Option<MemAllocManagedFn>,
    pub mem_create: Option<MemCreateFn>,
    pub mem_alloc_pitch: Option<MemAllocPitchFn>,
    pub mem_get_info: Option<MemGetInfoFn>,
    pub mem_host_alloc: Option<MemHostAllocFn>,
    pub mem_alloc_host: Option<MemAllocHostFn>,
    pub mem_free_host: Option<MemFreeHostFn>,
    pub mem_host_get_device_pointer: Option<MemHostGetDevicePointerFn>,
    pub mem_host_get_flags: Option<MemHostGetFlagsFn>,
    pub ctx_get_device: Option<CtxGetDeviceFn>,
    pub ctx_synchronize: Option<CtxSynchronizeFn>,
    pub exchange_capture_mode: Option<ExchangeCaptureModeFn>,
    pub begin_capture_v1: Option<BeginCaptureV1Fn>,
    pub begin_capture_v1_ptsz: Option<BeginCaptureV1Fn>,
    pub begin_capture: Option<BeginCaptureFn>,
    pub begin_capture_ptsz: Option<BeginCaptureFn>,
    pub begin_capture_to_graph: Option<BeginCaptureToGraphFn>,
    pub begin_capture_to_graph_ptsz: Option<BeginCaptureToGraphFn>,
    pub end_capture: Option<EndCaptureFn>,
    pub end_capture_ptsz: Option<EndCaptureFn>,
    pub ctx_push: Option<CtxFn>,
    pub ctx_pop: Option<CtxPopFn>,
    pub get_proc_address: Option<GetProcAddressFn>,
    pub get_proc_address_v2: Option<GetProcAddressV2Fn>,
    pub device_get_uuid: Option<DeviceGetUuidFn>,
    pub device_get_attribute: Option<DeviceGetAttributeFn>,
    pub mem_get_granularity: Option<MemGetGranularityFn>,
    pub mem_address_reserve: Option<MemAddressReserveFn>,
    pub mem_address_free: Option<MemAddressFreeFn>,
    pub ctx_enable_peer_access: Option<CtxEnablePeerAccessFn>,
    pub mem_map: Option<MemMapFn>,
    pub mem_set_access: Option<MemSetAccessFn>,
    pub mem_unmap: Option<MemUnmapFn>,
    pub mem_release: Option<MemReleaseFn>,
    pub mem_export: Option<MemExportFn>,
    pub mem_import: Option<MemImportFn>,
}

static DRIVER: Binding<DriverFns> = Binding::new();

const SONAMES: [&CStr; 2] = [c"libcuda.so.1", c"libcuda.so"];

/// # Safety
/// `handle` is RTLD_NEXT or a live dlopen handle; `T` is the symbol's true function type.
unsafe fn find<T: Copy>(handle: *mut c_void, name: &CStr) -> Option<T> {
    let p = libc::dlsym(handle, name.as_ptr());
    // SAFETY: a non-null symbol address of a C function of type T (caller's promise).
    (!p.is_null()).then(|| core::mem::transmute_copy::<*mut c_void, T>(&p))
}

/// # Safety
/// As `find`.
unsafe fn resolve_in(handle: *mut c_void) -> DriverFns {
    DriverFns {
        ctx_get_current: find(handle, c"cuCtxGetCurrent"),
        device_get: find(handle, c"cuDeviceGet"),
        primary_get_state: find(handle, c"cuDevicePrimaryCtxGetState"),
        primary_retain: find(handle, c"cuDevicePrimaryCtxRetain"),
        primary_release: find(handle, c"cuDevicePrimaryCtxRelease_v2"),
        primary_release_v1: find(handle, c"cuDevicePrimaryCtxRelease"),
        primary_reset: find(handle, c"cuDevicePrimaryCtxReset_v2"),
        primary_reset_v1: find(handle, c"cuDevicePrimaryCtxReset"),
        ctx_destroy: find(handle, c"cuCtxDestroy_v2"),
        ctx_destroy_v1: find(handle, c"cuCtxDestroy"),
        stream_destroy: find(handle, c"cuStreamDestroy_v2"),
        stream_destroy_v1: find(handle, c"cuStreamDestroy"),
        address_range: find(handle, c"cuMemGetAddressRange_v2"),
        pointer_get_attribute: find(handle, c"cuPointerGetAttribute"),
        pointer_get_attributes: find(handle, c"cuPointerGetAttributes"),
        ipc_get_mem_handle: find(handle, c"cuIpcGetMemHandle"),
        ipc_open_mem_handle: find(handle, c"cuIpcOpenMemHandle_v2"),
        ipc_open_mem_handle_v1: find(handle, c"cuIpcOpenMemHandle"),
        ipc_close_mem_handle: find(handle, c"cuIpcCloseMemHandle"),
        mem_free: find(handle, c"cuMemFree_v2"),
        mem_free_async: find(handle, c"cuMemFreeAsync"),
        mem_free_async_ptsz: find(handle, c"cuMemFreeAsync_ptsz"),
        mem_alloc: find(handle, c"cuMemAlloc_v2"),
        mem_alloc_async: find(handle, c"cuMemAllocAsync"),
        mem_alloc_async_ptsz: find(handle, c"cuMemAllocAsync_ptsz"),
        mem_alloc_managed: find(handle, c"cuMemAllocManaged"),
        mem_create: find(handle, c"cuMemCreate"),
        mem_alloc_pitch: find(handle, c"cuMemAllocPitch_v2"),
        mem_get_info: find(handle, c"cuMemGetInfo_v2"),
        mem_host_alloc: find(handle, c"cuMemHostAlloc"),
        mem_alloc_host: find(handle, c"cuMemAllocHost_v2"),
        mem_free_host: find(handle, c"cuMemFreeHost"),
        mem_host_get_device_pointer: find(handle, c"cuMemHostGetDevicePointer_v2"),
        mem_host_get_flags: find(handle, c"cuMemHostGetFlags"),
        ctx_get_device: find(handle, c"cuCtxGetDevice"),
        ctx_synchronize: find(handle, c"cuCtxSynchronize"),
        exchange_capture_mode: find(handle, c"cuThreadExchangeStreamCaptureMode"),
        begin_capture_v1: find(handle, c"cuStreamBeginCapture"),
        begin_capture_v1_ptsz: find(handle, c"cuStreamBeginCapture_ptsz"),
        begin_capture: find(handle, c"cuStreamBeginCapture_v2"),
        begin_capture_ptsz: find(handle, c"cuStreamBeginCapture_v2_ptsz"),
        begin_capture_to_graph: find(handle, c"cuStreamBeginCaptureToGraph"),
        begin_capture_to_graph_ptsz: find(handle, c"cuStreamBeginCaptureToGraph_ptsz"),
        end_capture: find(handle, c"cuStreamEndCapture"),
        end_capture_ptsz: find(handle, c"cuStreamEndCapture_ptsz"),
        ctx_push: find(handle, c"cuCtxPushCurrent_v2"),
        ctx_pop: find(handle, c"cuCtxPopCurrent_v2"),
        get_proc_address: find(handle, c"cuGetProcAddress"),
        get_proc_address_v2: find(handle, c"cuGetProcAddress_v2"),
        device_get_uuid: find(handle, c"cuDeviceGetUuid_v2").or_else(|| find(handle, c"cuDeviceGetUuid")),
        device_get_attribute: find(handle, c"cuDeviceGetAttribute"),
        mem_get_granularity: find(handle, c"cuMemGetAllocationGranularity"),
        mem_address_reserve: find(handle, c"cuMemAddressReserve"),
        mem_address_free: find(handle, c"cuMemAddressFree"),
        ctx_enable_peer_access: find(handle, c"cuCtxEnablePeerAccess"),
        mem_map: find(handle, c"cuMemMap"),
        mem_set_access: find(handle, c"cuMemSetAccess"),
        mem_unmap: find(handle, c"cuMemUnmap"),
        mem_release: find(handle, c"cuMemRelease"),
        mem_export: find(handle, c"cuMemExportToShareableHandle"),
        mem_import: find(handle, c"cuMemImportFromShareableHandle"),
    }
}

/// The real driver, or `None` when the process has none loaded (yet).
pub fn driver() -> Option<&'static DriverFns> {
    DRIVER.get(lookup)
}

fn lookup() -> Option<DriverFns> {
    // SAFETY: dlsym/dlopen with valid C strings; the symbols have the driver's documented
    // signatures.
    unsafe {
        let fns = resolve_in(libc::RTLD_NEXT);
        if fns.ctx_get_current.is_some() {
            return Some(fns);
        }
        for soname in SONAMES {
            let handle = libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if !handle.is_null() {
                let fns = resolve_in(handle);
                return fns.ctx_get_current.is_some().then_some(fns);
            }
        }
        None
    }
}

/// The UUID of the device with ordinal `device` (the same GPU has the same one in every process,
/// whatever CUDA_VISIBLE_DEVICES renumbers); None when the driver cannot say.
pub fn device_uuid(device: i32) -> Option<[u8; 16]> {
    let d = driver()?;
    let (get, uuid) = (d.device_get?, d.device_get_uuid?);
    let mut handle: c_int = 0;
    let mut out = [0u8; 16];
    // SAFETY: each call writes one value of its documented type.
    (unsafe { get(&mut handle, device) } == 0 && unsafe { uuid(&mut out, handle) } == 0).then_some(out)
}

/// The context current on this thread; 0 when none or no driver.
pub fn current_context() -> u64 {
    let Some(f) = driver().and_then(|d| d.ctx_get_current) else { return 0 };
    let mut ctx: *mut c_void = core::ptr::null_mut();
    // SAFETY: writes one pointer.
    if unsafe { f(&mut ctx) } != 0 {
        return 0;
    }
    ctx as u64
}

/// `device`'s primary context handle when it is active: `Some(Some(h))`; inactive:
/// `Some(None)`; no driver to ask: `None`. Retaining an active context and releasing it at
/// once leaves its reference count as it was.
pub fn primary_context(device: i32) -> Option<Option<u64>> {
    let d = driver()?;
    let (get_state, retain, release) = (d.primary_get_state?, d.primary_retain?, d.primary_release?);
    let mut dev: c_int = device;
    if let Some(device_get) = d.device_get {
        // SAFETY: writes one int.
        if unsafe { device_get(&mut dev, device) } != 0 {
            return None;
        }
    }
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: writes an unsigned and an int.
    if unsafe { get_state(dev, &mut flags, &mut active) } != 0 {
        return None;
    }
    if active == 0 {
        return Some(None);
    }
    let mut ctx: *mut c_void = core::ptr::null_mut();
    // SAFETY: writes one pointer; the matching release follows.
    if unsafe { retain(&mut ctx, dev) } != 0 {
        return None;
    }
    // SAFETY: releases the reference taken just above.
    unsafe { release(dev) };
    Some(Some(ctx as u64))
}

/// The driver allocation containing `addr`: (base, length).
pub fn allocation_range(addr: usize) -> Option<(usize, usize)> {
    let f = driver()?.address_range?;
    let (mut base, mut len) = (0u64, 0usize);
    // SAFETY: writes a CUdeviceptr and a size_t.
    if unsafe { f(&mut base, &mut len, addr as u64) } != 0 {
        return None;
    }
    Some((base as usize, len))
}

/// The driver is loaded (so trimming may call it).
pub fn is_bound() -> bool {
    DRIVER.is_bound()
}

pub(super) fn check(code: c_int) -> Result<(), DeviceError> {
    DeviceError::from_code(code)
}

const NOT_INITIALIZED: DeviceError = DeviceError::Other(CUDA_ERROR_INITIALIZATION);

pub(super) fn get<T>(pick: impl FnOnce(&DriverFns) -> Option<T>) -> Result<T, DeviceError> {
    driver().and_then(pick).ok_or(NOT_INITIALIZED)
}
