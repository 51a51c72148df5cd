//! The device layer's glue: one pool per device and the pinned cache, driven over a
//! `DeviceRuntime`. Every runtime call happens with no lock held; pool decisions happen under a
//! per-device spin lock. Outcomes that the program sees follow the runtime's: its error codes,
//! a pointer we never handed out goes to the runtime unchanged, and one inside our memory that
//! is no live block is refused as the runtime refuses a stranger's. Each pool belongs to the
//! context its segments live in (Note [Context lifetime] in device/pool/mod.rs): a request made under
//! another context passes through, and a reset, destroy or last release of that context empties
//! the pool.

use super::pinned::cache::PinnedCache;
use super::pool::chunks::{Unmap, MAX_RANGES};
use super::pool::{stream_tag, Alloc, BlockView, DevicePool, Release, Strategy, PENDING, SYNCED};
use crate::backing::{DeviceError, DeviceRuntime, PrimaryContext, CUDA_ERROR_INVALID_VALUE};
use crate::config::{Config, CudaPool, CudaSegments, CudaSync, DeviceLimit};
use crate::backing::TableSource;
use crate::record::stats::{timed, DeviceStats};
use crate::record;
use crate::record::holders::{device_place, Birth};
use crate::sys::lock::Lock;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering::{AcqRel, Acquire, Relaxed}};

pub use crate::backing::MAX_DEVICES;
/// How soon the background thread looks again at an idle segment that waits for a
/// synchronization (Note [Idle segments]).
const PENDING_RECHECK_NS: u64 = 100_000_000;
/// Under pressure, a segment idle this long goes back (Note [Idle segments]).
const PRESSURE_IDLE_NS: u64 = 1_000_000_000;
/// While idle segments are held and the pressure path is on, the driver's free memory is asked
/// about this often.
const PRESSURE_CHECK_NS: u64 = 1_000_000_000;

/// Bounds the alloc loop: hit, sync, segment, release-and-retry, ask-and-retry, and a little slack.
const MAX_STEPS: usize = 8;
/// Idle segments taken out of a pool per lock.
const IDLE_BATCH: usize = 16;

/// One step of the alloc loop: the pool's decision, with what a new segment's step needs to know
/// from the same lock (whether it fits the cap; the generation a reset would change).
struct Step {
    decision: Alloc,
    fits_cap: bool,
    /// A new segment would fit the cap were the cache given back (else giving it back is no use).
    could_fit_cap: bool,
    generation: u64,
    /// Note [Expandable segments]: the pool's chunk size, 0 for classic segments. A new segment
    /// is then a reserved range, a whole number of chunks (its memory comes chunk by chunk, and
    /// the cap applies to the chunks).
    chunk_bytes: u64,
}

impl Step {
    fn decide(p: &mut DevicePool, ctx: u64, size: usize, tag: u64, birth: Birth) -> Step {
        let decision = if p.serves(ctx) { p.alloc(size as u64, tag, birth) } else { Alloc::Untracked };
        let chunk_bytes = p.chunk_bytes();
        let (fits_cap, could_fit_cap) = match decision {
            Alloc::NeedSegment { len, .. } if chunk_bytes == 0 => (p.fits_cap(len), len <= p.limit_bytes()),
            _ => (true, true),
        };
        Step { decision, fits_cap, could_fit_cap, generation: p.generation(), chunk_bytes }
    }
}

pub struct DeviceLayer<R: DeviceRuntime> {
    pub(super) runtime: R,
    pub(super) table_source: TableSource,
    /// Nanoseconds on a monotonic clock (sys::clock, or a test's).
    pub(super) clock: fn() -> u64,
    pub(super) pools: [Lock<DevicePool>; MAX_DEVICES],
    pub(super) pinned: Lock<PinnedCache>,
    pub(super) mode: AtomicU8,
    pub(super) sync_on_free: AtomicBool,
    pub(super) limit_bytes: AtomicU64,
    pub(super) limit_percent: AtomicU64,
    pub(super) pinned_limit_bytes: AtomicU64,
    /// A pool or the pinned cache was set up; a forked child then leaves them alone for good
    /// (`inherited`, Note [Forked children]).
    pub(super) used: AtomicBool,
    inherited: AtomicBool,
    /// How long a segment stays idle before it goes back to the driver (Note [Idle segments]);
    /// u64::MAX: never.
    release_after_ns: AtomicU64,
    /// TENSORMALLOC_CUDA_RELEASE_BELOW (Note [Idle segments]); 0: no pressure path.
    release_below_percent: AtomicU64,
    /// Idle releases under way per device, between taking segments out of the pool and freeing
    /// them (Note [Idle segments]): a context's end waits for them.
    releasing: [AtomicU32; MAX_DEVICES],
    /// Told when a segment became idle, with when it is due (the background thread's
    /// `on_block_cached`); a `fn(u64)`, null until set.
    on_idle: AtomicPtr<()>,
    /// Note [Neighbours] (device/neighbours.rs): told when a pool mapped a segment (a `fn(i32)`)
    /// and asked when an allocation fails with our own cache given back (a `fn(i32) -> bool`:
    /// true when a neighbour answered); null until set.
    join_neighbours: AtomicPtr<()>,
    ask_neighbours: AtomicPtr<()>,
    /// TENSORMALLOC_CUDA_SEGMENTS=expandable (Note [Expandable segments] in pool/chunks.rs).
    expandable_wanted: AtomicBool,
    /// Per device: held while chunks are mapped or unmapped (Note [Expandable segments]).
    growing: [Lock<()>; MAX_DEVICES],
    /// Per device: the devices the program enabled peer access for to its memory, a bit each
    /// (their kernels must reach its chunks too).
    peers: [AtomicU64; MAX_DEVICES],
    pub stats: DeviceStats,
}

const MODE_SPLIT: u8 = 0;
const MODE_BINNED: u8 = 1;
const MODE_NONE: u8 = 2;

/// Where a free went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeAnswer {
    Pooled,
    /// Not ours: the caller passes it to the runtime unchanged.
    NotOurs,
    /// Inside our memory but not a live block's start (a double free, a pointer inside a block):
    /// nothing was freed, and the caller answers as the runtime does for a pointer it never
    /// handed out (Note [Unexpected frees]).
    Refused,
}

// Note [Unexpected frees]
// A free of an address in one of our segments that is not a live block's start would, passed to
// the runtime, free the whole segment under the blocks still live in it (or a cached segment the
// pool hands out next). The pool refuses it instead, as the runtime refuses a pointer it never
// handed out: invalid value, nothing freed. A segment base is recognized at once; an address
// inside a segment needs the runtime's allocation range, asked only for addresses within the
// span of some pool's segments. Pinned blocks freed into the cache are refused the same way.

/// What an IPC handle of a pointer would name (Note [IPC] in device/pool/mod.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// Not a pooled pointer: the runtime answers.
    NotOurs,
    /// A block that is its whole segment, now marked so that it never returns to the cache:
    /// the runtime's handle names exactly it.
    Whole,
    /// A block (start, size) sharing its segment: a handle would give the peer other blocks.
    Shared { addr: u64, size: u64 },
    /// A block (start, size) of an expandable segment (Note [Expandable segments]): the driver
    /// gives no legacy IPC handle for such memory.
    Expandable { addr: u64, size: u64 },
}

