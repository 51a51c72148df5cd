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
//
// Note [Signals off our stack]
// A signal handler is the program's code, and expects its thread's stack: a conservative
// collector's pause handler (Boehm GC, Mono) scans from its stack pointer up to the thread's
// stack's base, and a profiler's unwinds from there. So the work on our stack that only waits
// through our own locks and gates (`on_own_stack_quiet`: a large realloc, gathering, evictions,
// claims, a limit followed) holds the program's asynchronous signals, and every wait of ours
// made there (a futex, a sleep) and every copy of the program's memory (`as_the_program`) runs
// back on the caller's stack with the program's mask: a collector pausing the world pauses a
// thread waiting for a lock whose holder it already paused (holding signals through the wait
// hung Boehm's and Mono's way of stopping, 4 runs in 4), and a fault in the copy (a page the
// program protected) reaches the program's handler with its own mask, which may jump out of it
// (with the signals held, they stayed blocked for good after such a jump). A mask a handler
// changes there (through its ucontext) is the program's from then on. Synchronous signals
// (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) are never held: blocked, a fault would kill
// the process instead of reaching the program's handler. A fork from a handler during such a
// wait leaves the child's use of our stack its own (the owner is the forking thread). Work that may block elsewhere (making a thread: glibc's locks; writing reports:
// files) runs with the program's signals (`on_own_stack`, even inside quiet work), and a handler
// may run on our stack there: the stack is 1 MiB (its pages touched only as used) so that one
// needing a few hundred KiB fits (with 256 KiB, one that needed 512 KiB went past the guard page).
// The out-of-memory report keeps its text in a static buffer instead (Note [A report off the
// stack] in report/oom.rs): memory may be short right then.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::{Acquire, Relaxed, Release}};

const STACK_BYTES: usize = 1 << 20;
const GUARD_BYTES: usize = 4096;

/// The top of our stack once mapped (0: not yet, 1: the mapping failed).
static TOP: AtomicUsize = AtomicUsize::new(0);
static BUSY: AtomicBool = AtomicBool::new(false);

/// Where the thread on our stack left its own (its stack pointer at the switch).
static CALLER_SP: AtomicUsize = AtomicUsize::new(0);
/// The thread using our stack (`thread::key`), while BUSY.
static OWNER: AtomicUsize = AtomicUsize::new(0);
/// Whether the thread on our stack holds the program's asynchronous signals there.
static HOLDING: AtomicBool = AtomicBool::new(false);
/// The mask they were held from, given back for waits and at the end.
struct ProgramMask(UnsafeCell<libc::sigset_t>);
// SAFETY: written and read only by the thread that owns the stack (BUSY), and by its signal
// handlers, which run while it does not touch it.
unsafe impl Sync for ProgramMask {}
static PROGRAM_MASK: ProgramMask = ProgramMask(UnsafeCell::new(unsafe { core::mem::zeroed() }));

/// Runs `f` on our own stack when it can be had, else on the caller's (Note [A stack of our
/// own]), with the program's signals as they are: for work that may wait on others' locks or on
/// files (Note [Signals off our stack]); its result.
pub fn on_own_stack<T, F: FnOnce() -> T>(f: F) -> T {
    let Some(top) = stack_top() else { return f() };
    if BUSY.swap(true, Acquire) {
        // Inside quiet work of this thread: the program's signals for this part.
        return if HOLDING.load(Relaxed) && on_ours_now() { with_program_mask(f) } else { f() };
    }
    OWNER.store(super::thread::key(), Relaxed);
    let out = run_on(top, f, CALLER_SP.as_ptr());
    BUSY.store(false, Release);
    out
}

/// `on_own_stack` for work that waits only through our own locks and gates: the program's
/// asynchronous signals held while it runs there (Note [Signals off our stack]).
pub fn on_own_stack_quiet<T, F: FnOnce() -> T>(f: F) -> T {
    let Some(top) = stack_top().filter(|_| cfg!(target_arch = "x86_64")) else { return f() };
    if BUSY.swap(true, Acquire) {
        return f();
    }
    OWNER.store(super::thread::key(), Relaxed);
    hold_asynchronous_signals(PROGRAM_MASK.0.get());
    HOLDING.store(true, Relaxed);
    let out = run_on(top, f, CALLER_SP.as_ptr());
    HOLDING.store(false, Relaxed);
    // SAFETY: the mask saved above, by this thread.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, PROGRAM_MASK.0.get(), core::ptr::null_mut()) };
    BUSY.store(false, Release);
    out
}

