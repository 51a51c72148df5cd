//! glibc's heap behind us keeps at its top what glibc alone would: its trim threshold slides up
//! with the large blocks the program frees, as glibc's own slides with its mmapped chunks (Note
//! [glibc's sliding threshold]). The rule is `slid`, pure; the call to glibc's mallopt is made by
//! the freeing thread, outside our locks, at most once per power of two.
//
// Note [glibc's sliding threshold]
// glibc alone serves a request of 128 KiB or more with mmap and, when the program frees such a
// chunk of up to 32 MiB, raises its mmap threshold to the chunk's size and its trim threshold to
// twice that (malloc.c, "dynamic mmap threshold"): a program that has freed one 8 MiB array keeps
// up to 16 MiB free at its heap's top instead of handing it back at each free that leaves more
// than 128 KiB there. Behind us glibc never sees a large chunk, so its trim threshold stayed at
// 128 KiB for the process's life: forty 100 KiB requests (under our threshold, glibc's) freed
// together shrank the heap and grew it again on every round, two brk calls and 968 faults a round
// (`preload-tests/c/heap_top.c`), where glibc alone, once it had freed one 8 MiB block, made
// neither; a DataLoader worker faulted on its samples' pages a tenth more often than under
// glibc or tcmalloc alone. So a free of one of our blocks tells glibc what its own free would
// have: the trim threshold becomes twice the largest such block, rounded down to a power of two
// (never above glibc alone's, and set at most nine times, 256 KiB to 64 MiB), with
// mallopt(M_TRIM_THRESHOLD). Only where glibc would slide it: the next allocator is glibc's, our
// threshold is at most glibc's first mmap threshold (above it glibc sees mmapped chunks of its
// own and slides on them, which a mallopt would stop), and neither the environment
// (MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_THRESHOLD_, MALLOC_MMAP_MAX_ or their
// GLIBC_TUNABLES) nor the program (mallopt of any of them) has fixed glibc's thresholds, which
// stops glibc's own sliding. Once the program has, we never set it again; a program's trim
// threshold that our call may have overtaken is set again after it. glibc's mmap threshold is
// left as it is: every request glibc sees is under it.

use crate::sys::next::{M_MMAP_MAX, M_MMAP_THRESHOLD, M_TOP_PAD, M_TRIM_THRESHOLD};
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst}};

/// glibc's first mmap threshold (DEFAULT_MMAP_THRESHOLD_MIN): a freed chunk of at least this
/// many bytes was mmapped, and slides the thresholds.
pub const GLIBC_FIRST_MMAP_THRESHOLD: usize = 128 << 10;
/// The largest freed chunk that slides them (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit).
pub const GLIBC_SLIDE_MAX: usize = 32 << 20;
const NEVER: usize = usize::MAX;

/// A freed block at least this long slides glibc's trim threshold further; NEVER while glibc's
/// thresholds are not ours to slide.
static SLIDES_FROM: AtomicUsize = AtomicUsize::new(NEVER);
/// glibc's mallopt, set by `arm`.
static MALLOPT: AtomicUsize = AtomicUsize::new(0);
/// The program fixed glibc's thresholds (mallopt): we set nothing again.
static STOPPED: AtomicBool = AtomicBool::new(false);
/// The program's own trim threshold (mallopt's argument), set again after a call of ours that
/// may have overtaken it; NO_PROGRAM_TRIM while it has set none.
static PROGRAM_TRIM: AtomicI64 = AtomicI64::new(NO_PROGRAM_TRIM);
const NO_PROGRAM_TRIM: i64 = i64::MIN;
/// The largest trim threshold wanted, the one set, and whether a thread is setting it.
static WANTED: AtomicUsize = AtomicUsize::new(0);
static APPLIED: AtomicUsize = AtomicUsize::new(0);
static APPLYING: AtomicBool = AtomicBool::new(false);

/// After the program freed a block of `len` bytes, with blocks from `slides_from` sliding: the
/// trim threshold glibc alone would have (rounded down to a power of two) and the length that
/// slides it next; None when this block slides nothing.
pub fn slid(len: usize, slides_from: usize) -> Option<(usize, usize)> {
    if len < slides_from || len > GLIBC_SLIDE_MAX {
        return None;
    }
    let floor = 1usize << (usize::BITS - 1 - len.leading_zeros());
    let next = if floor >= GLIBC_SLIDE_MAX { NEVER } else { floor * 2 };
    Some((floor * 2, next))
}

/// From now on our frees slide glibc's trim threshold through `mallopt` (glibc's), unless the
/// program has fixed glibc's thresholds already.
pub fn arm(mallopt: unsafe extern "C" fn(c_int, c_int) -> c_int) {
    MALLOPT.store(mallopt as usize, Relaxed);
    if !STOPPED.load(Acquire) {
        let _ = SLIDES_FROM.compare_exchange(NEVER, GLIBC_FIRST_MMAP_THRESHOLD, Release, Relaxed);
    }
}

