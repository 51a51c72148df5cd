//! The calls of ours that POSIX lets act on a pending cancellation, made with it held off.
//
// Note [Cancellation points]
// A program thread may come into us with a cancellation pending (pthread_cancel, deferred: the
// default). glibc's malloc family reaches no cancellation point, so under glibc alone such a
// thread is cancelled at the program's next one, its malloc having returned. Ours would act on it
// inside malloc, cudaMalloc or exit: at an out-of-memory report's write, a stats file's open or
// write, a wait's sleep, a socket to a peer process. The thread then died inside the call (its
// report lost, the program's own cleanup before its next cancellation point skipped), the
// unwinder crossed our frames, which have no landing pads (panic = "abort"), and a slot another
// thread waits on could stay claimed. So every such call of ours runs with cancellation disabled
// (`cancel_held`: the thread's own state word, no system call); a pending request stays pending
// for the program's next cancellation point, and one that comes meanwhile waits for it too.

extern "C" {
    // In glibc's libc since 2.34 (libpthread before), which the libc crate does not bind.
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

/// glibc's PTHREAD_CANCEL_DISABLE.
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

/// Runs `f` with this thread's cancellation disabled, then puts the state back (Note
/// [Cancellation points]): wraps each call of ours that POSIX lets act on a cancellation.
#[inline]
pub fn cancel_held<R>(f: impl FnOnce() -> R) -> R {
    let mut was: libc::c_int = 0;
    // SAFETY: sets the calling thread's own cancellation state; async-cancel-safe, no system call.
    let set = unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut was) } == 0;
    let out = f();
    if set {
        // SAFETY: as above, back to what it was.
        unsafe { pthread_setcancelstate(was, &mut was) };
    }
    out
}
