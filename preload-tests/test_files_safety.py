"""Files others can reach (issue 35, item 1; Note [Files others can reach] in src/sys/files.rs):
an attacker user plants, in a sticky 1777 directory, a FIFO, a symbolic link to the victim's own
file, a hard link of their own 0666 file, or a 0666 file of their own at every name a victim's
outputs may take (the stats, the trace, the snapshot and its host file: PATH, PATH.PID,
PATH.PID.2, PATH.PID.3, with and without %p) and at the temporary names earlier versions used
(PATH.tmp.PID). The victim, an ordinary user or root, ends in time, prints at most one line for
each output, leaves every planted thing as it was, and writes its outputs only to files of its
own, 0600, one link each. A FIFO given to `tensormalloc report` or `plot` is refused at once.

The victim is started first and waits (it prints its pid) while the attacker plants: the names
hold its pid, as an attacker watching /proc would know it. Users are made with useradd when
missing, so the test runs as root (CI does)."""
import json
import os
import pickle
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from conftest import LIB, ROOT, compile_c, ok, run
from test_cli import ENV, PY

sys.path.insert(0, str(ROOT / "python"))
from tensormalloc import plot  # noqa: E402

VICTIM, ATTACKER = "tmvictim", "tmattacker"
REQUESTS = 4

PLANT = r"""
import os, sys
kind, target, names = sys.argv[1], sys.argv[2], sys.argv[3:]
for n in names:
    if kind == "fifo":
        os.mkfifo(n, 0o666)
        os.chmod(n, 0o666)
    elif kind == "symlink":
        os.symlink(target, n)
    elif kind == "hardlink":
        os.link(target, n)
    else:
        fd = os.open(n, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        os.write(fd, b"the attacker's own file")
        os.close(fd)
        os.chmod(n, 0o666)
"""


def user(name):
    """(uid, gid) of `name`, made if missing."""
    try:
        p = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        p = pwd.getpwnam(name)
    return p.pw_uid, p.pw_gid


def as_user(name):
    uid, gid = pwd.getpwnam(name).pw_uid, pwd.getpwnam(name).pw_gid
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


@pytest.fixture(scope="module")
def users():
    if os.geteuid() != 0:
        pytest.skip("needs root to make the victim and attacker users (CI runs the suite as root)")
    return {VICTIM: user(VICTIM), ATTACKER: user(ATTACKER)}


@pytest.fixture
def sticky():
    d = tempfile.mkdtemp(prefix="tm-sticky-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d)


def names_tried(base, pid):
    """The first names an output may take (src/sys/claim.rs's order), and the temporary names
    earlier versions wrote under."""
    if "%p" in base:
        first = [base.replace("%p", str(pid)), *(base.replace("%p", f"{pid}.{k}") for k in (2, 3))]
    else:
        first = [base, f"{base}.{pid}", f"{base}.{pid}.2", f"{base}.{pid}.3"]
    return first + [f"{n}.tmp.{pid}" for n in first[:2]]


def state(path):
    """What stands at `path`, to compare before and after."""
    st = os.lstat(path)
    out = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_ino, st.st_nlink, st.st_size, st.st_mtime_ns)
    if stat.S_ISLNK(st.st_mode):
        return out + (os.readlink(path),)
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            return out + (f.read(),)
    return out


