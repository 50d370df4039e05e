"""The registry of what paddle-ipu changes in Paddle (paddle_ipu/patches.py), checked in
fresh interpreters against Paddle's own objects: what ``import paddle_ipu`` changes is
what the registry says is in effect, undoing everything gives Paddle's own functions
back, ``paddle-ipu info`` lists every entry, and no module but the registry applies an
import-time patch."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from support.helpers import run_python

import paddle_ipu
from paddle_ipu import patches

PACKAGE = Path(paddle_ipu.__file__).parent

# Paddle's objects the patches replace, read before paddle_ipu is imported (the import
# hook is off: the first part of the probe is stock Paddle).
_PROBE = r"""
import json, sys
import paddle
import paddle.static.pir_io as pir_io
from paddle.tensor import linalg
def objects():
    return {
        "Executor.run": paddle.static.Executor.run,
        "pir_io.set_var": pir_io.set_var,
        "lstsq": linalg.lstsq,
        "IpuStrategy": getattr(paddle.static, "IpuStrategy", None),
        "is_compiled_with_ipu": paddle.is_compiled_with_ipu,
        "Value.name": paddle.pir.Value.__dict__["name"],
    }
stock = objects()
import paddle_ipu
from paddle_ipu import patches
after = objects()
report = {p["name"]: p["active"] for p in patches.report()}
patches.undo()
undone = objects()
report_undone = {p["name"]: p["active"] for p in patches.report()}
print(json.dumps({
    "changed": sorted(k for k in stock if stock[k] is not after[k]),
    "restored": sorted(k for k in stock if stock[k] is undone[k]),
    "report": report,
    "report_undone": report_undone,
}))
"""


def test_the_import_applies_what_the_registry_lists_and_undo_gives_paddle_back() -> None:
    proc = run_python(_PROBE, env={"PADDLE_IPU_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    every = ["Executor.run", "IpuStrategy", "Value.name", "is_compiled_with_ipu", "lstsq"]
    assert out["changed"] == sorted([*every, "pir_io.set_var"])
    assert out["restored"] == sorted([*every, "pir_io.set_var"])
    report = out["report"]
    for name in (
        "Paddle's warnings",
        "Paddle's log level",
        "ipu kernels",
        "lstsq's refusal explained",
        "paddle.static.load onto ipu scopes",
        "launcher's devices",
        "exe.run",
        "Paddle 2.x names",
        "dy2static switch",
    ):
        assert report[name] is True, name
        if name != "ipu kernels":  # Paddle cannot unregister kernels (the entry says so)
            assert out["report_undone"][name] is False, name
    assert report["import hook"] is False  # PADDLE_IPU_AUTOLOAD=0
    assert report["dy2static Layers"] is False  # first use only


def test_the_import_hooks_import_changes_no_logging() -> None:
    proc = run_python(
        "import json, paddle\n"
        "from paddle_ipu import patches\n"
        "print(json.dumps({p['name']: p['active'] for p in patches.report()}))\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["import hook"] is True
    assert report["exe.run"] is True
    assert report["Paddle's log level"] is False  # the user asked nothing of the IPU


def test_paddle_ipu_info_lists_every_patch() -> None:
    proc = run_python(
        "import sys; from paddle_ipu.cli import main; sys.exit(main(['info', '--json']))"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout)
    assert [p["name"] for p in info["patches"]] == [p.name for p in patches.PATCHES]
    for p in info["patches"]:
        assert p["changes"] and p["why"] and p["when"] in ("import hook", "import", "first use")


def test_only_the_registry_applies_an_import_time_patch() -> None:
    """The functions the registry applies at import are called nowhere else."""
    applied = {"install", "quiet_paddle_warnings", "register_kernels", "explain_ipu_refusals"}
    applied |= {"keep_custom_place_on_load", "hide_ipu_from_launcher"}
    callers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "patches.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in applied:
                callers.append(f"{path.relative_to(PACKAGE)}: {ast.unparse(node)}")
    # compat installs its Value.name reading and Operation._set_attr as part of its own
    # install(); the first use
    # of the IPU quiets Paddle's warnings with its log level (the entry says so)
    assert sorted(callers) == [
        "_internals/paddle_logs.py: quiet_paddle_warnings()",
        "compat/__init__.py: names.install(_replace)",
        "compat/__init__.py: op_attrs.install(_replace)",
    ], callers
