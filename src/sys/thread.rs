//! Our background threads: detached, named, every signal blocked (signals are the program's
//! business), running a function that never returns. No allocation of ours (glibc's
//! pthread_create maps the stack itself). And the hook that stops their work when the process
//! exits.

/// A thread of ours: its name (at most 15 bytes, what the kernel keeps) and what it runs.
pub struct Named<F: 'static> {
    pub name: &'static core::ffi::CStr,
    pub main: F,
}

/// Starts a detached thread running `thread.main` forever; false when none can be made
/// (seccomp, thread limits).
pub fn spawn(thread: &'static Named<fn() -> !>) -> bool {
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `arg` is the `&'static Named<fn() -> !>` spawn got.
        let thread = unsafe { &*(arg as *const Named<fn() -> !>) };
        begin(thread.name);
        (thread.main)()
    }
    create(start, thread as *const Named<fn() -> !> as *mut libc::c_void, libc::PTHREAD_CREATE_DETACHED).is_some()
}

/// Starts a joinable thread running `thread.main` until it returns (the thread then ends
/// without unwinding: its start routine returns); None when none can be made. `join` waits for
/// it to be gone.
pub fn spawn_joinable(thread: &'static Named<fn()>) -> Option<libc::pthread_t> {
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `arg` is the `&'static Named<fn()>` spawn_joinable got.
        let thread = unsafe { &*(arg as *const Named<fn()> ) };
        begin(thread.name);
        (thread.main)();
        core::ptr::null_mut()
    }
    create(start, thread as *const Named<fn()> as *mut libc::c_void, libc::PTHREAD_CREATE_JOINABLE)
}

/// A thread of ours begins: it names itself (prctl(PR_SET_NAME): glibc's pthread_setname_np on
/// another thread opens /proc/self/task/TID/comm, without O_CLOEXEC) and blocks every signal.
fn begin(name: &core::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads at most 16 bytes of the NUL-terminated name; PR_SET_TIMERSLACK
    // takes a number (Note [Our threads are the process's]).
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS);
    }
    block_signals();
}

/// The kernel's default timer slack (Note [Our threads are the process's]).
const TIMER_SLACK_NS: libc::c_ulong = 50_000;

/// Waits until a thread from `spawn_joinable` has ended; its kernel thread may linger a few
/// microseconds more (Note [Joined is not gone]: `wait_released`).
pub fn join(thread: libc::pthread_t) {
    // SAFETY: a joinable thread of ours, joined once.
    super::cancel::cancel_held(|| unsafe { libc::pthread_join(thread, core::ptr::null_mut()) });
}

/// The calling thread's kernel id.
pub fn own_tid() -> i32 {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

// Note [Joined is not gone]
// pthread_join returns once the kernel clears the ended thread's id word, which it does as it
// lets go of the thread's memory, before the thread leaves the thread group. A program's unshare
// (CLONE_NEWUSER) or setns made just after we joined ours could still find two threads and fail
// with EINVAL (1 run in about 3 on a 16-core machine). So after the join we wait, boundedly,
// until the kernel no longer knows the thread's id in this process: tgkill with signal 0 sends
// nothing and fails with ESRCH once the thread is released. That takes microseconds, asked
// again after a sched_yield; past a millisecond the thread is held (a tracer reaps it when it
// gets round to it, a loaded machine has not run the kernel's last step yet), and we ask every
// millisecond, asleep, leaving the CPU to whoever must run, for at most a second. (A bound of
// 0.1 s spent yielding lost to a tracer holding the ended thread 20 ms on CI's machine.)

/// Waits at most `bound_ns` until the ended thread `tid` of this process has been released by
/// the kernel (0: none to wait for).
pub fn wait_released(tid: i32, bound_ns: u64) {
    if tid <= 0 {
        return;
    }
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    let start = super::clock::now_ns();
    while exists_in(pid, tid) {
        let waited = super::clock::now_ns().saturating_sub(start);
        if waited >= bound_ns {
            return;
        }
        if waited < RELEASE_SPIN_NS {
            // SAFETY: sched_yield takes no argument.
            unsafe { libc::sched_yield() };
        } else {
            super::clock::sleep_ns(RELEASE_SPIN_NS);
        }
    }
}

/// Whether process `pid` (this one) has a thread `tid`: tgkill with signal 0 sends nothing.
pub fn exists_in(pid: i32, tid: i32) -> bool {
    // SAFETY: signal 0 only asks whether the thread exists in that process.
    unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, 0) == 0 }
}