@pytest.mark.parametrize("form", ["plain", "percent_p"])
@pytest.mark.parametrize("kind", ["fifo", "symlink", "hardlink", "others_file"])
@pytest.mark.parametrize("victim", [VICTIM, "root"])
def test_what_an_attacker_plants_is_never_written_or_followed(users, sticky, victim, kind, form):
    p = "%p." if form == "percent_p" else ""
    bases = {"stats": f"s.{p}json", "trace": f"t.{p}bin", "snapshot": f"snap.{p}pickle"}
    env = {"TENSORMALLOC_STATS": f"json:{sticky}/{bases['stats']}", "TENSORMALLOC_TRACE": f"{sticky}/{bases['trace']}",
           "TENSORMALLOC_SNAPSHOT_AT_EXIT": f"{sticky}/{bases['snapshot']}"}
    # The victim's own precious file, which a planted link points at.
    home = tempfile.mkdtemp(prefix="tm-victim-", dir="/tmp")
    precious = os.path.join(home, "precious")
    with open(precious, "w") as f:
        f.write("the victim's own data")
    victim_uid = 0 if victim == "root" else users[VICTIM][0]
    os.chown(home, victim_uid, -1)
    os.chown(precious, victim_uid, -1)
    # setpriv drops privileges and then runs the program with the library (setpriv itself is
    # not preloaded: it changes its capabilities with capset, per thread, and glibc aborts a
    # setresuid whose result differs between threads, ours included).
    prefix = [] if victim == "root" else as_user(VICTIM)
    e = {k: v for k, v in os.environ.items() if not k.startswith("TENSORMALLOC_") and k != "LD_PRELOAD"}
    e.update(env)
    proc = subprocess.Popen([*prefix, "env", f"LD_PRELOAD={LIB}", compile_c("outputs"), "wait", str(REQUESTS)], env=e, cwd=sticky,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.strip().isdigit(), (first, proc.communicate(timeout=60))
        pid = int(first)
        planted = []
        for base in bases.values():
            planted += names_tried(base, pid)
            if base.startswith("snap"):
                planted += [n + ".host.pickle" for n in names_tried(base, pid)[:4]]
        bait = os.path.join(sticky, "bait")
        target = precious if kind == "symlink" else bait
        if kind == "hardlink":
            subprocess.run([*as_user(ATTACKER), "/usr/bin/python3", "-c", PLANT, "others_file", "", bait], check=True)
        subprocess.run([*as_user(ATTACKER), "/usr/bin/python3", "-c", PLANT, kind, target, *planted], cwd=sticky, check=True)
        before = {n: state(os.path.join(sticky, n)) for n in planted}
        before_precious = state(precious)
        _, err = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    # Every planted thing as it was, the victim's own file too.
    assert {n: state(os.path.join(sticky, n)) for n in planted} == before
    assert state(precious) == before_precious
    shutil.rmtree(home)
    # One line for each output at most (each says where it wrote instead, and why).
    lines = [line for line in err.splitlines() if line.startswith("tensormalloc:")]
    assert len(lines) <= 3 and len(lines) == len(err.splitlines()), err
    for what in ("writes its stats", "traces", "writes its snapshot"):
        assert sum(what in line for line in lines) <= 1, err
    # The victim's outputs: files of its own, 0600, one link, whole.
    own = [n for n in os.listdir(sticky) if n not in planted and n != "bait"]
    for n in own:
        st = os.lstat(os.path.join(sticky, n))
        assert stat.S_ISREG(st.st_mode) and st.st_uid == victim_uid and stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1, (n, st)
    stats = [n for n in own if n.startswith("s.")]
    traces = [n for n in own if n.startswith("t.")]
    snaps = [n for n in own if n.startswith("snap.")]
    assert len(stats) == len(traces) == 1 and len(snaps) == 2, (own, err)
    data = json.loads(open(os.path.join(sticky, stats[0])).read())
    assert (data["pid"], data["host"]["requests"]) == (pid, REQUESTS), data
    # Read as bytes: `plot` itself reads only the files of its own user.
    records = open(os.path.join(sticky, traces[0]), "rb").read()
    assert records[:8] == b"TMTRACE2" and (len(records) - 8) % plot.EVENT.itemsize == 0
    assert plot.summary(np.frombuffer(records[8:], dtype=plot.EVENT))["allocs"] == REQUESTS
    for n in snaps:
        pickle.loads(open(os.path.join(sticky, n), "rb").read())


@pytest.mark.parametrize("what", ["stats", "trace", "snapshot"])
def test_a_fifo_at_the_path_is_passed_over_at_once(tmp_path, what):
    """Issue 35: a FIFO at the stats, trace or snapshot path hung the program for good; now it
    ends in time, writes beside the FIFO and says so once (the forked child, which writes beside
    PATH anyway, says so in a line of its own)."""
    path = tmp_path / "out"
    os.mkfifo(path)
    env = {"stats": {"TENSORMALLOC_STATS": f"json:{path}"}, "trace": {"TENSORMALLOC_TRACE": str(path)},
           "snapshot": {"TENSORMALLOC_SNAPSHOT_AT_EXIT": str(path)}}[what]
    out = run([compile_c("fork_stats")], env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    parent = int(out.stdout.split()[1])
    lines = [line for line in out.stderr.splitlines() if f"process {parent} " in line]
    assert len(lines) == 1 and "not a regular file" in lines[0] and f"{path}.{parent}" in lines[0], out.stderr
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert (tmp_path / f"out.{parent}").is_file()


@pytest.mark.parametrize("tool", ["report", "plot"])
def test_report_and_plot_refuse_a_fifo_a_link_and_anothers_file_at_once(tmp_path, tool):
    """`tensormalloc report` and `plot` given a FIFO, a symbolic link or a hard-linked file:
    one line each, at once (a FIFO is opened without blocking and refused)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real = tmp_path / "real"
    real.write_text("{}")
    (tmp_path / "link").symlink_to(real)
    os.link(real, tmp_path / "hard")
    for name, why in (("fifo", "not a regular file"), ("link", "symbolic link"), ("hard", "hard links")):
        out = run([PY, "-m", "tensormalloc", tool, str(tmp_path / name), *(["-o", str(tmp_path / "x.png")] if tool == "plot" else [])],
                  preload=False, env=ENV, timeout=30)
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 1 and why in out.stderr, (name, out.stderr)
    # plot's own output: never written through a link or into a FIFO.
    trace = tmp_path / "t.bin"
    assert run([compile_c("fork_stats")], env={"TENSORMALLOC_TRACE": str(trace)}).returncode == 0
    if tool == "plot":
        victim = tmp_path / "victim.png"
        victim.write_bytes(b"precious")
        (tmp_path / "out.png").symlink_to(victim)
        out = run([PY, "-m", "tensormalloc", "plot", str(trace), "-o", str(tmp_path / "out.png")], preload=False, env=ENV, timeout=60)
        assert out.returncode == 1 and "symbolic link" in out.stderr and victim.read_bytes() == b"precious", out.stderr
        out = run([PY, "-m", "tensormalloc", "plot", str(trace), "-o", str(fifo)], preload=False, env=ENV, timeout=60)
        assert out.returncode == 1 and "not a regular file" in out.stderr, out.stderr


@pytest.mark.parametrize("output", ["trace", "stats-json", "stats"])
@pytest.mark.parametrize("kind", ["files", "dirs"])
def test_a_program_that_closes_our_descriptors_gets_nothing_of_ours_in_its_files(output, kind, tmp_path):
    """Note [Descriptors the program may close]: the program closes every descriptor past
    stderr, then fills the numbers with its own data file or directory. Our trace and stats
    files are given up with one line; nothing of ours goes into the program's file or is named
    in its directory. Before, the trace's next write landed in the data file and the stats'
    JSON was named in the program's directory."""
    other, data = tmp_path / "other", tmp_path / "data"
    other.mkdir()
    ours = tmp_path / "ours"
    env = {
        "trace": {"TENSORMALLOC_TRACE": str(ours)},
        "stats-json": {"TENSORMALLOC_STATS": f"json:{ours}"},
        "stats": {"TENSORMALLOC_STATS": "1", "XDG_RUNTIME_DIR": str(tmp_path)},
    }[output]
    out = ok(run([compile_c("closes_descriptors"), kind, str(other), str(data)], env=env, timeout=60))
    filled = int(out.stdout.split()[-1])
    assert filled >= 1000, out.stdout
    assert data.read_bytes() == b"DATA"
    assert list(other.iterdir()) == []
    if output == "trace":
        assert "the program closed the trace's descriptor" in out.stderr, out.stderr
    if output == "stats-json":
        assert "cannot write the stats" in out.stderr, out.stderr
