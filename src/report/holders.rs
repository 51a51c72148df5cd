//! The holders table as people read it: per holder and place, the bytes asked for, peak, blocks
//! and what was handed out beside them, then what tensormalloc keeps cached in each place,
//! biggest first. Text (the exit report, the out-of-memory report), JSON, and every row for
//! `tm_holders`. Gathered into a fixed array (the reports: the largest MAX_ROWS - 1, the rest
//! summed) or picked in order (`tm_holders`), written through `fmt::Write`: no allocation (it
//! must work at out of memory).

use crate::record::holders::{self, HolderRow, PLACE_HOST, PLACE_PINNED};
use crate::report::units::{Bytes, JsonText};
use crate::state::{DEVICE, HOST};
use core::fmt::{self, Write};

/// Rows kept, biggest first; the rest are summed into one "(others)" row.
pub const MAX_ROWS: usize = 48;

/// The id of the rows that are tensormalloc's own cache, not a holder's.
pub const CACHED: u16 = u16::MAX;
/// The id of the row that sums what did not fit.
pub const OTHERS: u16 = u16::MAX - 1;

/// The table: rows by live bytes (then cached), largest first.
pub struct Table {
    rows: [HolderRow; MAX_ROWS],
    len: usize,
    /// Rows summed into OTHERS.
    others: usize,
}

/// Every row of the process now: its holders', and the caches of every place that has one.
fn for_each_row(mut f: impl FnMut(HolderRow)) {
    // A block freed into its thread's slot leaves its holder's row for the cache's.
    HOST.settle_slots();
    holders::for_each_row(|r| f(*r));
    let (blocks, bytes) = HOST.cached();
    if bytes > 0 {
        f(HolderRow { id: CACHED, place: PLACE_HOST, live_bytes: bytes as u64, peak_bytes: HOST.stats.cached.peak(), blocks: blocks as u64, unused_bytes: 0 });
    }
    let (_, _, pinned_cached, pinned_peak) = DEVICE.pinned_figures();
    if pinned_cached > 0 {
        f(HolderRow { id: CACHED, place: PLACE_PINNED, live_bytes: pinned_cached, peak_bytes: pinned_peak, ..HolderRow::default() });
    }
    DEVICE.for_each_pool(|device, pool| {
        let cached = pool.cached_bytes();
        if cached > 0 {
            f(HolderRow { id: CACHED, place: holders::device_place(device), live_bytes: cached, ..HolderRow::default() });
        }
    });
}

/// The order of every listing: live bytes, largest first; then id and place.
fn order_key(r: &HolderRow) -> (core::cmp::Reverse<u64>, u16, u8) {
    (core::cmp::Reverse(r.live_bytes), r.id, r.place)
}

impl Table {
    pub const fn empty() -> Table {
        Table { rows: [HolderRow { id: 0, place: 0, live_bytes: 0, peak_bytes: 0, blocks: 0, unused_bytes: 0 }; MAX_ROWS], len: 0, others: 0 }
    }

    /// The process's holders now, and the caches of every place that has one.
    pub fn gather() -> Table {
        let mut t = Table::empty();
        t.gather_again();
        t
    }

    /// As `gather`, into this table (a static one, filled in place).
    pub fn gather_again(&mut self) {
        (self.len, self.others) = (0, 0);
        for_each_row(|r| self.add(r));
    }

    /// Inserts `r` in order among the first MAX_ROWS - 1 rows; what does not fit is summed
    /// into the last row, OTHERS.
    pub fn add(&mut self, r: HolderRow) {
        let kept = self.len.min(MAX_ROWS - 1);
        let at = self.rows.iter().take(kept).position(|x| r.live_bytes > x.live_bytes).unwrap_or(kept);
        let spilled = if kept < MAX_ROWS - 1 {
            None
        } else if at < kept {
            self.rows.get(kept - 1).copied()
        } else {
            Some(r)
        };
        if spilled != Some(r) {
            self.rows.copy_within(at..kept.saturating_sub(usize::from(spilled.is_some())), at + 1);
            if let Some(slot) = self.rows.get_mut(at) {
                *slot = r;
            }
        }
        match spilled {
            None => self.len += 1,
            Some(small) => {
                self.others += 1;
                if self.len < MAX_ROWS {
                    self.len = MAX_ROWS;
                    if let Some(o) = self.rows.get_mut(MAX_ROWS - 1) {
                        *o = HolderRow { id: OTHERS, ..HolderRow::default() };
                    }
                }
                if let Some(o) = self.rows.get_mut(MAX_ROWS - 1) {
                    o.live_bytes += small.live_bytes;
                    o.peak_bytes += small.peak_bytes;
                    o.blocks += small.blocks;
                    o.unused_bytes += small.unused_bytes;
                }
            }
        }
    }

