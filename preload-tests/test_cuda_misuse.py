"""Issue 18: programs' mistakes and context-less frees get the driver's answers under the pool, and
the pool's segments are never freed by a program's call; a pooled block has a buffer id of its
own, new at every reuse; memory the pool caches is given back when an allocation it does not
serve (another context, the runtime's stream-ordered pool, managed memory, VMM) runs out; a
plugin loaded with RTLD_DEEPBIND that frees the program's blocks past us kills no other block.
Each scenario of c/cuda_misuse.c runs
over the stand-in driver and runtime (simulators, c/fakecuda.c and c/fakecudart.c) without
tensormalloc, and under it in every pool mode and in pass-through."""
import json

import pytest

from conftest import ok
from cudasim import cuda_plugin, run_scenario
from test_cuda_correct import MODES, POOLED

SCENARIOS = ["double-free", "double-free-driver", "interior-free", "double-free-host", "double-free-async",
             "free-host-thread", "free-no-context", "buffer-ids", "impossible-sizes", "deepbind-free", "oom-async", "oom-other-context",
             "oom-managed", "oom-vmm"]
# The scenarios that free a pointer the pool does not hold live, and the kind their line names.
REFUSED = {"double-free": "device", "double-free-driver": "device", "interior-free": "device",
           "double-free-host": "pinned", "double-free-async": "device"}


def scenario(name, env=None, preload=True, stats=None):
    env = dict(env or {})
    if name == "deepbind-free":
        env["CUDA_PLUGIN"] = cuda_plugin()
    return run_scenario("cuda_misuse", name, env, preload, stats)


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
    if name == "deepbind-free" and mode in ("split", "sync-reuse"):
        # The plugin's free reached the driver past us (Note [Frees that bypass us]): it refused
        # the block that shares a segment and freed the one that is a whole segment.
        assert "plugin frees 1 0" in out.stdout, out.stdout
    if name == "deepbind-free" and mode == "expandable":
        # Memory of the driver's virtual memory API is no cuMemAlloc allocation: the driver
        # refuses both frees, and no live block dies.
        assert "plugin frees 1 1" in out.stdout, out.stdout
    if mode in POOLED:
        report = json.loads(stats.read_text())
        requests = sum(p["requests"] for p in report["cuda"]) + report["pinned"]["requests"]
        assert requests > 0, "the scenario must exercise the pool"
        if name in REFUSED:
            # One line per kind, naming the pointer, however many bad frees the program made.
            lines = [l for l in out.stderr.splitlines() if "not a live block" in l]
            assert len(lines) == 1 and "0x" in lines[0] and REFUSED[name] in lines[0], out.stderr
    else:
        assert "not a live block" not in out.stderr
