//! The counters file's layout (Note [Numbers that survive] in record/ledger/mod.rs): a header
//! that says who wrote it, one `Place` of counts per place (host, pinned, devices 0..15) and the
//! detail (the JSON report) behind them; how counts change at each event and how counts made
//! before the file existed move into it; how a reader takes another process's file (`read`).
//! python/tensormalloc/report.py reads the same layout.

use crate::record::holders::PLACES;
use crate::record::Found;
use core::sync::atomic::{AtomicU64, Ordering::*};

pub const MAGIC: [u8; 8] = *b"TMLEDGER";
pub const VERSION: u32 = 1;
pub const PLACES_AT: usize = 256;
pub const DETAIL_AT: usize = 4096;
pub const DETAIL_BYTES: usize = 16384;
pub const FILE_BYTES: usize = DETAIL_AT + DETAIL_BYTES;
pub const ANCESTORS: usize = 8;

/// Who wrote the file, and the state of its detail.
#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    pub file_bytes: u32,
    pub places_at: u32,
    pub places: u32,
    pub place_bytes: u32,
    pub detail_at: u32,
    pub detail_bytes: u32,
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    /// The process this one was forked from with us loaded (0: none).
    pub forked_from: u32,
    /// How many of `ancestor_*` are filled.
    pub ancestors: u32,
    pub ticks_per_second: u64,
    /// /proc/self/stat's start (ticks after boot): with the pid, the process.
    pub start_ticks: u64,
    /// This image's start (its load, or its fork), wall ns: with the two above, the image.
    pub image_started_wall_ns: u64,
    pub process_started_wall_ns: u64,
    pub command: [u8; 16],
    pub ancestor_pids: [u32; ANCESTORS],
    pub ancestor_starts: [u64; ANCESTORS],
    /// 0 while the image runs; wall ns of its exit hook.
    pub exited: AtomicU64,
    /// Even when the detail is whole, odd while it is written.
    pub detail_seq: AtomicU64,
    pub detail_len: AtomicU64,
    /// When the detail was last written (wall ns).
    pub detail_wall_ns: AtomicU64,
    /// 0, or when the image after an exec of this one claimed its own file (wall ns): this
    /// image ended by exec, its counts are final.
    pub replaced_wall_ns: AtomicU64,
}

/// One place's counts (a place: host, pinned, or a device).
#[repr(C)]
pub struct Place {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Host: misses served from the pages of cached blocks.
    pub grows: AtomicU64,
    /// Requests that failed for want of memory.
    pub failures: AtomicU64,
    pub frees: AtomicU64,
    /// Wraps below zero only in transit (PENDING's deltas); readers saturate.
    pub live_bytes: AtomicU64,
    pub peak_live_bytes: AtomicU64,
    pub handed_out_bytes: AtomicU64,
    pub live_blocks: AtomicU64,
    pub segments_mapped: AtomicU64,
    pub segments_released: AtomicU64,
    pub reserved_bytes: AtomicU64,
    pub peak_reserved_bytes: AtomicU64,
    pub spare: [AtomicU64; 3],
}

const _: () = assert!(core::mem::size_of::<Header>() <= PLACES_AT && PLACES_AT + PLACES * core::mem::size_of::<Place>() <= DETAIL_AT);
const _: () = assert!(core::mem::size_of::<Place>() == 128);

impl Place {
    pub(super) const fn new() -> Self {
        Place {
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            grows: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            peak_live_bytes: AtomicU64::new(0),
            handed_out_bytes: AtomicU64::new(0),
            live_blocks: AtomicU64::new(0),
            segments_mapped: AtomicU64::new(0),
            segments_released: AtomicU64::new(0),
            reserved_bytes: AtomicU64::new(0),
            peak_reserved_bytes: AtomicU64::new(0),
            spare: [const { AtomicU64::new(0) }; 3],
        }
    }

    pub(super) fn fields(&self) -> [&AtomicU64; 13] {
        [
            &self.hits, &self.misses, &self.grows, &self.failures, &self.frees, &self.live_bytes, &self.peak_live_bytes, &self.handed_out_bytes,
            &self.live_blocks, &self.segments_mapped, &self.segments_released, &self.reserved_bytes, &self.peak_reserved_bytes,
        ]
    }

