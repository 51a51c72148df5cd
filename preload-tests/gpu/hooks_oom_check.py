"""Out of memory under tensormalloc's CuPy and Numba hooks on a real GPU (issue 36, item 2): with
the hook enabled, allocating 1 GiB arrays until the device is full ends with the framework's
own error (cupy.cuda.memory.OutOfMemoryError; Numba's CudaAPIError with CUDA_ERROR_OUT_OF_MEMORY),
every array before it real, and after freeing them the next allocation works. Usage:
hooks_oom_check.py cupy|numba. Prints JSON: {"failures": N, "arrays": n, "error": ...}, or
{"skipped": why} when the framework is not installed."""
import json
import sys

GIB = 1 << 30


def fill(allocate, error):
    held = []
    try:
        for _ in range(4096):
            held.append(allocate())
    except error as e:
        return held, e
    return held, None


def cupy_check():
    import cupy
    import tensormalloc.cupy
    tensormalloc.cupy.enable()
    held, err = fill(lambda: cupy.empty(GIB, dtype=cupy.uint8), cupy.cuda.memory.OutOfMemoryError)
    failures = int(err is None) + sum(a.data.ptr == 0 for a in held)
    n = len(held)
    held.clear()
    again = cupy.arange(1 << 20, dtype=cupy.int32)
    failures += int(int(again[-1]) != (1 << 20) - 1)
    return {"failures": failures, "arrays": n, "error": str(err)[:300]}


def numba_check():
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError
    import numpy as np
    import tensormalloc.numba
    tensormalloc.numba.enable()
    held, err = fill(lambda: cuda.device_array(GIB, dtype=np.uint8), CudaAPIError)
    failures = int(err is None) + int(err is not None and int(err.code) != 2)
    failures += sum(a.device_ctypes_pointer.value == 0 for a in held)
    n = len(held)
    held.clear()
    back = cuda.to_device(np.arange(1 << 20, dtype=np.int32)).copy_to_host()
    failures += int(back[-1] != (1 << 20) - 1)
    return {"failures": failures, "arrays": n, "error": str(err)[:300]}


if __name__ == "__main__":
    which = sys.argv[1]
    try:
        __import__(which)
    except ImportError as e:
        print(json.dumps({"skipped": f"{which} is not installed ({e})"}))
        sys.exit(0)
    print(json.dumps(cupy_check() if which == "cupy" else numba_check()))
