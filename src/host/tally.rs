//! The host layer's busiest figures, counted under the cache's lock and published with plain
//! stores, and the timing of its hot calls on one call in 64. Pure: the clock comes in as a
//! function, the figures go out to `HostStats`.
//
// Note [Figures under the lock]
// A large malloc/free pair used to make some twenty locked read-modify-writes on shared
// counters (requests, hits, live bytes and blocks, their totals, the phase timers), each about
// 20 cycles even with one thread, as much as the rest of the pair. Every large malloc and free
// takes the cache lock once anyway, so the figures that change on every call are counted there,
// in a `Tally` only its holder touches, and copied to `HostStats` with plain stores before the
// lock is let go (so they never go back in time). Figures of rare paths (misses, unmaps, resets)
// stay plain atomic counters. A forked child starts its tally again, as `HostStats` does
// (`restart`).
//
// Note [Timing one call in 64]
// Reading the precise clock costs 30 ns here; twice per call, on both calls of a pair, it was a
// third of the pair. The timing table keeps its meaning (calls, and the time spent in them)
// this way: every call is counted; a call that makes a system call or waits (a miss, an unmap,
// zeroing) is timed exactly from the moment it knows, as before; one without is timed only when
// sampled (one call in 64, picked by a hash of its number so no loop's period aliases with it)
// and counts 64 times its time (the 63 it stands for capped at 16 us each: a call preempted by
// the scheduler would otherwise count its milliseconds 64 times). So the time of the cheap calls
// is an estimate whose error is far under their share of any table where it matters. Timestamps (when a block was
// born, when it was freed) come from the coarse clock (a few ms resolution, 6 ns).

use crate::record::stats::{HostStats, PhaseTimer};

/// One call in SAMPLE_EVERY of the cheap ones is timed (Note [Timing one call in 64]).
pub const SAMPLE_EVERY: u64 = 64;
/// The most a sampled cheap call stands for per call it stands for: one preempted by the
/// scheduler (milliseconds on a loaded machine) counts its own time once, not 64 times.
pub const SAMPLE_CAP_NS: u64 = 16_000;

/// The figures kept under the cache lock (Note [Figures under the lock]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub requests: u64,
    pub hits: u64,
    pub hit_bytes: u64,
    pub hits_after_release: u64,
    pub splits: u64,
    pub frees: u64,
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// All the bytes and blocks that ever became live (the Levels' totals).
    pub live_bytes_total: u64,
    pub live_blocks_total: u64,
}

impl Tally {
    pub const fn new() -> Self {
        Tally {
            requests: 0,
            hits: 0,
            hit_bytes: 0,
            hits_after_release: 0,
            splits: 0,
            frees: 0,
            live_bytes: 0,
            live_blocks: 0,
            live_bytes_total: 0,
            live_blocks_total: 0,
        }
    }

    /// A block of `len` bytes became live.
    pub fn went_live(&mut self, len: usize) {
        self.live_bytes += len as u64;
        self.live_blocks += 1;
        self.live_bytes_total += len as u64;
        self.live_blocks_total += 1;
    }

    /// A live block of `len` bytes is gone (freed, or forgotten in a forked child).
    /// `n` blocks of `bytes` in all handed out again from their threads' slots: each a free, a
    /// request and a hit, live again (Note [A thread's own slot] in host/thread_slots.rs).
    pub fn count_reuses(&mut self, n: u64, bytes: u64) {
        self.frees += n;
        self.requests += n;
        self.hits += n;
        self.hit_bytes += bytes;
        self.live_bytes_total += bytes;
        self.live_blocks_total += n;
    }

    pub fn left(&mut self, len: usize) {
        self.live_bytes = self.live_bytes.saturating_sub(len as u64);
        self.live_blocks = self.live_blocks.saturating_sub(1);
    }

    /// A live block changed length in place.
    pub fn resized(&mut self, old_len: usize, new_len: usize) {
        if new_len >= old_len {
            self.live_bytes += (new_len - old_len) as u64;
            self.live_bytes_total += (new_len - old_len) as u64;
        } else {
            self.live_bytes = self.live_bytes.saturating_sub((old_len - new_len) as u64);
        }
    }

    /// A forked child's start, as `HostStats::restart_in_child`: what is live stays live, it is
    /// the peak so far, nothing came in.
    pub fn restart(&mut self) {
        *self = Tally { live_bytes: self.live_bytes, live_blocks: self.live_blocks, ..Tally::new() };
    }

    /// Copies the figures to `stats`; under the lock, so published figures never go back.
    pub fn publish(&self, stats: &HostStats) {
        stats.requests.set(self.requests);
        stats.hits.set(self.hits);
        stats.hit_bytes.set(self.hit_bytes);
        stats.hits_after_release.set(self.hits_after_release);
        stats.splits.set(self.splits);
        stats.frees.set(self.frees);
        stats.live.publish(self.live_bytes, self.live_bytes_total);
        stats.live_blocks.publish(self.live_blocks, self.live_blocks_total);
        stats.phases.alloc.calls.set(self.requests);
        stats.phases.alloc_hit.calls.set(self.hits);
        stats.phases.free.calls.set(self.frees);
    }
}

