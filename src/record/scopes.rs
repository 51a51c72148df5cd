//! Scoped accounting (the DJL NDManager idea for any program): a thread opens a named scope,
//! and every large host block and device block that thread allocates or frees until the scope
//! ends is counted in it and in every scope around it. Per thread, nested up to MAX_DEPTH, in a
//! stack of frames the thread holds while a scope is open (Note [Scopes off the thread's stack]).
//! Small requests are not counted: they belong to the next allocator.
//
// Note [Scopes off the thread's stack]
// The frames were thread-local (1.7 KiB), and glibc carves a preloaded library's thread-local
// storage out of every thread's stack: a thread made with PTHREAD_STACK_MIN (16 KiB) had 1.9 KiB
// less for its own frames in every program, scopes used or not (and a second namespace's glibc,
// under dlmopen, crashed making our thread again). Now a thread keeps only a pointer: its frames
// are a page mapped when it opens its outermost scope and unmapped when that scope ends (two
// system calls a scope, which wraps an epoch or a batch). With no memory for the page, `begin`
// says None, as at MAX_DEPTH. A thread that ends with a scope open leaves its page mapped (4 KiB);
// a forked child has its copy.
//
// Note [Scopes in a signal handler]
// A handler may open and close a scope of its own on a thread that is in the middle of
// `begin` or `end`. The handler's scope, balanced, leaves the depth as it found it; but it
// took the frame the interrupted `begin` was filling, and, finding itself outermost, unmapped
// the page that `begin` then wrote into (SIGSEGV, 3 runs of 3 with a SIGALRM every 200 us). So a
// `begin` claims its frame (the depth) before it writes it, an `end` copies its frame before it
// gives it up, and only a call that no other `begin` or `end` on its thread is under unmaps
// the page or maps one (a nested one finds the page mapped, or says None).

use core::cell::Cell;
use core::sync::atomic::{compiler_fence, AtomicBool, Ordering::Relaxed, Ordering::SeqCst};

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

/// The page a thread's frames take.
const STACK_BYTES: usize = core::mem::size_of::<Stack>().div_ceil(4096) * 4096;

thread_local! {
    /// This thread's frames while it has a scope open; null otherwise. const-initialised, no
    /// Drop: no TLS destructor is registered (glibc would do it with calloc).
    static MINE: Cell<*mut Stack> = const { Cell::new(core::ptr::null_mut()) };
    /// How many `begin`s and `end`s this thread is in (more than one: a signal handler's, Note
    /// [Scopes in a signal handler]).
    static UNDER_WAY: Cell<u32> = const { Cell::new(0) };
}

/// `f` as the only `begin` or `end` under way on this thread (`true`), or nested in one.
fn counted<T>(f: impl FnOnce(bool) -> T) -> T {
    let outer = UNDER_WAY.try_with(|u| {
        u.set(u.get() + 1);
        u.get() == 1
    });
    compiler_fence(SeqCst);
    let out = f(outer == Ok(true));
    compiler_fence(SeqCst);
    let _ = UNDER_WAY.try_with(|u| u.set(u.get().saturating_sub(1)));
    out
}

/// Whether any thread ever opened a scope: until one does, a block's event reads no
/// thread-local storage (a call into the loader's __tls_get_addr from a preloaded library).
static EVER_OPENED: AtomicBool = AtomicBool::new(false);

/// `f` over this thread's frames, if it has a scope open.
fn with_stack<T>(f: impl FnOnce(&mut Stack) -> T) -> Option<T> {
    let stack = MINE.try_with(Cell::get).ok().filter(|p| !p.is_null())?;
    // SAFETY: this thread's own page of frames, mapped while set; no reference escapes `f`.
    Some(f(unsafe { &mut *stack }))
}

/// Maps this thread's frames (zeroed: no scope open); false without memory for them.
fn map_stack() -> bool {
    let Some(addr) = crate::sys::os_pages::map_table(STACK_BYTES) else { return false };
    if MINE.try_with(|m| m.set(addr as *mut Stack)).is_err() {
        // This thread's storage is gone (it is ending): no scope.
        crate::sys::os_pages::unmap_table(addr, STACK_BYTES);
        return false;
    }
    true
}

/// The outermost scope ended: the frames go.
fn unmap_stack() {
    if let Ok(stack) = MINE.try_with(|m| m.replace(core::ptr::null_mut())) {
        if !stack.is_null() {
            crate::sys::os_pages::unmap_table(stack as usize, STACK_BYTES);
        }
    }
}

/// Opens a scope; returns its depth (1 = outermost), or `None` when MAX_DEPTH are open.
pub fn begin(name: &[u8]) -> Option<usize> {
    EVER_OPENED.store(true, Relaxed);
    counted(|alone| {
        if MINE.try_with(Cell::get).ok()?.is_null() && !(alone && map_stack()) {
            return None;
        }
        with_stack(|s| {
            let at = s.depth;
            if at >= MAX_DEPTH {
                return None;
            }
            // Claimed before it is written: a handler's scope takes the next frame.
            s.depth = at + 1;
            compiler_fence(SeqCst);
            let frame = s.frames.get_mut(at)?;
            *frame = ScopeStats { depth: at as u32 + 1, ..EMPTY };
            let n = name.len().min(NAME_BYTES - 1);
            frame.name.get_mut(..n)?.copy_from_slice(name.get(..n)?);
            Some(at + 1)
        })
        .flatten()
    })
}

/// Closes the innermost scope and returns its figures.
pub fn end() -> Option<ScopeStats> {
    counted(|alone| {
        let (ended, outermost) = with_stack(|s| {
            let at = s.depth.checked_sub(1)?;
            // Copied before it is given up: a handler's scope would take it.
            let ended = s.frames.get(at).copied()?;
            compiler_fence(SeqCst);
            s.depth = at;
            Some((ended, at == 0))
        })
        .flatten()?;
        if outermost && alone {
            unmap_stack();
        }
        Some(ended)
    })
}

/// The innermost open scope's figures so far.
pub fn current() -> Option<ScopeStats> {
    with_stack(|s| s.frames.get(s.depth.checked_sub(1)?).copied()).flatten()
}

/// Whether any thread ever opened a scope (until then no event goes to one).
#[inline(always)]
pub fn ever_opened() -> bool {
    EVER_OPENED.load(Relaxed)
}

#[inline]
pub fn on_alloc(bytes: u64) {
    if !ever_opened() {
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
    if !ever_opened() {
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
    fn a_thread_has_frames_only_while_a_scope_is_open() {
        let _serial = serial();
        std::thread::spawn(|| {
            let frames = || MINE.with(Cell::get);
            assert!(frames().is_null());
            assert_eq!(begin(b"outer"), Some(1));
            let mapped = frames();
            assert_eq!(begin(b"inner"), Some(2));
            assert_eq!(frames(), mapped, "one page for both");
            end().unwrap();
            assert_eq!(frames(), mapped);
            end().unwrap();
            assert!(frames().is_null(), "unmapped with the outermost");
            assert_eq!((end(), current()), (None, None));
            assert_eq!(begin(b"again"), Some(1), "fresh frames: depth 1");
            end().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn many_threads_each_have_their_scope() {
        let _serial = serial();
        let opened: Vec<_> = (0..300)
            .map(|i| {
                std::thread::spawn(move || {
                    let depth = begin(b"own");
                    on_alloc(i);
                    let seen = end().map(|s| s.allocated_bytes);
                    (depth, seen)
                })
            })
            .collect();
        for (i, t) in opened.into_iter().enumerate() {
            assert_eq!(t.join().unwrap(), (Some(1), Some(i as u64)));
        }
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
