//! The segments this process opened for handles of ours (Note [IPC] in device/pool/pointers.rs):
//! the driver maps a handle once per process, so every handle of ours that names the same
//! segment shares one mapping, counted; each pointer handed out is remembered until its close,
//! and the segment is closed with its last one. A chunk run of an expandable block (Note [IPC of
//! expandable segments] in device/pool/exports.rs), named by its registry bytes, is opened and
//! closed the same way. A segment is known by what names it and by its exporter: two processes'
//! chunk runs may be byte for byte the same (forked siblings share one history: addresses,
//! buffer ids), and one must never open the other's mapping. Fixed tables under one lock
//! (mapped at the first open, Note [Tables mapped at first use] in sys/mapped_on_use.rs), never
//! held across a driver call: a segment being opened or closed is marked so, and another thread
//! that needs it waits for that to end. Unit-tested; never calls the system.

use crate::backing::CUDA_ERROR_MEMORY_ALLOCATION;
use crate::sys::lock::Lock;
use crate::sys::mapped_on_use::MappedOnUse;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};
use core::ffi::c_int;

const SEGMENTS: usize = 1024;
const POINTERS: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    Opening,
    Open,
    Closing,
}

/// Who exported what a handle names: its process, and for a chunk run the nonce of that process's
/// channel (another process given the pid later has another).
pub type Exporter = [u64; 2];

#[derive(Clone, Copy)]
struct Segment {
    state: State,
    real: [u8; 64],
    exporter: Exporter,
    base: u64,
    refs: u32,
}

#[derive(Clone, Copy)]
struct Pointer {
    ptr: u64,
    /// The block's size: what the receiver's range queries answer (`block_of`).
    size: u64,
    /// Its segment's index plus one; 0: an empty slot.
    segment: u32,
}

struct Tables {
    segments: [Segment; SEGMENTS],
    pointers: [Pointer; POINTERS],
}

pub struct Opened {
    tables: MappedOnUse<Lock<Tables>>,
    /// A segment was ever opened (a forked child has tables to forget).
    ever_opened: AtomicBool,
}

/// What `begin_open` found for a segment's driver handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Open already, counted once more: the pointer is `base` plus the block's offset, recorded.
    Mapped { base: u64 },
    /// The caller opens it with the driver now, then calls `end_open` with slot `slot`.
    Open { slot: usize },
    /// Another thread opens or closes it: try again in a moment.
    Busy,
    /// The tables are full.
    Full,
}

/// What `close` found for a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// Not a pointer of ours: the driver's to close.
    NotOurs,
    /// Counted off; the segment stays open for other pointers.
    Kept,
    /// Its last pointer: the caller closes mapping `base` of what `real` names (a driver's handle
    /// or a chunk run), then `end_close(slot)`.
    Last { slot: usize, base: u64, real: [u8; 64] },
}

const EMPTY_SEGMENT: Segment = Segment { state: State::Empty, real: [0; 64], exporter: [0; 2], base: 0, refs: 0 };

impl Opened {
    pub const fn new() -> Self {
        // SAFETY: zeroed tables are empty ones (State::Empty is 0, every pointer slot's segment
        // 0) under a free lock.
        Opened { tables: unsafe { MappedOnUse::new() }, ever_opened: AtomicBool::new(false) }
    }

