"""The Python module from the source tree (PYTHONPATH=python) over the preloaded library: stats,
trim, enable, scopes with figures that match a known allocation pattern; its struct matches the
header; inert without the library; the numpy handler over the release build without the preload.
The installed package: test_package.py."""
import re

from conftest import ROOT, ok, run

PY = str(ROOT / ".venv" / "bin" / "python")
ENV = {"PYTHONPATH": str(ROOT / "python")}


def test_struct_fields_match_the_header():
    import sys
    sys.path.insert(0, str(ROOT / "python"))
    import tensormalloc
    header = (ROOT / "include" / "tensormalloc.h").read_text()
    body = header[header.index("typedef struct tm_stats_t"):header.index("} tm_stats_t;")]
    fields = re.findall(r"^\s+(?:size_t|uint32_t|uint64_t)\s+(\w+);", body, re.M)
    assert fields == [f for f, _ in tensormalloc._Stats._fields_]
    body = header[header.index("typedef struct tm_scope_t"):header.index("} tm_scope_t;")]
    fields = re.findall(r"^\s+(?:char|uint32_t|uint64_t|int64_t)\s+(\w+)", body, re.M)
    assert fields == [f for f, _ in tensormalloc._Scope._fields_]


def test_stats_has_every_host_figure_of_the_report(tmp_path):
    # One vocabulary: each host figure of the JSON report is in stats() (and tm_stats_t) as
    # host_NAME, with the same value once the program is done with its blocks.
    code = r"""
import json, mmap, ctypes, numpy as np, tensormalloc
for _ in range(5):
    a = np.ones(4_000_000)
    del a
b = np.ones(4_000_000)
libc = ctypes.CDLL(None)
libc.mprotect(ctypes.c_void_p(b.ctypes.data & ~4095), 4096, mmap.PROT_READ)
del b
c = np.zeros(4_000_000)
del c
print(json.dumps(tensormalloc.stats()))
"""
    path = tmp_path / "s.json"
    out = ok(run([PY, "-c", code], env={**ENV, "TENSORMALLOC_STATS": f"json:{path}"}))
    stats = __import__("json").loads(out.stdout)
    host = __import__("json").loads(path.read_text())["host"]
    for name, value in host.items():
        field = name if name == "threshold_bytes" else f"host_{name}"
        assert field in stats, f"the JSON's host.{name} is not in stats()"
    assert stats["host_reset_blocks"] == host["reset_blocks"] >= 1, (stats, host)
    for name in ("bound_blocks", "bound_bytes", "unresettable_blocks", "retries_after_trim", "calloc_zeroed_by_discard"):
        assert stats[f"host_{name}"] == host[name], name
    assert stats["host_handed_out_bytes"] >= 7 * 32_000_000


def test_scope_figures_match_a_known_pattern():
    code = r"""
import numpy as np, tensormalloc
assert tensormalloc.loaded()
n = 2_000_000                      # 16 MB of float64 per array
with tensormalloc.scope("epoch") as outer:
    kept = np.ones(n)              # lives on after the scope: leaked from its point of view
    for i in range(3):
        with tensormalloc.scope("step") as inner:
            a = np.ones(n)         # two arrays of 16 MB, both freed in the step
            b = np.ones(n)
            del a, b
    peak_inner = inner.peak_bytes
print(outer.allocations, outer.live_bytes, outer.peak_bytes, inner.allocations, inner.live_bytes, peak_inner)
s = tensormalloc.stats()
print(s["host_requests"] > 0, tensormalloc.trim() >= 0, tensormalloc.set_enabled(False), tensormalloc.set_enabled(True))
"""
    out = ok(run([PY, "-c", code], env=ENV))
    line1, line2 = out.stdout.split("\n")[:2]
    outer_allocs, outer_live, outer_peak, inner_allocs, inner_live, inner_peak = map(int, line1.split())
    block = 16 * 2**20  # 16,000,000 bytes rounded to 2 MiB huge pages: 16 MiB
    assert outer_allocs == 1 + 3 * 2
    assert outer_live == block, "only `kept` is live when the epoch ends"
    assert inner_allocs == 2 and inner_live == 0
    assert inner_peak == 2 * block and outer_peak == 3 * block
    assert line2 == "True True True False"


