//! The recent history of large allocations and frees, host and device: a ring of the last
//! EVENTS events, always kept, for the snapshot's timeline (PyTorch's `device_traces`). The
//! ring is .bss (resident only as it fills, 896 KiB when full); recording is one atomic add, a
//! coarse clock read (CLOCK_MONOTONIC_COARSE: 4 ns where the precise clock costs 28 ns here, at a
//! resolution of a few ms; the ring's order is the events' order) and seven stores. Readers
//! skip slots being rewritten (a per-slot sequence number).
//! Why a second ring beside the trace's: this one is always on and overwrites its oldest events
//! (a snapshot wants the latest), the trace's exists only under TENSORMALLOC_TRACE and drops new
//! events when its writer falls a ring behind (a file must not have holes in its middle); they
//! keep different fields (streams and segments here; requested sizes, outcomes, samples there).

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

impl Slot {
    const fn new() -> Self {
        Slot {
            seq: AtomicU64::new(0),
            time_ns: AtomicU64::new(0),
            addr: AtomicU64::new(0),
            size: AtomicU64::new(0),
            holder: AtomicU64::new(0),
            stream: AtomicU64::new(0),
            kind: AtomicU64::new(0),
        }
    }
}

static SLOTS: [Slot; EVENTS] = [const { Slot::new() }; EVENTS];
static HEAD: AtomicU64 = AtomicU64::new(0);

/// Records an event now: `action` on a block (or segment) of `size` bytes at `addr` in `place`,
/// held by `holder` (a holder word, 0 for segments), on `stream` (the pool's tag; 0 for none).
pub fn record(action: u8, place: u8, addr: u64, size: u64, holder: u64, stream: u64) {
    let time_ns = crate::sys::clock::coarse_ns();
    let index = HEAD.fetch_add(1, Relaxed);
    let Some(s) = SLOTS.get(index as usize % EVENTS) else { return };
    s.seq.store(0, Relaxed);
    fence(Release);
    s.time_ns.store(time_ns, Relaxed);
    s.addr.store(addr, Relaxed);
    s.size.store(size, Relaxed);
    s.holder.store(holder, Relaxed);
    s.stream.store(stream, Relaxed);
    s.kind.store(u64::from(action) | u64::from(place) << 8, Relaxed);
    s.seq.store(index + 1, Release);
}

/// Calls `f` for each event still in the ring, oldest first; events being written meanwhile are
/// skipped.
pub fn for_each(mut f: impl FnMut(&HistoryEvent)) {
    let head = HEAD.load(Acquire);
    for index in head.saturating_sub(EVENTS as u64)..head {
        let Some(s) = SLOTS.get(index as usize % EVENTS) else { continue };
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

/// Events recorded since the process started (those past EVENTS are gone from the ring).
pub fn recorded() -> u64 {
    HEAD.load(Relaxed)
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
        for_each(|e| {
            if e.addr & !0xffff_ffff == mark {
                seen.push(e.addr - mark);
                assert_eq!((e.action, e.place, e.size), (FREE, 3, e.addr - mark));
            }
        });
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(seen.last(), Some(&(EVENTS as u64 + 9)));
        assert!(seen.len() > EVENTS / 2 && seen.first() >= Some(&10));
    }
}
