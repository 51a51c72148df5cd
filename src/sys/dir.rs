//! How a file is made and named where others can reach it (Note [Files others can reach]): a
//! directory held by descriptor, a file made with no name (`Unnamed`) and then named or renamed
//! over a file of ours, and what stands at a name, looked at without blocking or following a
//! link (`look`). Built on sys/files.rs; no allocation.
//
// Note [Files others can reach]
// An output directory may be shared (a sticky /tmp), and anything may stand at a name we mean to
// use: a FIFO (opening it blocks for good), a device, a symbolic link, another user's file
// hard-linked there (writing it hands our data to them). So an output is never opened by its
// name: it is made with no name in its directory (O_TMPFILE; where the file system has none,
// O_EXCL under an unpredictable name), written or mapped, and then named with linkat, which
// fails when anything stands at the name and never follows or opens it; or renamed over a file
// of ours that was checked first. A file we look at or read is opened O_NONBLOCK (a FIFO or a
// device never blocks us), O_NOFOLLOW, O_CLOEXEC, then checked: a regular file, ours, with one
// link; anything else is refused with its reason. Every file we make is 0600.

use super::cancel::cancel_held;
use super::files::{self, close, decimal, joined, last, name, stat, terminated, try_lock, write_at, Name, Refused, NAME_MAX_BYTES, PATH_MAX_BYTES};
use super::process::errno;

/// A directory held by descriptor: names in it are made and looked at relative to it, so a
/// directory renamed or replaced meanwhile changes nothing.
pub struct Dir(i32);

