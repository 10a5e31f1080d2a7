"""The README and docs/ stay true to the program.

- Every fenced block marked ```` ```sh test ```` is run here (bash, a timeout, free ports in place
  of the documented ones); a ``# => TEXT`` line in it is output the run must print.
- Every other ``kvgateway ...`` command in a fenced block parses with the real parser, its
  ``--source`` specs included.
- Every ``kvgateway_*`` metric named in a document exists; every ``--flag`` named in a document is
  a flag of kvgateway, of the bench scripts, or of the other tool it belongs to (listed below).
- The README's ``vllm serve`` and ``kvgateway serve`` examples describe the same engine, and the
  documented duration of ``make bench`` matches the durations the results report.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvgateway import cli
from kvgateway.config.addresses import check_overlaps
from kvgateway.config.arguments import flag_names
from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import SourceConfig
from kvgateway.config.sources import parse_source_flag
from tests.support import REPO, free_port, free_ports
from tests.support.catalogue import Catalogue
from tests.support.deploy import metric_names_in

DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"

OTHER_TOOLS_FLAGS = {
    "--kv-events-config": "vllm serve",
    "--data-parallel-size": "vllm serve",
    "--prefix-caching-hash-algo": "vllm serve",
    "--experimental-websocket": "node",
    "--build": "docker compose up",
    "--strict": "mypy",
    "--retry": "curl",
    "--retry-delay": "curl",
    "--retry-connrefused": "curl",
    "--separate-callers": "valgrind --tool=callgrind",
    "--call-graph": "perf record",
}
"""Flags of other programs that the documents mention, with the program."""

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
DOC_PORTS = {5557: 2, 5657: 2}
"""Engine ports the runnable examples use, with the ranks above them; replaced by free ports."""


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    info: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc.name}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
    return [
        Block(doc, text.count("\n", 0, match.start()) + 1, match[1].strip(), match[2]) for match in FENCE.finditer(text)
    ]


ALL_BLOCKS = [block for doc in DOCUMENTS for block in blocks(doc)]
RUNNABLE = [block for block in ALL_BLOCKS if block.info.split() == ["sh", "test"]]


def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell block, as words: continuation lines joined, comments dropped,
    and lists (``a || b``, ``a &``, ``a | b``) split into their commands."""
    out: list[list[str]] = []
    for raw in text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(raw, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for word in lexer:
            if word and set(word) <= set("|&;()<>"):
                out.append(current)
                current = []
            else:
                current.append(word)
        out.append(current)
    return [words for words in out if words]


# --- runnable examples -----------------------------------------------------------------------


def test_there_are_runnable_examples() -> None:
    assert {block.doc.name for block in RUNNABLE} >= {"README.md", "operations.md"}


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_runnable_example(block: Block) -> None:
    script = block.text
    # The documented ports are replaced by free ones (other tests and users share this machine),
    # keeping each port's ranks above it; the HTTP port comes from KVGATEWAY_PORT.
    http = free_port()
    for port, ranks in DOC_PORTS.items():
        (free,) = free_ports(1, spacing=ranks)
        script = re.sub(rf":{port}\b", f":{free}", script)
    script = re.sub(r":8080\b", f":{http}", script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATEWAY_")}
    env.update({"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "KVGATEWAY_PORT": str(http)})
    # Background jobs (an engine, a gateway) are stopped when the block ends.
    wrapped = "trap 'jobs -p | xargs -r kill 2>/dev/null; wait' EXIT\nset -eo pipefail\n" + script
    proc = subprocess.Popen(
        ["bash", "-c", wrapped],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{block.id}: timed out; output:\n{output}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{block.id} failed ({proc.returncode}):\n{output}"
    for expected in re.findall(r"^# => (.*)$", block.text, re.MULTILINE):
        assert expected.strip() in output, f"{block.id}: expected {expected!r} in:\n{output}"


# --- every other kvgateway command parses ----------------------------------------------------


def documented_kvgateway_commands() -> list[tuple[str, list[str]]]:
    found = []
    for block in ALL_BLOCKS:
        if block.info.split()[:1] not in (["sh"], ["bash"]):
            continue
        for command in commands(block.text):
            start = 0
            while start < len(command) and "=" in command[start] and not command[start].startswith("-"):
                start += 1  # VAR=value prefixes
            if command[start : start + 1] == ["kvgateway"]:
                found.append((block.id, command[start + 1 :]))
    return found


def test_documented_commands_parse() -> None:
    found = documented_kvgateway_commands()
    assert len(found) >= 4, found
    parser = cli.build_parser()
    for where, argv in found:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: kvgateway {' '.join(argv)} does not parse")
        for spec in getattr(args, "source", None) or []:
            parse_source_flag(spec)  # raises ConfigError naming the problem


# --- names ------------------------------------------------------------------------------------


def test_every_metric_named_in_the_documents_exists(catalogue: Catalogue) -> None:
    known = catalogue.sample_names | catalogue.family_names
    for doc in DOCUMENTS:
        unknown = metric_names_in(doc.read_text(encoding="utf-8")) - known
        assert not unknown, f"{doc.name} names metrics that do not exist: {sorted(unknown)}"


def _bench_flags() -> set[str]:
    text = "".join(path.read_text(encoding="utf-8") for path in (REPO / "bench").glob("*.py"))
    return set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', text))


def test_every_flag_named_in_the_documents_exists() -> None:
    known = flag_names(cli.build_parser()) | _bench_flags() | set(OTHER_TOOLS_FLAGS) | {"--help", "--version"}
    for doc in DOCUMENTS:
        text = doc.read_text(encoding="utf-8")
        unknown = set(FLAG.findall(text)) - known
        assert not unknown, f"{doc.name} names flags that do not exist: {sorted(unknown)}"


# --- the README's two commands describe one engine -------------------------------------------


def _vllm_and_gateway(doc: Path) -> tuple[dict[str, object], int, list[SourceConfig]]:
    vllm: tuple[dict[str, object], int] | None = None
    sources: list[SourceConfig] = []
    for block in blocks(doc):
        if block.info.split()[:1] not in (["sh"], ["bash"]):
            continue
        for words in commands(block.text):
            if words[:2] == ["vllm", "serve"]:
                spec = json.loads(words[words.index("--kv-events-config") + 1])
                dp = int(words[words.index("--data-parallel-size") + 1]) if "--data-parallel-size" in words else 1
                vllm = (spec, dp)
            if words[:2] == ["kvgateway", "serve"] and "--source" in words:
                sources.append(parse_source_flag(words[words.index("--source") + 1]))
    assert vllm is not None, f"{doc.name} has no vllm serve example"
    return vllm[0], vllm[1], sources


def test_readme_vllm_and_gateway_examples_describe_one_engine() -> None:
    spec, dp_size, sources = _vllm_and_gateway(REPO / "README.md")
    assert sources
    for source in sources:
        # Copied together they must work: every rank vLLM starts is a stream the gateway reads.
        assert source.dp_size == dp_size, f"gateway dp_size={source.dp_size}, vllm --data-parallel-size {dp_size}"
        assert source.topic == spec.get("topic", "")
        port = str(spec["endpoint"]).rsplit(":", 1)[1]
        assert source.endpoint.endswith(f":{port}")
        replay_port = str(spec["replay_endpoint"]).rsplit(":", 1)[1]
        assert source.replay is not None and source.replay.endswith(f":{replay_port}")


def test_operations_vllm_example_matches_its_toml() -> None:
    doc = REPO / "docs" / "operations.md"
    spec, dp_size, _ = _vllm_and_gateway(doc)
    tomls = [b.text for b in blocks(doc) if b.info == "toml" and "kv_events_config" in b.text]
    assert tomls
    import tomllib

    table = tomllib.loads(tomls[0])["sources"][0]
    assert json.loads(table["kv_events_config"]) == spec
    assert table["dp_size"] == dp_size


def test_bench_duration_matches_the_results() -> None:
    perf = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    stated = {int(m) for m in re.findall(r"about (\d+) minutes", perf.split("\n## ")[0])}
    (minutes,) = stated
    assert f"(about {minutes} minutes)" in readme, "README and docs/performance.md disagree on make bench"
    # fan-out and the naive bridge are one interleaved run, reported twice with one duration
    took = [int(s) for s in re.findall(r"took (\d+) s", perf)]
    total = sum(dict.fromkeys(took))
    assert abs(total / 60 - minutes) <= 2, f"the results took {total / 60:.0f} minutes, the docs say {minutes}"


# --- statements the documents make about the program -----------------------------------------


def test_metrics_doc_lists_every_rejection_reason() -> None:
    code = "".join(path.read_text(encoding="utf-8") for path in (REPO / "kvgateway").rglob("*.py"))
    reasons = set(re.findall(r'client_rejections\.labels\([^,]+, "([a-z_]+)"\)', code))
    assert "forbidden_host" in reasons
    doc = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    (row,) = [line for line in doc.splitlines() if line.startswith("| `reason` |")]
    listed = set(re.findall(r"`([a-z_]+)`", row.split("rejections:")[1]))
    assert listed == reasons, f"metrics.md lists {sorted(listed)}, the code uses {sorted(reasons)}"


def test_operations_quotes_the_collision_message_as_the_gateway_writes_it() -> None:
    with pytest.raises(ConfigError) as info:
        check_overlaps([parse_source_flag("name=vllm-a,endpoint=tcp://h:5557,replay=tcp://h:5558,dp_size=2")])
    real = str(info.value).replace("tcp://h:", "tcp://...:")
    doc = " ".join((REPO / "docs" / "operations.md").read_text(encoding="utf-8").split())
    assert f"(`{real}`)" in doc


def test_operations_states_the_logging_and_exit_codes_of_today() -> None:
    doc = " ".join((REPO / "docs" / "operations.md").read_text(encoding="utf-8").split())
    assert "HTTP access logs are off" not in doc
    assert 'written at `log_level = "debug"` only' in doc
    assert "and exit code 1" in doc and "exit code 2" in doc
    # The dashboard's client (static/client.js) opens a WebSocket and falls back to SSE.
    client = (REPO / "static" / "client.js").read_text(encoding="utf-8")
    assert 'transport: "auto", // "auto": WebSocket, SSE after' in client
    assert client.index("new this.options.WebSocket(") < client.index('this.url("v1/events")')
    assert "new KVGatewayClient(" in (REPO / "static" / "app.js").read_text(encoding="utf-8")
    assert "SSE is what the dashboard" not in doc and "the dashboard uses a WebSocket and falls back to SSE" in doc


def test_performance_and_example_toml_describe_today() -> None:
    perf = " ".join((REPO / "docs" / "performance.md").read_text(encoding="utf-8").split())
    assert "exposes no asyncio task count" not in perf and "`kvgateway_asyncio_tasks`" in perf
    assert "kvgateway uses (asyncio's own)" not in perf
    toml = (REPO / "deploy" / "kvgateway.example.toml").read_text(encoding="utf-8")
    (line,) = [line for line in toml.splitlines() if "keepalive_seconds" in line]
    assert "WebSocket" in line  # it sets the WebSocket ping interval too (gateway.uvicorn_config)


def test_no_path_of_a_developer_machine_in_the_repository() -> None:
    # A benchmark's worktree or a scratch directory named in a committed file says nothing to a
    # reader and leaks a machine's layout. ipc:// endpoints under /tmp are examples, not paths
    # of a machine, and stay allowed.
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    pattern = re.compile(r"(?<![\w.:/])/(?:work|home|root|Users)/\w")
    found = []
    for name in tracked.splitlines():
        path = REPO / name
        if path.suffix not in {".md", ".py", ".pyx", ".pxd", ".toml", ".yaml", ".yml", ".txt", ".json", ".sh", ""}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in pattern.finditer(text)]
    assert not found, f"a machine's path in: {', '.join(found[:10])}"
