//! The files we write (stats, trace, snapshots) and the ones we look at or read (what stands at
//! a name we mean to use, our earlier files): files made with no name and then named, directories
//! held by descriptor, checked opens that never block, one write loop. No allocation: names live
//! in stack buffers. Which name a file gets is sys/claim.rs's business.
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
    /// The file there is another user's.
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
            Refused::NotOurs => "the file there is another user's",
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
fn last() -> Refused {
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
fn terminated<'a, const N: usize>(bytes: &[u8], out: &'a mut [u8; N]) -> Option<&'a [u8; N]> {
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
        let fd = unsafe { libc::open(c.as_ptr().cast(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(last());
        }
        Ok(Dir(fd))
    }

    /// The directory `name` in `parent`, made 0700 if missing (when `create`): refused unless
    /// it is a directory of ours that no one else may enter (a directory another user made
    /// first, or a link, is never used).
    pub fn private(parent: &Dir, name: &[u8], create: bool) -> Result<Dir, Refused> {
        let n = self::name(name)?;
        // SAFETY: n is NUL-terminated; mkdirat, openat and fstat take our descriptor and buffers.
        unsafe {
            if create && libc::mkdirat(parent.0, n.as_ptr().cast(), 0o700) != 0 && errno() != libc::EEXIST {
                return Err(last());
            }
            let fd = libc::openat(parent.0, n.as_ptr().cast(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
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
            let fd = libc::openat(self.0, c".".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
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
            libc::close(fd);
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = close(self.0);
    }
}

/// fstat of a descriptor we hold.
fn stat(fd: i32) -> Option<libc::stat> {
    // SAFETY: fstat fills a struct we own.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
}

/// A file's modification time, in wall ns.
fn mtime_ns(st: &libc::stat) -> u64 {
    (st.st_mtime as u64).saturating_mul(1_000_000_000).saturating_add(st.st_mtime_nsec as u64)
}

/// 16 hex digits nobody can guess (getrandom; the clock and the pid mixed in where it fails).
fn random_hex(out: &mut [u8; 16]) {
    let mut r = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into r.
    let got = unsafe { libc::getrandom((&mut r as *mut u64).cast(), 8, libc::GRND_NONBLOCK) };
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
        let fd = unsafe { libc::openat(dir.0, c".".as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
        if fd >= 0 {
            return Ok(Unnamed { fd, dir: dir.0, temp: [0; NAME_MAX_BYTES + 1] });
        }
        match errno() {
            // No O_TMPFILE on this file system (or kernel): a name of our own that no one can
            // have made first (O_EXCL fails on anything, links included).
            libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL | libc::ENOENT => {}
            e => return Err(Refused::Os(e)),
        }
        for _ in 0..8 {
            let temp = temporary_name(if base.is_empty() { b".tensormalloc" } else { base })?;
            // SAFETY: as above.
            let fd = unsafe {
                libc::openat(dir.0, temp.as_ptr().cast(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK, 0o600)
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
        let n = self::name(name)?;
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
        let n = self::name(name)?;
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
        if unsafe { libc::renameat(self.dir, self.temp.as_ptr().cast(), self.dir, n.as_ptr().cast()) } != 0 {
            return Err(last());
        }
        self.temp = [0; NAME_MAX_BYTES + 1];
        Ok(())
    }

    /// Removes the temporary name, if any (the file keeps the name it was given).
    fn drop_temp(&mut self) {
        if self.temp[0] != 0 {
            // SAFETY: a NUL-terminated name in our directory.
            unsafe { libc::unlinkat(self.dir, self.temp.as_ptr().cast(), 0) };
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
        let Ok(n) = self::name(name) else { return false };
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
        let Ok(n) = self::name(name) else { return false };
        // SAFETY: n is NUL-terminated; the descriptor is closed below.
        let fd = unsafe { libc::openat(dir.0, n.as_ptr().cast(), libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY) };
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
        let n = unsafe { libc::pread(self.fd, buf.as_mut_ptr().cast(), buf.len(), offset as libc::off_t) };
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
    let n = match self::name(name) {
        Ok(n) => n,
        Err(e) => return Standing::Other(e),
    };
    // SAFETY: n is NUL-terminated.
    let fd = unsafe { libc::openat(dir.0, n.as_ptr().cast(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY) };
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
    if let (true, Ok(n)) = (file.is_at(dir, name), self::name(name)) {
        // SAFETY: a NUL-terminated name in our directory.
        unsafe { libc::unlinkat(dir.0, n.as_ptr().cast(), 0) };
    }
}

/// An exclusive flock on `fd` without waiting; false when another open file holds one.
pub fn try_lock(fd: i32) -> bool {
    // SAFETY: flock on a descriptor the caller holds.
    unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Reserves `len` bytes of `fd`'s file on disk (fallocate; where the file system has none,
/// zeros written), so that a full disk is found now and a mapping of it never faults on one.
pub fn reserve(fd: i32, len: usize) -> Result<(), Refused> {
    // SAFETY: fallocate of a file we hold.
    if unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) } == 0 {
        return Ok(());
    }
    if errno() != libc::EOPNOTSUPP {
        return Err(last());
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
/// Note [Pages the program changed]).
pub fn map_shared(fd: i32, len: usize) -> Option<*mut u8> {
    // SAFETY: a new mapping of a file we hold, placed by the kernel.
    let p = unsafe { super::page_calls::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// Unmaps what `map_shared` mapped.
///
/// # Safety
/// Nothing uses the mapping any more.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: the caller's promise.
    unsafe { super::page_calls::munmap(p.cast(), len) };
}

/// ftruncate: the file ends at `len`.
pub fn truncate(fd: i32, len: u64) -> Result<(), Refused> {
    // SAFETY: ftruncate of a file we hold.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        return Err(last());
    }
    Ok(())
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
pub fn write_all(fd: i32, bytes: &[u8]) -> Result<(), i32> {
    write_counted(fd, bytes).map_err(|(e, _)| e)
}

/// As `write_all`; a failure also says how many bytes went out before it.
pub fn write_counted(fd: i32, mut bytes: &[u8]) -> Result<(), (i32, usize)> {
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
    Ok(())
}

/// One pwrite of all of `bytes` at `offset`; whether it all went out.
pub fn write_at(fd: i32, bytes: &[u8], offset: u64) -> bool {
    // SAFETY: the pointer and length describe a live slice.
    let n = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), offset as libc::off_t) };
    usize::try_from(n).is_ok_and(|n| n == bytes.len())
}

/// Whether `name` in `dir` names the file open at `fd` (our own file, still where we put it).
pub fn names(dir: &Dir, name: &[u8], fd: i32) -> bool {
    let (Ok(n), Some(own)) = (self::name(name), stat(fd)) else { return false };
    // SAFETY: fstatat fills a struct we own; n is NUL-terminated.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    (unsafe { libc::fstatat(dir.0, n.as_ptr().cast(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0) && st.st_dev == own.st_dev && st.st_ino == own.st_ino
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
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tm-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

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
        std::fs::remove_dir_all(&d).unwrap();
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
