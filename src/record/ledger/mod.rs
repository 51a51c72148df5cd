//! A process's counters in a file of its own, mapped shared (TENSORMALLOC_STATS): from the first
//! recorded event, every allocation, free, resize and segment changes them in the file itself,
//! so a process ended by SIGKILL, os._exit, SIGTERM or exec leaves every count it made. Beside
//! them the library's whole report (its JSON), rewritten by the background thread while the
//! numbers move and once more at exit (report/stats_file.rs). `tensormalloc report` reads both
//! (python/tensormalloc/report.py reads the layout of layout.rs).
//
// Note [Numbers that survive]
// The file is made with no name, sized and reserved on disk (so writing its pages never faults
// on a full disk), filled with who we are (pid, process start, ancestors, command), locked with
// an exclusive flock held as long as the process lives (so a reader knows a live writer from a
// dead one), mapped shared, and only then named (sys/claim.rs, Note [One file per process]): at
// any moment a named file is whole. Counts are atomics in the mapping; the kernel keeps them
// when the process dies. Events recorded while the first event's thread names the file land in
// a static copy of the counters (PENDING), which the claimant, or a recorder that sees the claim
// done, adds into the file (Dekker's pattern: each side writes, fences, then reads the other's
// flag, so every pending count is moved by one of them). At a normal exit the report replaces
// the file by its JSON; a file left as counters names a process that is running, was killed,
// called _exit or exec'd (its lock tells running from ended; report says which).
// Layout (little-endian, offsets in bytes): a header (`Header`: magic "TMLEDGER", version 1,
// the sizes below, identity), PLACES counters of `Place` (host, pinned, devices 0..15) at
// PLACES_AT, and the JSON text at DETAIL_AT under a sequence lock (odd while written).

pub mod layout;

pub use layout::{read, Header, Place, Read, ANCESTORS, DETAIL_AT, DETAIL_BYTES, FILE_BYTES, MAGIC, PLACES_AT, VERSION};

use super::holders::{PLACES, PLACE_HOST};
use super::Found;
use crate::sys::claim::{self, Claimant};
use crate::sys::dir::{self, Dir, Unnamed};
use crate::sys::files::{self, NAME_MAX_BYTES};
use crate::sys::kept::Kept;
use core::cell::UnsafeCell;
use core::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering::*};

/// Where the file goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// TENSORMALLOC_STATS=json:PATH: at PATH (Note [One file per process]).
    Path(&'static [u8]),
    /// TENSORMALLOC_STATS=1: in the user's runtime directory (sys/claim.rs), named PID.stats.
    RuntimeDir,
}

const OFF: u8 = 0;
const UNCLAIMED: u8 = 1;
const CLAIMING: u8 = 2;
const CLAIMED: u8 = 3;
const FAILED: u8 = 4;
/// The exit hook began before any file was claimed: none is made now (Note [No file after the
/// exit hook]).
const ENDED: u8 = 5;

// Note [No file after the exit hook]
// exit() runs the exit hooks while the program's other threads still run. A thread whose first
// large request came just then made the counters file after the hook had marked and removed
// what it found (nothing yet), or while it looked: the file stayed behind, never marked exited,
// and the parent's report counted a process "killed" (1 normal exit in 80 with three threads
// allocating). So the hook first says the exit began (`begin_exit`): a claim not yet begun is
// not made, and one under way is waited for (at most EXIT_WAIT_NS) before the hook goes on.

static STATE: AtomicU8 = AtomicU8::new(OFF);
/// The file's counters once claimed (PLACES of them); null before.
static TARGET: AtomicPtr<Place> = AtomicPtr::new(core::ptr::null_mut());
/// The whole mapping (FILE_BYTES).
static MAP: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());
/// Counts made while the file is being named (Note [Numbers that survive]).
static PENDING: [Place; PLACES] = [const { Place::new() }; PLACES];
/// The file's descriptor (holding its lock) and its directory's (Note [Descriptors the program
/// may close] in sys/kept.rs).
static FD: Kept = Kept::new();
static DIR_FD: Kept = Kept::new();
static PATH: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());
static PATH_LEN: AtomicUsize = AtomicUsize::new(0);
static FORKED_FROM: AtomicU32 = AtomicU32::new(0);
/// The file's path as messages show it.
static SHOWN: claim::NameSlot = claim::NameSlot::new();

