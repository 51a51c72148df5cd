//! The files we write (stats, trace, snapshots) and read, at the level of bytes: paths and names
//! as the kernel takes them (`%p` expanded, NUL-terminated in stack buffers), why a file was
//! refused, one write loop, reserving and mapping a file. How a file is made and named where
//! others can reach is sys/dir.rs's (Note [Files others can reach]); which name it gets,
//! sys/claim.rs's. No allocation.
//
// Note [Signals our writes raise]
// Two signals come of a write whose default action kills the process: SIGXFSZ, for a write or an
// extension past RLIMIT_FSIZE (`ulimit -f`, a batch system's cap), and SIGPIPE, for a write to a
// pipe or socket no one reads (stderr into `| head`, a closed log pipe). A write fails with EFBIG
// or EPIPE instead only where the signal is ignored or blocked. A trace, a stats file, a
// snapshot or a warning line must not kill the program it describes (a bad setting's one line
// on a stderr whose reader is gone killed the program at load, exit 141): each of our writes
// runs with both held back from the writing thread (`write_signals_held`), so it fails, which
// the writers take as a full disk (the trace ends at its last whole record and says so, Note
// [No torn trace]) or, for stderr, as nothing said. A signal our write raised is taken back
// (sigtimedwait, no wait) before the mask is restored; one pending before it (the program's
// own, blocked) is left as it was. Four system calls a write batch (the mask set and restored,
// the pending signals read before and after): files asked for, and lines on stderr.

use super::process::errno;

/// The longest path accepted, without its NUL (PATH_MAX less one).
pub const PATH_MAX_BYTES: usize = 4095;
/// The longest file name we make, without its NUL (the kernel's NAME_MAX).
pub const NAME_MAX_BYTES: usize = 255;
/// A file name, NUL-terminated.
pub type Name = [u8; NAME_MAX_BYTES + 1];

/// Why a file was refused or could not be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// What the system said (an errno).
    Os(i32),
    /// A symbolic link stands at the name.
    Symlink,
    /// A FIFO, a device, a socket or a directory stands at the name.
    NotRegular,
    /// What is there (a file or a directory) is another user's.
    NotOurs,
    /// The file there has other hard links.
    Linked,
    /// Every name tried is taken.
    Taken,
}

impl Refused {
    /// The errno a C caller gets for it.
    pub fn errno(self) -> i32 {
        match self {
            Refused::Os(e) => e,
            Refused::Symlink => libc::ELOOP,
            Refused::NotRegular => libc::EINVAL,
            Refused::NotOurs => libc::EPERM,
            Refused::Linked => libc::EMLINK,
            Refused::Taken => libc::EEXIST,
        }
    }

    /// In words (`buf` holds the C library's text for an errno).
    pub fn text(self, buf: &mut [u8; 128]) -> &str {
        match self {
            Refused::Os(libc::ELOOP) | Refused::Symlink => "a symbolic link stands at that path; not followed",
            Refused::NotRegular => "not a regular file (a FIFO, a device, a socket or a directory stands there)",
            Refused::NotOurs => "what is there is another user's",
            Refused::Linked => "the file there has other hard links",
            Refused::Taken => "that name and the names beside it are taken",
            Refused::Os(e) => super::process::error_text(e, buf),
        }
    }
}

impl From<i32> for Refused {
    fn from(e: i32) -> Self {
        Refused::Os(e)
    }
}

/// The last errno as a refusal.
pub(super) fn last() -> Refused {
    Refused::Os(errno())
}

pub use super::process::decimal;

/// `path` then `suffix`, as they are (nothing expanded), in `out`; None past PATH_MAX.
pub fn joined<'a>(path: &[u8], suffix: &[u8], out: &'a mut [u8; PATH_MAX_BYTES + 1]) -> Option<&'a [u8]> {
    let n = path.len().checked_add(suffix.len()).filter(|&n| n <= PATH_MAX_BYTES)?;
    let dst = out.get_mut(..n)?;
    for (slot, &b) in dst.iter_mut().zip(path.iter().chain(suffix)) {
        *slot = b;
    }
    Some(&*dst)
}

/// `path` with `%p` replaced by `pid` and `%%` by `%` (any other `%` kept), into `out`; its
/// length, or None when it does not fit.
pub fn expand_path(path: &[u8], pid: u32, out: &mut [u8]) -> Option<usize> {
    let mut buf = [0u8; 20];
    expand_with(path, decimal(u64::from(pid), &mut buf), out)
}

