"""Reads a TENSORMALLOC_TRACE file (format at the top of src/record/trace.rs) and draws it: memory over
time, host and device each in its own panel, and a histogram of request sizes; prints a one-line
summary.

    tensormalloc plot trace.bin [out.png]      (scripts/plot-trace in the source tree; default
                                                out: trace.bin.png; needs numpy and matplotlib)
    tensormalloc plot t.1.bin t.2.bin ... -o out.png
                                               (several processes of one run: one lane each, on
                                                one time axis, a holder in one colour throughout)

Live memory is drawn per holder (the shared object whose code asked for it, or a hook's library:
Note [Holders] in src/record/holders.rs), stacked: the five holders with the highest peak each in its
own colour, the rest summed as "others". Over the live host bytes the host cache's bytes are
stacked in two hatched bands: cached and resident, and cached but released with MADV_FREE
(lazily freed: counted in RSS until the kernel needs the pages); RSS is a line. So live, cached
and released-but-resident memory never share a colour, and RSS minus the lazily freed band is
what the process really holds.

Every level is a step: it holds from one event or sample until the next (live bytes change at
allocations and frees; cached and resident bytes are known only at the 100 ms samples, so they
are drawn as held between samples, not ramped). Traces written before holders (TMTRACE1) draw
one holder, "unknown"."""
import sys

import numpy as np

EVENT = np.dtype([("time_ns", "<u8"), ("size", "<u8"), ("extra", "<u8"), ("kind", "u1"), ("op", "u1"),
                  ("outcome", "u1"), ("device", "u1"), ("pages", "<u4")])
HOST, DEVICE, SAMPLE, NAME = 0, 1, 2, 3
ALLOC, FREE = 0, 1
MAGICS = (b"TMTRACE1", b"TMTRACE2")  # 1: before holders (no names, holder id 0 everywhere)
TOP_HOLDERS = 5
USAGE = ("usage: tensormalloc plot TRACE [OUT.png]   (TRACE: a file written under TENSORMALLOC_TRACE=TRACE)\n"
         "       tensormalloc plot TRACE... -o OUT.png   (several processes: one lane each, one time axis)")


class Damaged(Exception):
    """A file that is not a trace of this version, or whose records make no sense."""


