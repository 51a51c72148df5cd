"""Builds the CUDA simulators and compiles scenario programs against them: c/fakecuda.c (with
c/fakecuda_runtime.c and c/fakecuda_private.c), a stand-in driver libcuda.so.1 that NVIDIA's real
runtime also runs on; c/fakecudart.c, a stand-in runtime libcudart.so.12 over it, and its
-DPLT_CALLS variant whose entry points call one another through the PLT; c/fakenvml.c, a
stand-in libnvidia-ml.so.1. Not NVIDIA's libraries: each source's first line says it is a
simulator."""
import subprocess
import sys
import zipfile

from conftest import BUILD, C_DIR, ROOT, run

CFLAGS = ["gcc", "-std=c11", "-O1", "-g", "-Wall", "-shared", "-fPIC"]


def _build(out, src, soname, extra=(), includes=()):
    lib = out / soname
    if not lib.exists() or lib.stat().st_mtime < max(s.stat().st_mtime for s in (src, *includes)):
        tmp = out / f".{soname}.tmp"  # concurrent sessions never see a half-written library
        subprocess.run([*CFLAGS, f"-Wl,-soname,{soname}", "-o", str(tmp), str(src), "-pthread", "-ldl", *extra], check=True)
        tmp.replace(lib)
    link = out / (soname.split(".so")[0] + ".so")  # libcuda.so, libcudart.so: for -lcuda, -lcudart
    if not link.is_symlink():
        link.unlink(missing_ok=True)
        link.symlink_to(soname)
    return lib


def fake_cuda(plt_calls=False):
    """The directory holding libcuda.so.1, libcudart.so.12 (the PLT_CALLS runtime when asked) and
    libnvidia-ml.so.1; rebuilt when a source is newer. Both variants carry their own copy of the
    driver, so a program linked with one rpath finds both libraries in the same directory."""
    out = BUILD / ("fakecuda-plt" if plt_calls else "fakecuda")
    out.mkdir(parents=True, exist_ok=True)
    _build(out, C_DIR / "fakecuda.c", "libcuda.so.1", includes=[C_DIR / "fakecuda_runtime.c", C_DIR / "fakecuda_private.c"])
    _build(out, C_DIR / "fakenvml.c", "libnvidia-ml.so.1")
    _build(out, C_DIR / "fakecudart.c", "libcudart.so.12", ["-DPLT_CALLS"] if plt_calls else [])
    return out


