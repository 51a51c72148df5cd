//! glibc's inspection calls, with the blocks we hold counted as glibc counts its mmapped ones:
//! `mallinfo`/`mallinfo2` (our live blocks in `hblks`/`hblkhd`, our cached bytes in
//! `fordblks`, the free bytes held, and in `arena`, the bytes held that free bytes are part of:
//! a program that takes `arena - fordblks` for the bytes in use gets glibc's answer), `malloc_stats` (the next allocator's lines, then ours) and
//! `malloc_info` (our live blocks added to its `<total type="mmap">`, our cache beside it).
//! The next allocator's figures for the small blocks come first, as it has them.

use crate::report::units::Bytes;
use crate::state::{globals, HOST};
use crate::sys::next::MallInfo;
use core::ffi::c_int;
use core::fmt::Write;

/// What we hold: live blocks and bytes, cached blocks and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub live_blocks: u64,
    pub live_bytes: u64,
    pub cached_blocks: u64,
    pub cached_bytes: u64,
}

fn held() -> Held {
    // A block freed into its thread's slot is cached, not in use.
    HOST.settle_slots();
    let (cached_blocks, cached_bytes) = HOST.cached();
    Held {
        live_blocks: HOST.stats.live_blocks.current(),
        live_bytes: HOST.stats.live.current(),
        cached_blocks: cached_blocks as u64,
        cached_bytes: cached_bytes as u64,
    }
}

/// The next allocator's mallinfo2 with ours added.
pub fn mallinfo2() -> MallInfo<usize> {
    let mut m = globals().and_then(|g| g.next.control.mallinfo2).map_or_else(MallInfo::default, |f| {
        // SAFETY: plain forwarding.
        unsafe { f() }
    });
    add(&mut m, held(), |n| usize::try_from(n).unwrap_or(usize::MAX));
    m
}

/// The same in `int`s, cut as glibc's mallinfo cuts them.
pub fn mallinfo() -> MallInfo<c_int> {
    let mut m = globals().and_then(|g| g.next.control.mallinfo).map_or_else(MallInfo::default, |f| {
        // SAFETY: plain forwarding.
        unsafe { f() }
    });
    add(&mut m, held(), |n| n as c_int);
    m
}

fn add<T: Copy + core::ops::Add<Output = T>>(m: &mut MallInfo<T>, h: Held, to: impl Fn(u64) -> T) {
    m.hblks = m.hblks + to(h.live_blocks);
    m.hblkhd = m.hblkhd + to(h.live_bytes);
    m.arena = m.arena + to(h.cached_bytes);
    m.fordblks = m.fordblks + to(h.cached_bytes);
}

/// malloc_stats: the next allocator's report on stderr, then ours in its manner.
pub fn malloc_stats() {
    if let Some(f) = globals().and_then(|g| g.next.control.malloc_stats) {
        // SAFETY: plain forwarding.
        unsafe { f() };
    }
    let h = held();
    let mut w = crate::sys::stderr::StackWriter::<512>::new();
    let _ = write!(
        w,
        "tensormalloc (large blocks, mmapped):\nin use bytes     = {:10}\nin use blocks    = {:10}\ncached bytes     = {:10}\ncached blocks    = {:10}\nmax in use bytes = {:10} ({})\n",
        h.live_bytes,
        h.live_blocks,
        h.cached_bytes,
        h.cached_blocks,
        HOST.stats.live.peak(),
        Bytes(HOST.stats.live.peak())
    );
    w.flush_to(2);
}

/// The most text of the next allocator's malloc_info we edit; past it, it is passed on as it is.
const INFO_BYTES: usize = 256 << 10;

/// malloc_info: the next allocator's XML with our live blocks added to its mmap total and our
/// cache beside it; its answer. Options other than 0 (none defined yet) go to it unedited.
///
/// # Safety
/// `fp` is an open `FILE` (malloc_info's contract).
pub unsafe fn malloc_info(options: c_int, fp: *mut libc::FILE) -> c_int {
    let next = globals().and_then(|g| g.next.control.malloc_info);
    let scratch = if options == 0 { crate::sys::os_pages::map_table(INFO_BYTES) } else { None };
    let captured = match (next, scratch) {
        (Some(f), Some(addr)) => {
            // SAFETY: map_table mapped INFO_BYTES of zeroed memory, ours until unmapped below.
            let buf = unsafe { core::slice::from_raw_parts_mut(addr as *mut u8, INFO_BYTES) };
            // SAFETY: plain forwarding, into our FILE.
            crate::sys::stdio::captured(buf, |mem| {
                unsafe { f(0, mem) };
            })
            .map(|text| (text.as_ptr(), text.len()))
        }
        _ => None,
    };
    let answer = match captured {
        Some((text, len)) => {
            // SAFETY: the captured text lies in the scratch mapping, still mapped.
            let text = unsafe { core::slice::from_raw_parts(text, len) };
            let mut ok = true;
            // Cancellable, as glibc's own writes here are: a thread blocked writing to a full
            // pipe must be cancellable (docs/limits.md: one cancelled here leaves the scratch
            // mapped, 256 KiB).
            // SAFETY: fp is the caller's open FILE.
            edit_info(text, held(), |part| ok &= unsafe { crate::sys::stdio::put(fp, part) });
            if ok { 0 } else { -1 }
        }
        // SAFETY: plain forwarding (the text did not fit, or no scratch: passed on unedited).
        None => next.map_or(0, |f| unsafe { f(options, fp) }),
    };
    if let Some(addr) = scratch {
        crate::backing::PageMemory::unmap(&crate::sys::os_pages::OsPages, addr, INFO_BYTES);
    }
    answer
}

