//! The device layer: one pool per device and the pinned cache, driven over a `DeviceRuntime`.
//! Every runtime call happens with no lock held; pool decisions happen under a per-device spin
//! lock. Outcomes that the program sees follow the runtime's: its error codes, a pointer we never
//! handed out goes to the runtime unchanged, and one inside our memory that is no live block is
//! refused as the runtime refuses a stranger's. Each pool belongs to the context its segments
//! live in (Note [Context lifetime] in device/pool/mod.rs): a request made under another context
//! passes through, and a reset, destroy or last release of that context empties the pool.
//! This file holds the layer's state, its set-up and the hooks it calls; one room per concept
//! beside it: `alloc` (serving a request), `mapping` (expandable chunks and peer access),
//! `contexts` (which context a pool lives in, and its end), `free` (a block back), `pointers`
//! (what an address is: queries, IPC), `sharing` (IPC of expandable blocks: their chunks'
//! descriptors), `give_back` (idle, pressure, neighbours, trim), `captures` (graph captures
//! under way: no driver call of ours meanwhile).

use super::fallback::{self, Fallback};
use super::pinned::cache::PinnedCache;
use super::pool::{DevicePool, Strategy};
use crate::backing::{DeviceError, DeviceRuntime};
use crate::config::{Config, CudaPool, CudaSegments, CudaSync, DeviceLimit};
use crate::backing::TableSource;
use crate::record::stats::{timed, DeviceStats};
use crate::record;
use crate::record::holders::device_place;
use crate::sys::lock::Lock;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering::{Relaxed, SeqCst}};

mod alloc;
mod captures;
mod contexts;
pub use contexts::contexts_ended;
mod free;
mod give_back;
mod mapping;
mod pointers;
mod sharing;

pub use crate::backing::MAX_DEVICES;
pub use free::FreeAnswer;
pub use pointers::{Export, ExpandableBlock, RangeAnswer, SharedBlock};

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
    /// Note [No driver call after exit]: background passes under way (the low bits), and
    /// BACKGROUND_CLOSED once the process began to exit.
    background: AtomicU32,
    /// Graph captures under way in the process (Note [Graph captures under way] in captures.rs).
    captures: AtomicU32,
    /// Driver calls of ours the program's own calls make without asking for them, under way
    /// (captures.rs `unasked`).
    unasked: AtomicU32,
    /// The captures under way with their streams and contexts (captures.rs).
    capture_streams: captures::CaptureStreams,
    /// Told when a segment became idle, with when it is due (the background thread's
    /// `on_block_cached`); a `fn(u64)`, null until set.
    on_idle: AtomicPtr<()>,
    /// Note [Neighbours] (device/neighbours/mod.rs): told when a pool mapped a segment (a `fn(i32)`)
    /// and asked when an allocation fails with our own cache given back (a `fn(i32) -> bool`:
    /// true when a neighbour answered); null until set.
    join_neighbours: AtomicPtr<()>,
    ask_neighbours: AtomicPtr<()>,
    /// TENSORMALLOC_CUDA_SEGMENTS=expandable (Note [Expandable segments] in pool/chunks.rs).
    expandable_wanted: AtomicBool,
    /// Per device: held while chunks are mapped or unmapped (Note [Expandable segments]).
    pub(super) growing: [Lock<()>; MAX_DEVICES],
    /// Per device: the devices the program enabled peer access for to its memory, a bit each
    /// (their kernels must reach its chunks too).
    peers: [AtomicU64; MAX_DEVICES],
    pub stats: DeviceStats,
}

