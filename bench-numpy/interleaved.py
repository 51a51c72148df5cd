"""One benchmark command under several setups, interleaved: every round runs the command once
under each setup, in an order that rotates every round, so this machine's drift (noisy 2-core
VMs) falls on all setups alike. The command must print a JSON line with "ms" (and may print
"faults" and "peak_rss_mb"), as bench-numpy/c/*.c and workloads.py do. Prints each setup's
medians and the median of its per-round ratio to the first setup, with its quartiles and its 95%
interval and verdict against 1.0 (verdict.py: "no verdict" when the noise forbids one).

    interleaved.py [--reps N] NAME=PRELOAD[:VAR=VALUE,...] ... -- COMMAND...

PRELOAD is a library path (or several, space-separated) or empty; VAR=VALUE pairs are set for
that setup only. Examples (BENCHMARKS.md has the runs):

    interleaved.py --reps 21 before=/tmp/before.so after=target/release/libtensormalloc.so \\
        tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 -- target/bench/large_churn 16
    interleaved.py --reps 15 ours=target/release/libtensormalloc.so \\
        tuned=:MALLOC_MMAP_THRESHOLD_=4294967296,MALLOC_TRIM_THRESHOLD_=68719476736 \\
        -- .venv/bin/python bench-numpy/workloads.py zeros-dense-64M
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict import describe, load_average  # noqa: E402


def parse_setup(text):
    name, _, rest = text.partition("=")
    preload, _, variables = rest.partition(":")
    env = dict(v.split("=", 1) for v in variables.split(",") if v)
    return name, preload, env


def run_once(command, preload, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORMALLOC_", "MALLOC_"))}
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    env.update(extra)
    p = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{command} failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit(__doc__)
    split = argv.index("--")
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("setups", nargs="+")
    args = ap.parse_args(argv[:split])
    command = argv[split + 1:]
    setups = [parse_setup(s) for s in args.setups]
    results = {name: [] for name, _, _ in setups}
    for r in range(args.reps):
        k = r % len(setups)
        for name, preload, env in setups[k:] + setups[:k]:
            results[name].append(run_once(command, preload, env))
    first = setups[0][0]
    print(f"{' '.join(command)}: medians of {args.reps} interleaved rounds (load average now {load_average()})")
    for name, _, _ in setups:
        runs = results[name]
        line = f"  {name:>12}: {statistics.median(x['ms'] for x in runs):.4g} ms"
        for key, label in (("faults", "faults"), ("peak_rss_mb", "MB peak RSS")):
            if key in runs[0]:
                line += f", {statistics.median(x[key] for x in runs):.4g} {label}"
        if name != first:
            ratios = [a["ms"] / b["ms"] for a, b in zip(runs, results[first])]
            q = statistics.quantiles(ratios, n=4)
            line += f"; vs {first}: {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}; {describe(ratios, 1.0)})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
