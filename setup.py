"""Builds libdlkern.so with cargo and ships it inside the `dlkern` package (see pyproject.toml).
The wheel is platform-specific (it holds a Linux x86-64 shared library) but not tied to a Python
version: the library is loaded with ctypes and by ONNX Runtime, not imported."""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithLibrary(build_py):
    """build_py, then `cargo build --release --lib` and libdlkern.so into the package."""

    def run(self):
        super().run()
        cargo = os.environ.get("CARGO") or shutil.which("cargo") or "/usr/bin/cargo"
        print("dlkern: cargo build --release --lib (the kernels' PTX and the library: minutes on a first build)")
        subprocess.run([cargo, "build", "--release", "--lib"], cwd=ROOT, check=True)
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        shutil.copy2(target / "release" / "libdlkern.so", Path(self.build_lib) / "dlkern" / "libdlkern.so")


class PlatformWheel(bdist_wheel):
    """A wheel for this platform, any Python 3."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    package_dir={"": "python"},
    packages=["dlkern"],
    py_modules=["dlkern_ctypes", "dlkern_onnx"],
    cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel},
)
