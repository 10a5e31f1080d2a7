"""A source given as vLLM's own ``--kv-events-config`` JSON: the endpoints, topic and bind it
means for the gateway, by vLLM's rules (kvgateway.engine.endpoints)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from kvgateway.config.errors import ConfigError, unknown_name
from kvgateway.config.source_fields import MAX_DP_SIZE, check_endpoint, parse_int
from kvgateway.engine.endpoints import is_wildcard, split_tcp, tcp_endpoint, vllm_binds

KV_EVENTS_KEYS = (
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "buffer_steps",
    "hwm",
    "max_queue_size",
    "topic",
)
"""vLLM's KVEventsConfig fields: the JSON keys of ``vllm serve --kv-events-config``."""


def _engine_side(name: str, host: object, endpoint: str, role: str) -> str:
    """The gateway's address for an endpoint vLLM binds: a wildcard host becomes the engine's host."""
    if not is_wildcard(endpoint):
        return endpoint  # a named address (or ipc://) is reachable as it is
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(
            f"source {name!r}: key 'host' is required: kv_events_config's {role} {endpoint!r} "
            "is a wildcard, so the gateway needs the engine's host name or address"
        )
    parts = split_tcp(endpoint)
    assert parts is not None  # is_wildcard() only holds for tcp://HOST:PORT
    return tcp_endpoint(host.strip().strip("[]"), parts[1])


def vllm_source(raw: Mapping[str, object], name: str) -> dict[str, object]:
    """endpoint, replay, topic and bind of a source given as vLLM's ``--kv-events-config``.

    The engine's publisher binds its PUB socket when its endpoint contains ``*`` or ``::`` or is
    ``ipc``/``inproc`` (vLLM's rule), and then the gateway connects to it, at ``host`` for a
    wildcard; otherwise the engine connects out and the gateway binds that address. The replay
    ROUTER is always bound by the engine. Ranks are offset by vLLM's rule in :func:`expand_source`.
    """
    text = raw["kv_events_config"]
    where = f"source {name!r}: key 'kv_events_config'"
    if isinstance(text, Mapping):
        spec: object = dict(text)
    elif isinstance(text, str):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    else:
        raise ConfigError(f"{where}: expected the JSON given to vllm serve --kv-events-config")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    for key in spec:
        if key not in KV_EVENTS_KEYS:
            raise ConfigError(unknown_name(f"{where}: unknown key {key!r}", key, KV_EVENTS_KEYS))
    for key in ("endpoint", "replay", "topic", "bind"):
        if key in raw:
            raise ConfigError(f"source {name!r}: key {key!r}: derived from kv_events_config; give one or the other")
    if spec.get("enable_kv_cache_events") is not True:
        raise ConfigError(f'{where}: vLLM publishes nothing unless "enable_kv_cache_events": true')
    if spec.get("publisher", "null") != "zmq":
        raise ConfigError(f'{where}: vLLM publishes over ZeroMQ only with "publisher": "zmq"')
    endpoint = spec.get("endpoint", "tcp://*:5557")  # vLLM's defaults
    replay = spec.get("replay_endpoint")
    topic = spec.get("topic", "")
    if not isinstance(endpoint, str) or not isinstance(topic, str) or not isinstance(replay, str | None):
        raise ConfigError(f"{where}: endpoint, replay_endpoint and topic must be strings")
    check_endpoint(name, "kv_events_config.endpoint", endpoint)
    if replay is not None:
        check_endpoint(name, "kv_events_config.replay_endpoint", replay)
    dp_size = parse_int(name, "dp_size", raw.get("dp_size", 1), 1, MAX_DP_SIZE)
    for value in (endpoint, replay):
        if value is not None and value.startswith("ipc://") and dp_size > 1:
            # vLLM's offset rule knows only tcp (port + r) and inproc (suffix); it fails on ipc.
            raise ConfigError(f"{where}: vLLM cannot run DP ranks on {value!r}; give tcp:// endpoints")
        if value is not None and value.startswith("inproc://"):
            raise ConfigError(f"{where}: {value!r} is inside the engine's process; give tcp:// or ipc://")
    out: dict[str, object] = {"topic": topic}
    if vllm_binds(endpoint):
        out["endpoint"] = _engine_side(name, raw.get("host"), endpoint, "endpoint")
        out["bind"] = False
    else:
        out["endpoint"] = endpoint  # the engine connects here: it is the gateway's address to bind
        out["bind"] = True
    if replay is not None:
        out["replay"] = _engine_side(name, raw.get("host"), replay, "replay_endpoint")
    return out
