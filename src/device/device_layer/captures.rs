//! Graph captures under way in the process (Note [Graph captures under way]): counted at their
//! begin and end (the driver's calls, `route::cuda::captures`), and read before any driver call
//! of ours that the program did not ask for.

use super::give_back::BACKGROUND_CLOSED;
use super::DeviceLayer;
use crate::backing::DeviceRuntime;
use core::sync::atomic::{AtomicU32, Ordering::SeqCst};

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
//   cache back when the driver is out of memory (the error stands, as without us), and a
//   cudaFree does not synchronize (its block waits for a later synchronization, as one freed on
//   a stream does).
// Each side counts itself before it reads the other: a capture's begin waits (bounded) for our
// driver calls already under way, and every call of ours counts itself, then looks for
// captures, so none overlaps a capture.
// A capture's end from the wrong thread (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) or on a stream
// that was not capturing ends none. Only captures begun through us are seen: under the plain
// preload every spelling is ours (symbols and cuGetProcAddress); a process that loads us without
// the preload (the package's hooks alone) has its captures begun by a runtime we do not reach.

/// cuStreamEndCapture's answers that end the capture: success, invalidated, unjoined.
pub const ENDS_A_CAPTURE: [i32; 3] = [0, 901, 904];
/// How long a capture's begin waits for driver calls of ours already under way.
const DRAIN_WAIT_NS: u64 = 2_000_000_000;

/// A driver call of ours the program did not ask for, under way (Note [Graph captures under
/// way]); ends when dropped.
pub(super) struct Unasked<'a>(&'a AtomicU32);

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
                return;
            }
            crate::sys::clock::pause();
        }
    }

    /// The begin call answered `rc`: a refused one began no capture.
    pub fn capture_begin_answered(&self, rc: i32) {
        if rc != 0 {
            self.one_capture_fewer();
        }
    }

    /// A capture's end answered `rc`: one fewer under way when that answer ends one.
    pub fn capture_end_answered(&self, rc: i32) {
        if ENDS_A_CAPTURE.contains(&rc) {
            self.one_capture_fewer();
        }
    }

    fn one_capture_fewer(&self) {
        let _ = self.captures.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
    }

    /// Whether any capture is under way (Note [Graph captures under way]).
    pub fn capturing(&self) -> bool {
        self.captures.load(SeqCst) != 0
    }

    /// Leave to make a driver call the program did not ask for, from its own thread: None while
    /// a capture is under way.
    pub(super) fn unasked(&self) -> Option<Unasked<'_>> {
        self.unasked.fetch_add(1, SeqCst);
        let call = Unasked(&self.unasked);
        (!self.capturing()).then_some(call)
    }
}

#[cfg(test)]
#[path = "captures_tests.rs"]
mod tests;
