//! The real `dlsym`, behind the one we export (in `shim::cuda_lookup`) so that a program or runtime that
//! takes libcuda's entry points by name gets ours. glibc's is found with `dlvsym`, which we do not
//! interpose: glibc 2.34 and later version it GLIBC_2.34, older ones GLIBC_2.2.5 (libdl). Our
//! export tail-jumps to the next `dlsym` in the chain for every symbol it does not serve, so the
//! caller's return address, which `RTLD_NEXT` is relative to, stays the caller's.
//
// Note [Other dlsym hooks]
// Tracing tools, MangoHud and VirtualGL preload libraries that export `dlsym` too. With such a
// hook after us, our export jumps to the hook's dlsym (the next one in the chain), not straight to
// glibc's, so the program's lookups reach it as they would without us. With the hook before us,
// a plain `dlsym(RTLD_NEXT, "malloc")` from our code would be answered by the hook relative to
// itself, naming our own malloc as the next one, and every call would loop: we look the malloc
// family up with glibc's dlsym, called directly (relative to us), and refuse any answer that is
// our own (`is_ours`).

use core::ffi::{c_char, c_void, CStr};
use core::sync::atomic::{AtomicPtr, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Where the exported `dlsym` jumps: the next dlsym in the chain, once `resolve` has run; before
/// that a stand-in that answers "not found" (never reached: `resolve` runs before the first jump).
pub static REAL_DLSYM: AtomicPtr<()> = AtomicPtr::new(unresolved as *mut ());
/// glibc's own dlsym, once found.
static GLIBC_DLSYM: AtomicPtr<()> = AtomicPtr::new(unresolved as *mut ());

unsafe extern "C" fn unresolved(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
    core::ptr::null_mut()
}

fn as_dlsym(p: *mut ()) -> DlsymFn {
    // SAFETY: only ever set to `unresolved` or a dlsym, functions of this type.
    unsafe { core::mem::transmute::<*mut (), DlsymFn>(p) }
}

/// glibc's dlsym (a stand-in answering "not found" if there is none).
pub fn glibc() -> DlsymFn {
    let current = GLIBC_DLSYM.load(Ordering::Acquire);
    if current != unresolved as *mut () {
        return as_dlsym(current);
    }
    for handle in [libc::RTLD_NEXT, libc::RTLD_DEFAULT] {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: valid C strings; dlvsym is not interposed, so this cannot recurse.
            let p = unsafe { libc::dlvsym(handle, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() && !is_ours(p) {
                GLIBC_DLSYM.store(p.cast(), Ordering::Release);
                return as_dlsym(p.cast());
            }
        }
    }
    unresolved
}

/// The dlsym our export jumps to, resolved on first use: the next one in the chain after us
/// (another hook's, Note [Other dlsym hooks]), else glibc's. `ours` is our exported dlsym.
pub fn resolve(ours: *const ()) -> DlsymFn {
    let current = REAL_DLSYM.load(Ordering::Acquire);
    if current != unresolved as *mut () {
        return glibc();
    }
    let glibc = glibc();
    // SAFETY: glibc's dlsym, called from here, so RTLD_NEXT means "after this library".
    let next = unsafe { glibc(libc::RTLD_NEXT, c"dlsym".as_ptr()) };
    let target = if next.is_null() || next as *const () == ours || is_ours(next) { glibc as *mut () } else { next.cast() };
    REAL_DLSYM.store(target, Ordering::Release);
    glibc
}

/// The next definition of `name` after this library, never one of ours (Note [Other dlsym
/// hooks]); null when there is none.
///
/// # Safety
/// As dlsym: may call malloc (served by the bootstrap arena during init).
pub unsafe fn next_definition(name: &core::ffi::CStr) -> *mut c_void {
    // SAFETY: glibc's dlsym, called from here: RTLD_NEXT is relative to us.
    let p = unsafe { glibc()(libc::RTLD_NEXT, name.as_ptr()) };
    if !p.is_null() && !is_ours(p) {
        // Note [Versioned interposers]: one before the C library that a plain lookup skips.
        return versioned_interposer(true, name).filter(|_| in_c_library(p as usize)).unwrap_or(p);
    }
    // Some answer named us after all: glibc's own definition, by its version.
    for version in [c"GLIBC_2.2.5", c"GLIBC_2.17"] {
        // SAFETY: valid C strings; dlvsym is not interposed.
        let q = unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), version.as_ptr()) };
        if !q.is_null() && !is_ours(q) {
            return q;
        }
    }
    core::ptr::null_mut()
}

