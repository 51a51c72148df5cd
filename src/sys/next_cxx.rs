//! The next C++ `operator new`/`delete` of each form (jemalloc's, tcmalloc's or mimalloc's when
//! preloaded after us, libstdc++'s otherwise), found lazily by mangled name. Each is resolved at
//! most a few times (threads racing store the same answer), never to ourselves, and never under a
//! lock of ours: dlsym may call malloc, which is us.

use core::ffi::{c_void, CStr};
use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub type NewFn = unsafe extern "C" fn(usize) -> *mut c_void;
/// `operator new(size_t, const std::nothrow_t&)`; the tag is a pointer.
pub type NewNothrowFn = unsafe extern "C" fn(usize, *const c_void) -> *mut c_void;
/// `operator new(size_t, std::align_val_t)`; `align_val_t` is a `size_t` enum.
pub type NewAlignedFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub type NewAlignedNothrowFn = unsafe extern "C" fn(usize, usize, *const c_void) -> *mut c_void;
pub type DeleteFn = unsafe extern "C" fn(*mut c_void);
/// Sized (`size_t`) or aligned (`align_val_t`) delete: both a pointer and a word.
pub type DeleteWordFn = unsafe extern "C" fn(*mut c_void, usize);
pub type DeleteNothrowFn = unsafe extern "C" fn(*mut c_void, *const c_void);
pub type DeleteSizedAlignedFn = unsafe extern "C" fn(*mut c_void, usize, usize);
pub type DeleteAlignedNothrowFn = unsafe extern "C" fn(*mut c_void, usize, *const c_void);

const UNRESOLVED: usize = 0;
/// Resolved, and there is no next definition (or only our own): the caller falls back to the
/// malloc family.
const MISSING: usize = 1;

/// One operator of the next allocator. `addr` is the first field (and `plain` at PLAIN_OFFSET)
/// so the naked entry points in `shim::cxx` can load them at the static's address.
#[repr(C)]
pub struct NextOp<F> {
    addr: AtomicUsize,
    /// The operator is libstdc++'s: new is the next malloc with a new_handler loop around a
    /// NULL, every delete is the next free (Note [libstdc++ shortcut]). Set before `addr`.
    plain: AtomicBool,
    /// The program replaced an operator this form is defined by (Note [Operators the program
    /// replaced]): every call goes to the next operator as it is. Set before `addr`.
    forwards: AtomicBool,
    name: &'static CStr,
    /// The operators libstdc++'s definition of this form calls (through the PLT, so whatever
    /// the program defines under those names).
    bases: &'static [&'static CStr],
    _sig: PhantomData<F>,
}

/// Where `plain` lies in every `NextOp`, for the naked entry points.
pub const PLAIN_OFFSET: usize = core::mem::offset_of!(NextOp<NewFn>, plain);
const _: () = assert!(core::mem::offset_of!(NextOp<NewFn>, addr) == 0);

// SAFETY: the only state is atomics; F is a function pointer type used as a marker.
unsafe impl<F> Sync for NextOp<F> {}

