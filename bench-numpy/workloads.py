"""numpy workloads for the side-by-side benchmark. `python workloads.py NAME` runs one in this
process (under whatever allocator the runner preloaded) and prints one JSON line:
ms per iteration (median of the timed iterations), minor faults per iteration, peak RSS, and,
for the idle workload, memory still held after idling past tensormalloc's release delay."""
import json
import resource
import statistics
import sys
import threading
import time

import numpy as np


def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def held_mb():
    """RSS minus LazyFree (memory the kernel may take back at no cost), in MB."""
    rss = lazy = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("LazyFree:"):
                lazy = int(line.split()[1])
    return (rss - lazy) / 1024


def timed(body, iterations, warmup=2, per_iteration=False):
    """ms per iteration (the median, or every iteration's if per_iteration) and faults per
    iteration."""
    for _ in range(warmup):
        body()
    times = []
    f0 = minflt()
    for _ in range(iterations):
        t = time.perf_counter()
        body()
        times.append((time.perf_counter() - t) * 1e3)
    faults = (minflt() - f0) / iterations
    return (times if per_iteration else statistics.median(times)), faults


def seed():
    rng = np.random.default_rng(1)
    a, b = rng.random(10_000_000), rng.random(10_000_000)

    def body():
        (a * b) ** 2 + 3
    return timed(body, 40)


# Below 4 MiB the time of `a*b + 1` moves by up to a half with where the result lands relative
# to a and b modulo 4 KiB (store-to-load aliasing), and that position depends on every small
# allocation made before: loading any library shifts it. So each small sweep runs over LAYOUTS
# placements of a and b (views at offsets spread over 4 KiB) and reports the median over all of
# them, not the luck of one placement.
LAYOUTS = 8


