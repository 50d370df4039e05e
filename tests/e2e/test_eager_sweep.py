"""Every case of the eager-op sweep (eager_sweep.py: 1165 cases over 445 of Paddle's
eager ops) on the ipu place equals Paddle's CPU kernel, except the ops
docs/device.md lists as not running on the ipu device, which raise the error the docs
name. The sweep runs in a fresh interpreter, as a user's script would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs" / "device.md"

#: case -> the exception its ipu run raises (docs/device.md, "What does not run")
DOES_NOT_RUN = {"linalg.lstsq": "NotSupportedError"}


def _documented() -> set[str]:
    text = DOCS.read_text()
    section = text.split("## What does not run", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def test_every_swept_op_equals_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    env = dict(os.environ, GLOG_minloglevel="2")
    proc = subprocess.run(
        [sys.executable, str(HERE / "eager_sweep.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    cases = result["cases"]
    items = cases.items() if isinstance(cases, dict) else [(c["name"], c) for c in cases]
    bad = {
        name: f"{case.get('status')}: {case.get('error_type', '')} "
        f"{case.get('detail') or case.get('error')}"
        for name, case in items
        if case.get("status") != "ok"
    }
    for name, error in DOES_NOT_RUN.items():
        assert name in bad, f"{name} runs on the ipu now: update docs/device.md"
        assert error in bad.pop(name)
    assert not bad, "\n".join(f"{k}: {v}" for k, v in sorted(bad.items()))
    assert result["summary"]["n_cases"] >= 1100
    assert result["coverage"]["n_covered"] >= 440
    assert set(DOES_NOT_RUN) == _documented()
