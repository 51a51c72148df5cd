//! The one global state: what init resolved (`Globals`: the configuration and the next
//! allocator), the host layer (`HOST`), the device layer (`DEVICE`), and the background pass.
//! Initialized on first use, from any entry point, before main or after exit handlers began;
//! calls the layers and sys below it, never the shims, routes or reports above.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};

use crate::config::Config;
use crate::device::device_layer::DeviceLayer;
use crate::device::neighbours;
use crate::host::host_layer::{Background, HostLayer};
use crate::record::trace;
use crate::sys::cuda_backing::CudaDriver;
use crate::sys::next::NextAllocator;
use crate::sys::os_pages::{map_table, OsPages};
use crate::sys::{clock, reaper};

/// What init resolved: read-only once `INIT_STATE` is `DONE`.
pub struct Globals {
    pub config: Config,
    pub next: NextAllocator,
    /// The environment fixes glibc's mmap or trim thresholds (config/glibc.rs).
    pub glibc_thresholds_fixed: bool,
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
pub(crate) static DEVICE: DeviceLayer<CudaDriver> = DeviceLayer::new(CudaDriver, map_table, clock::now_ns);

/// The host layer over the kernel's pages.
pub(crate) static HOST: HostLayer<OsPages> = HostLayer::new(
    OsPages,
    map_table,
    clock::coarse_ns,
    Background { on_cached: reaper::on_block_cached, running: reaper::running, wake: reaper::wake },
);

/// Before our thread is made for a block just cached, in the freeing thread: the limits looked
/// at, so the first block cached after a quiet spell does not stay under a limit set meanwhile
/// (strict overcommit switched on), even until the thread's first pass (Note [Room for others] in
/// host/host_layer/release.rs). Files read on a stack of ours: the caller's may be small.
fn before_thread_start() {
    crate::sys::stack::on_own_stack_quiet(|| call(&LIMITS_WATCH));
}

// Note [Memory debuggers]
// glibc's malloc debugging library is loaded only when asked for (LD_PRELOAD or
// -lc_malloc_debug: MALLOC_CHECK_, mcheck, mtrace): its user is hunting a memory bug, and its
// checks read glibc's chunk headers around every block. Beside it our blocks were wrong for it:
// in front of us, its malloc_usable_size read before one of ours (SIGSEGV), and MALLOC_CHECK_
// rejected them (`ls` aborted); behind us, it never saw them (mprobe of a valid block aborted,
// mtrace reported no leak). So with it loaded we step aside, as under TENSORMALLOC_DISABLE=1,
// and say so in one line; with Note [Versioned interposers] its functions are the next
// allocator's or the one in front. Likewise for glibc's perturbation (MALLOC_PERTURB_, the
// glibc.malloc.perturb tunable, mallopt(M_PERTURB) in route/control.rs): it fills every block at
// malloc and free to expose reads of uninitialized or freed memory, which our large blocks
// (fresh zero pages, or the previous owner's bytes) would hide.

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
    // First: what tells us which object holds an address (sys::dlsym::object_of), which the
    // lookups below ask about 160 times.
    crate::sys::caller::init();
    let mut config = read_config();
    // Note [Memory debuggers].
    if !config.disabled && crate::sys::dlsym::glibc_malloc_debug_loaded() {
        config.disabled = true;
        crate::warn_line!("glibc's malloc debugging library (libc_malloc_debug.so) is loaded: tensormalloc steps aside, as under TENSORMALLOC_DISABLE=1, so that its checks see every block");
    } else if !config.disabled && glibc_perturbs() {
        config.disabled = true;
        crate::warn_line!("MALLOC_PERTURB_ (or glibc.malloc.perturb) is set: tensormalloc steps aside, as under TENSORMALLOC_DISABLE=1, so that glibc perturbs every block");
    }
    // SAFETY: reentrant calls made by dlsym see RUNNING and use the bootstrap arena.
    let Some(next) = (unsafe { NextAllocator::resolve() }) else {
        crate::warn_line!("no next malloc found with dlsym(RTLD_NEXT); serving from a small static arena only");
        INIT_STATE.store(FAILED, Ordering::Release);
        return None;
    };
    crate::sys::memory::read_commit_limit();
    crate::sys::page_calls::resolve_next();
    let (memory_bytes, in_limited_cgroup) = crate::sys::memory::usable_bytes();
    HOST.configure(&config, memory_bytes, in_limited_cgroup);
    reaper::set_work(background_pass);
    reaper::set_before_start(before_thread_start);
    // Note [No thread to release]: nothing stays cached that no thread would release.
    reaper::set_alone(|| {
        HOST.trim();
    });
    DEVICE.configure(&config);
    DEVICE.set_background(reaper::on_block_cached);
    neighbours::configure(|device, idle_since_ns| DEVICE.release_for_neighbour(device, idle_since_ns), config.cuda_neighbour_wait_ms);
    DEVICE.set_neighbours(segment_mapped, neighbours::ask);
    let glibc_thresholds_fixed = glibc_thresholds_fixed();
    // SAFETY: only this thread writes, and only before publishing DONE.
    unsafe { (*GLOBALS.0.get()).write(Globals { config, next, glibc_thresholds_fixed }) };
    INIT_STATE.store(DONE, Ordering::Release);
    globals()
}

