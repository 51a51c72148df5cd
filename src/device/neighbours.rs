//! The pools of several processes on one GPU, known to each other (Note [Neighbours]): the
//! registry's layout and rules over plain memory (`Registry`, unit-tested), and this process's
//! side of it (`join`, `ask`, the thread that answers).
//
// Note [Neighbours]
// A process whose device allocation fails, after giving back its own cache, asks the other
// processes on the same GPU to give back their idle segments, waits a bounded time
// (TENSORMALLOC_CUDA_NEIGHBOUR_WAIT_MS) for their answers, and retries once. There is no daemon:
// the user's processes share one small file, /dev/shm/tensormalloc-UID-neighbours (0600, this
// user's own: another user's file, a symlink or another size is not used). Each process whose
// pool mapped a segment holds a slot: its pid, the GPUs it pools on (by UUID, the same in every
// process whatever CUDA_VISIBLE_DEVICES renumbers), a doorbell and an answer word. An asker bumps
// the device's `wanted` count in every live slot that pools on its GPU, rings the doorbell (a
// futex shared across processes) and waits on the answer word; the slot's owner runs one thread,
// asleep on its doorbell, that gives back every idle segment of each device asked for (in the
// pool's own context, as the background thread does: DeviceLayer::release_for_neighbour) and
// answers with the doorbell's value it served.
// Nothing read from the file is trusted: a pid is only ever signalled with signal 0 (to know it
// lives), counters are compared, never used as sizes or indices, and every wait is bounded. A
// neighbour that died leaves a slot the next process takes; one that is stopped (SIGSTOP) or of
// another version never answers, and the asker's wait ends at its bound; a process ringing
// without end costs the answering thread at most one pass a millisecond. A full /dev/shm, no
// /dev/shm, or a file not ours: no cooperation, every process works on its own. Not covered: a
// process of the same user that truncates the file (the next access faults, as any shared
// mapping's would).
// A forked child of a process that joined never asks or answers: its parent's CUDA context is not
// its own (Note [Forked children]); the answering thread is not copied by fork anyway.

use crate::sys::{clock, cuda_driver, files, process, shared_memory, thread};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed, Release}};

const MAGIC: u64 = u64::from_le_bytes(*b"TMNEIGH1");
pub const SLOTS: usize = 127;
/// GPUs a slot names: a process pooling on more is asked about its first eight only.
pub const DEVICES: usize = 8;
/// A device's identity in the registry; [0, 0] is an empty entry.
pub type Key = [u64; 2];

#[repr(C)]
pub struct Registry {
    magic: AtomicU64,
    _header: [u64; 31],
    slots: [Slot; SLOTS],
}

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    doorbell: AtomicU32,
    answered: AtomicU32,
    _pad: u32,
    devices: [Entry; DEVICES],
    _tail: [u64; 6],
}

#[repr(C)]
struct Entry {
    key: [AtomicU64; 2],
    wanted: AtomicU32,
    _pad: u32,
}

pub const REGISTRY_BYTES: usize = 32768;
const _: () = assert!(core::mem::size_of::<Registry>() == REGISTRY_BYTES);

/// One neighbour asked: its slot and the doorbell value its answer must reach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    pub slot: usize,
    pub ticket: u32,
}

/// Whether `value` has reached `ticket` (counters wrap).
fn reached(value: u32, ticket: u32) -> bool {
    value.wrapping_sub(ticket) as i32 >= 0
}

impl Registry {
    /// Sets the layout's mark in a new file, or checks it in an existing one; false: another
    /// version's file (or garbage), not to be used.
    pub fn adopt(&self) -> bool {
        match self.magic.compare_exchange(0, MAGIC, AcqRel, Acquire) {
            Ok(_) => true,
            Err(found) => found == MAGIC,
        }
    }

    fn slot(&self, index: usize) -> Option<&Slot> {
        self.slots.get(index)
    }

    /// A slot for process `me`: one it held already (a pid the kernel gave again after the old
    /// process died), else a free one or a dead process's. Its device entries start empty.
    pub fn claim(&self, me: u32, alive: impl Fn(u32) -> bool) -> Option<usize> {
        let index = self.slots.iter().position(|s| s.pid.load(Acquire) == me).or_else(|| {
            self.slots.iter().position(|s| {
                let pid = s.pid.load(Acquire);
                (pid == 0 || !alive(pid)) && s.pid.compare_exchange(pid, me, AcqRel, Acquire).is_ok()
            })
        })?;
        for e in self.slot(index).map_or(&[][..], |s| &s.devices[..]) {
            e.key[0].store(0, Relaxed);
            e.key[1].store(0, Release);
        }
        Some(index)
    }

