//! The settings: one options table (config/options.rs) gives every `TENSORMALLOC_*` variable
//! with its default, group, parser, range, one-line doc and earlier names (Note [One
//! vocabulary]), parsed by config/values.rs. Pure: `Config::apply` takes a name and
//! a value and says what to tell the user; the caller (state.rs) reads the environment and prints
//! the line. `tensormalloc --help`, docs/configuration.md and the README's settings are written
//! from this table (config/generated.rs); names.rs finds a name and the nearest to a near miss.

mod names;
mod options;
mod values;
pub mod glibc;
#[cfg(test)]
mod generated;
#[cfg(test)]
mod tests;

pub use options::OPTIONS;
pub use values::{means_off, parse_bool, parse_size, parse_u64};
use values::{trim_ascii, until_nul};

use core::fmt;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// Most cached host blocks the fixed-size cache can hold (`TENSORMALLOC_CACHE_BLOCKS` ceiling):
/// room for 16 threads each keeping 4 large blocks (bench-numpy's churn sweep), and for the
/// mid-size tensors of a training step (hundreds from 128 KiB up).
pub const MAX_CACHE_BLOCKS: usize = 1024;
pub const STATS_PATH_MAX: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Align and round blocks of 4 MiB and more to 2 MiB so the program's own MADV_HUGEPAGE
    /// (numpy makes one) covers whole huge pages; never advise by ourselves.
    Auto,
    /// As `Auto`, and call madvise(MADV_HUGEPAGE) on every fresh block.
    Always,
    /// Page alignment only.
    Never,
}

/// Which failures print the out-of-memory report (report/oom.rs; Note [Reports unasked]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomReport {
    Off,
    /// A device allocation that failed after the pool gave back what it could.
    Device,
    /// Those and a host mapping a limit could allow.
    All,
}

/// How an idle cached block gives its pages back (Note [What RSS shows] in host/host_layer/release.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Release {
    /// MADV_FREE while the cgroup and the system have room, MADV_DONTNEED (and released blocks
    /// unmapped) when usage nears a limit.
    Auto = 0,
    /// Always MADV_FREE: cheapest to reuse, but the pages count in RSS until the kernel takes them.
    Free = 1,
    /// Always MADV_DONTNEED: RSS falls at once; a reused block faults its pages in again.
    DontNeed = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaPool {
    Split,
    Binned,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsOutput {
    Off,
    Stderr,
    /// JSON to the path in `Config::stats_path`.
    Json,
}

/// A device memory cap: absolute bytes or a percentage of the device's total memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceLimit {
    Unlimited,
    Bytes(u64),
    Percent(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub disabled: bool,
    pub threshold_bytes: u64,
    /// None: the bound follows the live peak (Note [Bounds follow the working set]).
    pub cache_blocks: Option<usize>,
    /// None: the bound follows the live peak, up to a quarter of physical or cgroup memory.
    pub cache_bytes: Option<u64>,
    pub release_ms: u64,
    pub release: Release,
    /// Reset every freed block's pages, not only those the program changed through libc
    /// (Note [Pages the program changed]).
    pub reset_always: bool,
    pub expire_ms: u64,
    /// None: follows how many blocks are live (Note [Neighbours merge]).
    pub max_waste_percent: Option<u64>,
    pub hugepages: HugePages,
    pub stats: StatsOutput,
    pub stats_path: [u8; STATS_PATH_MAX],
    /// TENSORMALLOC_TRACE's path; empty: no trace.
    pub trace_path: [u8; STATS_PATH_MAX],
    /// TENSORMALLOC_SNAPSHOT_AT_EXIT's path; empty: no snapshot at exit.
    pub snapshot_path: [u8; STATS_PATH_MAX],
    pub leaks: bool,
    /// Which failures print the out-of-memory report (report/oom.rs).
    pub oom_report: OomReport,
    pub check_free: bool,
    pub cuda_pool: CudaPool,
    pub cuda_limit: DeviceLimit,
    pub cuda_host_cache_bytes: u64,
    pub cuda_sync: CudaSync,
    /// A device segment with no live block, idle this long, goes back to the driver.
    pub cuda_release_ms: u64,
    /// Below this percent of a device's memory free (the driver's figure), idle segments go
    /// back after PRESSURE_IDLE_NS rather than the release delay; 0: never.
    pub cuda_release_below_percent: u64,
    /// How long a process whose device allocation failed waits for the other processes on the
    /// GPU to give back their idle memory (Note [Neighbours]); 0: no cooperation.
    pub cuda_neighbour_wait_ms: u64,
    /// Note [Expandable segments]: what the pool's segments are.
    pub cuda_segments: CudaSegments,
}

/// What a device pool's segments are (Note [Expandable segments] in device/pool/chunks.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaSegments {
    /// cuMemAlloc'd segments, as PyTorch's default.
    Classic,
    /// Reserved address ranges backed chunk by chunk with the driver's virtual memory API.
    Expandable,
}

