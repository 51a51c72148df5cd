"""Output files (issue 30, items 1, 7, 8): `%p` in a path is the process id; off, 0, none,
false and empty mean off for every path setting; files are created 0600 and never through a
symlink planted at their path (one stderr line says why nothing was written)."""
import json
import os
import stat
import sys
import time

import pytest

from conftest import ROOT, compile_c, ok, run

# These tests are about files and numbers, not the threshold: at the default (128K) Python's own
# start and helpers (cp, the resource tracker) make large requests too; the old threshold keeps
# the counts to the requests the programs here make.
OLD_THRESHOLD = {"TENSORMALLOC_THRESHOLD": "4M"}

SETTINGS = {"stats": ("TENSORMALLOC_STATS", "json:{}"), "trace": ("TENSORMALLOC_TRACE", "{}"),
            "snapshot": ("TENSORMALLOC_SNAPSHOT_AT_EXIT", "{}")}


@pytest.mark.parametrize("word", ["off", "OFF", "0", "none", "false", "False", ""])
def test_off_means_off(tmp_path, word):
    env = {name: (form.format(word) if name != "TENSORMALLOC_STATS" else word) for name, form in SETTINGS.values()}
    out = ok(run([compile_c("contract")], env=env, cwd=tmp_path))
    assert os.listdir(tmp_path) == [], "no file written for an off setting"
    assert "tensormalloc:" not in out.stderr, out.stderr


def test_the_stats_file_survives_an_interrupted_reservation(tmp_path):
    """tmpfs before Linux 6.10 fails fallocate with EINTR whenever a caught signal arrives during
    it (a profiler's timer): the file's reservation is asked again, and the process still leaves
    its stats file, as it does uninterrupted. c/fallocate_interrupted.c, preloaded before us, fails
    the first three calls so."""
    from conftest import LIB
    shim = compile_c("fallocate_interrupted", extra=["-shared", "-fPIC"])
    stats = tmp_path / "stats.json"
    proc = ok(run([compile_c("contract")], preload=f"{shim} {LIB}", env={"TENSORMALLOC_STATS": f"json:{stats}"}))
    assert json.loads(stats.read_text())["host"], proc.stderr
    assert "tensormalloc:" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind", SETTINGS)
def test_percent_p_names_the_process_and_files_are_private(tmp_path, kind):
    name, form = SETTINGS[kind]
    proc = ok(run([compile_c("contract")], env={name: form.format(str(tmp_path / "out.%p"))}))
    written = [p for p in tmp_path.iterdir() if p.name.startswith("out.") and not p.name.endswith(".host.pickle")]
    assert len(written) == 1 and written[0].name[4:].isdigit(), os.listdir(tmp_path)
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, (p, oct(p.stat().st_mode))
    assert proc.returncode == 0


@pytest.mark.parametrize("kind", SETTINGS)
def test_a_planted_symlink_is_not_followed(tmp_path, kind):
    name, form = SETTINGS[kind]
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "out").symlink_to(victim)
    out = ok(run([compile_c("contract")], env={name: form.format(str(tmp_path / "out"))}))
    assert victim.read_text() == "precious"
    lines = [l for l in out.stderr.splitlines() if "symbolic link" in l]
    assert len(lines) == 1, out.stderr


def test_a_wrapper_script_prints_exactly_one_report(tmp_path):
    """Issue 30, item 4: processes that make no large request and no CUDA call (a wrapper's ten
    helpers) print no report and write no file; the one that works does."""
    script = f"for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; ls / >/dev/null; done; exec {compile_c('contract')}"
    out = ok(run(["/bin/sh", "-c", script], env={"TENSORMALLOC_STATS": "1"}))
    assert out.stderr.count("tensormalloc 0.1.0 report") == 1, out.stderr
    files = tmp_path / "s.%p.json"
    ok(run(["/bin/sh", "-c", script], env={"TENSORMALLOC_STATS": f"json:{files}"}))
    assert len(list(tmp_path.iterdir())) == 1, os.listdir(tmp_path)


