#!/usr/bin/env bash
# The README's command 1 on a fresh clone: an editable install into a new virtual
# environment, then the README's Quickstart saved in the clone's root and run from there
# (it must print its own lines and nothing on stderr), and `paddle-ipu --help`.
# Usage: tools/check_editable.sh   (clones the repository's HEAD)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone --quiet "$repo" "$work/clone"
cd "$work/clone"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
start=$(date +%s)
pip install --quiet -e ".[demo]"
echo "pip install -e .[demo]: $(( $(date +%s) - start )) s"
python - <<'PY'
import re
text = open("README.md").read()
block = re.compile(r"```python\n(.*?)```", re.S).search(text, text.index("## Quickstart"))
open("quickstart.py", "w").write(block.group(1))
PY
python quickstart.py > out.txt 2> err.txt || { cat out.txt err.txt; exit 1; }
if [ -s err.txt ]; then echo "the Quickstart wrote to stderr:"; cat err.txt; exit 1; fi
grep -q "^learned w:" out.txt || { echo "no result line:"; cat out.txt; exit 1; }
cat out.txt
python -c "import paddle_ipu, os; assert os.path.dirname(paddle_ipu.__file__) == os.path.abspath('paddle_ipu'), paddle_ipu.__file__"
paddle-ipu --help > help.txt 2> err.txt
if [ -s err.txt ]; then cat err.txt; exit 1; fi
paddle-ipu info
echo "editable install: ok"
