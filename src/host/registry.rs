//! Which pointers are ours: a two-level radix map from a block's first page to its length and
//! state, as tcmalloc's pagemap. Lookups are lock-free and O(1), read only our own tables (never
//! the memory around a foreign pointer), and cannot give a false positive: an entry exists only
//! for the first page of a block we mapped.
//!
//! Writers need no lock: leaves are installed with compare-and-swap and never freed.
//! Invariant: an entry is cleared before its pages are unmapped, and set only after they are
//! mapped, so an address the kernel reuses for someone else never matches.
//!
//! For the rarer question "is this address *inside* one of our blocks" (a free of an interior
//! pointer must abort, not reach the next allocator), each block also marks its last page with
//! a tail entry pointing back to its start, and each 2 MiB granule counts the blocks that
//! overlap it. `block_containing` walks back from the address to the nearest start or tail,
//! stopping at the first granule no block overlaps: an address far from our blocks is answered
//! by one or two loads.

use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

const PAGE_SHIFT: u32 = 12;
const ADDRESS_BITS: u32 = 48;
const LEAF_BITS: u32 = 18;
const ROOT_BITS: u32 = ADDRESS_BITS - PAGE_SHIFT - LEAF_BITS;
const LEAF_ENTRIES: usize = 1 << LEAF_BITS;
const ROOT_ENTRIES: usize = 1 << ROOT_BITS;

/// The low bits of an entry: its kind, and for a live block what the program did to its pages.
const STATE_MASK: u64 = (1 << PAGE_SHIFT) - 1;
const KIND_MASK: u64 = 3;
const LIVE: u64 = 1;
const CACHED: u64 = 2;
/// The last page of a block longer than a page; the entry's upper bits are the block's start.
const TAIL: u64 = 3;
/// A live block whose pages the program changed through libc (protection, locks, advice): it
/// is reset before reuse (Note [Pages the program changed]).
const CHANGED: u64 = 4;
/// A live block part of which the program unmapped, moved or mapped over: never reused.
const REPLACED: u64 = 8;
/// A live block the program advised MADV_DONTFORK: a forked child may not have it.
const KEPT_FROM_CHILDREN: u64 = 16;
/// Two bits: how many zeroings in a row found the block mostly resident (Note [calloc costs
/// what is touched] in host/host_layer/alloc.rs).
const VOTES_SHIFT: u32 = 5;
const VOTES_MASK: u64 = 3 << VOTES_SHIFT;
/// A live block part of which the program advised MADV_HUGEPAGE (Note [Huge-page advice]).
const HUGE_ADVICE: u64 = 128;
/// ... MADV_NOHUGEPAGE.
const NO_HUGE_ADVICE: u64 = 256;
/// A live block part of which the program tagged with a protection key other than the default
/// (pkey_mprotect): its reset at free uses pkey_mprotect, every other one plain mprotect.
const KEYED: u64 = 512;
/// A live block its thread freed and keeps in its slot, to ask for again (Note [A thread's own
/// slot] in host/thread_slots.rs): the program's no longer, not yet the cache's.
const IN_SLOT: u64 = 1024;
/// Every mark of what the program did, the votes aside.
const PROGRAM_MARKS: u64 = CHANGED | REPLACED | KEPT_FROM_CHILDREN | HUGE_ADVICE | NO_HUGE_ADVICE | KEYED;

/// What the program did to a range's pages (`note_change`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageChange {
    /// Protection, locks or advice: the block is reset at free.
    Changed,
    /// Unmapped, moved or mapped over: the block is unmapped at free, never reused.
    Replaced,
    /// MADV_DONTFORK: as Changed, and a forked child checks that it has the block.
    KeptFromChildren,
    /// pkey_mprotect with a key other than the default: as Changed, reset with keys.
    Keyed,
    /// MADV_HUGEPAGE (true) or MADV_NOHUGEPAGE (false): Note [Huge-page advice].
    HugeAdvice(bool),
}

/// What the registry knows of a live block's pages: the program's marks (`note_change`) and
/// the zeroing votes (`set_votes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks(u64);

impl Marks {
    /// The marks an entry holds: a live block's, none for any other.
    const fn of(entry: u64) -> Marks {
        Marks(if entry & KIND_MASK == LIVE { entry & (PROGRAM_MARKS | VOTES_MASK) } else { 0 })
    }