impl Dir {
    /// The directory at `path` (no NUL; followed through links, which are the user's own choice
    /// of where outputs go).
    pub fn open(path: &[u8]) -> Result<Dir, Refused> {
        if path.is_empty() {
            return Err(Refused::Os(libc::ENOENT));
        }
        let mut c = [0u8; PATH_MAX_BYTES + 1];
        let c = terminated(path, &mut c).ok_or(Refused::Os(libc::ENAMETOOLONG))?;
        // SAFETY: c is NUL-terminated.
        let fd = cancel_held(|| unsafe { libc::open(c.as_ptr().cast(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) });
        if fd < 0 {
            return Err(last());
        }
        Ok(Dir(fd))
    }

    /// The directory `name` in `parent`, made 0700 if missing (when `create`): refused unless
    /// it is a directory of ours that no one else may enter (a directory another user made
    /// first, or a link, is never used).
    pub fn private(parent: &Dir, name: &[u8], create: bool) -> Result<Dir, Refused> {
        let n = files::name(name)?;
        // SAFETY: n is NUL-terminated; mkdirat, openat and fstat take our descriptor and buffers.
        unsafe {
            if create && libc::mkdirat(parent.0, n.as_ptr().cast(), 0o700) != 0 && errno() != libc::EEXIST {
                return Err(last());
            }
            let fd = cancel_held(|| libc::openat(parent.0, n.as_ptr().cast(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK));
            if fd < 0 {
                return Err(match errno() {
                    libc::ELOOP | libc::ENOTDIR => {
                        let mut st: libc::stat = core::mem::zeroed();
                        let link = libc::fstatat(parent.0, n.as_ptr().cast(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK;
                        if link { Refused::Symlink } else { Refused::NotRegular }
                    }
                    e => Refused::Os(e),
                });
            }
            let dir = Dir(fd);
            let st = stat(fd).ok_or_else(last)?;
            if st.st_uid != super::process::user_id() {
                return Err(Refused::NotOurs);
            }
            if st.st_mode & 0o077 != 0 {
                return Err(Refused::Os(libc::EACCES));
            }
            // Made under a umask that took the owner's bits too (umask 0222 makes it r-x): every
            // later run, whatever its umask, was refused there. It is ours and no one else's.
            if st.st_mode & 0o700 != 0o700 && libc::fchmod(fd, 0o700) != 0 {
                return Err(last());
            }
            Ok(dir)
        }
    }

    pub fn fd(&self) -> i32 {
        self.0
    }

    /// Keeps the directory open past this value (for a static); `from_raw` takes it back.
    pub fn into_raw(self) -> i32 {
        let fd = self.0;
        core::mem::forget(self);
        fd
    }

    /// # Safety
    /// `fd` came from `into_raw` and is not held by another `Dir`.
    pub unsafe fn from_raw(fd: i32) -> Dir {
        Dir(fd)
    }

    /// Calls `f` with each name in the directory (not "." and ".."), read with getdents64 into a
    /// stack buffer.
    pub fn for_each_name(&self, mut f: impl FnMut(&[u8])) {
        // SAFETY: openat of "." in our directory; getdents64 fills our buffer with records whose
        // lengths it gives; close of the descriptor we opened.
        unsafe {
            let fd = cancel_held(|| libc::openat(self.0, c".".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC));
            if fd < 0 {
                return;
            }
            let mut buf = [0u64; 512];
            loop {
                let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), core::mem::size_of_val(&buf));
                let Ok(n) = usize::try_from(n) else { break };
                if n == 0 {
                    break;
                }
                let bytes = core::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n);
                let mut at = 0;
                // struct linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name (NUL-terminated).
                while let Some(&[lo, hi]) = bytes.get(at + 16..at + 18) {
                    let reclen = usize::from(u16::from_ne_bytes([lo, hi]));
                    let Some(rec) = bytes.get(at + 19..at + reclen.max(19)) else { break };
                    let len = rec.iter().position(|&b| b == 0).unwrap_or(rec.len());
                    let name = rec.get(..len).unwrap_or(&[]);
                    if name != b"." && name != b".." {
                        f(name);
                    }
                    if reclen == 0 {
                        break;
                    }
                    at += reclen;
                }
            }
            let _ = close(fd);
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = close(self.0);
    }
}


/// A file's modification time, in wall ns.
fn mtime_ns(st: &libc::stat) -> u64 {
    (st.st_mtime as u64).saturating_mul(1_000_000_000).saturating_add(st.st_mtime_nsec as u64)
}


/// 16 hex digits nobody can guess (getrandom; the clock and the pid mixed in where it fails).
fn random_hex(out: &mut [u8; 16]) {
    let mut r = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into r.
    let got = cancel_held(|| unsafe { libc::getrandom((&mut r as *mut u64).cast(), 8, libc::GRND_NONBLOCK) });
    if got != 8 {
        r = super::clock::now_ns() ^ (u64::from(super::process::id()) << 40) ^ (out.as_ptr() as u64).rotate_left(17);
        r = r.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (r >> 29);
    }
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = b"0123456789abcdef".get(((r >> (60 - 4 * i)) & 15) as usize).copied().unwrap_or(b'0');
    }
}

/// `base` + ".tmp." + 16 random hex digits, NUL-terminated.
fn temporary_name(base: &[u8]) -> Result<Name, Refused> {
    let mut hex = [0u8; 16];
    random_hex(&mut hex);
    let mut joined = [0u8; PATH_MAX_BYTES + 1];
    let short = base.get(..base.len().min(NAME_MAX_BYTES - 21)).unwrap_or(&[]);
    let mut tail = [0u8; 21];
    tail.get_mut(..5).ok_or(Refused::Os(libc::EINVAL))?.copy_from_slice(b".tmp.");
    tail.get_mut(5..).ok_or(Refused::Os(libc::EINVAL))?.copy_from_slice(&hex);
    name(joined_ok(short, &tail, &mut joined)?)
}

fn joined_ok<'a>(a: &[u8], b: &[u8], out: &'a mut [u8; PATH_MAX_BYTES + 1]) -> Result<&'a [u8], Refused> {
    joined(a, b, out).ok_or(Refused::Os(libc::ENAMETOOLONG))
}

/// Whether linkat with AT_EMPTY_PATH works here (it needs CAP_DAC_READ_SEARCH): 0 unknown, 1
/// yes, 2 no (then /proc/self/fd/N is linked).
static EMPTY_PATH_LINKS: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

/// A file of ours with no name yet (Note [Files others can reach]), 0600, read-write, closed on
/// exec. Dropped before it is named, it vanishes.
pub struct Unnamed {
    fd: i32,
    dir: i32,
    /// Where the file system has no O_TMPFILE: the unpredictable name it was made under
    /// (`temp[0] == 0`: none).
    temp: Name,
}

