//! Address ranges and fixed-capacity lists of them: what the host cache and the pinned cache hand
//! back for their callers to unmap or release outside their locks. A list never allocates; it
//! holds RangeList::CAPACITY ranges (the host cache hands out longer answers a list at a time).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub addr: usize,
    pub len: usize,
}

impl Range {
    /// Whether it shares a byte with [addr, end).
    pub fn overlaps(&self, addr: usize, end: usize) -> bool {
        self.addr < end && addr < self.addr + self.len
    }
}

/// A fixed-capacity list of ranges, so outcomes never allocate.
#[derive(Clone, Copy, Debug)]
pub struct RangeList {
    items: [Range; RangeList::CAPACITY],
    count: usize,
}

impl RangeList {
    /// Room for every block the pinned cache holds (64) and an answer's worth of the host cache's.
    pub const CAPACITY: usize = 129;

    pub const fn new() -> Self {
        RangeList { items: [Range { addr: 0, len: 0 }; Self::CAPACITY], count: 0 }
    }
    pub fn push(&mut self, r: Range) {
        if let Some(slot) = self.items.get_mut(self.count) {
            *slot = r;
            self.count += 1;
        }
    }
    /// Adds a range after every range in the list; when the list is full, the last range
    /// grows to cover it (and what lies between): a cover, never less.
    pub fn push_covering(&mut self, r: Range) {
        if self.count < self.items.len() {
            self.push(r);
        } else if let Some(last) = self.items.last_mut() {
            last.len = (r.addr + r.len).max(last.addr + last.len) - last.addr;
        }
    }
    pub fn iter(&self) -> impl Iterator<Item = &Range> {
        self.items.iter().take(self.count)
    }
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn total_bytes(&self) -> usize {
        self.iter().map(|r| r.len).sum()
    }
}

impl Default for RangeList {
    fn default() -> Self {
        Self::new()
    }
}
