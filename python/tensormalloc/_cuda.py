"""What the GPU modules share: the library's device entry points (tm_cuda_alloc/tm_cuda_free,
one pool per device for every library in the process), and a CUDA runtime for that pool to bind.

The pool calls the program's CUDA *runtime* (libcudart), found as already loaded (see
src/sys/cuda.rs); it never loads one. PyTorch and CuPy load theirs; Numba uses only the driver
API, so `ensure_runtime()` loads one for it: the nvidia-cuda-runtime wheel's, else the system's.
"""
import ctypes
import glob
import os
import sys

import tensormalloc

# The sonames the library looks for (src/sys/cuda.rs), newest first.
SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")
_RTLD_NOLOAD = 4


def library():
    """The library with its device entry points typed."""
    lib = tensormalloc.load()
    lib.tm_cuda_alloc.restype = ctypes.c_void_p
    lib.tm_cuda_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.tm_cuda_free.restype = None
    lib.tm_cuda_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return lib


def require(module, what):
    """Imports `module` or says plainly that `what` needs it."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as e:
        raise ImportError(f"tensormalloc.{what}.enable() needs {what}, which is not installed here ({e})") from None


def loaded_runtime():
    """The soname of a CUDA runtime already in the process, or None."""
    for soname in SONAMES:
        try:
            ctypes.CDLL(soname, mode=os.RTLD_LAZY | _RTLD_NOLOAD)
            return soname
        except OSError:
            continue
    return None


def _wheel_runtimes():
    """libcudart files of the nvidia-cuda-runtime wheels (nvidia/cuda_runtime/lib, CUDA 12;
    nvidia/cu13/lib, CUDA 13) on sys.path."""
    found = []
    for base in sys.path:
        for pattern in ("nvidia/cu13/lib/libcudart.so.*", "nvidia/cuda_runtime/lib/libcudart.so.*"):
            found += sorted(glob.glob(os.path.join(base or ".", pattern)))
    return found


_runtime = None  # keeps the handle we loaded alive


def ensure_runtime():
    """Makes sure a CUDA runtime is loaded, so the pool can bind it; returns its name."""
    global _runtime
    name = loaded_runtime()
    if name:
        return name
    errors = []
    for candidate in _wheel_runtimes() + list(SONAMES):
        try:
            _runtime = ctypes.CDLL(candidate, mode=os.RTLD_LAZY | os.RTLD_GLOBAL)
            return candidate
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError("tensormalloc: no CUDA runtime (libcudart) to load: the device pool calls the CUDA runtime "
                       "API. Install one (pip install nvidia-cuda-runtime-cu12, or the CUDA toolkit) or put its "
                       "directory on LD_LIBRARY_PATH. Tried: " + "; ".join(errors[-3:]))