/// The name the file was given, written once by the claimant before CLAIMED is published.
struct NameCell(UnsafeCell<[u8; NAME_MAX_BYTES + 1]>);
// SAFETY: written only by the one claimant while STATE is CLAIMING (and by the fork handler,
// alone in the child); read only after CLAIMED is observed with acquire ordering.
unsafe impl Sync for NameCell {}
static NAME: NameCell = NameCell(UnsafeCell::new([0; NAME_MAX_BYTES + 1]));

/// Turns the counters on: called once at load, with where their file goes. The file is made at
/// the first recorded event.
pub fn start(place: Where) {
    match place {
        Where::Path(p) => {
            PATH_LEN.store(p.len(), Release);
            PATH.store(p.as_ptr().cast_mut(), Release);
        }
        Where::RuntimeDir => PATH.store(core::ptr::null_mut(), Release),
    }
    STATE.store(UNCLAIMED, SeqCst);
}

fn place_to_use() -> Where {
    let p = PATH.load(Acquire);
    if p.is_null() {
        return Where::RuntimeDir;
    }
    // SAFETY: `start` stored a 'static slice's pointer and length.
    Where::Path(unsafe { core::slice::from_raw_parts(p, PATH_LEN.load(Acquire)) })
}

/// Whether the counters are on (TENSORMALLOC_STATS): once on, never off again.
#[inline(always)]
pub fn on() -> bool {
    STATE.load(Relaxed) != OFF
}

/// Runs `f` on the counters of `place` wherever they live now; nothing when off.
#[inline]
fn with(place: u8, f: impl Fn(&Place)) {
    let target = TARGET.load(Acquire);
    if !target.is_null() {
        // SAFETY: TARGET points to PLACES counters in a mapping that lives as long as the
        // process (never unmapped but in a forked child, before any event there).
        if let Some(p) = unsafe { core::slice::from_raw_parts(target, PLACES) }.get(usize::from(place)) {
            f(p);
        }
        return;
    }
    if on() {
        with_slow(place, f);
    }
}

#[cold]
fn with_slow(place: u8, f: impl Fn(&Place)) {
    let Some(pending) = PENDING.get(usize::from(place)) else { return };
    loop {
        match STATE.load(SeqCst) {
            UNCLAIMED => {
                if STATE.compare_exchange(UNCLAIMED, CLAIMING, SeqCst, SeqCst).is_ok() {
                    f(pending);
                    // Note [No file after the exit hook]: the hook's store comes before its
                    // look at STATE, this look after our claim; one of the two sees the other.
                    if EXIT_BEGUN.load(SeqCst) {
                        STATE.store(ENDED, SeqCst);
                    } else {
                        claim_file();
                    }
                    return;
                }
            }
            CLAIMING => {
                f(pending);
                fence(SeqCst);
                if STATE.load(SeqCst) == CLAIMED {
                    drain();
                }
                return;
            }
            CLAIMED => {
                let target = TARGET.load(Acquire);
                // SAFETY: as in `with`.
                if let Some(p) = unsafe { core::slice::from_raw_parts(target, PLACES) }.get(usize::from(place)) {
                    f(p);
                }
                return;
            }
            _ => return,
        }
    }
}

/// Moves PENDING's counts into the file.
fn drain() {
    let target = TARGET.load(Acquire);
    if target.is_null() {
        return;
    }
    // SAFETY: as in `with`.
    let file = unsafe { core::slice::from_raw_parts(target, PLACES) };
    for (pending, into) in PENDING.iter().zip(file) {
        pending.drain_into(into);
    }
}

pub fn on_alloc(place: u8, bytes: u64, found: Found) {
    with(place, |p| p.alloc(bytes, found));
}

pub fn on_free(place: u8, bytes: u64) {
    with(place, |p| p.free(bytes, true));
}

/// A live block freed by someone else (a destroyed context): no longer live, not a free.
pub fn on_forgotten(place: u8, bytes: u64) {
    with(place, |p| p.free(bytes, false));
}

