"""Build paddle-ipu: CMake builds the custom-device plugin and the pybind11 core.

setup.py stays thin: it hands CMake the Python interpreter and the output folders,
picks the PaddlePaddle to build against (the one installed in the environment being
installed into, one of the series paddle_ipu/_util/paddle_releases.py lists), and
requires the runtime PaddlePaddle to be of that series (the plugin's C ABI and the
kernels' C++ depend on it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: the ipu kernels (csrc/kernels) and the host's operators (csrc/ops), built beside the core
KERNELS_LIB = "libpaddle-ipu-kernels.so"
OPS_LIB = "libpaddle-ipu-ops.so"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def copy_extensions_to_source(self) -> None:
        """An editable install: the core, the kernels and the operators libraries into the source
        package, the plugin into the editable wheel's root (site-packages)."""
        super().copy_extensions_to_source()
        built = Path(self.build_lib).resolve()
        for lib in (KERNELS_LIB, OPS_LIB):
            self.copy_file(str(built / "paddle_ipu" / lib), str(ROOT / "paddle_ipu"))
        root = editable_root(self)
        if root is not None:
            self.copy_tree(str(built / "paddle_custom_device"), str(root / "paddle_custom_device"))

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


#: installed at the root of site-packages: the import hook, the .pth that loads it at
#: interpreter start (see toplevel/_paddle_ipu_autoload.py), the command's entry point
TOPLEVEL = ("_paddle_ipu_autoload.py", "paddle_ipu_autoload.pth", "paddle_ipu_cli.py")


class BuildPy(build_py):
    """Also put the top-level modules (TOPLEVEL) at the root of site-packages."""

    def run(self) -> None:
        super().run()
        # An editable install's wheel holds only what lands in its root (install_lib).
        target = editable_root(self) or Path(self.build_lib)
        source = ROOT / "toplevel"
        for name in TOPLEVEL:
            self.copy_file(str(source / name), str(target / name))


def editable_root(command: build_py | build_ext) -> Path | None:
    """The root of the wheel an editable install (pip install -e) builds, or None.

    An editable wheel maps the package onto the source tree; what a regular install
    puts beside the package (the import hook, the plugin Paddle loads from
    site-packages/paddle_custom_device) must be written into that wheel's root."""
    if not getattr(command, "editable_mode", False):
        return None
    return Path(command.get_finalized_command("install").install_lib)


def _load_releases() -> dict[str, object]:
    """paddle_ipu/_util/paddle_releases.py, read without importing paddle_ipu."""
    import runpy

    return runpy.run_path(str(ROOT / "paddle_ipu" / "_util" / "paddle_releases.py"))


_RELEASES = _load_releases()
#: what a build with no PaddlePaddle in reach downloads the newest release of
PADDLE_RANGE: str = _RELEASES["RANGE"]
#: PADDLE_IPU_PADDLE_VERSION=3.2 (or 3.2.2): build against that release, whatever is
#: installed (a wheel for another environment, uv, pip --prefix/--target)
_VERSION_ENV = "PADDLE_IPU_PADDLE_VERSION"
#: what the build takes out of the paddlepaddle wheel: the C++ headers (the plugin needs
#: paddle/phi/backends/device_ext.h, the ipu kernels the rest) and the libraries the
#: kernels and the host's operators link (they are not bundled: they are the ones Paddle
#: loads)
_WHEEL_INCLUDE = "paddle/include/"
_WHEEL_LIBS = (
    "paddle/libs/libphi_core.so",
    "paddle/libs/libcommon.so",
    "paddle/base/libpaddle.so",
)
_DEVICE_HEADER = "paddle/phi/backends/device_ext.h"
_headers: tuple[str, str, str] | None = None


def paddle_headers(build_temp: Path) -> tuple[str, str, str]:
    """(include dir, library dir, Paddle version) to build against.

    In order: the release PADDLE_IPU_PADDLE_VERSION names (downloaded); the paddlepaddle
    of the environment being installed into (imported without build isolation, read off
    its site-packages with it); the newest supported release (downloaded).  pip runs the
    metadata step and the build step in two processes: both get the same answer."""
    global _headers
    if _headers is None:
        wanted = os.environ.get(_VERSION_ENV, "").strip()
        if wanted:
            spec = f"paddlepaddle=={wanted}" + (".*" if wanted.count(".") == 1 else "")
            found = _downloaded_paddle(build_temp, spec)
            where = f"{_VERSION_ENV}={wanted}"
        else:
            target = _target_paddle()
            found = target or _downloaded_paddle(build_temp, PADDLE_RANGE)
            where = f"installed in {sys.prefix}" if target else "downloaded"
        _headers = _supported(found, where)
    return _headers


