"""PyTorch over tensormalloc's device pool: `tensormalloc.torch.enable()` before the first CUDA
allocation makes PyTorch allocate through CUDAPluggableAllocator over
tm_cuda_alloc_torch_raising/tm_cuda_free (stream-aware reuse, no device synchronization), from the
pool that CuPy and Numba share when tensormalloc.cupy / .numba are enabled too.

A request the device cannot hold raises torch.OutOfMemoryError, as PyTorch's own allocator does
(the pluggable allocator would otherwise hand out a tensor at address 0), and the next
allocation works. PyTorch's pluggable allocator keeps no statistics and takes no snapshot:
`memory_stats()`, `memory_allocated()`, `memory_reserved()`, `max_memory_allocated()` and
`snapshot()` here answer with PyTorch's key names and format from the pool, and after `enable()`
torch.cuda.memory_stats() (so memory_allocated(), memory_reserved(), max_memory_allocated()),
torch.cuda.memory_summary() and torch.cuda.memory._snapshot() (so _dump_snapshot()) answer with
them too. Without `enable()` they are PyTorch's own."""
import collections
import os
import pickle
import shutil
import tempfile

import tensormalloc
from tensormalloc import _cuda, loaded_path

_allocator = None


def enable():
    """Installs the pool as PyTorch's CUDA allocator. Raises ImportError without PyTorch, and
    PyTorch's own RuntimeError when CUDA memory was already allocated (call it first)."""
    global _allocator
    torch = _cuda.require("torch", "torch")
    if _allocator is not None:
        return
    lib = _cuda.library()
    lib.tm_cuda_oom_raises()  # finds the exception to raise now, while nothing is short
    # PyTorch dlopens the file it is given: give it the copy already in this process (the
    # preloaded one, or the one tensormalloc loaded), so there is one pool, not two.
    alloc = torch.cuda.memory.CUDAPluggableAllocator(loaded_path(), "tm_cuda_alloc_torch_raising", "tm_cuda_free")
    torch.cuda.memory.change_current_allocator(alloc)
    _allocator = alloc
    # torch.cuda.empty_cache() is how PyTorch users give memory to other processes: after
    # PyTorch's own, the pool's cached blocks on the current device go back to the driver.
    # As PyTorch's own, nothing before CUDA has started or in a child forked after it started:
    # current_device() there starts CUDA, or raises "Cannot re-initialize CUDA in forked
    # subprocess" (the package hunter).
    trim = lambda: lib.tm_cuda_trim(torch.cuda.current_device()) if torch.cuda.is_initialized() else None
    for module in (torch.cuda, torch.cuda.memory):
        _cuda.after(module, "empty_cache", trim)
    # What PyTorch's pluggable allocator cannot answer, answered from the pool (the functions
    # that read memory_stats or _snapshot, memory_allocated and _dump_snapshot among them, follow).
    for module in (torch.cuda, torch.cuda.memory):
        for name, ours in (("memory_stats", memory_stats), ("memory_summary", memory_summary)):
            if hasattr(module, name):
                setattr(module, name, ours)
    if hasattr(torch.cuda.memory, "_snapshot"):
        torch.cuda.memory._snapshot = snapshot
    # PyTorch's pluggable allocator takes a memory fraction and does nothing with it: a cap the
    # program believes in would be ignored. Refused plainly instead, as PyTorch refuses the
    # controls it does not support, with the setting that caps the pool.
    for module in (torch.cuda, torch.cuda.memory):
        if hasattr(module, "set_per_process_memory_fraction"):
            module.set_per_process_memory_fraction = _memory_fraction_refused


def _memory_fraction_refused(fraction, device=None):
    raise RuntimeError("set_per_process_memory_fraction is not supported under tensormalloc.torch.enable(): "
                       "set TENSORMALLOC_CUDA_LIMIT (a percentage of each device, or bytes) before the process starts")


def enabled():
    """True once `enable()` made the pool PyTorch's allocator."""
    return _allocator is not None


def _device_index(device):
    import torch
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


