"""The unit suite mirrors the package: ``kvgateway/<package>/<module>.py`` is tested in
``tests/unit/<package>/test_<module>.py`` (a top-level module in ``tests/unit/test_<module>.py``), and
a test file there is named for a module of its folder (``test_<module>.py``, or
``test_<module>_<aspect>.py`` for a second file of one module). A module without its file is listed
below by name, with the reason and the tests that cover it; a compiled twin and its pure-Python
reference are held together by a differential test. Read from the file tree, nothing imported."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "kvgateway"
UNIT = REPO / "tests" / "unit"

SUITE_WIDE: dict[str, str] = {
    "test_structure.py": "the package's structure: no import cycles or upward imports, short functions",
    "test_suite_shape.py": "the test suite's own shape: one helper of each, in tests/support",
    "test_layout.py": "this file: the unit suite mirrors the package",
    "test_core_differential.py": "every compiled twin against its pure-Python reference, across packages",
}
"""Unit files that test no one module, by name, with what they test."""

WITHOUT_UNIT_TESTS: dict[str, str] = {
    # the process shell and the commands: what they compose runs as real processes
    "cli.py": "the commands' entry point: run as a process by tests/integration/test_startup.py (help, "
    "one-line start-up errors) and by every integration test",
    "gateway.py": "one process composed (ingest, log, serving): every test in tests/integration starts it",
    "simulator/cli.py": "the simulator's command: tests/integration/test_simulator.py runs it as a process",
    "runtime/startup.py": "one exception class, no logic: its one-line exits are tests/integration/test_startup.py's",
    "serve/role.py": "a Protocol, no code: the roles that implement it are tested as processes "
    "(tests/integration/test_health_and_logs.py)",
    "serve/server.py": "uvicorn around a role: tests/integration/test_startup.py and every integration test",
    # the web routes: each is a thin layer over a tested core, checked end to end over HTTP
    "serve/app.py": "the routes: tests/integration/web (every route, its parameters and 400s) and "
    "tests/integration/test_health_and_logs.py",
    "serve/router_api.py": "the routers' routes over a real server: tests/integration/test_routers_web.py",
    "serve/dashboard_api.py": "the dashboard's routes: tests/integration/test_history.py and tests/browser",
    # the log's data, no logic of their own to test apart
    "log/entry.py": "one Struct and a type alias: what the ring keeps and what its followers are called with, "
    "tests/unit/log/test_ring.py and tests/unit/log/test_ring_differential.py",
    "log/records.py": "the log's records and the entry each becomes at its offset: tests/unit/log/test_ordered.py "
    "(an appended batch is the entry make_entry makes) and tests/unit/cluster/test_records.py",
    # the ingest half's sockets
    "ingest/reader.py": "a stream's ZeroMQ reader over real sockets: tests/integration/test_stream_reader.py",
    "ingest/monitor.py": "a monitor re-armed, over real sockets: tests/integration/test_connection_monitor.py",
    "ingest/streams.py": "every stream's reader and outlet together: tests/integration/test_ingest.py",
    # the cluster: JetStream and processes, tested against a real nats-server
    "cluster/checkpoints.py": "checkpoints in JetStream: tests/cluster/test_checkpoints.py",
    "cluster/commands.py": "the edge and ingest commands: tests/cluster/test_edge_cli.py and "
    "tests/cluster/test_cluster.py",
    "cluster/edge.py": "an edge process: tests/cluster/test_edge_cli.py, tests/cluster/test_cluster_web.py",
    "cluster/ingest_role.py": "an ingest process: tests/cluster/test_cluster.py and tests/cluster/test_one_truth.py",
    "cluster/leases.py": "leases in a JetStream key-value bucket: tests/cluster/test_shards.py and "
    "tests/cluster/test_checkpoints.py",
    "cluster/nats_link.py": "the connection to NATS: tests/cluster/test_edge_cli.py and tests/cluster/test_cluster.py",
    "cluster/publisher.py": "the ingest's appender into JetStream: tests/cluster/test_cluster.py",
    "cluster/read_back.py": "reading the stream back from JetStream: tests/cluster/test_cluster_web.py (a resume "
    "older than the ring); the ring log's use of it is tests/unit/log/test_ordered.py",
    "cluster/sources.py": "the sources bucket in JetStream: tests/cluster/test_checkpoints.py starts its edges "
    "without --source; tests/cluster/test_sources_bucket.py waits out a bucket not yet answering",
}
"""Modules without ``tests/unit/<package>/test_<module>.py``, each with why and what tests it."""

TWIN = re.compile(r"_(?P<name>\w+)_(?P<kind>c|py)")


def modules() -> list[str]:
    """Every module of the package, as a path below it (``state/occupancy.py``)."""
    found = (*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyx"))
    return sorted(p.relative_to(PACKAGE).as_posix() for p in found if p.name not in ("__init__.py", "__main__.py"))


def unit_test_file(module: str) -> Path:
    path = Path(module)
    return UNIT / path.parent / f"test_{path.stem}.py"


def differential_tests() -> list[Path]:
    """The differential tests: a compiled twin against its pure-Python reference, side by side."""
    return sorted(UNIT.rglob("test_*differential*.py"))


def twin_problem(module: str) -> str | None:
    """For a compiled twin (``_x_c.pyx``) or the pure-Python reference it mirrors (``_x_py.py``): what
    is wrong with how the pair is tested (None: nothing); for any other module, ``"no twin"``. The
    pair is tested by a differential test that names the reference (the public module that chooses
    between them at import has its own file)."""
    path = Path(module)
    match = TWIN.fullmatch(path.stem)
    if match is None:
        return "no twin"
    reference = path.with_name(f"_{match['name']}_py.py")
    if not (PACKAGE / reference).is_file():
        return f"{module}: no pure-Python reference {reference.as_posix()} beside it"
    if not any(reference.stem in test.read_text(encoding="utf-8") for test in differential_tests()):
        return f"{module}: no differential test (tests/unit/**/test_*differential*.py) names {reference.stem}"
    return None


def test_every_module_has_its_unit_test_file_or_a_reason() -> None:
    missing = []
    for module in modules():
        if unit_test_file(module).is_file() or module in WITHOUT_UNIT_TESTS:
            continue
        problem = twin_problem(module)
        if problem == "no twin":
            missing.append(f"{module}: {unit_test_file(module).relative_to(REPO)}")
        elif problem is not None:
            missing.append(problem)
    assert not missing, "modules without their unit test file (write it, or list it with the reason):\n" + "\n".join(
        missing
    )


def test_each_listed_module_exists_has_no_test_file_and_its_tests_exist() -> None:
    stale = []
    for module, reason in WITHOUT_UNIT_TESTS.items():
        if not (PACKAGE / module).is_file():
            stale.append(f"{module}: no such module")
        elif unit_test_file(module).is_file():
            stale.append(f"{module}: has {unit_test_file(module).relative_to(REPO)} now")
        named = re.findall(r"tests/[\w/]+(?:\.py)?", reason)
        if not named:
            stale.append(f"{module}: the reason names no tests")
        stale += [f"{module}: {path} does not exist" for path in named if not (REPO / path).exists()]
    assert not stale, "\n".join(stale)


def misnamed(path: Path) -> str | None:
    """What is wrong with a unit test file's name and place (None: nothing)."""
    folder = path.parent.relative_to(UNIT)
    if folder == Path(".") and path.name in SUITE_WIDE:
        return None
    package = PACKAGE / folder
    if not package.is_dir():
        return f"{path.relative_to(REPO)}: no package kvgateway/{folder.as_posix()}"
    # a module, a data file the package ships (protocol/schema.json), a compiled pair by its name
    # (state/_apply_py.py: test_apply_differential.py) or, at the top, a package
    names = {p.stem for p in package.iterdir() if p.suffix in (".py", ".pyx", ".json") or p.is_dir()}
    names |= {match["name"] for name in names if (match := TWIN.fullmatch(name))}
    subject = path.stem.removeprefix("test_")
    if any(subject == name or subject.startswith(f"{name}_") for name in names - {"__init__", "__pycache__"}):
        return None
    return f"{path.relative_to(REPO)}: names no module of kvgateway/{folder.as_posix()}"


