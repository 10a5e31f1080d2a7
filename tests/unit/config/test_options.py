"""kvgateway.config.options: the one table. Every setting is there once, with its flag, its
variable and its key, and sets a field of the settings types; the commands' option sets name
only what is there."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from kvgateway.config.cluster import NatsOptions, Workers
from kvgateway.config.options import (
    CLIENT_ONLY,
    CLUSTER_BY_KEY,
    NATS,
    OPTIONS,
    SERVER,
    SERVER_BY_KEY,
    WORKERS,
    Option,
    OptionSet,
)
from kvgateway.config.settings import Settings

TARGETS: dict[str, type] = {SERVER: Settings, NATS: NatsOptions, WORKERS: Workers}
KINDS: dict[type, set[object]] = {
    int: {int, int | None},
    float: {float},
    bool: {bool},
    str: {str, str | None},
    list: {tuple[str, ...]},
}


def test_each_setting_once_and_each_flag_variable_and_key_its_own() -> None:
    for attribute in ("key", "flag_name", "env", "dest"):
        names = [getattr(option, attribute) for option in OPTIONS]
        assert len(names) == len(set(names)), attribute
    for option in OPTIONS:
        assert option.env == "KVGATEWAY_" + option.key.upper()
        assert option.table == ("server" if option.lands == SERVER else "cluster")
    assert set(SERVER_BY_KEY) | set(CLUSTER_BY_KEY) == {option.key for option in OPTIONS}


def _fields(target: type) -> dict[str, object]:
    return typing.get_type_hints(target)


@pytest.mark.parametrize("option", OPTIONS, ids=lambda option: option.key)
def test_every_option_sets_a_field_of_its_kind(option: Option) -> None:
    hints = _fields(TARGETS[option.lands])
    attribute = option.attribute
    assert attribute in hints, f"{option.key}: {TARGETS[option.lands].__name__} has no field {attribute!r}"
    assert hints[attribute] in KINDS[option.kind], (option.key, hints[attribute])


@pytest.mark.parametrize("target", [Settings, NatsOptions, Workers], ids=lambda target: target.__name__)
def test_every_field_is_set_by_an_option(target: type) -> None:
    """No setting without its flag, variable and key (but the sources, and a NATS client's name)."""
    set_by_options = {option.attribute for option in OPTIONS if TARGETS[option.lands] is target}
    assert set(_fields(target)) - set_by_options <= {"sources", "name"}


def _default(option: Option) -> object:
    target = TARGETS[option.lands]
    (field,) = [field for field in dataclasses.fields(target) if field.name == option.attribute]
    return field.default


@pytest.mark.parametrize("option", [o for o in OPTIONS if " default " in o.help], ids=lambda option: option.key)
def test_a_default_the_help_gives_is_the_fields(option: Option) -> None:
    """``(default 600)`` in --help is the default the process runs with."""
    text = option.help.split(" default ", 1)[1].split(")")[0].split(";")[0]
    default = _default(option)
    if isinstance(default, bool):
        assert text == str(default).lower()
    elif isinstance(default, int | float):
        scaled = {"MiB": 1 << 20}.get(text.rpartition(" ")[2], 1)
        assert float(text.split(" ")[0]) * scaled == default, text
    else:
        assert text == default, text


def test_the_settings_of_web_clients() -> None:
    """``kvgateway ingest`` has no flag for these (a regression list: it was written by hand)."""
    by_hand = {
        "token",
        "token_file",
        "allowed_origins",
        "allowed_hosts",
        "allow_unauthenticated",
        "max_clients",
        "client_queue_bytes",
        "keepalive_seconds",
        "lookup_rate",
        "lookup_burst",
        "max_snapshots",
        "snapshot_queue_bytes",
    }
    assert by_hand == CLIENT_ONLY


def test_a_switch_is_a_bool_without_a_value() -> None:
    switches = {option.key for option in OPTIONS if option.is_switch}
    assert switches == {"allow_unauthenticated"}
    assert SERVER_BY_KEY["allow_unauthenticated"].kind is CLUSTER_BY_KEY["nats_leases"].kind is bool


def test_an_option_set_names_only_options_and_gives_its_own_words() -> None:
    with pytest.raises(ValueError, match="no such options"):
        OptionSet(keys=("port", "colour"))
    with pytest.raises(ValueError, match="no such options"):
        OptionSet(keys=("port",), help={"prot": "x"})
    takes = OptionSet(keys=("port", "nats"), help={"port": "its own words"}, groups={"nats": "workers"})
    port, nats = takes.options()
    assert takes.help_of(port) == "its own words; $KVGATEWAY_PORT"
    assert takes.group_of(nats) == "workers" and takes.help_of(nats) == nats.help  # the title names the variables
    assert takes.takes(port) and not takes.takes(SERVER_BY_KEY["host"])
