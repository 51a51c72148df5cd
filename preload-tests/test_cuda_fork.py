"""Forked children of a process whose threads use the device pool (Note [Forked children] in
src/device/device_layer/mod.rs): each gets the driver's answer (3) from every entry point, hangs on no
lock a parent thread held, frees and hands out none of the parent's blocks, and its exit report
lists none of them. Over the stand-ins alone and under the preload in every pool mode."""
import pytest

from conftest import ok
from cudasim import run_scenario, cuda_program
from conftest import run
from test_cuda_correct import MODES


def test_alone():
    out = ok(run([cuda_program("cuda_fork"), "40"], preload=False, timeout=120))
    assert "forks 40 bad children 0" in out.stdout


@pytest.mark.parametrize("mode", MODES)
def test_under_the_preload(mode):
    env = dict(MODES[mode], TENSORMALLOC_STATS="1")
    out = ok(run([cuda_program("cuda_fork"), "40"], env=env, timeout=120))
    assert "forks 40 bad children 0" in out.stdout
    # One exit report: the parent's (children exit with _exit); its figures are its own.
    assert out.stderr.count("tensormalloc 0.1.0 report") == 1, out.stderr
