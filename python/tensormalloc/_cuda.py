"""What the GPU modules share: the library's device entry points (tm_cuda_alloc/tm_cuda_free,
one pool per device for every library in the process).

The pool runs over the CUDA driver the process already loaded (libcuda.so.1, see
src/sys/cuda_driver.rs), so it needs no runtime: PyTorch, CuPy and Numba (driver API only) all
load the driver before their first allocation.
"""
import ctypes

import tensormalloc


def library():
    """The library with its device entry points typed."""
    lib = tensormalloc.load()
    lib.tm_cuda_alloc.restype = ctypes.c_void_p
    lib.tm_cuda_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    # The same, naming the hook's library for the holders table (tensormalloc.holders()).
    lib.tm_cuda_alloc_as.restype = ctypes.c_void_p
    lib.tm_cuda_alloc_as.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.tm_cuda_free.restype = None
    lib.tm_cuda_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.tm_cuda_trim.restype = ctypes.c_size_t
    lib.tm_cuda_trim.argtypes = [ctypes.c_int]
    return lib


def after(module, name, then):
    """Replaces `module.name` (a function) by one that calls it, then `then()`; once."""
    original = getattr(module, name)
    if getattr(original, "_tensormalloc", False):
        return

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        then()
        return result
    wrapper._tensormalloc = True
    wrapper.__doc__ = original.__doc__
    wrapper.__name__ = getattr(original, "__name__", name)
    setattr(module, name, wrapper)


# tm_cuda_alloc_as's hook numbers (src/record/holders.rs HOOK_KEYS).
CUPY = 3
NUMBA = 4


def require(module, what):
    """Imports `module` or says plainly that `what` needs it."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as e:
        raise ImportError(f"tensormalloc.{what}.enable() needs {what}, which is not installed here ({e})") from None
