//! Simulated backing memory for tests and replay benchmarks: fake addresses that are never
//! dereferenced, exact bookkeeping of what is mapped, which bytes may hold data (so a test
//! catches a block handed to calloc that does not read zero) and which pages are resident,
//! checks that every operation stays inside memory it owns, and injected failures. This is a
//! simulator, not a model of a real kernel's or device's speed. Built only for tests and the
//! no-interpose harnesses: a broken invariant here should stop the test loudly, so the
//! allocation paths' lints do not apply.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

use crate::backing::{DeviceError, DeviceRuntime, Moved, PageMemory, PrimaryContext};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};

/// How many rounds a property test runs: `native` normally, `miri` under Miri, which checks
/// every memory access and runs about a thousand times slower.
pub const fn rounds(native: usize, miri: usize) -> usize {
    if cfg!(miri) {
        miri
    } else {
        native
    }
}

/// A `TableSource` for tests: zeroed, 8-byte aligned (the tables hold u64s) and never freed,
/// as the real source's mappings are.
pub fn leak_table(len: usize) -> Option<usize> {
    Some(Box::leak(vec![0u64; len.div_ceil(8)].into_boxed_slice()).as_mut_ptr() as usize)
}

#[derive(Default, Debug, Clone)]
pub struct PageCalls {
    pub maps: u64,
    pub unmaps: u64,
    pub releases: u64,
    pub remaps: u64,
    pub zeroed_bytes: u64,
    pub discarded_bytes: u64,
    pub copied_bytes: u64,
    /// Resets of ranges the program changed (`reset_for_cache`), and ranges kept from or
    /// readmitted to forked children: each one or more system calls.
    pub resets: u64,
    /// Of the resets, those that put back the default protection key (pkey_mprotect).
    pub keyed_resets: u64,
    /// Ranges replaced by fresh pages (`renew`), and `lock` and `unlock` calls.
    pub renews: u64,
    pub locks: u64,
    pub unlocks: u64,
    pub fork_advice: u64,
    /// Bytes the program wrote that were not resident: what page faults would bring in.
    pub faulted_bytes: u64,
    /// Questions whether memory nears a limit (a dozen file reads each).
    pub near_limit_reads: u64,
}

#[derive(Default)]
struct PageState {
    /// start -> length of each mapped range (ranges never overlap).
    mapped: BTreeMap<usize, usize>,
    /// Ranges that may hold something other than zeros (written by the program, or copied).
    dirty: BTreeMap<usize, usize>,
    /// Ranges whose pages are resident (written, or zeroed by a write).
    resident: BTreeMap<usize, usize>,
    fail_discard: bool,
    release_discards: bool,
    /// Mappings are placed back to back, as the kernel does, and mremap refuses a range that
    /// spans two of them (`mapped` keeps one entry per mapping).
    adjacent: bool,
    /// A refused move loses its destination to another thread (see `Moved::DestinationLost`).
    lose_destinations: bool,
    next_addr: usize,
    fail_next_maps: u64,
    /// Fresh mappings are refused, but a mapping may still grow by moving (`grow_anywhere`): an
    /// address-space limit with room for a block's new length, not its old and new at once.
    room_to_move_only: bool,
    /// Ranges the program changed (protection, lock, fork or dump advice): not plain memory.
    altered: BTreeMap<usize, usize>,
    /// Ranges a forked child would not inherit (`keep_from_fork` until `readmit`).
    hidden: BTreeMap<usize, usize>,
    /// Ranges with huge-page advice the program set (only `renew` takes it away).
    advised: BTreeMap<usize, usize>,
    /// Locked ranges (`lock`, until `unlock`).
    locked: BTreeMap<usize, usize>,
    /// mlockall(MCL_FUTURE) is in force: new mappings come locked (`future_locking`).
    lock_future: bool,
    /// `reset_for_cache` fails (a sealed range).
    fail_resets: bool,
    /// The largest mapping the simulated system could ever make (0: no limit).
    largest_mapping: usize,
    /// Memory nears a limit (`near_limit`).
    near_limit: bool,
    /// The process the mappings belong to (`process_id`); a test sets another for a fork's child.
    process_id: u32,
    calls: PageCalls,
}

/// Simulated anonymous memory starting at a high fake address.
pub struct SimPages {
    state: Mutex<PageState>,
    /// Releases wait while held, having said they began (`hold_releases`): a test sees the
    /// background pass in the middle of its madvise.
    release_hold: AtomicU8,
}

const RELEASES_FREE: u8 = 0;
const RELEASES_HELD: u8 = 1;
const RELEASE_WAITING: u8 = 2;

impl Default for SimPages {
    fn default() -> Self {
        Self::new()
    }
}

impl SimPages {
    pub fn new() -> Self {
        SimPages { state: Mutex::new(PageState { next_addr: 0x5000_0000_0000, ..Default::default() }), release_hold: AtomicU8::new(RELEASES_FREE) }
    }

    /// The next release waits inside until `let_releases_go`.
    pub fn hold_releases(&self) {
        self.release_hold.store(RELEASES_HELD, SeqCst);
    }

