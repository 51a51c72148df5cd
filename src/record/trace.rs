//! TENSORMALLOC_TRACE=PATH: a compact binary record of large host allocations and frees, device
//! allocations and frees, and memory samples. Allocation paths only claim a slot in a ring
//! (one atomic add) and fill 32 bytes; the reaper thread writes the ring to the file every
//! 100 ms and at exit, off the allocation path. When the writer falls a whole ring behind, new
//! events are dropped and counted, never blocked on. (Why not history.rs's ring: see its top.)
//!
//! File: the 8 bytes "TMTRACE2", then records of 32 bytes, little-endian:
//! u64 time_ns, u64 size (bytes; RSS for samples), u64 extra (address; cached bytes for samples),
//! u8 kind (0 host, 1 device, 2 sample, 3 holder name), u8 op (0 alloc, 1 free), u8 outcome
//! (0 hit, 1 miss, 2 grown), u8 device, u32 pages: for allocs and frees the block's holder id
//! (Note [Holders]; 0: unknown), for samples the cached bytes lazily freed (MADV_FREE'd and still
//! counted in RSS) in 4 KiB pages.
//! A holder name (kind 3) is written by the writer, never on an allocation path, before the first
//! record that carries its id: pages = the id, op = this chunk's index, outcome = the chunk
//! count, device = the name bytes in this chunk (0 to 24), and the 24 bytes of time_ns, size and
//! extra hold them in file order, zero-padded (a name of up to NAME_CHUNKS_MAX chunks, longer
//! ones cut). "TMTRACE1" files (before holders) have no kind 3 and pages 0 in allocs and frees;
//! the magic changed because their readers took every non-sample record for an alloc or a free.
//! A sample's op is 0, but for the file's last record: 1 (END) when the process closed the trace
//! at exit, 2 (CUT) when the writer stopped because the file took no more (a full disk, a file
//! size limit). A file whose last record is neither was cut short (its process killed, or
//! still running, or its disk full with no room left even for the CUT record). The first record
//! after the magic is a sample of op 3 (ID): size the writer's pid, extra its process start
//! (/proc ticks), so an image after an exec knows the file of the one before (Note [One file
//! per process] in sys/claim.rs); readers skip it as a sample.
//!
//! Note [No torn trace]: the writer knows how many bytes of whole records the file holds; when a
//! write fails or falls short it cuts the file back there (ftruncate), adds the CUT record if it
//! can, says so in one line, and stops: the file always ends at a whole record.

use crate::record::holders::MAX_HOLDERS;
use crate::sys::lock::Lock;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

pub const KIND_HOST: u8 = 0;
pub const KIND_DEVICE: u8 = 1;
pub const KIND_SAMPLE: u8 = 2;
pub const KIND_NAME: u8 = 3;
pub const OP_ALLOC: u8 = 0;
pub const OP_FREE: u8 = 1;
/// A sample's op: the last record of a file closed at exit, or of one the writer stopped.
pub const OP_END: u8 = 1;
pub const OP_CUT: u8 = 2;
/// A sample's op: the file's first record, who writes it.
pub const OP_ID: u8 = 3;
pub const HIT: u8 = 0;
pub const MISS: u8 = 1;
pub const GROWN: u8 = 2;

const CAPACITY: u64 = 1 << 18; // 8 MiB of events
/// A holder name's bytes per record, and the most records one name takes.
const NAME_CHUNK_BYTES: usize = 24;
const NAME_CHUNKS_MAX: usize = 8;
const MAGIC: &[u8; 8] = b"TMTRACE2";

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
static FD: crate::sys::kept::Kept = crate::sys::kept::Kept::new();
/// Bytes of whole records (and the magic) in the file (Note [No torn trace]); the writer's.
static WHOLE_BYTES: AtomicU64 = AtomicU64::new(0);
/// The name the file was given (for the line a failed write prints).
static NAME: crate::sys::claim::NameSlot = crate::sys::claim::NameSlot::new();
/// A forked child of a process with us loaded (its first name is its parent's).
static FORKED: AtomicBool = AtomicBool::new(false);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Serializes writers (the reaper and the exit flush); never taken on allocation paths. Holds
/// the holder ids already named in the file.
static WRITER: Lock<Named> = Lock::new(Named::new());

