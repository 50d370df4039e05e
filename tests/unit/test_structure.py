"""The package's shape as docs/architecture.md states it: every import runs down the layers
(or to the compiled core), no import cycle (imports inside functions and
importlib.import_module calls included), no Python or C++ file over 800 lines, and the
tree with line counts in docs/architecture.md is the code's."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "paddle_ipu"
#: compiled modules (built by CMake, absent from a source tree)
COMPILED = ("paddle_ipu._core",)

#: The layers, top to bottom, as docs/architecture.md draws them: a module may import
#: modules of its own layer and of the layers below, and the compiled core.  A module
#: belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "entry",
        (
            "paddle_ipu",
            "paddle_ipu.__main__",
            "paddle_ipu.cli",
            "paddle_ipu.cli_shapes",
            "paddle_ipu.patches",
        ),
    ),
    ("Paddle 2.x names", ("paddle_ipu.compat",)),
    ("front doors", ("paddle_ipu.frontends", "paddle_ipu.inference")),
    ("serving", ("paddle_ipu.serving",)),
    ("pipeline entry", ("paddle_ipu.pipeline", "paddle_ipu.checkpoint", "paddle_ipu.distributed")),
    ("options", ("paddle_ipu.strategy",)),
    ("executor", ("paddle_ipu.executor",)),
    ("backends", ("paddle_ipu.backends",)),
    ("compiler", ("paddle_ipu.compiler",)),
    ("option table", ("paddle_ipu.options",)),
    ("tensors", ("paddle_ipu._tensors",)),
    ("seams and device", ("paddle_ipu._internals", "paddle_ipu.device")),
    ("utilities", ("paddle_ipu._util", "paddle_ipu.errors", "paddle_ipu._version")),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    for name in COMPILED:
        found[name] = ROOT / (name.replace(".", "/") + ".so")
    return found


def _imported(node: ast.AST, here: str, modules: dict[str, Path]) -> list[str]:
    """The internal modules one AST node imports (absolute or relative)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split(".")
            is_package = modules[here].name == "__init__.py"
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        return [
            f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names
        ]
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        if name in COMPILED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, name, modules):
                while target and target not in modules:  # an attribute of a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules along it, or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    for start in sorted(edges):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges.get(nxt, ()))))
    return None


def _layer(module: str) -> int:
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "paddle_ipu"
            if (module == prefix or inside) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and to the doc)"
    return best[0]


def _upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
        for a, targets in edges.items()
        for b in targets
        if b not in COMPILED and _layer(b) < _layer(a)
    )


def test_the_layer_checker_finds_an_upward_import() -> None:
    assert _upward({"paddle_ipu.executor.feeds": {"paddle_ipu.frontends.program"}})
    assert not _upward({"paddle_ipu.frontends.program": {"paddle_ipu.executor.feeds"}})
    assert not _upward({"paddle_ipu._util.env": {"paddle_ipu._core"}})


def test_every_import_runs_down_the_layers() -> None:
    upward = _upward(_graph())
    assert not upward, "\n".join(upward)


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_lazy_and_importlib_imports() -> None:
    edges = _graph()
    assert "paddle_ipu.pipeline" in edges["paddle_ipu.frontends.implicit"]  # lazy
    assert "paddle_ipu.patches" in edges["paddle_ipu"]  # importlib.import_module
    assert "paddle_ipu.compat" in edges["paddle_ipu.patches"]  # under TYPE_CHECKING


def test_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_over_800_lines() -> None:
    sources = [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "csrc").rglob("*.cc"),
        *(ROOT / "csrc").rglob("*.h"),
    ]
    long = {
        str(path.relative_to(ROOT)): n
        for path in sources
        if (n := len(path.read_text().splitlines())) > 800
    }
    assert not long, long


def test_the_tree_in_the_architecture_doc_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_tree.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: where a FeedError may be made: the feed contract, the Session protocol's checks of the
#: buffers a session is handed, and the front doors' checks of their own arguments
FEED_ERROR_MODULES = {
    "paddle_ipu.executor.feeds",
    "paddle_ipu.backends.layout",
    "paddle_ipu.frontends.predictor",  # Tensor handles: reshape / copy_from_cpu misuse
    "paddle_ipu.frontends.lod_runner",  # set_lod's sequences: empty, too long for a bucket
    "paddle_ipu.frontends.legacy_predictor",  # run([PaddleTensor]) of the wrong count
    "paddle_ipu.cli",  # --input NAME=file.npy
    "paddle_ipu.distributed",  # shard(name, array) of a script's feed
}


def test_feed_errors_are_made_in_the_feed_contract_and_the_front_doors_only() -> None:
    made = set()
    for name, path in _modules().items():
        if name in COMPILED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "FeedError"
            ):
                made.add(name)
    assert made <= FEED_ERROR_MODULES, sorted(made - FEED_ERROR_MODULES)
    assert "paddle_ipu.executor.feeds" in made  # the checker sees them
