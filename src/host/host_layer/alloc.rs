//! Serving a large request: a cached block taken and made fit for the program (readmitted,
//! locked, zeroed for calloc: Note [calloc costs what is touched]), else the pages of several
//! gathered (`gather`), else a fresh mapping, the cache emptied first when the system refuses one.
//
// Note [calloc costs what is touched]
// A calloc served from the cache must read zero. A block known zero (Note [Known zero]) goes
// out as it is. Another one of DISCARD_MIN bytes or more is zeroed either by dropping its pages
// (MADV_DONTNEED: costs about the resident pages; the program then faults in only what it
// touches) or by writing zeros (costs every byte, and faults in every page not resident).
// Dropping wins when the previous owner touched the block sparsely (64 MiB with two pages
// touched: microseconds against milliseconds), writing when it used all of it (dropping then
// rewriting 80 MB costs 16 ms against 1.2 ms). Which one it was is learnt from what we did, with
// no call that asks the kernel (mincore is refused by systemd's @system-service filter):
// a block is dropped first, and the drop's own duration says whether it was mostly resident
// (PageMemory::discard_weighed: a resident 4 KiB page costs 60-250 ns to drop, one never
// touched nothing). Two such findings in a row (a vote each, kept with the block in the
// registry while it is live and in the cache while it is cached; one finding could be a drop
// the scheduler interrupted) make calloc write zeros over the block from then on; a finding of
// "mostly not" starts over, and so does releasing the block (MADV_FREE'd pages may go at any
// time). A block the program fills after each calloc pays one dropped-and-refaulted round (a
// fresh mapping's cost, what glibc pays every time) before it is written over instead.
// Blocks change hands, though (a training loop frees its buffers in another order each step,
// and the next calloc gets one whose votes were never counted): the process keeps votes of its
// own beside each block's, counted from the drops the same way, and calloc writes zeros when
// either side has two. A write is weighed too (PageMemory::zero_weighed: pages not resident
// fault as they are written, 0.6-2 us each against 0.1-0.3; timed in pieces, the median piece
// deciding, since a stall of the machine's lands in a few): one that found the block mostly not
// resident takes a vote away from the block, and writes that found it resident give one vote of
// slack (MOST_VOTES), so one misjudged write on a loaded machine changes nothing. It takes none
// from the process: a write finds pages missing mostly where we dropped them ourselves, and in
// threads passing blocks around (some reading theirs only, the calloc-churn hunter) each drop
// made writes find more missing, the process's votes fell, blocks were dropped that the next
// owner filled, and the program faulted 1.7-3.5x as often as glibc.
// Our write, though, leaves the block resident whatever the program then touches, and a drop of
// pages the program only read (the kernel's zero page) costs enough to look resident: a block
// written dense once, then used sparsely, was written whole at every calloc, and one only read
// went back and forth between drops and writes (calloc(240 MB), read, free: 2-4 s for 20 where
// glibc takes 0.4 ms, with 242 MB resident against 1 MB; the numpy hunter). So before a write,
// WRITTEN_SAMPLES pages spread over the block are read (backing.rs `written_sample`): unless at
// least half hold a byte that is not zero, the program wrote little there since our zeroing,
// and the block is dropped instead, its votes left as they are (the drop's cost measures our own
// write). A dense program pays a few dozen reads of a page's first words before each write.
// The sample describes the block's last owner, though, not its next: where a quarter of the
// owners only read, dropping each block one of them left made the next owner, who filled it,
// fault it in whole. So the process keeps the share of sampled blocks their owners had written
// (`writers_after`, a quarter of the way toward each finding), and a block sampled as barely
// written is dropped only while that share is under a quarter (`drop_unwritten`: about where a
// write over every page costs what the faults of the owners who fill it would). A program
// that turns from filling its blocks to barely writing them has four more written before the
// share says so; one that only reads them, from the start, never has one written.

use super::{holder_tag, hugepages_code, mapping_span, HostLayer, PAGE};
use crate::backing::{PageMemory, BLOCK_ALIGN};
use crate::config::HugePages;
use crate::host::cache::{BlockCache, PageFacts, Taken};
use crate::host::registry::{Birth, Marks};
use crate::host::tally::{CallTimer, Tally};
use crate::record::{self, Block, Found};
use core::sync::atomic::Ordering::Relaxed;

