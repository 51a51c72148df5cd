//! CUDA's route, as `route` is malloc's: the one decision "does the pool serve this call" for
//! the runtime's and the driver's entry points alike, and the answers a pooled free gives; each
//! entry point's routing in `runtime`, `driver`, `captures`, `ipc` (`ipc_chunks` for expandable blocks) and `lookup` (a shim is one call into
//! them). Called by the shims only; calls the device layer (`DEVICE`) and the sys
//! layer (the real functions, the context query), never a shim.

use crate::backing::{DeviceError, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::device::device_layer::FreeAnswer;
use crate::sys::cuda_runtime::CudaFns;
use crate::state::DEVICE;
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

pub mod captures;
pub mod driver;
pub mod ipc;
mod ipc_chunks;
pub mod lookup;
pub mod runtime;

/// Our init ran: the pool may be asked (it answers for its pointers even when off), unless this
/// is a forked child of a process that used it (Note [Forked children]).
fn pool_answers() -> bool {
    crate::state::globals().is_some() && DEVICE.answers()
}

/// The pool is on: our init ran, neither TENSORMALLOC_DISABLE nor TENSORMALLOC_CUDA_POOL=none
/// turned it off, and the process allocates through us (Note [A copy the process does not
/// allocate through] in sys/front.rs). With it off, lookups hand out the driver's own entry
/// points (a profiler sees those) and allocations pass through; PyTorch's pluggable allocator
/// is served all the same.
fn pool_on() -> bool {
    crate::state::globals().is_some() && DEVICE.enabled() && crate::sys::front::serves_the_process()
}

// Note [Per-thread streams]
// A block freed on a stream is reused on that stream with no synchronization (Note [Safe reuse]
// in device/pool/mod.rs), so the pool must know which stream a handle names. Two handles name a
// different stream on each thread: cudaStreamPerThread (2), which CuPy passes from every thread
// under CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1, and the null stream of a _ptsz entry point (a
// program built with --default-stream per-thread). Taken as one stream, a block thread A freed
// with its kernel still queued went at once to thread B, whose data A's kernel then overwrote.
// Each is this thread's own stream here; cudaStreamLegacy (1) is the null stream it names.

/// The stream `handle` names for the pool's reuse (Note [Per-thread streams]);
/// `per_thread_default`: the call came through a _ptsz entry point.
fn stream_of(handle: *mut core::ffi::c_void, per_thread_default: bool) -> usize {
    const LEGACY: usize = 1;
    const PER_THREAD: usize = 2;
    match handle as usize {
        0 if per_thread_default => this_threads_stream(),
        LEGACY => 0,
        PER_THREAD => this_threads_stream(),
        h => h,
    }
}

/// A stream word no handle is (handles are addresses under 2^57): a number above bit 62 that
/// no other thread of the process is given, not even one made later on the same stack (a thread
/// that ended may have left work queued on its stream).
fn this_threads_stream() -> usize {
    thread_local! {
        static STREAM: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    }
    static NEXT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(1);
    STREAM.with(|s| {
        if s.get() == 0 {
            s.set(1 << 62 | NEXT.fetch_add(1, Relaxed));
        }
        s.get()
    })
}

/// The pool may serve an allocation: it is on and a context is current (a driver allocation
/// with none fails, and the driver should say so).
fn pool_ready() -> bool {
    pool_on() && crate::sys::cuda_driver::current_context() != 0
}

/// A stream-ordered free needs a current context (its stream is one's): with none, a pointer of
/// ours gets the driver's answer (invalid context) and stays as it was; any other goes to the
/// driver, which answers. (Plain frees need none: cuMemFree_v2, cuMemFreeHost.)
fn without_context(addr: usize) -> Option<c_int> {
    (crate::sys::cuda_driver::current_context() == 0 && DEVICE.holds(addr)).then_some(CUDA_ERROR_INVALID_CONTEXT)
}

/// The pool may serve this runtime call: it is on and a context is current.
fn runtime_ready(rt: &CudaFns) -> bool {
    pool_on() && context_bound(rt)
}

/// Whether a context is current, after the runtime has set itself up for it (Note [The runtime
/// set up before we serve it]).
fn context_bound(rt: &CudaFns) -> bool {
    thread_local! {
        /// The context the runtime was last set up for on this thread, and how many contexts
        /// had ended then (a reset keeps a primary context's handle: a new context, the same
        /// handle; the review's find).
        static SET_UP_FOR: core::cell::Cell<(u64, u64)> = const { core::cell::Cell::new((0, 0)) };
    }
    let current = crate::sys::cuda_driver::current_context();
    let ended = crate::device::device_layer::contexts_ended();
    if current != 0 && SET_UP_FOR.with(|s| s.get()) == (current, ended) {
        return true;
    }
    // SAFETY: cudaFree(NULL) is defined to do nothing but initialize.
    unsafe { (rt.free)(core::ptr::null_mut()) };
    let bound = crate::sys::cuda_driver::current_context();
    SET_UP_FOR.with(|s| s.set((bound, ended)));
    bound != 0
}

// Note [The runtime set up before we serve it]
// The pool answers cudaMalloc, cudaMallocHost, cudaHostAlloc and cudaMemGetInfo from the driver,
// so the runtime never sees them. Alone, the runtime's first call on a device sets it up: it
// binds the device's primary context when none is current, and it retains that context, which
// then lives as long as the runtime does. A program whose first runtime call is one of ours
// would otherwise have no such reference: where a library using the driver API (Numba,
// cuda-python, PyCUDA, JAX) had retained the primary context and made it current, its release
// destroyed the context and every block in it (cudaMemset and cudaFree failing, a read of the
// block 700, the program's own write to pinned memory SIGSEGV: the cudart hunter). So each
// thread calls `cudaFree(NULL)`, the runtime's own idiom for "set up and do nothing else", once
// for each context it finds current at one of these calls: one call of the runtime's per thread
// and context, a load of a thread-local after.

/// The memory a free names, for the one line a refused free prints per kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FreeOf {
    Device,
    Pinned,
}

/// The answer to a free the pool was asked first (runtime and driver entry points alike): ours
/// for a pooled pointer, the real function's for any other, and for a pointer inside our memory
/// that is no live block, the runtime's answer for a pointer it never handed out (Note
/// [Unexpected frees] in device/device_layer/free.rs).
fn answer_free(call: &str, ptr: usize, of: FreeOf, freed: Result<FreeAnswer, DeviceError>, real_free: impl FnOnce() -> c_int) -> c_int {
    match freed {
        Ok(FreeAnswer::Pooled) => CUDA_SUCCESS,
        Ok(FreeAnswer::NotOurs) => real_free(),
        Ok(FreeAnswer::Refused) => {
            warn_refused(call, ptr, of);
            CUDA_ERROR_INVALID_VALUE
        }
        Err(e) => e.code(),
    }
}

static WARNED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

/// One stderr line per kind of memory, as glibc names the pointer of a bad free.
fn warn_refused(call: &str, ptr: usize, of: FreeOf) {
    let (slot, what, kind) = match of {
        FreeOf::Device => (0, "the device pool", "device"),
        FreeOf::Pinned => (1, "the pinned cache", "pinned"),
    };
    if WARNED.get(slot).is_none_or(|w| w.swap(true, Relaxed)) {
        return;
    }
    crate::warn_line!(
        "{}({:#x}): not a live block of {} (a double free, or a pointer inside a block); refused with invalid value, nothing freed (said once for {} memory)",
        call, ptr, what, kind
    );
}
