//! Where memory comes from: the traits the policy code is generic over. `sys::os_pages` and
//! `sys::cuda_runtime` implement them for real; `sim` implements them with fake addresses for
//! tests and replay benchmarks. Implementations must never allocate through the malloc family
//! (they run on the malloc/free paths) and must not take locks the caller might hold.

/// Anonymous page memory (mmap and friends). Addresses are plain integers so a simulation can
/// hand out addresses that are never dereferenced.
pub trait PageMemory {
    /// A fresh zero-filled private mapping of `len` bytes starting at a multiple of `align`
    /// (a power of two, at least the page size); `None` when the system refuses.
    fn map(&self, len: usize, align: usize) -> Option<usize>;
    /// Gives `[addr, addr+len)` back; it may be any page-aligned part of earlier mappings.
    fn unmap(&self, addr: usize, len: usize);
    /// Lets the kernel reclaim the pages when it needs to (MADV_FREE; MADV_DONTNEED where the
    /// kernel lacks it). Contents become unspecified; the range stays mapped.
    fn release(&self, addr: usize, len: usize);
    /// Resizes a mapping, moving it if needed; `None` leaves the old mapping as it was.
    fn remap(&self, addr: usize, old_len: usize, new_len: usize) -> Option<usize>;
    /// Asks for transparent huge pages on the range.
    fn advise_huge(&self, addr: usize, len: usize);
    /// Writes zeros over the range.
    fn zero(&self, addr: usize, len: usize);
    /// Copies `len` bytes between non-overlapping ranges.
    fn copy(&self, dst: usize, src: usize, len: usize);
}

/// The result of a device allocation call, in the CUDA runtime's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// cudaErrorMemoryAllocation: the device has no room.
    OutOfMemory,
    /// Any other runtime error code, passed through unchanged.
    Other(i32),
}

/// One device's memory as the runtime hands it out (cudaMalloc/cudaFree on the current device).
pub trait DeviceMemory {
    fn alloc(&mut self, len: usize) -> Result<usize, DeviceError>;
    /// Frees a block `alloc` returned. Like cudaFree, this waits for the device to be idle.
    fn free(&mut self, addr: usize) -> Result<(), DeviceError>;
    /// Waits until all work issued so far on the device has finished.
    fn synchronize(&mut self) -> Result<(), DeviceError>;
}
