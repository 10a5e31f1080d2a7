"""docs/metrics.md and docs/operations.md: links resolve, and the operations guide covers what an
operator needs (the PromQL and the metric names are checked in test_metric_names.py)."""

from __future__ import annotations

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


def test_the_architecture_doc_names_every_module_and_no_module_that_is_gone() -> None:
    """docs/architecture.md's module table: every module of the package, by its path under
    kvgateway/ (a folder's own table row may name several), and no path that does not exist."""
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "docs/architecture.md").read_text(encoding="utf-8")
    table = text[text.index("## Modules, one concept each") : text.index("## What may import what")]
    named = set(re.findall(r"`((?:[a-z_]+/)?[a-z_]+\.py)`", table))
    package = repo / "kvgateway"
    folders = {p.parent.name for p in package.rglob("__init__.py") if p.parent != package}
    modules = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and p.parent.name not in ("cluster", "simulator")
    }
    assert folders >= {"engine", "ingest", "log", "state", "serve", "runtime", "cluster", "simulator"}
    assert modules - named == set(), "modules the table does not describe"
    gone = {name for name in named if not (package / name).is_file()}
    assert not gone, f"the table names modules that do not exist: {sorted(gone)}"
    for folder in ("cluster", "simulator"):  # described together in one row each
        assert f"`{folder}/`" in table


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
