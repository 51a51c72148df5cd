//! The `tm_*` C API declared in include/tensormalloc.h.
//
// Note [The API inside our own work]
// The header promises every call at any time, and a signal handler may call one on a thread
// that was inside our own work: holding the cache lock, a pool's, or a gate (Note [Inside our
// own work] in sys/lock.rs). Our locks are not reentrant, so a call there that takes one
// waited for itself for good (tm_get_stats from a SIGALRM handler over a malloc loop hung 3
// runs of 3). Those calls answer at once instead, as if there were nothing to give: the
// figures -1, the holders no row, a trim no byte, the report one line on stderr, the snapshot
// -EDEADLK; tm_set_enabled(0) turns the switch and leaves the cache to the idle release. The
// calls that take no lock (the version, the switch's state, scopes) answer as anywhere. The
// thread that holds the cache lock across a fork is not inside our work for this: the fork's
// handlers, ours and other libraries' run between them, take that lock again at once.

use crate::report::summary::Snapshot;
use core::ffi::{c_char, c_int};

/// This thread is inside our own work: a lock of ours cannot be waited for here.
fn inside_our_work() -> bool {
    crate::sys::lock::held_here() && !crate::state::HOST.fork_held_here()
}

#[no_mangle]
pub extern "C" fn tm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Fills `out` up to `out->size` bytes (the caller sets it to `sizeof(tm_stats_t)`) and sets
/// `size` to what was filled, so a program built against an older, shorter struct keeps
/// working. Returns 0, or -1 when `out` is null or too short to hold the header.
///
/// # Safety
/// `out` points to at least `out->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn tm_get_stats(out: *mut Snapshot) -> c_int {
    if out.is_null() {
        return -1;
    }
    let room = (*out).size;
    if room < 16 || inside_our_work() {
        return -1;
    }
    let mut snap = Snapshot::take();
    snap.size = room.min(core::mem::size_of::<Snapshot>());
    core::ptr::copy_nonoverlapping((&snap as *const Snapshot).cast::<u8>(), out.cast::<u8>(), snap.size);
    0
}

/// The holders table (Note [Holders]): up to `capacity` rows into `out`, `row_size` bytes
/// apart (the caller's `sizeof(tm_holder_t)`), biggest first, the caches last among equals; at
/// most `row_size` bytes of each are written, `size` saying how many. Returns how many rows there
/// are (more than `capacity` when `out` was too short; call again with room for them). `out` may
/// be null when `capacity` is 0.
///
/// # Safety
/// `out` points to `capacity * row_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn tm_get_holders(out: *mut u8, capacity: usize, row_size: usize) -> usize {
    if inside_our_work() {
        return 0;
    }
    // SAFETY: the caller's contract.
    unsafe { crate::report::holders::fill_c_rows(out, capacity, row_size) }
}

/// The call of the headers before TM_HOLDER_VERSION 3: rows of the first layout (96 bytes), so
/// a program built against any earlier header gets no byte past its array.
///
/// # Safety
/// `out` points to `capacity` writable `tm_holder_v1_t`.
#[no_mangle]
pub unsafe extern "C" fn tm_holders(out: *mut crate::report::holders::CHolderRowV1, capacity: usize) -> usize {
    if inside_our_work() {
        return 0;
    }
    // SAFETY: the caller's contract.
    unsafe { crate::report::holders::fill_v1_rows(out, capacity) }
}

/// Gives every cached block (host, device and pinned) back now; returns the bytes released.
#[no_mangle]
pub extern "C" fn tm_trim() -> usize {
    if crate::state::globals().is_none() || inside_our_work() {
        return 0;
    }
    let device = if crate::sys::cuda_driver::is_bound() { crate::state::DEVICE.trim() } else { 0 };
    crate::state::HOST.trim_now() + device as usize
}