impl Unnamed {
    /// A new empty file in `dir`, `base` naming it while it has no name of its own (where the file
    /// system cannot make it nameless).
    pub fn create(dir: &Dir, base: &[u8]) -> Result<Unnamed, Refused> {
        // SAFETY: openat with a NUL-terminated name in our directory.
        let fd = cancel_held(|| unsafe { libc::openat(dir.0, c".".as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600) });
        if fd >= 0 {
            return Ok(Unnamed { fd, dir: dir.0, temp: [0; NAME_MAX_BYTES + 1] });
        }
        match errno() {
            // No O_TMPFILE on this file system (or kernel).
            libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL | libc::ENOENT => Self::create_named(dir, base),
            e => Err(Refused::Os(e)),
        }
    }

    /// Where there is no O_TMPFILE: a file under a name of our own that no one can have made
    /// first (an unpredictable name, and O_EXCL, which fails on anything there, links included).
    fn create_named(dir: &Dir, base: &[u8]) -> Result<Unnamed, Refused> {
        for _ in 0..8 {
            let temp = temporary_name(if base.is_empty() { b".tensormalloc" } else { base })?;
            // SAFETY: as above.
            let fd = unsafe {
                cancel_held(|| libc::openat(dir.0, temp.as_ptr().cast(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK, 0o600))
            };
            if fd >= 0 {
                return Ok(Unnamed { fd, dir: dir.0, temp });
            }
            if errno() != libc::EEXIST {
                return Err(last());
            }
        }
        Err(Refused::Taken)
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Names the file `name` when nothing stands there: Ok(true); Ok(false) when something does
    /// (it is neither followed nor opened).
    pub fn link(&mut self, name: &[u8]) -> Result<bool, Refused> {
        let n = files::name(name)?;
        let linked = if self.temp[0] != 0 {
            // SAFETY: two NUL-terminated names in our directory.
            unsafe { libc::linkat(self.dir, self.temp.as_ptr().cast(), self.dir, n.as_ptr().cast(), 0) == 0 }
        } else {
            self.link_nameless(&n)
        };
        if !linked {
            return match errno() {
                libc::EEXIST => Ok(false),
                e => Err(Refused::Os(e)),
            };
        }
        self.drop_temp();
        Ok(true)
    }

    /// linkat of an O_TMPFILE file: by its descriptor where allowed, else through /proc.
    fn link_nameless(&self, n: &Name) -> bool {
        if EMPTY_PATH_LINKS.load(core::sync::atomic::Ordering::Relaxed) != 2 {
            // SAFETY: an empty path with AT_EMPTY_PATH names our descriptor.
            if unsafe { libc::linkat(self.fd, c"".as_ptr(), self.dir, n.as_ptr().cast(), libc::AT_EMPTY_PATH) } == 0 {
                EMPTY_PATH_LINKS.store(1, core::sync::atomic::Ordering::Relaxed);
                return true;
            }
            match errno() {
                libc::ENOENT | libc::EPERM | libc::EACCES => EMPTY_PATH_LINKS.store(2, core::sync::atomic::Ordering::Relaxed),
                _ => return false,
            }
        }
        let mut proc = [0u8; 40];
        let mut digits = [0u8; 20];
        for (at, &b) in b"/proc/self/fd/".iter().chain(decimal(self.fd as u64, &mut digits)).enumerate() {
            if let Some(slot) = proc.get_mut(at) {
                *slot = b;
            }
        }
        // SAFETY: proc is NUL-terminated (zeroed past the digits); AT_SYMLINK_FOLLOW links the
        // file the magic link names, ours.
        unsafe { libc::linkat(libc::AT_FDCWD, proc.as_ptr().cast(), self.dir, n.as_ptr().cast(), libc::AT_SYMLINK_FOLLOW) == 0 }
    }

    /// Names the file `name`, in place of the file there (which the caller checked is ours: a
    /// rename never writes into the file it replaces). Signals wait meanwhile: a SIGTERM between
    /// the temporary name and the rename (a Pool's workers end so, at times in their exit hook)
    /// would leave the temporary name behind.
    pub fn replace(&mut self, name: &[u8]) -> Result<(), Refused> {
        let _quiet = SignalsHeld::now();
        let n = files::name(name)?;
        if self.temp[0] == 0 {
            // A name of its own first (rename takes names, not descriptors).
            let mut tries = 0;
            loop {
                let temp = temporary_name(name)?;
                if self.link_nameless(&temp) {
                    self.temp = temp;
                    break;
                }
                tries += 1;
                if errno() != libc::EEXIST || tries == 8 {
                    return Err(last());
                }
            }
        }
        // SAFETY: two NUL-terminated names in our directory.
        if cancel_held(|| unsafe { libc::renameat(self.dir, self.temp.as_ptr().cast(), self.dir, n.as_ptr().cast()) }) != 0 {
            return Err(last());
        }
        self.temp = [0; NAME_MAX_BYTES + 1];
        Ok(())
    }

    /// Removes the temporary name, if any (the file keeps the name it was given).
    fn drop_temp(&mut self) {
        if self.temp[0] != 0 {
            // SAFETY: a NUL-terminated name in our directory.
            cancel_held(|| unsafe { libc::unlinkat(self.dir, self.temp.as_ptr().cast(), 0) });
            self.temp = [0; NAME_MAX_BYTES + 1];
        }
    }

    /// The open file, kept past this value (named or not).
    pub fn into_fd(mut self) -> i32 {
        self.drop_temp();
        let fd = core::mem::replace(&mut self.fd, -1);
        core::mem::forget(self);
        fd
    }
}

impl Drop for Unnamed {
    fn drop(&mut self) {
        self.drop_temp();
        if self.fd >= 0 {
            let _ = close(self.fd);
        }
    }
}

/// Every signal the thread can hold waits until this is dropped (SIGKILL and SIGSTOP cannot).
struct SignalsHeld(libc::sigset_t);

impl SignalsHeld {
    fn now() -> SignalsHeld {
        // SAFETY: sigset operations on sets we own; pthread_sigmask of the calling thread.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            let mut old: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalsHeld(old)
        }
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restores the mask `now` saved, on the same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, core::ptr::null_mut()) };
    }
}