// Note [Versioned interposers]
// glibc's malloc debugging library (libc_malloc_debug.so, which MALLOC_CHECK_, mcheck and mtrace
// need since glibc 2.34) defines malloc, free and the rest only as compat symbols
// (malloc@GLIBC_2.2.5, hidden from a lookup with no version): programs bind to them, but a plain
// dlsym skips them and answers with the C library's. So the next allocator after us skipped it
// (its checks silently off), and one in front of us went unseen (our reallocarray handed its
// blocks to glibc: `ls` aborted under MALLOC_CHECK_=3). A lookup that lands in the C library is
// made again by version: a definition found that way in another object (not ours) is the one
// the program's own calls reach.

/// The definition of `name` at its glibc version after us (`after_us`) or in the whole global
/// scope, when it lies in neither this
/// library nor the C library (Note [Versioned interposers]). Only the malloc family is looked
/// up, each at the version the C library defines it at: a lookup that fails allocates its
/// error message, and an allocation through the debugging library before main makes the
/// program's mcheck() fail.
pub fn versioned_interposer(after_us: bool, name: &core::ffi::CStr) -> Option<*mut c_void> {
    let handle = if after_us { libc::RTLD_NEXT } else { libc::RTLD_DEFAULT };
    let base = match name.to_bytes() {
        b"malloc" | b"free" | b"calloc" | b"realloc" | b"memalign" | b"posix_memalign" | b"valloc" | b"pvalloc" | b"malloc_usable_size" | b"mallopt" | b"mallinfo" | b"malloc_trim" | b"malloc_stats" => true,
        b"malloc_info" | b"aligned_alloc" => false,
        _ => return None,
    };
    // Each name's version in the C library: x86-64's base is 2.2.5 (malloc_info came in 2.10,
    // aligned_alloc in 2.16); AArch64's is 2.17 for all. Elsewhere none is looked up.
    let version = match (cfg!(target_arch = "x86_64"), cfg!(target_arch = "aarch64"), name.to_bytes()) {
        (true, _, _) if base => c"GLIBC_2.2.5",
        (true, _, b"malloc_info") => c"GLIBC_2.10",
        (true, _, _) => c"GLIBC_2.16",
        (_, true, _) => c"GLIBC_2.17",
        _ => return None,
    };
    // SAFETY: valid C strings; dlvsym is not interposed.
    let q = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
    // The main program's canonical PLT entry answers a versioned lookup too: no interposer
    // (Note [A program that takes malloc's address]).
    (!q.is_null() && !is_ours(q) && !in_c_library(q as usize) && !is_plt_stub(q)).then_some(q)
}

/// Whether glibc's malloc debugging library stands in front of us or after us (Note [Memory
/// debuggers] in state.rs): its malloc, found by version, lies in it. Successful lookups only,
/// which allocate nothing (an allocation through it before main would make the program's
/// mcheck() fail).
pub fn glibc_malloc_debug_loaded() -> bool {
    [false, true].into_iter().any(|after_us| {
        versioned_interposer(after_us, c"malloc").and_then(|p| object_of(p as usize)).is_some_and(|(_, path)| {
            path.to_bytes().rsplit(|&b| b == b'/').next().is_some_and(|name| name.starts_with(b"libc_malloc_debug.so"))
        })
    })
}

