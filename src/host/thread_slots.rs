//! Blocks a thread freed and is likely to ask for again at once, each kept in a slot of the
//! thread's own beside the cache (Note [A thread's own slot]).
//
// Note [A thread's own slot]
// A loop that frees a large block and then asks for one of the same size (numpy's temporaries,
// a scratch buffer, a training step's activations) went through the cache's whole path twice:
// its lock, its insert and take, the tally, the timing table, the registry's rewrite: about
// 1,380 instructions a pair where tcmalloc spends 550 (issue 38). So a block freed with nothing
// to undo (its pages as we handed them out: no mark but its zeroing votes and huge-page advice)
// goes to its thread's slot instead: its registry entry says so (a compare-exchange, so that a
// second free of it is the double free it is), and its free is recorded as every free is (the
// ledger, the trace, the scopes, the history ring). The thread's next request of the block's
// length takes it back with one compare-exchange (zeroed for calloc as a cached block is); a
// request of another length first sends it on to the cache, so the thread's own figures stay
// what they were without a slot; so does a plain block asked for by code that advises huge pages
// while the cache may hold that code's own (the cache's rule for its block freed last, Note [The
// block freed last]: numpy took Python's block from the slot, and Python's next one mapped 80 MB
// afresh each step). Whoever must see every idle block empties the slots first, through the
// cache's own free path, with the time each block was freed: the background pass once a block
// is due (a block in a slot is released or expired as a cached one would be; a pass taking a hot
// loop's block made that loop's next request map anew while the block was on its way), trims
// (malloc_trim, mlockall, a refused mapping, the cache turned off), a range the program claims,
// a mapping limit, fork's prepare handler, a request that would otherwise miss, dlclose (an
// unloaded library's row), the stats and the reports. A block in a slot counts as live in its
// holder's row until it leaves the slot (taken back by the same holder for the same size,
// nothing there changes; by another, the rows move under the cache lock), and so in the live
// peaks that other threads' requests set meanwhile.
// A pair reads the clock once, at the free (a coarse read costs 7-10 ns here, a tenth of the
// pair): the block taken back is stamped with its free's time. The pass sends a block to the
// cache LONGEST_WAIT_NS after its free (sooner if the cache releases sooner), so that stamp is at
// most a second early, plus however late the pass runs; in a loop the two are the same coarse
// tick. Not less: with 100 ms, a thread of 16 on 2 cores waiting that long for the CPU found its
// block on its way to the cache and mapped a fresh one (the 16-thread seed: 19 misses in 6 runs
// of 30, where it makes 18).
// A slot is one thread's (given at its first free there, to the thread's pointer: from a
// process's SLOTS+1th such live thread on, frees take the cache's path as before), so its counts
// of reuses are plain stores, which the readers fold into the tally under the cache lock
// (`reuses_to_count`; a forked child forgets its parent's); its block is taken with an exchange,
// since the background pass may take it at the same moment. A thread finds its slot by its
// thread pointer, one register read, in one of two homes its pointer hashes to (a thread-local
// lookup is a call to __tls_get_addr from a shared library: two of them were 36 instructions
// of the pair's 670); a thread whose homes were both given finds it through a thread-local
// word. A thread that starts where an ended one was (glibc reuses a stack, and the pointer with
// it) takes over the ended thread's slot, block and all: it is the slot's one writer now.
// Slots are not used where the cache's bounds are exact or tight (a byte or block bound the
// user set, a mapping limit, a memory-limited cgroup): a block in a slot is idle memory those
// bounds do not count. Elsewhere a block goes to a slot only if it is at most a SLOTS-th of the
// cache's ceiling (a quarter of memory), so the slots together hold at most as much again as
// the cache may, each block a second at most: a 7 GiB block freed, or eight threads' 1 GiB
// blocks, kept resident past the cache's bound until due (the rerun helper's finding) go the
// cache's way, which refuses or evicts.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed, Release}};

/// Slots a process has: threads whose frees use one.
pub const SLOTS: usize = 32;
const _: () = assert!(SLOTS.is_power_of_two(), "homes() takes bits of a hash");

