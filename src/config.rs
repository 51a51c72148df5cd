//! The one options table: every `TENSORMALLOC_*` variable with its default, group, parser, range,
//! one-line doc and earlier names (Note [One vocabulary]). Pure: `Config::apply` takes a name and
//! a value and says what to tell the user; the caller (state.rs) reads the environment and prints
//! the line. `tensormalloc --help`, docs/configuration.md and the README's settings are written
//! from this table (config/generated.rs); names.rs finds a name and the nearest to a near miss.

mod names;
pub mod glibc;
#[cfg(test)]
mod generated;

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

const SIZE_HINT: &str = "not a size (use bytes or a K/M/G/T suffix, e.g. 4M)";
const MS_HINT: &str = "not a number of milliseconds";

// Note [One vocabulary]
// The words the settings, their docs, the reports and the docs/ pages share:
// - large: a request of TENSORMALLOC_THRESHOLD or more (host), every device request.
// - cached, idle: a freed large block the host cache keeps, or a device segment (expandable:
//   a 2 MiB chunk) with no live block; idle is how long it has been so.
// - release: memory goes back to the system. A host block's pages go to the kernel (its address
//   range stays mapped, so its reuse is a page fault, not a system call): lazily (MADV_FREE,
//   counted in RSS until the kernel needs them) or now (MADV_DONTNEED), TENSORMALLOC_HOST_RELEASE
//   says which. A device segment is freed to the driver. Both after an idle delay
//   (TENSORMALLOC_HOST_RELEASE_MS, TENSORMALLOC_CUDA_RELEASE_MS), and both counted as released in
//   the report and the JSON.
// - unmap: the host block's address range goes too (TENSORMALLOC_HOST_UNMAP_MS).
// - off: shown `off`; 0, no, none, false (any case) mean it too wherever a setting can be off.
//   On is shown `1`; on, yes, true mean it too. An empty value is the variable unset.
// Earlier names (TENSORMALLOC_RELEASE_MS, _RELEASE, _EXPIRE_MS, where "free" meant MADV_FREE
// beside TENSORMALLOC_CUDA_SYNC's "free", cudaFree) are still read, each with one line naming
// the new one; a name that is none of them gets the nearest one suggested (config/names.rs).

/// The fields no row sets: no earlier name, no other spelling.
const PLAIN: OptionSpec = OptionSpec {
    name: "",
    default: "",
    group: Group::Main,
    doc: "",
    old_names: &[],
    spellings: &[],
    apply: |_, _| Ok(()),
};

