//! tensormalloc: a drop-in layer under numpy, PyTorch and any C program. Small requests go on to
//! the next allocator; large ones are served by a cache of recently freed blocks (`host`); CUDA
//! device memory goes to a caching pool (`device`).
//!
//! Layers call downward only: `shim` (extern "C") -> `route` -> `host` / `device` (policy) ->
//! `backing` traits <- `sys` (libc, dlsym, CUDA). The one global state lives here.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic))]

pub mod backing;
pub mod config;
pub mod device;
pub mod history;
pub mod holders;
pub mod holders_report;
pub mod host;
pub mod leaks;
pub mod oom_report;
pub mod pickle;
pub mod ranges;
pub mod report;
// Its callers, the malloc shims, are not built for tests and the no-interpose harnesses.
#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
mod route;
pub mod scopes;
#[cfg(any(test, feature = "no-interpose"))]
pub mod sim;
pub mod snapshot;
pub mod stats;
pub mod sys;
pub mod trace;
pub mod units;

mod shim;

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU8, Ordering};

use config::Config;
use host::layer::HostLayer;
use sys::next::NextAllocator;
use sys::os_pages::{map_table, OsPages};

/// What init resolved: read-only once `INIT_STATE` is `DONE`.
pub struct Globals {
    pub config: Config,
    pub next: NextAllocator,
}

struct InitCell(UnsafeCell<MaybeUninit<Globals>>);
// SAFETY: written once by the initializing thread before INIT_STATE becomes DONE (release),
// read only after observing DONE (acquire).
unsafe impl Sync for InitCell {}

static GLOBALS: InitCell = InitCell(UnsafeCell::new(MaybeUninit::uninit()));
static INIT_STATE: AtomicU8 = AtomicU8::new(UNINIT);
const UNINIT: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const FAILED: u8 = 3;


/// The device layer over the program's own CUDA driver (bound on first use).
pub(crate) static DEVICE: device::layer::DeviceLayer<sys::cuda_driver::CudaDriver> =
    device::layer::DeviceLayer::new(sys::cuda_driver::CudaDriver, map_table, sys::clock::now_ns);

/// The host layer over the kernel's pages.
pub(crate) static HOST: HostLayer<OsPages> = HostLayer::new(
    OsPages,
    map_table,
    sys::clock::now_ns,
    host::layer::Background { on_cached: sys::reaper::on_block_cached, running: sys::reaper::running, wake: sys::reaper::wake },
);

/// The resolved state, initializing on first use. `None` while initialization is under way
/// (a reentrant call from dlsym, or another thread meanwhile): callers use the bootstrap arena.
#[inline]
pub(crate) fn globals() -> Option<&'static Globals> {
    if INIT_STATE.load(Ordering::Acquire) == DONE {
        // SAFETY: DONE is stored only after GLOBALS was written.
        return Some(unsafe { (*GLOBALS.0.get()).assume_init_ref() });
    }
    init_slow()
}

#[cold]
fn init_slow() -> Option<&'static Globals> {
    if INIT_STATE.compare_exchange(UNINIT, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return None;
    }
    let config = read_config();
    // SAFETY: reentrant calls made by dlsym see RUNNING and use the bootstrap arena.
    let Some(next) = (unsafe { NextAllocator::resolve() }) else {
        warn_line!("no next malloc found with dlsym(RTLD_NEXT); serving from a small static arena only");
        INIT_STATE.store(FAILED, Ordering::Release);
        return None;
    };
    sys::memory::read_commit_limit();
    sys::caller::init();
    oom_report::set_printing(config.oom_report);
    HOST.configure(&config, sys::memory::usable_bytes());
    sys::reaper::set_work(background_pass);
    DEVICE.configure(&config);
    route::configure(&config, &next);
    // SAFETY: only this thread writes, and only before publishing DONE.
    unsafe { (*GLOBALS.0.get()).write(Globals { config, next }) };
    INIT_STATE.store(DONE, Ordering::Release);
    globals()
}