/// A pointer query about an address (cuMemGetAddressRange, RANGE_START_ADDR/SIZE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Not inside one of our segments: the runtime's answer stands.
    NotOurs,
    /// Inside this live block: (start, size, buffer id: Note [Buffer ids] in device/pool/mod.rs).
    Live(u64, u64, u64),
    /// Inside cached (freed) memory of ours: no allocation there, as after the runtime's free.
    Free,
}

/// Note [Buffer ids]: a pool's number for a block as an id of its own: above any id the runtime
/// gives (it counts its allocations from 1), the device in the bits below.
fn buffer_id(device: usize, number: u64) -> u64 {
    (1 << 63) | ((device as u64) << 56) | (number & ((1 << 56) - 1))
}

impl<R: DeviceRuntime> DeviceLayer<R> {
    pub const fn new(runtime: R, table_source: TableSource, clock: fn() -> u64) -> Self {
        DeviceLayer {
            runtime,
            table_source,
            clock,
            pools: [const { Lock::new(DevicePool::new()) }; MAX_DEVICES],
            pinned: Lock::new(PinnedCache::new()),
            mode: AtomicU8::new(MODE_SPLIT),
            sync_on_free: AtomicBool::new(true),
            limit_bytes: AtomicU64::new(u64::MAX),
            limit_percent: AtomicU64::new(0),
            pinned_limit_bytes: AtomicU64::new(1 << 30),
            used: AtomicBool::new(false),
            inherited: AtomicBool::new(false),
            release_after_ns: AtomicU64::new(u64::MAX),
            release_below_percent: AtomicU64::new(0),
            releasing: [const { AtomicU32::new(0) }; MAX_DEVICES],
            on_idle: AtomicPtr::new(core::ptr::null_mut()),
            join_neighbours: AtomicPtr::new(core::ptr::null_mut()),
            ask_neighbours: AtomicPtr::new(core::ptr::null_mut()),
            expandable_wanted: AtomicBool::new(false),
            growing: [const { Lock::new(()) }; MAX_DEVICES],
            peers: [const { AtomicU64::new(0) }; MAX_DEVICES],
            stats: DeviceStats::new(),
        }
    }

    pub fn configure(&self, c: &Config) {
        let mode = match (c.disabled, c.cuda_pool) {
            (true, _) | (_, CudaPool::None) => MODE_NONE,
            (_, CudaPool::Binned) => MODE_BINNED,
            (_, CudaPool::Split) => MODE_SPLIT,
        };
        self.mode.store(mode, Relaxed);
        self.sync_on_free.store(c.cuda_sync == CudaSync::Free, Relaxed);
        match c.cuda_limit {
            DeviceLimit::Unlimited => self.limit_bytes.store(u64::MAX, Relaxed),
            DeviceLimit::Bytes(n) => self.limit_bytes.store(n, Relaxed),
            DeviceLimit::Percent(p) => self.limit_percent.store(p, Relaxed),
        }
        self.pinned_limit_bytes.store(c.cuda_host_cache_bytes, Relaxed);
        self.release_after_ns.store(c.cuda_release_ms.saturating_mul(1_000_000), Relaxed);
        self.release_below_percent.store(c.cuda_release_below_percent, Relaxed);
        self.expandable_wanted.store(c.cuda_segments == CudaSegments::Expandable, Relaxed);
    }

    /// The cap on what `device`'s pool reserves (u64::MAX: none).
    pub fn cap_bytes(&self, device: usize) -> u64 {
        self.pools().get(device).map_or(u64::MAX, |p| p.lock().limit_bytes())
    }

    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    pub fn enabled(&self) -> bool {
        self.mode.load(Relaxed) != MODE_NONE && self.answers()
    }

    // Note [Forked children]
    // A forked child cannot use its parent's CUDA context: the driver answers 3
    // (NOT_INITIALIZED) to every call there. The pools and the pinned cache describe the parent's
    // memory, and their locks may have been held by parent threads the child does not have. So a
    // child forked after the layer was used never looks at them: the pools are an empty list,
    // every entry point passes through to the driver, which gives its own answer, and the
    // reports list none of the parent's blocks. A child forked before any use (the parent never
    // touched CUDA) is a process of its own and pools as any other.

    /// Whether the layer answers for its memory (false in a forked child, Note [Forked children]).
    pub fn answers(&self) -> bool {
        !self.inherited.load(Relaxed)
    }

    /// In a forked child (the fork handler): the parent's pools are left alone for good when the
    /// layer had been used. True when they were.
    pub fn after_fork_in_child(&self) -> bool {
        let used = self.used.load(Relaxed);
        if used {
            self.inherited.store(true, Relaxed);
        }
        used
    }

    /// The per-device pools; none in a forked child (Note [Forked children]).
    fn pools(&self) -> &[Lock<DevicePool>] {
        if self.answers() {
            &self.pools
        } else {
            &[]
        }
    }

