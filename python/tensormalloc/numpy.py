"""numpy without LD_PRELOAD: a NEP 49 data-memory handler named "tensormalloc" whose malloc,
calloc, realloc and free are the library's host layer (large arrays from its cache).

    import tensormalloc.numpy
    tensormalloc.numpy.enable()            # this thread / context from now on
    with tensormalloc.numpy.handler():     # or only inside a block
        ...

numpy's rules hold: the handler is a context variable (each thread starts with numpy's default;
asyncio tasks inherit it), and every array keeps the handler it was made with, so arrays made
before `enable()` are freed by numpy's allocator after it, and ours by ours after `disable()`.
Under LD_PRELOAD the handler reaches the preloaded copy: one cache serves both. numpy 1.22+.
"""
import contextlib
import contextvars
import ctypes

import tensormalloc

NAME = "tensormalloc"
# Slots of numpy's C-API table (numpy/__multiarray_api.h, the same in 1.22 to 2.x).
_SET_HANDLER = 304
_DEFAULT_HANDLER = 306

_api = None
_capsule = None
# The handler enable() replaced, per context, for disable() to put back.
_previous = contextvars.ContextVar("tensormalloc_numpy_previous", default=None)


def _numpy_api():
    """numpy's C-API table (the `_ARRAY_API` capsule's pointer) and get_handler_name."""
    global _api
    if _api is None:
        from ._cuda import require
        numpy = require("numpy", "numpy")
        major, minor = (int(x) for x in numpy.__version__.split(".")[:2])
        if (major, minor) < (1, 22):
            raise RuntimeError(f"tensormalloc.numpy needs numpy 1.22 or later (NEP 49); this is {numpy.__version__}")
        try:
            from numpy._core import multiarray
        except ImportError:  # numpy 1.x
            from numpy.core import multiarray
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        table = get_pointer(multiarray._ARRAY_API, None)
        slots = ctypes.cast(table, ctypes.POINTER(ctypes.c_void_p))
        # PYFUNCTYPE: called with the GIL held, a Python error raised as one; the result is a
        # new reference, which ctypes takes over.
        set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(slots[_SET_HANDLER])
        default = ctypes.cast(slots[_DEFAULT_HANDLER], ctypes.POINTER(ctypes.py_object)).contents.value
        _api = (set_handler, default, multiarray.get_handler_name)
    return _api


def _handler():
    """The "mem_handler" capsule over the library's static tm_numpy_handler (made once)."""
    global _capsule
    if _capsule is None:
        lib = tensormalloc.load()
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        handler = ctypes.addressof(ctypes.c_char.in_dll(lib, "tm_numpy_handler"))
        name = ctypes.addressof(ctypes.c_char.in_dll(lib, "tm_numpy_capsule_name"))
        _capsule = new(handler, name, None)
    return _capsule


def handler_name(array=None):
    """The name of the handler new arrays get here (or that `array` was made with)."""
    return _numpy_api()[2](array) if array is not None else _numpy_api()[2]()


def enabled():
    """True when new arrays in this context get the tensormalloc handler."""
    return handler_name() == NAME


def enable():
    """New arrays in this thread/context come from tensormalloc's cache. Loads the library by
    path if it is not preloaded (`tensormalloc.library_path()`). Idempotent."""
    set_handler = _numpy_api()[0]
    ours = _handler()
    if enabled():
        return
    _previous.set(set_handler(ours))


def disable():
    """Puts back the handler enable() replaced here (numpy's default_allocator, unless another
    was set before). Arrays made meanwhile keep ours and are still freed by it."""
    set_handler, default, _ = _numpy_api()
    if not enabled():
        return
    previous = _previous.get()
    set_handler(previous if previous is not None else default)
    _previous.set(None)


@contextlib.contextmanager
def handler():
    """`with tensormalloc.numpy.handler():` arrays made inside come from tensormalloc's cache."""
    set_handler = _numpy_api()[0]
    previous = set_handler(_handler())
    try:
        yield
    finally:
        set_handler(previous)
