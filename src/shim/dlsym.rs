//! x86-64: the exported `dlsym`. A program or runtime that takes libcuda's entry points by name
//! (`dlopen("libcuda.so.1")` then `dlsym`: nvcc's static runtime, Numba, JAX) gets ours for the
//! few the pool must see (`cuda_driver::served_symbol` decides); every other lookup tail-jumps to
//! glibc's dlsym with the caller's registers and return address untouched, so `RTLD_NEXT` keeps
//! meaning "after the caller". On other targets dlsym is not interposed (README).

use core::ffi::{c_char, c_void};

#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn dlsym(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // Keep the arguments, align the stack for the call (entry leaves rsp 8 off 16).
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "jmp qword ptr [rip + {real}]",
        "2:",
        "ret",
        decide = sym super::cuda_driver::served_symbol,
        real = sym crate::sys::dlsym::REAL_DLSYM,
    )
}