/// When a block freed with cudaFree/cudaFreeHost is synchronized (Note [Safe reuse]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaSync {
    /// Inside cudaFree, as the runtime does: the program sees the same semantics.
    Free,
    /// Only before the block is reused: cudaFree is no longer a synchronization point.
    Reuse,
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}

impl Config {
    pub const DEFAULT: Config = Config {
            disabled: false,
            // glibc's own mmap threshold: from here up glibc maps and unmaps every block (until
            // its threshold rises past one), so the loop of a training step faults (issue 38).
            threshold_bytes: 128 * KIB,
            cache_blocks: None,
            cache_bytes: None,
            release_ms: 1000,
            release: Release::Auto,
            reset_always: false,
            expire_ms: 10_000,
            max_waste_percent: None,
            hugepages: HugePages::Auto,
            stats: StatsOutput::Off,
            stats_path: [0; STATS_PATH_MAX],
            trace_path: [0; STATS_PATH_MAX],
            snapshot_path: [0; STATS_PATH_MAX],
            leaks: false,
            oom_report: OomReport::Device,
            check_free: true,
            cuda_pool: CudaPool::Split,
            cuda_limit: DeviceLimit::Unlimited,
            cuda_host_cache_bytes: GIB,
            cuda_sync: CudaSync::Free,
            cuda_release_ms: 10_000,
            cuda_release_below_percent: 10,
            cuda_neighbour_wait_ms: 1000,
            cuda_segments: CudaSegments::Classic,
        };
}

/// One row of the options table.
pub struct OptionSpec {
    pub name: &'static str,
    /// The default as a user would write it (applying it gives `Config::DEFAULT`'s field: a
    /// test checks); off is always shown `off`, on `1`.
    pub default: &'static str,
    pub group: Group,
    pub doc: &'static str,
    /// Earlier names, still read as this one, each with one line naming this one.
    pub old_names: &'static [&'static str],
    /// Other spellings read as this name without a word (US and UK).
    pub spellings: &'static [&'static str],
    apply: fn(&mut Config, &[u8]) -> Result<(), Reason>,
}

/// Where a setting is listed (`tensormalloc --help`, docs/configuration.md), as mimalloc's
/// options come in tiers: what most users set first, then by what the setting tunes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Main,
    Host,
    Device,
    Reports,
    Tools,
}

impl Group {
    pub const ALL: [Group; 5] = [Group::Main, Group::Host, Group::Device, Group::Reports, Group::Tools];

    pub const fn title(self) -> &'static str {
        match self {
            Group::Main => "What most users set",
            Group::Host => "The host cache",
            Group::Device => "The device pool",
            Group::Reports => "Reports",
            Group::Tools => "The tools",
        }
    }
}

/// Why a value was refused: a fixed phrase, or a number outside the range the setting allows
/// (which the warning states).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Text(&'static str),
    OutOfRange { lo: u64, hi: u64, unit: Unit },
}

/// How a range's ends are written: `0 to 128`, `4K to 1T`, `0 to 86400000 ms`, `1% to 100%`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Count,
    Size,
    Ms,
    Percent,
}

impl From<&'static str> for Reason {
    fn from(text: &'static str) -> Self {
        Reason::Text(text)
    }
}

/// A size as the settings take it: the largest binary suffix that divides it exactly (4K, 1T).
struct SizeShown(u64);

impl fmt::Display for SizeShown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (mult, suffix) in [(TIB, "T"), (GIB, "G"), (MIB, "M"), (KIB, "K")] {
            if n != 0 && n.is_multiple_of(mult) {
                return write!(f, "{}{}", n / mult, suffix);
            }
        }
        write!(f, "{n}")
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reason::Text(text) => f.write_str(text),
            Reason::OutOfRange { lo, hi, unit } => {
                f.write_str("out of range (allowed: ")?;
                match unit {
                    Unit::Count => write!(f, "{lo} to {hi}"),
                    Unit::Size => write!(f, "{} to {}", SizeShown(lo), SizeShown(hi)),
                    Unit::Ms => write!(f, "{lo} to {hi} ms"),
                    Unit::Percent => write!(f, "{lo}% to {hi}%"),
                }?;
                f.write_str(")")
            }
        }
    }
}


/// What was said of one variable; `Display` gives the one line.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError<'a> {
    /// Not a setting; the nearest name, when one is near.
    Unknown { name: &'a [u8], nearest: Option<&'static str> },
    /// A bad value, under `given` (the name or an earlier name): the setting keeps its value.
    Invalid { spec: &'static OptionSpec, given: &'a [u8], value: &'a [u8], reason: Reason },
    /// An earlier name: its value WAS applied, as `spec`'s; the line names the new one.
    Renamed { old: &'static str, spec: &'static OptionSpec },
    /// An earlier name set beside the name itself: ignored.
    Shadowed { old: &'static str, spec: &'static OptionSpec },
}

