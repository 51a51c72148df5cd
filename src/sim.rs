//! Simulated backing memory for tests and replay benchmarks: fake addresses that are never
//! dereferenced, exact bookkeeping of what is mapped, which bytes may hold data (so a test
//! catches a block handed to calloc that does not read zero) and which pages are resident,
//! checks that every operation stays inside memory it owns, and injected failures. This is a
//! simulator, not a model of a real kernel's or device's speed. Built only for tests and the
//! no-interpose harnesses: a broken invariant here should stop the test loudly, so the
//! allocation paths' lints do not apply.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

use crate::backing::{DeviceError, DeviceRuntime, PageMemory, PrimaryContext};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// How many rounds a property test runs: `native` normally, `miri` under Miri, which checks
/// every memory access and runs about a thousand times slower.
pub const fn rounds(native: usize, miri: usize) -> usize {
    if cfg!(miri) {
        miri
    } else {
        native
    }
}

/// A `TableSource` for tests: zeroed, 8-byte aligned (the tables hold u64s) and never freed,
/// as the real source's mappings are.
pub fn leak_table(len: usize) -> Option<usize> {
    Some(Box::leak(vec![0u64; len.div_ceil(8)].into_boxed_slice()).as_mut_ptr() as usize)
}

#[derive(Default, Debug, Clone)]
pub struct PageCalls {
    pub maps: u64,
    pub unmaps: u64,
    pub releases: u64,
    pub remaps: u64,
    pub zeroed_bytes: u64,
    pub discarded_bytes: u64,
    pub copied_bytes: u64,
}

#[derive(Default)]
struct PageState {
    /// start -> length of each mapped range (ranges never overlap).
    mapped: BTreeMap<usize, usize>,
    /// Ranges that may hold something other than zeros (written by the program, or copied).
    dirty: BTreeMap<usize, usize>,
    /// Ranges whose pages are resident (written, or zeroed by a write).
    resident: BTreeMap<usize, usize>,
    fail_discard: bool,
    release_discards: bool,
    next_addr: usize,
    fail_next_maps: u64,
    calls: PageCalls,
}

/// Simulated anonymous memory starting at a high fake address.
pub struct SimPages {
    state: Mutex<PageState>,
}

impl Default for SimPages {
    fn default() -> Self {
        Self::new()
    }
}

impl SimPages {
    pub fn new() -> Self {
        SimPages { state: Mutex::new(PageState { next_addr: 0x5000_0000_0000, ..Default::default() }) }
    }

    /// The next `n` calls to `map` fail, as mmap does under ENOMEM.
    pub fn fail_next_maps(&self, n: u64) {
        self.state.lock().unwrap().fail_next_maps = n;
    }

    /// The program writes to `[addr, addr+len)`: it may no longer read zero, and is resident.
    pub fn write(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "write to unmapped memory {addr:#x}+{len}");
        Self::add_range(&mut st.dirty, addr, len);
        Self::add_range(&mut st.resident, addr, len);
    }

    /// True when every byte of the range reads zero.
    pub fn reads_zero(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        !Self::overlaps(&st.dirty, addr, len)
    }

    /// `release` drops pages from now on (a kernel without MADV_FREE).
    pub fn release_discards(&self) {
        self.state.lock().unwrap().release_discards = true;
    }

    /// `discard` fails from now on (a kernel that refuses madvise).
    pub fn fail_discards(&self) {
        self.state.lock().unwrap().fail_discard = true;
    }

    pub fn mapped_bytes(&self) -> usize {
        self.state.lock().unwrap().mapped.values().sum()
    }

    pub fn calls(&self) -> PageCalls {
        self.state.lock().unwrap().calls.clone()
    }

    /// True when `[addr, addr+len)` is entirely mapped.
    pub fn is_mapped(&self, addr: usize, len: usize) -> bool {
        let st = self.state.lock().unwrap();
        Self::covered(&st.mapped, addr, len)
    }

    fn covered(mapped: &BTreeMap<usize, usize>, addr: usize, len: usize) -> bool {
        let mut at = addr;
        let end = addr + len;
        while at < end {
            match mapped.range(..=at).next_back() {
                Some((&s, &l)) if s + l > at => at = s + l,
                _ => return false,
            }
        }
        true
    }

    fn overlaps(ranges: &BTreeMap<usize, usize>, addr: usize, len: usize) -> bool {
        ranges.range(..addr + len).any(|(&s, &l)| s + l > addr)
    }

    fn add_range(ranges: &mut BTreeMap<usize, usize>, addr: usize, len: usize) {
        Self::remove_range(ranges, addr, len);
        ranges.insert(addr, len);
    }

    /// Moves what `ranges` records over `[from, from+len)` to start at `to`.
    fn move_range(ranges: &mut BTreeMap<usize, usize>, from: usize, len: usize, to: usize) {
        let end = from + len;
        let inside: Vec<(usize, usize)> = ranges.range(..end).filter(|(&s, &l)| s + l > from).map(|(&s, &l)| (s.max(from), (s + l).min(end))).collect();
        Self::remove_range(ranges, from, len);
        for (s, e) in inside {
            Self::add_range(ranges, s - from + to, e - s);
        }
    }

    fn remove_range(mapped: &mut BTreeMap<usize, usize>, addr: usize, len: usize) {
        let end = addr + len;
        let touching: Vec<(usize, usize)> = mapped.range(..end).filter(|(&s, &l)| s + l > addr).map(|(&s, &l)| (s, l)).collect();
        for (s, l) in touching {
            mapped.remove(&s);
            if s < addr {
                mapped.insert(s, addr - s);
            }
            if s + l > end {
                mapped.insert(end, s + l - end);
            }
        }
    }
}

