//! The files written from the options table, so that none can drift from it: the Python
//! package's settings (what `tensormalloc --help` prints), docs/configuration.md (the reference)
//! and the README's table of the settings most users set. Each test compares a file with what it
//! would write, and `TENSORMALLOC_BLESS=1 cargo test --lib generated` rewrites them.

use super::{Group, OptionSpec, OPTIONS};
use std::fmt::Write;

/// How every setting reads its value: `tensormalloc --help` and docs/configuration.md open with
/// it (Note [One vocabulary]).
pub const LEGEND: &[&str] = &[
    "Environment variables, read once when the library loads; setuid and setgid programs ignore them, as glibc does its own MALLOC_*.",
    "Sizes take K, M, G, T, with or without i or iB (binary: 4M and 4Mi are 4 MiB). Times are in milliseconds.",
    "Off is shown as off (0, no, none and false mean it too) for a setting that can be off (each line says what it takes: a size, a time or a percentage has no off), on as 1 (on, yes and true too); an empty value is the variable unset.",
    "A bad value gets one line on stderr naming the variable and the default used, and the program runs on; a TENSORMALLOC_ name that is no setting gets one line naming the nearest one; an earlier name is read as the new one, with a line, and ignored, with a line, where the new one is set too; a path setting given 1, on, yes or true writes no file (a line says so).",
    "release: idle memory goes back to the system. A host block's pages go to the kernel (lazily or now: TENSORMALLOC_HOST_RELEASE), its address range stays mapped until it is unmapped; a device segment is freed to the driver.",
    "%p in a PATH is the process id, so each process of a run writes its own file; files are 0600 and never written through a symbolic link.",
];

fn bless_or_compare(relative: &str, want: &str) {
    let path = format!("{}/{relative}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("TENSORMALLOC_BLESS").is_some() {
        std::fs::write(&path, want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "{relative} is out of date: run TENSORMALLOC_BLESS=1 cargo test --lib generated");
}

fn in_group(group: Group) -> impl Iterator<Item = &'static OptionSpec> {
    OPTIONS.iter().filter(move |s| s.group == group)
}

/// The other names a setting answers to, in words.
fn also(spec: &OptionSpec) -> String {
    let mut out = String::new();
    for old in spec.old_names {
        write!(out, "{}formerly {old}", if out.is_empty() { "" } else { "; " }).unwrap();
    }
    for other in spec.spellings {
        write!(out, "{}also spelt {other}", if out.is_empty() { "" } else { "; " }).unwrap();
    }
    out
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn table_row(out: &mut String, spec: &OptionSpec) {
    let extra = also(spec);
    let extra = if extra.is_empty() { extra } else { format!(" ({extra})") };
    writeln!(out, "| `{}` | `{}` | {}{} |", spec.name, spec.default, cell(spec.doc), cell(&extra)).unwrap();
}

/// python/tensormalloc/_settings.py.
fn python_settings() -> String {
    let mut out = String::from(
        "# Generated from OPTIONS in src/config/options.rs by config/generated.rs\n\
         # (TENSORMALLOC_BLESS=1 cargo test --lib generated rewrites it); do not edit.\n\
         # What `tensormalloc --help` lists: LEGEND, then GROUPS in order, each with its SETTINGS\n\
         # (name, default, group, doc, other names).\n",
    );
    out.push_str("LEGEND = (\n");
    for line in LEGEND {
        writeln!(out, "    {line:?},").unwrap();
    }
    out.push_str(")\nGROUPS = (\n");
    for group in Group::ALL {
        writeln!(out, "    {:?},", group.title()).unwrap();
    }
    out.push_str(")\nSETTINGS = (\n");
    for group in Group::ALL {
        for spec in in_group(group) {
            writeln!(out, "    ({:?}, {:?}, {:?},\n     {:?},\n     {:?}),", spec.name, spec.default, group.title(), spec.doc, also(spec)).unwrap();
        }
    }
    out.push_str(")\n");
    out
}

/// docs/configuration.md.
fn reference() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from OPTIONS in src/config/options.rs by config/generated.rs (TENSORMALLOC_BLESS=1 cargo test --lib generated); do not edit. -->\n\n\
         Every setting of the library, as `tensormalloc --help` lists them (both come from the table in\n\
         `src/config/options.rs`). Why the defaults are what they are: [BENCHMARKS.md](../BENCHMARKS.md#why-the-defaults).\n\n",
    );
    for line in LEGEND {
        writeln!(out, "- {line}").unwrap();
    }
    for group in Group::ALL {
        writeln!(out, "\n## {}\n\n| variable | default | what it does |\n|---|---|---|", group.title()).unwrap();
        for spec in in_group(group) {
            table_row(&mut out, spec);
        }
    }
    out.push_str("\n## Earlier names\n\nStill read, each with one line on stderr naming the new name:\n\n| earlier name | now |\n|---|---|\n");
    for spec in OPTIONS {
        for old in spec.old_names {
            writeln!(out, "| `{old}` | `{}` |", spec.name).unwrap();
        }
    }
    out.push_str("\n`TENSORMALLOC_HOST_RELEASE` also reads the earlier values `free` (as `lazy`) and `dontneed` (as `now`).\n");
    out
}

const README_BEGIN: &str = "<!-- settings: generated from src/config/options.rs (TENSORMALLOC_BLESS=1 cargo test --lib generated) -->\n";
const README_END: &str = "<!-- end of settings -->\n";

/// README.md with its table of the settings most users set written anew between the markers.
fn readme(have: &str) -> String {
    let (Some(begin), Some(end)) = (have.find(README_BEGIN), have.find(README_END)) else {
        panic!("README.md lacks the settings markers:\n{README_BEGIN}{README_END}");
    };
    let mut table = String::from("| variable | default | what it does |\n|---|---|---|\n");
    for spec in in_group(Group::Main) {
        table_row(&mut table, spec);
    }
    format!("{}{README_BEGIN}{table}{README_END}{}", &have[..begin], &have[end + README_END.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// python/tensormalloc/_settings.py (what `tensormalloc --help` lists) is this table.
    #[test]
    fn python_settings_match_options() {
        bless_or_compare("python/tensormalloc/_settings.py", &python_settings());
    }

    #[test]
    fn docs_configuration_matches_options() {
        bless_or_compare("docs/configuration.md", &reference());
    }

    /// The README's table of the settings most users set: the Main group, with its defaults.
    #[test]
    fn readme_settings_match_options() {
        let have = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        bless_or_compare("README.md", &readme(&have));
    }

    /// Every group has a setting, and every line of the legend is one line.
    #[test]
    fn groups_and_legend() {
        for group in Group::ALL {
            assert!(in_group(group).count() > 0, "{group:?}");
        }
        assert!(LEGEND.iter().all(|l| !l.contains('\n')));
    }
}
