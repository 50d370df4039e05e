#!/usr/bin/env bash
# The system packages paddle-ipu needs besides Python's, installed when missing (Debian
# and Ubuntu, through apt-get: as root, or with sudo).
#   bash tools/system_deps.sh          the build: nghttp2's development files (the
#                                      native gRPC server, csrc/serving/grpc_connection.cc)
#   bash tools/system_deps.sh test     and what the tests use: h2load and nghttp (the
#                                      gRPC port's tests), the aarch64 cross compiler
#                                      (the compile-only check of the C++ parts), DejaVu
#                                      fonts (the trained-weights tier's text images),
#                                      clang and its libFuzzer runtime (the serving
#                                      decoders' fuzz harnesses, tools/fuzz.sh)
# Another distribution: install its nghttp2 development package (and, for the tests,
# nghttp2's client tools) by hand; this script then finds nothing missing.
set -euo pipefail
what="${1:-build}"
case "$what" in build | test) ;; *) echo "usage: $0 [build|test]" >&2; exit 2 ;; esac
packages=()
[ -f /usr/include/nghttp2/nghttp2.h ] || packages+=(libnghttp2-dev)
if [ "$what" = test ]; then
  command -v h2load >/dev/null 2>&1 || packages+=(nghttp2-client)
  command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || packages+=(g++-aarch64-linux-gnu)
  [ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || packages+=(fonts-dejavu-core)
  clang=$(command -v clang++ || command -v clang++-14 || true)
  if [ -z "$clang" ] || [ ! -f "$("$clang" -print-runtime-dir)/libclang_rt.fuzzer-$(uname -m).a" ]; then
    packages+=(clang libclang-rt-dev)
  fi
fi
[ ${#packages[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system_deps: missing ${packages[*]} (Debian's names) and no apt-get here: install" \
    "them with this system's package manager" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
start=$(date +%s)
"${sudo[@]}" apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${packages[@]}" >/dev/null
echo "apt-get install ${packages[*]}: $(( $(date +%s) - start )) s"
