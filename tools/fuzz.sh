#!/usr/bin/env bash
# The serving decoders under libFuzzer: builds the harnesses of csrc/fuzz with clang
# (AddressSanitizer and UndefinedBehaviorSanitizer, UBSan fatal) and runs each for
# SECONDS from its seed corpus (tests/fuzz/corpus/<harness>, read only: what a run
# finds goes to a scratch folder). A crash, a sanitizer report or a timeout fails the
# run and leaves the input in build/fuzz/artifacts/.
#   bash tools/fuzz.sh [SECONDS] [HARNESS...]      (default: 30 s, all five)
# Needs clang and its libFuzzer runtime (Debian: clang-14 libclang-rt-14-dev;
# bash tools/system_deps.sh test) and the test extra's boost-headers (pip install .[test]).
#   bash tools/fuzz.sh --build-only                 (the harnesses built, none run)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi
seconds="${1:-30}"
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(fuzz_http_request fuzz_json_infer fuzz_binary_infer fuzz_grpc_infer fuzz_grpc_control)
cxx="${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++ || true)}"
if [ -z "$cxx" ]; then
  echo "fuzz.sh: no clang++ (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi
python="${PYTHON:-$(command -v python || command -v python3)}"
start=$(date +%s)
cmake -S csrc/fuzz -B build/fuzz -DCMAKE_CXX_COMPILER="$cxx" -DPython_EXECUTABLE="$python" >/dev/null
cmake --build build/fuzz -j"$(nproc)" >build/fuzz/build.log 2>&1 ||
  { tail -n 60 build/fuzz/build.log >&2; exit 1; }
echo "fuzz harnesses built: $(( $(date +%s) - start )) s"
[ "$build_only" = 0 ] || exit 0
mkdir -p build/fuzz/artifacts
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
for h in "${harnesses[@]}"; do
  dict=()
  case "$h" in
    fuzz_http_request) dict=(-dict=tests/fuzz/http.dict) ;;
    fuzz_json_infer | fuzz_binary_infer) dict=(-dict=tests/fuzz/json.dict) ;;
  esac
  scratch=$(mktemp -d)
  log=build/fuzz/"$h".log
  echo "== $h: ${seconds} s"
  status=0
  build/fuzz/"$h" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -use_value_profile=1 \
    -print_final_stats=1 -artifact_prefix=build/fuzz/artifacts/"$h"- "${dict[@]}" \
    "$scratch" tests/fuzz/corpus/"$h" >"$log" 2>&1 || status=$?
  rm -rf "$scratch"
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz.sh: $h failed (exit $status); its input is in build/fuzz/artifacts/" >&2
    exit "$status"
  fi
done
echo "fuzz.sh: $(( $(date +%s) - start )) s"