/// `path` with `%p` replaced by `id` (a pid, or a pid and an image number) and `%%` by `%`.
pub fn expand_with(path: &[u8], id: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut len = 0;
    let mut put = |b: u8| -> Option<()> {
        *out.get_mut(len)? = b;
        len += 1;
        Some(())
    };
    let mut i = 0;
    while let Some(&b) = path.get(i) {
        match (b, path.get(i + 1)) {
            (b'%', Some(b'p')) => {
                for &d in id {
                    put(d)?;
                }
                i += 2;
            }
            (b'%', Some(b'%')) => {
                put(b'%')?;
                i += 2;
            }
            _ => {
                put(b)?;
                i += 1;
            }
        }
    }
    Some(len)
}

/// A path's directory and its last component: ("dir/sub", "name") for "dir/sub/name", (".",
/// "name") for "name", ("/", "name") for "/name".
pub fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(0) => (b"/", path.get(1..).unwrap_or(&[])),
        Some(at) => (path.get(..at).unwrap_or(&[]), path.get(at + 1..).unwrap_or(&[])),
        None => (b".", path),
    }
}

/// `bytes` NUL-terminated in `out` (zeroed past them); None when they hold a NUL or do not fit.
pub(super) fn terminated<'a, const N: usize>(bytes: &[u8], out: &'a mut [u8; N]) -> Option<&'a [u8; N]> {
    if bytes.contains(&0) || bytes.len() >= N {
        return None;
    }
    *out = [0; N];
    out.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(out)
}

/// A file name as the kernel takes it: ENOENT for an empty one, EINVAL for a NUL or a slash in
/// it, ENAMETOOLONG past NAME_MAX.
pub fn name(bytes: &[u8]) -> Result<Name, Refused> {
    if bytes.is_empty() {
        return Err(Refused::Os(libc::ENOENT));
    }
    if bytes.contains(&b'/') || bytes.contains(&0) {
        return Err(Refused::Os(libc::EINVAL));
    }
    let mut out = [0u8; NAME_MAX_BYTES + 1];
    terminated(bytes, &mut out).ok_or(Refused::Os(libc::ENAMETOOLONG))?;
    Ok(out)
}

/// fstat of a descriptor we hold.
pub(super) fn stat(fd: i32) -> Option<libc::stat> {
    // SAFETY: fstat fills a struct we own.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// The signals a write of ours may raise (Note [Signals our writes raise]).
const WRITE_SIGNALS: [libc::c_int; 2] = [libc::SIGXFSZ, libc::SIGPIPE];

/// Runs `write` (our writes to a file, a pipe, stderr) with SIGXFSZ and SIGPIPE held back from
/// this thread, and takes back those it raised (Note [Signals our writes raise]); cancellation
/// held too (Note [Cancellation points] in sys/cancel.rs).
pub fn write_signals_held<R>(write: impl FnOnce() -> R) -> R {
    super::cancel::cancel_held(|| signals_held(write))
}

fn signals_held<R>(write: impl FnOnce() -> R) -> R {
    // SAFETY: signal sets we own; the mask is restored before returning.
    unsafe {
        let mut held: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut held);
        for sig in WRITE_SIGNALS {
            libc::sigaddset(&mut held, sig);
        }
        let mut old: libc::sigset_t = core::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, &held, &mut old) != 0 {
            return write();
        }
        let before = pending();
        // Only a write that failed with EPIPE or EFBIG raised one: a signal that came meanwhile
        // from kill() (the program's, for its own sigwait) is not taken.
        let errno_before = errno();
        super::process::set_errno(0);
        let out = write();
        let raised = matches!(errno(), libc::EPIPE | libc::EFBIG);
        let saved = if errno() == 0 { errno_before } else { errno() };
        let after = pending();
        for sig in WRITE_SIGNALS {
            if raised && libc::sigismember(&after, sig) == 1 && libc::sigismember(&before, sig) != 1 {
                let mut one: libc::sigset_t = core::mem::zeroed();
                libc::sigemptyset(&mut one);
                libc::sigaddset(&mut one, sig);
                let now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                libc::sigtimedwait(&one, core::ptr::null_mut(), &now);
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        super::process::set_errno(saved);
        out
    }
}

/// The signals pending for this thread or the process (none when sigpending fails).
fn pending() -> libc::sigset_t {
    // SAFETY: sigpending fills a set we own.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigpending(&mut set);
        set
    }
}

