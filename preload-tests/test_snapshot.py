"""Memory snapshots in PyTorch's format (Note [Snapshot format] in src/report/snapshot.rs), read by
PyTorch's own reader, torch/cuda/_memory_viz.py out of the torch wheel (scripts/memory-viz, which
scripts/setup runs; it needs no torch): a program
over the stand-in CUDA runtime whose two libraries of the test's own (a framework and a math
library) allocate device, pinned and large host memory. Every block is checked field by field
against what PyTorch writes, the reader's figures against tm_get_stats', and the frames against
the libraries that asked. Then tm_snapshot's errors, TENSORMALLOC_SNAPSHOT_AT_EXIT, and
tensormalloc.snapshot() from Python."""
import base64
import json
import pickle
import re
import subprocess

import pytest

from conftest import BUILD, C_DIR, ROOT, ok, run
from cudasim import CFLAGS, fake_cuda

PY = str(ROOT / ".venv" / "bin" / "python")
VIZ_FILE = ROOT / ".venv" / "share" / "torch-memory-viz" / "_memory_viz.py"
VIZ = [PY, str(VIZ_FILE)]
# Loads the reader as a module, as `from torch.cuda import _memory_viz as v` would.
LOAD_VIZ = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("_memory_viz", {str(VIZ_FILE)!r})
v = importlib.util.module_from_spec(spec)
spec.loader.exec_module(v)
"""
MB = 1 << 20

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
EVENT_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


def _fresh(out, deps):
    return out.exists() and out.stat().st_mtime >= max(d.stat().st_mtime for d in deps)


def snapshot_program():
    """c/cuda_snapshot.c linked with libsnapframework.so and libsnapmath.so (each linked with the
    stand-in runtime), rpaths to both directories."""
    lib = fake_cuda()
    BUILD.mkdir(parents=True, exist_ok=True)
    for name, src in (("snapframework", "snapshot_framework.c"), ("snapmath", "snapshot_mathlib.c")):
        so = BUILD / f"lib{name}.so"
        if not _fresh(so, [C_DIR / src, lib / "libcudart.so.12"]):
            tmp = so.with_name(f".{so.name}.tmp")
            subprocess.run([*CFLAGS, "-o", str(tmp), str(C_DIR / src), f"-L{lib}", "-lcudart", f"-Wl,-rpath,{lib}"], check=True)
            tmp.replace(so)
    out = BUILD / "cuda_snapshot"
    src = C_DIR / "cuda_snapshot.c"
    deps = [src, C_DIR / "check.h", ROOT / "include" / "tensormalloc.h", BUILD / "libsnapframework.so", BUILD / "libsnapmath.so"]
    if not _fresh(out, deps):
        tmp = out.with_name(f".{out.name}.tmp")
        subprocess.run(["gcc", "-O1", "-g", "-Wall", "-o", str(tmp), str(src), "-ldl", f"-L{BUILD}", "-lsnapframework", "-lsnapmath",
                        # the stand-in runtime dlopens libcuda.so.1: keep it loaded though no symbol of it is used
                        f"-L{lib}", "-lcudart", "-Wl,--no-as-needed", "-lcuda", "-Wl,--as-needed", f"-Wl,-rpath,{BUILD}:{lib}"],
                       check=True)
        tmp.replace(out)
    return str(out)


def run_program(arg, env=None):
    proc = ok(run([snapshot_program(), arg], env=env))
    return proc, json.loads(proc.stdout)


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def blocks_of(snap, device):
    return [b for s in snap["segments"] if s["device"] == device for b in s["blocks"]]


def block_at(snap, addr):
    found = [(s, b) for s in snap["segments"] for b in s["blocks"] if b["address"] == addr]
    assert len(found) == 1, f"{addr:#x}: {found}"
    return found[0]


def check_shape(snap):
    """Every field as torch/csrc/cuda/memory_snapshot.cpp writes it, and the blocks tiling their
    segments (what `stats` asserts and the viewer assumes)."""
    assert set(snap) == {"segments", "device_traces", "allocator_settings"}
    assert isinstance(snap["device_traces"], list)
    for s in snap["segments"]:
        assert set(s) == SEGMENT_KEYS, s.keys()
        assert all(isinstance(s[k], int) and not isinstance(s[k], bool) for k in
                   ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream"))
        assert s["segment_type"] in ("small", "large") and s["segment_pool_id"] == (0, 0)
        assert s["is_expandable"] is False and s["frames"] == []
        assert s["device"] < len(snap["device_traces"]), "the viewer reads device_traces[seg.device]"
        addr = s["address"]
        for b in s["blocks"]:
            assert set(b) == BLOCK_KEYS, b.keys()
            assert b["address"] == addr, "blocks tile the segment in address order"
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
            assert b["requested_size"] == (0 if b["state"] == "inactive" else b["size"])
            assert isinstance(b["frames"], list)
            for f in b["frames"]:
                assert set(f) == {"filename", "line", "name"} and f["line"] == 0
            addr += b["size"]
        assert addr == s["address"] + s["total_size"]
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
        assert s["requested_size"] == s["allocated_size"]
    for trace in snap["device_traces"]:
        for e in trace:
            assert set(e) == (EVENT_KEYS - {"addr"} | {"device_free"} if e["action"] == "oom" else EVENT_KEYS), e
            assert e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom")


def frame_of(block):
    assert len(block["frames"]) == 1, block
    f = block["frames"][0]
    return f["filename"].rsplit("/", 1)[-1], f["name"]


def size_text(n):
    """_memory_viz's own rendering of a byte count (its _format_size)."""
    for unit in ["", "Ki", "Mi", "Gi", "Ti"]:
        if abs(n) < 1024.0:
            return f"{n:3.1f}{unit}B"
        n /= 1024.0
    return f"{n:.1f}PiB"


