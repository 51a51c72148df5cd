//! dlclose, so that an unloaded object's blocks keep its name (route/objects.rs).

use core::ffi::{c_int, c_void};

#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    // SAFETY: the caller's contract is dlclose's.
    unsafe { crate::route::objects::dlclose(handle) }
}