def _supported(found: tuple[str, str, str], where: str) -> tuple[str, str, str]:
    series = _RELEASES["series"](found[2])
    if series not in _RELEASES["SUPPORTED"]:
        raise RuntimeError(
            f"PaddlePaddle {found[2]} ({where}) is not supported: paddle-ipu builds against "
            f"PaddlePaddle {_RELEASES['describe']()} ({PADDLE_RANGE}); install one of "
            f"those, or set {_VERSION_ENV}=3.x to build against another"
        )
    return found


def _target_paddle() -> tuple[str, str, str] | None:
    """(include dir, library dir, version) of the paddlepaddle installed in the
    environment being installed into, or None.

    Without build isolation it is importable.  pip's isolated build runs the target
    environment's own interpreter with that environment's site-packages taken off
    sys.path, so sys.prefix (and sysconfig's purelib/platlib) still name it: its Paddle
    is read from there, neither imported nor downloaded, and pip keeps it."""
    spec = importlib.util.find_spec("paddle")
    if spec is not None and spec.origin is not None:
        root = Path(spec.origin).resolve().parent
        version = importlib.metadata.version("paddlepaddle")
        return str(root / "include"), str(root / "libs"), version
    paths = sysconfig.get_paths()
    for site in dict.fromkeys((paths["purelib"], paths["platlib"])):
        root = Path(site) / "paddle"
        if not (root / "include" / _DEVICE_HEADER).is_file():
            continue
        for dist in importlib.metadata.distributions(path=[site]):
            if (dist.metadata["Name"] or "").lower() == "paddlepaddle":
                return str(root / "include"), str(root / "libs"), dist.version
    return None


def _downloaded_paddle(build_temp: Path, requirement: str) -> tuple[str, str, str]:
    """The headers and the libraries the kernels and operators link, read out of the newest
    paddlepaddle wheel matching ``requirement``, which pip fetches (from its cache when
    the install already downloaded it), instead of installing a second 700 MB Paddle
    into the build environment."""
    slug = "".join(c if c.isalnum() or c in ".-" else "_" for c in requirement)
    wheels = build_temp / "paddle-wheel" / slug
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "--dest", str(wheels), requirement],
        check=True,
    )  # fmt: skip
    found = sorted(
        wheels.glob("paddlepaddle-*.whl"),
        key=lambda w: tuple(int(p) for p in w.name.split("-")[1].split(".")[:3] if p.isdigit()),
    )
    if not found:
        raise RuntimeError(f"pip download {requirement!r} gave no wheel in {wheels}")
    wheel = found[-1]
    version = wheel.name.split("-")[1]
    unpacked = build_temp / "paddle-unpacked" / version
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
    return str(unpacked / "paddle" / "include"), str(unpacked / "paddle" / "libs"), version


def paddle_requirement() -> str:
    """The runtime requirement: the series whose headers the plugin was built with (its
    patch releases share one C ABI), so pip keeps an installed 3.2.2 when the build used
    its headers, and never swaps Paddle for another series."""
    try:
        version = paddle_headers(ROOT / "build" / "paddle")[2]
    except Exception:
        return PADDLE_RANGE
    return _RELEASES["requirement"](version)


setup(
    install_requires=[
        paddle_requirement(),
        "numpy>=1.24,<3",
        "onnx>=1.16,<1.18",
        "onnxruntime>=1.20,<1.33",
        # ONNX Runtime's symbolic shape inference: an open graph's output sizes as formulas
        "sympy>=1.12,<2",
        "paddle2onnx>=2.1,<2.2",
        "onnxconverter-common>=1.14,<1.17",
        "safetensors>=0.4,<1",
        # the input shape ranges of a PaddleX export's inference.yml
        "pyyaml>=6,<7",
    ],
    ext_modules=[CMakeExtension("paddle_ipu._core")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
)
