//! x86-64: malloc, free, calloc and realloc as naked functions, 3 to 6 instructions: compare
//! with a static in memory, tail-jump through the next allocator's entry point in memory (from
//! Rust, LLVM loads each atomic into a register first: 4 more instructions per free+malloc pair).
//! Each decides exactly as its twin in `route` (which other targets export) and goes to the same
//! slow path with the arguments in their registers. x86 loads are acquire loads, as those ask.

use crate::backing::BLOCK_ALIGN;
use crate::route;
use core::ffi::c_void;

/// `size < LARGE_FROM`: the next allocator's malloc; otherwise (large, or init not done) the
/// slow path.
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn malloc(_size: usize) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, qword ptr [rip + {large_from}]",
        "jae {slow}",
        "jmp qword ptr [rip + {next}]",
        large_from = sym route::LARGE_FROM,
        slow = sym route::malloc_slow,
        next = sym route::NEXT_MALLOC,
    )
}

/// A pointer off a BLOCK_ALIGN boundary is not the start of a block of ours or the arena's:
/// NEXT_FREE (always valid, see its doc). Null and aligned pointers: the slow path.
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn free(_p: *mut c_void) {
    core::arch::naked_asm!(
        "test edi, {foreign_bits}",
        "je {slow}",
        "jmp qword ptr [rip + {next}]",
        foreign_bits = const BLOCK_ALIGN - 1,
        slow = sym route::free_slow,
        next = sym route::NEXT_FREE,
    )
}

/// `count * size` without overflow and below LARGE_FROM: the next allocator's calloc. `mul`
/// leaves both arguments in rdi and rsi for the slow path (it clobbers rdx, not an argument).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn calloc(_count: usize, _size: usize) -> *mut c_void {
    core::arch::naked_asm!(
        "mov rax, rdi",
        "mul rsi",
        "jo {slow}",
        "cmp rax, qword ptr [rip + {large_from}]",
        "jae {slow}",
        "jmp qword ptr [rip + {next}]",
        large_from = sym route::LARGE_FROM,
        slow = sym route::calloc_slow,
        next = sym route::NEXT_CALLOC,
    )
}

/// A pointer off a BLOCK_ALIGN boundary staying below LARGE_FROM: NEXT_REALLOC; otherwise the slow
/// path (null, ours, the arena's, or growing into the host layer).
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn realloc(_p: *mut c_void, _size: usize) -> *mut c_void {
    core::arch::naked_asm!(
        "test edi, {foreign_bits}",
        "je {slow}",
        "cmp rsi, qword ptr [rip + {large_from}]",
        "jae {slow}",
        "jmp qword ptr [rip + {next}]",
        large_from = sym route::LARGE_FROM,
        foreign_bits = const BLOCK_ALIGN - 1,
        slow = sym route::realloc_slow,
        next = sym route::NEXT_REALLOC,
    )
}
