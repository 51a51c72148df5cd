//! Graph captures under way in the process (Note [Graph captures under way]): counted at their
//! begin and end (the driver's calls, `route::cuda::captures`), and read before any driver call
//! of ours that the program did not ask for.

use super::give_back::BACKGROUND_CLOSED;
use super::DeviceLayer;
use crate::backing::{DeviceRuntime, RELAXED_CAPTURE};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

// Note [Graph captures under way]
// While a program captures a CUDA graph, a synchronization of the device or context that holds
// the capturing stream is invalid (CUDA's programming guide, "Prohibited and Unhandled
// Operations") whatever the capture mode, and invalidates the capture; cuMemFree synchronizes.
// The relaxed mode our threads take (Note [Releases beside a graph capture]) lifts only the
// global mode's refusal of "unsafe" calls, not that. So the process's captures are counted (a
// successful cuStreamBeginCapture of any spelling adds one, a cuStreamEndCapture that ends one
// takes it back), and while any is under way:
// - our threads make no driver call: the idle release, the pressure query, the synchronization
//   for blocks freed on streams and a neighbour's ask wait for the next pass;
// - the program's own calls make none it did not ask for: an allocation does not synchronize
//   to reuse blocks freed on streams (it maps new memory, as it would without us) nor give the
//   cache back when the driver is out of memory (the error stands, as without us), a cudaFree
//   does not synchronize (its block waits for a later synchronization, as one freed on a stream
//   does), and a cudaFreeHost gives its block to the runtime rather than synchronize to keep it
//   (pinned/serve.rs: it synchronized, and the free and the capture failed, the cuda2 hunter).
// Each side counts itself before it reads the other: a capture's begin waits (bounded) for our
// driver calls already under way, and every call of ours counts itself, then looks for
// captures, so none overlaps a capture.
// Before a capture begins, with none under way and the driver's free memory under what the
// current device's pool holds cached, that cache goes back to the driver (`before_capture`: one
// synchronization, then cuMemFree of every free segment). It is memory the program freed;
// alone, its frees had given it back, and an allocation in the
// capture that needs it could not have it from us later: the cache stays through a capture, so
// a cudaMalloc there failed where it succeeds alone (PyTorch frees its cache before capturing,
// torch.cuda.graph's empty_cache; the cudart hunter's 600 MiB freed, then 700 MiB asked in the
// capture, of 1 GiB). With room to spare nothing is given back, and no synchronization comes
// at the begin. Only the current device's pool: a capture on a stream of another device keeps
// that device's cache (docs/limits.md).
// A cudaMalloc during a capture is one of the "potentially unsafe" calls the runtime refuses
// (cudaErrorStreamCaptureUnsupported, the capture invalidated) to a thread whose capture mode
// is not the relaxed one, when the thread has a capture of its own under way or another has one
// in the global mode. Served from the cache it succeeded where the runtime alone refuses. So
// while a capture is under way, a cudaMalloc from a thread not in the relaxed mode goes to the
// driver (`allocation_is_the_drivers`), which refuses it and ends the capture as without us, or
// serves it with new memory (a capture in another mode; as an allocation there would map new
// memory rather than synchronize anyway). PyTorch's allocator sets the relaxed mode around its
// cudaMalloc in a capture: its requests are the pool's as before.
// A capture's end from the wrong thread (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) or on a stream
// that was not capturing ends none. A capture is kept with its stream and context (16 at a
// time; more are counted only), so that the end of its context (destroyed, reset) ends it: a
// count left up for good would keep the pool from ever synchronizing for the program. Only captures begun through us are seen: under the plain
// preload every spelling is ours (symbols and cuGetProcAddress); a process that loads us without
// the preload (the package's hooks alone) has its captures begun by a runtime we do not reach.

/// cuStreamEndCapture's answers that end the capture: success, invalidated, unjoined.
pub const ENDS_A_CAPTURE: [i32; 3] = [0, 901, 904];
/// Captures under way whose stream and context are kept, so that a context's end ends them.
const TRACKED: usize = 16;

/// The streams capturing and their contexts (0: a free slot), and the captures not kept here.
pub(super) struct CaptureStreams {
    streams: [AtomicU64; TRACKED],
    contexts: [AtomicU64; TRACKED],
    untracked: AtomicU32,
}

impl CaptureStreams {
    pub(super) const fn new() -> Self {
        CaptureStreams { streams: [const { AtomicU64::new(0) }; TRACKED], contexts: [const { AtomicU64::new(0) }; TRACKED], untracked: AtomicU32::new(0) }
    }

    fn keep(&self, stream: u64, ctx: u64) {
        for (s, c) in self.streams.iter().zip(&self.contexts) {
            if stream != 0 && s.compare_exchange(0, stream, SeqCst, SeqCst).is_ok() {
                c.store(ctx, SeqCst);
                return;
            }
        }
        self.untracked.fetch_add(1, SeqCst);
    }

    /// Whether `stream`'s capture was under way here (kept, or one of those not kept).
    fn end(&self, stream: u64) -> bool {
        if let Some((s, c)) = self.streams.iter().zip(&self.contexts).find(|(s, _)| stream != 0 && s.load(SeqCst) == stream) {
            c.store(0, SeqCst);
            return s.compare_exchange(stream, 0, SeqCst, SeqCst).is_ok();
        }
        self.untracked.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
    }