pub fn on_resize(place: u8, old: u64, new: u64) {
    with(place, |p| p.resize(old, new));
}

pub fn on_segment(place: u8, bytes: u64, mapped: bool) {
    with(place, |p| p.segment(bytes, mapped));
}

pub fn on_failure(place: u8) {
    with(place, |p| {
        p.failures.fetch_add(1, Relaxed);
    });
}

/// Makes the file now if no event has (tm_print_stats: the file it writes is this one).
pub fn ensure_claimed() {
    if STATE.load(SeqCst) == UNCLAIMED {
        with_slow(PLACE_HOST, |_| {});
    }
}

/// Makes, fills, maps and names the file (Note [Numbers that survive]); publishes it, or turns
/// the counters off with one line saying why.
#[cold]
fn claim_file() {
    // 7 KiB of stack on the first event's thread, which may have little (Note [A stack of our
    // own] in sys/stack.rs).
    crate::sys::stack::on_own_stack(claim_file_here);
}

#[inline(never)]
fn claim_file_here() {
    let forked_from = FORKED_FROM.load(Relaxed);
    let own = crate::sys::process::id();
    match make_file(forked_from) {
        Ok((map, fd, dir, claimed)) => {
            // SAFETY: we are the one claimant (STATE is CLAIMING); readers wait for CLAIMED.
            unsafe { *NAME.0.get() = [0; NAME_MAX_BYTES + 1] };
            // SAFETY: as above.
            if let Some(dst) = unsafe { (*NAME.0.get()).get_mut(..claimed.name().len()) } {
                dst.copy_from_slice(claimed.name());
            }
            FD.keep(fd);
            DIR_FD.keep(dir.into_raw());
            MAP.store(map, Release);
            // SAFETY: the mapping is FILE_BYTES long; PLACES_AT is inside it, aligned.
            TARGET.store(unsafe { map.add(PLACES_AT) }.cast::<Place>(), Release);
            STATE.store(CLAIMED, SeqCst);
            fence(SeqCst);
            drain();
            if let (Some(why), Where::Path(path)) = (claimed.passed_over, place_to_use()) {
                SHOWN.set(claim::Shown::of(path, claimed.name()).get());
                claim::say(claim::Output::Stats, path, SHOWN.get(), why, forked_from);
            }
            mark_earlier_images(claimed.index);
            crate::sys::reaper::start_now();
        }
        Err(e) => {
            STATE.store(FAILED, SeqCst);
            let mut text = [0u8; 128];
            let reason = e.text(&mut text);
            match place_to_use() {
                Where::Path(path) => {
                    // The name as the file would have it (%p expanded).
                    let mut named = [0u8; crate::sys::files::PATH_MAX_BYTES + 1];
                    let n = crate::sys::files::expand_path(path, crate::sys::process::id(), &mut named);
                    crate::warn_line!("cannot write the stats to {} ({})", show(n.and_then(|n| named.get(..n)).unwrap_or(path)), reason)
                }
                Where::RuntimeDir => crate::warn_line!(
                    "TENSORMALLOC_STATS: cannot keep process {own}'s numbers in a file of its own ({reason}); its report is printed at exit only if it exits normally"
                ),
            }
        }
    }
}

fn show(path: &[u8]) -> &str {
    core::str::from_utf8(path).unwrap_or("(path)")
}

/// Marks the files of this process's images before an exec, among the names tried before the
/// one claimed, as ended by exec (a reader cannot tell that from a kill once the process is
/// gone).
fn mark_earlier_images(claimed_index: u32) {
    let (Where::Path(path), Some(dir_fd)) = (place_to_use(), Some(DIR_FD.checked()).filter(|&fd| fd >= 0)) else {
        return mark_in_runtime_dir(claimed_index);
    };
    // SAFETY: our directory, open for the process's life; borrowed.
    let dir = core::mem::ManuallyDrop::new(unsafe { Dir::from_raw(dir_fd) });
    mark_in(&dir, files::split(path).1, claimed_index);
}