/// Whether call number `n` of a kind is one of the sampled ones: a hash of it, so a program
/// whose loop makes one expensive call in every 64 is not always or never sampled.
pub fn sampled(n: u64) -> bool {
    n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58 == 0
}

/// The timing of one hot call (Note [Timing one call in 64]).
#[derive(Clone, Copy, Debug)]
pub struct CallTimer {
    /// When the timed stretch began; 0 when it is not timed (yet).
    start_ns: u64,
    /// Timed exactly from `start_ns` (the call made a system call), not sampled.
    exact: bool,
}

impl CallTimer {
    /// A call not timed (its caller's time covers it).
    pub const fn untimed() -> Self {
        CallTimer { start_ns: 0, exact: false }
    }

    /// The timer of call number `n`: running from now if it is sampled.
    pub fn begin(n: u64, clock: fn() -> u64) -> Self {
        CallTimer { start_ns: if sampled(n) { clock().max(1) } else { 0 }, exact: false }
    }

    /// The call makes a system call or waits: it is timed exactly, from now if it was not
    /// sampled.
    pub fn exact(&mut self, clock: fn() -> u64) {
        if self.start_ns == 0 {
            self.start_ns = clock().max(1);
        }
        self.exact = true;
    }

    /// When the timer began (0: not timed).
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Adds the call's time to `phases` (not its count: the tally keeps that).
    pub fn finish(&self, clock: fn() -> u64, phases: &[&PhaseTimer]) {
        if self.start_ns == 0 {
            return;
        }
        let ns = clock().saturating_sub(self.start_ns);
        let ns = if self.exact { ns } else { ns.saturating_add(ns.min(SAMPLE_CAP_NS) * (SAMPLE_EVERY - 1)) };
        for p in phases {
            p.total_ns.add(ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_call_in_64_is_sampled_without_a_period() {
        let picked: Vec<u64> = (0..64 * 1000).filter(|&n| sampled(n)).collect();
        // About one in 64 over many calls, within a few percent.
        assert!((950..=1050).contains(&picked.len()), "{} of 64000", picked.len());
        // No stride of a loop picks all or none: calls at one position of every 8, 64 or 100.
        for period in [8u64, 64, 100, 128] {
            for phase in [0u64, 1, 7] {
                let hit = (0..4000).filter(|k| sampled(k * period + phase)).count();
                assert!((20..=110).contains(&hit), "period {period} phase {phase}: {hit} of 4000");
            }
        }
    }

    #[test]
    fn sampled_calls_count_64_times_and_exact_calls_once() {
        use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
        static NOW: AtomicU64 = AtomicU64::new(1000);
        fn clock() -> u64 {
            NOW.load(Relaxed)
        }
        let phase = PhaseTimer::new();
        let n = (0..).find(|&n| sampled(n)).unwrap();
        let t = CallTimer::begin(n, clock);
        NOW.store(1010, Relaxed);
        t.finish(clock, &[&phase]);
        assert_eq!(phase.total_ns.get(), 10 * SAMPLE_EVERY, "a sampled cheap call stands for 64");
        let m = (0..).find(|&n| !sampled(n)).unwrap();
        let mut t = CallTimer::begin(m, clock);
        t.finish(clock, &[&phase]);
        assert_eq!(phase.total_ns.get(), 10 * SAMPLE_EVERY, "an unsampled cheap call adds nothing");
        t.exact(clock);
        NOW.store(1510, Relaxed);
        t.finish(clock, &[&phase]);
        assert_eq!(phase.total_ns.get(), 10 * SAMPLE_EVERY + 500, "a call with a system call counts exactly");
        let mut t = CallTimer::begin(n, clock);
        NOW.store(1520, Relaxed);
        t.exact(clock);
        t.finish(clock, &[&phase]);
        assert_eq!(phase.total_ns.get(), 10 * SAMPLE_EVERY + 510, "sampled, then exact: exact from its start");
        let t = CallTimer::begin(n, clock);
        NOW.store(1520 + 5_000_000, Relaxed);
        t.finish(clock, &[&phase]);
        assert_eq!(phase.total_ns.get(), 10 * SAMPLE_EVERY + 510 + 5_000_000 + SAMPLE_CAP_NS * 63, "a preempted sample counts its own time once");
        assert_eq!(phase.calls.get(), 0, "the tally counts calls");
    }

    #[test]
    fn a_child_keeps_what_is_live_and_nothing_else() {
        let mut t = Tally::new();
        t.requests = 5;
        t.went_live(100);
        t.went_live(50);
        t.left(100);
        t.resized(50, 80);
        assert_eq!((t.live_bytes, t.live_blocks, t.live_bytes_total, t.live_blocks_total), (80, 1, 180, 2));
        t.restart();
        assert_eq!(t, Tally { live_bytes: 80, live_blocks: 1, ..Tally::new() });
    }
}
