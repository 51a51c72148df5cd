//! The out-of-memory report: when a device allocation finally fails (after the pool gave its
//! cache back and retried) or a large host mapping fails that some limit could have allowed,
//! one report on stderr: the request, what the device or the limits say, the pool's figures,
//! the largest free block against the request, the holders table, and the settings that would
//! help. Written from a static buffer with write(2): nothing here allocates (out of memory is when
//! it must work), and little of the failing thread's stack is used (Note [A report off the
//! stack]). At most one report per 10 seconds; the ones left out are counted in the next.
//! The last failure's figures also go into the JSON stats (`last_oom`).
//
// Note [Reports unasked]
// A malloc that returns NULL is part of C: a program that probes how much it may map, or a daemon
// under ulimit that handles the failure, gets NULL from glibc and nothing on stderr. Printing our
// report there by default put twelve lines on a stderr the program may use for its own output (a
// daemon that closed fds 0-2 has its data file as fd 2: the report went into the middle of it).
// So a host failure is reported only when asked (TENSORMALLOC_OOM_REPORT=1); it is recorded for
// the JSON stats either way. A device allocation that fails after the pool gave back what it
// could is reported by default: there the question a user asks (who holds the GPU's memory?)
// has no other answer, and the framework above raises its own error beside ours.
//
// Note [A report the program recovers from]
// PyTorch's caching allocator meets a failed cudaMalloc by freeing its own cache and asking
// again: under the preload our report (printed at the first failure) then put twelve lines on
// stderr though the program went on, at every such retry of a training loop. So when the caller
// is PyTorch's allocator (libc10_cuda.so) the report is written at the failure, with the figures
// and holders of that moment, but held: it is printed at the next failure (the retry failed too,
// or another), or at exit; it is dropped when a device block at least as large is served on that
// device first (the program recovered). Any other caller's report is printed at once.

// Note [A report off the stack]
// The report is 12 KiB of text and a 4 KiB holders table, and the thread whose malloc failed may
// have a small stack: PTHREAD_STACK_MIN is 16 KiB, and a thread made with it (glibc's malloc
// needs a few hundred bytes of it) died of a stack overflow in the report. So the text and the
// table live in a static scratch, one report at a time (a report that finds it busy is counted as
// left out, as one inside the 10 seconds is); a forked child starts with it free.

use crate::record::holders::{device_place, PLACE_HOST};
use crate::config::OomReport;
use crate::record::OutOfMemory;
use crate::report::holders::{PlaceName, Table};
use crate::sys::stderr::StackWriter;
use crate::report::units::Bytes;
use crate::state::{DEVICE, HOST};
use core::fmt::{self, Write};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::{Acquire, Relaxed, Release}};

const EVERY_NS: u64 = 10_000_000_000;
static LAST_REPORT_NS: AtomicU64 = AtomicU64::new(0);
static LEFT_OUT: AtomicU64 = AtomicU64::new(0);

/// The report's text and holders table (Note [A report off the stack]), used by the one thread
/// that set SCRATCH_BUSY.
struct Scratch(UnsafeCell<(StackWriter<REPORT_TEXT_BYTES>, Table)>);
// SAFETY: only the thread that turned SCRATCH_BUSY from false to true touches the contents,
// until it turns it back.
unsafe impl Sync for Scratch {}
const REPORT_TEXT_BYTES: usize = 12288;
static SCRATCH: Scratch = Scratch(UnsafeCell::new((StackWriter::new(), Table::empty())));
static SCRATCH_BUSY: AtomicBool = AtomicBool::new(false);
/// The scratch holds a device report not printed yet (Note [A report the program recovers
/// from]); SCRATCH_BUSY stays set meanwhile. Changed only by whoever swaps it.
static HELD: AtomicBool = AtomicBool::new(false);

