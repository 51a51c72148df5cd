//! Blocks in flight at a fork (Note [Blocks in flight]): the few blocks that are, for a moment,
//! kept from forked children while the registry still records them. A thread names its block in
//! a slot for that moment; the child of a fork clears the records of the blocks named.
//! Lock-free; a claim is made outside every lock, so waiting for a slot can never deadlock.

use core::sync::atomic::{AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed, Release}};

// Note [Blocks in flight]
// A hit takes a block out of the cache (its record becomes live, under the cache lock) and
// readmits it for fork (MADV_DOFORK) after the lock; a free keeps the block from children
// (MADV_DONTFORK, Note [Plain memory]) before it enters the cache under the lock. A fork in
// either gap gives the child a live record of a block it did not inherit: the child's next
// mapping there (glibc's own, for a small malloc) would look like the inside of a block of ours,
// and its free would abort. So a block is named here for the gap (a hit names it under the lock,
// a free before its first advice), and the child's fork handler clears the named records. A
// named block the child did inherit (the fork came before the advice) is one that no code in
// the child holds (being handed out or given back by a thread the child does not have): clearing
// its record leaves it mapped and unused, as glibc leaves such a block in a child.

/// Concurrent hits and frees between them and the cache; more wait for a slot.
const SLOTS: usize = 64;
/// A slot claimed before its block is known.
const CLAIMED: usize = 1;

pub struct InFlight {
    slots: [AtomicUsize; SLOTS],
}

/// A claimed slot, given back when dropped.
pub struct Claim<'a> {
    slot: &'a AtomicUsize,
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new()
    }
}

impl InFlight {
    pub const fn new() -> Self {
        InFlight { slots: [const { AtomicUsize::new(0) }; SLOTS] }
    }

    /// A free slot, waited for (outside every lock) when all are taken; `hint` spreads threads.
    pub fn claim(&self, hint: usize) -> Claim<'_> {
        loop {
            for i in 0..SLOTS {
                let Some(slot) = self.slots.get((hint + i) % SLOTS) else { continue };
                if slot.load(Relaxed) == 0 && slot.compare_exchange(0, CLAIMED, AcqRel, Relaxed).is_ok() {
                    return Claim { slot };
                }
            }
            core::hint::spin_loop();
        }
    }

    /// In a forked child: calls `f` with every block named, and empties the slots (the threads
    /// that claimed them do not exist here).
    pub fn drain(&self, mut f: impl FnMut(usize)) {
        for slot in &self.slots {
            let addr = slot.swap(0, Acquire);
            if addr > CLAIMED {
                f(addr);
            }
        }
    }
}

impl Claim<'_> {
    /// Names the block at `addr` (a block start: never 0 or 1).
    pub fn name(&self, addr: usize) {
        self.slot.store(addr, Release);
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.slot.store(0, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_blocks_are_drained_and_given_back_slots_reused() {
        let t = InFlight::new();
        let a = t.claim(3);
        let b = t.claim(3);
        a.name(0x10_0000);
        let unnamed = t.claim(0);
        drop(b);
        let mut seen = vec![];
        t.drain(|addr| seen.push(addr));
        assert_eq!(seen, vec![0x10_0000], "claimed but unnamed slots are not blocks");
        drop((a, unnamed));
        let all: Vec<_> = (0..SLOTS).map(|i| t.claim(i)).collect();
        assert_eq!(all.len(), SLOTS, "every slot came back");
    }
}
