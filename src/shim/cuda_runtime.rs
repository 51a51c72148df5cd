//! The CUDA runtime entry points we interpose, and the PyTorch pluggable-allocator pair: each is
//! one call into `route::cuda::runtime`, which decides whether the pool serves it and answers.
//! `cudaGetDriverEntryPoint*` is in `cuda_lookup.rs`.

use crate::record::holders;
use crate::route::cuda::runtime as route;
use core::ffi::{c_int, c_uint, c_void};

with_caller!(
    /// # Safety
    /// `ptr` is writable, as cudaMalloc requires.
    fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int, "rdx" => route::malloc
);

/// # Safety
/// As cudaFree.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: *mut c_void) -> c_int {
    route::free(ptr)
}

/// # Safety
/// As cudaMemGetInfo.
#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    route::mem_get_info(free, total)
}

with_caller!(
    /// # Safety
    /// As cudaHostAlloc.
    fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> c_int, "rcx" => route::host_alloc
);

with_caller!(
    /// # Safety
    /// As cudaMallocHost (cudaHostAlloc with default flags).
    fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int, "rdx" => route::malloc_host
);

/// # Safety
/// As cudaFreeHost.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    route::free_host(ptr)
}

/// Note [Context lifetime]: the pool forgets the current device's primary context.
///
/// # Safety
/// As cudaDeviceReset.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> c_int {
    route::device_reset()
}

/// Note [IPC] (device/pool/pointers.rs): a block sharing a segment gets a handle of ours.
///
/// # Safety
/// As cudaIpcGetMemHandle: `handle` points to a cudaIpcMemHandle_t.
#[no_mangle]
pub unsafe extern "C" fn cudaIpcGetMemHandle(handle: *mut c_void, ptr: *mut c_void) -> c_int {
    crate::route::cuda::ipc::runtime_get(handle, ptr)
}

/// Note [IPC]: a handle of ours opens the block it names.
///
/// # Safety
/// As cudaIpcOpenMemHandle.
#[no_mangle]
pub unsafe extern "C" fn cudaIpcOpenMemHandle(ptr: *mut *mut c_void, handle: crate::sys::cuda_driver::IpcMemHandle, flags: c_uint) -> c_int {
    crate::route::cuda::ipc::runtime_open(ptr, handle, flags)
}

/// # Safety
/// As cudaIpcCloseMemHandle.
#[no_mangle]
pub unsafe extern "C" fn cudaIpcCloseMemHandle(ptr: *mut c_void) -> c_int {
    crate::route::cuda::ipc::runtime_close(ptr)
}

/// # Safety
/// As cudaFreeAsync.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    route::free_async(ptr, stream, |rt| rt.free_async, false)
}

/// The per-thread-default-stream spelling of cudaFreeAsync.
///
/// # Safety
/// As cudaFreeAsync.
#[no_mangle]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    route::free_async(ptr, stream, |rt| rt.free_async_ptsz, true)
}

with_caller!(
    /// PyTorch's CUDAPluggableAllocator `alloc`: `torch.cuda.memory.CUDAPluggableAllocator(
    /// "libtensormalloc.so", "tm_cuda_alloc", "tm_cuda_free")`. Reuse is stream-aware: a block freed
    /// on a stream is reused on that stream with no synchronization.
    ///
    /// # Safety
    /// Called by PyTorch with a valid device and stream.
    fn tm_cuda_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void, "rcx" => route::pluggable_alloc
);

/// `tm_cuda_alloc` for PyTorch's pluggable allocator (tensormalloc.torch): its blocks are torch's
/// in the holders table.
///
/// # Safety
/// As tm_cuda_alloc.
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_alloc_torch(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    route::pluggable_alloc(size, device, stream, holders::Asker::hook(0, holders::KEY_TORCH))
}

/// `tm_cuda_alloc` for a hook that names its library (`hook`: 1 numpy, 2 torch, 3 cupy, 4 numba,
/// 5 jax; others count as the caller's own), as the Python package's CuPy and Numba hooks do.
///
/// # Safety
/// As tm_cuda_alloc.
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_alloc_as(size: isize, device: c_int, stream: *mut c_void, hook: c_int) -> *mut c_void {
    route::pluggable_alloc(size, device, stream, holders::Asker::hook(0, holders::hook_key(hook)))
}

/// PyTorch's CUDAPluggableAllocator `free`.
///
/// # Safety
/// `ptr` came from `tm_cuda_alloc`.
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_free(ptr: *mut c_void, _size: isize, device: c_int, stream: *mut c_void) {
    route::pluggable_free(ptr, device, stream)
}
