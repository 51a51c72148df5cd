"""The Python package as a Python user meets it, from the source tree (PYTHONPATH=python): the
hook modules reachable after `import tensormalloc` without importing numpy until touched, one
warning when figures are zero because the library is not loaded, `tensormalloc --help` listing
every setting of the library's own table, and `tensormalloc plot` (bins named by range, stepped
lines). The installed package: test_package.py."""
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import LIB, ROOT, compile_c, find_peer, ok, run

PY = str(ROOT / ".venv" / "bin" / "python")
ENV = {"PYTHONPATH": str(ROOT / "python")}


def test_hook_modules_are_attributes_imported_on_first_touch():
    code = r"""
import sys, tensormalloc
assert "numpy" not in sys.modules and "tensormalloc.numpy" not in sys.modules
assert {"numpy", "torch", "cupy", "numba"} <= set(dir(tensormalloc))
tensormalloc.numpy.enable()                      # the first thing a numpy user types
import numpy as np
a = np.ones(8_000_000)
print(tensormalloc.numpy.handler_name(a), tensormalloc.loaded_by(), "torch" in sys.modules,
      tensormalloc.torch.__name__, tensormalloc.cupy.__name__, tensormalloc.numba.__name__)
try:
    tensormalloc.nonesuch
except AttributeError as e:
    print("AttributeError", "nonesuch" in str(e))
"""
    out = ok(run([PY, "-c", code], preload=False, env=ENV))
    assert out.stdout.split() == ["tensormalloc", "path", "False", "tensormalloc.torch", "tensormalloc.cupy",
                                  "tensormalloc.numba", "AttributeError", "True"], out


def test_stats_and_scope_warn_once_when_the_library_is_not_loaded():
    code = r"""
import warnings, tensormalloc
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    s = tensormalloc.stats()
    with tensormalloc.scope("epoch") as r:
        pass
    tensormalloc.stats()
assert not any(s.values()) and r.allocated_bytes == 0
print(len(w))
print(w[0].category.__name__, w[0].message)
"""
    out = ok(run([PY, "-c", code], preload=False, env=ENV))
    count, message = out.stdout.split("\n", 1)
    assert count == "1", out.stdout
    assert message.startswith("RuntimeWarning") and "not loaded" in message
    assert "tensormalloc python" in message and "tensormalloc.numpy.enable()" in message, message
    # A scope alone warns too (once), and a loaded library never does.
    code = "import tensormalloc\nwith tensormalloc.scope('x'): pass\nwith tensormalloc.scope('y'): pass\n"
    out = ok(run([PY, "-W", "default", "-c", code], preload=False, env=ENV))
    assert out.stderr.count("RuntimeWarning") == 1, out.stderr
    code = "import tensormalloc\ntensormalloc.stats()\nwith tensormalloc.scope('x'): pass\n"
    out = ok(run([PY, "-W", "default", "-c", code], env=ENV))
    assert "Warning" not in out.stderr, out.stderr


@pytest.mark.parametrize("preload", [True, False], ids=["loaded", "not-loaded"])
def test_a_scope_name_is_checked_whether_the_library_is_loaded_or_not(preload):
    """Loaded, scope(None) raised AttributeError and a NUL cut the name; not loaded, both
    passed silently: a program right on one machine failed on the next."""
    code = ("import tensormalloc\n"
            "for name, error in ((None, TypeError), (b'x', TypeError), (5, TypeError), ('a\\0b', ValueError)):\n"
            "    try:\n"
            "        tensormalloc.scope(name)\n"
            "    except error:\n"
            "        continue\n"
            "    raise SystemExit(f'{name!r}: no {error.__name__}')\n"
            "with tensormalloc.scope('ok'):\n"
            "    pass\n"
            "print('checked')\n")
    out = ok(run([PY, "-c", code], preload=preload, env=ENV))
    assert "checked" in out.stdout


