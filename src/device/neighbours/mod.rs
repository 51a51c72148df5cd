//! The pools of several processes on one GPU, known to each other (Note [Neighbours]): the
//! registry's layout and rules over plain memory (`registry.rs`, unit-tested), and this process's
//! side of it here (`join`, `ask`, the thread that answers), each way cooperation turns off said
//! once on stderr.
//
// Note [Neighbours]
// A process whose device allocation fails, after giving back its own cache, asks the other
// processes on the same GPU to give back their idle segments, waits a bounded time
// (TENSORMALLOC_CUDA_NEIGHBOUR_WAIT_MS) for their answers, and retries once. There is no daemon:
// the user's processes share one small file (0600, this user's own: another user's file, a
// symlink, one others may read or another size is not used), in the user's own runtime directory
// where the system gives one (XDG_RUNTIME_DIR, else /run/user/UID, when it is this user's and
// closed to others: no other user can create a file there), else /dev/shm/tensormalloc-UID-
// neighbours, where another user could create the name first: such a file is refused and said.
// Each process whose pool mapped a segment holds a slot: its pid, the GPUs it pools on (by UUID,
// the same in every process whatever CUDA_VISIBLE_DEVICES renumbers), a doorbell and an answer
// word. An asker bumps the device's `wanted` count in every live slot that pools on its GPU (all
// of them: as many as the table has slots), rings the doorbell (a futex shared across processes)
// and waits on the answer word; the slot's owner runs one thread, asleep on its doorbell, that
// gives back the idle segments of each device asked for (in the pool's own context, as the
// background thread does: DeviceLayer::release_for_neighbour) and answers with the doorbell's
// value it served.
// Only memory that is really idle goes: segments (or chunks) idle for NEIGHBOUR_IDLE_NS. What was
// idle when the ask came but younger is looked at again once it reached that age, then the
// answer goes: a loop that reuses its segments more often than that never gives them back, so a
// neighbour asking without end cannot make it re-create them; and answering runs at most once
// per ANSWER_INTERVAL_NS. What a neighbour gets is what stayed unused that long.
// Nothing read from the file is trusted: a pid is only ever signalled with signal 0 (to know it
// lives), counters are compared, never used as sizes or indices, and every wait is bounded. A
// neighbour that died leaves a slot the next process takes; one that is stopped (SIGSTOP) or of
// another version never answers, and the asker's wait ends at its bound (that asker does not ask
// it again). When cooperation is off for any reason but the setting (no runtime directory and a
// squatted, full, read-only or missing /dev/shm, a file not ours, another version's, a full slot
// table, no thread), the process says why, once, and works on its own. Not covered: a process of
// the same user that truncates the file (the next access faults, as any shared mapping's would).
// A forked child of a process that joined never asks or answers: its parent's CUDA context is not
// its own (Note [Forked children]); the answering thread is not copied by fork anyway.

mod registry;

pub use registry::{Asked, Key, Owner, Registry, DEVICES, REGISTRY_BYTES, SLOTS};
use registry::reached;

use crate::sys::shared_memory::{self, Refused, SharedFile};
use crate::sys::{clock, cuda_driver, process, thread};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed, Release}};

/// How long a segment must have stayed idle before a neighbour's ask gives it back.
pub const NEIGHBOUR_IDLE_NS: u64 = 100_000_000;
/// The answering thread runs at most once per this long.
const ANSWER_INTERVAL_NS: u64 = 5_000_000;

const UNTRIED: u8 = 0;
const OPENING: u8 = 1;
const READY: u8 = 2;
const UNAVAILABLE: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNTRIED);
static REGISTRY: AtomicPtr<Registry> = AtomicPtr::new(core::ptr::null_mut());
/// Our slot; usize::MAX until we joined.
static SLOT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Which of our devices each of our slot's entries names (-1: none).
static ORDINALS: [AtomicI32; DEVICES] = [const { AtomicI32::new(-1) }; DEVICES];
static JOINED: [AtomicBool; crate::backing::MAX_DEVICES] = [const { AtomicBool::new(false) }; crate::backing::MAX_DEVICES];
/// How long an asker waits for its neighbours' answers.
static WAIT_NS: AtomicU64 = AtomicU64::new(1_000_000_000);
/// What the answering thread calls for each device asked for (DeviceLayer::release_for_neighbour):
/// a `Release`, null until set.
static RELEASE: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Gives back `device`'s segments idle since the time given or before; returns whether idle
/// ones are left (younger).
pub type ReleaseFn = fn(i32, u64) -> bool;

