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
one holder, "unknown".

At scale (more events than a panel has pixel columns) each lane is drawn per pixel column: every
band at the moment in that column when the lane's live bytes were highest (so peaks stay, and
the stack stays one moment's), the series themselves computed with numpy, not event by event.
A file is read as src/sys/files.rs reads (never blocking, never through a link, a regular file of
ours); one that was cut (no END record at its end: Note [No torn trace] in src/record/trace.rs)
is drawn as far as it goes, and a line says how many records were read and that it was cut."""
import io
import os
import sys

import numpy as np

from ._files import Refused, open_input, write_output

EVENT = np.dtype([("time_ns", "<u8"), ("size", "<u8"), ("extra", "<u8"), ("kind", "u1"), ("op", "u1"),
                  ("outcome", "u1"), ("device", "u1"), ("pages", "<u4")])
HOST, DEVICE, SAMPLE, NAME = 0, 1, 2, 3
ALLOC, FREE = 0, 1
MAGICS = (b"TMTRACE1", b"TMTRACE2")  # 1: before holders (no names, holder id 0 everywhere)
END, CUT, ID = 1, 2, 3  # a sample's op: the end of a file closed at exit or cut by its writer; who writes it
TOP_HOLDERS = 5
PIXELS = 2000  # columns a panel is drawn in, at most (Note at the top: at scale)
USAGE = ("usage: tensormalloc plot TRACE [OUT.png]   (TRACE: a file written under TENSORMALLOC_TRACE=TRACE)\n"
         "       tensormalloc plot TRACE... -o OUT.png   (several processes: one lane each, one time axis)")


class Damaged(Exception):
    """A file that is not a trace of this version, or whose records make no sense."""


def load(path):
    """Every record of the file, name records included (holder_names reads them, the rest skip them).
    Raises Damaged for another format or records no writer of ours makes, OSError (a Refused one
    for what is not a regular file of ours) when it cannot be read."""
    return load_checked(path)[0]


def load_checked(path):
    """(records, None) for a whole file, (records, why) for one that was cut."""
    try:
        fd, st = open_input(path)
    except Refused as e:
        raise OSError(0, str(e)) from None
    with os.fdopen(fd, "rb") as f:
        magic = f.read(8)
        if magic not in MAGICS:
            raise Damaged(f"{path}: not a tensormalloc trace of a version this reader knows (it starts {magic!r})")
        whole = (st.st_size - 8) // EVENT.itemsize
        events = np.fromfile(f, dtype=EVENT, count=whole)
    check(events, path)
    partial = (st.st_size - 8) % EVENT.itemsize
    last = events[-1] if len(events) else None
    if last is not None and last["kind"] == SAMPLE and last["op"] == END and not partial:
        return events, None
    if last is not None and last["kind"] == SAMPLE and last["op"] == CUT:
        why = "by its writer: the file took no more (a full disk, or a file size limit)"
    else:
        why = ("it has no end record: its process was killed or is still running, or its disk filled"
               + (f"; its last {partial} bytes are part of a record" if partial else ""))
    return events, why


def check(events, path):
    """Refuses records no writer of ours makes: unknown kinds, ops or outcomes, or time going back
    by more than a second (two processes' records interleaved in one file)."""
    kinds = events["kind"]
    blocks = (kinds == HOST) | (kinds == DEVICE)
    if (np.any(kinds > NAME) or np.any(events["op"][blocks] > FREE) or np.any(events["outcome"][blocks] > 2)
            or np.any(events["op"][kinds == SAMPLE] > ID)):
        raise Damaged(f"{path}: damaged (records of unknown kinds)")
    times = events["time_ns"][kinds != NAME].astype(np.int64)
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
    it ends. Lists (arrays(): the same as numpy arrays, for the drawing)."""
    d = arrays(events, t0)
    out = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in d.items() if k != "holders"}
    out["holders"] = {k: {h: (ts.tolist(), lv.tolist()) for h, (ts, lv) in hs.items()} for k, hs in d["holders"].items()}
    return out


def arrays(events, t0=None):
    """series() as numpy arrays, computed without a loop over events: each free is matched to
    the last alloc of its (kind, device, address) before it, when the record just before it in
    that order is an alloc (a free with none, after records were dropped, changes nothing)."""
    names = holder_names(events)
    ev = events[events["kind"] != NAME]
    ev = ev[np.argsort(ev["time_ns"], kind="stable")]
    if t0 is None:
        t0 = int(ev["time_ns"][0]) if len(ev) else 0
    t_all = (ev["time_ns"].astype(np.int64) - np.int64(t0)) / 1e9
    kinds = ev["kind"]
    samples = (kinds == SAMPLE) & (ev["op"] != ID)
    blk = (kinds == HOST) | (kinds == DEVICE)
    b, t, bk = ev[blk], t_all[blk], kinds[blk]
    n = len(b)
    op, size, holder = b["op"], b["size"].astype(np.int64), b["pages"].astype(np.int64)
    place = bk.astype(np.int64) * 256 + b["device"]
    order = np.lexsort((np.arange(n), b["extra"], place))
    so_addr, so_place, so_op = b["extra"][order], place[order], op[order]
    matched = np.zeros(n, dtype=bool)
    if n > 1:
        matched[1:] = (so_addr[1:] == so_addr[:-1]) & (so_place[1:] == so_place[:-1]) & (so_op[:-1] == ALLOC) & (so_op[1:] != ALLOC)
    at = np.flatnonzero(matched)
    freed, charged = np.zeros(n, dtype=np.int64), holder.copy()
    freed[order[at]] = size[order[at - 1]]
    charged[order[at]] = holder[order[at - 1]]
    is_free = op != ALLOC
    delta = np.where(is_free, -freed, size)
    charged = np.where(is_free, charged, holder)
    holders = {HOST: {}, DEVICE: {}}
    for kind in (HOST, DEVICE):
        mask = bk == kind
        hk, dk, tk = charged[mask], delta[mask], t[mask]
        if not len(hk):
            continue
        by = np.argsort(hk, kind="stable")
        hs, levels = hk[by], np.cumsum(dk[by])
        starts = np.concatenate([[0], np.flatnonzero(np.diff(hs)) + 1])
        ends = np.concatenate([starts[1:], [len(hs)]])
        for start, end in zip(starts, ends):
            base = levels[start - 1] if start else 0
            holders[kind][int(hs[start])] = (tk[by[start:end]], levels[start:end] - base)
    return {"t": t, "kind": bk, "host": np.cumsum(np.where(bk == HOST, delta, 0)),
            "device": np.cumsum(np.where(bk == DEVICE, delta, 0)), "sample_t": t_all[samples],
            "rss": ev["size"][samples].astype(np.int64), "cached": ev["extra"][samples].astype(np.int64),
            "lazily_freed": ev["pages"][samples].astype(np.int64) * 4096, "holders": holders, "names": names}


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
    by_peak = sorted(d["holders"][kind].items(), key=lambda item: (-np.max(item[1][1]), item[0]))
    bands = [(holder_label(d["names"], h), step_at(ts, levels, grid)) for h, (ts, levels) in by_peak[:top]]
    if len(by_peak) > top:
        rest = np.zeros(len(grid))
        for _, (ts, levels) in by_peak[top:]:
            rest += step_at(ts, levels, grid)
        bands.append((f"others ({len(by_peak) - top} holders)", rest))
    return bands


def envelope(times, levels, end, pixels=PIXELS):
    """Columns for a panel of many events: (x, at): x the left edge of each of `pixels` columns
    over [0, end], then `end`; at, per column, the time in it when `levels` (after each event at
    `times`) was highest, or the column's start when no event falls in it (the level holds)."""
    edges = np.linspace(0.0, end or 1.0, pixels + 1)
    at = edges[:-1].copy()
    if len(times):
        col = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, pixels - 1)
        order = np.lexsort((-np.asarray(levels, dtype=float), col))
        cols, first = np.unique(col[order], return_index=True)
        at[cols] = times[order[first]]
    return edges, np.append(at, edges[-1])


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
    low = int(exps.min())
    ks = range(low, int(exps.max()) + 1)
    labels = [f"{human(2**k)}-{human(2**(k + 1))}" for k in ks]
    return labels, [int(c) for c in np.bincount(exps - low, minlength=len(ks))]


