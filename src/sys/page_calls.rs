//! The page calls as the kernel answers them: mmap, munmap, mremap, mprotect, pkey_mprotect,
//! madvise, mlock, mlock2, munlock, mlockall, shmat, shmdt and the resource limits, each one system call that
//! sets errno as libc's wrapper does. The shims of these names forward here (a call to libc's
//! name from this library would come back to our own shim), and our own mappings use them so
//! that our system calls are never taken for the program's (Note [Pages the program changed]);
//! the program's own go on to the next interposer when there is one (`program`, Note [The next
//! interposer]).

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

/// munlockall as the kernel answers it.
/// # Safety
/// As libc's `munlockall`.
pub unsafe fn munlockall() -> c_int {
    raw!(libc::SYS_munlockall) as c_int
}

/// capset as the kernel answers it (capabilities of the calling thread).
/// # Safety
/// As libc's `capset`.
pub unsafe fn capset(header: *mut c_void, data: *const c_void) -> c_int {
    raw!(libc::SYS_capset, header, data) as c_int
}

/// unshare as the kernel answers it.
/// # Safety
/// As libc's `unshare`.
pub unsafe fn unshare(flags: c_int) -> c_int {
    raw!(libc::SYS_unshare, flags) as c_int
}

/// setns as the kernel answers it.
/// # Safety
/// As libc's `setns`.
pub unsafe fn setns(fd: c_int, kind: c_int) -> c_int {
    raw!(libc::SYS_setns, fd, kind) as c_int
}

/// # Safety
/// As libc's `shmat`.
pub unsafe fn shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    raw!(libc::SYS_shmat, id, addr, flags) as *mut c_void
}

/// # Safety
/// As libc's `shmdt`.
pub unsafe fn shmdt(addr: *const c_void) -> c_int {
    raw!(libc::SYS_shmdt, addr) as c_int
}

/// The size of shared memory segment `id` (shmctl IPC_STAT), if the caller may read it.
pub fn shm_size(id: c_int) -> Option<usize> {
    // SAFETY: shmid_ds is plain data the kernel fills.
    let mut ds: libc::shmid_ds = unsafe { core::mem::zeroed() };
    (raw!(libc::SYS_shmctl, id, libc::IPC_STAT, &mut ds as *mut libc::shmid_ds) == 0).then_some(ds.shm_segsz)
}

// Note [The next interposer]
// Another library preloaded after us may hook the page calls too (gperftools' mmap hooks, a
// tracer, a sandbox's accounting). The program's calls reach our shims first, as they come
// before its definitions: so each shim goes on to the next definition after ours when it is not
// libc's own (`dlsym(RTLD_NEXT)`, resolved once at init, where dlsym may allocate: the bootstrap
// arena serves it), and to the kernel directly otherwise (the same system call libc's wrapper
// makes, with none of its own code in between). Our own mappings never go through the next
// definition: they are ours, not the program's, and a hook that allocated inside them would come
// back to us.

/// The page calls the shims forward, in `NEXT`'s order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Mmap,
    Mmap64,
    Munmap,
    Mremap,
    Mprotect,
    PkeyMprotect,
    Madvise,
    Mlock,
    Mlock2,
    Munlock,
    Mlockall,
    Munlockall,
    Setrlimit,
    Setrlimit64,
    Prlimit,
    Prlimit64,
    PthreadCreate,
    Capset,
    Unshare,
    Setns,
    Shmat,
    Shmdt,
}

const CALLS: usize = 22;
const NAMES: [&core::ffi::CStr; CALLS] = [
    c"mmap",
    c"mmap64",
    c"munmap",
    c"mremap",
    c"mprotect",
    c"pkey_mprotect",
    c"madvise",
    c"mlock",
    c"mlock2",
    c"munlock",
    c"mlockall",
    c"munlockall",
    c"setrlimit",
    c"setrlimit64",
    c"prlimit",
    c"prlimit64",
    c"pthread_create",
    c"capset",
    c"unshare",
    c"setns",
    c"shmat",
    c"shmdt",
];

/// The next definition of each call when it is not libc's own (0: the kernel directly).
static NEXT: [core::sync::atomic::AtomicUsize; CALLS] = [const { core::sync::atomic::AtomicUsize::new(0) }; CALLS];
/// libc's pthread_create (it has no system call to fall back on).
static LIBC_PTHREAD_CREATE: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

