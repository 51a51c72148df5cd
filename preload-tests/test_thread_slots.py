"""A block a thread frees and asks for again waits in a slot of the thread's own (Note [A
thread's own slot] in src/host/thread_slots.rs): as a process, beside glibc alone, what the
figures, other threads, a fork, the idle release, a mapping of the program's and malloc_trim
see of it."""
import pytest

from conftest import compile_c, ok, run


@pytest.mark.parametrize("mode", ["counts", "threads", "crowd", "generations", "fork", "idle", "mapped", "trim"])
@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_block_in_its_threads_slot(mode, preload):
    env = {"TENSORMALLOC_HOST_RELEASE_MS": "100", "TENSORMALLOC_HOST_RELEASE": "now"}
    if mode == "idle" and not preload:
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)  # glibc alone unmaps at free
    out = ok(run([compile_c("thread_slots"), mode], preload=preload, env=env))
    assert out.stdout == "ok\n"
