"""docs/verification.md kept current by scripts/gpu-check's output (issue 37): scripts/gpu-record
judges gpu-check's runs into results.jsonl (--collect, what gpu-check's last step runs) and writes
a result into the page's device table. No GPU: the runs' outputs below are what gpu-check's
programs print (cuda_check.cu, issue18.c, torch_check.py, torch_real.py, the skip lines), and the
page is a copy of docs/verification.md."""
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

TOOL = ROOT / "scripts" / "gpu-record"
PAGE = ROOT / "docs" / "verification.md"
FACTS = {"gpu": "NVIDIA H200", "driver": "590.12", "cuda": "13.2", "date": "2031-01-02", "commit": "abc1234"}
WHERE = "NVIDIA H200, driver 590.12, CUDA 13.2, 2031-01-02, at abc1234"


def tool():
    loader = importlib.machinery.SourceFileLoader("gpu_record", str(TOOL))
    spec = importlib.util.spec_from_loader("gpu_record", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def record(tmp_path, lines, *extra):
    """Runs the tool over result lines on a copy of the page; returns (process, page text)."""
    page = tmp_path / "verification.md"
    shutil.copy(PAGE, page)
    result = tmp_path / "results.jsonl"
    result.write_text("".join(json.dumps({**FACTS, **l}) + "\n" for l in lines))
    proc = subprocess.run([sys.executable, TOOL, result, "--page", page, *extra], capture_output=True, text=True, timeout=60)
    return proc, page.read_text()


def row(text, start):
    rows = [l for l in text.splitlines() if l.startswith("| " + start)]
    assert len(rows) == 1, (start, rows)
    return [c.strip() for c in rows[0].strip("|").split("|")]


def listed_checks():
    out = subprocess.run(["bash", ROOT / "scripts" / "gpu-check", "--list"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    assert len(names) == len(set(names)), "each check listed once (rounds are one check)"
    return names


def test_every_check_gpu_check_runs_is_mapped_to_a_row_and_every_mapped_check_exists():
    names = listed_checks()
    assert "cuda-split" in names and "torch-native" in names and "torch-real-hooks-preload" in names, names
    known = set(tool().KNOWN)
    assert not set(names) - known, f"checks that verify no row of docs/verification.md: {sorted(set(names) - known)}"
    assert not known - set(names), f"CHECKS names checks gpu-check does not run: {sorted(known - set(names))}"


def test_every_row_the_tool_names_is_one_row_of_the_page():
    text = PAGE.read_text()
    for start in tool().CHECKS:
        row(text, start)


def test_passed_checks_fill_their_rows_and_failures_are_marked_and_printed(tmp_path):
    before = PAGE.read_text()
    lines = [{"check": "cuda-raw", "round": None, "result": "pass", "detail": ""},
             {"check": "cuda-split", "round": None, "result": "pass", "detail": ""},
             {"check": "cuda-binned", "round": None, "result": "pass", "detail": ""},
             {"check": "cuda-split-deferred", "round": None, "result": "fail", "detail": "3 failures"},
             # Rounds of one check: one failed round fails the check.
             *({"check": "torch-pluggable", "round": r, "result": "pass", "detail": ""} for r in (1, 2)),
             {"check": "torch-pluggable", "round": 3, "result": "fail", "detail": "losses differ by 0.5"},
             {"check": "jax-raw", "round": None, "result": "skipped", "detail": "jax is not installed"}]
    proc, text = record(tmp_path, lines)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: cuda-split-deferred: 3 failures" in proc.stdout, proc.stdout
    assert "FAILED: torch-pluggable: losses differ by 0.5" in proc.stdout, proc.stdout
    assert "skipped: jax-raw: jax is not installed" in proc.stdout, proc.stdout
    assert row(text, "`cudaMalloc`/`cudaFree` pooled")[1] == WHERE
    assert row(text, "`cudaMemGetInfo` counting the cache")[1] == WHERE
    assert row(text, "`TENSORMALLOC_CUDA_SYNC=reuse`")[1] == f"FAILED (cuda-split-deferred) on {WHERE}"
    assert row(text, "PyTorch through `CUDAPluggableAllocator`")[1] == f"FAILED (torch-pluggable) on {WHERE}"
    # A row whose checks did not run, or were skipped, keeps what it said.
    for start in ("JAX", "forked children", "contexts: reset, destroy"):
        assert row(text, start) == row(before, start)
    # Only the cells the result speaks for changed, and the other columns of those rows did not.
    changed = [(a, b) for a, b in zip(before.splitlines(), text.splitlines()) if a != b]
    assert len(before.splitlines()) == len(text.splitlines())
    # cuda-split verifies five rows (pooled, cudaMemGetInfo, pinned, foreign pointer, the pool over
    # the driver), the failed two one each; and the line at the top.
    assert len(changed) == 7 + 1, changed
    assert row(text, "pinned host memory cache")[1] == row(text, "the pool over the driver")[1] == WHERE
    assert row(text, "`cudaMalloc`/`cudaFree` pooled")[2:] == row(before, "`cudaMalloc`/`cudaFree` pooled")[2:]
    top = next(l for l in text.splitlines() if l.startswith("**Nothing since"))
    assert top.startswith("**Nothing since 2031-01-02 has run on a GPU.**") and WHERE in top, top
    assert "3 checks passed, 2 failed (cuda-split-deferred, torch-pluggable), 1 skipped (jax-raw)" in top, top


def test_all_passed_exits_zero_and_a_commit_can_be_named(tmp_path):
    proc, text = record(tmp_path, [{"check": "cuda-expandable", "round": None, "result": "pass", "detail": ""}],
                        "--commit", "def5678")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks that ran passed" in proc.stdout
    assert row(text, "expandable segments (`TENSORMALLOC_CUDA_SEGMENTS")[1] == WHERE.replace("abc1234", "def5678")


@pytest.mark.parametrize("lines, says", [
    ([{"check": "cuda-split", "result": "pass"}, {"check": "cuda-teleport", "result": "pass"}], "does not know: cuda-teleport"),
    ([{"check": "cuda-split", "result": "maybe"}], "a pass, fail or skipped result"),
    ([], "no runs"),
])
def test_unknown_checks_and_unreadable_results_are_errors_that_leave_the_page(tmp_path, lines, says):
    proc, text = record(tmp_path, lines)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr, proc.stderr
    assert text == PAGE.read_text()


def test_a_row_the_page_lacks_is_an_error(tmp_path):
    page = tmp_path / "verification.md"
    page.write_text(PAGE.read_text().replace("| JAX (", "| Jax, renamed ("))
    result = tmp_path / "results.jsonl"
    result.write_text(json.dumps({**FACTS, "check": "cuda-split", "result": "pass"}) + "\n")
    proc = subprocess.run([sys.executable, TOOL, result, "--page", page], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "0 rows of the device table start with 'JAX'" in proc.stderr, proc.stderr


def test_collect_judges_each_run_as_gpu_check_leaves_it(tmp_path):
    """What gpu-check's last step does: runs.tsv (check, round, exit status) and each run's output."""
    runs = [("cuda-split", "", 0, {"pair_us_1MB": 0.9, "failures": 0}),
            ("cuda-binned", "", 0, {"failures": 2}),
            ("cuda-raw", "", 139, None),                                       # crashed: no output
            ("issue18-threads-split", "", 1, {"scenario": "threads", "failures": 0}),  # exit status counts
            ("torch-native", "1", 0, {"losses": [2.3, 2.1], "ms_per_step": 3.8}),
            ("torch-pluggable", "1", 0, {"losses": [2.3, 2.1000001], "ms_per_step": 3.7}),
            ("torch-pluggable", "2", 0, {"losses": [2.3, 2.4], "ms_per_step": 3.7}),
            ("torch-real-hooks-preload", "", 0, {"mode": "hooks", "checks": {
                "stats": {"ok": True, "detail": ""}, "oom": {"ok": False, "detail": "no OutOfMemoryError"}}}),
            ("torch-real-cache-preload", "", 0, {"mode": "cache", "checks": {"ipc": {"ok": True, "detail": ""}}}),
            ("jax-raw", "", 0, {"skipped": "jax is not installed"}),
            ("hooks-oom-cupy", "", 0, {"arrays": 3})]                          # no verdict in it: not a pass
    (tmp_path / "runs.tsv").write_text("".join(f"{c}\t{r}\t{rc}\n" for c, r, rc, _ in runs))
    for c, r, rc, out in runs:
        if out is not None:
            (tmp_path / (f"{c}-{r}.json" if r else f"{c}.json")).write_text("log line\n" + json.dumps(out) + "\n")
    args = [f"--{k}={v}" for k, v in FACTS.items()]
    proc = subprocess.run([sys.executable, TOOL, "--collect", tmp_path, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    got = {(l["check"], l["round"]): l for l in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    assert all(l[k] == v for l in got.values() for k, v in FACTS.items())
    result = {k: v["result"] for k, v in got.items()}
    assert result == {("cuda-split", None): "pass", ("cuda-binned", None): "fail", ("cuda-raw", None): "fail",
                      ("issue18-threads-split", None): "fail", ("torch-native", 1): "pass",
                      ("torch-pluggable", 1): "pass", ("torch-pluggable", 2): "fail",
                      ("torch-real-hooks-preload", None): "fail", ("torch-real-cache-preload", None): "pass",
                      ("jax-raw", None): "skipped", ("hooks-oom-cupy", None): "fail"}, result
    assert "no OutOfMemoryError" in got[("torch-real-hooks-preload", None)]["detail"]
    assert "exit status 139" in got[("cuda-raw", None)]["detail"]
    # The file it wrote is what the page is written from.
    page = tmp_path / "verification.md"
    shutil.copy(PAGE, page)
    proc = subprocess.run([sys.executable, TOOL, tmp_path / "results.jsonl", "--page", page], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "FAILED: torch-pluggable" in proc.stdout, proc.stdout + proc.stderr
    assert row(page.read_text(), "IPC of pooled blocks")[1] == WHERE