    pub fn rows(&self) -> &[HolderRow] {
        self.rows.get(..self.len).unwrap_or(&[])
    }
}

/// Calls `f` with the name of a row's holder; `others`: how many rows OTHERS sums.
pub fn row_name<T>(r: &HolderRow, others: usize, f: impl FnOnce(&[u8]) -> T) -> T {
    match r.id {
        CACHED => f(b"(cached by tensormalloc)"),
        OTHERS => {
            let mut w = crate::sys::stderr::StackWriter::<40>::new();
            let _ = write!(w, "({others} more rows)");
            f(w.as_bytes())
        }
        id => holders::holder_name(id, f),
    }
}

/// "host", "pinned", or "cuda:N".
pub struct PlaceName(pub u8);

impl fmt::Display for PlaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            PLACE_HOST => f.write_str("host"),
            PLACE_PINNED => f.write_str("pinned"),
            d => write!(f, "cuda:{}", d - 2),
        }
    }
}

/// Bytes shown as text, lossily (names are file names, normally ASCII).
struct Name<'a>(&'a [u8]);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            f.write_str(chunk.valid())?;
            if !chunk.invalid().is_empty() {
                f.write_str("?")?;
            }
        }
        Ok(())
    }
}

/// The table as text, one row per holder and place; nothing when no large block was ever held.
pub fn write_text<W: Write>(w: &mut W, t: &Table) -> fmt::Result {
    if t.rows().is_empty() {
        return Ok(());
    }
    writeln!(w, " Who holds the memory (large blocks; live is what was asked for, unused what was handed out beside it; peak is the holder's own):")?;
    writeln!(w, "  {:<36} {:<8} {:>12} {:>12} {:>8} {:>12}", "holder", "place", "live", "peak", "blocks", "unused")?;
    for r in t.rows() {
        row_name(r, t.others, |name| {
            writeln!(
                w,
                "  {:<36.36} {:<8} {:>12} {:>12} {:>8} {:>12}",
                Padded(Name(name)),
                Padded(PlaceName(r.place)),
                Padded(Bytes(r.live_bytes)),
                Padded(Bytes(r.peak_bytes)),
                r.blocks,
                Padded(Bytes(r.unused_bytes))
            )
        })?;
    }
    let refused = holders::table().map_or(0, |h| h.refused());
    if refused > 0 {
        writeln!(w, "  The table is full: {} more holders are counted as unknown (it names {}).", refused, holders::MAX_HOLDERS - 1)?;
    }
    Ok(())
}

/// The table as a JSON array of {holder, place, live_bytes, peak_bytes, blocks, unused_bytes,
/// cached}.
pub fn write_json<W: Write>(w: &mut W, t: &Table) -> fmt::Result {
    w.write_str("[")?;
    for (i, r) in t.rows().iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        row_name(r, t.others, |name| {
            write!(
                w,
                "{sep}{{\"holder\":\"{}\",\"place\":\"{}\",\"live_bytes\":{},\"peak_bytes\":{},\"blocks\":{},\"unused_bytes\":{},\"cached\":{}}}",
                JsonText(name),
                PlaceName(r.place),
                r.live_bytes,
                r.peak_bytes,
                r.blocks,
                r.unused_bytes,
                r.id == CACHED
            )
        })?;
    }
    w.write_str("]")
}

/// TM_HOLDER_VERSION in include/tensormalloc.h.
pub const C_HOLDER_VERSION: u32 = 3;