    /// Names device `key` in slot `slot` (ours); its entry index, None when all are taken.
    pub fn enter(&self, slot: usize, key: Key) -> Option<usize> {
        let entries = &self.slot(slot)?.devices;
        if let Some(i) = entries.iter().position(|e| Self::key_of(e) == key) {
            return Some(i);
        }
        let (i, e) = entries.iter().enumerate().find(|(_, e)| Self::key_of(e) == [0, 0])?;
        e.key[0].store(key[0], Relaxed);
        e.key[1].store(key[1], Release);
        Some(i)
    }

    fn key_of(e: &Entry) -> Key {
        [e.key[0].load(Relaxed), e.key[1].load(Acquire)]
    }

    /// Asks every live process other than `me` that pools on device `key`: bumps that device's
    /// `wanted` in its slot, then its doorbell (the caller rings it). Returns how many it put in
    /// `out`.
    pub fn ask(&self, me: u32, key: Key, alive: impl Fn(u32) -> bool, out: &mut [Asked]) -> usize {
        let mut n = 0;
        for (index, s) in self.slots.iter().enumerate() {
            let Some(place) = out.get_mut(n) else { break };
            let pid = s.pid.load(Acquire);
            if pid == 0 || pid == me || !alive(pid) {
                continue;
            }
            let Some(e) = s.devices.iter().find(|e| Self::key_of(e) == key) else { continue };
            e.wanted.fetch_add(1, AcqRel);
            let ticket = s.doorbell.fetch_add(1, AcqRel).wrapping_add(1);
            *place = Asked { slot: index, ticket };
            n += 1;
        }
        n
    }

    /// The pid slot `slot` names now (0: none).
    pub fn pid(&self, slot: usize) -> u32 {
        self.slot(slot).map_or(0, |s| s.pid.load(Acquire))
    }

    pub fn doorbell(&self, slot: usize) -> Option<&AtomicU32> {
        Some(&self.slot(slot)?.doorbell)
    }

    pub fn answer_word(&self, slot: usize) -> Option<&AtomicU32> {
        Some(&self.slot(slot)?.answered)
    }

    /// Whether the neighbour asked in `a` has answered.
    pub fn answered(&self, a: Asked) -> bool {
        self.answer_word(a.slot).is_some_and(|w| reached(w.load(Acquire), a.ticket))
    }

    /// Slot `slot`'s devices asked for since `seen` (updated), as a bit mask of entry indices.
    pub fn take_wanted(&self, slot: usize, seen: &mut [u32; DEVICES]) -> u32 {
        let mut mask = 0;
        let entries = self.slot(slot).map_or(&[][..], |s| &s.devices[..]);
        for (i, (e, seen)) in entries.iter().zip(seen.iter_mut()).enumerate() {
            let wanted = e.wanted.load(Acquire);
            if wanted != *seen {
                *seen = wanted;
                mask |= 1 << i;
            }
        }
        mask
    }

    /// The owner of `slot` served every ask up to doorbell value `bell`.
    pub fn answer(&self, slot: usize, bell: u32) {
        if let Some(w) = self.answer_word(slot) {
            w.store(bell, Release);
        }
    }
}

// ---------- this process's side ----------

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
/// What the answering thread calls for each device asked for (DeviceLayer::release_for_neighbour);
/// a `fn(i32) -> u64`, null until set.
static RELEASE: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Set at init: what answering gives back, and how long asking waits (0: never ask or answer).
pub fn configure(release: fn(i32) -> u64, wait_ms: u64) {
    RELEASE.store(release as *mut (), Release);
    WAIT_NS.store(wait_ms.saturating_mul(1_000_000), Relaxed);
    if wait_ms == 0 {
        STATE.store(UNAVAILABLE, Release);
    }
}