/// This library's own definition of `name`, looked up in it by handle; null when it defines none.
///
/// # Safety
/// Call after init (dlopen may allocate).
pub unsafe fn own_definition(name: &core::ffi::CStr) -> *mut c_void {
    static OWN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    let mut own = OWN.load(Ordering::Acquire);
    if own.is_null() {
        let Some((_, path)) = object_of(own_definition as *const () as usize).filter(|(_, path)| !path.is_empty()) else {
            return core::ptr::null_mut();
        };
        // SAFETY: dlopen with NOLOAD only finds this library, which is loaded (and never
        // unloaded: `-z nodelete`).
        own = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if own.is_null() {
            return core::ptr::null_mut();
        }
        OWN.store(own, Ordering::Release);
    }
    // SAFETY: glibc's dlsym on our own handle; a handle also searches its dependencies, whose
    // answers are not ours.
    let p = unsafe { glibc()(own, name.as_ptr()) };
    if is_ours(p) { p } else { core::ptr::null_mut() }
}

/// Whether the process's definition of `name` (what a call by symbol reaches) is ours: false when
/// this library was loaded by path, outside the global scope.
pub fn process_definition_is_ours(name: &core::ffi::CStr) -> bool {
    is_ours(process_definition(name))
}

// Note [A program that takes malloc's address]
// A program built without PIE (Debian's node and python3) whose code takes the address of
// malloc, realloc or free (an allocator's table of them) gets a canonical PLT entry for it: its
// dynamic symbol table lists the name undefined, but with the stub's address as its value, so
// that every object's pointer to the function compares equal; and dlsym(RTLD_DEFAULT) answers
// that stub. It is code of the main program, neither ours nor the C library's, and read as an
// allocator in front of us: under node our thread was never made and every freed block was
// unmapped at once (3 to 30 times glibc's time: the runtimes hunter). A call through the stub
// reaches what the program's own reference was bound to, the first definition after the main
// program in the global scope. So an answer that is such a stub is looked up again in each object
// loaded after the main program, in load order, until one defines the name itself. Only
// successful lookups (a failed one allocates its message), and only at load.

/// What a call by symbol to `name` reaches in the process: glibc's dlsym with RTLD_DEFAULT, seen
/// through the main program's canonical PLT entries (Note [A program that takes malloc's
/// address]).
pub fn process_definition(name: &core::ffi::CStr) -> *mut c_void {
    // SAFETY: glibc's dlsym; RTLD_DEFAULT searches the global scope whoever asks.
    let p = unsafe { glibc()(libc::RTLD_DEFAULT, name.as_ptr()) };
    if !is_plt_stub(p) {
        return p;
    }
    definition_after_main(name).unwrap_or(p)
}

/// Whether `p` is a canonical PLT entry: the symbol dladdr finds for it is undefined.
fn is_plt_stub(p: *mut c_void) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: dladdr1 fills the struct we own and points `sym` at the loader's symbol entry,
    // which lives as long as the object.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let mut sym: *mut c_void = core::ptr::null_mut();
        libc::dladdr1(p, &mut info, &mut sym, RTLD_DL_SYMENT) != 0 && !sym.is_null() && (*(sym as *const libc::Elf64_Sym)).st_shndx == SHN_UNDEF
    }
}

const RTLD_DL_SYMENT: core::ffi::c_int = 1;
const SHN_UNDEF: u16 = 0;
/// Objects looked at after the main program: the preloads and the first of its libraries.
const OBJECTS: usize = 32;

