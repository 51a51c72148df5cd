"""What a memory cgroup and RSS show of idle cached blocks (Note [What RSS shows]), for real: a
process in a v1 memory cgroup with a limit keeps 300 MiB live and frees two 48 MiB blocks. Near
the limit (512 MiB), under TENSORMALLOC_HOST_RELEASE=auto, the idle blocks leave the cgroup's usage
once the release delay has passed, as under glibc alone (which unmaps them at free); with room
(4 GiB) they stay as lazily freed pages, reused without a fault, and the report says so; `lazy`
and `now` fix the choice whatever the room. Needs a writable v1 memory controller (these
machines have one at /sys/fs/cgroup/memory, writable as root). TM_TEST_LIB=PATH runs them
against another build."""
import json
import os
from pathlib import Path

import pytest

from conftest import LIB, compile_c, ok, run

LIB = os.environ.get("TM_TEST_LIB") or str(LIB)

V1 = Path("/sys/fs/cgroup/memory")
MIB = 1 << 20


def own_memory_cgroup():
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return V1 / path.lstrip("/")
    return None


@pytest.fixture
def cgroup(request):
    parent = own_memory_cgroup()
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("no writable v1 memory cgroup here (needs /sys/fs/cgroup/memory as root)")
    made = []

    def make(limit_bytes):
        d = parent / f"tm-test-{os.getpid()}-{len(made)}"
        d.mkdir()
        made.append(d)
        (d / "memory.limit_in_bytes").write_text(str(limit_bytes))
        return d

    yield make
    for d in made:
        d.rmdir()


def idle_usage(cgroup_dir, preload, env):
    program = compile_c("cgroup_idle")
    # The shell joins the cgroup, then becomes the program: everything it maps is charged there.
    argv = ["sh", "-c", f'echo $$ > {cgroup_dir}/cgroup.procs && exec {program} 300 1200']
    out = ok(run(argv, preload=LIB if preload else False, env={"TENSORMALLOC_HOST_RELEASE_MS": "200", "TENSORMALLOC_STATS": "1", **env}))
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return figures, out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_near_the_limit_idle_blocks_leave_the_cgroups_usage(cgroup, preload):
    figures, _ = idle_usage(cgroup(512 * MIB), preload, {})
    assert figures["idle"] - figures["live"] < 24 * MIB, figures
    assert figures["lazyfree"] == 0


def test_with_room_idle_blocks_stay_lazily_freed(cgroup):
    figures, _ = idle_usage(cgroup(4096 * MIB), True, {})
    assert figures["idle"] - figures["live"] > 64 * MIB, f"MADV_FREE kept with room: {figures}"
    assert (figures["lazyfree"], figures["resident"]) == (96 * MIB, 0), "stats() says what RSS holds"


@pytest.mark.parametrize("mode", ["now", "lazy"])
def test_the_release_setting_fixes_the_choice(cgroup, mode):
    # now with room drops at once; lazy near the limit keeps the pages charged.
    limit = 4096 * MIB if mode == "now" else 512 * MIB
    figures, _ = idle_usage(cgroup(limit), True, {"TENSORMALLOC_HOST_RELEASE": mode})
    left = figures["idle"] - figures["live"]
    assert (left < 24 * MIB) if mode == "now" else (left > 64 * MIB), figures


def test_the_trace_carries_the_lazily_freed_bytes_for_the_plot(tmp_path):
    # No cgroup needed: the program reads its own (the root one here), and has room.
    trace = tmp_path / "trace.bin"
    ok(run([compile_c("cgroup_idle"), "40", "600"], preload=LIB,
           env={"TENSORMALLOC_HOST_RELEASE_MS": "100", "TENSORMALLOC_HOST_RELEASE": "lazy", "TENSORMALLOC_TRACE": str(trace)}))
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    from tensormalloc import plot
    d = plot.series(plot.load(trace))
    assert max(d["lazily_freed"]) == 96 * MIB, "both freed 48 MiB blocks, MADV_FREE'd, in a sample"
    assert all(lazy <= cached for lazy, cached in zip(d["lazily_freed"], d["cached"]))
    plot.draw(plot.load(trace), tmp_path / "trace.png")
    assert (tmp_path / "trace.png").stat().st_size > 10_000


@pytest.mark.parametrize("mode", ["small", "fork", "mmap"])
@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_memory_freed_is_not_held_against_the_cgroups_limit(cgroup, preload, mode):
    """Note [Hot within the memory]: in a 512 MiB cgroup, 200 MiB live, 120 MiB of large blocks
    freed, then at once 250 MiB more (small mallocs, a forked child's, the program's own mmap).
    glibc alone unmapped the blocks at free and fits (about 453 MiB at its peak). Our cache held
    them hot, pages the kernel cannot take back without swap, and the cgroup's OOM killer ended
    the program (SIGKILL) in every mode. Now no more than a sixteenth of the limit stays hot."""
    d = cgroup(512 * MIB)
    argv = ["sh", "-c", f'echo $$ > {d}/cgroup.procs && exec {compile_c("cgroup_oom")} {mode}']
    out = run(argv, preload=LIB if preload else False)
    kills = next(int(line.split()[1]) for line in (d / "memory.oom_control").read_text().splitlines() if line.startswith("oom_kill "))
    assert (out.returncode, kills) == (0, 0), (out.returncode, out.stdout, out.stderr)
    assert f"{mode}: done" in out.stdout
