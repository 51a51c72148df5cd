//! Monotonic time in nanoseconds: the one clock the policy is fed.

/// As `now_ns`, from CLOCK_MONOTONIC_COARSE: a few milliseconds' resolution for a seventh of the
/// cost (4 ns here), for timestamps that only order and place events on a timeline.
pub fn coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: as in now_ns.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Nanoseconds since an arbitrary fixed point (CLOCK_MONOTONIC); never goes back.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into memory we own; it cannot fail for
    // CLOCK_MONOTONIC on Linux, and on failure ts stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Wall-clock time (CLOCK_REALTIME) in nanoseconds since the epoch, as file times are given.
pub fn wall_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: as in now_ns.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Wall-clock time less monotonic time, now: added to a monotonic stamp, it gives the wall time
/// of that moment (for outputs read beside other programs' timestamps).
pub fn wall_offset_ns() -> u64 {
    let mut wall = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: as in now_ns.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut wall) };
    let wall_ns = (wall.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(wall.tv_nsec as u64);
    wall_ns.wrapping_sub(now_ns())
}

/// `ns` nanoseconds as a relative timespec (futex timeouts, sleeps).
pub fn timespec(ns: u64) -> libc::timespec {
    libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long }
}

/// Sleeps `ns` nanoseconds (less when a signal comes).
pub fn sleep_ns(ns: u64) {
    let t = timespec(ns);
    // SAFETY: nanosleep reads one timespec we own.
    super::stack_switch::as_the_program(|| {
        super::cancel::cancel_held(|| unsafe { libc::nanosleep(&t, core::ptr::null_mut()) });
    });
}

/// Sleeps about 50 µs: a waiter's pause while another thread finishes a short piece of work.
pub fn pause() {
    let ts = libc::timespec { tv_sec: 0, tv_nsec: 50_000 };
    // SAFETY: nanosleep reads one timespec we own; an early wake is harmless.
    super::stack_switch::as_the_program(|| {
        super::cancel::cancel_held(|| unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) });
    });
}