extern "C" {
    fn gnu_get_libc_version() -> *const core::ffi::c_char;
}

/// Resolves the next definitions (Note [The next interposer]); at init, where dlsym may run.
pub fn resolve_next() {
    let libc_base = super::dlsym::object_of(gnu_get_libc_version as *const () as usize).map(|(base, _)| base);
    for (name, slot) in NAMES.iter().zip(NEXT.iter()) {
        // SAFETY: glibc's dlsym relative to us; never our own definition.
        let p = unsafe { super::dlsym::next_definition(name) };
        if p.is_null() {
            continue;
        }
        if *name == c"pthread_create" {
            LIBC_PTHREAD_CREATE.store(p as usize, core::sync::atomic::Ordering::Release);
        }
        if super::dlsym::object_of(p as usize).map(|(base, _)| base) != libc_base || libc_base.is_none() {
            slot.store(p as usize, core::sync::atomic::Ordering::Release);
        }
    }
}

/// The next definition of `call`, when one other than libc's exists.
#[inline(always)]
fn next(call: Call) -> Option<usize> {
    NEXT.get(call as usize).map(|s| s.load(core::sync::atomic::Ordering::Acquire)).filter(|&f| f != 0)
}

/// The program's page calls: to the next interposer, or the kernel (Note [The next interposer]).
pub mod program {
    use super::{next, Call};
    use core::ffi::{c_int, c_void};
    use core::mem::transmute;

    /// `call`: Mmap or Mmap64 (one call on 64-bit systems, two names an interposer may hook).
    /// # Safety
    /// As libc's `mmap`.
    pub unsafe fn mmap(call: Call, addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: libc::off_t) -> *mut c_void {
        match next(call) {
            // SAFETY: the next definition of mmap, called as libc's is.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void>(f)(addr, len, prot, flags, fd, offset) },
            None => unsafe { super::mmap(addr, len, prot, flags, fd, offset) },
        }
    }

