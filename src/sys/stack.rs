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

use super::stack_switch::{hold_asynchronous_signals, on_ours_now, run_on, this_thread, with_program_mask, ABOVE_TOP, CALLER_SP, HOLDING, OWNER, PROGRAM_MASK, STACK_BYTES, TOP};
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

const GUARD_BYTES: usize = 4096;

/// Takes our stack for this thread (its owner word is the busy flag: a fork between a flag and
/// an owner set apart left a child that could find the stack busy for good); false when it is
/// in use, by another thread or by this one further up.
fn claim() -> bool {
    OWNER.compare_exchange(0, this_thread(), Acquire, Relaxed).is_ok()
}

fn let_go() {
    OWNER.store(0, Release);
}

/// Runs `f` on our own stack when it can be had, else on the caller's (Note [A stack of our
/// own]), with the program's signals as they are: for work that may wait on others' locks or on
/// files (Note [Signals off our stack]); its result.
pub fn on_own_stack<T, F: FnOnce() -> T>(f: F) -> T {
    let Some(top) = stack_top() else { return f() };
    if !claim() {
        // Inside quiet work of this thread: the program's signals for this part.
        return if HOLDING.load(Relaxed) && on_ours_now() { with_program_mask(f) } else { f() };
    }
    let out = run_on(top, f, CALLER_SP.as_ptr());
    let_go();
    out
}

/// `on_own_stack` for work that waits only through our own locks and gates: the program's
/// asynchronous signals held while it runs there (Note [Signals off our stack]).
pub fn on_own_stack_quiet<T, F: FnOnce() -> T>(f: F) -> T {
    let Some(top) = stack_top().filter(|_| cfg!(target_arch = "x86_64")) else { return f() };
    if !claim() {
        return f();
    }
    hold_asynchronous_signals(PROGRAM_MASK.0.get());
    HOLDING.store(true, Relaxed);
    let out = run_on(top, f, CALLER_SP.as_ptr());
    HOLDING.store(false, Relaxed);
    // SAFETY: the mask saved above, by this thread.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, PROGRAM_MASK.0.get(), core::ptr::null_mut()) };
    let_go();
    out
}

/// In a forked child: a use the parent had under way in another thread is not this process's
/// (one under way in this thread, a fork from a signal handler inside our work, still is).
/// Before a fork: the stack mapped now if it is not yet (Note [A stack before the fork]).
pub fn map_before_fork() {
    let _ = stack_top();
}

// Note [A stack before the fork]
// Our child handler's steps may run on our stack, which is mapped at first use. Mapped first in
// the child, it went where the kernel found room: into the hole a block advised MADV_DONTFORK
// left there, where the program then mapped its own memory (MAP_FIXED_NOREPLACE failed: half the
// runs of c/fork_kept.c, depending on whether our thread had mapped it in the parent). Mapped
// in the parent before the fork, the child inherits it and maps nothing.

pub fn after_fork_in_child() {
    // Written only when set: every page a child handler writes is a copy-on-write fault.
    let owner = OWNER.load(Acquire);
    if owner != 0 && owner != this_thread() {
        HOLDING.store(false, Relaxed);
        let_go();
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

/// Maps the stack and its guard page; its top, 16-byte aligned.
fn map_stack() -> Option<usize> {
    let base = super::os_pages::map_table(STACK_BYTES + GUARD_BYTES)?;
    // SAFETY: the lowest page of the mapping we just made.
    if unsafe { super::page_calls::mprotect(base as *mut libc::c_void, GUARD_BYTES, libc::PROT_NONE) } != 0 {
        return None;
    }
    // Unlocked after mlockall(MCL_CURRENT) with our tables: it is ours, not the program's.
    super::mapped_on_use::note_mapped(base + GUARD_BYTES, STACK_BYTES);
    Some(base + GUARD_BYTES + STACK_BYTES - ABOVE_TOP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::stack_switch::as_the_program;

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

    /// Work on our stack nested in quiet work (a report's file claimed from a realloc, a wait
    /// in it) gives the program back its own mask at the end (found by a review: the nested
    /// call saved the held mask as the program's).
    #[test]
    fn work_nested_in_quiet_work_leaves_the_programs_mask() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        for nested in [0, 1] {
            let mut ran = false;
            for _ in 0..1000 {
                on_own_stack_quiet(|| {
                    if !on_ours_now() {
                        return;
                    }
                    ran = true;
                    if nested == 0 {
                        on_own_stack(|| on_own_stack(|| ()));
                    } else {
                        on_own_stack(|| as_the_program(|| ()));
                    }
                });
                if ran {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(ran, "the stack was never free");
            assert!(!blocked_now(libc::SIGUSR1), "SIGUSR1 left blocked (case {nested})");
        }
    }
}
