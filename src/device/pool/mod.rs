//! One device's caching pool: bookkeeping only. It never calls CUDA: it says what it needs (a
//! new segment, a device synchronization) and the caller does it outside the lock, then tells
//! the pool (`add_segment`, `mark_synced_before`). Tested over a simulated device.
//
// Note [Safe reuse]
// cudaFree synchronizes the device, so a program may free a block while kernels that use it
// are still queued on any stream, and count on the memory not being reused too early. Each free
// block carries a tag saying who may reuse it with no synchronization:
// - SYNCED: every piece of work issued before its free has finished (the caller synchronized
//   the device at free, the default, or later in `mark_synced_before`, for what was freed
//   before that synchronization began);
// - PENDING: freed by cudaFree in the deferred mode; usable only after a device sync;
// - a stream tag: freed through the pluggable allocator on that stream; stream order makes it
//   safe for a later allocation on the same stream, and for others after a device sync.
// An allocation takes only blocks it may use; when the only fitting blocks are PENDING the
// pool asks for a sync first, so deferred mode never grows memory in a free/alloc loop. A
// cudaMalloc (SYNCED request) also asks for a sync when blocks freed on streams
// (cudaFreeAsync) would fit.
//
// Note [Segments of their own]
// The split pool carves requests under 1 MiB from 2 MiB segments and those under 2 MiB from
// 20 MiB ones; from 2 MiB up each gets a segment of its own (rounded to 2 MiB) unless a free block
// fits. It carved up to 10 MiB, as PyTorch's own allocator does, but PyTorch on top of us asks
// for exactly 2 MiB and 20 MiB segments: carved, one small tensor cost 20 MiB of device memory, a
// freed 2 MiB segment could not leave while a neighbour in its 20 MiB lived (800 MiB refused with
// 450 MiB cached), and an exported one, never reused after its free (Note [IPC] in pointers.rs),
// pinned its 20 MiB: a torch.multiprocessing producer lost about 1 MiB a step.

// Note [Context lifetime]
// A device reset, a context destroy, or the last release of a primary context frees every
// allocation of that context behind our back.
// `forget_all` drops every segment and live block without asking the runtime to free anything;
// `generation` tells a caller who mapped a segment before the reset not to add it. The driver may
// give a later context the dead one's handle (the primary context's never changes), so segments
// belong to a context instance: the layer forgets them when that instance ends (a destroy, a
// reset, a primary context released to zero), before the handle can name another. The pool
// records its owner under its own lock, bound by its first segment (`bind`) and checked at every
// hand-out (`serves`): two contexts racing their first allocation never share a pool. A pool
// that holds no device memory (a forgotten one) is never entered for a release
// (`holds_memory`): with no context of its own, entering would retain the device's primary
// context and so make again the one the program had just reset.

use super::table::{AddrMap, Slab, NONE};
use crate::backing::TableSource;
pub use crate::record::holders::Birth;

pub const SYNCED: u64 = 0;
pub const PENDING: u64 = 1;

/// The reuse tag for blocks freed on `stream` (a cudaStream_t, 0 for the legacy stream).
pub fn stream_tag(stream: usize) -> u64 {
    (stream as u64).wrapping_add(2).max(2)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Split,
    Binned,
}

const ROUND: u64 = 512;
const SMALL_LIMIT: u64 = 1 << 20;
const SMALL_SEGMENT: u64 = 2 << 20;
/// Note [Segments of their own]: from here up a request gets a segment of its own.
const MEDIUM_LIMIT: u64 = 2 << 20;
const MEDIUM_SEGMENT: u64 = 20 << 20;
const LARGE_ROUND: u64 = 2 << 20;
/// The largest request the pool serves: past it (more than any device holds, 256 TiB), and
/// for sizes whose rounding would wrap (a negative size cast to size_t), the request goes to the
/// driver as it is, which answers out of memory; never a block of ours.
pub const MAX_POOLED_BYTES: u64 = 1 << 48;
/// Free blocks above this are never split (Note in mod.rs) ...
const MAX_SPLIT: u64 = 256 << 20;
/// ... and serve a request only if they waste at most this.
const HUGE_WASTE: u64 = 20 << 20;
const BINS: usize = 64;
const BLOCK_CAPACITY: u32 = 1 << 20;
const MAP_CAPACITY: usize = 1 << 21;
const SEGMENT_CAPACITY: usize = 1 << 16;