/// A pool mapped a segment on `device`: the exit hook is registered (the first time), and the
/// neighbours may ask this process from now on.
fn segment_mapped(device: i32) {
    static REGISTERED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
    if !REGISTERED.swap(true, Ordering::AcqRel) {
        // Note [No driver call after exit] (device/device_layer/give_back.rs): registered now,
        // after the driver set up its own teardown, it runs before that teardown.
        crate::sys::thread::at_exit(at_exit);
    }
    neighbours::join(device);
}

/// How long exit waits for a background batch under way to finish its driver calls.
const EXIT_WAIT_NS: u64 = 2_000_000_000;

/// At exit (Note [No driver call after exit]): the background thread and the neighbours'
/// answering thread make no driver call from here on.
extern "C" fn at_exit() {
    neighbours::stop();
    DEVICE.stop_background(EXIT_WAIT_NS);
}

/// The process this one was forked from with us loaded (0: none): its numbers start at the fork.
static FORKED_FROM: AtomicU32 = AtomicU32::new(0);

/// In a forked child: the host layer's numbers become the child's own from here.
// Its caller, the fork handler, is not built for tests and the no-interpose harnesses.
#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
pub(crate) fn forked_from(parent: u32) {
    FORKED_FROM.store(parent, Ordering::Relaxed);
    HOST.stats.restart_in_child();
}

/// The process this one was forked from, if it was (with us loaded).
pub(crate) fn parent_at_fork() -> Option<u32> {
    Some(FORKED_FROM.load(Ordering::Relaxed)).filter(|&p| p != 0)
}

/// The trace is flushed at least this often.
const TRACE_FLUSH_NS: u64 = 100_000_000;

/// One pass of the background thread (sys::reaper): idle blocks released and expired, deferred
/// unmaps done, idle device segments given back, the trace flushed. Returns when the next pass
/// is due.
/// What the background pass calls to follow the process's limits (the route's, set when it is
/// ready: a limit another process sets with prlimit is seen within a pass).
static LIMITS_WATCH: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn watch_limits(f: fn()) {
    LIMITS_WATCH.store(f as usize, Ordering::Release);
}

/// What the background pass calls about every second to keep the outputs current (the exit
/// hooks' side: the JSON kept in the stats file, Note [Numbers that survive]).
static KEEP_CURRENT: AtomicUsize = AtomicUsize::new(0);

/// How often outputs are kept current.
const KEEP_CURRENT_NS: u64 = 1_000_000_000;

// Its caller, the load hook, is not built for tests and the no-interpose harnesses.
#[cfg_attr(any(test, feature = "no-interpose"), allow(dead_code))]
pub(crate) fn keep_current(f: fn()) {
    KEEP_CURRENT.store(f as usize, Ordering::Release);
}

/// Calls the fn() stored in `slot`, if any.
fn call(slot: &AtomicUsize) -> bool {
    let f = slot.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: only `watch_limits` and `keep_current` store in these slots, and they store a fn().
        unsafe { core::mem::transmute::<usize, fn()>(f)() };
    }
    f != 0
}

fn background_pass() -> Option<u64> {
    call(&LIMITS_WATCH);
    let deadline = match (HOST.reap(), DEVICE.release_idle()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let deadline = if call(&KEEP_CURRENT) {
        Some(deadline.unwrap_or(u64::MAX).min(clock::now_ns().saturating_add(KEEP_CURRENT_NS)))
    } else {
        deadline
    };
    if !trace::enabled() {
        return deadline;
    }
    trace::flush();
    Some(deadline.unwrap_or(u64::MAX).min(clock::now_ns().saturating_add(TRACE_FLUSH_NS)))
}

/// Whether the environment asks glibc to perturb memory (config/glibc.rs); setuid programs' is
/// not read, as glibc ignores it there.
fn glibc_perturbs() -> bool {
    use crate::config::glibc::{perturb_setting, perturbs};
    if crate::sys::env::is_secure_execution() {
        return false;
    }
    // The first entry of each name, as getenv reads it.
    let first = |wanted: &[u8]| {
        let mut setting = None;
        let mut seen = false;
        crate::sys::env::for_each_with_prefix(wanted, |name, value| {
            if name == wanted && !seen {
                seen = true;
                setting = perturb_setting(name, value);
            }
        });
        setting
    };
    perturbs(first(b"GLIBC_TUNABLES"), first(b"MALLOC_PERTURB_"))
}

/// Whether the environment fixes glibc's mmap or trim thresholds, which stops glibc sliding
/// them (config/glibc.rs); setuid programs' is not read, as glibc ignores it there.
fn glibc_thresholds_fixed() -> bool {
    if crate::sys::env::is_secure_execution() {
        return false;
    }
    let mut fixed = false;
    for prefix in [&b"MALLOC_"[..], b"GLIBC_TUNABLES"] {
        crate::sys::env::for_each_with_prefix(prefix, |name, value| fixed |= crate::config::glibc::fixes_thresholds(name, value));
    }
    fixed
}

fn read_config() -> Config {
    if crate::sys::env::is_secure_execution() {
        return Config::default();
    }
    Config::from_vars(|visit| crate::sys::env::for_each_with_prefix(b"TENSORMALLOC_", visit), |e| crate::warn_line!("{}", e))
}
