//! Routing for C++ `operator new`/`delete`, as for malloc: a large request goes to the host layer;
//! a small one, and a large one it cannot serve, to the next allocator's own operator, whose
//! `new_handler` and `std::bad_alloc` the program expects (Rust cannot throw). delete gives our
//! pointers back to us and forwards the rest to the matching next operator. No next operator: the
//! malloc family's semantics, and a throwing new that fails aborts with one line.
//
// Note [Out of memory behind operator new]
// A large new we cannot map goes on to the next operator, which may serve it from its own free
// memory (Note [The next allocator's free memory] in room.rs): our failure is not the program's,
// so it is not reported as out of memory here. libstdc++'s operators come back through our
// malloc or aligned_alloc, which report it if nothing serves; another allocator's nothrow
// operator returning null is reported by us; another's throwing operator that throws is out of
// our sight (its std::bad_alloc is what the program sees).

use crate::record::holders::Asker;
use super::aligned_calls::aligned;
use super::{free_large, invalid_pointer, large_unreported, malloc, malloc_as, owner, plainly_foreign, refuse_interior, refuse_interior_slow, report_out_of_memory, small_below};
use super::{LARGE_FROM, MIN_ALIGN, PAGE};
use crate::host::registry::Owner;
use crate::sys::front::serves_the_process;
use crate::sys::next::{bootstrap_alloc, is_bootstrap};
use crate::sys::next_cxx::{NewAlignedNothrowFn, NewNothrowFn, NextOp};
use crate::state::HOST;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Set with the interior-pointer check on free's path (`arm_interior_check`): delete's fast path
/// then makes the same check before the next allocator's operator delete.
pub(super) static INTERIOR_CHECK: AtomicBool = AtomicBool::new(false);

/// What a throwing new's slow path hands its entry point (`shim::cxx`, in rax:rdx): the block we
/// served, or null and the operator to tail-jump to with the caller's arguments, so an exception
/// it throws never crosses a Rust frame (under panic = "abort" that would abort).
#[repr(C)]
pub(crate) struct NewOutcome {
    ptr: *mut c_void,
    next: usize,
}

/// The throwing forms' slow path: init not done, next operator not resolved, or a large request.
/// `fallback` (ours) stands in for a next operator the process does not have.
#[inline(always)]
fn throwing_new_slow<F: Copy>(op: &NextOp<F>, size: usize, align: usize, fallback: usize, asker: Asker) -> NewOutcome {
    if super::ready().is_none() {
        // Init under way (a call from another thread while dlsym runs): the arena, as malloc does.
        let ptr = bootstrap_alloc(size, align.max(MIN_ALIGN));
        return NewOutcome { ptr, next: fallback };
    }
    let next = match op.resolve() {
        // SAFETY: a function pointer read back as its address, for the entry point to jump to.
        Some(f) => unsafe { core::mem::transmute_copy::<F, usize>(&f) },
        None => fallback,
    };
    // Unreported: the next operator (or the fallback's malloc) has its go first (Note [Out of
    // memory behind operator new]). A form built on the program's own new is its alone (Note
    // [Operators the program replaced] in sys/next_cxx.rs).
    let ours = size >= LARGE_FROM.load(Relaxed) && align.is_power_of_two() && !op.forwards() && serves_the_process();
    let ptr = if ours { large_unreported(size, align.max(PAGE), asker) } else { core::ptr::null_mut() };
    if ptr.is_null() && next == fallback {
        return without_a_runtime(op, size, align, asker);
    }
    NewOutcome { ptr, next }
}

