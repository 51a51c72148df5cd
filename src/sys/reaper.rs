//! The reaper: one background thread, started the first time a block enters the host cache, that
//! releases and expires idle blocks even when the program makes no further allocation call. It
//! sleeps on a futex until the cache's next deadline, and ends when nothing is left to do (Note [The
//! last thread is the program's]).
//! It also unmaps blocks the host layer deferred (Note [Deferred unmaps]). If no thread can be
//! created (seccomp, thread limits), the allocation paths reap instead and unmap inline. What a
//! pass does is given at init (`set_work`): this file knows nothing above `sys`. It steps aside
//! while the program changes its own thread's credentials (Note [Threads and credentials]).

use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

const NOT_STARTED: u8 = 0;
const RUNNING: u8 = 1;
const UNAVAILABLE: u8 = 2;
/// Being made: its handle is not stored yet.
const STARTING: u8 = 3;
/// Asked to end (`without_thread`): it returns at its next wake.
const STOPPING: u8 = 4;
/// Asked to give its task back (`give_task_back`): at its next wake it lets itself go (detached,
/// no one joins it) and leaves NOT_STARTED.
const GIVING_BACK: u8 = 5;

static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
/// The running thread's handle (joinable), 0 when none.
static THREAD: AtomicU64 = AtomicU64::new(0);
/// The kernel id of the thread that last ended (asked to stop or give its task back), set by it
/// as it ends; 0 once it is known gone.
static TID: AtomicI32 = AtomicI32::new(0);
/// The process that made the running thread, and the thread's own id once it runs (Note [A
/// child's words, not its thread]).
static OWNER: AtomicU32 = AtomicU32::new(0);
static RUNNING_TID: AtomicI32 = AtomicI32::new(0);
/// Bumped to wake the reaper; the futex word.
static WAKE_SEQ: AtomicU32 = AtomicU32::new(0);
/// When the sleeping reaper will wake by itself; u64::MAX while it sleeps with no deadline.
static SLEEPING_UNTIL: AtomicU64 = AtomicU64::new(u64::MAX);
/// One pass of the work (`set_work`): returns when the next is due (monotonic ns); None: only
/// when woken.
static WORK: AtomicPtr<()> = AtomicPtr::new(no_work as *mut ());
/// What a call does while no thread can be made (`set_alone`): Note [No thread to release].
static ALONE: AtomicPtr<()> = AtomicPtr::new(no_alone as *mut ());
/// What runs before the thread is made for a cached block (`set_before_start`).
static BEFORE_START: AtomicPtr<()> = AtomicPtr::new(no_alone as *mut ());
/// When making the thread last failed (monotonic ns).
static FAILED_AT: AtomicU64 = AtomicU64::new(0);
/// How long after a failure making the thread is tried again.
const RETRY_NS: u64 = 1_000_000_000;

// Note [A child in our memory]
// A vfork child, or one made by clone with CLONE_VM, runs in its parent's memory until it execs
// or exits, and no fork handler of ours runs for it. A block it freed could be the first one
// cached, and the thread made for it was the child's: it died with the child's exec or exit,
// in a pass holding the cache lock (the parent then slept on that lock for good, one run in a
// hundred), and the parent's words said it ran (nothing was released again, and glibc counted a
// thread that never ended, so the parent's main leaving by pthread_exit no longer ended the
// process). So a process in another's memory never makes our thread (`process::
// in_anothers_memory`, a getpid, asked only when no thread runs): what is due is done in the
// call and the cache let go, as with no thread at all (Note [No thread to release]), which in
// shared memory is the parent's cache; the parent makes its thread at its next cached block. A
// child with memory of its own made without our fork handlers (a raw fork) is told apart by the
// page it finds wiped (Note [Children our handlers did not see] in fork_mark.rs): adopting its
// parent's records it takes the memory as its own. Without MADV_WIPEONFORK it cannot be told
// apart and is served as a child in our memory, with no thread. Nor can a child that has its
// parent's pid number: made with CLONE_VM|CLONE_NEWPID by the first process of a pid namespace,
// it is pid 1 as its parent is (docs/limits.md).