/// A file of ours opened to be looked at or read: regular, ours, one link (Note [Files others
/// can reach]). Closed when dropped.
pub struct Found {
    fd: i32,
    pub size: u64,
    pub mtime_ns: u64,
    dev: u64,
    ino: u64,
}

impl Found {
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Whether `name` in `dir` is still this file.
    pub fn is_at(&self, dir: &Dir, name: &[u8]) -> bool {
        let Ok(n) = files::name(name) else { return false };
        // SAFETY: fstatat fills a struct we own; n is NUL-terminated.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        (unsafe { libc::fstatat(dir.0, n.as_ptr().cast(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0) && st.st_dev == self.dev && st.st_ino == self.ino
    }

    /// An exclusive flock without waiting: false while another open file holds it (the live
    /// writer of a trace or of mapped counters holds its own for its whole life).
    pub fn try_lock(&self) -> bool {
        try_lock(self.fd)
    }

    /// Whether it still has a name (unlinked files have none).
    pub fn linked(&self) -> bool {
        stat(self.fd).is_some_and(|st| st.st_nlink > 0)
    }

    /// Writes `bytes` at `offset` of this file, found at `name` in `dir` (reopened for writing,
    /// without following a link or blocking, and only if the name still names this file: a file
    /// of ours, checked); whether it all went out.
    pub fn write_at(&self, dir: &Dir, name: &[u8], offset: u64, bytes: &[u8]) -> bool {
        let Ok(n) = files::name(name) else { return false };
        // SAFETY: n is NUL-terminated; the descriptor is closed below.
        let fd = cancel_held(|| unsafe { libc::openat(dir.0, n.as_ptr().cast(), libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY) });
        if fd < 0 {
            return false;
        }
        let same = stat(fd).is_some_and(|st| st.st_dev == self.dev && st.st_ino == self.ino);
        let written = same && write_at(fd, bytes, offset);
        let _ = close(fd);
        written
    }

    /// pread of up to `buf.len()` bytes at `offset`; the count read.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> usize {
        // SAFETY: pread writes at most buf.len() bytes into buf.
        let n = cancel_held(|| unsafe { libc::pread(self.fd, buf.as_mut_ptr().cast(), buf.len(), offset as libc::off_t) });
        usize::try_from(n).unwrap_or(0)
    }
}

