//! Expandable segments (Note [Expandable segments]): reserved address ranges that the pool's
//! blocks tile, backed chunk by chunk with physical memory as live blocks need it. Bookkeeping
//! only, under the pool's lock; the layer makes the driver calls (reserve, map, unmap).
//
// Note [Expandable segments]
// With TENSORMALLOC_CUDA_SEGMENTS=expandable a pool's segments are ranges of device address space
// reserved with cuMemAddressReserve (two per device: one for requests under 1 MiB, one for the
// rest, each sized from the device's memory; another when one is full). Blocks are carved from
// them and merged as in a classic segment, and never move. A range's physical memory is a chunk
// per granule (cuMemGetAllocationGranularity, 2 MiB on current GPUs): a chunk is created, mapped
// and made accessible (cuMemCreate, cuMemMap, cuMemSetAccess) when a live block first touches
// it, and stays mapped while free, so a loop that repeats its sizes reuses mapped memory with no
// driver call. A chunk no live block touches is idle: it goes back to the driver (cuMemUnmap,
// cuMemRelease) by the same paths as an idle classic segment (time, pressure, a neighbour's
// ask, tm_trim and a framework's empty_cache) and before any out-of-memory is answered, whatever
// is live around it: memory never stays pinned by one small block. Each chunk counts the live
// blocks that touch it (`live`); reserved bytes are the mapped chunks' bytes, what the driver
// holds for us. Mapping and unmapping happen under the layer's per-device grow lock, so a chunk
// is never mapped twice or unmapped while a request maps it: a request that finds a chunk it
// touches unmapped (`NeedMap`) takes the grow lock and maps the chunks still unmapped then.
// Unmapping does not synchronize: chunks go only when no free block in the pool waits for a
// synchronization (a stream may still use it), or after the layer synchronized.
// A context's end frees its cuMemAlloc'd memory, not ours: the layer gives every chunk and range
// back itself before the pool forgets them (DeviceLayer::release_all_chunks).
// Chunks are made accessible to their device and to the devices the program enabled peer access
// for (DeviceLayer::peer_access_enabled grants the ones mapped already). IPC of their blocks goes
// through the chunks' file descriptors (Note [IPC of expandable segments] in exports.rs): a chunk
// that has one is never moved.

use super::*;

/// Ranges a pool may reserve.
pub const MAX_RANGES: usize = 8;
/// Chunks a pool tracks, in all its ranges (2 TiB of address space at 2 MiB).
pub(super) const CHUNK_CAPACITY: u32 = 1 << 20;

#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) addr: u64,
    /// The physical memory mapped here (cuMemCreate's handle); 0: not mapped.
    pub(super) handle: u64,
    /// A file descriptor of that memory, exported for IPC (Note [IPC of expandable segments] in
    /// exports.rs); -1: none. Closed by the layer when the chunk goes back.
    pub(super) fd: i32,
    /// Live blocks that touch the chunk.
    live: u32,
    /// When its last live block went (Note [Idle segments]).
    idle_since_ns: u64,
    /// The idle list (mapped, no live block), oldest first: neighbours' indices or NONE.
    prev: u32,
    next: u32,
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Range {
    pub(super) base: u64,
    pub(super) len: u64,
    /// Index of its first chunk in the pool's chunk table.
    pub(super) first_chunk: u32,
}

/// A chunk taken out of the pool for the layer to unmap and release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unmap {
    pub addr: u64,
    pub handle: u64,
    /// Its exported file descriptor, for the layer to close (Note [IPC of expandable segments]);
    /// -1: none.
    pub fd: i32,
}

impl Default for Unmap {
    fn default() -> Self {
        Unmap { addr: 0, handle: 0, fd: -1 }
    }
}

