//! Memory shared with the user's other processes (the device pools' neighbour registry, Note
//! [Neighbours] in device/neighbours/mod.rs): a small file in the user's own runtime directory,
//! else in /dev/shm, opened only if it is this user's own and private; and futexes that wake
//! across processes.

use super::cancel::cancel_held;
use super::files::PATH_MAX_BYTES;

/// Why a shared file could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Another user's file stands at the name (created first: squatted).
    OtherUser { uid: u32 },
    /// Ours, but others may read or write it.
    NotPrivate,
    /// Not a plain file (a symbolic link, a directory, ...).
    NotAFile,
    /// Another size: another version's file, or damaged.
    WrongSize,
    /// The system refused (no /dev/shm, a full or read-only one): errno.
    System(i32),
}

/// Where a shared file lives: the user's own runtime directory (XDG_RUNTIME_DIR, else
/// /run/user/UID, when it is a directory of this user's that no one else may enter), where no
/// other user can create anything; else /dev/shm, where anyone can create any name first.
pub struct SharedFile {
    path: [u8; PATH_MAX_BYTES + 1],
    len: usize,
    /// The directory, open; -1 when none could be.
    dir: i32,
    /// The name inside it.
    name_at: usize,
    pub in_runtime_dir: bool,
}

impl SharedFile {
    /// Chooses where `name` lives: `NAME` in the user's runtime directory, else `shm_name` in
    /// /dev/shm (no slash or NUL in either).
    pub fn locate(name: &[u8], shm_name: &[u8]) -> SharedFile {
        let mut f = SharedFile { path: [0; PATH_MAX_BYTES + 1], len: 0, dir: -1, name_at: 0, in_runtime_dir: false };
        let mut dir = [0u8; PATH_MAX_BYTES + 1];
        let mut uid = [0u8; 20];
        let uid = super::files::decimal(u64::from(super::process::user_id()), &mut uid);
        let mut run_user = [0u8; PATH_MAX_BYTES + 1];
        let fallback = super::files::joined(b"/run/user/", uid, &mut run_user).map(|p| p.len()).unwrap_or(0);
        let mut xdg_len = 0;
        if !super::env::is_secure_execution() {
            super::env::for_each_with_prefix(b"XDG_RUNTIME_DIR", |key, value| {
                if key == b"XDG_RUNTIME_DIR" && !value.is_empty() {
                    xdg_len = super::files::joined(value, b"", &mut dir).map_or(0, |p| p.len());
                }
            });
        }
        let candidates = [dir.get(..xdg_len).unwrap_or(&[]), run_user.get(..fallback).unwrap_or(&[])];
        for candidate in candidates.into_iter().filter(|c| !c.is_empty()) {
            if let Some(fd) = open_private_dir(candidate) {
                f.dir = fd;
                f.in_runtime_dir = true;
                f.set_path(candidate, name);
                return f;
            }
        }
        // SAFETY: a literal path, NUL-terminated.
        f.dir = cancel_held(|| unsafe { libc::open(c"/dev/shm".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) });
        f.set_path(b"/dev/shm", shm_name);
        f
    }

    fn set_path(&mut self, dir: &[u8], name: &[u8]) {
        let mut with_slash = [0u8; PATH_MAX_BYTES + 1];
        let dir = super::files::joined(dir, b"/", &mut with_slash).unwrap_or(b"/");
        self.name_at = dir.len();
        self.len = super::files::joined(dir, name, &mut self.path).map_or(0, |p| p.len());
    }

    /// The file's path, for what is said about it.
    pub fn path(&self) -> &[u8] {
        self.path.get(..self.len).unwrap_or(&[])
    }

