//! The library's life in a process: what runs at load (init, the fork handlers, the trace), at
//! fork (the host cache lock held across it), and at exit (the reports), and the Rust
//! allocator of this library's own code. Only in the real library, like every shim.

use crate::record::trace;
use crate::report;
use crate::state::{globals, DEVICE, HOST};
use crate::sys;

/// Runs at load (before main): resolves everything and installs the fork handlers.
extern "C" fn on_load() {
    if let Some(g) = globals() {
        crate::record::on_out_of_memory(report::oom::on_out_of_memory);
        sys::lock::at_fork(before_fork, after_fork_in_parent, after_fork_in_child);
        // Note [Reports after every finalizer].
        sys::thread::at_exit_of_process(on_exit);
        sys::fork_mark::set_adoption(adopt_parent_records);
        // At load, not at the first fork or thread: a child made without our handlers must know
        // it is one even when its parent forked before its first large block (Note [A child in
        // our memory] in sys/reaper.rs tells such a child from one sharing our memory by it).
        sys::fork_mark::arm();
        sys::process::note_start();
        // Note [No thread inside another allocator's call]: whether one stands in front of us,
        // asked here, outside every allocation call.
        sys::front::resolve_at_load();
        // Note [Born with signals blocked].
        sys::thread::resolve_at_load();
        if !g.config.trace_path().is_empty() && trace::start(g.config.trace_path(), trace_sample) {
            sys::reaper::start_now();
        }
        // Note [Numbers that survive]: the counters' file, made at the first event.
        report::stats_file::start(&g.config);
    }
}

/// What the trace samples: the host cache's bytes, and of them those lazily freed.
fn trace_sample() -> (u64, u64) {
    let (_, lazily_freed) = HOST.cached_resident();
    (HOST.cached().1 as u64, lazily_freed as u64)
}

// Hold the host cache lock across fork(), so the child never inherits it mid-update from a
// thread that does not exist there. The child forgets the cache, whose blocks it did not
// inherit (Note [Plain memory]), and restarts its reaper on demand.
extern "C" fn before_fork() {
    // Cached blocks are kept from children from here on: a child made without this handler must
    // know it (Note [Children our handlers did not see] in sys/fork_mark.rs).
    sys::fork_mark::arm();
    // A child made without our handlers that forks in turn adopts first: the lock may be held
    // by a thread of its parent.
    sys::fork_mark::check();
    // Note [A stack before the fork] (sys/stack.rs).
    sys::stack::map_before_fork();
    HOST.lock_for_fork();
}

extern "C" fn after_fork_in_parent() {
    // SAFETY: before_fork took the lock on this thread.
    unsafe { HOST.unlock_after_fork() };
}

extern "C" fn after_fork_in_child() {
    if !sys::fork_mark::claim_in_child() {
        // Another library's child handler, run before ours, allocated: that adopted the
        // parent's records, the fork's hold on the cache lock included; this thread holds no
        // lock of ours now (Note [Inside our own work]).
        sys::lock::fork_hold_let_go();
        return;
    }
    // SAFETY: the child is a copy of the thread that ran before_fork.
    unsafe { HOST.unlock_after_fork() };
    child_steps();
}

/// A child our fork handlers did not see (`_Fork`, a raw fork or clone system call) does what
/// our child handler would have, before it uses the parent's records (Note [Children our
/// handlers did not see] in sys/fork_mark.rs).
fn adopt_parent_records() {
    // SAFETY: the adopting thread runs this before any other can take the lock.
    unsafe { HOST.free_lock_in_child() };
    child_steps();
}

