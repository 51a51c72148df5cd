"""numpy under the preload: the seed expression gives the same results as under glibc, with
fewer than 5% of glibc's page faults; zeros are zeros after the cache has held dirty blocks."""
import json
import sys
from pathlib import Path

from conftest import ok, run

PY = sys.executable
HERE = Path(__file__).resolve().parent


def seed(preload, **env):
    out = ok(run([PY, str(HERE / "py" / "seed.py")], preload=preload, env=env))
    return json.loads(out.stdout)


def test_seed_expression_same_results_far_fewer_faults():
    glibc = seed(False)
    # A process a loaded machine stalls sees its idle blocks released, and with memory short
    # (as when the whole suite runs) dropped: its next steps fault them in again. That is the
    # idle policy at work, not this test's subject; left on, a starved run came to 5.1% of
    # glibc's faults where an idle one has 4.9% (test_mid_size.py sets the same).
    ours = seed(True, TENSORMALLOC_HOST_RELEASE_MS="60000")
    assert ours["digests"] == glibc["digests"] and len(ours["digests"]) == 1
    assert ours["sum"] == glibc["sum"]
    assert glibc["faults_per_iter"] > 100, glibc  # the problem we solve is there
    assert ours["faults_per_iter"] < 0.05 * glibc["faults_per_iter"], (ours, glibc)


def test_seed_expression_with_every_path_pushed():
    ours = seed(True, TENSORMALLOC_THRESHOLD="64K", TENSORMALLOC_CACHE_BLOCKS="1",
                TENSORMALLOC_HOST_RELEASE_MS="0", TENSORMALLOC_HOST_UNMAP_MS="0")
    glibc = seed(False)
    assert ours["digests"] == glibc["digests"]


def test_numpy_zeros_and_copies_are_exact():
    code = r"""
import numpy as np
for i in range(30):
    a = np.full(3_000_000 + i * 4099, 7.5)
    del a
    z = np.zeros(3_000_000 + i * 4099)
    assert not z.any(), i
    c = np.concatenate([z, np.ones(1_000_000)])
    assert c.sum() == 1_000_000
    r = np.resize(c, c.size * 2)
    assert r.sum() == 2_000_000
print("ok")
"""
    out = ok(run([PY, "-c", code], env={"TENSORMALLOC_THRESHOLD": "1M"}))
    assert out.stdout.strip() == "ok"


def test_seed_in_16_threads_misses_only_each_threads_first_block(tmp_path):
    """The seed expression in 16 threads at once (numpy drops the GIL), 60 rounds: every miss is
    an input array or a thread's first temporary (the cache is empty then), nothing is evicted,
    so at least 98% of requests hit (the issue measured 84% with a fixed bound, 38 blocks
    evicted and faulted in again)."""
    code = r"""
import threading
import numpy as np
a, b = np.random.default_rng(1).random(1_000_000), np.random.default_rng(2).random(1_000_000)
expected = float(((a * b) ** 2 + 3).sum())
start = threading.Barrier(16)
sums = []
def work():
    start.wait()
    for _ in range(60):
        sums.append(float(((a * b) ** 2 + 3).sum()))
ts = [threading.Thread(target=work) for _ in range(16)]
for t in ts:
    t.start()
for t in ts:
    t.join()
assert len(sums) == 960 and all(s == expected for s in sums)
print("ok")
"""
    report = tmp_path / "stats.json"
    # The 8 MB arrays only: numpy's import makes blocks of 128 KiB and more that would count too.
    out = ok(run([PY, "-c", code], env={"TENSORMALLOC_STATS": f"json:{report}", "TENSORMALLOC_THRESHOLD": "4M"}))
    assert out.stdout.strip() == "ok"
    host = json.loads(report.read_text())["host"]
    assert host["misses"] + host["grows"] <= 16 + 2, host
    assert host["unmapped_blocks"] == 0, host
    assert host["hits"] >= 0.98 * host["requests"], host