/// How long `wait_released` yields before it sleeps between its questions.
const RELEASE_SPIN_NS: u64 = 1_000_000;
/// How long a stop waits for a joined thread to be released (Note [Joined is not gone]).
pub const RELEASE_WAIT_NS: u64 = 1_000_000_000;

/// Signals are the program's business: ours block every one glibc lets a thread block, but
/// SIGBUS, which a fault in our thread raises (blocked, the kernel would kill the process for
/// it: Note [Files shortened under us] in bus_guard.rs).
fn block_signals() {
    let all = our_threads_mask();
    // SAFETY: blocks signals for the calling thread only, with a set on our stack.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &all, core::ptr::null_mut()) };
}

// Note [Born with signals blocked]
// A new thread starts with its creator's signal mask, and ours is made inside the program's
// calls, with the program's mask: until it blocked its signals itself, a process-directed signal
// (a timer's SIGALRM, a SIGTERM) could be taken by it, running the program's handler on our
// thread (twice in 3,000 reallocs under a 200 us timer). glibc 2.32 and later set a mask for the
// new thread from its first instruction (pthread_attr_setsigmask_np); it is looked up once, at
// load. Blocking signals in the creator instead would keep a stop-the-world collector's pause
// from a thread waiting in pthread_create on glibc's lock (Note [Signals off our stack] in
// stack.rs).

type SetSigmaskFn = unsafe extern "C" fn(*mut libc::pthread_attr_t, *const libc::sigset_t) -> libc::c_int;
/// glibc's pthread_attr_setsigmask_np, once looked up (0: none).
static SET_SIGMASK: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Looks up pthread_attr_setsigmask_np, at load (outside every allocation call: dlsym may
/// allocate).
pub fn resolve_at_load() {
    // SAFETY: glibc's dlsym with a constant name.
    let f = unsafe { super::dlsym::glibc()(libc::RTLD_DEFAULT, c"pthread_attr_setsigmask_np".as_ptr()) };
    SET_SIGMASK.store(f as usize, core::sync::atomic::Ordering::Relaxed);
}

/// Our threads' signal mask: every signal glibc lets a thread block, but SIGBUS (`block_signals`).
fn our_threads_mask() -> libc::sigset_t {
    // SAFETY: a set of our own.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigdelset(&mut all, libc::SIGBUS);
        all
    }
}

fn create(start: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void, arg: *mut libc::c_void, detach: libc::c_int) -> Option<libc::pthread_t> {
    // SAFETY: plain pthread calls on attributes we own; the thread runs `start`, which never
    // unwinds.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if !plain_attributes(&mut attr, detach) {
            return None;
        }
        // Note [Our threads are not real-time], Note [Our threads are the process's].
        let normal = libc::sched_param { sched_priority: 0 };
        let policy_set = !creator_runs_normal();
        if policy_set {
            libc::pthread_attr_setinheritsched(&mut attr, libc::PTHREAD_EXPLICIT_SCHED);
            libc::pthread_attr_setschedpolicy(&mut attr, libc::SCHED_OTHER);
            libc::pthread_attr_setschedparam(&mut attr, &normal);
        }
        let mut cpus: libc::cpu_set_t = core::mem::zeroed();
        let cpus_set = main_threads_cpus_if_others(&mut cpus) && libc::pthread_attr_setaffinity_np(&mut attr, core::mem::size_of::<libc::cpu_set_t>(), &cpus) == 0;
        let mut thread: libc::pthread_t = 0;
        let mut rc = libc::pthread_create(&mut thread, &attr, start, arg);
        if rc != 0 && (policy_set || cpus_set) {
            // Refused what it asked for (SCHED_IDLE to SCHED_OTHER needs RLIMIT_NICE's leave, a
            // CPU set may be gone): made as its creator is, as before.
            libc::pthread_attr_destroy(&mut attr);
            if !plain_attributes(&mut attr, detach) {
                return None;
            }
            rc = libc::pthread_create(&mut thread, &attr, start, arg);
        }
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            return None;
        }
        Some(thread)
    }
}

