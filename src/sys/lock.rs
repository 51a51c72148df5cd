//! The lock on the host cache and the device pools: it never allocates and never calls into the
//! malloc family, so it may be taken on every allocation path. Critical sections are short (a few
//! array scans): a waiter spins briefly, then sleeps in the kernel on a futex, so it never burns
//! the CPU its holder needs (two threads on one CPU, a SCHED_FIFO waiter). Fork safety comes from
//! holding it across fork (`at_fork`; shim/lifecycle.rs installs the handlers).
//
// Note [Locks a child inherits]
// fork() copies a lock word as it is: a lock some other thread of the parent held at that moment
// (our background thread in a pass, a report being written) stays held in the child for good,
// and the child's first use of it sleeps forever. A child forked while the background pass was
// reading the device pools hung in tm_get_stats: about 1 fork in 20,000 in fork_release.c, 1 in
// 2,000 to 6,000 in fork_mid_pass.c (with or without TENSORMALLOC_STATS=json). The host cache's lock is held across fork by the fork handlers;
// every other lock of ours is made free in the child's fork handler (`free_in_child`), and what
// it guards is then either whole (the holder only read it) or forgotten (the parent's state).
// preload-tests/c/fork_mid_pass.c forks while the background thread passes all the time.

// Note [A lock that parks]
// The word is 0 (free), 1 (held, nobody asleep) or 2 (held, someone may be asleep), as in
// Drepper's "Futexes Are Tricky". A waiter that finds it held spins SPINS times (a holder on
// another CPU is usually out within that), then marks it 2 and sleeps until an unlock that sees 2
// wakes one sleeper. The spin-then-yield lock this replaced left a waiter on the holder's own CPU
// waiting up to 80 ms behind a churning thread, and a SCHED_FIFO waiter for seconds.

// Note [Inside our own work]
// A signal handler runs on whatever thread the signal lands on, maybe one inside our code, with
// a lock of ours held or a range in transit; a handler that calls mmap(MAP_FIXED) or munmap
// reaches the claim (Note [Ranges the program claims] in host/host_layer/claim.rs), which takes
// the cache lock and waits for ranges in transit: on that thread it would wait for itself, for
// good. So each thread counts the locks and gates of ours it is taking or holds (a thread-local
// counter: no allocation, no destructor; counted before the lock is tried, so a handler that
// lands mid-acquire sees it too), and the claim steps aside where it is not zero (`held_here`).
// The thread that holds the cache lock across a fork counts it until the lock is let go.

use core::cell::{Cell, UnsafeCell};
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{compiler_fence, AtomicU32, AtomicUsize, Ordering};

