//! The files we write (the stats, the trace, the snapshots) and the small ones we read (/proc,
//! /sys): one way to open an output file, one write loop, one small read. No allocation: paths
//! are made NUL-terminated in a stack buffer.

use super::process::errno;

/// The longest path accepted, without its NUL (PATH_MAX less one).
pub const PATH_MAX_BYTES: usize = 4095;

/// Creates or truncates the file at `path` (no NUL; `%p` in it is this process's id, `%%` a
/// percent sign), write-only, closed on exec, mode 0600 (our outputs hold addresses and names
/// of code), never through a symlink at its last component (ELOOP): how every output file is
/// opened. The file descriptor, or an errno.
pub fn create_output(path: &[u8]) -> Result<i32, i32> {
    let mut cpath = [0u8; PATH_MAX_BYTES + 1];
    target_path(path, &mut cpath)?;
    // SAFETY: cpath is NUL-terminated (one byte longer than any path written into it).
    let fd = unsafe { libc::open(cpath.as_ptr().cast(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600) };
    if fd < 0 {
        return Err(errno());
    }
    Ok(fd)
}

/// `path` as the kernel is to get it, in `out` (zeroed, so NUL-terminated): `%p` expanded to
/// this process's id; its length. ENOENT for an empty path, EINVAL for one with a NUL,
/// ENAMETOOLONG past PATH_MAX.
fn target_path(path: &[u8], out: &mut [u8; PATH_MAX_BYTES + 1]) -> Result<usize, i32> {
    if path.is_empty() {
        return Err(libc::ENOENT);
    }
    if path.contains(&0) {
        return Err(libc::EINVAL);
    }
    expand_path(path, super::process::id(), out).filter(|&n| n <= PATH_MAX_BYTES).ok_or(libc::ENAMETOOLONG)
}

/// `v` in decimal, in the tail of `buf` (file names that carry a pid or a uid).
pub fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    for slot in buf.iter_mut().rev() {
        *slot = b'0' + (v % 10) as u8;
        start -= 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    buf.get(start..).unwrap_or(&[])
}

/// `path` then `suffix`, as they are (nothing expanded), in `out`; None past PATH_MAX.
pub fn joined<'a>(path: &[u8], suffix: &[u8], out: &'a mut [u8; PATH_MAX_BYTES + 1]) -> Option<&'a [u8]> {
    let n = path.len().checked_add(suffix.len()).filter(|&n| n <= PATH_MAX_BYTES)?;
    let dst = out.get_mut(..n)?;
    for (slot, &b) in dst.iter_mut().zip(path.iter().chain(suffix)) {
        *slot = b;
    }
    Some(&*dst)
}

/// A file's modification time, in wall ns.
fn mtime_ns(st: &libc::stat) -> u64 {
    (st.st_mtime as u64).saturating_mul(1_000_000_000).saturating_add(st.st_mtime_nsec as u64)
}

// Note [Output files]
// Files other processes read while we run (the JSON stats, kept current by the background
// thread) are written whole under a temporary name beside the target and renamed over it: a
// reader sees the old file or the new one, never half of one, and a file another process is
// writing is never truncated under it. A symbolic link at the target is refused (ELOOP), as
// `create_output` refuses it, so a planted link neither redirects nor disappears.

/// An output file being written under a temporary name (Note [Output files]); `commit` puts it
/// in place, dropping it unfinished removes it.
pub struct Output {
    fd: i32,
    temp: [u8; PATH_MAX_BYTES + 1],
    target: [u8; PATH_MAX_BYTES + 1],
}

