"""The package's shape: no import loop inside kvgateway, no function over 60 lines outside the
declarative tables. Read from the source with ``ast``, so a lazy import inside a function counts
as much as one at the top."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvgateway"

MAX_FUNCTION_LINES = 60

DECLARATIVE = {
    "kvgateway/simulator/cli.py::add_arguments",  # the simulator's argument table
    "kvgateway/runtime/metrics.py::Metrics.__init__",  # the metric catalogue
}
"""Functions that are tables, allowed to be longer."""


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The kvgateway modules ``name`` imports (anywhere in the file, lazily or not)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # "from kvgateway import wire" imports the module kvgateway.engine.wire
            targets = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known] or [base]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    # A package's __init__ imports what it re-exports; importing a submodule runs the __init__
    # first, but that is Python's order, not a dependency of the submodule: leave it out.
    return {
        name: imports_of(name, path, known) - {p for p in known if name.startswith(p + ".")}
        for name, path in mods.items()
    }


def test_no_import_loop_inside_the_package() -> None:
    graph = import_graph()
    assert "kvgateway.ingest.outlet" in graph and "kvgateway.engine.wire" in graph["kvgateway.ingest.outlet"]
    cycle = find_cycle(graph)
    assert cycle is None, "import loop: " + " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")


def test_no_function_over_60_lines_outside_the_tables() -> None:
    long = []
    seen = set()
    for path in modules().values():
        where = path.relative_to(PACKAGE.parent).as_posix()
        for name, node in functions(ast.parse(path.read_text(encoding="utf-8"))):
            key = f"{where}::{name}"
            seen.add(key)
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and key not in DECLARATIVE:
                long.append(f"{key} ({lines} lines)")
    assert not long, "functions over 60 lines: " + ", ".join(long)
    assert seen >= DECLARATIVE, f"allow-list names functions that are gone: {sorted(DECLARATIVE - seen)}"
