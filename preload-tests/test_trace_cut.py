"""No torn trace (issue 35, item 4; Note [No torn trace] in src/record/trace.rs): a trace whose
writes fail part way (a file size limit, SIGXFSZ ignored or not, a full tmpfs) ends at its last whole
record, the program says so in one line and runs on, and `tensormalloc plot` draws what is there,
saying how many records it read and that the file was cut. On the full disk the stats' counters,
reserved on disk when their file was made, still hold every count though the JSON at exit finds
no room (one line says so). A file closed at exit ends with its END record and draws silently."""
import os
import re
import resource
import signal
import subprocess

import pytest

from conftest import compile_c, ok, run
from test_cli import ENV, PY

# These tests are about files and numbers, not the threshold: at the default (128K) Python's own
# start and helpers (cp, the resource tracker) make large requests too; the old threshold keeps
# the counts to the requests the programs here make.
OLD_THRESHOLD = {"TENSORMALLOC_THRESHOLD": "4M"}

REQUESTS = 5000
LINE = re.compile(r"tensormalloc: TENSORMALLOC_TRACE: (\S+): ([^;]+); the trace ends at its last whole record \((\d+) records(, then a record saying it was cut)?\) and records no more")


def check_cut(trace, out):
    """The one line, the whole records, and what plot says of the file."""
    lines = [line for line in out.stderr.splitlines() if "TENSORMALLOC_TRACE" in line]
    assert len(lines) == 1, out.stderr
    said = LINE.fullmatch(lines[0])
    assert said, lines[0]
    size = trace.stat().st_size
    assert (size - 8) % 32 == 0, f"{size} bytes: a record cut in half"
    records = (size - 8) // 32
    assert records == int(said.group(3)) + (1 if said.group(4) else 0), (records, lines[0])
    drawn = run([PY, "-m", "tensormalloc", "plot", str(trace), str(trace) + ".png"], preload=False, env=ENV, timeout=120)
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stderr.strip() == f"tensormalloc plot: {trace}: read {records} records; the file was cut: " + (
        "by its writer: the file took no more (a full disk, or a file size limit)" if said.group(4)
        else "it has no end record: its process was killed or is still running, or its disk filled"), drawn.stderr
    allocs = int(re.search(r"allocs=(\d+)", drawn.stdout).group(1))
    assert 0 < allocs < REQUESTS, drawn.stdout
    return said


def size_limited(disposition, limit=64 << 10):
    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, disposition)
    return limited


@pytest.mark.parametrize("disposition", [signal.SIG_IGN, signal.SIG_DFL], ids=["signal-ignored", "signal-default"])
def test_a_file_size_limit_cuts_the_trace_at_a_whole_record(tmp_path, disposition):
    """`ulimit -f`: the trace's write past the limit fails (EFBIG) instead of SIGXFSZ killing
    the program, whose default action it is (Note [Signals our writes raise]);
    before, the program died at the 64 KiB mark (exit 153)."""
    trace = tmp_path / "t.bin"
    out = ok(run([compile_c("outputs"), "many", str(REQUESTS)], env={"TENSORMALLOC_TRACE": str(trace)}, preexec_fn=size_limited(disposition)))
    said = check_cut(trace, out)
    assert said.group(2) == "File too large", said.group(0)


@pytest.mark.parametrize("name", ["s.json", "s_%p.json"])
def test_a_file_size_limit_leaves_the_stats_json_unwritten_in_one_line(tmp_path, name):
    """1 KiB: the counters' file cannot be reserved, nor the JSON written at exit; the program
    runs on and says so once (it said so twice, from each writer, when it did not die first),
    naming the file as it would have been named (with %p, the line said `s_%p.json`)."""
    path = tmp_path / name
    out = ok(run([compile_c("outputs"), "many", "200"], env={"TENSORMALLOC_STATS": f"json:{path}"}, preexec_fn=size_limited(signal.SIG_DFL, 1024)))
    said = [line for line in out.stderr.splitlines() if "stats" in line]
    expected = re.escape(f"tensormalloc: cannot write the stats to {path} (File too large)").replace("%p", r"\d+")
    assert len(said) == 1 and re.fullmatch(expected, said[0]), out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["tensormalloc", "glibc"])
