//! Giving segments back, as far as the pool is concerned: which segments may go (every fully
//! free one when the cache is given back, idle ones after a delay: Note [Idle segments]), taken
//! out of the tables for the caller to free, and the figures that say how much could go.
//! Bookkeeping only, under the pool's lock; never calls CUDA.

use super::*;

/// Why idle segments go back to the driver (the stats count each way apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Idle for the release delay.
    Time,
    /// Idle for a second on a device short of memory.
    Pressure,
    /// Another process on the GPU is short of memory and asked (Note [Neighbours]).
    Neighbour,
}

/// What `release_idle_segments` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleRelease {
    /// Segments put in `out`.
    pub count: usize,
    /// The stamp of the oldest whole free segment left (synchronized), if any.
    pub oldest_left_ns: Option<u64>,
    /// A whole free segment waits for a synchronization (a stream may still use it).
    pub pending_left: bool,
}

// Note [Idle segments]
// A segment with no live block that stays so for the release delay goes back to the driver,
// from the background thread (DeviceLayer::release_idle), so that other processes on the
// GPU get what we hold idle. A free stamps the free block it leaves with the time (the
// block's `born_ns`, which only live blocks use otherwise); a segment is idle when its one
// block is free, synchronized (no stream may still use it: Note [Safe reuse]; a pending one
// waits for the next synchronization) and stamped before the cutoff. A loop that reuses its
// blocks every step never leaves one idle that long, so it never pays a driver call.
// Under pressure (the driver reports less than TENSORMALLOC_CUDA_RELEASE_BELOW percent of the
// device free: another process needs memory) the delay is one second: while idle segments
// are held, the background thread asks the driver about once a second (one cuMemGetInfo).
// A loop whose steps reuse a segment within a second still never pays; a process that leaves
// memory idle longer than that on a full device gives it to whoever is waiting for it. The
// stats count these releases apart (`pressure_released_bytes`).
// The background thread frees what it took out in the pool's context, after checking that no
// reset or end of that context came meanwhile (the generation); a context's end through us
// (cuCtxDestroy, a primary reset or release) first waits for a release under way to finish
// (DeviceLayer::lock_between_releases), so the check and the frees are never split by it.
// Not covered: a primary context released to zero by a call that does not come through us
// right between the check and a free, and re-created with an allocation at that very address
// within those microseconds.

impl DevicePool {
    /// Bytes in segments with no live block: what giving the cache back returns to the driver
    /// (the free part of a partly used segment never leaves it, and can never hold a block
    /// larger than itself). A segment whose free blocks wait for different synchronizations
    /// (a pending free beside a synchronized tail: they merge only once synchronized) counts
    /// whole: a request that needs it synchronizes, and the segment goes back whole. Counting
    /// only one-block segments left cudaMemGetInfo 22 MiB short after a 21 MiB tensor's free
    /// under TENSORMALLOC_CUDA_SYNC=reuse, until our idle synchronization 10 s later (the
    /// torchsim hunter).
    pub fn releasable_bytes(&self) -> u64 {
        if self.expandable() {
            return self.idle_chunk_bytes();
        }
        let mut total = 0;
        self.segments.for_each(|_, first| {
            let (mut i, mut size) = (first, 0);
            while i != NONE {
                let b = self.blocks.get(i);
                if b.allocated {
                    return;
                }
                size += b.size;
                i = b.seg_next;
            }
            total += size;
        });
        total
    }

    /// The largest free block (0 with none): a request larger than it needs a new segment
    /// however much is cached (fragmentation, for the out-of-memory report).
    pub fn largest_free_bytes(&self) -> u64 {
        if self.expandable() {
            // Address space is never short: what one request can get is what the idle chunks hold.
            return self.idle_chunk_bytes();
        }
        let mut largest = 0;
        self.segments.for_each(|_, first| {
            let mut i = first;
            while i != NONE {
                let b = self.blocks.get(i);
                if !b.allocated {
                    largest = largest.max(b.size);
                }
                i = b.seg_next;
            }
        });
        largest
    }

    /// Removes up to `out.len()` fully free segments (at most `max_bytes` in all) and writes
    /// their (address, length) to `out` for the caller to cudaFree; returns how many.
    pub fn release_free_segments(&mut self, max_bytes: u64, out: &mut [(u64, u64)]) -> usize {
        let mut count = 0;
        let mut released = 0u64;
        for small in [false, true] {
            for bin in (0..BINS).rev() {
                let mut i = self.bin_head(small, bin);
                while i != NONE && count < out.len() && released < max_bytes {
                    let b = *self.blocks.get(i);
                    let next = b.bin_next;
                    if b.seg_prev == NONE && b.seg_next == NONE {
                        self.unlink(i);
                        self.segments.remove(b.addr);
                        self.blocks.remove(i);
                        if let Some(slot) = out.get_mut(count) {
                            *slot = (b.addr, b.size);
                        }
                        count += 1;
                        released += b.size;
                        self.stats.reserved_bytes -= b.size;
                        self.stats.segments_released += 1;
                    }
                    i = next;
                }
            }
        }
        count
    }

    /// Takes out of the pool, into `out`, the idle segments (Note [Idle segments]) free since
    /// `cutoff_ns` or before, counted as released for `why`.
    pub fn release_idle_segments(&mut self, cutoff_ns: u64, why: Release, out: &mut [(u64, u64)]) -> IdleRelease {
        let mut count = 0;
        let mut next = None::<u64>;
        let mut pending = false;
        for small in [false, true] {
            for bin in 0..BINS {
                let mut i = self.bin_head(small, bin);
                while i != NONE {
                    let b = *self.blocks.get(i);
                    let whole = b.seg_prev == NONE && b.seg_next == NONE;
                    if whole && b.tag == SYNCED && b.born_ns <= cutoff_ns && count < out.len() {
                        self.unlink(i);
                        self.segments.remove(b.addr);
                        self.blocks.remove(i);
                        if let Some(slot) = out.get_mut(count) {
                            *slot = (b.addr, b.size);
                        }
                        count += 1;
                        self.stats.reserved_bytes -= b.size;
                        self.stats.segments_released += 1;
                        self.stats.idle_released_segments += 1;
                        self.stats.idle_released_bytes += b.size;
                        match why {
                            Release::Time => {}
                            Release::Pressure => {
                                self.stats.pressure_released_segments += 1;
                                self.stats.pressure_released_bytes += b.size;
                            }
                            Release::Neighbour => {
                                self.stats.neighbour_released_segments += 1;
                                self.stats.neighbour_released_bytes += b.size;
                            }
                        }
                    } else if whole && b.tag == SYNCED {
                        next = Some(next.map_or(b.born_ns, |n| n.min(b.born_ns)));
                    } else if whole {
                        pending = true;
                    }
                    i = b.bin_next;
                }
            }
        }
        IdleRelease { count, oldest_left_ns: next, pending_left: pending }
    }
}
