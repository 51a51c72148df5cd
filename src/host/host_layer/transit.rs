//! Ranges on their way to the kernel: out of the cache's records, not yet unmapped or moved.
//
// Note [Ranges in transit]
// A thread that takes blocks out of the cache to unmap (or move) them does so under the lock and
// makes the system calls after it. Meanwhile the blocks are in no record, yet still mapped, so
// two kinds of caller wait for them: a fork (the child must not inherit them half gone: Note
// [Fork at the fork]) and a retry for room wait for all of them, and a claim (Note [Ranges the
// program claims]) waits for those in the range the program is about to map over. The claim
// used to wait for all of them too, for at most 5 s: a stop-the-world collector that stopped a
// thread inside our free and then mapped pages anywhere near our blocks waited out the 5 s
// (limits.md), and then let our stalled munmap take the program's new pages. Now each thread in
// transit writes the span of 2 MiB granules its ranges cover into one of SPANS slots, under the
// lock that took them out, and clears it before it leaves; a claim waits only while a slot's
// span meets its range: without a bound where the span is one range's own, at most 5 s where it
// bounds several (a range between two blocks one thread has in transit waited for good while a
// tracer held that thread: the review). The first SPANS slots sit here; past them (more threads
// in transit at once) a table of MORE_SPANS is mapped at its first use (Note [Tables mapped at
// first use]). With only SPANS slots, the seventeenth thread counted as spanning everything:
// under 24 threads churning blocks, the program's munmap near our blocks waited up to 5 s where
// glibc's took microseconds, and that thread's one range was protected only for those 5 s (the
// soak hunter). A thread counts so (`unspanned`) now only when the table cannot be mapped or is
// full. A span is a bounding one: two blocks far apart make one wide span, which can only make a
// claim wait, never miss.

use crate::ranges::Range;
use crate::sys::lock::{Gate, Pass};
use crate::sys::mapped_on_use::MappedOnUse;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

/// Slots for spans kept here, and in the table mapped when more threads are in transit at once
/// (256 KiB of address space, its pages touched as far as they are used); past both, a thread
/// counts as spanning everything.
const SPANS: usize = 16;
const MORE_SPANS: usize = 1 << 15;
const GRANULE_SHIFT: u32 = 21;
/// Granule numbers of 48-bit addresses: 27 bits each, first and last, under a "taken" bit.
const GRANULE_BITS: u32 = 27;
const TAKEN: u64 = 1 << 63;
/// The span is one range's own (not the bounding span of several).
const ONE: u64 = 1 << 62;

pub struct Transit {
    gate: Gate,
    spans: [AtomicU64; SPANS],
    more: MappedOnUse<[AtomicU64; MORE_SPANS]>,
    /// How many of `more`'s slots were ever taken (a claim looks no further).
    more_used: AtomicUsize,
    /// Threads in transit whose span no slot holds: a claim waits for them whatever its range.
    unspanned: AtomicU32,
}

/// One thread's ranges in transit, until dropped (by that thread).
pub struct InTransit<'a> {
    transit: &'a Transit,
    held: Held,
    _pass: Pass<'a>,
}

enum Held {
    Nothing,
    Slot(usize),
    Everything,
}

impl Transit {
    pub const fn new() -> Self {
        Transit {
            gate: Gate::new(),
            spans: [const { AtomicU64::new(0) }; SPANS],
            // SAFETY: zeroed atomics are an empty table of free slots.
            more: unsafe { MappedOnUse::new() },
            more_used: AtomicUsize::new(0),
            unspanned: AtomicU32::new(0),
        }
    }

