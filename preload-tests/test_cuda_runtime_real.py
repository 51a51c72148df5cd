"""Issue 18: NVIDIA's own libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel, fetched with pip by
the fixture; skipped only when the registry cannot be reached) over the stand-in driver
(c/fakecuda.c, a simulator). Its first call makes its real lookup sequence (an empty-name probe,
cuInit, cuGetProcAddress at 11030 and 12000, then hundreds of entry points with versions and
flags). Under the preload, in every mode, it makes the same lookups as without us, and each one
gets either the driver's own function or our wrapper for the very export that name means at
that version and those flags (c/cudart_real.c asks again through the runtime's own path); the
same when 16 threads make the process's first runtime and driver calls at once, so that the
runtime's lookups run while our binding of the driver is in progress."""
import re

import pytest

from conftest import LIB, ok, run
from cudasim import real_runtime_program
from test_cuda_correct import MODES, POOLED

# cuda.h: the exported name a base name means at a version (the _v2 of each, since).
SINCE = {"cuMemAlloc": 3020, "cuMemAllocPitch": 3020, "cuMemFree": 3020, "cuMemGetInfo": 3020,
         "cuMemAllocHost": 3020, "cuMemGetAddressRange": 3020, "cuMemHostGetDevicePointer": 3020, "cuCtxDestroy": 4000, "cuStreamDestroy": 4000,
         "cuDevicePrimaryCtxReset": 11000, "cuDevicePrimaryCtxRelease": 11000, "cuGetProcAddress": 12000,
         "cuIpcOpenMemHandle": 11000, "cuStreamBeginCapture": 10010}
# flags 2: the _ptsz export (after the _v2 where both apply).
PER_THREAD = {"cuMemAllocAsync", "cuMemFreeAsync", "cuStreamBeginCapture", "cuStreamEndCapture", "cuStreamBeginCaptureToGraph"}
# What the pool serves, by exported name (where the stand-in exports it too).
SERVED = {"cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemHostAlloc",
          "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemHostGetDevicePointer_v2", "cuMemHostGetFlags", "cuMemAllocAsync", "cuMemAllocManaged", "cuMemCreate",
          "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease",
          "cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset", "cuCtxDestroy_v2", "cuCtxDestroy",
          "cuStreamDestroy_v2", "cuStreamDestroy", "cuIpcGetMemHandle", "cuMemGetAddressRange_v2", "cuPointerGetAttribute", "cuPointerGetAttributes",
          "cuGetProcAddress", "cuGetProcAddress_v2", "cuCtxEnablePeerAccess", "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2",
          "cuIpcCloseMemHandle", "cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2",
          "cuStreamBeginCapture_v2_ptsz", "cuStreamEndCapture", "cuStreamEndCapture_ptsz"}
LOOKUP = re.compile(r"lookup (\S+) (\d+) (\d+) (-?\d+) (driver|ours) (\S+) (\S+)")


def exported(name, version, flags):
    if name in SINCE and version >= SINCE[name]:
        name = f"{name}_v2"
    if name.removesuffix("_v2") in PER_THREAD and flags & 2:
        name = f"{name}_ptsz"
    return name


@pytest.fixture(scope="module")
def program():
    path, why = real_runtime_program()
    if path is None:
        pytest.skip(f"NVIDIA's runtime is not available: {why}")
    return path


def lookups(out):
    found = [LOOKUP.fullmatch(line).groups() for line in out.stdout.splitlines() if line.startswith("lookup ")]
    rc = [line for line in out.stdout.splitlines() if "rc " in line and not line.startswith("lookup ")]
    return rc, found


@pytest.fixture(scope="module", params=["one", "threads"])
def alone(program, request):
    argv = [program] + ([request.param] if request.param == "threads" else [])
    rc, found = lookups(ok(run(argv, preload=False)))
    assert len(found) > 400, "the runtime's lookup sequence"
    assert all(verdict == "driver" for *_, verdict, _, _ in found)
    assert "-1000" not in " ".join(rc)
    return argv, rc, found


@pytest.mark.parametrize("mode", MODES)
def test_lookups_under_the_preload(alone, mode):
    argv, alone_rc, alone_found = alone
    rc, found = lookups(ok(run(argv, env=MODES[mode])))
    assert rc == alone_rc, "the first calls answer as without us, on every thread"
    assert [f[:4] for f in found] == [f[:4] for f in alone_found], "the same names, versions, flags and answers"
    for name, version, flags, _, verdict, symbol, obj in found:
        want = exported(name, int(version), int(flags))
        if mode in POOLED and want in SERVED:
            assert verdict == "ours" and symbol == want and obj == str(LIB), (name, version, flags, verdict, symbol, obj)
        else:
            assert verdict == "driver", (name, version, flags, verdict, symbol, obj)