fn mark_in_runtime_dir(claimed_index: u32) {
    let dir_fd = DIR_FD.checked();
    if dir_fd >= 0 {
        // SAFETY: as above.
        let dir = core::mem::ManuallyDrop::new(unsafe { Dir::from_raw(dir_fd) });
        mark_in(&dir, b"%p.stats", claimed_index);
    }
}

fn mark_in(dir: &Dir, base: &[u8], claimed_index: u32) {
    use crate::sys::process;
    let (own, start, image) = (process::id(), process::start_ticks(), process::started_wall_ns());
    for k in 0..claimed_index {
        let mut name = [0u8; NAME_MAX_BYTES + 1];
        let Some(n) = claim::candidate(base, own, k, &mut name) else { continue };
        let name = name.get(..n).unwrap_or(&[]);
        let dir::Standing::Ours(found) = dir::look(dir, name) else { continue };
        let mut head = [0u8; DETAIL_AT];
        if found.read_at(&mut head, 0) < head.len() {
            continue;
        }
        if let Some(r) = read(&head) {
            if r.pid == own && r.start_ticks == start && r.image_started_wall_ns != image && !r.exited {
                let now = crate::sys::clock::wall_ns().to_le_bytes();
                found.write_at(dir, name, core::mem::offset_of!(Header, replaced_wall_ns) as u64, &now);
            }
        }
    }
}

type Made = (*mut u8, i32, Dir, claim::Claimed);

fn make_file(forked_from: u32) -> Result<Made, files::Refused> {
    let mut dir_path = [0u8; files::PATH_MAX_BYTES + 1];
    let own = crate::sys::process::id();
    let (dir, base): (Dir, &[u8]) = match place_to_use() {
        Where::Path(path) => {
            let (dir, base) = files::split(path);
            let n = files::expand_path(dir, own, &mut dir_path).ok_or(files::Refused::Os(libc::ENAMETOOLONG))?;
            (Dir::open(dir_path.get(..n).unwrap_or(&[]))?, base)
        }
        Where::RuntimeDir => (claim::runtime_dir(&mut dir_path, true)?.0, b"%p.stats"),
    };
    let file = Unnamed::create(&dir, base)?;
    files::reserve(file.fd(), FILE_BYTES)?;
    let map = files::map_shared(file.fd(), FILE_BYTES).ok_or(files::Refused::Os(libc::ENOMEM))?;
    // SAFETY: a fresh zeroed mapping of FILE_BYTES; the header fits at its start.
    unsafe { fill_header(&mut *map.cast::<Header>(), forked_from) };
    // The writer's lock, held for the process's life (Note [One file per process]).
    files::try_lock(file.fd());
    let mut file = file;
    let claimed = claim::claim(&dir, base, &mut file, &Claimant::this(forked_from != 0), written_by_an_earlier_image).inspect_err(|_| {
        // SAFETY: nothing else knows the mapping yet.
        unsafe { files::unmap(map, FILE_BYTES) };
    })?;
    Ok((map, file.into_fd(), dir, claimed))
}

/// Whether a counters file found at a name was written by this process before an exec.
fn written_by_an_earlier_image(f: &dir::Found) -> bool {
    use crate::sys::process;
    let mut head = [0u8; PLACES_AT];
    f.read_at(&mut head, 0) == head.len() && layout::writer(&head) == Some((process::id(), process::start_ticks()))
}

fn fill_header(h: &mut Header, forked_from: u32) {
    use crate::sys::process;
    h.magic = MAGIC;
    h.version = VERSION;
    h.file_bytes = FILE_BYTES as u32;
    h.places_at = PLACES_AT as u32;
    h.places = PLACES as u32;
    h.place_bytes = core::mem::size_of::<Place>() as u32;
    h.detail_at = DETAIL_AT as u32;
    h.detail_bytes = DETAIL_BYTES as u32;
    h.pid = process::id();
    h.ppid = process::parent_id();
    h.uid = process::user_id();
    h.forked_from = forked_from;
    h.ticks_per_second = process::ticks_per_second();
    h.start_ticks = process::start_ticks();
    h.image_started_wall_ns = process::started_wall_ns();
    h.process_started_wall_ns = process::process_started_wall_ns();
    let mut name = [0u8; 32];
    let command = process::command_name(&mut name);
    for (slot, &b) in h.command.iter_mut().zip(command) {
        *slot = b;
    }
    let mut ancestors = [(0u32, 0u64); ANCESTORS];
    let n = process::ancestors(&mut ancestors);
    h.ancestors = n as u32;
    for (i, &(pid, start)) in ancestors.iter().take(n).enumerate() {
        if let (Some(p), Some(s)) = (h.ancestor_pids.get_mut(i), h.ancestor_starts.get_mut(i)) {
            (*p, *s) = (pid, start);
        }
    }
}

