//! Monotonic time in nanoseconds: the one clock the policy is fed.

/// Nanoseconds since an arbitrary fixed point (CLOCK_MONOTONIC); never goes back.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into memory we own; it cannot fail for
    // CLOCK_MONOTONIC on Linux, and on failure ts stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}