    /// Under the cache lock, before the lock that took `ranges` out of the records drops: they
    /// are in transit until the result is dropped.
    pub fn enter(&self, ranges: impl IntoIterator<Item = Range>) -> InTransit<'_> {
        let held = match span(ranges) {
            None => Held::Nothing,
            Some(packed) => match self.take_slot(packed) {
                Some(slot) => Held::Slot(slot),
                None => {
                    self.unspanned.fetch_add(1, SeqCst);
                    Held::Everything
                }
            },
        };
        // After the span: a claim that sees the count sees the span with it.
        InTransit { transit: self, held, _pass: self.gate.enter() }
    }

    /// A free slot, given `packed`: one of ours, else one of the table's (mapped now if this is
    /// its first use); None when none is free or the table cannot be mapped.
    fn take_slot(&self, packed: u64) -> Option<usize> {
        let take = |s: &AtomicU64| s.compare_exchange(0, packed, SeqCst, SeqCst).is_ok();
        if let Some(slot) = self.spans.iter().position(take) {
            return Some(slot);
        }
        let more = self.more.get_or_map()?;
        let k = more.iter().position(take)?;
        self.more_used.fetch_max(k + 1, SeqCst);
        Some(SPANS + k)
    }

    /// Every slot that may hold a span: ours, then the table's as far as it was ever used.
    fn slots(&self) -> impl Iterator<Item = &AtomicU64> {
        let more = self.more.get().map_or(&[][..], |m| m.get(..self.more_used.load(SeqCst)).unwrap_or(&[]));
        self.spans.iter().chain(more)
    }

    fn slot(&self, slot: usize) -> Option<&AtomicU64> {
        match slot.checked_sub(SPANS) {
            None => self.spans.get(slot),
            Some(k) => self.more.get()?.get(k),
        }
    }

    /// Whether any thread has ranges in transit.
    pub fn occupied(&self) -> bool {
        self.gate.occupied()
    }

    /// Waits until no range is in transit, or `deadline_ns` passes.
    pub fn wait_empty(&self, clock: fn() -> u64, deadline_ns: u64) {
        self.gate.wait_empty(clock, deadline_ns);
    }

    /// Waits until no range in transit meets [addr, end) (with `only_exact`, no span that is
    /// one range's own), or `deadline_ns` passes.
    pub fn wait_clear_of(&self, addr: usize, end: usize, only_exact: bool, clock: fn() -> u64, deadline_ns: u64) {
        self.gate.wait_until(clock, deadline_ns, || !self.meets(addr, end, only_exact));
    }

    /// Whether a range in transit may meet [addr, end); with `only_exact`, whether a span that
    /// is one range's own does (the 2 MiB granules around it).
    pub fn meets(&self, addr: usize, end: usize, only_exact: bool) -> bool {
        if !only_exact && self.unspanned.load(SeqCst) != 0 {
            return true;
        }
        let (first, last) = (addr as u64 >> GRANULE_SHIFT, (end.max(addr.saturating_add(1)) - 1) as u64 >> GRANULE_SHIFT);
        self.slots().any(|s| {
            let packed = s.load(SeqCst);
            packed & TAKEN != 0 && (!only_exact || packed & ONE != 0) && {
                let (lo, hi) = unpack(packed);
                lo <= last && first <= hi
            }
        })
    }

    /// Forgets every thread in transit (a forked child, where they do not exist).
    pub fn clear(&self) {
        for s in self.slots() {
            s.store(0, SeqCst);
        }
        self.unspanned.store(0, SeqCst);
        self.gate.clear();
    }

    #[cfg(test)]
    pub fn awaited(&self) -> bool {
        self.gate.awaited()
    }
}

impl Default for Transit {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InTransit<'_> {
    fn drop(&mut self) {
        // Before the pass leaves (the fields drop after this), which wakes the waiters.
        match self.held {
            Held::Nothing => {}
            Held::Slot(slot) => {
                if let Some(span) = self.transit.slot(slot) {
                    span.store(0, SeqCst);
                }
            }
            Held::Everything => {
                self.transit.unspanned.fetch_sub(1, SeqCst);
            }
        }
    }
}

/// The granules `ranges` cover, first to last, packed for a slot; `None` for no range. A range
/// past 48 bits (none of ours) spans everything.
fn span(ranges: impl IntoIterator<Item = Range>) -> Option<u64> {
    let (mut lo, mut hi, mut count) = (u64::MAX, 0u64, 0);
    for r in ranges {
        lo = lo.min(r.addr as u64 >> GRANULE_SHIFT);
        hi = hi.max((r.addr.saturating_add(r.len.max(1)) - 1) as u64 >> GRANULE_SHIFT);
        count += 1;
    }
    if lo == u64::MAX {
        return None;
    }
    let top = (1 << GRANULE_BITS) - 1;
    let (lo, hi, one) = if hi > top { (0, top, 0) } else { (lo, hi, if count == 1 { ONE } else { 0 }) };
    Some(TAKEN | one | lo << GRANULE_BITS | hi)
}

