//! Which setting a variable's name means: its name, an earlier name (read as the new one, with
//! a line), another spelling (US and UK, read silently); and for a name that is none of them,
//! the nearest one, to suggest. Runs at init, before the next allocator is known: no allocation
//! (the edit distance works in fixed arrays on the stack).

use super::{OptionSpec, OPTIONS};

const PREFIX: &[u8] = b"TENSORMALLOC_";

/// How a name was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Name,
    Old(&'static str),
    Spelling,
}

/// The setting `name` means, and how.
pub fn find(name: &[u8]) -> Option<(&'static OptionSpec, Found)> {
    OPTIONS.iter().find_map(|spec| {
        if spec.name.as_bytes() == name {
            Some((spec, Found::Name))
        } else if let Some(old) = spec.old_names.iter().find(|o| o.as_bytes() == name) {
            Some((spec, Found::Old(old)))
        } else if spec.spellings.iter().any(|s| s.as_bytes() == name) {
            Some((spec, Found::Spelling))
        } else {
            None
        }
    })
}

/// Names longer than this (after the prefix) get no suggestion.
const LONGEST: usize = 48;

/// The setting whose name (or earlier name, or spelling) is nearest to `name`, when it is near:
/// an edit distance (insertions, deletions, substitutions, swaps of neighbours; any case) of at
/// most 1 + a sixth of its length (a missing `_MS` free), so a dropped or doubled letter, a swap,
/// a missing `_MS` are found and an unrelated name is not.
pub fn nearest(name: &[u8]) -> Option<&'static str> {
    let asked = name.strip_prefix(PREFIX)?;
    let mut best: Option<(usize, &'static str)> = None;
    for spec in OPTIONS {
        let known = core::iter::once(&spec.name).chain(spec.old_names).chain(spec.spellings);
        for candidate in known {
            let Some(candidate) = candidate.as_bytes().strip_prefix(PREFIX) else { continue };
            // A missing `_MS` is as near as the name itself.
            let d = distance(asked, candidate).min(candidate.strip_suffix(b"_MS").map_or(usize::MAX, |c| distance(asked, c)));
            if d <= 1 + candidate.len() / 6 && best.is_none_or(|(b, _)| d < b) {
                best = Some((d, spec.name));
            }
        }
    }
    best.map(|(_, name)| name)
}

/// Optimal string alignment distance, case-insensitive; usize::MAX past LONGEST bytes.
fn distance(a: &[u8], b: &[u8]) -> usize {
    if a.len() > LONGEST || b.len() > LONGEST {
        return usize::MAX;
    }
    const FAR: usize = usize::MAX / 2;
    let at = |row: &[usize; LONGEST + 1], k: usize| row.get(k).copied().unwrap_or(FAR);
    let same = |x: Option<&u8>, y: Option<&u8>| matches!((x, y), (Some(x), Some(y)) if x.eq_ignore_ascii_case(y));
    // Three rows of the table: two back (for swaps), the last, the one being filled.
    let mut two_back = [FAR; LONGEST + 1];
    let mut last = [0usize; LONGEST + 1];
    for (j, cell) in last.iter_mut().enumerate() {
        *cell = j;
    }
    for i in 0..a.len() {
        let mut now = [FAR; LONGEST + 1];
        if let Some(first) = now.first_mut() {
            *first = i + 1;
        }
        for j in 0..b.len() {
            let cost = usize::from(!same(a.get(i), b.get(j)));
            let mut d = (at(&last, j + 1) + 1).min(at(&now, j) + 1).min(at(&last, j) + cost);
            if i > 0 && j > 0 && same(a.get(i - 1), b.get(j)) && same(a.get(i), b.get(j - 1)) {
                d = d.min(at(&two_back, j - 1) + 1);
            }
            if let Some(cell) = now.get_mut(j + 1) {
                *cell = d;
            }
        }
        two_back = last;
        last = now;
    }
    at(&last, b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance(b"THRESHOLD", b"THRESHOLD"), 0);
        assert_eq!(distance(b"TRESHOLD", b"THRESHOLD"), 1);
        assert_eq!(distance(b"THERSHOLD", b"THRESHOLD"), 1); // a swap
        assert_eq!(distance(b"threshold", b"THRESHOLD"), 0);
        assert_eq!(distance(b"", b"STATS"), 5);
        assert_eq!(distance(b"CUDA_RELEASE", b"CUDA_RELEASE_MS"), 3);
        assert_eq!(distance(&[b'A'; 60], b"STATS"), usize::MAX);
    }

    #[test]
    fn near_misses_are_suggested_and_far_ones_not() {
        let cases: [(&[u8], Option<&str>); 8] = [
            (b"TENSORMALLOC_TRESHOLD", Some("TENSORMALLOC_THRESHOLD")),
            (b"TENSORMALLOC_STAT", Some("TENSORMALLOC_STATS")),
            (b"TENSORMALLOC_stats", Some("TENSORMALLOC_STATS")),
            (b"TENSORMALLOC_CUDA_RELEASE", Some("TENSORMALLOC_CUDA_RELEASE_MS")),
            (b"TENSORMALLOC_CUDA_NEIGHBOR_WAIT", Some("TENSORMALLOC_CUDA_NEIGHBOUR_WAIT_MS")),
            (b"TENSORMALLOC_EXPIRE", Some("TENSORMALLOC_HOST_UNMAP_MS")), // near an earlier name: the new one
            (b"TENSORMALLOC_COLOUR", None),
            (b"TENSORMALLOC_", None),
        ];
        for (name, want) in cases {
            assert_eq!(nearest(name), want, "{}", String::from_utf8_lossy(name));
        }
    }

    #[test]
    fn names_old_names_and_spellings_are_found() {
        assert_eq!(find(b"TENSORMALLOC_STATS").map(|(s, f)| (s.name, f)), Some(("TENSORMALLOC_STATS", Found::Name)));
        assert_eq!(
            find(b"TENSORMALLOC_RELEASE_MS").map(|(s, f)| (s.name, f)),
            Some(("TENSORMALLOC_HOST_RELEASE_MS", Found::Old("TENSORMALLOC_RELEASE_MS")))
        );
        assert_eq!(
            find(b"TENSORMALLOC_CUDA_NEIGHBOR_WAIT_MS").map(|(s, f)| (s.name, f)),
            Some(("TENSORMALLOC_CUDA_NEIGHBOUR_WAIT_MS", Found::Spelling))
        );
        assert!(find(b"TENSORMALLOC_STAT").is_none());
    }

    /// Every name, earlier name and spelling means one setting only.
    #[test]
    fn no_name_is_taken_twice() {
        let all: Vec<&str> = OPTIONS.iter().flat_map(|s| core::iter::once(&s.name).chain(s.old_names).chain(s.spellings)).copied().collect();
        for name in &all {
            assert_eq!(all.iter().filter(|n| *n == name).count(), 1, "{name}");
            assert!(name.starts_with("TENSORMALLOC_") && name.len() - PREFIX.len() <= LONGEST, "{name}");
        }
    }
}