    /// Whether a release waits inside.
    pub fn release_waiting(&self) -> bool {
        self.release_hold.load(SeqCst) == RELEASE_WAITING
    }

    pub fn let_releases_go(&self) {
        self.release_hold.store(RELEASES_FREE, SeqCst);
    }

    /// Mappings back to back, each its own kernel mapping (see `PageState::adjacent`).
    pub fn adjacent() -> Self {
        let pages = Self::new();
        pages.state.lock().unwrap().adjacent = true;
        pages
    }

    /// From now on a refused move loses its destination: the range leaves our mappings (any
    /// later use of it by us fails the test), as if another thread had mapped the hole.
    pub fn lose_destinations(&self) {
        self.state.lock().unwrap().lose_destinations = true;
    }

    /// The next `n` calls to `map` fail, as mmap does under ENOMEM.
    pub fn fail_next_maps(&self, n: u64) {
        self.state.lock().unwrap().fail_next_maps = n;
    }

    /// From now on `map` fails while `grow_anywhere` still moves a mapping (see
    /// `PageState::room_to_move_only`).
    pub fn room_to_move_only(&self) {
        self.state.lock().unwrap().room_to_move_only = true;
    }

    /// The program writes to `[addr, addr+len)`: it may no longer read zero, and is resident.
    pub fn write(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "write to unmapped memory {addr:#x}+{len}");
        let resident = Self::overlap_len(&st.resident, addr, len);
        st.calls.faulted_bytes += (len - resident) as u64;
        Self::add_range(&mut st.dirty, addr, len);
        Self::add_range(&mut st.resident, addr, len);
    }

    /// The program changes the range's protection or advice (mprotect, mlock, MADV_DONTFORK):
    /// it is not plain memory until `reset_for_cache`. The library hears of it from its libc
    /// shims: a test tells the layer too (`HostLayer::note_page_change`).
    pub fn alter(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "alter of unmapped memory {addr:#x}+{len}");
        Self::add_range(&mut st.altered, addr, len);
    }

    /// The program advises huge pages (or none) on the range: only fresh pages (`renew`) lose
    /// the advice. The library hears of it from its madvise shim: a test tells the layer too.
    pub fn advise(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "advice on unmapped memory {addr:#x}+{len}");
        Self::add_range(&mut st.advised, addr, len);
    }

    /// True when some of the range carries huge-page advice the program set.
    pub fn is_advised(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        Self::overlaps(&st.advised, addr, len)
    }

    /// The program calls mlockall(MCL_FUTURE) (true) or munlockall (false): new mappings come
    /// locked, as the kernel's do.
    pub fn lock_future(&self, on: bool) {
        self.state.lock().unwrap().lock_future = on;
    }

    /// True when every byte of the range is locked.
    pub fn is_locked(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        Self::overlap_len(&st.locked, addr, len) == len
    }

    /// True when some byte of the range is locked.
    pub fn any_locked(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        Self::overlaps(&st.locked, addr, len)
    }

    /// From now on the pages answer as a forked child's (another process id).
    pub fn become_child(&self) {
        self.state.lock().unwrap().process_id += 1;
    }

    /// Memory nears (or no longer nears) a limit, from now on.
    pub fn set_near_limit(&self, near: bool) {
        self.state.lock().unwrap().near_limit = near;
    }

    /// No mapping larger than `len` can ever succeed (`could_map`).
    pub fn set_largest_mapping(&self, len: usize) {
        self.state.lock().unwrap().largest_mapping = len;
    }

    /// `reset_for_cache` fails from now on (sealed ranges).
    pub fn fail_resets(&self) {
        self.state.lock().unwrap().fail_resets = true;
    }

    /// True when the range is plain memory a program may be handed: mapped, not altered, and
    /// inherited by forked children.
    pub fn is_plain(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        Self::covered(&st.mapped, addr, len) && !Self::overlaps(&st.altered, addr, len) && !Self::overlaps(&st.hidden, addr, len)
    }

    /// True when no byte of the range would be in a forked child.
    pub fn hidden_from_children(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        Self::overlap_len(&st.hidden, addr, len) == len
    }

    /// How many bytes of the range `ranges` records.
    fn overlap_len(ranges: &BTreeMap<usize, usize>, addr: usize, len: usize) -> usize {
        let end = addr + len;
        ranges.range(..end).filter(|(&s, &l)| s + l > addr).map(|(&s, &l)| (s + l).min(end) - s.max(addr)).sum()
    }

    /// True when the range lies inside one mapping, or anywhere mapped when mappings are
    /// not told apart.
    fn one_mapping(st: &PageState, addr: usize, len: usize) -> bool {
        if !st.adjacent {
            return Self::covered(&st.mapped, addr, len);
        }
        st.mapped.range(..=addr).next_back().is_some_and(|(&s, &l)| s + l >= addr + len)
    }

    /// True when every byte of the range reads zero.
    pub fn reads_zero(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        !Self::overlaps(&st.dirty, addr, len)
    }

    /// `release` drops pages from now on (a kernel without MADV_FREE).
    pub fn release_discards(&self) {
        self.state.lock().unwrap().release_discards = true;
    }

    /// `discard` fails from now on (a kernel that refuses madvise).
    pub fn fail_discards(&self) {
        self.state.lock().unwrap().fail_discard = true;
    }

    pub fn mapped_bytes(&self) -> usize {
        self.state.lock().unwrap().mapped.values().sum()
    }

    pub fn calls(&self) -> PageCalls {
        self.state.lock().unwrap().calls.clone()
    }

    /// True when `[addr, addr+len)` is entirely mapped.
    pub fn is_mapped(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        Self::covered(&st.mapped, addr, len)
    }

    fn covered(mapped: &BTreeMap<usize, usize>, addr: usize, len: usize) -> bool {
        let mut at = addr;
        let end = addr + len;
        while at < end {
            match mapped.range(..=at).next_back() {
                Some((&s, &l)) if s + l > at => at = s + l,
                _ => return false,
            }
        }
        true
    }

    fn overlaps(ranges: &BTreeMap<usize, usize>, addr: usize, len: usize) -> bool {
        ranges.range(..addr + len).any(|(&s, &l)| s + l > addr)
    }

    fn add_range(ranges: &mut BTreeMap<usize, usize>, addr: usize, len: usize) {
        Self::remove_range(ranges, addr, len);
        ranges.insert(addr, len);
    }

    /// Moves what `ranges` records over `[from, from+len)` to start at `to`.
    fn move_range(ranges: &mut BTreeMap<usize, usize>, from: usize, len: usize, to: usize) {
        let end = from + len;
        let inside: Vec<(usize, usize)> = ranges.range(..end).filter(|(&s, &l)| s + l > from).map(|(&s, &l)| (s.max(from), (s + l).min(end))).collect();
        Self::remove_range(ranges, from, len);
        for (s, e) in inside {
            Self::add_range(ranges, s - from + to, e - s);
        }
    }

    fn remove_range(mapped: &mut BTreeMap<usize, usize>, addr: usize, len: usize) {
        let end = addr + len;
        let touching: Vec<(usize, usize)> = mapped.range(..end).filter(|(&s, &l)| s + l > addr).map(|(&s, &l)| (s, l)).collect();
        for (s, l) in touching {
            mapped.remove(&s);
            if s < addr {
                mapped.insert(s, addr - s);
            }
            if s + l > end {
                mapped.insert(end, s + l - end);
            }
        }
    }
}

