"""Reads a TENSORMALLOC_TRACE file (format at the top of src/trace.rs) and draws it: live, cached
and resident bytes over time, and a histogram of request sizes; prints a one-line summary.

    tensormalloc plot trace.bin [out.png]      (scripts/plot-trace in the source tree; default
                                                out: trace.bin.png; needs numpy and matplotlib)

Every line is a step: a level holds from one event or sample until the next (live bytes change
at allocations and frees; cached and resident bytes are known only at the 100 ms samples, so
they are drawn as held between samples, not ramped). Of the cached bytes, those released with
MADV_FREE but still counted in RSS until the kernel needs them (lazily freed) are drawn as their
own band: RSS minus that band is what the process really holds."""
import sys

import numpy as np

EVENT = np.dtype([("time_ns", "<u8"), ("size", "<u8"), ("extra", "<u8"), ("kind", "u1"), ("op", "u1"),
                  ("outcome", "u1"), ("device", "u1"), ("pages", "<u4")])
HOST, DEVICE, SAMPLE = 0, 1, 2
ALLOC, FREE = 0, 1
USAGE = "usage: tensormalloc plot TRACE [OUT.png]   (TRACE: a file written under TENSORMALLOC_TRACE=TRACE)"


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"TMTRACE1":
        raise SystemExit(f"{path}: not a tensormalloc trace")
    usable = (len(data) - 8) // EVENT.itemsize * EVENT.itemsize
    return np.frombuffer(data[8:8 + usable], dtype=EVENT)


def series(events):
    """Live host and device bytes after each event; cached and resident bytes at each sample."""
    events = np.sort(events, order="time_ns")
    t0 = events["time_ns"][0] if len(events) else 0
    live = {HOST: 0, DEVICE: 0}
    sizes = {}
    out = {"t": [], "host": [], "device": [], "sample_t": [], "rss": [], "cached": [], "lazily_freed": []}
    for e in events:
        t = (int(e["time_ns"]) - int(t0)) / 1e9
        kind = int(e["kind"])
        if kind == SAMPLE:
            out["sample_t"].append(t)
            out["rss"].append(int(e["size"]))
            out["cached"].append(int(e["extra"]))
            out["lazily_freed"].append(int(e["pages"]) * 4096)
            continue
        key = (kind, int(e["device"]), int(e["extra"]))
        if int(e["op"]) == ALLOC:
            sizes[key] = int(e["size"])
            live[kind] += int(e["size"])
        else:
            live[kind] -= sizes.pop(key, 0)
        out["t"].append(t)
        out["host"].append(live[HOST])
        out["device"].append(live[DEVICE])
    return out


def human(n):
    """Bytes in binary units, shortest form: 64M, 1.5G."""
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024:
            return f"{n:g}{unit}"
        n /= 1024
    return f"{n:g}P"


def size_bins(sizes):
    """One bin per power of two, [2^k, 2^(k+1)): (labels naming each bin's range, counts)."""
    sizes = np.asarray(sizes, dtype=np.uint64)
    if not len(sizes):
        return [], []
    exps = np.floor(np.log2(np.maximum(sizes.astype(float), 1))).astype(int)
    ks = range(int(exps.min()), int(exps.max()) + 1)
    labels = [f"{human(2**k)}-{human(2**(k + 1))}" for k in ks]
    return labels, [int(np.sum(exps == k)) for k in ks]


def summary(events):
    allocs = events[(events["op"] == ALLOC) & (events["kind"] != SAMPLE)]
    frees = events[(events["op"] == FREE) & (events["kind"] != SAMPLE)]
    hits = int(np.sum(allocs["outcome"] == 0))
    return {"events": len(events), "allocs": len(allocs), "frees": len(frees), "hits": hits,
            "samples": int(np.sum(events["kind"] == SAMPLE)),
            "bytes_requested": int(allocs["size"].sum()) if len(allocs) else 0}


def draw(events, out_png):
    """Writes the figure; returns the matplotlib Figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = summary(events)
    d = series(events)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    mib = 2**20
    steps = {"drawstyle": "steps-post"}
    ax1.plot(d["t"], np.array(d["host"]) / mib, label="live host (large blocks)", **steps)
    if any(d["device"]):
        ax1.plot(d["t"], np.array(d["device"]) / mib, label="live device", **steps)
    ax1.plot(d["sample_t"], np.array(d["cached"]) / mib, marker="o", ms=2, label="cached host (sampled)", **steps)
    ax1.plot(d["sample_t"], np.array(d["rss"]) / mib, label="resident, RSS (sampled)", **steps)
    if any(d["lazily_freed"]):
        lazy = np.array(d["lazily_freed"]) / mib
        ax1.fill_between(d["sample_t"], 0, lazy, step="post", alpha=0.3,
                         label="cached, lazily freed (MADV_FREE: in RSS until the kernel needs it)")
    ax1.set_xlabel("seconds")
    ax1.set_ylabel("MiB")
    ax1.legend(fontsize=8)
    ax1.set_title("memory over time")
    allocs = events[(events["op"] == ALLOC) & (events["kind"] != SAMPLE)]
    labels, counts = size_bins(allocs["size"])
    ax2.bar(range(len(labels)), counts)
    ax2.set_xticks(range(len(labels)))
    ax2.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax2.set_xlabel("request size (each bar: from one power of two up to the next)")
    ax2.set_ylabel("requests")
    ax2.set_title(f"{s['allocs']} requests, {100 * s['hits'] / max(s['allocs'], 1):.0f}% hits")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    return fig


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or len(argv) > 2:
        print(USAGE, file=sys.stdout if argv and argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    path = argv[0]
    out_png = argv[1] if len(argv) > 1 else path + ".png"
    try:
        events = load(path)
    except OSError as e:
        print(f"tensormalloc plot: cannot read {path}: {e.strerror}", file=sys.stderr)
        return 1
    print(" ".join(f"{k}={v}" for k, v in summary(events).items()))
    try:
        draw(events, out_png)
    except ImportError as e:
        print(f"tensormalloc plot: needs matplotlib ({e}): pip install matplotlib", file=sys.stderr)
        return 1
    print(f"wrote {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
