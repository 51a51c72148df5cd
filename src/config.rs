//! The one options table: every `TENSORMALLOC_*` variable with its default, parser, range and
//! one-line doc. Pure: `Config::apply` takes a name and a value and says what was wrong; the
//! caller (lib.rs) reads the environment and prints warnings. A test checks the README's table.

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

/// How an idle cached block gives its pages back (Note [What RSS shows] in host/host_layer.rs).
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
    /// Print the out-of-memory report (report/oom.rs).
    pub oom_report: bool,
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
            oom_report: true,
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
    pub default: &'static str,
    pub doc: &'static str,
    apply: fn(&mut Config, &[u8]) -> Result<(), Reason>,
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

const SIZE_HINT: &str = "not a size (use bytes or a K/M/G/T suffix, e.g. 4M)";
const MS_HINT: &str = "not a number of milliseconds";

pub static OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "TENSORMALLOC_DISABLE",
        default: "0",
        doc: "1: pass every call straight to the next allocator and the CUDA runtime (for profilers and memory tools)",
        apply: |c, v| {
            c.disabled = parse_bool(v)?;
            Ok(())
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_THRESHOLD",
        default: "128K",
        doc: "requests of this size and more are served by the large-block cache (4K to 1T)",
        apply: |c, v| parse_size_in(v, 4 * KIB, TIB).map(|n| c.threshold_bytes = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_CACHE_BLOCKS",
        default: "auto",
        doc: "most freed large blocks kept for reuse (0 to 1024; 0 turns the cache off); auto: as many as were live at the recent peak, at least 16",
        apply: |c, v| auto_or(v, |v| parse_u64_in(v, 0, MAX_CACHE_BLOCKS as u64, Unit::Count)).map(|n| c.cache_blocks = n.map(|n| n as usize)),
    },
    OptionSpec {
        name: "TENSORMALLOC_CACHE_BYTES",
        default: "auto",
        doc: "most bytes kept in freed large blocks; auto: as many as were live at the recent peak, at least 1G, at most a quarter of physical memory or of the cgroup's limit",
        apply: |c, v| auto_or(v, |v| parse_size_in(v, 0, 64 * TIB)).map(|n| c.cache_bytes = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_RELEASE_MS",
        default: "1000",
        doc: "a cached block idle this long is released with MADV_FREE (the kernel may take it back)",
        apply: |c, v| parse_u64_in(v, 0, 86_400_000, Unit::Ms).map(|n| c.release_ms = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_RELEASE",
        default: "auto",
        doc: "how idle blocks leave RSS: free (MADV_FREE: counted in RSS until the kernel needs the pages), dontneed (MADV_DONTNEED: RSS falls at once, reuse faults again), auto: free while the cgroup and the system have room, dontneed near a limit",
        apply: |c, v| {
            let choices: &[(&[u8], Release)] = &[(b"auto", Release::Auto), (b"free", Release::Free), (b"dontneed", Release::DontNeed)];
            choose(v, choices, "not one of auto, free, dontneed").map(|r| c.release = r)
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_RESET",
        default: "changed",
        doc: "which freed blocks get their protection, locks and advice reset before reuse: changed (those the program changed through libc's mprotect, madvise, mlock, munmap...), always (every one, ~5 us per free: for programs that change pages with raw system calls)",
        apply: |c, v| {
            let choices: &[(&[u8], bool)] = &[(b"changed", false), (b"always", true)];
            choose(v, choices, "not one of changed, always").map(|a| c.reset_always = a)
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_EXPIRE_MS",
        default: "10000",
        doc: "a cached block idle this long is unmapped",
        apply: |c, v| parse_u64_in(v, 0, 86_400_000, Unit::Ms).map(|n| c.expire_ms = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_MAX_WASTE",
        default: "auto",
        doc: "percent of a cached block a request may leave unused; past it the rest is split off and stays cached (0 to 100); auto: 50 while at most 16 large blocks were live at the recent peak, 10 with more",
        apply: |c, v| auto_or(v, |v| parse_u64_in(v, 0, 100, Unit::Count)).map(|n| c.max_waste_percent = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_CHECK_FREE",
        default: "1",
        doc: "1: free/realloc of a pointer inside a large block aborts as glibc does; 0: skip the check on small frees",
        apply: |c, v| {
            c.check_free = parse_bool(v)?;
            Ok(())
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_HUGEPAGES",
        default: "auto",
        doc: "auto: 2 MiB-align blocks of 4 MiB+ so MADV_HUGEPAGE works; always: also advise it; never",
        apply: |c, v| {
            let choices: &[(&[u8], HugePages)] = &[(b"auto", HugePages::Auto), (b"always", HugePages::Always), (b"never", HugePages::Never)];
            choose(v, choices, "not one of auto, always, never").map(|h| c.hugepages = h)
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_STATS",
        default: "0",
        doc: "1: print a report to stderr at exit, and the numbers of the processes it started that ended without theirs; json:PATH: write it as JSON to PATH (%p: the process id; files are 0600, never written through a symlink; until a normal exit the file holds the process's counts, which tensormalloc report reads); 0, off, none, false or empty: none",
        apply: |c, v| {
            if let Some(path) = v.strip_prefix(b"json:") {
                if path.is_empty() || path.len() >= STATS_PATH_MAX {
                    return Err("json: needs a path of 1 to 255 bytes".into());
                }
                set_path(&mut c.stats_path, path)?;
                c.stats = if c.stats_path().is_empty() { StatsOutput::Off } else { StatsOutput::Json };
                return Ok(());
            }
            if means_off(v) {
                c.stats = StatsOutput::Off;
                return Ok(());
            }
            c.stats = if parse_bool(v)? { StatsOutput::Stderr } else { StatsOutput::Off };
            Ok(())
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_TRACE",
        default: "off",
        doc: "PATH: record large allocations and frees (and memory samples) to PATH, for tensormalloc plot (scripts/plot-trace); %p: the process id; off, 0, none, false or empty: no trace",
        apply: |c, v| set_path(&mut c.trace_path, v),
    },
    OptionSpec {
        name: "TENSORMALLOC_SNAPSHOT_AT_EXIT",
        default: "off",
        doc: "PATH: at exit, write the device pools' segments and blocks, who holds them, and the recent allocations and frees to PATH as a PyTorch memory snapshot (python -m torch.cuda._memory_viz, pytorch.org/memory_viz), and the host's to PATH.host.pickle; %p: the process id; off, 0, none, false or empty: none",
        apply: |c, v| set_path(&mut c.snapshot_path, v),
    },
    OptionSpec {
        name: "TENSORMALLOC_LEAKS",
        default: "0",
        doc: "1: at exit, list large host and device blocks still live",
        apply: |c, v| {
            c.leaks = parse_bool(v)?;
            Ok(())
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_OOM_REPORT",
        default: "1",
        doc: "1: when memory runs out for good (a device allocation after the pool gave its cache back, a host mapping a limit could allow), print who holds it to stderr, at most once per 10 s; 0: stay silent (the JSON stats keep last_oom)",
        apply: |c, v| {
            c.oom_report = parse_bool(v)?;
            Ok(())
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_POOL",
        default: "split",
        doc: "device pool strategy: split (blocks split and merged), binned (size classes), none (pass through)",
        apply: |c, v| {
            let choices: &[(&[u8], CudaPool)] = &[(b"split", CudaPool::Split), (b"binned", CudaPool::Binned), (b"none", CudaPool::None)];
            choose(v, choices, "not one of split, binned, none").map(|p| c.cuda_pool = p)
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_LIMIT",
        default: "0",
        doc: "cap on device memory the pool reserves per device: bytes (K/M/G) or a percent like 80%; 0: none",
        apply: |c, v| {
            if let Some(pct) = v.strip_suffix(b"%") {
                let p = parse_u64_in(pct, 1, 100, Unit::Percent)?;
                c.cuda_limit = DeviceLimit::Percent(p);
            } else {
                let n = parse_size_in(v, 0, 64 * TIB)?;
                c.cuda_limit = if n == 0 { DeviceLimit::Unlimited } else { DeviceLimit::Bytes(n) };
            }
            Ok(())
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_HOST_CACHE_BYTES",
        default: "1G",
        doc: "most bytes of freed pinned host memory (cudaMallocHost/cudaHostAlloc) kept for reuse",
        apply: |c, v| parse_size_in(v, 0, 64 * TIB).map(|n| c.cuda_host_cache_bytes = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_SYNC",
        default: "free",
        doc: "free: cudaFree synchronizes the device as the runtime does; reuse: only before a freed block is reused",
        apply: |c, v| {
            let choices: &[(&[u8], CudaSync)] = &[(b"free", CudaSync::Free), (b"reuse", CudaSync::Reuse)];
            choose(v, choices, "not one of free, reuse").map(|s| c.cuda_sync = s)
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_RELEASE_MS",
        default: "10000",
        doc: "a device segment with no live block, idle this long, is given back to the driver by the background thread, for other processes on the GPU (0 to 86400000 ms)",
        apply: |c, v| parse_u64_in(v, 0, 86_400_000, Unit::Ms).map(|n| c.cuda_release_ms = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_RELEASE_BELOW",
        default: "10",
        doc: "when less than this percent of a device's memory is free (the driver's figure: other processes need it), device segments idle for a second go back to the driver at once, not after TENSORMALLOC_CUDA_RELEASE_MS (0 to 100; 0: never)",
        apply: |c, v| parse_u64_in(v, 0, 100, Unit::Percent).map(|n| c.cuda_release_below_percent = n),
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_SEGMENTS",
        default: "classic",
        doc: "classic: device segments from cuMemAlloc; expandable: reserved address ranges backed 2 MiB chunk by chunk (the driver's virtual memory API), so free memory between live blocks goes back to the driver and a request that fits in the device's free memory never fails for fragmentation (IPC handles of its blocks are tensormalloc's own, which a process under the preload opens)",
        apply: |c, v| {
            let choices: &[(&[u8], CudaSegments)] = &[(b"classic", CudaSegments::Classic), (b"expandable", CudaSegments::Expandable)];
            choose(v, choices, "not one of classic, expandable").map(|s| c.cuda_segments = s)
        },
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_NEIGHBOUR_WAIT_MS",
        default: "1000",
        doc: "a device allocation that fails, our own cache given back, asks this user's other processes on the GPU to give back their idle segments and waits at most this long for their answers before retrying (0 to 60000 ms; 0: neither ask nor answer)",
        apply: |c, v| parse_u64_in(v, 0, 60_000, Unit::Ms).map(|n| c.cuda_neighbour_wait_ms = n),
    },
    // Read by the tools, not by the library: listed so that setting it draws no warning.
    OptionSpec {
        name: "TENSORMALLOC_LIB",
        default: "auto",
        doc: "PATH of the libtensormalloc.so that the tensormalloc command, scripts/tensormalloc and the Python package load (auto: the package's own, else target/release); the library ignores it",
        apply: |_, _| Ok(()),
    },
];

/// What was wrong with one variable; `Display` gives the one warning line.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError<'a> {
    Unknown { name: &'a [u8] },
    Invalid { spec: &'static OptionSpec, value: &'a [u8], reason: Reason },
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
            ConfigError::Unknown { name } => {
                show_bytes(f, name)?;
                f.write_str(" is not a tensormalloc setting; ignored")
            }
            ConfigError::Invalid { spec, value, reason } => {
                write!(f, "{}='", spec.name)?;
                show_bytes(f, value)?;
                write!(f, "' is {}; using the default {}", reason, spec.default)
            }
        }
    }
}

impl Config {
    /// Applies one variable. On error the field keeps the value it had (the default, when
    /// applied to a fresh `Config`).
    pub fn apply<'a>(&mut self, name: &'a [u8], value: &'a [u8]) -> Result<(), ConfigError<'a>> {
        let spec = OPTIONS.iter().find(|s| s.name.as_bytes() == name).ok_or(ConfigError::Unknown { name })?;
        let mut trial = *self;
        match (spec.apply)(&mut trial, trim_ascii(value)) {
            Ok(()) => {
                *self = trial;
                Ok(())
            }
            Err(reason) => Err(ConfigError::Invalid { spec, value, reason }),
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

fn until_nul(buf: &[u8; STATS_PATH_MAX]) -> &[u8] {
    let len = buf.iter().position(|&b| b == 0).unwrap_or(STATS_PATH_MAX);
    buf.get(..len).unwrap_or(&[])
}

fn trim_ascii(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    v.get(start..end).unwrap_or(&[])
}

/// One of a fixed set of words.
fn choose<T: Copy>(v: &[u8], choices: &[(&[u8], T)], hint: &'static str) -> Result<T, Reason> {
    choices.iter().find(|(word, _)| *word == v).map(|&(_, t)| t).ok_or(Reason::Text(hint))
}

/// `auto` (None) or a value for `parse`.
fn auto_or(v: &[u8], parse: impl Fn(&[u8]) -> Result<u64, Reason>) -> Result<Option<u64>, Reason> {
    if trim_ascii(v).eq_ignore_ascii_case(b"auto") {
        return Ok(None);
    }
    parse(v).map(Some)
}

/// A boolean as the messages offer it: 1, yes, true, on / 0, no, false, off, in any case.
pub fn parse_bool(v: &[u8]) -> Result<bool, &'static str> {
    let is = |word: &[u8]| v.eq_ignore_ascii_case(word);
    if is(b"1") || is(b"yes") || is(b"true") || is(b"on") {
        Ok(true)
    } else if is(b"0") || is(b"no") || is(b"false") || is(b"off") {
        Ok(false)
    } else {
        Err("not a boolean (use 1 or 0)")
    }
}

/// Words that turn a path setting off (any case), as does an empty value.
fn means_off(v: &[u8]) -> bool {
    v.is_empty() || [&b"off"[..], b"0", b"none", b"false", b"no"].iter().any(|w| v.eq_ignore_ascii_case(w))
}

/// A path setting: off (an empty path) for `means_off`, else the path (1 to 255 bytes; `%p`
/// in it becomes the process id when the file is written, `%%` a percent sign).
fn set_path(slot: &mut [u8; STATS_PATH_MAX], v: &[u8]) -> Result<(), Reason> {
    *slot = [0; STATS_PATH_MAX];
    if means_off(v) {
        return Ok(());
    }
    if v.len() >= STATS_PATH_MAX {
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

fn parse_u64_in(v: &[u8], lo: u64, hi: u64, unit: Unit) -> Result<u64, Reason> {
    let n = parse_u64(v).ok_or(if unit == Unit::Ms { MS_HINT } else { "not a whole number" })?;
    if n < lo || n > hi {
        return Err(Reason::OutOfRange { lo, hi, unit });
    }
    Ok(n)
}

/// Bytes with an optional binary suffix: `4096`, `512K`, `4M`, `4MiB`, `1g`, `2T`.
pub fn parse_size(v: &[u8]) -> Option<u64> {
    let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
    let (num, suffix) = v.split_at(digits);
    let n = parse_u64(num)?;
    const SUFFIXES: [(&[u8], u64); 13] = [
        (b"", 1), (b"b", 1),
        (b"k", KIB), (b"kb", KIB), (b"kib", KIB),
        (b"m", MIB), (b"mb", MIB), (b"mib", MIB),
        (b"g", GIB), (b"gb", GIB), (b"gib", GIB),
        (b"t", TIB), (b"tib", TIB),
    ];
    // eq_ignore_ascii_case, not to_ascii_lowercase: this runs during init, before the next
    // allocator is resolved, so it must not allocate.
    let (_, mult) = SUFFIXES.iter().find(|(s, _)| s.eq_ignore_ascii_case(suffix))?;
    n.checked_mul(*mult)
}

fn parse_size_in(v: &[u8], lo: u64, hi: u64) -> Result<u64, Reason> {
    let n = parse_size(v).ok_or(SIZE_HINT)?;
    if n < lo || n > hi {
        return Err(Reason::OutOfRange { lo, hi, unit: Unit::Size });
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size(b"4096"), Some(4096));
        assert_eq!(parse_size(b"4M"), Some(4 * MIB));
        assert_eq!(parse_size(b"4mib"), Some(4 * MIB));
        assert_eq!(parse_size(b"1G"), Some(GIB));
        assert_eq!(parse_size(b"2T"), Some(2 * TIB));
        for bad in [&b""[..], b"-1", b"M", b"4X", b"1.5G", b" ", b"99999999999999999999999", b"18446744073709551615K"] {
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
            (b"TENSORMALLOC_RELEASE_MS", b"86400001", "out of range (allowed: 0 to 86400000 ms)"),
            (b"TENSORMALLOC_CUDA_LIMIT", b"0%", "out of range (allowed: 1% to 100%)"),
            (b"TENSORMALLOC_CACHE_BYTES", b"65T", "out of range (allowed: 0 to 64T)"),
        ];
        for (name, value, want) in cases {
            let line = c.apply(name, value).unwrap_err().to_string();
            assert!(line.contains(want), "{line}");
        }
        let line = c.apply(b"TENSORMALLOC_RELEASE_MS", b"soon").unwrap_err().to_string();
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

    /// python/tensormalloc/_settings.py (what `tensormalloc --help` lists) is this table, as
    /// this test writes it: `TENSORMALLOC_BLESS=1 cargo test --lib python_settings` rewrites it.
    #[test]
    fn python_settings_match_options() {
        let mut want = String::from(
            "# Generated from OPTIONS in src/config.rs by its test python_settings_match_options\n\
             # (TENSORMALLOC_BLESS=1 cargo test --lib python_settings rewrites it); do not edit.\n\
             # (name, default, doc): what `tensormalloc --help` lists.\nSETTINGS = (\n",
        );
        for spec in OPTIONS {
            want.push_str(&format!("    ({:?}, {:?},\n     {:?}),\n", spec.name, spec.default, spec.doc));
        }
        want.push_str(")\n");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/python/tensormalloc/_settings.py");
        if std::env::var_os("TENSORMALLOC_BLESS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(have == want, "{path} is out of date: run TENSORMALLOC_BLESS=1 cargo test --lib python_settings");
    }

    /// The README documents exactly the variables in this table, with the same defaults.
    #[test]
    fn readme_table_matches_options() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `TENSORMALLOC_")).collect();
        assert_eq!(rows.len(), OPTIONS.len(), "README rows: {rows:#?}");
        for spec in OPTIONS {
            let row = rows.iter().find(|r| r.starts_with(&format!("| `{}`", spec.name)));
            let row = row.unwrap_or_else(|| panic!("{} missing from README", spec.name));
            assert!(row.contains(&format!("| `{}` |", spec.default)), "{} default in README: {row}", spec.name);
        }
    }
}
