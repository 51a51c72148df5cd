"""The host layer under LD_PRELOAD: the C contract, threads, fork, idle release, linking,
lifecycle, layering over jemalloc, out of memory and bad configuration."""
import json
import re
import resource
import subprocess

import pytest

from conftest import BUILD, C_DIR, LIB, ROOT, compile_c, find_peer, ok, run

SETTINGS = {
    "defaults": {},
    "threshold-1M": {"TENSORMALLOC_THRESHOLD": "1M"},
    "pushed": {  # every path: tiny threshold, one cached block, no idle delays
        "TENSORMALLOC_THRESHOLD": "64K",
        "TENSORMALLOC_CACHE_BLOCKS": "1",
        "TENSORMALLOC_HOST_RELEASE_MS": "0",
        "TENSORMALLOC_HOST_UNMAP_MS": "0",
    },
    "no-hugepages": {"TENSORMALLOC_HUGEPAGES": "never", "TENSORMALLOC_MAX_WASTE": "0"},
    "disabled": {"TENSORMALLOC_DISABLE": "1"},
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_c_contract(setting):
    out = ok(run([compile_c("contract")], env=SETTINGS[setting]))
    assert "contract ok" in out.stdout


def test_c_contract_holds_without_us_too():
    """The contract program itself is right: it passes under plain glibc."""
    ok(run([compile_c("contract")], preload=False))


@pytest.mark.parametrize("setting", ["defaults", "pushed", "no-hugepages"])
def test_threads(setting):
    out = ok(run([compile_c("threads")], env=SETTINGS[setting]))
    assert "threads ok" in out.stdout


@pytest.mark.parametrize("setting", ["defaults", "pushed"])
def test_fork_from_threads_with_full_cache(setting):
    # The program checks that its cache is not empty when it starts forking; with an expiry of
    # zero the reaper may already have unmapped it, so keep blocks long enough to fork with
    # them (a release delay of zero still puts MADV_FREE'd blocks in the cache across forks).
    env = {**SETTINGS[setting], "TENSORMALLOC_HOST_UNMAP_MS": "60000"} if setting == "pushed" else SETTINGS[setting]
    out = ok(run([compile_c("fork")], env=env))
    assert "fork ok" in out.stdout


def test_idle_block_becomes_lazyfree_then_unmapped():
    env = {"TENSORMALLOC_HOST_RELEASE_MS": "100", "TENSORMALLOC_HOST_UNMAP_MS": "1500"}
    ok(run([compile_c("idle")], env=env))


def test_linked_without_preload():
    exe = compile_c("linked", extra=[f"-I{ROOT / 'include'}", f"-L{LIB.parent}", "-ltensormalloc"])
    out = ok(run([exe], preload=False, env={"LD_LIBRARY_PATH": str(LIB.parent)}))
    assert "linked ok" in out.stdout


def test_calls_before_main_and_during_exit():
    out = ok(run([compile_c("lifecycle")]))
    assert "main ok" in out.stdout and "destructor ok" in out.stdout


def test_double_free_of_a_large_block_aborts_like_glibc():
    out = run([compile_c("lifecycle"), "double-free"])
    assert out.returncode == -6, out
    assert "free(): invalid pointer" in out.stderr
    assert "not reached" not in out.stdout


INTERIOR = ["interior", "interior-page", "interior-64k", "interior-end", "interior-middle", "interior-cached", "realloc-interior"]


@pytest.mark.parametrize("mode", INTERIOR)
def test_free_inside_a_large_block_aborts_like_glibc(mode):
    out = run([compile_c("bad_free"), mode])
    assert out.returncode == -6, out
    what = "realloc" if mode.startswith("realloc") else "free"
    assert f"{what}(): invalid pointer" in out.stderr and "inside the large block" in out.stderr, out.stderr
    assert "not reached" not in out.stdout


def test_free_inside_a_large_block_on_a_64_kib_boundary_is_caught_even_unchecked():
    # TENSORMALLOC_CHECK_FREE=0 skips the check only for pointers off a 64 KiB boundary (where
    # no block of ours starts), so free's slow path still sees these.
    out = run([compile_c("bad_free"), "interior-64k"], env={"TENSORMALLOC_CHECK_FREE": "0"})
    assert out.returncode == -6 and "inside the large block" in out.stderr, out


@pytest.mark.parametrize("check", ["1", "0"])
def test_next_allocators_blocks_beside_ours_are_freed_normally(check):
    out = ok(run([compile_c("bad_free"), "neighbours"], env={"TENSORMALLOC_CHECK_FREE": check}))
    assert "neighbours ok" in out.stdout and out.stderr == ""


def test_layered_over_jemalloc():
    preload = f"{LIB} {find_peer('libjemalloc.so.2')}"
    out = ok(run([compile_c("jemalloc_layer")], preload=preload))
    assert "jemalloc layering ok" in out.stdout


def test_out_of_memory_under_ulimit_v():
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    out = ok(run([compile_c("oom")], preexec_fn=limit))
    assert "oom ok" in out.stdout


GARBAGE = ["", "abc", "-1", "99999999999999999999999999", "1.5G", "4X", "x" * 5000, "\x01\x02", "json:"]


@pytest.mark.parametrize("value", GARBAGE, ids=range(len(GARBAGE)))
def test_bad_values_warn_once_and_use_defaults(value):
    names = [
        "THRESHOLD", "CACHE_BLOCKS", "CACHE_BYTES", "HOST_RELEASE_MS", "HOST_UNMAP_MS", "MAX_WASTE",
        "HUGEPAGES", "DISABLE", "STATS", "LEAKS", "CUDA_POOL", "CUDA_LIMIT", "CUDA_HOST_CACHE_BYTES",
        "CUDA_SYNC", "CHECK_FREE",
    ]
    env = {f"TENSORMALLOC_{n}": value for n in names}
    out = ok(run([compile_c("threads")], env=env))
    lines = [l for l in out.stderr.splitlines() if l.startswith("tensormalloc:")]
    if value == "":
        assert lines == [], out.stderr  # an empty value is the variable unset (issue 37): no line
        return
    warned = {n for n in names for l in lines if l.startswith(f"tensormalloc: TENSORMALLOC_{n}=")}
    # Every name is reported exactly once, each on one line naming the default.
    assert len(lines) == len(warned) == len(names), out.stderr
    assert all("using the default" in l and len(l) < 300 for l in lines)


@pytest.mark.parametrize("env", [{"TENSORMALLOC_THRESHOLD": "abc"}, {"TENSORMALLOC_STATS": "1"}, {}], ids=["bad-setting", "stats-report", "nothing-said"])
@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_line_on_a_stderr_no_one_reads_does_not_kill_the_program(env, preload):
    """stderr a pipe whose reader is gone (`prog 2>&1 | head -1` after head exits): our line is
    lost, the program runs on and exits 0, as under glibc alone (Note [Signals our writes
    raise]); before, SIGPIPE killed it (exit 141) at its bad setting's line, or at the report."""
    import os
    import signal
    import subprocess
    r, w = os.pipe()
    os.close(r)
    e = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_") and k != "LD_PRELOAD"}
    if preload:
        e["LD_PRELOAD"] = str(LIB)
    e.update(env)
    try:
        # subprocess restores SIGPIPE's default action in the child (Python ignores it).
        p = subprocess.run([compile_c("outputs"), "many", "10"], env=e, stdout=subprocess.DEVNULL, stderr=w, timeout=60)
    finally:
        os.close(w)
    assert p.returncode == 0, f"exit {p.returncode}" + (" (SIGPIPE)" if p.returncode == -signal.SIGPIPE else "")


def test_unknown_variable_is_reported():
    out = ok(run([compile_c("contract")], env={"TENSORMALLOC_TRESHOLD": "1M"}))
    assert "TENSORMALLOC_TRESHOLD is not a tensormalloc setting; ignored (did you mean TENSORMALLOC_THRESHOLD?)" in out.stderr


def test_stats_report_text_and_json(tmp_path):
    out = ok(run([compile_c("threads")], env={"TENSORMALLOC_STATS": "1"}))
    report = out.stderr
    assert re.search(r"requests \d+  hits \d+ \(\d+\.\d%\)", report), report
    assert "Section" in report and "large alloc" in report and "%tot" in report
    assert "cudaMalloc" not in report, "device rows only for processes that used CUDA"
    path = tmp_path / "stats.json"
    ok(run([compile_c("threads")], env={"TENSORMALLOC_STATS": f"json:{path}"}))
    data = json.loads(path.read_text())
    host = data["host"]
    assert host["requests"] == host["hits"] + host["grows"] + host["misses"] > 0
    assert host["live_bytes"] == 0 and host["peak_live_bytes"] > 0
    # The bounds follow the live peak from their floor (16 blocks, 1 GiB); deferred unmaps are
    # counted while they wait.
    assert host["bound_blocks"] >= 16 and host["bound_bytes"] >= 1 << 30
    assert host["deferred_unmap_bytes"] >= 0 and host["calloc_zeroed_by_discard"] >= 0
    path = tmp_path / "fixed.json"
    ok(run([compile_c("threads")], env={"TENSORMALLOC_STATS": f"json:{path}", "TENSORMALLOC_CACHE_BLOCKS": "3", "TENSORMALLOC_CACHE_BYTES": "100M"}))
    host = json.loads(path.read_text())["host"]
    assert (host["bound_blocks"], host["bound_bytes"]) == (3, 100 << 20), "a bound the user set is exact"
    names = [p["name"] for p in data["phases"]]
    assert "large alloc" in names and all(p["calls"] >= 0 and p["total_ns"] >= 0 for p in data["phases"])


def test_disabled_passes_everything_through():
    # With DISABLE=1 the stats show no large request at all, whatever the program did.
    code = run([compile_c("threads")], env={"TENSORMALLOC_DISABLE": "1", "TENSORMALLOC_STATS": "1"})
    ok(code)
    assert "requests 0  hits 0" in code.stderr and "disabled" in code.stderr


def test_wrapper_script_preloads():
    """scripts/tensormalloc puts the library under any command (and keeps a peer after it)."""
    out = ok(run([str(ROOT / "scripts" / "tensormalloc"), compile_c("threads")], preload=False,
                 env={"TENSORMALLOC_STATS": "1"}))
    assert "tensormalloc 0.1.0 report" in out.stderr


def test_leak_report_names_the_leaked_blocks():
    out = ok(run([compile_c("leaky")], env={"TENSORMALLOC_LEAKS": "1"}))
    err = out.stderr
    # 2 x 80 MB (rounded to 2 MiB: 80 MiB) + 16 MiB, in bytes and human units
    total = 2 * 80 * 2**20 + 16 * 2**20
    assert f"host (large blocks): 3 blocks still live, {total} bytes (176.0 MiB)" in err, err
    rows = [l.split() for l in err.splitlines() if l.startswith("  ") and l.split()[0].isdigit()]
    assert rows[0][0] == "2" and rows[0][1] == str(80 * 2**20), rows  # biggest total first
    assert rows[1][0] == "1" and rows[1][1] == str(16 * 2**20), rows
    # Each line names who asked: the program (its two 80 MB call sites in main fold into one line).
    assert all(r[-1] == "leaky" for r in rows) and len(rows) == 2, rows
    assert "32.0 MiB" not in err  # freed blocks are not leaks


def test_blocks_a_library_frees_as_the_process_ends_are_no_leaks():
    """Note [Reports after every finalizer] (src/shim/lifecycle.rs): a library linked into the
    program frees 64 MiB in its finalizer and 24 MiB in an exit handler its constructor
    registered. Before, the report ran first and listed both as leaked (c/freed_at_the_end.c)."""
    lib = BUILD / "libfreed_at_the_end.so"
    BUILD.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-fno-builtin", "-o", str(lib), str(C_DIR / "freed_at_the_end_lib.c")], check=True)
    program = compile_c("freed_at_the_end", extra=[f"-L{BUILD}", "-lfreed_at_the_end", f"-Wl,-rpath,{BUILD}"])
    out = ok(run([program], env={"TENSORMALLOC_LEAKS": "1"}))
    err = out.stderr
    assert "library finalizer freed its block" in err and "library exit handler freed its block" in err, err
    assert "host (large blocks): none" in err, err
    assert err.index("library exit handler freed its block") < err.index("leaks at exit"), err


def test_no_leak_report_unless_asked():
    out = ok(run([compile_c("leaky")]))
    assert "leaks at exit" not in out.stderr


def test_trace_round_trips_through_the_plot_script(tmp_path):
    trace = tmp_path / "trace.bin"
    out = ok(run([compile_c("leaky")], env={"TENSORMALLOC_TRACE": str(trace)}))
    png = tmp_path / "trace.png"
    plot = ok(run([str(ROOT / "scripts" / "plot-trace"), str(trace), str(png)], preload=False))
    fields = dict(kv.split("=") for kv in plot.stdout.split()[:6])
    # leaky.c: 3 kept blocks + 5 allocate/free pairs of 32 MB
    assert fields["allocs"] == "8" and fields["frees"] == "5", plot.stdout
    assert int(fields["samples"]) >= 1
    assert int(fields["bytes_requested"]) == 2 * 80 * 2**20 + 16 * 2**20 + 5 * 32 * 2**20
    assert png.stat().st_size > 10_000
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    import plot_trace
    d = plot_trace.series(plot_trace.load(trace))
    assert d["host"][-1] == 2 * 80 * 2**20 + 16 * 2**20, "what is live at the end is what leaked"


def test_trace_of_an_unwritable_path_warns_and_runs_on():
    out = ok(run([compile_c("leaky")], env={"TENSORMALLOC_TRACE": "/nonexistent/dir/trace.bin"}))
    assert "TENSORMALLOC_TRACE: cannot open" in out.stderr


@pytest.mark.parametrize("repeat", range(5))
def test_exit_from_a_thread_while_allocating_prints_the_report(repeat):
    out = ok(run([compile_c("exit_thread")], env={"TENSORMALLOC_STATS": "1", "TENSORMALLOC_LEAKS": "1"}, timeout=60))
    assert "tensormalloc 0.1.0 report" in out.stderr and "leaks at exit" in out.stderr


@pytest.mark.parametrize("refused", ["free", "all"])
def test_kernel_refusing_madvise(refused):
    env = {"TENSORMALLOC_HOST_RELEASE_MS": "50", "TENSORMALLOC_HOST_UNMAP_MS": "1000"}
    out = ok(run([compile_c("madvise_refused"), refused], env=env))
    assert "madvise refused ok" in out.stdout


@pytest.mark.parametrize("pattern", ["read", "dense-then-sparse"])
def test_a_calloc_block_the_program_barely_writes_is_not_kept_resident(pattern):
    """c/calloc_patterns.c: a 240 MB calloc'd block, freed and asked again 20 times, only read
    (the zero page maps it), or written whole 4 times and then one byte every 16 MiB. glibc maps
    each one afresh: about 1 MB resident. Our calloc wrote zeros over the whole block, a drop of
    zero-page entries looking resident and our own write making it so: 242 MB resident, and 2 s
    for the 20 read-only callocs (the numpy hunter). Now the pages sampled before a write say the
    program barely wrote there, and the block is dropped once most owners of late wrote little
    (from the third calloc after four that filled it; Note [calloc costs what is touched])."""
    alone = ok(run([compile_c("calloc_patterns"), pattern], preload=False))
    ours = ok(run([compile_c("calloc_patterns"), pattern]))
    most = {name: int(out.stdout.split()[1]) for name, out in (("glibc", alone), ("ours", ours))}
    assert most["glibc"] <= 8 and most["ours"] <= 16, most


@pytest.mark.parametrize("threads", [4, 16, 64])
def test_calloc_in_threads_passing_blocks_around_faults_less_than_glibc(threads):
    """c/calloc_churn_threads.c: threads calloc or malloc 1-8 MiB blocks, read them only, or write
    half or all of them, and free blocks other threads used. Each calloc judged its block by its
    previous owner: a drop whenever the last owner only read it, or the process's votes fell after
    writes over blocks we had dropped ourselves, and the next owner, filling it, faulted it in
    again: 1.2-1.5M faults where glibc, mapping each block afresh, takes 0.35-0.74M (2026-11-29).
    Now a block is dropped only while most owners of late wrote little (Note [calloc costs what
    is touched]); 0.25-0.38M."""
    argv = [compile_c("calloc_churn_threads"), str(threads), str(1600 // threads)]
    faults = {name: int(ok(run(argv, preload=preload, timeout=120)).stdout.split()[1]) for name, preload in (("glibc", False), ("ours", True))}
    assert faults["ours"] <= faults["glibc"], faults


@pytest.mark.parametrize("setting", ["defaults", "no-hugepages", "hugepages-always", "disabled"])
def test_calloc_reads_zero_on_every_path(setting):
    """Fresh, hit on a written block, on a sparsely touched one, on a released one, split head
    and tail, grown, locked: every byte of every calloc reads zero."""
    env = {**SETTINGS.get(setting, {"TENSORMALLOC_HUGEPAGES": "always"}), "TENSORMALLOC_HOST_RELEASE_MS": "100", "TENSORMALLOC_HOST_UNMAP_MS": "60000"}
    out = ok(run([compile_c("calloc_zero")], env=env))
    assert "calloc ok" in out.stdout


EXIT_REPORTS = ["none", "stats-json", "stats-text", "trace", "snapshot", "leaks"]


def exit_report_env(report, path):
    """The settings that make `report` (one of EXIT_REPORTS) at exit, written to `path`."""
    return {
        "none": {},
        "stats-json": {"TENSORMALLOC_STATS": f"json:{path}"},
        "stats-text": {"TENSORMALLOC_STATS": "1"},
        "trace": {"TENSORMALLOC_TRACE": str(path)},
        "snapshot": {"TENSORMALLOC_SNAPSHOT_AT_EXIT": str(path)},
        "leaks": {"TENSORMALLOC_LEAKS": "1"},
    }[report]

@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_pending_cancellation_waits_for_the_programs_own_cancellation_point(preload):
    """A thread with pthread_cancel pending whose large malloc fails under RLIMIT_AS (its
    out-of-memory report written on the way): malloc returns NULL, the thread frees what it held,
    and it is cancelled at its pthread_testcancel, as under glibc alone (Note [Cancellation
    points]). Before, the report's write was the cancellation point: the thread died inside
    malloc and never freed its 100 MiB."""
    out = ok(run([compile_c("cancel_pending"), "oom"], preload=preload))
    assert "malloc returned null, freed, then cancelled" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_thread_blocked_in_malloc_info_can_be_cancelled(preload):
    """A thread's malloc_info blocks writing to a full pipe; pthread_cancel ends it there, as
    glibc's writes are cancellation points. A version of this session held cancellation off
    around the writes (to keep a cancelled thread from leaving our scratch mapped): the join
    waited for good, a review found. The scratch left by a thread cancelled there is in
    docs/limits.md."""
    out = ok(run([compile_c("cancel_pending"), "info"], preload=preload, timeout=60))
    assert "joined: cancelled" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("report", EXIT_REPORTS)
def test_exit_from_a_thread_with_a_cancellation_pending_ends_the_process(report, tmp_path):
    """exit(0) from a thread with pthread_cancel pending: the reports asked for are written in
    that thread, and the process ends with status 0, as under glibc alone. Before, the stats
    file's getrandom (a cancellation point in glibc) cancelled the thread inside exit: the
    process ran on, its main thread woke from pthread_join."""
    path = tmp_path / "out"
    env = exit_report_env(report, path)
    out = ok(run([compile_c("cancel_pending"), "exit"], env=env, timeout=60))
    assert "exit did not end the process" not in out.stdout
    if report in ("stats-json", "trace", "snapshot"):
        assert path.stat().st_size > 0
    if report == "stats-json":
        assert json.loads(path.read_text())["host"]["requests"] == 1
    if report == "stats-text":
        assert "tensormalloc" in out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_thread_with_the_smallest_stack_uses_every_large_path(preload):
    """PTHREAD_STACK_MIN (16 KiB), 4 KiB of it the program's: large malloc, calloc, every realloc,
    posix_memalign and an out-of-memory failure with its report, as under glibc alone (Note [A
    report off the stack]). Before, the report's 16 KiB of buffers overflowed the stack, and a
    realloc from a small block needed 15 KiB."""
    out = ok(run([compile_c("small_stack"), "calls"], preload=preload, env={"TENSORMALLOC_OOM_REPORT": "1"}))
    assert "small stack ok" in out.stdout
    if preload:
        assert "out of memory" in out.stderr, out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_a_small_stack_maps_and_unmaps_pages_of_its_own(preload):
    """A PTHREAD_STACK_MIN thread with 8 KiB of its own frames makes the process's first large
    request and maps and unmaps pages of its own, one where the freed block was; a SIGSEGV
    handler on an 8 KiB alternate stack maps pages in with MAP_FIXED as they are touched (a
    garbage collector's way). Before, every munmap took 8.4 KiB of the caller's stack (the claim's
    lists: Note [Ranges the program claims]), making our thread took 5 KiB, and our thread-local
    storage took 1.7 KiB of every thread's stack (Note [Scopes off the thread's stack]): each
    died of SIGSEGV (c/small_stack.c pages)."""
    out = ok(run([compile_c("small_stack"), "pages"], preload=preload))
    assert "small stack ok" in out.stdout


@pytest.mark.parametrize("report", EXIT_REPORTS)
def test_exit_from_a_thread_with_the_smallest_stack_writes_the_reports(report, tmp_path):
    """exit(0) from a PTHREAD_STACK_MIN thread: the reports asked for (20-40 KiB of stack) are
    written on a stack of ours (Note [A stack of our own]). Before, every one of them died of a
    stack overflow (SIGSEGV)."""
    path = tmp_path / "out"
    env = exit_report_env(report, path)
    ok(run([compile_c("small_stack"), "exit"], env=env, timeout=60))
    if report in ("stats-json", "trace", "snapshot"):
        assert path.stat().st_size > 0
    if report == "stats-json":
        assert json.loads(path.read_text())["host"]["requests"] >= 25