fn header() -> Option<&'static Header> {
    if STATE.load(Acquire) != CLAIMED {
        return None;
    }
    let map = MAP.load(Acquire);
    // SAFETY: a claimed mapping lives as long as the process and starts with the header.
    (!map.is_null()).then(|| unsafe { &*map.cast::<Header>() })
}

/// The detail's text being written: a `fmt::Write` into the mapping, that notes an overflow.
pub struct Detail {
    at: *mut u8,
    len: usize,
    overflow: bool,
}

impl core::fmt::Write for Detail {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len.saturating_add(s.len());
        if end > DETAIL_BYTES {
            self.overflow = true;
            return Err(core::fmt::Error);
        }
        // SAFETY: [len, end) lies inside the detail area of the mapping; one writer at a time
        // (the caller's lock).
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), self.at.add(self.len), s.len()) };
        self.len = end;
        Ok(())
    }
}

/// Rewrites the detail (the JSON report) with `render`, under the sequence lock; false when no
/// file is claimed. The caller keeps writers one at a time.
pub fn write_detail(render: impl FnOnce(&mut Detail) -> core::fmt::Result) -> bool {
    let Some(h) = header() else { return false };
    let map = MAP.load(Acquire);
    h.detail_seq.fetch_add(1, AcqRel);
    fence(Release);
    // SAFETY: DETAIL_AT + DETAIL_BYTES == FILE_BYTES, the mapping's length.
    let mut d = Detail { at: unsafe { map.add(DETAIL_AT) }, len: 0, overflow: false };
    let whole = render(&mut d).is_ok() && !d.overflow;
    h.detail_len.store(if whole { d.len as u64 } else { 0 }, Relaxed);
    h.detail_wall_ns.store(crate::sys::clock::wall_ns(), Relaxed);
    fence(Release);
    h.detail_seq.fetch_add(1, AcqRel);
    true
}

/// The detail as last written (for the file that replaces the counters at exit).
pub fn detail() -> Option<&'static [u8]> {
    let h = header()?;
    let len = usize::try_from(h.detail_len.load(Acquire)).ok().filter(|&n| n > 0 && n <= DETAIL_BYTES)?;
    // SAFETY: the detail area lives as long as the mapping; the caller's lock keeps writers out.
    Some(unsafe { core::slice::from_raw_parts(MAP.load(Acquire).add(DETAIL_AT), len) })
}

/// Whether the process's file could not be made (it said so, naming the path, once).
pub fn file_refused() -> bool {
    STATE.load(Acquire) == FAILED
}

/// Set by the exit hook before it looks for the file (Note [No file after the exit hook]).
static EXIT_BEGUN: AtomicBool = AtomicBool::new(false);
/// How long the exit hook waits for a claim under way.
const EXIT_WAIT_NS: u64 = 200_000_000;

/// The exit hook begins: no file is claimed from now on, and one being claimed is waited for
/// (Note [No file after the exit hook]).
pub fn begin_exit() {
    EXIT_BEGUN.store(true, SeqCst);
    let start = crate::sys::clock::now_ns();
    while STATE.load(SeqCst) == CLAIMING && crate::sys::clock::now_ns().saturating_sub(start) < EXIT_WAIT_NS {
        crate::sys::thread::yield_now();
    }
}

/// The exit hook ran: the file says so (a reader then knows its detail is final).
pub fn mark_exited() {
    if let Some(h) = header() {
        h.exited.store(crate::sys::clock::wall_ns().max(1), Release);
    }
}

/// Whether the exit hook marked the file.
pub fn exited() -> bool {
    header().is_some_and(|h| h.exited.load(Acquire) != 0)
}

