//! The program's page calls: each marks the live blocks of ours its range touches (Note [Pages
//! the program changed] in host/host_layer/mod.rs), and one that maps or unmaps takes back what
//! we still hold there (Note [Ranges the program claims] in host/host_layer/claim.rs), before
//! the next interposer or the kernel hears of it (Note [The next interposer] in sys/page_calls.rs); a mapping refused for want of room
//! empties the cache and is tried once more; the limit and lock calls make the cache follow a
//! new mapping limit and mlockall at once (Note [Room for others], Note [Locked memory]).

use super::PAGE;
use crate::host::registry::PageChange;
use crate::state::HOST;
use crate::sys::page_calls::{program as next, Call};
use crate::sys::process::{errno, set_errno};
use core::ffi::{c_int, c_void};
/// Advice after which a block is still plain memory: contents (DONTNEED, FREE, REMOVE refused
/// on private memory), paging and huge-page hints, and the advice that undoes the changes.
/// Anything else, known or not, marks the block (MERGEABLE too: KSM would go on scanning and
/// merging the next owner's pages).
fn advice_keeps_plain(advice: c_int) -> bool {
    const COLD: c_int = 20;
    const PAGEOUT: c_int = 21;
    const POPULATE_READ: c_int = 22;
    const POPULATE_WRITE: c_int = 23;
    const DONTNEED_LOCKED: c_int = 24;
    const COLLAPSE: c_int = 25;
    const GUARD_REMOVE: c_int = 103;
    matches!(
        advice,
        libc::MADV_NORMAL
            | libc::MADV_RANDOM
            | libc::MADV_SEQUENTIAL
            | libc::MADV_WILLNEED
            | libc::MADV_DONTNEED
            | libc::MADV_FREE
            | libc::MADV_DOFORK
            | libc::MADV_KEEPONFORK
            | libc::MADV_DODUMP
            | libc::MADV_UNMERGEABLE
            | COLD
            | PAGEOUT
            | POPULATE_READ
            | POPULATE_WRITE
            | DONTNEED_LOCKED
            | COLLAPSE
            | GUARD_REMOVE
    )
}

/// Whether a call that failed with ENOMEM could succeed once the cache is emptied: it is, when
/// it holds something and the request could then fit (Note [Room for others]). The program's own
/// mappings and threads must find the room glibc's free would have left, even before the
/// background thread has seen a limit another process lowered.
/// `unmapped_before`: our unmapped bytes before the failed call (what other threads unmapped
/// since made room too).
#[cold]
fn room_made(len: usize, unmapped_before: u64) -> bool {
    if !HOST.may_make_room(unmapped_before) {
        return false;
    }
    let saved = errno();
    // A limit lowered behind our back (another process's prlimit, a raw prlimit64) cuts the
    // cache here already; what is left goes if the request could then fit.
    super::room::follow_mapping_limits();
    let made = HOST.make_room(len, unmapped_before);
    set_errno(saved);
    made
}

/// # Safety
/// As libc's `mmap`; `call` is the name it came by (mmap or mmap64).
pub unsafe fn mmap(call: Call, addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: libc::off_t) -> *mut c_void {
    // MAP_FIXED_NOREPLACE does not carry MAP_FIXED's bit; it fails over anything mapped, so it
    // changes no live block.
    if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0 {
        HOST.claim_range(addr as usize, len);
    }
    if flags & libc::MAP_FIXED != 0 {
        HOST.note_page_change(addr as usize, len, PageChange::Replaced);
    }
    let unmapped = HOST.unmapped_bytes();
    // SAFETY: the caller's contract.
    let p = unsafe { next::mmap(call, addr, len, prot, flags, fd, offset) };
    if p == libc::MAP_FAILED && errno() == libc::ENOMEM && room_made(len, unmapped) {
        // SAFETY: as above: the same call once more.
        return unsafe { next::mmap(call, addr, len, prot, flags, fd, offset) };
    }
    p
}

/// # Safety
/// As libc's `munmap`.
pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    HOST.claim_range(addr as usize, len);
    HOST.note_page_change(addr as usize, len, PageChange::Replaced);
    // SAFETY: the caller's contract.
    unsafe { next::munmap(addr, len) }
}

/// # Safety
/// As libc's `mremap`; `new_addr` is read only under MREMAP_FIXED.
pub unsafe fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    // A range of a block we took back fails here as it would once unmapped (EFAULT).
    HOST.claim_range(old as usize, old_len);
    HOST.note_page_change(old as usize, old_len.max(new_len), PageChange::Replaced);
    if flags & libc::MREMAP_FIXED != 0 {
        HOST.claim_range(new_addr as usize, new_len);
        HOST.note_page_change(new_addr as usize, new_len, PageChange::Replaced);
    }
    let unmapped = HOST.unmapped_bytes();
    // SAFETY: the caller's contract.
    let p = unsafe { next::mremap(old, old_len, new_len, flags, new_addr) };
    if p == libc::MAP_FAILED && errno() == libc::ENOMEM && new_len > old_len && room_made(new_len - old_len, unmapped) {
        // SAFETY: as above.
        return unsafe { next::mremap(old, old_len, new_len, flags, new_addr) };
    }
    p
}

