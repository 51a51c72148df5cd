//! The parts of a miss (Note [Gathering pages]): cached blocks whose pages together make up a
//! request, largest first, handed out for the host layer to move into one fresh mapping.
//
// Note [Gathering pages]
// A request no cached block can serve may still be served by the pages of several: a fresh
// mapping of the needed size is made (nothing in it is touched, so it costs no fault), and the
// pages of cached blocks are moved into it back to back with mremap (page tables move, the
// pages stay: no fault, no zeroing), largest first so huge pages land on huge-page offsets.
// Only what the cached bytes cannot cover faults in. Kernels before 6.17 will not move a range
// spanning two mappings (merged neighbours, a block the program madvised in part): such a part
// is halved until the halves move, and what will not move goes back to the cache, its share of
// the new mapping faulting in as a fresh one would. Such a refusal may unmap the destination
// first; it is mapped back with MAP_FIXED_NOREPLACE, and if that fails (another thread may have
// mapped into the hole) the range is never touched again (at worst, untouched address space
// left mapped) and the request is served by a fresh mapping. Without this, 16
// threads replacing 1-64 MB blocks faulted in more than tcmalloc, whose page heap reuses any
// free span: a request bigger than each cached block missed although the cache held enough.
// A gathering costs four system calls or more (74 us on average in the runtimes hunter's loop)
// and saves a fault only for each page moved that the program then touches: below 1 MiB
// (GATHER_MIN in host/host_layer/gather.rs) it saves at most about what it costs, and a ring of
// 200-400 KB blocks whose sizes drift (a JVM's direct buffers) gathered on a third of its
// requests, each leaving a new piece that kept the pattern going: 40 times glibc's time with a
// byte of each block touched, 2.2 times with every byte. So a smaller request is a fresh mapping.

use super::{BlockCache, BlockState, PageFacts};
use crate::ranges::Range;

/// The most cached blocks one miss gathers (Note [Gathering pages]).
pub const MAX_PARTS: usize = 8;

/// A cached block, or the head of one, handed out by `take_parts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub addr: usize,
    pub len: usize,
    pub facts: PageFacts,
}

/// What `take_parts` hands out, largest part first.
#[derive(Clone, Copy, Debug)]
pub struct Parts {
    items: [Part; MAX_PARTS],
    count: usize,
    total: usize,
    /// The rest of the last block, cut off and kept cached: the caller records it.
    pub rest_kept: Option<Range>,
}

impl Parts {
    const fn new() -> Self {
        Parts { items: [Part { addr: 0, len: 0, facts: PageFacts::DIRTY }; MAX_PARTS], count: 0, total: 0, rest_kept: None }
    }
    pub fn iter(&self) -> impl Iterator<Item = &Part> {
        self.items.iter().take(self.count)
    }
    fn push(&mut self, part: Part) {
        if let Some(item) = self.items.get_mut(self.count) {
            *item = part;
            self.count += 1;
            self.total += part.len;
        }
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The bytes of every part together.
    pub fn total_bytes(&self) -> usize {
        self.total
    }
}

impl BlockCache {
    /// On a miss: blocks whose pages together make up `need` bytes, largest first, at most
    /// MAX_PARTS of them, each fitting `asker` (Note [Gathering pages]). The last one may be
    /// cut: its rest stays cached. Empty when nothing is cached.
    pub fn take_parts(&mut self, need: usize, asker: u32) -> Parts {
        self.unpark();
        let mut parts = Parts::new();
        while parts.count < MAX_PARTS && parts.total < need {
            let Some(id) = self.store.iter().filter(|(_, b)| b.state != BlockState::Releasing && b.facts.fits(asker)).max_by_key(|(_, b)| b.len).map(|(id, _)| id) else {
                break;
            };
            let block = *self.store.get(id);
            let want = need - parts.total;
            if block.len > want {
                let rest = Range { addr: block.addr + want, len: block.len - want };
                self.store.cut_front(id, rest.addr, rest.len);
                self.cached_bytes -= want;
                parts.rest_kept = Some(rest);
            } else {
                self.store.remove(id);
                self.cached_bytes -= block.len;
            }
            parts.push(Part { addr: block.addr, len: block.len.min(want), facts: block.facts });
        }
        parts
    }
}
