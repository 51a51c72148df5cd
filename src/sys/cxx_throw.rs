//! What a C++ exception is made of, found in the process: the C++ runtime's
//! `__cxa_allocate_exception` and `__cxa_throw`, and the class to throw, PyTorch's
//! `c10::OutOfMemoryError` (libc10.so: Python sees `torch.OutOfMemoryError`) or, without it, the C++
//! runtime's `std::bad_alloc`. Found with dlopen(RTLD_NOLOAD) and glibc's dlsym on the first
//! out-of-memory answer (or when `tensormalloc.torch.enable()` asks), never loaded by us; the
//! throw itself is `shim::torch_oom`'s, in a frame the unwinder can walk (Note [Raising from the
//! pluggable allocator] there). Nothing here allocates through the malloc family except the
//! message, with the C++ runtime's own nothrow `operator new`, as `std::string` expects.

use core::ffi::{c_char, c_void, CStr};
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The Itanium C++ ABI's `std::__cxx11::basic_string<char>` (libstdc++'s, since GCC 5): a
/// pointer to its characters, their count, and either the characters themselves (15 at most, and
/// the NUL) or the capacity of the heap buffer the pointer names.
#[repr(C)]
pub struct CxxString {
    pub ptr: *mut u8,
    pub len: usize,
    pub local: [u8; 16],
}

/// `c10::SourceLocation`: function, file, line. 24 bytes: passed on the stack by value.
#[repr(C)]
pub struct SourceLocation {
    pub function: *const c_char,
    pub file: *const c_char,
    pub line: u32,
}

/// What to throw, as the naked thrower reads it: the object (from `__cxa_allocate_exception`),
/// the constructor to run on it first (0: the object is complete), its type and destructor for
/// `__cxa_throw`, and `__cxa_throw`.
#[repr(C)]
pub struct Plan {
    pub object: *mut c_void,
    pub constructor: usize,
    pub type_info: usize,
    pub destructor: usize,
    pub throw: usize,
}

/// Which exception this process can raise.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Raises {
    /// None can be thrown: the C++ runtime is not in the process.
    Nothing = 1,
    /// `std::bad_alloc` (Python sees RuntimeError: no libc10.so, or one without the symbols).
    BadAlloc = 2,
    /// `c10::OutOfMemoryError` (Python sees `torch.OutOfMemoryError`).
    TorchOutOfMemory = 3,
}

// The symbols, resolved once (0 in FOUND: not yet).
static FOUND: AtomicU8 = AtomicU8::new(0);
static ALLOCATE: AtomicUsize = AtomicUsize::new(0);
static THROW: AtomicUsize = AtomicUsize::new(0);
static NEW_NOTHROW: AtomicUsize = AtomicUsize::new(0);
static DELETE: AtomicUsize = AtomicUsize::new(0);
static OOM_CONSTRUCTOR: AtomicUsize = AtomicUsize::new(0);
static OOM_TYPE: AtomicUsize = AtomicUsize::new(0);
static OOM_VTABLE: AtomicUsize = AtomicUsize::new(0);
static BAD_ALLOC_TYPE: AtomicUsize = AtomicUsize::new(0);
static BAD_ALLOC_VTABLE: AtomicUsize = AtomicUsize::new(0);

/// `OutOfMemoryError(SourceLocation, std::string)`, the constructor libc10.so exports (the class
/// inherits c10::Error's); its typeinfo and vtable.
const OOM_CTOR_NAME: &CStr = c"_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";

