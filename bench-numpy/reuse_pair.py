"""The reuse pair: malloc a large block, write one byte, free it (c/reset_cost.c), at 4, 64 and
256 MiB, under tcmalloc, tuned glibc, glibc, jemalloc and tensormalloc, in interleaved rounds
(the order rotating each round). Each run times 20,000 pairs in 5 batches and gives the median
batch; a round's ratio is tensormalloc's time over tcmalloc's in that round, and the verdict on
the median ratio (against 1.0) is made only when its 95% interval allows (verdict.py).

    reuse_pair.py [--rounds N] [--sizes MIB...] [--pairs N]

BENCH_BEFORE=/path/to/old/libtensormalloc.so adds "tensormalloc-before"."""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from verdict import describe, load_average  # noqa: E402

LIBDIR = "/usr/lib/x86_64-linux-gnu"
OURS = os.environ.get("BENCH_TENSORMALLOC", str(ROOT / "target" / "release" / "libtensormalloc.so"))
SETUPS = {
    "tcmalloc": {"LD_PRELOAD": f"{LIBDIR}/libtcmalloc_minimal.so.4"},
    "glibc-tuned": {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"},
    "glibc": {},
    "jemalloc": {"LD_PRELOAD": f"{LIBDIR}/libjemalloc.so.2"},
    "tensormalloc": {"LD_PRELOAD": OURS},
}
if os.environ.get("BENCH_BEFORE"):
    SETUPS["tensormalloc-before"] = {"LD_PRELOAD": os.environ["BENCH_BEFORE"]}


def run(binary, setup, mib, pairs):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORMALLOC_", "MALLOC_", "LD_PRELOAD"))}
    env.update(SETUPS[setup])
    out = subprocess.run([str(binary), str(mib), str(pairs)], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--sizes", type=int, nargs="*", default=[4, 64, 256])
    ap.add_argument("--pairs", type=int, default=20000)
    args = ap.parse_args()
    out = ROOT / "target" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    binary = out / "reset_cost"
    subprocess.run(["gcc", "-O2", "-fno-builtin", "-o", str(binary), str(HERE / "c" / "reset_cost.c")], check=True)
    setups = list(SETUPS)
    load_before = load_average()
    times = {(m, s): [] for m in args.sizes for s in setups}
    faults = {(m, s): [] for m in args.sizes for s in setups}
    for r in range(args.rounds):
        for m in args.sizes:
            k = r % len(setups)
            for s in setups[k:] + setups[:k]:
                res = run(binary, s, m, args.pairs)
                times[m, s].append(res["ms"])
                faults[m, s].append(res["faults"])
    print(f"The reuse pair (malloc, write one byte, free), us per pair, medians of {args.rounds} interleaved rounds "
          f"of {args.pairs} pairs; load average {load_before} before, {load_average()} after.")
    print()
    print("| MiB | " + " | ".join(setups) + " | tensormalloc / tcmalloc per round [95% interval], verdict vs 1.0 |")
    print("|---|" + "---|" * len(setups) + "---|")
    for m in args.sizes:
        cells = [f"{statistics.median(times[m, s]):.3f}" for s in setups]
        ratios = [a / b for a, b in zip(times[m, "tensormalloc"], times[m, "tcmalloc"])]
        print(f"| {m} | " + " | ".join(cells) + f" | {describe(ratios, 1.0)} |")
    print()
    print("faults per pair: " + "; ".join(f"{m} MiB " + ", ".join(f"{s} {statistics.median(faults[m, s]):.2f}" for s in setups) for m in args.sizes))


if __name__ == "__main__":
    main()