/// An exclusive flock on `fd` without waiting; false when another open file holds one.
pub fn try_lock(fd: i32) -> bool {
    // SAFETY: flock on a descriptor the caller holds.
    unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// The most times `allocate` asks again after a signal.
const INTERRUPTED_TRIES: u32 = 16;

/// fallocate of `fd`'s first `len` bytes (SIGXFSZ held: Note [Signals our writes raise]); the
/// errno when refused. Asked again when a signal interrupted it: tmpfs before Linux 6.10 fails
/// with EINTR at any caught signal, undoing what it had reserved, so a program's profiling timer
/// would otherwise cost it its stats file or the neighbour registry.
pub(super) fn allocate(fd: i32, len: usize) -> Result<(), i32> {
    let mut tries = 0;
    loop {
        // SAFETY: fallocate of a file the caller holds.
        if write_signals_held(|| unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) }) == 0 {
            return Ok(());
        }
        tries += 1;
        if errno() != libc::EINTR || tries >= INTERRUPTED_TRIES {
            return Err(errno());
        }
    }
}

/// Reserves `len` bytes of `fd`'s file on disk (fallocate; where the file system has none,
/// zeros written), so that a full disk is found now and a mapping of it never faults on one.
pub fn reserve(fd: i32, len: usize) -> Result<(), Refused> {
    match allocate(fd, len) {
        Ok(()) => return Ok(()),
        Err(e) if e != libc::EOPNOTSUPP => return Err(Refused::Os(e)),
        Err(_) => {}
    }
    let zeros = [0u8; 4096];
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len());
        write_all(fd, zeros.get(..n).unwrap_or(&[]))?;
        left -= n;
    }
    Ok(())
}

/// Maps `len` bytes of `fd`'s file shared, read-write (our own mapping: the raw system call,
/// Note [Pages the program changed]), covered against the file being shortened under us (Note
/// [Files shortened under us] in bus_guard.rs).
pub fn map_shared(fd: i32, len: usize) -> Option<*mut u8> {
    // SAFETY: a new mapping of a file we hold, placed by the kernel.
    let p = unsafe { super::page_calls::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return None;
    }
    super::bus_guard::cover(p.cast(), len);
    Some(p.cast())
}

/// Unmaps what `map_shared` mapped.
///
/// # Safety
/// Nothing uses the mapping any more.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    super::bus_guard::uncover(p);
    // SAFETY: the caller's promise.
    unsafe { super::page_calls::munmap(p.cast(), len) };
}

/// ftruncate: the file ends at `len`.
pub fn truncate(fd: i32, len: u64) -> Result<(), Refused> {
    // SAFETY: ftruncate of a file we hold.
    if write_signals_held(|| unsafe { libc::ftruncate(fd, len as libc::off_t) }) != 0 {
        return Err(last());
    }
    Ok(())
}

/// close(2); the errno when it reports a failed write-back.
pub fn close(fd: i32) -> Result<(), i32> {
    // SAFETY: the caller owns fd and does not use it again.
    if super::cancel::cancel_held(|| unsafe { libc::close(fd) }) != 0 {
        return Err(errno());
    }
    Ok(())
}

/// write(2) of all of `bytes`, retrying short writes and EINTR; the errno of a real failure
/// (EIO when the file takes nothing).
pub fn write_all(fd: i32, bytes: &[u8]) -> Result<(), i32> {
    write_counted(fd, bytes).map_err(|(e, _)| e)
}

/// As `write_all`; a failure also says how many bytes went out before it.
pub fn write_counted(fd: i32, bytes: &[u8]) -> Result<(), (i32, usize)> {
    write_signals_held(|| write_loop(fd, bytes))
}

