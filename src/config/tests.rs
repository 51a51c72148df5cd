//! The options table's parsers and rows, driven by plain values.

use super::*;

#[test]
fn sizes() {
    assert_eq!(parse_size(b"4096"), Some(4096));
    assert_eq!(parse_size(b"4M"), Some(4 * MIB));
    assert_eq!(parse_size(b"4mib"), Some(4 * MIB));
    assert_eq!(parse_size(b"1Mi"), Some(MIB));
    assert_eq!(parse_size(b"64Ki"), Some(64 * KIB));
    assert_eq!(parse_size(b"2Gi"), Some(2 * GIB));
    assert_eq!(parse_size(b"1G"), Some(GIB));
    assert_eq!(parse_size(b"2T"), Some(2 * TIB));
    for bad in [&b""[..], b"-1", b"M", b"4X", b"4i", b"4Mii", b"1.5G", b" ", b"99999999999999999999999", b"18446744073709551615K"] {
        assert_eq!(parse_size(bad), None, "{:?}", bad);
    }
}

#[test]
fn bad_value_keeps_default_and_says_so() {
    let mut c = Config::default();
    let err = c.apply(b"TENSORMALLOC_THRESHOLD", b"lots").unwrap_err();
    assert_eq!(c.threshold_bytes, 128 * KIB);
    let line = err.to_string();
    assert!(line.starts_with("TENSORMALLOC_THRESHOLD='lots' is not a size"), "{line}");
    assert!(line.ends_with("using the default 128K"), "{line}");
}

#[test]
fn out_of_range_is_rejected() {
    let mut c = Config::default();
    assert!(c.apply(b"TENSORMALLOC_THRESHOLD", b"1K").is_err());
    assert!(c.apply(b"TENSORMALLOC_CACHE_BLOCKS", b"1025").is_err());
    assert!(c.apply(b"TENSORMALLOC_CUDA_LIMIT", b"0%").is_err());
    assert!(c.apply(b"TENSORMALLOC_CUDA_LIMIT", b"101%").is_err());
    assert_eq!(c, Config::default());
}

/// An out-of-range value's warning says what the setting allows.
#[test]
fn out_of_range_names_the_allowed_range() {
    let mut c = Config::default();
    let cases: [(&[u8], &[u8], &str); 6] = [
        (b"TENSORMALLOC_THRESHOLD", b"1K", "out of range (allowed: 4K to 1T); using the default 128K"),
        (b"TENSORMALLOC_CACHE_BLOCKS", b"1025", "out of range (allowed: 0 to 1024); using the default auto"),
        (b"TENSORMALLOC_MAX_WASTE", b"101", "out of range (allowed: 0 to 100)"),
        (b"TENSORMALLOC_HOST_RELEASE_MS", b"86400001", "out of range (allowed: 0 to 86400000 ms)"),
        (b"TENSORMALLOC_CUDA_LIMIT", b"0%", "out of range (allowed: 1% to 100%)"),
        (b"TENSORMALLOC_CACHE_BYTES", b"65T", "out of range (allowed: 0 to 64T)"),
    ];
    for (name, value, want) in cases {
        let line = c.apply(name, value).unwrap_err().to_string();
        assert!(line.contains(want), "{line}");
    }
    let line = c.apply(b"TENSORMALLOC_HOST_RELEASE_MS", b"soon").unwrap_err().to_string();
    assert!(line.contains("not a number of milliseconds"), "{line}");
}