pub static OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "TENSORMALLOC_DISABLE",
        default: "off",
        doc: "1: pass every call straight to the next allocator and to CUDA, as if tensormalloc were not loaded (for profilers and memory tools)",
        apply: |c, v| parse_bool(v).map(|b| c.disabled = b),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_THRESHOLD",
        default: "128K",
        doc: "requests of this size and more are large: the host cache serves them; smaller ones go to the next allocator (4K to 1T)",
        apply: |c, v| parse_size_in(v, 4 * KIB, TIB).map(|n| c.threshold_bytes = n),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_STATS",
        default: "off",
        doc: "1: print a report to stderr at exit, and the numbers of the processes it started that ended without theirs; json:PATH: write it as JSON to PATH (%p: the process id; until a normal exit the file holds the process's counts, which tensormalloc report reads)",
        apply: |c, v| {
            if let Some(path) = v.strip_prefix(b"json:") {
                if means_off(path) || path.len() >= STATS_PATH_MAX {
                    return Err("json: needs a path of 1 to 255 bytes".into());
                }
                set_path(&mut c.stats_path, path)?;
                c.stats = StatsOutput::Json;
                return Ok(());
            }
            c.stats = match parse_bool(v) {
                Ok(true) => StatsOutput::Stderr,
                Ok(false) => StatsOutput::Off,
                Err(_) => return Err("not 1, off or json:PATH".into()),
            };
            Ok(())
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_TRACE",
        default: "off",
        doc: "PATH: record every large allocation and free, and memory every 100 ms, to PATH, for tensormalloc plot (%p: the process id)",
        apply: |c, v| set_path(&mut c.trace_path, v),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_LEAKS",
        default: "off",
        doc: "1: at exit, list the large host and device blocks still live, by the holder and function that asked for them",
        apply: |c, v| parse_bool(v).map(|b| c.leaks = b),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_HOST_RELEASE_MS",
        default: "1000",
        doc: "a cached host block idle this long is released: its pages go back to the kernel, as TENSORMALLOC_HOST_RELEASE says (0 to 86400000 ms)",
        old_names: &["TENSORMALLOC_RELEASE_MS"],
        apply: |c, v| parse_u64_in(v, 0, 86_400_000, Unit::Ms).map(|n| c.release_ms = n),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_RELEASE_MS",
        default: "10000",
        doc: "a device segment with no live block, idle this long, is released: freed to the driver, for other processes on the GPU (0 to 86400000 ms)",
        apply: |c, v| parse_u64_in(v, 0, 86_400_000, Unit::Ms).map(|n| c.cuda_release_ms = n),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_SEGMENTS",
        default: "classic",
        doc: "classic: device segments from cuMemAlloc; expandable: reserved address ranges backed 2 MiB chunk by chunk (the driver's virtual memory API), so idle memory between live blocks is released and a request that fits in the device's free memory never fails for fragmentation (IPC handles of its blocks are tensormalloc's own, which a process under the preload opens)",
        apply: |c, v| {
            let choices: &[(&[u8], CudaSegments)] = &[(b"classic", CudaSegments::Classic), (b"expandable", CudaSegments::Expandable)];
            choose(v, choices, "not one of classic, expandable").map(|s| c.cuda_segments = s)
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_LIMIT",
        default: "off",
        doc: "cap on the device memory the pool reserves on each device: bytes (K/M/G/T) or a percent of the device, like 80%",
        apply: |c, v| {
            if means_off(v) {
                c.cuda_limit = DeviceLimit::Unlimited;
            } else if let Some(pct) = v.strip_suffix(b"%") {
                c.cuda_limit = DeviceLimit::Percent(parse_u64_in(pct, 1, 100, Unit::Percent)?);
            } else {
                let n = parse_size_in(v, 0, 64 * TIB)?;
                c.cuda_limit = if n == 0 { DeviceLimit::Unlimited } else { DeviceLimit::Bytes(n) };
            }
            Ok(())
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_SYNC",
        default: "free",
        doc: "free: cudaFree synchronizes the device, as the CUDA runtime's does; reuse: only before a freed block is handed out again (faster where the program frees while kernels run)",
        apply: |c, v| {
            let choices: &[(&[u8], CudaSync)] = &[(b"free", CudaSync::Free), (b"reuse", CudaSync::Reuse)];
            choose(v, choices, "not one of free, reuse").map(|s| c.cuda_sync = s)
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CACHE_BLOCKS",
        default: "auto",
        group: Group::Host,
        doc: "most freed large blocks the host cache keeps (0 to 1024; off: none, the cache is off); auto: as many as were live at the recent peak, at least 16",
        apply: |c, v| {
            if means_off(v) {
                c.cache_blocks = Some(0);
                return Ok(());
            }
            auto_or(v, |v| parse_u64_in(v, 0, MAX_CACHE_BLOCKS as u64, Unit::Count)).map(|n| c.cache_blocks = n.map(|n| n as usize))
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CACHE_BYTES",
        default: "auto",
        group: Group::Host,
        doc: "most bytes the host cache keeps in freed large blocks; auto: as many as were live at the recent peak, at least 1G, at most a quarter of physical memory or of the cgroup's limit (under a cgroup's limit, no more than a sixteenth of it stays hot: the rest is released at once with MADV_FREE), and nothing under ulimit -v, ulimit -d or strict overcommit (freed blocks are unmapped, as glibc's); a number: exactly that, limit or not, and the hot bound does not apply",
        apply: |c, v| auto_or(v, |v| parse_size_in(v, 0, 64 * TIB)).map(|n| c.cache_bytes = n),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_HOST_RELEASE",
        default: "auto",
        group: Group::Host,
        doc: "how an idle host block is released: lazy (MADV_FREE: the kernel takes the pages when it needs them, and until then they count in RSS), now (MADV_DONTNEED: RSS falls at once, and reuse faults the pages in again); auto: lazy while the cgroup and the system have room, now near a limit",
        old_names: &["TENSORMALLOC_RELEASE"],
        apply: |c, v| {
            // free and dontneed: the earlier words, after the madvise flags.
            let choices: &[(&[u8], Release)] = &[
                (b"auto", Release::Auto), (b"lazy", Release::Free), (b"now", Release::DontNeed),
                (b"free", Release::Free), (b"dontneed", Release::DontNeed),
            ];
            choose(v, choices, "not one of auto, lazy, now").map(|r| c.release = r)
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_HOST_UNMAP_MS",
        default: "10000",
        group: Group::Host,
        doc: "a cached host block idle this long is unmapped: its address range goes too, and it leaves the cache (0 to 86400000 ms)",
        old_names: &["TENSORMALLOC_EXPIRE_MS"],
        apply: |c, v| parse_u64_in(v, 0, 86_400_000, Unit::Ms).map(|n| c.expire_ms = n),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_MAX_WASTE",
        default: "auto",
        group: Group::Host,
        doc: "percent of a cached block a request may leave unused; past it the rest is split off and stays cached (0 to 100); auto: 50 while at most 16 large blocks were live at the recent peak, 10 with more",
        apply: |c, v| auto_or(v, |v| parse_u64_in(v, 0, 100, Unit::Count)).map(|n| c.max_waste_percent = n),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_HUGEPAGES",
        default: "auto",
        group: Group::Host,
        doc: "auto: align blocks of 4 MiB and more to 2 MiB, so the program's MADV_HUGEPAGE (numpy's) covers whole huge pages; always: also advise it on every fresh block; off: page alignment only",
        apply: |c, v| {
            if means_off(v) {
                c.hugepages = HugePages::Never;
                return Ok(());
            }
            let choices: &[(&[u8], HugePages)] = &[(b"auto", HugePages::Auto), (b"always", HugePages::Always), (b"never", HugePages::Never)];
            choose(v, choices, "not one of auto, always, off").map(|h| c.hugepages = h)
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_RESET",
        default: "changed",
        group: Group::Host,
        doc: "which freed blocks get their protection, locks and advice reset before reuse: changed (those the program changed through libc's mprotect, madvise, mlock, munmap...), always (every one, about 5 us per free: for programs that change pages with raw system calls, or with numpy's handler loaded by path, where the program's page calls pass us by)",
        apply: |c, v| {
            let choices: &[(&[u8], bool)] = &[(b"changed", false), (b"always", true)];
            choose(v, choices, "not one of changed, always").map(|a| c.reset_always = a)
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CHECK_FREE",
        default: "1",
        group: Group::Host,
        doc: "1: a free or realloc of a pointer inside a large block aborts, as glibc's does; off: skip the check on small frees",
        apply: |c, v| parse_bool(v).map(|b| c.check_free = b),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_POOL",
        default: "split",
        group: Group::Device,
        doc: "how the device pool keeps blocks: split (split and merged in segments), binned (size classes, a segment each); off: every request goes to the driver, unpooled",
        apply: |c, v| {
            if means_off(v) {
                c.cuda_pool = CudaPool::None;
                return Ok(());
            }
            let choices: &[(&[u8], CudaPool)] = &[(b"split", CudaPool::Split), (b"binned", CudaPool::Binned)];
            choose(v, choices, "not one of split, binned, off").map(|p| c.cuda_pool = p)
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_HOST_CACHE_BYTES",
        default: "1G",
        group: Group::Device,
        doc: "most bytes of freed pinned host memory (cudaMallocHost, cudaHostAlloc) kept for reuse",
        apply: |c, v| parse_size_in(v, 0, 64 * TIB).map(|n| c.cuda_host_cache_bytes = n),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_RELEASE_BELOW",
        default: "10",
        group: Group::Device,
        doc: "when less than this percent of a device's memory is free (the driver's figure: other processes need it), segments idle for a second are released at once, not after TENSORMALLOC_CUDA_RELEASE_MS (0 to 100; off: never)",
        apply: |c, v| {
            let n = if means_off(v) { 0 } else { parse_u64_in(v, 0, 100, Unit::Percent)? };
            c.cuda_release_below_percent = n;
            Ok(())
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_CUDA_NEIGHBOUR_WAIT_MS",
        default: "1000",
        group: Group::Device,
        doc: "a device allocation that fails after the pool released its own idle memory asks this user's other processes on the GPU to release theirs, and waits at most this long for their answers before trying again (0 to 60000 ms; off: neither ask nor answer)",
        spellings: &["TENSORMALLOC_CUDA_NEIGHBOR_WAIT_MS"],
        apply: |c, v| {
            let n = if means_off(v) { 0 } else { parse_u64_in(v, 0, 60_000, Unit::Ms)? };
            c.cuda_neighbour_wait_ms = n;
            Ok(())
        },
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_SNAPSHOT_AT_EXIT",
        default: "off",
        group: Group::Reports,
        doc: "PATH: at exit, write the device pools' segments and blocks, who holds them, and the recent allocations and frees to PATH as a PyTorch memory snapshot (python -m torch.cuda._memory_viz, pytorch.org/memory_viz), and the host's to PATH.host.pickle (%p: the process id)",
        apply: |c, v| set_path(&mut c.snapshot_path, v),
        ..PLAIN
    },
    OptionSpec {
        name: "TENSORMALLOC_OOM_REPORT",
        default: "device",
        group: Group::Reports,
        doc: "device: when a device allocation fails for good (after the pool released its idle memory), print who holds the memory to stderr, at most once per 10 s; 1: also when a host mapping a limit could allow fails (malloc returns NULL, as glibc's would, and says why); off: stay silent (the JSON stats keep last_oom either way)",
        apply: |c, v| {
            if v.eq_ignore_ascii_case(b"device") {
                c.oom_report = OomReport::Device;
                return Ok(());
            }
            parse_bool(v).map_err(|_| "not one of device, 1, off".into()).map(|b| c.oom_report = if b { OomReport::All } else { OomReport::Off })
        },
        ..PLAIN
    },
    // Read by the tools, not by the library: listed so that setting it draws no warning.
    OptionSpec {
        name: "TENSORMALLOC_LIB",
        default: "auto",
        group: Group::Tools,
        doc: "PATH of the libtensormalloc.so that the tensormalloc command and the Python package load (auto: the package's own, else the source tree's target/release); the library ignores it",
        apply: |_, _| Ok(()),
        ..PLAIN
    },
];

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

fn until_nul(buf: &[u8; STATS_PATH_MAX]) -> &[u8] {
    let len = buf.iter().position(|&b| b == 0).unwrap_or(STATS_PATH_MAX);
    buf.get(..len).unwrap_or(&[])
}

fn trim_ascii(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    v.get(start..end).unwrap_or(&[])
}

/// One of a fixed set of words (any case).
fn choose<T: Copy>(v: &[u8], choices: &[(&[u8], T)], hint: &'static str) -> Result<T, Reason> {
    choices.iter().find(|(word, _)| word.eq_ignore_ascii_case(v)).map(|&(_, t)| t).ok_or(Reason::Text(hint))
}

/// `auto` (None) or a value for `parse`.
fn auto_or(v: &[u8], parse: impl Fn(&[u8]) -> Result<u64, Reason>) -> Result<Option<u64>, Reason> {
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
fn set_path(slot: &mut [u8; STATS_PATH_MAX], v: &[u8]) -> Result<(), Reason> {
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
    const SUFFIXES: [(&[u8], u64); 14] = [
        (b"", 1), (b"b", 1),
        (b"k", KIB), (b"kb", KIB), (b"kib", KIB),
        (b"m", MIB), (b"mb", MIB), (b"mib", MIB),
        (b"g", GIB), (b"gb", GIB), (b"gib", GIB),
        (b"t", TIB), (b"tb", TIB), (b"tib", TIB),
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
}