impl Drop for Found {
    fn drop(&mut self) {
        let _ = close(self.fd);
    }
}

/// What stands at a name.
pub enum Standing {
    Nothing,
    /// A file of ours, opened read-only.
    Ours(Found),
    /// Something we do not touch, and why.
    Other(Refused),
}

/// What stands at `name` in `dir`, opened without blocking or following a link and checked.
pub fn look(dir: &Dir, name: &[u8]) -> Standing {
    let n = match files::name(name) {
        Ok(n) => n,
        Err(e) => return Standing::Other(e),
    };
    // SAFETY: n is NUL-terminated.
    let fd = cancel_held(|| unsafe { libc::openat(dir.0, n.as_ptr().cast(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY) });
    if fd < 0 {
        return match errno() {
            libc::ENOENT => Standing::Nothing,
            libc::ELOOP => Standing::Other(Refused::Symlink),
            e => Standing::Other(Refused::Os(e)),
        };
    }
    match checked(fd) {
        Ok(found) => Standing::Ours(found),
        Err(e) => Standing::Other(e),
    }
}

/// Checks a descriptor just opened: a regular file, ours, one link; closed when refused.
fn checked(fd: i32) -> Result<Found, Refused> {
    let refused = |e| {
        let _ = close(fd);
        Err(e)
    };
    let Some(st) = stat(fd) else { return refused(last()) };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return refused(Refused::NotRegular);
    }
    if st.st_uid != super::process::user_id() {
        return refused(Refused::NotOurs);
    }
    if st.st_nlink != 1 {
        return refused(Refused::Linked);
    }
    Ok(Found { fd, size: st.st_size as u64, mtime_ns: mtime_ns(&st), dev: st.st_dev, ino: st.st_ino })
}

/// Removes `name` from `dir` if it is still `file` (checked just before: a name replaced
/// meanwhile is left alone).
pub fn remove(dir: &Dir, name: &[u8], file: &Found) {
    if let (true, Ok(n)) = (file.is_at(dir, name), files::name(name)) {
        // SAFETY: a NUL-terminated name in our directory.
        cancel_held(|| unsafe { libc::unlinkat(dir.0, n.as_ptr().cast(), 0) });
    }
}


