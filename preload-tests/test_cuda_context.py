"""Issue 18: segments and pinned blocks belong to a context instance. A primary context released to
zero and retained again (by symbol, the older name, cuGetProcAddress or dlsym), or a context
destroyed and its handle given to a new one, never gets memory of the dead one back; two contexts
racing their first allocation never share a pool. Each scenario of c/cuda_context.c runs over the
stand-in driver (a simulator, c/fakecuda.c: handles reused, cuMemAlloc slowed to widen the race)
without tensormalloc, and under it in every pool mode and in pass-through."""
import json

import pytest

from conftest import ok, run
from cudasim import run_scenario, runtime13_program
from test_cuda_correct import MODES, POOLED

SCENARIOS = ["release", "release-v1", "release-proc", "release-dlsym", "release-shared", "destroy-reuse", "race"]
KNOBS = {"destroy-reuse": {"FAKECUDA_REUSE_CONTEXTS": "1"}, "race": {"FAKECUDA_ALLOC_DELAY_US": "20000"}}


def scenario(name, env=None, preload=True, stats=None):
    return run_scenario("cuda_context", name, {**KNOBS.get(name, {}), **(env or {})}, preload, stats)


@pytest.mark.parametrize("name", SCENARIOS)
def test_alone(name):
    out = ok(scenario(name, preload=False))
    assert f"{name} ok" in out.stdout


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SCENARIOS)
def test_under_the_preload(name, mode, tmp_path):
    stats = tmp_path / "stats.json"
    out = ok(scenario(name, MODES[mode], stats=stats))
    assert f"{name} ok" in out.stdout
    if mode in POOLED:
        report = json.loads(stats.read_text())
        pools = report["cuda"]
        assert sum(p["requests"] for p in pools) > 0, "the scenario must exercise the pool"
        if name.startswith("release") and name != "release-shared":
            assert sum(p["resets"] for p in pools) >= 1, pools


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "alone"])
@pytest.mark.parametrize("memory", ["device", "pinned", "reset"])
def test_a_context_a_library_releases_lives_on_for_the_runtime(memory, preload):
    """Note [The runtime set up before we serve it] (src/route/cuda.rs), c/runtime_context.c over
    NVIDIA's libcudart.so.13: a driver-API library's primary context current, the program's first
    runtime call cudaMalloc or cudaMallocHost, then the library's release. Alone the runtime holds
    the context; the pool used to answer without the runtime setting up, and the release
    destroyed the context and the block (cudaMemset 1, the read 700; SIGSEGV writing the pinned
    buffer: the cudart hunter)."""
    program, why = runtime13_program("runtime_context")
    if program is None:
        pytest.skip(why)
    out = ok(run([program, memory], preload=preload, timeout=60))
    assert out.stdout.endswith(f"{memory} ok\n"), out