const MODE_SPLIT: u8 = 0;
const MODE_BINNED: u8 = 1;
const MODE_NONE: u8 = 2;

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
            background: AtomicU32::new(0),
            captures: AtomicU32::new(0),
            unasked: AtomicU32::new(0),
            capture_streams: captures::CaptureStreams::new(),
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

    /// The strategy pools are set up with; None with the pool off.
    pub(super) fn strategy(&self) -> Option<Strategy> {
        match self.mode.load(Relaxed) {
            MODE_NONE => None,
            MODE_BINNED => Some(Strategy::Binned),
            _ => Some(Strategy::Split),
        }
    }

    /// The cap a pool set up on a device of `total` bytes gets (u64::MAX: none).
    pub(super) fn cap_for(&self, total: u64) -> u64 {
        match self.limit_percent.load(Relaxed) {
            0 => self.limit_bytes.load(Relaxed),
            percent => (total / 100).saturating_mul(percent),
        }
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
    // touched CUDA) is a process of its own and pools as any other: the locks a parent thread
    // held while it looked at the pools unused are made free (Note [Locks a child inherits] in
    // sys/lock.rs). The layer counts as used from the moment a pool or the pinned cache begins
    // to be set up, so a child forked in the middle of that leaves them alone too.

    /// Whether the layer answers for its memory (false in a forked child, Note [Forked children]).
    pub fn answers(&self) -> bool {
        !self.inherited.load(Relaxed)
    }

    /// In a forked child (the fork handler): the parent's pools are left alone for good when the
    /// layer had been used. True when they were.
    pub fn after_fork_in_child(&self) -> bool {
        // The background threads are not copied by fork: a batch the parent had under way is
        // none of the child's, and its exit must not wait for it (Note [No driver call after exit]).
        if self.background.load(Relaxed) & !give_back::BACKGROUND_CLOSED != 0 {
            self.background.fetch_and(give_back::BACKGROUND_CLOSED, Relaxed);
        }
        // Likewise the parent's other threads' calls and captures (captures.rs).
        self.forget_captures();
        let used = self.used.load(Relaxed);
        if used {
            self.inherited.store(true, Relaxed);
        } else {
            // A parent thread may have held one while it looked at them unused (Note [Locks a
            // child inherits] in sys/lock.rs): nothing was set up, so there is nothing to tear.
            // SAFETY: the child's fork handler, before any thread of the child can hold them.
            unsafe {
                self.pools.iter().for_each(|p| p.free_in_child());
                self.growing.iter().for_each(|g| g.free_in_child());
                self.pinned.free_in_child();
            }
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
    /// asked with `device` current). `None`: pass through (said once, unless the pool is off).
    fn pool(&self, device: i32) -> Option<&Lock<DevicePool>> {
        let mode = self.mode.load(Relaxed);
        if mode == MODE_NONE || !self.answers() {
            return None;
        }
        let Some(pool) = usize::try_from(device).ok().and_then(|d| self.pools.get(d)) else {
            fallback::say(Fallback::DeviceOrdinal { device });
            return None;
        };
        if pool.lock().is_ready() {
            return Some(pool);
        }
        let limit = if self.limit_percent.load(Relaxed) > 0 {
            let Ok((_, total)) = self.runtime.mem_info() else {
                fallback::say(Fallback::PercentCap { device });
                return None;
            };
            self.cap_for(total as u64)
        } else {
            self.limit_bytes.load(Relaxed)
        };
        let strategy = if mode == MODE_BINNED { Strategy::Binned } else { Strategy::Split };
        let wanted = self.expandable_wanted.load(Relaxed);
        if wanted && strategy == Strategy::Binned {
            fallback::say(Fallback::BinnedExpandable);
        }
        let granularity = if wanted && strategy == Strategy::Split { self.expandable_granularity(device) } else { None };
        // Counted as used before it is set up: a child forked meanwhile must not take the
        // parent's pool for its own (Note [Forked children]).
        self.used.store(true, SeqCst);
        let ready = match granularity {
            Some(chunk) => {
                let expandable = pool.lock().init_expandable(chunk, limit, self.table_source);
                if !expandable {
                    // Expandable tables the system refuses (an address-space limit): classic.
                    fallback::say(Fallback::ExpandableTables { device });
                }
                expandable || pool.lock().init(strategy, limit, self.table_source)
            }
            None => pool.lock().init(strategy, limit, self.table_source),
        };
        if !ready {
            fallback::say(Fallback::PoolTables { device });
        }
        ready.then_some(pool)
    }

    /// The chunk size for expandable segments on `device`: the driver's granularity; None, said
    /// once, when the driver or device has no virtual memory API (classic segments).
    fn expandable_granularity(&self, device: i32) -> Option<u64> {
        let granularity = self.runtime.granularity(device);
        if granularity.is_none() {
            fallback::say(Fallback::NoVirtualMemory { device });
        }
        granularity
    }

    // Note [One recording point] (record/mod.rs): a block's event is recorded here, with the
    // pool's block size; the pool's own counters change in the pool.

    fn block(device: usize, addr: u64, bytes: u64, holder: u64, tag: u64) -> record::Block {
        record::Block { place: device_place(device), addr, bytes, asked: bytes, holder, stream: tag }
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

    /// The background thread's hook: told when a segment becomes idle, with when it is due.
    pub fn set_background(&self, on_idle: fn(u64)) {
        self.on_idle.store(on_idle as *mut (), Relaxed);
    }

    /// Sets the neighbour hooks (Note [Neighbours] in device/neighbours/mod.rs).
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

    /// Per-device figures for the report: (device, stats, cached bytes).
    pub fn for_each_pool(&self, mut f: impl FnMut(usize, &DevicePool)) {
        if !self.used.load(Relaxed) {
            return; // none is set up: no lock taken (Note [Locks a child inherits])
        }
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
mod cap_tests;

#[cfg(test)]
mod captures_tests;

#[cfg(test)]
mod expandable_tests;

#[cfg(test)]
mod sharing_tests;
