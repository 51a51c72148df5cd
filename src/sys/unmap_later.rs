//! Ranges of ours whose munmap the kernel refused (Note [Unmaps the kernel refused]): their pages
//! dropped at once, the range kept here and unmapped again after a later unmap of ours succeeds.
//
// Note [Unmaps the kernel refused]
// Unmapping the middle of a mapping splits it, a mapping more, and at vm.max_map_count the
// kernel refuses the split (ENOMEM). A cached piece cut from a bigger mapping, unmapped by a trim
// or by the idle expiry while the program had used up the count, stayed mapped and resident for
// good: its records were gone (4 MiB and a mapping slot per piece, where glibc had unmapped at
// free, while there was room). Now a refused unmap drops the pages (MADV_DONTNEED splits
// nothing: the RSS goes at once) and the range waits here, still ours, until an unmap of ours
// succeeds (a mapping came free) and it is tried again. With the table full only the dropping is
// done: the range stays mapped, empty.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed}};

const SLOTS: usize = 64;
const PAGE_SHIFT: u32 = 12;
/// Pages of a range's length: 29 bits (2 TiB); the start's page number takes the other 35.
const LEN_BITS: u32 = 29;

/// The waiting ranges, each packed into one word (0: a free slot).
pub struct Waiting {
    slots: [AtomicU64; SLOTS],
    count: AtomicUsize,
}

/// The process's own (os_pages.rs).
pub static WAITING: Waiting = Waiting::new();

fn pack(addr: usize, len: usize) -> Option<u64> {
    let (page, pages) = ((addr >> PAGE_SHIFT) as u64, (len >> PAGE_SHIFT) as u64);
    (page < 1 << (64 - LEN_BITS) && pages < 1 << LEN_BITS && pages > 0).then_some(page << LEN_BITS | pages)
}

fn unpack(word: u64) -> (usize, usize) {
    (((word >> LEN_BITS) as usize) << PAGE_SHIFT, ((word & ((1 << LEN_BITS) - 1)) as usize) << PAGE_SHIFT)
}

impl Waiting {
    pub const fn new() -> Self {
        Waiting { slots: [const { AtomicU64::new(0) }; SLOTS], count: AtomicUsize::new(0) }
    }

    /// Keeps a range whose unmap was refused; false when the table is full.
    pub fn keep(&self, addr: usize, len: usize) -> bool {
        let Some(word) = pack(addr, len) else { return false };
        for slot in self.slots.iter() {
            if slot.compare_exchange(0, word, AcqRel, Acquire).is_ok() {
                self.count.fetch_add(1, AcqRel);
                return true;
            }
        }
        false
    }

    /// After an unmap of ours succeeded: each waiting range is tried again with `unmap` (true:
    /// done), kept when refused again. One load while none waits.
    pub fn retry(&self, unmap: impl Fn(usize, usize) -> bool) {
        if self.count.load(Relaxed) == 0 {
            return;
        }
        for slot in self.slots.iter() {
            let word = slot.swap(0, AcqRel);
            if word == 0 {
                continue;
            }
            self.count.fetch_sub(1, AcqRel);
            let (addr, len) = unpack(word);
            if !unmap(addr, len) {
                let _ = self.keep(addr, len);
            }
        }
    }

    /// In a forked child: the parent's waiting ranges may not be in this process (a cached
    /// block is kept from children while cached), and a mapping of the child's own could land
    /// there: they are forgotten, never unmapped here.
    pub fn forget_in_child(&self) {
        if self.count.load(Relaxed) == 0 {
            return;
        }
        for slot in self.slots.iter() {
            slot.store(0, Relaxed);
        }
        self.count.store(0, Relaxed);
    }

    /// How many ranges wait.
    pub fn waiting(&self) -> usize {
        self.count.load(Acquire)
    }
}

impl Default for Waiting {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn a_refused_range_waits_until_an_unmap_takes_it() {
        let w = Box::new(Waiting::new());
        let tried = RefCell::new(Vec::new());
        w.retry(|a, l| {
            tried.borrow_mut().push((a, l));
            true
        });
        assert!(tried.borrow().is_empty(), "nothing waits: nothing tried");
        assert!(w.keep(0x7f12_3440_0000, 4 << 20));
        w.retry(|a, l| {
            tried.borrow_mut().push((a, l));
            false
        });
        assert_eq!((w.waiting(), tried.borrow().clone()), (1, vec![(0x7f12_3440_0000, 4 << 20)]), "refused again: kept");
        w.retry(|_, _| true);
        assert_eq!(w.waiting(), 0, "unmapped at last");
    }

    #[test]
    fn a_forked_child_forgets_the_parents_ranges() {
        let w = Box::new(Waiting::new());
        assert!(w.keep(0x7f12_3440_0000, 4 << 20));
        w.forget_in_child();
        w.retry(|_, _| panic!("the parent's range, never unmapped in the child"));
        assert_eq!(w.waiting(), 0);
    }

    #[test]
    fn a_full_table_refuses_and_odd_ranges_are_not_kept() {
        let w = Box::new(Waiting::new());
        for i in 0..SLOTS {
            assert!(w.keep(0x1000_0000 + i * 0x10_0000, 0x1000));
        }
        assert!(!w.keep(0x9000_0000, 0x1000), "full");
        assert!(!Waiting::new().keep(0x1000, 0), "an empty range");
        assert!(!Waiting::new().keep(1 << 48, 0x1000), "past 47 bits");
        assert_eq!(unpack(pack(0x7fff_ffff_f000, (1 << 41) - 4096).unwrap()), (0x7fff_ffff_f000, (1 << 41) - 4096));
    }
}
