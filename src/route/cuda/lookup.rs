//! The lookups that hand out driver entry points, routed (`shim::cuda_lookup`'s, one call each):
//! the real lookup answers, then ours stands in where the pool serves that entry point at that
//! version (`cuGetProcAddress(_v2)`, the runtime's `cudaGetDriverEntryPoint*`), and the exported
//! dlsym's decision. Which function of ours stands for which exported name is the shim's table
//! (`Served`), passed in: this layer never names an entry point.

use super::pool_on;
use crate::backing::{CUDA_ERROR_INITIALIZATION, CUDA_SUCCESS};
use crate::sys::cuda_driver::{driver, DriverFns};
use core::ffi::{c_char, c_int, c_uint, c_void, CStr};

const NO_DRIVER: c_int = CUDA_ERROR_INITIALIZATION;
const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// Our entry point for an exported driver symbol we serve, and the address of the real one it
/// stands in for (`None` when the driver lacks that export).
pub type Served = fn(&[u8], &DriverFns) -> Option<(*mut c_void, Option<usize>)>;

/// The exported name `cuGetProcAddress` hands out for `base` at `cuda_version`: the version
/// thresholds of the driver's own table for the entry points we serve.
fn versioned(base: &[u8], cuda_version: c_int, per_thread: bool) -> Option<&'static [u8]> {
    let at = |since: c_int, new: &'static [u8], old: &'static [u8]| Some(if cuda_version >= since { new } else { old });
    match base {
        b"cuMemAlloc" => at(3020, b"cuMemAlloc_v2", b"cuMemAlloc"),
        b"cuMemAllocPitch" => at(3020, b"cuMemAllocPitch_v2", b"cuMemAllocPitch"),
        b"cuMemFree" => at(3020, b"cuMemFree_v2", b"cuMemFree"),
        b"cuMemGetInfo" => at(3020, b"cuMemGetInfo_v2", b"cuMemGetInfo"),
        b"cuMemAllocHost" => at(3020, b"cuMemAllocHost_v2", b"cuMemAllocHost"),
        b"cuMemGetAddressRange" => at(3020, b"cuMemGetAddressRange_v2", b"cuMemGetAddressRange"),
        b"cuCtxDestroy" => at(4000, b"cuCtxDestroy_v2", b"cuCtxDestroy"),
        b"cuStreamDestroy" => at(4000, b"cuStreamDestroy_v2", b"cuStreamDestroy"),
        b"cuDevicePrimaryCtxRelease" => at(11000, b"cuDevicePrimaryCtxRelease_v2", b"cuDevicePrimaryCtxRelease"),
        b"cuDevicePrimaryCtxReset" => at(11000, b"cuDevicePrimaryCtxReset_v2", b"cuDevicePrimaryCtxReset"),
        b"cuGetProcAddress" => at(12000, b"cuGetProcAddress_v2", b"cuGetProcAddress"),
        b"cuStreamBeginCapture" => Some(match (cuda_version >= 10010, per_thread) {
            (true, true) => b"cuStreamBeginCapture_v2_ptsz",
            (true, false) => b"cuStreamBeginCapture_v2",
            (false, true) => b"cuStreamBeginCapture_ptsz",
            (false, false) => b"cuStreamBeginCapture",
        }),
        b"cuStreamBeginCaptureToGraph" => Some(if per_thread { b"cuStreamBeginCaptureToGraph_ptsz" } else { b"cuStreamBeginCaptureToGraph" }),
        b"cuStreamEndCapture" => Some(if per_thread { b"cuStreamEndCapture_ptsz" } else { b"cuStreamEndCapture" }),
        b"cuMemFreeAsync" => Some(if per_thread { b"cuMemFreeAsync_ptsz" } else { b"cuMemFreeAsync" }),
        b"cuMemAllocAsync" => Some(if per_thread { b"cuMemAllocAsync_ptsz" } else { b"cuMemAllocAsync" }),
        b"cuMemAllocManaged" => Some(b"cuMemAllocManaged"),
        b"cuMemCreate" => Some(b"cuMemCreate"),
        b"cuCtxEnablePeerAccess" => Some(b"cuCtxEnablePeerAccess"),
        b"cuMemHostAlloc" => Some(b"cuMemHostAlloc"),
        b"cuMemFreeHost" => Some(b"cuMemFreeHost"),
        b"cuMemHostGetDevicePointer" => at(3020, b"cuMemHostGetDevicePointer_v2", b"cuMemHostGetDevicePointer"),
        b"cuMemHostGetFlags" => Some(b"cuMemHostGetFlags"),
        b"cuIpcGetMemHandle" => Some(b"cuIpcGetMemHandle"),
        b"cuIpcOpenMemHandle" => at(11000, b"cuIpcOpenMemHandle_v2", b"cuIpcOpenMemHandle"),
        b"cuIpcCloseMemHandle" => Some(b"cuIpcCloseMemHandle"),
        b"cuPointerGetAttribute" => Some(b"cuPointerGetAttribute"),
        b"cuPointerGetAttributes" => Some(b"cuPointerGetAttributes"),
        _ => None,
    }
}