def settings_of_the_library():
    """(name, default) of every option, as config/options.rs's table has them."""
    src = (ROOT / "src" / "config" / "options.rs").read_text()
    table = src[src.index("pub static OPTIONS"):src.index("\n];", src.index("pub static OPTIONS"))]
    return re.findall(r'name: "(\w+)",\s*default: "([^"]*)"', table)


def test_help_lists_every_setting_with_its_default_and_the_commands():
    out = ok(run([PY, "-m", "tensormalloc", "--help"], preload=False, env=ENV))
    settings = settings_of_the_library()
    assert len(settings) >= 17
    for name, default in settings:
        assert f"  {name}={default}\n" in out.stdout, (name, default)
    for words in ("TENSORMALLOC_STATS=1 tensormalloc", "TENSORMALLOC_TRACE=trace.bin tensormalloc",
                  "tensormalloc plot trace.bin", "tensormalloc --path"):
        assert words in out.stdout, words
    bare = run([PY, "-m", "tensormalloc"], preload=False, env=ENV)
    assert bare.returncode == 2 and "--help" in bare.stderr
    # `--` runs a program named like a subcommand; a missing one is 127 as before.
    assert run([PY, "-m", "tensormalloc", "--", "plot-no-such"], preload=False, env=ENV).returncode == 127
    out = ok(run([PY, "-m", "tensormalloc", "--", "sh", "-c", "echo $LD_PRELOAD"], preload=False,
                 env={**ENV, "TENSORMALLOC_LIB": str(LIB)}))
    assert out.stdout.strip() == str(LIB)
    # The source tree's (and the C install's) launcher is the same command: the same help.
    out = ok(run([str(ROOT / "scripts" / "tensormalloc"), "--help"], preload=False))
    assert out.stdout == ok(run([PY, "-m", "tensormalloc", "--help"], preload=False, env=ENV)).stdout
    # A shell builtin or a function of the launcher's own is no program (it said "exec: help:
    # not found" from inside the script).
    for name in ("help", "cd", "find_lib"):
        missing = run([str(ROOT / "scripts" / "tensormalloc"), name], preload=False)
        assert missing.returncode == 127 and missing.stderr == f"tensormalloc: {name}: command not found\n", missing


def test_the_launchers_leave_one_copy_of_the_library_in_ld_preload(tmp_path):
    """A copy already preloaded (another build, the pip package's beside the source tree's) gives
    way to the launcher's: two copies, one behind the other, handed libc's own definitions past
    both to calls through libc's handle (Note [Calls through a library's handle]). The user's
    other entries stay, in their order, after ours."""
    copy = tmp_path / "other" / "libtensormalloc.so"
    copy.parent.mkdir()
    shutil.copy(LIB, copy)
    peer = find_peer("libjemalloc.so.2")
    env = {**ENV, "TENSORMALLOC_LIB": str(LIB), "LD_PRELOAD": f"{copy} {peer}:{copy}"}
    for launcher in ([PY, "-m", "tensormalloc"], [str(ROOT / "scripts" / "tensormalloc")]):
        out = ok(run([*launcher, "sh", "-c", "echo $LD_PRELOAD"], preload=False, env=env))
        assert out.stdout.split() == [str(LIB), peer], (launcher, out.stdout)
    # An entry with glob characters is a file name to ld.so: kept as written, never expanded
    # against the files beside it (the shell launcher's unquoted split did, a review found).
    for name in ("libA.so", "libB.so"):
        (tmp_path / name).write_bytes(b"")
    pattern = f"{tmp_path}/lib?.so"
    env = {**ENV, "TENSORMALLOC_LIB": str(LIB), "LD_PRELOAD": f"{pattern}::{peer}"}
    for launcher in ([PY, "-m", "tensormalloc"], [str(ROOT / "scripts" / "tensormalloc")]):
        out = run([*launcher, "sh", "-c", 'printf "%s\\n" "$LD_PRELOAD"'], preload=False, env=env, cwd=tmp_path)
        assert out.stdout.strip() == f"{LIB} {pattern} {peer}", (launcher, out.stdout)


