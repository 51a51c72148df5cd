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
        free, total = cupy.cuda.runtime.memGetInfo()
        raise cupy.cuda.memory.OutOfMemoryError(size, total - free, total)
    owner = _Block(ptr, size, device, ctypes.c_void_p(stream), lib.tm_cuda_free)
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, size, owner, device_id=device), 0)


def enable():
    """Makes tensormalloc's pool CuPy's allocator. Raises ImportError without CuPy."""
    cupy = _cuda.require("cupy", "cupy")
    _cuda.library()
    cupy.cuda.set_allocator(malloc)


def disable():
    """Puts back CuPy's default memory pool."""
    cupy = _cuda.require("cupy", "cupy")
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
