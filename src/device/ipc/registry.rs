//! The IPC registry's layout and rules (Note [IPC] in device/pool/pointers.rs), over plain memory:
//! entries that name a segment's driver handle and a block in it, published by the exporting
//! process and read by the processes that open our handles. Nothing read from it is trusted: an
//! entry is used only when its pid, its token and the handle's size agree, read on both sides of
//! the fields (an entry withdrawn and published again meanwhile has another token). Unit-tested;
//! never calls the system.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::{AcqRel, Acquire, Relaxed, Release}};

const MAGIC: u64 = u64::from_le_bytes(*b"TMIPCRG1");
pub const ENTRIES: usize = 4095;

const FREE: u32 = 0;
const WRITING: u32 = 1;
const LIVE: u32 = 2;

#[repr(C)]
pub struct Registry {
    pub(super) magic: AtomicU64,
    _header: [u64; 15],
    pub(super) entries: [Entry; ENTRIES],
}

#[repr(C)]
pub(super) struct Entry {
    state: AtomicU32,
    pid: AtomicU32,
    token: AtomicU64,
    offset: AtomicU64,
    size: AtomicU64,
    /// The segment's length.
    segment_len: AtomicU64,
    real: [AtomicU64; 8],
    /// When the publishing process started (Note [A pid given again] in device/neighbours); 0:
    /// not said.
    started: AtomicU64,
    /// The pid whose start `started` is: a version that records none publishes over another's.
    started_pid: AtomicU32,
    _pad: [u32; 3],
}

pub const REGISTRY_BYTES: usize = 128 + ENTRIES * 128;
const _: () = assert!(core::mem::size_of::<Registry>() == REGISTRY_BYTES);