/// Set at init: what answering gives back, and how long asking waits (0: never ask or answer).
pub fn configure(release: ReleaseFn, wait_ms: u64) {
    RELEASE.store(release as *mut (), Release);
    WAIT_NS.store(wait_ms.saturating_mul(1_000_000), Relaxed);
    if wait_ms == 0 {
        STATE.store(UNAVAILABLE, Release);
    }
}

/// Why cooperation is off, said once (Note [Neighbours]).
enum Off<'a> {
    File(&'a [u8], Refused),
    Version(&'a [u8]),
    Full(&'a [u8]),
    NoThread,
}

fn say_off(off: Off) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Relaxed) {
        return;
    }
    fn text(p: &[u8]) -> &str {
        core::str::from_utf8(p).unwrap_or("(path)")
    }
    const OFF: &str = "the device pool works without its neighbours on the GPU";
    match off {
        Off::File(path, Refused::OtherUser { uid }) => crate::warn_line!(
            "neighbour registry {}: created by another user (uid {uid}), refused; {OFF} (a private runtime directory, XDG_RUNTIME_DIR or /run/user/UID mode 0700, keeps the registry where no one else can create it)",
            text(path)
        ),
        Off::File(path, Refused::NotPrivate) => crate::warn_line!("neighbour registry {}: others may read or write it, refused; {OFF}", text(path)),
        Off::File(path, Refused::NotAFile) => crate::warn_line!("neighbour registry {}: not a plain file (a symbolic link?), refused; {OFF}", text(path)),
        Off::File(path, Refused::WrongSize) => crate::warn_line!("neighbour registry {}: another version's or damaged (its size), refused; {OFF}", text(path)),
        Off::File(path, Refused::System(e)) => {
            let mut buf = [0u8; 128];
            crate::warn_line!("neighbour registry {}: {}; {OFF}", text(path), process::error_text(e, &mut buf))
        }
        Off::Version(path) => crate::warn_line!("neighbour registry {}: another version's or damaged (its mark), refused; {OFF}", text(path)),
        Off::Full(path) => crate::warn_line!("neighbour registry {}: all {SLOTS} slots are taken by live processes of this user; {OFF}", text(path)),
        Off::NoThread => crate::warn_line!("no thread could be started to answer the neighbours on the GPU; {OFF}"),
    }
}

/// The registry file's place (the user's runtime directory, else /dev/shm).
fn registry_file() -> SharedFile {
    let mut shm_name = [0u8; 64];
    let mut uid = [0u8; 20];
    let uid = crate::sys::files::decimal(u64::from(process::user_id()), &mut uid);
    let mut n = 0;
    for (slot, &b) in shm_name.iter_mut().zip(b"tensormalloc-".iter().chain(uid).chain(b"-neighbours")) {
        *slot = b;
        n += 1;
    }
    SharedFile::locate(b"tensormalloc-neighbours", shm_name.get(..n).unwrap_or(&[]))
}

/// The registry, opened on first use; None when there is none to use (why: said once).
fn registry() -> Option<&'static Registry> {
    if STATE.load(Acquire) == UNTRIED && STATE.compare_exchange(UNTRIED, OPENING, AcqRel, Acquire).is_ok() {
        let file = registry_file();
        match file.map(REGISTRY_BYTES).map(|p| p.cast::<Registry>()) {
            // SAFETY: a live shared mapping of REGISTRY_BYTES, never unmapped; every field is an
            // atomic (or padding), so whatever another process wrote there is a valid value.
            Ok(p) if unsafe { (*p).adopt() } => {
                REGISTRY.store(p, Release);
                STATE.store(READY, Release);
            }
            Ok(_) => {
                STATE.store(UNAVAILABLE, Release);
                say_off(Off::Version(file.path()));
            }
            Err(e) => {
                STATE.store(UNAVAILABLE, Release);
                say_off(Off::File(file.path(), e));
            }
        }
    }
    if STATE.load(Acquire) != READY {
        return None;
    }
    // SAFETY: stored once, before READY, from a mapping that is never unmapped.
    Some(unsafe { &*REGISTRY.load(Acquire) })
}

