//! The device pool's fallbacks: every way it serves a request otherwise than the settings ask
//! (classic segments for expandable ones, the driver itself for the pool) is said on stderr, one
//! line per kind per process, naming what happened, what the pool does instead and, where one
//! helps, the setting to change. Called with no lock held (the line is a write(2)).

use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Why the pool falls back, with what the line names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// TENSORMALLOC_CUDA_SEGMENTS=expandable on a device or driver without the virtual memory API.
    NoVirtualMemory { device: i32 },
    /// TENSORMALLOC_CUDA_SEGMENTS=expandable with TENSORMALLOC_CUDA_POOL=binned.
    BinnedExpandable,
    /// The expandable pool's chunk table could not be mapped (an address-space limit).
    ExpandableTables { device: i32 },
    /// The pool's own tables could not be mapped: nothing is pooled on that device.
    PoolTables { device: i32 },
    /// cuMemAddressReserve refused a range (`code`): the pool goes on with classic segments when
    /// it had no range yet (`classic`), else requests that need a new range pass to the driver.
    Reservation { device: i32, code: i32, classic: bool },
    /// The expandable pool holds as many ranges as it tracks.
    RangesFull { device: i32 },
    /// The pool's block or segment tables are full.
    TablesFull { device: i32 },
    /// A request made under another context than the one the pool's segments live in (Note
    /// [Context lifetime] in device/pool/mod.rs).
    OtherContext { device: i32 },
    /// TENSORMALLOC_CUDA_LIMIT in percent, and the driver would not say the device's size.
    PercentCap { device: i32 },
    /// A device ordinal past the devices the pool tracks.
    DeviceOrdinal { device: i32 },
    /// The pinned cache's tables could not be mapped.
    PinnedTables,
    /// A capture began while a driver call of ours was still under way after the bounded wait
    /// (Note [Graph captures under way] in device_layer/captures.rs).
    CaptureOverlap,
}

const KINDS: usize = 12;
static SAID: [AtomicBool; KINDS] = [const { AtomicBool::new(false) }; KINDS];

impl Fallback {
    fn kind(self) -> usize {
        match self {
            Fallback::NoVirtualMemory { .. } => 0,
            Fallback::BinnedExpandable => 1,
            Fallback::ExpandableTables { .. } => 2,
            Fallback::PoolTables { .. } => 3,
            Fallback::Reservation { .. } => 4,
            Fallback::RangesFull { .. } => 5,
            Fallback::TablesFull { .. } => 6,
            Fallback::OtherContext { .. } => 7,
            Fallback::PercentCap { .. } => 8,
            Fallback::DeviceOrdinal { .. } => 9,
            Fallback::PinnedTables => 10,
            Fallback::CaptureOverlap => 11,
        }
    }
}

/// Says `f` on stderr unless its kind was said already in this process.
pub fn say(f: Fallback) {
    if SAID.get(f.kind()).is_none_or(|s| s.swap(true, Relaxed)) {
        return;
    }
    match f {
        Fallback::NoVirtualMemory { device } => crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: the driver has no virtual memory management for device {device}; its pool uses classic segments"),
        Fallback::BinnedExpandable => crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: the binned pool (TENSORMALLOC_CUDA_POOL=binned) keeps one classic segment per block; expandable segments serve the split pool"),
        Fallback::ExpandableTables { device } => crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: the chunk table for device {device} could not be mapped (an address-space limit?); its pool uses classic segments"),
        Fallback::PoolTables { device } => crate::warn_line!("the device pool's tables for device {device} could not be mapped (an address-space limit?); its allocations go to the driver unpooled"),
        Fallback::Reservation { device, code, classic: true } => crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: cuMemAddressReserve refused an address range on device {device} (error {code}); its pool uses classic segments"),
        Fallback::Reservation { device, code, classic: false } => crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: cuMemAddressReserve refused another address range on device {device} (error {code}); requests that need one go to the driver unpooled"),
        Fallback::RangesFull { device } => crate::warn_line!("TENSORMALLOC_CUDA_SEGMENTS=expandable: the pool of device {device} holds as many address ranges as it tracks; requests that need another go to the driver unpooled"),
        Fallback::TablesFull { device } => crate::warn_line!("the device pool's tables for device {device} are full; requests they cannot record go to the driver unpooled"),
        Fallback::OtherContext { device } => crate::warn_line!("a CUDA context other than the one the pool of device {device} lives in is current; its allocations go to the driver unpooled (said once)"),
        Fallback::PercentCap { device } => crate::warn_line!("TENSORMALLOC_CUDA_LIMIT in percent: the driver did not say the size of device {device}; its allocations go to the driver unpooled"),
        Fallback::DeviceOrdinal { device } => crate::warn_line!("device {device} is past the {} devices the pool tracks; its allocations go to the driver unpooled", crate::backing::MAX_DEVICES),
        Fallback::PinnedTables => crate::warn_line!("the pinned cache's tables could not be mapped (an address-space limit?); cudaHostAlloc goes to the driver uncached"),
        Fallback::CaptureOverlap => crate::warn_line!("a CUDA graph capture began while the pool's own driver call was still under way after 2 s (a synchronization waiting on long work): that capture may be invalidated"),
    }
}

/// Whether `f`'s kind was said in this process (tests).
#[cfg(test)]
pub fn said(f: Fallback) -> bool {
    SAID.get(f.kind()).is_some_and(|s| s.load(Relaxed))
}