// Note [No thread to release]
// Idle blocks are released and unmapped by our thread, whatever the program does meanwhile. When
// no thread can be made (RLIMIT_NPROC, a pids cgroup at its limit, a sandbox that refuses clone),
// nothing would release a block the program freed before it went quiet: it stayed resident for
// good (200 MiB freed, then a sleep: 202 MB of RSS where glibc alone has 2). So while there is
// no thread, a block entering the cache leaves it again at once (`set_alone`: the cache is
// trimmed), as glibc's free would unmap it; and the thread is tried again at most once a second
// (EAGAIN passes), the cache working as before once it runs.

fn no_alone() {}

fn no_work() -> Option<u64> {
    None
}

/// What each pass does (lib.rs: the host layer's reaping, the trace's flush), set at init before
/// the thread can start.
pub fn set_work(work: fn() -> Option<u64>) {
    WORK.store(work as *mut (), Ordering::Release);
}

/// What runs in the freeing thread before our thread is made for a cached block (state.rs: the
/// limits looked at), set at init.
pub fn set_before_start(f: fn()) {
    BEFORE_START.store(f as *mut (), Ordering::Release);
}

/// What a block entering the cache is followed by while no thread can be made (Note [No thread
/// to release]), set at init.
pub fn set_alone(alone: fn()) {
    ALONE.store(alone as *mut (), Ordering::Release);
}

fn work() -> Option<u64> {
    // SAFETY: WORK only ever holds a `fn() -> Option<u64>` (no_work or set_work's argument).
    unsafe { core::mem::transmute::<*mut (), fn() -> Option<u64>>(WORK.load(Ordering::Acquire))() }
}

/// Called (outside every lock) after a block entered the host cache; `deadline_ns` is when it
/// is first due (its release).
pub fn on_block_cached(deadline_ns: u64) {
    match STATE.load(Ordering::Acquire) {
        // A reaper asleep until later (with no deadline, or until an older block's expiry,
        // which comes after this block's release) must wake to reschedule.
        // SeqCst, as the thread's store of u64::MAX before its pass: a block cached during a
        // pass either is seen by it or wakes the thread after it.
        RUNNING if SLEEPING_UNTIL.load(Ordering::SeqCst) > deadline_ns => wake(),
        RUNNING => {}
        NOT_STARTED => {
            // Note [A child in our memory]: the parent's thread, not the child's.
            if super::process::in_anothers_memory() {
                let_go();
                return;
            }
            // SAFETY: BEFORE_START only ever holds a `fn()` (no_alone or set_before_start's).
            unsafe { core::mem::transmute::<*mut (), fn()>(BEFORE_START.load(Ordering::Acquire))() };
            if super::front::front().is_some() {
                never_from_a_call();
                let_go();
                return;
            }
            start_now();
            // Refused: this block has no releaser either (Note [No thread to release]).
            if STATE.load(Ordering::Acquire) == UNAVAILABLE {
                let_go();
            }
        }
        UNAVAILABLE | GIVING_BACK => alone(),
        // Being made (its first pass comes) or stepping aside (started again after).
        _ => {}
    }
}