/// The registry, opened on first use; None when there is none to use.
fn registry() -> Option<&'static Registry> {
    if STATE.load(Acquire) == UNTRIED && STATE.compare_exchange(UNTRIED, OPENING, AcqRel, Acquire).is_ok() {
        let mut name = [0u8; 64];
        let mut uid = [0u8; 20];
        let uid = files::decimal(u64::from(process::user_id()), &mut uid);
        let mut n = 0;
        for (slot, &b) in name.iter_mut().zip(b"tensormalloc-".iter().chain(uid).chain(b"-neighbours")) {
            *slot = b;
            n += 1;
        }
        let mapped = shared_memory::map_own_file(name.get(..n).unwrap_or(&[]), REGISTRY_BYTES).map(|p| p.cast::<Registry>());
        // SAFETY: a live shared mapping of REGISTRY_BYTES, never unmapped; every field is an
        // atomic (or padding), so whatever another process wrote there is a valid value.
        let usable = mapped.filter(|&p| unsafe { (*p).adopt() });
        match usable {
            Some(p) => {
                REGISTRY.store(p, Release);
                STATE.store(READY, Release);
            }
            None => STATE.store(UNAVAILABLE, Release),
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
        let claimed = reg.claim(process::id(), shared_memory::process_alive);
        if let Some(s) = claimed {
            SLOT.store(s, Release);
            if !thread::spawn(c"tensormalloc-nb", answer_forever) {
                STATE.store(UNAVAILABLE, Release);
            }
        }
        let Some(s) = claimed else { return };
        slot = s;
    }
    if let Some(ordinal) = reg.enter(slot, key_of(device)).and_then(|entry| ORDINALS.get(entry)) {
        ordinal.store(device, Release);
    }
    joined.store(true, Release);
}

/// Processes that let an ask wait out its bound (stopped, or a pid the kernel gave to a process
/// that is no neighbour): not asked again by this process, so each costs the wait once.
static SILENT: [AtomicU32; 16] = [const { AtomicU32::new(0) }; 16];
static SILENT_NEXT: AtomicUsize = AtomicUsize::new(0);

fn silent(pid: u32) -> bool {
    SILENT.iter().any(|s| s.load(Relaxed) == pid)
}

/// Our allocation on `device` failed with our cache given back: asks the neighbours pooling on
/// that GPU for their idle segments and waits, bounded, for their answers. True when one
/// answered (a retry may succeed).
pub fn ask(device: i32) -> bool {
    let Some(reg) = registry() else { return false };
    let mut asked = [Asked::default(); 16];
    let n = reg.ask(process::id(), key_of(device), |pid| !silent(pid) && shared_memory::process_alive(pid), &mut asked);
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
                if let Some(slot) = SILENT.get(SILENT_NEXT.fetch_add(1, Relaxed) % SILENT.len()) {
                    slot.store(reg.pid(a.slot), Relaxed);
                }
                break;
            }
            shared_memory::wait(word, seen, Some(deadline - now));
        }
    }
    any
}

/// The answering thread: asleep on our doorbell; each ring gives back the idle segments of the
/// devices asked for, then answers.
fn answer_forever() -> ! {
    let slot = SLOT.load(Acquire);
    let words = registry().and_then(|reg| Some((reg, reg.doorbell(slot)?, reg.answer_word(slot)?)));
    let Some((reg, doorbell, answered)) = words else {
        loop {
            clock::sleep_ns(1 << 50);
        }
    };
    let mut seen = [0u32; DEVICES];
    reg.take_wanted(slot, &mut seen);
    loop {
        let started = clock::now_ns();
        let bell = doorbell.load(Acquire);
        let mask = reg.take_wanted(slot, &mut seen);
        let release = RELEASE.load(Acquire);
        for (i, ordinal) in ORDINALS.iter().enumerate() {
            let device = ordinal.load(Acquire);
            if mask & (1 << i) != 0 && device >= 0 && !release.is_null() {
                // SAFETY: only `configure` stores here, a `fn(i32) -> u64`.
                unsafe { core::mem::transmute::<*mut (), fn(i32) -> u64>(release)(device) };
            }
        }
        reg.answer(slot, bell);
        shared_memory::wake_all(answered);
        // A process ringing without end costs at most one pass a millisecond.
        let spent = clock::now_ns().saturating_sub(started);
        if spent < 1_000_000 {
            clock::sleep_ns(1_000_000 - spent);
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
