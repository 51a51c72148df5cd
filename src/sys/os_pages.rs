//! `PageMemory` over the kernel: mmap, munmap, madvise, mremap. Aligned mappings are made by
//! over-mapping and trimming, so every block we own starts exactly at the address we return.

use crate::backing::{Moved, PageMemory, Presence, PAGE};
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};


/// Set once MADV_FREE has been refused on a fresh page (kernels before 4.5, or a seccomp filter):
/// later releases use MADV_DONTNEED.
static NO_MADV_FREE: AtomicBool = AtomicBool::new(false);

/// Cleared once pkey_mprotect has failed where mprotect succeeded: the process has no keys, so
/// no block can carry one.
static PKEYS: AtomicBool = AtomicBool::new(true);

/// What mlockall last asked of future mappings (route/page_calls.rs keeps it): NOT_LOCKED, or
/// LOCKED / LOCKED_ON_FAULT under MCL_FUTURE (with MCL_ONFAULT).
static FUTURE_LOCKING: AtomicU8 = AtomicU8::new(NOT_LOCKED);
const NOT_LOCKED: u8 = 0;
const LOCKED: u8 = 1;
const LOCKED_ON_FAULT: u8 = 2;

/// The program's mlockall (or munlockall: `None`) succeeded: new mappings are locked from now
/// on (`Some(on_fault)`), or no longer.
pub fn set_future_locking(mode: Option<bool>) {
    FUTURE_LOCKING.store(
        match mode {
            None => NOT_LOCKED,
            Some(false) => LOCKED,
            Some(true) => LOCKED_ON_FAULT,
        },
        Ordering::Relaxed,
    );
}

/// Unlocks a table of ours, which mlockall(MCL_CURRENT) locked (Note [Locked memory] in
/// host/host_layer/mod.rs): its pages stay as they are.
pub fn unlock_ours(addr: usize, len: usize) {
    // SAFETY: our own table; unlocking changes no contents (munlock rounds to pages).
    unsafe { calls::munlock(addr as *const libc::c_void, len) };
}

fn future_locking() -> Option<bool> {
    match FUTURE_LOCKING.load(Ordering::Relaxed) {
        LOCKED => Some(false),
        LOCKED_ON_FAULT => Some(true),
        _ => None,
    }
}

/// Dropping a resident 4 KiB page costs 60-250 ns, a resident 2 MiB huge page about 5 us (10 ns
/// per 4 KiB of it), a page never touched about nothing: a drop that took more than this per 4
/// KiB, past the call's own cost, found the range mostly resident (Note [calloc costs what is
/// touched] in host/host_layer/alloc.rs). A drop the scheduler interrupted looks long: it votes
/// for writing, which the next write, weighed in pieces, corrects. (The thread's CPU clock would
/// not see the interruption, but reading it is a real system call, one a malloc never makes.)
const RESIDENT_NS_PER_PAGE: u64 = 4;
const DROP_CALL_NS: u64 = 2_000;
/// Writing a resident 4 KiB page costs 100-300 ns; one not resident faults first (the kernel's
/// fault and zeroing, 0.6-2 us): a write whose median piece took more than this per 4 KiB found
/// the range mostly not resident.
const NOT_RESIDENT_WRITE_NS_PER_PAGE: u64 = 500;
/// A weighed write goes in at most this many pieces of at least MIN_PIECE_PAGES, each timed: on
/// a loaded machine (a virtual one whose host takes its CPU away, a thread preempted) one write
/// in a few took 500-2,000 ns a resident page, in the clock's time and in the thread's CPU time
/// alike, and two such in a row sent calloc back to dropping blocks the program fills every
/// time (each then faulted in whole, 1 step in 8 of a training loop). Such a stall lands in a
/// few pieces; faults land in every piece of a range mostly not resident: the median piece says
/// which it was. One clock read (the vDSO's) per 64 KiB or more: under 1% of the write.
const WEIGHED_PIECES: usize = 32;
const MIN_PIECE_PAGES: usize = 16;
// (Blocks in transparent huge pages fault once per 2 MiB, inside a few pieces: a block of them
// not resident reads as resident, as it did timed whole. Writing it costs about twice what a
// resident one does, so the vote errs toward writing where dropping would have been cheaper.)

