"""tensormalloc from Python: read the stats, trim the cache, switch caching off and on, and
account for what a block of code allocates; ctypes over the C API (include/tensormalloc.h).

The library is found in this process when it was preloaded (`tensormalloc python ...`,
LD_PRELOAD) and then counts every large malloc. Without the preload, `import tensormalloc` loads
nothing (`loaded()` is False, `stats()` all zeros, with one warning saying how to load it) until
`load()`, or `tensormalloc.numpy` / `.torch` / `.cupy` / `.numba`'s `enable()`, which load it by
path (`library_path()`): it then counts only what those hooks hand it. TENSORMALLOC_LIB names a
library to load on first use. The four hook modules are attributes of the package, imported on
first touch (PEP 562), so `import tensormalloc` never imports numpy or torch.

    import tensormalloc
    with tensormalloc.scope("epoch") as s:
        blocks = [bytearray(64 << 20) for _ in range(3)]
    print(s.peak_bytes, s.live_bytes)      # large host blocks and CUDA blocks only
    print(tensormalloc.stats()["host_hits"])
    tensormalloc.trim()
"""
import ctypes
import os
import warnings
from pathlib import Path

__version__ = "0.1.0"  # the package's and the library's (Cargo.toml): test_package.py checks they agree

__all__ = ["library_path", "load", "loaded", "loaded_by", "loaded_path", "version", "stats", "holders",
           "trim", "set_enabled", "snapshot", "scope", "ScopeResult"]  # the hooks are left out: `import *` must not shadow numpy

# The hooks, reachable as `tensormalloc.numpy` after `import tensormalloc`; imported on first
# touch, so importing the package imports none of numpy, torch, cupy or numba.
_HOOKS = ("numpy", "torch", "cupy", "numba", "plot")


def __getattr__(name):
    if name in _HOOKS:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")  # also binds it as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOOKS))

_u64 = ctypes.c_uint64
_HERE = Path(__file__).resolve().parent


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
            "pinned_cached_bytes", "pinned_peak_cached_bytes",
            "host_cached_resident_bytes", "host_cached_lazyfree_bytes",
            # version 3
            "host_handed_out_bytes", "host_deferred_unmap_bytes", "host_bound_blocks", "host_bound_bytes",
            "host_calloc_zeroed_by_discard", "host_reset_blocks", "host_unresettable_blocks",
            "host_retries_after_trim")]


class _Holder(ctypes.Structure):
    """tm_holder_t, version 3 (include/tensormalloc.h), filled by tm_get_holders."""
    _fields_ = [("size", ctypes.c_uint32), ("version", ctypes.c_uint32), ("name", ctypes.c_char * 64),
                ("place", ctypes.c_int32), ("cached", ctypes.c_int32), ("live_bytes", _u64), ("peak_bytes", _u64),
                ("blocks", _u64), ("unused_bytes", _u64)]


class _HolderV1(ctypes.Structure):
    """tm_holder_v1_t: what tm_holders writes, and all a library without tm_get_holders has."""
    _fields_ = [("name", ctypes.c_char * 64), ("place", ctypes.c_int32), ("cached", ctypes.c_int32),
                ("live_bytes", _u64), ("peak_bytes", _u64), ("blocks", _u64)]


class _Scope(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 48), ("depth", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("allocations", _u64), ("frees", _u64), ("allocated_bytes", _u64), ("freed_bytes", _u64),
                ("peak_bytes", _u64), ("live_bytes", ctypes.c_int64)]


def library_path():
    """The libtensormalloc.so to preload or load: TENSORMALLOC_LIB, else the one this package
    ships, else the release build of the source tree this module sits in; in a source tree with
    both (an editable install copies the build beside this module), the newer, so a rebuild
    with `cargo build --release` is what runs."""
    env = os.environ.get("TENSORMALLOC_LIB")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"TENSORMALLOC_LIB={env} is not a file")
        return os.path.abspath(env)
    found = [c for c in (_HERE / "libtensormalloc.so", _HERE.parent.parent / "target" / "release" / "libtensormalloc.so") if c.is_file()]
    if found:
        return str(max(found, key=lambda c: c.stat().st_mtime))
    raise FileNotFoundError("libtensormalloc.so not found: `pip install` this package, build the source tree with "
                            "`cargo build --release`, or set TENSORMALLOC_LIB to its path")


