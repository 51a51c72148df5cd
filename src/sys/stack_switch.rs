//! The switch between a thread's stack and ours, and who is on ours (Note [A stack of our own]
//! and Note [Signals off our stack] in stack.rs): the calls that run back on the caller's stack
//! as the program (`as_the_program`: our waits, copies of the program's memory) live here, below
//! the stack's mapping, so that the locks, the clock and the page calls may use them.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::{Acquire, Relaxed}};

pub(super) const STACK_BYTES: usize = 1 << 20;
/// The top of our stack once mapped (0: not yet, 1: the mapping failed).
pub(super) static TOP: AtomicUsize = AtomicUsize::new(0);

/// Where the thread on our stack left its own (its stack pointer at the switch).
pub(super) static CALLER_SP: AtomicUsize = AtomicUsize::new(0);
/// The thread using our stack (`this_thread`); 0 while the stack is free.
pub(super) static OWNER: AtomicUsize = AtomicUsize::new(0);
/// Whether the thread on our stack holds the program's asynchronous signals there.
pub(super) static HOLDING: AtomicBool = AtomicBool::new(false);
/// The mask they were held from, given back for waits and at the end.
pub(super) struct ProgramMask(pub(super) UnsafeCell<libc::sigset_t>);
// SAFETY: written and read only by the thread that owns the stack (OWNER), and by its signal
// handlers, which run while it does not touch it.
unsafe impl Sync for ProgramMask {}
pub(super) static PROGRAM_MASK: ProgramMask = ProgramMask(UnsafeCell::new(unsafe { core::mem::zeroed() }));

/// Bytes left mapped above the top: a function called first reads its caller's frame above its
/// return address (glibc's syscall() loads a sixth argument from there whether passed or not).
pub(super) const ABOVE_TOP: usize = 256;

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
pub(super) fn with_program_mask<T>(f: impl FnOnce() -> T) -> T {
    if !HOLDING.load(Relaxed) {
        return f();
    }
    // Not holding while the program's mask is in place: a call nested in `f` (a wait inside
    // on_own_stack inside quiet work) leaves the mask alone. It saved, over the program's mask,
    // the one with every signal held, which the end of the quiet work then kept: a forked
    // child's first realloc under TENSORMALLOC_STATS=1 left SIGTERM blocked for its life.
    HOLDING.store(false, Relaxed);
    // SAFETY: the mask this thread saved when it held the signals.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, PROGRAM_MASK.0.get(), core::ptr::null_mut()) };
    let out = f();
    // The mask as the program's handlers left it, theirs from now on.
    hold_asynchronous_signals(PROGRAM_MASK.0.get());
    HOLDING.store(true, Relaxed);
    out
}

/// Blocks every signal but those a fault raises (and those glibc keeps for itself); the mask
/// before into `was` when not null.
pub(super) fn hold_asynchronous_signals(was: *mut libc::sigset_t) {
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
pub(super) fn on_ours_now() -> bool {
    let here = 0u8;
    let sp = &here as *const u8 as usize;
    let top = TOP.load(Acquire);
    top > 1 && sp < top && sp >= top + ABOVE_TOP - STACK_BYTES
}

/// This thread, as a number no other live thread has (the address of a thread-local).
pub(super) fn this_thread() -> usize {
    thread_local! {
        static KEY: u8 = const { 0 };
    }
    KEY.with(|k| k as *const u8 as usize)
}

/// The work and, once it ran, its result.
struct Job<F, T> {
    f: Option<F>,
    out: core::mem::MaybeUninit<T>,
}

/// `f` run with the stack pointer at `top`, the caller's stack pointer stored at `caller_sp`.
#[cfg(target_arch = "x86_64")]
pub(super) fn run_on<T, F: FnOnce() -> T>(top: usize, f: F, caller_sp: *mut usize) -> T {
    extern "C" fn enter<T, F: FnOnce() -> T>(arg: *mut core::ffi::c_void) {
        // SAFETY: `arg` is the Job below, alive for the call and used by this call alone.
        let job = unsafe { &mut *arg.cast::<Job<F, T>>() };
        if let Some(f) = job.f.take() {
            job.out.write(f());
        }
    }
    let mut job = Job { f: Some(f), out: core::mem::MaybeUninit::uninit() };
    // SAFETY: `top` is the 16-byte-aligned top of a mapping of ours no other thread uses (OWNER);
    // `enter` never unwinds (panic = "abort").
    unsafe { call_on(top, (&mut job as *mut Job<F, T>).cast(), enter::<T, F>, caller_sp) };
    // SAFETY: `enter` took the work, which was there, and wrote its result.
    unsafe { job.out.assume_init() }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn run_on<T, F: FnOnce() -> T>(_top: usize, f: F, _caller_sp: *mut usize) -> T {
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
