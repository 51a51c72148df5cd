//! Counters for people: a `Level` ({current, peak, total}: what is held now, its high-water mark
//! and all that ever came in), a plain `Counter`, and phase timers; one stats type per kind of
//! memory (`HostStats`, `DeviceStats`; each device pool keeps its own figures under its lock,
//! device/pool). All atomics with relaxed ordering. The report is formatted in report/summary.rs.

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
    /// A count kept elsewhere under a lock, copied here with a plain store (Note [Figures under
    /// the lock] in host/tally.rs).
    pub fn set(&self, n: u64) {
        self.0.store(n, Relaxed);
    }
    pub fn reset(&self) {
        self.0.store(0, Relaxed);
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

/// A level that goes up and down: what is held now, its high-water mark, and the total of
/// everything added (what came in over the process's life; `set` adds nothing to it).
pub struct Level {
    current: AtomicU64,
    peak: AtomicU64,
    total: AtomicU64,
}

impl Level {
    pub const fn new() -> Self {
        Level { current: AtomicU64::new(0), peak: AtomicU64::new(0), total: AtomicU64::new(0) }
    }
    pub fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Relaxed).wrapping_add(n);
        self.total.fetch_add(n, Relaxed);
        // A read first: below the peak (the steady state) costs no locked instruction.
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
    }
    pub fn set(&self, n: u64) {
        self.current.store(n, Relaxed);
        if n > self.peak.load(Relaxed) {
            self.peak.fetch_max(n, Relaxed);
        }
    }
    /// What is held and the total that came in, kept elsewhere under a lock, copied here with
    /// plain stores; the peak rises with them (Note [Figures under the lock] in host/tally.rs).
    pub fn publish(&self, current: u64, total: u64) {
        self.current.store(current, Relaxed);
        self.total.store(total, Relaxed);
        if current > self.peak.load(Relaxed) {
            self.peak.fetch_max(current, Relaxed);
        }
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
    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }
    /// A forked child's start: what is held stays held, it is the peak so far, nothing came in.
    pub fn restart(&self) {
        self.peak.store(self.current(), Relaxed);
        self.total.store(0, Relaxed);
    }
}

impl Default for Level {
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
    pub fn reset(&self) {
        self.calls.reset();
        self.total_ns.reset();
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
    pub live: Level,
    /// Live large blocks (the cache's block bound follows its peak).
    pub live_blocks: Level,
    pub cached: Level,
    /// Bytes evicted and waiting for the background thread to unmap them.
    pub deferred: Level,
    /// calloc hits zeroed by discarding pages (MADV_DONTNEED) rather than by writing zeros.
    pub zeroed_by_discard: Counter,
    /// Freed blocks whose pages could not be made plain again (partly unmapped by the program,
    /// or sealed): never reused (Note [Plain memory]).
    pub unresettable: Counter,
    /// Freed blocks whose pages the program had changed, reset before caching (Note [Pages the
    /// program changed]).
    pub resets: Counter,
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

/// The device layer's figures, all devices together (each pool's own are in device/pool).
pub struct DeviceStats {
    /// Requests the layer handed to the runtime as they were: the pool off, another context's
    /// request, or our tables full (a pool failure that the route then hands on is counted once,
    /// as the pool's OOM failure, not here).
    pub passthrough: Counter,
    pub phases: DevicePhases,
}

impl DeviceStats {
    pub const fn new() -> Self {
        DeviceStats { passthrough: Counter::new(), phases: DevicePhases::new() }
    }
}

impl Default for DeviceStats {
    fn default() -> Self {
        Self::new()
    }
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
    /// In a forked child: its numbers are its own from here (the parent's requests are not
    /// counted twice when a run's processes are summed); the blocks it inherited stay live.
    pub fn restart_in_child(&self) {
        for c in [
            &self.requests, &self.hits, &self.hits_after_release, &self.misses, &self.hit_bytes, &self.frees, &self.splits,
            &self.released_blocks, &self.released_bytes, &self.unmapped_blocks, &self.unmapped_bytes, &self.map_failures,
            &self.remaps, &self.grows, &self.zeroed_by_discard, &self.unresettable, &self.resets, &self.retries_after_trim,
        ] {
            c.reset();
        }
        for l in [&self.live, &self.live_blocks, &self.cached, &self.deferred] {
            l.restart();
        }
        let p = &self.phases;
        for t in [&p.alloc, &p.alloc_hit, &p.alloc_map, &p.alloc_grow, &p.alloc_zero, &p.free, &p.free_unmap, &p.deferred_unmap, &p.realloc, &p.release, &p.expire] {
            t.reset();
        }
    }

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
            live: Level::new(),
            live_blocks: Level::new(),
            cached: Level::new(),
            deferred: Level::new(),
            zeroed_by_discard: Counter::new(),
            unresettable: Counter::new(),
            resets: Counter::new(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_keeps_its_peak_and_the_total_that_came_in() {
        let l = Level::new();
        l.add(100);
        l.sub(60);
        l.add(30);
        assert_eq!((l.current(), l.peak(), l.total()), (70, 100, 130));
        l.sub(500);
        assert_eq!(l.current(), 0, "saturates: a reader never sees a wrapped figure");
        l.set(120);
        assert_eq!((l.current(), l.peak(), l.total()), (120, 120, 130), "a set moves the peak, not the total");
    }
}
