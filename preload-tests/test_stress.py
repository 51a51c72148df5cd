"""The stress program (c/stress.c) for a few seconds under several settings; the long soak run
is `scripts/soak MINUTES` (not in CI; its last result is in docs/testing.md)."""
import json
import sys

import pytest

from conftest import compile_c, ok, run
from test_host import SETTINGS


@pytest.mark.parametrize("setting", ["defaults", "pushed", "no-hugepages"])
def test_stress(setting, tmp_path):
    report = tmp_path / "stats.json"
    env = {**SETTINGS[setting], "TENSORMALLOC_STATS": f"json:{report}"}
    out = ok(run([compile_c("stress"), "4"], env=env, timeout=120))
    assert "stress ok" in out.stdout
    # The contents checks ran over hits, gathered pages and fresh mappings alike.
    host = json.loads(report.read_text())["host"]
    assert host["hits"] > 0 and host["grows"] > 0 and host["misses"] > 0, host


def test_stress_over_jemalloc():
    from conftest import LIB, find_peer
    out = ok(run([compile_c("stress"), "3"], preload=f"{LIB} {find_peer('libjemalloc.so.2')}", timeout=120))
    assert "stress ok" in out.stdout


def test_next_allocator_calling_back_through_the_plt():
    """A next allocator whose calloc and realloc call malloc and free through the PLT re-enters
    us from inside itself: every such call must be served (no recursion, no lost block)."""
    import subprocess
    from conftest import BUILD, C_DIR, LIB
    lib = BUILD / "libplt_next.so"
    subprocess.run(["gcc", "-O1", "-g", "-shared", "-fPIC", "-o", str(lib), str(C_DIR / "plt_next.c")], check=True)
    preload = f"{LIB} {lib}"
    out = ok(run([compile_c("stress"), "3"], preload=preload, timeout=120))
    assert "stress ok" in out.stdout
    ok(run([compile_c("contract")], preload=preload))
    # Python's own small callocs and reallocs took that path, many times over.
    probe = "import ctypes, sys; f = ctypes.CDLL(None).plt_next_reentries; f.restype = ctypes.c_uint64; print(f())"
    out = ok(run([sys.executable, "-c", probe], preload=preload))
    assert int(out.stdout) > 100, out.stdout