/// What an export publishes: a block of `size` bytes at `offset` in the segment of `segment_len`
/// bytes that the driver's handle `real` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub real: [u8; 64],
    pub offset: u64,
    pub size: u64,
    pub segment_len: u64,
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

    /// Publishes `what` for process `me`, started at `started` (0: not known), under `token`
    /// (non-zero) in a free entry, else one a process that ended left (`alive(pid, started)`:
    /// whether the process the entry names still runs); its index, None when every entry is a
    /// live process's. Free entries are looked for first: judging a live one costs system calls.
    pub fn publish(&self, me: u32, started: u64, token: u64, what: &Published, alive: impl Fn(u32, Option<u64>) -> bool) -> Option<u32> {
        let take = |e: &Entry, state: u32| e.state.compare_exchange(state, WRITING, AcqRel, Acquire).is_ok();
        let free = self.entries.iter().enumerate().find(|(_, e)| e.state.load(Acquire) == FREE && take(e, FREE));
        let (index, e) = free.or_else(|| {
            self.entries.iter().enumerate().find(|(_, e)| {
                // A dead process's live entry; one it died writing stays (rare, and never read).
                // Taken by its token first: an entry published again while we judged has another.
                let token = e.token.load(Acquire);
                token != 0
                    && e.state.load(Acquire) == LIVE
                    && !alive(e.pid.load(Acquire), Self::started(e))
                    && e.token.compare_exchange(token, 0, AcqRel, Acquire).is_ok()
                    && take(e, LIVE)
            })
        })?;
        e.token.store(0, Release);
        e.pid.store(me, Relaxed);
        e.started.store(started, Relaxed);
        e.started_pid.store(me, Relaxed);
        e.offset.store(what.offset, Relaxed);
        e.size.store(what.size, Relaxed);
        e.segment_len.store(what.segment_len, Relaxed);
        for (word, bytes) in e.real.iter().zip(what.real.chunks_exact(8)) {
            word.store(u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])), Relaxed);
        }
        e.token.store(token, Release);
        e.state.store(LIVE, Release);
        u32::try_from(index).ok()
    }

    fn started(e: &Entry) -> Option<u64> {
        let said = e.started_pid.load(Relaxed) == e.pid.load(Relaxed);
        Some(e.started.load(Relaxed)).filter(|&t| said && t != 0)
    }

    /// When the process that published live entry `index` under `token` started, as it said;
    /// None when it did not say or the entry is not that.
    pub fn publisher_started(&self, index: u32, pid: u32, token: u64) -> Option<u64> {
        let e = self.entries.get(index as usize)?;
        let agrees = |e: &Entry| e.state.load(Acquire) == LIVE && e.pid.load(Acquire) == pid && token != 0 && e.token.load(Acquire) == token;
        if !agrees(e) {
            return None;
        }
        let started = Self::started(e);
        started.filter(|_| agrees(e))
    }

    /// Process `me` withdraws its entry `index` published under `token`: a later open fails.
    pub fn withdraw(&self, index: u32, me: u32, token: u64) {
        let Some(e) = self.entries.get(index as usize) else { return };
        if e.pid.load(Acquire) == me && e.token.compare_exchange(token, 0, AcqRel, Acquire).is_ok() {
            e.state.store(FREE, Release);
        }
    }

    /// The token entry `index` holds for process `pid`, while live.
    pub fn token(&self, index: u32, pid: u32) -> Option<u64> {
        let e = self.entries.get(index as usize)?;
        let token = e.token.load(Acquire);
        (e.state.load(Acquire) == LIVE && e.pid.load(Acquire) == pid && token != 0).then_some(token)
    }

    /// What entry `index` names for a handle of process `pid` under `token` of `size` bytes;
    /// None when it does not (withdrawn, published again, another process's, damaged).
    pub fn lookup(&self, index: u32, pid: u32, token: u64, size: u64) -> Option<Published> {
        let e = self.entries.get(index as usize)?;
        let agrees = |e: &Entry| e.state.load(Acquire) == LIVE && e.token.load(Acquire) == token && e.pid.load(Acquire) == pid;
        if token == 0 || !agrees(e) {
            return None;
        }
        let mut real = [0u8; 64];
        for (bytes, word) in real.chunks_exact_mut(8).zip(e.real.iter()) {
            bytes.copy_from_slice(&word.load(Relaxed).to_le_bytes());
        }
        let p = Published { real, offset: e.offset.load(Relaxed), size: e.size.load(Relaxed), segment_len: e.segment_len.load(Relaxed) };
        let fits = p.size == size && p.offset.checked_add(p.size).is_some_and(|end| end <= p.segment_len);
        (agrees(e) && fits).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Box<Registry> {
        // SAFETY: every field is an atomic integer or padding, for which all zeroes is a value.
        let r: Box<Registry> = unsafe { Box::new(core::mem::zeroed()) };
        assert!(r.adopt());
        r
    }

    const WHAT: Published = Published { real: [7; 64], offset: 2 << 20, size: 4096, segment_len: 20 << 20 };

    #[test]
    fn an_entry_is_found_only_with_its_pid_token_and_size_and_never_after_withdrawal() {
        let r = registry();
        let i = r.publish(100, 0, 55, &WHAT, |_, _| true).unwrap();
        assert_eq!(r.lookup(i, 100, 55, 4096), Some(WHAT));
        assert_eq!(r.token(i, 100), Some(55));
        assert_eq!(r.lookup(i, 100, 56, 4096), None, "another token");
        assert_eq!(r.lookup(i, 101, 55, 4096), None, "another process");
        assert_eq!(r.lookup(i, 100, 55, 8192), None, "another size");
        r.withdraw(i, 101, 55);
        assert!(r.lookup(i, 100, 55, 4096).is_some(), "only its process withdraws it");
        r.withdraw(i, 100, 55);
        assert_eq!(r.lookup(i, 100, 55, 4096), None, "withdrawn: the freed block's handle opens nothing");
        let j = r.publish(100, 0, 77, &Published { offset: 0, ..WHAT }, |_, _| true).unwrap();
        assert_eq!(j, i, "the entry is reused");
        assert_eq!(r.lookup(i, 100, 55, 4096), None, "an old handle never names the later block");
        assert_eq!(r.lookup(i, 100, 77, 4096).map(|p| p.offset), Some(0));
    }

    /// Two processes publish over a full table at once and judge the same dead entry: the one
    /// that judged last leaves the entry the other has published meanwhile (the review's ABA).
    #[test]
    fn an_entry_published_again_while_judged_is_left_alone() {
        let r = registry();
        for k in 0..ENTRIES as u64 {
            r.publish(100, 5_000, k + 1, &WHAT, |_, _| true).unwrap();
        }
        let judged = std::cell::Cell::new(0);
        let ours = r.publish(300, 0, 99, &WHAT, |pid, _| {
            if judged.replace(judged.get() + 1) == 0 {
                // Meanwhile process 200 takes entry 0 and publishes there.
                let e = &r.entries[0];
                e.token.store(0, Release);
                e.pid.store(200, Relaxed);
                e.token.store(77, Release);
            }
            pid == 200
        });
        assert_eq!(ours, Some(1), "the next dead entry");
        assert_eq!(r.lookup(0, 200, 77, 4096), Some(WHAT), "the other's export stands");
    }

    #[test]
    fn a_dead_processs_entries_are_taken_and_garbage_names_nothing() {
        let r = registry();
        for k in 0..ENTRIES as u64 {
            r.publish(100, 5_000, k + 1, &WHAT, |_, _| true).unwrap();
        }
        assert_eq!(r.publish(200, 0, 9, &WHAT, |_, _| true), None, "full, everyone alive");
        // Note [A pid given again]: pid 100 now names a process that started at another time.
        assert_eq!(r.publisher_started(0, 100, 1), Some(5_000));
        assert!(r.publish(200, 0, 9, &WHAT, |pid, started| pid != 100 || started != Some(5_000)).is_some(), "an ended process's entry");
        assert_eq!(r.publisher_started(0, 100, 1), None, "taken");
        assert!(r.publish(200, 0, 10, &WHAT, |pid, _| pid != 100).is_some(), "a dead process's entry");
        // A version that records no start publishes over an entry of ours: its start says nothing.
        let old = &r.entries[5];
        old.pid.store(300, Relaxed);
        assert_eq!(r.publisher_started(5, 300, 6), None, "not process 300's start");
        let e = &r.entries[3];
        e.segment_len.store(10, Relaxed); // scribbled: the block no longer fits its segment
        assert_eq!(r.lookup(3, 100, 4, 4096), None);
        assert_eq!(r.lookup(ENTRIES as u32 + 5, 100, 4, 4096), None, "out of range");
        assert_eq!(r.lookup(5, 100, 0, 4096), None, "a zero token names nothing");
    }
}
