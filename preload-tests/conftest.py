"""Helpers for the process-level tests: every test runs a real program under LD_PRELOAD."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "target" / "release" / "libtensormalloc.so"
BUILD = ROOT / "target" / "preload-tests"
C_DIR = Path(__file__).resolve().parent / "c"


def find_peer(name):
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        p = Path(d) / name
        if p.exists():
            return str(p)
    raise AssertionError(f"{name} is not installed: run scripts/setup")


def compile_c(name, extra=()):
    """Builds preload-tests/c/NAME.c once per session; returns the binary's path."""
    BUILD.mkdir(parents=True, exist_ok=True)
    out = BUILD / name
    src = C_DIR / f"{name}.c"
    deps = [src, C_DIR / "check.h", ROOT / "include" / "tensormalloc.h"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        cmd = ["gcc", "-O1", "-g", "-Wall", "-Wno-alloc-size-larger-than", "-fno-builtin", "-pthread", "-o", str(out), str(src), "-ldl", *extra]
        subprocess.run(cmd, check=True)
    return str(out)


def run(argv, preload=True, env=None, timeout=120, **kw):
    """Runs argv with the library preloaded (or not); returns the CompletedProcess."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_")}
    e.pop("LD_PRELOAD", None)
    if preload:
        e["LD_PRELOAD"] = str(LIB) if preload is True else preload
    # TM_TEST_CUDA_SEGMENTS=expandable runs the whole suite's device scenarios over expandable
    # segments (a test that sets its own TENSORMALLOC_CUDA_SEGMENTS keeps it).
    if os.environ.get("TM_TEST_CUDA_SEGMENTS"):
        e["TENSORMALLOC_CUDA_SEGMENTS"] = os.environ["TM_TEST_CUDA_SEGMENTS"]
    e.update(env or {})
    return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=timeout, **kw)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session", autouse=True)
def library_built():
    assert LIB.exists(), f"{LIB} missing: run cargo build --release first (scripts/test does)"


def compile_cxx(name, shared=False, extra=(), as_name=None):
    """Builds preload-tests/c/NAME.cc with g++ once per session (a shared library NAME.so when
    asked; `as_name` names a build with `extra` flags of its own); returns its path."""
    BUILD.mkdir(parents=True, exist_ok=True)
    base = as_name or name
    out = BUILD / (f"{base}.so" if shared else base)
    src = C_DIR / f"{name}.cc"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        kind = ["-shared", "-fPIC"] if shared else []
        cmd = ["g++", "-std=c++17", "-O1", "-g", "-Wall", "-fno-allocation-dce", *kind, "-o", str(out), str(src), "-ldl", *extra]
        subprocess.run(cmd, check=True)
    return str(out)