/// The lower median of `costs` (sorted in place; 0 for none): at least half the values are at
/// or above it only when more than half were.
fn lower_median(costs: &mut [u64]) -> u64 {
    costs.sort_unstable();
    costs.get(costs.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

use super::page_calls as calls;
use super::process::errno;

/// Removes the guard regions MADV_GUARD_INSTALL put in a range (Linux 6.13; EINVAL before, when
/// no range can have any).
const MADV_GUARD_REMOVE: i32 = 103;
/// mlock2's flag: lock pages as they are touched (MCL_ONFAULT's counterpart).
const MLOCK_ONFAULT: u32 = 1;

/// Whether MADV_FREE works on a page of our own, fresh and unlocked.
fn kernel_has_madv_free() -> bool {
    let Some(page) = OsPages::mmap_anywhere(PAGE) else { return true };
    // SAFETY: a page we just mapped.
    let ok = unsafe { calls::madvise(page as *mut libc::c_void, PAGE, libc::MADV_FREE) } == 0;
    OsPages.unmap(page, PAGE);
    ok
}

pub struct OsPages;

const THP_SIZE: usize = 2 << 20;

impl OsPages {
    /// An anonymous private mapping at an address of the kernel's choosing.
    fn mmap_anywhere(len: usize) -> Option<usize> {
        // SAFETY: a fresh mapping that overlaps nothing of anyone's.
        let p = unsafe {
            calls::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        (p != libc::MAP_FAILED).then_some(p as usize)
    }
}

impl PageMemory for OsPages {
    fn map(&self, len: usize, align: usize) -> Option<usize> {
        let align = align.max(PAGE);
        // Linux places anonymous mappings of a multiple of 2 MiB on a 2 MiB boundary: one mmap
        // instead of an mmap and two trimming munmaps, each of which waits for the address
        // space lock behind every page fault of the other threads (16-thread churn).
        if len.is_multiple_of(THP_SIZE) && align <= THP_SIZE && align > PAGE {
            let p = Self::mmap_anywhere(len)?;
            if p % align == 0 {
                return Some(p);
            }
            self.unmap(p, len);
        }
        let span = len.checked_add(align - PAGE)?;
        let start = Self::mmap_anywhere(span)?;
        let aligned = (start + align - 1) & !(align - 1);
        let head = aligned - start;
        let tail = span - head - len;
        if head > 0 {
            self.unmap(start, head);
        }
        if tail > 0 {
            self.unmap(aligned + len, tail);
        }
        Some(aligned)
    }

    fn unmap(&self, addr: usize, len: usize) {
        // SAFETY: the caller owns the page-aligned range and no longer uses it.
        let unmap = |a: usize, l: usize| unsafe { calls::munmap(a as *mut libc::c_void, l) } == 0;
        if unmap(addr, len) {
            // A mapping came free: ranges the kernel refused before may go now.
            super::unmap_later::WAITING.retry(unmap);
            return;
        }
        // Note [Unmaps the kernel refused]: the pages go now, the range when it can. A range
        // partly unmapped already (by the program) fails with no split to refuse: nothing waits.
        if errno() == libc::ENOMEM && self.discard(addr, len) {
            let _ = super::unmap_later::WAITING.keep(addr, len);
        }
    }

    fn release(&self, addr: usize, len: usize) -> bool {
        if !NO_MADV_FREE.load(Ordering::Relaxed) {
            // SAFETY: the caller owns the range; MADV_FREE only affects its contents.
            if unsafe { calls::madvise(addr as *mut libc::c_void, len, libc::MADV_FREE) } == 0 {
                return false;
            }
            // EINVAL also comes for a range MADV_FREE will not take (locked pages): only a
            // fresh page refusing it too says the kernel lacks it.
            if errno() == libc::EINVAL && !kernel_has_madv_free() {
                NO_MADV_FREE.store(true, Ordering::Relaxed);
            }
        }
        // MADV_DONTNEED makes the pages read back as zero.
        self.discard(addr, len)
    }

    fn reset_for_cache(&self, addr: usize, len: usize, keyed: bool) -> bool {
        let p = addr as *mut libc::c_void;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: the caller owns the range (a block the program freed); these calls change only
        // its protection, lock state and advice, never what other mappings hold. A range that
        // is partly unmapped fails with ENOMEM, a sealed one with EPERM.
        unsafe {
            // Key 0 is the default protection key: a block the program tagged with another goes
            // back to it. Only such a block (we saw the program's pkey_mprotect) pays for
            // pkey_mprotect, which filters such as systemd's @system-service refuse; where the
            // process has no keys (no PKU: EINVAL; before 4.9: ENOSYS), plain mprotect, from then
            // on directly.
            if keyed && PKEYS.load(Ordering::Relaxed) {
                if calls::pkey_mprotect(p, len, rw, 0) != 0 {
                    if calls::mprotect(p, len, rw) != 0 {
                        return false;
                    }
                    PKEYS.store(false, Ordering::Relaxed);
                }
            } else if calls::mprotect(p, len, rw) != 0 {
                return false;
            }
            // ENOMEM: part of the range is not mapped (or the kernel's limit on mappings would
            // be passed). Any other refusal (EINVAL: advice this kernel does not know, such as
            // KEEPONFORK before 4.14, UNMERGEABLE without KSM; ENOSYS or EPERM: a seccomp filter) means the program could
            // not have made that change either: nothing to undo.
            if calls::munlock(p, len) != 0 && errno() == libc::ENOMEM {
                return false;
            }
            for advice in [libc::MADV_DOFORK, libc::MADV_KEEPONFORK, libc::MADV_DODUMP, libc::MADV_UNMERGEABLE, MADV_GUARD_REMOVE] {
                if calls::madvise(p, len, advice) != 0 && errno() == libc::ENOMEM {
                    return false;
                }
            }
        }
        true
    }

    fn renew(&self, addr: usize, len: usize) -> bool {
        // SAFETY: the caller owns the range and gives up its contents; MAP_FIXED replaces only
        // these pages, atomically (no moment where another thread could map into a hole).
        let p = unsafe {
            calls::mmap(addr as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0)
        };
        p as usize == addr
    }

    fn lock(&self, addr: usize, len: usize, on_fault: bool) -> bool {
        // SAFETY: the caller owns the range; locking changes no contents.
        unsafe {
            if on_fault {
                calls::mlock2(addr as *const libc::c_void, len, MLOCK_ONFAULT) == 0
            } else {
                calls::mlock(addr as *const libc::c_void, len) == 0
            }
        }
    }

    fn unlock(&self, addr: usize, len: usize) {
        // SAFETY: as in lock.
        unsafe { calls::munlock(addr as *const libc::c_void, len) };
    }

    fn future_locking(&self) -> Option<bool> {
        future_locking()
    }

    fn near_limit(&self) -> bool {
        super::memory::near_limit()
    }

    fn process_id(&self) -> u32 {
        super::process::id()
    }

    #[inline(always)]
    fn adopt_unseen_fork(&self) {
        super::fork_mark::check();
    }

    fn could_map(&self, len: usize) -> bool {
        len as u64 <= super::memory::largest_possible_mapping()
    }

    fn keep_from_fork(&self, addr: usize, len: usize) -> bool {
        // SAFETY: the caller owns the range; advice only.
        unsafe { calls::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTFORK) == 0 }
    }

    fn readmit(&self, addr: usize, len: usize) -> bool {
        // SAFETY: the caller owns the range; advice only. As in reset_for_cache, only ENOMEM
        // means the advice could not be undone (a refused MADV_DONTFORK was never applied).
        unsafe { calls::madvise(addr as *mut libc::c_void, len, libc::MADV_DOFORK) == 0 || errno() != libc::ENOMEM }
    }

    fn extend(&self, addr: usize, old_len: usize, new_len: usize) -> bool {
        // SAFETY: the caller owns [addr, addr+old_len), a whole mapping of ours; without
        // MREMAP_MAYMOVE the kernel grows it where it is or fails.
        unsafe { calls::mremap(addr as *mut libc::c_void, old_len, new_len, 0, core::ptr::null_mut()) != libc::MAP_FAILED }
    }

    fn move_pages(&self, from: usize, len: usize, to: usize) -> Moved {
        // SAFETY: both ranges are ours; MREMAP_FIXED replaces what is at `to`, which the
        // caller mapped for this.
        let moved = unsafe {
            calls::mremap(from as *mut libc::c_void, len, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, to as *mut libc::c_void)
        };
        if moved != libc::MAP_FAILED {
            return Moved::Done;
        }
        // A refusal may come after the kernel unmapped the destination (before 6.17, a source
        // spanning two mappings is refused that way). Map it back, never over anyone's: with
        // MAP_FIXED_NOREPLACE, if anything stands there (our own range, left intact, or
        // another thread's mapping in the hole), it is not ours to touch any more.
        // SAFETY: NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            calls::mmap(
                to as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p as usize == to {
            return Moved::Refused;
        }
        if p != libc::MAP_FAILED {
            // A kernel before 4.17 took NOREPLACE as a hint and mapped elsewhere.
            self.unmap(p as usize, len);
        }
        Moved::DestinationLost
    }

    fn grow_anywhere(&self, addr: usize, old_len: usize, new_len: usize, align: usize) -> Option<usize> {
        let align = align.max(PAGE);
        let span = new_len.checked_add(align - PAGE)?;
        // SAFETY: the caller owns [addr, addr+old_len), one mapping of ours; on failure the
        // kernel leaves it where it was, on success it is gone from there.
        let moved = unsafe { calls::mremap(addr as *mut libc::c_void, old_len, span, libc::MREMAP_MAYMOVE, core::ptr::null_mut()) };
        if moved == libc::MAP_FAILED {
            return None;
        }
        let start = moved as usize;
        let aligned = (start + align - 1) & !(align - 1);
        if aligned != start {
            // The program's pages (Note [Signals off our stack]).
            // SAFETY: both ranges lie in the span just mapped for us; copy handles the overlap.
            super::stack_switch::as_the_program(|| unsafe { core::ptr::copy(start as *const u8, aligned as *mut u8, old_len) });
            self.unmap(start, aligned - start);
        }
        let tail = start + span - (aligned + new_len);
        if tail > 0 {
            self.unmap(aligned + new_len, tail);
        }
        Some(aligned)
    }

    fn advise_huge(&self, addr: usize, len: usize) {
        // SAFETY: advice only; failure (THP off) is harmless.
        unsafe { calls::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    }

    fn zero(&self, addr: usize, len: usize) {
        // SAFETY: the caller owns the writable range.
        unsafe { core::ptr::write_bytes(addr as *mut u8, 0, len) };
    }

    fn zero_weighed(&self, addr: usize, len: usize) -> bool {
        let pages = len / PAGE;
        let pieces = (pages / MIN_PIECE_PAGES).clamp(1, WEIGHED_PIECES);
        let piece = (pages / pieces).max(1) * PAGE;
        let mut costs = [0u64; WEIGHED_PIECES];
        let (mut at, mut n) = (0, 0);
        let mut before = super::clock::now_ns();
        while at < len && n < WEIGHED_PIECES {
            // The last piece takes the rest.
            let this = if n + 1 == pieces { len - at } else { piece.min(len - at) };
            self.zero(addr + at, this);
            let after = super::clock::now_ns();
            if let Some(cost) = costs.get_mut(n) {
                *cost = after.saturating_sub(before) / (this / PAGE).max(1) as u64;
            }
            (before, at, n) = (after, at + this, n + 1);
        }
        // None is left (the last piece took the rest); were one, it still reads zero.
        if at < len {
            self.zero(addr + at, len - at);
        }
        lower_median(costs.get_mut(..n).unwrap_or(&mut [])) <= NOT_RESIDENT_WRITE_NS_PER_PAGE
    }

    fn sampled_written(&self, addr: usize, len: usize) -> bool {
        let sampled = crate::backing::written_sample(len).count();
        let mut written = 0;
        for offset in crate::backing::written_sample(len) {
            // SAFETY: a whole page inside a range the caller owns, mapped and readable; a page
            // never touched reads the kernel's zero page.
            let words = unsafe { core::slice::from_raw_parts((addr + offset) as *const u64, PAGE / 8) };
            written += usize::from(words.iter().any(|&w| w != 0));
            // A dense block is known at half the pages.
            if 2 * written >= sampled {
                return true;
            }
        }
        false
    }

    fn discard(&self, addr: usize, len: usize) -> bool {
        // SAFETY: the caller owns the range and wants its contents gone.
        unsafe { calls::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) == 0 }
    }

    fn discard_weighed(&self, addr: usize, len: usize) -> Option<bool> {
        let start = super::clock::now_ns();
        if !self.discard(addr, len) {
            return None;
        }
        let took_ns = super::clock::now_ns().saturating_sub(start);
        let pages = (len / PAGE) as u64;
        Some(took_ns > DROP_CALL_NS.saturating_add(pages.saturating_mul(RESIDENT_NS_PER_PAGE)))
    }

    fn presence(&self, addr: usize, len: usize) -> Presence {
        // msync is a cancellation point (Note [Cancellation points] in sys/cancel.rs).
        super::cancel::cancel_held(|| presence_of(addr, len))
    }

    fn copy(&self, dst: usize, src: usize, len: usize) {
        // The program's pages: a fault there is its handler's (Note [Signals off our stack]).
        // SAFETY: the caller owns both ranges, which do not overlap.
        super::stack_switch::as_the_program(|| unsafe { core::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) });
    }
}

/// Whether [addr, addr+len) is mapped: none, part (how much from its start) or all of it.
fn presence_of(addr: usize, len: usize) -> Presence {
    // msync(MS_ASYNC) of anonymous memory does nothing but check that the whole range is
    // mapped (ENOMEM otherwise).
    // SAFETY: as said; no memory is touched.
    let mapped = |n: usize| unsafe { libc::msync(addr as *mut libc::c_void, n, libc::MS_ASYNC) == 0 };
    if !mapped(PAGE) {
        return Presence::None;
    }
    if mapped(len) {
        return Presence::All;
    }
    // The mapped prefix, in whole pages, by halving: [lo, hi) pages holds the answer.
    let (mut lo, mut hi) = (1, len / PAGE);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if mapped(mid * PAGE) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Presence::Part { mapped: lo * PAGE }
}

/// A table `map_table` made, given back (the few that are not kept for good: a thread's scope
/// frames).
pub fn unmap_table(addr: usize, len: usize) {
    OsPages.unmap(addr, len);
}

/// Fresh zeroed memory for our own tables, kept for good (but for `unmap_table`'s). Not on any allocation path after the
/// first use, and never through the malloc family.
pub fn map_table(len: usize) -> Option<usize> {
    if future_locking().is_none() {
        return OsPages.map(len, PAGE);
    }
    // Under mlockall(MCL_FUTURE) a read-write mapping comes locked with every page faulted in,
    // and our tables are mostly never touched: mapped inaccessible (which mlock does not fault
    // in), unlocked, then opened.
    // SAFETY: a fresh mapping of our own, changed only by us.
    unsafe {
        let p = calls::mmap(core::ptr::null_mut(), len, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        if p == libc::MAP_FAILED {
            return None;
        }
        calls::munlock(p, len);
        if calls::mprotect(p, len, libc::PROT_READ | libc::PROT_WRITE) != 0 {
            OsPages.unmap(p as usize, len);
            return None;
        }
        Some(p as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lower_median_needs_more_than_half_the_pieces_slow() {
        assert_eq!(lower_median(&mut []), 0);
        assert_eq!(lower_median(&mut [900]), 900);
        assert_eq!(lower_median(&mut [2_000, 150]), 150, "half slow: not most");
        assert_eq!(lower_median(&mut [150, 2_000, 1_800]), 1_800, "two of three slow: most");
        let mut stalled = [160u64; 32];
        stalled[3..10].fill(2_200);
        assert_eq!(lower_median(&mut stalled), 160, "a stall over a few pieces changes nothing");
    }

    #[test]
    fn a_weighed_write_zeroes_exactly_its_range_in_pieces() {
        let len = 9 << 20;
        let addr = OsPages.map(len, PAGE).unwrap();
        // SAFETY: the mapping was just made for this test.
        let bytes = unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, len) };
        for (start, n) in [(0, 1), (PAGE, 3 * PAGE + 17), (PAGE, 16 * PAGE), (3 * PAGE, (1 << 20) + 5 * PAGE + 100), (0, 8 << 20), (7, (8 << 20) + 12_345)] {
            bytes.fill(0xab);
            OsPages.zero_weighed(addr + start, n);
            assert!(bytes[..start].iter().all(|&b| b == 0xab), "before {start}+{n}");
            assert!(bytes[start..start + n].iter().all(|&b| b == 0), "inside {start}+{n}");
            assert!(bytes[start + n..].iter().all(|&b| b == 0xab), "after {start}+{n}");
        }
        OsPages.unmap(addr, len);
    }

    #[test]
    fn a_mapping_grown_anywhere_lands_on_its_alignment_with_its_contents() {
        // A 64 MiB alignment: the kernel's place for the span is almost never on it, so the
        // contents are moved up to it.
        let (old, new, align) = (1 << 20, 3 << 20, 64 << 20);
        let addr = OsPages.map(old, PAGE).unwrap();
        // SAFETY: the mapping was just made for this test.
        let bytes = |a: usize, n: usize| unsafe { core::slice::from_raw_parts_mut(a as *mut u8, n) };
        for (i, b) in bytes(addr, old).iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let grown = OsPages.grow_anywhere(addr, old, new, align).unwrap();
        assert_eq!(grown % align, 0);
        assert!(bytes(grown, old).iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        assert!(bytes(grown + old, new - old).iter().all(|&b| b == 0), "the new part reads zero");
        bytes(grown, new).fill(7);
        OsPages.unmap(grown, new);
    }
}