    /// A level's rise: its peak follows (a read first: below the peak costs no locked instruction).
    fn rise(level: &AtomicU64, peak: &AtomicU64, n: u64) {
        let now = level.fetch_add(n, Relaxed).wrapping_add(n);
        if now < 1 << 63 && now > peak.load(Relaxed) {
            peak.fetch_max(now, Relaxed);
        }
    }

    pub(super) fn alloc(&self, bytes: u64, found: Found) {
        match found {
            Found::Hit => &self.hits,
            Found::Miss => &self.misses,
            Found::Grown => &self.grows,
        }
        .fetch_add(1, Relaxed);
        Self::rise(&self.live_bytes, &self.peak_live_bytes, bytes);
        self.handed_out_bytes.fetch_add(bytes, Relaxed);
        self.live_blocks.fetch_add(1, Relaxed);
    }

    pub(super) fn free(&self, bytes: u64, counted: bool) {
        if counted {
            self.frees.fetch_add(1, Relaxed);
        }
        self.live_bytes.fetch_sub(bytes, Relaxed);
        self.live_blocks.fetch_sub(1, Relaxed);
    }

    pub(super) fn resize(&self, old: u64, new: u64) {
        if new >= old {
            Self::rise(&self.live_bytes, &self.peak_live_bytes, new - old);
        } else {
            self.live_bytes.fetch_sub(old - new, Relaxed);
        }
    }

    pub(super) fn segment(&self, bytes: u64, mapped: bool) {
        if mapped {
            self.segments_mapped.fetch_add(1, Relaxed);
            Self::rise(&self.reserved_bytes, &self.peak_reserved_bytes, bytes);
        } else {
            self.segments_released.fetch_add(1, Relaxed);
            self.reserved_bytes.fetch_sub(bytes, Relaxed);
        }
    }

    /// Moves every count of `self` (pending deltas) into `to`, leaving zeros. Peaks are not
    /// deltas: a pending peak (a level reached from the file's, which is never below zero) and
    /// what the file holds once the deltas are in both bound the file's peak from below.
    pub(super) fn drain_into(&self, to: &Place) {
        let peaks = [(&self.peak_live_bytes, &to.peak_live_bytes, &to.live_bytes), (&self.peak_reserved_bytes, &to.peak_reserved_bytes, &to.reserved_bytes)];
        for (from, into) in self.fields().into_iter().zip(to.fields()) {
            if peaks.iter().any(|(p, _, _)| core::ptr::eq(*p, from)) {
                continue;
            }
            let v = from.swap(0, AcqRel);
            if v != 0 {
                into.fetch_add(v, AcqRel);
            }
        }
        for (from, peak, level) in peaks {
            let pending_peak = from.swap(0, AcqRel);
            let now = level.load(Acquire);
            peak.fetch_max(pending_peak.max(if now < 1 << 63 { now } else { 0 }), AcqRel);
        }
    }
}

/// What a reader takes from another process's file (the STATS=1 exit summary, tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Read {
    pub pid: u32,
    pub start_ticks: u64,
    pub image_started_wall_ns: u64,
    pub exited: bool,
    pub ancestors: [(u32, u64); ANCESTORS],
    pub ancestor_count: usize,
    /// Host and devices together; pinned apart.
    pub requests: u64,
    pub hits: u64,
    pub frees: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub device_requests: u64,
    pub reserved_bytes: u64,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Who wrote a counters file, from its first bytes (its header): (pid, process start ticks);
/// None when they are not a counters file of this version.
pub fn writer(b: &[u8]) -> Option<(u32, u64)> {
    use core::mem::offset_of;
    if b.get(..8)? != MAGIC || u32_at(b, offset_of!(Header, version))? != VERSION {
        return None;
    }
    Some((u32_at(b, offset_of!(Header, pid))?, u64_at(b, offset_of!(Header, start_ticks))?))
}

