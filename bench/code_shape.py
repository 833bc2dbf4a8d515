"""The code's shape, as the design holds it: no module over ``MAX_MODULE_LINES`` lines, no
function over ``MAX_FUNCTION_LINES`` (its whole definition, docstring included), no import
circle among the project's modules.

    python bench/code_shape.py            # the figures, and what is over; exit 1 if any
    python bench/code_shape.py --json     # the same as JSON

Counted over ``planner/``, ``reminders/`` and ``worker/`` (not tests, benches, or the
migrations, which are history and never change).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "reminders", "worker")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

__all__ = ["MAX_FUNCTION_LINES", "MAX_MODULE_LINES", "Shape", "measure"]


@dataclass
class Shape:
    """What ``measure`` found: counts, and what is over a limit (``path:lines``,
    ``path:function:lines``, a circle as its modules)."""

    modules: int = 0
    functions: int = 0
    largest_module: str = ""
    largest_function: str = ""
    modules_over: list[str] = field(default_factory=list)
    functions_over: list[str] = field(default_factory=list)
    circles: list[list[str]] = field(default_factory=list)


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, name: str, known: set[str]) -> set[str]:
    """The project modules ``name`` imports anywhere: at module level, under
    ``TYPE_CHECKING`` and inside functions alike (a lazy import that closes a circle still ties
    the two modules' designs together; ``../shared/tools/house.py`` counts them so)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join([*name.split(".")[: -node.level], node.module])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return {m for m in found if m in known and m != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan; recursive, as deep as
    the longest import chain, well under Python's default limit: the limit is process-wide,
    and raising it here would change what the tests in the same process see)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def measure() -> Shape:
    """Count the modules, functions and imports of the project's packages."""
    shape = Shape()
    trees = {_module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in _sources()}
    known = set(trees)
    biggest_module = biggest_function = 0
    for path, tree in trees.values():
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        shape.modules += 1
        if lines > biggest_module:
            biggest_module, shape.largest_module = lines, f"{rel}:{lines}"
        if lines > MAX_MODULE_LINES:
            shape.modules_over.append(f"{rel}:{lines}")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                shape.functions += 1
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > biggest_function:
                    biggest_function = length
                    shape.largest_function = f"{rel}:{node.name}:{length}"
                if length > MAX_FUNCTION_LINES:
                    shape.functions_over.append(f"{rel}:{node.name}:{length}")
    graph = {name: _imports(tree, name, known) for name, (_, tree) in trees.items()}
    shape.circles = _circles(graph)
    return shape


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    shape = measure()
    if args.json:
        print(json.dumps(asdict(shape), indent=2))
    else:
        print(
            f"modules {shape.modules} (largest {shape.largest_module}), functions "
            f"{shape.functions} (largest {shape.largest_function}); over the limits: "
            f"{len(shape.modules_over)} modules > {MAX_MODULE_LINES} lines, "
            f"{len(shape.functions_over)} functions > {MAX_FUNCTION_LINES} lines, "
            f"{len(shape.circles)} import circles"
        )
        for line in [*shape.modules_over, *shape.functions_over]:
            print(f"  {line}")
        for circle in shape.circles:
            print(f"  circle: {' -> '.join(circle)}")
    return 1 if shape.modules_over or shape.functions_over or shape.circles else 0


if __name__ == "__main__":
    sys.exit(main())
