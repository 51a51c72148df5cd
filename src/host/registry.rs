//! Which pointers are ours: a two-level radix map from a block's first page to its length and
//! state, as tcmalloc's pagemap. Lookups are lock-free and O(1), read only our own tables (never
//! the memory around a foreign pointer), and cannot give a false positive: an entry exists only
//! for the first page of a block we mapped.
//!
//! Writers need no lock: leaves are installed with compare-and-swap and never freed.
//! Invariant: an entry is cleared before its pages are unmapped, and set only after they are
//! mapped, so an address the kernel reuses for someone else never matches.

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

const PAGE_SHIFT: u32 = 12;
const ADDRESS_BITS: u32 = 48;
const LEAF_BITS: u32 = 18;
const ROOT_BITS: u32 = ADDRESS_BITS - PAGE_SHIFT - LEAF_BITS;
const LEAF_ENTRIES: usize = 1 << LEAF_BITS;
const ROOT_ENTRIES: usize = 1 << ROOT_BITS;

const STATE_MASK: u64 = (1 << PAGE_SHIFT) - 1;
const LIVE: u64 = 1;
const CACHED: u64 = 2;

/// A leaf: LEAF_ENTRIES entries, then LEAF_ENTRIES birth times (for the leak report).
const LEAF_BYTES: usize = 2 * LEAF_ENTRIES * core::mem::size_of::<AtomicU64>();

/// Supplies zeroed memory for leaves; never freed.
pub type TableSource = fn(usize) -> Option<usize>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Not a block of ours: the next allocator's, or not a block start at all.
    Foreign,
    /// A block we handed out, with its mapped length.
    Live { len: usize },
    /// A block sitting in our cache: freeing it again is a double free.
    Cached,
}

pub struct Registry {
    /// ROOT_ENTRIES leaf pointers, mapped on first use (2 MiB, mostly never touched).
    root: AtomicPtr<AtomicPtr<AtomicU64>>,
    /// One leaf mapped ahead of need, so a caller that reserved it cannot fail to record a
    /// block (a moved realloc must not lose track of the user's data).
    spare: AtomicPtr<AtomicU64>,
    table_source: TableSource,
}

impl Registry {
    pub const fn new(table_source: TableSource) -> Self {
        Registry {
            root: AtomicPtr::new(core::ptr::null_mut()),
            spare: AtomicPtr::new(core::ptr::null_mut()),
            table_source,
        }
    }

    fn new_leaf(&self) -> Option<*mut AtomicU64> {
        let spare = self.spare.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !spare.is_null() {
            return Some(spare);
        }
        Some((self.table_source)(LEAF_BYTES)? as *mut AtomicU64)
    }

    /// Makes sure the next record of a block in a new region cannot fail. Call it outside locks
    /// (it may map memory); false when the system has no memory for it.
    pub fn reserve_spare(&self) -> bool {
        if self.root(true).is_none() {
            return false;
        }
        if !self.spare.load(Ordering::Acquire).is_null() {
            return true;
        }
        let Some(fresh) = (self.table_source)(LEAF_BYTES) else { return false };
        // Losing the race leaves one untouched (so non-resident) table mapped: harmless.
        let _ = self.spare.compare_exchange(core::ptr::null_mut(), fresh as *mut AtomicU64, Ordering::AcqRel, Ordering::Acquire);
        true
    }

    fn root(&self, create: bool) -> Option<*mut AtomicPtr<AtomicU64>> {
        let root = self.root.load(Ordering::Acquire);
        if !root.is_null() || !create {
            return (!root.is_null()).then_some(root);
        }
        let fresh = (self.table_source)(ROOT_ENTRIES * core::mem::size_of::<AtomicPtr<AtomicU64>>())? as *mut AtomicPtr<AtomicU64>;
        // A loser of this once-per-process race leaves an untouched table mapped: harmless.
        Some(match self.root.compare_exchange(core::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => fresh,
            Err(theirs) => theirs,
        })
    }

    /// The entry for `addr` and its birth-time slot.
    fn slot(&self, addr: usize, create: bool) -> Option<&AtomicU64> {
        self.slots(addr, create).map(|(entry, _)| entry)
    }