/// Initialises `attr` for a thread of ours: `detach`, our stack size, every signal blocked from
/// its first instruction where glibc can (Note [Born with signals blocked]); false when glibc
/// cannot initialise it.
///
/// # Safety
/// `attr` is not initialised, or was destroyed.
unsafe fn plain_attributes(attr: &mut libc::pthread_attr_t, detach: libc::c_int) -> bool {
    // SAFETY: plain pthread calls on attributes the caller owns.
    unsafe {
        if libc::pthread_attr_init(attr) != 0 {
            return false;
        }
        libc::pthread_attr_setdetachstate(attr, detach);
        libc::pthread_attr_setstacksize(attr, STACK_BYTES);
        let set_sigmask = SET_SIGMASK.load(core::sync::atomic::Ordering::Relaxed);
        if set_sigmask != 0 {
            let mask = our_threads_mask();
            core::mem::transmute::<usize, SetSigmaskFn>(set_sigmask)(attr, &mask);
        }
    }
    true
}

// Note [Our threads are the process's]
// Beyond a real-time policy, a thread inherits from its creator whatever the program set for
// that one thread: SCHED_IDLE or SCHED_BATCH, its CPU set, its timer slack. Ours is made by
// whichever thread first frees a large block: a SCHED_IDLE helper made ours SCHED_IDLE (starved
// behind four busy threads, a release of 256 MiB took 22-51 s, holding the address-space lock
// the program's own mmap waited on: 15 s), a real-time poller pinned to its CPU made ours run
// there only (its first release at 1.94 s instead of 1 s), and 20 s of timer slack held 100 MiB
// 21 s past its release time (the sched hunter). So ours is made SCHED_OTHER whenever its
// creator's policy is another (falling back to its creator's where the kernel refuses: leaving
// SCHED_IDLE needs RLIMIT_NICE's leave), on the main thread's CPU set when its creator's differs
// (glibc's own malloc asks sched_getaffinity too, sizing its arenas), and sets the kernel's
// default timer slack, 50 us, as it begins. A nice value is kept: raising it back needs a
// privilege.

/// Whether the calling thread runs SCHED_OTHER (policy 0 in /proc/thread-self/stat); true when
/// it cannot be read.
fn creator_runs_normal() -> bool {
    let mut buf = [0u8; 1024];
    let Some(n) = super::process::read_kernel_file(b"/proc/thread-self/stat\0", &mut buf) else { return true };
    policy_in_stat(buf.get(..n).unwrap_or(&[])).is_none_or(|p| p == 0)
}

/// Fills `cpus` with the main thread's CPU set when the calling thread is another one and its
/// own set differs; false otherwise.
fn main_threads_cpus_if_others(cpus: &mut libc::cpu_set_t) -> bool {
    let process = super::process::id() as libc::pid_t;
    if own_tid() == process {
        return false;
    }
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: sets of our own, of the size given.
    unsafe {
        let mut own: libc::cpu_set_t = core::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut own) != 0 || libc::sched_getaffinity(process, size, cpus) != 0 {
            return false;
        }
        !libc::CPU_EQUAL(&own, cpus)
    }
}

/// Our threads' stack: address space, touched only as deep as it is used. The exit handlers
/// run on ours when it is the process's last thread (Note [The last thread is the program's]
/// in reaper.rs), so a handler that needs a megabyte finds it.
const STACK_BYTES: usize = 2 << 20;

