"""Suites we did not write, run with and without the preload: numpy's own tests and a set of
CPython's regression tests that exercise memory and threads. A suite passes under tensormalloc
when it fails in exactly the tests it fails in without it. `python upstream.py numpy|cpython
[SETTING]` runs one by hand."""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from conftest import LIB

PY = sys.executable
CPYTHON_TESTS = ["test_threading", "test_gc", "test_mmap", "test_array", "test_bytes",
                 "test_thread", "test_weakref", "test_capi", "test_memoryview", "test_tracemalloc"]


def _env(preload, extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_") and k != "LD_PRELOAD"}
    if preload:
        e["LD_PRELOAD"] = str(LIB)
    e.update(extra or {})
    return e


def _failed(junit_path):
    """Test ids that failed or errored in a JUnit XML report, and the number run."""
    root = ET.parse(junit_path).getroot()
    failed, count = set(), 0
    for case in root.iter("testcase"):
        count += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(f"{case.get('classname')}::{case.get('name')}")
    return failed, count


def numpy_suite(preload, extra=None):
    import numpy
    f2py = Path(numpy.__file__).parent / "f2py"
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / "numpy.xml"
        subprocess.run([PY, "-m", "pytest", "--pyargs", "numpy", "-m", "not slow", f"--ignore={f2py}", "-q",
                        "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={junit}"],
                       env=_env(preload, extra), cwd=d, capture_output=True, text=True, timeout=1800)
        return _failed(junit)


def cpython_suite(preload, extra=None):
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / "cpython.xml"
        subprocess.run([PY, "-m", "test", "--junit-xml", str(junit), *CPYTHON_TESTS],
                       env=_env(preload, extra), cwd=d, capture_output=True, text=True, timeout=1800)
        return _failed(junit)


if __name__ == "__main__":
    suite = {"numpy": numpy_suite, "cpython": cpython_suite}[sys.argv[1]]
    base, n0 = suite(False)
    ours, n1 = suite(True)
    print(f"without preload: {n0} tests, {len(base)} failed; with: {n1} tests, {len(ours)} failed")
    print("new failures:", sorted(ours - base))
    print("fixed (flaky?):", sorted(base - ours))
