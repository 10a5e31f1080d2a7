"""kvgateway.config.vllm: a source given as vLLM's own ``--kv-events-config`` JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import expand_source
from kvgateway.config.sources import parse_source_flag
from kvgateway.config.vllm import vllm_source
from tests.support.command_line import serve_settings

README_JSON = (
    '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
    '"replay_endpoint": "tcp://*:5657", "topic": "kv-events"}'
)


def test_kv_events_config_derives_endpoints_topic_and_ranks() -> None:
    src = parse_source_flag(f"name=vllm-a,host=vllm-host,dp_size=2,kv_events_config={README_JSON}")
    assert [(s.dp_rank, s.endpoint, s.replay, s.topic, s.bind) for s in expand_source(src)] == [
        (0, "tcp://vllm-host:5557", "tcp://vllm-host:5657", "kv-events", False),
        (1, "tcp://vllm-host:5558", "tcp://vllm-host:5658", "kv-events", False),
    ]
    # the same as the explicit form
    explicit = parse_source_flag(
        "name=vllm-a,endpoint=tcp://vllm-host:5557,replay=tcp://vllm-host:5657,topic=kv-events,dp_size=2"
    )
    assert src == explicit


def test_kv_events_config_defaults_ipv6_host_and_connect_out() -> None:
    # vLLM's defaults: endpoint tcp://*:5557, no replay, topic "".
    src = parse_source_flag('name=e,host=fd00::5,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq"}')
    assert (src.endpoint, src.replay, src.topic, src.bind) == ("tcp://[fd00::5]:5557", None, "", False)
    # An engine that connects out (no wildcard): the gateway binds the address it connects to.
    out = parse_source_flag(
        'name=e,host=vllm-host,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://gateway:6000", "replay_endpoint": "tcp://*:6100"}',
    )
    assert out.bind and out.endpoint == "tcp://gateway:6000" and out.replay == "tcp://vllm-host:6100"


def test_a_table_is_taken_as_the_json_is() -> None:
    table = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "ipc:///tmp/kv", "topic": "t"}
    assert vllm_source({"kv_events_config": table}, "a") == {"topic": "t", "endpoint": "ipc:///tmp/kv", "bind": False}


def test_kv_events_config_in_toml_as_a_table(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text(
        '[[sources]]\nname = "a"\nhost = "10.0.0.7"\ndp_size = 3\n'
        'kv_events_config = { enable_kv_cache_events = true, publisher = "zmq", endpoint = "tcp://*:7000" }\n'
    )
    settings = serve_settings("--config", str(path))
    assert [s.endpoint for s in settings.streams()] == [
        "tcp://10.0.0.7:7000",
        "tcp://10.0.0.7:7001",
        "tcp://10.0.0.7:7002",
    ]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ('name=a,host=h,kv_events_config={"publisher": "zmq"}', '"enable_kv_cache_events": true'),
        ('name=a,host=h,kv_events_config={"enable_kv_cache_events": true}', '"publisher": "zmq"'),
        (
            'name=a,host=h,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq", "port": 1}',
            "unknown key 'port'",
        ),
        ("name=a,host=h,kv_events_config={not json", "not JSON"),
        ("name=a,host=h,kv_events_config=[1]", "expected a JSON object"),
        ('name=a,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq"}', "key 'host' is required"),
        (
            'name=a,host=h,endpoint=tcp://h:1,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq"}',
            "key 'endpoint': derived from kv_events_config",
        ),
        ("name=a,host=h,endpoint=tcp://h:1", "key 'host' goes with kv_events_config"),
        (
            'name=a,dp_size=2,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "ipc:///x"}',
            "cannot run DP ranks",
        ),
        (
            'name=a,kv_events_config={"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "inproc://x"}',
            "is inside the engine's process",
        ),
    ],
)
def test_bad_kv_events_config(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_source_flag(spec)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_json_key_close_to_a_known_one_is_named_back() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'replay_endpont': did you mean 'replay_endpoint'\?$"):
        parse_source_flag('name=a,host=h,kv_events_config={"enable_kv_cache_events":true,"replay_endpont":"x"}')