impl PageMemory for SimPages {
    fn map(&self, len: usize, align: usize) -> Option<usize> {
        let mut st = self.state.lock().unwrap();
        if st.fail_next_maps > 0 {
            st.fail_next_maps -= 1;
            return None;
        }
        if st.room_to_move_only {
            return None;
        }
        assert!(len > 0 && len.is_multiple_of(4096), "map of {len} bytes");
        let align = align.max(4096);
        let addr = (st.next_addr + align - 1) & !(align - 1);
        // Without `adjacent`, a guard gap: neighbours only where a block was split.
        st.next_addr = addr + len + if st.adjacent { 0 } else { 4096 };
        st.mapped.insert(addr, len);
        if st.lock_future {
            Self::add_range(&mut st.locked, addr, len);
        }
        st.calls.maps += 1;
        Some(addr)
    }

    fn unmap(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "unmap of unmapped memory {addr:#x}+{len}");
        Self::remove_range(&mut st.mapped, addr, len);
        Self::remove_range(&mut st.dirty, addr, len);
        Self::remove_range(&mut st.resident, addr, len);
        Self::remove_range(&mut st.altered, addr, len);
        Self::remove_range(&mut st.hidden, addr, len);
        Self::remove_range(&mut st.advised, addr, len);
        Self::remove_range(&mut st.locked, addr, len);
        st.calls.unmaps += 1;
    }

    fn reset_for_cache(&self, addr: usize, len: usize, keyed: bool) -> bool {
        let mut st = self.state.lock().unwrap();
        if st.fail_resets || !Self::covered(&st.mapped, addr, len) {
            return false;
        }
        st.calls.resets += 1;
        st.calls.keyed_resets += u64::from(keyed);
        Self::remove_range(&mut st.altered, addr, len);
        Self::remove_range(&mut st.hidden, addr, len);
        Self::remove_range(&mut st.locked, addr, len);
        true
    }

    fn renew(&self, addr: usize, len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "renew of unmapped memory {addr:#x}+{len}");
        if st.fail_resets {
            return false;
        }
        st.calls.renews += 1;
        let st = &mut *st;
        for ranges in [&mut st.dirty, &mut st.resident, &mut st.altered, &mut st.hidden, &mut st.advised, &mut st.locked] {
            Self::remove_range(ranges, addr, len);
        }
        if st.lock_future {
            Self::add_range(&mut st.locked, addr, len);
        }
        true
    }

    fn lock(&self, addr: usize, len: usize, _on_fault: bool) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "lock of unmapped memory {addr:#x}+{len}");
        st.calls.locks += 1;
        Self::add_range(&mut st.locked, addr, len);
        true
    }

    fn future_locking(&self) -> Option<bool> {
        self.state.lock().unwrap().lock_future.then_some(false)
    }

    fn unlock(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "unlock of unmapped memory {addr:#x}+{len}");
        st.calls.unlocks += 1;
        Self::remove_range(&mut st.locked, addr, len);
    }

    fn keep_from_fork(&self, addr: usize, len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "keep_from_fork of unmapped memory {addr:#x}+{len}");
        st.calls.fork_advice += 1;
        Self::add_range(&mut st.hidden, addr, len);
        true
    }

    fn near_limit(&self) -> bool {
        let mut st = self.state.lock().unwrap();
        st.calls.near_limit_reads += 1;
        st.near_limit
    }

    fn process_id(&self) -> u32 {
        self.state.lock().unwrap().process_id
    }

    fn could_map(&self, len: usize) -> bool {
        let largest = self.state.lock().unwrap().largest_mapping;
        largest == 0 || len <= largest
    }

    fn readmit(&self, addr: usize, len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "readmit of unmapped memory {addr:#x}+{len}");
        st.calls.fork_advice += 1;
        Self::remove_range(&mut st.hidden, addr, len);
        true
    }

    /// MADV_FREE: contents kept until the kernel takes the pages, so the range may still hold
    /// data; with `release_discards`, MADV_DONTNEED (a kernel without MADV_FREE): zero.
    fn release(&self, addr: usize, len: usize) -> bool {
        if self.release_hold.compare_exchange(RELEASES_HELD, RELEASE_WAITING, SeqCst, SeqCst).is_ok() {
            while self.release_hold.load(SeqCst) != RELEASES_FREE {
                std::thread::yield_now();
            }
        }
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "release of unmapped memory {addr:#x}+{len}");
        st.calls.releases += 1;
        if st.release_discards {
            Self::remove_range(&mut st.dirty, addr, len);
            Self::remove_range(&mut st.resident, addr, len);
        }
        st.release_discards
    }

    /// Succeeds when nothing is mapped after the block up to its new end: with the guard gap
    /// `map` leaves, that is the newest mapping, or one whose neighbour has been unmapped.
    fn extend(&self, addr: usize, old_len: usize, new_len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, old_len), "extend of unmapped memory");
        let (tail, end) = (addr + old_len, addr + new_len);
        if st.fail_next_maps > 0 || !Self::one_mapping(&st, addr, old_len) || st.mapped.range(..end).any(|(&s, &l)| s + l > tail) {
            return false;
        }
        match st.mapped.range(..=addr).next_back().map(|(&s, &l)| (s, l)) {
            // One mapping grows, as the kernel's does.
            Some((s, l)) if st.adjacent => st.mapped.insert(s, l + new_len - old_len),
            _ => st.mapped.insert(tail, new_len - old_len),
        };
        st.next_addr = st.next_addr.max(end + 4096);
        st.calls.remaps += 1;
        true
    }

    fn grow_anywhere(&self, addr: usize, old_len: usize, new_len: usize, align: usize) -> Option<usize> {
        let room_to_move_only = {
            let mut st = self.state.lock().unwrap();
            if st.fail_next_maps > 0 {
                st.fail_next_maps -= 1;
                return None;
            }
            if !Self::one_mapping(&st, addr, old_len) {
                return None;
            }
            core::mem::replace(&mut st.room_to_move_only, false)
        };
        // The kernel's room for the new length, then the pages moved into it.
        let to = self.map(new_len, align);
        self.state.lock().unwrap().room_to_move_only = room_to_move_only;
        let to = to?;
        match self.move_pages(addr, old_len, to) {
            Moved::Done => Some(to),
            _ => unreachable!("one mapping moves"),
        }
    }

    fn move_pages(&self, from: usize, len: usize, to: usize) -> Moved {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, from, len) && Self::covered(&st.mapped, to, len), "move outside mappings");
        assert!(from + len <= to || to + len <= from, "overlapping move");
        if !Self::one_mapping(&st, from, len) {
            if st.lose_destinations {
                let st = &mut *st;
                for ranges in [&mut st.mapped, &mut st.dirty, &mut st.resident, &mut st.altered, &mut st.hidden, &mut st.advised, &mut st.locked] {
                    Self::remove_range(ranges, to, len);
                }
                return Moved::DestinationLost;
            }
            return Moved::Refused;
        }
        Self::remove_range(&mut st.mapped, from, len);
        if st.adjacent {
            // The moved pages keep their own kernel mapping inside the destination.
            Self::remove_range(&mut st.mapped, to, len);
            st.mapped.insert(to, len);
        }
        let st = &mut *st;
        for ranges in [&mut st.dirty, &mut st.resident, &mut st.altered, &mut st.hidden, &mut st.advised, &mut st.locked] {
            Self::remove_range(ranges, to, len);
            Self::move_range(ranges, from, len, to);
        }
        st.calls.remaps += 1;
        Moved::Done
    }

    fn advise_huge(&self, addr: usize, len: usize) {
        assert!(self.is_mapped(addr, len));
    }

    fn zero(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "zero of unmapped memory");
        Self::remove_range(&mut st.dirty, addr, len);
        Self::add_range(&mut st.resident, addr, len);
        st.calls.zeroed_bytes += len as u64;
    }

    fn discard(&self, addr: usize, len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "discard of unmapped memory");
        if st.fail_discard {
            return false;
        }
        Self::remove_range(&mut st.dirty, addr, len);
        Self::remove_range(&mut st.resident, addr, len);
        st.calls.discarded_bytes += len as u64;
        true
    }

    /// In a child (`become_child`), ranges kept from children (`hidden`) are not there.
    fn presence(&self, addr: usize, len: usize) -> crate::backing::Presence {
        let st = self.state.lock().unwrap();
        let here = |a, l| Self::covered(&st.mapped, a, l) && (st.process_id == 0 || !Self::overlaps(&st.hidden, a, l));
        if !here(addr, 4096) {
            crate::backing::Presence::None
        } else if !here(addr, len) {
            let pages = (1..len / 4096).take_while(|&n| here(addr, (n + 1) * 4096)).count() + 1;
            crate::backing::Presence::Part { mapped: pages * 4096 }
        } else {
            crate::backing::Presence::All
        }
    }

    /// Exact here: whether at least half the range was resident.
    fn zero_weighed(&self, addr: usize, len: usize) -> bool {
        let resident = {
            let st = self.state.lock().unwrap();
            Self::overlap_len(&st.resident, addr, len)
        };
        self.zero(addr, len);
        resident * 2 >= len
    }

    fn sampled_written(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        let sample: Vec<usize> = crate::backing::written_sample(len).collect();
        let written = sample.iter().filter(|&&offset| Self::overlaps(&st.dirty, addr + offset, 4096)).count();
        !sample.is_empty() && 2 * written >= sample.len()
    }

    fn discard_weighed(&self, addr: usize, len: usize) -> Option<bool> {
        let resident = {
            let st = self.state.lock().unwrap();
            Self::overlap_len(&st.resident, addr, len)
        };
        self.discard(addr, len).then_some(resident * 2 >= len)
    }

    fn copy(&self, dst: usize, src: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, dst, len) && Self::covered(&st.mapped, src, len), "copy outside mappings");
        Self::add_range(&mut st.dirty, dst, len);
        Self::add_range(&mut st.resident, dst, len);
        st.calls.copied_bytes += len as u64;
    }
}