def test_module_is_inert_without_the_library():
    code = ("import tensormalloc; s = tensormalloc.stats(); "
            "print(tensormalloc.loaded(), tensormalloc.loaded_by(), len(s), sum(s.values()), s['host_hits'], tensormalloc.trim())")
    out = ok(run([PY, "-c", code], preload=False, env=ENV))
    assert out.stdout.split() == ["False", "None", str(len(tensormalloc_fields())), "0", "0", "0"]


def tensormalloc_fields():
    header = (ROOT / "include" / "tensormalloc.h").read_text()
    body = header[header.index("typedef struct tm_stats_t"):header.index("} tm_stats_t;")]
    return [f for f in re.findall(r"^\s+(?:size_t|uint32_t|uint64_t)\s+(\w+);", body, re.M) if f != "size"]


def test_numpy_handler_from_the_source_tree():
    """PYTHONPATH=python and the release build, no preload: the handler serves from the cache."""
    code = r"""
import numpy as np, tensormalloc, tensormalloc.numpy as tn
with tn.handler():
    for _ in range(5):
        a = np.ones(4_000_000)
        del a
s = tensormalloc.stats()
print(tensormalloc.loaded_by(), tn.handler_name(), s["host_requests"], s["host_hits"])
"""
    out = ok(run([PY, "-c", code], preload=False, env=ENV))
    assert out.stdout.split() == ["path", "default_allocator", "5", "4"], out.stdout



def test_device_pool_without_preload_or_runtime_serves_a_driver_only_library():
    """What tensormalloc.numba's plugin does under Numba (the driver API only, no libcudart,
    no preload), against the stand-in driver: the driver loaded and a context current by the
    library's own calls, then tm_cuda_alloc/free reach one pool over that driver."""
    from cudasim import fake_cuda
    code = r"""
import ctypes, os, tensormalloc
from tensormalloc import _cuda
cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_LAZY)  # as Numba loads it: privately
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
lib = _cuda.library()
p = lib.tm_cuda_alloc(1 << 20, 0, None)
lib.tm_cuda_free(p, 1 << 20, 0, None)
q = lib.tm_cuda_alloc(1 << 20, 0, None)
s = tensormalloc.stats()
runtimes = [l for l in open("/proc/self/maps") if "libcudart" in l]
print(bool(p), p == q, s["cuda_requests"], s["cuda_hits"], len(runtimes))
"""
    out = ok(run([PY, "-c", code], preload=False, env={**ENV, "LD_LIBRARY_PATH": str(fake_cuda())}))
    assert out.stdout.split() == ["True", "True", "2", "1", "0"], out.stdout + out.stderr


def test_hooks_name_their_library_in_the_holders_table():
    """tm_cuda_alloc_torch (tensormalloc.torch's pluggable allocator) and tm_cuda_alloc_as with
    the CuPy and Numba hooks' numbers, over the stand-in driver: tensormalloc.holders() has a
    row for each library with its exact bytes; a block the hook frees leaves its row."""
    from cudasim import fake_cuda
    code = r"""
import ctypes, os, tensormalloc
from tensormalloc import _cuda
cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_LAZY)
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
lib = _cuda.library()
lib.tm_cuda_alloc_torch.restype = ctypes.c_void_p
lib.tm_cuda_alloc_torch.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
t = lib.tm_cuda_alloc_torch(4 << 20, 0, None)
c = lib.tm_cuda_alloc_as(8 << 20, 0, None, _cuda.CUPY)
n = lib.tm_cuda_alloc_as(2 << 20, 0, None, _cuda.NUMBA)
lib.tm_cuda_free(n, 2 << 20, 0, None)
for r in tensormalloc.holders():
    if not r["cached"]:
        print(r["holder"], r["place"], r["live_bytes"] >> 20, r["peak_bytes"] >> 20, r["blocks"])
"""
    out = ok(run([PY, "-c", code], preload=False, env={**ENV, "LD_LIBRARY_PATH": str(fake_cuda())}))
    assert out.stdout.splitlines() == ["cupy cuda:0 8 8 1", "torch cuda:0 4 4 1", "numba cuda:0 0 2 0"], out.stdout + out.stderr