/// Whether `name` in `dir` names the file open at `fd` (our own file, still where we put it).
pub fn names(dir: &Dir, name: &[u8], fd: i32) -> bool {
    let (Ok(n), Some(own)) = (files::name(name), stat(fd)) else { return false };
    // SAFETY: fstatat fills a struct we own; n is NUL-terminated.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    (unsafe { libc::fstatat(dir.0, n.as_ptr().cast(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0) && st.st_dev == own.st_dev && st.st_ino == own.st_ino
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::files::write_all;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tm-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_unnamed_file_is_named_only_where_nothing_stands() {
        let d = tmpdir("link");
        let dir = Dir::open(d.to_str().unwrap().as_bytes()).unwrap();
        let mut f = Unnamed::create(&dir, b"out").unwrap();
        write_all(f.fd(), b"ours").unwrap();
        std::fs::write(d.join("taken"), b"theirs").unwrap();
        std::os::unix::fs::symlink(d.join("taken"), d.join("link")).unwrap();
        assert_eq!(f.link(b"taken"), Ok(false));
        assert_eq!(f.link(b"link"), Ok(false), "a symlink is a name taken, never followed");
        assert_eq!(std::fs::read(d.join("taken")).unwrap(), b"theirs");
        assert_eq!(f.link(b"out"), Ok(true));
        drop(f);
        assert_eq!(std::fs::read(d.join("out")).unwrap(), b"ours");
        let meta = std::fs::metadata(d.join("out")).unwrap();
        assert_eq!((meta.permissions().mode() & 0o777, meta.nlink()), (0o600, 1));
        let names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 3, "no temporary name left: {names:?}");
        let mut g = Unnamed::create(&dir, b"out").unwrap();
        write_all(g.fd(), b"newer").unwrap();
        g.replace(b"out").unwrap();
        drop(g);
        assert_eq!(std::fs::read(d.join("out")).unwrap(), b"newer");
        let mut seen = vec![];
        dir.for_each_name(|n| seen.push(n.to_vec()));
        seen.sort();
        assert_eq!(seen, [b"link".to_vec(), b"out".to_vec(), b"taken".to_vec()]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn without_o_tmpfile_a_random_name_stands_in_until_the_file_is_named() {
        let d = tmpdir("named");
        let dir = Dir::open(d.to_str().unwrap().as_bytes()).unwrap();
        let mut f = Unnamed::create_named(&dir, b"s.json").unwrap();
        let temp = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect::<Vec<_>>();
        assert!(temp.len() == 1 && temp[0].starts_with("s.json.tmp.") && temp[0].len() == "s.json.tmp.".len() + 16, "{temp:?}");
        write_all(f.fd(), b"x").unwrap();
        std::fs::write(d.join("taken"), b"theirs").unwrap();
        assert_eq!(f.link(b"taken"), Ok(false));
        assert_eq!(f.link(b"s.json"), Ok(true));
        drop(f);
        let names = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect::<Vec<_>>();
        assert_eq!(names.len(), 2, "the temporary name went with the naming: {names:?}");
        assert_eq!(std::fs::metadata(d.join("s.json")).unwrap().nlink(), 1);
        let mut g = Unnamed::create_named(&dir, b"s.json").unwrap();
        write_all(g.fd(), b"y").unwrap();
        g.replace(b"s.json").unwrap();
        drop(g);
        assert_eq!(std::fs::read(d.join("s.json")).unwrap(), b"y");
        drop(Unnamed::create_named(&dir, b"s.json").unwrap());
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2, "one dropped unnamed leaves no name");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn looking_never_blocks_and_refuses_what_is_not_a_plain_file_of_ours() {
        let d = tmpdir("look");
        let dir = Dir::open(d.to_str().unwrap().as_bytes()).unwrap();
        let fifo = std::ffi::CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        std::fs::write(d.join("plain"), b"x").unwrap();
        std::fs::hard_link(d.join("plain"), d.join("linked")).unwrap();
        std::fs::write(d.join("one"), b"abc").unwrap();
        std::os::unix::fs::symlink(d.join("one"), d.join("sym")).unwrap();
        assert!(matches!(look(&dir, b"fifo"), Standing::Other(Refused::NotRegular)));
        assert!(matches!(look(&dir, b"linked"), Standing::Other(Refused::Linked)));
        assert!(matches!(look(&dir, b"sym"), Standing::Other(Refused::Symlink)));
        assert!(matches!(look(&dir, b"none"), Standing::Nothing));
        let Standing::Ours(found) = look(&dir, b"one") else { panic!("a file of ours") };
        assert_eq!(found.size, 3);
        assert!(found.is_at(&dir, b"one") && !found.is_at(&dir, b"plain"));
        let mut buf = [0u8; 8];
        assert_eq!(found.read_at(&mut buf, 1), 2);
        assert!(found.try_lock());
        let Standing::Ours(again) = look(&dir, b"one") else { panic!() };
        assert!(!again.try_lock(), "held by the first open file");
        remove(&dir, b"one", &found);
        assert!(!d.join("one").exists() && !found.linked());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_private_directory_is_ours_and_closed_to_others() {
        let d = tmpdir("private");
        let parent = Dir::open(d.to_str().unwrap().as_bytes()).unwrap();
        let made = Dir::private(&parent, b"mine", true).unwrap();
        assert_eq!(std::fs::metadata(d.join("mine")).unwrap().permissions().mode() & 0o777, 0o700);
        drop(made);
        assert!(Dir::private(&parent, b"mine", true).is_ok(), "found again");
        std::fs::create_dir(d.join("open")).unwrap();
        std::fs::set_permissions(d.join("open"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(Dir::private(&parent, b"open", true).err(), Some(Refused::Os(libc::EACCES)));
        std::os::unix::fs::symlink(d.join("mine"), d.join("alias")).unwrap();
        assert_eq!(Dir::private(&parent, b"alias", false).err(), Some(Refused::Symlink));
        // Made under umask 0222 (r-x for its owner): ours, so it is mended, not refused.
        std::fs::set_permissions(d.join("mine"), std::fs::Permissions::from_mode(0o500)).unwrap();
        assert!(Dir::private(&parent, b"mine", true).is_ok());
        assert_eq!(std::fs::metadata(d.join("mine")).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
