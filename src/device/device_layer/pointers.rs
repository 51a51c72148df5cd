//! What an address is to us: which pool owns it, whether it lies in our memory, the block a
//! pointer query or an IPC export names (Note [IPC] in device/pool/pointers.rs, Note [Buffer ids]).

use super::DeviceLayer;
use crate::backing::{DeviceError, DeviceRuntime};
use crate::device::pool::BlockView;
use crate::device::table::NONE;

/// What an IPC handle of a pointer names (Note [IPC] in device/pool/pointers.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// Not a pooled pointer: the runtime answers.
    NotOurs,
    /// Our memory, but no live block there (freed, or never handed out): refused, as the driver
    /// refuses freed memory.
    NotLive,
    /// A block that is its whole segment, now marked so that it never returns to the cache:
    /// the driver's handle names exactly it.
    Whole,
    /// A live block sharing its segment: the handle is ours (device/ipc), naming the segment's
    /// driver handle `real` and the block's `offset` in it.
    Shared(SharedBlock),
    /// A live block of an expandable segment (Note [IPC of expandable segments] in
    /// device/pool/exports.rs): the handle is ours, naming the run of chunks it lies on.
    Expandable(ExpandableBlock),
    /// The driver refused the segment's handle.
    Failed(DeviceError),
}

/// A live block that shares its segment, as an export of ours names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedBlock {
    pub device: usize,
    pub addr: u64,
    pub size: u64,
    /// Note [Buffer ids]: its life, so a block freed and handed out again meanwhile is told apart.
    pub buffer_id: u64,
    /// Its offset in its segment, and the segment's length.
    pub offset: u64,
    pub segment_len: u64,
    /// The segment's driver handle.
    pub real: [u8; 64],
    /// The registry entry a handle of ours names already, if one does.
    pub entry: Option<u32>,
}

/// A live block of an expandable segment, as an export of ours names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpandableBlock {
    pub device: usize,
    pub addr: u64,
    pub size: u64,
    /// Note [Buffer ids]: its life.
    pub buffer_id: u64,
    /// The run of chunks it lies on: the first one's address, how many, and their size.
    pub first_chunk: u64,
    pub chunks: u64,
    pub chunk_bytes: u64,
    /// The registry entry a handle of ours names already, if one does.
    pub entry: Option<u32>,
}

/// A pointer query about an address (cuMemGetAddressRange, RANGE_START_ADDR/SIZE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Not inside one of our segments: the runtime's answer stands.
    NotOurs,
    /// Inside this live block: (start, size, buffer id: Note [Buffer ids] in device/pool/pointers.rs).
    Live(u64, u64, u64),
    /// Inside cached (freed) memory of ours: no allocation there, as after the runtime's free.
    Free,
    /// Inside a live pinned block: (start, bytes asked for) (Note [Pinned memory answers as
    /// asked] in device/pinned/cache.rs); the driver's other attributes stand.
    Pinned(u64, u64),
}

/// Note [Buffer ids]: a pool's number for a block as an id of its own: above any id the runtime
/// gives (it counts its allocations from 1), the device in the bits below.
fn buffer_id(device: usize, number: u64) -> u64 {
    (1 << 63) | ((device as u64) << 56) | (number & ((1 << 56) - 1))
}

impl<R: DeviceRuntime> DeviceLayer<R> {

    pub(super) fn owning_device(&self, addr: usize) -> Option<usize> {
        self.pools().iter().position(|p| {
            let pool = p.lock();
            pool.is_ready() && pool.owns(addr as u64)
        })
    }

    /// Whether `addr` lies in one of our segments, live or cached.
    pub(super) fn in_segment(&self, addr: usize) -> bool {
        let mut maybe = false;
        for p in self.pools().iter() {
            let pool = p.lock();
            if pool.is_ready() && pool.may_contain(addr as u64) {
                if pool.has_segment(addr as u64) || pool.range_of(addr as u64).is_some() {
                    return true;
                }
                maybe = true;
            }
        }
        if !maybe {
            return false;
        }
        let Some((base, _)) = self.runtime.allocation_range(addr) else { return false };
        self.pools().iter().any(|p| {
            let pool = p.lock();
            pool.is_ready() && pool.has_segment(base as u64)
        })
    }

    /// Whether `addr` is device or pinned memory of ours, a live block or not (a free of it
    /// must never reach the runtime unchecked).
    pub fn holds(&self, addr: usize) -> bool {
        self.owning_device(addr).is_some() || self.in_segment(addr) || self.answers() && {
            let pinned = self.pinned.lock();
            pinned.owns(addr as u64) || pinned.is_cached(addr as u64)
        }
    }