    /// Protection, locks or advice changed: reset at free.
    pub const fn changed(self) -> bool {
        self.0 & CHANGED != 0
    }
    /// Part of it unmapped, moved or mapped over: never reused.
    pub const fn replaced(self) -> bool {
        self.0 & REPLACED != 0
    }
    /// Tagged with a protection key: reset with pkey_mprotect.
    pub const fn keyed(self) -> bool {
        self.0 & KEYED != 0
    }
    /// Advised MADV_HUGEPAGE somewhere (and never MADV_NOHUGEPAGE).
    pub const fn huge(self) -> bool {
        self.0 & (HUGE_ADVICE | NO_HUGE_ADVICE) == HUGE_ADVICE
    }
    /// Advised MADV_NOHUGEPAGE somewhere.
    pub const fn no_huge(self) -> bool {
        self.0 & NO_HUGE_ADVICE != 0
    }
    /// Zeroings in a row that found it mostly resident (0-3).
    pub const fn votes(self) -> u8 {
        ((self.0 & VOTES_MASK) >> VOTES_SHIFT) as u8
    }
    /// The same marks with `votes` votes.
    pub const fn with_votes(self, votes: u8) -> Marks {
        Marks(self.0 & !VOTES_MASK | ((votes as u64) << VOTES_SHIFT) & VOTES_MASK)
    }
    /// The same marks plus MADV_HUGEPAGE advice (a block handed back to the code that advised it).
    pub const fn with_huge(self) -> Marks {
        Marks(self.0 | HUGE_ADVICE)
    }
    #[cfg(test)]
    pub const fn bits(self) -> u64 {
        self.0
    }
}

/// Set once any block was kept from children (the child's check is skipped otherwise).
static ANY_KEPT_FROM_CHILDREN: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

const PAGE: usize = 1 << PAGE_SHIFT;
const GRANULE_SHIFT: u32 = 21;
const LEAF_GRANULES: usize = 1 << (LEAF_BITS + PAGE_SHIFT - GRANULE_SHIFT);

/// A leaf: LEAF_ENTRIES entries, LEAF_ENTRIES birth times (for the leak report), LEAF_ENTRIES
/// holder words (Note [Holders]), LEAF_ENTRIES sizes asked, then one overlap count per granule.
const LEAF_BYTES: usize = (GRANULES_AT + LEAF_GRANULES) * core::mem::size_of::<AtomicU64>();
/// Where a leaf's sizes asked start.
const ASKED_AT: usize = 3 * LEAF_ENTRIES;
/// Where a leaf's overlap counts start, after its four arrays of LEAF_ENTRIES.
const GRANULES_AT: usize = 4 * LEAF_ENTRIES;

/// One bit per 2 MiB granule, set for every granule a block of ours has ever overlapped and
/// never cleared: `ever_overlapped` answers "no block of ours here" in one load, for the
/// interior-pointer check in front of every small free. Never clearing keeps it safe without a
/// lock (a bit cleared while another thread marks the granule could hide a new block); a stale
/// bit only sends that check down the exact path. Shared by every registry (tests make several):
/// a stray bit costs a lookup, never an answer. 2^21 bits (256 KiB of .bss): granules 4 TiB
/// apart share a bit, a "maybe" as rare as the granules we mark are few among two million. It
/// was one bit per granule of the whole 47-bit space, 8 MiB, which a conservative collector
/// (Boehm GC) scans with the rest of .bss at every collection.
const FILTER_GRANULES: usize = 1 << 21;
static EVER_OVERLAPPED: [AtomicU64; FILTER_GRANULES / 64] = [const { AtomicU64::new(0) }; FILTER_GRANULES / 64];

/// False when no block of ours has ever overlapped the 2 MiB granule of `addr` (any value;
/// granules 4 TiB apart share a bit, a harmless "maybe").
#[inline(always)]
pub(crate) fn ever_overlapped(addr: usize) -> bool {
    let (word, bit) = filter_bit(addr);
    word.load(Ordering::Acquire) & bit != 0
}

fn set_ever_overlapped(addr: usize) {
    let (word, bit) = filter_bit(addr);
    if word.load(Ordering::Relaxed) & bit == 0 {
        word.fetch_or(bit, Ordering::AcqRel);
    }
}

/// The bitmap word that holds the granule of `addr`, and the granule's bit in it.
#[inline(always)]
fn filter_bit(addr: usize) -> (&'static AtomicU64, u64) {
    let granule = (addr >> GRANULE_SHIFT) & (FILTER_GRANULES - 1);
    // SAFETY: granule / 64 < FILTER_GRANULES / 64, the length of EVER_OVERLAPPED.
    (unsafe { EVER_OVERLAPPED.get_unchecked(granule / 64) }, 1 << (granule % 64))
}

