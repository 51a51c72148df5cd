//! Counters and phase timers, as `{current, peak}` gauges and plain counts. All atomics with
//! relaxed ordering: figures are for people, never for decisions. The report is formatted in
//! `report/summary.rs`.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

/// A level that goes up and down, with its high-water mark.
pub struct Gauge {
    current: AtomicU64,
    peak: AtomicU64,
}

impl Gauge {
    pub const fn new() -> Self {
        Gauge { current: AtomicU64::new(0), peak: AtomicU64::new(0) }
    }
    pub fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Relaxed).wrapping_add(n);
        self.peak.fetch_max(now, Relaxed);
    }
    pub fn set(&self, n: u64) {
        self.current.store(n, Relaxed);
        self.peak.fetch_max(n, Relaxed);
    }
    pub fn sub(&self, n: u64) {
        // Saturate: a racing reader must never see a wrapped figure.
        let _ = self.current.fetch_update(Relaxed, Relaxed, |c| Some(c.saturating_sub(n)));
    }
    pub fn current(&self) -> u64 {
        self.current.load(Relaxed)
    }
    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }
}

impl Default for Gauge {
    fn default() -> Self {
        Self::new()
    }
}

/// Calls and total nanoseconds spent in one phase.
pub struct PhaseTimer {
    pub calls: Counter,
    pub total_ns: Counter,
}

impl PhaseTimer {
    pub const fn new() -> Self {
        PhaseTimer { calls: Counter::new(), total_ns: Counter::new() }
    }
    pub fn record(&self, ns: u64) {
        self.calls.add(1);
        self.total_ns.add(ns);
    }
}

impl Default for PhaseTimer {
    fn default() -> Self {
        Self::new()
    }
}

/// The host layer's figures.
#[derive(Default)]
pub struct HostStats {
    pub requests: Counter,
    pub hits: Counter,
    pub hits_after_release: Counter,
    pub misses: Counter,
    pub hit_bytes: Counter,
    pub frees: Counter,
    pub splits: Counter,
    pub released_blocks: Counter,
    pub released_bytes: Counter,
    pub unmapped_blocks: Counter,
    pub unmapped_bytes: Counter,
    pub map_failures: Counter,
    pub remaps: Counter,
    /// Misses served by gathering the pages of cached blocks (Note [Gathering pages]).
    pub grows: Counter,
    pub live: Gauge,
    /// Live large blocks (the cache's block bound follows its peak).
    pub live_blocks: Gauge,
    pub cached: Gauge,
    /// Bytes evicted and waiting for the background thread to unmap them.
    pub deferred: Gauge,
    /// calloc hits zeroed by discarding pages (MADV_DONTNEED) rather than by writing zeros.
    pub zeroed_by_discard: Counter,
    /// Freed blocks whose pages could not be made plain again (partly unmapped by the program,
    /// or sealed): never reused (Note [Plain memory]).
    pub unresettable: Counter,
    /// Times a failed allocation emptied the cache and was tried again (Note [Room for others]).
    pub retries_after_trim: Counter,
    pub phases: HostPhases,
}

/// Per-phase timings of the host paths (see the report for their nesting).
#[derive(Default)]
pub struct HostPhases {
    pub alloc: PhaseTimer,
    pub alloc_hit: PhaseTimer,
    pub alloc_map: PhaseTimer,
    pub alloc_grow: PhaseTimer,
    pub alloc_zero: PhaseTimer,
    pub free: PhaseTimer,
    pub free_unmap: PhaseTimer,
    /// Unmaps left to the background thread (Note [Deferred unmaps]).
    pub deferred_unmap: PhaseTimer,
    pub realloc: PhaseTimer,
    pub release: PhaseTimer,
    pub expire: PhaseTimer,
}

/// Per-phase timings of the CUDA paths, all devices together.
pub struct DevicePhases {
    /// cudaMalloc and the pluggable alloc, whole.
    pub malloc: PhaseTimer,
    /// The runtime's own cudaMalloc: a new segment, or a request passed through.
    pub malloc_runtime: PhaseTimer,
    /// Every device synchronization we make: in cudaFree, before reusing a block, before
    /// giving segments back.
    pub sync: PhaseTimer,
    /// cudaFree of our blocks, and every pluggable free (PyTorch hands it only ours), whole.
    pub free: PhaseTimer,
    /// The runtime's own cudaFree of segments given back (out of memory, trim, cap).
    pub free_runtime: PhaseTimer,
}

impl DevicePhases {
    pub const fn new() -> Self {
        DevicePhases {
            malloc: PhaseTimer::new(),
            malloc_runtime: PhaseTimer::new(),
            sync: PhaseTimer::new(),
            free: PhaseTimer::new(),
            free_runtime: PhaseTimer::new(),
        }
    }
}

impl Default for DevicePhases {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `f` and adds its duration on `clock` to `phase`.
pub fn timed_by<T>(clock: fn() -> u64, phase: &PhaseTimer, f: impl FnOnce() -> T) -> T {
    let start = clock();
    let out = f();
    phase.record(clock().saturating_sub(start));
    out
}

/// `timed_by` on the monotonic clock.
pub fn timed<T>(phase: &PhaseTimer, f: impl FnOnce() -> T) -> T {
    timed_by(crate::sys::clock::now_ns, phase, f)
}

impl HostStats {
    pub const fn new() -> Self {
        HostStats {
            requests: Counter::new(),
            hits: Counter::new(),
            hits_after_release: Counter::new(),
            misses: Counter::new(),
            hit_bytes: Counter::new(),
            frees: Counter::new(),
            splits: Counter::new(),
            released_blocks: Counter::new(),
            released_bytes: Counter::new(),
            unmapped_blocks: Counter::new(),
            unmapped_bytes: Counter::new(),
            map_failures: Counter::new(),
            remaps: Counter::new(),
            grows: Counter::new(),
            live: Gauge::new(),
            live_blocks: Gauge::new(),
            cached: Gauge::new(),
            deferred: Gauge::new(),
            zeroed_by_discard: Counter::new(),
            unresettable: Counter::new(),
            retries_after_trim: Counter::new(),
            phases: HostPhases {
                alloc: PhaseTimer::new(),
                alloc_hit: PhaseTimer::new(),
                alloc_map: PhaseTimer::new(),
                alloc_grow: PhaseTimer::new(),
                alloc_zero: PhaseTimer::new(),
                free: PhaseTimer::new(),
                free_unmap: PhaseTimer::new(),
                deferred_unmap: PhaseTimer::new(),
                realloc: PhaseTimer::new(),
                release: PhaseTimer::new(),
                expire: PhaseTimer::new(),
            },
        }
    }
}
