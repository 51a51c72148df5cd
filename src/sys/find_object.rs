//! Which loaded object holds an address, by glibc's `_dl_find_object` (2.35 and later: lock-free,
//! a binary search, no allocation, safe on allocation paths). Resolved once at init
//! (`sys::caller::init`); before that, or on an older glibc, it says nothing and callers ask
//! dladdr.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicUsize, Ordering::{Acquire, Release}};

/// glibc's `struct dl_find_object`, with room to spare for fields later versions append.
#[repr(C)]
pub struct DlFindObject {
    flags: u64,
    pub map_start: *mut c_void,
    map_end: *mut c_void,
    pub link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 16],
}

type FindObjectFn = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

const UNRESOLVED: usize = 0;
const ABSENT: usize = 1;
static FIND_OBJECT: AtomicUsize = AtomicUsize::new(UNRESOLVED);

/// `_dl_find_object`'s address as dlsym found it (0: glibc has none).
pub fn set(addr: usize) {
    FIND_OBJECT.store(if addr == 0 { ABSENT } else { addr }, Release);
}

/// Whether it was resolved (false before init, and on a glibc without it).
pub fn available() -> bool {
    let f = FIND_OBJECT.load(Acquire);
    f != UNRESOLVED && f != ABSENT
}

/// What `_dl_find_object` says of `addr`; `None` when it lies in no loaded object or glibc is
/// too old to say.
pub fn find_object(addr: usize) -> Option<DlFindObject> {
    if !available() {
        return None;
    }
    // SAFETY: FIND_OBJECT holds _dl_find_object (set once by init).
    let find = unsafe { core::mem::transmute::<usize, FindObjectFn>(FIND_OBJECT.load(Acquire)) };
    // SAFETY: an all-zero struct of plain fields and pointers is valid.
    let mut found: DlFindObject = unsafe { core::mem::zeroed() };
    // SAFETY: any address may be asked; the struct is ours and large enough.
    (unsafe { find(addr as *mut c_void, &mut found) } == 0).then_some(found)
}

/// The object holding `addr`: where its mapping starts, and the loader's name for it (empty for
/// the main program); None when it lies in no loaded object or glibc is too old to say (then
/// ask dladdr).
pub fn loaded_object(addr: usize) -> Option<(usize, &'static CStr)> {
    let found = find_object(addr)?;
    if found.link_map.is_null() {
        return None;
    }
    // SAFETY: a `struct link_map` begins with l_addr and l_name (link.h, the public part); the
    // loader's name lives as long as the object.
    let name = unsafe { *(found.link_map as *const *const c_char).add(1) };
    // SAFETY: as above; a non-null name is NUL-terminated.
    Some((found.map_start as usize, if name.is_null() { c"" } else { unsafe { CStr::from_ptr(name) } }))
}