/// A segment attached at an address of the program's choice claims its range (rounded down to
/// SHMLBA under SHM_RND), and replaces what is there under SHM_REMAP (Note [Ranges the program
/// claims]); its size is the kernel's answer to IPC_STAT, a page when that is refused.
/// # Safety
/// As libc's `shmat`.
pub unsafe fn shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    if !addr.is_null() {
        let saved = errno();
        let at = if flags & libc::SHM_RND != 0 { addr as usize & !(SHMLBA - 1) } else { addr as usize };
        let len = crate::sys::page_calls::shm_size(id).unwrap_or(PAGE);
        set_errno(saved);
        // A huge-page segment maps whole huge pages, past its size.
        HOST.claim_range(at, len.next_multiple_of(HUGE_PAGE));
        if flags & libc::SHM_REMAP != 0 {
            HOST.note_page_change(at, len, PageChange::Replaced);
        }
    }
    // SAFETY: the caller's contract.
    unsafe { next::shmat(id, addr, flags) }
}

/// A segment detached from inside a live block leaves a hole in it: never reused.
/// # Safety
/// As libc's `shmdt`.
pub unsafe fn shmdt(addr: *const c_void) -> c_int {
    HOST.note_page_change(addr as usize, PAGE, PageChange::Replaced);
    // SAFETY: the caller's contract.
    unsafe { next::shmdt(addr) }
}

/// x86-64's SHMLBA (a page) and huge page.
const SHMLBA: usize = PAGE;
const HUGE_PAGE: usize = 2 << 20;

/// # Safety
/// As libc's `mprotect`.
pub unsafe fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Changed);
    // SAFETY: the caller's contract.
    unsafe { next::mprotect(addr, len, prot) }
}

/// # Safety
/// As libc's `pkey_mprotect`.
pub unsafe fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, key: c_int) -> c_int {
    // Key 0 is the default and -1 changes no key: only another one makes the reset use keys.
    HOST.note_page_change(addr as usize, len, if key > 0 { PageChange::Keyed } else { PageChange::Changed });
    // SAFETY: the caller's contract.
    unsafe { next::pkey_mprotect(addr, len, prot, key) }
}

/// # Safety
/// As libc's `madvise`.
pub unsafe fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    match advice {
        libc::MADV_DONTFORK => HOST.note_page_change(addr as usize, len, PageChange::KeptFromChildren),
        libc::MADV_HUGEPAGE | libc::MADV_NOHUGEPAGE => HOST.note_page_change(addr as usize, len, PageChange::HugeAdvice(advice == libc::MADV_HUGEPAGE)),
        _ if !advice_keeps_plain(advice) => HOST.note_page_change(addr as usize, len, PageChange::Changed),
        _ => {}
    }
    // SAFETY: the caller's contract.
    unsafe { next::madvise(addr, len, advice) }
}

pub fn mlock(addr: *const c_void, len: usize) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Changed);
    // SAFETY: locking changes no contents; the kernel checks the range.
    unsafe { next::mlock(addr, len) }
}

pub fn mlock2(addr: *const c_void, len: usize, flags: u32) -> c_int {
    HOST.note_page_change(addr as usize, len, PageChange::Changed);
    // SAFETY: as in mlock.
    unsafe { next::mlock2(addr, len, flags) }
}

pub fn munlock(addr: *const c_void, len: usize) -> c_int {
    // SAFETY: as in mlock.
    unsafe { next::munlock(addr, len) }
}

/// MCL_CURRENT locks every live block: all are marked (a walk of the registry's tables, once).
/// It would lock and fault in every cached block too, and our own mostly untouched tables: the
/// cache is emptied before and after (a block freed meanwhile), and our tables are unlocked
/// (Note [Locked memory]). MCL_FUTURE locks new mappings, ours too: the host layer unlocks
/// what it caches and locks what it hands out from then on.
pub fn mlockall(flags: c_int) -> c_int {
    let current = flags & libc::MCL_CURRENT != 0;
    if current {
        HOST.note_page_change(0, usize::MAX, PageChange::Changed);
        HOST.trim();
    }
    // SAFETY: as in mlock.
    let answer = unsafe { next::mlockall(flags) };
    if answer == 0 {
        let saved = errno();
        // Every mlockall sets the future locking anew (none without MCL_FUTURE).
        crate::sys::os_pages::set_future_locking((flags & libc::MCL_FUTURE != 0).then_some(flags & libc::MCL_ONFAULT != 0));
        if current {
            HOST.trim();
            HOST.for_each_table(crate::sys::os_pages::unlock_ours);
            crate::sys::next::for_each_table(crate::sys::os_pages::unlock_ours);
            crate::sys::mapped_on_use::for_each_mapped(crate::sys::os_pages::unlock_ours);
        }
        set_errno(saved);
    }
    answer
}

