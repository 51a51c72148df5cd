//! The page calls as the kernel answers them: mmap, munmap, mremap, mprotect, pkey_mprotect,
//! madvise, mlock, mlock2, munlock, mlockall and the resource limits, each one system call that
//! sets errno as libc's wrapper does. The shims of these names forward here (a call to libc's
//! name from this library would come back to our own shim), and our own mappings use them so
//! that our system calls are never taken for the program's (Note [Pages the program changed]).

use core::ffi::{c_int, c_long, c_void};

// Each function is `unsafe` as libc's is: the range may be anyone's memory, and the caller
// answers for what changing it does (# Safety of each: the arguments of the libc call).

/// One system call; -1 with errno set on failure, as libc's wrappers answer.
macro_rules! raw {
    ($nr:expr $(, $arg:expr)*) => {
        // SAFETY: the caller's contract (see the functions); the kernel checks the arguments.
        unsafe { libc::syscall($nr $(, $arg)*) }
    };
}

/// # Safety
/// As libc's `mmap`.
pub unsafe fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: libc::off_t) -> *mut c_void {
    raw!(libc::SYS_mmap, addr, len, prot as c_long, flags as c_long, fd as c_long, offset) as *mut c_void
}

/// # Safety
/// As libc's `munmap`.
pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    raw!(libc::SYS_munmap, addr, len) as c_int
}

/// # Safety
/// As libc's `mremap`.
pub unsafe fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    raw!(libc::SYS_mremap, old, old_len, new_len, flags as c_long, new_addr) as *mut c_void
}

/// # Safety
/// As libc's `mprotect`.
pub unsafe fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    raw!(libc::SYS_mprotect, addr, len, prot as c_long) as c_int
}

/// # Safety
/// As libc's `pkey_mprotect`.
pub unsafe fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, key: c_int) -> c_int {
    raw!(libc::SYS_pkey_mprotect, addr, len, prot as c_long, key as c_long) as c_int
}

/// # Safety
/// As libc's `madvise`.
pub unsafe fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    raw!(libc::SYS_madvise, addr, len, advice as c_long) as c_int
}

/// # Safety
/// As libc's `mlock`.
pub unsafe fn mlock(addr: *const c_void, len: usize) -> c_int {
    raw!(libc::SYS_mlock, addr, len) as c_int
}

/// # Safety
/// As libc's `mlock2`.
pub unsafe fn mlock2(addr: *const c_void, len: usize, flags: u32) -> c_int {
    raw!(libc::SYS_mlock2, addr, len, flags as c_long) as c_int
}

/// # Safety
/// As libc's `munlock`.
pub unsafe fn munlock(addr: *const c_void, len: usize) -> c_int {
    raw!(libc::SYS_munlock, addr, len) as c_int
}

/// # Safety
/// As libc's `mlockall`.
pub unsafe fn mlockall(flags: c_int) -> c_int {
    raw!(libc::SYS_mlockall, flags as c_long) as c_int
}

/// prlimit64 as glibc's prlimit, setrlimit and getrlimit make it (pid 0: this process).
/// # Safety
/// As libc's `prlimit`.
pub unsafe fn prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    raw!(libc::SYS_prlimit64, pid as c_long, resource as c_long, new, old) as c_int
}
