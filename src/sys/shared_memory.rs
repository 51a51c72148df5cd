//! Memory shared with the user's other processes (the device pools' neighbour registry, Note
//! [Neighbours] in device/neighbours.rs): a small file in /dev/shm opened only if it is this
//! user's own, and futexes that wake across processes.

/// Maps the file `/dev/shm/NAME` (NAME: no NUL, no slash), `len` bytes, shared and read-write,
/// created 0600 if missing. Refused (None) when it is not a plain file of ours with no access for
/// others (another user's, a symlink, a wrong size: another version's), or when its pages cannot
/// be reserved (a full /dev/shm: reserving them now means no later write can fault).
pub fn map_own_file(name: &[u8], len: usize) -> Option<*mut u8> {
    if name.is_empty() || name.contains(&0) || name.contains(&b'/') {
        return None;
    }
    let mut path = [0u8; super::files::PATH_MAX_BYTES + 1];
    super::files::joined(b"/dev/shm/", name, &mut path)?;
    // SAFETY: path is NUL-terminated (zeroed past the name, one byte longer than any path
    // joined writes); the other calls get a descriptor we
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
    let timeout = timeout_ns.map(super::clock::timespec);
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
