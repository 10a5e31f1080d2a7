"""The package as users get it, built once for the whole test run: the image's build context
(deploy/Dockerfile.dockerignore's files, copied), the Dockerfile's build step run in it as
written, and the build backend's wheels beside it, so that every environment the tests install
from that wheelhouse is offline.

The build compiles the compiled core (four Cython modules at the compiler's -O3), the longest part
of the artifact tests. tests/integration/test_artifact.py and tests/ops/test_deploy_files.py both
read its wheel, and under ``pytest -n`` they may run on different workers: :func:`build_once`
builds it in the run's shared temporary directory under a file lock, so the first worker to ask
builds it and every other one waits for that build and reads it."""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import REPO

DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "Dockerfile.dockerignore"
ENV = {**os.environ, "PYTHONPATH": "", "PYTHONDONTWRITEBYTECODE": "1"}  # nothing from the checkout
SKIPPED_DIRS = {".git", ".venv", "node_modules", "test-artifacts", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
"""Never in a build context, and large: not walked at all."""


def run(
    argv: list[str], cwd: Path, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end in ``cwd`` with nothing from the checkout on the path; it must succeed."""
    result = subprocess.run(argv, cwd=cwd, env=env or ENV, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{shlex.join(argv)}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def _checkout_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = sorted(name for name in dirs if name not in SKIPPED_DIRS)
        found += [Path(folder, name) for name in files]
    return sorted(found)


def docker_context_files() -> list[str]:
    """The files `docker build -f deploy/Dockerfile .` sends, by Docker's .dockerignore rules: the
    last matching pattern decides, and a pattern matches a path or any of its parent directories."""
    patterns = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            patterns.append((negate, _pattern_regex(line.lstrip("!").strip("/"))))
    files = []
    for path in _checkout_files():
        relative = path.relative_to(REPO)
        candidates = ["/".join(relative.parts[: i + 1]) for i in range(len(relative.parts))]
        excluded = False
        for negate, regex in patterns:
            if any(regex.match(candidate) for candidate in candidates):
                excluded = not negate
        if not excluded:
            files.append(relative.as_posix())
    return files


def copy_context(dest: Path) -> Path:
    """A copy of the build context at ``dest``: what the image's build sees."""
    for name in docker_context_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return dest


def dockerfile_steps() -> list[list[str]]:
    """The pip, kvgateway and python commands of deploy/Dockerfile's RUN instructions, in order
    (packages, users, groups and directories are the image's business)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    steps = []
    for line in text.splitlines():
        if not line.startswith("RUN "):
            continue
        for command in line[4:].split("&&"):
            words = [word for word in shlex.split(command) if not word.startswith("--mount=")]
            if words and words[0] in ("pip", "kvgateway", "python"):
                steps.append(words)
    return steps


def build_requires(context: Path) -> list[str]:
    """What pyproject.toml's build-system requires (the PEP 517 backend and Cython)."""
    requires: list[str] = tomllib.loads((context / "pyproject.toml").read_text())["build-system"]["requires"]
    return requires


@dataclass(frozen=True)
class DockerBuild:
    context: Path  # the build context (a copy)
    wheels: Path  # the Dockerfile's wheelhouse: kvgateway, nats-py, every dependency and the build backend

    def wheel(self) -> Path:
        (wheel,) = self.wheels.glob("kvgateway-*.whl")
        return wheel


def _build(root: Path) -> DockerBuild:
    context = copy_context(root / "src")
    wheels = root / "wheels"
    build = [step for step in dockerfile_steps() if step[:2] == ["pip", "wheel"]]
    assert len(build) == 1, dockerfile_steps()
    # The Dockerfile's build step, as written, with its wheel directory here.
    run([sys.executable, "-m", *[str(wheels) if word == "/wheels" else word for word in build[0]]], cwd=context)
    # The sdist's build needs the build backend pyproject.toml asks for, from the wheelhouse too.
    run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), *build_requires(context)], cwd=context)
    return DockerBuild(context, wheels)


def build_once(tmp_path_factory: pytest.TempPathFactory) -> DockerBuild:
    """The run's one :class:`DockerBuild`: built by the first caller of any worker, read by the others."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common root
    root = shared / "docker-build"
    with (shared / "docker-build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when a build fails
        done = root / "built"
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)  # a failed attempt's leftovers
            root.mkdir()
            _build(root)
            done.touch()
    return DockerBuild(root / "src", root / "wheels")
