//! The recent history of large allocations and frees, host and device: two rings of the last
//! EVENTS events each, always kept, for the snapshot's timeline (PyTorch's `device_traces`): the
//! host blocks' and everyone else's (device blocks, pinned blocks, segments, failures); in both,
//! one atomic add claims a slot. Each ring is
//! mapped at its first event (1 MiB, resident only as it fills), not kept in .bss: a
//! conservative collector (Boehm GC) scans every library's .bss at each collection. An event is a coarse clock
//! read (CLOCK_MONOTONIC_COARSE: 4 ns where the precise clock costs 28 ns here, at a resolution
//! of a few ms; a ring's order is its events' order; the host layer passes the time it read) and
//! seven stores. Readers skip slots being rewritten (a per-slot sequence number).
//! Why a second ring beside the trace's: this one is always on and overwrites its oldest events
//! (a snapshot wants the latest), the trace's exists only under TENSORMALLOC_TRACE and drops new
//! events when its writer falls a ring behind (a file must not have holes in its middle); they
//! keep different fields (streams and segments here; requested sizes, outcomes, samples there).

use crate::sys::mapped_on_use::MappedOnUse;
use core::sync::atomic::{fence, AtomicU64, Ordering::{Acquire, Relaxed, Release}};

pub const ALLOC: u8 = 0;
pub const FREE: u8 = 1;
/// A device segment mapped by the pool (cudaMalloc of the runtime).
pub const SEGMENT_MAP: u8 = 2;
/// A device segment given back to the runtime.
pub const SEGMENT_UNMAP: u8 = 3;
/// A request that failed for want of memory; the event's `addr` is the device's free bytes then.
pub const OOM: u8 = 4;

pub const EVENTS: usize = 1 << 14;
/// Events the two rings hold at most.
pub const HELD: usize = 2 * EVENTS;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistoryEvent {
    pub time_ns: u64,
    pub addr: u64,
    pub size: u64,
    /// The block's holder word (Note [Holders]); 0 for segments.
    pub holder: u64,
    pub stream: u64,
    pub action: u8,
    /// holders::PLACE_HOST, PLACE_PINNED or device_place(device).
    pub place: u8,
}

#[repr(align(64))]
struct Slot {
    /// 1 + the index of the event the slot holds once complete; 0 while being written.
    seq: AtomicU64,
    time_ns: AtomicU64,
    addr: AtomicU64,
    size: AtomicU64,
    holder: AtomicU64,
    stream: AtomicU64,
    kind: AtomicU64,
}

/// A ring of EVENTS events, mapped at its first event (Note [Tables mapped at first use] in
/// sys/mapped_on_use.rs), and the index of the next.
struct Ring {
    slots: MappedOnUse<[Slot; EVENTS]>,
    head: AtomicU64,
}

impl Ring {
    const fn new() -> Self {
        // SAFETY: zeroed slots are empty ones (every field an atomic integer).
        Ring { slots: unsafe { MappedOnUse::new() }, head: AtomicU64::new(0) }
    }

    /// Writes the event of index `index` into its slot.
    fn write(&self, index: u64, e: &HistoryEvent) {
        let Some(slots) = self.slots.get_or_map() else { return };
        let Some(s) = slots.get(index as usize % EVENTS) else { return };
        s.seq.store(0, Relaxed);
        fence(Release);
        s.time_ns.store(e.time_ns, Relaxed);
        s.addr.store(e.addr, Relaxed);
        s.size.store(e.size, Relaxed);
        s.holder.store(e.holder, Relaxed);
        s.stream.store(e.stream, Relaxed);
        s.kind.store(u64::from(e.action) | u64::from(e.place) << 8, Relaxed);
        s.seq.store(index + 1, Release);
        if let Some(next) = slots.get((index as usize + 1) % EVENTS) {
            prefetch_for_write(next);
        }
    }

    /// Calls `f` for the events of indices below `cut` still in the ring, oldest first.
    fn for_each_before(&self, cut: u64, f: &mut impl FnMut(&HistoryEvent)) {
        let head = self.head.load(Acquire);
        let Some(slots) = self.slots.get() else { return };
        for index in head.saturating_sub(EVENTS as u64)..cut.min(head) {
            let Some(s) = slots.get(index as usize % EVENTS) else { continue };
            if s.seq.load(Acquire) != index + 1 {
                continue;
            }
            let kind = s.kind.load(Relaxed);
            let e = HistoryEvent {
                time_ns: s.time_ns.load(Relaxed),
                addr: s.addr.load(Relaxed),
                size: s.size.load(Relaxed),
                holder: s.holder.load(Relaxed),
                stream: s.stream.load(Relaxed),
                action: kind as u8,
                place: (kind >> 8) as u8,
            };
            fence(Acquire);
            if s.seq.load(Relaxed) == index + 1 {
                f(&e);
            }
        }
    }
}

