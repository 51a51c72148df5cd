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
// holder row mapped late would be counted down for blocks it never counted up). The tables
// are listed (`for_each_mapped`) for the mlockall shim, which unlocks them as it unlocks the
// registry's (Note [Locked memory] in host/host_layer/mod.rs): mlockall(MCL_CURRENT) would
// otherwise lock and fault in 2.6 MB of mostly untouched tables against RLIMIT_MEMLOCK.

use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed, Release}};

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
        } else {
            note_mapped(fresh, bytes);
        }
        self.get()
    }
}

/// The process has a few such tables (two rings, the holders, the IPC openings) and our own
/// stack (sys/stack.rs); a test process makes more, past which they go unlisted.
const LISTED: usize = 8;
static MAPPED_AT: [AtomicUsize; LISTED] = [const { AtomicUsize::new(0) }; LISTED];
static MAPPED_BYTES: [AtomicUsize; LISTED] = [const { AtomicUsize::new(0) }; LISTED];
static MAPPED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Lists a mapping of ours kept for the process's life.
pub(super) fn note_mapped(addr: usize, bytes: usize) {
    let i = MAPPED_COUNT.fetch_add(1, Relaxed);
    if let (Some(at), Some(len)) = (MAPPED_AT.get(i), MAPPED_BYTES.get(i)) {
        len.store(bytes, Relaxed);
        at.store(addr, Release);
    }
}

/// Calls `f(addr, len)` for every table (and our stack) mapped so far.
pub fn for_each_mapped(mut f: impl FnMut(usize, usize)) {
    for (at, len) in MAPPED_AT.iter().zip(&MAPPED_BYTES) {
        let addr = at.load(Acquire);
        if addr != 0 {
            f(addr, len.load(Relaxed));
        }
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
        let mut listed = false;
        for_each_mapped(|addr, len| listed |= addr == t as *const _ as usize && len == core::mem::size_of_val(t));
        // The test process's other tables (every test's rings, holders, IPC tables) may have
        // filled the list first.
        assert!(listed || MAPPED_COUNT.load(Relaxed) > LISTED, "listed for the mlockall shim");
    }
}