/// A set of holder ids.
struct Named([u64; MAX_HOLDERS.div_ceil(64)]);

impl Named {
    const fn new() -> Self {
        Named([0; MAX_HOLDERS.div_ceil(64)])
    }

    /// Adds `id`; true when it was not there (ids past the table are never added).
    fn insert(&mut self, id: u32) -> bool {
        let Some(word) = self.0.get_mut((id / 64) as usize) else { return false };
        let bit = 1u64 << (id % 64);
        let new = *word & bit == 0;
        *word |= bit;
        new
    }
}

#[inline(always)]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// What a memory sample records besides RSS: (cached bytes, of them lazily freed); given at start.
static SAMPLER: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// The trace's path (the configuration's, which lives as long as the process).
static PATH: AtomicPtr<u8> = AtomicPtr::new(core::ptr::null_mut());
static PATH_LEN: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Whether the file is open: claimed at the first block's event (a process that allocates
/// nothing large, a wrapper script's shell, writes no file and claims no path).
static CLAIM: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(UNCLAIMED);
const UNCLAIMED: u8 = 0;
const CLAIMING: u8 = 1;
const CLAIMED: u8 = 2;

/// Opens the file, once: on the first block's event, before its slot is claimed. Off (and a
/// warning) when it cannot be opened.
#[cold]
fn claim_file() {
    // 7 KiB of stack on the first event's thread, which may have little (Note [A stack of our
    // own] in sys/stack.rs).
    crate::sys::stack::on_own_stack(claim_file_here);
}

#[inline(never)]
fn claim_file_here() {
    if CLAIM.compare_exchange(UNCLAIMED, CLAIMING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    match open_file(path()) {
        Some(fd) => {
            FD.keep(fd);
            CLAIM.store(CLAIMED, Ordering::Release);
        }
        None => ON.store(false, Ordering::Release),
    }
}

/// Maps the ring; called once at init, with the path and what to sample. The file is opened at
/// the first block's event (`claim_file`). False on failure.
pub fn start(path: &'static [u8], sampler: fn() -> (u64, u64)) -> bool {
    SAMPLER.store(sampler as *mut (), Ordering::Release);
    PATH_LEN.store(path.len(), Ordering::Release);
    PATH.store(path.as_ptr().cast_mut(), Ordering::Release);
    let events = crate::sys::os_pages::map_table(CAPACITY as usize * core::mem::size_of::<Event>());
    let seqs = crate::sys::os_pages::map_table(CAPACITY as usize * 8);
    let (Some(events), Some(seqs)) = (events, seqs) else { return false };
    EVENTS.store(events as *mut Event, Ordering::Release);
    SEQS.store(seqs as *mut AtomicU64, Ordering::Release);
    ON.store(true, Ordering::Release);
    true
}

fn path() -> &'static [u8] {
    let p = PATH.load(Ordering::Acquire);
    if p.is_null() {
        return &[];
    }
    // SAFETY: `start` stored a 'static slice's pointer and length.
    unsafe { core::slice::from_raw_parts(p, PATH_LEN.load(Ordering::Acquire)) }
}

/// Claims a slot and fills it; drops the event when the ring is full. `holder` is the block's
/// holder word: its id goes in `pages` (the writer names it).
pub fn record(kind: u8, op: u8, outcome: u8, device: u8, size: u64, extra: u64, holder: u64) {
    record_with_pages(kind, op, outcome, device, size, extra, u32::from(crate::record::holders::id_of(holder)));
}

fn record_with_pages(kind: u8, op: u8, outcome: u8, device: u8, size: u64, extra: u64, pages: u32) {
    if !enabled() {
        return;
    }
    if kind != KIND_SAMPLE && CLAIM.load(Ordering::Acquire) == UNCLAIMED {
        claim_file();
    }
    put(kind, op, outcome, device, size, extra, pages);
}

