"""PyTorch over tensormalloc's device pool: `tensormalloc.torch.enable()` before the first CUDA
allocation makes PyTorch allocate through CUDAPluggableAllocator over tm_cuda_alloc/tm_cuda_free
(stream-aware reuse, no device synchronization), from the pool that CuPy and Numba share when
tensormalloc.cupy / .numba are enabled too."""
from tensormalloc import _cuda, loaded_path

_allocator = None


def enable():
    """Installs the pool as PyTorch's CUDA allocator. Raises ImportError without PyTorch, and
    PyTorch's own RuntimeError when CUDA memory was already allocated (call it first)."""
    global _allocator
    torch = _cuda.require("torch", "torch")
    if _allocator is not None:
        return
    _cuda.library()
    # PyTorch dlopens the file it is given: give it the copy already in this process (the
    # preloaded one, or the one tensormalloc loaded), so there is one pool, not two.
    alloc = torch.cuda.memory.CUDAPluggableAllocator(loaded_path(), "tm_cuda_alloc_torch", "tm_cuda_free")
    torch.cuda.memory.change_current_allocator(alloc)
    _allocator = alloc
    # torch.cuda.empty_cache() is how PyTorch users give memory to other processes: after
    # PyTorch's own, the pool's cached blocks on the current device go back to the driver.
    lib = _cuda.library()
    trim = lambda: lib.tm_cuda_trim(torch.cuda.current_device())
    for module in (torch.cuda, torch.cuda.memory):
        _cuda.after(module, "empty_cache", trim)