/// In a forked child: a report the parent was writing, or holds, is not this process's.
pub fn after_fork_in_child() {
    // Written only when set: every page a child handler writes is a copy-on-write fault.
    if SCRATCH_BUSY.load(Relaxed) {
        SCRATCH_BUSY.store(false, Release);
    }
    if HELD.load(Relaxed) {
        HELD.store(false, Relaxed);
        crate::record::retry_came();
    }
}

/// A held report (Note [A report the program recovers from]): printed unless the program's
/// retry was served meanwhile; the scratch is free after. `at_exit` and each new failure call it.
/// Whether a report is held back (`settle_held` has one to settle).
pub fn holds_report() -> bool {
    HELD.load(Acquire)
}

pub fn settle_held() {
    if !HELD.swap(false, Acquire) {
        return;
    }
    if crate::record::retry_came() {
        // Recovered: said nowhere, and the next failure is not held back by this one.
        LAST_REPORT_NS.store(0, Relaxed);
    } else {
        // SAFETY: the scratch is ours while HELD was set (SCRATCH_BUSY stayed set).
        let (w, _) = unsafe { &mut *SCRATCH.0.get() };
        w.flush_to(2);
    }
    SCRATCH_BUSY.store(false, Release);
}

/// The last failure, for the JSON stats: place + 1 (0: none yet), request, then the figures.
static LAST: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// What the report says of a failure, gathered before writing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    pub place: u8,
    pub request_bytes: u64,
    /// Device: the driver's total and free memory (0, 0 when it cannot say). Host: the
    /// mapping limit (u64::MAX when none) and 0.
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Device: the pool's reserved, live and cached bytes; host: live large blocks and the cache.
    pub reserved_bytes: u64,
    pub live_bytes: u64,
    pub cached_bytes: u64,
    /// The largest free block the pool holds (fragmentation).
    pub largest_free_bytes: u64,
    /// Device: a graph capture was under way, so the pool could not give its cache back.
    pub capture_kept_cache: bool,
}

impl Failure {
    /// Enough is cached for the request, but no free block is as large.
    fn fragmented(&self) -> bool {
        self.cached_bytes >= self.request_bytes && self.largest_free_bytes < self.request_bytes
    }

    /// Device memory in use that is not the pool's: total - free - reserved.
    fn outside_pool_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.free_bytes).saturating_sub(self.reserved_bytes)
    }

    fn store(&self) {
        let fields = [u64::from(self.place) + 1, self.request_bytes, self.total_bytes, self.free_bytes, self.reserved_bytes, self.live_bytes, self.cached_bytes, self.largest_free_bytes];
        for (slot, v) in LAST.iter().zip(fields) {
            slot.store(v, Relaxed);
        }
    }

    /// The last failure recorded, if any.
    pub fn last() -> Option<Failure> {
        let v: [u64; 8] = core::array::from_fn(|i| LAST.get(i).map_or(0, |a| a.load(Relaxed)));
        let [place, request_bytes, total_bytes, free_bytes, reserved_bytes, live_bytes, cached_bytes, largest_free_bytes] = v;
        (place != 0).then(|| Failure { place: (place - 1) as u8, request_bytes, total_bytes, free_bytes, reserved_bytes, live_bytes, cached_bytes, largest_free_bytes, capture_kept_cache: false })
    }
}

/// The out-of-memory event's listener (record::on_out_of_memory, registered at load): the
/// event with its place's figures, recorded for the JSON stats and reported.
pub fn on_out_of_memory(e: &OutOfMemory) {
    let mut f = Failure { place: e.place, request_bytes: e.request_bytes, total_bytes: e.total_bytes, ..Default::default() };
    if e.place == PLACE_HOST {
        f.live_bytes = HOST.stats.live.current();
        f.cached_bytes = HOST.cached().1 as u64;
    } else {
        (f.free_bytes, f.capture_kept_cache) = (e.free_bytes, e.capture_kept_cache);
        DEVICE.for_each_pool(|d, pool| {
            if device_place(d) == e.place {
                (f.reserved_bytes, f.live_bytes) = (pool.stats.reserved_bytes, pool.stats.live_bytes);
                f.cached_bytes = pool.cached_bytes();
                f.largest_free_bytes = pool.largest_free_bytes();
            }
        });
    }
    report(&f, e.cap_bytes, e.caller_retries);
}