def test_the_launchers_run_what_a_shell_runs_and_name_what_they_cannot(tmp_path):
    """An executable file with no #! line is a shell script (execvp and shells run it with
    /bin/sh); the Python launcher ended in a traceback. A path through a file, exit 126 with the
    reason. A relative TENSORMALLOC_LIB with CDPATH exported: the shell launcher's `cd` printed
    the directory into the library's path, and the program ran without the library."""
    script = tmp_path / "noshebang"
    script.write_text('echo "from the script $1"\nexit 3\n')
    script.chmod(0o755)
    for launcher in ([PY, "-m", "tensormalloc"], [str(ROOT / "scripts" / "tensormalloc")]):
        out = run([*launcher, str(script), "a"], preload=False, env={**ENV, "TENSORMALLOC_LIB": str(LIB)})
        assert out.returncode == 3 and out.stdout == "from the script a\n", (launcher, out)
        out = run([*launcher, f"{script}/x"], preload=False, env={**ENV, "TENSORMALLOC_LIB": str(LIB)})
        assert out.returncode in (126, 127) and "Traceback" not in out.stderr and "tensormalloc:" in out.stderr, (launcher, out)
    relative = LIB.relative_to(LIB.parent.parent)
    env = {**ENV, "TENSORMALLOC_LIB": str(relative), "CDPATH": str(LIB.parent.parent)}
    for launcher in ([PY, "-m", "tensormalloc"], [str(ROOT / "scripts" / "tensormalloc")]):
        out = ok(run([*launcher, "sh", "-c", 'printf "%s\n" "$LD_PRELOAD"'], preload=False, env=env, cwd=LIB.parent.parent))
        assert out.stdout == f"{LIB}\n", (launcher, out.stdout)


def help_settings(text):
    """{name: (default, words)} of the settings `tensormalloc --help` lists."""
    settings, name = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (TENSORMALLOC_\w+)=(\S*)$", line)
        if m:
            name = m.group(1)
            settings[name] = (m.group(2), [])
        elif name and line.startswith("      "):
            settings[name][1].append(line.strip())
        else:
            name = None
    return {k: (d, " ".join(words)) for k, (d, words) in settings.items()}


def test_the_docs_reference_is_what_help_lists():
    """docs/configuration.md and `tensormalloc --help` list the same settings, with the same
    defaults and words, in the same groups (both written from src/config/options.rs's table)."""
    out = ok(run([PY, "-m", "tensormalloc", "--help"], preload=False, env=ENV)).stdout
    listed = help_settings(out)
    doc = (ROOT / "docs" / "configuration.md").read_text().split("\n## Earlier names")[0]
    rows = dict(re.findall(r"^\| `(TENSORMALLOC_\w+)` \| `([^`]*)` \|", doc, re.M))
    assert set(listed) == set(rows) == {name for name, _ in settings_of_the_library()}, (set(listed) ^ set(rows))
    for name, (default, words) in listed.items():
        assert rows[name] == default, name
        row = next(l for l in doc.splitlines() if l.startswith(f"| `{name}` |"))
        assert row.split(" | ", 2)[2].rstrip(" |").replace("\\|", "|") == words, (name, row, words)
    sections = re.findall(r"^## (.+)$", doc, re.M)
    groups = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ") and line[0].isupper()]
    assert groups == sections, (groups, sections)


