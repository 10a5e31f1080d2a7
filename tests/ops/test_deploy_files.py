"""Deployment files that cannot run here (Docker, compose) checked as far as tools allow:
well-formed, consistent with each other and with the gateway's configuration parser."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvgateway.config.options import CLUSTER_BY_KEY, SERVER_BY_KEY
from kvgateway.config.settings import Settings
from kvgateway.config.sources import SOURCE_KEYS
from tests.support import REPO
from tests.support.builds import DOCKERFILE, DOCKERIGNORE, DockerBuild, docker_context_files
from tests.support.command_line import serve_file_settings
from tests.support.deploy import DEPLOY, load_yaml, load_yaml_all

EXAMPLE_TOML = DEPLOY / "kvgateway.example.toml"
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_TOML = DEPLOY / "compose" / "kvgateway.toml"
SERVE_CMD = ["kvgateway", "serve", "--config", "/etc/kvgateway/kvgateway.toml"]


def load_settings(path: Path, tmp_path: Path) -> Settings:
    """The file as ``kvgateway serve --config`` loads it; a token_file is pointed at a temp file."""
    return serve_file_settings(path.read_text(encoding="utf-8"), tmp_path)


# --- every file parses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]), ids=lambda p: str(p.relative_to(DEPLOY))
)
def test_yaml_is_well_formed(path: Path) -> None:
    assert load_yaml_all(path), f"{path} is empty"


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.json")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_json_is_well_formed(path: Path) -> None:
    json.loads(path.read_text(encoding="utf-8"))


# --- configuration examples -----------------------------------------------------------------


def test_example_toml_is_a_valid_configuration(tmp_path: Path) -> None:
    settings = load_settings(EXAMPLE_TOML, tmp_path)
    assert settings.host == "0.0.0.0"
    assert settings.port == 8080
    assert settings.token  # from token_file
    assert settings.log_format == "json"
    streams = {(s.source, s.dp_rank): s for s in settings.streams()}
    assert streams[("vllm-a", 1)].endpoint == "tcp://vllm-a:5558"
    assert streams[("vllm-a", 1)].replay == "tcp://vllm-a:5658"
    assert dict(streams[("vllm-a", 0)].capacity_blocks) == {"GPU": 8192, "CPU": 65536}


def test_example_toml_shows_every_server_key() -> None:
    text = EXAMPLE_TOML.read_text(encoding="utf-8")
    shown = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, re.MULTILINE))
    missing = set(SERVER_BY_KEY) - shown - {"token"}  # the token itself belongs in a file
    assert not missing, f"keys not in {EXAMPLE_TOML.name}: {sorted(missing)}"
    missing_cluster_keys = set(CLUSTER_BY_KEY) - shown
    assert not missing_cluster_keys, f"[cluster] keys not in {EXAMPLE_TOML.name}: {sorted(missing_cluster_keys)}"
    missing_source_keys = set(SOURCE_KEYS) - shown
    assert not missing_source_keys, f"source keys not in {EXAMPLE_TOML.name}: {sorted(missing_source_keys)}"


def test_compose_toml_is_a_valid_configuration(tmp_path: Path) -> None:
    settings = load_settings(COMPOSE_TOML, tmp_path)
    assert settings.allow_unauthenticated and settings.token is None
    (stream,) = settings.streams()
    assert stream.endpoint == "tcp://engine:5557"
    assert stream.replay == "tcp://engine:5657"


# --- compose --------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def test_compose_services() -> None:
    services = compose()["services"]
    assert set(services) == {"engine", "kvgateway", "prometheus", "grafana"}
    engine = services["engine"]
    assert engine["command"] == [
        "kvgateway",
        "simulate",
        "--endpoint",
        "tcp://*:5557",
        "--replay-endpoint",
        "tcp://*:5657",
        "--rate",
        "50",
    ]
    assert engine["healthcheck"] == {"disable": True}
    gateway = services["kvgateway"]
    assert gateway["command"] == SERVE_CMD
    assert f"./compose/{COMPOSE_TOML.name}:/etc/kvgateway/kvgateway.toml:ro" in gateway["volumes"]
    for name in ("engine", "kvgateway"):
        build = services[name]["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == REPO
        assert (REPO / build["dockerfile"]).resolve() == DOCKERFILE
    prometheus = services["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert "./prometheus:/etc/prometheus:ro" in prometheus["volumes"]


def test_compose_images_are_pinned_and_ports_are_local() -> None:
    for name, service in compose()["services"].items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} must be published on loopback only"


def test_compose_bind_mounts_exist() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} does not exist"


def test_compose_prometheus_scrapes_the_gateway_service() -> None:
    prometheus_config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    assert isinstance(prometheus_config, dict)
    targets = [t for job in prometheus_config["scrape_configs"] for s in job["static_configs"] for t in s["targets"]]
    assert "kvgateway:8080" in targets  # the compose service name and the config's port


# --- Dockerfile -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def dockerfile() -> list[Instruction]:
    """The instructions, with line continuations joined and comments dropped."""
    logical: list[str] = []
    current = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    assert not current, "dangling line continuation"
    out = []
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        out.append(Instruction(keyword.upper(), arguments.strip()))
    return out


def final_stage() -> list[Instruction]:
    instructions = dockerfile()
    last_from = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last_from:]


def test_dockerfile_instructions_are_known() -> None:
    known = {
        "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
        "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
    }  # fmt: skip
    for instruction in dockerfile():
        assert instruction.keyword in known, instruction


def test_dockerfile_base_images_are_pinned() -> None:
    args: dict[str, str] = {}
    for instruction in dockerfile():
        if instruction.keyword == "ARG" and "=" in instruction.arguments:
            key, _, value = instruction.arguments.partition("=")
            args[key] = value
    stages: set[str] = set()
    for instruction in dockerfile():
        if instruction.keyword != "FROM":
            continue
        words = instruction.arguments.split()
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0])
        if image not in stages:
            name, _, tag = image.partition(":")
            assert name == "python", image
            assert tag.startswith("3.11-slim"), f"base image {image} must be python:3.11-slim"
            assert "latest" not in tag
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])


def test_dockerfile_runs_as_non_root() -> None:
    users = [ins.arguments for ins in final_stage() if ins.keyword == "USER"]
    assert users, "the final stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert user.isdigit(), "a numeric UID lets Kubernetes check runAsNonRoot"
    deployment = load_yaml_all(DEPLOY / "k8s" / "deployment.yaml")[0]
    assert isinstance(deployment, dict)
    assert str(deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]) == user


def test_dockerfile_installs_the_package_and_serves() -> None:
    stage = final_stage()
    instructions = dockerfile()
    assert any(ins.keyword == "RUN" and "pip wheel" in ins.arguments and " ." in ins.arguments for ins in instructions)
    installs = [ins.arguments for ins in stage if ins.keyword == "RUN" and "pip install" in ins.arguments]
    assert any("kvgateway" in arguments for arguments in installs)
    assert any(ins.keyword == "EXPOSE" and ins.arguments.split() == ["8080"] for ins in stage)
    (cmd,) = [ins for ins in stage if ins.keyword == "CMD"]
    assert json.loads(cmd.arguments) == SERVE_CMD
    assert not [ins for ins in stage if ins.keyword == "ENTRYPOINT"]
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert "curl" not in text.replace("# No curl", "") and "wget" not in text


def healthcheck_command() -> list[str]:
    (healthcheck,) = [ins for ins in final_stage() if ins.keyword == "HEALTHCHECK"]
    options, _, command = healthcheck.arguments.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    argv = json.loads(command)
    assert isinstance(argv, list)
    return [str(item) for item in argv]


def test_healthcheck_uses_python_urllib_on_healthz() -> None:
    argv = healthcheck_command()
    assert argv[:2] == ["python", "-c"]
    assert "urllib.request" in argv[2] and "http://127.0.0.1:8080/healthz" in argv[2]
    compile(argv[2], "HEALTHCHECK", "exec")


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/healthz" else 404
        body = b'{"status":"ok"}'
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[ThreadingHTTPServer, type[_Health]]]:
    handler = type("Handler", (_Health,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def run_healthcheck(port: int) -> int:
    code = healthcheck_command()[2].replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30, check=False).returncode


def test_healthcheck_exit_codes(health_server: tuple[ThreadingHTTPServer, type[_Health]]) -> None:
    server, handler = health_server
    port = server.server_address[1]
    assert isinstance(port, int)
    assert run_healthcheck(port) == 0
    handler.status = 503
    assert run_healthcheck(port) != 0
    server.shutdown()
    server.server_close()
    assert run_healthcheck(port) != 0  # nothing listening


def test_dockerignore_keeps_what_the_build_needs() -> None:
    """The allow-list names everything pyproject.toml and setup.py need to build the wheel (which
    tests/integration/test_artifact.py builds from exactly that context)."""
    lines = [line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()]
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("*") for p in patterns if p.startswith("!")}
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    needed = {"pyproject.toml", "setup.py", "kvgateway", project["project"]["readme"]}
    needed |= set(project["tool"]["setuptools"].get("package-dir", {}).values())
    assert needed <= allowed, f"not in the build context: {sorted(needed - allowed)}"
    for path in needed:
        assert (REPO / path).exists() or path == project["project"]["readme"], path


def test_docs_show_the_vllm_flag() -> None:
    """The operations guide's --kv-events-config is valid JSON with the expected keys."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    match = re.search(r"--kv-events-config (\'[^\']*\')", text)
    assert match, "no --kv-events-config example"
    (argument,) = shlex.split(match.group(1))
    assert json.loads(argument) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5657",
        "topic": "kv-events",
    }


# --- the build context ----------------------------------------------------------------------


def test_build_context_is_small_and_builds_the_wheel(docker_build: DockerBuild) -> None:
    """The first stage of the Dockerfile, without Docker: its `pip wheel` from exactly the context
    (the run's one build, tests/support/builds.py)."""
    files = docker_context_files()
    assert "pyproject.toml" in files
    assert not [f for f in files if f.startswith(("tests/", "deploy/", "bench/", "docs/"))], "context too wide"
    assert not [f for f in files if "__pycache__" in f]
    assert set(files) <= {p.relative_to(docker_build.context).as_posix() for p in docker_build.context.rglob("*")}
    names = set(zipfile.ZipFile(docker_build.wheel()).namelist())
    assert "kvgateway/cli.py" in names
    assert "kvgateway/static/index.html" in names
    assert "kvgateway/protocol/schema.json" in names