/// Simulated CUDA devices behind the runtime calls: fixed capacities, fake device addresses,
/// injected failures, and counts of the calls the layer makes (allocations, frees, syncs).
pub struct SimRuntime {
    state: Mutex<RuntimeState>,
    /// Reservations held until this many threads are inside `reserve` (wanted, arrived).
    reserve_meeting: (Mutex<(u64, u64)>, std::sync::Condvar),
}

#[derive(Default, Debug, Clone)]
pub struct SimDeviceState {
    pub capacity: usize,
    pub used: usize,
    pub mallocs: u64,
    pub frees: u64,
    pub syncs: u64,
    /// Virtual memory calls (Note [Expandable segments]): chunks mapped and unmapped, ranges
    /// reserved.
    pub maps: u64,
    pub unmaps: u64,
    pub moves: u64,
    pub reserves: u64,
    pub unreserves: u64,
}

#[derive(Default)]
struct RuntimeState {
    devices: Vec<SimDeviceState>,
    live: BTreeMap<usize, (usize, usize, u64)>, // addr -> (device, len, context)
    /// A user context made current (cuCtxCreate); `None`: the device's primary context.
    user_context: Option<u64>,
    /// Devices whose primary context has been created (by an allocation).
    primary_active: Vec<bool>,
    /// What `enter_device` replaced, for `leave_device`.
    entered: Vec<(i32, Option<u64>)>,
    pinned: BTreeMap<usize, usize>,
    current: i32,
    next_addr: usize,
    fail_next_mallocs: u64,
    /// The calling thread's capture mode (cuThreadExchangeStreamCaptureMode; one thread's: the
    /// tests that read it run one), 0 (global) at first.
    capture_mode: i32,
    /// Address reservations to refuse (an address-space limit).
    fail_next_reserves: u64,
    last_error: i32,
    pub host_allocs: u64,
    /// The virtual memory API's granularity; 0: a driver without it.
    granularity: u64,
    /// Mapped chunks: address -> (device, length, handle).
    mapped: BTreeMap<u64, (usize, u64, u64)>,
    /// (chunk address, peer device) pairs a chunk is accessible to besides its own device.
    access: std::collections::BTreeSet<(u64, usize)>,
    next_handle: u64,
    /// Open descriptors of exported chunk memory: fd -> physical handle.
    exported: BTreeMap<i32, u64>,
    next_fd: i32,
    /// Exports refused (a driver without shareable handles).
    refuse_exports: bool,
}