    /// The pool of `device`, set up on first use (the cap in percent needs the device's size,
    /// asked with `device` current). `None`: pass through.
    fn pool(&self, device: i32) -> Option<&Lock<DevicePool>> {
        let mode = self.mode.load(Relaxed);
        if mode == MODE_NONE {
            return None;
        }
        let pool = self.pools().get(usize::try_from(device).ok()?)?;
        if pool.lock().is_ready() {
            return Some(pool);
        }
        let percent = self.limit_percent.load(Relaxed);
        let limit = if percent > 0 {
            let (_, total) = self.runtime.mem_info().ok()?;
            (total as u64 / 100).saturating_mul(percent)
        } else {
            self.limit_bytes.load(Relaxed)
        };
        let strategy = if mode == MODE_BINNED { Strategy::Binned } else { Strategy::Split };
        let wanted = self.expandable_wanted.load(Relaxed);
        if wanted && strategy == Strategy::Binned {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Relaxed) {
                crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: the binned pool (TENSORMALLOC_CUDA_POOL=binned) keeps one classic segment per block; expandable segments serve the split pool");
            }
        }
        let granularity = if wanted && strategy == Strategy::Split { self.expandable_granularity(device) } else { None };
        // Expandable tables the system refuses (an address-space limit): classic segments.
        let ready = match granularity {
            Some(chunk) => pool.lock().init_expandable(chunk, limit, self.table_source) || pool.lock().init(strategy, limit, self.table_source),
            None => pool.lock().init(strategy, limit, self.table_source),
        };
        if ready {
            self.used.store(true, Relaxed);
        }
        ready.then_some(pool)
    }

    /// The chunk size for expandable segments on `device`: the driver's granularity; None, with
    /// one stderr line, when the driver or device has no virtual memory API (classic segments).
    fn expandable_granularity(&self, device: i32) -> Option<u64> {
        let granularity = self.runtime.granularity(device);
        if granularity.is_none() {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Relaxed) {
                crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: the driver has no virtual memory management for device {device}; its pool uses classic segments");
            }
        }
        granularity
    }

    /// cudaMalloc: a block of `size` bytes on the current device, for `holder` (a holder word,
    /// Note [Holders]).
    pub fn malloc(&self, size: usize, holder: u64) -> Result<usize, DeviceError> {
        timed(&self.stats.phases.malloc, || {
            let device = self.runtime.current_device()?;
            self.alloc_on(device, size, SYNCED, holder)
        })
    }

    /// The pluggable allocator's alloc: `device` may differ from the current one.
    pub fn malloc_on_stream(&self, size: usize, device: i32, stream: usize, holder: u64) -> Result<usize, DeviceError> {
        timed(&self.stats.phases.malloc, || self.malloc_on_stream_untimed(size, device, stream, holder))
    }

    fn malloc_on_stream_untimed(&self, size: usize, device: i32, stream: usize, holder: u64) -> Result<usize, DeviceError> {
        self.with_device(device, || self.alloc_on(device, size, stream_tag(stream), holder))
    }

    // Note [One recording point] (record/mod.rs): a block's event is recorded here, with the
    // pool's block size; the pool's own counters change in the pool.

    fn block(device: usize, addr: u64, bytes: u64, holder: u64, tag: u64) -> record::Block {
        record::Block { place: device_place(device), addr, bytes, asked: bytes, holder, stream: tag }
    }

    /// A request of `size` bytes on the current device failed for good (`cap_refused`: the cap
    /// refused it): one event, with the driver's free and total memory asked once.
    pub fn out_of_memory(&self, size: usize, cap_refused: bool) {
        let Ok(device) = self.runtime.current_device() else { return };
        let Some(index) = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES) else { return };
        let mut e = record::OutOfMemory { place: device_place(index), request_bytes: size as u64, ..Default::default() };
        if let Ok((free, total)) = self.runtime.mem_info() {
            if size > total && !cap_refused {
                return; // more than the device holds: a probe, not a shortage (as on the host)
            }
            (e.free_bytes, e.total_bytes) = (free as u64, total as u64);
            e.available_bytes = self.available(index, free, total) as u64;
        }
        e.cap_bytes = cap_refused.then(|| self.cap_bytes(index));
        record::out_of_memory(&e);
    }

    /// The context `device`'s pool is bound to (Note [Context lifetime]); 0 when none.
    fn context_of(&self, device: i32) -> u64 {
        usize::try_from(device).ok().and_then(|d| self.pools().get(d)).map_or(0, |p| p.lock().owner())
    }

    /// Serves a request from `device`'s pool, which must be the current device.
    fn alloc_on(&self, device: i32, size: usize, tag: u64, holder: u64) -> Result<usize, DeviceError> {
        let Some(pool) = self.pool(device) else { return self.passthrough_malloc(device, size) };
        // Note [Context lifetime]: a block of another context's segment would be unusable here.
        // No context current yet (a thread's first call): the runtime binds one at the segment's
        // allocation, or, when the pool has an owner already, at this request passed through.
        let mut ctx = self.runtime.current_context();
        let mut released = false;
        let mut asked = false;
        let mut mapped = false;
        // The pool's answer taken under the lock that added a segment, for the next step.
        let mut carried: Option<Step> = None;
        for _ in 0..MAX_STEPS {
            let step = match carried.take() {
                Some(step) => step,
                None => {
                    let birth = Birth { ns: (self.clock)(), holder };
                    Step::decide(&mut pool.lock(), ctx, size, tag, birth)
                }
            };
            match step.decision {
                Alloc::Hit { addr, size } => {
                    let found = if mapped { record::Found::Miss } else { record::Found::Hit };
                    record::alloc(Self::block(device as usize, addr, size, holder, tag), found);
                    return Ok(addr as usize);
                }
                Alloc::Untracked => return self.passthrough_malloc(device, size),
                Alloc::NeedSync => {
                    self.synchronize()?;
                    pool.lock().mark_all_synced();
                }
                Alloc::NeedMap { addr, size } => {
                    self.map_block(device, pool, addr, size)?;
                    self.join_neighbours(device);
                    record::alloc(Self::block(device as usize, addr, size, holder, tag), record::Found::Miss);
                    return Ok(addr as usize);
                }
                Alloc::NeedSegment { len, small } if step.chunk_bytes != 0 => {
                    // Note [Expandable segments]: address space only; chunks come with the blocks.
                    let len = self.range_len(len, small, step.chunk_bytes);
                    let Ok(addr) = self.runtime.reserve(len) else {
                        self.runtime.clear_last_error();
                        return self.passthrough_malloc(device, size);
                    };
                    if ctx == 0 {
                        ctx = self.runtime.current_context();
                    }
                    let birth = Birth { ns: (self.clock)(), holder };
                    let mut p = pool.lock();
                    // A reservation the pool cannot take stays reserved, unused: address space.
                    if p.generation() != step.generation || !p.bind(ctx) || !p.add_range(addr, len, small) {
                        drop(p);
                        return self.passthrough_malloc(device, size);
                    }
                    carried = Some(Step::decide(&mut p, ctx, size, tag, birth));
                }
                Alloc::NeedSegment { len, small } => {
                    if !step.fits_cap {
                        if released || !step.could_fit_cap {
                            pool.lock().stats.oom_failures += 1;
                            return Err(DeviceError::CapReached);
                        }
                        self.release_cached(device as usize, pool, u64::MAX)?;
                        released = true;
                        continue;
                    }
                    match self.runtime_malloc(len as usize) {
                        Ok(addr) => {
                            mapped = true;
                            // The runtime may have made a context current for this very call.
                            if ctx == 0 {
                                ctx = self.runtime.current_context();
                            }
                            let birth = Birth { ns: (self.clock)(), holder };
                            let added = {
                                let mut p = pool.lock();
                                // A reset meanwhile freed this segment with its context: drop it.
                                // Another context bound the pool meanwhile: give it back.
                                if p.generation() != step.generation {
                                    true
                                } else if p.bind(ctx) && p.add_segment(addr as u64, len, small) {
                                    carried = Some(Step::decide(&mut p, ctx, size, tag, birth));
                                    true
                                } else {
                                    false
                                }
                            };
                            if !added {
                                self.runtime_free(addr)?;
                                return self.passthrough_malloc(device, size);
                            }
                            record::segment(device_place(device as usize), addr as u64, len, true);
                            self.join_neighbours(device);
                        }
                        Err(DeviceError::OutOfMemory) if !released && self.could_hold(len as usize) => {
                            // The failed call left an error for cudaGetLastError; we recover.
                            self.runtime.clear_last_error();
                            pool.lock().stats.oom_retries += 1;
                            self.release_cached(device as usize, pool, u64::MAX)?;
                            released = true;
                        }
                        Err(DeviceError::OutOfMemory) if !asked && self.could_hold(len as usize) && self.ask_neighbours(device) => {
                            self.runtime.clear_last_error();
                            pool.lock().stats.oom_retries += 1;
                            asked = true;
                        }
                        Err(e) => {
                            if e == DeviceError::OutOfMemory {
                                pool.lock().stats.oom_failures += 1;
                            }
                            return Err(e);
                        }
                    }
                }
            }
        }
        Err(DeviceError::OutOfMemory)
    }

    /// How much address space to reserve for a range that must hold `need` bytes (Note
    /// [Expandable segments]): twice the device's memory for large blocks, a quarter of it for
    /// small ones (address space is cheap, and a range never moves), at least `need`, a whole
    /// number of the pool's chunks.
    fn range_len(&self, need: u64, small: bool, chunk: u64) -> u64 {
        let total = self.runtime.mem_info().map_or(1 << 30, |(_, total)| total as u64).max(1 << 30);
        // At most 512 GiB a range (the chunk table tracks 2 TiB per pool): more ranges come as needed.
        let wanted = if small { total / 4 } else { total.saturating_mul(2) }.min(1 << 39);
        wanted.max(need).div_ceil(chunk).saturating_mul(chunk)
    }

    /// Maps the chunks live block [addr, addr + size) touches that are not mapped yet (Note
    /// [Expandable segments]), giving idle chunks back and asking the neighbours when the device
    /// is full, as a new classic segment would. On failure the block is freed again.
    fn map_block(&self, device: i32, pool: &Lock<DevicePool>, addr: u64, size: u64) -> Result<(), DeviceError> {
        let d = device as usize;
        let (mut released, mut asked) = (false, false);
        let result = loop {
            match self.map_chunks(d, pool, addr, size) {
                Ok(()) => break Ok(()),
                Err(DeviceError::OutOfMemory) if !released && self.could_hold(size as usize) => {
                    self.runtime.clear_last_error();
                    pool.lock().stats.oom_retries += 1;
                    if let Err(e) = self.release_cached(d, pool, u64::MAX) {
                        break Err(e);
                    }
                    released = true;
                }
                Err(DeviceError::CapReached) if !released => {
                    if let Err(e) = self.release_cached(d, pool, u64::MAX) {
                        break Err(e);
                    }
                    released = true;
                }
                Err(DeviceError::OutOfMemory) if !asked && self.could_hold(size as usize) && self.ask_neighbours(device) => {
                    self.runtime.clear_last_error();
                    asked = true;
                }
                Err(e) => break Err(e),
            }
        };
        if result.is_err() {
            {
                let mut p = pool.lock();
                if matches!(result, Err(DeviceError::OutOfMemory | DeviceError::CapReached)) {
                    p.stats.oom_failures += 1;
                }
                p.free(addr, SYNCED, (self.clock)());
            }
            // The chunks mapped for it are idle now: they go back, for the others on the GPU.
            let _ = self.release_cached(d, pool, u64::MAX);
            self.runtime.clear_last_error();
        }
        result
    }

    /// One pass of `map_block` under the grow lock: maps what is still unmapped.
    fn map_chunks(&self, d: usize, pool: &Lock<DevicePool>, addr: u64, size: u64) -> Result<(), DeviceError> {
        let Some(grow) = self.growing.get(d) else { return Err(DeviceError::Other(CUDA_ERROR_INVALID_VALUE)) };
        let _growing = grow.lock();
        let peers = self.peers.get(d).map_or(0, |p| p.load(Acquire));
        loop {
            let mut todo = [0u64; 32];
            let (n, chunk) = {
                let p = pool.lock();
                (p.unmapped_chunks(addr, size, &mut todo), p.chunk_bytes())
            };
            if n == 0 {
                return Ok(());
            }
            for &va in todo.iter().take(n) {
                // An idle chunk elsewhere is moved here before new memory is made.
                let spare = pool.lock().take_idle_chunk();
                let moved = spare.and_then(|u| {
                    let moved = timed(&self.stats.phases.malloc_runtime, || self.runtime.move_chunk(d as i32, u.addr, va, chunk, u.handle, peers));
                    record::segment(device_place(d), u.addr, chunk, false);
                    if moved.is_err() {
                        pool.lock().stats.segments_released += 1; // the move failed: released
                    }
                    moved.ok().map(|()| u.handle)
                });
                let handle = match moved {
                    Some(handle) => handle,
                    None if !pool.lock().fits_cap(chunk) => return Err(DeviceError::CapReached),
                    None => timed(&self.stats.phases.malloc_runtime, || self.runtime.map_chunk(d as i32, va, chunk, peers))?,
                };
                if !pool.lock().set_mapped(va, handle) {
                    // The range went with a reset meanwhile: this chunk is nobody's.
                    let _ = self.runtime.unmap_chunk(va, chunk, handle);
                    return Err(DeviceError::Other(CUDA_ERROR_INVALID_VALUE));
                }
                record::segment(device_place(d), va, chunk, true);
            }
        }
    }

    /// The program enabled peer access from the current device to the memory of context
    /// `peer_ctx` (cuCtxEnablePeerAccess; cudaDeviceEnablePeerAccess comes through it): as for
    /// cudaMalloc'd memory, its device's blocks must work in the current device's kernels. Chunks
    /// of an expandable pool are made accessible to it, those mapped already and every later one
    /// (Note [Expandable segments]); classic segments need nothing.
    pub fn peer_access_enabled(&self, peer_ctx: u64) {
        let Ok(accessor) = self.runtime.current_device() else { return };
        if self.runtime.enter_context(peer_ctx).is_err() {
            return;
        }
        let owner = self.runtime.current_device();
        self.runtime.leave_device();
        let Ok(owner) = owner else { return };
        let (Some(pool), Some(grow), Some(peers)) = (self.pools().get(owner as usize), self.growing.get(owner as usize), self.peers.get(owner as usize)) else { return };
        if owner == accessor || !(0..64).contains(&accessor) {
            return;
        }
        let _growing = grow.lock();
        peers.fetch_or(1 << accessor, AcqRel);
        let mut from = 0;
        loop {
            let mut runs = [(0u64, 0u64); 64];
            let n = {
                let p = pool.lock();
                if !p.is_ready() || !p.expandable() {
                    return;
                }
                p.mapped_runs_from(from, &mut runs)
            };
            for &(start, end) in runs.iter().take(n) {
                let _ = self.runtime.grant_access(start, end - start, accessor);
                from = end;
            }
            if n < runs.len() {
                return;
            }
        }
    }

    /// Unmaps and releases chunks taken out of `device`'s pool, in the current context.
    fn unmap_chunks(&self, device: usize, chunk: u64, batch: &[Unmap]) -> Result<(), DeviceError> {
        for u in batch {
            timed(&self.stats.phases.free_runtime, || self.runtime.unmap_chunk(u.addr, chunk, u.handle))?;
            record::segment(device_place(device), u.addr, chunk, false);
        }
        Ok(())
    }

    /// A request the pool does not serve (another context, full tables): the runtime's, retried
    /// once after our cache on that device is given back when it is out of memory.
    fn passthrough_malloc(&self, device: i32, size: usize) -> Result<usize, DeviceError> {
        self.stats.passthrough.add(1);
        match self.runtime_malloc(size) {
            Err(DeviceError::OutOfMemory) if self.could_hold(size) && (self.give_back(device) > 0 || self.ask_neighbours(device)) => {
                self.runtime.clear_last_error();
                self.runtime_malloc(size)
            }
            other => other,
        }
    }

    /// Whether the current device could hold `size` bytes at all: a request past its memory
    /// leaves our cache alone (emptying it would lose the cache and gain nothing).
    fn could_hold(&self, size: usize) -> bool {
        self.runtime.mem_info().map_or(true, |(_, total)| size <= total)
    }

    /// Out of memory outside the pool (another context, the runtime's stream-ordered pool):
    /// gives `device`'s cached segments back, in the pool's own context; returns the bytes.
    pub fn give_back(&self, device: i32) -> u64 {
        let Some(pool) = usize::try_from(device).ok().and_then(|d| self.pools().get(d)) else { return 0 };
        {
            let pool = pool.lock();
            if !pool.is_ready() || pool.cached_bytes() == 0 {
                return 0;
            }
        }
        let released = self.with_device(device, || self.release_cached(device as usize, pool, u64::MAX)).unwrap_or(0);
        if released > 0 {
            pool.lock().stats.oom_retries += 1;
        }
        released
    }

    /// `give_back` for the current device.
    pub fn give_back_current(&self) -> u64 {
        self.runtime.current_device().map_or(0, |d| self.give_back(d))
    }

    /// Synchronizes (so every free block is reusable and whole segments can be freed), then
    /// gives fully free segments of the current device back to the runtime.
    fn release_cached(&self, device: usize, pool: &Lock<DevicePool>, max_bytes: u64) -> Result<u64, DeviceError> {
        self.synchronize()?;
        pool.lock().mark_all_synced();
        let mut total = 0;
        if pool.lock().expandable() {
            let Some(grow) = self.growing.get(device) else { return Ok(0) };
            let _growing = grow.lock();
            loop {
                let mut batch = [Unmap::default(); 32];
                let (idle, chunk) = {
                    let mut p = pool.lock();
                    (p.release_idle_chunks(u64::MAX, None, &mut batch), p.chunk_bytes())
                };
                self.unmap_chunks(device, chunk, batch.get(..idle.count).unwrap_or(&[]))?;
                total += idle.count as u64 * chunk;
                if idle.count < batch.len() || total >= max_bytes {
                    return Ok(total);
                }
            }
        }
        loop {
            let mut batch = [(0u64, 0u64); 32];
            let n = pool.lock().release_free_segments(max_bytes.saturating_sub(total), &mut batch);
            for &(addr, len) in batch.iter().take(n) {
                self.runtime_free(addr as usize)?;
                record::segment(device_place(device), addr, len, false);
                total += len;
            }
            if n < batch.len() || total >= max_bytes {
                return Ok(total);
            }
        }
    }

    fn owning_device(&self, addr: usize) -> Option<usize> {
        self.pools().iter().position(|p| {
            let pool = p.lock();
            pool.is_ready() && pool.owns(addr as u64)
        })
    }

    fn runtime_malloc(&self, len: usize) -> Result<usize, DeviceError> {
        timed(&self.stats.phases.malloc_runtime, || self.runtime.malloc(len))
    }

    fn runtime_free(&self, addr: usize) -> Result<(), DeviceError> {
        timed(&self.stats.phases.free_runtime, || self.runtime.free(addr))
    }

    pub(super) fn synchronize(&self) -> Result<(), DeviceError> {
        timed(&self.stats.phases.sync, || self.runtime.synchronize())
    }

    /// cudaFree of a pointer: back into its device's pool, whatever device is current.
    pub fn free(&self, addr: usize) -> Result<FreeAnswer, DeviceError> {
        let Some(device) = self.owning_device(addr) else { return Ok(self.not_live(addr)) };
        timed(&self.stats.phases.free, || self.free_ours(addr, device))
    }

    /// Note [Unexpected frees]: the answer for a free of `addr`, which is no live block of ours.
    fn not_live(&self, addr: usize) -> FreeAnswer {
        if self.in_segment(addr) {
            FreeAnswer::Refused
        } else {
            FreeAnswer::NotOurs
        }
    }

    /// Whether `addr` lies in one of our segments, live or cached.
    fn in_segment(&self, addr: usize) -> bool {
        let mut maybe = false;
        for p in self.pools().iter() {
            let pool = p.lock();
            if pool.is_ready() && pool.may_contain(addr as u64) {
                if pool.has_segment(addr as u64) || pool.range_of(addr as u64).is_some() {
                    return true;
                }
                maybe = true;
            }
        }
        if !maybe {
            return false;
        }
        let Some((base, _)) = self.runtime.allocation_range(addr) else { return false };
        self.pools().iter().any(|p| {
            let pool = p.lock();
            pool.is_ready() && pool.has_segment(base as u64)
        })
    }

    /// Whether `addr` is device or pinned memory of ours, a live block or not (a free of it
    /// must never reach the runtime unchecked).
    pub fn holds(&self, addr: usize) -> bool {
        self.owning_device(addr).is_some() || self.in_segment(addr) || self.answers() && {
            let pinned = self.pinned.lock();
            pinned.owns(addr as u64) || pinned.is_cached(addr as u64)
        }
    }

    fn free_ours(&self, addr: usize, device: usize) -> Result<FreeAnswer, DeviceError> {
        let synced = self.sync_on_free.load(Relaxed);
        if synced {
            // Note [Safe reuse]: the device that ran the block's kernels is the one to wait for.
            self.with_device(device as i32, || self.synchronize())?;
        }
        let pool = self.pools().get(device).ok_or(DeviceError::Other(CUDA_ERROR_INVALID_VALUE))?;
        let freed = {
            let mut pool = pool.lock();
            if synced {
                // The whole device is idle now: blocks freed on streams are reusable too, and
                // the report counts this sync.
                pool.mark_all_synced();
            }
            pool.free(addr as u64, if synced { SYNCED } else { PENDING }, (self.clock)())
        };
        match freed {
            Some(f) => {
                self.after_free(device, addr, f, if synced { SYNCED } else { PENDING })?;
                Ok(FreeAnswer::Pooled)
            }
            // Freed by another thread meanwhile: a double free (Note [Unexpected frees]).
            None => Ok(FreeAnswer::Refused),
        }
    }

    fn after_free(&self, device: usize, addr: usize, f: super::pool::Freed, tag: u64) -> Result<(), DeviceError> {
        record::free(Self::block(device, addr as u64, f.size, f.holder, tag));
        if f.segment_idle {
            self.segment_idle_at(f.freed_ns);
        }
        match f.release {
            // Note [IPC]: an exported segment goes back to the runtime, on its own device.
            Some((base, _)) => self.with_device(device as i32, || self.runtime_free(base as usize)),
            None => Ok(()),
        }
    }

    /// The pluggable allocator's free: reusable at once on the same stream.
    pub fn free_on_stream(&self, addr: usize, device: i32, stream: usize) -> FreeAnswer {
        timed(&self.stats.phases.free, || self.free_on_stream_untimed(addr, usize::try_from(device).ok(), stream))
    }

    /// `device` is a hint (the caller's word, or an owner just looked up): the owning pool is
    /// looked up again when it is absent or wrong.
    fn free_on_stream_untimed(&self, addr: usize, device: Option<usize>, stream: usize) -> FreeAnswer {
        let index = device.filter(|&d| self.pools().get(d).is_some_and(|p| p.lock().owns(addr as u64)));
        let Some(d) = index.or_else(|| self.owning_device(addr)) else { return self.not_live(addr) };
        let now = (self.clock)();
        match self.pools().get(d).and_then(|p| p.lock().free(addr as u64, stream_tag(stream), now)) {
            Some(f) => {
                // An exported segment that cannot be given back stays with the runtime's
                // context until it ends; it is out of our pool either way.
                let _ = self.after_free(d, addr, f, stream_tag(stream));
                FreeAnswer::Pooled
            }
            // Freed by another thread meanwhile.
            None => FreeAnswer::Refused,
        }
    }

    /// cudaFreeAsync / cuMemFreeAsync of a pointer: back into its pool, reusable on `stream`
    /// at once and by anyone else after a device synchronization (Note [Safe reuse]).
    pub fn free_async(&self, addr: usize, stream: usize) -> FreeAnswer {
        let Some(d) = self.owning_device(addr) else { return self.not_live(addr) };
        timed(&self.stats.phases.free, || self.free_on_stream_untimed(addr, Some(d), stream))
    }

    /// The pool and block that contain `addr`, a block start or any address inside one of our
    /// segments (the driver names the segment).
    fn locate(&self, addr: usize) -> Option<(usize, BlockView)> {
        for (d, p) in self.pools().iter().enumerate() {
            let pool = p.lock();
            if let Some(b) = pool.live_block(addr as u64).filter(|_| pool.is_ready()) {
                return Some((d, b));
            }
            // Note [Expandable segments]: the driver would answer a chunk's mapping; the pool
            // knows its ranges.
            if let Some(b) = pool.range_of(addr as u64).and_then(|base| pool.block_at(base, addr as u64)) {
                return Some((d, b));
            }
        }
        let (base, _) = self.runtime.allocation_range(addr)?;
        self.pools().iter().enumerate().find_map(|(d, p)| {
            let pool = p.lock();
            if !pool.is_ready() || !pool.has_segment(base as u64) {
                return None;
            }
            pool.block_at(base as u64, addr as u64).map(|b| (d, b))
        })
    }

    /// cuMemGetAddressRange / RANGE_START_ADDR / RANGE_SIZE / BUFFER_ID: the block, not our
    /// segment.
    pub fn range(&self, addr: usize) -> RangeAnswer {
        match self.locate(addr) {
            None => RangeAnswer::NotOurs,
            Some((d, b)) if b.allocated => RangeAnswer::Live(b.addr, b.size, buffer_id(d, b.buffer_id)),
            Some(_) => RangeAnswer::Free,
        }
    }

    /// The context of the expandable segment `addr` lies in (Note [Expandable segments]); None
    /// outside them.
    pub fn expandable_context(&self, addr: usize) -> Option<u64> {
        self.pools().iter().find_map(|p| {
            let pool = p.lock();
            (pool.is_ready() && pool.range_of(addr as u64).is_some()).then(|| pool.owner())
        })
    }

    /// cudaIpcGetMemHandle / cuIpcGetMemHandle of `addr` (Note [IPC]).
    pub fn export(&self, addr: usize) -> Export {
        let Some((d, b)) = self.locate(addr) else { return Export::NotOurs };
        if self.pools().get(d).is_some_and(|p| p.lock().expandable()) {
            return Export::Expandable { addr: b.addr, size: b.size };
        }
        if b.allocated && b.whole_segment && self.pools().get(d).is_some_and(|p| p.lock().mark_exported(b.addr)) {
            return Export::Whole;
        }
        Export::Shared { addr: b.addr, size: b.size }
    }

    /// Note [Context lifetime]: context `ctx` was (or is about to be) destroyed: every pool
    /// whose segments live in it, and its pinned blocks, are forgotten.
    pub fn forget_context(&self, ctx: u64) {
        for (device, pool) in self.pools().iter().enumerate() {
            if ctx != 0 {
                self.release_all_chunks(device, pool, ctx);
            }
            let mut ranges = [(0u64, 0u64); MAX_RANGES];
            let mut forgotten = 0;
            {
                let mut pool = self.lock_between_releases(device, pool);
                if ctx != 0 && pool.is_ready() && pool.owner() == ctx {
                    forgotten = pool.ranges(&mut ranges);
                    self.forget_blocks(device, &mut pool);
                }
            }
            self.unreserve(ranges.get(..forgotten).unwrap_or(&[]));
        }
        self.forget_pinned(Some(ctx));
    }

    /// `device`'s pool, locked when no idle release of it is under way (Note [Idle segments]):
    /// a context's end must not come between the background thread's check and its frees.
    fn lock_between_releases<'a>(&self, device: usize, pool: &'a Lock<DevicePool>) -> crate::sys::lock::Guard<'a, DevicePool> {
        let Some(releasing) = self.releasing.get(device) else { return pool.lock() };
        loop {
            let guard = pool.lock();
            if releasing.load(Acquire) == 0 {
                return guard;
            }
            drop(guard);
            crate::sys::clock::pause();
        }
    }

    /// Waits until no idle release of `device`'s pool is under way (before a primary context
    /// release the driver may end it with).
    pub fn wait_for_releases(&self, device: i32) {
        if let Some(pool) = usize::try_from(device).ok().and_then(|d| self.pools().get(d).map(|p| (d, p))) {
            drop(self.lock_between_releases(pool.0, pool.1));
        }
    }

    /// Forgets every block of a pool whose context is gone, as the runtime freed them: its live
    /// blocks leave the holders table (Note [Holders]), and the history frees them and unmaps
    /// their segments (the snapshot's timeline must not keep them).
    /// Note [Expandable segments]: a context's end frees its cuMemAlloc'd segments, not our
    /// chunks (the virtual memory API's memory is the device's): before the pool forgets them,
    /// every chunk of `device`'s pool (bound to `ctx`, or any when 0) goes back to the driver,
    /// live ones too (the program's pointers into them die with the context, as cudaMalloc'd ones
    /// do), after the work queued on them finished. Best effort: a context already gone refuses
    /// the synchronization, and the driver answers for what it freed itself.
    fn release_all_chunks(&self, device: usize, pool: &Lock<DevicePool>, ctx: u64) {
        let ours = |p: &DevicePool| p.is_ready() && p.expandable() && (ctx == 0 || p.owner() == ctx);
        if !ours(&pool.lock()) {
            return;
        }
        let Some(grow) = self.growing.get(device) else { return };
        let _growing = grow.lock();
        let _ = self.with_device(device as i32, || self.synchronize());
        loop {
            let mut batch = [Unmap::default(); 32];
            let (n, chunk) = {
                let mut p = pool.lock();
                if !ours(&p) {
                    return;
                }
                (p.take_all_chunks(&mut batch), p.chunk_bytes())
            };
            for u in batch.iter().take(n) {
                let _ = self.runtime.unmap_chunk(u.addr, chunk, u.handle);
                record::segment(device_place(device), u.addr, chunk, false);
            }
            if n < batch.len() {
                return;
            }
        }
    }

    fn forget_blocks(&self, device: usize, pool: &mut DevicePool) {
        pool.for_each_live(|addr, size, birth| record::forgotten(Self::block(device, addr, size, birth.holder, 0)));
        if pool.expandable() {
            let chunk = pool.chunk_bytes();
            pool.for_each_mapped_chunk(|addr, _| record::segment(device_place(device), addr, chunk, false));
        } else {
            pool.for_each_segment(|seg| record::segment(device_place(device), seg.addr, seg.blocks().map(|b| b.size).sum(), false));
        }
        pool.forget_all();
    }

    /// `device`'s primary context as the driver knows it (taken before a release of it).
    pub fn primary_context(&self, device: i32) -> PrimaryContext {
        self.runtime.primary_context(device)
    }

    /// Note [Context lifetime]: `device`'s primary context, `before` a release of it, may have
    /// reached zero references; if it is inactive now, its blocks are forgotten.
    pub fn primary_released(&self, device: i32, before: PrimaryContext) {
        if let PrimaryContext::Active(ctx) = before {
            if self.runtime.primary_context(device) == PrimaryContext::Inactive {
                self.forget_context(ctx);
            }
        }
    }

    /// Note [Context lifetime]: `device`'s primary context is being reset (cudaDeviceReset,
    /// cuDevicePrimaryCtxReset). Its pool is forgotten unless it lives in another context; when
    /// the driver cannot tell, it is forgotten anyway (a lost cache, never a dead block).
    pub fn forget_primary(&self, device: i32) {
        let primary = self.runtime.primary_context(device);
        let owner = self.context_of(device);
        let owned_by_primary = match primary {
            PrimaryContext::Active(p) => owner == 0 || owner == p,
            PrimaryContext::Inactive => owner == 0,
            PrimaryContext::Unknown => true,
        };
        if owned_by_primary {
            if let Ok(d) = usize::try_from(device) {
                self.forget_pool(d);
            }
        }
        self.forget_pinned(match primary {
            PrimaryContext::Active(p) => Some(p),
            _ => None,
        });
    }

    fn forget_pool(&self, device: usize) {
        if let Some(pool) = self.pools().get(device) {
            self.release_all_chunks(device, pool, 0);
            let mut ranges = [(0u64, 0u64); MAX_RANGES];
            let mut forgotten = 0;
            {
                let mut pool = self.lock_between_releases(device, pool);
                if pool.is_ready() {
                    forgotten = pool.ranges(&mut ranges);
                    self.forget_blocks(device, &mut pool);
                }
            }
            self.unreserve(ranges.get(..forgotten).unwrap_or(&[]));
        }
    }

    /// Gives back the address space of ranges a forgotten pool reserved (Note [Expandable
    /// segments]); best effort: a chunk mapped meanwhile keeps its range (the driver refuses).
    fn unreserve(&self, ranges: &[(u64, u64)]) {
        for &(base, len) in ranges {
            let _ = self.runtime.unreserve(base, len);
        }
    }

    /// Runs `f` with `device` current (its pool's context, or its primary one), restoring what
    /// was current after.
    fn with_device<T>(&self, device: i32, f: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
        let owner = self.context_of(device);
        let current = self.runtime.current_device().ok();
        if current == Some(device) && (owner == 0 || self.runtime.current_context() == owner) {
            return f();
        }
        self.runtime.enter_device(device, owner)?;
        let out = f();
        self.runtime.leave_device();
        out
    }

    /// cudaMemGetInfo with our cached bytes counted as free (and the cap applied).
    pub fn mem_info(&self) -> Result<(usize, usize), DeviceError> {
        let (free, total) = self.runtime.mem_info()?;
        let device = self.runtime.current_device()?;
        let Ok(index) = usize::try_from(device) else { return Ok((free, total)) };
        Ok((self.available(index, free, total), total))
    }

    /// What `device` has for the program when the driver says `free` of `total` are free: the
    /// segments we would give back for a request count as free (not the free parts of partly
    /// used ones, which no large request could get), and the cap applies. A request of that
    /// many bytes succeeds: the cache given back, the driver serves it.
    fn available(&self, device: usize, free: usize, total: usize) -> usize {
        let Some(pool) = self.pools().get(device) else { return free };
        let pool = pool.lock();
        if !pool.is_ready() {
            return free;
        }
        let mut free = free as u64 + pool.releasable_bytes();
        if pool.limit_bytes() != u64::MAX {
            free = free.min(pool.limit_bytes().saturating_sub(pool.stats.live_bytes));
        }
        free.min(total as u64) as usize
    }

    /// Gives `device`'s cached blocks back to the driver (a framework emptied its cache: the
    /// memory must reach the driver, for other processes); returns the bytes released.
    pub fn trim_device(&self, device: usize) -> u64 {
        let Some(pool) = self.pools().get(device) else { return 0 };
        if !pool.lock().is_ready() {
            return 0;
        }
        self.with_device(device as i32, || self.release_cached(device, pool, u64::MAX)).unwrap_or(0)
    }

    /// Gives every cached device block and pinned block back; returns the bytes released.
    pub fn trim(&self) -> u64 {
        let mut total = 0;
        for (device, pool) in self.pools().iter().enumerate() {
            if pool.lock().is_ready() {
                total += self.with_device(device as i32, || self.release_cached(device, pool, u64::MAX)).unwrap_or(0);
            }
        }
        if !self.answers() {
            return total;
        }
        let mut out = [(0u64, 0u64); 64];
        let n = self.pinned.lock().drain(&mut out);
        for &(addr, len) in out.iter().take(n) {
            if self.runtime.host_free(addr as usize).is_ok() {
                total += len;
            }
        }
        total
    }

    /// The background thread's hook: told when a segment becomes idle, with when it is due.
    pub fn set_background(&self, on_idle: fn(u64)) {
        self.on_idle.store(on_idle as *mut (), Relaxed);
    }

    /// Sets the neighbour hooks (Note [Neighbours] in device/neighbours.rs).
    pub fn set_neighbours(&self, join: fn(i32), ask: fn(i32) -> bool) {
        self.join_neighbours.store(join as *mut (), Relaxed);
        self.ask_neighbours.store(ask as *mut (), Relaxed);
    }

    fn join_neighbours(&self, device: i32) {
        let hook = self.join_neighbours.load(Relaxed);
        if !hook.is_null() {
            // SAFETY: only set_neighbours stores here, a `fn(i32)`.
            unsafe { core::mem::transmute::<*mut (), fn(i32)>(hook)(device) };
        }
    }

    /// Asks the other processes on `device`'s GPU for their idle memory; true when one answered.
    fn ask_neighbours(&self, device: i32) -> bool {
        let hook = self.ask_neighbours.load(Relaxed);
        // SAFETY: only set_neighbours stores here, a `fn(i32) -> bool`.
        !hook.is_null() && unsafe { core::mem::transmute::<*mut (), fn(i32) -> bool>(hook)(device) }
    }

    /// A segment became idle at `now_ns` (Note [Idle segments]): the background thread is told
    /// when it is due.
    fn segment_idle_at(&self, now_ns: u64) {
        let after = self.release_after_ns.load(Relaxed);
        let hook = self.on_idle.load(Relaxed);
        if after != u64::MAX && !hook.is_null() {
            // SAFETY: only set_background stores here, a `fn(u64)`.
            unsafe { core::mem::transmute::<*mut (), fn(u64)>(hook)(now_ns.saturating_add(after)) };
        }
    }

    /// The background thread's pass (Note [Idle segments]): every segment idle for the release
    /// delay goes back to the driver, in its pool's context. Returns when the next one is due.
    pub fn release_idle(&self) -> Option<u64> {
        let after = self.release_after_ns.load(Relaxed);
        if after == u64::MAX {
            return None;
        }
        let mut due = None::<u64>;
        let below = self.release_below_percent.load(Relaxed);
        for (device, pool) in self.pools().iter().enumerate() {
            let Some(releasing) = self.releasing.get(device) else { continue };
            // Note [Idle segments]: short of memory, a segment idle for PRESSURE_IDLE_NS goes.
            // The driver is asked only while idle segments are held (below, once per pass).
            let mut why = Release::Time;
            let mut after = after;
            loop {
                let now = (self.clock)();
                let Some((idle, freed)) = self.release_idle_batch(device, pool, releasing, now.saturating_sub(after), why) else { break };
                // A segment waiting for a synchronization is looked at again a delay later (at
                // least PENDING_RECHECK_NS: a zero delay must not make the thread spin on it).
                let recheck = now.saturating_add(after.max(PENDING_RECHECK_NS));
                // Idle segments left are looked at again within PRESSURE_CHECK_NS when the pressure
                // path is on: the device may run short meanwhile (another process allocating).
                let idle_left = idle.count < IDLE_BATCH && idle.oldest_left_ns.is_some();
                if freed.is_ok() && why == Release::Time && below > 0 && idle_left && self.short_of_memory(device, pool, releasing, below) {
                    why = Release::Pressure;
                    after = after.min(PRESSURE_IDLE_NS);
                    continue;
                }
                let pressure_check = (below > 0 && idle.oldest_left_ns.is_some()).then(|| now.saturating_add(PRESSURE_CHECK_NS));
                let next = idle.oldest_left_ns.map(|t| t.saturating_add(after)).into_iter().chain(idle.pending_left.then_some(recheck)).chain(pressure_check);
                for t in next {
                    due = Some(due.map_or(t, |d| d.min(t)));
                }
                if freed.is_err() || idle.count < IDLE_BATCH {
                    break;
                }
            }
        }
        due
    }

    /// A neighbour on the GPU is short of memory (Note [Neighbours]): every idle segment of
    /// `device` goes back now, whatever its age, as the background thread gives them back.
    /// Returns the bytes.
    pub fn release_for_neighbour(&self, device: i32) -> u64 {
        let Some(device) = usize::try_from(device).ok() else { return 0 };
        let (Some(pool), Some(releasing)) = (self.pools().get(device), self.releasing.get(device)) else { return 0 };
        let before = pool.lock().stats.neighbour_released_bytes;
        while let Some((idle, Ok(()))) = self.release_idle_batch(device, pool, releasing, u64::MAX, Release::Neighbour) {
            if idle.count < IDLE_BATCH {
                break;
            }
        }
        pool.lock().stats.neighbour_released_bytes - before
    }

    /// Takes up to IDLE_BATCH idle segments freed at `cutoff_ns` or before out of `device`'s pool
    /// and frees them in its context, unless a reset or end of that context came meanwhile (then
    /// the driver freed them with it): a context's end through us waits for `releasing` to fall
    /// back (lock_between_releases). None: no pool.
    fn release_idle_batch(&self, device: usize, pool: &Lock<DevicePool>, releasing: &AtomicU32, cutoff_ns: u64, why: Release) -> Option<(super::pool::IdleRelease, Result<(), DeviceError>)> {
        if pool.lock().expandable() {
            return self.release_idle_chunk_batch(device, pool, releasing, cutoff_ns, why);
        }
        let mut batch = [(0u64, 0u64); IDLE_BATCH];
        let (idle, generation) = {
            let mut p = pool.lock();
            if !p.is_ready() {
                return None;
            }
            let idle = p.release_idle_segments(cutoff_ns, why, &mut batch);
            if idle.count > 0 {
                releasing.fetch_add(1, AcqRel);
            }
            (idle, p.generation())
        };
        if idle.count == 0 {
            return Some((idle, Ok(())));
        }
        let freed = self.with_device(device as i32, || {
            if pool.lock().generation() != generation {
                return Ok(());
            }
            for &(addr, len) in batch.iter().take(idle.count) {
                self.runtime_free(addr as usize)?;
                record::segment(device_place(device), addr, len, false);
            }
            Ok(())
        });
        releasing.fetch_sub(1, AcqRel);
        Some((idle, freed))
    }

    /// `release_idle_batch` for expandable segments: idle chunks, under the grow lock.
    fn release_idle_chunk_batch(&self, device: usize, pool: &Lock<DevicePool>, releasing: &AtomicU32, cutoff_ns: u64, why: Release) -> Option<(super::pool::IdleRelease, Result<(), DeviceError>)> {
        let grow = self.growing.get(device)?;
        let _growing = grow.lock();
        let mut batch = [Unmap::default(); IDLE_BATCH];
        let (idle, generation, chunk) = {
            let mut p = pool.lock();
            if !p.is_ready() {
                return None;
            }
            let idle = p.release_idle_chunks(cutoff_ns, Some(why), &mut batch);
            if idle.count > 0 {
                releasing.fetch_add(1, AcqRel);
            }
            (idle, p.generation(), p.chunk_bytes())
        };
        if idle.count == 0 {
            return Some((idle, Ok(())));
        }
        let freed = self.with_device(device as i32, || {
            if pool.lock().generation() != generation {
                return Ok(());
            }
            self.unmap_chunks(device, chunk, batch.get(..idle.count).unwrap_or(&[]))
        });
        releasing.fetch_sub(1, AcqRel);
        Some((idle, freed))
    }

    /// Whether less than `percent` of `device`'s memory is free, as the driver reports it. Asked
    /// in the pool's own context only (never by retaining a primary context the program may be
    /// releasing), under the same guard as the releases (`releasing`, the generation).
    fn short_of_memory(&self, device: usize, pool: &Lock<DevicePool>, releasing: &AtomicU32, percent: u64) -> bool {
        let (owner, generation) = {
            let p = pool.lock();
            (p.owner(), p.generation())
        };
        if owner == 0 {
            return false;
        }
        releasing.fetch_add(1, AcqRel);
        let info = self.with_device(device as i32, || if pool.lock().generation() == generation { self.runtime.mem_info().map(Some) } else { Ok(None) });
        releasing.fetch_sub(1, AcqRel);
        matches!(info, Ok(Some((free, total))) if total > 0 && (free as u64).saturating_mul(100) < (total as u64).saturating_mul(percent))
    }

    /// Per-device figures for the report: (device, stats, cached bytes).
    pub fn for_each_pool(&self, mut f: impl FnMut(usize, &DevicePool)) {
        for (d, p) in self.pools().iter().enumerate() {
            let pool = p.lock();
            if pool.is_ready() {
                f(d, &pool);
            }
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod expandable_tests;
