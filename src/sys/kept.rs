//! Descriptors we keep open for the process's life when files were asked for (the trace, the
//! stats file and its directory): placed high, and checked before each use.
//
// Note [Descriptors the program may close]
// A descriptor is a number in the program's table, and the program may close it: a daemon
// closes every descriptor past stderr, Python's os.closerange and BSD's closefrom do the same,
// `exec 9>file` in a shell or a dup2 lands on a fixed number. The number then names whatever the
// program opens next: under TENSORMALLOC_TRACE the trace's next write went into the program's
// own data file, and under TENSORMALLOC_STATS the exit's JSON was named in a directory the
// program had opened. So a kept descriptor is moved high (F_DUPFD_CLOEXEC from a floor near the
// soft RLIMIT_NOFILE: the kernel hands out the lowest free number, so the program's next files
// take low ones and do not meet ours), the file it names is noted (device and inode), and each
// use first checks that the number still names that file (one fstat). One that does not is
// given up: nothing more is written through it, and it is never closed (the number is the
// program's now). A program that closes ours and, within the microseconds between our check and
// our write, opens hundreds of files until one lands on our number could still meet a write;
// nothing short of owning the number closes that.

use core::sync::atomic::{AtomicI32, AtomicU64, Ordering::{AcqRel, Acquire, Relaxed, Release}};

/// Kept descriptors go at least this far below the soft RLIMIT_NOFILE...
const BELOW_LIMIT: u64 = 64;
/// ...and no higher than this (select() takes descriptors below 1024, and a program with a huge
/// limit still opens its files from 3 up).
const HIGHEST_FLOOR: u64 = 1024 - BELOW_LIMIT;
/// Under a limit this low there is no room above the program's files: ours stay where they are.
const LOWEST_FLOOR: u64 = 16;

/// A descriptor of ours and the file it named when kept.
pub struct Kept {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Default for Kept {
    fn default() -> Self {
        Self::new()
    }
}

impl Kept {
    pub const fn new() -> Self {
        Kept { fd: AtomicI32::new(-1), dev: AtomicU64::new(0), ino: AtomicU64::new(0) }
    }

    /// Keeps `fd`, just opened by us: moved high, the file it names noted. Returns the number
    /// it is kept under.
    pub fn keep(&self, fd: i32) -> i32 {
        let fd = moved_high(fd);
        let (dev, ino) = identity(fd).unwrap_or((0, 0));
        self.dev.store(dev, Relaxed);
        self.ino.store(ino, Relaxed);
        self.fd.store(fd, Release);
        fd
    }

    /// The number as kept, unchecked; -1 when none.
    pub fn number(&self) -> i32 {
        self.fd.load(Acquire)
    }

    /// The number when it still names the file kept (one fstat); -1 when none is kept or the
    /// program closed or replaced it (then it is forgotten).
    pub fn checked(&self) -> i32 {
        let fd = self.fd.load(Acquire);
        if fd < 0 {
            return -1;
        }
        if identity(fd) == Some((self.dev.load(Relaxed), self.ino.load(Relaxed))) {
            return fd;
        }
        let _ = self.fd.compare_exchange(fd, -1, AcqRel, Acquire);
        -1
    }

    /// Forgets the descriptor; returns it when it still named the file kept (for the caller to
    /// close), -1 otherwise (a number the program reused is left alone).
    pub fn take(&self) -> i32 {
        let fd = self.checked();
        if fd >= 0 && self.fd.compare_exchange(fd, -1, AcqRel, Acquire).is_ok() {
            return fd;
        }
        -1
    }

    /// Forgets the descriptor without closing it (the caller closes it, or it was lost).
    pub fn forget(&self) {
        self.fd.store(-1, Release);
    }
}

/// (device, inode) of what `fd` names.
fn identity(fd: i32) -> Option<(u64, u64)> {
    super::files::stat(fd).map(|st| (st.st_dev, st.st_ino))
}

/// The floor for kept descriptors under a soft RLIMIT_NOFILE of `soft` (None: leave them low).
fn floor_under(soft: u64) -> Option<u64> {
    let floor = soft.saturating_sub(BELOW_LIMIT).min(HIGHEST_FLOOR);
    (floor >= LOWEST_FLOOR).then_some(floor)
}

/// `fd` moved to the lowest free number at or past the floor (and closed where it was); `fd`
/// itself when there is no floor or no free number past it.
fn moved_high(fd: i32) -> i32 {
    let Some(floor) = floor_under(super::memory::soft_limit(libc::RLIMIT_NOFILE)) else { return fd };
    // SAFETY: duplicates a descriptor we hold; fcntl(F_DUPFD_CLOEXEC) is no cancellation point.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor as libc::c_int) };
    if high < 0 {
        return fd;
    }
    let _ = super::files::close(fd);
    high
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_sits_below_the_limit_and_under_select_s_reach() {
        assert_eq!(floor_under(1024), Some(960));
        assert_eq!(floor_under(524_288), Some(960), "a huge limit: still under 1024");
        assert_eq!(floor_under(256), Some(192));
        assert_eq!(floor_under(64), None, "no room above the program's files");
    }

    #[test]
    fn a_kept_descriptor_the_program_closed_and_reused_is_given_up_not_closed() {
        let path = std::env::temp_dir().join(format!("tm-kept-{}", std::process::id()));
        let open = |p: &std::path::Path| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o600) }
        };
        let kept = Kept::new();
        let fd = kept.keep(open(&path));
        assert!(fd >= 0);
        assert_eq!(kept.checked(), fd, "still ours");
        // The program closes it and its next file lands on the same number.
        let other = path.with_extension("other");
        let reused = open(&other);
        // SAFETY: both are descriptors this test opened.
        unsafe {
            libc::dup2(reused, fd);
            libc::close(reused);
        }
        assert_eq!(kept.checked(), -1, "the number names another file now");
        assert_eq!(kept.take(), -1, "and is not ours to close");
        assert!(super::super::files::stat(fd).is_some(), "the program's file is still open");
        let _ = super::super::files::close(fd);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&other);
    }
}
