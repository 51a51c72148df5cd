//! A per-thread depth count for the CUDA entry points: a call of ours made from inside the
//! runtime or driver (a runtime whose cudaHostAlloc calls cudaMallocHost through the PLT, a
//! profiling shim between us and it) passes straight through instead of recursing. The count is
//! a plain `#[thread_local]` integer: no allocation, no destructor, nothing on the malloc path.

use core::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Held while one of our CUDA entry points runs on this thread.
pub struct Entered(());

impl Drop for Entered {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// `Some` for the outermost call on this thread; `None` when one of ours is already running
/// below us on the stack: the caller then passes the call through to the real function.
pub fn enter() -> Option<Entered> {
    // A child our fork handlers did not see adopts the parent's records before it uses any
    // (Note [Children our handlers did not see] in fork_mark.rs).
    super::fork_mark::check();
    DEPTH.with(|d| {
        if d.get() > 0 {
            return None;
        }
        d.set(1);
        Some(Entered(()))
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn nested_entries_pass_through_and_the_outer_one_ends_cleanly() {
        let outer = super::enter().expect("outermost");
        assert!(super::enter().is_none(), "re-entered");
        drop(outer);
        assert!(super::enter().is_some(), "after the outer call returned");
    }
}
