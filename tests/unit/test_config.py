"""Configuration: CLI flags, TOML, environment, validation with one-line errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvgateway import config
from kvgateway.config import ConfigError, Settings, offset_endpoint, parse_source_flag


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_serve_arguments(parser)
    ns = parser.parse_args(list(argv))
    ns.command = "serve"
    return ns


def test_source_flag_full() -> None:
    src = parse_source_flag(
        "name=a,endpoint=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5657,topic=kv,dp_size=2,capacity_blocks=GPU:10/cpu:20"
    )
    assert src.name == "a" and src.dp_size == 2 and src.topic == "kv" and not src.bind
    assert dict(src.capacity_blocks) == {"GPU": 10, "CPU": 20}
    streams = config.expand_source(src)
    assert [(s.dp_rank, s.endpoint, s.replay) for s in streams] == [
        (0, "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5657"),
        (1, "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5658"),
    ]


def test_offset_endpoint_rules() -> None:
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    assert offset_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    assert offset_endpoint("ipc:///tmp/x", 0) == "ipc:///tmp/x"


def test_wildcard_endpoint_is_bound() -> None:
    assert parse_source_flag("name=a,endpoint=tcp://*:5557").bind
    assert parse_source_flag("name=a,endpoint=tcp://0.0.0.0:5557,bind=true").bind


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("name=a", "key 'endpoint' is required"),
        ("name=a,endpoint=http://x:1", "must start with tcp://"),
        ("name=a,endpoint=tcp://x", "is not tcp://HOST:PORT"),
        ("name=a,endpoint=tcp://x:99999", "is not tcp://HOST:PORT"),
        ("name=a,endpoint=tcp://x:1,dp_size=0", "key 'dp_size'"),
        ("name=a,endpoint=tcp://x:1,dp_size=two", "key 'dp_size'"),
        ("name=a,endpoint=tcp://x:1,bind=maybe", "key 'bind'"),
        ("name=a,endpoint=tcp://x:1,colour=red", "unknown key 'colour'"),
        ("name=a b,endpoint=tcp://x:1", "key 'name'"),
        ("endpoint=tcp://x:1", "key 'name'"),
        ("name=a,endpoint", "expected key=value"),
        ("name=a,endpoint=tcp://x:65535,dp_size=2", "runs past 65535"),
        ("name=a,endpoint=tcp://x:1,replay=tcp://*:2", "key 'replay'"),
        ("name=a,endpoint=tcp://x:1,capacity_blocks=GPU:0", "capacity_blocks"),
    ],
)
def test_bad_source_flags_name_source_and_key(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_source_flag(spec)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_overlapping_ranges_rejected_naming_both() -> None:
    # vLLM's own trap: with 5557/5558 and two ranks, rank 1's PUB port is rank 0's replay port.
    args = _args("--source", "name=a,endpoint=tcp://h:5557,replay=tcp://h:5558,dp_size=2")
    with pytest.raises(ConfigError) as info:
        config.settings_from_args(args, environ={})
    message = str(info.value)
    assert "source 'a' rank 1 endpoint tcp://h:5558" in message
    assert "source 'a' rank 0 replay tcp://h:5558" in message


def test_two_sources_on_one_port_rejected() -> None:
    args = _args("--source", "name=a,endpoint=tcp://h:1", "--source", "name=b,endpoint=tcp://h:1")
    with pytest.raises(ConfigError, match="source 'b' rank 0 endpoint tcp://h:1 collides with source 'a'"):
        config.settings_from_args(args, environ={})


def test_duplicate_names_rejected() -> None:
    args = _args("--source", "name=a,endpoint=tcp://h:1", "--source", "name=a,endpoint=tcp://h:2")
    with pytest.raises(ConfigError, match="given twice"):
        config.settings_from_args(args, environ={})


def test_toml_file_env_and_flags_precedence(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    path = tmp_path / "kv.toml"
    path.write_text(
        f"""
[server]
port = 9000
ring_messages = 50
token_file = "{token_file.as_posix()}"
allowed_origins = ["https://dash.example"]

[[sources]]
name = "vllm-a"
endpoint = "tcp://127.0.0.1:7000"
replay = "tcp://127.0.0.1:7100"
dp_size = 2
capacity_blocks = {{ GPU = 100 }}
"""
    )
    settings = config.settings_from_args(_args("--config", str(path)), environ={})
    assert settings.port == 9000 and settings.ring_messages == 50 and settings.token == "from-file"
    assert settings.allowed_origins == ("https://dash.example",)
    assert [s.key for s in settings.streams()] == [("vllm-a", 0), ("vllm-a", 1)]
    assert dict(settings.streams()[1].capacity_blocks) == {"GPU": 100}
    # Environment beats the file, flags beat both; --source replaces the file's sources.
    env = {"KVGATEWAY_CONFIG": str(path), "KVGATEWAY_TOKEN": "from-env"}
    settings = config.settings_from_args(_args(), environ=env)
    assert settings.token == "from-env" and settings.port == 9000
    settings = config.settings_from_args(
        _args("--port", "9100", "--token", "flag", "--source", "name=b,endpoint=tcp://127.0.0.1:1"), environ=env
    )
    assert settings.port == 9100 and settings.token == "flag"
    assert [s.name for s in settings.sources] == ["b"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("[server]\nport = 'x'\n", "key 'port'"),
        ("[server]\nport = 70000\n", "key 'port'"),
        ("[server]\ncolour = 1\n", "unknown key 'colour'"),
        ("[server]\nlog_level = 'loud'\n", "log_level"),
        ("[other]\n", "unknown table 'other'"),
        ("[[sources]]\nname = 'a'\n", "key 'endpoint' is required"),
        ("[[sources]]\nendpoint = 'tcp://h:1'\n", "[[sources]] #1: key 'name'"),
        ("this is = = not toml", "config file"),
    ],
)
def test_bad_toml(tmp_path: Path, body: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        config.settings_from_args(_args("--config", str(path), "--source", "name=z,endpoint=tcp://h:9"), environ={})
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file_and_token_file() -> None:
    with pytest.raises(ConfigError, match="config file"):
        config.settings_from_args(_args("--config", "/nonexistent/kv.toml"), environ={})
    with pytest.raises(ConfigError, match="token file"):
        config.settings_from_args(
            _args("--token-file", "/nonexistent/token", "--source", "name=a,endpoint=tcp://h:1"), environ={}
        )


def test_no_sources_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no sources"):
        config.settings_from_args(_args(), environ={})


def test_public_bind_without_token_needs_explicit_flag() -> None:
    src = ["--source", "name=a,endpoint=tcp://h:1"]
    with pytest.raises(ConfigError, match="--allow-unauthenticated"):
        config.settings_from_args(_args("--host", "0.0.0.0", *src), environ={})
    assert config.settings_from_args(_args("--host", "0.0.0.0", "--allow-unauthenticated", *src), environ={})
    assert config.settings_from_args(_args("--host", "0.0.0.0", "--token", "t", *src), environ={})
    assert config.settings_from_args(_args("--host", "::1", *src), environ={})


def test_summary_never_contains_the_token() -> None:
    settings = config.validate(
        Settings(token="s3cret-value", sources=(parse_source_flag("name=a,endpoint=tcp://h:1"),))
    )
    text = config.summary(settings)
    assert "s3cret-value" not in text and "auth token" in text and "a[0]=tcp://h:1" in text