def _bind(lib):
    lib.tm_get_stats.argtypes = [ctypes.POINTER(_Stats)]
    lib.tm_trim.restype = ctypes.c_size_t
    lib.tm_version.restype = ctypes.c_char_p
    lib.tm_scope_begin.argtypes = [ctypes.c_char_p]
    if hasattr(lib, "tm_get_holders"):
        lib.tm_get_holders.argtypes = [ctypes.POINTER(_Holder), ctypes.c_size_t, ctypes.c_size_t]
        lib.tm_get_holders.restype = ctypes.c_size_t
    if hasattr(lib, "tm_holders"):
        lib.tm_holders.argtypes = [ctypes.POINTER(_HolderV1), ctypes.c_size_t]
        lib.tm_holders.restype = ctypes.c_size_t
    lib.tm_scope_end.argtypes = [ctypes.POINTER(_Scope)]
    lib.tm_scope_current.argtypes = [ctypes.POINTER(_Scope)]
    return lib


def _from_process():
    """The copy already in the process (preloaded or linked), if any."""
    try:
        lib = ctypes.CDLL(None)
        lib.tm_get_stats  # noqa: B018 - raises AttributeError when absent
    except (OSError, AttributeError):
        return None
    return _bind(lib)


_lib = None
_loaded_by = None
_resolved = False


def _get():
    """Finds the library on first use, not at import: the launcher imports this package too, and
    must not load a copy into itself (or start its trace) before it execs the command."""
    global _lib, _loaded_by, _resolved
    if not _resolved:
        _resolved = True
        _lib = _from_process()
        _loaded_by = "preload" if _lib is not None else None
        if _lib is None and os.environ.get("TENSORMALLOC_LIB"):
            try:
                _lib = _bind(ctypes.CDLL(library_path()))
                _loaded_by = "path"
            except (OSError, AttributeError) as e:
                warnings.warn(f"tensormalloc: TENSORMALLOC_LIB could not be loaded ({e}); the module is inert",
                              stacklevel=3)
    return _lib


def load():
    """The library in this process: the preloaded copy, else `library_path()` loaded now (by
    path, without LD_PRELOAD: it then serves only what tensormalloc's hooks hand it). Returns the
    ctypes handle; raises FileNotFoundError or OSError when there is none to load."""
    global _lib, _loaded_by
    if _get() is None:
        _lib = _bind(ctypes.CDLL(library_path()))
        _loaded_by = "path"
    return _lib


def loaded():
    """True when the library is in this process."""
    return _get() is not None


def loaded_by():
    """"preload" (LD_PRELOAD or linked: every large malloc is ours), "path" (loaded by path
    without the preload: only what tensormalloc's numpy/torch/cupy/numba hooks hand it), or None."""
    _get()
    return _loaded_by


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def loaded_path():
    """The file of the copy in this process (what PyTorch's pluggable allocator must open so
    that it shares our pool rather than load a second copy), or None."""
    lib = _get()
    if lib is None:
        return None
    info = _DlInfo()
    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if not dladdr(ctypes.cast(lib.tm_get_stats, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname))


def version():
    lib = _get()
    return lib.tm_version().decode() if lib else None


STATS_FIELDS = tuple(name for name, _ in _Stats._fields_ if name != "size")
_warned_path_zeros = False
_warned_not_loaded = False
NOT_LOADED = ("tensormalloc: the library is not loaded in this process, so stats() and scope() count nothing "
              "(all zeros); run the program under it (`tensormalloc python script.py`, i.e. LD_PRELOAD), or call "
              "tensormalloc.numpy.enable() (or tensormalloc.load()) to have numpy's arrays served and counted")


def _warn_not_loaded():
    """Once per process: figures of zero from an absent library must not read as 'nothing allocated'."""
    global _warned_not_loaded
    if not _warned_not_loaded:
        _warned_not_loaded = True
        warnings.warn(NOT_LOADED, RuntimeWarning, stacklevel=3)


def stats():
    """Every counter of tm_stats_t as a dict; the same keys, all zero (and one warning per
    process), when the library is not loaded (see `loaded()`)."""
    lib = _get()
    if not lib:
        _warn_not_loaded()
        return dict.fromkeys(STATS_FIELDS, 0)
    s = _Stats(size=ctypes.sizeof(_Stats))
    lib.tm_get_stats(ctypes.byref(s))
    out = {name: getattr(s, name) for name in STATS_FIELDS}
    global _warned_path_zeros
    if _loaded_by == "path" and out["host_requests"] == 0 and out["cuda_requests"] == 0 and not _warned_path_zeros:
        _warned_path_zeros = True
        if not s.enabled:
            warnings.warn("tensormalloc is disabled (TENSORMALLOC_DISABLE=1, or set_enabled(False)): it hands every "
                          "request on, and its figures stay zero", stacklevel=2)
        else:
            warnings.warn("tensormalloc was loaded by path, without LD_PRELOAD: its figures count only the large "
                          "requests tensormalloc.numpy.enable() (or .torch/.cupy/.numba) hands it (from "
                          "TENSORMALLOC_THRESHOLD up), and there has been none yet; run under `tensormalloc python ...` "
                          "to count every large allocation", stacklevel=2)
    return out


