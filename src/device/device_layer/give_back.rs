//! Giving memory back to the driver: the whole cache when a request fails or a framework empties
//! its cache (`release_cached`, `trim`), and idle segments from the background thread after the
//! release delay, sooner under pressure, and at once when a neighbour asks (Note [Idle
//! segments] in device/pool/release.rs, Note [Neighbours] in device/neighbours/mod.rs).

use super::DeviceLayer;
use crate::backing::{DeviceError, DeviceRuntime};
use crate::device::pool::chunks::Unmap;
use crate::device::pool::{DevicePool, IdleRelease, Release};
use crate::record;
use crate::record::holders::device_place;
use crate::sys::lock::Lock;
use core::sync::atomic::{AtomicU32, Ordering::{AcqRel, Acquire, Relaxed, SeqCst}};

/// How soon the background thread looks again at an idle segment that waits for a
/// synchronization (Note [Idle segments]).
const PENDING_RECHECK_NS: u64 = 100_000_000;
/// Under pressure, a segment idle this long goes back (Note [Idle segments]).
const PRESSURE_IDLE_NS: u64 = 1_000_000_000;
/// While idle segments are held and the pressure path is on, the driver's free memory is asked
/// about this often.
const PRESSURE_CHECK_NS: u64 = 1_000_000_000;
/// Idle segments taken out of a pool per lock.
const IDLE_BATCH: usize = 16;
/// Note [No driver call after exit]: set in `DeviceLayer::background` once exit began.
pub(super) const BACKGROUND_CLOSED: u32 = 1 << 31;

// Note [Releases beside a graph capture]
// A program capturing a CUDA graph in the global mode (PyTorch's torch.cuda.graph, and so
// torch.compile's "reduce-overhead", capture so) forbids every other thread in that mode the
// calls CUDA calls unsafe: a cuMemFree from our background thread or the neighbours' thread in
// the middle of it is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and the capture
// invalidated. A release frees only idle segments, which no captured work can name, so our
// threads make their driver calls in the relaxed mode, as PyTorch's own allocator does around
// its cudaMalloc, and put the mode back after. A synchronization during a capture is invalid
// whatever the mode, so under the preload no release meets a capture at all (Note [Graph
// captures under way] in captures.rs); the relaxed mode is for captures we do not see.

// Note [Idle blocks freed on streams]
// A block freed on a stream (PyTorch's and CuPy's frees under the package's hooks, cudaFreeAsync)
// or by a deferred cudaFree (TENSORMALLOC_CUDA_SYNC=reuse) may still be used by queued work: it
// waits for a synchronization before anyone else reuses it (Note [Safe reuse] in
// device/pool/mod.rs), and a segment is released only once it is free and synchronized. The
// program's own synchronizing calls are not ours to see (hooks mode interposes nothing), so such
// segments stayed with the process for good: no release by time, none under pressure, none for a
// neighbour, and cudaMemGetInfo short by all of them. So when such a block has been idle as long
// as a release asks (the release delay, a second under pressure, a neighbour's moment), our
// thread synchronizes the pool's device itself, in the relaxed capture mode, and every block
// freed before it began is reusable and releasable; one freed meanwhile keeps its tag. In a
// training loop freed blocks are reused long before that: the synchronization comes only for
// memory the program stopped using.

// Note [No driver call after exit]
// The background thread (idle and pressure releases) and the neighbours' answering thread call
// the driver on their own, whenever they like. Once the process exits, the driver tears itself
// down (its atexit handler or destructor), while those threads run on until the process is
// gone: a call of theirs then reaches a driver that no longer exists. So every background batch
// (`release_idle_batch`, `short_of_memory`) passes a gate first: a count of batches under way,
// closed by `stop_background`, which the exit hook calls (state.rs registers it with atexit when
// the first segment is mapped, after the driver set up its own teardown, so it runs before that
// teardown). Closing waits, bounded, for the batches under way; after it no background batch
// starts, and what was idle stays with the driver's own teardown. The program's own calls are
// not gated: a call the program makes during exit is as late as its own.

/// A background batch under way (Note [No driver call after exit]); ends when dropped.
pub(super) struct BackgroundBatch<'a>(&'a AtomicU32);