FRAMEWORKS = {
    # Just what the hooks touch, as PyTorch and CuPy name it: the hooks' code is the real code.
    "torch/__init__.py": "from . import cuda\n",
    "torch/cuda/__init__.py": "from . import memory\nfrom .memory import empty_cache\nemptied = []\n"
                              "def current_device():\n    return 0\ndef is_initialized():\n    return True\n",
    "torch/cuda/memory.py": "class CUDAPluggableAllocator:\n    def __init__(self, path, alloc, free):\n        self.args = (path, alloc, free)\n"
                            "def change_current_allocator(a):\n    pass\n"
                            "def empty_cache():\n    import torch.cuda\n    torch.cuda.emptied.append(1)\n",
    "cupy/__init__.py": "from . import cuda\nclass _Pool:\n    freed = 0\n    def free_all_blocks(self):\n        _Pool.freed += 1\n"
                        "    def used_bytes(self):\n        return 0\n_pool = _Pool()\ndef get_default_memory_pool():\n    return _pool\n",
    "cupy/cuda/__init__.py": "from . import runtime\ndef set_allocator(f):\n    pass\n",
    "cupy/cuda/runtime.py": "def getDevice():\n    return 0\n",
}


def test_a_framework_emptying_its_cache_gives_the_pools_memory_back_to_the_driver(tmp_path):
    """Issue 27, item 6, *asked*: under tensormalloc.torch and tensormalloc.cupy, the calls their
    users make to hand memory to other processes, torch.cuda.empty_cache() and CuPy's
    free_all_blocks(), run the framework's own and then give the pool's cached segments on the
    current device back to the driver (over the stand-in driver, with stand-in frameworks that
    have just the entry points the hooks use)."""
    from cudasim import fake_cuda
    for name, text in FRAMEWORKS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    code = r"""
import ctypes, os, tensormalloc, tensormalloc.torch, tensormalloc.cupy
import torch, cupy
from tensormalloc import _cuda
cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_LAZY)
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
tensormalloc.torch.enable()
tensormalloc.cupy.enable()
lib = _cuda.library()
reserved = lambda: tensormalloc.stats()["cuda_reserved_bytes"] >> 20
for empty in (torch.cuda.empty_cache, lambda: cupy.get_default_memory_pool().free_all_blocks()):
    p = lib.tm_cuda_alloc(64 << 20, 0, None)
    lib.tm_cuda_free(p, 64 << 20, 0, None)
    held = reserved()
    empty()
    print(held, reserved())
print(len(torch.cuda.emptied), type(cupy.get_default_memory_pool()).__name__, cupy._Pool.freed, cupy.get_default_memory_pool().used_bytes())
"""
    env = {**ENV, "PYTHONPATH": f"{ROOT / 'python'}:{tmp_path}", "LD_LIBRARY_PATH": str(fake_cuda())}
    out = ok(run([PY, "-c", code], preload=False, env=env))
    lines = out.stdout.splitlines()
    assert [l.split()[1] for l in lines[:2]] == ["0", "0"] and all(int(l.split()[0]) >= 64 for l in lines[:2]), out.stdout + out.stderr
    assert lines[2] == "1 _DefaultPool 1 0", out.stdout