/// `tm_holder_t` in include/tensormalloc.h (version 3).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CHolderRow {
    /// Bytes of the row filled.
    pub size: u32,
    pub version: u32,
    /// The holder's short name, NUL-terminated (cut to fit).
    pub name: [u8; 64],
    /// -1 host, -2 pinned host memory, N >= 0 device N.
    pub place: i32,
    /// 1 for the rows of tensormalloc's own cache (live_bytes is then the bytes cached).
    pub cached: i32,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub blocks: u64,
    pub unused_bytes: u64,
}

/// `tm_holder_v1_t`: the first layout, which the legacy `tm_holders` writes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CHolderRowV1 {
    pub name: [u8; 64],
    pub place: i32,
    pub cached: i32,
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub blocks: u64,
}

impl From<&CHolderRow> for CHolderRowV1 {
    fn from(r: &CHolderRow) -> Self {
        CHolderRowV1 { name: r.name, place: r.place, cached: r.cached, live_bytes: r.live_bytes, peak_bytes: r.peak_bytes, blocks: r.blocks }
    }
}

/// Calls `f` with each of the first `limit` rows, in the reports' order, every holder its own
/// row (none summed); returns how many rows there are. Each row is picked by one pass over all
/// of them: no table to sort, no allocation.
fn for_each_c_row(limit: usize, mut f: impl FnMut(usize, &CHolderRow)) -> usize {
    let mut count = 0;
    for_each_row(|_| count += 1);
    let mut previous = None;
    for i in 0..limit.min(count) {
        let mut next: Option<HolderRow> = None;
        for_each_row(|r| {
            let after_previous = previous.is_none_or(|p| order_key(&r) > p);
            if after_previous && next.is_none_or(|n| order_key(&r) < order_key(&n)) {
                next = Some(r);
            }
        });
        let Some(r) = next else { break };
        previous = Some(order_key(&r));
        let mut name = [0u8; 64];
        row_name(&r, 0, |n| {
            let len = n.len().min(63);
            if let (Some(dst), Some(src)) = (name.get_mut(..len), n.get(..len)) {
                dst.copy_from_slice(src);
            }
        });
        let place = match r.place {
            PLACE_HOST => -1,
            PLACE_PINNED => -2,
            d => i32::from(d) - 2,
        };
        f(i, &CHolderRow {
            size: core::mem::size_of::<CHolderRow>() as u32,
            version: C_HOLDER_VERSION,
            name,
            place,
            cached: i32::from(r.id == CACHED),
            live_bytes: r.live_bytes,
            peak_bytes: r.peak_bytes,
            blocks: r.blocks,
            unused_bytes: r.unused_bytes,
        });
    }
    count
}

/// Writes the first `capacity` rows to `out`, `row_size` bytes apart, at most `row_size` bytes
/// of each (`size` says how many); returns how many rows there are.
///
/// # Safety
/// `out` points to `capacity * row_size` writable bytes (or `capacity` is 0).
pub unsafe fn fill_c_rows(out: *mut u8, capacity: usize, row_size: usize) -> usize {
    let limit = if out.is_null() || row_size < 8 { 0 } else { capacity };
    for_each_c_row(limit, |i, row| {
        let filled = row_size.min(core::mem::size_of::<CHolderRow>());
        let row = CHolderRow { size: filled as u32, ..*row };
        // SAFETY: i < capacity, so row i's `row_size` bytes are the caller's; we write `filled`
        // of them, from a row of ours at least that long.
        unsafe { core::ptr::copy_nonoverlapping((&row as *const CHolderRow).cast::<u8>(), out.add(i * row_size), filled) };
    })
}

/// The legacy `tm_holders`: the first `capacity` rows in the first layout.
///
/// # Safety
/// `out` points to `capacity` writable `tm_holder_v1_t` (or `capacity` is 0).
pub unsafe fn fill_v1_rows(out: *mut CHolderRowV1, capacity: usize) -> usize {
    let limit = if out.is_null() { 0 } else { capacity };
    for_each_c_row(limit, |i, row| {
        // SAFETY: i < capacity, and out has room for capacity rows.
        unsafe { out.add(i).write_unaligned(CHolderRowV1::from(row)) };
    })
}

