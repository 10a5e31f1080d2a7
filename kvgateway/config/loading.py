"""Loading: the file, the environment and the flags, each a layer of checked values, applied in
one order of precedence for every setting: command-line flag > environment (``KVGATEWAY_*``) >
TOML file (``--config`` or ``KVGATEWAY_CONFIG``) > built-in default. Sources are ``--source``
flags, ``KVGATEWAY_SOURCES`` (specs separated by ``;``) or ``[[sources]]`` tables, and the first of
those given replaces the others as a whole.

Errors are one line and name the setting the way it was given: ``--port`` for a flag,
``KVGATEWAY_PORT`` for a variable, ``[server] key 'port'`` for the file.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvgateway.config.cluster import NatsOptions, Workers
from kvgateway.config.coerce import coerce
from kvgateway.config.errors import ConfigError, unknown_name
from kvgateway.config.options import (
    CLUSTER_BY_KEY,
    CONFIG_ENV,
    ENV_PREFIX,
    NATS,
    NO_EXTENSIONS_ENV,
    OPTION_BY_ENV,
    OPTION_BY_KEY,
    OPTIONS,
    SERVER,
    SERVER_BY_KEY,
    SOURCES_ENV,
    WORKERS,
    Option,
    OptionSet,
)
from kvgateway.config.settings import Settings, SourceConfig
from kvgateway.config.sources import parse_source_flag, parse_source_specs, sources_from_tables
from kvgateway.config.validation import validate, validate_nats

TABLES = ("server", "sources", "cluster")

_SERVICE_LINK = re.compile(r"^KVGATEWAY_(SERVICE_|PORT_\d+_)")
"""Kubernetes' service-link variables for a Service named kvgateway: not ours, never an error."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """Everything one command was given, checked; ``given``: each option given, by its key, named
    as the place that won gave it (``--nats``, ``KVGATEWAY_NATS``, ``[cluster] key 'nats'``), for
    a check across settings to say where a value came from."""

    settings: Settings
    nats: NatsOptions
    workers: Workers
    given: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Layer:
    """What one place (the file, the environment, the flags) gives, checked: the fields to set,
    by what they configure (``Option.lands``)."""

    values: dict[str, dict[str, Any]] = field(default_factory=lambda: {SERVER: {}, NATS: {}, WORKERS: {}})
    sources: tuple[SourceConfig, ...] | None = None
    given: dict[str, str] = field(default_factory=dict)  # option key -> where (Loaded.given)

    def give(self, option: Option, value: object, where: str) -> None:
        """``value`` of ``option``, checked (:func:`coerce`) as ``where`` names it."""
        value = coerce(option, value, where)
        if option.key == "token_file":  # the file holds the token
            value = read_token_file(str(value))
        elif option.key == "token":
            value = str(value).strip()
        self.values[option.lands][option.attribute] = value
        self.given[option.key] = where

    def settings_over(self, base: Settings) -> Settings:
        settings = replace(base, **self.values[SERVER])
        return settings if self.sources is None else replace(settings, sources=self.sources)

    def over(self, loaded: Loaded) -> Loaded:
        return Loaded(
            self.settings_over(loaded.settings),
            replace(loaded.nats, **self.values[NATS]),
            replace(loaded.workers, **self.values[WORKERS]),
            {**loaded.given, **self.given},
        )


def _applies(option: Option, takes: OptionSet | None) -> bool:
    """Every ``[server]`` setting applies to every command (a shared file or environment holds
    them all); a ``[cluster]`` one only to the commands that take it."""
    return option.lands == SERVER or (takes is not None and takes.takes(option))


def read_token_file(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"token file {path!r}: {exc.strerror or exc}") from None
    if not token:
        raise ConfigError(f"token file {path!r} is empty")
    return token


def load_file(path: str) -> dict[str, Any]:
    import tomllib  # for a configuration file only: not in every start-up

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"config file {path!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r}: {exc}") from None


def file_layer(data: Mapping[str, Any], takes: OptionSet | None) -> Layer:
    """A TOML document: every key is checked; ``[cluster]`` keys apply to the commands that take them."""
    for key in data:
        if key not in TABLES:
            raise ConfigError(f"config: unknown table {key!r} (expected [server], [[sources]] and [cluster])")
    layer = Layer()
    for name, known in (("cluster", CLUSTER_BY_KEY), ("server", SERVER_BY_KEY)):
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"config: [{name}] must be a table")
        for key, value in table.items():
            option = known.get(key)
            if option is None:
                raise ConfigError(unknown_name(f"[{name}]: unknown key {key!r}", key, list(known)))
            where = f"[{name}] key {key!r}"
            if _applies(option, takes):
                layer.give(option, value, where)
            else:  # checked all the same
                coerce(option, value, where)
    sources = sources_from_tables(data.get("sources", []))
    if sources:
        layer.sources = sources
    return layer


def env_layer(env: Mapping[str, str], takes: OptionSet | None) -> Layer:
    """``KVGATEWAY_*`` variables; an unknown ``KVGATEWAY_`` name is an error (a typo would
    otherwise be silently ignored)."""
    known = sorted({*OPTION_BY_ENV, CONFIG_ENV, SOURCES_ENV, NO_EXTENSIONS_ENV})
    layer = Layer()
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in (CONFIG_ENV, NO_EXTENSIONS_ENV) or _SERVICE_LINK.match(name):
            continue
        if name == OPTION_BY_KEY["port"].env and env[name].startswith("tcp://"):
            raise ConfigError(
                f"{name}={env[name]!r} was set by Kubernetes for a Service named kvgateway: "
                "set enableServiceLinks: false in the pod spec (deploy/k8s does)"
            )
        if name == SOURCES_ENV:
            layer.sources = parse_source_specs(env[name], SOURCES_ENV)
            continue
        option = OPTION_BY_ENV.get(name)
        if option is None:
            raise ConfigError(unknown_name(f"{name}: unknown variable", name, known, ENV_PREFIX))
        if _applies(option, takes):
            layer.give(option, env[name], name)
    return layer


def flag_layer(args: argparse.Namespace, takes: OptionSet) -> Layer:
    """The command's own flags (None: not given), parsed by a parser arguments.py made for ``takes``."""
    given = vars(args)
    layer = Layer()
    for option in OPTIONS:  # the table's order: --token-file beats --token, as in the file
        if takes.takes(option) and given[option.dest] is not None:
            value = given[option.dest]
            layer.give(option, list(value) if option.kind is list else value, option.flag_name)
    if takes.sources and given["source"]:
        layer.sources = tuple(parse_source_flag(text) for text in given["source"])
    return layer


def config_path(takes: OptionSet, args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    flag = vars(args)["config"] if takes.sources else None
    if flag == "":
        raise ConfigError("--config: empty")
    return flag or env.get(CONFIG_ENV) or None


def load(takes: OptionSet, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Loaded:
    """Defaults < file < environment < flags (``environ`` defaults to ``os.environ``), checked."""
    env = os.environ if environ is None else environ
    path = config_path(takes, args, env)
    layers = [file_layer(load_file(path), takes)] if path else []
    layers += [env_layer(env, takes), flag_layer(args, takes)]
    loaded = Loaded(Settings(), NatsOptions(), Workers())
    for layer in layers:
        loaded = layer.over(loaded)
    if takes.needs_sources and not loaded.settings.sources:
        raise ConfigError(f"no sources: give --source, ${SOURCES_ENV} or a config file with [[sources]]")
    return Loaded(
        validate(loaded.settings, clients=takes.clients),
        validate_nats(loaded.nats, needs_servers=takes.needs_nats, given=loaded.given),
        loaded.workers,
        loaded.given,
    )