thread_local! {
    static HELD_HERE: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is taking or holds a lock or gate of ours (Note [Inside our own work]).
pub fn held_here() -> bool {
    HELD_HERE.with(|h| h.get() != 0)
}

/// In a forked child whose fork hold on a lock another way let go (an adoption, Note [Children
/// our handlers did not see] in fork_mark.rs): the hold no longer counts on this thread.
pub fn fork_hold_let_go() {
    HELD_HERE.with(|h| h.set(h.get().saturating_sub(1)));
}

/// Counts this thread in; returns its counter, for `count_out` (a thread-local's address costs
/// a call into the loader from a shared library: one per lock, not two).
fn count_in() -> Here {
    let here = HELD_HERE.with(|h| {
        h.set(h.get().wrapping_add(1));
        Here(h as *const Cell<u32>)
    });
    // Before the lock word is touched, as a handler on this thread would see it.
    compiler_fence(Ordering::SeqCst);
    here
}

/// The counter of the thread that holds a guard or pass (never sent to another thread).
struct Here(*const Cell<u32>);

impl Here {
    fn count_out(&self) {
        compiler_fence(Ordering::SeqCst);
        // SAFETY: this thread's own counter, which lives as long as the thread (guards and
        // passes are dropped by the thread that made them).
        let h = unsafe { &*self.0 };
        h.set(h.get().saturating_sub(1));
    }
}

const FREE: u32 = 0;
const HELD: u32 = 1;
const HELD_WAITERS: u32 = 2;
/// Checks of the word before sleeping (each with a pause): about the length of a critical section.
const SPINS: u32 = 64;

pub struct Lock<T> {
    state: AtomicU32,
    /// The thread that holds it across a fork (`thread::key`), 0 at other times.
    fork_holder: AtomicUsize,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialized by `state`.
unsafe impl<T: Send> Sync for Lock<T> {}
// SAFETY: as above; the lock owns its value.
unsafe impl<T: Send> Send for Lock<T> {}

pub struct Guard<'a, T> {
    lock: &'a Lock<T>,
    /// Taken again by the thread that holds it across a fork: dropping it leaves it held.
    reentered: bool,
    here: Here,
}

impl<T> Lock<T> {
    pub const fn new(value: T) -> Self {
        Lock { state: AtomicU32::new(FREE), fork_holder: AtomicUsize::new(0), value: UnsafeCell::new(value) }
    }

    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        let here = count_in();
        if self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_err() {
            let reentered = self.lock_contended();
            return Guard { lock: self, reentered, here };
        }
        Guard { lock: self, reentered: false, here }
    }

    /// The lock when it is free now; None at once when anyone holds it (a caller that may hold
    /// it itself: Note [Exit from inside our work] in shim/lifecycle.rs).
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        let here = count_in();
        if self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return Some(Guard { lock: self, reentered: false, here });
        }
        here.count_out();
        None
    }

    /// Waits for the lock; true when this thread already holds it across a fork (Note [Fork
    /// handlers that allocate] in host/host_layer/fork.rs): it is asked again from another library's
    /// fork handler, which runs between ours, and gets it at once.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> bool {
        // Only this thread could have stored its own key; another's never equals it.
        if self.fork_holder.load(Ordering::Relaxed) == super::thread::key() {
            return true;
        }
        // A holder may be a thread of the parent of a child made without our fork handlers: the
        // child adopts first, which frees our locks (Note [Children our handlers did not see]).
        super::fork_mark::check();
        for _ in 0..SPINS {
            core::hint::spin_loop();
            if self.state.load(Ordering::Relaxed) == FREE
                && self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return false;
            }
        }
        // From here on the word says "maybe waiters" while we hold it: one unlock may wake a
        // thread for nothing, never miss one.
        while self.state.swap(HELD_WAITERS, Ordering::Acquire) != FREE {
            futex_wait(&self.state, HELD_WAITERS);
        }
        false
    }

    fn unlock(&self) {
        if self.state.swap(FREE, Ordering::Release) == HELD_WAITERS {
            futex_wake_one(&self.state);
        }
    }

    /// Takes the lock and leaks the guard: for the fork "prepare" handler, paired with
    /// `force_unlock` in the parent and child handlers.
    /// The forking thread may take it again meanwhile (`Guard::reentered`).
    pub fn lock_for_fork(&self) {
        core::mem::forget(self.lock());
        self.fork_holder.store(super::thread::key(), Ordering::Relaxed);
    }

    /// Whether this thread holds it across a fork (its fork handlers, and others' run between
    /// them, may take it again).
    pub fn held_across_fork_here(&self) -> bool {
        self.fork_holder.load(Ordering::Relaxed) == super::thread::key()
    }

    /// # Safety
    /// Only after `lock_for_fork` by this thread (or its forked child, where no other thread
    /// exists: a wake there finds no one).
    pub unsafe fn force_unlock(&self) {
        self.fork_holder.store(0, Ordering::Relaxed);
        self.unlock();
        // The leaked guard's count (Note [Inside our own work]).
        fork_hold_let_go();
    }

    #[cfg(test)]
    pub fn held(&self) -> bool {
        self.state.load(Ordering::Relaxed) != FREE
    }

    /// In a forked child: whoever held the lock at the fork (a thread of the parent) is not in
    /// this process, and the lock is free (Note [Locks a child inherits]).
    ///
    /// # Safety
    /// Only in a forked child, before any thread of it can hold the lock, and only where what
    /// the lock guards is whole whatever the parent's holder was doing (it only read, or the
    /// child forgets the value).
    pub unsafe fn free_in_child(&self) {
        // Written only when held: a store to a lock's page is a copy-on-write fault in the child.
        if self.state.load(Ordering::Relaxed) != FREE {
            self.fork_holder.store(0, Ordering::Relaxed);
            self.state.store(FREE, Ordering::Release);
        }
    }
}

#[cfg(not(miri))]
fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: a futex wait on a word we own; returns at once if the word is no longer `expected`
    // (EAGAIN) or on a signal (EINTR): the caller loops either way.
    super::stack_switch::as_the_program(|| unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, core::ptr::null::<libc::timespec>());
    });
}

#[cfg(not(miri))]
fn futex_wake_one(word: &AtomicU32) {
    // SAFETY: a futex wake on a word we own.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1) };
}

// Miri has no futex: waiting is spinning there.
#[cfg(miri)]
fn futex_wait(_word: &AtomicU32, _expected: u32) {
    std::thread::yield_now();
}

