//! C++ `operator new`/`new[]`/`delete`/`delete[]` in every form (sized, aligned, nothrow), under
//! their Itanium-ABI names, so a large `new` reaches the host layer even with jemalloc, tcmalloc
//! or mimalloc (which export their own) preloaded behind us. Each is one call into `route::cxx`;
//! the four throwing news are naked (x86-64 only) so the next operator's exception never crosses us.
#![allow(non_snake_case)]

use crate::record::holders::Asker;
use crate::route::cxx as route;
use crate::sys::next_cxx as next;
use core::ffi::c_void;

/// A throwing new: small (and resolved) -> tail-jump to the next operator (libstdc++'s: the next
/// malloc first); otherwise the slow path, which returns the block it served, or null and the
/// operator to tail-jump to with the caller's registers (rdi = size, rsi = align) restored. rsp
/// is 16-aligned at each call. The aligned forms always go to the next operator as they are.
#[cfg(target_arch = "x86_64")]
macro_rules! throwing_new {
    ($name:ident, $slot:path, $slow:path) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name(_size: usize) -> *mut c_void {
            core::arch::naked_asm!(
                "mov rax, qword ptr [rip + {slot}]",
                "cmp rax, 1",
                "jbe 2f",
                "cmp rdi, qword ptr [rip + {large_from}]",
                "jae 2f",
                "cmp byte ptr [rip + {slot} + {plain}], 0",
                "jne 4f",
                "jmp rax",
                // libstdc++'s operator (Note [libstdc++ shortcut] in sys/next_cxx.rs): the next
                // malloc, and only a NULL goes on to the operator, to retry, call the
                // new_handler or throw.
                "4:",
                "push rdi",
                "call qword ptr [rip + {next_malloc}]",
                "pop rdi",
                "test rax, rax",
                "je 5f",
                "ret",
                "5:",
                "jmp qword ptr [rip + {slot}]",
                // The slow path takes the caller's return address (Note [Holders]).
                "2:",
                "mov rsi, qword ptr [rsp]",
                "push rdi",
                "call {slow}",
                "pop rdi",
                "test rax, rax",
                "je 3f",
                "ret",
                "3:",
                "jmp rdx",
                slot = sym $slot,
                large_from = sym crate::route::LARGE_FROM,
                next_malloc = sym crate::route::NEXT_MALLOC,
                plain = const next::PLAIN_OFFSET,
                slow = sym $slow,
            )
        }
    };
    ($name:ident, $slot:path, $slow:path, aligned) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name(_size: usize, _align: usize) -> *mut c_void {
            core::arch::naked_asm!(
                "mov rax, qword ptr [rip + {slot}]",
                "cmp rax, 1",
                "jbe 2f",
                "cmp rdi, qword ptr [rip + {large_from}]",
                "jae 2f",
                "jmp rax",
                "2:",
                "mov rdx, qword ptr [rsp]",
                "push rdi",
                "push rsi",
                "sub rsp, 8",
                "call {slow}",
                "add rsp, 8",
                "pop rsi",
                "pop rdi",
                "test rax, rax",
                "je 3f",
                "ret",
                "3:",
                "jmp rdx",
                slot = sym $slot,
                large_from = sym crate::route::LARGE_FROM,
                slow = sym $slow,
            )
        }
    };
}

// `NextOp` keeps its address as its first field (repr(C)): the slot is the static itself, and
// holds 0 (unresolved) or 1 (missing) until there is an operator to jump to.
#[cfg(target_arch = "x86_64")]
throwing_new!(_Znwm, next::NEW, route::new_slow);
#[cfg(target_arch = "x86_64")]
throwing_new!(_Znam, next::NEW_ARRAY, route::new_array_slow);
#[cfg(target_arch = "x86_64")]
throwing_new!(_ZnwmSt11align_val_t, next::NEW_ALIGNED, route::new_aligned_slow, aligned);
#[cfg(target_arch = "x86_64")]
throwing_new!(_ZnamSt11align_val_t, next::NEW_ARRAY_ALIGNED, route::new_array_aligned_slow, aligned);

