"""The seed expression (a*b)**2 + 3 on 10M float64, in one process per run: numpy's default
handler over glibc, glibc tuned, tensormalloc preloaded, and tensormalloc.numpy's NEP 49 handler
without the preload. Runs alternate; prints medians of ms and minor faults per evaluation.
    .venv/bin/python bench-numpy/numpy_handler.py [REPS]      (needs cargo build --release)"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "target" / "release" / "libtensormalloc.so"
CHILD = r"""
import json, resource, sys, time
import numpy as np
if sys.argv[1] == "handler":
    import tensormalloc.numpy
    tensormalloc.numpy.enable()
rng = np.random.default_rng(42)
a, b = rng.random(10_000_000), rng.random(10_000_000)
for _ in range(5):
    c = (a * b) ** 2 + 3
n = 50
f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
for _ in range(n):
    c = (a * b) ** 2 + 3
t1, f1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"ms": (t1 - t0) * 1e3 / n, "faults": (f1 - f0) / n}))
"""
SETTINGS = {
    "glibc (numpy's default handler)": ({}, "default"),
    "glibc tuned (MALLOC_MMAP/TRIM_THRESHOLD_)": ({"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}, "default"),
    "tensormalloc preloaded": ({"LD_PRELOAD": str(LIB)}, "default"),
    "tensormalloc.numpy handler, no preload": ({}, "handler"),
}


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    results = {name: [] for name in SETTINGS}
    for _ in range(reps):
        for name, (extra, mode) in SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSORMALLOC_", "MALLOC_")) and k != "LD_PRELOAD"}
            env.update(extra, PYTHONPATH=str(ROOT / "python"))
            out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, check=True)
            results[name].append(json.loads(out.stdout))
    base = statistics.median(r["ms"] for r in results["glibc (numpy's default handler)"])
    print(f"| setting ({reps} runs of 50 evaluations) | ms per evaluation (median) | speed vs glibc (glibc's time / this one's: above 1x is faster) | minor faults per evaluation |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        ms = statistics.median(r["ms"] for r in runs)
        faults = statistics.median(r["faults"] for r in runs)
        print(f"| {name} | {ms:.2f} | {base / ms:.2f}x | {faults:.0f} |")  # a speed-up, as BENCHMARKS.md's tables


if __name__ == "__main__":
    main()