/// Starts the reaper (at load when the trace needs flushing even before any block is cached).
pub fn start_now() {
    if STATE.load(Ordering::Acquire) != NOT_STARTED || super::process::in_anothers_memory() {
        return;
    }
    if STATE.compare_exchange(NOT_STARTED, STARTING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    // From now on a pass may hold our locks at a fork no handler of ours sees (Note [Children
    // our handlers did not see] in fork_mark.rs).
    super::fork_mark::arm();
    static REAPER: super::thread::Named<fn()> = super::thread::Named { name: c"tensormalloc", main: reaper_main };
    // Before the thread can say its own id.
    RUNNING_TID.store(0, Ordering::Release);
    // On a stack of ours: glibc's pthread_create (its stack cache, the thread's TLS, a lazily
    // bound call that saves every vector register) takes 5 KiB of the caller's, who may be a
    // signal handler on an alternate stack making its first large request.
    match super::stack::on_own_stack(|| super::thread::spawn_joinable(&REAPER)) {
        Some(thread) => {
            THREAD.store(thread, Ordering::Release);
            OWNER.store(super::process::id(), Ordering::Release);
            STATE.store(RUNNING, Ordering::Release);
        }
        None => {
            FAILED_AT.store(super::clock::now_ns(), Ordering::Relaxed);
            STATE.store(UNAVAILABLE, Ordering::Release);
        }
    }
}

// Note [No thread inside another allocator's call]
// glibc's pthread_create allocates the new thread's TLS with the process's calloc. With a
// tracer or allocator preloaded in front of us, our free runs inside its free, often under its
// lock, and making our thread there re-entered its calloc: a tracer with a plain mutex hung on the
// program's first large free. So with anything in front of us our thread is never made from an
// allocation call: as with no thread (Note [No thread to release]) nothing stays cached.

/// Our thread will not be made from an allocation call (Note [No thread inside another
/// allocator's call]): as if it had been refused, for good.
fn never_from_a_call() {
    if STATE.compare_exchange(NOT_STARTED, UNAVAILABLE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        FAILED_AT.store(u64::MAX, Ordering::Relaxed);
    }
}

/// A block was cached with no thread to release it (Note [No thread to release]): the thread is
/// tried again once its retry is due, else what is due is done here and the cache let go.
fn alone() {
    let now = super::clock::now_ns();
    if now.saturating_sub(FAILED_AT.load(Ordering::Relaxed)) >= RETRY_NS && STATE.compare_exchange(UNAVAILABLE, NOT_STARTED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        start_now();
        if running() {
            return;
        }
    }
    let_go();
}

/// With no thread to release it, what is due is done and nothing stays cached.
fn let_go() {
    reap_inline();
    // SAFETY: ALONE only ever holds a `fn()` (no_alone or set_alone's argument).
    unsafe { core::mem::transmute::<*mut (), fn()>(ALONE.load(Ordering::Acquire))() };
}

// Note [Threads and credentials]
// Capabilities are per thread, and glibc makes setuid, setgid and their kin act on every thread
// of the process (it signals each one to make the same call, and aborts the process when one
// succeeds where another fails). A program that changes its capabilities with capset (setpriv,
// libcap-ng: keep capabilities, setresuid, raise them again in this thread, then setresgid) does
// so believing it is alone: our thread, left with the old capabilities, fails the next setgid
// and glibc aborts. So around the program's capset the reaper ends (joined: its kernel thread is
// gone) and a new one is made afterwards by the calling thread, whose new credentials it
// inherits. Nothing is lost meanwhile: what was due is done by the new thread's first pass.

// Note [Threads and namespaces]
// The kernel lets only a process of one thread make a new user namespace (unshare with
// CLONE_NEWUSER: bubblewrap, `unshare -U`, Python's os.unshare, a sandbox's set-up) or join a
// user or mount namespace (setns): with our thread alive the call failed with EINVAL, where under
// glibc alone it succeeds. So around the program's unshare and setns the reaper ends and is made
// again after, as around capset; it then lives in the namespaces the program moved to. A program
// with threads of its own is refused as it would be without us.

/// Runs `change` (the program's capset, unshare or setns) with no reaper thread alive; starts a
/// new one after it when one ran before (Note [Threads and credentials], Note [Threads and
/// namespaces]).
pub fn without_thread<R>(change: impl FnOnce() -> R) -> R {
    // A child our fork handlers did not see adopts the parent's records first, our thread's
    // words among them (Note [A child's words, not its thread]).
    super::fork_mark::check();
    let stopped = stop();
    let answer = change();
    if stopped {
        start_now();
    }
    answer
}

// Note [Our thread's task]
// Our thread is a task, and tasks are what RLIMIT_NPROC and a pids cgroup count: a program that
// set its limit to what it needs found its own pthread_create refused one thread sooner than
// under glibc alone. So a pthread_create of the program's refused with EAGAIN asks ours to give
// its task back and is tried again for a while (route/page_calls.rs): the program's thread comes
// first. The caller never waits on our thread (it may hold a lock our pass needs, the driver's
// say): ours is woken and lets itself go, detached, at its next wake, and what is cached is let
// go at once (nothing stays cached with no releaser: Note [No thread to release]). Ours is made
// again at the next block cached. A program's thread asked for while ours is being made, or one
// whose EAGAIN outlasts the retries, is refused as before; a fork, posix_spawn or vfork so
// refused is not retried (their wrappers are not ours), and a child's own thread counts in the
// child's user's tasks as the parent's does: docs/limits.md.

/// Asks our thread to give its task back to the program (Note [Our thread's task]): it ends at
/// its next wake, with no one waiting for it; false when none ran (one being made is left to be
/// made). Our thread's own calls never ask.
pub fn give_task_back() -> bool {
    // SAFETY: pthread_self cannot fail.
    if THREAD.load(Ordering::Acquire) == unsafe { libc::pthread_self() } {
        return false;
    }
    if STATE.compare_exchange(RUNNING, GIVING_BACK, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return false;
    }
    wake();
    let_go();
    true
}

/// Ends the running reaper and waits for it to be gone (Note [Joined is not gone] in
/// thread.rs); false when none ran.
fn stop() -> bool {
    if !ours_here() {
        // Note [A child's words, not its thread]: none of ours runs in this process.
        return false;
    }
    let mut asked = None;
    loop {
        match STATE.compare_exchange(RUNNING, STOPPING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            // Another thread is making it: wait until it is made (a handful of instructions);
            // or letting it go: until it has; or stopping it (its own capset, unshare or
            // setns): until that one has joined it and seen it released, rather than take the
            // id it waits on and return while ours may still count. Bounded: a join waits on
            // our thread's next wake, and a child whose parent was in the middle of one of
            // these inherits the word, not the thread doing it (past the bound, the id stays
            // the other's).
            Err(STARTING | GIVING_BACK | STOPPING) => {
                if super::clock::now_ns().saturating_sub(*asked.get_or_insert_with(super::clock::now_ns)) >= STOP_WAIT_NS {
                    return false;
                }
                super::clock::pause();
            }
            Err(_) => {
                // One that gave its task back may still be leaving (no one joined it): microseconds,
                // unless long gone and its id now another thread's, which a short bound caps.
                super::thread::wait_released(TID.swap(0, Ordering::AcqRel), GAVE_BACK_WAIT_NS);
                return false;
            }
        }
    }
    wake();
    let thread = THREAD.swap(0, Ordering::AcqRel);
    if thread != 0 {
        super::thread::join(thread);
        // Read after the join: the thread set it before it could end.
        super::thread::wait_released(TID.swap(0, Ordering::AcqRel), super::thread::RELEASE_WAIT_NS);
    }
    STATE.store(NOT_STARTED, Ordering::Release);
    true
}

/// Whether a thread of ours made in this process may run here: made by this pid and, once it
/// has said its id, still known by it in this process (a child in a new pid namespace can have
/// its parent's pid number; the parent's thread is no thread of its).
fn ours_here() -> bool {
    let owner = OWNER.load(Ordering::Acquire);
    if owner == 0 {
        return true;
    }
    let pid = super::process::id();
    let tid = RUNNING_TID.load(Ordering::Acquire);
    owner == pid && (tid == 0 || super::thread::exists_in(pid as i32, tid) || STATE.load(Ordering::Acquire) != RUNNING)
}

/// How long a stop waits for another thread's stop of ours (a join, which takes our thread's
/// next wake, and wait_released's second at most).
const STOP_WAIT_NS: u64 = 2_000_000_000;
/// How long a stop waits for a thread that gave its task back to be released.
const GAVE_BACK_WAIT_NS: u64 = 10_000_000;

// Note [A child's words, not its thread]
// A child made by a raw clone or _Fork runs none of our fork handlers: it inherits the words
// that say our thread runs, and no thread. Its first capset, unshare or setns (bubblewrap's and
// systemd's children call little else) joined a thread that is not in it and hung for ever. So
// around such a call the child first adopts the parent's records (as its next allocation
// would: Note [Children our handlers did not see] in fork_mark.rs), which says no thread runs;
// and where that cannot be known (no MADV_WIPEONFORK, or a child sharing our memory,
// CLONE_VM), the process that made the thread is asked, and the thread itself (a child in a new
// pid namespace may be pid 1 as its parent was, in the parent's): a stop in another process
// has nothing to stop, touches nothing and starts nothing.

/// The fallback when no thread could be made: reap on the allocation paths.
fn reap_inline() {
    // Its own mark: SLEEPING_UNTIL is our thread's alone (one ending may still read it).
    static INLINE_DUE: AtomicU64 = AtomicU64::new(u64::MAX);
    let due = INLINE_DUE.load(Ordering::Acquire);
    if super::clock::now_ns() >= due || due == u64::MAX {
        let next = work().unwrap_or(u64::MAX);
        INLINE_DUE.store(next, Ordering::Release);
    }
}

/// Whether the thread runs (deferred unmaps will be done).
pub fn running() -> bool {
    STATE.load(Ordering::Acquire) == RUNNING
}

/// Wakes the thread now (work was deferred to it).
pub fn wake() {
    WAKE_SEQ.fetch_add(1, Ordering::AcqRel);
    // SAFETY: a futex wake on a static word.
    unsafe { libc::syscall(libc::SYS_futex, WAKE_SEQ.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1) };
}

fn reaper_main() {
    // Asked once: the stops below say the same id (Note [Joined is not gone]).
    let own_tid = super::thread::own_tid();
    RUNNING_TID.store(own_tid, Ordering::Release);
    // Since when the passes have found nothing to do.
    let mut idle_since: Option<u64> = None;
    loop {
        // Awake from here: a block cached from now on wakes us (the sequence moves), unless the
        // pass below sees it. Then read the sequence before reaping, and a stop asked after this
        // point wakes us too (it is asked before its wake).
        SLEEPING_UNTIL.store(u64::MAX, Ordering::SeqCst);
        let seq = WAKE_SEQ.load(Ordering::SeqCst);
        match STATE.load(Ordering::Acquire) {
            STOPPING => {
                // Note [Joined is not gone]: what stop() waits for after the join.
                TID.store(own_tid, Ordering::Release);
                return;
            }
            GIVING_BACK => return let_itself_go(own_tid),
            _ => {}
        }
        let mut deadline = work();
        let now = super::clock::now_ns();
        // Note [The last thread is the program's]: nothing left to do for IDLE_END_NS, or no
        // program thread left.
        idle_since = if deadline.is_none() { Some(idle_since.unwrap_or(now)) } else { None };
        let idle_long = idle_since.is_some_and(|since| now.saturating_sub(since) >= IDLE_END_NS);
        let alone = alone_in_process();
        if idle_long || alone {
            match ending(alone, seq) {
                Ending::Ended => return let_itself_go(own_tid),
                Ending::GoOn(next) => deadline = next,
            }
        }
        // With nothing to do, the next look comes when the idle time is over.
        let deadline = deadline.or(idle_since.map(|since| since.saturating_add(IDLE_END_NS)));
        SLEEPING_UNTIL.store(deadline.unwrap_or(u64::MAX), Ordering::Release);
        let timeout = deadline.map(|d| super::clock::timespec(d.saturating_sub(now).max(1_000_000))); // at least 1 ms between passes
        let timeout_ptr = timeout.as_ref().map_or(core::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: a futex wait on a static word with an optional relative timeout on our stack.
        let waited = unsafe { libc::syscall(libc::SYS_futex, WAKE_SEQ.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, seq, timeout_ptr) };
        if waited != 0 && !matches!(super::process::errno(), libc::EAGAIN | libc::ETIMEDOUT | libc::EINTR) {
            // A filter refuses futex (EPERM, ENOSYS): a wait that returns at once would spin a
            // CPU for good; a pass at most once a second instead.
            super::clock::sleep_ns(deadline.map_or(LAST_THREAD_POLL_NS, |d| d.saturating_sub(now)).clamp(1_000_000, LAST_THREAD_POLL_NS));
        }
    }
}

// Note [The last thread is the program's]
// glibc ends a process when its last thread ends (a main that calls pthread_exit, or leaves by
// the exit system call, as a program in seccomp's strict mode must): our thread, sleeping with
// every signal blocked, kept such a process alive for good, where glibc alone had ended it, and
// a SIGTERM could not end it either. So our thread ends itself once it has had nothing to do for
// IDLE_END_NS (it is made again when a block is next cached; not at once, which made and ended
// a thread many times a second in a churning program, each made at a moment a raw fork could
// land in), and once it finds itself the process's only thread (/proc/self/stat, read at most
// twice a second; it wakes at least once a second: Note [Room for others], and IDLE_END_NS). It
// ends as every thread of glibc's does: the last one out calls exit(0) there, as the program's
// last thread would have.

/// What `ending` decided.
enum Ending {
    /// The thread ends: the state says so, and a block cached from now on finds no thread (Note
    /// [No thread to release]).
    Ended,
    /// A stop was asked meanwhile, or there is work after all: the thread goes on, next due then.
    GoOn(Option<u64>),
}

/// Between a pass that found nothing to do (or, `alone`, no program thread left) and the
/// thread's end. `seq`: the wake sequence read before that pass.
fn ending(alone: bool, seq: u32) -> Ending {
    if STATE.compare_exchange(RUNNING, GIVING_BACK, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return Ending::GoOn(None);
    }
    if alone {
        return Ending::Ended;
    }
    // A block cached during the pass woke us (the sequence moved), and one cached before the
    // state changed is in the cache the pass below reads; one cached after finds no thread.
    let next = if WAKE_SEQ.load(Ordering::SeqCst) != seq { Some(0) } else { work() };
    if next.is_none() {
        return Ending::Ended;
    }
    if STATE.compare_exchange(GIVING_BACK, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return Ending::Ended;
    }
    Ending::GoOn(next)
}

/// Whether our thread is the process's only one, asked at most twice in LAST_THREAD_POLL_NS.
fn alone_in_process() -> bool {
    static ASKED_NS: AtomicU64 = AtomicU64::new(0);
    let now = super::clock::now_ns();
    // Half the poll: the once-a-second passes come a little early by this clock.
    if now.saturating_sub(ASKED_NS.load(Ordering::Relaxed)) < LAST_THREAD_POLL_NS / 2 {
        return false;
    }
    ASKED_NS.store(now, Ordering::Relaxed);
    super::thread::count_in_process() == Some(1)
}

/// How long our thread waits with nothing to do before it ends.
const IDLE_END_NS: u64 = 1_000_000_000;

/// How often our thread asks whether it is alone.
const LAST_THREAD_POLL_NS: u64 = 1_000_000_000;

/// The thread ends with no one to join it, and the next block cached makes a new one.
fn let_itself_go(own_tid: i32) {
    TID.store(own_tid, Ordering::Release);
    // Note [Our thread's task]: no one joins this thread; it is the new one's turn.
    // SAFETY: detaching the calling thread, which returns at once.
    unsafe { libc::pthread_detach(libc::pthread_self()) };
    THREAD.store(0, Ordering::Release);
    // The next thread's first wake must not wait on this one's last deadline.
    SLEEPING_UNTIL.store(u64::MAX, Ordering::SeqCst);
    STATE.store(NOT_STARTED, Ordering::Release);
}

/// In a forked child the reaper thread does not exist: start a new one on demand.
pub fn after_fork_in_child() {
    OWNER.store(0, Ordering::Release);
    RUNNING_TID.store(0, Ordering::Release);
    THREAD.store(0, Ordering::Release);
    TID.store(0, Ordering::Release);
    STATE.store(NOT_STARTED, Ordering::Release);
    SLEEPING_UNTIL.store(u64::MAX, Ordering::Release);
}