#[test]
fn good_values_apply() {
    let mut c = Config::default();
    c.apply(b"TENSORMALLOC_THRESHOLD", b" 1M ").unwrap();
    c.apply(b"TENSORMALLOC_CUDA_LIMIT", b"80%").unwrap();
    c.apply(b"TENSORMALLOC_STATS", b"json:/tmp/x.json").unwrap();
    c.apply(b"TENSORMALLOC_HUGEPAGES", b"never").unwrap();
    assert_eq!(c.threshold_bytes, MIB);
    assert_eq!(c.cuda_limit, DeviceLimit::Percent(80));
    assert_eq!(c.stats, StatsOutput::Json);
    assert_eq!(c.stats_path(), b"/tmp/x.json");
    assert_eq!(c.hugepages, HugePages::Never);
    // A bound set by the user is exact; `auto` gives the default back.
    c.apply(b"TENSORMALLOC_CACHE_BYTES", b"2G").unwrap();
    c.apply(b"TENSORMALLOC_CACHE_BLOCKS", b"0").unwrap();
    assert_eq!((c.cache_bytes, c.cache_blocks), (Some(2 * GIB), Some(0)));
    c.apply(b"TENSORMALLOC_CACHE_BYTES", b"auto").unwrap();
    c.apply(b"TENSORMALLOC_CACHE_BLOCKS", b"AUTO").unwrap();
    assert_eq!((c.cache_bytes, c.cache_blocks), (None, None));
}

#[test]
fn overlong_and_binary_values_print_on_one_short_line() {
    let mut c = Config::default();
    let long = vec![b'x'; 10_000];
    let line = c.apply(b"TENSORMALLOC_CACHE_BYTES", &long).unwrap_err().to_string();
    assert!(line.len() < 200 && line.contains("..."), "{line}");
    let line = c.apply(b"TENSORMALLOC_HUGEPAGES", b"\n\x01").unwrap_err().to_string();
    assert!(!line.contains('\n') && line.contains("\\x01"), "{line}");
}

#[test]
fn unknown_names_are_reported() {
    let mut c = Config::default();
    assert!(matches!(c.apply(b"TENSORMALLOC_THRESHOLDD", b"1"), Err(ConfigError::Unknown { .. })));
}

/// The tools' variable is known (no warning) and changes nothing.
#[test]
fn tools_variable_is_known_and_ignored() {
    let mut c = Config::default();
    c.apply(b"TENSORMALLOC_LIB", b"/opt/x/libtensormalloc.so").unwrap();
    assert_eq!(c, Config::default());
}

/// Property: no byte string makes apply panic, and a failed apply changes nothing.
#[test]
fn garbage_never_panics_or_changes_config() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let alphabet = b"0123456789kKmMgGtTiIbB%-+. :json/\x00\xff";
    for _ in 0..crate::sim::rounds(20_000, 300) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 24) as usize;
        let value: Vec<u8> = (0..len).map(|i| alphabet[((seed >> (i % 8 * 8)) as usize + i) % alphabet.len()]).collect();
        for spec in OPTIONS {
            let mut c = Config::default();
            if c.apply(spec.name.as_bytes(), &value).is_err() {
                assert_eq!(c, Config::default());
            }
        }
    }
}

/// Each row's default, as shown, is `Config::DEFAULT`'s: applied after another value that
/// changes the setting, it gives the default back (so `--help` and the docs show the truth).
#[test]
fn shown_defaults_are_the_defaults() {
    let values: &[&[u8]] = &[
        b"1", b"off", b"1M", b"7", b"50%", b"123", b"always", b"never", b"now", b"lazy", b"binned",
        b"reuse", b"expandable", b"json:/tmp/x.json", b"/tmp/x.bin",
    ];
    for spec in OPTIONS {
        let mut c = Config::default();
        assert_eq!(c.apply(spec.name.as_bytes(), spec.default.as_bytes()), Ok(()), "{}", spec.name);
        assert_eq!(c, Config::DEFAULT, "{}: its default {} is not Config::DEFAULT's", spec.name, spec.default);
        if spec.name == "TENSORMALLOC_LIB" {
            continue;
        }
        let changed = values.iter().any(|v| {
            let mut c = Config::default();
            if c.apply(spec.name.as_bytes(), v).is_err() || c == Config::DEFAULT {
                return false;
            }
            c.apply(spec.name.as_bytes(), spec.default.as_bytes()).unwrap();
            assert_eq!(c, Config::DEFAULT, "{} after {}", spec.name, String::from_utf8_lossy(v));
            // An empty value is the variable unset: on a fresh configuration the default,
            // after another value (under another name of it) that value.
            let mut c2 = Config::default();
            c2.apply(spec.name.as_bytes(), b"  ").unwrap();
            assert_eq!(c2, Config::DEFAULT, "{}: empty", spec.name);
            c2.apply(spec.name.as_bytes(), v).unwrap();
            let set = c2;
            c2.apply(spec.name.as_bytes(), b"").unwrap();
            assert_eq!(c2, set, "{}: empty after {}", spec.name, String::from_utf8_lossy(v));
            true
        });
        assert!(changed, "{}: no test value changes it", spec.name);
    }
}