/// Formats a value into a stack buffer first, so width, alignment and a cut (precision) apply to
/// the whole of it; what the buffer cannot hold is cut, at a character boundary.
struct Padded<T: fmt::Display>(T);

impl<T: fmt::Display> fmt::Display for Padded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut w = crate::sys::stderr::StackWriter::<40>::new();
        let _ = write!(w, "{}", self.0);
        let bytes = w.as_bytes();
        let valid = core::str::from_utf8(bytes).map_or_else(|e| bytes.get(..e.valid_up_to()).unwrap_or(&[]), str::as_bytes);
        f.pad(core::str::from_utf8(valid).unwrap_or(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u16, live: u64) -> HolderRow {
        HolderRow { id, place: 0, live_bytes: live, peak_bytes: live, blocks: 1, unused_bytes: 3 }
    }

    #[test]
    fn rows_are_kept_largest_first_and_the_rest_summed() {
        let mut t = Table::empty();
        for i in 0..(MAX_ROWS as u64 + 5) {
            t.add(row(i as u16 + 1, 100 + i));
        }
        let rows = t.rows();
        assert_eq!(rows.len(), MAX_ROWS);
        assert_eq!(rows[0].live_bytes, 100 + MAX_ROWS as u64 + 4);
        assert!(rows[..MAX_ROWS - 1].windows(2).all(|w| w[0].live_bytes >= w[1].live_bytes));
        let others = rows[MAX_ROWS - 1];
        assert_eq!(others.id, OTHERS);
        let total: u64 = (0..(MAX_ROWS as u64 + 5)).map(|i| 100 + i).sum();
        assert_eq!(rows.iter().map(|r| r.live_bytes).sum::<u64>(), total, "nothing lost");
        assert_eq!(rows.iter().map(|r| r.blocks).sum::<u64>(), MAX_ROWS as u64 + 5);
        assert_eq!(rows.iter().map(|r| r.unused_bytes).sum::<u64>(), 3 * (MAX_ROWS as u64 + 5));
        assert_eq!(t.others, 6, "the last row sums six");
        assert_eq!(row_name(&others, t.others, |n| n.to_vec()), b"(6 more rows)");
    }

    /// The C layouts: version 3 and the first one, as include/tensormalloc.h declares them.
    #[test]
    fn c_rows_have_the_headers_layouts() {
        assert_eq!(core::mem::size_of::<CHolderRow>(), 112);
        assert_eq!(core::mem::offset_of!(CHolderRow, name), 8);
        assert_eq!(core::mem::offset_of!(CHolderRow, live_bytes), 80);
        assert_eq!(core::mem::offset_of!(CHolderRow, unused_bytes), 104);
        assert_eq!(core::mem::size_of::<CHolderRowV1>(), 96);
        assert_eq!(core::mem::offset_of!(CHolderRowV1, blocks), 88);
    }

    #[test]
    fn text_and_json_name_places_and_escape_names() {
        let mut t = Table::empty();
        t.add(HolderRow { id: CACHED, place: 3, live_bytes: 5 << 20, ..HolderRow::default() });
        let mut w = crate::sys::stderr::StackWriter::<4096>::new();
        write_text(&mut w, &t).unwrap();
        let text = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(text.contains("(cached by tensormalloc)") && text.contains("cuda:1") && text.contains("5.0 MiB"), "{text}");
        let mut w = crate::sys::stderr::StackWriter::<4096>::new();
        write_json(&mut w, &t).unwrap();
        let json = std::str::from_utf8(w.as_bytes()).unwrap();
        assert!(json.contains("\"place\":\"cuda:1\"") && json.contains("\"cached\":true"), "{json}");
        assert_eq!(JsonText(b"a\"b\\\n").to_string(), "a\\\"b\\\\\\u000a");
        let long = [b'x'; 50];
        assert_eq!(format!("{:<36.36}|", Padded(Name(&long))), format!("{}|", "x".repeat(36)));
        let wide = "é".repeat(30);
        assert_eq!(format!("{:<36.36}|", Padded(Name(wide.as_bytes()))), format!("{}{}|", "é".repeat(20), " ".repeat(16)), "cut at a character");
    }
}
