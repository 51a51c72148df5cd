//! The real `dlsym`, behind the one we export (`shim::dlsym`) so that a program or runtime that
//! takes libcuda's entry points by name gets ours. Found with `dlvsym`, which we do not
//! interpose: glibc 2.34 and later version it GLIBC_2.34, older ones GLIBC_2.2.5 (libdl). Our
//! export tail-jumps here for every symbol it does not serve, so the caller's return address,
//! which `RTLD_NEXT` is relative to, stays the caller's.

use core::ffi::{c_char, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Where the exported `dlsym` jumps: glibc's, once `resolve` has run; before that a stand-in
/// that answers "not found" (never reached: `resolve` runs before the first jump).
pub static REAL_DLSYM: AtomicPtr<()> = AtomicPtr::new(unresolved as *mut ());

unsafe extern "C" fn unresolved(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::ptr::null_mut()
}

/// glibc's dlsym, resolved on first use. `ours` is our exported dlsym, never taken for the real.
pub fn resolve(ours: *const ()) -> DlsymFn {
    let current = REAL_DLSYM.load(Ordering::Acquire);
    if current != unresolved as *mut () {
        // SAFETY: only ever set to a dlsym of glibc's, a function of this type.
        return unsafe { core::mem::transmute::<*mut (), DlsymFn>(current) };
    }
    let mut found: *mut c_void = core::ptr::null_mut();
    'search: for handle in [libc::RTLD_NEXT, libc::RTLD_DEFAULT] {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: valid C strings; dlvsym is not interposed, so this cannot recurse.
            let p = unsafe { libc::dlvsym(handle, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() && p as *const () != ours {
                found = p;
                break 'search;
            }
        }
    }
    if found.is_null() {
        // SAFETY: as above.
        return unresolved;
    }
    REAL_DLSYM.store(found.cast(), Ordering::Release);
    // SAFETY: glibc's dlsym.
    unsafe { core::mem::transmute::<*mut c_void, DlsymFn>(found) }
}