impl Output {
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Closes the file and renames it over the target; the errno of a failure (the temporary
    /// file is then removed).
    pub fn commit(mut self) -> Result<(), i32> {
        let fd = core::mem::replace(&mut self.fd, -1);
        close(fd)?;
        // SAFETY: both paths are NUL-terminated buffers we own.
        if unsafe { libc::rename(self.temp.as_ptr().cast(), self.target.as_ptr().cast()) } != 0 {
            let e = errno();
            // SAFETY: as above.
            unsafe { libc::unlink(self.temp.as_ptr().cast()) };
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.fd >= 0 {
            let _ = close(self.fd);
            // SAFETY: a NUL-terminated path we own.
            unsafe { libc::unlink(self.temp.as_ptr().cast()) };
        }
    }
}

/// Starts an output file at `path` (`%p` expanded; see `create_output`), written under
/// `PATH.tmp.PID` until committed; mode 0600; ELOOP when a symbolic link stands at the target.
pub fn begin_output(path: &[u8]) -> Result<Output, i32> {
    let mut target = [0u8; PATH_MAX_BYTES + 1];
    target_path(path, &mut target)?;
    if is_symlink(&target) {
        return Err(libc::ELOOP);
    }
    let mut raw = [0u8; PATH_MAX_BYTES + 1];
    let mut temp = [0u8; PATH_MAX_BYTES + 1];
    target_path(joined(path, b".tmp.%p", &mut raw).ok_or(libc::ENAMETOOLONG)?, &mut temp)?;
    // SAFETY: temp is NUL-terminated (zeroed past the path).
    let fd = unsafe { libc::open(temp.as_ptr().cast(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600) };
    if fd < 0 {
        return Err(errno());
    }
    Ok(Output { fd, temp, target })
}

/// Whether a symbolic link stands at the NUL-terminated `path`.
fn is_symlink(path: &[u8]) -> bool {
    // SAFETY: lstat fills the struct we own; path is NUL-terminated.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    (unsafe { libc::lstat(path.as_ptr().cast(), &mut st) }) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Renames the file at `path` (`%p` expanded) to `path.PID` for `pid`: a younger process's file
/// steps aside for the run's first (Note [One file per process]). Nothing when it cannot.
pub fn move_beside(path: &[u8], pid: u32) {
    let mut from = [0u8; PATH_MAX_BYTES + 1];
    let mut to = [0u8; PATH_MAX_BYTES + 1];
    let mut suffix = [0u8; 16];
    let (Ok(n), Some(m)) = (target_path(path, &mut from), expand_path(b".%p", pid, &mut suffix)) else { return };
    if joined(from.get(..n).unwrap_or(&[]), suffix.get(..m).unwrap_or(&[]), &mut to).is_none() {
        return;
    }
    // SAFETY: both paths are NUL-terminated buffers we own.
    unsafe { libc::rename(from.as_ptr().cast(), to.as_ptr().cast()) };
}

/// Whether process `pid` exists (signal 0: EPERM means it does, as another user's).
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || errno() == libc::EPERM)
}

/// The first bytes of the file at `path` (`%p` expanded), and its modification time (wall ns);
/// None when it cannot be read.
pub fn peek(path: &[u8], buf: &mut [u8]) -> Option<(usize, u64)> {
    let mut target = [0u8; PATH_MAX_BYTES + 1];
    target_path(path, &mut target).ok()?;
    // SAFETY: target is NUL-terminated; the struct and buffer are ours.
    unsafe {
        let fd = libc::open(target.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW);
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let ok = libc::fstat(fd, &mut st) == 0;
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        (ok && n >= 0).then_some((n as usize, mtime_ns(&st)))
    }
}

/// A file written for the process's whole life (the trace), claimed with an exclusive flock that
/// lasts as long as the process holds it open (Note [One file per process] in
/// report/shared_path.rs): the first process of a run to open PATH (no `%p`) writes it; one
/// that finds it claimed by a live process, or written since `started_wall_ns` (by a process of
/// the run that has ended), writes `PATH.PID` beside it. The descriptor, and whether it is the
/// one beside.
pub fn create_claimed_output(path: &[u8], started_wall_ns: u64) -> Result<(i32, bool), i32> {
    if path.windows(2).any(|w| w == b"%p") {
        let fd = create_output(path)?;
        // SAFETY: a lock on our own descriptor; a failure only means no claim.
        unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
        return Ok((fd, false));
    }
    let mut cpath = [0u8; PATH_MAX_BYTES + 1];
    target_path(path, &mut cpath)?;
    // SAFETY: cpath is NUL-terminated. No O_TRUNC: the file may be another live process's.
    let fd = unsafe { libc::open(cpath.as_ptr().cast(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o600) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: flock and ftruncate on the descriptor we just opened.
    unsafe {
        let mut st: libc::stat = core::mem::zeroed();
        let written_since = libc::fstat(fd, &mut st) == 0 && st.st_size > 0 && mtime_ns(&st) >= started_wall_ns;
        if !written_since && libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0 {
            if libc::ftruncate(fd, 0) != 0 {
                let e = errno();
                libc::close(fd);
                return Err(e);
            }
            return Ok((fd, false));
        }
        libc::close(fd);
    }
    let mut beside = [0u8; PATH_MAX_BYTES + 1];
    let fd = create_output(joined(path, b".%p", &mut beside).ok_or(libc::ENAMETOOLONG)?)?;
    // SAFETY: as above.
    unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
    Ok((fd, true))
}

/// Why `create_output` refused, in words (`buf` holds the C library's text).
pub fn refusal_text(e: i32, buf: &mut [u8; 128]) -> &str {
    if e == libc::ELOOP {
        return "a symbolic link stands at that path; not followed";
    }
    super::process::error_text(e, buf)
}

/// `path` with `%p` replaced by `pid` and `%%` by `%` (any other `%` kept), into `out`; its
/// length, or None when it does not fit.
pub fn expand_path(path: &[u8], pid: u32, out: &mut [u8]) -> Option<usize> {
    let mut buf = [0u8; 20];
    let digits = decimal(u64::from(pid), &mut buf);
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
                for &d in digits {
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

/// close(2); the errno when it reports a failed write-back.
pub fn close(fd: i32) -> Result<(), i32> {
    // SAFETY: the caller owns fd and does not use it again.
    if unsafe { libc::close(fd) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// write(2) of all of `bytes`, retrying short writes and EINTR; the errno of a real failure
/// (EIO when the file takes nothing).
pub fn write_all(fd: i32, mut bytes: &[u8]) -> Result<(), i32> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            match errno() {
                libc::EINTR => continue,
                e => return Err(e),
            }
        }
        if n == 0 {
            return Err(libc::EIO);
        }
        bytes = bytes.get(n as usize..).unwrap_or(&[]);
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes of the file at `path` (NUL-terminated) with one read(2); the
/// count read.
pub fn read_small(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    if path.last() != Some(&0) {
        return None;
    }
    // SAFETY: `path` is NUL-terminated; read writes at most buf.len() bytes into buf.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        usize::try_from(n).ok()
    }
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
    }

    #[test]
    fn output_files_are_private_and_never_written_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tm-files-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = dir.join("out");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert_eq!(create_output(link.to_str().unwrap().as_bytes()), Err(libc::ELOOP));
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let fresh = dir.join("fresh.%p");
        let fd = create_output(fresh.to_str().unwrap().as_bytes()).unwrap();
        close(fd).unwrap();
        let written = dir.join(format!("fresh.{}", std::process::id()));
        assert_eq!(std::fs::metadata(&written).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_files_are_created_truncated_and_refuse_bad_paths() {
        let dir = std::env::temp_dir().join(format!("tm-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out");
        std::fs::write(&path, b"old contents, longer").unwrap();
        let fd = create_output(path.to_str().unwrap().as_bytes()).unwrap();
        write_all(fd, b"new").unwrap();
        close(fd).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mut cpath = path.to_str().unwrap().as_bytes().to_vec();
        cpath.push(0);
        let mut buf = [0u8; 16];
        assert_eq!(read_small(&cpath, &mut buf), Some(3));
        assert_eq!(read_small(path.to_str().unwrap().as_bytes(), &mut buf), None, "no NUL: refused");
        assert_eq!(create_output(b""), Err(libc::ENOENT));
        assert_eq!(create_output(b"a\0b"), Err(libc::EINVAL));
        assert_eq!(create_output(&[b'x'; PATH_MAX_BYTES + 1]), Err(libc::ENAMETOOLONG));
        assert_eq!(create_output(dir.join("no/such/dir").to_str().unwrap().as_bytes()), Err(libc::ENOENT));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
