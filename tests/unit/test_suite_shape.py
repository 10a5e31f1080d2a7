"""The test suite's own shape: its helpers live in tests/support, one of each. Outside it, no
module polls by hand (a loop that sleeps against a ``time.monotonic()`` deadline: that is
:func:`tests.support.wait_until` / :func:`tests.support.until`) and none parses /metrics (that
is :func:`tests.support.scrape`). Read with ``ast``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
SUPPORT = TESTS / "support"

SLEEPS = {"sleep", "wait_for_timeout"}
"""Calls that pause a loop: ``time.sleep``, ``asyncio.sleep``, Playwright's ``page.wait_for_timeout``."""

METRICS_PARSERS = {"prometheus_client.parser", "text_string_to_metric_families"}


def suite_modules() -> Iterator[Path]:
    for path in sorted(TESTS.rglob("*.py")):
        if SUPPORT not in path.parents:
            yield path


def _name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        base = func.value.id if isinstance(func.value, ast.Name) else ""
        return f"{base}.{func.attr}"
    return func.id if isinstance(func, ast.Name) else ""


def _clocked(node: ast.AST) -> bool:
    """Whether ``node`` reads the clock: ``time.monotonic()`` or a name with ``deadline`` in it."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and _name(sub) == "time.monotonic":
            return True
        if isinstance(sub, ast.Name) and "deadline" in sub.id:
            return True
    return False


def _inside(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a loop's body, not looking into the functions it defines."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield child
            yield from _inside(child)


def hand_polls(tree: ast.AST) -> list[int]:
    """Lines of the ``while`` loops that poll by hand: they sleep between tries, and they either
    leave when a condition holds (``return``/``break``, or their test) under a clock bound, or fail on the clock
    (an ``assert`` or an ``if`` on ``time.monotonic()``/a deadline that raises). A loop that
    watches a condition *hold* for a while, or paces requests, leaves only on the clock, raising
    nothing on it: that is a scenario, not a wait."""
    found = []
    for loop in ast.walk(tree):
        if not isinstance(loop, ast.While):
            continue
        body = list(_inside(loop))
        if not any(isinstance(n, ast.Call) and _name(n).rpartition(".")[2] in SLEEPS for n in body):
            continue
        leaves = any(isinstance(n, ast.Return | ast.Break) for n in body)
        fails_on_clock = any(isinstance(n, ast.Assert) and _clocked(n.test) for n in body) or any(
            isinstance(n, ast.If) and _clocked(n.test) and any(isinstance(r, ast.Raise) for r in ast.walk(n))
            for n in body
        )
        # ``while <clock> and not <condition>``: it leaves when the condition holds, from its test
        tried = isinstance(loop.test, ast.BoolOp) and any(not _clocked(value) for value in loop.test.values)
        if fails_on_clock or ((leaves or tried) and _clocked(loop)):
            found.append(loop.lineno)
    return found


def metrics_parsing(tree: ast.AST) -> list[int]:
    """Lines that import prometheus_client's exposition parser."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = {node.module, *(f"{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        else:
            continue
        if names & METRICS_PARSERS:
            found.append(node.lineno)
    return found


def offences(rule: object) -> list[str]:
    out = []
    for path in suite_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out += [f"{path.relative_to(TESTS.parent)}:{line}" for line in rule(tree)]  # type: ignore[operator]
    return out


def test_no_test_module_polls_by_hand() -> None:
    assert offences(hand_polls) == [], "poll with tests.support's wait_until / until"


def test_no_test_module_parses_metrics_itself() -> None:
    assert offences(metrics_parsing) == [], "scrape with tests.support.scrape (or GatewayProcess.samples)"


def test_the_rules_see_what_they_forbid() -> None:
    poll = """
import asyncio, time
async def f(done):
    deadline = time.monotonic() + 5
    while not done():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
def g(page, done):
    limit = time.monotonic() + 5
    while time.monotonic() < limit and not done():
        page.wait_for_timeout(100)
"""
    assert hand_polls(ast.parse(poll)) == [5, 10]
    pacing = """
import time
def f(n, check):
    for _ in range(n):
        time.sleep(1.0)
    while reading():
        sock.poll(time.monotonic())
    end = time.monotonic() + 5
    while time.monotonic() < end:
        assert check()
        time.sleep(0.2)
"""
    assert hand_polls(ast.parse(pacing)) == []
    assert metrics_parsing(ast.parse("from prometheus_client.parser import text_string_to_metric_families")) == [1]
    assert metrics_parsing(ast.parse("from prometheus_client import generate_latest")) == []


def test_make_tests_scheduler_keeps_the_web_folder_on_one_worker_and_hands_out_every_other_file() -> None:
    """The web folder's gateways are package-scoped: its files go to one worker, as one unit."""
    from tests.conftest import scope_of

    web = sorted(path.name for path in (TESTS / "integration" / "web").glob("test_*.py"))
    assert len(web) >= 5
    assert {scope_of(f"tests/integration/web/{name}::test_a[x-1]") for name in web} == {"tests/integration/web/"}
    assert scope_of("tests/integration/test_backlog.py::test_b") == "tests/integration/test_backlog.py"
    assert scope_of("tests/cluster/test_cluster_web.py::test_c[1]") == "tests/cluster/test_cluster_web.py"
    assert scope_of("tests/unit/serve/test_hub.py::Test::test_d") == "tests/unit/serve/test_hub.py"


def test_the_port_finder_never_hands_out_a_port_it_just_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's free pick for port 0 can repeat the one it gave a moment ago (nothing bound it
    yet): a test asking for a publish and a replay port got one for both. The finder skips the ports
    it handed out last."""
    from tests.support import ports

    picks = iter([41_001, 41_001, 41_001, 41_002, 41_002, 41_003])
    monkeypatch.setattr(ports, "_candidate", lambda host, spacing: next(picks))
    monkeypatch.setattr(ports, "_handed_out", ports.deque(maxlen=256))
    # every pick bindable: another test of the parallel suite may hold one of these ports right now
    # (a pick it could not bind was skipped, and the scripted picks ran out)
    monkeypatch.setattr(ports, "_bindable", lambda host, port: True)
    assert [ports.free_port(), ports.free_port(), ports.free_port()] == [41_001, 41_002, 41_003]
