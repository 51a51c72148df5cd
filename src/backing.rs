//! Where memory comes from: the traits the policy code is generic over. `sys::os_pages` and
//! `sys::cuda_driver` implement them for real; `sim` implements them with fake addresses for
//! tests and replay benchmarks. Implementations must never allocate through the malloc family
//! (they run on the malloc/free paths) and must not take locks the caller might hold.

/// Supplies zeroed memory for the host registry's and the device layer's fixed tables: never
/// freed, never through the malloc family (`sys::os_pages::map_table`; `sim::leak_table`).
pub type TableSource = fn(usize) -> Option<usize>;

/// Every block the library hands out itself (the host layer's and the bootstrap arena's) starts
/// on a multiple of this, so free's fast path tells the next allocator's pointers from ours by
/// their low bits alone. Larger than a page because jemalloc, tcmalloc and mimalloc put objects
/// of 4 KiB and more on page boundaries: with a page, a fifth of their frees in a mixed-size
/// churn took the slow path, on a branch no predictor can learn (BENCHMARKS.md, "The small path").
pub const BLOCK_ALIGN: usize = 64 << 10;

/// The page size the library assumes (x86-64's; the one every length and alignment of ours
/// is a multiple of).
pub const PAGE: usize = 4096;

/// The pages `PageMemory::sampled_written` reads of [addr, addr+len): at most WRITTEN_SAMPLES,
/// spread evenly from the first (offsets from addr, each a whole page inside the range).
pub fn written_sample(len: usize) -> impl Iterator<Item = usize> {
    let pages = len / PAGE;
    let n = pages.min(WRITTEN_SAMPLES);
    (0..n).map(move |k| k * pages / n * PAGE)
}

/// How many pages `written_sample` picks at most.
pub const WRITTEN_SAMPLES: usize = 64;

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
    /// Moves the pages of `[from, from+len)` to `[to, to+len)`, a range of a mapping of ours
    /// whose contents it replaces (mremap with MREMAP_FIXED): no copy, no fault. The source
    /// range is unmapped after. See `Moved` for a refusal.
    fn move_pages(&self, from: usize, len: usize, to: usize) -> Moved;
    /// Moves the pages of `[addr, addr+old_len)` to the start of a fresh mapping of `new_len`
    /// bytes aligned to `align`, so a grown block keeps the pages it had (no faults for them).
    /// `None` leaves the old mapping as it was.
    fn grow_into(&self, addr: usize, old_len: usize, new_len: usize, align: usize) -> Option<usize> {
        let fresh = self.map(new_len, align)?;
        match self.move_pages(addr, old_len, fresh) {
            Moved::Done => return Some(fresh),
            Moved::Refused => self.unmap(fresh, new_len),
            // Only what is still ours goes back.
            Moved::DestinationLost => self.unmap(fresh + old_len, new_len - old_len),
        }
        None
    }
    /// Grows the one mapping `[addr, addr+old_len)` to `new_len` bytes wherever the kernel finds
    /// room, aligned to `align` (mremap MREMAP_MAYMOVE, then the contents moved up to the
    /// alignment if the kernel's place is off it): under a limit on address space it needs room
    /// for the new length (and `align`), where `grow_into` needs the old and the new (Note [Growing
    /// under a limit] in host/host_layer/resize.rs). `None` leaves the old mapping as it was.
    fn grow_anywhere(&self, addr: usize, old_len: usize, new_len: usize, align: usize) -> Option<usize>;
    /// Makes a range whose pages the program changed plain memory again: read-write, unlocked,
    /// no guard regions, default dump and fork advice (Note [Plain memory] in
    /// host/host_layer/mod.rs); `keyed`: the program tagged part of it with a protection key, which
    /// goes back to the default one. False: it cannot be (part of it is no longer mapped, or it
    /// is sealed): it must never be handed out again.
    fn reset_for_cache(&self, addr: usize, len: usize, keyed: bool) -> bool;
    /// Replaces the range's pages with fresh zero ones in a new mapping at the same place
    /// (mmap MAP_FIXED): every attribute the program set on it goes with its contents, huge-page
    /// advice included, which no madvise can take back to "none" (Note [Huge-page advice] in
    /// host/host_layer/mod.rs). False: the kernel refused (a sealed range); nothing changed.
    fn renew(&self, addr: usize, len: usize) -> bool;
    /// Locks the range in memory as a fresh mapping under mlockall(MCL_FUTURE) would be
    /// (`on_fault`: MCL_ONFAULT, pages locked as they are touched). False: refused.
    fn lock(&self, addr: usize, len: usize, on_fault: bool) -> bool;
    /// Unlocks the range (munlock).
    fn unlock(&self, addr: usize, len: usize);
    /// Whether the kernel locks every new mapping now (the program called mlockall with
    /// MCL_FUTURE): `Some(on_fault)`, `on_fault` for MCL_ONFAULT; `None` otherwise.
    fn future_locking(&self) -> Option<bool>;
    /// Leaves a cached range out of the child of a fork about to happen (MADV_DONTFORK). False:
    /// the kernel refused; the child then inherits it unrecorded.
    fn keep_from_fork(&self, addr: usize, len: usize) -> bool;
    /// A range kept from forked children is inherited by them again. False: the kernel refused
    /// (its limit on mappings): the range must not be handed out.
    fn readmit(&self, addr: usize, len: usize) -> bool;
    /// Whether a mapping of `len` bytes the system refused could succeed once some of ours are
    /// unmapped (it fits the address-space and commit limits). If not, emptying the cache for
    /// it would lose the cache and gain nothing.
    fn could_map(&self, len: usize) -> bool;
    /// Whether the process's memory nears its cgroup's or the system's limit: idle pages should
    /// leave RSS at once rather than lazily (Note [What RSS shows] in host/host_layer/release.rs).
    fn near_limit(&self) -> bool;
    /// The process these mappings belong to: a forked child's differs from its parent's
    /// (Note [Fork handlers that allocate] in host/host_layer/fork.rs).
    fn process_id(&self) -> u32;
    /// Before the cache lock is taken: a child our fork handlers did not see adopts what the
    /// parent left first (Note [Children our handlers did not see] in sys/fork_mark.rs). One
    /// load when there is nothing to do.
    fn adopt_unseen_fork(&self) {}
    /// Asks for transparent huge pages on the range.
    fn advise_huge(&self, addr: usize, len: usize);
    /// Writes zeros over the range.
    fn zero(&self, addr: usize, len: usize);
    /// As `zero`, and says whether most of the range was resident before, from what writing
    /// it cost (a page not resident faults in as it is written). Note [calloc costs what is
    /// touched] in host/host_layer/alloc.rs.
    fn zero_weighed(&self, addr: usize, len: usize) -> bool;
    /// Whether at least half of the pages `written_sample` picks from the range hold a byte
    /// that is not zero: whether the program wrote over most of a block we had zeroed (Note
    /// [calloc costs what is touched] in host/host_layer/alloc.rs). Reads only.
    fn sampled_written(&self, addr: usize, len: usize) -> bool;
    /// Drops the range's pages (MADV_DONTNEED): it then reads zero, and each page touched
    /// faults in a fresh zero page. Costs about what is resident. False: nothing was done.
    fn discard(&self, addr: usize, len: usize) -> bool;
    /// As `discard`, and says whether most of the range was resident before: `Some(true)` or
    /// `Some(false)`, from what dropping the pages cost (Note [calloc costs what is touched] in
    /// host/host_layer/alloc.rs); `None`: nothing was done.
    fn discard_weighed(&self, addr: usize, len: usize) -> Option<bool>;
    /// How much of the range is mapped in this process (a forked child's check of the blocks it
    /// may not have inherited).
    fn presence(&self, addr: usize, len: usize) -> Presence;
    /// Copies `len` bytes between non-overlapping ranges.
    fn copy(&self, dst: usize, src: usize, len: usize);
}

