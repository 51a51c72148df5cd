//! TENSORMALLOC_TRACE=PATH: a compact binary record of large host allocations and frees, device
//! allocations and frees, and memory samples. Allocation paths only claim a slot in a ring
//! (one atomic add) and fill 32 bytes; the reaper thread writes the ring to the file every
//! 100 ms and at exit, off the allocation path. When the writer falls a whole ring behind, new
//! events are dropped and counted, never blocked on.
//!
//! File: the 8 bytes "TMTRACE1", then events of 32 bytes, little-endian:
//! u64 time_ns, u64 size (bytes; RSS for samples), u64 extra (address; cached bytes for samples),
//! u8 kind (0 host, 1 device, 2 sample), u8 op (0 alloc, 1 free), u8 outcome (0 hit, 1 miss,
//! 2 grown), u8 device, u32 pages (samples: the cached bytes lazily freed, MADV_FREE'd and still
//! counted in RSS, in 4 KiB pages; 0 otherwise).

use crate::sys::lock::Lock;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

pub const KIND_HOST: u8 = 0;
pub const KIND_DEVICE: u8 = 1;
pub const KIND_SAMPLE: u8 = 2;
pub const OP_ALLOC: u8 = 0;
pub const OP_FREE: u8 = 1;
pub const HIT: u8 = 0;
pub const MISS: u8 = 1;
pub const GROWN: u8 = 2;

const CAPACITY: u64 = 1 << 18; // 8 MiB of events

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Event {
    time_ns: u64,
    size: u64,
    extra: u64,
    kind: u8,
    op: u8,
    outcome: u8,
    device: u8,
    pages: u32,
}

static ON: AtomicBool = AtomicBool::new(false);
static EVENTS: AtomicPtr<Event> = AtomicPtr::new(core::ptr::null_mut());
/// Per slot: 1 + the index of the event it holds once complete.
static SEQS: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
static HEAD: AtomicU64 = AtomicU64::new(0);
static TAIL: AtomicU64 = AtomicU64::new(0);
static FD: AtomicI32 = AtomicI32::new(-1);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Serializes writers (the reaper and the exit flush); never taken on allocation paths.
static WRITER: Lock<()> = Lock::new(());

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// What a memory sample records besides RSS: (cached bytes, of them lazily freed); given at start.
static SAMPLER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Opens the file and maps the ring; called once at init, with what to sample. False (and a
/// warning) on failure.
pub fn start(path: &[u8], sampler: fn() -> (u64, u64)) -> bool {
    SAMPLER.store(sampler as *mut (), Ordering::Release);
    let mut cpath = [0u8; crate::config::STATS_PATH_MAX + 1];
    let Some(dst) = cpath.get_mut(..path.len()) else { return false };
    dst.copy_from_slice(path);
    // SAFETY: cpath is NUL-terminated.
    let fd = unsafe { libc::open(cpath.as_ptr().cast(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        crate::warn_line!("TENSORMALLOC_TRACE: cannot open {}; no trace", core::str::from_utf8(path).unwrap_or("(path)"));
        return false;
    }
    let events = crate::sys::os_pages::map_table(CAPACITY as usize * core::mem::size_of::<Event>());
    let seqs = crate::sys::os_pages::map_table(CAPACITY as usize * 8);
    let (Some(events), Some(seqs)) = (events, seqs) else {
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        return false;
    };
    crate::sys::stderr::write_all(fd, b"TMTRACE1");
    EVENTS.store(events as *mut Event, Ordering::Release);
    SEQS.store(seqs as *mut AtomicU64, Ordering::Release);
    FD.store(fd, Ordering::Release);
    ON.store(true, Ordering::Release);
    true
}

/// Claims a slot and fills it; drops the event when the ring is full.
pub fn record(kind: u8, op: u8, outcome: u8, device: u8, size: u64, extra: u64) {
    record_with_pages(kind, op, outcome, device, size, extra, 0);
}

fn record_with_pages(kind: u8, op: u8, outcome: u8, device: u8, size: u64, extra: u64, pages: u32) {
    if !enabled() {
        return;
    }
    // Claim an index only when its slot is free: a claimed index must always be completed,
    // or the writer would stop at it.
    let mut index = HEAD.load(Ordering::Acquire);
    loop {
        if index.wrapping_sub(TAIL.load(Ordering::Acquire)) >= CAPACITY {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match HEAD.compare_exchange_weak(index, index + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(now) => index = now,
        }
    }
    let slot = (index % CAPACITY) as usize;
    let event = Event { time_ns: crate::sys::clock::now_ns(), size, extra, kind, op, outcome, device, pages };
    // SAFETY: the ring has CAPACITY slots; slot < CAPACITY; this index is ours alone until
    // its sequence number is published below.
    unsafe {
        EVENTS.load(Ordering::Acquire).add(slot).write(event);
        (*SEQS.load(Ordering::Acquire).add(slot)).store(index + 1, Ordering::Release);
    }
}

/// Writes every completed event to the file, after a memory sample. Called by the reaper
/// every 100 ms and at exit.
pub fn flush() {
    if !enabled() {
        return;
    }
    let _writer = WRITER.lock();
    let sampler = SAMPLER.load(Ordering::Acquire);
    let (cached, lazily_freed) = if sampler.is_null() {
        (0, 0)
    } else {
        // SAFETY: set by start to a `fn() -> (u64, u64)`.
        unsafe { core::mem::transmute::<*mut (), fn() -> (u64, u64)>(sampler)() }
    };
    let pages = u32::try_from(lazily_freed / 4096).unwrap_or(u32::MAX);
    record_with_pages(KIND_SAMPLE, OP_ALLOC, HIT, 0, resident_bytes(), cached, pages);
    let fd = FD.load(Ordering::Acquire);
    let events = EVENTS.load(Ordering::Acquire);
    let seqs = SEQS.load(Ordering::Acquire);
    let mut tail = TAIL.load(Ordering::Acquire);
    loop {
        let slot = (tail % CAPACITY) as usize;
        // SAFETY: slot < CAPACITY.
        let complete = unsafe { (*seqs.add(slot)).load(Ordering::Acquire) } == tail + 1;
        if !complete {
            break;
        }
        // Write the run of complete events up to the ring's end in one call.
        let mut end = tail + 1;
        while !end.is_multiple_of(CAPACITY) && unsafe { (*seqs.add((end % CAPACITY) as usize)).load(Ordering::Acquire) } == end + 1 {
            end += 1;
        }
        let count = (end - tail) as usize;
        // SAFETY: slots [slot, slot + count) are complete events inside the ring.
        let bytes = unsafe { core::slice::from_raw_parts(events.add(slot).cast::<u8>(), count * core::mem::size_of::<Event>()) };
        crate::sys::stderr::write_all(fd, bytes);
        tail = end;
        TAIL.store(tail, Ordering::Release);
    }
}

/// In a forked child: stop tracing (the parent owns the file).
pub fn stop_in_child() {
    ON.store(false, Ordering::Release);
}

/// RSS from /proc/self/statm, without allocating.
fn resident_bytes() -> u64 {
    let mut buf = [0u8; 128];
    // SAFETY: a read of a small proc file into our buffer.
    let n = unsafe {
        let fd = libc::open(c"/proc/self/statm".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return 0;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let text = buf.get(..n.max(0) as usize).unwrap_or(&[]);
    let resident_pages = text.split(|&b| b == b' ').nth(1).and_then(crate::config::parse_u64).unwrap_or(0);
    resident_pages * 4096
}