#[derive(Clone, Copy, Debug)]
struct Block {
    addr: u64,
    size: u64,
    seg_prev: u32,
    seg_next: u32,
    bin_prev: u32,
    bin_next: u32,
    allocated: bool,
    small: bool,
    tag: u64,
    /// A live block's birth; a free block's "free since" (Note [Idle segments]).
    born_ns: u64,
    /// Its holder word while live (Note [Holders]).
    holder: u64,
    /// An IPC handle names this block (Note [IPC]): its free leaves it dead, never reused.
    exported: bool,
    /// Freed after an export (Note [IPC]): out of every list until its segment goes back.
    dead: bool,
    /// The IPC registry entry its handle names (Note [IPC]); NONE: the driver's own handle.
    ipc_entry: u32,
    /// Note [Buffer ids]: this pool's number for the block's current life.
    buffer_id: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alloc {
    Hit { addr: u64, size: u64 },
    /// Fitting blocks exist but need a device sync first (Note [Safe reuse]).
    NeedSync,
    /// Map a segment of this many bytes, `add_segment` it, and ask again (expandable: reserve a
    /// range of at least this many bytes and `add_range` it).
    NeedSegment { len: u64, small: bool },
    /// Expandable: the block at `addr` is the caller's, but a chunk it touches is not mapped yet
    /// (Note [Expandable segments]): map `unmapped_chunks`, then it is a hit.
    NeedMap { addr: u64, size: u64 },
    /// Tables full: serve this request straight from the runtime, untracked.
    Untracked,
}

/// What a free did with a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freed {
    pub size: u64,
    /// The block's holder word (Note [Holders]).
    pub holder: u64,
    /// A segment that left the pool (Note [IPC]): the caller gives it back to the runtime.
    pub release: Option<(u64, u64)>,
    /// The IPC registry entry the block's handle named (Note [IPC]): withdrawn by the caller.
    pub ipc_entry: Option<u32>,
    /// The free left its whole segment free: it may go back to the driver once idle (Note
    /// [Idle segments]).
    pub segment_idle: bool,
    /// When (the caller's `now_ns`).
    pub freed_ns: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub requests: u64,
    pub hits: u64,
    pub segments_mapped: u64,
    pub segments_released: u64,
    pub syncs: u64,
    pub oom_retries: u64,
    pub oom_failures: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    /// Device resets and context destroys that emptied this pool (Note [Context lifetime]).
    pub resets: u64,
    /// Whole-segment blocks an IPC handle was made for.
    pub ipc_exports: u64,
    /// Segments given back to the driver because they stayed idle (Note [Idle segments]).
    pub idle_released_segments: u64,
    pub idle_released_bytes: u64,
    /// Of them, those given back early because the device's free memory was low.
    pub pressure_released_segments: u64,
    pub pressure_released_bytes: u64,
    /// Of them, those given back because a neighbour on the GPU asked (Note [Neighbours]).
    pub neighbour_released_segments: u64,
    pub neighbour_released_bytes: u64,
}

pub struct DevicePool {
    strategy: Strategy,
    limit_bytes: u64,
    blocks: Slab<Block>,
    live: AddrMap,
    /// Segment base -> its first block (which no merge ever removes).
    segments: AddrMap,
    /// The lowest segment base and the highest segment end seen since the last `forget_all`: no
    /// address outside can be ours (a filter that spares a driver query for most foreign frees).
    span: (u64, u64),
    /// The last buffer id handed out (Note [Buffer ids]); never reset.
    last_buffer_id: u64,
    generation: u64,
    /// The context the segments live in; 0 until the first one (Note [Context lifetime]).
    owner: u64,
    bins: [[u32; BINS]; 2],
    pending_free_bytes: u64,
    other_tag_free_bytes: u64,
    pub stats: PoolStats,
    ready: bool,
    /// A segment was just added for the request being served: its next allocation is a miss.
    serving_miss: bool,
    /// Note [IPC]: blocks freed after an export, and their bytes (still reserved).
    dead_blocks: u64,
    dead_bytes: u64,
    /// Tests: how many times a block was looked up by its address (a free finds it once).
    #[cfg(test)]
    pub lookups: core::sync::atomic::AtomicU64,
    /// Note [Expandable segments] (chunks.rs): the chunk size; 0 in classic mode.
    chunk_bytes: u64,
    chunks: Slab<chunks::Chunk>,
    ranges: [chunks::Range; chunks::MAX_RANGES],
    range_count: usize,
    /// Mapped chunks no live block touches, and their list (oldest first).
    idle_chunks: u64,
    idle_head: u32,
    idle_tail: u32,
}