    /// # Safety
    /// As libc's `munmap`.
    pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
        match next(Call::Munmap) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*mut c_void, usize) -> c_int>(f)(addr, len) },
            None => unsafe { super::munmap(addr, len) },
        }
    }

    /// # Safety
    /// As libc's `mremap` (variadic in C: the fifth argument passes in a register either way).
    pub unsafe fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
        match next(Call::Mremap) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void>(f)(old, old_len, new_len, flags, new_addr) },
            None => unsafe { super::mremap(old, old_len, new_len, flags, new_addr) },
        }
    }

    /// # Safety
    /// As libc's `mprotect`.
    pub unsafe fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
        match next(Call::Mprotect) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int>(f)(addr, len, prot) },
            None => unsafe { super::mprotect(addr, len, prot) },
        }
    }

    /// # Safety
    /// As libc's `pkey_mprotect`, which issues plain mprotect for key -1 (as this does when no
    /// interposer comes next: key -1 changes no key, and filters refuse pkey_mprotect).
    pub unsafe fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, key: c_int) -> c_int {
        match next(Call::PkeyMprotect) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*mut c_void, usize, c_int, c_int) -> c_int>(f)(addr, len, prot, key) },
            None if key == -1 => unsafe { super::mprotect(addr, len, prot) },
            None => unsafe { super::pkey_mprotect(addr, len, prot, key) },
        }
    }

    /// # Safety
    /// As libc's `madvise`.
    pub unsafe fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
        match next(Call::Madvise) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int>(f)(addr, len, advice) },
            None => unsafe { super::madvise(addr, len, advice) },
        }
    }

    /// # Safety
    /// As libc's `mlock`.
    pub unsafe fn mlock(addr: *const c_void, len: usize) -> c_int {
        match next(Call::Mlock) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*const c_void, usize) -> c_int>(f)(addr, len) },
            None => unsafe { super::mlock(addr, len) },
        }
    }

    /// # Safety
    /// As libc's `mlock2`.
    pub unsafe fn mlock2(addr: *const c_void, len: usize, flags: u32) -> c_int {
        match next(Call::Mlock2) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*const c_void, usize, u32) -> c_int>(f)(addr, len, flags) },
            None => unsafe { super::mlock2(addr, len, flags) },
        }
    }

    /// # Safety
    /// As libc's `munlock`.
    pub unsafe fn munlock(addr: *const c_void, len: usize) -> c_int {
        match next(Call::Munlock) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*const c_void, usize) -> c_int>(f)(addr, len) },
            None => unsafe { super::munlock(addr, len) },
        }
    }

    /// # Safety
    /// As libc's `mlockall`.
    pub unsafe fn mlockall(flags: c_int) -> c_int {
        match next(Call::Mlockall) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(c_int) -> c_int>(f)(flags) },
            None => unsafe { super::mlockall(flags) },
        }
    }

    /// # Safety
    /// As libc's `munlockall`.
    pub unsafe fn munlockall() -> c_int {
        match next(Call::Munlockall) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn() -> c_int>(f)() },
            None => unsafe { super::munlockall() },
        }
    }

    /// `call`: Setrlimit or Setrlimit64; the kernel's prlimit64 for this process otherwise.
    /// # Safety
    /// As libc's `setrlimit`.
    pub unsafe fn setrlimit(call: Call, resource: c_int, new: *const libc::rlimit) -> c_int {
        match next(call) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(c_int, *const libc::rlimit) -> c_int>(f)(resource, new) },
            None => unsafe { super::prlimit(0, resource, new, core::ptr::null_mut()) },
        }
    }

    /// `call`: Prlimit or Prlimit64.
    /// # Safety
    /// As libc's `prlimit`.
    pub unsafe fn prlimit(call: Call, pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
        match next(call) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(libc::pid_t, c_int, *const libc::rlimit, *mut libc::rlimit) -> c_int>(f)(pid, resource, new, old) },
            None => unsafe { super::prlimit(pid, resource, new, old) },
        }
    }

    pub type StartFn = extern "C" fn(*mut c_void) -> *mut c_void;

    /// # Safety
    /// As libc's `capset`.
    pub unsafe fn capset(header: *mut c_void, data: *const c_void) -> c_int {
        match next(Call::Capset) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*mut c_void, *const c_void) -> c_int>(f)(header, data) },
            None => unsafe { super::capset(header, data) },
        }
    }

    /// # Safety
    /// As libc's `unshare`.
    pub unsafe fn unshare(flags: c_int) -> c_int {
        match next(Call::Unshare) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(c_int) -> c_int>(f)(flags) },
            None => unsafe { super::unshare(flags) },
        }
    }

    /// # Safety
    /// As libc's `setns`.
    pub unsafe fn setns(fd: c_int, kind: c_int) -> c_int {
        match next(Call::Setns) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(c_int, c_int) -> c_int>(f)(fd, kind) },
            None => unsafe { super::setns(fd, kind) },
        }
    }

    /// # Safety
    /// As libc's `shmat`.
    pub unsafe fn shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
        match next(Call::Shmat) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(c_int, *const c_void, c_int) -> *mut c_void>(f)(id, addr, flags) },
            None => unsafe { super::shmat(id, addr, flags) },
        }
    }

    /// # Safety
    /// As libc's `shmdt`.
    pub unsafe fn shmdt(addr: *const c_void) -> c_int {
        match next(Call::Shmdt) {
            // SAFETY: as in mmap.
            Some(f) => unsafe { transmute::<usize, unsafe extern "C" fn(*const c_void) -> c_int>(f)(addr) },
            None => unsafe { super::shmdt(addr) },
        }
    }

    /// The next pthread_create (libc's, or an interposer's): resolved at init, or here for a
    /// thread made before it (dlsym may allocate: not an allocation path). EAGAIN if none.
    /// # Safety
    /// As libc's `pthread_create`.
    pub unsafe fn pthread_create(thread: *mut libc::pthread_t, attr: *const libc::pthread_attr_t, start: StartFn, arg: *mut c_void) -> c_int {
        let mut f = super::LIBC_PTHREAD_CREATE.load(core::sync::atomic::Ordering::Acquire);
        if let Some(g) = next(Call::PthreadCreate) {
            f = g;
        }
        if f == 0 {
            // SAFETY: glibc's dlsym relative to us.
            f = unsafe { super::super::dlsym::next_definition(c"pthread_create") } as usize;
            super::LIBC_PTHREAD_CREATE.store(f, core::sync::atomic::Ordering::Release);
        }
        if f == 0 {
            return libc::EAGAIN;
        }
        // SAFETY: the next pthread_create, called as libc's is.
        unsafe { transmute::<usize, unsafe extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, StartFn, *mut c_void) -> c_int>(f)(thread, attr, start, arg) }
    }
}
