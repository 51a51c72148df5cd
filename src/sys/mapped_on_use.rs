//! A table of ours mapped, zeroed, at its first use instead of sitting in the library's .bss.
//
// Note [Tables mapped at first use]
// Every program pays for our writable segments whether it uses a table or not: a conservative
// collector (Boehm GC) scans every library's .data and .bss at each collection (ours at 15 MB
// made a collection of a small heap 35 times slower than alone), and mlockall(MCL_CURRENT)
// locks and faults them in under the 8 MiB RLIMIT_MEMLOCK of an unprivileged user. A big table
// that only some programs fill (the history rings, the holders table, the IPC openings) is
// therefore a pointer here, mapped at its first write; until then readers find nothing in it,
// as they would in an empty table. The mapping is tried once: one the kernel refuses leaves the
// table unmapped for good, every write dropped (figures and events not kept, never the
// program's call), so a table's figures either count from its first write or not at all (a
// holder row mapped late would be counted down for blocks it never counted up).

use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering::{AcqRel, Acquire, Relaxed}};

pub struct MappedOnUse<T> {
    table: AtomicPtr<T>,
    /// The mapping was refused: never tried again.
    refused: AtomicBool,
    _owns: PhantomData<T>,
}

// SAFETY: the table is shared as `&T` between threads, which `T: Sync` allows.
unsafe impl<T: Sync> Sync for MappedOnUse<T> {}

impl<T> MappedOnUse<T> {
    /// # Safety
    /// Zeroed memory must be a valid, empty `T` (integers, atomics, our locks: their free word
    /// is 0), and `T` must need no drop.
    pub const unsafe fn new() -> Self {
        MappedOnUse { table: AtomicPtr::new(core::ptr::null_mut()), refused: AtomicBool::new(false), _owns: PhantomData }
    }

    /// The table, if a write has mapped it.
    pub fn get(&self) -> Option<&T> {
        // SAFETY: null, or a mapping of ours kept for the process's life, valid zeroed (new's
        // contract) and written only through `&T`.
        unsafe { self.table.load(Acquire).as_ref() }
    }

    /// The table, mapped now if it was not; None when the kernel refuses the mapping.
    pub fn get_or_map(&self) -> Option<&T> {
        match self.get() {
            Some(t) => Some(t),
            None => self.map(),
        }
    }

    #[cold]
    #[inline(never)]
    fn map(&self) -> Option<&T> {
        if self.refused.load(Relaxed) {
            return None;
        }
        let bytes = core::mem::size_of::<T>();
        let Some(fresh) = super::os_pages::map_table(bytes) else {
            // A thread that mapped it meanwhile keeps it: the table exists or never will.
            self.refused.store(self.get().is_none(), Relaxed);
            return self.get();
        };
        if self.table.compare_exchange(core::ptr::null_mut(), fresh as *mut T, AcqRel, Acquire).is_err() {
            // Another thread mapped it first.
            super::os_pages::unmap_table(fresh, bytes);
        }
        self.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[test]
    fn nothing_until_the_first_write_then_one_table_for_every_thread() {
        static TABLE: MappedOnUse<[AtomicU64; 1024]> = unsafe { MappedOnUse::new() };
        assert!(TABLE.get().is_none());
        let seen: Vec<usize> = std::thread::scope(|s| {
            let hands: Vec<_> = (0..4).map(|i| s.spawn(move || {
                let t = TABLE.get_or_map().unwrap();
                t[i].store(i as u64 + 1, Relaxed);
                t as *const _ as usize
            })).collect();
            hands.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "one mapping kept: {seen:x?}");
        let t = TABLE.get().unwrap();
        assert_eq!((0..4).map(|i| t[i].load(Relaxed)).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert!(t[4..].iter().all(|a| a.load(Relaxed) == 0), "zeroed");
    }
}