/// How much of a range is mapped (`PageMemory::presence`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    All,
    /// Its first page is, not all the rest: `mapped` bytes from its start are (whole pages).
    Part { mapped: usize },
    /// Its first page is not.
    None,
}

/// How a `move_pages` went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moved {
    Done,
    /// Nothing moved (kernels before 6.17 refuse a source spanning two mappings); both ranges
    /// are mapped and ours as before.
    Refused,
    /// Nothing moved, and the destination range may no longer be ours: the kernel unmapped it
    /// before refusing and it could not be mapped back (another thread's mapping may stand
    /// there now). The caller never touches it again; the source is as it was.
    DestinationLost,
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
/// CUDA_ERROR_NOT_FOUND (driver): no allocation at that address.
pub const CUDA_ERROR_NOT_FOUND: i32 = 500;
/// No current context (the driver's frees need one).
pub const CUDA_ERROR_INVALID_CONTEXT: i32 = 201;

/// The primary context of a device, as the driver knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrimaryContext {
    Active(u64),
    Inactive,
    /// No driver to ask.
    Unknown,
}

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

/// cuThreadExchangeStreamCaptureMode's relaxed mode (CU_STREAM_CAPTURE_MODE_RELAXED).
pub const RELAXED_CAPTURE: i32 = 2;