impl fmt::Debug for OptionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for OptionSpec {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for OptionSpec {}

/// Shows at most this many bytes of a bad value, so one line stays one line.
const VALUE_SHOWN_MAX: usize = 64;

fn show_bytes(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for &b in bytes.iter().take(VALUE_SHOWN_MAX) {
        if b.is_ascii_graphic() || b == b' ' {
            fmt::Write::write_char(f, b as char)?;
        } else {
            write!(f, "\\x{b:02x}")?;
        }
    }
    if bytes.len() > VALUE_SHOWN_MAX {
        f.write_str("...")?;
    }
    Ok(())
}

impl fmt::Display for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Unknown { name, nearest } => {
                show_bytes(f, name)?;
                f.write_str(" is not a tensormalloc setting; ignored")?;
                match nearest {
                    Some(near) => write!(f, " (did you mean {near}?)"),
                    None => Ok(()),
                }
            }
            ConfigError::Invalid { spec, given, value, reason } => {
                show_bytes(f, given)?;
                f.write_str("='")?;
                show_bytes(f, value)?;
                write!(f, "' is {}; using the default {}", reason, spec.default)?;
                if *given != spec.name.as_bytes() && !spec.spellings.iter().any(|s| s.as_bytes() == *given) {
                    write!(f, " ({} is now {})", core::str::from_utf8(given).unwrap_or("?"), spec.name)?;
                }
                Ok(())
            }
            ConfigError::Renamed { old, spec } => {
                write!(f, "{old} is now {}: read as that (the old name will go)", spec.name)
            }
            ConfigError::Shadowed { old, spec } => {
                write!(f, "{old} is now {0}, which is set too: {old} ignored, {0} used", spec.name)
            }
        }
    }
}

impl Config {
    /// Every `TENSORMALLOC_*` variable `vars` gives (it calls its argument with each name and
    /// value, and is called twice), each error to `warn`. A setting given under its name and an
    /// earlier name too takes its name's value, whatever their order in the environment: the
    /// earlier name is ignored, with a line.
    pub fn from_vars(vars: impl Fn(&mut dyn FnMut(&[u8], &[u8])), mut warn: impl FnMut(ConfigError<'_>)) -> Config {
        // Which settings are set under their own name (or spelling), by place in OPTIONS.
        let index = |spec: &OptionSpec| OPTIONS.iter().position(|o| core::ptr::eq(o, spec));
        let mut named = [false; OPTIONS.len()];
        vars(&mut |name, value| {
            if let Some((spec, names::Found::Name | names::Found::Spelling)) = names::find(name).filter(|_| !trim_ascii(value).is_empty()) {
                if let Some(n) = index(spec).and_then(|i| named.get_mut(i)) {
                    *n = true;
                }
            }
        });
        let mut config = Config::default();
        vars(&mut |name, value| {
            if let Some((spec, names::Found::Old(old))) = names::find(name).filter(|_| !trim_ascii(value).is_empty()) {
                if index(spec).and_then(|i| named.get(i)) == Some(&true) {
                    warn(ConfigError::Shadowed { old, spec });
                    return;
                }
            }
            if let Err(e) = config.apply(name, value) {
                warn(e);
            }
        });
        config
    }

    /// Applies one variable (an empty value: none, as if unset). On `Err` the setting
    /// keeps the value it had (the default, when applied to a fresh `Config`), except for
    /// `Renamed`, whose value was applied: that line only names the new name.
    pub fn apply<'a>(&mut self, name: &'a [u8], value: &'a [u8]) -> Result<(), ConfigError<'a>> {
        let (spec, found) = names::find(name).ok_or(ConfigError::Unknown { name, nearest: names::nearest(name) })?;
        let given = trim_ascii(value);
        if given.is_empty() {
            // The variable unset: whatever another name of it set stays.
            return Ok(());
        }
        let mut trial = *self;
        if let Err(reason) = (spec.apply)(&mut trial, given) {
            return Err(ConfigError::Invalid { spec, given: name, value, reason });
        }
        *self = trial;
        match found {
            names::Found::Old(old) => Err(ConfigError::Renamed { old, spec }),
            names::Found::Name | names::Found::Spelling => Ok(()),
        }
    }

    pub fn stats_path(&self) -> &[u8] {
        until_nul(&self.stats_path)
    }

    pub fn trace_path(&self) -> &[u8] {
        until_nul(&self.trace_path)
    }

    pub fn snapshot_path(&self) -> &[u8] {
        until_nul(&self.snapshot_path)
    }
}
