//! Simulated backing memory for tests and replay benchmarks: fake addresses that are never
//! dereferenced, exact bookkeeping of what is mapped, checks that every operation stays inside
//! memory it owns, and injected failures. This is a simulator, not a model of a real kernel's
//! or device's speed.

use crate::backing::{DeviceError, DeviceMemory, PageMemory};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Default, Debug, Clone)]
pub struct PageCalls {
    pub maps: u64,
    pub unmaps: u64,
    pub releases: u64,
    pub remaps: u64,
    pub zeroed_bytes: u64,
    pub copied_bytes: u64,
}

#[derive(Default)]
struct PageState {
    /// start -> length of each mapped range (ranges never overlap).
    mapped: BTreeMap<usize, usize>,
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
        assert!(len > 0 && len % 4096 == 0, "map of {len} bytes");
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
        st.calls.unmaps += 1;
    }

    fn release(&self, addr: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, addr, len), "release of unmapped memory {addr:#x}+{len}");
        st.calls.releases += 1;
    }

    fn remap(&self, addr: usize, old_len: usize, new_len: usize) -> Option<usize> {
        {
            let st = self.state.lock().unwrap();
            assert!(Self::covered(&st.mapped, addr, old_len), "remap of unmapped memory");
            if st.fail_next_maps > 0 {
                drop(st);
                self.state.lock().unwrap().fail_next_maps -= 1;
                return None;
            }
        }
        let fresh = self.map(new_len, 4096)?;
        let mut st = self.state.lock().unwrap();
        Self::remove_range(&mut st.mapped, addr, old_len);
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
        st.calls.zeroed_bytes += len as u64;
    }

    fn copy(&self, dst: usize, src: usize, len: usize) {
        let mut st = self.state.lock().unwrap();
        assert!(Self::covered(&st.mapped, dst, len) && Self::covered(&st.mapped, src, len), "copy outside mappings");
        st.calls.copied_bytes += len as u64;
    }
}

/// A simulated GPU: a fixed capacity, fake device addresses, injected failures, and a count of
/// the synchronizing calls the pool makes.
pub struct SimDevice {
    pub capacity: usize,
    pub used: usize,
    live: BTreeMap<usize, usize>,
    next_addr: usize,
    pub fail_next_allocs: u64,
    pub allocs: u64,
    pub frees: u64,
    pub syncs: u64,
}

impl SimDevice {
    pub fn new(capacity: usize, base: usize) -> Self {
        SimDevice { capacity, used: 0, live: BTreeMap::new(), next_addr: base, fail_next_allocs: 0, allocs: 0, frees: 0, syncs: 0 }
    }
    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }
}

impl DeviceMemory for SimDevice {
    fn alloc(&mut self, len: usize) -> Result<usize, DeviceError> {
        if self.fail_next_allocs > 0 {
            self.fail_next_allocs -= 1;
            return Err(DeviceError::OutOfMemory);
        }
        // The runtime rounds to 2 MiB pages for large blocks; model its footprint coarsely.
        let footprint = (len.max(1) + 511) & !511;
        if self.used + footprint > self.capacity {
            return Err(DeviceError::OutOfMemory);
        }
        let addr = self.next_addr;
        self.next_addr += (footprint + 0xffff) & !0xffff;
        self.used += footprint;
        self.live.insert(addr, footprint);
        self.allocs += 1;
        Ok(addr)
    }

    fn free(&mut self, addr: usize) -> Result<(), DeviceError> {
        let len = self.live.remove(&addr).ok_or(DeviceError::Other(1))?; // cudaErrorInvalidValue
        self.used -= len;
        self.frees += 1;
        self.syncs += 1;
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.syncs += 1;
        Ok(())
    }
}