impl Drop for BackgroundBatch<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl<R: DeviceRuntime> DeviceLayer<R> {
    /// `f`'s driver calls in the relaxed capture mode (Note [Releases beside a graph capture]).
    fn beside_captures<T>(&self, f: impl FnOnce() -> T) -> T {
        use crate::backing::RELAXED_CAPTURE;
        let was = self.runtime.exchange_capture_mode(RELAXED_CAPTURE);
        let out = f();
        if let Some(was) = was.filter(|&m| m != RELAXED_CAPTURE) {
            let _ = self.runtime.exchange_capture_mode(was);
        }
        out
    }

    /// Enters the gate for one background batch; None once exit began.
    pub(super) fn background_batch(&self) -> Option<BackgroundBatch<'_>> {
        // SeqCst: a capture's begin reads this count after counting itself (captures.rs).
        let before = self.background.fetch_add(1, SeqCst);
        let batch = BackgroundBatch(&self.background);
        (before & BACKGROUND_CLOSED == 0).then_some(batch)
    }

    /// The process began to exit (Note [No driver call after exit]): no background batch starts
    /// from now on; waits up to `wait_ns` for those under way. True when none is left.
    pub fn stop_background(&self, wait_ns: u64) -> bool {
        self.background.fetch_or(BACKGROUND_CLOSED, AcqRel);
        let deadline = (self.clock)().saturating_add(wait_ns);
        loop {
            if self.background.load(Acquire) & !BACKGROUND_CLOSED == 0 {
                return true;
            }
            if (self.clock)() >= deadline {
                return false;
            }
            crate::sys::clock::pause();
        }
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
        let Some(_call) = self.unasked() else { return 0 };
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

    /// `release_cached` of everything, for a program's call that did not ask for it: false, with
    /// nothing done, while a capture is under way (Note [Graph captures under way]).
    pub(super) fn release_cached_unasked(&self, device: usize, pool: &Lock<DevicePool>) -> Result<bool, DeviceError> {
        let Some(_call) = self.unasked() else { return Ok(false) };
        self.release_cached(device, pool, u64::MAX).map(|_| true)
    }

    /// Synchronizes (so every free block is reusable and whole segments can be freed), then
    /// gives fully free segments of the current device back to the runtime.
    pub(super) fn release_cached(&self, device: usize, pool: &Lock<DevicePool>, max_bytes: u64) -> Result<u64, DeviceError> {
        let began = (self.clock)();
        self.synchronize()?;
        pool.lock().mark_synced_before(began);
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
                let taken = batch.get(..idle.count).unwrap_or(&[]);
                let unmapped = self.unmap_chunks(device, chunk, taken);
                self.close_exported(taken);
                unmapped?;
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

    /// Gives `device`'s cached blocks back to the driver (a framework emptied its cache: the
    /// memory must reach the driver, for other processes); returns the bytes released.
    pub fn trim_device(&self, device: usize) -> u64 {
        let Some(pool) = self.pools().get(device) else { return 0 };
        if !pool.lock().holds_memory() {
            return 0;
        }
        self.with_device(device as i32, || self.release_cached(device, pool, u64::MAX)).unwrap_or(0)
    }

    /// Gives every cached device block and pinned block back; returns the bytes released.
    pub fn trim(&self) -> u64 {
        let mut total = 0;
        for (device, pool) in self.pools().iter().enumerate() {
            if pool.lock().holds_memory() {
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

    /// A segment became idle at `now_ns` (Note [Idle segments]): the background thread is told
    /// when it is due.
    pub(super) fn segment_idle_at(&self, now_ns: u64) {
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
        // Nothing set up, nothing to look at: the pass takes none of the pools' locks (Note
        // [Locks a child inherits] in sys/lock.rs).
        if after == u64::MAX || !self.used.load(Relaxed) {
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

    /// A neighbour on the GPU is short of memory (Note [Neighbours]): every segment of `device`
    /// idle since `idle_since_ns` or before goes back now, as the background thread gives them
    /// back. Returns whether idle segments are left (younger ones, or some waiting for a
    /// synchronization).
    pub fn release_for_neighbour(&self, device: i32, idle_since_ns: u64) -> bool {
        let Some(device) = usize::try_from(device).ok() else { return false };
        let (Some(pool), Some(releasing)) = (self.pools().get(device), self.releasing.get(device)) else { return false };
        loop {
            let Some((idle, freed)) = self.release_idle_batch(device, pool, releasing, idle_since_ns, Release::Neighbour) else { return false };
            if freed.is_err() || idle.count < IDLE_BATCH {
                return idle.oldest_left_ns.is_some();
            }
        }
    }

    /// Takes up to IDLE_BATCH idle segments freed at `cutoff_ns` or before out of `device`'s pool
    /// and frees them in its context, unless a reset or end of that context came meanwhile (then
    /// the driver freed them with it): a context's end through us waits for `releasing` to fall
    /// back (lock_between_releases). None: no pool.
    pub(super) fn release_idle_batch(&self, device: usize, pool: &Lock<DevicePool>, releasing: &AtomicU32, cutoff_ns: u64, why: Release) -> Option<(IdleRelease, Result<(), DeviceError>)> {
        let _batch = self.background_batch()?;
        if self.capturing() {
            // Note [Graph captures under way]: looked at again a pass later.
            return Some((IdleRelease { count: 0, oldest_left_ns: None, pending_left: true }, Ok(())));
        }
        self.synchronize_for_idle(device, pool, releasing, cutoff_ns);
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
        let freed = self.beside_captures(|| self.with_device(device as i32, || {
            if pool.lock().generation() != generation {
                return Ok(());
            }
            for &(addr, len) in batch.iter().take(idle.count) {
                self.runtime_free(addr as usize)?;
                record::segment(device_place(device), addr, len, false);
            }
            Ok(())
        }));
        releasing.fetch_sub(1, AcqRel);
        Some((idle, freed))
    }

    /// Synchronizes `device` when a block freed on a stream (or deferred) has been free since
    /// `cutoff_ns` or before (Note [Idle blocks freed on streams]), under the same guard as the
    /// releases (`releasing`, the generation).
    fn synchronize_for_idle(&self, device: usize, pool: &Lock<DevicePool>, releasing: &AtomicU32, cutoff_ns: u64) {
        let generation = {
            let p = pool.lock();
            if !p.is_ready() || p.oldest_unsynced_free().is_none_or(|freed| freed > cutoff_ns) {
                return;
            }
            // Counted under the lock, as a release is: a context's end through us waits for it,
            // or comes first and this finds the generation changed (never a context retained or
            // synchronized after its end).
            releasing.fetch_add(1, AcqRel);
            p.generation()
        };
        let began = (self.clock)();
        let synced = self.beside_captures(|| self.with_device(device as i32, || if pool.lock().generation() == generation { self.synchronize().map(|()| true) } else { Ok(false) }));
        if synced == Ok(true) {
            let mut p = pool.lock();
            if p.generation() == generation {
                p.mark_synced_before(began);
            }
        }
        releasing.fetch_sub(1, AcqRel);
    }

    /// `release_idle_batch` for expandable segments: idle chunks, under the grow lock.
    pub(super) fn release_idle_chunk_batch(&self, device: usize, pool: &Lock<DevicePool>, releasing: &AtomicU32, cutoff_ns: u64, why: Release) -> Option<(IdleRelease, Result<(), DeviceError>)> {
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
        let taken = batch.get(..idle.count).unwrap_or(&[]);
        let freed = self.beside_captures(|| self.with_device(device as i32, || {
            if pool.lock().generation() != generation {
                return Ok(());
            }
            self.unmap_chunks(device, chunk, taken)
        }));
        self.close_exported(taken);
        releasing.fetch_sub(1, AcqRel);
        Some((idle, freed))
    }

    /// Whether less than `percent` of `device`'s memory is free, as the driver reports it. Asked
    /// in the pool's own context only (never by retaining a primary context the program may be
    /// releasing), under the same guard as the releases (`releasing`, the generation).
    pub(super) fn short_of_memory(&self, device: usize, pool: &Lock<DevicePool>, releasing: &AtomicU32, percent: u64) -> bool {
        let Some(_batch) = self.background_batch().filter(|_| !self.capturing()) else { return false };
        let generation = {
            let p = pool.lock();
            if p.owner() == 0 {
                return false;
            }
            // Under the lock, as in synchronize_for_idle.
            releasing.fetch_add(1, AcqRel);
            p.generation()
        };
        let info = self.beside_captures(|| self.with_device(device as i32, || if pool.lock().generation() == generation { self.runtime.mem_info().map(Some) } else { Ok(None) }));
        releasing.fetch_sub(1, AcqRel);
        matches!(info, Ok(Some((free, total))) if total > 0 && (free as u64).saturating_mul(100) < (total as u64).saturating_mul(percent))
    }
}
