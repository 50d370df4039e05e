"""The option tables of docs/strategy.md say what strategy.py does: every row's type, host
classification and range are those of the registry, every option listed as unsupported is
refused by the host backend when set, and every option listed as honoured or ignored is
accepted.  Options the docs single out are compiled and run on the host to show it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from support.helpers import fresh_programs  # noqa: E402

import paddle_ipu  # noqa: E402
from paddle_ipu import backends  # noqa: E402
from paddle_ipu.backends.base import SessionConfig  # noqa: E402
from paddle_ipu.errors import NotSupportedError  # noqa: E402
from paddle_ipu.options import OPTIONS, OptionSpec  # noqa: E402

HOST = backends.support("host")


def _check_host(s: Any) -> None:
    """What the executor does before it makes a host session."""
    config = SessionConfig(options=s.values(), explicit=s.explicit_options())
    backends.check_support("host", config)


DOCS = Path(__file__).resolve().parents[2] / "docs"
_ROW = re.compile(
    r"^\| `(?P<name>[^`]+)` \| (?P<type>\w+) \| (?P<default>.*?) \| (?P<host>.*?) "
    r"\| (?P<meaning>.*) \|$"
)


def _rows() -> dict[str, dict[str, str]]:
    rows: dict[str, dict[str, str]] = {}
    for line in (DOCS / "strategy.md").read_text().splitlines():
        match = _ROW.match(line)
        if match and match["name"] in OPTIONS:
            assert match["name"] not in rows, f"{match['name']} is listed twice"
            rows[match["name"]] = match.groupdict()
    return rows


ROWS = _rows()


def _non_default(spec: OptionSpec) -> Any:
    """A valid value other than the default, of the option's type."""
    if spec.type == "bool":
        return not spec.default
    if spec.type == "vector":
        return {
            "custom_ops": [{"paddle_op": "my_op"}],
            "dot_checks": ["Fwd0"],
            "hardware_instrumentations": [1],
        }.get(spec.name, ["file.cpp"])
    if spec.name == "accumulation_and_replication_reduction_type":
        return 0  # Sum (NoReduction has its own test)
    if spec.enum is not None:
        return (int(spec.default) + 1) % len(spec.enum)
    if spec.choices is not None:
        return next(c for c in spec.choices if c != spec.default)
    if spec.type == "uint64":
        return 2 if spec.default in (None, 1) else int(spec.default) + 1
    if spec.type == "double":
        if spec.maximum is not None and spec.maximum <= 1.0:
            return 0.5 if spec.default != 0.5 else 0.25
        return float(spec.default) + 1.0
    if spec.type == "string":
        return "x"
    if spec.group == "popart.location":
        return {"on_chip": 1 - spec.default["on_chip"]}
    if spec.name == "replicated_collectives_settings":
        return {"merge_all_reduce_collectives": True}
    if spec.name == "accumulate_outer_fragment":
        return {2: []}
    if spec.type == "map":
        return {"some.option": "1"}
    if spec.type == "callable":
        return lambda progress, total: None
    raise AssertionError(spec.name)


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def test_every_option_has_exactly_one_row() -> None:
    assert sorted(ROWS) == sorted(OPTIONS)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_row_type_host_and_range_are_the_registry_s(name: str) -> None:
    spec, row = OPTIONS[name], ROWS[name]
    assert row["type"] == spec.type
    host = row["host"].split(" (", 1)[0]
    assert host == HOST.status(name), (
        f"{name}: docs say {host!r}, the host backend says {HOST.status(name)!r}"
    )
    bounds = []
    if spec.minimum is not None:
        bounds.append(f"{'>' if spec.minimum_exclusive else '>='} {_number(spec.minimum)}")
    if spec.maximum is not None:
        bounds.append(f"<= {_number(spec.maximum)}")
    documented = re.search(r"Range: ([^.]*(?:\.\d[^.]*)*)\.", row["meaning"])
    if bounds:
        assert documented is not None, f"{name}: the range is not documented"
        # A bracketed reason may follow the bounds.
        assert documented.group(1).split(" (")[0] == ", ".join(bounds), name
    elif spec.type in ("uint64", "double") and spec.enum is None:
        assert documented is None, f"{name}: documents a range strategy.py does not check"


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_host_backend_refuses_exactly_the_options_listed_as_unsupported(name: str) -> None:
    spec = OPTIONS[name]
    s = paddle_ipu.IpuStrategy()
    s.set_options({name: _non_default(spec)})
    assert s.changed_options(), name
    if HOST.status(name) == "unsupported":
        with pytest.raises(NotSupportedError, match=re.escape(name)):
            _check_host(s)
    else:
        _check_host(s)


def test_no_reduction_is_refused_as_its_row_says() -> None:
    row = ROWS["accumulation_and_replication_reduction_type"]
    assert "NoReduction is unsupported" in row["host"]
    s = paddle_ipu.IpuStrategy()
    s.set_options({"accumulation_and_replication_reduction_type": "NoReduction"})
    with pytest.raises(NotSupportedError, match="NoReduction"):
        _check_host(s)


