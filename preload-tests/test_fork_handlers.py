"""Other libraries' fork handlers that allocate and free large blocks, registered before ours
(a linked library's constructor) and after (the program's own): no hang, and plain memory in
every child, as under glibc alone (Note [Fork handlers that allocate] in src/host/host_layer/fork.rs)."""
import subprocess

import pytest

from conftest import BUILD, C_DIR, ok, run


def program():
    BUILD.mkdir(parents=True, exist_ok=True)
    lib = BUILD / "libfork_handlers_lib.so"
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-shared", "-fPIC", "-fno-builtin", "-pthread", "-o", str(lib), str(C_DIR / "fork_handlers_lib.c")], check=True)
    out = BUILD / "fork_handlers"
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-fno-builtin", "-pthread", "-o", str(out), str(C_DIR / "fork_handlers.c"),
                    f"-L{BUILD}", "-lfork_handlers_lib", f"-Wl,-rpath,{BUILD}"], check=True)
    return str(out)


@pytest.mark.parametrize("which", ["all", "prepare", "parent", "child"])
@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_fork_handlers_that_allocate(which, preload):
    out = ok(run([program(), "50"], preload=preload, env={"FORK_HANDLERS_LIB": which}, timeout=90))
    assert "forks 50 bad children 0" in out.stdout


def test_fork_handlers_with_a_tiny_threshold():
    """Every block the handlers touch is ours, and the cache is busy at each fork."""
    out = ok(run([program(), "30"], env={"TENSORMALLOC_THRESHOLD": "64K", "FORK_HANDLERS_LIB": "all"}, timeout=90))
    assert "fork handlers ok" in out.stdout