// Note [Our threads are not real-time]
// A thread inherits the scheduling of the thread that makes it. A program that runs real-time
// (SCHED_FIFO or SCHED_RR: audio, control loops, `chrt -f`) made our background thread real-time
// too, at the program's priority: its unmaps of idle gigabytes (milliseconds) then ran ahead of
// every normal thread on that CPU, and as long as they liked against the program's own threads
// of the same priority. So when the thread making ours runs real-time, ours is made SCHED_OTHER
// (glibc sets it on the new thread before it runs: one sched_setscheduler, which a program that
// went real-time itself is allowed). The policy is read from /proc (no new system call for the
// others).

/// The scheduling policy in a /proc stat line: its 41st field.
fn policy_in_stat(stat: &[u8]) -> Option<u32> {
    u32::try_from(stat_field(stat, 41)?).ok()
}

/// Field `n` (from 1) of a /proc stat line, counted after the command's closing parenthesis
/// (the command may hold spaces and parentheses).
fn stat_field(stat: &[u8], n: usize) -> Option<u64> {
    core::str::from_utf8(stat_word(stat, n)?).ok()?.trim().parse().ok()
}

/// Field `n` (from 3) of a /proc stat line as it is written.
fn stat_word(stat: &[u8], n: usize) -> Option<&[u8]> {
    let after = stat.iter().rposition(|&b| b == b')')?;
    // Fields 3 onwards follow the parenthesis.
    stat.get(after + 1..)?.split(|&b| b == b' ').filter(|f| !f.is_empty()).nth(n.checked_sub(3)?)
}

/// How many threads of the process still run; None where /proc cannot be read. The kernel's
/// count (/proc/self/stat's 20th field) keeps a main thread that has ended, a zombie until the
/// whole process ends (its state, the 3rd field, is then Z).
pub fn count_in_process() -> Option<u64> {
    let mut buf = [0u8; 1024];
    let n = super::process::read_kernel_file(b"/proc/self/stat\0", &mut buf)?;
    live_threads_in_stat(buf.get(..n)?)
}

fn live_threads_in_stat(stat: &[u8]) -> Option<u64> {
    let count = stat_field(stat, 20)?;
    let main_ended = stat_word(stat, 3)? == b"Z";
    Some(count.saturating_sub(u64::from(main_ended)))
}

/// A key for the calling thread: the address of a thread-local byte, unique among live threads
/// and the same in a forked child's only thread (its copy of the forking one). No destructor.
pub fn key() -> usize {
    thread_local! {
        static KEY: u8 = const { 0 };
    }
    KEY.with(|k| k as *const u8 as usize)
}

/// The calling thread's thread pointer, read with one instruction: on x86-64 the word at
/// %fs:0, which the TLS ABI makes the thread control block's own address; on AArch64
/// TPIDR_EL0. Unique among live threads (a later thread may have an ended one's); 0 where it
/// cannot be read, for callers to go the thread-local way (`key`).
#[inline(always)]
pub fn pointer() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: %fs:0 holds the thread pointer in every thread a C library made.
        unsafe { core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags, pure)) };
        tp
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        // SAFETY: reading TPIDR_EL0 has no side effect.
        unsafe { core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags, pure)) };
        tp
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        0
    }
}

/// Lets another thread run (a wait of a few microseconds at most).
pub fn yield_now() {
    // SAFETY: no argument; cannot fail.
    unsafe { libc::sched_yield() };
}

/// Runs `f` with every signal blocked for this thread (SIGKILL and SIGSTOP excepted): a
/// SIGTERM cannot land between two steps that must happen together. `f` is given the mask the
/// thread had, for a wait that must let the program's signals in (files.rs
/// `write_all_waiting_open`).
pub fn with_signals_held<R>(f: impl FnOnce(&libc::sigset_t) -> R) -> R {
    // SAFETY: masks of our own on the stack; the old mask is put back as it was.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut was: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut was);
        let r = f(&was);
        libc::pthread_sigmask(libc::SIG_SETMASK, &was, core::ptr::null_mut());
        r
    }
}