/// The claimed file: its directory's descriptor, its name there, and its descriptor.
pub type OwnFile = (i32, &'static [u8], i32);

/// The claimed file; None when not claimed; Some(Err(EBADF)) when the program closed or
/// replaced either descriptor (Note [Descriptors the program may close]).
pub fn own_file() -> Option<Result<OwnFile, i32>> {
    header()?;
    // SAFETY: NAME was written before CLAIMED was published and is not written again here.
    let name = unsafe { &*NAME.0.get() };
    let n = name.iter().position(|&b| b == 0).unwrap_or(0);
    let (dir_fd, fd) = (DIR_FD.checked(), FD.checked());
    if dir_fd < 0 || fd < 0 {
        return Some(Err(libc::EBADF));
    }
    Some(Ok((dir_fd, name.get(..n)?, fd)))
}

/// Whether this process's counters live in a file now.
pub fn claimed() -> bool {
    header().is_some()
}

/// In a forked child: the parent's file is the parent's (its mapping, descriptor and lock are
/// let go); the child's counters start from the host blocks it inherited (live, and their
/// peak so far), and go to a file of its own at its first event.
pub fn restart_in_child(parent: u32, host_live_bytes: u64, host_live_blocks: u64) {
    if STATE.load(Relaxed) == OFF {
        return;
    }
    TARGET.store(core::ptr::null_mut(), Release);
    let map = MAP.swap(core::ptr::null_mut(), AcqRel);
    if !map.is_null() {
        // SAFETY: the child has one thread, and TARGET no longer points into the mapping.
        unsafe { files::unmap(map, FILE_BYTES) };
    }
    // The parent's descriptors, unless the program closed them and reused the numbers.
    for fd in [FD.take(), DIR_FD.take()] {
        if fd >= 0 {
            let _ = files::close(fd);
        }
    }
    for p in PENDING.iter() {
        for f in p.fields() {
            f.store(0, Relaxed);
        }
    }
    if let Some(host) = PENDING.get(usize::from(PLACE_HOST)) {
        host.live_bytes.store(host_live_bytes, Relaxed);
        host.peak_live_bytes.store(host_live_bytes, Relaxed);
        host.live_blocks.store(host_live_blocks, Relaxed);
    }
    FORKED_FROM.store(parent, Relaxed);
    // A child forked by an exit hook of its parent has its own exit ahead of it.
    EXIT_BEGUN.store(false, SeqCst);
    STATE.store(UNCLAIMED, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_back_as_written() {
        let mut bytes = vec![0u8; FILE_BYTES];
        // SAFETY: a zeroed buffer of the file's size, aligned enough for the header (Vec<u8> of
        // this size comes from the system allocator, 16-byte aligned).
        let (h, places) = unsafe {
            let base = bytes.as_mut_ptr();
            assert_eq!(base as usize % 8, 0);
            (&mut *base.cast::<Header>(), core::slice::from_raw_parts(base.add(PLACES_AT).cast::<Place>(), PLACES))
        };
        fill_header(h, 0);
        places[0].alloc(4 << 20, Found::Miss);
        places[0].alloc(4 << 20, Found::Hit);
        places[0].free(4 << 20, true);
        places[1].alloc(1 << 20, Found::Miss);
        places[2].alloc(2 << 20, Found::Miss);
        places[2].segment(20 << 20, true);
        places[3].on_failure_for_test();
        let r = read(&bytes).unwrap();
        assert_eq!(r.pid, std::process::id());
        assert_eq!((r.requests, r.hits, r.frees, r.live_bytes, r.peak_live_bytes), (4, 1, 1, 6 << 20, 8 << 20), "pinned apart");
        assert_eq!((r.device_requests, r.reserved_bytes), (2, 20 << 20));
        assert!(!r.exited && r.ancestor_count >= 1 && r.ancestors[0].0 == crate::sys::process::parent_id());
        bytes[8] = 9;
        assert_eq!(read(&bytes), None, "another version");
        assert_eq!(read(b"TMLEDGER"), None, "cut");
    }

    impl Place {
        fn on_failure_for_test(&self) {
            self.failures.fetch_add(1, Relaxed);
        }
    }
}
