//! Who called, at the level of loaded objects: the load base of the object holding a code
//! address (`_dl_find_object`, glibc 2.35+: lock-free, no allocation, safe on allocation paths)
//! and, for reports only, the names dladdr gives (the loader's own strings, no allocation).
//! Note [Holders] in holders.rs says what the answers are for.

use super::find_object::find_object;
use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicUsize, Ordering::{Acquire, Release}};

/// Resolves `_dl_find_object` (at init, where dlsym may run).
pub fn init() {
    // SAFETY: glibc's dlsym with a valid C string; not called on an allocation path.
    let p = unsafe { crate::sys::dlsym::glibc()(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
    super::find_object::set(p as usize);
}

/// Where the object holding code address `addr` starts; `None` when `addr` lies in no loaded
/// object (a JIT's code), `Some(addr)` itself when glibc is too old to say (each call site then
/// stands for itself).
pub fn object_start(addr: usize) -> Option<usize> {
    if !super::find_object::available() {
        return Some(addr);
    }
    find_object(addr).map(|found| found.map_start as usize)
}

// Note [Wrappers and tail calls]
// A block is charged to the object whose code called the malloc family, whether it called it
// or jumped to it: `xmalloc()` in libwrap.so that checks for NULL makes a call (its return
// address is in libwrap.so), one compiled to `jmp malloc@plt` (a tail call) leaves only its
// caller's return address. So, once per call site, the call instruction before the return
// address is read: a direct `call rel32` (through a PLT stub, resolved by its GOT slot) or a
// `call *GOT(%rip)` (-fno-plt). When what it called is not one of our entry points, that function
// ended in a jump to us: the block is its object's. Calls through a register (a function pointer,
// a hook table) say nothing and keep the return address's object. Code is read as plain memory,
// with no system call (process_vm_readv, which browser-style sandboxes kill, read it before),
// and only where the loader's own tables say it lies: inside a loaded segment of a loaded object
// (`_dl_find_object`, lock-free, then the object's program headers in its first page, which
// libgcc's unwinder reads too), executable for code, readable for a GOT slot. Anything else (a
// JIT's code, an address past a segment) keeps the return address's object.

/// The object a block asked for from return address `ret` is charged to (Note [Wrappers and
/// tail calls]); None for code in no object.
pub fn calling_object(ret: usize) -> Option<usize> {
    let own = object_start(ret)?;
    let Some(callee) = call_target(ret) else { return Some(own) };
    // _dl_find_object, lock-free: dladdr would take the loader's lock on an allocation path.
    let callee_object = object_start(callee);
    if callee_object.is_none() || callee_object == object_start(calling_object as fn(usize) -> Option<usize> as usize) {
        return Some(own);
    }
    callee_object
}

/// What the call instruction that returns to `ret` called, followed through a PLT stub; None when
/// it is not a direct or GOT call (x86-64 only).
fn call_target(ret: usize) -> Option<usize> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let before = read_code::<6>(ret.checked_sub(6)?)?;
    let rel = |b: &[u8]| b.try_into().ok().map(i32::from_le_bytes).map(|d| d as isize);
    if before[1] == 0xE8 {
        let target = ret.checked_add_signed(rel(before.get(2..6)?)?)?;
        return Some(through_plt(target).unwrap_or(target));
    }
    if before[0] == 0xFF && before[1] == 0x15 {
        let slot = ret.checked_add_signed(rel(before.get(2..6)?)?)?;
        return read_slot(slot);
    }
    None
}

/// Where a PLT stub at `stub` jumps (`[endbr64] [bnd] jmp *GOT(%rip)`): its GOT slot's value.
fn through_plt(stub: usize) -> Option<usize> {
    let code = read_code::<11>(stub)?;
    let mut at = if code.get(..4) == Some(&[0xF3, 0x0F, 0x1E, 0xFA]) { 4 } else { 0 };
    if code.get(at) == Some(&0xF2) {
        at += 1;
    }
    if code.get(at..at + 2) != Some(&[0xFF, 0x25]) {
        return None;
    }
    let disp = i32::from_le_bytes(code.get(at + 2..at + 6)?.try_into().ok()?) as isize;
    let slot = stub.checked_add(at + 6)?.checked_add_signed(disp)?;
    read_slot(slot)
}

/// N bytes of code at `addr` (Note [Wrappers and tail calls]): inside an executable segment of
/// a loaded object, or None.
fn read_code<const N: usize>(addr: usize) -> Option<[u8; N]> {
    read_mapped::<N>(addr, PF_X)
}

/// A GOT slot's value at `addr`: inside a readable segment of a loaded object, or None.
fn read_slot(addr: usize) -> Option<usize> {
    read_mapped::<8>(addr, PF_R).map(usize::from_le_bytes)
}

/// N bytes at `addr` if they lie inside one loaded segment (PT_LOAD) with `flag` of the object
/// `_dl_find_object` finds there.
fn read_mapped<const N: usize>(addr: usize, flag: u32) -> Option<[u8; N]> {
    let found = find_object(addr)?;
    let end = addr.checked_add(N)?;
    if !in_segment(found.map_start as usize, found.link_map, addr, end, flag) {
        return None;
    }
    // SAFETY: [addr, end) lies inside a loaded segment of a loaded object, mapped readable
    // (x86-64 has no execute-only pages).
    Some(unsafe { core::ptr::read_unaligned(addr as *const [u8; N]) })
}

const PT_LOAD: u64 = 1;
const PF_X: u32 = 1;
const PF_R: u32 = 4;
/// The size of Elf64_Phdr and where its fields lie.
const PHDR_BYTES: usize = 56;

/// Whether [addr, end) lies inside one PT_LOAD segment with `flag` of the object mapped from
/// `map_start` (its ELF header), loaded at `link_map`'s bias. Reads only the object's first page,
/// where the header and program headers are.
fn in_segment(map_start: usize, link_map: *mut c_void, addr: usize, end: usize, flag: u32) -> bool {
    if map_start == 0 || link_map.is_null() || !map_start.is_multiple_of(4096) {
        return false;
    }
    // SAFETY: the first page of a loaded object, mapped readable (its first segment holds the
    // ELF header and program headers; the loader and the unwinder read them there too).
    let page = unsafe { core::slice::from_raw_parts(map_start as *const u8, 4096) };
    if page.get(..5) != Some(&b"\x7fELF\x02"[..]) {
        return false;
    }
    let field = |at: usize, n: usize| -> Option<u64> {
        let b = page.get(at..at + n)?;
        Some(b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x)))
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (field(32, 8), field(54, 2), field(56, 2)) else { return false };
    if phentsize != PHDR_BYTES as u64 {
        return false;
    }
    // SAFETY: link_map is the loader's `struct link_map` of this object; l_addr comes first.
    let bias = unsafe { (*(link_map as *const LinkMap)).addr };
    (0..phnum as usize).any(|i| {
        let at = phoff as usize + i * PHDR_BYTES;
        let seg = |off: usize, n: usize| field(at + off, n);
        match (seg(0, 4), seg(4, 4), seg(16, 8), seg(40, 8)) {
            (Some(PT_LOAD), Some(flags), Some(vaddr), Some(memsz)) if flags as u32 & flag != 0 => {
                let start = bias.wrapping_add(vaddr as usize);
                addr >= start && end <= start.saturating_add(memsz as usize)
            }
            _ => false,
        }
    })
}