with_caller!(fn _ZnwmRKSt9nothrow_t(size: usize, tag: *const c_void) -> *mut c_void, "rdx" => new_nothrow);
with_caller!(fn _ZnamRKSt9nothrow_t(size: usize, tag: *const c_void) -> *mut c_void, "rdx" => new_array_nothrow);
with_caller!(fn _ZnwmSt11align_val_tRKSt9nothrow_t(size: usize, align: usize, tag: *const c_void) -> *mut c_void, "rcx" => new_aligned_nothrow);
with_caller!(fn _ZnamSt11align_val_tRKSt9nothrow_t(size: usize, align: usize, tag: *const c_void) -> *mut c_void, "rcx" => new_array_aligned_nothrow);

extern "C" fn new_nothrow(size: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    route::new_nothrow(&next::NEW_NOTHROW, size, tag, asker)
}

extern "C" fn new_array_nothrow(size: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    route::new_nothrow(&next::NEW_ARRAY_NOTHROW, size, tag, asker)
}

extern "C" fn new_aligned_nothrow(size: usize, align: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    route::new_aligned_nothrow(&next::NEW_ALIGNED_NOTHROW, size, align, tag, asker)
}

extern "C" fn new_array_aligned_nothrow(size: usize, align: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    route::new_aligned_nothrow(&next::NEW_ARRAY_ALIGNED_NOTHROW, size, align, tag, asker)
}

#[no_mangle]
pub extern "C" fn _ZdlPv(p: *mut c_void) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE, p, |f| f(p)) }
}

#[no_mangle]
pub extern "C" fn _ZdaPv(p: *mut c_void) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ARRAY, p, |f| f(p)) }
}

#[no_mangle]
pub extern "C" fn _ZdlPvm(p: *mut c_void, size: usize) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_SIZED, p, |f| f(p, size)) }
}

#[no_mangle]
pub extern "C" fn _ZdaPvm(p: *mut c_void, size: usize) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ARRAY_SIZED, p, |f| f(p, size)) }
}

#[no_mangle]
pub extern "C" fn _ZdlPvRKSt9nothrow_t(p: *mut c_void, tag: *const c_void) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_NOTHROW, p, |f| f(p, tag)) }
}

#[no_mangle]
pub extern "C" fn _ZdaPvRKSt9nothrow_t(p: *mut c_void, tag: *const c_void) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ARRAY_NOTHROW, p, |f| f(p, tag)) }
}

#[no_mangle]
pub extern "C" fn _ZdlPvSt11align_val_t(p: *mut c_void, align: usize) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ALIGNED, p, |f| f(p, align)) }
}

#[no_mangle]
pub extern "C" fn _ZdaPvSt11align_val_t(p: *mut c_void, align: usize) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ARRAY_ALIGNED, p, |f| f(p, align)) }
}

#[no_mangle]
pub extern "C" fn _ZdlPvmSt11align_val_t(p: *mut c_void, size: usize, align: usize) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_SIZED_ALIGNED, p, |f| f(p, size, align)) }
}

#[no_mangle]
pub extern "C" fn _ZdaPvmSt11align_val_t(p: *mut c_void, size: usize, align: usize) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ARRAY_SIZED_ALIGNED, p, |f| f(p, size, align)) }
}

#[no_mangle]
pub extern "C" fn _ZdlPvSt11align_val_tRKSt9nothrow_t(p: *mut c_void, align: usize, tag: *const c_void) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ALIGNED_NOTHROW, p, |f| f(p, align, tag)) }
}

#[no_mangle]
pub extern "C" fn _ZdaPvSt11align_val_tRKSt9nothrow_t(p: *mut c_void, align: usize, tag: *const c_void) {
    // SAFETY: the caller holds the C++ contract for p; the next operator of this form gets the
    // caller's arguments unchanged.
    unsafe { route::delete(&next::DELETE_ARRAY_ALIGNED_NOTHROW, p, |f| f(p, align, tag)) }
}