impl DevicePool {
    /// Whether segments are expandable ranges (Note [Expandable segments]).
    pub fn expandable(&self) -> bool {
        self.chunk_bytes != 0
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// The first reservation was refused (Note [Expandable segments]): with no range yet, the pool
    /// goes on with classic segments, for good. False when it holds a range already.
    pub fn fall_back_to_classic(&mut self) -> bool {
        if self.range_count == 0 {
            self.chunk_bytes = 0;
        }
        !self.expandable()
    }

    /// The reserved range containing `addr`.
    pub(super) fn range_containing(&self, addr: u64) -> Option<&Range> {
        self.ranges.iter().take(self.range_count).find(|r| addr.wrapping_sub(r.base) < r.len)
    }

    /// The reserved range containing `addr`, by its base.
    pub fn range_of(&self, addr: u64) -> Option<u64> {
        self.range_containing(addr).map(|r| r.base)
    }

    /// Chunk-table indices of the chunks [addr, addr + size) touches; empty outside the ranges.
    pub(super) fn chunk_span(&self, addr: u64, size: u64) -> core::ops::Range<u32> {
        let Some(r) = self.range_containing(addr) else { return 0..0 };
        let first = (addr - r.base) / self.chunk_bytes;
        let last = (addr - r.base + size.max(1) - 1) / self.chunk_bytes;
        (r.first_chunk + first as u32)..(r.first_chunk + last as u32 + 1)
    }

    /// Records a range the layer reserved after `NeedSegment`: one free block over all of it,
    /// no chunk mapped. False when the tables are full (the layer gives the range back).
    pub fn add_range(&mut self, base: u64, len: u64, small: bool) -> bool {
        let chunks = len / self.chunk_bytes.max(1);
        if self.range_count >= MAX_RANGES || chunks == 0 || !len.is_multiple_of(self.chunk_bytes) {
            return false;
        }
        let chunk = |k: u64| Chunk { addr: base + k * self.chunk_bytes, handle: 0, fd: -1, live: 0, idle_since_ns: 0, prev: NONE, next: NONE };
        let Some(first_chunk) = self.chunks.insert(chunk(0)) else { return false };
        for k in 1..chunks {
            if self.chunks.insert(chunk(k)).is_none() {
                return false; // never reused: the table only grows until forget_all
            }
        }
        let block = Block { addr: base, size: len, seg_prev: NONE, seg_next: NONE, bin_prev: NONE, bin_next: NONE, allocated: false, small, tag: SYNCED, born_ns: 0, holder: 0, exported: false, dead: false, ipc_entry: NONE, buffer_id: 0 };
        let Some(i) = self.blocks.insert(block) else { return false };
        if !self.segments.insert(base, i) {
            self.blocks.remove(i);
            return false;
        }
        if let Some(slot) = self.ranges.get_mut(self.range_count) {
            *slot = Range { base, len, first_chunk };
        }
        self.range_count += 1;
        self.link(i);
        self.span = (self.span.0.min(base), self.span.1.max(base.saturating_add(len)));
        true
    }

    /// A block [addr, addr + size) was handed out: its chunks count it. True when one of them is
    /// not mapped (the layer maps it before handing the block to the program).
    pub(super) fn touch(&mut self, addr: u64, size: u64) -> bool {
        let mut unmapped = false;
        for i in self.chunk_span(addr, size) {
            let c = self.chunks.get_mut(i);
            c.live += 1;
            unmapped |= c.handle == 0;
            if c.live == 1 && c.handle != 0 {
                self.unlink_idle(i);
            }
        }
        unmapped
    }

    /// Whether a chunk of [addr, addr + size) is not mapped.
    pub(super) fn has_unmapped(&self, addr: u64, size: u64) -> bool {
        self.chunk_span(addr, size).any(|i| self.chunks.get(i).handle == 0)
    }

    /// A block [addr, addr + size) was freed at `now_ns`: its chunks no longer count it. True
    /// when a mapped chunk became idle.
    pub(super) fn untouch(&mut self, addr: u64, size: u64, now_ns: u64) -> bool {
        let mut idled = false;
        for i in self.chunk_span(addr, size) {
            let c = self.chunks.get_mut(i);
            c.live = c.live.saturating_sub(1);
            if c.live == 0 && c.handle != 0 {
                c.idle_since_ns = now_ns;
                self.push_idle(i);
                idled = true;
            }
        }
        idled
    }

    /// Writes to `out` the addresses of the chunks of live block [addr, addr + size) not mapped
    /// yet; returns how many.
    pub fn unmapped_chunks(&self, addr: u64, size: u64, out: &mut [u64]) -> usize {
        let mut n = 0;
        let Some(r) = self.range_containing(addr) else { return 0 };
        for i in self.chunk_span(addr, size) {
            if self.chunks.get(i).handle != 0 {
                continue;
            }
            let Some(slot) = out.get_mut(n) else { break };
            *slot = r.base + u64::from(i - r.first_chunk) * self.chunk_bytes;
            n += 1;
        }
        n
    }

    /// The layer mapped physical memory `handle` at chunk `addr` (under the grow lock). False when
    /// no range of this pool holds it any more (a reset came meanwhile: the layer unmaps it).
    pub fn set_mapped(&mut self, addr: u64, handle: u64) -> bool {
        let span = self.chunk_span(addr, 1);
        if span.is_empty() || handle == 0 {
            return false;
        }
        for i in span {
            let c = self.chunks.get_mut(i);
            c.handle = handle;
            if c.live == 0 {
                c.idle_since_ns = 0;
                self.push_idle(i);
            }
        }
        self.stats.segments_mapped += 1;
        self.stats.reserved_bytes += self.chunk_bytes;
        self.stats.peak_reserved_bytes = self.stats.peak_reserved_bytes.max(self.stats.reserved_bytes);
        true
    }

    /// Appends mapped chunk `i`, which no live block touches now, to the idle list (newest last).
    fn push_idle(&mut self, i: u32) {
        let tail = self.idle_tail;
        {
            let c = self.chunks.get_mut(i);
            c.prev = tail;
            c.next = NONE;
        }
        if tail == NONE {
            self.idle_head = i;
        } else {
            self.chunks.get_mut(tail).next = i;
        }
        self.idle_tail = i;
        self.idle_chunks += 1;
    }

    fn unlink_idle(&mut self, i: u32) {
        let c = *self.chunks.get(i);
        if c.prev == NONE {
            self.idle_head = c.next;
        } else {
            self.chunks.get_mut(c.prev).next = c.next;
        }
        if c.next == NONE {
            self.idle_tail = c.prev;
        } else {
            self.chunks.get_mut(c.next).prev = c.prev;
        }
        let r = self.chunks.get_mut(i);
        r.prev = NONE;
        r.next = NONE;
        self.idle_chunks -= 1;
    }

    /// Takes the oldest idle chunk out of its place: no longer mapped for the pool.
    fn take_oldest_idle(&mut self) -> Option<Unmap> {
        let i = self.idle_head;
        (i != NONE).then(|| self.take_idle(i))
    }

    /// Takes idle chunk `i` out of its place: no longer mapped for the pool. A dead block it held
    /// exported memory for may be free again (Note [IPC of expandable segments]).
    fn take_idle(&mut self, i: u32) -> Unmap {
        self.unlink_idle(i);
        let c = self.chunks.get_mut(i);
        let handle = core::mem::take(&mut c.handle);
        let fd = core::mem::replace(&mut c.fd, -1);
        let addr = c.addr;
        self.stats.reserved_bytes -= self.chunk_bytes;
        if fd >= 0 {
            self.revive_dead_over(addr);
        }
        Unmap { addr, handle, fd }
    }

    /// Bytes of mapped chunks no live block touches: what giving the cache back returns.
    pub(super) fn idle_chunk_bytes(&self) -> u64 {
        self.idle_chunks * self.chunk_bytes
    }

    /// An idle chunk to map where a block needs memory (Note [Expandable segments]): once the
    /// driver holds more than a tenth above the most ever live (and two chunks), idle chunks are
    /// moved where they are needed rather than new memory made. Below that, new memory is made:
    /// a loop that repeats its sizes then settles with every place it uses mapped, and pays no
    /// driver call after warm-up. None also while a free block waits for a synchronization (a
    /// stream may still use an idle chunk). A chunk whose memory was exported is never moved
    /// (Note [IPC of expandable segments]): the oldest of the first few idle ones that was not.
    pub fn take_idle_chunk(&mut self) -> Option<Unmap> {
        let live = self.stats.peak_live_bytes;
        let budget = live.saturating_add(live / 10).saturating_add(2 * self.chunk_bytes);
        if self.stats.reserved_bytes.saturating_add(self.chunk_bytes) <= budget || self.pending_free_bytes + self.other_tag_free_bytes > 0 {
            return None;
        }
        let mut i = self.idle_head;
        for _ in 0..64 {
            if i == NONE {
                return None;
            }
            let c = self.chunks.get(i);
            if c.fd < 0 {
                return Some(self.take_idle(i));
            }
            i = c.next;
        }
        None
    }

    /// Takes out of the pool, into `out`, the chunks idle since `cutoff_ns` or before, oldest
    /// first (Note [Expandable segments]), counted as released for `why` (None: the cache given
    /// back on request or before an out of memory). Chunks stay while a free block waits for a
    /// synchronization (`pending_left`).
    pub fn release_idle_chunks(&mut self, cutoff_ns: u64, why: Option<Release>, out: &mut [Unmap]) -> IdleRelease {
        let mut result = IdleRelease { count: 0, oldest_left_ns: None, pending_left: false };
        if self.pending_free_bytes + self.other_tag_free_bytes > 0 {
            result.pending_left = self.idle_head != NONE;
            return result;
        }
        while self.idle_head != NONE && result.count < out.len() && self.chunks.get(self.idle_head).idle_since_ns <= cutoff_ns {
            let Some(u) = self.take_oldest_idle() else { break };
            if let Some(slot) = out.get_mut(result.count) {
                *slot = u;
            }
            result.count += 1;
        }
        if self.idle_head != NONE {
            let oldest = self.chunks.get(self.idle_head).idle_since_ns;
            // (Chunks due but past a full batch: the caller asks again at once.)
            if oldest > cutoff_ns {
                result.oldest_left_ns = Some(oldest);
            }
        }
        let bytes = result.count as u64 * self.chunk_bytes;
        self.stats.segments_released += result.count as u64;
        if let Some(why) = why {
            self.stats.idle_released_segments += result.count as u64;
            self.stats.idle_released_bytes += bytes;
            match why {
                Release::Time => {}
                Release::Pressure => {
                    self.stats.pressure_released_segments += result.count as u64;
                    self.stats.pressure_released_bytes += bytes;
                }
                Release::Neighbour => {
                    self.stats.neighbour_released_segments += result.count as u64;
                    self.stats.neighbour_released_bytes += bytes;
                }
            }
        }
        result
    }

    /// Takes up to `out.len()` mapped chunks out of the pool, live ones too, into `out` (the
    /// pool's context ends: Note [Expandable segments]); returns how many.
    pub fn take_all_chunks(&mut self, out: &mut [Unmap]) -> usize {
        let mut n = 0;
        for r in 0..self.range_count {
            let Some(range) = self.ranges.get(r).copied() else { break };
            for k in 0..(range.len / self.chunk_bytes) as u32 {
                let i = range.first_chunk + k;
                let c = *self.chunks.get(i);
                if c.handle == 0 {
                    continue;
                }
                let Some(slot) = out.get_mut(n) else { return n };
                if c.live == 0 {
                    self.unlink_idle(i);
                }
                let r = self.chunks.get_mut(i);
                r.handle = 0;
                r.fd = -1;
                *slot = Unmap { addr: c.addr, handle: c.handle, fd: c.fd };
                self.stats.reserved_bytes -= self.chunk_bytes;
                self.stats.segments_released += 1;
                n += 1;
            }
        }
        n
    }

    /// The reserved ranges, (base, length), in `out`; how many.
    pub fn ranges(&self, out: &mut [(u64, u64); MAX_RANGES]) -> usize {
        for (slot, r) in out.iter_mut().zip(self.ranges.iter().take(self.range_count)) {
            *slot = (r.base, r.len);
        }
        self.range_count
    }

    /// Runs of mapped chunks (start, end) that begin at `from` or after, in address order across
    /// the ranges, into `out`; how many.
    pub fn mapped_runs_from(&self, from: u64, out: &mut [(u64, u64)]) -> usize {
        let mut n = 0;
        let mut bases = [0u64; MAX_RANGES];
        for (slot, r) in bases.iter_mut().zip(self.ranges.iter().take(self.range_count)) {
            *slot = r.base;
        }
        let bases = bases.get_mut(..self.range_count).unwrap_or(&mut []);
        bases.sort_unstable();
        for &base in bases.iter() {
            self.for_each_mapped_run(base, |start, end| {
                if start >= from {
                    if let Some(slot) = out.get_mut(n) {
                        *slot = (start, end);
                        n += 1;
                    }
                }
            });
        }
        n
    }

    /// Calls `f(start, end)` for every run of mapped chunks side by side in the range at `base`.
    pub(super) fn for_each_mapped_run(&self, base: u64, mut f: impl FnMut(u64, u64)) {
        let Some(r) = self.ranges.iter().take(self.range_count).find(|r| r.base == base) else { return };
        let mut run: Option<u64> = None;
        for k in 0..(r.len / self.chunk_bytes) as u32 {
            let addr = r.base + u64::from(k) * self.chunk_bytes;
            match (self.chunks.get(r.first_chunk + k).handle != 0, run) {
                (true, None) => run = Some(addr),
                (false, Some(start)) => {
                    f(start, addr);
                    run = None;
                }
                _ => {}
            }
        }
        if let Some(start) = run {
            f(start, r.base + r.len);
        }
    }

    /// Calls `f(addr, handle)` for every mapped chunk (the layer gives them all back when the
    /// pool is emptied for good).
    pub fn for_each_mapped_chunk(&self, mut f: impl FnMut(u64, u64)) {
        for r in self.ranges.iter().take(self.range_count) {
            for k in 0..(r.len / self.chunk_bytes) as u32 {
                let c = self.chunks.get(r.first_chunk + k);
                if c.handle != 0 {
                    f(c.addr, c.handle);
                }
            }
        }
    }
}
