//! The program's own shared CUDA runtime, for the runtime entry points we interpose to pass
//! calls through (the pool itself runs over the driver, `sys::cuda_driver`). Bound lazily on the
//! first CUDA call: dlsym(RTLD_NEXT) finds the runtime that our interposed symbols shadow; when
//! the program loaded it with RTLD_LOCAL (Python extensions, such as PyTorch's),
//! dlopen(RTLD_NOLOAD) reaches that same loaded copy by soname. We never load a runtime
//! ourselves: a process without CUDA pays nothing.

use core::ffi::{c_int, c_uint, c_void, CStr};
use core::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetDeviceFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type SetDeviceFn = unsafe extern "C" fn(c_int) -> c_int;
type SyncFn = unsafe extern "C" fn() -> c_int;
type MemInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
type HostAllocFn = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int;
type MallocHostFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
pub type IpcGetMemHandleFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
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
    pub free_async: Option<FreeAsyncFn>,
    pub free_async_ptsz: Option<FreeAsyncFn>,
    pub get_driver_entry_point: Option<GetDriverEntryPointFn>,
    pub get_driver_entry_point_by_version: Option<GetDriverEntryPointByVersionFn>,
}

static STATE: AtomicU8 = AtomicU8::new(0); // 0 unresolved, 1 resolving, 2 done, 3 absent
static FNS: AtomicPtr<CudaFns> = AtomicPtr::new(core::ptr::null_mut());
static mut STORAGE: core::mem::MaybeUninit<CudaFns> = core::mem::MaybeUninit::uninit();

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
        free_async: optional!(c"cudaFreeAsync", FreeAsyncFn),
        free_async_ptsz: optional!(c"cudaFreeAsync_ptsz", FreeAsyncFn),
        get_driver_entry_point: optional!(c"cudaGetDriverEntryPoint", GetDriverEntryPointFn),
        get_driver_entry_point_by_version: optional!(c"cudaGetDriverEntryPointByVersion", GetDriverEntryPointByVersionFn),
    })
}

/// The real runtime, or `None` when the process has none we can reach.
pub fn real() -> Option<&'static CudaFns> {
    let p = FNS.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: published once, never changed.
        return Some(unsafe { &*p });
    }
    resolve_slow()
}

#[cold]
fn resolve_slow() -> Option<&'static CudaFns> {
    if STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
        // Another thread is resolving: wait for it (dlsym is quick and does not call CUDA).
        while STATE.load(Ordering::Acquire) == 1 {
            core::hint::spin_loop();
        }
        let p = FNS.load(Ordering::Acquire);
        // SAFETY: as in real().
        return (!p.is_null()).then(|| unsafe { &*p });
    }
    // SAFETY: dlsym/dlopen with valid C strings; the functions found have the runtime's
    // documented signatures. STORAGE is written once, by this thread, before publication.
    unsafe {
        let mut fns = resolve_in(libc::RTLD_NEXT);
        for soname in SONAMES {
            if fns.is_some() {
                break;
            }
            let handle = libc::dlopen(soname.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if !handle.is_null() {
                fns = resolve_in(handle);
            }
        }
        match fns {
            Some(f) => {
                let storage = &mut *core::ptr::addr_of_mut!(STORAGE);
                let stored: *mut CudaFns = storage.write(f);
                FNS.store(stored, Ordering::Release);
                STATE.store(2, Ordering::Release);
                Some(&*stored)
            }
            None => {
                STATE.store(3, Ordering::Release);
                None
            }
        }
    }
}
