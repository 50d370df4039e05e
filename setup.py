"""Build paddle-ipu: CMake builds the custom-device plugin and the pybind11 core.

setup.py stays thin: it hands CMake the Python interpreter and the output folders,
and pins the runtime PaddlePaddle to the exact release the plugin was built
against (the plugin's C ABI depends on it).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        package_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        plugin_dir = Path(self.build_lib).resolve() / "paddle_custom_device"
        build_temp = Path(self.build_temp).resolve() / "cmake"
        build_temp.mkdir(parents=True, exist_ok=True)
        import pybind11

        config = os.environ.get("PADDLE_IPU_BUILD_TYPE", "Release")
        args = [
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DPADDLE_IPU_PACKAGE_DIR={package_dir}",
            f"-DPADDLE_IPU_PLUGIN_DIR={plugin_dir}",
            f"-DCMAKE_BUILD_TYPE={config}",
        ]
        if os.environ.get("PADDLE_IPU_ASAN") == "1":
            args.append("-DPADDLE_IPU_ASAN=ON")
        subprocess.run(["cmake", str(ROOT), *args], cwd=build_temp, check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", ".", "--parallel", jobs], cwd=build_temp, check=True)


class BuildPy(build_py):
    """Also put the import hook (a top-level module and the .pth that loads it) at
    the root of site-packages: see paddle_ipu_autoload/_paddle_ipu_autoload.py."""

    def run(self) -> None:
        super().run()
        source = ROOT / "paddle_ipu_autoload"
        for name in ("_paddle_ipu_autoload.py", "paddle_ipu_autoload.pth"):
            self.copy_file(str(source / name), str(Path(self.build_lib) / name))


def paddle_requirement() -> str:
    try:
        return f"paddlepaddle=={importlib.metadata.version('paddlepaddle')}"
    except importlib.metadata.PackageNotFoundError:
        return "paddlepaddle>=3.3,<3.4"


setup(
    install_requires=[
        paddle_requirement(),
        "numpy>=1.26,<3",
        "onnx>=1.16,<1.18",
        "onnxruntime>=1.20,<1.33",
        "paddle2onnx>=2.1,<2.2",
        "onnxconverter-common>=1.14,<1.17",
        "safetensors>=0.4,<1",
    ],
    ext_modules=[CMakeExtension("paddle_ipu._core")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
)
