//! The next allocator in the process (glibc, or jemalloc/mimalloc/tcmalloc preloaded after us),
//! resolved with dlsym(RTLD_NEXT), and the bootstrap arena that serves the calls made while
//! dlsym itself runs (dlsym may call malloc/calloc, which are us).

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

pub type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
pub type FreeFn = unsafe extern "C" fn(*mut c_void);
pub type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
pub type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
pub type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> usize;

/// The next allocator's entry points. `memalign`, `aligned_alloc` and `usable_size` are
/// optional; the required four are always present once resolution succeeded.
#[derive(Clone, Copy)]
pub struct NextAllocator {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub calloc: CallocFn,
    pub realloc: ReallocFn,
    pub posix_memalign: PosixMemalignFn,
    pub aligned_alloc: Option<MemalignFn>,
    pub memalign: Option<MemalignFn>,
    pub usable_size: Option<UsableSizeFn>,
    /// `usable_size` when the object that defines the next malloc defines it too: the only one
    /// that can size that malloc's blocks (realloc's copy into a block of ours trusts only it).
    /// A tracer after us that adds a header and lacks the name (glibc's memusage) has glibc's,
    /// which read its blocks as garbage sizes (SIGSEGV in the copy; the glibc-tools hunter).
    pub sizes_its_blocks: Option<UsableSizeFn>,
    /// The same under glibc's own names (`__libc_malloc`...), as the next object defining them
    /// has them (glibc, or jemalloc and tcmalloc, which define them too); the plain names where
    /// no object does. A next allocator built over `__libc_malloc` (a debugging layer, a spy)
    /// calls ours when we come first: our small side must go on to these, never to it.
    pub libc: LibcNames,
    /// glibc's control and inspection calls, as the next object defining them has them.
    pub control: ControlNames,
    /// The next malloc and mallopt are the C library's: glibc's heap serves the small requests
    /// (Note [glibc's sliding threshold] in route/glibc_slide.rs).
    pub heap_is_glibcs: bool,
}

/// glibc's `struct mallinfo` (`c_int` fields) and `struct mallinfo2` (`usize` fields).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MallInfo<T> {
    pub arena: T,
    pub ordblks: T,
    pub smblks: T,
    pub hblks: T,
    pub hblkhd: T,
    pub usmblks: T,
    pub fsmblks: T,
    pub uordblks: T,
    pub fordblks: T,
    pub keepcost: T,
}

/// glibc's mallopt parameters (malloc.h), as the next allocator's mallopt takes them.
pub const M_TRIM_THRESHOLD: c_int = -1;
pub const M_TOP_PAD: c_int = -2;
pub const M_MMAP_THRESHOLD: c_int = -3;
pub const M_MMAP_MAX: c_int = -4;
pub const M_PERTURB: c_int = -6;

/// The next allocator's malloc_trim, mallopt, mallinfo, mallinfo2, malloc_stats and
/// malloc_info, where it has them.
#[derive(Clone, Copy)]
pub struct ControlNames {
    pub malloc_trim: Option<unsafe extern "C" fn(usize) -> c_int>,
    pub mallopt: Option<unsafe extern "C" fn(c_int, c_int) -> c_int>,
    pub mallinfo: Option<unsafe extern "C" fn() -> MallInfo<c_int>>,
    pub mallinfo2: Option<unsafe extern "C" fn() -> MallInfo<usize>>,
    pub malloc_stats: Option<unsafe extern "C" fn()>,
    pub malloc_info: Option<unsafe extern "C" fn(c_int, *mut libc::FILE) -> c_int>,
}

/// The next allocator's entry points under glibc's `__libc_` names.
#[derive(Clone, Copy)]
pub struct LibcNames {
    pub malloc: MallocFn,
    pub free: FreeFn,
    pub calloc: CallocFn,
    pub realloc: ReallocFn,
    pub memalign: Option<MemalignFn>,
}

/// The next definition after us, never our own (Note [Other dlsym hooks] in sys/dlsym.rs).
unsafe fn lookup(name: &core::ffi::CStr) -> *mut c_void {
    super::dlsym::next_definition(name)
}

