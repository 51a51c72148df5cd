"""The small-object churn (c/small_churn.c), one thread, under each setup in turn, REPS rounds,
the order reversed every other round. Prints the median time of each setup and the median of
its per-round ratio to the allocator alone: round-to-round drift of this machine cancels in a
ratio of two runs made seconds apart. An empty preloaded library measures what loading any
library costs (placement alone). Usage: paired.py [--reps N] [--hold]"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OURS = str(HERE.parent / "target" / "release" / "libtensormalloc.so")
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--hold", action="store_true", help="keep one 8 MiB block alive (arms the free check)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    churn = work / "small_churn"
    subprocess.run(["gcc", "-O2", "-pthread", "-fno-builtin", "-o", str(churn), str(HERE / "c" / "small_churn.c")], check=True)
    (work / "empty.c").write_text("int tensormalloc_bench_empty;\n")
    empty = work / "empty.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(empty), str(work / "empty.c")], check=True)
    # name: (LD_PRELOAD, extra environment, the setup it is compared with)
    setups = {
        "glibc": ("", {}, None),
        "empty library": (str(empty), {}, "glibc"),
        "tensormalloc": (OURS, {}, "glibc"),
        "tensormalloc, CHECK_FREE=0": (OURS, {"TENSORMALLOC_CHECK_FREE": "0"}, "glibc"),
        "jemalloc": (JEMALLOC, {}, None),
        "tensormalloc+jemalloc": (f"{OURS} {JEMALLOC}", {}, "jemalloc"),
        "tensormalloc+jemalloc, CHECK_FREE=0": (f"{OURS} {JEMALLOC}", {"TENSORMALLOC_CHECK_FREE": "0"}, "jemalloc"),
    }
    argv = [str(churn), "1"] + (["hold"] if args.hold else [])
    times = {name: [] for name in setups}
    for r in range(args.reps):
        order = list(setups) if r % 2 == 0 else list(reversed(setups))
        for name in order:
            preload, extra, _ = setups[name]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORMALLOC_", "MALLOC_", "LD_PRELOAD"))}
            if preload:
                env["LD_PRELOAD"] = preload
            env.update(extra)
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
            times[name].append(json.loads(out)["ms"])
    print(f"small_churn 1{' hold' if args.hold else ''}: {args.reps} rounds, ms per million operations")
    print(f"{'setup':38} {'median':>8} {'q1':>8} {'q3':>8}  paired ratio")
    for name, (_, _, base) in setups.items():
        t = times[name]
        q1, _, q3 = statistics.quantiles(t, n=4)
        ratio = f"{statistics.median(a / b for a, b in zip(t, times[base])) - 1:+.1%} over {base}" if base else ""
        print(f"{name:38} {statistics.median(t):8.2f} {q1:8.2f} {q3:8.2f}  {ratio}")


if __name__ == "__main__":
    main()
