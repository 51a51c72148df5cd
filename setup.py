"""Builds libtensormalloc.so with cargo (setuptools-rust) into the tensormalloc package as
`tensormalloc/libtensormalloc.so`, and tags the wheel py3-none-PLATFORM: the library does not
link Python, so one wheel serves every Python 3 on the platform. Metadata: pyproject.toml.
Building needs Rust 1.88 or later (naked functions); without it, the build says so and how to
get it before anything else runs."""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools_rust import Binding, RustExtension, build_rust

RUST_NEEDED = (1, 88)
GET_RUST = ("install Rust {need} or later with rustup (https://rustup.rs):\n"
            "    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y\n"
            "    . \"$HOME/.cargo/env\"\n"
            "then run pip again. Rust is needed to build the wheel, not to run it: a wheel built on a\n"
            "machine with Rust (pip wheel .) installs anywhere on the platform.")


def rust_problem():
    """None when cargo and a recent enough rustc are on PATH; else what is wrong, in words."""
    need = ".".join(map(str, RUST_NEEDED))
    cargo = shutil.which(os.environ.get("CARGO", "cargo"))
    rustc = shutil.which(os.environ.get("RUSTC", "rustc"))
    if not cargo or not rustc:
        missing = " and ".join(n for n, p in (("cargo", cargo), ("rustc", rustc)) if not p)
        return f"building tensormalloc needs Rust: {missing} not found on PATH; " + GET_RUST.format(need=need)
    try:
        out = subprocess.run([rustc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"building tensormalloc needs Rust: {rustc} --version failed ({e}); " + GET_RUST.format(need=need)
    found = re.match(r"rustc (\d+)\.(\d+)", out)
    if found and tuple(map(int, found.groups())) < RUST_NEEDED:
        return (f"building tensormalloc needs Rust {need} or later (naked functions); {out.strip()} found: "
                "rustup update stable, or " + GET_RUST.format(need=need))
    return None


class BuildRust(build_rust):
    """Says what to install when Rust is missing or too old, then builds; keeps the library's own
    name (setuptools-rust would add Python's extension suffix)."""

    def run(self):
        problem = rust_problem()
        if problem:
            raise SystemExit(f"\ntensormalloc: {problem}\n")
        super().run()

    def get_dylib_ext_path(self, ext, target_fname):
        return os.path.join(os.path.dirname(super().get_dylib_ext_path(ext, target_fname)), "libtensormalloc.so")


class Wheel(bdist_wheel):
    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    rust_extensions=[RustExtension("tensormalloc.libtensormalloc", path="Cargo.toml", binding=Binding.NoBinding,
                                   args=["--locked"])],
    cmdclass={"build_rust": BuildRust, "bdist_wheel": Wheel},
)
