"""kvgateway.config.validation: the checks across settings, made once every layer was applied."""

from __future__ import annotations

import pytest

from kvgateway.config.cluster import NatsOptions
from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import Settings
from kvgateway.config.sources import parse_source_flag
from kvgateway.config.validation import validate, validate_nats
from tests.support.command_line import serve_settings


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
        (NatsOptions(retention_seconds=0), "--nats-retention and --nats-duplicate-window must be > 0"),
        (NatsOptions(duplicate_window_seconds=-1), "--nats-retention and --nats-duplicate-window must be > 0"),
        (NatsOptions(retention_seconds=60), "--nats-duplicate-window cannot exceed --nats-retention"),
        (NatsOptions(checkpoint_seconds=-1), "--nats-checkpoint must be >= 0 (0: no checkpoints)"),
    ],
)
def test_the_nats_windows(options: NatsOptions, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_nats(options, needs_servers=False)
    assert str(info.value) == message