    fn slots(&self, addr: usize, create: bool) -> Option<(&AtomicU64, &AtomicU64)> {
        if addr & ((1 << PAGE_SHIFT) - 1) != 0 || (addr as u64) >> ADDRESS_BITS != 0 {
            return None;
        }
        let page = addr >> PAGE_SHIFT;
        let root_index = page >> LEAF_BITS; // < ROOT_ENTRIES: addr has at most ADDRESS_BITS bits
        // SAFETY: the root table holds ROOT_ENTRIES zero-initialised pointers and lives forever.
        let root_slot = unsafe { &*self.root(create)?.add(root_index) };
        let mut leaf = root_slot.load(Ordering::Acquire);
        if leaf.is_null() {
            if !create {
                return None;
            }
            let fresh = self.new_leaf()?;
            leaf = match root_slot.compare_exchange(core::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => fresh,
                // Another writer installed this leaf first: use theirs, keep ours as the spare.
                Err(theirs) => {
                    let _ = self.spare.compare_exchange(core::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire);
                    theirs
                }
            };
        }
        let index = page & (LEAF_ENTRIES - 1);
        // SAFETY: leaf points to 2 * LEAF_ENTRIES zero-initialised AtomicU64s that live
        // forever, and index < LEAF_ENTRIES.
        Some(unsafe { (&*leaf.add(index), &*leaf.add(LEAF_ENTRIES + index)) })
    }

    /// O(1), lock-free. Any pointer value is accepted.
    pub fn owner(&self, addr: usize) -> Owner {
        let Some(slot) = self.slot(addr, false) else { return Owner::Foreign };
        let entry = slot.load(Ordering::Acquire);
        match entry & STATE_MASK {
            LIVE => Owner::Live { len: (entry & !STATE_MASK) as usize },
            CACHED => Owner::Cached,
            _ => Owner::Foreign,
        }
    }

    /// Records a live block; false when no table memory could be had (the caller then gives
    /// the block back and fails the request).
    #[must_use]
    pub fn set_live(&self, addr: usize, len: usize, born_ns: u64) -> bool {
        match self.slots(addr, true) {
            Some((entry, born)) => {
                born.store(born_ns, Ordering::Relaxed);
                entry.store(len as u64 | LIVE, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// When the live block at `addr` was handed out (0 if unknown).
    pub fn born_ns(&self, addr: usize) -> u64 {
        self.slots(addr, false).map_or(0, |(_, born)| born.load(Ordering::Relaxed))
    }

    /// Calls `f(addr, len, born_ns)` for every live block: a walk of every table, for the
    /// leak report at exit (not for hot paths).
    pub fn for_each_live(&self, mut f: impl FnMut(usize, usize, u64)) {
        let Some(root) = self.root(false) else { return };
        for r in 0..ROOT_ENTRIES {
            // SAFETY: r < ROOT_ENTRIES; the root table lives forever.
            let leaf = unsafe { (*root.add(r)).load(Ordering::Acquire) };
            if leaf.is_null() {
                continue;
            }
            for i in 0..LEAF_ENTRIES {
                // SAFETY: as in slots().
                let entry = unsafe { (*leaf.add(i)).load(Ordering::Acquire) };
                if entry & STATE_MASK == LIVE {
                    let addr = ((r << LEAF_BITS) | i) << PAGE_SHIFT;
                    // SAFETY: as above.
                    let born = unsafe { (*leaf.add(LEAF_ENTRIES + i)).load(Ordering::Relaxed) };
                    f(addr, (entry & !STATE_MASK) as usize, born);
                }
            }
        }
    }

    #[must_use]
    pub fn set_cached(&self, addr: usize, len: usize) -> bool {
        self.store(addr, len as u64 | CACHED)
    }

    pub fn clear(&self, addr: usize) {
        if let Some(slot) = self.slot(addr, false) {
            slot.store(0, Ordering::Release);
        }
    }

    fn store(&self, addr: usize, value: u64) -> bool {
        match self.slot(addr, true) {
            Some(slot) => {
                slot.store(value, Ordering::Release);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leak_zeroed(len: usize) -> Option<usize> {
        Some(Box::leak(vec![0u8; len].into_boxed_slice()).as_mut_ptr() as usize)
    }

    #[test]
    fn only_block_starts_match() {
        let reg = Box::new(Registry::new(leak_zeroed));
        let base = 0x7f00_0000_0000usize;
        assert_eq!(reg.owner(base), Owner::Foreign);
        assert!(reg.set_live(base, 8 << 20, 42));
        assert_eq!(reg.owner(base), Owner::Live { len: 8 << 20 });
        assert_eq!(reg.born_ns(base), 42);
        let mut seen = vec![];
        reg.for_each_live(|a, l, b| seen.push((a, l, b)));
        assert_eq!(seen, vec![(base, 8 << 20, 42)]);
        assert_eq!(reg.owner(base + 16), Owner::Foreign);
        assert_eq!(reg.owner(base + 4096), Owner::Foreign);
        assert_eq!(reg.owner(usize::MAX & !4095), Owner::Foreign);
        assert_eq!(reg.owner(0), Owner::Foreign);
        assert!(reg.set_cached(base, 8 << 20));
        assert_eq!(reg.owner(base), Owner::Cached);
        reg.clear(base);
        assert_eq!(reg.owner(base), Owner::Foreign);
    }
}
