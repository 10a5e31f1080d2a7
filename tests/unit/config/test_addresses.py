"""kvgateway.config.addresses: two streams never share an address (compared resolved), and which
HTTP hosts only this machine reaches."""

from __future__ import annotations

import pytest

from kvgateway.config.addresses import check_overlaps, is_loopback, resolve_host, unresolved_hosts
from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import Settings
from kvgateway.config.sources import parse_source_flag
from tests.support.command_line import serve_settings


def test_overlapping_ranges_rejected_naming_both() -> None:
    # vLLM's own trap: with 5557/5558 and two ranks, rank 1's PUB port is rank 0's replay port.
    with pytest.raises(ConfigError) as info:
        serve_settings("--source", "name=a,endpoint=tcp://h:5557,replay=tcp://h:5558,dp_size=2")
    message = str(info.value)
    assert "source 'a' rank 1 endpoint tcp://h:5558" in message
    assert "source 'a' rank 0 replay tcp://h:5558" in message


def test_two_sources_on_one_port_rejected() -> None:
    with pytest.raises(ConfigError, match="source 'b' rank 0 endpoint tcp://h:1 collides with source 'a'"):
        serve_settings("--source", "name=a,endpoint=tcp://h:1", "--source", "name=b,endpoint=tcp://h:1")


def test_localhost_and_127_0_0_1_are_one_address() -> None:
    with pytest.raises(ConfigError) as info:
        check_overlaps(
            [
                parse_source_flag("name=a,endpoint=tcp://localhost:7557"),
                parse_source_flag("name=b,endpoint=tcp://127.0.0.1:7557"),
            ]
        )
    message = str(info.value)
    assert "source 'b' rank 0 endpoint tcp://127.0.0.1:7557 collides with source 'a'" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"tcp://localhost:7557 collides with .* \(both are tcp://127.0.0.1:7557\)$"):
        check_overlaps(
            [
                parse_source_flag("name=a,endpoint=tcp://127.0.0.1:7557"),
                parse_source_flag("name=b,endpoint=tcp://localhost:7557"),
            ]
        )


def test_an_unresolvable_name_is_compared_by_name_and_reported() -> None:
    sources = (parse_source_flag("name=a,endpoint=tcp://no-such-engine.invalid:7557"),)
    assert check_overlaps(sources) == ["no-such-engine.invalid"]
    assert unresolved_hosts(Settings(sources=sources)) == ["no-such-engine.invalid"]
    same = (*sources, parse_source_flag("name=b,endpoint=tcp://NO-SUCH-ENGINE.invalid:7557"))
    with pytest.raises(ConfigError, match="collides"):
        check_overlaps(same)


def test_resolve_host() -> None:
    assert resolve_host("*") == resolve_host("") == frozenset({"*"})
    assert resolve_host("::1") == frozenset({"::1"})
    assert resolve_host("no-such-engine.invalid") is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        *[("localhost", True), ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True)],
        *[("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("gateway.example", False)],
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