/// A counters file's bytes (its first DETAIL_AT at least) as a reader takes them; None when
/// they are not such a file of this version.
pub fn read(b: &[u8]) -> Option<Read> {
    use core::mem::offset_of;
    if b.get(..8)? != MAGIC || u32_at(b, offset_of!(Header, version))? != VERSION {
        return None;
    }
    let places = usize::try_from(u32_at(b, offset_of!(Header, places))?).ok().filter(|&n| n <= 64)?;
    let place_bytes = usize::try_from(u32_at(b, offset_of!(Header, place_bytes))?).ok().filter(|&n| n >= 104)?;
    let places_at = usize::try_from(u32_at(b, offset_of!(Header, places_at))?).ok()?;
    let mut r = Read {
        pid: u32_at(b, offset_of!(Header, pid))?,
        start_ticks: u64_at(b, offset_of!(Header, start_ticks))?,
        image_started_wall_ns: u64_at(b, offset_of!(Header, image_started_wall_ns))?,
        exited: u64_at(b, offset_of!(Header, exited))? != 0,
        ancestor_count: (u32_at(b, offset_of!(Header, ancestors))? as usize).min(ANCESTORS),
        ..Read::default()
    };
    for i in 0..r.ancestor_count {
        let pid = u32_at(b, offset_of!(Header, ancestor_pids) + 4 * i)?;
        let start = u64_at(b, offset_of!(Header, ancestor_starts) + 8 * i)?;
        if let Some(slot) = r.ancestors.get_mut(i) {
            *slot = (pid, start);
        }
    }
    let level = |v: u64| if v >= 1 << 63 { 0 } else { v };
    for i in 0..places {
        let at = places_at.checked_add(i.checked_mul(place_bytes)?)?;
        let field = |k: usize| u64_at(b, at + 8 * k);
        let requests = field(0)? + field(1)? + field(2)? + field(3)?;
        if i == usize::from(crate::record::holders::PLACE_PINNED) {
            continue;
        }
        r.requests += requests;
        r.hits += field(0)?;
        r.frees += field(4)?;
        r.live_bytes += level(field(5)?);
        r.peak_live_bytes = r.peak_live_bytes.max(field(6)?);
        if i > usize::from(crate::record::holders::PLACE_PINNED) {
            r.device_requests += requests;
            r.reserved_bytes += level(field(11)?);
        }
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_counts_move_into_the_file_whole() {
        let pending = Place::new();
        let file = Place::new();
        file.alloc(100, Found::Miss);
        pending.alloc(50, Found::Hit);
        pending.free(100, true);
        pending.alloc(20, Found::Grown);
        pending.segment(4096, true);
        pending.drain_into(&file);
        assert_eq!((file.hits.load(Relaxed), file.misses.load(Relaxed), file.grows.load(Relaxed), file.frees.load(Relaxed)), (1, 1, 1, 1));
        assert_eq!((file.live_bytes.load(Relaxed), file.live_blocks.load(Relaxed)), (70, 2), "a free of a block counted before the claim");
        assert_eq!(file.handed_out_bytes.load(Relaxed), 170);
        assert_eq!((file.peak_live_bytes.load(Relaxed), file.reserved_bytes.load(Relaxed), file.peak_reserved_bytes.load(Relaxed)), (100, 4096, 4096));
        assert!(pending.fields().iter().all(|f| f.load(Relaxed) == 0), "nothing left to move twice");
    }

    #[test]
    fn levels_keep_their_peaks_through_resizes_and_segments() {
        let p = Place::new();
        p.alloc(10, Found::Miss);
        p.resize(10, 40);
        p.resize(40, 5);
        p.segment(1000, true);
        p.segment(1000, false);
        p.free(5, true);
        assert_eq!((p.live_bytes.load(Relaxed), p.peak_live_bytes.load(Relaxed), p.reserved_bytes.load(Relaxed), p.peak_reserved_bytes.load(Relaxed)), (0, 40, 0, 1000));
        assert_eq!((p.segments_mapped.load(Relaxed), p.segments_released.load(Relaxed)), (1, 1));
    }
}