    /// Maps the file, `len` bytes, shared and read-write, created 0600 if missing. Refused when
    /// it is not a plain private file of ours of that size, or when its pages cannot be reserved
    /// (a full /dev/shm: reserving them now means no later write can fault).
    pub fn map(&self, len: usize) -> Result<*mut u8, Refused> {
        let name = self.path.get(self.name_at..=self.len).filter(|n| n.len() > 1 && !n.get(..n.len() - 1).unwrap_or(&[]).contains(&b'/'));
        let Some(name) = name else { return Err(Refused::System(libc::ENAMETOOLONG)) };
        if self.dir < 0 {
            return Err(Refused::System(libc::ENOENT));
        }
        // SAFETY: `name` is NUL-terminated (the path buffer is zeroed past its end, one byte longer
        // than any path joined writes); the other calls get a descriptor we own and a stat
        // buffer on our stack.
        unsafe {
            let fd = cancel_held(|| libc::openat(self.dir, name.as_ptr().cast(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600));
            if fd < 0 {
                let e = super::process::errno();
                // Another user's file in a sticky directory (EACCES, also for root where
                // fs.protected_regular is on), a symbolic link (ELOOP): say whose.
                let mut st: libc::stat = core::mem::zeroed();
                if libc::fstatat(self.dir, name.as_ptr().cast(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 {
                    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                        return Err(Refused::NotAFile);
                    }
                    if st.st_uid != libc::geteuid() {
                        return Err(Refused::OtherUser { uid: st.st_uid });
                    }
                }
                return Err(Refused::System(e));
            }
            let checked = Self::check(fd, len);
            let mapped = checked.and_then(|()| {
                let p = super::page_calls::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
                if p == libc::MAP_FAILED {
                    Err(Refused::System(super::process::errno()))
                } else {
                    Ok(p.cast::<u8>())
                }
            });
            let _ = super::files::close(fd);
            mapped
        }
    }

    /// # Safety
    /// `fd` is an open descriptor.
    unsafe fn check(fd: i32, len: usize) -> Result<(), Refused> {
        let mut st: libc::stat = core::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(Refused::System(super::process::errno()));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Refused::NotAFile);
        }
        if st.st_uid != libc::geteuid() {
            return Err(Refused::OtherUser { uid: st.st_uid });
        }
        if st.st_mode & 0o077 != 0 {
            return Err(Refused::NotPrivate);
        }
        if st.st_size != 0 && st.st_size as usize != len {
            return Err(Refused::WrongSize);
        }
        // fallocate reserves the pages (ENOSPC on a full /dev/shm) and leaves contents alone
        // (EFBIG past a file size limit: Note [Signals our writes raise]).
        super::files::allocate(fd, len).map_err(Refused::System)
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        if self.dir >= 0 {
            // A descriptor we opened and close once.
            let _ = super::files::close(self.dir);
        }
    }
}

/// `path`, opened, when it is a directory of this user's that no other user may enter or write
/// (mode 0700 or tighter); None otherwise.
fn open_private_dir(path: &[u8]) -> Option<i32> {
    let mut buf = [0u8; PATH_MAX_BYTES + 1];
    super::files::joined(path, b"", &mut buf)?;
    // SAFETY: `buf` is NUL-terminated (zeroed past the path); fstat writes into our stack.
    unsafe {
        let fd = cancel_held(|| libc::open(buf.as_ptr().cast(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC));
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let private = libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_uid == libc::geteuid() && st.st_mode & 0o077 == 0;
        if !private {
            let _ = super::files::close(fd);
            return None;
        }
        Some(fd)
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

/// 64 random bits from the kernel (getrandom; the clock mixed in should it refuse).
pub fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = cancel_held(|| unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, libc::GRND_NONBLOCK) });
    if n != 8 {
        v ^= super::clock::now_ns().rotate_left(17) ^ u64::from(super::process::id());
    }
    v
}

/// Whether process `pid` lives and is this user's to signal (signal 0 sends nothing).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

/// Whether process `pid` lives and, where `started` says when a process of that pid started, is
/// that process (Note [A pid given again] in device/neighbours/mod.rs).
pub fn process_lives(pid: u32, started: Option<u64>) -> bool {
    process_alive(pid) && started.is_none_or(|then| super::process::stat_of(pid).is_none_or(|now| now.start_ticks == then))
}

/// Whether process `pid` lives and has not ended: an ended process its parent has not waited
/// for yet (a zombie) still answers signal 0, and answers nothing else.
pub fn process_running(pid: u32) -> bool {
    if !process_alive(pid) {
        return false;
    }
    let mut path = [0u8; 32];
    let mut at = 0;
    for part in [&b"/proc/"[..], itoa(pid, &mut [0u8; 10]), &b"/stat\0"[..]] {
        for &b in part {
            if let Some(slot) = path.get_mut(at) {
                *slot = b;
                at += 1;
            }
        }
    }
    let mut stat = [0u8; 512];
    let Some(n) = super::process::read_kernel_file(path.get(..at).unwrap_or(&[]), &mut stat) else { return true };
    // The state follows the command's closing parenthesis: "pid (comm) S ...".
    let stat = stat.get(..n).unwrap_or(&[]);
    let state = stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2));
    !matches!(state, Some(b'Z' | b'X'))
}

/// `n` in decimal, in the end of `buf`.
fn itoa(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        if let Some(d) = buf.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    buf.get(i..).unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_child_not_yet_waited_for_is_alive_but_not_running() {
        assert!(process_running(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Ended, not yet waited for: a zombie, which signal 0 still finds.
        for _ in 0..500 {
            if !process_running(pid) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(process_alive(pid) && !process_running(pid));
        child.wait().unwrap();
        assert!(!process_alive(pid));
        assert_eq!(itoa(4_294_967_295, &mut [0; 10]), b"4294967295");
        assert_eq!(itoa(0, &mut [0; 10]), b"0");
    }
}
