"""docs/metrics.md and docs/operations.md: links resolve, and the operations guide covers what an
operator needs (the PromQL and the metric names are checked in test_metric_names.py)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.support.deploy import METRICS_DOC, OPERATIONS_DOC, RULES, load_yaml

DOCS = [METRICS_DOC, OPERATIONS_DOC]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        title = re.sub(r"[^\w\- ]", "", title)
        out.add(title.replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_resolve(doc: Path) -> None:
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        assert path.exists(), f"{doc.name}: link to missing {target}"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{doc.name}: no heading for #{anchor} in {path.name}"


def test_operations_covers_every_alert() -> None:
    data = load_yaml(RULES)
    assert isinstance(data, dict)
    names = {rule["alert"] for group in data["groups"] for rule in group["rules"] if "alert" in rule}
    headings = anchors(OPERATIONS_DOC)
    for name in names:
        assert name.lower() in headings, f"docs/operations.md has no runbook section for {name}"
    metrics_doc = METRICS_DOC.read_text(encoding="utf-8")
    for name in names:
        assert f"`{name}`" in metrics_doc, f"docs/metrics.md's alert table lacks {name}"


def test_operations_covers_the_topics() -> None:
    text = OPERATIONS_DOC.read_text(encoding="utf-8")
    for needle in (
        "--kv-events-config",  # the vLLM flag
        "port + r",  # DP port spacing
        "bind = true",  # engines that connect out
        "150 bytes",  # memory per resident block
        "ring_messages",
        "client_queue_bytes",
        "six HTTP/1.1 connections",
        "proxy_buffering off;",
        "http2 on;",
        "/healthz",
        "/readyz",
        "log_format",
        "recovered: false",  # clients after a gateway restart
        "security.md",
    ):
        assert needle in text, f"docs/operations.md does not mention {needle!r}"


def test_protocol_lists_what_each_route_accepts_as_the_code_declares_it() -> None:
    from kvgateway.serve.query import ROUTE_PARAMETERS

    text = (OPERATIONS_DOC.parent / "protocol.md").read_text(encoding="utf-8")
    section = text.split("### What each route accepts", 1)[1].split("\n#", 1)[0]
    documented: dict[str, tuple[str, ...]] = {}
    for routes, accepted in re.findall(r"^\| (`(?:GET|POST) /v1/.+?) \| (`.+`) \|$", section, re.M):
        names = tuple(re.findall(r"`(\w+)`", accepted))
        for route in re.findall(r"`(?:GET|POST) (/v1/\w+)`", routes):
            documented[route] = names
    assert documented == dict(ROUTE_PARAMETERS)


REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "kvgateway"
ARCHITECTURE = REPO / "docs/architecture.md"
MODULE = re.compile(r"`((?:[a-z_]+/)?[a-z_]+\.py)`")


def architecture_section(title: str) -> str:
    """The text of docs/architecture.md from the heading ``## title`` to the next ``## `` heading."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]


def code_block(section: str) -> list[str]:
    """The lines of the section's first fenced code block."""
    return section.split("```", 2)[1].splitlines()[1:]


def module_rows() -> list[tuple[list[str], str]]:
    """The module table: each row's modules (paths under kvgateway/) and its I/O cell."""
    rows = []
    for line in architecture_section("Modules, one concept each").splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows.append((MODULE.findall(cells[0]), cells[-1]))
    return rows


def test_the_architecture_doc_names_every_module_once_and_no_module_that_is_gone() -> None:
    """docs/architecture.md's module table: every module of the package, by its path under
    kvgateway/ (a row may name several), in one row only, and no path that does not exist."""
    table = architecture_section("Modules, one concept each")
    named = [name for modules, _ in module_rows() for name in modules]
    folders = {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    modules = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and p.parent.name not in ("cluster", "simulator")
    }
    assert folders >= {"engine", "ingest", "log", "protocol", "state", "serve", "runtime", "cluster", "simulator"}
    assert modules - set(named) == set(), "modules the table does not describe"
    assert sorted(name for name in set(named) if named.count(name) > 1) == [], "modules in more than one row"
    gone = {name for name in named if not (PACKAGE / name).is_file()}
    assert not gone, f"the table names modules that do not exist: {sorted(gone)}"
    for folder in ("cluster", "simulator"):  # described together in one row each
        assert f"`{folder}/`" in table


IO_MODULES = {"asyncio", "zmq", "starlette", "uvicorn", "nats", "socket", "httpx", "websockets"}


def imported_roots(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports (lazy imports too), absolute imports only."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_modules_the_architecture_doc_calls_io_free_import_no_io() -> None:
    io_free = [name for modules, io in module_rows() if io == "none" for name in modules]
    assert "log/ordered.py" in io_free and "serve/hub.py" in io_free and "protocol/messages.py" in io_free
    doing_io = {name: sorted(imported_roots(PACKAGE / name) & IO_MODULES) for name in io_free}
    assert {name: found for name, found in doing_io.items() if found} == {}, "marked none, but they import I/O"


PATH_LINE = re.compile(r"^(?P<module>[a-z_]+/[a-z_]+\.py)\s{2,}(?P<names>[\w.]+(?:, [\w.]+)*)(?:\s{2,}|$)")
PATH_ORDER = ["engine", "ingest", "log", "protocol", "state", "serve"]


def test_the_architecture_doc_draws_a_batchs_path_through_each_module_once() -> None:
    """The drawing of a batch's path names modules that exist, each once, package by package from
    the engine to the client's session, and beside each only names that module defines."""
    lines = code_block(architecture_section("A batch's path, from the socket to a client's frame"))
    named = [line for line in lines if re.match(r"[a-z_]+/[a-z_]+\.py\b", line)]
    steps = [m for line in named if (m := PATH_LINE.match(line))]
    assert len(steps) == len(named), "a module's line is not: module, two spaces, its names, two spaces, what"
    modules = [step["module"] for step in steps]
    assert len(modules) >= 15 and len(set(modules)) == len(modules), modules
    folders = [module.split("/")[0] for module in modules]
    assert list(dict.fromkeys(folders)) == PATH_ORDER, "the packages out of the path's order"
    assert modules[0] == "engine/sockets.py" and modules[-1] == "serve/sessions.py"
    for step in steps:
        module = importlib.import_module("kvgateway." + step["module"].removesuffix(".py").replace("/", "."))
        for name in step["names"].split(", "):
            holder: object = module
            for part in name.split("."):
                assert hasattr(holder, part), f"{step['module']} defines no {name}"
                holder = getattr(holder, part)


def test_the_architecture_doc_draws_the_import_rules_of_the_structure_test() -> None:
    from tests.unit.test_structure import MAY_IMPORT

    drawn = {}
    for line in code_block(architecture_section("What may import what")):
        part, arrow, targets = line.partition("->")
        if arrow:
            names = targets.split("}")[0].strip()
            drawn[part.strip()] = set() if names.startswith("(") else {t.strip() for t in names.split(",")}
    assert drawn == MAY_IMPORT


def test_the_readme_layout_names_every_folder_of_the_package_and_the_repository() -> None:
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "README.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout") : text.index("## Dependencies")]
    package = repo / "kvgateway"
    folders = {p.parent.name for p in package.rglob("__init__.py") if p.parent != package}
    missing = sorted(f for f in folders if f"  {f}/" not in layout)
    assert not missing, f"package folders the README's layout leaves out: {missing}"
    for top in ("kvgateway/", "static/", "tests/", "bench/", "deploy/", "docs/", "examples/"):
        assert (repo / top).is_dir() and f"\n{top}" in layout, top
