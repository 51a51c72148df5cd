//! The rows of the options table: each setting's name, default, group, doc, earlier names and
//! parser (Note [One vocabulary]).

use super::values::*;
use super::*;

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
        doc: "1: print a report to stderr at exit (none from a process that made no large request), with the counts of any child process that ended without printing its own; json:PATH: write it as JSON to PATH (%p: the process id; until a normal exit the file holds the process's counts, which tensormalloc report reads)",
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
