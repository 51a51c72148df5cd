"""The package as a new user gets it: a wheel built by pip from this checkout (copied to a temp
dir, so the repository stays clean), installed in a fresh venv on a PATH without Rust; its
console command, numpy's handler without LD_PRELOAD, the GPU modules without GPU libraries; the
C install (scripts/install --prefix) that a C program finds with pkg-config; the one
`tensormalloc` command both install (issue 37, item 5: the same subcommands and the same words
from either), also side by side in one ~/.local with `pip install --user`; and pip without Rust
saying what to install. Needs PyPI."""
import json
import os
import re
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


# PATH without the directories that hold cargo or rustc: where there is no Rust.
NO_RUST = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                          if not (Path(d) / "cargo").exists() and not (Path(d) / "rustc").exists())
CARGO_VERSION = re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)


def copy_checkout(dest):
    """The checkout's files (tracked and untracked, not ignored), as a fresh clone has them."""
    files = sh(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"]).stdout.split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    return dest


def make_venv(where, *flags):
    ok(sh([Path(sys.base_prefix) / "bin" / "python3", "-m", "venv", *flags, where]))  # the interpreter .venv was made from
    return [where / "bin" / "python", "-m", "pip", "--disable-pip-version-check", "-q"]


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    """Builds the wheel from a copy of the checkout and installs it with its numpy extra in a fresh venv."""
    tmp = tmp_path_factory.mktemp("package")
    before = git_status()
    src = copy_checkout(tmp / "src")
    # cargo's own directory inside target/: incremental across runs, apart from target/release.
    build_env = clean_env(CARGO_TARGET_DIR=str(ROOT / "target" / "package"))
    venv = tmp / "venv"
    pip = make_venv(venv)
    wheels = tmp / "wheels"
    ok(sh([*pip, "wheel", "--no-deps", "-w", wheels, src], env=build_env, timeout=600))
    (wheel,) = wheels.glob("tensormalloc-*.whl")
    # Installed where there is no Rust: the wheel must carry everything.
    ok(sh([*pip, "install", f"{wheel}[numpy]"], env=clean_env(PATH=NO_RUST), timeout=600))  # the extra brings numpy
    return {"tmp": tmp, "venv": venv, "py": venv / "bin" / "python", "wheel": wheel, "src": src,
            "env": clean_env(PATH=f"{venv / 'bin'}{os.pathsep}{NO_RUST}"), "status_before": before}


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """scripts/install --prefix into a directory of its own."""
    where = tmp_path_factory.mktemp("install") / "prefix"
    ok(sh([ROOT / "scripts" / "install", "--prefix", where], timeout=600))
    return where


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
    assert "  TENSORMALLOC_THRESHOLD=" in out.stdout and "tensormalloc plot TRACE" in out.stdout, out.stdout
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


def test_c_install_found_with_pkg_config(prefix, tmp_path):
    lib = prefix / "lib"
    assert os.readlink(lib / "libtensormalloc.so") == "libtensormalloc.so.0"
    assert os.readlink(lib / "libtensormalloc.so.0") == f"libtensormalloc.so.{CARGO_VERSION}"
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
    # The docs as in the source tree: every relative link between the installed pages resolves
    # (they were copied flat, and README.md's docs/ links and BENCHMARKS.md led nowhere).
    docs = prefix / "share" / "doc" / "tensormalloc"
    for page in [docs / "README.md", *sorted((docs / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).is_file(), (page, target)


# One command (issue 37, item 5): what the pip package installs and what scripts/install does are
# the same program. The installed launcher runs its Python subcommands with the python3 on PATH:
# here the pip venv's, so both routes see the same Python (numpy, no matplotlib).
ROUTES = ("pip", "install")


def command(route, pkg, prefix):
    """(the tensormalloc command, its environment) by route."""
    if route == "pip":
        return pkg["venv"] / "bin" / "tensormalloc", pkg["env"]
    return prefix / "bin" / "tensormalloc", clean_env(PATH=f"{pkg['venv'] / 'bin'}{os.pathsep}{NO_RUST}")


def test_both_routes_are_one_program_with_the_same_words(pkg, prefix, tmp_path):
    said = {}
    for route in ROUTES:
        exe, env = command(route, pkg, prefix)
        said[route] = {args: sh([exe, *args], env=env, cwd=tmp_path) for args in
                       [("--version",), ("--help",), (), ("run",), ("report",), ("plot",), ("no-such-command-xyz",)]}
    for args, out in said["pip"].items():
        other = said["install"][args]
        assert (out.returncode, out.stdout, out.stderr) == (other.returncode, other.stdout, other.stderr), (args, out, other)
    assert said["pip"][("--version",)].stdout == f"tensormalloc {CARGO_VERSION}\n"
    assert said["pip"][("no-such-command-xyz",)].returncode == 127
    assert [said["pip"][a].returncode for a in [(), ("run",)]] == [2, 2]
    help_text = said["pip"][("--help",)].stdout
    for words in ("tensormalloc [run] COMMAND", "tensormalloc report STATS.json", "tensormalloc plot TRACE", "--path", "--version",
                  "  TENSORMALLOC_THRESHOLD=", "TENSORMALLOC_HOST_RELEASE_MS=1000"):
        assert words in help_text, words


@pytest.mark.parametrize("route", ROUTES)
def test_run_report_plot_and_path_from_either_route(route, pkg, prefix, tmp_path):
    exe, env = command(route, pkg, prefix)
    lib = ok(sh([exe, "--path"], env=env)).stdout.strip()
    assert lib == (f"{prefix}/lib/libtensormalloc.so" if route == "install" else
                   ok(py(pkg, "import tensormalloc; print(tensormalloc.library_path())")).stdout.strip())
    # run, by its name and without it: preloaded, the exit status passed on
    code = "import sys, os; print(os.environ['LD_PRELOAD'].split()[0]); sys.exit(5)"
    for run_word in (["run"], []):
        out = sh([exe, *run_word, "python", "-c", code], env=env, cwd=tmp_path)
        assert (out.returncode, out.stdout.strip()) == (5, lib), out
    # report: a stats file of a run under it
    code = "import numpy as np\nkept = [np.ones(4_000_000) for _ in range(3)]\n"
    stats, trace = tmp_path / "stats.json", tmp_path / "trace.bin"
    # The old threshold: Python's own blocks of 128 KiB and more would count too.
    ok(sh([exe, "python", "-c", code], cwd=tmp_path,
          env={**env, "TENSORMALLOC_THRESHOLD": "4M", "TENSORMALLOC_STATS": f"json:{stats}", "TENSORMALLOC_TRACE": str(trace)}))
    report = json.loads(ok(sh([exe, "report", "--json", stats], env=env)).stdout)
    assert report["total"]["requests"] == 3, report
    assert "total 1 process" in ok(sh([exe, "report", stats], env=env)).stdout
    # plot: the summary, then (no matplotlib in this Python) what to install
    out = sh([exe, "plot", trace, tmp_path / "t.png"], env=env)
    assert out.returncode == 1 and "allocs=3" in out.stdout and "pip install matplotlib" in out.stderr, out


def python3_on_path(bindir, python):
    """A directory whose python3 is `python` (a wrapper: a venv's python found through a link
    elsewhere would not know its venv)."""
    bindir.mkdir(exist_ok=True)
    (bindir / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    (bindir / "python3").chmod(0o755)
    return bindir


def test_the_installed_command_draws_with_a_python_that_has_matplotlib(prefix, tmp_path):
    """The launcher's plot runs with the python3 on PATH: the checkout's .venv has matplotlib."""
    bindir = python3_on_path(tmp_path / "bin", ROOT / ".venv" / "bin" / "python")
    env = clean_env(PATH=f"{bindir}{os.pathsep}{NO_RUST}")
    trace = tmp_path / "trace.bin"
    code = "import numpy as np\nkept = [np.ones(4_000_000) for _ in range(3)]\n"
    ok(sh([prefix / "bin" / "tensormalloc", "python3", "-c", code], cwd=tmp_path, env={**env, "TENSORMALLOC_THRESHOLD": "4M", "TENSORMALLOC_TRACE": str(trace)}))
    out = ok(sh([prefix / "bin" / "tensormalloc", "plot", trace], env=env))
    assert "allocs=3" in out.stdout and f"wrote {trace}.png" in out.stdout, out
    assert (tmp_path / "trace.bin.png").read_bytes().startswith(b"\x89PNG")


def test_pip_user_and_install_prefix_share_a_home(pkg, tmp_path):
    """`pip install --user` and `scripts/install --prefix ~/.local` in one home, in both orders:
    ~/.local/bin/tensormalloc is whichever came last, and works the same; each keeps the other's
    files (the package in site-packages, the C library, its header and pkg-config file)."""
    for order in (("pip", "install"), ("install", "pip")):
        home = tmp_path / "-".join(order)
        local = home / ".local"
        venv = home / "venv"
        # A venv that sees the user's site, so that pip's --user goes to ~/.local as outside one.
        pip = make_venv(venv, "--system-site-packages")
        env = clean_env(HOME=str(home), PYTHONUSERBASE=str(local), PATH=f"{local / 'bin'}{os.pathsep}{venv / 'bin'}{os.pathsep}{NO_RUST}")
        for step in order:
            if step == "pip":
                ok(sh([*pip, "install", "--user", pkg["wheel"]], env=env, timeout=600))
            else:
                rust = {k: os.environ.get(k) or str(Path.home() / d) for k, d in (("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup"))}
                ok(sh([ROOT / "scripts" / "install", "--prefix", local], env={**env, **rust, "PATH": os.environ["PATH"]}, timeout=600))
        exe = local / "bin" / "tensormalloc"
        assert ok(sh([exe, "--version"], env=env)).stdout == f"tensormalloc {CARGO_VERSION}\n", order
        out = sh([exe, "sh", "-c", "exit 9"], env=env)
        assert out.returncode == 9 and out.stderr == "", (order, out)
        assert "TENSORMALLOC_STATS=" in ok(sh([exe, "--help"], env=env)).stdout
        # The pip package imports from the user's site, with its own library; the C install is whole.
        where = ok(sh([venv / "bin" / "python", "-c", "import tensormalloc; print(tensormalloc.library_path())"],
                      env=env, cwd=home)).stdout.strip()
        assert where.startswith(str(local / "lib" / "python")) and where.endswith("tensormalloc/libtensormalloc.so"), where
        flags = ok(sh(["pkg-config", "--libs", "tensormalloc"], env={**env, "PKG_CONFIG_PATH": str(local / "lib" / "pkgconfig")}))
        assert f"-L{local}/lib" in flags.stdout, flags
        assert (local / "include" / "tensormalloc.h").is_file() and (local / "lib" / "libtensormalloc.so.0").exists()


def test_pip_without_rust_says_what_to_install(pkg, tmp_path):
    """A build where cargo and rustc are not on PATH stops at once, naming Rust's version and rustup."""
    pip = make_venv(tmp_path / "venv")
    env = clean_env(PATH=NO_RUST)
    env.pop("CARGO", None)
    env.pop("RUSTC", None)
    out = sh([*pip, "wheel", "--no-deps", "-w", tmp_path / "wheels", pkg["src"]], env=env, timeout=600)
    assert out.returncode != 0, out
    said = out.stdout + out.stderr
    assert "building tensormalloc needs Rust: cargo and rustc not found on PATH" in said, said
    assert "install Rust 1.88 or later with rustup (https://rustup.rs)" in said, said


def test_versions_agree(pkg):
    """The package's version is the library's (Cargo.toml), in its metadata and its module."""
    out = ok(py(pkg, "import tensormalloc, importlib.metadata as m; print(tensormalloc.__version__, m.version('tensormalloc'))"))
    assert out.stdout.split() == [CARGO_VERSION, CARGO_VERSION], out
