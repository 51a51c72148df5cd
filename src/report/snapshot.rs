//! The memory snapshot (`tm_snapshot`, TENSORMALLOC_SNAPSHOT_AT_EXIT): the device pools'
//! segments and blocks with their holders, and the recent allocations and frees, written in the
//! format of PyTorch's memory snapshots (Note [Snapshot format]). Collected under each table's
//! own lock into a scratch mapping, then written with no lock held: no heap, no std formatting.

use crate::backing::{PageMemory, PAGE};
use crate::record::history::{self, HistoryEvent};
use crate::record::holders::{PLACE_HOST, PLACE_PINNED};
use crate::report::pickle::{FdSink, Pickler};
use crate::sys::os_pages::OsPages;
use crate::sys::claim;
use crate::sys::dir::{Dir, Unnamed};
use crate::sys::files::{self, Refused};
use core::ffi::c_int;

// Note [Snapshot format]
// What `torch.cuda.memory._dump_snapshot` pickles (torch/csrc/cuda/memory_snapshot.cpp), so
// that `python -m torch.cuda._memory_viz stats|segments|memory|trace|trace_plot|segment_plot`
// and pytorch.org/memory_viz read ours as they read PyTorch's:
// - A dict: `segments` (a list of segment dicts), `device_traces` (a list per device, indexed by
//   device: the viewer looks a segment's trace up as `snapshot.device_traces[seg.device]`), and
//   `allocator_settings` (ours: version, events lost, truncation).
// - A segment: device, address, total_size, allocated_size, active_size, requested_size, stream,
//   segment_type ('small'/'large'), segment_pool_id (a 2-tuple), is_expandable, frames, blocks.
//   Its blocks tile it in address order: `stats` (segsum) asserts that the free, rounding and
//   allocated bytes add up to total_size, and the viewer gives each block the address of the
//   sum of the sizes before it.
// - A block: address, size, requested_size, state, frames. `stats` counts requested_size of
//   'active_allocated' blocks as allocated: the pool does not keep the size asked for, so that
//   is the block's size, and stats' total_allocated is tm_get_stats' cuda_live_bytes. A block
//   freed by a cudaFree whose sync was deferred is 'active_pending_free' (PyTorch's state for
//   freed memory a stream may still use); other free blocks are 'inactive'.
// - Frames: one per block, `{filename: the calling object's path, line: 0, name: the calling
//   function, or the holder's name}` (holders.rs's Note [Holders]); [] when nobody is known, as
//   PyTorch writes blocks allocated before history was recorded.
// - Trace entries: action, addr, size, stream, time_us (the wall clock), frames. A free is a
//   'free_requested' and a 'free_completed' back to back (the pool frees at once; the viewer
//   folds the pair into one 'free'); a mapped segment is 'segment_alloc' and one given back
//   'segment_free' (cudaMalloc'd segments: 'segment_map' means expandable segments, which the
//   viewer merges with their neighbours); an 'oom' carries `device_free` instead of addr, as
//   PyTorch's does (`trace` prints `e['device_free']`).
// - Opcodes: protocol 2 and its memo (pickle.rs); the viewer's own unpickler reads those.
// - Events recorded after collection starts are left out: the viewer replays the trace
//   backwards from the segments, and an event for a segment the snapshot lacks would break it.
// Host memory goes to a second file, PATH.host.pickle, in the same format: device 0 there is the
// large host blocks (each its own mapping: one segment, one block), device 1 pinned memory
// (cudaMallocHost: live and cached blocks). In the main file they would be taken for devices:
// `stats` sums every segment into one total_reserved, and the viewer lists them as GPUs. Cached
// host blocks are not in it: the host cache has no walk yet.

/// One segment as collected: its blocks are `count` records of the block array from `first`.
#[derive(Clone, Copy, Default)]
struct Seg {
    place: u8,
    small: bool,
    /// A run of an expandable segment's mapped chunks (Note [Expandable segments]).
    expandable: bool,
    addr: u64,
    total: u64,
    allocated: u64,
    active: u64,
    first: usize,
    count: usize,
}

const INACTIVE: u8 = 0;
const ACTIVE: u8 = 1;
const PENDING_FREE: u8 = 2;