impl PageMemory for SimPages {
    fn map(&self, len: usize, align: usize) -> Option<usize> {
        let mut st = self.state.lock().unwrap();
        if st.fail_next_maps > 0 {
            st.fail_next_maps -= 1;
            return None;
        }
        assert!(len > 0 && len.is_multiple_of(4096), "map of {len} bytes");
        let align = align.max(4096);
        let addr = (st.next_addr + align - 1) & !(align - 1);
        st.next_addr = addr + len + 4096; // a guard gap: adjacent blocks never merge by accident
        st.mapped.insert(addr, len);
        st.calls.maps += 1;
        Some(addr)
    }

    fn unmap(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "unmap of unmapped memory {addr:#x}+{len}");
        Self::remove_range(&mut st.mapped, addr, len);
        Self::remove_range(&mut st.dirty, addr, len);
        Self::remove_range(&mut st.resident, addr, len);
        st.calls.unmaps += 1;
    }

    /// MADV_FREE: contents kept until the kernel takes the pages, so the range may still hold
    /// data; with `release_discards`, MADV_DONTNEED (a kernel without MADV_FREE): zero.
    fn release(&self, addr: usize, len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "release of unmapped memory {addr:#x}+{len}");
        st.calls.releases += 1;
        if st.release_discards {
            Self::remove_range(&mut st.dirty, addr, len);
            Self::remove_range(&mut st.resident, addr, len);
        }
        st.release_discards
    }

    /// Succeeds when nothing is mapped after the block up to its new end: with the guard gap
    /// `map` leaves, that is the newest mapping, or one whose neighbour has been unmapped.
    fn extend(&self, addr: usize, old_len: usize, new_len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, old_len), "extend of unmapped memory");
        let (tail, end) = (addr + old_len, addr + new_len);
        if st.fail_next_maps > 0 || st.mapped.range(..end).any(|(&s, &l)| s + l > tail) {
            return false;
        }
        st.mapped.insert(tail, new_len - old_len);
        st.next_addr = st.next_addr.max(end + 4096);
        st.calls.remaps += 1;
        true
    }

    fn grow_into(&self, addr: usize, old_len: usize, new_len: usize, align: usize) -> Option<usize> {
        assert!(self.is_mapped(addr, old_len), "grow of unmapped memory");
        let fresh = self.map(new_len, align)?;
        let mut st = self.state.lock().unwrap();
        Self::remove_range(&mut st.mapped, addr, old_len);
        Self::move_range(&mut st.dirty, addr, old_len, fresh);
        Self::move_range(&mut st.resident, addr, old_len, fresh);
        st.calls.maps -= 1;
        st.calls.remaps += 1;
        Some(fresh)
    }

    fn advise_huge(&self, addr: usize, len: usize) {
        assert!(self.is_mapped(addr, len));
    }

    fn zero(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "zero of unmapped memory");
        Self::remove_range(&mut st.dirty, addr, len);
        Self::add_range(&mut st.resident, addr, len);
        st.calls.zeroed_bytes += len as u64;
    }

    fn discard(&self, addr: usize, len: usize) -> bool {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "discard of unmapped memory");
        if st.fail_discard {
            return false;
        }
        Self::remove_range(&mut st.dirty, addr, len);
        Self::remove_range(&mut st.resident, addr, len);
        st.calls.discarded_bytes += len as u64;
        true
    }

    fn resident_probes(&self, addr: usize, len: usize, probes: usize) -> Option<usize> {
        let st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "probe of unmapped memory");
        let step = (len / probes.max(1)) & !4095;
        Some((0..probes).filter(|i| Self::overlaps(&st.resident, addr + i * step + ((step / 2) & !4095), 1)).count())
    }

    fn copy(&self, dst: usize, src: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, dst, len) && Self::covered(&st.mapped, src, len), "copy outside mappings");
        Self::add_range(&mut st.dirty, dst, len);
        Self::add_range(&mut st.resident, dst, len);
        st.calls.copied_bytes += len as u64;
    }
}