fn bin_of(size: u64) -> usize {
    (63 - size.max(1).leading_zeros()) as usize
}

/// Binned strategy's classes: four per power of two, so at most 25% is wasted.
fn class_of(size: u64) -> u64 {
    let size = size.max(ROUND);
    let step = (1u64 << bin_of(size)) >> 2;
    size.div_ceil(step.max(ROUND)) * step.max(ROUND)
}

impl DevicePool {
    pub const fn new() -> Self {
        DevicePool {
            strategy: Strategy::Split,
            limit_bytes: u64::MAX,
            blocks: Slab::empty(),
            live: AddrMap::empty(),
            segments: AddrMap::empty(),
            span: (u64::MAX, 0),
            last_buffer_id: 0,
            generation: 0,
            owner: 0,
            bins: [[NONE; BINS]; 2],
            pending_free_bytes: 0,
            other_tag_free_bytes: 0,
            stats: PoolStats {
                requests: 0,
                hits: 0,
                segments_mapped: 0,
                segments_released: 0,
                syncs: 0,
                oom_retries: 0,
                oom_failures: 0,
                reserved_bytes: 0,
                peak_reserved_bytes: 0,
                live_bytes: 0,
                peak_live_bytes: 0,
                resets: 0,
                ipc_exports: 0,
                idle_released_segments: 0,
                idle_released_bytes: 0,
                pressure_released_segments: 0,
                pressure_released_bytes: 0,
                neighbour_released_segments: 0,
                neighbour_released_bytes: 0,
            },
            ready: false,
            serving_miss: false,
            dead_blocks: 0,
            dead_bytes: 0,
            #[cfg(test)]
            lookups: core::sync::atomic::AtomicU64::new(0),
            chunk_bytes: 0,
            chunks: Slab::empty(),
            ranges: [chunks::Range { base: 0, len: 0, first_chunk: 0 }; chunks::MAX_RANGES],
            range_count: 0,
            idle_chunks: 0,
            idle_head: NONE,
            idle_tail: NONE,
        }
    }

    /// Maps the tables; false when the system refuses (the caller passes requests through).
    pub fn init(&mut self, strategy: Strategy, limit_bytes: u64, source: TableSource) -> bool {
        if !self.ready {
            self.strategy = strategy;
            self.limit_bytes = limit_bytes;
            self.ready = self.blocks.init(BLOCK_CAPACITY, source)
                && self.live.init(MAP_CAPACITY, source)
                && self.segments.init(SEGMENT_CAPACITY, source);
        }
        self.ready
    }