pub fn munlockall() -> c_int {
    // SAFETY: unlocking changes no contents.
    let answer = unsafe { next::munlockall() };
    if answer == 0 {
        crate::sys::os_pages::set_future_locking(None);
    }
    answer
}

/// After a limit call that may have changed this process's RLIMIT_AS or RLIMIT_DATA.
fn limit_set(answer: c_int, resource: c_int, new: *const libc::rlimit) -> c_int {
    if answer == 0 && !new.is_null() && (resource == libc::RLIMIT_AS as c_int || resource == libc::RLIMIT_DATA as c_int) {
        let saved = errno();
        super::room::follow_mapping_limits();
        set_errno(saved);
    }
    answer
}

/// # Safety
/// As libc's `setrlimit`; `call` is the name it came by.
pub unsafe fn setrlimit(call: Call, resource: c_int, new: *const libc::rlimit) -> c_int {
    // SAFETY: the caller's contract.
    limit_set(unsafe { next::setrlimit(call, resource, new) }, resource, new)
}

/// # Safety
/// As libc's `prlimit`; `call` is the name it came by.
pub unsafe fn prlimit(call: Call, pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    // SAFETY: the caller's contract.
    limit_set(unsafe { next::prlimit(call, pid, resource, new, old) }, resource, new)
}

/// A thread whose stack could not be mapped (EAGAIN) is made once more after the cache is
/// emptied, as the program's own mmap (Note [Room for others]); one refused for want of a task
/// (RLIMIT_NPROC, a pids cgroup) once more after our own thread gave its task back (Note [Our
/// thread's task] in sys/reaper.rs).
/// # Safety
/// As libc's `pthread_create`.
pub unsafe fn pthread_create(thread: *mut libc::pthread_t, attr: *const libc::pthread_attr_t, start: next::StartFn, arg: *mut c_void) -> c_int {
    let unmapped = HOST.unmapped_bytes();
    // SAFETY: the caller's contract.
    let mut answer = unsafe { next::pthread_create(thread, attr, start, arg) };
    if answer == libc::EAGAIN && room_made(THREAD_STACK_BYTES, unmapped) {
        // SAFETY: as above.
        answer = unsafe { next::pthread_create(thread, attr, start, arg) };
    }
    if answer == libc::EAGAIN && crate::sys::reaper::give_task_back() {
        // Ours ends at its next wake; its task is counted out a moment after. Asleep between
        // the tries, not yielding: a real-time caller on our thread's CPU never yields to it
        // (it spun the whole wait and failed, the sched hunter's nproc.c).
        let asked = crate::sys::clock::now_ns();
        while answer == libc::EAGAIN && crate::sys::clock::now_ns().saturating_sub(asked) < TASK_WAIT_NS {
            crate::sys::clock::sleep_ns(TASK_RETRY_NS);
            // SAFETY: as above.
            answer = unsafe { next::pthread_create(thread, attr, start, arg) };
        }
    }
    answer
}

/// How long a thread refused for want of a task is tried again while ours ends.
const TASK_WAIT_NS: u64 = 100_000_000;
/// How long it sleeps between the tries.
const TASK_RETRY_NS: u64 = 200_000;

/// The room a thread needs at least (glibc's default stack is RLIMIT_STACK, often 8 MiB): what
/// emptying the cache must be able to give for a retry to make sense.
const THREAD_STACK_BYTES: usize = 1 << 20;

/// `call` made with errno as the program left it (stepping our thread aside asks the kernel
/// about it, which sets errno), then its answer and errno after it: errno stays the program's
/// when the call succeeds, as the call alone leaves it.
fn as_the_program_left_errno(call: impl FnOnce() -> c_int) -> impl FnOnce() -> (c_int, i32) {
    let left = errno();
    move || {
        set_errno(left);
        let answer = call();
        (answer, errno())
    }
}

/// The program changes its own thread's capabilities: our background thread steps aside around
/// it (Note [Threads and credentials] in sys/reaper.rs).
/// # Safety
/// As libc's `capset`.
pub unsafe fn capset(header: *mut c_void, data: *const c_void) -> c_int {
    // SAFETY: the caller's contract.
    let (answer, error) = crate::sys::reaper::without_thread(as_the_program_left_errno(|| unsafe { next::capset(header, data) }));
    set_errno(error);
    answer
}

/// The program moves into new namespaces: the kernel refuses a new user namespace (unshare) and
/// joining a user or mount namespace (setns) to a process of more than one thread, so our
/// background thread steps aside around it (Note [Threads and namespaces] in sys/reaper.rs).
/// # Safety
/// As libc's `unshare`.
pub unsafe fn unshare(flags: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let (answer, error) = crate::sys::reaper::without_thread(as_the_program_left_errno(|| unsafe { next::unshare(flags) }));
    set_errno(error);
    answer
}

/// As `unshare`.
/// # Safety
/// As libc's `setns`.
pub unsafe fn setns(fd: c_int, kind: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let (answer, error) = crate::sys::reaper::without_thread(as_the_program_left_errno(|| unsafe { next::setns(fd, kind) }));
    set_errno(error);
    answer
}
