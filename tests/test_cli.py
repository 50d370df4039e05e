from __future__ import annotations

import json

from helpers import run_python

from paddle_ipu import cli


def test_info_json(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["plugin_loaded"] is True
    assert info["ipu_device_count"] >= 1
    assert info["backends"]["host"]["available"] is True
    assert "popart" in info["backends"]


def test_info_text_via_module() -> None:
    proc = run_python("import sys; from paddle_ipu.cli import main; sys.exit(main(['info']))")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plugin loaded by Paddle  yes" in out
    assert "host     available" in out
    assert "popart" in out


def test_python_dash_m() -> None:
    proc = run_python(
        "import runpy, sys\n"
        "sys.argv = ['paddle_ipu', 'info']\n"
        "runpy.run_module('paddle_ipu', run_name='__main__')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "ipu devices" in proc.stdout
