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


# --- the layers -----------------------------------------------------------------------------

MAY_IMPORT: dict[str, set[str]] = {
    # the engines' side: the wire format, the sequencer, sockets (nothing else of the package)
    "engine": set(),
    "config": {"engine"},
    # process plumbing every layer may use: metrics, logging, the heap, the descriptor budget
    "runtime": {"engine", "config"},
    # the contract clients are written against: messages, filters, rendering, the schema
    "protocol": {"engine", "config", "runtime"},
    # the seam: the ordered log, its records, the resume ring, statuses as records
    "log": {"engine", "config", "runtime", "protocol"},
    # the two halves, each knowing only the log between them
    "ingest": {"engine", "config", "runtime", "protocol", "log"},
    "state": {"engine", "config", "runtime", "protocol", "log"},
    "serve": {"engine", "config", "runtime", "protocol", "log", "state"},
    # what composes them: one process, the cluster's roles, the simulated engines
    "simulator": {"engine"},
    "gateway": {"engine", "config", "runtime", "protocol", "log", "ingest", "state", "serve"},
    "cluster": {"engine", "config", "runtime", "protocol", "log", "ingest", "state", "serve"},
    "demo": {"engine", "config", "runtime", "protocol", "log", "serve", "gateway", "simulator"},
    "cli": {"engine", "config", "runtime", "serve", "gateway", "cluster", "demo", "simulator"},
    "__main__": {"cli"},
}
"""Which part of the package each part may import (besides its own folder and ``kvgateway``
itself): one-way, from the engines to the clients, and neither half imports the other."""


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_import_goes_down_the_layers_and_never_between_the_halves() -> None:
    graph = import_graph()
    parts = {part_of(name) for name in graph} - {""}
    assert parts == set(MAY_IMPORT), f"parts without a rule, or rules without a part: {parts ^ set(MAY_IMPORT)}"
    wrong = [
        f"{name} -> {target}"
        for name, targets in sorted(graph.items())
        for target in sorted(targets)
        if part_of(name)
        and part_of(target)
        and part_of(target) != part_of(name)
        and part_of(target) not in MAY_IMPORT[part_of(name)]
    ]
    assert not wrong, "imports against the layers: " + ", ".join(wrong)


def test_the_layer_rule_catches_an_upward_and_a_sideways_import() -> None:
    assert "serve" not in MAY_IMPORT["log"] and "ingest" not in MAY_IMPORT["serve"]
    assert "state" not in MAY_IMPORT["ingest"] and "gateway" not in MAY_IMPORT["cluster"]


# --- composition, not inheritance -------------------------------------------------------------


def _is_stateless_mixin(node: ast.ClassDef) -> bool:
    """``__slots__ = ()`` and nothing but methods, properties and annotations: adds behaviour only."""
    slots = [
        stmt
        for stmt in node.body
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets)
    ]
    return bool(slots) and all(isinstance(s.value, ast.Tuple) and not s.value.elts for s in slots)


def package_classes() -> dict[str, list[ast.ClassDef]]:
    found: dict[str, list[ast.ClassDef]] = {}
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(node)
    return found


def _abstract(node: ast.ClassDef, classes: dict[str, list[ast.ClassDef]]) -> bool:
    """A protocol, an ABC, an exception (a hierarchy of errors is what lets callers catch a kind),
    or a stateless mixin."""
    names = {ast.unparse(base).split("[")[0].rpartition(".")[2] for base in node.bases}
    if names & {"Protocol", "ABC", "Exception", "ValueError", "RuntimeError"} or _is_stateless_mixin(node):
        return True
    return any(_abstract(parent, classes) for name in names for parent in classes.get(name, []) if name != node.name)


def test_no_concrete_class_of_the_package_subclasses_another() -> None:
    classes = package_classes()
    wrong = [
        f"{node.name}({ast.unparse(base)})"
        for nodes in classes.values()
        for node in nodes
        for base in node.bases
        for parent in classes.get(ast.unparse(base).split("[")[0].rpartition(".")[2], [])
        if not _abstract(parent, classes)
    ]
    assert not wrong, "concrete package classes subclassed (compose them instead): " + ", ".join(wrong)
    assert "OneProcess" in classes and "Serving" in classes and "EdgeRole" in classes


# --- the log seam -----------------------------------------------------------------------------


def _is_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A body (its docstring aside) that does nothing: ``pass``, ``...``, ``raise
    NotImplementedError``, or a return of a constant, an empty container or an empty iterator."""
    body = [stmt for stmt in node.body if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))]
    if not body:
        return True
    if len(body) > 1:
        return False
    (stmt,) = body
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Raise):
        return "NotImplementedError" in ast.unparse(stmt)
    if isinstance(stmt, ast.Return):
        value = stmt.value
        empty = ("None", "()", "[]", "{}", "iter(())", "iter([])")
        return value is None or ast.unparse(value) in empty
    return False


def _log_implementations() -> dict[str, ast.ClassDef]:
    """Package classes that implement a side of the log seam: an appender or a log (a concrete
    class with ``append`` taking a record, or with ``follow`` and ``read``)."""
    out = {}
    for name, nodes in package_classes().items():
        for node in nodes:
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)}
            if any(ast.unparse(base).split("[")[0] == "Protocol" for base in node.bases):
                continue
            appends_records = "append" in methods and "record" in [a.arg for a in methods["append"].args.args]
            if appends_records or {"follow", "read"} <= set(methods):
                out[name] = node
    return out


def test_no_log_implementation_stubs_a_method_and_one_ring_log_serves_both_modes() -> None:
    found = _log_implementations()
    assert {"MemoryLog", "Publisher"} <= set(found), sorted(found)
    stubs = [
        f"{name}.{method.name}"
        for name, node in found.items()
        for method in node.body
        if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
        and not method.name.startswith("__")
        and _is_stub(method)
    ]
    assert not stubs, "log implementations with methods that do nothing (narrow the protocol instead): " + ", ".join(
        stubs
    )
    readers = sorted(
        name for name, node in found.items() if any(getattr(m, "name", "") == "holding" for m in node.body)
    )
    assert readers == ["MemoryLog"], f"one ring log for the single process and the edge, not {readers}"


def test_the_stub_check_catches_a_stub() -> None:
    stub = ast.parse('def read(self, after):\n    """Nothing."""\n    return iter(())\n').body[0]
    raising = ast.parse("def holding(self, x):\n    raise NotImplementedError\n").body[0]
    real = ast.parse("def read(self, after):\n    return self.ring.since(after)\n").body[0]
    assert isinstance(stub, ast.FunctionDef) and isinstance(raising, ast.FunctionDef)
    assert isinstance(real, ast.FunctionDef)
    assert _is_stub(stub) and _is_stub(raising) and not _is_stub(real)