/// What dladdr says of `addr`: the object's path (the program's own name for the main program,
/// whose path the loader leaves empty) and the enclosing symbol (empty when unknown), given to
/// `f` as `Some((object, symbol))`; `None` when `addr` lies in no loaded object.
pub fn names<T>(addr: usize, f: impl FnOnce(Option<(&[u8], &[u8])>) -> T) -> T {
    // SAFETY: dladdr fills the struct we own; it only reads the loader's tables.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    if addr == 0 || unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
        return f(None);
    }
    let text = |p: *const c_char| if p.is_null() { &b""[..] } else {
        // SAFETY: dladdr's strings are NUL-terminated and live as long as the object is loaded.
        unsafe { CStr::from_ptr(p) }.to_bytes()
    };
    let mut object = text(info.dli_fname);
    if object.is_empty() {
        // SAFETY: glibc's program_invocation_name, set before any code of ours runs.
        object = text(unsafe { program_invocation_name });
    }
    f(Some((object, text(info.dli_sname))))
}

extern "C" {
    static program_invocation_name: *const c_char;
}

/// The head of glibc's `struct link_map` (link.h), what dlinfo's RTLD_DI_LINKMAP points to.
#[repr(C)]
struct LinkMap {
    addr: usize,
    name: *const c_char,
    dynamic: *mut c_void,
}

/// The object a dlopen handle names: where it starts (as `object_start` says) and an address
/// inside it (its dynamic section), to ask after a dlclose whether it is still there.
///
/// # Safety
/// `handle` is null or a handle dlopen gave (as dlinfo requires).
pub unsafe fn handle_object(handle: *mut c_void) -> Option<(usize, usize)> {
    let mut map: *const LinkMap = core::ptr::null();
    // SAFETY: dlinfo writes one pointer into `map`; an invalid handle answers -1.
    if handle.is_null() || unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, (&raw mut map).cast()) } != 0 || map.is_null() {
        return None;
    }
    // SAFETY: the loader's link_map of a loaded object.
    let inside = unsafe { (*map).dynamic } as usize;
    Some((object_start(inside)?, inside))
}

static NEXT_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

/// The next dlclose after ours (resolved on first use: never on an allocation path).
///
/// # Safety
/// As dlclose.
pub unsafe fn next_dlclose(handle: *mut c_void) -> c_int {
    let mut f = NEXT_DLCLOSE.load(Acquire);
    if f == 0 {
        // SAFETY: dlsym may allocate: we are not on an allocation path.
        f = unsafe { crate::sys::dlsym::next_definition(c"dlclose") } as usize;
        NEXT_DLCLOSE.store(f, Release);
    }
    if f == 0 {
        return -1;
    }
    // SAFETY: the C library's dlclose, or the next interposer's.
    unsafe { core::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> c_int>(f)(handle) }
}