def _mlp_strategy(options: dict[str, Any], fp16: bool = False) -> tuple[Any, Any, Any]:
    with fresh_programs(5) as (main, startup, scope):
        x = paddle.static.data("x", [-1, 8], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        out = paddle.static.nn.fc(paddle.tanh(paddle.static.nn.fc(x, 16)), 1)
        loss = paddle.mean((out - y) ** 2)
        paddle.optimizer.Adam(0.01).minimize(loss)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    s = paddle_ipu.IpuStrategy()
    s.set_graph_config(is_training=True, micro_batch_size=4)
    s.set_precision_config(enable_fp16=fp16)
    s.set_options({"backend": "host", **options})
    cp = paddle_ipu.IpuCompiledProgram(main, scope=scope, ipu_strategy=s)
    return cp.compile(["x", "y"], [loss]), scope, cp


def _losses(options: dict[str, Any], fp16: bool = False, steps: int = 3) -> np.ndarray:
    prog, scope, _ = _mlp_strategy(options, fp16)
    rng = np.random.default_rng(0)
    exe = paddle.static.Executor(paddle.CustomPlace("ipu", 0))
    out = []
    with paddle.static.scope_guard(scope):
        for _ in range(steps):
            x = rng.standard_normal((4, 8)).astype("float32")
            feed = {"x": x, "y": np.tanh(x[:, :1])}
            out.append(float(np.asarray(exe.run(prog, feed=feed, fetch_list=prog.fetch_names)[0])))
    return np.array(out)


@pytest.mark.parametrize(
    "options",
    [
        {"enable_non_stable_softmax": True},
        {"location_activation": {"on_chip": 0}},
        {"enable_outlining": False},
    ],
    ids=["non_stable_softmax", "activations_off_chip", "no_outlining"],
)
def test_options_documented_as_ignored_run_with_unchanged_results(options: dict[str, Any]) -> None:
    """Listed as ignored: they run, and the host's results do not move."""
    assert all(ROWS[k]["host"].startswith("ignored") for k in options)
    for fp16 in (False, True):
        np.testing.assert_array_equal(_losses(options, fp16), _losses({}, fp16))


@pytest.mark.parametrize(
    "options",
    [{"weight_decay_mode": "decay"}, {"accl1_type": "FLOAT16"}],
    ids=["weight_decay_mode", "fp16_optimizer_state"],
)
def test_options_documented_as_unsupported_are_refused_at_compile(options: dict[str, Any]) -> None:
    assert all(ROWS[k]["host"].startswith("unsupported") for k in options)
    (name,) = options
    with pytest.raises(NotSupportedError, match=re.escape(name)):
        _mlp_strategy(options, fp16=True)


# How prose names the options whose classification the docs once contradicted.
_PHRASES = {
    "enable_stochastic_rounding": ("stochastic rounding", "enable_stochastic_rounding"),
    "enable_half_partial": ("half partials", "float16 partials", "enable_half_partial"),
    "accl1_type": ("float16 optimizer state", "accl1_type", "accl*_type"),
    "loss_scaling": ("loss scaling", "loss_scaling"),
    "enable_non_stable_softmax": ("non-stable softmax", "enable_non_stable_softmax"),
}
_SAYS = {
    "unsupported": re.compile(r"\brefuse[sd]?\b|\braises?\b|NotSupportedError|\bunsupported\b"),
    "ignored": re.compile(r"\bignored\b|\bno effect\b|\bnot applied\b|\bcancels? out\b"),
}


def _sentences(text: str) -> list[str]:
    prose = [line for line in text.splitlines() if not line.lstrip().startswith("|")]
    return [p for p in re.split(r"(?<=[.])\s+|\n\s*[-*] ", "\n".join(prose)) if p.strip()]


@pytest.mark.parametrize(
    "doc", [*sorted(p.name for p in DOCS.glob("*.md")), "README.md"], ids=lambda d: d
)
def test_prose_agrees_with_the_table_on_contested_options(doc: str) -> None:
    """A sentence that names one of these options and says what the host does with it
    says what its table row says, and never both (refused and ignored) at once."""
    path = DOCS.parent / doc if doc == "README.md" else DOCS / doc
    for sentence in _sentences(path.read_text()):
        flat = " ".join(sentence.lower().split())
        says = {kind for kind, pattern in _SAYS.items() if pattern.search(sentence)}
        for name, phrases in _PHRASES.items():
            if not any(p in flat for p in phrases):
                continue
            where = f"{doc}: {flat!r}"
            assert len(says) <= 1, f"{where} calls {name} both refused and ignored"
            assert not says or says == {HOST.status(name)}, (
                f"{where} calls {name} {says.pop()}; the host backend: {HOST.status(name)}"
            )