/// Simulated CUDA devices behind the runtime calls: fixed capacities, fake device addresses,
/// injected failures, and counts of the calls the layer makes (allocations, frees, syncs).
pub struct SimRuntime {
    state: Mutex<RuntimeState>,
}

#[derive(Default, Debug, Clone)]
pub struct SimDeviceState {
    pub capacity: usize,
    pub used: usize,
    pub mallocs: u64,
    pub frees: u64,
    pub syncs: u64,
}

#[derive(Default)]
struct RuntimeState {
    devices: Vec<SimDeviceState>,
    live: BTreeMap<usize, (usize, usize, u64)>, // addr -> (device, len, context)
    /// A user context made current (cuCtxCreate); `None`: the device's primary context.
    user_context: Option<u64>,
    /// Devices whose primary context has been created (by an allocation).
    primary_active: Vec<bool>,
    /// What `enter_device` replaced, for `leave_device`.
    entered: Vec<(i32, Option<u64>)>,
    pinned: BTreeMap<usize, usize>,
    current: i32,
    next_addr: usize,
    fail_next_mallocs: u64,
    last_error: i32,
    pub host_allocs: u64,
}

impl SimRuntime {
    pub fn new(capacities: &[usize]) -> Self {
        let devices = capacities.iter().map(|&capacity| SimDeviceState { capacity, ..Default::default() }).collect();
        let primary_active = vec![false; capacities.len()];
        SimRuntime { state: Mutex::new(RuntimeState { devices, primary_active, next_addr: 0x7f00_0000_0000, ..Default::default() }) }
    }
    pub fn device(&self, d: usize) -> SimDeviceState {
        self.state.lock().unwrap().devices[d].clone()
    }
    pub fn fail_next_mallocs(&self, n: u64) {
        self.state.lock().unwrap().fail_next_mallocs = n;
    }
    pub fn last_error(&self) -> i32 {
        self.state.lock().unwrap().last_error
    }
    pub fn host_allocs(&self) -> u64 {
        self.state.lock().unwrap().host_allocs
    }
    pub fn pinned_bytes(&self) -> usize {
        self.state.lock().unwrap().pinned.values().sum()
    }
    /// cudaSetDevice, for tests.
    pub fn set_device(&self, device: i32) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        if device < 0 || device as usize >= st.devices.len() {
            return Err(DeviceError::Other(101));
        }
        st.current = device;
        Ok(())
    }
    /// Makes a user context current (`Some`) or goes back to the primary ones (`None`).
    pub fn set_context(&self, ctx: Option<u64>) {
        self.state.lock().unwrap().user_context = ctx;
    }
    /// The primary context handle of `device` (stable across resets, as a pool must not rely on
    /// a new handle to notice one).
    pub fn primary_handle(device: usize) -> u64 {
        0x1000 + device as u64
    }
    /// What the runtime does at a reset or destroy: every allocation of `ctx` is gone.
    pub fn destroy_context(&self, ctx: u64) {
        let mut st = self.state.lock().unwrap();
        let dead: Vec<usize> = st.live.iter().filter(|(_, v)| v.2 == ctx).map(|(a, _)| *a).collect();
        for a in dead {
            let (d, len, _) = st.live.remove(&a).unwrap();
            st.devices[d].used -= len;
        }
        if ctx >= 0x1000 && ctx < 0x1000 + st.devices.len() as u64 {
            let d = (ctx - 0x1000) as usize;
            st.primary_active[d] = false;
        }
    }
    /// Whether `addr` is inside a live allocation (a "kernel" could touch it).
    pub fn is_live(&self, addr: usize) -> bool {
        self.allocation_range(addr).is_some()
    }
    fn context_in(st: &RuntimeState) -> u64 {
        st.user_context.unwrap_or(Self::primary_handle(st.current as usize))
    }
}

