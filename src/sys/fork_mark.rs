//! A page that tells a child our fork handlers never saw: one word, wiped to zero in every child
//! the kernel makes by copy (MADV_WIPEONFORK), set again by our child handler. A zero found there
//! means the process was made by `_Fork()` or a raw clone/fork system call, and what the parent
//! left in our records is adopted then (Note [Children our handlers did not see]).
//
// Note [Children our handlers did not see]
// glibc's `_Fork()` and a fork or clone made with `syscall()` (bubblewrap, systemd's namespace
// forks, Chromium's zygote do so, then go on calling malloc in the child) run no fork handler.
// Such a child inherited our records as they were at the fork: cached blocks kept from children
// (MADV_DONTFORK) that are not in it, ranges waiting to be unmapped, and the cache lock held for
// good if our background thread was in a pass. A large malloc there handed out the address of a
// kept block, where the child's own mmap had since landed (its data overwritten: glibc alone
// serves it fresh memory), a trim unmapped the child's own mappings, and a malloc could sleep
// forever on the lock. So at load a page of ours is advised MADV_WIPEONFORK with its word set (it
// was once done when the thread first ran or a fork was first prepared, but a child must also
// know it is not its parent when the parent forked before either: Note [A child in our memory]
// in reaper.rs); every
// taking of the cache lock, every CUDA entry, every wait for a lock of ours and our fork's
// prepare handler read the word first (one load). Zero: the first thread to see it
// claims the adoption and runs what our child handler would have (the lock made free, the
// parent's records forgotten without a system call, our threads counted gone), then sets the
// word; another thread that sees it meanwhile waits for the word. Our own child handler sets the
// word first, so it never adopts twice; when another library's child handler, run before ours,
// allocated first and adopted, ours finds the word set and leaves the rest alone. Without
// MADV_WIPEONFORK (kernels before 4.14, a filter refusing it) the page is given up and such
// children are served as before. Costs one mapping and one madvise per process, once.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed, Release}};

/// The word's values: a child our handlers did not see, ours, being adopted.
const UNSEEN: u32 = 0;
const SEEN: u32 = 1;
const ADOPTING: u32 = 2;

/// The word in the wiped page; null until armed (or when the page could not be had).
static WORD: AtomicPtr<AtomicU32> = AtomicPtr::new(core::ptr::null_mut());
/// Armed once: 0 not yet, 1 under way or done.
static ARMING: AtomicU32 = AtomicU32::new(0);
/// What adopting runs (a `fn()`, set at load); 0: nothing.
static ADOPT: AtomicUsize = AtomicUsize::new(0);

/// What a child our handlers did not see runs before it touches our records (the library's
/// load hook sets it).
pub fn set_adoption(adopt: fn()) {
    ADOPT.store(adopt as usize, Release);
}

