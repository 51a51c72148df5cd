"""glibc's malloc controls and inspection calls (malloc_trim, mallopt, mallinfo2, malloc_info,
malloc_stats) with large blocks: each answers as under glibc alone (route/control.rs,
report/glibc.rs), from C and, through the C library's handle, from Python's ctypes."""
import sys

import pytest

from conftest import LIB, compile_c, ok, run

SCENARIOS = ["trim", "mallinfo", "mmap-max", "trim-threshold", "trim-threshold-never", "mmap-threshold", "info"]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_controls(scenario, preload):
    # A long release delay: without malloc_trim the cache would keep every block.
    out = ok(run([compile_c("malloc_controls"), scenario], preload=preload, env={"TENSORMALLOC_HOST_RELEASE_MS": "60000"}))
    assert f"{scenario} ok" in out.stdout
    if scenario == "info":
        assert "Total (incl. mmap):" in out.stderr, "the next allocator's malloc_stats"
        if preload:
            assert "tensormalloc (large blocks, mmapped):" in out.stderr and "in use bytes     =   62914560" in out.stderr


PYTHON_TRIM = """
import ctypes, numpy as np
libc = ctypes.CDLL("libc.so.6")
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
arrays = [np.ones(5_000_000) for _ in range(10)]
del arrays
before = rss()
released = libc.malloc_trim(0)
print(before, rss(), released)
"""


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_malloc_trim_through_ctypes_gives_the_cache_back(preload):
    """The idiom of data pipelines and notebooks: malloc_trim through the C library's handle."""
    out = ok(run([sys.executable, "-c", PYTHON_TRIM], preload=preload, env={"TENSORMALLOC_HOST_RELEASE_MS": "60000"}))
    before, after, released = map(int, out.stdout.split())
    base = 60  # the interpreter and numpy
    assert after < base + 40, out.stdout
    if preload:
        assert before > base + 300 and released == 1, out.stdout


@pytest.mark.parametrize("how", ["MALLOC_PERTURB_", "MALLOC_PERTURB_-hex", "tunable", "mallopt", "mallopt-negative", "mallopt-composed"])
def test_glibc_perturbation_reaches_every_block(how):
    """Note [Memory debuggers]: glibc's perturbation fills each block malloc hands out with
    perturb ^ 0xff, to expose reads of memory never written. Asked by MALLOC_PERTURB_ (in any
    base strtoul reads), the glibc.malloc.perturb tunable or mallopt(M_PERTURB) (a negative value
    too, and after M_MMAP_MAX = 0 is taken back), we step aside (one line for the environment's),
    and large and mid-size blocks read as under glibc alone. Before, a fresh large block read zero
    and a reused one its previous owner's bytes."""
    env = {"MALLOC_PERTURB_": {"MALLOC_PERTURB_": "165"}, "MALLOC_PERTURB_-hex": {"MALLOC_PERTURB_": "0x5a"},
           "tunable": {"GLIBC_TUNABLES": "glibc.malloc.perturb=165"}}.get(how, {})
    argv = [compile_c("perturb")] + ([how] if how.startswith("mallopt") else [])
    alone = ok(run(argv, preload=False, env=env))
    byte = "a5" if how.endswith("hex") else "5a"
    assert alone.stdout == "".join(f"{w} {byte} {byte}\n" for w in ["large", "large-again", "mid", "mid-again"]), alone.stdout
    out = ok(run(argv, env=env))
    assert out.stdout == alone.stdout
    assert out.stderr.count("steps aside") == (0 if how.startswith("mallopt") else 1), out.stderr


@pytest.mark.parametrize("env", [{"MALLOC_PERTURB_": "256"}, {"GLIBC_TUNABLES": "glibc.malloc.perturb=1000"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.perturb=165:glibc.malloc.perturb=0"},
                                 {"MALLOC_PERTURB_": "165", "GLIBC_TUNABLES": "glibc.malloc.perturb=0"}],
                         ids=["past-255", "tunable-past-255", "tunable-last-0", "tunable-over-env"])
def test_perturb_settings_glibc_ignores_leave_us_serving(env):
    """glibc takes a perturb byte of 0 to 255 only, the last glibc.malloc.perturb in
    GLIBC_TUNABLES deciding, and the tunable over MALLOC_PERTURB_ (config/glibc.rs). These
    perturb nothing under glibc alone; we stepped aside for them all the same, with a line on
    stderr and no cache for the process's life (the glibc-tools hunter). Now: no line, and the
    large block freed is cached (the second reads the first's bytes, 0x11)."""
    argv = [compile_c("perturb")]
    alone = ok(run(argv, preload=False, env=env))
    assert alone.stdout.startswith("large 00 00\n"), "glibc alone does not perturb: " + alone.stdout
    out = ok(run(argv, env=env))
    assert "steps aside" not in out.stderr and out.stderr == "", out.stderr
    assert "large-again 11 11\n" in out.stdout, out.stdout