impl SimRuntime {
    pub fn new(capacities: &[usize]) -> Self {
        let devices = capacities.iter().map(|&capacity| SimDeviceState { capacity, ..Default::default() }).collect();
        let primary_active = vec![false; capacities.len()];
        let state = Mutex::new(RuntimeState { devices, primary_active, next_addr: 0x7f00_0000_0000, granularity: 2 << 20, ..Default::default() });
        SimRuntime { state, reserve_meeting: (Mutex::new((0, 0)), std::sync::Condvar::new()) }
    }
    /// A driver without the virtual memory API (granularity 0), or with another granularity.
    pub fn set_granularity(&self, bytes: u64) {
        self.state.lock().unwrap().granularity = bytes;
    }
    /// Whether a kernel of `device` may use `addr`: its own device's chunk, or a peer's it was
    /// granted access to.
    pub fn accessible(&self, addr: u64, device: usize) -> bool {
        let st = self.state.lock().unwrap();
        st.mapped.range(..=addr).next_back().is_some_and(|(&base, &(d, len, _))| addr < base + len && (d == device || st.access.contains(&(base, device))))
    }
    /// Open descriptors of exported chunk memory, and the handles they name.
    pub fn exported_fds(&self) -> Vec<(i32, u64)> {
        self.state.lock().unwrap().exported.iter().map(|(&fd, &h)| (fd, h)).collect()
    }
    /// The physical handle mapped at chunk `addr`.
    pub fn chunk_handle(&self, addr: u64) -> Option<u64> {
        self.state.lock().unwrap().mapped.get(&addr).map(|m| m.2)
    }
    /// A driver whose chunks cannot be exported (no POSIX file descriptor handles).
    pub fn refuse_exports(&self) {
        self.state.lock().unwrap().refuse_exports = true;
    }
    /// Whether `addr` lies in a mapped chunk (device memory a kernel could use).
    pub fn is_mapped(&self, addr: u64) -> bool {
        let st = self.state.lock().unwrap();
        st.mapped.range(..=addr).next_back().is_some_and(|(&base, &(_, len, _))| addr < base + len)
    }
    pub fn device(&self, d: usize) -> SimDeviceState {
        self.state.lock().unwrap().devices[d].clone()
    }
    /// Another process on the GPU takes (or, negative, gives back) memory of device `d`.
    pub fn neighbour_uses(&self, d: usize, bytes: isize) {
        let mut st = self.state.lock().unwrap();
        let dev = &mut st.devices[d];
        dev.used = dev.used.checked_add_signed(bytes).unwrap();
    }

