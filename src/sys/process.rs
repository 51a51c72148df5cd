//! This process as the kernel knows it: the calling thread's errno and its text, the ids, when
//! the process and this image started, its ancestors (/proc/PID/stat), its command name, and the
//! abort glibc answers a corrupted heap with. Reads of /proc and /sys go through
//! `read_kernel_file` here (sys/files.rs builds on this file, never the other way round).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// The calling thread's errno.
pub fn errno() -> i32 {
    // SAFETY: errno is thread-local and always readable.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: errno is thread-local and always writable.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's errno as a call found it, put back when the call succeeds (Note [errno on
/// success] in route.rs): the thread's errno is looked up once for both.
pub struct SavedErrno {
    at: *mut i32,
    value: i32,
}

impl SavedErrno {
    #[inline(always)]
    pub fn save() -> Self {
        // SAFETY: errno is thread-local and always readable.
        let at = unsafe { libc::__errno_location() };
        SavedErrno { at, value: unsafe { *at } }
    }

    /// Only on the thread that saved it (the value is not Send: it holds a raw pointer).
    #[inline(always)]
    pub fn restore(&self) {
        // SAFETY: the calling thread's errno, which lives as long as the thread.
        unsafe { *self.at = self.value };
    }
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

/// When this image started (wall ns: the library's load, or in a forked child its fork).
static STARTED_WALL_NS: AtomicU64 = AtomicU64::new(0);
/// The process's start in clock ticks after boot (/proc/self/stat field 22: the same across
/// exec, new in a forked child), read once, when first needed (an output claims a name: by
/// default a process reads no file); UNKNOWN until then, 0 when there is no /proc.
static START_TICKS: AtomicU64 = AtomicU64::new(UNKNOWN);
/// The process's start in wall ns, from START_TICKS (see `ticks_to_wall_ns`).
static PROCESS_STARTED_WALL_NS: AtomicU64 = AtomicU64::new(0);
const UNKNOWN: u64 = u64::MAX;

/// At load, and in a forked child: this image starts now (the process's own start is read when
/// first asked for), and it is this process's.
pub fn note_start() {
    STARTED_WALL_NS.store(super::clock::wall_ns(), Relaxed);
    START_TICKS.store(UNKNOWN, Relaxed);
    IMAGE_OWNER.store(id(), Relaxed);
    PARENT.store(parent_now(), Relaxed);
}

/// The process whose memory this is (`note_start`); 0 before load.
static IMAGE_OWNER: AtomicU32 = AtomicU32::new(0);

/// Whether this process runs in another's memory: a vfork child, or one made by clone with
/// CLONE_VM, before it execs or exits (or a raw fork child that has not yet adopted its parent's
/// records: Note [Children our handlers did not see] in fork_mark.rs). One system call.
pub fn in_anothers_memory() -> bool {
    let owner = IMAGE_OWNER.load(Relaxed);
    owner != 0 && owner != id()
}

/// When this image started (wall ns).
pub fn started_wall_ns() -> u64 {
    STARTED_WALL_NS.load(Relaxed)
}

/// Reads the process's start, once.
fn read_start() -> u64 {
    let ticks = START_TICKS.load(Relaxed);
    if ticks != UNKNOWN {
        return ticks;
    }
    let image = STARTED_WALL_NS.load(Relaxed);
    let image = if image == 0 { super::clock::wall_ns() } else { image };
    let ticks = stat_of(0).map_or(0, |s| s.start_ticks);
    PROCESS_STARTED_WALL_NS.store(if ticks == 0 { image } else { ticks_to_wall_ns(ticks).min(image) }, Relaxed);
    START_TICKS.store(ticks, Relaxed);
    ticks
}

/// When this process started (wall ns; the same for every image it execs, to a clock tick).
pub fn process_started_wall_ns() -> u64 {
    read_start();
    PROCESS_STARTED_WALL_NS.load(Relaxed)
}

/// This process's start in clock ticks after boot; with the pid it names the process (pids are
/// reused, a start is not).
pub fn start_ticks() -> u64 {
    read_start()
}

/// Clock ticks per second, as /proc counts them.
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(100)
}

/// A start in ticks after boot as wall ns: now (wall) less the time since it (CLOCK_BOOTTIME,
/// which counts suspend as /proc's start times do). Rounded down to a tick.
fn ticks_to_wall_ns(ticks: u64) -> u64 {
    let mut boot = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut boot) };
    let boot_ns = (boot.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(boot.tv_nsec as u64);
    let start_ns = ticks.saturating_mul(1_000_000_000) / ticks_per_second();
    super::clock::wall_ns().saturating_sub(boot_ns.saturating_sub(start_ns))
}

/// The parent process's id when this process started (or forked): a process whose parent
/// ended meanwhile is reparented, and its report named pid 1 (or a subreaper) as its parent.
pub fn parent_id() -> u32 {
    match PARENT.load(Relaxed) {
        0 => parent_now(),
        parent => parent,
    }
}

/// The parent recorded at `note_start` or in a forked child (0 before either).
static PARENT: AtomicU32 = AtomicU32::new(0);

/// The parent as the kernel says now.
fn parent_now() -> u32 {
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() as u32 }
}

/// In a forked child: its parent is the process that forked it.
pub fn note_parent_in_child() {
    PARENT.store(parent_now(), Relaxed);
}

/// What /proc/PID/stat says of a process: its parent and its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    pub start_ticks: u64,
}

