"""`tensormalloc plot` at scale (issue 35, item 6): a trace of a million events is read, matched
and drawn per pixel column (src: python/tensormalloc/plot.py's note); its peaks survive the
aggregation exactly, lanes and colours are as for a small trace, and the vectorized series equal
an event-by-event reading of the same records. A correctness check, not a timing (the time and
memory at 100k and 1M events are in BENCHMARKS.md, "Issue 35", from scripts/bench_plot.py)."""
import sys

import numpy as np
import pytest

from conftest import ROOT, ok, run
from test_cli import ENV, PY

sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_plot import synthetic_trace  # noqa: E402
from tensormalloc import plot  # noqa: E402

MIB = 1 << 20


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "t.bin"
    allocs, frees, host_peak, device_peak = synthetic_trace(path, 1_000_000)
    return path, allocs, frees, host_peak, device_peak


def test_a_million_events_are_drawn_with_their_peaks(big, tmp_path):
    path, allocs, frees, host_peak, device_peak = big
    out = ok(run([PY, "-m", "tensormalloc", "plot", str(path), str(tmp_path / "t.png")], preload=False, env=ENV, timeout=300))
    assert out.stderr == "", "a whole file: no cut"
    assert f"allocs={allocs} frees={frees}" in out.stdout and (tmp_path / "t.png").stat().st_size > 10_000, out.stdout
    events = plot.load(path)
    fig = plot.draw(events, tmp_path / "again.png")
    host, device, sizes = fig.axes
    for ax, peak, bands in ((host, host_peak, 6), (device, device_peak, 6)):
        live = [c for c in ax.collections if c.get_label().startswith("live: ")]
        assert len(live) == bands, [c.get_label() for c in ax.collections]
        top = live[-1].get_paths()[0].vertices[:, 1]
        assert np.isclose(top.max(), peak / MIB), (top.max(), peak / MIB)
        assert len(top) < 4 * (plot.PIXELS + 2), "drawn per pixel column, not per event"
    assert sizes.get_title().startswith(f"{allocs} requests")
    labels = host.get_legend_handles_labels()[1]
    assert "live: others (3 holders)" in labels and "resident, RSS (sampled)" in labels, labels


def by_events(events, t0=None):
    """The series read event by event, as the plot read them before it was vectorized: a free
    ends the last alloc of its (kind, device, address) not yet freed. Records of one time keep
    the file's order (the old reader's structured sort broke such ties by the other fields)."""
    names = plot.holder_names(events)
    events = events[events["kind"] != plot.NAME]
    events = events[np.argsort(events["time_ns"], kind="stable")]  # ties: in the file's order
    t0 = events["time_ns"][0] if t0 is None else t0
    live = {plot.HOST: 0, plot.DEVICE: 0}
    blocks, holders, holder_live = {}, {plot.HOST: {}, plot.DEVICE: {}}, {plot.HOST: {}, plot.DEVICE: {}}
    out = {"t": [], "host": [], "device": [], "holders": holders, "names": names}
    for e in events:
        kind = int(e["kind"])
        if kind not in live:
            continue
        t = (int(e["time_ns"]) - int(t0)) / 1e9
        key = (kind, int(e["device"]), int(e["extra"]))
        if int(e["op"]) == plot.ALLOC:
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
        out["host"].append(live[plot.HOST])
        out["device"].append(live[plot.DEVICE])
    return out


def test_the_vectorized_series_equal_an_event_by_event_reading():
    """Random records over a few addresses reused again and again, with frees of blocks never
    allocated (records dropped) and allocs of blocks never freed, host and two devices."""
    rng = np.random.default_rng(7)
    n = 20_000
    ev = np.zeros(n, dtype=plot.EVENT)
    ev["time_ns"] = np.sort(rng.integers(0, 10 * n, n))  # ties included
    ev["kind"] = rng.integers(0, 2, n)
    ev["device"] = np.where(ev["kind"] == plot.DEVICE, rng.integers(0, 2, n), 0)
    ev["op"] = rng.integers(0, 2, n)
    ev["extra"] = rng.integers(0, 40, n) * 4096
    ev["size"] = rng.integers(1, 100, n) * MIB
    ev["pages"] = rng.integers(0, 5, n)
    want = by_events(ev)
    got = plot.series(ev)
    assert got["t"] == want["t"] and got["host"] == want["host"] and got["device"] == want["device"]
    assert got["holders"] == want["holders"]
