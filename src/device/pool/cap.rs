//! The cap on what a pool reserves (TENSORMALLOC_CUDA_LIMIT): the segment a request takes when
//! the cap refuses its usual one, and the largest request the room under the cap can serve,
//! which cudaMemGetInfo reports (Note [What the cap leaves]).

use super::{class_of, DevicePool, Strategy, LARGE_ROUND, MAX_POOLED_BYTES, NONE, ROUND, SMALL_LIMIT};

// Note [What the cap leaves]
// cudaMemGetInfo promises that an allocation of all it reports succeeds. Under the cap a request
// succeeds when a segment for it fits in the room the cap leaves: the cap less what the pool
// reserves, plus what giving the cache back would free (not the free tail of a segment a live
// block holds, which no large request can use). A request of 1 to 2 MiB is carved from a
// 20 MiB segment, more than a small cap may leave: refused there, it takes a segment of its own
// size, as a large request does. The figure reported is the largest request whose segment fits
// in that room: whole 2 MiB (or chunks) for split pools, a size class for binned ones. Before
// the pool's first segment the cap applies all the same (RMM and "take 90% of what is free"
// size themselves from the first answer). In expandable segments a request may start inside a
// chunk when a free block before it is kept apart by its stream tag or a pending synchronization,
// and then need one chunk more than its size: while such blocks exist the figure leaves one out.

impl DevicePool {
    /// The segment a request of `size` takes when the cap refuses its usual one: one of its own
    /// size, rounded as large requests are. None for small requests (they share 2 MiB segments)
    /// and for binned and expandable pools (theirs is already of its own size).
    pub fn capped_segment_for(&self, size: u64) -> Option<u64> {
        let need = self.rounded(size)?;
        (self.strategy == Strategy::Split && !self.expandable() && need >= SMALL_LIMIT).then(|| need.div_ceil(LARGE_ROUND) * LARGE_ROUND)
    }

    /// The room the cap leaves for new segments once `releasable` bytes of the cache are given
    /// back; None: no cap.
    pub fn room_under_cap(&self, releasable: u64) -> Option<u64> {
        (self.limit_bytes != u64::MAX).then(|| self.limit_bytes.saturating_sub(self.stats.reserved_bytes).saturating_add(releasable))
    }

    /// The largest request the pool serves under the cap, given `room` under it (Note [What
    /// the cap leaves]): from a free block as it is, or from a new segment that fits.
    pub fn largest_request_within(&self, room: u64) -> u64 {
        let step = if self.expandable() { self.chunk_bytes } else { LARGE_ROUND };
        largest_request_within(self.strategy, step, room).max(self.largest_free_request())
    }

    /// The largest request a free block serves with no new memory, by the pool's own rules
    /// (`usable`: a segment's base goes out with room before a tail block, a binned block to its
    /// class only; small requests search small segments only, and larger ones the others).
    /// None counted in expandable pools, whose free blocks may need chunks mapped.
    fn largest_free_request(&self) -> u64 {
        let mut best = 0;
        if self.expandable() {
            return best;
        }
        self.segments.for_each(|_, first| {
            let mut i = first;
            while i != NONE {
                let b = self.blocks.get(i);
                if !b.allocated && !b.dead {
                    let fits = [b.size, b.size.saturating_sub(ROUND)].into_iter().find(|&need| {
                        let served_here = if b.small { need < SMALL_LIMIT } else { need >= SMALL_LIMIT || self.strategy == Strategy::Binned };
                        served_here && self.usable(b, need, b.tag)
                    });
                    best = best.max(fits.unwrap_or(0));
                }
                i = b.seg_next;
            }
        });
        best
    }
}

/// `largest_request_within` for a pool not set up yet (its segments grow in 2 MiB).
pub fn largest_request_of_a_new_pool(strategy: Strategy, room: u64) -> u64 {
    largest_request_within(strategy, LARGE_ROUND, room)
}

/// The largest request a `strategy` pool whose segments grow in `step` bytes serves from a
/// segment of at most `room` bytes.
fn largest_request_within(strategy: Strategy, step: u64, room: u64) -> u64 {
    let room = room.min(MAX_POOLED_BYTES);
    match strategy {
        Strategy::Split => room / step.max(1) * step.max(1),
        Strategy::Binned => {
            // class_of is monotonic and never below its size: the largest size whose class fits.
            let (mut fits, mut over) = (0u64, room.saturating_add(1));
            while over - fits > 1 {
                let mid = fits + (over - fits) / 2;
                if class_of(mid) <= room {
                    fits = mid;
                } else {
                    over = mid;
                }
            }
            fits
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn the_largest_request_within_a_room_takes_a_segment_that_fits() {
        assert_eq!(largest_request_within(Strategy::Split, LARGE_ROUND, 30 * MB + 5), 30 * MB);
        assert_eq!(largest_request_within(Strategy::Split, LARGE_ROUND, MB), 0, "a small request needs 2 MiB");
        for room in [0, 1, 511, 512, 3 * MB + 7, 30 * MB, 535_822_324, 1 << 40] {
            let x = largest_request_within(Strategy::Binned, LARGE_ROUND, room);
            assert!(x == 0 || class_of(x) <= room, "{room}");
            assert!(class_of(x + 1) > room, "{room}: {x} is the largest");
        }
    }
}