# The pool's figures under PyTorch's names (torch.cuda.memory_stats), for the blocks PyTorch
# holds (the holders table's "torch" rows) and the pool's memory on the device (every holder's
# blocks and what the pool keeps cached there: PyTorch's "reserved"). Figures the pool keeps
# for all devices together (retries, failures, segments, peak reserved) are given only when
# the pool is on one device.
def memory_stats(device=None):
    """PyTorch's memory statistics with PyTorch's key names: from the pool after `enable()`
    (allocated_bytes, requested_bytes, active_bytes, allocation, active and reserved_bytes
    `.all.current`, allocated_bytes/requested_bytes `.all.peak`; with the pool on one device also
    reserved_bytes.all.peak, num_alloc_retries, num_ooms, num_device_alloc, num_device_free),
    else PyTorch's own torch.cuda.memory_stats()."""
    import torch
    if _allocator is None:
        return torch.cuda.memory.memory_stats(device)
    if not torch.cuda.is_initialized():
        # As PyTorch's own: before the first CUDA call, and in a forked child, nothing to say
        # (and no context made, nor CUDA started in a child, to say it).
        return collections.OrderedDict()
    index = _device_index(device)
    place = f"cuda:{index}"
    rows = tensormalloc.holders()
    mine = [r for r in rows if r["place"] == place and not r["cached"] and r["holder"] == "torch"]
    reserved = sum(r["live_bytes"] + r["unused_bytes"] for r in rows if r["place"] == place)
    allocated = sum(r["live_bytes"] + r["unused_bytes"] for r in mine)
    requested = sum(r["live_bytes"] for r in mine)
    blocks = sum(r["blocks"] for r in mine)
    peak = sum(r["peak_bytes"] for r in mine)
    out = {
        "allocated_bytes.all.current": allocated,
        "allocated_bytes.all.peak": max(peak, allocated),
        "requested_bytes.all.current": requested,
        "requested_bytes.all.peak": max(peak, requested),
        "active_bytes.all.current": allocated,
        "allocation.all.current": blocks,
        "active.all.current": blocks,
        "reserved_bytes.all.current": reserved,
    }
    if {r["place"] for r in rows if r["place"].startswith("cuda:")} <= {place}:
        s = tensormalloc.stats()
        out.update({
            "reserved_bytes.all.peak": max(s["cuda_peak_reserved_bytes"], reserved),
            "num_alloc_retries": s["cuda_oom_retries"],
            "num_ooms": s["cuda_oom_failures"],
            "num_device_alloc": s["cuda_segments_mapped"],
            "num_device_free": s["cuda_segments_released"],
        })
    return collections.OrderedDict(sorted(out.items()))


def memory_allocated(device=None):
    """Bytes of the blocks PyTorch's tensors hold on the device (torch.cuda.memory_allocated)."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    """The most memory_allocated() has been (torch.cuda.max_memory_allocated)."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    """Bytes the allocator holds on the device, used or cached (torch.cuda.memory_reserved)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def memory_summary(device=None, abbreviated=False):
    """A few lines of the pool's figures for the device (PyTorch's own summary without
    `enable()`)."""
    import torch
    if _allocator is None:
        return torch.cuda.memory.memory_summary(device, abbreviated)
    # As PyTorch's own, which starts CUDA (its device index does) and raises as it does in a child
    # forked after CUDA started. Before, this called PyTorch's, which called ours (RecursionError).
    torch.cuda.init()
    s = memory_stats(device)
    mib = lambda key: f"{s[key] / 2**20:.1f} MiB" if key in s else "n/a"
    lines = [f"tensormalloc's pool on cuda:{_device_index(device)} (PyTorch's allocator: tensormalloc.torch.enable())",
             f"  allocated {mib('allocated_bytes.all.current')} in {s['allocation.all.current']} blocks "
             f"(peak {mib('allocated_bytes.all.peak')}), requested {mib('requested_bytes.all.current')}",
             f"  reserved {mib('reserved_bytes.all.current')} (peak {mib('reserved_bytes.all.peak')})"]
    if not abbreviated:
        lines += [f"  {r['holder']}: {r['live_bytes'] / 2**20:.1f} MiB in {r['blocks']} blocks"
                  for r in tensormalloc.holders() if r["place"] == f"cuda:{_device_index(device)}"]
    return "\n".join(lines) + "\n"


def snapshot(device=None, augment_with_fx_traces=False):
    """The memory snapshot as torch.cuda.memory._snapshot() returns it (segments, blocks with
    the library that holds each, device_traces): the pool's after `enable()` (every device, as
    PyTorch's), else PyTorch's own. `device` and `augment_with_fx_traces` are accepted for
    PyTorch's signature."""
    import torch
    if _allocator is None:
        return torch.cuda.memory._snapshot(device, augment_with_fx_traces)
    directory = tempfile.mkdtemp(prefix="tensormalloc-snapshot-")  # 0700: nobody else reads it
    try:
        path, _ = tensormalloc.snapshot(os.path.join(directory, "snapshot.pickle"))
        with open(path, "rb") as f:
            return pickle.load(f)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
