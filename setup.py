"""Builds libtensormalloc.so with cargo (setuptools-rust) into the tensormalloc package as
`tensormalloc/libtensormalloc.so`, and tags the wheel py3-none-PLATFORM: the library does not
link Python, so one wheel serves every Python 3 on the platform. Metadata: pyproject.toml."""
import os

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools_rust import Binding, RustExtension, build_rust


class BuildRust(build_rust):
    """Keeps the library's own name: setuptools-rust would add Python's extension suffix."""

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