use crate::backing::TableSource;
pub use crate::record::holders::Birth;

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
        self.slots(addr, create).map(|(entry, _, _)| entry)
    }

    /// The entry, birth time and holder of the block starting at `addr`.
    fn slots(&self, addr: usize, create: bool) -> Option<(&AtomicU64, &AtomicU64, &AtomicU64)> {
        let (leaf, index) = self.leaf_index(addr, create)?;
        // SAFETY: leaf points to LEAF_BYTES of zero-initialised AtomicU64s that live forever,
        // and index < LEAF_ENTRIES.
        Some(unsafe { (&*leaf.add(index), &*leaf.add(LEAF_ENTRIES + index), &*leaf.add(2 * LEAF_ENTRIES + index)) })
    }

    /// The leaf of the block starting at `addr` (a page start) and its index in each array.
    fn leaf_index(&self, addr: usize, create: bool) -> Option<(*mut AtomicU64, usize)> {
        if addr & (PAGE - 1) != 0 {
            return None;
        }
        Some((self.leaf(addr, create)?, (addr >> PAGE_SHIFT) & (LEAF_ENTRIES - 1)))
    }

    /// The overlap count of the granule holding `addr` (any address).
    fn granule(&self, addr: usize, create: bool) -> Option<&AtomicU64> {
        let leaf = self.leaf(addr, create)?;
        let index = (addr >> GRANULE_SHIFT) & (LEAF_GRANULES - 1);
        // SAFETY: as in slots(); the counts follow the three arrays of LEAF_ENTRIES.
        Some(unsafe { &*leaf.add(GRANULES_AT + index) })
    }

    /// The leaf covering `addr`, installed if `create`; `None` for addresses past ADDRESS_BITS.
    fn leaf(&self, addr: usize, create: bool) -> Option<*mut AtomicU64> {
        if (addr as u64) >> ADDRESS_BITS != 0 {
            return None;
        }
        let root_index = addr >> (PAGE_SHIFT + LEAF_BITS); // < ROOT_ENTRIES
        // SAFETY: the root table holds ROOT_ENTRIES zero-initialised pointers and lives forever.
        let root_slot = unsafe { &*self.root(create)?.add(root_index) };
        let leaf = root_slot.load(Ordering::Acquire);
        if !leaf.is_null() || !create {
            return (!leaf.is_null()).then_some(leaf);
        }
        let fresh = self.new_leaf()?;
        Some(match root_slot.compare_exchange(core::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => fresh,
            // Another writer installed this leaf first: use theirs, keep ours as the spare.
            Err(theirs) => {
                let _ = self.spare.compare_exchange(core::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire);
                theirs
            }
        })
    }

    /// O(1), lock-free. Any pointer value is accepted.
    pub fn owner(&self, addr: usize) -> Owner {
        let Some(slot) = self.slot(addr, false) else { return Owner::Foreign };
        let entry = slot.load(Ordering::Acquire);
        match entry & KIND_MASK {
            LIVE if entry & IN_SLOT != 0 => Owner::Cached,
            LIVE => Owner::Live { len: (entry & !STATE_MASK) as usize },
            CACHED => Owner::Cached,
            _ => Owner::Foreign,
        }
    }

    /// The record of the block that starts at `addr`, as one walk of the tables finds it; None
    /// where no table covers `addr` (no block of ours starts there).
    #[inline]
    pub fn record(&self, addr: usize) -> Option<Record<'_>> {
        let (leaf, index) = self.leaf_index(addr, false)?;
        // SAFETY: as in slots(); the four arrays of LEAF_ENTRIES.
        let (entry, born, holder, asked) = unsafe { (&*leaf.add(index), &*leaf.add(LEAF_ENTRIES + index), &*leaf.add(2 * LEAF_ENTRIES + index), &*leaf.add(ASKED_AT + index)) };
        Some(Record { entry, born, holder, asked, value: entry.load(Ordering::Acquire) })
    }

    /// The block at `addr`, taken from a slot, is live again on its way to the cache (its taker
    /// frees it as the program did): by whom and for how much it was asked, and its marks,
    /// which the program may have added while it was in the slot.
    pub fn out_of_slot(&self, addr: usize) -> (Birth, u64, Marks) {
        if let Some(entry) = self.slot(addr, false) {
            entry.fetch_and(!IN_SLOT, Ordering::AcqRel);
        }
        self.live_record(addr)
    }

    /// Records a live block; false when no table memory could be had (the caller then gives
    /// the block back and fails the request).
    #[must_use]
    pub fn set_live(&self, addr: usize, len: usize, birth: Birth) -> bool {
        match self.slots(addr, true) {
            Some((entry, born, holder)) => {
                born.store(birth.ns, Ordering::Relaxed);
                holder.store(birth.holder, Ordering::Relaxed);
                self.write(addr, entry, len as u64 | LIVE);
                true
            }
            None => false,
        }
    }

    /// What is kept of the live block at `addr`, with one walk of the tables: when it was
    /// handed out and to whom, what was asked of it (zeros if unknown), and what is known of its
    /// pages (nothing for any other address).
    pub fn live_record(&self, addr: usize) -> (Birth, u64, Marks) {
        self.record(addr).map_or((Birth::default(), 0, Marks::default()), |r| r.live())
    }

    /// Calls `f(addr, len, birth)` for every live block: a walk of every table, for the
    /// reports (not for hot paths).
    pub fn for_each_live(&self, mut f: impl FnMut(usize, usize, Birth)) {
        self.walk_live(|addr, entry, leaf, i| {
            // SAFETY: as in slots(); i < LEAF_ENTRIES.
            let (ns, holder) = unsafe { ((*leaf.add(LEAF_ENTRIES + i)).load(Ordering::Relaxed), (*leaf.add(2 * LEAF_ENTRIES + i)).load(Ordering::Relaxed)) };
            f(addr, (entry & !STATE_MASK) as usize, Birth { ns, holder });
        });
    }

    /// Whether the block at `addr` is in a slot (tests).
    #[cfg(test)]
    pub fn in_slot(&self, addr: usize) -> bool {
        self.slot(addr, false).is_some_and(|e| e.load(Ordering::Acquire) & (KIND_MASK | IN_SLOT) == LIVE | IN_SLOT)
    }

    /// Calls `f(addr, entry, leaf, index)` for every live block's start entry (one in a thread's
    /// slot is the program's no longer): a walk of every table (reports, a forked child's handler; never
    /// a hot path).
    fn walk_live(&self, mut f: impl FnMut(usize, u64, *mut AtomicU64, usize)) {
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
                if entry & (KIND_MASK | IN_SLOT) == LIVE {
                    f(((r << LEAF_BITS) | i) << PAGE_SHIFT, entry, leaf, i);
                }
            }
        }
    }

    #[must_use]
    pub fn set_cached(&self, addr: usize, len: usize) -> bool {
        match self.slot(addr, true) {
            Some(entry) => {
                self.write(addr, entry, len as u64 | CACHED);
                true
            }
            None => false,
        }
    }

    pub fn clear(&self, addr: usize) {
        if let Some(entry) = self.slot(addr, false) {
            self.write(addr, entry, 0);
        }
    }

    /// Sets `entry`, the entry of the block starting at `addr`, and keeps its tail and the
    /// granule counts in step with the length it had and the length it now has.
    /// A load and a store, not a swap (a locked instruction on every large malloc and free): an
    /// entry has one writer at a time, the thread handing its block out, caching or clearing
    /// it, under the cache lock or before anyone else can know the block. `note_change` may set
    /// a flag on a live entry meanwhile only if the program changes the pages of a block while
    /// another of its threads frees it; the flag is then lost with the block, as glibc's munmap
    /// at free would lose the change.
    fn write(&self, addr: usize, entry: &AtomicU64, value: u64) {
        let old = entry.load(Ordering::Acquire);
        entry.store(value, Ordering::Release);
        let (old_len, new_len) = (block_len(old), block_len(value));
        if old_len != new_len {
            if old_len != 0 {
                self.unmark(addr, old_len);
            }
            if new_len != 0 {
                self.mark(addr, new_len);
            }
        }
    }

    /// Records the tail and the granules of a block. Without table memory for them the block
    /// still works; only the interior-pointer check may then miss it.
    fn mark(&self, addr: usize, len: usize) {
        for g in granules(addr, len) {
            set_ever_overlapped(g);
            if let Some(count) = self.granule(g, true) {
                count.fetch_add(1, Ordering::AcqRel);
            }
        }
        if len > PAGE {
            if let Some(tail) = self.slot(addr + len - PAGE, true) {
                tail.store(addr as u64 | TAIL, Ordering::Release);
            }
        }
    }

    fn unmark(&self, addr: usize, len: usize) {
        if len > PAGE {
            if let Some(tail) = self.slot(addr + len - PAGE, false) {
                let _ = tail.compare_exchange(addr as u64 | TAIL, 0, Ordering::AcqRel, Ordering::Acquire);
            }
        }
        for g in granules(addr, len) {
            if let Some(count) = self.granule(g, false) {
                let _ = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
            }
        }
    }

    /// False when no block of ours overlaps the 2 MiB around `addr`: three loads at most, for
    /// free's slow path (pointers on a BLOCK_ALIGN boundary). True means `block_containing` has
    /// to look. It repeats `granule`'s arithmetic instead of calling it: masking an out-of-range
    /// address instead of refusing it saves three instructions.
    #[inline(always)]
    pub fn may_contain(&self, addr: usize) -> bool {
        let root = self.root.load(Ordering::Acquire);
        if root.is_null() {
            return false;
        }
        // Out-of-range addresses wrap to some leaf: harmless for a "maybe".
        let root_index = (addr >> (PAGE_SHIFT + LEAF_BITS)) & (ROOT_ENTRIES - 1);
        // SAFETY: root_index < ROOT_ENTRIES; the root table lives forever.
        let leaf = unsafe { (*root.add(root_index)).load(Ordering::Acquire) };
        if leaf.is_null() {
            return false;
        }
        let index = (addr >> GRANULE_SHIFT) & (LEAF_GRANULES - 1);
        // SAFETY: as in granule().
        unsafe { (*leaf.add(GRANULES_AT + index)).load(Ordering::Acquire) != 0 }
    }

    /// The program is changing the pages of [addr, addr+len) (Note [Pages the program
    /// changed]): every live block of ours the range overlaps is marked, `replaced` when the
    /// pages are unmapped, moved or mapped over. Lock-free; one or two loads for a range far
    /// from our blocks.
    pub fn note_change(&self, addr: usize, len: usize, change: PageChange) {
        let Some(end) = addr.checked_add(len.max(1)) else { return };
        if end - addr <= 1 << GRANULE_SHIFT && !ever_overlapped(addr) && !ever_overlapped(end - 1) {
            return;
        }
        let flag = match change {
            PageChange::Changed => CHANGED,
            PageChange::Replaced => REPLACED | CHANGED,
            PageChange::KeptFromChildren => {
                ANY_KEPT_FROM_CHILDREN.store(true, Ordering::Relaxed);
                KEPT_FROM_CHILDREN | CHANGED
            }
            PageChange::Keyed => KEYED | CHANGED,
            PageChange::HugeAdvice(true) => HUGE_ADVICE,
            PageChange::HugeAdvice(false) => NO_HUGE_ADVICE,
        };
        let mut page = addr & !(PAGE - 1);
        if let Some(start) = self.block_containing(page) {
            page = start;
        }
        while page < end && (page as u64) >> ADDRESS_BITS == 0 {
            let Some(count) = self.granule(page, false) else {
                page = (page | ((1 << (PAGE_SHIFT + LEAF_BITS)) - 1)) + 1; // no leaf: the next one
                continue;
            };
            if count.load(Ordering::Acquire) == 0 {
                page = (page | ((1 << GRANULE_SHIFT) - 1)) + 1;
                continue;
            }
            let Some(slot) = self.slot(page, false) else { return };
            let entry = slot.load(Ordering::Acquire);
            match entry & KIND_MASK {
                LIVE | CACHED => {
                    if entry & KIND_MASK == LIVE {
                        let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| (e & KIND_MASK == LIVE).then_some(e | flag));
                    }
                    page += block_len(entry).max(PAGE);
                }
                _ => page += PAGE,
            }
        }
    }

    /// False when no block of ours has ever overlapped [addr, addr+len): nothing of ours can be
    /// there, cached, waiting to be unmapped or on its way to the kernel (one load a 2 MiB
    /// granule; a range of more than 8 GiB is a "maybe").
    pub fn may_hold_ours(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len.max(1)) else { return true };
        let (first, last) = (addr >> GRANULE_SHIFT, (end - 1) >> GRANULE_SHIFT);
        last - first >= 4096 || (first..=last).any(|g| ever_overlapped(g << GRANULE_SHIFT))
    }

    /// The program asked for `asked` bytes of the live block at `addr` (the holders table
    /// counts them).
    pub fn set_asked(&self, addr: usize, asked: u64) {
        if let Some(slot) = self.asked_slot(addr) {
            slot.store(asked, Ordering::Relaxed);
        }
    }

    fn asked_slot(&self, addr: usize) -> Option<&AtomicU64> {
        let (leaf, index) = self.leaf_index(addr, false)?;
        // SAFETY: as in slots(); the sizes asked follow the three arrays of LEAF_ENTRIES.
        Some(unsafe { &*leaf.add(ASKED_AT + index) })
    }

    /// Calls `f(addr, len)` for each table of ours: the root, every leaf, and the filter shared
    /// by every registry (the mlockall shim unlocks them: Note [Locked memory] in
    /// host/host_layer/mod.rs).
    pub fn for_each_table(&self, mut f: impl FnMut(usize, usize)) {
        f(EVER_OVERLAPPED.as_ptr() as usize, core::mem::size_of_val(&EVER_OVERLAPPED));
        let Some(root) = self.root(false) else { return };
        f(root as usize, ROOT_ENTRIES * core::mem::size_of::<AtomicPtr<AtomicU64>>());
        for r in 0..ROOT_ENTRIES {
            // SAFETY: r < ROOT_ENTRIES; the root table lives forever.
            let leaf = unsafe { (*root.add(r)).load(Ordering::Acquire) };
            if !leaf.is_null() {
                f(leaf as usize, LEAF_BYTES);
            }
        }
        let spare = self.spare.load(Ordering::Acquire);
        if !spare.is_null() {
            f(spare as usize, LEAF_BYTES);
        }
    }

    /// Calls `f(addr, len)` for every live block the program kept from forked children (a walk
    /// of every table, only once any block was: for a forked child's handler).
    pub fn for_each_kept_from_children(&self, mut f: impl FnMut(usize, usize)) {
        if !ANY_KEPT_FROM_CHILDREN.load(Ordering::Relaxed) {
            return;
        }
        self.walk_live(|addr, entry, _, _| {
            if entry & KEPT_FROM_CHILDREN != 0 {
                f(addr, (entry & !STATE_MASK) as usize);
            }
        });
    }

    /// What is known of the pages of the live block at `addr` (`live_record`'s third part).
    #[cfg(test)]
    pub fn marks(&self, addr: usize) -> Marks {
        self.live_record(addr).2
    }

    /// Adds `marks` to the live block at `addr`, its votes replacing the block's (a resize that
    /// keeps the block keeps what was done to its pages; a block handed out carries its votes).
    pub fn keep_marks(&self, addr: usize, marks: Marks) {
        if let Some(slot) = self.slot(addr, false) {
            let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| (e & KIND_MASK == LIVE).then_some(e & !VOTES_MASK | marks.0));
        }
    }

    /// The start of the block of ours (live or cached) that contains `addr`, if any. Cheap far
    /// from our blocks; inside a block it walks back page by page to the block's start, which
    /// only a bad free makes it do.
    pub fn block_containing(&self, addr: usize) -> Option<usize> {
        let target = addr & !(PAGE - 1);
        let mut page = target;
        loop {
            if self.granule(page, false)?.load(Ordering::Acquire) == 0 {
                return None;
            }
            let entry = self.slot(page, false)?.load(Ordering::Acquire);
            match entry & KIND_MASK {
                LIVE | CACHED => return (addr - page < block_len(entry)).then_some(page),
                TAIL => return (page == target).then_some((entry & !STATE_MASK) as usize),
                _ => page = page.checked_sub(PAGE)?,
            }
        }
    }
}