def test_every_unit_test_file_is_named_for_a_module_of_its_folder() -> None:
    wrong = [problem for path in sorted(UNIT.rglob("test_*.py")) if (problem := misnamed(path)) is not None]
    assert not wrong, "unit test files must be test_<module>[_<aspect>].py:\n" + "\n".join(wrong)


def test_every_folder_of_the_unit_suite_is_a_package() -> None:
    folders = [p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__"]
    assert folders, "the unit suite has folders, one per package"
    assert [p for p in folders if not (p / "__init__.py").is_file()] == []


def test_the_checks_see_a_module_without_tests_and_a_misnamed_file() -> None:
    """Not vacuous: the rules find a module's file, a twin's reference and a stray test name."""
    assert unit_test_file("state/occupancy.py") == UNIT / "state" / "test_occupancy.py"
    assert unit_test_file("cli.py") == UNIT / "test_cli.py"
    assert "state/occupancy.py" in modules() and "protocol/_render_c.pyx" in modules()
    assert twin_problem("state/occupancy.py") == "no twin"
    assert twin_problem("state/_learner_c.pyx") is None
    assert (
        twin_problem("state/_nothing_c.pyx")
        == "state/_nothing_c.pyx: no pure-Python reference state/_nothing_py.py beside it"
    )
    assert UNIT / "test_core_differential.py" in differential_tests()
    assert misnamed(UNIT / "state" / "test_learner_differential.py") is None  # a pair by its name
    assert misnamed(UNIT / "engine" / "test_sequencer_model.py") is None
    assert misnamed(UNIT / "protocol" / "test_schema_docs.py") is None
    assert (
        misnamed(UNIT / "runtime" / "test_heap.py")
        == "tests/unit/runtime/test_heap.py: names no module of kvgateway/runtime"
    )
    assert misnamed(UNIT / "test_zsocket.py") == "tests/unit/test_zsocket.py: names no module of kvgateway/."
    assert (
        misnamed(UNIT / "routers" / "test_state.py") == "tests/unit/routers/test_state.py: no package kvgateway/routers"
    )
