"""Issue 18: binding the driver. Look-ups of cu* names before libcuda.so.1 is loaded never stop the
driver being bound (and pooled) later, and 32 threads making the process's first driver calls at
once all get the driver's answers, never an error of ours, in every pool mode and in
pass-through; with the runtime's first calls, every one is pooled (none passed through because
our binding was still in progress). c/cuda_late.c over the stand-in driver (c/fakecuda.c, a simulator), built without
-lcuda so that it loads the driver when it chooses."""
import json

import pytest

from conftest import ok, run
from cudasim import unlinked_program
from test_cuda_correct import MODES, POOLED

# The requests each scenario makes of the pool when it serves them all.
REQUESTS = {"lookups": 200, "threads": 32, "runtime-threads": 32}
# The first-call race is won or lost within microseconds: a few processes make losing it likely.
RUNS = {"lookups": 1, "threads": 15, "runtime-threads": 15}


@pytest.mark.parametrize("name", REQUESTS)
def test_alone(name):
    out = ok(run([unlinked_program("cuda_late"), name], preload=False))
    assert f"{name} ok" in out.stdout


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", REQUESTS)
def test_under_the_preload(name, mode, tmp_path):
    for i in range(RUNS[name]):
        stats = tmp_path / f"stats{i}.json"
        out = ok(run([unlinked_program("cuda_late"), name], env={**MODES[mode], "TENSORMALLOC_STATS": f"json:{stats}"}))
        assert f"{name} ok" in out.stdout
        pools = json.loads(stats.read_text())["cuda"]
        requests = sum(p["requests"] for p in pools)
        assert requests == (REQUESTS[name] if mode in POOLED else 0), pools