/// From this many bytes a calloc hit may discard pages instead of writing zeros.
const DISCARD_MIN: usize = 1 << 20;

impl<M: PageMemory> HostLayer<M> {
    /// calloc on a reused range of `len` bytes that may hold data, of which the program asked
    /// for the first `asked`, with `votes` (Note [calloc costs what is touched]); returns its
    /// votes after. The rest reads zero too: malloc_usable_size promises it to the program, and
    /// glibc's calloc zeroes it. It is dropped rather than written: a program rarely touches it.
    pub(super) fn zero_reused(&self, addr: usize, asked: usize, len: usize, votes: u8) -> u8 {
        let head = asked.checked_add(PAGE - 1).map_or(len, |a| a & !(PAGE - 1)).min(len);
        self.timed(&self.stats.phases.alloc_zero, || {
            use crate::host::cache::{votes_after, zero_by_discard};
            let mut votes = votes;
            let process = self.calloc_votes.load(Relaxed);
            if head >= DISCARD_MIN {
                let dropped = if zero_by_discard(head, votes.max(process), DISCARD_MIN) { self.memory.discard_weighed(addr, head) } else { None };
                if let Some(found) = dropped {
                    self.stats.zeroed_by_discard.add(1);
                    votes = votes_after(votes, Some(found));
                    self.calloc_votes.store(votes_after(process, Some(found)), Relaxed);
                } else {
                    votes = self.write_or_drop_sampled(addr, head, votes);
                }
            } else if head > 0 {
                self.memory.zero(addr, head);
            }
            // A tail shorter than BLOCK_ALIGN (a mid-size request's rounding) is written: dropping
            // it costs a system call, and the next request that reaches its pages faults.
            let tail = len - head;
            if tail > 0 && (tail < BLOCK_ALIGN || !self.memory.discard(addr + head, tail)) {
                self.memory.zero(addr + head, tail);
            }
            votes
        })
    }

    /// Zeroes a block its votes say to write over; returns its votes after. Our last write made
    /// it resident, whatever the program touched since: pages sampled that mostly still read zero
    /// say its owner wrote little there (or only read, mapping the zero page, whose drop costs
    /// enough to look resident). Whether the next owner will is the process's habit: the block is
    /// dropped only while most owners of late wrote little.
    fn write_or_drop_sampled(&self, addr: usize, len: usize, votes: u8) -> u8 {
        use crate::host::cache::{drop_unwritten, votes_after_write, writers_after};
        let written = self.memory.sampled_written(addr, len);
        let writers = writers_after(self.calloc_writers.load(Relaxed), written);
        self.calloc_writers.store(writers, Relaxed);
        if !written && drop_unwritten(writers) && self.memory.discard(addr, len) {
            self.stats.zeroed_by_discard.add(1);
            return votes;
        }
        votes_after_write(votes, self.memory.zero_weighed(addr, len))
    }

    /// Makes a block taken from the cache ready for the program (its record says live, or
    /// will once it is readmitted): inherited by forked children again if a fork kept it from
    /// them (Note [Fork at the fork]), locked under mlockall(MCL_FUTURE) (Note [Locked
    /// memory]). Returns what is then known of its pages; `None` when the kernel refused: the
    /// block is unmapped (its record goes) and the request is served otherwise. Note [Plain
    /// memory].
    pub(super) fn make_fit(&self, addr: usize, len: usize, facts: PageFacts) -> Option<PageFacts> {
        if facts.kept_any && !self.memory.readmit(addr, len) {
            return self.drop_taken(addr, len);
        }
        if let Some(on_fault) = self.memory.future_locking() {
            // A refusal (RLIMIT_MEMLOCK) leaves the block as glibc's mmap would have failed to
            // make it: the request is served otherwise, or fails as it would have.
            if !self.memory.lock(addr, len, on_fault) {
                return self.drop_taken(addr, len);
            }
        }
        Some(PageFacts { kept_all: false, kept_any: false, ..facts })
    }