/// `write_all` for a caller that holds every signal (thread.rs `with_signals_held`): it waits
/// for room only in ppoll, with `open` (the program's own mask, SIGPIPE and SIGXFSZ still held)
/// in place, so a signal that ends the program ends it while a pipe's reader does not read; each
/// write then takes no more than a pipe accepts at once.
pub fn write_all_waiting_open(fd: i32, bytes: &[u8], open: &libc::sigset_t) -> Result<(), i32> {
    const PIPE_BUF: usize = 4096;
    let mut wait_mask = *open;
    for sig in WRITE_SIGNALS {
        // SAFETY: a set of our own.
        unsafe { libc::sigaddset(&mut wait_mask, sig) };
    }
    write_signals_held(|| {
        let mut rest = bytes;
        while !rest.is_empty() {
            let mut room = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
            // SAFETY: one pollfd of ours; no timeout; a mask of ours.
            if unsafe { libc::ppoll(&mut room, 1, core::ptr::null(), &wait_mask) } < 0 {
                match errno() {
                    libc::EINTR => continue,
                    // ppoll refused (a sandbox's filter): the rest is written as any write is.
                    _ => return write_loop(fd, rest).map_err(|(e, _)| e),
                }
            }
            let chunk = rest.get(..rest.len().min(PIPE_BUF)).unwrap_or(rest);
            // SAFETY: the pointer and length describe a live slice.
            let n = unsafe { libc::write(fd, chunk.as_ptr().cast(), chunk.len()) };
            if n < 0 {
                match errno() {
                    libc::EINTR | libc::EAGAIN => continue,
                    e => return Err(e),
                }
            }
            if n == 0 {
                return Err(libc::EIO);
            }
            rest = rest.get(n as usize..).unwrap_or(&[]);
        }
        // A retry's EINTR or EAGAIN is not what the program's errno should read.
        super::process::set_errno(0);
        Ok(())
    })
}

fn write_loop(fd: i32, mut bytes: &[u8]) -> Result<(), (i32, usize)> {
    let mut sent = 0;
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            match errno() {
                libc::EINTR => continue,
                e => return Err((e, sent)),
            }
        }
        if n == 0 {
            return Err((libc::EIO, sent));
        }
        sent += n as usize;
        bytes = bytes.get(n as usize..).unwrap_or(&[]);
    }
    // A retry's EINTR is not what the program's errno should read (signals_held puts it back).
    super::process::set_errno(0);
    Ok(())
}

/// One pwrite of all of `bytes` at `offset`; whether it all went out.
pub fn write_at(fd: i32, bytes: &[u8], offset: u64) -> bool {
    // SAFETY: the pointer and length describe a live slice.
    let n = write_signals_held(|| unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), offset as libc::off_t) });
    usize::try_from(n).is_ok_and(|n| n == bytes.len())
}

/// Reads up to `buf.len()` bytes of a kernel file (`path` NUL-terminated: /proc, /sys) with one
/// read(2), never blocking; the count read.
pub fn read_small(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    super::process::read_kernel_file(path, buf)
}

/// A pipe's two ends (read, write), for tests of what a writer sends.
#[cfg(test)]
pub fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into our array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_p_is_the_process_id() {
        let mut out = [0u8; 32];
        let n = expand_path(b"/tmp/s.%p.json", 4321, &mut out).unwrap();
        assert_eq!(&out[..n], b"/tmp/s.4321.json");
        let n = expand_path(b"%p-%%p-%x-%", 7, &mut out).unwrap();
        assert_eq!(&out[..n], b"7-%p-%x-%");
        assert_eq!(expand_path(b"%p%p%p%p", 1234567890, &mut out), None, "too long for the buffer");
        let n = expand_with(b"s.%p.json", b"12.2", &mut out).unwrap();
        assert_eq!(&out[..n], b"s.12.2.json");
    }

    #[test]
    fn paths_split_into_directory_and_name() {
        assert_eq!(split(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split(b"c"), (&b"."[..], &b"c"[..]));
        assert_eq!(split(b"/c"), (&b"/"[..], &b"c"[..]));
        assert_eq!(name(b""), Err(Refused::Os(libc::ENOENT)));
        assert_eq!(name(b"a/b"), Err(Refused::Os(libc::EINVAL)));
        assert_eq!(name(&[b'x'; 256]), Err(Refused::Os(libc::ENAMETOOLONG)));
    }

    #[test]
    fn writes_count_what_went_out_and_kernel_files_read() {
        let (r, w) = pipe();
        write_all(w, b"hello").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(unsafe { libc::read(r, buf.as_mut_ptr().cast(), 8) }, 5);
        close(r).unwrap();
        assert_eq!(write_counted(w, b"x"), Err((libc::EPIPE, 0)));
        close(w).unwrap();
        let mut comm = [0u8; 64];
        assert!(read_small(b"/proc/self/comm\0", &mut comm).unwrap() > 0);
        assert_eq!(read_small(b"/proc/self/comm", &mut comm), None, "no NUL: refused");
    }
}
