//! Memory shared with the user's other processes (the device pools' neighbour registry, Note
//! [Neighbours] in device/neighbours.rs): a small file in /dev/shm opened only if it is this
//! user's own, futexes that wake across processes, and the thread that waits on one.

/// Maps the file `/dev/shm/NAME` (NAME: no NUL, no slash), `len` bytes, shared and read-write,
/// created 0600 if missing. Refused (None) when it is not a plain file of ours with no access for
/// others (another user's, a symlink, a wrong size: another version's), or when its pages cannot
/// be reserved (a full /dev/shm: reserving them now means no later write can fault).
pub fn map_own_file(name: &[u8], len: usize) -> Option<*mut u8> {
    let mut path = [0u8; 256];
    let prefix = b"/dev/shm/";
    if name.is_empty() || name.contains(&0) || name.contains(&b'/') || prefix.len() + name.len() >= path.len() {
        return None;
    }
    for (slot, &b) in path.iter_mut().zip(prefix.iter().chain(name)) {
        *slot = b;
    }
    // SAFETY: path is NUL-terminated (zeroed past the name); the other calls get a descriptor we
    // own and a stat buffer on our stack.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600);
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let ours = libc::fstat(fd, &mut st) == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && st.st_uid == libc::geteuid()
            && st.st_mode & 0o077 == 0
            && (st.st_size == 0 || st.st_size as usize == len);
        // fallocate reserves the pages (ENOSPC on a full /dev/shm) and leaves contents alone.
        let ready = ours && libc::fallocate(fd, 0, 0, len as libc::off_t) == 0;
        let mapped = if ready {
            super::page_calls::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        (mapped != libc::MAP_FAILED).then_some(mapped.cast())
    }
}

/// Waits while `word` (in shared memory) holds `expected`, at most `timeout_ns` (None: until
/// woken). Returns early on a wake, a signal or a changed word.
pub fn wait(word: &core::sync::atomic::AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let timeout = timeout_ns.map(|ns| libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long });
    let timeout_ptr = timeout.as_ref().map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a futex wait on a live word with an optional relative timeout on our stack; not
    // FUTEX_PRIVATE: the word is in a mapping other processes share.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, timeout_ptr) };
}

/// Wakes every waiter on `word`, in any process that maps it.
pub fn wake_all(word: &core::sync::atomic::AtomicU32) {
    // SAFETY: a futex wake on a live word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// Whether process `pid` lives and is this user's to signal (signal 0 sends nothing).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

/// Sleeps `ns` nanoseconds.
pub fn sleep_ns(ns: u64) {
    let t = libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    // SAFETY: reads one timespec on our stack.
    unsafe { libc::nanosleep(&t, core::ptr::null_mut()) };
}

/// Starts a detached thread named `name` running `main` forever, every signal blocked (signals
/// are the program's); false when none can be made.
pub fn spawn(name: &core::ffi::CStr, main: fn() -> !) -> bool {
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: blocks every signal for this thread only; `arg` is the `fn() -> !` spawn got.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, core::ptr::null_mut());
            core::mem::transmute::<*mut libc::c_void, fn() -> !>(arg)()
        }
    }
    // SAFETY: plain pthread calls on attributes we own.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return false;
        }
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        let mut thread: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut thread, &attr, start, main as *mut libc::c_void);
        libc::pthread_attr_destroy(&mut attr);
        if rc == 0 {
            libc::pthread_setname_np(thread, name.as_ptr());
        }
        rc == 0
    }
}
