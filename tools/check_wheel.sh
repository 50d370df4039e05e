#!/usr/bin/env bash
# Install a built wheel into a fresh virtual environment with no compiler on PATH,
# then run `paddle-ipu info` and the demo from outside the checkout.
#
#   tools/check_wheel.sh dist/paddle_ipu-*.whl
set -euo pipefail
wheel=$(realpath "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
# PATH holds the venv and a few shell tools Paddle calls at import: nothing can
# compile during the install.
tools=$(mktemp -d)
for tool in sh bash cat grep sed awk uname dirname ls; do
  ln -s "$(command -v "$tool")" "$tools/$tool"
done
export PATH="$venv/bin:$tools"
if command -v gcc c++ cc g++ cmake >/dev/null 2>&1; then
  echo "check_wheel: a compiler is still on PATH" >&2
  exit 1
fi
python -m pip install --quiet "${wheel}[demo]"
cd "${venv%/*}"
paddle-ipu info
python "$root/examples/digits.py" --epochs 1
echo "check_wheel: ${wheel##*/} installs without a compiler and runs the demo"
