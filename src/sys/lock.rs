//! A spin lock that never allocates and never calls into the malloc family, so it may be taken
//! on every allocation path. Critical sections are short (a few array scans): spin briefly,
//! then yield the CPU. Fork safety comes from holding it across fork (lib.rs installs the handlers).

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialized by `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above; the lock owns its value.
unsafe impl<T: Send> Send for SpinLock<T> {}

pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                spins = spins.wrapping_add(1);
                if spins < 64 {
                    core::hint::spin_loop();
                } else {
                    // SAFETY: sched_yield has no preconditions.
                    #[cfg(not(miri))]
                    unsafe {
                        libc::sched_yield()
                    };
                }
            }
        }
        SpinGuard { lock: self }
    }

    /// Takes the lock and leaks the guard: for the fork "prepare" handler, paired with
    /// `force_unlock` in the parent and child handlers.
    pub fn lock_for_fork(&self) {
        core::mem::forget(self.lock());
    }

    /// # Safety
    /// Only after `lock_for_fork` by this thread (or its forked child).
    pub unsafe fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn serializes_increments() {
        let rounds = crate::sim::rounds(10_000, 200);
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
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
        assert_eq!(*lock.lock(), 4 * rounds as u64);
    }
}
