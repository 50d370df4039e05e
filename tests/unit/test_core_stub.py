"""paddle_ipu/_core.pyi, the type stub mypy reads for the compiled core, names what the
built module holds: every public function, class and attribute, and every public member
of each class, no more and no less."""

from __future__ import annotations

import ast
from pathlib import Path

from paddle_ipu import _core

STUB = Path(__file__).resolve().parents[2] / "paddle_ipu" / "_core.pyi"


def _public(names: object) -> set[str]:
    return {n for n in names if not n.startswith("__") and n != "_pybind11_conduit_v1_"}  # type: ignore[attr-defined]


def _stub() -> tuple[set[str], dict[str, set[str]]]:
    tree = ast.parse(STUB.read_text())
    top: set[str] = set()
    members: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        if isinstance(node, ast.ClassDef):
            members[node.name] = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[node.name].add(item.name)
                elif isinstance(item, ast.Assign):
                    members[node.name].update(t.id for t in item.targets if isinstance(t, ast.Name))
    return top, members


def test_the_stub_names_every_public_name_of_the_core() -> None:
    top, _ = _stub()
    assert _public(top) == _public(dir(_core))


def test_the_stub_names_every_public_member_of_each_class() -> None:
    _, members = _stub()
    for name, declared in members.items():
        cls = getattr(_core, name)
        built = _public(vars(cls))
        if name == "RequestState":  # pybind11 enums add their own helpers
            built = {m for m in built if m.isupper()}
            declared = {m for m in declared if m.isupper()}
        assert _public(declared) == built, name
