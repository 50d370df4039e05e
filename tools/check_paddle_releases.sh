#!/usr/bin/env bash
# paddle-ipu on other supported PaddlePaddle releases than the one the main environment
# holds. For each VERSION: a new virtual environment with paddlepaddle==VERSION, then
# `pip install ".[test]"` with pip's defaults (an isolated build, which must compile
# against that Paddle and keep it), the private-interface probes, and the fast test tier's
# tests that read Paddle (`pytest -m "not slow"`, below) with that environment's pytest.
#
#   tools/check_paddle_releases.sh [--fetch-only] [VERSION...]     (default: 3.2.2)
#
# Every wheel installed comes from one folder (PADDLE_IPU_RELEASE_WHEELS, default
# build/paddle-releases), filled by one `pip download` per VERSION: the installs here, and
# tests/e2e/test_paddle_releases.py after them, run with --no-index and download nothing.
# --fetch-only fills the folder and stops. Run it with the Python of an environment
# paddle-ipu is installed in (CI's .venv): paddle-ipu's requirements are read from that
# installation, its build requirements from pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
fetch_only=0
if [ "${1:-}" = "--fetch-only" ]; then
  fetch_only=1
  shift
fi
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.2.2)
wheels=${PADDLE_IPU_RELEASE_WHEELS:-$root/build/paddle-releases}
mkdir -p "$wheels"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# What an install of ".[test]" needs besides Paddle: the build requirements, paddle-ipu's
# own requirements (Paddle's left out: each VERSION brings its own) and the test extra.
python - "$work/requirements.txt" <<'PY'
import importlib.metadata as metadata
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    lines = list(tomllib.load(f)["build-system"]["requires"])
for requirement in metadata.requires("paddle-ipu") or []:
    name, _, marker = requirement.partition(";")
    if name.strip().lower().startswith("paddlepaddle"):
        continue
    if not marker or 'extra == "test"' in marker:
        lines.append(name.strip())
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
PY

for version in "${versions[@]}"; do
  start=$(date +%s)
  python -m pip download --quiet --dest "$wheels" "paddlepaddle==$version" -r "$work/requirements.txt"
  echo "check_paddle_releases: wheels for PaddlePaddle $version in $wheels ($(( $(date +%s) - start )) s)"
done
[ "$fetch_only" = 0 ] || exit 0

# The checkout's files (tracked and new, not ignored), so that pip's in-place build of a
# local folder leaves this tree's build folder alone.
git ls-files -co --exclude-standard -z | xargs -0 tar -cf "$work/src.tar"

for version in "${versions[@]}"; do
  start=$(date +%s)
  venv="$work/venv-$version"
  src="$work/src-$version"
  mkdir -p "$src"
  tar -xf "$work/src.tar" -C "$src"
  python3 -m venv "$venv"
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels"
  "$venv/bin/pip" install --quiet "paddlepaddle==$version"
  "$venv/bin/pip" install --quiet "$src[test]"
  unset PIP_NO_INDEX PIP_FIND_LINKS
  installed=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('paddlepaddle'))")
  if [ "$installed" != "$version" ]; then
    echo "check_paddle_releases: pip replaced PaddlePaddle $version with $installed" >&2
    exit 1
  fi
  echo "check_paddle_releases: PaddlePaddle $version kept, paddle-ipu built against it ($(( $(date +%s) - start )) s)"
  (cd "$work" && "$venv/bin/python" -m paddle_ipu._internals)
  start=$(date +%s)
  # The fast tier's tests that read Paddle: its programs translated (the compiler, the
  # ops, control flow, the zoo, open shapes, the old formats, the 2.x idioms), the ops
  # against its CPU kernels (eager and static), its predictor and Config, training
  # against its CPU training and optimizer kernels, its private interfaces (the probes)
  # and the plugin's do-no-harm (the device, the patches, the launcher, its log lines).
  # Left out, as they read nothing of Paddle or only what the tests kept compile (about
  # 13% of the fast tier's time, measured per file with --durations=0): the serving
  # front end and queue (C++ over HTTP and gRPC, the clients' protocols, the container's
  # command, the model runtime's batching, ONNX Runtime's shared arena), the popart
  # adapter against its doubles and the Session contract (graphs built in ONNX), the
  # compiled core's fp16 kernels and arrays against numpy and its aarch64 cross-compile,
  # the option registry and its docs tables, shape buckets, loop bounds (ONNX Runtime's
  # Loop), the source tree's layering, and the tagger's 4-sentence requests beside its
  # 1- and 2-sentence ones.
  skip=(
    --ignore-glob='tests/e2e/test_serving_*' --ignore-glob='tests/unit/test_serving_*'
    --ignore=tests/e2e/test_deploy.py --ignore=tests/conformance/test_model_runtime.py
    --ignore=tests/conformance/test_host_memory.py
    --ignore=tests/contract/test_popart_adapter.py --ignore=tests/contract/test_popef_adapter.py
    --ignore=tests/contract/test_registry.py --ignore=tests/contract/test_session_contract.py
    --ignore=tests/unit/test_core_fp16.py --ignore=tests/unit/test_core_stub.py
    --ignore=tests/unit/test_arrays.py --ignore=tests/e2e/test_shipping.py
    --ignore=tests/unit/test_strategy.py --ignore=tests/unit/test_options.py
    --ignore=tests/unit/test_executor_config.py --ignore=tests/e2e/test_docs.py
    --ignore=tests/unit/test_shape_buckets.py --ignore=tests/unit/test_loop_bounds.py
    --ignore=tests/unit/test_tail_input.py --ignore=tests/unit/test_structure.py
    --deselect='tests/conformance/test_old_format.py::test_a_bigru_crf_tagger_runs_sentences_in_buckets_as_paddle_inference_does[predictor-4]'
  )
  (cd "$root" && "$venv/bin/pytest" -q -m "not slow" -p no:cacheprovider "${skip[@]}")
  echo "check_paddle_releases: fast tier on PaddlePaddle $version: $(( $(date +%s) - start )) s"
  rm -rf "$venv" "$src"
done
