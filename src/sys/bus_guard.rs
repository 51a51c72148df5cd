//! Files we map shared that someone else may shorten: a SIGBUS from touching a page past the
//! file's new end is answered by putting private zeroed memory in place of our mapping, so the
//! program goes on (Note [Files shortened under us]). Every other SIGBUS is the program's.

use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

// Note [Files shortened under us]
// The counters of TENSORMALLOC_STATS live in a file mapped shared (Note [Numbers that survive]),
// and the file is the user's: emptying it (`: > stats.json`, logrotate's copytruncate) left our
// mapping past its end, and the next count killed the program with SIGBUS, where without the
// setting nothing happens. So while such a mapping exists a SIGBUS handler of ours is installed.
// A fault inside one of our covered ranges maps private zeroed memory over the whole range
// (mmap MAP_FIXED, safe in a signal handler) and returns: the count is retried there, and the
// numbers go on in memory only (the emptied file is not written again until the exit report).
// Any other SIGBUS goes to the handler the program had before ours, or, with none, to the
// default action as if we were not there. A handler the program installs after ours replaces it,
// as it would any other.

const SLOTS: usize = 4;
/// Covered ranges (start, length); 0 length: a free slot.
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENGTHS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// A covered range was replaced: its file was shortened.
static SHORTENED: AtomicBool = AtomicBool::new(false);

/// The handler that was in place before ours, written once before ours is installed.
struct Previous(UnsafeCell<libc::sigaction>);
// SAFETY: written once, by the one thread that wins INSTALLED, before the handler that reads it
// is installed; read only by that handler.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(UnsafeCell::new(unsafe { core::mem::zeroed() }));

/// Covers `[start, start + len)`, a shared mapping of a file others may shorten; false when
/// every slot is taken (the range is then not covered).
pub fn cover(start: *mut u8, len: usize) -> bool {
    install();
    for (s, l) in STARTS.iter().zip(LENGTHS.iter()) {
        if l.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            s.store(start as usize, Ordering::Release);
            l.store(len, Ordering::Release);
            return true;
        }
    }
    false
}

/// Stops covering the range starting at `start` (before it is unmapped).
pub fn uncover(start: *mut u8) {
    for (s, l) in STARTS.iter().zip(LENGTHS.iter()) {
        let len = l.load(Ordering::Acquire);
        if len != 0 && len != usize::MAX && s.load(Ordering::Acquire) == start as usize {
            l.store(0, Ordering::Release);
        }
    }
}

/// Whether a covered file was shortened under us (its numbers now live in memory only).
pub fn shortened() -> bool {
    SHORTENED.load(Ordering::Relaxed)
}

fn install() {
    if INSTALLED.load(Ordering::Acquire) || INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: a sigaction of our own, with a handler that only makes async-signal-safe calls;
    // the previous one is saved first, for the handler to hand other faults to.
    unsafe {
        let mut ours: libc::sigaction = core::mem::zeroed();
        ours.sa_sigaction = on_sigbus as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        libc::sigemptyset(&mut ours.sa_mask);
        // One call: a handler another thread installs meanwhile is the one saved.
        libc::sigaction(libc::SIGBUS, &ours, PREVIOUS.0.get());
    }
}

/// The covered range holding `addr`, if any.
fn covering(addr: usize) -> Option<(usize, usize)> {
    STARTS.iter().zip(LENGTHS.iter()).find_map(|(s, l)| {
        // The length read on both sides of the start: a slot freed and taken again in between
        // never pairs one range's start with another's length.
        let len = l.load(Ordering::Acquire);
        let start = s.load(Ordering::Acquire);
        let still = l.load(Ordering::Acquire) == len;
        (still && len != 0 && len != usize::MAX && addr >= start && addr - start < len).then_some((start, len))
    })
}

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A fault (code > 0) inside our mapping: private zeroed memory in its place, then retry.
    if code > 0 {
        if let Some((start, len)) = covering(addr) {
            // SAFETY: replaces exactly our own mapping; mmap is async-signal-safe.
            let p = unsafe {
                libc::syscall(libc::SYS_mmap, start, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0)
            };
            if p as usize == start {
                SHORTENED.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
    hand_on(signal, info, context);
}

/// The program's SIGBUS, as if our handler were not there: its earlier handler with that
/// action's mask and flags, or the action the kernel would take.
fn hand_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: PREVIOUS was written before our handler could run; every call below is
    // async-signal-safe (sigaction, sigprocmask, signals to the calling thread).
    unsafe {
        let previous = &*PREVIOUS.0.get();
        let action = previous.sa_sigaction;
        let sent = (*info).si_code <= 0;
        if action == libc::SIG_IGN && sent {
            return; // ignored, as it would be; ours stays for the file
        }
        if action == libc::SIG_DFL || action == libc::SIG_IGN {
            // The default action (the kernel forces it for a fault even where the signal is
            // ignored): put back, and the signal raised again, delivered once we return.
            let mut default: libc::sigaction = core::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &default, core::ptr::null_mut());
            libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::syscall(libc::SYS_gettid), signal);
            return;
        }
        // The mask and flags the kernel would have applied for that action.
        let mut before: libc::sigset_t = core::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &previous.sa_mask, &mut before);
        if previous.sa_flags & libc::SA_NODEFER != 0 {
            let mut bus: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut bus);
            libc::sigaddset(&mut bus, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &bus, core::ptr::null_mut());
        }
        if previous.sa_flags & libc::SA_RESETHAND != 0 {
            let mut default: libc::sigaction = core::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &default, core::ptr::null_mut());
        }
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) = core::mem::transmute(action);
            handler(signal, info, context);
        } else {
            let handler: extern "C" fn(libc::c_int) = core::mem::transmute(action);
            handler(signal);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, core::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_shortened_under_a_covered_mapping_leaves_zeroed_memory_in_its_place() {
        let path = std::env::temp_dir().join(format!("tm-bus-guard-{}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        file.set_len(8192).unwrap();
        use std::os::fd::AsRawFd;
        let map = super::super::files::map_shared(file.as_raw_fd(), 8192).expect("a mapping");
        // SAFETY: our own fresh mapping of 8192 bytes.
        unsafe { map.add(4096).write_volatile(7) };
        file.set_len(0).unwrap();
        // SAFETY: past the file's end now: the fault is answered with zeroed memory.
        let seen = unsafe {
            map.add(4096).write_volatile(9);
            map.add(4096).read_volatile()
        };
        assert_eq!(seen, 9);
        assert!(shortened());
        assert!(covering(map as usize + 100).is_some());
        // SAFETY: nothing uses the mapping any more.
        unsafe { super::super::files::unmap(map, 8192) };
        assert!(covering(map as usize + 100).is_none());
        std::fs::remove_file(&path).unwrap();
    }
}
