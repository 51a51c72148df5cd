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


@pytest.mark.parametrize("setting", ["defaults", "pushed"])
def test_numpy_suite_same_failures(setting):
    base, base_count = baseline("numpy", numpy_suite)
    ours, count = numpy_suite(True, SETTINGS[setting])
    assert base_count > 10_000, "numpy's suite did not run"
    assert count == base_count
    assert ours == base, f"new: {sorted(ours - base)}; gone: {sorted(base - ours)}"


@pytest.mark.parametrize("setting", ["defaults", "pushed"])
def test_cpython_suite_same_failures(setting):
    base, base_count = baseline("cpython", cpython_suite)
    ours, count = cpython_suite(True, SETTINGS[setting])
    assert base_count > 500, "CPython's tests did not run"
    assert count == base_count
    assert ours == base, f"new: {sorted(ours - base)}; gone: {sorted(base - ours)}"
