//! The leak report (TENSORMALLOC_LEAKS=1): large host blocks and device blocks still live at
//! exit, grouped by who asked for them (the holder word: its holder, and the call site, whose
//! function is named where the object exports one; Note [Holders]) and size, biggest total first,
//! with counts, bytes in bytes and human units, and the age of the oldest block in each group.
//! Fixed-size tables: no allocation at exit.

use crate::record::holders;
use crate::report::units::{pad, Bytes, Count, Nanos};
use core::fmt::{self, Write};

const GROUPS: usize = 32;

#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Group {
    /// The blocks' holder word (record/holders.rs): who asked, from where.
    pub holder: u64,
    pub size: u64,
    pub count: u64,
    pub oldest_born_ns: u64,
}

/// Live blocks grouped by holder word and exact size; groups past the first GROUPS go to `other`.
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
    pub fn add(&mut self, size: u64, birth: holders::Birth) {
        let born_ns = birth.ns;
        self.total_count += 1;
        self.total_bytes += size;
        if let Some(g) = self.groups.iter_mut().take(self.used).find(|g| g.size == size && g.holder == birth.holder) {
            g.count += 1;
            g.oldest_born_ns = g.oldest_born_ns.min(born_ns);
            return;
        }
        match self.groups.get_mut(self.used) {
            Some(g) => {
                *g = Group { holder: birth.holder, size, count: 1, oldest_born_ns: born_ns };
                self.used += 1;
            }
            None => {
                self.other_count += 1;
                self.other_bytes += size;
            }
        }
    }

    /// Folds together the groups of one size whose holder words `same` says read the same (one
    /// holder, one function: call sites differ within a function), so that each line a report
    /// prints is one holder's blocks of one size.
    pub fn fold(&mut self, same: impl Fn(u64, u64) -> bool) {
        let mut kept = 0;
        for i in 0..self.used {
            let Some(g) = self.groups.get(i).copied() else { break };
            let into = self.groups.iter().take(kept).position(|k| k.size == g.size && same(k.holder, g.holder));
            match into.and_then(|k| self.groups.get_mut(k)) {
                Some(k) => {
                    k.count += g.count;
                    k.oldest_born_ns = k.oldest_born_ns.min(g.oldest_born_ns);
                }
                None => {
                    if let Some(slot) = self.groups.get_mut(kept) {
                        *slot = g;
                    }
                    kept += 1;
                }
            }
        }
        self.used = kept;
    }

    /// Groups, biggest total first.
    pub fn sorted(&self) -> [Group; GROUPS] {
        let mut out = self.groups;
        if let Some(used) = out.get_mut(..self.used) {
            used.sort_unstable_by(|a, b| (b.size * b.count).cmp(&(a.size * a.count)).then(b.size.cmp(&a.size)));
        }
        out
    }

    /// Writes the groups; `name` writes a group's holder (its holder and function, in words).
    pub fn write<W: Write>(&self, w: &mut W, what: &str, now_ns: u64, name: impl Fn(&mut W, u64) -> fmt::Result) -> fmt::Result {
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
        writeln!(w, "  {:>8} {:>16} {:>12} {:>16} {:>12} {:>10}  holder (function)", "count", "bytes each", "each", "bytes in all", "in all", "oldest age")?;
        for g in self.sorted().iter().take(self.used) {
            let all = g.size * g.count;
            write!(
                w,
                "  {:>8} {:>16} {:>12} {:>16} {:>12} {:>10}  ",
                g.count,
                g.size,
                pad(Bytes(g.size)),
                all,
                pad(Bytes(all)),
                pad(Nanos(now_ns.saturating_sub(g.oldest_born_ns)))
            )?;
            name(w, g.holder)?;
            w.write_str("\n")?;
        }
        if self.other_count > 0 {
            let noun = if self.other_count == 1 { "block" } else { "blocks" };
            writeln!(w, "  {:>8} {noun} of other sizes, {} bytes ({})", self.other_count, self.other_bytes, Bytes(self.other_bytes))?;
        }
        Ok(())
    }
}

/// Bytes of a name, as text: what is not printable ASCII shows as `?`.
fn write_name<W: Write>(w: &mut W, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|&b| w.write_char(if b.is_ascii_graphic() || b == b' ' { b as char } else { '?' }))
}