/// A throwing new in a process that had no C++ runtime when its operator was resolved: the
/// malloc family serves it; where that fails, a runtime loaded since (a plugin on the shared
/// libstdc++ after one with a static copy) runs the new_handler and throws, as it would have
/// with no us; with none still, one line and an abort (rather than NULL to a C++ caller).
#[cold]
#[inline(never)]
fn without_a_runtime<F: Copy>(op: &NextOp<F>, size: usize, align: usize, asker: Asker) -> NewOutcome {
    let ptr = match align {
        MIN_ALIGN => malloc_as(size, asker),
        a if a.is_power_of_two() => aligned(a, size, asker),
        _ => core::ptr::null_mut(),
    };
    if !ptr.is_null() {
        return NewOutcome { ptr, next: 0 };
    }
    match op.resolve_again() {
        // SAFETY: as in throwing_new_slow.
        Some(f) => NewOutcome { ptr, next: unsafe { core::mem::transmute_copy::<F, usize>(&f) } },
        None => NewOutcome { ptr, next: no_runtime_to_throw as *const () as usize },
    }
}

/// Both throwing forms' last word (the aligned form's second argument unread).
extern "C" fn no_runtime_to_throw(size: usize) -> *mut c_void {
    or_abort(core::ptr::null_mut(), size)
}

pub(crate) extern "C" fn new_slow(size: usize, asker: Asker) -> NewOutcome {
    throwing_new_slow(&crate::sys::next_cxx::NEW, size, MIN_ALIGN, new_or_abort as *const () as usize, asker)
}

pub(crate) extern "C" fn new_array_slow(size: usize, asker: Asker) -> NewOutcome {
    throwing_new_slow(&crate::sys::next_cxx::NEW_ARRAY, size, MIN_ALIGN, new_or_abort as *const () as usize, asker)
}

pub(crate) extern "C" fn new_aligned_slow(size: usize, align: usize, asker: Asker) -> NewOutcome {
    throwing_new_slow(&crate::sys::next_cxx::NEW_ALIGNED, size, align, new_aligned_or_abort as *const () as usize, asker)
}

pub(crate) extern "C" fn new_array_aligned_slow(size: usize, align: usize, asker: Asker) -> NewOutcome {
    throwing_new_slow(&crate::sys::next_cxx::NEW_ARRAY_ALIGNED, size, align, new_aligned_or_abort as *const () as usize, asker)
}

/// Throwing new in a process with no C++ runtime after us (nothing to throw with): malloc, and
/// abort rather than hand a C++ caller NULL.
extern "C" fn new_or_abort(size: usize) -> *mut c_void {
    or_abort(malloc(size), size)
}

extern "C" fn new_aligned_or_abort(size: usize, align: usize) -> *mut c_void {
    or_abort(if align.is_power_of_two() { aligned(align, size, Asker::UNKNOWN) } else { core::ptr::null_mut() }, size)
}

fn or_abort(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        crate::warn_line!("operator new({}): out of memory and no C++ runtime to throw std::bad_alloc; aborting", size);
        crate::sys::process::abort()
    }
    p
}

/// `operator new(size_t, const std::nothrow_t&)` and its array form.
#[inline(always)]
pub fn new_nothrow(op: &NextOp<NewNothrowFn>, size: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    if size < small_below() {
        if let Some(f) = op.get() {
            if op.is_plain() {
                // Note [libstdc++ shortcut]: its operator sees only a NULL of the next malloc.
                let p = malloc(size);
                if !p.is_null() {
                    return p;
                }
            }
            // SAFETY: the next allocator's own nothrow new, with the caller's arguments.
            return unsafe { f(size, tag) };
        }
    }
    new_nothrow_slow(op, size, tag, asker)
}

#[cold]
#[inline(never)]
fn new_nothrow_slow(op: &NextOp<NewNothrowFn>, size: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    if super::ready().is_none() {
        return bootstrap_alloc(size, MIN_ALIGN);
    }
    if let Some(f) = op.resolve().filter(|_| op.forwards()) {
        // SAFETY: as in new_nothrow (Note [Operators the program replaced]).
        return unsafe { f(size, tag) };
    }
    let large = size >= LARGE_FROM.load(Relaxed) && serves_the_process();
    if large {
        let p = large_unreported(size, PAGE, asker);
        if !p.is_null() {
            return p;
        }
    }
    match op.resolve() {
        Some(f) => {
            // SAFETY: as in new_nothrow; it returns NULL when it cannot serve either.
            let p = unsafe { f(size, tag) };
            if p.is_null() && large && !op.is_plain() {
                report_out_of_memory(size, PAGE);
            }
            p
        }
        None => malloc_as(size, asker),
    }
}