#[derive(Clone, Copy, Default)]
struct Blk {
    addr: u64,
    size: u64,
    state: u8,
    holder: u64,
}

/// The collected state, in a scratch mapping of our own (given back when dropped).
struct Collected<'a> {
    segs: &'a mut [Seg],
    nsegs: usize,
    blks: &'a mut [Blk],
    nblks: usize,
    events: &'a mut [HistoryEvent],
    nevents: usize,
    truncated: bool,
}

impl Collected<'_> {
    /// Appends a segment and its blocks, or nothing when they do not all fit.
    fn push_segment(&mut self, place: u8, addr: u64, small: bool, expandable: bool, blocks: impl Iterator<Item = Blk>) {
        let first = self.nblks;
        let mut seg = Seg { place, small, expandable, addr, first, ..Seg::default() };
        for b in blocks {
            let Some(slot) = self.blks.get_mut(self.nblks) else {
                self.nblks = first;
                self.truncated = true;
                return;
            };
            *slot = b;
            self.nblks += 1;
            seg.total += b.size;
            if b.state == ACTIVE {
                seg.allocated += b.size;
            }
            if b.state != INACTIVE {
                seg.active += b.size;
            }
        }
        seg.count = self.nblks - first;
        match self.segs.get_mut(self.nsegs) {
            Some(slot) => {
                *slot = seg;
                self.nsegs += 1;
            }
            None => {
                self.nblks = first;
                self.truncated = true;
            }
        }
    }

    fn segs(&self) -> &[Seg] {
        self.segs.get(..self.nsegs).unwrap_or(&[])
    }

    fn blocks(&self, s: &Seg) -> &[Blk] {
        self.blks.get(s.first..s.first + s.count).unwrap_or(&[])
    }

    fn events(&self) -> &[HistoryEvent] {
        self.events.get(..self.nevents).unwrap_or(&[])
    }
}

/// How many segments and blocks there are now (the scratch is sized from it, with room for
/// growth meanwhile).
fn count() -> (usize, usize) {
    let (mut segs, mut blocks) = (0usize, 0usize);
    crate::state::DEVICE.for_each_pool(|_, pool| {
        pool.for_each_segment(|s| {
            segs += 1;
            blocks += s.blocks().count();
        })
    });
    crate::state::HOST.for_each_live(|_, _, _| segs += 1);
    crate::state::DEVICE.for_each_pinned(|_, _| segs += 1);
    (segs, blocks.saturating_add(segs))
}

/// Fills `c`, leaving out the events recorded after the rings' `cut`.
fn collect(c: &mut Collected, cut: history::Cut) {
    crate::state::DEVICE.for_each_pool(|device, pool| {
        let place = crate::record::holders::device_place(device);
        pool.for_each_segment(|s| {
            let blocks = s.blocks().map(|b| Blk {
                addr: b.addr,
                size: b.size,
                state: if b.allocated { ACTIVE } else if b.pending { PENDING_FREE } else { INACTIVE },
                holder: b.holder,
            });
            c.push_segment(place, s.addr, s.small, s.expandable, blocks);
        });
    });
    crate::state::HOST.for_each_live(|addr, len, birth| {
        let b = Blk { addr: addr as u64, size: len as u64, state: ACTIVE, holder: birth.holder };
        c.push_segment(PLACE_HOST, b.addr, false, false, core::iter::once(b));
    });
    crate::state::DEVICE.for_each_pinned(|p, live| {
        let b = Blk { addr: p.addr, size: p.len, state: if live { ACTIVE } else { INACTIVE }, holder: if live { p.holder } else { 0 } };
        c.push_segment(PLACE_PINNED, p.addr, false, false, core::iter::once(b));
    });
    history::for_each_before(cut, |e| {
        if let Some(slot) = c.events.get_mut(c.nevents) {
            *slot = *e;
            c.nevents += 1;
        }
    });
    if let Some(segs) = c.segs.get_mut(..c.nsegs) {
        segs.sort_unstable_by_key(|s| (s.place, s.addr));
    }
}

