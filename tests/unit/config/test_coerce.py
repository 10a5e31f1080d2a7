"""kvgateway.config.coerce: one value of an option, from text or from TOML, in one wording."""

from __future__ import annotations

import pytest

from kvgateway.config.coerce import coerce
from kvgateway.config.errors import ConfigError
from kvgateway.config.options import OPTION_BY_KEY


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("port", " 8081 ", 8081),
        ("port", 8081, 8081),
        ("replay_timeout", "2", 2.0),
        ("replay_timeout", 2, 2.0),
        ("allow_unauthenticated", "Yes", True),
        ("allow_unauthenticated", "0", False),
        ("nats_leases", False, False),
        ("log_level", "DEBUG", "debug"),
        ("allowed_origins", "https://a, https://b,", ("https://a", "https://b")),
        ("allowed_origins", ["https://a "], ("https://a",)),
        ("allowed_hosts", ["Gateway.Example"], ("gateway.example",)),
        ("nats", "nats://a:1,nats://b:2", ("nats://a:1", "nats://b:2")),
    ],
)
def test_text_and_toml_values_become_the_kind(key: str, value: object, expected: object) -> None:
    assert coerce(OPTION_BY_KEY[key], value, "where") == expected


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("port", "x", "--port: expected an integer, got 'x'"),
        ("port", 70000, "--port: must be from 0 to 65535, got 70000"),
        ("port", True, "--port: expected an integer, got True"),
        ("port", 1.5, "--port: expected an integer, got 1.5"),
        ("replay_timeout", "soon", "--port: expected a number, got 'soon'"),
        ("allow_unauthenticated", "maybe", "--port: expected true or false, got 'maybe'"),
        ("log_level", "loud", "--port: one of debug, info, warning, error, got 'loud'"),
        ("token", "  ", "--port: empty"),
        ("host", 5, "--port: expected a string, got 5"),
        ("allowed_origins", 5, "--port: expected a list, got 5"),
        ("allowed_origins", ["a", ""], "--port: expected a list of non-empty strings"),
        ("ring_bytes", 1, "--port: must be from 1024 to 1.09951e+12, got 1"),
    ],
)
def test_a_bad_value_is_one_line_naming_where_it_was_given(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        coerce(OPTION_BY_KEY[key], value, "--port")
    assert str(info.value) == message