def test_a_forked_childs_numbers_are_its_own(tmp_path):
    """Issue 30, item 2: pid, ppid and command in the JSON; a forked child counts from the fork
    and says whom it was forked from, so summing a run's files counts each request once."""
    out = ok(run([compile_c("fork_stats")], env={"TENSORMALLOC_STATS": f"json:{tmp_path}/s.%p.json"}))
    parent, child = (int(x) for x in out.stdout.split()[1::2])
    p = json.loads((tmp_path / f"s.{parent}.json").read_text())
    c = json.loads((tmp_path / f"s.{child}.json").read_text())
    assert (p["pid"], p["forked_from"], p["command"]) == (parent, None, "fork_stats"), p
    assert (c["pid"], c["ppid"], c["forked_from"], c["command"]) == (child, parent, parent, "fork_stats"), c
    assert (p["host"]["requests"], c["host"]["requests"]) == (10, 3)


def test_a_shared_path_without_percent_p_is_the_first_processs(tmp_path):
    """Issue 30, item 1 (Note [One file per process] in src/sys/claim.rs): without %p, the parent
    writes PATH and its forked child writes PATH.PID beside it, saying so once; a rerun takes PATH
    back (the old file's writer is gone and wrote it before the rerun started: its time is set a
    minute back, as an earlier run's would be); nothing half-written or temporary is left."""
    path = tmp_path / "s.json"
    out = ok(run([compile_c("fork_stats")], env={**OLD_THRESHOLD, "TENSORMALLOC_STATS": f"json:{path}"}))
    parent, child = (int(x) for x in out.stdout.split()[1::2])
    assert json.loads(path.read_text())["pid"] == parent
    beside = json.loads((tmp_path / f"s.json.{child}").read_text())
    assert (beside["pid"], beside["host"]["requests"]) == (child, 3), beside
    lines = [l for l in out.stderr.splitlines() if "beside" in l]
    assert lines == [f"tensormalloc: process {child}, forked from {parent}, writes its stats beside {path}, to {path}.{child}"], out.stderr
    for p in tmp_path.iterdir():
        os.utime(p, (p.stat().st_atime - 60, p.stat().st_mtime - 60))
    again = ok(run([compile_c("fork_stats")], env={**OLD_THRESHOLD, "TENSORMALLOC_STATS": f"json:{path}"}))
    assert json.loads(path.read_text())["pid"] == int(again.stdout.split()[1])
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp." in p.name) == []


POOL = """
import multiprocessing as mp, os, sys, time
import numpy as np

def work(pause):
    for _ in range(50):
        a = np.ones(1_000_000)  # 8 MB: a large request
        del a
    time.sleep(pause)
    return os.getpid()

if __name__ == "__main__":
    method, ending, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if ending == "with":
        with mp.get_context(method).Pool(4) as pool:  # leaving `with` terminates the workers
            pids = pool.map(work, [pause] * 4, chunksize=1)
    else:
        pool = mp.get_context(method).Pool(4)
        pids = pool.map(work, [pause] * 4, chunksize=1)
        pool.close()
        pool.join()
    print(*sorted(pids))  # a worker that ran two tasks is named twice
"""


def report_json(files):
    from test_cli import ENV, PY
    return json.loads(ok(run([PY, "-m", "tensormalloc", "report", *map(str, files), "--json"], preload=False, env=ENV)).stdout)


@pytest.mark.parametrize("method,ending", [("fork", "with"), ("spawn", "with"), ("fork", "close-join"), ("spawn", "close-join")])
def test_pool_workers_ended_without_exit_hooks_leave_their_numbers(tmp_path, method, ending):
    """Issue 30, item 3, and issue 35, item 2: Pool workers end by os._exit (fork) or SIGTERM
    (leaving `with`), so no exit hook runs, at once after their last task (no wait for a
    background write); their counters live in their files from their first event, so `report`
    reads each worker's 50 requests, exactly, and says how each ended."""
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    out = ok(run([sys.executable, str(script), method, ending, "0"], env={**OLD_THRESHOLD, "TENSORMALLOC_STATS": f"json:{tmp_path}/s.%p.json"}, timeout=180))
    tasks = list(map(int, out.stdout.split()))
    workers = sorted(set(tasks))
    report = report_json(tmp_path / f"s.{pid}.json" for pid in workers)
    rows = {r["pid"]: r for r in report["processes"]}
    assert sorted(rows) == workers, report
    for pid in workers:
        assert rows[pid]["requests"] == rows[pid]["frees"] == 50 * tasks.count(pid), rows[pid]
        exited = method == "spawn" and ending == "close-join"  # spawn's workers return from main
        assert (rows[pid]["ended"], rows[pid]["complete"]) == (("exit", True) if exited else ("killed", False)), rows[pid]
    assert report["total"]["requests"] == 200