/// The strings the snapshot repeats, each written once and recalled from the pickle's memo.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Word {
    Segments,
    DeviceTraces,
    AllocatorSettings,
    Device,
    Address,
    TotalSize,
    AllocatedSize,
    ActiveSize,
    RequestedSize,
    Stream,
    SegmentType,
    SegmentPoolId,
    IsExpandable,
    Frames,
    Blocks,
    Size,
    State,
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
    Small,
    Large,
    Action,
    Addr,
    TimeUs,
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    Oom,
    DeviceFree,
    Filename,
    Line,
    Name,
}

impl Word {
    fn text(self) -> &'static str {
        match self {
            Word::Segments => "segments",
            Word::DeviceTraces => "device_traces",
            Word::AllocatorSettings => "allocator_settings",
            Word::Device => "device",
            Word::Address => "address",
            Word::TotalSize => "total_size",
            Word::AllocatedSize => "allocated_size",
            Word::ActiveSize => "active_size",
            Word::RequestedSize => "requested_size",
            Word::Stream => "stream",
            Word::SegmentType => "segment_type",
            Word::SegmentPoolId => "segment_pool_id",
            Word::IsExpandable => "is_expandable",
            Word::Frames => "frames",
            Word::Blocks => "blocks",
            Word::Size => "size",
            Word::State => "state",
            Word::ActiveAllocated => "active_allocated",
            Word::ActivePendingFree => "active_pending_free",
            Word::Inactive => "inactive",
            Word::Small => "small",
            Word::Large => "large",
            Word::Action => "action",
            Word::Addr => "addr",
            Word::TimeUs => "time_us",
            Word::Alloc => "alloc",
            Word::FreeRequested => "free_requested",
            Word::FreeCompleted => "free_completed",
            Word::SegmentAlloc => "segment_alloc",
            Word::SegmentFree => "segment_free",
            Word::Oom => "oom",
            Word::DeviceFree => "device_free",
            Word::Filename => "filename",
            Word::Line => "line",
            Word::Name => "name",
        }
    }
}

/// Frames lists already written, by holder word (direct-mapped): a block from the same call
/// site recalls the same list from the memo instead of asking the loader again.
const FRAME_CACHE: usize = 256;

struct Writer {
    p: Pickler<FdSink<8192>>,
    frames: [(u64, u32); FRAME_CACHE],
    next_memo: u32,
    /// Added to the history's monotonic times to give the wall clock.
    wall_offset_ns: u64,
}

impl Writer {
    fn word(&mut self, w: Word) {
        self.p.memo_str(w as u8, w.text());
    }

    /// `"key": n`.
    fn int_item(&mut self, key: Word, n: u64) {
        self.word(key);
        self.p.uint(n);
    }

