//! `tm_cuda_alloc_torch_raising`, tensormalloc.torch's allocation function: `tm_cuda_alloc_torch`,
//! and where the pool cannot serve a request, the exception PyTorch's own allocator raises
//! (`c10::OutOfMemoryError`: `torch.OutOfMemoryError` in Python), never a null pointer.
//! `tm_cuda_oom_raises` says which exception this process can raise.
//
// Note [Raising from the pluggable allocator]
// PyTorch's CUDAPluggableAllocator::malloc keeps whatever the allocation function returns: a null
// becomes a tensor at address 0 (torch/csrc/cuda/CUDAPluggableAllocator.cpp checks nothing),
// whose first use is an illegal address, sticky on a GPU. So the function itself throws, as
// PyTorch's caching allocator does (TORCH_CHECK_WITH(OutOfMemoryError, ...)): the exception
// unwinds from here through PyTorch's frames to the Python binding, which raises
// torch.OutOfMemoryError, and the next allocation works. The crate is built with panic=abort and
// its functions have no unwind tables a foreign exception could rely on, so the frame the
// exception passes through is this naked function, written with its CFI: it calls the pool
// (`tm_cuda_alloc_torch`), and on a null for a nonzero size asks `prepare` (plain Rust, returns
// normally) for the exception object, runs c10's constructor on it and calls __cxa_throw; both
// calls are made from this frame, so nothing of ours without unwind information is ever
// unwound. Without libc10.so's symbols the object is a std::bad_alloc (RuntimeError in
// Python); without a C++ runtime at all, the null as before (with one stderr line).
// The other route PyTorch offers, torch.cuda.MemPool over our allocator (PyTorch's caching
// allocator then checks the null and raises), puts PyTorch's cache back on top of ours, for
// the allocations inside a `use_mem_pool` block of one thread only: the plain preload, scoped.

use crate::sys::cxx_throw::{self, CxxString, Plan, Raises, SourceLocation};
use core::ffi::{c_int, c_void};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

/// The naked function's frame below its saved registers: c10's SourceLocation where the
/// constructor reads its stack argument, the message string, and the plan.
#[repr(C)]
struct Frame {
    location: SourceLocation,
    _pad: u64,
    text: CxxString,
    plan: Plan,
}
const _: () = assert!(core::mem::size_of::<Frame>() == 104);
const _: () = assert!(core::mem::offset_of!(Frame, text) == 32 && core::mem::offset_of!(Frame, plan) == 64);

/// PyTorch's pluggable allocator `alloc` (tensormalloc.torch): as `tm_cuda_alloc_torch`, and a
/// request the device cannot hold raises (Note [Raising from the pluggable allocator]).
///
/// # Safety
/// Called by PyTorch with a valid device and stream.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_alloc_torch_raising(_size: isize, _device: c_int, _stream: *mut c_void) -> *mut c_void {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "push rbx",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset rbx, -16",
        "push r12",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset r12, -24",
        "push r13",
        ".cfi_adjust_cfa_offset 8",
        ".cfi_offset r13, -32",
        "sub rsp, 112", // the Frame, rsp 16-aligned at each call
        ".cfi_adjust_cfa_offset 112",
        "mov rbx, rdi",
        "mov r12d, esi",
        "call {alloc}",
        "test rax, rax",
        "jnz 2f",
        "test rbx, rbx",
        "jle 2f", // 0 bytes: null is the answer
        "mov rdi, rbx",
        "mov esi, r12d",
        "mov rdx, rsp",
        "call {prepare}",
        "test eax, eax",
        "jz 1f", // nothing to throw with: null, as before
        "mov r13, qword ptr [rsp + 64]", // plan.object
        "mov rax, qword ptr [rsp + 72]", // plan.constructor
        "test rax, rax",
        "jz 3f",
        "mov rdi, r13",
        "lea rsi, [rsp + 32]", // the std::string, passed by reference; SourceLocation at [rsp]
        "call rax",
        "lea rdi, [rsp + 32]",
        "call {release}",
        "3:",
        "mov rdi, r13",
        "mov rsi, qword ptr [rsp + 80]", // plan.type_info
        "mov rdx, qword ptr [rsp + 88]", // plan.destructor
        "call qword ptr [rsp + 96]", // __cxa_throw: does not return
        "ud2",
        "1:",
        "xor eax, eax",
        "2:",
        "add rsp, 112",
        ".cfi_adjust_cfa_offset -112",
        "pop r13",
        ".cfi_adjust_cfa_offset -8",
        ".cfi_restore r13",
        "pop r12",
        ".cfi_adjust_cfa_offset -8",
        ".cfi_restore r12",
        "pop rbx",
        ".cfi_adjust_cfa_offset -8",
        ".cfi_restore rbx",
        "ret",
        ".cfi_endproc",
        alloc = sym super::cuda_runtime::tm_cuda_alloc_torch,
        prepare = sym prepare,
        release = sym release,
    )
}

/// Elsewhere the null goes back (no thrower written for other architectures yet).
///
/// # Safety
/// As tm_cuda_alloc_torch.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn tm_cuda_alloc_torch_raising(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { super::cuda_runtime::tm_cuda_alloc_torch(size, device, stream) }
}

/// Which exception a request the device cannot hold raises in this process: 3
/// torch.OutOfMemoryError, 2 std::bad_alloc (RuntimeError), 1 none (a null pointer is returned).
#[no_mangle]
pub extern "C" fn tm_cuda_oom_raises() -> c_int {
    if cfg!(target_arch = "x86_64") {
        cxx_throw::raises() as c_int
    } else {
        Raises::Nothing as c_int
    }
}

static SAID_NOTHING: AtomicBool = AtomicBool::new(false);

/// Fills the frame for the thrower: 1 to throw, 0 to return null.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
unsafe extern "C" fn prepare(size: isize, device: c_int, frame: *mut Frame) -> c_int {
    let mut message = crate::sys::stderr::StackWriter::<240>::new();
    let _ = write!(
        message,
        "CUDA out of memory. Tried to allocate {} on GPU {device} from tensormalloc's pool, which gave its idle memory back \
         first. tensormalloc.torch.memory_stats() and tensormalloc.holders() show what it holds.",
        crate::report::units::Bytes(size.unsigned_abs() as u64)
    );
    // SAFETY: frame is the naked function's, writable; the message lives until the constructor
    // has copied it.
    let planned = unsafe {
        let f = &mut *frame;
        cxx_throw::plan(message.as_bytes(), &mut f.text, &mut f.location, &mut f.plan)
    };
    if !planned && !SAID_NOTHING.swap(true, Ordering::Relaxed) {
        crate::warn_line!("tm_cuda_alloc_torch_raising: no C++ runtime in the process to raise with; a request the device cannot hold returns a null pointer");
    }
    c_int::from(planned)
}

/// What the constructor left of the message string goes.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
unsafe extern "C" fn release(text: *mut CxxString) {
    // SAFETY: the frame's string, filled by `prepare`.
    unsafe { cxx_throw::release_string(text) }
}
