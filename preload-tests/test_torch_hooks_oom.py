"""Issue 36, item 2: a request the device cannot hold, under the framework hooks, raises what the
framework raises, never a null block; the next allocation works. Over the stand-in driver.
Real PyTorch's torch.OutOfMemoryError is test_torch_real.py's (hooks runs, check oom); here the
thrower's fallbacks (a C++ process without libc10.so: std::bad_alloc, caught by the caller with
its registers intact; a C process: the null and one line), and CuPy's and Numba's hooks with
stand-in frameworks that have just what the hooks touch (the real ones are scripts/gpu-check's)."""
import pytest

from conftest import ROOT, compile_c, compile_cxx, ok, run
from cudasim import fake_cuda

PY = str(ROOT / ".venv" / "bin" / "python")
DEVICE = 256 << 20


def standin_env(**extra):
    return {"LD_LIBRARY_PATH": str(fake_cuda()), "FAKECUDA_DEVICE_MEM": str(DEVICE), **extra}


def test_a_cxx_caller_catches_bad_alloc_without_libc10():
    out = ok(run([compile_cxx("torch_oom")], env=standin_env()))
    lines = out.stdout.splitlines()
    assert lines[:3] == ["raises 2", "caught 3", "next allocation works"], out.stdout + out.stderr
    assert lines[3].startswith("filled ") and 1 <= int(lines[3].split()[1]) <= DEVICE >> 26, lines
    assert lines[4:] == ["after filling: works"], lines


def test_a_c_process_gets_the_null_and_one_line():
    out = ok(run([compile_c("torch_oom_plain")], env=standin_env()))
    assert out.stdout.splitlines() == ["raises 1", "null, then the next allocation works"], out.stdout
    assert out.stderr.count("no C++ runtime in the process to raise with") == 1, out.stderr


# The parts of CuPy and Numba the hooks touch, as CuPy and Numba name them; memGetInfo and
# cuMemGetInfo ask the stand-in driver.
FRAMEWORKS = {
    "cupy/__init__.py": "from . import cuda\nclass _Pool:\n    pass\n_pool = _Pool()\ndef get_default_memory_pool():\n    return _pool\n",
    "cupy/cuda/__init__.py": """from . import memory, runtime
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=None):
        self.ptr, self.size, self.owner = ptr, size, owner
class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset
class _Stream:
    ptr = 0
def get_current_stream():
    return _Stream()
def set_allocator(f):
    pass
""",
    "cupy/cuda/runtime.py": """import ctypes
_cuda = ctypes.CDLL("libcuda.so.1")
def getDevice():
    return 0
def memGetInfo():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert _cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return free.value, total.value
""",
    # CuPy's own class and message (cupy/cuda/memory.pyx).
    "cupy/cuda/memory.py": """class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        if limit == 0:
            msg = 'Out of memory allocating {:,} bytes (allocated so far: {:,} bytes).'.format(size, total)
        else:
            msg = 'Out of memory allocating {:,} bytes (allocated so far: {:,} bytes, limit set to: {:,} bytes).'.format(size, total, limit)
        super().__init__(msg)
""",
    "numba/__init__.py": "",
    "numba/cuda/__init__.py": """import collections
from . import cudadrv
MemoryInfo = collections.namedtuple("MemoryInfo", "free total")
class HostOnlyCUDAMemoryManager:
    def __init__(self, context):
        self.context = context
def set_memory_manager(cls):
    pass
""",
    "numba/cuda/cudadrv/__init__.py": "from . import driver\n",
    "numba/cuda/cudadrv/driver.py": """import ctypes
USE_NV_BINDING = False
class CudaAPIError(Exception):
    def __init__(self, code, msg):
        self.code, self.msg = code, msg
        super().__init__(code, msg)
class GetIpcHandleMixin:
    pass
class MemoryPointer:
    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.context, self.device_pointer, self.size, self._finalizer = context, pointer, size, finalizer
    def free(self):
        self._finalizer()
class _Driver:
    def __init__(self):
        self._cuda = ctypes.CDLL("libcuda.so.1")
    def cuMemGetInfo(self, free, total):
        assert self._cuda.cuMemGetInfo_v2(free, total) == 0
driver = _Driver()
""",
}

HOOKS = r"""
import ctypes, os
cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_LAZY)
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
import tensormalloc.cupy, tensormalloc.numba, cupy
from numba.cuda.cudadrv import driver
tensormalloc.cupy.enable()
MB = 1 << 20
a = tensormalloc.cupy.malloc(64 * MB)
try:
    tensormalloc.cupy.malloc(1 << 30)
    print("cupy: no error")
except cupy.cuda.memory.OutOfMemoryError as e:
    print("cupy:", e)
b = tensormalloc.cupy.malloc(64 * MB)
print("cupy next:", b.ptr != 0)

class Device:
    id = 0
class Context:
    device = Device()
manager = tensormalloc.numba.manager_class()(Context())
manager.initialize()
c = manager.memalloc(64 * MB)
try:
    manager.memalloc(1 << 30)
    print("numba: no error")
except driver.CudaAPIError as e:
    print("numba:", e.code, e.msg)
d = manager.memalloc(64 * MB)
print("numba next:", d.device_pointer.value != 0)
"""


@pytest.mark.parametrize("preloaded", [False, True], ids=["by-path", "preload"])
def test_cupy_and_numba_hooks_raise_their_own_out_of_memory_errors(tmp_path, preloaded):
    for name, text in FRAMEWORKS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = standin_env(PYTHONPATH=f"{ROOT / 'python'}:{tmp_path}")
    out = ok(run([PY, "-c", HOOKS], preload=preloaded, env=env))
    lines = out.stdout.splitlines()
    # CuPy's message: what was asked, and the device memory in use (no limit was set).
    assert lines[0].startswith("cupy: Out of memory allocating 1,073,741,824 bytes (allocated so far: "), lines
    used = int(lines[0].split("so far: ")[1].split(" bytes")[0].replace(",", ""))
    assert 64 << 20 <= used <= DEVICE and "limit" not in lines[0], lines[0]
    assert lines[1] == "cupy next: True", lines
    # Numba's: CUDA_ERROR_OUT_OF_MEMORY, the code its own manager raises (and retries on).
    assert lines[2].startswith("numba: 2 tensormalloc: out of device memory for 1073741824 bytes"), lines
    assert lines[3] == "numba next: True", lines
