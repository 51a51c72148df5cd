//! The calling thread's errno, its text, and the abort glibc answers a corrupted heap with.

/// The calling thread's errno.
pub fn errno() -> i32 {
    // SAFETY: errno is thread-local and always readable.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: errno is thread-local and always writable.
    unsafe { *libc::__errno_location() = e };
}

/// The C library's text for errno `e`, written into `buf` (no allocation); "error" when none.
pub fn error_text(e: i32, buf: &mut [u8; 128]) -> &str {
    // SAFETY: strerror_r (XSI) writes a NUL-terminated message of at most buf.len() bytes.
    if unsafe { libc::strerror_r(e, buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "error";
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(0);
    core::str::from_utf8(buf.get(..n).unwrap_or(&[])).unwrap_or("error")
}

/// This process's id (getpid: a system call, since glibc caches it no more).
pub fn id() -> u32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The effective user id (whose files ours are).
pub fn user_id() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// When this process started (wall ns; a forked child: its fork), for "written since it
/// started" (Note [One file per process] in report/shared_path.rs).
static STARTED_WALL_NS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// At load, and in a forked child: this process starts now.
pub fn note_start() {
    STARTED_WALL_NS.store(super::clock::wall_ns(), core::sync::atomic::Ordering::Relaxed);
}

pub fn started_wall_ns() -> u64 {
    STARTED_WALL_NS.load(core::sync::atomic::Ordering::Relaxed)
}

/// The parent process's id.
pub fn parent_id() -> u32 {
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() as u32 }
}

/// This process's command name (/proc/self/comm: argv[0]'s base name, at most 15 bytes), in
/// `buf`; empty when it cannot be read.
pub fn command_name(buf: &mut [u8; 32]) -> &[u8] {
    let n = super::files::read_small(b"/proc/self/comm\0", buf).unwrap_or(0);
    let name = buf.get(..n).unwrap_or(&[]);
    name.strip_suffix(b"\n").unwrap_or(name)
}

/// Ends the process as glibc does on a bad free: SIGABRT.
pub fn abort() -> ! {
    // SAFETY: abort never returns.
    unsafe { libc::abort() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_round_trips_and_has_text() {
        set_errno(libc::ENOMEM);
        assert_eq!(errno(), libc::ENOMEM);
        let mut buf = [0u8; 128];
        assert_eq!(error_text(libc::ENOENT, &mut buf), "No such file or directory");
    }
}