/// A block of `len` bytes of ours was freed: one load and two compares unless it slides.
#[inline(always)]
pub fn after_free(len: usize) {
    if len >= SLIDES_FROM.load(Relaxed) && len <= GLIBC_SLIDE_MAX {
        slide(len);
    }
}

#[cold]
#[inline(never)]
fn slide(len: usize) {
    let mut from = SLIDES_FROM.load(Relaxed);
    loop {
        let Some((trim, next)) = slid(len, from) else { return };
        match SLIDES_FROM.compare_exchange(from, next, AcqRel, Relaxed) {
            Ok(_) => break apply(trim),
            Err(now) => from = now,
        }
    }
}

/// Sets the largest wanted trim threshold; a thread that finds another setting leaves its value
/// to it, which looks again after it lets go (SeqCst: the wanted value and the flag are each
/// written by one side and read by the other).
fn apply(trim: usize) {
    WANTED.fetch_max(trim, SeqCst);
    while !APPLYING.swap(true, SeqCst) {
        let wanted = WANTED.load(SeqCst);
        if wanted > APPLIED.load(Relaxed) && !STOPPED.load(Acquire) {
            call_mallopt(wanted as c_int);
            APPLIED.store(wanted, Relaxed);
            // The program's mallopt may have landed before ours: its value stands.
            if STOPPED.load(Acquire) {
                let program = PROGRAM_TRIM.load(Acquire);
                if program != NO_PROGRAM_TRIM {
                    call_mallopt(program as c_int);
                }
            }
        }
        APPLYING.store(false, SeqCst);
        if WANTED.load(SeqCst) <= APPLIED.load(Relaxed) || STOPPED.load(Acquire) {
            return;
        }
    }
}

/// glibc's mallopt(M_TRIM_THRESHOLD, `value`) (slid values are at most 64 MiB).
fn call_mallopt(value: c_int) {
    let f = MALLOPT.load(Relaxed);
    if f == 0 {
        return;
    }
    // SAFETY: MALLOPT holds glibc's mallopt (`arm`).
    unsafe { core::mem::transmute::<usize, unsafe extern "C" fn(c_int, c_int) -> c_int>(f)(M_TRIM_THRESHOLD, value) };
}

/// The program calls mallopt(`param`, `value`) before it is passed on: a threshold of glibc's
/// that it fixes stops our sliding for good.
pub fn before_program_mallopt(param: c_int, value: c_int) {
    if !matches!(param, M_TRIM_THRESHOLD | M_TOP_PAD | M_MMAP_THRESHOLD | M_MMAP_MAX) {
        return;
    }
    if param == M_TRIM_THRESHOLD {
        PROGRAM_TRIM.store(i64::from(value), Release);
    }
    STOPPED.store(true, Release);
    SLIDES_FROM.store(NEVER, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;

    #[test]
    fn a_freed_block_slides_the_trim_threshold_to_twice_its_power_of_two() {
        assert_eq!(slid(128 * KIB, GLIBC_FIRST_MMAP_THRESHOLD), Some((256 * KIB, 256 * KIB)));
        assert_eq!(slid(200 * KIB, GLIBC_FIRST_MMAP_THRESHOLD), Some((256 * KIB, 256 * KIB)));
        assert_eq!(slid(8 * MIB + 4096, 256 * KIB), Some((16 * MIB, 16 * MIB)));
        assert_eq!(slid(32 * MIB, 16 * MIB), Some((64 * MIB, NEVER)), "the last slide");
    }

    #[test]
    fn blocks_glibc_would_not_have_mmapped_or_past_its_limit_slide_nothing() {
        assert_eq!(slid(64 * KIB, GLIBC_FIRST_MMAP_THRESHOLD), None, "under glibc's first mmap threshold");
        assert_eq!(slid(3 * MIB, 4 * MIB), None, "under the last slide's power of two");
        assert_eq!(slid(32 * MIB + 4096, GLIBC_FIRST_MMAP_THRESHOLD), None, "past 32 MiB glibc slides nothing");
        assert_eq!(slid(usize::MAX, GLIBC_FIRST_MMAP_THRESHOLD), None);
        assert_eq!(slid(MIB, NEVER), None, "not armed, or stopped");
    }

    /// The thresholds only rise, through at most nine values, each at most glibc alone's.
    #[test]
    fn a_run_of_frees_slides_at_most_nine_times_and_never_past_glibcs_rule() {
        let mut from = GLIBC_FIRST_MMAP_THRESHOLD;
        let (mut slides, mut trim) = (0, 128 * KIB);
        for len in (0..20_000).map(|i| 128 * KIB + i * 4 * KIB).chain([33 * MIB, 200 * KIB, 32 * MIB]) {
            if let Some((t, next)) = slid(len, from) {
                assert!(t > trim && t <= 2 * len, "{len}: {t} after {trim}");
                (trim, from, slides) = (t, next, slides + 1);
            }
        }
        assert_eq!((slides, trim, from), (9, 64 * MIB, NEVER));
    }
}