@pytest.fixture(scope="module")
def taken(tmp_path_factory):
    path = tmp_path_factory.mktemp("snapshot") / "snap.pickle"
    _, figures = run_program(str(path))
    assert figures["rc"] == 0
    return path, figures


def test_the_reader_is_pytorchs_own():
    assert VIZ_FILE.is_file(), "PyTorch's _memory_viz.py is missing: run scripts/setup"
    text = VIZ_FILE.read_text()
    assert "def segsum(data):" in text and "def trace_plot(" in text and "torch.cuda.memory._snapshot()" in text


def test_device_blocks_are_as_pytorch_writes_them(taken):
    path, figures = taken
    snap = load(path)
    check_shape(snap)
    assert sum(s["total_size"] for s in snap["segments"]) == figures["cuda_reserved_bytes"]
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sum(b["size"] for b in live) == figures["cuda_live_bytes"]
    assert {s["device"] for s in snap["segments"]} == {0}
    f1, f3 = figures["framework_device"]
    (m1,) = figures["mathlib_device"]
    seg, block = block_at(snap, f3)
    assert seg["segment_type"] == "small" and block["state"] == "active_allocated"
    seg, block = block_at(snap, m1)
    assert seg["segment_type"] == "large" and block["size"] == 7 * MB // 4
    assert snap["allocator_settings"]["allocator"].startswith("tensormalloc ")


def test_frames_name_the_libraries_that_asked(taken):
    snap = load(taken[0])
    f1, f3 = taken[1]["framework_device"]
    (m1,) = taken[1]["mathlib_device"]
    assert frame_of(block_at(snap, f1)[1]) == ("libsnapframework.so", "framework_device")
    assert frame_of(block_at(snap, f3)[1]) == ("libsnapframework.so", "framework_device")
    assert frame_of(block_at(snap, m1)[1]) == ("libsnapmath.so", "mathlib_workspace")


def test_the_timeline_has_the_allocations_and_frees(taken):
    snap = load(taken[0])
    trace = snap["device_traces"][0]
    actions = [e["action"] for e in trace]
    assert actions.count("alloc") == 5 and actions.count("free_requested") == actions.count("free_completed") == 2
    assert actions.count("segment_alloc") == len(snap["segments"]) == 2
    allocs = {e["addr"]: e for e in trace if e["action"] == "alloc"}
    (m1,) = taken[1]["mathlib_device"]
    assert frame_of(allocs[m1]) == ("libsnapmath.so", "mathlib_workspace")
    assert all(e["time_us"] > 1_600_000_000 * 10**6 for e in trace), "wall-clock microseconds"
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)


def test_host_blocks_go_to_the_host_file(taken):
    path, figures = taken
    host = load(f"{path}.host.pickle")
    check_shape(host)
    assert len(host["device_traces"]) == 2, "device 0: large host blocks, device 1: pinned"
    large = blocks_of(host, 0)
    assert sum(b["size"] for b in large) == figures["host_live_bytes"]
    (h1,) = figures["framework_host"]
    (h2,) = figures["mathlib_host"]
    assert {b["address"] for b in large} >= {h1, h2}
    assert frame_of(block_at(host, h1)[1]) == ("libsnapframework.so", "framework_host")
    assert frame_of(block_at(host, h2)[1]) == ("libsnapmath.so", "mathlib_host")
    (p1,) = figures["pinned"]
    seg, block = block_at(host, p1)
    assert seg["device"] == 1 and block["state"] == "active_allocated" and block["size"] >= 4 * MB


