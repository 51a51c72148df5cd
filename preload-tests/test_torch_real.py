"""Issue 36: real PyTorch (the registry's wheel in .venv-torch, with NVIDIA's CUDA 13 runtime) over
the stand-in driver (c/fakecuda.c and c/fakecuda_runtime.c, c/fakenvml.c: simulators), one process
per mode running py/torch_real.py's checks (allocation and copies, reuse, stats, empty_cache,
snapshot, pinned memory, streams, IPC of 4 KiB to 64 MiB tensors through a torch.multiprocessing
queue checked in the child, out of memory and recovery), each check a test:
- the stand-in alone: PyTorch's caching allocator, PYTORCH_NO_CUDA_MEMORY_CACHING=1 and
  PyTorch's expandable segments (with the stand-in NVML), which is what the other runs must match;
- under the preload: the same three, tensormalloc.torch.enable(), and TENSORMALLOC_CUDA_SEGMENTS=expandable;
- tensormalloc.torch.enable() with the library loaded by path (no preload).
Skipped only when .venv-torch is missing (scripts/setup makes it where the registry is reachable)."""
import json
from pathlib import Path

import pytest

from conftest import ROOT, run
from cudasim import fake_cuda

TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"
SCRIPT = Path(__file__).resolve().parent / "py" / "torch_real.py"