/// Claims a slot in the ring and fills it (the file's writer calls it for samples, even at
/// exit once events are no longer taken).
fn put(kind: u8, op: u8, outcome: u8, device: u8, size: u64, extra: u64, pages: u32) {
    if EVENTS.load(Ordering::Acquire).is_null() {
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
/// every 100 ms.
pub fn flush() {
    if enabled() {
        flush_with(OP_ALLOC);
    }
}

/// At exit: no event is taken any more; the last sample, marked END, closes the file.
/// Whether a trace is being written (`finish` has one to end).
pub fn is_on() -> bool {
    ON.load(Ordering::Acquire)
}

pub fn finish() {
    if ON.swap(false, Ordering::AcqRel) {
        flush_with(OP_END);
    }
}

fn flush_with(sample_op: u8) {
    // Note [Exit from inside our work] (shim/lifecycle.rs): the figures need the cache's lock,
    // which this thread may hold already; asked before the writer's lock is taken.
    let sampler = SAMPLER.load(Ordering::Acquire);
    let inside_our_work = crate::sys::lock::held_here();
    let (cached, lazily_freed) = if sampler.is_null() || inside_our_work {
        (0, 0)
    } else {
        // SAFETY: set by start to a `fn() -> (u64, u64)`.
        unsafe { core::mem::transmute::<*mut (), fn() -> (u64, u64)>(sampler)() }
    };
    let pages = u32::try_from(lazily_freed / 4096).unwrap_or(u32::MAX);
    // Inside our own work the writer's lock may be this thread's own (a flush made inline, where
    // no thread of ours could be made): then nothing more is written.
    let Some(mut named) = (if inside_our_work { WRITER.try_lock() } else { Some(WRITER.lock()) }) else { return };
    // Note [Descriptors the program may close]: one check a flush.
    let kept = FD.number();
    let fd = if kept >= 0 { FD.checked() } else { -1 };
    if kept >= 0 && fd < 0 {
        return lost();
    }
    let resident = crate::sys::memory::resident_bytes();
    if sample_op != OP_END {
        put(KIND_SAMPLE, sample_op, HIT, 0, resident, cached, pages);
        write_completed(fd, &mut named);
        return;
    }
    // The END sample goes straight to the file after what the ring holds: through the ring, a
    // full one would drop it, and a slot claimed by a call that never resumes (Note [Exit from
    // inside our work]) would hold it back; either way a trace that ended would read as cut.
    if write_completed(fd, &mut named) && fd >= 0 {
        let end = Event { time_ns: crate::sys::clock::now_ns(), size: resident, extra: cached, kind: KIND_SAMPLE, op: OP_END, outcome: HIT, device: 0, pages };
        write_records(fd, &[end]);
    }
}

/// Writes every completed event in the ring to `fd` (-1: no file yet); false once the trace
/// stopped or its file is being opened.
fn write_completed(fd: i32, named: &mut Named) -> bool {
    let events = EVENTS.load(Ordering::Acquire);
    let seqs = SEQS.load(Ordering::Acquire);
    let mut tail = TAIL.load(Ordering::Acquire);
    loop {
        let slot = (tail % CAPACITY) as usize;
        // SAFETY: slot < CAPACITY.
        let complete = unsafe { (*seqs.add(slot)).load(Ordering::Acquire) } == tail + 1;
        if !complete {
            return true;
        }
        // Write the run of complete events up to the ring's end in one call.
        let mut end = tail + 1;
        while !end.is_multiple_of(CAPACITY) && unsafe { (*seqs.add((end % CAPACITY) as usize)).load(Ordering::Acquire) } == end + 1 {
            end += 1;
        }
        let count = (end - tail) as usize;
        // SAFETY: slots [slot, slot + count) are complete events inside the ring.
        let run = unsafe { core::slice::from_raw_parts(events.add(slot), count) };
        if fd < 0 {
            if CLAIM.load(Ordering::Acquire) != UNCLAIMED {
                return false; // being opened by the thread of the first event: its events wait
            }
            // Nothing large yet: samples before the first event are not kept.
            tail = end;
            TAIL.store(tail, Ordering::Release);
            continue;
        }
        let mut ok = true;
        new_holders(run, named, |id| ok = ok && write_name(fd, id));
        ok = ok && write_records(fd, run);
        tail = end;
        TAIL.store(tail, Ordering::Release);
        if !ok {
            return false;
        }
    }
}

/// Writes whole records; on a failed or short write, cuts the file back to its last whole
/// record, adds the CUT record if it can, says so and stops the trace (Note [No torn trace]).
/// False once stopped.
fn write_records(fd: i32, records: &[Event]) -> bool {
    if FD.number() != fd {
        return false;
    }
    let bytes = as_bytes(records);
    let whole = WHOLE_BYTES.load(Ordering::Relaxed);
    match crate::sys::files::write_counted(fd, bytes) {
        Ok(()) => {
            WHOLE_BYTES.store(whole + bytes.len() as u64, Ordering::Relaxed);
            true
        }
        Err((e, sent)) => {
            let kept = whole + (sent - sent % core::mem::size_of::<Event>()) as u64;
            let _ = crate::sys::files::truncate(fd, kept);
            let mut cut = Event { time_ns: crate::sys::clock::now_ns(), kind: KIND_SAMPLE, op: OP_CUT, ..Event::default() };
            if let Some(last) = records.last() {
                cut.size = last.size;
            }
            let marked = crate::sys::files::write_at(fd, as_bytes(core::slice::from_ref(&cut)), kept);
            if !marked {
                // Part of it may have gone in before the limit: the file ends at `kept` again.
                let _ = crate::sys::files::truncate(fd, kept);
            }
            ON.store(false, Ordering::Release);
            FD.forget();
            let mut text = [0u8; 128];
            let reason = crate::sys::files::Refused::Os(e).text(&mut text);
            let n = kept.saturating_sub(MAGIC.len() as u64) / core::mem::size_of::<Event>() as u64;
            crate::warn_line!(
                "TENSORMALLOC_TRACE: {}: {reason}; the trace ends at its last whole record ({n} records{}) and records no more",
                core::str::from_utf8(NAME.get()).unwrap_or("(trace)"),
                if marked { ", then a record saying it was cut" } else { "" }
            );
            false
        }
    }
}

/// The program closed or replaced the trace's descriptor (Note [Descriptors the program may
/// close]): the trace stops where it is, with one line.
#[cold]
fn lost() {
    ON.store(false, Ordering::Release);
    let n = WHOLE_BYTES.load(Ordering::Relaxed).saturating_sub(MAGIC.len() as u64) / core::mem::size_of::<Event>() as u64;
    crate::warn_line!(
        "TENSORMALLOC_TRACE: {}: the program closed the trace's descriptor; the trace ends at its last whole record ({n} records) and records no more",
        core::str::from_utf8(NAME.get()).unwrap_or("(trace)")
    );
}

/// Calls `f` with each holder id that `run`'s allocs and frees carry and `named` lacks, once,
/// adding it.
fn new_holders(run: &[Event], named: &mut Named, mut f: impl FnMut(u16)) {
    for e in run {
        if (e.kind == KIND_HOST || e.kind == KIND_DEVICE) && named.insert(e.pages) {
            f(e.pages as u16);
        }
    }
}

/// Writes holder `id`'s name records (the name is looked up here: dladdr, no allocation);
/// false once the trace stopped.
fn write_name(fd: i32, id: u16) -> bool {
    let mut ok = true;
    crate::record::holders::holder_name(id, |name| {
        let mut records = [Event::default(); NAME_CHUNKS_MAX];
        let count = name_records(id, name, &mut records);
        ok = write_records(fd, records.get(..count).unwrap_or(&[]));
    });
    ok
}

/// Fills `out` with the name records of holder `id` (format at the top); returns how many.
fn name_records(id: u16, name: &[u8], out: &mut [Event; NAME_CHUNKS_MAX]) -> usize {
    let name = if name.is_empty() { &b"(no name)"[..] } else { name };
    let count = name.len().div_ceil(NAME_CHUNK_BYTES).min(NAME_CHUNKS_MAX);
    for (index, (record, chunk)) in out.iter_mut().zip(name.chunks(NAME_CHUNK_BYTES)).enumerate() {
        let mut words = [0u64; 3];
        for (i, &byte) in chunk.iter().enumerate() {
            if let Some(word) = words.get_mut(i / 8) {
                *word |= u64::from(byte) << (8 * (i % 8));
            }
        }
        let [time_ns, size, extra] = words;
        *record = Event { time_ns, size, extra, kind: KIND_NAME, op: index as u8, outcome: count as u8, device: chunk.len() as u8, pages: u32::from(id) };
    }
    count
}

/// The file bytes of a run of records.
fn as_bytes(records: &[Event]) -> &[u8] {
    // SAFETY: Event is repr(C), 32 bytes with no padding; the bytes live as long as `records`.
    unsafe { core::slice::from_raw_parts(records.as_ptr().cast::<u8>(), core::mem::size_of_val(records)) }
}

/// The trace file, made with no name, its magic written, locked for the process's life, then
/// named (Note [One file per process] in sys/claim.rs: a process that finds PATH another's of the
/// run traces into PATH.PID beside it, and says so once).
fn open_file(path: &[u8]) -> Option<i32> {
    let name = core::str::from_utf8(path).unwrap_or("(path)");
    match claimed_file(path) {
        Ok((fd, claimed, shown)) => {
            NAME.set(shown.get());
            WHOLE_BYTES.store((MAGIC.len() + core::mem::size_of::<Event>()) as u64, Ordering::Relaxed);
            if let Some(why) = claimed.passed_over {
                crate::sys::claim::say(crate::sys::claim::Output::Trace, path, NAME.get(), why, 0);
            }
            Some(fd)
        }
        Err(e) => {
            let mut text = [0u8; 128];
            crate::warn_line!("TENSORMALLOC_TRACE: cannot open {} ({}); no trace", name, e.text(&mut text));
            None
        }
    }
}

/// The file's first record: this process (pid, process start), for an image after an exec.
fn identity() -> Event {
    let (pid, start) = (u64::from(crate::sys::process::id()), crate::sys::process::start_ticks());
    Event { time_ns: crate::sys::clock::now_ns(), size: pid, extra: start, kind: KIND_SAMPLE, op: OP_ID, ..Event::default() }
}

/// The (pid, process start) an ID record names, from its 32 bytes; None for any other record.
fn writer_of(record: &[u8]) -> Option<(u64, u64)> {
    let word = |at: usize| Some(u64::from_le_bytes(record.get(at..at + 8)?.try_into().ok()?));
    (record.get(24..26)? == [KIND_SAMPLE, OP_ID]).then_some(())?;
    Some((word(8)?, word(16)?))
}

/// Makes and names the file; its descriptor, the claim, and its path as shown in messages.
fn claimed_file(path: &[u8]) -> Result<(i32, crate::sys::claim::Claimed, crate::sys::claim::Shown), crate::sys::files::Refused> {
    use crate::sys::dir::{Dir, Unnamed};
    use crate::sys::files::{self, Refused};
    let (dir_part, base) = files::split(path);
    let mut dir_path = [0u8; files::PATH_MAX_BYTES + 1];
    let n = files::expand_path(dir_part, crate::sys::process::id(), &mut dir_path).ok_or(Refused::Os(libc::ENAMETOOLONG))?;
    let dir = Dir::open(dir_path.get(..n).unwrap_or(&[]))?;
    let mut file = Unnamed::create(&dir, base)?;
    files::write_all(file.fd(), MAGIC)?;
    files::write_all(file.fd(), as_bytes(core::slice::from_ref(&identity())))?;
    files::try_lock(file.fd());
    let me = (u64::from(crate::sys::process::id()), crate::sys::process::start_ticks());
    let claimed = crate::sys::claim::claim(&dir, base, &mut file, &crate::sys::claim::Claimant::this(FORKED.load(Ordering::Relaxed)), |f| {
        let mut head = [0u8; 8 + core::mem::size_of::<Event>()];
        f.read_at(&mut head, 0) == head.len() && head.get(..8) == Some(&MAGIC[..]) && writer_of(head.get(8..).unwrap_or(&[])) == Some(me)
    })?;
    let shown = crate::sys::claim::Shown::of(path, claimed.name());
    Ok((file.into_fd(), claimed, shown))
}

/// In a forked child: the parent's file and its pending events are the parent's. The child
/// traces into a file of its own from here (with `%p` its pid's; without, beside the parent's,
/// whose claim it finds held), with its own holder names.
pub fn restart_in_child() {
    if !enabled() {
        return;
    }
    ON.store(false, Ordering::Release);
    // SAFETY: a thread that held the writer at the fork (the parent's reaper) is not in this
    // process; no thread of the child uses it yet.
    unsafe { WRITER.free_in_child() };
    *WRITER.lock() = Named::new();
    TAIL.store(HEAD.load(Ordering::Acquire), Ordering::Release);
    // The parent's file, unless the program closed it and reused the number.
    let inherited = FD.take();
    if inherited >= 0 {
        let _ = crate::sys::files::close(inherited);
    }
    CLAIM.store(UNCLAIMED, Ordering::Release);
    FORKED.store(true, Ordering::Relaxed);
    ON.store(true, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name in a run of name records, as a reader puts it together from the file's bytes.
    fn read_name(bytes: &[u8]) -> (u32, Vec<u8>) {
        let mut name = vec![];
        let mut id = u32::MAX;
        for (index, record) in bytes.chunks(32).enumerate() {
            let (kind, op, count, used) = (record[24], record[25], record[26], record[27]);
            assert_eq!((kind, usize::from(op), usize::from(count)), (KIND_NAME, index, bytes.len() / 32));
            id = u32::from_le_bytes(record[28..32].try_into().unwrap());
            assert!(record[usize::from(used)..24].iter().all(|&b| b == 0), "padding is zero");
            name.extend_from_slice(&record[..usize::from(used)]);
        }
        (id, name)
    }

    fn pack(id: u16, name: &[u8]) -> Vec<u8> {
        let mut out = [Event::default(); NAME_CHUNKS_MAX];
        let count = name_records(id, name, &mut out);
        as_bytes(&out[..count]).to_vec()
    }

    #[test]
    fn events_are_32_bytes() {
        assert_eq!(core::mem::size_of::<Event>(), 32);
    }

    #[test]
    fn the_first_record_names_its_writer() {
        let id = identity();
        assert_eq!(writer_of(as_bytes(core::slice::from_ref(&id))), Some((u64::from(std::process::id()), crate::sys::process::start_ticks())));
        let sample = Event { kind: KIND_SAMPLE, ..Event::default() };
        assert_eq!(writer_of(as_bytes(core::slice::from_ref(&sample))), None);
        assert_eq!(writer_of(&[0u8; 20]), None, "cut short");
    }

    #[test]
    fn names_pack_into_24_byte_chunks_in_file_order() {
        assert_eq!(read_name(&pack(7, b"libframework.so")), (7, b"libframework.so".to_vec()));
        let exact = [b'x'; 24];
        assert_eq!(pack(1, &exact).len(), 32, "24 bytes fill one record");
        assert_eq!(read_name(&pack(1, &exact)).1, exact);
        let long: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
        let bytes = pack(127, &long);
        assert_eq!(bytes.len(), 5 * 32);
        assert_eq!(read_name(&bytes), (127, long));
        assert_eq!(read_name(&pack(0, b"")).1, b"(no name)");
    }

    #[test]
    fn names_longer_than_the_records_allow_are_cut() {
        let long = [b'n'; NAME_CHUNKS_MAX * NAME_CHUNK_BYTES + 5];
        let bytes = pack(3, &long);
        assert_eq!(bytes.len(), NAME_CHUNKS_MAX * 32);
        assert_eq!(read_name(&bytes).1, &long[..NAME_CHUNKS_MAX * NAME_CHUNK_BYTES]);
    }

    #[test]
    fn each_holder_is_named_once_and_samples_name_none() {
        let event = |kind, pages| Event { kind, pages, ..Default::default() };
        let mut named = Named::new();
        let mut seen = vec![];
        let last = MAX_HOLDERS as u32 - 1;
        let run = [event(KIND_HOST, 5), event(KIND_SAMPLE, 9), event(KIND_DEVICE, 5), event(KIND_DEVICE, 0), event(KIND_HOST, last)];
        new_holders(&run, &mut named, |id| seen.push(id));
        new_holders(&[event(KIND_HOST, 5), event(KIND_HOST, 6), event(KIND_HOST, last + 1)], &mut named, |id| seen.push(id));
        assert_eq!(seen, [5, 0, last as u16, 6], "ids past the table are never named");
    }
}
