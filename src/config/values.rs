//! The values settings take: words for on and off, numbers, sizes with suffixes, paths. None
//! allocates: they run at init, before the next allocator is known.

use super::{Reason, Unit, GIB, KIB, MIB, STATS_PATH_MAX, TIB};

pub(super) const SIZE_HINT: &str = "not a size (use bytes or a K/M/G/T suffix, e.g. 4M)";
pub(super) const MS_HINT: &str = "not a number of milliseconds";

pub(super) fn until_nul(buf: &[u8; STATS_PATH_MAX]) -> &[u8] {
    let len = buf.iter().position(|&b| b == 0).unwrap_or(STATS_PATH_MAX);
    buf.get(..len).unwrap_or(&[])
}

pub(super) fn trim_ascii(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    v.get(start..end).unwrap_or(&[])
}

/// One of a fixed set of words (any case).
pub(super) fn choose<T: Copy>(v: &[u8], choices: &[(&[u8], T)], hint: &'static str) -> Result<T, Reason> {
    choices.iter().find(|(word, _)| word.eq_ignore_ascii_case(v)).map(|&(_, t)| t).ok_or(Reason::Text(hint))
}

/// `auto` (None) or a value for `parse`.
pub(super) fn auto_or(v: &[u8], parse: impl Fn(&[u8]) -> Result<u64, Reason>) -> Result<Option<u64>, Reason> {
    if v.eq_ignore_ascii_case(b"auto") {
        return Ok(None);
    }
    parse(v).map(Some)
}

/// On: 1, on, yes, true; off: `means_off`'s words; any case.
pub fn parse_bool(v: &[u8]) -> Result<bool, Reason> {
    if [&b"1"[..], b"on", b"yes", b"true"].iter().any(|w| v.eq_ignore_ascii_case(w)) {
        Ok(true)
    } else if means_off(v) {
        Ok(false)
    } else {
        Err("not 1 or off".into())
    }
}

/// The words for off, wherever a setting can be off (Note [One vocabulary]): shown `off`.
pub fn means_off(v: &[u8]) -> bool {
    [&b"off"[..], b"0", b"no", b"none", b"false"].iter().any(|w| v.eq_ignore_ascii_case(w))
}

/// A path setting: off for `means_off`'s words (an empty path), else the path (1 to 255 bytes;
/// `%p` in it becomes the process id when the file is written, `%%` a percent sign).
pub(super) fn set_path(slot: &mut [u8; STATS_PATH_MAX], v: &[u8]) -> Result<(), Reason> {
    *slot = [0; STATS_PATH_MAX];
    if means_off(v) {
        return Ok(());
    }
    // The words for on name no file: a file called `1` in the working directory is a mistake.
    if parse_bool(v) == Ok(true) {
        return Err("on, where a path (the file to write) is wanted".into());
    }
    if v.is_empty() || v.len() >= STATS_PATH_MAX {
        return Err("not a path of 1 to 255 bytes".into());
    }
    slot.get_mut(..v.len()).ok_or("path too long")?.copy_from_slice(v);
    Ok(())
}

pub fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

pub(super) fn parse_u64_in(v: &[u8], lo: u64, hi: u64, unit: Unit) -> Result<u64, Reason> {
    let n = parse_u64(v).ok_or(if unit == Unit::Ms { MS_HINT } else { "not a whole number" })?;
    if n < lo || n > hi {
        return Err(Reason::OutOfRange { lo, hi, unit });
    }
    Ok(n)
}

/// Bytes with an optional binary suffix: `4096`, `512K`, `4M`, `4Mi`, `4MiB`, `1g`, `2T`.
pub fn parse_size(v: &[u8]) -> Option<u64> {
    let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
    let (num, suffix) = v.split_at(digits);
    let n = parse_u64(num)?;
    // `Mi` as well: Kubernetes writes sizes so (`512Mi`).
    const SUFFIXES: [(&[u8], u64); 18] = [
        (b"", 1), (b"b", 1),
        (b"k", KIB), (b"kb", KIB), (b"ki", KIB), (b"kib", KIB),
        (b"m", MIB), (b"mb", MIB), (b"mi", MIB), (b"mib", MIB),
        (b"g", GIB), (b"gb", GIB), (b"gi", GIB), (b"gib", GIB),
        (b"t", TIB), (b"tb", TIB), (b"ti", TIB), (b"tib", TIB),
    ];
    // eq_ignore_ascii_case, not to_ascii_lowercase: this runs during init, before the next
    // allocator is resolved, so it must not allocate.
    let (_, mult) = SUFFIXES.iter().find(|(s, _)| s.eq_ignore_ascii_case(suffix))?;
    n.checked_mul(*mult)
}

pub(super) fn parse_size_in(v: &[u8], lo: u64, hi: u64) -> Result<u64, Reason> {
    let n = parse_size(v).ok_or(SIZE_HINT)?;
    if n < lo || n > hi {
        return Err(Reason::OutOfRange { lo, hi, unit: Unit::Size });
    }
    Ok(n)
}
