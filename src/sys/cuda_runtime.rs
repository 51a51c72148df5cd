//! The program's own shared CUDA runtime, for the runtime entry points we interpose to pass
//! calls through (the pool itself runs over the driver, `sys::cuda_driver`). Bound lazily on the
//! first CUDA call (`sys::bind`, shared with the driver): dlsym(RTLD_NEXT) finds the runtime
//! that our interposed symbols shadow; when the program loaded it with RTLD_LOCAL (Python
//! extensions, such as PyTorch's), dlopen(RTLD_NOLOAD) reaches that same loaded copy by soname.
//! We never load a runtime ourselves: a process without CUDA pays nothing.

use super::bind::Binding;
use core::ffi::{c_int, c_uint, c_void, CStr};

type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetDeviceFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type SetDeviceFn = unsafe extern "C" fn(c_int) -> c_int;
type SyncFn = unsafe extern "C" fn() -> c_int;
type MemInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
type HostAllocFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int;
type MallocHostFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
pub type IpcGetMemHandleFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
pub type IpcOpenMemHandleFn = unsafe extern "C" fn(*mut *mut c_void, super::cuda_driver::IpcMemHandle, c_uint) -> c_int;
pub type IpcCloseMemHandleFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type FreeAsyncFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
pub type GetDriverEntryPointFn = unsafe extern "C" fn(*const core::ffi::c_char, *mut *mut c_void, u64, *mut c_int) -> c_int;
pub type GetDriverEntryPointByVersionFn = unsafe extern "C" fn(*const core::ffi::c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> c_int;

/// The runtime's real entry points.
pub struct CudaFns {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub get_device: GetDeviceFn,
    pub set_device: SetDeviceFn,
    pub synchronize: SyncFn,
    pub mem_get_info: MemInfoFn,
    pub host_alloc: HostAllocFn,
    pub malloc_host: MallocHostFn,
    pub free_host: FreeFn,
    pub get_last_error: SyncFn,
    // Optional: older runtimes (and stand-ins) may lack them.
    pub device_reset: Option<SyncFn>,
    pub ipc_get_mem_handle: Option<IpcGetMemHandleFn>,
    pub ipc_open_mem_handle: Option<IpcOpenMemHandleFn>,
    pub ipc_close_mem_handle: Option<IpcCloseMemHandleFn>,
    pub free_async: Option<FreeAsyncFn>,
    pub free_async_ptsz: Option<FreeAsyncFn>,
    pub get_driver_entry_point: Option<GetDriverEntryPointFn>,
    pub get_driver_entry_point_by_version: Option<GetDriverEntryPointByVersionFn>,
}

static RUNTIME: Binding<CudaFns> = Binding::new();

const SONAMES: [&CStr; 5] = [c"libcudart.so.12", c"libcudart.so.13", c"libcudart.so.11.0", c"libcudart.so.10.2", c"libcudart.so"];

unsafe fn find(handle: *mut c_void, name: &CStr) -> *mut c_void {
    libc::dlsym(handle, name.as_ptr())
}

unsafe fn resolve_in(handle: *mut c_void) -> Option<CudaFns> {
    macro_rules! get {
        ($name:literal, $ty:ty) => {{
            let p = find(handle, $name);
            if p.is_null() {
                return None;
            }
            core::mem::transmute::<*mut c_void, $ty>(p)
        }};
    }
    macro_rules! optional {
        ($name:literal, $ty:ty) => {{
            let p = find(handle, $name);
            (!p.is_null()).then(|| core::mem::transmute::<*mut c_void, $ty>(p))
        }};
    }
    Some(CudaFns {
        malloc: get!(c"cudaMalloc", MallocFn),
        free: get!(c"cudaFree", FreeFn),
        get_device: get!(c"cudaGetDevice", GetDeviceFn),
        set_device: get!(c"cudaSetDevice", SetDeviceFn),
        synchronize: get!(c"cudaDeviceSynchronize", SyncFn),
        mem_get_info: get!(c"cudaMemGetInfo", MemInfoFn),
        host_alloc: get!(c"cudaHostAlloc", HostAllocFn),
        malloc_host: get!(c"cudaMallocHost", MallocHostFn),
        free_host: get!(c"cudaFreeHost", FreeFn),
        get_last_error: get!(c"cudaGetLastError", SyncFn),
        device_reset: optional!(c"cudaDeviceReset", SyncFn),
        ipc_get_mem_handle: optional!(c"cudaIpcGetMemHandle", IpcGetMemHandleFn),
        ipc_open_mem_handle: optional!(c"cudaIpcOpenMemHandle", IpcOpenMemHandleFn),
        ipc_close_mem_handle: optional!(c"cudaIpcCloseMemHandle", IpcCloseMemHandleFn),
        free_async: optional!(c"cudaFreeAsync", FreeAsyncFn),
        free_async_ptsz: optional!(c"cudaFreeAsync_ptsz", FreeAsyncFn),
        get_driver_entry_point: optional!(c"cudaGetDriverEntryPoint", GetDriverEntryPointFn),
        get_driver_entry_point_by_version: optional!(c"cudaGetDriverEntryPointByVersion", GetDriverEntryPointByVersionFn),
    })
}

/// The real runtime, or `None` when the process has none we can reach (yet).
pub fn real() -> Option<&'static CudaFns> {
    RUNTIME.get(lookup)
}

/// The runtime was bound: the program called one of its entry points through us.
pub fn is_bound() -> bool {
    RUNTIME.is_bound()
}

fn lookup() -> Option<CudaFns> {
    // SAFETY: dlsym/dlopen with valid C strings; the functions found have the runtime's
    // documented signatures.
    unsafe {
        if let Some(fns) = resolve_in(libc::RTLD_NEXT) {
            return Some(fns);
        }
        for soname in SONAMES {
            let handle = libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if !handle.is_null() {
                if let Some(fns) = resolve_in(handle) {
                    return Some(fns);
                }
            }
        }
        None
    }
}