    /// `init` in expandable mode (Note [Expandable segments]): segments are reserved ranges backed
    /// by chunks of `chunk_bytes`, the driver's granularity.
    pub fn init_expandable(&mut self, chunk_bytes: u64, limit_bytes: u64, source: TableSource) -> bool {
        if !self.ready && chunk_bytes.is_power_of_two() && self.chunks.init(chunks::CHUNK_CAPACITY, source) {
            self.chunk_bytes = chunk_bytes;
        }
        self.expandable() && self.init(Strategy::Split, limit_bytes, source)
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Whether the pool holds device memory: the only pool whose device a release enters. A
    /// forgotten pool's context may be gone, and entering the device would make it again (Note
    /// [Context lifetime]).
    pub fn holds_memory(&self) -> bool {
        self.ready && self.stats.reserved_bytes > 0
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Bytes reserved from the device but not handed out: memory cudaMemGetInfo reports as free.
    pub fn cached_bytes(&self) -> u64 {
        self.stats.reserved_bytes - self.stats.live_bytes
    }

    /// The size actually reserved for a request; None past MAX_POOLED_BYTES.
    fn rounded(&self, size: u64) -> Option<u64> {
        if size > MAX_POOLED_BYTES {
            return None;
        }
        Some(match self.strategy {
            Strategy::Binned => class_of(size),
            Strategy::Split => size.max(1).div_ceil(ROUND) * ROUND,
        })
    }

    fn segment_for(&self, need: u64) -> (u64, bool) {
        if self.expandable() {
            return (need.div_ceil(self.chunk_bytes) * self.chunk_bytes, need < SMALL_LIMIT);
        }
        match self.strategy {
            Strategy::Binned => (need, false),
            Strategy::Split if need < SMALL_LIMIT => (SMALL_SEGMENT, true),
            Strategy::Split if need < MEDIUM_LIMIT => (MEDIUM_SEGMENT, false),
            Strategy::Split => (need.div_ceil(LARGE_ROUND) * LARGE_ROUND, false),
        }
    }

    /// Would a new segment of `len` bytes stay under the cap?
    pub fn fits_cap(&self, len: u64) -> bool {
        self.stats.reserved_bytes.saturating_add(len) <= self.limit_bytes
    }

    pub fn alloc(&mut self, size: u64, tag: u64, birth: Birth) -> Alloc {
        self.alloc_deciding(size, tag, birth, true, false)
    }

    /// `alloc`, where `may_sync` false never answers NeedSync (Note [Graph captures under way]
    /// in device_layer/captures.rs): blocks waiting for a synchronization stay waiting, and the
    /// request takes new memory; `carve_whole`: new memory could not be had, and a whole free
    /// segment much larger than the request may serve it (Note [Whole idle segments]).
    pub fn alloc_deciding(&mut self, size: u64, tag: u64, birth: Birth, may_sync: bool, carve_whole: bool) -> Alloc {
        let Some(need) = self.rounded(size) else { return Alloc::Untracked };
        let small = self.strategy == Strategy::Split && need < SMALL_LIMIT;
        let after_sync = match (may_sync, tag == SYNCED) {
            (false, _) => 0,
            (true, true) => self.pending_free_bytes + self.other_tag_free_bytes,
            (true, false) => self.pending_free_bytes,
        };
        if let Some(index) = self.find_fit(need, small, tag, carve_whole) {
            // Expandable: a block that needs new memory waits for a sync when blocks waiting
            // for one would do (Note [Safe reuse]: a deferred loop never grows memory).
            if self.expandable() && after_sync >= need && self.has_unmapped(self.blocks.get(index).addr, need) {
                return Alloc::NeedSync;
            }
            // A request is counted when the pool answers it (a block, or untracked), not at
            // each step the caller takes before (a sync, a new segment).
            self.stats.requests += 1;
            // The block's own size: what its free will count, so what the allocation counts
            // (holders, chunks).
            if let Some((addr, size)) = self.take(index, need, birth) {
                let serving_miss = core::mem::take(&mut self.serving_miss);
                if self.expandable() && self.touch(addr, size) {
                    return Alloc::NeedMap { addr, size };
                }
                if !serving_miss {
                    self.stats.hits += 1;
                }
                return Alloc::Hit { addr, size };
            }
            return Alloc::Untracked;
        }
        if after_sync >= need {
            return Alloc::NeedSync;
        }
        let (len, small) = self.segment_for(need);
        Alloc::NeedSegment { len, small }
    }

    /// Whether a whole free segment much larger than `size` would serve it, carved (Note [Whole
    /// idle segments]): what the caller may fall back on when new memory cannot be had.
    pub fn whole_segment_fits(&self, size: u64, tag: u64) -> bool {
        let Some(need) = self.rounded(size) else { return false };
        let small = self.strategy == Strategy::Split && need < SMALL_LIMIT;
        self.find_fit(need, small, tag, true).is_some_and(|i| self.keeps_whole(self.blocks.get(i), need))
    }

    /// The context this pool's segments live in; 0 before the first.
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// Whether a request made in context `ctx` may take a block here (Note [Context lifetime]).
    /// No context yet (0) on either side: the runtime binds one at the segment's allocation.
    pub fn serves(&self, ctx: u64) -> bool {
        self.owner == 0 || self.owner == ctx
    }

    /// Binds the pool to `ctx`, the context a new segment was allocated in; false when it
    /// belongs to another (the caller gives the segment back).
    pub fn bind(&mut self, ctx: u64) -> bool {
        if self.owner == 0 {
            self.owner = ctx;
        }
        self.owner == ctx
    }

    /// Records a segment the caller mapped after `NeedSegment`.
    pub fn add_segment(&mut self, addr: u64, len: u64, small: bool) -> bool {
        let block = Block { addr, size: len, seg_prev: NONE, seg_next: NONE, bin_prev: NONE, bin_next: NONE, allocated: false, small, tag: SYNCED, born_ns: 0, holder: 0, exported: false, dead: false, ipc_entry: NONE, buffer_id: 0 };
        let Some(i) = self.blocks.insert(block) else { return false };
        if !self.segments.insert(addr, i) {
            self.blocks.remove(i);
            return false;
        }
        self.link(i);
        self.span = (self.span.0.min(addr), self.span.1.max(addr.saturating_add(len)));
        self.serving_miss = true;
        self.stats.segments_mapped += 1;
        self.stats.reserved_bytes += len;
        self.stats.peak_reserved_bytes = self.stats.peak_reserved_bytes.max(self.stats.reserved_bytes);
        true
    }

    /// Takes a block back at `now_ns`; `None` when `addr` is not a live block of this pool.
    pub fn free(&mut self, addr: u64, tag: u64, now_ns: u64) -> Option<Freed> {
        self.looked_up();
        let i = self.live.remove(addr)?;
        if self.blocks.get(i).exported {
            return Some(self.retire_exported(i, now_ns));
        }
        let b = {
            let r = self.blocks.get_mut(i);
            r.allocated = false;
            r.tag = tag;
            *r
        };
        self.stats.live_bytes -= b.size;
        let chunk_idle = self.expandable() && self.untouch(b.addr, b.size, now_ns);
        let merged = self.merge_neighbours(i);
        self.link(merged);
        let m = self.blocks.get_mut(merged);
        m.born_ns = now_ns;
        let segment_idle = chunk_idle || (m.seg_prev == NONE && m.seg_next == NONE && self.chunk_bytes == 0);
        // Note [IPC]: the last live block of a segment that holds dead ones takes it back.
        let release = if self.dead_blocks > 0 && !self.expandable() { self.release_if_dead(merged) } else { None };
        let segment_idle = segment_idle && release.is_none();
        Some(Freed { size: b.size, holder: b.holder, release, segment_idle, freed_ns: now_ns, ipc_entry: None })
    }

    /// Bumped by every `forget_all`.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Note [Context lifetime]: the runtime freed every segment; forget them all, cached and
    /// live, without handing any back. Live blocks become foreign pointers.
    pub fn forget_all(&mut self) {
        self.live.clear();
        self.segments.clear();
        self.blocks.clear();
        self.span = (u64::MAX, 0);
        self.bins = [[NONE; BINS]; 2];
        self.pending_free_bytes = 0;
        self.other_tag_free_bytes = 0;
        self.serving_miss = false;
        self.dead_blocks = 0;
        self.dead_bytes = 0;
        self.chunks.clear();
        self.range_count = 0;
        self.idle_chunks = 0;
        self.idle_head = NONE;
        self.idle_tail = NONE;
        self.stats.reserved_bytes = 0;
        self.stats.live_bytes = 0;
        self.stats.resets += 1;
        self.generation += 1;
        self.owner = 0;
    }

    /// Calls `f(addr, size, born_ns)` for every live block (the leak report).
    pub fn for_each_live(&self, mut f: impl FnMut(u64, u64, Birth)) {
        self.live.for_each(|addr, index| {
            let b = self.blocks.get(index);
            f(addr, b.size, Birth { ns: b.born_ns, holder: b.holder });
        });
    }
}

impl Default for DevicePool {
    fn default() -> Self {
        Self::new()
    }
}

mod blocks;
pub mod cap;

mod pointers;
pub use pointers::BlockView;

mod release;
pub use release::{IdleRelease, Release};

pub mod chunks;

mod exports;

pub mod walk;

#[cfg(test)]
mod invariants;

#[cfg(test)]
mod tests;