const MMAP_TOTAL: &[u8] = b"<total type=\"mmap\" count=\"";
const END: &[u8] = b"</malloc>";

/// Hands `out` the text of `xml` (glibc's malloc_info) with `held`'s live blocks added to the
/// top-level `<total type="mmap" .../>` and a `<total type="tensormalloc-cached" .../>` line
/// before `</malloc>`; text of another shape goes out as it is.
pub fn edit_info(xml: &[u8], held: Held, mut out: impl FnMut(&[u8])) {
    // The top-level total is the last one (each heap has none of its own type mmap).
    let Some(at) = find_last(xml, MMAP_TOTAL) else { return out(xml) };
    let (head, rest) = xml.split_at(at);
    let fields = rest.get(MMAP_TOTAL.len()..).unwrap_or(&[]);
    let Some((count, size, tail)) = parse_total(fields) else { return out(xml) };
    out(head);
    let mut line = crate::sys::stderr::StackWriter::<160>::new();
    let _ = write!(line, "<total type=\"mmap\" count=\"{}\" size=\"{}\"/>", count + held.live_blocks, size + held.live_bytes);
    out(line.as_bytes());
    match find_last(tail, END) {
        Some(end) => {
            let (before, after) = tail.split_at(end);
            out(before);
            let mut cached = crate::sys::stderr::StackWriter::<160>::new();
            let _ = writeln!(cached, "<total type=\"tensormalloc-cached\" count=\"{}\" size=\"{}\"/>", held.cached_blocks, held.cached_bytes);
            out(cached.as_bytes());
            out(after);
        }
        None => out(tail),
    }
}

/// `12" size="3456"/>` and what follows: (12, 3456, what follows).
fn parse_total(s: &[u8]) -> Option<(u64, u64, &[u8])> {
    let (count, rest) = digits(s)?;
    let rest = rest.strip_prefix(b"\" size=\"")?;
    let (size, rest) = digits(rest)?;
    Some((count, size, rest.strip_prefix(b"\"/>")?))
}

fn digits(s: &[u8]) -> Option<(u64, &[u8])> {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    let (number, rest) = s.split_at(n);
    Some((crate::config::parse_u64(number)?, rest))
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GLIBC: &str = "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n</sizes>\n<total type=\"fast\" count=\"0\" size=\"0\"/>\n<total type=\"rest\" count=\"1\" size=\"133776\"/>\n<system type=\"current\" size=\"135168\"/>\n</heap>\n<total type=\"fast\" count=\"0\" size=\"0\"/>\n<total type=\"rest\" count=\"1\" size=\"133776\"/>\n<total type=\"mmap\" count=\"2\" size=\"8392704\"/>\n<system type=\"current\" size=\"135168\"/>\n</malloc>\n";

    fn edited(xml: &str, held: Held) -> String {
        let mut out = vec![];
        edit_info(xml.as_bytes(), held, |part| out.extend_from_slice(part));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn our_blocks_join_the_mmap_total_and_the_cache_stands_beside_it() {
        let held = Held { live_blocks: 3, live_bytes: 100 << 20, cached_blocks: 2, cached_bytes: 40 << 20 };
        let out = edited(GLIBC, held);
        assert!(out.contains("<total type=\"mmap\" count=\"5\" size=\"113250304\"/>\n<system"), "{out}");
        assert!(out.ends_with("<total type=\"tensormalloc-cached\" count=\"2\" size=\"41943040\"/>\n</malloc>\n"), "{out}");
        assert_eq!(out.matches("type=\"mmap\"").count(), 1);
        assert_eq!(out.replace("count=\"5\" size=\"113250304\"", "count=\"2\" size=\"8392704\"").replace("<total type=\"tensormalloc-cached\" count=\"2\" size=\"41943040\"/>\n", ""), GLIBC);
    }

    #[test]
    fn text_of_another_shape_goes_out_as_it_is() {
        let held = Held { live_blocks: 1, live_bytes: 1, cached_blocks: 0, cached_bytes: 0 };
        for other in ["", "<malloc version=\"2\"/>", "<total type=\"mmap\" count=\"x\" size=\"1\"/>"] {
            assert_eq!(edited(other, held), other);
        }
    }
}