def cuda_program(name="cuda_pool", plt_calls=False):
    """Compiles preload-tests/c/NAME.c against the simulators (-lcudart -lcuda, rpath to them);
    returns the binary's path. The PLT variant's binary has its own name (its rpath differs)."""
    lib = fake_cuda(plt_calls)
    out = BUILD / (f"{name}-plt" if plt_calls else name)
    src = C_DIR / f"{name}.c"
    deps = [src, C_DIR / "check.h", C_DIR / "standin.h", C_DIR / "cuda_vmm.h", ROOT / "include" / "tensormalloc.h", lib / "libcuda.so.1", lib / "libcudart.so.12"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        cmd = ["gcc", "-O1", "-g", "-Wall", "-Wno-alloc-size-larger-than", "-fno-builtin", "-pthread", "-o", str(tmp), str(src),
               "-ldl", f"-L{lib}", "-lcudart", "-lcuda", f"-Wl,-rpath,{lib}"]
        subprocess.run(cmd, check=True)
        tmp.replace(out)
    return str(out)


def gpu_program_over_standins(name):
    """Compiles preload-tests/gpu/NAME.c, a program scripts/gpu-check builds with nvcc for a real
    GPU, with -DSTANDIN against the simulators instead (its own declarations, the simulator's
    memset "kernel" as the work); returns the binary's path."""
    lib = fake_cuda()
    out = BUILD / f"gpu-{name}"
    src = ROOT / "preload-tests" / "gpu" / f"{name}.c"
    deps = [src, lib / "libcuda.so.1", lib / "libcudart.so.12"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        cmd = ["gcc", "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-DSTANDIN", "-pthread", "-o", str(tmp), str(src),
               f"-L{lib}", "-lcudart", "-lcuda", f"-Wl,-rpath,{lib}"]
        subprocess.run(cmd, check=True)
        tmp.replace(out)
    return str(out)


def cuda_plugin(name="cuda_plugin", runtime=False):
    """Compiles preload-tests/c/NAME.c as a shared library linked with -lcuda (and -lcudart when
    asked: the stand-ins, found by its rpath), for a program to dlopen; returns its path."""
    lib = fake_cuda()
    out = BUILD / f"lib{name}.so"
    src = C_DIR / f"{name}.c"
    if not out.exists() or out.stat().st_mtime < max(src.stat().st_mtime, (lib / "libcuda.so.1").stat().st_mtime):
        tmp = out.with_name(f".{out.name}.tmp")
        links = ["-lcudart", "-lcuda"] if runtime else ["-lcuda"]
        subprocess.run([*CFLAGS, "-o", str(tmp), str(src), f"-L{lib}", *links, f"-Wl,-rpath,{lib}"], check=True)
        tmp.replace(out)
    return str(out)


def unlinked_program(name):
    """Compiles preload-tests/c/NAME.c without linking the simulators (it dlopens libcuda.so.1
    when it chooses, found by the rpath); returns the binary's path."""
    lib = fake_cuda()
    out = BUILD / name
    src = C_DIR / f"{name}.c"
    deps = [src, C_DIR / "check.h", lib / "libcuda.so.1"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        cmd = ["gcc", "-O1", "-g", "-Wall", "-fno-builtin", "-pthread", "-o", str(tmp), str(src), "-ldl", f"-Wl,-rpath,{lib}"]
        subprocess.run(cmd, check=True)
        tmp.replace(out)
    return str(out)


def static_runtime_program():
    """c/static_runtime.c with the stand-in runtime compiled into the executable, as nvcc links
    libcudart_static.a by default; it finds the stand-in driver by its rpath."""
    lib = fake_cuda()
    out = BUILD / "static_runtime"
    srcs = [C_DIR / "static_runtime.c", C_DIR / "fakecudart.c"]
    deps = [*srcs, C_DIR / "check.h", lib / "libcuda.so.1"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        cmd = ["gcc", "-std=gnu11", "-O1", "-g", "-Wall", "-pthread", "-o", str(tmp), *map(str, srcs), "-ldl", f"-Wl,-rpath,{lib}"]
        subprocess.run(cmd, check=True)
        tmp.replace(out)
    return str(out)


# NVIDIA's runtime as the Python registry ships it (NOTES.md: its lookup sequence over a stand-in).
REAL_RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"


def real_runtime_program():
    """c/cudart_real.c linked with NVIDIA's libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel
    (downloaded once with pip into target/preload-tests/wheels), beside the stand-in libcuda.so.1
    in one directory the binary's rpath names. Returns the binary's path, or None with the reason
    when the registry cannot be reached."""
    lib = fake_cuda()
    real = BUILD / "nvidia-cudart"
    runtime = real / "libcudart.so.12"
    if not runtime.exists():
        wheels = BUILD / "wheels"
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), REAL_RUNTIME],
                             capture_output=True, text=True, timeout=600)
        found = sorted(wheels.glob("nvidia_cuda_runtime_cu12-*.whl"))
        if got.returncode != 0 or not found:
            return None, f"pip download {REAL_RUNTIME} failed: {(got.stderr or got.stdout).strip()[-300:]}"
        real.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(found[-1]) as z:
            tmp = real / ".libcudart.so.12.tmp"
            tmp.write_bytes(z.read("nvidia/cuda_runtime/lib/libcudart.so.12"))
            tmp.replace(runtime)
    driver = real / "libcuda.so.1"
    if not driver.is_symlink():
        driver.unlink(missing_ok=True)
        driver.symlink_to(lib / "libcuda.so.1")
    out = BUILD / "cudart_real"
    src = C_DIR / "cudart_real.c"
    deps = [src, C_DIR / "check.h", runtime, lib / "libcuda.so.1"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        cmd = ["gcc", "-O1", "-g", "-Wall", "-pthread", "-o", str(tmp), str(src), "-ldl", f"-L{real}", "-l:libcudart.so.12",
               f"-L{lib}", "-lcuda", "-Wl,--disable-new-dtags", f"-Wl,-rpath,{real}"]
        subprocess.run(cmd, check=True)
        tmp.replace(out)
    return str(out), None


def runtime13_program(name):
    """Compiles preload-tests/c/NAME.c against NVIDIA's libcudart.so.13 from .venv-torch's nvidia
    wheels (scripts/setup installs them with PyTorch) beside the stand-in libcuda.so.1, in one
    directory the binary's rpath names. Returns the binary's path, or None with the reason when
    .venv-torch has no such runtime."""
    found = sorted((ROOT / ".venv-torch").glob("lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so.13"))
    if not found:
        return None, "no libcudart.so.13 in .venv-torch (scripts/setup installs it with PyTorch where the registry is reachable)"
    lib = fake_cuda()
    real = BUILD / "nvidia-cudart13"
    real.mkdir(parents=True, exist_ok=True)
    for link, target in (("libcudart.so.13", found[-1]), ("libcuda.so.1", lib / "libcuda.so.1")):
        if not (real / link).is_symlink():
            (real / link).unlink(missing_ok=True)
            (real / link).symlink_to(target)
    out = BUILD / f"{name}-cudart13"
    src = C_DIR / f"{name}.c"
    deps = [src, C_DIR / "check.h", found[-1], lib / "libcuda.so.1"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        cmd = ["gcc", "-O1", "-g", "-Wall", "-fno-builtin", "-pthread", "-o", str(tmp), str(src), "-ldl", f"-L{real}",
               "-l:libcudart.so.13", "-l:libcuda.so.1", "-Wl,--disable-new-dtags", f"-Wl,-rpath,{real}"]
        subprocess.run(cmd, check=True)
        tmp.replace(out)
    return str(out), None


def run_scenario(program, name, env=None, preload=True, stats=None, plt_calls=False):
    """Runs one scenario of a stand-in CUDA program (`PROGRAM NAME`), with the JSON report
    written to `stats` when given."""
    env = dict(env or {})
    if stats:
        env["TENSORMALLOC_STATS"] = f"json:{stats}"
    return run([cuda_program(program, plt_calls=plt_calls), name], env=env, preload=preload, timeout=120)
