//! What is known of a cached block's pages beside where they are (`PageFacts`): whether they
//! read zero (Note [Known zero]), calloc's zeroing votes and how they move (Note [calloc costs
//! what is touched] in host/host_layer/alloc.rs), huge-page advice, being kept from forked
//! children.
//
// Note [Known zero]
// A cached block is known to be zero when every page of it reads zero without a write from us:
// a block released with MADV_DONTNEED (kernels without MADV_FREE, or a seccomp filter refusing
// it), or a tail cut from such a block. calloc hands such blocks out as they are. A block freed
// by the program is never known zero, nor is one released with MADV_FREE (its pages keep their
// contents until the kernel takes them).

/// Zeroings in a row that found a block mostly resident before calloc writes zeros over it
/// rather than dropping its pages (Note [calloc costs what is touched] in host/host_layer/alloc.rs).
pub const DENSE_VOTES: u8 = 2;

/// Whether calloc should zero `len` reused bytes by discarding their pages rather than writing
/// zeros, given the block's votes. Discarding costs about the resident pages and makes each
/// page the program then touches fault; writing costs every byte and faults in every page not
/// resident. So: discard a big block unless it was found mostly resident twice in a row.
pub fn zero_by_discard(len: usize, votes: u8, discard_min: usize) -> bool {
    len >= discard_min && votes < DENSE_VOTES
}

/// The most votes a block (or the process) carries: one past DENSE_VOTES, reached by writes that
/// found it resident, so that going back from writing to dropping takes two findings of "mostly
/// not resident" in a row (the registry keeps two bits).
pub const MOST_VOTES: u8 = DENSE_VOTES + 1;
const _: () = assert!(MOST_VOTES <= 3, "the registry keeps two bits of votes");

/// Votes after zeros were written over a block (`resident`: the write found it mostly so):
/// one more, or one fewer. A write slowed by other work on the machine can look like one that
/// faulted: with one vote of slack, one such finding changes nothing (on a loaded machine a
/// single one sent calloc back to dropping a block the program fills every time, which then
/// faulted in whole).
pub fn votes_after_write(votes: u8, resident: bool) -> u8 {
    if resident {
        (votes + 1).min(MOST_VOTES)
    } else {
        votes.saturating_sub(1)
    }
}

/// A block's votes after a zeroing: one more when a discard found it mostly resident, none when
/// it found it mostly not (`None`: it was written, which says nothing; or nothing was done).
pub fn votes_after(votes: u8, mostly_resident: Option<bool>) -> u8 {
    match mostly_resident {
        Some(true) => (votes + 1).min(DENSE_VOTES),
        Some(false) => 0,
        None => votes,
    }
}

/// How often, of late, the blocks calloc sampled before writing zeros over them had been
/// written by their previous owner: a share in WRITERS_ONE parts, moved a quarter of the way
/// toward each finding (`writers_after`). Note [calloc costs what is touched].
pub const WRITERS_ONE: u16 = 1024;

/// The writers' share after one more sampled block, `written` or not.
pub fn writers_after(share: u16, written: bool) -> u16 {
    let share = i32::from(share.min(WRITERS_ONE));
    let toward = if written { i32::from(WRITERS_ONE) } else { 0 };
    (share + (toward - share) / 4) as u16
}

/// Whether a block sampled as barely written is dropped rather than written over, given the
/// writers' share: only while most owners write little. Where most write (a quarter or more
/// of them, the share at which a write's cost over every page matches the faults a drop would
/// cost the next owner that fills it), the next owner probably writes too.
pub fn drop_unwritten(share: u16) -> bool {
    share < WRITERS_ONE / 4
}

/// The advice tag of a block whose huge-page advice came from more than one holder: it fits no
/// request (Note [Huge-page advice] in host/host_layer/mod.rs).
pub const MIXED_ADVICE: u32 = u32::MAX;

/// What is known of a cached block's pages, beside where they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageFacts {
    /// Every page reads zero (Note [Known zero]).
    pub zero: bool,
    /// Zeroings in a row that found it mostly resident (Note [calloc costs what is touched]).
    pub votes: u8,
    /// MADV_HUGEPAGE advice the previous owner left on it: its holder's tag (0: none;
    /// MIXED_ADVICE: several). Note [Huge-page advice] in host/host_layer/mod.rs.
    pub advised_by: u32,
    /// Kept from forked children (MADV_DONTFORK) since a fork, wholly and in part (Note [Fork
    /// at the fork] in host/host_layer/fork.rs).
    pub kept_all: bool,
    pub kept_any: bool,
}

impl PageFacts {
    /// A block the program freed: it may hold data.
    pub const DIRTY: PageFacts = PageFacts { zero: false, votes: 0, advised_by: 0, kept_all: false, kept_any: false };
    /// Fresh pages: zero, untouched, as the kernel maps them.
    pub const FRESH: PageFacts = PageFacts { zero: true, ..PageFacts::DIRTY };

    /// Zero as `zero` says, nothing else known.
    pub const fn zeroed(zero: bool) -> PageFacts {
        PageFacts { zero, ..PageFacts::DIRTY }
    }

    /// The facts of two neighbours merged into one block (Note [Neighbours merge]).
    pub fn merge(self, other: PageFacts) -> PageFacts {
        let advised_by = match (self.advised_by, other.advised_by) {
            (0, b) => b,
            (a, 0) => a,
            (a, b) if a == b => a,
            _ => MIXED_ADVICE,
        };
        PageFacts {
            zero: self.zero && other.zero,
            votes: self.votes.min(other.votes),
            advised_by,
            kept_all: self.kept_all && other.kept_all,
            kept_any: self.kept_any || other.kept_any,
        }
    }

    /// Whether it may go, pages and all, to code whose holder tag is `asker` (Note [Huge-page
    /// advice]): it carries no advice, or that code's own.
    pub const fn fits(self, asker: u32) -> bool {
        self.advised_by == 0 || self.advised_by == asker
    }

    /// How well it suits `asker` (which it fits), best first: its own advice (so blocks without
    /// any stay for other code), then none.
    pub(super) const fn rank(self, asker: u32) -> u8 {
        if self.advised_by == asker {
            0
        } else {
            1
        }
    }
}