/// Device `device`'s key: its UUID, else (a driver that cannot say) its ordinal.
fn key_of(device: i32) -> Key {
    match cuda_driver::device_uuid(device) {
        Some(u) if u != [0; 16] => {
            let (a, b) = u.split_at(8);
            [u64::from_le_bytes(a.try_into().unwrap_or([0; 8])) | 1, u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))]
        }
        _ => [device as u64 + 2, 0],
    }
}

/// Our pool on `device` mapped a segment: from now on a neighbour short of memory on that GPU may
/// ask us for our idle ones. Cheap after the first call per device.
pub fn join(device: i32) {
    let Some(joined) = usize::try_from(device).ok().and_then(|d| JOINED.get(d)) else { return };
    if joined.load(Relaxed) {
        return;
    }
    let Some(reg) = registry() else { return };
    let mut slot = SLOT.load(Acquire);
    if slot == usize::MAX {
        static CLAIMING: AtomicBool = AtomicBool::new(false);
        if CLAIMING.swap(true, AcqRel) {
            return; // another thread is joining: the next segment tries again
        }
        let Some(claimed) = reg.claim(process::id(), process::start_ticks(), shared_memory::process_alive) else {
            STATE.store(UNAVAILABLE, Release);
            say_off(Off::Full(registry_file().path()));
            return;
        };
        // Note [Asks before our thread runs]: what the slot's wanted counters hold before our key
        // is entered; only an ask made after that is ours to answer.
        let mut before = [0u32; DEVICES];
        reg.take_wanted(claimed, &mut before);
        for (seen, value) in SEEN_AT_JOIN.iter().zip(before) {
            seen.store(value, Relaxed);
        }
        SLOT.store(claimed, Release);
        static ANSWERER: thread::Named<fn() -> !> = thread::Named { name: c"tensormalloc-nb", main: answer_forever };
        if !thread::spawn(&ANSWERER) {
            STATE.store(UNAVAILABLE, Release);
            reg.leave(claimed, process::id());
            say_off(Off::NoThread);
            return;
        }
        slot = claimed;
    }
    if let Some(ordinal) = reg.enter(slot, key_of(device)).and_then(|entry| ORDINALS.get(entry)) {
        ordinal.store(device, Release);
    }
    joined.store(true, Release);
}

// Note [Asks before our thread runs]
// The answering thread notes the wanted counters it has seen, to answer only what is asked after.
// It noted them when it first ran: an ask made after our key was entered but before the thread
// was scheduled (a busy machine) was taken as seen, never released for, and the asker went out of
// memory with our idle segments cached (the neighbour tests failed 1 run in 8 under load). The
// counters are noted in `join`, before the key is entered, and the thread starts from those.

/// The slot's wanted counters as `join` found them (Note [Asks before our thread runs]).
static SEEN_AT_JOIN: [AtomicU32; DEVICES] = [const { AtomicU32::new(0) }; DEVICES];

// Note [A neighbour that leaves while asked]
// A neighbour that exits (or is killed) after our ask reached it never answers: we waited out the
// whole bound (1 s by default, up to a minute) for it, though its memory went back to the driver
// at its exit. So the wait is cut in slices of 20 ms, and ends for a neighbour whose slot names
// another process now or that has ended (a zombie its parent has not waited for included).
const GONE_CHECK_NS: u64 = 20_000_000;

// Note [A pid given again]
// A slot outlives its process until another process claims it, and the kernel gives pids again
// (32768 of them by default, a day's worth of short processes, minutes of a test suite): a slot
// whose pid now names an unrelated live process was asked, and the ask waited out its whole
// bound (1 s by default; stop 53's CI run waited 10 s, the tests' bound, for a 600 MiB request
// a neighbour served at once). So a slot records when its owner started (the kernel's start
// time, /proc/PID/stat), and a slot whose pid now names a process started at another time is
// not asked. A slot of a version that records no start is asked as before. Not covered: a
// process that joined and then replaced its program (exec) keeps its pid and start; it is asked,
// and costs the bound once (SILENT). The IPC registry's entries record the same
// (device/ipc/registry.rs): an ended exporter's entries are taken by the next, and a handle of
// one is refused as the driver refuses a dead exporter's.

/// Per slot, the pid that let an ask of ours wait out its bound (stopped, or a pid the kernel
/// gave to a process that is no neighbour): not asked again by this process while it holds that
/// slot, so each costs the wait once.
static SILENT: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];

