"""tensormalloc from Python: read the stats, trim the cache, switch caching off and on, and
account for what a block of code allocates. ctypes over the C API (include/tensormalloc.h), no
build step. Works when the library is preloaded (LD_PRELOAD / scripts/tensormalloc) or when
TENSORMALLOC_LIB names it; otherwise `loaded()` is False and the functions do nothing.

    import tensormalloc
    with tensormalloc.scope("epoch") as s:
        train_one_epoch()
    print(s.peak_bytes, s.live_bytes)      # large host blocks and CUDA blocks only
    print(tensormalloc.stats()["host_hits"])
    tensormalloc.trim()
"""
import ctypes
import os

_u64 = ctypes.c_uint64


class _Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32), ("enabled", ctypes.c_uint32)] + [
        (name, _u64) for name in (
            "threshold_bytes", "host_requests", "host_hits", "host_misses", "host_grows", "host_hit_bytes",
            "host_frees", "host_live_bytes", "host_peak_live_bytes", "host_cached_bytes",
            "host_peak_cached_bytes", "host_cached_blocks", "host_released_blocks", "host_released_bytes",
            "host_unmapped_blocks", "host_unmapped_bytes", "host_map_failures",
            "cuda_requests", "cuda_hits", "cuda_segments_mapped", "cuda_segments_released",
            "cuda_oom_retries", "cuda_oom_failures", "cuda_reserved_bytes", "cuda_peak_reserved_bytes",
            "cuda_live_bytes", "cuda_peak_live_bytes", "pinned_requests", "pinned_hits",
            "pinned_cached_bytes", "pinned_peak_cached_bytes")]


class _Scope(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 48), ("depth", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("allocations", _u64), ("frees", _u64), ("allocated_bytes", _u64), ("freed_bytes", _u64),
                ("peak_bytes", _u64), ("live_bytes", ctypes.c_int64)]


def _load():
    candidates = [None]  # the process itself: finds the symbols when preloaded
    if os.environ.get("TENSORMALLOC_LIB"):
        candidates.append(os.environ["TENSORMALLOC_LIB"])
    for c in candidates:
        try:
            lib = ctypes.CDLL(c)
            lib.tm_get_stats  # noqa: B018 - raises AttributeError when absent
        except (OSError, AttributeError):
            continue
        lib.tm_get_stats.argtypes = [ctypes.POINTER(_Stats)]
        lib.tm_trim.restype = ctypes.c_size_t
        lib.tm_version.restype = ctypes.c_char_p
        lib.tm_scope_begin.argtypes = [ctypes.c_char_p]
        lib.tm_scope_end.argtypes = [ctypes.POINTER(_Scope)]
        lib.tm_scope_current.argtypes = [ctypes.POINTER(_Scope)]
        return lib
    return None


_lib = _load()


def loaded():
    """True when the library is in this process."""
    return _lib is not None


def version():
    return _lib.tm_version().decode() if _lib else None


def stats():
    """All counters of tm_stats_t as a dict ({} when not loaded)."""
    if not _lib:
        return {}
    s = _Stats(size=ctypes.sizeof(_Stats))
    _lib.tm_get_stats(ctypes.byref(s))
    return {name: getattr(s, name) for name, _ in _Stats._fields_ if name != "size"}


def trim():
    """Gives every cached block back now; returns the bytes released."""
    return _lib.tm_trim() if _lib else 0


def set_enabled(on):
    """Turns caching on or off; returns the previous setting."""
    return bool(_lib.tm_set_enabled(1 if on else 0)) if _lib else False


class ScopeResult:
    """What a scope saw: allocations, frees, allocated/freed/peak/live bytes."""

    def __init__(self, name):
        self.name = name
        self.depth = self.allocations = self.frees = 0
        self.allocated_bytes = self.freed_bytes = self.peak_bytes = self.live_bytes = 0

    def _fill(self, raw):
        for field, _ in _Scope._fields_:
            if field not in ("name", "reserved"):
                setattr(self, field, getattr(raw, field))

    def __repr__(self):
        return (f"ScopeResult({self.name!r}, allocated={self.allocated_bytes}, freed={self.freed_bytes}, "
                f"peak={self.peak_bytes}, live={self.live_bytes})")


class scope:
    """`with tensormalloc.scope("name") as s:` counts this thread's large and CUDA allocations."""

    def __init__(self, name):
        self.result = ScopeResult(name)

    def __enter__(self):
        if _lib is not None:
            if _lib.tm_scope_begin(self.result.name.encode()[:47]) < 0:
                raise RuntimeError("tensormalloc: at most 16 nested scopes")
        return self.result

    def __exit__(self, *exc):
        if _lib is not None:
            raw = _Scope()
            _lib.tm_scope_end(ctypes.byref(raw))
            self.result._fill(raw)
        return False
