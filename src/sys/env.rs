//! Reads `TENSORMALLOC_*` variables by walking `environ` directly: getenv-free, allocation-free,
//! and usable before libc has finished starting. Setuid/setgid programs (AT_SECURE) see none,
//! as glibc does for its own MALLOC_* tunables.

extern "C" {
    static environ: *const *const libc::c_char;
}

/// True when the kernel marked this process as secure-execution (setuid, setgid, capabilities).
pub fn is_secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Calls `visit(name, value)` for every environment entry whose name starts with `prefix`.
pub fn for_each_with_prefix(prefix: &[u8], mut visit: impl FnMut(&[u8], &[u8])) {
    // SAFETY: environ is either null or a null-terminated array of NUL-terminated strings that
    // libc keeps alive; we only read it.
    unsafe {
        let mut entry = environ;
        if entry.is_null() {
            return;
        }
        while !(*entry).is_null() {
            let bytes = core::ffi::CStr::from_ptr(*entry).to_bytes();
            if bytes.starts_with(prefix) {
                if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
                    visit(bytes.get(..eq).unwrap_or(&[]), bytes.get(eq + 1..).unwrap_or(&[]));
                }
            }
            entry = entry.add(1);
        }
    }
}