    pub fn fail_next_mallocs(&self, n: u64) {
        self.state.lock().unwrap().fail_next_mallocs = n;
    }
    /// The next `n` threads to reserve address space wait in `reserve` until all `n` are there
    /// (at most 10 s): requests that all reserve a range before any adds one.
    pub fn meet_in_reserve(&self, n: u64) {
        *self.reserve_meeting.0.lock().unwrap() = (n, 0);
    }
    /// The next `n` address reservations are refused with out of memory.
    pub fn fail_next_reserves(&self, n: u64) {
        self.state.lock().unwrap().fail_next_reserves = n;
    }
    pub fn last_error(&self) -> i32 {
        self.state.lock().unwrap().last_error
    }
    pub fn host_allocs(&self) -> u64 {
        self.state.lock().unwrap().host_allocs
    }
    pub fn pinned_bytes(&self) -> usize {
        self.state.lock().unwrap().pinned.values().sum()
    }
    /// cudaSetDevice, for tests.
    pub fn set_device(&self, device: i32) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        if device < 0 || device as usize >= st.devices.len() {
            return Err(DeviceError::Other(101));
        }
        st.current = device;
        Ok(())
    }
    /// Makes a user context current (`Some`) or goes back to the primary ones (`None`).
    pub fn set_context(&self, ctx: Option<u64>) {
        self.state.lock().unwrap().user_context = ctx;
    }
    /// The primary context handle of `device` (stable across resets, as a pool must not rely on
    /// a new handle to notice one).
    pub fn primary_handle(device: usize) -> u64 {
        0x1000 + device as u64
    }
    /// What the runtime does at a reset or destroy: every allocation of `ctx` is gone.
    pub fn destroy_context(&self, ctx: u64) {
        let mut st = self.state.lock().unwrap();
        let dead: Vec<usize> = st.live.iter().filter(|(_, v)| v.2 == ctx).map(|(a, _)| *a).collect();
        for a in dead {
            let (d, len, _) = st.live.remove(&a).unwrap();
            st.devices[d].used -= len;
        }
        if ctx >= 0x1000 && ctx < 0x1000 + st.devices.len() as u64 {
            let d = (ctx - 0x1000) as usize;
            st.primary_active[d] = false;
        }
    }
    /// Whether `addr` is inside a live allocation (a "kernel" could touch it).
    pub fn is_live(&self, addr: usize) -> bool {
        self.allocation_range(addr).is_some()
    }
    fn context_in(st: &RuntimeState) -> u64 {
        st.user_context.unwrap_or(Self::primary_handle(st.current as usize))
    }
}