def sweep(nbytes, after_a_large_one=False):
    """`a*b + 1` on arrays of `nbytes`; `after_a_large_one`: once an 8 MB array has come and gone,
    as in any numpy program (glibc alone then keeps the top of its heap for arrays under its
    mmap threshold: Note [glibc's sliding threshold] in src/route/glibc_slide.rs)."""
    def run():
        if after_a_large_one:
            np.ones(1 << 20).sum()
        n = nbytes // 8
        iterations = max(5, min(400, (2 << 30) // max(nbytes, 1) // 4))
        layouts = LAYOUTS if nbytes < (4 << 20) else 1
        times, faults = [], 0.0
        for k in range(layouts):
            shift_a, shift_b = 65 * k % 512, 195 * k % 512  # elements: 520 and 1560 bytes apart
            a = np.full(n + shift_a, 1.5)[shift_a:]
            b = np.full(n + shift_b, 2.5)[shift_b:]

            def body():
                a * b + 1
            ms, f = timed(body, max(5, iterations // layouts), per_iteration=True)
            times += ms
            faults += f / layouts
        return statistics.median(times), faults
    return run


def zeros():
    def body():
        z = np.zeros(10_000_000)
        z += 1.0
    return timed(body, 40)


def empty_fill():
    def body():
        e = np.empty(10_000_000)
        e.fill(3.0)
    return timed(body, 40)


def concat_reshape():
    rng = np.random.default_rng(2)
    a, b = rng.random(4_000_000), rng.random(4_000_000)

    def body():
        c = np.concatenate([a, b])
        c.reshape(2000, -1).T.copy()
    return timed(body, 30)


def fft():
    rng = np.random.default_rng(3)
    x = rng.random(1 << 22)

    def body():
        np.fft.ifft(np.fft.fft(x))
    return timed(body, 20)


def matmul():
    rng = np.random.default_rng(4)
    a, b = rng.random((1500, 1500)), rng.random((1500, 1500))

    def body():
        (a @ b) + a
    return timed(body, 15)


def mlp():
    """A two-layer MLP trained with plain numpy: activations and gradients of 16-64 MB."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4096, 1024))
    y = rng.standard_normal((4096, 256))
    w1 = rng.standard_normal((1024, 2048)) * 0.02
    w2 = rng.standard_normal((2048, 256)) * 0.02

    def body():
        nonlocal w1, w2
        h = x @ w1
        a = np.maximum(h, 0)
        out = a @ w2
        g_out = (out - y) * (2 / len(x))
        g_w2 = a.T @ g_out
        g_a = g_out @ w2.T
        g_h = g_a * (h > 0)
        g_w1 = x.T @ g_h
        w1 = w1 - 1e-3 * g_w1
        w2 = w2 - 1e-3 * g_w2
    return timed(body, 8, warmup=1)


def threads():
    """Two threads evaluating the seed expression on 5M arrays at once (numpy drops the GIL)."""
    rng = np.random.default_rng(6)
    arrays = [(rng.random(5_000_000), rng.random(5_000_000)) for _ in range(2)]

    def body():
        def work(a, b):
            for _ in range(4):
                (a * b) ** 2 + 3
        ts = [threading.Thread(target=work, args=ab) for ab in arrays]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return timed(body, 12)


def seed_threads(n_threads):
    """The seed expression in N threads at once on shared inputs (numpy drops the GIL): each
    thread has its own 80 MB temporaries. ms per round (every thread evaluates once)."""
    def run():
        rng = np.random.default_rng(8)
        a, b = rng.random(10_000_000), rng.random(10_000_000)
        start = threading.Barrier(n_threads + 1)
        done = threading.Barrier(n_threads + 1)
        stop = False

        def work():
            while True:
                start.wait()
                if stop:
                    return
                (a * b) ** 2 + 3
                done.wait()
        ts = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in ts:
            t.start()

        def body():
            start.wait()
            done.wait()
        result = timed(body, 12)
        stop = True
        start.wait()
        for t in ts:
            t.join()
        return result
    return run


def zeros_touch(nbytes, dense):
    """np.zeros of NBYTES (calloc; numpy advises huge pages from 4 MiB up), then either every
    element used (dense: `z += 1`) or two elements set (sparse: a table sized for the worst case)."""
    def run():
        n = nbytes // 8

        def body():
            z = np.zeros(n)
            if dense:
                z += 1.0
            else:
                z[0] = 1.0
                z[n // 2] = 1.0
        return timed(body, 20 if dense else 200)
    return run


def idle():
    """Seed loop, then free everything and idle past the release delay: how much more memory
    (RSS minus LazyFree) does the process hold than before it started working?"""
    base = held_mb()
    ms, faults = seed()
    rng = np.random.default_rng(7)
    arrays = [rng.random(10_000_000) for _ in range(4)]
    del arrays
    time.sleep(2.5)  # tensormalloc's default release delay is 1 s
    return ms, faults, held_mb() - base


WORKLOADS = {
    "seed": seed,
    "sweep-96K": sweep(96 << 10, after_a_large_one=True),
    **{f"sweep-{label}": sweep(n) for label, n in [
        ("256K", 256 << 10), ("1M", 1 << 20), ("4M", 4 << 20), ("16M", 16 << 20),
        ("64M", 64 << 20), ("256M", 256 << 20), ("512M", 512 << 20)]},
    "zeros": zeros,
    "empty-fill": empty_fill,
    "concat-reshape": concat_reshape,
    "fft": fft,
    "matmul": matmul,
    "mlp": mlp,
    "threads": threads,
    "idle": idle,
    **{f"seed-{n}t": seed_threads(n) for n in (1, 4, 16)},
    **{f"zeros-{kind}-{label}": zeros_touch(nb, kind == "dense") for kind in ("sparse", "dense")
       for label, nb in [("8M", 8 << 20), ("64M", 64 << 20), ("256M", 256 << 20)]},
}

if __name__ == "__main__":
    name = sys.argv[1]
    result = WORKLOADS[name]()
    ms, faults = result[0], result[1]
    out = {"ms": ms, "faults": faults, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if len(result) > 2:
        out["held_after_idle_mb"] = result[2]
    print(json.dumps(out))
