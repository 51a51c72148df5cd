//! The lock on the host cache and the device pools: it never allocates and never calls into the
//! malloc family, so it may be taken on every allocation path. Critical sections are short (a few
//! array scans): a waiter spins briefly, then sleeps in the kernel on a futex, so it never burns
//! the CPU its holder needs (two threads on one CPU, a SCHED_FIFO waiter). Fork safety comes from
//! holding it across fork (`at_fork`; shim/lifecycle.rs installs the handlers).
//
// Note [A lock that parks]
// The word is 0 (free), 1 (held, nobody asleep) or 2 (held, someone may be asleep), as in
// Drepper's "Futexes Are Tricky". A waiter that finds it held spins SPINS times (a holder on
// another CPU is usually out within that), then marks it 2 and sleeps until an unlock that sees 2
// wakes one sleeper. The spin-then-yield lock this replaced left a waiter on the holder's own CPU
// waiting up to 80 ms behind a churning thread, and a SCHED_FIFO waiter for seconds.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU32, Ordering};

const FREE: u32 = 0;
const HELD: u32 = 1;
const HELD_WAITERS: u32 = 2;
/// Checks of the word before sleeping (each with a pause): about the length of a critical section.
const SPINS: u32 = 64;

pub struct Lock<T> {
    state: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialized by `state`.
unsafe impl<T: Send> Sync for Lock<T> {}
// SAFETY: as above; the lock owns its value.
unsafe impl<T: Send> Send for Lock<T> {}

pub struct Guard<'a, T> {
    lock: &'a Lock<T>,
}

impl<T> Lock<T> {
    pub const fn new(value: T) -> Self {
        Lock { state: AtomicU32::new(FREE), value: UnsafeCell::new(value) }
    }

    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        if self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        Guard { lock: self }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        for _ in 0..SPINS {
            core::hint::spin_loop();
            if self.state.load(Ordering::Relaxed) == FREE
                && self.state.compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return;
            }
        }
        // From here on the word says "maybe waiters" while we hold it: one unlock may wake a
        // thread for nothing, never miss one.
        while self.state.swap(HELD_WAITERS, Ordering::Acquire) != FREE {
            futex_wait(&self.state, HELD_WAITERS);
        }
    }

    fn unlock(&self) {
        if self.state.swap(FREE, Ordering::Release) == HELD_WAITERS {
            futex_wake_one(&self.state);
        }
    }

    /// Takes the lock and leaks the guard: for the fork "prepare" handler, paired with
    /// `force_unlock` in the parent and child handlers.
    pub fn lock_for_fork(&self) {
        core::mem::forget(self.lock());
    }

    /// # Safety
    /// Only after `lock_for_fork` by this thread (or its forked child, where no other thread
    /// exists: a wake there finds no one).
    pub unsafe fn force_unlock(&self) {
        self.unlock();
    }
}

#[cfg(not(miri))]
fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: a futex wait on a word we own; returns at once if the word is no longer `expected`
    // (EAGAIN) or on a signal (EINTR): the caller loops either way.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, core::ptr::null::<libc::timespec>())
    };
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
        self.lock.unlock();
    }
}

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
}
