"""Write the source tree with line counts into docs/architecture.md.

The block between the markers ``<!-- tree -->`` and ``<!-- /tree -->`` lists every
source file of the package, the top-level modules, the C++ parts and the CMake files
with its line count; tests/e2e/test_docs_claims.py fails when the block is stale.

Usage: python tools/gen_tree.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- tree -->", "<!-- /tree -->"
#: what the tree shows: (folder, the file suffixes listed)
SOURCES = (
    ("paddle_ipu", (".py", ".pyi")),
    ("toplevel", (".py", ".pth")),
    ("csrc", (".cc", ".h", ".map")),
    ("cmake", (".cmake",)),
)


def files() -> list[Path]:
    found = []
    for folder, suffixes in SOURCES:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in suffixes and "__pycache__" not in path.parts:
                found.append(path.relative_to(ROOT))
    return found


def tree() -> str:
    lines = ["```"]
    for path in files():
        count = len((ROOT / path).read_text().splitlines())
        lines.append(f"{count:5d}  {path.as_posix()}")
    lines.append("```")
    return "\n".join(lines)


def render(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{tree()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python tools/gen_tree.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
