"""The host layer beside what else lives in the process (issue 19): an address-space limit set
before exec or by the program itself (Note [Room for others]), and another preloaded library that
hooks dlsym, before or after us (Note [Other dlsym hooks]). Each case also runs under glibc alone,
where it passes. TM_TEST_LIB=PATH runs them against another build (an older library, to see
them fail)."""
import os
import resource
import subprocess

import pytest

from conftest import BUILD, C_DIR, LIB, compile_c, ok, run

LIB = os.environ.get("TM_TEST_LIB") or str(LIB)


def hook_library():
    BUILD.mkdir(parents=True, exist_ok=True)
    out = BUILD / "dlsym_hook.so"
    src = C_DIR / "dlsym_hook.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(src), "-ldl"], check=True)
    return str(out)


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
@pytest.mark.parametrize("limit_mib", [1536, 2048, 4096])
def test_freed_memory_leaves_room_under_a_limit_the_program_sets(preload, limit_mib):
    out = ok(run([compile_c("address_limit"), str(limit_mib)], preload=LIB if preload else False))
    assert "900 of 900" in out.stdout and "64 of 64" in out.stdout


@pytest.mark.parametrize("setting", [{}, {"TENSORMALLOC_HOST_RELEASE_MS": "0"}], ids=["defaults", "release-0"])
def test_freed_memory_leaves_room_under_ulimit_v(setting):
    limit = 1536 << 20

    def ulimit_v():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # The program sets the same limit again: a no-op, so the limit is the one in force at exec.
    out = ok(run([compile_c("address_limit"), "1536"], preload=LIB, env=setting, preexec_fn=ulimit_v))
    assert "900 of 900" in out.stdout


def test_a_refused_absurd_request_keeps_the_cache():
    out = ok(run([compile_c("address_limit"), "65536"], preload=LIB))
    assert "after a refused 64 TiB request: reused" in out.stdout


@pytest.mark.parametrize("order", ["hook-first", "tensormalloc-first", "hook-alone"])
def test_another_dlsym_hook_sees_every_lookup_in_either_order(order):
    hook = hook_library()
    preload = {"hook-first": f"{hook} {LIB}", "tensormalloc-first": f"{LIB} {hook}", "hook-alone": hook}[order]
    # A hang (our malloc resolving to itself) ends in the timeout: the test fails, never blocks.
    out = ok(run([compile_c("dlsym_user")], preload=preload, timeout=30))
    assert "dlsym user ok" in out.stdout
    assert "hook saw 3 probe lookups" in out.stderr, out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_impossible_requests_leave_the_cache_alone(preload):
    """An alignment or a size no memory could satisfy: NULL/ENOMEM as glibc answers, the cache as
    it was, and nothing on stderr (issue 29, item 4)."""
    out = ok(run([compile_c("impossible")], preload=preload, env={"TENSORMALLOC_HOST_UNMAP_MS": "60000"}))
    assert "impossible ok" in out.stdout
    assert out.stderr == ""
