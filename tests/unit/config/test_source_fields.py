"""kvgateway.config.source_fields: one value of a source's key, checked in the words every form
of a source shares."""

from __future__ import annotations

import pytest

from kvgateway.config.errors import ConfigError
from kvgateway.config.source_fields import check_endpoint, parse_bool, parse_capacity, parse_int


def test_an_endpoint_is_checked_by_the_engines_rule() -> None:
    assert check_endpoint("a", "endpoint", "ipc:///tmp/kv") == "ipc:///tmp/kv"
    with pytest.raises(ConfigError, match=r"^source 'a': key 'replay': expected an endpoint string$"):
        check_endpoint("a", "replay", 5)
    with pytest.raises(ConfigError, match=r"^source 'a': key 'endpoint': 'tcp://x:0' is not tcp://HOST:PORT$"):
        check_endpoint("a", "endpoint", "tcp://x:0")


def test_text_and_typed_values_alike() -> None:
    assert parse_bool("a", "bind", "Yes") is True and parse_bool("a", "bind", False) is False
    assert parse_int("a", "dp_size", " 4", 1, 8) == 4 and parse_int("a", "dp_size", 8, 1, 8) == 8
    with pytest.raises(ConfigError, match="expected an integer from 1 to 8, got True"):
        parse_int("a", "dp_size", True, 1, 8)
    with pytest.raises(ConfigError, match="expected an integer from 1 to 8, got 9"):
        parse_int("a", "dp_size", 9, 1, 8)


def test_capacities_from_a_flag_or_a_table() -> None:
    assert parse_capacity("a", "gpu:8192/CPU:65536") == {"GPU": 8192, "CPU": 65536}
    assert parse_capacity("a", {"Disk": 3}) == {"DISK": 3}
    with pytest.raises(ConfigError, match="bad medium name '9x'"):
        parse_capacity("a", {"9x": 1})
    with pytest.raises(ConfigError, match=r"key 'capacity_blocks.GPU': expected an integer from 1"):
        parse_capacity("a", "GPU:many")
    with pytest.raises(ConfigError, match="expected a table of medium = blocks"):
        parse_capacity("a", 5)
