"""Who holds the memory (issue 20): two shared objects of the test's own (c/holders/: one standing
for a framework, one for a math library) allocate host, device and pinned memory over the
stand-in CUDA driver; the holders table names both with exact bytes that add up to the stats,
and an out-of-memory on the device or under RLIMIT_AS prints the report, allocates nothing while
doing so, and the program goes on."""
import json
import pickle
import shutil
import subprocess

import pytest

from conftest import BUILD, C_DIR, LIB, ROOT, ok, run
from cudasim import fake_cuda

MIB = 1 << 20
SRC = C_DIR / "holders"


def _cc(out, srcs, extra):
    deps = [*srcs, ROOT / "include" / "tensormalloc.h"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        subprocess.run(["gcc", "-O1", "-g", "-Wall", "-fno-builtin", "-fno-optimize-sibling-calls", f"-I{ROOT / 'include'}",
                        "-o", str(tmp), *map(str, srcs), *extra], check=True)
        tmp.replace(out)
    return out


def holder_program(name, src, extra=()):
    """BUILD/holders/NAME from SRC, linked with the two holder libraries (built here too:
    libframework.so and libmathlib.so over the stand-in CUDA runtime and driver)."""
    cuda = fake_cuda()
    out = BUILD / "holders"
    out.mkdir(parents=True, exist_ok=True)
    link = [f"-L{cuda}", "-lcudart", "-lcuda", f"-Wl,-rpath,{cuda}"]
    _cc(out / "libframework.so", [SRC / "framework.c"], ["-shared", "-fPIC", *link])
    _cc(out / "libmathlib.so", [SRC / "mathlib.c"], ["-shared", "-fPIC", *link])
    return _cc(out / name, [src], [f"-L{out}", "-lframework", "-lmathlib", f"-Wl,-rpath,{out}", *extra, *link])


@pytest.fixture(scope="module")
def program():
    main = holder_program("main", SRC / "main.c", ["-ldl"])
    _cc(main.parent / "libspy.so", [SRC / "spy.c"], ["-shared", "-fPIC"])
    return main.parent, str(main)


def rows(stdout):
    """(holder, place, cached) -> (live, peak, blocks) from the program's ROW lines."""
    table = {}
    for line in stdout.splitlines():
        if line.startswith("ROW "):
            name, place, cached, live, peak, blocks = line[4:].rsplit(" ", 5)
            table[(name, int(place), int(cached))] = (int(live), int(peak), int(blocks))
    return table


def test_the_table_names_both_libraries_with_exact_bytes(program):
    _, main = program
    out = ok(run([main, "table"]))
    table = rows(out.stdout)
    for line in out.stdout.splitlines():
        if line.startswith("EXPECT "):
            _, name, place, live, peak = line.split()
            assert table[(name, int(place), 0)] == (int(live), int(peak), 1), (line, table)
    assert table[("libframework.so", 0, 0)] == (64 * MIB, 64 * MIB, 1), table  # cudaMalloc, device 0
    assert table[("libmathlib.so", 0, 0)] == (32 * MIB, 32 * MIB, 1), table  # cuMemAlloc
    assert table[("libmathlib.so", -2, 0)] == (4 * MIB, 4 * MIB, 1), table  # cudaMallocHost
    host_live, cuda_live = map(int, next(l for l in out.stdout.splitlines() if l.startswith("STATS ")).split()[1:])
    assert sum(v[0] for (n, p, c), v in table.items() if p == -1 and not c) == host_live, table
    assert sum(v[0] for (n, p, c), v in table.items() if p >= 0 and not c) == cuda_live, table
    assert table[("(cached by tensormalloc)", -1, 1)][0] == 8 * MIB, table  # f1, freed into the cache


def test_the_leak_report_names_each_blocks_holder_and_function(program):
    """TENSORMALLOC_LEAKS=1 lists every block live at exit under the library and the function
    that asked for it (issue 37: it gave sizes alone, though the holders were tracked)."""
    _, main = program
    out = ok(run([main, "table"], env={"TENSORMALLOC_LEAKS": "1"}))
    rows = {}
    place = None
    for line in out.stderr.splitlines():
        if line.startswith("tensormalloc: leaks at exit: "):
            place = line.split(": ")[2]
        elif place and line.startswith("  ") and line.split()[0].isdigit():
            count, each = map(int, line.split()[:2])
            rows[(place, line.split("  ")[-1])] = (count, each)
    assert rows == {
        ("host (large blocks)", "libframework.so (framework_host)"): (1, 8 * MIB),   # f2; f1 was freed
        ("host (large blocks)", "libmathlib.so (mathlib_host)"): (1, 16 * MIB),
        ("cuda device 0", "libframework.so (framework_device)"): (1, 64 * MIB),
        ("cuda device 0", "libmathlib.so (mathlib_device)"): (1, 32 * MIB),
    }, out.stderr


def test_the_exit_report_and_json_carry_the_table(program, tmp_path):
    _, main = program
    out = ok(run([main, "table"], env={"TENSORMALLOC_STATS": "1"}))
    assert "Who holds the memory" in out.stderr, out.stderr
    lines = [l for l in out.stderr.splitlines() if l.startswith("  lib")]
    names = {(l.split()[0], l.split()[1]) for l in lines}
    assert {("libframework.so", "host"), ("libmathlib.so", "host"), ("libframework.so", "cuda:0"),
            ("libmathlib.so", "cuda:0"), ("libmathlib.so", "pinned")} <= names, out.stderr
    path = tmp_path / "stats.json"
    ok(run([main, "table"], env={"TENSORMALLOC_STATS": f"json:{path}"}))
    report = json.loads(path.read_text())
    by = {(h["holder"], h["place"], h["cached"]): h for h in report["holders"]}
    # At exit every block of the program is still live but f1, freed: the peaks stay.
    assert by[("libframework.so", "cuda:0", False)]["live_bytes"] == 64 * MIB
    assert by[("libmathlib.so", "pinned", False)]["peak_bytes"] == 4 * MIB
    assert sum(h["live_bytes"] for h in report["holders"] if h["place"] == "host" and not h["cached"]) == report["host"]["live_bytes"]
    assert report["last_oom"] is None


def test_a_device_out_of_memory_prints_the_report_once_and_the_program_goes_on(program, tmp_path):
    _, main = program
    path = tmp_path / "stats.json"
    out = ok(run([main, "oom_device"], env={"FAKECUDA_DEVICE_MEM": str(256 * MIB), "TENSORMALLOC_STATS": f"json:{path}"}))
    assert "continued after rc 2, 2" in out.stdout and "then allocated yes" in out.stdout, out
    err = out.stderr.splitlines()
    assert err[0] == "tensormalloc: out of memory on cuda:0: a request of 200.0 MiB failed after the pool gave its cached segments back and tried again", out.stderr
    assert err[1].startswith("  device: 256.0 MiB total, ") and "in use outside this pool" in err[1], out.stderr
    assert err[2].startswith("  pool: 192.0 MiB reserved, 192.0 MiB live, 0 B cached; largest free block 0 B"), out.stderr
    assert err[3] == " Who holds the memory (large blocks; live is what was asked for, unused what was handed out beside it; peak is the holder's own):", out.stderr
    table = [l.split() for l in err[5:7]]
    assert [(t[0], t[1], t[2], t[3]) for t in table] == [("libframework.so", "cuda:0", "128.0", "MiB"), ("libmathlib.so", "cuda:0", "64.0", "MiB")], out.stderr
    assert "  What would help:" in err and any("the holders above" in l for l in err), out.stderr
    assert sum(l.startswith("tensormalloc: out of memory") for l in err) == 1, "the second failure is not reported again"
    last = json.loads(path.read_text())["last_oom"]
    assert last["place"] == "cuda:0" and last["request_bytes"] == 220 * MIB and last["total_bytes"] == 256 * MIB, last


def test_a_snapshot_after_the_failure_carries_it_in_the_timeline(program, tmp_path):
    """The snapshot's timeline has the failed requests as PyTorch writes them: 'oom' events with
    the size asked for and the driver's free memory then (`device_free`)."""
    _, main = program
    snap = tmp_path / "snap.pickle"
    ok(run([main, "oom_device"], env={"FAKECUDA_DEVICE_MEM": str(256 * MIB), "TENSORMALLOC_SNAPSHOT_AT_EXIT": str(snap)}))
    events = pickle.loads(snap.read_bytes())["device_traces"][0]
    ooms = [(e["size"], e["device_free"]) for e in events if e["action"] == "oom"]
    assert ooms == [(200 * MIB, 64 * MIB), (220 * MIB, 64 * MIB)], events


def test_the_report_can_be_silenced_and_the_failure_is_still_recorded(program, tmp_path):
    _, main = program
    path = tmp_path / "stats.json"
    env = {"FAKECUDA_DEVICE_MEM": str(256 * MIB), "TENSORMALLOC_OOM_REPORT": "0", "TENSORMALLOC_STATS": f"json:{path}"}
    out = ok(run([main, "oom_device"], env=env))
    assert "continued after rc 2, 2" in out.stdout and out.stderr == "", out
    assert json.loads(path.read_text())["last_oom"]["request_bytes"] == 220 * MIB


def test_without_the_library_the_failures_are_the_drivers_alone(program):
    _, main = program
    out = ok(run([main, "oom_device"], preload=False, env={"FAKECUDA_DEVICE_MEM": str(256 * MIB)}))
    assert "continued after rc 2, 2" in out.stdout and out.stderr == "", out


def test_a_host_mapping_refused_under_rlimit_as_reports_without_allocating(program):
    """TENSORMALLOC_OOM_REPORT=1 asks for host failures' reports too (Note [Reports unasked])."""
    out_dir, main = program
    out = ok(run([main, "oom_host"], preload=f"{LIB}:{out_dir / 'libspy.so'}", env={"TENSORMALLOC_OOM_REPORT": "1"}))
    # The next allocator is offered the request once before it fails (Note [The next
    # allocator's free memory]); the report itself allocates nothing.
    assert "second block refused; allocations during the report: 0; the request handed to the next allocator: 1" in out.stdout, out
    assert "after the free: served" in out.stdout, out
    err = out.stderr
    assert "tensormalloc: out of memory: a large host block of 128.0 MiB could not be mapped" in err, err
    assert "  mapping limit (RLIMIT_AS, RLIMIT_DATA or the commit limit): " in err, err
    assert any(l.split()[:2] == ["libframework.so", "host"] for l in err.splitlines()), err
    assert err.count("tensormalloc: out of memory") == 1, err


def test_a_host_mapping_refused_is_silent_unless_asked(program):
    """By default a malloc that returns NULL prints nothing, as under glibc alone: a program that
    handles the failure may own its stderr (Note [Reports unasked]); the JSON keeps it."""
    out_dir, main = program
    out = ok(run([main, "oom_host"], preload=f"{LIB}:{out_dir / 'libspy.so'}"))
    assert "second block refused" in out.stdout and "after the free: served" in out.stdout, out
    assert "tensormalloc" not in out.stderr, out.stderr


def test_glibc_alone_refuses_the_same_block(program):
    out_dir, main = program
    out = ok(run([main, "oom_host"], preload=str(out_dir / "libspy.so")))
    assert "second block refused" in out.stdout and "after the free: served" in out.stdout, out


@pytest.fixture(scope="module")
def many():
    """BUILD/holders/many and 600 copies of one holder library (libh0.so ...)."""
    out = BUILD / "holders" / "many-libs"
    out.mkdir(parents=True, exist_ok=True)
    lib = _cc(out / "libh0.so", [SRC / "holder_lib.c"], ["-shared", "-fPIC"])
    for i in range(1, 600):
        copy = out / f"libh{i}.so"
        if not copy.exists() or copy.stat().st_mtime < lib.stat().st_mtime:
            shutil.copyfile(lib, copy)
    return out, str(holder_program("many", SRC / "many.c", ["-ldl"]))


def many_rows(stdout):
    rows = {}
    figures = {}
    for line in stdout.splitlines():
        if line.startswith("ROW "):
            name, place, cached, live, peak, blocks, unused = line[4:].rsplit(" ", 6)
            rows[(name, int(place), int(cached))] = (int(live), int(peak), int(blocks), int(unused))
        elif line.split()[0] in ("COUNT", "ASKED", "STATS"):
            figures[line.split()[0]] = int(line.split()[1])
    return rows, figures


def test_each_of_140_libraries_holds_what_it_asked_for(many):
    """Issue 29: 140 libraries x one 5 MiB block read 700 MiB asked (each block is mapped 6 MiB:
    1 MiB unused beside it), every library its own row, and tm_holders answers how many rows
    there are, not the 48 of the report's table."""
    libs, main = many
    out = ok(run([main, str(libs), "140", str(5 * MIB)], env={"TENSORMALLOC_STATS": "1"}))
    rows, figures = many_rows(out.stdout)
    mine = {n: v for (n, p, c), v in rows.items() if n.startswith("libh")}
    assert len(mine) == 140, rows
    assert all(v == (5 * MIB, 5 * MIB, 1, MIB) for v in mine.values()), mine
    assert figures["COUNT"] == len(rows) > 48, figures
    held = sum(v[0] + v[3] for (n, p, c), v in rows.items() if p == -1 and not c)
    assert held == figures["STATS"], (held, figures)
    assert "more rows)" in out.stderr and "The table is full" not in out.stderr, out.stderr


def test_requests_past_the_threshold_count_what_was_asked(many):
    """64 KiB + i requests under THRESHOLD=64K: the row reads the bytes asked, exactly; live plus
    unused add up to the stats."""
    _, main = many
    out = ok(run([main, "-", "0", str(64 << 10), "1000"], env={"TENSORMALLOC_THRESHOLD": "64K"}))
    rows, figures = many_rows(out.stdout)
    (live, _, blocks, unused), = [v for (n, p, c), v in rows.items() if n == "many" and p == -1]
    assert (live, blocks) == (figures["ASKED"], 1000), (rows, figures)
    assert live + unused == figures["STATS"], (rows, figures)


def test_a_full_table_says_so(many):
    """600 libraries: 511 are named, the rest are counted as unknown, and the report says how
    many were; tm_holders still answers every row."""
    libs, main = many
    out = ok(run([main, str(libs), "600", str(MIB)], env={"TENSORMALLOC_THRESHOLD": "1M", "TENSORMALLOC_STATS": "1"}))
    rows, figures = many_rows(out.stdout)
    named = [n for (n, p, c) in rows if n.startswith("libh")]
    assert len(named) == 511, len(named)  # the program itself asks for nothing large
    assert rows[("unknown", -1, 0)][2] == 600 - len(named), rows[("unknown", -1, 0)]
    assert figures["COUNT"] == len(rows), figures
    assert f"The table is full: {600 - len(named)} more holders are counted as unknown" in out.stderr, out.stderr


def test_an_unloaded_library_keeps_its_blocks_and_its_name(many):
    """A library unloaded with a live block, and another loaded after it (in its place, when the
    loader reuses it): two rows, the first named as unloaded."""
    libs, main = many
    out = ok(run([main, str(libs), "unload", str(8 * MIB)]))
    rows, _ = many_rows(out.stdout)
    assert rows[("libh0.so (unloaded)", -1, 0)][:3] == (8 * MIB, 8 * MIB, 1), rows
    assert rows[("libh1.so", -1, 0)][:3] == (8 * MIB, 8 * MIB, 1), rows


def test_a_wrapper_holds_its_blocks_however_it_was_compiled():
    """Issue 29 (Note [Wrappers and tail calls]): `xmalloc` compiled to a tail call (-O2:
    `jmp malloc@plt`) and to a call (-O0), and a C++ factory ending in a tail call to operator
    new[], each charged to its own library, never to the program that called the wrapper."""
    out_dir = BUILD / "holders" / "wrap"
    out_dir.mkdir(parents=True, exist_ok=True)
    src = SRC / "wrap.c"
    # The same source under two prefixes: the -O2 build's xmalloc must really be a tail call.
    tail = _cc(out_dir / "libwrap_tail.so", [src], ["-shared", "-fPIC", "-O2", "-foptimize-sibling-calls", "-Dxmalloc=tail_xmalloc",
                                                   "-Dxmalloc_checked=tail_xmalloc_checked"])
    call = _cc(out_dir / "libwrap_call.so", [src], ["-shared", "-fPIC", "-O0", "-Dxmalloc=call_xmalloc", "-Dxmalloc_checked=call_xmalloc_checked"])
    disasm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(tail)], capture_output=True, text=True).stdout
    body = disasm.split("<tail_xmalloc>:")[1].split("\n\n")[0]
    assert "jmp" in body and "call" not in body, body
    new = out_dir / "libwrap_new.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(new), str(SRC / "wrap_new.cc")], check=True)
    main = _cc(out_dir / "wrap_main", [SRC / "wrap_main.c"], [f"-L{out_dir}", "-lwrap_tail", "-lwrap_call", "-lwrap_new", f"-Wl,-rpath,{out_dir}", "-ldl"])
    out = ok(run([str(main)]))
    live = {}
    for line in out.stdout.splitlines():
        if line.startswith("ROW "):
            name, place, cached, n = line[4:].rsplit(" ", 3)
            if cached == "0":
                live[name] = int(n)
    assert live == {"libwrap_tail.so": 16 * MIB, "libwrap_call.so": 8 * MIB, "libwrap_new.so": 8 * MIB}, live