    fn frames(&mut self, holder: u64) {
        if holder == 0 {
            self.p.empty_list();
            return;
        }
        let slot = (holder.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % FRAME_CACHE;
        if let Some(&(word, index)) = self.frames.get(slot) {
            if word == holder {
                self.p.memo_get_long(index);
                return;
            }
        }
        self.p.empty_list();
        self.p.mark();
        self.p.empty_dict();
        self.p.mark();
        self.word(Word::Filename);
        let p = &mut self.p;
        crate::record::holders::describe(holder, |d| {
            p.str(d.object);
            p.memo_str(Word::Line as u8, Word::Line.text());
            p.uint(0);
            p.memo_str(Word::Name as u8, Word::Name.text());
            p.str(if d.symbol.is_empty() { d.holder } else { d.symbol });
        });
        self.p.setitems();
        self.p.appends();
        let index = self.next_memo;
        self.next_memo += 1;
        self.p.memo_put_long(index);
        if let Some(entry) = self.frames.get_mut(slot) {
            *entry = (holder, index);
        }
    }

    fn segment(&mut self, device: u64, s: &Seg, blocks: &[Blk]) {
        self.p.empty_dict();
        self.p.mark();
        self.int_item(Word::Device, device);
        self.int_item(Word::Address, s.addr);
        self.int_item(Word::TotalSize, s.total);
        self.int_item(Word::AllocatedSize, s.allocated);
        self.int_item(Word::ActiveSize, s.active);
        self.int_item(Word::RequestedSize, s.allocated);
        self.int_item(Word::Stream, 0);
        self.word(Word::SegmentType);
        self.word(if s.small { Word::Small } else { Word::Large });
        self.word(Word::SegmentPoolId);
        self.p.mark();
        self.p.uint(0);
        self.p.uint(0);
        self.p.tuple();
        self.word(Word::IsExpandable);
        self.p.bool(s.expandable);
        self.word(Word::Frames);
        self.p.empty_list();
        self.word(Word::Blocks);
        self.p.empty_list();
        self.p.mark();
        for b in blocks {
            self.p.empty_dict();
            self.p.mark();
            self.int_item(Word::Address, b.addr);
            self.int_item(Word::Size, b.size);
            self.int_item(Word::RequestedSize, if b.state == INACTIVE { 0 } else { b.size });
            self.word(Word::State);
            self.word(match b.state {
                ACTIVE => Word::ActiveAllocated,
                PENDING_FREE => Word::ActivePendingFree,
                _ => Word::Inactive,
            });
            self.word(Word::Frames);
            self.frames(b.holder);
            self.p.setitems();
        }
        self.p.appends();
        self.p.setitems();
    }

    fn entry(&mut self, action: Word, e: &HistoryEvent) {
        self.p.empty_dict();
        self.p.mark();
        self.word(Word::Action);
        self.word(action);
        self.int_item(if matches!(action, Word::Oom) { Word::DeviceFree } else { Word::Addr }, e.addr);
        self.int_item(Word::Size, e.size);
        self.int_item(Word::Stream, e.stream);
        self.int_item(Word::TimeUs, e.time_ns.wrapping_add(self.wall_offset_ns) / 1000);
        self.word(Word::Frames);
        self.frames(e.holder);
        self.p.setitems();
    }

    fn event(&mut self, e: &HistoryEvent) {
        match e.action {
            history::ALLOC => self.entry(Word::Alloc, e),
            history::FREE => {
                self.entry(Word::FreeRequested, e);
                self.entry(Word::FreeCompleted, e);
            }
            history::SEGMENT_MAP => self.entry(Word::SegmentAlloc, e),
            history::SEGMENT_UNMAP => self.entry(Word::SegmentFree, e),
            history::OOM => self.entry(Word::Oom, e),
            _ => {}
        }
    }
}

/// Which file a place goes to, and its device index there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum File {
    Devices,
    Host,
}

fn index_in(file: File, place: u8) -> Option<u64> {
    match file {
        File::Host => (place == PLACE_HOST || place == PLACE_PINNED).then_some(u64::from(place)),
        File::Devices => place.checked_sub(2).map(u64::from),
    }
}

/// Writes one file's pickle to `fd` (a file with no name yet: Note [Files others can reach]).
fn write_file(fd: c_int, file: File, c: &Collected, wall_offset_ns: u64) -> Result<(), c_int> {
    let mut w = Writer { p: Pickler::new(FdSink::new(fd)), frames: [(0, 0); FRAME_CACHE], next_memo: crate::report::pickle::SHORT_MEMO as u32, wall_offset_ns };
    let devices = match file {
        File::Host => 2,
        File::Devices => {
            let segs = c.segs().iter().filter_map(|s| index_in(file, s.place));
            let events = c.events().iter().filter_map(|e| index_in(file, e.place));
            segs.chain(events).max().map_or(0, |d| d + 1)
        }
    };
    w.p.proto();
    w.p.empty_dict();
    w.p.mark();
    w.word(Word::Segments);
    w.p.empty_list();
    w.p.mark();
    for s in c.segs() {
        if let Some(device) = index_in(file, s.place) {
            w.segment(device, s, c.blocks(s));
        }
    }
    w.p.appends();
    w.word(Word::DeviceTraces);
    w.p.empty_list();
    w.p.mark();
    for device in 0..devices {
        w.p.empty_list();
        w.p.mark();
        for e in c.events().iter().filter(|e| index_in(file, e.place) == Some(device)) {
            w.event(e);
        }
        w.p.appends();
    }
    w.p.appends();
    w.word(Word::AllocatorSettings);
    w.p.empty_dict();
    w.p.mark();
    w.p.str(b"allocator");
    w.p.str(concat!("tensormalloc ", env!("CARGO_PKG_VERSION")).as_bytes());
    w.p.str(b"trace_events_lost");
    w.p.uint(history::lost());
    w.p.str(b"truncated");
    w.p.bool(c.truncated);
    w.p.setitems();
    w.p.setitems();
    w.p.stop();
    w.p.sink.finish()
}

