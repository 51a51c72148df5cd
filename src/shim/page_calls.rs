//! The page calls under libc's names (Note [Pages the program changed] in host/host_layer/mod.rs):
//! each one call into `route::page_calls`, which goes on to the next interposer or the kernel
//! (Note [The next interposer] in sys/page_calls.rs). The limit calls let the cache follow a new
//! mapping limit, and pthread_create makes room for a thread's stack (Note [Room for
//! others]). capset, unshare and setns let our background thread step aside (Note [Threads and
//! credentials], Note [Threads and namespaces]).

use crate::route::page_calls as route;
use crate::sys::page_calls::Call;
use core::ffi::{c_int, c_void};

#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: libc::off_t) -> *mut c_void {
    // SAFETY: the caller's contract is libc's.
    unsafe { route::mmap(Call::Mmap, addr, len, prot, flags, fd, offset) }
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: libc::off_t) -> *mut c_void {
    // SAFETY: as mmap (the same call on 64-bit systems).
    unsafe { route::mmap(Call::Mmap64, addr, len, prot, flags, fd, offset) }
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::munmap(addr, len) }
}

/// mremap is variadic in C: the fifth argument is passed (and read) only with MREMAP_FIXED; the
/// x86-64 and AArch64 calling conventions pass it in a register either way.
#[no_mangle]
pub unsafe extern "C" fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    // SAFETY: as in mmap.
    unsafe { route::mremap(old, old_len, new_len, flags, new_addr) }
}

#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::mprotect(addr, len, prot) }
}

#[no_mangle]
pub unsafe extern "C" fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, key: c_int) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::pkey_mprotect(addr, len, prot, key) }
}

#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::madvise(addr, len, advice) }
}

#[no_mangle]
pub unsafe extern "C" fn shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    // SAFETY: as in mmap.
    unsafe { route::shmat(id, addr, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn shmdt(addr: *const c_void) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::shmdt(addr) }
}

#[no_mangle]
pub extern "C" fn mlock(addr: *const c_void, len: usize) -> c_int {
    route::mlock(addr, len)
}

#[no_mangle]
pub extern "C" fn mlock2(addr: *const c_void, len: usize, flags: u32) -> c_int {
    route::mlock2(addr, len, flags)
}

#[no_mangle]
pub extern "C" fn munlock(addr: *const c_void, len: usize) -> c_int {
    route::munlock(addr, len)
}

#[no_mangle]
pub extern "C" fn mlockall(flags: c_int) -> c_int {
    route::mlockall(flags)
}

#[no_mangle]
pub extern "C" fn munlockall() -> c_int {
    route::munlockall()
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit(resource: c_int, limit: *const libc::rlimit) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::setrlimit(Call::Setrlimit, resource, limit) }
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit64(resource: c_int, limit: *const libc::rlimit) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::setrlimit(Call::Setrlimit64, resource, limit) }
}

#[no_mangle]
pub unsafe extern "C" fn prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::prlimit(Call::Prlimit, pid, resource, new, old) }
}

#[no_mangle]
pub unsafe extern "C" fn prlimit64(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::prlimit(Call::Prlimit64, pid, resource, new, old) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::pthread_create(thread, attr, start, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn capset(header: *mut c_void, data: *const c_void) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::capset(header, data) }
}

#[no_mangle]
pub unsafe extern "C" fn unshare(flags: c_int) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::unshare(flags) }
}

#[no_mangle]
pub unsafe extern "C" fn setns(fd: c_int, kind: c_int) -> c_int {
    // SAFETY: as in mmap.
    unsafe { route::setns(fd, kind) }
}
