//! The neighbour registry's layout and rules (Note [Neighbours] in mod.rs), over plain memory:
//! slots that name a process and the GPUs it pools on, doorbells and answer words; nothing read
//! from it is trusted (counters compared, never used as sizes or indices). Unit-tested; never
//! calls the system.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::{AcqRel, Acquire, Relaxed, Release}};

const MAGIC: u64 = u64::from_le_bytes(*b"TMNEIGH1");
pub const SLOTS: usize = 127;
/// GPUs a slot names: a process pooling on more is asked about its first eight only.
pub const DEVICES: usize = 8;
/// A device's identity in the registry; [0, 0] is an empty entry.
pub type Key = [u64; 2];

#[repr(C)]
pub struct Registry {
    pub(super) magic: AtomicU64,
    _header: [u64; 31],
    pub(super) slots: [Slot; SLOTS],
}

#[repr(C)]
pub(super) struct Slot {
    pub(super) pid: AtomicU32,
    pub(super) doorbell: AtomicU32,
    pub(super) answered: AtomicU32,
    _pad: u32,
    pub(super) devices: [Entry; DEVICES],
    /// The pid whose start `started` is (a version that records none leaves another's here).
    started_pid: AtomicU32,
    _pad2: u32,
    /// When the owner started (Note [A pid given again] in mod.rs); 0: not said.
    started: AtomicU64,
    _tail: [u64; 4],
}

#[repr(C)]
pub(super) struct Entry {
    key: [AtomicU64; 2],
    pub(super) wanted: AtomicU32,
    _pad: u32,
}

pub const REGISTRY_BYTES: usize = 32768;
const _: () = assert!(core::mem::size_of::<Registry>() == REGISTRY_BYTES);

/// A slot's owner as the slot names it: its pid, and when it started where the process that
/// claimed the slot said so (the kernel's start time, compared, never trusted further).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub started: Option<u64>,
}

/// One neighbour asked: its slot and the doorbell value its answer must reach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    pub slot: usize,
    /// The pid the slot named when asked.
    pub pid: u32,
    pub ticket: u32,
}

/// Whether `value` has reached `ticket` (counters wrap).
pub(super) fn reached(value: u32, ticket: u32) -> bool {
    value.wrapping_sub(ticket) as i32 >= 0
}

impl Slot {
    fn owner(&self) -> Owner {
        let pid = self.pid.load(Acquire);
        let said = self.started_pid.load(Acquire) == pid;
        let started = self.started.load(Relaxed);
        Owner { pid, started: (said && started != 0).then_some(started) }
    }
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

    /// A slot for process `me`, started at `started` (0: not known): one it held already (a pid
    /// the kernel gave again after the old process died), else a free one or a dead process's.
    /// Its device entries start empty. A slot whose pid the kernel gave to a process that is no
    /// neighbour is not taken: that process could be taking it back as its own meanwhile.
    pub fn claim(&self, me: u32, started: u64, alive: impl Fn(u32) -> bool) -> Option<usize> {
        let index = self.slots.iter().position(|s| s.pid.load(Acquire) == me).or_else(|| {
            self.slots.iter().position(|s| {
                let pid = s.pid.load(Acquire);
                (pid == 0 || !alive(pid)) && s.pid.compare_exchange(pid, me, AcqRel, Acquire).is_ok()
            })
        })?;
        if let Some(s) = self.slot(index) {
            s.started.store(started, Relaxed);
            s.started_pid.store(me, Release);
            for e in &s.devices {
                e.key[0].store(0, Relaxed);
                e.key[1].store(0, Release);
            }
            // No ask is answered before it is made: a slot whose words are a dead owner's, or
            // garbage, would otherwise read as answered at once.
            s.answered.store(s.doorbell.load(Acquire), Release);
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

    /// Asks every process other than `me` that pools on device `key` and that `eligible(slot,
    /// owner)` accepts (alive, not silent): bumps that device's `wanted` in its slot, then its
    /// doorbell (the caller rings it). Returns how many it put in `out`; with `out` as long as
    /// the table (SLOTS), every such process.
    pub fn ask(&self, me: u32, key: Key, eligible: impl Fn(usize, Owner) -> bool, out: &mut [Asked]) -> usize {
        let mut n = 0;
        for (index, s) in self.slots.iter().enumerate() {
            let Some(place) = out.get_mut(n) else { break };
            let owner = s.owner();
            let pid = owner.pid;
            if pid == 0 || pid == me || !eligible(index, owner) {
                continue;
            }
            let Some(e) = s.devices.iter().find(|e| Self::key_of(e) == key) else { continue };
            e.wanted.fetch_add(1, AcqRel);
            let ticket = s.doorbell.fetch_add(1, AcqRel).wrapping_add(1);
            *place = Asked { slot: index, pid, ticket };
            n += 1;
        }
        n
    }

    /// Process `me` gives its slot up (it cannot answer): the slot is free for the next.
    pub fn leave(&self, slot: usize, me: u32) {
        if let Some(s) = self.slot(slot) {
            let _ = s.pid.compare_exchange(me, 0, AcqRel, Acquire);
        }
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