#[cfg(miri)]
fn futex_wake_one(_word: &AtomicU32) {}

impl<T> Guard<'_, T> {
    /// Taken again by the thread that holds the lock across a fork (see `lock_contended`).
    pub fn reentered(&self) -> bool {
        self.reentered
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        if !self.reentered {
            self.lock.unlock();
        }
        self.here.count_out();
    }
}

/// A count of threads inside a short section, which another thread may wait to see empty:
/// asleep on a futex (so the threads it waits for have its CPU), woken by the last one out.
/// The fork's prepare handler waits on one for ranges in transit (Note [Fork at the fork] in
/// host/host_layer/fork.rs).
pub struct Gate {
    inside: AtomicU32,
    /// A thread waits for `inside` to reach 0: the last one out wakes it.
    waiting: core::sync::atomic::AtomicBool,
}

/// One thread inside a `Gate`, until dropped.
pub struct Pass<'a>(&'a Gate, Here);

impl Gate {
    pub const fn new() -> Self {
        Gate { inside: AtomicU32::new(0), waiting: core::sync::atomic::AtomicBool::new(false) }
    }

    pub fn enter(&self) -> Pass<'_> {
        let here = count_in();
        self.inside.fetch_add(1, Ordering::SeqCst);
        Pass(self, here)
    }

    /// Forgets every thread inside (a forked child, where they do not exist).
    pub fn clear(&self) {
        self.inside.store(0, Ordering::SeqCst);
        self.waiting.store(false, Ordering::SeqCst);
    }

    /// Whether a thread is inside now.
    pub fn occupied(&self) -> bool {
        self.inside.load(Ordering::SeqCst) != 0
    }

    /// Waits until nobody is inside, or `deadline_ns` passes on `clock` (monotonic ns).
    pub fn wait_empty(&self, clock: fn() -> u64, deadline_ns: u64) {
        self.wait_until(clock, deadline_ns, || false);
    }

    /// Waits until nobody is inside, `enough()` holds, or `deadline_ns` passes. `enough` is
    /// asked after each read of the count, so what a thread changes before it leaves is seen:
    /// by this look, or by the next, which its leaving wakes.
    pub fn wait_until(&self, clock: fn() -> u64, deadline_ns: u64, enough: impl Fn() -> bool) {
        loop {
            // Announced first, read after (both SeqCst, as the exit's decrement and read are): a
            // thread leaving after this read sees the announcement and wakes us.
            self.waiting.store(true, Ordering::SeqCst);
            let inside = self.inside.load(Ordering::SeqCst);
            if inside == 0 || enough() || clock() >= deadline_ns {
                break;
            }
            // A millisecond at most: a wake lost to a signal costs no more.
            futex_wait_for(&self.inside, inside, 1_000_000);
        }
        self.waiting.store(false, Ordering::SeqCst);
    }

    #[cfg(test)]
    pub fn inside(&self) -> u32 {
        self.inside.load(Ordering::SeqCst)
    }

    /// Whether a thread waits for the gate to empty.
    #[cfg(test)]
    pub fn awaited(&self) -> bool {
        self.waiting.load(Ordering::SeqCst)
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        // Every leaving wakes a waiter, not only the last: one may wait for this thread alone
        // (`wait_until`).
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
        if self.0.waiting.load(Ordering::SeqCst) {
            futex_wake_all(&self.0.inside);
        }
        self.1.count_out();
    }
}

#[cfg(not(miri))]
fn futex_wait_for(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let t = super::clock::timespec(timeout_ns);
    // SAFETY: a futex wait on a word we own with a relative timeout on our stack; returns at once
    // if the word is no longer `expected`.
    super::stack_switch::as_the_program(|| unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, &t as *const libc::timespec);
    });
}

#[cfg(not(miri))]
fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: a futex wake on a word we own.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
}

#[cfg(miri)]
fn futex_wait_for(_word: &AtomicU32, _expected: u32, _timeout_ns: u64) {
    std::thread::yield_now();
}

#[cfg(miri)]
fn futex_wake_all(_word: &AtomicU32) {}