# (mode, preloaded, extra environment): the modes of py/torch_real.py.
RUNS = {
    "cache-alone": ("cache", False, {}),
    "no_caching-alone": ("no_caching", False, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
    "torch_expandable-alone": ("torch_expandable", False, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "cache-preload": ("cache", True, {}),
    "no_caching-preload": ("no_caching", True, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
    "hooks-preload": ("hooks", True, {}),
    "hooks-by-path": ("hooks", False, {}),
    "torch_expandable-preload": ("torch_expandable", True, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "tm_expandable-preload": ("tm_expandable", True, {"TENSORMALLOC_CUDA_SEGMENTS": "expandable"}),
}
CHECKS = ["devices", "copies", "reuse", "stats", "empty_cache", "snapshot", "pinned", "streams", "ipc", "oom"]


@pytest.fixture(scope="module")
def torch_python():
    if not TORCH_PYTHON.exists():
        pytest.skip(f"{TORCH_PYTHON} is missing: scripts/setup installs PyTorch there where the registry is reachable")
    return str(TORCH_PYTHON)


@pytest.fixture(scope="module", params=list(RUNS))
def result(request, torch_python):
    mode, preloaded, extra = RUNS[request.param]
    # Each run names its segments: the suite-wide TM_TEST_CUDA_SEGMENTS must not make one mode another.
    env = {"PYTHONPATH": str(ROOT / "python"), "LD_LIBRARY_PATH": str(fake_cuda()), "TORCH_REAL_STANDIN": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "TENSORMALLOC_CUDA_SEGMENTS": "classic", **extra}
    out = run([torch_python, str(SCRIPT), mode], preload=preloaded, env=env, timeout=900)
    last = out.stdout.strip().splitlines()[-1:] or [""]
    try:
        parsed = json.loads(last[0])
    except ValueError:
        parsed = None
    return request.param, out, parsed


@pytest.mark.parametrize("check", CHECKS)
def test_torch(result, check):
    name, out, parsed = result
    assert out.returncode == 0 and parsed, f"{name}: exit {out.returncode}\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    mode, preloaded, _ = RUNS[name]
    assert parsed["loaded_by"] == ("preload" if preloaded else "path" if mode == "hooks" else None), parsed["loaded_by"]
    c = parsed["checks"][check]
    assert c["ok"], f"{name} {check}: {c['detail']}\nstderr:\n{out.stderr[-2000:]}"


@pytest.mark.parametrize("preloaded", [False, True], ids=["alone", "preload"])
def test_a_producer_sharing_tensors_step_after_step_keeps_its_memory(torch_python, preloaded):
    """Note [Segments of their own]: 600 steps of a torch.multiprocessing producer that shares a
    fresh 1 MiB tensor each step, frees it and empties its cache, keeping one of its own every 9th
    step. Under the default preload the driver ends with what it has alone (within 8 MiB). Before,
    PyTorch's exported 2 MiB segments were blocks of our 20 MiB ones, never reused after their
    free: about 1 MiB of device memory was lost per step (out of memory at step 946 of 1,300)."""
    env = {"PYTHONPATH": str(ROOT / "python"), "LD_LIBRARY_PATH": str(fake_cuda()), "TORCH_REAL_STANDIN": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "TENSORMALLOC_CUDA_SEGMENTS": "classic"}
    script = str(SCRIPT.parent / "torch_ipc_loop.py")
    outs = [run([torch_python, script, "600"], preload=p, env=env, timeout=600) for p in ([False, True] if preloaded else [False])]
    results = []
    for out in outs:
        assert out.returncode == 0, f"exit {out.returncode}\nstdout:\n{out.stdout[-2000:]}\nstderr:\n{out.stderr[-2000:]}"
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert all(r["steps"] == 600 and r["error"] is None for r in results), results
    if preloaded:
        alone, ours = results
        assert abs(ours["free_mib"] - alone["free_mib"]) <= 8, results


@pytest.mark.parametrize("case", ["recovers", "fails"])
def test_our_report_waits_for_pytorchs_own_retry(torch_python, case):
    """Note [A report the program recovers from]: PyTorch frees its cache and asks again after a
    failed cudaMalloc. When that retry is served, nothing of ours is printed (before: the full
    report, at every such retry); when it fails too, our report is printed once, before PyTorch's
    OutOfMemoryError. PyTorch's own counts are the same with and without us."""
    env = {"PYTHONPATH": str(ROOT / "python"), "LD_LIBRARY_PATH": str(fake_cuda()), "TORCH_REAL_STANDIN": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "TENSORMALLOC_CUDA_SEGMENTS": "classic"}
    script = str(SCRIPT.parent / "torch_oom_retry.py")
    alone = run([torch_python, script, case], preload=False, env=env, timeout=300)
    ours = run([torch_python, script, case], preload=True, env=env, timeout=300)
    assert alone.returncode == 0 and ours.returncode == 0, (alone.stderr[-2000:], ours.stderr[-2000:])
    assert ours.stdout == alone.stdout == ("served 1 0\n" if case == "recovers" else "OutOfMemoryError 1 1\n"), (alone.stdout, ours.stdout)
    reports = [l for l in ours.stderr.splitlines() if l.startswith("tensormalloc: out of memory")]
    assert len(reports) == (0 if case == "recovers" else 1), ours.stderr


def test_a_memory_fraction_under_our_hooks_is_refused_plainly(torch_python):
    """PyTorch's pluggable allocator takes set_per_process_memory_fraction and ignores it: under
    tensormalloc.torch.enable() a 600 MiB tensor went past a 25% cap. It raises now, naming the
    setting that caps the pool; PyTorch's own allocator (no enable()) still honours it."""
    code = r"""
import sys, torch, tensormalloc.torch as tt
if sys.argv[1] == "hooks":
    tt.enable()
try:
    torch.cuda.set_per_process_memory_fraction(0.25)
    torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
    print("allocated past the cap")
except RuntimeError as e:
    print("refused:", "TENSORMALLOC_CUDA_LIMIT" in str(e) or "allowed" in str(e))
"""
    env = {"PYTHONPATH": str(ROOT / "python"), "LD_LIBRARY_PATH": str(fake_cuda()), "TORCH_REAL_STANDIN": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    for mode in ("hooks", "plain"):
        out = run([torch_python, "-c", code, mode], preload=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == "refused: True", (mode, out.stdout, out.stderr[-2000:])


@pytest.mark.parametrize("preloaded", [True, False], ids=["preload", "by-path"])
def test_the_hooks_figures_before_cuda_starts_and_in_a_forked_child_are_pytorchs(torch_python, preloaded):
    """Under tensormalloc.torch.enable(), memory_allocated() and the other figures asked before the
    first CUDA tensor started CUDA (a context on a real GPU; with no driver, "Found no NVIDIA
    driver"), and in a child forked after the parent used CUDA they raised "Cannot re-initialize
    CUDA in forked subprocess". PyTorch alone answers 0 and starts nothing: so do they now."""
    code = r"""
import os, sys, torch, tensormalloc.torch as tt
if sys.argv[1] == "hooks":
    tt.enable()
print("before", torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), dict(torch.cuda.memory_stats()), torch.cuda.is_initialized())
x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
print("parent", torch.cuda.memory_allocated() > 0)
pid = os.fork()
if pid == 0:
    try:
        print("child", torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), dict(torch.cuda.memory_stats()), flush=True)
    except Exception as e:
        print("child raised", type(e).__name__, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""
    env = {"PYTHONPATH": str(ROOT / "python"), "LD_LIBRARY_PATH": str(fake_cuda()), "TORCH_REAL_STANDIN": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    outs = {}
    for mode in ("hooks", "plain"):
        out = run([torch_python, "-W", "ignore", "-c", code, mode], preload=preloaded, env=env, timeout=300)
        assert out.returncode == 0, (mode, out.stdout, out.stderr[-2000:])
        outs[mode] = out.stdout
    assert outs["hooks"] == outs["plain"] == "before 0 0 {} False\nparent True\nchild 0 0 {}\n", outs


@pytest.mark.parametrize("preloaded", [True, False], ids=["preload", "by-path"])
def test_empty_cache_and_summary_before_cuda_and_in_a_forked_child(torch_python, preloaded):
    """py/torch_hook_edges.py: after tensormalloc.torch.enable(), torch.cuda.empty_cache()
    before CUDA had started started it (on a GPU, a context), and in a child forked after it
    started raised "Cannot re-initialize CUDA in forked subprocess"; memory_summary() before CUDA
    started called itself until RecursionError (the package hunter). Now each does what it does
    under PyTorch's own allocator."""
    env = {"PYTHONPATH": str(ROOT / "python"), "LD_LIBRARY_PATH": str(fake_cuda()), "TORCH_REAL_STANDIN": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "TENSORMALLOC_CUDA_SEGMENTS": "classic"}
    script = str(SCRIPT.parent / "torch_hook_edges.py")
    plain = run([torch_python, script, "plain"], preload=False, env=env, timeout=300)
    hooks = run([torch_python, script, "hooks"], preload=preloaded, env=env, timeout=300)
    assert plain.returncode == 0 and hooks.returncode == 0, (plain.stderr[-2000:], hooks.stderr[-2000:])
    expected = json.loads(plain.stdout.splitlines()[-1])
    assert expected["empty_cache_in_forked_child"] == "ok" and not expected["started_by_empty_cache"], expected
    assert json.loads(hooks.stdout.splitlines()[-1]) == expected
