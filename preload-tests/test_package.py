"""The package as a new user gets it: a wheel built by pip from this checkout (copied to a temp
dir, so the repository stays clean), installed in a fresh venv on a PATH without Rust; its
console command, numpy's handler without LD_PRELOAD, the GPU modules without GPU libraries; and
the C install (scripts/install --prefix) that a C program finds with pkg-config. Needs PyPI."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import C_DIR, ROOT, ok

HERE = Path(__file__).resolve().parent


def clean_env(**extra):
    """The environment of a new user: no preload, no tensormalloc settings, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TENSORMALLOC_") and k not in ("LD_PRELOAD", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def sh(argv, **kw):
    kw.setdefault("env", clean_env())
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)


def git_status():
    return sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=all"]).stdout


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    """Builds the wheel from a copy of the checkout and installs it with its numpy extra in a fresh venv."""
    tmp = tmp_path_factory.mktemp("package")
    before = git_status()
    src = tmp / "src"
    files = sh(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"]).stdout.split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    # cargo's own directory inside target/: incremental across runs, apart from target/release.
    build_env = clean_env(CARGO_TARGET_DIR=str(ROOT / "target" / "package"))
    venv = tmp / "venv"
    ok(sh([Path(sys.base_prefix) / "bin" / "python3", "-m", "venv", venv]))  # the interpreter .venv was made from
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels = tmp / "wheels"
    ok(sh([*pip, "wheel", "--no-deps", "-w", wheels, src], env=build_env, timeout=600))
    (wheel,) = wheels.glob("tensormalloc-*.whl")
    # Installed where there is no Rust: the wheel must carry everything.
    no_rust = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                              if not (Path(d) / "cargo").exists() and not (Path(d) / "rustc").exists())
    ok(sh([*pip, "install", f"{wheel}[numpy]"], env=clean_env(PATH=no_rust), timeout=600))  # the extra brings numpy
    return {"tmp": tmp, "venv": venv, "py": venv / "bin" / "python", "wheel": wheel,
            "env": clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{no_rust}"), "status_before": before}


def py(pkg, code, **kw):
    """Runs code with the venv's python, outside the source tree."""
    return sh([pkg["py"], "-c", code], cwd=pkg["tmp"], env=kw.pop("env", pkg["env"]), **kw)


def test_wheel_is_tagged_for_the_platform_and_ships_the_library(pkg):
    name = pkg["wheel"].name
    assert name.endswith(".whl") and "-py3-none-" in name and "linux" in name, name
    with zipfile.ZipFile(pkg["wheel"]) as z:
        assert "tensormalloc/libtensormalloc.so" in z.namelist()
    assert git_status() == pkg["status_before"], "building the package left files in the repository"


def test_library_path_is_the_shipped_library(pkg):
    out = ok(py(pkg, "import tensormalloc; print(tensormalloc.library_path()); print(tensormalloc.loaded())"))
    path, loaded = out.stdout.split()
    assert path.startswith(str(pkg["venv"])) and path.endswith("tensormalloc/libtensormalloc.so")
    assert loaded == "False"


def test_console_command_preloads_and_passes_the_exit_status_on(pkg):
    code = "import sys, tensormalloc as t; print(t.loaded_by(), t.loaded_path() == t.library_path()); sys.exit(7)"
    for launcher in ([pkg["venv"] / "bin" / "tensormalloc"], [pkg["py"], "-m", "tensormalloc"]):
        out = sh([*launcher, "python", "-c", code], cwd=pkg["tmp"], env=pkg["env"])
        assert out.returncode == 7, out
        assert out.stdout.split() == ["preload", "True"], out
        assert out.stderr == "", out
    assert sh([pkg["venv"] / "bin" / "tensormalloc", "no-such-command-xyz"], env=pkg["env"]).returncode == 127
    assert sh([pkg["venv"] / "bin" / "tensormalloc"], env=pkg["env"]).returncode == 2
    # TENSORMALLOC_LIB is the tools' variable: the library knows it and says nothing.
    lib = ok(py(pkg, "import tensormalloc; print(tensormalloc.library_path())")).stdout.strip()
    out = sh([pkg["venv"] / "bin" / "tensormalloc", "true"], env={**pkg["env"], "TENSORMALLOC_LIB": lib})
    assert out.returncode == 0 and out.stderr == "", out


def test_extra_brings_numpy_and_the_hooks_are_attributes(pkg):
    code = ("import sys, tensormalloc; assert 'numpy' not in sys.modules; tensormalloc.numpy.enable(); "
            "import numpy; print(tensormalloc.numpy.handler_name(numpy.ones(8_000_000)))")
    assert ok(py(pkg, code)).stdout.split() == ["tensormalloc"]
    meta = ok(py(pkg, "from importlib.metadata import metadata; print(metadata('tensormalloc').get_all('Provides-Extra'))"))
    assert "numpy" in meta.stdout and "plot" in meta.stdout, meta.stdout


def test_help_and_plot_ship_in_the_package(pkg, tmp_path):
    out = ok(sh([pkg["venv"] / "bin" / "tensormalloc", "--help"], env=pkg["env"]))
    assert "  TENSORMALLOC_THRESHOLD=128K\n" in out.stdout and "tensormalloc plot TRACE" in out.stdout, out.stdout
    trace = tmp_path / "trace.bin"
    code = "import numpy as np\nkept = [np.ones(4_000_000) for _ in range(3)]\n"
    ok(sh([pkg["venv"] / "bin" / "tensormalloc", "python", "-c", code], cwd=pkg["tmp"],
          env={**pkg["env"], "TENSORMALLOC_TRACE": str(trace)}))
    # The venv has no matplotlib (the `plot` extra brings it): the summary, then what to install.
    out = sh([pkg["venv"] / "bin" / "tensormalloc", "plot", trace, tmp_path / "t.png"], env=pkg["env"])
    assert out.returncode == 1 and "allocs=" in out.stdout and "pip install matplotlib" in out.stderr, out


NUMPY_HANDLER = r"""
import hashlib, resource, threading
import numpy as np
import tensormalloc, tensormalloc.numpy as tn

def seed(a, b, n=20):
    for _ in range(3):                  # warm up: the first evaluations fault under every allocator
        c = (a * b) ** 2 + 3
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    digests = set()
    for _ in range(n):
        c = (a * b) ** 2 + 3
        digests.add(hashlib.sha256(c.data).hexdigest())   # c.data: no copy (tobytes would fault in a Python bytes object)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n, digests, tn.handler_name(c)

rng = np.random.default_rng(42)
a, b = rng.random(10_000_000), rng.random(10_000_000)
assert tn.handler_name() == "default_allocator" and not tensormalloc.loaded()
default_faults, default_digests, default_name = seed(a, b)
before = np.full(10_000_000, 1.5)       # made by numpy's allocator, freed after enable()
tn.enable()
tn.enable()                              # idempotent
assert tn.handler_name() == "tensormalloc" and tensormalloc.loaded_by() == "path"
other = []
t = threading.Thread(target=lambda: other.append(tn.handler_name()))
t.start(); t.join()
assert other == ["default_allocator"], other   # numpy's handler is per context: new threads start with the default
faults, digests, name = seed(a, b)
assert (default_name, name) == ("default_allocator", "tensormalloc")
assert digests == default_digests and len(digests) == 1
assert tn.handler_name(before) == "default_allocator"
del before
during = np.full(10_000_000, 2.5)        # ours, freed after disable()
z = np.zeros(10_000_000)
assert not z.any()                       # calloc from a cache that held dirty blocks
s0 = tensormalloc.stats()
tn.disable()
assert tn.handler_name() == "default_allocator" and tn.handler_name(during) == "tensormalloc"
assert during.sum() == 2.5 * 10_000_000
del during, z
s1 = tensormalloc.stats()
assert s1["host_frees"] == s0["host_frees"] + 2 and s1["host_live_bytes"] < s0["host_live_bytes"], (s0, s1)
x = np.ones(10_000_000)                  # numpy's again: not counted by us
assert tn.handler_name(x) == "default_allocator" and tensormalloc.stats()["host_requests"] == s1["host_requests"]
with tn.handler():
    y = np.arange(3_000_000.0)
    y.resize(6_000_000, refcheck=False)  # realloc through the handler
    assert tn.handler_name(y) == "tensormalloc" and y[2_999_999] == 2_999_999.0 and not y[3_000_000:].any()
assert tn.handler_name() == "default_allocator"
print(default_faults, faults)
"""


def test_numpy_handler_without_preload(pkg):
    out = ok(py(pkg, NUMPY_HANDLER, timeout=240))
    default_faults, faults = map(float, out.stdout.split())
    assert default_faults > 100, out.stdout   # the problem we solve is there
    assert faults < 0.05 * default_faults, out.stdout


def test_numpy_handler_under_the_preload_uses_the_preloaded_copy(pkg):
    code = r"""
import numpy as np, tensormalloc, tensormalloc.numpy as tn
tn.enable()
copies = {line.split()[-1] for line in open("/proc/self/maps") if "libtensormalloc" in line}
kept = [np.ones(8_000_000) for _ in range(3)]
print(tensormalloc.loaded_by(), len(copies), tensormalloc.stats()["host_requests"] >= 3)
"""
    out = ok(sh([pkg["venv"] / "bin" / "tensormalloc", "python", "-c", code], cwd=pkg["tmp"], env=pkg["env"]))
    assert out.stdout.split() == ["preload", "1", "True"], out


def test_stats_have_every_key_before_the_library_is_loaded_and_say_why_figures_are_zero(pkg):
    code = r"""
import warnings, tensormalloc
s = tensormalloc.stats()
assert not tensormalloc.loaded() and set(s) == set(tensormalloc.STATS_FIELDS) and not any(s.values())
tensormalloc.load()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    assert tensormalloc.stats()["host_requests"] == 0
print(tensormalloc.loaded_by(), "without LD_PRELOAD" in str(w[0].message))
"""
    assert ok(py(pkg, code)).stdout.split() == ["path", "True"]


@pytest.mark.parametrize("module,needs", [("torch", "torch"), ("cupy", "cupy"), ("numba", "numba")])
def test_gpu_modules_import_without_their_library_and_say_what_is_missing(pkg, module, needs):
    code = f"""
import tensormalloc.{module} as m
try:
    m.enable()
except ImportError as e:
    print("ImportError:", e)
"""
    out = ok(py(pkg, code))
    assert f"tensormalloc.{module}.enable() needs {needs}" in out.stdout, out


def test_c_install_found_with_pkg_config(tmp_path):
    prefix = tmp_path / "prefix"
    ok(sh([ROOT / "scripts" / "install", "--prefix", prefix], timeout=600))
    lib = prefix / "lib"
    assert os.readlink(lib / "libtensormalloc.so") == "libtensormalloc.so.0"
    assert os.readlink(lib / "libtensormalloc.so.0") == "libtensormalloc.so.0.1.0"
    assert (prefix / "include" / "tensormalloc.h").is_file()
    env = clean_env(PKG_CONFIG_PATH=str(lib / "pkgconfig"))
    flags = ok(sh(["pkg-config", "--cflags", "--libs", "tensormalloc"], env=env)).stdout.split()
    assert f"-I{prefix}/include" in flags and f"-L{lib}" in flags and "-ltensormalloc" in flags
    exe = tmp_path / "linked"
    ok(sh(["gcc", "-O1", "-fno-builtin", "-o", exe, C_DIR / "linked.c", *flags, f"-Wl,-rpath,{lib}", "-pthread"], env=env))
    needed = ok(sh(["readelf", "-d", exe])).stdout
    assert "[libtensormalloc.so.0]" in needed, needed     # the soname, not the dev symlink
    assert "linked ok" in ok(sh([exe])).stdout
    out = ok(sh([prefix / "bin" / "tensormalloc", "sh", "-c", "echo $LD_PRELOAD"]))
    assert out.stdout.strip() == f"{lib}/libtensormalloc.so"