    /// The segment `real` of `exporter` names, mapped once per process: `map` makes the mapping (its base,
    /// or the code it failed with) while no other thread maps it; `unmap` gives back one made
    /// but not kept (the tables filled meanwhile); `wait` passes a moment while another thread
    /// opens or closes it. The pointer at `offset` in it, recorded with the block's `size`.
    pub fn open_once(&self, real: &[u8; 64], exporter: Exporter, (offset, size): (u64, u64), map: impl FnOnce() -> Result<u64, c_int>, unmap: impl FnOnce(u64), wait: impl Fn()) -> Result<u64, c_int> {
        let mut map = Some(map);
        loop {
            match self.begin_open(real, exporter, offset, size) {
                Begin::Mapped { base } => return Ok(base + offset),
                Begin::Full => return Err(CUDA_ERROR_MEMORY_ALLOCATION),
                Begin::Busy => wait(),
                Begin::Open { slot } => {
                    let Some(map) = map.take() else { return Err(CUDA_ERROR_MEMORY_ALLOCATION) };
                    let mapped = map();
                    if let Ok(base) = mapped {
                        if self.end_open(slot, Some(base), offset, size) {
                            return Ok(base + offset);
                        }
                        unmap(base);
                    }
                    self.end_open(slot, None, 0, 0);
                    return Err(mapped.err().unwrap_or(CUDA_ERROR_MEMORY_ALLOCATION));
                }
            }
        }
    }

    /// In a forked child: the segments the parent opened are mapped in the parent's CUDA
    /// context, which the child cannot use (the driver answers NOT_INITIALIZED there); a handle
    /// opened again, or a pointer closed, goes to the driver for its own answer.
    pub fn forget_in_child(&self) {
        let Some(tables) = self.tables.get() else { return };
        // SAFETY: the child's fork handler; what the lock guards is forgotten whole (Note [Locks
        // a child inherits] in sys/lock.rs).
        unsafe { tables.free_in_child() };
        if !self.ever_opened.load(Relaxed) {
            return; // nothing to forget: 176 KiB of tables left untouched
        }
        let mut t = tables.lock();
        // In place: a thread may have 16 KiB of stack in all.
        for s in t.segments.iter_mut().filter(|s| s.state != State::Empty) {
            *s = EMPTY_SEGMENT;
        }
        for p in t.pointers.iter_mut().filter(|p| p.segment != 0) {
            p.segment = 0;
        }
    }

    /// A handle of ours names the segment `real` of `exporter`, the block of `size` bytes at
    /// `offset` in it.
    pub fn begin_open(&self, real: &[u8; 64], exporter: Exporter, offset: u64, size: u64) -> Begin {
        let Some(tables) = self.tables.get_or_map() else { return Begin::Full };
        let mut t = tables.lock();
        if let Some(i) = t.segments.iter().position(|s| s.state != State::Empty && s.real == *real && s.exporter == exporter) {
            let s = t.segments.get(i).copied().unwrap_or(EMPTY_SEGMENT);
            if s.state != State::Open {
                return Begin::Busy;
            }
            if !Self::remember(&mut t, s.base.wrapping_add(offset), size, i) {
                return Begin::Full;
            }
            if let Some(s) = t.segments.get_mut(i) {
                s.refs += 1;
            }
            return Begin::Mapped { base: s.base };
        }
        let Some(slot) = t.segments.iter().position(|s| s.state == State::Empty) else { return Begin::Full };
        if !t.pointers.iter().any(|p| p.segment == 0) {
            return Begin::Full;
        }
        if let Some(s) = t.segments.get_mut(slot) {
            *s = Segment { state: State::Opening, real: *real, exporter, base: 0, refs: 0 };
        }
        self.ever_opened.store(true, Relaxed);
        Begin::Open { slot }
    }

    /// The driver opened segment `slot` at `base` (or refused: None); the block's pointer is
    /// `base` plus `offset`, recorded. False when it could not be recorded (the caller closes).
    pub fn end_open(&self, slot: usize, base: Option<u64>, offset: u64, size: u64) -> bool {
        // begin_open mapped the tables.
        let Some(tables) = self.tables.get() else { return false };
        let mut t = tables.lock();
        let Some(base) = base else {
            if let Some(s) = t.segments.get_mut(slot) {
                *s = EMPTY_SEGMENT;
            }
            return false;
        };
        if !Self::remember(&mut t, base.wrapping_add(offset), size, slot) {
            if let Some(s) = t.segments.get_mut(slot) {
                *s = EMPTY_SEGMENT;
            }
            return false;
        }
        if let Some(s) = t.segments.get_mut(slot) {
            s.state = State::Open;
            s.base = base;
            s.refs = 1;
        }
        true
    }