impl DeviceRuntime for SimRuntime {
    fn current_device(&self) -> Result<i32, DeviceError> {
        Ok(self.state.lock().unwrap().current)
    }
    fn enter_device(&self, device: i32, ctx: u64) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        if device < 0 || device as usize >= st.devices.len() {
            return Err(DeviceError::Other(101)); // CUDA_ERROR_INVALID_DEVICE
        }
        let saved = (st.current, st.user_context);
        st.entered.push(saved);
        st.current = device;
        st.user_context = (ctx != 0 && ctx != Self::primary_handle(device as usize)).then_some(ctx);
        Ok(())
    }
    fn enter_context(&self, ctx: u64) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        let saved = (st.current, st.user_context);
        st.entered.push(saved);
        match (0..st.devices.len()).find(|&d| Self::primary_handle(d) == ctx) {
            Some(d) => (st.current, st.user_context) = (d as i32, None),
            None => st.user_context = Some(ctx),
        }
        Ok(())
    }
    fn leave_device(&self) {
        let mut st = self.state.lock().unwrap();
        let (device, ctx) = st.entered.pop().expect("leave_device without enter_device");
        st.current = device;
        st.user_context = ctx;
    }
    fn malloc(&self, len: usize) -> Result<usize, DeviceError> {
        let mut st = self.state.lock().unwrap();
        let d = st.current as usize;
        // Overflow-safe, as the driver's check: a size past the capacity never wraps into it.
        let footprint = len.max(1).checked_add(0xfffff).map_or(usize::MAX, |n| n & !0xfffff);
        if st.fail_next_mallocs > 0 || footprint > st.devices[d].capacity.saturating_sub(st.devices[d].used) {
            st.fail_next_mallocs = st.fail_next_mallocs.saturating_sub(1);
            st.last_error = 2;
            return Err(DeviceError::OutOfMemory);
        }
        let addr = st.next_addr;
        st.next_addr += footprint + (2 << 20);
        st.devices[d].used += footprint;
        st.devices[d].mallocs += 1;
        let ctx = Self::context_in(&st);
        if st.user_context.is_none() {
            st.primary_active[d] = true;
        }
        st.live.insert(addr, (d, footprint, ctx));
        Ok(addr)
    }
    fn free(&self, addr: usize) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        let Some((d, len, _)) = st.live.remove(&addr) else {
            st.last_error = 1;
            return Err(DeviceError::Other(1));
        };
        st.devices[d].used -= len;
        st.devices[d].frees += 1;
        st.devices[d].syncs += 1;
        Ok(())
    }
    fn synchronize(&self) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        let d = st.current as usize;
        st.devices[d].syncs += 1;
        Ok(())
    }
    fn mem_info(&self) -> Result<(usize, usize), DeviceError> {
        let st = self.state.lock().unwrap();
        let dev = &st.devices[st.current as usize];
        Ok((dev.capacity - dev.used, dev.capacity))
    }
    fn host_alloc(&self, len: usize, _flags: u32) -> Result<usize, DeviceError> {
        let mut st = self.state.lock().unwrap();
        // As the runtime: more than a machine could pin is out of memory.
        if len > 1 << 40 {
            st.last_error = 2;
            return Err(DeviceError::OutOfMemory);
        }
        let addr = st.next_addr;
        st.next_addr += len + (2 << 20);
        st.pinned.insert(addr, len);
        st.host_allocs += 1;
        Ok(addr)
    }
    fn host_free(&self, addr: usize) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        st.pinned.remove(&addr).map(|_| ()).ok_or(DeviceError::Other(1))
    }
    fn clear_last_error(&self) {
        self.state.lock().unwrap().last_error = 0;
    }
    fn exchange_capture_mode(&self, mode: i32) -> Option<i32> {
        Some(core::mem::replace(&mut self.state.lock().unwrap().capture_mode, mode))
    }
    fn current_context(&self) -> u64 {
        let st = self.state.lock().unwrap();
        if st.user_context.is_none() && !st.primary_active[st.current as usize] {
            return 0; // no context until the runtime first needs one
        }
        Self::context_in(&st)
    }
    fn primary_was_reset(&self, _device: i32) {
        // The simulation keeps no reference counts: entering a device does not retain it.
    }
    fn primary_context(&self, device: i32) -> PrimaryContext {
        let st = self.state.lock().unwrap();
        match st.primary_active.get(device as usize) {
            Some(true) => PrimaryContext::Active(Self::primary_handle(device as usize)),
            Some(false) => PrimaryContext::Inactive,
            None => PrimaryContext::Unknown,
        }
    }
    fn allocation_range(&self, addr: usize) -> Option<(usize, usize)> {
        let st = self.state.lock().unwrap();
        if let Some((&base, &(_, len, _))) = st.mapped.range(..=addr as u64).next_back().filter(|(&b, &(_, l, _))| (addr as u64) < b + l) {
            return Some((base as usize, len as usize)); // the driver answers a chunk's mapping
        }
        let (&base, &(_, len, _)) = st.live.range(..=addr).next_back()?;
        (addr < base + len).then_some((base, len))
    }
    fn granularity(&self, device: i32) -> Option<u64> {
        let st = self.state.lock().unwrap();
        (st.granularity != 0 && usize::try_from(device).is_ok_and(|d| d < st.devices.len())).then_some(st.granularity)
    }
    fn reserve(&self, len: u64) -> Result<u64, DeviceError> {
        {
            let (meeting, arrivals) = &self.reserve_meeting;
            let mut m = meeting.lock().unwrap();
            if m.1 < m.0 {
                m.1 += 1;
                arrivals.notify_all();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while m.1 < m.0 && std::time::Instant::now() < deadline {
                    m = arrivals.wait_timeout(m, std::time::Duration::from_millis(10)).unwrap().0;
                }
            }
        }
        let mut st = self.state.lock().unwrap();
        if st.granularity == 0 || len == 0 || !len.is_multiple_of(st.granularity) {
            return Err(DeviceError::Other(1));
        }
        if st.fail_next_reserves > 0 {
            st.fail_next_reserves -= 1;
            return Err(DeviceError::OutOfMemory);
        }
        let addr = (st.next_addr as u64).next_multiple_of(st.granularity);
        st.next_addr = (addr + len + st.granularity) as usize;
        let d = st.current as usize;
        st.devices[d].reserves += 1;
        Ok(addr)
    }
    fn grant_access(&self, addr: u64, len: u64, device: i32) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        let keys: Vec<u64> = st.mapped.range(addr..addr + len).map(|(&a, _)| a).collect();
        for a in keys {
            st.access.insert((a, device as usize));
        }
        Ok(())
    }
    fn map_chunk(&self, device: i32, addr: u64, len: u64, peers: u64) -> Result<u64, DeviceError> {
        let mut st = self.state.lock().unwrap();
        let d = device as usize;
        let overlaps = st.mapped.range(..addr + len).next_back().is_some_and(|(&b, &(_, l, _))| addr < b + l);
        if st.granularity == 0 || !len.is_multiple_of(st.granularity) || !addr.is_multiple_of(st.granularity) || overlaps {
            return Err(DeviceError::Other(1));
        }
        if st.fail_next_mallocs > 0 || len as usize > st.devices[d].capacity.saturating_sub(st.devices[d].used) {
            st.fail_next_mallocs = st.fail_next_mallocs.saturating_sub(1);
            st.last_error = 2;
            return Err(DeviceError::OutOfMemory);
        }
        st.next_handle += 1;
        let handle = st.next_handle;
        st.mapped.insert(addr, (d, len, handle));
        for p in (0..64).filter(|p| peers >> p & 1 == 1) {
            st.access.insert((addr, p));
        }
        st.devices[d].used += len as usize;
        st.devices[d].maps += 1;
        Ok(handle)
    }
    fn ipc_handle(&self, base: u64) -> Result<[u8; 64], DeviceError> {
        // The driver's handle names an allocation: its base, here, behind a mark of the sim's.
        let st = self.state.lock().unwrap();
        if !st.live.contains_key(&(base as usize)) {
            return Err(DeviceError::Other(1));
        }
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(b"SIMIPC\0\0");
        h[8..16].copy_from_slice(&base.to_le_bytes());
        Ok(h)
    }
    fn unreserve(&self, addr: u64, len: u64) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        if st.mapped.range(addr..addr.saturating_add(len)).next().is_some() {
            return Err(DeviceError::Other(1)); // chunks still mapped inside
        }
        let d = st.current as usize;
        st.devices[d].unreserves += 1;
        Ok(())
    }
    fn move_chunk(&self, device: i32, from: u64, to: u64, len: u64, handle: u64, peers: u64) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        // Note [IPC of expandable segments]: a peer may map this memory at the block's place.
        assert!(!st.exported.values().any(|&h| h == handle), "exported chunk memory {handle} moved from {from:#x} to {to:#x}");
        let overlaps = st.mapped.range(..to + len).next_back().is_some_and(|(&b, &(_, l, _))| to < b + l);
        match st.mapped.get(&from) {
            Some(&(d, l, h)) if l == len && h == handle && d == device as usize && !overlaps => {
                st.mapped.remove(&from);
                st.mapped.insert(to, (d, len, handle));
                st.access.retain(|&(a, _)| a != from);
                for p in (0..64).filter(|p| peers >> p & 1 == 1) {
                    st.access.insert((to, p));
                }
                st.devices[d].moves += 1;
                Ok(())
            }
            _ => Err(DeviceError::Other(1)),
        }
    }
    fn export_chunk(&self, handle: u64) -> Result<i32, DeviceError> {
        let mut st = self.state.lock().unwrap();
        if st.refuse_exports {
            return Err(DeviceError::Other(801)); // CUDA_ERROR_NOT_SUPPORTED
        }
        if !st.mapped.values().any(|m| m.2 == handle) {
            return Err(DeviceError::Other(1));
        }
        st.next_fd += 1;
        let fd = 1000 + st.next_fd;
        st.exported.insert(fd, handle);
        Ok(fd)
    }
    fn close_exported(&self, fd: i32) {
        assert!(self.state.lock().unwrap().exported.remove(&fd).is_some(), "descriptor {fd} closed twice or never exported");
    }
    fn dup_exported(&self, fd: i32) -> Option<i32> {
        let mut st = self.state.lock().unwrap();
        let handle = *st.exported.get(&fd)?;
        st.next_fd += 1;
        let dup = 1000 + st.next_fd;
        st.exported.insert(dup, handle);
        Some(dup)
    }
    fn unmap_chunk(&self, addr: u64, len: u64, handle: u64) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        match st.mapped.get(&addr) {
            Some(&(d, l, h)) if l == len && h == handle => {
                st.mapped.remove(&addr);
                st.access.retain(|&(a, _)| a != addr);
                st.devices[d].used -= len as usize;
                st.devices[d].unmaps += 1;
                Ok(())
            }
            _ => Err(DeviceError::Other(1)),
        }
    }
}
