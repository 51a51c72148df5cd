"""`tensormalloc report` checks what it reads (issue 35, item 5): a file whose counts are text,
null, negative, fractional, NaN or Infinity, of an unknown version, not an object, cut short, too
large, a damaged counters file, or the same file or the same process given twice, is refused with
one line naming it, and the good files are still reported; `--json` is always strict JSON (no NaN
or Infinity)."""
import json
import os
import signal
import subprocess

import pytest

from conftest import LIB, compile_c, ok, run
from test_cli import ENV, PY


def strict(text):
    def refuse(name):
        raise ValueError(f"{name} in the output")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def good(tmp_path):
    """Two JSON files (a parent and its forked child: 10 and 3 requests) and the counters file of
    a process killed with SIGKILL while it held a block (6 requests, 5 frees)."""
    ok(run([compile_c("fork_stats")], env={"TENSORMALLOC_STATS": f"json:{tmp_path}/s.%p.json"}))
    e = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_")}
    e.update({"LD_PRELOAD": str(LIB), "TENSORMALLOC_STATS": f"json:{tmp_path}/k.%p.json"})
    p = subprocess.Popen([compile_c("outputs"), "hold", "6"], env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    return sorted(tmp_path.glob("s.*.json")) + [tmp_path / f"k.{pid}.json"]


BAD_JSON = {
    "text_count": lambda d: d["host"].update(requests="12"),
    "null_count": lambda d: d["host"].update(frees=None),
    "negative": lambda d: d["host"].update(live_bytes=-5),
    "fraction": lambda d: d["host"].update(hits=1.5),
    "boolean": lambda d: d["host"].update(requests=True),
    "version": lambda d: d.update(version=99),
    "version_text": lambda d: d.update(version="2"),
    "pid_zero": lambda d: d.update(pid=0),
    "no_host": lambda d: d.pop("host"),
    "cuda_not_list": lambda d: d.update(cuda={"0": {}}),
    "device_twice": lambda d: d.update(cuda=[{"device": 0}, {"device": 0}]),
    "deep_text": lambda d: d["host"].update(map_failures="none"),
    # Each of these passed the checks and stopped the whole report with a traceback.
    "ended_null": lambda d: d.update(ended=None),
    "ended_list": lambda d: d.update(ended=[]),
    "cuda_text": lambda d: d.update(cuda=[{"device": 0, "reserved_bytes": "x"}]),
    "cuda_list": lambda d: d.update(cuda=[{"device": 0, "live_bytes": []}]),
    "past_64_bits": lambda d: d["host"].update(live_bytes=int("9" * 400)),
}


def test_each_bad_file_is_refused_with_one_line_and_the_good_ones_are_reported(tmp_path, good):
    model = json.loads(good[0].read_text())
    bad = []
    for name, spoil in BAD_JSON.items():
        d = json.loads(json.dumps(model))
        spoil(d)
        p = tmp_path / f"bad_{name}.json"
        p.write_text(json.dumps(d))
        bad.append(p)
    text = good[0].read_text()
    for name, broken in {"nan": text.replace('"live_bytes":0', '"live_bytes":NaN', 1),
                         "infinity": text.replace('"cached_bytes":', '"cached_bytes":Infinity,"x":', 1),
                         "cut": text[:len(text) // 2], "empty": "", "array": "[1, 2]", "garbage": "\x00\x01 not json",
                         "deep": "[" * 100000 + "]" * 100000}.items():
        assert broken != text or name == "empty"
        p = tmp_path / f"bad_{name}.json"
        p.write_text(broken)
        bad.append(p)
    ledger = good[2].read_bytes()
    for name, data in {"ledger_cut": ledger[:100], "ledger_version": ledger[:8] + b"\x09" + ledger[9:],
                       "ledger_sizes": ledger[:20] + (4000).to_bytes(4, "little") + ledger[24:],
                       "huge": b"{" + b" " * (17 << 20) + b"}"}.items():
        p = tmp_path / f"bad_{name}"
        p.write_bytes(data)
        bad.append(p)
    copy = tmp_path / "copy_of_first.json"
    copy.write_text(good[0].read_text())
    args = [*map(str, good), *map(str, bad), str(good[1]), str(copy)]
    out = run([PY, "-m", "tensormalloc", "report", *args, "--json"], preload=False, env=ENV, timeout=120)
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert len(lines) == len(bad) + 2 and "Traceback" not in out.stderr, out.stderr
    for p in bad:
        assert sum(str(p) in line for line in lines) == 1, (p, out.stderr)
    assert any(f"{good[1]}: the same file as {good[1]}" in line for line in lines), out.stderr
    assert any(str(copy) in line and "numbers again" in line for line in lines), out.stderr
    report = strict(out.stdout)
    rows = sorted(report["processes"], key=lambda r: r["requests"])
    assert [(r["requests"], r["frees"], r["ended"]) for r in rows] == [(3, 3, "exit"), (6, 5, "killed"), (10, 10, "exit")], rows
    assert report["total"]["requests"] == 19 and report["total"]["complete"] is False
    text_out = run([PY, "-m", "tensormalloc", "report", *args], preload=False, env=ENV, timeout=120)
    assert text_out.returncode == 1 and text_out.stdout.splitlines()[-2].split()[:4] == ["total", "3", "processes", "19"], text_out.stdout


def test_json_output_is_strict_even_for_a_files_huge_numbers(tmp_path, good):
    """Numbers beyond a double's exact range stay whole numbers in --json (never Infinity or a
    rounded float), and their sum over files too; one past what a counter of the library can
    hold (64 bits) is refused with one line."""
    d = json.loads(good[0].read_text())
    d["host"]["requests"] = 2 ** 64 - 1
    p = tmp_path / "big.json"
    p.write_text(json.dumps(d))
    d["pid"] += 1
    q = tmp_path / "big2.json"
    q.write_text(json.dumps(d))
    out = ok(run([PY, "-m", "tensormalloc", "report", str(p), str(q), "--json"], preload=False, env=ENV))
    assert strict(out.stdout)["total"]["requests"] == 2 * (2 ** 64 - 1)
    d["host"]["requests"] = 2 ** 64
    q.write_text(json.dumps(d))
    out = run([PY, "-m", "tensormalloc", "report", str(p), str(q)], preload=False, env=ENV)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "not a count" in out.stderr, out.stderr