def test_memory_viz_stats_match_tm_get_stats(taken):
    path, figures = taken
    out = ok(subprocess.run([*VIZ, "stats", str(path)], capture_output=True, text=True)).stdout
    snap = load(path)
    assert f"segments: {len(snap['segments'])}\n" in out, out
    assert f"total_reserved: {size_text(figures['cuda_reserved_bytes'])}\n" in out, out
    assert f"total_allocated: {size_text(figures['cuda_live_bytes'])}\n" in out, out
    # The 20 MiB segment (at least PAGE_SIZE, 20 MiB) gets a row of its own.
    assert re.search(r"^\[.*\] 20\.0MiB allocated, ", out, re.M), out
    host = ok(subprocess.run([*VIZ, "stats", f"{path}.host.pickle"], capture_output=True, text=True)).stdout
    pinned = sum(b["size"] for b in blocks_of(load(f"{path}.host.pickle"), 1) if b["state"] == "active_allocated")
    assert f"total_allocated: {size_text(figures['host_live_bytes'] + pinned)}\n" in host, host


def test_memory_viz_trace_and_trace_plot(taken, tmp_path):
    path, _ = taken
    out = ok(subprocess.run([*VIZ, "trace", str(path)], capture_output=True, text=True)).stdout
    assert "Device 0 ----" in out and "cudaMalloc(" in out, out
    html = tmp_path / "out.html"
    ok(subprocess.run([*VIZ, "trace_plot", str(path), "-o", str(html)], capture_output=True, text=True))
    found = re.search(r"const local_files = (\[.*\])", html.read_text())
    embedded = pickle.loads(base64.b64decode(json.loads(found.group(1))[0]["base64"]).rstrip(b"\0"))
    assert embedded == load(path)


def test_segments_flamegraph_input_names_both_libraries(taken):
    """`segments` and `memory` hand flamegraph.pl (which they download from GitHub on first use)
    one line per block: what they make of our snapshot, without the drawing."""
    path, figures = taken
    code = f"""
import pickle
{LOAD_VIZ}
snap = pickle.load(open({str(path)!r}, "rb"))
print(v.segments(snap, format_flamegraph=lambda lines: lines), end="")
print(v.memory(snap, format_flamegraph=lambda lines: lines), end="")
"""
    lines = ok(subprocess.run([PY, "-c", code], capture_output=True, text=True)).stdout.splitlines()
    f1, _ = figures["framework_device"]
    assert any(l.startswith(f"stream_0;seg_") and ";active_allocated;libsnapframework.so:0:framework_device " in l for l in lines), lines
    assert any(";active_allocated;libsnapmath.so:0:mathlib_workspace 1835008" in l for l in lines), lines
    total = sum(int(l.rsplit(" ", 1)[1]) for l in lines if l.startswith("stream_0;seg_"))
    assert total == figures["cuda_reserved_bytes"]


def test_at_exit_and_an_unwritable_path(tmp_path):
    path = tmp_path / "exit.pickle"
    proc, figures = run_program("-", env={"TENSORMALLOC_SNAPSHOT_AT_EXIT": str(path)})
    assert proc.stderr == ""
    snap = load(path)
    check_shape(snap)
    (m1,) = figures["mathlib_device"]
    assert block_at(snap, m1)[1]["state"] == "active_allocated"
    assert load(f"{path}.host.pickle")["segments"]
    bad = "/nonexistent-dir/x.pickle"
    proc, figures = run_program(bad, env={"TENSORMALLOC_SNAPSHOT_AT_EXIT": bad})
    assert figures["rc"] == -2, "tm_snapshot: -ENOENT"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tensormalloc: TENSORMALLOC_SNAPSHOT_AT_EXIT={bad}: cannot write"), proc.stderr
    assert "No such file or directory" in lines[0]


def test_python_snapshot(tmp_path):
    code = f"""
import pickle, numpy as np, tensormalloc
a = np.ones(3_000_000)                       # 24 MB: a large host block
paths = tensormalloc.snapshot({str(tmp_path / 'py.pickle')!r})
print(paths[1].endswith(".host.pickle"))
host = pickle.load(open(paths[1], "rb"))
print(any(b["size"] >= a.nbytes and b["state"] == "active_allocated" for s in host["segments"] for b in s["blocks"]))
dev = pickle.load(open(paths[0], "rb"))
print(dev["segments"], dev["device_traces"])
try:
    tensormalloc.snapshot("/nonexistent-dir/x.pickle")
except OSError as e:
    print(e.errno, e.filename)
import os
# The paths returned are the files written: %p is the process id, %% a percent sign.
named = tensormalloc.snapshot({str(tmp_path / 'pid_%p_100%%.pickle')!r})
print(named[0] == {str(tmp_path)!r} + f"/pid_{{os.getpid()}}_100%.pickle", all(os.path.exists(p) for p in named))
try:
    tensormalloc.snapshot({str(tmp_path / 'cut')!r} + "\\0more")
except ValueError as e:
    print("refused:", e, os.path.exists({str(tmp_path / 'cut')!r}))
"""
    out = ok(run([PY, "-c", code], env={"PYTHONPATH": str(ROOT / "python")}))
    assert out.stdout.splitlines() == ["True", "True", "[] []", "2 /nonexistent-dir/x.pickle", "True True",
                                       "refused: embedded null byte False"], out.stdout + out.stderr