/// `operator new(size_t, std::align_val_t, const std::nothrow_t&)` and its array form.
#[inline(always)]
pub fn new_aligned_nothrow(op: &NextOp<NewAlignedNothrowFn>, size: usize, align: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    if size < small_below() {
        if let Some(f) = op.get() {
            // SAFETY: as in new_nothrow.
            return unsafe { f(size, align, tag) };
        }
    }
    new_aligned_nothrow_slow(op, size, align, tag, asker)
}

#[cold]
#[inline(never)]
fn new_aligned_nothrow_slow(op: &NextOp<NewAlignedNothrowFn>, size: usize, align: usize, tag: *const c_void, asker: Asker) -> *mut c_void {
    if super::ready().is_none() {
        return bootstrap_alloc(size, align.max(MIN_ALIGN));
    }
    if let Some(f) = op.resolve().filter(|_| op.forwards()) {
        // SAFETY: as in new_nothrow (Note [Operators the program replaced]).
        return unsafe { f(size, align, tag) };
    }
    let large = size >= LARGE_FROM.load(Relaxed) && align.is_power_of_two() && serves_the_process();
    if large {
        let p = large_unreported(size, align.max(PAGE), asker);
        if !p.is_null() {
            return p;
        }
    }
    match op.resolve() {
        Some(f) => {
            // SAFETY: as in new_nothrow.
            let p = unsafe { f(size, align, tag) };
            if p.is_null() && large && !op.is_plain() {
                report_out_of_memory(size, align.max(PAGE));
            }
            p
        }
        None if align.is_power_of_two() => aligned(align, size, asker),
        None => core::ptr::null_mut(),
    }
}

/// Every form of operator delete: `forward` calls the next operator of this form with the
/// caller's arguments. A pointer off a BLOCK_ALIGN boundary is not ours, as on free's path.
///
/// # Safety
/// `p` is null or came from operator new (or the malloc family) in this process.
#[inline(always)]
pub unsafe fn delete<F: Copy>(op: &NextOp<F>, p: *mut c_void, forward: impl FnOnce(F)) {
    if plainly_foreign(p) {
        if let Some(f) = op.get() {
            if op.is_plain() {
                // Note [libstdc++ shortcut]: its every delete is free (checked there when armed).
                return unsafe { super::free(p) };
            }
            // The program's own delete may take a pointer inside our block (its new added a
            // header): Note [Operators the program replaced].
            if INTERIOR_CHECK.load(Relaxed) && !op.forwards() {
                refuse_interior("free", p);
            }
            return forward(f);
        }
    }
    unsafe { delete_slow(op, p, forward) }
}

#[cold]
#[inline(never)]
unsafe fn delete_slow<F: Copy>(op: &NextOp<F>, p: *mut c_void, forward: impl FnOnce(F)) {
    // No init yet (or under way): nothing of the next allocator's can have reached the program
    // through us, as in free_foreign.
    if p.is_null() || is_bootstrap(p) || super::ready().is_none() {
        return;
    }
    if let Some(f) = op.resolve().filter(|_| op.forwards()) {
        // The program's delete frees what its new made (Note [Operators the program replaced]).
        return forward(f);
    }
    if HOST.may_contain(p as usize) {
        match owner(p) {
            Owner::Live { len } => return free_large(p, len),
            Owner::Cached => invalid_pointer("free", p),
            Owner::Foreign => refuse_interior_slow("free", p),
        }
    }
    match op.resolve() {
        Some(f) if !op.is_plain() => forward(f),
        // SAFETY: not ours: the next allocator's free, through free's own routing (libstdc++'s
        // operator, or none).
        _ => unsafe { super::free(p) },
    }
}