/// Runs a wait of ours (a futex, a sleep) or a copy of the program's memory as the program's own
/// code would: from our stack, on the caller's stack below where it left it, with the program's
/// signals (Note [Signals off our stack]); elsewhere, where it is.
pub fn as_the_program(wait: impl FnOnce()) {
    if !on_ours_now() {
        return wait();
    }
    // Below the caller's red zone, 16-byte aligned: nothing of its lives there while it waits
    // for us.
    let below = CALLER_SP.load(Relaxed).saturating_sub(128) & !15;
    let mut unused = 0usize;
    // The mask changed there: a signal held until now is taken as it opens, on that stack.
    run_on(below, || with_program_mask(wait), &mut unused);
}

/// `f` with the program's mask in place, when this thread holds its signals on our stack.
fn with_program_mask<T>(f: impl FnOnce() -> T) -> T {
    if !HOLDING.load(Relaxed) {
        return f();
    }
    // SAFETY: the mask this thread saved when it held the signals.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, PROGRAM_MASK.0.get(), core::ptr::null_mut()) };
    let out = f();
    // The mask as the program's handlers left it, theirs from now on.
    hold_asynchronous_signals(PROGRAM_MASK.0.get());
    out
}

/// Blocks every signal but those a fault raises (and those glibc keeps for itself); the mask
/// before into `was` when not null.
fn hold_asynchronous_signals(was: *mut libc::sigset_t) {
    // SAFETY: a set of our own on the stack; pthread_sigmask of the calling thread.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut set);
        for synchronous in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
            libc::sigdelset(&mut set, synchronous);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, was);
    }
}

/// Whether this thread runs on our stack now.
fn on_ours_now() -> bool {
    let here = 0u8;
    let sp = &here as *const u8 as usize;
    let top = TOP.load(Acquire);
    top > 1 && sp < top && sp >= top + ABOVE_TOP - STACK_BYTES
}

/// In a forked child: a use the parent had under way in another thread is not this process's
/// (one under way in this thread, a fork from a signal handler inside our work, still is).
pub fn after_fork_in_child() {
    // Written only when set: every page a child handler writes is a copy-on-write fault.
    if BUSY.load(Acquire) && OWNER.load(Relaxed) != super::thread::key() {
        HOLDING.store(false, Relaxed);
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

/// `f` run with the stack pointer at `top`, the caller's stack pointer stored at `caller_sp`.
#[cfg(target_arch = "x86_64")]
fn run_on<T, F: FnOnce() -> T>(top: usize, f: F, caller_sp: *mut usize) -> T {
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
    unsafe { call_on(top, (&mut job as *mut Job<F, T>).cast(), enter::<T, F>, caller_sp) };
    // SAFETY: `enter` took the work, which was there, and wrote its result.
    unsafe { job.out.assume_init() }
}

#[cfg(not(target_arch = "x86_64"))]
fn run_on<T, F: FnOnce() -> T>(_top: usize, f: F, _caller_sp: *mut usize) -> T {
    f()
}

/// Calls `f(arg)` with the stack pointer at `top`, then returns on the caller's stack; the
/// caller's stack pointer (all below it free) stored at `caller_sp` first.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn call_on(_top: usize, _arg: *mut core::ffi::c_void, _f: extern "C" fn(*mut core::ffi::c_void), _caller_sp: *mut usize) {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "mov [rcx], rsp",
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

    fn blocked_now(signal: i32) -> bool {
        // SAFETY: reads this thread's mask into a set we own.
        unsafe {
            let mut now: libc::sigset_t = core::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, core::ptr::null(), &mut now);
            libc::sigismember(&now, signal) == 1
        }
    }

    #[test]
    fn quiet_work_holds_the_programs_signals_and_waits_as_the_program() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        // Another test may hold the stack: tried until this one had it.
        for _ in 0..1000 {
            let mut seen = None;
            on_own_stack_quiet(|| {
                if !on_ours_now() {
                    return;
                }
                let mut waited = (false, true, true);
                as_the_program(|| waited = (on_ours_now(), blocked_now(libc::SIGUSR1), blocked_now(libc::SIGSEGV)));
                seen = Some(((blocked_now(libc::SIGUSR1), blocked_now(libc::SIGSEGV)), waited, blocked_now(libc::SIGUSR1)));
            });
            if let Some((inside, waited, after_wait)) = seen {
                assert_eq!(inside, (true, false), "asynchronous signals held, synchronous ones not");
                assert_eq!(waited, (false, false, false), "the wait ran on the caller's stack, with its mask");
                assert!(after_wait, "held again after the wait");
                assert!(!blocked_now(libc::SIGUSR1), "the program's mask back at the end");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("the stack was never free");
    }
}
