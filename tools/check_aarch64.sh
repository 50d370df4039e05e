#!/usr/bin/env bash
# Compile-only check of the C++ parts for aarch64 (no ARM machine here): the fp16
# and optimizer loops must build without x86 intrinsics, and the device plugin against Paddle's
# headers. Needs a cross compiler (Debian: g++-aarch64-linux-gnu) and an installed
# paddlepaddle for its headers.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX_AARCH64:-aarch64-linux-gnu-g++}
if ! command -v "$CXX" >/dev/null; then
  echo "check_aarch64: $CXX not found (apt-get install g++-aarch64-linux-gnu)" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-std=c++17 -O2 -Wall -Wextra -Werror -fPIC)
"$CXX" "${flags[@]}" -c csrc/core/fp16.cc -o "$out/fp16.o"
# The optimizer loop (its SSE2 path is x86 only): pybind11's headers are
# architecture-independent; this Python's headers stand in for the target's (LP64
# on both), which is enough for a compile-only check.
py_include=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
pb_include=$(python -c "import pybind11; print(pybind11.get_include())")
"$CXX" "${flags[@]}" -ffp-contract=off -fno-math-errno -I"$py_include" -I"$pb_include" \
  -c csrc/core/optim.cc -o "$out/optim.o"
# Paddle's headers, found without importing paddle (which loads plugins and logs).
include=$(python -c "import importlib.util as u, os; \
print(os.path.join(u.find_spec('paddle').submodule_search_locations[0], 'include'))")
"$CXX" "${flags[@]}" -I"$include" -c csrc/device/runtime.cc -o "$out/runtime.o"
for obj in "$out"/*.o; do
  file "$obj" | grep -q "ARM aarch64" || { echo "check_aarch64: $obj is not aarch64" >&2; exit 1; }
done
echo "check_aarch64: csrc/core/fp16.cc, csrc/core/optim.cc and csrc/device/runtime.cc compile for aarch64"
