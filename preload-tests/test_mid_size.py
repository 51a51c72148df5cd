"""Mid-size blocks (issue 38): from glibc's mmap threshold (128 KiB) to 4 MiB, a request in a
loop costs no fault once the loop has settled, under the default settings, beside glibc alone
(which maps and unmaps them, or trims its heap under them, every step)."""
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import LIB, compile_c, find_peer, ok, run

PY = sys.executable
HERE = Path(__file__).resolve().parent
STEP = re.compile(r"^step (\d+): (\d+) faults$", re.M)
# Pages the history ring takes on as it fills (about one a step here) and the stdio
# buffer: not the blocks'.
SETTLED_MAX = 4


# A process a loaded machine stalls for a second sees its idle blocks released, and with memory
# short (MemAvailable under an eighth, as when the whole suite runs) dropped with MADV_DONTNEED:
# the next step faults them in again. That is the idle policy at work, not this test's subject.
NO_IDLE_RELEASE = {"TENSORMALLOC_HOST_RELEASE_MS": "60000"}


def mid_size(preload, env=None, steps=20):
    """The faults of the first step, and of each step from the ninth on."""
    env = {**NO_IDLE_RELEASE, **(env or {})}
    out = ok(run([compile_c("mid_size"), str(steps)], preload=preload, env=env))
    assert "mid size ok" in out.stdout
    faults = [int(f) for _, f in STEP.findall(out.stdout)]
    assert len(faults) == steps, out.stdout
    return faults[0], faults[8:], out.stdout


