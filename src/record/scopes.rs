//! Scoped accounting (the DJL NDManager idea for any program): a thread opens a named scope,
//! and every large host block and device block that thread allocates or frees until the scope
//! ends is counted in it and in every scope around it. Per thread, nested up to MAX_DEPTH, in a
//! stack of frames the thread holds while a scope is open (Note [Scopes off the thread's stack]).
//! Small requests are not counted: they belong to the next allocator.
//
// Note [Scopes off the thread's stack]
// The frames were thread-local (1.7 KiB), and glibc carves a preloaded library's thread-local
// storage out of every thread's stack: a thread made with PTHREAD_STACK_MIN (16 KiB) had 1.9 KiB
// less for its own frames in every program, scopes used or not. Now a thread holds only a slot
// number, and takes one of SLOTS stacks of frames when it opens its outermost scope, giving it
// back when that scope ends. With every slot taken a scope is refused (`begin` says None, as at
// MAX_DEPTH); a thread that ends with a scope open, and in a forked child the other threads of
// the parent, keep theirs.

use core::cell::{Cell, UnsafeCell};
use core::sync::atomic::{AtomicBool, Ordering::{Acquire, Relaxed, Release}};

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

/// How many threads may have a scope open at once.
pub const SLOTS: usize = 128;

struct Slot {
    taken: AtomicBool,
    stack: UnsafeCell<Stack>,
}

// SAFETY: a slot's stack is used only by the thread that took it (`taken`), until it gives it back.
unsafe impl Sync for Slot {}

static STACKS: [Slot; SLOTS] = {
    // A constant only to repeat it in the array: each slot is its own static from here on.
    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: Slot = Slot { taken: AtomicBool::new(false), stack: UnsafeCell::new(Stack { frames: [EMPTY; MAX_DEPTH], depth: 0 }) };
    [FREE; SLOTS]
};

thread_local! {
    /// The slot this thread holds, plus one; 0 for none. const-initialised, no Drop: no TLS
    /// destructor is registered (glibc would do it with calloc).
    static MINE: Cell<usize> = const { Cell::new(0) };
}

/// Whether any thread ever opened a scope: until one does, a block's event reads no
/// thread-local storage (a call into the loader's __tls_get_addr from a preloaded library).
static EVER_OPENED: AtomicBool = AtomicBool::new(false);

/// `f` over this thread's stack of frames, if it holds one.
fn with_stack<T>(f: impl FnOnce(&mut Stack) -> T) -> Option<T> {
    let slot = MINE.try_with(Cell::get).ok()?.checked_sub(1)?;
    // SAFETY: this thread took the slot, and no reference to its stack escapes `f`.
    Some(f(unsafe { &mut *STACKS.get(slot)?.stack.get() }))
}

/// Takes a free slot for this thread, its stack empty; false when all are taken.
fn take_slot() -> bool {
    let Some(slot) = STACKS.iter().position(|s| !s.taken.load(Relaxed) && !s.taken.swap(true, Acquire)) else { return false };
    let Some(s) = STACKS.get(slot) else { return false };
    // SAFETY: the slot is this thread's from the swap on.
    unsafe { (*s.stack.get()).depth = 0 };
    if MINE.try_with(|m| m.set(slot + 1)).is_err() {
        // This thread's storage is gone (it is ending): no scope, and the slot stays free.
        s.taken.store(false, Release);
        return false;
    }
    true
}

/// The outermost scope ended: the slot goes back.
fn give_slot_back() {
    if let Ok(Some(slot)) = MINE.try_with(|m| m.replace(0).checked_sub(1)) {
        if let Some(s) = STACKS.get(slot) {
            s.taken.store(false, Release);
        }
    }
}

/// Opens a scope; returns its depth (1 = outermost), or `None` when MAX_DEPTH are open.
pub fn begin(name: &[u8]) -> Option<usize> {
    EVER_OPENED.store(true, Relaxed);
    if MINE.try_with(Cell::get).ok()? == 0 && !take_slot() {
        return None;
    }
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
    let (ended, outermost) = with_stack(|s| {
        s.depth = s.depth.checked_sub(1)?;
        Some((s.frames.get(s.depth).copied()?, s.depth == 0))
    })
    .flatten()?;
    if outermost {
        give_slot_back();
    }
    Some(ended)
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

    /// The slots are the process's: tests that count them take turns.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn nested_scopes_count_inner_work_too() {
        let _serial = serial();
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
        let _serial = serial();
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
    fn a_thread_holds_a_slot_only_while_a_scope_is_open() {
        let _serial = serial();
        std::thread::spawn(|| {
            let taken = || STACKS.iter().filter(|s| s.taken.load(Relaxed)).count();
            let before = taken();
            assert_eq!(begin(b"outer"), Some(1));
            assert_eq!(begin(b"inner"), Some(2));
            assert_eq!(taken(), before + 1, "one slot for both");
            end().unwrap();
            assert_eq!(taken(), before + 1);
            end().unwrap();
            assert_eq!(taken(), before, "given back with the outermost");
            assert_eq!((end(), current()), (None, None));
            assert_eq!(begin(b"again"), Some(1), "a fresh stack: depth 1");
            end().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn with_every_slot_taken_a_scope_is_refused() {
        let _serial = serial();
        let (hold, release) = (std::sync::Barrier::new(SLOTS + 1), std::sync::Barrier::new(SLOTS + 1));
        std::thread::scope(|sc| {
            let (hold, release) = (&hold, &release);
            let opened: Vec<_> = (0..SLOTS)
                .map(|_| {
                    sc.spawn(move || {
                        let got = begin(b"held");
                        hold.wait();
                        release.wait();
                        end().unwrap();
                        got
                    })
                })
                .collect();
            hold.wait();
            assert_eq!(begin(b"one more"), None);
            release.wait();
            assert!(opened.into_iter().all(|t| t.join().unwrap() == Some(1)));
        });
        assert_eq!(begin(b"after"), Some(1));
        end().unwrap();
    }

    #[test]
    fn scopes_are_per_thread() {
        let _serial = serial();
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