/// Runs `hook` when the process exits, before the destructors of loaded libraries (glibc runs
/// exit handlers in the reverse order of their registration, then those destructors). False
/// when it cannot be registered. glibc may allocate its table entry (calloc) past the first 32.
pub fn at_exit(hook: extern "C" fn()) -> bool {
    // SAFETY: registers a function of ours that lives as long as the library (atexit passes our
    // __dso_handle: glibc also runs it should the library ever be unloaded).
    unsafe { libc::atexit(hook) == 0 }
}

/// Runs `hook` at exit as an exit handler of the process rather than of this library: glibc
/// runs a library's own handlers (atexit passes its __dso_handle) when it finalizes that
/// library, before the libraries loaded ahead of it; one registered with no library runs in
/// the order of registration, newest first, among the process's handlers. False when it cannot
/// be registered.
pub fn at_exit_of_process(hook: extern "C" fn(*mut core::ffi::c_void)) -> bool {
    extern "C" {
        fn __cxa_atexit(f: extern "C" fn(*mut core::ffi::c_void), arg: *mut core::ffi::c_void, dso: *mut core::ffi::c_void) -> core::ffi::c_int;
    }
    // SAFETY: the hook is ours and this library is never unloaded (linked -z nodelete, build.rs),
    // so it is there at exit.
    unsafe { __cxa_atexit(hook, core::ptr::null_mut(), core::ptr::null_mut()) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pointer_is_its_threads_alone() {
        let mine = pointer();
        assert_eq!(mine, pointer(), "the same within a thread");
        let (tx, rx) = std::sync::mpsc::channel();
        let wait = std::sync::Arc::new(std::sync::Barrier::new(2));
        let w = wait.clone();
        let other = std::thread::spawn(move || {
            tx.send(pointer()).unwrap();
            w.wait();
        });
        let theirs = rx.recv().unwrap();
        wait.wait();
        other.join().unwrap();
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert!(mine != 0 && theirs != 0 && mine != theirs, "{mine:#x} {theirs:#x}");
        }
    }

    #[test]
    fn the_policy_is_read_past_a_command_with_spaces_and_parentheses() {
        let line = b"4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 -41 0 1 0 123 4096 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 40 1 0 0 0\n";
        assert_eq!(policy_in_stat(line), Some(1), "SCHED_FIFO");
        let normal = b"7 (sh) S 1 7 7 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123 4096 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
        assert_eq!(policy_in_stat(normal), Some(0));
        assert_eq!(policy_in_stat(b"garbage"), None);
        assert_eq!(live_threads_in_stat(line), Some(1), "threads");
        let ended = b"4242 (a (b) c) Z 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 2 0 123 0 0 18446744073709551615\n";
        assert_eq!(live_threads_in_stat(ended), Some(1), "a main thread that ended is not counted");
        // This test's own thread runs under the normal policy.
        assert!(creator_runs_normal());
    }

    #[test]
    fn a_joined_thread_is_waited_for_until_released_and_a_live_one_only_boundedly() {
        use core::sync::atomic::{AtomicI32, Ordering};
        static ENDED_TID: AtomicI32 = AtomicI32::new(0);
        fn ends() {
            ENDED_TID.store(own_tid(), Ordering::Release);
        }
        static ENDS: Named<fn()> = Named { name: c"tm-test-ends", main: ends };
        let thread = spawn_joinable(&ENDS).expect("a thread");
        join(thread);
        let tid = ENDED_TID.load(Ordering::Acquire);
        assert!(tid > 0 && tid != own_tid());
        wait_released(tid, RELEASE_WAIT_NS);
        // SAFETY: signal 0 only asks whether the thread exists.
        let gone = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
        assert_eq!((gone, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ESRCH)));
        // A thread that is not ending: the wait gives up after a second, asleep most of it.
        let cpu_ns = || {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: fills the timespec we own.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        let (started, cpu) = (std::time::Instant::now(), cpu_ns());
        wait_released(own_tid(), RELEASE_WAIT_NS);
        let (waited, busy) = (started.elapsed(), cpu_ns() - cpu);
        assert!(waited >= std::time::Duration::from_secs(1) && waited < std::time::Duration::from_secs(10), "{waited:?}");
        assert!(busy < 500_000_000, "{busy} ns of CPU in a wait of {waited:?}");
    }
}
