"""PyTorch, CuPy and Numba in one process draw from one tensormalloc pool (needs a GPU and all
three; not run in CI). Over the source tree's release build, without and with the preload:
    PYTHONPATH=python python3 preload-tests/gpu/one_pool.py
    PYTHONPATH=python scripts/tensormalloc python3 preload-tests/gpu/one_pool.py
Each library allocates 64 MiB after the previous one freed its block: the pool serves it again,
so it never reserves two such blocks; every library's data reads back right. Prints 'one pool ok'.
Written without a GPU to run it on: not yet run."""
import numpy as np

import tensormalloc
import tensormalloc.cupy
import tensormalloc.numba
import tensormalloc.torch

tensormalloc.torch.enable()   # before PyTorch's first CUDA allocation
tensormalloc.numba.enable()   # before Numba makes its context
tensormalloc.cupy.enable()

import cupy  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

N = 64 << 20
s0 = tensormalloc.stats()
t = torch.full((N,), 7, dtype=torch.uint8, device="cuda")
ptrs = [t.data_ptr()]
assert int(t.sum()) == 7 * N
del t
torch.cuda.synchronize()

c = cupy.full(N, 5, dtype=cupy.uint8)
ptrs.append(c.data.ptr)
assert int(c.sum()) == 5 * N
del c
cupy.cuda.get_current_stream().synchronize()

host = np.arange(N, dtype=np.uint8)
d = cuda.to_device(host)
ptrs.append(d.device_ctypes_pointer.value)
assert (d.copy_to_host() == host).all()
del d

s1 = tensormalloc.stats()
requests = s1["cuda_requests"] - s0["cuda_requests"]
hits = s1["cuda_hits"] - s0["cuda_hits"]
# Three 64 MiB arrays one after the other: one pool holds one such block (plus small ones for
# the reductions' outputs); a pool per library would hold three.
assert requests >= 3 and hits >= 2, (requests, hits)
assert s1["cuda_peak_reserved_bytes"] < 2 * N, s1
print(f"one pool ok ({tensormalloc.loaded_by()}): requests {requests}, hits {hits}, "
      f"peak reserved {s1['cuda_peak_reserved_bytes'] >> 20} MiB, same 64 MiB block: {len(set(ptrs)) == 1}")