impl<F: Copy> NextOp<F> {
    const fn new(name: &'static CStr, bases: &'static [&'static CStr]) -> Self {
        NextOp { addr: AtomicUsize::new(UNRESOLVED), plain: AtomicBool::new(false), forwards: AtomicBool::new(false), name, bases, _sig: PhantomData }
    }

    /// The next operator once resolved, with one load: `None` when not resolved yet or missing.
    #[inline(always)]
    pub fn get(&self) -> Option<F> {
        let a = self.addr.load(Ordering::Acquire);
        if a > MISSING {
            // SAFETY: only `resolve` stores a value above MISSING: the address of a function
            // with this signature (F is the signature named beside the mangled name below).
            Some(unsafe { core::mem::transmute_copy::<usize, F>(&a) })
        } else {
            None
        }
    }

    /// Resolves (once; later calls read the stored answer): `None` when the process has no next
    /// definition of this operator. Call only after init (dlsym may allocate).
    #[cold]
    #[inline(never)]
    pub fn resolve(&self) -> Option<F> {
        if self.addr.load(Ordering::Acquire) == UNRESOLVED {
            let replaced_base = self.bases.iter().any(|&base| replaced(base));
            let replaced_behind = !replaced_base && self.bases.iter().any(|&base| replaced_behind_us(base));
            // SAFETY: a C string constant; dlsym/dlopen/dladdr are safe to call after init.
            let a = unsafe { if replaced_base { find_in_cxx_runtime(self.name) } else { find(self.name) } };
            let (found, ours, plain) = match super::dlsym::object_of(a as usize) {
                Some(lib) => (true, lib.0 == own_library().0, is_libstdcxx(lib)),
                None => (!a.is_null(), false, false),
            };
            let forwards = found && !ours && (replaced_base || replaced_behind || super::front::malloc_in_front());
            self.forwards.store(forwards, Ordering::Relaxed);
            self.plain.store(plain && found && !ours && !forwards, Ordering::Relaxed);
            self.addr.store(if !found || ours { MISSING } else { a as usize }, Ordering::Release);
        }
        self.get()
    }

    /// Resolves again an operator the process had no definition of: a C++ runtime may have been
    /// loaded since (a C program's plugin built with a static libstdc++, then one on the shared
    /// one). Only where serving without it failed: the look costs the loader's locks.
    #[cold]
    #[inline(never)]
    pub fn resolve_again(&self) -> Option<F> {
        let _ = self.addr.compare_exchange(MISSING, UNRESOLVED, Ordering::AcqRel, Ordering::Acquire);
        self.resolve()
    }

    /// The resolved operator is libstdc++'s (read after `get` returned it).
    #[inline(always)]
    pub fn is_plain(&self) -> bool {
        self.plain.load(Ordering::Relaxed)
    }

    /// Every call goes on to the resolved operator unchanged (read after `resolve` returned it):
    /// Note [Operators the program replaced].
    #[inline(always)]
    pub fn forwards(&self) -> bool {
        self.forwards.load(Ordering::Relaxed)
    }
}

// Note [Operators the program replaced]
// A program may replace operator new and delete with its own (a leak counter, a pool, a header
// before each block) by defining only the base forms, `operator new(size_t)` and `operator
// delete(void*)`; the standard makes the other forms call them, and libstdc++'s do, through the
// PLT. The program's definitions come first in the lookup scope, but the forms it did not define
// came to us, which served them ourselves: a sized delete freed the program's pointer with free
// (past the program's delete, and an abort where its new had added a header), and a large new[]
// never reached its new. So when the definition the process uses for a base form (RTLD_DEFAULT)
// is not ours, each form built on it goes on to the next definition unchanged (libstdc++'s, which
// calls the program's): no shortcut, no large block of ours, no delete of ours. The next is the
// C++ runtime's even with jemalloc, tcmalloc or mimalloc preloaded after us: theirs would free
// the program's pointers themselves too.
// A library behind us may replace them too (linked by the program, or preloaded after us: a leak
// counter layered over tensormalloc): its definitions are the next ones, not the process's. Its
// base forms are then called as they are, and every form built on them goes on to the next
// definition of its own (the library's, or libstdc++'s, which calls the base through the PLT, so
// us, so the library's): a sized or array delete handed straight to free, as libstdc++'s
// shortcut would, freed the library's pointers past its header (`free(): invalid pointer`), and
// a large block served by us under a delete of its own was refused as an interior pointer. Such a
// library is told from an allocator (jemalloc, tcmalloc, mimalloc, whose operators we call as
// they are while serving large requests ourselves) by the malloc it does not define, and from a
// C++ runtime linked in statically by the std::set_new_handler it does not define.
// An allocator or tracer in front of us that lacks the operators (glibc's memusage, a
// heaptrack-style tracer) sees C++ allocations only through libstdc++'s operators calling malloc
// and free, which reach it first: every form then goes on unchanged too. The shortcut's free
// handed its blocks, offset by its header, to glibc's free (`munmap_chunk(): invalid pointer`),
// and it saw 3 of 1,502 of the program's news (the glibc-tools hunter).

/// Whether the process's definition of operator `base` is not ours: the program (or a library
/// ahead of us) replaced it.
fn replaced(base: &CStr) -> bool {
    // SAFETY: a C string constant; RTLD_DEFAULT searches the global scope, as the PLT does.
    let a = unsafe { libc::dlsym(libc::RTLD_DEFAULT, base.as_ptr()) };
    match super::dlsym::object_of(a as usize) {
        Some(lib) => lib.0 != own_library().0,
        None => !a.is_null(),
    }
}

/// Whether the next definition of operator `base` (RTLD_NEXT) is a library's replacement: not
/// ours, not a C++ runtime's (shared or linked in), in an object that defines no malloc.
fn replaced_behind_us(base: &CStr) -> bool {
    // SAFETY: a C string constant; RTLD_NEXT searches the scope after us.
    let a = unsafe { libc::dlsym(libc::RTLD_NEXT, base.as_ptr()) };
    match super::dlsym::object_of(a as usize) {
        Some(lib) => lib.0 != own_library().0 && !is_cxx_runtime(lib) && !defines(lib, c"malloc") && !defines(lib, c"_ZSt15set_new_handlerPFvvE"),
        None => false,
    }
}

/// Whether the loaded object `lib` itself defines `name`: malloc for an allocator,
/// std::set_new_handler for a copy of the C++ runtime linked in (-static-libstdc++). Unknown
/// (no handle): as if it did.
fn defines(lib: (usize, &'static CStr), name: &CStr) -> bool {
    super::dlsym::defines_itself(lib, name).unwrap_or(true)
}

// Note [libstdc++ shortcut]
// libstdc++'s operators are thin: `new` is `while (!(p = malloc(n))) { new_handler or throw }`,
// `new[]` calls `new` and every `delete` form ends in `free`, each through the PLT, so through
// us again. Alone under the preload a small `delete[]`+`new[]` pair crossed our entry points
// four times (+30 instructions a pair over the preload without operator new, callgrind). When the
// next operator is libstdc++'s, a small new calls the next malloc itself and hands only a NULL
// to libstdc++'s operator (which retries, runs the new_handler, throws), and a delete is free:
// the same outcome with one crossing. Other allocators' operators are always called as they are.

/// RTLD_NEXT: jemalloc, tcmalloc or mimalloc when preloaded after us, else libstdc++. A C++
/// runtime that a `dlopen(RTLD_LOCAL)` brought in (a Python extension's libstdc++) is outside the
/// scope RTLD_NEXT searches: then the copy already loaded, by handle, never loading one.
unsafe fn find(name: &CStr) -> *mut c_void {
    let a = libc::dlsym(libc::RTLD_NEXT, name.as_ptr());
    if !a.is_null() {
        return a;
    }
    find_in_cxx_runtime(name)
}

/// The C++ runtime's own definition, whatever is preloaded after us: the copy already loaded,
/// by handle, never loading one.
unsafe fn find_in_cxx_runtime(name: &CStr) -> *mut c_void {
    [c"libstdc++.so.6", c"libc++.so.1"].into_iter().find_map(|lib| super::dlsym::lookup_in_loaded(lib, name).filter(|a| !a.is_null())).unwrap_or(core::ptr::null_mut())
}


/// This library: an operator found there (a program linking us twice, or a loader quirk)
/// would loop.
fn own_library() -> (usize, &'static CStr) {
    static ANCHOR: u8 = 0;
    super::dlsym::object_of(core::ptr::addr_of!(ANCHOR) as usize).unwrap_or((0, c""))
}

fn is_libstdcxx((_, path): (usize, &'static CStr)) -> bool {
    path.to_bytes().windows(b"libstdc++.so".len()).any(|w| w == b"libstdc++.so")
}

/// libstdc++, or LLVM's libc++ and libc++abi: operators that call malloc, never a replacement.
fn is_cxx_runtime(lib: (usize, &'static CStr)) -> bool {
    let contains = |name: &[u8]| lib.1.to_bytes().windows(name.len()).any(|w| w == name);
    is_libstdcxx(lib) || contains(b"libc++.so") || contains(b"libc++abi.so")
}

// The forms, by mangled name (checked with `nm -D --defined-only` against libstdc++.so.6,
// libjemalloc.so.2, libtcmalloc_minimal.so.4 and libmimalloc.so.2; mimalloc lacks the nothrow
// deletes, which then resolve to libstdc++'s, which call free).
pub(crate) static NEW: NextOp<NewFn> = NextOp::new(c"_Znwm", &[c"_Znwm"]);
pub(crate) static NEW_ARRAY: NextOp<NewFn> = NextOp::new(c"_Znam", &[c"_Znwm", c"_Znam"]);
pub(crate) static NEW_NOTHROW: NextOp<NewNothrowFn> = NextOp::new(c"_ZnwmRKSt9nothrow_t", &[c"_Znwm"]);
pub(crate) static NEW_ARRAY_NOTHROW: NextOp<NewNothrowFn> = NextOp::new(c"_ZnamRKSt9nothrow_t", &[c"_Znwm", c"_Znam"]);
pub(crate) static NEW_ALIGNED: NextOp<NewAlignedFn> = NextOp::new(c"_ZnwmSt11align_val_t", &[c"_ZnwmSt11align_val_t"]);
pub(crate) static NEW_ARRAY_ALIGNED: NextOp<NewAlignedFn> = NextOp::new(c"_ZnamSt11align_val_t", &[c"_ZnwmSt11align_val_t", c"_ZnamSt11align_val_t"]);
pub(crate) static NEW_ALIGNED_NOTHROW: NextOp<NewAlignedNothrowFn> = NextOp::new(c"_ZnwmSt11align_val_tRKSt9nothrow_t", &[c"_ZnwmSt11align_val_t"]);
pub(crate) static NEW_ARRAY_ALIGNED_NOTHROW: NextOp<NewAlignedNothrowFn> = NextOp::new(c"_ZnamSt11align_val_tRKSt9nothrow_t", &[c"_ZnwmSt11align_val_t", c"_ZnamSt11align_val_t"]);

pub(crate) static DELETE: NextOp<DeleteFn> = NextOp::new(c"_ZdlPv", &[c"_ZdlPv"]);
pub(crate) static DELETE_ARRAY: NextOp<DeleteFn> = NextOp::new(c"_ZdaPv", &[c"_ZdlPv", c"_ZdaPv"]);
pub(crate) static DELETE_SIZED: NextOp<DeleteWordFn> = NextOp::new(c"_ZdlPvm", &[c"_ZdlPv"]);
pub(crate) static DELETE_ARRAY_SIZED: NextOp<DeleteWordFn> = NextOp::new(c"_ZdaPvm", &[c"_ZdlPv", c"_ZdaPv"]);
pub(crate) static DELETE_NOTHROW: NextOp<DeleteNothrowFn> = NextOp::new(c"_ZdlPvRKSt9nothrow_t", &[c"_ZdlPv"]);
pub(crate) static DELETE_ARRAY_NOTHROW: NextOp<DeleteNothrowFn> = NextOp::new(c"_ZdaPvRKSt9nothrow_t", &[c"_ZdlPv", c"_ZdaPv"]);
pub(crate) static DELETE_ALIGNED: NextOp<DeleteWordFn> = NextOp::new(c"_ZdlPvSt11align_val_t", &[c"_ZdlPvSt11align_val_t"]);
pub(crate) static DELETE_ARRAY_ALIGNED: NextOp<DeleteWordFn> = NextOp::new(c"_ZdaPvSt11align_val_t", &[c"_ZdlPvSt11align_val_t", c"_ZdaPvSt11align_val_t"]);
pub(crate) static DELETE_SIZED_ALIGNED: NextOp<DeleteSizedAlignedFn> = NextOp::new(c"_ZdlPvmSt11align_val_t", &[c"_ZdlPvSt11align_val_t"]);
pub(crate) static DELETE_ARRAY_SIZED_ALIGNED: NextOp<DeleteSizedAlignedFn> = NextOp::new(c"_ZdaPvmSt11align_val_t", &[c"_ZdlPvSt11align_val_t", c"_ZdaPvSt11align_val_t"]);
pub(crate) static DELETE_ALIGNED_NOTHROW: NextOp<DeleteAlignedNothrowFn> = NextOp::new(c"_ZdlPvSt11align_val_tRKSt9nothrow_t", &[c"_ZdlPvSt11align_val_t"]);
pub(crate) static DELETE_ARRAY_ALIGNED_NOTHROW: NextOp<DeleteAlignedNothrowFn> = NextOp::new(c"_ZdaPvSt11align_val_tRKSt9nothrow_t", &[c"_ZdlPvSt11align_val_t", c"_ZdaPvSt11align_val_t"]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_no_library_defines_resolves_to_missing_once() {
        static NOWHERE: NextOp<NewFn> = NextOp::new(c"_Znwm_tensormalloc_test_nowhere", &[]);
        assert!(NOWHERE.get().is_none());
        assert!(NOWHERE.resolve().is_none());
        assert_eq!(NOWHERE.addr.load(Ordering::Relaxed), MISSING, "remembered, not looked up again");
    }

    #[test]
    fn the_next_definition_is_found_and_is_not_ours() {
        // The test binary defines no malloc: RTLD_NEXT finds libc's.
        static MALLOC: NextOp<NewFn> = NextOp::new(c"malloc", &[]);
        let f = MALLOC.resolve().expect("libc's malloc");
        assert_ne!(crate::sys::dlsym::object_of(f as *const () as usize).unwrap().0, own_library().0);
        assert!(MALLOC.get().is_some() && !MALLOC.is_plain(), "libc is not libstdc++");
        // SAFETY: malloc and free with their C signatures.
        unsafe { libc::free(f(64)) };
        let ours = crate::sys::dlsym::object_of(own_library as *const () as usize).unwrap();
        assert_eq!(ours.0, own_library().0, "our own code is recognized, so it is never called as next");
        assert!(!is_libstdcxx(ours));
        assert!(is_libstdcxx((0, c"/usr/lib/x86_64-linux-gnu/libstdc++.so.6")));
    }
}
