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
    /// kernel lacks it). Contents become unspecified; the range stays mapped. True when the
    /// range now reads zero (MADV_DONTNEED was used).
    fn release(&self, addr: usize, len: usize) -> bool;
    /// Grows a mapping in place when the addresses after it are free; false leaves it as it was.
    fn extend(&self, addr: usize, old_len: usize, new_len: usize) -> bool;
    /// Moves the pages of `[addr, addr+old_len)` to the start of a fresh mapping of `new_len`
    /// bytes aligned to `align`, so a grown block keeps the pages it had (no faults for them).
    /// `None` leaves the old mapping as it was.
    fn grow_into(&self, addr: usize, old_len: usize, new_len: usize, align: usize) -> Option<usize>;
    /// Asks for transparent huge pages on the range.
    fn advise_huge(&self, addr: usize, len: usize);
    /// Writes zeros over the range.
    fn zero(&self, addr: usize, len: usize);
    /// Drops the range's pages (MADV_DONTNEED): it then reads zero, and each page touched
    /// faults in a fresh zero page. Costs about what is resident. False: nothing was done.
    fn discard(&self, addr: usize, len: usize) -> bool;
    /// Of `probes` pages spread evenly over the range, how many are resident (mincore);
    /// `None` when the system will not say.
    fn resident_probes(&self, addr: usize, len: usize, probes: usize) -> Option<usize>;
    /// Copies `len` bytes between non-overlapping ranges.
    fn copy(&self, dst: usize, src: usize, len: usize);
}

/// A CUDA runtime error, in the runtime's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// cudaErrorMemoryAllocation from the runtime: the device has no room.
    OutOfMemory,
    /// cudaErrorMemoryAllocation from our cap (TENSORMALLOC_CUDA_LIMIT); the runtime was not asked.
    CapReached,
    /// Any other runtime error code, passed through unchanged.
    Other(i32),
}

pub const CUDA_SUCCESS: i32 = 0;
pub const CUDA_ERROR_INVALID_VALUE: i32 = 1;
pub const CUDA_ERROR_MEMORY_ALLOCATION: i32 = 2;
pub const CUDA_ERROR_INITIALIZATION: i32 = 3;

impl DeviceError {
    pub fn code(self) -> i32 {
        match self {
            DeviceError::OutOfMemory | DeviceError::CapReached => CUDA_ERROR_MEMORY_ALLOCATION,
            DeviceError::Other(c) => c,
        }
    }
    pub fn from_code(code: i32) -> Result<(), DeviceError> {
        match code {
            CUDA_SUCCESS => Ok(()),
            CUDA_ERROR_MEMORY_ALLOCATION => Err(DeviceError::OutOfMemory),
            c => Err(DeviceError::Other(c)),
        }
    }
}

/// The CUDA runtime calls the device layer makes, all on the calling thread's current device
/// unless a device is named. `sys::cuda` binds the program's own runtime; `sim::SimRuntime`
/// simulates one or more devices for tests.
pub trait DeviceRuntime {
    fn current_device(&self) -> Result<i32, DeviceError>;
    fn set_device(&self, device: i32) -> Result<(), DeviceError>;
    /// cudaMalloc on the current device.
    fn malloc(&self, len: usize) -> Result<usize, DeviceError>;
    /// cudaFree: waits for the device to be idle, then frees.
    fn free(&self, addr: usize) -> Result<(), DeviceError>;
    /// cudaDeviceSynchronize on the current device.
    fn synchronize(&self) -> Result<(), DeviceError>;
    /// cudaMemGetInfo on the current device: (free, total) bytes.
    fn mem_info(&self) -> Result<(usize, usize), DeviceError>;
    /// cudaHostAlloc (pinned host memory) with the runtime's flags.
    fn host_alloc(&self, len: usize, flags: u32) -> Result<usize, DeviceError>;
    fn host_free(&self, addr: usize) -> Result<(), DeviceError>;
    /// Clears the runtime's last error (after a failure we recovered from).
    fn clear_last_error(&self);
}
