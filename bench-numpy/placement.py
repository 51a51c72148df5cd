"""What the seed's arrays' placement costs, no allocator involved: `(a*b)**2 + 3` on 10M float64
(numpy's `multiply`, `square` and `add` with `out=`) over arrays placed at chosen offsets from a
2 MiB boundary in mappings of our own, advised for huge pages as numpy advises its arrays.
Under tensormalloc every large block starts on a 2 MiB boundary, so a, b and the temporary share
their low 21 address bits ("same 2 MiB"); glibc's heap puts them at offsets within a page
(its chunk headers), jemalloc at random cache lines in the first page (its cache-oblivious
placement). Each round runs every placement in turn (order rotating), 8 evaluations each, and
the round's figure is their median; prints each placement's median and its per-round ratio to
"same 2 MiB" (median [95% interval], verdict against 1: verdict.py). Usage: placement.py [ROUNDS]
(default 31, about a minute)"""
import mmap
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict import describe, load_average  # noqa: E402

N = 10_000_000
KIB = 1024
# Offsets of a, b and the temporary from a 2 MiB boundary.
PLACEMENTS = {
    "same 2 MiB": (0, 0, 0),
    "glibc-like": (16, 1056, 2096),
    "1K in page": (0, 1088, 2176),
    "64 B apart": (0, 64, 128),
    "random lines": (2368, 704, 3520),
    "64K apart": (0, 64 * KIB, 128 * KIB),
    "pages apart": (0, 37 * 4 * KIB, 101 * 4 * KIB),
    "1M apart": (0, 1024 * KIB, 1536 * KIB),
}


def array_at(offset):
    m = mmap.mmap(-1, N * 8 + (4 << 20))
    m.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(m, dtype=np.uint8)
    start = (-raw.ctypes.data) % (2 << 20) + offset
    a = raw[start:start + N * 8].view(np.float64)
    a[:] = np.random.default_rng(offset).random(N)
    return a


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 31
    load_before = load_average()
    arrays = {name: tuple(array_at(o) for o in offsets) for name, offsets in PLACEMENTS.items()}
    names = list(PLACEMENTS)
    per_round = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            a, b, t = arrays[name]
            times = []
            for _ in range(8):
                start = time.perf_counter()
                np.multiply(a, b, out=t)
                np.square(t, out=t)
                np.add(t, 3, out=t)
                times.append(time.perf_counter() - start)
            per_round[name].append(statistics.median(times))
    print(f"(a*b)**2 + 3 on {N:,} float64, {rounds} rounds; load average {load_before} before, {load_average()} after;"
          " ms (median), ratio to 'same 2 MiB' per round: median [95% interval], verdict against 1")
    for name in names:
        ratios = [x / y for x, y in zip(per_round[name], per_round["same 2 MiB"])]
        print(f"{name:13s} {statistics.median(per_round[name]) * 1e3:6.2f} ms  {describe(ratios, 1.0)}")

if __name__ == "__main__":
    main()