def test_plot_command_labels_bins_by_range_and_steps_its_lines(tmp_path):
    trace = tmp_path / "trace.bin"
    ok(run([compile_c("leaky")], env={"TENSORMALLOC_TRACE": str(trace)}))
    png = tmp_path / "out.png"
    out = ok(run([PY, "-m", "tensormalloc", "plot", str(trace), str(png)], preload=False, env=ENV))
    assert "allocs=8 frees=5" in out.stdout and png.stat().st_size > 10_000, out.stdout
    assert run([PY, "-m", "tensormalloc", "plot"], preload=False, env=ENV).returncode == 2
    missing = run([PY, "-m", "tensormalloc", "plot", str(tmp_path / "none.bin")], preload=False, env=ENV)
    assert missing.returncode == 1 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr, missing
    sys.path.insert(0, str(ROOT / "python"))
    from tensormalloc import plot
    labels, counts = plot.size_bins([80 * 2**20, 80 * 2**20, 16 * 2**20, 32 * 2**20])
    assert labels == ["16M-32M", "32M-64M", "64M-128M"] and counts == [1, 1, 2], (labels, counts)
    fig = plot.draw(plot.load(trace), tmp_path / "again.png")
    lines = fig.axes[0].get_lines()
    assert lines and all(line.get_drawstyle() == "steps-post" for line in lines)
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()][-1] == "64M-128M"


