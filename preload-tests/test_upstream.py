"""numpy's own test suite and CPython's memory and thread regression tests under the preload:
exactly the same failures as without it, with our defaults and with every path pushed."""
import pytest

from test_host import SETTINGS
from upstream import cpython_suite, numpy_suite

_baseline = {}


def baseline(name, suite):
    if name not in _baseline:
        _baseline[name] = suite(False)
    return _baseline[name]


SUITES = {"numpy": (numpy_suite, 10_000), "cpython": (cpython_suite, 500)}


@pytest.mark.parametrize("setting", ["defaults", "pushed"])
@pytest.mark.parametrize("suite", SUITES)
def test_suite_has_the_same_failures(suite, setting):
    run_suite, at_least = SUITES[suite]
    base, base_count = baseline(suite, run_suite)
    ours, count = run_suite(True, SETTINGS[setting])
    if ours != base:
        # A suite this size has flaky tests: a difference must survive a second run of both
        # sides before it counts as ours.
        ours, count = run_suite(True, SETTINGS[setting])
        if ours != base:
            _baseline[suite] = run_suite(False)
            base, base_count = _baseline[suite]
    assert base_count > at_least, f"{suite}'s tests did not run"
    assert count == base_count
    assert ours == base, f"new: {sorted(ours - base)}; gone: {sorted(base - ours)}"
