//! glibc's own malloc settings that decide whether we serve at all: MALLOC_PERTURB_ and the
//! glibc.malloc.perturb tunable (Note [Memory debuggers] in state.rs); and those that fix glibc's
//! thresholds, which we then leave alone (Note [glibc's sliding threshold] in route/glibc_slide.rs).

/// What the environment entry `name=value` says of glibc's perturbation (fill each block at
/// malloc and at free with a byte, to expose reads of uninitialized or freed memory): Some(on)
/// for a MALLOC_PERTURB_ or a glibc.malloc.perturb in GLIBC_TUNABLES that glibc takes (the last
/// there deciding), None for one it ignores or none. glibc reads them as strtoul in base 0 does
/// (leading blanks, then decimal, 0x hexadecimal or 0 octal) and ignores a value outside the
/// tunable's range, 0 to 255: 256 or 1000 perturbs nothing, and stepping aside for it cost the
/// cache and a line on stderr (the glibc-tools hunter).
pub fn perturb_setting(name: &[u8], value: &[u8]) -> Option<bool> {
    let taken = |v: &[u8]| {
        let n = number(v);
        (n <= 255).then_some(n != 0)
    };
    match name {
        b"MALLOC_PERTURB_" => taken(value),
        b"GLIBC_TUNABLES" => value.rsplit(|&b| b == b':').filter_map(|t| t.strip_prefix(b"glibc.malloc.perturb=")).find_map(taken),
        _ => None,
    }
}

/// Whether glibc perturbs under these settings (`perturb_setting` of each): the tunable, where
/// it says anything, over MALLOC_PERTURB_, as glibc 2.36 has it whatever their order.
pub fn perturbs(tunables: Option<bool>, malloc_perturb: Option<bool>) -> bool {
    tunables.or(malloc_perturb).unwrap_or(false)
}

/// Whether the environment entry `name=value` fixes glibc's mmap or trim threshold, its top pad
/// or its mmap count, each of which stops glibc sliding its thresholds (malloc.c: every
/// `do_set_*` of them sets `no_dyn_threshold`).
pub fn fixes_thresholds(name: &[u8], value: &[u8]) -> bool {
    const TUNABLES: [&[u8]; 4] = [b"glibc.malloc.trim_threshold=", b"glibc.malloc.top_pad=", b"glibc.malloc.mmap_threshold=", b"glibc.malloc.mmap_max="];
    match name {
        b"MALLOC_TRIM_THRESHOLD_" | b"MALLOC_TOP_PAD_" | b"MALLOC_MMAP_THRESHOLD_" | b"MALLOC_MMAP_MAX_" => true,
        b"GLIBC_TUNABLES" => value.split(|&b| b == b':').any(|t| TUNABLES.iter().any(|p| t.starts_with(p))),
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
    use super::{fixes_thresholds, perturb_setting, perturbs};

    #[test]
    fn the_settings_that_stop_glibc_sliding_its_thresholds_are_told() {
        for name in [&b"MALLOC_TRIM_THRESHOLD_"[..], b"MALLOC_TOP_PAD_", b"MALLOC_MMAP_THRESHOLD_", b"MALLOC_MMAP_MAX_"] {
            assert!(fixes_thresholds(name, b"4294967296"), "{}", String::from_utf8_lossy(name));
        }
        assert!(fixes_thresholds(b"GLIBC_TUNABLES", b"glibc.malloc.check=3:glibc.malloc.trim_threshold=1"));
        assert!(fixes_thresholds(b"GLIBC_TUNABLES", b"glibc.malloc.mmap_max=0"));
        assert!(!fixes_thresholds(b"GLIBC_TUNABLES", b"glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1"));
        assert!(!fixes_thresholds(b"MALLOC_ARENA_MAX", b"1"));
        assert!(!fixes_thresholds(b"MALLOC_TRIM_THRESHOLD", b"1"), "glibc's name ends with an underscore");
    }

    fn asks_perturb(name: &[u8], value: &[u8]) -> bool {
        perturb_setting(name, value) == Some(true)
    }

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

    #[test]
    fn perturb_settings_glibc_ignores_ask_nothing() {
        // Checked against glibc 2.36: a value past 255 leaves the tunable as it was.
        assert_eq!(perturb_setting(b"MALLOC_PERTURB_", b"256"), None);
        assert_eq!(perturb_setting(b"MALLOC_PERTURB_", b"255"), Some(true));
        assert_eq!(perturb_setting(b"GLIBC_TUNABLES", b"glibc.malloc.perturb=300"), None);
        assert_eq!(perturb_setting(b"GLIBC_TUNABLES", b"glibc.malloc.perturb=0x100"), None);
        // The last one taken decides.
        assert_eq!(perturb_setting(b"GLIBC_TUNABLES", b"glibc.malloc.perturb=165:glibc.malloc.perturb=0"), Some(false));
        assert_eq!(perturb_setting(b"GLIBC_TUNABLES", b"glibc.malloc.perturb=0:glibc.malloc.perturb=7"), Some(true));
        assert_eq!(perturb_setting(b"GLIBC_TUNABLES", b"glibc.malloc.perturb=7:glibc.malloc.perturb=1000"), Some(true));
        // The tunable over MALLOC_PERTURB_.
        assert!(!perturbs(Some(false), Some(true)));
        assert!(perturbs(None, Some(true)));
        assert!(perturbs(Some(true), None));
        assert!(!perturbs(None, None));
    }
}
