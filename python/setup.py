"""Builds the kvtier Python package: the pure-Python part plus the extension kvtier._kvtier, which
the project's CMake builds (target `_kvtier`) from the repository one level up.

Needs cmake, a C++20 compiler, pybind11 (Debian's pybind11-dev or the pip package) and the C++
dependencies of deps/debian-packages.txt; nvcc for the CUDA backends (KVTIER_CUDA=AUTO finds it).
The CMake build tree is <repo>/build-pip (ignored by git).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD_BASE = ROOT / "build-pip"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = BUILD_BASE / "cmake"
        config = [
            "-DKVTIER_BUILD_PYTHON=ON",
            "-DKVTIER_BUILD_TESTS=OFF",
            "-DKVTIER_BUILD_BENCH=OFF",
            "-DKVTIER_BUILD_TOOLS=OFF",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DPYTHON_EXECUTABLE={sys.executable}",
            f"-DKVTIER_CUDA={os.environ.get('KVTIER_CUDA', 'AUTO')}",
        ]
        try:
            import pybind11  # a pip-installed pybind11, when there is one

            config.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass  # Debian's pybind11-dev: found by CMake under /usr/lib/cmake/pybind11
        if shutil.which("ninja"):
            config += ["-G", "Ninja"]
        config += os.environ.get("CMAKE_ARGS", "").split()
        jobs = os.environ.get("KVTIER_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *config])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_kvtier",
                               "-j", jobs])
        built = sorted((build_dir / "python" / "kvtier").glob("_kvtier*"))
        built = [p for p in built if p.suffix in (".so", ".pyd")]
        if not built:
            raise RuntimeError(f"CMake built no kvtier/_kvtier extension under {build_dir}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


setup(
    ext_modules=[CMakeExtension("kvtier._kvtier")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": str(BUILD_BASE / "setuptools")}},
)
