//! C stdio, for glibc's inspection calls that write to a `FILE` (malloc_info): capturing what a
//! function writes into a buffer, and writing bytes to a caller's `FILE`. Not on any allocation
//! path: stdio may allocate (its `FILE`), which reaches the malloc family as any caller does.

use core::ffi::c_void;

/// Runs `write` on a `FILE` writing into `buf` (fmemopen); the bytes it wrote, or None when
/// they did not fit (or no `FILE` could be opened).
pub fn captured(buf: &mut [u8], write: impl FnOnce(*mut libc::FILE)) -> Option<&[u8]> {
    // SAFETY: the FILE writes into buf, which outlives it (closed below).
    let fp = unsafe { libc::fmemopen(buf.as_mut_ptr().cast::<c_void>(), buf.len(), c"w".as_ptr()) };
    if fp.is_null() {
        return None;
    }
    write(fp);
    // SAFETY: fp is ours until fclose.
    let written = unsafe {
        libc::fflush(fp);
        let at = libc::ftell(fp);
        libc::fclose(fp);
        usize::try_from(at).ok()?
    };
    // A full buffer may have cut the text (fmemopen keeps one byte for its NUL).
    if written + 1 >= buf.len() {
        return None;
    }
    buf.get(..written)
}

/// fwrite of all of `bytes` to the caller's `fp`; false when it wrote less.
///
/// # Safety
/// `fp` is an open `FILE`.
pub unsafe fn put(fp: *mut libc::FILE, bytes: &[u8]) -> bool {
    // SAFETY: fp is the caller's open FILE; bytes is a live slice.
    unsafe { libc::fwrite(bytes.as_ptr().cast::<c_void>(), 1, bytes.len(), fp) == bytes.len() }
}