fn report(f: &Failure, cap_bytes: Option<u64>, caller_retries: bool) {
    f.store();
    settle_held();
    // Recorded for the JSON stats; printed as TENSORMALLOC_OOM_REPORT says (Note [Reports unasked]).
    let printed = match crate::state::globals().map(|g| g.config.oom_report) {
        Some(OomReport::All) => true,
        Some(OomReport::Device) => f.place != PLACE_HOST,
        _ => false,
    };
    if !printed {
        return;
    }
    let now = crate::sys::clock::now_ns();
    let last = LAST_REPORT_NS.load(Relaxed);
    if last != 0 && now.saturating_sub(last) < EVERY_NS || LAST_REPORT_NS.compare_exchange(last, now.max(1), Relaxed, Relaxed).is_err() {
        LEFT_OUT.fetch_add(1, Relaxed);
        return;
    }
    if SCRATCH_BUSY.swap(true, Acquire) {
        LEFT_OUT.fetch_add(1, Relaxed);
        return;
    }
    // SAFETY: SCRATCH_BUSY is ours until we store false below.
    let (w, table) = unsafe { &mut *SCRATCH.0.get() };
    w.clear();
    table.gather_again();
    let _ = write_report(w, f, cap_bytes, LEFT_OUT.swap(0, Relaxed), table);
    if caller_retries {
        crate::record::await_retry(f.place, f.request_bytes);
        HELD.store(true, Release);
        return;
    }
    w.flush_to(2);
    SCRATCH_BUSY.store(false, Release);
}

/// The report's text.
pub fn write_report<W: Write>(w: &mut W, f: &Failure, cap_bytes: Option<u64>, left_out: u64, holders: &Table) -> fmt::Result {
    let place = PlaceName(f.place);
    if f.place >= 2 {
        if f.capture_kept_cache && f.cached_bytes > 0 {
            writeln!(w, "tensormalloc: out of memory on {place}: a request of {} failed; the pool kept its {} cached, since a graph capture is under way (giving it back would synchronize the device and invalidate the capture)", Bytes(f.request_bytes), Bytes(f.cached_bytes))?;
        } else {
            writeln!(w, "tensormalloc: out of memory on {place}: a request of {} failed after the pool gave its cached segments back and tried again", Bytes(f.request_bytes))?;
        }
        if f.total_bytes > 0 {
            writeln!(w, "  device: {} total, {} free (the driver's figures); {} in use outside this pool (the CUDA context, other allocators, other processes)", Bytes(f.total_bytes), Bytes(f.free_bytes), Bytes(f.outside_pool_bytes()))?;
        }
        writeln!(w, "  pool: {} reserved, {} live, {} cached; largest free block {}{}", Bytes(f.reserved_bytes), Bytes(f.live_bytes), Bytes(f.cached_bytes), Bytes(f.largest_free_bytes), fragmentation(f))?;
    } else {
        writeln!(w, "tensormalloc: out of memory: a large host block of {} could not be mapped, even after the cache was emptied", Bytes(f.request_bytes))?;
        if f.total_bytes != u64::MAX {
            writeln!(w, "  mapping limit (RLIMIT_AS, RLIMIT_DATA or the commit limit): {}", Bytes(f.total_bytes))?;
        }
        writeln!(w, "  large host blocks: {} live, {} cached", Bytes(f.live_bytes), Bytes(f.cached_bytes))?;
    }
    if left_out > 0 {
        writeln!(w, "  ({left_out} more out-of-memory failures since the last report were not reported)")?;
    }
    crate::report::holders::write_text(w, holders)?;
    writeln!(w, "  What would help:")?;
    if f.place >= 2 {
        if let Some(cap) = cap_bytes {
            writeln!(w, "    TENSORMALLOC_CUDA_LIMIT: the pool's cap ({}) refused this; raise it, or 0 for none", Bytes(cap))?;
        }
        if f.largest_free_bytes > 0 && f.fragmented() {
            writeln!(w, "    TENSORMALLOC_CUDA_POOL=binned: whole blocks per size class, no splitting (less fragmentation for few, large sizes)")?;
        }
        if f.cached_bytes > 0 {
            writeln!(w, "    TENSORMALLOC_CUDA_POOL=none: no pool keeping {} that only this pool can reuse; every request goes to the driver", Bytes(f.cached_bytes))?;
        }
        let elsewhere = f.outside_pool_bytes();
        if elsewhere > f.request_bytes {
            writeln!(w, "    {} is held outside this pool: another allocator's own cache can give it back (torch.cuda.empty_cache(), cupy.get_default_memory_pool().free_all_blocks())", Bytes(elsewhere))?;
        }
        writeln!(w, "    the holders above: what they hold is live; free what they no longer need")?;
    } else {
        writeln!(w, "    TENSORMALLOC_CACHE_BYTES: a smaller cache leaves more room under a limit between failures (it was emptied before this one)")?;
        writeln!(w, "    raise the limit (ulimit -v, the container's memory), or free what the holders above keep")?;
    }
    Ok(())
}