def summary(events):
    kinds = events["kind"]
    blocks = events[(kinds == HOST) | (kinds == DEVICE)]
    allocs = blocks[blocks["op"] == ALLOC]
    hits = int(np.sum(allocs["outcome"] == 0))
    return {"events": int(np.sum(kinds != NAME)), "allocs": len(allocs),
            "frees": int(np.sum(blocks["op"] == FREE)), "hits": hits,
            "samples": int(np.sum((kinds == SAMPLE) & (events["op"] != ID))),
            "bytes_requested": int(allocs["size"].sum()) if len(allocs) else 0,
            "holders": len(np.unique(blocks["pages"]))}


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


def _columns(d, kind, extra_t=()):
    """(x to draw at, times to take every band at): every change of `kind` (and `extra_t`) while
    they fit the panel's pixels, else per pixel column at the lane's highest moment in it."""
    mask = d["kind"] == kind
    times = d["t"][mask]
    if len(times) + len(extra_t) <= 2 * PIXELS:
        grid = np.unique(np.concatenate([[0.0], times, extra_t]))
        return grid, grid
    level = d["host"][mask] if kind == HOST else d["device"][mask]
    end = max(float(times.max()) if len(times) else 0.0, float(np.max(extra_t)) if len(extra_t) else 0.0)
    return envelope(times, level, end)