def test_report_puts_a_runs_processes_side_by_side_and_sums_what_adds_up(tmp_path):
    """Issue 30, item 5: one row per process (pid, command, parent), a total whose requests are
    summed and whose peaks are not; a file that is not ours is refused with one line."""
    ok(run([compile_c("fork_stats")], env={"TENSORMALLOC_STATS": f"json:{tmp_path}/s.%p.json"}))
    files = sorted(str(p) for p in tmp_path.glob("s.*.json"))
    assert len(files) == 2, files
    out = ok(run([PY, "-m", "tensormalloc", "report", *files, "--json"], preload=False, env=ENV))
    report = json.loads(out.stdout)
    rows = sorted(report["processes"], key=lambda r: r["requests"])
    assert [(r["requests"], r["command"]) for r in rows] == [(3, "fork_stats"), (10, "fork_stats")], rows
    assert rows[0]["forked"] and rows[0]["parent"] == rows[1]["pid"], rows
    assert (report["total"]["processes"], report["total"]["requests"]) == (2, 13), report["total"]
    assert "peak_live_bytes" not in report["total"], "peaks reached at different moments are not added"
    text = ok(run([PY, "-m", "tensormalloc", "report", *files], preload=False, env=ENV)).stdout
    assert text.splitlines()[-2].split()[:5] == ["total", "2", "processes", "13", "11"], text
    damaged = tmp_path / "damaged.json"
    damaged.write_text('{"version": 2, "pid": 1, "host": {"requ')
    bad = run([PY, "-m", "tensormalloc", "report", *files, str(damaged)], preload=False, env=ENV)
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1 and "damaged.json" in bad.stderr, bad.stderr


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    """`tensormalloc report FILES | head -c 10`, through the source tree's command and the
    package's: the closed pipe ends it with no traceback (it printed BrokenPipeError before)."""
    ok(run([compile_c("fork_stats")], env={"TENSORMALLOC_STATS": f"json:{tmp_path}/s.%p.json"}))
    files = " ".join(str(p) for p in sorted(tmp_path.glob("s.*.json")))
    for command in (str(ROOT / "scripts" / "tensormalloc"), f"{PY} -m tensormalloc"):
        out = run(["bash", "-c", f"set -o pipefail; for i in 1 2 3 4 5; do {command} report {files} {files} {files} | head -c 10 >/dev/null; done"],
                  preload=False, env=ENV)
        assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_plot_draws_a_runs_traces_in_lanes_and_refuses_a_damaged_one(tmp_path):
    """Issue 30, item 6: a parent's and its forked child's traces (one file each) in one figure,
    a lane per process on one time axis; a file of two processes' records interleaved, or of
    another format, is refused with one line and nothing is drawn."""
    sys.path.insert(0, str(ROOT / "python"))
    from tensormalloc import plot
    out = ok(run([compile_c("fork_stats")], env={"TENSORMALLOC_TRACE": f"{tmp_path}/t.%p.bin"}))
    parent, child = (int(x) for x in out.stdout.split()[1::2])
    traces = [str(tmp_path / f"t.{parent}.bin"), str(tmp_path / f"t.{child}.bin")]
    png = tmp_path / "run.png"
    drawn = ok(run([PY, "-m", "tensormalloc", "plot", *traces, "-o", str(png)], preload=False, env=ENV))
    assert drawn.stdout.count("allocs=") == 2 and png.stat().st_size > 10_000, drawn.stdout
    fig = plot.draw_lanes([(t, plot.load(t)) for t in traces], str(tmp_path / "again.png"))
    lanes = fig.axes[0], fig.axes[2]
    assert lanes[0].get_xlim() == lanes[1].get_xlim(), "one time axis"
    # Two processes' records in one file: the second's start long before the first's end.
    a, b = (open(t, "rb").read() for t in traces)
    records = np.frombuffer(a[8:], dtype=plot.EVENT).copy()
    records["time_ns"][len(records) // 2:] -= 5_000_000_000
    (tmp_path / "mixed.bin").write_bytes(a[:8] + records.tobytes())
    (tmp_path / "other.bin").write_bytes(b"TMTRACE9" + b[8:])
    for bad in ("mixed.bin", "other.bin"):
        refused = run([PY, "-m", "tensormalloc", "plot", traces[0], str(tmp_path / bad), "-o", str(tmp_path / "x.png")], preload=False, env=ENV)
        assert refused.returncode == 1 and not (tmp_path / "x.png").exists(), refused
        assert len(refused.stderr.strip().splitlines()) == 1 and bad in refused.stderr, refused.stderr


def test_the_launchers_answer_as_a_shell_does(tmp_path):
    """A newcomer's mistakes (the newcomer review): an empty program name ended the Python
    launcher in a traceback; a missing path said "command not found", a directory "permission
    denied", and an unknown option was looked for as a program. Now each says what bash says, with
    its status, and an option that is not ours is named as such, with where the options are."""
    (tmp_path / "plain").write_text("x\n")
    cases = {
        "": (127, "command not found"),
        "no-such-program-here": (127, "command not found"),
        "./no-such-file": (127, "No such file or directory"),
        str(tmp_path): (126, "Is a directory"),
        str(tmp_path / "plain"): (126, "Permission denied"),
        str(tmp_path / "plain" / "x"): (126, "Not a directory"),
        str(tmp_path / "plain") + "/": (126, "Not a directory"),
        "plain/x/y": (126, "Not a directory"),
    }
    for launcher in ([PY, "-m", "tensormalloc"], [str(ROOT / "scripts" / "tensormalloc")]):
        for name, (code, why) in cases.items():
            out = run([*launcher, name], preload=False, env={**ENV, "TENSORMALLOC_LIB": str(LIB)}, cwd=tmp_path)
            assert (out.returncode, out.stderr) == (code, f"tensormalloc: {name}: {why}\n"), (launcher, name, out)
            shell = subprocess.run(["bash", "-c", '"$0"', name], capture_output=True, text=True, cwd=tmp_path)
            assert shell.returncode == code and why in shell.stderr, (name, shell)
        out = run([*launcher, "--bogus"], preload=False, env={**ENV, "TENSORMALLOC_LIB": str(LIB)})
        assert out.returncode == 2 and "unknown option --bogus" in out.stderr and "--help" in out.stderr, (launcher, out)


LAUNCHERS = {"pip": [PY, "-m", "tensormalloc"], "script": [str(ROOT / "scripts" / "tensormalloc")]}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_the_program_gets_the_signals_a_shell_gives(launcher, tmp_path):
    """Python starts with SIGPIPE and SIGXFSZ ignored, and exec kept them so: under the pip
    command `yes | head -1` printed "Broken pipe" and exited 1, a program printing forever into
    `head` never ended, and `dd` past `ulimit -f` got "File too large" (the package hunter). Now
    each ends as under bash: 141 (SIGPIPE), 153 (SIGXFSZ)."""
    cmd = " ".join(f"'{a}'" for a in LAUNCHERS[launcher])
    env = {**ENV, "TENSORMALLOC_LIB": str(LIB)}
    for program, code in [("", 141), (cmd + " ", 141)]:
        out = run(["bash", "-c", f"{program}yes | head -1; echo ${{PIPESTATUS[0]}}"], preload=False, env=env, timeout=60)
        assert out.stdout.split() == ["y", str(code)] and "Broken pipe" not in out.stderr, (program, out)
    out = run(["bash", "-c", f"ulimit -f 1; {cmd} dd if=/dev/zero of=big bs=4096 count=10 2>/dev/null; echo $?"], preload=False, env=env, cwd=tmp_path, timeout=60)
    assert out.stdout.split()[-1] == "153", out


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_library_ld_so_cannot_preload_is_refused(launcher, tmp_path):
    """ld.so splits LD_PRELOAD at spaces and colons: a library under "My Projects" ran the
    program without us, with an ld.so error line in it and in every child; a file that is no
    library the same (the package hunter). Now the command says so in one line and exits 1,
    before running anything."""
    spaced = tmp_path / "My Projects" / "libtensormalloc.so"
    spaced.parent.mkdir()
    shutil.copy(LIB, spaced)
    text = tmp_path / "notes.txt"
    text.write_text("not a library\n")
    for lib, why in [(spaced, "a space or a colon"), (text, "is not a shared library")]:
        out = run([*LAUNCHERS[launcher], "touch", str(tmp_path / "ran")], preload=False, env={**ENV, "TENSORMALLOC_LIB": str(lib)})
        assert out.returncode == 1 and out.stderr.count("\n") == 1 and why in out.stderr, out
        assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_names_in_path_answer_as_a_shell_does(launcher, tmp_path):
    """A directory in PATH with the program's name is no program: bash says "command not found"
    (127), the pip command said "Permission denied" (126); a file there that is not executable is
    "Permission denied" (126), which the script printed as bash's own line about itself."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "noexec").write_text("x\n")
    (tmp_path / "mytool").mkdir()
    path = f"{tmp_path / 'bin'}:{tmp_path}:/usr/bin:/bin"
    for name, (code, why) in {"mytool": (127, "command not found"), "noexec": (126, "Permission denied")}.items():
        shell = subprocess.run(["bash", "-c", name], capture_output=True, text=True, env={"PATH": path}, cwd="/")
        assert shell.returncode == code, shell
        out = run([*LAUNCHERS[launcher], name], preload=False, env={**ENV, "TENSORMALLOC_LIB": str(LIB), "PATH": path}, cwd="/")
        assert (out.returncode, out.stderr) == (code, f"tensormalloc: {name}: {why}\n"), out


def test_the_zero_figures_warning_says_why():
    """Loaded by path (no preload), zero figures get one warning. Under TENSORMALLOC_DISABLE=1 it
    said numpy had handed nothing yet, though numpy had handed it arrays (the package hunter):
    now it says the library is disabled."""
    code = "import tensormalloc, numpy as np\ntensormalloc.numpy.enable()\na = np.ones(10**7)\nprint(tensormalloc.stats()['host_requests'])\n"
    off = ok(run([PY, "-c", code], preload=False, env={**ENV, "TENSORMALLOC_DISABLE": "1"}))
    assert off.stdout.split() == ["0"] and "is disabled" in off.stderr and "none yet" not in off.stderr, off
    fresh = ok(run([PY, "-c", "import tensormalloc\ntensormalloc.load()\nprint(tensormalloc.stats()['host_requests'])\n"], preload=False, env=ENV))
    assert fresh.stdout.split() == ["0"] and "there has been none yet" in fresh.stderr, fresh
