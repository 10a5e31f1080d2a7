"""What users install, run as they run it: the wheel and the sdist built from the files the image's
build context holds, installed (not editable) into fresh virtual environments outside the checkout,
every command started from a directory that is not the checkout, and the Dockerfile's own RUN steps.
Built here (a C compiler exists), the wheel carries the compiled core; built without one, it
installs the pure-Python core with one warning line.

One build serves every test (and tests/ops/test_deploy_files.py): the Dockerfile's ``pip wheel`` step
fills a wheelhouse once per run (:mod:`tests.support.builds`), and every environment is installed
from it with ``--no-index`` (offline, seconds each)."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvgateway.runtime.extensions import COMPILED_MODULES
from tests.support import REPO, Proc, free_ports, sim_endpoints, source_spec, wait_until
from tests.support.builds import ENV, DockerBuild, build_requires, copy_context, dockerfile_steps
from tests.support.builds import run as _run
from tests.support.nats import NatsServer

pytestmark = pytest.mark.timeout(300)

COMMANDS = ("serve", "ingest", "edge", "simulate", "demo")


@dataclass
class Artifacts:
    build: DockerBuild  # the run's one build of the image's first stage (tests/support/builds.py)
    root: Path  # this module's environments
    elsewhere: Path  # the working directory of every command: not the checkout

    @property
    def context(self) -> Path:
        return self.build.context

    @property
    def wheels(self) -> Path:
        return self.build.wheels

    def wheel(self) -> Path:
        return self.build.wheel()

    def venv(self, name: str, *requirements: str, env: dict[str, str] | None = None) -> Path:
        """A fresh virtual environment with ``requirements`` installed from the wheelhouse alone."""
        venv = self.root / name
        if not venv.exists():
            _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=self.elsewhere)
            pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q"]
            _run([*pip, "--no-index", "--find-links", str(self.wheels), *requirements], cwd=self.elsewhere, env=env)
        return venv


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, docker_build: DockerBuild) -> Artifacts:
    root = tmp_path_factory.mktemp("artifact")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return Artifacts(docker_build, root, elsewhere)


def _ready(base: str) -> bool:
    try:
        return httpx.get(base + "/readyz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _kvgateway(venv: Path) -> tuple[str, ...]:
    return (str(venv / "bin/kvgateway"),)


def _installed_at(venv: Path, cwd: Path) -> Path:
    probe = "import kvgateway.cluster.supervisor, kvgateway; print(kvgateway.__file__)"
    return Path(_run([str(venv / "bin/python"), "-c", probe], cwd=cwd).stdout.strip())


def test_wheel_holds_every_package(artifacts: Artifacts) -> None:
    names = set(zipfile.ZipFile(artifacts.wheel()).namelist())
    packages = {str(p.parent.relative_to(REPO)) for p in (REPO / "kvgateway").rglob("__init__.py")}
    assert {f"{package}/__init__.py" for package in packages} <= names, packages
    assert {"kvgateway/cluster/supervisor.py", "kvgateway/protocol/schema.json", "kvgateway/py.typed"} <= names
    static = {str(p.relative_to(REPO)) for p in (REPO / "static").rglob("*") if p.is_file()}
    assert {f"kvgateway/{name}" for name in static} <= names  # the dashboard and its vendor files
    assert not any(name.startswith(("tests/", "static/", "bench/")) for name in names)
    # the compiled core (built here: a C compiler exists), every module beside its pure-Python reference
    for module in COMPILED_MODULES:
        path = module.replace(".", "/")
        assert any(fnmatch.fnmatch(name, f"{path}.*.so") for name in names), (module, sorted(names))
        assert f"{path.removesuffix('_c')}_py.py" in names
    metadata = zipfile.ZipFile(artifacts.wheel()).read("kvgateway-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata


def test_dockerfile_steps(artifacts: Artifacts) -> None:
    """The runtime stage's install and check, as the Dockerfile writes them, into a fresh venv."""
    venv = artifacts.root / "docker"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=artifacts.elsewhere)
    steps = dockerfile_steps()
    installs = [step for step in steps if step[:2] == ["pip", "install"]]
    checks = [step for step in steps if step[0] == "kvgateway"]
    core_checks = [step for step in steps if step[0] == "python"]
    assert installs and checks and core_checks, steps
    for step in installs:
        words = [word.replace("/wheels", str(artifacts.wheels)) for word in step[1:]]
        _run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), *words], cwd=artifacts.elsewhere)
    for step in checks:
        result = _run([str(venv / "bin/kvgateway"), *step[1:]], cwd=artifacts.elsewhere)
        assert re.fullmatch(r"kvgateway \d+\.\d+\.\d+\S* \(compiled core\)\n", result.stdout), result.stdout
    for step in core_checks:  # the image refuses to build without its compiled core
        _run([str(venv / "bin/python"), *step[1:]], cwd=artifacts.elsewhere)
    assert _installed_at(venv, artifacts.elsewhere).is_relative_to(venv)
    pure = subprocess.run(
        [str(venv / "bin/python"), *core_checks[0][1:]],
        cwd=artifacts.elsewhere, env={**ENV, "KVGATEWAY_NO_EXTENSIONS": "1"}, check=False,
    )  # fmt: skip
    assert pure.returncode == 1  # the check would see a pure-Python core