/// The longest path `write` takes (PATH_MAX, with its NUL).
pub const PATH_BYTES: usize = 4096;
/// What the host file's name adds to the snapshot's.
pub const HOST_SUFFIX: &[u8] = b".host.pickle";

/// A scratch mapping for the collected state, given back when dropped.
struct Scratch {
    addr: usize,
    len: usize,
}

impl Scratch {
    /// The mapping as empty tables of the given capacities (it was sized for them).
    fn collected(&mut self, seg_cap: usize, blk_cap: usize, ev_cap: usize) -> Collected<'_> {
        let mut at = self.addr;
        let mut carve = |n: usize, size: usize| {
            let start = at.div_ceil(64) * 64;
            at = start + n * size;
            start
        };
        let (segs, blks, events) = (carve(seg_cap, core::mem::size_of::<Seg>()), carve(blk_cap, core::mem::size_of::<Blk>()), carve(ev_cap, core::mem::size_of::<HistoryEvent>()));
        debug_assert!(at <= self.addr + self.len);
        // SAFETY: three disjoint, aligned parts of a fresh zero-filled mapping that lives as
        // long as `self`, which the slices borrow; all-zero bytes are valid values of these
        // plain-data types.
        unsafe {
            Collected {
                segs: core::slice::from_raw_parts_mut(segs as *mut Seg, seg_cap),
                nsegs: 0,
                blks: core::slice::from_raw_parts_mut(blks as *mut Blk, blk_cap),
                nblks: 0,
                events: core::slice::from_raw_parts_mut(events as *mut HistoryEvent, ev_cap),
                nevents: 0,
                truncated: false,
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        OsPages.unmap(self.addr, self.len);
    }
}

/// Writes the snapshot to `path` (`%p` in it: the pid), and the host's to `path` +
/// ".host.pickle", replacing files of ours there (tm_snapshot). Err: an errno.
pub fn write(path: &[u8]) -> Result<(), c_int> {
    write_named(path, false).map_err(|e| e.errno())
}

/// How the two files are named: each made with no name, written whole, then named (Note [Files
/// others can reach]); the main one at `path` in place of a file of ours (`claim`: false), or at
/// the first name of the run's it may take (Note [One file per process]); the host one beside it.
fn write_named(path: &[u8], claim: bool) -> Result<(), Refused> {
    if path.is_empty() {
        return Err(Refused::Os(libc::ENOENT));
    }
    if path.contains(&0) {
        return Err(Refused::Os(libc::EINVAL));
    }
    if path.len() >= PATH_BYTES {
        return Err(Refused::Os(libc::ENAMETOOLONG));
    }
    let own = crate::sys::process::id();
    let (dir_part, base) = files::split(path);
    let mut dir_path = [0u8; files::PATH_MAX_BYTES + 1];
    let n = files::expand_path(dir_part, own, &mut dir_path).ok_or(Refused::Os(libc::ENAMETOOLONG))?;
    let dir = Dir::open(dir_path.get(..n).unwrap_or(&[]))?;
    let cut = history::cut();
    let wall_offset_ns = crate::sys::clock::wall_offset_ns();
    let (segs, blocks) = count();
    // Room for what may be added while we map (other threads go on).
    let (seg_cap, blk_cap, ev_cap) = (segs + segs / 4 + 64, blocks + blocks / 4 + 256, history::HELD);
    let bytes = seg_cap * core::mem::size_of::<Seg>() + blk_cap * core::mem::size_of::<Blk>() + ev_cap * core::mem::size_of::<HistoryEvent>() + 3 * 64;
    let len = bytes.div_ceil(PAGE) * PAGE;
    let mut scratch = Scratch { addr: OsPages.map(len, PAGE).ok_or(Refused::Os(libc::ENOMEM))?, len };
    let mut c = scratch.collected(seg_cap, blk_cap, ev_cap);
    collect(&mut c, cut);
    let mut main = Unnamed::create(&dir, base)?;
    write_file(main.fd(), File::Devices, &c, wall_offset_ns)?;
    let mut name = [0u8; files::NAME_MAX_BYTES + 1];
    let name_len = if claim {
        let parent = crate::state::parent_at_fork();
        let claimed = claim::claim(&dir, base, &mut main, &claim::Claimant::this(parent.is_some()), |_| false)?;
        if let Some(why) = claimed.passed_over {
            claim::say(claim::Output::Snapshot, path, claim::Shown::of(path, claimed.name()).get(), why, parent.unwrap_or(0));
        }
        let got = claimed.name();
        name.get_mut(..got.len()).ok_or(Refused::Os(libc::ENAMETOOLONG))?.copy_from_slice(got);
        got.len()
    } else {
        let n = files::expand_path(base, own, &mut name).ok_or(Refused::Os(libc::ENAMETOOLONG))?;
        claim::put_in_place(&dir, name.get(..n).unwrap_or(&[]), &mut main)?;
        n
    };
    let mut host_name = [0u8; files::PATH_MAX_BYTES + 1];
    let host_name = files::joined(name.get(..name_len).unwrap_or(&[]), HOST_SUFFIX, &mut host_name).ok_or(Refused::Os(libc::ENAMETOOLONG))?;
    let mut host = Unnamed::create(&dir, host_name)?;
    write_file(host.fd(), File::Host, &c, wall_offset_ns)?;
    claim::put_in_place(&dir, host_name, &mut host)
}

/// TENSORMALLOC_SNAPSHOT_AT_EXIT: writes the snapshot, or says in one line why it could not.
pub fn at_exit(path: &[u8]) {
    if let Err(e) = write_named(path, true) {
        let mut text = [0u8; 128];
        crate::warn_line!(
            "TENSORMALLOC_SNAPSHOT_AT_EXIT={}: cannot write the memory snapshot ({}, errno {})",
            core::str::from_utf8(path).unwrap_or("(path)"),
            e.text(&mut text),
            e.errno()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_kept_whole_or_left_out() {
        let mut segs = [Seg::default(); 2];
        let mut blks = [Blk::default(); 3];
        let mut events = [HistoryEvent::default(); 1];
        let mut c = Collected { segs: &mut segs, nsegs: 0, blks: &mut blks, nblks: 0, events: &mut events, nevents: 0, truncated: false };
        let b = |addr, size, state| Blk { addr, size, state, holder: 0 };
        c.push_segment(2, 0x1000, true, false, [b(0x1000, 512, ACTIVE), b(0x1200, 512, PENDING_FREE)].into_iter());
        c.push_segment(2, 0x9000, false, false, [b(0x9000, 512, INACTIVE), b(0x9200, 512, ACTIVE)].into_iter());
        assert!(c.truncated);
        assert_eq!((c.nsegs, c.nblks), (1, 2));
        let s = c.segs()[0];
        assert_eq!((s.total, s.allocated, s.active), (1024, 512, 1024));
        c.push_segment(0, 0x5000, false, false, [b(0x5000, 4096, ACTIVE)].into_iter());
        assert_eq!((c.nsegs, c.nblks), (2, 3));
        c.push_segment(0, 0x7000, false, false, [b(0x7000, 4096, ACTIVE)].into_iter());
        assert_eq!((c.nsegs, c.nblks), (2, 3));
    }

    #[test]
    fn places_go_to_their_file() {
        assert_eq!(index_in(File::Host, PLACE_HOST), Some(0));
        assert_eq!(index_in(File::Host, PLACE_PINNED), Some(1));
        assert_eq!(index_in(File::Host, crate::record::holders::device_place(0)), None);
        assert_eq!(index_in(File::Devices, crate::record::holders::device_place(3)), Some(3));
        assert_eq!(index_in(File::Devices, PLACE_PINNED), None);
    }

    #[test]
    fn bad_paths_are_refused_before_anything_is_written() {
        assert_eq!(write(b""), Err(libc::ENOENT));
        assert_eq!(write(b"a\0b"), Err(libc::EINVAL));
        assert_eq!(write(&[b'a'; PATH_BYTES]), Err(libc::ENAMETOOLONG));
        assert_eq!(write(b"/nonexistent-dir/x.pickle"), Err(libc::ENOENT));
    }
}
