#!/usr/bin/env bash
# The C++ core under AddressSanitizer and UndefinedBehaviorSanitizer (every UBSan
# finding fatal), and the serving tests on it: the decoders in process, and servers in
# their own processes (hostile clients, Triton's clients, h2load and nghttp), which
# inherit the instrumented package. Only the core (_core) is built: the kernels
# library and the device plugin are the installed package's.
#   bash tools/check_sanitizers.sh [TESTS AND PYTEST OPTIONS...]   (default: the serving
#                                                                  subset below)
#   bash tools/check_sanitizers.sh --build-only    (the sanitized core built, no test run)
# Run it in the environment the package is installed in (pip install .[test]).
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi
repo=$PWD
python=$(command -v python)
build=build/sanitize
start=$(date +%s)
cmake -S . -B "$build" -DPADDLE_IPU_ASAN=ON -DPADDLE_IPU_UBSAN=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF \
  -DPython_EXECUTABLE="$python" -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" \
  -DPADDLE_IPU_PACKAGE_DIR="$repo/$build/pkg/paddle_ipu" \
  -DPADDLE_IPU_PLUGIN_DIR="$repo/$build/plugin" >/dev/null
cmake --build "$build" -j"$(nproc)" --target _core >"$build/build.log" 2>&1 ||
  { tail -n 60 "$build/build.log" >&2; exit 1; }
echo "sanitized core built: $(( $(date +%s) - start )) s"
[ "$build_only" = 0 ] || exit 0
# The package beside it: the sources' Python, the installed package's kernels library.
installed=$(cd /tmp && "$python" -c \
  "import importlib.util as u; print(u.find_spec('paddle_ipu').submodule_search_locations[0])")
(cd paddle_ipu && tar cf - $(find . -name '*.py' -o -name '*.pyi' | grep -v __pycache__)) |
  tar xf - -C "$build/pkg/paddle_ipu"
cp "$installed/libpaddle-ipu-kernels.so" "$build/pkg/paddle_ipu/"
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  # (not the 60 MB body's health latencies: no bound holds under ASan's allocator, and
  # the decode threads are covered by requests just past their threshold)
  tests=(tests/unit/test_serving_parser.py tests/unit/test_serving_native_queue.py
    tests/e2e/test_serving_hostile.py tests/e2e/test_serving_grpc_native.py
    tests/e2e/test_serving_protocols.py -k "not while_a_large_body_is_parsed")
fi
# From outside the checkout, so that the instrumented package is the one imported;
# libstdc++ preloaded because Python does not link it; alloc_dealloc_mismatch=0 and no
# leak check because libpaddle trips both on its own.
paddle_libs=$(cd /tmp && "$python" -c \
  "import importlib.util as u, os; print(os.path.join(u.find_spec('paddle').submodule_search_locations[0], 'libs'))")
start=$(date +%s)
(
  cd /tmp
  export PYTHONPATH="$repo/$build/pkg"
  export LD_LIBRARY_PATH="$paddle_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
  export ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  "$python" -c "import paddle_ipu._core as c, sys; sys.exit(0 if c.__file__.startswith('$repo/$build') else 'not the sanitized core: ' + c.__file__)"
  args=()
  for a in "${tests[@]}"; do  # the checkout's paths made absolute; options and their values kept
    if [ -e "$repo/${a%%::*}" ]; then args+=("$repo/$a"); else args+=("$a"); fi
  done
  "$python" -m pytest -q -p no:cacheprovider --rootdir "$repo" -c "$repo/pyproject.toml" "${args[@]}"
)
echo "serving tests under ASan and UBSan: $(( $(date +%s) - start )) s"
