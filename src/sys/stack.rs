//! A stack of our own for the work that needs tens of KiB of it (the reports asked for at exit,
//! naming the trace and stats files at the first event), whatever thread it runs in.
//
// Note [A stack of our own]
// The thread that calls exit, or whose malloc is the first event, may have a small stack:
// PTHREAD_STACK_MIN is 16 KiB, and glibc's exit and malloc need a few hundred bytes of it. Our
// reports at exit take 20-40 KiB (a snapshot's buffers, the stats' JSON), and naming a file 7:
// such a thread died of a stack overflow at exit under TENSORMALLOC_STATS, _TRACE, _LEAKS or
// _SNAPSHOT_AT_EXIT. So that work runs on a stack of ours: 1 MiB mapped at its first use (a
// guard page below it, so an overflow faults instead of writing over something), switched to
// for the call and back (x86-64; elsewhere, and when the mapping or the stack itself is not to
// be had, the work runs where it is called). One thread uses it at a time; another runs in place.
// A signal handler that interrupts the work runs on our stack too: the stack is 1 MiB (its pages
// touched only as used) so that one needing more than a few hundred KiB fits, as on its thread's
// own stack (with 256 KiB, one that needed 512 KiB went past the guard page). Holding the
// program's signals there instead hung stop-the-world collectors (Boehm GC, Mono): a thread on
// our stack waiting for the cache lock, whose holder the collector had already paused, never
// took the pause signal, and the collector waited for it for good.
// The out-of-memory report keeps its text in a static buffer instead (Note [A report off the
// stack] in report/oom.rs): memory may be short right then.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::{Acquire, Release}};

const STACK_BYTES: usize = 1 << 20;
const GUARD_BYTES: usize = 4096;

/// The top of our stack once mapped (0: not yet, 1: the mapping failed).
static TOP: AtomicUsize = AtomicUsize::new(0);
static BUSY: AtomicBool = AtomicBool::new(false);

/// Runs `f` on our own stack when it can be had, else on the caller's (Note [A stack of our
/// own]); its result.
pub fn on_own_stack<T, F: FnOnce() -> T>(f: F) -> T {
    let Some(top) = stack_top() else { return f() };
    if BUSY.swap(true, Acquire) {
        return f();
    }
    let out = run_on(top, f);
    BUSY.store(false, Release);
    out
}

/// In a forked child: a use the parent had under way in another thread is not this process's
/// (one under way in this thread, a fork from a signal handler on our stack, still is).
pub fn after_fork_in_child() {
    let here = 0u8;
    let sp = &here as *const u8 as usize;
    let top = TOP.load(Acquire);
    // Written only when set: every page a child handler writes is a copy-on-write fault.
    if !(top > 1 && sp < top && sp >= top + ABOVE_TOP - STACK_BYTES) && BUSY.load(Acquire) {
        BUSY.store(false, Release);
    }
}

fn stack_top() -> Option<usize> {
    match TOP.load(Acquire) {
        0 => {
            let top = map_stack().unwrap_or(1);
            // Two threads may map one each: the loser's stays unused (1 MiB of address space).
            match TOP.compare_exchange(0, top, Release, Acquire) {
                Ok(_) => (top != 1).then_some(top),
                Err(theirs) => (theirs != 1).then_some(theirs),
            }
        }
        1 => None,
        top => Some(top),
    }
}

/// Bytes left mapped above the top: a function called first reads its caller's frame above its
/// return address (glibc's syscall() loads a sixth argument from there whether passed or not).
const ABOVE_TOP: usize = 256;

/// Maps the stack and its guard page; its top, 16-byte aligned.
fn map_stack() -> Option<usize> {
    let base = super::os_pages::map_table(STACK_BYTES + GUARD_BYTES)?;
    // SAFETY: the lowest page of the mapping we just made.
    if unsafe { super::page_calls::mprotect(base as *mut libc::c_void, GUARD_BYTES, libc::PROT_NONE) } != 0 {
        return None;
    }
    Some(base + GUARD_BYTES + STACK_BYTES - ABOVE_TOP)
}

/// The work and, once it ran, its result.
struct Job<F, T> {
    f: Option<F>,
    out: core::mem::MaybeUninit<T>,
}

#[cfg(target_arch = "x86_64")]
fn run_on<T, F: FnOnce() -> T>(top: usize, f: F) -> T {
    extern "C" fn enter<T, F: FnOnce() -> T>(arg: *mut core::ffi::c_void) {
        // SAFETY: `arg` is the Job below, alive for the call and used by this call alone.
        let job = unsafe { &mut *arg.cast::<Job<F, T>>() };
        if let Some(f) = job.f.take() {
            job.out.write(f());
        }
    }
    let mut job = Job { f: Some(f), out: core::mem::MaybeUninit::uninit() };
    // SAFETY: `top` is the 16-byte-aligned top of a mapping of ours no other thread uses (BUSY);
    // `enter` never unwinds (panic = "abort").
    unsafe { call_on(top, (&mut job as *mut Job<F, T>).cast(), enter::<T, F>) };
    // SAFETY: `enter` took the work, which was there, and wrote its result.
    unsafe { job.out.assume_init() }
}

#[cfg(not(target_arch = "x86_64"))]
fn run_on<T, F: FnOnce() -> T>(_top: usize, f: F) -> T {
    f()
}

/// Calls `f(arg)` with the stack pointer at `top`, then returns on the caller's stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn call_on(_top: usize, _arg: *mut core::ffi::c_void, _f: extern "C" fn(*mut core::ffi::c_void)) {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "mov rsp, rdi",
        "mov rdi, rsi",
        "call rdx",
        "mov rsp, rbp",
        "pop rbp",
        "ret",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_our_stack_and_comes_back() {
        let mut seen = 0usize;
        let mut sum = 0u64;
        let back = on_own_stack(|| {
            let local = [7u8; 64 << 10]; // more than a small thread's whole stack
            seen = local.as_ptr() as usize;
            sum = local.iter().map(|&b| u64::from(b)).sum();
            42
        });
        assert_eq!(back, 42);
        assert_eq!(sum, 7 * (64 << 10));
        let top = TOP.load(Acquire);
        assert!(top > 1, "the stack was mapped");
        if cfg!(target_arch = "x86_64") {
            assert!(seen < top && seen >= top + ABOVE_TOP - STACK_BYTES, "the work ran on our stack");
        }
        // A system call first thing: glibc's syscall() reads above its return address.
        // SAFETY: getpid takes no argument.
        let pid = on_own_stack(|| unsafe { libc::syscall(libc::SYS_getpid) });
        assert_eq!(pid, i64::from(std::process::id()));
        // Back on the caller's stack: a second use finds it free and runs there again.
        let mut again = 0usize;
        on_own_stack(|| again = (&again as *const usize) as usize);
        assert!(again != 0);
    }
}
