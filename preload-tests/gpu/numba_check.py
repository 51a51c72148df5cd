"""Numba on a real GPU (issue 18): cuda.close() releases the primary context to zero, and the
next allocation makes a new one (often with the same handle). Three rounds of device arrays
(cuMemAlloc), pinned arrays (cuMemHostAlloc) and copies between them, each followed by
cuda.close(): every array of a new round must work and hold its own data, none may come from the
dead context (under the preload: the pool must have forgotten the segments and pinned blocks it
cached). Prints one JSON line; {"skipped": REASON} and status 0 when numba or a GPU is missing."""
import json
import sys
import time


def skip(reason):
    print(json.dumps({"skipped": reason}))
    sys.exit(0)


try:
    from numba import cuda
except ImportError as e:
    skip(f"numba is not installed ({e})")
try:
    available = cuda.is_available()
except Exception as e:  # noqa: BLE001 - any failure to reach the driver means no GPU here
    skip(f"numba cannot reach a GPU ({e})")
if not available:
    skip("numba sees no GPU")

import numpy as np  # noqa: E402

N = 8 << 20
t0 = time.perf_counter()
failures = 0


def one_round(value):
    """Device and pinned arrays of a few sizes, written, copied and read back; all freed at the end."""
    global failures
    for n in (N, N // 4, 3 * N):
        d = cuda.to_device(np.full(n, value, np.uint8))         # cuMemAlloc, host to device
        e = cuda.device_array(n, np.uint8)                      # cuMemAlloc
        e.copy_to_device(d)                                     # device to device
        p = cuda.pinned_array(n, np.uint8)                      # cuMemHostAlloc
        p[:] = value + 1                                        # a pinned block of a dead context faults here
        f = cuda.to_device(p)
        failures += int(not (e.copy_to_host() == value).all())
        failures += int(not (f.copy_to_host() == value + 1).all())
        del d, e, f, p
    cuda.current_context().deallocations.clear()               # Numba frees lazily: free them now


rounds = 3
for r in range(rounds):
    one_round(2 * r + 1)
    one_round(2 * r + 2)                                        # reuses what the first one freed
    cuda.close()                                                # the primary context released to zero
ms = (time.perf_counter() - t0) * 1e3
print(json.dumps({"scenario": "numba-close", "rounds": rounds, "failures": failures, "ms": round(ms, 1)}))
sys.exit(1 if failures else 0)