def load(path):
    """Every record of the file, name records included (holder_names reads them, the rest skip them).
    Raises Damaged for another format or records no writer of ours makes."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] not in MAGICS:
        raise Damaged(f"{path}: not a tensormalloc trace of a version this reader knows (it starts {data[:8]!r})")
    usable = (len(data) - 8) // EVENT.itemsize * EVENT.itemsize
    events = np.frombuffer(data[8:8 + usable], dtype=EVENT)
    check(events, path)
    return events


def check(events, path):
    """Refuses records no writer of ours makes: unknown kinds, ops or outcomes, or time going back
    by more than a second (two processes' records interleaved in one file)."""
    blocks = events[(events["kind"] == HOST) | (events["kind"] == DEVICE)]
    if np.any(events["kind"] > NAME) or np.any(blocks["op"] > FREE) or np.any(blocks["outcome"] > 2):
        raise Damaged(f"{path}: damaged (records of unknown kinds)")
    times = events[events["kind"] != NAME]["time_ns"].astype(np.int64)
    back = int(np.sum(np.diff(times) < -1_000_000_000)) if len(times) > 1 else 0
    if back:
        raise Damaged(f"{path}: damaged (time goes back {back} times: several processes wrote it; use %p)")


def holder_names(events):
    """Holder id -> name, from the name records: the chunks of one id in index order, each
    giving its first `device` bytes of the 24 in time_ns, size and extra."""
    chunks = {}
    for r in events[events["kind"] == NAME]:
        chunks.setdefault(int(r["pages"]), {})[int(r["op"])] = r.tobytes()[:int(r["device"])]
    return {i: b"".join(c[k] for k in sorted(c)).decode("utf-8", "replace") for i, c in chunks.items()}


def holder_label(names, holder):
    return names.get(holder, "unknown" if holder == 0 else f"holder {holder}")


def series(events, t0=None):
    """Live host and device bytes after each alloc and free (at times t, of kinds kind), and per
    holder (holders[kind][id]: the times its live bytes changed and the levels; names[id]: its
    name); cached and resident bytes at each sample. A free is charged to the holder of the alloc
    it ends."""
    names = holder_names(events)
    events = np.sort(events[events["kind"] != NAME], order="time_ns", kind="stable")
    if t0 is None:
        t0 = events["time_ns"][0] if len(events) else 0
    live = {HOST: 0, DEVICE: 0}
    blocks = {}
    holders = {HOST: {}, DEVICE: {}}
    holder_live = {HOST: {}, DEVICE: {}}
    out = {"t": [], "kind": [], "host": [], "device": [], "sample_t": [], "rss": [], "cached": [], "lazily_freed": [],
           "holders": holders, "names": names}
    for e in events:
        t = (int(e["time_ns"]) - int(t0)) / 1e9
        kind = int(e["kind"])
        if kind == SAMPLE:
            out["sample_t"].append(t)
            out["rss"].append(int(e["size"]))
            out["cached"].append(int(e["extra"]))
            out["lazily_freed"].append(int(e["pages"]) * 4096)
            continue
        if kind not in live:
            continue
        key = (kind, int(e["device"]), int(e["extra"]))
        if int(e["op"]) == ALLOC:
            size, holder = int(e["size"]), int(e["pages"])
            blocks[key] = (size, holder)
        else:
            size, holder = blocks.pop(key, (0, int(e["pages"])))
            size = -size
        live[kind] += size
        level = holder_live[kind][holder] = holder_live[kind].get(holder, 0) + size
        ts, levels = holders[kind].setdefault(holder, ([], []))
        ts.append(t)
        levels.append(level)
        out["t"].append(t)
        out["kind"].append(kind)
        out["host"].append(live[HOST])
        out["device"].append(live[DEVICE])
    return out


def step_at(ts, levels, grid):
    """The step function through (ts, levels), 0 before the first point, at each time of grid."""
    ts, levels = np.asarray(ts, dtype=float), np.asarray(levels, dtype=float)
    if not len(ts):
        return np.zeros(len(grid))
    i = np.searchsorted(ts, grid, side="right") - 1
    return np.where(i >= 0, levels[np.maximum(i, 0)], 0.0)


def holder_bands(d, kind, grid, top=TOP_HOLDERS):
    """[(label, live bytes at each time of grid)]: the `top` holders of `kind` with the highest
    peak, highest first, then "others" (the rest summed) when there are more."""
    by_peak = sorted(d["holders"][kind].items(), key=lambda item: (-max(item[1][1]), item[0]))
    bands = [(holder_label(d["names"], h), step_at(ts, levels, grid)) for h, (ts, levels) in by_peak[:top]]
    if len(by_peak) > top:
        rest = sum(step_at(ts, levels, grid) for _, (ts, levels) in by_peak[top:])
        bands.append((f"others ({len(by_peak) - top} holders)", rest))
    return bands


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
    blocks = events[(events["kind"] == HOST) | (events["kind"] == DEVICE)]
    allocs = blocks[blocks["op"] == ALLOC]
    hits = int(np.sum(allocs["outcome"] == 0))
    return {"events": int(np.sum(events["kind"] != NAME)), "allocs": len(allocs),
            "frees": int(np.sum(blocks["op"] == FREE)), "hits": hits,
            "samples": int(np.sum(events["kind"] == SAMPLE)),
            "bytes_requested": int(allocs["size"].sum()) if len(allocs) else 0,
            "holders": len(set(blocks["pages"].tolist()))}


def _stack(ax, grid, bands, base=None):
    """Stacked step areas from (label, values, style) bands, each over the ones before it (the
    first over base); returns the top."""
    base = np.zeros(len(grid)) if base is None else base
    for label, values, style in bands:
        top = base + values
        ax.fill_between(grid, base, top, step="post", alpha=0.85, linewidth=0, label=label, **style)
        base = top
    return base


def _holder_colors():
    """label -> colour: a holder keeps its colour in both panels; "others" is grey, and none is
    the cache's beige."""
    import matplotlib
    palette = [c for i, c in enumerate(matplotlib.colormaps["tab10"].colors) if i not in (5, 7)]
    given = {}

    def color(label):
        if label.startswith("others"):
            return "0.55"
        return given.setdefault(label, palette[len(given) % len(palette)])
    return color


def _memory_axes(ax, title):
    ax.set_title(title)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)


