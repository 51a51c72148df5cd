//! The program's shared objects: a dlclose that unloads an object retires it as a holder (Note
//! [Holders]), so its blocks keep its name and an object loaded at its address later is counted
//! apart.

use crate::record::holders;
use crate::sys::caller;
use core::ffi::{c_int, c_void};

/// # Safety
/// As dlclose.
pub unsafe fn dlclose(handle: *mut c_void) -> c_int {
    // SAFETY: the caller's handle, as dlclose takes it.
    let object = unsafe { caller::handle_object(handle) };
    let mut name = [0u8; crate::record::holders::RETIRED_NAME_BYTES];
    let mut len = 0;
    if let Some((start, _)) = object {
        caller::names(start, |found| {
            if let Some((path, _)) = found {
                let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
                len = base.len().min(name.len());
                if let (Some(d), Some(s)) = (name.get_mut(..len), base.get(..len)) {
                    d.copy_from_slice(s);
                }
            }
        });
    }
    // SAFETY: the caller's contract.
    let answer = unsafe { caller::next_dlclose(handle) };
    if let Some((start, inside)) = object {
        // Still loaded (other handles hold it) when its address still lies in it.
        if answer == 0 && caller::object_start(inside) != Some(start) {
            // A block the object freed into a thread's slot is no longer its (Note [A thread's
            // own slot]): a row holding nothing else is freed, not kept as "unloaded". Not from
            // inside our own work (a library's fork handler unloading one while the fork holds
            // the cache lock): the row is then kept, as for a block the object still holds.
            if !crate::sys::lock::held_here() {
                crate::state::HOST.settle_slots();
            }
            if let Some(h) = holders::table() {
                h.retire(start as u64, name.get(..len).unwrap_or(&[]));
            }
        }
    }
    answer
}