    /// The pool and block that contain `addr`, a block start or any address inside one of our
    /// segments (the driver names the segment).
    pub(super) fn locate(&self, addr: usize) -> Option<(usize, BlockView)> {
        for (d, p) in self.pools().iter().enumerate() {
            let pool = p.lock();
            if let Some(b) = pool.live_block(addr as u64).filter(|_| pool.is_ready()) {
                return Some((d, b));
            }
            // Note [Expandable segments]: the driver would answer a chunk's mapping; the pool
            // knows its ranges.
            if let Some(b) = pool.range_of(addr as u64).and_then(|base| pool.block_at(base, addr as u64)) {
                return Some((d, b));
            }
        }
        let (base, _) = self.runtime.allocation_range(addr)?;
        self.pools().iter().enumerate().find_map(|(d, p)| {
            let pool = p.lock();
            if !pool.is_ready() || !pool.has_segment(base as u64) {
                return None;
            }
            pool.block_at(base as u64, addr as u64).map(|b| (d, b))
        })
    }

    /// cuMemGetAddressRange / RANGE_START_ADDR / RANGE_SIZE / BUFFER_ID: the block, not our
    /// segment.
    pub fn range(&self, addr: usize) -> RangeAnswer {
        match self.locate(addr) {
            None => self.pinned_range(addr),
            Some((d, b)) if b.allocated => RangeAnswer::Live(b.addr, b.size, buffer_id(d, b.buffer_id)),
            Some(_) => RangeAnswer::Free,
        }
    }

    /// `range` for an address in no pool: a pinned block of ours by the runtime's range of it
    /// (Note [Pinned memory answers as asked] in device/pinned/cache.rs); no runtime call while
    /// none is held.
    fn pinned_range(&self, addr: usize) -> RangeAnswer {
        if !self.answers() || !self.used.load(core::sync::atomic::Ordering::Relaxed) || self.pinned.lock().is_empty() {
            return RangeAnswer::NotOurs;
        }
        let Some((base, _)) = self.runtime.allocation_range(addr) else { return RangeAnswer::NotOurs };
        let Some((b, live)) = self.pinned.lock().starting_at(base as u64) else { return RangeAnswer::NotOurs };
        let asked = b.asked.max(1);
        if live && (addr as u64).wrapping_sub(b.addr) < asked {
            RangeAnswer::Pinned(b.addr, asked)
        } else {
            RangeAnswer::Free
        }
    }

    /// The context of the expandable segment `addr` lies in (Note [Expandable segments]); None
    /// outside them.
    pub fn expandable_context(&self, addr: usize) -> Option<u64> {
        self.pools().iter().find_map(|p| {
            let pool = p.lock();
            (pool.is_ready() && pool.range_of(addr as u64).is_some()).then(|| pool.owner())
        })
    }

    /// cudaIpcGetMemHandle / cuIpcGetMemHandle of `addr` (Note [IPC]): what the handle names.
    pub fn export(&self, addr: usize) -> Export {
        let Some((d, b)) = self.locate(addr) else { return Export::NotOurs };
        let Some(pool) = self.pools().get(d) else { return Export::NotOurs };
        if !b.allocated {
            return Export::NotLive;
        }
        {
            let p = pool.lock();
            if p.expandable() {
                let Some((first_chunk, chunks)) = p.chunk_run(b.addr, b.size) else { return Export::NotLive };
                let (chunk_bytes, entry) = (p.chunk_bytes(), p.ipc_entry(b.addr));
                return Export::Expandable(ExpandableBlock { device: d, addr: b.addr, size: b.size, buffer_id: b.buffer_id, first_chunk, chunks, chunk_bytes, entry });
            }
        }
        if b.whole_segment {
            return if pool.lock().mark_exported(b.addr, b.buffer_id, NONE) { Export::Whole } else { Export::NotLive };
        }
        let (segment, entry) = {
            let p = pool.lock();
            (p.segment_of(b.addr), p.ipc_entry(b.addr))
        };
        let Some((base, segment_len)) = segment else { return Export::NotLive };
        // The segment's handle, in its pool's context.
        match self.with_device(d as i32, || self.runtime.ipc_handle(base)) {
            Ok(real) => Export::Shared(SharedBlock { device: d, addr: b.addr, size: b.size, buffer_id: b.buffer_id, offset: b.addr - base, segment_len, real, entry }),
            Err(e) => Export::Failed(e),
        }
    }

    /// Whether block `addr` of `device`'s pool is live in its life `buffer_id` (Note [Buffer ids]).
    pub fn is_live_block(&self, device: usize, addr: u64, buffer_id: u64) -> bool {
        self.pools().get(device).is_some_and(|p| p.lock().live_block(addr).is_some_and(|b| b.buffer_id == buffer_id))
    }

    /// Note [IPC]: live block `addr` of `device`'s pool, of life `buffer_id`, is named by registry
    /// entry `entry` from now on, unless it was freed meanwhile, or another export named it first
    /// (false).
    pub fn mark_export(&self, device: usize, addr: u64, buffer_id: u64, entry: u32) -> bool {
        self.pools().get(device).is_some_and(|p| p.lock().mark_exported(addr, buffer_id, entry))
    }
}