impl DeviceRuntime for SimRuntime {
    fn current_device(&self) -> Result<i32, DeviceError> {
        Ok(self.state.lock().unwrap().current)
    }
    fn enter_device(&self, device: i32, ctx: u64) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        if device < 0 || device as usize >= st.devices.len() {
            return Err(DeviceError::Other(101)); // CUDA_ERROR_INVALID_DEVICE
        }
        let saved = (st.current, st.user_context);
        st.entered.push(saved);
        st.current = device;
        st.user_context = (ctx != 0 && ctx != Self::primary_handle(device as usize)).then_some(ctx);
        Ok(())
    }
    fn leave_device(&self) {
        let mut st = self.state.lock().unwrap();
        let (device, ctx) = st.entered.pop().expect("leave_device without enter_device");
        st.current = device;
        st.user_context = ctx;
    }
    fn malloc(&self, len: usize) -> Result<usize, DeviceError> {
        let mut st = self.state.lock().unwrap();
        let d = st.current as usize;
        let footprint = (len.max(1) + 0xfffff) & !0xfffff;
        if st.fail_next_mallocs > 0 || st.devices[d].used + footprint > st.devices[d].capacity {
            st.fail_next_mallocs = st.fail_next_mallocs.saturating_sub(1);
            st.last_error = 2;
            return Err(DeviceError::OutOfMemory);
        }
        let addr = st.next_addr;
        st.next_addr += footprint + (2 << 20);
        st.devices[d].used += footprint;
        st.devices[d].mallocs += 1;
        let ctx = Self::context_in(&st);
        if st.user_context.is_none() {
            st.primary_active[d] = true;
        }
        st.live.insert(addr, (d, footprint, ctx));
        Ok(addr)
    }
    fn free(&self, addr: usize) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        let Some((d, len, _)) = st.live.remove(&addr) else {
            st.last_error = 1;
            return Err(DeviceError::Other(1));
        };
        st.devices[d].used -= len;
        st.devices[d].frees += 1;
        st.devices[d].syncs += 1;
        Ok(())
    }
    fn synchronize(&self) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        let d = st.current as usize;
        st.devices[d].syncs += 1;
        Ok(())
    }
    fn mem_info(&self) -> Result<(usize, usize), DeviceError> {
        let st = self.state.lock().unwrap();
        let dev = &st.devices[st.current as usize];
        Ok((dev.capacity - dev.used, dev.capacity))
    }
    fn host_alloc(&self, len: usize, _flags: u32) -> Result<usize, DeviceError> {
        let mut st = self.state.lock().unwrap();
        let addr = st.next_addr;
        st.next_addr += len + (2 << 20);
        st.pinned.insert(addr, len);
        st.host_allocs += 1;
        Ok(addr)
    }
    fn host_free(&self, addr: usize) -> Result<(), DeviceError> {
        let mut st = self.state.lock().unwrap();
        st.pinned.remove(&addr).map(|_| ()).ok_or(DeviceError::Other(1))
    }
    fn clear_last_error(&self) {
        self.state.lock().unwrap().last_error = 0;
    }
    fn current_context(&self) -> u64 {
        let st = self.state.lock().unwrap();
        if st.user_context.is_none() && !st.primary_active[st.current as usize] {
            return 0; // no context until the runtime first needs one
        }
        Self::context_in(&st)
    }
    fn primary_context(&self, device: i32) -> PrimaryContext {
        let st = self.state.lock().unwrap();
        match st.primary_active.get(device as usize) {
            Some(true) => PrimaryContext::Active(Self::primary_handle(device as usize)),
            Some(false) => PrimaryContext::Inactive,
            None => PrimaryContext::Unknown,
        }
    }
    fn allocation_range(&self, addr: usize) -> Option<(usize, usize)> {
        let st = self.state.lock().unwrap();
        let (&base, &(_, len, _)) = st.live.range(..=addr).next_back()?;
        (addr < base + len).then_some((base, len))
    }
}