/// Looks the symbols up (once: later calls read what the first found).
pub fn raises() -> Raises {
    match FOUND.load(Ordering::Acquire) {
        0 => {}
        f if f == Raises::TorchOutOfMemory as u8 => return Raises::TorchOutOfMemory,
        f if f == Raises::BadAlloc as u8 => return Raises::BadAlloc,
        _ => return Raises::Nothing,
    }
    let dlsym = super::dlsym::glibc();
    // SAFETY: dlopen with RTLD_NOLOAD only finds a library already loaded (it loads nothing);
    // dlsym on its handle searches it and its dependencies, so the C++ runtime found is the one
    // libc10.so throws with. Names are valid C strings.
    let found = unsafe {
        let c10 = libc::dlopen(c"libc10.so".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        let cxx = libc::dlopen(c"libstdc++.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        let scope = if c10.is_null() { cxx } else { c10 };
        let get = |handle: *mut c_void, name: &CStr| if handle.is_null() { 0 } else { dlsym(handle, name.as_ptr()) as usize };
        ALLOCATE.store(get(scope, c"__cxa_allocate_exception"), Ordering::Relaxed);
        THROW.store(get(scope, c"__cxa_throw"), Ordering::Relaxed);
        NEW_NOTHROW.store(get(scope, c"_ZnwmRKSt9nothrow_t"), Ordering::Relaxed);
        DELETE.store(get(scope, c"_ZdlPv"), Ordering::Relaxed);
        OOM_CONSTRUCTOR.store(get(c10, OOM_CTOR_NAME), Ordering::Relaxed);
        OOM_TYPE.store(get(c10, c"_ZTIN3c1016OutOfMemoryErrorE"), Ordering::Relaxed);
        OOM_VTABLE.store(get(c10, c"_ZTVN3c1016OutOfMemoryErrorE"), Ordering::Relaxed);
        BAD_ALLOC_TYPE.store(get(scope, c"_ZTISt9bad_alloc"), Ordering::Relaxed);
        BAD_ALLOC_VTABLE.store(get(scope, c"_ZTVSt9bad_alloc"), Ordering::Relaxed);
        let all = |cells: &[&AtomicUsize]| cells.iter().all(|c| c.load(Ordering::Relaxed) != 0);
        if !all(&[&ALLOCATE, &THROW]) {
            Raises::Nothing
        } else if all(&[&OOM_CONSTRUCTOR, &OOM_TYPE, &OOM_VTABLE, &NEW_NOTHROW]) {
            Raises::TorchOutOfMemory
        } else if all(&[&BAD_ALLOC_TYPE, &BAD_ALLOC_VTABLE]) {
            Raises::BadAlloc
        } else {
            Raises::Nothing
        }
    };
    FOUND.store(found as u8, Ordering::Release);
    found
}

/// Address `slot` of the vtable at `vtable`: the virtual functions start two words in (after
/// the offset to top and the typeinfo); slot 0 is the complete-object destructor of a class
/// whose first virtual function is its destructor (std::exception's, and so c10::Error's).
///
/// # Safety
/// `vtable` is a vtable symbol's address.
unsafe fn virtual_function(vtable: usize, slot: usize) -> usize {
    // SAFETY: the caller's contract; vtables are readable for the process's life.
    unsafe { *((vtable + 16 + 8 * slot) as *const usize) }
}

/// Fills `plan` (and, for c10's exception, `text` with `message` and `location`) for the naked
/// thrower; false when nothing can be thrown here.
///
/// # Safety
/// `plan`, `text` and `location` are writable; `message` outlives the call.
pub unsafe fn plan(message: &[u8], text: *mut CxxString, location: *mut SourceLocation, plan: *mut Plan) -> bool {
    let raises = raises();
    if raises == Raises::Nothing {
        return false;
    }
    let torch = raises == Raises::TorchOutOfMemory;
    let size = if torch { 512 } else { 8 }; // c10::OutOfMemoryError is 128 bytes in PyTorch 2.15; bad_alloc is its vptr
    // SAFETY: the C++ runtime's functions, found above, with their documented signatures;
    // __cxa_allocate_exception never returns null (it terminates first).
    unsafe {
        let allocate: unsafe extern "C" fn(usize) -> *mut c_void = core::mem::transmute(ALLOCATE.load(Ordering::Relaxed));
        let object = allocate(size);
        let (constructor, type_info, vtable) = if torch {
            (OOM_CONSTRUCTOR.load(Ordering::Relaxed), OOM_TYPE.load(Ordering::Relaxed), OOM_VTABLE.load(Ordering::Relaxed))
        } else {
            // std::bad_alloc's constructor only stores its vptr.
            let vtable = BAD_ALLOC_VTABLE.load(Ordering::Relaxed);
            *(object as *mut usize) = vtable + 16;
            (0, BAD_ALLOC_TYPE.load(Ordering::Relaxed), vtable)
        };
        if torch {
            fill_string(&mut *text, message);
            location.write(SourceLocation { function: c"tm_cuda_alloc_torch".as_ptr(), file: c"tensormalloc".as_ptr(), line: 0 });
        }
        plan.write(Plan { object, constructor, type_info, destructor: virtual_function(vtable, 0), throw: THROW.load(Ordering::Relaxed) });
    }
    true
}

/// Makes `s` a std::string holding `message`: in place when it fits, else in a buffer from the
/// C++ runtime's nothrow operator new (the constructor takes it over and frees it with operator
/// delete); cut to what fits in place if that fails.
///
/// # Safety
/// `s` is writable.
unsafe fn fill_string(s: &mut CxxString, message: &[u8]) {
    let local = s.local.as_mut_ptr();
    let new = NEW_NOTHROW.load(Ordering::Relaxed);
    let heap = if message.len() > 15 && new != 0 {
        // SAFETY: operator new(size_t, const std::nothrow_t&): the second argument is only
        // compared against nothing; any address does.
        unsafe {
            let new: unsafe extern "C" fn(usize, *const c_void) -> *mut u8 = core::mem::transmute(new);
            new(message.len() + 1, NEW_NOTHROW.as_ptr() as *const c_void)
        }
    } else {
        core::ptr::null_mut()
    };
    let (ptr, len) = if heap.is_null() { (local, message.len().min(15)) } else { (heap, message.len()) };
    // SAFETY: ptr has room for len + 1 bytes (the local array holds 16).
    unsafe {
        core::ptr::copy_nonoverlapping(message.as_ptr(), ptr, len);
        *ptr.add(len) = 0;
    }
    s.ptr = ptr;
    s.len = len;
    if !heap.is_null() {
        s.local = [0; 16];
        if let Some(cap) = s.local.get_mut(..8) {
            cap.copy_from_slice(&len.to_ne_bytes()); // the capacity, where a heap string keeps it
        }
    }
}

/// Frees what a std::string the constructor did not take over still holds.
///
/// # Safety
/// `s` was filled by `fill_string` and left by the constructor.
pub unsafe fn release_string(s: *mut CxxString) {
    // SAFETY: the caller's contract.
    let s = unsafe { &mut *s };
    let delete = DELETE.load(Ordering::Relaxed);
    if s.ptr != s.local.as_mut_ptr() && !s.ptr.is_null() && delete != 0 {
        // SAFETY: operator delete(void*) on the buffer operator new gave.
        unsafe {
            let delete: unsafe extern "C" fn(*mut u8) = core::mem::transmute(delete);
            delete(s.ptr);
        }
        s.ptr = s.local.as_mut_ptr();
        s.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string() -> CxxString {
        CxxString { ptr: core::ptr::null_mut(), len: 0, local: [0xAA; 16] }
    }

    #[test]
    fn a_short_message_is_kept_in_place_with_its_nul() {
        let mut s = string();
        // SAFETY: s is ours; the C++ runtime's operator new is not needed for 15 bytes.
        unsafe { fill_string(&mut s, b"out of memory") };
        assert_eq!(s.ptr, s.local.as_mut_ptr());
        assert_eq!(s.len, 13);
        assert_eq!(&s.local[..14], b"out of memory\0");
        // SAFETY: filled above; an in-place string holds nothing to free.
        unsafe { release_string(&mut s) };
        assert_eq!(s.len, 13);
    }

    #[test]
    fn without_operator_new_a_long_message_is_cut_to_what_fits_in_place() {
        assert_eq!(NEW_NOTHROW.load(Ordering::Relaxed), 0, "nothing was resolved in the test process");
        let mut s = string();
        // SAFETY: as above.
        unsafe { fill_string(&mut s, b"CUDA out of memory. Tried to allocate 2.0 GiB") };
        assert_eq!(s.ptr, s.local.as_mut_ptr());
        assert_eq!(s.len, 15);
        assert_eq!(&s.local, b"CUDA out of mem\0");
    }

    #[test]
    fn the_destructor_is_the_first_virtual_function() {
        let vtable: [usize; 4] = [0, 0x1000, 0xd1, 0xd0]; // offset to top, typeinfo, D1, D0
        // SAFETY: a readable array shaped as a vtable.
        assert_eq!(unsafe { virtual_function(vtable.as_ptr() as usize, 0) }, 0xd1);
    }
}