fn unpack(packed: u64) -> (u64, u64) {
    let mask = (1 << GRANULE_BITS) - 1;
    ((packed >> GRANULE_BITS) & mask, packed & mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    fn r(addr: usize, len: usize) -> Range {
        Range { addr, len }
    }

    #[test]
    fn a_claim_meets_only_the_spans_it_overlaps() {
        let t = Transit::new();
        let base = 0x7f00_0000_0000usize;
        assert!(!t.meets(base, base + MB, false));
        let a = t.enter([r(base + 8 * MB, 4 * MB), r(base + 32 * MB, 2 * MB)]);
        assert!(t.occupied());
        for (addr, len, meets) in [
            (base, 4 * MB, false),
            (base + 6 * MB, 2 * MB, false),
            (base + 6 * MB, 2 * MB + 1, true),
            (base + 11 * MB, 4096, true),
            (base + 20 * MB, 4096, true), // between the two blocks: inside the bounding span
            (base + 34 * MB, 4096, false),
            (base + 33 * MB, 4096, true),
            (0, usize::MAX, true),
        ] {
            assert_eq!(t.meets(addr, addr.saturating_add(len), false), meets, "{:#x}+{len:#x}", addr);
        }
        assert!(!t.meets(base + 20 * MB, base + 20 * MB + 4096, true), "a bounding span of two ranges is no range's own");
        drop(a);
        let one = t.enter([r(base + 8 * MB, 4 * MB)]);
        assert!(t.meets(base + 9 * MB, base + 9 * MB + 4096, true) && !t.meets(base + 20 * MB, base + 21 * MB, true));
        drop(one);
        assert!(!t.meets(0, usize::MAX, false) && !t.occupied());
        let nothing = t.enter([]);
        assert!(t.occupied() && !t.meets(0, usize::MAX, false), "no range: waited for by a fork, not a claim");
        drop(nothing);
    }

    #[test]
    fn past_our_slots_a_thread_keeps_a_span_of_its_own() {
        let t = Transit::new();
        let base = 0x7e00_0000_0000usize;
        let (elsewhere, far) = (base - 64 * MB, base + 4096 * MB);
        let held: Vec<_> = (0..SPANS).map(|i| t.enter([r(base + i * 64 * MB, MB)])).collect();
        let extra = t.enter([r(far, MB)]);
        assert!(t.meets(far, far + 4096, true), "the seventeenth thread's one range is its own: waited for however long");
        assert!(!t.meets(elsewhere, elsewhere + MB, false), "a claim elsewhere does not wait for it");
        drop(extra);
        assert!(!t.meets(far, far + MB, false));
        // Past the table too, a thread may be anywhere.
        let more: Vec<_> = (0..MORE_SPANS).map(|i| t.enter([r(far + i * 4 * MB, MB)])).collect();
        let past = t.enter([r(far, MB)]);
        assert!(t.meets(elsewhere, elsewhere + MB, false), "a thread with no slot may be anywhere");
        drop(past);
        assert!(!t.meets(elsewhere, elsewhere + MB, false));
        drop((held, more));
        assert!(!t.meets(0, usize::MAX, false) && !t.occupied());
        t.enter([r(usize::MAX - MB, MB)]);
        let past = t.enter([r((1 << 48) + MB, MB)]);
        assert!(t.meets(0, 4096, false), "past 48 bits: everything");
        drop(past);
    }

    #[test]
    fn a_claim_waits_for_its_range_only() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        fn clock() -> u64 {
            std::time::Instant::now().duration_since(*START.get_or_init(std::time::Instant::now)).as_nanos() as u64 + 1
        }
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let t = Transit::new();
        let base = 0x7d00_0000_0000usize;
        let elsewhere = t.enter([r(base + 512 * MB, MB)]);
        let left = AtomicBool::new(false);
        std::thread::scope(|s| {
            let (t, left) = (&t, &left);
            s.spawn(move || {
                let mine = t.enter([r(base, 4 * MB)]);
                while !t.awaited() {
                    std::hint::spin_loop();
                }
                left.store(true, SeqCst);
                drop(mine);
            });
            while t.spans.iter().filter(|s| s.load(SeqCst) != 0).count() < 2 {
                std::hint::spin_loop();
            }
            let started = clock();
            t.wait_clear_of(base + MB, base + 2 * MB, false, clock, u64::MAX);
            assert!(left.load(SeqCst), "it waited for the range it meets");
            assert!(clock() - started < 500_000_000, "and was woken as it left, the other still in transit");
        });
        assert!(t.occupied(), "the range elsewhere is still in transit");
        t.wait_clear_of(base, base + 4 * MB, false, clock, u64::MAX);
        drop(elsewhere);
    }
}