/// Asks for `slot`'s line ahead of the next event: the ring is larger than the first-level
/// cache, and a store that misses there makes the next locked instruction wait for it.
fn prefetch_for_write(slot: &Slot) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch of an address we hold a reference to; it changes nothing.
    // (PREFETCHW: a no-op on processors without it, which decode it as a hint.)
    unsafe {
        core::arch::asm!("prefetchw [{0}]", in(reg) slot as *const Slot, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

/// The host layer's events, written under its cache lock; everyone else's.
static HOST: Ring = Ring::new();
static OTHERS: Ring = Ring::new();

/// Records an event now: `action` on a block (or segment) of `size` bytes at `addr` in `place`,
/// held by `holder` (a holder word, 0 for segments), on `stream` (the pool's tag; 0 for none).
/// Not for host blocks (`record_host`).
pub fn record(action: u8, place: u8, addr: u64, size: u64, holder: u64, stream: u64) {
    let time_ns = crate::sys::clock::coarse_ns();
    let index = OTHERS.head.fetch_add(1, Relaxed);
    OTHERS.write(index, &HistoryEvent { time_ns, addr, size, holder, stream, action, place });
}

/// Records a host block's event, stamped `e.time_ns` (the coarse clock the host layer read):
/// under the host cache's lock, or by a thread moving a block to or from its slot (Note [A
/// thread's own slot] in host/thread_slots.rs), so one atomic add claims a slot here too.
pub fn record_host(e: &HistoryEvent) {
    let index = HOST.head.fetch_add(1, Relaxed);
    HOST.write(index, e);
}

/// Where the rings stood at one moment: a reader can leave out what came after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut([u64; 2]);

/// The rings' heads now.
pub fn cut() -> Cut {
    Cut([HOST.head.load(Acquire), OTHERS.head.load(Acquire)])
}

/// Calls `f` for each event recorded before `cut` and still in a ring, oldest first within each
/// ring (host blocks' events first: no reader orders events of different places); events being
/// written meanwhile are skipped.
pub fn for_each_before(cut: Cut, mut f: impl FnMut(&HistoryEvent)) {
    HOST.for_each_before(cut.0[0], &mut f);
    OTHERS.for_each_before(cut.0[1], &mut f);
}

/// Events recorded since the process started that the rings no longer hold.
pub fn lost() -> u64 {
    [&HOST, &OTHERS].iter().map(|r| r.head.load(Relaxed).saturating_sub(EVENTS as u64)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_latest_events_in_order() {
        // The ring is the process's: other tests may record meanwhile, so look for ours only.
        let mark = 0x7e57_0000_0000;
        for i in 0..(EVENTS as u64 + 10) {
            record(FREE, 3, mark + i, i, 0, 0);
        }
        let mut seen = vec![];
        for_each_before(cut(), |e| {
            if e.addr & !0xffff_ffff == mark {
                seen.push(e.addr - mark);
                assert_eq!((e.action, e.place, e.size), (FREE, 3, e.addr - mark));
            }
        });
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(seen.last(), Some(&(EVENTS as u64 + 9)));
        assert!(seen.len() > EVENTS / 2 && seen.first() >= Some(&10));
    }

    #[test]
    fn a_cut_leaves_out_what_came_after() {
        let mark = 0x7e58_0000_0000;
        record(ALLOC, 4, mark, 1, 0, 0);
        let at = cut();
        record(FREE, 4, mark + 1, 1, 0, 0);
        let mut seen = vec![];
        for_each_before(at, |e| {
            if e.addr & !0xffff_ffff == mark {
                seen.push(e.addr - mark);
            }
        });
        assert_eq!(seen, [0]);
        let mut now = vec![];
        for_each_before(cut(), |e| {
            if e.addr & !0xffff_ffff == mark {
                now.push(e.addr - mark);
            }
        });
        assert_eq!(now, [0, 1]);
    }
}