/// Maps the page and sets its word, once per process (and again in no child: the mapping is
/// inherited, wiped). Quiet when it cannot be had.
pub fn arm() {
    if ARMING.load(Relaxed) != 0 || ARMING.swap(1, AcqRel) != 0 {
        return;
    }
    use super::page_calls::{madvise, mmap, munmap};
    // SAFETY: a fresh private page of our own (one page: locked under mlockall, as any).
    let page = unsafe { mmap(core::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    if page == libc::MAP_FAILED {
        return;
    }
    // SAFETY: advice on the page we just mapped, unmapped again if refused.
    if unsafe { madvise(page, 4096, libc::MADV_WIPEONFORK) } != 0 {
        // SAFETY: the page is ours and unused.
        unsafe { munmap(page, 4096) };
        return;
    }
    let word = page.cast::<AtomicU32>();
    // SAFETY: a fresh page of ours, aligned for the word.
    unsafe { (*word).store(SEEN, Release) };
    WORD.store(word, Release);
}

/// Whether this process is a child our handlers did not see; adopts what the parent left first
/// when it is (Note [Children our handlers did not see]). One load when nothing is to be done.
#[inline(always)]
pub fn check() {
    let word = WORD.load(Relaxed);
    // SAFETY: WORD is null or our page's word, never unmapped.
    if !word.is_null() && unsafe { (*word).load(Relaxed) } != SEEN {
        adopt_once(word);
    }
}

#[cold]
#[inline(never)]
fn adopt_once(word: *mut AtomicU32) {
    // SAFETY: as in check.
    let word = unsafe { &*word };
    if word.compare_exchange(UNSEEN, ADOPTING, Acquire, Acquire).is_ok() {
        ADOPTER.store(super::thread::key(), Relaxed);
        run_adoption();
        ADOPTER.store(0, Relaxed);
        word.store(SEEN, Release);
        return;
    }
    // The adoption takes our locks itself, and goes on.
    if ADOPTER.load(Relaxed) == super::thread::key() {
        return;
    }
    // Another thread adopts: a few microseconds, no lock or system call of its own.
    while word.load(Acquire) == ADOPTING {
        super::thread::yield_now();
    }
}

/// The thread running the adoption (`thread::key`), 0 at other times.
static ADOPTER: AtomicUsize = AtomicUsize::new(0);

fn run_adoption() {
    let f = ADOPT.load(Acquire);
    if f != 0 {
        // SAFETY: only set_adoption stores here, a `fn()`.
        unsafe { core::mem::transmute::<usize, fn()>(f)() };
    }
}

/// Our child handler, first thing: true when it is to do its work (nothing adopted the parent's
/// records yet in this process), and the word says so from then on.
pub fn claim_in_child() -> bool {
    let word = WORD.load(Relaxed);
    if word.is_null() {
        return true;
    }
    // SAFETY: as in check.
    let word = unsafe { &*word };
    // Zero here (the page was wiped) unless another library's handler allocated and adopted.
    let claimed = word.compare_exchange(UNSEEN, SEEN, AcqRel, Acquire).is_ok();
    if !claimed {
        while word.load(Acquire) == ADOPTING {
            super::thread::yield_now();
        }
    }
    claimed
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicU32 as Count;

    static ADOPTED: Count = Count::new(0);

    fn count_adoption() {
        ADOPTED.fetch_add(1, Relaxed);
    }

    /// A child made without our handlers (a raw fork) finds the word wiped and adopts once; the
    /// process that armed it never does, and a child whose handler claimed first adopts nothing.
    #[test]
    fn a_child_our_handlers_did_not_see_adopts_once() {
        set_adoption(count_adoption);
        arm();
        arm();
        assert!(!WORD.load(Relaxed).is_null(), "MADV_WIPEONFORK is there on this kernel");
        check();
        assert_eq!(ADOPTED.load(Relaxed), 0);
        // SAFETY: the child makes only system calls and reads memory, then _exits.
        let pid = unsafe { libc::syscall(libc::SYS_fork) };
        if pid == 0 {
            check();
            check();
            let once = ADOPTED.load(Relaxed) == 1;
            let handled_later = !claim_in_child();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if once && handled_later { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        let mut status = 0;
        // SAFETY: waits for our child.
        assert_eq!(unsafe { libc::waitpid(pid as i32, &mut status, 0) }, pid as i32);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child adopted once ({status})");
        // SAFETY: as above.
        let pid = unsafe { libc::syscall(libc::SYS_fork) };
        if pid == 0 {
            let claimed = claim_in_child();
            check();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if claimed && ADOPTED.load(Relaxed) == 0 { 0 } else { 1 }) };
        }
        // SAFETY: waits for our child.
        assert_eq!(unsafe { libc::waitpid(pid as i32, &mut status, 0) }, pid as i32);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "our handler's claim leaves nothing to adopt ({status})");
        assert_eq!(ADOPTED.load(Relaxed), 0, "never in the process that armed it");
    }
}