    fn remember(t: &mut Tables, ptr: u64, size: u64, segment: usize) -> bool {
        let Some(p) = t.pointers.iter_mut().find(|p| p.segment == 0) else { return false };
        *p = Pointer { ptr, size, segment: segment as u32 + 1 };
        true
    }

    /// The opened block `addr` lies in, (its pointer, its size): the driver maps the whole
    /// segment, and a range query there answers the block, as the driver alone answers its own
    /// allocation (Note [IPC] in device/pool/pointers.rs). None for any other address.
    pub fn block_of(&self, addr: u64) -> Option<(u64, u64)> {
        if !self.ever_opened.load(Relaxed) {
            return None;
        }
        let t = self.tables.get()?.lock();
        t.pointers.iter().find(|p| p.segment != 0 && addr.wrapping_sub(p.ptr) < p.size).map(|p| (p.ptr, p.size))
    }

    /// A close of `ptr`.
    pub fn close(&self, ptr: u64) -> Close {
        let Some(tables) = self.tables.get() else { return Close::NotOurs };
        let mut t = tables.lock();
        let Some(p) = t.pointers.iter_mut().find(|p| p.segment != 0 && p.ptr == ptr) else { return Close::NotOurs };
        let slot = p.segment as usize - 1;
        p.segment = 0;
        let Some(s) = t.segments.get_mut(slot) else { return Close::Kept };
        s.refs = s.refs.saturating_sub(1);
        if s.refs > 0 {
            return Close::Kept;
        }
        s.state = State::Closing;
        Close::Last { slot, base: s.base, real: s.real }
    }

    /// The driver closed segment `slot`'s mapping: the slot is free.
    pub fn end_close(&self, slot: usize) {
        let Some(tables) = self.tables.get() else { return };
        if let Some(s) = tables.lock().segments.get_mut(slot) {
            *s = EMPTY_SEGMENT;
        }
    }
}

impl Default for Opened {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Exporter = [1234, 0];

    /// Forked siblings export runs that are byte for byte the same: each handle opens its own
    /// exporter's mapping (the outlive hunter's finding), and another process given an exporter's
    /// pid later, with another channel, is another exporter.
    #[test]
    fn the_same_run_of_two_exporters_is_two_segments() {
        let o = Opened::new();
        let run = [7u8; 64];
        let a = o.open_once(&run, [100, 11], (0, 4096), || Ok(0x1000_0000), |_| panic!("kept"), || {}).unwrap();
        let b = o.open_once(&run, [101, 11], (0, 4096), || Ok(0x2000_0000), |_| panic!("kept"), || {}).unwrap();
        let later = o.open_once(&run, [100, 12], (0, 4096), || Ok(0x3000_0000), |_| panic!("kept"), || {}).unwrap();
        assert_eq!((a, b, later), (0x1000_0000, 0x2000_0000, 0x3000_0000));
        assert_eq!(o.begin_open(&run, [101, 11], 4096, 4096), Begin::Mapped { base: 0x2000_0000 }, "the same exporter's: shared");
    }