def test_every_command_help_and_version(artifacts: Artifacts) -> None:
    """Without the nats extra: every command's help works (the cluster commands import no NATS),
    and the NATS commands say in one line how to get it."""
    venv = artifacts.venv("plain", "kvgateway")
    assert _installed_at(venv, artifacts.elsewhere).is_relative_to(venv)
    version = _run([*_kvgateway(venv), "--version"], cwd=artifacts.elsewhere).stdout
    assert version.startswith("kvgateway ") and version.endswith(" (compiled core)\n"), version
    assert "usage: kvgateway" in _run([*_kvgateway(venv), "--help"], cwd=artifacts.elsewhere).stdout
    for command in COMMANDS:
        result = _run([*_kvgateway(venv), command, "--help"], cwd=artifacts.elsewhere)
        assert f"usage: kvgateway {command}" in result.stdout, result.stdout
    source = ["--source", "name=a,endpoint=tcp://127.0.0.1:9"]
    for argv in (["ingest", *source], ["edge"], ["serve", "--workers", "1", *source]):
        result = subprocess.run(
            [*_kvgateway(venv), *argv, "--nats", "nats://127.0.0.1:9"],
            check=False,
            cwd=artifacts.elsewhere,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stderr.count("\n") == 1 and "kvgateway[nats]" in result.stderr, (argv, result.stderr)


def test_installed_gateway_serves_dashboard(artifacts: Artifacts) -> None:
    venv = artifacts.venv("plain", "kvgateway")
    pub, rep, port = free_ports(3)
    sim = Proc(
        "simulate", "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}",
        command=_kvgateway(venv), cwd=artifacts.elsewhere, env=ENV,
    )  # fmt: skip
    gateway = Proc(
        "serve", "--source", source_spec("sim", pub, rep),
        "--port", str(port), command=_kvgateway(venv), cwd=artifacts.elsewhere, env=ENV,
    )  # fmt: skip
    try:
        sim_endpoints(sim)
        gateway.wait_for("gateway started", timeout=30)
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(base), timeout=30, what="/readyz")
        index = httpx.get(base + "/", timeout=10)
        assert index.status_code == 200 and "<html" in index.text.lower()
        assets = re.findall(r'(?:src|href)="([^":]+)"', index.text)
        assert "vendor/uplot/uPlot.iife.min.js" in assets and "app.js" in assets, assets
        for asset in assets:
            answer = httpx.get(f"{base}/{asset}", timeout=10)
            assert answer.status_code == 200 and answer.content, asset
        schema = httpx.get(base + "/v1/schema", timeout=10)
        assert schema.status_code == 200 and "$schema" in json.loads(schema.content)
    finally:
        gateway.stop()
        sim.stop()


