"""scripts/gpu-check's issue-18 program (gpu/issue18.c: release and retain, two contexts, double
frees, 32 threads' first calls) built over the stand-ins (a simulator, c/fakecuda.c, whose memset
"kernel" refuses memory of a dead or another context) instead of NVIDIA's libraries: each scenario
passes without tensormalloc, and under it in every pool mode and in pass-through, with the same
JSON line the GPU run reports. Proves the program's logic where no GPU is lent."""
import json

import pytest

from conftest import ok, run
from cudasim import gpu_program_over_standins
from test_cuda_correct import MODES, POOLED

SCENARIOS = ["release", "two-contexts", "double-free", "threads"]
KNOBS = {"two-contexts": {"FAKECUDA_ALLOC_DELAY_US": "20000"}, "threads": {"FAKECUDA_ALLOC_DELAY_US": "2000"}}


def scenario(name, env=None, preload=True, stats=None):
    env = {**KNOBS.get(name, {}), **(env or {})}
    if stats:
        env["TENSORMALLOC_STATS"] = f"json:{stats}"
    out = ok(run([gpu_program_over_standins("issue18"), name], env=env, preload=preload, timeout=120))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["scenario"] == name and result["failures"] == 0 and result["checks"] > 0, result
    return result


@pytest.mark.parametrize("name", SCENARIOS)
def test_alone(name):
    result = scenario(name, preload=False)
    if name == "double-free":
        assert (result["cudaFree_twice"], result["cuMemFree_twice"]) == (1, 1), result


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SCENARIOS)
def test_under_the_preload(name, mode, tmp_path):
    stats = tmp_path / "stats.json"
    result = scenario(name, MODES[mode], stats=stats)
    if name == "double-free":
        assert (result["cudaFree_twice"], result["cuMemFree_twice"]) == (1, 1), result
    if mode in POOLED:
        pools = json.loads(stats.read_text())["cuda"]
        assert sum(p["requests"] for p in pools) > 0, "the scenario must exercise the pool"