impl NextAllocator {
    /// Resolves the next definitions of the malloc family. Calls made meanwhile by dlsym (on
    /// this or another thread) are served by the bootstrap arena.
    ///
    /// # Safety
    /// Must be called with the bootstrap arena able to serve reentrant calls.
    pub unsafe fn resolve() -> Option<NextAllocator> {
        let malloc = lookup(c"malloc");
        let free = lookup(c"free");
        let calloc = lookup(c"calloc");
        let realloc = lookup(c"realloc");
        let posix_memalign = lookup(c"posix_memalign");
        if malloc.is_null() || free.is_null() || calloc.is_null() || realloc.is_null() || posix_memalign.is_null() {
            return None;
        }
        let optional = |p: *mut c_void| if p.is_null() { None } else { Some(p) };
        let or = |p: *mut c_void, plain: *mut c_void| if p.is_null() { plain } else { p };
        let memalign = optional(lookup(c"memalign"));
        let usable_size = optional(lookup(c"malloc_usable_size")).map(|p| core::mem::transmute::<*mut c_void, UsableSizeFn>(p));
        let object = |p: *mut c_void| super::dlsym::object_of(p as usize).map(|(base, _)| base);
        let same_object = usable_size.and_then(|u| object(u as *mut c_void)).is_some_and(|b| Some(b) == object(malloc));
        let mallopt = optional(lookup(c"mallopt"));
        let heap_is_glibcs = super::dlsym::in_c_library(malloc as usize) && mallopt.is_some_and(|m| super::dlsym::in_c_library(m as usize));
        // SAFETY: dlsym returned the addresses of C functions with these standard signatures.
        Some(NextAllocator {
            malloc: core::mem::transmute::<*mut c_void, MallocFn>(malloc),
            free: core::mem::transmute::<*mut c_void, FreeFn>(free),
            calloc: core::mem::transmute::<*mut c_void, CallocFn>(calloc),
            realloc: core::mem::transmute::<*mut c_void, ReallocFn>(realloc),
            posix_memalign: core::mem::transmute::<*mut c_void, PosixMemalignFn>(posix_memalign),
            aligned_alloc: optional(lookup(c"aligned_alloc")).map(|p| core::mem::transmute::<*mut c_void, MemalignFn>(p)),
            memalign: memalign.map(|p| core::mem::transmute::<*mut c_void, MemalignFn>(p)),
            usable_size,
            sizes_its_blocks: usable_size.filter(|_| same_object),
            libc: LibcNames {
                malloc: core::mem::transmute::<*mut c_void, MallocFn>(or(lookup(c"__libc_malloc"), malloc)),
                free: core::mem::transmute::<*mut c_void, FreeFn>(or(lookup(c"__libc_free"), free)),
                calloc: core::mem::transmute::<*mut c_void, CallocFn>(or(lookup(c"__libc_calloc"), calloc)),
                realloc: core::mem::transmute::<*mut c_void, ReallocFn>(or(lookup(c"__libc_realloc"), realloc)),
                memalign: optional(lookup(c"__libc_memalign")).or(memalign).map(|p| core::mem::transmute::<*mut c_void, MemalignFn>(p)),
            },
            control: ControlNames {
                malloc_trim: optional(lookup(c"malloc_trim")).map(|p| core::mem::transmute::<*mut c_void, unsafe extern "C" fn(usize) -> c_int>(p)),
                mallopt: mallopt.map(|p| core::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, c_int) -> c_int>(p)),
                mallinfo: optional(lookup(c"mallinfo")).map(|p| core::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> MallInfo<c_int>>(p)),
                mallinfo2: optional(lookup(c"mallinfo2")).map(|p| core::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> MallInfo<usize>>(p)),
                malloc_stats: optional(lookup(c"malloc_stats")).map(|p| core::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(p)),
                malloc_info: optional(lookup(c"malloc_info")).map(|p| core::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, *mut libc::FILE) -> c_int>(p)),
            },
            heap_is_glibcs,
        })
    }

    /// Aligned allocation through whichever aligned entry point the next allocator has.
    ///
    /// # Safety
    /// `align` is a power of two no smaller than a pointer.
    pub unsafe fn alloc_aligned(&self, align: usize, size: usize) -> *mut c_void {
        let mut out = core::ptr::null_mut();
        let rc = (self.posix_memalign)(&mut out, align, size);
        if rc != 0 {
            super::process::set_errno(rc);
            return core::ptr::null_mut();
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Bootstrap arena: a static bump allocator. Each block carries its size in a 16-byte header so
// realloc and malloc_usable_size work on it; free of a bootstrap block is a no-op.
// Every block starts on BLOCK_ALIGN, so free's fast path can tell by one test on the address
// that a pointer is neither the arena's nor ours (ours start there too). A few blocks are served
// while dlsym runs (most programs need none). The arena is mapped at its first use, not kept in
// .bss: a conservative collector (Boehm GC) scans every library's .bss at every collection, and
// 4 MiB of it made each one take 20 times as long.

/// Address space only: the pages that blocks never touch stay unbacked. Each block takes at
/// least BLOCK_ALIGN of it, so this holds 64 blocks (none were needed by numpy, gcc or ls).
const BOOTSTRAP_BYTES: usize = 4 << 20;
const HEADER: usize = 16;

/// The arena's base before it is mapped: no pointer a program holds lies within
/// BOOTSTRAP_BYTES above it (a non-canonical address), null included.
const UNMAPPED: usize = 1 << 63;
static ARENA_BASE: AtomicUsize = AtomicUsize::new(UNMAPPED);
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

#[inline(always)]
fn arena_base() -> usize {
    ARENA_BASE.load(Ordering::Acquire)
}

/// The arena's base, mapped now if it was not; None when the mapping is refused.
fn mapped_arena() -> Option<usize> {
    let base = arena_base();
    if base != UNMAPPED {
        return Some(base);
    }
    let fresh = super::os_pages::map_table(BOOTSTRAP_BYTES)?;
    match ARENA_BASE.compare_exchange(UNMAPPED, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(fresh),
        Err(theirs) => {
            // Another thread mapped it first.
            super::os_pages::unmap_table(fresh, BOOTSTRAP_BYTES);
            Some(theirs)
        }
    }
}

#[inline(always)]
pub fn is_bootstrap(p: *const c_void) -> bool {
    (p as usize).wrapping_sub(arena_base()) < BOOTSTRAP_BYTES
}

/// Calls `f(addr, len)` for the arena once mapped (the mlockall shim unlocks it: Note [Locked
/// memory] in host/host_layer/mod.rs).
pub fn for_each_table(mut f: impl FnMut(usize, usize)) {
    if arena_base() != UNMAPPED {
        f(arena_base(), BOOTSTRAP_BYTES);
    }
}

/// Serves one request from the arena, on a BLOCK_ALIGN boundary like every block of ours (free's
/// fast path relies on it); null with ENOMEM when it is used up.
/// `align` is a power of two. Memory is zero (the arena is never reused), so calloc is
/// satisfied too.
pub fn bootstrap_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(crate::backing::BLOCK_ALIGN);
    let Some(base) = mapped_arena() else { return enomem() };
    let mut used = ARENA_USED.load(Ordering::Relaxed);
    loop {
        let user = match (base + used + HEADER).checked_add(align - 1) {
            Some(v) => v & !(align - 1),
            None => return enomem(),
        };
        let end = match user.checked_add(size) {
            Some(e) if e <= base + BOOTSTRAP_BYTES => e,
            _ => return enomem(),
        };
        match ARENA_USED.compare_exchange_weak(used, end - base, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                // SAFETY: [user - HEADER, end) lies inside the arena and was just reserved by us.
                unsafe { ((user - HEADER) as *mut usize).write(size) };
                return user as *mut c_void;
            }
            Err(now) => used = now,
        }
    }
}

