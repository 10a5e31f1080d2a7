"""kvgateway.config.sources: a source from a ``--source`` flag, a ``[[sources]]`` table or
``KVGATEWAY_SOURCES``, with one-line errors naming the source and the key."""

from __future__ import annotations

import pytest

from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import expand_source
from kvgateway.config.sources import (
    parse_source_flag,
    parse_source_specs,
    source_from_mapping,
    sources_from_tables,
    split_top_level,
)
from kvgateway.engine.endpoints import binds, is_ipv6


def test_source_flag_full() -> None:
    src = parse_source_flag(
        "name=a,endpoint=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5657,topic=kv,dp_size=2,capacity_blocks=GPU:10/cpu:20"
    )
    assert src.name == "a" and src.dp_size == 2 and src.topic == "kv" and not src.bind
    assert dict(src.capacity_blocks) == {"GPU": 10, "CPU": 20}
    assert [(s.dp_rank, s.endpoint, s.replay) for s in expand_source(src)] == [
        (0, "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5657"),
        (1, "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5658"),
    ]


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
        ("name=a,endpoint=tcp://x:1,name=b", "key 'name' given twice"),
        ("name=a,endpoint=tcp://x:65535,dp_size=2", "runs past 65535"),
        ("name=a,endpoint=tcp://x:1,replay=tcp://*:2", "key 'replay'"),
        ("name=a,endpoint=tcp://x:1,capacity_blocks=GPU:0", "capacity_blocks"),
        ("name=a,endpoint=tcp://x:1,capacity_blocks=GPU=5", "expected MEDIUM:BLOCKS, separated by '/'"),
        ("name=a,endpoint=tcp://x:1,capacity_blocks=GPU:5/CPU", "(GPU:8192/CPU:65536), got 'CPU'"),
    ],
)
def test_bad_source_flags_name_source_and_key(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_source_flag(spec)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("endpoint", "bind"),
    [
        ("tcp://*:5557", True),
        ("tcp://0.0.0.0:5557", True),
        ("tcp://[::]:5557", True),
        ("tcp://[::1]:5557", False),
        ("tcp://[fd00::5]:5557", False),
        ("tcp://[2001:db8::1]:5557", False),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://vllm-host:5557", False),
    ],
)
def test_only_a_wildcard_host_means_bind(endpoint: str, bind: bool) -> None:
    assert parse_source_flag(f"name=a,endpoint={endpoint}").bind is bind
    assert binds(endpoint) is bind
    assert parse_source_flag(f"name=a,endpoint={endpoint},bind=true").bind


def test_an_ipv6_engine_may_have_a_replay_socket() -> None:
    # '::' inside an address is no wildcard: this used to be "the engine binds its replay socket".
    src = parse_source_flag("name=a,endpoint=tcp://[fd00::5]:5557,replay=tcp://[fd00::5]:5657,dp_size=2")
    assert [(s.endpoint, s.replay, s.bind) for s in expand_source(src)] == [
        ("tcp://[fd00::5]:5557", "tcp://[fd00::5]:5657", False),
        ("tcp://[fd00::5]:5558", "tcp://[fd00::5]:5658", False),
    ]
    assert is_ipv6("tcp://[fd00::5]:5557") and not is_ipv6("tcp://127.0.0.1:5557")


def test_a_source_key_close_to_a_known_one_is_named_back() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'endpiont': did you mean 'endpoint'\?$"):
        parse_source_flag("name=a,endpiont=tcp://127.0.0.1:1")


def test_a_source_without_a_name_says_it_is_missing() -> None:
    """Not "got None" (issue 33, item 9)."""
    with pytest.raises(ConfigError) as info:
        parse_source_flag("endpoint=tcp://127.0.0.1:1")
    assert "key 'name' is missing" in str(info.value) and "None" not in str(info.value)


def test_a_table_takes_typed_values_and_names_its_place() -> None:
    src = source_from_mapping({"name": "a", "endpoint": "tcp://h:1", "dp_size": 2, "bind": True}, "[[sources]] #1")
    assert (src.dp_size, src.bind) == (2, True)
    with pytest.raises(ConfigError, match=r"^\[\[sources\]\] #2: key 'name' is missing"):
        sources_from_tables([{"name": "a", "endpoint": "tcp://h:1"}, {"endpoint": "tcp://h:2"}])
    with pytest.raises(ConfigError, match="sources must be"):
        sources_from_tables({"name": "a"})
    assert sources_from_tables([]) == ()


def test_the_variables_specs_are_separated_by_semicolons_outside_json() -> None:
    json = '{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "a;b"}'
    sources = parse_source_specs(f"name=a,endpoint=tcp://h:1; name=b,host=h,kv_events_config={json} ;", "VAR")
    assert [(s.name, s.topic) for s in sources] == [("a", ""), ("b", "a;b")]
    with pytest.raises(ConfigError, match=r"^VAR: empty$"):
        parse_source_specs(" ; ", "VAR")
    with pytest.raises(ConfigError, match=r"^VAR 'name=c,x': expected key=value pairs"):
        parse_source_specs("name=c,x", "VAR")


def test_split_top_level_keeps_json_whole() -> None:
    assert split_top_level('a=1,b={"x": [1, 2], "y": "p,q"},c=3', ",") == ["a=1", 'b={"x": [1, 2], "y": "p,q"}', "c=3"]
    assert split_top_level('a="\\"{",b=2', ",") == ['a="\\"{"', "b=2"]