/// A holder word in words: the holder (the object that asked, or a hook's library; an unloaded
/// one by its saved name), then the calling function where the loader knows its name.
fn write_holder<W: Write>(w: &mut W, word: u64) -> fmt::Result {
    holders::holder_name(holders::id_of(word), |name| write_name(w, name))?;
    crate::sys::caller::names(holders::caller_of(word), |found| match found {
        Some((_, symbol)) if !symbol.is_empty() => {
            w.write_str(" (")?;
            write_name(w, symbol)?;
            w.write_str(")")
        }
        _ => Ok(()),
    })
}

/// Whether two holder words print alike: one holder, and one function (or none known for both).
fn same_words(a: u64, b: u64) -> bool {
    use crate::sys::caller::names;
    a == b
        || holders::id_of(a) == holders::id_of(b)
            && names(holders::caller_of(a), |x| names(holders::caller_of(b), |y| x.map(|x| x.1) == y.map(|y| y.1)))
}

/// Writes the host and device leak reports to stderr.
pub fn report_at_exit() {
    let now = crate::sys::clock::now_ns();
    let mut host = LeakGroups::default();
    crate::state::HOST.for_each_live(|_, len, birth| host.add(len as u64, birth));
    host.fold(same_words); // outside the walk's locks: the loader's names are looked up
    let mut w = crate::sys::stderr::StackWriter::<8192>::new();
    let _ = host.write(&mut w, "host (large blocks)", now, write_holder);
    crate::state::DEVICE.for_each_pool(|device, pool| {
        let mut dev = LeakGroups::default();
        pool.for_each_live(|_, size, birth| dev.add(size, birth));
        dev.fold(same_words);
        let mut name = crate::sys::stderr::StackWriter::<32>::new();
        let _ = write!(name, "cuda device {device}");
        let _ = dev.write(&mut w, core::str::from_utf8(name.as_bytes()).unwrap_or("cuda"), now, write_holder);
    });
    w.flush_to(2);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64, holder: u64) -> holders::Birth {
        holders::Birth { ns, holder }
    }

    #[test]
    fn groups_biggest_total_first_with_a_total_and_each_holder() {
        let mut g = LeakGroups::default();
        g.add(80 << 20, at(100, 7));
        g.add(8 << 20, at(50, 7));
        g.add(80 << 20, at(10, 7));
        g.add(200 << 20, at(70, 9));
        g.add(80 << 20, at(60, 9)); // the same size from another holder: a group of its own
        let sorted = g.sorted();
        assert_eq!(sorted[0], Group { holder: 9, size: 200 << 20, count: 1, oldest_born_ns: 70 });
        assert_eq!(sorted[1], Group { holder: 7, size: 80 << 20, count: 2, oldest_born_ns: 10 });
        assert_eq!(sorted[2], Group { holder: 9, size: 80 << 20, count: 1, oldest_born_ns: 60 });
        let mut w = crate::sys::stderr::StackWriter::<4096>::new();
        g.write(&mut w, "host", 1_000_000_010, |w, word| write!(w, "holder{word}")).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.contains("5 blocks still live, 469762048 bytes (448.0 MiB)"), "{text}");
        assert!(text.contains("80.0 MiB") && text.contains("1.00s"), "{text}");
        let rows: Vec<&str> = text.lines().skip(2).collect();
        assert!(rows[0].ends_with("  holder9") && rows[1].ends_with("  holder7") && rows[2].ends_with("  holder9"), "{text}");
        assert!(text.lines().nth(1).unwrap().ends_with("oldest age  holder (function)"), "{text}");
    }

    /// Call sites of one function fold into one line per size.
    #[test]
    fn groups_that_read_alike_fold() {
        let mut g = LeakGroups::default();
        g.add(80 << 20, at(100, 0x10));
        g.add(80 << 20, at(50, 0x11)); // another call site in the same function
        g.add(16 << 20, at(70, 0x11));
        g.add(80 << 20, at(60, 0x20)); // another function
        g.fold(|a, b| a >> 4 == b >> 4);
        let sorted = g.sorted();
        assert_eq!(&sorted[..3], &[
            Group { holder: 0x10, size: 80 << 20, count: 2, oldest_born_ns: 50 },
            Group { holder: 0x20, size: 80 << 20, count: 1, oldest_born_ns: 60 },
            Group { holder: 0x11, size: 16 << 20, count: 1, oldest_born_ns: 70 },
        ]);
        assert_eq!((g.used, g.total_count), (3, 4));
    }

    #[test]
    fn overflowing_sizes_are_summed() {
        let mut g = LeakGroups::default();
        for i in 0..40u64 {
            g.add((i + 1) << 20, at(0, 1));
        }
        assert_eq!(g.other_count, 8);
        assert_eq!(g.total_count, 40);
    }
}
