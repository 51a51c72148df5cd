"""Side-by-side benchmark: every workload under every allocator, interleaved in one run,
several repetitions, medians. Prints a table per workload, writes results/latest.json,
results/latest.md (the tables for BENCHMARKS.md) and results/latest.png (a chart). A partial
run (--only, or a subset of allocators) writes results/partial/ instead (not committed), so the
committed full results are never overwritten by a few workloads."""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIBDIR = "/usr/lib/x86_64-linux-gnu"
# BENCH_TENSORMALLOC: another build of the library (e.g. the previous commit, for before/after).
OURS = os.environ.get("BENCH_TENSORMALLOC", str(ROOT / "target" / "release" / "libtensormalloc.so"))

ALLOCATORS = {
    "glibc": {},
    "glibc-tuned": {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"},
    "jemalloc": {"LD_PRELOAD": f"{LIBDIR}/libjemalloc.so.2"},
    "tcmalloc": {"LD_PRELOAD": f"{LIBDIR}/libtcmalloc_minimal.so.4"},
    "mimalloc": {"LD_PRELOAD": f"{LIBDIR}/libmimalloc.so.2"},
    "tensormalloc": {"LD_PRELOAD": OURS},
    # What a bundled jemalloc for the small path would give, measured without bundling it.
    "tensormalloc+jemalloc": {"LD_PRELOAD": f"{OURS} {LIBDIR}/libjemalloc.so.2"},
}
# BENCH_BEFORE: an older build of the library, run beside the current one as "tensormalloc-before".
if os.environ.get("BENCH_BEFORE"):
    ALLOCATORS["tensormalloc-before"] = {"LD_PRELOAD": os.environ["BENCH_BEFORE"]}

C_WORKLOADS = {
    "c-large-churn": ["large_churn"],
    # The thread sweep: the same 800 replacements shared among 1, 4 and 16 threads.
    **{f"c-large-churn-{n}t": ["large_churn", str(n)] for n in (1, 4, 16)},
    # calloc, used sparsely (two pages) or densely (every element), without huge pages; the
    # numpy zeros-* workloads are the same with them (numpy advises MADV_HUGEPAGE).
    **{f"c-calloc-{kind}-{mib}M": ["calloc_churn", str(mib), kind] for kind in ("sparse", "dense") for mib in (8, 64, 256)},
    # Threads passing 1-8 MiB blocks around, calloc'd (read only, or written half or whole) or
    # malloc'd (written whole): a calloc's block was last used by someone else.
    **{f"c-calloc-threads-{n}t": ["calloc_threads", str(n)] for n in (4, 16)},
    # malloc of a large block, one page touched, freed: the cost of a sparse scratch buffer.
    **{f"c-reset-{mib}M": ["reset_cost", str(mib)] for mib in (4, 16, 64, 256)},
    # fork() with that many 8 MiB blocks freed (cached, under tensormalloc): us per fork.
    **{f"c-fork-{n}-cached": ["fork_cost", str(n)] for n in (0, 64)},
    "c-small-churn-1t": ["small_churn", "1"],
    "c-small-churn-2t": ["small_churn", "2"],
    # The same with one large block alive, as in a numpy process.
    "c-small-churn-1t-held": ["small_churn", "1", "hold"],
}


def build_c():
    out = ROOT / "target" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("large_churn", "small_churn", "calloc_churn", "calloc_threads", "reset_cost", "fork_cost"):
        subprocess.run(["gcc", "-O2", "-pthread", "-fno-builtin", "-o", str(out / name), str(HERE / "c" / f"{name}.c")], check=True)
    return out


def run_one(workload, allocator, cbin):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORMALLOC_", "MALLOC_"))}
    env.pop("LD_PRELOAD", None)
    env.update(ALLOCATORS[allocator])
    if workload in C_WORKLOADS:
        name, *args = C_WORKLOADS[workload]
        argv = [str(cbin / name), *args]
    else:
        argv = [sys.executable, str(HERE / "workloads.py"), workload]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{workload} under {allocator} failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    sys.path.insert(0, str(HERE))
    from workloads import WORKLOADS
    every = [*WORKLOADS, *C_WORKLOADS]
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="workloads: " + " ".join(every) + "\nallocators: " + " ".join(ALLOCATORS),
    )
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", "3")),
                    help="repetitions of every (workload, allocator) pair, in rotating order; each table "
                         "cell is their median (default: $BENCH_REPS, else 3)")
    ap.add_argument("--only", nargs="*", choices=every, metavar="WORKLOAD", help="workloads to run (default: all; listed below)")
    ap.add_argument("--allocators", nargs="*", choices=list(ALLOCATORS), metavar="ALLOCATOR", default=list(ALLOCATORS),
                    help="allocators to compare (default: all; listed below: glibc-tuned raises glibc's mmap and "
                         "trim thresholds, tensormalloc+jemalloc preloads jemalloc behind us)")
    args = ap.parse_args()

    names = args.only or every
    cbin = build_c()
    samples = {w: {a: [] for a in args.allocators} for w in names}
    for rep in range(args.reps):
        for i, w in enumerate(names):
            # rotate the order each time so no allocator always runs first or last
            order = args.allocators[(i + rep) % len(args.allocators):] + args.allocators[:(i + rep) % len(args.allocators)]
            for a in order:
                samples[w][a].append(run_one(w, a, cbin))
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr)

    results = {}
    for w in names:
        results[w] = {}
        for a in args.allocators:
            runs = samples[w][a]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results[w][a] = med
    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}",
        "numpy": __import__("numpy").__version__,
        "reps": args.reps,
    }
    partial = bool(args.only) or set(args.allocators) != set(ALLOCATORS)
    outdir = HERE / "results" / "partial" if partial else HERE / "results"
    outdir.mkdir(parents=True, exist_ok=True)
    meta["workloads"] = "partial: " + " ".join(names) if partial else "all"
    (outdir / "latest.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    md = render(results, meta)
    (outdir / "latest.md").write_text(md)
    print(md)
    chart(results, outdir / "latest.png")


def render(results, meta):
    lines = [f"Date {meta['date']}; {meta['machine']}; numpy {meta['numpy']}; medians of {meta['reps']} runs.", ""]
    lines.append("| workload | allocator | ms/iter | speed vs glibc (above 1x is faster) | faults/iter | peak RSS MB | held after idle MB |")
    lines.append("|---|---|---|---|---|---|---|")
    for w, per in results.items():
        base = per.get("glibc", {}).get("ms")
        for a, r in per.items():
            ratio = f"{base / r['ms']:.2f}x" if base else "-"
            held = f"{r['held_after_idle_mb']:.0f}" if "held_after_idle_mb" in r else ""
            lines.append(f"| {w} | {a} | {r['ms']:.4g} | {ratio} | {r['faults']:.1f} | {r['peak_rss_mb']:.0f} | {held} |")
    return "\n".join(lines) + "\n"


def chart(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("matplotlib missing: no chart", file=sys.stderr)
        return
    workloads = [w for w in results if "glibc" in results[w]]
    allocs = list(next(iter(results.values())))
    fig, ax = plt.subplots(figsize=(max(8, len(workloads) * 0.9), 4.5))
    width = 0.8 / len(allocs)
    for i, a in enumerate(allocs):
        speedups = [results[w]["glibc"]["ms"] / results[w][a]["ms"] for w in workloads]
        ax.bar([x + i * width for x in range(len(workloads))], speedups, width, label=a)
    ax.axhline(1.0, color="black", linewidth=0.8)
    # Ratios span 0.3x to 35x: a log axis keeps 1.1x and 0.9x as visible as 20x.
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))])
    ax.set_xticklabels(workloads, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("speed vs glibc, log scale (higher is better)")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
