"""Numba over tensormalloc's device pool, as an External Memory Management plugin:
`tensormalloc.numba.enable()` (before the first CUDA context is made), or
NUMBA_CUDA_MEMORY_MANAGER=tensormalloc.numba in the environment. Numba calls the driver API
only, which is what the pool runs over. IPC handles: Numba sends the allocation's base and the
block's offset (cuMemGetAddressRange); under the preload that query answers with the block, so a
block sharing a pooled segment cannot be exported (docs/cuda.md, "What the pool does with the calls
around it")."""
import ctypes

from tensormalloc import _cuda

_manager = None


def _make_finalizer(free, ptr, size, device):
    def finalize():
        free(ptr, size, device, None)
    return finalize


def _nv_binding(driver):
    """Whether Numba talks to the driver through NVIDIA's cuda-python binding (pointers are
    CUdeviceptr) or its own ctypes one (c_uint64). Newer numba-cuda has only the former."""
    return getattr(driver, "USE_NV_BINDING", hasattr(driver, "binding"))


def manager_class():
    """The EMM plugin class (built on first use: this module imports without Numba)."""
    global _manager
    if _manager is not None:
        return _manager
    numba_cuda = _cuda.require("numba.cuda", "numba")
    from numba.cuda.cudadrv import driver

    class TensormallocMemoryManager(driver.GetIpcHandleMixin, numba_cuda.HostOnlyCUDAMemoryManager):
        """Device memory from tensormalloc's pool (on the default stream); pinned and mapped
        host memory as Numba's own HostOnlyCUDAMemoryManager does."""

        def initialize(self):
            self._lib = _cuda.library()

        def memalloc(self, size):
            device = self.context.device.id
            ptr = self._lib.tm_cuda_alloc_as(size, device, None, _cuda.NUMBA) if size else 0
            if size and not ptr:
                raise driver.CudaAPIError(2, f"tensormalloc: out of device memory for {size} bytes")  # CUDA_ERROR_OUT_OF_MEMORY
            handle = driver.binding.CUdeviceptr(ptr) if _nv_binding(driver) else ctypes.c_uint64(ptr)
            finalizer = _make_finalizer(self._lib.tm_cuda_free, ptr, size, device) if ptr else None
            return driver.MemoryPointer(self.context, handle, size, finalizer=finalizer)

        def get_memory_info(self):
            # As Numba's own manager: the driver's figures (which count our cached blocks as used).
            if _nv_binding(driver):
                free, total = driver.driver.cuMemGetInfo()
            else:
                free, total = ctypes.c_size_t(), ctypes.c_size_t()
                driver.driver.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total))
                free, total = free.value, total.value
            return numba_cuda.MemoryInfo(free=free, total=total)

        @property
        def interface_version(self):
            return 1

    _manager = TensormallocMemoryManager
    return _manager


def enable():
    """Makes tensormalloc's pool Numba's device memory manager. Raises ImportError without
    Numba."""
    numba_cuda = _cuda.require("numba.cuda", "numba")
    numba_cuda.set_memory_manager(manager_class())


def __getattr__(name):
    # NUMBA_CUDA_MEMORY_MANAGER=tensormalloc.numba reads this attribute.
    if name == "_numba_memory_manager":
        return manager_class()
    raise AttributeError(name)