def _host_panel(ax, d, color, title):
    mib = 2**20
    x, at = _columns(d, HOST, d["sample_t"])
    cached = step_at(d["sample_t"], d["cached"], at)
    lazy = np.minimum(step_at(d["sample_t"], d["lazily_freed"], at), cached)
    top = _stack(ax, x, [(f"live: {label}", v / mib, {"facecolor": color(label)}) for label, v in holder_bands(d, HOST, at)])
    _stack(ax, x, [("cached by tensormalloc, resident", (cached - lazy) / mib,
                    {"facecolor": "#e3d3b4", "hatch": "//", "edgecolor": "0.4"}),
                   ("cached, released with MADV_FREE (in RSS until the kernel needs it)", lazy / mib,
                    {"facecolor": "#f4eee0", "hatch": "..", "edgecolor": "0.4"})], base=top)
    sample_t, rss = d["sample_t"], np.asarray(d["rss"], dtype=float)
    if len(sample_t) > 2 * PIXELS:
        sx, sat = envelope(sample_t, rss, float(sample_t.max()))
        sample_t, rss = sx, step_at(d["sample_t"], rss, sat)
    ax.plot(sample_t, rss / mib, color="black", linewidth=1.2, label="resident, RSS (sampled)", drawstyle="steps-post")
    _memory_axes(ax, title)


def _device_panel(ax, d, color, title):
    x, at = _columns(d, DEVICE)
    _stack(ax, x, [(f"live: {label}", v / 2**20, {"facecolor": color(label)}) for label, v in holder_bands(d, DEVICE, at)])
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
    starts = [int(e["time_ns"][e["kind"] != NAME].min()) for _, e in lanes if np.any(e["kind"] != NAME)]
    t0 = min(starts) if starts else 0
    data = [(name, events, arrays(events, t0)) for name, events in lanes]
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
        end = max([float(np.max(np.concatenate([d["t"], d["sample_t"], [0.0]]))) for _, _, d in data] + [0])
        for row in axes:
            for ax in row[:-1]:
                ax.set_xlim(0, end * 1.02 or 1)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    write_output(out_png, png.getvalue())
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
            events, cut = load_checked(path)
        except OSError as e:
            print(f"tensormalloc plot: cannot read {path}: {e.strerror}", file=sys.stderr)
            return 1
        except Damaged as e:
            print(f"tensormalloc plot: {e}; not plotted", file=sys.stderr)
            return 1
        if cut:
            print(f"tensormalloc plot: {path}: read {len(events)} records; the file was cut: {cut}", file=sys.stderr)
        print(("" if len(argv) == 1 else f"{path}: ") + " ".join(f"{k}={v}" for k, v in summary(events).items()))
        lanes.append((path if len(argv) > 1 else "", events))
    out_png = out_png or argv[0] + ".png"
    try:
        draw_lanes(lanes, out_png)
    except ImportError as e:
        print(f"tensormalloc plot: needs matplotlib ({e}): {sys.executable} -m pip install matplotlib"
              " (where that is the system's Python and pip refuses: apt install python3-matplotlib)", file=sys.stderr)
        return 1
    except Refused as e:
        print(f"tensormalloc plot: cannot write {out_png}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