/// The longest a block waits in a slot before the background pass sends it to the cache (less
/// when the cache releases sooner): a block taken back is stamped with its free's time, read
/// once for the pair, so its stamp is at most this early (Note [A thread's own slot]).
pub const LONGEST_WAIT_NS: u64 = 1_000_000_000;

/// One thread's freed block and what it handed out again.
#[repr(align(64))]
struct Slot {
    /// The thread pointer of the thread it was given to (`sys::thread::pointer`, 1 where there
    /// is none), 0 while no thread has it.
    owner: AtomicUsize,
    /// The block's start and length (`pack`), 0 for none.
    block: AtomicU64,
    /// When the program freed it.
    freed_ns: AtomicU64,
    /// Blocks handed out from this slot again, and their bytes (each a free, a request and a
    /// hit), written by the slot's thread; how many of them the tally has counted, written
    /// under the cache lock.
    reuses: AtomicU64,
    reuse_bytes: AtomicU64,
    counted: AtomicU64,
    counted_bytes: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Slot { owner: AtomicUsize::new(0), block: AtomicU64::new(0), freed_ns: AtomicU64::new(0), reuses: AtomicU64::new(0), reuse_bytes: AtomicU64::new(0), counted: AtomicU64::new(0), counted_bytes: AtomicU64::new(0) }
    }
}

/// A block put in or taken from a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotBlock {
    pub addr: usize,
    pub len: usize,
    pub freed_ns: u64,
}

/// The slots of one host layer.
pub struct ThreadSlots {
    slots: [Slot; SLOTS],
    /// The table's number among every table the process made (0 before its first slot is
    /// given): what a thread remembers its slot by (a table's address may be a later one's).
    number: AtomicUsize,
}

/// Tables numbered so far.
static TABLES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The table the thread's slot is in, and 1 + the slot (SLOTS + 1: none was left).
    static OWN: core::cell::Cell<(usize, usize)> = const { core::cell::Cell::new((0, 0)) };
}

/// Page-aligned starts and lengths under 2^48 and 2^40 bytes fit in one word.
const PAGE_SHIFT: u32 = 12;
const LEN_BITS: u32 = 28;
/// The longest block a slot holds.
pub const MAX_LEN: usize = (1 << (LEN_BITS + PAGE_SHIFT)) - (1 << PAGE_SHIFT);

fn pack(addr: usize, len: usize) -> u64 {
    ((addr as u64 >> PAGE_SHIFT) << LEN_BITS) | (len as u64 >> PAGE_SHIFT)
}

fn unpack(word: u64) -> (usize, usize) {
    (((word >> LEN_BITS) << PAGE_SHIFT) as usize, ((word & ((1 << LEN_BITS) - 1)) << PAGE_SHIFT) as usize)
}

/// Whether a block can go in a slot at all: page-aligned, within the packed word's range.
pub fn fits(addr: usize, len: usize) -> bool {
    (addr | len) & ((1 << PAGE_SHIFT) - 1) == 0 && len > 0 && len <= MAX_LEN && (addr as u64) >> 48 == 0
}

