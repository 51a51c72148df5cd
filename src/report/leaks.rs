//! The leak report (TENSORMALLOC_LEAKS=1): large host blocks and device blocks still live at
//! exit, grouped by size, biggest total first, with counts, bytes in bytes and human units, and
//! the age of the oldest block in each group. Fixed-size tables: no allocation at exit.

use crate::report::units::{pad, Bytes, Count, Nanos};
use core::fmt::{self, Write};

const GROUPS: usize = 32;

#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Group {
    pub size: u64,
    pub count: u64,
    pub oldest_born_ns: u64,
}

/// Live blocks grouped by exact size; sizes past the first GROUPS go to `other`.
#[derive(Default)]
pub struct LeakGroups {
    groups: [Group; GROUPS],
    used: usize,
    pub other_count: u64,
    pub other_bytes: u64,
    pub total_count: u64,
    pub total_bytes: u64,
}

impl LeakGroups {
    pub fn add(&mut self, size: u64, born_ns: u64) {
        self.total_count += 1;
        self.total_bytes += size;
        if let Some(g) = self.groups.iter_mut().take(self.used).find(|g| g.size == size) {
            g.count += 1;
            g.oldest_born_ns = g.oldest_born_ns.min(born_ns);
            return;
        }
        match self.groups.get_mut(self.used) {
            Some(g) => {
                *g = Group { size, count: 1, oldest_born_ns: born_ns };
                self.used += 1;
            }
            None => {
                self.other_count += 1;
                self.other_bytes += size;
            }
        }
    }

    /// Groups, biggest total first.
    pub fn sorted(&self) -> [Group; GROUPS] {
        let mut out = self.groups;
        if let Some(used) = out.get_mut(..self.used) {
            used.sort_unstable_by(|a, b| (b.size * b.count).cmp(&(a.size * a.count)).then(b.size.cmp(&a.size)));
        }
        out
    }

    pub fn write<W: Write>(&self, w: &mut W, what: &str, now_ns: u64) -> fmt::Result {
        if self.total_count == 0 {
            return writeln!(w, "tensormalloc: leaks at exit: {what}: none");
        }
        writeln!(
            w,
            "tensormalloc: leaks at exit: {what}: {} still live, {} bytes ({})",
            Count(self.total_count, "block"),
            self.total_bytes,
            Bytes(self.total_bytes)
        )?;
        writeln!(w, "  {:>8} {:>16} {:>12} {:>16} {:>12}  oldest age", "count", "bytes each", "each", "bytes in all", "in all")?;
        for g in self.sorted().iter().take(self.used) {
            let all = g.size * g.count;
            writeln!(
                w,
                "  {:>8} {:>16} {:>12} {:>16} {:>12}  {}",
                g.count,
                g.size,
                pad(Bytes(g.size)),
                all,
                pad(Bytes(all)),
                Nanos(now_ns.saturating_sub(g.oldest_born_ns))
            )?;
        }
        if self.other_count > 0 {
            let noun = if self.other_count == 1 { "block" } else { "blocks" };
            writeln!(w, "  {:>8} {noun} of other sizes, {} bytes ({})", self.other_count, self.other_bytes, Bytes(self.other_bytes))?;
        }
        Ok(())
    }
}

/// Writes the host and device leak reports to stderr.
pub fn report_at_exit() {
    let now = crate::sys::clock::now_ns();
    let mut host = LeakGroups::default();
    crate::state::HOST.for_each_live(|_, len, birth| host.add(len as u64, birth.ns));
    let mut w = crate::sys::stderr::StackWriter::<8192>::new();
    let _ = host.write(&mut w, "host (large blocks)", now);
    crate::state::DEVICE.for_each_pool(|device, pool| {
        let mut dev = LeakGroups::default();
        pool.for_each_live(|_, size, birth| dev.add(size, birth.ns));
        let mut name = crate::sys::stderr::StackWriter::<32>::new();
        let _ = write!(name, "cuda device {device}");
        let _ = dev.write(&mut w, core::str::from_utf8(name.as_bytes()).unwrap_or("cuda"), now);
    });
    w.flush_to(2);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_biggest_total_first_with_a_total() {
        let mut g = LeakGroups::default();
        g.add(80 << 20, 100);
        g.add(8 << 20, 50);
        g.add(80 << 20, 10);
        g.add(200 << 20, 70);
        let sorted = g.sorted();
        assert_eq!(sorted[0], Group { size: 200 << 20, count: 1, oldest_born_ns: 70 });
        assert_eq!(sorted[1], Group { size: 80 << 20, count: 2, oldest_born_ns: 10 });
        let mut w = crate::sys::stderr::StackWriter::<4096>::new();
        g.write(&mut w, "host", 1_000_000_010).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.contains("4 blocks still live, 385875968 bytes (368.0 MiB)"), "{text}");
        assert!(text.contains("80.0 MiB") && text.contains("1.00s"), "{text}");
    }

    #[test]
    fn overflowing_sizes_are_summed() {
        let mut g = LeakGroups::default();
        for i in 0..40u64 {
            g.add((i + 1) << 20, 0);
        }
        assert_eq!(g.other_count, 8);
        assert_eq!(g.total_count, 40);
    }
}