/// Gives device `device`'s cached blocks back to the driver now (-1: every device's, and the
/// pinned cache); returns the bytes released. The Python hooks call it after a framework empties
/// its own cache (`torch.cuda.empty_cache()`, CuPy's `free_all_blocks()`).
#[no_mangle]
pub extern "C" fn tm_cuda_trim(device: c_int) -> usize {
    if crate::state::globals().is_none() || !crate::sys::cuda_driver::is_bound() || inside_our_work() {
        return 0;
    }
    let released = match usize::try_from(device) {
        Ok(d) => crate::state::DEVICE.trim_device(d),
        Err(_) => crate::state::DEVICE.trim(),
    };
    usize::try_from(released).unwrap_or(usize::MAX)
}

/// Turns caching on (1) or off (0) at run time; returns the previous setting.
#[no_mangle]
pub extern "C" fn tm_set_enabled(on: c_int) -> c_int {
    if crate::state::globals().is_none() {
        return 0;
    }
    c_int::from(crate::route::set_enabled(on != 0, !inside_our_work()))
}

#[no_mangle]
pub extern "C" fn tm_is_enabled() -> c_int {
    if crate::state::globals().is_none() {
        return 0;
    }
    c_int::from(crate::route::is_enabled())
}

/// Writes the exit report now, to stderr (or the JSON path of TENSORMALLOC_STATS).
#[no_mangle]
pub extern "C" fn tm_print_stats() {
    if inside_our_work() {
        crate::warn_line!("tm_print_stats(): called inside tensormalloc's own work on this thread (a signal handler): no report");
        return;
    }
    if let Some(g) = crate::state::globals() {
        crate::report::stats_file::write_report(&g.config);
    }
}

/// Writes the memory snapshot (Note [Snapshot format] in report/snapshot.rs) to `path`, and the host's
/// to `path` + ".host.pickle". Returns 0, or a negative errno (-EINVAL for a NULL path or one
/// that is not a regular file; -EDEADLK inside our own work: Note [The API inside our own work]).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tm_snapshot(path: *const c_char) -> c_int {
    if path.is_null() {
        return -libc::EINVAL;
    }
    if crate::state::globals().is_none() {
        return -libc::EAGAIN;
    }
    if inside_our_work() {
        return -libc::EDEADLK;
    }
    // The answer is the return value: errno stays as the program left it (the writer's own
    // attempts, an EEXIST from replacing the file, are not the program's).
    let saved = crate::sys::process::SavedErrno::save();
    let answer = match crate::report::snapshot::write(core::ffi::CStr::from_ptr(path).to_bytes()) {
        Ok(()) => 0,
        Err(e) => -e,
    };
    saved.restore();
    answer
}

/// Opens a named scope on this thread (`name` may be NULL); returns its depth, or -1 when
/// 16 scopes are already open.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tm_scope_begin(name: *const c_char) -> c_int {
    let bytes = if name.is_null() { &b""[..] } else { core::ffi::CStr::from_ptr(name).to_bytes() };
    crate::record::scopes::begin(bytes).map_or(-1, |d| d as c_int)
}

/// Closes this thread's innermost scope and writes its figures to `out` (may be NULL).
/// Returns 0, or -1 when no scope is open.
///
/// # Safety
/// `out` is NULL or points to a writable `tm_scope_t`.
#[no_mangle]
pub unsafe extern "C" fn tm_scope_end(out: *mut crate::record::scopes::ScopeStats) -> c_int {
    match crate::record::scopes::end() {
        Some(s) => {
            if !out.is_null() {
                out.write(s);
            }
            0
        }
        None => -1,
    }
}

/// The innermost open scope's figures so far, without closing it. Returns 0, or -1.
///
/// # Safety
/// `out` points to a writable `tm_scope_t`.
#[no_mangle]
pub unsafe extern "C" fn tm_scope_current(out: *mut crate::record::scopes::ScopeStats) -> c_int {
    match (crate::record::scopes::current(), out.is_null()) {
        (Some(s), false) => {
            out.write(s);
            0
        }
        _ => -1,
    }
}