def test_installed_ingest_and_edge_on_nats(artifacts: Artifacts) -> None:
    """With the nats extra: ingest and edge from the installed package against a real nats-server."""
    venv = artifacts.venv("with-nats", f"kvgateway[nats] @ {artifacts.wheel().as_uri()}")
    nats = NatsServer(artifacts.root / "nats")
    nats.start()
    pub, rep, port = free_ports(3)
    spec = source_spec("sim", pub, rep)
    run = {"command": _kvgateway(venv), "cwd": artifacts.elsewhere, "env": ENV}
    procs = [Proc("simulate", "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}", **run)]
    try:
        sim_endpoints(procs[0])
        procs.append(Proc("ingest", "--source", spec, "--nats", nats.url, "--port", "0", **run))
        procs[-1].wait_for("ingest publishing to", timeout=30)
        procs.append(Proc("edge", "--nats", nats.url, "--port", str(port), **run))
        procs[-1].wait_for("edge serving on", timeout=30)
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(base), timeout=30, what="/readyz")
        assert httpx.get(base + "/", timeout=10).status_code == 200
        sources = httpx.get(base + "/v1/sources", timeout=10).json()
        assert "sim" in json.dumps(sources)
    finally:
        for proc in reversed(procs):
            proc.stop()
        nats.stop()


def test_sdist_builds_and_installs(artifacts: Artifacts) -> None:
    """The sdist, built by the PEP 517 backend pyproject.toml names, holds what the wheel needs and
    installs (built from itself, offline) into a fresh venv that runs outside the checkout."""
    builder = artifacts.venv("builder", *build_requires(REPO))
    out = artifacts.root / "sdist"
    out.mkdir()
    hook = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    built = _run([str(builder / "bin/python"), "-c", hook, str(out)], cwd=artifacts.context)
    # No deprecation (project.license as a table was one, printed by every pip install) or other warning.
    assert "Warning" not in built.stderr, built.stderr
    name = built.stdout.split()[-1]
    sdist = out / name
    with tarfile.open(sdist) as tar:
        members = {member.split("/", 1)[1] for member in tar.getnames() if "/" in member}
    assert {"pyproject.toml", "setup.py", "kvgateway/cluster/edge.py", "static/index.html"} <= members
    # the compiled core's sources, and its pure-Python reference; nothing built
    for module in COMPILED_MODULES:
        path = module.replace(".", "/")
        assert {f"{path}.pyx", f"{path.removesuffix('_c')}_py.py"} <= members, module
    assert not [name for name in members if name.endswith((".so", "_c.c"))], members
    assert "static/vendor/uplot/uPlot.iife.min.js" in members
    # Built from itself, its compiled core too (a source the sdist lacks fails the compile: the
    # install would fall back to pure Python). At -O0: the wheelhouse's build already compiled the
    # same sources at -O3; this one shows the sdist holds them, and takes a third of the time.
    venv = artifacts.venv("from-sdist", str(sdist), env={**ENV, "CFLAGS": "-O0"})
    assert _installed_at(venv, artifacts.elsewhere).is_relative_to(venv)
    version = _run([*_kvgateway(venv), "--version"], cwd=artifacts.elsewhere).stdout
    assert version.endswith(" (compiled core)\n"), version
    result = _run([*_kvgateway(venv), "edge", "--help"], cwd=artifacts.elsewhere)
    assert "usage: kvgateway edge" in result.stdout
    static = _run(
        [str(venv / "bin/python"), "-c", "import kvgateway.serve.app as a; print(a.static_dir())"],
        cwd=artifacts.elsewhere,
    )
    assert (Path(static.stdout.strip()) / "vendor/uplot/uPlot.iife.min.js").is_file()


def test_without_a_compiler_the_install_is_pure_python(artifacts: Artifacts) -> None:
    """CC=/bin/false (a compiler that fails every step): the wheel still builds, with one warning
    line, and installs the pure-Python core; it runs outside the checkout."""
    builder = artifacts.venv("builder", *build_requires(REPO))
    out = artifacts.root / "no-compiler"
    out.mkdir()
    context = copy_context(artifacts.root / "src-no-compiler")  # a fresh copy: no build/ of an earlier build
    hook = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    result = subprocess.run(
        [str(builder / "bin/python"), "-c", hook, str(out)],
        cwd=context, env={**ENV, "CC": "/bin/false"}, capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "kvgateway" in line and "WARNING" in line.upper()]
    assert len(warnings) == 1 and "pure-Python core" in warnings[0], result.stderr[-3000:]
    wheel = out / result.stdout.split()[-1]
    assert not [name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".so")]
    venv = artifacts.venv("no-compiler-venv", str(wheel))
    assert _installed_at(venv, artifacts.elsewhere).is_relative_to(venv)
    version = _run([*_kvgateway(venv), "--version"], cwd=artifacts.elsewhere).stdout
    assert version.endswith(" (pure-Python core)\n"), version