    #[test]
    fn blocks_of_one_segment_share_its_mapping_until_their_last_close() {
        let o = Box::new(Opened::new());
        let real = [3u8; 64];
        let Begin::Open { slot } = o.begin_open(&real, ME, 4096, 1024) else { panic!() };
        assert_eq!(o.begin_open(&real, ME, 0, 1024), Begin::Busy, "another thread waits while it opens");
        assert!(o.end_open(slot, Some(0x1000_0000), 4096, 1024));
        assert_eq!(o.begin_open(&real, ME, 8192, 1024), Begin::Mapped { base: 0x1000_0000 });
        assert_eq!(o.close(0x1000_0000 + 4096), Close::Kept);
        assert_eq!(o.close(0x1000_0000 + 4096), Close::NotOurs, "closed once only");
        assert_eq!(o.close(0x5000), Close::NotOurs);
        assert_eq!(o.close(0x1000_0000 + 8192), Close::Last { slot, base: 0x1000_0000, real });
        assert_eq!(o.begin_open(&real, ME, 0, 1024), Begin::Busy, "until the driver closed it");
        o.end_close(slot);
        assert!(matches!(o.begin_open(&real, ME, 0, 1024), Begin::Open { .. }), "opened anew");
    }

    /// A forked child cannot use the segments its parent opened: a handle is opened anew (the
    /// driver answers there) and the parent's pointers are not ours to close.
    #[test]
    fn a_forked_child_forgets_the_parents_segments() {
        let o = Box::new(Opened::new());
        o.forget_in_child();
        let real = [9u8; 64];
        let Begin::Open { slot } = o.begin_open(&real, ME, 0, 1024) else { panic!() };
        assert!(o.end_open(slot, Some(0x2000_0000), 0, 1024));
        core::mem::forget(o.tables.get().unwrap().lock()); // a parent thread in the tables at the fork
        o.forget_in_child();
        assert!(matches!(o.begin_open(&real, ME, 0, 1024), Begin::Open { .. }), "the parent's mapping is not the child's");
        assert_eq!(o.close(0x2000_0000), Close::NotOurs);
    }

    #[test]
    fn a_segment_is_mapped_once_and_a_failed_map_leaves_nothing() {
        let o = Box::new(Opened::new());
        let (real, mut maps) = ([5u8; 64], 0);
        let first = o.open_once(&real, ME, (4096, 1024), || { maps += 1; Ok(0x2000_0000) }, |_| panic!("kept"), || {});
        assert_eq!(first, Ok(0x2000_0000 + 4096));
        let second = o.open_once(&real, ME, (8192, 1024), || { maps += 1; Ok(0x3000_0000) }, |_| panic!("kept"), || {});
        assert_eq!((second, maps), (Ok(0x2000_0000 + 8192), 1), "the mapping is shared");
        let refused = o.open_once(&[6; 64], ME, (0, 1024), || Err(700), |_| panic!("nothing was mapped"), || {});
        assert_eq!(refused, Err(700), "the driver's code");
        assert!(matches!(o.begin_open(&[6; 64], ME, 0, 1024), Begin::Open { .. }), "the slot is free again");
    }

    #[test]
    fn a_range_query_inside_an_opened_block_names_the_block_not_the_segment() {
        let o = Box::new(Opened::new());
        assert_eq!(o.block_of(0x2000_0000), None, "nothing opened: no lock taken");
        let p = o.open_once(&[5u8; 64], ME, (4096, 1 << 20), || Ok(0x2000_0000), |_| panic!("kept"), || {}).unwrap();
        assert_eq!(o.block_of(p), Some((p, 1 << 20)));
        assert_eq!(o.block_of(p + (1 << 20) - 1), Some((p, 1 << 20)), "its last byte");
        assert_eq!(o.block_of(p + (1 << 20)), None, "past it: the exporter's other blocks");
        assert_eq!(o.block_of(p - 1), None);
        assert_eq!(o.close(p), Close::Last { slot: 0, base: 0x2000_0000, real: [5u8; 64] });
        assert_eq!(o.block_of(p), None, "closed");
    }

    #[test]
    fn a_refused_open_leaves_nothing() {
        let o = Box::new(Opened::new());
        let Begin::Open { slot } = o.begin_open(&[9; 64], ME, 0, 1024) else { panic!() };
        assert!(!o.end_open(slot, None, 0, 1024));
        assert!(matches!(o.begin_open(&[9; 64], ME, 0, 1024), Begin::Open { .. }));
    }
}
