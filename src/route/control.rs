//! glibc's control calls, answered for the blocks we hold as glibc answers for its mmapped ones,
//! then passed on to the next allocator (which holds the small blocks): `malloc_trim` gives the
//! cache back; `mallopt` honours the options that concern large blocks in the sense their users
//! mean them (docs/host.md, "glibc's malloc controls"):
//! - M_MMAP_THRESHOLD: requests of at least that many bytes are ours (our threshold);
//! - M_TRIM_THRESHOLD: the most freed memory kept for reuse (the cache's byte bound; a
//!   negative value, glibc's "never trim", lifts the bound);
//! - M_MMAP_MAX = 0: no large block of ours any more: every request goes to the next allocator,
//!   which serves it as glibc does under that setting (from its heap); a later nonzero value
//!   turns the cache back on;
//! - M_PERTURB nonzero: likewise, so that glibc perturbs every block; 0 turns it back on.

use super::{ready, set_enabled};
use crate::sys::next::{M_MMAP_MAX, M_MMAP_THRESHOLD, M_PERTURB, M_TRIM_THRESHOLD};
use crate::state::HOST;
use core::ffi::c_int;
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Our smallest threshold (TENSORMALLOC_THRESHOLD's floor).
const THRESHOLD_MIN: usize = 4 << 10;

/// Why mallopt turned the cache off: M_MMAP_MAX = 0, M_PERTURB nonzero, a bit each; the cache
/// comes back on when the last of them is taken back (and only then: one mallopt did not turn
/// it off leaves it as it is). Changed under OFF_LOCK.
static OFF_BY_MALLOPT: AtomicU8 = AtomicU8::new(0);
static OFF_LOCK: crate::sys::lock::Lock<()> = crate::sys::lock::Lock::new(());
const OFF_MMAP_MAX: u8 = 1;
const OFF_PERTURB: u8 = 2;

/// mallopt asked the cache off (`off`) or back on for `reason`.
fn mallopt_turns(reason: u8, off: bool) {
    let _one = OFF_LOCK.lock();
    let was = OFF_BY_MALLOPT.load(Relaxed);
    if off {
        // Counted only when mallopt turned it off or keeps it off (not TENSORMALLOC_DISABLE's).
        if was != 0 || set_enabled(false, true) {
            OFF_BY_MALLOPT.store(was | reason, Relaxed);
        }
    } else if was & reason != 0 {
        OFF_BY_MALLOPT.store(was & !reason, Relaxed);
        if was == reason {
            set_enabled(true, true);
        }
    }
}

/// malloc_trim: the cache given back, then the next allocator's trim. 1 when memory was
/// released, as glibc answers.
pub fn malloc_trim(pad: usize) -> c_int {
    let Some(g) = ready() else { return 0 };
    let released = HOST.trim_now();
    // SAFETY: plain forwarding.
    let next = g.next.control.malloc_trim.map_or(0, |trim| unsafe { trim(pad) });
    c_int::from(released > 0 || next != 0)
}

/// mallopt: the large-block options honoured as the module says, every option passed on. The
/// next allocator's answer (1 success, 0 refused); 1 for ours when it has no mallopt.
pub fn mallopt(param: c_int, value: c_int) -> c_int {
    let Some(g) = ready() else { return 0 };
    super::glibc_slide::before_program_mallopt(param, value);
    // SAFETY: plain forwarding.
    let answer = g.next.control.mallopt.map_or(1, |f| unsafe { f(param, value) });
    // Note [Memory debuggers] (state.rs): glibc perturbs every block (any nonzero value, negative
    // too), so none is ours.
    if param == M_PERTURB && answer == 1 {
        mallopt_turns(OFF_PERTURB, value != 0);
        return answer;
    }
    // glibc reads M_TRIM_THRESHOLD's value as a size_t: -1 is "never trim", keep everything.
    if param == M_TRIM_THRESHOLD && answer == 1 && value < 0 {
        HOST.set_cache_bytes(usize::MAX);
        return answer;
    }
    let Ok(bytes) = usize::try_from(value) else { return answer };
    match param {
        // As far as the next allocator took it (glibc refuses values past its heap's half).
        M_MMAP_THRESHOLD if answer == 1 => {
            HOST.set_threshold_bytes(bytes.max(THRESHOLD_MIN));
            if HOST.is_enabled() {
                set_enabled(true, true);
            }
        }
        M_TRIM_THRESHOLD => HOST.set_cache_bytes(bytes),
        M_MMAP_MAX => mallopt_turns(OFF_MMAP_MAX, bytes == 0),
        _ => {}
    }
    answer
}

// Note [Calls through a library's handle]
// A program may reach libc by name rather than by symbol: `ctypes.CDLL("libc.so.6").free`,
// `dlsym(dlopen("libc.so.6"), "free")`. glibc's dlsym answers with libc's own definition, past
// us: a large block of ours freed that way crashed, realloc and malloc_usable_size read it as
// glibc's, and an mprotect made that way went unseen, so the block came back read-only. So a
// lookup through a library's handle of a name we define (the malloc family, glibc's control
// calls, the page calls, the limits and thread calls) answers with ours when the handle's
// definition is the one ours stands in front of, as a lookup by symbol already does, or is the
// C library's own (a second copy of ours, or a tracer, between us and libc: two copies
// preloaded, as a launcher prepending its own to the user's makes, handed out glibc's mprotect
// and free past both). dlsym and dlclose are ours only by symbol; C++ operators and CUDA names
// have their own rules.
// The exception is a hook behind us that finds "the real one" this way: a library preloaded
// after us that defines mmap (or malloc) and looks up libc's through libc's handle. Ours would
// call the next definition, the hook's, which would call ours again, until the stack ran out
// (SIGSEGV, even under TENSORMALLOC_DISABLE; the glibc-tools hunter). A caller whose own object
// defines the name, where the process's definition lies elsewhere (it stands behind someone),
// gets glibc's answer.

/// `dlsym(handle, name)` through a library's handle (Note [Calls through a library's handle]):
/// ours when the handle reaches the very definition our next one is, or the C library's; None
/// to let glibc's dlsym answer (another object's, RTLD_NEXT, RTLD_DEFAULT, a name we do not
/// define); None too for `caller` (dlsym's return address) in a hook behind us.
pub fn served_symbol(handle: *mut core::ffi::c_void, name: &core::ffi::CStr, real_dlsym: crate::sys::dlsym::DlsymFn, caller: usize) -> Option<*mut core::ffi::c_void> {
    if handle.is_null() || handle == libc::RTLD_NEXT || handle == libc::RTLD_DEFAULT || ready().is_none() {
        return None;
    }
    let bytes = name.to_bytes();
    if bytes.starts_with(b"_Z") || bytes.starts_with(b"cu") || bytes == b"dlsym" || bytes == b"dlclose" {
        return None;
    }
    // SAFETY: after init (checked above).
    let ours = unsafe { crate::sys::dlsym::own_definition(name) };
    if ours.is_null() {
        return None;
    }
    // SAFETY: glibc's dlsym with the caller's handle and name.
    let found = unsafe { real_dlsym(handle, name.as_ptr()) };
    // SAFETY: a lookup of the next definition, allocation-free.
    let next = unsafe { crate::sys::dlsym::next_definition(name) };
    let stands_for_ours = !found.is_null() && (found == next || crate::sys::dlsym::in_c_library(found as usize));
    (stands_for_ours && !crate::sys::dlsym::interposer_behind(caller, name)).then_some(ours)
}