/// /proc/PID/stat of `pid` (0: this process); None when it is gone or unreadable.
pub fn stat_of(pid: u32) -> Option<Stat> {
    let mut path = [0u8; 32];
    let mut digits = [0u8; 20];
    let name: &[u8] = if pid == 0 { b"self" } else { decimal(u64::from(pid), &mut digits) };
    let mut at = 0;
    for &b in b"/proc/".iter().chain(name).chain(b"/stat") {
        *path.get_mut(at)? = b;
        at += 1;
    }
    let mut buf = [0u8; 512];
    let n = read_kernel_file(path.get(..=at)?, &mut buf)?;
    parse_stat(buf.get(..n)?)
}

/// The parent (field 4) and start (field 22) of a /proc/PID/stat line: fields are counted after
/// the command's closing parenthesis (a command may hold spaces and parentheses itself).
pub fn parse_stat(line: &[u8]) -> Option<Stat> {
    let close = line.iter().rposition(|&b| b == b')')?;
    // Field 3 (the state) is the first after ")"; the parent is the 2nd, the start the 20th.
    let mut fields = line.get(close + 1..)?.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let ppid = number(fields.nth(1)?)?;
    let start_ticks = number(fields.nth(17)?)?;
    Some(Stat { ppid: u32::try_from(ppid).ok()?, start_ticks })
}

fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| if d.is_ascii_digit() { n.checked_mul(10)?.checked_add(u64::from(d - b'0')) } else { None })
}

/// Whether process `pid` that started at `start_ticks` still lives (a reused pid is another).
pub fn alive(pid: u32, start_ticks: u64) -> bool {
    pid > 0 && stat_of(pid).is_some_and(|s| s.start_ticks == start_ticks)
}

/// Fills `out` with this process's ancestors, parent first: (pid, start ticks) up to pid 1 or
/// as many as fit; their number.
pub fn ancestors(out: &mut [(u32, u64)]) -> usize {
    let mut pid = match stat_of(0) {
        Some(s) => s.ppid,
        None => return 0,
    };
    let mut n = 0;
    while pid > 1 {
        let (Some(slot), Some(s)) = (out.get_mut(n), stat_of(pid)) else { break };
        *slot = (pid, s.start_ticks);
        n += 1;
        pid = s.ppid;
    }
    n
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

/// This process's command name (/proc/self/comm: argv[0]'s base name, at most 15 bytes), in
/// `buf`; empty when it cannot be read.
pub fn command_name(buf: &mut [u8; 32]) -> &[u8] {
    let n = read_kernel_file(b"/proc/self/comm\0", buf).unwrap_or(0);
    let name = buf.get(..n).unwrap_or(&[]);
    name.strip_suffix(b"\n").unwrap_or(name)
}

/// Reads up to `buf.len()` bytes of a kernel file (/proc, /sys; `path` NUL-terminated) with one
/// read(2), never blocking; the count read. None when it cannot be opened or is not a regular
/// file (something mounted over /proc could put a FIFO there).
pub fn read_kernel_file(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    if path.last() != Some(&0) {
        return None;
    }
    super::cancel::cancel_held(|| read_opened(path, buf))
}

/// `read_kernel_file`'s open, read and close (cancellation points all three).
fn read_opened(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    // SAFETY: `path` is NUL-terminated; fstat fills a struct we own; read writes at most
    // buf.len() bytes into buf.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY);
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let regular = libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG;
        let n = if regular { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } else { -1 };
        libc::close(fd);
        usize::try_from(n).ok()
    }
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

    #[test]
    fn stat_lines_are_read_after_the_command() {
        let line = b"4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10\n";
        assert_eq!(parse_stat(line), Some(Stat { ppid: 17, start_ticks: 987654 }));
        assert_eq!(parse_stat(b"1 (x) S 0 1"), None, "cut before the start");
        assert_eq!(parse_stat(b"no parenthesis"), None);
    }

    #[test]
    fn this_process_has_a_start_and_ancestors() {
        let me = stat_of(0).unwrap();
        assert_eq!(me.ppid, parent_id());
        assert!(alive(id(), me.start_ticks));
        assert!(!alive(id(), me.start_ticks + 1), "another start: another process");
        let mut out = [(0, 0); 8];
        let n = ancestors(&mut out);
        assert!(n >= 1 && out[0].0 == parent_id(), "{:?}", &out[..n]);
        note_start();
        assert!(process_started_wall_ns() <= started_wall_ns() && started_wall_ns() - process_started_wall_ns() < 3600 * 1_000_000_000);
    }

    #[test]
    fn a_start_time_is_read_past_a_command_with_spaces_and_parentheses() {
        let process_started = |pid| stat_of(pid).map(|s| s.start_ticks);
        let me = process_started(std::process::id()).unwrap();
        let dir = std::env::temp_dir().join(format!("tm-started-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let odd = dir.join("a) 1 (2");
        std::os::unix::fs::symlink("/bin/sleep", &odd).unwrap(); // a copy could be busy: another test forks
        let mut child = std::process::Command::new(&odd).arg("5").spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        assert!(stat.contains("(a) 1 (2)"), "{stat}");
        let expected: u64 = stat.rsplit_once(") ").unwrap().1.split(' ').nth(19).unwrap().parse().unwrap();
        assert_eq!(process_started(child.id()), Some(expected));
        assert!(expected >= me);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(process_started(child.id()), None, "ended and waited for");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