/// The length a start entry records; 0 for an empty or tail entry.
fn block_len(entry: u64) -> usize {
    match entry & KIND_MASK {
        LIVE | CACHED => (entry & !STATE_MASK) as usize,
        _ => 0,
    }
}

/// One address in each granule that [addr, addr+len) overlaps.
fn granules(addr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = addr >> GRANULE_SHIFT;
    let last = (addr + len - 1) >> GRANULE_SHIFT;
    (first..=last).map(|g| g << GRANULE_SHIFT)
}

/// The record of one block as a walk of the tables found it (`Registry::record`): read, then
/// changed against what was read without walking again (the reuse pair's path, Note [A
/// thread's own slot] in host/thread_slots.rs).
pub struct Record<'a> {
    entry: &'a AtomicU64,
    born: &'a AtomicU64,
    holder: &'a AtomicU64,
    asked: &'a AtomicU64,
    /// The entry when read: a change since fails the exchanges below.
    value: u64,
}

impl Record<'_> {
    /// When the block was handed out and to whom, what was asked of it (zeros if unknown), and
    /// what is known of its pages (nothing unless it is live).
    #[inline]
    pub fn live(&self) -> (Birth, u64, Marks) {
        let birth = Birth { ns: self.born.load(Ordering::Relaxed), holder: self.holder.load(Ordering::Relaxed) };
        (birth, self.asked.load(Ordering::Relaxed), Marks::of(self.value))
    }

    /// The live block of `len` bytes, freed by the program, goes to its thread's slot: true
    /// when its entry said live, with no mark but its votes and huge-page advice, and still
    /// says so. A compare-exchange: of two threads freeing one block at once, one moves it, and
    /// the other finds it in a slot (a double free).
    #[inline]
    pub fn move_to_slot(&self, len: usize) -> bool {
        self.value & !(VOTES_MASK | HUGE_ADVICE) == len as u64 | LIVE
            && self.entry.compare_exchange(self.value, self.value | IN_SLOT, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// The block of `len` bytes, taken from a slot, goes back to the program, handed out by
    /// `birth` for `asked` bytes; false (and in a slot still, its record as it was) when the
    /// program changed its pages since the record was read. Its taker is the one thread that
    /// took it from the slot.
    #[inline]
    pub fn take_from_slot(&self, len: usize, birth: Birth, asked: u64) -> bool {
        if self.value & !(VOTES_MASK | HUGE_ADVICE) != len as u64 | LIVE | IN_SLOT {
            return false;
        }
        // The new owner's record first, so that whoever sees the block live sees it; a mark the
        // program adds from another thread meanwhile (note_change) fails the exchange, and the
        // block, its old record back, goes the cache's way, which resets it. The record is the
        // taker's alone to write (plain loads and stores, no locked swap on the reuse pair).
        let was = (self.born.load(Ordering::Relaxed), self.holder.load(Ordering::Relaxed), self.asked.load(Ordering::Relaxed));
        self.born.store(birth.ns, Ordering::Relaxed);
        self.holder.store(birth.holder, Ordering::Relaxed);
        self.asked.store(asked, Ordering::Relaxed);
        if self.entry.compare_exchange(self.value, self.value & !IN_SLOT, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return true;
        }
        self.born.store(was.0, Ordering::Relaxed);
        self.holder.store(was.1, Ordering::Relaxed);
        self.asked.store(was.2, Ordering::Relaxed);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::leak_table as leak_zeroed;

    fn born(ns: u64) -> Birth {
        Birth { ns, holder: 7 << 48 }
    }

    #[test]
    fn only_block_starts_match() {
        let reg = Box::new(Registry::new(leak_zeroed));
        let base = 0x7f00_0000_0000usize;
        assert_eq!(reg.owner(base), Owner::Foreign);
        assert!(reg.set_live(base, 8 << 20, born(42)));
        assert_eq!(reg.owner(base), Owner::Live { len: 8 << 20 });
        assert_eq!(reg.live_record(base).0, born(42));
        assert!(reg.may_contain(base) && reg.may_contain(base + (8 << 20) - 1));
        assert!(!reg.may_contain(base + (64 << 20)));
        let mut seen = vec![];
        reg.for_each_live(|a, l, b| seen.push((a, l, b)));
        assert_eq!(seen, vec![(base, 8 << 20, born(42))]);
        assert_eq!(reg.owner(base + 16), Owner::Foreign);
        assert_eq!(reg.owner(base + 4096), Owner::Foreign);
        assert_eq!(reg.owner(usize::MAX & !4095), Owner::Foreign);
        assert_eq!(reg.owner(0), Owner::Foreign);
        assert!(reg.set_cached(base, 8 << 20));
        assert_eq!(reg.owner(base), Owner::Cached);
        reg.clear(base);
        assert_eq!(reg.owner(base), Owner::Foreign);
    }

    #[test]
    fn the_filter_covers_every_granule_a_block_ever_overlapped() {
        let reg = Box::new(Registry::new(leak_zeroed));
        let mib = 1usize << 20;
        // An address range no other test uses (the filter is shared by all registries).
        let a = 0x6a00_0000_0000usize + 3 * PAGE;
        assert!(!ever_overlapped(a) && !ever_overlapped(a + 5 * mib));
        assert!(reg.set_live(a, 5 * mib, born(1)));
        for addr in [a, a + 1, a + 2 * mib, a + 5 * mib - 1, a & !(2 * mib - 1)] {
            assert!(ever_overlapped(addr), "{addr:#x}");
        }
        assert!(!ever_overlapped(a + 6 * mib), "past the block's last granule");
        assert!(!ever_overlapped(a - 2 * mib), "before its first");
        reg.clear(a);
        assert!(ever_overlapped(a + 2 * mib), "never cleared: a bit cleared under a racing mark could hide a block");
        assert!(ever_overlapped(a + (1 << 47)), "past 47 bits an address shares a lower one's bit");
    }

    #[test]
    fn interior_addresses_find_their_block() {
        let reg = Box::new(Registry::new(leak_zeroed));
        let mib = 1usize << 20;
        // Two blocks, the second crossing a leaf (1 GiB) boundary, with a gap between them.
        let a = 0x7f00_0000_0000usize + 3 * PAGE;
        let b = 0x7f00_4000_0000usize - 5 * mib;
        assert!(reg.set_live(a, 8 * mib, born(1)));
        assert!(reg.set_cached(b, 12 * mib));
        for (addr, want) in [
            (a, Some(a)),
            (a + 1, Some(a)),
            (a + PAGE, Some(a)),
            (a + 8 * mib - 1, Some(a)),
            (a + 8 * mib - PAGE, Some(a)),
            (a + 8 * mib, None),
            (a - 1, None),
            (a + 9 * mib + 16, None),
            (b + 5 * mib, Some(b)),
            (b + 12 * mib - 8, Some(b)),
            (b + 12 * mib, None),
            (b - PAGE, None),
            (0, None),
            (usize::MAX, None),
        ] {
            assert_eq!(reg.block_containing(addr), want, "{addr:#x}");
        }
        // Shrinking, splitting and clearing move the tail and the granule counts along.
        assert!(reg.set_live(a, 2 * mib, born(1)));
        assert!(reg.set_cached(a + 2 * mib, 6 * mib));
        assert_eq!(reg.block_containing(a + 2 * mib - 1), Some(a));
        assert_eq!(reg.block_containing(a + 2 * mib), Some(a + 2 * mib));
        assert_eq!(reg.block_containing(a + 8 * mib - 1), Some(a + 2 * mib));
        reg.clear(a + 2 * mib);
        assert_eq!(reg.block_containing(a + 3 * mib), None);
        assert_eq!(reg.block_containing(a + 8 * mib - 1), None);
        reg.clear(a);
        reg.clear(b);
        for addr in [a, a + mib, b, b + 11 * mib] {
            assert_eq!(reg.block_containing(addr), None, "{addr:#x}");
        }
        // Every count is back to zero: the walk stops at once everywhere.
        for g in granules(a, 8 * mib).chain(granules(b, 12 * mib)) {
            assert_eq!(reg.granule(g, false).map(|c| c.load(Ordering::Relaxed)), Some(0));
        }
    }

    /// Note [A thread's own slot]: a block freed into a slot goes back to its thread with the
    /// new owner's record; one whose pages the program changed while it was there stays, its
    /// old record whole, for the cache's path to reset.
    #[test]
    fn a_block_leaves_its_slot_only_unchanged() {
        let reg = Box::new(Registry::new(leak_zeroed));
        let mib = 1usize << 20;
        let a = 0x6c00_0000_0000usize; // a range no other test uses
        assert!(reg.set_live(a, 8 * mib, born(1)));
        reg.set_asked(a, 5);
        assert!(!reg.record(a).unwrap().move_to_slot(4 * mib), "another length");
        assert!(reg.record(a).unwrap().move_to_slot(8 * mib) && reg.in_slot(a));
        assert!(!reg.record(a).unwrap().move_to_slot(8 * mib), "in a slot already: a double free");
        assert!(reg.record(a).unwrap().take_from_slot(8 * mib, born(2), 7));
        assert_eq!((reg.live_record(a).0, reg.live_record(a).1, reg.in_slot(a)), (born(2), 7, false));
        assert!(reg.record(a).unwrap().move_to_slot(8 * mib));
        let read_before = reg.record(a).unwrap();
        reg.note_change(a + mib, PAGE, PageChange::Changed);
        assert!(!read_before.take_from_slot(8 * mib, born(3), 9), "changed since it was read");
        assert!(!reg.record(a).unwrap().take_from_slot(8 * mib, born(3), 9), "changed");
        assert_eq!((reg.live_record(a).0, reg.live_record(a).1, reg.in_slot(a)), (born(2), 7, true));
    }

    #[test]
    fn one_page_blocks_have_no_tail() {
        let reg = Box::new(Registry::new(leak_zeroed));
        let base = 0x7f00_0000_0000usize;
        assert!(reg.set_live(base, PAGE, born(1)));
        assert!(reg.set_live(base + PAGE, PAGE, born(1)));
        assert_eq!(reg.block_containing(base + 100), Some(base));
        assert_eq!(reg.block_containing(base + PAGE + 100), Some(base + PAGE));
        assert_eq!(reg.block_containing(base + 2 * PAGE), None);
        assert_eq!(reg.owner(base), Owner::Live { len: PAGE });
    }

    #[test]
    fn a_change_marks_exactly_the_live_blocks_it_overlaps() {
        let reg = Box::new(Registry::new(leak_zeroed));
        let mib = 1usize << 20;
        // Three live blocks and a cached one, gaps between; a range no other test uses.
        let a = 0x6b00_0000_0000usize;
        let (b, c, d) = (a + 8 * mib, a + 12 * mib, a + 40 * mib);
        assert!(reg.set_live(a, 4 * mib, born(1)) && reg.set_cached(b, 4 * mib));
        assert!(reg.set_live(c, 16 * mib, born(1)) && reg.set_live(d, 64 * mib, born(1)));
        let clean = Marks::default();
        let flags = |x| (reg.marks(x).changed(), reg.marks(x).replaced());
        reg.note_change(a + 5 * mib, PAGE, PageChange::Changed);
        reg.note_change(a - 64 * mib, 60 * mib, PageChange::Replaced);
        assert!([a, b, c, d].iter().all(|&x| reg.marks(x) == clean), "ranges beside the blocks mark none");
        reg.note_change(c + 3 * PAGE, PAGE, PageChange::Changed);
        assert_eq!(flags(c), (true, false), "one page inside a block marks it");
        assert_eq!([reg.marks(a), reg.marks(d)], [clean, clean]);
        reg.note_change(a + 4 * mib - PAGE, 10 * mib, PageChange::Replaced);
        assert_eq!(flags(a), (true, true), "a range from a block's last page on");
        assert_eq!(flags(c), (true, true), "a range that reaches into the next block");
        assert_eq!(reg.owner(b), Owner::Cached, "cached blocks are not the program's: unmarked");
        assert_eq!(reg.marks(b), clean);
        assert_eq!(reg.marks(d), clean);
        reg.note_change(d + mib, PAGE, PageChange::HugeAdvice(true));
        assert!(reg.marks(d).huge() && !reg.marks(d).changed(), "huge-page advice alone needs no reset");
        reg.note_change(d, PAGE, PageChange::Keyed);
        assert!(reg.marks(d).keyed() && reg.marks(d).changed());
        reg.note_change(d + 2 * mib, PAGE, PageChange::HugeAdvice(false));
        assert!(reg.marks(d).no_huge() && !reg.marks(d).huge(), "both kinds of advice: undone as MADV_NOHUGEPAGE");
        reg.note_change(0, usize::MAX, PageChange::Changed);
        assert_eq!(flags(d), (true, false), "the whole address space");
        assert_eq!(reg.owner(d), Owner::Live { len: 64 * mib }, "the length survives the marks");
        assert!(reg.set_live(d, 64 * mib, born(2)));
        assert_eq!(reg.marks(d), clean, "a block handed out again starts as the kernel made it");
        reg.keep_marks(d, Marks::default().with_votes(2).with_huge());
        assert_eq!((reg.marks(d).votes(), reg.marks(d).huge(), reg.marks(d).changed()), (2, true, false));
        reg.keep_marks(d, reg.marks(d).with_votes(1));
        assert_eq!(reg.marks(d).votes(), 1, "votes are replaced, marks kept");
        assert_eq!(reg.owner(d), Owner::Live { len: 64 * mib });
        for x in [a, b, c, d] {
            reg.clear(x);
        }
    }
}
