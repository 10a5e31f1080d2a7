"""kvgateway.config.validation: the checks across settings, made once every layer was applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgateway.cluster.commands import EDGE
from kvgateway.config.cluster import NatsOptions
from kvgateway.config.errors import ConfigError
from kvgateway.config.options import OPTION_BY_KEY
from kvgateway.config.settings import Settings
from kvgateway.config.sources import parse_source_flag
from kvgateway.config.validation import validate, validate_nats
from tests.support.command_line import load_command, serve_settings


def test_duplicate_names_rejected() -> None:
    with pytest.raises(ConfigError, match=r"^source 'a': key 'name': given twice$"):
        serve_settings("--source", "name=a,endpoint=tcp://h:1", "--source", "name=a,endpoint=tcp://h:2")


def test_public_bind_without_token_needs_explicit_flag() -> None:
    src = ["--source", "name=a,endpoint=tcp://h:1"]
    with pytest.raises(ConfigError, match="--allow-unauthenticated"):
        serve_settings("--host", "0.0.0.0", *src)
    assert serve_settings("--host", "0.0.0.0", "--allow-unauthenticated", *src)
    assert serve_settings("--host", "0.0.0.0", "--token", "t", *src)
    assert serve_settings("--host", "::1", *src)
    assert validate(Settings(host="0.0.0.0"), clients=False).host == "0.0.0.0"  # kvgateway ingest


def test_an_empty_token_made_in_code_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^token: empty$"):
        validate(Settings(token=" ", sources=(parse_source_flag("name=a,endpoint=tcp://h:1"),)))


def test_nats_servers_are_split_and_their_schemes_checked() -> None:
    options = validate_nats(NatsOptions(servers=("nats://a:1, tls://b:2", "c:3")), needs_servers=True)
    assert options.servers == ("nats://a:1", "tls://b:2", "c:3")  # without a scheme: nats://
    assert validate_nats(NatsOptions(), needs_servers=False).servers == ()
    with pytest.raises(ConfigError, match=r"^--nats 'http://a:1': http:// is not NATS; give nats://HOST:PORT"):
        validate_nats(NatsOptions(servers=("http://a:1",)), needs_servers=True)
    with pytest.raises(ConfigError, match=r"^no NATS server"):
        validate_nats(NatsOptions(servers=(" , ",)), needs_servers=True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (NatsOptions(retention_seconds=0), "--nats-retention: must be > 0, got 0"),
        (NatsOptions(duplicate_window_seconds=-1), "--nats-duplicate-window: must be > 0, got -1"),
        (
            NatsOptions(retention_seconds=60),
            "the NATS duplicate window cannot exceed the retention: "
            "--nats-duplicate-window = 120 (default) > --nats-retention = 60 (default)",
        ),
        (NatsOptions(checkpoint_seconds=-1), "--nats-checkpoint: must be >= 0 (0: no checkpoints), got -1"),
    ],
)
def test_the_nats_windows_made_in_code_are_named_by_their_flags(options: NatsOptions, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_nats(options, needs_servers=False)
    assert str(info.value) == message


def _edge_error(tmp_path: Path, place: str, values: dict[str, str]) -> str:
    """The one line ``kvgateway edge`` says when ``values`` (option key -> text) come from ``place``:
    its flags, its ``KVGATEWAY_*`` variables, or its file's ``[cluster]`` table."""
    argv = [] if "nats" in values else ["--nats", "nats://127.0.0.1:4222"]
    environ: dict[str, str] = {}
    if place == "flag":
        argv += [arg for key, text in values.items() for arg in (OPTION_BY_KEY[key].flag_name, text)]
    elif place == "env":
        environ = {OPTION_BY_KEY[key].env: text for key, text in values.items()}
    else:
        path = tmp_path / "kvgateway.toml"
        path.write_text("[cluster]\n" + "".join(f"{key} = {text}\n" for key, text in values.items()))
        argv += ["--config", str(path)]
    with pytest.raises(ConfigError) as info:
        load_command(EDGE, *argv, environ=environ)
    message = str(info.value)
    assert "\n" not in message
    return message


NAMED = {
    "flag": lambda key: OPTION_BY_KEY[key].flag_name,
    "env": lambda key: OPTION_BY_KEY[key].env,
    "file": lambda key: f"[cluster] key {key!r}",
}


@pytest.mark.parametrize("place", sorted(NAMED))
def test_a_nats_window_error_names_where_its_value_came_from(tmp_path: Path, place: str) -> None:
    """A flag, a variable or the file's key: the error names it as given (as a value's own check
    does, kvgateway.config.coerce), and an option left at its default by its flag."""
    name = NAMED[place]
    assert _edge_error(tmp_path, place, {"nats_retention": "0"}) == f"{name('nats_retention')}: must be > 0, got 0"
    assert _edge_error(tmp_path, place, {"nats_duplicate_window": "-1"}) == (
        f"{name('nats_duplicate_window')}: must be > 0, got -1"
    )
    assert _edge_error(tmp_path, place, {"nats_checkpoint": "-2"}) == (
        f"{name('nats_checkpoint')}: must be >= 0 (0: no checkpoints), got -2"
    )
    assert _edge_error(tmp_path, place, {"nats_retention": "60"}) == (
        "the NATS duplicate window cannot exceed the retention: "
        f"--nats-duplicate-window = 120 (default) > {name('nats_retention')} = 60"
    )
    assert _edge_error(tmp_path, place, {"nats_retention": "60", "nats_duplicate_window": "90"}) == (
        "the NATS duplicate window cannot exceed the retention: "
        f"{name('nats_duplicate_window')} = 90 > {name('nats_retention')} = 60"
    )
    url = "'http://a:1'" if place == "file" else "http://a:1"
    assert _edge_error(tmp_path, place, {"nats": url}).startswith(f"{name('nats')} 'http://a:1': http:// is not NATS")


def test_the_place_that_wins_is_the_one_named(tmp_path: Path) -> None:
    """The file says 60, the environment 30: the environment's value is the one checked and named."""
    path = tmp_path / "kvgateway.toml"
    path.write_text("[cluster]\nnats_retention = 60\n")
    argv = ["--nats", "nats://127.0.0.1:4222", "--config", str(path)]
    with pytest.raises(ConfigError, match=r"> KVGATEWAY_NATS_RETENTION = 30$"):
        load_command(EDGE, *argv, environ={"KVGATEWAY_NATS_RETENTION": "30"})
    with pytest.raises(ConfigError, match=r"> --nats-retention = 20$"):
        load_command(EDGE, *argv, "--nats-retention", "20", environ={"KVGATEWAY_NATS_RETENTION": "30"})
