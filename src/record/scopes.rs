//! Scoped accounting (the DJL NDManager idea for any program): a thread opens a named scope,
//! and every large host block and device block that thread allocates or frees until the scope
//! ends is counted in it and in every scope around it. Per thread, nested up to MAX_DEPTH, kept
//! in thread-local storage with no destructor (glibc would register one with calloc).
//! Small requests are not counted: they belong to the next allocator.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

pub const MAX_DEPTH: usize = 16;
pub const NAME_BYTES: usize = 48;

/// `tm_scope_t` in include/tensormalloc.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScopeStats {
    pub name: [u8; NAME_BYTES],
    pub depth: u32,
    pub _reserved: u32,
    pub allocations: u64,
    pub frees: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    /// Highest value of allocated minus freed while the scope was open.
    pub peak_bytes: u64,
    /// Allocated minus freed: what the scope leaves live (leaked, if nothing outlives it).
    pub live_bytes: i64,
}

const EMPTY: ScopeStats = ScopeStats {
    name: [0; NAME_BYTES],
    depth: 0,
    _reserved: 0,
    allocations: 0,
    frees: 0,
    allocated_bytes: 0,
    freed_bytes: 0,
    peak_bytes: 0,
    live_bytes: 0,
};

struct Stack {
    frames: [ScopeStats; MAX_DEPTH],
    depth: usize,
}

thread_local! {
    // const-initialised and free of Drop: no TLS destructor is registered.
    static STACK: UnsafeCell<Stack> = const { UnsafeCell::new(Stack { frames: [EMPTY; MAX_DEPTH], depth: 0 }) };
}

/// Whether any thread ever opened a scope: until one does, a block's event reads no
/// thread-local storage (a call into the loader's __tls_get_addr from a preloaded library).
static EVER_OPENED: AtomicBool = AtomicBool::new(false);

fn with_stack<T>(f: impl FnOnce(&mut Stack) -> T) -> Option<T> {
    // SAFETY: the stack is this thread's own and no reference to it escapes `f`.
    STACK.try_with(|s| f(unsafe { &mut *s.get() })).ok()
}

/// Opens a scope; returns its depth (1 = outermost), or `None` when MAX_DEPTH are open.
pub fn begin(name: &[u8]) -> Option<usize> {
    EVER_OPENED.store(true, Relaxed);
    with_stack(|s| {
        let frame = s.frames.get_mut(s.depth)?;
        *frame = EMPTY;
        let n = name.len().min(NAME_BYTES - 1);
        frame.name.get_mut(..n)?.copy_from_slice(name.get(..n)?);
        s.depth += 1;
        frame.depth = s.depth as u32;
        Some(s.depth)
    })
    .flatten()
}

/// Closes the innermost scope and returns its figures.
pub fn end() -> Option<ScopeStats> {
    with_stack(|s| {
        s.depth = s.depth.checked_sub(1)?;
        s.frames.get(s.depth).copied()
    })
    .flatten()
}

/// The innermost open scope's figures so far.
pub fn current() -> Option<ScopeStats> {
    with_stack(|s| s.frames.get(s.depth.checked_sub(1)?).copied()).flatten()
}

#[inline]
pub fn on_alloc(bytes: u64) {
    if !EVER_OPENED.load(Relaxed) {
        return;
    }
    let _ = with_stack(|s| {
        for f in s.frames.iter_mut().take(s.depth) {
            f.allocations += 1;
            f.allocated_bytes += bytes;
            f.live_bytes += bytes as i64;
            f.peak_bytes = f.peak_bytes.max(f.live_bytes.max(0) as u64);
        }
    });
}

#[inline]
pub fn on_free(bytes: u64) {
    if !EVER_OPENED.load(Relaxed) {
        return;
    }
    let _ = with_stack(|s| {
        for f in s.frames.iter_mut().take(s.depth) {
            f.frees += 1;
            f.freed_bytes += bytes;
            f.live_bytes -= bytes as i64;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_scopes_count_inner_work_too() {
        assert_eq!(begin(b"epoch"), Some(1));
        on_alloc(100);
        assert_eq!(begin(b"batch"), Some(2));
        on_alloc(50);
        on_free(100);
        let inner = end().unwrap();
        assert_eq!((inner.allocated_bytes, inner.freed_bytes, inner.live_bytes, inner.peak_bytes), (50, 100, -50, 50));
        assert_eq!(&inner.name[..5], b"batch");
        on_alloc(10);
        let outer = end().unwrap();
        assert_eq!((outer.allocations, outer.frees, outer.live_bytes, outer.peak_bytes), (3, 1, 60, 150));
        assert_eq!(end(), None);
    }

    #[test]
    fn depth_is_bounded_and_names_cut() {
        for i in 0..MAX_DEPTH {
            assert_eq!(begin(&[b'x'; 100]), Some(i + 1));
        }
        assert_eq!(begin(b"one too many"), None);
        assert_eq!(current().unwrap().name[NAME_BYTES - 1], 0, "NUL-terminated");
        for _ in 0..MAX_DEPTH {
            end().unwrap();
        }
    }

    #[test]
    fn scopes_are_per_thread() {
        begin(b"main");
        std::thread::spawn(|| {
            assert_eq!(current(), None);
            on_alloc(5);
        })
        .join()
        .unwrap();
        assert_eq!(end().unwrap().allocated_bytes, 0);
    }
}