/// The size a bootstrap block was created with.
///
/// # Safety
/// `p` is a pointer returned by `bootstrap_alloc`.
pub unsafe fn bootstrap_size(p: *const c_void) -> usize {
    ((p as usize - HEADER) as *const usize).read()
}

fn enomem() -> *mut c_void {
    super::process::set_errno(libc::ENOMEM);
    core::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The only test that uses the arena (test builds have no global allocator over it), and it
    // uses it up.
    #[test]
    fn arena_blocks_start_on_block_align_until_it_runs_out() {
        let mut blocks = 0;
        loop {
            let align = if blocks % 3 == 2 { 4 * crate::backing::BLOCK_ALIGN } else { 16 };
            let size = 1 + blocks * 1000;
            let p = bootstrap_alloc(size, align);
            if p.is_null() {
                // SAFETY: errno is thread-local.
                assert_eq!(super::super::process::errno(), libc::ENOMEM);
                break;
            }
            assert_eq!(p as usize % align.max(crate::backing::BLOCK_ALIGN), 0, "free's fast path needs it");
            assert!(is_bootstrap(p) && is_bootstrap((p as usize + size - 1) as *const c_void));
            // SAFETY: p came from bootstrap_alloc.
            assert_eq!(unsafe { bootstrap_size(p) }, size);
            // SAFETY: the block has `size` writable bytes, zero when served.
            unsafe {
                assert_eq!(*(p as *const u8), 0);
                core::ptr::write_bytes(p as *mut u8, 0xab, size);
            }
            blocks += 1;
        }
        assert!(blocks >= BOOTSTRAP_BYTES / crate::backing::BLOCK_ALIGN / 2, "only {blocks} blocks");
        assert!(!is_bootstrap(core::ptr::null()) && !is_bootstrap((arena_base() + BOOTSTRAP_BYTES) as *const c_void));
    }
}