/// A setting set under its name and an earlier name takes its name's value whatever the
/// order, with one line for the earlier name; an empty value under either changes nothing.
#[test]
fn a_name_beats_its_earlier_name_in_either_order() {
    let run = |vars: &[(&str, &str)]| {
        let mut lines = Vec::new();
        let c = Config::from_vars(|visit| vars.iter().for_each(|(n, v)| visit(n.as_bytes(), v.as_bytes())), |e| lines.push(e.to_string()));
        (c.release_ms, lines)
    };
    for vars in [[("TENSORMALLOC_RELEASE_MS", "200"), ("TENSORMALLOC_HOST_RELEASE_MS", "5000")], [("TENSORMALLOC_HOST_RELEASE_MS", "5000"), ("TENSORMALLOC_RELEASE_MS", "200")]] {
        let (ms, lines) = run(&vars);
        assert_eq!(ms, 5000);
        assert_eq!(lines, ["TENSORMALLOC_RELEASE_MS is now TENSORMALLOC_HOST_RELEASE_MS, which is set too: TENSORMALLOC_RELEASE_MS ignored, TENSORMALLOC_HOST_RELEASE_MS used"]);
    }
    // A bad value under the name: the default, as its line says, not the earlier name's.
    let (ms, lines) = run(&[("TENSORMALLOC_RELEASE_MS", "200"), ("TENSORMALLOC_HOST_RELEASE_MS", "soon")]);
    assert_eq!((ms, lines.len()), (Config::DEFAULT.release_ms, 2));
    assert!(lines[1].contains("using the default 1000"), "{lines:?}");
    // Empty under either name: the other's value, and the earlier name's usual line.
    for vars in [[("TENSORMALLOC_HOST_RELEASE_MS", ""), ("TENSORMALLOC_RELEASE_MS", "200")], [("TENSORMALLOC_RELEASE_MS", "200"), ("TENSORMALLOC_HOST_RELEASE_MS", " ")]] {
        let (ms, lines) = run(&vars);
        assert_eq!(ms, 200);
        assert_eq!(lines, ["TENSORMALLOC_RELEASE_MS is now TENSORMALLOC_HOST_RELEASE_MS: read as that (the old name will go)"]);
    }
    let (ms, lines) = run(&[("TENSORMALLOC_HOST_RELEASE_MS", "200"), ("TENSORMALLOC_RELEASE_MS", "")]);
    assert_eq!((ms, lines.len()), (200, 0));
}

/// A path setting given a word for on names no file: one line, and off.
#[test]
fn a_path_setting_refuses_the_words_for_on() {
    for word in ["1", "on", "YES", "true"] {
        let mut c = Config::default();
        let line = c.apply(b"TENSORMALLOC_TRACE", word.as_bytes()).unwrap_err().to_string();
        assert!(line.contains("where a path (the file to write) is wanted; using the default off"), "{line}");
        assert_eq!(c.trace_path(), b"");
    }
    let mut c = Config::default();
    c.apply(b"TENSORMALLOC_SNAPSHOT_AT_EXIT", b"/tmp/on").unwrap();
    assert_eq!(c.snapshot_path(), b"/tmp/on");
    assert!(c.apply(b"TENSORMALLOC_CACHE_BYTES", b"1TB").is_ok(), "TB as KB, MB, GB");
}