/// After a lookup of `symbol` answered `rc` with `*pfn`: ours in its place when it succeeded and
/// we serve that entry point at that version. `flags` are cuGetProcAddress's (the runtime's
/// cudaGetDriverEntryPoint flags have the same values).
unsafe fn substituted(rc: c_int, symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, served: Served) -> c_int {
    if rc != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() || (*pfn).is_null() || !pool_on() {
        return rc;
    }
    let Some(d) = driver() else { return rc };
    let base = CStr::from_ptr(symbol).to_bytes();
    // The driver's own answer names the per-thread spelling when the caller asked for it.
    let answered_per_thread = || versioned(base, cuda_version, true).and_then(|name| served(name, d)).is_some_and(|(_, real)| real == Some(*pfn as usize));
    let per_thread = flags == PER_THREAD_DEFAULT_STREAM || answered_per_thread();
    // Only where our wrapper has the driver's export of that name to forward to.
    if let Some((ours, Some(_))) = versioned(base, cuda_version, per_thread).and_then(|name| served(name, d)) {
        *pfn = ours;
    }
    rc
}

/// # Safety
/// As cuGetProcAddress (CUDA 11.3 to 11.8's form).
pub unsafe fn get_proc_address(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, served: Served) -> c_int {
    let Some(get) = driver().and_then(|d| d.get_proc_address) else { return NO_DRIVER };
    substituted(get(symbol, pfn, cuda_version, flags), symbol, pfn, cuda_version, flags, served)
}

/// # Safety
/// As cuGetProcAddress_v2 (CUDA 12's, with the query result).
pub unsafe fn get_proc_address_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_int, served: Served) -> c_int {
    let Some(get) = driver().and_then(|d| d.get_proc_address_v2) else { return NO_DRIVER };
    substituted(get(symbol, pfn, cuda_version, flags, status), symbol, pfn, cuda_version, flags, served)
}

/// The runtime's way to a driver entry point: ours for those the pool serves, as
/// cuGetProcAddress gives (the runtime asks at its own CUDA version).
///
/// # Safety
/// As cudaGetDriverEntryPoint (CUDA 12's form; CUDA 11's has no status pointer, which the
/// runtime of such a program then does not read either).
pub unsafe fn driver_entry_point(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int, served: Served) -> c_int {
    let Some(get) = crate::sys::cuda_runtime::real().and_then(|rt| rt.get_driver_entry_point) else { return CUDA_ERROR_INITIALIZATION };
    substituted(get(symbol, pfn, flags, status), symbol, pfn, c_int::MAX, flags, served)
}

/// # Safety
/// As cudaGetDriverEntryPointByVersion.
pub unsafe fn driver_entry_point_by_version(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_uint, flags: u64, status: *mut c_int, served: Served) -> c_int {
    let Some(get) = crate::sys::cuda_runtime::real().and_then(|rt| rt.get_driver_entry_point_by_version) else { return CUDA_ERROR_INITIALIZATION };
    let rc = get(symbol, pfn, cuda_version, flags, status);
    substituted(rc, symbol, pfn, c_int::try_from(cuda_version).unwrap_or(c_int::MAX), flags, served)
}

/// Decides a `dlsym(handle, name)` for the exported dlsym (`our_dlsym`, which glibc's lookup must
/// not find again): ours when `name` is a driver entry point we serve and `handle` resolves it to
/// the very driver we bind; null to let glibc's dlsym answer (every other lookup, `RTLD_DEFAULT`
/// and `RTLD_NEXT` included: by symbol those already reach ours, or deliberately the next
/// definition). Allocation-free; before our init or with the pool off it never serves.
#[cfg(target_arch = "x86_64")]
pub fn served_symbol(handle: *mut c_void, name: *const c_char, served: Served, our_dlsym: *const ()) -> *mut c_void {
    let real_dlsym = crate::sys::dlsym::resolve(our_dlsym);
    let none = core::ptr::null_mut();
    if name.is_null() || handle.is_null() || handle == libc::RTLD_NEXT {
        return none;
    }
    // SAFETY: dlsym's name is a C string.
    let symbol = unsafe { CStr::from_ptr(name) }.to_bytes();
    if !symbol.starts_with(b"cu") || !pool_on() {
        return none;
    }
    let Some(d) = driver() else { return none };
    let Some((ours, Some(real_addr))) = served(symbol, d) else { return none };
    // SAFETY: glibc's dlsym with the caller's handle and name.
    let found = unsafe { real_dlsym(handle, name) };
    if found as usize == real_addr {
        ours
    } else {
        none
    }
}