/// The trace is flushed at least this often.
const TRACE_FLUSH_NS: u64 = 100_000_000;

/// One pass of the background thread (sys::reaper): idle blocks released and expired, deferred
/// unmaps done, the trace flushed. Returns when the next pass is due.
fn background_pass() -> Option<u64> {
    let deadline = HOST.reap();
    if !trace::enabled() {
        return deadline;
    }
    trace::flush();
    Some(deadline.unwrap_or(u64::MAX).min(sys::clock::now_ns().saturating_add(TRACE_FLUSH_NS)))
}

/// What the trace samples: the host cache's bytes, and of them those lazily freed.
fn trace_sample() -> (u64, u64) {
    let (_, lazily_freed) = HOST.cached_resident();
    (HOST.cached().1 as u64, lazily_freed as u64)
}

fn read_config() -> Config {
    let mut config = Config::default();
    if sys::env::is_secure_execution() {
        return config;
    }
    sys::env::for_each_with_prefix(b"TENSORMALLOC_", |name, value| {
        if let Err(e) = config.apply(name, value) {
            warn_line!("{}", e);
        }
    });
    config
}

#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
/// Runs at load (before main): resolves everything and installs the fork handlers.
extern "C" fn on_load() {
    if let Some(g) = globals() {
        install_fork_handlers();
        if !g.config.trace_path().is_empty() && trace::start(g.config.trace_path(), trace_sample) {
            sys::reaper::start_now();
        }
    }
}

#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
/// Holds the host cache lock across fork(), so the child never inherits it mid-update from a
/// thread that does not exist there. The child forgets the cache, whose blocks it did not
/// inherit (Note [Plain memory]), and restarts its reaper on demand.
fn install_fork_handlers() {
    extern "C" fn prepare() {
        crate::HOST.lock_for_fork();
    }
    extern "C" fn parent() {
        // SAFETY: prepare took the lock on this thread.
        unsafe { crate::HOST.unlock_after_fork() };
    }
    extern "C" fn child() {
        // SAFETY: the child is a copy of the thread that ran prepare.
        unsafe { crate::HOST.unlock_after_fork() };
        crate::HOST.forget_cache_in_child();
        sys::reaper::after_fork_in_child();
        crate::trace::stop_in_child();
    }
    // SAFETY: registers three functions with static lifetime.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
/// Runs at unload or exit, after the program's atexit handlers: the report, if asked for.
extern "C" fn on_unload() {
    if let Some(g) = globals() {
        trace::flush();
        report::at_exit(&g.config);
        if g.config.leaks {
            leaks::report_at_exit();
        }
        if !g.config.snapshot_path().is_empty() {
            snapshot::at_exit(g.config.snapshot_path());
        }
    }
}

#[cfg(not(any(test, feature = "no-interpose")))]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[cfg(not(any(test, feature = "no-interpose")))]
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

/// Rust code in this library allocates through the next allocator directly, never through our
/// own shims: a stray allocation under our lock can then never re-enter the cache.
#[cfg(not(any(test, feature = "no-interpose")))]
mod rust_allocator {
    use core::alloc::{GlobalAlloc, Layout};

    struct NextOnly;

    // SAFETY: forwards to a C allocator that honours the alignment it is asked for.
    unsafe impl GlobalAlloc for NextOnly {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            match crate::globals() {
                Some(g) => g.next.alloc_aligned(layout.align().max(16), layout.size()).cast(),
                None => crate::sys::next::bootstrap_alloc(layout.size(), layout.align()).cast(),
            }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
            if crate::sys::next::is_bootstrap(ptr.cast()) {
                return;
            }
            if let Some(g) = crate::globals() {
                (g.next.free)(ptr.cast());
            }
        }
    }

    #[global_allocator]
    static ALLOCATOR: NextOnly = NextOnly;
}