    /// A block taken from the cache that cannot be handed out: unmapped, its record gone.
    fn drop_taken(&self, addr: usize, len: usize) -> Option<PageFacts> {
        self.registry.clear(addr);
        self.memory.unmap(addr, len);
        self.stats.unmapped_blocks.add(1);
        self.stats.unmapped_bytes.add(len as u64);
        None
    }

    /// A large block of at least `size` bytes starting at a multiple of `align` (a power of
    /// two); zero-filled when `zeroed`; `holder` is its holder word (Note [Holders]). `None`
    /// means out of memory.
    pub fn alloc(&self, size: usize, align: usize, zeroed: bool, holder: u64) -> Option<usize> {
        if let Some(addr) = self.alloc_from_slot(size, align, zeroed, holder) {
            return Some(addr);
        }
        let mut timer = CallTimer::begin(self.stats.requests.get(), self.precise);
        let birth = Birth { ns: (self.clock)(), holder };
        let out = self.alloc_untimed(size, align, zeroed, birth, &mut timer);
        let (addr, len, found) = match out {
            Some(o) => o,
            None => {
                timer.exact(self.precise);
                timer.finish(self.precise, &[&self.stats.phases.alloc]);
                return None;
            }
        };
        record::alloc(Block::host(addr as u64, len as u64, size as u64, holder), found);
        let phases = &self.stats.phases;
        if found == Found::Hit {
            timer.finish(self.precise, &[&phases.alloc, &phases.alloc_hit]);
        } else {
            timer.finish(self.precise, &[&phases.alloc]);
        }
        Some(addr)
    }

    // Note [One recording point] (record/mod.rs): a block's event is recorded in alloc,
    // record_free and record_resize, with its mapped length; beside it, the live figures the
    // cache's bounds follow, in the tally (Note [Figures under the lock] in host/tally.rs).

    /// A block mapped or gathered outside the lock became live: asked for `size` bytes by
    /// `birth`.
    fn went_live(&self, addr: usize, len: usize, size: usize, birth: Birth) {
        self.registry.set_asked(addr, size as u64);
        let mut cache = self.cache();
        cache.tally.went_live(len);
        cache.book.alloc(Block::host(addr as u64, len as u64, size as u64, birth.holder), birth.ns);
        cache.tally.publish(&self.stats);
    }

    /// A taken block, counted as a hit, is live under the lock.
    fn hit_went_live(&self, cache: &mut BlockCache, t: &Taken, size: usize, birth: Birth) {
        Self::count_hit(&mut cache.tally, t);
        self.registry.set_asked(t.addr, size as u64);
        cache.book.alloc(Block::host(t.addr as u64, t.len as u64, size as u64, birth.holder), birth.ns);
    }

