"""The trace names who holds the memory (issue 20): a program and two shared objects of the
test's own (test_holders.py's c/holders/ libraries) allocate host and device blocks in a fixed
order (c/trace_holders.c) under TENSORMALLOC_TRACE; read back with the plot's own reader, each
holder's name is in the file before its first block and its live bytes step exactly as the
program allocated; `tensormalloc plot` draws them per holder, with the cache's bands apart. Old
(TMTRACE1) traces and names of several records read back by hand-made files."""
import struct
import sys

import pytest

from conftest import C_DIR, ROOT, ok, run
from test_holders import holder_program

sys.path.insert(0, str(ROOT / "python"))
from tensormalloc import plot  # noqa: E402

MIB = 1 << 20
PY = str(ROOT / ".venv" / "bin" / "python")

# Each holder's live MiB after each of its changes, in c/trace_holders.c's order.
HOST_STEPS = {"trace_holders": [12, 0], "libframework.so": [8, 32, 24, 0], "libmathlib.so": [16, 0, 40]}
DEVICE_STEPS = {"libframework.so": [64, 0], "libmathlib.so": [32]}


@pytest.fixture(scope="module")
def program():
    return str(holder_program("trace_holders", C_DIR / "trace_holders.c"))


@pytest.fixture(scope="module")
def trace(program, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.bin"
    out = ok(run([program], env={"TENSORMALLOC_TRACE": str(path)}))
    assert out.stdout == "done\n", out
    return path


def by_name(d, kind):
    """Holder name -> its live MiB after each change."""
    return {d["names"][h]: [level / MIB for level in levels] for h, (_, levels) in d["holders"][kind].items()}


def test_each_holder_is_named_with_its_live_bytes_over_time(trace):
    assert trace.read_bytes()[:8] == b"TMTRACE2"
    events = plot.load(trace)
    d = plot.series(events)
    assert by_name(d, plot.HOST) == HOST_STEPS, d["names"]
    assert by_name(d, plot.DEVICE) == DEVICE_STEPS, d["names"]
    assert d["host"][-1] == 40 * MIB and d["device"][-1] == 32 * MIB
    # Each name is written before the first record that carries its id, once.
    for holder in set(d["holders"][plot.HOST]) | set(d["holders"][plot.DEVICE]):
        named = [i for i, e in enumerate(events) if e["kind"] == plot.NAME and e["pages"] == holder]
        used = [i for i, e in enumerate(events) if e["kind"] in (plot.HOST, plot.DEVICE) and e["pages"] == holder]
        assert named and max(named) < min(used), (holder, named, used)
        assert len(named) == max(1, -(-len(d["names"][holder]) // 24))
    s = plot.summary(events)
    assert (s["allocs"], s["frees"], s["holders"]) == (7, 5, 3), s


def test_the_top_holders_and_the_rest_summed(trace):
    d = plot.series(plot.load(trace))
    grid = sorted(t for t, k in zip(d["t"], d["kind"]) if k == plot.HOST)
    bands = plot.holder_bands(d, plot.HOST, grid, top=1)
    assert [label for label, _ in bands] == ["libmathlib.so", "others (2 holders)"], bands
    top, others = (list(values / MIB) for _, values in bands)
    assert top == [0, 0, 16, 16, 0, 0, 40, 40, 40], top
    assert others == [12, 20, 20, 44, 44, 36, 36, 12, 0], others
    assert len(plot.holder_bands(d, plot.HOST, grid)) == 3, "no others band when every holder has its own"


def test_the_plot_command_draws_holders_and_the_cache_apart(trace, tmp_path):
    png = tmp_path / "out.png"
    out = ok(run([PY, "-m", "tensormalloc", "plot", str(trace), str(png)], preload=False,
                 env={"PYTHONPATH": str(ROOT / "python")}))
    assert "allocs=7 frees=5" in out.stdout and png.stat().st_size > 10_000, out
    fig = plot.draw(plot.load(trace), tmp_path / "again.png")
    host, device, sizes = fig.axes
    host_labels = host.get_legend_handles_labels()[1]
    assert {"live: libframework.so", "live: libmathlib.so", "live: trace_holders", "cached by tensormalloc, resident",
            "resident, RSS (sampled)"} <= set(host_labels), host_labels
    assert any(label.startswith("cached, released with MADV_FREE") for label in host_labels), host_labels
    assert set(device.get_legend_handles_labels()[1]) == {"live: libframework.so", "live: libmathlib.so"}
    assert sizes.get_title().startswith("7 requests")


def record(time_ns=0, size=0, extra=0, kind=0, op=0, outcome=0, device=0, pages=0):
    return struct.pack("<QQQBBBBI", time_ns, size, extra, kind, op, outcome, device, pages)


def name_records(holder, name):
    chunks = [name[i:i + 24] for i in range(0, len(name), 24)]
    return b"".join(struct.pack("<24sBBBBI", c, plot.NAME, i, len(chunks), len(c), holder) for i, c in enumerate(chunks))


def test_names_of_several_records_and_old_traces_read_back(tmp_path):
    long_name = b"libsomething-with-a-long-name.so.3"
    new = tmp_path / "new.bin"
    new.write_bytes(b"TMTRACE2" + name_records(9, long_name) + record(10, 5 * MIB, 0x1000, pages=9)
                    + record(20, 5 * MIB, 0x1000, op=1, pages=9))
    d = plot.series(plot.load(new))
    assert d["names"] == {9: long_name.decode()} and by_name(d, plot.HOST) == {long_name.decode(): [5, 0]}
    old = tmp_path / "old.bin"  # before holders: no names, pages 0
    old.write_bytes(b"TMTRACE1" + record(10, 6 * MIB, 0x2000) + record(15, 100, 200, kind=plot.SAMPLE))
    d = plot.series(plot.load(old))
    assert d["names"] == {} and d["host"] == [6 * MIB] and d["rss"] == [100]
    assert [label for label, _ in plot.holder_bands(d, plot.HOST, [0.0])] == ["unknown"]
    plot.draw(plot.load(old), tmp_path / "old.png")