/// The CUDA calls the device layer makes, all on the calling thread's current context unless a
/// device is entered. `sys::cuda_backing::CudaDriver` makes them through the program's own driver
/// (libcuda.so.1), whatever runtime (shared, static, none) the program uses; `sim::SimRuntime`
/// simulates one or more devices for tests. Error codes are the driver's, which the runtime
/// shares for every code the pool returns (1, 2, 3, 201, 700, 709).
pub trait DeviceRuntime {
    fn current_device(&self) -> Result<i32, DeviceError>;
    /// Makes `device` current on this thread until the matching `leave_device`: the context
    /// `ctx` when non-zero (the one the pool's segments live in), else the device's primary one.
    fn enter_device(&self, device: i32, ctx: u64) -> Result<(), DeviceError>;
    /// Makes context `ctx` current on this thread until the matching `leave_device` (a pinned
    /// block's, freed by a thread with none current).
    fn enter_context(&self, ctx: u64) -> Result<(), DeviceError>;
    /// Restores what was current before the matching `enter_device` or `enter_context`.
    fn leave_device(&self);
    /// cuMemAlloc in the current context.
    fn malloc(&self, len: usize) -> Result<usize, DeviceError>;
    /// cuMemFree: waits for the device to be idle, then frees.
    fn free(&self, addr: usize) -> Result<(), DeviceError>;
    /// cuCtxSynchronize of the current context.
    fn synchronize(&self) -> Result<(), DeviceError>;
    /// cuThreadExchangeStreamCaptureMode: sets the calling thread's capture mode (RELAXED_CAPTURE
    /// and the others); its old one (None: no such call, nothing changed).
    fn exchange_capture_mode(&self, _mode: i32) -> Option<i32> {
        None
    }
    /// cuMemGetInfo for the current context's device: (free, total) bytes.
    fn mem_info(&self) -> Result<(usize, usize), DeviceError>;
    /// cuMemHostAlloc (pinned host memory) with its flags (the runtime's cudaHostAlloc flags
    /// have the same values).
    fn host_alloc(&self, len: usize, flags: u32) -> Result<usize, DeviceError>;
    fn host_free(&self, addr: usize) -> Result<(), DeviceError>;
    /// Clears the runtime's last error (after a failure we recovered from).
    fn clear_last_error(&self);
    /// The CUDA context current on this thread (a driver handle); 0 when none or when the
    /// driver cannot be reached.
    fn current_context(&self) -> u64;
    /// The primary context of `device`, without creating or retaining it for good.
    fn primary_context(&self, device: i32) -> PrimaryContext;
    /// `device`'s primary context was reset: a reference `enter_device` retained to enter it is
    /// given back, as the driver asks of whoever holds one (a reset does not release it).
    fn primary_was_reset(&self, device: i32);
    /// The runtime allocation that contains `addr`: (base, length); `None` when there is none
    /// or the driver cannot be reached.
    fn allocation_range(&self, addr: usize) -> Option<(usize, usize)>;
    /// Note [Expandable segments]: the driver's allocation granularity for `device`'s memory
    /// when it has the virtual memory API and the device supports it; None otherwise.
    fn granularity(&self, device: i32) -> Option<u64>;
    /// cuMemAddressReserve: `len` bytes of device address space, no memory behind them.
    fn reserve(&self, len: u64) -> Result<u64, DeviceError>;
    /// cuMemCreate of `len` bytes on `device`, mapped at `addr` (reserved) and made accessible
    /// to `device` and to the devices in the `peers` bit mask (peer access the program enabled);
    /// the physical memory's handle. Nothing is left behind on failure.
    fn map_chunk(&self, device: i32, addr: u64, len: u64, peers: u64) -> Result<u64, DeviceError>;
    /// cuMemSetAccess: the mapped chunks of [addr, addr + len) become accessible to `device` too.
    fn grant_access(&self, addr: u64, len: u64, device: i32) -> Result<(), DeviceError>;
    /// cuMemAddressFree of a range `reserve` gave, with nothing mapped in it any more.
    fn unreserve(&self, addr: u64, len: u64) -> Result<(), DeviceError>;
    /// cuMemUnmap of the chunk at `addr`, then cuMemRelease of its handle.
    fn unmap_chunk(&self, addr: u64, len: u64, handle: u64) -> Result<(), DeviceError>;
    /// Moves the physical memory `handle` mapped at `from` to `to` (reserved): cuMemUnmap,
    /// cuMemMap, cuMemSetAccess for `device` and `peers`. On failure the handle is released (its memory goes
    /// back to the driver) and nothing stays mapped at `to`.
    fn move_chunk(&self, device: i32, from: u64, to: u64, len: u64, handle: u64, peers: u64) -> Result<(), DeviceError>;
    /// cuIpcGetMemHandle of the allocation at `base`, in the current context: the driver's
    /// legacy IPC handle (Note [IPC] in device/pool/pointers.rs).
    fn ipc_handle(&self, base: u64) -> Result<[u8; 64], DeviceError>;
    /// Note [IPC of expandable segments] (device/pool/exports.rs): the memory of chunk `handle`
    /// as a POSIX file descriptor (cuMemExportToShareableHandle); the driver's error when it
    /// cannot (a chunk created without that handle type, a driver without it).
    fn export_chunk(&self, handle: u64) -> Result<i32, DeviceError>;
    /// Closes a descriptor `export_chunk` gave (its chunk went back to the driver).
    fn close_exported(&self, fd: i32);
    /// A duplicate of descriptor `fd`, for a peer; None when the system refuses.
    fn dup_exported(&self, fd: i32) -> Option<i32>;
}

/// Devices the pool serves (more are passed through to the runtime).
pub const MAX_DEVICES: usize = 16;