    /// The block, its mapped length and how it was found.
    fn alloc_untimed(&self, size: usize, align: usize, zeroed: bool, birth: Birth, timer: &mut CallTimer) -> Option<(usize, usize, Found)> {
        let Some((need, granule)) = self.block_shape(size) else {
            let mut cache = self.cache();
            cache.tally.requests += 1;
            cache.tally.publish(&self.stats);
            return None;
        };
        let align = align.max(BLOCK_ALIGN);
        let tag = holder_tag(birth.holder);
        let mut slots_emptied = false;
        let taken = loop {
            let mut cache = self.cache();
            if !slots_emptied {
                cache.tally.requests += 1;
            }
            let taken = if zeroed { cache.take_zeroed(need, align, tag) } else { cache.take(need, align, tag) };
            // Before a miss, the blocks other threads freed into their slots (Note [A thread's
            // own slot]) are the cache's too: one may serve.
            if taken.is_none() && !slots_emptied && self.slots.any() {
                drop(cache);
                self.empty_slots();
                slots_emptied = true;
                continue;
            }
            let mut counted = false;
            if let Some(t) = &taken {
                // The leaf exists: the block was recorded as cached. One still kept from
                // children is recorded only once readmitted (Note [Fork at the fork]).
                if t.facts.kept_any {
                    self.registry.clear(t.addr);
                } else {
                    let _ = self.registry.set_live(t.addr, t.len, birth);
                }
                if let Some(tail) = t.tail_kept {
                    let _ = self.registry.set_cached(tail.addr, tail.len);
                }
                self.stats.cached.set(cache.cached_bytes() as u64);
                // A block that make_fit may still drop is counted once it is fit.
                counted = !t.facts.kept_any && self.memory.future_locking().is_none();
                if counted {
                    self.hit_went_live(&mut cache, t, size, birth);
                }
            }
            cache.tally.publish(&self.stats);
            break taken.map(|t| (t, counted));
        };
        let taken = taken.and_then(|(t, counted)| {
            if !counted {
                timer.exact(self.precise);
            }
            let Some(facts) = self.make_fit(t.addr, t.len, t.facts) else {
                if counted {
                    // mlockall came meanwhile, and the lock was refused: the block left.
                    let mut cache = self.cache();
                    cache.tally.left(t.len);
                    cache.book.free(Block::host(t.addr as u64, t.len as u64, size as u64, birth.holder), birth.ns);
                    cache.tally.publish(&self.stats);
                }
                return None;
            };
            // Cannot fail: its leaf exists.
            if t.facts.kept_any && !self.registry.set_live(t.addr, t.len, birth) {
                self.memory.unmap(t.addr, t.len);
                return None;
            }
            if !counted {
                let mut cache = self.cache();
                self.hit_went_live(&mut cache, &t, size, birth);
                cache.tally.publish(&self.stats);
            }
            Some(Taken { facts, ..t })
        });
        if let Some(t) = taken {
            let mut votes = t.facts.votes;
            if zeroed && !t.facts.zero {
                timer.exact(self.precise);
                votes = self.zero_reused(t.addr, size, t.len, votes);
            }
            // What the block carries on (a fresh record has neither): its votes, its advice.
            if votes != 0 || t.facts.advised_by != 0 {
                let marks = Marks::default().with_votes(votes);
                self.registry.keep_marks(t.addr, if t.facts.advised_by == 0 { marks } else { marks.with_huge() });
            }
            return Some((t.addr, t.len, Found::Hit));
        }

        timer.exact(self.precise);
        if let Some(addr) = self.gather_cached(need, align.max(granule), birth, zeroed.then_some(size)) {
            self.went_live(addr, need, size, birth);
            return Some((addr, need, Found::Grown));
        }
        self.stats.misses.add(1);
        let addr = self.timed(&self.stats.phases.alloc_map, || self.map_fresh(need, align.max(granule)))?;
        if !self.registry.set_live(addr, need, birth) {
            self.memory.unmap(addr, need);
            self.stats.map_failures.add(1);
            return None;
        }
        self.went_live(addr, need, size, birth);
        Some((addr, need, Found::Miss))
    }

    /// Under the cache lock: a block taken from the cache is live.
    fn count_hit(tally: &mut Tally, t: &Taken) {
        tally.hits += 1;
        tally.hit_bytes += t.len as u64;
        tally.hits_after_release += u64::from(t.was_released);
        tally.splits += u64::from(t.tail_kept.is_some());
        tally.went_live(t.len);
    }

    /// A fresh mapping whose record cannot fail (the registry's spare leaf is reserved first),
    /// advised for huge pages under `HugePages::Always`.
    pub(super) fn map_recordable(&self, len: usize, align: usize) -> Option<usize> {
        let addr = self.registry.reserve_spare().then(|| self.memory.map(len, align)).flatten()?;
        if self.hugepages.load(Relaxed) == hugepages_code(HugePages::Always) {
            self.memory.advise_huge(addr, len);
        }
        Some(addr)
    }

    /// A fresh mapping; when the system refuses it, the cache is emptied (if that can help) and
    /// the mapping retried.
    fn map_fresh(&self, len: usize, align: usize) -> Option<usize> {
        let unmapped = self.unmapped_bytes();
        let addr = self.map_recordable(len, align).or_else(|| self.make_room(mapping_span(len, align), unmapped).then(|| self.map_recordable(len, align)).flatten());
        if addr.is_none() {
            self.stats.map_failures.add(1);
        }
        addr
    }
}