def test_a_shared_trace_path_gives_each_process_its_own_file(tmp_path):
    """Issue 30, items 1 and 2: TENSORMALLOC_TRACE without %p: the parent traces into PATH, its
    forked child keeps tracing into PATH.PID beside it (its own events only, its own holder
    names), and a process started while PATH is held does the same; no file is interleaved."""
    sys.path.insert(0, str(ROOT / "python"))
    from tensormalloc import plot
    path = tmp_path / "t.bin"
    out = ok(run([compile_c("fork_stats")], env={"TENSORMALLOC_TRACE": str(path)}))
    parent, child = (int(x) for x in out.stdout.split()[1::2])
    mine = plot.summary(plot.load(str(path)))
    theirs = plot.summary(plot.load(str(tmp_path / f"t.bin.{child}")))
    assert (mine["allocs"], theirs["allocs"]) == (10, 3), (mine, theirs)
    assert [l for l in out.stderr.splitlines() if "beside" in l] == [
        f"tensormalloc: TENSORMALLOC_TRACE: {path} is written by another process of this run; process {child} traces beside it, to {path}.{child}"], out.stderr
    # A process of the run that holds PATH while it starts two programs: each of them, and each
    # of their children, traces into a file of its own beside it.
    path.unlink()
    prog = compile_c("fork_stats")
    code = (f"import subprocess, numpy as np; a = np.ones(10_000_000); "
            f"ps = [subprocess.Popen([{prog!r}]) for _ in range(2)]; [p.wait() for p in ps]; del a")
    # The 80 MB array only: Python's and numpy's own blocks of 128 KiB and more would count too.
    nested = ok(run([sys.executable, "-c", code], env={"TENSORMALLOC_TRACE": str(path), "TENSORMALLOC_THRESHOLD": "4M"}))
    files = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("t.bin"))
    assert len(files) == 6, (files, nested.stderr)
    assert plot.summary(plot.load(str(path)))["allocs"] == 1, "the holder of PATH: one array"
    for name in files:
        if name == "t.bin":
            continue
        events = plot.load(str(tmp_path / name))
        assert plot.summary(events)["allocs"] in (3, 10), (name, plot.summary(events))


def test_a_shared_snapshot_path_gives_each_process_its_own_file(tmp_path):
    """Issue 30, item 1, for TENSORMALLOC_SNAPSHOT_AT_EXIT without %p: the forked child writes
    PATH.PID (its snapshot and its .host.pickle) and says so; the parent, ending after it, writes
    PATH; a shell that allocates nothing writes none."""
    import pickle
    path = tmp_path / "snap.pickle"
    out = ok(run(["/bin/sh", "-c", f"{compile_c('fork_stats')}; true"], env={"TENSORMALLOC_SNAPSHOT_AT_EXIT": str(path)}))
    parent, child = (int(x) for x in out.stdout.split()[1::2])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["snap.pickle", "snap.pickle.host.pickle", f"snap.pickle.{child}", f"snap.pickle.{child}.host.pickle"]), names
    for name in names:
        pickle.loads((tmp_path / name).read_bytes())
    assert sum("writes its snapshot beside it" in l for l in out.stderr.splitlines()) == 1, out.stderr