/// Our allocation on `device` failed with our cache given back: asks every neighbour pooling on
/// that GPU for its idle segments and waits, bounded, for their answers. True when one answered
/// (a retry may succeed).
pub fn ask(device: i32) -> bool {
    let Some(reg) = registry() else { return false };
    let mut asked = [Asked::default(); SLOTS];
    let eligible = |slot: usize, owner: Owner| SILENT.get(slot).is_none_or(|s| s.load(Relaxed) != owner.pid) && shared_memory::process_lives(owner.pid, owner.started);
    let n = reg.ask(process::id(), key_of(device), eligible, &mut asked);
    let asked = asked.get(..n).unwrap_or(&[]);
    for bell in asked.iter().filter_map(|a| reg.doorbell(a.slot)) {
        shared_memory::wake_all(bell);
    }
    let deadline = clock::now_ns().saturating_add(WAIT_NS.load(Relaxed));
    let mut any = false;
    for &a in asked {
        let Some(word) = reg.answer_word(a.slot) else { continue };
        loop {
            let seen = word.load(Acquire);
            if reached(seen, a.ticket) {
                any = true;
                break;
            }
            let now = clock::now_ns();
            if now >= deadline {
                if let Some(silent) = SILENT.get(a.slot) {
                    silent.store(a.pid, Relaxed);
                }
                break;
            }
            // Note [A neighbour that leaves while asked]: looked at again every 20 ms.
            if reg.pid(a.slot) != a.pid || !shared_memory::process_running(a.pid) {
                break;
            }
            shared_memory::wait(word, seen, Some((deadline - now).min(GONE_CHECK_NS)));
        }
    }
    any
}

/// Gives back the idle segments idle since `cutoff_ns` of the devices in `mask` (our slot's entry
/// indices); whether younger idle ones are left.
fn release_asked(mask: u32, cutoff_ns: u64) -> bool {
    let release = RELEASE.load(Acquire);
    if release.is_null() {
        return false;
    }
    // SAFETY: only `configure` stores here, a `ReleaseFn`.
    let release = unsafe { core::mem::transmute::<*mut (), ReleaseFn>(release) };
    let mut left = false;
    for (i, ordinal) in ORDINALS.iter().enumerate() {
        let device = ordinal.load(Acquire);
        if mask & (1 << i) != 0 && device >= 0 {
            left |= release(device, cutoff_ns);
        }
    }
    left
}

/// The answering thread: asleep on our doorbell; each ring gives back what stayed idle long
/// enough on the devices asked for (Note [Neighbours]), then answers.
fn answer_forever() -> ! {
    let slot = SLOT.load(Acquire);
    let words = registry().and_then(|reg| Some((reg, reg.doorbell(slot)?, reg.answer_word(slot)?)));
    let Some((reg, doorbell, answered)) = words else {
        loop {
            clock::sleep_ns(1 << 50);
        }
    };
    let mut seen = [0u32; DEVICES];
    for (s, at_join) in seen.iter_mut().zip(SEEN_AT_JOIN.iter()) {
        *s = at_join.load(Relaxed);
    }
    loop {
        let asked_at = clock::now_ns();
        let bell = doorbell.load(Acquire);
        let mask = reg.take_wanted(slot, &mut seen);
        if mask != 0 && release_asked(mask, asked_at.saturating_sub(NEIGHBOUR_IDLE_NS)) {
            // What was idle at the ask, but younger, is looked at once it reached that age.
            clock::sleep_ns(NEIGHBOUR_IDLE_NS);
            release_asked(mask, asked_at);
        }
        reg.answer(slot, bell);
        shared_memory::wake_all(answered);
        // A process ringing without end costs at most one pass per ANSWER_INTERVAL_NS.
        let spent = clock::now_ns().saturating_sub(asked_at);
        if spent < ANSWER_INTERVAL_NS {
            clock::sleep_ns(ANSWER_INTERVAL_NS - spent);
        }
        shared_memory::wait(doorbell, bell, None);
    }
}

/// The process exits (Note [No driver call after exit] in device/device_layer/give_back.rs): it
/// asks no neighbour from here on (the answering thread still answers, giving nothing back).
pub fn stop() {
    STATE.store(UNAVAILABLE, Release);
}

/// A forked child is not its parent's neighbour and cannot use its CUDA context: it never asks
/// or answers (Note [Neighbours]).
pub fn after_fork_in_child() {
    if SLOT.load(Acquire) != usize::MAX {
        STATE.store(UNAVAILABLE, Release);
    }
}

#[cfg(test)]
mod tests;
