//! glibc's own malloc settings that decide whether we serve at all: MALLOC_PERTURB_ and the
//! glibc.malloc.perturb tunable (Note [Memory debuggers] in state.rs).

/// Whether the environment entry `name=value` asks glibc to perturb memory (fill each block at
/// malloc and at free with a byte, to expose reads of uninitialized or freed memory): a nonzero
/// MALLOC_PERTURB_, or glibc.malloc.perturb nonzero in GLIBC_TUNABLES. glibc reads both with
/// atoi: leading digits, anything else zero.
pub fn asks_perturb(name: &[u8], value: &[u8]) -> bool {
    match name {
        b"MALLOC_PERTURB_" => atoi(value) != 0,
        b"GLIBC_TUNABLES" => value.split(|&b| b == b':').any(|t| t.strip_prefix(b"glibc.malloc.perturb=").is_some_and(|v| atoi(v) != 0)),
        _ => false,
    }
}

fn atoi(v: &[u8]) -> u64 {
    v.iter().take_while(|b| b.is_ascii_digit()).fold(0u64, |n, &d| n.saturating_mul(10).saturating_add(u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::asks_perturb;

    #[test]
    fn perturb_is_asked_by_a_nonzero_value_in_either_spelling() {
        assert!(asks_perturb(b"MALLOC_PERTURB_", b"165"));
        assert!(!asks_perturb(b"MALLOC_PERTURB_", b"0"));
        assert!(!asks_perturb(b"MALLOC_PERTURB_", b"x"));
        assert!(asks_perturb(b"GLIBC_TUNABLES", b"glibc.malloc.check=3:glibc.malloc.perturb=7"));
        assert!(!asks_perturb(b"GLIBC_TUNABLES", b"glibc.malloc.perturb=0:glibc.malloc.mmap_max=0"));
        assert!(!asks_perturb(b"GLIBC_TUNABLES", b"glibc.malloc.perturbx=1"));
        assert!(!asks_perturb(b"MALLOC_CHECK_", b"3"));
    }
}
