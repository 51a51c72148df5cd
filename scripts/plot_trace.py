"""Reads a TENSORMALLOC_TRACE file (format in src/trace.rs) and draws it; prints a summary."""
import sys

import numpy as np

EVENT = np.dtype([("time_ns", "<u8"), ("size", "<u8"), ("extra", "<u8"), ("kind", "u1"), ("op", "u1"),
                  ("outcome", "u1"), ("device", "u1"), ("reserved", "<u4")])
HOST, DEVICE, SAMPLE = 0, 1, 2
ALLOC, FREE = 0, 1


def load(path):
    data = open(path, "rb").read()
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
    out = {"t": [], "host": [], "device": [], "sample_t": [], "rss": [], "cached": []}
    for e in events:
        t = (int(e["time_ns"]) - int(t0)) / 1e9
        kind = int(e["kind"])
        if kind == SAMPLE:
            out["sample_t"].append(t)
            out["rss"].append(int(e["size"]))
            out["cached"].append(int(e["extra"]))
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
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024:
            return f"{n:g}{unit}"
        n /= 1024
    return f"{n:g}P"


def summary(events):
    allocs = events[(events["op"] == ALLOC) & (events["kind"] != SAMPLE)]
    frees = events[(events["op"] == FREE) & (events["kind"] != SAMPLE)]
    hits = int(np.sum(allocs["outcome"] == 0))
    return {"events": len(events), "allocs": len(allocs), "frees": len(frees), "hits": hits,
            "samples": int(np.sum(events["kind"] == SAMPLE)),
            "bytes_requested": int(allocs["size"].sum()) if len(allocs) else 0}


def main():
    path = sys.argv[1]
    out_png = sys.argv[2] if len(sys.argv) > 2 else path + ".png"
    events = load(path)
    s = summary(events)
    print(" ".join(f"{k}={v}" for k, v in s.items()))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = series(events)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    mib = 2**20
    ax1.step(d["t"], np.array(d["host"]) / mib, where="post", label="live host (large)")
    if any(d["device"]):
        ax1.step(d["t"], np.array(d["device"]) / mib, where="post", label="live device")
    ax1.plot(d["sample_t"], np.array(d["cached"]) / mib, "o-", ms=2, label="cached host")
    ax1.plot(d["sample_t"], np.array(d["rss"]) / mib, "-", label="resident (RSS)")
    ax1.set_xlabel("seconds")
    ax1.set_ylabel("MiB")
    ax1.legend(fontsize=8)
    ax1.set_title("memory over time")
    allocs = events[(events["op"] == ALLOC) & (events["kind"] != SAMPLE)]
    if len(allocs):
        # one bar per power of two: [2^k, 2^(k+1))
        exps = np.floor(np.log2(np.maximum(allocs["size"].astype(float), 1))).astype(int)
        ks = np.arange(exps.min(), exps.max() + 1)
        counts = [int(np.sum(exps == k)) for k in ks]
        ax2.bar(range(len(ks)), counts)
        ax2.set_xticks(range(len(ks)))
        ax2.set_xticklabels([human(2**int(k)) for k in ks], rotation=45, fontsize=8)
    ax2.set_xlabel("request size (from)")
    ax2.set_ylabel("requests")
    ax2.set_title(f"{s['allocs']} requests, {100 * s['hits'] / max(s['allocs'], 1):.0f}% hits")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    print(f"wrote {out_png}")


if __name__ == "__main__":
    main()