/// The two slots a thread whose pointer is `tp` looks in first: Fibonacci hashing's top bits,
/// two groups of them (threads' pointers lie a stack apart, a multiple of a page).
#[inline(always)]
fn homes(tp: usize) -> [usize; 2] {
    const BITS: u32 = SLOTS.trailing_zeros();
    let h = (tp as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    [(h >> (64 - BITS)) as usize, (h >> (64 - 2 * BITS)) as usize & (SLOTS - 1)]
}

impl Default for ThreadSlots {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadSlots {
    pub const fn new() -> Self {
        ThreadSlots { slots: [const { Slot::new() }; SLOTS], number: AtomicUsize::new(0) }
    }

    /// The calling thread's slot, given at its first call (None: every slot is another live
    /// thread's).
    #[inline]
    pub fn own_slot(&self) -> Option<usize> {
        let tp = crate::sys::thread::pointer();
        self.at_home(tp).or_else(|| self.own_slot_elsewhere(tp))
    }

    /// The slot of the thread whose pointer is `tp` if it is one of the two its pointer hashes to.
    #[inline(always)]
    fn at_home(&self, tp: usize) -> Option<usize> {
        if tp == 0 {
            return None;
        }
        homes(tp).into_iter().find(|&i| self.slots.get(i).is_some_and(|s| s.owner.load(Relaxed) == tp))
    }

    /// `own_slot` for a thread not at home: the slot it was given, remembered by the table's
    /// number (a process has one table; tests make many), or one given now.
    #[cold]
    fn own_slot_elsewhere(&self, tp: usize) -> Option<usize> {
        let table = self.number();
        OWN.with(|own| {
            let (of, mut v) = own.get();
            if of != table {
                v = self.give(tp).map_or(SLOTS + 1, |i| i + 1);
                own.set((table, v));
            }
            (v <= SLOTS).then(|| v - 1)
        })
    }

    /// A slot for the thread whose pointer is `tp`: one an ended thread with that pointer had,
    /// else a free one, its homes first; None when every slot is another thread's.
    fn give(&self, tp: usize) -> Option<usize> {
        let owner = tp.max(1);
        if tp != 0 {
            if let Some(i) = self.slots.iter().position(|s| s.owner.load(Relaxed) == tp) {
                return Some(i);
            }
        }
        homes(tp).into_iter().chain(0..SLOTS).find(|&i| self.slots.get(i).is_some_and(|s| s.owner.compare_exchange(0, owner, Relaxed, Relaxed).is_ok()))
    }

    fn number(&self) -> usize {
        let n = self.number.load(Relaxed);
        if n != 0 {
            return n;
        }
        let fresh = TABLES.fetch_add(1, Relaxed) + 1;
        match self.number.compare_exchange(0, fresh, Relaxed, Relaxed) {
            Ok(_) => fresh,
            Err(theirs) => theirs,
        }
    }

    /// The calling thread's slot if it has one (a thread that never freed here has none, unless
    /// it took over an ended thread's).
    #[inline]
    pub fn slot_given(&self) -> Option<usize> {
        let tp = crate::sys::thread::pointer();
        self.at_home(tp).or_else(|| self.slot_given_elsewhere())
    }

    #[cold]
    fn slot_given_elsewhere(&self) -> Option<usize> {
        let table = self.number.load(Relaxed);
        OWN.with(|own| {
            let (of, v) = own.get();
            (of == table && table != 0 && v <= SLOTS).then(|| v - 1)
        })
    }

    /// Puts a block in slot `i` (the caller's: no other thread puts one there); returns what the
    /// slot held, for the caller to send to the cache.
    pub fn put(&self, i: usize, b: SlotBlock) -> Option<SlotBlock> {
        let Some(slot) = self.slots.get(i) else { return Some(b) };
        // Only its thread writes the time: the one before is the block before's.
        let before_ns = slot.freed_ns.load(Relaxed);
        // The pass may take the block between the two stores: it then reads this block's time
        // or the one before, never a later one.
        slot.freed_ns.store(b.freed_ns, Relaxed);
        // Only its thread fills a slot: an empty one stays empty until this store, with no
        // locked instruction.
        let old = if slot.block.load(Relaxed) == 0 {
            slot.block.store(pack(b.addr, b.len), Release);
            0
        } else {
            slot.block.swap(pack(b.addr, b.len), AcqRel)
        };
        (old != 0).then(|| {
            let (addr, len) = unpack(old);
            SlotBlock { addr, len, freed_ns: before_ns }
        })
    }

    /// What slot `i` holds and when it was freed (a moment's look: the time may be a later
    /// block's).
    pub fn peek_freed(&self, i: usize) -> Option<SlotBlock> {
        let slot = self.slots.get(i)?;
        let word = slot.block.load(Acquire);
        (word != 0).then(|| {
            let (addr, len) = unpack(word);
            SlotBlock { addr, len, freed_ns: slot.freed_ns.load(Relaxed) }
        })
    }

    /// Takes `seen` (a `peek_freed`) from slot `i` if it is still there, with the time of its
    /// latest free: its thread may have taken it back and freed it again since the look (the
    /// same word), and the time it wrote before the block is seen once the block is taken.
    pub fn take_seen(&self, i: usize, seen: SlotBlock) -> Option<SlotBlock> {
        let slot = self.slots.get(i)?;
        slot.block.compare_exchange(pack(seen.addr, seen.len), 0, Acquire, Relaxed).ok()?;
        Some(SlotBlock { freed_ns: slot.freed_ns.load(Relaxed).max(seen.freed_ns), ..seen })
    }

    /// Takes whatever slot `i` holds.
    pub fn take(&self, i: usize) -> Option<SlotBlock> {
        let slot = self.slots.get(i)?;
        if slot.block.load(Relaxed) == 0 {
            return None;
        }
        let word = slot.block.swap(0, AcqRel);
        (word != 0).then(|| {
            let (addr, len) = unpack(word);
            SlotBlock { addr, len, freed_ns: slot.freed_ns.load(Relaxed) }
        })
    }

    /// Counts a block of `len` bytes handed out again from slot `i` (its owner's call).
    pub fn count_reuse(&self, i: usize, len: usize) {
        let Some(slot) = self.slots.get(i) else { return };
        slot.reuses.store(slot.reuses.load(Relaxed) + 1, Relaxed);
        slot.reuse_bytes.store(slot.reuse_bytes.load(Relaxed) + len as u64, Relaxed);
    }

    /// Blocks handed out again from every slot since the last call, and their bytes. Under the
    /// cache lock (its caller's the only writer of what was counted).
    pub fn reuses_to_count(&self) -> (u64, u64) {
        self.slots.iter().fold((0, 0), |(n, b), s| {
            let (reuses, bytes) = (s.reuses.load(Relaxed), s.reuse_bytes.load(Relaxed));
            let (counted, counted_bytes) = (s.counted.swap(reuses, Relaxed), s.counted_bytes.swap(bytes, Relaxed));
            (n + (reuses - counted), b + (bytes - counted_bytes))
        })
    }

    /// Bytes in slots now (a moment's sum: slots change meanwhile).
    pub fn bytes(&self) -> usize {
        self.slots.iter().map(|s| unpack(s.block.load(Relaxed)).1).sum()
    }

    /// Whether any slot holds a block now.
    pub fn any(&self) -> bool {
        self.slots.iter().any(|s| s.block.load(Relaxed) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_holds_a_block() {
        for (addr, len) in [(0x7f00_0000_0000, 4 << 20), (1 << 12, 1 << 12), (0xffff_ffff_f000, MAX_LEN)] {
            assert!(fits(addr, len));
            assert_eq!(unpack(pack(addr, len)), (addr, len));
        }
        assert!(!fits(0x1000, MAX_LEN + 4096), "longer than a word holds");
        assert!(!fits(0x1_0000_0000_0000, 4096), "past 48 bits");
        assert!(!fits(0x1800, 4096) && !fits(0x1000, 0));
    }

    #[test]
    fn a_slot_gives_its_block_once() {
        let p = ThreadSlots::new();
        let b = SlotBlock { addr: 0x10_0000, len: 8 << 20, freed_ns: 5 };
        assert_eq!(p.put(3, b), None);
        assert_eq!(p.peek_freed(3), Some(b));
        assert_eq!(p.bytes(), 8 << 20);
        assert_eq!(p.take_seen(3, SlotBlock { len: 4 << 20, ..b }), None, "another length is not this block");
        assert_eq!(p.take_seen(3, b), Some(b));
        assert_eq!(p.take_seen(3, b), None, "taken once");
        assert_eq!(p.take(3), None);
        assert!(!p.any());
    }

    /// The pass looked, the thread took the block back and freed it again (the same word): the
    /// pass takes it with the later free's time, never the one it looked at (the slots hunter).
    #[test]
    fn a_block_taken_after_a_look_has_its_latest_frees_time() {
        let p = ThreadSlots::new();
        let b = SlotBlock { addr: 0x10_0000, len: 8 << 20, freed_ns: 5 };
        p.put(2, b);
        let seen = p.peek_freed(2).unwrap();
        assert_eq!(p.take_seen(2, b), Some(b));
        p.put(2, SlotBlock { freed_ns: 9, ..b });
        assert_eq!(p.take_seen(2, seen), Some(SlotBlock { freed_ns: 9, ..b }));
        assert_eq!(p.take_seen(2, seen), None, "taken once");
    }

    #[test]
    fn a_block_put_over_another_hands_the_other_back() {
        let p = ThreadSlots::new();
        let a = SlotBlock { addr: 0x10_0000, len: 4 << 20, freed_ns: 5 };
        let b = SlotBlock { addr: 0x90_0000, len: 2 << 20, freed_ns: 9 };
        p.put(0, a);
        assert_eq!(p.put(0, b).map(|o| (o.addr, o.len)), Some((a.addr, a.len)));
        assert_eq!(p.take(0), Some(b));
    }

    #[test]
    fn a_block_is_taken_by_one_of_two_racing_takers() {
        let p = std::sync::Arc::new(ThreadSlots::new());
        for round in 0..2000 {
            let b = SlotBlock { addr: 0x10_0000 + round * 4096, len: 4 << 20, freed_ns: 1 };
            p.put(1, b);
            let q = p.clone();
            let other = std::thread::spawn(move || q.take(1).is_some());
            let mine = p.take_seen(1, b).is_some();
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "round {round}: mine {mine}, theirs {theirs}");
        }
    }

    #[test]
    fn reuses_add_up_over_slots() {
        let p = ThreadSlots::new();
        p.count_reuse(0, 4096);
        p.count_reuse(0, 4096);
        p.count_reuse(SLOTS - 1, 1 << 20);
        assert_eq!(p.reuses_to_count(), (3, 8192 + (1 << 20)));
        assert_eq!(p.reuses_to_count(), (0, 0), "counted once");
        p.count_reuse(0, 4096);
        assert_eq!(p.reuses_to_count(), (1, 4096));
    }

    #[test]
    fn each_live_thread_has_a_slot_of_its_own_until_none_is_left() {
        use std::sync::{Arc, Barrier};
        let p = Arc::new(ThreadSlots::new());
        assert_eq!(p.slot_given(), None, "none before its first free");
        let first = p.own_slot().expect("a slot for the first thread");
        assert_eq!(p.slot_given(), Some(first));
        assert_eq!(p.own_slot(), Some(first), "kept");
        // SLOTS more threads, all alive until each has asked: SLOTS - 1 slots are left for them.
        let all_asked = Arc::new(Barrier::new(SLOTS + 1));
        let others: Vec<_> = (0..SLOTS).map(|_| {
            let (q, b) = (p.clone(), all_asked.clone());
            std::thread::spawn(move || {
                let mine = q.own_slot();
                let again = (q.own_slot(), q.slot_given());
                b.wait();
                (mine, again)
            })
        }).collect();
        all_asked.wait();
        let mut given: Vec<usize> = vec![first];
        for t in others {
            let (mine, again) = t.join().unwrap();
            assert_eq!(again, (mine, mine), "a thread keeps its slot");
            given.extend(mine);
        }
        assert_eq!(given.len(), SLOTS, "one thread left without");
        given.sort();
        given.dedup();
        assert_eq!(given, (0..SLOTS).collect::<Vec<_>>(), "each slot given once");
        let q = ThreadSlots::new();
        assert!(q.own_slot().is_some(), "another table gives its own");
    }

    /// A thread that starts with an ended thread's pointer (glibc reused its stack) takes over
    /// its slot; any other, once every slot is given, has none.
    #[test]
    fn a_thread_in_an_ended_ones_place_takes_over_its_slot() {
        let p = std::sync::Arc::new(ThreadSlots::new());
        let ask = |p: &std::sync::Arc<ThreadSlots>| {
            let q = p.clone();
            std::thread::spawn(move || (crate::sys::thread::pointer(), q.own_slot())).join().unwrap()
        };
        // Each thread ends before the next starts: most start where the one before ended.
        let mut ended: Vec<(usize, Option<usize>)> = vec![];
        for _ in 0..SLOTS + 4 {
            let (tp, slot) = ask(&p);
            let mut given: Vec<usize> = ended.iter().filter_map(|e| e.1).collect();
            given.sort();
            given.dedup();
            match ended.iter().find(|(t, _)| *t == tp) {
                Some((_, theirs)) => assert_eq!(slot, *theirs, "the ended thread's slot"),
                None => assert_eq!(slot.is_some_and(|i| !given.contains(&i)), given.len() < SLOTS, "a free slot while one is left"),
            }
            ended.push((tp, slot));
        }
    }
}