/// Registers fork handlers with the C library: `prepare` runs in the forking thread before
/// fork, `parent` and `child` after it on each side (pthread_atfork).
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: registers three functions with static lifetime.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_gate_wakes_its_waiter_when_the_last_one_leaves() {
        let gate = Arc::new(Gate::new());
        let pass = gate.enter();
        let inside = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let p = gate.enter();
                std::thread::sleep(std::time::Duration::from_millis(20));
                drop(p);
            })
        };
        drop(pass);
        while gate.inside() == 0 && !inside.is_finished() {
            std::thread::yield_now();
        }
        gate.wait_empty(crate::sys::clock::now_ns, u64::MAX);
        assert_eq!(gate.inside(), 0);
        inside.join().unwrap();
        let stuck = gate.enter();
        let start = crate::sys::clock::now_ns();
        gate.wait_empty(crate::sys::clock::now_ns, start + 5_000_000);
        assert_eq!(gate.inside(), 1, "a bounded wait ends with someone still inside");
        drop(stuck);
    }

    /// Note [Inside our own work]: a thread counts the locks and gates it holds, across a fork's
    /// leaked guard too.
    #[test]
    fn a_thread_knows_it_holds_a_lock_or_a_gate() {
        let (lock, gate) = (Lock::new(0u8), Gate::new());
        assert!(!held_here());
        {
            let _held = lock.lock();
            assert!(held_here());
            let pass = gate.enter();
            drop(_held);
            assert!(held_here(), "the pass still counts");
            drop(pass);
        }
        assert!(!held_here());
        lock.lock_for_fork();
        assert!(held_here());
        let again = lock.lock();
        assert!(again.reentered());
        drop(again);
        assert!(held_here(), "the fork's own hold stays");
        // SAFETY: after lock_for_fork by this thread.
        unsafe { lock.force_unlock() };
        assert!(!held_here());
        std::thread::spawn(|| assert!(!held_here(), "per thread")).join().unwrap();
    }

    #[test]
    fn serializes_increments() {
        let rounds = crate::sim::rounds(10_000, 200);
        let lock = Arc::new(Lock::new(0u64));
        // More threads than this machine has cores: waiters sleep and must all be woken.
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..rounds {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 8 * rounds as u64);
        assert_eq!(lock.state.load(Ordering::Relaxed), FREE);
    }

    #[test]
    fn a_sleeper_is_woken_by_the_unlock() {
        let lock = Arc::new(Lock::new(0u32));
        let guard = lock.lock();
        let waiter = {
            let lock = lock.clone();
            std::thread::spawn(move || *lock.lock() += 1)
        };
        // The waiter marks the word once its spin is over; then it sleeps until the unlock.
        while lock.state.load(Ordering::Relaxed) != HELD_WAITERS {
            std::thread::yield_now();
        }
        drop(guard);
        waiter.join().unwrap();
        assert_eq!(*lock.lock(), 1);
    }

    /// Note [Locks a child inherits]: a lock another thread held at the fork is free in the
    /// child, and works as before.
    #[test]
    fn a_child_frees_a_lock_a_thread_of_the_parent_held() {
        let lock = Arc::new(Lock::new(5u32));
        let holder = Arc::clone(&lock);
        std::thread::spawn(move || core::mem::forget(holder.lock())).join().unwrap();
        assert!(lock.held(), "held by a thread that is gone, as in a forked child");
        // SAFETY: no thread holds it: its holder ended.
        unsafe { lock.free_in_child() };
        assert!(!lock.held());
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 6);
        assert!(!lock.held());
    }

    #[test]
    fn fork_handlers_pair_up() {
        let lock = Lock::new(());
        lock.lock_for_fork();
        assert_ne!(lock.state.load(Ordering::Relaxed), FREE);
        // SAFETY: lock_for_fork ran on this thread.
        unsafe { lock.force_unlock() };
        assert_eq!(lock.state.load(Ordering::Relaxed), FREE);
        drop(lock.lock());
    }

    #[test]
    fn the_forking_thread_takes_it_again_and_others_wait() {
        let lock = Arc::new(Lock::new(0u32));
        lock.lock_for_fork();
        {
            // Another library's fork handler, on the forking thread.
            let mut again = lock.lock();
            assert!(again.reentered());
            *again += 1;
        }
        assert_ne!(lock.state.load(Ordering::Relaxed), FREE, "dropping the reentered guard leaves it held");
        let other = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                let mut g = lock.lock();
                assert!(!g.reentered());
                *g += 1;
            })
        };
        while lock.state.load(Ordering::Relaxed) != HELD_WAITERS {
            std::thread::yield_now();
        }
        // SAFETY: lock_for_fork ran on this thread.
        unsafe { lock.force_unlock() };
        other.join().unwrap();
        let after = lock.lock();
        assert!(!after.reentered(), "after the fork, no thread is the fork's");
        assert_eq!(*after, 2);
    }
}