def test_the_programs_own_write_past_the_limit_still_gets_its_signal(tmp_path, preload):
    """Our writes hold SIGXFSZ back; the program's own are as without us: killed by it."""
    env = {"TENSORMALLOC_TRACE": str(tmp_path / "t.bin")} if preload else {}
    out = run([compile_c("outputs"), "many-write", "100", str(tmp_path / "own.bin")], env=env, preload=preload, preexec_fn=size_limited(signal.SIG_DFL))
    assert out.returncode == -signal.SIGXFSZ, (out.returncode, out.stdout, out.stderr)


def test_a_full_disk_cuts_the_trace_and_keeps_the_counts(tmp_path):
    """A 64 KiB tmpfs mounted for the program alone (a mount namespace of its own; mapped root
    where the test is not root): the trace fills it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    root = [] if os.geteuid() == 0 else ["--map-root-user"]
    keep = f"cp {disk}/t.bin {disk}/s.json {tmp_path}/"
    script = f"mount -t tmpfs -o size=64k tmpfs {disk} && {compile_c('outputs')} many {REQUESTS}; rc=$?; {keep}; exit $rc"
    out = ok(run(["unshare", "--mount", "--propagation", "private", *root, "sh", "-c", script],
                 env={**OLD_THRESHOLD, "TENSORMALLOC_TRACE": f"{disk}/t.bin", "TENSORMALLOC_STATS": f"json:{disk}/s.json"}))
    said = check_cut(tmp_path / "t.bin", out)
    assert said.group(2) == "No space left on device", said.group(0)
    assert [line for line in out.stderr.splitlines() if "stats" in line] == [
        f"tensormalloc: cannot write the stats to {disk}/s.json (No space left on device)"], out.stderr
    import json
    report = json.loads(ok(run([PY, "-m", "tensormalloc", "report", str(tmp_path / "s.json"), "--json"], preload=False, env=ENV)).stdout)
    row = report["processes"][0]
    assert (row["requests"], row["frees"], row["ended"], row["complete"]) == (REQUESTS, REQUESTS, "exit", True), row


def test_a_trace_closed_at_exit_ends_with_its_end_record(tmp_path):
    trace = tmp_path / "t.bin"
    ok(run([compile_c("outputs"), "many", "10"], env={"TENSORMALLOC_TRACE": str(trace)}))
    data = trace.read_bytes()
    assert (len(data) - 8) % 32 == 0 and data[-8:-4] == bytes([2, 1, 0, 0]), "a sample (kind 2), op END (1), last"
    drawn = ok(run([PY, "-m", "tensormalloc", "plot", str(trace), str(tmp_path / "t.png")], preload=False, env=ENV))
    assert drawn.stderr == "" and "allocs=10 frees=10" in drawn.stdout, drawn


def test_a_trace_whose_ring_is_full_at_exit_still_ends_with_its_end_record(tmp_path):
    """Three threads make 100,000 requests each on one CPU, faster than our thread writes the
    ring out, so the ring is full when the process exits: the END sample is written after the
    ring is emptied. Before, it was dropped as the ring's overflow, and a trace that ended
    normally read as one whose process was killed (5 runs in 5 on one CPU)."""
    trace = tmp_path / "t.bin"
    one_cpu = lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    ok(run([compile_c("outputs"), "threads", "3", "100000"], env={**OLD_THRESHOLD, "TENSORMALLOC_TRACE": str(trace)},
           stdin=subprocess.DEVNULL, preexec_fn=one_cpu, timeout=300))
    data = trace.read_bytes()
    assert (len(data) - 8) % 32 == 0 and data[-8:-4] == bytes([2, 1, 0, 0]), "a sample (kind 2), op END (1), last"


@pytest.mark.parametrize("cut", [7, 32 * 3 + 5])
def test_plot_says_a_record_was_cut_in_half(tmp_path, cut):
    """A trace whose end was lost mid-record (written by an older version, or copied while
    written): plot draws the whole records and says it was cut."""
    trace = tmp_path / "t.bin"
    ok(run([compile_c("outputs"), "many", "10"], env={"TENSORMALLOC_TRACE": str(trace)}))
    data = trace.read_bytes()
    trace.write_bytes(data[:len(data) - cut])
    drawn = ok(run([PY, "-m", "tensormalloc", "plot", str(trace), str(tmp_path / "t.png")], preload=False, env=ENV))
    whole = (len(data) - cut - 8) // 32
    assert drawn.stderr.startswith(f"tensormalloc plot: {trace}: read {whole} records; the file was cut") and "part of a record" in drawn.stderr, drawn.stderr
