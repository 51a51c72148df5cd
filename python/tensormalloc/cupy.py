"""CuPy over tensormalloc's device pool: `tensormalloc.cupy.enable()` sets CuPy's allocator to
one that takes blocks from tm_cuda_alloc on the current device and stream; a block goes back
with tm_cuda_free, on the stream it was allocated on, when CuPy drops its last reference."""
import ctypes

from tensormalloc import _cuda


class _Block:
    """Owner of one block: frees it when CuPy's memory object lets go of it."""

    __slots__ = ("ptr", "size", "device", "stream", "free")

    def __init__(self, ptr, size, device, stream, free):
        self.ptr, self.size, self.device, self.stream, self.free = ptr, size, device, stream, free

    def __del__(self):
        self.free(self.ptr, self.size, self.device, self.stream)


def malloc(size):
    """CuPy allocator function: a MemoryPointer over a block of the pool."""
    import cupy
    lib = _cuda.library()
    device = cupy.cuda.runtime.getDevice()
    if size == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device_id=device), 0)
    stream = cupy.cuda.get_current_stream().ptr
    ptr = lib.tm_cuda_alloc_as(size, device, ctypes.c_void_p(stream), _cuda.CUPY)
    if not ptr:
        # As CuPy's pool raises it: the size asked and what is allocated (here the device's memory
        # in use); no limit argument, since none was set (CuPy would print it as one).
        free, total = cupy.cuda.runtime.memGetInfo()
        raise cupy.cuda.memory.OutOfMemoryError(size, total - free)
    owner = _Block(ptr, size, device, ctypes.c_void_p(stream), lib.tm_cuda_free)
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, size, owner, device_id=device), 0)


class _DefaultPool:
    """CuPy's default memory pool as `cupy.get_default_memory_pool()` hands it out once the
    pool is ours: `free_all_blocks()`, the call CuPy users make to give memory to other
    processes, also gives the pool's cached blocks on the current device back to the driver."""

    def __init__(self, pool):
        self._pool = pool

    def free_all_blocks(self, *args, **kwargs):
        import cupy
        result = self._pool.free_all_blocks(*args, **kwargs)
        _cuda.library().tm_cuda_trim(cupy.cuda.runtime.getDevice())
        return result

    def __getattr__(self, name):
        return getattr(self._pool, name)


def enable():
    """Makes tensormalloc's pool CuPy's allocator. Raises ImportError without CuPy."""
    cupy = _cuda.require("cupy", "cupy")
    _cuda.library()
    cupy.cuda.set_allocator(malloc)
    if not getattr(cupy.get_default_memory_pool, "_tensormalloc", False):
        default = cupy.get_default_memory_pool

        def get_default_memory_pool():
            return _DefaultPool(default())
        get_default_memory_pool._tensormalloc = True
        get_default_memory_pool.__doc__ = default.__doc__
        cupy.get_default_memory_pool = get_default_memory_pool


def disable():
    """Puts back CuPy's default memory pool."""
    cupy = _cuda.require("cupy", "cupy")
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
