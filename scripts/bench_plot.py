"""`tensormalloc plot` at scale (issue 35, item 6): writes a synthetic trace of N events (host and
device blocks of 8 holders, allocated and freed in waves, a memory sample every 1,000 events, an
END record) and times `tensormalloc plot` on it, wall seconds and peak RSS (BENCHMARKS.md, "Issue
35"). The trace's own generator is used by preload-tests/test_plot_scale.py.

    .venv/bin/python scripts/bench_plot.py 100000 1000000
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from tensormalloc.plot import EVENT  # noqa: E402

HOLDERS = 8
NAMES = [f"libholder{i}.so" for i in range(1, HOLDERS + 1)]


def name_records(holder, name):
    raw = name.encode()
    chunks = [raw[i:i + 24] for i in range(0, len(raw), 24)]
    out = np.zeros(len(chunks), dtype=EVENT)
    for i, c in enumerate(chunks):
        rec = np.frombuffer(c.ljust(24, b"\0"), dtype="<u8")
        out[i]["time_ns"], out[i]["size"], out[i]["extra"] = rec
        out[i]["kind"], out[i]["op"], out[i]["outcome"], out[i]["device"], out[i]["pages"] = 3, i, len(chunks), len(c), holder
    return out


def synthetic_trace(path, events, seed=35):
    """Writes a trace of about `events` records to `path`; returns (allocs, frees, host peak
    bytes, device peak bytes) as the generator knows them. Block i lives for a number of events
    that rises and falls in waves, so live memory has peaks a plot must keep."""
    rng = np.random.default_rng(seed)
    samples = events // 1000
    pairs = (events - samples - 1) // 2
    i = np.arange(pairs)
    life = (1 + 200 * (1 + np.sin(i / max(pairs / 7, 1)))).astype(np.int64)  # waves of live blocks
    t_alloc = 2 * i
    t_free = 2 * i + 2 * life + 1
    kind = (rng.random(pairs) < 0.3).astype(np.uint8)  # 30% device
    size = (rng.integers(4, 65, pairs) << 20).astype(np.uint64)
    holder = rng.integers(1, HOLDERS + 1, pairs).astype(np.uint32)
    addr = (0x7f0000000000 + i * 0x10000000).astype(np.uint64)
    rec = np.zeros(2 * pairs + samples + 1, dtype=EVENT)
    a, f, s = rec[:pairs], rec[pairs:2 * pairs], rec[2 * pairs:]
    for r, t, op in ((a, t_alloc, 0), (f, t_free, 1)):
        r["time_ns"] = 1_000_000_000 + t * 1000
        r["size"], r["extra"], r["kind"], r["op"], r["pages"] = size, addr, kind, op, holder
        r["outcome"] = 0 if op else rng.integers(0, 2, pairs)
    end = int(max(t_free.max(), t_alloc.max())) + 2
    s["time_ns"] = 1_000_000_000 + np.linspace(0, end, len(s)).astype(np.int64) * 1000
    s["kind"], s["size"], s["extra"] = 2, 1 << 30, 256 << 20
    s[-1]["op"] = 1  # END: the file was closed
    rec = rec[np.argsort(rec["time_ns"], kind="stable")]
    with open(path, "wb") as out:
        out.write(b"TMTRACE2")
        for h in range(1, HOLDERS + 1):
            out.write(name_records(h, NAMES[h - 1]).tobytes())
        out.write(rec.tobytes())
    peaks = []
    for k in (0, 1):
        ev = rec[(rec["kind"] == k)]
        peaks.append(int(np.cumsum(np.where(ev["op"] == 0, ev["size"].astype(np.int64), -ev["size"].astype(np.int64))).max()))
    return pairs, pairs, peaks[0], peaks[1]


def main(argv):
    for n in map(int, argv or ["100000", "1000000"]):
        with tempfile.TemporaryDirectory() as d:
            trace = os.path.join(d, "t.bin")
            synthetic_trace(trace, n)
            env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
            # /usr/bin/time: the plot's own wall time and peak RSS (%M, KiB).
            out = subprocess.run(["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "tensormalloc", "plot", trace,
                                  os.path.join(d, "t.png")], env=env, capture_output=True, text=True)
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return 1
            wall, rss_kib = out.stderr.split()[-2:]
            print(f"{n:>9} events ({os.path.getsize(trace) >> 20} MiB): {float(wall):6.2f} s, peak RSS {int(rss_kib) >> 10:5d} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