def settled_as_promised(settled, peer_settled, out):
    """From the ninth step on, the blocks cost no fault: most steps fault at most SETTLED_MAX
    pages, and all of them together under 2% of what the peer's fault. (On a loaded machine
    our background thread's stack may be mapped between the program's blocks at another moment,
    and the cache's blocks then lie otherwise: once in a few hundred runs one step gathers a
    block whose pages were not all touched, and faults those, 20 to 100.)"""
    assert sorted(settled)[len(settled) // 2] <= SETTLED_MAX, out
    assert sum(settled) * 50 <= sum(peer_settled), out


def test_a_training_loop_of_mid_size_blocks_stops_faulting():
    """malloc, calloc, posix_memalign and realloc from 128 KiB to 4 MiB, every page written,
    freed in a changing order: under glibc every step faults a thousand pages in; under us
    most steps from the ninth on fault at most a few pages (none of them the blocks'), and all
    of them together under 2% of glibc's (settled_as_promised). (At the
    old 4M threshold glibc, serving these, settles too in this program: the numpy loop below is
    the one the old default fails.) A calloc served by writing zeros, on a loaded machine, once
    went back to dropping a block's pages (a whole block faulted in again, 1 run in 8): Note
    [calloc costs what is touched]."""
    _, glibc_settled, glibc_out = mid_size(False)
    first, settled, out = mid_size(True)
    assert min(glibc_settled) > 500, glibc_out  # the problem is there under glibc alone (1,024 here)
    assert first > 1000, out  # the first step maps its blocks, as glibc does
    settled_as_promised(settled, glibc_settled, out)


def test_mid_size_blocks_over_jemalloc_stop_faulting_too():
    """In front of jemalloc with the PyTorch launcher's setting, which purges every large block
    at once (oversize_threshold:1)."""
    jemalloc = find_peer("libjemalloc.so.2")
    env = {"MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto"}
    _, jemalloc_settled, jemalloc_out = mid_size(jemalloc, env)
    _, settled, out = mid_size(f"{LIB} {jemalloc}", env)
    assert min(jemalloc_settled) > 500, jemalloc_out  # 9,500 here
    settled_as_promised(settled, jemalloc_settled, out)


@pytest.mark.parametrize("setting", [{}, {"TENSORMALLOC_THRESHOLD": "4M"}])
def test_numpy_arrays_of_256k_to_2m_in_a_loop(setting):
    """numpy temporaries of 256 KiB to 2 MiB (`a*b + 1`, a sum of products, a concatenation) in
    a loop: no fault per iteration once settled under the default threshold; with the old
    threshold (4M) they went to glibc, which faults (the figure is printed for comparison)."""
    code = r"""
import json, resource
import numpy as np
arrays = [np.random.default_rng(n).random(n) for n in (32_768, 65_536, 131_072, 262_144)]
def step():
    total = 0.0
    for a in arrays:
        b = a * 2.0 + 1.0
        c = np.concatenate([a, b])
        total += float((c * c).sum())
    return total
for _ in range(5):
    want = step()
f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    assert step() == want
print(json.dumps({"faults_per_iter": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / 50}))
"""
    ours = json.loads(ok(run([PY, "-c", code], env={**NO_IDLE_RELEASE, **setting})).stdout)
    glibc = json.loads(ok(run([PY, "-c", code], preload=False)).stdout)
    if setting:
        assert ours["faults_per_iter"] > 10, (ours, glibc)  # the old threshold left them to glibc
    else:
        assert ours["faults_per_iter"] < 1, (ours, glibc)


def test_a_ring_of_drifting_sizes_gathers_nothing(tmp_path):
    """Note [Gathering pages] (src/host/cache/gather.rs), c/drifting_ring.c: 64 live blocks of
    200-400 KB, each request a little larger than the block freed before it. A third of the
    requests gathered pages of several cached blocks (four system calls and a new piece left
    behind each time: 40 times glibc's time touching a byte a block); below 1 MiB a request is
    now a fresh mapping or a hit, never a gathering."""
    stats = tmp_path / "stats.json"
    ok(run([compile_c("drifting_ring")], preload=False))
    out = ok(run([compile_c("drifting_ring")], env={"TENSORMALLOC_STATS": f"json:{stats}"}))
    assert out.stdout == "ring ok\n", out
    host = json.loads(stats.read_text())["host"]
    assert host["requests"] >= 20000 and host["grows"] == 0, host


def heap_top(preload, big_mib, mode="plain", env=None):
    """heap_top.c's faults a round: forty 100 KiB requests, glibc's, freed together."""
    out = ok(run([compile_c("heap_top"), str(big_mib), mode], preload=preload, env={**NO_IDLE_RELEASE, **(env or {})}))
    return int(re.search(r"faults a round (\d+)", out.stdout).group(1))


def test_glibcs_heap_behind_us_keeps_its_top_as_glibc_alone_would():
    """Requests just under our threshold are glibc's. glibc alone, once the program has freed one
    large (mmapped) chunk, keeps up to twice its size free at its heap's top: a round of forty
    100 KiB requests then faults no page. Behind us it never saw one, and gave its top back every
    round: 968 faults a round (Note [glibc's sliding threshold])."""
    assert heap_top(False, 8) <= 4
    assert heap_top(True, 8) <= 4


@pytest.mark.parametrize("big_mib, mode, env", [
    (0, "plain", {}),  # no large block freed: glibc alone gives its top back, and so do we
    (8, "plain", {"MALLOC_TRIM_THRESHOLD_": "131072"}),
    (8, "plain", {"GLIBC_TUNABLES": "glibc.malloc.top_pad=0"}),
    (8, "fix-before", {}),
    (8, "fix-after", {}),  # the program's mallopt after our slide: its value stands
])
def test_glibcs_heap_gives_its_top_back_where_glibc_alone_would(big_mib, mode, env):
    """Where glibc alone gives its heap's top back every round (no large chunk freed yet, or
    thresholds the environment or the program fixed), so does glibc behind us: we keep nothing
    it would not."""
    glibc = heap_top(False, big_mib, mode, env)
    ours = heap_top(True, big_mib, mode, env)
    assert glibc > 500, glibc  # 968 here: every page of the round
    assert ours > glibc // 2, (ours, glibc)


def test_a_heap_top_over_tcmalloc_costs_no_fault_either():
    """tcmalloc behind us keeps the memory it frees, as alone: no fault a round, with or without
    a large block of ours freed first."""
    tcmalloc = find_peer("libtcmalloc_minimal.so.4")
    assert heap_top(f"{LIB} {tcmalloc}", 8) <= 4
    assert heap_top(f"{LIB} {tcmalloc}", 0) <= 4


def test_numpy_arrays_just_under_our_threshold_in_a_loop():
    """numpy temporaries of 96 KB (`(a*b + 1) * (a - b)` on 12,000 float64), glibc's, once an
    8 MB array has come and gone: glibc alone keeps its heap's top and faults nothing an
    iteration; behind us it gave the top back every time (19 faults an iteration, three times
    glibc's time), and keeps it now (Note [glibc's sliding threshold])."""
    code = r"""
import json, resource
import numpy as np
np.ones(1_000_000).sum()
a, b = np.full(12_000, 1.5), np.full(12_000, 2.5)
for _ in range(100):
    want = float(((a * b + 1) * (a - b)).sum())
f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2000):
    c = (a * b + 1) * (a - b)
assert float(c.sum()) == want
print(json.dumps({"faults_per_iter": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / 2000}))
"""
    glibc = json.loads(ok(run([PY, "-c", code], preload=False)).stdout)
    ours = json.loads(ok(run([PY, "-c", code], env=NO_IDLE_RELEASE)).stdout)
    assert glibc["faults_per_iter"] < 0.5, glibc
    assert ours["faults_per_iter"] < 0.5, (ours, glibc)