    /// Ends the captures kept for context `ctx`; how many.
    fn end_context(&self, ctx: u64) -> u32 {
        let mut ended = 0;
        for (s, c) in self.streams.iter().zip(&self.contexts) {
            if ctx != 0 && c.load(SeqCst) == ctx && c.compare_exchange(ctx, 0, SeqCst, SeqCst).is_ok() {
                s.store(0, SeqCst);
                ended += 1;
            }
        }
        ended
    }

    fn clear(&self) {
        self.streams.iter().chain(&self.contexts).for_each(|w| w.store(0, SeqCst));
        self.untracked.store(0, SeqCst);
    }
}
/// How long a capture's begin waits for driver calls of ours already under way.
const DRAIN_WAIT_NS: u64 = 2_000_000_000;

/// A driver call of ours the program did not ask for, under way (Note [Graph captures under
/// way]); ends when dropped.
pub(in crate::device) struct Unasked<'a>(&'a AtomicU32);

impl Drop for Unasked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl<R: DeviceRuntime> DeviceLayer<R> {
    /// A capture is about to begin: counted first, then the driver calls of ours already under
    /// way are waited for (bounded), so that none overlaps the capture. Each side counts itself
    /// before it reads the other's count, so one of them always sees the other.
    pub fn capture_beginning(&self) {
        self.captures.fetch_add(1, SeqCst);
        let deadline = (self.clock)().saturating_add(DRAIN_WAIT_NS);
        while (self.background.load(SeqCst) & !BACKGROUND_CLOSED) != 0 || self.unasked.load(SeqCst) != 0 {
            if (self.clock)() >= deadline {
                crate::device::fallback::say(crate::device::fallback::Fallback::CaptureOverlap);
                return;
            }
            crate::sys::clock::pause();
        }
    }

    /// A capture is about to begin: with none under way, the current device's cached memory
    /// goes back to the driver (Note [Graph captures under way]).
    pub fn before_capture(&self) {
        let Ok(device) = self.runtime.current_device() else { return };
        let Some(pool) = usize::try_from(device).ok().and_then(|d| self.pools().get(d)) else { return };
        let cached = {
            let pool = pool.lock();
            if !pool.is_ready() { 0 } else { pool.cached_bytes() }
        };
        // Only where the device is short: free memory under what we hold. A capture begin with
        // room to spare costs no synchronization (a program capturing every step: the review).
        if cached == 0 || self.runtime.mem_info().is_ok_and(|(free, _)| free as u64 >= cached) {
            return;
        }
        let _ = self.with_device(device, || self.release_cached_unasked(device as usize, pool));
    }

    /// The begin call on `stream` answered `rc`: a refused one began no capture; one begun is
    /// kept with the current context.
    pub fn capture_begin_answered(&self, rc: i32, stream: u64) {
        if rc != 0 {
            self.one_capture_fewer();
        } else {
            self.capture_streams.keep(stream, self.runtime.current_context());
        }
    }

    /// A capture's end on `stream` answered `rc`: one fewer under way when that answer ends one
    /// still counted (a context's end may have ended it already).
    pub fn capture_end_answered(&self, rc: i32, stream: u64) {
        if ENDS_A_CAPTURE.contains(&rc) && self.capture_streams.end(stream) {
            self.one_capture_fewer();
        }
    }

    /// Context `ctx` ended (destroyed, reset, released for good): its captures with it.
    pub(super) fn captures_of_context_ended(&self, ctx: u64) {
        for _ in 0..self.capture_streams.end_context(ctx) {
            self.one_capture_fewer();
        }
    }

    /// In a forked child: the parent's captures are none of its own.
    pub(super) fn forget_captures(&self) {
        self.capture_streams.clear();
        self.captures.store(0, SeqCst);
        self.unasked.store(0, SeqCst);
    }

    fn one_capture_fewer(&self) {
        let _ = self.captures.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
    }

    /// Whether any capture is under way (Note [Graph captures under way]).
    pub fn capturing(&self) -> bool {
        self.captures.load(SeqCst) != 0
    }

    /// Whether a cudaMalloc of the calling thread's now is the driver's to answer (Note [Graph
    /// captures under way]): a capture is under way and the thread's capture mode is not the
    /// relaxed one, so the runtime alone may refuse it.
    pub(super) fn allocation_is_the_drivers(&self) -> bool {
        if !self.capturing() {
            return false;
        }
        // The thread's mode, read by setting it and setting it back (no call reads it alone).
        match self.runtime.exchange_capture_mode(RELAXED_CAPTURE) {
            Some(RELAXED_CAPTURE) | None => false,
            Some(was) => {
                let _ = self.runtime.exchange_capture_mode(was);
                true
            }
        }
    }

    /// Leave to make a driver call the program did not ask for, from its own thread: None while
    /// a capture is under way.
    pub(in crate::device) fn unasked(&self) -> Option<Unasked<'_>> {
        self.unasked.fetch_add(1, SeqCst);
        let call = Unasked(&self.unasked);
        (!self.capturing()).then_some(call)
    }
}

