"""Builds the CUDA simulators (c/fakecuda.c: a stand-in driver libcuda.so.1; c/fakecudart.c: a
stand-in runtime libcudart.so.12 over it, and its -DPLT_CALLS variant whose entry points call one
another through the PLT) and compiles scenario programs against them. Not NVIDIA's libraries:
each source's first line says it is a simulator."""
import subprocess

from conftest import BUILD, C_DIR, ROOT

CFLAGS = ["gcc", "-std=c11", "-O1", "-g", "-Wall", "-shared", "-fPIC"]


def _build(out, src, soname, extra=()):
    lib = out / soname
    if not lib.exists() or lib.stat().st_mtime < src.stat().st_mtime:
        tmp = out / f".{soname}.tmp"  # concurrent sessions never see a half-written library
        subprocess.run([*CFLAGS, f"-Wl,-soname,{soname}", "-o", str(tmp), str(src), "-pthread", "-ldl", *extra], check=True)
        tmp.replace(lib)
    link = out / (soname.split(".so")[0] + ".so")  # libcuda.so, libcudart.so: for -lcuda, -lcudart
    if not link.is_symlink():
        link.unlink(missing_ok=True)
        link.symlink_to(soname)
    return lib


def fake_cuda(plt_calls=False):
    """The directory holding libcuda.so.1 and libcudart.so.12 (the PLT_CALLS runtime when asked);
    rebuilt when a source is newer. Both variants carry their own copy of the driver, so a program
    linked with one rpath finds both libraries in the same directory."""
    out = BUILD / ("fakecuda-plt" if plt_calls else "fakecuda")
    out.mkdir(parents=True, exist_ok=True)
    _build(out, C_DIR / "fakecuda.c", "libcuda.so.1")
    _build(out, C_DIR / "fakecudart.c", "libcudart.so.12", ["-DPLT_CALLS"] if plt_calls else [])
    return out


def cuda_program(name="cuda_pool", plt_calls=False):
    """Compiles preload-tests/c/NAME.c against the simulators (-lcudart -lcuda, rpath to them);
    returns the binary's path. The PLT variant's binary has its own name (its rpath differs)."""
    lib = fake_cuda(plt_calls)
    out = BUILD / (f"{name}-plt" if plt_calls else name)
    src = C_DIR / f"{name}.c"
    deps = [src, C_DIR / "check.h", ROOT / "include" / "tensormalloc.h", lib / "libcuda.so.1", lib / "libcudart.so.12"]
    if not out.exists() or out.stat().st_mtime < max(d.stat().st_mtime for d in deps):
        tmp = out.with_name(f".{out.name}.tmp")
        cmd = ["gcc", "-O1", "-g", "-Wall", "-Wno-alloc-size-larger-than", "-fno-builtin", "-pthread", "-o", str(tmp), str(src),
               "-ldl", f"-L{lib}", "-lcudart", "-lcuda", f"-Wl,-rpath,{lib}"]
        subprocess.run(cmd, check=True)
        tmp.replace(out)
    return str(out)


def cuda_plugin(name="cuda_plugin"):
    """Compiles preload-tests/c/NAME.c as a shared library linked with -lcuda (the stand-in, found
    by its rpath), for a program to dlopen; returns its path."""
    lib = fake_cuda()
    out = BUILD / f"lib{name}.so"
    src = C_DIR / f"{name}.c"
    if not out.exists() or out.stat().st_mtime < max(src.stat().st_mtime, (lib / "libcuda.so.1").stat().st_mtime):
        tmp = out.with_name(f".{out.name}.tmp")
        subprocess.run([*CFLAGS, "-o", str(tmp), str(src), f"-L{lib}", "-lcuda", f"-Wl,-rpath,{lib}"], check=True)
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
