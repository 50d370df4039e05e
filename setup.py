"""Build paddle-ipu: CMake builds the custom-device plugin and the pybind11 core.

setup.py stays thin: it hands CMake the Python interpreter and the output folders,
and pins the runtime PaddlePaddle to the exact release the plugin was built
against (the plugin's C ABI depends on it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import zipfile
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
        include_dir, lib_dir, version = paddle_headers(build_temp)
        args = [
            f"-DPADDLE_INCLUDE_DIR={include_dir}",
            f"-DPADDLE_LIB_DIR={lib_dir}",
            f"-DPADDLE_VERSION={version}",
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


#: the PaddlePaddle releases this source builds against
PADDLE_RANGE = "paddlepaddle>=3.3,<3.4"
#: what the build takes out of the paddlepaddle wheel: the C++ headers (the plugin needs
#: paddle/phi/backends/device_ext.h, the ipu kernels the rest) and the two libraries the
#: kernels link (they are not bundled: they are the ones Paddle loads)
_WHEEL_INCLUDE = "paddle/include/"
_WHEEL_LIBS = ("paddle/libs/libphi_core.so", "paddle/libs/libcommon.so")
_DEVICE_HEADER = "paddle/phi/backends/device_ext.h"
_headers: tuple[str, str, str] | None = None


def paddle_headers(build_temp: Path) -> tuple[str, str, str]:
    """(include dir, library dir, Paddle version) to build against.

    From the paddlepaddle installed for this interpreter when there is one (a build
    without isolation); otherwise the headers and the two libraries the kernels link
    are read out of the paddlepaddle wheel, which pip fetches (from its cache when the
    install already downloaded it), instead of installing a second 700 MB Paddle into
    the build environment."""
    global _headers
    if _headers is not None:
        return _headers
    spec = importlib.util.find_spec("paddle")
    if spec is not None and spec.origin is not None:
        root = Path(spec.origin).resolve().parent
        _headers = (
            str(root / "include"),
            str(root / "libs"),
            importlib.metadata.version("paddlepaddle"),
        )
        return _headers
    wheels = build_temp / "paddle-wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "--dest", str(wheels), PADDLE_RANGE],
        check=True,
    )  # fmt: skip
    found = sorted(wheels.glob("paddlepaddle-*.whl"))
    if not found:
        raise RuntimeError(f"pip download {PADDLE_RANGE!r} gave no wheel in {wheels}")
    wheel = found[-1]
    version = wheel.name.split("-")[1]
    unpacked = build_temp / "paddle-unpacked"
    with zipfile.ZipFile(wheel) as archive:
        members = [
            m
            for m in archive.namelist()
            if (m.startswith(_WHEEL_INCLUDE) and not m.endswith("/")) or m in _WHEEL_LIBS
        ]
        missing = [m for m in (*_WHEEL_LIBS, _WHEEL_INCLUDE + _DEVICE_HEADER) if m not in members]
        if missing:
            raise RuntimeError(f"{wheel.name} lacks {missing}: not a wheel paddle-ipu builds on")
        archive.extractall(unpacked, members)
    _headers = (str(unpacked / "paddle" / "include"), str(unpacked / "paddle" / "libs"), version)
    return _headers


def paddle_requirement() -> str:
    """The runtime pin: exactly the Paddle whose headers the plugin was built with."""
    try:
        return f"paddlepaddle=={paddle_headers(ROOT / 'build' / 'paddle')[2]}"
    except Exception:
        return PADDLE_RANGE


setup(
    install_requires=[
        paddle_requirement(),
        "numpy>=1.24,<3",
        "onnx>=1.16,<1.18",
        "onnxruntime>=1.20,<1.33",
        "paddle2onnx>=2.1,<2.2",
        "onnxconverter-common>=1.14,<1.17",
        "safetensors>=0.4,<1",
    ],
    ext_modules=[CMakeExtension("paddle_ipu._core")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
)
