//! glibc's own malloc settings that decide whether we serve at all: MALLOC_PERTURB_ and the
//! glibc.malloc.perturb tunable (Note [Memory debuggers] in state.rs).

/// Whether the environment entry `name=value` asks glibc to perturb memory (fill each block at
/// malloc and at free with a byte, to expose reads of uninitialized or freed memory): a nonzero
/// MALLOC_PERTURB_, or glibc.malloc.perturb nonzero in GLIBC_TUNABLES. glibc reads them as
/// strtoul in base 0 does: leading blanks, then decimal, 0x hexadecimal or 0 octal.
pub fn asks_perturb(name: &[u8], value: &[u8]) -> bool {
    match name {
        b"MALLOC_PERTURB_" => number(value) != 0,
        b"GLIBC_TUNABLES" => value.split(|&b| b == b':').any(|t| t.strip_prefix(b"glibc.malloc.perturb=").is_some_and(|v| number(v) != 0)),
        _ => false,
    }
}

/// strtoul(value, NULL, 0), saturating: 0 where no digit is read.
fn number(value: &[u8]) -> u64 {
    let v = value.trim_ascii_start();
    let v = v.strip_prefix(b"+").unwrap_or(v);
    let (digits, radix) = match v {
        [b'0', b'x' | b'X', rest @ ..] if rest.first().is_some_and(u8::is_ascii_hexdigit) => (rest, 16),
        [b'0', rest @ ..] => (rest, 8),
        _ => (v, 10),
    };
    digits.iter().map_while(|&b| char::from(b).to_digit(radix)).fold(0u64, |n, d| n.saturating_mul(u64::from(radix)).saturating_add(u64::from(d)))
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
        assert!(asks_perturb(b"MALLOC_PERTURB_", b"0x5a"));
        assert!(asks_perturb(b"MALLOC_PERTURB_", b"  7"));
        assert!(asks_perturb(b"MALLOC_PERTURB_", b"017"));
        assert!(!asks_perturb(b"MALLOC_PERTURB_", b"00"));
        assert!(!asks_perturb(b"MALLOC_PERTURB_", b""));
    }
}