def holders():
    """Who holds the memory: one dict per holder and place, biggest first, for every large host
    block, CUDA block and pinned block: `holder` (the shared object whose code asked, e.g.
    "_multiarray_umath.cpython-311-x86_64-linux-gnu.so", or a hook's library: "numpy", "torch",
    "cupy", "numba"), `place` ("host", "pinned" or "cuda:N"), `live_bytes` (what was asked
    for), `peak_bytes`, `blocks`, `unused_bytes` (handed out beside what was asked: live plus
    unused add up to the stats' live bytes), and `cached` (True for the rows of what
    tensormalloc keeps cached in that place).
    Empty when the library is not loaded."""
    lib = _get()
    if not lib:
        _warn_not_loaded()
        return []
    sized = hasattr(lib, "tm_get_holders")
    capacity = 64
    while True:
        rows = ((_Holder if sized else _HolderV1) * capacity)()
        n = lib.tm_get_holders(rows, capacity, ctypes.sizeof(_Holder)) if sized else lib.tm_holders(rows, capacity)
        if n <= capacity:
            break
        capacity = n
    place = lambda p: "host" if p == -1 else "pinned" if p == -2 else f"cuda:{p}"
    return [{"holder": r.name.decode(errors="replace"), "place": place(r.place), "live_bytes": r.live_bytes,
             "peak_bytes": r.peak_bytes, "blocks": r.blocks, "unused_bytes": getattr(r, "unused_bytes", 0),
             "cached": bool(r.cached)} for r in rows[:n]]


def trim():
    """Gives every cached block back now; returns the bytes released."""
    lib = _get()
    return lib.tm_trim() if lib else 0


def set_enabled(on):
    """Turns caching on or off; returns the previous setting."""
    lib = _get()
    return bool(lib.tm_set_enabled(1 if on else 0)) if lib else False


def snapshot(path):
    """Writes a memory snapshot in PyTorch's format to `path` (read it with `python -m
    torch.cuda._memory_viz stats PATH`, or drop it on pytorch.org/memory_viz): the device pools'
    segments and blocks, the library and function holding each block, and the recent
    allocations and frees. Host memory (large and pinned blocks) goes to `path + ".host.pickle"`.
    Returns the two paths; raises OSError when a file cannot be written, RuntimeError when the
    library is not loaded."""
    lib = _get()
    if lib is None:
        raise RuntimeError(NOT_LOADED)
    fn = lib.tm_snapshot
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = ctypes.c_int
    path = os.fspath(path)
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        raise ValueError("embedded null byte")  # as open() says; C would cut the path there
    rc = fn(encoded)
    if rc != 0:
        raise OSError(-rc, os.strerror(-rc), path)
    written = _with_pid(encoded, os.getpid())
    written = os.fsdecode(written) if isinstance(path, str) else written
    return written, written + (".host.pickle" if isinstance(path, str) else b".host.pickle")


def _with_pid(path, pid):
    """`path` (bytes) as the library names the file: %p the process id, %% a percent sign, any
    other % kept (src/sys/files.rs expand_with)."""
    out, i = bytearray(), 0
    while i < len(path):
        pair = path[i:i + 2]
        if pair == b"%p":
            out += str(pid).encode()
            i += 2
        elif pair == b"%%":
            out += b"%"
            i += 2
        else:
            out.append(path[i])
            i += 1
    return bytes(out)


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
    """`with tensormalloc.scope("name") as s:` counts this thread's large and CUDA allocations
    (nothing, and one warning per process, when the library is not loaded)."""

    def __init__(self, name):
        # Checked whether the library is loaded or not: a program is right or wrong either way.
        if not isinstance(name, str):
            raise TypeError(f"tensormalloc.scope: the name must be a str, not {type(name).__name__}")
        if "\0" in name:
            raise ValueError("tensormalloc.scope: the name contains a NUL character")
        self.result = ScopeResult(name)
        self._lib = None

    def __enter__(self):
        self._lib = _get()  # the copy that opened the scope closes it, even if load() runs inside
        if self._lib is None:
            _warn_not_loaded()
        else:
            if self._lib.tm_scope_begin(self.result.name.encode()[:47]) < 0:
                raise RuntimeError("tensormalloc: no scope opened: at most 16 nest in a thread (or no memory was left for its first)")
        return self.result

    def __exit__(self, *exc):
        if self._lib is not None:
            raw = _Scope()
            self._lib.tm_scope_end(ctypes.byref(raw))
            self.result._fill(raw)
        return False