fn fragmentation(f: &Failure) -> &'static str {
    if f.fragmented() {
        " (fragmented: enough is cached, but no free block is as large as the request)"
    } else {
        ""
    }
}

/// The last failure as a JSON object, or `null`.
pub fn write_json<W: Write>(w: &mut W) -> fmt::Result {
    let Some(f) = Failure::last() else { return w.write_str("null") };
    write!(
        w,
        "{{\"place\":\"{}\",\"request_bytes\":{},\"total_bytes\":{},\"free_bytes\":{},\"reserved_bytes\":{},\"live_bytes\":{},\"cached_bytes\":{},\"largest_free_bytes\":{}}}",
        PlaceName(f.place),
        f.request_bytes,
        f.total_bytes,
        f.free_bytes,
        f.reserved_bytes,
        f.live_bytes,
        f.cached_bytes,
        f.largest_free_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_fragmentation_and_the_cap() {
        let f = Failure { place: 2, request_bytes: 4 << 30, total_bytes: 80 << 30, free_bytes: 1 << 30, reserved_bytes: 70 << 30, live_bytes: 60 << 30, cached_bytes: 10 << 30, largest_free_bytes: 1 << 30, capture_kept_cache: false };
        let mut w = StackWriter::<8192>::new();
        write_report(&mut w, &f, Some(70 << 30), 3, &Table::gather()).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.starts_with("tensormalloc: out of memory on cuda:0: a request of 4.0 GiB failed"), "{text}");
        assert!(text.contains("9.0 GiB in use outside this pool"), "{text}");
        assert!(text.contains("largest free block 1.0 GiB (fragmented"), "{text}");
        assert!(text.contains("TENSORMALLOC_CUDA_LIMIT: the pool's cap (70.0 GiB)"), "{text}");
        assert!(text.contains("(3 more out-of-memory failures"), "{text}");
        assert!(text.contains("TENSORMALLOC_CUDA_POOL=none: no pool keeping 10.0 GiB") && text.contains("9.0 GiB is held outside this pool"), "{text}");
        let host = Failure { place: 0, request_bytes: 1 << 30, total_bytes: u64::MAX, ..Default::default() };
        let mut w = StackWriter::<8192>::new();
        write_report(&mut w, &host, None, 0, &Table::gather()).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.contains("large host block of 1.0 GiB") && !text.contains("mapping limit"), "{text}");
        // A capture under way: the cache was kept, and the report says so rather than that it went back.
        let mut w = StackWriter::<8192>::new();
        write_report(&mut w, &Failure { capture_kept_cache: true, ..f }, None, 0, &Table::gather()).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.contains("failed; the pool kept its 10.0 GiB cached, since a graph capture is under way") && !text.contains("gave its cached"), "{text}");
    }
}
