//! Binding a library the program loads (the CUDA runtime, the driver): its entry points are
//! looked up when first needed and published once. A lookup that finds nothing is made again
//! only after the program loaded another object (glibc's count of loads), so a library loaded
//! late is bound at the next call, and a process without it pays one short walk per call. Threads
//! that find the binding missing look it up each on their own: none waits on another (a lookup
//! takes the loader's lock, which a waiter inside a library constructor may hold), and none
//! answers "no library" while another is still looking. Never allocates; may call dlsym/dlopen.

use core::cell::{Cell, UnsafeCell};
use core::ffi::{c_int, c_void};
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// One library's entry points, bound at most once.
pub struct Binding<T> {
    published: AtomicPtr<T>,
    /// Taken by the one thread that writes `storage`.
    claimed: AtomicBool,
    /// glibc's load count when a lookup last found nothing (`NEVER` before any miss).
    missed_at: AtomicU64,
    storage: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: `storage` is written once, by the thread that won `claimed`, before `published`
// (Release) makes it visible; afterwards it is only read.
unsafe impl<T: Sync> Sync for Binding<T> {}

const NEVER: u64 = u64::MAX;

thread_local! {
    /// This thread is inside a lookup: a binding asked for from within it (our dlsym asks
    /// whether the driver is bound) answers "not yet" instead of looking again. No destructor.
    static LOOKING: Cell<bool> = const { Cell::new(false) };
}

impl<T> Binding<T> {
    pub const fn new() -> Self {
        Binding {
            published: AtomicPtr::new(core::ptr::null_mut()),
            claimed: AtomicBool::new(false),
            missed_at: AtomicU64::new(NEVER),
            storage: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// The bound entry points, after `lookup` when they are not bound yet and may have been
    /// loaded since the last lookup; `None` when the library is not (yet) loaded.
    #[inline]
    pub fn get(&'static self, lookup: impl FnOnce() -> Option<T>) -> Option<&'static T> {
        let p = self.published.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published once, never changed or freed.
            return Some(unsafe { &*p });
        }
        self.bind(lookup)
    }

    pub fn is_bound(&self) -> bool {
        !self.published.load(Ordering::Acquire).is_null()
    }

    #[cold]
    fn bind(&'static self, lookup: impl FnOnce() -> Option<T>) -> Option<&'static T> {
        let loads = loads_so_far();
        if loads.is_some_and(|n| n == self.missed_at.load(Ordering::Relaxed)) {
            return None;
        }
        if LOOKING.with(|l| l.replace(true)) {
            return None;
        }
        let found = lookup();
        LOOKING.with(|l| l.set(false));
        let Some(fns) = found else {
            // Read before the lookup: a library loaded meanwhile is looked for next time.
            self.missed_at.store(loads.unwrap_or(NEVER), Ordering::Relaxed);
            return None;
        };
        Some(self.publish(fns))
    }

    fn publish(&'static self, fns: T) -> &'static T {
        if !self.claimed.swap(true, Ordering::AcqRel) {
            // SAFETY: the claim makes this thread the only writer, once; readers wait below.
            let stored: *mut T = unsafe { (*self.storage.get()).write(fns) };
            self.published.store(stored, Ordering::Release);
        }
        // Another thread won the claim: it is only copying its lookup, never blocked.
        loop {
            let p = self.published.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: as in get.
                return unsafe { &*p };
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
}

impl<T> Default for Binding<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// glibc's count of objects loaded so far (`dlpi_adds`), read from the first object's entry;
/// `None` when this glibc does not give it (every call then looks again).
fn loads_so_far() -> Option<u64> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: usize, out: *mut c_void) -> c_int {
        if size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) {
            // SAFETY: glibc passes a valid entry of `size` bytes; `out` is the Option below.
            unsafe { *(out as *mut Option<u64>) = Some((*info).dlpi_adds) };
        }
        1 // stop after the first object
    }
    let mut loads: Option<u64> = None;
    // SAFETY: the callback writes only through the pointer it is given, which outlives the call;
    // dl_iterate_phdr takes the loader's write lock and never allocates.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut loads as *mut Option<u64>).cast()) };
    loads
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicU32;

    #[test]
    fn a_miss_is_looked_up_again_only_after_a_load_and_a_hit_is_published_once() {
        static B: Binding<u32> = Binding::new();
        static LOOKUPS: AtomicU32 = AtomicU32::new(0);
        let miss = || {
            LOOKUPS.fetch_add(1, Ordering::Relaxed);
            None
        };
        assert_eq!(B.get(miss), None);
        assert_eq!(B.get(miss), None);
        assert_eq!(LOOKUPS.load(Ordering::Relaxed), 1, "nothing was loaded in between");
        // A load (of a library the test process already has: the count still grows).
        // SAFETY: valid C string; the handle is closed at once.
        let handle = unsafe { libc::dlopen(c"libm.so.6".as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null());
        let hit = || {
            LOOKUPS.fetch_add(1, Ordering::Relaxed);
            Some(7)
        };
        if loads_so_far() != Some(B.missed_at.load(Ordering::Relaxed)) {
            assert_eq!(B.get(hit), Some(&7));
            assert_eq!(LOOKUPS.load(Ordering::Relaxed), 2);
        }
        // SAFETY: the handle dlopen gave.
        unsafe { libc::dlclose(handle) };
    }

    #[test]
    fn threads_racing_a_first_lookup_all_get_the_one_published_value() {
        static B: Binding<[u64; 4]> = Binding::new();
        let got: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..16).map(|i| s.spawn(move || B.get(|| Some([i; 4])).map(|r| r as *const _ as usize))).collect();
            hs.into_iter().map(|h| h.join().unwrap().expect("every thread bound")).collect()
        });
        assert!(got.iter().all(|&p| p == got[0]), "one published copy");
        let first = B.get(|| None).unwrap();
        assert!(first.iter().all(|&v| v == first[0]), "written whole by one thread");
    }

    #[test]
    fn a_lookup_that_re_enters_gets_no_binding_instead_of_looking_again() {
        static B: Binding<u32> = Binding::new();
        static INNER: Binding<u32> = Binding::new();
        let outer = B.get(|| {
            assert_eq!(INNER.get(|| Some(1)), None, "asked from inside a lookup");
            Some(2)
        });
        assert_eq!(outer, Some(&2));
        assert_eq!(INNER.get(|| Some(1)), Some(&1), "outside it, bound");
    }
}
