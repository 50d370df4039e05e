"""Quiet by default: the ``paddle-ipu`` command answers --help and --version without
importing Paddle, and a process that uses paddle-ipu shows none of Paddle's own log lines
and warnings unless asked (``PADDLE_IPU_PADDLE_LOGS=1``). A process that never asked for
the IPU keeps them (test_do_no_harm)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

# A glog line as Paddle writes it: severity, date, time, thread, file:line]
GLOG = re.compile(r"^[IWEF]\d{4} [0-9:.]+ +\d+ [\w.]+:\d+\] ", re.M)
# What the user's environment may set to see Paddle's lines itself.
_LOG_VARS = ("GLOG_minloglevel", "GLOG_v", "PYTHONWARNINGS", "PADDLE_IPU_PADDLE_LOGS")


def _run(args: list[str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _LOG_VARS}
    env.update(extra or {})
    return subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=300, check=False,
        cwd=tempfile.gettempdir(),
    )  # fmt: skip


ENTRY = """
import sys
import paddle_ipu_cli
try:
    code = paddle_ipu_cli.main({args!r})
except SystemExit as exit:
    code = exit.code
print("EXIT", code, "paddle" in sys.modules, "paddle_ipu" in sys.modules)
"""


@pytest.mark.parametrize(
    "args", [["--help"], ["-h"], ["--version"], [], ["compile", "--help"], ["serve", "-h"]]
)
def test_help_and_version_answer_without_importing_paddle(args: list[str]) -> None:
    proc = _run([sys.executable, "-c", ENTRY.format(args=args)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    *text, last = proc.stdout.splitlines()
    assert last == "EXIT 0 False False"
    if args == ["--version"]:
        import paddle_ipu

        assert text == [f"paddle-ipu {paddle_ipu.__version__}"]
    else:
        assert text[0].startswith("usage: paddle-ipu")


def test_the_installed_command_is_the_fast_entry() -> None:
    command = shutil.which("paddle-ipu", path=os.path.dirname(sys.executable))
    assert command, "the paddle-ipu command is not installed beside this interpreter"
    proc = _run([command, "--help"])
    assert proc.returncode == 0 and proc.stderr == ""
    from paddle_ipu import cli

    assert proc.stdout == cli.build_parser().format_help()


def test_other_commands_and_usage_errors_run_in_the_package() -> None:
    proc = _run([sys.executable, "-c", ENTRY.format(args=["cache", "ls"])])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "EXIT 0 True True"
    bad = _run([sys.executable, "-c", ENTRY.format(args=["compile", "--nope", "-h"])])
    assert bad.stdout.splitlines()[-1].startswith("EXIT 0 False")  # -h wins, as in argparse


def test_import_paddle_ipu_prints_nothing() -> None:
    proc = _run([sys.executable, "-c", "import paddle_ipu"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout, proc.stderr) == ("", "")


PROGRAM = """
import paddle_ipu
import numpy as np
import paddle

paddle.enable_static()
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [-1, 4], "float32")
    loss = paddle.mean(paddle.static.nn.fc(x, 3))  # Paddle warns (glog) while building fc
    paddle.optimizer.SGD(learning_rate=0.1).minimize(loss)  # and here (a UserWarning)
exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
exe.run(startup)  # Paddle logs its executor's start (glog INFO)
(value,) = exe.run(main, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[loss])
print("LOSS", np.asarray(value).shape)
"""


def test_a_program_on_the_ipu_shows_only_its_own_output() -> None:
    proc = _run([sys.executable, "-c", PROGRAM])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    assert proc.stdout == "LOSS ()\n"


def test_one_switch_shows_paddles_lines() -> None:
    proc = _run([sys.executable, "-c", PROGRAM], {"PADDLE_IPU_PADDLE_LOGS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert GLOG.search(proc.stderr), proc.stderr[-3000:]
    assert "UserWarning" in proc.stderr


def test_glogs_own_variable_rules_when_set() -> None:
    proc = _run([sys.executable, "-c", PROGRAM], {"GLOG_minloglevel": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert GLOG.search(proc.stderr), proc.stderr[-3000:]


def test_first_use_of_the_ipu_quiets_paddle_after_a_plain_import_paddle() -> None:
    # import paddle first (the hook imports paddle_ipu, which changes nothing), then the
    # IPU is used: Paddle's lines stop from that point on.
    code = textwrap.dedent(
        """
        import sys
        import paddle
        paddle.enable_static()
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [-1, 4], "float32")
            y = paddle.mean(paddle.static.nn.fc(x, 3))
        print("BUILT", file=sys.stderr, flush=True)
        import paddle_ipu
        paddle_ipu.IpuStrategy()
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        """
    )
    proc = _run([sys.executable, "-c", code])
    loud = _run([sys.executable, "-c", code], {"PADDLE_IPU_PADDLE_LOGS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert loud.returncode == 0, loud.stderr[-3000:]
    before, after = proc.stderr.split("BUILT\n")
    loud_before, loud_after = loud.stderr.split("BUILT\n")
    # Up to the first use, Paddle's own lines (the fc warning from Paddle 3.2 on) as when
    # paddle-ipu quiets nothing...
    assert _messages(before) == _messages(loud_before)
    # ...and after it, none of the executor's INFO lines Paddle prints otherwise.
    assert GLOG.search(loud_after), loud_after
    assert after == ""


def _messages(stderr: str) -> list[str]:
    """Paddle's glog lines without their time and thread."""
    return [GLOG.sub("", line) for line in stderr.splitlines() if GLOG.match(line)]
