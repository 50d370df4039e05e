"""Every case of the eager-op sweep (eager_sweep.py: 1165 cases over 445 of Paddle's
eager ops) on the ipu place equals Paddle's CPU kernel, except the ops
docs/device.md lists as not running on the ipu device, which raise the error the docs
name. The sweep runs in a fresh interpreter, as a user's script would.

The table is written for Paddle 3.3: on an older supported release, a case that release's
CPU cannot run (an API or a dtype it lacks) must fail alike on the ipu place, and the few
cases docs/device.md lists under "On older Paddle releases" differ as it says."""

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
#: the release the case table is written for: on an older one, a case the CPU refuses
#: (an API or a dtype that release lacks) must be refused on the ipu with the same
#: exception type, and is not compared
TABLE_RELEASE = (3, 3)
#: case -> (the releases before which it differs, its status there): docs/device.md,
#: "On older Paddle releases"
OLDER_RELEASES = {"randint_like": ((3, 1), "wrong_place")}


def _documented(title: str = "What does not run") -> set[str]:
    text = DOCS.read_text()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
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
    release = _release()
    refused = {
        name
        for name, case in items
        if release < TABLE_RELEASE
        and case.get("status") == "cpu_error"
        and case.get("ipu_error_type") == case.get("error_type")
    }
    bad = {
        name: f"{case.get('status')}: {case.get('error_type', '')} "
        f"{case.get('detail') or case.get('error')}"
        f"{'; ipu: ' + str(case.get('ipu_error_type')) if 'ipu_error_type' in case else ''}"
        for name, case in items
        if case.get("status") != "ok" and name not in refused
    }
    for name, (before, status) in OLDER_RELEASES.items():
        if release < before:
            assert name in bad, f"{name} now behaves on Paddle {release}: update docs/device.md"
            assert bad.pop(name).startswith(f"{status}:"), name
    for name, error in DOES_NOT_RUN.items():
        assert name in bad, f"{name} runs on the ipu now: update docs/device.md"
        assert error in bad.pop(name)
    assert not bad, "\n".join(f"{k}: {v}" for k, v in sorted(bad.items()))
    assert result["summary"]["n_cases"] >= 1100
    # (an older release runs fewer of the table's ops: the ones it lacks are refused)
    assert result["coverage"]["n_covered"] >= (440 if release >= TABLE_RELEASE else 425)
    assert set(DOES_NOT_RUN) == _documented()
    assert set(OLDER_RELEASES) == _documented("On older Paddle releases")
    # an older release lacks a few of the table's APIs, not the bulk of them
    assert len(refused) <= 25, sorted(refused)


def _release() -> tuple[int, int]:
    import paddle

    from paddle_ipu._util.paddle_releases import series

    return series(paddle.__version__)