def _host_panel(ax, d, color, title):
    mib = 2**20
    grid = np.unique(np.concatenate([[0.0], [t for t, k in zip(d["t"], d["kind"]) if k == HOST], d["sample_t"]]))
    cached = step_at(d["sample_t"], d["cached"], grid)
    lazy = np.minimum(step_at(d["sample_t"], d["lazily_freed"], grid), cached)
    top = _stack(ax, grid, [(f"live: {label}", v / mib, {"facecolor": color(label)}) for label, v in holder_bands(d, HOST, grid)])
    _stack(ax, grid, [("cached by tensormalloc, resident", (cached - lazy) / mib,
                       {"facecolor": "#e3d3b4", "hatch": "//", "edgecolor": "0.4"}),
                      ("cached, released with MADV_FREE (in RSS until the kernel needs it)", lazy / mib,
                       {"facecolor": "#f4eee0", "hatch": "..", "edgecolor": "0.4"})], base=top)
    ax.plot(d["sample_t"], np.array(d["rss"]) / mib, color="black", linewidth=1.2, label="resident, RSS (sampled)",
            drawstyle="steps-post")
    _memory_axes(ax, title)


def _device_panel(ax, d, color, title):
    grid = np.unique(np.concatenate([[0.0], [t for t, k in zip(d["t"], d["kind"]) if k == DEVICE]]))
    _stack(ax, grid, [(f"live: {label}", v / 2**20, {"facecolor": color(label)}) for label, v in holder_bands(d, DEVICE, grid)])
    _memory_axes(ax, title)


def _sizes_panel(ax, events):
    s = summary(events)
    allocs = events[((events["kind"] == HOST) | (events["kind"] == DEVICE)) & (events["op"] == ALLOC)]
    labels, counts = size_bins(allocs["size"])
    ax.bar(range(len(labels)), counts)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("request size (each bar: from one power of two up to the next)")
    ax.set_ylabel("requests")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"{s['allocs']} requests, {100 * s['hits'] / max(s['allocs'], 1):.0f}% hits")


def draw(events, out_png):
    """Writes the figure; returns the matplotlib Figure: its axes are host memory, then device
    memory when the trace has device blocks, then the histogram of request sizes."""
    return draw_lanes([("", events)], out_png)


def draw_lanes(lanes, out_png):
    """One lane (a row: host memory, device memory when any trace has device blocks, request
    sizes) per (name, events), all on one time axis from the earliest event of any (the traces
    share the system's monotonic clock); a holder has one colour in every lane. Returns the
    Figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    starts = [int(e[e["kind"] != NAME]["time_ns"].min()) for _, e in lanes if np.any(e["kind"] != NAME)]
    t0 = min(starts) if starts else 0
    data = [(name, events, series(events, t0)) for name, events in lanes]
    has_device = any(any(d["holders"][DEVICE]) for _, _, d in data)
    cols = 3 if has_device else 2
    fig, axes = plt.subplots(len(data), cols, figsize=(19 if has_device else 13, 6 * len(data)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 3, 2] if has_device else [3, 2]})
    color = _holder_colors()
    for row, (name, events, d) in enumerate(data):
        lane = f"{name}: " if name else ""
        _host_panel(axes[row][0], d, color, f"{lane}host: live large blocks by holder, the cache over them, RSS")
        if has_device:
            _device_panel(axes[row][1], d, color, f"{lane}device: live blocks by holder (all devices)")
        _sizes_panel(axes[row][-1], events)
    if len(data) > 1:
        end = max([max(d["t"] + d["sample_t"], default=0) for _, _, d in data] + [0])
        for row in axes:
            for ax in row[:-1]:
                ax.set_xlim(0, end * 1.02 or 1)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    return fig


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    out_png = None
    if "-o" in argv:
        at = argv.index("-o")
        if at + 1 >= len(argv):
            print(USAGE, file=sys.stderr)
            return 2
        out_png = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    elif len(argv) == 2 and argv[1].endswith(".png"):
        argv, out_png = argv[:1], argv[1]
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    lanes = []
    for path in argv:
        try:
            events = load(path)
        except OSError as e:
            print(f"tensormalloc plot: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 1
        except Damaged as e:
            print(f"tensormalloc plot: {e}; not plotted", file=sys.stderr)
            return 1
        print(("" if len(argv) == 1 else f"{path}: ") + " ".join(f"{k}={v}" for k, v in summary(events).items()))
        lanes.append((path if len(argv) > 1 else "", events))
    out_png = out_png or argv[0] + ".png"
    try:
        draw_lanes(lanes, out_png)
    except ImportError as e:
        print(f"tensormalloc plot: needs matplotlib ({e}): pip install matplotlib", file=sys.stderr)
        return 1
    print(f"wrote {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
