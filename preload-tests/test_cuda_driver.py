"""Issue 12: one pool for every CUDA program, whatever path its allocations take to the driver:
the symbols (-lcuda), dlopen + dlsym by name, cuGetProcAddress (both spellings), the runtime's
cudaGetDriverEntryPoint, and nvcc's static runtime (cudaMalloc inside the executable). Over the
stand-in driver and runtime (c/fakecuda.c, c/fakecudart.c: simulators)."""
import json
import re

import pytest

from conftest import ok, run
from cudasim import cuda_program, static_runtime_program

PATHS = ["linked", "dlsym", "procaddr", "procaddr-v1", "entry"]
PASSTHROUGH = {"pool-none": {"TENSORMALLOC_CUDA_POOL": "none"}, "disabled": {"TENSORMALLOC_DISABLE": "1"}}


def counters(out):
    m = re.search(r"mallocs (\d+) frees (\d+)(?: host_allocs (\d+))?", out.stdout)
    assert m, out.stdout + out.stderr
    return [int(g) if g else 0 for g in m.groups()]


def driver_run(path, workload, env=None, preload=True, stats=None):
    env = dict(env or {})
    if stats:
        env["TENSORMALLOC_STATS"] = f"json:{stats}"
    return ok(run([cuda_program("driver_api"), path, workload], env=env, preload=preload))


@pytest.mark.parametrize("path", PATHS)
def test_every_path_reaches_the_pool(path, tmp_path):
    stats = tmp_path / "s.json"
    mallocs, frees, _ = counters(driver_run(path, "pairs", stats=stats))
    assert mallocs <= 5 and frees == 0, (mallocs, frees)  # 1000 pairs of 32 MiB
    pools = json.loads(stats.read_text())["cuda"]
    assert sum(p["requests"] for p in pools) == 1000 and sum(p["hits"] for p in pools) >= 995, pools


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", PASSTHROUGH)
def test_pass_through_modes_leave_every_path_to_the_driver(path, mode):
    mallocs, frees, _ = counters(driver_run(path, "pairs", env=PASSTHROUGH[mode]))
    assert (mallocs, frees) == (1000, 1000)


@pytest.mark.parametrize("path", PATHS)
def test_without_us_every_path_is_the_drivers(path):
    assert counters(driver_run(path, "pairs", preload=False))[:2] == [1000, 1000]


def test_static_runtime_is_pooled_through_cu_get_proc_address(tmp_path):
    stats = tmp_path / "s.json"
    prog = static_runtime_program()
    out = ok(run([prog], env={"TENSORMALLOC_STATS": f"json:{stats}"}))
    mallocs, frees, _ = counters(out)
    assert mallocs <= 5 and frees == 0, out.stdout
    pools = json.loads(stats.read_text())["cuda"]
    assert sum(p["requests"] for p in pools) == 1000, pools
    assert counters(ok(run([prog], preload=False)))[:2] == [1000, 1000]
    assert counters(ok(run([prog], env={"TENSORMALLOC_CUDA_POOL": "none"})))[:2] == [1000, 1000]


@pytest.mark.parametrize("path", ["linked", "dlsym", "procaddr"])
@pytest.mark.parametrize("workload", ["pitch", "meminfo", "host"])
def test_pitch_meminfo_and_pinned_through_the_driver(path, workload):
    mallocs, frees, host_allocs = counters(driver_run(path, workload))
    if workload == "pitch":
        assert mallocs <= 3 and frees == 0
    if workload == "host":
        assert host_allocs == 1


@pytest.mark.parametrize("path", ["linked", "procaddr"])
def test_runtime_and_driver_blocks_share_one_pool(path, tmp_path):
    stats = tmp_path / "s.json"
    mallocs, frees, _ = counters(driver_run(path, "mixed", stats=stats))
    assert mallocs <= 3 and frees == 0
    pools = json.loads(stats.read_text())["cuda"]
    assert len(pools) == 1 and pools[0]["requests"] == 1000, pools  # each request counted once


def test_a_process_without_cuda_loads_no_driver_and_dlsym_still_answers():
    out = ok(run(["/bin/cat", "/proc/self/maps"]))
    assert "libcuda" not in out.stdout and "cudart" not in out.stdout
    probe = ("import ctypes; libc = ctypes.CDLL(None); f = libc.dlsym; f.restype = ctypes.c_void_p; "
             "f.argtypes = [ctypes.c_void_p, ctypes.c_char_p]; print(bool(f(None, b'printf')), bool(f(None, b'cuMemAlloc_v2x')))")
    import sys
    assert ok(run([sys.executable, "-c", probe])).stdout.split() == ["True", "False"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["split", "binned", "alone"])
def test_reset_range_and_ipc_on_every_path(path, mode, tmp_path):
    """Issue 11's guarantees hold whatever path the program reached the driver by: a block of a
    reset context never comes back, a range is the block's, and IPC of a block that shares a
    segment gets a handle of ours (split pool), never the segment's."""
    env = {"TENSORMALLOC_CUDA_POOL": "binned"} if mode == "binned" else {}
    preload = mode != "alone"
    for workload in ("reset", "range"):
        stats = tmp_path / f"{workload}.json"
        driver_run(path, workload, env=env, preload=preload, stats=stats if preload else None)
        if preload:  # the pool served these blocks: the guarantees are ours, not the driver's
            pools = json.loads(stats.read_text())["cuda"]
            assert sum(p["requests"] for p in pools) >= 2, pools
            if workload == "reset":
                assert sum(p["resets"] for p in pools) >= 1, pools
    # Note [IPC]: a block sharing its segment (split pool) gets a handle of ours on every path,
    # never the segment's; a whole-segment block (binned) and the driver alone, the driver's.
    out = driver_run(path, "ipc", env=env, preload=preload)
    assert f"ipc rc 0 ours {int(mode == 'split')}" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("scenario,env", [("rules", {}), ("no-vmm", {"FAKECUDA_NO_VMM": "1"})])
def test_the_stand_ins_virtual_memory_api_keeps_the_drivers_rules(scenario, env):
    """Issue 28, item 6: the stand-in driver's virtual memory API answers as NVIDIA documents
    it (c/vmm_rules.c, run without the library): granularity, alignment, one mapping per range,
    no access before cuMemSetAccess, whole-mapping unmap, a released handle kept while mapped;
    and a driver without the API says so."""
    out = ok(run([cuda_program("vmm_rules"), scenario], preload=False, env=env))
    assert f"{scenario} ok" in out.stdout