def test_path_is_the_first_to_record_and_a_parent_after_its_child_writes_beside(tmp_path):
    """Note [One file per process]: PATH goes to the run's first process to record an event (its
    name is taken atomically then, never moved later). A child the parent started (exec'd, so
    not known as forked) allocates first and keeps PATH; the parent, allocating after, writes
    PATH.PID beside it and says so once."""
    path = tmp_path / "s.json"
    code = (f"import subprocess, os, numpy as np; c = subprocess.Popen([{compile_c('contract')!r}]); c.wait(); "
            "a = np.ones(10_000_000); print(os.getpid(), c.pid)")
    out = ok(run([sys.executable, "-c", code], env={**OLD_THRESHOLD, "TENSORMALLOC_STATS": f"json:{path}"}))
    parent, child = map(int, out.stdout.splitlines()[-1].split())
    assert json.loads(path.read_text())["pid"] == child, out.stderr
    assert json.loads((tmp_path / f"s.json.{parent}").read_text())["pid"] == parent
    assert [l for l in out.stderr.splitlines() if "beside" in l] == [
        f"tensormalloc: {path} is written by another process of this run; process {parent} writes its stats beside it, to {path}.{parent}"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_pools_workers_each_leave_a_trace_and_stats_the_report_and_plot_read(tmp_path, method):
    """Issue 30's done-when, traces included: a Pool of 4 workers ended on leaving `with`
    (SIGTERM), each making 50 large arrays, leaves with `%p` paths one stats file and one trace
    per worker, each with its own pid and its 50 requests; `report` sums them exactly and `plot`
    draws them in lanes. Without `%p` every trace file of the run is one process's, never
    interleaved (the plot tool refuses interleaved files)."""
    sys.path.insert(0, str(ROOT / "python"))
    from tensormalloc import plot
    from test_cli import ENV, PY
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    env = {**OLD_THRESHOLD, "TENSORMALLOC_STATS": f"json:{tmp_path}/s.%p.json", "TENSORMALLOC_TRACE": f"{tmp_path}/t.%p.bin"}
    # The trace is written by the background thread every 100 ms: workers pause a second after
    # their work before the pool ends them (SIGTERM), so their traces hold it all.
    out = ok(run([sys.executable, str(script), method, "with", "1"], env=env, timeout=180))
    tasks = list(map(int, out.stdout.split()))
    workers = sorted(set(tasks))
    for pid in workers:
        assert plot.summary(plot.load(str(tmp_path / f"t.{pid}.bin")))["allocs"] == 50 * tasks.count(pid), pid
    files = sorted(str(p) for p in tmp_path.glob("s.*.json"))
    report = report_json(files)
    assert report["total"]["requests"] == sum(r["requests"] for r in report["processes"]) == 200, report
    assert {r["pid"] for r in report["processes"]} == set(workers), report
    traces = [str(tmp_path / f"t.{pid}.bin") for pid in workers]
    drawn = ok(run([PY, "-m", "tensormalloc", "plot", *traces, "-o", str(tmp_path / "run.png")], preload=False, env=ENV))
    assert drawn.stdout.count("allocs=") == len(workers), drawn.stdout
    shared = tmp_path / "shared"
    shared.mkdir()
    out = ok(run([sys.executable, str(script), method, "with", "1"], env={**OLD_THRESHOLD, "TENSORMALLOC_TRACE": f"{shared}/t.bin"}, timeout=180))
    tasks = list(map(int, out.stdout.split()))
    names = sorted(p.name for p in shared.iterdir())
    assert len(names) == len(set(tasks)), names
    allocs = [plot.summary(plot.load(str(shared / name)))["allocs"] for name in names]
    assert sorted(allocs) == sorted(50 * tasks.count(pid) for pid in set(tasks)), (names, allocs)


def test_a_process_whose_parent_ended_first_names_the_parent_it_had(tmp_path):
    """A child that outlives its parent is reparented (to pid 1 or a subreaper) before it exits:
    its report named that one as its parent (multiprocessing's resource tracker showed parent 1
    in `tensormalloc report`). The parent is now the one it had when it started."""
    child = f"{sys.executable} -c 'import time, numpy; time.sleep(1); a = numpy.ones(1_000_000); del a' &"
    # The parent outlives the child's start (0.3 s), not its end.
    out = ok(run(["sh", "-c", f"echo $$; {child} sleep 0.3"], env={"TENSORMALLOC_STATS": f"json:{tmp_path}/s.%p.json"}))
    parent = int(out.stdout.split()[0])
    for _ in range(400):
        files = [f for f in tmp_path.glob("s.*.json") if f.read_bytes().startswith(b"{") and json.loads(f.read_text()).get("ended") == "exit"]
        if files:
            break
        time.sleep(0.05)
    assert len(files) == 1, list(tmp_path.iterdir())
    assert json.loads(files[0].read_text())["ppid"] == parent