/// Off is written `off`, and 0, no, none, false (any case) mean the same wherever a setting
/// takes `off`; on is `1`, and on, yes, true mean the same.
#[test]
fn one_word_for_off_many_accepted() {
    let mut can_be_off = 0;
    for spec in OPTIONS.iter().filter(|s| s.name != "TENSORMALLOC_LIB") {
        let mut off = Config::default();
        if off.apply(spec.name.as_bytes(), b"off").is_err() {
            assert!(!spec.doc.contains("off:") && spec.default != "off", "{} says off but refuses it", spec.name);
            continue;
        }
        can_be_off += 1;
        for word in [&b"0"[..], b"no", b"none", b"false", b"OFF", b"None"] {
            let mut c = Config::default();
            c.apply(spec.name.as_bytes(), word).unwrap();
            assert_eq!(c, off, "{}={}", spec.name, String::from_utf8_lossy(word));
        }
        let mut on = Config::default();
        if on.apply(spec.name.as_bytes(), b"1").is_ok() && spec.doc.starts_with("1:") {
            for word in [&b"on"[..], b"yes", b"true", b"TRUE"] {
                let mut c = Config::default();
                c.apply(spec.name.as_bytes(), word).unwrap();
                assert_eq!(c, on, "{}={}", spec.name, String::from_utf8_lossy(word));
            }
        }
    }
    assert!(can_be_off >= 12, "{can_be_off}");
    // Shown one way: no default and no doc offers another word for off.
    for spec in OPTIONS {
        assert!(!["0", "none", "false", "no"].contains(&spec.default), "{}: default {}", spec.name, spec.default);
        for other in ["0:", "none:", "false:", "never:", "; never", "0, off", "(pass through)"] {
            assert!(!spec.doc.contains(other), "{}: {other}", spec.name);
        }
    }
}

/// An earlier name applies its value to the new setting and says the new name; with a bad
/// value it says both.
#[test]
fn earlier_names_still_work_and_name_the_new_one() {
    let mut c = Config::default();
    let said = c.apply(b"TENSORMALLOC_RELEASE_MS", b"250").unwrap_err().to_string();
    assert_eq!(c.release_ms, 250);
    assert_eq!(said, "TENSORMALLOC_RELEASE_MS is now TENSORMALLOC_HOST_RELEASE_MS: read as that (the old name will go)");
    assert!(matches!(c.apply(b"TENSORMALLOC_EXPIRE_MS", b"99"), Err(ConfigError::Renamed { .. })));
    assert_eq!(c.expire_ms, 99);
    assert!(matches!(c.apply(b"TENSORMALLOC_RELEASE", b"dontneed"), Err(ConfigError::Renamed { .. })));
    assert_eq!(c.release, Release::DontNeed);
    c.apply(b"TENSORMALLOC_HOST_RELEASE", b"free").unwrap();
    assert_eq!(c.release, Release::Free);
    let said = c.apply(b"TENSORMALLOC_EXPIRE_MS", b"soon").unwrap_err().to_string();
    assert_eq!(c.expire_ms, 99);
    assert!(said.starts_with("TENSORMALLOC_EXPIRE_MS='soon' is not a number of milliseconds; using the default 10000"), "{said}");
    assert!(said.ends_with("(TENSORMALLOC_EXPIRE_MS is now TENSORMALLOC_HOST_UNMAP_MS)"), "{said}");
    // The other spelling is read without a word.
    assert_eq!(c.apply(b"TENSORMALLOC_CUDA_NEIGHBOR_WAIT_MS", b"5"), Ok(()));
    assert_eq!(c.cuda_neighbour_wait_ms, 5);
}

#[test]
fn a_near_miss_names_the_nearest_setting() {
    let mut c = Config::default();
    let said = c.apply(b"TENSORMALLOC_TRESHOLD", b"1M").unwrap_err().to_string();
    assert_eq!(said, "TENSORMALLOC_TRESHOLD is not a tensormalloc setting; ignored (did you mean TENSORMALLOC_THRESHOLD?)");
    let said = c.apply(b"TENSORMALLOC_NOTHING_LIKE_IT", b"1").unwrap_err().to_string();
    assert_eq!(said, "TENSORMALLOC_NOTHING_LIKE_IT is not a tensormalloc setting; ignored");
    assert_eq!(c, Config::default());
}