/// What a child does with the parent's state once the cache lock is its own.
fn child_steps() {
    sys::process::note_parent_in_child();
    HOST.forget_cache_in_child();
    crate::state::forked_from(sys::process::parent_id());
    crate::record::ledger::restart_in_child(sys::process::parent_id(), HOST.stats.live.current(), HOST.stats.live_blocks.current());
    report::stats_file::after_fork_in_child();
    report::oom::after_fork_in_child();
    sys::stack::after_fork_in_child();
    sys::unmap_later::WAITING.forget_in_child();
    if let Some(h) = crate::record::holders::table() {
        h.after_fork_in_child();
    }
    crate::device::ipc::OPENED.forget_in_child();
    if DEVICE.after_fork_in_child() {
        // Note [Forked children]: the parent's device and pinned blocks are not this process's.
        if let Some(h) = crate::record::holders::table() {
            for place in (0..crate::record::holders::PLACES as u8).filter(|&p| p != crate::record::holders::PLACE_HOST) {
                h.forget_place(place);
            }
        }
    }
    sys::reaper::after_fork_in_child();
    crate::device::neighbours::after_fork_in_child();
    crate::device::ipc::channel::after_fork_in_child();
    sys::process::note_start();
    if let Some(g) = globals() {
        trace::restart_in_child();
        if trace::enabled() || g.config.stats == crate::config::StatsOutput::Json {
            sys::reaper::start_now();
        }
    }
}

// Note [Reports after every finalizer]
// The reports at exit (leaks, the stats, the snapshot, the trace's end) must see what the
// program frees as it ends. Run from our .fini_array, or from an exit handler of this library's
// own (atexit passes the library's handle, and glibc runs such handlers when it finalizes the
// library), they came before the finalizers of the libraries loaded ahead of us: a C++ library
// linked into the program, whose global objects' destructors and exit handlers its finalizer
// runs, freed 104 MiB after our leak report had listed it. So the hook is an exit handler of
// the process (no library handle), registered at load: a preloaded library's constructor runs
// before glibc registers the loader's finalizers (`_dl_fini`, itself an exit handler), and exit
// handlers run newest first, so ours comes after every library's finalizers and after the
// program's own exit handlers. The library is never unloaded (-z nodelete), so the handler is
// there at exit. Loaded later by path (dlopen), it runs before the finalizers instead.

// Note [Exit from inside our work]
// A program may call exit from a signal handler (a SIGTERM or timer handler: not async-signal-
// safe, but glibc alone gets through it), and the signal may have landed inside one of our calls,
// which then never resumes: a lock it held stays held. The reports at exit take the cache's lock
// for their figures, so such an exit waited on its own thread for good (6 to 9 exits in 10 with
// TENSORMALLOC_STATS or a trace on). When the exiting thread is inside our own work
// (`held_here`), the trace still gets its END record, without the figures that need the lock,
// and the reports are not written: one line says so. What the counters' file holds stays
// readable (`tensormalloc report`).

/// At exit, after every finalizer (Note [Reports after every finalizer]): the reports asked
/// for, in whatever thread called exit, which a pending cancellation must not stop halfway
/// (Note [Cancellation points] in sys/cancel.rs).
extern "C" fn on_exit(_: *mut core::ffi::c_void) {
    if let Some(g) = globals().filter(|g| trace::is_on() || report::due_at_exit(&g.config)) {
        let inside_our_work = sys::lock::held_here();
        // On a stack of our own: the thread may have a small one (Note [A stack of our own]).
        sys::cancel::cancel_held(|| {
            sys::stack::on_own_stack(|| {
                trace::finish();
                if inside_our_work {
                    if report::due_at_exit(&g.config) {
                        crate::warn_line!("the process exits from inside one of its allocations (exit from a signal handler): the reports at exit are not written");
                    }
                } else {
                    report::at_exit(&g.config);
                }
            })
        });
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Rust code in this library allocates through the next allocator directly, never through our
/// own shims: a stray allocation under our lock can then never re-enter the cache.
mod rust_allocator {
    use core::alloc::{GlobalAlloc, Layout};

    struct NextOnly;

    // SAFETY: forwards to a C allocator that honours the alignment it is asked for.
    unsafe impl GlobalAlloc for NextOnly {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            match crate::state::globals() {
                Some(g) => g.next.alloc_aligned(layout.align().max(16), layout.size()).cast(),
                None => crate::sys::next::bootstrap_alloc(layout.size(), layout.align()).cast(),
            }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
            if crate::sys::next::is_bootstrap(ptr.cast()) {
                return;
            }
            if let Some(g) = crate::state::globals() {
                (g.next.free)(ptr.cast());
            }
        }
    }

    #[global_allocator]
    static ALLOCATOR: NextOnly = NextOnly;
}
