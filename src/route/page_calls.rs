//! The program's page calls: each marks the live blocks of ours its range touches (Note [Pages
//! the program changed] in host/host_layer.rs) before the kernel hears of it; the limit calls
//! let the cache follow a new address-space limit (Note [Room for others]).

use crate::host::registry::PageChange;
use crate::state::HOST;
use crate::sys::page_calls as kernel;
use core::ffi::{c_int, c_void};

/// Advice after which a block is still plain memory: contents (DONTNEED, FREE, REMOVE refused
/// on private memory), paging and huge-page hints, and the advice that undoes the changes.
/// Anything else, known or not, marks the block.
fn advice_keeps_plain(advice: c_int) -> bool {
    const COLD: c_int = 20;
    const PAGEOUT: c_int = 21;
    const POPULATE_READ: c_int = 22;
    const POPULATE_WRITE: c_int = 23;
    const DONTNEED_LOCKED: c_int = 24;
    const COLLAPSE: c_int = 25;
    const GUARD_REMOVE: c_int = 103;
    matches!(
        advice,
        libc::MADV_NORMAL
            | libc::MADV_RANDOM
            | libc::MADV_SEQUENTIAL
            | libc::MADV_WILLNEED
            | libc::MADV_DONTNEED
            | libc::MADV_FREE
            | libc::MADV_DOFORK
            | libc::MADV_KEEPONFORK
            | libc::MADV_DODUMP
            | libc::MADV_HUGEPAGE
            | libc::MADV_NOHUGEPAGE
            | libc::MADV_MERGEABLE
            | libc::MADV_UNMERGEABLE
            | COLD
            | PAGEOUT
            | POPULATE_READ
            | POPULATE_WRITE
            | DONTNEED_LOCKED
            | COLLAPSE
            | GUARD_REMOVE
    )
}

/// # Safety
/// As libc's `mmap`.
pub unsafe fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: libc::off_t) -> *mut c_void {
    if flags & libc::MAP_FIXED != 0 {
        HOST.note_page_change(addr as usize, len, PageChange::Replaced);
    }
    // SAFETY: the caller's contract.
    unsafe { kernel::mmap(addr, len, prot, flags, fd, offset) }
}

/// # Safety
/// As libc's `munmap`.
pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Replaced);
    // SAFETY: the caller's contract.
    unsafe { kernel::munmap(addr, len) }
}

/// # Safety
/// As libc's `mremap`; `new_addr` is read only under MREMAP_FIXED.
pub unsafe fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    HOST.note_page_change(old as usize, old_len.max(new_len), PageChange::Replaced);
    if flags & libc::MREMAP_FIXED != 0 {
        HOST.note_page_change(new_addr as usize, new_len, PageChange::Replaced);
    }
    // SAFETY: the caller's contract.
    unsafe { kernel::mremap(old, old_len, new_len, flags, new_addr) }
}

/// # Safety
/// As libc's `mprotect`.
pub unsafe fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Changed);
    // SAFETY: the caller's contract.
    unsafe { kernel::mprotect(addr, len, prot) }
}

/// # Safety
/// As libc's `pkey_mprotect`.
pub unsafe fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, key: c_int) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Changed);
    // SAFETY: the caller's contract.
    unsafe { kernel::pkey_mprotect(addr, len, prot, key) }
}

/// # Safety
/// As libc's `madvise`.
pub unsafe fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    if advice == libc::MADV_DONTFORK {
        HOST.note_page_change(addr as usize, len, PageChange::KeptFromChildren);
    } else if !advice_keeps_plain(advice) {
        HOST.note_page_change(addr as usize, len, PageChange::Changed);
    }
    // SAFETY: the caller's contract.
    unsafe { kernel::madvise(addr, len, advice) }
}

pub fn mlock(addr: *const c_void, len: usize) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Changed);
    // SAFETY: locking changes no contents; the kernel checks the range.
    unsafe { kernel::mlock(addr, len) }
}

pub fn mlock2(addr: *const c_void, len: usize, flags: u32) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Changed);
    // SAFETY: as in mlock.
    unsafe { kernel::mlock2(addr, len, flags) }
}

pub fn munlock(addr: *const c_void, len: usize) -> c_int {
    // SAFETY: as in mlock.
    unsafe { kernel::munlock(addr, len) }
}

/// MCL_CURRENT locks every live block: all are marked (a walk of the registry's tables, once).
pub fn mlockall(flags: c_int) -> c_int {
    if flags & libc::MCL_CURRENT != 0 {
        HOST.note_page_change(0, usize::MAX, PageChange::Changed);
    }
    // SAFETY: as in mlock.
    unsafe { kernel::mlockall(flags) }
}

/// # Safety
/// As libc's `prlimit`.
pub unsafe fn prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    // SAFETY: the caller's contract.
    let answer = unsafe { kernel::prlimit(pid, resource, new, old) };
    if answer == 0 && !new.is_null() && resource == libc::RLIMIT_AS as c_int {
        super::follow_address_limit();
    }
    answer
}