/// The first definition of `name` in an object loaded after the main program, in load order.
fn definition_after_main(name: &core::ffi::CStr) -> Option<*mut c_void> {
    // Collected first: no lookup while dl_iterate_phdr holds the loader's lock.
    let mut names = ([core::ptr::null::<core::ffi::c_char>(); OBJECTS], 0usize);
    unsafe extern "C" fn collect(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> core::ffi::c_int {
        // SAFETY: `data` is `names`, borrowed for the call; `info` is the loader's.
        let (names, count) = unsafe { &mut *(data as *mut ([*const core::ffi::c_char; OBJECTS], usize)) };
        let Some(slot) = names.get_mut(*count) else { return 1 };
        // SAFETY: as above.
        *slot = unsafe { (*info).dlpi_name };
        *count += 1;
        0
    }
    // SAFETY: the callback only writes into `names`.
    unsafe { libc::dl_iterate_phdr(Some(collect), &mut names as *mut _ as *mut c_void) };
    let (names, count) = names;
    // The first is the main program.
    for &path in names.iter().take(count).skip(1) {
        // SAFETY: the loader's name of a loaded object.
        let path = unsafe { CStr::from_ptr(path) };
        // Objects with no file (the vdso) define no malloc, and a lookup that fails allocates.
        if !path.to_bytes().contains(&b'/') {
            continue;
        }
        // SAFETY: a loaded object's path and a C string constant.
        let Some(p) = (unsafe { lookup_in_loaded(path, name) }) else { continue };
        if !p.is_null() && object_of(p as usize).is_some_and(|(_, of)| of == path) {
            return Some(p);
        }
    }
    None
}

/// `name` looked up by the handle of the already loaded object `path` (it and its dependencies),
/// with glibc's own dlsym (ours answers our malloc for the next allocator's handle): null when
/// nothing there defines it; None when `path` is not loaded. Never loads anything: the NOLOAD
/// handle only counts a reference to an object that stays loaded, given back at once.
///
/// # Safety
/// `path` names a loaded object or none.
pub unsafe fn lookup_in_loaded(path: &CStr, name: &CStr) -> Option<*mut c_void> {
    let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
    if h.is_null() {
        return None;
    }
    let a = glibc()(h, name.as_ptr());
    libc::dlclose(h);
    Some(a)
}

/// Whether the code at `caller` lies in an object that defines `name` itself while the
/// process's definition of it lies elsewhere: a hook standing behind someone (Note [Calls
/// through a library's handle] in route/control.rs). Never for the main program (it comes
/// first), the C library or us.
pub fn interposer_behind(caller: usize, name: &CStr) -> bool {
    let Some((base, path)) = object_of(caller) else { return false };
    if !path.to_bytes().contains(&b'/') || is_ours(caller as *mut c_void) || in_c_library(caller) {
        return false;
    }
    // The caller's code is running: its object is loaded.
    let defines = defines_itself((base, path), name) == Some(true);
    // Looked up last, whatever the answer above: a lookup that succeeds clears the message a
    // failed one leaves for the caller's dlerror (the name is defined in the process: asked
    // only for names the caller's handle found).
    let first = object_of(process_definition(name) as usize).map(|(b, _)| b);
    defines && first != Some(base)
}

/// Whether the loaded object `lib` (its base and path, as `object_of` gives them) itself
/// defines `name`: a lookup by its handle also searches its dependencies, so the answer must
/// lie in it. None when it has no handle (not loaded by that path).
pub fn defines_itself((base, path): (usize, &CStr), name: &CStr) -> Option<bool> {
    // SAFETY: a loaded object's path and a C string.
    let found = unsafe { lookup_in_loaded(path, name) }?;
    Some(object_of(found as usize).is_some_and(|(b, _)| b == base))
}

/// Whether the code at `addr` lies in the C library (libc.so.6).
pub fn in_c_library(addr: usize) -> bool {
    object_of(addr).is_some_and(|(_, path)| path.to_bytes().rsplit(|&b| b == b'/').next().is_some_and(|name| name.starts_with(b"libc.so")))
}

/// Whether `p` lies in this library.
pub fn is_ours(p: *mut c_void) -> bool {
    let ours = object_of(is_ours as *const () as usize).map(|(base, _)| base);
    ours.is_some() && object_of(p as usize).map(|(base, _)| base) == ours
}

/// The loaded object holding `addr`: where its mapping starts and its path (the main program's
/// is empty, or its argv[0] where dladdr answers); None for an address in none. Asked of
/// `_dl_find_object` (lock-free, a binary search), else of dladdr, which scans the object's
/// symbols: about 160 such questions at load took 2 ms of every process's start (the runtimes
/// hunter). Neither allocates; the path lives as long as the object stays loaded.
pub fn object_of(addr: usize) -> Option<(usize, &'static CStr)> {
    if addr == 0 {
        return None;
    }
    if let Some(found) = super::find_object::loaded_object(addr) {
        return Some(found);
    }
    // SAFETY: dladdr fills the struct we own; a non-null name is NUL-terminated.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0 {
            return None;
        }
        Some((info.dli_fbase as usize, if info.dli_fname.is_null() { c"" } else { CStr::from_ptr(info.dli_fname) }))
    }
}
